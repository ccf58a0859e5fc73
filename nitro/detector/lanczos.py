"""k-step Lanczos with full reorthogonalisation for the extreme eigenvalues of a symmetric operator.

The operator is only touched through `matvec` (Hessian-vector products), so
the Hessian is never formed. Lanczos builds an orthonormal Krylov basis Q and
the tridiagonal T = Q^T H Q; T's eigenvalues (Ritz values) approach H's
extremes first, which is all the convexity ratio needs. In floating point
plain Lanczos loses orthogonality and produces spurious copies of converged
Ritz values, so every new vector is re-orthogonalised against the whole basis
(classical Gram-Schmidt, a second pass only after cancellation): k extra dot
products per step, negligible next to one HVP. Vectors are kept in float64
whatever the operator's dtype.

Convergence is read from the Ritz residuals: after j steps H Q = Q T + beta q' e_j^T,
so a Ritz pair (theta, y = Q s) has ||H y - theta y|| = beta |s_j|, and some
eigenvalue of H lies within that distance of theta (some eigenvalue, not
necessarily the extreme one). Unlike the change of the Ritz values between
steps, it does not shrink while an extreme is still creeping towards its value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy.linalg import eigh_tridiagonal

from nitro.contracts import LANCZOS_STEPS

# Ritz residual of the extremes, relative to the spectral scale, that counts as converged: on the 160 detector
# problems of two demo jobs it stopped after 10.6-10.9 products on average, worst error 3.7e-4 (docs/detector.md).
DEFAULT_TOL = 3e-3
BREAKDOWN_TOL = 1e-10  # beta below this (relative to ||T||) means an invariant subspace
# Reorthogonalise again only when a pass removed more than this share of w's norm (Daniel, Gragg, Kaufman and
# Stewart's criterion, 1/sqrt(2)): a pass that barely changed w left it orthogonal to working precision.
DGKS_RATIO = 0.7071067811865476


@dataclass(frozen=True)
class EigResult:
    """Extreme eigenvalue estimates of a symmetric operator.

    convergence_delta: the larger Ritz residual bound of the two extremes, relative
    to max(|lambda_max|, |lambda_min|): each lies within delta * that scale of an
    eigenvalue of the operator. 0.0 for an exact (invariant) result, 1.0 when the
    products were not finite (lambda_max and lambda_min are then NaN) or every Ritz
    value is 0 while beta > 0 (nothing is known yet).
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


def ritz_pairs(alphas, betas) -> tuple[np.ndarray, np.ndarray]:
    """(ascending eigenvalues, the last component of each unit eigenvector) of the symmetric tridiagonal
    matrix with diagonal alphas and off-diagonal betas: all a Ritz residual needs."""
    d = np.asarray(alphas, dtype=np.float64)
    e = np.asarray(betas, dtype=np.float64)[: max(len(d) - 1, 0)]
    if len(d) == 1:
        return d.copy(), np.ones(1)
    values, vectors = eigh_tridiagonal(d, e)
    return values, vectors[-1]


def residual_delta(values: np.ndarray, last_components: np.ndarray, beta: float) -> float:
    """The larger Ritz residual bound beta |s_j| of the two extreme Ritz values, relative to their scale."""
    scale = max(abs(float(values[-1])), abs(float(values[0])))
    if scale == 0.0:  # all Ritz values 0: exact only if nothing is left of w
        return 0.0 if beta == 0.0 else 1.0
    return beta * max(abs(float(last_components[-1])), abs(float(last_components[0]))) / scale


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
            tol: float = DEFAULT_TOL, early_stop: bool = False, min_steps: int = 8) -> EigResult:
    """Run at most k Lanczos steps from a seeded Gaussian start vector; see EigResult.

    early_stop: stop once both extremes' Ritz residual bounds are within `tol` of the
    spectral scale, after at least `min_steps` (a Krylov space of a few vectors can
    look converged before it has met an outlying eigenvalue); the extremes converge
    long before interior Ritz values, so this saves products without changing R.
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
    anorm, beta, invariant = 0.0, 0.0, False
    for j in range(steps):
        basis[j] = q
        w = matvec(q).to(torch.float64)
        alpha = float(w @ q)
        # A NaN or inf anywhere in w makes the dot product non-finite (0 * inf is NaN too): no separate scan.
        if not math.isfinite(alpha):
            # A NaN/inf product means the operator itself is broken: report that, not stale Ritz values.
            nan = float("nan")
            return EigResult(nan, nan, (), j + 1, j + 1, False, False, 1.0)
        w.sub_(q, alpha=alpha)
        if j > 0:
            w.sub_(basis[j - 1], alpha=beta)
        beta, _ = reorthogonalize(w, basis[: j + 1])
        alphas.append(alpha)
        anorm = max(anorm, abs(alpha) + beta + (betas[-1] if betas else 0.0))
        if beta <= BREAKDOWN_TOL * anorm or anorm == 0.0:
            invariant = True
            break
        betas.append(beta)
        # T's eigenproblem only where its answer is read (the early stop, the last step): right after an HVP
        # it costs ~0.2 ms (cold caches).
        stop_test = early_stop and len(alphas) >= min_steps
        if stop_test or j == steps - 1:
            ritz, last = ritz_pairs(alphas, betas)
            delta = residual_delta(ritz, last, beta)
            if stop_test and delta <= tol:
                break
        q = w / beta
    if invariant:
        ritz, delta = ritz_pairs(alphas, betas)[0], 0.0
    return EigResult(lambda_max=float(ritz[-1]), lambda_min=float(ritz[0]),
                     ritz_values=tuple(float(x) for x in ritz), iterations=len(alphas), matvecs=len(alphas),
                     invariant=invariant, converged=invariant or delta <= tol, convergence_delta=delta)
