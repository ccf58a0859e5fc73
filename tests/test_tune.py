"""`nitro tune`: the study file (format, errors naming the field and what is allowed, a trial's spec), the budget
rule, and a CartPole study through a real local system: a pruned trial's job stops, the trials spend within the
study's budget, and best.yaml is a --config file `nitro train` reads."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from nitro import spec_file, tuning
from nitro.client import cli
from nitro.spec import InvalidSpec
from tests.system import shared_system

BASE = {"env_id": "CartPole-v1", "preset": "fast", "rounds": 4, "steps_per_actor": 256}


def parse(doc: dict) -> tuning.StudyFile:
    return tuning.parse({"spec": BASE, **doc}, "study.yaml")


def test_a_study_file_and_the_trial_specs_it_makes():
    study = parse({"space": {"hyperparameters.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
                             "steps_per_actor": {"type": "int", "low": 128, "high": 512, "step": 128},
                             "scaler": {"type": "categorical", "choices": ["fixed:2", "fixed:4"]},
                             "scaler.i_max": {"type": "int", "low": 8, "high": 16}},
                   "pruner": {"type": "median", "n_warmup_steps": 2}, "sampler": {"seed": 3},
                   "enqueue": [{"hyperparameters.lr": 1e-3}]})
    assert [p.name for p in study.space] == ["hyperparameters.lr", "steps_per_actor", "scaler", "scaler.i_max"]
    assert study.pruner == {"type": "median", "n_warmup_steps": 2} and study.enqueue == ({"hyperparameters.lr": 1e-3},)
    tuning.check(study)
    spec = tuning.trial_spec(study.base, {"hyperparameters.lr": 5e-4, "scaler": "fixed:4", "scaler.i_max": 6},
                             "st-t0", 0.01)
    assert spec["hyperparameters"] == {"lr": 5e-4}
    assert spec["scaler"] == {"policy": "fixed", "fixed_actors": 4, "i_max": 6}
    # Each range is fine over the base spec; i_min 12 with i_max at its low end (10) is not.
    bad = parse({"space": {"scaler.i_min": {"type": "int", "low": 9, "high": 12},
                           "scaler.i_max": {"type": "int", "low": 10, "high": 64}}})
    with pytest.raises(tuning.StudyFileError, match=r"scaler.i_min = 12 with the others at their low end makes an "
                                                    r"invalid spec: scaler.i_min: must be <=") as err:
        tuning.check(bad)
    assert err.value.field == "space"
    assert (spec["job_id"], spec["budget_usd"], spec["budget_clock"]) == ("st-t0", 0.01, "cloud")
    assert spec["env_id"] == "CartPole-v1" and spec["rounds"] == 4


@pytest.mark.parametrize("doc,field,message", [
    ({"space": {}}, "space", "is required"),
    ({"space": {"x": {"type": "int", "low": 1, "high": 2}}, "pruners": {}}, "pruners", "unknown key; allowed: spec"),
    ({"space": {"hyperparameters.lr": {"type": "real", "low": 0, "high": 1}}}, "space.hyperparameters.lr.type",
     "must be one of float, int, categorical"),
    ({"space": {"hyperparameters.lr": {"type": "float", "low": 1e-2, "high": 1e-4}}}, "space.hyperparameters.lr.low",
     "must be < high"),
    ({"space": {"hyperparameters.lr": {"type": "float", "low": 0, "high": 1, "log": True}}},
     "space.hyperparameters.lr.low", "must be > 0 with log: true"),
    ({"space": {"rounds": {"type": "int", "low": 1.5, "high": 4}}}, "space.rounds.low", "must be an integer"),
    ({"space": {"rounds": {"type": "int", "low": 1, "hi": 4}}}, "space.rounds.hi",
     "unknown key; allowed: type, low, high, log, step"),
    ({"space": {"budget_usd": {"type": "float", "low": 1, "high": 2}}}, "space.budget_usd", "set for each trial"),
    ({"space": {"roundz": {"type": "int", "low": 1, "high": 2}}}, "space.roundz", "unknown spec field; allowed:"),
    ({"space": {"scaler.imax": {"type": "int", "low": 1, "high": 2}}}, "space.scaler.imax",
     "unknown scaler setting; allowed:"),
    ({"space": {"scaler": {"type": "categorical", "choices": []}}}, "space.scaler.choices", "non-empty list"),
    ({"space": {"hidden_sizes": {"type": "categorical", "choices": [[64], [128]]}}}, "space.hidden_sizes.choices",
     "choices are numbers, strings"),
    ({"space": {"rounds": {"type": "int", "low": 1, "high": 4}}, "pruner": {"type": "hyperband"}}, "pruner.type",
     "must be one of successive_halving, median, none"),
    ({"space": {"rounds": {"type": "int", "low": 1, "high": 4}},
      "pruner": {"type": "successive_halving", "reduction_factor": 1}}, "pruner.reduction_factor", "must be >= 2"),
    ({"space": {"rounds": {"type": "int", "low": 1, "high": 4}}, "enqueue": [{"epochs": 3}]}, "enqueue[0].epochs",
     "unknown key; allowed: rounds"),
    ({"space": {"rounds": {"type": "int", "low": 1, "high": 4}}, "sampler": {"sed": 1}}, "sampler.sed",
     "unknown key; allowed: seed, n_startup_trials"),
])
def test_bad_study_files_name_the_field_and_what_is_allowed(doc, field, message):
    with pytest.raises(tuning.StudyFileError, match=message) as err:
        parse(doc)
    assert err.value.field == field and "(in study.yaml)" in str(err.value)


@pytest.mark.parametrize("space,field,message", [
    ({"steps_per_actor": {"type": "int", "low": 0, "high": 256}}, "space.steps_per_actor",
     "0 makes an invalid spec: steps_per_actor"),
    ({"hyperparameters.lrr": {"type": "float", "low": 1e-4, "high": 1e-3}}, "space.hyperparameters.lrr",
     "makes an invalid spec: hyperparameters.lrr"),
])
def test_a_range_the_learner_would_refuse_fails_before_any_job(space, field, message):
    with pytest.raises(tuning.StudyFileError, match=message) as err:
        tuning.check(parse({"space": space}))
    assert err.value.field == field


def test_a_study_without_an_environment_is_refused():
    study = tuning.parse({"space": {"rounds": {"type": "int", "low": 1, "high": 4}}}, "s.yaml")
    with pytest.raises(InvalidSpec, match="is required"):
        tuning.check(study, "s.yaml")


def test_budget_flags_are_checked(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"spec": BASE, "space": {"rounds": {"type": "int", "low": 1, "high": 4}}}))
    argv = ["tune", str(path), "--target", "127.0.0.1:1"]
    assert cli.main([*argv, "--study-budget", "0.01", "--trial-budget", "0.02"]) == 2
    assert "--trial-budget (0.02) must be <= --study-budget (0.01)" in capsys.readouterr().err
    assert cli.main([*argv, "--study-budget", "0", "--trial-budget", "0.02"]) == 2
    assert "--study-budget: must be a finite number of dollars > 0" in capsys.readouterr().err
    path.write_text("space: {rounds: {type: int, low: 1}}\n")
    assert cli.main([*argv, "--study-budget", "1", "--trial-budget", "0.1"]) == 2
    assert "error: INVALID_ARGUMENT: space.rounds.high: is required" in capsys.readouterr().err


# --- a study through a real local system ------------------------------------------------------------------------

system = shared_system()
ROUNDS = 8
# A trial's job needs about $0.0004 to start (the first round's estimate: the learner for 15 s at c6i.large prices)
# and spends $0.00001-0.00002 a CartPole round (a pruned trial ~$0.00008, a whole one ~$0.00012 beside the grid on
# 2 cores). A study of $0.0014 with trials of $0.001 fits a trial only while the trials before it spent under
# $0.0004: some 3-7 trials, so the budget, not --trials (12), ends the study, and the first trial leaves room for
# the second however slow the machine.
STUDY_BUDGET, TRIAL_BUDGET, TRIALS = 0.0014, 0.001, 12


@pytest.mark.timeout(480)
def test_a_cartpole_study_prunes_and_stays_within_its_budget(system, tmp_path, capsys):
    study = {
        "spec": {"env_id": "CartPole-v1", "preset": "fast", "rounds": ROUNDS, "steps_per_actor": 256,
                 "scaler": "fixed:2", "eval_episodes": 2, "round_deadline_s": 60, "reproducible": True, "seed": 1},
        "space": {"hyperparameters.lr": {"type": "float", "low": 1e-7, "high": 3e-3, "log": True}},
        # Successive halving at round 3 with reduction factor 2: a trial below the best value reported there so
        # far stops. The first trial learns (the fast preset's rate); the second barely moves (1e-7), so it
        # reaches round 3 with the untrained policy's return and is pruned.
        "pruner": {"type": "successive_halving", "min_resource": 3, "reduction_factor": 2},
        "sampler": {"seed": 0},
        "enqueue": [{"hyperparameters.lr": 1e-3}, {"hyperparameters.lr": 1e-7}],
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    out = tmp_path / "results"
    rc = cli.main(["tune", str(path), "--target", system.learner_address, "--trials", str(TRIALS), "--parallel", "1",
                   "--study-budget", str(STUDY_BUDGET), "--trial-budget", str(TRIAL_BUDGET), "--name", "st",
                   "--results-dir", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    rows = list(csv.DictReader(open(out / "st" / "trials.csv")))
    summary = json.loads((out / "st" / "study.json").read_text())
    started = [r for r in rows if r["job_id"]]
    # The money: every trial's spend is its job's cloud bill; together within the study's budget.
    spent = [float(r["cloud_cost_usd"]) for r in started]
    assert sum(spent) <= STUDY_BUDGET and summary["spent_usd"] == pytest.approx(sum(spent))
    # One at a time, each trial started only when its whole budget fitted beside what the earlier ones spent.
    for k in range(len(started)):
        assert sum(spent[:k]) + TRIAL_BUDGET <= STUDY_BUDGET + 1e-9
    assert len(started) < TRIALS, "the study's budget, not --trials, ended it"
    assert sum(spent) + TRIAL_BUDGET > STUDY_BUDGET  # the next trial did not fit
    # Pruning: the second trial stopped at the rung, well before its last round.
    pruned = [r for r in started if r["state"] == "PRUNED"]
    assert rows[1]["state"] == "PRUNED", rows[:2]
    for r in pruned:
        assert r["job_state"] == "STOPPED" and r["stop_reason"].startswith("pruned at round")
        assert int(r["rounds"]) < ROUNDS
        rounds = json.loads((out / "st" / r["job_id"] / "summary.json").read_text())["rounds"]
        assert rounds == int(r["rounds"])
    assert rows[0]["state"] == "COMPLETE" and int(rows[0]["rounds"]) == ROUNDS
    # best.yaml is a spec file nitro train reads: the base with the best trial's parameters.
    best = spec_file.load(out / "st" / "best.yaml")
    best_row = max((r for r in rows if r["state"] == "COMPLETE"), key=lambda r: float(r["value"]))
    assert best["hyperparameters"]["lr"] == pytest.approx(float(best_row["param:hyperparameters.lr"]))
    assert best["env_id"] == "CartPole-v1" and "job_id" not in best and best["budget_usd"] == TRIAL_BUDGET
    assert "best          trial" in text and summary["best"]["trial"] == int(best_row["trial"])
    assert summary["plots"]["plot_optimization_history"] == "written"
    assert (out / "st" / "optimization_history.png").exists()
