"""The detector service's score window over a job's stored ratios (DetectorServicer._store_ratio), on a real
Redis: the newest `window` valid ratios of rounds up to the scored one, oldest first, however the rounds without a
ratio and the failed detections fall, and without reading the whole hash once the job is long; and, through
DetectorServicer.Score, that a failed detection scores 0 and changes no later round's score."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from detector_svc.server import RATIO_LOOKBACK, DetectorServicer
from nitro.contracts import detector_ratios_key, job_read_key, sample_key
from nitro.data import codec
from nitro.data.store import PolicyStore
from nitro.detector.score import FAILED_RATIO, window_ratios
from nitro.policy.models import ModelSpec, Policy, policy_to_blob
from nitro.v1 import detector_pb2

KEY = b"k" * 32


@pytest.fixture
def svc(redis_client):
    return DetectorServicer(redis_client, KEY, "redis://127.0.0.1:1/0")


def newest_ratios(stored: dict[int, float], round_index: int, window: int) -> list[float]:
    """The rule, over every stored entry: failed detections are no ratios."""
    return [stored[k] for k in sorted(stored) if k <= round_index and math.isfinite(stored[k])][-window:]


def stored_window(svc, job: str, round_index: int, ratio: float, window: int) -> list[float]:
    """What round `round_index`'s score window holds after it stored `ratio`."""
    entries = svc._store_ratio(job, round_index, ratio, window)
    assert entries[-1] == ratio or math.isnan(entries[-1]) and math.isnan(ratio)  # the round's own entry, last
    return window_ratios(entries, window)


@pytest.mark.parametrize("failed", [0.0, 0.3])
@pytest.mark.parametrize("gap", [0.0, 0.5, 0.9, 0.99])
def test_the_window_holds_the_newest_ratios_up_to_the_round_wherever_rounds_lack_one(svc, redis_client, gap, failed):
    rng = np.random.default_rng(int(gap * 100) + int(failed * 1000))
    job, stored = "job-a", {}
    for k in range(400):
        if rng.random() < gap:  # a round without a score (the learner's fallback, a resumed round)
            continue
        window = int(rng.integers(1, 9))
        ratio = FAILED_RATIO if rng.random() < failed else float(rng.uniform(-1, 1))
        stored[k] = ratio
        assert stored_window(svc, job, k, ratio, window) == newest_ratios(stored, k, window), k


def test_failed_detections_longer_than_the_lookback_still_leave_a_full_window_of_valid_ratios(svc, redis_client):
    for k in range(10):
        svc._store_ratio("job-a", k, float(k), 6)
    for k in range(10, 10 + RATIO_LOOKBACK * 6 + 5):  # more failed rounds than the read-back covers
        assert stored_window(svc, "job-a", k, FAILED_RATIO, 6) == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0], k
    assert redis_client.hget(detector_ratios_key("job-a"), "12") == b"nan"  # kept for bookkeeping
    assert stored_window(svc, "job-a", 40, 0.5, 6) == [5.0, 6.0, 7.0, 8.0, 9.0, 0.5]


def test_a_rescored_earlier_round_sees_only_ratios_up_to_it(svc):
    for k in range(30):
        svc._store_ratio("job-a", k, float(k), 6)
    assert stored_window(svc, "job-a", 10, -1.0, 6) == [5.0, 6.0, 7.0, 8.0, 9.0, -1.0]
    assert stored_window(svc, "job-a", 10, FAILED_RATIO, 6) == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0]  # a failed retry


def test_a_rescored_round_after_a_gap_reaches_back_past_the_gap_but_not_past_itself(svc):
    stored = {k: float(k) for k in (*range(3), *range(200, 260))}
    for k, ratio in stored.items():
        svc._store_ratio("job-a", k, ratio, 6)
    stored[150] = -1.0  # scored late (a resumed learner), with nothing stored for rounds 3-149
    assert stored_window(svc, "job-a", 150, -1.0, 6) == newest_ratios(stored, 150, 6) == [0.0, 1.0, 2.0, -1.0]


