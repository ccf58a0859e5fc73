"""Redis ACL and persistence of a Redis nitro runs itself, on a real redis-server.

A job's own user (what its actors log in as) may XADD to that job's trajectory
stream and GET its policies, nothing else; the service user has nitro's keys but
no server-wide dangerous commands; the scaler's may also create and delete the job
users; the default user is disabled. AOF (appendfsync everysec) survives a kill -9.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
import redis

from nitro.contracts import actor_user
from nitro.data.redis_acl import set_actor_user
from nitro.data.redis_client import connect, persistence, warn_if_not_persistent, with_credentials
from nitro.data.store import PolicyStore, TrajectoryReader, TrajectoryWriter
from nitro.local.redis_server import SCALER_USER, SERVICE_USER, LocalRedis, nitro_users
from tests.credentials import grant, read_key, signer

SERVICE_PW, SCALER_PW, ACTOR_PW = "svc-" + "s" * 28, "scl-" + "c" * 28, "act-" + "a" * 28
JOB = "acl-job"
ACTOR_USER = actor_user(JOB)
KEY = b"k" * 32


@pytest.fixture(scope="module")
def server():
    s = LocalRedis(users=nitro_users(SERVICE_PW, SCALER_PW), appendonly=True).start()
    set_actor_user(connect(s.url_for(SCALER_USER)), JOB, ACTOR_PW)  # as the scaler does at the job's launch
    yield s
    s.close()


@pytest.fixture
def service(server):
    c = connect(server.url)
    for k in c.scan_iter("nitro:*"):
        c.delete(k)
    yield c
    c.close()


@pytest.fixture
def actor(server):
    """What job JOB's actors log in as."""
    c = connect(f"redis://{ACTOR_USER}:{ACTOR_PW}@127.0.0.1:{server.port}/0", retries=0)
    yield c
    c.close()


def test_urls_name_the_users_and_the_default_user_is_off(server):
    assert server.url.startswith(f"redis://{SERVICE_USER}:") and server.url_without_password.count("@") == 0
    anon = connect(f"redis://127.0.0.1:{server.port}/0", retries=0)
    with pytest.raises(redis.RedisError):
        anon.ping()
    for user, pw in (("default", "x"), ("default", SERVICE_PW), ("default", ACTOR_PW), (ACTOR_USER, SERVICE_PW),
                     (SCALER_USER, SERVICE_PW), ("nitro-actor", ACTOR_PW)):  # no shared actor user any more
        with pytest.raises(redis.AuthenticationError):
            connect(f"redis://{user}:{pw}@127.0.0.1:{server.port}/0", retries=0).ping()
    assert SERVICE_PW not in repr(nitro_users(SERVICE_PW, SCALER_PW)) and SCALER_PW not in repr(
        nitro_users(SERVICE_PW, SCALER_PW))


def test_actor_can_append_trajectories_and_read_policies(service, actor):
    PolicyStore(service, JOB).put(3, b"signed-policy-blob")
    assert actor.ping()
    assert PolicyStore(actor, JOB).get(3) == b"signed-policy-blob"
    TrajectoryWriter(actor, JOB, signer(KEY, JOB)).append(invocation_id=f"{JOB}-r0-a0", round=0, policy_version=3,
                                                          steps=2, batch={"rewards": np.zeros(2, np.float32)})
    entries = TrajectoryReader(service, JOB, KEY).read(count=5, block_ms=500)
    assert [e.invocation_id for e in entries] == [f"{JOB}-r0-a0"]
    # The actor handler's path: append_batch writes its entries in one MULTI/EXEC.
    ids = TrajectoryWriter(actor, JOB, signer(KEY, JOB)).append_batch(
        invocation_id=f"{JOB}-r0-a1", round=0, policy_version=3, batch={"rewards": np.zeros(2, np.float32)})
    assert len(ids) == 1


