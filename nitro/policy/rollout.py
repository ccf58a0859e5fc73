"""Sampling: roll a policy out in one environment and produce a trajectory batch.

Episodes continue across `sample` calls (a warm actor keeps its environment), so
a batch may start and end mid-episode. Termination and truncation are kept
apart: at a truncated step the value of the real final observation is recorded
in `final_values` so the learner bootstraps through time limits, while a
terminated step bootstraps with zero.

Batch fields (numpy arrays of length T unless noted):
  obs            (T, *obs_shape) raw observations the policy saw (before normalisation)
  actions        (T, action_dim) float32 for Box (unclipped samples), (T,) int64 for Discrete
  rewards        float32
  terminated     bool: the episode ended in a terminal state at this step
  truncated      bool: the episode was cut by a time limit at this step
  logp           float32 behaviour log-probability of the action
  values         float32 behaviour value estimate V(obs_t)
  final_values   float32 V(final observation) at truncated steps, else 0
  bootstrap_value  float: V(observation after the last step), 0 if the last step ended an episode
  episode_returns, episode_lengths   lists for episodes that finished inside this batch
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nitro.policy.envs import make_env
from nitro.policy.inference import PolicyRunner


class Sampler:
    """One environment plus the in-progress episode state of a (warm) actor."""

    def __init__(self, env_id: str, seed: int | None = None, env_kwargs: dict | None = None):
        self.env_id = env_id
        self.env = make_env(env_id, seed=None, **(env_kwargs or {}))
        self.obs, _ = self.env.reset(seed=seed)
        self.episode_return = 0.0
        self.episode_length = 0

    def reseed(self, seed: int) -> None:
        """Start a fresh episode from `seed` (a new job on a warm actor)."""
        self.obs, _ = self.env.reset(seed=seed)
        self.env.action_space.seed(seed)
        self.episode_return = 0.0
        self.episode_length = 0

    def sample(self, runner: PolicyRunner, num_steps: int, rng: np.random.Generator) -> dict:
        spec = runner.spec
        obs_space = self.env.observation_space
        obs_buf = np.empty((num_steps, *obs_space.shape), dtype=obs_space.dtype)
        if spec.action_kind == "box":
            act_buf = np.empty((num_steps, spec.action_dim), dtype=np.float32)
        else:
            act_buf = np.empty(num_steps, dtype=np.int64)
        rewards = np.empty(num_steps, dtype=np.float32)
        terminated = np.zeros(num_steps, dtype=bool)
        truncated = np.zeros(num_steps, dtype=bool)
        logp = np.empty(num_steps, dtype=np.float32)
        values = np.empty(num_steps, dtype=np.float32)
        final_values = np.zeros(num_steps, dtype=np.float32)
        ep_returns: list[float] = []
        ep_lengths: list[int] = []

        env, obs = self.env, self.obs
        ep_ret, ep_len = self.episode_return, self.episode_length
        # A CNN's critic costs less batched after the rollout than once per step; actions never need it.
        defer = runner.deferred_values
        for t in range(num_steps):
            action, lp, v = runner.act(obs, rng, with_value=not defer)
            obs_buf[t] = obs
            act_buf[t] = action
            logp[t] = lp
            values[t] = v
            obs, r, term, trunc, _ = env.step(runner.env_action(action))
            rewards[t] = r
            ep_ret += float(r)
            ep_len += 1
            if term or trunc:
                if trunc and not term:
                    truncated[t] = True
                    final_values[t] = runner.value(obs)
                else:
                    terminated[t] = True
                ep_returns.append(ep_ret)
                ep_lengths.append(ep_len)
                ep_ret, ep_len = 0.0, 0
                obs, _ = env.reset()
        if defer:
            values[:] = runner.values(obs_buf)
        last_done = bool(terminated[-1] or truncated[-1]) if num_steps else True
        bootstrap = 0.0 if last_done else runner.value(obs)
        self.obs, self.episode_return, self.episode_length = obs, ep_ret, ep_len
        return {
            "obs": obs_buf, "actions": act_buf, "rewards": rewards, "terminated": terminated,
            "truncated": truncated, "logp": logp, "values": values, "final_values": final_values,
            "bootstrap_value": float(bootstrap), "episode_returns": ep_returns, "episode_lengths": ep_lengths,
        }

    def close(self) -> None:
        self.env.close()


def evaluate(runner: PolicyRunner, env_id: str, episodes: int, seed: int, env_kwargs: dict | None = None,
             max_steps: int = 1_000_000, on_frame: Callable[[np.ndarray], None] | None = None) -> list[float]:
    """Deterministic evaluation: mean action (Box) or argmax (Discrete), fresh env per call, episode i
    on seed + i. `on_frame` receives every rgb_array frame of the first episode (for a video)."""
    kwargs = dict(env_kwargs or {}, **({"render_mode": "rgb_array"} if on_frame else {}))
    env = make_env(env_id, **kwargs)
    rng = np.random.default_rng(seed)
    returns = []
    try:
        for ep in range(episodes):
            obs, _ = env.reset(seed=seed + ep)
            record = on_frame if ep == 0 else None
            if record:
                record(env.render())
            total, steps, done = 0.0, 0, False
            while not done and steps < max_steps:
                action, _, _ = runner.act(obs, rng, deterministic=True, with_value=False)
                obs, r, term, trunc, _ = env.step(runner.env_action(action))
                total += float(r)
                steps += 1
                done = term or trunc
                if record:
                    record(env.render())
            returns.append(total)
    finally:
        env.close()
    return returns
