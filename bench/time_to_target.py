"""Time and dollars to a good policy: nitro's default configuration against the PPO implementations users already
run, on this machine, to a target evaluation return.

What it measures, per (system, settings, env, seed) run:
- wall_s: training wall time on this machine until the target is first crossed, evaluation excluded for every
  system (peers stop their clock while they evaluate; nitro's is the sum of its rounds' times less each round's
  `evaluate` phase, its evaluation running as functions beside the next round, as its default does);
- env_steps: env steps trained when the crossing evaluation was taken;
- cloud_s and usd: the modelled cloud time and bill. nitro: its job's modelled cloud clock (the sum of
  cloud_round_seconds less the `evaluate` phase) and `cloud_total_cost_usd` of the round whose evaluation crossed
  (that bill includes the evaluation functions, so it is conservative for nitro; `usd_training` leaves them out).
  A peer runs on one VM: the learner server's instance of `nitro.cost.Prices` (`learner_instance`, a c6i.large:
  the 2 vCPUs this machine is) billed per second for its wall time (`nitro.cost.learner_cost`), so cloud_s = wall_s.
The target (Hopper-v5 2,500, Walker2d-v5 2,500) is crossed when the mean of 10 deterministic evaluation episodes
(the policy's mean action; episode i on its own seed) reaches it. Every system evaluates every
--eval-every-steps env steps (20,480 by default; nitro every K rounds, K = those steps / its round's 8 x 256 steps).
A run that does not cross within --cap-minutes of training reports its best return and the cap as its time.

Systems and settings (`own`: each system's best-known Hopper settings; `ours`: nitro's default settings: 2x256 tanh
actor and critic, 2,048 env steps an update from 8 envs of 256 steps, 10 epochs, minibatch 256, lr 3e-4, gamma 0.99,
GAE 0.95, clip 0.2, value coefficient 0.5, grad clip 0.5, no entropy term, observation normalisation):
- nitro: `nitro.TrainingSpec` defaults (preset `tuned`, the `fixed` scaler's 8 actors x 256 steps, evaluation
  functions) with target_return set, through the real local system (LocalSystem + NitroClient);
- sb3: Stable-Baselines3 PPO; `own` is rl-baselines3-zoo's Hopper PPO entry (1 env x 512 steps, minibatch 32,
  5 epochs, obs and reward normalisation, ...);
- cleanrl: CleanRL's ppo_continuous_action from its registry package, as shipped. Its registry release (0.4.8) is a
  2021 script for OpenAI gym and PyBullet that cannot run gymnasium's v5 tasks: reported, not run (PEER_NOTES);
- sample-factory: Sample Factory's MuJoCo example (sf_examples.mujoco, `own` its shipped defaults) from its registry
  package (2.1.1), which pins gymnasium < 1.0: it trains and is evaluated on Hopper-v4 and Walker2d-v4 (a deviation
  its result files carry). It trains in processes of its own, so its clock cannot stop for evaluations: it trains
  to the cap with a checkpoint a second, evaluated afterwards, off the clock, until one crosses;
- rllib: RLlib PPO (new API stack); `own` is RLlib's defaults (its package ships no tuned Hopper example), 2 env
  runners x 8 envs (fastest here, bench/vs_rllib.py); `ours` has no observation normalisation (a deviation).
Each peer runs in its own Python environment under --peer-envs (default /work/peer-envs/<name>), which `--setup`
creates with `python3 -m venv` and pip (torch pinned to 2.13.0 everywhere); the install outcome of each is kept in
the results folder's setup.json, a run re-checks it, and a peer that cannot be installed or run is reported with
the reason. Peers are run, never copied: this file runs itself with the peer's interpreter (`--worker`, importing
nothing of nitro) and drives the peer's own API. Torch threads: each system's default.

Runs are interleaved (seed by seed, env by env, every system and setting in turn), so a drift of the machine hits
all alike, and each run writes results/time-to-target/<system>-<settings>-<env>-s<seed>.json as it finishes; a
rerun skips finished runs (a failed run writes <name>.failed.json and is tried again), and --report rebuilds the
table and the JSON from the files alone. Figures: per (peer, settings, env), the median over seeds of the
same-seed ratios peer / nitro of wall time and of dollars (> 1: nitro is faster, cheaper); a capped time is a
bound, counted in `capped`. The last line is one JSON object: per-seed times, steps, dollars and the median ratios.

    .venv/bin/python bench/time_to_target.py --setup     # the peers' environments (minutes; needs the registry)
    .venv/bin/python bench/time_to_target.py             # a plan only: what would run and the hours it may take
    .venv/bin/python bench/time_to_target.py --run       # everything not finished yet, on a quiet machine
    .venv/bin/python bench/time_to_target.py --run --systems nitro,sb3 --envs Hopper-v5 --seeds 0 --cap-minutes 1
    .venv/bin/python bench/time_to_target.py --report    # the table and the JSON from the result files

How long: at most runs x (cap + ~1 minute of start-up and evaluation); the full grid is 4 systems run here
(nitro, and sb3, sample-factory, rllib each with both settings: 7 runs a seed and env) x 2 envs x 5 seeds = 70 runs,
about 25 h at the default 20-minute cap if none crossed; a run that crosses stops early (nitro's demo job passes
2,500 on Hopper-v5 in about 4 minutes), and Sample Factory always trains to its cap.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "time-to-target"
PEER_ENVS = Path("/work/peer-envs")
TARGETS = {"Hopper-v5": 2500.0, "Walker2d-v5": 2500.0}
EVAL_EPISODES = 10
EVAL_SEED = 10_000  # a peer's evaluation episode i runs on seed EVAL_SEED + i (nitro: its own eval seeds)
EVAL_EVERY_STEPS = 20_480
CAP_MINUTES = 20.0
SEEDS = (0, 1, 2, 3, 4)
SYSTEMS = ("nitro", "sb3", "cleanrl", "sample-factory", "rllib")
PEERS = SYSTEMS[1:]
SETTINGS = ("own", "ours")  # nitro runs its default, which is "ours" by definition
WORKER_GRACE_S = 600.0  # a peer's evaluations and start-up beyond the training cap, before it is killed
# nitro's default round: the `fixed` scaler's count for PPO x the spec's steps_per_actor (nitro.contracts, nitro.spec)
NITRO_ACTORS, NITRO_STEPS = 8, 256

# What `--setup` installs in each peer's environment, and how it checks the peer is usable there. torch==2.13.0 is
# the local CPU wheel; any other version would download gigabytes.
PEER_PACKAGES = {
    "sb3": ["torch==2.13.0", "stable-baselines3", "gymnasium[mujoco]"],
    "cleanrl": ["torch==2.13.0", "cleanrl"],
    "sample-factory": ["torch==2.13.0", "sample-factory", "gymnasium[mujoco]"],
    "rllib": ["torch==2.13.0", "ray[rllib]", "gymnasium[mujoco]"],
}
# What a failed check means, where the reason is known (kept beside the check's own error in setup.json).
PEER_NOTES = {
    "cleanrl": "the registry's cleanrl (0.4.8, its latest release) ships a 2021 ppo_continuous_action.py written for "
               "OpenAI gym < 0.22 and PyBullet (gym.wrappers.Monitor, pybullet_envs), not gymnasium's Hopper-v5; "
               "CleanRL's current script is published only in its repository, which this bench does not copy",
}
PEER_CHECKS = {
    "sb3": "import stable_baselines3, gymnasium as g; g.make('Hopper-v5'); print(stable_baselines3.__version__)",
    # runs the shipped script as a user would (`python -m cleanrl.ppo_continuous_action --help`): its imports first
    "cleanrl": "import importlib.metadata as m, runpy, sys\nsys.argv = ['ppo_continuous_action', '--help']\n"
               "try:\n    runpy.run_module('cleanrl.ppo_continuous_action', run_name='__main__')\n"
               "except SystemExit as e:\n    assert not e.code, e\nprint(m.version('cleanrl'))",
    "sample-factory": "import importlib.util as u, gymnasium as g, importlib.metadata as m; "
                      "assert u.find_spec('sf_examples.mujoco.train_mujoco'), 'the package ships no sf_examples.mujoco'; "
                      "g.make('Hopper-v4'); print(m.version('sample-factory'))",
    "rllib": "import ray, gymnasium as g; from ray.rllib.algorithms.ppo import PPOConfig; g.make('Hopper-v5'); "
             "print(ray.__version__)",
}


# --- the pure parts: crossing, pricing, the plan, aggregation --------------------------------------------------------

@dataclass(frozen=True)
class Run:
    system: str
    settings: str
    env_id: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.system}-{self.settings}-{self.env_id.lower()}-s{self.seed}"


def crossing(curve: list[dict], target: float) -> dict | None:
    """The first evaluation point of `curve` ({"env_steps", "train_s", "return"}, in training order) whose return
    reaches `target`, else None."""
    for point in curve:
        if point["return"] >= target:
            return point
    return None


def vm_cost_usd(wall_s: float, prices) -> float:
    """A peer's bill: one VM of the learner server's instance (`prices.learner_instance`) billed per second for
    `wall_s`: the rule nitro's learner server is billed by."""
    from nitro.cost import learner_cost

    return learner_cost(wall_s, prices)