REFUSED = {
    "SET a policy": lambda c: c.set(f"nitro:{JOB}:policy:3", b"evil"),
    "SET a new key": lambda c: c.set(f"nitro:{JOB}:policy:9", b"evil"),
    "DEL the stream": lambda c: c.delete(f"nitro:{JOB}:traj"),
    "KEYS": lambda c: c.keys("*"),
    "SCAN": lambda c: c.scan(0),
    "FLUSHALL": lambda c: c.flushall(),
    "FLUSHDB": lambda c: c.flushdb(),
    "XREADGROUP": lambda c: c.xreadgroup("learner", "evil", {f"nitro:{JOB}:traj": ">"}),
    "XRANGE": lambda c: c.xrange(f"nitro:{JOB}:traj"),
    "XDEL": lambda c: c.xdel(f"nitro:{JOB}:traj", "0-1"),
    "XTRIM": lambda c: c.xtrim(f"nitro:{JOB}:traj", maxlen=0),
    "XGROUP DESTROY": lambda c: c.xgroup_destroy(f"nitro:{JOB}:traj", "learner"),
    "CONFIG GET": lambda c: c.config_get("requirepass"),
    "CONFIG SET": lambda c: c.config_set("dir", "/tmp"),
    "ACL LIST": lambda c: c.acl_list(),
    "GET the dedup set": lambda c: c.get(f"nitro:{JOB}:seen"),
    "GET the scaler ledger": lambda c: c.get(f"nitro:{JOB}:scaler"),
    "HSET the scaler ledger": lambda c: c.hset(f"nitro:{JOB}:scaler", "actor_cost_usd", 0),
    "ZADD the dedup set": lambda c: c.zadd(f"nitro:{JOB}:seen", {"inv-9": 1}),
    "GET a key outside nitro": lambda c: c.get("other:key"),
    "XADD outside a traj stream": lambda c: c.xadd(f"nitro:{JOB}:sample:0", {"a": "b"}),
    "EVAL": lambda c: c.eval("return redis.call('set', KEYS[1], 'x')", 1, f"nitro:{JOB}:traj"),
    "XADD another job's stream": lambda c: c.xadd("nitro:other-job:traj", {"a": "b"}),
    "GET another job's policy": lambda c: c.get("nitro:other-job:policy:3"),
    "GET another job's latest version": lambda c: c.get("nitro:other-job:policy:latest"),
    "GET another job's parcel": lambda c: c.get("nitro:other-job:learn:parcel:other-job-r0-g0"),
    "XADD another job's learner updates": lambda c: c.xadd("nitro:other-job:learn:updates", {"a": "b"}),
    "ACL SETUSER": lambda c: c.execute_command("ACL", "SETUSER", "evil", "on", ">x", "~*", "+@all"),
    "SUBSCRIBE-free PUBLISH": lambda c: c.publish("nitro", "x"),
    "SHUTDOWN": lambda c: c.execute_command("SHUTDOWN", "NOSAVE"),
    "DEBUG": lambda c: c.execute_command("DEBUG", "SLEEP", "0"),
    "SELECT": lambda c: c.execute_command("SELECT", "1"),
    "SET inside MULTI/EXEC": lambda c: c.pipeline(transaction=True).xadd(f"nitro:{JOB}:traj", {"a": "b"})
    .set(f"nitro:{JOB}:policy:3", b"evil").execute(),
    "WATCH": lambda c: c.execute_command("WATCH", f"nitro:{JOB}:traj"),
}


@pytest.mark.parametrize("what", list(REFUSED))
def test_actor_is_refused_everything_else(service, actor, what):
    PolicyStore(service, JOB).put(3, b"signed-policy-blob")
    TrajectoryReader(service, JOB, KEY)  # the stream and its group exist
    with pytest.raises(redis.exceptions.NoPermissionError):
        REFUSED[what](actor)
    assert service.get(f"nitro:{JOB}:policy:3") == b"signed-policy-blob", "nothing changed"
    assert service.xinfo_groups(f"nitro:{JOB}:traj")[0]["name"] == b"learner"


