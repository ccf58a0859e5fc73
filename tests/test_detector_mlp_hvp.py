"""The written-out Hessian-vector products of a Gaussian MLP policy (nitro.detector.mlp_hvp) against autograd's
double backward (make_hvp) of the same surrogate: every layer, both activations, both algorithms' surrogates,
clipped samples, a log std outside its clamp; and detect() giving the same spectrum either way."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from nitro.algos.impact import impact_surrogate
from nitro.detector import detect
from nitro.detector.hvp import make_hvp, ppo_surrogate, surrogate_objective
from nitro.detector.mlp_hvp import gaussian_mlp_hvp
from nitro.errors import ConfigError
from nitro.policy.model_spec import LOG_STD_MAX, LOG_STD_MIN, spec_for_spaces
from nitro.policy.models import Policy


def policy_and_samples(*, obs_shape=(11,), act_dim=3, hidden=(64, 64), activation="tanh", obs_norm=True, n=256,
                       seed=0, spread=0.3, log_std=None):
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    obs_space = gym.spaces.Box(-np.inf, np.inf, obs_shape, np.float32)
    act_space = gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32)
    pol = Policy(spec_for_spaces(obs_space, act_space, hidden_sizes=hidden, activation=activation, obs_norm=obs_norm,
                                 init_log_std=-0.4))
    flat = int(np.prod(obs_shape))
    with torch.no_grad():
        for p in pol.actor.parameters():
            p.add_(torch.randn_like(p) * 0.2)  # away from the tiny-head init: real curvature everywhere
        pol.log_std.copy_(torch.linspace(-0.9, 0.2, act_dim) if log_std is None else torch.tensor(log_std))
        pol.obs_mean.copy_(torch.as_tensor(rng.normal(0, 1, flat)))
        pol.obs_var.copy_(torch.as_tensor(rng.uniform(0.5, 2.0, flat)))
    obs = torch.as_tensor(rng.standard_normal((n, *obs_shape)).astype(np.float32))
    with torch.no_grad():  # actions as the policy samples them
        dist = pol.distribution(obs)
        actions = dist.mean + dist.stddev * torch.as_tensor(rng.standard_normal((n, act_dim)).astype(np.float32))
        logp = pol.log_prob(dist, actions)
    # ratios spread around 1 so that some samples sit clipped on either side of the PPO range
    behaviour = logp + torch.as_tensor(rng.normal(0, spread, n).astype(np.float32))
    adv = torch.as_tensor(rng.standard_normal(n).astype(np.float32))
    return pol, obs, actions, behaviour, adv


def assert_same_products(pol, obs, actions, surrogate, trials=3):
    written = gaussian_mlp_hvp(pol, obs, actions, surrogate)
    assert written is not None
    hvp, dim = written
    ref, ref_dim = make_hvp(surrogate_objective(pol, obs, actions, surrogate), pol.policy_parameters())
    assert dim == ref_dim
    g = torch.Generator().manual_seed(7)
    sizes = [p.numel() for p in pol.policy_parameters()]
    for _ in range(trials):
        v = torch.randn(dim, dtype=torch.float64, generator=g)
        a, b = ref(v).double(), hvp(v).double()
        for part_a, part_b in zip(a.split(sizes), b.split(sizes)):  # every parameter block, the log std too
            if part_a.norm() == 0:  # a log std held by the clamp
                assert part_b.norm() == 0
            else:  # float32 rounding: measured <= 2.5e-5 (and float32 autograd is itself ~1e-4 off float64)
                assert float((part_b - part_a).norm() / part_a.norm()) < 2e-4, (part_a, part_b)


@pytest.mark.parametrize("hidden, activation, act_dim, obs_norm", [
    ((64, 64), "tanh", 3, True), ((32,), "relu", 1, False), ((), "tanh", 2, True), ((16, 24, 32), "tanh", 3, True),
    ((48, 48), "relu", 3, True), ((256, 256), "tanh", 3, True)])  # the last: Hopper's, on oneDNN's products
def test_ppo_products_match_autograd_for_every_architecture(hidden, activation, act_dim, obs_norm):
    pol, obs, actions, behaviour, adv = policy_and_samples(hidden=hidden, activation=activation, act_dim=act_dim,
                                                           obs_norm=obs_norm, n=512)
    assert_same_products(pol, obs, actions, lambda logp: ppo_surrogate(logp, behaviour, adv, 0.2))


def test_products_match_with_clipped_samples_frozen_log_std_and_2d_observations():
    # two log stds held by the clamp (their std is exp(LOG_STD_MIN) and exp(LOG_STD_MAX) whatever they are)
    pol, obs, actions, behaviour, adv = policy_and_samples(
        obs_shape=(2, 3), act_dim=4, obs_norm=False, spread=1.0, log_std=[LOG_STD_MIN - 0.5, -0.3, LOG_STD_MAX + 0.1, 0.0])
    surrogate = lambda logp: ppo_surrogate(logp, behaviour, adv, 0.2)  # noqa: E731
    ratios = torch.exp(pol.log_prob(pol.distribution(obs), actions).detach() - behaviour)
    assert (ratios < 0.8).sum() > 20 and (ratios > 1.2).sum() > 20  # the clip is active on both sides
    assert_same_products(pol, obs, actions, surrogate)
    hvp, dim = gaussian_mlp_hvp(pol, obs, actions, surrogate)
    held = hvp(torch.ones(dim, dtype=torch.float64))[-4:]
    assert held[0] == 0 and held[2] == 0 and held[1] != 0  # no curvature through a clamped log std


def test_a_log_std_exactly_on_a_clamp_bound_still_has_curvature():
    # torch's clamp passes the gradient at its bounds (inclusive): so must the written products
    pol, obs, actions, behaviour, adv = policy_and_samples(act_dim=3, log_std=[LOG_STD_MIN, -0.5, LOG_STD_MAX])
    surrogate = lambda logp: ppo_surrogate(logp, behaviour, adv, 0.2)  # noqa: E731
    assert_same_products(pol, obs, actions, surrogate)
    hvp, dim = gaussian_mlp_hvp(pol, obs, actions, surrogate)
    assert (hvp(torch.ones(dim, dtype=torch.float64))[-3:] != 0).all()


def test_a_surrogate_that_couples_samples_is_left_to_autograd():
    pol, obs, actions, behaviour, adv = policy_and_samples(hidden=(16,))
    coupled = lambda logp: ppo_surrogate(logp, behaviour, adv, 0.2) + logp.mean() ** 2  # noqa: E731
    assert gaussian_mlp_hvp(pol, obs, actions, coupled) is None
    assert gaussian_mlp_hvp(pol, obs, actions, lambda logp: logp.mean()) is not None  # linear: c2 = 0


def test_impact_products_match_autograd():
    pol, obs, actions, target, adv = policy_and_samples(seed=3, spread=0.5)
    weights = torch.rand(len(obs), generator=torch.Generator().manual_seed(1))
    weights[::3] = 0.0  # samples that carry no weight
    assert_same_products(pol, obs, actions, lambda logp: impact_surrogate(logp, target, weights, adv, 0.3))


def test_policies_it_does_not_cover_get_none():
    box = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    discrete = Policy(spec_for_spaces(box, gym.spaces.Discrete(3), hidden_sizes=(8,)))
    obs, logp = torch.zeros(5, 4), lambda lp: lp.mean()
    assert gaussian_mlp_hvp(discrete, obs, torch.zeros(5, dtype=torch.long), logp) is None
    cnn = Policy(spec_for_spaces(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Box(-1, 1, (2,))))
    assert gaussian_mlp_hvp(cnn, torch.zeros(2, 4, 84, 84), torch.zeros(2, 2), logp) is None
    frozen, *_ = policy_and_samples(hidden=(8,))
    frozen.log_std.requires_grad_(False)
    assert gaussian_mlp_hvp(frozen, torch.zeros(5, 11), torch.zeros(5, 3), logp) is None
    as_float64, *_ = policy_and_samples(hidden=(8,))
    assert gaussian_mlp_hvp(as_float64.double(), torch.zeros(5, 11), torch.zeros(5, 3), logp) is None
    assert gaussian_mlp_hvp(torch.nn.Linear(11, 3), torch.zeros(5, 11), torch.zeros(5, 3), logp) is None


def test_detect_finds_the_same_spectrum_with_either_products():
    pol, obs, actions, behaviour, adv = policy_and_samples(hidden=(128, 128), n=600)
    samples = {"obs": obs.numpy(), "actions": actions.numpy(), "logp": behaviour.numpy(), "advantages": adv.numpy()}
    fast = detect(pol, samples, clip=0.2, seed=3)
    slow = detect(pol, samples, clip=0.2, seed=3, hvp_impl="autograd")
    assert fast.converged and slow.converged
    assert fast.lambda_max == pytest.approx(slow.lambda_max, rel=1e-3)
    assert fast.lambda_min == pytest.approx(slow.lambda_min, rel=1e-3)
    assert fast.ratio == pytest.approx(slow.ratio, rel=1e-3)
    with pytest.raises(ConfigError, match="hvp_impl"):
        detect(pol, samples, clip=0.2, hvp_impl="jax")
