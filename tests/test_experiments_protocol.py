"""The evaluation protocol: aggregates on known inputs, the derived controls, grid planning and resumption,
committing results, the clone at a fixed commit, the minions scheme's scheduler and the Stellaris learner mode,
and tiny real runs through the local system."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from experiments import protocol as P
from experiments.harness import Run

pytestmark = pytest.mark.timeout(300)


# -- aggregates ---------------------------------------------------------------------------------------------


def test_iqm_on_known_inputs():
    assert P.iqm(range(1, 9)) == pytest.approx(4.5)  # 25% off each end of 1..8: mean(3, 4, 5, 6)
    assert P.iqm([0, 1, 2, 3, 4, 5, 6, 7, 8, 100]) == pytest.approx(4.5)  # 2 off each end: mean(2..7); 100 ignored
    assert P.iqm([7.0]) == 7.0


def test_iqm_interval_is_a_bootstrap_ci_around_the_iqm():
    est = P.iqm_interval({"flat": [3, 3, 3], "spread": list(range(1, 9))}, reps=300)
    assert est["flat"] == (3.0, 3.0, 3.0)  # every resample of a constant is that constant
    point, lo, hi = est["spread"]
    assert point == pytest.approx(4.5) and 1.0 <= lo < point < hi <= 8.0
    assert P.iqm_interval({"spread": list(range(1, 9))}, reps=300) == {"spread": est["spread"]}  # seeded


@pytest.mark.slow
def test_probability_of_improvement_on_known_inputs():
    # x = 3, 4, 5 vs y = 1, 2, 3.5: 8 of the 9 pairs favour x
    p, lo, hi = P.probability_of_improvement([3, 4, 5], [1, 2, 3.5], reps=300)
    assert p == pytest.approx(8 / 9) and 0.0 <= lo <= p <= hi <= 1.0
    # ties count half: (1 vs 1) twice = 1, (2 vs 1) twice = 2 -> 3 / 4
    assert P.probability_of_improvement([1, 2], [1, 1], reps=300)[0] == pytest.approx(0.75)
    assert P.probability_of_improvement([1, 1], [1, 1], reps=50) == (0.5, 0.5, 0.5)
    assert P.probability_of_improvement([1, 2, 3], [4, 5], reps=50)[0] == 0.0


def test_evaluations_final_return_and_cost():
    rounds = [{"round": k, "eval_return": float(10 * k) if k % 2 else math.nan, "evaluated": bool(k % 2),
               "total_env_steps": 100 * (k + 1), "cloud_total_cost_usd": 0.01 * (k + 1), "total_cost_usd": 1.0}
              for k in range(7)]
    evals = P.evaluations(rounds, eval_every=2)
    assert [e["round"] for e in evals] == [1, 3, 5]
    assert evals[0] == {"round": 1, "env_steps": 200, "usd": pytest.approx(0.02), "return": 10.0}
    assert P.final_return(evals, 3) == pytest.approx(30.0) and P.final_return(evals, 2) == pytest.approx(40.0)
    assert math.isnan(P.final_return([], 3))
    assert P.run_cost(rounds) == (pytest.approx(0.07), "cloud")
    # Reports without the evaluated flag or the cloud bill: the schedule, and this machine's dollars.
    old = [{"round": k, "eval_return": float(k), "total_env_steps": k, "total_cost_usd": 0.5 * k} for k in range(6)]
    assert [e["round"] for e in P.evaluations(old, eval_every=4)] == [3, 5]  # (k+1) % 4 == 0, and the last
    assert P.run_cost(old) == (2.5, "machine")


def test_curve_on_grid_interpolates_each_run():
    grid = np.array([0.0, 5.0, 10.0])
    assert list(P.curve_on_grid([(10.0, 20.0), (0.0, 0.0)], grid)) == [0.0, 10.0, 20.0]
    c = P.iqm_curve([[(0.0, 0.0), (10.0, 10.0)], [(0.0, 2.0), (10.0, 12.0)], [(2.0, 0.0), (8.0, 0.0)]], n=3,
                    reps=50)
    assert list(c["x"]) == [2.0, 5.0, 8.0]  # the range every run covers
    assert P.iqm_curve([[(1.0, 1.0)], [(1.0, 2.0)]]) is None  # a single point: no curve


# -- derived controls ---------------------------------------------------------------------------------------


def test_nbar_is_nitros_mean_actor_count_rounded_half_up():
    assert P.nbar([{"actors_launched": n} for n in (8, 8, 9)]) == (8, pytest.approx(25 / 3))
    assert P.nbar([{"actors_launched": n} for n in (8, 9)]) == (9, 8.5)


def test_shuffled_counts_permute_nitros_undecayed_scores():
    d = 0.5
    u = [1.0, 0.5, 0.25, 0.0]  # undecayed scores of rounds 0..3; round 4's score plans nothing
    rounds = [{"score": u[k] * d ** k} for k in range(4)] + [{"score": 0.9}]
    counts, how = P.shuffled_actor_counts(rounds, d, 1, 8, 5, (0, 3))
    perm = how["permutation"]
    assert sorted(perm) == [0, 1, 2, 3] and how["undecayed_scores"] == u
    # round 0: no score -> I_min; round j: clip(round(8 * u[perm[j-1]] * d^(j-1)), 1, 8), by hand
    expected = [1] + [min(8, max(1, math.floor(8 * u[perm[j - 1]] * d ** (j - 1) + 0.5))) for j in range(1, 5)]
    assert counts == expected
    assert P.shuffled_actor_counts(rounds, d, 1, 8, 5, (0, 3))[0] == counts  # seeded: the same every time
    others = {tuple(P.shuffled_actor_counts(rounds, d, 1, 8, 5, (0, s))[1]["permutation"]) for s in range(8)}
    assert len(others) > 1
    # longer than the nitro run (budget mode): further permutations of the same scores
    _, how = P.shuffled_actor_counts(rounds, d, 1, 8, 11, (0, 3))
    assert len(how["permutation"]) == 10
    assert sorted(how["permutation"][:4]) == sorted(how["permutation"][4:8]) == [0, 1, 2, 3]
    # the unshuffled identity: one score, one position
    assert P.shuffled_actor_counts([{"score": 0.5}, {"score": 0.0}], 0.96, 8, 64, 2, (0, 0))[0] == [8, 32]


def test_scheme_tokens():
    assert P.resolve_schemes(["max", "fixed:imin", "shuffled", "fixed:nbar"], 8) == \
        ["nitro", "max", "fixed:8", "shuffled", "fixed-nbar"]
    for bad in ("boost", "fixed:x", "replay", "minions"):
        with pytest.raises(ValueError, match="scheme"):
            P.resolve_schemes([bad], 8)
    with pytest.raises(ValueError, match="--scheduler PATH"):
        P.resolve_schemes(["minions"], 8)
    assert P.resolve_schemes(["minions", "nitro"], 8, scheduler=True) == ["nitro", "minions"]


# -- planning, execution order, resumption (without a system) -----------------------------------------------------


def tiny(tmp_path: Path, **kw) -> P.Protocol:
    args = dict(name="t", env_id="CartPole-v1", preset="fast", rounds=4, steps_per_actor=64, i_min=1, i_max=4,
                seeds=(0, 1), eval_every=2, eval_episodes=2, final_evals=2)
    args.update(kw)
    return P.Protocol(**args)


class FakeRunner:
    """Writes what run_one writes, with actors from the spec; nitro's actors and scores are scripted."""

    NITRO = [(1, 0.5), (2, 0.25), (3, 0.0), (2, 0.1)]

    def __init__(self):
        self.calls: list[str] = []

    def __call__(self, run: Run, out_dir: Path) -> dict:
        self.calls.append(run.run_id)
        spec = run.spec()
        sc = spec["scaler"]
        d = Path(out_dir) / run.run_id
        d.mkdir(parents=True, exist_ok=True)
        (d / "run.json").write_text(json.dumps(asdict(run)))
        rows = []
        for k in range(run.rounds):
            if sc["policy"] == "nitro":
                actors, score = self.NITRO[k]
            elif sc["policy"] == "fixed":
                actors, score = sc["fixed_actors"], 0.0
            elif sc["policy"] == "replay":
                actors, score = int(sc["actors_by_round"].split(",")[k]), 0.0
            else:
                actors, score = run.i_max, 0.0
            rows.append({"round": k, "actors_launched": actors, "score": score, "evaluated": k % 2 == 1,
                         "eval_return": float(actors * 10 + k) if k % 2 else math.nan,
                         "total_env_steps": 64 * actors * (k + 1), "cloud_total_cost_usd": 0.001 * actors * (k + 1)})
        (d / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        summary = {"state": "SUCCEEDED", "message": "", "spec": spec, "wall_s": 0.1}
        (d / "summary.json").write_text(json.dumps(summary))
        return summary


@pytest.mark.slow
def test_plan_waits_for_nitro_then_derives_and_execution_resumes(tmp_path):
    proto, out = tiny(tmp_path), tmp_path / "grid"
    planned = P.plan(proto, out)
    assert [(p.scheme, p.seed) for p in planned] == [
        (s, seed) for seed in (0, 1) for s in ("nitro", "fixed:1", "max", "schedule", "nitro-floor", "fixed-nbar",
                                               "shuffled")]
    assert [p.scheme for p in planned if p.run is None] == ["fixed-nbar", "shuffled"] * 2
    assert all("waits for" in p.why for p in planned if p.run is None)

    fake, lines = FakeRunner(), []
    res = P.execute(proto, out, runner=fake, chunk=6, commit=False, log=lines.append)
    assert res == {"done": 6, "total": 14, "ran": 6}
    # nitro of seed 0 first; its derived runs follow the same seed's independent ones, before seed 1
    assert [c.split("-ppo-")[1] for c in fake.calls] == ["nitro-s0", "fixed-1-s0", "max-s0", "schedule-s0",
                                                        "nitro-floor-s0", "fixed-nbar-s0"]
    assert lines[0].startswith("t: 14 runs, 0 already done, 14 to go")
    assert any(line.startswith("[6/14] cartpole-v1-ppo-fixed-nbar-s0") for line in lines)

    nbar_run = next(p.run for p in P.plan(proto, out) if p.scheme == "fixed-nbar" and p.seed == 0)
    assert nbar_run.spec()["scaler"] == {"policy": "fixed", "i_min": 1, "i_max": 4, "decay": 0.96, "fixed_actors": 2}
    assert nbar_run.meta["derived_from"] == "cartpole-v1-ppo-nitro-s0" and nbar_run.meta["nbar_mean"] == 2.0
    saved = json.loads((out / "runs" / nbar_run.run_id / "run.json").read_text())["meta"]
    assert saved["nbar"] == 2 and saved["scheme"] == "fixed-nbar"
    shuffled = next(p.run for p in P.plan(proto, out) if p.scheme == "shuffled" and p.seed == 0)
    counts, _ = P.shuffled_actor_counts([{"score": s} for _, s in FakeRunner.NITRO], 0.96, 1, 4, 4, (0, 0))
    assert shuffled.spec()["scaler"]["policy"] == "replay"
    assert shuffled.spec()["scaler"]["actors_by_round"] == ",".join(map(str, counts))

    # Resume: finished runs are skipped, an interrupted one (no summary) is redone.
    (out / "runs" / fake.calls[1] / "summary.json").unlink()
    fake2 = FakeRunner()
    res = P.execute(proto, out, runner=fake2, commit=False, log=lines.append)
    assert res == {"done": 14, "total": 14, "ran": 9}
    assert fake2.calls[0] == fake.calls[1] and not set(fake2.calls[1:]) & set(fake.calls)
    fake3 = FakeRunner()
    assert P.execute(proto, out, runner=fake3, commit=False, log=lines.append)["ran"] == 0 and not fake3.calls

    numbers = P.report(proto, out, "python -m experiments protocol (test)", reps=100, log=lambda *_: None)
    assert numbers["schemes"]["fixed-nbar"]["final"] == [22.0] * 2  # actors 2: evals 21 and 23, their mean
    table = (out / "table.md").read_text()
    assert "fixed:N̄ (nitro's mean) = 2, 2" in table and "P(nitro > scheme)" in table
    assert (out / "curves.png").stat().st_size > 0

    # Another scale into the same directory is refused, more seeds are not.
    with pytest.raises(SystemExit, match="another scale"):
        P.execute(tiny(tmp_path, rounds=5), out, runner=FakeRunner(), commit=False, log=lines.append)
    assert P.execute(tiny(tmp_path, seeds=(0, 1, 2)), out, runner=FakeRunner(), commit=False,
                     log=lines.append)["ran"] == 7


def test_a_failed_nitro_run_leaves_its_derived_controls_unplanned(tmp_path):
    proto, out = tiny(tmp_path, seeds=(0,), schemes=("nitro", "fixed:nbar")), tmp_path / "grid"
    run = proto.run("nitro", 0)
    d = out / "runs" / run.run_id
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"state": "FAILED", "message": "boom"}))
    (p,) = [p for p in P.plan(proto, out) if p.scheme == "fixed-nbar"]
    assert p.run is None and "ended FAILED" in p.why


