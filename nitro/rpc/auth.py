"""Bearer-token authentication and TLS for the gRPC services and their clients.

Every service checks `authorization: Bearer <token>` metadata on every call
except the gRPC health service (so load balancers and probes need no secret).
The token comes from NITRO_TOKEN or NITRO_TOKEN_FILE, never from code or the
command line, and is never logged: logs show `fingerprint(token)` at most.

A token file may hold several tokens, one per line: all are accepted and the
first is the one this process sends. That is how a token is rotated without
downtime (see docs/security.md).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import grpc
from prometheus_client import Counter

from nitro.errors import ConfigError

log = logging.getLogger(__name__)

TOKEN_ENV = "NITRO_TOKEN"
TOKEN_FILE_ENV = "NITRO_TOKEN_FILE"
TLS_CA_ENV = "NITRO_TLS_CA"
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 4096
# Probes must work without a secret; everything else, reflection included, needs the token.
OPEN_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})

AUTH_FAILURES = Counter("nitro_auth_failures_total", "gRPC calls refused for missing or wrong credentials.",
                        ["reason"])


# --- tokens -----------------------------------------------------------------------------


def generate_token() -> str:
    """A fresh random token (43 URL-safe characters, about 256 bits).

    Never starts with "-": a token that does is easily taken for an option wherever one is written next
    to flags (one generated token in 64 would be).
    """
    while (token := secrets.token_urlsafe(32)).startswith("-"):
        pass
    return token


def fingerprint(token: str) -> str:
    """A short, non-reversible name for a token, safe to log."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()[:12]


