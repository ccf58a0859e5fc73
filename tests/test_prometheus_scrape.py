"""A real Prometheus scrapes the real services through the target file `nitro up` writes, with deploy/monitoring's
alert rules and dashboard.

Checks what only a real scrape shows: the training job's label arrives as `job_id` beside Prometheus' own `job`
(no honor_labels, no exported_job), the target file names every service, the alert rules load, a finished job's
series go stale, every dashboard expression returns data while jobs run, the budget and stalled-round alerts fire
in a job made to trigger them, and the system's own Prometheus (`nitro up --monitoring`) scrapes it. Needs the
`prometheus` binary (Debian's package; .ci/run installs it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml

from nitro.local import monitoring
from nitro.local.system import LocalSystem

pytestmark = [pytest.mark.timeout(600), pytest.mark.system,
              pytest.mark.skipif(shutil.which("prometheus") is None,
                                 reason="no prometheus binary (apt-get install prometheus; .ci/run does)")]

MONITORING = Path(__file__).resolve().parents[1] / "deploy" / "monitoring"
COMPONENTS = {"nitro-learner": "learner", "nitro-detector": "detector", "nitro-scaler": "scaler"}
JOB = {"env_id": "CartPole-v1", "preset": "fast", "steps_per_actor": 64, "eval_episodes": 1, "seed": 2}
FAST_SUFFIX = "Fast"  # the test copy of each alert: the shipped expression with a 1 s `for`


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    """A local system as `nitro up --monitoring` starts it: with its own Prometheus beside the services."""
    sysm = LocalSystem(state_dir=tmp_path_factory.mktemp("nitro-prometheus"), concurrency=4, actor_timeout_s=60,
                       monitoring=True).start()
    yield sysm
    sysm.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fast_rules() -> dict:
    """alerts.yml with every `for` at 1 s and the names suffixed: the shipped expressions, fired within a test."""
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    for group in rules["groups"]:
        group["name"] += "-fast"
        for rule in group["rules"]:
            rule["alert"] += FAST_SUFFIX
            rule["for"] = "1s"
    return rules


@pytest.fixture(scope="module")
def prometheus(system, tmp_path_factory):
    """Prometheus scraping every second through the system's target file, with the shipped rules and a fast copy."""
    work = tmp_path_factory.mktemp("prometheus")
    (work / "fast.yml").write_text(yaml.safe_dump(fast_rules()))
    cfg = monitoring.prometheus_config(system.state_dir / monitoring.TARGETS_FILE, MONITORING / "alerts.yml",
                                       scrape_interval="1s")
    cfg["rule_files"].append(str(work / "fast.yml"))
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


def up(url: str) -> set:
    return {t["labels"]["job"] for t in api(url, "targets")["activeTargets"] if t["health"] == "up"}


def rules(url: str, group: str = "nitro") -> dict[str, str]:  # alert -> health ("unknown" before evaluation)
    return {r["name"]: r["health"] for g in api(url, "rules")["groups"] if g["name"] == group for r in g["rules"]}