# -- git: committing results, the clone ---------------------------------------------------------------------


def git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "main"
    r.mkdir()
    git("init", "-q", cwd=r)
    git("config", "user.email", "t@example.com", cwd=r)
    git("config", "user.name", "t", cwd=r)
    (r / ".gitignore").write_text("/results/\n")
    (r / "code.py").write_text("x = 1\n")
    git("add", ".", cwd=r)
    git("commit", "-q", "-m", "one", cwd=r)
    return r


def test_commit_results_commits_only_the_results_path(repo):
    (repo / "code.py").write_text("x = 2\n")
    git("add", "code.py", cwd=repo)  # someone else's staged change stays out of the commit
    grid = repo / "docs" / "grid"
    (grid / "runs" / "a").mkdir(parents=True)
    (grid / "runs" / "a" / "summary.json").write_text("{}")
    assert P.commit_results(grid, "protocol t: a", log=lambda *_: None)
    assert git("show", "--name-only", "--format=%s", "HEAD", cwd=repo).splitlines() == \
        ["protocol t: a", "", "docs/grid/runs/a/summary.json"]
    assert git("diff", "--cached", "--name-only", cwd=repo) == "code.py"
    assert not P.commit_results(grid, "nothing new", log=lambda *_: None)
    (repo / "results").mkdir()
    assert P.git_toplevel(repo / "results") is None  # ignored: never committed
    assert P.git_toplevel(repo.parent) is None


