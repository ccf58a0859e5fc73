"""The experiment harness: a grid through the real local system, every round recorded, resumable."""

from __future__ import annotations

import json

import pytest

from experiments.harness import Run, load_rounds, load_summary, run_grid
from nitro.contracts import DEFAULT_ACTOR_MEMORY_MB
from nitro.cost import Prices

pytestmark = pytest.mark.timeout(400)


def grid() -> list[Run]:
    common = dict(figure="test", env_id="CartPole-v1", algo="ppo", seed=0, rounds=2, steps_per_actor=128,
                  i_min=1, i_max=2, preset="fast", eval_episodes=1, budget_usd=1.0)
    return [Run(scaler="fixed:1", **common), Run(scaler="fixed:2", **common)]


def test_run_ids_are_file_names_and_specs_carry_the_scheme():
    run = Run("f", "ALE/Qbert-v5", "impact", "fixed:4", 3, 5, 32, 2, 8)
    assert run.run_id == "ale-qbert-v5-impact-fixed-4-s3"
    spec = run.spec()
    assert spec["scaler"] == {"policy": "fixed", "i_min": 2, "i_max": 8, "fixed_actors": 4}
    assert (spec["env_id"], spec["algo"], spec["rounds"], spec["seed"]) == ("ALE/Qbert-v5", "impact", 5, 3)


@pytest.mark.system
def test_grid_records_every_round_and_resumes_only_unfinished_runs(tmp_path):
    runs = grid()
    out = tmp_path / "out"
    lines: list[str] = []
    summaries = run_grid(runs, out, state_dir=tmp_path / "state", concurrency=4, log=lines.append)
    assert [s["state"] for s in summaries] == ["SUCCEEDED", "SUCCEEDED"]
    for run, actors in zip(runs, (1, 2)):
        rounds = load_rounds(out, run)
        assert [r["round"] for r in rounds] == [0, 1]
        assert all(r["actors_completed"] == actors and r["env_steps"] == actors * 128 for r in rounds)
        record = json.loads((out / run.run_id / "run.json").read_text())
        assert record["scaler"] == run.scaler
        # what its reports were billed at, so that a later re-pricing reads them back in the right units
        assert record["billing"] == {"prices": Prices().to_dict(), "actor_memory_mb": DEFAULT_ACTOR_MEMORY_MB}
        assert (out / run.run_id / "rounds.csv").exists()

    # Interrupt the second run: no summary, a half-written record. The first must not run again.
    done_mtime = (out / runs[0].run_id / "summary.json").stat().st_mtime_ns
    (out / runs[1].run_id / "summary.json").unlink()
    (out / runs[1].run_id / "rounds.jsonl").write_text('{"round": 0}\n{"rou')
    lines.clear()
    run_grid(runs, out, state_dir=tmp_path / "state", concurrency=4, log=lines.append)
    assert lines[0].startswith("2 runs, 1 already done, 1 to go")
    assert (out / runs[0].run_id / "summary.json").stat().st_mtime_ns == done_mtime
    assert [r["round"] for r in load_rounds(out, runs[1])] == [0, 1]  # redone from scratch, whole
    assert load_summary(out, runs[1])["state"] == "SUCCEEDED"

    # Nothing left: no system is started at all.
    lines.clear()
    run_grid(runs, out, state_dir=tmp_path / "no-system-here", log=lines.append)
    assert lines == ["2 runs, 2 already done, 0 to go (parallel 1)"]
    assert not (tmp_path / "no-system-here").exists()
