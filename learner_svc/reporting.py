"""Round reports: the fields every loop fills alike when a round closes, and the metrics a report exports."""

from __future__ import annotations

import math
import time

import numpy as np

from nitro import cost as nitro_cost
from nitro.rpc import metrics
from nitro.scaling.base import FALLBACK_REASON
from nitro.v1 import common_pb2, scaler_pb2, training_pb2

# RoundReport learner diagnostics -> the UpdateStats field each averages over the round's SGD steps or updates
# (kl_coeff, the fifth, is the learner's own after the round).
DIAGNOSTICS = {"clip_fraction": "clip_frac", "grad_norm": "grad_norm", "explained_variance": "explained_variance"}


def closing_report_fields(*, job_id: str, scaler_policy: str, cost: scaler_pb2.GetCostResponse,
                          last: training_pb2.RoundReport | None, recent_returns: list[float],
                          recent_lengths: list[int], eval_return: float, score_resp, next_plan,
                          phases: dict[str, float], round_seconds: float, notes: list[str], fallback: int,
                          cloud_phases: dict[str, float] | None = None) -> dict:
    """RoundReport fields every loop fills alike when a round closes (`last`: the job's previous report);
    exports the round's gauges too."""
    cloud_phases = cloud_phases or {}
    metrics.ROUND_SECONDS.observe(round_seconds)
    for phase, seconds in cloud_phases.items():
        metrics.CLOUD_PHASE_SECONDS.labels(phase).observe(seconds)
    if math.isfinite(eval_return):
        metrics.set_job(metrics.EVAL_RETURN, job_id, eval_return)
    metrics.set_job(metrics.BUDGET_LEFT_USD, job_id, cost.budget_left_usd)
    metrics.set_job(metrics.BUDGET_USD, job_id, cost.budget_usd)
    metrics.set_job(metrics.JOB_PROGRESS, job_id, time.time())
    fallback_used = fallback > 0 and next_plan.reason.startswith(FALLBACK_REASON)
    if fallback > 0 and not fallback_used:
        notes = [*notes, f"scaler policy {scaler_policy!r} does not read the score: its plan needs no fallback"]
    return dict(
        **bill_fields(cost, last),
        job_id=job_id,
        train_return=float(np.mean(recent_returns)) if recent_returns else float("nan"),
        mean_episode_length=float(np.mean(recent_lengths)) if recent_lengths else 0.0,
        eval_return=eval_return, lambda_max=score_resp.lambda_max, lambda_min=score_resp.lambda_min,
        convexity_ratio=score_resp.convexity_ratio, score=score_resp.score,
        phases=[common_pb2.PhaseLatency(phase=p, seconds=s) for p, s in phases.items()],
        round_seconds=round_seconds, next_actors=next_plan.actors, scaler_reason=next_plan.reason,
        notes=notes[:50], detector_seconds=score_resp.seconds, fallback_plan=fallback_used,
        cloud_round_seconds=nitro_cost.cloud_round_seconds(cloud_phases), evaluated=not math.isnan(eval_return),
        cloud_phases=[common_pb2.PhaseLatency(phase=p, seconds=s) for p, s in cloud_phases.items()])


def bill_fields(cost: scaler_pb2.GetCostResponse, last: training_pb2.RoundReport | None) -> dict:
    """A report's bill from a GetCost snapshot: the job's totals on both clocks, what the round added to them since
    the job's previous report (`last`), the serverful comparator and the budget left."""
    return dict(round_cost_usd=max(0.0, cost.total_cost_usd - (last.total_cost_usd if last else 0.0)),
                total_cost_usd=cost.total_cost_usd, serverful_cost_usd=cost.serverful_cost_usd,
                budget_left_usd=cost.budget_left_usd,
                cloud_round_cost_usd=max(0.0, cost.cloud_total_cost_usd - (last.cloud_total_cost_usd if last else 0.0)),
                cloud_total_cost_usd=cost.cloud_total_cost_usd)


def add_evaluation(report: training_pb2.RoundReport, result) -> None:
    """Fill a round's evaluation (a learner_svc.evaluation.Evaluated) into its report, once it is in."""
    report.eval_return = result.eval_return
    report.evaluated = math.isfinite(result.eval_return)
    report.eval_cost_usd, report.cloud_eval_cost_usd = result.usd, result.cloud_usd
    report.notes.extend(result.notes)
    if report.evaluated:
        metrics.set_job(metrics.EVAL_RETURN, report.job_id, result.eval_return)


def export_diagnostics(report: training_pb2.RoundReport) -> None:
    """The round's learner diagnostics as per-job gauges (dropped with the job's other series), and the
    faults it records (replaced actors, a resume) as counters."""
    for gauge, value in ((metrics.CLIP_FRACTION, report.clip_fraction), (metrics.GRAD_NORM, report.grad_norm),
                         (metrics.EXPLAINED_VARIANCE, report.explained_variance),
                         (metrics.KL_COEFF, report.kl_coeff), (metrics.MEAN_EPISODE_LENGTH, report.mean_episode_length)):
        metrics.set_job(gauge, report.job_id, value)
    metrics.ACTORS_REPLACED.inc(max(0, report.actors_replaced))
    if report.resumed:  # the first report after a resume carries the flag, once per resume
        metrics.JOB_RESUMES.inc()
