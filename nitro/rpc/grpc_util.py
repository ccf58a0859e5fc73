"""gRPC plumbing shared by the services and the SDK.

Servers: health service, reflection, graceful stop on SIGTERM (health goes
NOT_SERVING first, then the service drains), a 4 MB request limit
(RESOURCE_EXHAUSTED above it), INVALID_ARGUMENT for request bytes that do
not parse, and error messages bounded to 1 KB. Clients: a retry policy for UNAVAILABLE and
round-robin load balancing in the channel's service config, a deadline on every call,
optionally TLS and a bearer token (nitro.rpc.auth).
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Callable, Iterable
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from nitro.rpc import auth

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # control plane only: bulk data goes through Redis

SERVICES = ("nitro.v1.TrainingService", "nitro.v1.BoostingDetector", "nitro.v1.ActorScaler")

# Deadlines (seconds) per method; every client call passes one.
DEADLINES = {
    "StartTraining": 30.0, "GetTraining": 10.0, "StopTraining": 30.0, "ListTrainings": 10.0,
    "Score": 120.0, "Plan": 10.0, "Launch": 900.0, "GetCost": 10.0, "EndJob": 10.0,
    "WatchTraining": 7 * 24 * 3600.0,
}


# Replicated services close connections older than this, so clients re-resolve DNS and spread
# onto replicas added by an autoscaler; calls in flight get the grace (the longest deadline, Launch).
REPLICA_CONNECTION_AGE_S = 60.0
REPLICA_CONNECTION_GRACE_S = DEADLINES["Launch"]


def service_config(retry_attempts: int = 5) -> str:
    policy = {
        "maxAttempts": retry_attempts, "initialBackoff": "0.2s", "maxBackoff": "5s",
        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"],
    }
    # round_robin: with a headless Kubernetes Service (or any name resolving to several
    # addresses) calls spread over every replica of the detector or scaler; the default
    # pick_first would pin the learner's one HTTP/2 connection to a single pod and leave the
    # replicas an autoscaler adds idle. Both services keep their state in Redis, so any
    # replica can answer any call.
    return json.dumps({"loadBalancingConfig": [{"round_robin": {}}],
                       "methodConfig": [{"name": [{"service": s} for s in SERVICES], "retryPolicy": policy}]})


# Clients ping an open connection this often while a call is in flight (a Watch stream of round reports
# can sit quiet for minutes); servers accept pings twice as often. Left at gRPC's server default (one ping
# in 5 minutes without data), the server counts the clients' pings as abuse and closes the connection with
# GOAWAY "too_many_pings" (seen from the learner during a Qbert grid run, whose rounds are long).
KEEPALIVE_TIME_MS = 30_000
MIN_PING_INTERVAL_MS = KEEPALIVE_TIME_MS // 2


def channel_options() -> list[tuple[str, object]]:
    return [
        ("grpc.enable_retries", 1),
        ("grpc.service_config", service_config()),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ]


def server_options() -> list[tuple[str, object]]:
    """Size limits, and a ping policy that accepts the clients' keepalive (channel_options)."""
    return [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
            ("grpc.so_reuseport", 0)]


def make_channel(target: str, credentials: grpc.ChannelCredentials | None = None, *,
                 token: str | None = None) -> grpc.Channel:
    """A channel with the retry policy and size limits; TLS with `credentials`, a bearer header with `token`."""
    if credentials is not None:
        channel = grpc.secure_channel(target, credentials, options=channel_options())
    else:
        channel = grpc.insecure_channel(target, options=channel_options())
    return auth.with_token(channel, token)


MAX_STATUS_DETAILS = 1024  # characters of an error message; clients refuse status metadata over 16 KB


def _bounded(details: str | None) -> str | None:
    if details is not None and len(details) > MAX_STATUS_DETAILS:
        suffix = " ...(truncated)"
        return details[:MAX_STATUS_DETAILS - len(suffix)] + suffix
    return details


class _BoundedContext:
    """The servicer context, but error details never exceed MAX_STATUS_DETAILS.

    Messages quote the offending value; an unbounded one (a 3 MB job id) would
    make the client drop the real status for "metadata size exceeds hard limit".
    """

    def __init__(self, context):
        self._context = context

    def abort(self, code, details):
        return self._context.abort(code, _bounded(details))

    def set_details(self, details):
        return self._context.set_details(_bounded(details))

    def __getattr__(self, name):
        return getattr(self._context, name)


