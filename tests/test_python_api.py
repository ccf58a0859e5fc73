"""The Python API a user starts from: `import nitro` (lazy public names, `__all__`, `dir`), `nitro --version`,
NitroClient finding the local system's learner and token by itself (and saying where the token lives when
the learner refuses it), `nitro.train` end to end on CartPole through a real local system, TrainedPolicy's
spaces and save(), and the type check of the public API (mypy)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import nitro
from nitro.client.sdk import UnauthenticatedError
from nitro.spec import InvalidSpec, TrainingSpec
from tests.system import shared_system

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = {"train": "nitro.api", "TrainingRun": "nitro.api", "TrainingNotFinished": "nitro.api",
          "NitroClient": "nitro.client.sdk", "TrainingSpec": "nitro.spec", "load_policy": "nitro.policy.trained",
          "export_policy": "nitro.policy.trained", "TrainedPolicy": "nitro.policy.trained"}

system = shared_system()


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the variables that name a learner, a token or a state dir."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("NITRO_TARGET", "NITRO_TOKEN", "NITRO_TOKEN_FILE", "NITRO_STATE_DIR")}
    return {**env, **extra}


def python(code: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          env=env or clean_env(), cwd=cwd or ROOT)


# --- the package ------------------------------------------------------------------------------------------


def test_public_names_load_on_first_use_only():
    """`import nitro` loads nothing else (actors import it on every cold start); each public name then
    comes from its module, and `__all__` and `dir()` list them all."""
    proc = python("""
import json, sys
import nitro
loaded = sorted(m for m in sys.modules if m.startswith("nitro.") or m in ("torch", "grpc", "gymnasium", "numpy"))
listed = dir(nitro)
from nitro import NitroClient, TrainingSpec, load_policy, train, TrainedPolicy, export_policy, __version__
print(json.dumps({"loaded": loaded, "all": nitro.__all__, "dir": listed,
                  "modules": {n: getattr(nitro, n).__module__ for n in nitro.__all__ if n != "__version__"}}))
""")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["loaded"] == [], out["loaded"]
    assert set(out["all"]) == set(PUBLIC) | {"__version__"}
    assert set(out["all"]) <= set(out["dir"]), "dir(nitro) lists every public name before any is loaded"
    assert out["modules"] == PUBLIC


def test_unknown_names_are_attribute_errors():
    with pytest.raises(AttributeError, match="module 'nitro' has no attribute 'NitroClinet'"):
        nitro.NitroClinet
    with pytest.raises(ImportError):
        from nitro import no_such_name  # noqa: F401


def test_version_has_one_source(capsys):
    """`nitro --version` prints nitro.__version__, and the package metadata reads the same attribute."""
    import tomllib

    from nitro.client import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"nitro {nitro.__version__}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "nitro.__version__"}
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["nitro"] and (ROOT / "nitro/py.typed").is_file()


@pytest.mark.slow  # ~12 s cold, a few seconds with mypy's cache (kept in pytest's cache directory)
def test_the_public_api_type_checks(pytestconfig, tmp_path):
    """mypy over nitro/client, nitro/api.py and nitro/policy/trained.py ([tool.mypy] in pyproject.toml): no
    errors, and every function of the public modules typed (disallow_untyped_defs)."""
    cache = pytestconfig.cache.mkdir("mypy") if getattr(pytestconfig, "cache", None) else tmp_path  # -p no:cacheprovider
    proc = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache)], cwd=ROOT, capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success" in proc.stdout


# --- the SDK finds the local system -------------------------------------------------------------------------


def test_client_finds_the_local_systems_learner_and_token(system, tmp_path):
    """A process of the user's, told nothing but $NITRO_STATE_DIR: NitroClient() reaches the learner with the
    token file's token. Given another state dir, the learner refuses it, and the error names the token file
    and how to pass it (the SDK's message and the CLI's one-line error alike)."""
    elsewhere = tmp_path / "no-system"
    elsewhere.mkdir()
    proc = python("""
import json, sys
from nitro import NitroClient
from nitro.client import cli
from nitro.client.sdk import UnauthenticatedError

out = {}
with NitroClient() as client:
    out.update(target=client.target, source=client.token_source, jobs=len(client.list()))
with NitroClient(out["target"], state_dir=sys.argv[1]) as client:
    try:
        client.list()
    except UnauthenticatedError as exc:
        out["error"] = str(exc)
