"""Bring your own environment (docs/custom-envs.md): the example LineWalk-v0 trained through the real
local system by `nitro train --local --env line_walk:LineWalk-v0`, and `nitro check-env` on good,
unknown, not-allowed and broken environments."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from nitro.client import cli

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "custom_env"
LINE_WALK = "line_walk:LineWalk-v0"


@pytest.fixture
def allowed(monkeypatch):
    """The example's directory importable and its module allowed, as the guide sets them."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.setenv("NITRO_ENV_MODULES", "line_walk")


def check(capsys, *argv: str) -> tuple[int, dict | None, str]:
    """`nitro check-env ... --json`: exit code, the JSON report (None on an error), stderr."""
    rc = cli.main(["check-env", *argv, "--json"])
    out, err = capsys.readouterr()
    return rc, json.loads(out) if out.strip() else None, err


# --- the example environment through the whole local system ---------------------------------------


@pytest.mark.system
def test_nitro_train_local_trains_the_example_module(tmp_path):
    """As in the guide: the module sits in the working directory, PYTHONPATH=. and NITRO_ENV_MODULES name it;
    the learner (spaces, evaluation) and every actor import it."""
    shutil.copy(EXAMPLE / "line_walk.py", tmp_path / "line_walk.py")
    nitro = shutil.which("nitro", path=str(Path(sys.executable).parent))
    cmd = [nitro] if nitro else [sys.executable, "-m", "nitro.client.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NITRO_")}
    env.update(PYTHONPATH=".", NITRO_ENV_MODULES="line_walk")  # relative on purpose: the services run elsewhere
    proc = subprocess.run(
        [*cmd, "train", "--local", "--env", LINE_WALK, "--preset", "fast", "--rounds", "2", "--steps-per-actor", "128",
         "--scaler", "fixed:2", "--eval-episodes", "2", "--budget", "1", "--seed", "1", "--job-id", "line-walk",
         "--no-progress"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "job line-walk SUCCEEDED" in proc.stdout
    results = tmp_path / "results" / "line-walk"
    with open(results / "rounds.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["round"] for r in rows] == ["0", "1"]
    assert all(int(r["actors_completed"]) == 2 and int(r["actors_failed"]) == 0 for r in rows), rows
    assert all(-1.0 - 1e-6 <= float(r["eval_return"]) <= 1.0 for r in rows)  # LineWalk's returns lie in [-1, 1]
    summary = json.loads((results / "summary.json").read_text())
    assert summary["spec"]["env_id"] == LINE_WALK and summary["total_env_steps"] == 2 * 2 * 128
    assert (results / "checkpoint.pt").is_file()


@pytest.mark.system
def test_a_running_learner_names_its_own_nitro_env_modules_not_the_shells(tmp_path):
    """The new user's trap: `nitro up` started without NITRO_ENV_MODULES, then the variable set in the shell
    that submits the job. The learner refuses the id, and must say that its environment (the one `nitro up`
    started with) is what counts, and how to change it; the shell's value is not the learner's."""
    nitro = shutil.which("nitro", path=str(Path(sys.executable).parent))
    cmd = [nitro] if nitro else [sys.executable, "-m", "nitro.client.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NITRO_")}
    state = str(tmp_path / "state")
    up = subprocess.run([*cmd, "up", "--state-dir", state, "--concurrency", "1"], env=env, capture_output=True,
                        text=True, timeout=200)
    try:
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
        shell = {**env, "PYTHONPATH": str(EXAMPLE), "NITRO_ENV_MODULES": "line_walk"}
        proc = subprocess.run([*cmd, "train", "--local", "--state-dir", state, "--env", LINE_WALK, "--rounds", "1",
                               "--no-progress"], env=shell, capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run([*cmd, "down", "--state-dir", state], env=env, capture_output=True, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = proc.stderr
    assert "INVALID_ARGUMENT" in err and "module 'line_walk' is not in the learner's NITRO_ENV_MODULES" in err
    assert "(it is unset there;" in err  # the learner's value, not the shell's 'line_walk'
    assert "not the one of the shell that submitted the job" in err
    assert "`nitro down`" in err and "`NITRO_ENV_MODULES=line_walk nitro up`" in err


def test_outside_a_service_the_message_says_where_the_variable_counts(monkeypatch):
    from nitro.errors import UnknownEnvironmentError
    from nitro.policy.envs import resolve_env_id

    monkeypatch.setenv("NITRO_ENV_MODULES", "other_pkg, more")
    with pytest.raises(UnknownEnvironmentError) as exc:
        resolve_env_id("nitro_never_imported:Env-v0")
    msg = str(exc.value)
    assert "module 'nitro_never_imported' is not in NITRO_ENV_MODULES (it is 'other_pkg,more' in this process" in msg
    assert "set NITRO_ENV_MODULES=nitro_never_imported in this shell" in msg
    assert "for a job on a running system, in the learner's and the actors' environment" in msg and "nitro up" in msg


def test_the_example_renders_and_honours_its_keyword_arguments(allowed):
    from nitro.policy.envs import make_env

    env = make_env(LINE_WALK, seed=3, step_size=0.5, render_mode="rgb_array")
    obs, _ = env.reset(seed=3)
    assert obs.shape == (2,) and obs.dtype == np.float32
    moved, *_ = env.step(2)
    assert moved[0] == pytest.approx(min(obs[0] + 0.5, 1.0))
    assert env.render().shape == (40, 220, 3)
    assert env.spec.max_episode_steps == 100
    env.close()


# --- nitro check-env --------------------------------------------------------------------------------


def test_check_env_reports_spaces_policy_episodes_and_speed(allowed, capsys):
    rc, r, err = check(capsys, LINE_WALK, "--steps", "600")
    assert rc == 0, err
    assert r["ok"] and r["registered_id"] == "LineWalk-v0" and r["module_file"] == str(EXAMPLE / "line_walk.py")
    assert r["observation_space"] == "Box(-1.0, 1.0, (2,), float32)" and r["action_space"] == "Discrete(3)"
    assert r["policy"].startswith("MLP 2 -> 256 -> 256") and "categorical over 3 actions" in r["policy"]
    assert r["steps"] == 600 and r["episodes"] == len(r["episode_returns"]) > 0
    assert all(-1.0 - 1e-6 <= x <= 1.0 for x in r["episode_returns"]) and max(r["episode_lengths"]) <= 100
    assert r["steps_per_second"] > 0 and 0 < r["env_seconds"] < r["sample_seconds"]
    assert r["warnings"] == [] and r["problems"] == []
    assert "ok: nitro can train on line_walk:LineWalk-v0" in err and "steps/s" in err


def test_check_env_passes_keyword_arguments_as_a_job_does(allowed, capsys):
    rc, r, _ = check(capsys, LINE_WALK, "--steps", "200", "--env-kwarg", "step_size=0.5",
                     "--env-kwarg", "max_episode_steps=7")
    assert rc == 0 and r["env_kwargs"] == {"step_size": 0.5, "max_episode_steps": 7}
    assert max(r["episode_lengths"]) <= 7
    rc, r, err = check(capsys, LINE_WALK, "--env-kwarg", "step_size=2")
    assert rc == 2 and r is None
    assert "cannot be built" in err and "ValueError: step_size must be in (0, 1], got 2" in err and "line_walk.py:" in err
    rc, _, err = check(capsys, LINE_WALK, "--env-kwarg", "render_mode=human")
    assert rc == 2 and "env_kwargs: keyword 'render_mode' is set by the services" in err


def test_check_env_names_an_unknown_id(capsys):
    rc, r, err = check(capsys, "CartPol-v1")
    assert rc == 2 and r is None
    assert "unknown environment id 'CartPol-v1'; did you mean 'CartPole-v1'" in err


def test_check_env_never_imports_a_module_that_is_not_allowed(tmp_path, monkeypatch, capsys):
    marker = tmp_path / "imported"
    (tmp_path / "nitro_probe_envmod.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("NITRO_ENV_MODULES", "line_walk")  # another module is allowed, not this one
    rc, _, err = check(capsys, "nitro_probe_envmod:Probe-v0")
    assert rc == 2 and "module 'nitro_probe_envmod' is not in NITRO_ENV_MODULES" in err
    assert not marker.exists() and "nitro_probe_envmod" not in sys.modules


def test_check_env_says_when_an_allowed_module_does_not_import_or_register(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NITRO_ENV_MODULES", "nitro_missing_envmod,line_walk")
    rc, _, err = check(capsys, "nitro_missing_envmod:Gone-v0")
    assert rc == 2 and "No module named 'nitro_missing_envmod'" in err and "PYTHONPATH" in err
    monkeypatch.syspath_prepend(str(EXAMPLE))
    rc, _, err = check(capsys, "line_walk:LineWalk-v9")
    assert rc == 2 and "registered no 'LineWalk-v9'" in err and "did you mean 'LineWalk-v0'" in err


def test_check_env_rejects_unsupported_spaces_with_exit_1(capsys):
    rc, r, err = check(capsys, "Blackjack-v1", "--steps", "50")
    assert rc == 1 and not r["ok"] and r["policy"] == ""
    assert "only Box observations are supported" in r["problems"][0]
    assert "NOT OK: nitro cannot train on Blackjack-v1" in err


# --- environments with something wrong ---------------------------------------------------------------


class _Walk(gym.Env):
    """A 1-D walk; subclasses break one thing each."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return self.np_random.normal(size=3).astype(np.float32)

    def step(self, action):
        self.t += 1
        return self._obs(), float(-np.sum(np.square(action))), self.t >= 20, False, {}


class _CrashesAtStep5(_Walk):
    def step(self, action):
        if self.t == 4:
            raise RuntimeError("the simulator lost its state")
        return super().step(action)


class _NaNReward(_Walk):
    def step(self, action):
        obs, _, term, trunc, info = super().step(action)
        return obs, float("nan"), term, trunc, info


class _Sloppy(_Walk):
    """float64 observations for a float32 space, a seed it ignores, and episodes that never end."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=None)  # drops the seed
        return self._obs().astype(np.float64), {}

    def step(self, action):
        obs, reward, *_ = super().step(action)
        return obs.astype(np.float64), reward, False, False, {}


class _Frames(gym.Env):
    """Small uint8 frames; channels_last puts the channels at the end, as many image envs do."""

    action_space = gym.spaces.Discrete(4)

    def __init__(self, channels_last: bool = False):
        shape = (24, 24, 3) if channels_last else (3, 24, 24)
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)

    def _obs(self):
        return self.np_random.integers(0, 256, self.observation_space.shape, dtype=np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= 10, False, {}


class _Grid(gym.Env):
    """A 4x4 board as a (4, 4) Box: not 1-D, not an image; the MLP takes it flattened."""

    observation_space = gym.spaces.Box(0.0, 1.0, (4, 4), np.float32)
    action_space = gym.spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cell, self.t = int(self.np_random.integers(16)), 0
        return self._obs(), {}

    def _obs(self):
        board = np.zeros((4, 4), np.float32)
        board.flat[self.cell] = 1.0
        return board

    def step(self, action):
        self.t += 1
        self.cell = (self.cell + (1, -1, 4, -4)[int(action)]) % 16
        return self._obs(), float(self.cell == 15), self.cell == 15, self.t >= 20, {}


BROKEN = {"NitroCheckCrash-v0": _CrashesAtStep5, "NitroCheckNaN-v0": _NaNReward, "NitroCheckSloppy-v0": _Sloppy,
          "NitroCheckFrames-v0": _Frames, "NitroCheckWalk-v0": _Walk, "NitroCheckGrid-v0": _Grid}


@pytest.fixture(scope="module", autouse=True)
def broken_envs():
    for env_id, cls in BROKEN.items():
        gym.register(env_id, entry_point=cls)
    yield
    for env_id in BROKEN:
        gym.registry.pop(env_id, None)


def test_a_box_action_env_gets_a_gaussian_policy(capsys):
    rc, r, _ = check(capsys, "NitroCheckWalk-v0", "--steps", "100")
    assert rc == 0 and r["warnings"] == [], r
    assert "Gaussian over 2 action dimensions, clipped to [-1, 1]" in r["policy"] and r["episodes"] == 5


def test_an_exception_while_stepping_is_a_problem_naming_where(capsys):
    rc, r, err = check(capsys, "NitroCheckCrash-v0", "--steps", "100")
    assert rc == 1 and not r["ok"]
    assert "sampling raised RuntimeError: the simulator lost its state (at test_custom_env.py:" in r["problems"][0]
    assert "NOT OK" in err


def test_non_finite_rewards_are_a_problem(capsys):
    rc, r, _ = check(capsys, "NitroCheckNaN-v0", "--steps", "50")
    assert rc == 1 and any("rewards are not all finite" in p for p in r["problems"])


def test_warnings_for_dtype_seeding_and_endless_episodes(capsys):
    rc, r, err = check(capsys, "NitroCheckSloppy-v0", "--steps", "60")
    assert rc == 0 and r["ok"] and r["episodes"] == 0
    text = "\n".join(r["warnings"])
    assert "outside the observation space (e.g. dtype float64" in text
    assert "ignores reset(seed=...)" in text
    assert "no episode ended in 60 steps and the id has no time limit" in text
    assert "warning      " in err and "ok: nitro can train" in err


def test_image_observations_get_the_cnn_and_channels_last_is_flagged(capsys):
    rc, r, _ = check(capsys, "NitroCheckFrames-v0", "--steps", "30")
    assert rc == 0 and r["policy"].startswith("CNN over 3x24x24") and r["warnings"] == [], r
    rc, r, _ = check(capsys, "NitroCheckFrames-v0", "--steps", "30", "--env-kwarg", "channels_last=true")
    assert rc == 0 and any("looks channels-last" in w for w in r["warnings"]), r


def test_a_2d_box_observation_goes_flattened_to_the_mlp_and_trains(capsys):
    """The actors (numpy) and the learner (torch, batches of (n, 4, 4)) both flatten it."""
    from nitro.config import make_config
    from tests.inprocess import train_ppo

    rc, r, _ = check(capsys, "NitroCheckGrid-v0", "--steps", "100")
    assert rc == 0 and r["policy"].startswith("MLP 16 flattened -> 256 -> 256") and r["warnings"] == [], r
    result = train_ppo("NitroCheckGrid-v0", make_config("ppo", "fast", obs_norm=True), actors=2, steps_per_actor=64,
                       max_env_steps=256, seed=1, eval_episodes=1)
    assert [rec.env_steps for rec in result.rounds] == [128, 256]
    assert all(np.isfinite(rec.stats.policy_loss) for rec in result.rounds)
