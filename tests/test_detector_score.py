"""Table tests of the convexity ratio guard and the boosting score: finite, in range, per the paper."""

from __future__ import annotations

import json
import math

import pytest

from nitro.detector.score import (
    DEFAULT_EPS,
    FAILED_RATIO,
    FLAT_SCORE,
    ScoreWindow,
    boosting_score,
    convexity_ratio,
    ratio_bounds,
    round_score,
    window_ratios,
)
from nitro.errors import ConfigError

INF, NAN = math.inf, math.nan
CAP = 1.0 / DEFAULT_EPS

RATIO_TABLE = [
    # (lambda_max, lambda_min, expected R)                      case
    (2.0, -1.0, 2.0),  # usual indefinite Hessian: R = -lmax / lmin
    (0.78, -1.0, 0.78),
    (3.0, -6.0, 0.5),
    (-1.0, -4.0, -0.25),  # negative definite: R in [-1, 0)
    (-2.0, -2.0, -1.0),  # lower bound
    (1.0, -1e-12, CAP),  # lambda_min ~ 0 from below: capped, not 1e12
    (1.0, -0.02, 50.0),  # |lambda_min| above eps * scale: exact
    (1.0, -0.005, CAP),  # below eps * scale counts as no negative curvature
    (1.0, 0.0, CAP),  # PSD: "fully convex"
    (5.0, 0.5, CAP),  # positive lambda_min: capped, never negative -10
    (0.0, 0.0, 0.0),  # zero Hessian
    (-1.0, 2.0, -0.5),  # arguments swapped: sorted first (lmax=2, lmin=-1)... see below
    (NAN, -1.0, CAP),  # failed detection: the cheap value
    (1.0, NAN, CAP),
    (INF, -1.0, CAP),
    (1.0, -INF, 0.0),
    (INF, -INF, 1.0),
    (-INF, -INF, -1.0),
]


@pytest.mark.parametrize("lmax,lmin,expected", RATIO_TABLE)
def test_convexity_ratio_table(lmax, lmin, expected):
    if (lmax, lmin) == (-1.0, 2.0):
        expected = convexity_ratio(2.0, -1.0)
    r = convexity_ratio(lmax, lmin)
    assert math.isfinite(r)
    assert r == pytest.approx(expected, rel=1e-12, abs=1e-12)
    lo, hi = ratio_bounds()
    assert lo <= r <= hi


def test_ratio_is_continuous_and_monotone_across_zero_lambda_min():
    lmins = [-1.0 + i * 0.001 for i in range(2001)]  # -1 .. +1
    rs = [convexity_ratio(1.0, m) for m in lmins]
    assert all(math.isfinite(r) for r in rs)
    assert all(b >= a - 1e-12 for a, b in zip(rs, rs[1:]))  # non-decreasing as lambda_min rises
    assert max(abs(b - a) for a, b in zip(rs, rs[1:])) < 0.1 * CAP  # no jump from +inf to -inf


def test_ratio_eps_is_configurable_and_validated():
    assert convexity_ratio(1.0, 0.0, eps=1e-3) == pytest.approx(1e3)
    for bad in (0.0, 1.0, -0.1, NAN):
        with pytest.raises(ConfigError, match="eps"):
            convexity_ratio(1.0, -1.0, eps=bad)


SCORE_TABLE = [
    # (window oldest..newest, k, decay, expected)
    ([1.0, 2.0, 3.0, 4.0, 5.0, 1.0], 0, 0.96, 1.0),  # newest is the window minimum: most boostable
    ([1.0, 2.0, 3.0, 4.0, 5.0, 5.0], 0, 0.96, 0.0),  # newest is the maximum: not boostable
    ([1.0, 2.0, 3.0, 4.0, 5.0, 3.0], 0, 0.96, 0.5),
    ([1.0, 2.0, 3.0, 4.0, 5.0, 3.0], 10, 0.96, 0.5 * 0.96 ** 10),  # decay d^k
    ([1.0, 2.0, 3.0, 4.0, 5.0, 1.0], 5, 0.9, 0.9 ** 5),
    ([2.0, 2.0, 2.0], 3, 0.96, FLAT_SCORE),  # flat window
    ([2.0], 0, 0.96, FLAT_SCORE),  # one entry
    ([], 0, 0.96, FLAT_SCORE),  # nothing yet
    ([1.0, 1.0 + 1e-15], 0, 0.96, FLAT_SCORE),  # spread below round-off counts as flat
    ([100.0, 0.78, 2.16, 3.43, 1.0, 0.78], 1, 0.96, 0.96),  # exactly n=6 values: 100 is R_max
    ([100.0, 9.0, 0.78, 2.16, 3.43, 1.0, 2.16], 0, 1.0, (9.0 - 2.16) / (9.0 - 0.78)),  # 100 evicted (n=6)
    ([1.0, NAN, 3.0, INF, 2.0], 0, 1.0, 0.5),  # non-finite entries are skipped
]