def test_clone_at_a_fixed_commit(repo, tmp_path):
    (repo / ".venv").mkdir()
    first = git("rev-parse", "HEAD", cwd=repo)
    clone = tmp_path / "clone"
    assert P.ensure_clone(repo, clone, "HEAD", log=lambda *_: None) == first
    assert git("rev-parse", "HEAD", cwd=clone) == first and (clone / "code.py").read_text() == "x = 1\n"
    assert (clone / ".venv").is_symlink() and (clone / ".venv").resolve() == (repo / ".venv").resolve()

    (repo / "code.py").write_text("x = 3\n")  # edits in the main tree never reach the clone
    git("commit", "-q", "-am", "two", cwd=repo)
    assert (clone / "code.py").read_text() == "x = 1\n"
    assert P.ensure_clone(repo, clone, first, log=lambda *_: None) == first  # reused as it is

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (clone / P.LOCK_NAME).write_text(f"{sleeper.pid}\n")
        with pytest.raises(SystemExit, match="runs there"):
            P.ensure_clone(repo, clone, "HEAD", log=lambda *_: None)
    finally:
        sleeper.kill()
        sleeper.wait()
    (clone / P.LOCK_NAME).unlink()
    second = P.ensure_clone(repo, clone, "HEAD", log=lambda *_: None)
    assert second != first and (clone / "code.py").read_text() == "x = 3\n"


