"""Pre-training of the MinionsRL actor scheduler (`nitro pretrain-minions`) through the real system.

One episode is one short training job run by the learner, detector, scaler and actor
functions like any other, with scaler policy "minions" pointing at an *exploration*
checkpoint of the scheduler being trained: the scaler's minions policy samples its
actor counts from the current network (instead of taking the argmax) and records
each decision's observation and action in its per-job state in Redis. When the job
has ended the driver reads that trajectory back, pairs decision t with round t's
report (its cost and time), computes the rewards (nitro.scaling.minions.episode_rewards)
and does one update with this project's PPO (nitro.algos.ppo.PPOLearner). The next
episode runs with a fresh exploration checkpoint of the updated network. At the end
the network is saved as a "serve" (argmax) checkpoint.

Cost is accounted with the same model as every job: the sum of the episodes'
total_cost_usd (learner server time and actor functions, from the scaler's ledger)
plus the learner-server time of the scheduler's own PPO updates (cost.learner_cost).
Wall time is the driver's, from the first episode to the saved checkpoint (bringing
a local system up is not part of it). Both go into the checkpoint's metadata.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from nitro import cost
from nitro.errors import ConfigError
from nitro.scaling import minions
from nitro.spec import MAX_ACTORS, MAX_STEPS_PER_ACTOR


class PretrainError(RuntimeError):
    """An episode could not run at all (its job failed before any round): pre-training stops."""


@dataclass
class PretrainSettings:
    env_id: str
    episodes: int
    rounds_per_episode: int = 5
    i_max: int = 8
    steps_per_actor: int = 256
    budget_usd: float = 0.05  # per episode; pick one that I_max actors every round would overrun
    target_return: float = 0.0  # 0 = no target, so no terminal bonus (only penalties)
    seed: int = 0
    preset: str = "fast"  # the training jobs' PPO preset
    eval_episodes: int = 3
    round_seconds_ref: float = 0.0  # time penalty reference; 0 = the first episode's median round time
    out: str = "minions-scheduler.npz"
    work_dir: str = ""  # exploration checkpoints; must be readable by the scaler ("" = a temporary dir)
    lr: float = 3e-4
    epochs: int = 8
    entropy_coeff: float = 0.01

    def validate(self) -> PretrainSettings:
        def bad(name: str, what: str, value) -> ConfigError:
            return ConfigError(f"{name}: must be {what}, got {value!r}")

        if not self.env_id:
            raise bad("env", "a Gymnasium id, e.g. CartPole-v1", self.env_id)
        if not 1 <= self.episodes <= 100_000:
            raise bad("episodes", "in [1, 100000]", self.episodes)
        if not 1 <= self.rounds_per_episode <= 10_000:
            raise bad("rounds_per_episode", "in [1, 10000]", self.rounds_per_episode)
        if not 1 <= self.i_max <= MAX_ACTORS:
            raise bad("i_max", f"in [1, {MAX_ACTORS}]", self.i_max)
        if not 1 <= self.steps_per_actor <= MAX_STEPS_PER_ACTOR:
            raise bad("steps_per_actor", f"in [1, {MAX_STEPS_PER_ACTOR}]", self.steps_per_actor)
        if not (math.isfinite(self.budget_usd) and self.budget_usd > 0):
            raise bad("budget", "a finite number > 0 (USD per episode)", self.budget_usd)
        if not math.isfinite(self.target_return):
            raise bad("target_return", "a finite number", self.target_return)
        if not (math.isfinite(self.round_seconds_ref) and self.round_seconds_ref >= 0):
            raise bad("round_seconds_ref", "a finite number >= 0 (0 = measured)", self.round_seconds_ref)
        if not 0 <= self.seed < 2**31:
            raise bad("seed", "in [0, 2^31)", self.seed)
        if not self.out:
            raise bad("out", "a file path", self.out)
        return self


@dataclass
class EpisodeResult:
    job_id: str
    state: str
    message: str
    rounds: int
    actors: list[int]
    rewards: list[float]
    final_eval_return: float
    cost_usd: float
    reached_target: bool
    trained: bool  # False when the trajectory did not match the reports (nothing learned from it)


@dataclass
class PretrainResult:
    path: str
    wall_seconds: float
    cost_usd: float  # jobs + scheduler updates
    jobs_cost_usd: float
    update_cost_usd: float
    round_seconds_ref: float
    episodes: list[EpisodeResult] = field(default_factory=list)


def scheduler_model_spec(i_max: int):
    from nitro.models import ModelSpec

    return ModelSpec((minions.OBS_DIM,), "discrete", i_max, hidden_sizes=minions.HIDDEN_SIZES,
                     activation=minions.ACTIVATION)


def scheduler_ppo_config(settings: PretrainSettings):
    """PPO for a handful of transitions per update: one full-batch step per epoch, a little entropy
    so the sampled actor counts keep exploring."""
    from nitro.config import PPOConfig

    return PPOConfig(lr=settings.lr, epochs=settings.epochs, minibatch_size=0, gamma=0.99, gae_lambda=0.95,
                     clip=0.2, kl_coeff=0.0, entropy_coeff=settings.entropy_coeff, value_coeff=0.5,
                     max_grad_norm=0.5, normalize_advantages=True, hidden_sizes=minions.HIDDEN_SIZES,
                     activation=minions.ACTIVATION)


def read_trajectory(redis_client, job_id: str) -> list[dict]:
    """The exploring scheduler's decisions for `job_id`, by round, from the scaler's job state."""
    from scaler_svc.server import state_key

    raw = redis_client.hget(state_key(job_id), "policy_state")
    if not raw:
        return []
    steps = json.loads(raw).get("trajectory", [])
    return sorted(steps, key=lambda t: t["round"])


def episode_batch(learner, trajectory: list[dict], rewards: list[float]) -> dict:
    """One episode in the rollout format PPOLearner.update takes; the job's end is terminal."""
    import torch

    n = len(rewards)
    obs = np.asarray([t["obs"] for t in trajectory[:n]], dtype=np.float32)
    actions = np.asarray([t["action"] for t in trajectory[:n]], dtype=np.int64)
    with torch.no_grad():  # the network that sampled these actions is the learner's current one
        t_obs = torch.as_tensor(obs)
        dist = learner.policy.distribution(t_obs)
        logp = learner.policy.log_prob(dist, torch.as_tensor(actions)).numpy()
        values = learner.policy.value(t_obs).numpy()
    terminated = np.zeros(n, dtype=bool)
    terminated[-1] = True
    return {"obs": obs, "actions": actions, "logp": logp.astype(np.float32), "values": values.astype(np.float32),
            "rewards": np.asarray(rewards, dtype=np.float32), "terminated": terminated,
            "truncated": np.zeros(n, dtype=bool), "final_values": np.zeros(n, dtype=np.float32),
            "bootstrap_value": 0.0}


