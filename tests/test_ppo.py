"""PPO loss pieces against hand-computed values, and an update that moves the policy."""

import math

import numpy as np
import pytest
import torch

from nitro.algos.ppo import PPOLearner, adapt_kl_coeff, clipped_surrogate, ppo_loss, value_loss
from nitro.config import PPOConfig, ppo_config
from nitro.errors import ConfigError
from nitro.models import ModelSpec


def t(*xs):
    return torch.tensor(xs, dtype=torch.float32)


def test_clipped_surrogate_by_hand():
    # ratio 1.5 with A=2 is clipped to 1.2 -> 2.4; ratio 0.5 with A=-1 -> min(-0.5, -0.8) = -0.8
    loss, frac = clipped_surrogate(t(math.log(1.5), math.log(0.5)), t(0.0, 0.0), t(2.0, -1.0), clip=0.2)
    assert float(loss) == pytest.approx(-(2.4 - 0.8) / 2, rel=1e-6)
    assert float(frac) == 1.0
    loss, frac = clipped_surrogate(t(math.log(1.1)), t(0.0), t(3.0), clip=0.2)
    assert float(loss) == pytest.approx(-3.3, rel=1e-6)
    assert float(frac) == 0.0


def test_value_loss_by_hand():
    assert float(value_loss(t(1.0, 3.0), t(0.0, 0.0), t(2.0, 2.0), clip=0.0)) == pytest.approx(0.5)
    # clipped prediction 2.95 is further from 3.5 than 3.0, so the pessimistic term wins
    assert float(value_loss(t(3.0), t(2.9), t(3.5), clip=0.05)) == pytest.approx(0.5 * 0.55 ** 2, rel=1e-5)


def test_total_loss_combines_terms():
    total, parts = ppo_loss(t(0.0), t(0.0), t(1.0), t(1.0), t(1.0), t(3.0), t(0.5), t(0.04),
                            clip=0.2, kl_coeff=0.5, value_coeff=2.0, entropy_coeff=0.1)
    # pg = -1, kl term 0.5*0.04, value 2 * 0.5*(2^2), entropy -0.1*0.5
    assert float(total) == pytest.approx(-1.0 + 0.02 + 4.0 - 0.05, rel=1e-6)
    assert float(parts["kl"]) == pytest.approx(0.04)


@pytest.mark.parametrize("kl,expected", [(0.05, 0.3), (0.001, 0.1), (0.01, 0.2), (0.02, 0.2)])
def test_adaptive_kl_coefficient(kl, expected):
    assert adapt_kl_coeff(0.2, kl, 0.01) == pytest.approx(expected)


def test_paper_preset_matches_table_1():
    p = ppo_config("paper")
    assert (p.lr, p.gamma, p.clip, p.kl_coeff, p.kl_target, p.entropy_coeff, p.value_coeff, p.batch_size) == \
        (5e-5, 0.99, 0.3, 0.2, 0.01, 0.0, 1.0, 4096)
    assert ppo_config("paper-atari").batch_size == 256
    assert (ppo_config("paper").reward_clip, ppo_config("paper-atari").reward_clip) == (0.0, 1.0)


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="clip"):
        PPOConfig(clip=1.5)
    with pytest.raises(ConfigError, match="unknown hyperparameter"):
        ppo_config("fast", learning_rate=1.0)
    with pytest.raises(ConfigError, match="unknown PPO preset 'nope'"):
        ppo_config("nope")


def _batch(spec, n, rng):
    obs = rng.normal(size=(n, *spec.obs_shape)).astype(np.float32)
    return {"obs": obs, "actions": rng.normal(size=(n, spec.action_dim)).astype(np.float32),
            "rewards": rng.normal(size=n).astype(np.float32), "terminated": np.zeros(n, bool),
            "truncated": np.zeros(n, bool), "logp": np.full(n, -3.0, np.float32),
            "values": np.zeros(n, np.float32), "final_values": np.zeros(n, np.float32), "bootstrap_value": 0.0}


def test_update_changes_weights_and_adapts_kl():
    spec = ModelSpec((4,), "box", 2, (-1.0, -1.0), (1.0, 1.0), hidden_sizes=(16,))
    cfg = ppo_config("paper", epochs=2, minibatch_size=32)
    learner = PPOLearner(spec, cfg, seed=0)
    before = [p.detach().clone() for p in learner.policy.parameters()]
    rng = np.random.default_rng(0)
    batch = _batch(spec, 64, rng)
    # behaviour log-probs from the current policy so ratios start at 1
    with torch.no_grad():
        d = learner.policy.distribution(torch.as_tensor(batch["obs"]))
        batch["logp"] = learner.policy.log_prob(d, torch.as_tensor(batch["actions"])).numpy()
    stats = learner.update([batch])
    assert stats.samples == 64
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.policy.parameters()))
    assert stats.kl >= 0 and stats.kl_coeff in (0.1, 0.2, 0.3)


def test_same_seed_is_deterministic():
    spec = ModelSpec((4,), "discrete", 3, hidden_sizes=(8,))
    outs = []
    for _ in range(2):
        learner = PPOLearner(spec, ppo_config("fast", epochs=2, minibatch_size=16), seed=7)
        rng = np.random.default_rng(1)
        b = _batch(spec, 32, rng)
        b["actions"] = rng.integers(0, 3, size=32)
        b["logp"] = np.full(32, math.log(1 / 3), np.float32)
        learner.update([b])
        outs.append(torch.cat([p.detach().flatten() for p in learner.policy.parameters()]))
    assert torch.equal(outs[0], outs[1])
