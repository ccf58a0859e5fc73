"""This system vs Stable-Baselines3 PPO on Hopper-v5, same machine, same run.

Both: 2x256 Tanh actor and critic, 4,096 env steps per update (ours: fixed:16
actors x 256 steps), 10 epochs, minibatch 256, lr 3e-4, gamma 0.99, GAE 0.95,
clip 0.2, value coeff 0.5, grad clip 0.5, no observation normalisation (SB3's
default), the same number of env steps. Torch threads: each side's default
(ours 1, SB3 one per core) unless NITRO_BENCH_THREADS=N sets both to N. Ours
runs through the full local system (Redis, Lambda endpoint, three services) and
its wall time includes planning and one evaluation episode per round (no
detector call: a fixed plan reads no score). Final return:
5 deterministic episodes of each final policy. Figure: the median over PAIRS
same-run pairs (ours, then SB3; seeds 0, 1, 2, ...) of the ratio of env steps/s
(ours / SB3); target >= 2.5 (issue 18). Also printed: the median final-return
ratio at equal steps (ours / SB3), which must not fall below parity: speed may
not cost learning. NITRO_BENCH_PAIRS sets the number of pairs (default 3).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

ENV, ACTORS, STEPS, ROUNDS, TARGET = "Hopper-v5", 16, 256, 24, 2.5
PAIRS = int(__import__("os").environ.get("NITRO_BENCH_PAIRS", "3"))
# Torch intra-op threads. Unset: each side with its own default, as a user would run it (our
# learner: 1; SB3: torch's default, one per core). NITRO_BENCH_THREADS=N gives both sides N.
_SET = __import__("os").environ.get("NITRO_BENCH_THREADS")
SB3_THREADS = int(_SET) if _SET else torch.get_num_threads()
OUR_THREADS = int(_SET) if _SET else 1  # learner_svc --torch-threads default
TOTAL = ACTORS * STEPS * ROUNDS


def run_sb3(seed: int) -> dict:
    import gymnasium as gym
    from stable_baselines3 import PPO

    torch.set_num_threads(SB3_THREADS)
    env = gym.make(ENV)
    model = PPO("MlpPolicy", env, n_steps=ACTORS * STEPS, batch_size=256, n_epochs=10, learning_rate=3e-4,
                gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
                policy_kwargs={"net_arch": {"pi": [256, 256], "vf": [256, 256]}, "activation_fn": torch.nn.Tanh},
                seed=seed, device="cpu", verbose=0)
    t0 = time.perf_counter()
    model.learn(total_timesteps=TOTAL)
    wall = time.perf_counter() - t0
    eval_env = gym.make(ENV)
    returns = []
    for ep in range(5):
        obs, _ = eval_env.reset(seed=10_000 + ep)
        done, total = False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, r, term, trunc, _ = eval_env.step(action)
            total += float(r)
            done = term or trunc
        returns.append(total)
    return {"wall_s": wall, "steps": model.num_timesteps, "eval_return": float(np.mean(returns))}


def run_ours(seed: int) -> dict:
    import os

    os.environ["NITRO_TORCH_THREADS"] = str(OUR_THREADS)
    from nitro.client.sdk import NitroClient
    from nitro.local.system import LocalSystem
    from nitro.policy.rollout import evaluate
    from nitro.policy.trained import load_policy

    with tempfile.TemporaryDirectory() as tmp:
        system = LocalSystem(state_dir=tmp, concurrency=ACTORS).start()
        try:
            with NitroClient(system.learner_address) as client:
                spec = {"env_id": ENV, "preset": "tuned", "hyperparameters": {"obs_norm": 0}, "rounds": ROUNDS,
                        "steps_per_actor": STEPS, "eval_episodes": 1, "budget_usd": 50.0, "seed": seed,
                        "scaler": {"policy": "fixed", "fixed_actors": ACTORS, "i_min": 1, "i_max": ACTORS}}
                t0 = time.perf_counter()
                job = client.start_training(spec)
                reports = list(client.watch(job.job_id))
                wall = time.perf_counter() - t0
                status = client.get(job.job_id)
            policy = load_policy(status.checkpoint_path)  # before the state dir goes
        finally:
            system.stop()
    returns = evaluate(policy.runner, ENV, 5, seed=10_000)  # episode i on seed 10_000 + i
    return {"wall_s": wall, "steps": reports[-1].total_env_steps, "eval_return": float(np.mean(returns)),
            "rounds": len(reports), "cost_usd": reports[-1].total_cost_usd}


def run_pairs(run_reference, name: str, label: str) -> tuple[list[dict], dict]:
    """PAIRS same-run pairs (ours, then the reference; seeds 0, 1, ...), each printed as it finishes: the per-pair
    rows and their medians. run_reference(seed) -> {"wall_s", "steps", "eval_return"}, as run_ours; its figures
    go under `{name}_steps_per_s` and `{name}_final_return`."""
    pairs = []
    for seed in range(PAIRS):
        ours, ref = run_ours(seed), run_reference(seed)
        ours_sps, ref_sps = ours["steps"] / ours["wall_s"], ref["steps"] / ref["wall_s"]
        pairs.append({"seed": seed, "steps_per_s": ours_sps, f"{name}_steps_per_s": ref_sps, "ratio": ours_sps / ref_sps,
                      "final_return": ours["eval_return"], f"{name}_final_return": ref["eval_return"],
                      "return_ratio": ours["eval_return"] / ref["eval_return"]})
        print(f"pair {seed}: nitro fixed:{ACTORS} {ours['wall_s']:6.1f} s {ours_sps:6.0f} steps/s return "
              f"{ours['eval_return']:7.1f} | {label} {ref['wall_s']:6.1f} s {ref_sps:6.0f} steps/s return "
              f"{ref['eval_return']:7.1f} | speed ratio {ours_sps / ref_sps:.2f}", flush=True)
    return pairs, {k: float(np.median([p[k] for p in pairs])) for k in pairs[0] if k != "seed"}


def main() -> None:
    pairs, med = run_pairs(run_sb3, "sb3", "SB3")
    print(f"{ENV}, {TOTAL:,} env steps a run, 2x256 tanh, 10 epochs, minibatch 256, torch threads: ours "
          f"{OUR_THREADS}, SB3 {SB3_THREADS}; medians of {PAIRS} pairs: speed ratio {med['ratio']:.2f} "
          f"(target >= {TARGET}), final-return ratio {med['return_ratio']:.2f} (must be >= 1.0)")
    print(json.dumps({"benchmark": "vs_sb3", "env": ENV, "env_steps": TOTAL, "pairs": PAIRS,
                      "steps_per_s": round(med["steps_per_s"], 1),
                      "reference_sb3_steps_per_s": round(med["sb3_steps_per_s"], 1), "ratio": round(med["ratio"], 3),
                      "final_return": round(med["final_return"], 1), "sb3_final_return": round(med["sb3_final_return"], 1),
                      "return_ratio": round(med["return_ratio"], 3),
                      "per_pair": [{k: round(v, 3) for k, v in p.items()} for p in pairs],
                      "torch_threads": OUR_THREADS, "sb3_torch_threads": SB3_THREADS, "target_ratio": TARGET,
                      "meets_target": med["ratio"] >= TARGET, "return_at_parity": med["return_ratio"] >= 1.0}))


if __name__ == "__main__":
    main()
