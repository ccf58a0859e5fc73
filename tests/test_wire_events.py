"""nitro.events: the typed invocation events. Round trips, a clear error naming each bad field, and the producer
(the scaler's Launch) and the consumers (actor_fn's two handlers) agreeing on every field."""

from __future__ import annotations

import dataclasses
import json

import pytest

from nitro.contracts import CREDENTIALS_FIELD, FunctionCredentials, eval_slices, function_credentials, parcel_key
from nitro.data.store import REDIS_MAX_BULK_BYTES
from nitro.errors import ConfigError
from nitro.events import MAX_ENTRY_BYTES_LIMIT, ActorEvent, EvalEvent, LearnerEvent, is_eval_event
from tests.recording_invoker import RecordingInvoker

JOB = "wire-job"
CREDS = function_credentials(b"m" * 32, JOB, "wire-job-r3-a1", "p" * 24)


def actor(**kw) -> ActorEvent:
    return ActorEvent(**{"job_id": JOB, "round": 3, "policy_version": 2, "invocation_id": "wire-job-r3-a1",
                         "credentials": CREDS, "env_id": "CartPole-v1", "num_steps": 64, "seed": 7, **kw})


def learner(**kw) -> LearnerEvent:
    return LearnerEvent(**{"job_id": JOB, "round": 3, "policy_version": 2, "invocation_id": "wire-job-r3-g1",
                           "credentials": CREDS, "payload_ref": parcel_key(JOB, "wire-job-r3-a1"), **kw})


def evaluation(**kw) -> EvalEvent:
    return EvalEvent(**{"job_id": JOB, "round": 3, "policy_version": 2, "invocation_id": "wire-job-r3-e1",
                        "credentials": CREDS, "kind": "eval", "env_id": "CartPole-v1", "episodes": 2, "seed": 9,
                        **kw})


def wire(ev) -> dict:
    """What a function receives: the JSON payload the invoker sends (scaler_svc.invoker)."""
    return json.loads(json.dumps(ev.to_dict()))


@pytest.mark.parametrize("ev", [
    actor(),
    actor(redis_url="redis://h:6379/0", env_kwargs={"frameskip": 4}, compress=True, max_entry_bytes=4096,
          reset_episodes=True, envs_per_actor=2),
    learner(),
    learner(redis_url="redis://h:6379/0"),
    evaluation(),
    evaluation(env_kwargs={"frameskip": 4}),
], ids=["actor", "actor-every-option", "learner", "learner-url", "eval", "eval-kwargs"])
def test_an_event_survives_its_json_round_trip(ev):
    back = type(ev).from_dict(wire(ev))
    assert back == ev and isinstance(back.credentials, FunctionCredentials)


def test_optional_fields_at_their_default_are_left_out_and_come_back_as_the_default():
    d = actor().to_dict()
    assert set(d) == {"job_id", "round", "policy_version", "invocation_id", CREDENTIALS_FIELD, "env_id", "num_steps",
                      "seed"}
    ev = ActorEvent.from_dict({**d, "env_kwargs": None})  # JSON null: no keyword arguments, as before
    assert (ev.envs_per_actor, ev.env_kwargs, ev.compress, ev.reset_episodes) == (1, {}, None, False)


@pytest.mark.parametrize("field,value,allowed", [
    ("job_id", "a b", "1-64 characters"),
    ("round", -1, "non-negative integer"),
    ("round", True, "non-negative integer"),
    ("policy_version", "2", "non-negative integer"),
    ("invocation_id", "", "non-empty string"),
    ("env_id", 5, "non-empty string"),
    ("num_steps", 0, r"\[1, 1000000\]"),
    ("num_steps", 2.5, r"\[1, 1000000\]"),
    ("seed", -3, "non-negative integer"),
    ("env_kwargs", [1], "an object"),
    ("compress", "yes", "true, false or absent"),
    ("max_entry_bytes", "big", "integer in"),
    ("max_entry_bytes", MAX_ENTRY_BYTES_LIMIT + 1, "integer in"),
    ("reset_episodes", "yes", "true or false"),
    ("envs_per_actor", 65, r"\[1, 64\]"),  # at most num_steps (64)
    ("envs_per_actor", True, r"\[1, 64\]"),
    ("redis_url", 6379, "a string"),
])
def test_a_bad_actor_field_is_named_with_what_is_allowed(field, value, allowed):
    with pytest.raises(ConfigError, match=rf"event field '{field}' must be .*{allowed}"):
        ActorEvent.from_dict({**actor().to_dict(), field: value})
    with pytest.raises(ConfigError, match=field):  # the producer's side runs the same checks
        actor(**{field: value})


