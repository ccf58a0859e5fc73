"""Specs as files (`nitro train --config`), `nitro presets`, and the model/environment spec fields, without services."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from nitro import spec_file
from nitro.client import cli, sdk
from nitro.client.commands import train
from nitro.config import ALGO_PRESETS
from nitro.policy import env_kwargs
from nitro.presets import ENV_PRESETS
from nitro.spec import InvalidSpec, TrainingSpec, algo_config, from_proto, to_proto, validate
from nitro.v1 import training_pb2

PRESET_FILES = sorted((Path(__file__).resolve().parents[1] / "deploy/k8s/base/config/presets").glob("*.yaml"))

SPEC = {"env_id": "CartPole-v1", "preset": "fast", "rounds": 3, "hidden_sizes": [16, 8], "activation": "relu",
        "env_kwargs": {"max_episode_steps": 30, "sutton_barto_reward": True},
        "hyperparameters": {"lr": 3e-4, "epochs": 4}, "scaler": "fixed:2",
        "stellaris": {"max_learners": 4}}


def spec_of(*flags: str) -> dict:
    return train.build_spec(cli.build_parser().parse_args(["train", *flags]))


def server_side(spec: dict) -> TrainingSpec:
    """What the learner makes of a dict spec: the SDK's proto, then the server's validation."""
    return validate(from_proto(sdk.spec_to_proto(spec)))


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# --- --config -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_config_file_gives_the_same_spec_as_the_sdk_dict(tmp_path, fmt):
    text = yaml.safe_dump(SPEC) if fmt == "yaml" else json.dumps(SPEC)
    spec = spec_of("--config", write(tmp_path, f"spec.{fmt}", text))
    assert spec["scaler"] == {"policy": "fixed", "fixed_actors": 2}  # the policy string, spelled out
    s = server_side(spec)
    assert s.to_dict() == server_side(SPEC).to_dict() | {"job_id": s.job_id}
    assert (s.hidden_sizes, s.activation, s.env_kwargs) == ([16, 8], "relu", SPEC["env_kwargs"])
    assert (s.rounds, s.scaler.fixed_actors, s.stellaris.max_learners, s.hyperparameters["epochs"]) == (3, 2, 4, 4)


def test_yaml_reads_exponents_without_a_dot_as_numbers(tmp_path):
    # YAML 1.1 (PyYAML) would read 3e-4 as a string; a spec file means the number.
    spec = spec_of("--config", write(tmp_path, "s.yaml", "env_id: CartPole-v1\nhyperparameters: {lr: 3e-4}\n"))
    assert spec["hyperparameters"]["lr"] == 3e-4


def test_flags_override_the_file_key_by_key(tmp_path):
    path = write(tmp_path, "spec.yaml", yaml.safe_dump(SPEC))
    spec = spec_of("--config", path, "--rounds", "7", "--i-max", "4", "--hp", "epochs=2", "--env-kwarg",
                   "max_episode_steps=40", "--hidden-sizes", "32", "--scaler", "nitro")
    assert spec["rounds"] == 7 and spec["preset"] == "fast"  # flag wins, the rest of the file stays
    assert spec["scaler"] == {"policy": "nitro", "fixed_actors": 2, "i_max": 4}
    assert spec["hyperparameters"] == {"lr": 3e-4, "epochs": 2.0}
    assert spec["env_kwargs"] == {"max_episode_steps": 40, "sutton_barto_reward": True}
    assert spec["hidden_sizes"] == [32]  # lists are replaced, not merged
    assert spec_of("--config", path, "--env", "Acrobot-v1")["env_id"] == "Acrobot-v1"


@pytest.mark.parametrize("doc,field", [
    ({"env_id": "CartPole-v1", "roundz": 3}, "roundz"),
    ({"env_id": "CartPole-v1", "scaler": {"policy": "nitro", "imin": 2}}, "scaler.imin"),
    ({"env_id": "CartPole-v1", "stellaris": {"bound": 3}}, "stellaris.bound"),
    ({"env_id": "CartPole-v1", "hyperparameters": {"learning_rate": 0.1}}, "hyperparameters.learning_rate"),
    ({"env_id": "CartPole-v1", "algo": "ppo", "hyperparameters": {"replay_capacity": 4}},
     "hyperparameters.replay_capacity"),  # an IMPACT field, not PPO's
    ({"env_id": "CartPole-v1", "hyperparameters": {"hidden_sizes": [64]}}, "hyperparameters.hidden_sizes"),
    ({"env_id": "CartPole-v1", "scaler": ["nitro"]}, "scaler"),
    ({"env_id": "CartPole-v1", "env_kwargs": "max_episode_steps=5"}, "env_kwargs"),
])
def test_unknown_or_misplaced_keys_are_named_with_the_allowed_ones(tmp_path, capsys, doc, field):
    path = write(tmp_path, "bad.yaml", yaml.safe_dump(doc))
    with pytest.raises(InvalidSpec) as exc:
        spec_file.load(path)
    assert exc.value.field == field
    assert cli.main(["train", "--config", path, "--target", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: INVALID_ARGUMENT: {field}: ") and path in err
    if "unknown key" in err:
        assert "did you mean '" in err or "allowed: [" in err


@pytest.mark.parametrize("key,suggested", [
    ("budget", "did you mean 'budget_usd' or 'budget_clock'?"),  # the flag's name, --budget
    ("roundz", "did you mean 'rounds'?"),
    ("steps-per-actor", "did you mean 'steps_per_actor'?"),  # a flag's spelling
    ("env", "did you mean 'env_id'?"),
])
def test_a_misspelt_key_gets_the_closest_valid_ones(tmp_path, capsys, key, suggested):
    path = write(tmp_path, "spec.yaml", f"env_id: CartPole-v1\n{key}: 2\n")
    assert cli.main(["train", "--config", path, "--target", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: INVALID_ARGUMENT: {key}: unknown key in {path}; {suggested}"


def test_nested_misspelt_keys_get_suggestions_and_a_far_one_the_allowed_list(tmp_path):
    with pytest.raises(InvalidSpec, match=r"unknown key in .*; did you mean 'i_min'\?") as exc:
        spec_file.load(write(tmp_path, "a.yaml", "env_id: CartPole-v1\nscaler: {policy: nitro, imin: 2}\n"))
    assert exc.value.field == "scaler.imin"
    with pytest.raises(InvalidSpec, match=r"did you mean 'entropy_coeff'\?"):
        spec_file.load(write(tmp_path, "b.yaml", "env_id: CartPole-v1\nhyperparameters: {entropy_coef: 0.1}\n"))
    with pytest.raises(InvalidSpec) as exc:
        spec_file.load(write(tmp_path, "c.yaml", "env_id: CartPole-v1\nzzqq: 1\n"))
    assert "did you mean" not in str(exc.value)
    assert f"allowed: {sorted(spec_file.SPEC_FIELDS)}" in str(exc.value)


def test_unknown_hyperparameter_from_a_flag_is_named_before_anything_is_sent(capsys):
    assert cli.main(["train", "--env", "CartPole-v1", "--hp", "lrr=1", "--target", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "hyperparameters.lrr: unknown key" in err and "'lr'" in err
    assert spec_of("--env", "CartPole-v1", "--algo", "impact", "--hp", "replay_capacity=4")  # IMPACT has it


@pytest.mark.parametrize("name,text,message", [
    ("missing.yaml", None, "cannot read it"),
    ("list.yaml", "- env_id: CartPole-v1\n", "must hold a mapping"),
    ("broken.yaml", "env_id: [CartPole\n", "is not valid YAML"),
    ("broken.json", "{'env_id': 1}", "is not valid JSON"),
    ("dup.yaml", "env_id: CartPole-v1\nrounds: 3\nrounds: 4\n", "duplicate key 'rounds'"),
])
def test_unreadable_files_are_one_line_errors(tmp_path, capsys, name, text, message):
    path = str(tmp_path / name) if text is None else write(tmp_path, name, text)
    assert cli.main(["train", "--config", path, "--target", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: INVALID_ARGUMENT: config: {path}: ") and message in err
    assert len(err.splitlines()) == 1


def test_file_without_env_is_refused_like_flags(tmp_path, capsys):
    path = write(tmp_path, "s.yaml", "rounds: 3\n")
    assert cli.main(["train", "--config", path, "--target", "127.0.0.1:1"]) == 2
    assert "env_id: is required" in capsys.readouterr().err
    assert spec_of("--config", path, "--env", "CartPole-v1")["rounds"] == 3
    assert spec_of("--config", write(tmp_path, "p.yaml", "preset: hopper-ppo\n"))["preset"] == "hopper-ppo"


def test_scheduler_path_is_relative_to_the_file(tmp_path):
    (tmp_path / "conf").mkdir()
    path = write(tmp_path, "conf/s.yaml", "env_id: CartPole-v1\nscaler: {policy: minions, scheduler: sched.pt}\n")
    assert spec_of("--config", path)["scaler"]["scheduler"] == str(tmp_path / "conf" / "sched.pt")


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: p.name)
def test_each_deploy_preset_loads_with_config(path):
    spec = spec_of("--config", str(path))
    assert spec == yaml.safe_load(path.read_text()) | {"scaler": spec["scaler"]}
    s = server_side(spec)
    assert s.env_id == spec["env_id"] and s.rounds == spec["rounds"] and s.scaler.policy == spec["scaler"]["policy"]


def test_deploy_presets_exist():
    assert [p.name for p in PRESET_FILES] == ["cartpole-smoke.yaml", "hopper-fixed16.yaml", "hopper-nitro.yaml"]


# --- nitro presets ------------------------------------------------------------------------------------


def test_presets_lists_every_preset_on_one_line_with_what_it_sets(capsys):
    assert cli.main(["presets"]) == 0
    out = capsys.readouterr().out.splitlines()
    for algo, presets in ALGO_PRESETS.items():
        for name in presets:
            [line] = [ln for ln in out if ln.split()[:2] == [algo, name]]
            assert "=" in line or "defaults" in line
    fast = next(ln for ln in out if ln.split()[:2] == ["ppo", "fast"])
    assert "lr=0.001" in fast and "batch_size=2048" in fast
    for name, preset in ENV_PRESETS.items():
        [line] = [ln for ln in out if ln.split()[:1] == [name]]
        assert f"env_id={preset.env_id}" in line and f"preset={preset.algo_preset}" in line
        assert f"steps_per_actor={preset.steps_per_actor}" in line


def test_presets_help_renders(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["presets", "--help"])
    assert exit_info.value.code == 0 and "presets" in capsys.readouterr().out


# --- hidden_sizes, activation, env_kwargs ------------------------------------------------------------------


def test_model_fields_reach_the_algorithm_config():
    s = server_side({"env_id": "CartPole-v1", "hidden_sizes": [16], "activation": "relu"})
    cfg = algo_config(s)
    assert (cfg.hidden_sizes, cfg.activation) == ((16,), "relu")
    default = algo_config(server_side({"env_id": "CartPole-v1"}))
    assert (default.hidden_sizes, default.activation) == ((256, 256), "tanh")  # empty: the preset's
    assert from_proto(to_proto(s)).hidden_sizes == [16]  # TrainingStatus.spec carries them back


def test_flags_for_the_model_and_env_fields():
    spec = spec_of("--env", "CartPole-v1", "--hidden-sizes", "64,32", "--activation", "relu", "--env-kwarg",
                   "max_episode_steps=50", "--env-kwarg", "sutton_barto_reward=true", "--env-kwarg", "mode=hard")
    assert spec["hidden_sizes"] == [64, 32] and spec["activation"] == "relu"
    assert spec["env_kwargs"] == {"max_episode_steps": 50, "sutton_barto_reward": True, "mode": "hard"}


@pytest.mark.parametrize("flags", [("--hidden-sizes", "64,x"), ("--env-kwarg", "novalue")])
def test_bad_model_flags_are_usage_errors(flags, capsys):
    with pytest.raises(SystemExit) as exc:
        spec_of("--env", "CartPole-v1", *flags)
    assert exc.value.code == 2 and flags[0] in capsys.readouterr().err


@pytest.mark.parametrize("fields,field,says", [
    ({"hyperparameters": {"hidden_sizes": 64}}, "hyperparameters.hidden_sizes", "hidden_sizes field"),
    ({"hyperparameters": {"activation": 1}}, "hyperparameters.activation", "activation field"),
    ({"hyperparameters": {"value_clip_mode": 1}}, "hyperparameters.value_clip_mode", "by preset"),
    ({"hyperparameters": {"epochs": 1.5}}, "hyperparameters.epochs", "integer"),
    ({"hyperparameters": 5}, "hyperparameters", "dict"),
    ({"hidden_sizes": 64}, "hidden_sizes", "list of layer widths"),
    ({"hidden_sizes": [0]}, "hidden_sizes", "[1, 1024]"),
    ({"hidden_sizes": [1025]}, "hidden_sizes", "[1, 1024]"),
    ({"hidden_sizes": [8] * 9}, "hidden_sizes", "1 to 8 widths"),
    ({"hidden_sizes": [True]}, "hidden_sizes", "list of layer widths"),
    ({"hidden_sizes": [2**40]}, "hidden_sizes", "out of range"),
    ({"activation": "gelu"}, "activation", "['relu', 'tanh']"),
    ({"env_id": "ALE/Pong-v5", "hidden_sizes": [64]}, "hidden_sizes", "Atari CNN"),
    ({"env_kwargs": {"nope": 1}}, "env_kwargs", "does not accept"),
    ({"env_id": "ALE/Pong-v5", "env_kwargs": {"obs_type": "ram"}}, "env_kwargs", "does not accept"),  # at reset
    ({"env_kwargs": {"render_mode": "human"}}, "env_kwargs", "reserved"),
    ({"env_kwargs": {"not a name": 1}}, "env_kwargs", "identifier"),
    ({"env_kwargs": {"x": float("inf")}}, "env_kwargs", "finite"),
    ({"env_kwargs": {"x": {1, 2}}}, "env_kwargs", "JSON"),
    ({"env_kwargs": {"x": [[[[[1]]]]]}}, "env_kwargs", "nested deeper"),
    ({"env_kwargs": {"x": "y" * 5000}}, "env_kwargs", "bytes as JSON"),
    ({"env_kwargs": [("x", 1)]}, "env_kwargs", "mapping"),
])
def test_invalid_model_and_env_fields_name_the_field(fields, field, says):
    with pytest.raises(InvalidSpec) as exc:
        server_side({"env_id": "CartPole-v1", **fields})
    assert exc.value.field == field and says in str(exc.value), str(exc.value)


@pytest.mark.parametrize("text,says", [("[1]", "JSON object"), ("{", "not valid JSON"), ('{"x": NaN}', "NaN"),
                                       ('{"render_mode": "human"}', "reserved"), ("[" * 3000 + "]" * 3000, "bytes")])
def test_env_kwargs_wire_form_is_checked(text, says):
    with pytest.raises(InvalidSpec) as exc:
        from_proto(training_pb2.TrainingSpec(env_id="CartPole-v1", env_kwargs_json=text))
    assert exc.value.field == "env_kwargs" and says in str(exc.value)


def test_env_kwargs_round_trip_keeps_json_types():
    kwargs = {"max_episode_steps": 30, "sutton_barto_reward": True, "ratio": 0.5, "name": "x", "sizes": [1, 2],
              "opts": {"a": None}}
    text = env_kwargs.to_json(kwargs)
    assert env_kwargs.from_json(text) == kwargs and env_kwargs.to_json({}) == "" and env_kwargs.from_json("") == {}
    assert isinstance(env_kwargs.from_json(text)["max_episode_steps"], int)
