"""Pre-training of the MinionsRL actor scheduler (`nitro pretrain-minions`).

One episode is one short training job whose actor counts the scheduler chooses: the
current network, in *explore* mode, samples each round's count (1..I_max) and the
driver records each decision's observation and action. After every
`episodes_per_update` jobs the driver computes the rewards
(nitro.scaling.minions.episode_rewards: the return each round bought minus its cost
and time) and does one update with this project's PPO (nitro.algos.ppo.PPOLearner)
over those jobs together. At the end the network is saved as a "serve" (argmax)
checkpoint, with the distribution of the actor counts it picks (decision_distribution)
and the pre-training's cost in its metadata.

Two ways to run the jobs:

- in this process (`pretrain(settings)`, the default of the command): the learner's
  PPO and the actors' sampler on the target environment, the scheduler deciding
  through the scaler's own `MinionsPolicy.decide` and the budget guard
  (`plan_within_budget`). Each round is timed and billed on the cloud clock
  (docs/cost.md, nitro.cost.cloud_launch): every actor invocation on its own vCPU
  for its CPU time, the launch lasting its slowest invocation (plus the invoke
  overhead, and the cold start of sandboxes beyond those the job already had), the
  round lasting the launch plus the update and the evaluation in CPU time. Cheap
  enough for the tens of episodes a useful scheduler needs.
- through a running system (`pretrain(settings, client, redis_client)`): every episode
  is a real job through the learner, detector, scaler and actor functions; the
  scaler's minions policy records the trajectory in its per-job state in Redis. The
  reward reads the reports' cloud-clock time and cost: on one machine every actor
  shares the same cores, so the machine clock makes each extra actor cost round time
  that it would not cost on the cloud.

Cost: the CPU seconds the pre-training consumed (this process and its reaped
children, from getrusage) converted with nitro.cost: the actors' sampling as Lambda
invocations (lambda_cost), everything else as learner-server time (learner_cost).
Through a system the services' work is billed by the scaler's ledger instead: the
jobs' total_cost_usd plus the driver's own CPU as learner time.
"""

from __future__ import annotations

import json
import math
import os
import resource
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from nitro import cost
from nitro.clock import critical_path_cpu_seconds
from nitro.contracts import DEFAULT_ACTOR_MEMORY_MB, scaler_state_key
from nitro.errors import ConfigError
from nitro.scaling import minions
from nitro.spec import MAX_ACTORS, MAX_STEPS_PER_ACTOR

FIRST_ROUND_MS_PER_STEP = 1.0  # budget guard's guess of an actor's CPU per step before one was measured


class PretrainError(RuntimeError):
    """An episode could not run at all (its job failed before any round): pre-training stops."""


