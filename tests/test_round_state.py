"""The loops' typed round state (learner_svc/state.py): a Round's launches and what it makes of each stream entry
(kept, late, stale, duplicate: the one rule every loop reads by), and the pending round a checkpoint keeps,
read from and written as the plain dicts earlier checkpoints hold."""

from __future__ import annotations

import dataclasses
import io
import time
from concurrent.futures import Future

import grpc
import torch

from learner_svc import state
from learner_svc.parameter_service import StellarisStats
from learner_svc.state import Ingest, LaunchSummary, PendingRound, Round
from nitro.contracts import invocation_id
from nitro.data.store import TrajectoryEntry
from nitro.v1 import scaler_pb2


def entry(inv: str, part: int = 0, parts: int = 1, *, rnd: int = 3, version: int = 7, eid: str = "") -> TrajectoryEntry:
    return TrajectoryEntry(eid or f"{inv}-{part}", inv, rnd, version, 4, {}, part, parts)


def launched(actors: int, resp=None, future=None, start=None, deadline_s=60.0, **kw) -> Round:
    rnd = Round(job_id="j", k=3, actors=actors, version=7, **kw)
    rnd.launch(0, range(actors), future or _done(resp or scaler_pb2.LaunchResponse()), deadline_s, start)
    return rnd


def _done(resp) -> Future:
    fut = Future()
    fut.set_result(resp)
    return fut


def test_a_launch_names_its_failed_slots_and_closes_when_the_rest_arrived():
    resp = scaler_pb2.LaunchResponse(retries=2, cloud_cost_usd=0.0125, invocations=[
        scaler_pb2.InvocationResult(invocation_id="j-r3-a0", ok=True, attempts=2, error_message="throttled"),
        scaler_pb2.InvocationResult(invocation_id="j-r3-a1-x1", ok=False, attempts=3, error_type="Timeout",
                                    error_message="took too long")])
    rnd = launched(3, resp)
    assert not rnd.closed()  # the Launch's response is not taken yet
    notes: list[str] = []
    assert rnd.poll(notes) is resp and rnd.poll(notes) is None  # taken once
    assert rnd.failed == {1} and rnd.wave.resp is resp
    assert notes == ["actor j-r3-a0 succeeded on attempt 2, throttled",
                     "actor j-r3-a1-x1 failed after 3 attempt(s): Timeout: took too long"]
    assert rnd.ingest(entry("j-r3-a0")) is Ingest.KEPT and rnd.ingest(entry("other-r3-a2")) is Ingest.LATE
    assert rnd.batches == 1 and rnd.late == 1
    assert not rnd.closed()  # slot 2 may still arrive
    rnd.ingest(entry("j-r3-a2"))
    assert rnd.closed()  # every slot's batch is in or failed
    summary = rnd.summary()
    assert summary.report_fields(3) == dict(round=3, policy_version=7, actors_launched=3, actors_completed=2,
                                            actors_failed=1, invocation_retries=2, cloud_actor_cost_usd=0.0125)
    assert LaunchSummary.from_dict(summary.to_dict()) == summary


def test_a_split_batch_covers_its_slot_only_when_every_part_arrived():
    """Issue 43: the asynchronous loops (IMPACT, Stellaris) closed a round, and counted an actor completed, on
    the first part of a split batch."""
    rnd = launched(2)
    rnd.poll([])
    assert {rnd.ingest(entry("j-r3-a0")), rnd.ingest(entry("j-r3-a1", 0, 3))} == {Ingest.KEPT}
    assert rnd.ingest(entry("j-r3-a1", 2, 3)) is Ingest.KEPT and rnd.batches == 3
    assert rnd.covered == {0} and not rnd.closed(), "slot 1 has 2 of its 3 parts"
    assert rnd.missing() == {1}
    assert rnd.summary().report_fields(3)["actors_completed"] == 1
    rnd.ingest(entry("j-r3-a1", 1, 3))
    assert rnd.covered == {0, 1} and rnd.closed() and not rnd.missing()
    assert rnd.summary().report_fields(3)["actors_completed"] == 2


def test_a_launch_that_never_returns_closes_at_the_round_deadline():
    now = time.perf_counter()
    assert not launched(2, future=Future(), start=now - 5.0, deadline_s=10.0).closed()
    assert launched(2, future=Future(), start=now - 5.0, deadline_s=4.0).closed()


