"""Measuring for the cloud clock (docs/cost.md; the model itself is in nitro.cost).

On one shared machine wall time says more about the neighbours than about the
work, so the cloud clock is built from CPU time: an invocation's process CPU
time with its Redis calls counted at their wall time (InvocationClock), and
the learner's critical path in the CPU time of the thread that runs it
(critical_path_cpu_seconds).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from nitro.cost import modelled_invocation_ms


class InvocationClock:
    """One invocation's CPU time, and the wall and CPU time of its Redis calls (`with clock.io():`)."""

    def __init__(self) -> None:
        self.cpu0 = time.process_time()
        self.io_wall = self.io_cpu = 0.0

    @contextmanager
    def io(self):
        w, c = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.io_wall += time.perf_counter() - w
            self.io_cpu += time.process_time() - c

    def report(self, cold: bool) -> dict:
        """What the function returns under "clock": its modelled duration, and its init CPU when cold
        (the process's CPU time before this invocation began: interpreter start and imports)."""
        cpu = time.process_time() - self.cpu0
        return {"cpu_ms": round(cpu * 1e3, 3), "io_wall_ms": round(self.io_wall * 1e3, 3),
                "io_cpu_ms": round(self.io_cpu * 1e3, 3),
                "modelled_ms": round(modelled_invocation_ms(cpu * 1e3, self.io_cpu * 1e3, self.io_wall * 1e3), 3),
                "init_ms": round(self.cpu0 * 1e3, 3) if cold else 0.0}


_helper_excess = threading.local()


def add_helper_excess(seconds: float) -> None:
    """Count, on the calling thread's critical path, CPU time a helper thread spent on work this thread
    waited for beyond its own share of it (PPO's critic half when it outlasts the actor half: both start
    together, so the wait is the difference)."""
    if seconds > 0:
        _helper_excess.seconds = getattr(_helper_excess, "seconds", 0.0) + seconds


def critical_path_cpu_seconds() -> float:
    """CPU time of the calling thread plus, when torch runs intra-op worker threads, the process's CPU
    time shared out among them: the learner's critical path, whatever the other processes do. Helper
    threads' excess (`add_helper_excess`) counts too."""
    import torch

    excess = getattr(_helper_excess, "seconds", 0.0)
    threads = torch.get_num_threads()
    if threads <= 1:  # intra-op work runs in the calling thread
        return time.thread_time() + excess
    return time.process_time() / threads + excess
