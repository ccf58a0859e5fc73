"""Nitro: cheaper and faster distributed deep RL with serverless actors and boosting.

    import nitro

    run = nitro.train(env_id="CartPole-v1", rounds=5)   # the local system, reused or started for the job
    policy = run.best_policy()                          # a TrainedPolicy: predict(), save(), spaces

The names below are imported on first use: actors import this package on every cold start, so importing
it loads nothing else. `pip install nitro-rl` alone (the core) runs exported policies (load_policy, export_policy,
TrainedPolicy); the rest needs the training system, the extra _SYSTEM_EXTRA names (docs/cli.md, "Installing").
"""

import typing as _typing

__version__ = "0.1.0"  # the one version: pyproject.toml reads it, `nitro --version` prints it

# Public name -> the module that defines it.
_LAZY = {
    "train": "nitro.api",
    "TrainingRun": "nitro.api",
    "TrainingNotFinished": "nitro.api",
    "NitroClient": "nitro.client.sdk",
    "TrainingSpec": "nitro.spec",
    "load_policy": "nitro.policy.trained",
    "export_policy": "nitro.policy.trained",
    "TrainedPolicy": "nitro.policy.trained",
}

__all__ = ["NitroClient", "TrainedPolicy", "TrainingNotFinished", "TrainingRun", "TrainingSpec", "__version__",
           "export_policy", "load_policy", "train"]  # _LAZY's names and the version

if _typing.TYPE_CHECKING:  # for type checkers and editors; nothing is imported at run time
    from nitro.api import TrainingNotFinished, TrainingRun, train
    from nitro.client.sdk import NitroClient
    from nitro.policy.trained import TrainedPolicy, export_policy, load_policy
    from nitro.spec import TrainingSpec


# The training system's dependencies (torch, gRPC, Redis...) are pyproject.toml's extra "train"; the core leaves
# them out. Each import-time guard (the lazy names here, the `nitro` command, checkpoints) names this extra.
_SYSTEM_EXTRA = "nitro-rl[train]"
_OWN_PACKAGES = ("nitro", "learner_svc", "scaler_svc", "detector_svc", "actor_fn")  # what the wheel holds
# Lazy names whose module imports without the system but whose calls need it: looking one up imports the client
# first, so that the core's error comes at once and names the extra, not from deep inside a call.
_CALLS_NEED_SYSTEM = {"train": "nitro.client.sdk"}


def _needs_system(what: str, exc: ModuleNotFoundError, note: str = "") -> ModuleNotFoundError | None:
    """The error to raise when `what` failed to import `exc.name`, a dependency of the training system that
    this installation lacks; None when the missing module is nitro's own (a broken installation, not a
    missing extra: the caller re-raises `exc`)."""
    missing = exc.name or ""
    if not missing or missing.split(".")[0] in _OWN_PACKAGES:
        return None
    return ModuleNotFoundError(f"{what} needs the training system, which this installation lacks (no module named "
                               f"{missing!r}): pip install '{_SYSTEM_EXTRA}'{note}", name=missing)


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nitro' has no attribute {name!r}")
    from importlib import import_module

    try:
        if name in _CALLS_NEED_SYSTEM:
            import_module(_CALLS_NEED_SYSTEM[name])
        loaded = import_module(module)
    except ModuleNotFoundError as exc:  # the core alone: nitro.train and NitroClient need the system
        error = _needs_system(f"nitro.{name}", exc)
        if error is None:
            raise
        raise error from None
    value = getattr(loaded, name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    """The public names (loaded or not) and what the module already holds (dunders, loaded subpackages)."""
    return sorted(set(__all__) | {n for n in globals() if not n.startswith("_") or n.startswith("__")})
