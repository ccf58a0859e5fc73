"""Tracking without services: TensorBoard event files read back with tensorboard's own reader, a W&B
offline run, rounds.csv streamed row by row, missing packages named, a failing tracker dropped."""

from __future__ import annotations

import csv
import glob
import math
import sys
import time

import pytest

from nitro.client import cli, results, sdk, tracking
from nitro.client.commands import common, follow
from nitro.v1 import training_pb2
from tests.test_sdk_cli import FakeClient, report

SPEC = {"env_id": "CartPole-v1", "rounds": 3, "scaler": {"policy": "nitro", "i_max": 4},
        "hyperparameters": {"lr": 3e-4}, "stellaris": None}


def reports(n: int = 3) -> list[dict]:
    """Round i evaluated on even rounds only; diagnostics set so every SCALARS tag has a value."""
    out = []
    for i in range(n):
        r = report(i, evaluated=i % 2 == 0, clip_fraction=0.1 * i, grad_norm=1.0 + i, explained_variance=0.5,
                   kl_coeff=0.2, mean_episode_length=20.0 + i, next_actors=4, cloud_total_cost_usd=0.001 * i,
                   round_seconds=1.5, cloud_round_seconds=0.5, policy_loss=-0.01, value_loss=2.0, entropy=0.6,
                   kl=0.01, convexity_ratio=0.3)
        out.append(sdk.RoundReport(r).to_dict())
    return out