@dataclass
class PretrainSettings:
    env_id: str = "Hopper-v5"
    episodes: int = 32
    rounds_per_episode: int = 5
    i_max: int = 8
    steps_per_actor: int = 256
    budget_usd: float = 0.01  # per episode; with budget_min_usd, the largest
    budget_min_usd: float = 0.001  # each episode's budget is log-uniform in [min, budget]; 0 = always budget_usd
    target_return: float = 0.0  # 0 = no target (no terminal bonus); use the target the served jobs have
    seed: int = 0
    preset: str = "tuned"  # the training jobs' PPO preset
    eval_episodes: int = 3
    round_seconds_ref: float = 0.0  # time penalty reference; 0 = the first update's median round time
    return_scale: float = 0.0  # progress reference; 0 = the first update's median eval-return spread per job
    episodes_per_update: int = 4  # jobs per PPO update of the scheduler
    holdout_jobs: int = 2  # in-process only: jobs served greedily on unseen seeds after training
    out: str = "minions-scheduler.npz"
    work_dir: str = ""  # exploration checkpoints (through a system); must be readable by the scaler
    actor_memory_mb: int = DEFAULT_ACTOR_MEMORY_MB  # what an in-process actor is billed as
    lr: float = 1e-3  # the scheduler's PPO
    epochs: int = 8
    entropy_coeff: float = 0.01
    gamma: float = 0.5

    def validate(self) -> PretrainSettings:
        def bad(name: str, what: str, value) -> ConfigError:
            return ConfigError(f"{name}: must be {what}, got {value!r}")

        def integer(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def number(v) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        if not isinstance(self.env_id, str) or not self.env_id:
            raise bad("env", "a Gymnasium id, e.g. Hopper-v5", self.env_id)
        for name, value, lo, hi in (("episodes", self.episodes, 1, 100_000),
                                    ("rounds_per_episode", self.rounds_per_episode, 1, 10_000),
                                    ("i_max", self.i_max, 1, MAX_ACTORS),
                                    ("steps_per_actor", self.steps_per_actor, 1, MAX_STEPS_PER_ACTOR),
                                    ("eval_episodes", self.eval_episodes, 1, 1000),
                                    ("episodes_per_update", self.episodes_per_update, 1, 100_000),
                                    ("holdout_jobs", self.holdout_jobs, 0, 1000),
                                    ("actor_memory_mb", self.actor_memory_mb, 128, 10240),
                                    ("epochs", self.epochs, 1, 1000),
                                    ("seed", self.seed, 0, 2**31 - 1)):
            if not integer(value) or not lo <= value <= hi:
                what = f"an integer in [{lo}, {hi}]"
                if name == "eval_episodes":
                    what += " (the scheduler's reward needs the evaluation return)"
                raise bad(name, what, value)
        if not (number(self.budget_usd) and self.budget_usd > 0):
            raise bad("budget", "a finite number > 0 (USD per episode)", self.budget_usd)
        if not (number(self.budget_min_usd) and 0 <= self.budget_min_usd <= self.budget_usd):
            raise bad("budget_min", f"a number in [0, budget = {self.budget_usd!r}] (0 = every job gets the budget)",
                      self.budget_min_usd)
        if not number(self.target_return):
            raise bad("target_return", "a finite number", self.target_return)
        if not (number(self.round_seconds_ref) and self.round_seconds_ref >= 0):
            raise bad("round_seconds_ref", "a finite number >= 0 (0 = measured)", self.round_seconds_ref)
        if not (number(self.return_scale) and self.return_scale >= 0):
            raise bad("return_scale", "a finite number >= 0 (0 = measured)", self.return_scale)
        if not (number(self.lr) and self.lr > 0):
            raise bad("lr", "a finite number > 0", self.lr)
        if not (number(self.gamma) and 0 <= self.gamma <= 1):
            raise bad("gamma", "a number in [0, 1]", self.gamma)
        if not (number(self.entropy_coeff) and self.entropy_coeff >= 0):
            raise bad("entropy_coeff", "a finite number >= 0", self.entropy_coeff)
        if not self.out:
            raise bad("out", "a file path", self.out)
        return self

    def episode_budget(self, episode: int) -> float:
        """Episode `episode`'s budget: log-uniform in [budget_min_usd, budget_usd] (reproducible per seed),
        so the scheduler sees jobs where money is short as well as jobs where it is not."""
        lo, hi = self.budget_min_usd, self.budget_usd
        if lo <= 0 or lo >= hi:
            return hi
        u = float(np.random.default_rng([self.seed, episode, 17]).random())
        return float(math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))))


@dataclass
class Episode:
    """One training job as the scheduler saw it: its decisions and what each round cost and bought."""

    job_id: str
    state: str
    message: str
    steps: list[dict]  # {round, obs, action} for every round that ran, in round order
    actors: list[int]  # actors launched per round (the budget guard may launch fewer than chosen)
    round_costs_usd: list[float]
    round_seconds: list[float]
    eval_returns: list[float]  # after each round's update
    initial_eval_return: float | None  # before round 0 (None: not measured)
    total_cost_usd: float
    budget_usd: float
    trained: bool = True  # False when the trajectory did not match the rounds (nothing learned from it)


@dataclass
class EpisodeResult:
    job_id: str
    state: str
    message: str
    rounds: int
    actors: list[int]
    rewards: list[float]
    budget_usd: float
    final_eval_return: float
    cost_usd: float
    reached_target: bool
    trained: bool
    observations: list[list[float]] = field(default_factory=list)  # the scheduler's input for each round


