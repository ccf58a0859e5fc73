"""Which torch device the learner trains on: "cpu" (default), "cuda", "cuda:N" or "auto"."""

from __future__ import annotations

import re

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
