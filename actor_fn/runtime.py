"""What both Lambda handlers (actor_fn.handler, actor_fn.learner_handler) share in one execution
environment: the invocation's credentials and Redis address and the warm Redis clients (the event's fields are
checked by nitro.events).

A function holds no secret of its own: each event carries its job's Redis user and password, its own signing
key and its job's read key (nitro.contracts.FunctionCredentials, built by the scaler). None of them is ever
put in an error message or a log line.
"""

from __future__ import annotations

import contextlib
from urllib.parse import urlsplit

from nitro.clock import InvocationClock
from nitro.contracts import FunctionCredentials
from nitro.data.redis_client import url_from_env, with_login
from nitro.errors import ConfigError


class RedisUnavailableError(ConnectionError):
    """Redis could not be reached within the connect timeout."""


# One client per Redis URL (with its job's user), kept between invocations of a warm execution environment; the
# newest WARM_CLIENT_CAP (a warm environment that served many jobs does not keep a connection to each).
WARM_CLIENTS: dict[str, object] = {}
WARM_CLIENT_CAP = 4


def credentials(event: dict) -> FunctionCredentials:
    """The invocation's credentials from the event (its job's: `job_id` is checked first); ConfigError naming the
    field that is missing or malformed."""
    try:
        return FunctionCredentials.from_event(event, event["job_id"])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def redis_url(event: dict, creds: FunctionCredentials) -> str:
    """The event's redis_url, else NITRO_REDIS_URL, logging in as the job's user with the event's password (any user
    or password in the URL is replaced)."""
    url = event.get("redis_url") or url_from_env(default=None)
    if not url:
        raise ConfigError("no Redis address: set event field 'redis_url' or NITRO_REDIS_URL")
    return with_login(url, creds.redis_username, creds.redis_password)


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
            parts = urlsplit(url)
            where = parts._replace(netloc=f"{parts.hostname}:{parts.port}").geturl()
            if isinstance(exc, redis.exceptions.AuthenticationError):  # retryable: the scaler sets the user again
                raise RedisUnavailableError(f"Redis at {where} refused user {parts.username}: its job ended, or "
                                            "Redis restarted and the scaler has not set the user up again yet") from exc
            raise RedisUnavailableError(f"cannot reach Redis at {where}: {exc}") from exc
        WARM_CLIENTS[url] = client
        while len(WARM_CLIENTS) > WARM_CLIENT_CAP:
            WARM_CLIENTS.pop(next(iter(WARM_CLIENTS))).close()
    return client
