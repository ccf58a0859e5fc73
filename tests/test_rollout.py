"""Sampler: batch layout, termination vs truncation, episodes continuing across calls."""

import gymnasium as gym
import numpy as np

from nitro.policy.inference import MLP_VALUE_CHUNK, PolicyRunner
from nitro.policy.models import Policy, spec_for_spaces
from nitro.policy.rollout import Sampler, evaluate


class _Countdown(gym.Env):
    """Terminates after 3 steps when started at an even reset, else runs until the TimeLimit (5)."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.resets = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.resets += 1
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        term = self.resets % 2 == 1 and self.t == 3
        return np.array([float(self.t)], np.float32), 1.0, term, False, {}


def _runner(sampler):
    spec = spec_for_spaces(sampler.env.observation_space, sampler.env.action_space, hidden_sizes=(8,))
    return PolicyRunner(spec, Policy(spec).numpy_state(), 0)


def test_termination_and_truncation_are_kept_apart_and_episodes_continue():
    gym.register("NitroCountdown-v0", entry_point=_Countdown, max_episode_steps=5)
    try:
        sampler = Sampler("NitroCountdown-v0", seed=0)
        runner = _runner(sampler)
        rng = np.random.default_rng(0)
        a = sampler.sample(runner, 4, rng)  # 3 steps terminate, 1 step into episode 2
        b = sampler.sample(runner, 6, rng)  # 4 more steps -> truncated at 5, then 2 steps of episode 3
        assert a["terminated"].tolist() == [False, False, True, False]
        assert not a["truncated"].any()
        assert a["episode_returns"] == [3.0] and a["bootstrap_value"] != 0.0
        assert b["truncated"].tolist() == [False, False, False, True, False, False]
        assert not b["terminated"].any()
        assert b["episode_returns"] == [5.0], "episode 2 spans both invocations"
        # the truncated step bootstraps from the real final observation (t=5), not the reset one
        assert b["final_values"][3] == np.float32(runner.value(np.array([5.0], np.float32)))
        assert b["final_values"][[0, 1, 2, 4, 5]].tolist() == [0.0] * 5
        assert b["obs"].shape == (6, 1) and b["actions"].dtype == np.int64
    finally:
        gym.registry.pop("NitroCountdown-v0")


def test_deterministic_evaluation_is_repeatable():
    sampler = Sampler("CartPole-v1", seed=0)
    runner = _runner(sampler)
    assert evaluate(runner, "CartPole-v1", 2, seed=3) == evaluate(runner, "CartPole-v1", 2, seed=3)


def test_actors_sample_mlp_policies_without_importing_torch(tmp_path):
    """Cold starts: importing torch costs an actor ~1 s of CPU, more than a short invocation's sampling."""
    import pickle
    import subprocess
    import sys

    from nitro.policy.envs import env_spaces
    from nitro.policy.models import Policy, spec_for_spaces

    spec = spec_for_spaces(*env_spaces("Hopper-v5"), obs_norm=True)
    (tmp_path / "policy.pkl").write_bytes(pickle.dumps((spec.to_dict(), Policy(spec).numpy_state())))
    code = f"""
import pickle, sys
import numpy as np
import actor_fn.handler  # everything the actor function imports at cold start
from nitro.policy.inference import MLP_VALUE_CHUNK, PolicyRunner
from nitro.policy.model_spec import ModelSpec
from nitro.policy.rollout import Sampler
spec, state = pickle.loads(open({str(tmp_path / "policy.pkl")!r}, "rb").read())
runner = PolicyRunner(ModelSpec.from_dict(spec), state, 0)
batch = Sampler("Hopper-v5", seed=0).sample(runner, 64, np.random.default_rng(0))
assert len(batch["rewards"]) == 64 and np.isfinite(batch["values"]).all()
print("torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False", "an MLP actor imported torch"


def test_an_mlp_rollout_values_its_steps_in_one_batched_critic_pass():
    """The single-env sampler leaves the MLP critic out of the per-step call and values the rollout with
    one batched pass afterwards: the values V(obs_t) all the same."""
    gym.register("NitroCountdown-v0", entry_point=_Countdown, max_episode_steps=5)
    try:
        sampler = Sampler("NitroCountdown-v0", seed=0)
        runner = _runner(sampler)
        critic, calls = runner.critic, []

        def counted(x):
            calls.append(np.asarray(x).shape)
            return critic(x)

        runner.critic = counted
        b = sampler.sample(runner, 12, np.random.default_rng(0))
        assert len(calls) <= 1 + int(b["truncated"].sum()) + 1  # the batch, each truncation, the bootstrap
        assert (12, 1) in calls, calls
        per_step = np.array([critic(runner._normalize(o).reshape(-1))[0] for o in b["obs"]], np.float32)
        np.testing.assert_allclose(b["values"], per_step, rtol=1e-6, atol=1e-6)
    finally:
        gym.registry.pop("NitroCountdown-v0")


def test_batched_values_come_in_bounded_chunks():
    """value_batch over more rows than one chunk equals the values row by row (memory stays bounded)."""
    env = gym.make("CartPole-v1")
    spec = spec_for_spaces(env.observation_space, env.action_space, hidden_sizes=(8,))
    runner = PolicyRunner(spec, Policy(spec).numpy_state(), 0)
    obs = np.random.default_rng(0).normal(size=(MLP_VALUE_CHUNK * 2 + 5, 4)).astype(np.float32)
    shapes, critic = [], runner.critic

    def counted(x):
        shapes.append(x.shape[0])
        return critic(x)

    runner.critic = counted
    values = runner.value_batch(obs)
    assert shapes == [MLP_VALUE_CHUNK, MLP_VALUE_CHUNK, 5]
    per_row = np.array([critic(runner._normalize(o).reshape(-1))[0] for o in obs[::997]], np.float32)
    np.testing.assert_allclose(values[::997], per_row, rtol=1e-6, atol=1e-6)
