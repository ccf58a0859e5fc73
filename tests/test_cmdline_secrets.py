"""No secret on a command line (docs/security.md, "Command lines"; nitro/cmdline.py).

Argv is readable by every user of the host (`ps`, /proc/PID/cmdline). The last test runs a real local system
and a real `nitro train` (a subprocess that names its learner with --target and its token with --token-file,
as a user of a remote learner would) and scans the command line of every process they start (services,
redis-server, the Lambda endpoint and its workers, the CLI) for the values of the state dir's secrets.
The flags that used to carry a secret refuse one, with where it goes instead and without echoing it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

import pytest

from nitro.local.lambda_endpoint import FunctionConfig, LocalLambda
from nitro.local.secret_files import SECRET_FILES

pytestmark = pytest.mark.timeout(400)

ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cret-" + "x" * 30  # a value no command line holds by chance


# --- scanning /proc ------------------------------------------------------------------------------------


def descendants(root: int) -> set[int]:
    """Every live process below `root` (children, their children, ...), from /proc/*/stat."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name in parentheses may hold spaces
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def leaks(secrets: dict[str, str], pids) -> list[str]:
    """'<secret name> in pid P: <argv[0..1]>' for every secret whose value is in a process's command line."""
    found = []
    for pid in pids:
        line = cmdline(pid)
        for name, value in secrets.items():
            if value and value in line:
                found.append(f"{name} in pid {pid}: {' '.join(line.split()[:3])} ...")  # never the secret itself
    return found


def state_dir_secrets(state_dir: Path) -> dict[str, str]:
    secrets = {name: (state_dir / name).read_text().strip() for name in SECRET_FILES}
    assert all(len(v) >= 16 for v in secrets.values()), "the state dir holds every secret"
    return secrets


def test_the_scan_finds_a_secret_on_a_command_line():
    """The control: a process with a secret in its argv is found, so a clean scan means something."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", SECRET])
    try:
        deadline = time.monotonic() + 30
        while "time.sleep" not in cmdline(proc.pid) and time.monotonic() < deadline:  # exec'd yet?
            time.sleep(0.05)
        found = leaks({"planted": SECRET}, descendants(os.getpid()))
    finally:
        proc.kill()
        proc.wait()
    assert found == [f"planted in pid {proc.pid}: {sys.executable} -c import ..."]


# --- flags that took a secret ----------------------------------------------------------------------------


def run_cli(*argv: str) -> tuple[int, str]:
    from nitro.client import cli

    out, err = StringIO(), StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = cli.main(list(argv))
        except SystemExit as exc:  # argparse's errors
            rc = exc.code
    return rc, out.getvalue() + err.getvalue()


@pytest.mark.parametrize("command", [["train", "--env", "CartPole-v1"], ["status"], ["list"], ["watch", "job"],
                                     ["stop", "job"]])
def test_token_flag_is_refused_without_echoing_the_token(command):
    rc, out = run_cli(*command, "--token", SECRET)
    assert rc == 2
    assert "--token is refused: an access token on a command line shows in `ps`" in out
    assert "use --token-file FILE, or $NITRO_TOKEN_FILE or $NITRO_TOKEN" in out
    assert SECRET not in out


def test_token_file_that_cannot_be_read_is_bad_input(tmp_path):
    rc, out = run_cli("list", "--target", "127.0.0.1:1", "--token-file", str(tmp_path / "missing"))
    assert rc == 2 and f"--token-file '{tmp_path / 'missing'}' cannot be read" in out, out


URL = f"redis://nitro-service:{SECRET}@127.0.0.1:6379/0"


@pytest.mark.parametrize("module, flag", [("learner_svc.server", "--redis-url"), ("detector_svc.server", "--redis-url"),
                                          ("scaler_svc.server", "--redis-url"),
                                          ("scaler_svc.server", "--actor-redis-url")])
def test_service_refuses_a_redis_url_with_a_password_on_its_command_line(module, flag, monkeypatch, capsys):
    import importlib

    parse_args = importlib.import_module(module).parse_args
    with pytest.raises(SystemExit) as exc:
        parse_args([flag, URL])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert f"{flag}: the URL carries a password, and a command line shows in `ps`" in err
    assert SECRET not in err
    # Without the password it is taken; with it, from the environment (not argv), too.
    assert getattr(parse_args([flag, "redis://nitro-service@127.0.0.1:6379/0"]), flag[2:].replace("-", "_")) \
        == "redis://nitro-service@127.0.0.1:6379/0"
    monkeypatch.setenv("NITRO_REDIS_URL", URL)
    assert importlib.import_module(module).parse_args([]).redis_url == URL


def test_pretrain_minions_refuses_a_redis_url_with_a_password():
    rc, out = run_cli("pretrain-minions", "--env", "CartPole-v1", "--via", "system", "--target", "127.0.0.1:1",
                      "--redis-url", URL)
    assert rc == 2 and "--redis-url: the URL carries a password" in out and SECRET not in out, out


@pytest.mark.system
def test_local_lambda_passes_function_env_outside_the_command_line():
    """FunctionConfig.env (it may hold a key) reaches the workers through the environment only."""
    import boto3
    from botocore.config import Config

    fn = FunctionConfig("env", "nitro.tools.lambda_handlers.env_reader", env={"NITRO_HMAC_KEY": SECRET}, max_workers=1)
    with LocalLambda([fn]) as ll:
        client = boto3.client("lambda", endpoint_url=ll.endpoint_url, region_name="us-east-1",
                              aws_access_key_id="test", aws_secret_access_key="test",
                              config=Config(retries={"total_max_attempts": 1}))
        r = client.invoke(FunctionName="env", Payload=json.dumps({"name": "NITRO_HMAC_KEY"}))
        assert json.loads(r["Payload"].read()) == SECRET  # the worker has it ...
        procs = descendants(ll.pid) | {ll.pid}
        assert len(procs) >= 2, "the endpoint and its worker"
        assert leaks({"FunctionConfig.env": SECRET}, procs) == []  # ... and no command line shows it


# --- a real local system and a real `nitro train` ------------------------------------------------------


@pytest.mark.system
def test_no_secret_on_any_command_line_of_a_local_system_and_nitro_train(tmp_path):
    from tests.system import start_system

    system = start_system(tmp_path / "state", concurrency=4)
    try:
        secrets = state_dir_secrets(system.state_dir)
        results = tmp_path / "results"
        cmd = [sys.executable, "-m", "nitro.client.cli", "train", "--target", system.learner_address,
               "--token-file", str(system.state_dir / "token"), "--results-dir", str(results), "--no-progress",
               "--env", "CartPole-v1", "--preset", "fast", "--rounds", "3", "--steps-per-actor", "256",
               "--scaler", "fixed:2", "--eval-episodes", "1", "--job-id", "argv-scan"]
        proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        seen: dict[int, str] = {}  # every process seen, with its command line then
        found: set[str] = set()
        try:
            while proc.poll() is None:  # every process that exists at any moment of the job: workers come and go
                pids = descendants(os.getpid())
                seen.update({pid: line for pid in pids if (line := cmdline(pid))})  # a zombie's is empty
                found |= set(leaks(secrets, pids))
                time.sleep(0.2)
            out = proc.stdout.read()
        finally:
            proc.kill()
        assert proc.returncode == 0, out
        assert "job argv-scan SUCCEEDED" in out
        # The scan saw every kind of process it is about: the services, the endpoint, an actor, redis, the CLI.
        modules = {line.split(" -m ")[1].split()[0] for line in seen.values() if " -m " in line}
        assert {"learner_svc", "detector_svc", "scaler_svc", "nitro.local.lambda_endpoint",
                "nitro.local.lambda_endpoint.worker", "nitro.client.cli"} <= modules, modules
        assert any("redis-server" in line for line in seen.values()), "redis-server was scanned"
        assert sorted(found) == []
    finally:
        system.stop()
