"""After training: a CartPole policy trained through the real local system is loaded, acts on one
observation and on a batch, is evaluated and recorded, exported and reloaded; best.pt is the best
evaluated round; bad inputs fail with errors that say what is wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gymnasium as gym
import imageio.v3 as iio
import numpy as np
import pytest
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from learner_svc.evaluation import eval_seed
from nitro import load_policy
from nitro.client import cli, results
from nitro.client.commands import follow
from nitro.errors import ConfigError, PolicyError
from nitro.policy.evaluation import evaluate_policy, iqm_interval
from nitro.policy.trained import export_policy
from tests.system import shared_system

pytestmark = pytest.mark.timeout(300)

system = shared_system()
SEED = 1


class DrawnCartPole(CartPoleEnv):
    """CartPole drawing its own small frames with numpy, two bars counting them, so no two are alike
    (a GIF writer merges equal neighbours) and every frame can be counted back."""

    renders = 0

    def render(self):
        self.renders += 1
        frame = np.full((60, 120, 3), 255, np.uint8)
        frame[:4, :self.renders % 120] = 0
        frame[4:8, :self.renders // 120] = 0
        x = int(np.clip(60 + 20 * self.state[0], 6, 114))
        frame[40:50, x - 6:x + 6] = (0, 0, 200)
        return frame


gym.register("DrawnCartPole-v1", entry_point=DrawnCartPole, max_episode_steps=500)


@pytest.fixture(scope="module")
def trained(client):
    """4 rounds with observation normalisation, evaluated after rounds 1 and 3 only (eval_every 2)."""
    status = client.start_training({
        "env_id": "CartPole-v1", "preset": "fast", "rounds": 4, "steps_per_actor": 256, "eval_episodes": 2,
        "eval_every": 2, "budget_usd": 1.0, "seed": SEED, "hyperparameters": {"obs_norm": 1},
        "scaler": {"policy": "fixed", "fixed_actors": 2, "i_min": 1, "i_max": 2}})
    reports = list(client.watch(status.job_id))
    status = client.get(status.job_id)
    assert status.state_name == "SUCCEEDED", status.message
    return status, reports


@pytest.fixture(scope="module")
def checkpoint(trained):
    return trained[0].checkpoint_path


def observations(n: int, seed: int = 0) -> np.ndarray:
    """Observations from real CartPole episodes, so the normalisation statistics matter."""
    env, out = gym.make("CartPole-v1"), []
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    while len(out) < n:
        out.append(obs)
        obs, _, term, trunc, _ = env.step(int(rng.integers(2)))
        if term or trunc:
            obs, _ = env.reset()
    return np.asarray(out, dtype=np.float32)


def test_best_pt_is_the_best_evaluated_round(trained, checkpoint):
    status, reports = trained
    evaluated = [r for r in reports if r.evaluated]
    assert [r.round for r in evaluated] == [1, 3]
    best = max(evaluated, key=lambda r: r.eval_return)  # the first of equals, as the learner keeps it
    best_path = os.path.join(os.path.dirname(checkpoint), "best.pt")
    assert torch.load(best_path, weights_only=True)["round"] == best.round
    assert torch.load(checkpoint, weights_only=True)["round"] == 3
    # The learner's evaluation of that round, reproduced from best.pt on the same seeds.
    seed = eval_seed(SEED, best.round)
    again = evaluate_policy(load_policy(best_path), episodes=2, seed=seed)
    assert again.mean == best.eval_return
    summary = results.summarize(status, reports, 1.0)
    assert summary["best_round"] == best.round and summary["best_checkpoint_path"] == best_path


def test_results_copy_and_name_best_pt(trained, tmp_path, capsys):
    status, reports = trained
    out = follow.write_results(tmp_path / "job", status, reports, 1.0)
    assert (out / "best.pt").read_bytes() == open(os.path.join(os.path.dirname(status.checkpoint_path),
                                                               "best.pt"), "rb").read()
    assert f"best policy   {out / 'best.pt'} (round" in capsys.readouterr().out


def test_predict_single_and_batch(checkpoint):
    policy = load_policy(checkpoint)
    assert policy.env_id == "CartPole-v1" and policy.spec.obs_norm and policy.info["round"] == 3
    assert policy.state["obs_count"] > 1  # statistics were learned, so normalisation is exercised
    batch = observations(64)
    actions, state = policy.predict(batch, deterministic=True)
    assert state is None and actions.shape == (64,) and actions.dtype == np.int64
    single = [policy.predict(o, deterministic=True)[0] for o in batch]
    assert all(a.shape == () for a in single) and np.array_equal(np.stack(single), actions)
    # The torch module normalises and acts alike.
    with torch.no_grad():
        logits = policy.module.distribution(torch.as_tensor(batch)).logits
    assert np.array_equal(logits.argmax(-1).numpy(), actions)
    assert policy.predict(batch[:0])[0].shape == (0,)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    env.step(policy.predict(obs, deterministic=True)[0])  # the action is what the environment accepts
    sampled = [load_policy(checkpoint, seed=7).predict(batch)[0] for _ in range(2)]
    assert np.array_equal(*sampled) and set(np.unique(sampled[0])) <= {0, 1}
    with pytest.raises(PolicyError, match=r"observation: expected shape \(4,\) or \(n, 4\), got \(3,\)"):
        policy.predict(np.zeros(3))


def test_eval_command_prints_mean_iqm_and_json(checkpoint, capsys):
    assert cli.main(["eval", checkpoint, "--episodes", "3", "--seed", "5", "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["env_id"] == "CartPole-v1" and doc["seed"] == 5 and doc["episodes"] == 3
    assert doc["returns"] == evaluate_policy(load_policy(checkpoint), episodes=3, seed=5).returns
    assert doc["mean"] == pytest.approx(np.mean(doc["returns"]))
    assert doc["iqm_ci95"][0] <= doc["iqm"] <= doc["iqm_ci95"][1]
    assert "seeds 5..7" in captured.err and "IQM" in captured.err and "95% CI" in captured.err


def read_video(path) -> tuple[list[np.ndarray], str]:
    """Every frame of a video file (RGB) and its codec's FourCC, read back with OpenCV."""
    import cv2

    cap = cv2.VideoCapture(str(path))
    fourcc = int(cap.get(cv2.CAP_PROP_FOURCC)).to_bytes(4, "little").decode("ascii", "replace")
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame[:, :, ::-1])
    cap.release()
    return frames, fourcc


