"""Round wall time of IMPACT vs PPO at the same actor count on Hopper-v5, through the full local system.

IMPACT learns while the next round's actors sample, PPO waits for them; the
figure is mean IMPACT round time / mean PPO round time (lower is better),
measured in the same run on the same machine.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nitro.client.sdk import NitroClient  # noqa: E402
from nitro.local.system import LocalSystem  # noqa: E402

ENV, ACTORS, STEPS, ROUNDS = "Hopper-v5", 8, 256, 8


def rounds_for(client: NitroClient, algo: str) -> list:
    spec = {"env_id": ENV, "algo": algo, "preset": "tuned", "rounds": ROUNDS, "steps_per_actor": STEPS,
            "eval_episodes": 1, "budget_usd": 20.0, "seed": 0,
            "scaler": {"policy": "fixed", "fixed_actors": ACTORS, "i_min": 1, "i_max": ACTORS}}
    job = client.start_training(spec)
    reports = list(client.watch(job.job_id))
    status = client.get(job.job_id)
    assert status.state_name == "SUCCEEDED", status.message
    return reports


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        system = LocalSystem(state_dir=tmp, concurrency=ACTORS).start()
        try:
            with NitroClient(system.learner_address) as client:
                ppo = rounds_for(client, "ppo")
                impact = rounds_for(client, "impact")
        finally:
            system.stop()
    # The first round of each has no overlap yet (nothing to learn from while it samples): skip it.
    t_ppo = statistics.fmean(r.round_seconds for r in ppo[1:])
    t_imp = statistics.fmean(r.round_seconds for r in impact[1:])
    ratio = t_imp / t_ppo
    print(f"{ENV}, {ACTORS} actors x {STEPS} steps, {ROUNDS} rounds each")
    print(f"  PPO    round {t_ppo:.2f} s, final eval {ppo[-1].eval_return:.1f}")
    print(f"  IMPACT round {t_imp:.2f} s, final eval {impact[-1].eval_return:.1f}")
    print(f"  IMPACT / PPO round time: {ratio:.3f}")
    print(json.dumps({"benchmark": "offpolicy_round", "env": ENV, "actors": ACTORS, "steps_per_actor": STEPS,
                      "impact_round_s": round(t_imp, 3), "reference_ppo_round_s": round(t_ppo, 3),
                      "ratio": round(ratio, 3), "impact_faster": ratio < 1.0}))


if __name__ == "__main__":
    main()
