"""Reference pricing (nitro.cost) and the equal-cost comparison by truncation (experiments/equal_cost.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from experiments import equal_cost
from nitro.cost import (
    LEGACY_ACTOR_MEMORY_MB,
    PAPER_PRICES,
    Prices,
    Pricing,
    ReferenceRates,
    calibrate_reference_rates,
    lambda_cost,
    learner_cost,
    reference_evaluation_seconds,
    reference_job,
    reference_round,
    round_actor_billed_seconds,
)
from nitro.errors import ConfigError

P = PAPER_PRICES  # the synthetic reports below are billed as runs before 2026-12-02 were
MEM = LEGACY_ACTOR_MEMORY_MB
OLD = Pricing("old", P, actor_memory_mb=MEM, bill_evaluation=False)  # how every table before 2026-12-02 priced
RATES = ReferenceRates(actor_s_per_step=1e-4, learner_s_per_sample=2e-4, learner_s_per_round=0.05, actor_init_s=0.3)


def test_a_reference_round_is_the_slowest_invocation_plus_the_learner_and_cold_starts_cost_more():
    warm_s, warm_usd = reference_round(8, 512, 8, RATES, P)
    assert warm_s == pytest.approx(P.lambda_invoke_overhead_s + 512 * 1e-4 + 8 * 512 * 2e-4 + 0.05)
    assert warm_usd > learner_cost(warm_s, P)  # the Lambda bill is on top of the learner's
    cold_s, cold_usd = reference_round(8, 512, 0, RATES, P)
    assert cold_s == pytest.approx(warm_s + P.lambda_cold_start_s + 0.3)
    assert cold_usd > warm_usd
    assert reference_round(64, 512, 64, RATES, P)[1] > 7 * warm_usd  # the update grows with the samples
    with pytest.raises(ConfigError, match="actors"):
        reference_round(-1, 512, 0, RATES, P)
    with pytest.raises(ConfigError, match="actor_s_per_step"):
        ReferenceRates(actor_s_per_step=-1.0, learner_s_per_sample=0.0, learner_s_per_round=0.0)


def test_a_reference_job_keeps_sandboxes_warm_and_prices_the_same_work_the_same():
    cum = reference_job([8, 8, 16, 8], 512, RATES, P, MEM)
    assert all(b > a for a, b in zip(cum, cum[1:]))
    first, second = cum[0], cum[1] - cum[0]
    assert first > second  # round 0 starts cold, round 1 reuses its sandboxes
    assert cum[3] - cum[2] == pytest.approx(second)  # after the 16-actor round, 8 actors are warm again
    assert reference_job([8, 8, 16, 8], 512, RATES, P, MEM) == cum


def _rounds(job: str, actors: list[int], rates: ReferenceRates, slow: float = 1.0, steps: int = 512) -> list[dict]:
    out, warm = [], 0
    for k, a in enumerate(actors):
        sample = P.lambda_invoke_overhead_s + slow * rates.actor_s_per_step * steps
        if a > warm:
            sample += 0.9  # a cold start: must not enter the actor rate
        out.append({"job_id": job, "round": k, "actors_launched": a, "env_steps": a * steps, "evaluated": k % 5 == 4,
                    "cloud_phases": {"sample": sample, "ingest": 0.0,
                                     "update": slow * rates.learner_s_per_sample * a * steps,
                                     "publish": slow * rates.learner_s_per_round,
                                     "detect": 0.0 if k % 5 == 4 else 0.0}})
        warm = max(warm, a)
    return out


def test_calibration_takes_the_quiet_rounds_and_ignores_cold_starts_and_loaded_ones():
    quiet = _rounds("a", [8] * 20, RATES)
    loaded = [r for j in range(6) for r in _rounds(f"b{j}", [8, 16, 16] * 6, RATES, slow=2.2)]  # 2.2x under load
    got = calibrate_reference_rates(quiet + loaded, 512, P, actor_memory_mb=MEM)
    assert got.actor_s_per_step == pytest.approx(RATES.actor_s_per_step, rel=1e-6)
    assert got.learner_s_per_sample == pytest.approx(RATES.learner_s_per_sample, rel=1e-6)
    assert got.learner_s_per_round == pytest.approx(RATES.learner_s_per_round, rel=1e-6)
    median = calibrate_reference_rates(quiet + loaded, 512, P, quantile=0.5, actor_memory_mb=MEM)
    assert median.learner_s_per_sample > 2 * RATES.learner_s_per_sample  # what a median would have charged
    with pytest.raises(ConfigError, match="no round report"):
        calibrate_reference_rates([{"actors_launched": 8}], 512, P, actor_memory_mb=MEM)


def test_calibration_refuses_rounds_that_never_waited_for_their_actors():
    overlapped = _rounds("a", [8] * 10, RATES)
    for r in overlapped:
        r["cloud_phases"]["sample"] = 0.0  # IMPACT: the update overlaps sampling, the round reports no sample phase
    with pytest.raises(ConfigError, match="asynchronous learner"):
        calibrate_reference_rates(overlapped, 512, P, actor_memory_mb=MEM)



def test_an_asynchronous_round_overlaps_the_update_with_the_launch():
    # IMPACT: the learner trains while the actors sample; the round takes the longer of the two
    for actors in (1, 8, 64):
        sync_s, sync_usd = reference_round(actors, 512, actors, RATES, P)
        async_s, async_usd = reference_round(actors, 512, actors, RATES, P, asynchronous=True)
        launch_s = P.lambda_invoke_overhead_s + 512 * RATES.actor_s_per_step
        update_s = actors * 512 * RATES.learner_s_per_sample
        assert async_s == pytest.approx(max(launch_s, update_s) + RATES.learner_s_per_round)
        assert sync_s - async_s == pytest.approx(min(launch_s, update_s))
        assert sync_usd - async_usd == pytest.approx(learner_cost(sync_s - async_s, P))  # same Lambda bill
    slow_actors = ReferenceRates(actor_s_per_step=1e-2, learner_s_per_sample=1e-6, learner_s_per_round=0.0)
    s, _ = reference_round(8, 512, 8, slow_actors, P, asynchronous=True)
    assert s == pytest.approx(P.lambda_invoke_overhead_s + 5.12)  # the launch is the longer one here
    assert reference_job([8, 16], 512, RATES, P, MEM, asynchronous=True)[-1] < reference_job([8, 16], 512, RATES, P, MEM)[-1]


def _async_rounds(job: str, actors: list[int], rates: ReferenceRates, slow: float = 1.0) -> list[dict]:
    """IMPACT-like reports: no sample phase; the bill carries the actors' billed time; a round after an
    evaluation counts that evaluation in its update."""
    out, warm = [], 0
    for k, a in enumerate(actors):
        scaled = ReferenceRates(actor_s_per_step=slow * rates.actor_s_per_step,
                                learner_s_per_sample=slow * rates.learner_s_per_sample,
                                learner_s_per_round=slow * rates.learner_s_per_round)
        seconds, usd = reference_round(a, 512, warm, scaled, P, MEM, asynchronous=True)
        # the ledger's growth between two reports: an evaluated round also bills the next round's actors that
        # finished during its evaluation, and the round after it misses them
        leak = 0.5 * (usd - learner_cost(seconds, P))
        usd += leak if k % 5 == 4 else -leak if k % 5 == 0 and k else 0.0
        update = scaled.learner_s_per_sample * a * 512 + (3.0 if k % 5 == 0 and k else 0.0)
        out.append({"job_id": job, "round": k, "actors_launched": a, "actors_failed": 0, "env_steps": a * 512,
                    "evaluated": k % 5 == 4, "cloud_round_seconds": seconds, "cloud_round_cost_usd": usd,
                    "cloud_phases": {"sample": 0.0, "update": update, "publish": scaled.learner_s_per_round,
                                     "detect": 0.0}})
        warm = max(warm, a)
    return out


def test_asynchronous_calibration_reads_actor_speed_from_the_bill_and_skips_evaluations_and_throttles():
    r = _async_rounds("a", [8, 8], RATES)[1]  # warm
    # Lambda bills whole milliseconds: 51.2 ms of sampling bill 52
    assert round_actor_billed_seconds(r, P, MEM) == pytest.approx(8 * 0.052, rel=1e-6)
    quiet = _async_rounds("a", [8] * 20, RATES)
    loaded = [x for j in range(6) for x in _async_rounds(f"b{j}", [8, 16, 16] * 6, RATES, slow=2.5)]
    throttled = _async_rounds("c", [8] * 6, RATES)
    for x in throttled[1:]:
        x["actors_failed"], x["cloud_round_cost_usd"] = 4, x["cloud_round_cost_usd"] / 4  # must not set the rate
    got = calibrate_reference_rates(quiet + loaded + throttled, 512, P, asynchronous=True, actor_memory_mb=MEM)
    assert got.actor_s_per_step == pytest.approx(0.052 / 512, rel=1e-6)  # the billed (whole) milliseconds
    assert got.learner_s_per_sample == pytest.approx(RATES.learner_s_per_sample, rel=1e-6)
    assert got.learner_s_per_round == pytest.approx(RATES.learner_s_per_round, rel=1e-6)
    # at the quietest quantile, rounds next to an evaluation or with throttled actors would set the rate
    edge = calibrate_reference_rates(quiet + throttled, 512, P, asynchronous=True, quantile=0.0, actor_memory_mb=MEM)
    assert edge.actor_s_per_step == pytest.approx(0.052 / 512, rel=1e-6)
    # the same reports read as synchronous are refused: they never waited for their actors
    with pytest.raises(ConfigError, match="asynchronous=True"):
        calibrate_reference_rates(quiet, 512, P, actor_memory_mb=MEM)
    # with the evaluations left in, the learner rate would be the evaluated rounds' (a check the test can fail)
    no_skip = calibrate_reference_rates(quiet, 512, P, asynchronous=True, quantile=1.0, actor_memory_mb=MEM)
    assert no_skip.learner_s_per_sample == pytest.approx(RATES.learner_s_per_sample, rel=1e-6)


def test_a_report_with_its_own_actor_bill_is_read_exactly_next_to_an_evaluation():
    rounds = _async_rounds("a", [8] * 12, RATES)
    for r in rounds:  # the launch's own bill, as reports carry it since cloud_actor_cost_usd: no leak
        r["cloud_actor_cost_usd"] = 8 * lambda_cost(52, 1, 1024.0, P)
        r["cloud_round_cost_usd"] = 0.0  # what the ledger's growth said no longer matters
    assert round_actor_billed_seconds(rounds[4], P, MEM) == pytest.approx(8 * 0.052, rel=1e-6)  # an evaluated round
    got = calibrate_reference_rates(rounds, 512, P, asynchronous=True, quantile=0.0, actor_memory_mb=MEM)
    assert got.actor_s_per_step == pytest.approx(0.052 / 512, rel=1e-6)

def _write_run(grid, scheme: str, seed: int, actors: list[int], returns: dict[int, float], algo: str = "ppo",
               extra: dict | None = None) -> None:
    d = grid / "runs" / f"{scheme.replace(':', '-')}-s{seed}"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"seed": seed, "steps_per_actor": 512, "i_min": 8, "i_max": 64,
                                            "algo": algo, "extra": {"eval_every": 5, **(extra or {})},
                                            "meta": {"scheme": scheme}}))
    rounds = _rounds(f"{scheme}-{seed}-{len(actors)}", actors, RATES)
    for r in rounds:
        r["eval_return"] = returns.get(r["round"], math.nan)
        r["total_env_steps"] = 512 * sum(actors[: r["round"] + 1])
    (d / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    (d / "summary.json").write_text(json.dumps({"state": "SUCCEEDED"}))


def _grid(tmp_path, name: str, rounds: int):
    g = tmp_path / name
    (g / "runs").mkdir(parents=True)
    (g / "grid.json").write_text(json.dumps({"scale": {"rounds": rounds, "steps_per_actor": 512}}))
    return g


@pytest.mark.slow
def test_equal_cost_cuts_each_run_at_the_budget_and_prefers_the_longer_run(tmp_path, capsys):
    short, long = _grid(tmp_path, "g50", 10), _grid(tmp_path, "g100", 20)
    for seed in range(4):
        # nitro: 16 actors every round; its return grows with the round
        _write_run(short, "nitro", seed, [16] * 10, {k: 100.0 * (k + 1) + seed for k in (4, 9)})
        # fixed:8 costs about half as much per round and learns as fast per round: it wins at equal dollars,
        # but only the 20-round grid runs it far enough to spend nitro's budget
        _write_run(short, "fixed:8", seed, [8] * 10, {k: 100.0 * (k + 1) + seed for k in (4, 9)})
        _write_run(long, "fixed:8", seed, [8] * 20, {k: 100.0 * (k + 1) + seed for k in (4, 9, 14, 19)})
    runs = equal_cost.load_runs([short, long])
    assert {(r.scheme, len(r.rounds)) for r in runs} == {("nitro", 10), ("fixed:8", 20)}
    equal_cost.price(runs, RATES, OLD)
    budget = equal_cost.auto_budget(runs)
    assert budget == pytest.approx(reference_job([16] * 10, 512, RATES, P, MEM)[-1])
    fixed = next(r for r in runs if r.scheme == "fixed:8")
    c = equal_cost.cut(fixed, budget, method="last-eval")
    assert reference_job([8] * 15, 512, RATES, P, MEM)[-1] <= budget < reference_job([8] * 20, 512, RATES, P, MEM)[-1]
    assert c["rounds"] == 15 and not c["short"] and c["final"] == pytest.approx(1000 + fixed.seed)
    assert equal_cost.cut(next(r for r in runs if r.scheme == "nitro"), budget, method="last-eval")["final"] == pytest.approx(
        750 + next(r for r in runs if r.scheme == "nitro").seed)
    tiny = equal_cost.cut(fixed, reference_job([8] * 5, 512, RATES, P, MEM)[-1], method="last-eval")
    assert tiny["rounds"] == 5 and tiny["final"] == pytest.approx(500 + fixed.seed)
    assert equal_cost.cut(fixed, 1e-9)["rounds"] == 0

    old = tmp_path / "old.json"
    old.write_text(json.dumps(OLD.to_dict()))
    legacy = ["--pricing", str(old), "--cut", "last-eval"]
    assert equal_cost.main(["--grids", str(short), str(long), "--reps", "50", "--out", str(tmp_path / "t.md"),
                            *legacy]) == 0
    text = (tmp_path / "t.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| fixed:8"))
    assert "lower bound" not in row and "| 0/4 |" in row  # nitro loses every seed at equal dollars
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["budget_usd"] == pytest.approx(budget)
    # the curve of return against the budget: its last point is the table's cut; budgets below a run's first
    # evaluation (a tenth and a fifth of this one) have no point
    curve = data["curves"]["fixed:8"]
    assert curve["usd"][-1] == pytest.approx(budget) and curve["usd"][0] == pytest.approx(budget * 3 / 10)
    assert curve["iqm"][-1] == pytest.approx(1001.5) and curve["iqm"] == sorted(curve["iqm"])
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Pinned rates: the report's command names the file, so it reproduces the same cut.
    rates_file = tmp_path / "rates.json"
    rates_file.write_text(json.dumps(RATES.to_dict()))
    assert equal_cost.main(["--grids", str(short), str(long), "--reps", "50", "--rates", str(rates_file), *legacy,
                            "--out", str(tmp_path / "pinned.md")]) == 0
    pinned = (tmp_path / "pinned.md").read_text()
    assert f"--rates {rates_file} --pricing {old} --cut last-eval`" in pinned
    assert json.loads((tmp_path / "pinned.json").read_text())["budget_usd"] == pytest.approx(budget)
    with pytest.raises(SystemExit):  # pinned rates and a calibrated actor rate: refused, not one silently ignored
        equal_cost.main(["--grids", str(short), "--rates", str(rates_file), "--actor-rate-from", str(long)])
    assert "give one of them" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="grid.json"):
        equal_cost.main(["--grids", str(tmp_path)])
    with pytest.raises(SystemExit, match="--budget"):
        equal_cost.main(["--grids", str(short), "--budget", "lots"])



def test_equal_cost_prices_impact_runs_as_overlapped_rounds_for_the_actors_that_ran(tmp_path):
    impact, ppo, stellaris = _grid(tmp_path, "impact", 10), _grid(tmp_path, "ppo", 10), _grid(tmp_path, "st", 10)
    _write_run(impact, "nitro", 0, [16] * 10, {4: 1.0, 9: 2.0}, algo="impact")
    _write_run(ppo, "nitro", 0, [16] * 10, {4: 1.0, 9: 2.0})
    _write_run(stellaris, "nitro", 0, [16] * 10, {4: 1.0, 9: 2.0}, extra={"learner_mode": "stellaris"})
    [a], [b] = equal_cost.load_runs([impact]), equal_cost.load_runs([ppo])
    assert a.asynchronous and not b.asynchronous
    a.rounds[3]["actors_failed"] = 6  # throttled: never ran, never billed
    equal_cost.price([a, b], RATES, OLD)
    assert a.cum_usd[2] == pytest.approx(reference_job([16] * 3, 512, RATES, P, MEM, asynchronous=True)[-1])
    assert a.cum_usd[3] - a.cum_usd[2] == pytest.approx(
        reference_job([16, 10], 512, RATES, P, MEM, asynchronous=True)[-1] - reference_job([16], 512, RATES, P, MEM,
                                                                                     asynchronous=True)[-1])
    assert b.cum_usd == reference_job([16] * 10, 512, RATES, P, MEM)
    with pytest.raises(ConfigError, match="mix synchronous"):
        equal_cost.calibrate([a, b])
    with pytest.raises(SystemExit, match="stellaris"):
        equal_cost.load_runs([stellaris])


def test_pooled_probability_averages_tasks_and_resamples_each_on_its_own():
    assert equal_cost.p_greater([2, 3], [1, 1]) == 1.0 and equal_cost.p_greater([1], [1]) == 0.5
    assert equal_cost.p_greater([1, 3], [2]) == 0.5
    # task 1: nitro always ahead; task 2: always behind, with a different number of runs: mean 0.5
    p, lo, hi = equal_cost.pooled_probability([[5, 6, 7], [1, 2]], [[1, 2], [5, 6, 7, 8]], reps=200)
    assert (p, lo, hi) == (0.5, 0.5, 0.5)  # no resample of these runs changes either task's P
    p, lo, hi = equal_cost.pooled_probability([[1, 3, 5], [4, 6]], [[2, 4], [5]], reps=400)
    assert p == pytest.approx((equal_cost.p_greater([1, 3, 5], [2, 4]) + 0.5) / 2) and lo < p < hi
    with pytest.raises(ValueError, match="every task needs runs of both"):
        equal_cost.pooled_probability([[1], []], [[1], [2]])


def _table(budget: float, nitro: dict, fixed: dict) -> dict:
    cuts = lambda d: {str(k): {"final": v} for k, v in d.items()}  # noqa: E731
    return {"budget_usd": budget, "schemes": {"nitro": {"cuts": cuts(nitro)}, "fixed:8": {"cuts": cuts(fixed)},
                                              "max": {"cuts": cuts(fixed)}}}


def test_pool_of_several_tasks_tables(tmp_path, capsys):
    a = tmp_path / "equal-cost-protocol-hopper.json"
    b = tmp_path / "walker-equal-cost.json"
    a.write_text(json.dumps(_table(0.06, {0: 10.0, 1: 30.0}, {0: 20.0, 1: 20.0})))
    b.write_text(json.dumps({**_table(0.14, {0: 1.0, 1: 2.0, 2: math.nan}, {0: 5.0, 1: 6.0, 2: 7.0}),
                             "curves": {}}))
    out = tmp_path / "pooled.md"
    assert equal_cost.main(["--pool", str(a), str(b), "--reps", "200", "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["tasks"] == ["hopper", "walker"]
    f = data["schemes"]["fixed:8"]
    assert f["per_task"] == {"hopper": 0.5, "walker": 0.0} and f["pooled"][0] == 0.25
    assert f["wins"] == 1 and f["seeds"] == 4  # seed 1 of hopper; walker's NaN seed 2 is no seed
    assert f["runs"] == {"hopper": [2, 2], "walker": [2, 3]}
    assert "| fixed:8 | 0.50 (2 vs 2 runs) | 0.00 (2 vs 3 runs) |" in out.read_text()
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match="bad.json: not an equal-cost table"):
        equal_cost.main(["--pool", str(a), str(bad)])
    with pytest.raises(SystemExit, match="at least two tasks"):
        equal_cost.main(["--pool", str(a)])
    with pytest.raises(SystemExit, match="a second table for the task 'hopper'"):
        equal_cost.main(["--pool", str(a), str(a)])
    c = tmp_path / "c.json"
    c.write_text(json.dumps({"budget_usd": 1.0, "schemes": {"fixed:8": {"cuts": {"0": {"final": 1.0}}}}}))
    with pytest.raises(SystemExit, match="--pool c: no nitro run"):
        equal_cost.main(["--pool", str(a), str(c)])


def test_a_reference_round_runs_actors_at_their_memory_size_s_cpu_share():
    d = Prices()  # a full vCPU at 1,769 MB
    full_s, full_usd = reference_round(8, 512, 8, RATES, d, 1769)
    part_s, part_usd = reference_round(8, 512, 8, RATES, d, 1024)
    slow = 1769 / 1024
    assert part_s - full_s == pytest.approx(512 * RATES.actor_s_per_step * (slow - 1), rel=1e-9)
    # the same CPU GB-seconds at either size (to the billed ms), but the learner waits longer at 1,024 MB
    assert part_usd > full_usd
    assert reference_round(8, 512, 8, RATES, d, 4096)[0] == pytest.approx(full_s)  # no faster beyond one vCPU
    assert reference_round(8, 512, 8, RATES, P, 1024)[0] == pytest.approx(full_s)  # the old model: a full vCPU


def test_a_pricing_scales_the_learner_and_reads_from_a_file():
    gpu = Pricing.from_mapping({"name": "gpu", "prices": {"learner_usd_per_hour": 3.06}, "learner_speedup": 3.0,
                                "round_overhead_factor": 5.0})
    r = gpu.rates(RATES)
    assert (r.learner_s_per_sample, r.learner_s_per_round, r.actor_s_per_step) == (
        pytest.approx(RATES.learner_s_per_sample / 3), pytest.approx(RATES.learner_s_per_round * 5),
        RATES.actor_s_per_step)
    assert gpu.prices.learner_usd_per_hour == 3.06 and gpu.prices.lambda_full_vcpu_mb == 1769.0
    assert Pricing.from_mapping(gpu.to_dict()) == gpu
    with pytest.raises(ConfigError, match="unknown pricing setting"):
        Pricing.from_mapping({"name": "x", "speedup": 3})
    with pytest.raises(ConfigError, match="learner_speedup"):
        Pricing("x", learner_speedup=0.0)
    with pytest.raises(ConfigError, match="learner_usd_per_hour"):
        Pricing.from_mapping({"name": "x", "prices": {"learner_usd_per_hour": -1}})


def test_evaluation_is_billed_at_reference_speed_whatever_the_load():
    quiet = _rounds("q", [8] * 10, RATES)
    loaded = _rounds("l", [8] * 10, RATES, slow=2.0)  # every learner phase twice as long
    for rounds, slow in ((quiet, 1.0), (loaded, 2.0)):
        for r in rounds:
            r["cloud_phases"]["evaluate"] = 0.4 * slow if r["evaluated"] else 0.0
    for rounds in (quiet, loaded):
        ev = reference_evaluation_seconds(rounds, RATES, 512)
        assert ev == pytest.approx([0.4 if r["evaluated"] else 0.0 for r in rounds])
    billed = Pricing("t", P, actor_memory_mb=MEM)
    with_eval = reference_job([8] * 10, 512, RATES, P, MEM, evaluation_s=reference_evaluation_seconds(loaded, RATES, 512))
    without = reference_job([8] * 10, 512, RATES, P, MEM)
    assert with_eval[-1] - without[-1] == pytest.approx(learner_cost(0.8, P))  # two evaluations of 0.4 s
    assert with_eval[3] == pytest.approx(without[3])  # nothing before the first evaluation
    assert billed.bill_evaluation and not OLD.bill_evaluation
    with pytest.raises(ConfigError, match="evaluation times"):
        reference_job([8] * 10, 512, RATES, P, MEM, evaluation_s=[0.0])


def test_the_interpolated_cut_spends_exactly_the_budget_and_the_old_cut_strands_it(tmp_path):
    g = _grid(tmp_path, "g", 20)
    _write_run(g, "max", 0, [64] * 20, {k: 100.0 * (k + 1) for k in (4, 9, 14, 19)})
    [run] = equal_cost.load_runs([g])
    equal_cost.price([run], RATES, OLD)
    at = {k: run.cum_usd[k] for k in (4, 9, 14, 19)}
    budget = at[9] + 0.75 * (at[14] - at[9])  # three quarters of the way between two evaluations
    old = equal_cost.cut(run, budget, method="last-eval")
    new = equal_cost.cut(run, budget)
    assert old["spent"] == pytest.approx(at[9]) and old["spent"] < 0.8 * budget  # a stranded third
    assert old["final"] == pytest.approx(np.mean([500, 1000]))
    assert new["spent"] == budget and not new["short"]
    w = (budget - at[9]) / (at[14] - at[9])
    assert w == pytest.approx(0.75)
    assert new["final"] == pytest.approx(750 + w * (1000 - 750))  # the 3-evaluation means either side
    assert new["rounds"] == pytest.approx(10 + w * 5)
    assert equal_cost.cut(run, at[19] * 2)["short"]  # beyond the run's bill: its last value, flagged
    assert equal_cost.cut(run, at[19] * 2)["final"] == pytest.approx(np.mean([1000, 1500, 2000]))
    assert math.isnan(equal_cost.cut(run, at[4] / 2)["final"])  # before its first evaluation
    with pytest.raises(ConfigError, match="cut"):
        equal_cost.cut(run, budget, method="nearest")


def _json(path, data):
    path.write_text(json.dumps(data))
    return path


@pytest.mark.slow
def test_the_verdict_table_says_whether_a_comparison_holds_under_every_pricing(tmp_path, capsys):
    g = _grid(tmp_path, "g", 20)
    for seed in range(5):
        _write_run(g, "nitro", seed, [16] * 20, {k: 100.0 * (k + 1) + seed for k in (4, 9, 14, 19)})
        _write_run(g, "fixed:8", seed, [8] * 60, {k: 100.0 * (k + 1) + seed for k in range(4, 60, 5)})
    files = []
    for name, hourly, speed in (("cheap", 0.085, 1.0), ("dear", 3.06, 3.0)):
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps({"name": name, "prices": {"learner_usd_per_hour": hourly}, "learner_speedup": speed}))
        files.append(str(f))
    assert equal_cost.main(["--grids", str(g), "--reps", "50", "--pricing", *files, "--out", str(tmp_path / "v.md")]) == 0
    text = (tmp_path / "v.md").read_text()
    assert "#### Pricing `cheap`: at the budget B" in text and "#### Pricing `dear`: at B/2" in text
    row = next(line for line in text.splitlines() if line.startswith("| fixed:8") and "holds" not in line
               and line.count("|") == 7)
    assert row.count("scheme ahead") == 4 and row.endswith("| yes |")  # half the dollars a round: fixed:8 everywhere
    data = json.loads((tmp_path / "v.json").read_text())
    assert [d["pricing"]["name"] for d in data["pricings"]] == ["cheap", "dear"]
    assert data["budget_usd"] == data["pricings"][0]["full"]["budget_usd"]  # what --pool reads: the first pricing
    spent = [c["spent"] / data["budget_usd"] for c in data["schemes"]["fixed:8"]["cuts"].values()]
    assert spent == pytest.approx([1.0] * 5)
    assert equal_cost.verdict((0.9, 0.6, 1.0)) == "nitro ahead" and equal_cost.verdict((0.5, 0.2, 0.8)) == "level"
    # one line per scheme across the pricings, an older table as the first column
    capsys.readouterr()
    assert equal_cost.main(["--summary", str(tmp_path / "v.json"), "--before", str(tmp_path / "v.json")]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("| scheme"))
    assert head.count("$") == 3 and "| before (" in head and "| cheap (" in head and "| dear (" in head
    fixed = next(line for line in out.splitlines() if line.startswith("| fixed:8"))
    assert fixed.count("(0.00)") == 3  # nitro behind fixed:8 at every B
    with pytest.raises(SystemExit, match="no 'pricings'"):
        equal_cost.main(["--summary", str(_json(tmp_path / "older.json", {"schemes": {}}))])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "speedup": 2}))
    with pytest.raises(SystemExit, match="unknown pricing setting"):
        equal_cost.main(["--grids", str(g), "--pricing", str(bad)])
    with pytest.raises(SystemExit, match="same name"):
        equal_cost.main(["--grids", str(g), "--pricing", files[0], files[0]])
