"""MinionsRL's learned actor scheduler (Yu et al., AAAI 2024) as the scaling policy `minions`.

A small actor-critic agent (2x64 tanh MLP, categorical over 1..I_max actors) looks
at how the last round went and picks the next round's actor count. It is trained by
`nitro pretrain-minions` (nitro.training.minions_pretrain) with this project's PPO across short
training jobs run through the real system; at serving time it acts greedily (argmax).
This module is numpy only, so the scaler process never imports torch.

Pure pieces: `observation(inputs)` (the 8 features, OBS_NAMES), `round_penalty` /
`progress_rewards` / `episode_rewards` (the reward), `Scheduler.choose` (the decision),
`decision_distribution` (which actor counts a scheduler picks over a set of inputs).
`MinionsPolicy` adapts them to the ScalingPolicy protocol. docs/minions.md has the details.

Checkpoint: one .npz (numpy, allow_pickle=False) holding the actor and critic weights
and the running mean and variance of the observations seen in pre-training (the
network's inputs are standardised with them, as obs_norm does for a PPO policy)
under nitro.policy.models.Policy's state-dict names, plus a JSON `__meta__` entry: format name,
format version, mode ("serve" = argmax, "explore" = sample; pre-training writes the
latter), and a fingerprint of what the weights were trained for (I_max, observation
layout, network shape). A missing or unreadable file is SchedulerCheckpointError
(INVALID_ARGUMENT on the wire); a readable checkpoint for another format version,
observation layout or I_max is SchedulerMismatchError (FAILED_PRECONDITION).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import zipfile
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nitro.errors import ConfigError
from nitro.scaling.base import RoundInputs, clip

CHECKPOINT_FORMAT = "nitro-minions-scheduler"
CHECKPOINT_VERSION = 2  # 2: observations standardised with the stored obs_mean / obs_var
# Order is the network's input order; changing it (or any scaling below) bumps OBS_VERSION.
OBS_NAMES = ("round", "loss", "eval_return", "approx_kl", "learner_time", "actor_time", "round_time",
             "budget_left")
OBS_VERSION = 1
OBS_DIM = len(OBS_NAMES)
HIDDEN_SIZES = (64, 64)
ACTIVATION = "tanh"
OBS_NORM = "running mean/var"  # the features are standardised with pre-training's statistics before the network
OBS_NORM_CLIP = 10.0  # as nitro.policy.model_spec.OBS_CLIP: standardised features are clipped to +-10
MODES = ("serve", "explore")
META_KEY = "__meta__"

# Observation scales (see observation()).
SYMLOG_SCALE = 10.0  # symlog(x) / 10 spans |x| up to e^10 - 1 ~ 22,000 before clipping
KL_UNIT = 1e-3  # approx KL is read on a log scale from 1e-3 (tiny update) to 1 (policy jumped)
ROUND_SECONDS_MAX = 3600.0  # the longest round deadline a spec allows

# Reward defaults (see episode_rewards()).
PROGRESS_WEIGHT = 1.0
COST_WEIGHT = 1.0
TIME_WEIGHT = 1.0
TARGET_BONUS = 2.0
USD_TOLERANCE = 1e-9


class SchedulerCheckpointError(ConfigError):
    """No usable checkpoint at the path: missing, unreadable, not a scheduler checkpoint, corrupt weights."""

    def __init__(self, detail: str):
        self.detail = detail
        super().__init__(f"scaler.scheduler: {detail}")


class SchedulerMismatchError(SchedulerCheckpointError):
    """A valid checkpoint trained for something else: format version, observation layout or I_max."""


# -- observation ------------------------------------------------------------------------


def _num(x, default: float = 0.0) -> float:
    """A finite float, or `default` for None / NaN / inf (a round that could not measure something)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) else default


def symlog(x: float) -> float:
    """sign(x) * ln(1 + |x|): keeps small values linear and compresses large ones of either sign."""
    return math.copysign(math.log1p(abs(x)), x)


def _clip(x: float, lo: float, hi: float) -> float:
    return min(hi, max(lo, x))


