"""The spec's one home for its conversions (nitro.spec): a job's spec survives the whole wire, CLI flags -> dict ->
training_pb2.TrainingSpec -> TrainingSpec -> proto -> TrainingSpec -> common_pb2.ScalerSpec -> the scaler's policy,
for PPO, IMPACT and Stellaris, and the defaults the scaler plans by are the spec's (IMPACT's fixed count: 16)."""

from __future__ import annotations

import dataclasses

import pytest

from learner_svc.clients import scaler_spec
from nitro import contracts as c
from nitro.client import cli, sdk
from nitro.client.commands import train
from nitro.spec import (
    InvalidSpec,
    ScalerSettings,
    dict_to_proto,
    from_proto,
    scaler_from_proto,
    scaler_to_proto,
    to_proto,
    validate,
)
from nitro.v1 import common_pb2
from scaler_svc.server import policy_params

JOBS = {
    "ppo": ["--algo", "ppo", "--rounds", "7", "--steps-per-actor", "128", "--scaler", "hydrozoa", "--period", "3",
            "--i-min", "2", "--i-max", "12"],
    "impact": ["--algo", "impact", "--rounds", "9", "--budget", "2.5", "--hp", "lr=0.0007"],  # names no scaler
    "impact-fixed12": ["--algo", "impact", "--scaler", "fixed:12"],
    "stellaris": ["--algo", "ppo", "--learner-mode", "stellaris", "--learner-memory", "3008", "--max-learners", "4",
                  "--staleness-bound-start", "6", "--staleness-bound-end", "2", "--scaler", "grow",
                  "--grow-f1", "0.25", "--grow-f2", "0.5"],
}


def cli_dict(flags: list[str]) -> dict:
    """The partial spec `nitro train` builds from its flags (what it sends through the SDK)."""
    return train.build_spec(cli.build_parser().parse_args(["train", "--env", "CartPole-v1", *flags]))


@pytest.mark.parametrize("job", list(JOBS))
def test_a_spec_survives_the_wire_unchanged(job):
    given = cli_dict(JOBS[job])
    first = validate(from_proto(sdk.spec_to_proto(given)))  # what the learner starts the job with
    again = validate(from_proto(to_proto(first)))  # a checkpoint's or a resumed job's spec, re-read
    assert again == first
    sent = scaler_spec(first)  # what the learner asks the scaler to plan by, every round
    assert sent == to_proto(first).scaler
    assert scaler_from_proto(sent) == first.scaler  # the scaler reads exactly the spec's settings
    name, params = policy_params(sent, first.algo)
    assert name == first.scaler.policy
    # What the flags said arrives as said.
    for key in ("algo", "rounds", "steps_per_actor", "budget_usd", "learner_mode"):
        if key in given:
            assert getattr(first, key) == given[key], key
    if isinstance(given.get("scaler"), dict):
        for key, value in given["scaler"].items():
            if key != "policy":
                assert getattr(first.scaler, key) == value, key
    for key, value in (given.get("stellaris") or {}).items():
        assert getattr(first.stellaris, key) == value, key
    expected = {"ppo": ("hydrozoa", {"every": 3}), "impact": ("fixed", {"actors": 16}),
                "impact-fixed12": ("fixed", {"actors": 12}),
                "stellaris": ("grow", {"f1": 0.25, "f2": 0.5})}[job]
    assert (name, params) == expected
    if job == "stellaris":
        assert (first.learner_mode, first.stellaris.learner_memory_mb, first.stellaris.bound_end) == \
            ("stellaris", 3008, 2)


