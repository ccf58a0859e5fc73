"""deploy/k8s/base/config/redis-start.sh (compose and Kubernetes) run against a real redis-server.

The deployed Redis must give the same ACL users as nitro's own local Redis: the learner and
detector as nitro-service, the scaler as nitro-scaler (which creates each job's own user for its
functions), default disabled, no shared actor user, and passwords kept off the command line.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from nitro.data.redis_acl import SCALER_RULES, SCALER_USER, SERVICE_RULES, SERVICE_USER, set_actor_user
from nitro.local.redis_server import find_redis_server_binary

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "deploy/k8s/base/config/redis-start.sh"
CONF = ROOT / "deploy/k8s/base/config/redis.conf"
SERVICE_PW, SCALER_PW, ACTOR_PW = "a1" * 32, "c3" * 32, "b2" * 32


def test_script_rules_are_the_code_rules():
    text = SCRIPT.read_text()
    service = re.search(r"^user nitro-service on >\$NITRO_REDIS_PASSWORD (.+)$", text, re.M).group(1)
    scaler = re.search(r"^user nitro-scaler on >\$NITRO_REDIS_SCALER_PASSWORD (.+)$", text, re.M).group(1)
    assert (service, scaler) == (SERVICE_RULES, SCALER_RULES)
    assert (SERVICE_USER, SCALER_USER) == ("nitro-service", "nitro-scaler")
    assert [ln.split()[1] for ln in text.splitlines() if ln.startswith("user ")] == ["default", SERVICE_USER,
                                                                                     SCALER_USER]


def test_shipped_config_leaves_users_to_the_script():
    lines = [ln.split()[0] for ln in CONF.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert not {"requirepass", "user", "aclfile"} & set(lines)  # aclfile and inline users cannot be mixed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def deployed_redis(tmp_path):
    port = free_port()
    conf = tmp_path / "redis.conf"  # the test's own port and dir; the users come from the script
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\nsave \"\"\nappendonly no\n")
    env = {"PATH": "/usr/bin:/bin", "NITRO_REDIS_PASSWORD": SERVICE_PW, "NITRO_REDIS_SCALER_PASSWORD": SCALER_PW,
           "NITRO_REDIS_ACL_DIR": str(tmp_path / "acl"), "REDIS_SERVER": find_redis_server_binary()}
    proc = subprocess.Popen(["sh", str(SCRIPT), str(conf)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    client = redis.Redis(port=port, username=SERVICE_USER, password=SERVICE_PW)
    deadline = time.monotonic() + 15
    while True:
        try:
            client.ping()
            break
        except redis.exceptions.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"redis did not start: {proc.stdout.read().decode()[-2000:]}")
            time.sleep(0.05)
    yield port, proc, tmp_path / "acl" / "users.acl"
    proc.terminate()
    proc.wait(10)


def no_retry(port: int, **kw) -> redis.Redis:
    """A client that raises the server's refusal at once: redis-py retries a connection error, an
    AuthenticationError included, with backoff (~16 s of this test's sleeps)."""
    return redis.Redis(port=port, retry=Retry(NoBackoff(), 0), **kw)


def test_users_and_their_rights(deployed_redis):
    port, proc, acl = deployed_redis
    service = no_retry(port, username=SERVICE_USER, password=SERVICE_PW)
    scaler = no_retry(port, username=SCALER_USER, password=SCALER_PW)
    set_actor_user(scaler, "j", ACTOR_PW)  # what the scaler does when job j launches
    actor = no_retry(port, username="nitro-actor-j", password=ACTOR_PW)
    service.set("nitro:j:policy:1", b"weights")
    assert actor.get("nitro:j:policy:1") == b"weights"
    actor.xadd("nitro:j:traj", {"b": b"batch"})
    assert service.xlen("nitro:j:traj") == 1
    for forbidden in (lambda: actor.set("nitro:j:policy:1", b"evil"), lambda: actor.keys("*"),
                      lambda: actor.xrange("nitro:j:traj"), lambda: actor.xadd("nitro:k:traj", {"b": b"x"}),
                      lambda: actor.get("nitro:k:policy:1"), lambda: service.flushall(),
                      lambda: service.set("other:key", b"x"), lambda: set_actor_user(service, "k", ACTOR_PW),
                      lambda: scaler.acl_list(), lambda: scaler.flushall()):
        with pytest.raises(redis.exceptions.NoPermissionError):
            forbidden()
    for user, pw in (("nitro-actor-j", SERVICE_PW), ("nitro-actor", ACTOR_PW), (SCALER_USER, SERVICE_PW)):
        with pytest.raises(redis.exceptions.AuthenticationError):
            no_retry(port, username=user, password=pw).ping()  # passwords are per user; no shared actor
    with pytest.raises((redis.exceptions.AuthenticationError, redis.exceptions.NoPermissionError,
                        redis.exceptions.ResponseError)):
        no_retry(port).get("nitro:j:policy:1")  # default user: off
    # Passwords stay off argv (visible in ps) and the ACL file is private to redis.
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
    assert SERVICE_PW not in cmdline and SCALER_PW not in cmdline
    assert acl.stat().st_mode & 0o077 == 0


def test_a_password_that_would_break_the_acl_line_is_refused(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "NITRO_REDIS_PASSWORD": "ok", "NITRO_REDIS_SCALER_PASSWORD": "bad pw ~* +@all",
           "NITRO_REDIS_ACL_DIR": str(tmp_path), "REDIS_SERVER": "/bin/false"}
    out = subprocess.run(["sh", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=10)
    assert out.returncode == 2 and "use hex" in out.stderr
    assert not (tmp_path / "users.acl").exists()
