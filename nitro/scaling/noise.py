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
