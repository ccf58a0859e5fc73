"""Nitro: cheaper and faster distributed deep RL with serverless actors and boosting.

    import nitro

    run = nitro.train(env_id="CartPole-v1", rounds=5)   # the local system, reused or started for the job
    policy = run.best_policy()                          # a TrainedPolicy: predict(), save(), spaces

The names below are imported on first use: actors import this package on every cold start, so importing
it loads nothing else.
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


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nitro' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    """The public names (loaded or not) and what the module already holds (dunders, loaded subpackages)."""
    return sorted(set(__all__) | {n for n in globals() if not n.startswith("_") or n.startswith("__")})