@pytest.mark.parametrize("field,value,allowed", [
    ("policy_version", -1, "non-negative integer"),
    ("payload_ref", "nitro:other-job:learn:parcel:x", "a key under nitro:wire-job:learn:"),
    ("payload_ref", "", "non-empty string"),
])
def test_a_bad_learner_field_is_named_with_what_is_allowed(field, value, allowed):
    with pytest.raises(ConfigError, match=rf"event field '{field}' must .*{allowed}"):
        LearnerEvent.from_dict({**learner().to_dict(), field: value})


@pytest.mark.parametrize("field,value,allowed", [
    ("kind", "actor", "'eval'"),
    ("episodes", 0, r"\[1, 1000\]"),
    ("episodes", 1001, r"\[1, 1000\]"),
    ("seed", -1, "non-negative integer"),
    ("env_id", "", "non-empty string"),
])
def test_a_bad_eval_field_is_named_with_what_is_allowed(field, value, allowed):
    with pytest.raises(ConfigError, match=rf"event field '{field}' must .*{allowed}"):
        EvalEvent.from_dict({**evaluation().to_dict(), field: value})


def test_only_an_eval_event_is_taken_for_one():
    assert is_eval_event(evaluation().to_dict()) and is_eval_event(wire(evaluation()))
    assert not is_eval_event(actor().to_dict()) and not is_eval_event(learner().to_dict())
    assert not is_eval_event([evaluation().to_dict()])


@pytest.mark.parametrize("episodes,per", [(1, 1), (5, 1), (10, 3), (33, 3), (7, 7)])
def test_eval_slices_run_every_episode_exactly_once(episodes, per):
    slices = eval_slices(episodes, per)
    covered = [start + j for start, n in slices for j in range(n)]
    assert covered == list(range(episodes)) and all(1 <= n <= per for _, n in slices)
    with pytest.raises(ValueError):
        eval_slices(episodes, episodes + 1)


