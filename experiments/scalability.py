"""Figure 18 measurement: N concurrent stand-in invocations through boto3, until all N batches are in Redis."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
import numpy as np
from botocore.config import Config

from nitro.contracts import invocation_id, invocation_key
from nitro.data import codec
from nitro.data.redis_client import connect
from nitro.data.store import TrajectoryReader
from nitro.local.lambda_endpoint import FunctionConfig, LocalLambda
from nitro.local.redis_server import LocalRedis
from nitro.policy.inference import PolicyRunner
from nitro.policy.models import Policy, spec_for_spaces
from nitro.policy.rollout import Sampler


def actor_duration(steps: int) -> float:
    """Median wall time of a real Hopper-v5 actor sampling `steps` steps with the 2x256 policy."""
    sampler = Sampler("Hopper-v5", seed=0)
    spec = spec_for_spaces(sampler.env.observation_space, sampler.env.action_space, obs_norm=True)
    runner = PolicyRunner(spec, Policy(spec).numpy_state(), 0)
    rng = np.random.default_rng(0)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        sampler.sample(runner, steps, rng)
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def measure(sizes, steps: int) -> list[dict]:
    master = bytes.fromhex(codec.generate_hmac_key())  # stays here, as the services' master key does
    duration = actor_duration(steps)
    rows = []
    with LocalRedis() as redis_server:
        client = connect(redis_server.url, socket_timeout=30)
        fn = FunctionConfig("standin", "experiments.standin.handler", timeout_s=120, concurrency=max(sizes),
                            max_workers=64)
        with LocalLambda([fn]) as endpoint:
            lam = boto3.client("lambda", endpoint_url=endpoint.endpoint_url, region_name="us-east-1",
                               aws_access_key_id="x", aws_secret_access_key="x",
                               config=Config(max_pool_connections=64, retries={"total_max_attempts": 1}))
            for n in sizes:
                job = f"scal-{n}"
                reader = TrajectoryReader(client, job, master)
                ids = [invocation_id(job, 0, i) for i in range(n)]  # round 0's actor slots, as the reader expects
                events = [json.dumps({"job_id": job, "invocation_id": inv, "steps": steps, "duration_s": duration,
                                      "key": invocation_key(master, job, inv).hex(),
                                      "redis_url": redis_server.url}).encode() for inv in ids]
                t0 = time.perf_counter()
                with ThreadPoolExecutor(max_workers=64) as pool:  # Event invocations: answered at once
                    list(pool.map(lambda e: lam.invoke(FunctionName="standin", InvocationType="Event", Payload=e),
                                  events))
                got = 0
                while got < n and time.perf_counter() - t0 < 300:
                    entries = reader.read(count=256, block_ms=200)
                    reader.ack(entries)
                    got += len(entries)
                total = time.perf_counter() - t0
                rows.append({"n": n, "total_s": total, "actor_s": duration, "received": got})
                print(f"  {n:5d} invocations: {total:.2f} s (actor duration {duration * 1e3:.0f} ms), {got} batches")
    return rows
