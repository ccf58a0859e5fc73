"""`python -m nitro.local.supervisor --state-dir DIR`: the local system in the foreground until
SIGTERM/SIGINT (`nitro up` starts it detached), restarting components by the RestartPolicy; a
component that exhausts its restart budget stops everything.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from nitro.errors import LocalSystemError, StartupAborted
from nitro.local.processes import log_tail
from nitro.local.restarts import add_restart_args, restart_policy_from_args
from nitro.local.system import LocalSystem
from nitro.local.system_state import SUPERVISOR_LOG, read_state

log = logging.getLogger("nitro.local.supervisor")


def spawn_supervisor(state_dir: str | os.PathLike, args: list[str] = ()) -> subprocess.Popen:
    """Start `python -m nitro.local.supervisor` detached (own session), logging to <state_dir>/logs."""
    logs = Path(state_dir).resolve() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / SUPERVISOR_LOG, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "nitro.local.supervisor", "--state-dir", str(state_dir), *args],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def wait_until_ready(state_dir: str | os.PathLike, proc: subprocess.Popen, timeout_s: float = 600.0) -> dict:
    """Wait for a spawned supervisor to report "ready"; on failure stop it and raise with its log."""
    deadline = time.monotonic() + timeout_s
    supervisor_log = Path(state_dir) / "logs" / SUPERVISOR_LOG
    while True:
        state = read_state(state_dir)
        if state and state.get("supervisor_pid") == proc.pid and state.get("status") == "ready":
            return state
        rc = proc.poll()
        if rc is not None:
            raise LocalSystemError(f"the local system failed to start (exit code {rc}); "
                                   f"last lines of {supervisor_log}:\n{log_tail(supervisor_log, 40)}")
        if time.monotonic() > deadline:
            proc.terminate()
            proc.wait()
            raise LocalSystemError(f"the local system was not ready within {timeout_s:.0f} s; "
                                   f"last lines of {supervisor_log}:\n{log_tail(supervisor_log, 40)}")
        time.sleep(0.25)


def run_foreground(system: LocalSystem, on_ready=None) -> int:
    """Start, run until SIGTERM/SIGINT or a component dies, stop. Returns an exit code."""
    old = {s: signal.signal(s, lambda *_: system.request_stop()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        system.start()
        log.info("local system ready; learner at %s", system.learner_address)
        if on_ready:
            on_ready(system)
        dead = system.supervise()
        if dead:
            log.error("%s", system.restart_budget_message(dead))
            return 1
        return 0
    except StartupAborted:
        log.info("startup interrupted")
        return 130
    except LocalSystemError as exc:
        log.error("%s", exc)
        return 1
    finally:
        system.stop()
        for s, h in old.items():
            signal.signal(s, h)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nitro.local.supervisor",
                                description="Run the local Nitro system in the foreground until SIGTERM/SIGINT.")
    p.add_argument("--state-dir", default=".nitro")
    p.add_argument("--concurrency", type=int, default=64, help="actor function concurrency limit")
    p.add_argument("--startup-timeout", type=float, default=180.0, help="seconds each component may take")
    p.add_argument("--learner-port", type=int, default=None, help="learner gRPC port (default: any free one)")
    p.add_argument("--monitoring", action="store_true", help="also start a Prometheus (nitro.local.monitoring)")
    add_restart_args(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s supervisor %(levelname)s: %(message)s")
    ports = {"learner": args.learner_port} if args.learner_port else None
    system = LocalSystem(args.state_dir, ports, concurrency=args.concurrency, startup_timeout_s=args.startup_timeout,
                         restart_policy=restart_policy_from_args(args), monitoring=args.monitoring)
    return run_foreground(system)


if __name__ == "__main__":
    sys.exit(main())
