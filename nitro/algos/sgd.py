"""The minibatch SGD loop PPO and IMPACT share.

Epochs of shuffled minibatches of a fixed size (a remainder smaller than one
minibatch is skipped, as in RLlib and SB3), an optional global gradient-norm
clip, averages of the loss parts, and the gradient-noise scale B_simple from
the first epoch's minibatch gradients. The algorithm supplies only its loss
(`epoch_loss_from` turns its per-sample tensors and minibatch loss into the
gathered-once-per-epoch form `minibatch_sgd` takes).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import Executor, wait
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from nitro.clock import add_helper_excess
from nitro.policy.models import LOG_STD_MAX, LOG_STD_MIN

LOSS_PARTS = ("policy_loss", "value_loss", "entropy", "kl", "clip_frac")
LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))  # as torch.distributions.Normal.log_prob writes it
LossAndParts = tuple[torch.Tensor, dict[str, torch.Tensor]]
EpochLossFn = Callable[[torch.Tensor], Callable[[int, int], "LossAndParts | LossTerms"]]


@dataclass(frozen=True)
class LossTerms:
    """A minibatch loss as a sum of terms over disjoint parameters, each a closure -> (loss, parts): the
    gradient of the sum is each term's own, so `minibatch_sgd` runs each term's forward and backward apart,
    the first ones on `term_pool`'s threads beside the last (PPO: the critic's value loss beside the
    actor's terms). The loss it reports is the terms' sum; their parts are merged."""

    terms: tuple[Callable[[], LossAndParts], ...]


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


def dist_params(policy, obs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The parameters of policy.distribution(obs) as per-sample tensors: (loc, scale) for Box
    actions, (logits,) for Discrete; `policy_terms` takes them (indexed alike) as the old policy."""
    dist = policy.distribution(obs)
    if isinstance(dist, torch.distributions.Normal):
        return dist.loc, dist.scale
    return (dist.logits,)


def policy_terms(policy, x: torch.Tensor, actions: torch.Tensor, old: tuple[torch.Tensor, ...], kl_grad: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log-prob of actions, entropy, value, KL(old || current)) per sample from ONE actor and ONE critic
    forward on x, the observations already through policy.normalize (done once per update, not per
    minibatch). The same values as Policy.log_prob/entropy/value and kl_per_sample; for Box actions
    the Gaussian formulas are torch.distributions.Normal's, written out without building distribution
    objects (and their argument checks) per step. `old` is what `dist_params` returns, for these
    samples; kl_grad False computes the KL without a graph (`kl_term` with coefficient 0)."""
    logp, entropy, kl = actor_terms(policy, x, actions, old, kl_grad)
    return logp, entropy, policy.critic(x).squeeze(-1), kl


def actor_terms(policy, x: torch.Tensor, actions: torch.Tensor, old: tuple[torch.Tensor, ...], kl_grad: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`policy_terms` without the critic: (log-prob of actions, entropy, KL(old || current)) per sample."""
    out = policy.actor(x)
    if policy.spec.action_kind == "box":
        scale = _scale(policy)
        log_scale = scale.log()
        logp = (-((actions - out) ** 2) / (2 * scale**2) - log_scale - LOG_SQRT_2PI).sum(-1)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_scale).sum(-1).expand(out.shape[0])
        dist = None
    else:
        dist = torch.distributions.Categorical(logits=out)
        logp, entropy = dist.log_prob(actions), dist.entropy()
    with torch.set_grad_enabled(kl_grad and torch.is_grad_enabled()):
        kl = _kl(policy, out, old, dist)
    return logp, entropy, kl


def policy_kl(policy, x: torch.Tensor, old: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """KL(old || current) per sample from one actor forward on normalised x (as `policy_terms`)."""
    return _kl(policy, policy.actor(x), old, None)


def _scale(policy) -> torch.Tensor:
    return policy.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp()  # (action_dim,), broadcast over samples


def _kl(policy, out: torch.Tensor, old: tuple[torch.Tensor, ...], dist) -> torch.Tensor:
    if policy.spec.action_kind == "box":  # torch.distributions' KL of two Normals, summed over dimensions
        old_loc, old_scale = old
        scale = _scale(policy)
        var_ratio = (old_scale / scale).pow(2)
        t1 = ((old_loc - out) / scale).pow(2)
        return (0.5 * (var_ratio + t1 - 1 - var_ratio.log())).sum(-1)
    dist = torch.distributions.Categorical(logits=out) if dist is None else dist
    return torch.distributions.kl_divergence(torch.distributions.Categorical(logits=old[0]), dist)


def adam(params, lr: float, eps: float) -> torch.optim.Adam:
    """Adam as every learner here uses it: the fused kernel (one pass over all parameters per step,
    ~10% of a PPO update on CPU for 2x256 MLPs; the same algorithm as the per-tensor loop)."""
    return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)


