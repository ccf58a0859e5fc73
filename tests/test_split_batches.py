"""Issue 43: a split batch closes a round, and counts its actor completed, only once every part arrived, in
every loop. Each loop runs in process on a real Redis, reading a stream an actor's writer filled: one actor's
batch whole, the other's split in two parts of which only the first is in (the second is lost or late).

Before the rule had one home (learner_svc/slots.py), the asynchronous loops (IMPACT, Stellaris) took the first
part for the whole batch: the round closed at once and reported both actors completed."""

from __future__ import annotations

import time
from concurrent.futures import Future

import numpy as np

from learner_svc import state
from learner_svc.clients import LearnerDeps
from learner_svc.jobs import Job
from learner_svc.offpolicy import OffPolicyLoop, OffPolicyStats
from learner_svc.parameter_service import StellarisLoop
from learner_svc.state import Round
from nitro.contracts import stream_key
from nitro.data.store import TrajectoryWriter
from nitro.spec import TrainingSpec, validate
from nitro.v1 import scaler_pb2
from tests.credentials import signer

GRACE_S = 0.5  # the lost-batch grace, shortened: the round must wait it out for the missing part


def fill_stream(redis_client, hmac_key, job_id: str) -> None:
    """Round 0: actor 0's batch whole, the first of actor 1's two parts (its second deleted: not arrived)."""
    rng = np.random.default_rng(0)
    batch = lambda n: {"obs": rng.standard_normal((n, 4)).astype(np.float32),  # noqa: E731
                       "actions": rng.integers(0, 2, n), "rewards": np.ones(n, np.float32),
                       "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool),
                       "logp": np.zeros(n, np.float32), "values": np.zeros(n, np.float32),
                       "bootstrap_value": np.float32(0.0), "bootstrap_obs": np.zeros(4, np.float32),
                       "episode_returns": []}
    whole = TrajectoryWriter(redis_client, job_id, signer(hmac_key, job_id))
    whole.append_batch(invocation_id=f"{job_id}-r0-a0", round=0, policy_version=0, batch=batch(64))
    split = TrajectoryWriter(redis_client, job_id, signer(hmac_key, job_id), max_entry_bytes=4000)
    ids = split.append_batch(invocation_id=f"{job_id}-r0-a1", round=0, policy_version=0, batch=batch(512))
    assert len(ids) >= 2, "the batch must be split for this test"
    redis_client.xdel(stream_key(job_id), *ids[1:])


def launched(job_id: str) -> Round:
    fut = Future()
    fut.set_result(scaler_pb2.LaunchResponse(launched=2, succeeded=2, invocations=[
        scaler_pb2.InvocationResult(invocation_id=f"{job_id}-r0-a{s}", ok=True, attempts=1) for s in (0, 1)]))
    rnd = Round(job_id=job_id, k=0, actors=2, version=0)
    rnd.launch(0, [0, 1], fut, deadline_s=60.0)
    return rnd


def deps(redis_client, hmac_key, tmp_path) -> LearnerDeps:
    return LearnerDeps(redis=redis_client, hmac_key=hmac_key, detector=None, scaler=None, data_dir=str(tmp_path))


def test_impact_waits_for_the_missing_part_and_counts_that_actor_incomplete(redis_client, hmac_key, tmp_path,
                                                                           monkeypatch):
    monkeypatch.setattr(state, "LOST_BATCH_GRACE_S", GRACE_S)
    job_id = "split-impact"
    fill_stream(redis_client, hmac_key, job_id)
    loop = OffPolicyLoop(Job(validate(TrainingSpec(env_id="CartPole-v1", algo="impact", preset="fast",
                                                   job_id=job_id))), deps(redis_client, hmac_key, tmp_path))
    rnd, acc = launched(job_id), OffPolicyStats()
    t0 = time.perf_counter()
    loop._train_until_closed(rnd, acc, {}, {})
    waited = time.perf_counter() - t0
    assert rnd.batches == 2 and len(acc.entries) == 2, "the part is still learned from as it arrives"
    assert rnd.covered == {0}
    assert waited >= GRACE_S, "closed on the first part as if the batch were whole"
    assert rnd.summary().report_fields(0)["actors_completed"] == 1


def test_stellaris_counts_a_slot_covered_only_when_every_part_arrived(redis_client, hmac_key, tmp_path):
    job_id = "split-stellaris"
    fill_stream(redis_client, hmac_key, job_id)
    spec = validate(TrainingSpec(env_id="CartPole-v1", preset="fast", rounds=3, job_id=job_id,
                                 learner_mode="stellaris"))
    loop = StellarisLoop(Job(spec), deps(redis_client, hmac_key, tmp_path))
    rnd = launched(job_id)
    rnd.poll([])
    acc = loop._new_acc(0)
    entries = loop.reader.read(count=16, block_ms=0)
    assert len(entries) == 2
    for e in entries:
        loop._ingest(e, rnd.ingest(e), acc)
    assert acc.steps == sum(e.steps for e in entries), "the part is still data for a learner function"
    assert rnd.covered == {0} and not rnd.closed()
    assert rnd.summary().report_fields(0)["actors_completed"] == 1
