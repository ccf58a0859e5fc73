"""Environment construction for any Gymnasium id.

Accepted ids: anything in the Gymnasium registry (classic control, MuJoCo v4/v5,
...), ALE ids such as "ALE/Qbert-v5" (ale_py is registered on demand and the
standard Atari preprocessing is applied), and user environments either
registered before the call or named as "some.module:EnvName-v0" (the module is
imported, which registers the id) when the module is listed in the
NITRO_ENV_MODULES environment variable of the learner and the actors. An unknown id fails at once with
an `UnknownEnvironmentError` naming it.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import sys
from dataclasses import dataclass

import gymnasium as gym

from nitro.errors import UnknownEnvironmentError

_ale_registered = False


@dataclass(frozen=True)
class AtariOptions:
    """Standard Atari preprocessing (paper 8.1 stacks 3 frames of 84x84 grayscale)."""

    frame_skip: int = 4
    frame_stack: int = 3
    screen_size: int = 84
    noop_max: int = 30
    terminal_on_life_loss: bool = False


def _register_ale() -> None:
    global _ale_registered
    if not _ale_registered:
        import ale_py

        gym.register_envs(ale_py)
        _ale_registered = True


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/") or env_id.endswith("NoFrameskip-v4")


def _allowed_modules() -> list[str]:
    return [m.strip() for m in os.environ.get("NITRO_ENV_MODULES", "").split(",") if m.strip()]


def _module_allowed(module: str) -> bool:
    return bool(module) and any(module == m or module.startswith(m + ".") for m in _allowed_modules())


def _this_service() -> str:
    """"the learner" or "this actor" in the processes of those services, told by the module they run as
    (`python -m learner_svc`; the local Lambda endpoint's workers, AWS Lambda's Python runtime), else "" (a
    command in the user's shell, or the SDK in a program)."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", "") or ""
    if name.split(".")[0] == "learner_svc":
        return "the learner"
    if name.startswith("nitro.local.lambda_endpoint") or name.split(".")[0] == "awslambdaric":
        return "this actor"
    return ""


def not_allowed_hint(module: str) -> str:
    """Why `module` is refused, naming whose NITRO_ENV_MODULES counts and how to change it. The variable is
    read by the process that resolves the id: for a job, the learner (and every actor), which took its
    environment from the shell that ran `nitro up`, not from the shell that submits the job."""
    allowed = _allowed_modules()
    value = f"it is {','.join(allowed)!r}" if allowed else "it is unset"
    service = _this_service()
    if service:
        return (f"module {module!r} is not in {service}'s NITRO_ENV_MODULES ({value} there; comma-separated "
                f"modules allowed for 'module:EnvId' ids). The learner's and the actors' environment counts, not "
                f"the one of the shell that submitted the job: the local system's services keep the environment "
                f"they were started with (`nitro up`'s), so stop it with `nitro down` and start it again with "
                f"`NITRO_ENV_MODULES={module} nitro up` (the module on its PYTHONPATH); deployed, set it in the "
                f"learner's and the actors' images or environment (docs/custom-envs.md)")
    return (f"module {module!r} is not in NITRO_ENV_MODULES ({value} in this process; comma-separated modules "
            f"allowed for 'module:EnvId' ids). It counts where the id is resolved: here for `nitro check-env`, "
            f"`nitro eval` and a `nitro train --local` that starts its own system (set NITRO_ENV_MODULES={module} "
            f"in this shell); for a job on a running system, in the learner's and the actors' environment, the "
            f"one `nitro up` started with (stop it with `nitro down` and start it again with the variable set)")


def resolve_env_id(env_id: str) -> str:
    """Return the registered id, importing/registering what it needs; raise if unknown."""
    if not isinstance(env_id, str) or not env_id.strip():
        raise UnknownEnvironmentError(str(env_id))
    if ":" in env_id:  # "module:EnvId": importing the module registers the id
        module, _, name = env_id.partition(":")
        if not _module_allowed(module):
            # Importing runs the module's code on the learner and on every actor: only what the
            # operator allowed. An id from a request must never pick arbitrary installed code.
            raise UnknownEnvironmentError(env_id, hint=not_allowed_hint(module))
        try:
            importlib.import_module(module)
        except (ImportError, ValueError, TypeError) as exc:
            where = " (is its directory on the PYTHONPATH of the learner and the actors?)" \
                if isinstance(exc, ModuleNotFoundError) and (module + ".").startswith(f"{exc.name}.") else ""
            raise UnknownEnvironmentError(env_id, hint=f"importing module {module!r} failed: "
                                                       f"{type(exc).__name__}: {exc}{where}") from exc
        hint = f"module {module!r} was imported but registered no {name!r} (gymnasium.register)"
        env_id = name
    else:
        hint = ""
    if env_id not in gym.registry and is_atari(env_id):
        _register_ale()
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry.keys()), n=3, cutoff=0.6)
        raise UnknownEnvironmentError(env_id, close, hint=hint)
    return env_id


