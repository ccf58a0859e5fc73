"""The signal test (experiments/signal.py): branches are fair, the statistics are right."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from experiments.signal import SIGNALS, SignalConfig, Trainer, decision_gain, report, run_seed, spearman

TINY = SignalConfig(env_id="CartPole-v1", preset="fast", base_rounds=6, branches=2, actors=2, boost=6, steps=64,
                    horizon=1, eval_episodes=2)


@pytest.mark.slow
def test_a_fork_that_samples_like_the_base_run_stays_identical_to_it():
    base = Trainer(TINY, seed=3)
    base.round(0, 2)
    arm = base.fork()
    for r in (1, 2):
        base.round(r, 2)
        arm.round(r, 2)
    for a, b in zip(base.learner.policy.parameters(), arm.learner.policy.parameters()):
        assert torch.equal(a, b), "arm a must be exactly the base run (reproducible actors, forked learner)"
    other = base.fork()
    other.round(3, 6)  # a boosted round changes the policy
    base.round(3, 2)
    assert any(not torch.equal(a, b) for a, b in zip(base.learner.policy.parameters(),
                                                     other.learner.policy.parameters()))
    base.close(), arm.close(), other.close()


@pytest.mark.slow
def test_run_seed_writes_one_record_per_branch_with_every_signal(tmp_path):
    path = run_seed(TINY, 0, tmp_path, log=lambda *_: None)
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["k"] for r in recs] == TINY.branch_rounds()
    for r in recs:
        assert set(SIGNALS) <= set(r["signals"])
        assert len(r["eval_a"]) == len(r["eval_b"]) == TINY.eval_episodes
        assert r["benefit"] == pytest.approx(np.mean(r["eval_b"]) - np.mean(r["eval_a"]))
        assert math.isfinite(r["signals"]["R_sub"]) and 0.0 <= r["signals"]["S_sub"] <= 1.0
    assert "Spearman" in report(tmp_path, reps=50)
    assert run_seed(TINY, 0, tmp_path, log=lambda *_: None) == path  # done seeds are skipped


def synthetic(seeds: int = 6, rounds: int = 8) -> list[dict]:
    rng = np.random.default_rng(0)
    recs = []
    for s in range(seeds):
        for k in range(rounds):
            b = float(rng.normal())
            sig = {name: float(rng.normal()) for name in SIGNALS}
            sig["S_sub"] = b  # a perfect predictor
            sig["gns"] = -b  # a perfect predictor, pointing the other way
            sig["R_sub_seeds"] = [sig["R_sub"]] * 3
            recs.append({"seed": s, "k": k, "benefit": b, "signals": sig})
    return recs


def test_spearman_and_the_decision_test_reward_a_perfect_signal():
    recs = synthetic()
    assert spearman([r["signals"]["S_sub"] for r in recs], [r["benefit"] for r in recs]) == pytest.approx(1.0)
    assert spearman([r["signals"]["gns"] for r in recs], [r["benefit"] for r in recs]) == pytest.approx(-1.0)
    best = decision_gain(recs, lambda rs, m: sorted(rs, key=lambda r: -r["benefit"])[:m], 3)
    worst = decision_gain(recs, lambda rs, m: sorted(rs, key=lambda r: r["benefit"])[:m], 3)
    assert best > 0 > worst


@pytest.mark.slow
def test_report_orients_signals_by_the_other_seeds(tmp_path):
    recs = synthetic()
    for s in range(6):
        (tmp_path / f"seed{s}.jsonl").write_text("".join(json.dumps(dict(r, R_after_64=1.0, R_after_8=0.5)) + "\n"
                                                         for r in recs if r["seed"] == s))
    text = report(tmp_path, reps=50)  # the decision table asserted here does not bootstrap
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in text.splitlines()
            if line.startswith("| ") and line.count("|") == 3}
    assert rows["S_sub"] == rows["best possible"] == rows["gns"], text  # both perfect signals pick the best rounds
    assert float(rows["random"]) < float(rows["best possible"])


def test_partial_spearman_removes_what_the_round_index_explains():
    from experiments.signal import partial_spearman

    rng = np.random.default_rng(1)
    k = np.arange(60) % 10
    benefit = -k + rng.normal(size=60)
    only_round = -k + 0.01 * rng.normal(size=60)  # tracks the round, nothing else
    extra = rng.normal(size=60)
    informative = benefit - (-k) + 0.1 * rng.normal(size=60)  # predicts what the round does not
    assert spearman(only_round, benefit) > 0.6 and abs(partial_spearman(only_round, benefit, k)) < 0.3
    assert partial_spearman(informative, benefit, k) > 0.8
    assert abs(partial_spearman(extra, benefit, k)) < 0.3


@pytest.mark.slow
def test_pooled_report_ranks_within_each_environment_and_compares_with_the_detectors_score(tmp_path):
    from experiments.signal import pooled_report

    dirs = []
    for env, scale in (("env-a", 1.0), ("env-b", 1000.0)):  # returns of very different scales
        d = tmp_path / env
        d.mkdir()
        recs = synthetic()
        for r in recs:
            r["benefit"] *= scale
            r["signals"]["kl"] = r["benefit"] + scale * r["k"]  # partly the round, partly the benefit
        for s in range(6):
            (d / f"seed{s}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs if r["seed"] == s))
        dirs.append(d)
    text = pooled_report(dirs, reps=50)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| ") and not line.startswith("| signal")}
    assert float(rows["S_sub"][1]) == pytest.approx(1.0) and float(rows["S_sub"][3]) == pytest.approx(1.0)
    assert rows["S_sub"][5] == "—"
    # gns predicts perfectly but against its expected sign: oriented, it is far worse than S_sub
    assert float(rows["gns"][3]) == pytest.approx(-1.0)
    assert float(rows["gns"][5].split()[0]) == pytest.approx(-2.0)
    assert float(rows["random"][5].split()[0]) < -0.5
    assert "no signal-test records" in pooled_report([tmp_path / "missing"])
