"""PPO loss pieces against hand-computed values, and an update that moves the policy."""

import copy
import math
import threading

import numpy as np
import pytest
import torch

import nitro.algos.ppo as ppo_module
from nitro.algos.ppo import PPOLearner, adapt_kl_coeff, clipped_surrogate, ppo_loss, value_loss
from nitro.config import PPOConfig, ppo_config
from nitro.errors import ConfigError
from nitro.policy.models import ModelSpec


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


def test_rllib_value_loss_caps_the_squared_error_by_hand():
    # errors (1 - 2)^2 = 1 and (10 - 2)^2 = 64, capped at 10: mean(1, 10) = 5.5, no 0.5 factor
    v = t(1.0, 10.0).requires_grad_()
    loss = value_loss(v, t(0.0, 0.0), t(2.0, 2.0), clip=10.0, mode="rllib")
    assert float(loss.detach()) == pytest.approx(5.5)
    loss.backward()
    assert v.grad.tolist() == pytest.approx([-1.0, 0.0])  # the capped sample gets no value gradient
    assert float(value_loss(t(1.0, 10.0), t(0.0, 0.0), t(2.0, 2.0), clip=0.0, mode="rllib")) == pytest.approx(32.5)
    # PPO2's form on the same numbers: V_old = 0 and clip 10 leave 10 unclipped, so 0.5 * mean(1, 64)
    assert float(value_loss(t(1.0, 10.0), t(0.0, 0.0), t(2.0, 2.0), clip=10.0)) == pytest.approx(16.25)
    with pytest.raises(ValueError, match="value clip mode"):
        value_loss(t(1.0), t(0.0), t(2.0), clip=1.0, mode="nope")


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
    for name in ("paper", "paper-atari"):  # RLlib's semantics: batch-standardised advantages, capped value error
        q = ppo_config(name)
        assert (q.normalize_batch_advantages, q.normalize_advantages, q.value_clip, q.value_clip_mode) == \
            (True, False, 10.0, "rllib")
    for name in ("tuned", "fast"):  # unchanged: per-minibatch standardisation, no value clipping
        q = ppo_config(name)
        assert (q.normalize_batch_advantages, q.normalize_advantages, q.value_clip, q.value_clip_mode) == \
            (False, True, 0.0, "ppo2")


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="clip"):
        PPOConfig(clip=1.5)
    with pytest.raises(ConfigError, match="unknown hyperparameter"):
        ppo_config("fast", learning_rate=1.0)
    with pytest.raises(ConfigError, match="unknown PPO preset 'nope'"):
        ppo_config("nope")
    with pytest.raises(ConfigError, match="value_clip_mode"):
        ppo_config("paper", value_clip_mode="clamp")


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


BOX = ModelSpec((4,), "box", 2, (-1.0, -1.0), (1.0, 1.0), hidden_sizes=(16,))


@pytest.mark.parametrize("preset", ["tuned", "paper"])
def test_the_critic_thread_changes_nothing_but_where_the_critic_runs(preset, monkeypatch, request):
    """The critic's forward and backward on a second thread give the weights, Adam state and statistics of
    the update on one (the two nets share no parameter), and the critic really ran elsewhere. 256 wide, so the
    hidden products of a 64-sample minibatch take oneDNN (nitro.policy.cpu_ops) on both threads."""
    spec = ModelSpec((11,), "box", 3, (-1.0,) * 3, (1.0,) * 3, hidden_sizes=(256, 256))
    critic_threads = set()
    forward = torch.nn.Module.__call__

    def where(module, *args, **kwargs):
        if module is critic_net:
            critic_threads.add(threading.current_thread().name)
        return forward(module, *args, **kwargs)

    results = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the services' setting: the critic thread is only used with one torch thread
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    for split in (True, False):
        learner = PPOLearner(spec, ppo_config(preset, epochs=3, minibatch_size=64), seed=3, critic_thread=split)
        critic_net = learner.policy.critic
        rng = np.random.default_rng(5)
        b = _batch(spec, 256, rng)
        with torch.no_grad():
            d = learner.policy.distribution(torch.as_tensor(b["obs"]))
            b["logp"] = learner.policy.log_prob(d, torch.as_tensor(b["actions"])).numpy()
        monkeypatch.setattr(torch.nn.Module, "__call__", where)
        stats = learner.update([b])
        monkeypatch.setattr(torch.nn.Module, "__call__", forward)
        state = learner.optimizer.state_dict()["state"]
        results.append((torch.cat([p.detach().flatten() for p in learner.policy.parameters()]),
                        torch.cat([torch.cat([s["exp_avg"].flatten(), s["exp_avg_sq"].flatten()])
                                   for s in state.values()]), stats))
    (split_w, split_adam, split_stats), (one_w, one_adam, one_stats) = results
    assert torch.equal(split_w, one_w) and torch.equal(split_adam, one_adam)
    for key in ("policy_loss", "value_loss", "entropy", "kl", "clip_frac", "grad_norm"):
        assert getattr(split_stats, key) == getattr(one_stats, key), key
    assert split_stats.loss == pytest.approx(one_stats.loss, rel=1e-6)
    assert any(name.startswith("ppo-critic") for name in critic_threads), critic_threads
    assert threading.current_thread().name in critic_threads  # the run without the thread


