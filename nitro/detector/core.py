"""detect(): one round's extreme Hessian eigenvalues and convexity ratio, a pure function of its inputs.

The service passes the post-update policy and the round's samples (behaviour
log-probabilities and advantages as the learner used them); detect() picks a
seeded subset, builds the HVP of the PPO surrogate and runs the chosen
eigensolver. It never touches torch's global thread or seed settings.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np
import torch

from nitro.detector.hvp import DEFAULT_SUBSET, make_hvp, ppo_objective, select_subset
from nitro.detector.lanczos import DEFAULT_STEPS, DEFAULT_TOL, lanczos
from nitro.detector.score import DEFAULT_EPS, convexity_ratio
from nitro.detector.solvers import eigsh_extremes, explicit_extremes, lobpcg_extremes
from nitro.errors import ConfigError

METHODS = ("lanczos", "eigsh", "lobpcg", "explicit")
REQUIRED = ("obs", "actions", "logp", "advantages")


@dataclass(frozen=True)
class DetectionResult:
    lambda_max: float
    lambda_min: float
    ratio: float
    converged: bool
    convergence_delta: float
    samples_used: int
    hvp_count: int
    seconds: float
    method: str = "lanczos"
    finite: bool = True  # False when the eigenvalues were NaN/inf and `ratio` is the guard value

    def to_dict(self) -> dict:
        """JSON-safe: non-finite eigenvalues become None."""
        d = asdict(self)
        for k in ("lambda_max", "lambda_min"):
            if not math.isfinite(d[k]):
                d[k] = None
        return d


def _tensors(samples: Mapping[str, np.ndarray], idx: np.ndarray, normalize_advantages: bool):
    obs = torch.as_tensor(np.asarray(samples["obs"])[idx])
    actions = torch.as_tensor(np.asarray(samples["actions"])[idx])
    logp = torch.as_tensor(np.asarray(samples["logp"], dtype=np.float32)[idx])
    adv = torch.as_tensor(np.asarray(samples["advantages"], dtype=np.float32)[idx])
    if normalize_advantages and adv.numel() > 1:  # same standardisation as the update, if it used one
        adv = (adv - adv.mean()) / (adv.std(unbiased=False) + 1e-8)
    return obs, actions, logp, adv


def detect(policy, samples: Mapping[str, np.ndarray], *, clip: float, subset_size: int = DEFAULT_SUBSET,
           lanczos_steps: int = DEFAULT_STEPS, seed: int = 0, method: str = "lanczos", full_batch: bool = False,
           normalize_advantages: bool = False, tol: float = DEFAULT_TOL, eps: float = DEFAULT_EPS,
           max_explicit_dim: int = 4096, early_stop: bool = True) -> DetectionResult:
    """Extreme eigenvalues of the PPO surrogate's Hessian w.r.t. policy.policy_parameters().

    samples: numpy arrays obs, actions, logp (behaviour), advantages, one row per step.
    full_batch=True uses every row (the paper's "without subset" ablation).
    method: lanczos (default, k = lanczos_steps), eigsh, lobpcg, or explicit
    (dense Hessian, only up to max_explicit_dim parameters).
    """
    if method not in METHODS:
        raise ConfigError(f"unknown detector method {method!r}; allowed: {list(METHODS)}")
    if not 0.0 < clip < 1.0:
        raise ConfigError(f"invalid value for clip: must be in (0, 1), got {clip!r}")
    if subset_size < 1 or lanczos_steps < 1:
        raise ConfigError("invalid value for subset_size / lanczos_steps: both must be integers >= 1")
    t0 = time.perf_counter()
    missing = [k for k in REQUIRED if k not in samples]
    if missing:
        raise ConfigError(f"detector samples lack {missing}; required: {list(REQUIRED)}")
    n = len(samples["obs"])
    if any(len(samples[k]) != n for k in REQUIRED):
        raise ConfigError(f"detector samples differ in length: {({k: len(samples[k]) for k in REQUIRED})}")
    if n == 0:
        raise ConfigError("detector samples are empty: need at least one step")
    idx = np.arange(n) if full_batch else select_subset(n, subset_size, seed)
    obs, actions, logp, adv = _tensors(samples, idx, normalize_advantages)
    params = [p for p in policy.policy_parameters() if p.requires_grad]
    with torch.enable_grad():
        hvp, dim = make_hvp(ppo_objective(policy, obs, actions, logp, adv, clip), params)
        if method == "lanczos":
            res = lanczos(hvp, dim, lanczos_steps, seed=seed, tol=tol, early_stop=early_stop)
        elif method == "eigsh":
            res = eigsh_extremes(hvp, dim, ncv=max(lanczos_steps, 4), tol=tol, seed=seed)
        elif method == "lobpcg":
            res = lobpcg_extremes(hvp, dim, tol=tol, seed=seed)
        else:
            if dim > max_explicit_dim:
                raise ConfigError(f"method 'explicit' needs a Hessian of {dim} x {dim}; "
                                  f"allowed up to max_explicit_dim={max_explicit_dim} parameters")
            res = explicit_extremes(hvp, dim, max_dim=max_explicit_dim)
    finite = math.isfinite(res.lambda_max) and math.isfinite(res.lambda_min)
    return DetectionResult(
        lambda_max=res.lambda_max, lambda_min=res.lambda_min,
        ratio=convexity_ratio(res.lambda_max, res.lambda_min, eps),
        converged=res.converged and finite, convergence_delta=res.convergence_delta if finite else 1.0,
        samples_used=len(idx), hvp_count=res.matvecs, seconds=time.perf_counter() - t0, method=method, finite=finite)
