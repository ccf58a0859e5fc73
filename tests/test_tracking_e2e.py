"""nitro train / watch / stop / list against a real local system (Redis, Lambda endpoint, three services).

`nitro train` runs in a subprocess: its rounds.csv has rows while the job runs, and its TensorBoard run
holds every round. The learner's diagnostics are finite and plausible for PPO, IMPACT and stellaris.
watch replays a finished job, stop ends a running one, list shows them; an unknown job id and an
unreachable learner are one-line errors.
"""

from __future__ import annotations

import csv
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from nitro.client import cli
from nitro.rpc.metrics import sample_value, scrape
from tests.system import shared_system
from tests.test_tracking import event_scalars

pytestmark = pytest.mark.timeout(300)

system = shared_system()

TINY = {"env_id": "CartPole-v1", "preset": "fast", "steps_per_actor": 128, "eval_episodes": 1, "budget_usd": 1.0,
        "seed": 2, "scaler": {"policy": "fixed", "fixed_actors": 2}}
ROUNDS = 4
ROOT = Path(__file__).resolve().parents[1]


def rows_of(path) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run_cli(system, tmp_path, *argv: str) -> int:
    """`nitro ...` in this process (its in-process system token authenticates it)."""
    return cli.main([*argv, "--target", system.learner_address, "--state-dir", str(tmp_path / "no-system")])


