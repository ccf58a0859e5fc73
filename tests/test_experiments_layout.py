"""Where a grid's files live (issue 42): tables, plots and plans in docs/results/grids/NAME, the raw runs in
data/grids/NAME/runs, so docs/ holds documentation. experiments.harness.runs_dir is the one rule."""

from __future__ import annotations

from pathlib import Path

from experiments.harness import runs_dir

ROOT = Path(__file__).resolve().parents[1]


def test_a_published_grid_keeps_its_runs_under_data_and_any_other_beside_itself(tmp_path):
    assert runs_dir(ROOT / "docs/results/grids/g") == ROOT / "data/grids/g/runs"
    assert runs_dir("docs/results/grids/g") == Path("data/grids/g/runs")
    assert runs_dir(tmp_path / "grid") == tmp_path / "grid/runs"
    assert runs_dir(ROOT / "results/experiments/g") == ROOT / "results/experiments/g/runs"


def test_no_raw_runs_are_left_in_docs_and_every_grid_with_runs_is_documented():
    """What the repository holds (a grid running here may have a run in progress beside its grid: adopt_runs moves
    it when the run ends)."""
    import subprocess

    docs = ROOT / "docs/results/grids"
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "docs/results/grids"], capture_output=True,
                             text=True)
    in_docs = ([f for f in tracked.stdout.splitlines() if "/runs/" in f] if tracked.returncode == 0
               else list(docs.glob("*/runs")))
    assert not in_docs, "raw runs belong in data/grids (experiments.harness.runs_dir)"
    for runs in (ROOT / "data/grids").glob("*/runs"):
        assert (docs / runs.parent.name / "grid.json").exists(), f"{runs} has no grid in docs/results/grids"


def test_runs_an_older_clone_wrote_beside_a_published_grid_move_home(tmp_path):
    """The grids run their jobs from a clone at a fixed commit, whose code may predate runs_dir: it writes its runs
    to OUT/runs; the orchestrating protocol moves them to data/grids/NAME/runs when the clone exits."""
    from experiments.protocol import adopt_runs

    out = tmp_path / "docs/results/grids/g"
    (out / "runs/run-s2").mkdir(parents=True)
    (out / "runs/run-s2/summary.json").write_text("{}")
    old = tmp_path / "data/grids/g/runs/run-s2"
    old.mkdir(parents=True)
    (old / "partial.txt").write_text("cut short")
    assert adopt_runs(out) == ["run-s2"]
    assert not (out / "runs").exists()
    assert sorted(p.name for p in old.iterdir()) == ["summary.json"], "the new run replaces the old copy"
    assert adopt_runs(out) == [] and adopt_runs(tmp_path / "elsewhere") == []


def test_an_older_clone_finds_the_grids_finished_runs_and_gives_them_back_unchanged(tmp_path):
    """A clone whose code predates runs_dir looks for the runs it derives from (noise-replay's source) in OUT/runs:
    lend_runs copies them there before it starts; adopt_runs drops the copies that came back unchanged and moves
    what the clone wrote or changed."""
    from experiments.protocol import adopt_runs, lend_runs

    out = tmp_path / "docs/results/grids/g"
    home = tmp_path / "data/grids/g/runs"
    for name in ("noise-s0", "noise-s1"):
        (home / name).mkdir(parents=True)
        (home / name / "summary.json").write_text(f'{{"run": "{name}"}}')
    assert lend_runs(out) == ["noise-s0", "noise-s1"]
    assert (out / "runs/noise-s1/summary.json").read_text() == '{"run": "noise-s1"}'
    assert lend_runs(out) == [], "what is lent already is not copied again"
    (out / "runs/replay-s0").mkdir()  # the clone's new run
    (out / "runs/replay-s0/summary.json").write_text("{}")
    (out / "runs/noise-s0/summary.json").write_text('{"rewritten": true}')  # a run the clone redid
    assert adopt_runs(out) == ["noise-s0", "replay-s0"]
    assert not (out / "runs").exists()
    assert sorted(p.name for p in home.iterdir()) == ["noise-s0", "noise-s1", "replay-s0"]
    assert (home / "noise-s0/summary.json").read_text() == '{"rewritten": true}'
    assert lend_runs(tmp_path / "elsewhere") == []


def test_recorded_commands_name_no_machine_paths():
    from experiments.protocol import portable

    repo = Path("/srv/x/main")
    assert portable("python -m experiments protocol --clone /srv/x/grid-clone --out /srv/x/main/docs/g",
                    repo) == "python -m experiments protocol --clone ../grid-clone --out docs/g"
