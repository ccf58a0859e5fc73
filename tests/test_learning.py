"""Learning regression: PPO with the "fast" preset solves CartPole-v1 within 100k env steps."""

import pytest

from nitro.config import ppo_config
from tests.inprocess import train_ppo


@pytest.mark.slow
def test_ppo_fast_preset_reaches_195_on_cartpole_within_100k_steps():
    # Mean over the last 20 finished *training* episodes (stochastic policy): a stricter
    # signal than deterministic evaluation, which CartPole flatters early.
    result = train_ppo("CartPole-v1", ppo_config("fast"), actors=4, steps_per_actor=512,
                       max_env_steps=100_000, seed=0, eval_episodes=2,
                       stop=lambda rec: rec.train_return >= 195)
    best = max(r.train_return for r in result.rounds)
    assert best >= 195, [(r.env_steps, round(r.train_return, 1)) for r in result.rounds]
    assert result.env_steps <= 100_000
