"""Pure helpers on actor batches (format: nitro.policy.rollout) for the trajectory stream: split, compress or not.

A batch too large for one stream entry is cut into contiguous parts that are
each a complete batch in their own right: per-step arrays are sliced, a part
that ends mid-episode bootstraps from the behaviour value of the next part's
first observation (exactly what the sampler would have recorded had it stopped
there), and finished episodes go to the part in which they ended (a several-env batch's
segment cuts, marked in `cut`, are not episode ends). GAE and
V-trace over a part are then the same kind of estimate as at the end of any
batch: identical to the unsplit batch's wherever the step's episode ends inside
the part, and bootstrapped from V at the cut (a shorter trace) just before it.
A batch that carries its bootstrap observations (`final_obs`, `bootstrap_obs`:
nitro.policy.rollout) hands each part the final observations of its truncated
steps and, as `bootstrap_obs`, the next part's first observation.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def steps_of(batch: dict) -> int:
    return len(batch["rewards"])


def wants_compression(batch: dict) -> bool:
    """True for image observations (uint8, 2-D or more per step): Atari frames shrink several-fold under zlib."""
    obs = batch.get("obs")
    return isinstance(obs, np.ndarray) and obs.dtype == np.uint8 and obs.ndim >= 3


def split_batch(batch: dict, parts: int, value_of: Callable[[np.ndarray], np.ndarray] | None = None) -> list[dict]:
    """`parts` contiguous sub-batches of near-equal length (at least one step each).

    A batch without per-step `values` (its learner does not read them: nitro.policy.rollout) takes the
    bootstrap values at the cuts from `value_of(observations)`, the actor's critic."""
    n = steps_of(batch)
    if not 1 <= parts <= max(n, 1):
        raise ValueError(f"cannot split a batch of {n} steps into {parts} parts")
    if parts == 1:
        return [batch]
    bounds = np.linspace(0, n, parts + 1).round().astype(int)
    done = np.asarray(batch["terminated"]) | np.asarray(batch["truncated"])
    if "values" in batch:
        values = batch["values"]
    elif value_of is None:
        raise ValueError("splitting a batch without per-step values needs value_of (the critic) for the cuts")
    else:  # V of the observation after each cut that falls mid-episode; no other row is read
        values = np.zeros(n, dtype=np.float32)
        rows = bounds[1:-1][~done[bounds[1:-1] - 1]]
        if len(rows):
            values[rows] = value_of(np.asarray(batch["obs"])[rows])
    cut = batch.get("cut")  # a VecSampler's segment cuts bootstrap like truncations but end no episode
    if "episode_rows" in batch:  # listed where no row ends them too (nitro.policy.rollout, episode_rows)
        ends = np.asarray(batch["episode_rows"], dtype=np.int64)
    else:  # the j-th finished episode ended at ends[j]
        ends = np.flatnonzero(done if cut is None else done & ~np.asarray(cut))
    per_step = {k for k, v in batch.items() if isinstance(v, np.ndarray) and v.ndim >= 1 and len(v) == n}
    per_step -= {"final_obs", "bootstrap_obs"}  # one row per truncation, one observation: never per step
    # final_obs[finals[a]:finals[b]] are the final observations of the truncated steps in rows [a, b)
    finals = np.concatenate([[0], np.cumsum(np.asarray(batch["truncated"], dtype=np.int64))])
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        part = {k: (v[a:b] if k in per_step else v) for k, v in batch.items()}
        if "final_obs" in batch:
            part["final_obs"] = batch["final_obs"][finals[a]:finals[b]]
        if b < n:
            part["bootstrap_value"] = 0.0 if done[b - 1] else float(values[b])
            if "bootstrap_obs" in batch:
                part["bootstrap_obs"] = np.array(batch["obs"][b])
        mine = (ends >= a) & (ends < b)
        for k in ("episode_returns", "episode_lengths"):
            if k in batch:
                part[k] = [x for x, m in zip(batch[k], mine) if m]
        if "episode_rows" in batch:
            part["episode_rows"] = [int(r) - int(a) for r, m in zip(ends, mine) if m]
        out.append(part)
    return out
