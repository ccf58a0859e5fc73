"""Prometheus for the local system: the scrape-target file `nitro up` keeps, and the config of the Prometheus
that `nitro up --monitoring` starts (docs/operations.md "Local monitoring").

The services' metrics ports are picked free at each start, so no static config can name them: LocalSystem
writes <state_dir>/prometheus/targets.json (Prometheus' file_sd format) whenever a component starts, and an
empty list when the system stops. Each group carries the `job` and `component` labels that
deploy/monitoring/prometheus.yml gives the same services, so the dashboard and alerts.yml work unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

MONITORING_DIR = "prometheus"  # under the state dir
TARGETS_FILE = f"{MONITORING_DIR}/targets.json"
CONFIG_FILE = f"{MONITORING_DIR}/prometheus.yml"
DATA_DIR = f"{MONITORING_DIR}/data"
SCRAPE_INTERVAL = "15s"  # as deploy/monitoring/prometheus.yml
RETENTION = "7d"
# The alert rules' one home; found beside the package in a source checkout.
ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "monitoring" / "alerts.yml"
NO_BINARY = ("nitro up --monitoring needs the `prometheus` binary on PATH (Debian/Ubuntu: apt-get install "
             "prometheus; else https://prometheus.io/download/). Without --monitoring, `nitro up` still writes "
             "{targets} for a Prometheus of your own (file_sd_configs, docs/operations.md).")


def job_name(component: str) -> str:
    """The `job` label of a service's target: the job names of deploy/monitoring/prometheus.yml."""
    return f"nitro-{component}"


def file_sd_groups(components: Mapping[str, Mapping]) -> list[dict]:
    """One file_sd target group per component that serves metrics ({name: {"metrics_port": p, ...}})."""
    groups = []
    for name, comp in components.items():
        port = comp.get("metrics_port")
        if port:
            groups.append({"targets": [f"127.0.0.1:{int(port)}"],
                           "labels": {"job": job_name(name), "component": name}})
    return groups


def write_targets(state_dir: str | os.PathLike, groups: list[dict]) -> Path:
    """Replace the target file atomically: Prometheus never reads half a file."""
    path = Path(state_dir) / TARGETS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups, indent=2) + "\n")
    tmp.replace(path)
    return path


def prometheus_config(targets_file: str | os.PathLike, rules_file: str | os.PathLike | None,
                      scrape_interval: str = SCRAPE_INTERVAL) -> dict:
    """A Prometheus config that scrapes the target file's services (labels from the file) with nitro's rules."""
    cfg = {"global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
           "scrape_configs": [{"job_name": "nitro", "file_sd_configs": [{"files": [str(targets_file)]}]}]}
    if rules_file is not None:
        cfg["rule_files"] = [str(rules_file)]
    return cfg


def find_prometheus() -> str | None:
    return shutil.which("prometheus")


def no_binary_message(state_dir: str | os.PathLike) -> str:
    return NO_BINARY.format(targets=Path(state_dir) / TARGETS_FILE)


def prometheus_args(state_dir: str | os.PathLike, port: int) -> list[str]:
    """The command line of the local Prometheus (its config written by write_config)."""
    state_dir = Path(state_dir)
    return [f"--config.file={state_dir / CONFIG_FILE}", f"--storage.tsdb.path={state_dir / DATA_DIR}",
            f"--storage.tsdb.retention.time={RETENTION}", f"--web.listen-address=127.0.0.1:{port}"]


def write_config(state_dir: str | os.PathLike) -> tuple[Path, Path | None]:
    """Write the local Prometheus' config; returns it and the rules it loads (None outside a source checkout)."""
    import yaml

    state_dir = Path(state_dir)
    rules = ALERTS if ALERTS.is_file() else None
    path = state_dir / CONFIG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(prometheus_config(state_dir / TARGETS_FILE, rules), sort_keys=False))
    return path, rules
