"""What the round loops need of an algorithm's learner (nitro/algos), as protocols instead of duck typing.

Every learner owns the policy the loop publishes, evaluates and checkpoints; a `GradientLearner` (PPO,
IMPACT) updates it on batches itself, a `ParameterAggregator` (Stellaris's parameter service) applies the
updates learner functions computed. tests/test_learner_protocol.py checks that each learner a loop builds
satisfies the protocol the loop declares.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from nitro.algos.ppo import UpdateStats
from nitro.algos.stellaris import Aggregation
from nitro.policy.model_spec import ModelSpec
from nitro.policy.models import Policy


@runtime_checkable
class Learner(Protocol):
    """The policy and the state a checkpoint keeps of it."""

    policy: Policy  # published after each update, evaluated, checkpointed
    kl_coeff: float  # the adaptive KL coefficient after the latest update
    last_data: dict[str, np.ndarray] | None  # the latest update's samples, for the detector's sample subset

    def state(self) -> dict:
        """What a checkpoint keeps: parameters, optimiser, counters."""
        ...

    def load_state(self, state: dict) -> None:
        ...


@runtime_checkable
class GradientLearner(Learner, Protocol):
    """A learner that computes its updates: the on-policy (PPO) and off-policy (IMPACT) loops."""

    def update(self, batches: list[dict]) -> UpdateStats:
        """One update on these actor batches (PPO: the round's SGD; IMPACT: one step on arriving batches)."""
        ...


@runtime_checkable
class ParameterAggregator(Learner, Protocol):
    """A learner that applies updates computed elsewhere: the Stellaris parameter service."""

    n_params: int  # length of a flat update

    def aggregate(self, updates: Sequence[np.ndarray], agg: Aggregation, kls: Sequence[float] = (),
                  obs: Sequence[np.ndarray] = ()) -> bool:
        """Apply one queue of updates weighted by `agg`; True when the policy moved."""
        ...


class LearnerFactory(Protocol):
    """A learner class as the loops build it: `learner_class(model_spec, algo config, seed=, device=)`."""

    def __call__(self, spec: ModelSpec, config, seed: int = 0, device: str = "cpu") -> Learner:
        ...
