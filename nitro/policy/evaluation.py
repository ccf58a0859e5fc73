"""Evaluate a trained policy: deterministic episodes, each on its own seed, and their IQM with a 95% CI.

Episodes run through nitro.policy.rollout.evaluate, the learner's own evaluation: episode i on seed + i,
mean action (Box) or argmax (Discrete). Given the learner's evaluation seed, a checkpoint's round is
reproduced exactly. The interval is a percentile bootstrap over episodes of the interquartile mean
(the mean of the middle 50%), from nitro.stats. One episode has no interval: resampling one value can only
give it back. Beside them: a random policy's return on the same episodes and a measured reference to compare
with (`nitro eval --vs-random --reference FILE`).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass

import gymnasium as gym
import numpy as np

from nitro import stats
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
    """(IQM, 2.5th, 97.5th percentile of its bootstrap distribution, how it was computed), from nitro.stats (the
    one home of the IQM and its interval). A single value gives back an interval of zero width, which is no
    interval: evaluate_policy reports none for one episode."""
    ci = stats.iqm_interval(np.asarray(values, dtype=float).reshape(-1), reps=reps, seed=seed)
    return ci.point, ci.low, ci.high, f"percentile bootstrap over episodes, {reps} resamples"


def random_returns(env_id: str, episodes: int, seed: int, env_kwargs: dict | None = None) -> list[float]:
    """A uniformly random policy on the episodes evaluate_policy runs (episode i on seed + i): what a trained
    policy's return is compared with first. Actions are drawn from the action space seeded with `seed`."""
    env = make_env(env_id, **dict(env_kwargs or {}))
    env.action_space.seed(seed)
    returns = []
    try:
        for ep in range(episodes):
            env.reset(seed=seed + ep)
            total, done = 0.0, False
            while not done:
                _, r, term, trunc, _ = env.step(env.action_space.sample())
                total += float(r)
                done = term or trunc
            returns.append(total)
    finally:
        env.close()
    return returns


@dataclass
class Reference:
    """A measured return to compare a policy with, e.g. another library's PPO at the same env steps
    (bench/sb3_reference.py writes one). The file is JSON with these fields; `returns` are evaluation episodes."""

    label: str
    env_id: str
    env_steps: int
    returns: list[float]
    source: str = ""  # where the measurement is described (a docs page and anchor)
    command: str = ""  # how to measure it again

    @property
    def iqm(self) -> float:
        return stats.iqm(self.returns)


def load_reference(path) -> Reference:
    """Read a reference file; every problem is a ConfigError that names the file and the field."""
    import json
    from pathlib import Path

    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"reference: cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"reference: {path} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"reference: {path} must hold a JSON object, got {type(doc).__name__}")
    for field, kind in (("label", str), ("env_id", str), ("env_steps", int), ("returns", list)):
        if not isinstance(doc.get(field), kind) or isinstance(doc.get(field), bool):
            raise ConfigError(f"reference: {path}: field {field!r} must be a {kind.__name__}, got "
                              f"{doc.get(field)!r}")
    returns = doc["returns"]
    if not returns or not all(isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r)
                              for r in returns):
        raise ConfigError(f"reference: {path}: field 'returns' must be a non-empty list of finite numbers")
    return Reference(doc["label"], doc["env_id"], doc["env_steps"], [float(r) for r in returns],
                     str(doc.get("source", "")), str(doc.get("command", "")))


def write_reference(path, reference: Reference, **extra) -> None:
    import json
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({**asdict(reference), **extra}, indent=1) + "\n", encoding="utf-8")


def comparison_lines(result: Evaluation, random: list[float] | None = None,
                     reference: Reference | None = None, training: dict | None = None) -> list[str]:
    """What the evaluation's numbers mean, one line each: the policy against a random policy on the same
    episodes, against a reference (with its env steps beside the training's), and the training's two costs
    (`training`: a job's summary.json; docs/cost.md explains both clocks)."""
    lines = []
    if random is not None:
        r = stats.iqm(random)
        times = f", {result.iqm / r:.0f}x" if r > 0 and result.iqm > 0 else ""
        lines.append(f"random    IQM {r:.2f} on the same {len(random)} episodes (this policy {result.iqm:.2f}{times})")
    if reference is not None:
        steps = ""
        if training and training.get("total_env_steps"):
            steps = f"; this policy's training took {int(training['total_env_steps']):,}"
        where = f" ({reference.source})" if reference.source else ""
        lines.append(f"reference IQM {reference.iqm:.2f} over {len(reference.returns)} episodes: {reference.label}"
                     f" at {reference.env_steps:,} env steps{steps}{where}")
        if reference.env_id != result.env_id:
            lines.append(f"          note: the reference was measured on {reference.env_id}, this evaluation ran "
                         f"{result.env_id}")
    if training:
        lines.append(f"cost      ${training['cloud_total_cost_usd']:.4f} modelled for AWS Lambda and the learner's "
                     f"instance over {training['cloud_seconds']:.0f} s of cloud time (docs/cost.md)")
        lines.append(f"          ${training['total_cost_usd']:.4f} at this machine's {training['wall_s']:.0f} s of "
                     f"wall time, priced the same way (docs/cost.md, the two clocks)")
    return lines
