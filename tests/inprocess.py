"""Single-process training loop: the same sampler and learner the services use, no network.

Used by learning-regression tests and as a reference point in benchmarks. Each
simulated "actor" is a warm Sampler that continues its episodes across rounds,
exactly like a warm serverless actor. `train_impact` imitates the asynchronous
off-policy loop: actors sample with a policy `policy_lag` updates old (they were
launched while the learner trained), and each update may add replayed batches.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from nitro.algos.impact import IMPACTLearner
from nitro.algos.ppo import PPOLearner, UpdateStats
from nitro.algos.replay import ReplayBuffer
from nitro.config import IMPACTConfig, PPOConfig
from nitro.policy.envs import env_spaces
from nitro.policy.inference import PolicyRunner
from nitro.policy.models import spec_for_spaces
from nitro.policy.rollout import Sampler, evaluate, make_sampler


@dataclass
class RoundRecord:
    round: int
    env_steps: int
    train_return: float
    eval_return: float
    stats: UpdateStats


@dataclass
class InProcessResult:
    rounds: list[RoundRecord] = field(default_factory=list)

    @property
    def env_steps(self) -> int:
        return self.rounds[-1].env_steps if self.rounds else 0


def train_ppo(env_id: str, config: PPOConfig, *, actors: int, steps_per_actor: int, max_env_steps: int,
              seed: int = 0, eval_episodes: int = 5,
              stop: Callable[[RoundRecord], bool] | None = None, envs_per_actor: int = 1) -> InProcessResult:
    """PPO rounds until max_env_steps or `stop`. eval_episodes=0 skips the deterministic evaluation
    (eval_return is NaN); it draws on its own env and rng, so training is the same either way."""
    obs_space, act_space = env_spaces(env_id)
    spec = spec_for_spaces(obs_space, act_space, hidden_sizes=config.hidden_sizes, activation=config.activation,
                           obs_norm=config.obs_norm, init_log_std=config.init_log_std)
    learner = PPOLearner(spec, config, seed=seed)
    samplers = [make_sampler(env_id, seed * 1000 + i, None, envs_per_actor) for i in range(actors)]
    rngs = [np.random.default_rng(seed * 1000 + i) for i in range(actors)]
    result = InProcessResult()
    recent: list[float] = []
    env_steps, rnd = 0, 0
    while env_steps < max_env_steps:
        runner = PolicyRunner(spec, learner.policy.numpy_state(), rnd)
        batches = [s.sample(runner, steps_per_actor, g) for s, g in zip(samplers, rngs)]
        env_steps += actors * steps_per_actor
        for b in batches:
            recent.extend(b["episode_returns"])
        recent = recent[-20:]
        stats = learner.update(batches)
        learner.policy.update_obs_stats(np.concatenate([b["obs"] for b in batches]))
        rnd += 1
        eval_ret = float("nan")
        if eval_episodes > 0:
            eval_runner = PolicyRunner(spec, learner.policy.numpy_state(), rnd)
            eval_ret = float(np.mean(evaluate(eval_runner, env_id, eval_episodes, seed=10_000 + rnd)))
        rec = RoundRecord(rnd, env_steps, float(np.mean(recent)) if recent else float("nan"), eval_ret, stats)
        result.rounds.append(rec)
        if stop is not None and stop(rec):
            break
    for s in samplers:
        s.close()
    return result


def train_impact(env_id: str, config: IMPACTConfig, *, actors: int, steps_per_actor: int, max_env_steps: int,
                 seed: int = 0, eval_episodes: int = 5, policy_lag: int = 1, replay_batches: int = 0,
                 stop: Callable[[RoundRecord], bool] | None = None) -> InProcessResult:
    """IMPACT with actors one (`policy_lag`) policy version behind the learner.

    Each update sees the round's fresh batches plus up to `replay_batches` replayed
    ones from a ReplayBuffer(config.replay_capacity, config.replay_max_reuse).
    eval_episodes=0 skips the deterministic evaluation (eval_return is NaN).
    """
    if policy_lag < 0:
        raise ValueError(f"policy_lag must be >= 0, got {policy_lag}")
    obs_space, act_space = env_spaces(env_id)
    spec = spec_for_spaces(obs_space, act_space, hidden_sizes=config.hidden_sizes, activation=config.activation,
                           obs_norm=config.obs_norm, init_log_std=config.init_log_std)
    learner = IMPACTLearner(spec, config, seed=seed)
    replay = ReplayBuffer(config.replay_capacity, config.replay_max_reuse, seed=seed)
    samplers = [Sampler(env_id, seed=seed * 1000 + i) for i in range(actors)]
    rngs = [np.random.default_rng(seed * 1000 + i) for i in range(actors)]
    versions = deque([learner.policy.numpy_state()], maxlen=policy_lag + 1)  # versions[0]: what actors run
    result = InProcessResult()
    recent: list[float] = []
    env_steps, rnd = 0, 0
    while env_steps < max_env_steps:
        # As an IMPACT job's actors: no per-step values, the bootstrap observations shipped (nitro.policy.rollout)
        runner = PolicyRunner(spec, versions[0], max(rnd - policy_lag, 0), behaviour_values=False)
        batches = [s.sample(runner, steps_per_actor, g) for s, g in zip(samplers, rngs)]
        env_steps += actors * steps_per_actor
        for b in batches:
            recent.extend(b["episode_returns"])
        recent = recent[-20:]
        stats = learner.update(batches + replay.sample(replay_batches))
        for b in batches:
            replay.add(b)
        learner.policy.update_obs_stats(np.concatenate([b["obs"] for b in batches]))
        versions.append(learner.policy.numpy_state())
        rnd += 1
        eval_ret = float("nan")
        if eval_episodes > 0:
            eval_runner = PolicyRunner(spec, learner.policy.numpy_state(), rnd)
            eval_ret = float(np.mean(evaluate(eval_runner, env_id, eval_episodes, seed=10_000 + rnd)))
        rec = RoundRecord(rnd, env_steps, float(np.mean(recent)) if recent else float("nan"), eval_ret, stats)
        result.rounds.append(rec)
        if stop is not None and stop(rec):
            break
    for s in samplers:
        s.close()
    return result
