"""Per-round bookkeeping of the scaler and the detector late in a long job against early in it.

Every round the scaler plans (Plan), reports the bill (GetCost) and reads its warm-sandbox counts (Launch);
the detector stores the round's convexity ratio and reads back its score window. All of it lives in Redis
hashes that gain a field a round (the scaler keeps each round's plan, the detector each round's ratio), so
a handler that read its whole hash would cost more every round. This bench runs the real servicers against
a real Redis with the AOF on (as the local system runs it), plans LONG rounds of one job, and times each
round's bookkeeping. Figure: the median over the last WINDOW rounds; reference, same run: the median over
rounds 10 to 10 + WINDOW. Target ratio <= 1.5 (bookkeeping that does not grow with the job).

Usage: .venv/bin/python bench/bookkeeping_growth.py [--rounds 3000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from detector_svc.server import DetectorServicer  # noqa: E402
from nitro import cost  # noqa: E402
from nitro.data.redis_client import connect  # noqa: E402
from nitro.local.redis_server import LocalRedis  # noqa: E402
from nitro.v1 import common_pb2, scaler_pb2  # noqa: E402
from scaler_svc.server import ScalerServicer, launch_fields  # noqa: E402

WINDOW, TARGET, JOB = 200, 1.5, "job-bench"


class Context:
    def abort(self, code, details):
        raise RuntimeError(f"{code}: {details}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3000)
    args = ap.parse_args()
    if args.rounds < 10 + 2 * WINDOW:
        ap.error(f"--rounds: must be at least {10 + 2 * WINDOW}")
    server = LocalRedis(appendonly=True).start()
    try:
        client = connect(server.url)
        scaler = ScalerServicer(client, None, cost.Prices(), "redis://127.0.0.1:1/0")
        detector = DetectorServicer(client, b"k" * 32, server.url)
        spec = common_pb2.ScalerSpec(policy="nitro", i_min=4, i_max=16)
        per_round = []
        for k in range(args.rounds):
            t0 = time.perf_counter()
            detector._store_ratio(JOB, k, 0.5 + 0.001 * (k % 7), 6)
            scaler.Plan(scaler_pb2.PlanRequest(job_id=JOB, round=k, budget_usd=1e5, learner_seconds=0.4,
                                               cloud_learner_seconds=0.4, steps_per_actor=512, score=0.5,
                                               scaler=spec, rounds=args.rounds), Context())
            scaler._state(JOB, launch_fields("actor"))  # what Launch reads
            scaler.GetCost(scaler_pb2.GetCostRequest(job_id=JOB), Context())
            per_round.append(time.perf_counter() - t0)
    finally:
        server.close()
    early = statistics.median(per_round[10:10 + WINDOW]) * 1e3
    late = statistics.median(per_round[-WINDOW:]) * 1e3
    ratio = late / early
    print(f"{args.rounds} rounds of one job's scaler and detector bookkeeping (Plan, GetCost, Launch's state read, "
          f"the detector's ratio window): median {early:.3f} ms a round at rounds 10-{10 + WINDOW}, "
          f"{late:.3f} ms over the last {WINDOW}")
    print(json.dumps({"benchmark": "bookkeeping_growth", "rounds": args.rounds, "late_ms_per_round": round(late, 4),
                      "reference_early_ms_per_round": round(early, 4), "ratio": round(ratio, 3),
                      "target_ratio": TARGET, "meets_target": ratio <= TARGET}))


if __name__ == "__main__":
    main()