def test_service_user_runs_every_service_operation(service):
    store = PolicyStore(service, JOB)
    store.put(0, b"blob")
    assert store.get(0) == b"blob" and store.latest() == 0
    w = TrajectoryWriter(service, JOB, signer(KEY, JOB))
    w.append(invocation_id=f"{JOB}-r0-a9", round=0, policy_version=0, steps=1, batch={"x": np.ones(1)})
    r = TrajectoryReader(service, JOB, KEY)
    got = r.read(count=5, block_ms=200)
    assert len(got) == 1
    r.ack(got)
    assert r.pending_count() == 0 and r.claim_stale(0, 5) == []
    pipe = service.pipeline(transaction=True)
    pipe.hincrbyfloat(f"nitro:{JOB}:scaler", "actor_cost_usd", 0.5)
    pipe.hincrby(f"nitro:{JOB}:scaler", "invocations", 2)
    pipe.hset(f"nitro:{JOB}:detector:ratios", "0", "0.1")
    pipe.expire(f"nitro:{JOB}:scaler", 60)
    pipe.hgetall(f"nitro:{JOB}:detector:ratios")
    assert pipe.execute()[-1] == {b"0": b"0.1"}
    assert persistence(service) == "aof"


@pytest.mark.parametrize("what", ["FLUSHALL", "KEYS", "CONFIG SET", "SHUTDOWN", "DEBUG", "ACL LIST", "ACL SETUSER",
                                  "GET a key outside nitro"])
def test_service_user_lacks_server_wide_dangerous_commands(service, what):
    with pytest.raises(redis.exceptions.NoPermissionError):
        REFUSED[what](service)


@pytest.mark.parametrize("what", ["FLUSHALL", "KEYS", "CONFIG SET", "SHUTDOWN", "DEBUG", "ACL LIST",
                                  "GET a key outside nitro"])
def test_scaler_user_is_the_service_user_plus_managing_job_users(server, what):
    scaler = connect(server.url_for(SCALER_USER), retries=0)
    with pytest.raises(redis.exceptions.NoPermissionError):
        REFUSED[what](scaler)
    set_actor_user(scaler, "temp-job", ACTOR_PW)  # what it may do beyond the services
    assert scaler.execute_command("ACL", "DELUSER", actor_user("temp-job")) == 1


def test_actor_handler_logs_in_as_its_jobs_user(server, service, tmp_path, monkeypatch):
    """actor_fn.handler builds its URL from the event's address and the event's credentials, whatever its
    environment says (an old deployment's NITRO_REDIS_USERNAME/PASSWORD is ignored)."""
    from actor_fn import handler as actor_handler
    from actor_fn import runtime as actor_runtime
    from nitro.policy.envs import env_spaces
    from nitro.policy.models import Policy, policy_to_blob, spec_for_spaces

    policy = Policy(spec_for_spaces(*env_spaces("CartPole-v1")))
    PolicyStore(service, JOB).put(1, policy_to_blob(policy, 1, read_key(KEY, JOB)))
    monkeypatch.setenv("NITRO_REDIS_USERNAME", SERVICE_USER)
    monkeypatch.setenv("NITRO_REDIS_PASSWORD", SERVICE_PW)
    monkeypatch.delenv("NITRO_HMAC_KEY", raising=False)
    monkeypatch.setattr(actor_runtime, "WARM_CLIENTS", {})
    inv = f"{JOB}-r0-a5"
    out = actor_handler.handler({"job_id": JOB, "round": 0, "policy_version": 1, "env_id": "CartPole-v1",
                                 "num_steps": 16, "seed": 0, "invocation_id": inv,
                                 "redis_url": f"redis://{SERVICE_USER}:{SERVICE_PW}@127.0.0.1:{server.port}/0",
                                 **grant(connect(server.url_for(SCALER_USER)), KEY, JOB, inv, ACTOR_PW)})
    assert out["ok"]
    entries = TrajectoryReader(service, JOB, KEY).read(count=5, block_ms=500)
    assert [e.invocation_id for e in entries] == [inv]
    (url,) = actor_runtime.WARM_CLIENTS
    assert url.startswith(f"redis://{ACTOR_USER}:") and SERVICE_PW not in url