out["cli_rc"] = cli.main(["list", "--target", out["target"], "--state-dir", sys.argv[1]])
print(json.dumps(out))
""", str(elsewhere), env=clean_env(NITRO_STATE_DIR=str(system.state_dir)), cwd=tmp_path)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    token_file = str(system.state_dir / "token")
    assert out["target"] == system.learner_address
    assert out["source"] == f"the local system's token file {token_file}"
    assert out["jobs"] >= 0
    missing = str(elsewhere.resolve() / "token")
    assert out["error"].startswith("UNAUTHENTICATED: missing credentials"), out
    assert "this client sent no access token" in out["error"]
    assert f"keeps its token in {missing}" in out["error"] and f"NitroClient(token_file={missing!r})" in out["error"]
    assert out["cli_rc"] == 1
    cli_error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(cli_error) == 1 and f"--token-file {missing}" in cli_error[0], proc.stderr


def test_a_refused_token_names_the_systems_token_file(system):
    with nitro.NitroClient(system.learner_address, token="not-the-systems-token", state_dir=system.state_dir) as c, \
            pytest.raises(UnauthenticatedError) as exc:
        c.list()
    token_file = str(system.state_dir / "token")
    assert exc.value.details == "invalid access token"
    assert exc.value.hint.startswith("this client sent the token from the token given;")
    assert f"the local system up in {system.state_dir} keeps its token in {token_file}" in exc.value.hint
    assert f"NitroClient(token_file={token_file!r})" in str(exc.value)
    assert f"NITRO_TOKEN_FILE={token_file}" in str(exc.value)


def test_the_local_token_goes_to_the_local_learner_only(system, monkeypatch):
    for var in ("NITRO_TARGET", "NITRO_TOKEN", "NITRO_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    with nitro.NitroClient(state_dir=system.state_dir) as client:
        assert client.target == system.learner_address
        assert client.token_source == f"the local system's token file {system.state_dir / 'token'}"
    with nitro.NitroClient("127.0.0.1:9", state_dir=system.state_dir) as client:
        assert client.token_source == ""


def test_the_rule_for_target_and_token(tmp_path, monkeypatch):
    """find_target and find_token, the one rule of the SDK and the CLI, against a state dir whose supervisor
    is this process: explicit wins, then a token file, then the local system's token for its own learner
    only, then the environment."""
    from nitro.client.sdk import FoundToken, find_target, find_token
    from nitro.local.processes import process_start_time

    for var in ("NITRO_TARGET", "NITRO_TOKEN", "NITRO_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "token").write_text("local-token-0123456789\n")
    (tmp_path / "state.json").write_text(json.dumps({
        "supervisor_pid": os.getpid(), "supervisor_start_time": process_start_time(os.getpid()),
        "learner": "127.0.0.1:7", "token_file": str(tmp_path / "token")}))
    given = tmp_path / "given-token"
    given.write_text("# a comment\nfile-token-0123456789\n")
    assert find_target(None, tmp_path) == "127.0.0.1:7" and find_target("h:1", tmp_path) == "h:1"
    assert find_target(None, tmp_path / "nothing") is None
    assert find_token("127.0.0.1:7", state_dir=tmp_path).token == "local-token-0123456789"
    assert find_token("127.0.0.1:8", state_dir=tmp_path) == FoundToken(None, "")
    assert find_token("127.0.0.1:7", token_file=given, state_dir=tmp_path).token == "file-token-0123456789"
    assert find_token("127.0.0.1:7", token="explicit-token-0123", token_file=given).token == "explicit-token-0123"
    monkeypatch.setenv("NITRO_TARGET", "h:2")
    monkeypatch.setenv("NITRO_TOKEN", "env-token-0123456789")
    assert find_target(None, tmp_path) == "h:2"
    assert find_token("127.0.0.1:7", state_dir=tmp_path).token == "local-token-0123456789"
    assert find_token("127.0.0.1:8", state_dir=tmp_path) == FoundToken("env-token-0123456789", "$NITRO_TOKEN")


# --- nitro.train ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(system, tmp_path_factory):
    """Two CartPole rounds through nitro.train, reusing the system up in its state dir."""
    out = tmp_path_factory.mktemp("results")
    return nitro.train({"env_id": "CartPole-v1", "preset": "fast", "budget_usd": 1.0},
                       rounds=2, steps_per_actor=128, eval_episodes=2, seed=4, scaler="fixed:2",
                       state_dir=system.state_dir, results_dir=out, progress=False)


def test_train_runs_a_job_to_its_end(run, system):
    assert run.final_state == "SUCCEEDED" and run.succeeded, run.message
    assert [r.round for r in run.reports] == [0, 1]
    assert all(r.actors_launched == 2 for r in run.reports)
    assert run.results_dir.name == run.job_id
    assert {"rounds.csv", "summary.json", "training.png", "checkpoint.pt", "best.pt"} <= \
        {p.name for p in run.results_dir.iterdir()}
    assert run.summary["rounds"] == 2 and run.summary["job_id"] == run.job_id
    assert run.status.spec.env_id == "CartPole-v1" and run.status.spec.scaler.fixed_actors == 2
    assert repr(run).startswith(f"TrainingRun(job_id={run.job_id!r}, final_state='SUCCEEDED', rounds=2")


def test_best_policy_acts_in_the_environment(run):
    policy = run.best_policy(seed=0)
    assert policy.env_id == "CartPole-v1" and policy.info["round"] == run.summary["best_round"]
    env = gym.make("CartPole-v1")
    assert policy.observation_space.shape == env.observation_space.shape
    assert policy.action_space == env.action_space == gym.spaces.Discrete(2)
    obs, _ = env.reset(seed=0)
    for _ in range(20):
        action, _ = policy.predict(obs, deterministic=True)
        assert policy.action_space.contains(int(action))
        obs, _, term, trunc, _ = env.step(int(action))
        if term or trunc:
            obs, _ = env.reset()
    assert run.final_policy().info["round"] == 1


def test_train_follows_with_the_cli_progress_output(system, tmp_path, capsys):
    """progress=True prints what `nitro train` prints: the reuse of the running system, a line per round
    (no terminal here), the summary."""
    run = nitro.train(env_id="CartPole-v1", preset="fast", rounds=1, steps_per_actor=64, eval_episodes=1,
                      scaler="fixed:1", budget_usd=1.0, state_dir=system.state_dir, results_dir=tmp_path)
    text = capsys.readouterr().out
    assert run.succeeded and len(run.reports) == 1
    assert f"using the local system already up in {system.state_dir}" in text
    assert f"job {run.job_id}: CartPole-v1 ppo, scaler fixed, 1 rounds" in text
    assert "round    0  actors   1" in text and f"job {run.job_id} SUCCEEDED" in text
    assert f"results       {tmp_path / run.job_id}/" in text


@pytest.mark.system
def test_train_starts_a_local_system_for_the_job_and_stops_it_after(tmp_path, capsys):
    """No system up in the state dir: nitro.train starts one, runs the job on it, and stops it again, saying so
    (what a user gets from `nitro.train(...)` on a machine where nothing runs)."""
    from nitro.local import system_state

    state_dir = tmp_path / "state"
    assert system_state.running_state(state_dir) is None
    run = nitro.train(env_id="CartPole-v1", preset="fast", rounds=1, steps_per_actor=64, eval_episodes=1,
                      scaler="fixed:1", budget_usd=1.0, state_dir=state_dir, results_dir=tmp_path / "results")
    text = capsys.readouterr().out
    assert run.succeeded and [r.round for r in run.reports] == [0], run.message
    assert f"starting the local system in {state_dir} ..." in text
    assert "local system up; learner at 127.0.0.1:" in text and "stopping the local system ..." in text
    assert text.index("local system up") < text.index(f"job {run.job_id} SUCCEEDED") < text.index("stopping")
    assert system_state.running_state(state_dir) is None, "the system started for the job is down again"
    assert (run.results_dir / "best.pt").is_file() and run.best_policy().env_id == "CartPole-v1"


def test_bad_input_names_the_field_before_anything_starts(tmp_path):
    nothing = tmp_path / "nothing-up"  # no system here: a bad spec must fail without starting one
    with pytest.raises(InvalidSpec) as exc:
        nitro.train(rounds=3, state_dir=nothing)
    assert exc.value.field == "env_id" and "nitro.train(env_id='CartPole-v1')" in str(exc.value)
    with pytest.raises(InvalidSpec) as exc:
        nitro.train(env_id="CartPole-v1", roundz=3, state_dir=nothing)
    assert exc.value.field == "roundz"
    with pytest.raises(InvalidSpec) as exc:
        nitro.train(env_id="CartPole-v1", scaler={"i_mn": 2}, state_dir=nothing)
    assert exc.value.field == "scaler.i_mn"
    with pytest.raises(InvalidSpec) as exc:
        nitro.train("CartPole-v1", state_dir=nothing)
    assert exc.value.field == "spec" and "env_id='CartPole-v1'" in str(exc.value)
    with pytest.raises(InvalidSpec) as exc:  # the learner's own validation, here
        nitro.train(env_id="CartPole-v1", rounds=0, state_dir=nothing)
    assert exc.value.field == "rounds"
    with pytest.raises(InvalidSpec) as exc:
        nitro.train(TrainingSpec(env_id="CartPole-v1"), scaler={"bogus": 1}, state_dir=nothing)
    assert exc.value.field == "scaler.bogus"
    with pytest.raises(TypeError, match="spec must be a dict"):
        nitro.train(42, state_dir=nothing)
    assert not nothing.exists(), "nothing was started"


def test_spec_forms_merge_as_flags_over_a_config(tmp_path):
    from nitro.api import _job_spec

    spec_file = tmp_path / "cartpole.yaml"
    spec_file.write_text("env_id: CartPole-v1\nrounds: 5\nscaler: fixed:8\nhyperparameters: {lr: 3.0e-4}\n")
    assert _job_spec(spec_file, {"rounds": 2, "scaler": {"i_max": 9}, "hyperparameters": {"gamma": 0.9}}) == {
        "env_id": "CartPole-v1", "rounds": 2, "scaler": {"policy": "fixed", "fixed_actors": 8, "i_max": 9},
        "hyperparameters": {"lr": 3e-4, "gamma": 0.9}}
    base = TrainingSpec(env_id="CartPole-v1", rounds=7)
    replaced = _job_spec(base, {"rounds": 2, "scaler": "fixed:3"})
    assert isinstance(replaced, TrainingSpec) and (replaced.rounds, replaced.scaler.policy,
                                                   replaced.scaler.fixed_actors) == (2, "fixed", 3)
    assert base.rounds == 7, "the caller's spec is not changed"
    assert _job_spec(base, {}) is base


def test_train_options_are_no_spec_fields():
    from nitro.api import _OPTIONS

    options = [p.name for p in inspect.signature(nitro.train).parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert options == list(_OPTIONS)
    assert not set(options) & {f.name for f in dataclasses.fields(TrainingSpec)}


# --- TrainedPolicy ----------------------------------------------------------------------------------------


def test_box_policy_spaces_and_save_round_trip(tmp_path):
    from nitro.policy.envs import env_spaces
    from nitro.policy.model_spec import spec_for_spaces
    from nitro.policy.models import Policy

    obs_space, act_space = env_spaces("Pendulum-v1")
    spec = spec_for_spaces(obs_space, act_space, hidden_sizes=(16,), obs_norm=True)
    policy = nitro.TrainedPolicy(spec, Policy(spec).numpy_state(), {"env_id": "Pendulum-v1", "round": 3})
    assert policy.observation_space == gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    assert policy.action_space == act_space  # Box(-2, 2, (1,), float32)
    assert policy.observation_space.contains(obs_space.sample())
    path = policy.save(tmp_path / "pendulum")
    assert path == tmp_path / "pendulum" / "policy.json"
    back = nitro.load_policy(tmp_path / "pendulum")
    assert back.spec == policy.spec and back.info == policy.info
    assert back.action_space == policy.action_space and back.observation_space == policy.observation_space
    batch = np.random.default_rng(0).uniform(-1, 1, size=(16, 3)).astype(np.float32)
    assert np.array_equal(back.predict(batch, deterministic=True)[0], policy.predict(batch, deterministic=True)[0])
    assert all(np.array_equal(back.state[k], v) for k, v in policy.state.items())


def test_cnn_policy_takes_frames():
    from nitro.policy.model_spec import ModelSpec
    from nitro.policy.models import Policy

    spec = ModelSpec((4, 84, 84), "discrete", 6, arch="cnn")
    policy = nitro.TrainedPolicy(spec, Policy(spec).numpy_state())
    assert policy.observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert policy.action_space == gym.spaces.Discrete(6)
    action, _ = policy.predict(policy.observation_space.sample(), deterministic=True)
    assert policy.action_space.contains(int(action))
