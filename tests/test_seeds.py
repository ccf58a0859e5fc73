"""`nitro train --seeds N`: the seed jobs a spec becomes (seeds, ids, the budget split), their summary (IQM and
interval from nitro.stats, per-seed rows, exit code), flags that do not combine with it, and N jobs of CartPole
run at once through a real local system within one budget."""

from __future__ import annotations

import json
import math

import pytest

from nitro import stats
from nitro.client import cli
from nitro.client.commands import seeds
from nitro.client.commands.common import CliError
from nitro.client.multirun import BudgetPool, JobRun, final_return
from nitro.client.sdk import RoundReport, TrainingStatus
from nitro.v1 import training_pb2
from tests.system import shared_system


def test_seed_jobs_share_one_budget():
    group, total, jobs = seeds.seed_jobs({"env_id": "CartPole-v1", "seed": 7, "budget_usd": 0.3, "job_id": "g"}, 3)
    assert (group, total) == ("g", 0.3)
    assert [j.key for j in jobs] == [7, 8, 9]
    assert [j.spec["job_id"] for j in jobs] == ["g-s7", "g-s8", "g-s9"]
    assert [j.spec["seed"] for j in jobs] == [7, 8, 9]
    assert all(j.budget_usd == j.spec["budget_usd"] == pytest.approx(0.1) for j in jobs)
    assert sum(j.budget_usd for j in jobs) == pytest.approx(total)


def test_seed_jobs_defaults_and_long_ids():
    _, total, jobs = seeds.seed_jobs({"env_id": "CartPole-v1"}, 4)  # the spec's default seed and budget
    assert [j.key for j in jobs] == [0, 1, 2, 3] and total == 10.0
    assert jobs[0].spec["job_id"].startswith("cartpole-v1-") and jobs[0].spec["job_id"].endswith("-s0")
    _, _, jobs = seeds.seed_jobs({"env_id": "CartPole-v1", "job_id": "x" * 64, "seed": 100}, 12)
    assert all(len(j.spec["job_id"]) <= 64 for j in jobs) and jobs[-1].spec["job_id"].endswith("-s111")


@pytest.mark.parametrize("n", [0, 1, 65])
def test_seed_count_is_checked(n):
    with pytest.raises(CliError, match=r"--seeds: must be an integer in \[2, 64\]") as err:
        seeds.seed_jobs({"env_id": "CartPole-v1"}, n)
    assert err.value.exit_code == 2


@pytest.mark.parametrize("flags", [["--resume", "job-1"], ["--tensorboard", "tb"], ["--wandb-project", "p"]])
def test_flags_that_follow_one_job_are_refused(flags, capsys):
    assert cli.main(["train", "--target", "127.0.0.1:1", "--env", "CartPole-v1", "--seeds", "3", *flags]) == 2
    assert f"{flags[0]} follows one job" in capsys.readouterr().err


def _report(k: int, ret: float, evaluated: bool = True, cost: float = 0.0) -> RoundReport:
    return RoundReport(training_pb2.RoundReport(round=k, eval_return=ret, evaluated=evaluated,
                                                cloud_total_cost_usd=cost))


def _run(seed: int, returns: list[float], state=training_pb2.JOB_STATE_SUCCEEDED) -> JobRun:
    run = JobRun(seed, {"env_id": "CartPole-v1", "seed": seed}, 0.1, job_id=f"g-s{seed}")
    run.reports = [_report(k, r, cost=0.01 * (k + 1)) for k, r in enumerate(returns)]
    run.status = TrainingStatus(training_pb2.TrainingStatus(job_id=run.job_id, state=state,
                                                            cloud_total_cost_usd=0.01 * len(returns)))
    return run


def test_final_return_is_the_last_evaluated_round():
    assert final_return([_report(0, 5.0), _report(1, 9.0), _report(2, 0.0, evaluated=False)]) == 9.0
    assert math.isnan(final_return([_report(0, 5.0, evaluated=False)]))


