"""detect(): one round's extreme Hessian eigenvalues and convexity ratio, a pure function of its inputs.

The service passes the post-update policy and the round's samples (behaviour
log-probabilities and advantages as the learner used them; for IMPACT instead
the log-probabilities the surrogate's ratio divides by and its per-sample
weights, as the update used them: `logp_target` and `is_weights`, see
nitro.algos.impact.IMPACTLearner.prepare);
detect() picks a seeded subset, builds the HVP of the algorithm's surrogate
(`algo`: "ppo" or "impact") and runs the chosen eigensolver. It never touches
torch's global thread or seed settings.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np
import torch

from nitro.contracts import DETECTOR_SUBSET, LANCZOS_STEPS
from nitro.detector.hvp import impact_surrogate_of, make_hvp, ppo_surrogate_of, select_subset, surrogate_objective
from nitro.detector.lanczos import lanczos
from nitro.detector.mlp_hvp import gaussian_mlp_hvp
from nitro.detector.score import DEFAULT_EPS, convexity_ratio
from nitro.detector.solvers import eigsh_extremes, explicit_extremes, lobpcg_extremes
from nitro.errors import ConfigError

METHODS = ("lanczos", "eigsh", "lobpcg", "explicit")
HVP_IMPLS = ("auto", "autograd")
REQUIRED = ("obs", "actions", "logp", "advantages")
# Sample fields each algorithm's surrogate needs; the learner writes these into the detector's subset.
REQUIRED_FIELDS = {"ppo": REQUIRED, "impact": ("obs", "actions", "logp_target", "is_weights", "advantages")}
ALGOS = tuple(REQUIRED_FIELDS)


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


def _tensors(samples: Mapping[str, np.ndarray], idx: np.ndarray, normalize_advantages: bool,
             float_fields: tuple[str, ...]):
    obs = torch.as_tensor(np.asarray(samples["obs"])[idx])
    actions = torch.as_tensor(np.asarray(samples["actions"])[idx])
    floats = [torch.as_tensor(np.asarray(samples[k], dtype=np.float32)[idx]) for k in float_fields]
    adv = torch.as_tensor(np.asarray(samples["advantages"], dtype=np.float32)[idx])
    # The update's per-minibatch standardisation, if it used one; a whole-batch one (PPO's
    # normalize_batch_advantages) is already in the learner's samples.
    if normalize_advantages and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std(unbiased=False) + 1e-8)
    return obs, actions, floats, adv


def _surrogate(algo: str, samples, idx, normalize_advantages: bool, clip: float):
    """(obs, actions, the algorithm's surrogate as a function of the policy's log-probabilities of them)."""
    if algo == "impact":
        obs, actions, (logp_target, weights), adv = _tensors(samples, idx, normalize_advantages,
                                                             ("logp_target", "is_weights"))
        return obs, actions, impact_surrogate_of(logp_target, weights, adv, clip)
    obs, actions, (logp_old,), adv = _tensors(samples, idx, normalize_advantages, ("logp",))
    return obs, actions, ppo_surrogate_of(logp_old, adv, clip)


def detect(policy, samples: Mapping[str, np.ndarray], *, clip: float, subset_size: int = DETECTOR_SUBSET,
           lanczos_steps: int = LANCZOS_STEPS, seed: int = 0, method: str = "lanczos", full_batch: bool = False,
           normalize_advantages: bool = False, tol: float | None = None, eps: float = DEFAULT_EPS,
           max_explicit_dim: int = 4096, early_stop: bool = True, algo: str = "ppo",
           hvp_impl: str = "auto") -> DetectionResult:
    """Extreme eigenvalues of the surrogate's Hessian w.r.t. policy.policy_parameters().

    algo: "ppo" (clipped surrogate against the behaviour policy) or "impact"
    (mean(w min(r A, clip(r) A)) with r = pi / exp(logp_target), w = is_weights:
    IMPACT's surrogate, whose logp_target is the target network's log-prob floored at
    log(mu / is_ratio_clip) and whose w is 1; Stellaris's, with its base policy and rho).
    samples: numpy arrays, one row per step: REQUIRED_FIELDS[algo], i.e. obs, actions,
    advantages plus logp (behaviour) for PPO, or logp_target and is_weights for IMPACT.
    full_batch=True uses every row (the paper's "without subset" ablation).
    method: lanczos (default, k = lanczos_steps), eigsh, lobpcg, or explicit
    (dense Hessian, only up to max_explicit_dim parameters).
    tol: the solver's convergence tolerance; None takes each solver's own default
    (Lanczos: DEFAULT_TOL on its Ritz residual; eigsh and lobpcg: 1e-3).
    hvp_impl: "auto" (nitro.detector.mlp_hvp's written-out products for a Gaussian MLP policy,
    autograd's double backward otherwise) or "autograd" (always).
    """
    if algo not in REQUIRED_FIELDS:
        raise ConfigError(f"unknown detector algo {algo!r}; allowed: {list(ALGOS)}")
    if hvp_impl not in HVP_IMPLS:
        raise ConfigError(f"unknown hvp_impl {hvp_impl!r}; allowed: {list(HVP_IMPLS)}")
    if method not in METHODS:
        raise ConfigError(f"unknown detector method {method!r}; allowed: {list(METHODS)}")
    if not 0.0 < clip < 1.0:
        raise ConfigError(f"invalid value for clip: must be in (0, 1), got {clip!r}")
    if subset_size < 1 or lanczos_steps < 1:
        raise ConfigError("invalid value for subset_size / lanczos_steps: both must be integers >= 1")
    t0 = time.perf_counter()
    required = REQUIRED_FIELDS[algo]
    missing = [k for k in required if k not in samples]
    if missing:
        raise ConfigError(f"detector samples lack {missing}; required for {algo}: {list(required)}")
    n = len(samples["obs"])
    if any(len(samples[k]) != n for k in required):
        raise ConfigError(f"detector samples differ in length: {({k: len(samples[k]) for k in required})}")
    if n == 0:
        raise ConfigError("detector samples are empty: need at least one step")
    idx = np.arange(n) if full_batch else select_subset(n, subset_size, seed)
    obs, actions, surrogate = _surrogate(algo, samples, idx, normalize_advantages, clip)
    params = [p for p in policy.policy_parameters() if p.requires_grad]
    with torch.enable_grad():
        # The written-out products for a Gaussian MLP (the same H v, ~1.3x faster), else autograd's.
        written = gaussian_mlp_hvp(policy, obs, actions, surrogate) if hvp_impl == "auto" else None
        hvp, dim = written or make_hvp(surrogate_objective(policy, obs, actions, surrogate), params)
        given = {} if tol is None else {"tol": tol}
        if method == "lanczos":
            res = lanczos(hvp, dim, lanczos_steps, seed=seed, early_stop=early_stop, **given)
        elif method == "eigsh":
            res = eigsh_extremes(hvp, dim, ncv=max(lanczos_steps, 4), seed=seed, **given)
        elif method == "lobpcg":
            res = lobpcg_extremes(hvp, dim, seed=seed, **given)
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
