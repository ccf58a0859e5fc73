"""The actor Lambda handler end to end: policy in Redis -> one signed batch in the stream.

Real redis-server, real local Lambda endpoint, real boto3 client. The function holds no secret of its own:
its job's Redis user and password and its keys come in the event (tests.credentials.grant, as the scaler).
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
import numpy as np
import pytest
import redis
from botocore.config import Config

from nitro.contracts import invocation_id
from nitro.data.store import PolicyStore, TrajectoryReader
from nitro.local.lambda_endpoint import FunctionConfig, LocalLambda
from nitro.policy.envs import env_spaces
from nitro.policy.models import Policy, policy_to_blob, spec_for_spaces
from tests.credentials import grant, read_key

JOB = "handler-test"


def inv(slot: int) -> str:
    return invocation_id(JOB, 0, slot)


@pytest.fixture(scope="module")
def key_hex():
    return "ab" * 32


@pytest.fixture(scope="module")
def endpoint():
    fn = FunctionConfig("nitro-actor", "actor_fn.handler.handler", timeout_s=30, concurrency=4, max_workers=2)
    with LocalLambda([fn]) as ll:
        yield ll


@pytest.fixture
def lam(endpoint):
    return boto3.client("lambda", endpoint_url=endpoint.endpoint_url, region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test",
                        config=Config(retries={"total_max_attempts": 1}, read_timeout=60))


def publish_policy(client, key: bytes, env_id="CartPole-v1", version=3) -> Policy:
    spec = spec_for_spaces(*env_spaces(env_id), obs_norm=True)
    policy = Policy(spec)
    PolicyStore(client, JOB).put(version, policy_to_blob(policy, version, read_key(key, JOB)))
    return policy


def event(redis_server, key: bytes = bytes.fromhex("ab" * 32), **kw):
    """An event as the scaler builds it: the invocation's credentials derived from master key `key`."""
    e = {"job_id": JOB, "round": 0, "policy_version": 3, "env_id": "CartPole-v1", "num_steps": 300, "seed": 1,
         "invocation_id": inv(1), "redis_url": redis_server.url}
    e.update(kw)
    with redis.Redis.from_url(redis_server.url) as client:
        e.update(grant(client, key, JOB, e["invocation_id"]))
    return e


def invoke(lam, ev):
    resp = lam.invoke(FunctionName="nitro-actor", Payload=json.dumps(ev).encode())
    return resp, json.loads(resp["Payload"].read())


def test_policy_in_redis_to_batch_in_stream_through_boto3(redis_client, redis_server, lam, key_hex):
    key = bytes.fromhex(key_hex)
    publish_policy(redis_client, key)
    resp, summary = invoke(lam, event(redis_server))
    assert "FunctionError" not in resp, summary
    assert summary["ok"] and summary["steps"] == 300 and summary["episodes"] >= 1
    assert summary["duration_ms"] > 0 and summary["mean_episode_return"] > 0
    reader = TrajectoryReader(redis_client, JOB, key)
    entries = reader.read(count=10, block_ms=1000)
    assert len(entries) == 1
    e = entries[0]
    assert (e.invocation_id, e.round, e.policy_version, e.steps) == (inv(1), 0, 3, 300)
    b = e.batch
    for name in ("obs", "actions", "rewards", "terminated", "truncated", "logp", "values", "final_values"):
        assert len(b[name]) == 300, name
    assert b["obs"].shape == (300, 4) and b["policy_version"] == 3 and b["invocation_id"] == inv(1)
    assert sum(b["episode_lengths"]) <= 300 and isinstance(b["bootstrap_value"], float)
    reader.ack(entries)
    assert redis_client.xlen(f"nitro:{JOB}:traj") == 0


def test_warm_actor_continues_episodes_and_reloads_new_version(redis_client, redis_server, lam, key_hex):
    key = bytes.fromhex(key_hex)
    publish_policy(redis_client, key, version=3)
    publish_policy(redis_client, key, version=4)
    for i, version in enumerate((3, 3, 4)):
        resp, summary = invoke(lam, event(redis_server, invocation_id=inv(10 + i), policy_version=version,
                                          num_steps=50))
        assert summary["ok"] and summary["policy_version"] == version
    reader = TrajectoryReader(redis_client, JOB, key)
    got = reader.read(count=10, block_ms=1000)
    assert sorted(e.policy_version for e in got) == [3, 3, 4]
    assert all(len(e.batch["rewards"]) == 50 for e in got)


@pytest.mark.parametrize("case,expected_type", [
    ("missing_policy", "PolicyNotFoundError"),
    ("unknown_env", "UnknownEnvironmentError"),
    ("bad_event", "ConfigError"),
])
def test_errors_are_clear_function_errors(redis_client, redis_server, lam, key_hex, case, expected_type):
    publish_policy(redis_client, bytes.fromhex(key_hex))
    ev = {"missing_policy": event(redis_server, policy_version=99),
          "unknown_env": event(redis_server, env_id="NoSuchEnv-v0"),
          "bad_event": {k: v for k, v in event(redis_server).items() if k != "num_steps"}}[case]
    resp, body = invoke(lam, ev)
    assert resp["FunctionError"] == "Unhandled"
    assert body["errorType"] == expected_type
    assert {"missing_policy": "99", "unknown_env": "NoSuchEnv-v0", "bad_event": "num_steps"}[case] in body["errorMessage"]


