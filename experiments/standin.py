"""A calibrated stand-in for a Hopper actor (Figure 18): sleep for a real actor's duration, push a real batch."""

from __future__ import annotations

import time

import numpy as np

from nitro.data.redis_client import connect
from nitro.data.store import TrajectoryWriter

_clients: dict = {}
_batches: dict = {}


def _batch(steps: int) -> dict:
    if steps not in _batches:
        rng = np.random.default_rng(0)
        _batches[steps] = {
            "obs": rng.standard_normal((steps, 11)).astype(np.float32),
            "actions": rng.standard_normal((steps, 3)).astype(np.float32),
            "rewards": rng.standard_normal(steps).astype(np.float32), "terminated": np.zeros(steps, bool),
            "truncated": np.zeros(steps, bool), "logp": rng.standard_normal(steps).astype(np.float32),
            "values": rng.standard_normal(steps).astype(np.float32), "final_values": np.zeros(steps, np.float32),
            "bootstrap_value": 0.0, "episode_returns": [], "episode_lengths": []}
    return _batches[steps]


def handler(event, context=None):
    t0 = time.perf_counter()
    url = event["redis_url"]
    if url not in _clients:
        _clients[url] = connect(url)
    time.sleep(event["duration_s"])
    # The invocation's own signing key comes in its event, as an actor's does (nitro.contracts.invocation_key).
    TrajectoryWriter(_clients[url], event["job_id"], bytes.fromhex(event["key"])).append(
        invocation_id=event["invocation_id"], round=0, policy_version=0, steps=event["steps"],
        batch=_batch(event["steps"]))
    return {"ok": True, "duration_ms": (time.perf_counter() - t0) * 1e3}
