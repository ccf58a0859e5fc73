"""Alternative extreme-eigenvalue solvers on the same HVP operator, for comparison and ablation.

Lanczos (lanczos.py) is the default; docs/detector.md records why. These
return the same EigResult so core.detect can switch by name:

- eigsh: ARPACK's implicitly restarted Lanczos (scipy) over a LinearOperator,
  which="BE" (one eigenvalue from each end).
- lobpcg: torch.lobpcg, run twice (largest, then smallest). It only accepts
  tensors, so the HVP is wrapped in a zero-storage tensor subclass that
  answers torch.matmul with Hessian products. This leans on torch internals
  and exists only for the comparison.
- explicit: the dense Hessian row by row, then torch.linalg.eigvalsh; exact
  but O(d) products and O(d^3) time: small networks and the paper's ablation.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from nitro.detector.hvp import explicit_hessian
from nitro.detector.lanczos import EigResult

MatVec = Callable[[torch.Tensor], torch.Tensor]


class _Counted:
    """Counts products; the comparison is per HVP as much as per second."""

    def __init__(self, matvec: MatVec):
        self.matvec, self.calls = matvec, 0

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.matvec(v).to(torch.float64)


def eigsh_extremes(matvec: MatVec, dim: int, *, ncv: int = 20, tol: float = 1e-3, maxiter: int | None = None,
                   seed: int = 0) -> EigResult:
    from scipy.sparse.linalg import LinearOperator, eigsh

    if dim < 3:
        return explicit_extremes(matvec, dim)
    counted = _Counted(matvec)
    op = LinearOperator((dim, dim), matvec=lambda x: counted(torch.from_numpy(np.ascontiguousarray(x).ravel())).numpy(),
                        dtype=np.float64)
    v0 = np.random.default_rng(seed).standard_normal(dim)
    vals = eigsh(op, k=2, which="BE", ncv=min(ncv, dim - 1) if ncv > 2 else None, tol=tol, maxiter=maxiter,
                 v0=v0, return_eigenvectors=False)
    vals = np.sort(vals)
    return EigResult(float(vals[-1]), float(vals[0]), tuple(float(x) for x in vals), counted.calls, counted.calls,
                     False, True, 0.0, "eigsh")


class _OperatorTensor(torch.Tensor):
    """A (dim, dim) tensor with no storage of its own whose matmul is the HVP."""

    @staticmethod
    def __new__(cls, matvec: MatVec, dim: int):
        t = torch.Tensor._make_subclass(cls, torch.zeros((), dtype=torch.float64).expand(dim, dim))
        t._matvec = matvec
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.lobpcg:  # skip the dispatching wrapper, keep our matmul visible inside
            from torch._lobpcg import _lobpcg

            return _lobpcg(*args, **kwargs)
        if func is torch.matmul and isinstance(args[0], cls):
            x = args[1]
            return torch.stack([args[0]._matvec(x[:, i]) for i in range(x.shape[1])], dim=1)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def lobpcg_extremes(matvec: MatVec, dim: int, *, block: int = 1, niter: int = 50, tol: float = 1e-3,
                    seed: int = 0) -> EigResult:
    if dim < 3 * block:
        return explicit_extremes(matvec, dim)
    counted = _Counted(matvec)
    op = _OperatorTensor(counted, dim)
    gen = torch.Generator().manual_seed(seed)
    ends = []
    for largest in (True, False):
        x0 = torch.randn(dim, block, dtype=torch.float64, generator=gen)
        e, _ = torch.lobpcg(op, k=1, X=x0, niter=niter, tol=tol, largest=largest)
        ends.append(float(e[0]))
    hi, lo = max(ends), min(ends)
    return EigResult(hi, lo, (lo, hi), counted.calls, counted.calls, False, True, 0.0, "lobpcg")


def explicit_extremes(matvec: MatVec, dim: int, *, max_dim: int = 4096) -> EigResult:
    h = explicit_hessian(matvec, dim, max_dim=max_dim)
    vals = torch.linalg.eigvalsh(h)
    return EigResult(float(vals[-1]), float(vals[0]), tuple(vals.tolist()), dim, dim, True, True, 0.0, "explicit")
