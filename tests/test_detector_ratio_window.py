"""The detector service's score window over a job's stored ratios (DetectorServicer._store_ratio), on a real
Redis: the newest `window` ratios of rounds up to the scored one, oldest first, however the rounds without a
ratio fall, and without reading the whole hash once the job is long."""

from __future__ import annotations

import numpy as np
import pytest

from detector_svc.server import RATIO_LOOKBACK, DetectorServicer
from nitro.contracts import detector_ratios_key


@pytest.fixture
def svc(redis_client):
    return DetectorServicer(redis_client, b"k" * 32, "redis://127.0.0.1:1/0")


def newest_ratios(stored: dict[int, float], round_index: int, window: int) -> list[float]:
    """The rule, over every stored ratio."""
    return [stored[k] for k in sorted(stored) if k <= round_index][-window:]


@pytest.mark.parametrize("gap", [0.0, 0.5, 0.9, 0.99])
def test_the_window_holds_the_newest_ratios_up_to_the_round_wherever_rounds_lack_one(svc, redis_client, gap):
    rng = np.random.default_rng(int(gap * 100))
    job, stored = "job-a", {}
    for k in range(400):
        if rng.random() < gap:  # a round without a score (the learner's fallback, a resumed round)
            continue
        window = int(rng.integers(1, 9))
        ratio = float(rng.uniform(-1, 1))
        stored[k] = ratio
        assert svc._store_ratio(job, k, ratio, window) == newest_ratios(stored, k, window), k


def test_a_rescored_earlier_round_sees_only_ratios_up_to_it(svc):
    for k in range(30):
        svc._store_ratio("job-a", k, float(k), 6)
    assert svc._store_ratio("job-a", 10, -1.0, 6) == [5.0, 6.0, 7.0, 8.0, 9.0, -1.0]


def test_a_rescored_round_after_a_gap_reaches_back_past_the_gap_but_not_past_itself(svc):
    stored = {k: float(k) for k in (*range(3), *range(200, 260))}
    for k, ratio in stored.items():
        svc._store_ratio("job-a", k, ratio, 6)
    stored[150] = -1.0  # scored late (a resumed learner), with nothing stored for rounds 3-149
    assert svc._store_ratio("job-a", 150, -1.0, 6) == newest_ratios(stored, 150, 6) == [0.0, 1.0, 2.0, -1.0]


def test_a_long_job_reads_a_few_windows_of_rounds_not_its_whole_history(svc, redis_client):
    key = detector_ratios_key("job-a")
    redis_client.hset(key, mapping={str(k): repr(0.5) for k in range(5000)})
    before = redis_client.info("stats")["total_net_output_bytes"]
    assert svc._store_ratio("job-a", 5000, 0.25, 6) == [0.5] * 5 + [0.25]
    read = redis_client.info("stats")["total_net_output_bytes"] - before
    assert read < 4096 + RATIO_LOOKBACK * 6 * 16, read  # one INFO reply (~1 KB) and the windows' ratios