def test_strip_removes_flags_and_their_values():
    argv = ["--smoke", "--clone", "/c", "--commit=HEAD", "--rounds", "3", "--background"]
    assert P._strip(argv, {"--clone": True, "--commit": True, "--background": False}) == ["--smoke", "--rounds", "3"]


# -- real runs through the local system ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_runner(tmp_path_factory):
    """One local system for this module's real runs (starting and stopping one takes longer than their runs)."""
    runner = P.LocalRunner(tmp_path_factory.mktemp("state"), concurrency=4)
    yield runner
    runner.close()


@pytest.mark.system
def test_end_to_end_protocol_on_cartpole(tmp_path, local_runner):
    proto = P.Protocol(name="e2e", env_id="CartPole-v1", preset="fast", rounds=4, steps_per_actor=64, i_min=1,
                       i_max=3, seeds=(0,), eval_every=2, eval_episodes=2, final_evals=2)
    out, lines = tmp_path / "grid", []
    res = P.execute(proto, out, runner=local_runner, commit=False, log=lines.append)
    assert res == {"done": 7, "total": 7, "ran": 7}, lines
    for p in P.plan(proto, out):
        d = out / "runs" / p.run.run_id
        rounds = [json.loads(x) for x in (d / "rounds.jsonl").read_text().splitlines()]
        summary = json.loads((d / "summary.json").read_text())
        assert summary["state"] == "SUCCEEDED" and [r["round"] for r in rounds] == [0, 1, 2, 3], p.run.run_id
        assert [r["round"] for r in rounds if r["evaluated"]] == [1, 3]  # eval_every 2 (and the last round)
        assert summary["spec"]["eval_every"] == 2 and summary["protocol"]["scheme"] == p.scheme
    nitro = [json.loads(x) for x in (out / "runs" / "cartpole-v1-ppo-nitro-s0" / "rounds.jsonl").read_text()
             .splitlines()]
    shuffled = [json.loads(x) for x in (out / "runs" / "cartpole-v1-ppo-shuffled-s0" / "rounds.jsonl").read_text()
                .splitlines()]
    meta = json.loads((out / "runs" / "cartpole-v1-ppo-shuffled-s0" / "run.json").read_text())["meta"]
    assert [r["actors_launched"] for r in shuffled] == meta["actors_by_round"]
    assert sorted(meta["undecayed_scores"]) == sorted(min(1.0, r["score"] / 0.96 ** k) for k, r in
                                                      enumerate(nitro[:3]))
    nbar = json.loads((out / "runs" / "cartpole-v1-ppo-fixed-nbar-s0" / "run.json").read_text())["meta"]["nbar"]
    assert nbar == P.nbar(nitro)[0]

    P.report(proto, out, "python -m experiments protocol --smoke (test)", reps=100, log=lines.append)
    table = (out / "table.md").read_text()
    for name in ("nitro", "fixed:1 (I_min)", "max (3)", "fixed:N̄", "schedule (decay only)", "shuffled scores",
                 "nitro + artifact floor"):
        assert f"| {name}" in table
    assert "modelled cloud USD" in table and "7 of 7 runs finished." in table
    assert "python -m experiments protocol --smoke (test)" in table
    assert (out / "curves.png").stat().st_size > 10_000
    assert json.loads((out / "report.json").read_text())["schemes"]["nitro"]["final_iqm_ci"] is not None


@pytest.mark.slow
def test_budget_mode_specs_and_report(tmp_path):
    """Budget mode sends budget_usd with budget_clock "cloud" (checked by the real spec code) and reports
    whether the budget stopped every run. (A real budget-bound run needs more than the scaler's first-round
    reserve of 10 s of learner time, $0.0085, i.e. dozens of CartPole rounds: see docs/results.md.)"""
    from nitro.client.sdk import spec_to_proto
    from nitro.spec import from_proto, validate

    proto = tiny(tmp_path, seeds=(0,), schemes=("nitro", "max", "fixed:nbar", "shuffled"), budget_usd=0.02)
    for p in P.plan(proto, tmp_path / "empty"):
        if p.run is not None:
            spec = validate(from_proto(spec_to_proto(p.run.spec())))
            assert (spec.budget_usd, spec.budget_clock, spec.eval_every) == (0.02, "cloud", 2)
    assert validate(from_proto(spec_to_proto(tiny(tmp_path).run("nitro", 0).spec()))).budget_usd == P.UNLIMITED_USD

    class Budgeted(FakeRunner):
        def __call__(self, run, out_dir):
            summary = super().__call__(run, out_dir)
            if run.scaler != "max":  # max keeps its budget: the report must say so
                summary["message"] = "budget exhausted: scaled down"
            (Path(out_dir) / run.run_id / "summary.json").write_text(json.dumps(summary))
            return summary

    out = tmp_path / "grid"
    P.execute(proto, out, runner=Budgeted(), commit=False, log=lambda *_: None)
    d = P.report(proto, out, "test", reps=50, log=lambda *_: None)["schemes"]
    assert d["nitro"]["budget_bound"] == [True] and d["max"]["budget_bound"] == [False]
    table = (out / "table.md").read_text()
    assert "runs the budget stopped: nitro 1/1, max (4) 0/1, fixed:N̄ (nitro's mean) 1/1" in table
    assert "**Warning**: the budget did not bind for every run of ['max']" in table


