"""Learning regression: IMPACT ("fast" preset) with lagging actors and replay solves CartPole-v1 within 100k steps."""

import pytest

from nitro.config import impact_config
from tests.inprocess import train_impact


@pytest.mark.slow
def test_impact_fast_preset_reaches_150_on_cartpole_within_100k_steps():
    # Actors run the policy one update behind the learner (the asynchronous loop's lag) and every
    # update also replays one stored batch, so V-trace and the truncated weights are exercised.
    # The signal is the mean of the last 20 finished training episodes (stochastic policy).
    result = train_impact("CartPole-v1", impact_config("fast"), actors=4, steps_per_actor=512,
                          max_env_steps=100_000, seed=0, eval_episodes=0, policy_lag=1, replay_batches=1,
                          stop=lambda rec: rec.train_return >= 150)
    best = max(r.train_return for r in result.rounds)
    assert best >= 150, [(r.env_steps, round(r.train_return, 1)) for r in result.rounds]
    assert result.env_steps <= 100_000
    assert any(r.stats.is_weight_mean != 1.0 for r in result.rounds)  # the data really was off-policy