def test_unreachable_redis_fails_fast_not_hangs(redis_server, lam):
    t0 = time.monotonic()
    resp, body = invoke(lam, event(redis_server, redis_url="redis://127.0.0.1:1/0", invocation_id=inv(20)))
    assert resp["FunctionError"] == "Unhandled"
    assert body["errorType"] == "RedisUnavailableError" and "127.0.0.1:1" in body["errorMessage"]
    assert time.monotonic() - t0 < 15


def test_direct_call_signs_batch_with_its_invocation_key(redis_client, redis_server, monkeypatch):
    from actor_fn import handler as actor

    key = b"k" * 32
    monkeypatch.delenv("NITRO_HMAC_KEY", raising=False)  # the function needs no key of its own
    publish_policy(redis_client, key)
    out = actor.handler(event(redis_server, key, invocation_id=inv(30), num_steps=20))
    assert out["ok"]
    wrong = TrajectoryReader(redis_client, JOB, b"x" * 32, consumer="other")
    assert wrong.read(count=5, block_ms=200) == [] and wrong.rejected == {"bad_signature": 1}
    np.testing.assert_equal(out["steps"], 20)


def test_the_credentials_are_required_and_never_echoed(redis_client, redis_server):
    from actor_fn import handler as actor
    from nitro.errors import ConfigError

    good = event(redis_server, invocation_id=inv(31), num_steps=20)
    creds = good["credentials"]
    for broken, field in (({k: v for k, v in good.items() if k != "credentials"}, "'credentials'"),
                          ({**good, "credentials": {**creds, "signing_key": "zz"}}, "credentials.signing_key"),
                          ({**good, "credentials": {**creds, "redis_username": "nitro-actor-other"}},
                           "credentials.redis_username"),
                          ({**good, "credentials": {**creds, "redis_password": "short"}}, "credentials.redis_password")):
        with pytest.raises(ConfigError, match=field) as err:
            actor.handler(broken)
        for secret in (creds["redis_password"], creds["signing_key"], creds["read_key"]):
            assert secret not in str(err.value)


def test_reset_episodes_makes_a_batch_depend_on_its_event_only(redis_client, redis_server, monkeypatch):
    """A warm actor continues its episode across invocations (which warm worker serves which
    invocation is a matter of timing); with reset_episodes the same event gives the same batch."""
    from actor_fn import handler as actor

    key = b"r" * 32
    publish_policy(redis_client, key)
    reader = TrajectoryReader(redis_client, JOB, key, consumer="reset-test")

    def batch(slot, **kw):
        ev = event(redis_server, key, invocation_id=inv(slot), num_steps=40, **{"seed": 11, **kw})
        assert actor.handler(ev)["ok"]
        (entry,) = reader.read(count=5, block_ms=1000)
        reader.ack([entry])
        return entry.batch

    first = batch(40, reset_episodes=True)
    batch(41, seed=5)  # moves the warm environment on
    again = batch(42, reset_episodes=True)
    continued = batch(43, seed=11)
    np.testing.assert_array_equal(first["obs"], again["obs"])
    np.testing.assert_array_equal(first["actions"], again["actions"])
    assert not np.array_equal(first["obs"], continued["obs"])  # without the flag the episode carries on
    with pytest.raises(Exception, match="reset_episodes"):
        actor.handler(event(redis_server, key, invocation_id=inv(44), reset_episodes="yes"))


def test_an_actor_process_runs_numpy_on_one_blas_thread():
    """Importing the actor package pins OpenBLAS to one thread before numpy loads (a fresh interpreter, as a
    warm worker or a Lambda runtime is); without it numpy takes one thread per core here."""
    probe = (
        "import ctypes, sys\n"
        "{first}\n"
        "import numpy\n"
        "paths = sorted({{l.split()[-1] for l in open('/proc/self/maps') if 'openblas' in l}})\n"
        "lib = ctypes.CDLL(paths[0])\n"
        "name = next(n for n in ('scipy_openblas_get_num_threads64_', 'openblas_get_num_threads64_',\n"
        "                        'openblas_get_num_threads') if hasattr(lib, n))\n"
        "print(getattr(lib, name)())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}

    def threads(first: str) -> int:
        out = subprocess.run([sys.executable, "-c", probe.format(first=first)], env=env, capture_output=True,
                             text=True, check=True, cwd=str(Path(__file__).resolve().parents[1]))
        return int(out.stdout.strip())

    assert threads("import actor_fn.handler") == 1
    if len(os.sched_getaffinity(0)) > 1:  # the CPUs OpenBLAS may use
        assert threads("pass") > 1  # the control: numpy alone threads
