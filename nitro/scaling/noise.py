"""Gradient noise scale (McCandlish et al. 2018, appendix A) for the KungFu baseline.

With E|G_B|^2 = |G|^2 + tr(Sigma) / B, squared gradient norms measured at two
batch sizes give unbiased estimates of both terms:

    |G|^2     ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)
    B_simple  = tr(Sigma) / |G|^2

PPO gives both for free: B_small = the minibatch (mean of its per-minibatch
squared norms), B_big = the whole round's batch. The learner sends one
B_simple per round (nitro/algos/sgd.py; IMPACT the mean over the round's
updates) and the kungfu policy reads it as it comes: nothing smooths it across
rounds. Smoothing as the paper recommends (|G|^2 and tr(Sigma) averaged
separately, then divided) would need the learner to send both terms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from nitro.errors import ConfigError


@dataclass(frozen=True)
class NoiseEstimate:
    grad_sq: float  # estimate of |G|^2 (may come out <= 0 when the signal is buried in noise)
    trace_sigma: float  # estimate of tr(Sigma)

    @property
    def b_simple(self) -> float | None:
        """tr(Sigma) / |G|^2, or None when |G|^2 <= 0 or either term is not finite (undefined)."""
        if not (math.isfinite(self.grad_sq) and math.isfinite(self.trace_sigma)) or self.grad_sq <= 0:
            return None
        return max(self.trace_sigma, 0.0) / self.grad_sq


def noise_scale_estimates(small_sq_norms: Sequence[float], big_sq_norm: float, b_small: int,
                          b_big: int) -> NoiseEstimate:
    """Unbiased |G|^2 and tr(Sigma) from per-minibatch squared norms (size b_small) and one of size b_big."""
    if not 0 < b_small < b_big:
        raise ConfigError(f"invalid batch sizes: need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}")
    if len(small_sq_norms) == 0:
        raise ConfigError("invalid value for small_sq_norms: need at least one per-minibatch squared norm")
    small = math.fsum(float(x) for x in small_sq_norms) / len(small_sq_norms)
    big = float(big_sq_norm)
    grad_sq = (b_big * big - b_small * small) / (b_big - b_small)
    trace = (small - big) / (1.0 / b_small - 1.0 / b_big)
    return NoiseEstimate(grad_sq, trace)


def ema_terms(previous: tuple[float, float] | None, terms: tuple[float, float] | None,
              weight: float) -> tuple[float, float] | None:
    """Exponential moving average of the two terms (|G|^2, tr(Sigma)), each on its own, with `weight` on the
    newest: McCandlish et al. average the terms across steps and divide afterwards, since the ratio of two noisy
    estimates is biased and one round's |G|^2 estimate may come out <= 0. The first measured terms start it;
    None or a non-finite term (not measured) leaves it as it was."""
    if terms is None or not all(math.isfinite(x) for x in terms):
        return previous
    g2, tr = float(terms[0]), float(terms[1])
    if previous is None:
        return g2, tr
    return (1.0 - weight) * previous[0] + weight * g2, (1.0 - weight) * previous[1] + weight * tr


def b_simple_of(terms: tuple[float, float] | None) -> float | None:
    """tr(Sigma) / |G|^2 of averaged terms (NoiseEstimate.b_simple); None when unknown or |G|^2 <= 0."""
    return None if terms is None else NoiseEstimate(terms[0], terms[1]).b_simple


def cost_optimal_batch(b_noise: float, round_cost: float, sample_cost: float) -> float:
    """sqrt(B_noise * a / c): the batch that minimises the dollars to a given loss under McCandlish et al.'s
    model, where a step of batch B costs a + c * B and reaching the loss takes S_min * (1 + B_noise / B) steps:
    d/dB[(1 + B_noise / B)(a + c B)] = c - B_noise a / B^2 = 0."""
    for name, x in (("b_noise", b_noise), ("round_cost", round_cost), ("sample_cost", sample_cost)):
        if not math.isfinite(x) or x <= 0:
            raise ConfigError(f"invalid value for {name}: must be a finite number > 0, got {x!r}")
    return math.sqrt(b_noise * round_cost / sample_cost)


def adascale_gain(b_simple: float | None, base_batch: int, scale: float) -> float:
    """AdaScale's gain ratio (Johnson et al. 2020) for a batch `scale` times `base_batch`:
    r = (sigma^2 + mu^2) / (sigma^2 / S + mu^2), with sigma^2 / mu^2 = B_simple / base_batch (the variance of a
    base-batch gradient over the squared norm of the true one). r is in [1, S]: S when the gradient is all noise
    (the bigger batch is worth S steps), 1 when it is all signal. An unknown B_simple gives 1."""
    if not math.isfinite(scale) or scale < 1.0:
        raise ConfigError(f"invalid value for scale: must be a finite number >= 1, got {scale!r}")
    if base_batch < 1:
        raise ConfigError(f"invalid value for base_batch: must be >= 1, got {base_batch!r}")
    if b_simple is None or not math.isfinite(b_simple) or b_simple <= 0:
        return 1.0
    ratio = b_simple / base_batch  # sigma^2 / mu^2
    return (ratio + 1.0) / (ratio / scale + 1.0)


def adascale_update(samples: int, batch_size: int, minibatch_size: int,
                    b_simple: float | None) -> tuple[int, float]:
    """(minibatch size, learning-rate factor) of an update on `samples` when the preset was tuned for
    `batch_size` samples in minibatches of `minibatch_size` ("noise-adascale"): a round S = samples / batch_size
    times bigger keeps the same number of SGD steps per epoch with minibatches S times bigger, and multiplies the
    learning rate by AdaScale's gain for that S (adascale_gain, base = the preset's minibatch). A round no bigger
    than the preset's batch, or a full-batch preset (minibatch 0), keeps its minibatch."""
    if samples < 1 or batch_size < 1 or minibatch_size < 0:
        raise ConfigError(f"invalid update size: need samples >= 1, batch_size >= 1, minibatch_size >= 0, got "
                          f"{samples}, {batch_size}, {minibatch_size}")
    scale = max(1.0, samples / batch_size)
    if minibatch_size == 0:
        return 0, adascale_gain(b_simple, batch_size, scale)
    return max(1, int(math.floor(minibatch_size * scale + 0.5))), adascale_gain(b_simple, minibatch_size, scale)
