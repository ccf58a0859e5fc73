"""When the supervisor restarts a component that exited on its own: the policy, its delays and its flags.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    """When the supervisor restarts a component that exited on its own (like Kubernetes' crash-loop
    backoff or compose's `restart: on-failure`): after first_delay_s, doubling with every restart in
    the last window_s seconds up to max_delay_s; the (max_restarts + 1)-th exit within window_s stops
    everything. The first delays stay well inside the learner's Redis patience (learner_svc.constants.REDIS_PATIENCE_S)."""

    max_restarts: int = 5
    window_s: float = 600.0
    first_delay_s: float = 0.5
    max_delay_s: float = 30.0


def restart_delay(policy: RestartPolicy, restarts: Sequence[float], now: float) -> float | None:
    """Seconds to wait before restarting a component that just exited, or None when its restart budget
    is spent. `restarts`: the times (same clock as `now`) of its earlier restarts."""
    recent = sum(1 for t in restarts if now - t < policy.window_s)
    if recent >= policy.max_restarts:
        return None
    return min(policy.max_delay_s, policy.first_delay_s * 2 ** recent)


def add_restart_args(p: argparse.ArgumentParser) -> None:
    """The restart policy's flags (`nitro up` and the supervisor share them)."""
    def bounded(kind, low: float, strict: bool):
        def parse(text: str):
            value = kind(text)
            if value < low or (strict and value == low):
                raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {low:g}, got {text}")
            return value
        return parse

    d = RestartPolicy()
    p.add_argument("--max-restarts", type=bounded(int, 0, False), default=d.max_restarts, metavar="N",
                   help="restarts of one component allowed within --restart-window before everything stops; "
                        "0: stop everything when any component exits (default: %(default)s)")
    p.add_argument("--restart-window", type=bounded(float, 0, True), default=d.window_s, metavar="SECONDS",
                   help="the window of --max-restarts (default: %(default)s)")


def restart_policy_from_args(args) -> RestartPolicy:
    return RestartPolicy(max_restarts=args.max_restarts, window_s=args.restart_window)


def restart_args(args) -> list[str]:
    """The supervisor's command-line flags for the restart policy in `args`."""
    return ["--max-restarts", str(args.max_restarts), "--restart-window", str(args.restart_window)]
