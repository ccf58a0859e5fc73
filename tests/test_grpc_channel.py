"""Client channels: calls spread over every address a target resolves to, and UNAVAILABLE is retried."""

from __future__ import annotations

import collections
import json
import time
from concurrent import futures

import grpc
import pytest

from nitro.rpc.grpc_util import Service, make_channel, service_config

METHOD = "/nitro.v1.BoostingDetector/Score"  # a retried service's path; the handler is a stand-in


def replica(name: str, hits: collections.Counter) -> tuple[grpc.Server, int]:
    def whoami(request: bytes, context) -> bytes:
        hits[name] += 1
        return name.encode()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler("nitro.v1.BoostingDetector", {
        "Score": grpc.unary_unary_rpc_method_handler(whoami)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def test_service_config_asks_for_round_robin_and_retries():
    cfg = json.loads(service_config())
    assert cfg["loadBalancingConfig"] == [{"round_robin": {}}]
    assert cfg["methodConfig"][0]["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]


def test_calls_spread_over_all_replicas_of_a_multi_address_target():
    hits: collections.Counter = collections.Counter()
    servers = [replica(f"r{i}", hits) for i in range(3)]
    try:
        target = "ipv4:" + ",".join(f"127.0.0.1:{port}" for _, port in servers)
        channel = make_channel(target)
        call = channel.unary_unary(METHOD)
        grpc.channel_ready_future(channel).result(timeout=10)
        for _ in range(30):
            call(b"", timeout=5)
        channel.close()
    finally:
        for server, _ in servers:
            server.stop(None)
    assert set(hits) == {"r0", "r1", "r2"} and sum(hits.values()) == 30
    assert max(hits.values()) <= 15, hits  # spread, not pinned to the first address


@pytest.mark.slow
def test_aged_connections_are_replaced_without_failing_calls():
    """Replicated services close connections after max_connection_age_s (clients then re-resolve
    and find new replicas); callers must not see that as errors."""
    hits: collections.Counter = collections.Counter()

    def whoami(request: bytes, context) -> bytes:
        hits[context.peer()] += 1
        return b"ok"

    service = Service("aging", "127.0.0.1", 0, max_connection_age_s=0.3)
    service.add("nitro.v1.BoostingDetector", lambda s: s.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler("nitro.v1.BoostingDetector", {
            "Score": grpc.unary_unary_rpc_method_handler(whoami)}),)))
    service.start()
    try:
        channel = make_channel(service.address)
        call = channel.unary_unary(METHOD)
        end = time.monotonic() + 2.0
        n = 0
        while time.monotonic() < end:
            assert call(b"", timeout=5) == b"ok"
            n += 1
            time.sleep(0.02)
        channel.close()
    finally:
        service.stop(0)
    assert sum(hits.values()) == n
    assert len(hits) >= 2, "the connection was replaced at least once (new client port)"


def _quiet_stream_survives_pings(server_options: list[tuple[str, object]], seconds: float = 4.5) -> bool:
    """Hold a server stream that sends nothing while the client pings it (about once a second here); True if it is still open."""
    import threading

    release = threading.Event()

    def quiet(request: bytes, context):
        yield b"first"
        release.wait(seconds + 5)  # sends nothing more: only the client's keepalive pings cross the connection

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=server_options)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Quiet", {
        "Stream": grpc.unary_stream_rpc_method_handler(quiet)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[
        ("grpc.keepalive_time_ms", 200), ("grpc.keepalive_timeout_ms", 1000),
        ("grpc.http2.max_pings_without_data", 0), ("grpc.http2.min_time_between_pings_ms", 100)])
    try:
        stream = channel.unary_stream("/t.Quiet/Stream")(b"", timeout=seconds + 10)
        assert next(stream) == b"first"
        time.sleep(seconds)
        release.set()
        try:
            list(stream)
            return True
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
            return False
    finally:
        release.set()
        channel.close()
        server.stop(None)


@pytest.mark.slow
def test_servers_accept_the_clients_keepalive_pings_on_a_quiet_stream():
    """A report stream can sit quiet between rounds while the client pings it (KEEPALIVE_TIME_MS): the
    server's ping policy must accept that rate, or it closes the stream with GOAWAY "too_many_pings"."""
    from nitro.rpc import grpc_util

    assert grpc_util.MIN_PING_INTERVAL_MS < grpc_util.KEEPALIVE_TIME_MS
    assert ("grpc.keepalive_time_ms", grpc_util.KEEPALIVE_TIME_MS) in grpc_util.channel_options()
    name = "grpc.http2.min_ping_interval_without_data_ms"
    assert (name, grpc_util.MIN_PING_INTERVAL_MS) in grpc_util.server_options()
    # The option does what it says, scaled to the test's pings (about 1 s apart): without it the stream is cut.
    assert not _quiet_stream_survives_pings([])
    assert _quiet_stream_survives_pings([(name, 100)])