def observation(inputs: RoundInputs) -> np.ndarray:
    """The scheduler's 8 features for planning round `inputs.round_index`, float32 in OBS_NAMES order.

    Every feature is bounded so no single input dominates a tanh network and unseen
    magnitudes saturate instead of extrapolating:

    round        k / rounds, clipped to [0, 1] (0 when rounds is unknown): how far the job is
    loss         symlog(learner loss) / 10, clipped to [-1, 1]: losses differ by orders of magnitude
    eval_return  return / target in [-1, 1] when the job has a target > 0 (progress towards the
                 bonus), else symlog(return) / 10 in [-1, 1]
    approx_kl    ln(1 + kl / 1e-3) / ln(1 + 1000), clipped to [0, 1]: KLs live between 1e-4 and 1
    learner_time update seconds / round seconds in [0, 1]: share of the round the learner took
    actor_time   sampling seconds / round seconds in [0, 1]: share spent waiting for actors
    round_time   ln(1 + round seconds) / ln(1 + 3600) in [0, 1]: the round's absolute length
    budget_left  budget left / budget in [0, 1] (1 without a budget)

    Non-finite inputs count as 0 (1 for the budget). Round 0 has no last round: its
    loss, return, KL and times are 0.
    """
    rounds = inputs.rounds if isinstance(inputs.rounds, int) and inputs.rounds > 0 else 0
    progress = _clip(inputs.round_index / rounds, 0.0, 1.0) if rounds else 0.0
    loss = _clip(symlog(_num(inputs.learner_loss)) / SYMLOG_SCALE, -1.0, 1.0)
    ret, target = _num(inputs.eval_return), _num(inputs.target_return)
    ret_f = _clip(ret / target, -1.0, 1.0) if target > 0 else _clip(symlog(ret) / SYMLOG_SCALE, -1.0, 1.0)
    kl = max(_num(inputs.approx_kl), 0.0)
    kl_f = _clip(math.log1p(kl / KL_UNIT) / math.log1p(1.0 / KL_UNIT), 0.0, 1.0)
    round_s = max(_num(inputs.round_seconds), 0.0)
    learner_f = _clip(max(_num(inputs.update_seconds), 0.0) / round_s, 0.0, 1.0) if round_s > 0 else 0.0
    actor_f = _clip(max(_num(inputs.actor_seconds), 0.0) / round_s, 0.0, 1.0) if round_s > 0 else 0.0
    round_f = _clip(math.log1p(round_s) / math.log1p(ROUND_SECONDS_MAX), 0.0, 1.0)
    budget = _num(inputs.budget_usd, 0.0)
    left = _num(inputs.budget_left_usd, budget)
    budget_f = _clip(left / budget, 0.0, 1.0) if budget > 0 and inputs.budget_left_usd is not None else 1.0
    return np.array([progress, loss, ret_f, kl_f, learner_f, actor_f, round_f, budget_f], dtype=np.float32)


def describe_inputs(inputs: RoundInputs) -> str:
    """The raw inputs in one line for the round report (the features are derived from these)."""
    rounds = f"/{inputs.rounds}" if inputs.rounds else ""
    if inputs.budget_usd and inputs.budget_left_usd is not None:
        budget = f"budget_left=${_num(inputs.budget_left_usd):.4f}/${_num(inputs.budget_usd):.4f}"
    else:
        budget = "budget_left=unlimited"
    return (f"k={inputs.round_index}{rounds} loss={_num(inputs.learner_loss):.4g} "
            f"return={_num(inputs.eval_return):.4g} kl={_num(inputs.approx_kl):.3g} "
            f"learner={_num(inputs.update_seconds):.2f}s actors={_num(inputs.actor_seconds):.2f}s "
            f"round={_num(inputs.round_seconds):.2f}s {budget}")


# -- reward -----------------------------------------------------------------------------


def round_penalty(cost_usd: float, seconds: float, *, budget_usd: float, rounds: int, round_seconds_ref: float,
                  cost_weight: float = COST_WEIGHT, time_weight: float = TIME_WEIGHT) -> float:
    """The per-round penalty (>= 0) for a round that cost `cost_usd` and took `seconds`.

        cost_weight * cost / budget  +  time_weight * seconds / (rounds * round_seconds_ref)

    Cost is a share of the job's budget and time a share of a time allowance of
    `rounds` rounds at the reference pace, so over a whole job each term sums to
    about 1 (the cost term to at most 1: the scaler never overspends).
    """
    if not (budget_usd > 0 and rounds >= 1 and round_seconds_ref > 0):
        raise ConfigError(f"round_penalty needs budget_usd > 0, rounds >= 1, round_seconds_ref > 0; got "
                          f"{budget_usd!r}, {rounds!r}, {round_seconds_ref!r}")
    return (cost_weight * max(_num(cost_usd), 0.0) / budget_usd
            + time_weight * max(_num(seconds), 0.0) / (rounds * round_seconds_ref))


