"""Redis connections for every nitro process, and the one reader of Redis credentials in the environment.

NITRO_REDIS_URL names the server; NITRO_REDIS_USERNAME (an ACL user), NITRO_REDIS_PASSWORD or the
first line of NITRO_REDIS_PASSWORD_FILE log in, so a password never has to appear on a command line.
"""

from __future__ import annotations

import logging
import os
import threading
from urllib.parse import quote, urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from nitro.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def url_from_env(default: str | None = DEFAULT_URL, environ=os.environ) -> str | None:
    """NITRO_REDIS_URL, else `default` (credentials are added by with_credentials)."""
    return environ.get("NITRO_REDIS_URL") or default


class RetryUnlessRefused(Retry):
    """Retry connection errors except a refused password: retrying cannot fix that."""

    def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):
        def retryable(err: Exception) -> bool:
            if isinstance(err, redis.AuthenticationError):
                return False
            return is_retryable is None or is_retryable(err)

        return super().call_with_retry(do, fail, retryable, with_failure_count)


def connect(
    url: str,
    *,
    socket_timeout: float = 5.0,
    socket_connect_timeout: float = 5.0,
    health_check_interval: int = 30,
    retries: int = 3,
    **kw,
) -> redis.Redis:
    """A bytes-in/bytes-out client that retries connection errors with exponential backoff.

    `socket_timeout` must exceed the longest BLOCK a caller passes (XREADGROUP),
    otherwise a healthy blocking read is reported as a timeout.
    """
    kw.setdefault("retry", RetryUnlessRefused(ExponentialBackoff(cap=2.0, base=0.05), retries))
    # Trajectory payloads are ~0.3 MB: larger reads cut recv calls and parser copies.
    kw.setdefault("socket_read_size", 1 << 20)
    return redis.Redis.from_url(
        url,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_connect_timeout,
        health_check_interval=health_check_interval,
        decode_responses=False,
        **kw,
    )


def with_credentials(url: str, environ=os.environ) -> str:
    """`url`, with user and password from the environment when it carries no password.

    NITRO_REDIS_USERNAME (an ACL user; none means Redis's default user) and NITRO_REDIS_PASSWORD, else
    the first line of NITRO_REDIS_PASSWORD_FILE. Host (IPv6 in brackets), port (none stays none: the
    client's default), path and query are kept; a URL without a host (unix://) is returned as is.
    """
    parts = urlsplit(url)
    if parts.password or not parts.hostname:
        return url
    password = environ.get("NITRO_REDIS_PASSWORD")
    path = environ.get("NITRO_REDIS_PASSWORD_FILE")
    if not password and path:
        try:
            with open(path) as f:
                password = f.readline().strip()
        except OSError as exc:
            raise ConfigError(f"NITRO_REDIS_PASSWORD_FILE={path!r} cannot be read: {exc.strerror}") from None
    if not password:
        return url
    return with_login(url, parts.username or environ.get("NITRO_REDIS_USERNAME", ""), password)


def with_login(url: str, username: str, password: str) -> str:
    """`url` logging in as `username` with `password`, whatever user or password it carried; host (IPv6 in
    brackets), port, path and query kept. A URL without a host (unix://) is returned as is."""
    parts = urlsplit(url)
    if not parts.hostname:
        return url
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = f"{quote(username, safe='')}:{quote(password, safe='')}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def persistence(client: redis.Redis) -> str:
    """How Redis persists data: "aof", "rdb", "aof+rdb", "none", or "unknown: <why>"."""
    try:
        aof = client.config_get("appendonly")
        save = client.config_get("save")
    except redis.ResponseError as exc:  # CONFIG refused by an ACL or renamed by a managed service
        return f"unknown: CONFIG GET refused ({str(exc).split(':')[0][:80]})"
    except redis.RedisError as exc:
        return f"unknown: {type(exc).__name__}"

    def value(d: dict, name: str) -> str:
        v = d.get(name, d.get(name.encode(), b""))
        return (v.decode() if isinstance(v, bytes) else str(v)).strip()

    kinds = [k for k, on in (("aof", value(aof, "appendonly") == "yes"), ("rdb", bool(value(save, "save"))))
             if on]
    return "+".join(kinds) or "none"


def warn_if_not_persistent(client: redis.Redis, url: str, service: str) -> threading.Thread:
    """Log a warning when Redis persists nothing (a restart would lose acknowledged batches).

    Runs in the background so an unreachable Redis never delays startup.
    """
    safe = url.split("@")[-1]

    def check() -> None:
        state = persistence(client)
        if state == "none":
            log.warning("%s: Redis at %s has no persistence (appendonly no, no save points): a Redis restart "
                        "loses trajectories, plans and cost records; enable appendonly yes "
                        "(appendfsync everysec)", service, safe)
        elif state.startswith("unknown"):
            log.info("%s: cannot tell whether Redis at %s persists data (%s)", service, safe, state)
        else:
            log.info("%s: Redis at %s persists with %s", service, safe, state)

    t = threading.Thread(target=check, name="redis-persistence-check", daemon=True)
    t.start()
    return t
