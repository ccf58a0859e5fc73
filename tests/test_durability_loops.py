"""One durability contract for the three learner loops (on-policy PPO, IMPACT, Stellaris): a stream entry is
acked only after the checkpoint that holds what was learned from it (RoundLoop.commit).

End to end, on real processes: SIGKILL the learner while it holds a batch whose learning is not in its
checkpoint yet (or one its checkpoint holds but it has not acked), let a new learner process resume the job,
and account for every batch the actors produced:
- the job succeeds, every round reported once and in order, one report says the learner resumed;
- steps: the reports' env_steps add up to total_env_steps, and the scaler's ledger of the steps it billed (one
  batch of STEPS steps per successful actor invocation) equals total_env_steps plus the steps of the batches
  the on-policy loop reported stale: every batch produced was counted once, none lost, none twice; in the
  on-policy loop at most one launch is stale (the resumed round trains on the dead learner's wave, launches no
  twin; a kill between round k+1's launch and round k's commit leaves round k+1's launch stale);
- nothing left: the trajectory stream is empty and nothing is pending in the learner's consumer group;
- Stellaris: every batch counted was learned from once: updates produced, skipped and failed over the reports
  add up to the batches.
What is counted are fresh batches; IMPACT's replayed updates are not batches (they are never counted as steps).

In process, on a real Redis: a crash between a commit's checkpoint and its ack is finished by the resumed
loop's restore (the entries are acked, not delivered again).
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import redis
import torch

from learner_svc.clients import LearnerDeps
from learner_svc.jobs import Job
from learner_svc.offpolicy import OffPolicyLoop
from learner_svc.rounds import End
from nitro.client.sdk import NitroClient
from nitro.contracts import scaler_state_key, seen_key, stream_key
from nitro.data.redis_client import connect
from nitro.data.store import TrajectoryWriter
from nitro.rpc.metrics import sample_value, scrape
from nitro.spec import TrainingSpec, validate
from nitro.v1 import training_pb2
from tests.credentials import signer
from tests.system import module_system

pytestmark = pytest.mark.timeout(400)

# 10 rounds, the kill in rounds 1-6: on a fast machine each round's window to land it is ~0.1 s against a
# 30-60 ms poll, so six chances rather than three (actors keep getting faster; CI runs on an unknown machine).
ROUNDS, STEPS = 10, 500
LAST_KILL_ROUND = 6  # later rounds take the stragglers

system = module_system("durability", concurrency=6)

MODES = {
    "ppo": {},
    "impact": {"algo": "impact"},
    "stellaris": {"learner_mode": "stellaris", "stellaris": {"max_learners": 4, "learner_memory_mb": 1024}},
}


def spec(mode: str) -> dict:
    return {"env_id": "CartPole-v1", "preset": "fast", "rounds": ROUNDS, "steps_per_actor": STEPS,
            "eval_episodes": 1, "budget_usd": 2.0, "seed": 7, "round_deadline_s": 60.0,
            "scaler": {"policy": "fixed", "fixed_actors": 3, "i_min": 1, "i_max": 3}, **MODES[mode]}


def learner_steps(system) -> float:
    """Environment steps the running learner process has counted (all its jobs)."""
    return sample_value(scrape(system.components["learner"].metrics_port)["nitro_env_steps"],
                        "nitro_env_steps_total")


def kill_learner_mid_round(system, job_id: str, last_commit: int, unacked_suffices: bool,
                           timeout_s: float = 120.0) -> str:
    """SIGKILL the learner, once round 0 is committed and before round `last_commit` + 1 is, while it has
    counted steps its checkpoint lacks (batches it learned from, or in Stellaris took in) or, where
    `unacked_suffices`, holds batches it has not acked; says where it landed.

    Freezes the learner (SIGSTOP) to read a consistent state, and lets it go on (SIGCONT) when the state is
    not one to kill in."""
    r = connect(system.redis_url)
    learner = system.components["learner"]
    ck_path = system.data_dir / "jobs" / job_id / "checkpoint.pt"
    base = learner_steps(system)  # what this process counted before the job
    deadline = time.time() + timeout_s
    try:
        while time.time() < deadline:
            counted = learner_steps(system) - base  # read before the freeze: at least this much at the freeze
            os.kill(learner.pid, signal.SIGSTOP)
            killed = False
            try:
                ck = torch.load(ck_path, weights_only=False) if ck_path.exists() else None
                pending = pending_entries(r, job_id)
                if ck is not None and ck["round"] > last_commit:
                    pytest.fail(f"round {ck['round']} was committed before a kill could land")
                if ck is not None and (ck["env_steps"] < counted or (unacked_suffices and pending)):
                    os.kill(learner.pid, signal.SIGKILL)
                    killed = True
                    return (f"after round {ck['round']}'s commit, {counted - ck['env_steps']:g} steps counted "
                            f"beyond its checkpoint and {pending} entries pending")
            finally:
                if not killed:
                    os.kill(learner.pid, signal.SIGCONT)
            time.sleep(0.01)
        pytest.fail("the learner never held a batch outside its checkpoint")
    finally:
        r.close()


def pending_entries(r, job_id: str) -> int:
    """Entries delivered to the learner and not acked (none before its consumer group exists)."""
    try:
        return r.xpending(stream_key(job_id), "learner")["pending"]
    except redis.ResponseError:  # NOGROUP: the job's loop has not started reading yet
        return 0


def restart_learner(system) -> None:
    system.components["learner"].proc.wait(10)
    system._launchers["learner"]()  # a new learner process on the same data dir resumes the job by itself
    system._wait_healthy(["learner"])


@pytest.mark.parametrize("mode", list(MODES))
def test_learner_killed_mid_round_resumes_with_every_batch_learned_once(system, mode):
    with NitroClient(system.learner_address) as client:
        job_id = client.start_training(spec(mode)).job_id
    # The on-policy loop counts a batch only when it learns from it, and commits it right after: it is killed
    # while it holds batches; the asynchronous loops while they have learned beyond their checkpoint.
    where = kill_learner_mid_round(system, job_id, last_commit=LAST_KILL_ROUND, unacked_suffices=mode == "ppo")
    restart_learner(system)
    with NitroClient(system.learner_address) as client:
        deadline = time.time() + 300
        while not client.get(job_id).finished and time.time() < deadline:
            time.sleep(1)
        status = client.get(job_id)
        reports = list(client.watch(job_id))
    assert status.state_name == "SUCCEEDED", f"{status.message} (killed {where})"
    assert [r.round for r in reports] == list(range(ROUNDS)), "every round reported once, in order"
    total = 0
    for r in reports:
        total += r.env_steps
        assert r.total_env_steps == total
    assert status.total_env_steps == total
    red = connect(system.redis_url)
    try:
        billed = int(red.hget(scaler_state_key(job_id), "steps_billed"))
        stale = sum(r.stale_batches_dropped for r in reports)
        assert billed == total + stale * STEPS, f"every batch produced counted once (killed {where})"
        if mode == "ppo":
            # The resumed round waits for the wave the dead learner launched instead of launching a second
            # one whose batches would arrive after it closed. Only a kill between round k+1's launch and round
            # k's commit (which overlaps round k+1's sampling) leaves one launch stale: the resumed learner redoes
            # round k's update, and round k+1's actors sampled with the dead learner's.
            assert stale <= spec(mode)["scaler"]["fixed_actors"], \
                f"{stale} batches dropped as stale, {billed - total} billed steps untrained (killed {where})"
        assert red.xlen(stream_key(job_id)) == 0, "every batch consumed"
        assert red.xpending(stream_key(job_id), "learner")["pending"] == 0, "nothing left unacknowledged"
    finally:
        red.close()
    if mode == "stellaris":
        learned = sum(r.gradients_produced + r.learner_functions_skipped + r.learner_functions_failed
                      for r in reports)
        assert learned == total // STEPS, f"every batch learned from once (killed {where})"
        assert all(r.gradients_produced == r.gradients_applied + r.gradients_dropped for r in reports)
    assert any(r.resumed for r in reports), "the report after the kill says the learner resumed"


# -- a crash between a commit's checkpoint and its ack ----------------------------------------------------

class Killed(BaseException):
    """The learner process dying where it stands."""


def _loop(redis_client, hmac_key, tmp_path, job_id) -> OffPolicyLoop:
    job = Job(validate(TrainingSpec(env_id="CartPole-v1", algo="impact", preset="fast", job_id=job_id)))
    return OffPolicyLoop(job, LearnerDeps(redis=redis_client, hmac_key=hmac_key, detector=None, scaler=None,
                                          data_dir=str(tmp_path)))


def _append_round0(redis_client, hmac_key, job_id: str, actors: int) -> None:
    """One 4-step batch from each of `actors` actors of round 0."""
    writer = TrajectoryWriter(redis_client, job_id, signer(hmac_key, job_id))  # each actor's own key
    batch = {"obs": np.zeros((4, 4), np.float32), "rewards": np.zeros(4, np.float32)}
    for a in range(actors):
        writer.append(invocation_id=f"{job_id}-r0-a{a}", round=0, policy_version=0, steps=4, batch=batch)


def test_a_crash_between_checkpoint_and_ack_is_acked_on_resume_not_learned_twice(redis_client, hmac_key, tmp_path,
                                                                                  monkeypatch):
    job_id = "commit-job"
    _append_round0(redis_client, hmac_key, job_id, 3)
    loop = _loop(redis_client, hmac_key, tmp_path, job_id)
    entries = loop.reader.read(count=16, block_ms=0)
    assert len(entries) == 3
    loop.total_steps = 12  # as if learned from

    def die(_entries, **_how):
        raise Killed

    monkeypatch.setattr(loop.reader, "ack", die)
    with pytest.raises(Killed):
        loop.commit(0, {}, entries[:2], counted={entries[2].entry_id: False})  # the third is still being learned
    key = stream_key(job_id)
    assert redis_client.xpending(key, "learner")["pending"] == 3  # the checkpoint is written, nothing acked

    resumed = _loop(redis_client, hmac_key, tmp_path, job_id)  # same job, data dir and consumer: a new process
    assert not resumed.restore() and resumed.total_steps == 12  # no report pending: none was begun
    assert redis_client.xpending(key, "learner")["pending"] == 1, "the committed entries are acked on resume"
    assert None not in redis_client.zmscore(seen_key(job_id), [e.dedup_id for e in entries[:2]])  # consumed
    assert resumed.counted_before == {entries[2].entry_id: False}
    again = resumed.reader.read(count=16, block_ms=0)
    assert [e.entry_id for e in again] == [entries[2].entry_id], "only what the checkpoint lacks comes back"


def test_a_commit_holds_its_ack_back_for_the_next_read_and_a_crash_before_it_loses_nothing(redis_client, hmac_key,
                                                                                           tmp_path):
    """The commit's ack rides with the next read; a learner that dies first leaves the entries pending, and the
    checkpoint that names them lets the resumed learner ack them."""
    job_id = "held-ack-job"
    _append_round0(redis_client, hmac_key, job_id, 4)
    key = stream_key(job_id)
    loop = _loop(redis_client, hmac_key, tmp_path, job_id)
    first = loop.reader.read(count=2, block_ms=0)
    loop.commit(0, {}, first)
    assert redis_client.xpending(key, "learner")["pending"] == 2, "held back: not sent yet"
    second = loop.reader.read(count=2, block_ms=0)
    assert redis_client.xpending(key, "learner")["pending"] == 2, "round 0's ack went with the read"
    assert None not in redis_client.zmscore(seen_key(job_id), [e.dedup_id for e in first])
    loop.commit(1, {}, second[:1])
    del loop  # dies with round 1's ack held back

    resumed = _loop(redis_client, hmac_key, tmp_path, job_id)
    resumed.restore()
    assert redis_client.xpending(key, "learner")["pending"] == 1, "the resumed learner acks what round 1 learned"
    assert [e.entry_id for e in resumed.reader.read(count=16, block_ms=0)] == [second[1].entry_id]


def test_a_commit_sends_an_earlier_held_back_ack_before_its_checkpoint(redis_client, hmac_key, tmp_path,
                                                                      monkeypatch):
    """A checkpoint names only its own round's entries, so an ack still held back from an earlier round is sent
    before it is written: otherwise a crash right after it would leave those entries pending and unnamed."""
    job_id = "flush-first-job"
    _append_round0(redis_client, hmac_key, job_id, 2)
    loop = _loop(redis_client, hmac_key, tmp_path, job_id)
    first, second = loop.reader.read(count=2, block_ms=0)
    loop.commit(0, {}, [first])
    pending_at_write = []
    write = loop._write_checkpoint

    def spy(*args, **kw):
        pending_at_write.append(redis_client.xpending(stream_key(job_id), "learner")["pending"])
        return write(*args, **kw)

    monkeypatch.setattr(loop, "_write_checkpoint", spy)
    loop.commit(1, {}, [second])  # no read in between
    assert pending_at_write == [1], "round 0's ack was sent before round 1's checkpoint"


def test_a_finished_job_sends_its_held_back_ack_riding_out_a_redis_blip(redis_client, hmac_key, tmp_path,
                                                                          monkeypatch):
    job_id = "end-job"
    _append_round0(redis_client, hmac_key, job_id, 1)
    loop = _loop(redis_client, hmac_key, tmp_path, job_id)

    def train(resume):  # one round, committed, then the job ends
        loop.commit(0, {}, loop.reader.read(count=2, block_ms=0))
        assert redis_client.xpending(stream_key(job_id), "learner")["pending"] == 1  # held back
        return End(training_pb2.JOB_STATE_SUCCEEDED, "done")

    consume, calls = loop.reader._consume, []

    def blip(*args):  # the first send fails as during a Redis restart
        calls.append(args)
        if len(calls) == 1:
            raise redis.exceptions.ConnectionError("Redis restarting")
        return consume(*args)

    monkeypatch.setattr(loop, "train", train)
    monkeypatch.setattr(loop.reader, "_consume", blip)
    loop.run()
    assert loop.job.state == training_pb2.JOB_STATE_SUCCEEDED and len(calls) == 2
    assert redis_client.xpending(stream_key(job_id), "learner")["pending"] == 0
    assert redis_client.xlen(stream_key(job_id)) == 0