def target_reached(final_eval_return: float, target_return: float, total_cost_usd: float, budget_usd: float) -> bool:
    """The job met its target return (> 0) without spending more than its budget."""
    return (target_return > 0 and _num(final_eval_return, -math.inf) >= target_return
            and _num(total_cost_usd, math.inf) <= budget_usd + USD_TOLERANCE)


def progress_rewards(eval_returns: Sequence[float], *, return_scale: float,
                     initial_eval_return: float | None = None, weight: float = PROGRESS_WEIGHT) -> list[float]:
    """What each round bought: weight * (eval return after round t - before it) / return_scale.

    Decision t chose round t's actors, and round t's samples made update t, so the change
    of the evaluation return across round t is its consequence. Before round 0 the return
    is `initial_eval_return` (None: unknown, so decision 0 gets 0). A round that was not
    evaluated (NaN) keeps the last known return. Over a job the terms sum to the job's
    return gain in units of `return_scale`.
    """
    if not (math.isfinite(return_scale) and return_scale > 0):
        raise ConfigError(f"progress_rewards needs return_scale > 0, got {return_scale!r}")
    out = []
    prev = _num(initial_eval_return, math.nan) if initial_eval_return is not None else math.nan
    for ret in eval_returns:
        cur = _num(ret, math.nan)
        if math.isnan(cur):
            cur = prev
        out.append(0.0 if math.isnan(prev) or math.isnan(cur) else weight * (cur - prev) / return_scale)
        prev = cur
    return out


def episode_rewards(round_costs_usd: Sequence[float], round_seconds: Sequence[float], *, budget_usd: float,
                    rounds: int, round_seconds_ref: float, target_return: float, final_eval_return: float,
                    cost_weight: float = COST_WEIGHT, time_weight: float = TIME_WEIGHT,
                    bonus: float = TARGET_BONUS, eval_returns: Sequence[float] | None = None,
                    return_scale: float = 0.0, initial_eval_return: float | None = None,
                    progress_weight: float = PROGRESS_WEIGHT) -> list[float]:
    """Reward of each decision of one job:

        r_t = progress_rewards(...)[t] - round_penalty(round t)   (+ `bonus` on the last one when
                                                                  the job reached its target within budget)

    Decision t chose round t's actors, so round t's cost, time and return change are its
    consequence. Without `eval_returns` (or with return_scale 0) there is no progress term:
    then every extra actor only adds cost and time, and unless the target bonus is within
    reach the best schedule is always the fewest actors. The progress term is what the
    actors buy. The bonus (2) exceeds what a successful job can lose to penalties at the
    reference pace (cost share <= 1, time share ~ 1), so reaching the target always beats
    failing cheaply; among successful jobs the cheaper and faster score higher, and ending
    early saves the remaining rounds' penalties.
    """
    if len(round_costs_usd) != len(round_seconds):
        raise ConfigError(f"episode_rewards: {len(round_costs_usd)} costs but {len(round_seconds)} round times")
    out = [-round_penalty(c, s, budget_usd=budget_usd, rounds=rounds, round_seconds_ref=round_seconds_ref,
                          cost_weight=cost_weight, time_weight=time_weight)
           for c, s in zip(round_costs_usd, round_seconds)]
    if eval_returns is not None and return_scale > 0:
        if len(eval_returns) != len(out):
            raise ConfigError(f"episode_rewards: {len(out)} rounds but {len(eval_returns)} eval returns")
        out = [r + p for r, p in zip(out, progress_rewards(eval_returns, return_scale=return_scale,
                                                             initial_eval_return=initial_eval_return,
                                                             weight=progress_weight))]
    total = sum(max(_num(c), 0.0) for c in round_costs_usd)
    if out and target_reached(final_eval_return, target_return, total, budget_usd):
        out[-1] += bonus
    return out


# -- the network and its checkpoint ------------------------------------------------------


def fingerprint(i_max: int) -> dict:
    """What a checkpoint's weights were trained for; serving anything else is a mismatch."""
    return {"i_max": int(i_max), "obs_names": list(OBS_NAMES), "obs_version": OBS_VERSION,
            "obs_norm": OBS_NORM, "hidden_sizes": list(HIDDEN_SIZES), "activation": ACTIVATION}


def fingerprint_id(fp: dict) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


def _layer_shapes(prefix: str, out_dim: int) -> dict[str, tuple[int, ...]]:
    dims = (OBS_DIM, *HIDDEN_SIZES)
    shapes = {}
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        shapes[f"{prefix}.layers.{i}.weight"] = (b, a)
        shapes[f"{prefix}.layers.{i}.bias"] = (b,)
    shapes[f"{prefix}.out.weight"] = (out_dim, dims[-1])
    shapes[f"{prefix}.out.bias"] = (out_dim,)
    return shapes


