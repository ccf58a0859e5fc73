"""The local supervisor restarts crashed components; secrets outlive restarts and `nitro down`/`nitro up`.

The restart decision and the secret files are tested as pure functions; everything else runs
`python -m nitro.local.supervisor` as `nitro up` does, and crashes components with SIGKILL of the pid
that state.json names.
"""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path

import pytest

from nitro.client import cli
from nitro.client.sdk import NitroClient
from nitro.contracts import stream_key
from nitro.errors import LocalSystemError
from nitro.local import processes, restarts, secret_files, system_state
from nitro.tools.faultkit import (
    client_of,
    kill,
    redis_of,
    serving_again,
    state_of,
    supervised,
    wait_for_round,
    wait_until,
)

pytestmark = pytest.mark.timeout(420)

SPEC = {"env_id": "CartPole-v1", "preset": "fast", "steps_per_actor": 256, "eval_episodes": 1, "eval_every": 3,
        "budget_usd": 2.0, "seed": 3, "round_deadline_s": 60.0,
        "scaler": {"policy": "fixed", "fixed_actors": 2, "i_min": 1, "i_max": 2}}


# --- the restart decision and the secrets: pure functions --------------------------------------------


def test_restart_delay_doubles_then_stops_at_the_budget():
    policy = restarts.RestartPolicy(max_restarts=3, window_s=100.0, first_delay_s=0.5, max_delay_s=1.5)
    assert restarts.restart_delay(policy, [], now=1000.0) == 0.5
    assert restarts.restart_delay(policy, [990.0], now=1000.0) == 1.0
    assert restarts.restart_delay(policy, [980.0, 990.0], now=1000.0) == 1.5  # capped
    assert restarts.restart_delay(policy, [970.0, 980.0, 990.0], now=1000.0) is None  # budget spent
    # Restarts older than the window no longer count: a component that stayed up earns its budget back.
    assert restarts.restart_delay(policy, [800.0, 850.0, 990.0], now=1000.0) == 1.0
    assert restarts.restart_delay(restarts.RestartPolicy(max_restarts=0), [], now=0.0) is None


def test_describe_exit():
    assert processes.describe_exit(-signal.SIGKILL) == "signal SIGKILL"
    assert processes.describe_exit(1) == "exit code 1"
    assert processes.describe_exit(None) == "did not start"


def test_secret_is_created_private_then_reused(tmp_path):
    path = tmp_path / "token"
    first = secret_files.load_or_create_secret(path, lambda: "abc")
    assert first == "abc" and path.stat().st_mode & 0o777 == 0o600
    assert secret_files.load_or_create_secret(path, lambda: "other") == "abc"


@pytest.mark.parametrize("mode,content,match", [(0o644, "abc\n", "readable by other users"), (0o600, "\n", "empty")])
def test_a_leaky_or_empty_secret_is_refused(tmp_path, mode, content, match):
    path = tmp_path / "hmac.key"
    path.write_text(content)
    path.chmod(mode)
    with pytest.raises(LocalSystemError, match=match) as exc:
        secret_files.load_or_create_secret(path, lambda: "new")
    assert "--rotate-secrets" in str(exc.value)


def test_restart_flags_are_checked(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["up", "--max-restarts", "-1"])
    assert "--max-restarts" in capsys.readouterr().err


# --- a supervised system ----------------------------------------------------------------------------


def check_job(state_dir: Path, client: NitroClient, job_id: str, rounds: int) -> list:
    """SUCCEEDED, every round once, nothing rejected, nothing left in the stream."""
    status = client.get(job_id)
    assert status.state_name == "SUCCEEDED", status.message
    reports = list(client.watch(job_id))
    assert [r.round for r in reports] == list(range(rounds)), "no round skipped or repeated"
    assert sum(r.rejected_batches for r in reports) == 0, "a restart is not an attack: no batch rejected"
    assert sum(r.env_steps for r in reports) == status.total_env_steps
    r = redis_of(state_dir)
    assert r.xlen(stream_key(job_id)) == 0 and r.xpending(stream_key(job_id), "learner")["pending"] == 0
    return reports


@pytest.fixture(scope="module")
def system_dir(tmp_path_factory):
    state_dir = tmp_path_factory.mktemp("supervised")
    supervised(state_dir)
    yield state_dir
    system_state.shutdown(state_dir)


