"""`nitro check-env`: build and step an environment exactly as an actor does, before training on it.

The id goes through nitro.policy.envs as in the services (the registry, ALE ids, "module:EnvId" ids
whose module must be listed in NITRO_ENV_MODULES), the keyword arguments through the checks
of a spec's env_kwargs, and the environment is built and sampled by the actor's own
Sampler with a freshly initialised policy of the default preset, the policy round 0's actors
run: near-uniform over Discrete actions, N(0, 1) around zero for Box actions. The report
says which network the spaces get (an MLP, or the CNN for image observations), how many
episodes ended, the sampling speed and where its time went, and what looks wrong.

Errors: EnvCheckError with exit_code 2 when the environment cannot be built (an unknown id, a
module that is not allowed or does not import, keyword arguments or a constructor that fail);
a report whose `problems` are not empty when it was built but nitro cannot train on it
(unsupported spaces, an exception or non-finite values while stepping).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

from nitro.errors import ConfigError, NitroError, UnknownEnvironmentError

DEFAULT_PRESET = "tuned"  # TrainingSpec's default preset: its network is what a job gets without flags
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class EnvCheckError(NitroError):
    """The environment cannot be built; the message says why, `exit_code` is the CLI's."""

    def __init__(self, message: str, exit_code: int = 2):
        self.exit_code = exit_code
        super().__init__(message)


@dataclass
class EnvCheck:
    env_id: str
    registered_id: str = ""
    module_file: str = ""  # where a "module:EnvId" module was imported from
    env_kwargs: dict = field(default_factory=dict)
    observation_space: str = ""
    action_space: str = ""
    policy: str = ""  # the network nitro builds for these spaces; "" when unsupported
    steps: int = 0  # steps sampled
    episodes: int = 0  # episodes that ended inside them
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    sample_seconds: float = 0.0
    env_seconds: float = 0.0  # of sample_seconds, inside the environment's reset and step
    problems: list[str] = field(default_factory=list)  # nitro cannot train on it
    warnings: list[str] = field(default_factory=list)  # it can, but look at these

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.sample_seconds if self.sample_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "ok": self.ok, "steps_per_second": self.steps_per_second}


class _Timed(gym.Wrapper):
    """Counts the seconds spent in the wrapped environment's reset and step, and keeps a few raw
    observations (before the Sampler casts them to the space's dtype) to check against the space."""

    def __init__(self, env: gym.Env, keep: int = 16):
        super().__init__(env)
        self.seconds = 0.0
        self.raw: list = []
        self.keep = keep

    def _note(self, obs) -> None:
        if len(self.raw) < self.keep:
            self.raw.append(obs)

    def reset(self, **kwargs):
        t = time.perf_counter()
        obs, info = self.env.reset(**kwargs)
        self.seconds += time.perf_counter() - t
        self._note(obs)
        return obs, info

    def step(self, action):
        t = time.perf_counter()
        out = self.env.step(action)
        self.seconds += time.perf_counter() - t
        self._note(out[0])
        return out


