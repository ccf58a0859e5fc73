"""The training spec against a real local system (Redis, Lambda endpoint, three services).

A property test draws dict specs over every TrainingSpec field (right and wrong
types, out-of-range numbers, odd strings, nested settings, hyperparameters,
env_kwargs) and sends them as the SDK would: the client refuses some itself
(InvalidSpec naming the field), and StartTraining answers the rest with
INVALID_ARGUMENT naming the same field the shared validator names, never
another status. As in test_hostile_rpc.py, a spec the local validator accepts
is sent with an invalid job id, so the property runs no jobs: the server must
then reject the job id, which it could not do if it had refused an earlier
field the client let through. A real CartPole job checks that hidden_sizes,
activation and env_kwargs reach the model, the actors and the evaluation.
"""

from __future__ import annotations

import dataclasses
import math

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nitro import load_policy
from nitro.client import sdk
from nitro.config import PPOConfig
from nitro.spec import InvalidSpec, ScalerSettings, StellarisSettings, TrainingSpec, from_proto, validate
from nitro.v1 import scaler_pb2, scaler_pb2_grpc, training_pb2, training_pb2_grpc
from tests.system import shared_system

pytestmark = pytest.mark.timeout(300)

system = shared_system()

SPEC_FIELDS = {f.name: f for f in dataclasses.fields(TrainingSpec)}
CHEAP = {"env_id": "CartPole-v1", "preset": "fast", "rounds": 1, "steps_per_actor": 32, "eval_episodes": 1,
         "budget_usd": 0.05, "scaler": {"policy": "fixed", "fixed_actors": 1, "i_min": 1, "i_max": 1}}
HYP = dict(deadline=None, derandomize=True, database=None,
           suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                  HealthCheck.data_too_large])


# --- strategies ---------------------------------------------------------------------------------------

WORDS = ["", " ", "CartPole-v1", "Hopper-v5", "ALE/Pong-v5", "NoSuchEnv-v0", "this:Nope-v0", "ppo", "impact",
         "tuned", "fast", "paper", "hopper-ppo", "qbert-impact", "nitro", "fixed", "fixed:2", "fixed:x", "replay",
         "minions", "i_min", "last", "central", "stellaris", "cloud", "machine", "tanh", "relu", "gelu",
         "inverse", "linear", "nitro-actor", "a" * 65, "../../etc/passwd", "\x00", "é", "🙂", "NaN", "1e309"]
INTS = st.one_of(st.sampled_from([0, 1, -1, 2, 8, 1000, 1001, 1024, 1025, 2**31 - 1, 2**31, -2**63, 2**63]),
                 st.integers(-10**6, 10**6))
FLOATS = st.one_of(st.sampled_from([0.0, -0.0, 0.5, 1.0, 1.5, -1.0, 3600.0, 3600.5, 1e-300, 1e308, math.nan,
                                    math.inf, -math.inf]), st.floats())
SCALARS = st.one_of(st.booleans(), INTS, FLOATS, st.sampled_from(WORDS), st.text(max_size=8))
JSONISH = st.recursive(st.one_of(st.none(), SCALARS),
                       lambda inner: st.one_of(st.lists(inner, max_size=3),
                                               st.dictionaries(st.sampled_from(["a", "b", ""]), inner, max_size=2)),
                       max_leaves=6)
WRONG = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(st.sampled_from(WORDS), SCALARS,
                                                                          max_size=2))


def _typed(default) -> st.SearchStrategy:
    """Values of a field's own type, hostile ones included."""
    if isinstance(default, bool):
        return st.booleans()
    if isinstance(default, int):
        return INTS
    if isinstance(default, float):
        return FLOATS
    if isinstance(default, str):
        return st.one_of(st.sampled_from(WORDS), st.text(max_size=12))
    raise AssertionError(default)


@st.composite
def _settings(draw, cls) -> dict:
    """One to three of a settings dataclass's fields, mostly of their own type (sometimes a key it lacks)."""
    names = [f.name for f in dataclasses.fields(cls)] + ["no_such_setting"]
    out = {}
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)):
        own = _typed(getattr(cls(), name)) if name != "no_such_setting" else SCALARS
        out[name] = draw(st.one_of(own, own, own, SCALARS))
    return out


