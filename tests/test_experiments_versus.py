"""protocol-versus (experiments/versus.py): one job's grids under two settings, scheme against scheme."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from experiments import protocol as P
from experiments import versus
from tests.test_experiments_protocol import FakeRunner, tiny


class BetterRunner(FakeRunner):
    """The same runs, every evaluation `bonus` higher."""

    def __init__(self, bonus: float):
        super().__init__()
        self.bonus = bonus

    def __call__(self, run, out_dir: Path) -> dict:
        summary = super().__call__(run, out_dir)
        path = Path(out_dir) / run.run_id / "rounds.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        for r in rows:
            if r["evaluated"]:
                r["eval_return"] += self.bonus
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return summary


def grids(tmp_path: Path, bonus: float) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    quiet = dict(commit=False, log=lambda *_: None)
    P.execute(tiny(tmp_path, name="a", learner_mode="stellaris", schemes=("nitro", "fixed:imin", "fixed:nbar")), a,
              runner=BetterRunner(bonus), **quiet)
    P.execute(tiny(tmp_path, name="b", schemes=("nitro", "fixed:imin", "fixed:nbar", "max")), b, runner=FakeRunner(),
              **quiet)
    return a, b


@pytest.mark.slow
def test_each_shared_scheme_is_compared_seed_by_seed_and_the_setting_is_named(tmp_path):
    a, b = grids(tmp_path, bonus=5.0)
    text, numbers = versus.compare(a, b, reps=100)
    assert "The grids differ in learner_mode: stellaris (A) vs central (B)." in text
    assert set(numbers["schemes"]) == {"nitro", "fixed:1", "fixed-nbar"}  # max is in B only; N-bar derived in each
    for s, n in numbers["schemes"].items():
        assert n["a"]["seeds"] == n["b"]["seeds"] == [0, 1]
        assert [x - y for x, y in zip(n["a"]["final"], n["b"]["final"])] == pytest.approx([5.0, 5.0])
        assert n["paired"]["mean"] == pytest.approx(5.0) and n["paired"]["wins"] == 2
        assert n["p_a_beats_b"][0] == pytest.approx(1.0)
    assert "| fixed:1 (I_min) | 2 / 2 |" in text and "| +5 [+5, +5] | 2/2 |" in text

    # The other way round, B is behind: no seed won, P = 0.
    _, back = versus.compare(b, a, reps=100)
    assert back["schemes"]["nitro"]["paired"]["wins"] == 0 and back["schemes"]["nitro"]["p_a_beats_b"][0] == 0.0


def test_the_command_writes_the_report_and_its_numbers(tmp_path, capsys):
    a, b = grids(tmp_path, bonus=0.0)
    out = tmp_path / "report" / "versus.md"
    assert versus.main([str(a), str(b), "--out", str(out), "--reps", "100"]) == 0
    assert out.read_text() in capsys.readouterr().out
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["differences"] == {"learner_mode": ["stellaris", "central"]}
    assert saved["schemes"]["nitro"]["paired"]["mean"] == 0.0 and saved["schemes"]["nitro"]["paired"]["wins"] == 0


def test_grids_of_different_jobs_or_without_shared_runs_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit, match="different jobs .*env_id: CartPole-v1 vs Acrobot-v1"):
        versus.differences(tiny(tmp_path), tiny(tmp_path, env_id="Acrobot-v1"))
    with pytest.raises(SystemExit, match="no grid.json"):
        versus.load_grid(tmp_path)
    (tmp_path / "grid.json").write_text(json.dumps({"name": "g", "scale": {}, "seeds": [], "schemes": ["nitro"]}))
    with pytest.raises(SystemExit, match="grid.json: not a grid this code can read .seeds: at least one"):
        versus.load_grid(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    quiet = dict(commit=False, log=lambda *_: None)
    P.execute(tiny(tmp_path, name="a", schemes=("max",)), a, runner=FakeRunner(), **quiet)
    P.execute(tiny(tmp_path, name="b", schemes=("fixed:imin",)), b, runner=FakeRunner(), **quiet)
    with pytest.raises(SystemExit, match="share no scheme"):
        versus.compare(a, b, reps=100)
    with pytest.raises(SystemExit):
        versus.main([str(a), str(b), "--reps", "5"])
    assert "--reps: at least 100, got 5" in capsys.readouterr().err


@pytest.mark.slow
def test_every_scheme_of_both_grids_cut_at_one_measured_bill(tmp_path, capsys):
    """FakeRunner bills 0.001 x actors x (k + 1) by round k and evaluates rounds 1 and 3 (return actors x 10 + k)."""
    a, b = grids(tmp_path, bonus=5.0)
    text, numbers = versus.compare(a, b, reps=100, cut_usd=0.003)
    cut = numbers["cut"]
    # halfway between the evaluations at $0.002 (final 11) and $0.004 (final 12, the mean of 11 and 13)
    assert cut["B"]["fixed:1"]["final"] == [11.5, 11.5] and cut["A"]["fixed:1"]["final"] == [16.5, 16.5]
    assert cut["A"]["fixed:1"]["p_a_better"][0] == 1.0 and "| P(A > B) | fixed:1 |" in text
    curve = [(0.002, 11.0), (0.004, 13.0)]
    assert versus.cut_at([curve], 0.003, 3, "last-eval") == ([11.0], 0)  # the cut before 2026-12-02
    assert cut["B"]["fixed:1"]["below"] == 0  # bills of 0.004: the cut binds
    assert all(math.isnan(f) for f in cut["B"]["nitro"]["final"])  # its first evaluation cost 0.004
    assert "| B | nitro | 0 of 2 | n/a | 0 |" in text and "| B | max (4) | 0 of 2 |" in text  # B's own schemes too
    _, edge = versus.compare(a, b, reps=100, cut_usd=0.004)  # exactly the last evaluation's bill: kept, not below
    assert edge["cut"]["B"]["fixed:1"]["final"] == [12.0, 12.0] and edge["cut"]["B"]["fixed:1"]["below"] == 0
    _, wide = versus.compare(a, b, reps=100, cut_usd=0.01)
    assert wide["cut"]["B"]["fixed:1"]["final"] == [12.0, 12.0] and wide["cut"]["B"]["fixed:1"]["below"] == 2
    with pytest.raises(SystemExit):
        versus.main([str(a), str(b), "--cut-usd", "-1"])
    assert "--cut-usd: a positive number of dollars, got -1.0" in capsys.readouterr().err