def preload() -> None:
    """Build and step a throwaway `adam`: torch's first optimizer imports torch._dynamo (~0.8 s on this
    machine), which the learner service does at start, before it answers, rather than in its first job."""
    p = torch.zeros(1, requires_grad=True)
    p.grad = torch.zeros(1)
    adam([p], lr=1e-3, eps=1e-8).step()


def minibatch_length(n: int, minibatch_size: int) -> int:
    """Samples per minibatch step of `minibatch_sgd`: minibatch_size <= 0 means the whole batch."""
    return n if minibatch_size <= 0 else min(minibatch_size, n)


def epoch_loss_from(per_sample: dict[str, torch.Tensor | tuple[torch.Tensor, ...]],
                    minibatch_loss: Callable[[SimpleNamespace], LossAndParts],
                    per_epoch: Callable[[dict], dict] | None = None) -> EpochLossFn:
    """The `epoch_loss_fn` for `minibatch_sgd` from named per-sample tensors and a minibatch loss.

    Each epoch gathers every field once in that epoch's permuted order (one index_select per tensor,
    not one per minibatch); step(a, b) then calls minibatch_loss(mb), mb.<name> being the contiguous
    slice [a:b] of each field, i.e. the samples perm[a:b]. A tuple of tensors (e.g. `dist_params`)
    is one field and stays a tuple. Fields go by name, not position, so two of one shape (log-probs,
    values) cannot be swapped unnoticed. `per_epoch`, if given, maps the gathered fields once per epoch
    (e.g. every minibatch's advantages standardised in one pass instead of one per step).
    """
    def each(field, f):
        return tuple(f(t) for t in field) if isinstance(field, tuple) else f(field)

    def epoch_loss_fn(perm: torch.Tensor):
        gathered = {k: each(v, lambda t: t.index_select(0, perm)) for k, v in per_sample.items()}
        if per_epoch is not None:
            gathered = per_epoch(gathered)

        def step(a: int, b: int) -> LossAndParts:
            return minibatch_loss(SimpleNamespace(**{k: each(v, lambda t: t[a:b]) for k, v in gathered.items()}))
        return step
    return epoch_loss_fn


