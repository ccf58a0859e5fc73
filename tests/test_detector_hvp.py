"""Hessian-vector products of the PPO surrogate: against finite differences (float64) and explicit Hessians."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributions import Normal

from nitro.detector.hvp import explicit_hessian, make_hvp, ppo_objective, ppo_surrogate, select_subset
from nitro.policy.models import ModelSpec, Policy


class TinyGaussian(torch.nn.Module):
    """A float64 Gaussian policy with the Policy interface the objective uses (Policy itself casts to float32)."""

    def __init__(self, obs_dim=5, act_dim=2, hidden=6, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(obs_dim, hidden), torch.nn.Tanh(),
                                       torch.nn.Linear(hidden, act_dim)).double()
        self.log_std = torch.nn.Parameter(torch.full((act_dim,), -0.3, dtype=torch.float64))

    def distribution(self, obs):
        mu = self.net(obs)
        return Normal(mu, self.log_std.exp().expand_as(mu))

    def log_prob(self, dist, actions):
        return dist.log_prob(actions).sum(-1)

    def policy_parameters(self):
        return [*self.net.parameters(), self.log_std]


def _data(policy, n=64, obs_dim=5, seed=1, noise=0.2, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, obs_dim, generator=g, dtype=dtype)
    with torch.no_grad():
        dist = policy.distribution(obs)
        actions = dist.sample()
        logp = policy.log_prob(dist, actions).to(dtype)
    logp_old = logp + noise * torch.randn(n, generator=g, dtype=dtype)  # ratios != 1, some clipped
    adv = torch.randn(n, generator=g, dtype=dtype)
    return obs, actions.to(dtype), logp_old, adv


def _grad_at(objective, params, flat):
    """Gradient of the objective with the parameters set to `flat` (restored afterwards)."""
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, chunk in zip(params, flat.split([p.numel() for p in params])):
            p.copy_(chunk.view_as(p))
    g = torch.autograd.grad(objective(), params)
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
    return torch.cat([x.reshape(-1) for x in g])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hvp_matches_central_finite_differences_float64(seed):
    pol = TinyGaussian(seed=seed)
    obs, actions, logp_old, adv = _data(pol, seed=seed + 10)
    objective = ppo_objective(pol, obs, actions, logp_old, adv, clip=0.2)
    params = pol.policy_parameters()
    hvp, dim = make_hvp(objective, params)
    theta = torch.cat([p.detach().reshape(-1) for p in params])
    v = torch.randn(dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    hv = hvp(v)
    # The graph is reused: a second product on the same closure is still right and linear.
    assert torch.allclose(hvp(2 * v), 2 * hv, rtol=1e-12, atol=1e-12)
    h = 1e-5  # (perturbing the parameters in place invalidates the HVP graph, so products come first)
    fd = (_grad_at(objective, params, theta + h * v) - _grad_at(objective, params, theta - h * v)) / (2 * h)
    assert hv.dtype == torch.float64 and hv.shape == (dim,)
    assert torch.allclose(hv, fd, rtol=1e-5, atol=1e-7 * float(fd.abs().max())), float((hv - fd).abs().max())


def _flat_objective(theta, obs, actions, logp_old, adv, obs_dim=4, hidden=5, act_dim=2, clip=0.3):
    """The surrogate of a one-hidden-layer Gaussian policy as a function of ONE flat parameter vector."""
    i = 0

    def take(*shape):
        nonlocal i
        n = int(np.prod(shape))
        out = theta[i:i + n].view(*shape)
        i += n
        return out

    w1, b1, w2, b2, log_std = take(hidden, obs_dim), take(hidden), take(act_dim, hidden), take(act_dim), take(act_dim)
    mu = torch.tanh(obs @ w1.T + b1) @ w2.T + b2
    logp = Normal(mu, log_std.exp().expand_as(mu)).log_prob(actions).sum(-1)
    return ppo_surrogate(logp, logp_old, adv, clip)


def test_hvp_matches_autograd_functional_hessian():
    g = torch.Generator().manual_seed(3)
    dim = 5 * 4 + 5 + 2 * 5 + 2 + 2
    theta = (0.5 * torch.randn(dim, generator=g, dtype=torch.float64)).requires_grad_()
    obs = torch.randn(40, 4, generator=g, dtype=torch.float64)
    actions = torch.randn(40, 2, generator=g, dtype=torch.float64)
    logp_old = torch.randn(40, generator=g, dtype=torch.float64) * 0.1 - 2.0
    adv = torch.randn(40, generator=g, dtype=torch.float64)
    args = (obs, actions, logp_old, adv)
    hvp, d = make_hvp(lambda: _flat_objective(theta, *args), [theta])
    assert d == dim
    H = torch.autograd.functional.hessian(lambda t: _flat_objective(t, *args), theta.detach())
    for s in range(3):
        v = torch.randn(dim, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
        assert torch.allclose(hvp(v), H @ v, rtol=1e-10, atol=1e-12)
    assert torch.allclose(explicit_hessian(hvp, dim), H, rtol=1e-10, atol=1e-12)


def test_ratio_one_is_not_flat_clipped_equals_unclipped_curvature():
    """At r == 1 the clip is inactive, so the Hessian is that of mean(r A), not zero."""
    pol = TinyGaussian(seed=4)
    obs, actions, _, adv = _data(pol, seed=5)
    with torch.no_grad():
        logp_now = pol.log_prob(pol.distribution(obs), actions)
    params = pol.policy_parameters()
    hvp_clip, dim = make_hvp(ppo_objective(pol, obs, actions, logp_now, adv, clip=0.2), params)

    def unclipped():
        lp = pol.log_prob(pol.distribution(obs), actions)
        return (torch.exp(lp - logp_now) * adv).mean()

    hvp_plain, _ = make_hvp(unclipped, params)
    v = torch.randn(dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a, b = hvp_clip(v), hvp_plain(v)
    assert float(a.norm()) > 1e-3
    assert torch.allclose(a, b, rtol=1e-12, atol=1e-14)


def test_fully_clipped_samples_carry_no_curvature():
    pol = TinyGaussian(seed=6)
    obs, actions, _, _ = _data(pol, seed=7)
    with torch.no_grad():
        logp_now = pol.log_prob(pol.distribution(obs), actions)
    # r = e^1 > 1 + clip with A > 0: the pessimistic branch is the flat clipped one for every sample.
    hvp, dim = make_hvp(ppo_objective(pol, obs, actions, logp_now - 1.0, torch.ones(len(obs), dtype=torch.float64),
                                      clip=0.2), pol.policy_parameters())
    assert float(hvp(torch.ones(dim, dtype=torch.float64)).abs().max()) == 0.0


def test_real_policy_float32_hvp_matches_finite_differences_loosely():
    spec = ModelSpec(obs_shape=(6,), action_kind="box", action_dim=2, action_low=(-1.0, -1.0),
                     action_high=(1.0, 1.0), hidden_sizes=(8,))
    torch.manual_seed(0)
    pol = Policy(spec)
    # Ratios well inside the clip range, so the finite-difference steps cross no kink of the min/clamp.
    obs, actions, logp_old, adv = _data(pol, n=128, obs_dim=6, seed=8, noise=0.01, dtype=torch.float32)
    objective = ppo_objective(pol, obs, actions, logp_old, adv, clip=0.3)
    params = pol.policy_parameters()
    hvp, dim = make_hvp(objective, params)
    assert dim == 6 * 8 + 8 + 8 * 2 + 2 + 2
    theta = torch.cat([p.detach().reshape(-1) for p in params])
    v = torch.randn(dim, generator=torch.Generator().manual_seed(1))
    v /= v.norm()
    hv = hvp(v)
    h = 1e-2
    fd = (_grad_at(objective, params, theta + h * v) - _grad_at(objective, params, theta - h * v)) / (2 * h)
    assert hv.dtype == torch.float32
    assert float((hv - fd).norm() / fd.norm()) < 1e-3


def test_hvp_leaves_grad_untouched_and_checks_shape():
    pol = TinyGaussian()
    obs, actions, logp_old, adv = _data(pol)
    hvp, dim = make_hvp(ppo_objective(pol, obs, actions, logp_old, adv, clip=0.2), pol.policy_parameters())
    hvp(torch.ones(dim, dtype=torch.float64))
    assert all(p.grad is None for p in pol.policy_parameters())
    with pytest.raises(ValueError):
        hvp(torch.ones(dim + 1))


def test_linear_objective_has_zero_hessian_and_unused_params_are_zero():
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    unused = torch.randn(3, dtype=torch.float64, requires_grad=True)
    hvp, dim = make_hvp(lambda: (w * torch.arange(4.0, dtype=torch.float64)).sum(), [w, unused])
    assert dim == 7
    assert torch.equal(hvp(torch.ones(7, dtype=torch.float64)), torch.zeros(7, dtype=torch.float64))
    hvp2, _ = make_hvp(lambda: (w ** 3).sum(), [w, unused])
    v = torch.arange(7.0, dtype=torch.float64)
    assert torch.allclose(hvp2(v), torch.cat([6 * w.detach() * v[:4], torch.zeros(3, dtype=torch.float64)]))


def test_select_subset_is_seeded_sorted_unique():
    a = select_subset(4096, 512, seed=3)
    assert len(a) == 512 and len(np.unique(a)) == 512 and np.all(np.diff(a) > 0) and a.max() < 4096
    assert np.array_equal(a, select_subset(4096, 512, seed=3))
    assert not np.array_equal(a, select_subset(4096, 512, seed=4))
    assert np.array_equal(select_subset(100, 512), np.arange(100))
    with pytest.raises(ValueError):
        select_subset(10, 0)


def test_explicit_hessian_refuses_large_dimensions():
    with pytest.raises(ValueError, match="max_dim"):
        explicit_hessian(lambda v: v, 10_000, max_dim=4096)