def test_budget_below_the_first_round_reserve_is_refused():
    reserve = P.first_round_reserve_usd()
    assert reserve == pytest.approx(10.0 * 0.085 / 3600)  # FIRST_ROUND_LEARNER_S of the default learner's price
    args = P.build_parser("protocol-budget").parse_args(["--smoke", "--budget", str(reserve / 2)])
    with pytest.raises(ValueError, match="first-round"):
        P.protocol_from_args(args, "protocol-budget")
    args = P.build_parser("protocol-budget").parse_args(["--smoke", "--budget", "0.05"])
    proto = P.protocol_from_args(args, "protocol-budget")
    assert proto.budget_usd == 0.05 and proto.rounds == 40 and proto.name == "protocol-budget-cartpole-v1-ppo-fast-smoke"
    proto = P.protocol_from_args(P.build_parser("protocol").parse_args([]), "protocol")
    assert (proto.env_id, proto.preset, proto.rounds, proto.i_min, proto.i_max, proto.steps_per_actor,
            len(proto.seeds), proto.budget_usd) == ("Hopper-v5", "tuned", 50, 8, 64, 512, 10, None)


def test_paired_difference_uses_common_seeds_only():
    from experiments.protocol import paired_difference

    got = paired_difference({0: 10.0, 1: 20.0, 2: 30.0, 3: 5.0}, {0: 8.0, 1: 25.0, 2: 27.0}, reps=500)
    assert got["seeds"] == 3 and got["wins"] == 2
    assert got["mean"] == pytest.approx((2.0 - 5.0 + 3.0) / 3)
    assert got["low"] <= got["mean"] <= got["high"] and got["low"] >= -5.0 and got["high"] <= 3.0
    assert paired_difference({0: 1.0}, {1: 2.0}) is None


@pytest.mark.slow
def test_the_table_covers_every_scheme_and_seed_the_grid_holds(tmp_path):
    """A second command adding schemes on fewer seeds (max, the floor) must not leave a table without the first's."""
    out = tmp_path / "grid"
    first = tiny(tmp_path, schemes=("nitro", "fixed:imin"))
    P.execute(first, out, runner=FakeRunner(), commit=False, log=lambda *_: None)
    second = tiny(tmp_path, schemes=("max",), seeds=(0,))
    P.execute(second, out, runner=FakeRunner(), commit=False, log=lambda *_: None)
    assert set(P.report(second, out, "t", reps=20, log=lambda *_: None)["schemes"]) == {"max"}  # the old table
    whole = P.whole_grid(second, out)
    assert whole.schemes == ("nitro", "fixed:1", "max") and whole.seeds == (0, 1)
    numbers = P.report(whole, out, "t", reps=20, log=lambda *_: None)["schemes"]
    assert set(numbers) == {"nitro", "fixed:1", "max"} and len(numbers["max"]["final"]) == 1
    assert P.whole_grid(second, tmp_path / "nowhere") == second


@pytest.mark.slow
def test_a_scheme_added_on_fewer_seeds_does_not_leave_the_grid_partial(tmp_path):
    """grid.json keeps the union of seeds and schemes; the count of planned runs must not multiply them out."""
    out = tmp_path / "grid"
    first = tiny(tmp_path, schemes=("nitro", "fixed:imin"))
    second = tiny(tmp_path, schemes=("max",), seeds=(0,))
    for proto in (first, second):
        P.execute(proto, out, runner=FakeRunner(), commit=False, log=lambda *_: None)
    record = out / P.PLANNED_FILE
    assert json.loads(record.read_text()) == {"nitro": [0, 1], "fixed:1": [0, 1], "max": [0]}
    P.report_whole_grid(second, out, "t", reps=20, commit=False)
    assert "5 of 5 runs finished." in (out / "table.md").read_text()
    # Reporting (--report-only) records nothing, whatever schemes and seeds it is given.
    P.report_whole_grid(tiny(tmp_path, schemes=("max",), seeds=(0, 1)), out, "t", reps=20, commit=False)
    assert json.loads(record.read_text())["max"] == [0] and "5 of 5 runs finished." in (out / "table.md").read_text()
    # A command that asked for a run not finished yet leaves the grid partial.
    P.record_planned(tiny(tmp_path, schemes=("max",), seeds=(0, 1)), out)
    P.report_whole_grid(second, out, "t", reps=20, commit=False)
    assert "5 of 6 runs finished (partial)." in (out / "table.md").read_text()
    # A grid without the record (older code ran it) counts every scheme on every seed, as before.
    record.unlink()
    P.report_whole_grid(second, out, "t", reps=20, commit=False)
    assert "5 of 6 runs finished (partial)." in (out / "table.md").read_text()


