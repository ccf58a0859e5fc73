"""V-trace off-policy targets (Espeholt et al. 2018, IMPALA section 4), pure numpy.

For ONE actor's contiguous batch in time order, with the episode conventions of
nitro.algos.advantages: `terminated[t]` ends the episode without bootstrap,
`truncated[t]` ends it with V(final observation); either flag cuts the trace.

With rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t)) and c_t = min(c_bar, pi/mu):

    delta_t = rho_t (r_t + gamma V(x_{t+1}) - V(x_t))
    v_t     = V(x_t) + delta_t + gamma c_t (v_{t+1} - V(x_{t+1}))     (no carry across an episode end)
    A_t     = min(pg_rho_bar, pi/mu) (r_t + gamma v_{t+1} - V(x_t))   (policy-gradient advantage)

where V(x_{t+1}) is `next_values` (0 after a terminal step, the final observation's
value after a truncation, the bootstrap value after the batch's last step) and
v_{t+1} is the next step's target inside an episode, else that same V(x_{t+1}).
With pi == mu and rho_bar, c_bar >= 1 this is the n-step (GAE lambda=1) return.
"""

from __future__ import annotations

import numpy as np

from nitro.algos.advantages import clip_rewards, next_values


def vtrace(log_rhos: np.ndarray, rewards: np.ndarray, values: np.ndarray, next_vals: np.ndarray,
           terminated: np.ndarray, truncated: np.ndarray, *, gamma: float, rho_bar: float = 1.0,
           c_bar: float = 1.0, pg_rho_bar: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(v_s targets, policy-gradient advantages), float32, for one contiguous batch.

    log_rhos: log pi(a|x) - log mu(a|x) per step (target minus behaviour).
    pg_rho_bar: truncation of the advantage's importance weight; None means rho_bar.
    """
    pg_rho_bar = rho_bar if pg_rho_bar is None else pg_rho_bar
    ratio = np.exp(np.asarray(log_rhos, dtype=np.float64))
    rhos = np.minimum(rho_bar, ratio)
    cs = np.minimum(c_bar, ratio)
    pg_rhos = np.minimum(pg_rho_bar, ratio)
    r = np.asarray(rewards, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    nv = np.asarray(next_vals, dtype=np.float64)
    cont = 1.0 - (np.asarray(terminated) | np.asarray(truncated)).astype(np.float64)
    deltas = rhos * (r + gamma * nv - v)
    carry = gamma * cs * cont
    # acc_t = v_t - V(x_t); sequential like GAE, plain floats keep it ~1 ms at T=4096.
    acc = np.empty_like(deltas)
    nxt = 0.0
    d_list, c_list = deltas.tolist(), carry.tolist()
    for t in range(len(d_list) - 1, -1, -1):
        nxt = d_list[t] + c_list[t] * nxt
        acc[t] = nxt
    vs = v + acc
    # v_{t+1} = V(x_{t+1}) + acc_{t+1} inside an episode; at an episode end or the batch end, V(x_{t+1}).
    acc_next = np.zeros_like(acc)
    acc_next[:-1] = acc[1:] * cont[:-1]
    pg_adv = pg_rhos * (r + gamma * (nv + acc_next) - v)
    return vs.astype(np.float32), pg_adv.astype(np.float32)


def batch_vtrace(batch: dict, target_logp: np.ndarray, values: np.ndarray, *, gamma: float, rho_bar: float = 1.0,
                 c_bar: float = 1.0, pg_rho_bar: float | None = None,
                 reward_clip: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """V-trace for one actor batch in the rollout format (see nitro.policy.rollout); rewards clipped first if asked.

    target_logp and values come from the learner's target network on batch["obs"];
    the behaviour log-probs are batch["logp"]. The values after a truncation and after
    the batch's last step are the actor's (`final_values`, `bootstrap_value`): their
    observations are not shipped, and they only enter where a trace ends.
    """
    nv = next_values(values, batch["final_values"], batch["bootstrap_value"], batch["terminated"],
                     batch["truncated"])
    log_rhos = np.asarray(target_logp, dtype=np.float64) - np.asarray(batch["logp"], dtype=np.float64)
    return vtrace(log_rhos, clip_rewards(batch["rewards"], reward_clip), values, nv, batch["terminated"], batch["truncated"], gamma=gamma,
                  rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar)


def vtrace_batches(batches: list[dict], target_logp: np.ndarray, values: np.ndarray, config) -> tuple[np.ndarray, np.ndarray]:
    """V-trace over consecutive actor batches (each contiguous in time), concatenated.

    target_logp and values cover all batches in order; `config` supplies gamma, rho_bar,
    c_bar, pg_rho_bar and reward_clip (an IMPACTConfig). Returns (v_s, advantages).
    """
    vs, adv, start = [], [], 0
    for b in batches:
        end = start + len(b["rewards"])
        v, a = batch_vtrace(b, target_logp[start:end], values[start:end], gamma=config.gamma, rho_bar=config.rho_bar,
                            c_bar=config.c_bar, pg_rho_bar=config.pg_rho_bar, reward_clip=config.reward_clip)
        vs.append(v)
        adv.append(a)
        start = end
    return np.concatenate(vs), np.concatenate(adv)
