"""nitro.stats: the IQM, stratified-bootstrap intervals and the probability of improvement, from their
definitions, and cross-checked against rliable (a dev dependency; nitro's own code never imports it)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from nitro import stats


def test_iqm_is_the_mean_of_the_middle_half():
    assert stats.iqm([1, 2, 3, 4, 100, -50, 5, 6]) == pytest.approx(np.mean([2, 3, 4, 5]))  # 8 values: drop 2+2
    assert stats.iqm([3.0, 1.0, 2.0]) == pytest.approx(2.0)  # fewer than 4: nothing dropped
    assert stats.iqm([[1, 10], [2, 20], [3, 30], [4, 40]]) == pytest.approx(np.mean([3, 4, 10, 20]))  # pooled
    assert math.isnan(stats.iqm([]))


def test_one_run_has_a_zero_width_interval_and_no_runs_have_none():
    one = stats.iqm_interval([7.0], reps=50)
    assert (one.point, one.low, one.high) == (7.0, 7.0, 7.0)
    assert all(math.isnan(v) for v in (stats.iqm_interval([]).point, stats.iqm_interval([]).low))


def test_interval_brackets_the_point_and_narrows_with_more_runs():
    rng = np.random.default_rng(1)
    small = stats.iqm_interval(rng.normal(10, 2, 5), seed=3)
    big = stats.iqm_interval(rng.normal(10, 2, 200), seed=3)
    assert small.low <= small.point <= small.high and big.low <= big.point <= big.high
    assert big.high - big.low < (small.high - small.low) / 2


def test_the_bootstrap_is_stratified_by_task():
    # Task 0's runs all score 0, task 1's all 100. Resampled within each task, every resample pools two zeros and
    # two hundreds: the interval has no width. Resampled across tasks it would range from 0 to 100.
    scores = np.array([[0.0, 100.0], [0.0, 100.0]])
    ci = stats.iqm_interval(scores, reps=500)
    assert (ci.point, ci.low, ci.high) == (50.0, 50.0, 50.0)
    p = stats.probability_of_improvement(scores, scores[:, ::-1], reps=500)  # task 0: 0 vs 100, task 1: 100 vs 0
    assert (p.point, p.low, p.high) == (0.5, 0.5, 0.5)


def test_probability_of_improvement_counts_ties_half():
    assert stats.probability_of_improvement([2, 3], [1, 2], reps=10).point == pytest.approx((1 + 1 + 1 + 0.5) / 4)
    assert stats.probability_of_improvement([5, 5, 5], [1, 2], reps=10).point == 1.0
    same = stats.probability_of_improvement([1, 2, 3], [1, 2, 3], reps=10).point
    assert same == pytest.approx(0.5)
    with pytest.raises(ValueError, match="same tasks"):
        stats.probability_of_improvement(np.ones((3, 2)), np.ones((3, 1)))


def test_bad_arguments_name_what_is_allowed():
    with pytest.raises(ValueError, match="reps must be an integer >= 1"):
        stats.iqm_interval([1, 2], reps=0)
    with pytest.raises(ValueError, match=r"confidence must lie in \(0, 1\)"):
        stats.iqm_interval([1, 2], confidence=95)
    with pytest.raises(ValueError, match="1-D .* or 2-D"):
        stats.iqm_interval(np.ones((2, 2, 2)))


def test_same_seed_same_interval():
    x = np.arange(10.0) ** 2
    assert stats.iqm_interval(x, seed=4) == stats.iqm_interval(x, seed=4)
    assert stats.iqm_interval(x, seed=4) != stats.iqm_interval(x, seed=5)


def test_generic_interval_matches_the_vectorised_iqm():
    x = np.random.default_rng(2).normal(size=(9, 3))
    generic = stats.interval(x, stats.iqm, reps=400, seed=7)
    fast = stats.iqm_interval(x, reps=400, seed=7)
    assert (generic.point, generic.low, generic.high) == pytest.approx((fast.point, fast.low, fast.high))


def test_iqm_curve_on_the_range_every_run_covers():
    a = ([0, 1, 2, 3], [0.0, 10.0, 20.0, 30.0])
    b = ([1, 2, 3, 4, 5], [10.0, 20.0, 30.0, 40.0, 50.0])
    curve = stats.iqm_curve([a, b], points=3, reps=100)
    assert curve["x"] == [1.0, 2.0, 3.0]
    assert curve["iqm"] == pytest.approx([10.0, 20.0, 30.0])
    assert curve["low"] == pytest.approx([10.0, 20.0, 30.0]) and curve["high"] == pytest.approx([10.0, 20.0, 30.0])
    assert stats.iqm_curve([([0, 1], [0, 1]), ([2, 3], [0, 1])]) is None  # no common range
    assert stats.iqm_curve([([0], [5.0]), ([0], [7.0])], reps=10)["iqm"] == [6.0]  # one point each, the same x


# --- cross-check against rliable (Agarwal et al.'s own library) -------------------------------------------------

rliable = pytest.importorskip("rliable")


def _rliable_interval(scores, func, reps):
    from rliable import library

    state = np.random.get_state()
    np.random.seed(0)  # rliable resamples with numpy's global RNG
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            points, cis = library.get_interval_estimates({"k": scores}, func, reps=reps,
                                                         random_state=np.random.RandomState(0))
    finally:
        np.random.set_state(state)
    return float(np.squeeze(points["k"])), float(np.squeeze(cis["k"][0])), float(np.squeeze(cis["k"][1]))


@pytest.mark.slow  # rliable's bootstrap takes seconds
@pytest.mark.parametrize("shape", [(10, 1), (7, 3)])
def test_iqm_and_its_interval_agree_with_rliable(shape):
    from rliable import metrics

    scores = np.random.default_rng(11).gamma(2.0, 50.0, size=shape)
    point, low, high = _rliable_interval(scores, lambda s: np.array([metrics.aggregate_iqm(s)]), reps=5000)
    ours = stats.iqm_interval(scores, reps=5000, seed=1)
    assert ours.point == pytest.approx(point, rel=1e-12)
    width = high - low  # two independent 5,000-resample estimates of the same percentiles
    assert ours.low == pytest.approx(low, abs=0.1 * width) and ours.high == pytest.approx(high, abs=0.1 * width)


@pytest.mark.slow
def test_probability_of_improvement_agrees_with_rliable():
    from rliable import metrics

    rng = np.random.default_rng(5)
    x, y = rng.normal(1.0, 1.0, size=(8, 2)), rng.normal(0.0, 1.0, size=(6, 2))
    point, low, high = _rliable_interval((x, y), metrics.probability_of_improvement, reps=1500)
    ours = stats.probability_of_improvement(x, y, reps=1500, seed=2)
    assert ours.point == pytest.approx(point, rel=1e-12)
    assert ours.low == pytest.approx(low, abs=0.05) and ours.high == pytest.approx(high, abs=0.05)
