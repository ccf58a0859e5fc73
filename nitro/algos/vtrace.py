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

`vtrace` and `vtrace_batches` take V(x_{t+1}) at a trace's end from the actor's
`final_values` and `bootstrap_value`. `vtrace_plan` and `vtrace_from_plan` are the
same estimate in torch for a learner that values those observations with its own
critic (IMPACT's `vtrace_critic` "online"): the plan holds everything but the
values, on the learner's device, so the targets can be recomputed for every new
critic without leaving it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

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
    the batch's last step are the actor's (`final_values`, `bootstrap_value`); they only
    enter where a trace ends (IMPACT's vtrace_critic "target": "online" values those
    observations itself, `vtrace_plan`).
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


# -- the online critic's V-trace: torch, on the learner's device ------------------------------------------


@dataclass(frozen=True)
class VTracePlan:
    """What V-trace needs of an update's batches besides the critic's values, as tensors on one device.

    Rows are the batches' steps concatenated. With `values` V(x_t) for the rows and `bootstrap_values`
    the critic's values of the bootstrap observations `vtrace_plan` returns, V(x_{t+1}) is
    cat(values, bootstrap_values, [0])[next_index]: the next row inside a batch, a truncation's final
    observation, the observation after a batch's last step, 0 after a terminal step. `keep` is 0 where
    the trace is cut (an episode end or a batch's last step), else 1.
    """

    next_index: torch.Tensor  # (n,) int64
    rhos: torch.Tensor        # (n,) float64 min(rho_bar, pi / mu)
    pg_rhos: torch.Tensor     # (n,) float64 min(pg_rho_bar, pi / mu)
    carry: torch.Tensor       # (n,) float64 gamma * min(c_bar, pi / mu) * keep
    keep: torch.Tensor        # (n,) float64
    rewards: torch.Tensor     # (n,) float64, clipped as the config says
    gamma: float
    rounds: int               # doubling rounds of the scan: ceil(log2(longest uncut trace))


def vtrace_plan(batches: list[dict], target_logp: torch.Tensor, config) -> tuple[VTracePlan, np.ndarray]:
    """The plan (on target_logp's device) and the bootstrap observations, stacked: for each batch in
    order, its truncations' final observations (`final_obs`, in row order), then, when its last step
    ends no episode, the observation after it (`bootstrap_obs`). `config` as for `vtrace_batches`.

    A batch that needs one of these observations and lacks it is a ValueError naming the field.
    """
    device = target_logp.device
    sizes = [len(b["rewards"]) for b in batches]
    n = sum(sizes)
    index = np.empty(n, dtype=np.int64)
    cut = np.zeros(n, dtype=bool)
    zero = -1  # replaced by the index of the appended 0 once the bootstrap observations are counted
    boot: list[np.ndarray] = []
    m = 0
    start = 0
    for i, (b, size) in enumerate(zip(batches, sizes)):
        if size == 0:
            continue
        end = start + size
        term = np.asarray(b["terminated"], dtype=bool)
        trunc = np.asarray(b["truncated"], dtype=bool)
        idx = np.arange(start + 1, end + 1, dtype=np.int64)
        k = int(trunc.sum())
        if k:
            final = b.get("final_obs")
            if final is None or len(final) != k:
                raise ValueError(f"batch {i} has {k} truncated steps and "
                                 f"{'no' if final is None else len(final)} 'final_obs': vtrace_critic 'online' "
                                 "values the final observations with the learner's critic. Actors ship them in "
                                 "batches without per-step values (nitro.policy.rollout); vtrace_critic 'target' "
                                 "reads the actor's final_values instead")
            idx[trunc] = n + m + np.arange(k)
            boot.append(np.asarray(final))
            m += k
        if not (term[-1] or trunc[-1]):
            if b.get("bootstrap_obs") is None:
                raise ValueError(f"batch {i} ends mid-episode and has no 'bootstrap_obs': vtrace_critic 'online' "
                                 "values the observation after its last step with the learner's critic. Actors "
                                 "ship it in batches without per-step values (nitro.policy.rollout); "
                                 "vtrace_critic 'target' reads the actor's bootstrap_value instead")
            idx[-1] = n + m
            boot.append(np.asarray(b["bootstrap_obs"])[None])
            m += 1
        idx[term] = zero
        index[start:end] = idx
        cut[start:end] = term | trunc
        cut[end - 1] = True
        start = end
    index[index == zero] = n + m
    obs0 = np.asarray(batches[0]["obs"]) if batches else np.zeros((0, 1), np.float32)
    boot_obs = np.concatenate(boot) if boot else np.empty((0, *obs0.shape[1:]), dtype=obs0.dtype)
    ends = np.flatnonzero(cut)
    longest = int(np.diff(ends, prepend=-1).max()) if len(ends) else 1

    def f64(x):
        return torch.as_tensor(np.asarray(x, dtype=np.float64), device=device)

    behaviour = f64(np.concatenate([b["logp"] for b in batches]) if batches else np.zeros(0))
    ratio = torch.exp(target_logp.double() - behaviour)
    keep = f64(~cut)
    plan = VTracePlan(
        next_index=torch.as_tensor(index, device=device), rhos=ratio.clamp(max=config.rho_bar),
        pg_rhos=ratio.clamp(max=config.pg_rho_bar), carry=config.gamma * ratio.clamp(max=config.c_bar) * keep,
        keep=keep, rewards=f64(np.concatenate([clip_rewards(b["rewards"], config.reward_clip) for b in batches])
                               if batches else np.zeros(0)),
        gamma=float(config.gamma), rounds=max(0, math.ceil(math.log2(longest))))
    return plan, boot_obs


def vtrace_from_plan(plan: VTracePlan, values: torch.Tensor, bootstrap_values: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(v_s targets, policy-gradient advantages), float32 on the plan's device: `vtrace` over every batch
    of the plan at once, with these values (module docstring). Equal to `vtrace_batches` given the same
    values in `final_values` and `bootstrap_value`, to float rounding (the recursion is summed in
    another order)."""
    v = values.double()
    nv = torch.cat([v, bootstrap_values.double(), v.new_zeros(1)])[plan.next_index]
    delta = plan.rhos * (plan.rewards + plan.gamma * nv - v)
    acc = reverse_linear_scan(plan.carry, delta, plan.rounds)  # v_s - V(x_s)
    acc_next = torch.cat([acc[1:], acc.new_zeros(1)]) * plan.keep
    adv = plan.pg_rhos * (plan.rewards + plan.gamma * (nv + acc_next) - v)
    return (v + acc).float(), adv.float()


def reverse_linear_scan(a: torch.Tensor, b: torch.Tensor, rounds: int) -> torch.Tensor:
    """x with x_t = b_t + a_t x_{t+1} (x beyond the end 0), by doubling: after round r, x_t sums the
    terms of the 2^r steps from t and a_t is their product, so `rounds` >= log2 of the longest run of
    nonzero a's (plus one) is exact. A few vector ops a round instead of one Python step per row."""
    x, a = b.clone(), a.clone()
    step = 1
    for _ in range(rounds):
        if step >= len(x):
            break
        x[:-step] += a[:-step] * x[step:]
        a = torch.cat([a[:-step] * a[step:], a.new_zeros(step)])
        step *= 2
    return x
