"""Evaluate a trained policy: deterministic episodes, each on its own seed, and their IQM with a 95% CI.

Episodes run through nitro.policy.rollout.evaluate, the learner's own evaluation: episode i on seed + i,
mean action (Box) or argmax (Discrete). Given the learner's evaluation seed, a checkpoint's round is
reproduced exactly. The interval is a percentile bootstrap over episodes of the interquartile mean
(the mean of the middle 50%), from rliable where it is installed, else from an equivalent here. One
episode has no interval: resampling one value can only give it back.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import warnings
from dataclasses import asdict, dataclass

import gymnasium as gym
import numpy as np
from scipy.stats import trim_mean

from nitro.errors import ConfigError, PolicyError
from nitro.policy.envs import AtariOptions, is_atari, make_env, resolve_env_id
from nitro.policy.rollout import evaluate
from nitro.policy.trained import TrainedPolicy
from nitro.policy.video import VideoWriter, check_video_path

BOOTSTRAP_REPS = 2000
NO_INTERVAL = "n=1: no confidence interval, which needs at least 2 episodes"


@dataclass
class Evaluation:
    env_id: str
    seed: int  # episode i ran on seed + i
    returns: list[float]
    iqm: float
    iqm_ci95: tuple[float, float] | None  # None for a single episode (ci_method says so)
    ci_method: str
    video: str | None = None  # the first episode's video
    video_frames: int = 0

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))

    def to_dict(self) -> dict:
        return {**asdict(self), "episodes": len(self.returns), "mean": self.mean, "std": self.std,
                "min": float(np.min(self.returns)), "max": float(np.max(self.returns)),
                "iqm_ci95": list(self.iqm_ci95) if self.iqm_ci95 is not None else None}


def evaluate_policy(policy: TrainedPolicy, env_id: str = "", episodes: int = 10, seed: int = 0,
                    video: str | None = None) -> Evaluation:
    """Run `episodes` deterministic episodes on env_id (default: the one the policy was trained on, built
    with the training's env_kwargs); `video` (.mp4 or .gif) records the first."""
    env_id = env_id or policy.env_id
    env_kwargs = dict(policy.info.get("env_kwargs") or {}) if env_id == policy.env_id else {}
    if not env_id:
        raise PolicyError("env: the policy does not say which environment it was trained on; name one")
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ConfigError(f"episodes: must be an integer >= 1, got {episodes!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed: must be an integer >= 0, got {seed!r}")
    if video:
        check_video_path(video)
    with rendering_environment() if video else contextlib.nullcontext():
        env = make_env(env_id, **env_kwargs)
        try:
            policy.check_spaces(env.observation_space, env.action_space, env_id)
            fps = float(env.metadata.get("render_fps") or 30)
        finally:
            env.close()
        if is_atari(resolve_env_id(env_id)):
            fps /= AtariOptions().frame_skip  # one step is frame_skip emulator frames
        with VideoWriter(video, fps) if video else contextlib.nullcontext() as writer:
            try:
                returns = evaluate(policy.runner, env_id, episodes, seed, env_kwargs=env_kwargs,
                                   on_frame=writer.append if writer else None)
            except gym.error.Error as exc:  # e.g. a renderer that is not installed
                raise ConfigError(f"video: {env_id} cannot render rgb_array frames: {exc}") from None
    if len(returns) < 2:
        iqm, interval, method = float(returns[0]), None, NO_INTERVAL
    else:
        iqm, low, high, method = iqm_interval(returns)
        interval = (low, high)
    return Evaluation(env_id, seed, returns, iqm, interval, method, str(video) if video else None,
                      writer.frames if video else 0)


@contextlib.contextmanager
def rendering_environment():
    """The environment variables the renderers read, set while an evaluation records and restored after, so
    a process that calls evaluate_policy keeps its own environment:
    - MUJOCO_GL=egl without a display (MuJoCo's default, GLFW, needs one; EGL renders headless);
    - PYGAME_HIDE_SUPPORT_PROMPT: pygame (gymnasium's classic-control renderer) greets on stdout at import,
      where `nitro eval --json` writes;
    - XDG_RUNTIME_DIR, where it is unset or not an absolute path to a directory: a private empty one. SDL
      (under pygame) probes for a Wayland display even to draw offscreen, and libwayland prints "error:
      XDG_RUNTIME_DIR is invalid or not set in the environment." without one, which reads as nitro's error."""
    names = ("MUJOCO_GL", "PYGAME_HIDE_SUPPORT_PROMPT", "XDG_RUNTIME_DIR")
    saved = {name: os.environ.get(name) for name in names}
    private = None
    try:
        if not os.environ.get("DISPLAY"):
            os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
        runtime_dir = os.environ.get("XDG_RUNTIME_DIR", "")
        if not (os.path.isabs(runtime_dir) and os.path.isdir(runtime_dir)):
            private = tempfile.mkdtemp(prefix="nitro-render-")  # mode 0700, as the XDG spec asks
            os.environ["XDG_RUNTIME_DIR"] = private
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if private:
            shutil.rmtree(private, ignore_errors=True)


def iqm_interval(values, reps: int = BOOTSTRAP_REPS, seed: int = 0) -> tuple[float, float, float, str]:
    """(IQM, 2.5th, 97.5th percentile of its bootstrap distribution, how it was computed). A single value
    gives back an interval of zero width, which is no interval: evaluate_policy reports none for one episode."""
    x = np.asarray(values, dtype=float).reshape(-1)
    if not x.size:
        return math.nan, math.nan, math.nan, "no values"
    try:
        from rliable import library, metrics
    except ImportError:
        low, high = _bootstrap_iqm(x, reps, seed)
        return float(trim_mean(x, 0.25)), low, high, f"percentile bootstrap over episodes, {reps} resamples"
    # rliable draws its resamples from numpy's global RNG: seed it for a reproducible interval, then restore it.
    saved = np.random.get_state()
    np.random.seed(seed)
    try:
        with warnings.catch_warnings():  # arch warns about the RandomState rliable passes it
            warnings.simplefilter("ignore", FutureWarning)
            points, cis = library.get_interval_estimates(
                {"x": x.reshape(-1, 1)}, lambda s: np.array([metrics.aggregate_iqm(s)]), reps=reps,
                random_state=np.random.RandomState(seed))
    finally:
        np.random.set_state(saved)
    return (float(points["x"][0]), float(cis["x"][0][0]), float(cis["x"][1][0]),
            f"rliable percentile bootstrap over episodes, {reps} resamples")


def _bootstrap_iqm(x: np.ndarray, reps: int, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    resampled = x[rng.integers(0, len(x), size=(reps, len(x)))]
    low, high = np.percentile(trim_mean(resampled, 0.25, axis=1), [2.5, 97.5])
    return float(low), float(high)
