"""What both Lambda handlers (actor_fn.handler, actor_fn.learner_handler) share in one execution
environment: event field checks and the warm Redis clients."""

from __future__ import annotations

import contextlib
from urllib.parse import urlsplit

from nitro.clock import InvocationClock
from nitro.data.redis_client import url_from_env, with_credentials
from nitro.errors import ConfigError


class RedisUnavailableError(ConnectionError):
    """Redis could not be reached within the connect timeout."""


# One client per Redis URL, kept between invocations of a warm execution environment.
WARM_CLIENTS: dict[str, object] = {}


def check_fields(event: dict, required: dict[str, type], *, non_negative: bool = False) -> None:
    """ConfigError naming the field unless `event` is an object with every required field of its type
    (integers, not booleans; non-empty strings)."""
    if not isinstance(event, dict):
        raise ConfigError(f"event must be a JSON object, got {type(event).__name__}")
    for name, typ in required.items():
        if name not in event:
            raise ConfigError(f"event is missing required field {name!r}")
        value = event[name]
        if typ is int and (isinstance(value, bool) or not isinstance(value, int) or (non_negative and value < 0)):
            kind = "a non-negative integer" if non_negative else "an integer"
            raise ConfigError(f"event field {name!r} must be {kind}, got {value!r}")
        if typ is str and (not isinstance(value, str) or not value):
            raise ConfigError(f"event field {name!r} must be a non-empty string")


def redis_url(event: dict) -> str:
    """The event's redis_url, else NITRO_REDIS_URL, with credentials from the environment (never the event)."""
    url = event.get("redis_url") or url_from_env(default=None)
    if not url:
        raise ConfigError("no Redis address: set event field 'redis_url' or NITRO_REDIS_URL")
    return with_credentials(url)


def warm_client(url: str, clock: InvocationClock | None = None):
    """The warm client of `url`, connected and pinged on first use; RedisUnavailableError if unreachable."""
    client = WARM_CLIENTS.get(url)
    if client is None:
        import redis

        from nitro.data.redis_client import connect

        client = connect(url, socket_connect_timeout=2.0, socket_timeout=10.0)
        try:
            with clock.io() if clock else contextlib.nullcontext():
                client.ping()
        except redis.exceptions.ConnectionError as exc:
            where = urlsplit(url)._replace(netloc=f"{urlsplit(url).hostname}:{urlsplit(url).port}").geturl()
            raise RedisUnavailableError(f"cannot reach Redis at {where}: {exc}") from exc
        WARM_CLIENTS[url] = client
    return client
