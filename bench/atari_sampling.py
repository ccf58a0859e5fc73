"""Actor sampling throughput on ALE/Qbert-v5 with Atari preprocessing and the paper's CNN.

Figure: env steps/s of the actor handler's sampling loop (nitro.policy.rollout.Sampler with
the PolicyRunner's batch-1 CNN inference for actor and critic, full batch
bookkeeping). Reference, same run: the same preprocessed environment (grayscale
84x84, frame skip 4, 3 stacked frames) stepped with random actions drawn up front.
Target ratio >= 0.5. Both run single-threaded, as an actor function does.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core, like a 1 GB Lambda actor; set before numpy loads
os.environ.setdefault("OMP_NUM_THREADS", "1")

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from nitro.policy.envs import make_env  # noqa: E402
from nitro.policy.inference import PolicyRunner  # noqa: E402
from nitro.policy.models import Policy, spec_for_spaces  # noqa: E402
from nitro.policy.rollout import Sampler  # noqa: E402

ENV, STEPS, REPEATS, TARGET = "ALE/Qbert-v5", 1000, 5, 0.5


def raw_rate(env) -> float:
    actions = np.random.default_rng(0).integers(0, env.action_space.n, STEPS)
    t = time.perf_counter()
    for a in actions:
        _, _, term, trunc, _ = env.step(int(a))
        if term or trunc:
            env.reset()
    return STEPS / (time.perf_counter() - t)


def actor_rate(sampler: Sampler, runner: PolicyRunner, rng: np.random.Generator) -> float:
    t = time.perf_counter()
    sampler.sample(runner, STEPS, rng)
    return STEPS / (time.perf_counter() - t)


def main() -> None:
    env = make_env(ENV, seed=0)
    sampler = Sampler(ENV, seed=0)
    spec = spec_for_spaces(sampler.env.observation_space, sampler.env.action_space)
    runner = PolicyRunner(spec, Policy(spec).numpy_state(), 0)
    rng = np.random.default_rng(0)
    raw_rate(env), actor_rate(sampler, runner, rng)  # warm caches and lazy imports
    raw, actor = [], []
    for _ in range(REPEATS):  # interleave so machine noise hits both alike
        raw.append(raw_rate(env))
        actor.append(actor_rate(sampler, runner, rng))
    raw_med, actor_med = float(np.median(raw)), float(np.median(actor))
    ratio = actor_med / raw_med
    print(f"raw random-action {ENV} (preprocessed): {raw_med:,.0f} steps/s (median of {REPEATS} x {STEPS})")
    print(f"actor sampling loop, CNN actor + critic: {actor_med:,.0f} steps/s "
          f"({1e3 / actor_med - 1e3 / raw_med:.3f} ms/step on top of the env)")
    print(f"ratio {ratio:.3f} (target >= {TARGET})")
    print(json.dumps({"benchmark": "atari_sampling", "env": ENV, "obs_shape": list(spec.obs_shape),
                      "actor_steps_per_s": round(actor_med, 1), "reference_raw_steps_per_s": round(raw_med, 1),
                      "ratio": round(ratio, 4), "target_ratio": TARGET, "meets_target": ratio >= TARGET}))


if __name__ == "__main__":
    main()