def test_an_on_policy_round_keeps_only_its_own_invocations_at_its_version():
    rnd = Round(job_id="j", k=3, actors=2, version=7, on_policy=True, ids={})
    rnd.launch(1, [0, 1], Future(), 60.0)  # wave 1 only: its ids are the ones that count
    a0, a1 = (invocation_id("j", 3, s, 1) for s in (0, 1))
    assert rnd.ingest(entry(a0)) is Ingest.KEPT
    assert rnd.ingest(entry(a0)) is Ingest.DUPLICATE
    assert rnd.ingest(entry(a1, version=6)) is Ingest.STALE  # sampled with the version before
    assert rnd.ingest(entry(invocation_id("j", 2, 1, 0), rnd=2)) is Ingest.STALE  # an earlier round's straggler
    assert rnd.ingest(entry(invocation_id("j", 3, 1, 0))) is Ingest.STALE  # wave 0 was not launched by this learner
    assert (rnd.batches, rnd.steps, rnd.stale, rnd.stale_steps, rnd.duplicates) == (1, 4, 3, 12, 1)
    assert rnd.missing() == {1}
    async_round = launched(2)  # ids=None: any wave of this job and round counts
    assert async_round.ingest(entry(invocation_id("j", 3, 1, 2), version=5)) is Ingest.KEPT
    assert async_round.ingest(entry(invocation_id("j", 2, 1, 0), rnd=2)) is Ingest.LATE


class Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "scaler down"


def test_a_wave_closes_when_its_launch_failed_or_its_batches_were_lost():
    failing = Future()
    failing.set_exception(Unavailable())
    rnd = launched(2, future=failing)
    notes: list[str] = []
    rnd.poll(notes)
    assert notes == ["launch (wave 0) failed: UNAVAILABLE: scaler down"]
    assert rnd.failed == {0, 1} and rnd.closed()
    ok = launched(2)
    ok.poll([])
    assert not ok.closed(now=ok.wave.done_at + state.LOST_BATCH_GRACE_S / 2)
    assert ok.closed(now=ok.wave.done_at + state.LOST_BATCH_GRACE_S + 0.01), "their batches were lost"


def test_pending_round_reads_and_writes_the_checkpoint_dicts_of_earlier_learners():
    acc = {"k": 4, "bound": 2, "notes": ["n"], "steps": 96, "late": 1, "batches": [], "produced": 3, "applied": 2,
           "dropped": 1, "skipped": 0, "staleness": [0, 1, 3], "launched": 4, "failed": 1, "rejected": 0,
           "duplicates": 0, "sums": {"kl": 0.5}, "aggregations": 2, "t": 1.0, "busy": 0.25,
           "learner_fn_seconds": 2.0, "relearned": 0, "discarded": 0}
    rnd = {"actors": 3, "version": 9, "covered": {0, 1}, "failed": {2}, "retries": 0}
    old = {"round": 4, "fields": {"round": 4}, "score": b"s", "plan": b"p", "notes": ["a"], "fallback": 0,
           "cloud": {"update": 1.0}, "phases": {"ingest": 0.1}, "t": 123.0, "ending": False, "acc": acc, "rnd": rnd}
    pending = PendingRound.from_dict(old)
    assert (pending.round, pending.ending, set(pending.extra)) == (4, False, {"acc", "rnd"})
    assert (pending.score, pending.plan) == (b"s", b"p")
    assert pending.to_dict() == {**old, "score": b"s".hex(), "plan": b"p".hex()}
    assert PendingRound.from_dict(pending.to_dict()) == pending
    # load_policy reads a checkpoint with weights_only=True: an unset ScoreResponse (nothing scored) is b"".
    buf = io.BytesIO()
    torch.save({"pending": dataclasses.replace(pending, score=b"", extra={}).to_dict()}, buf)
    buf.seek(0)
    assert PendingRound.from_dict(torch.load(buf, weights_only=True)["pending"]).score == b""
    stats = StellarisStats.from_dict(acc)
    assert stats.means() == {"kl": 0.25} and LaunchSummary.from_dict(rnd).report_fields(4)["actors_failed"] == 1
    stats.batches.append({"obs": None})
    assert stats.to_dict() == acc, "the checkpoint keeps the counters, not the round's batches"


def test_one_ending_rule_for_every_loop_target_then_rounds_then_budget():
    from learner_svc.rounds import job_end

    assert job_end(rounds_done=3, rounds=10) is None
    assert job_end(rounds_done=10, rounds=10).message == "completed 10 rounds"
    assert job_end(rounds_done=3, rounds=10, budget_exhausted=True, budget_reason="$0.01 left").message == \
        "budget exhausted: $0.01 left"
    # A target reached on the last round, with the budget spent too, says what the job was for.
    end = job_end(rounds_done=10, rounds=10, budget_exhausted=True, eval_return=510.0, target_return=500.0)
    assert end.message == "target return 500 reached"
    assert job_end(rounds_done=3, rounds=10, eval_return=float("nan"), target_return=500.0) is None
    assert job_end(rounds_done=3, rounds=10, eval_return=499.0, target_return=500.0) is None
