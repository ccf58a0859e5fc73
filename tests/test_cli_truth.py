"""`nitro train` tells the truth after a fault: it follows the job across a learner restart (a crash or a
drain), attaches to a job the restarted learner already runs, and, when the system itself is gone or a learner
came back without resuming the job, exits 4 (INTERRUPTED_EXIT) saying so, with the job's last known state, its
checkpoint file and the commands that go on with it (never "PENDING ... exit 0", never a STOPPED that passes
for an end, never "checkpoint none" while the file exists).

Runs `nitro train` as a subprocess against a supervised local system (`python -m nitro.local.supervisor`,
as `nitro up` starts it), or an in-process one whose learner the test restarts itself, and crashes
components with SIGKILL or stops them with SIGTERM.
"""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from learner_svc.constants import LOST_BATCH_GRACE_S
from nitro.client.commands.follow import INTERRUPTED_EXIT
from nitro.local import system_state
from nitro.tools.faultkit import (
    client_of,
    component,
    kill,
    redis_of,
    serving_again,
    supervised,
    wait_for_round,
    wait_for_wave,
    wait_until,
)
from tests.test_supervisor_restarts import SPEC, check_job

pytestmark = [pytest.mark.timeout(480), pytest.mark.system]

ROOT = Path(__file__).resolve().parents[1]

# Before wave liveness leases, a resumed learner waited out the round deadline of a wave its predecessor
# launched whose batches never came: its actors died with the system (system gone), and often after a
# learner-only kill too (0/2 batches taken over; the cause is not pinned down). It now waits only while the
# scaler runs the wave (the last test checks that with a 120 s deadline); 20 s stays as a bound that does not
# cut a healthy round short (rounds here take a second or two even on a loaded machine).
ROUND_DEADLINE_S = 20.0


# The learner rides out a Redis outage this long (NITRO_REDIS_PATIENCE_S, 60 s by default) before the job ends
# FAILED, resumable. A killed supervisor takes Redis down with the learner, whose drain then waited the whole
# patience before it exited and `nitro train` could say the system went down: ~100 s of the suite's time.
REDIS_PATIENCE_S = 5


@pytest.fixture(scope="module")
def system_dir(tmp_path_factory):
    state_dir = tmp_path_factory.mktemp("cli-truth")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NITRO_REDIS_PATIENCE_S", str(REDIS_PATIENCE_S))  # read by each learner the supervisor starts
        supervised(state_dir)
        yield state_dir
        system_state.shutdown(state_dir)


@pytest.fixture(scope="module")
def unsupervised(tmp_path_factory):
    """An in-process local system (no supervisor: the test restarts its learner, or leaves it dead), shared by the
    tests that need one (starting one costs ~10 s); each test gets it with its learner serving, as it resumes
    jobs by default."""
    from tests.system import start_system

    system = start_system(tmp_path_factory.mktemp("unsupervised") / "state", concurrency=4)
    yield system
    system.stop()


@pytest.fixture
def own_system(unsupervised):
    if unsupervised._exit_status("learner")[0]:  # a test before this one left its learner dead
        unsupervised._launchers["learner"]()
        unsupervised._wait_healthy(["learner"])
    yield unsupervised
    unsupervised.resume_jobs = None  # the learner's default for the next restart


def train(state_dir: Path, results: Path, *argv: str) -> subprocess.Popen:
    """`nitro train` in a subprocess, on the local system in `state_dir`; stdout and stderr merged."""
    cmd = [sys.executable, "-m", "nitro.client.cli", "train", "--state-dir", str(state_dir), "--results-dir", str(results),
           "--no-progress", *argv]
    return subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def spec_flags(job_id: str, rounds: int) -> list[str]:
    return ["--env", SPEC["env_id"], "--preset", SPEC["preset"], "--steps-per-actor", str(SPEC["steps_per_actor"]),
            "--eval-episodes", "1", "--eval-every", "3", "--scaler", "fixed:2", "--seed", "3",
            "--round-deadline", str(ROUND_DEADLINE_S), "--rounds", str(rounds), "--job-id", job_id]


def read_until(proc: subprocess.Popen, needle: str, timeout_s: float) -> list[str]:
    """Lines of proc's output up to and including the first that contains `needle`."""
    lines, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"no {needle!r} in the output:\n{''.join(lines)}")


