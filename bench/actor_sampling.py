"""Actor sampling throughput on Hopper-v5 with the 2x256 Tanh policy.

Figure: env steps/s of the actor handler's sampling loop (nitro.policy.rollout.Sampler,
numpy policy inference, full batch bookkeeping). Reference, same run: raw
Hopper-v5 with random actions. Target ratio >= 0.60.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from nitro.policy.envs import make_env  # noqa: E402
from nitro.policy.inference import PolicyRunner  # noqa: E402
from nitro.policy.models import Policy, spec_for_spaces  # noqa: E402
from nitro.policy.rollout import Sampler  # noqa: E402

ENV, STEPS, REPEATS, TARGET = "Hopper-v5", 4096, 5, 0.60


def raw_rate() -> float:
    env = make_env(ENV, seed=0)
    env.reset(seed=0)
    # Actions drawn up front so the reference is the environment's own step rate
    # (gymnasium's action_space.sample() alone costs more than our policy forward).
    space = env.action_space
    actions = np.random.default_rng(0).uniform(space.low, space.high, (STEPS, *space.shape)).astype(space.dtype)
    t = time.perf_counter()
    for a in actions:
        _, _, term, trunc, _ = env.step(a)
        if term or trunc:
            env.reset()
    return STEPS / (time.perf_counter() - t)


def actor_rate() -> float:
    sampler = Sampler(ENV, seed=0)
    spec = spec_for_spaces(sampler.env.observation_space, sampler.env.action_space, obs_norm=True)
    runner = PolicyRunner(spec, Policy(spec).numpy_state(), 0)
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    sampler.sample(runner, STEPS, rng)
    return STEPS / (time.perf_counter() - t)


def main() -> None:
    raw, actor = [], []
    actor_rate(), raw_rate()  # warm caches and lazy imports
    for _ in range(REPEATS):  # interleave so machine noise hits both alike
        raw.append(raw_rate())
        actor.append(actor_rate())
    raw_med, actor_med = float(np.median(raw)), float(np.median(actor))
    ratio = actor_med / raw_med
    print(f"raw random-action {ENV}: {raw_med:,.0f} steps/s (median of {REPEATS} x {STEPS})")
    print(f"actor sampling loop, 2x256 tanh policy: {actor_med:,.0f} steps/s")
    print(f"ratio {ratio:.3f} (target >= {TARGET})")
    print(json.dumps({"benchmark": "actor_sampling", "env": ENV, "actor_steps_per_s": round(actor_med, 1),
                      "reference_raw_steps_per_s": round(raw_med, 1), "ratio": round(ratio, 4),
                      "target_ratio": TARGET, "meets_target": ratio >= TARGET}))


if __name__ == "__main__":
    main()
