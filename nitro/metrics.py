"""Prometheus metrics shared by the services (base units, `_seconds`, `_total`).

Labels stay low-cardinality: a phase, an error type, a reason, a job id on
gauges; never a round or an actor.
"""

from __future__ import annotations

import contextlib
import time

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from nitro.clock import critical_path_cpu_seconds

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
COST_USD = Counter("nitro_cost_usd_total", "Dollars spent at this machine's wall time.", ["component"])
# The cloud clock (docs/cost.md): what the same work costs and takes on AWS, from measured CPU time.
CLOUD_COST_USD = Counter("nitro_cloud_cost_usd_total", "Modelled cloud dollars (docs/cost.md).", ["component"])
CLOUD_PHASE_SECONDS = Histogram(
    "nitro_cloud_round_phase_seconds", "Modelled cloud time of one phase of a training round (docs/cost.md).",
    ["phase"], buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
REJECTED_PAYLOADS = Counter("nitro_rejected_payloads_total", "Stream entries rejected before unpickling.",
                            ["reason"])
DUPLICATE_BATCHES = Counter("nitro_duplicate_batches_total", "Trajectory batches dropped as duplicates.")
CURRENT_ROUND = Gauge("nitro_current_round", "Round a job is in.", ["job"])
ACTORS_IN_FLIGHT = Gauge("nitro_actors_in_flight", "Actor invocations currently running.")
ACTORS_PER_ROUND = Gauge("nitro_actors_per_round", "Actors launched in the job's latest round.", ["job"])
BUDGET_LEFT_USD = Gauge("nitro_budget_left_usd", "Budget a job has left.", ["job"])
BOOSTING_SCORE = Gauge("nitro_boosting_score", "Latest boosting score S_k.", ["job"])
CONVEXITY_RATIO = Gauge("nitro_convexity_ratio", "Latest convexity ratio R.", ["job"])
EVAL_RETURN = Gauge("nitro_eval_return", "Latest deterministic evaluation return.", ["job"])
SCHEDULER_ACTORS = Gauge("nitro_scheduler_actors",
                         "Actors the learned scheduler (minions) chose for a job's next round, before the budget guard.",
                         ["job"])
SCHEDULER_INPUT = Gauge("nitro_scheduler_input", "Latest normalised observation of the learned scheduler (minions).",
                        ["job", "input"])
POLICY_LAG = Histogram("nitro_policy_lag", "Learner policy version minus the version that sampled a batch.",
                       buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256))
# learner_mode "stellaris": every update a learner function produced is applied or dropped, once.
GRADIENT_STALENESS = Histogram("nitro_gradient_staleness",
                               "Parameter-service version minus the base version of a learner-function update.",
                               buckets=(0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128))
GRADIENTS_PRODUCED = Counter("nitro_gradients_produced_total", "Learner-function updates received (no duplicates).")
GRADIENTS_APPLIED = Counter("nitro_gradients_applied_total", "Learner-function updates applied with their weight.")
GRADIENTS_DROPPED = Counter("nitro_gradients_dropped_total", "Learner-function updates dropped.", ["reason"])
STALENESS_BOUND = Gauge("nitro_staleness_bound", "Largest staleness a job applies in its current round.", ["job"])
LEARNER_INVOCATIONS = Counter("nitro_learner_function_invocations_total", "Learner function invocations started.")
DETECTOR_SECONDS = Histogram("nitro_detector_seconds", "Time to score one policy (HVPs + Lanczos).",
                             buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))


@contextlib.contextmanager
def timed(phase: str, sink: dict[str, float] | None = None, cloud: dict[str, float] | None = None):
    """Observe a phase in the histogram and add its duration to `sink[phase]`; with `cloud`, add its
    learner CPU time there too (the cloud clock's measure of the same phase, nitro.clock)."""
    t0 = time.perf_counter()
    c0 = critical_path_cpu_seconds() if cloud is not None else 0.0
    try:
        yield
    finally:
        observe_phase(phase, time.perf_counter() - t0, sink)
        if cloud is not None:
            cloud[phase] = cloud.get(phase, 0.0) + max(0.0, critical_path_cpu_seconds() - c0)


def observe_phase(phase: str, seconds: float, sink: dict[str, float] | None = None) -> None:
    ROUND_PHASE_SECONDS.labels(phase).observe(seconds)
    if sink is not None:
        sink[phase] = sink.get(phase, 0.0) + seconds


def serve_metrics(port: int, host: str = "127.0.0.1") -> int:
    """Expose /metrics on host:port (port 0 picks a free one); returns the port."""
    server, _ = start_http_server(port, addr=host)
    return server.server_address[1]