def rounds_in_csv(results: Path, job: str) -> list[int]:
    with open(results / job / "rounds.csv", newline="") as f:
        return [int(row["round"]) for row in csv.DictReader(f)]


def test_train_follows_the_job_across_a_learner_restart(system_dir, tmp_path):
    job = "follows-restart"
    proc = train(system_dir, tmp_path, *spec_flags(job, 5))
    try:
        seen = read_until(proc, "round    1", 180)
        pid = kill(system_dir, "learner")
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    out = "".join(seen) + out
    assert proc.returncode == 0, out
    assert "learner unavailable (UNAVAILABLE): waiting for it to come back" in out
    assert "learner back: following the job again" in out
    assert f"job {job} SUCCEEDED" in out
    assert rounds_in_csv(tmp_path, job) == list(range(5)), "every round once in rounds.csv"
    assert component(system_dir, "learner")["pid"] != pid
    with client_of(system_dir) as client:
        reports = check_job(system_dir, client, job, 5)
    assert any(r.resumed or any("resumed" in n for n in r.notes) for r in reports)


def test_resume_attaches_to_the_job_a_restarted_learner_runs(system_dir, tmp_path):
    job = "attach-to-resumed"
    # Long enough that the resumed job still runs when the CLI attaches (5 short rounds did not; 15 of these leave
    # ~10 s after the restart, several times the CLI's start); the last assertion fails a run where it did not.
    rounds = 15
    with client_of(system_dir) as client:
        client.start_training({**SPEC, "rounds": rounds, "steps_per_actor": 1024, "job_id": job,
                               "round_deadline_s": ROUND_DEADLINE_S})
        wait_for_round(client, job, 0)
    pid = kill(system_dir, "learner")
    wait_until(lambda: serving_again(system_dir, "learner", pid), 90, "the learner back")
    with client_of(system_dir) as client:  # the restarted learner resumed the job by itself
        wait_until(lambda: client.get(job).state_name == "RUNNING", 60, "the job resumed")
    proc = train(system_dir, tmp_path, "--resume", job)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "ALREADY_EXISTS" not in out and f"job {job} SUCCEEDED" in out
    assert rounds_in_csv(tmp_path, job) == list(range(rounds))
    assert "ended before this resume" not in out, "the job ended before the CLI attached: nothing was checked"


def test_train_exits_nonzero_with_the_commands_when_the_system_is_gone(system_dir, tmp_path):
    """The learner and the supervisor die together: no one restarts anything. The CLI says what it knows
    and how to go on; after `nitro up` the job resumes and `nitro train --resume` follows it to its end."""
    job = "system-gone"
    proc = train(system_dir, tmp_path, *spec_flags(job, 5))
    try:
        read_until(proc, "round    0", 180)
        supervisor = system_state.read_state(system_dir)["supervisor_pid"]
        kill(system_dir, "learner")
        os.kill(supervisor, signal.SIGKILL)  # the other components follow it (parent-death signal)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == INTERRUPTED_EXIT, out
    assert "PENDING" not in out
    assert f"job {job} did not finish: the nitro system went down: the local system in {system_dir} stopped" in out
    assert "last known state  RUNNING, 1/5 rounds done (the last: round 0)" in out
    checkpoint_named(out, system_dir, job)
    assert f"    nitro up --state-dir {system_dir}\n    nitro train --resume {job} --state-dir {system_dir}" in out
    assert f"to only follow it: nitro watch {job} --state-dir {system_dir}" in out
    # The documented way on: bring the system back (same secrets: batches signed before are still valid).
    system_state.shutdown(system_dir)  # what the killed supervisor left
    supervised(system_dir)
    resumed = tmp_path / "resumed"
    proc = train(system_dir, resumed, "--resume", job)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert rounds_in_csv(resumed, job) == list(range(5))
    with client_of(system_dir) as client:
        check_job(system_dir, client, job, 5)


