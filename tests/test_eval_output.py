"""What `nitro eval` prints besides its numbers: no confidence interval for a single episode, and a video
recorded without messages from the libraries underneath (SDL's XDG_RUNTIME_DIR complaint, imageio's
resizing warning). The policy is an untrained CartPole MLP, exported as `nitro export` writes it, so no
system has to train one."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from nitro.client import cli
from nitro.policy.envs import env_spaces
from nitro.policy.evaluation import evaluate_policy
from nitro.policy.models import Policy, spec_for_spaces
from nitro.policy.trained import TrainedPolicy, export_policy, load_policy
from nitro.policy.video import VideoWriter

pytestmark = pytest.mark.timeout(180)

XDG_COMPLAINT = "XDG_RUNTIME_DIR"
RESIZE_WARNING = "macro_block_size"


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> str:
    spec = spec_for_spaces(*env_spaces("CartPole-v1"), hidden_sizes=(8,))
    torch.manual_seed(0)  # a fixed untrained network: its greedy episodes last well beyond one step
    policy = TrainedPolicy(spec, Policy(spec).numpy_state(), {"env_id": "CartPole-v1"})
    return str(export_policy(policy, tmp_path_factory.mktemp("policy") / "cartpole").parent)


@pytest.fixture(scope="module")
def recorded(policy_dir, tmp_path_factory):
    """A real `nitro eval --episodes 1 --video x.mp4` in its own process, run as a new user's shell runs it:
    no XDG_RUNTIME_DIR (a container, ssh without a login session, su). Its return code, stdout + stderr, video."""
    video = tmp_path_factory.mktemp("video") / "episode.mp4"
    nitro = shutil.which("nitro", path=str(Path(sys.executable).parent))
    cmd = [nitro] if nitro else [sys.executable, "-m", "nitro.client.cli"]
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "DISPLAY", "WAYLAND_DISPLAY")}
    proc = subprocess.run([*cmd, "eval", policy_dir, "--episodes", "1", "--video", str(video)], env=env,
                          capture_output=True, text=True, timeout=150)
    return proc.returncode, proc.stdout + proc.stderr, video


# --- a) one episode: no interval ------------------------------------------------------------------------


@pytest.mark.slow
def test_one_episode_prints_no_confidence_interval(recorded):
    rc, output, _ = recorded
    assert rc == 0, output
    assert "n=1: no confidence interval" in output
    assert "95% CI" not in output  # never an interval of zero width


@pytest.mark.slow
def test_one_episode_has_no_interval_in_the_json_and_the_sdk(policy_dir, capsys):
    assert cli.main(["eval", policy_dir, "--episodes", "1", "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["episodes"] == 1 and doc["iqm_ci95"] is None and doc["iqm"] == doc["returns"][0]
    assert doc["ci_method"].startswith("n=1: no confidence interval")
    assert "n=1: no confidence interval" in captured.err and "95% CI" not in captured.err
    two = evaluate_policy(load_policy(policy_dir), episodes=2)
    assert two.iqm_ci95 is not None and two.iqm_ci95[0] <= two.iqm <= two.iqm_ci95[1]  # two episodes: an interval


# --- b) SDL's complaint about XDG_RUNTIME_DIR ---------------------------------------------------------


@pytest.mark.slow
def test_recording_prints_no_xdg_runtime_dir_error(recorded):
    rc, output, video = recorded
    assert rc == 0, output
    assert XDG_COMPLAINT not in output, output
    assert video.is_file() and "video     " in output


@pytest.mark.slow
@pytest.mark.parametrize("value", [None, "relative/run", "/nonexistent/run"])
def test_recording_in_process_is_quiet_and_leaves_the_environment_as_it_was(policy_dir, tmp_path, capfd,
                                                                            monkeypatch, value):
    """The SDK in a user's program: SDL writes to file descriptor 2, read here with capfd; the variables
    rendering needs are set for the recording only."""
    if value is None:
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", value)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    before = dict(os.environ)
    result = evaluate_policy(load_policy(policy_dir), episodes=1, video=str(tmp_path / "e.mp4"))
    assert result.video_frames > 1
    assert dict(os.environ) == before
    out, err = capfd.readouterr()
    assert XDG_COMPLAINT not in out + err


# --- c) imageio's resizing warning ---------------------------------------------------------------------


@pytest.mark.slow
def test_recording_prints_no_resizing_warning_and_keeps_the_picture(recorded):
    rc, output, video = recorded
    assert rc == 0, output
    assert RESIZE_WARNING not in output and "IMAGEIO" not in output, output
    frames = iio.imread(video)
    assert frames.shape[1:] == (400, 608, 3)  # CartPole's 600x400, padded to the next multiple of 16


@pytest.mark.parametrize("height,width", [(400, 600), (45, 77), (32, 48)])
def test_mp4_frames_are_padded_not_resized(tmp_path, caplog, height, width):
    rng = np.random.default_rng(0)
    frames = [np.kron(rng.integers(0, 256, (height // 4 + 1, width // 4 + 1, 3)), np.ones((4, 4, 1)))
              [:height, :width].astype(np.uint8) for _ in range(3)]  # 4x4 blocks: survive compression
    caplog.set_level(logging.WARNING)
    with VideoWriter(str(tmp_path / "v.mp4"), 30) as writer:
        for frame in frames:
            writer.append(frame)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    back = iio.imread(tmp_path / "v.mp4")
    padded = (-(-height // 16) * 16, -(-width // 16) * 16)
    assert back.shape == (3, *padded, 3)
    assert np.abs(back[0, :height, :width].astype(int) - frames[0]).mean() < 12  # the picture, not stretched
    from nitro.policy.video import pad_to_block

    assert np.array_equal(pad_to_block(frames[0])[:height, :width], frames[0])
    assert np.array_equal(pad_to_block(frames[0])[height:, :width], np.repeat(frames[0][-1:], padded[0] - height, 0))
