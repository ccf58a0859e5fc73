"""Per-job series: labelled job_id, and gone once their job is over."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from nitro import cost
from nitro.rpc import metrics


def series(gauge: Gauge) -> set[tuple]:
    return {tuple(s.labels.values()) for m in gauge.collect() for s in m.samples}


def test_per_job_gauges_are_labelled_job_id_not_job():
    for gauge in (metrics.CURRENT_ROUND, metrics.EVAL_RETURN, metrics.BUDGET_LEFT_USD, metrics.SCHEDULER_INPUT):
        assert gauge._labelnames[0] == "job_id"  # Prometheus gives every target a `job` label of its own


def test_forget_job_removes_exactly_that_jobs_series():
    reg = CollectorRegistry()
    g = Gauge("t_round", "test", ["job_id"], registry=reg)
    g2 = Gauge("t_input", "test", ["job_id", "input"], registry=reg)
    metrics.set_job(g, "a", 1)
    metrics.set_job(g, "b", 2)
    metrics.set_job(g2, "a", 0.5, "loss")
    metrics.set_job(g2, "a", 0.7, "kl")
    metrics.forget_job("a")
    assert series(g) == {("b",)} and series(g2) == set()
    metrics.forget_job("a")  # twice is harmless
    metrics.forget_job("b")
    assert series(g) == set()


def test_forget_idle_jobs_drops_only_the_quiet_ones(monkeypatch):
    # Jobs other tests in this process set carry real monotonic times, which on a machine up for minutes fall
    # inside the fake clock's window: the module's job tables start empty here.
    monkeypatch.setattr(metrics, "_job_series", {})
    monkeypatch.setattr(metrics, "_job_touched", {})
    reg = CollectorRegistry()
    g = Gauge("t_score", "test", ["job_id"], registry=reg)
    clock = [1000.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: clock[0])
    metrics.set_job(g, "old", 1)
    clock[0] += 600
    metrics.set_job(g, "new", 1)
    clock[0] += 400  # "old" quiet for 1000 s, "new" for 400 s
    assert metrics.forget_idle_jobs(900) == ["old"]
    assert series(g) == {("new",)}
    metrics.forget_job("new")


def test_a_round_report_counts_replaced_actors_and_resumes():
    from learner_svc.reporting import export_diagnostics
    from nitro.v1 import training_pb2

    def value(counter) -> float:
        return next(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total"))

    replaced, resumes = value(metrics.ACTORS_REPLACED), value(metrics.JOB_RESUMES)
    export_diagnostics(training_pb2.RoundReport(job_id="m", actors_replaced=3, resumed=True))
    export_diagnostics(training_pb2.RoundReport(job_id="m", actors_replaced=0, resumed=False))
    assert value(metrics.ACTORS_REPLACED) == replaced + 3 and value(metrics.JOB_RESUMES) == resumes + 1
    metrics.forget_job("m")


def count(hist: Histogram, **labels) -> float:
    """Observations in a histogram's series with these labels."""
    return sum(s.value for m in hist.collect() for s in m.samples
               if s.name.endswith("_count") and all(s.labels.get(k) == v for k, v in labels.items()))


def test_a_round_phase_is_one_of_the_learners_phases():
    before = count(metrics.ROUND_PHASE_SECONDS, phase="plan")
    sink: dict[str, float] = {}
    with metrics.timed("plan", sink):
        pass
    metrics.observe_phase("plan", 0.5, sink)
    assert count(metrics.ROUND_PHASE_SECONDS, phase="plan") == before + 2 and sink["plan"] >= 0.5
    for phase in ("launch", "Invoke", ""):
        with pytest.raises(ValueError, match="round phase"):
            metrics.observe_phase(phase, 1.0)
        with pytest.raises(ValueError, match="round phase"):
            with metrics.timed(phase):
                pass


def test_a_scaler_launch_is_timed_under_its_own_name_not_as_a_round_phase(redis_client):
    from nitro.v1 import scaler_pb2
    from scaler_svc.invoker import Invoker, lambda_client
    from scaler_svc.server import ScalerServicer

    # A real Lambda client on a port nobody listens on: both invocations fail at once, nothing is billed.
    client = lambda_client("http://127.0.0.1:1", "us-east-2", max_connections=4, read_timeout=5)
    svc = ScalerServicer(redis_client, Invoker(client, max_attempts=1), cost.Prices(), "redis://127.0.0.1:1/0",
                         hmac_key=b"k" * 32)
    launches = count(metrics.SCALER_LAUNCH_SECONDS, kind="actor")
    phases = count(metrics.ROUND_PHASE_SECONDS)

    class Context:
        def time_remaining(self):  # no deadline, as a call without one
            return None

        def abort(self, code, details):
            raise AssertionError(details)

    resp = svc.Launch(scaler_pb2.LaunchRequest(job_id="m", actors=2, steps_per_actor=8, env_id="CartPole-v1",
                                               function_name="nitro-actor", deadline_s=5.0), Context())
    assert (resp.launched, resp.failed, resp.cost_usd) == (2, 2, 0.0)
    assert count(metrics.SCALER_LAUNCH_SECONDS, kind="actor") == launches + 1
    assert count(metrics.ROUND_PHASE_SECONDS) == phases


