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

Several environments per actor (VecSampler, envs_per_actor N > 1): the N envs step
in lockstep with one batched inference per step, and the batch is laid out env-major:
env i's steps form one contiguous segment, in time order, so the learner sees N
ordinary trajectories back to back and its GAE/V-trace run unchanged. A segment that
ends mid-episode (all but the last) is cut exactly like a time limit: `truncated` is
set and `final_values` holds V(the env's next observation), which is the
`bootstrap_value` that env would have had alone. Such steps are also marked in
  cut            bool (T,): a segment cut, not an episode end (only in batches of N > 1 envs)
so nitro.batching can tell cuts from finished episodes. Episode lists are ordered by
the position in the batch of the step that ended them. `num_steps` is the total over
the N envs (env i gets num_steps // N steps, one more for the first num_steps % N).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nitro.envs import make_env
from nitro.inference import PolicyRunner


MAX_ENVS_PER_ACTOR = 256


def env_seed(seed: int | None, index: int) -> int | None:
    """Seed of an actor's env `index` from the actor's seed: env 0 keeps the seed itself (so one env per
    actor is exactly the single-env sampler), env i > 0 a deterministic SeedSequence draw of (seed, i)."""
    if seed is None or index == 0:
        return seed
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1, dtype=np.uint64)[0] % (2**62))


def make_sampler(env_id: str, seed: int | None = None, env_kwargs: dict | None = None, envs_per_actor: int = 1):
    """The sampler an actor uses: the single-env Sampler for 1 env, else a VecSampler of `envs_per_actor` envs."""
    if envs_per_actor == 1:
        return Sampler(env_id, seed=seed, env_kwargs=env_kwargs)
    return VecSampler(env_id, envs_per_actor, seed=seed, env_kwargs=env_kwargs)


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


