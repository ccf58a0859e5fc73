"""Evaluation off the critical path (docs/evaluation.md): the round time and the bill of `make demo`'s job with its
evaluation on evaluation functions (the default) against the same job evaluating on the learner.

`make demo`'s settings (examples/demo.yaml: Hopper-v5 PPO `tuned`, the default scaler, 512 steps per actor, seed 1)
for NITRO_BENCH_ROUNDS rounds (default 20), every round evaluated with NITRO_BENCH_EVAL_EPISODES episodes (default
5; the demo evaluates every 20th round, so this is the case where evaluation matters most), run through one real
local system, the two modes alternating NITRO_BENCH_PAIRS times (default 1).

Per mode: the median round on the cloud clock (the modelled critical path, docs/cost.md) and on this machine's
wall clock, the cloud bill per round (actors, learner server, evaluation functions) and the evaluation's share of
it. Figure: the median cloud round seconds with evaluation functions; reference: with the learner's evaluation;
ratio functions / learner (below 1: shorter rounds). The bill ratio is printed beside it.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nitro.client.sdk import NitroClient  # noqa: E402
from nitro.contracts import scaler_state_key  # noqa: E402
from nitro.cost import CostLedger  # noqa: E402
from nitro.data.redis_client import connect  # noqa: E402
from nitro.local.system import LocalSystem  # noqa: E402

ROUNDS = int(os.environ.get("NITRO_BENCH_ROUNDS", "20"))
EPISODES = int(os.environ.get("NITRO_BENCH_EVAL_EPISODES", "5"))
PAIRS = int(os.environ.get("NITRO_BENCH_PAIRS", "1"))
MODES = ("learner", "functions")


def run(client: NitroClient, redis_url: str, mode: str) -> dict:
    spec = {"env_id": "Hopper-v5", "preset": "tuned", "rounds": ROUNDS, "steps_per_actor": 512,
            "eval_episodes": EPISODES, "eval_every": 1, "budget_usd": 5.0, "seed": 1, "evaluation": mode}
    t0 = time.time()
    job = client.start_training(spec)
    reports = list(client.watch(job.job_id))
    elapsed = time.time() - t0
    ledger = CostLedger.from_fields(connect(redis_url).hgetall(scaler_state_key(job.job_id)))
    bill = ledger.cloud_actor_cost_usd + ledger.cloud_learner_cost_usd + ledger.cloud_eval_fn_cost_usd
    return {"mode": mode, "rounds": len(reports), "seconds": elapsed,
            "cloud_round_s": statistics.median(r.cloud_round_seconds for r in reports),
            "wall_round_s": statistics.median(r.round_seconds for r in reports),
            "evaluate_s": statistics.median(r.phases.get("evaluate", 0.0) for r in reports),
            "cloud_usd_per_round": bill / len(reports),
            "eval_usd_per_round": ledger.cloud_eval_fn_cost_usd / len(reports),
            "learner_usd_per_round": ledger.cloud_learner_cost_usd / len(reports),
            "final_eval_return": reports[-1].eval_return}


def main() -> None:
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        system = LocalSystem(state_dir=tmp, concurrency=16).start()
        try:
            with NitroClient(system.learner_address) as client:
                for _ in range(PAIRS):
                    for mode in MODES:
                        r = run(client, system.redis_url, mode)
                        runs.append(r)
                        print(f"{mode:>9}: {r['rounds']} rounds in {r['seconds']:.1f} s; median round "
                              f"{r['cloud_round_s']:.3f} s cloud, {r['wall_round_s']:.3f} s wall (evaluate "
                              f"{r['evaluate_s']:.3f} s); cloud bill ${r['cloud_usd_per_round']:.3e}/round (learner "
                              f"${r['learner_usd_per_round']:.3e}, evaluation functions ${r['eval_usd_per_round']:.3e})",
                              flush=True)
        finally:
            system.stop()

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["mode"] == mode)

    fn, ln = med("functions", "cloud_round_s"), med("learner", "cloud_round_s")
    print(json.dumps({
        "benchmark": "eval_offload", "rounds": ROUNDS, "eval_episodes": EPISODES, "pairs": PAIRS,
        "cloud_round_seconds": round(fn, 4), "reference_cloud_round_seconds_learner_eval": round(ln, 4),
        "ratio": round(fn / ln, 4),
        "wall_round_seconds": round(med("functions", "wall_round_s"), 4),
        "reference_wall_round_seconds": round(med("learner", "wall_round_s"), 4),
        "wall_ratio": round(med("functions", "wall_round_s") / med("learner", "wall_round_s"), 4),
        "cloud_usd_per_round": med("functions", "cloud_usd_per_round"),
        "reference_cloud_usd_per_round": med("learner", "cloud_usd_per_round"),
        "bill_ratio": round(med("functions", "cloud_usd_per_round") / med("learner", "cloud_usd_per_round"), 4),
        "runs": runs}))


if __name__ == "__main__":
    main()