def _guarded_handler(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """`handler` with request parsing moved inside the call and bounded error details.

    grpc answers a request its deserializer cannot parse with INTERNAL, which
    reads as a server fault; a malformed request is the caller's: INVALID_ARGUMENT.
    """
    parse = handler.request_deserializer or (lambda raw: raw)

    def one(raw, context):
        try:
            return parse(raw)
        except Exception:  # protobuf raises DecodeError, but any parse failure is the same answer
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request bytes are not a valid {method} request message")

    def many(raws, context):
        for raw in raws:
            yield one(raw, context)

    out = handler.response_serializer
    if handler.unary_unary:
        fn = handler.unary_unary
        return grpc.unary_unary_rpc_method_handler(
            lambda r, c: fn(one(r, c), _BoundedContext(c)), response_serializer=out)
    if handler.unary_stream:
        fn = handler.unary_stream
        return grpc.unary_stream_rpc_method_handler(
            lambda r, c: fn(one(r, c), _BoundedContext(c)), response_serializer=out)
    if handler.stream_unary:
        fn = handler.stream_unary
        return grpc.stream_unary_rpc_method_handler(
            lambda rs, c: fn(many(rs, c), _BoundedContext(c)), response_serializer=out)
    fn = handler.stream_stream
    return grpc.stream_stream_rpc_method_handler(
        lambda rs, c: fn(many(rs, c), _BoundedContext(c)), response_serializer=out)


class RequestGuardInterceptor(grpc.ServerInterceptor):
    """INVALID_ARGUMENT for unparsable request bytes; error details bounded in size."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return handler
        return _guarded_handler(handler, handler_call_details.method)


class Service:
    """A gRPC server with health + reflection that drains gracefully on SIGTERM/SIGINT."""

    def __init__(self, name: str, host: str, port: int, *, max_workers: int = 16,
                 interceptors: Iterable[grpc.ServerInterceptor] = (),
                 server_credentials: grpc.ServerCredentials | None = None,
                 max_connection_age_s: float | None = None):
        """max_connection_age_s: close client connections after that age (in-flight calls get up to
        REPLICA_CONNECTION_GRACE_S to finish) so clients re-resolve the name and find replicas an
        autoscaler added since; for the stateless, replicated detector and scaler."""
        self.name = name
        age = ([("grpc.max_connection_age_ms", int(max_connection_age_s * 1000)),
                ("grpc.max_connection_age_grace_ms", int(REPLICA_CONNECTION_GRACE_S * 1000))]
               if max_connection_age_s else [])
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name),
            # Authentication (in `interceptors`) first: an unauthenticated request is never parsed.
            interceptors=[*interceptors, RequestGuardInterceptor()],
            options=[*server_options(), *age])
        self.health = health.HealthServicer(experimental_non_blocking=True)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        address = f"{host}:{port}"
        self.port = (self.server.add_secure_port(address, server_credentials) if server_credentials
                     else self.server.add_insecure_port(address))
        if self.port == 0:
            raise RuntimeError(f"{name}: cannot bind {address}")
        self.host = host
        self._services: list[str] = []
        self._drain_hooks: list[Callable[[], None]] = []
        self._stopped = threading.Event()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def add(self, full_service_name: str, register: Callable[[grpc.Server], None]) -> None:
        register(self.server)
        self._services.append(full_service_name)

    def on_drain(self, hook: Callable[[], None]) -> None:
        """Run `hook` after health goes NOT_SERVING and before the server stops."""
        self._drain_hooks.append(hook)

    def start(self) -> None:
        reflection.enable_server_reflection((*self._services, reflection.SERVICE_NAME, health.SERVICE_NAME),
                                            self.server)
        self.server.start()
        for s in ("", *self._services):
            self.health.set(s, health_pb2.HealthCheckResponse.SERVING)
        log.info("%s listening on %s", self.name, self.address)

    def stop(self, grace: float = 10.0) -> None:
        if self._stopped.is_set():
            return
        # Tell load balancers and probes first, then let in-flight work finish.
        for s in ("", *self._services):
            self.health.set(s, health_pb2.HealthCheckResponse.NOT_SERVING)
        for hook in self._drain_hooks:
            try:
                hook()
            except Exception:  # a failing hook must not prevent the stop
                log.exception("%s: drain hook failed", self.name)
        self.server.stop(grace).wait()
        self._stopped.set()

    def install_signal_handlers(self) -> None:
        def handle(signum, _frame):
            log.info("%s: received signal %d, draining", self.name, signum)
            threading.Thread(target=self.stop, daemon=True).start()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def wait(self) -> None:
        self._stopped.wait()


def check_health(target: str, service: str = "", timeout: float = 2.0,
                 credentials: grpc.ChannelCredentials | None = None) -> bool:
    """Health needs no token (nitro.rpc.auth.OPEN_METHODS); `credentials` for a TLS service."""
    try:
        with (grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)) as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                        timeout=timeout)
        return resp.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
