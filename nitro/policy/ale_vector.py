"""Atari actors with several envs on ALE's own C++ vector env (`ale_py.vector_env.AtariVectorEnv`).

The N emulators, their frame skipping, max-pooling, resizing and frame stacking run in C++ on one worker
thread (the calling thread waits, so the process's CPU time is one core's, as an actor's): an actor at 16
Qbert envs samples 14-17% more steps a CPU second than on 16 of make_env's Python-wrapped envs
(docs/algorithms.md, "Atari on ALE's C++ vector env"). Each sub-environment
shows the policy what `make_env` would: `nitro.policy.envs.ale_vector_kwargs` maps the job's env_kwargs and
refuses what the vector env cannot reproduce, and then the Python VecSampler serves. The batch is the
VecSampler's (nitro.policy.rollout, same layout and bootstrapping, built by `lockstep_batch`).

One difference: the vector env steps all its envs or none, so when `num_steps` is not a multiple of N the
envs with one step fewer (the last N - num_steps % N) still take the last lockstep step. That step is not in
the batch: the env's segment ends before it and is cut there like any segment (bootstrapped from the
observation the step started from), its reward counts towards the episode's return, and an episode it ends
is listed after the segment, the batch then carrying `episode_rows` (nitro.policy.rollout) for splitting.
At most N - 1 such steps an invocation, none when N divides num_steps (512 steps with 2, 4, 8 or 16 envs);
they are emulated (and take CPU time) but are not counted as the invocation's env steps.
The same step also draws its action noise for all N envs, where the Python VecSampler draws it for the envs
that step, so the two backends' generators part there.

NITRO_ALE_VECTOR=0 in an actor's environment keeps the Python envs (for comparisons and as a way out).
"""

from __future__ import annotations

import os

import numpy as np

from nitro.policy.envs import ale_vector_kwargs
from nitro.policy.inference import PolicyRunner
from nitro.policy.rollout import check_num_envs, env_seed, lockstep_batch, lockstep_layout

ENABLE_VAR = "NITRO_ALE_VECTOR"


def vector_kwargs_for(env_id: str, env_kwargs: dict | None) -> dict | None:
    """The vector env's arguments for this job, or None where the Python envs serve (switched off, or
    settings the vector env cannot reproduce)."""
    if os.environ.get(ENABLE_VAR, "1") == "0":
        return None
    return ale_vector_kwargs(env_id, env_kwargs)


class ALEVecSampler:
    """N Atari envs in one AtariVectorEnv, stepped in lockstep with one batched inference per step."""

    def __init__(self, env_id: str, num_envs: int, seed: int | None = None, env_kwargs: dict | None = None,
                 vector_kwargs: dict | None = None):
        from ale_py.vector_env import AtariVectorEnv

        check_num_envs(num_envs)
        kwargs = dict(vector_kwargs or ale_vector_kwargs(env_id, env_kwargs) or {})
        if not kwargs:
            raise ValueError(f"{env_id} with env_kwargs {env_kwargs} cannot run on ALE's vector env")
        self.env_id = env_id
        # Same-step autoreset: an episode's end returns the next episode's first observation at once (the
        # ended one in info["final_obs"]), so no env spends a lockstep step resetting.
        self.vec = AtariVectorEnv(kwargs.pop("game"), num_envs, num_threads=1, autoreset_mode="SameStep", **kwargs)
        self.observation_space = self.vec.single_observation_space
        self.action_space = self.vec.single_action_space
        self._reset_all(seed)

    @property
    def num_envs(self) -> int:
        return self.vec.num_envs

    def _reset_all(self, seed: int | None) -> None:
        # The vector env takes 31-bit seeds (a negative one means unseeded).
        seeds = None if seed is None else \
            np.array([env_seed(seed, i) % 2**31 for i in range(self.num_envs)], np.int64)
        self.obs, _ = self.vec.reset(seed=seeds)
        self.episode_returns = np.zeros(self.num_envs)
        self.episode_lengths = np.zeros(self.num_envs, dtype=np.int64)

    def reseed(self, seed: int) -> None:
        """Fresh episodes in every env, env i from env_seed(seed, i) (reproducible runs)."""
        self._reset_all(seed)

    def sample(self, runner: PolicyRunner, num_steps: int, rng: np.random.Generator) -> dict:
        if runner.spec.action_kind != "discrete":
            raise ValueError(f"ALE's vector env takes discrete actions; the policy's are {runner.spec.action_kind}")
        n_envs, vec = self.num_envs, self.vec
        lengths, starts = lockstep_layout(num_steps, n_envs)
        horizon = lengths[0]
        longest = sum(1 for n in lengths if n == horizon)  # envs whose step in the last lockstep step is recorded
        obs = self.obs
        obs_buf = np.empty((num_steps, *obs.shape[1:]), dtype=obs.dtype)
        act_tm = np.empty((horizon, n_envs), dtype=np.int64)
        logp_tm = np.empty((horizon, n_envs), dtype=np.float32)
        step_values = runner.behaviour_values and runner.step_values(n_envs)
        val_tm = np.empty((horizon, n_envs), dtype=np.float32) if step_values else None
        rew_tm = np.empty((horizon, n_envs), dtype=np.float32)
        ends: list[tuple[int, int, bool, float, int]] = []  # (t, env, truncated, return, length)
        unrecorded: list[tuple[int, float, int]] = []
        trunc_obs: list[np.ndarray] = []
        ep_ret, ep_len = self.episode_returns, self.episode_lengths
        next_obs = None
        act_batch = runner.act_batch
        for t in range(horizon):
            k = n_envs if t < horizon - 1 else longest
            obs_buf[starts[:k] + t] = obs[:k]
            actions, lp, v = act_batch(obs, rng, with_value=step_values)
            act_tm[t], logp_tm[t] = actions, lp
            if step_values:
                val_tm[t] = v
            if k < n_envs:  # the unrecorded envs' segments end at the observation this step starts from
                next_obs = obs.copy()
            obs, rewards, terminated, truncated, info = vec.step(act_tm[t])
            rew_tm[t] = rewards
            ep_ret += rewards
            ep_len += 1
            done = terminated | truncated
            if done.any():
                for i in np.flatnonzero(done):
                    limit = bool(truncated[i] and not terminated[i])
                    if i < k:
                        if limit:
                            trunc_obs.append(info["final_obs"][i].copy())
                        ends.append((t, int(i), limit, float(ep_ret[i]), int(ep_len[i])))
                    else:
                        unrecorded.append((int(i), float(ep_ret[i]), int(ep_len[i])))
                    ep_ret[i], ep_len[i] = 0.0, 0
        if next_obs is None:
            next_obs = obs
        else:
            next_obs[:longest] = obs[:longest]
        self.obs = obs
        return lockstep_batch(runner, starts, lengths, obs_buf, act_tm, logp_tm, val_tm, rew_tm, ends, trunc_obs,
                              next_obs, unrecorded)

    def close(self) -> None:
        self.vec.close()
