"""Round overhead of the full system at the settings `make demo` ran until 2026-12-03: Hopper-v5 PPO `tuned`, the nitro scaler
with I_min 4 and I_max 16, 512 steps per actor, 3 evaluation episodes, budget $5, seed 1, 80 rounds.

Runs the real local system (Redis, Lambda endpoint, three services), then reads
the learner's phase histograms from /metrics. Figure: the fraction of round wall
time spent outside sampling, SGD and evaluation (invoke + ingest + publish +
detect + plan + bookkeeping) over the whole job. Reference in the same run: the
round wall time itself. Target <= 0.03 (issue 18).

Also printed, from the round reports: the same fraction over the first
EARLY rounds alone. That is the worst case: the detector scores while the
learner evaluates, and early episodes are short (Hopper falls within tens of
steps), so evaluation hides little of the detector's ~11 Hessian-vector
products; and the median of the detector service's Score time per round
against the evaluation it overlaps (what the detector wait is made of).
NITRO_BENCH_ROUNDS shortens the job (e.g. 8 for a quick look); NITRO_BENCH_EVALUATION=learner evaluates on the
learner as every job did before 2026-12-03 (docs/evaluation.md), for a before/after.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nitro.client.sdk import NitroClient  # noqa: E402
from nitro.local.system import LocalSystem  # noqa: E402
from nitro.rpc.metrics import sample_value, scrape  # noqa: E402

# The demo's settings (Makefile `demo`) for a few rounds. The detector scores while the learner evaluates, so
# fewer episodes leave more of the detection on the critical path (NITRO_BENCH_EVAL_EPISODES).
ROUNDS = int(__import__("os").environ.get("NITRO_BENCH_ROUNDS", "80"))
I_MIN, I_MAX, STEPS, BUDGET, SEED, TARGET, EARLY = 4, 16, 512, 5.0, 1, 0.03, 8
EVAL_EPISODES = int(__import__("os").environ.get("NITRO_BENCH_EVAL_EPISODES", "3"))
# Where the evaluation runs (docs/evaluation.md): "functions" (the default since 2026-12-03) or "learner" (before).
EVALUATION = __import__("os").environ.get("NITRO_BENCH_EVALUATION", "functions")
WORK = ("sample", "update", "evaluate")


def phase_sums(port: int) -> tuple[dict[str, float], float, float]:
    fam = scrape(port)
    sums = {}
    for s in fam["nitro_round_phase_seconds"]:
        if s.name == "nitro_round_phase_seconds_sum":
            sums[s.labels["phase"]] = s.value
    wall = sample_value(fam["nitro_round_seconds"], "nitro_round_seconds_sum")
    count = sample_value(fam["nitro_round_seconds"], "nitro_round_seconds_count")
    return sums, wall, count


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        system = LocalSystem(state_dir=tmp, concurrency=I_MAX).start()
        try:
            with NitroClient(system.learner_address) as client:
                spec = {"env_id": "Hopper-v5", "preset": "tuned", "rounds": ROUNDS, "steps_per_actor": STEPS,
                        "eval_episodes": EVAL_EPISODES, "budget_usd": BUDGET, "seed": SEED, "evaluation": EVALUATION,
                        "scaler": {"policy": "nitro", "i_min": I_MIN, "i_max": I_MAX}}
                t0 = time.time()
                job = client.start_training(spec)
                reports = list(client.watch(job.job_id))
                elapsed = time.time() - t0
            sums, wall, count = phase_sums(system.components["learner"].metrics_port)
        finally:
            system.stop()
    work = sum(sums.get(p, 0.0) for p in WORK)
    overhead = wall - work
    fraction = overhead / wall
    early = reports[:EARLY]
    early_wall = sum(r.round_seconds for r in early)
    early_fraction = (early_wall - sum(r.phases.get(p, 0.0) for r in early for p in WORK)) / early_wall
    early_detect = sum(r.phases.get("detect", 0.0) for r in early) / early_wall
    actors = [r.actors_launched for r in reports]
    # What the detector wait is made of: the service's Score time against the evaluation it overlaps.
    score_ms = sorted(r.detector_seconds * 1e3 for r in reports if r.detector_seconds > 0)
    eval_ms = sorted(r.phases.get("evaluate", 0.0) * 1e3 for r in reports)
    median = lambda xs: xs[len(xs) // 2] if xs else 0.0  # noqa: E731
    print(f"{len(reports)} rounds of Hopper-v5 PPO, nitro scaler {I_MIN}-{I_MAX} actors (ran {actors}) x {STEPS} "
          f"steps, {EVAL_EPISODES} evaluation "
          f"episodes per round, {elapsed:.1f} s end to end")
    for phase, secs in sorted(sums.items(), key=lambda kv: -kv[1]):
        print(f"  {phase:>9}: {secs:7.3f} s total, {secs / count:6.3f} s per round ({secs / wall:6.1%})")
    print(f"  unattributed bookkeeping: {wall - sum(sums.values()):.3f} s")
    print(f"  the detector's Score per round: median {median(score_ms):.0f} ms (max {max(score_ms, default=0):.0f}); "
          f"evaluation it overlaps: median {median(eval_ms):.0f} ms")
    print(f"overhead fraction outside sample/update/evaluate: {fraction:.4f} (target <= {TARGET}); first {len(early)} "
          f"rounds alone: {early_fraction:.4f} (detector wait {early_detect:.4f})")
    print(json.dumps({"benchmark": "round_overhead", "rounds": int(count), "i_min": I_MIN, "i_max": I_MAX, "actors": actors,
                      "steps_per_actor": STEPS, "eval_episodes": EVAL_EPISODES, "evaluation": EVALUATION,
                      "cloud_total_cost_usd": reports[-1].cloud_total_cost_usd, "overhead_seconds": round(overhead, 4),
                      "reference_round_wall_seconds": round(wall, 4), "ratio": round(fraction, 4),
                      "phases_seconds": {k: round(v, 4) for k, v in sums.items()},
                      "early_rounds": len(early), "early_ratio": round(early_fraction, 4),
                      "early_detect_ratio": round(early_detect, 4), "final_eval_return": reports[-1].eval_return,
                      "median_score_ms": round(median(score_ms), 1), "median_evaluate_ms": round(median(eval_ms), 1),
                      "target_ratio": TARGET, "meets_target": fraction <= TARGET}))


if __name__ == "__main__":
    main()
