"""Stellaris mode vs the central learner: Hopper-v5 PPO through the real local system.

One local system (Redis, the Lambda endpoint hosting nitro-actor and nitro-learner, detector,
scaler, learner) runs a short warm-up job (so both measured jobs find warm actors), then the
same job twice: learner_mode "central" and learner_mode "stellaris", with the same fixed actor
count, steps per actor, rounds (so the same env-step budget), seed and detector. Figures, as
ratios stellaris / central measured in this run: job wall time, final deterministic eval return
(mean over the last two rounds' evaluations, which damps Hopper's episode-to-episode noise) and
total cost from the scaler's ledger (learner server time + actor functions + learner functions).

On one machine the serverless learners share the CPU cores with the actors, the detector and the
parameter service, so the wall-time figure measures the asynchronous pipeline, not the extra
hardware a real Lambda deployment adds. The last line is one JSON object.
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

ROUNDS, ACTORS, STEPS, EVAL_EPISODES, SEED = 20, 8, 256, 3, 0


def spec(mode: str, rounds: int = ROUNDS, eval_episodes: int = EVAL_EPISODES) -> dict:
    return {"env_id": "Hopper-v5", "preset": "tuned", "rounds": rounds, "steps_per_actor": STEPS,
            "eval_episodes": eval_episodes, "budget_usd": 10.0, "seed": SEED, "learner_mode": mode,
            "scaler": {"policy": "fixed", "fixed_actors": ACTORS, "i_min": 1, "i_max": ACTORS},
            "stellaris": {"max_learners": ACTORS}}


def run(client: NitroClient, mode: str, **kw) -> dict:
    t0 = time.time()
    job = client.start_training(spec(mode, **kw))
    reports = [r.proto for r in client.watch(job.job_id)]
    wall = time.time() - t0
    status = client.get(job.job_id)
    if status.state_name != "SUCCEEDED":
        raise SystemExit(f"{mode} job {job.job_id} ended {status.state_name}: {status.message}")
    last = reports[-2:]
    out = {"wall_s": wall, "eval_return": sum(r.eval_return for r in last) / len(last),
           "final_eval_return": reports[-1].eval_return, "cost_usd": reports[-1].total_cost_usd,
           "env_steps": reports[-1].total_env_steps, "rounds": len(reports),
           "round_s": [round(r.round_seconds, 2) for r in reports]}
    if mode == "stellaris":
        produced = sum(r.gradients_produced for r in reports)
        out.update(gradients_produced=produced, gradients_applied=sum(r.gradients_applied for r in reports),
                   gradients_dropped=sum(r.gradients_dropped for r in reports),
                   learner_functions_failed=sum(r.learner_functions_failed for r in reports),
                   mean_staleness=sum(r.mean_staleness * r.gradients_produced for r in reports) / max(produced, 1))
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        system = LocalSystem(state_dir=tmp, concurrency=ACTORS).start()
        try:
            with NitroClient(system.learner_address) as client:
                run(client, "central", rounds=1, eval_episodes=1)  # warm the actor workers for both jobs
                central = run(client, "central")
                stellaris = run(client, "stellaris")
        finally:
            system.stop()
    assert central["env_steps"] == stellaris["env_steps"] == ROUNDS * ACTORS * STEPS
    ratios = {"wall_time": stellaris["wall_s"] / central["wall_s"],
              "eval_return": stellaris["eval_return"] / central["eval_return"] if central["eval_return"] else None,
              "cost": stellaris["cost_usd"] / central["cost_usd"]}
    print(f"Hopper-v5 PPO, {ACTORS} actors x {STEPS} steps x {ROUNDS} rounds = {central['env_steps']} env steps each")
    for name, r in (("central", central), ("stellaris", stellaris)):
        print(f"  {name:>9}: wall {r['wall_s']:6.1f} s  eval {r['eval_return']:7.1f}  cost ${r['cost_usd']:.5f}  "
              f"rounds {r['round_s']}")
    print(f"  stellaris updates: {stellaris['gradients_produced']} produced, {stellaris['gradients_applied']} applied, "
          f"{stellaris['gradients_dropped']} dropped, mean staleness {stellaris['mean_staleness']:.2f}")
    print("ratios stellaris / central: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items() if v is not None))
    print(json.dumps({"benchmark": "stellaris", "env": "Hopper-v5", "algo": "ppo", "actors": ACTORS,
                      "steps_per_actor": STEPS, "rounds": ROUNDS, "env_steps": central["env_steps"],
                      "central": {k: (round(v, 5) if isinstance(v, float) else v) for k, v in central.items()},
                      "stellaris": {k: (round(v, 5) if isinstance(v, float) else v) for k, v in stellaris.items()},
                      "ratio_wall_time": round(ratios["wall_time"], 4),
                      "ratio_eval_return": None if ratios["eval_return"] is None else round(ratios["eval_return"], 4),
                      "ratio_cost": round(ratios["cost"], 4)}))


if __name__ == "__main__":
    main()