def test_per_job_cost_counters_are_labelled_job_id_and_forgotten_with_the_job():
    for counter in (metrics.COST_USD, metrics.CLOUD_COST_USD):
        assert counter._labelnames == ("job_id", "component")
    reg = CollectorRegistry()
    c = Counter("t_cost_usd", "test", ["job_id", "component"], registry=reg)
    metrics.inc_job(c, "a", 0.25, "actors")
    metrics.inc_job(c, "a", 0.25, "actors")
    metrics.inc_job(c, "b", 1.0, "learner")
    assert {(s.labels["job_id"], s.value) for m in c.collect() for s in m.samples if s.name.endswith("_total")} == {
        ("a", 0.5), ("b", 1.0)}
    metrics.forget_job("a")
    assert series(c) == {("b", "learner")}
    metrics.forget_job("b")
    assert not [s for m in c.collect() for s in m.samples]


def test_an_ended_jobs_series_linger_until_scraped_unless_the_job_comes_back():
    reg = CollectorRegistry()
    g = Gauge("t_left", "test", ["job_id"], registry=reg)
    metrics.set_job(g, "done", 1)
    metrics.set_job(g, "resumed", 1)
    done, resumed = metrics.forget_job_after("done", 0.2), metrics.forget_job_after("resumed", 0.2)
    assert series(g) == {("done",), ("resumed",)}  # still there for a scrape
    metrics.set_job(g, "resumed", 2)  # a resume's first Plan: its series are live again
    done.join(2)
    resumed.join(2)
    assert series(g) == {("resumed",)}
    metrics.forget_job("resumed")


def state_series() -> set[tuple]:
    return {(s.labels["job_id"], s.labels["state"], s.value) for m in metrics.JOB_STATE.collect() for s in m.samples}


def ended(state: str) -> float:
    return sum(s.value for m in metrics.JOBS_ENDED.collect() for s in m.samples
               if s.name == "nitro_jobs_ended_total" and s.labels["state"] == state)


def test_job_state_is_one_series_per_live_job_and_an_end_is_counted_by_state():
    failed = ended("FAILED")
    metrics.job_state("s1", "PENDING")
    metrics.job_state("s1", "RUNNING")
    metrics.job_state("s2", "RUNNING")
    assert {x for x in state_series() if x[0] in ("s1", "s2")} == {("s1", "RUNNING", 1.0), ("s2", "RUNNING", 1.0)}
    metrics.job_state("s1", "FAILED")
    assert {x for x in state_series() if x[0] in ("s1", "s2")} == {("s2", "RUNNING", 1.0)}
    assert ended("FAILED") == failed + 1
    with pytest.raises(ValueError, match="job state"):
        metrics.job_state("s2", "DONE")
    metrics.forget_job("s2")
    assert not {x for x in state_series() if x[0] == "s2"}


def test_the_learners_job_state_changes_reach_the_metric():
    from learner_svc.jobs import Job
    from nitro.spec import TrainingSpec
    from nitro.v1 import training_pb2

    job = Job(TrainingSpec(env_id="CartPole-v1", job_id="state-metric"))
    stopped = ended("STOPPED")
    job.set_state(training_pb2.JOB_STATE_RUNNING)
    assert ("state-metric", "RUNNING", 1.0) in state_series()
    job.set_state(training_pb2.JOB_STATE_STOPPED, "stopped")
    assert not {x for x in state_series() if x[0] == "state-metric"} and ended("STOPPED") == stopped + 1


def test_round_started_sets_the_round_progress_time_and_stall_limit():
    import time

    t0 = time.time()
    metrics.round_started("rs", 7, 480.0)

    def value(gauge) -> float:
        return next(s.value for m in gauge.collect() for s in m.samples if s.labels.get("job_id") == "rs")

    assert value(metrics.CURRENT_ROUND) == 7 and value(metrics.ROUND_TIME_LIMIT) == 480.0
    assert t0 <= value(metrics.JOB_PROGRESS) <= time.time()
    metrics.forget_job("rs")
    assert not [s for m in metrics.JOB_PROGRESS.collect() for s in m.samples if s.labels.get("job_id") == "rs"]


def test_a_started_job_is_pending_until_its_loop_runs_it():
    import threading

    from learner_svc.jobs import JobManager
    from nitro.spec import TrainingSpec

    gate = threading.Event()
    jobs = JobManager(lambda job, resume: gate.wait(5))
    job = jobs.start(TrainingSpec(env_id="CartPole-v1", job_id="pending-metric"))
    assert ("pending-metric", "PENDING", 1.0) in state_series()
    gate.set()
    job.thread.join(5)
    metrics.forget_job("pending-metric")
    assert not {x for x in state_series() if x[0] == "pending-metric"}
