"""Time one trajectory batch through the data plane, actor to learner.

Per iteration: TrajectoryWriter.append (pickle + HMAC + XADD), then
TrajectoryReader.read (XREADGROUP + verify + restricted unpickle + dedup
check) and ack (XACK + XDEL + seen record). The reference in the same run is
a plain SET + GET of the raw pickle of the same batch on the same server.
The last stdout line is a JSON summary.
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import secrets
import statistics
import time

import numpy as np

from nitro.redis_server import LocalRedis, connect
from nitro.store import TrajectoryReader, TrajectoryWriter

TARGET_MS = 2.0


def hopper_batch(steps: int = 4096, seed: int = 0) -> dict:
    """Shape of one actor's PPO rollout on Hopper (obs 11, act 3), no next_obs copy."""
    rng = np.random.default_rng(seed)
    terminated = rng.random(steps) < 0.002
    return {
        "obs": rng.standard_normal((steps, 11)).astype(np.float32),
        "actions": rng.standard_normal((steps, 3)).astype(np.float32),
        "rewards": rng.standard_normal(steps).astype(np.float32),
        "terminated": terminated,
        "truncated": np.zeros(steps, dtype=bool),
        "logp": rng.standard_normal(steps).astype(np.float32),
        "values": rng.standard_normal(steps).astype(np.float32),
        "bootstrap_value": np.float32(0.3),
        "episode_returns": [float(x) for x in rng.normal(1000.0, 200.0, int(terminated.sum()) + 1)],
    }


def _ms(samples: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(samples, n=10)
    return statistics.median(samples) * 1e3, q[8] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--compress", action="store_true")
    args = parser.parse_args()

    batch = hopper_batch()
    raw = pickle.dumps(batch, protocol=5)
    key = secrets.token_bytes(32)
    with LocalRedis() as server:
        client = connect(server.url)
        writer = TrajectoryWriter(client, "bench", key)
        reader = TrajectoryReader(client, "bench", key)

        # Path and reference alternate so both see the same machine noise; GC is
        # off while timing, as in timeit.
        path: list[float] = []
        reference: list[float] = []
        gc.disable()
        try:
            for i in range(args.warmup + args.iterations):
                t0 = time.perf_counter()
                writer.append(invocation_id=f"inv-{i}", round=i, policy_version=i, steps=4096, batch=batch,
                              compress=args.compress)
                entries = reader.read(count=1, block_ms=1000)
                reader.ack(entries)
                t1 = time.perf_counter()
                client.set("bench:ref", raw)
                ref = client.get("bench:ref")
                t2 = time.perf_counter()
                assert len(entries) == 1 and entries[0].batch["obs"].shape == (4096, 11) and ref is not None
                if i >= args.warmup:
                    path.append(t1 - t0)
                    reference.append(t2 - t1)
        finally:
            gc.enable()
        assert client.xlen("nitro:bench:traj") == 0 and not reader.rejected and reader.duplicates == 0
        client.close()

    median, p90 = _ms(path)
    ref_median, _ = _ms(reference)
    print(f"batch: 4096 Hopper steps, raw pickle {len(raw) / 1024:.0f} KiB, compress={args.compress}")
    print(f"signed stream path (append+read+verify+decode+ack): median {median:.3f} ms, p90 {p90:.3f} ms")
    print(f"reference (SET+GET of raw pickle): median {ref_median:.3f} ms")
    print(f"target <= {TARGET_MS} ms: {'met' if median <= TARGET_MS else 'NOT met'}")
    print(json.dumps({
        "benchmark": "trajectory_path",
        "iterations": args.iterations,
        "payload_bytes": len(raw),
        "median_ms": round(median, 4),
        "p90_ms": round(p90, 4),
        "target_ms": TARGET_MS,
        "reference_set_get_ms": round(ref_median, 4),
        "ratio_to_reference": round(median / ref_median, 3),
        "meets_target": median <= TARGET_MS,
    }))


if __name__ == "__main__":
    main()