def test_mp4_of_real_cartpole_frames_is_h264_through_imageio_ffmpeg(checkpoint, tmp_path):
    """gymnasium's own CartPole renderer (pygame) and imageio-ffmpeg's H.264, both dependencies."""
    policy = load_policy(checkpoint)
    path = tmp_path / "cartpole.mp4"
    result = evaluate_policy(policy, "CartPole-v1", episodes=2, seed=0, video=str(path))
    # Rendering changes nothing: the same returns as without a video, one frame per step plus the first.
    assert result.returns == evaluate_policy(policy, "CartPole-v1", episodes=2, seed=0).returns
    assert result.video_frames == int(result.returns[0]) + 1
    frames, fourcc = read_video(path)
    assert fourcc.lower() in ("avc1", "h264") and len(frames) == result.video_frames
    # The first frame is CartPole's first observation as gymnasium draws it (up to compression and the
    # writer's padding of the width to a multiple of 16: 600 -> 608, the picture itself in the first 600).
    env = gym.make("CartPole-v1", render_mode="rgb_array")
    env.reset(seed=0)
    drawn = env.render()
    env.close()
    assert drawn.shape == (400, 600, 3) and frames[0].shape[0] == 400 and frames[0].shape[1] in (600, 608)
    assert np.abs(frames[0][:, :600].astype(int) - drawn).mean() < 8.0
    assert not np.array_equal(frames[0], frames[-1])  # the cart and the pole moved


def test_gif_keeps_every_frame(checkpoint, tmp_path):
    policy = load_policy(checkpoint)
    path = tmp_path / "episode.gif"
    result = evaluate_policy(policy, "DrawnCartPole-v1", episodes=2, seed=0, video=str(path))
    assert result.returns == evaluate_policy(policy, "CartPole-v1", episodes=2, seed=0).returns
    # CartPole runs at 50 fps: every frame is kept
    assert iio.improps(path).shape == (result.video_frames, 60, 120, 3)


