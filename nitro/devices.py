"""Where the learner's updates run: the torch device ("cpu" by default, "cuda", "cuda:N" or "auto"),
and how many intra-op threads a synchronous update uses (`update_threads`)."""

from __future__ import annotations

import contextlib
import os
import re
import threading

import torch

from nitro.errors import ConfigError

_DEVICE_RE = re.compile(r"cpu|auto|cuda(:\d{1,2})?")


def resolve_device(name: str) -> str:
    """The concrete device for `name`; ConfigError naming what is allowed or why CUDA cannot be used.

    "auto" takes the first GPU when torch sees one and the CPU otherwise. An explicit "cuda"
    without a usable GPU is an error rather than a silent fall-back: a job sized for a GPU
    should not crawl on the CPU unnoticed.
    """
    name = (name or "cpu").strip().lower()
    if not _DEVICE_RE.fullmatch(name):
        raise ConfigError(f"invalid value for device: must be one of cpu, auto, cuda, cuda:N; got {name!r}")
    if name == "cpu":
        return "cpu"
    available = torch.cuda.is_available()
    if name == "auto":
        return "cuda:0" if available else "cpu"
    if not available:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ConfigError(f"invalid value for device: {name!r} but no CUDA device is usable "
                          f"(torch {torch.__version__}, {build}); use cpu or auto")
    index = int(name.split(":")[1]) if ":" in name else 0
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"invalid value for device: {name!r} but only {count} CUDA device(s) are visible")
    return f"cuda:{index}"


# -- intra-op threads ---------------------------------------------------------------------------------

UPDATE_THREADS_CAP = 4  # "auto" never asks for more: minibatch-256 matmuls of 2x256 MLPs are small


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def resolve_update_threads(value) -> int:
    """Torch intra-op threads for a synchronous update: "auto" (usable cores, at most UPDATE_THREADS_CAP)
    or a whole number >= 1; ConfigError naming the field and what is allowed otherwise."""
    text = str(value).strip().lower()
    if text == "auto":
        return min(usable_cores(), UPDATE_THREADS_CAP)
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ConfigError(f"invalid value for update_threads: must be auto or a whole number >= 1; got {value!r}")


_in_flight = 0
_in_flight_lock = threading.Lock()


@contextlib.contextmanager
def update_threads(n: int):
    """Run the enclosed torch work with `n` intra-op threads in the calling thread, then restore its count.

    torch's thread count is per calling thread (it sets OpenMP's, which is per thread), so the
    learner's other threads keep theirs. Only the first update in flight gets `n`: a second job's
    update starting meanwhile keeps the thread's count, so two teams of `n` never share the cores.
    """
    global _in_flight
    with _in_flight_lock:
        first = _in_flight == 0
        _in_flight += 1
    before = torch.get_num_threads()
    switch = first and n != before
    if switch:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if switch:
            torch.set_num_threads(before)
        with _in_flight_lock:
            _in_flight -= 1
