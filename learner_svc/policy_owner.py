"""What the round loops need of the object that owns their policy (RoundLoop.learner), as protocols instead of
duck typing.

A `PolicyOwner` holds the policy the loop publishes, evaluates and checkpoints. Two kinds, named apart
(docs/architecture.md, "Which learner"): a `GradientLearner` (PPOLearner, IMPACTLearner) updates it on batches
itself; a `ParameterAggregator` (Stellaris's parameter server, nitro.algos.stellaris.ParameterServer) applies the
updates learner functions computed, and is no learner. tests/test_policy_owner.py checks that the owner each loop
builds satisfies the protocol the loop declares.
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
class PolicyOwner(Protocol):
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
class GradientLearner(PolicyOwner, Protocol):
    """An owner that computes its updates: the on-policy (PPO) and off-policy (IMPACT) loops."""

    def update(self, batches: list[dict]) -> UpdateStats:
        """One update on these actor batches (PPO: the round's SGD; IMPACT: one step on arriving batches)."""
        ...


@runtime_checkable
class ParameterAggregator(PolicyOwner, Protocol):
    """An owner that applies updates computed elsewhere: Stellaris's parameter server."""

    n_params: int  # length of a flat update

    def aggregate(self, updates: Sequence[np.ndarray], agg: Aggregation, kls: Sequence[float] = (),
                  obs: Sequence[np.ndarray] = ()) -> bool:
        """Apply one queue of updates weighted by `agg`; True when the policy moved."""
        ...


class PolicyOwnerFactory(Protocol):
    """A policy owner's class as the loops build it: `learner_class(model_spec, algo config, seed=, device=)`."""

    def __call__(self, spec: ModelSpec, config, seed: int = 0, device: str = "cpu") -> PolicyOwner:
        ...
