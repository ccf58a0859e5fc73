"""Issue 41: one job's functions cannot reach another job, and an actor can sign only for its own invocation.

Everything here is real but in one process: a redis-server with nitro's ACL users, the scaler's servicer (its
Launch creates the job's Redis user and puts each invocation's credentials in its event), the actor handler
(called in-process by a stand-in invoker, with exactly the event the scaler built) and the on-policy learner loop,
whose launches go through that scaler. The attacker holds only what one invocation's event holds, as in the
probe: its job's Redis user and password, its own signing key, its job's read key, and nitro's actor code.
"""

from __future__ import annotations

import numpy as np
import pytest
import redis

from actor_fn.runtime import credentials, redis_url
from learner_svc.clients import LearnerDeps
from learner_svc.jobs import Job
from learner_svc.onpolicy import OnPolicyLoop
from nitro import cost
from nitro.contracts import (
    actor_user,
    invocation_id,
    job_read_key,
    latest_policy_key,
    parcel_key,
    policy_key,
    scaler_state_key,
    stream_key,
    update_stream_key,
)
from nitro.data import redis_acl
from nitro.data.redis_client import connect
from nitro.data.store import PolicyStore, TrajectoryWriter
from nitro.local.redis_server import SCALER_USER, LocalRedis, nitro_users
from nitro.policy.envs import env_spaces
from nitro.policy.inference import PolicyRunner
from nitro.policy.model_spec import blob_to_doc
from nitro.policy.models import Policy, policy_to_blob, spec_for_spaces
from nitro.policy.rollout import make_sampler
from nitro.rpc import metrics
from nitro.spec import ScalerSettings, TrainingSpec, validate
from nitro.v1 import scaler_pb2
from scaler_svc.actor_users import PASSWORD_FIELD, ActorUsers
from scaler_svc.invoker import InvocationOutcome
from scaler_svc.server import ScalerServicer
from tests.credentials import signer

MASTER = bytes(range(32))
SERVICE_PW, SCALER_PW = "svc-" + "s" * 28, "scl-" + "c" * 28
STEPS = 64


@pytest.fixture(scope="module")
def server():
    s = LocalRedis(users=nitro_users(SERVICE_PW, SCALER_PW)).start()
    yield s
    s.close()


@pytest.fixture
def service(server):
    c = connect(server.url)
    for k in c.scan_iter("nitro:*"):
        c.delete(k)
    yield c
    c.close()


class _Context:
    def time_remaining(self):  # no deadline, as a call without one
        return None

    def abort(self, code, details):
        raise AssertionError(f"{code}: {details}")


class InProcessActors:
    """An invoker that runs the real actor handler in this process with the event the scaler built."""

    def __init__(self, handler):
        self.handler, self.events = handler, []

    def invoke_all(self, function_name, invocations, deadline_s, on_done=None):
        outs = []
        for inv in invocations:
            self.events.append(inv.event)
            try:
                self.handler(inv.event, None)
                out = InvocationOutcome(inv.invocation_id, ok=True, attempts=1, requests=1, billed_ms=1)
            except Exception as exc:  # noqa: BLE001 - reported like a function error
                out = InvocationOutcome(inv.invocation_id, ok=False, attempts=1, requests=1, error_type=type(exc).__name__,
                                        error_message=str(exc))
            on_done(out)
            outs.append(out)
        return outs, 0.0


class ScalerStub:
    """The learner's ActorScalerStub, calling the servicer in this process."""

    def __init__(self, servicer):
        self.servicer = servicer

    def Launch(self, request, timeout=None, metadata=None):  # noqa: N802 - the gRPC method's name
        return self.servicer.Launch(request, _Context())

    def EndJob(self, request, timeout=None, metadata=None):  # noqa: N802
        return self.servicer.EndJob(request, _Context())


@pytest.fixture
def scaler(server, fresh_handler):
    client = connect(server.url_for(SCALER_USER))
    actors = InProcessActors(fresh_handler)
    svc = ScalerServicer(client, actors, cost.Prices(), server.url_without_password, hmac_key=MASTER)
    yield svc, actors
    for job in redis_acl.actor_user_jobs(client):
        redis_acl.delete_actor_user(client, job)
    client.close()


def publish(service, job_id: str, version: int = 0) -> None:
    """A policy version of the job, signed with its read key (what its learner publishes)."""
    policy = Policy(spec_for_spaces(*env_spaces("CartPole-v1")))
    PolicyStore(service, job_id).put(version, policy_to_blob(policy, version, job_read_key(MASTER, job_id)))


