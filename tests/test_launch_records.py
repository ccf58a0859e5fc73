"""Issue 41, item 6: an idempotent Launch and the invocation records a resumed round reads.

Every invocation a Launch starts is recorded in its round's hash (nitro.launches): running, under the Launch
call's liveness lease, then done with its result and bill. A Launch retried with the same ids answers from the
record, waiting while the first call still runs them, and invokes and bills nothing again; an invocation whose
Launch died before it returned comes back lost. A resumed learner reads the same records: it waits only while a
live Launch runs its predecessor's waves, and replaces at once the slots whose invocations failed.

The rules are pure functions; the records run on a real Redis, a real gRPC scaler and the real local Lambda
endpoint. The resumed learner's round is timed end to end in tests/test_cli_truth.py."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest

from learner_svc.clients import LearnerDeps, Services
from learner_svc.constants import LOST_BATCH_GRACE_S, TAKEOVER_POLL_S
from learner_svc.onpolicy import TakenOver, takeover_wait_end
from nitro import cost, launches
from nitro.contracts import launch_owner_key, launches_key, scaler_state_key
from nitro.launches import DONE, LOST_ERROR, InvocationRecord, RecordError, RoundStatus, round_status
from nitro.local.lambda_endpoint import FunctionConfig, LocalLambda
from nitro.v1 import scaler_pb2, scaler_pb2_grpc
from scaler_svc.invoker import Invoker, lambda_client
from scaler_svc.leases import LaunchLeases
from scaler_svc.server import ScalerServicer

GRACE = LOST_BATCH_GRACE_S


# --- the wait rule: pure -----------------------------------------------------------------------------


def test_a_running_wave_is_waited_for_until_its_own_deadline():
    assert takeover_wait_end(started=1000.0, launched_at=990.0, deadline_s=120.0, stopped_at=None) == 1110.0
    # Launch time unknown: the deadline counts from the takeover.
    assert takeover_wait_end(started=1000.0, launched_at=None, deadline_s=120.0, stopped_at=None) == 1120.0
    # Past its deadline already: still the grace, to read what is in the stream.
    assert takeover_wait_end(started=1000.0, launched_at=800.0, deadline_s=120.0, stopped_at=None) == 1000.0 + GRACE


def test_a_wave_nobody_runs_gets_only_the_grace():
    assert takeover_wait_end(started=1000.0, launched_at=990.0, deadline_s=120.0, stopped_at=1000.0) == 1000.0 + GRACE


def test_a_wave_that_stops_running_gets_the_grace_from_then_but_never_past_its_deadline():
    assert takeover_wait_end(started=1000.0, launched_at=990.0, deadline_s=120.0, stopped_at=1030.0) == 1030.0 + GRACE
    assert takeover_wait_end(started=1000.0, launched_at=990.0, deadline_s=120.0, stopped_at=1108.0) == 1110.0


def test_a_takeover_reads_the_records_at_most_every_poll_period_and_knows_which_slots_failed():
    answers = [RoundStatus(running=True, failed=frozenset()), RoundStatus(running=False, failed=frozenset({1}))]
    asked = []

    def status():
        asked.append(time.time())
        return answers[min(len(asked) - 1, 1)]

    taken = TakenOver(count=1, launched_at=time.time(), deadline_s=120.0, slot_of={}, status=status)
    alive_until = taken.deadline() - time.perf_counter()
    assert 119.0 < alive_until <= 120.0 and taken.stopped_at is None
    assert not taken.all_failed({1}), "a slot is not given up on while its wave runs"
    assert taken.deadline() - time.perf_counter() > 119.0 and len(asked) == 1  # not asked again yet
    taken.checked_at -= TAKEOVER_POLL_S  # a poll period later
    assert taken.deadline() - time.perf_counter() == pytest.approx(GRACE, abs=0.5) and len(asked) == 2
    assert taken.stopped_at is not None
    assert taken.all_failed({1}) and not taken.all_failed({0, 1}), "slot 0 may still deliver within the grace"


# --- the record: pure ----------------------------------------------------------------------------------


def done(ok: bool, owner="a" * 16, error_type="", fp="f") -> InvocationRecord:
    return InvocationRecord(DONE, fp, owner, {"ok": ok, "error_type": error_type})


def test_a_record_survives_encoding_and_anything_else_is_refused():
    r = InvocationRecord(DONE, "f", "a" * 16, {"invocation_id": "j-r0-a1", "ok": True, "attempts": 2}, usd=0.5,
                         cloud_usd=0.25, cloud_seconds=1.5)
    assert InvocationRecord.decode(r.encode()) == r
    for junk in (b"", b"{}", b"[1]", b'{"state": "maybe", "fingerprint": "f", "owner": "o"}', b"\xff"):
        with pytest.raises(RecordError):
            InvocationRecord.decode(junk)
    assert launches.decode_all({b"x": r.encode(), b"y": b"junk", b"z": None}) == {"x": r}


def test_the_fingerprint_tells_requests_apart_and_ignores_key_order():
    assert launches.fingerprint({"a": 1, "b": "x"}) == launches.fingerprint({"b": "x", "a": 1})
    assert launches.fingerprint({"a": 1}) != launches.fingerprint({"a": 2})


def test_round_status_runs_only_under_a_live_owner_and_fails_a_slot_only_when_every_invocation_failed():
    live, dead = "1" * 16, "2" * 16
    slot_of = {"r-a0": 0, "r-a1": 1, "r-a2": 2, "r-a1-x1": 1, "r-a3": 3}
    records = {
        "r-a0": done(False),  # failed, never replaced
        "r-a1": done(False), "r-a1-x1": launches.running("f", live),  # failed, its replacement runs
        "r-a2": launches.running("f", dead),  # its Launch died: unknown, not failed
        "r-a3": done(True),
        "other-job": done(False),  # not one of these waves'
    }
    st = round_status(records, slot_of, live_owners=[live])
    assert st == RoundStatus(running=True, failed=frozenset({0}))
    assert round_status(records, slot_of, live_owners=[]).running is False
    lost = launches.lost(records["r-a2"], "r-a2")
    assert lost.done and not lost.failed and lost.result["error_type"] == LOST_ERROR
    assert round_status({"r-a0": lost}, slot_of, []).failed == frozenset()


# --- the lease on a real Redis -------------------------------------------------------------------------


def test_a_lease_held_twice_lives_until_its_last_holder_leaves(redis_client):
    leases = LaunchLeases(redis_client, ttl_s=0.6, refresh_s=0.1)
    key = launch_owner_key("j", "0" * 16)
    with leases.hold(key):
        with leases.hold(key):
            assert redis_client.exists(key)
        time.sleep(1.0)  # past the TTL: refreshed
        assert redis_client.exists(key)
    assert not redis_client.exists(key)
    time.sleep(0.3)  # the refresher does not bring it back
    assert not redis_client.exists(key)


# --- the scaler's Launch ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def endpoint():
    with LocalLambda([FunctionConfig("slow-actor", "nitro.tools.lambda_handlers.slow_actor"),
                      FunctionConfig("crashing-actor", "nitro.tools.lambda_handlers.crash")]) as ll:
        yield ll


@pytest.fixture
def scaler(redis_client, endpoint):
    client = lambda_client(endpoint.endpoint_url, "us-east-1", max_connections=8, read_timeout=30)
    servicer = ScalerServicer(redis_client, Invoker(client, max_attempts=1), cost.Prices(), "redis://127.0.0.1:1/0",
                              leases=LaunchLeases(redis_client, ttl_s=0.6, refresh_s=0.1), hmac_key=b"k" * 32)
    server = grpc.server(futures.ThreadPoolExecutor(4))
    scaler_pb2_grpc.add_ActorScalerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield scaler_pb2_grpc.ActorScalerStub(channel)
    server.stop(None)


def request(job="rec-job", round=4, wave=2, slots=(0, 1), steps=2000, function="slow-actor", version=0):
    """Each slow actor sleeps steps/1000 s."""
    return scaler_pb2.LaunchRequest(job_id=job, round=round, wave=wave, slots=list(slots), actors=len(slots),
                                    policy_version=version, steps_per_actor=steps, env_id="CartPole-v1",
                                    function_name=function, deadline_s=30.0)


def records(redis_client, job="rec-job", round=4) -> dict[str, InvocationRecord]:
    return launches.decode_all(redis_client.hgetall(launches_key(job, round)))


def billed(redis_client, job="rec-job") -> tuple[int, float]:
    """(invocations, actor dollars) on the job's ledger."""
    st = {k.decode(): v.decode() for k, v in redis_client.hgetall(scaler_state_key(job)).items()}
    return int(st.get("invocations", 0)), float(st.get("actor_cost_usd", 0.0))