def weight_shapes(i_max: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the actor, the critic and the observation statistics (nitro.policy.models.Policy
    naming, so PPO can resume them)."""
    return {**_layer_shapes("actor", i_max), **_layer_shapes("critic", 1), "obs_mean": (OBS_DIM,),
            "obs_var": (OBS_DIM,)}


def _uniform(seed: int, round_index: int) -> float:
    """A reproducible U[0, 1) per (exploration seed, round): a retried Plan samples the same action."""
    return float(np.random.default_rng([int(seed) % 2**63, int(round_index)]).random())


@dataclass(frozen=True)
class Scheduler:
    """A loaded scheduler: the actor network plus what it was trained for."""

    i_max: int
    mode: str  # "serve": argmax; "explore": sample (pre-training)
    explore_seed: int
    meta: dict = field(repr=False)
    weights: tuple = field(repr=False)  # ((W^T, b), ...) of the actor, float32
    obs_mean: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(OBS_DIM))
    obs_std: np.ndarray = field(repr=False, default_factory=lambda: np.ones(OBS_DIM))

    def standardise(self, obs: np.ndarray) -> np.ndarray:
        """The features as the network sees them: (obs - mean) / std of pre-training's inputs, clipped."""
        z = (np.asarray(obs, dtype=np.float64).reshape(-1) - self.obs_mean) / self.obs_std
        return np.clip(z, -OBS_NORM_CLIP, OBS_NORM_CLIP).astype(np.float32)

    def logits(self, obs: np.ndarray) -> np.ndarray:
        x = self.standardise(obs)
        for w, b in self.weights[:-1]:
            x = np.tanh(x @ w + b)
        w, b = self.weights[-1]
        return (x @ w + b).astype(np.float64)

    def probabilities(self, obs: np.ndarray) -> np.ndarray:
        z = self.logits(obs)
        e = np.exp(z - z.max())
        return e / e.sum()

    def choose(self, obs: np.ndarray, round_index: int) -> tuple[int, float]:
        """(action index in [0, I_max), its probability): argmax when serving, a sample when exploring."""
        p = self.probabilities(obs)
        if self.mode == "explore":
            a = int(np.searchsorted(np.cumsum(p), _uniform(self.explore_seed, round_index) * p.sum(), side="right"))
            a = min(a, len(p) - 1)
        else:
            a = int(np.argmax(p))
        return a, float(p[a])

    def check_i_max(self, i_max: int) -> None:
        if i_max != self.i_max:
            raise SchedulerMismatchError(
                f"checkpoint {self.meta.get('path', '')!r} was trained for i_max={self.i_max}, but this job has "
                f"scaler.i_max={i_max}: pre-train one with `nitro pretrain-minions --i-max {i_max}` or set "
                f"--i-max {self.i_max}")


def save_checkpoint(path: str | os.PathLike, state: dict[str, np.ndarray], i_max: int, *, mode: str = "serve",
                    explore_seed: int = 0, metadata: dict | None = None) -> str:
    """Write a scheduler checkpoint atomically; `state` holds at least weight_shapes(i_max). Returns the path."""
    if mode not in MODES:
        raise ConfigError(f"invalid scheduler mode {mode!r}; allowed: {list(MODES)}")
    arrays = {}
    for name, shape in weight_shapes(i_max).items():
        a = np.asarray(state[name], dtype=np.float32)
        if a.shape != shape:
            raise ConfigError(f"scheduler weight {name} has shape {a.shape}, expected {shape}")
        arrays[name] = a
    fp = fingerprint(i_max)
    meta = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "mode": mode,
            "explore_seed": int(explore_seed), "fingerprint": fp, "fingerprint_id": fingerprint_id(fp),
            "metadata": dict(metadata or {})}
    arrays[META_KEY] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)  # a scaler never reads a half-written checkpoint
    return path