def _final_status(client, job_id: str, wait_s: float = 60.0):
    deadline = time.monotonic() + wait_s
    status = client.get(job_id)
    while not status.finished and time.monotonic() < deadline:
        time.sleep(0.2)
        status = client.get(job_id)
    return status


def run_episode(client, redis_client, settings: PretrainSettings, checkpoint: str, episode: int,
                run_id: str) -> tuple[object, list, list[dict]]:
    """Run one training job with the exploring scheduler; (final status, reports, trajectory)."""
    spec = {"env_id": settings.env_id, "preset": settings.preset, "rounds": settings.rounds_per_episode,
            "steps_per_actor": settings.steps_per_actor, "eval_episodes": settings.eval_episodes,
            "budget_usd": settings.budget_usd, "target_return": settings.target_return,
            "seed": settings.seed * 100_003 + episode, "job_id": f"minions-pt-{run_id}-e{episode}",
            # i_min 1: every action of the network is a distinct actor count.
            "scaler": {"policy": "minions", "scheduler": checkpoint, "i_min": 1, "i_max": settings.i_max}}
    status = client.start_training(spec)
    reports = list(client.watch(status.job_id))
    status = _final_status(client, status.job_id)
    return status, reports, read_trajectory(redis_client, status.job_id)


def pretrain(settings: PretrainSettings, client, redis_client, *,
             log: Callable[[str], None] = print) -> PretrainResult:
    """Train a scheduler over `settings.episodes` jobs through the system behind `client`.

    `client` is a NitroClient of the learner; `redis_client` reads the scaler's job state
    (the service user of the same Redis). Returns where the checkpoint went, its wall
    time and dollar cost.
    """
    import torch

    from nitro.algos.ppo import PPOLearner

    settings.validate()
    torch.manual_seed(settings.seed)
    learner = PPOLearner(scheduler_model_spec(settings.i_max), scheduler_ppo_config(settings), seed=settings.seed)
    run_id = uuid.uuid4().hex[:8]
    ref = settings.round_seconds_ref
    episodes: list[EpisodeResult] = []
    jobs_cost = update_seconds = 0.0
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="minions-pretrain-", dir=settings.work_dir or None) as work:
        for e in range(settings.episodes):
            ckpt = os.path.join(os.path.abspath(work), f"explore-{e}.npz")
            minions.save_checkpoint(ckpt, learner.policy.numpy_state(), settings.i_max, mode="explore",
                                    explore_seed=settings.seed * 100_003 + e,
                                    metadata={"pretraining": True, "episode": e})
            status, reports, trajectory = run_episode(client, redis_client, settings, ckpt, e, run_id)
            jobs_cost += status.total_cost_usd
            if not reports:
                raise PretrainError(f"episode {e}: job {status.job_id} {status.state_name} before its first round: "
                                    f"{status.message}")
            if ref <= 0:  # the time penalty's reference pace; the median shrugs off a cold first round
                ref = float(np.median([r.round_seconds for r in reports])) or 1.0
            final_eval = reports[-1].eval_return
            rewards = minions.episode_rewards(
                [r.round_cost_usd for r in reports], [r.round_seconds for r in reports],
                budget_usd=settings.budget_usd, rounds=settings.rounds_per_episode, round_seconds_ref=ref,
                target_return=settings.target_return, final_eval_return=final_eval)
            reached = minions.target_reached(final_eval, settings.target_return, status.total_cost_usd,
                                             settings.budget_usd)
            # Decision t chose round t's actors; decisions for rounds that never ran are dropped.
            steps = [t for t in trajectory if t["round"] < len(reports)]
            # The budget guard may launch fewer actors than chosen, never more.
            trained = [t["round"] for t in steps] == list(range(len(reports))) and all(
                r.actors_launched <= t["action"] + 1 for t, r in zip(steps, reports))
            if trained:
                t_upd = time.perf_counter()
                learner.update([episode_batch(learner, steps, rewards)])
                update_seconds += time.perf_counter() - t_upd
            else:
                log(f"episode {e}: the scheduler's trajectory does not match the job's rounds; not trained on")
            result = EpisodeResult(
                job_id=status.job_id, state=status.state_name, message=status.message, rounds=len(reports),
                actors=[r.actors_launched for r in reports], rewards=[float(x) for x in rewards],
                final_eval_return=float(final_eval), cost_usd=float(status.total_cost_usd), reached_target=reached,
                trained=trained)
            episodes.append(result)
            log(f"episode {e + 1}/{settings.episodes}: job {status.job_id} {status.state_name}, actors "
                f"{result.actors}, eval {final_eval:.1f}, return {sum(rewards):+.3f}, cost ${status.total_cost_usd:.4f}"
                + (", target reached" if reached else ""))
    update_cost = cost.learner_cost(update_seconds, cost.Prices())
    wall = time.monotonic() - t0
    total = jobs_cost + update_cost
    meta = {"pretraining": {
        "env_id": settings.env_id, "episodes": settings.episodes, "rounds_per_episode": settings.rounds_per_episode,
        "steps_per_actor": settings.steps_per_actor, "budget_usd": settings.budget_usd,
        "target_return": settings.target_return, "preset": settings.preset, "seed": settings.seed,
        "round_seconds_ref": ref, "reward": {"cost_weight": minions.COST_WEIGHT, "time_weight": minions.TIME_WEIGHT,
                                             "bonus": minions.TARGET_BONUS},
        "wall_seconds": wall, "cost_usd": total, "jobs_cost_usd": jobs_cost, "update_cost_usd": update_cost,
        "jobs": [ep.job_id for ep in episodes], "episodes_trained": sum(ep.trained for ep in episodes),
        "created_unix": time.time()}}
    out = os.path.abspath(settings.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    minions.save_checkpoint(out, learner.policy.numpy_state(), settings.i_max, mode="serve", metadata=meta)
    return PretrainResult(path=out, wall_seconds=wall, cost_usd=total, jobs_cost_usd=jobs_cost,
                          update_cost_usd=update_cost, round_seconds_ref=ref, episodes=episodes)


def redis_for_state_dir(state_dir: str | os.PathLike):
    """A Redis client as the services' user of the local system running in `state_dir`."""
    from nitro import local_system as ls
    from nitro.redis_server import connect

    state = ls.running_state(state_dir)
    if state is None:
        raise ConfigError(f"no local system is up in {state_dir}")
    with open(state["redis_password_file"]) as f:
        password = f.read().strip()
    return connect(state["redis_url"], password=password)
