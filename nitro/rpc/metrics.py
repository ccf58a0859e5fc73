"""Prometheus metrics shared by the services (base units, `_seconds`, `_total`).

Labels stay low-cardinality: a phase, an error type, a reason, a job id on
gauges and on the cost counters (series that end with their job: `forget_job`); never a round or an
actor. docs/operations.md lists every family with its panel and alert.
"""

from __future__ import annotations

import contextlib
import threading
import time

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from nitro.clock import critical_path_cpu_seconds

# The training job's label. Not "job": Prometheus gives every scraped target a `job` label of its own.
JOB_LABEL = "job_id"
JOB_IDLE_S = 15 * 60  # per-job series of the scaler and detector not heard of since (the detector never hears of an end)
# A job's series in the scaler outlive its end (EndJob) by this long, so that a scrape (every 15 s in
# deploy/monitoring) still sees the charges of its last launch before the counters go.
ENDED_LINGER_S = 60.0

# The phases of a training round, each one thing the learner waits for on its critical path (only the learner
# records them; `invoke` is the learner's wait for a launch to be dispatched, `plan` for the scaler's Plan).
# A service's own latency is a metric of its own (the scaler's launches: SCALER_LAUNCH_SECONDS).
PHASES = ("sample", "ingest", "update", "detect", "plan", "invoke", "publish", "evaluate")