def read_checkpoint(path: str | os.PathLike) -> tuple[dict, dict[str, np.ndarray]]:
    """(meta, arrays) of a checkpoint, checked; SchedulerCheckpointError / SchedulerMismatchError otherwise."""
    path = os.fspath(path)
    if not path:
        raise SchedulerCheckpointError("is required with scaler.policy 'minions': the path of a checkpoint "
                                       "written by `nitro pretrain-minions`")
    if not os.path.exists(path):
        raise SchedulerCheckpointError(f"no scheduler checkpoint at {path!r} (the path must be readable by the "
                                       "learner and the scaler; use an absolute path)")
    if not os.path.isfile(path):
        raise SchedulerCheckpointError(f"{path!r} is not a file")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        meta = json.loads(arrays.pop(META_KEY).tobytes().decode())
    except KeyError:
        raise SchedulerCheckpointError(f"{path!r} is not a minions scheduler checkpoint (no {META_KEY} entry)") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise SchedulerCheckpointError(f"{path!r} is not a readable scheduler checkpoint "
                                       f"({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise SchedulerCheckpointError(f"{path!r} is not a minions scheduler checkpoint (format "
                                       f"{meta.get('format') if isinstance(meta, dict) else None!r})")
    if meta.get("version") != CHECKPOINT_VERSION:
        raise SchedulerMismatchError(f"checkpoint {path!r} has format version {meta.get('version')!r}; this nitro "
                                     f"reads version {CHECKPOINT_VERSION}: pre-train it again")
    fp = meta.get("fingerprint")
    i_max = fp.get("i_max") if isinstance(fp, dict) else None
    if isinstance(i_max, bool) or not isinstance(i_max, int) or i_max < 1:
        raise SchedulerCheckpointError(f"checkpoint {path!r} has no valid i_max in its fingerprint")
    expected = fingerprint(i_max)
    if fp != expected:
        diff = sorted(k for k in set(fp) | set(expected) if fp.get(k) != expected.get(k))
        raise SchedulerMismatchError(f"checkpoint {path!r} was trained for another scheduler layout (differs in "
                                     f"{diff}; this nitro observes {list(OBS_NAMES)} v{OBS_VERSION} with "
                                     f"{ACTIVATION} {list(HIDDEN_SIZES)}): pre-train it again")
    if meta.get("mode") not in MODES:
        raise SchedulerCheckpointError(f"checkpoint {path!r} has an unknown mode {meta.get('mode')!r}")
    for name, shape in weight_shapes(i_max).items():
        a = arrays.get(name)
        if a is None or a.shape != shape or a.dtype.kind != "f" or not np.all(np.isfinite(a)):
            raise SchedulerCheckpointError(f"checkpoint {path!r} has a missing or corrupt weight {name!r}")
    if np.any(arrays["obs_var"] < 0):
        raise SchedulerCheckpointError(f"checkpoint {path!r} has a missing or corrupt weight 'obs_var' (negative)")
    return meta, arrays


def scheduler_from_state(state: dict[str, np.ndarray], i_max: int, *, mode: str = "serve", explore_seed: int = 0,
                         meta: dict | None = None) -> Scheduler:
    """A Scheduler straight from weights (nitro.policy.models.Policy names), as load_scheduler would build it."""
    if mode not in MODES:
        raise ConfigError(f"invalid scheduler mode {mode!r}; allowed: {list(MODES)}")
    n_hidden = len(HIDDEN_SIZES)
    names = [(f"actor.layers.{i}.weight", f"actor.layers.{i}.bias") for i in range(n_hidden)]
    names.append(("actor.out.weight", "actor.out.bias"))
    weights = tuple((np.ascontiguousarray(np.asarray(state[w]).T, dtype=np.float32),
                     np.asarray(state[b]).astype(np.float32)) for w, b in names)
    mean = np.asarray(state["obs_mean"], dtype=np.float64).reshape(OBS_DIM)
    std = np.sqrt(np.asarray(state["obs_var"], dtype=np.float64).reshape(OBS_DIM) + 1e-8)  # as Policy.normalize
    return Scheduler(i_max=int(i_max), mode=mode, explore_seed=int(explore_seed), meta=dict(meta or {}),
                     weights=weights, obs_mean=mean, obs_std=std)


def load_scheduler(path: str | os.PathLike) -> Scheduler:
    meta, arrays = read_checkpoint(path)
    return scheduler_from_state(arrays, meta["fingerprint"]["i_max"], mode=meta["mode"],
                                explore_seed=int(meta.get("explore_seed", 0)),
                                meta={**meta, "path": os.fspath(path)})


def decision_distribution(scheduler: Scheduler | str | os.PathLike, observations, *, i_min: int = 1) -> dict[int, int]:
    """How often `scheduler` (or the checkpoint at that path) serving greedily (argmax) picks each
    actor count over `observations` (an (N, OBS_DIM) array, or RoundInputs): {actors: count},
    every count from i_min to I_max present (0 when never chosen). Counts below i_min are
    raised to it, as the job's floor would.
    """
    sched = scheduler if isinstance(scheduler, Scheduler) else load_scheduler(scheduler)
    if not 1 <= i_min <= sched.i_max:
        raise ConfigError(f"decision_distribution: i_min must be in [1, {sched.i_max}], got {i_min!r}")
    rows = [observation(o) if isinstance(o, RoundInputs) else o for o in observations]
    obs = np.asarray(rows, dtype=np.float32).reshape(-1, OBS_DIM) if rows else np.zeros((0, OBS_DIM), np.float32)
    hist = {n: 0 for n in range(i_min, sched.i_max + 1)}
    for row in obs:
        hist[max(i_min, int(np.argmax(sched.logits(row))) + 1)] += 1
    return hist


def format_distribution(hist: dict[int, int], width: int = 40) -> list[str]:
    """A text histogram of decision_distribution's result: one line per actor count, with its share."""
    total = sum(hist.values())
    top = max(hist.values(), default=0)
    lines = []
    for n in sorted(hist):
        c = hist[n]
        bar = "#" * (round(width * c / top) if top else 0)
        lines.append(f"{n:>4} actors  {c:>5}  {100.0 * c / total if total else 0.0:5.1f}%  {bar}")
    return lines


def pretraining_info(path: str | os.PathLike) -> dict:
    """What pre-training recorded in a checkpoint (env_id, episodes, wall_seconds, cost_usd, jobs, ...);
    {} for a checkpoint written some other way. For reports that add the pre-training cost to a run's."""
    meta, _ = read_checkpoint(path)
    return dict(meta.get("metadata", {}).get("pretraining", {}))


# Loaded schedulers by absolute path, reloaded when the file changes (pre-training rewrites them).
_CACHE: OrderedDict[str, tuple[tuple, Scheduler]] = OrderedDict()
_CACHE_SIZE = 32
_CACHE_LOCK = threading.Lock()


def load_scheduler_cached(path: str | os.PathLike) -> Scheduler:
    """load_scheduler, cached per path in this process (keyed by the file's identity and mtime)."""
    path = os.fspath(path)
    if not path:
        return load_scheduler(path)  # raises the "is required" error
    key = os.path.abspath(path)
    try:
        st = os.stat(key)
        ident = (st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        return load_scheduler(path)  # raises a clear error
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None and hit[0] == ident:
            _CACHE.move_to_end(key)
            return hit[1]
    sched = load_scheduler(path)  # errors are not cached: a fixed file is picked up at once
    with _CACHE_LOCK:
        _CACHE[key] = (ident, sched)
        _CACHE.move_to_end(key)
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return sched


# -- the scaling policy ------------------------------------------------------------------


@dataclass(frozen=True)
class MinionsPolicy:
    """ScalingPolicy over a loaded Scheduler.

    The network picks 1..I_max actors (I_max = the checkpoint's, which must be the job's
    scaler.i_max); the job's i_min is then a floor, as for every other policy, and the
    scaler's budget guard applies afterwards. In "explore" mode (pre-training) the state
    records each decision's observation and action under "trajectory" so the pre-training
    driver can read the episode back from the scaler's job state.
    """

    scheduler: Scheduler
    name: str = "minions"

    def check(self, inputs: RoundInputs) -> None:
        """SchedulerMismatchError unless the checkpoint was trained for this job's I_max."""
        self.scheduler.check_i_max(inputs.i_max)

    def decide(self, state: dict, inputs: RoundInputs) -> tuple[int, dict, str]:
        self.check(inputs)
        obs = observation(inputs)
        action, prob = self.scheduler.choose(obs, inputs.round_index)
        raw = action + 1
        actors = clip(raw, inputs.i_min, inputs.i_max)
        new_state = dict(state)
        how = "argmax"
        if self.scheduler.mode == "explore":
            how = "sampled"
            step = {"round": inputs.round_index, "obs": [float(x) for x in obs], "action": action}
            # A retried round replaces its earlier entry rather than appending a duplicate.
            new_state["trajectory"] = [t for t in state.get("trajectory", []) if t.get("round") != inputs.round_index]
            new_state["trajectory"].append(step)
        floor = f", raised to i_min={inputs.i_min}" if actors != raw else ""
        reason = (f"minions: {describe_inputs(inputs)} -> {raw} of 1..{self.scheduler.i_max} actors "
                  f"({how}, p={prob:.2f}){floor}")
        return actors, new_state, reason
