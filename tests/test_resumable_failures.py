"""A job that fails because a dependency stayed down keeps its checkpoint and is resumable; one that fails
for another reason says why and what to do.

Real faults on a real local system without a supervisor (nothing restarts Redis by itself here): Redis
is killed and stays down past the learner's patience (NITRO_REDIS_PATIENCE_S, shortened for the test).
"""

from __future__ import annotations

import json
import os
import signal

import grpc
import pytest
import redis

from learner_svc.resilience import DependencyUnavailable, dependency_failure, resume_advice
from nitro.client import cli
from nitro.client.sdk import FailedPreconditionError, NitroClient
from nitro.tools.faultkit import wait_for_round, wait_until
from tests.system import start_system
from tests.test_faults import check_accounting
from tests.test_supervisor_restarts import SPEC

pytestmark = pytest.mark.timeout(420)

PATIENCE_S = 4


# --- pure parts ----------------------------------------------------------------------------------


class FakeRpcError(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return "connection refused"


def test_dependency_failures_are_told_from_the_rest():
    assert dependency_failure(DependencyUnavailable("Redis unavailable for 60 s")) == "Redis unavailable for 60 s"
    assert "Redis stayed unavailable" in dependency_failure(redis.exceptions.ConnectionError("refused"))
    assert "UNAVAILABLE" in dependency_failure(FakeRpcError(grpc.StatusCode.UNAVAILABLE))
    assert dependency_failure(FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT)) is None
    assert dependency_failure(ValueError("bad")) is None


def test_resume_advice_says_nothing_is_lost_and_how_to_go_on():
    text = resume_advice("Redis unavailable", "j1", 3, 10)
    assert text.startswith("Redis unavailable. Nothing is lost (3/10 rounds done and checkpointed)")
    assert text.endswith("continue it with `nitro train --resume j1`")
    assert "starts again from round 0" in resume_advice("x", "j1", 0, 10)


# --- on a real system ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NITRO_REDIS_PATIENCE_S", str(PATIENCE_S))  # the learner's, read when it starts
        sysm = start_system(tmp_path_factory.mktemp("resumable"), concurrency=4)
    yield sysm
    sysm.stop()


def saved_job(system, job_id: str) -> dict:
    with open(system.data_dir / "jobs" / job_id / "job.json") as f:
        return json.load(f)


def test_redis_down_past_patience_fails_resumable_and_resume_completes(system, tmp_path, capsys):
    job = "redis-down-resumable"
    with NitroClient(system.learner_address) as client:
        # Round deadline 20 s (SPEC's is 60): the resumed round takes over the wave launched while Redis was
        # down, whose batches never came; before wave liveness leases it waited out that deadline before
        # replacing it (now only while a lease is alive). Rounds take 1-3 s on a loaded machine: one SGD
        # epoch, as what is checked is the failure, the resume and the accounting, not how a round trains.
        client.start_training({**SPEC, "rounds": 4, "steps_per_actor": 2000, "round_deadline_s": 20.0,
                               "hyperparameters": {"epochs": 1}, "job_id": job})
        wait_for_round(client, job, 0)
        system._redis.kill()  # a crash that nothing repairs in time
        status = wait_until(lambda: (s := client.get(job)).finished and s, 120, "the job to fail")
        assert status.state_name == "FAILED"
        assert f"Redis unavailable for {PATIENCE_S} s" in status.message
        assert "Nothing is lost" in status.message and f"`nitro train --resume {job}`" in status.message
        assert saved_job(system, job)["resumable"] is True
        assert os.path.exists(system.data_dir / "jobs" / job / "checkpoint.pt")
        system._redis.start()  # same port and AOF: the stream and its consumer group come back
        rc = cli.main(["train", "--resume", job, "--target", system.learner_address, "--results-dir",
                       str(tmp_path), "--no-progress", "--state-dir", str(tmp_path / "no-system")])
        assert rc == 0
        reports = check_accounting(system, client, job, 4, steps=2000)
        assert any(r.resumed for r in reports)
        # What truly ended cannot be resumed, and says so.
        with pytest.raises(FailedPreconditionError, match="cannot be resumed"):
            client.resume(job)
        # `nitro train --resume` of it (a restarted learner may finish a job before its user resumes it) shows
        # its rounds and results and exits with its state's code.
        capsys.readouterr()
        again = tmp_path / "again"
        rc = cli.main(["train", "--resume", job, "--target", system.learner_address, "--results-dir",
                       str(again), "--no-progress", "--state-dir", str(tmp_path / "no-system")])
        out = capsys.readouterr().out
        assert rc == 0, out
        assert f"job {job} ended before this resume (SUCCEEDED" in out and f"job {job} SUCCEEDED" in out
        assert (again / job / "rounds.csv").read_text().count("\n") == 1 + 4  # the header and every round


def test_no_samples_fails_resumable_with_advice_and_is_not_resumed_by_a_restart(system):
    job = "no-actors"
    with NitroClient(system.learner_address) as client:
        client.start_training({**SPEC, "rounds": 3, "function_name": "no-such-function", "job_id": job})
        status = wait_until(lambda: (s := client.get(job)).finished and s, 180, "the job to fail")
    assert status.state_name == "FAILED"
    assert status.message.startswith("no samples arrived in 3 consecutive rounds: the actors produced no batches")
    assert "fix the actors, then, continue it with `nitro train --resume no-actors`" in status.message
    assert saved_job(system, job)["resumable"] is True
    # A restarted learner resumes what it was running, not what failed: the cause may still be there.
    learner = system.components["learner"]
    os.kill(learner.pid, signal.SIGKILL)
    learner.proc.wait(10)
    system._launchers["learner"]()
    system._wait_healthy(["learner"])
    with NitroClient(system.learner_address) as client:
        again = client.get(job)
    assert again.state_name == "FAILED" and again.message == status.message