@pytest.mark.parametrize("make", [actor, learner, evaluation], ids=["actor", "learner", "eval"])
def test_missing_unknown_and_non_object_events_are_named(make):
    d = make().to_dict()
    required = [f.name for f in dataclasses.fields(type(make()))
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    for name in required:
        with pytest.raises(ConfigError, match=f"missing required field '{name}'"):
            type(make()).from_dict({k: v for k, v in d.items() if k != name})
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['num_step'\]; allowed: \["):
        type(make()).from_dict({**d, "num_step": 5})  # a misspelt field is refused, not ignored
    with pytest.raises(ConfigError, match="JSON object"):
        type(make()).from_dict([d])


def test_bad_credentials_are_named_and_never_echoed():
    d = actor().to_dict()
    creds = d[CREDENTIALS_FIELD]
    for broken, name in (({**creds, "signing_key": "zz"}, "credentials.signing_key"),
                         ({**creds, "redis_username": "nitro-actor-other"}, "credentials.redis_username"),
                         ("secret", "'credentials'")):
        with pytest.raises(ConfigError, match=name) as err:
            ActorEvent.from_dict({**d, CREDENTIALS_FIELD: broken})
        assert all(s not in str(err.value) for s in (creds["redis_password"], creds["signing_key"], "secret"))
    assert creds["signing_key"] not in repr(actor())


def test_the_events_entry_bound_is_the_stores():
    assert MAX_ENTRY_BYTES_LIMIT == REDIS_MAX_BULK_BYTES


# -- the producer (the scaler's Launch) and the consumers (the handlers) agree -------------------------

class _Context:
    def time_remaining(self):
        return None

    def abort(self, code, details):
        raise AssertionError(details)


# Event fields the scaler never sets, and why: the rest must each be set by some LaunchRequest, so a field added
# to an event and never produced (or produced and never declared) fails the test below.
NOT_PRODUCED = {
    "compress": "the function decides by the observations' dtype; tests set it",
    "max_entry_bytes": "the function's NITRO_MAX_ENTRY_BYTES; tests set it",
}


def launched_events(redis_client, redis_server, *, evals: bool = False):
    """The actor and learner-function events of real Launch calls (every option the request has set); with
    `evals`, the events of an evaluation launch too."""
    from nitro import cost
    from nitro.v1 import scaler_pb2
    from scaler_svc.server import ScalerServicer

    rec = RecordingInvoker()
    svc = ScalerServicer(redis_client, rec, cost.Prices(), redis_server.url, hmac_key=b"k" * 32)
    svc.Launch(scaler_pb2.LaunchRequest(job_id=JOB, round=1, policy_version=0, actors=2, steps_per_actor=64,
                                        env_id="CartPole-v1", function_name="nitro-actor", deadline_s=10.0,
                                        seed=3, reset_episodes=True, envs_per_actor=2,
                                        env_kwargs_json='{"sutton_barto_reward": true}'), _Context())
    actors = list(rec.events)
    svc.Launch(scaler_pb2.LaunchRequest(job_id=JOB, round=1, policy_version=0, actors=1, steps_per_actor=64,
                                        kind="learner", function_name="nitro-learner", deadline_s=10.0,
                                        payload_ref=parcel_key(JOB, "wire-job-r1-a0")), _Context())
    learners = rec.events[len(actors):]
    if not evals:
        return actors, learners
    svc.Launch(scaler_pb2.LaunchRequest(job_id=JOB, round=1, policy_version=0, kind="eval", env_id="CartPole-v1",
                                        function_name="nitro-actor", deadline_s=10.0, seed=40,
                                        env_kwargs_json='{"sutton_barto_reward": true}',
                                        evaluation=scaler_pb2.EvalLaunch(episodes=5, episodes_per_function=2)),
               _Context())
    return actors, learners, rec.events[len(actors) + len(learners):]


def test_an_eval_launch_sends_each_function_its_slice_of_the_episodes(redis_client, redis_server):
    _, _, evals = launched_events(redis_client, redis_server, evals=True)
    assert all(EvalEvent.from_dict(e).to_dict() == e for e in evals)
    assert set().union(*evals) == {f.name for f in dataclasses.fields(EvalEvent)}
    # Episode j of the evaluation runs on seed 40 + j, as the learner's own evaluation would run it.
    assert sorted((e["seed"], e["episodes"]) for e in evals) == [(40, 2), (42, 2), (44, 1)]
    assert {e["invocation_id"] for e in evals} == {f"{JOB}-r1-e{i}" for i in range(3)}


@pytest.mark.parametrize("evaluation,message", [
    (None, "evaluation: kind 'eval' needs episodes in"),
    ({"episodes": 3, "episodes_per_function": 4}, "episodes_per_function in \\[1, episodes\\], got 3 and 4"),
    ({"episodes": 1001, "episodes_per_function": 1}, "episodes in \\[1, 1000\\]"),
])
def test_a_bad_eval_launch_is_refused_naming_the_field(redis_client, redis_server, evaluation, message):
    from nitro import cost
    from nitro.v1 import scaler_pb2
    from scaler_svc.server import ScalerServicer

    svc = ScalerServicer(redis_client, RecordingInvoker(), cost.Prices(), redis_server.url, hmac_key=b"k" * 32)
    req = scaler_pb2.LaunchRequest(job_id=JOB, round=1, policy_version=0, kind="eval", env_id="CartPole-v1",
                                   function_name="nitro-actor", deadline_s=10.0)
    if evaluation is not None:
        req.evaluation.CopyFrom(scaler_pb2.EvalLaunch(**evaluation))
    with pytest.raises(AssertionError, match=message):
        svc.Launch(req, _Context())


def test_every_field_the_scaler_sends_is_one_the_handlers_read_and_back(redis_client, redis_server):
    actors, learners = launched_events(redis_client, redis_server)
    assert len(actors) == 2 and len(learners) == 1
    for cls, events in ((ActorEvent, actors), (LearnerEvent, learners)):
        for e in events:
            assert cls.from_dict(e).to_dict() == e  # nothing unknown, nothing lost
    produced = set().union(*actors)
    declared = {f.name for f in dataclasses.fields(ActorEvent)}
    assert produced == declared - set(NOT_PRODUCED), "an event field only one side knows"
    assert set(learners[0]) == {f.name for f in dataclasses.fields(LearnerEvent)}
    assert [e["seed"] for e in actors] == [3, 4] and {e["envs_per_actor"] for e in actors} == {2}


@pytest.mark.slow  # the learner handler imports torch
def test_the_handlers_accept_the_scalers_events(redis_client, redis_server):
    """The real handlers get past the event (to what a job with nothing published yet lacks): the actor to its
    policy, the learner function to its parcel."""
    from actor_fn import handler, learner_handler
    from nitro.data.store import PolicyNotFoundError

    actors, learners, evals = launched_events(redis_client, redis_server, evals=True)
    with pytest.raises(PolicyNotFoundError):
        handler.handler(actors[0])
    with pytest.raises(PolicyNotFoundError):  # the actor function evaluates too
        handler.handler(evals[0])
    with pytest.raises(learner_handler.ParcelNotFoundError):
        learner_handler.handler(learners[0])
    with pytest.raises(ConfigError, match="unknown field"):
        handler.handler({**actors[0], "payload_ref": learners[0]["payload_ref"]})