HP_NAMES = [f.name for f in dataclasses.fields(PPOConfig)] + ["replay_capacity", "lrr", ""]
SPECIAL = {
    "scaler": st.one_of(_settings(ScalerSettings), st.sampled_from(WORDS)),
    "stellaris": _settings(StellarisSettings),
    "hyperparameters": st.dictionaries(st.sampled_from(HP_NAMES), st.one_of(FLOATS, INTS, FLOATS, INTS, SCALARS),
                                       max_size=3),
    "hidden_sizes": st.lists(st.one_of(st.sampled_from([1, 16, 64, 1024]), INTS), max_size=9),
    "env_kwargs": st.dictionaries(st.sampled_from(["max_episode_steps", "sutton_barto_reward", "render_mode", "nope",
                                                   "a b", ""]), JSONISH, max_size=3),
}


@st.composite
def dict_specs(draw) -> dict:
    """The cheap valid spec with one to three fields made hostile (a quarter of them of another type), so
    most specs get past the client's type checks and the server's first fields and reach the later checks."""
    spec = dict(CHEAP)
    names = [*SPEC_FIELDS, *SPECIAL, *SPECIAL, "no_such_field"]  # the structured fields drawn more often
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)):
        if name == "no_such_field":
            spec[name] = draw(SCALARS)
            continue
        own = SPECIAL[name] if name in SPECIAL else _typed(SPEC_FIELDS[name].default)
        spec[name] = draw(st.one_of(own, own, own, WRONG))
    return spec


# --- the property --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def learner(system):
    channel = grpc.insecure_channel(system.learner_address)
    yield training_pb2_grpc.TrainingServiceStub(channel), (("authorization", f"Bearer {system.token}"),)
    channel.close()


def _root(field_name: str) -> str:
    return field_name.split(".")[0].split("[")[0]


def _local_verdict(msg) -> InvalidSpec | None:
    try:
        validate(from_proto(msg))
    except InvalidSpec as exc:
        return exc
    return None


@settings(max_examples=400, **HYP)
@given(spec=dict_specs())
def test_every_invalid_spec_is_invalid_argument_naming_the_field(learner, spec):
    stub, md = learner
    try:
        msg = sdk.spec_to_proto(spec)
    except InvalidSpec as exc:  # refused before sending: named like the server would
        assert _root(exc.field) in SPEC_FIELDS or exc.field == "no_such_field", exc
        event(f"client refused {_root(exc.field)}")
        return
    local = _local_verdict(msg)
    if local is None:  # valid: make the server reject it at the job id, so no job runs
        msg.job_id = "not a valid job id!"
    try:
        stub.StartTraining(training_pb2.StartTrainingRequest(spec=msg), timeout=30, metadata=md)
    except grpc.RpcError as err:
        code, details = err.code(), err.details() or ""
    else:
        pytest.fail(f"the server accepted a spec the shared validator rejects ({local}): {msg}")
    assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{code.name}: {details}"
    expected = local.field if local is not None else "job_id"
    event(f"server refused {_root(expected)}" if local is not None else "valid (sent with a bad job id)")
    assert details.startswith(f"{expected}: "), f"expected the field {expected!r} named, got: {details}"


def test_hp_of_a_list_field_is_invalid_argument_not_a_crash(client):
    # Used to raise TypeError inside validation (an UNKNOWN status): the map carries numbers only.
    with pytest.raises(sdk.InvalidArgumentError) as exc:
        client.start_training({"env_id": "CartPole-v1", "hyperparameters": {"hidden_sizes": 64}})
    assert exc.value.details.startswith("hyperparameters.hidden_sizes: ") and "hidden_sizes field" in exc.value.details


