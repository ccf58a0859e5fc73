"""The minibatch SGD loop PPO and IMPACT share.

Epochs of shuffled minibatches of a fixed size (a remainder smaller than one
minibatch is skipped, as in RLlib and SB3), an optional global gradient-norm
clip, averages of the loss parts, and the gradient-noise scale B_simple from
the first epoch's minibatch gradients. The algorithm supplies only its loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

LOSS_PARTS = ("policy_loss", "value_loss", "entropy", "kl", "clip_frac")


@dataclass(frozen=True)
class SGDResult:
    means: dict[str, float]   # per-step averages of LOSS_PARTS, "grad_norm" and "loss"
    minibatch_size: int
    steps: int
    noise_scale: float        # B_simple; 0.0 when undefined (fewer than two first-epoch minibatches)


def kl_per_sample(old_dist, new_dist, idx) -> torch.Tensor:
    """KL(old[idx] || new) per sample, summed over action dimensions for Box actions."""
    if isinstance(old_dist, torch.distributions.Normal):
        old = torch.distributions.Normal(old_dist.loc[idx], old_dist.scale[idx])
        return torch.distributions.kl_divergence(old, new_dist).sum(-1)
    old = torch.distributions.Categorical(logits=old_dist.logits[idx])
    return torch.distributions.kl_divergence(old, new_dist)


def kl_term(old_dist, new_dist, idx, coeff: float) -> torch.Tensor:
    """kl_per_sample for a loss's KL penalty; with coeff 0 it is only reported, so no graph is built
    (its backward would cost a tenth of the update for a term multiplied by zero)."""
    if coeff > 0:
        return kl_per_sample(old_dist, new_dist, idx)
    with torch.no_grad():
        return kl_per_sample(old_dist, new_dist, idx)


def adam(params, lr: float, eps: float) -> torch.optim.Adam:
    """Adam as every learner here uses it: the fused kernel (one pass over all parameters per step,
    ~10% of a PPO update on CPU for 2x256 MLPs; the same algorithm as the per-tensor loop)."""
    return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)


def minibatch_sgd(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, generator: torch.Generator,
                  n: int, *, epochs: int, minibatch_size: int, max_grad_norm: float, device: torch.device,
                  loss_fn: Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]],
                  estimate_noise: bool = True) -> SGDResult:
    """Run `epochs` passes of minibatch steps over n samples; loss_fn(idx) -> (loss, parts)."""
    mb = n if minibatch_size <= 0 else min(minibatch_size, n)
    sums = dict.fromkeys((*LOSS_PARTS, "grad_norm", "loss"), 0.0)
    steps = 0
    small_sq: list[float] = []
    grad_sum: torch.Tensor | None = None
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=generator).to(device)
        for start in range(0, n - mb + 1, mb):
            loss, parts = loss_fn(perm[start:start + mb])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if estimate_noise and epoch == 0 and n > mb:
                flat = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])
                small_sq.append(float(flat.pow(2).sum()))
                grad_sum = flat.clone() if grad_sum is None else grad_sum.add_(flat)
            if max_grad_norm > 0:
                gn = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            else:
                gn = torch.sqrt(sum(p.grad.pow(2).sum() for p in params if p.grad is not None))
            optimizer.step()
            for k, v in parts.items():
                sums[k] += float(v.detach())
            sums["grad_norm"] += float(gn)
            sums["loss"] += float(loss.detach())
            steps += 1
    means = {k: v / max(steps, 1) for k, v in sums.items()}
    return SGDResult(means, mb, steps, _noise_scale(small_sq, grad_sum, mb))


def _noise_scale(small_sq: list[float], grad_sum: torch.Tensor | None, mb: int) -> float:
    """McCandlish et al. 2018 (app. A) with the epoch's mean gradient as the big batch; the
    parameters drift within the epoch, so this is an estimate for scaling, not an exact value."""
    if len(small_sq) < 2 or grad_sum is None:
        return 0.0
    from nitro.scaling.noise import noise_scale_estimates

    big = float((grad_sum / len(small_sq)).pow(2).sum())
    est = noise_scale_estimates(small_sq, big, mb, mb * len(small_sq)).b_simple
    return float(est) if est is not None else 0.0
