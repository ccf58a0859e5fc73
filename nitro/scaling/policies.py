"""The scaling policies (paper 5.3 and the baselines of 8.3 / 8.5) and make_policy().

nitro     I_k = clip(round(I_max * S_k), I_min, I_max)
fixed     N every round ("no boosting"; the paper's ablation uses 16); ignores I_min/I_max
max       I_max every round
hydrozoa  I_min * 2^floor(k / every), capped at I_max (every = 10 rounds, paper 8.3's example)
kungfu    round(I_min * B_noise / B_ref), B_ref = the first known noise scale (so the first
          round gives I_min), never below the previous round, clipped to [I_min, I_max]
minions   a pre-trained actor-critic scheduler (MinionsRL) picks 1..I_max from how the last round went,
          floored at I_min (nitro.scaling.minions; params: scheduler = the checkpoint's path)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nitro.errors import ConfigError
from nitro.scaling.base import RoundInputs, ScalingPolicy, check_params, clip, round_half_up

POLICY_NAMES = ("nitro", "fixed", "max", "hydrozoa", "kungfu", "minions")


def _positive_int(policy: str, field: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"invalid value for {policy}.{field}: must be an integer >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class NitroPolicy:
    name: str = "nitro"

    def decide(self, state: dict, inputs: RoundInputs) -> tuple[int, dict, str]:
        s = inputs.score if math.isfinite(inputs.score) else 0.0  # an unusable score spends the minimum
        s = min(max(s, 0.0), 1.0)
        raw = round_half_up(inputs.i_max * s)
        actors = clip(raw, inputs.i_min, inputs.i_max)
        return actors, dict(state), f"nitro: S_k={s:.4f}, round({inputs.i_max}*S_k)={raw}, clipped to {actors}"


@dataclass(frozen=True)
class FixedPolicy:
    actors: int = 16
    name: str = "fixed"

    def decide(self, state: dict, inputs: RoundInputs) -> tuple[int, dict, str]:
        return self.actors, dict(state), f"fixed: {self.actors} actors every round"


@dataclass(frozen=True)
class MaxPolicy:
    name: str = "max"

    def decide(self, state: dict, inputs: RoundInputs) -> tuple[int, dict, str]:
        return inputs.i_max, dict(state), f"max: I_max={inputs.i_max}"


@dataclass(frozen=True)
class HydrozoaPolicy:
    every: int = 10
    name: str = "hydrozoa"

    def decide(self, state: dict, inputs: RoundInputs) -> tuple[int, dict, str]:
        doublings = inputs.round_index // self.every
        # Capping the exponent keeps 2**d small; 63 doublings exceed any I_max.
        actors = min(inputs.i_min * 2 ** min(doublings, 63), inputs.i_max)
        return actors, dict(state), f"hydrozoa: {doublings} doubling(s) after {inputs.round_index} rounds"


@dataclass(frozen=True)
class KungFuPolicy:
    reference: float | None = None  # B_ref; None = anchor on the first known noise scale
    name: str = "kungfu"

    def decide(self, state: dict, inputs: RoundInputs) -> tuple[int, dict, str]:
        prev = int(state.get("actors", 0))
        ref = state.get("reference", self.reference)
        b = inputs.noise_scale
        if b is None or not math.isfinite(b) or b <= 0:
            target, why = max(prev, inputs.i_min), "noise scale unknown, keeping the previous size"
        else:
            ref = float(b) if ref is None else float(ref)
            target = round_half_up(inputs.i_min * b / ref)
            why = f"B_noise={b:.4g}, B_ref={ref:.4g} -> {target}"
        actors = clip(max(target, prev), inputs.i_min, inputs.i_max)  # never scale down
        new_state = dict(state, actors=actors)
        if ref is not None:
            new_state["reference"] = float(ref)
        return actors, new_state, f"kungfu: {why}; never down from {prev}, clipped to {actors}"


def make_policy(name: str, params: dict | None = None) -> ScalingPolicy:
    """The policy called `name` ("nitro", "fixed", "fixed:16", "max", "hydrozoa", "kungfu", "minions") with `params`.

    "minions" loads its checkpoint (params["scheduler"], cached per path): SchedulerCheckpointError
    for a missing or corrupt file, SchedulerMismatchError for one of another format or layout.
    """
    params = dict(params or {})
    base, _, arg = str(name).partition(":")
    if base not in POLICY_NAMES:
        raise ConfigError(f"unknown scaling policy {name!r}; allowed: {list(POLICY_NAMES)} (or 'fixed:N')")
    if arg and base != "fixed":
        raise ConfigError(f"invalid scaling policy {name!r}: only 'fixed' takes a ':N' suffix")
    if base == "fixed":
        check_params(base, params, {"actors"})
        if arg:
            try:
                n = int(arg)
            except ValueError:
                raise ConfigError(f"invalid value for fixed.actors: must be an integer >= 1, got {arg!r}") from None
            if "actors" in params and params["actors"] != n:
                raise ConfigError(f"fixed.actors given twice: {name!r} and actors={params['actors']!r}")
            params["actors"] = n
        return FixedPolicy(_positive_int(base, "actors", params.get("actors", 16)))
    if base == "hydrozoa":
        check_params(base, params, {"every"})
        return HydrozoaPolicy(_positive_int(base, "every", params.get("every", 10)))
    if base == "kungfu":
        check_params(base, params, {"reference"})
        ref = params.get("reference")
        if ref is not None and (isinstance(ref, bool) or not isinstance(ref, (int, float))
                                or not math.isfinite(ref) or ref <= 0):
            raise ConfigError(f"invalid value for kungfu.reference: must be a finite number > 0, got {ref!r}")
        return KungFuPolicy(None if ref is None else float(ref))
    if base == "minions":
        check_params(base, params, {"scheduler"})
        from nitro.scaling.minions import MinionsPolicy, load_scheduler_cached  # numpy; loaded on demand

        return MinionsPolicy(load_scheduler_cached(params.get("scheduler") or ""))
    check_params(base, params, set())
    return NitroPolicy() if base == "nitro" else MaxPolicy()
