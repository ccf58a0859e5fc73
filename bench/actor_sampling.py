"""Actor sampling throughput on Hopper-v5 with the 2x256 Tanh policy, swept over envs_per_actor.

Figure: env steps/s of the actor handler's sampling path (nitro.policy.rollout.make_sampler:
the single-env Sampler for 1 env, the lockstep VecSampler with one batched numpy
inference per step for N > 1; full batch bookkeeping) at the best envs_per_actor.
Reference, same run: raw single-env Hopper-v5 with random actions drawn up front.
Target ratio >= 0.90. Also measured at the largest N of the sweep: the sampler of an IMPACT job, whose policy
versions say `behaviour_values` off, so no per-step critic (printed and in the JSON; not the figure). Every measurement is interleaved with the others (round-robin,
median of REPEATS) so machine noise hits them alike; the load average is printed.
Rates are steps per second of the process's CPU time (time.process_time, one thread):
what a Lambda actor with its own vCPU is billed for, and stable on a shared, loaded
machine where wall time mostly measures the wait for a core. Wall-clock rates of the
same runs are printed beside them (and are the figure with --clock wall).

Also measured, for the choice of vector API: N envs stepped with random actions by
our own lockstep loop (what VecSampler does) and by gymnasium's SyncVectorEnv
(autoreset "same-step", the mode that keeps one transition per step).
Usage: bench/actor_sampling.py [--envs 1,2,4,8,16,32] [--steps 2048] [--repeats 11] [--clock cpu|wall]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core, like a Lambda actor; set before numpy loads
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from nitro.policy.envs import make_env  # noqa: E402
from nitro.policy.inference import PolicyRunner  # noqa: E402
from nitro.policy.models import Policy, spec_for_spaces  # noqa: E402
from nitro.policy.rollout import make_sampler  # noqa: E402

ENV, TARGET = "Hopper-v5", 0.90


def raw_steps(env, steps: int):
    # Actions drawn up front so the reference is the environment's own step rate
    # (gymnasium's action_space.sample() alone costs more than our policy forward).
    space = env.action_space
    actions = np.random.default_rng(0).uniform(space.low, space.high, (steps, *space.shape)).astype(space.dtype)

    def run():
        for a in actions:
            _, _, term, trunc, _ = env.step(a)
            if term or trunc:
                env.reset()
    return run


def own_loop_steps(envs: list, steps: int):
    """N envs, random actions, the lockstep loop's per-step work without the policy."""
    n, space = len(envs), envs[0].action_space
    actions = np.random.default_rng(0).uniform(space.low, space.high, (steps // n, n, *space.shape)).astype(space.dtype)
    obs = np.empty((n, *envs[0].observation_space.shape))

    def run():
        for row in actions:
            for i, env in enumerate(envs):
                o, _, term, trunc, _ = env.step(row[i])
                if term or trunc:
                    o, _ = env.reset()
                obs[i] = o
    return run


def sync_vector_steps(venv, steps: int):
    n, space = venv.num_envs, venv.single_action_space
    actions = np.random.default_rng(0).uniform(space.low, space.high, (steps // n, n, *space.shape)).astype(space.dtype)

    def run():
        for row in actions:
            venv.step(row)
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", default="1,2,4,8,16,32")
    ap.add_argument("--steps", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="which rates the figure uses")
    ap.add_argument("--api-envs", type=int, default=8, help="N for the own-loop vs SyncVectorEnv comparison (0: skip)")
    args = ap.parse_args()
    sweep = [int(x) for x in args.envs.split(",")]
    steps, repeats = args.steps, args.repeats

    import gymnasium as gym

    env = make_env(ENV, seed=0)
    env.reset(seed=0)
    spec = spec_for_spaces(env.observation_space, env.action_space, obs_norm=True)
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
    api_n = args.api_envs
    if api_n:
        own_envs = [make_env(ENV, seed=i) for i in range(api_n)]
        for i, e in enumerate(own_envs):
            e.reset(seed=i)
        venv = gym.vector.SyncVectorEnv([lambda: make_env(ENV) for _ in range(api_n)],
                                        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        venv.reset(seed=0)
        tasks["own_loop"] = own_loop_steps(own_envs, steps)
        tasks["sync_vector"] = sync_vector_steps(venv, steps)
    for fn in tasks.values():  # warm caches and lazy imports
        fn()
    rates = {c: {k: [] for k in tasks} for c in ("cpu", "wall")}
    load_before = os.getloadavg()
    for _ in range(repeats):  # interleave so machine noise hits all alike
        for name, fn in tasks.items():
            c, w = time.process_time(), time.perf_counter()
            fn()
            c, w = time.process_time() - c, time.perf_counter() - w
            n_steps = steps - steps % api_n if name in ("own_loop", "sync_vector") else steps
            rates["cpu"][name].append(n_steps / max(c, 1e-9))
            rates["wall"][name].append(n_steps / w)
    med = {c: {k: float(np.median(v)) for k, v in r.items()} for c, r in rates.items()}
    load_after = os.getloadavg()
    print(f"load average {tuple(round(x, 2) for x in load_before)} -> {tuple(round(x, 2) for x in load_after)} "
          f"({os.cpu_count()} CPUs); medians of {repeats} interleaved runs of {steps} steps; steps/s of CPU time "
          f"[wall clock]")
    cpu, wall = med["cpu"], med["wall"]
    print(f"raw random-action {ENV}: {cpu['raw']:,.0f} [{wall['raw']:,.0f}] steps/s")
    for n in sweep:
        k = f"actor_{n}"
        print(f"actor sampling path, envs_per_actor={n:3d}: {cpu[k]:9,.0f} [{wall[k]:9,.0f}] steps/s  "
              f"ratio {cpu[k] / cpu['raw']:.3f} [{wall[k] / wall['raw']:.3f}]")
    if api_n:
        print(f"random actions, {api_n} envs: own lockstep loop {cpu['own_loop']:,.0f} [{wall['own_loop']:,.0f}], "
              f"gymnasium SyncVectorEnv (same-step autoreset) {cpu['sync_vector']:,.0f} [{wall['sync_vector']:,.0f}] "
              f"steps/s: {cpu['sync_vector'] / cpu['own_loop']:.3f}x [{wall['sync_vector'] / wall['own_loop']:.3f}x]")
    fig = med[args.clock]
    best = max(sweep, key=lambda n: fig[f"actor_{n}"])
    ratio = fig[f"actor_{best}"] / fig["raw"]
    print(f"best envs_per_actor={best}: ratio {ratio:.3f} ({args.clock} clock; target >= {TARGET})")
    print(f"without per-step values (an IMPACT job's actors), envs_per_actor={n_lean}: {cpu['no_values']:,.0f} "
          f"[{wall['no_values']:,.0f}] steps/s  ratio {cpu['no_values'] / cpu['raw']:.3f} "
          f"[{wall['no_values'] / wall['raw']:.3f}] against {cpu[f'actor_{n_lean}'] / cpu['raw']:.3f} with them")
    print(json.dumps({
        "benchmark": "actor_sampling", "env": ENV, "clock": args.clock, "figure": round(fig[f"actor_{best}"], 1),
        "reference": round(fig["raw"], 1), "ratio": round(ratio, 4), "best_envs_per_actor": best,
        "ratio_by_envs_per_actor": {n: round(fig[f"actor_{n}"] / fig["raw"], 4) for n in sweep},
        "ratio_without_behaviour_values": {n_lean: round(fig["no_values"] / fig["raw"], 4)},
        "cpu_steps_per_s": {k: round(v, 1) for k, v in cpu.items()},
        "wall_steps_per_s": {k: round(v, 1) for k, v in wall.items()},
        "api_envs": api_n, "steps": steps, "repeats": repeats, "target_ratio": TARGET, "meets_target": ratio >= TARGET,
        "loadavg": [round(x, 2) for x in load_after]}))


if __name__ == "__main__":
    main()