def launch(svc, job_id: str, k: int, slots=(0, 1), version: int = 0) -> None:
    svc.Launch(scaler_pb2.LaunchRequest(job_id=job_id, round=k, policy_version=version, actors=len(slots),
                                        slots=list(slots), steps_per_actor=STEPS, env_id="CartPole-v1", seed=k,
                                        function_name="nitro-actor", deadline_s=60.0), _Context())


def event_of(actors: InProcessActors, inv: str) -> dict:
    return next(e for e in actors.events if e["invocation_id"] == inv)


def as_function(event: dict) -> redis.Redis:
    """A Redis connection with what the invocation holds (its job's user and password), as the handler makes it."""
    return connect(redis_url(event, credentials(event)), retries=0)


def loop_of(service, tmp_path, job_id: str, svc) -> OnPolicyLoop:
    spec = validate(TrainingSpec(env_id="CartPole-v1", preset="fast", job_id=job_id, steps_per_actor=STEPS,
                                 rounds=8, scaler=ScalerSettings(policy="fixed", fixed_actors=2, i_min=1, i_max=2)))
    return OnPolicyLoop(Job(spec), LearnerDeps(redis=service, hmac_key=MASTER, detector=None, scaler=ScalerStub(svc),
                                               data_dir=str(tmp_path)))


def run_round(loop: OnPolicyLoop, k: int):
    """Round k's sampling as the job's learner runs it: publish version k, launch through the scaler, collect."""
    loop.version = k
    loop.publish()
    loop.launched = loop.launch_round(k, 2)
    return loop.sample_round(k).stats


def forge(event: dict, k: int, slot: int, returns: float = 77777.0) -> dict:
    """What the probe did: sample with the job's newest policy and claim round k's `slot`, with returns set."""
    client, creds = as_function(event), credentials(event)
    doc = blob_to_doc(PolicyStore(client, event["job_id"]).get(k), creds.read_key_bytes)
    sampler = make_sampler("CartPole-v1", 7, {}, 1)
    batch = sampler.sample(PolicyRunner.from_doc(doc), STEPS, np.random.default_rng(slot))
    sampler.close()
    batch.update(episode_returns=[returns], policy_version=k, invocation_id=invocation_id(event["job_id"], k, slot))
    return batch


# -- item 1: per-job Redis identity -----------------------------------------------------------------------

