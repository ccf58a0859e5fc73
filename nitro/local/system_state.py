"""A local system as other processes see it: <state_dir>/state.json, the lock, the access token, and
stopping a supervisor from outside (`nitro down`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from nitro.errors import LocalSystemError
from nitro.local.processes import pid_alive
from nitro.local.secret_files import SECRET_FILES, TOKEN_FILE

STATE_FILE = "state.json"


STATE_DIR_ENV = "NITRO_STATE_DIR"  # where `nitro up` and the SDK look for the local system when told nothing


DEFAULT_STATE_DIR = ".nitro"


SUPERVISOR_LOG = "supervisor.log"


LOCK_FILE = "lock"


def read_state(state_dir: str | os.PathLike) -> dict | None:
    try:
        return json.loads((Path(state_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def lock_held(state_dir: str | os.PathLike) -> bool:
    """True while a LocalSystem (starting or running) holds `state_dir`."""
    try:
        fd = os.open(Path(state_dir) / LOCK_FILE, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def default_state_dir(environ: Mapping[str, str] = os.environ) -> str:
    """The state dir of the local system when none is named: $NITRO_STATE_DIR, else .nitro."""
    return environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR


def token_file(state_dir: str | os.PathLike) -> Path:
    """Where the local system of `state_dir` keeps its access token (whether or not it is up)."""
    return Path(state_dir) / TOKEN_FILE


def local_target(state_dir: str | os.PathLike = ".nitro") -> str:
    """The learner address of the local system running in `state_dir` (for NitroClient)."""
    state = running_state(state_dir)
    if state is None:
        raise LocalSystemError(f"no local system is up in {state_dir}: run `nitro up`")
    return state["learner"]


def local_token(state_dir: str | os.PathLike = ".nitro") -> str | None:
    """The access token of the local system in `state_dir` (None when it is not up)."""
    if running_state(state_dir) is None:
        return None
    try:
        return token_file(state_dir).read_text().strip() or None
    except OSError:
        return None


def running_state(state_dir: str | os.PathLike) -> dict | None:
    """state.json if its supervisor is alive, else None."""
    state = read_state(state_dir)
    if state and pid_alive(state.get("supervisor_pid"), state.get("supervisor_start_time")):
        return state
    return None


def _kill_leftovers(state: dict, sig: int) -> list[str]:
    hit = []
    for name, comp in reversed(list(state.get("components", {}).items())):
        if pid_alive(comp.get("pid"), comp.get("start_time")):
            with contextlib.suppress(ProcessLookupError):
                os.kill(comp["pid"], sig)
            hit.append(name)
    return hit


def cleanup_stale(state_dir: str | os.PathLike, state: dict) -> list[str]:
    """The supervisor died without cleaning up: kill what it left and forget it (its secrets stay)."""
    left = _kill_leftovers(state, signal.SIGKILL)
    (Path(state_dir) / STATE_FILE).unlink(missing_ok=True)
    return left


def shutdown(state_dir: str | os.PathLike, timeout_s: float = 150.0) -> list[str] | None:
    """SIGTERM the supervisor and wait until it and every component are gone.

    Returns the names of what was running, or None if nothing was up. Anything
    still alive after `timeout_s` is killed.
    """
    state = read_state(state_dir)
    if state is None:
        return None
    pid, start = state.get("supervisor_pid"), state.get("supervisor_start_time")
    if not pid_alive(pid, start):
        left = cleanup_stale(state_dir, state)
        return left or None
    running = [n for n, c in state.get("components", {}).items() if pid_alive(c.get("pid"), c.get("start_time"))]
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    comps = state.get("components", {}).values()
    while time.monotonic() < deadline:
        if not pid_alive(pid, start) and not any(pid_alive(c.get("pid"), c.get("start_time")) for c in comps):
            break
        time.sleep(0.2)
    else:
        with contextlib.suppress(ProcessLookupError):
            if pid_alive(pid, start):
                os.kill(pid, signal.SIGKILL)
        _kill_leftovers(state, signal.SIGKILL)
    if (Path(state_dir) / STATE_FILE).exists() and not pid_alive(pid, start):
        cleanup_stale(state_dir, state)
    return list(reversed(running)) + ["supervisor"]


def last_failure(state_dir: str | os.PathLike) -> str | None:
    """The supervisor's last error line (why it stopped everything), if its log ends with one."""
    try:
        lines = (Path(state_dir) / "logs" / SUPERVISOR_LOG).read_text(errors="replace").splitlines()
    except OSError:
        return None
    starts = [i for i, line in enumerate(lines) if " supervisor " in line]
    errors = [i for i in starts if " supervisor ERROR: " in lines[i]]
    if not errors or any(" local system ready" in lines[i] for i in starts if i > errors[-1]):
        return None
    return lines[errors[-1]].split(" supervisor ERROR: ", 1)[1]


def rotate_secrets(state_dir: str | os.PathLike) -> list[str]:
    """Remove the state dir's secrets so that the next start creates new ones; only while nothing runs.

    Batches signed with the old HMAC key and not yet consumed are then rejected (bad_signature)."""
    if running_state(state_dir) is not None or lock_held(state_dir):
        raise LocalSystemError(f"a local system is up in {state_dir}: `nitro down` before rotating its secrets")
    removed = []
    for name in SECRET_FILES:
        path = Path(state_dir) / name
        if path.exists():
            path.unlink()
            removed.append(name)
    return removed


def redis_for_state_dir(state_dir: str | os.PathLike):
    """A Redis client as the services' user of the local system running in `state_dir`."""
    from nitro.data.redis_client import connect

    state = running_state(state_dir)
    if state is None:
        raise LocalSystemError(f"no local system is up in {state_dir}")
    with open(state["redis_password_file"]) as f:
        password = f.read().strip()
    return connect(state["redis_url"], password=password)
