"""A wave's liveness lease: the scaler keeps it while the wave's invocations run, and a resumed learner
waits for the waves it took over only while one is alive (then LOST_BATCH_GRACE_S more).

The wait rule is a pure function; the lease runs on a real Redis, a real gRPC scaler and the real local
Lambda endpoint. The resumed learner's round is timed end to end in tests/test_cli_truth.py."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest

from learner_svc.constants import LOST_BATCH_GRACE_S, TAKEOVER_POLL_S
from learner_svc.onpolicy import TakenOver, takeover_wait_end
from nitro import cost
from nitro.contracts import wave_live_key
from nitro.local.lambda_endpoint import FunctionConfig, LocalLambda
from nitro.v1 import scaler_pb2, scaler_pb2_grpc
from scaler_svc.invoker import Invoker, lambda_client
from scaler_svc.leases import WaveLeases
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


def test_a_takeover_asks_whether_its_waves_run_at_most_every_poll_period():
    answers = [True, False]
    asked = []

    def running():
        asked.append(time.time())
        return answers[min(len(asked) - 1, 1)]

    taken = TakenOver(count=1, launched_at=time.time(), deadline_s=120.0, running=running)
    alive_until = taken.deadline() - time.perf_counter()
    assert 119.0 < alive_until <= 120.0 and taken.stopped_at is None
    assert taken.deadline() - time.perf_counter() > 119.0 and len(asked) == 1  # not asked again yet
    taken.checked_at -= TAKEOVER_POLL_S  # a poll period later
    assert taken.deadline() - time.perf_counter() == pytest.approx(GRACE, abs=0.5) and len(asked) == 2
    assert taken.stopped_at is not None


# --- the lease on a real Redis -------------------------------------------------------------------------


def test_a_lease_held_twice_lives_until_its_last_holder_leaves(redis_client):
    leases = WaveLeases(redis_client, ttl_s=0.6, refresh_s=0.1)
    key = wave_live_key("j", 0, 0)
    with leases.hold(key):
        with leases.hold(key):  # a retried Launch running the same wave
            assert redis_client.exists(key)
        time.sleep(1.0)  # past the TTL: refreshed
        assert redis_client.exists(key)
    assert not redis_client.exists(key)
    time.sleep(0.3)  # the refresher does not bring it back
    assert not redis_client.exists(key)


# --- the scaler's Launch ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def endpoint():
    with LocalLambda([FunctionConfig("slow-actor", "tests.lambda_handlers.slow_actor")]) as ll:
        yield ll


@pytest.fixture
def scaler(redis_client, endpoint):
    client = lambda_client(endpoint.endpoint_url, "us-east-1", max_connections=4, read_timeout=30)
    servicer = ScalerServicer(redis_client, Invoker(client, max_attempts=1), cost.Prices(), "redis://127.0.0.1:1/0",
                              wave_leases=WaveLeases(redis_client, ttl_s=0.6, refresh_s=0.1), hmac_key=b"k" * 32)
    server = grpc.server(futures.ThreadPoolExecutor(2))
    scaler_pb2_grpc.add_ActorScalerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield scaler_pb2_grpc.ActorScalerStub(channel)
    server.stop(None)


def test_the_scaler_keeps_a_waves_lease_while_its_actors_run_and_drops_it_when_they_returned(scaler,
                                                                                            redis_client):
    key = wave_live_key("lease-job", 4, 2)
    request = scaler_pb2.LaunchRequest(job_id="lease-job", round=4, wave=2, slots=[0, 1], actors=2, policy_version=0,
                                       steps_per_actor=2000, env_id="CartPole-v1", function_name="slow-actor",
                                       deadline_s=30.0)  # each actor sleeps 2 s: over three TTLs of 0.6 s
    result = {}
    launch = threading.Thread(target=lambda: result.update(resp=scaler.Launch(request, timeout=60)))
    t0 = time.monotonic()
    launch.start()
    seen = []  # (seconds since the launch began, whether the lease was alive)
    while launch.is_alive():
        seen.append((time.monotonic() - t0, bool(redis_client.exists(key))))
        time.sleep(0.05)
    launch.join()
    assert not redis_client.exists(key), "dropped as soon as the wave's invocations returned"
    assert result["resp"].succeeded == 2
    running = [alive for t, alive in seen if 0.2 < t < 1.9]  # the actors sleep from ~0 s to 2 s
    assert running and all(running), seen
    assert max(t for t, alive in seen if alive) > 1.5, "refreshed past several TTLs"
    assert not redis_client.exists(wave_live_key("lease-job", 4, 0)), "only the launched wave is alive"