class VecSampler:
    """N environments stepped in lockstep with one batched inference per step (see the module docstring).

    Its own loop over a list of environments rather than gymnasium's SyncVectorEnv: no autoreset
    bookkeeping or info merging per step, and a final observation needs no special case
    (bench/actor_sampling.py measures both).
    """

    def __init__(self, env_id: str, num_envs: int, seed: int | None = None, env_kwargs: dict | None = None):
        if not 1 <= num_envs <= MAX_ENVS_PER_ACTOR:
            raise ValueError(f"envs_per_actor must be in [1, {MAX_ENVS_PER_ACTOR}], got {num_envs}")
        self.env_id = env_id
        self.envs = []
        try:
            for _ in range(num_envs):
                self.envs.append(make_env(env_id, seed=None, **(env_kwargs or {})))
        except BaseException:
            self.close()
            raise
        self.env = self.envs[0]
        self._reset_all(seed, seed_actions=False)

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def _reset_all(self, seed: int | None, seed_actions: bool) -> None:
        first, _ = self.envs[0].reset(seed=seed)
        self.obs = np.empty((len(self.envs), *np.shape(first)), dtype=np.asarray(first).dtype)
        self.obs[0] = first
        for i, env in enumerate(self.envs):
            s = env_seed(seed, i)
            if i:
                self.obs[i], _ = env.reset(seed=s)
            if seed_actions:
                env.action_space.seed(s)
        self.episode_returns = [0.0] * len(self.envs)
        self.episode_lengths = [0] * len(self.envs)

    def reseed(self, seed: int) -> None:
        """Fresh episodes in every env, env i from env_seed(seed, i) (reproducible runs)."""
        self._reset_all(seed, seed_actions=True)

    def sample(self, runner: PolicyRunner, num_steps: int, rng: np.random.Generator) -> dict:
        spec, n_envs, envs = runner.spec, len(self.envs), self.envs
        if not 1 <= n_envs <= max(num_steps, 1):
            raise ValueError(f"cannot spread {num_steps} steps over {n_envs} environments (at least one each)")
        lengths = np.full(n_envs, num_steps // n_envs, dtype=np.int64)
        lengths[:num_steps % n_envs] += 1  # longer segments first: the last lockstep steps a prefix of the envs
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        obs_space = self.env.observation_space
        obs_buf = np.empty((num_steps, *obs_space.shape), dtype=obs_space.dtype)
        if spec.action_kind == "box":
            act_buf = np.empty((num_steps, spec.action_dim), dtype=np.float32)
        else:
            act_buf = np.empty(num_steps, dtype=np.int64)
        rewards = np.empty(num_steps, dtype=np.float32)
        terminated = np.zeros(num_steps, dtype=bool)
        truncated = np.zeros(num_steps, dtype=bool)
        cut = np.zeros(num_steps, dtype=bool)
        logp = np.empty(num_steps, dtype=np.float32)
        values = np.empty(num_steps, dtype=np.float32)
        final_values = np.zeros(num_steps, dtype=np.float32)
        episodes: list[tuple[int, float, int]] = []  # (row of the last step, return, length)
        trunc_rows: list[int] = []
        trunc_obs: list[np.ndarray] = []

        obs = self.obs
        ep_ret, ep_len = list(self.episode_returns), list(self.episode_lengths)
        reward_row = np.empty(n_envs, dtype=np.float32)
        defer = runner.deferred_values
        act_batch, env_action = runner.act_batch, runner.env_action
        for t in range(int(lengths[0])):
            k = int(np.count_nonzero(lengths > t))  # envs that still step (all but the last lockstep: n_envs)
            o = obs if k == n_envs else obs[:k]
            actions, lp, v = act_batch(o, rng, with_value=not defer)
            rows = starts[:k] + t
            obs_buf[rows] = o
            act_buf[rows] = actions
            logp[rows] = lp
            values[rows] = v
            env_actions = env_action(actions)
            for i in range(k):
                ob, r, term, trunc, _ = envs[i].step(env_actions[i])
                reward_row[i] = r
                ep_ret[i] += float(r)
                ep_len[i] += 1
                if term or trunc:
                    row = int(rows[i])
                    if trunc and not term:
                        truncated[row] = True
                        trunc_rows.append(row)
                        trunc_obs.append(np.array(ob))
                    else:
                        terminated[row] = True
                    episodes.append((row, ep_ret[i], ep_len[i]))
                    ep_ret[i], ep_len[i] = 0.0, 0
                    ob, _ = envs[i].reset()
                obs[i] = ob
            rewards[rows] = reward_row[:k]
        if defer:
            values[:] = runner.values(obs_buf)
        # One batched inference for the truncations' final observations and the envs' next observations.
        tail = runner.value_batch(np.concatenate([np.stack(trunc_obs), obs]) if trunc_obs else obs)
        if trunc_rows:
            final_values[trunc_rows] = tail[:len(trunc_rows)]
        next_v = tail[len(trunc_rows):]
        bootstrap = 0.0
        for i in range(n_envs):  # every env has at least one step
            last = int(starts[i] + lengths[i] - 1)
            if terminated[last] or truncated[last]:
                continue
            if i == n_envs - 1:  # the batch's last step: the usual bootstrap
                bootstrap = float(next_v[i])
            else:  # cut mid-episode: bootstrap from V(next observation) as at a time limit
                truncated[last] = cut[last] = True
                final_values[last] = next_v[i]
        episodes.sort(key=lambda e: e[0])
        self.obs, self.episode_returns, self.episode_lengths = obs, ep_ret, ep_len
        return {
            "obs": obs_buf, "actions": act_buf, "rewards": rewards, "terminated": terminated,
            "truncated": truncated, "logp": logp, "values": values, "final_values": final_values,
            "bootstrap_value": float(bootstrap), "episode_returns": [e[1] for e in episodes],
            "episode_lengths": [e[2] for e in episodes], "cut": cut,
        }

    def close(self) -> None:
        for env in self.envs:
            env.close()


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