@pytest.fixture(scope="module")
def trained(system, tmp_path_factory):
    """`nitro train --tensorboard` in a subprocess; rounds.csv is read as soon as its first row is there."""
    tmp = tmp_path_factory.mktemp("train")
    argv = [sys.executable, "-m", "nitro.client.cli", "train", "--target", system.learner_address, "--env", "CartPole-v1",
            "--preset", "fast", "--rounds", str(ROUNDS), "--steps-per-actor", "128", "--eval-episodes", "1",
            "--eval-every", "2", "--scaler", "fixed:2", "--seed", "1", "--job-id", "tracked-ppo",
            "--results-dir", str(tmp / "results"), "--tensorboard", str(tmp / "tb"), "--no-progress"]
    env = {**os.environ, "NITRO_TOKEN": system.token, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(argv, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    csv_path = tmp / "results" / "tracked-ppo" / "rounds.csv"
    early, running_then, deadline = [], False, time.monotonic() + 150
    while proc.poll() is None and time.monotonic() < deadline and not early:
        early = rows_of(csv_path)
        running_then = proc.poll() is None
        time.sleep(0.1)
    out, err = proc.communicate(timeout=150)
    return SimpleNamespace(rc=proc.returncode, out=out, err=err, early=early, running_then=running_then,
                           dir=tmp / "results" / "tracked-ppo", tb=tmp / "tb" / "tracked-ppo")


def assert_plausible(r: dict, algo: str) -> None:
    values = {k: float(r[k]) for k in ("clip_fraction", "grad_norm", "explained_variance", "kl_coeff",
                                       "mean_episode_length", "train_return")}
    assert all(math.isfinite(v) for v in values.values()), values
    assert 0.0 <= values["clip_fraction"] <= 1.0, values
    assert values["grad_norm"] > 0.0 and values["explained_variance"] <= 1.0 and values["kl_coeff"] >= 0.0, values
    # CartPole pays 1 per step: an episode's return is its length, over the same latest episodes.
    assert 8 <= values["mean_episode_length"] <= 500 and values["mean_episode_length"] == pytest.approx(
        values["train_return"]), (algo, values)


def test_train_streams_rounds_csv_while_the_job_runs(trained):
    assert trained.rc == 0, trained.err
    assert trained.early and trained.running_then, "rounds.csv had a row before `nitro train` ended"
    rows = rows_of(trained.dir / "rounds.csv")
    assert [r["round"] for r in rows] == [str(k) for k in range(ROUNDS)]
    assert trained.early[0] == rows[0]
    for r in rows:
        assert_plausible(r, "ppo")
    assert {p.name for p in trained.dir.iterdir()} >= {"rounds.csv", "summary.json", "training.png"}
    assert "job tracked-ppo SUCCEEDED" in trained.out and f"tensorboard   {trained.tb}" in trained.out


def test_tensorboard_holds_every_rounds_scalars(trained):
    rows = rows_of(trained.dir / "rounds.csv")
    scalars, _ = event_scalars(trained.tb)
    steps = [int(r["total_env_steps"]) for r in rows]
    for tag, field in (("train/return", "train_return"), ("learner/clip_fraction", "clip_fraction"),
                       ("learner/grad_norm", "grad_norm"), ("learner/explained_variance", "explained_variance"),
                       ("learner/kl_coeff", "kl_coeff"), ("train/episode_length", "mean_episode_length"),
                       ("cost/cloud_total_usd", "cloud_total_cost_usd"), ("cost/machine_total_usd", "total_cost_usd"),
                       ("actors/launched", "actors_launched"), ("boosting/score", "score")):
        assert [s for s, _ in scalars[tag]] == steps, tag
        assert [v for _, v in scalars[tag]] == pytest.approx([float(r[field]) for r in rows], rel=1e-6), tag
    evaluated = [(int(r["total_env_steps"]), float(r["eval_return"])) for r in rows if r["evaluated"] == "True"]
    assert [k for k, r in enumerate(rows) if r["evaluated"] == "True"] == [1, 3]  # --eval-every 2
    assert [s for s, _ in scalars["eval/return"]] == [s for s, _ in evaluated]
    assert [v for _, v in scalars["eval/return"]] == pytest.approx([v for _, v in evaluated], rel=1e-6)


def test_watch_replays_a_finished_job(trained, system, tmp_path, capsys):
    assert run_cli(system, tmp_path, "watch", "tracked-ppo", "--results-dir", str(tmp_path), "--no-progress") == 0
    out = capsys.readouterr().out
    assert "round    3" in out and "job tracked-ppo SUCCEEDED: completed 4 rounds" in out
    again = rows_of(tmp_path / "tracked-ppo" / "rounds.csv")
    assert again == rows_of(trained.dir / "rounds.csv")


@pytest.mark.parametrize("mode", ["impact", "stellaris"])
def test_diagnostics_of_the_other_loops(client, mode):
    spec = {**TINY, "rounds": 2, **({"algo": "impact"} if mode == "impact" else {"learner_mode": "stellaris"})}
    status = client.start_training(spec)
    reports = list(client.watch(status.job_id))
    assert client.get(status.job_id).state_name == "SUCCEEDED"
    assert len(reports) == 2
    # Stellaris applies a round's learner updates during the next round: a round that applied none
    # reports no diagnostics (0), and at least one round here applied some.
    trained = [r for r in reports if mode != "stellaris" or r.gradients_applied > 0]
    assert trained
    for r in trained:
        assert_plausible(r.to_dict(), mode)
    for r in reports:
        if r not in trained:
            assert (r.clip_fraction, r.grad_norm, r.explained_variance) == (0.0, 0.0, 0.0)


def test_stop_watch_and_list_a_running_job(system, client, tmp_path, capsys):
    status = client.start_training({**TINY, "rounds": 200, "job_id": "to-stop"})
    first = next(iter(client.watch(status.job_id)))
    assert 0.0 <= first.clip_fraction <= 1.0
    learner = scrape(system.components["learner"].metrics_port)  # the latest round's diagnostics, per job
    for gauge in ("nitro_clip_fraction", "nitro_grad_norm", "nitro_explained_variance", "nitro_kl_coeff",
                  "nitro_mean_episode_length"):
        assert any(s.labels.get("job_id") == "to-stop" for s in learner[gauge]), gauge
    assert 0.0 <= sample_value(learner["nitro_clip_fraction"], "nitro_clip_fraction", job_id="to-stop") <= 1.0
    assert run_cli(system, tmp_path, "list") == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("to-stop ")]
    assert row.split()[1] == "RUNNING" and row.split()[2].endswith("/200")

    assert run_cli(system, tmp_path, "stop", "to-stop") == 0
    out = capsys.readouterr().out
    assert "job to-stop STOPPED: stopped: requested by client (" in out
    assert run_cli(system, tmp_path, "stop", "to-stop") == 0
    assert "job to-stop had already ended: STOPPED" in capsys.readouterr().out

    assert run_cli(system, tmp_path, "watch", "to-stop", "--results-dir", str(tmp_path), "--no-progress") == 3
    assert "job to-stop STOPPED" in capsys.readouterr().out
    rows = rows_of(tmp_path / "to-stop" / "rounds.csv")
    assert 1 <= len(rows) == client.get("to-stop").rounds_done < 200

    assert run_cli(system, tmp_path, "list") == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["JOB", "STATE", "ROUNDS"]
    states = {line.split()[0]: line.split()[1] for line in table[1:]}
    assert states["to-stop"] == "STOPPED"


@pytest.mark.parametrize("command", ["watch", "stop"])
def test_an_unknown_job_is_not_found(system, tmp_path, capsys, command):
    assert run_cli(system, tmp_path, command, "no-such-job") == 2
    assert capsys.readouterr().err.strip() == "error: NOT_FOUND: no training job with id 'no-such-job'"


@pytest.mark.slow
def test_an_unreachable_learner_is_one_line(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    assert cli.main(["list", "--target", f"127.0.0.1:{port}", "--state-dir", str(tmp_path)]) == 1
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("error: UNAVAILABLE: ") and f"(is a learner up at 127.0.0.1:{port}?" in err