@pytest.mark.parametrize("window,k,decay,expected", SCORE_TABLE)
def test_boosting_score_table(window, k, decay, expected):
    s = boosting_score(window, k, decay)
    assert math.isfinite(s) and 0.0 <= s <= 1.0
    assert s == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_score_orientation_follows_the_paper():
    """Low R (relative to the window) is boostable; the artifact's reversed orientation would give 0 here."""
    assert boosting_score([3.0, 3.5, 4.0, 0.5], 0) == pytest.approx(1.0)
    assert boosting_score([3.0, 3.5, 4.0, 0.5], 0) > boosting_score([3.0, 3.5, 0.5, 4.0], 0)


def test_score_always_in_unit_interval_for_extreme_inputs():
    for window in ([-1.0, 100.0], [100.0, -1.0], [1e300, -1e300, 0.0], [5e-324, 0.0], [CAP] * 5 + [-1.0]):
        for k in (0, 1, 100, 10_000):
            s = boosting_score(window, k)
            assert math.isfinite(s) and 0.0 <= s <= 1.0


def test_score_validates_arguments():
    with pytest.raises(ConfigError, match="round_index"):
        boosting_score([1.0, 2.0], -1)
    with pytest.raises(ConfigError, match="decay"):
        boosting_score([1.0, 2.0], 0, decay=0.0)
    with pytest.raises(ConfigError, match="decay"):
        boosting_score([1.0, 2.0], 0, decay=1.5)
    with pytest.raises(ConfigError, match="n"):
        boosting_score([1.0, 2.0], 0, n=0)


def test_score_window_is_immutable_bounded_and_serialisable():
    w = ScoreWindow()
    assert w.size == 6 and w.values == ()
    for r in [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]:
        w2 = w.append(r)
        assert w2 is not w and len(w2.values) <= 6
        w = w2
    assert w.to_list() == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]  # eviction of the oldest
    assert w.score(0) == 0.0  # newest is the maximum
    assert w.append(2.0).score(0) == pytest.approx((7.0 - 2.0) / (7.0 - 2.0))
    restored = ScoreWindow.from_list(json.loads(json.dumps(w.to_list())), size=6)
    assert restored == w
    assert ScoreWindow.from_list([1.0, 2.0, 3.0], size=2).to_list() == [2.0, 3.0]
    with pytest.raises(ValueError):
        w.append(NAN)
    with pytest.raises(ConfigError, match="size"):
        ScoreWindow(size=0)
    with pytest.raises(AttributeError):
        w.values = ()  # frozen


def job_scores(entries: dict[int, float], decay: float = 0.96, size: int = 6) -> dict[int, tuple[list[float], float]]:
    """Each stored round's window and score, as the service computes them from the job's stored entries."""
    out = {}
    for k in sorted(entries):
        window, score = round_score([entries[j] for j in sorted(entries) if j <= k], k, decay, size)
        out[k] = (window.to_list(), score)
    return out


@pytest.mark.parametrize("failed", [{5}, {1}, {5, 6}, set(range(4, 14)), {0, 2, 9, 17}])
def test_a_failed_detection_scores_0_and_changes_no_later_rounds_score(failed):
    """Issue 39 item 4: a failed detection stored as R = 100 scored 0 itself, but as every later window's
    maximum it made the next rounds score ~0.88, 0.85, ... (boosting on a failure). Now the failed round scores 0
    and every later round scores as in the same job where that round stored nothing."""
    ratios = {k: 0.6 + 0.4 * math.sin(1.3 * k) for k in range(24)}  # R in [0.2, 1.0], no two alike
    with_failures = job_scores({k: FAILED_RATIO if k in failed else r for k, r in ratios.items()})
    without = job_scores({k: r for k, r in ratios.items() if k not in failed})
    for k in sorted(failed):
        assert with_failures[k][1] == 0.0, k
    for k in without:
        assert with_failures[k] == without[k], k  # every other round: the same window and score
    assert any(without[k][1] > 0.3 for k in without if k > min(failed))  # there were scores to disturb


def test_window_ratios_skip_failed_detections_and_keep_the_newest():
    assert window_ratios([1.0, FAILED_RATIO, 2.0, NAN, 3.0, INF, 4.0], 3) == [2.0, 3.0, 4.0]
    assert window_ratios([FAILED_RATIO, FAILED_RATIO], 6) == []
    assert window_ratios([CAP, 1.0], 6) == [CAP, 1.0]  # a real R of 100 (a convex Hessian) is a ratio
    window, score = round_score([1.0, 2.0, FAILED_RATIO], 2)
    assert window.to_list() == [1.0, 2.0] and score == 0.0  # its own detection failed: 0, not round 1's rank
    with pytest.raises(ConfigError, match="size"):
        window_ratios([1.0], 0)