@pytest.mark.parametrize("fields,field", [
    ({"activation": "gelu"}, "activation"),
    ({"hidden_sizes": [0]}, "hidden_sizes"),
    ({"env_kwargs": {"nope": 1}}, "env_kwargs"),
])
def test_model_and_env_fields_are_checked_by_the_server(learner, fields, field):
    stub, md = learner
    msg = sdk.spec_to_proto({"env_id": "CartPole-v1", **fields})
    with pytest.raises(grpc.RpcError) as err:
        stub.StartTraining(training_pb2.StartTrainingRequest(spec=msg), timeout=30, metadata=md)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details().startswith(f"{field}: ")


@pytest.mark.parametrize("text", ["[1]", "{", '{"render_mode": "human"}'])
def test_launch_refuses_malformed_env_kwargs(system, text):
    with grpc.insecure_channel(system.components["scaler"].address) as ch:
        with pytest.raises(grpc.RpcError) as err:
            scaler_pb2_grpc.ActorScalerStub(ch).Launch(scaler_pb2.LaunchRequest(
                job_id="kwargs-launch", actors=1, steps_per_actor=8, env_id="CartPole-v1", function_name="nitro-actor",
                deadline_s=10.0, env_kwargs_json=text), timeout=30,
                metadata=(("authorization", f"Bearer {system.token}"),))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("env_kwargs_json: ")


# --- a real job ----------------------------------------------------------------------------------------


def test_model_and_env_fields_reach_the_model_the_actors_and_the_evaluation(client):
    # Every episode is cut at 5 steps (CartPole cannot fall that soon) and, with Sutton and Barto's reward,
    # scores 0 per step: each return is exactly 0.0. Without max_episode_steps episodes would end falling
    # (-1); without the reward kwarg they would score 5.
    kwargs = {"max_episode_steps": 5, "sutton_barto_reward": True}
    status = client.start_training({**CHEAP, "rounds": 2, "steps_per_actor": 40, "eval_episodes": 2, "seed": 5,
                                    "hidden_sizes": [16], "activation": "relu", "env_kwargs": kwargs,
                                    "scaler": {"policy": "fixed", "fixed_actors": 2, "i_min": 1, "i_max": 2}})
    assert list(status.spec.hidden_sizes) == [16] and status.spec.activation == "relu"
    assert from_proto(status.spec).env_kwargs == kwargs
    reports = list(client.watch(status.job_id))
    final = client.get(status.job_id)
    assert final.state_name == "SUCCEEDED", final.message
    assert [r.round for r in reports] == [0, 1]
    for r in reports:
        assert r.actors_completed == 2 and r.train_return == 0.0 and r.eval_return == 0.0, r
    policy = load_policy(final.checkpoint_path)
    assert policy.spec.hidden_sizes == (16,) and policy.spec.activation == "relu"
    assert policy.state["actor.layers.0.weight"].shape == (16, 4)
    assert policy.info["env_kwargs"] == kwargs  # so `nitro eval` builds the same environment


def test_the_spec_and_the_scalers_plan_carry_every_scaler_setting_through_one_conversion():
    """learner_svc.clients.scaler_spec (what every Plan carries) is nitro.spec.scaler_to_proto, as the job's own
    wire spec is: a setting added to ScalerSettings reaches the scaler without a second hand-written copy."""
    import dataclasses

    from learner_svc.clients import scaler_spec
    from nitro.spec import ScalerSettings, TrainingSpec, from_proto, scaler_to_proto, to_proto, validate

    settings = ScalerSettings(policy="noise-replay", i_min=2, i_max=32, fixed_actors=5, decay=0.9, window=7, period=3,
                              actors_by_round="1,2", floor_actors=9, floor_decay=0.5, kappa=2.5, grow_f1=0.3,
                              grow_f2=0.6)
    spec = validate(TrainingSpec(env_id="CartPole-v1", scaler=settings))
    sent = scaler_spec(spec)
    assert sent == scaler_to_proto(spec.scaler) == to_proto(spec).scaler
    for f in dataclasses.fields(ScalerSettings):
        assert getattr(sent, f.name) == getattr(settings, f.name), f.name
    assert from_proto(to_proto(spec)).scaler == spec.scaler