def event_scalars(run_dir):
    """({tag: [(step, value)]}, the accumulator) of one run directory, read by tensorboard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}, acc


def test_round_scalars_keep_measured_finite_values():
    reps = reports()
    assert "eval/return" in tracking.round_scalars(reps[0]) and "eval/return" not in tracking.round_scalars(reps[1])
    nan = dict(reps[0], train_return=math.nan)
    assert "train/return" not in tracking.round_scalars(nan)
    assert set(tracking.round_scalars(reps[0])) == {tag for tag, _ in tracking.SCALARS}


def test_flat_spec_names_nested_settings():
    flat = tracking.flat_spec(SPEC)
    assert flat == {"env_id": "CartPole-v1", "rounds": 3, "scaler.policy": "nitro", "scaler.i_max": 4,
                    "hyperparameters.lr": 3e-4}


def test_tensorboard_holds_every_rounds_scalars_against_env_steps(tmp_path):
    tb = tracking.TensorBoardTracker(str(tmp_path / "tb"))
    tb.start("job-1", SPEC)
    reps = reports()
    for r in reps:
        tb.log_round(r)
    tb.finish({"state": "SUCCEEDED", "message": "completed 3 rounds"})
    scalars, acc = event_scalars(tmp_path / "tb" / "job-1")
    steps = [r["total_env_steps"] for r in reps]
    for tag, field in tracking.SCALARS:
        if field == "eval_return":
            assert scalars[tag] == [(steps[0], 0.0), (steps[2], 20.0)]  # evaluated rounds only
        else:
            assert [s for s, _ in scalars[tag]] == steps, tag
            assert [v for _, v in scalars[tag]] == pytest.approx([float(r[field]) for r in reps]), tag
    assert set(acc.PluginTagToContent("hparams")) >= {"_hparams_/experiment", "_hparams_/session_start_info"}
    assert "spec/text_summary" in acc.Tags()["tensors"]


@pytest.mark.slow
def test_wandb_offline_run_logs_every_tag(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    trackers = tracking.open_trackers(wandb_project="nitro-test")
    trackers.start("job-1", SPEC)
    for r in reports():
        trackers.log_round(r)
    (line,) = trackers.finish({"state": "SUCCEEDED", "message": "done", "final_eval_return": 20.0})
    assert trackers.active and "offline; upload with: wandb sync" in line
    (records,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    # The run's records are wandb's binary log; its history keys and config values are stored as text.
    # wandb's service process may still be writing it after finish() (it flushes by the time we exit).
    deadline = time.monotonic() + 20
    while b"progress/round" not in (data := open(records, "rb").read()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for tag, _ in tracking.SCALARS:
        assert tag.encode() in data, tag
    assert b"scaler.i_max" in data and b"CartPole-v1" in data


@pytest.mark.parametrize("module,flag,package", [("wandb", "wandb_project", "wandb package: pip install 'nitro-rl"),
                                                 ("torch.utils.tensorboard", "tensorboard_dir",
                                                  "tensorboard package: pip install 'nitro-rl")])
def test_a_missing_package_is_named(monkeypatch, module, flag, package):
    monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    with pytest.raises(tracking.TrackingError, match=package):
        tracking.open_trackers(**{flag: "x"})


def test_train_with_a_missing_tracker_package_fails_before_the_job(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)
    started = []
    monkeypatch.setattr(FakeClient, "start_training", lambda self, spec: started.append(spec))
    monkeypatch.setattr(common, "NitroClient", FakeClient)
    rc = cli.main(["train", "--target", "h:1", "--env", "CartPole-v1", "--wandb-project", "p",
                   "--results-dir", str(tmp_path)])
    assert rc == 2 and not started
    assert capsys.readouterr().err.strip() == ("error: --wandb-project needs the wandb package: pip install 'nitro-rl[tracking]' "
                                               "(WANDB_MODE=offline logs without a network)")


def test_a_failing_tracker_is_dropped_with_a_warning(capsys):
    class Broken:
        name = "broken"

        def start(self, job_id, spec):
            raise OSError("disk full")

    trackers = tracking.Trackers([Broken()])
    trackers.start("job-1", SPEC)
    trackers.log_round(reports()[0])
    assert trackers.active == [] and trackers.finish({}) == []
    assert "warning: broken tracking stopped: OSError: disk full" in capsys.readouterr().err


def test_rounds_csv_is_readable_after_each_row(tmp_path):
    path = tmp_path / "job" / "rounds.csv"
    with results.RoundsCsvWriter(path) as out:
        header = path.read_text().splitlines()
        assert header == [",".join(results.stable_columns())]
        for i, r in enumerate(reports()):
            out.append(sdk.RoundReport(report(i, notes=["a", "b"])) if i == 0 else r)
            rows = list(csv.DictReader(open(path)))
            assert len(rows) == i + 1  # flushed: a reader sees the row before the next one arrives
    assert rows[0]["notes"] == "a; b" and float(rows[2]["phase_sample_s"]) == 3.0
    assert float(rows[1]["cloud_phase_sample_s"]) == 0.25 and rows[1]["phase_detect_s"] == ""
    fields = [f.name for f in training_pb2.RoundReport.DESCRIPTOR.fields if f.name not in ("phases", "cloud_phases")]
    assert list(rows[0])[:len(fields)] == fields  # every report field, the new diagnostics included
    assert float(rows[2]["clip_fraction"]) == pytest.approx(0.2)


@pytest.mark.slow
def test_train_logs_to_tensorboard_and_exits_with_the_jobs_state(tmp_path, monkeypatch, capsys):
    FakeClient.checkpoint = ""
    monkeypatch.setattr(common, "NitroClient", FakeClient)
    out, tb = tmp_path / "results", tmp_path / "tb"
    rc = cli.main(["train", "--target", "h:1", "--env", "CartPole-v1", "--results-dir", str(out), "--no-progress",
                   "--tensorboard", str(tb)])
    assert rc == 0
    scalars, _ = event_scalars(tb / "job-1")
    assert [s for s, _ in scalars["train/return"]] == [100, 200, 300]
    assert len(list(csv.DictReader(open(out / "job-1" / "rounds.csv")))) == 3
    assert f"tensorboard   {tb / 'job-1'} (tensorboard --logdir {tb})" in capsys.readouterr().out

    def stopped(self, job_id):
        return sdk.TrainingStatus(training_pb2.TrainingStatus(job_id=job_id, state=training_pb2.JOB_STATE_STOPPED,
                                                              message="stopped: requested by client"))

    monkeypatch.setattr(FakeClient, "get", stopped)
    assert cli.main(["train", "--target", "h:1", "--env", "CartPole-v1", "--results-dir", str(out),
                     "--no-progress"]) == follow.JOB_EXIT_CODES["STOPPED"] == 3
    assert "job job-1 STOPPED: stopped: requested by client" in capsys.readouterr().out
