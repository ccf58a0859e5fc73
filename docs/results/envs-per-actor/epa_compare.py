"""envs_per_actor 1 vs N at equal env steps: PPO `tuned` on Hopper-v5, in process (issue 18 item 1).

Mirrors the on-policy round: 8 warm actors (samplers keep their envs across rounds), each samples
512 steps per round with the published policy's numpy runner and its own seeded rng, the learner
updates on the 8 batches, then folds the batch into the observation statistics. Final: 10
deterministic evaluation episodes on seeds 10_000..10_009. One process per (config, seed).
Usage, from the repository root: python docs/results/envs-per-actor/epa_compare.py OUT_JSON ROUNDS SEEDS
ENVS[,ENVS...] [WORKERS] [FIRST_SEED]. hopper-ppo-tuned-205k.json: `... 50 10 1,16 16 0` and `... 50 10 1,16 16 10`.
"""
import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, ".")

ENV, ACTORS, STEPS = "Hopper-v5", 8, 512


def run(args):
    envs, seed, rounds = args
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from nitro.algos.ppo import PPOLearner
    from nitro.config import ppo_config
    from nitro.policy.envs import env_spaces
    from nitro.policy.inference import PolicyRunner
    from nitro.policy.models import spec_for_spaces
    from nitro.policy.rollout import evaluate, make_sampler

    cfg = ppo_config("tuned")
    spec = spec_for_spaces(*env_spaces(ENV), hidden_sizes=cfg.hidden_sizes, activation=cfg.activation,
                           obs_norm=cfg.obs_norm, init_log_std=cfg.init_log_std)
    learner = PPOLearner(spec, cfg, seed=seed)
    samplers = [make_sampler(ENV, seed * 1000 + a, None, envs) for a in range(ACTORS)]
    t0, curve = time.time(), []
    for k in range(rounds):
        runner = PolicyRunner.from_doc({"spec": spec, "state": learner.policy.numpy_state(), "version": k})
        batches = [s.sample(runner, STEPS, np.random.default_rng([seed, k, a])) for a, s in enumerate(samplers)]
        learner.update(batches)
        learner.policy.update_obs_stats(np.concatenate([b["obs"] for b in batches]))
        rets = [r for b in batches for r in b["episode_returns"]]
        curve.append(float(np.mean(rets)) if rets else float("nan"))
    runner = PolicyRunner.from_doc({"spec": spec, "state": learner.policy.numpy_state(), "version": rounds})
    final = evaluate(runner, ENV, 10, seed=10_000)
    return {"envs": envs, "seed": seed, "rounds": rounds, "env_steps": rounds * ACTORS * STEPS,
            "final_return": float(np.mean(final)), "episodes": [float(x) for x in final],
            "train_curve": curve, "seconds": time.time() - t0}


if __name__ == "__main__":
    from multiprocessing import get_context

    out, rounds, seeds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    envs_list = [int(x) for x in sys.argv[4].split(",")]
    workers = int(sys.argv[5]) if len(sys.argv) > 5 else os.cpu_count()
    first = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    jobs = [(e, s, rounds) for s in range(first, first + seeds) for e in envs_list]
    results = []
    with get_context("spawn").Pool(workers) as pool:
        for r in pool.imap_unordered(run, jobs):
            results.append(r)
            print(f"envs {r['envs']:3d} seed {r['seed']:2d}: final {r['final_return']:8.1f} "
                  f"({r['seconds']:.0f} s)", flush=True)
            with open(out, "w") as f:
                json.dump(results, f)
