"""Each round loop declares the PolicyOwner protocol its policy owner (RoundLoop.learner) must satisfy
(learner_svc/policy_owner.py); the owner each loop builds (nitro/algos: PPOLearner, IMPACTLearner, Stellaris's
ParameterServer) satisfies it: every member is there, and every method accepts the protocol's arguments by the
same names."""

from __future__ import annotations

import inspect
import typing

import pytest

from learner_svc.offpolicy import OffPolicyLoop
from learner_svc.onpolicy import OnPolicyLoop
from learner_svc.parameter_service import StellarisLoop
from learner_svc.policy_owner import GradientLearner, ParameterAggregator, PolicyOwner
from nitro.policy.envs import env_spaces
from nitro.policy.models import spec_for_spaces
from nitro.spec import TrainingSpec, algo_config, validate

LOOPS = {
    "ppo": (OnPolicyLoop, {}, GradientLearner),
    "impact": (OffPolicyLoop, {"algo": "impact"}, GradientLearner),
    "stellaris": (StellarisLoop, {"learner_mode": "stellaris"}, ParameterAggregator),
}


def _build(loop, overrides: dict):
    """The loop's policy owner, built as RoundLoop.__init__ builds it."""
    spec = validate(TrainingSpec(env_id="CartPole-v1", preset="fast", **overrides))
    cfg = algo_config(spec)
    obs_space, act_space = env_spaces(spec.env_id)
    model_spec = spec_for_spaces(obs_space, act_space, hidden_sizes=cfg.hidden_sizes, activation=cfg.activation,
                                 obs_norm=cfg.obs_norm, init_log_std=cfg.init_log_std)
    return loop.learner_class(model_spec, cfg, seed=0, device="cpu")


def _methods(protocol) -> dict[str, inspect.Signature]:
    """The protocol's methods (its own and inherited, not typing.Protocol's machinery) and their signatures."""
    out = {}
    for cls in reversed(protocol.__mro__):
        if cls in (object, typing.Protocol, typing.Generic) or not getattr(cls, "_is_protocol", False):
            continue
        for name, member in vars(cls).items():
            if inspect.isfunction(member) and not name.startswith("_"):
                out[name] = inspect.signature(member)
    return out


@pytest.mark.parametrize("mode", LOOPS)
def test_each_loop_declares_the_protocol_its_policy_owner_satisfies(mode):
    loop, overrides, protocol = LOOPS[mode]
    declared = typing.get_type_hints(loop)["learner"]
    assert declared is protocol and PolicyOwner in protocol.__mro__
    learner = _build(loop, overrides)
    assert isinstance(learner, protocol), f"{type(learner).__name__} lacks a member of {protocol.__name__}"
    for name, wanted in _methods(protocol).items():
        have = inspect.signature(getattr(learner, name))
        params = list(wanted.parameters.values())[1:]  # without self
        for p in params:
            assert p.name in have.parameters, f"{type(learner).__name__}.{name} takes no {p.name!r}"
            assert have.parameters[p.name].kind == p.kind, f"{type(learner).__name__}.{name}({p.name}) kind"
        extra = [q for q in have.parameters.values() if q.name not in wanted.parameters
                 and q.default is inspect.Parameter.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)]
        assert not extra, f"{type(learner).__name__}.{name} needs arguments the protocol does not pass: {extra}"


def test_an_owner_missing_a_member_is_refused():
    class NoUpdate:
        policy, kl_coeff, last_data = None, 0.0, None

        def state(self) -> dict:
            return {}

        def load_state(self, state: dict) -> None:
            pass

    assert isinstance(NoUpdate(), PolicyOwner)
    assert not isinstance(NoUpdate(), GradientLearner) and not isinstance(NoUpdate(), ParameterAggregator)
