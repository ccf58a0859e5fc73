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
  values         float32 behaviour value estimate V(obs_t); absent when the runner's `behaviour_values` is off
                 (the job's learner does not read them: IMPACT, nitro.spec.BEHAVIOUR_VALUE_ALGOS)
  final_values   float32 V(final observation) at truncated steps, else 0
  bootstrap_value  float: V(observation after the last step), 0 if the last step ended an episode
  episode_returns, episode_lengths   lists for episodes that finished inside this batch
Without `values` (the job's learner values observations with its own critic: IMPACT's V-trace, whose
`vtrace_critic` "online" also values the bootstrap observations) the batch carries those observations too:
  final_obs      (K, *obs_shape) the final observation of each truncated step, in row order (K = truncated.sum())
  bootstrap_obs  (*obs_shape) the observation after the last step (the next episode's first after an episode end)

Several environments per actor (VecSampler, envs_per_actor N > 1): the N envs step
in lockstep with one batched inference per step, and the batch is laid out env-major:
env i's steps form one contiguous segment, in time order, so the learner sees N
ordinary trajectories back to back and its GAE/V-trace run unchanged. A segment that
ends mid-episode (all but the last) is cut exactly like a time limit: `truncated` is
set and `final_values` holds V(the env's next observation), which is the
`bootstrap_value` that env would have had alone. Such steps are also marked in
  cut            bool (T,): a segment cut, not an episode end (only in batches of N > 1 envs)
so nitro.data.batching can tell cuts from finished episodes. Episode lists are ordered by
the position in the batch of the step that ended them. A batch that also lists episodes
ended by a step left out of it (nitro.policy.ale_vector: an uneven last lockstep step) carries
  episode_rows   list[int]: the row each listed episode ended at, for those the env's last row
so that splitting the batch hands every episode to the right part. `num_steps` is the total over
the N envs (env i gets num_steps // N steps, one more for the first num_steps % N).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nitro.contracts import MAX_ENVS_PER_ACTOR
from nitro.policy.envs import make_env
from nitro.policy.inference import PolicyRunner


def env_seed(seed: int | None, index: int) -> int | None:
    """Seed of an actor's env `index` from the actor's seed: env 0 keeps the seed itself (so one env per
    actor is exactly the single-env sampler), env i > 0 a deterministic SeedSequence draw of (seed, i)."""
    if seed is None or index == 0:
        return seed
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1, dtype=np.uint64)[0] % (2**62))


def make_sampler(env_id: str, seed: int | None = None, env_kwargs: dict | None = None, envs_per_actor: int = 1):
    """The sampler an actor uses: the single-env Sampler for 1 env; for N > 1 envs of an Atari id, ALE's C++
    vector env where it reproduces the job's env (nitro.policy.ale_vector), else a VecSampler of N envs."""
    if envs_per_actor == 1:
        return Sampler(env_id, seed=seed, env_kwargs=env_kwargs)
    from nitro.policy.ale_vector import ALEVecSampler, vector_kwargs_for

    vector_kwargs = vector_kwargs_for(env_id, env_kwargs)
    if vector_kwargs is not None:
        return ALEVecSampler(env_id, envs_per_actor, seed=seed, vector_kwargs=vector_kwargs)
    return VecSampler(env_id, envs_per_actor, seed=seed, env_kwargs=env_kwargs)


def check_num_envs(num_envs: int) -> None:
    if not 1 <= num_envs <= MAX_ENVS_PER_ACTOR:
        raise ValueError(f"envs_per_actor must be in [1, {MAX_ENVS_PER_ACTOR}], got {num_envs}")


def lockstep_layout(num_steps: int, n_envs: int) -> tuple[list[int], np.ndarray]:
    """Each env's step count (num_steps // n_envs, one more for the first num_steps % n_envs: longest first) and
    the row where its segment starts in the env-major batch."""
    if not 1 <= n_envs <= max(num_steps, 1):
        raise ValueError(f"cannot spread {num_steps} steps over {n_envs} environments (at least one each)")
    lengths = [num_steps // n_envs + (i < num_steps % n_envs) for i in range(n_envs)]
    return lengths, np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)


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
        final_obs: list[np.ndarray] = []

        env, obs = self.env, self.obs
        ep_ret, ep_len = self.episode_return, self.episode_length
        # The critic costs less batched after the rollout than once per step; actions never need it.
        record = runner.behaviour_values
        defer = runner.deferred_values or not record
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
                    if not record:
                        final_obs.append(np.array(obs, dtype=obs_space.dtype))
                else:
                    terminated[t] = True
                ep_returns.append(ep_ret)
                ep_lengths.append(ep_len)
                ep_ret, ep_len = 0.0, 0
                obs, _ = env.reset()
        if defer and record:
            values[:] = runner.value_batch(obs_buf)
        last_done = bool(terminated[-1] or truncated[-1]) if num_steps else True
        bootstrap = 0.0 if last_done else runner.value(obs)
        self.obs, self.episode_return, self.episode_length = obs, ep_ret, ep_len
        return {
            "obs": obs_buf, "actions": act_buf, "rewards": rewards, "terminated": terminated,
            "truncated": truncated, "logp": logp, **({"values": values} if record else {}),
            "final_values": final_values, "bootstrap_value": float(bootstrap), "episode_returns": ep_returns,
            "episode_lengths": ep_lengths,
            **({} if record else bootstrap_observations(final_obs, np.array(obs, dtype=obs_space.dtype), obs_buf)),
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
        check_num_envs(num_envs)
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
        space = self.env.observation_space  # the batch's obs shape and dtype, as the single-env Sampler's
        self.obs = np.empty((len(self.envs), *space.shape), dtype=space.dtype)
        self.obs[0], _ = self.envs[0].reset(seed=seed)
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
        n_envs, envs = len(self.envs), self.envs
        lengths, starts = lockstep_layout(num_steps, n_envs)
        horizon = lengths[0]
        # Observations go straight to their env-major rows of the batch (an Atari step's 16 rows are 340 KB:
        # a time-major copy and the gather after it cost ~1% of the sampling); the small per-step fields are
        # time-major (one contiguous write per step) and gathered at the end.
        obs_buf = np.empty((num_steps, *self.obs.shape[1:]), dtype=self.obs.dtype)
        act_tm = None
        logp_tm = np.empty((horizon, n_envs), dtype=np.float32)
        # From ~8 envs the fused CNN pass gives values with the actions at little extra cost; the MLPs'
        # critic (and a CNN's at fewer envs) is cheaper as one batched pass over the whole rollout afterwards.
        record = runner.behaviour_values
        step_values = record and runner.step_values(n_envs)
        val_tm = np.empty((horizon, n_envs), dtype=np.float32) if step_values else None
        rew_tm = np.empty((horizon, n_envs), dtype=np.float32)
        ends: list[tuple[int, int, bool, float, int]] = []  # (t, env, truncated, return, length)
        trunc_obs: list[np.ndarray] = []

        obs = self.obs
        ep_ret, ep_len = list(self.episode_returns), list(self.episode_lengths)
        act_batch, env_action = runner.act_batch, runner.env_action
        longest = sum(1 for n in lengths if n == horizon)  # envs that step in the last lockstep step
        for t in range(horizon):
            k = n_envs if t < horizon - 1 else longest
            o = obs if k == n_envs else obs[:k]
            obs_buf[starts[:k] + t] = o
            actions, lp, v = act_batch(o, rng, with_value=step_values)
            if act_tm is None:
                act_tm = np.empty((horizon, n_envs, *actions.shape[1:]), dtype=actions.dtype)
            act_tm[t, :k] = actions
            logp_tm[t, :k] = lp
            if step_values:
                val_tm[t, :k] = v
            rews = []
            for i, a in enumerate(env_action(actions)):
                ob, r, term, trunc, _ = envs[i].step(a)
                rews.append(r)
                ep_ret[i] += float(r)
                ep_len[i] += 1
                if term or trunc:
                    cut_by_limit = bool(trunc and not term)
                    if cut_by_limit:
                        trunc_obs.append(np.array(ob))
                    ends.append((t, i, cut_by_limit, ep_ret[i], ep_len[i]))
                    ep_ret[i], ep_len[i] = 0.0, 0
                    ob, _ = envs[i].reset()
                obs[i] = ob
            rew_tm[t, :k] = rews

        self.obs, self.episode_returns, self.episode_lengths = obs, ep_ret, ep_len
        return lockstep_batch(runner, starts, lengths, obs_buf, act_tm, logp_tm, val_tm, rew_tm, ends, trunc_obs,
                              obs)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def bootstrap_observations(final_obs: list[np.ndarray], next_obs: np.ndarray, obs_buf: np.ndarray) -> dict:
    """A batch's `final_obs` (stacked in row order; (0, *obs_shape) when none) and `bootstrap_obs`."""
    stacked = np.stack(final_obs) if final_obs else np.empty((0, *obs_buf.shape[1:]), dtype=obs_buf.dtype)
    return {"final_obs": stacked.astype(obs_buf.dtype, copy=False), "bootstrap_obs": next_obs}


def lockstep_batch(runner: PolicyRunner, starts: np.ndarray, lengths: list[int], obs_buf: np.ndarray,
                   act_tm: np.ndarray, logp_tm: np.ndarray, val_tm: np.ndarray | None, rew_tm: np.ndarray,
                   ends: list[tuple[int, int, bool, float, int]], trunc_obs: list[np.ndarray],
                   next_obs: np.ndarray, unrecorded_ends: list[tuple[int, float, int]] = ()) -> dict:
    """The env-major batch (module docstring) of a lockstep rollout of len(lengths) envs.

    obs_buf already env-major; act_tm, logp_tm, rew_tm (and val_tm when the runner valued each step) time-major
    (horizon, n_envs); `ends` (t, env, truncated by a limit, return, length) for the episodes that ended at a
    recorded step, `trunc_obs` the truncations' final observations in the order of their `ends`; `next_obs`
    (n_envs, ...) the observation that follows each env's last recorded step. `unrecorded_ends` (env, return,
    length): episodes that ended at a step an env took after its last recorded one (a backend whose envs
    cannot sit out the last lockstep step); they are listed after that env's segment and change no row.
    """
    num_steps, n_envs = len(obs_buf), len(lengths)
    record, step_values = runner.behaviour_values, val_tm is not None
    act_buf = np.empty((num_steps, *act_tm.shape[2:]), dtype=act_tm.dtype)
    rewards, logp = np.empty(num_steps, dtype=np.float32), np.empty(num_steps, dtype=np.float32)
    values = np.empty(num_steps, dtype=np.float32)
    for i, (a, n) in enumerate(zip(starts, lengths)):
        act_buf[a:a + n] = act_tm[:n, i]
        rewards[a:a + n], logp[a:a + n] = rew_tm[:n, i], logp_tm[:n, i]
        if step_values:
            values[a:a + n] = val_tm[:n, i]
    terminated = np.zeros(num_steps, dtype=bool)
    truncated = np.zeros(num_steps, dtype=bool)
    cut = np.zeros(num_steps, dtype=bool)
    final_values = np.zeros(num_steps, dtype=np.float32)
    rows = [int(starts[i]) + t for t, i, *_ in ends]
    trunc_rows = [row for row, e in zip(rows, ends) if e[2]]
    truncated[trunc_rows] = True
    terminated[[row for row, e in zip(rows, ends) if not e[2]]] = True
    # One batched critic pass: the rollout (when recorded and not valued per step), the truncations' final
    # observations, the envs' next observations.
    extra = [np.stack(trunc_obs)] if trunc_obs else []
    rollout = record and not step_values
    all_values = runner.value_batch(np.concatenate([*([obs_buf] if rollout else []), *extra, next_obs]))
    if rollout:
        values[:], all_values = all_values[:num_steps], all_values[num_steps:]
    final_values[trunc_rows] = all_values[:len(trunc_rows)]
    next_v = all_values[len(trunc_rows):]
    bootstrap = 0.0
    final_of = dict(zip(trunc_rows, trunc_obs))  # row -> its final observation (for batches without values)
    for i in range(n_envs):  # every env has at least one step
        last = int(starts[i]) + lengths[i] - 1
        if terminated[last] or truncated[last]:
            continue
        if i == n_envs - 1:  # the batch's last step: the usual bootstrap
            bootstrap = float(next_v[i])
        else:  # cut mid-episode: bootstrap from V(next observation) as at a time limit
            truncated[last] = cut[last] = True
            final_values[last] = next_v[i]
            final_of[last] = next_obs[i]
    lean = {} if record else bootstrap_observations([final_of[r] for r in np.flatnonzero(truncated)],
                                                    np.array(next_obs[n_envs - 1]), obs_buf)
    listed = [((row, 0), ret, length) for row, (_, _, _, ret, length) in zip(rows, ends)]
    listed += [((int(starts[i]) + lengths[i] - 1, 1), ret, length) for i, ret, length in unrecorded_ends]
    listed.sort(key=lambda e: e[0])
    return {
        "obs": obs_buf, "actions": act_buf, "rewards": rewards, "terminated": terminated,
        "truncated": truncated, "logp": logp, **({"values": values} if record else {}),
        "final_values": final_values, "bootstrap_value": float(bootstrap),
        "episode_returns": [e[1] for e in listed], "episode_lengths": [e[2] for e in listed], "cut": cut,
        **({"episode_rows": [e[0][0] for e in listed]} if unrecorded_ends else {}), **lean,
    }


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