def test_mp4_without_imageio_ffmpeg_falls_back_to_opencv(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # find_spec now says it is not installed
    policy = load_policy(checkpoint)
    path = tmp_path / "episode.mp4"
    result = evaluate_policy(policy, "DrawnCartPole-v1", episodes=1, seed=0, video=str(path))
    frames, fourcc = read_video(path)
    # MPEG-4 Part 2: written as "mp4v", read back by FFmpeg as "FMP4"
    assert fourcc.lower() in ("mp4v", "fmp4") and len(frames) == result.video_frames and frames[0].shape == (60, 120, 3)


def test_export_reloads_with_identical_predictions(checkpoint, tmp_path, capsys):
    out = tmp_path / "export"
    assert cli.main(["export", checkpoint, "--out", str(out)]) == 0
    assert "(policy.json, weights.safetensors)" in capsys.readouterr().out
    doc = json.loads((out / "policy.json").read_text())
    assert doc["weights"] == "weights.safetensors"  # safetensors is a dependency
    assert sorted(p.name for p in out.iterdir()) == ["policy.json", "weights.safetensors"]
    original, exported = load_policy(checkpoint), load_policy(out)
    batch = observations(256, seed=3)
    assert np.array_equal(original.predict(batch, deterministic=True)[0], exported.predict(batch, deterministic=True)[0])
    assert exported.info == original.info and exported.spec == original.spec
    assert evaluate_policy(exported, episodes=2, seed=4).returns == evaluate_policy(original, episodes=2, seed=4).returns
    # policy.json says enough to act without nitro at all: normalise, run the actor MLP, argmax.
    from safetensors.numpy import load_file

    w = load_file(out / doc["weights"])
    assert set(w) == set(original.state)
    norm = doc["observation_normalization"]
    assert norm["enabled"]
    x = (batch.astype(np.float64) - w[norm["mean"]]) / np.sqrt(w[norm["var"]] + norm["epsilon"])
    x = np.clip(x, -norm["clip"], norm["clip"]).astype(np.float32)
    for i in range(len(doc["model_spec"]["hidden_sizes"])):
        x = np.tanh(x @ w[f"actor.layers.{i}.weight"].T + w[f"actor.layers.{i}.bias"])
    logits = x @ w["actor.out.weight"].T + w["actor.out.bias"]
    assert np.array_equal(logits.argmax(-1), exported.predict(batch, deterministic=True)[0])


def test_without_safetensors_the_export_is_npz(checkpoint, tmp_path, monkeypatch):
    """The fallback for an environment without safetensors: numpy .npz, read back alike; a safetensors
    export then fails to load with a message that names the package."""
    original = load_policy(checkpoint)
    export_policy(original, tmp_path / "st")
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import safetensors... now raises ImportError
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    path = export_policy(original, tmp_path / "npz")
    assert json.loads(path.read_text())["weights"] == "weights.npz"
    assert sorted(p.name for p in (tmp_path / "npz").iterdir()) == ["policy.json", "weights.npz"]
    with np.load(tmp_path / "npz" / "weights.npz", allow_pickle=False) as z:
        assert set(z.files) == set(original.state)
    batch = observations(64, seed=5)
    assert np.array_equal(load_policy(tmp_path / "npz").predict(batch, deterministic=True)[0],
                          original.predict(batch, deterministic=True)[0])
    with pytest.raises(PolicyError, match=r"weights.safetensors: safetensors weights need the safetensors package"):
        load_policy(tmp_path / "st")


def test_an_mlp_export_loads_without_torch(checkpoint, tmp_path):
    export_policy(checkpoint, tmp_path / "export")
    assert (tmp_path / "export" / "weights.safetensors").is_file()
    code = ("import sys; import nitro; p = nitro.load_policy(sys.argv[1]); p.predict([0.0, 0.1, 0.0, -0.1]); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "export")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_bad_inputs_give_clear_errors(checkpoint, tmp_path, capsys):
    def error(*argv) -> str:
        assert cli.main(list(argv)) == 2
        return capsys.readouterr().err

    assert "no such file or directory" in error("eval", str(tmp_path / "missing.pt"))
    (tmp_path / "corrupt.pt").write_bytes(open(checkpoint, "rb").read()[:5000])
    assert "not a checkpoint" in error("eval", str(tmp_path / "corrupt.pt"))
    assert "obs_shape is (3,) in the environment, (4,) in the policy" in error("eval", checkpoint, "--env",
                                                                               "Pendulum-v1")
    assert "unknown environment id 'NoSuchEnv-v0'" in error("eval", checkpoint, "--env", "NoSuchEnv-v0")
    assert "must end in .mp4 or .gif" in error("eval", checkpoint, "--video", str(tmp_path / "x.avi"))
    assert "no policy.json" in error("export", str(tmp_path), "--out", str(tmp_path / "e"))
    (tmp_path / "file").write_text("")
    assert "exists and is not a directory" in error("export", checkpoint, "--out", str(tmp_path / "file"))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["eval", checkpoint, "--episodes", "0"])
    assert exit_info.value.code == 2 and "--episodes: must be an integer >= 1, got 0" in capsys.readouterr().err
    export_policy(checkpoint, tmp_path / "e")
    doc = json.loads((tmp_path / "e" / "policy.json").read_text())
    (tmp_path / "e" / "policy.json").write_text(json.dumps({**doc, "format_version": 99}))
    with pytest.raises(PolicyError, match="format_version: this nitro reads 1, got 99"):
        load_policy(tmp_path / "e")


def test_a_renderer_that_is_not_installed_is_a_clear_error(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pygame", None)  # gymnasium's CartPole renderer now cannot import it
    with pytest.raises(ConfigError, match="cannot render rgb_array frames: pygame is not installed"):
        evaluate_policy(load_policy(checkpoint), episodes=1, video=str(tmp_path / "v.gif"))


def test_iqm_interval_agrees_with_rliable():
    """nitro eval's interval comes from nitro.stats (numpy only); rliable's, on the same values, agrees."""
    from rliable import library, metrics

    values = [10.0, 12.0, 13.0, 15.0, 20.0, 21.0, 22.0, 40.0, 41.0, 90.0]
    iqm, low, high, method = iqm_interval(values)
    assert "rliable" not in method and "2000 resamples" in method
    _, cis = library.get_interval_estimates({"x": np.asarray(values).reshape(-1, 1)},
                                            lambda s: np.array([metrics.aggregate_iqm(s)]), reps=2000)
    assert iqm == pytest.approx(np.mean(sorted(values)[2:8]))  # the middle 50%
    assert low < iqm < high
    assert low == pytest.approx(cis["x"][0][0], rel=0.1) and high == pytest.approx(cis["x"][1][0], rel=0.1)
    assert iqm_interval([5.0] * 4)[:3] == (5.0, 5.0, 5.0)


def test_box_actions_are_clipped_means_and_survive_export(tmp_path):
    from nitro.policy.envs import env_spaces
    from nitro.policy.models import Policy, spec_for_spaces
    from nitro.policy.trained import TrainedPolicy

    spec = spec_for_spaces(*env_spaces("Pendulum-v1"), hidden_sizes=(16,), obs_norm=True)
    torch.manual_seed(0)  # a fixed network: the test is about clipping, not about one draw of weights
    module = Policy(spec)
    with torch.no_grad():
        module.actor.out.bias.fill_(1.5)  # means beyond the bounds [-2, 2] for some observations
        module.actor.out.weight.mul_(200.0)
    policy = TrainedPolicy(spec, module.numpy_state(), {"env_id": "Pendulum-v1"})
    batch = np.random.default_rng(0).uniform(-1, 1, size=(32, 3)).astype(np.float32)
    actions, _ = policy.predict(batch, deterministic=True)
    assert actions.shape == (32, 1) and actions.dtype == np.float32 and policy.predict(batch[0])[0].shape == (1,)
    with torch.no_grad():
        means = module.distribution(torch.as_tensor(batch)).mean.numpy()
    assert np.abs(means).max() > 2.0 and np.allclose(actions, np.clip(means, -2.0, 2.0), atol=1e-5)
    reloaded = load_policy(export_policy(policy, tmp_path / "pendulum").parent)
    assert np.array_equal(reloaded.predict(batch, deterministic=True)[0], actions)
    assert np.array_equal(reloaded.state["log_std"], policy.state["log_std"])


@pytest.mark.parametrize("fps,step,gif_fps", [(50, 1, 50.0), (125, 5, 25.0), (20, 1, 20.0), (60, 3, 20.0)])
def test_gif_keeps_real_time_in_whole_hundredths(fps, step, gif_fps):
    from nitro.policy.video import gif_timing

    assert gif_timing(fps) == (step, gif_fps)


@pytest.mark.parametrize("argv", [["--help"], ["eval", "--help"], ["export", "--help"]])
def test_help_renders(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 0 and "eval" in capsys.readouterr().out
