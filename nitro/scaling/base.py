"""The scaling-policy interface: round inputs, the policy protocol, and choosing a policy by name.

A policy is pure: decide(state, inputs) -> (actors, new_state, reason). `state`
is the policy's own JSON-serialisable memory between rounds (the scaler
service keeps it in Redis, so replicas are interchangeable); policies never
mutate it, they return a new one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from nitro.contracts import DEFAULT_I_MAX, DEFAULT_I_MIN
from nitro.errors import ConfigError

# How a plan made from the detector fallback starts its reason: the learner reads it to report whether the
# fallback was used (only a policy that reads the boosting score needs one).
FALLBACK_REASON = "fallback plan"



def check_range(i_min: int, i_max: int) -> None:
    """ConfigError unless 1 <= i_min <= i_max (integers)."""
    if not isinstance(i_min, int) or isinstance(i_min, bool) or i_min < 1:
        raise ConfigError(f"invalid value for i_min: must be an integer >= 1, got {i_min!r}")
    if not isinstance(i_max, int) or isinstance(i_max, bool) or i_max < i_min:
        raise ConfigError(f"invalid value for i_max: must be an integer >= i_min ({i_min}), got {i_max!r}")


@dataclass(frozen=True)
class RoundInputs:
    """What a policy may look at for round k (0-based)."""

    round_index: int
    score: float = 0.0  # boosting score S_k in [0, 1] (nitro)
    i_min: int = DEFAULT_I_MIN
    i_max: int = DEFAULT_I_MAX
    noise_scale: float | None = None  # the last round's gradient noise scale B_simple (kungfu); None = unknown
    # The last round's |G|^2 and tr(Sigma) of the policy's gradient alone (noise averages each, then divides);
    # None = not measured.
    policy_noise_terms: tuple[float, float] | None = None
    # What a round costs, from the job's own ledger (nitro.cost.round_and_sample_costs): a per round whatever its
    # size, c per sample (noise). 0 = unknown.
    round_cost_usd: float = 0.0
    sample_cost_usd: float = 0.0
    steps_per_actor: int = 0  # env steps one actor samples (0 = unknown)
    # How the job stands and how the last round went (learned schedulers: minions). Defaults mean
    # "unknown" (round 0, or a caller that does not send them); other policies ignore them.
    rounds: int = 0  # the job's planned number of rounds (0 = unknown)
    learner_loss: float = 0.0  # total PPO loss of the last update
    eval_return: float = 0.0  # last deterministic evaluation return
    approx_kl: float = 0.0  # KL(old || new) of the last update
    update_seconds: float = 0.0  # learner (update) time of the last round
    actor_seconds: float = 0.0  # sampling (actor) time of the last round
    round_seconds: float = 0.0  # wall time of the last round
    target_return: float = 0.0  # the job's target return (0 = none)
    budget_usd: float | None = None  # the job's budget (None = unlimited)
    budget_left_usd: float | None = None  # budget left after everything billed so far

    def __post_init__(self) -> None:
        if not isinstance(self.round_index, int) or self.round_index < 0:
            raise ConfigError(f"invalid value for round_index: must be an integer >= 0, got {self.round_index!r}")
        check_range(self.i_min, self.i_max)


class ScalingPolicy(Protocol):
    name: str

    def decide(self, state: dict, inputs: RoundInputs) -> tuple[int, dict, str]: ...


def round_half_up(x: float) -> int:
    """Round to nearest, halves up (Python's round() sends 2.5 to 2)."""
    return int(math.floor(x + 0.5))


def clip(x: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, x))


def check_params(policy: str, params: dict, allowed: set[str]) -> None:
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ConfigError(f"unknown parameter(s) {unknown} for scaling policy {policy!r}; allowed: {sorted(allowed)}")