@pytest.mark.slow
def test_a_grid_run_from_a_clone_is_reported_whole_by_this_trees_code(repo, tmp_path, monkeypatch, capsys):
    """A grid runs from a clone at a fixed commit whose code may report only its own command's schemes; the
    command that started it then rebuilds the table over every scheme and seed the out dir holds."""

    cli = ["--env", "CartPole-v1", "--preset", "fast", "--rounds", "4", "--steps-per-actor", "64", "--i-min", "1",
           "--i-max", "4", "--eval-every", "2", "--eval-episodes", "2", "--final-evals", "2", "--name", "t"]
    first = P.protocol_from_args(P.build_parser("protocol").parse_args([*cli, "--schemes", "nitro,fixed:imin",
                                                                        "--seeds", "2"]), "protocol")
    out = tmp_path / "grid"
    P.execute(first, out, runner=FakeRunner(), commit=False, log=lambda *_: None)
    P.execute(replace(first, schemes=("max",), seeds=(0,)), out, runner=FakeRunner(), commit=False, log=lambda *_: None)
    (repo / "experiments").mkdir()
    (repo / "experiments" / "protocol.py").write_text("")
    git("add", "experiments", cwd=repo)
    git("commit", "-q", "-m", "experiments", cwd=repo)
    python = repo / ".venv" / "bin" / "python"  # the clone's interpreter: runs nothing, writes no table
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\ntouch "$0.ran"\nexit 0\n')
    python.chmod(0o755)
    monkeypatch.setenv("NITRO_PROTOCOL_MAIN_REPO", str(repo))
    rc = P.main("protocol", [*cli, "--schemes", "max", "--seed-list", "0", "--clone", str(tmp_path / "clone"),
                             "--commit", "HEAD", "--out", str(out), "--no-commit-results", "--reps", "20"])
    assert rc == 0 and Path(f"{python}.ran").exists()
    table = (out / "table.md").read_text()
    assert "| nitro |" in table and "| fixed:1" in table and "| max (4)" in table, table
    # A restarted queue passes the finished command again: the clone is not run and the table stays.
    Path(f"{python}.ran").unlink()
    capsys.readouterr()
    assert P.main("protocol", [*cli, "--schemes", "max", "--seed-list", "0", "--clone", str(tmp_path / "clone"),
                               "--commit", "HEAD", "--out", str(out), "--no-commit-results", "--reps", "20"]) == 0
    assert not Path(f"{python}.ran").exists() and "nothing to run" in capsys.readouterr().out
    assert (out / "table.md").read_text() == table


# -- minions (a pre-trained scheduler) and learner mode stellaris -------------------------------------------------


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory) -> str:
    """A real `nitro pretrain-minions` checkpoint, as small as it gets: 2 CartPole jobs of 2 rounds, I_max 3."""
    from nitro.training.minions_pretrain import PretrainSettings, pretrain

    out = tmp_path_factory.mktemp("sched") / "cartpole-i3.npz"
    settings = PretrainSettings("CartPole-v1", episodes=2, episodes_per_update=2, rounds_per_episode=2, i_max=3,
                                steps_per_actor=32, preset="fast", eval_episodes=1, holdout_jobs=0, out=str(out))
    return pretrain(settings, log=lambda *_: None).path


def other_scheduler(path: Path, i_max: int = 3, seed: int = 1) -> str:
    """A valid scheduler checkpoint that no pre-training wrote (random weights, no pre-training record)."""
    from nitro.scaling import minions as m

    rng = np.random.default_rng(seed)
    state = {k: rng.normal(0.0, 0.5, shape).astype(np.float32) for k, shape in m.weight_shapes(i_max).items()}
    state["obs_mean"], state["obs_var"] = np.zeros(m.OBS_DIM, np.float32), np.ones(m.OBS_DIM, np.float32)
    return m.save_checkpoint(path, state, i_max)


def cli_protocol(tmp_path: Path, *flags: str) -> P.Protocol:
    args = P.build_parser("protocol").parse_args(["--smoke", "--i-max", "3", "--out", str(tmp_path / "grid"), *flags])
    return P.protocol_from_args(args, "protocol")


