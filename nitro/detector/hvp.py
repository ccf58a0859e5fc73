"""The detector's objective and its Hessian-vector products (paper 5.1, 6.2).

The Hessian is that of the PPO surrogate *objective* L (the quantity PPO
maximises), not of the loss -L: negating it swaps and negates the extreme
eigenvalues, which would turn R = -lambda_max / lambda_min into 1 / R.

    L(theta) = mean_t min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t),
    r_t = exp(log pi_theta(a_t | s_t) - logp_behaviour_t)

For IMPACT (`impact_objective`) it is a weighted clipped surrogate whose ratio
divides by the sample's `logp_target`:

    L(theta) = mean_t w_t min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t),
    r_t = exp(log pi_theta(a_t | s_t) - logp_target_t),  w_t = is_weights_t

so the detector's sample subset carries logp_target and is_weights, as the
update used them, besides obs, actions and the advantages. From
IMPACTLearner.last_data that is IMPACT's own surrogate (nitro.algos.impact):
logp_target = log max(pi_target, mu / is_ratio_clip) (`reference_logp`) and
w_t = 1, since the V-trace advantages already carry the importance weight
min(pg_rho_bar, pi_target / mu). Neither objective includes the KL penalty,
value or entropy terms: the detector reads the curvature of the surrogate alone.

The ratio r == 1 needs no special case: clamp is the identity (gradient 1) on
the closed range [1 - eps, 1 + eps], so near r == 1 both branches of the min
are r A and L is locally the plain importance-weighted policy-gradient
objective, whose Hessian is meaningful. Only samples already clipped on the
pessimistic side contribute no curvature, which is what the PPO update sees.
The detector runs on the post-update policy with the round's behaviour
log-probabilities, so ratios generally differ from 1 anyway.

Products use double backward: the first-order graph is built once by
`make_hvp` and every product H v = d(g . v)/d theta reuses it. For the Gaussian
MLP policies detect() uses the same products written out instead
(nitro.detector.mlp_hvp, ~1.3x faster), this module for everything else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from nitro.contracts import DETECTOR_SUBSET


def ppo_surrogate(logp_new: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, clip: float) -> torch.Tensor:
    """mean(min(r A, clip(r, 1 - clip, 1 + clip) A)) with r = exp(logp_new - logp_old); maximised by PPO."""
    ratio = torch.exp(logp_new - logp_old)
    return torch.minimum(ratio * adv, ratio.clamp(1.0 - clip, 1.0 + clip) * adv).mean()


def surrogate_objective(policy, obs: torch.Tensor, actions: torch.Tensor,
                        surrogate: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """A closure evaluating `surrogate` (of the log-probabilities) for `policy` (a nitro.policy.models.Policy)
    on fixed samples: what make_hvp differentiates."""
    return lambda: surrogate(policy.log_prob(policy.distribution(obs), actions))


def ppo_surrogate_of(logp_old: torch.Tensor, adv: torch.Tensor, clip: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """The PPO surrogate on fixed samples as a function of the policy's log-probabilities of them."""
    return lambda logp: ppo_surrogate(logp, logp_old, adv, clip)


def impact_surrogate_of(logp_target: torch.Tensor, is_weights: torch.Tensor, adv: torch.Tensor,
                        clip: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """IMPACT's surrogate (nitro.algos.impact.impact_surrogate) on fixed samples, of the log-probabilities."""
    from nitro.algos.impact import impact_surrogate

    return lambda logp: impact_surrogate(logp, logp_target, is_weights, adv, clip)


def ppo_objective(policy, obs: torch.Tensor, actions: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor,
                  clip: float) -> Callable[[], torch.Tensor]:
    """The PPO surrogate of `policy` on fixed samples, as a closure."""
    return surrogate_objective(policy, obs, actions, ppo_surrogate_of(logp_old, adv, clip))


def impact_objective(policy, obs: torch.Tensor, actions: torch.Tensor, logp_target: torch.Tensor,
                     is_weights: torch.Tensor, adv: torch.Tensor, clip: float) -> Callable[[], torch.Tensor]:
    """IMPACT's surrogate of `policy` on fixed samples, as a closure."""
    return surrogate_objective(policy, obs, actions, impact_surrogate_of(logp_target, is_weights, adv, clip))


def select_subset(n: int, size: int = DETECTOR_SUBSET, seed: int = 0) -> np.ndarray:
    """Sorted indices of a seeded uniform sample of `size` out of `n` rows (all rows if n <= size)."""
    if size < 1:
        raise ValueError(f"subset size must be >= 1, got {size}")
    if n <= size:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))


def _flat(tensors: Sequence[torch.Tensor | None], params: Sequence[torch.Tensor]) -> torch.Tensor:
    # A parameter the objective does not touch has zero derivative, not an error.
    return torch.cat([(t if t is not None else torch.zeros_like(p)).reshape(-1) for t, p in zip(tensors, params)])


def make_hvp(objective_fn: Callable[[], torch.Tensor], params: Sequence[torch.Tensor]
             ) -> tuple[Callable[[torch.Tensor], torch.Tensor], int]:
    """(hvp, dim): hvp(v) = H v for the Hessian of objective_fn() w.r.t. `params`, on flat vectors.

    v may have any floating dtype; it is cast to the parameters' dtype and the
    product comes back in that dtype. Nothing is accumulated in `.grad`.
    """
    params = list(params)
    dim = sum(p.numel() for p in params)
    value = objective_fn()
    if not value.requires_grad:  # the objective does not depend on the parameters at all
        grads = [None] * len(params)
    else:
        grads = torch.autograd.grad(value, params, create_graph=True, allow_unused=True)
    # Gradients that do not depend on theta (objective linear in that tensor) add no curvature.
    live = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
    sizes = [p.numel() for p in params]
    dtype = params[0].dtype

    def hvp(v: torch.Tensor) -> torch.Tensor:
        if v.shape != (dim,):
            raise ValueError(f"hvp expects a vector of shape ({dim},), got {tuple(v.shape)}")
        if not live:  # the objective is linear (or constant) in every parameter
            return torch.zeros(dim, dtype=dtype)
        chunks = v.to(dtype).split(sizes)
        dot = sum((grads[i] * chunks[i].view_as(params[i])).sum() for i in live)
        hv = torch.autograd.grad(dot, params, retain_graph=True, allow_unused=True)
        return _flat(hv, params).detach()

    return hvp, dim


def explicit_hessian(hvp: Callable[[torch.Tensor], torch.Tensor], dim: int, *, max_dim: int = 4096,
                     dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The dense Hessian, row by row (H e_i), symmetrised; for small nets and the ablation only."""
    if dim > max_dim:
        raise ValueError(f"explicit Hessian of dimension {dim} exceeds max_dim={max_dim} "
                         f"({dim * dim * 8 / 2**30:.1f} GiB in float64)")
    h = torch.empty(dim, dim, dtype=dtype)
    e = torch.zeros(dim, dtype=dtype)
    for i in range(dim):
        e[i] = 1.0
        h[i] = hvp(e).to(dtype)
        e[i] = 0.0
    return 0.5 * (h + h.T)  # removes round-off asymmetry; exact H is symmetric