@pytest.mark.slow  # matplotlib's plot: 1-3 s on the shared 2 cores
def test_summary_aggregates_final_returns_with_nitro_stats(tmp_path):
    runs = [_run(0, [10, 20, 30]), _run(1, [10, 15, 50]), _run(2, [10, 5, 1]), _run(3, [0, 0, 200]),
            _run(4, [1], training_pb2.JOB_STATE_STOPPED)]
    summary = seeds.summarise("g", runs, 0.5, reps=300)
    finals = [30, 50, 1, 200, 1]
    ci = stats.iqm_interval(finals, reps=300)
    fr = summary["final_return"]
    assert (fr["iqm"], fr["ci_low"], fr["ci_high"], fr["runs"]) == (ci.point, ci.low, ci.high, 5)
    assert fr["iqm"] == pytest.approx((1 + 30 + 50) / 3)
    assert summary["cloud_total_cost_usd"] == pytest.approx(0.01 * (3 + 3 + 3 + 3 + 1))
    assert [j["state"] for j in summary["jobs"]] == ["SUCCEEDED"] * 4 + ["STOPPED"]
    assert summary["curve"]["x"][0] == 0 and summary["curve"]["x"][-1] == 0  # seed 4 evaluated round 0 only
    assert seeds.exit_code(runs) == 3 and seeds.exit_code(runs[:4]) == 0
    text = seeds.table(summary, tmp_path)
    assert "IQM 27.00, 95% CI" in text and "over 5 seeds" in text and "g-s4" in text
    seeds.plot_seeds(tmp_path / "seeds.png", summary, runs)
    assert (tmp_path / "seeds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_budget_pool_counts_running_jobs_at_their_budget():
    pool = BudgetPool(1.0)
    assert pool.reserve("a", 0.4) and pool.reserve("b", 0.4)
    assert not pool.reserve("c", 0.4)  # 0.8 held: 0.2 left
    pool.update("a", 0.5)  # a passed its budget: counted at its spend
    assert pool.left_usd() == pytest.approx(0.1)
    pool.settle("b", 0.1)  # b ended at 0.1: 0.3 comes back
    assert pool.spent_usd == pytest.approx(0.1) and pool.left_usd() == pytest.approx(0.4)
    assert pool.reserve("c", 0.4)  # 0.30 + 0.10 ... within the tolerance
    pool.release("c")
    assert pool.left_usd() == pytest.approx(0.4)
    with pytest.raises(ValueError, match="finite number > 0"):
        BudgetPool(0)


# --- through a real local system ------------------------------------------------------------------------------

system = shared_system()
# Three CartPole jobs of 2 actors, each with a third: enough for the first round's estimate (the learner for
# FIRST_ROUND_LEARNER_S x LEARNER_ROUND_MARGIN, $0.00035 at c6i.large prices), then ~$0.00001 a round binds after
# some 10-20 rounds.
BUDGET = 0.0012


@pytest.mark.timeout(420)
def test_three_seeds_run_at_once_within_one_budget(system, tmp_path, capsys):
    out = tmp_path / "results"
    rc = cli.main(["train", "--target", system.learner_address, "--env", "CartPole-v1", "--preset", "fast",
                   "--steps-per-actor", "256", "--scaler", "fixed:2", "--rounds", "200", "--eval-episodes", "2",
                   "--eval-every", "5",
                   "--round-deadline", "60", "--budget", str(BUDGET), "--seed", "5", "--seeds", "3",
                   "--job-id", "cp", "--results-dir", str(out), "--no-progress"])
    text = capsys.readouterr().out
    summary = json.loads((out / "cp" / "seeds.json").read_text())
    jobs = summary["jobs"]
    assert [j["job_id"] for j in jobs] == ["cp-s5", "cp-s6", "cp-s7"]
    for j in jobs:
        job_summary = json.loads((out / "cp" / j["job_id"] / "summary.json").read_text())
        assert job_summary["spec"]["seed"] == j["seed"]
        assert job_summary["spec"]["budget_usd"] == pytest.approx(BUDGET / 3)
        assert j["rounds"] >= 1 and math.isfinite(j["final_return"])
    # Each job ended on its own third of the budget (a budget's end is a success), so the three spent within one.
    assert all(j["state"] == "SUCCEEDED" and j["message"].startswith("budget exhausted") for j in jobs), jobs
    assert rc == 0
    assert summary["cloud_total_cost_usd"] <= BUDGET
    finals = [j["final_return"] for j in jobs]
    assert summary["final_return"]["iqm"] == pytest.approx(stats.iqm(finals))
    assert summary["final_return"]["ci_low"] <= summary["final_return"]["iqm"] <= summary["final_return"]["ci_high"]
    # They ran at once: each job's rounds overlap the others' in time (its first report before another's last).
    created = [json.loads((out / "cp" / j["job_id"] / "summary.json").read_text()) for j in jobs]
    assert max(c["created_unix"] for c in created) < min(c["finished_unix"] for c in created)
    assert (out / "cp" / "seeds.png").exists() and "final return  IQM" in text