def test_a_long_job_reads_a_few_windows_of_rounds_not_its_whole_history(svc, redis_client):
    key = detector_ratios_key("job-a")
    redis_client.hset(key, mapping={str(k): repr(0.5) for k in range(5000)})
    before = redis_client.info("stats")["total_net_output_bytes"]
    assert stored_window(svc, "job-a", 5000, 0.25, 6) == [0.5] * 5 + [0.25]
    read = redis_client.info("stats")["total_net_output_bytes"] - before
    assert read < 4096 + RATIO_LOOKBACK * 6 * 16, read  # one INFO reply (~1 KB) and the windows' ratios


class Context:
    def abort(self, code, details):
        raise AssertionError(f"Score aborted: {code} {details}")


SPEC = ModelSpec(obs_shape=(11,), action_kind="box", action_dim=3, action_low=(-1.0,) * 3, action_high=(1.0,) * 3,
                 hidden_sizes=(8,))


def round_samples(policy: Policy, k: int, n: int = 700) -> dict:
    """Round k's samples under `policy` (advantages and behaviour log-probabilities drawn per round, so R varies)."""
    rng, gen = np.random.default_rng(k), torch.Generator().manual_seed(k)
    obs = rng.standard_normal((n, 11)).astype(np.float32)
    with torch.no_grad():
        dist = policy.distribution(torch.as_tensor(obs))
        actions = dist.mean + dist.stddev * torch.randn(dist.mean.shape, generator=gen)
        logp = policy.log_prob(dist, actions).numpy()
    return {"obs": obs, "actions": actions.numpy(), "logp": (logp + rng.normal(0, 0.3, n)).astype(np.float32),
            "advantages": rng.standard_normal(n).astype(np.float32)}


def score_rounds(svc, redis_client, job: str, rounds: range, failed: set[int], skipped: set[int] = frozenset()):
    """Score each round of `rounds` but `skipped` through DetectorServicer.Score; a round in `failed` has NaN
    advantages, so its detection fails (NaN eigenvalues). {round: ScoreResponse}."""
    torch.manual_seed(0)
    policy = Policy(SPEC)
    PolicyStore(redis_client, job).put(1, policy_to_blob(policy, 1, job_read_key(KEY, job)))  # the learner's
    out = {}
    for k in rounds:
        if k in skipped:
            continue
        samples = round_samples(policy, k)
        if k in failed:
            samples["advantages"][:] = np.nan
        redis_client.set(sample_key(job, k), codec.encode(samples, job_read_key(KEY, job)))
        out[k] = svc.Score(detector_pb2.ScoreRequest(job_id=job, round=k, policy_version=1,
                                                     sample_ref=sample_key(job, k), clip=0.2, window=6, decay=0.96),
                           Context())
    return out


def test_a_failed_detection_through_score_scores_0_and_changes_no_later_rounds_score(svc, redis_client):
    """Issue 39 item 4: round 5's detection fails; stored as R = 100 it made the next rounds' scores ~0.8 (100 was
    every window's maximum). Now it scores 0 and rounds 6-15 score as in the same job with round 5 never scored."""
    with_failure = score_rounds(svc, redis_client, "job-failed", range(16), failed={5})
    without = score_rounds(svc, redis_client, "job-clean", range(16), failed=set(), skipped={5})
    bad = with_failure[5]
    assert not bad.converged and bad.lambda_max == bad.lambda_min == 0.0  # the detection did fail
    assert bad.score == 0.0
    assert len({round(r.convexity_ratio, 9) for r in without.values()}) > 10  # the ratios do vary
    assert any(r.score > 0.1 for k, r in without.items() if k > 5)  # scores worth comparing
    assert [with_failure[k].score for k in range(6, 16)] == [without[k].score for k in range(6, 16)]
    for k in range(6, 16):
        assert list(with_failure[k].window) == list(without[k].window), k
    assert list(bad.window) == list(without[4].window)  # round 5's window: the valid ratios before it
    assert redis_client.hget(detector_ratios_key("job-failed"), "5") == b"nan"  # stored, for bookkeeping
