"""Health probes of the local system's components (also used by `nitro status`).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nitro.local.secret_files import REDIS_PASSWORD_FILE


def grpc_health(address: str, timeout: float = 2.0) -> str:
    """SERVING, NOT_SERVING, SERVICE_UNKNOWN or 'unreachable'."""
    try:
        with grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)]) as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    except grpc.RpcError:
        return "unreachable"


def http_health(url: str, timeout: float = 2.0, path: str = "/healthz") -> str:
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
        with opener.open(f"{url}{path}", timeout=timeout) as resp:
            return "SERVING" if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except OSError:
        return "unreachable"


def redis_health(url: str, password: str | None, timeout: float = 2.0) -> str:
    """`url` may name the user (redis://user@host:port/0); the password comes separately."""
    import redis

    client = redis.Redis.from_url(url, password=password, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return "SERVING" if client.ping() else "NOT_SERVING"
    except redis.AuthenticationError:
        return "NOT_SERVING (authentication failed)"
    except redis.RedisError:
        return "unreachable"
    finally:
        client.close()


def probe(name: str, comp: dict, state_dir: str | os.PathLike) -> str:
    if name == "redis":
        pw_file = Path(state_dir) / REDIS_PASSWORD_FILE
        password = pw_file.read_text().strip() if pw_file.exists() else None
        return redis_health(comp["url"], password)
    if name == "lambda":
        return http_health(comp["url"])
    if name == "prometheus":  # `nitro up --monitoring`
        return http_health(comp["url"], path="/-/ready")
    return grpc_health(comp["address"])