@pytest.mark.slow
def test_aof_survives_kill_9(tmp_path):
    s = LocalRedis(data_dir=tmp_path / "redis", users=nitro_users(SERVICE_PW, SCALER_PW), appendonly=True).start()
    try:
        c = connect(s.url)
        c.set("nitro:j:policy:0", b"acknowledged")
        c.xadd("nitro:j:traj", {"inv": "x"})
        time.sleep(1.5)  # appendfsync everysec
        s.kill()
        s.start()
        c = connect(s.url)
        assert c.get("nitro:j:policy:0") == b"acknowledged" and c.xlen("nitro:j:traj") == 1
        assert (tmp_path / "redis" / "appendonly.aof").exists()
    finally:
        s.close()


def test_persistence_check(redis_server, server, caplog):
    plain = connect(redis_server.url)  # the suite's Redis: save "" and appendonly no
    assert persistence(plain) == "none"
    with caplog.at_level(logging.WARNING, logger="nitro.data.redis_client"):
        warn_if_not_persistent(plain, redis_server.url, "learner").join(10)
    assert "no persistence" in caplog.text and "appendonly yes" in caplog.text
    actor_url = f"redis://{ACTOR_USER}:{ACTOR_PW}@127.0.0.1:{server.port}/0"
    actor = connect(actor_url, retries=0)
    assert persistence(actor).startswith("unknown: CONFIG GET refused")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="nitro.data.redis_client"):
        warn_if_not_persistent(actor, actor_url, "learner").join(10)
        warn_if_not_persistent(connect("redis://127.0.0.1:1/0", retries=0), "redis://:pw@127.0.0.1:1/0",
                               "learner").join(20)
    assert "cannot tell" in caplog.text and "no persistence" not in caplog.text
    assert ACTOR_PW not in caplog.text and ":pw@" not in caplog.text


def test_users_are_validated():
    from nitro.local.redis_server import RedisUser

    with pytest.raises(ValueError):
        RedisUser("default", "x" * 20, "+@all")
    with pytest.raises(ValueError):
        RedisUser("u", "bad pass word", "+@all")
    with pytest.raises(ValueError):
        RedisUser("u", "x" * 20, "+@all >another")
    with pytest.raises(ValueError):
        LocalRedis(password="x" * 20, users=nitro_users(SERVICE_PW, SCALER_PW))


def test_services_take_credentials_from_the_environment(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("p/w+=x\n")
    env = {"NITRO_REDIS_USERNAME": SERVICE_USER, "NITRO_REDIS_PASSWORD_FILE": str(pw)}
    assert with_credentials("redis://10.0.0.5:6379/0", env) == f"redis://{SERVICE_USER}:p%2Fw%2B%3Dx@10.0.0.5:6379/0"
    assert with_credentials("redis://:given@h:1/0", env) == "redis://:given@h:1/0", "a URL's own password wins"
    assert with_credentials("redis://h/0", {"NITRO_REDIS_PASSWORD": "pw"}) == "redis://:pw@h/0"
    assert with_credentials("redis://h:1/0", {}) == "redis://h:1/0"
    parsed = redis.connection.parse_url(with_credentials("redis://h:1/0", env))
    assert (parsed["username"], parsed["password"]) == (SERVICE_USER, "p/w+=x")
    from nitro.errors import ConfigError

    with pytest.raises(ConfigError, match="cannot be read"):
        with_credentials("redis://h:1/0", {"NITRO_REDIS_PASSWORD_FILE": str(tmp_path / "missing")})