def test_minions_and_stellaris_options_are_refused_where_the_system_refuses(scheduler, tmp_path):
    with pytest.raises(ValueError, match="pass --scheduler PATH"):
        cli_protocol(tmp_path, "--schemes", "nitro,minions")
    with pytest.raises(ValueError, match="--scheduler: only the scheme minions uses it"):
        cli_protocol(tmp_path, "--schemes", "nitro", "--scheduler", scheduler)
    with pytest.raises(ValueError, match=r"scheduler \(--scheduler\): no file at"):
        cli_protocol(tmp_path, "--schemes", "minions", "--scheduler", str(tmp_path / "none.npz"))
    # without --schemes, --scheduler adds minions to the default schemes; the spec names the file
    proto = cli_protocol(tmp_path, "--scheduler", scheduler)
    assert proto.schemes == tuple(P.resolve_schemes(P.DEFAULT_SCHEMES, 1)) + ("minions",)
    assert proto.run("minions", 0).spec()["scaler"]["scheduler"] == scheduler
    assert proto.scheduler_sha256 == P.file_sha256(scheduler) and "scheduler" not in proto.scale()
    # what the learner refuses, with the learner's own status and reason (nitro.spec.validate, refusal)
    with pytest.raises(ValueError, match=r"scheme minions: .*FAILED_PRECONDITION: scaler.scheduler: .*i_max=4"):
        cli_protocol(tmp_path, "--schemes", "minions", "--scheduler", other_scheduler(tmp_path / "i4.npz", 4))
    with pytest.raises(ValueError, match=r"scheme minions: .*INVALID_ARGUMENT: reproducible: .*minions"):
        cli_protocol(tmp_path, "--schemes", "minions", "--scheduler", scheduler, "--reproducible")
    with pytest.raises(ValueError, match=r"scheme nitro: .*INVALID_ARGUMENT: reproducible: .*learner_mode"):
        cli_protocol(tmp_path, "--learner-mode", "stellaris", "--reproducible")
    with pytest.raises(SystemExit):  # argparse: the choices are nitro.spec.LEARNER_MODES
        P.build_parser("protocol").parse_args(["--learner-mode", "async"])
    st = cli_protocol(tmp_path, "--learner-mode", "stellaris", "--schemes", "nitro,fixed:imin,minions",
                      "--scheduler", scheduler)
    assert st.name == "protocol-cartpole-v1-ppo-fast-stellaris-smoke" and st.scale()["learner_mode"] == "stellaris"
    assert {st.run(s, 0).spec()["learner_mode"] for s in st.schemes} == {"stellaris"}
    assert "learner_mode" not in cli_protocol(tmp_path).run("nitro", 0).spec()  # central: the spec's default
    # a grid written before learner_mode existed is a central grid
    old, out = tiny(tmp_path), tmp_path / "old"
    out.mkdir()
    scale = {k: v for k, v in old.scale().items() if k != "learner_mode"}
    (out / "grid.json").write_text(json.dumps({"name": "t", "scale": scale, "seeds": [0], "schemes": ["nitro"]}))
    assert P.check_out_dir(old, out) == old
    with pytest.raises(SystemExit, match="learner_mode: 'central' there, 'stellaris' now"):
        P.check_out_dir(replace(old, learner_mode="stellaris"), out)


@pytest.mark.slow
def test_a_grid_pins_its_minions_scheduler_and_reports_its_pretraining_cost(scheduler, tmp_path):
    from nitro.scaling.minions import pretraining_info

    out = tmp_path / "grid"
    proto = tiny(tmp_path, seeds=(0, 1), schemes=("nitro", "minions"), i_max=3, scheduler=scheduler)
    P.execute(proto, out, runner=FakeRunner(), commit=False, log=lambda *_: None)
    copy = out / P.SCHEDULER_FILE
    sha = P.file_sha256(scheduler)
    assert P.file_sha256(copy) == sha
    grid = json.loads((out / "grid.json").read_text())
    assert grid["scheduler"]["sha256"] == sha and grid["scheduler"]["source"] == scheduler
    run = json.loads((out / "runs" / "cartpole-v1-ppo-minions-s0" / "run.json").read_text())
    assert run["extra"]["scaler"]["scheduler"] == str(copy.resolve())  # the runs use the grid's own copy
    assert run["meta"]["scheduler_sha256"] == sha and run["meta"]["scheduler"] == str(copy.resolve())

    # A later command without --scheduler uses the grid's copy; another scheduler is refused.
    args = ["--schemes", "nitro", "--name", "t", "--rounds", "4", "--steps-per-actor", "64", "--eval-every", "2",
            "--eval-episodes", "2", "--final-evals", "2", "--i-min", "1"]
    assert cli_protocol(tmp_path, *args).scheduler == str(copy.resolve())
    other = other_scheduler(tmp_path / "other.npz")
    with pytest.raises(SystemExit, match="one grid compares one scheduler"):
        P.execute(replace(proto, scheduler=other, scheduler_sha256=""), out, runner=FakeRunner(),
                  commit=False, log=lambda *_: None)
    # the finished runs' records refuse it too, even if grid.json lost its pin
    del grid["scheduler"]
    (out / "grid.json").write_text(json.dumps(grid))
    with pytest.raises(SystemExit, match="finished minions run cartpole-v1-ppo-minions-s0 used"):
        P.execute(replace(proto, scheduler=other, scheduler_sha256=""), out, runner=FakeRunner(),
                  commit=False, log=lambda *_: None)
    P.execute(proto, out, runner=FakeRunner(), commit=False, log=lambda *_: None)  # the same file: pinned again
    copy.write_bytes(copy.read_bytes() + b"x")
    with pytest.raises(SystemExit, match="missing or changed"):
        cli_protocol(tmp_path, *args)
    P.execute(proto, out, runner=FakeRunner(), commit=False, log=lambda *_: None)  # --scheduler restores the copy
    assert P.file_sha256(copy) == sha

    # The pre-training cost: shown beside the minions row and added to it, from the checkpoint's metadata.
    pre = pretraining_info(scheduler)["cost_usd"]
    numbers = P.report(proto, out, "t", reps=50, log=lambda *_: None)
    m = numbers["schemes"]["minions"]
    assert m["usd_with_pretraining_iqm_ci"] == pytest.approx([v + pre for v in m["usd_iqm_ci"]])
    assert numbers["scheduler"]["pretraining"]["cost_usd"] == pre
    table = (out / "table.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| minions |"))
    assert f"+ {pre:.4f} pre-training = {m['usd_with_pretraining_iqm_ci'][0]:.4f}" in row, row
    assert f"sha256 {sha[:12]}" in table and f"${pre:.4f} modelled" in table and "$" + f"{pre / 2:.4f} per run" in table
    assert "Pre-trained for other jobs" in table and "steps_per_actor 32 (grid 64)" in table


