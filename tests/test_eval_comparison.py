"""`nitro eval --vs-random --reference FILE --summary PATH`: what an evaluation's numbers mean (make demo's
summary). The random policy runs the same episodes, the reference file is checked field by field, and the summary
carries the training's two costs when the policy sits in a results directory beside its summary.json."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from nitro.client import cli
from nitro.errors import ConfigError
from nitro.policy.envs import env_spaces
from nitro.policy.evaluation import (
    Evaluation,
    Reference,
    comparison_lines,
    load_reference,
    random_returns,
    write_reference,
)
from nitro.policy.models import Policy, spec_for_spaces
from nitro.policy.trained import TrainedPolicy, export_policy

pytestmark = pytest.mark.timeout(120)

TRAINING = {"total_env_steps": 409_600, "cloud_total_cost_usd": 0.0081, "cloud_seconds": 212.0,
            "total_cost_usd": 0.0093, "wall_s": 230.0}


def evaluation(returns, env_id="CartPole-v1") -> Evaluation:
    return Evaluation(env_id, 0, list(returns), float(np.mean(returns)), None, "test")


def test_random_returns_are_the_same_episodes_each_time_and_differ_by_seed():
    a = random_returns("CartPole-v1", 5, seed=3)
    assert a == random_returns("CartPole-v1", 5, seed=3)
    assert a != random_returns("CartPole-v1", 5, seed=4)
    assert len(a) == 5 and all(r >= 1 for r in a)  # every CartPole step pays 1


def test_comparison_lines_say_how_far_above_random_the_policy_is_and_name_the_reference():
    ref = Reference("SB3 PPO, defaults", "CartPole-v1", 100_000, [100.0, 200.0, 300.0, 400.0], "docs/x.md#y")
    lines = comparison_lines(evaluation([400.0] * 4), random=[20.0] * 4, reference=ref, training=TRAINING)
    assert lines[0] == "random    IQM 20.00 on the same 4 episodes (this policy 400.00, 20x)"
    # IQM of 100..400: the middle two, 250
    assert lines[1] == ("reference IQM 250.00 over 4 episodes: SB3 PPO, defaults at 100,000 env steps; this "
                        "policy's training took 409,600 (docs/x.md#y)")
    assert "$0.0081" in lines[2] and "212 s of cloud time" in lines[2] and "docs/cost.md" in lines[2]
    assert "$0.0093" in lines[3] and "230 s" in lines[3]
    other = comparison_lines(evaluation([1.0]), reference=Reference("r", "Hopper-v5", 1, [1.0]))
    assert any("measured on Hopper-v5" in line for line in other)  # a reference for another env says so


def test_a_bad_reference_file_names_the_field(tmp_path):
    path = tmp_path / "ref.json"
    for doc, field in (({"label": "x", "env_id": "E", "env_steps": "10", "returns": [1]}, "env_steps"),
                       ({"label": "x", "env_id": "E", "env_steps": 10, "returns": []}, "returns"),
                       ({"label": "x", "env_id": "E", "env_steps": 10, "returns": [1, "a"]}, "returns"),
                       ({"env_id": "E", "env_steps": 10, "returns": [1]}, "label")):
        path.write_text(json.dumps(doc))
        with pytest.raises(ConfigError, match=f"'{field}'"):
            load_reference(path)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        load_reference(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_reference(tmp_path / "missing.json")
    write_reference(path, Reference("ok", "E", 10, [1.0, 2.0]), seeds=[1])
    assert load_reference(path) == Reference("ok", "E", 10, [1.0, 2.0])


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    """An untrained CartPole policy exported into a results directory beside a job's summary.json."""
    spec = spec_for_spaces(*env_spaces("CartPole-v1"), hidden_sizes=(8,))
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("results") / "job"
    policy = TrainedPolicy(spec, Policy(spec).numpy_state(), {"env_id": "CartPole-v1"})
    export_policy(policy, out)
    (out / "summary.json").write_text(json.dumps({"job_id": "job", **TRAINING}))
    return out


def test_eval_writes_the_summary_with_random_reference_and_costs(results_dir, tmp_path, capsys):
    ref = tmp_path / "ref.json"
    write_reference(ref, Reference("SB3 PPO, defaults", "CartPole-v1", 50_000, [500.0, 480.0, 20.0]))
    summary = results_dir / "summary.md"
    assert cli.main(["eval", str(results_dir), "--episodes", "3", "--vs-random", "--reference", str(ref),
                     "--summary", str(summary), "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["random_returns"] == random_returns("CartPole-v1", 3, 0)
    text = summary.read_text()
    for needle in ("random    IQM", "reference IQM", "SB3 PPO, defaults at 50,000 env steps", "$0.0081",
                   "docs/cost.md", "IQM       "):
        assert needle in text and needle in captured.err, needle


def test_eval_refuses_a_bad_reference_or_summary_path_before_running_episodes(results_dir, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"label": "x"}))
    assert cli.main(["eval", str(results_dir), "--reference", str(bad)]) == 2
    assert "reference:" in capsys.readouterr().err
    assert cli.main(["eval", str(results_dir), "--summary", str(tmp_path / "no" / "dir" / "s.md")]) == 2
    err = capsys.readouterr().err
    assert "--summary" in err and "does not exist" in err and "episodes" not in err


def test_make_demos_reference_file_is_a_valid_reference_for_its_job():
    import re
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    name = re.search(r"^DEMO_REFERENCE := (\S+)$", (root / "Makefile").read_text(), re.M).group(1)
    ref = load_reference(root / name)
    demo = yaml.safe_load((root / "examples/demo.yaml").read_text())
    assert ref.env_id == demo["env_id"]
    assert ref.env_steps == demo["rounds"] * demo["steps_per_actor"] * 8  # the default scaler: fixed:8
    assert len(ref.returns) >= 30  # 3 training seeds x 10 evaluation episodes
