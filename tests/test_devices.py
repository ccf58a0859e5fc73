"""The learner's device choice: explicit, validated, and never a silent fall-back from a GPU; and the
threads of an on-policy update."""

import subprocess
import sys
import threading

import pytest
import torch

from nitro import devices
from nitro.devices import resolve_device, resolve_update_threads, update_threads
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_learner_service_refuses_cuda_without_a_gpu_at_startup():
    out = subprocess.run([sys.executable, "-m", "learner_svc", "--device", "cuda", "--port", "0",
                          "--redis-url", "redis://127.0.0.1:1/0"],
                         capture_output=True, text=True, timeout=120,
                         env={"NITRO_HMAC_KEY": "k" * 64, "NITRO_TOKEN": "t" * 32, "PATH": "/usr/bin:/bin"})
    assert out.returncode != 0
    assert "device" in out.stderr and "no CUDA device is usable" in out.stderr, out.stderr[-2000:]


# -- threads of an on-policy update ----------------------------------------------------------------

def test_update_threads_auto_is_the_usable_cores_capped(monkeypatch):
    monkeypatch.setattr(devices, "usable_cores", lambda: 2)
    assert resolve_update_threads("auto") == 2
    assert resolve_update_threads(" AUTO ") == 2
    monkeypatch.setattr(devices, "usable_cores", lambda: 64)
    assert resolve_update_threads("auto") == devices.UPDATE_THREADS_CAP
    assert resolve_update_threads("8") == 8  # an explicit number is taken as given
    assert resolve_update_threads(3) == 3


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5", ""])
def test_update_threads_refuses_what_is_not_allowed(bad):
    with pytest.raises(ConfigError, match="update_threads: must be auto or a whole number >= 1"):
        resolve_update_threads(bad)


def _in_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.update(fn()))
    t.start()
    t.join()
    return out


def test_update_threads_switches_the_calling_thread_only_and_restores_it():
    def work():
        torch.set_num_threads(1)
        with update_threads(2):
            inside = torch.get_num_threads()
        return {"inside": inside, "after": torch.get_num_threads()}

    before = torch.get_num_threads()
    got = _in_thread(work)
    assert got == {"inside": 2, "after": 1}
    assert torch.get_num_threads() == before  # another thread's count is untouched


def test_a_second_update_in_flight_keeps_its_threads_count():
    entered, release = threading.Event(), threading.Event()

    def first():
        torch.set_num_threads(1)
        with update_threads(2):
            entered.set()
            release.wait(10)
        return {}

    t = threading.Thread(target=first)
    t.start()
    assert entered.wait(10)
    try:
        def second():
            torch.set_num_threads(1)
            with update_threads(2):
                return {"inside": torch.get_num_threads()}

        assert _in_thread(second) == {"inside": 1}  # two teams of 2 would oversubscribe the cores
    finally:
        release.set()
        t.join()
    assert _in_thread(second) == {"inside": 2}  # free again once the first ended


def test_learner_service_refuses_a_bad_update_threads_at_startup():
    out = subprocess.run([sys.executable, "-m", "learner_svc", "--update-threads", "many", "--port", "0",
                          "--redis-url", "redis://127.0.0.1:1/0"],
                         capture_output=True, text=True, timeout=120,
                         env={"NITRO_HMAC_KEY": "k" * 64, "NITRO_TOKEN": "t" * 32, "PATH": "/usr/bin:/bin"})
    assert out.returncode != 0
    assert "update_threads: must be auto or a whole number >= 1; got 'many'" in out.stderr, out.stderr[-2000:]
