"""Convexity ratio R (paper Eq. 2) and the boosting score S_k (paper 5.3), guarded against NaN and inf.

R = -lambda_max / lambda_min of the surrogate objective's Hessian. For the
usual indefinite Hessian (lambda_min < 0 < lambda_max) R > 0, and a higher R
means more upward (convex) curvature relative to downward. Guard: the
denominator is taken as min(lambda_min, -eps * scale) with scale =
max(|lambda_max|, |lambda_min|), i.e. negative curvature below eps of the
spectral scale counts as none. That keeps R continuous and monotone across
lambda_min = 0 (no jump from +inf to -inf) and bounds it:

    R in [-1, 1/eps]   (eps = 1e-2: R_CAP = 100)

-1 is reached by a negative definite Hessian with equal extremes; 1/eps by a
positive semi-definite one ("fully convex"). Inputs out of order are sorted;
infinities are clamped to +-1e300 first; a zero Hessian gives 0.0; a NaN
input gives R_CAP (a finite number for reports and metrics, not a ratio to rank).

A failed detection (non-finite eigenvalues, DetectionResult.finite False) is
stored among a job's ratios as FAILED_RATIO and never enters a score window
(window_ratios, the one place that rule lives): the round scores 0 and later
rounds score as if it had stored nothing (round_score).

S_k = (R_max - R_k) / (R_max - R_min) * d^k over the last n ratios (newest
last, k = round index from 0): a low R relative to the recent past means a
boostable round, and d^k spends more early. With fewer than two values, or a
window whose spread is below 1e-12 of its scale, there is no evidence that
this round stands out, so the score is 0.0 (the scaler then plans I_min, the
cheap choice). The result is always a finite number in [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nitro.contracts import SCORE_DECAY, SCORE_WINDOW
from nitro.errors import ConfigError

DEFAULT_EPS = 1e-2
FLAT_SCORE = 0.0
_HUGE = 1e300
_FLAT_REL = 1e-12
FAILED_RATIO = math.nan
"""What a failed detection is stored as among a job's ratios: it keeps the round's place (a retried Score
overwrites it) but is no ratio, so no window holds it (window_ratios)."""


def ratio_bounds(eps: float = DEFAULT_EPS) -> tuple[float, float]:
    """The closed range convexity_ratio can return for this eps."""
    return -1.0, 1.0 / eps


def convexity_ratio(lambda_max: float, lambda_min: float, eps: float = DEFAULT_EPS) -> float:
    """R = -lambda_max / lambda_min with the guard in the module docstring; always finite."""
    if not 0.0 < eps < 1.0:
        raise ConfigError(f"invalid value for eps: must be in (0, 1), got {eps!r}")
    lo_bound, cap = ratio_bounds(eps)
    a, b = float(lambda_max), float(lambda_min)
    if math.isnan(a) or math.isnan(b):
        return cap
    hi, lo = (min(max(x, -_HUGE), _HUGE) for x in (max(a, b), min(a, b)))
    scale = max(abs(hi), abs(lo))
    if scale == 0.0:
        return 0.0
    r = -hi / min(lo, -eps * scale)
    return min(max(r, lo_bound), cap)


def boosting_score(window: Sequence[float], round_index: int, decay: float = SCORE_DECAY,
                   n: int = SCORE_WINDOW) -> float:
    """S_k over the last n finite entries of `window` (R_k = the newest); see the module docstring."""
    if round_index < 0:
        raise ConfigError(f"invalid value for round_index: must be an integer >= 0, got {round_index!r}")
    if not 0.0 < decay <= 1.0:
        raise ConfigError(f"invalid value for decay: must be in (0, 1], got {decay!r}")
    if n < 1:
        raise ConfigError(f"invalid value for n: must be an integer >= 1, got {n!r}")
    values = [float(x) for x in window if math.isfinite(float(x))][-n:]
    if len(values) < 2:
        return FLAT_SCORE
    r_max, r_min, r_k = max(values), min(values), values[-1]
    spread = r_max - r_min
    if spread <= _FLAT_REL * max(abs(r_max), abs(r_min)) or spread == 0.0:
        return FLAT_SCORE
    s = (r_max - r_k) / spread * decay ** round_index
    return min(max(s, 0.0), 1.0)


@dataclass(frozen=True)
class ScoreWindow:
    """The last `size` convexity ratios, oldest first; immutable, stored as a list of floats."""

    values: tuple[float, ...] = ()
    size: int = SCORE_WINDOW

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ConfigError(f"invalid value for size: must be an integer >= 1, got {self.size!r}")
        vals = tuple(float(v) for v in self.values)
        if not all(math.isfinite(v) for v in vals):
            raise ValueError(f"a score window holds finite ratios only, got {list(vals)}")
        object.__setattr__(self, "values", vals[-self.size:])

    def append(self, ratio: float) -> "ScoreWindow":
        """A new window with `ratio` as the newest entry (the oldest falls out when full)."""
        return ScoreWindow(self.values + (float(ratio),), self.size)

    def score(self, round_index: int, decay: float = SCORE_DECAY) -> float:
        return boosting_score(self.values, round_index, decay, self.size)

    def to_list(self) -> list[float]:
        return list(self.values)

    @classmethod
    def from_list(cls, values: Sequence[float], size: int = SCORE_WINDOW) -> "ScoreWindow":
        return cls(tuple(values), size)


def window_ratios(stored: Iterable[float], size: int = SCORE_WINDOW) -> list[float]:
    """The ratios a score window holds from a job's stored entries (oldest first): the newest `size` of them that
    are not failed detections (FAILED_RATIO, or any other non-finite entry)."""
    if size < 1:
        raise ConfigError(f"invalid value for size: must be an integer >= 1, got {size!r}")
    return [r for r in (float(x) for x in stored) if math.isfinite(r)][-size:]


def round_score(stored: Sequence[float], round_index: int, decay: float = SCORE_DECAY,
                size: int = SCORE_WINDOW) -> tuple[ScoreWindow, float]:
    """Round `round_index`'s window and score from the job's stored entries of rounds up to it, oldest first and
    its own last. The window holds the newest `size` valid ratios (window_ratios). A round whose own detection
    failed scores FLAT_SCORE, and as no window holds its entry, every later round scores as if it had stored none."""
    window = ScoreWindow.from_list(window_ratios(stored, size), size)
    if not window_ratios(stored[-1:], 1):  # nothing stored for this round, or its detection failed
        return window, FLAT_SCORE
    return window, window.score(round_index, decay)
