"""Lanczos extremes against torch.linalg.eigvalsh: quadratic forms with known spectra and small networks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nitro.detector.hvp import explicit_hessian, make_hvp, ppo_objective
from nitro.detector.lanczos import lanczos, reorthogonalize, residual_delta, ritz_pairs
from nitro.detector.solvers import eigsh_extremes, explicit_extremes, lobpcg_extremes
from nitro.policy.models import ModelSpec, Policy


def quadratic(eigs, seed=0):
    """A random symmetric matrix with exactly the eigenvalues `eigs` (float64) and its matvec."""
    eigs = torch.as_tensor(eigs, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(len(eigs), len(eigs), generator=torch.Generator().manual_seed(seed),
                                       dtype=torch.float64))
    a = q @ torch.diag(eigs) @ q.T
    a = 0.5 * (a + a.T)
    return a, (lambda v: a @ v.to(torch.float64))


def with_outliers(bulk_lo, bulk_hi, low, high, n=200):
    """A bulk spectrum plus separated extremes, the shape neural-network Hessians typically have."""
    return np.concatenate([np.linspace(bulk_lo, bulk_hi, n - len(low) - len(high)), low, high])


SPECTRA = {
    "positive_definite": with_outliers(0.5, 2.0, [0.05], [12.0, 30.0]),
    "negative_definite": with_outliers(-2.0, -0.5, [-30.0, -12.0], [-0.05]),
    "indefinite": with_outliers(-1.0, 1.5, [-8.0], [5.0, 20.0]),
    "near_singular_psd": with_outliers(1e-9, 1e-6, [0.0], [3.0, 7.0]),
    "near_singular_indefinite": with_outliers(-1e-6, 1e-6, [-4.0], [2.5]),
}


@pytest.mark.parametrize("name", sorted(SPECTRA))
def test_lanczos_extremes_of_known_spectra(name):
    a, mv = quadratic(SPECTRA[name], seed=len(name))
    exact = torch.linalg.eigvalsh(a)
    res = lanczos(mv, a.shape[0], k=20, seed=0)
    scale = float(exact.abs().max())
    assert abs(res.lambda_max - float(exact[-1])) <= 1e-8 * scale, (res.lambda_max, float(exact[-1]))
    assert abs(res.lambda_min - float(exact[0])) <= 1e-8 * scale, (res.lambda_min, float(exact[0]))
    assert res.iterations == 20 and res.matvecs == 20
    assert res.converged and res.convergence_delta < 1e-6
    assert res.ritz_values == tuple(sorted(res.ritz_values))
    # Ritz values interlace: they never leave the spectrum's range.
    assert float(exact[0]) - 1e-9 * scale <= min(res.ritz_values)
    assert max(res.ritz_values) <= float(exact[-1]) + 1e-9 * scale


def test_full_reorthogonalisation_has_no_ghost_eigenvalues():
    """A full run recovers the whole spectrum with each eigenvalue once (plain Lanczos would duplicate extremes)."""
    eigs = np.array([-5.0, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0, 100.0])
    eigs = np.concatenate([eigs, np.linspace(4.0, 6.0, 32)])
    a, mv = quadratic(eigs, seed=1)
    res = lanczos(mv, len(eigs), k=len(eigs))
    assert np.allclose(res.ritz_values, np.sort(eigs), atol=1e-9 * 100)


def test_reorthogonalisation_takes_a_second_pass_only_after_cancellation():
    g = torch.Generator().manual_seed(3)
    basis, _ = torch.linalg.qr(torch.randn(5000, 12, dtype=torch.float64, generator=g))
    basis = basis.T.contiguous()  # 12 orthonormal rows
    fresh = torch.randn(5000, dtype=torch.float64, generator=g)
    w = fresh.clone()
    norm, passes = reorthogonalize(w, basis)
    assert passes == 1 and norm == pytest.approx(float(fresh.norm()), rel=0.1)
    assert float((basis @ w).abs().max()) < 1e-13 * norm
    # almost all of w in the basis's span: one pass leaves ~1e-16 / 1e-10 of it behind, the second removes that
    w = 1e-10 * fresh + basis.T @ torch.randn(12, dtype=torch.float64, generator=g)
    norm, passes = reorthogonalize(w, basis)
    assert passes == 2 and float((basis @ w).abs().max()) < 1e-13 * norm


def test_invariant_subspace_stops_early_with_exact_values():
    """A rank-4 operator: the Krylov space is exhausted after at most 5 steps (4 nonzero + the null part)."""
    eigs = np.zeros(100)
    eigs[:4] = [-2.0, 1.0, 3.0, 9.0]
    a, mv = quadratic(eigs, seed=2)
    res = lanczos(mv, 100, k=20)
    assert res.invariant and res.converged and res.iterations <= 5
    assert res.lambda_max == pytest.approx(9.0, abs=1e-10) and res.lambda_min == pytest.approx(-2.0, abs=1e-10)
    assert res.convergence_delta == 0.0


def test_zero_operator_and_tiny_dimensions():
    res = lanczos(lambda v: torch.zeros_like(v), 50, k=20)
    assert (res.lambda_max, res.lambda_min, res.invariant, res.iterations) == (0.0, 0.0, True, 1)
    res = lanczos(lambda v: 3.0 * v, 1, k=20)
    assert res.lambda_max == pytest.approx(3.0) and res.lambda_min == pytest.approx(3.0) and res.iterations == 1
    with pytest.raises(ValueError):
        lanczos(lambda v: v, 0)


def test_nan_products_are_reported_not_hidden():
    res = lanczos(lambda v: torch.full_like(v, float("nan")), 10, k=5)
    assert np.isnan(res.lambda_max) and np.isnan(res.lambda_min) and not res.converged


@pytest.mark.parametrize("bad", [[float("nan")], [float("inf")], [float("-inf")], [float("inf"), float("-inf")]])
def test_one_non_finite_entry_in_a_product_is_reported(bad):
    """Lanczos checks a product through its dot product with q: one bad entry among 50 must show there."""
    def matvec(v):
        out = 2.0 * v
        out[7:7 + len(bad)] = torch.tensor(bad, dtype=out.dtype)
        return out
    res = lanczos(matvec, 50, k=5)
    assert np.isnan(res.lambda_max) and np.isnan(res.lambda_min) and not res.converged


def test_convergence_indicator_flags_too_few_steps():
    a, mv = quadratic(np.linspace(-1.0, 1.0, 300), seed=3)  # no outliers: the hardest case for Lanczos
    short = lanczos(mv, 300, k=4)
    long = lanczos(mv, 300, k=60)
    assert not short.converged and short.convergence_delta > 1e-3
    assert long.convergence_delta < short.convergence_delta
    exact = torch.linalg.eigvalsh(a)
    assert abs(long.lambda_max - float(exact[-1])) < abs(short.lambda_max - float(exact[-1]))


def test_seeded_and_deterministic():
    _, mv = quadratic(SPECTRA["indefinite"], seed=4)
    assert lanczos(mv, 200, k=5, seed=7) == lanczos(mv, 200, k=5, seed=7)
    assert lanczos(mv, 200, k=5, seed=7).ritz_values != lanczos(mv, 200, k=5, seed=8).ritz_values


def test_tridiagonal_solver_and_delta_helper():
    rng = np.random.default_rng(0)
    d, e = rng.standard_normal(7), rng.standard_normal(6)
    dense = np.diag(d) + np.diag(e, 1) + np.diag(e, -1)
    assert np.allclose(ritz_pairs([2.0], [])[0], [2.0]) and ritz_pairs([2.0], [])[1] == pytest.approx([1.0])
    values, last = ritz_pairs(d, e)
    exact_values, exact_vectors = np.linalg.eigh(dense)
    assert np.allclose(values, exact_values) and np.allclose(np.abs(last), np.abs(exact_vectors[-1]))
    # the larger of the extremes' residual bounds beta |s_j|, relative to the larger extreme's magnitude
    assert residual_delta(np.array([-1.0, 0.5, 2.0]), np.array([0.1, 0.9, -0.3]), 4.0) == pytest.approx(4.0 * 0.3 / 2.0)
    # all Ritz values 0: exact when nothing is left of w, otherwise nothing is known yet
    assert residual_delta(np.zeros(2), np.ones(2), 0.0) == 0.0
    assert residual_delta(np.zeros(2), np.ones(2), 1.0) == 1.0


def tiny_policy_hvp(seed: int, n: int = 256, hidden=(8,)):
    spec = ModelSpec(obs_shape=(11,), action_kind="box", action_dim=3, action_low=(-1.0,) * 3,
                     action_high=(1.0,) * 3, hidden_sizes=hidden)
    torch.manual_seed(seed)
    pol = Policy(spec)
    g = torch.Generator().manual_seed(seed + 100)
    obs = torch.randn(n, 11, generator=g)
    with torch.no_grad():
        dist = pol.distribution(obs)
        actions = dist.sample()
        logp = pol.log_prob(dist, actions)
    logp_old = logp + 0.15 * torch.randn(n, generator=g)
    adv = torch.randn(n, generator=g)
    return make_hvp(ppo_objective(pol, obs, actions, logp_old, adv, clip=0.3), pol.policy_parameters())


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_lanczos_on_small_network_hessians(seed):
    hvp, dim = tiny_policy_hvp(seed)
    exact = torch.linalg.eigvalsh(explicit_hessian(hvp, dim))
    res = lanczos(hvp, dim, k=20, seed=seed)
    scale = float(exact.abs().max())
    # float32 products limit agreement to ~1e-6 of the spectral scale; Lanczos itself is exact here.
    assert abs(res.lambda_max - float(exact[-1])) <= 1e-4 * scale
    assert abs(res.lambda_min - float(exact[0])) <= 1e-4 * scale
    assert float(exact[0]) < 0 < float(exact[-1])  # the surrogate's Hessian is indefinite


def test_library_solvers_agree_on_the_same_operator():
    a, mv = quadratic(SPECTRA["indefinite"], seed=5)
    exact = torch.linalg.eigvalsh(a)
    for res in (eigsh_extremes(mv, 200, tol=1e-10), lobpcg_extremes(mv, 200, tol=1e-8, niter=200),
                explicit_extremes(mv, 200)):
        assert res.lambda_max == pytest.approx(float(exact[-1]), rel=1e-5), res.method
        assert res.lambda_min == pytest.approx(float(exact[0]), rel=1e-5), res.method
        assert res.matvecs > 0


def test_early_stop_keeps_the_extremes_with_fewer_products():
    import torch

    from nitro.detector.lanczos import lanczos

    rng = torch.Generator().manual_seed(3)
    q, _ = torch.linalg.qr(torch.randn(300, 300, generator=rng, dtype=torch.float64))
    eig = torch.cat([torch.tensor([9.0, -7.0], dtype=torch.float64), torch.linspace(-1, 1, 298, dtype=torch.float64)])
    h = q @ torch.diag(eig) @ q.T
    full = lanczos(lambda v: h @ v, 300, 40, seed=1)
    early = lanczos(lambda v: h @ v, 300, 40, seed=1, early_stop=True, tol=1e-6)
    assert early.matvecs < full.matvecs
    assert abs(early.lambda_max - 9.0) < 1e-4 and abs(early.lambda_min + 7.0) < 1e-4
    assert early.converged


def test_early_stop_is_not_fooled_by_a_slowly_converging_extreme():
    """Bulk [-1, 1] with the bottom eigenvalue 0.05 below it: the smallest Ritz value creeps towards -1.05 by less
    than 1e-3 of the scale a step, which a stop on the change of the Ritz values took for convergence (14 products,
    1.6% off). The residual bound beta |s_j| does not shrink until the value is there."""
    g = torch.Generator().manual_seed(1)
    u, _ = torch.linalg.qr(torch.randn(400, 400, dtype=torch.float64, generator=g))
    eigs = torch.cat([torch.tensor([-1.05, 3.0], dtype=torch.float64), torch.linspace(-1, 1, 398, dtype=torch.float64)])
    h = u @ torch.diag(eigs) @ u.T
    res = lanczos(lambda v: h @ v, 400, 40, seed=0, early_stop=True)
    error = max(abs(res.lambda_max - 3.0), abs(res.lambda_min + 1.05)) / 3.0
    assert res.converged and 14 < res.matvecs < 40, (res.matvecs, res.convergence_delta)  # it did stop early
    assert error < 2e-3, (res.matvecs, error)
