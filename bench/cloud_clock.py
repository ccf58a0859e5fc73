"""Modelled cloud clock vs this machine's clock for one job, quiet and beside a CPU hog.

The same reproducible Hopper-v5 PPO job (fixed actors, so both runs do the same
work) runs through the real local system twice: on a quiet machine and beside
one busy-loop process per core. Figure: the relative difference of the modelled
cloud cost between the two runs; reference in the same run: the relative
difference of this machine's (wall-time) cost. Target: cloud within 10%.
A first short job warms the services up so first-call costs stay out of both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nitro.client.sdk import NitroClient  # noqa: E402
from nitro.local.system import LocalSystem  # noqa: E402

ROUNDS = int(os.environ.get("NITRO_BENCH_ROUNDS", "4"))
ACTORS, STEPS, TARGET = 16, 512, 0.10
SPEC = {"env_id": "Hopper-v5", "preset": "tuned", "rounds": ROUNDS, "steps_per_actor": STEPS, "eval_episodes": 5,
        "budget_usd": 10.0, "seed": 0, "reproducible": True,
        "scaler": {"policy": "fixed", "fixed_actors": ACTORS, "i_min": 1, "i_max": ACTORS}}


def run(client, spec: dict) -> dict:
    t0 = time.time()
    reports = list(client.watch(client.start_training(spec).job_id))
    last = reports[-1]
    return {"rounds": len(reports), "wall_s": round(time.time() - t0, 2),
            "cloud_seconds": round(sum(r.cloud_round_seconds for r in reports), 3),
            "cloud_usd": last.cloud_total_cost_usd, "machine_usd": last.total_cost_usd,
            "eval_return": last.eval_return}


def main() -> None:
    hogs_n = os.cpu_count() or 2
    with tempfile.TemporaryDirectory() as state:
        system = LocalSystem(state_dir=state, concurrency=ACTORS).start()
        try:
            with NitroClient(system.learner_address) as client:
                run(client, dict(SPEC, rounds=1))
                quiet = run(client, SPEC)
                hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs_n)]
                try:
                    loaded = run(client, SPEC)
                finally:
                    for h in hogs:
                        h.kill()
                        h.wait()
        finally:
            system.stop()
    cloud_diff = loaded["cloud_usd"] / quiet["cloud_usd"] - 1.0
    machine_diff = loaded["machine_usd"] / quiet["machine_usd"] - 1.0
    print(f"Hopper-v5 PPO, {ROUNDS} rounds, {ACTORS} actors x {STEPS} steps, reproducible; hog: {hogs_n} busy loops")
    for name, r in (("quiet", quiet), ("beside hog", loaded)):
        print(f"  {name:>10}: cloud ${r['cloud_usd']:.5f} ({r['cloud_seconds']:.1f} s modelled), "
              f"this machine ${r['machine_usd']:.5f} ({r['wall_s']:.1f} s wall), final eval {r['eval_return']:.1f}")
    print(f"modelled cloud cost moved {cloud_diff:+.2%} with load; this machine's {machine_diff:+.2%} "
          f"(target |cloud| <= {TARGET:.0%})")
    print(json.dumps({"benchmark": "cloud_clock", "rounds": ROUNDS, "actors": ACTORS, "steps_per_actor": STEPS,
                      "hog_processes": hogs_n, "quiet": quiet, "loaded": loaded,
                      "cloud_relative_difference": round(cloud_diff, 4),
                      "reference_machine_relative_difference": round(machine_diff, 4),
                      "ratio": round(abs(cloud_diff) / abs(machine_diff), 4) if machine_diff else None,
                      "target_cloud_relative_difference": TARGET, "meets_target": abs(cloud_diff) <= TARGET}))


if __name__ == "__main__":
    main()