def _where(exc: BaseException) -> str:
    """' (at file.py:LINE in func)' of the innermost frame, the environment's code as a rule."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name})"


def _describe_policy(spec) -> str:
    """The network nitro builds for a ModelSpec, in one line."""
    if spec.action_kind == "box":
        low, high = spec.action_low, spec.action_high
        bounds = f"[{low[0]:g}, {high[0]:g}]" if len(set(low)) == 1 and len(set(high)) == 1 else \
            f"low {list(low)}, high {list(high)}"
        dims = f"{spec.action_dim} action dimension{'' if spec.action_dim == 1 else 's'}"
        head = f"Gaussian over {dims}, clipped to {bounds}"
    else:
        head = f"categorical over {spec.action_dim} actions"
    if spec.arch == "cnn":
        c, h, w = spec.obs_shape
        body = f"CNN over {c}x{h}x{w} (channels, height, width) frames, pixels scaled by 1/255"
    else:
        flat = int(np.prod(spec.obs_shape)) if spec.obs_shape else 1
        shape = " flattened" if len(spec.obs_shape) > 1 else ""
        body = f"MLP {flat}{shape} -> {' -> '.join(str(h) for h in spec.hidden_sizes)} ({spec.activation})"
    return f"{body}; {head}"


def _space_warnings(obs_space: gym.Space, spec) -> list[str]:
    out = []
    if spec.arch == "cnn":
        shape = obs_space.shape
        if obs_space.dtype != np.uint8:
            out.append(f"image observations are {obs_space.dtype}, the CNN expects uint8 pixels in 0..255 "
                       f"(it scales them by 1/255)")
        if shape[-1] in (1, 3, 4) and shape[0] > 4:
            out.append(f"observation shape {shape} looks channels-last; the CNN reads (channels, height, width): "
                       f"transpose the frames in the environment (np.transpose(frame, (2, 0, 1)))")
    if isinstance(obs_space, gym.spaces.Box) and spec.arch == "mlp" and obs_space.dtype == np.uint8 \
            and obs_space.shape and int(np.prod(obs_space.shape)) > 1024:
        out.append(f"uint8 observations of shape {obs_space.shape} go to an MLP; image observations should be "
                   f"(channels, height, width) to get the CNN")
    return out


def check_env(env_id: str, steps: int = 1000, env_kwargs: dict | None = None, seed: int = 0) -> EnvCheck:
    """Build `env_id` as an actor does, sample `steps` steps with an initial policy, and report."""
    from nitro.policy import env_kwargs as ek
    from nitro.policy.envs import resolve_env_id
    from nitro.policy.rollout import Sampler

    if steps < 1:
        raise ConfigError(f"steps must be >= 1, got {steps}")
    report = EnvCheck(env_id)
    try:
        report.env_kwargs = ek.check(env_kwargs or {})
    except ek.EnvKwargsError as exc:
        raise EnvCheckError(str(exc)) from None
    try:
        report.registered_id = resolve_env_id(env_id)
    except UnknownEnvironmentError as exc:
        raise EnvCheckError(f"env: {exc}") from None
    except Exception as exc:  # the module imported but raised while running (anything a user module may raise)
        raise EnvCheckError(f"env: importing the module of {env_id!r} raised {type(exc).__name__}: {exc}"
                            f"{_where(exc)}") from None
    if ":" in env_id:
        module = sys.modules.get(env_id.partition(":")[0])
        report.module_file = str(getattr(module, "__file__", "") or "")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            sampler = Sampler(env_id, seed=seed, env_kwargs=report.env_kwargs)  # gym.make and reset, as an actor
        except Exception as exc:
            what = f"gym.make({report.registered_id!r}, **{report.env_kwargs})" if report.env_kwargs else \
                f"gym.make({report.registered_id!r})"
            raise EnvCheckError(f"env: {env_id} cannot be built: {what} then reset(seed={seed}) raised "
                                f"{type(exc).__name__}: {exc}{_where(exc)}") from None
        try:
            _sample(report, sampler, steps, seed)
        finally:
            sampler.close()
    seen = set()
    for w in caught:
        text = _ANSI.sub("", str(w.message)).strip()
        if text not in seen and not text.startswith("Overriding environment"):
            seen.add(text)
            report.warnings.append(f"{w.category.__name__}: {text}")
    return report


def _sample(report: EnvCheck, sampler, steps: int, seed: int) -> None:
    from nitro.config import make_config
    from nitro.policy.envs import is_atari, make_env
    from nitro.policy.inference import PolicyRunner
    from nitro.policy.model_spec import spec_for_spaces

    env = sampler.env
    obs_space, act_space = env.observation_space, env.action_space
    report.observation_space, report.action_space = str(obs_space), str(act_space)
    cfg = make_config("ppo", DEFAULT_PRESET)
    try:
        spec = spec_for_spaces(obs_space, act_space, hidden_sizes=cfg.hidden_sizes, activation=cfg.activation,
                               obs_norm=cfg.obs_norm, init_log_std=cfg.init_log_std)
    except ConfigError as exc:
        report.problems.append(f"{exc}; nitro's policies take Box observations (1-D or flat: an MLP; "
                               f"(channels, height, width): the CNN) and Box (1-D) or Discrete actions")
        return
    report.policy = _describe_policy(spec)
    report.warnings.extend(_space_warnings(obs_space, spec))
    first_obs = sampler.obs

    import torch

    from nitro.policy.models import Policy

    torch.manual_seed(seed)
    runner = PolicyRunner(spec, Policy(spec).numpy_state(), version=0)
    timed = sampler.env = _Timed(env)
    timed.raw.append(first_obs)
    t0 = time.perf_counter()
    try:
        batch = sampler.sample(runner, steps, np.random.default_rng(seed))
    except Exception as exc:
        report.problems.append(f"sampling raised {type(exc).__name__}: {exc}{_where(exc)}")
        return
    finally:
        report.sample_seconds = time.perf_counter() - t0
        report.env_seconds = timed.seconds
    report.steps = steps
    report.episode_returns = [float(r) for r in batch["episode_returns"]]
    report.episode_lengths = [int(n) for n in batch["episode_lengths"]]
    report.episodes = len(report.episode_returns)

    if not np.all(np.isfinite(batch["rewards"])):
        report.problems.append("rewards are not all finite (NaN or inf): training would diverge")
    if np.issubdtype(batch["obs"].dtype, np.floating) and not np.all(np.isfinite(batch["obs"])):
        report.problems.append("observations are not all finite (NaN or inf)")
    outside = [o for o in timed.raw if not obs_space.contains(np.asarray(o))]
    if outside:
        o = np.asarray(outside[0])
        report.warnings.append(f"{len(outside)} of the first {len(timed.raw)} observations are outside the "
                               f"observation space (e.g. dtype {o.dtype}, shape {o.shape}); actors cast them to "
                               f"{obs_space.dtype}")
    limit = env.spec.max_episode_steps if env.spec is not None else None
    if not report.episodes and limit is None and not is_atari(report.registered_id):
        report.warnings.append(f"no episode ended in {steps} steps and the id has no time limit: episode "
                               f"returns, and evaluation, which runs episodes to their end, need episodes that "
                               f"end; register the id with max_episode_steps, or pass --env-kwarg "
                               f"max_episode_steps=N")
    twin = make_env(report.env_id, **report.env_kwargs)
    try:
        again, _ = twin.reset(seed=seed)
    finally:
        twin.close()
    if not np.array_equal(np.asarray(again), np.asarray(first_obs)):
        report.warnings.append(f"two instances reset with seed {seed} start from different observations: the "
                               f"environment ignores reset(seed=...), so --reproducible runs will not repeat")
