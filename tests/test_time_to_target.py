"""bench/time_to_target.py's pure parts: the crossing of a target on an evaluation curve, a peer's VM bill, nitro's
curve from its round reports, the median same-seed ratios, the plan and what a rerun skips, and --report from the
result files alone. No system, no peer, no network."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nitro.cost import Prices, learner_cost

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("time_to_target", ROOT / "bench" / "time_to_target.py")
ttt = importlib.util.module_from_spec(_spec)
sys.modules["time_to_target"] = ttt  # its dataclass looks its module up there
_spec.loader.exec_module(ttt)


def curve(*points):
    return [{"env_steps": s, "train_s": t, "return": r} for s, t, r in points]


def test_crossing_is_the_first_point_at_or_above_the_target():
    c = curve((20480, 10.0, 900.0), (40960, 20.0, 2500.0), (61440, 30.0, 3100.0))
    assert ttt.crossing(c, 2500.0)["env_steps"] == 40960  # reaching it counts
    assert ttt.crossing(c, 3000.0)["train_s"] == 30.0
    assert ttt.crossing(c, 3200.0) is None
    assert ttt.crossing([], 1.0) is None
    # a later dip does not undo a crossing; an earlier peak is the crossing
    assert ttt.crossing(curve((1, 1.0, 2600.0), (2, 2.0, 100.0)), 2500.0)["env_steps"] == 1


def test_outcome_reports_the_cap_and_the_best_return_when_not_crossed():
    run = ttt.Run("sb3", "own", "Hopper-v5", 0)
    crossed = ttt.outcome(run, curve((20480, 50.0, 2000.0), (40960, 95.0, 2700.0)), 600.0, 2500.0)
    assert crossed == {"crossed": True, "wall_s": 95.0, "env_steps": 40960, "best_return": 2700.0,
                       "crossing_return": 2700.0}
    capped = ttt.outcome(run, curve((20480, 50.0, 2000.0), (40960, 95.0, 1800.0)), 600.0, 2500.0)
    assert capped == {"crossed": False, "wall_s": 600.0, "env_steps": 40960, "best_return": 2000.0}
    late = ttt.outcome(run, curve((20480, 50.0, 2000.0), (40960, 601.0, 2700.0)), 600.0, 2500.0)
    assert late["crossed"] is False and late["best_return"] == 2000.0, "trained past the cap: does not count"
    assert ttt.outcome(run, [], 60.0, 2500.0) == {"crossed": False, "wall_s": 60.0, "env_steps": 0,
                                                  "best_return": None}


def test_sample_factorys_evaluation_points_are_the_first_checkpoints_past_each_n_steps():
    found = [(1000, 1.0, "a"), (2100, 2.0, "b"), (3000, 3.0, "c"), (4096, 4.0, "d"), (9000, 5.0, "e"),
             (10000, 6.0, "f")]
    assert [c[2] for c in ttt.sf_checkpoint_points(found, 2048)] == ["b", "d", "e"]
    assert ttt.sf_checkpoint_points([], 2048) == []


def test_a_peer_is_billed_as_the_learner_servers_instance_per_second():
    prices = Prices()
    assert prices.learner_instance == "c6i.large"
    assert ttt.vm_cost_usd(3600.0, prices) == pytest.approx(prices.learner_usd_per_hour)
    assert ttt.vm_cost_usd(90.0, prices) == pytest.approx(90.0 / 3600.0 * prices.learner_usd_per_hour)
    assert ttt.vm_cost_usd(90.0, prices) == learner_cost(90.0, prices)  # the one home of that price and rule
    dearer = Prices(learner_usd_per_hour=1.0)
    assert ttt.vm_cost_usd(36.0, dearer) == pytest.approx(0.01)


def report(round_, steps, secs, evaluate, cloud, cloud_eval, evaluated, ret, usd, eval_usd):
    return {"round": round_, "total_env_steps": steps, "round_seconds": secs, "phases": {"sample": 1.0, "evaluate": evaluate},
            "cloud_round_seconds": cloud, "cloud_phases": {"evaluate": cloud_eval}, "evaluated": evaluated,
            "eval_return": ret, "cloud_total_cost_usd": usd, "cloud_eval_cost_usd": eval_usd}


def test_nitros_curve_leaves_evaluation_waits_out_of_its_times():
    reports = [report(1, 2048, 5.0, 0.0, 3.0, 0.0, False, 0.0, 0.001, 0.0),
               report(2, 4096, 6.0, 0.5, 4.0, 0.25, True, 800.0, 0.002, 0.0004),
               report(3, 6144, 5.0, 0.0, 3.0, 0.0, False, 0.0, 0.003, 0.0),
               report(4, 8192, 7.0, 1.0, 5.0, 1.0, True, 2600.0, 0.004, 0.0004)]
    c = ttt.nitro_curve(reports)
    assert [p["round"] for p in c] == [2, 4]
    assert c[0]["train_s"] == pytest.approx(10.5) and c[1]["train_s"] == pytest.approx(21.5)
    assert c[0]["cloud_s"] == pytest.approx(6.75) and c[1]["cloud_s"] == pytest.approx(13.75)
    assert c[1]["usd"] == 0.004 and c[1]["usd_training"] == pytest.approx(0.0032)
    assert ttt.crossing(c, 2500.0)["env_steps"] == 8192
    assert ttt.nitro_train_s(reports) == pytest.approx(21.5)
    assert ttt.nitro_eval_every(20480) == 10 and ttt.nitro_eval_every(100) == 1


def result(system, settings, seed, wall, usd, crossed=True, env="Hopper-v5"):
    return {"system": system, "settings": settings, "env_id": env, "seed": seed, "wall_s": wall, "usd": usd,
            "env_steps": 1000, "crossed": crossed, "best_return": 2600.0}


def test_median_ratios_pair_seeds_and_count_capped_runs():
    rs = [result("nitro", "ours", 0, 100.0, 0.01), result("nitro", "ours", 1, 200.0, 0.02),
          result("nitro", "ours", 2, 100.0, 0.01, crossed=False),
          result("sb3", "own", 0, 300.0, 0.02), result("sb3", "own", 1, 200.0, 0.01),
          result("sb3", "own", 2, 1200.0, 0.03, crossed=False), result("sb3", "own", 3, 50.0, 0.001)]
    s = ttt.summarize(rs)
    ratio = s["ratios"]["sb3/own/Hopper-v5"]
    assert ratio["seeds"] == [0, 1, 2], "seed 3 has no nitro run to pair with"
    assert ratio["per_seed_wall_ratio"] == [3.0, 1.0, 12.0] and ratio["wall_ratio"] == 3.0
    assert ratio["usd_ratio"] == pytest.approx(2.0)  # median of 2, 0.5, 3
    assert ratio["capped"] == {"peer": 1, "nitro": 1}
    assert s["table"]["sb3/own/Hopper-v5"]["median_wall_s"] == 250.0  # all four of its seeds
    assert s["nitro_faster_and_cheaper_than_every_peer"] is True
    slower = ttt.summarize(rs + [result("rllib", "ours", 0, 50.0, 0.5), result("rllib", "ours", 1, 50.0, 0.5)])
    assert slower["ratios"]["rllib/ours/Hopper-v5"]["wall_ratio"] == pytest.approx(0.375)
    assert slower["nitro_faster_and_cheaper_than_every_peer"] is False
    assert ttt.summarize([result("sb3", "own", 0, 1.0, 1.0)])["ratios"] == {}, "no nitro run: no ratio"


def test_the_plan_interleaves_systems_within_each_seed_and_refuses_unknown_names():
    runs = ttt.plan_runs(["nitro", "sb3"], ["Hopper-v5", "Walker2d-v5"], [0, 1])
    assert [r.name for r in runs[:6]] == ["nitro-ours-hopper-v5-s0", "sb3-own-hopper-v5-s0", "sb3-ours-hopper-v5-s0",
                                          "nitro-ours-walker2d-v5-s0", "sb3-own-walker2d-v5-s0",
                                          "sb3-ours-walker2d-v5-s0"]
    assert len(runs) == 12 and runs[6].seed == 1
    assert len(ttt.plan_runs(list(ttt.SYSTEMS), list(ttt.TARGETS), ttt.SEEDS)) == 90
    with pytest.raises(ValueError, match="--systems: unknown system 'sb2'"):
        ttt.plan_runs(["sb2"], ["Hopper-v5"], [0])
    with pytest.raises(ValueError, match="--envs: no target for 'Ant-v5'"):
        ttt.plan_runs(["nitro"], ["Ant-v5"], [0])
    assert ttt.estimate_hours(runs, 20.0) == pytest.approx(12 * 21 / 60)


def test_a_rerun_skips_finished_runs_and_retries_failed_ones(tmp_path):
    runs = ttt.plan_runs(["nitro", "sb3"], ["Hopper-v5"], [0])
    assert ttt.pending(runs, tmp_path) == runs
    ttt.result_path(tmp_path, runs[1]).write_text("{}")
    (tmp_path / f"{runs[0].name}.failed.json").write_text(json.dumps({"run": runs[0].name, "error": "x"}))
    assert ttt.pending(runs, tmp_path) == [runs[0], runs[2]]
    # execute() with nothing pending starts nothing (no system, no peer) and says so
    for run in runs:
        ttt.result_path(tmp_path, run).write_text("{}")
    ttt.execute(runs, tmp_path, 60.0, 20480, tmp_path / "no-peers")


@pytest.mark.slow  # a subprocess of the bench
def test_report_rebuilds_the_json_from_the_files_alone(tmp_path):
    for r in (result("nitro", "ours", 0, 100.0, 0.01), result("sb3", "ours", 0, 250.0, 0.005)):
        name = f"{r['system']}-{r['settings']}-hopper-v5-s0"
        (tmp_path / f"{name}.json").write_text(json.dumps({**r, "run": name}))
    (tmp_path / "rllib-own-hopper-v5-s0.failed.json").write_text(json.dumps({"run": "rllib-own-hopper-v5-s0",
                                                                             "error": "RuntimeError: boom"}))
    (tmp_path / "setup.json").write_text(json.dumps({"cleanrl": {"ok": False, "reason": "pins gym 0.23"}}))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "time_to_target.py"), "--report", "--results",
                           str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["benchmark"] == "time_to_target" and out["runs"] == 2
    assert out["median_ratios"]["sb3/ours/Hopper-v5"]["wall"] == 2.5
    assert out["median_ratios"]["sb3/ours/Hopper-v5"]["usd"] == 0.5
    assert out["per_seed"]["nitro/ours/Hopper-v5"]["wall_s"] == [100.0]
    assert out["failed_runs"] == [{"run": "rllib-own-hopper-v5-s0", "error": "RuntimeError: boom"}]
    assert out["peers"] == {"cleanrl": {"ok": False, "reason": "pins gym 0.23"}}
    assert out["nitro_faster_and_cheaper_than_every_peer"] is False


@pytest.mark.slow  # three subprocesses of the bench
def test_bad_flags_are_refused_with_the_flag_named(tmp_path):
    for args, message in ((["--cap-minutes", "0"], "--cap-minutes must be > 0"),
                          (["--systems", "nitro,ppo2"], "--systems: unknown system 'ppo2'"),
                          (["--eval-every-steps", "0"], "--eval-every-steps must be >= 1")):
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "time_to_target.py"), "--plan", "--results",
                               str(tmp_path), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)


@pytest.mark.slow  # a subprocess of the bench
def test_a_bare_run_only_plans_and_leaves_out_peers_that_cannot_run(tmp_path):
    (tmp_path / "setup.json").write_text(json.dumps({"cleanrl": {"ok": False, "reason": "needs OpenAI gym"},
                                                     "sb3": {"ok": True, "version": "2.9.2"}}))
    ttt.result_path(tmp_path, ttt.Run("nitro", "ours", "Hopper-v5", 0)).write_text("{}")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "time_to_target.py"), "--results", str(tmp_path),
                           "--systems", "nitro,sb3,cleanrl", "--envs", "Hopper-v5", "--seeds", "0,1",
                           "--cap-minutes", "10"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["plan"] == ["sb3-own-hopper-v5-s0", "sb3-ours-hopper-v5-s0", "nitro-ours-hopper-v5-s1",
                           "sb3-own-hopper-v5-s1", "sb3-ours-hopper-v5-s1"]
    assert out["finished"] == 1 and out["not_run"] == {"cleanrl": "needs OpenAI gym"}
    assert out["estimated_hours_at_most"] == round(5 * 11 / 60, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nitro-ours-hopper-v5-s0.json", "setup.json"], "ran nothing"
