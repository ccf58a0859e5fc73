"""The local system's Prometheus files (nitro.local.monitoring) and `nitro up --monitoring` without a binary.

A real Prometheus reading them runs in tests/test_prometheus_scrape.py."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from nitro.local import monitoring

SERVICES = {"learner": {"metrics_port": 9101, "address": "127.0.0.1:1"},
            "detector": {"metrics_port": 9102}, "scaler": {"metrics_port": "9103"}, "lambda": {"url": "http://x"}}


def test_file_sd_groups_name_each_service_as_the_compose_config_does():
    groups = monitoring.file_sd_groups(SERVICES)
    assert groups == [
        {"targets": ["127.0.0.1:9101"], "labels": {"job": "nitro-learner", "component": "learner"}},
        {"targets": ["127.0.0.1:9102"], "labels": {"job": "nitro-detector", "component": "detector"}},
        {"targets": ["127.0.0.1:9103"], "labels": {"job": "nitro-scaler", "component": "scaler"}}]
    compose = yaml.safe_load((monitoring.ALERTS.parent / "prometheus.yml").read_text())
    assert {g["labels"]["job"] for g in groups} == {j["job_name"] for j in compose["scrape_configs"]}
    assert monitoring.file_sd_groups({"lambda": {"url": "http://x"}}) == []


def test_the_target_file_is_replaced_whole(tmp_path):
    path = monitoring.write_targets(tmp_path, monitoring.file_sd_groups(SERVICES))
    assert path == tmp_path / monitoring.TARGETS_FILE and len(json.loads(path.read_text())) == 3
    monitoring.write_targets(tmp_path, [])
    assert json.loads(path.read_text()) == [] and not list(path.parent.glob("*.tmp"))


def test_the_config_scrapes_the_target_file_with_the_shipped_rules(tmp_path):
    path, rules = monitoring.write_config(tmp_path)
    cfg = yaml.safe_load(path.read_text())
    assert rules == monitoring.ALERTS and cfg["rule_files"] == [str(monitoring.ALERTS)]
    (job,) = cfg["scrape_configs"]
    assert job["file_sd_configs"] == [{"files": [str(tmp_path / monitoring.TARGETS_FILE)]}]
    assert "honor_labels" not in job and cfg["global"]["scrape_interval"] == monitoring.SCRAPE_INTERVAL
    if shutil.which("promtool"):
        monitoring.write_targets(tmp_path, monitoring.file_sd_groups(SERVICES))
        out = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
    args = monitoring.prometheus_args(tmp_path, 9999)
    assert f"--config.file={path}" in args and "--web.listen-address=127.0.0.1:9999" in args


def test_nitro_up_monitoring_without_a_prometheus_binary_says_so_and_starts_nothing(tmp_path, monkeypatch, capsys):
    from nitro.client.cli import main

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no prometheus on it
    state_dir = tmp_path / "state"
    code = main(["up", "--monitoring", "--state-dir", str(state_dir)])
    err = capsys.readouterr().err
    assert code != 0 and "`prometheus` binary" in err and "apt-get install prometheus" in err, err
    assert str(state_dir / monitoring.TARGETS_FILE) in err  # what to use without it
    assert not (state_dir / "state.json").exists()


@pytest.mark.system  # by the tier rule's letter (LocalSystem.start); it refuses before starting anything
def test_a_local_system_with_monitoring_refuses_to_start_without_the_binary(tmp_path, monkeypatch):
    from nitro.errors import LocalSystemError
    from nitro.local.system import LocalSystem

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(LocalSystemError, match="`prometheus` binary"):
        LocalSystem(tmp_path / "state", monitoring=True).start()
    assert not (tmp_path / "state" / "state.json").exists() and not (tmp_path / "state" / "logs").exists()
