"""Client channels: calls spread over every address a target resolves to, and UNAVAILABLE is retried."""

from __future__ import annotations

import collections
import json
import time
from concurrent import futures

import grpc

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