def plan_runs(systems, envs, seeds) -> list[Run]:
    """Every run, interleaved: seed by seed, env by env, each system and setting in turn."""
    for s in systems:
        if s not in SYSTEMS:
            raise ValueError(f"--systems: unknown system {s!r}; allowed: {list(SYSTEMS)}")
    for e in envs:
        if e not in TARGETS:
            raise ValueError(f"--envs: no target for {e!r}; allowed: {list(TARGETS)}")
    return [Run(s, "ours" if s == "nitro" else st, e, seed) for seed in seeds for e in envs for s in systems
            for st in (("ours",) if s == "nitro" else SETTINGS)]


def result_path(results: Path, run: Run) -> Path:
    return results / f"{run.name}.json"


def pending(runs: list[Run], results: Path) -> list[Run]:
    """The runs without a finished result file (a failed run has none: it runs again)."""
    return [r for r in runs if not result_path(results, r).exists()]


def outcome(run: Run, curve: list[dict], cap_s: float, target: float, steps_trained: int | None = None) -> dict:
    """A run's figures from its evaluation curve: the crossing point's time and steps, else the cap, the env steps
    trained within it (`steps_trained`, else the last evaluation's) and the best return. Peers' and nitro's dollars
    are added by the caller. Evaluations of policies trained past the cap do not count."""
    curve = [p for p in curve if p["train_s"] <= cap_s]
    hit = crossing(curve, target)
    best = max((p["return"] for p in curve), default=None)
    if hit is not None:
        return {"crossed": True, "wall_s": hit["train_s"], "env_steps": hit["env_steps"], "best_return": best,
                "crossing_return": hit["return"]}
    last = curve[-1]["env_steps"] if curve else 0
    return {"crossed": False, "wall_s": cap_s, "env_steps": last if steps_trained is None else steps_trained,
            "best_return": best}


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(results: list[dict]) -> dict:
    """Per (system, settings, env): per-seed times, steps and dollars and their medians; per peer, the median over
    seeds of the same-seed ratios peer / nitro of wall time and dollars (> 1: nitro faster, cheaper). A capped run's
    time is a bound (lower for a capped peer, upper for a capped nitro), counted in `capped`."""
    groups: dict[tuple[str, str, str], dict[int, dict]] = {}
    for r in results:
        groups.setdefault((r["system"], r["settings"], r["env_id"]), {})[r["seed"]] = r
    table = {}
    for (system, settings, env), by_seed in sorted(groups.items()):
        seeds = sorted(by_seed)
        rows = [by_seed[s] for s in seeds]
        table[f"{system}/{settings}/{env}"] = {
            "system": system, "settings": settings, "env_id": env, "seeds": seeds,
            "wall_s": [round(r["wall_s"], 1) for r in rows], "env_steps": [r["env_steps"] for r in rows],
            "usd": [round(r["usd"], 6) for r in rows], "crossed": [r["crossed"] for r in rows],
            "best_return": [None if r["best_return"] is None else round(r["best_return"], 1) for r in rows],
            "median_wall_s": _median([r["wall_s"] for r in rows]), "median_usd": _median([r["usd"] for r in rows]),
            "median_env_steps": _median([r["env_steps"] for r in rows])}
    ratios = {}
    for (system, settings, env), by_seed in sorted(groups.items()):
        ours = groups.get(("nitro", "ours", env), {})
        if system == "nitro" or not ours:
            continue
        seeds = sorted(set(by_seed) & set(ours))
        if not seeds:
            continue
        wall = [by_seed[s]["wall_s"] / ours[s]["wall_s"] for s in seeds if ours[s]["wall_s"] > 0]
        usd = [by_seed[s]["usd"] / ours[s]["usd"] for s in seeds if ours[s]["usd"] > 0]
        ratios[f"{system}/{settings}/{env}"] = {
            "seeds": seeds, "wall_ratio": _median(wall), "usd_ratio": _median(usd),
            "per_seed_wall_ratio": [round(x, 3) for x in wall], "per_seed_usd_ratio": [round(x, 3) for x in usd],
            "capped": {"peer": sum(not by_seed[s]["crossed"] for s in seeds),
                       "nitro": sum(not ours[s]["crossed"] for s in seeds)}}
    goal = bool(ratios) and all(v["wall_ratio"] is not None and v["wall_ratio"] > 1 and v["usd_ratio"] is not None
                                and v["usd_ratio"] > 1 for v in ratios.values())
    return {"table": table, "ratios": ratios, "nitro_faster_and_cheaper_than_every_peer": goal}


