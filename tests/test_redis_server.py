"""nitro.local.redis_server: a real private redis-server process."""

from __future__ import annotations

import os

import pytest
import redis

from nitro.data.redis_client import connect
from nitro.local.redis_server import LocalRedis, RedisServerError, find_redis_server_binary


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); look at its state.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_binary_found():
    path = find_redis_server_binary()
    assert os.path.isfile(path) and os.access(path, os.X_OK)


def test_binary_override(monkeypatch, tmp_path):
    monkeypatch.setenv("NITRO_REDIS_SERVER", str(tmp_path / "missing"))
    with pytest.raises(RedisServerError, match="NITRO_REDIS_SERVER"):
        find_redis_server_binary()


def test_start_stop():
    server = LocalRedis().start()
    try:
        client = connect(server.url)
        assert client.ping()
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        assert client.config_get("save")["save"] == ""
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        pid = server.pid
        assert _alive(pid)
        client.close()
        server.stop()
        assert not _alive(pid) and server.pid is None
        with pytest.raises(redis.ConnectionError):
            connect(server.url, retries=0, socket_connect_timeout=0.5).ping()
    finally:
        server.close()


def test_context_manager_cleans_up():
    with LocalRedis() as server:
        data_dir, pid = server.data_dir, server.pid
        assert data_dir.is_dir()
    assert not _alive(pid)
    assert not data_dir.exists()


def test_restart_keeps_port_and_data_with_appendonly(tmp_path):
    with LocalRedis(data_dir=tmp_path, appendonly=True) as server:
        port, pid = server.port, server.pid
        client = connect(server.url)
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert client.config_get("appendfsync")["appendfsync"] == "everysec"
        client.set("k", b"v")
        server.restart()
        assert server.port == port and server.pid != pid
        assert client.get("k") == b"v"  # the client reconnects on its own
        server.kill()  # a crash: data written before it survives via the AOF
        server.start()
        assert server.port == port
        assert client.get("k") == b"v"
    assert tmp_path.exists()  # a caller-owned dir is left in place


def test_password_required():
    with LocalRedis(password="s3cret-pass") as server:
        assert "s3cret-pass" in server.url
        assert "s3cret-pass" not in server.url_without_password
        with pytest.raises(redis.AuthenticationError):
            connect(server.url_without_password).ping()
        assert connect(server.url).ping()


def test_bad_password_rejected():
    with pytest.raises(ValueError):
        LocalRedis(password="has space")


def test_startup_failure_reports_log(tmp_path):
    fake = tmp_path / "fake-redis"
    fake.write_text("#!/bin/sh\necho 'fatal: cannot start' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(RedisServerError, match="cannot start"):
        LocalRedis(binary=str(fake), port=1).start()


def test_connect_options(redis_server):
    client = connect(redis_server.url, socket_timeout=12.0)
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 12.0 and kwargs["socket_connect_timeout"] == 5.0
    assert client.ping() is True
    assert client.get("nope") is None
    client.set("b", "x")
    assert client.get("b") == b"x"  # bytes, not decoded


def test_bind_beyond_loopback_needs_credentials_and_a_valid_address():
    with pytest.raises(ValueError, match="needs a password"):
        LocalRedis(bind="0.0.0.0")
    with pytest.raises(ValueError, match="bind must be"):
        LocalRedis(bind="0.0.0.0\nrequirepass x", password="pw")
    assert LocalRedis(bind="0.0.0.0", password="pw")._bind == "0.0.0.0"