def test_the_records_run_under_the_launchs_live_lease_then_hold_each_outcome(scaler, redis_client):
    result = {}
    launch = threading.Thread(target=lambda: result.update(resp=scaler.Launch(request(), timeout=60)))
    t0 = time.monotonic()
    launch.start()
    seen = []  # (seconds since the launch began, records running under a live owner)
    while launch.is_alive():
        recs = records(redis_client)
        alive = [o for o in launches.running_owners(recs) if redis_client.exists(launch_owner_key("rec-job", o))]
        seen.append((time.monotonic() - t0, sum(not r.done and r.owner in alive for r in recs.values())))
        time.sleep(0.05)
    launch.join()
    assert result["resp"].succeeded == 2 and result["resp"].recorded == 0
    running = [n for t, n in seen if 0.2 < t < 1.9]  # the actors sleep from ~0 s to 2 s
    assert running and all(n == 2 for n in running), seen
    assert max(t for t, n in seen if n) > 1.5, "the lease was refreshed past several TTLs"
    recs = records(redis_client)
    assert sorted(recs) == ["rec-job-r4-a0-x2", "rec-job-r4-a1-x2"] and all(r.done and r.result["ok"] for r in recs.values())
    owner = next(iter(recs.values())).owner
    assert not redis_client.exists(launch_owner_key("rec-job", owner)), "dropped as soon as the invocations returned"
    assert sum(r.usd for r in recs.values()) == pytest.approx(result["resp"].cost_usd)