def test_crashed_redis_endpoint_and_detector_are_restarted_and_the_job_completes(system_dir):
    supervisor_log = system_dir / "logs" / system_state.SUPERVISOR_LOG
    before = {n: c["address"] for n, c in state_of(system_dir)["components"].items()}
    with client_of(system_dir) as client:
        # 100 rounds (~0.1-0.3 s each): the three kills, one after the other, take ~2-5 s to land and recover,
        # and 6 rounds, or 30 on a quiet fast machine, could end before the last one.
        job = client.start_training({**SPEC, "rounds": 100, "eval_every": 25, "job_id": "survives-crashes"}).job_id
        wait_for_round(client, job, 0)
        recovered = {}
        for name in ("redis", "lambda", "detector"):  # one after the other, each mid-job
            assert not client.get(job).finished, f"the job ended before {name} was killed: make it longer"
            t0, pid = time.monotonic(), kill(system_dir, name)
            wait_until(lambda name=name, pid=pid: serving_again(system_dir, name, pid), 60, f"{name} back")
            recovered[name] = time.monotonic() - t0
        print(f"serving again after SIGKILL: {', '.join(f'{n} {s:.1f} s' for n, s in recovered.items())}")
        wait_until(lambda: client.get(job).finished, 240, "the job to end", poll_s=1.0)
        check_job(system_dir, client, job, 100)
    after = state_of(system_dir)["components"]
    assert {n: c["address"] for n, c in after.items()} == before, "a restarted component keeps its address"
    for name in ("redis", "lambda", "detector"):
        restarts = after[name]["restarts"]
        assert restarts["count"] == 1 and restarts["last_exit"] == "signal SIGKILL" and restarts["last_restart_unix"]
    assert after["scaler"]["restarts"]["count"] == 0
    text = supervisor_log.read_text()
    for name in ("redis", "lambda", "detector"):
        assert re.search(rf"WARNING: {name} \(pid \d+\) exited \(signal SIGKILL\); restarting it in", text)
        assert f"restarted {name} (pid" in text


def test_status_shows_restarts(system_dir, capsys):
    assert cli.main(["status", "--state-dir", str(system_dir)]) == 0
    out = capsys.readouterr().out
    assert "RESTARTS" in out
    assert "redis: last exit signal SIGKILL; last restart 20" in out


def test_secrets_cannot_be_rotated_while_up(system_dir):
    with pytest.raises(LocalSystemError, match="nitro down"):
        system_state.rotate_secrets(system_dir)
    assert cli.main(["up", "--state-dir", str(system_dir), "--rotate-secrets"]) == 0  # "already up": nothing rotated
    assert (system_dir / secret_files.TOKEN_FILE).exists()


@pytest.mark.system
def test_restart_budget_spent_stops_everything_and_secrets_outlive_the_system(tmp_path, capsys):
    state_dir = tmp_path / "budget"
    supervised(state_dir, "--max-restarts", "1")
    secrets = {f: (state_dir / f).read_text() for f in secret_files.SECRET_FILES}
    try:
        pid = kill(state_dir, "detector")
        wait_until(lambda: serving_again(state_dir, "detector", pid), 60, "the detector back")
        kill(state_dir, "detector")  # its second exit: one restart was all it had
        wait_until(lambda: system_state.running_state(state_dir) is None, 120, "the supervisor to stop everything")
        assert cli.main(["status", "--state-dir", str(state_dir)]) == 1
        out = capsys.readouterr().out
        assert "detector exited (signal SIGKILL) and it was restarted 1 time(s)" in out
        assert "nitro up" in out and "detector.log" in out
        # Down: the secrets stay, private, and the next `nitro up` uses them.
        assert {f: (state_dir / f).read_text() for f in secret_files.SECRET_FILES} == secrets
        assert all((state_dir / f).stat().st_mode & 0o777 == 0o600 for f in secret_files.SECRET_FILES)
        assert cli.main(["up", "--state-dir", str(state_dir)]) == 0
        assert {f: (state_dir / f).read_text() for f in secret_files.SECRET_FILES} == secrets
        assert cli.main(["status", "--state-dir", str(state_dir)]) == 0  # Redis took the kept passwords
        assert system_state.last_failure(state_dir) is None  # the new system is up: the old error is history
    finally:
        system_state.shutdown(state_dir)
    assert system_state.rotate_secrets(state_dir) == list(secret_files.SECRET_FILES)
    assert not any((state_dir / f).exists() for f in secret_files.SECRET_FILES)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))


@pytest.mark.system
def test_a_detector_or_endpoint_that_moved_port_at_start_takes_the_learner_or_scaler_along(tmp_path):
    # The learner starts beside the detector and scaler (LocalSystem._start_services) with their addresses, and
    # the scaler beside the Lambda endpoint with its URL; a port clash moves the detector and the endpoint (one
    # start for both: a start is most of this test's time), and the learner and scaler must follow them.
    import socket

    from nitro.local.system import LocalSystem

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]

    class Clashing(LocalSystem):
        def _port(self, name: str) -> int:
            if name in ("detector", "lambda") and not self._relaunches.get(name):
                self._assigned[name] = taken
                return taken
            return super()._port(name)

    def argument(name: str, flag: bytes) -> str:
        argv = Path(f"/proc/{system.components[name].pid}/cmdline").read_bytes().split(b"\0")
        return argv[argv.index(flag) + 1].decode()

    system = Clashing(tmp_path / "state", concurrency=2).start()
    try:
        detector, endpoint = system.components["detector"].address, system.components["lambda"].url
        assert system._relaunches == {"detector": 1, "lambda": 1}, system._relaunches
        assert f":{taken}" not in detector and f":{taken}" not in endpoint
        assert argument("learner", b"--detector") == detector
        assert argument("scaler", b"--lambda-endpoint") == endpoint
    finally:
        system.stop()
        squatter.close()
