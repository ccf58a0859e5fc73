"""A real Prometheus scrapes the real services with deploy/monitoring's scrape config and alert rules.

Checks what only a real scrape shows: the training job's label arrives as `job_id` beside Prometheus'
own `job` (no honor_labels, no exported_job), the alert rules load, and a finished job's series go
stale. Needs the `prometheus` binary (Debian's package; .ci/run installs it).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.system import module_system

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(shutil.which("prometheus") is None,
                                 reason="no prometheus binary (apt-get install prometheus; .ci/run does)")]

MONITORING = Path(__file__).resolve().parents[1] / "deploy" / "monitoring"
COMPONENTS = {"nitro-learner": "learner", "nitro-detector": "detector", "nitro-scaler": "scaler"}

system = module_system("nitro-prometheus", concurrency=4)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def prometheus(system, tmp_path_factory):
    """deploy/monitoring/prometheus.yml with its targets pointed at this system's metrics ports."""
    work = tmp_path_factory.mktemp("prometheus")
    cfg = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    cfg["global"]["scrape_interval"] = cfg["global"]["evaluation_interval"] = "1s"
    cfg["rule_files"] = [str(MONITORING / "alerts.yml")]
    for job in cfg["scrape_configs"]:
        port = system.components[COMPONENTS[job["job_name"]]].metrics_port
        job["static_configs"][0]["targets"] = [f"127.0.0.1:{port}"]
    (work / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    proc = subprocess.Popen(["prometheus", f"--config.file={work / 'prometheus.yml'}",
                             f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=open(work / "prometheus.log", "wb"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/-/ready", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"prometheus did not start: {(work / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.3)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def api(url: str, path: str, **params) -> dict:
    q = urllib.parse.urlencode(params)
    body = json.loads(urllib.request.urlopen(f"{url}/api/v1/{path}?{q}", timeout=5).read())
    assert body["status"] == "success", body
    return body["data"]


def wait_for(fn, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.5)
    return fn()


def test_a_real_prometheus_sees_job_id_loads_the_rules_and_drops_finished_jobs(client, prometheus):
    # A job far longer than the test: it runs until the test stops it, so it is scraped while it runs.
    job = client.start_training({"env_id": "CartPole-v1", "preset": "fast", "rounds": 5000, "steps_per_actor": 64,
                                 "eval_episodes": 1, "budget_usd": 1.0, "seed": 2,
                                 "scaler": {"policy": "fixed", "fixed_actors": 2, "i_min": 1, "i_max": 2}})
    query = f'nitro_current_round{{job_id="{job.job_id}"}}'
    series = wait_for(lambda: api(prometheus, "query", query=query)["result"])
    assert series, f"no {query} scraped while the job ran"
    labels = series[0]["metric"]
    assert labels["job"] == "nitro-learner" and labels["component"] == "learner"  # Prometheus' own labels
    assert "exported_job" not in labels
    def up() -> set:
        return {t["labels"]["job"] for t in api(prometheus, "targets")["activeTargets"] if t["health"] == "up"}

    assert wait_for(lambda: up() == set(COMPONENTS)), f"targets up: {up()}"
    def rules() -> dict[str, str]:  # alert -> health ("unknown" until its first evaluation)
        return {r["name"]: r["health"] for g in api(prometheus, "rules")["groups"] for r in g["rules"]}

    alerts_file = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    assert set(rules()) == {r["alert"] for g in alerts_file["groups"] for r in g["rules"]}
    assert wait_for(lambda: set(rules().values()) == {"ok"}), rules()
    client.stop(job.job_id)
    list(client.watch(job.job_id))  # to its end: the learner removes the job's series
    gone = wait_for(lambda: not api(prometheus, "query", query=query)["result"])
    assert gone, "a finished job's series stays in Prometheus"
