"""The sequential experiment's analysis (experiments/sequential.py): the primary metric at equal reference dollars,
the seed-paired comparison with the best fixed count, and the stopping rule. Synthetic runs, no system."""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments import sequential as sq
from experiments.equal_cost import PricedRun


def run(scheme: str, seed: int, returns: list[float], usd_per_round: float, eval_every: int = 1,
        rounds: int | None = None) -> PricedRun:
    """A run whose round k costs usd_per_round and whose evaluation after round k returned returns[k]."""
    n = rounds or len(returns)
    rr = [{"round": k, "evaluated": k < len(returns), "eval_return": returns[k] if k < len(returns) else math.nan,
           "env_steps": 100, "total_env_steps": 100 * (k + 1)} for k in range(n)]
    return PricedRun(scheme, seed, rr, 100, 1, 8, eval_every, "mem", cum_usd=[usd_per_round * (k + 1) for k in range(n)])


def test_the_primary_metric_averages_the_return_interpolated_at_eight_budget_points():
    # fixed:8 spends 1 per round for 100 rounds (B = 100); this run's return is its bill, so at 0.3 B ... 1.0 B it
    # reads 30 ... 100 and the metric is their mean
    base = [run("fixed:8", 0, [0.0] * 100, 1.0)]
    r = run("grow", 0, [2.0 * (k + 1) for k in range(60)], 2.0)  # bill 2 (k + 1): return == bill
    b = sq.budget_b(base)
    assert b == 100.0
    got = sq.primary(r, b)
    assert got["at"] == pytest.approx([30, 40, 50, 60, 70, 80, 90, 100])
    assert got["metric"] == pytest.approx(65.0) and not got["short"]
    assert sq.primary(run("noise", 0, [1.0] * 50, 1.0), b)["short"]


def _grid(delta_by_arm: dict[str, list[float]], base: list[float]) -> list[PricedRun]:
    """Runs whose return is constant: fixed:8's per seed from `base`, every other arm's its base plus a delta."""
    runs = []
    for seed, v in enumerate(base):
        runs.append(run("fixed:8", seed, [v] * 100, 1.0))
        for arm, deltas in delta_by_arm.items():
            runs.append(run(arm, seed, [v + deltas[seed]] * 120, 1.0))
    return runs


BASE = [1000.0 + 37.0 * s for s in range(10)]


def test_each_arm_is_compared_seed_paired_with_the_best_fixed_count():
    res = sq.compare_env(_grid({"fixed:4": [-100.0] * 10, "grow": [50.0 + s for s in range(10)]}, BASE), reps=500)
    assert res["best_fixed"] == "fixed:8"
    grow = res["arms"]["grow"]["vs_best_fixed"]
    assert grow["mean"] == pytest.approx(54.5) and grow["wins"] == 10
    assert grow["rel_mean"] == pytest.approx(54.5 / sum(BASE) * len(BASE))
    assert res["arms"]["fixed:8"]["vs_best_fixed"] is None
    assert all(p["low"] > 0 for p in res["arms"]["grow"]["by_point"])


def test_a_policy_below_the_best_fixed_count_in_both_environments_stops_for_futility():
    res = sq.compare_env(_grid({"grow": [-30.0 + s for s in range(10)], "noise": [-200.0] * 10}, BASE), reps=500)
    verdict = sq.decide({"Hopper-v5": res, "Walker2d-v5": res})
    assert verdict["decision"] == "futility" and verdict["best"] == "grow"


def test_a_promising_but_unproven_policy_extends_to_stage_two():
    mixed = [180.0, -120.0, 240.0, -60.0, 270.0, -150.0, 210.0, 30.0, -90.0, 120.0]  # mean +63, CI across 0
    res = sq.compare_env(_grid({"grow": mixed}, BASE), reps=500)
    verdict = sq.decide({"Hopper-v5": res, "Walker2d-v5": res})
    assert verdict["decision"] == "extend" and verdict["best"] == "grow"


def test_noise_wins_only_above_its_replay_and_never_below_the_best_fixed_count():
    ahead = [100.0 + s for s in range(10)]
    with_replay_level = sq.compare_env(_grid({"noise": ahead, "noise-replay": ahead}, BASE), reps=500)
    assert sq.decide({"a": with_replay_level, "b": with_replay_level})["decision"] != "win"
    with_replay_behind = sq.compare_env(_grid({"noise": ahead, "noise-replay": [0.0] * 10}, BASE), reps=500)
    assert sq.decide({"a": with_replay_behind, "b": with_replay_behind}) == {
        "decision": "win", "policies": ["noise"], "best": "noise"}


def test_a_win_needs_both_environments():
    ahead = sq.compare_env(_grid({"grow": [100.0 + s for s in range(10)]}, BASE), reps=500)
    behind = sq.compare_env(_grid({"grow": [-100.0 + s for s in range(10)]}, BASE), reps=500)
    assert sq.decide({"Hopper-v5": ahead, "Walker2d-v5": behind})["decision"] == "extend"
    assert sq.decide({"Hopper-v5": ahead})["decision"] == "win"


def test_ratchet_finds_the_spike_that_set_noise_s_actors_for_good():
    """The real noise policy plans 12 rounds; at round 6 |G|^2 collapses for one round (the noise scale spikes)
    and the count jumps, and stays up after the scale comes back down. The analysis reads the scale each plan
    used from its reason, and names round 6 as the spike-driven raise; with no spike it names none."""
    from nitro.scaling.base import RoundInputs
    from nitro.scaling.policies import NoisePolicy

    def noise_run(grad_sq: list[float]) -> PricedRun:
        policy, state, rounds = NoisePolicy(kappa=1.0, ema=1.0), {}, []  # ema 1: the newest terms alone
        for k, g in enumerate(grad_sq):
            actors, state, why = policy.decide(state, RoundInputs(
                k, i_min=4, i_max=64, policy_noise_terms=(g, 100.0), round_cost_usd=1e-4, sample_cost_usd=1e-7,
                steps_per_actor=512))
            rounds.append({"round": k, "next_actors": actors, "scaler_reason": why})
        return PricedRun("noise", 0, rounds, 512, 4, 64, 5, "mem")

    steady = [0.1] * 12  # B = 1,000: sqrt(B a / c) = 1,000 samples, about 2 actors -> I_min
    spiked = noise_run(steady[:6] + [1e-5] + steady[7:])  # B = 1e7 once: sqrt(1e10) = 1e5 samples -> 64 actors
    assert np.isfinite(sq.planned_noise_scales(spiked.rounds)).all()
    x = sq.ratchet(spiked)
    assert x["max_round"] == 6 and x["max"] == pytest.approx(1e7, rel=1e-3)
    assert x["median"] == pytest.approx(1000.0, rel=1e-3)
    assert x["ups"] == [6] and x["spike_ups"] == [6] and x["final_actors"] == 64
    calm = sq.ratchet(noise_run(steady))
    assert calm["ups"] == [] and calm["spike_ups"] == [] and calm["final_actors"] == 4
    table = "\n".join(sq.ratchet_report({"Hopper-v5": [spiked]}))
    assert "| Hopper-v5 | 0 | 12 | 1,000 / " in table and "| 64 | 6* |" in table
