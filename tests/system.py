"""A real local system (Redis, Lambda endpoint, three gRPC services) shared by service-level tests."""

from __future__ import annotations

import time

import pytest

from nitro.local.system import LocalSystem


def start_system(state_dir, concurrency: int = 8) -> LocalSystem:
    return LocalSystem(state_dir=state_dir, concurrency=concurrency, actor_timeout_s=60).start()


def module_system(name: str, concurrency: int = 8):
    """A module-scoped `system` fixture: one real local system of the module's own.
    Use as `system = module_system("name")`; the `client` fixture in conftest.py connects to it.
    For a module that kills or restarts a component, reads the components' logs, or checks a counter summed
    over every job of the system; any other takes the worker's shared one (shared_system)."""

    @pytest.fixture(scope="module")
    def system(tmp_path_factory):
        sysm = start_system(tmp_path_factory.mktemp(name), concurrency=concurrency)
        yield sysm
        sysm.stop()

    return system


def shared_system():
    """A module-scoped `system` fixture that hands the module the test worker's one local system (conftest.py's
    `shared_local_system`: started for the first module that asks, stopped at the end of the session), with
    every component running and no job left running by the module before: a start and a stop cost 15-25 s
    of a loaded 2-core machine, once per module. Use as `system = shared_system()` in a module whose tests run
    jobs through the system and read only what their own jobs did (job ids unique in the suite)."""

    @pytest.fixture(scope="module")
    def system(shared_local_system):
        dead = [name for name in shared_local_system.components if shared_local_system._exit_status(name)[0]]
        if dead:
            pytest.fail(f"the shared local system lost {dead}: a module that kills components needs its own "
                        "(tests.system.module_system)")
        yield shared_local_system
        end_running_jobs(shared_local_system)

    return system


def end_running_jobs(system: LocalSystem, timeout_s: float = 120.0) -> None:
    """Stop every job still running, and wait for them to end: the next module gets the cores to itself."""
    from nitro.client.sdk import NitroClient

    with NitroClient(system.learner_address) as client:
        running = [j.job_id for j in client.list() if not j.finished]
        for job_id in running:
            client.stop(job_id)
        deadline = time.monotonic() + timeout_s
        while running and time.monotonic() < deadline:
            running = [job_id for job_id in running if not client.get(job_id).finished]
            time.sleep(0.2)
    assert not running, f"jobs still running {timeout_s:.0f} s after a stop: {running}"
