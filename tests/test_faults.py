"""Fault injection on real processes; every job must complete with exact accounting.

Faults: SIGKILL an actor worker mid-invocation, restart redis-server mid-round,
SIGKILL the detector, SIGKILL the learner and resume. Accounting checked for
each job: rounds are contiguous (none skipped or repeated), every round trained
on exactly the batches it used (env steps = batches x steps per actor, each
invocation id at most once), the totals add up, costs add up to the total, and
the trajectory stream ends empty with nothing pending (no batch lost).
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from nitro.client.sdk import NitroClient
from nitro.contracts import stream_key
from nitro.data.redis_client import connect
from nitro.tools.faultkit import busy_worker, wait_for_launch, wait_for_round
from tests.system import start_system

pytestmark = pytest.mark.timeout(600)

STEPS = 2000  # CartPole steps per actor: long enough to be killed mid-invocation


@pytest.fixture(scope="module")
def whole_system(tmp_path_factory):
    sysm = start_system(tmp_path_factory.mktemp("faults") / "state", concurrency=8)
    yield sysm
    sysm.stop()


def revive(sysm) -> None:
    """Start again every component that is down (nothing else restarts them here: no supervisor)."""
    dead = [name for name in sysm.components if sysm._exit_status(name)[0]]
    for name in dead:
        if name == "redis":
            sysm._redis.start()  # same port, data dir (AOF) and users
            sysm._register_redis()
        else:
            sysm._launchers[name]()
    sysm._wait_healthy(dead)


@pytest.fixture
def system(whole_system):
    """One system for the module (starting one per test cost ~12 s each), every component up before and
    after each test: a fault a test leaves behind (the detector it killed) never reaches the next one.
    Jobs, streams and accounting are per job, so tests share nothing else."""
    revive(whole_system)
    yield whole_system
    revive(whole_system)


def spec(rounds=4, steps=STEPS, **kw):
    # One SGD epoch instead of the preset's ten: nothing checked here depends on how hard a round trains,
    # and ten epochs over a round's 8,000-20,000 samples made the update most of every round's time.
    s = {"env_id": "CartPole-v1", "preset": "fast", "rounds": rounds, "steps_per_actor": steps,
         "eval_episodes": 1, "budget_usd": 2.0, "seed": 5, "round_deadline_s": 60.0,
         "hyperparameters": {"epochs": 1},
         "scaler": {"policy": "fixed", "fixed_actors": 4, "i_min": 1, "i_max": 4}}
    s.update(kw)
    return s


def check_accounting(system, client, job_id, rounds, steps=STEPS):
    status = client.get(job_id)
    assert status.state_name == "SUCCEEDED", status.message
    reports = list(client.watch(job_id))
    assert [r.round for r in reports] == list(range(rounds)), "no round skipped or repeated"
    total = 0
    for r in reports:
        assert r.env_steps == r.actors_completed * steps, "each used batch exactly once"
        assert r.actors_completed <= r.actors_launched + r.actors_replaced
        total += r.env_steps
        assert r.total_env_steps == total
    assert status.total_env_steps == total
    assert sum(r.round_cost_usd for r in reports) == pytest.approx(reports[-1].total_cost_usd, rel=1e-6)
    r = connect(system.redis_url)
    key = stream_key(job_id)
    assert r.xlen(key) == 0, "every batch was consumed"
    assert r.xpending(key, "learner")["pending"] == 0, "nothing left unacknowledged"
    return reports


def kill_a_busy_worker(system, timeout_s=60.0) -> psutil.Process | None:
    """SIGKILL a worker seen running an invocation (clearly busy CPU over a short window); the worker killed.

    Polls rather than sleeping a fixed time, so a slow machine still lands the kill while
    an invocation is in flight instead of on an idle worker.
    """
    endpoint = psutil.Process(system.components["lambda"].pid)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        busy = busy_worker(endpoint)
        if busy is not None:
            busy.send_signal(signal.SIGKILL)
            return busy
    return None


def test_actor_worker_killed_mid_invocation(system):
    """The job completes with exact accounting and no batch rejected; the endpoint logs the worker's death, the
    scaler its retry, and the round report says what happened. (The one test of a killed worker: the supervisor
    plays no part in it, so tests/test_supervisor_restarts.py has none.)"""
    # ~1.5 s per invocation on a fast machine (CartPole at ~40k steps/s): busy_worker's 0.25 s look and the kill
    # land well inside it (30,000 steps left only ~2.5x margin once actors got faster).
    long = 30 * STEPS
    with NitroClient(system.learner_address) as client:
        # 3 rounds: the kill lands in round 1 (2 at the latest); the job goes on past the fault.
        job = client.start_training(spec(rounds=3, steps=long, scaler={"policy": "fixed", "fixed_actors": 2,
                                                                        "i_min": 1, "i_max": 2}))
        wait_for_round(client, job.job_id, 0)
        victim = kill_a_busy_worker(system)
        assert victim is not None, "no worker was seen sampling"
        for _ in client.watch(job.job_id):
            pass
        reports = check_accounting(system, client, job.job_id, 3, steps=long)
    assert sum(r.rejected_batches for r in reports) == 0, "a killed worker is not an attack: no batch rejected"
    hit = [r for r in reports if r.invocation_retries or r.actors_failed or r.actors_replaced]
    assert hit, "the killed invocation shows up as a retry, a failure or a replacement"
    notes = [n for r in hit for n in r.notes]
    assert any("Runtime.ExitError" in n and ("succeeded on attempt" in n or "failed after" in n) for n in notes), notes
    logs = system.state_dir / "logs"
    assert f"the worker (pid {victim.pid}) running invocation" in (logs / "lambda.log").read_text()
    assert "attempt 1 failed (Runtime.ExitError" in (logs / "scaler.log").read_text()


def test_redis_restarted_mid_round(system):
    with NitroClient(system.learner_address) as client:
        job = client.start_training(spec(rounds=3))  # restarted in round 1; round 2 reads the stream after it
        wait_for_round(client, job.job_id, 0)
        with connect(system.redis_url) as r:  # a fixed sleep could land after a fast machine's last round
            wait_for_launch(r, job.job_id, 1)
        assert client.get(job.job_id).state_name == "RUNNING"
        system._redis.restart()  # same port, same data dir: AOF brings the stream and groups back
        for _ in client.watch(job.job_id):
            pass
        check_accounting(system, client, job.job_id, 3)


def test_detector_killed_uses_fallback_plan(system):
    with NitroClient(system.learner_address) as client:
        job = client.start_training(spec(rounds=3, detector_timeout_s=5.0, detector_fallback="i_min",
                                         scaler={"policy": "nitro", "i_min": 2, "i_max": 4}))
        wait_for_round(client, job.job_id, 0)
        os.kill(system.components["detector"].pid, signal.SIGKILL)
        for _ in client.watch(job.job_id):
            pass
        reports = check_accounting(system, client, job.job_id, 3)
    assert any(r.fallback_plan for r in reports)
    fb = [r for r in reports if r.fallback_plan]
    assert all(r.next_actors == 2 and "fallback" in r.scaler_reason for r in fb)
    assert any("detector unavailable" in n for r in fb for n in r.notes)
    # The detector is still down: a policy that does not read the score never asks it, so it keeps its plan,
    # waits for nothing and has nothing to report about the detector.
    with NitroClient(system.learner_address) as client:
        job = client.start_training(spec(rounds=2, detector_timeout_s=2.0, detector_fallback="i_min",
                                         scaler={"policy": "fixed", "fixed_actors": 3, "i_min": 2, "i_max": 4}))
        reports = list(client.watch(job.job_id))
    assert [r.next_actors for r in reports[:-1]] == [3] and not any(r.fallback_plan for r in reports)
    assert not any("detector" in n for r in reports for n in r.notes)
    assert all(r.phases["detect"] < 0.5 for r in reports), [r.phases for r in reports]  # not its 2 s timeout


def test_learner_killed_and_resumed(system):
    with NitroClient(system.learner_address) as client:
        job = client.start_training(spec(rounds=4))  # killed in round 2; round 3 follows the resumed one
        wait_for_round(client, job.job_id, 1)
    with connect(system.redis_url) as r:  # into round 2 (a fixed sleep could miss it on a fast machine)
        wait_for_launch(r, job.job_id, 2)
    os.kill(system.components["learner"].pid, signal.SIGKILL)
    system.components["learner"].proc.wait(10)
    # A new learner process on the same data dir resumes the interrupted job by itself.
    system._launchers["learner"]()
    system._wait_healthy(["learner"])
    with NitroClient(system.learner_address) as client:
        deadline = time.time() + 300
        while not client.get(job.job_id).finished and time.time() < deadline:
            time.sleep(1)
        reports = check_accounting(system, client, job.job_id, 4)
    assert any(r.resumed or any("resumed" in n for n in r.notes) for r in reports)


def test_learner_killed_then_resumed_with_the_cli(system, tmp_path):
    import subprocess
    import sys

    with NitroClient(system.learner_address) as client:
        job = client.start_training(spec(rounds=3))  # killed in round 1; the CLI resumes rounds 1 and 2
        wait_for_round(client, job.job_id, 0)
    os.kill(system.components["learner"].pid, signal.SIGKILL)
    system.components["learner"].proc.wait(10)
    system.resume_jobs = False  # this learner waits to be asked (LocalSystem passes --no-resume-jobs)
    try:
        system._launchers["learner"]()
    finally:
        system.resume_jobs = None  # the module's next learner restarts resume again (the learner's default)
    system._wait_healthy(["learner"])
    with NitroClient(system.learner_address) as client:
        st = client.get(job.job_id)
        assert st.state_name == "STOPPED" and "--resume" in st.message
    out = subprocess.run([sys.executable, "-m", "nitro.client.cli", "train", "--resume", job.job_id, "--target",
                          system.learner_address, "--token-file", str(system.state_dir / "token"),
                          "--results-dir", str(tmp_path),
                          "--no-progress"], capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / job.job_id / "rounds.csv").exists()
    with NitroClient(system.learner_address) as client:
        check_accounting(system, client, job.job_id, 3)
