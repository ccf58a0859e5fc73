"""`lambda_backend="aws"`: the local system without its own Lambda endpoint.

Nothing here reaches AWS. A separate Lambda-compatible endpoint stands in for the AWS Lambda
service: boto3 in the scaler finds it through AWS_ENDPOINT_URL_LAMBDA, exactly as it would
find lambda.REGION.amazonaws.com without that variable, and the stand-in's function is
configured like a deployed function: with no secret at all (each invocation's event carries its
job's Redis user and password and its own keys).
"""

from __future__ import annotations

import socket

import pytest
import redis

from nitro.client.sdk import NitroClient
from nitro.data import redis_acl
from nitro.errors import LocalSystemError
from nitro.local.lambda_endpoint import FunctionConfig, LocalLambda
from nitro.local.redis_server import SCALER_USER
from nitro.local.system import LocalSystem

pytestmark = pytest.mark.timeout(300)



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def non_loopback_ipv4() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


@pytest.mark.system
def test_aws_backend_trains_through_boto3_default_endpoint_without_a_local_endpoint(tmp_path, monkeypatch):
    fn = FunctionConfig("nitro-actor", "actor_fn.handler.handler", concurrency=8, max_workers=2)
    for var in ("NITRO_HMAC_KEY", "NITRO_REDIS_PASSWORD", "NITRO_REDIS_USERNAME", "NITRO_LAMBDA_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    with LocalLambda([fn]) as aws_lambda:
        monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", aws_lambda.endpoint_url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        port = free_port()
        system = LocalSystem(tmp_path / "state", {"redis": port}, lambda_backend="aws",
                             actor_redis_url=f"redis://127.0.0.1:{port}/0", aws_region="us-east-2",
                             redis_bind="0.0.0.0")
        try:
            system.start()
            assert "lambda" not in system.components  # no local endpoint: the scaler uses boto3's default
            ip = non_loopback_ipv4()
            if ip:  # bound beyond loopback: the functions' network path; no user logs in without a password
                r = redis.Redis(host=ip, port=port)
                with pytest.raises(redis.exceptions.RedisError):
                    r.keys("*")
                r.close()
            with NitroClient(system.learner_address) as client:
                job = client.start_training({
                    "env_id": "CartPole-v1", "preset": "fast", "rounds": 2, "steps_per_actor": 256,
                    "eval_episodes": 1, "budget_usd": 1.0, "seed": 3, "function_name": "nitro-actor",
                    "scaler": {"policy": "fixed", "fixed_actors": 2, "i_min": 1, "i_max": 2}})
                reports = list(client.watch(job.job_id))
                status = client.get(job.job_id)
            assert status.state_name == "SUCCEEDED", status.message
            assert [r.actors_completed for r in reports] == [2, 2]
            assert status.total_env_steps == 2 * 2 * 256
            # The job ended: the scaler deleted its Redis user (the learner's EndJob, before the job says it ended).
            with redis.Redis.from_url(system._redis.url_for(SCALER_USER)) as r:
                assert redis_acl.actor_user_jobs(r) == []
        finally:
            system.stop()


def test_aws_backend_needs_where_the_functions_reach_redis(tmp_path):
    with pytest.raises(LocalSystemError, match="actor_redis_url"):
        LocalSystem(tmp_path, lambda_backend="aws")
    with pytest.raises(LocalSystemError, match="lambda_backend must be"):
        LocalSystem(tmp_path, lambda_backend="gcp")


@pytest.mark.system
def test_a_bind_address_redis_cannot_take_is_a_clear_error(tmp_path):
    system = LocalSystem(tmp_path / "s", lambda_backend="aws", actor_redis_url="redis://10.0.0.5:6379/0",
                         redis_bind="not an address")
    with pytest.raises(LocalSystemError, match="cannot configure Redis"):
        system.start()