def test_the_sdk_sends_a_dict_through_the_specs_conversion():
    given = {"env_id": "CartPole-v1", "algo": "impact", "scaler": {"policy": "noise", "kappa": 2.0},
             "stellaris": {}, "hyperparameters": {"lr": 1e-3}, "hidden_sizes": [32, 32], "env_kwargs": {"a": 1}}
    assert sdk.spec_to_proto(given) == dict_to_proto(given)
    msg = dict_to_proto(given)
    assert msg.HasField("stellaris") and not msg.HasField("rounds")  # named: set; not named: the server's default
    assert (msg.scaler.kappa, list(msg.hidden_sizes), msg.env_kwargs_json) == (2.0, [32, 32], '{"a":1}')
    for bad, field in (({"env_id": "CartPole-v1", "round": 3}, "round"),
                       ({"env_id": "CartPole-v1", "scaler": {"kapa": 2}}, "scaler.kapa"),
                       ({"env_id": "CartPole-v1", "scaler": 5}, "scaler"),
                       ({"env_id": "CartPole-v1", "hidden_sizes": [32, "x"]}, "hidden_sizes"),
                       ({"env_id": "CartPole-v1", "hyperparameters": {"lr": "fast"}}, "hyperparameters.lr"),
                       ({"env_id": "CartPole-v1", "rounds": "many"}, "rounds"),
                       ({"algo": "ppo"}, "env_id")):
        with pytest.raises(InvalidSpec) as err:
            sdk.spec_to_proto(bad)
        assert err.value.field == field


def test_the_scalers_defaults_are_the_specs():
    """A ScalerSpec with nothing set is read as ScalerSettings' defaults (nitro.contracts'), once, in nitro.spec;
    only "fixed"'s count depends on the job's algorithm."""
    empty = scaler_from_proto(common_pb2.ScalerSpec())
    assert empty == ScalerSettings()
    assert (empty.policy, empty.i_min, empty.i_max) == (c.DEFAULT_SCALING_POLICY, c.DEFAULT_I_MIN, c.DEFAULT_I_MAX)
    for algo, count in c.FIXED_ACTORS_BY_ALGO.items():
        assert empty.fixed_count(algo) == count
        assert policy_params(common_pb2.ScalerSpec(), algo) == ("fixed", {"actors": count})
    # Every field a ScalerSettings has round-trips, including values that are not the defaults.
    odd = ScalerSettings(policy="nitro-floor", i_min=3, i_max=9, fixed_actors=5, decay=0.5, window=2, period=4,
                         floor_actors=7, floor_decay=0.25, kappa=3.0, grow_f1=0.0, grow_f2=0.125)
    assert scaler_from_proto(scaler_to_proto(odd)) == odd
    assert {f.name for f in dataclasses.fields(ScalerSettings)} == set(common_pb2.ScalerSpec.DESCRIPTOR.fields_by_name)
    assert scaler_from_proto(common_pb2.ScalerSpec(policy="fixed:24")).fixed_actors == 24
    with pytest.raises(InvalidSpec, match="scaler.policy"):
        scaler_from_proto(common_pb2.ScalerSpec(policy="nitro:24"))


def test_impacts_default_count_reaches_a_real_plan(redis_client):
    """The scaler service plans IMPACT's 16 actors for an IMPACT job that names no scaler (not PPO's 8), whether
    the learner sends the validated count or a direct caller sends none."""
    from nitro import cost
    from nitro.v1 import scaler_pb2
    from scaler_svc.server import ScalerServicer

    class Context:
        def abort(self, code, details):
            raise AssertionError(details)

    svc = ScalerServicer(redis_client, None, cost.Prices(), "redis://127.0.0.1:1/0", hmac_key=b"k" * 32)
    spec = validate(from_proto(sdk.spec_to_proto(cli_dict(["--algo", "impact"]))))
    for job, scaler in (("plan-learner", scaler_spec(spec)), ("plan-direct", common_pb2.ScalerSpec())):
        plan = svc.Plan(scaler_pb2.PlanRequest(job_id=job, round=0, budget_usd=10.0, scaler=scaler, algo="impact",
                                               steps_per_actor=spec.steps_per_actor), Context())
        assert plan.actors == 16, (job, plan.reason)