ATARI_OPTION_NAMES = tuple(f.name for f in dataclasses.fields(AtariOptions))


def pop_atari_options(kwargs: dict, base: AtariOptions | None = None) -> AtariOptions:
    """`base` (default AtariOptions()) with the AtariOptions fields named in `kwargs`, which are removed from it."""
    return dataclasses.replace(base or AtariOptions(), **{k: kwargs.pop(k) for k in ATARI_OPTION_NAMES if k in kwargs})


def make_env(env_id: str, seed: int | None = None, *, atari: AtariOptions | None = None, **kwargs) -> gym.Env:
    """Build the environment, with Atari preprocessing for ALE ids, and seed it.

    For ALE ids, keyword arguments named like AtariOptions fields (e.g. frame_stack=4,
    as env_kwargs in an actor event) set the preprocessing; the rest go to gym.make, with
    obs_type="grayscale" unless given (the preprocessing reads the screen itself).
    """
    registered = resolve_env_id(env_id)
    if is_atari(registered):
        opts = pop_atari_options(kwargs, atari)
        # Frame skipping happens in the preprocessing wrapper, so the ALE env itself must not skip. The wrapper
        # reads each frame's grayscale screen from the emulator itself and drops the env's own observation, so
        # that one is fetched as grayscale too (a third of RGB's bytes): the same observations and rewards,
        # 5-9% more steps a second for the raw env and the actor alike (docs/algorithms.md, Atari).
        kwargs.setdefault("obs_type", "grayscale")
        env = gym.make(registered, frameskip=1, repeat_action_probability=0.0, **kwargs)
        env = gym.wrappers.AtariPreprocessing(
            env, noop_max=opts.noop_max, frame_skip=opts.frame_skip, screen_size=opts.screen_size,
            terminal_on_life_loss=opts.terminal_on_life_loss, grayscale_obs=True, scale_obs=False)
        # Zeros before an episode's first frame (not copies of it): what ALE's C++ vector env stacks, so both
        # backends of VecSampler and the evaluation env show a policy the same observations.
        env = gym.wrappers.FrameStackObservation(env, opts.frame_stack, padding_type="zero")
    else:
        env = gym.make(registered, **kwargs)
    if seed is not None:
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env


# Besides the AtariOptions (terminal_on_life_loss off), the gym.make arguments of an ALE id that ALE's vector
# env reproduces: the frame limits (gym.make's max_episode_steps caps the raw ALE env's frames, make_env's frame
# skipping sitting above it, as the vector env's max_num_frames_per_episode does), the action set, and the type
# of the observation the preprocessing discards. Anything else (mode, difficulty, ...) keeps the Python envs.
_FRAME_LIMITS = ("max_num_frames_per_episode", "max_episode_steps")
_ALE_VECTOR_GYM_KWARGS = frozenset({*_FRAME_LIMITS, "full_action_space", "obs_type"})


def _positive_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