ROUND_PHASE_SECONDS = Histogram(
    "nitro_round_phase_seconds", "Wall time of one phase of a training round.", ["phase"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
ROUND_SECONDS = Histogram("nitro_round_seconds", "Wall time of a whole training round.",
                          buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
INVOCATIONS = Counter("nitro_actor_invocations_total", "Actor function invocations started.")
INVOCATION_FAILURES = Counter("nitro_actor_invocation_failures_total", "Actor invocations that failed.",
                              ["error_type"])
INVOCATION_RETRIES = Counter("nitro_actor_invocation_retries_total", "Actor invocations retried.")
ENV_STEPS = Counter("nitro_env_steps_total", "Environment steps ingested by the learner.")
# Per job (inc_job): a job has three components at most, and its series go when it ends (EndJob, or idle).
COST_USD = Counter("nitro_cost_usd_total", "Dollars spent at this machine's wall time.", [JOB_LABEL, "component"])
# The cloud clock (docs/cost.md): what the same work costs and takes on AWS, from measured CPU time.
CLOUD_COST_USD = Counter("nitro_cloud_cost_usd_total", "Modelled cloud dollars (docs/cost.md).",
                         [JOB_LABEL, "component"])
CLOUD_PHASE_SECONDS = Histogram(
    "nitro_cloud_round_phase_seconds", "Modelled cloud time of one phase of a training round (docs/cost.md).",
    ["phase"], buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
REJECTED_PAYLOADS = Counter("nitro_rejected_payloads_total", "Stream entries rejected before unpickling.",
                            ["reason"])
DUPLICATE_BATCHES = Counter("nitro_duplicate_batches_total", "Trajectory batches dropped as duplicates.")
# Faults a user should be able to see (issue 17): replaced actors and jobs a restarted learner resumed.
ACTORS_REPLACED = Counter("nitro_actors_replaced_total", "Actors launched to replace ones that failed or straggled.")
JOB_RESUMES = Counter("nitro_job_resumes_total", "Jobs a learner resumed from their checkpoint after a restart.")
CURRENT_ROUND = Gauge("nitro_current_round", "Round a job is in.", [JOB_LABEL])
ACTORS_IN_FLIGHT = Gauge("nitro_actors_in_flight", "Actor invocations currently running.")
ACTORS_PER_ROUND = Gauge("nitro_actors_per_round", "Actors launched in the job's latest round.", [JOB_LABEL])
BUDGET_LEFT_USD = Gauge("nitro_budget_left_usd", "Budget a job has left.", [JOB_LABEL])
# Beside every BUDGET_LEFT_USD series, so that the fraction left is one division of two series of one target.
BUDGET_USD = Gauge("nitro_budget_usd", "A job's whole budget, on its budget's clock.", [JOB_LABEL])
# A job's state as one series set to 1, labelled with the state's name (a numeric code would need a legend
# and could not be counted by state). Terminal states are not kept: the job's series end with it, and
# JOBS_ENDED records how it ended.
JOB_STATE = Gauge("nitro_job_state", "1 for a live job, labelled with its state (PENDING or RUNNING).",
                  [JOB_LABEL, "state"])
JOBS_ENDED = Counter("nitro_jobs_ended_total", "Jobs that ended, by end state (SUCCEEDED, FAILED, STOPPED).",
                     ["state"])
# The stalled-round alert: time() - progress > limit (docs/operations.md#stalled-rounds).
JOB_PROGRESS = Gauge("nitro_job_progress_timestamp_seconds", "Unix time a job's latest round started or closed.",
                     [JOB_LABEL])
ROUND_TIME_LIMIT = Gauge("nitro_round_time_limit_seconds",
                         "Longest a healthy round of the job samples for (every wave's round deadline, plus one).",
                         [JOB_LABEL])
BOOSTING_SCORE = Gauge("nitro_boosting_score", "Latest boosting score S_k.", [JOB_LABEL])
CONVEXITY_RATIO = Gauge("nitro_convexity_ratio", "Latest convexity ratio R.", [JOB_LABEL])
EVAL_RETURN = Gauge("nitro_eval_return", "Latest deterministic evaluation return.", [JOB_LABEL])
# Learner diagnostics of a job's latest round (RoundReport fields of the same names).
CLIP_FRACTION = Gauge("nitro_clip_fraction", "Share of samples whose probability ratio was clipped.", [JOB_LABEL])
GRAD_NORM = Gauge("nitro_grad_norm", "Mean global gradient norm before clipping.", [JOB_LABEL])
EXPLAINED_VARIANCE = Gauge("nitro_explained_variance", "Value function's explained variance of its targets.",
                           [JOB_LABEL])
KL_COEFF = Gauge("nitro_kl_coeff", "Adaptive KL penalty coefficient.", [JOB_LABEL])
MEAN_EPISODE_LENGTH = Gauge("nitro_mean_episode_length", "Mean length of the latest 20 training episodes.",
                            [JOB_LABEL])
SCHEDULER_ACTORS = Gauge("nitro_scheduler_actors",
                         "Actors the learned scheduler (minions) chose for a job's next round, before the budget guard.",
                         [JOB_LABEL])
SCHEDULER_INPUT = Gauge("nitro_scheduler_input", "Latest normalised observation of the learned scheduler (minions).",
                        [JOB_LABEL, "input"])
POLICY_LAG = Histogram("nitro_policy_lag", "Learner policy version minus the version that sampled a batch.",
                       buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256))
# learner_mode "stellaris": every update a learner function produced is applied or dropped, once.
GRADIENT_STALENESS = Histogram("nitro_gradient_staleness",
                               "Parameter-service version minus the base version of a learner-function update.",
                               buckets=(0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128))
GRADIENTS_PRODUCED = Counter("nitro_gradients_produced_total", "Learner-function updates received (no duplicates).")
GRADIENTS_APPLIED = Counter("nitro_gradients_applied_total", "Learner-function updates applied with their weight.")
GRADIENTS_DROPPED = Counter("nitro_gradients_dropped_total", "Learner-function updates dropped.", ["reason"])
STALENESS_BOUND = Gauge("nitro_staleness_bound", "Largest staleness a job applies in its current round.", [JOB_LABEL])
LEARNER_INVOCATIONS = Counter("nitro_learner_function_invocations_total", "Learner function invocations started.")
EVAL_INVOCATIONS = Counter("nitro_eval_function_invocations_total", "Evaluation function invocations started.")
SCALER_LAUNCH_SECONDS = Histogram(
    "nitro_scaler_launch_seconds", "Wall time of one Launch in the scaler, until every invocation returned.",
    ["kind"], buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600))
DETECTOR_SECONDS = Histogram("nitro_detector_seconds", "Time to score one policy (HVPs + Lanczos).",
                             buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))


@contextlib.contextmanager
def timed(phase: str, sink: dict[str, float] | None = None, cloud: dict[str, float] | None = None):
    """Observe a phase in the histogram and add its duration to `sink[phase]`; with `cloud`, add its
    learner CPU time there too (the cloud clock's measure of the same phase, nitro.clock)."""
    _check_phase(phase)
    t0 = time.perf_counter()
    c0 = critical_path_cpu_seconds() if cloud is not None else 0.0
    try:
        yield
    finally:
        observe_phase(phase, time.perf_counter() - t0, sink)
        if cloud is not None:
            cloud[phase] = cloud.get(phase, 0.0) + max(0.0, critical_path_cpu_seconds() - c0)


def observe_phase(phase: str, seconds: float, sink: dict[str, float] | None = None) -> None:
    _check_phase(phase)
    ROUND_PHASE_SECONDS.labels(phase).observe(seconds)
    if sink is not None:
        sink[phase] = sink.get(phase, 0.0) + seconds


def _check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise ValueError(f"unknown round phase {phase!r}; allowed: {list(PHASES)}")


def serve_metrics(port: int, host: str = "127.0.0.1") -> int:
    """Expose /metrics on host:port (port 0 picks a free one); returns the port."""
    server, _ = start_http_server(port, addr=host)
    return server.server_address[1]


def scrape(port: int, host: str = "127.0.0.1") -> dict[str, list]:
    """Read a /metrics exposition (`serve_metrics`) back: {family name: samples}."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def sample_value(samples, name: str, **labels) -> float:
    """The sum of the samples called `name` whose labels include `labels` (of one family `scrape` read)."""
    total = 0.0
    for s in samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            total += s.value
    return total


# -- per-job series --------------------------------------------------------------------------------------
# Every per-job series is set through set_job or inc_job, which remember it, so that the learner can drop a
# job's series when it ends (forget_job) and the scaler and detector can drop those of jobs they have not
# heard from in JOB_IDLE_S (forget_idle_jobs): a finished job leaves no series behind.

_job_series: dict[str, set[tuple[Gauge | Counter, tuple[str, ...]]]] = {}
_job_touched: dict[str, float] = {}
_job_lock = threading.Lock()


def set_job(gauge: Gauge, job_id: str, value: float, *labels: str) -> None:
    """gauge{job_id=job_id, *labels} = value."""
    gauge.labels(job_id, *labels).set(value)
    with _job_lock:
        _job_series.setdefault(job_id, set()).add((gauge, (job_id, *labels)))
        _job_touched[job_id] = time.monotonic()


def inc_job(counter: Counter, job_id: str, amount: float, *labels: str) -> None:
    """counter{job_id=job_id, *labels} += amount; forgotten with the job's gauges."""
    counter.labels(job_id, *labels).inc(amount)
    with _job_lock:
        _job_series.setdefault(job_id, set()).add((counter, (job_id, *labels)))
        _job_touched[job_id] = time.monotonic()


def round_started(job_id: str, k: int, round_time_limit_s: float) -> None:
    """A job's round k began: its current round, its progress time and the stalled-round alert's limit."""
    set_job(CURRENT_ROUND, job_id, k)
    set_job(JOB_PROGRESS, job_id, time.time())
    set_job(ROUND_TIME_LIMIT, job_id, round_time_limit_s)


LIVE_STATES = ("PENDING", "RUNNING")
END_STATES = ("SUCCEEDED", "FAILED", "STOPPED")


def job_state(job_id: str, state: str) -> None:
    """A job entered `state`: a live state replaces its JOB_STATE series; an end state removes it and counts
    the end in JOBS_ENDED (the job's other series go with forget_job)."""
    if state not in LIVE_STATES + END_STATES:
        raise ValueError(f"unknown job state {state!r}; allowed: {list(LIVE_STATES + END_STATES)}")
    with _job_lock:
        held = _job_series.get(job_id, set())
        old = {(m, labels) for m, labels in held if m is JOB_STATE}
        held -= old
    for _, labels in old:
        try:
            JOB_STATE.remove(*labels)
        except KeyError:
            pass
    if state in END_STATES:
        JOBS_ENDED.labels(state).inc()
    else:
        set_job(JOB_STATE, job_id, 1, state)


def forget_job(job_id: str) -> None:
    """Remove every series set_job made for this job."""
    with _job_lock:
        series = _job_series.pop(job_id, set())
        _job_touched.pop(job_id, None)
    for gauge, labels in series:
        try:
            gauge.remove(*labels)
        except KeyError:  # already gone
            pass


def forget_job_after(job_id: str, delay_s: float = ENDED_LINGER_S) -> threading.Timer:
    """Forget the job's series in delay_s, unless they were set again meanwhile (a resumed job)."""
    with _job_lock:
        ended_at = _job_touched.get(job_id)

    def forget() -> None:
        with _job_lock:
            touched = _job_touched.get(job_id)
        if touched is not None and touched == ended_at:
            forget_job(job_id)

    timer = threading.Timer(delay_s, forget)
    timer.daemon = True
    timer.start()
    return timer


def forget_idle_jobs(max_idle_s: float = JOB_IDLE_S) -> list[str]:
    """Forget the jobs whose series nobody set for max_idle_s; returns their ids."""
    now = time.monotonic()
    with _job_lock:
        idle = [j for j, t in _job_touched.items() if now - t > max_idle_s]
    for job_id in idle:
        forget_job(job_id)
    return idle
