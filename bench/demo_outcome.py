"""What `make demo` gives: its job (examples/demo.yaml) on 3 seeds, each finished with a 10-episode evaluation of
its best policy on separate seeds; the interquartile mean of those 30 returns against a random policy's, measured
in the same run.

Issue 42's target: IQM >= 2,000 on Hopper-v5 within about 3 minutes of training on 2 cores. Each seed trains
through the real local system (`nitro train --local`, as `make demo` does), one after the other; run it on a
quiet machine. Prints one line per seed, then one JSON object as the last line.

    .venv/bin/python bench/demo_outcome.py [--seeds 1,2,3] [--config examples/demo.yaml]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from nitro.policy.evaluation import random_returns
from nitro.stats import iqm

ROOT = Path(__file__).resolve().parents[1]
TARGET_IQM = 2000.0
TARGET_SECONDS = 180.0
EVAL_EPISODES = 10
EVAL_SEED = 10_000  # evaluation episodes run on seeds no training or in-training evaluation used


def run_seed(config: Path, seed: int, results: Path) -> dict:
    job_id = f"demo-bench-s{seed}-{int(time.time())}"
    nitro = [sys.executable, "-m", "nitro.client.cli"]
    t0 = time.monotonic()
    subprocess.run([*nitro, "train", "--local", "--config", str(config), "--seed", str(seed), "--job-id", job_id,
                    "--results-dir", str(results), "--no-progress"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    summary = json.loads((results / job_id / "summary.json").read_text())
    out = subprocess.run([*nitro, "eval", str(results / job_id / "best.pt"), "--episodes", str(EVAL_EPISODES),
                          "--seed", str(EVAL_SEED + 100 * seed), "--json"], cwd=ROOT, check=True,
                         capture_output=True, text=True)
    result = json.loads(out.stdout)
    return {"seed": seed, "wall_s": round(wall, 1), "env_steps": summary["total_env_steps"],
            "best_round": summary.get("best_round"), "returns": result["returns"],
            "final": float(np.mean(result["returns"])),
            "cloud_total_cost_usd": summary.get("cloud_total_cost_usd")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--config", type=Path, default=ROOT / "examples" / "demo.yaml")
    args = p.parse_args()
    import yaml

    env_id = yaml.safe_load(args.config.read_text())["env_id"]
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for seed in seeds:
            r = run_seed(args.config, seed, Path(tmp))
            runs.append(r)
            print(f"seed {seed}: final {r['final']:.0f} (mean of {EVAL_EPISODES} episodes of best.pt, round "
                  f"{r['best_round']}), {r['env_steps']} env steps, {r['wall_s']:.0f} s wall (system start to "
                  f"stop), ${r['cloud_total_cost_usd']:.4f} on the cloud clock", flush=True)
    returns = [x for r in runs for x in r["returns"]]
    rand = random_returns(env_id, EVAL_EPISODES, EVAL_SEED)
    figure, reference = iqm(returns), iqm(rand)
    median_wall = float(np.median([r["wall_s"] for r in runs]))
    print(f"IQM {figure:.0f} over {len(returns)} episodes ({len(seeds)} seeds); random policy IQM {reference:.1f}; "
          f"target IQM >= {TARGET_IQM:.0f}: {'met' if figure >= TARGET_IQM else 'NOT met'}; median wall "
          f"{median_wall:.0f} s against ~{TARGET_SECONDS:.0f} s: {'met' if median_wall <= TARGET_SECONDS else 'NOT met'}")
    print(json.dumps({"benchmark": "demo_outcome", "config": str(args.config), "env_id": env_id,
                      "seeds": seeds, "finals": [round(r["final"], 1) for r in runs],
                      "wall_s": [r["wall_s"] for r in runs], "iqm": round(figure, 1),
                      "reference_random_iqm": round(reference, 1), "ratio": round(figure / max(reference, 1e-9), 2),
                      "target_iqm": TARGET_IQM, "target_seconds": TARGET_SECONDS,
                      "median_wall_s": median_wall, "meets_return_target": figure >= TARGET_IQM,
                      "meets_time_target": median_wall <= TARGET_SECONDS}))


if __name__ == "__main__":
    main()