def estimate_hours(runs: list[Run], cap_minutes: float) -> float:
    """The plan's worst case: every run to its cap, plus ~1 minute of start-up and evaluation each."""
    return len(runs) * (cap_minutes + 1.0) / 60.0


# --- peer environments ----------------------------------------------------------------------------------------------

def peer_python(peer_envs: Path, peer: str) -> Path:
    return peer_envs / peer / "bin" / "python"


def check_peer(peer_envs: Path, peer: str) -> dict:
    """Whether a peer's environment runs its check: {"ok", "version" or "reason"}."""
    py = peer_python(peer_envs, peer)
    if not py.exists():
        return {"ok": False, "reason": f"no environment at {py.parent.parent} (run --setup)"}
    proc = subprocess.run([str(py), "-c", PEER_CHECKS[peer]], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        reason = "the check failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"ok": False, "reason": f"{PEER_NOTES[peer]} ({reason})" if peer in PEER_NOTES else reason}
    return {"ok": True, "version": proc.stdout.strip().splitlines()[-1]}


def setup(peers: list[str], peer_envs: Path, results: Path) -> dict:
    """Create each peer's venv and install it (skipped where the check already passes); record the outcomes."""
    record_path = results / "setup.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    for peer in peers:
        status = check_peer(peer_envs, peer)
        if not status["ok"]:
            venv = peer_envs / peer
            if not peer_python(peer_envs, peer).exists():
                subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
            proc = subprocess.run([str(peer_python(peer_envs, peer)), "-m", "pip", "install", "-q",
                                   *PEER_PACKAGES[peer]], capture_output=True, text=True)
            log = [ln for ln in (proc.stdout + proc.stderr).splitlines() if not ln.startswith("WARNING: Location")]
            status = check_peer(peer_envs, peer) if proc.returncode == 0 else {
                "ok": False, "reason": "pip install failed: " + " | ".join(log[-6:])}

        status.update({"packages": PEER_PACKAGES[peer], "checked_unix": time.time()})
        record[peer] = status
        print(f"{peer}: {'ok ' + status['version'] if status['ok'] else 'NOT usable: ' + status['reason']}", flush=True)
    results.mkdir(parents=True, exist_ok=True)
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    return record


# --- nitro's run ------------------------------------------------------------------------------------------------------

def nitro_eval_every(eval_every_steps: int) -> int:
    """Rounds between nitro's evaluations: the nearest whole number of its default rounds to the steps given."""
    return max(1, round(eval_every_steps / (NITRO_ACTORS * NITRO_STEPS)))


def nitro_train_s(reports: list[dict]) -> float:
    """nitro's training time so far: its rounds' times less their `evaluate` waits."""
    return sum(r.get("round_seconds", 0.0) - (r.get("phases") or {}).get("evaluate", 0.0) for r in reports)


def nitro_curve(reports: list[dict]) -> list[dict]:
    """nitro's evaluation curve from its round reports: at each evaluated round, the env steps so far, the training
    time so far (the rounds' times less their `evaluate` waits), the modelled cloud time the same way, the bill."""
    curve, train_s, cloud_s, eval_usd = [], 0.0, 0.0, 0.0
    for r in reports:
        phases, cloud_phases = r.get("phases") or {}, r.get("cloud_phases") or {}  # {phase: seconds}
        train_s += r.get("round_seconds", 0.0) - phases.get("evaluate", 0.0)
        cloud_s += r.get("cloud_round_seconds", 0.0) - cloud_phases.get("evaluate", 0.0)
        eval_usd += r.get("cloud_eval_cost_usd", 0.0)
        if r.get("evaluated"):
            curve.append({"round": r["round"], "env_steps": int(r["total_env_steps"]), "train_s": train_s,
                          "cloud_s": cloud_s, "return": float(r["eval_return"]),
                          "usd": float(r["cloud_total_cost_usd"]),
                          "usd_training": float(r["cloud_total_cost_usd"]) - eval_usd})
    return curve


def run_nitro(run: Run, cap_s: float, eval_every_steps: int) -> dict:
    import tempfile

    from nitro.client import results as nitro_results
    from nitro.client.sdk import NitroClient
    from nitro.local.system import LocalSystem

    target = TARGETS[run.env_id]
    spec = {"env_id": run.env_id, "seed": run.seed, "target_return": target, "eval_episodes": EVAL_EPISODES,
            "eval_every": nitro_eval_every(eval_every_steps), "rounds": 100_000, "budget_usd": 1000.0}
    reports: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        system = LocalSystem(state_dir=tmp).start()
        try:
            with NitroClient(system.learner_address) as client:
                job = client.start_training(spec)
                stopped = False
                for report in client.watch(job.job_id):
                    reports.append(nitro_results.as_dict(report))
                    if not stopped and nitro_train_s(reports) >= cap_s:
                        client.stop(job.job_id)  # the cap: the rounds already running still report
                        stopped = True
                final = client.get(job.job_id)
                state, message = final.state_name, final.message
        finally:
            system.stop()
    curve = nitro_curve(reports)
    within = [p for p in curve if p["train_s"] <= cap_s]  # rounds that finished after the stop do not count
    hit = crossing(within, target)
    if hit is None and not stopped:
        raise RuntimeError(f"the nitro job ended {state} before the target or the cap: {message}")
    in_cap = [r for i, r in enumerate(reports) if nitro_train_s(reports[:i + 1]) <= cap_s]
    out = outcome(run, within, cap_s, target, int(in_cap[-1]["total_env_steps"]) if in_cap else 0)
    if hit is not None:
        out.update({"usd": hit["usd"], "usd_training": hit["usd_training"], "cloud_s": hit["cloud_s"]})
    else:  # the bill and the cloud clock at the cap
        usd = float(in_cap[-1]["cloud_total_cost_usd"]) if in_cap else 0.0
        eval_usd = sum(float(r.get("cloud_eval_cost_usd", 0.0)) for r in in_cap)
        cloud = sum(r.get("cloud_round_seconds", 0.0) - (r.get("cloud_phases") or {}).get("evaluate", 0.0)
                    for r in in_cap)
        out.update({"usd": usd, "usd_training": usd - eval_usd, "cloud_s": cloud})
    out.update({"rounds": len(reports),
                "job_state": state, "job_message": message, "spec": spec, "curve": curve})
    return out


# --- peers: the driver side -------------------------------------------------------------------------------------------

def run_peer(run: Run, cap_s: float, eval_every_steps: int, peer_envs: Path) -> dict:
    from nitro.cost import Prices

    py = peer_python(peer_envs, run.system)
    if not py.exists():
        raise RuntimeError(f"{run.system} is not installed: no {py} (run --setup)")
    cfg = {"system": run.system, "settings": run.settings, "env_id": run.env_id, "seed": run.seed,
           "target": TARGETS[run.env_id], "cap_s": cap_s, "eval_every": eval_every_steps}
    proc = subprocess.run([str(py), str(Path(__file__).resolve()), "--worker", json.dumps(cfg)], capture_output=True,
                          text=True, timeout=cap_s + WORKER_GRACE_S, cwd=str(ROOT))
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not lines[-1].startswith("{"):
        raise RuntimeError(f"the {run.system} worker failed (exit {proc.returncode}): {proc.stderr[-2500:]}")
    worker = json.loads(lines[-1])
    prices = Prices()
    out = outcome(run, worker["curve"], cap_s, TARGETS[run.env_id], worker.get("env_steps"))
    out.update({"usd": vm_cost_usd(out["wall_s"], prices), "cloud_s": out["wall_s"],
                "instance": prices.learner_instance, "usd_per_hour": prices.learner_usd_per_hour,
                "curve": worker["curve"], "stopped": worker["stopped"], "versions": worker["versions"],
                "peer_settings": worker["settings"], "deviations": worker.get("deviations", [])})
    return out


# --- peers: the worker side (runs in the peer's own environment; imports nothing of nitro) ----------------------------

class Tracker:
    """A peer's training clock and evaluations: `tick(env_steps)` evaluates at every `every` env steps with the
    clock stopped, and says whether training goes on (not crossed, not capped)."""

    def __init__(self, env_id: str, target: float, every: int, cap_s: float):
        self.env_id, self.target, self.every, self.cap_s = env_id, target, every, cap_s
        self.act = None  # obs -> action, set once the peer's model exists
        self.curve: list[dict] = []
        self.next_eval = every
        self.stopped = ""
        self.env_steps = 0  # the latest count seen
        self.t0 = self.paused = 0.0

    def start(self) -> None:
        self.t0, self.paused = time.perf_counter(), 0.0

    def train_s(self) -> float:
        return time.perf_counter() - self.t0 - self.paused

    def tick(self, env_steps: int) -> bool:
        if self.stopped:
            return False
        self.env_steps = int(env_steps)
        if env_steps >= self.next_eval:
            t = self.train_s()
            e0 = time.perf_counter()
            self.record(env_steps, t, evaluate_peer(self.env_id, self.act))
            self.paused += time.perf_counter() - e0
            self.next_eval = (env_steps // self.every + 1) * self.every
            if self.stopped:
                return False
        if self.train_s() >= self.cap_s:
            self.stopped = "capped"
            return False
        return True

    def record(self, env_steps: int, train_s: float, ret: float) -> None:
        self.curve.append({"env_steps": int(env_steps), "train_s": train_s, "return": ret})
        print(f"  {env_steps} env steps, {train_s:.0f} s: {ret:.1f}", file=sys.stderr, flush=True)
        if ret >= self.target:
            self.stopped = "crossed"


def evaluate_peer(env_id: str, act) -> float:
    """Mean return of EVAL_EPISODES deterministic episodes, episode i on seed EVAL_SEED + i, actions clipped."""
    import gymnasium as gym
    import numpy as np

    env = gym.make(env_id)
    low, high = env.action_space.low, env.action_space.high
    total = 0.0
    for ep in range(EVAL_EPISODES):
        obs, _ = env.reset(seed=EVAL_SEED + ep)
        done = False
        while not done:
            obs, r, term, trunc, _ = env.step(np.clip(act(obs), low, high))
            total += float(r)
            done = term or trunc
    env.close()
    return total / EVAL_EPISODES


# nitro's default settings ("ours"), in each peer's words where it has them.
OURS = {"lr": 3e-4, "gamma": 0.99, "gae_lambda": 0.95, "clip": 0.2, "epochs": 10, "minibatch": 256, "envs": 8,
        "steps_per_env": 256, "value_coeff": 0.5, "max_grad_norm": 0.5, "entropy": 0.0, "hidden": [256, 256],
        "activation": "tanh", "obs_norm": True}


def sb3_worker(cfg: dict, tracker: Tracker) -> tuple[dict, list[str]]:
    import gymnasium  # noqa: F401
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    if cfg["settings"] == "own":
        # rl-baselines3-zoo's hyperparams/ppo.yml, Hopper (its MuJoCo v3/v4 entries): normalize obs and reward
        n_envs, norm_reward = 1, True
        kw = dict(n_steps=512, batch_size=32, n_epochs=5, gamma=0.999, gae_lambda=0.99, learning_rate=9.80828e-05,
                  ent_coef=0.00229519, clip_range=0.2, vf_coef=0.835671, max_grad_norm=0.7,
                  policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn=torch.nn.ReLU,
                                     net_arch=dict(pi=[256, 256], vf=[256, 256])))
    else:
        n_envs, norm_reward = OURS["envs"], False
        kw = dict(n_steps=OURS["steps_per_env"], batch_size=OURS["minibatch"], n_epochs=OURS["epochs"],
                  gamma=OURS["gamma"], gae_lambda=OURS["gae_lambda"], learning_rate=OURS["lr"],
                  ent_coef=OURS["entropy"], clip_range=OURS["clip"], vf_coef=OURS["value_coeff"],
                  max_grad_norm=OURS["max_grad_norm"],
                  policy_kwargs=dict(activation_fn=torch.nn.Tanh, net_arch=dict(pi=OURS["hidden"], vf=OURS["hidden"])))
    venv = VecNormalize(make_vec_env(cfg["env_id"], n_envs=n_envs, seed=cfg["seed"]), norm_obs=True,
                        norm_reward=norm_reward)
    model = PPO("MlpPolicy", venv, seed=cfg["seed"], device="cpu", verbose=0, **kw)
    tracker.act = lambda obs: model.predict(venv.normalize_obs(obs), deterministic=True)[0]

    class Tick(BaseCallback):
        def _on_step(self) -> bool:
            return tracker.tick(self.num_timesteps)

    tracker.start()
    model.learn(total_timesteps=10**9, callback=Tick())
    settings = {"n_envs": n_envs, "normalize_obs": True, "normalize_reward": norm_reward,
                **{k: (str(v) if k == "policy_kwargs" else v) for k, v in kw.items()}}
    return settings, []


def rllib_worker(cfg: dict, tracker: Tracker) -> tuple[dict, list[str]]:
    import gymnasium as gym
    import numpy as np
    import ray
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    if cfg["settings"] == "own":
        # RLlib's PPO defaults on the new API stack (its package ships no tuned examples, and its repository's Hopper
        # example is sized for a cluster), sampling as measured fastest here (bench/vs_rllib.py: 2 runners x 8 envs)
        runners, envs = 2, 8
        training, model = {}, DefaultModelConfig()
    else:
        runners, envs = 2, OURS["envs"] // 2
        training = dict(train_batch_size_per_learner=OURS["envs"] * OURS["steps_per_env"],
                        minibatch_size=OURS["minibatch"], num_epochs=OURS["epochs"], lr=OURS["lr"],
                        gamma=OURS["gamma"], lambda_=OURS["gae_lambda"], clip_param=OURS["clip"],
                        vf_loss_coeff=OURS["value_coeff"], grad_clip=OURS["max_grad_norm"],
                        entropy_coeff=OURS["entropy"], use_kl_loss=False, kl_coeff=0.0, vf_clip_param=float("inf"))
        model = DefaultModelConfig(fcnet_hiddens=OURS["hidden"], fcnet_activation=OURS["activation"],
                                   vf_share_layers=False)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        config = (PPOConfig().environment(cfg["env_id"])
                  .env_runners(num_env_runners=runners, num_envs_per_env_runner=envs)
                  .training(**training).rl_module(model_config=model).debugging(seed=cfg["seed"]))
        algo = config.build_algo()
        module = algo.get_module()
        n_act = int(np.prod(gym.make(cfg["env_id"]).action_space.shape))

        def act(obs):
            with torch.no_grad():
                out = module.forward_inference({"obs": torch.as_tensor(obs[None], dtype=torch.float32)})
            inputs = out["action_dist_inputs"][0].numpy()
            return inputs[:n_act]  # (mean, log_std): the mean

        tracker.act = act
        tracker.start()
        while True:
            result = algo.train()
            if not tracker.tick(int(result["env_runners"]["num_env_steps_sampled_lifetime"])):
                break
        algo.stop()
    finally:
        ray.shutdown()
    deviations = [] if cfg["settings"] == "own" else [
        "no observation normalisation (RLlib's MeanStdFilter connector would also have to filter the evaluation)"]
    return {"env_runners": runners, "envs_per_env_runner": envs, **{k: str(v) for k, v in training.items()},
            "fcnet_hiddens": model.fcnet_hiddens, "fcnet_activation": model.fcnet_activation,
            "vf_share_layers": model.vf_share_layers}, deviations


# Sample Factory's MuJoCo example registers the gymnasium v4 tasks (its package pins gymnasium < 1.0, which has no v5)
SF_ENVS = {"Hopper-v5": ("mujoco_hopper", "Hopper-v4"), "Walker2d-v5": ("mujoco_walker", "Walker2d-v4")}
SF_SAVE_EVERY_S = 1  # a checkpoint a second: the evaluation points are the first checkpoints past each N env steps


def sf_checkpoint_points(checkpoints: list[tuple[int, float, str]], every: int) -> list[tuple[int, float, str]]:
    """Of (env_steps, train_s, path) in training order, the first at or past each multiple of `every` env steps."""
    out, mark = [], every
    for steps, t, path in checkpoints:
        if steps >= mark:
            out.append((steps, t, path))
            mark = (steps // every + 1) * every
    return out


def sample_factory_worker(cfg: dict, tracker: Tracker) -> tuple[dict, list[str]]:
    """Sample Factory trains in processes of its own, so its clock cannot stop for an evaluation: it trains for the
    cap, checkpointing every second, and the checkpoints are evaluated afterwards (off the clock), in order, until
    one crosses; a checkpoint's training time is its file's time since its processes started."""
    import tempfile

    import torch
    from sample_factory.algo.learning.learner import Learner
    from sample_factory.algo.runners.runner import AlgoObserver
    from sample_factory.algo.utils.action_distributions import argmax_actions
    from sample_factory.algo.utils.make_env import make_env_func_batched
    from sample_factory.algo.utils.misc import ExperimentStatus
    from sample_factory.algo.utils.rl_utils import prepare_and_normalize_obs
    from sample_factory.cfg.arguments import load_from_checkpoint
    from sample_factory.model.actor_critic import create_actor_critic
    from sample_factory.model.model_utils import get_rnn_size
    from sample_factory.train import make_runner
    from sample_factory.utils.attr_dict import AttrDict
    from sf_examples.mujoco.train_mujoco import parse_mujoco_cfg, register_mujoco_components

    name, gym_id = SF_ENVS[cfg["env_id"]]
    if cfg["settings"] == "own":
        settings = {}  # the example's own defaults (sf_examples/mujoco/mujoco_params.py), as shipped
    else:
        settings = {"num_workers": 2, "num_envs_per_worker": OURS["envs"] // 2, "rollout": OURS["steps_per_env"],
                    "batch_size": OURS["minibatch"],
                    "num_batches_per_epoch": OURS["envs"] * OURS["steps_per_env"] // OURS["minibatch"],
                    "num_epochs": OURS["epochs"], "learning_rate": OURS["lr"], "lr_schedule": "constant",
                    "gamma": OURS["gamma"], "gae_lambda": OURS["gae_lambda"], "ppo_clip_ratio": OURS["clip"],
                    "value_loss_coeff": OURS["value_coeff"], "max_grad_norm": OURS["max_grad_norm"],
                    "exploration_loss_coeff": OURS["entropy"], "kl_loss_coeff": 0.0,
                    "encoder_mlp_layers": " ".join(map(str, OURS["hidden"])), "nonlinearity": OURS["activation"],
                    "normalize_input": True, "normalize_returns": False}
    register_mujoco_components()
    with tempfile.TemporaryDirectory() as tmp:
        argv = [f"--env={name}", "--experiment=ttt", f"--train_dir={tmp}", f"--seed={cfg['seed']}", "--device=cpu",
                f"--train_for_seconds={int(math.ceil(cfg['cap_s']))}", f"--save_every_sec={SF_SAVE_EVERY_S}",
                "--keep_checkpoints=1000000", "--with_wandb=False", "--train_for_env_steps=10000000000"]
        argv += [f"--{k}={v}" for k, v in settings.items() if k != "encoder_mlp_layers"]  # booleans as True/False
        if "encoder_mlp_layers" in settings:
            argv += ["--encoder_mlp_layers", *settings["encoder_mlp_layers"].split()]
        sf_cfg = parse_mujoco_cfg(argv=argv)
        sf_cfg, runner = make_runner(sf_cfg)
        clock = {"t0": None}

        class Clock(AlgoObserver):
            """Starts the clock once its processes run; ends training at the cap (2.1.1 never advances the
            `total_train_seconds` its own --train_for_seconds reads, so the observer does)."""

            def on_start(self, runner) -> None:
                clock["t0"] = time.time()

            def on_training_step(self, runner, iteration: int) -> None:
                runner.total_train_seconds = time.time() - clock["t0"]

        runner.register_observer(Clock())
        if runner.init() == ExperimentStatus.SUCCESS:
            runner.run()
        if clock["t0"] is None:
            raise RuntimeError("Sample Factory did not start training")
        t0 = clock["t0"]
        sf_cfg = load_from_checkpoint(sf_cfg)
        paths = Learner.get_checkpoints(Learner.checkpoint_dir(sf_cfg, 0), "checkpoint_*")
        found = sorted((int(Path(p).stem.rsplit("_", 1)[1]), os.path.getmtime(p) - t0, p) for p in paths)
        env = make_env_func_batched(sf_cfg, env_config=AttrDict(worker_index=0, vector_index=0, env_id=0))
        model = create_actor_critic(sf_cfg, env.observation_space, env.action_space)
        model.eval()
        env.close()
        rnn = torch.zeros([1, get_rnn_size(sf_cfg)], dtype=torch.float32)

        def act(obs):
            with torch.no_grad():
                norm = prepare_and_normalize_obs(model, {"obs": torch.as_tensor(obs[None], dtype=torch.float32)})
                model(norm, rnn)
                return argmax_actions(model.action_distribution())[0].numpy()

        tracker.env_id, tracker.act = gym_id, act
        in_cap = [c for c in found if c[1] <= tracker.cap_s]  # trained within the cap
        tracker.env_steps = in_cap[-1][0] if in_cap else 0
        for steps, t, path in sf_checkpoint_points(in_cap, tracker.every):
            model.load_state_dict(Learner.load_checkpoint([path], "cpu")["model"])
            tracker.record(steps, t, evaluate_peer(gym_id, act))
            if tracker.stopped:
                break
        tracker.stopped = tracker.stopped or "capped"
    deviations = [f"trained and evaluated on {gym_id}: the registry package pins gymnasium < 1.0, without v5",
                  "evaluated after training from checkpoints saved every second: a crossing is timed at the first checkpoint past "
                  "each N env steps, up to a second late"]
    return {"sample_factory_args": argv[4:]}, deviations


PEER_WORKERS = {"sb3": sb3_worker, "rllib": rllib_worker, "sample-factory": sample_factory_worker}


def worker_main(cfg: dict) -> None:
    import importlib.metadata as md

    if cfg["system"] not in PEER_WORKERS:
        raise SystemExit(f"no worker for {cfg['system']!r} in this file (see the report's reason)")
    tracker = Tracker(cfg["env_id"], cfg["target"], cfg["eval_every"], cfg["cap_s"])
    settings, deviations = PEER_WORKERS[cfg["system"]](cfg, tracker)
    dists = {"sb3": "stable-baselines3", "cleanrl": "cleanrl", "sample-factory": "sample-factory", "rllib": "ray"}
    versions = {d: md.version(d) for d in (dists[cfg["system"]], "torch", "gymnasium")}
    print(json.dumps({"curve": tracker.curve, "stopped": tracker.stopped or "ended", "env_steps": tracker.env_steps,
                      "settings": settings,
                      "versions": versions, "deviations": deviations}))


# --- the driver -------------------------------------------------------------------------------------------------------

def load_results(results: Path) -> tuple[list[dict], list[dict]]:
    done, failed = [], []
    for path in sorted(results.glob("*.json")):
        if path.name == "setup.json":
            continue
        data = json.loads(path.read_text())
        (failed if path.name.endswith(".failed.json") else done).append(data)
    return done, failed


def report(results: Path) -> dict:
    done, failed = load_results(results)
    summary = summarize(done)
    setup_path = results / "setup.json"
    peers = json.loads(setup_path.read_text()) if setup_path.exists() else {}
    print("| system | settings | env | seeds | median wall s | median env steps | median $ | crossed | per-seed wall s |")
    print("|---|---|---|---|---:|---:|---:|---|---|")
    for row in summary["table"].values():
        print(f"| {row['system']} | {row['settings']} | {row['env_id']} | {row['seeds']} | "
              f"{row['median_wall_s']:.0f} | {row['median_env_steps']:.0f} | {row['median_usd']:.4f} | "
              f"{sum(row['crossed'])}/{len(row['crossed'])} | {row['wall_s']} |")
    for key, v in summary["ratios"].items():
        print(f"{key}: median ratio to nitro, wall {v['wall_ratio']}, dollars {v['usd_ratio']} "
              f"(capped: peer {v['capped']['peer']}, nitro {v['capped']['nitro']})")
    for f in failed:
        print(f"FAILED {f['run']}: {f['error'][:300]}")
    out = {"benchmark": "time_to_target", "targets": TARGETS, "eval_episodes": EVAL_EPISODES,
           "evaluation_time": "excluded for every system",
           "peer_pricing": "learner_instance of nitro.cost.Prices, per second, for the peer's wall time",
           "runs": len(done), "failed_runs": [{"run": f["run"], "error": f["error"][-500:]} for f in failed],
           "peers": {k: {kk: v[kk] for kk in ("ok", "version", "reason") if kk in v} for k, v in peers.items()},
           "per_seed": {k: {kk: v[kk] for kk in ("seeds", "wall_s", "env_steps", "usd", "crossed", "best_return")}
                        for k, v in summary["table"].items()},
           "median_ratios": {k: {"wall": v["wall_ratio"], "usd": v["usd_ratio"], "seeds": v["seeds"],
                                 "capped": v["capped"]} for k, v in summary["ratios"].items()},
           "nitro_faster_and_cheaper_than_every_peer": summary["nitro_faster_and_cheaper_than_every_peer"]}
    print(json.dumps(out))
    return out


def record_peers(peers: list[str], peer_envs: Path, results: Path) -> dict:
    """Check each peer's environment now (no install) and keep the outcome beside the install record."""
    path = results / "setup.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    for peer in peers:
        record[peer] = {**record.get(peer, {}), **check_peer(peer_envs, peer), "checked_unix": time.time()}
        if record[peer]["ok"]:
            record[peer].pop("reason", None)
    results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def execute(runs: list[Run], results: Path, cap_s: float, eval_every_steps: int, peer_envs: Path) -> None:
    results.mkdir(parents=True, exist_ok=True)
    todo = pending(runs, results)
    print(f"{len(runs) - len(todo)} of {len(runs)} runs finished already; {len(todo)} to run", flush=True)
    peers = record_peers(sorted({r.system for r in todo if r.system != "nitro"}), peer_envs, results)
    for peer, status in sorted(peers.items()):
        if not status["ok"] and any(r.system == peer for r in todo):
            print(f"{peer}: not run: {status['reason']}", flush=True)
    todo = [r for r in todo if r.system == "nitro" or peers[r.system]["ok"]]
    for run in todo:
        t0 = time.time()
        failed = result_path(results, run).with_suffix(".failed.json")
        try:
            if run.system == "nitro":
                out = run_nitro(run, cap_s, eval_every_steps)
            else:
                out = run_peer(run, cap_s, eval_every_steps, peer_envs)
        except Exception as exc:  # one run's failure is reported, the others still run
            failed.write_text(json.dumps({"run": run.name, "error": f"{type(exc).__name__}: {exc}",
                                          "finished_unix": time.time()}) + "\n")
            print(f"{run.name}: FAILED ({type(exc).__name__}: {str(exc)[-300:]})", flush=True)
            continue
        out.update({"run": run.name, "system": run.system, "settings": run.settings, "env_id": run.env_id,
                    "seed": run.seed, "target": TARGETS[run.env_id], "cap_s": cap_s,
                    "eval_every_steps": eval_every_steps, "eval_episodes": EVAL_EPISODES,
                    "elapsed_s": time.time() - t0, "finished_unix": time.time()})
        tmp = result_path(results, run).with_suffix(".tmp")
        tmp.write_text(json.dumps(out) + "\n")
        tmp.replace(result_path(results, run))  # whole or absent: a rerun never reads half a file
        failed.unlink(missing_ok=True)
        best = "-" if out["best_return"] is None else f"{out['best_return']:.0f}"
        print(f"{run.name}: {'crossed' if out['crossed'] else 'capped'} at {out['wall_s']:.0f} s, "
              f"{out['env_steps']} env steps, best return {best}, ${out['usd']:.5f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--envs", default=",".join(TARGETS))
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    p.add_argument("--cap-minutes", type=float, default=CAP_MINUTES, help="training time a run may take")
    p.add_argument("--eval-every-steps", type=int, default=EVAL_EVERY_STEPS)
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--peer-envs", type=Path, default=PEER_ENVS)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--setup", action="store_true", help="create and check the peers' environments")
    mode.add_argument("--plan", action="store_true", help="print what would run and the hours it may take (the "
                      "default: a bare run, as `make bench` makes, spends no hours)")
    mode.add_argument("--run", action="store_true", help="run what is not finished yet, then --report")
    mode.add_argument("--report", action="store_true", help="the table and the JSON from the result files alone")
    args = p.parse_args()
    if not args.cap_minutes > 0:
        p.error(f"--cap-minutes must be > 0, got {args.cap_minutes}")
    if args.eval_every_steps < 1:
        p.error(f"--eval-every-steps must be >= 1, got {args.eval_every_steps}")
    systems = [s for s in args.systems.split(",") if s]
    try:
        runs = plan_runs(systems, [e for e in args.envs.split(",") if e], [int(s) for s in args.seeds.split(",")])
    except ValueError as exc:
        p.error(str(exc))
    if args.setup:
        setup([s for s in systems if s in PEERS], args.peer_envs, args.results)
        return
    if args.report:
        report(args.results)
        return
    todo = pending(runs, args.results)
    finished = len(runs) - len(todo)
    if not args.run:
        record_path = args.results / "setup.json"  # the last --setup or run's check; a run checks again
        record = json.loads(record_path.read_text()) if record_path.exists() else {}
        unusable = {p: v["reason"] for p, v in record.items() if not v.get("ok") and p in systems}
        todo = [r for r in todo if r.system not in unusable]
        for run in todo:
            print(run.name)
        for peer, reason in unusable.items():
            print(f"{peer}: not run: {reason}")
        hours = estimate_hours(todo, args.cap_minutes)
        print(f"{len(todo)} runs, at most {hours:.1f} h at a {args.cap_minutes:g}-minute cap (a plan only: --run "
              f"measures)")
        print(json.dumps({"benchmark": "time_to_target", "plan": [r.name for r in todo], "runs": len(todo),
                          "finished": finished, "not_run": unusable, "cap_minutes": args.cap_minutes,
                          "estimated_hours_at_most": round(hours, 1)}))
        return
    execute(runs, args.results, args.cap_minutes * 60.0, args.eval_every_steps, args.peer_envs)
    report(args.results)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker_main(json.loads(sys.argv[2]))
    else:
        sys.path.insert(0, str(ROOT))
        main()
