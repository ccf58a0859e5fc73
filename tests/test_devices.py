"""The learner's device choice: explicit, validated, and never a silent fall-back from a GPU."""

import subprocess
import sys

import pytest
import torch

from nitro.devices import resolve_device
from nitro.errors import ConfigError


def test_cpu_and_auto_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("") == "cpu"
    assert resolve_device("auto") == "cpu"
    with pytest.raises(ConfigError, match="no CUDA device is usable"):
        resolve_device("cuda")


def test_gpu_choices_when_torch_sees_two(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == "cuda:0"
    assert resolve_device("CUDA") == "cuda:0"
    assert resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(ConfigError, match="only 2 CUDA device"):
        resolve_device("cuda:2")


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "mps", "cpu;rm"])
def test_unknown_names_list_what_is_allowed(bad):
    with pytest.raises(ConfigError, match="cpu, auto, cuda, cuda:N"):
        resolve_device(bad)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_learner_service_refuses_cuda_without_a_gpu_at_startup():
    out = subprocess.run([sys.executable, "-m", "learner_svc", "--device", "cuda", "--port", "0",
                          "--redis-url", "redis://127.0.0.1:1/0"],
                         capture_output=True, text=True, timeout=120,
                         env={"NITRO_HMAC_KEY": "k" * 64, "NITRO_TOKEN": "t" * 32, "PATH": "/usr/bin:/bin"})
    assert out.returncode != 0
    assert "device" in out.stderr and "no CUDA device is usable" in out.stderr, out.stderr[-2000:]
