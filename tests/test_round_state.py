"""The loops' typed round state (learner_svc/state.py): a launch's outcome as the asynchronous loops read it, and
the pending round a checkpoint keeps, read from and written as the plain dicts earlier checkpoints hold."""

from __future__ import annotations

import time
from concurrent.futures import Future

from learner_svc.state import LaunchedRound, LaunchSummary, PendingRound
from learner_svc.stellaris import StellarisStats
from nitro.data.store import TrajectoryEntry
from nitro.v1 import scaler_pb2


def entry(inv: str, part: int = 0, parts: int = 1) -> TrajectoryEntry:
    return TrajectoryEntry("1-0", inv, 3, 7, 4, {}, part, parts)


def _done(resp) -> Future:
    fut = Future()
    fut.set_result(resp)
    return fut


def test_a_launch_names_its_failed_slots_and_closes_when_the_rest_arrived():
    resp = scaler_pb2.LaunchResponse(retries=2, cloud_cost_usd=0.0125, invocations=[
        scaler_pb2.InvocationResult(invocation_id="j-r3-a0", ok=True, attempts=2, error_message="throttled"),
        scaler_pb2.InvocationResult(invocation_id="j-r3-a1-x1", ok=False, attempts=3, error_type="Timeout",
                                    error_message="took too long")])
    rnd = LaunchedRound(job_id="j", k=3, actors=3, version=7, future=_done(resp))
    assert not rnd.closed(deadline_s=60.0)  # the Launch's response is not taken yet
    notes: list[str] = []
    rnd.poll(notes)
    assert rnd.failed == {1} and rnd.resp is resp
    assert notes == ["actor j-r3-a0 succeeded on attempt 2, throttled",
                     "actor j-r3-a1-x1 failed after 3 attempt(s): Timeout: took too long"]
    assert rnd.covers(entry("j-r3-a0")) and not rnd.covers(entry("other-r3-a2")) and rnd.batches == 2
    assert not rnd.closed(deadline_s=60.0)  # slot 2 may still arrive
    rnd.covers(entry("j-r3-a2"))
    assert rnd.closed(deadline_s=60.0)  # every slot's batch is in or failed
    summary = rnd.summary()
    assert summary.report_fields(3) == dict(round=3, policy_version=7, actors_launched=3, actors_completed=2,
                                            actors_failed=1, invocation_retries=2, cloud_actor_cost_usd=0.0125)
    assert LaunchSummary.from_dict(summary.to_dict()) == summary


def test_a_split_batch_covers_its_slot_only_when_every_part_arrived():
    """Issue 43: the asynchronous loops (IMPACT, Stellaris) closed a round, and counted an actor completed, on
    the first part of a split batch."""
    rnd = LaunchedRound(job_id="j", k=3, actors=2, version=7, future=_done(scaler_pb2.LaunchResponse()))
    rnd.poll([])
    assert rnd.covers(entry("j-r3-a0")) and rnd.covers(entry("j-r3-a1", 0, 3))
    assert rnd.covers(entry("j-r3-a1", 2, 3)) and rnd.batches == 3
    assert rnd.covered == {0} and not rnd.closed(deadline_s=60.0), "slot 1 has 2 of its 3 parts"
    assert rnd.summary().report_fields(3)["actors_completed"] == 1
    rnd.covers(entry("j-r3-a1", 1, 3))
    assert rnd.covered == {0, 1} and rnd.closed(deadline_s=60.0)
    assert rnd.summary().report_fields(3)["actors_completed"] == 2


def test_a_launch_that_never_returns_closes_at_the_round_deadline():
    rnd = LaunchedRound(job_id="j", k=0, actors=2, version=0, future=Future(), start=time.perf_counter() - 5.0)
    assert not rnd.closed(deadline_s=10.0) and rnd.closed(deadline_s=4.0)


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
    assert pending.to_dict() == old
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