def test_job_a_credentials_cannot_touch_job_b(service, scaler):
    svc, actors = scaler
    for job in ("job-a", "job-b"):
        publish(service, job)
        launch(svc, job, 0)
    a = as_function(event_of(actors, "job-a-r0-a0"))
    a.xadd(stream_key("job-a"), {b"x": b"1"})  # its own job: allowed
    assert a.get(policy_key("job-a", 0)) is not None
    for attempt in (lambda: a.xadd(stream_key("job-b"), {b"x": b"1"}), lambda: a.get(policy_key("job-b", 0)),
                    lambda: a.get(latest_policy_key("job-b")), lambda: a.get(parcel_key("job-b", "job-b-r0-g0")),
                    lambda: a.xadd(update_stream_key("job-b"), {b"x": b"1"}),
                    lambda: a.get(scaler_state_key("job-a")),  # its own job's password is not readable either
                    lambda: a.execute_command("ACL", "SETUSER", "evil", "on", ">x", "~*", "+@all")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()
    assert service.xlen(stream_key("job-b")) == 2  # only job B's own actors' batches
    # Each job has its own password: A's does not log in as B.
    b_creds = credentials(event_of(actors, "job-b-r0-a0"))
    assert b_creds.redis_password != credentials(event_of(actors, "job-a-r0-a0")).redis_password
    with pytest.raises(redis.exceptions.AuthenticationError):
        connect(f"redis://nitro-actor-job-b:{credentials(event_of(actors, 'job-a-r0-a0')).redis_password}"
                f"@127.0.0.1:{service.connection_pool.connection_kwargs['port']}/0", retries=0).ping()


def test_a_jobs_user_is_deleted_when_it_ends_and_swept_when_its_end_was_missed(server, service, scaler):
    svc, actors = scaler
    launch(svc, "ends", 0, slots=(0,))
    launch(svc, "missed", 0, slots=(0,))
    launch(svc, "runs", 0, slots=(0,))
    ending = as_function(event_of(actors, "ends-r0-a0"))
    assert ending.ping()
    assert svc.EndJob(scaler_pb2.EndJobRequest(job_id="ends"), _Context()).user_deleted
    with pytest.raises(redis.exceptions.ConnectionError):  # Redis closed its connection; it cannot log in again
        ending.ping()
    assert not svc.EndJob(scaler_pb2.EndJobRequest(job_id="ends"), _Context()).user_deleted  # idempotent
    # A job that ended while no scaler heard of it: its state is gone (expired), its user is not.
    service.hdel(scaler_state_key("missed"), PASSWORD_FIELD)
    users = ActorUsers(connect(server.url_for(SCALER_USER)))
    assert users.sweep() == ["missed"]
    assert redis_acl.actor_user_jobs(users.redis) == ["runs"]
    assert as_function(event_of(actors, "runs-r0-a0")).ping()
    # A resume launches again: a new user with a new password.
    launch(svc, "ends", 1, slots=(0,))
    assert credentials(event_of(actors, "ends-r1-a0")).redis_password != credentials(
        event_of(actors, "ends-r0-a0")).redis_password
    assert as_function(event_of(actors, "ends-r1-a0")).ping()


def test_a_restarted_redis_gets_the_jobs_user_back_at_the_next_launch(tmp_path, fresh_handler):
    with LocalRedis(data_dir=tmp_path, users=nitro_users(SERVICE_PW, SCALER_PW), appendonly=True) as s:
        actors = InProcessActors(fresh_handler)
        svc = ScalerServicer(connect(s.url_for(SCALER_USER)), actors, cost.Prices(), s.url_without_password,
                             hmac_key=MASTER)
        PolicyStore(connect(s.url), "rs").put(0, b"x")
        launch(svc, "rs", 0, slots=(0,))  # fails to load the policy "x"; the user and its event exist
        s.restart()  # ACL users live in memory: the job's is gone, its password is still in the job's state
        with pytest.raises(redis.exceptions.AuthenticationError):
            as_function(actors.events[0]).ping()
        launch(svc, "rs", 1, slots=(0,))
        assert credentials(actors.events[1]).redis_password == credentials(actors.events[0]).redis_password
        assert as_function(actors.events[1]).ping()


def test_a_scaler_that_may_not_create_users_refuses_to_launch_and_says_why(server, service, fresh_handler):
    class Refused(Exception):
        pass

    class Context:
        def time_remaining(self):  # no deadline, as a call without one
            return None

        def abort(self, code, details):
            raise Refused(code, details)

    actors = InProcessActors(fresh_handler)
    svc = ScalerServicer(service, actors, cost.Prices(), server.url_without_password, hmac_key=MASTER)  # nitro-service
    with pytest.raises(Refused) as err:
        svc.Launch(scaler_pb2.LaunchRequest(job_id="no-acl", round=0, policy_version=0, actors=1, steps_per_actor=8,
                                            env_id="CartPole-v1", function_name="nitro-actor", deadline_s=5.0),
                   Context())
    assert err.value.args[0].name == "FAILED_PRECONDITION" and "nitro-scaler" in err.value.args[1]
    assert actors.events == []  # nothing was invoked without the job's user


def test_the_scaler_user_manages_job_users_and_nothing_more(server):
    scaler_client = connect(server.url_for(SCALER_USER), retries=0)
    service_client = connect(server.url, retries=0)
    redis_acl.set_actor_user(scaler_client, "mgd", "p" * 20)
    assert "mgd" in redis_acl.actor_user_jobs(scaler_client)
    for refused in (lambda c: c.acl_list(), lambda c: c.acl_getuser(actor_user("mgd")), lambda c: c.flushall(),
                    lambda c: c.execute_command("ACL", "SAVE"), lambda c: c.config_set("dir", "/tmp"),
                    lambda c: c.get("outside:nitro")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            refused(scaler_client)
    with pytest.raises(redis.exceptions.NoPermissionError):  # the learner and detector cannot manage users
        redis_acl.set_actor_user(service_client, "mgd", "q" * 20)
    assert redis_acl.delete_actor_user(scaler_client, "mgd")


# -- items 2 and 3: per-invocation keys; what B's learner does with forged, foreign and replayed batches ---

def test_the_probes_attack_is_rejected_and_reported(service, scaler, tmp_path):
    """B's round-2 actor a0, holding only its event, waits for B's version 3 and pushes batches sampled with it as
    round 3's slots a0 and a1, returns 77777: B's round 3 rejects both (counted: report and metric), trains on its
    genuine batches, and counts none of them as duplicates."""
    svc, actors = scaler
    loop = loop_of(service, tmp_path, "probe-b", svc)
    for k in (0, 1, 2):
        rnd = run_round(loop, k)
        assert rnd.rejected == 0 and len(rnd.got.batches) == 2
        loop.reader.ack(rnd.got.entries)
    attacker = event_of(actors, "probe-b-r2-a0")
    loop.version = 3
    loop.publish()  # version 3: the moment the probe struck
    writer = TrajectoryWriter(as_function(attacker), "probe-b", credentials(attacker).signing_key_bytes)
    for slot in (0, 1):
        writer.append_batch(invocation_id=invocation_id("probe-b", 3, slot), round=3, policy_version=3,
                            batch=forge(attacker, 3, slot))
    before = metrics.REJECTED_PAYLOADS.labels("bad_signature")._value.get()
    rnd = run_round(loop, 3)
    assert rnd.rejected == 2 and rnd.duplicates == 0 and rnd.got.duplicates == 0
    assert rnd.got.completed == 2 and len(rnd.got.batches) == 2
    assert all(77777.0 not in b["episode_returns"] for b in rnd.got.batches)
    assert metrics.REJECTED_PAYLOADS.labels("bad_signature")._value.get() - before == 2
    assert loop.reader.rejected == {"bad_signature": 2}
    assert "rejected 2 stream entries (bad_signature 2): not trained on (docs/security.md)" in rnd.got.notes


def test_a_batch_signed_with_another_jobs_or_invocations_key_is_rejected_with_a_counted_reason(service, scaler,
                                                                                              tmp_path):
    svc, actors = scaler
    loop = loop_of(service, tmp_path, "victim", svc)
    run_round(loop, 0)
    launch(svc, "other", 0)
    # As if the other job's actor could write here: its own key, claiming the victim's next slots...
    other = credentials(event_of(actors, "other-r0-a0")).signing_key_bytes
    sibling = credentials(event_of(actors, "victim-r0-a1")).signing_key_bytes  # ...and the victim's own a1's key
    batch = {"rewards": np.zeros(4, np.float32), "episode_returns": [77777.0]}
    for key, slot in ((other, 0), (sibling, 0), (other, 1)):
        TrajectoryWriter(service, "victim", key).append_batch(invocation_id=invocation_id("victim", 1, slot), round=1,
                                                              policy_version=1, batch=batch)
    # ...and under its own id: not an invocation of this job at all
    TrajectoryWriter(service, "victim", other).append_batch(invocation_id="other-r1-a0", round=1, policy_version=1,
                                                            batch=batch)
    # the key of an invocation of this job that is not an actor's (a Stellaris learner function's)
    learner_inv = invocation_id("victim", 1, 0, kind="learner")
    TrajectoryWriter(service, "victim", signer(MASTER, "victim")).append_batch(invocation_id=learner_inv, round=1,
                                                                              policy_version=1, batch=batch)
    rnd = run_round(loop, 1)
    assert loop.reader.rejected == {"bad_signature": 4, "foreign_invocation": 1} and rnd.rejected == 5
    assert rnd.got.completed == 2 and rnd.duplicates == 0
    assert all(77777.0 not in b["episode_returns"] for b in rnd.got.batches)


def test_a_batch_replayed_from_an_earlier_round_is_dropped(service, scaler, tmp_path):
    svc, _ = scaler
    loop = loop_of(service, tmp_path, "replay", svc)
    run_round(loop, 0)
    rnd = run_round(loop, 1)
    genuine = [f for _, f in service.xrange(stream_key("replay")) if f[b"round"] == b"1"]  # as round 1's were sent
    assert len(genuine) == 2
    loop.reader.ack(rnd.got.entries)
    loop.reader.flush()
    for fields in genuine:
        service.xadd(stream_key("replay"), fields)  # replayed as they were
        relabelled = {**fields, b"round": b"2", b"version": b"2",
                      b"inv": fields[b"inv"].replace(b"-r1-", b"-r2-")}  # claiming round 2's slot
        service.xadd(stream_key("replay"), relabelled)
    rnd = run_round(loop, 2)
    assert rnd.duplicates == 2 and rnd.rejected == 2 and loop.reader.rejected == {"bad_signature": 2}
    assert rnd.got.completed == 2 and all(e.round == 2 for e in rnd.got.entries)
