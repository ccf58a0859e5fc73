"""Advantage estimators (pure functions of numpy arrays).

Conventions shared by every estimator here: arrays have length T in time order
for ONE actor's contiguous batch; `terminated[t]` means the episode ended in a
terminal state after step t (no bootstrap), `truncated[t]` means it was cut by a
time limit (bootstrap from `final_values[t]`, the value of the real final
observation). Either flag ends the episode, so nothing flows across it.
"""

from __future__ import annotations

import numpy as np


def next_values(values: np.ndarray, final_values: np.ndarray, bootstrap_value: float,
                terminated: np.ndarray, truncated: np.ndarray) -> np.ndarray:
    """V(s_{t+1}) for every step t, respecting episode boundaries inside the batch.

    Inside an episode it is the next step's value; at a truncated step the final
    observation's value; at a terminated step 0; after the last step the
    batch's bootstrap value.
    """
    values = np.asarray(values, dtype=np.float32)
    nv = np.empty_like(values)
    if len(values) == 0:
        return nv
    nv[:-1] = values[1:]
    nv[-1] = bootstrap_value
    nv = np.where(truncated, final_values, nv)
    return np.where(terminated, 0.0, nv).astype(np.float32)


def gae(rewards: np.ndarray, values: np.ndarray, next_vals: np.ndarray, terminated: np.ndarray,
        truncated: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Generalised Advantage Estimation (Schulman et al. 2016).

    delta_t = r_t + gamma * V(s_{t+1}) * (1 - terminated_t) - V(s_t)
    A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1},  done = terminated or truncated
    Returns (advantages, value targets = advantages + values), float32.
    """
    r = np.asarray(rewards, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    nv = np.asarray(next_vals, dtype=np.float64) * (1.0 - np.asarray(terminated, dtype=np.float64))
    deltas = r + gamma * nv - v
    carry = gamma * lam * (1.0 - (np.asarray(terminated) | np.asarray(truncated)).astype(np.float64))
    # The recursion is inherently sequential; plain floats keep the loop cheap (~1 ms at T=4096).
    adv = np.empty_like(deltas)
    acc = 0.0
    d_list, c_list = deltas.tolist(), carry.tolist()
    for t in range(len(d_list) - 1, -1, -1):
        acc = d_list[t] + c_list[t] * acc
        adv[t] = acc
    return adv.astype(np.float32), (adv + v).astype(np.float32)


def clip_rewards(rewards: np.ndarray, bound: float) -> np.ndarray:
    """Rewards clipped to [-bound, bound]; bound 0 returns them unchanged."""
    r = np.asarray(rewards)
    return np.clip(r, -bound, bound) if bound > 0 else r


def batch_gae(batch: dict, gamma: float, lam: float, reward_clip: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """GAE for one actor batch in the rollout format (see nitro.policy.rollout); rewards clipped first if asked."""
    nv = next_values(batch["values"], batch["final_values"], batch["bootstrap_value"],
                     batch["terminated"], batch["truncated"])
    return gae(clip_rewards(batch["rewards"], reward_clip), batch["values"], nv, batch["terminated"],
               batch["truncated"], gamma, lam)