def test_a_learner_with_a_critic_thread_copies_and_the_copy_learns_alike(request):
    """copy.deepcopy (experiments/signal.py forks learners) makes the copy its own critic thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    spec = ModelSpec((4,), "box", 2, (-1.0, -1.0), (1.0, 1.0), hidden_sizes=(16,))
    learner = PPOLearner(spec, ppo_config("tuned", epochs=2, minibatch_size=32), seed=1)
    b = _batch(spec, 64, np.random.default_rng(2))
    learner.update([b])  # its thread exists now
    twin = copy.deepcopy(learner)
    assert twin._critic_pool is None and learner._critic_pool is not None
    learner.update([b])
    twin.update([b])
    assert twin._critic_pool is not None and twin._critic_pool is not learner._critic_pool
    assert torch.equal(torch.cat([p.detach().flatten() for p in learner.policy.parameters()]),
                       torch.cat([p.detach().flatten() for p in twin.policy.parameters()]))


def _terminal_batch(learner, rewards, seed=0):
    """Every step ends its episode, so GAE gives A_t = r_t - V_old_t and R_t = r_t exactly; behaviour
    log-probs from the current policy, so the first step's ratios are 1."""
    n = len(rewards)
    rng = np.random.default_rng(seed)
    b = _batch(BOX, n, rng)
    b["rewards"] = np.asarray(rewards, np.float32)
    b["terminated"] = np.ones(n, bool)
    b["values"] = rng.normal(size=n).astype(np.float32)
    with torch.no_grad():
        d = learner.policy.distribution(torch.as_tensor(b["obs"]))
        b["logp"] = learner.policy.log_prob(d, torch.as_tensor(b["actions"])).numpy()
    return b


def test_paper_preset_standardises_advantages_once_over_the_whole_batch(monkeypatch):
    cfg = ppo_config("paper", epochs=1, minibatch_size=32)
    learner = PPOLearner(BOX, cfg, seed=0)
    rewards = np.random.default_rng(3).normal(3.0, 2.0, size=128)  # advantages with a mean far from 0
    b = _terminal_batch(learner, rewards)
    raw = rewards - b["values"].astype(np.float64)
    expected = (raw - raw.mean()) / max(raw.std(), 1e-4)  # RLlib: population std, floored at 1e-4
    seen = []
    real = ppo_module.ppo_actor_loss

    def spy(*args, **kwargs):
        seen.append(args[2].detach().clone())  # the advantages the surrogate gets
        return real(*args, **kwargs)

    monkeypatch.setattr(ppo_module, "ppo_actor_loss", spy)
    monkeypatch.setattr(ppo_module, "POLICY_NOISE_MINIBATCHES", 0)  # only the SGD steps' calls: no noise probe
    learner.update([b])
    assert len(seen) == 4  # 128 samples, minibatches of 32
    np.testing.assert_allclose(np.sort(torch.cat(seen).numpy()), np.sort(expected), rtol=1e-4, atol=1e-5)
    assert max(abs(float(a.mean())) for a in seen) > 1e-2  # batch statistics, not re-standardised per minibatch
    # The detector's samples carry the advantages the surrogate used; with normalize_advantages off
    # (what the learner service passes to the detector) it does not standardise them again.
    np.testing.assert_allclose(learner.last_data["advantages"], expected, rtol=1e-4, atol=1e-5)
    assert cfg.normalize_advantages is False


def test_paper_preset_value_loss_is_rllibs_capped_squared_error():
    cfg = ppo_config("paper", epochs=1, minibatch_size=0)  # one full-batch step: the loss at the start
    learner = PPOLearner(BOX, cfg, seed=0)
    rewards = np.array([0.5, -1.0, 8.0, -12.0] * 8)
    b = _terminal_batch(learner, rewards)
    with torch.no_grad():
        v = learner.policy.value(torch.as_tensor(b["obs"])).double().numpy()
    err = (v - rewards) ** 2
    assert (err > 10.0).any() and (err < 10.0).any()
    expected = np.minimum(err, 10.0).mean()
    v_old = b["values"].astype(np.float64)
    ppo2 = 0.5 * np.maximum(err, (v_old + np.clip(v - v_old, -10.0, 10.0) - rewards) ** 2).mean()
    assert abs(ppo2 - expected) > 1.0  # the old (PPO2) form is a different loss on this batch
    stats = learner.update([b])
    assert stats.value_loss == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("size", [1, 2, 48, 128, 256, 4096, 5000])
def test_normalize_slices_is_normalize_on_each_minibatch_slice(size):
    from nitro.algos.ppo import normalize, normalize_slices

    x = torch.randn(4096, generator=torch.Generator().manual_seed(size)) * 3 + 1
    expected = torch.cat([normalize(x[i:i + size]) for i in range(0, len(x), size)])
    got = normalize_slices(x, size)
    if size == 2:  # a two-sample mean rounds differently in the row-wise reduction: 1 ulp
        torch.testing.assert_close(got, expected, rtol=0, atol=2.5e-7)
    else:  # the presets' sizes: bit for bit
        assert torch.equal(got, expected)
    with pytest.raises(ValueError, match="size"):
        normalize_slices(x, 0)
