"""Fixtures shared by the whole suite, and the rule of its two tiers."""

from __future__ import annotations

import os
import secrets

import pytest

from nitro.client.sdk import NitroClient
from nitro.data.redis_client import connect
from nitro.local.redis_server import LocalRedis

# --- the two tiers ----------------------------------------------------------------------------------------
# `make test` runs every test; `make test-fast` leaves out the tests marked `system` or `slow` (pyproject.toml
# registers both markers):
#   system: the test starts processes that make up a system or a part of one, and often kills them: a local
#           system (tests.system.module_system, shared_system or start_system, LocalSystem(...).start()), a
#           supervised one (faultkit's `supervised`), a LocalLambda endpoint, or `nitro up`, `nitro train
#           --local` or a benchmark as a subprocess.
#   slow:   the test starts none of these but takes a second or more (training, Atari emulators, grids of
#           fake runs, long property runs, waits for a timeout): 1.5 s or more in a run of the fast tier on
#           the 2-core machine beside an experiment (pytest --durations=0).
# The marker sits on the test, or on the module (`pytestmark`) where every test in it qualifies. One case
# needs no marker: a test whose fixtures (however indirectly) include `system` (a module's local system, the
# `client` fixture below included), `system_dir` (a supervised system) or `endpoint` (a LocalLambda endpoint)
# is marked `system` here.
# tests/test_test_tiers.py reads the test files and fails when a test that starts a system is not `system`.
SYSTEM_FIXTURES = frozenset({"system", "system_dir", "endpoint"})


def pytest_configure(config):
    """Under pytest-xdist (`-n N`, a worker per process): torch on one thread in each worker and in the processes
    it starts (OMP_NUM_THREADS; the services run one torch thread already, NITRO_TORCH_THREADS). Two workers on
    two cores, each with torch's default of a thread per core, oversubscribe them and its OpenMP threads stall
    each other."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        import torch

        torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before `-m` picks the tests
def pytest_collection_modifyitems(items):
    for item in items:
        if SYSTEM_FIXTURES.intersection(item.fixturenames) and item.get_closest_marker("system") is None:
            item.add_marker(pytest.mark.system)


@pytest.fixture(scope="session")
def redis_server():
    """One real redis-server (loopback, temp dir) for the session."""
    server = LocalRedis().start()
    yield server
    server.close()


@pytest.fixture
def redis_client(redis_server):
    """A client on an emptied database."""
    client = connect(redis_server.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def hmac_key() -> bytes:
    return secrets.token_bytes(32)


@pytest.fixture(scope="session")
def shared_local_system(tmp_path_factory):
    """The test worker's one local system, for the modules that take it (tests.system.shared_system)."""
    from tests.system import start_system

    sysm = start_system(tmp_path_factory.mktemp("shared-system"), concurrency=8)
    yield sysm
    sysm.stop()


@pytest.fixture(scope="module")
def client(system):
    """An SDK client of the module's `system` (tests.system.module_system)."""
    with NitroClient(system.learner_address) as c:
        yield c


@pytest.fixture
def one_thread():
    """torch on one thread, as a learner function runs it: on a shared 2-core machine more threads only
    contend (an in-process PPO update ran ~10x slower with torch's default two beside the experiment grid)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def fresh_handler(monkeypatch):
    """The actor's Lambda handler with a cold execution environment (no warm sampler, runner or Redis client).
    Its keys come in each event (tests.credentials.grant)."""
    import actor_fn.handler as handler_mod
    from actor_fn import runtime

    monkeypatch.delenv("NITRO_HMAC_KEY", raising=False)  # a function holds no key of its own
    for name in ("sampler", "sampler_key", "runner", "runner_key"):
        monkeypatch.setattr(handler_mod._Warm, name, None)
    monkeypatch.setattr(runtime, "WARM_CLIENTS", {})
    yield handler_mod.handler
    if handler_mod._Warm.sampler is not None:
        handler_mod._Warm.sampler.close()
