"""The cloud clock does not move with the machine's load (docs/cost.md).

The same reproducible job runs twice through the real local system, quietly and
beside busy-loop processes on every core: this machine's wall-time bill grows,
the modelled cloud bill stays within 10%.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.system import module_system

pytestmark = pytest.mark.timeout(420)

system = module_system("nitro-cloud-clock", concurrency=4)

SPEC = {"env_id": "CartPole-v1", "preset": "fast", "rounds": 4, "steps_per_actor": 512, "eval_episodes": 3,
        "budget_usd": 1.0, "seed": 5, "reproducible": True,
        "scaler": {"policy": "fixed", "fixed_actors": 4, "i_min": 1, "i_max": 4}}


def run(client) -> list:
    return list(client.watch(client.start_training(SPEC).job_id))


def test_modelled_cloud_cost_is_the_same_quiet_and_beside_a_cpu_hog(client):
    run(client)  # warm-up: first-call costs (torch kernels, the detector's first Score) out of the comparison
    quiet = run(client)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        loaded = run(client)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert [r.env_steps for r in quiet] == [r.env_steps for r in loaded] == [4 * 512] * 4
    assert [r.eval_return for r in quiet] == [r.eval_return for r in loaded], "the same job, round for round"
    machine = loaded[-1].total_cost_usd / quiet[-1].total_cost_usd
    cloud = loaded[-1].cloud_total_cost_usd / quiet[-1].cloud_total_cost_usd
    assert machine > 1.2, f"the hog did not load the machine (this machine's bill x{machine:.2f}); nothing was tested"
    assert abs(cloud - 1.0) <= 0.10, f"modelled cloud cost moved x{cloud:.3f} with load (this machine's: x{machine:.2f})"