@dataclass
class PretrainResult:
    path: str
    via: str  # "inprocess" or "system"
    wall_seconds: float
    cpu_seconds: float  # this process and its reaped children
    cost_usd: float  # the pre-training's modelled dollars (see the module docstring)
    cpu_cost_usd: float  # cpu_seconds billed: sampling as Lambda actors, the rest as learner-server time
    jobs_cost_usd: float  # the episodes' jobs as billed (system: the scaler's ledger; in-process: the round model)
    round_seconds_ref: float
    return_scale: float
    decisions: dict[str, dict[int, int]] = field(default_factory=dict)  # decision_distribution results
    episodes: list[EpisodeResult] = field(default_factory=list)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (all threads) and of its children that have been waited for."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def scheduler_model_spec(i_max: int):
    from nitro.policy.models import ModelSpec

    # obs_norm: the features are standardised with the running statistics of the inputs pre-training
    # saw, which the checkpoint stores; bounded features alone vary too little on a real job (a
    # round time share of 0.01-0.1, a budget share near 1) to move a tanh network's logits.
    return ModelSpec((minions.OBS_DIM,), "discrete", i_max, hidden_sizes=minions.HIDDEN_SIZES,
                     activation=minions.ACTIVATION, obs_norm=True)


def scheduler_ppo_config(settings: PretrainSettings):
    """PPO for a few dozen transitions per update: one full-batch step per epoch, a little entropy
    so the sampled actor counts keep exploring, and a short horizon (gamma 0.5): a round's return
    change is mostly its own samples' doing, and crediting each decision with every later round's
    noisy evaluation would drown that signal."""
    from nitro.config import PPOConfig

    return PPOConfig(lr=settings.lr, epochs=settings.epochs, minibatch_size=0, gamma=settings.gamma, gae_lambda=0.95,
                     clip=0.2, kl_coeff=0.0, entropy_coeff=settings.entropy_coeff, value_coeff=0.5,
                     max_grad_norm=0.5, normalize_advantages=True, hidden_sizes=minions.HIDDEN_SIZES,
                     activation=minions.ACTIVATION)


def read_trajectory(redis_client, job_id: str) -> list[dict]:
    """The exploring scheduler's decisions for `job_id`, by round, from the scaler's job state."""
    raw = redis_client.hget(scaler_state_key(job_id), "policy_state")
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


def measured_return_scale(episodes: list[Episode]) -> float:
    """The median spread (max - min) of the evaluation returns within a job, initial return included:
    the return gain a job typically shows, so a job's progress term sums to about 1."""
    spreads = []
    for ep in episodes:
        vals = [v for v in [ep.initial_eval_return, *ep.eval_returns] if v is not None and math.isfinite(v)]
        if len(vals) >= 2:
            spreads.append(max(vals) - min(vals))
    scale = float(np.median(spreads)) if spreads else 0.0
    return scale if scale > 0 else 1.0


# -- episodes in this process -------------------------------------------------------------


