"""bench/faults_recovery.py keeps working: one cheap cell (ppo x detector) through a real supervised system.

Runs the bench as a user does and reads its last stdout line; the full grid of loops and faults is the
bench's job, not the suite's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(240), pytest.mark.system]

ROOT = Path(__file__).resolve().parents[1]
CELL_KEYS = {"completed", "batches_produced", "batches_acked", "batches_trained", "batches_lost",
             "duplicates_trained", "recovery_seconds", "fault_to_round_seconds", "reference_round_seconds",
             "recovery_ratio", "fault_round", "restarts", "meets_target"}


def test_one_cell_of_the_faults_bench(tmp_path):
    rounds, actors = 8, 2  # the fault lands after round 1; six more rounds outlast the bench's wait for it
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "faults_recovery.py"), "--loops", "ppo",
                           "--faults", "detector", "--rounds", str(rounds), "--actors", str(actors), "--steps", "500",
                           "--state-dir", str(tmp_path / "state")],
                          cwd=ROOT, capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ppo x detector: fault landed" in proc.stderr, "progress goes to stderr"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result) == {"ppo", "target", "config", "meets_target"}
    cell = result["ppo"]["detector"]
    assert set(result["ppo"]) == {"detector"} and CELL_KEYS <= set(cell), cell
    assert cell["completed"] is True, cell
    assert cell["restarts"] == 1, "the detector was killed and the supervisor restarted it"
    assert cell["batches_produced"] >= rounds * actors and cell["batches_trained"] >= rounds * actors, cell
    assert cell["batches_lost"] == 0 and cell["duplicates_trained"] == 0, cell
    assert cell["recovery_seconds"] is not None and cell["reference_round_seconds"] > 0, cell
    assert isinstance(result["meets_target"], bool) and result["target"]["recovery_seconds_max"] == 30.0
