"""The reference `make demo`'s summary compares against: Stable-Baselines3's PPO as most users run it
(`PPO("MlpPolicy", env)`, every hyperparameter its default) for the demo job's env steps, evaluated as the demo is
(10 deterministic episodes on seeds 10,000-10,009 per training seed), with a random policy's return on the same
episodes measured in the same run.

Writes the reference file `nitro eval --reference` reads (nitro.policy.evaluation.Reference has the format) and prints one
line per seed, then one JSON object as the last line: the SB3 IQM (the figure), the random policy's IQM (its
reference) and their ratio. Returns do not depend on the machine's speed, so this may run beside other work;
it takes about 10 minutes a seed on one core.

    .venv/bin/python bench/sb3_reference.py [--seeds 1,2,3] [--steps 409600] [--env Hopper-v5]
        [--out docs/results/evidence/sb3-ppo-default-hopper-v5.json]   # needs `pip install -e .[bench]`

Each seed's evaluation returns are kept in --cache (results/sb3-reference/ by default) as soon as it finishes,
and a seed already there is not trained again, so an interrupted run resumes. `--run SEED` trains that one seed
into the cache and exits (several at once use several cores); a run without it writes the reference.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EVAL_EPISODES = 10
EVAL_SEED = 10_000  # the demo's evaluation seeds (Makefile: nitro eval --seed 10000)


def evaluate(act, env_id: str) -> list[float]:
    import gymnasium as gym

    env = gym.make(env_id)
    env.action_space.seed(EVAL_SEED)
    out = []
    for ep in range(EVAL_EPISODES):
        obs, _ = env.reset(seed=EVAL_SEED + ep)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs, env))
            total += float(reward)
            done = terminated or truncated
        out.append(total)
    env.close()
    return out


def train_sb3(env_id: str, steps: int, seed: int) -> tuple[list[float], float]:
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO

    torch.set_num_threads(1)
    model = PPO("MlpPolicy", gym.make(env_id), seed=seed, device="cpu", verbose=0)
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps)
    wall = time.perf_counter() - t0
    return evaluate(lambda obs, env: model.predict(obs, deterministic=True)[0], env_id), wall


def seed_returns(cache: Path, env_id: str, steps: int, seed: int) -> list[float]:
    """One seed's evaluation returns: from the cache, else trained now and cached."""
    path = cache / f"{env_id.lower()}-{steps}-s{seed}.json"
    if path.exists():
        returns = json.loads(path.read_text())["returns"]
        print(f"seed {seed}: mean {np.mean(returns):.1f} over {len(returns)} episodes (cached: {path})", flush=True)
        return returns
    returns, wall = train_sb3(env_id, steps, seed)
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"env_id": env_id, "env_steps": steps, "seed": seed, "returns": returns,
                                "train_wall_s": wall}) + "\n")
    print(f"seed {seed}: mean {np.mean(returns):.1f} over {EVAL_EPISODES} episodes, trained in {wall:.0f} s",
          flush=True)
    return returns


def main() -> None:
    from nitro.policy.evaluation import Reference, iqm_interval, write_reference

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="Hopper-v5")
    p.add_argument("--steps", type=int, default=409_600, help="the demo job's env steps (examples/demo.yaml)")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--cache", type=Path, default=ROOT / "results/sb3-reference")
    p.add_argument("--run", type=int, default=None, metavar="SEED", help="train this seed into the cache only")
    args = p.parse_args()
    import stable_baselines3

    if args.run is not None:
        seed_returns(args.cache, args.env, args.steps, args.run)
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    random = evaluate(lambda obs, env: env.action_space.sample(), args.env)
    per_seed = {seed: seed_returns(args.cache, args.env, args.steps, seed) for seed in seeds}
    returns = [r for s in seeds for r in per_seed[s]]
    out = args.out or ROOT / "docs/results/evidence" / f"sb3-ppo-default-{args.env.lower()}.json"
    reference = Reference(f"Stable-Baselines3 {stable_baselines3.__version__} PPO with its default settings",
                          args.env, args.steps, returns, source="docs/results.md#what-make-demo-gives-benchdemo_outcomepy",
                          command=f"python bench/sb3_reference.py --env {args.env} --steps {args.steps} "
                                  f"--seeds {args.seeds}")
    write_reference(out, reference, seeds=seeds, random_returns=random)
    figure, low, high, _ = iqm_interval(returns)
    ref = iqm_interval(random)[0]
    print(json.dumps({"metric": f"sb3_ppo_default_iqm_{args.env}", "figure": round(figure, 1), "ci95": [round(low, 1), round(high, 1)],
                      "reference": "random policy IQM, same episodes", "reference_value": round(ref, 1),
                      "ratio": round(figure / ref, 2) if ref else None, "seeds": seeds,
                      "per_seed_mean": {s: round(float(np.mean(v)), 1) for s, v in per_seed.items()},
                      "env_steps": args.steps, "out": str(out)}))


if __name__ == "__main__":
    main()
