"""The modelled cloud bill of the boosting job `make demo` ran until 2026-12-03, phase by phase, under the old and the
corrected cost model.

Runs the demo's settings (Hopper-v5 PPO `tuned`, the nitro scaler with I_min 4 and I_max 16, 512 steps per
actor, 3 evaluation episodes, seed 1) through the real local system for NITRO_BENCH_ROUNDS rounds (default 20;
the demo runs 80), then bills its round reports phase by phase (`nitro.cost.phase_bill`):

- new: today's defaults, as the job itself billed them: the learner as a c6i.large ($0.085/h, the CPU whose
  time the clock measures), 1,769 MB actors (one full vCPU);
- old: the model before 2026-12-02: the paper's p3.2xlarge ($3.06/h) for the same CPU time, 1,024 MB actors
  modelled on a full vCPU;
- and, for the CPU share alone, today's prices with 1,024 MB actors (1.73x the CPU-bound time).

Figure: the new bill; reference: the old bill of the same rounds; ratio new / old.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nitro.client import results  # noqa: E402
from nitro.client.sdk import NitroClient  # noqa: E402
from nitro.contracts import DEFAULT_ACTOR_MEMORY_MB, LAMBDA_FULL_VCPU_MB  # noqa: E402
from nitro.cost import LEGACY_ACTOR_MEMORY_MB, PAPER_PRICES, Prices, phase_bill  # noqa: E402
from nitro.local.system import LocalSystem  # noqa: E402

ROUNDS = int(os.environ.get("NITRO_BENCH_ROUNDS", "20"))
I_MIN, I_MAX, STEPS, SEED, EVAL_EPISODES = 4, 16, 512, 1, 3


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        system = LocalSystem(state_dir=tmp, concurrency=I_MAX).start()
        try:
            with NitroClient(system.learner_address) as client:
                spec = {"env_id": "Hopper-v5", "preset": "tuned", "rounds": ROUNDS, "steps_per_actor": STEPS,
                        "eval_episodes": EVAL_EPISODES, "budget_usd": 5.0, "seed": SEED,
                        "scaler": {"policy": "nitro", "i_min": I_MIN, "i_max": I_MAX}}
                t0 = time.time()
                job = client.start_training(spec)
                reports = [results.as_dict(r) for r in client.watch(job.job_id)]
                elapsed = time.time() - t0
        finally:
            system.stop()
    billed = Prices()  # what the job's reports were billed at (the system's defaults)
    new = phase_bill(reports, billed, DEFAULT_ACTOR_MEMORY_MB, billed, DEFAULT_ACTOR_MEMORY_MB)
    old = phase_bill(reports, billed, DEFAULT_ACTOR_MEMORY_MB, PAPER_PRICES, LEGACY_ACTOR_MEMORY_MB)
    share = phase_bill(reports, billed, DEFAULT_ACTOR_MEMORY_MB, billed, LEGACY_ACTOR_MEMORY_MB)
    actors = [r["actors_launched"] for r in reports]
    print(f"{len(reports)} rounds of make demo's job (actors {actors}), {elapsed:.0f} s; modelled cloud bill in USD:")
    print(f"| phase | old: p3.2xlarge, {LEGACY_ACTOR_MEMORY_MB} MB on a full vCPU | new: c6i.large, "
          f"{DEFAULT_ACTOR_MEMORY_MB} MB | new prices, {LEGACY_ACTOR_MEMORY_MB} MB at "
          f"{LEGACY_ACTOR_MEMORY_MB / LAMBDA_FULL_VCPU_MB:.2f} vCPU |")
    print("|---|---:|---:|---:|")
    for phase in sorted(set(old) | set(new), key=lambda p: (p == "total", -old.get(p, 0.0))):
        print(f"| {phase} | {old.get(phase, 0.0):.6f} | {new.get(phase, 0.0):.6f} | {share.get(phase, 0.0):.6f} |")
    print(json.dumps({"benchmark": "demo_bill", "rounds": len(reports), "new_usd": round(new["total"], 8),
                      "reference_old_usd": round(old["total"], 8), "ratio": round(new["total"] / old["total"], 4),
                      "new_phases_usd": {k: round(v, 8) for k, v in new.items()},
                      "old_phases_usd": {k: round(v, 8) for k, v in old.items()},
                      "new_prices_1024mb_usd": round(share["total"], 8),
                      "final_eval_return": reports[-1]["eval_return"]}))


if __name__ == "__main__":
    main()