class InProcessJobs:
    """Short PPO training jobs run in this process, rounds timed and billed on the cloud clock.

    The learner's PPO and the actors' Sampler are the ones the services use. Actor i of a
    job is sampler i (its environment is kept across rounds, reseeded per job). An
    invocation's modelled duration is the CPU time of its sampling (its own vCPU on
    Lambda); a launch lasts its slowest invocation (nitro.cost.cloud_launch: invoke
    overhead, plus the cold start for invocations beyond the most the job launched
    before; the init CPU of a cold sandbox is not modelled); a round lasts the launch
    plus the update and the evaluation (CPU time) and costs that time of learner server
    plus the invocations' GB-seconds and requests.
    """

    def __init__(self, settings: PretrainSettings, prices: cost.Prices | None = None):
        from nitro.config import ppo_config
        from nitro.policy.envs import env_spaces
        from nitro.policy.models import spec_for_spaces

        self.settings = settings
        self.prices = prices or cost.Prices()
        self.config = ppo_config(settings.preset)
        obs_space, act_space = env_spaces(settings.env_id)
        c = self.config
        self.spec = spec_for_spaces(obs_space, act_space, hidden_sizes=c.hidden_sizes, activation=c.activation,
                                    obs_norm=c.obs_norm, init_log_std=c.init_log_std)
        self.samplers: list = []
        self.invocations = 0
        self.sampling_cpu_s = 0.0
        self.sampling_billed_ms = 0

    def close(self) -> None:
        for s in self.samplers:
            s.close()
        self.samplers = []

    def _actor(self, i: int, job_seed: int, fresh: set[int]):
        from nitro.policy.rollout import Sampler

        while len(self.samplers) <= i:
            self.samplers.append(Sampler(self.settings.env_id))
        if i not in fresh:  # first use in this job: a new episode from the job's seed
            self.samplers[i].reseed((job_seed * 1009 + i) % 2**31)
            fresh.add(i)
        return self.samplers[i]

    def _evaluate(self, learner, job_seed: int, k: int) -> tuple[float, float]:
        from nitro.policy.inference import PolicyRunner
        from nitro.policy.rollout import evaluate

        c0 = time.thread_time()
        runner = PolicyRunner(self.spec, learner.policy.numpy_state(), k + 1)
        ret = float(np.mean(evaluate(runner, self.settings.env_id, self.settings.eval_episodes,
                                     seed=(job_seed * 7919 + 1000 + k) % 2**31)))
        return ret, time.thread_time() - c0

    def run(self, scheduler: minions.Scheduler, *, job_seed: int, job_id: str, budget_usd: float) -> Episode:
        from nitro.algos.ppo import PPOLearner
        from nitro.policy.inference import PolicyRunner
        from nitro.scaling import RoundInputs, plan_within_budget

        st, prices = self.settings, self.prices
        mem = st.actor_memory_mb
        learner = PPOLearner(self.spec, self.config, seed=job_seed)
        policy = minions.MinionsPolicy(scheduler)
        initial, _ = self._evaluate(learner, job_seed, -1)
        ep = Episode(job_id=job_id, state="SUCCEEDED", message="", steps=[], actors=[], round_costs_usd=[],
                     round_seconds=[], eval_returns=[], initial_eval_return=initial, total_cost_usd=0.0,
                     budget_usd=budget_usd)
        fresh: set[int] = set()
        warm = 0  # sandboxes the job has had so far
        state: dict = {}
        last: dict = {}
        per_actor_usd = cost.lambda_cost(st.steps_per_actor * FIRST_ROUND_MS_PER_STEP, 1, mem, prices)
        for k in range(st.rounds_per_episode):
            inputs = RoundInputs(
                round_index=k, i_min=1, i_max=st.i_max, rounds=st.rounds_per_episode,
                learner_loss=last.get("loss", 0.0), eval_return=last.get("eval_return", 0.0),
                approx_kl=last.get("kl", 0.0), update_seconds=last.get("update_seconds", 0.0),
                actor_seconds=last.get("actor_seconds", 0.0), round_seconds=last.get("round_seconds", 0.0),
                target_return=st.target_return, budget_usd=budget_usd,
                budget_left_usd=budget_usd - ep.total_cost_usd)
            wanted, state, _ = policy.decide(state, inputs)
            fixed_usd = cost.learner_cost(last.get("round_seconds", 0.0), prices)
            n, exhausted, _ = plan_within_budget(wanted, 1, per_actor_usd, fixed_usd, inputs.budget_left_usd)
            if exhausted:
                ep.message = f"budget exhausted before round {k}"
                break
            ep.steps.append({"round": k, "obs": [float(x) for x in minions.observation(inputs)],
                             "action": wanted - 1})
            runner = PolicyRunner(self.spec, learner.policy.numpy_state(), k)
            batches, durations = [], []
            for i in range(n):
                actor = self._actor(i, job_seed, fresh)
                rng = np.random.default_rng([job_seed, k, i])
                c0 = time.thread_time()
                batches.append(actor.sample(runner, st.steps_per_actor, rng))
                durations.append(time.thread_time() - c0)
            c0 = critical_path_cpu_seconds()  # the learner's thread, and what it waited for beyond it
            stats = learner.update(batches)
            learner.policy.update_obs_stats(np.concatenate([b["obs"] for b in batches]))
            update_s = critical_path_cpu_seconds() - c0
            ret, eval_s = self._evaluate(learner, job_seed, k)
            cold = cost.cold_invocations(n, warm)
            launch_s, billed_each = cost.cloud_launch(
                [(d * 1000.0, 0.0, i >= n - cold) for i, d in enumerate(durations)], prices)
            warm = max(warm, n)
            billed = sum(billed_each)
            actors_usd = cost.lambda_cost(billed, n, mem, prices)
            round_s = cost.cloud_round_seconds({"sample": launch_s, "update": update_s, "evaluate": eval_s})
            round_usd = cost.learner_cost(round_s, prices) + actors_usd
            self.invocations += n
            self.sampling_cpu_s += sum(durations)
            self.sampling_billed_ms += billed
            per_actor_usd = actors_usd / n
            ep.actors.append(n)
            ep.round_costs_usd.append(round_usd)
            ep.round_seconds.append(round_s)
            ep.eval_returns.append(ret)
            ep.total_cost_usd += round_usd
            last = {"loss": stats.loss, "eval_return": ret, "kl": stats.kl, "update_seconds": update_s,
                    "actor_seconds": launch_s, "round_seconds": round_s}
            if st.target_return > 0 and ret >= st.target_return:
                ep.message = f"target return reached in round {k}"
                break
        return ep


