"""A real local system (Redis, Lambda endpoint, three gRPC services) shared by service-level tests."""

from __future__ import annotations

import pytest

from nitro.local.system import LocalSystem


def start_system(state_dir, concurrency: int = 8) -> LocalSystem:
    return LocalSystem(state_dir=state_dir, concurrency=concurrency, actor_timeout_s=60).start()


def module_system(name: str, concurrency: int = 8):
    """A module-scoped `system` fixture: one real local system shared by a test module.
    Use as `system = module_system("name")`; the `client` fixture in conftest.py connects to it."""

    @pytest.fixture(scope="module")
    def system(tmp_path_factory):
        sysm = start_system(tmp_path_factory.mktemp(name), concurrency=concurrency)
        yield sysm
        sysm.stop()

    return system