def checkpoint_named(out: str, state_dir: Path, job: str) -> str:
    """The CLI names the job's checkpoint file, in what it says of the unfinished job and in the summary."""
    path = state_dir.resolve() / "data" / "jobs" / job / "checkpoint.pt"
    assert path.is_file()
    assert f"  checkpoint        {path}\n" in out, out
    assert f"  checkpoint    {path} (the job has not finished: `nitro train --resume {job}` continues from it)" in out
    assert "checkpoint    none" not in out
    return str(path)


def test_train_says_the_system_went_down_when_the_supervisor_is_killed(system_dir, tmp_path):
    """Only the supervisor is killed: its components get SIGTERM (parent-death signal) and the learner stops the
    job to shut down (STOPPED, interrupted). `nitro train` exited 3 within 1.5 s as if the job had been stopped;
    now it says the system went down and how to go on, and exits 4."""
    job = "supervisor-killed"
    proc = train(system_dir, tmp_path, *spec_flags(job, 8))
    try:
        read_until(proc, "round    0", 180)
        os.kill(system_state.read_state(system_dir)["supervisor_pid"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == INTERRUPTED_EXIT, out
    assert f"job {job} did not finish: the nitro system went down: the local system in {system_dir} stopped" in out
    # The learner may answer once more before it exits (the job STOPPED by its shutdown) or be gone already.
    assert re.search(r"last known state  (STOPPED \(interrupted by its learner's shutdown\)|RUNNING), \d/8 rounds", out)
    checkpoint_named(out, system_dir, job)
    assert f"    nitro up --state-dir {system_dir}\n    nitro train --resume {job} --state-dir {system_dir}" in out
    assert f"job {job} STOPPED" not in out
    system_state.shutdown(system_dir)  # what the killed supervisor left; the next start resumes the job
    supervised(system_dir)
    with client_of(system_dir) as client:
        client.stop(job)  # not needed by the tests after this one


def test_train_follows_the_job_across_a_learner_drain(system_dir, tmp_path):
    """SIGTERM to the learner alone: it stops the job to shut down (STOPPED, interrupted), the supervisor starts
    it again and it resumes the job. `nitro train` exited 3 at the STOPPED; now it follows the job to its end."""
    job = "follows-drain"
    proc = train(system_dir, tmp_path, *spec_flags(job, 5))
    try:
        seen = read_until(proc, "round    1", 180)
        kill(system_dir, "learner", signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    out = "".join(seen) + out
    assert proc.returncode == 0, out
    # It saw the job STOPPED by the shutdown, or the learner already gone; either way it waited for the next one.
    assert (f"job {job} was stopped by its learner shutting down: waiting for a learner to resume it" in out
            or re.search(r"learner unavailable \((UNAVAILABLE|CANCELLED)\): waiting for it to come back", out)), out
    assert f"job {job} SUCCEEDED" in out
    assert rounds_in_csv(tmp_path, job) == list(range(5)), "every round once in rounds.csv"


def test_a_learner_restarted_without_resuming_leaves_the_cli_naming_the_checkpoint(own_system, tmp_path):
    """Automatic resume off (--no-resume-jobs): the restarted learner lists the job STOPPED, interrupted. The CLI
    printed "checkpoint none" and exited 3; now it names the file, says the learner did not resume the job, and
    exits 4 (`nitro watch` too, at once: a serving learner that shows the job interrupted will not resume it)."""
    from nitro.client.sdk import NitroClient

    system = own_system
    job = "not-resumed"
    proc = train(system.state_dir, tmp_path / "results", *spec_flags(job, 8))
    try:
        read_until(proc, "round    0", 180)
        learner = system.components["learner"]
        os.kill(learner.pid, signal.SIGKILL)
        learner.proc.wait(10)
        system.resume_jobs = False  # LocalSystem passes --no-resume-jobs
        system._launchers["learner"]()
        system._wait_healthy(["learner"])
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == INTERRUPTED_EXIT, out
    assert (f"job {job} did not finish: its learner restarted without resuming it (automatic resume is off"
            in out)
    path = checkpoint_named(out, system.state_dir, job)
    assert f"    nitro train --resume {job} --state-dir {system.state_dir}" in out
    with NitroClient(system.learner_address) as client:  # the restarted learner names the file too
        status = client.get(job)
    assert status.state_name == "STOPPED" and status.interrupted and status.checkpoint_path == path
    watch = subprocess.run([sys.executable, "-m", "nitro.client.cli", "watch", job, "--state-dir",
                            str(system.state_dir), "--results-dir", str(tmp_path / "watched"), "--no-progress"],
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                           timeout=120)
    assert watch.returncode == INTERRUPTED_EXIT, watch.stdout + watch.stderr
    assert "its learner restarted without resuming it" in watch.stderr
    assert f"  checkpoint        {path}\n" in watch.stderr


def test_train_gives_up_on_a_learner_at_a_target_that_stays_away(own_system, tmp_path):
    """A learner named by --target (no local system to ask) dies and nothing brings it back: after
    --reattach-timeout `nitro train` exits 4 saying so, with the checkpoint and the commands for that target
    (it exited 1 with "following it stopped")."""
    system = own_system
    job, target = "unreachable", system.learner_address
    proc = subprocess.Popen(
        [sys.executable, "-m", "nitro.client.cli", "train", "--target", target, "--token-file",
         str(system.state_dir / "token"), "--results-dir", str(tmp_path / "results"), "--no-progress",
         "--reattach-timeout", "5", *spec_flags(job, 8)],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        read_until(proc, "round    0", 180)
        learner = system.components["learner"]
        os.kill(learner.pid, signal.SIGKILL)
        learner.proc.wait(10)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == INTERRUPTED_EXIT, out
    assert f"job {job} did not finish: its learner at {target} stayed unreachable (--reattach-timeout 5 s)" in out
    checkpoint_named(out, system.state_dir, job)
    assert f"    nitro status --target {target}   (once the learner answers again)" in out
    assert f"    nitro train --resume {job} --target {target}" in out


def test_a_resumed_round_does_not_wait_out_the_deadline_for_actors_that_died_with_the_system(system_dir):
    """The whole system dies while round 1's actors run. After `nitro up` the resumed learner takes over
    their wave, sees that no scaler runs it any more (its liveness lease lapsed with the scaler) and replaces
    it after LOST_BATCH_GRACE_S, not at the end of the (CLI default) 120 s round deadline."""
    job, deadline_s = "dead-wave", 120.0
    with client_of(system_dir) as client:
        # Round 1's actors must still run when the system is killed, a few ms after their wave's lease
        # appears: 50,000 CartPole steps keep each busy for about a second (2,000 took ~50 ms on a warm
        # worker, and CI once saw both batches land before the kill). One SGD epoch: the resumed round's
        # sampling is what is checked, and the preset's ten epochs were most of the job's time. Two rounds: the
        # resumed round 1 is the subject (a third only added 100,000 steps).
        client.start_training({**SPEC, "rounds": 2, "steps_per_actor": 50_000, "job_id": job,
                               "round_deadline_s": deadline_s, "hyperparameters": {"epochs": 1}})
        wait_for_round(client, job, 0)
    with redis_of(system_dir) as r:
        wait_for_wave(r, job, 1)
    supervisor = system_state.read_state(system_dir)["supervisor_pid"]
    kill(system_dir, "learner")
    os.kill(supervisor, signal.SIGKILL)  # the other components, actors included, follow it
    system_state.shutdown(system_dir)
    supervised(system_dir)  # the restarted learner resumes the job by itself
    with client_of(system_dir) as client:
        wait_until(lambda: client.get(job).finished, 400, "the resumed job to finish", poll_s=1.0)
        reports = check_job(system_dir, client, job, 2)
    resumed = next(r for r in reports if r.resumed)
    assert resumed.round == 1, [(r.round, r.resumed) for r in reports]
    sample = resumed.phases["sample"]
    print(f"resumed round 1: sample phase {sample:.1f} s; notes {list(resumed.notes)}")
    assert sample < deadline_s / 4, (sample, resumed.notes)
    took_over = [n for n in resumed.notes if n.startswith("took over")]
    assert not any("2/2 batches" in n for n in took_over), ("round 1's actors finished before the kill, so this "
                                                           "run could not check its subject", resumed.notes)
    assert len(took_over) == 1 and "no longer running" in took_over[0], resumed.notes
    waited = float(re.search(r"batches in ([\d.]+) s", took_over[0]).group(1))
    assert waited < LOST_BATCH_GRACE_S + 10, took_over[0]
