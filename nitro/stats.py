"""Aggregates over runs, as the deep-RL evaluation literature asks for them (Agarwal et al., "Deep RL at the
edge of the statistical precipice", NeurIPS 2021): the interquartile mean, percentile confidence intervals from
a stratified bootstrap, and the probability of improvement. `nitro train --seeds` and `nitro tune` summarise
runs with them.

Written from the definitions with numpy alone, so the core package has them without the dev-only rliable
(tests/test_stats.py checks the numbers against rliable). Scores are one value per run (1-D), or a runs x tasks
matrix (2-D; a task is an environment); a bootstrap is "stratified" in that runs are resampled with replacement
within each task, never across tasks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

BOOTSTRAP_REPS = 2000  # resamples per interval: the percentiles of a 95% interval move by ~1% of its width
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """A point estimate and the two ends of its percentile bootstrap interval (`confidence` of the mass)."""

    point: float
    low: float
    high: float
    confidence: float = CONFIDENCE
    reps: int = BOOTSTRAP_REPS

    def to_dict(self) -> dict:
        return asdict(self)


def _matrix(scores) -> np.ndarray:
    """Scores as a float runs x tasks matrix (a 1-D sequence is one task)."""
    arr = np.asarray(scores, dtype=float)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise ValueError(f"scores must be 1-D (runs) or 2-D (runs x tasks), got shape {arr.shape}")
    return arr


def _trimmed_rows(rows: np.ndarray) -> np.ndarray:
    """The interquartile mean of each row: sort, drop floor(n/4) values from each end, average the rest (the
    25%-trimmed mean; n < 4 drops nothing)."""
    n = rows.shape[-1]
    cut = int(0.25 * n)
    return np.sort(rows, axis=-1)[..., cut:n - cut].mean(axis=-1)


def iqm(scores) -> float:
    """Interquartile mean of every score (all runs of all tasks pooled): the mean of the middle 50%. nan when
    there is none."""
    arr = np.asarray(scores, dtype=float).reshape(-1)
    return float(_trimmed_rows(arr[None, :])[0]) if arr.size else math.nan


def _resample(arr: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    """reps x runs x tasks: each task's runs drawn with replacement from that task's own runs."""
    runs, tasks = arr.shape
    idx = rng.integers(0, runs, size=(reps, runs, tasks))
    return np.take_along_axis(np.broadcast_to(arr, (reps, runs, tasks)), idx, axis=1)


def _percentiles(values: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def _check(reps: int, confidence: float) -> None:
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps must be an integer >= 1, got {reps!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")


def iqm_interval(scores, reps: int = BOOTSTRAP_REPS, confidence: float = CONFIDENCE, seed: int = 0) -> Interval:
    """The IQM of `scores` with a percentile interval from a stratified bootstrap over runs. One run (per task)
    gives an interval of zero width, which is no interval: callers say so. No scores: nan throughout."""
    _check(reps, confidence)
    arr = _matrix(scores)
    if not arr.size:
        return Interval(math.nan, math.nan, math.nan, confidence, reps)
    boots = _trimmed_rows(_resample(arr, reps, np.random.default_rng(seed)).reshape(reps, -1))
    return Interval(iqm(arr), *_percentiles(boots, confidence), confidence, reps)


def _improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) (ties count half) per leading index, averaged over tasks: x is ... x n x tasks, y ... x m x tasks."""
    diff = x[..., :, None, :] - y[..., None, :, :]  # ... x n x m x tasks
    wins = (diff > 0).mean(axis=(-3, -2)) + 0.5 * (diff == 0).mean(axis=(-3, -2))
    return wins.mean(axis=-1)


def probability_of_improvement(x, y, reps: int = BOOTSTRAP_REPS, confidence: float = CONFIDENCE,
                               seed: int = 0) -> Interval:
    """P(X > Y): the chance that a random run of X beats a random run of Y on the same task (ties count half),
    averaged over tasks, with a percentile interval from a stratified bootstrap that resamples X's and Y's
    runs independently. x and y have the same tasks (columns); their run counts may differ."""
    _check(reps, confidence)
    xs, ys = _matrix(x), _matrix(y)
    if not xs.size or not ys.size:
        return Interval(math.nan, math.nan, math.nan, confidence, reps)
    if xs.shape[1] != ys.shape[1]:
        raise ValueError(f"x and y must have the same tasks, got {xs.shape[1]} and {ys.shape[1]}")
    rng = np.random.default_rng(seed)
    boots = _improvement(_resample(xs, reps, rng), _resample(ys, reps, rng))
    return Interval(float(_improvement(xs, ys)), *_percentiles(boots, confidence), confidence, reps)


def interval(scores, statistic: Callable[[np.ndarray], float], reps: int = BOOTSTRAP_REPS,
             confidence: float = CONFIDENCE, seed: int = 0) -> Interval:
    """Any statistic of a runs x tasks matrix with its stratified-bootstrap percentile interval (a loop over
    resamples: for statistics iqm_interval does not vectorise)."""
    _check(reps, confidence)
    arr = _matrix(scores)
    if not arr.size:
        return Interval(math.nan, math.nan, math.nan, confidence, reps)
    resampled = _resample(arr, reps, np.random.default_rng(seed))
    boots = np.array([statistic(m) for m in resampled])
    return Interval(float(statistic(arr)), *_percentiles(boots, confidence), confidence, reps)


def iqm_curve(curves: Sequence[tuple[Sequence[float], Sequence[float]]], points: int = 50,
              reps: int = BOOTSTRAP_REPS // 4, confidence: float = CONFIDENCE, seed: int = 0) -> dict | None:
    """The IQM across runs of curves (x, y), each interpolated linearly onto `points` x values spanning the
    range every run covers (one point when a run has one x inside every other's range), with a bootstrap band (a
    resample draws whole runs). {"x", "iqm", "low", "high"} as lists, or None when the runs share no x."""
    _check(reps, confidence)
    runs = [(np.asarray(x, dtype=float), np.asarray(y, dtype=float)) for x, y in curves if len(x)]
    if not runs:
        return None
    lo, hi = max(float(x.min()) for x, _ in runs), min(float(x.max()) for x, _ in runs)
    if hi < lo:
        return None
    grid = np.linspace(lo, hi, points if hi > lo else 1)
    mat = np.stack([np.interp(grid, x[np.argsort(x, kind="stable")], y[np.argsort(x, kind="stable")])
                    for x, y in runs])  # runs x points
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(runs), size=(reps, len(runs)))
    boots = _trimmed_rows(np.swapaxes(mat[idx], 1, 2))  # reps x points
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(boots, [tail, 100 - tail], axis=0)
    return {"x": grid.tolist(), "iqm": _trimmed_rows(mat.T).tolist(), "low": low.tolist(), "high": high.tolist()}
