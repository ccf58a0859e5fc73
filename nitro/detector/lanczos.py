"""k-step Lanczos with full reorthogonalisation for the extreme eigenvalues of a symmetric operator.

The operator is only touched through `matvec` (Hessian-vector products), so
the Hessian is never formed. Lanczos builds an orthonormal Krylov basis Q and
the tridiagonal T = Q^T H Q; T's eigenvalues (Ritz values) approach H's
extremes first, which is all the convexity ratio needs. In floating point
plain Lanczos loses orthogonality and produces spurious copies of converged
Ritz values, so every new vector is re-orthogonalised against the whole basis
(classical Gram-Schmidt, twice): k extra dot products per step, negligible
next to one HVP. Vectors are kept in float64 whatever the operator's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy.linalg import eigh_tridiagonal

from nitro.contracts import LANCZOS_STEPS

DEFAULT_TOL = 1e-3  # relative change of the extremes that counts as converged
DEFAULT_WINDOW = 3  # iterations over which that change is measured
BREAKDOWN_TOL = 1e-10  # beta below this (relative to ||T||) means an invariant subspace
# Reorthogonalise again only when a pass removed more than this share of w's norm (Daniel, Gragg, Kaufman and
# Stewart's criterion, 1/sqrt(2)): a pass that barely changed w left it orthogonal to working precision.
DGKS_RATIO = 0.7071067811865476


@dataclass(frozen=True)
class EigResult:
    """Extreme eigenvalue estimates of a symmetric operator.

    convergence_delta: the largest change of lambda_max or lambda_min over the
    last `window` iterations, relative to max(|lambda_max|, |lambda_min|);
    1.0 when too few iterations ran to tell, 0.0 for an exact (invariant) result.
    """

    lambda_max: float
    lambda_min: float
    ritz_values: tuple[float, ...]
    iterations: int
    matvecs: int
    invariant: bool
    converged: bool
    convergence_delta: float
    method: str = "lanczos"


def tridiagonal_eigenvalues(alphas, betas) -> np.ndarray:
    """Ascending eigenvalues of the symmetric tridiagonal matrix with diagonal alphas, off-diagonal betas."""
    d = np.asarray(alphas, dtype=np.float64)
    e = np.asarray(betas, dtype=np.float64)[: max(len(d) - 1, 0)]
    if len(d) == 1:
        return d.copy()
    return eigh_tridiagonal(d, e, eigvals_only=True)


def extremes_delta(history: list[tuple[float, float]], window: int = DEFAULT_WINDOW) -> float:
    """Largest relative change of (lambda_max, lambda_min) over the last `window` steps of `history`."""
    if len(history) < 2:
        return 1.0
    hi, lo = history[-1]
    scale = max(abs(hi), abs(lo))
    if scale == 0.0:
        return 0.0
    recent = history[-(window + 1):]
    change = max(max(abs(a[0] - b[0]), abs(a[1] - b[1])) for a, b in zip(recent[:-1], recent[1:]))
    return float(change / scale)


def reorthogonalize(w: torch.Tensor, basis: torch.Tensor) -> tuple[float, int]:
    """Remove from w (in place) its components along the orthonormal rows of `basis` by classical Gram-Schmidt,
    with a second pass only when the first removed more than 1 - DGKS_RATIO of w's norm. Such cancellation
    comes once Ritz values converge, and then one pass is not enough; before that a pass changes ||w|| by
    ~1e-16, and a second would double the step's bookkeeping. Returns (||w|| after, passes)."""
    norm = float(w.norm())
    for passes in (1, 2):
        w -= basis.T @ (basis @ w)
        before, norm = norm, float(w.norm())
        if norm >= DGKS_RATIO * before:
            break
    return norm, passes


def lanczos(matvec: Callable[[torch.Tensor], torch.Tensor], dim: int, k: int = LANCZOS_STEPS, *, seed: int = 0,
            tol: float = DEFAULT_TOL, window: int = DEFAULT_WINDOW, early_stop: bool = False,
            min_steps: int = 8) -> EigResult:
    """Run at most k Lanczos steps from a seeded Gaussian start vector; see EigResult.

    early_stop: stop once the extremes moved by at most `tol` (relative) over the
    last `window` steps, after at least `min_steps`; the extremes converge long
    before interior Ritz values, so this saves products without changing R.
    """
    if dim < 1 or k < 1:
        raise ValueError(f"lanczos needs dim >= 1 and k >= 1, got dim={dim}, k={k}")
    steps = min(k, dim)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(dim, dtype=torch.float64, generator=gen)
    q /= q.norm()
    basis = torch.empty(steps, dim, dtype=torch.float64)
    alphas: list[float] = []
    betas: list[float] = []
    history: list[tuple[float, float]] = []
    anorm, beta, invariant = 0.0, 0.0, False
    ritz = np.zeros(1)
    for j in range(steps):
        basis[j] = q
        w = matvec(q).to(torch.float64)
        alpha = float(w @ q)
        # A NaN or inf anywhere in w makes the dot product non-finite (0 * inf is NaN too): no separate scan.
        if not math.isfinite(alpha):
            # A NaN/inf product means the operator itself is broken: report that, not stale Ritz values.
            nan = float("nan")
            return EigResult(nan, nan, (), j + 1, j + 1, False, False, 1.0)
        w -= alpha * q
        if j > 0:
            w -= beta * basis[j - 1]
        beta, _ = reorthogonalize(w, basis[: j + 1])
        alphas.append(alpha)
        ritz = tridiagonal_eigenvalues(alphas, betas)
        history.append((float(ritz[-1]), float(ritz[0])))
        anorm = max(anorm, abs(alpha) + beta + (betas[-1] if betas else 0.0))
        if beta <= BREAKDOWN_TOL * anorm or anorm == 0.0:
            invariant = True
            break
        betas.append(beta)
        if early_stop and len(alphas) >= min_steps and extremes_delta(history, window) <= tol:
            break
        q = w / beta
    delta = 0.0 if invariant else extremes_delta(history, window)
    return EigResult(lambda_max=float(ritz[-1]), lambda_min=float(ritz[0]),
                     ritz_values=tuple(float(x) for x in ritz), iterations=len(alphas), matvecs=len(alphas),
                     invariant=invariant, converged=invariant or delta <= tol, convergence_delta=delta)