@pytest.mark.system
def test_minions_and_stellaris_runs_through_the_local_system(scheduler, tmp_path, local_runner):
    """One minions run with the tiny scheduler and one nitro run in learner mode stellaris."""
    kw = dict(env_id="CartPole-v1", preset="fast", rounds=3, steps_per_actor=64, i_min=1, i_max=3, seeds=(0,),
              eval_every=1, eval_episodes=1, final_evals=2)
    minions = P.Protocol(name="m", schemes=("minions",), scheduler=scheduler, **kw)
    stellaris = P.Protocol(name="s", schemes=("nitro",), learner_mode="stellaris", **kw)
    lines: list[str] = []
    for proto in (minions, stellaris):
        res = P.execute(proto, tmp_path / proto.name, runner=local_runner, commit=False, log=lines.append)
        assert res == {"done": 1, "total": 1, "ran": 1}, lines

    def finished(out: Path, run_id: str) -> tuple[dict, list[dict]]:
        d = out / "runs" / run_id
        summary = json.loads((d / "summary.json").read_text())
        assert summary["state"] == "SUCCEEDED", summary
        return summary, [json.loads(x) for x in (d / "rounds.jsonl").read_text().splitlines()]

    summary, rounds = finished(tmp_path / "m", "cartpole-v1-ppo-minions-s0")
    assert summary["spec"]["scaler"]["scheduler"] == str((tmp_path / "m" / P.SCHEDULER_FILE).resolve())
    assert len(rounds) == 3 and all(r["scaler_reason"].startswith("minions:") for r in rounds[:-1]), rounds
    table = P.report(minions, tmp_path / "m", "t", reps=50, log=lambda *_: None)
    assert table["schemes"]["minions"]["usd_with_pretraining_iqm_ci"][0] > table["schemes"]["minions"]["usd_iqm_ci"][0]

    summary, rounds = finished(tmp_path / "s", "cartpole-v1-ppo-nitro-s0")
    assert summary["spec"]["learner_mode"] == "stellaris"
    launched = sum(r.get("learner_functions_launched", 0) for r in rounds)
    batches = sum(r["actors_launched"] for r in rounds)
    assert launched >= batches > 0 and sum(r.get("gradients_applied", 0) for r in rounds) > 0, rounds
    assert json.loads((tmp_path / "s" / "grid.json").read_text())["scale"]["learner_mode"] == "stellaris"


def test_an_impact_grid_can_name_the_critic_v_trace_reads(tmp_path):
    on = cli_protocol(tmp_path, "--algo", "impact", "--vtrace-critic", "target", "--name", "t")
    assert {on.run(s, 0).spec()["vtrace_critic"] for s in on.schemes} == {"target"}
    assert on.scale()["vtrace_critic"] == "target" and "V-trace from the target critic" in on.describe()
    plain = cli_protocol(tmp_path, "--algo", "impact", "--name", "t2")
    assert "vtrace_critic" not in plain.run("nitro", 0).spec() and "vtrace_critic" not in plain.scale()
    # the learner's own check refuses it where no V-trace is read
    with pytest.raises(ValueError, match="vtrace_critic"):
        cli_protocol(tmp_path, "--vtrace-critic", "online", "--name", "t3")
    with pytest.raises(SystemExit):
        P.build_parser("protocol").parse_args(["--vtrace-critic", "actor"])


def test_a_grid_can_name_its_envs_per_actor(tmp_path):
    on = cli_protocol(tmp_path, "--schemes", "fixed:8", "--envs-per-actor", "16", "--name", "e16")
    assert on.run("fixed:8", 0).spec()["envs_per_actor"] == 16
    assert on.scale()["envs_per_actor"] == 16 and "16 envs per actor" in on.describe()
    plain = cli_protocol(tmp_path, "--schemes", "fixed:8", "--name", "e1")
    assert "envs_per_actor" not in plain.run("fixed:8", 0).spec() and "envs_per_actor" not in plain.scale()
