"""This system vs RLlib's PPO on Hopper-v5, same machine, same run (optional: needs Ray in its own environment).

Both: 2x256 Tanh actor and critic (RLlib: vf_share_layers=False), 4,096 env steps per update (ours:
fixed:16 actors x 256 steps, as bench/vs_sb3.py, whose `run_ours` this reuses), 10 epochs, minibatch 256,
lr 3e-4, gamma 0.99, lambda 0.95, clip 0.2, value coeff 0.5, grad clip 0.5, no KL term, no value clipping, no
observation normalisation, 24 updates. RLlib runs its new API stack with the sampling it is fastest with on
this 2-core machine (measured 2026-11-27: 2 env runners x 8 vectorised envs, 1.35 s an update, against 2.3 s
with 2 x 1 and 3.4 s sampling in the driver); its wall time starts after `build_algo()`, as SB3's starts
after its model is built. Final return: 5 deterministic episodes (the policy's mean action, clipped to the
action space) on seeds 10,000 + i, as for ours. Figure: the median over PAIRS same-run pairs of the ratio of
env steps/s (ours / RLlib); target >= 5 (issue 18, optional). The final-return ratio is printed beside it.

RLlib runs in a separate Python environment (Ray pins its own gymnasium); point NITRO_RLLIB_PYTHON at its
interpreter, e.g.:
    python3 -m venv /tmp/rayenv && /tmp/rayenv/bin/pip install torch==2.13.0 "ray[rllib]" "gymnasium[mujoco]"
    NITRO_RLLIB_PYTHON=/tmp/rayenv/bin/python .venv/bin/python bench/vs_rllib.py
Without it the benchmark says so and its JSON line carries "skipped". NITRO_BENCH_PAIRS sets the pairs (3).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TARGET = 5.0
ENV_RUNNERS, ENVS_PER_RUNNER = 2, 8


def rllib_worker(seed: int, env_id: str, steps_per_update: int, updates: int) -> dict:
    """One RLlib run (in the Ray environment): {"wall_s", "steps", "eval_return"}."""
    import time

    import gymnasium as gym
    import numpy as np
    import ray
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        config = (
            PPOConfig().environment(env_id)
            .env_runners(num_env_runners=ENV_RUNNERS, num_envs_per_env_runner=ENVS_PER_RUNNER)
            .training(train_batch_size_per_learner=steps_per_update, minibatch_size=256, num_epochs=10, lr=3e-4,
                      gamma=0.99, lambda_=0.95, clip_param=0.2, vf_loss_coeff=0.5, grad_clip=0.5, entropy_coeff=0.0,
                      use_kl_loss=False, kl_coeff=0.0, vf_clip_param=float("inf"))
            .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[256, 256], fcnet_activation="tanh",
                                                       vf_share_layers=False))
            .debugging(seed=seed))
        algo = config.build_algo()
        t0 = time.perf_counter()
        for _ in range(updates):
            result = algo.train()
        wall = time.perf_counter() - t0
        steps = int(result["env_runners"]["num_env_steps_sampled_lifetime"])
        module = algo.get_module()
        env = gym.make(env_id)
        low, high = env.action_space.low, env.action_space.high
        returns = []
        for ep in range(5):
            obs, _ = env.reset(seed=10_000 + ep)
            done, total = False, 0.0
            while not done:
                with torch.no_grad():
                    out = module.forward_inference({"obs": torch.as_tensor(obs[None], dtype=torch.float32)})
                mean = out["action_dist_inputs"][0, :env.action_space.shape[0]].numpy()  # (mean, log_std)
                obs, r, term, trunc, _ = env.step(np.clip(mean, low, high))
                total += float(r)
                done = term or trunc
            returns.append(total)
        algo.stop()
        return {"wall_s": wall, "steps": steps, "eval_return": float(np.mean(returns))}
    finally:
        ray.shutdown()


def run_rllib(python: str, seed: int, env_id: str, steps_per_update: int, updates: int) -> dict:
    proc = subprocess.run([python, __file__, "--rllib-worker", str(seed), env_id, str(steps_per_update), str(updates)],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"the RLlib run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    python = os.environ.get("NITRO_RLLIB_PYTHON", "")
    if not python or not Path(python).exists():
        print("RLlib is not set up: set NITRO_RLLIB_PYTHON to a Python with ray[rllib] (see this file's docstring)")
        print(json.dumps({"benchmark": "vs_rllib", "skipped": "NITRO_RLLIB_PYTHON is not set to a Python with Ray",
                          "target_ratio": TARGET}))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import vs_sb3
    from vs_sb3 import ACTORS, ENV, PAIRS, ROUNDS, STEPS

    pairs, med = vs_sb3.run_pairs(lambda seed: run_rllib(python, seed, ENV, ACTORS * STEPS, ROUNDS), "rllib", "RLlib")
    print(f"{ENV}, {ACTORS * STEPS * ROUNDS:,} env steps a run; RLlib {ENV_RUNNERS} env runners x {ENVS_PER_RUNNER} "
          f"envs; medians of {PAIRS} pairs: speed ratio {med['ratio']:.2f} (target >= {TARGET}), final-return ratio "
          f"{med['return_ratio']:.2f}")
    print(json.dumps({"benchmark": "vs_rllib", "env": ENV, "env_steps": ACTORS * STEPS * ROUNDS, "pairs": PAIRS,
                      "steps_per_s": round(med["steps_per_s"], 1),
                      "reference_rllib_steps_per_s": round(med["rllib_steps_per_s"], 1), "ratio": round(med["ratio"], 3),
                      "final_return": round(med["final_return"], 1),
                      "rllib_final_return": round(med["rllib_final_return"], 1),
                      "return_ratio": round(med["return_ratio"], 3),
                      "rllib_sampling": {"env_runners": ENV_RUNNERS, "envs_per_env_runner": ENVS_PER_RUNNER},
                      "per_pair": [{k: round(v, 3) for k, v in p.items()} for p in pairs],
                      "target_ratio": TARGET, "meets_target": med["ratio"] >= TARGET}))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rllib-worker":
        seed, env_id, steps, updates = int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(rllib_worker(seed, env_id, steps, updates)))
    else:
        main()