def minibatch_sgd(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, generator: torch.Generator,
                  n: int, *, epochs: int, minibatch_size: int, max_grad_norm: float, device: torch.device,
                  loss_fn: Callable[[torch.Tensor], LossAndParts] | None = None,
                  estimate_noise: bool = True, epoch_loss_fn: EpochLossFn | None = None,
                  term_pool: Executor | None = None) -> SGDResult:
    """Run `epochs` passes of minibatch steps over n samples; loss_fn(idx) -> (loss, parts).

    Instead of loss_fn, epoch_loss_fn(perm) may be given: it is called once per epoch with that
    epoch's permutation and returns step(start, stop) -> (loss, parts) for the samples
    perm[start:stop], so the algorithm gathers its data in permuted order once per epoch and
    slices it per step (the same minibatches); `epoch_loss_from` builds it. The per-step sums
    (loss parts, gradient norms, the noise-scale terms) stay on the device until the end: no host
    sync per step. A step may return `LossTerms` instead of (loss, parts); `term_pool` (None: the
    calling thread) then runs all but its last term.
    """
    if (loss_fn is None) == (epoch_loss_fn is None):
        raise ValueError("pass exactly one of loss_fn and epoch_loss_fn")
    mb = minibatch_length(n, minibatch_size)
    keys: list[str] = []
    sums: torch.Tensor | None = None  # float64 sums of [*parts, grad_norm, loss] over the steps
    steps = 0
    small_sq: list[torch.Tensor] = []
    grad_sum: list[torch.Tensor] | None = None
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=generator).to(device)
        step = epoch_loss_fn(perm) if epoch_loss_fn is not None else None
        for start in range(0, n - mb + 1, mb):
            out = step(start, start + mb) if step is not None else loss_fn(perm[start:start + mb])
            for group in optimizer.param_groups:  # zero_grad(set_to_none=True) without its per-call overhead
                for p in group["params"]:
                    p.grad = None
            if isinstance(out, LossTerms):
                loss, parts = _backward_terms(out.terms, term_pool)
            else:
                loss, parts = out
                loss.backward()
            grads = [p.grad for p in params if p.grad is not None]
            noise_step = estimate_noise and epoch == 0 and n > mb
            if noise_step:  # the first epoch's gradient sum, before any clipping
                if grad_sum is None:
                    grad_sum = [g.detach().clone() for g in grads]
                else:
                    torch._foreach_add_(grad_sum, grads)
            gn = _clip(params, grads, max_grad_norm)  # the norm before clipping
            if noise_step:
                small_sq.append(gn.detach().square())  # |g|^2 of this minibatch's unclipped gradient
            optimizer.step()
            if sums is None:
                keys = list(parts)
            row = torch.stack([*(parts[k].detach() for k in keys), gn.detach(), loss.detach()]).double()
            sums = row if sums is None else sums.add_(row)
            steps += 1
    totals = dict.fromkeys((*LOSS_PARTS, "grad_norm", "loss"), 0.0)
    if sums is not None:
        totals.update(zip((*keys, "grad_norm", "loss"), sums.tolist()))
    means = {k: v / max(steps, 1) for k, v in totals.items()}
    big_sq = None
    if len(small_sq) >= 2 and grad_sum is not None:
        big_sq = float(torch.stack(torch._foreach_norm(grad_sum)).double().square().sum() / len(small_sq) ** 2)
    return SGDResult(means, mb, steps, _noise_scale(torch.stack(small_sq).double().tolist() if small_sq else [],
                                                    big_sq, mb))


def _backward(term: Callable[[], LossAndParts]) -> tuple[torch.Tensor, dict[str, torch.Tensor], float]:
    """A term's forward and backward: (its loss, detached; its parts; the CPU seconds of this thread)."""
    c0 = time.thread_time()
    loss, parts = term()
    loss.backward()
    return loss.detach(), parts, time.thread_time() - c0


def _backward_terms(terms, pool: Executor | None) -> LossAndParts:
    """Each term's forward and backward (all but the last on `pool`); the sum of their losses, their parts.
    Where a pool term took longer than the calling thread's, the difference is on the critical path."""
    pending = [pool.submit(_backward, t) for t in terms[:-1]] if pool is not None else []
    try:
        done = [_backward(t) for t in (terms if pool is None else terms[-1:])]
    finally:
        wait(pending)  # no backward may still run once this step is over, even a failed one
    if pending:
        add_helper_excess(max(f.result()[2] for f in pending) - done[-1][2])
    done = [f.result() for f in pending] + done  # in the terms' order, whichever finished first
    loss = done[0][0]
    for other, *_ in done[1:]:
        loss = loss + other
    return loss, {k: v for _, parts, _ in done for k, v in parts.items()}


def _clip(params: list[torch.nn.Parameter], grads: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """The global gradient norm, and with max_norm > 0 the clip: clip_grad_norm_'s own computation
    (foreach norms, the norm of norms, grads * min(max_norm / (norm + 1e-6), 1)) done directly when all
    gradients share one device and dtype, which skips its grouping and wrappers (~half its time here)."""
    if not grads or any(g.device != grads[0].device or g.dtype != grads[0].dtype for g in grads):
        if max_norm > 0:
            return torch.nn.utils.clip_grad_norm_(params, max_norm)
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    if max_norm > 0:
        torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


def _noise_scale(small_sq: list[float], big_sq: float | None, mb: int) -> float:
    """McCandlish et al. 2018 (app. A) with the epoch's mean gradient as the big batch (big_sq = its
    squared norm); the parameters drift within the epoch, so this is an estimate for scaling, not an
    exact value."""
    if len(small_sq) < 2 or big_sq is None:
        return 0.0
    from nitro.scaling.noise import noise_scale_estimates

    est = noise_scale_estimates(small_sq, big_sq, mb, mb * len(small_sq)).b_simple
    return float(est) if est is not None else 0.0