# -- episodes through a running system ----------------------------------------------------


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
            "budget_usd": settings.episode_budget(episode), "target_return": settings.target_return,
            "seed": settings.seed * 100_003 + episode, "job_id": f"minions-pt-{run_id}-e{episode}",
            # i_min 1: every action of the network is a distinct actor count.
            "scaler": {"policy": "minions", "scheduler": checkpoint, "i_min": 1, "i_max": settings.i_max}}
    status = client.start_training(spec)
    reports = list(client.watch(status.job_id))
    status = _final_status(client, status.job_id)
    return status, reports, read_trajectory(redis_client, status.job_id)


def system_episode(client, redis_client, settings: PretrainSettings, checkpoint: str, episode: int,
                   run_id: str) -> Episode:
    status, reports, trajectory = run_episode(client, redis_client, settings, checkpoint, episode, run_id)
    # Decision t chose round t's actors; decisions for rounds that never ran are dropped.
    steps = [t for t in trajectory if t["round"] < len(reports)]
    # The budget guard may launch fewer actors than chosen, never more.
    trained = bool(reports) and [t["round"] for t in steps] == list(range(len(reports))) and all(
        r.actors_launched <= t["action"] + 1 for t, r in zip(steps, reports))
    return Episode(job_id=status.job_id, state=status.state_name, message=status.message, steps=steps,
                   actors=[r.actors_launched for r in reports],
                   round_costs_usd=[r.cloud_round_cost_usd for r in reports],
                   round_seconds=[r.cloud_round_seconds for r in reports],
                   eval_returns=[r.eval_return for r in reports], initial_eval_return=None,
                   total_cost_usd=float(status.cloud_total_cost_usd), budget_usd=settings.episode_budget(episode),
                   trained=trained)


# -- the driver ---------------------------------------------------------------------------


def _update(learner, pending: list[Episode], settings: PretrainSettings, ref: float, scale: float,
            results: list[EpisodeResult], log: Callable[[str], None], after: int) -> tuple[float, float]:
    """Rewards for `pending` jobs, one PPO update of the scheduler over them, and their results appended.
    Returns the (possibly just measured) time and return references."""
    if ref <= 0:  # the time penalty's reference pace
        ref = float(np.median([s for p in pending for s in p.round_seconds])) or 1.0
    if scale <= 0:  # the progress term's reference gain
        scale = measured_return_scale(pending)
    batches, totals = [], []
    for p in pending:
        rewards = minions.episode_rewards(
            p.round_costs_usd, p.round_seconds, budget_usd=p.budget_usd, rounds=settings.rounds_per_episode,
            round_seconds_ref=ref, target_return=settings.target_return, final_eval_return=p.eval_returns[-1],
            eval_returns=p.eval_returns, return_scale=scale, initial_eval_return=p.initial_eval_return)
        totals.append(sum(rewards))
        if p.trained:
            batches.append(episode_batch(learner, p.steps, rewards))
        results.append(EpisodeResult(
            job_id=p.job_id, state=p.state, message=p.message, rounds=len(p.actors), actors=p.actors,
            rewards=[float(x) for x in rewards], budget_usd=p.budget_usd, final_eval_return=float(p.eval_returns[-1]),
            cost_usd=p.total_cost_usd, reached_target=minions.target_reached(
                p.eval_returns[-1], settings.target_return, p.total_cost_usd, p.budget_usd),
            trained=p.trained, observations=[t["obs"] for t in p.steps]))
    if batches:
        learner.update(batches)
        learner.policy.update_obs_stats(np.concatenate([b["obs"] for b in batches]))
    log(f"update after episode {after}: {len(batches)} jobs, mean reward {np.mean(totals):+.3f}, "
        f"mean actors {np.mean([a for p in pending for a in p.actors]):.1f}")
    return ref, scale


