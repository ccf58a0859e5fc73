"""Actor sampling throughput on ALE/Qbert-v5 with Atari preprocessing and the paper's CNN,
swept over envs_per_actor.

Figure: env steps/s of the actor handler's sampling path (nitro.policy.rollout.make_sampler)
at the best envs_per_actor: for 1 env the Sampler with the PolicyRunner's batch-1
numpy CNN actor, the critic batched over the rollout afterwards; for N > 1 the lockstep
VecSampler with one fused torch actor-critic CNN forward per step (actions and values
together; only truncations' final observations and the envs' next observations take a
separate critic pass). Reference, same run: one preprocessed environment (grayscale
84x84, frame skip 4, 3 stacked frames) stepped with random actions drawn up front.
For N > 1 the envs are ALE's C++ vector env (nitro.policy.ale_vector, one thread), which the sampling
path uses for Atari ids. Target ratio >= 0.75. Also measured at the largest N of the sweep (printed and in
the JSON; not the figure): the sampler of an IMPACT job, whose policy versions say `behaviour_values` off, so
no per-step critic; the same VecSampler on N of make_env's Python envs (NITRO_ALE_VECTOR=0, the path before
the vector env); and the bare vector env stepping N envs with random actions, the C++ env's own rate, to
which the actor is also compared.
All single-threaded, as an actor function runs. Measurements are interleaved
(round-robin, median of REPEATS); rates are steps per second of the process's CPU
time (what a Lambda actor with its own vCPU is billed for; stable on a loaded
machine), wall-clock rates beside them (the figure with --clock wall).
The default sweep stops at 16: the scaler runs at most steps_per_actor // MIN_STEPS_PER_ENV
(= 32) envs per actor, 16 at the default 512 steps (MAX_ENVS_PER_ACTOR, 256, is only the
spec's bound); a larger N is marked as beyond that cap (measure it with --steps 1024 or more).
Usage: bench/atari_sampling.py [--envs 1,2,4,8,16] [--steps 512] [--repeats 7] [--clock cpu|wall]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core, like a 1 GB Lambda actor; set before numpy loads
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from nitro.contracts import MIN_STEPS_PER_ENV  # noqa: E402
from nitro.policy.ale_vector import ALEVecSampler  # noqa: E402
from nitro.policy.envs import make_env  # noqa: E402
from nitro.policy.inference import PolicyRunner  # noqa: E402
from nitro.policy.models import Policy, spec_for_spaces  # noqa: E402
from nitro.policy.rollout import VecSampler, make_sampler  # noqa: E402

ENV, TARGET = "ALE/Qbert-v5", 0.75


def raw_steps(env, steps: int):
    actions = np.random.default_rng(0).integers(0, env.action_space.n, steps)

    def run():
        for a in actions:
            _, _, term, trunc, _ = env.step(int(a))
            if term or trunc:
                env.reset()
    return run


def vector_steps(vec, steps: int):
    n = vec.num_envs
    actions = np.random.default_rng(0).integers(0, vec.single_action_space.n, (steps // n, n))

    def run():
        for a in actions:
            vec.step(a)
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", default="1,2,4,8,16")
    ap.add_argument("--steps", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="which rates the figure uses")
    args = ap.parse_args()
    sweep = [int(x) for x in args.envs.split(",")]
    steps, repeats = args.steps, args.repeats
    env = make_env(ENV, seed=0)
    env.reset(seed=0)
    spec = spec_for_spaces(env.observation_space, env.action_space)
    state = Policy(spec).numpy_state()
    runner = PolicyRunner(spec, state, 0)
    lean = PolicyRunner(spec, state, 0, behaviour_values=False)  # an IMPACT job's actors: no per-step values
    n_lean = max(sweep)
    samplers = {n: make_sampler(ENV, 0, None, n) for n in sweep}
    rngs = {n: np.random.default_rng(n) for n in sweep}
    tasks = {"raw": raw_steps(env, steps)}
    for n in sweep:
        tasks[f"actor_{n}"] = lambda n=n: samplers[n].sample(runner, steps, rngs[n])
    lean_sampler, lean_rng = make_sampler(ENV, 0, None, n_lean), np.random.default_rng(n_lean)
    tasks["no_values"] = lambda: lean_sampler.sample(lean, steps, lean_rng)
    python_envs, python_rng = VecSampler(ENV, n_lean, seed=0), np.random.default_rng(n_lean)
    tasks["python_envs"] = lambda: python_envs.sample(runner, steps, python_rng)
    vector = ALEVecSampler(ENV, n_lean, seed=0)
    tasks["vector_env"] = vector_steps(vector.vec, steps)
    for fn in tasks.values():  # warm caches and lazy imports
        fn()
    rates = {c: {k: [] for k in tasks} for c in ("cpu", "wall")}
    load_before = os.getloadavg()
    for _ in range(repeats):  # interleave so machine noise hits all alike
        for name, fn in tasks.items():
            c, w = time.process_time(), time.perf_counter()
            fn()
            c, w = time.process_time() - c, time.perf_counter() - w
            rates["cpu"][name].append(steps / max(c, 1e-9))
            rates["wall"][name].append(steps / w)
    med = {c: {k: float(np.median(v)) for k, v in r.items()} for c, r in rates.items()}
    load_after = os.getloadavg()
    cpu, wall = med["cpu"], med["wall"]
    print(f"load average {tuple(round(x, 2) for x in load_before)} -> {tuple(round(x, 2) for x in load_after)} "
          f"({os.cpu_count()} CPUs); medians of {repeats} interleaved runs of {steps} steps; steps/s of CPU time "
          f"[wall clock]")
    print(f"raw random-action {ENV} (preprocessed): {cpu['raw']:,.0f} [{wall['raw']:,.0f}] steps/s")
    cap = max(1, steps // MIN_STEPS_PER_ENV)  # the most envs the scaler gives an actor of `steps` steps
    for n in sweep:
        k = f"actor_{n}"
        print(f"actor sampling path, envs_per_actor={n:3d}: {cpu[k]:7,.0f} [{wall[k]:7,.0f}] steps/s  ratio "
              f"{cpu[k] / cpu['raw']:.3f} [{wall[k] / wall['raw']:.3f}]  "
              f"({1e3 / cpu[k] - 1e3 / cpu['raw']:.3f} ms/step on top of the env)"
              + (f"  [beyond the scaler's cap of {cap} envs at {steps} steps]" if n > cap else ""))
    fig = med[args.clock]
    best = max(sweep, key=lambda n: fig[f"actor_{n}"])
    ratio = fig[f"actor_{best}"] / fig["raw"]
    print(f"best envs_per_actor={best}: ratio {ratio:.3f} ({args.clock} clock; target >= {TARGET})")
    print(f"without per-step values (an IMPACT job's actors), envs_per_actor={n_lean}: {cpu['no_values']:,.0f} "
          f"[{wall['no_values']:,.0f}] steps/s  ratio {cpu['no_values'] / cpu['raw']:.3f} "
          f"[{wall['no_values'] / wall['raw']:.3f}] against {cpu[f'actor_{n_lean}'] / cpu['raw']:.3f} with them")
    print(f"envs_per_actor={n_lean} on make_env's Python envs (NITRO_ALE_VECTOR=0): {cpu['python_envs']:,.0f} "
          f"[{wall['python_envs']:,.0f}] steps/s  ratio {cpu['python_envs'] / cpu['raw']:.3f}")
    print(f"the bare vector env, {n_lean} envs, random actions: {cpu['vector_env']:,.0f} [{wall['vector_env']:,.0f}] "
          f"steps/s; the actor at {n_lean} envs is {cpu[f'actor_{n_lean}'] / cpu['vector_env']:.3f} of it")
    print(json.dumps({
        "benchmark": "atari_sampling", "env": ENV, "obs_shape": list(spec.obs_shape), "clock": args.clock,
        "figure": round(fig[f"actor_{best}"], 1), "reference": round(fig["raw"], 1), "ratio": round(ratio, 4),
        "best_envs_per_actor": best,
        "ratio_by_envs_per_actor": {n: round(fig[f"actor_{n}"] / fig["raw"], 4) for n in sweep},
        "ratio_without_behaviour_values": {n_lean: round(fig["no_values"] / fig["raw"], 4)},
        "ratio_on_python_envs": {n_lean: round(fig["python_envs"] / fig["raw"], 4)},
        "ratio_to_bare_vector_env": {n_lean: round(fig[f"actor_{n_lean}"] / fig["vector_env"], 4)},
        "cpu_steps_per_s": {k: round(v, 1) for k, v in cpu.items()},
        "wall_steps_per_s": {k: round(v, 1) for k, v in wall.items()},
        "steps": steps, "scaler_max_envs_per_actor": cap, "repeats": repeats, "target_ratio": TARGET, "meets_target": ratio >= TARGET,
        "loadavg": [round(x, 2) for x in load_after]}))


if __name__ == "__main__":
    main()
