"""Nitro: cheaper and faster distributed deep RL with serverless actors and boosting."""

__version__ = "0.1.0"

_POLICY_IO = ("load_policy", "export_policy", "TrainedPolicy")


def __getattr__(name: str):
    # nitro.load_policy and friends, imported on first use: actors import this package on every cold start.
    if name in _POLICY_IO:
        from nitro.policy import trained

        return getattr(trained, name)
    raise AttributeError(f"module 'nitro' has no attribute {name!r}")
