"""nitro.data.redis_client: the one reader of Redis credentials in the environment."""

import pytest

from nitro.data.redis_client import DEFAULT_URL, url_from_env, with_credentials
from nitro.errors import ConfigError


def env(**kw):
    return {f"NITRO_REDIS_{k}": v for k, v in kw.items()}


def test_no_password_leaves_the_url_alone():
    assert with_credentials("redis://10.0.0.1:6380/2", {}) == "redis://10.0.0.1:6380/2"


def test_password_and_user_from_the_environment():
    out = with_credentials("redis://10.0.0.1:6380/2", env(PASSWORD="p@ss:/w", USERNAME="nitro-actor"))
    assert out == "redis://nitro-actor:p%40ss%3A%2Fw@10.0.0.1:6380/2"


def test_default_user_when_none_is_named():
    assert with_credentials("redis://h/0", env(PASSWORD="pw")) == "redis://:pw@h/0"


def test_port_is_not_invented():
    """No port stays no port (the client's default); the old actor copy wrote :6379 into every URL."""
    assert with_credentials("rediss://cache.example:7000/0", env(PASSWORD="pw")) == "rediss://:pw@cache.example:7000/0"
    assert with_credentials("rediss://cache.example/0", env(PASSWORD="pw")) == "rediss://:pw@cache.example/0"


@pytest.mark.parametrize("url, expected", [
    ("redis://[::1]:6379/0", "redis://:pw@[::1]:6379/0"),
    ("redis://[fd00::5]/1", "redis://:pw@[fd00::5]/1"),
])
def test_ipv6_host_keeps_its_brackets(url, expected):
    """The old actor copy dropped the brackets, making 'fd00::5:6379' an unparseable address."""
    assert with_credentials(url, env(PASSWORD="pw")) == expected


def test_a_password_in_the_url_wins():
    url = "redis://u:inline@h:1/0"
    assert with_credentials(url, env(PASSWORD="other", USERNAME="x")) == url


def test_user_in_the_url_wins_over_the_environment():
    assert with_credentials("redis://svc@h:1/0", env(PASSWORD="pw", USERNAME="x")) == "redis://svc:pw@h:1/0"


def test_password_file_first_line(tmp_path):
    f = tmp_path / "pw"
    f.write_text("secret \nsecond line\n")
    assert with_credentials("redis://h:1/0", env(PASSWORD_FILE=str(f))) == "redis://:secret@h:1/0"
    assert with_credentials("redis://h:1/0", env(PASSWORD="direct", PASSWORD_FILE=str(f))) == "redis://:direct@h:1/0"


def test_unreadable_password_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="NITRO_REDIS_PASSWORD_FILE"):
        with_credentials("redis://h:1/0", env(PASSWORD_FILE=str(tmp_path / "missing")))


def test_url_without_host_is_returned_as_is():
    assert with_credentials("unix:///tmp/redis.sock", env(PASSWORD="pw")) == "unix:///tmp/redis.sock"


def test_url_from_env():
    assert url_from_env(environ={}) == DEFAULT_URL
    assert url_from_env(default=None, environ={}) is None
    assert url_from_env(environ=env(URL="redis://r:1/0")) == "redis://r:1/0"


def test_connect_round_trips_every_kind_of_value(redis_client):
    import numpy as np

    big = np.arange(100_000, dtype=np.float32)
    redis_client.set("nitro:t:s", "héllo")
    redis_client.set("nitro:t:f", 1.5)
    # A buffer past the packer's cutoff; byte-formatted (redis-py takes len() of a memoryview as its size).
    redis_client.set("nitro:t:mv", memoryview(big).cast("B"))
    redis_client.xadd("nitro:t:x", {"n": 3, "big": big.tobytes(), "ba": bytearray(b"\x00\x01")})
    assert redis_client.get("nitro:t:s").decode() == "héllo" and redis_client.get("nitro:t:f") == b"1.5"
    assert np.array_equal(np.frombuffer(redis_client.get("nitro:t:mv"), np.float32), big)
    [(_, fields)] = redis_client.xrange("nitro:t:x")
    assert fields == {b"n": b"3", b"big": big.tobytes(), b"ba": b"\x00\x01"}