def _check_token(token: str, source: str) -> str:
    if not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS:
        raise ConfigError(f"{source}: a token must be {MIN_TOKEN_CHARS}-{MAX_TOKEN_CHARS} characters "
                          f"(got {len(token)}); generate one with "
                          "python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    # gRPC metadata values are printable ASCII; a space would break "Bearer <token>".
    if not all("!" <= c <= "~" for c in token):
        raise ConfigError(f"{source}: a token may only contain printable ASCII characters without spaces")
    return token


def load_tokens(environ: Mapping[str, str] = os.environ) -> list[str]:
    """All accepted tokens, the one to send first; [] when none is configured.

    NITRO_TOKEN wins over NITRO_TOKEN_FILE. Errors name the source, never the value.
    """
    value = environ.get(TOKEN_ENV)
    if value:
        return [_check_token(value.strip(), TOKEN_ENV)]
    path = environ.get(TOKEN_FILE_ENV)
    if not path:
        return []
    return read_token_file(path, f"{TOKEN_FILE_ENV}={path!r}")


def read_token_file(path: str, source: str) -> list[str]:
    """The tokens of a token file (one a line, `#` comments), the one to send first; `source` names the file
    in errors (e.g. "--token-file 'x'"), which never contain a token."""
    try:
        with open(path) as f:
            mode = os.fstat(f.fileno()).st_mode
            lines = [line.strip() for line in f.read().splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s is readable by other users; chmod 600 it", source)
    tokens = [_check_token(t, f"{source} line {i + 1}") for i, t in enumerate(lines) if t and not t.startswith("#")]
    if not tokens:
        raise ConfigError(f"{source} holds no token")
    return tokens


def load_token(environ: Mapping[str, str] = os.environ) -> str | None:
    """The token this process sends, or None."""
    tokens = load_tokens(environ)
    return tokens[0] if tokens else None


# Tokens of local systems started by this process, by service address: lets
# NitroClient(system.learner_address) work in-process without passing the token around.
_LOCAL_TOKENS: dict[str, str] = {}
_LOCAL_LOCK = threading.Lock()


def remember_local_token(address: str, token: str) -> None:
    with _LOCAL_LOCK:
        _LOCAL_TOKENS[address] = token


def forget_local_token(address: str) -> None:
    with _LOCAL_LOCK:
        _LOCAL_TOKENS.pop(address, None)


def client_token(target: str, token: str | None = None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The token a client sends to `target`: explicit, else $NITRO_TOKEN(_FILE), else an in-process local system's."""
    if token:
        return token
    env = load_token(environ)
    if env:
        return env
    with _LOCAL_LOCK:
        return _LOCAL_TOKENS.get(target)


# --- server side ------------------------------------------------------------------------


def _rejecting_handler(handler: grpc.RpcMethodHandler | None, code: grpc.StatusCode, message: str):
    def abort(_request, context):
        context.abort(code, message)

    def abort_stream(_request, context):
        context.abort(code, message)
        yield  # pragma: no cover - makes this a generator, as a streaming handler must be

    # The request is never parsed: an unauthenticated peer gets no CPU spent on its payload.
    if handler is not None and handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(abort_stream)
    if handler is not None and handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(abort)
    if handler is not None and handler.stream_stream:
        return grpc.stream_stream_rpc_method_handler(abort_stream)
    return grpc.unary_unary_rpc_method_handler(abort)


class _FailureLog:
    """At most one warning per interval: a token-guessing peer must not flood the log."""

    def __init__(self, interval_s: float = 10.0):
        self.interval_s, self._next, self._suppressed = interval_s, 0.0, 0
        self._lock = threading.Lock()

    def warn(self, method: str, reason: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now < self._next:
                self._suppressed += 1
                return
            suppressed, self._suppressed, self._next = self._suppressed, 0, now + self.interval_s
        more = f" ({suppressed} more since the last warning)" if suppressed else ""
        log.warning("refused %s: %s%s", method, reason, more)


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """UNAUTHENTICATED unless the call carries `authorization: Bearer <one of the tokens>`."""

    def __init__(self, tokens: Sequence[str], open_methods: Iterable[str] = OPEN_METHODS):
        if not tokens:
            raise ValueError("at least one token is required")
        # Compare digests: equal-length inputs, so the comparison time says nothing about the token.
        self._digests = [hashlib.sha256(t.encode()).digest() for t in tokens]
        self._open = frozenset(open_methods)
        self._failures = _FailureLog()

    def _check(self, metadata) -> tuple[str, str] | None:
        values = [v for k, v in (metadata or ()) if k == "authorization"]
        if not values:
            return "missing", ("missing credentials: send the access token as metadata "
                               "'authorization: Bearer <token>'")
        value = values[0]
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        scheme, _, presented = value.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return "malformed", "malformed authorization metadata: expected 'Bearer <token>'"
        digest = hashlib.sha256(presented.strip().encode("utf-8", "surrogateescape")).digest()
        ok = False
        for d in self._digests:  # no early exit: every accepted token is compared
            ok |= hmac.compare_digest(digest, d)
        return None if ok else ("invalid", "invalid access token")

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method in self._open:
            return continuation(handler_call_details)
        refused = self._check(handler_call_details.invocation_metadata)
        if refused is None:
            return continuation(handler_call_details)
        reason, message = refused
        AUTH_FAILURES.labels(reason).inc()
        self._failures.warn(method, message)
        return _rejecting_handler(continuation(handler_call_details), grpc.StatusCode.UNAUTHENTICATED, message)


# --- client side ------------------------------------------------------------------------


class _BearerClientInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                               grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the authorization header to every call (works on insecure channels too, unlike call credentials)."""

    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, d):
        metadata = [m for m in (d.metadata or ()) if m[0] != "authorization"] + [self._header]
        return _CallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready, d.compression)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                            "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


def with_token(channel: grpc.Channel, token: str | None) -> grpc.Channel:
    """`channel` sending `authorization: Bearer <token>` on every call (unchanged when token is None)."""
    return grpc.intercept_channel(channel, _BearerClientInterceptor(token)) if token else channel


def channel_credentials(tls_ca: str | None) -> grpc.ChannelCredentials | None:
    """TLS credentials trusting the CA certificate in `tls_ca` (PEM); None means plaintext."""
    if not tls_ca:
        return None
    try:
        with open(tls_ca, "rb") as f:
            return grpc.ssl_channel_credentials(root_certificates=f.read())
    except OSError as exc:
        raise ConfigError(f"TLS CA file {tls_ca!r} cannot be read: {exc.strerror}") from None


# --- service command lines --------------------------------------------------------------


def add_server_args(p: argparse.ArgumentParser, *, client: bool = False) -> None:
    """--tls-cert/--tls-key/--insecure-no-auth (and --tls-ca for services that call others)."""
    g = p.add_argument_group("security (token from $NITRO_TOKEN or $NITRO_TOKEN_FILE)")
    g.add_argument("--tls-cert", default=os.environ.get("NITRO_TLS_CERT"),
                   help="PEM certificate chain: serve TLS (default: $NITRO_TLS_CERT; plaintext when unset)")
    g.add_argument("--tls-key", default=os.environ.get("NITRO_TLS_KEY"),
                   help="PEM private key for --tls-cert (default: $NITRO_TLS_KEY)")
    g.add_argument("--insecure-no-auth", action="store_true",
                   help="serve without token authentication (development on loopback only)")
    if client:
        g.add_argument("--tls-ca", default=os.environ.get(TLS_CA_ENV),
                       help="PEM CA certificate: call the other services over TLS (default: $NITRO_TLS_CA)")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class ServerSecurity:
    interceptors: list[grpc.ServerInterceptor]
    credentials: grpc.ServerCredentials | None
    token: str | None  # the token this process sends to other services


def server_security(args, name: str) -> ServerSecurity:
    """Interceptors and credentials for a service from its parsed args and environment.

    Raises ConfigError (the service refuses to start) when no token is configured
    and --insecure-no-auth was not given.
    """
    tokens = load_tokens()
    host = getattr(args, "host", "127.0.0.1")
    if getattr(args, "insecure_no_auth", False):
        interceptors = []
        log.warning("%s: token authentication is OFF (--insecure-no-auth)%s", name,
                    "" if is_loopback(host) else f"; anyone who can reach {host} can use this service")
    elif tokens:
        interceptors = [TokenAuthInterceptor(tokens)]
        log.info("%s: token authentication on (%d token(s) accepted, sending %s)", name, len(tokens),
                 fingerprint(tokens[0]))
    else:
        raise ConfigError(f"{name}: no access token configured: set {TOKEN_ENV} or {TOKEN_FILE_ENV} "
                          "(or pass --insecure-no-auth to run without authentication)")
    cert, key = getattr(args, "tls_cert", None), getattr(args, "tls_key", None)
    credentials = None
    if bool(cert) != bool(key):
        raise ConfigError(f"{name}: --tls-cert and --tls-key must be given together")
    if cert:
        try:
            with open(cert, "rb") as f:
                chain = f.read()
            with open(key, "rb") as f:
                private = f.read()
        except OSError as exc:
            raise ConfigError(f"{name}: TLS file {exc.filename!r} cannot be read: {exc.strerror}") from None
        credentials = grpc.ssl_server_credentials([(private, chain)])
        log.info("%s: serving TLS with certificate %s", name, cert)
    elif not is_loopback(host):
        log.warning("%s: listening on %s without TLS: tokens and data cross the network in clear text", name, host)
    return ServerSecurity(interceptors, credentials, tokens[0] if tokens else None)