def pretrain(settings: PretrainSettings, client=None, redis_client=None, *,
             log: Callable[[str], None] = print) -> PretrainResult:
    """Train a scheduler over `settings.episodes` jobs; save it to `settings.out`.

    Without `client` the jobs run in this process (InProcessJobs). With `client` (a
    NitroClient of a running system's learner) they run through that system, and
    `redis_client` (the services' user of its Redis) reads the scaler's job state.
    """
    import torch

    from nitro.algos.ppo import PPOLearner

    settings.validate()
    via = "inprocess" if client is None else "system"
    if via == "system" and redis_client is None:
        raise ConfigError("pre-training through a system needs a Redis client for the scaler's job state")
    prices = cost.Prices()
    cpu0, t0 = cpu_seconds(), time.monotonic()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the services run torch; also keeps the CPU accounting per thread exact
    torch.manual_seed(settings.seed)
    learner = PPOLearner(scheduler_model_spec(settings.i_max), scheduler_ppo_config(settings), seed=settings.seed)
    run_id = uuid.uuid4().hex[:8]
    ref, scale = settings.round_seconds_ref, settings.return_scale
    results: list[EpisodeResult] = []
    pending: list[Episode] = []
    last_batch: list[Episode] = []
    jobs_cost = 0.0
    holdout: list[int] = []
    jobs = InProcessJobs(settings, prices) if via == "inprocess" else None
    try:
        with tempfile.TemporaryDirectory(prefix="minions-pretrain-", dir=settings.work_dir or None) as work:
            for e in range(settings.episodes):
                seed = settings.seed * 100_003 + e
                if jobs is not None:
                    sched = minions.scheduler_from_state(learner.policy.numpy_state(), settings.i_max,
                                                         mode="explore", explore_seed=seed)
                    ep = jobs.run(sched, job_seed=seed, job_id=f"minions-pt-{run_id}-e{e}",
                                  budget_usd=settings.episode_budget(e))
                else:
                    ckpt = os.path.join(os.path.abspath(work), f"explore-{e}.npz")
                    minions.save_checkpoint(ckpt, learner.policy.numpy_state(), settings.i_max, mode="explore",
                                            explore_seed=seed, metadata={"pretraining": True, "episode": e})
                    ep = system_episode(client, redis_client, settings, ckpt, e, run_id)
                jobs_cost += ep.total_cost_usd
                if not ep.actors and jobs is not None and ep.message.startswith("budget exhausted"):
                    log(f"episode {e + 1}/{settings.episodes}: its budget ${ep.budget_usd:.4f} does not pay for one "
                        "round; skipped")
                    continue
                if not ep.actors:
                    raise PretrainError(f"episode {e}: job {ep.job_id} {ep.state} before its first round: "
                                        f"{ep.message}")
                log(f"episode {e + 1}/{settings.episodes}: job {ep.job_id} {ep.state}, actors {ep.actors}, "
                    f"eval {ep.eval_returns[-1]:.1f}, cost ${ep.total_cost_usd:.4f} of ${ep.budget_usd:.4f}"
                    + (f" ({ep.message})" if ep.message else "")
                    + ("" if ep.trained else " (its trajectory does not match its rounds: not trained on)"))
                pending.append(ep)
                if len(pending) >= settings.episodes_per_update or e + 1 == settings.episodes:
                    ref, scale = _update(learner, pending, settings, ref, scale, results, log, e + 1)
                    last_batch, pending = pending, []
            if pending:  # the last episodes were skipped after these
                ref, scale = _update(learner, pending, settings, ref, scale, results, log, settings.episodes)
                last_batch = pending
            if not results:
                raise PretrainError("no episode ran a round: every job's budget was too small for one round")
            state = learner.policy.numpy_state()
            serve = minions.scheduler_from_state(state, settings.i_max, mode="serve")
            if jobs is not None:
                for h in range(settings.holdout_jobs):
                    ep = jobs.run(serve, job_seed=settings.seed * 100_003 + settings.episodes + 1000 + h,
                                  job_id=f"minions-pt-{run_id}-holdout{h}",
                                  budget_usd=settings.episode_budget(settings.episodes + 1000 + h))
                    holdout += [t["action"] + 1 for t in ep.steps]
                    jobs_cost += ep.total_cost_usd
    finally:
        if jobs is not None:
            jobs.close()
        torch.set_num_threads(threads)
    decisions = {"last_episodes": minions.decision_distribution(
        serve, [t["obs"] for p in last_batch for t in p.steps])}
    if jobs is not None and settings.holdout_jobs:
        decisions["holdout_jobs"] = {n: holdout.count(n) for n in range(1, settings.i_max + 1)}
    wall = time.monotonic() - t0
    cpu = cpu_seconds() - cpu0
    if jobs is not None:
        cpu_cost = (cost.learner_cost(max(0.0, cpu - jobs.sampling_cpu_s), prices)
                    + cost.lambda_cost(jobs.sampling_billed_ms, jobs.invocations, settings.actor_memory_mb, prices))
        total = cpu_cost
    else:  # the services' work is in the jobs' ledger; this process only drove them
        cpu_cost = cost.learner_cost(cpu, prices)
        total = jobs_cost + cpu_cost
    meta = {"pretraining": {
        "via": via, "env_id": settings.env_id, "episodes": settings.episodes,
        "episodes_per_update": settings.episodes_per_update, "rounds_per_episode": settings.rounds_per_episode,
        "i_max": settings.i_max, "steps_per_actor": settings.steps_per_actor, "budget_usd": settings.budget_usd,
        "budget_min_usd": settings.budget_min_usd, "target_return": settings.target_return, "preset": settings.preset, "eval_episodes": settings.eval_episodes,
        "seed": settings.seed, "round_seconds_ref": ref, "return_scale": scale,
        "reward": {"progress_weight": minions.PROGRESS_WEIGHT, "cost_weight": minions.COST_WEIGHT,
                   "time_weight": minions.TIME_WEIGHT, "bonus": minions.TARGET_BONUS},
        "scheduler_ppo": {"lr": settings.lr, "epochs": settings.epochs, "entropy_coeff": settings.entropy_coeff,
                          "gamma": settings.gamma},
        "wall_seconds": wall, "cpu_seconds": cpu, "cost_usd": total, "cpu_cost_usd": cpu_cost,
        "jobs_cost_usd": jobs_cost,
        "sampling": ({"invocations": jobs.invocations, "cpu_seconds": jobs.sampling_cpu_s,
                      "billed_ms": jobs.sampling_billed_ms, "memory_mb": settings.actor_memory_mb}
                     if jobs is not None else None),
        "jobs": [ep.job_id for ep in results], "episodes_trained": sum(ep.trained for ep in results),
        # JSON object keys are strings: {"actors": count}
        "decisions": {k: {str(n): c for n, c in h.items()} for k, h in decisions.items()},
        "created_unix": time.time()}}
    out = os.path.abspath(settings.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    minions.save_checkpoint(out, state, settings.i_max, mode="serve", metadata=meta)
    return PretrainResult(path=out, via=via, wall_seconds=wall, cpu_seconds=cpu, cost_usd=total,
                          cpu_cost_usd=cpu_cost, jobs_cost_usd=jobs_cost, round_seconds_ref=ref,
                          return_scale=scale, decisions=decisions, episodes=results)