def test_a_retried_launch_returns_the_recorded_invocations_and_bills_nothing_again(scaler, redis_client):
    first = scaler.Launch(request(steps=50), timeout=60)
    ledger = billed(redis_client)
    assert ledger[0] == 2 and ledger[1] > 0
    t0 = time.monotonic()
    again = scaler.Launch(request(steps=50), timeout=60)
    assert time.monotonic() - t0 < 1.0, "answered from the record, not run again"
    assert billed(redis_client) == ledger
    assert again.recorded == 2 and list(again.invocations) == list(first.invocations)
    assert (again.succeeded, again.cost_usd, again.cloud_cost_usd) == (2, first.cost_usd, first.cloud_cost_usd)


def test_a_retry_while_the_first_call_runs_waits_for_it_and_neither_runs_twice(scaler, redis_client):
    results = {}
    first = threading.Thread(target=lambda: results.update(first=scaler.Launch(request(steps=1500), timeout=60)))
    first.start()
    deadline = time.monotonic() + 10
    while len(records(redis_client)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    retry = scaler.Launch(request(steps=1500), timeout=60)  # the learner's retry after a lost response
    first.join()
    assert retry.recorded == 2 and retry.succeeded == 2
    assert list(retry.invocations) == list(results["first"].invocations)
    assert billed(redis_client)[0] == 2, "each invocation billed once"


def test_a_retry_with_more_slots_runs_only_the_new_ones(scaler, redis_client):
    scaler.Launch(request(slots=(0,), steps=50), timeout=60)
    wider = scaler.Launch(request(slots=(0, 1, 2), steps=50), timeout=60)
    assert (wider.launched, wider.recorded, wider.succeeded) == (3, 1, 3)
    assert billed(redis_client)[0] == 3


def test_invocations_whose_launch_died_come_back_lost_and_unbilled(scaler, redis_client):
    # A scaler died mid-launch: its records say running, its lease is gone.
    probe = scaler.Launch(request(round=5, slots=(0,), steps=10), timeout=60)  # the fingerprint of this request
    fp = next(iter(records(redis_client, round=5).values())).fingerprint
    redis_client.delete(launches_key("rec-job", 5))
    before = billed(redis_client)
    dead = launches.running(fp, "d" * 16)
    redis_client.hset(launches_key("rec-job", 5), mapping={"rec-job-r5-a0-x2": dead.encode(),
                                                           "rec-job-r5-a1-x2": dead.encode()})
    resp = scaler.Launch(request(round=5, steps=10), timeout=60)
    assert probe.succeeded == 1
    assert (resp.recorded, resp.failed, resp.cost_usd) == (2, 2, 0.0)
    assert {r.error_type for r in resp.invocations} == {LOST_ERROR}
    assert billed(redis_client) == before
    assert all(r.done for r in records(redis_client, round=5).values()), "a third call gets the same answer at once"


def test_a_retry_that_asks_for_something_else_is_refused_naming_the_field(scaler, redis_client):
    scaler.Launch(request(steps=50), timeout=60)
    with pytest.raises(grpc.RpcError) as err:
        scaler.Launch(request(steps=50, version=3), timeout=60)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "slots/wave" in err.value.details() and "other parameters" in err.value.details()
    assert billed(redis_client)[0] == 2


def test_a_resumed_learner_sees_at_once_which_slots_of_a_wave_failed(scaler, redis_client):
    resp = scaler.Launch(request(round=6, wave=0, slots=(0, 1), function="crashing-actor"), timeout=60)
    assert resp.failed == 2
    services = Services("rec-job", None, None, LearnerDeps(redis_client, b"", None, None, ""))
    slot_of = {f"rec-job-r6-a{s}": s for s in (0, 1, 2)}
    assert services.launch_status(6, slot_of) == RoundStatus(running=False, failed=frozenset({0, 1}))
    taken = TakenOver(1, time.time(), 120.0, slot_of, lambda: services.launch_status(6, slot_of))
    wait = taken.deadline() - time.perf_counter()
    assert wait == pytest.approx(GRACE, abs=0.5) and taken.all_failed({0, 1}) and not taken.all_failed({2})
