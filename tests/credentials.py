"""What the scaler gives a job's functions, for tests that call a handler or write a stream directly.

`grant` sets up the job's own Redis user (as the scaler's ActorUsers does) and returns the event field with the
invocation's credentials; `signer` signs each batch with its invocation's key, as that invocation's actor would;
`read_key` is what the learner signs the job's policies with.
"""

from __future__ import annotations

import redis

from nitro.contracts import CREDENTIALS_FIELD, function_credentials, invocation_key, job_read_key
from nitro.data.redis_acl import set_actor_user

PASSWORD = "test-job-password-0123456789"


def grant(client: redis.Redis, master: bytes, job_id: str, invocation_id: str, password: str = PASSWORD) -> dict:
    """{"credentials": ...} of invocation `invocation_id` of job `job_id`, its job's Redis user created."""
    set_actor_user(client, job_id, password)
    return {CREDENTIALS_FIELD: function_credentials(master, job_id, invocation_id, password).to_event()}


def signer(master: bytes, job_id: str):
    """A TrajectoryWriter key: each invocation's own, derived from the master key."""
    return lambda invocation_id: invocation_key(master, job_id, invocation_id)


def read_key(master: bytes, job_id: str) -> bytes:
    return job_read_key(master, job_id)
