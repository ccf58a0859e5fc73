"""The cloud clock moves far less with the machine's load than its wall time (docs/cost.md).

The same reproducible job runs twice through the real local system, quietly and
beside busy-loop processes on every core (checked to have competed for the
cores): the modelled cloud bill moves by at most 15%, or 0.4x what this
machine's wall-time bill does if that is more. The speed target (within 10%
on a quiet machine) is bench/cloud_clock.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.system import shared_system

pytestmark = pytest.mark.timeout(420)

system = shared_system()

SPEC = {"env_id": "CartPole-v1", "preset": "fast", "rounds": 4, "steps_per_actor": 512, "eval_episodes": 3,
        "budget_usd": 1.0, "seed": 5, "reproducible": True,
        "scaler": {"policy": "fixed", "fixed_actors": 4, "i_min": 1, "i_max": 4}}


def run(client) -> list:
    return list(client.watch(client.start_training(SPEC).job_id))


def test_modelled_cloud_cost_is_the_same_quiet_and_beside_a_cpu_hog(client):
    import psutil

    run(client)  # warm-up: first-call costs (torch kernels, the detector's first Score) out of the comparison
    quiet = run(client)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 2))]  # twice the cores: beside a second test worker too
    t0 = time.monotonic()
    try:
        loaded = run(client)
        wall = time.monotonic() - t0
        hog_cpu = sum(sum(psutil.Process(h.pid).cpu_times()[:2]) for h in hogs)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert [r.env_steps for r in quiet] == [r.env_steps for r in loaded] == [4 * 512] * 4
    assert [r.eval_return for r in quiet] == [r.eval_return for r in loaded], "the same job, round for round"
    machine = loaded[-1].total_cost_usd / quiet[-1].total_cost_usd
    cloud = loaded[-1].cloud_total_cost_usd / quiet[-1].cloud_total_cost_usd
    # The hogs competed for the cores the whole time (whatever else the machine was doing).
    assert hog_cpu >= 0.25 * wall, f"the hogs used {hog_cpu:.1f} CPU s in {wall:.1f} s; nothing was tested"
    # The property, not a speed target (that is bench/cloud_clock.py's, on a quiet machine): the cloud bill
    # moves far less than this machine's. Beside other work the "quiet" run is not quiet either, and memory-
    # heavy neighbours inflate CPU time too (docs/cost.md), so a fixed bound here would test the machine.
    assert machine > 1.1, f"the hogs did not slow this machine's clock (x{machine:.2f}); nothing was tested"
    # 0.15: beside an experiment grid the cloud bill moved x1.139 and x0.870 between the two runs (a clock
    # that followed wall time would move with this machine's, x1.3 and more on a quiet machine).
    assert abs(cloud - 1.0) <= max(0.15, 0.4 * (machine - 1.0)), \
        f"modelled cloud cost moved x{cloud:.3f} with load, this machine's x{machine:.2f}"