def shipped_alerts() -> set[str]:
    return {r["alert"] for g in yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"] for r in g["rules"]}


def wait_for_rounds(client, job_id: str, n: int, timeout: float = 120.0) -> None:
    assert wait_for(lambda: client.get(job_id).rounds_done >= n, timeout), (
        f"{job_id}: {client.get(job_id).rounds_done} rounds; {client.get(job_id).message}")


def end(client, job_id: str) -> None:
    if client.get(job_id).state_name in ("PENDING", "RUNNING"):
        client.stop(job_id)
    list(client.watch(job_id))


def test_the_target_file_names_every_services_metrics_port(system):
    groups = json.loads((system.state_dir / monitoring.TARGETS_FILE).read_text())
    by_job = {g["labels"]["job"]: g for g in groups}
    assert set(by_job) == set(COMPONENTS)
    for job, comp in COMPONENTS.items():
        assert by_job[job]["targets"] == [f"127.0.0.1:{system.components[comp].metrics_port}"]
        assert by_job[job]["labels"]["component"] == comp


def test_a_real_prometheus_sees_job_id_loads_the_rules_and_drops_finished_jobs(client, prometheus):
    # A job far longer than the test: it runs until the test stops it, so it is scraped while it runs.
    job = client.start_training({**JOB, "rounds": 5000, "budget_usd": 1.0,
                                 "scaler": {"policy": "fixed", "fixed_actors": 2, "i_min": 1, "i_max": 2}})
    query = f'nitro_current_round{{job_id="{job.job_id}"}}'
    series = wait_for(lambda: api(prometheus, "query", query=query)["result"])
    assert series, f"no {query} scraped while the job ran"
    labels = series[0]["metric"]
    assert labels["job"] == "nitro-learner" and labels["component"] == "learner"  # from the target file
    assert "exported_job" not in labels
    assert wait_for(lambda: up(prometheus) == set(COMPONENTS)), f"targets up: {up(prometheus)}"
    assert set(rules(prometheus)) == shipped_alerts()
    assert wait_for(lambda: set(rules(prometheus).values()) == {"ok"}), rules(prometheus)
    client.stop(job.job_id)
    list(client.watch(job.job_id))  # to its end: the learner removes the job's series
    gone = wait_for(lambda: not api(prometheus, "query", query=query)["result"])
    assert gone, "a finished job's series stays in Prometheus"


# Panels whose series appear only with an event a healthy job need not have (their query must still be valid).
EVENT_ONLY = ("nitro_actor_invocation_failures_total", "nitro_gradients_dropped_total")


def scheduler_checkpoint(path: Path, i_max: int) -> str:
    """An untrained MinionsRL scheduler: enough for the scheduler's metrics, with no pre-training to wait for."""
    from nitro.scaling import minions

    rng = np.random.default_rng(0)
    state = {name: rng.normal(0, 0.1, shape) for name, shape in minions.weight_shapes(i_max).items()}
    state["obs_mean"], state["obs_var"] = np.zeros(minions.OBS_DIM), np.ones(minions.OBS_DIM)
    return minions.save_checkpoint(path, state, i_max)


def dashboard_queries() -> list[tuple[str, str]]:
    d = json.loads((MONITORING / "grafana/dashboards/nitro.json").read_text())
    return [(p["title"], t["expr"].replace("$__rate_interval", "30s").replace("$job_id", ".*"))
            for p in d["panels"] for t in p.get("targets", [])]


def test_every_dashboard_expression_returns_data_while_jobs_run(system, client, prometheus, tmp_path):
    from nitro.client.sdk import NitroClient, NitroRpcError
    from nitro.contracts import stream_key
    from nitro.data.redis_client import connect

    # A job that ends (the ended-jobs panel), then three at once: PPO scored by the detector, Stellaris (learner
    # functions, staleness, policy lag), and the MinionsRL scheduler.
    short = client.start_training({**JOB, "rounds": 2, "budget_usd": 1.0,
                                   "scaler": {"policy": "fixed", "fixed_actors": 1, "i_min": 1, "i_max": 1}})
    list(client.watch(short.job_id))
    long = {**JOB, "rounds": 5000, "budget_usd": 1.0}
    jobs = [client.start_training({**long, "scaler": {"policy": "nitro", "i_min": 1, "i_max": 2}}),
            client.start_training({**long, "learner_mode": "stellaris", "scaler": {"policy": "nitro", "i_min": 1,
                                                                                    "i_max": 2},
                                   "stellaris": {"max_learners": 2, "bound_start": 2, "bound_end": 0,
                                                 "learner_memory_mb": 1024}}),
            client.start_training({**long, "scaler": {"policy": "minions", "i_min": 1, "i_max": 2,
                                                      "scheduler": scheduler_checkpoint(tmp_path / "s.npz", 2)}})]
    try:
        for job in jobs:
            wait_for_rounds(client, job.job_id, 2, timeout=240)
        # Two events a healthy job has not: a batch nobody signed, and a call with a wrong token.
        r = connect(system.redis_url)
        r.xadd(stream_key(jobs[0].job_id), {"inv": "forged", "round": 0, "version": 0, "steps": 1, "payload": b"x"})
        r.close()
        with NitroClient(system.learner_address, token="not-the-token") as intruder:
            with pytest.raises(NitroRpcError):
                intruder.list()
        # Every expression in each pass (each must be a valid query), until all but the event-only ones have data:
        # waiting on each query in turn spent 30 s on every event-only panel, empty in a healthy run.
        def without_data() -> list[str]:
            return [f"{title}: {expr}" for title, expr in dashboard_queries()
                    if not api(prometheus, "query", query=expr)["result"] and not any(m in expr for m in EVENT_ONLY)]

        empty = without_data()
        deadline = time.monotonic() + 30
        while empty and time.monotonic() < deadline:
            time.sleep(0.5)
            empty = without_data()
        assert not empty, "dashboard queries without data while jobs ran:\n" + "\n".join(empty)
    finally:
        for job in jobs:
            end(client, job.job_id)


def alerts(url: str) -> list[dict]:
    return api(url, "alerts")["alerts"]


def firing(url: str, name: str, job_id: str) -> bool:
    return any(a["labels"]["alertname"] == name and a["labels"].get("job_id") == job_id and a["state"] == "firing"
               for a in alerts(url))


def test_the_budget_and_stalled_round_alerts_fire_in_a_job_made_to_trigger_them(system, client, prometheus):
    """A job at its last tenths of budget whose learner then waits on a Redis that stopped answering."""
    scaler = {"policy": "fixed", "fixed_actors": 1, "i_min": 1, "i_max": 1}
    # What a round costs on the budget's clock, from a job like it.
    probe = client.start_training({**JOB, "rounds": 4, "budget_usd": 1.0, "scaler": scaler})
    reports = list(client.watch(probe.job_id))
    per_round = (1.0 - reports[-1].budget_left_usd) / len(reports)
    assert per_round > 0, [r.budget_left_usd for r in reports]
    budget = 30 * per_round  # the last tenths of it last two or three rounds
    job = client.start_training({**JOB, "rounds": 5000, "budget_usd": budget, "round_deadline_s": 5.0,
                                 "scaler": scaler})
    redis_pid = system.components["redis"].pid
    paused = False
    try:
        for report in client.watch(job.job_id):
            if report.budget_left_usd < 0.1 * budget:
                os.kill(redis_pid, signal.SIGSTOP)  # the learner's next Redis call waits (patience: 60 s)
                paused = True
                break
        assert paused, f"the job ended before a tenth of its budget was left: {client.get(job.job_id).message}"
        # The shipped expressions (a 1 s `for`): a stall is past 4 round deadlines (20 s) without progress.
        assert wait_for(lambda: firing(prometheus, "NitroBudgetLow" + FAST_SUFFIX, job.job_id), timeout=20), (
            alerts(prometheus))
        assert wait_for(lambda: firing(prometheus, "NitroRoundStalled" + FAST_SUFFIX, job.job_id), timeout=45), (
            alerts(prometheus))
        # The shipped rules hold them pending: their `for` has not passed.
        states = {a["labels"]["alertname"]: a["state"] for a in alerts(prometheus)
                  if a["labels"].get("job_id") == job.job_id}
        assert states.get("NitroRoundStalled") in (None, "pending") and states.get("NitroBudgetLow") == "pending", (
            states)
    finally:
        if paused:
            os.kill(redis_pid, signal.SIGCONT)
        end(client, job.job_id)
    # Progress again: the stall clears once Redis answers (the job's series are gone once it ended).
    assert wait_for(lambda: not firing(prometheus, "NitroRoundStalled" + FAST_SUFFIX, job.job_id), timeout=30)


def test_nitro_up_monitoring_runs_a_prometheus_that_scrapes_the_system_with_the_shipped_rules(system):
    comp = system.components["prometheus"]
    url = comp.url
    cfg = yaml.safe_load((system.state_dir / monitoring.CONFIG_FILE).read_text())
    assert cfg["scrape_configs"][0]["file_sd_configs"][0]["files"] == [str(system.state_dir / monitoring.TARGETS_FILE)]
    assert set(rules(url)) == shipped_alerts()
    # Its first scrape comes within one interval (15 s) of its start.
    assert wait_for(lambda: up(url) == set(COMPONENTS), timeout=40), f"targets up: {up(url)}"
    assert re.match(r"http://127\.0\.0\.1:\d+$", url)
    state = json.loads((system.state_dir / "state.json").read_text())
    assert state["components"]["prometheus"]["url"] == url  # `nitro status` lists and probes it
