"""detect(): the detector core end to end on a small policy, against the explicit Hessian."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from nitro.detector import detect
from nitro.detector.score import convexity_ratio
from nitro.errors import ConfigError
from nitro.policy.models import ModelSpec, Policy


def small_round(n=700, seed=0, hidden=(8,)):
    spec = ModelSpec(obs_shape=(11,), action_kind="box", action_dim=3, action_low=(-1.0,) * 3,
                     action_high=(1.0,) * 3, hidden_sizes=hidden)
    torch.manual_seed(seed)
    pol = Policy(spec)
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n, 11)).astype(np.float32)
    with torch.no_grad():
        dist = pol.distribution(torch.as_tensor(obs))
        actions = dist.sample()
        logp = pol.log_prob(dist, actions).numpy()
    samples = {"obs": obs, "actions": actions.numpy(), "logp": (logp + rng.normal(0, 0.1, n)).astype(np.float32),
               "advantages": rng.standard_normal(n).astype(np.float32)}
    return pol, samples


def test_lanczos_detection_matches_explicit_on_the_same_subset():
    pol, samples = small_round()
    fast = detect(pol, samples, clip=0.3, seed=3)
    exact = detect(pol, samples, clip=0.3, seed=3, method="explicit")
    assert fast.samples_used == exact.samples_used == 512
    assert fast.hvp_count <= 20 and exact.hvp_count == sum(p.numel() for p in pol.policy_parameters())
    assert detect(pol, samples, clip=0.3, seed=3, early_stop=False).hvp_count == 20
    scale = max(abs(exact.lambda_max), abs(exact.lambda_min))
    assert abs(fast.lambda_max - exact.lambda_max) < 1e-4 * scale
    assert abs(fast.lambda_min - exact.lambda_min) < 1e-4 * scale
    assert fast.ratio == pytest.approx(convexity_ratio(exact.lambda_max, exact.lambda_min), rel=1e-3)
    assert fast.converged and fast.finite and fast.seconds > 0


@pytest.mark.parametrize("method", ["eigsh", "lobpcg"])
def test_library_methods_are_selectable(method):
    pol, samples = small_round()
    ref = detect(pol, samples, clip=0.3, method="explicit")
    res = detect(pol, samples, clip=0.3, method=method)
    assert res.method == method
    assert res.lambda_max == pytest.approx(ref.lambda_max, rel=1e-3)
    assert res.lambda_min == pytest.approx(ref.lambda_min, rel=1e-3)


def test_subset_full_batch_and_seed():
    pol, samples = small_round(n=900)
    assert detect(pol, samples, clip=0.3, full_batch=True).samples_used == 900
    assert detect(pol, samples, clip=0.3, subset_size=100).samples_used == 100
    a = detect(pol, samples, clip=0.3, seed=1)
    assert a.lambda_max == detect(pol, samples, clip=0.3, seed=1).lambda_max  # deterministic
    assert a.lambda_max != detect(pol, samples, clip=0.3, seed=2).lambda_max  # another subset


def test_does_not_touch_global_torch_state_or_grads():
    pol, samples = small_round()
    threads, rng_state = torch.get_num_threads(), torch.get_rng_state()
    with torch.no_grad():  # callers inside no_grad still get a Hessian
        res = detect(pol, samples, clip=0.3)
    assert res.lambda_max > 0
    assert torch.get_num_threads() == threads and torch.equal(torch.get_rng_state(), rng_state)
    assert all(p.grad is None for p in pol.parameters())


def test_nan_samples_give_a_finite_guarded_ratio():
    pol, samples = small_round()
    samples["advantages"][:] = np.nan
    res = detect(pol, samples, clip=0.3)
    assert not res.finite and not res.converged and math.isfinite(res.ratio)
    d = res.to_dict()
    assert d["lambda_max"] is None and json.loads(json.dumps(d))["ratio"] == res.ratio


def test_invalid_arguments():
    pol, samples = small_round()
    with pytest.raises(ConfigError, match="method"):
        detect(pol, samples, clip=0.3, method="power")
    with pytest.raises(ConfigError, match="clip"):
        detect(pol, samples, clip=0.0)
    with pytest.raises(ConfigError, match="advantages"):
        detect(pol, {k: v for k, v in samples.items() if k != "advantages"}, clip=0.3)
    with pytest.raises(ConfigError, match="max_explicit_dim"):
        detect(pol, samples, clip=0.3, method="explicit", max_explicit_dim=10)
