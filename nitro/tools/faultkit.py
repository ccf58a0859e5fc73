"""Fault injection on a supervised local system (`python -m nitro.local.supervisor`, as `nitro up` starts it).

Shared by the fault tests and bench/faults_recovery.py: start the supervisor, read pids from its
state.json, signal them, wait for components to serve again, find an endpoint worker mid-invocation.
No pytest here: the bench imports it too.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import redis

from nitro.client.sdk import NitroClient
from nitro.local import health as local_health
from nitro.local import secret_files, supervisor, system_state


def supervised(state_dir: Path, *flags: str) -> dict:
    """Start the supervisor as `nitro up` does; its state.json once ready."""
    proc = supervisor.spawn_supervisor(state_dir, ["--concurrency", "4", *flags])
    return supervisor.wait_until_ready(state_dir, proc, timeout_s=300)


def state_of(state_dir: Path) -> dict:
    return system_state.read_state(state_dir)


def component(state_dir: Path, name: str) -> dict:
    return state_of(state_dir)["components"][name]


def kill(state_dir: Path, name: str, sig: int = signal.SIGKILL) -> int:
    """Send `sig` to the component's pid as state.json names it; returns the pid."""
    pid = component(state_dir, name)["pid"]
    os.kill(pid, sig)
    return pid


def wait_until(predicate, timeout_s: float, what: str, poll_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def wait_for_wave(r: redis.Redis, job_id: str, round_index: int, timeout_s: float = 120) -> None:
    """Until the scaler runs round `round_index`'s actors (an invocation recorded running): the job is mid-round,
    which a fixed sleep cannot promise on a machine of unknown speed."""
    from nitro import launches
    from nitro.contracts import launches_key

    def running() -> bool:
        records = launches.decode_all(r.hgetall(launches_key(job_id, round_index)))
        return any(not rec.done for rec in records.values())

    wait_until(running, timeout_s, f"round {round_index}'s actors running", poll_s=0.01)


def wait_for_launch(r: redis.Redis, job_id: str, round_index: int, timeout_s: float = 120) -> None:
    """Until the learner has launched (or is launching) round `round_index`: its wave counter exists. It is
    written before the Launch call, so a short wave cannot slip by unseen; wait_for_wave is for a test that needs
    the actors still running."""
    from nitro.contracts import waves_key

    wait_until(lambda: r.exists(waves_key(job_id, round_index)), timeout_s, f"round {round_index}'s launch",
               poll_s=0.01)


def serving_again(state_dir: Path, name: str, old_pid: int) -> bool:
    comp = component(state_dir, name)
    return comp["pid"] != old_pid and local_health.probe(name, comp, state_dir) == "SERVING"


def all_serving(state_dir: Path) -> bool:
    comps = state_of(state_dir)["components"]
    return all(local_health.probe(name, comp, state_dir) == "SERVING" for name, comp in comps.items())


def client_of(state_dir: Path) -> NitroClient:
    return NitroClient(system_state.local_target(state_dir), token=system_state.local_token(state_dir))


def redis_of(state_dir: Path) -> redis.Redis:
    password = (state_dir / secret_files.REDIS_PASSWORD_FILE).read_text().strip()
    return redis.Redis.from_url(component(state_dir, "redis")["url"], password=password)


def wait_for_round(client: NitroClient, job_id: str, k: int) -> None:
    for report in client.watch(job_id):
        if report.round >= k:
            return


def busy_worker(endpoint, function: str | None = None, min_cpu: float = 20.0):
    """A worker process of the endpoint seen clearly busy over a short window, else None.

    `function`: only workers of that function (its name is in the worker's command line), so a kill meant
    for an actor does not hit a Stellaris learner function. `min_cpu` (percent of one core over 0.25 s):
    idle workers sit near 0; on a crowded machine a running actor may get little more than 10."""
    import psutil

    workers = endpoint.children(recursive=True)
    if function is not None:
        tag = f'"name": "{function}"'
        workers = [p for p in workers if _cmdline_has(p, tag)]
    for p in workers:
        try:
            p.cpu_percent(None)
        except psutil.NoSuchProcess:
            pass
    time.sleep(0.25)
    for p in workers:
        try:
            if p.cpu_percent(None) > min_cpu:
                return p
        except psutil.NoSuchProcess:
            pass
    return None


def _cmdline_has(proc, text: str) -> bool:
    import psutil

    try:
        return any(text in part for part in proc.cmdline())
    except psutil.Error:
        return False