# What a registered ALE id's own kwargs may hold for the vector env to reproduce it (make_env overrides frameskip
# and repeat_action_probability; a registration with mode or difficulty, say, keeps the Python envs).
_ALE_VECTOR_SPEC_KWARGS = frozenset({"game", "frameskip", "repeat_action_probability", "full_action_space",
                                     "max_num_frames_per_episode", "obs_type"})


def ale_vector_kwargs(env_id: str, env_kwargs: dict | None = None) -> dict | None:
    """Keyword arguments of `ale_py.vector_env.AtariVectorEnv` whose sub-environments each behave as
    `make_env(env_id, **env_kwargs)` does, or None where the vector env cannot reproduce it.

    With no-op starts off (noop_max=0) the same frames, rewards and episode ends for the same actions
    (tests/test_ale_vector.py), but for one thing: the vector env counts an episode's frames from the end of
    its reset, where the ALE env under make_env counts max_num_frames_per_episode (108,000 by default) from
    the reset itself, which on some ROMs includes start-up frames, so an episode truncated by that limit can
    run a few steps longer (Berzerk: 5, in 27,000). gym.make's max_episode_steps counts as the vector env does.
    With no-op starts on, more: the vector env draws 0 to noop_max - 1 no-ops from its own generator where
    make_env draws 1 to noop_max (noop_max=1, a fixed single no-op for make_env, therefore keeps the Python
    envs), and neither limit counts the no-op frames there while both do under make_env, so a truncated
    episode can run up to noop_max / frame_skip steps longer (7 at the defaults).
    None for: non-ALE ids, ids registered with a step limit or settings of their own, terminal_on_life_loss
    (the vector env's episodic life continues the game where make_env resets it), and any gym.make argument
    not in _ALE_VECTOR_GYM_KWARGS.
    """
    registered = resolve_env_id(env_id)
    if not is_atari(registered):
        return None
    spec = gym.spec(registered)
    if spec.entry_point != "ale_py.env:AtariEnv" or spec.max_episode_steps is not None \
            or not set(spec.kwargs) <= _ALE_VECTOR_SPEC_KWARGS or "game" not in spec.kwargs:
        return None
    kwargs = dict(env_kwargs or {})
    opts = pop_atari_options(kwargs)
    limits = [n for n in (kwargs.get(k, spec.kwargs.get(k)) for k in _FRAME_LIMITS) if n is not None]
    full_action_space = kwargs.get("full_action_space", spec.kwargs.get("full_action_space", False))
    if opts.terminal_on_life_loss or not set(kwargs) <= _ALE_VECTOR_GYM_KWARGS \
            or kwargs.get("obs_type", "grayscale") not in ("grayscale", "rgb") \
            or not all(map(_positive_int, (opts.frame_skip, opts.frame_stack, opts.screen_size, *limits))) \
            or not limits or not (isinstance(opts.noop_max, int) and opts.noop_max >= 0 and opts.noop_max != 1) \
            or not isinstance(full_action_space, bool):
        return None
    return {"game": spec.kwargs["game"], "frameskip": opts.frame_skip, "stack_num": opts.frame_stack,
            "img_height": opts.screen_size, "img_width": opts.screen_size, "noop_max": opts.noop_max,
            "grayscale": True, "maxpool": True, "repeat_action_probability": 0.0, "episodic_life": False,
            "reward_clipping": False, "use_fire_reset": False, "full_action_space": full_action_space,
            "max_num_frames_per_episode": min(limits)}


def episode_step_limit(env_id: str, **kwargs) -> int:
    """The step limit of an id's episodes as make_env builds it (its TimeLimit, `max_episode_steps` among kwargs
    included); 0 where it has none (ALE ids cap frames inside the emulator instead)."""
    env = make_env(env_id, **kwargs)
    try:
        limit = env.spec.max_episode_steps if env.spec is not None else None
    finally:
        env.close()
    return int(limit) if limit else 0


def env_spaces(env_id: str, **kwargs) -> tuple[gym.Space, gym.Space]:
    """Observation and action spaces of an id (builds and closes one instance); kwargs as for make_env."""
    env = make_env(env_id, **kwargs)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()
