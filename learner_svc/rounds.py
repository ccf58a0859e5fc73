"""What every learner loop shares: talking to the detector and scaler with retries and
fallbacks, surviving Redis restarts, publishing policies, evaluating, checkpointing
and resuming, and assembling round reports.

Durability, one rule for every loop (`RoundLoop.commit`): a stream entry is acked
only after the checkpoint that holds what was learned from it, and that
checkpoint names it. `checkpoint.pt` (model, optimiser, RNG states, counters, the
half-built report of its round, the entries it consumes) is written atomically,
then its entries are acked; the report is appended to `reports.pb` once the round
is complete, and `best.pt`, a copy of the checkpoint of the best evaluated round
so far, just before. A learner that dies before the checkpoint gets the round's
entries redelivered and learns from them once, in the round it redoes; one that
dies between the checkpoint and the ack acks them on resume without learning
from them again; one that dies before the report finishes that round on resume
(score or evaluate, plan, report) instead of skipping it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import grpc
import numpy as np
import redis
import torch

from learner_svc.jobs import Job
from nitro import codec, metrics
from nitro import cost as nitro_cost
from nitro.detector.core import REQUIRED_FIELDS
from nitro.envs import env_spaces
from nitro.grpc_util import DEADLINES
from nitro.inference import PolicyRunner
from nitro.models import policy_to_blob, spec_for_spaces
from nitro.rollout import evaluate
from nitro.scaling.base import FALLBACK_REASON
from nitro.spec import algo_config, env_kwargs_to_wire
from nitro.store import PolicyStore, TrajectoryReader
from nitro.v1 import common_pb2, detector_pb2, scaler_pb2, training_pb2

log = logging.getLogger(__name__)

POLICY_TTL_S = 3600
DETECTOR_SUBSET = 512
# How long a Redis outage (restart) is ridden out before the job fails, resumable.
REDIS_PATIENCE_S = float(os.environ.get("NITRO_REDIS_PATIENCE_S", "60"))
RPC_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
CHECKPOINT_FORMAT = 2
EVAL_SEED_TAG = 2  # evaluation seeds: (seed, round, 2, 0), four parts, never an actor launch's (seed, round, wave)
LOST_BATCH_GRACE_S = 5.0  # a launched actor whose batch is still missing this long after it returned is lost
WAVE_RECORD_TTL_S = 7 * 24 * 3600  # a round's wave records outlive any resume of it


class JobAborted(RuntimeError):
    """The job cannot go on; it ends FAILED with this message."""


class DependencyUnavailable(JobAborted):
    """Redis or the scaler stayed unavailable past its patience: the job ends FAILED, resumable from its
    last checkpoint once the dependency is back."""


NO_SAMPLES = "no samples arrived"  # how the loops' end message for rounds without samples begins


def dependency_failure(exc: BaseException) -> str | None:
    """What was unavailable when `exc` ended a job, or None when `exc` is not a dependency's outage."""
    if isinstance(exc, DependencyUnavailable):
        return str(exc)
    if isinstance(exc, grpc.RpcError) and exc.code() in RPC_RETRYABLE:
        return f"the scaler or detector stayed unavailable ({exc.code().name}: {exc.details()})"
    if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        return f"Redis stayed unavailable ({exc})"
    return None


def resume_advice(reason: str, job_id: str, rounds_done: int, rounds: int, fix: str = "once it is back") -> str:
    """A resumable failure's message: why, that nothing is lost, and the command that continues the job."""
    kept = (f"{rounds_done}/{rounds} rounds done and checkpointed" if rounds_done
            else "no round had finished, so it starts again from round 0")
    return f"{reason}. Nothing is lost ({kept}): {fix}, continue it with `nitro train --resume {job_id}`"


@dataclass
class LearnerDeps:
    redis: redis.Redis
    hmac_key: bytes
    detector: object  # BoostingDetectorStub
    scaler: object  # ActorScalerStub
    data_dir: str
    call_metadata: tuple = ()  # e.g. the bearer token for detector/scaler calls
    device: str = "cpu"  # torch device of the learner's model and updates (nitro.devices.resolve_device)


def sample_key(job_id: str, round_index: int) -> str:
    return f"nitro:{job_id}:sample:{round_index}"


def invocation_id(job_id: str, round_index: int, actor: int, wave: int = 0) -> str:
    # Deterministic: a retried invocation carries the same id, so the stream drops the copy.
    base = f"{job_id}-r{round_index}-a{actor}"
    return base if wave == 0 else f"{base}-x{wave}"


def slot_index(inv_id: str, job_id: str, round_index: int) -> int | None:
    """The actor slot of an invocation id of this job and round (any wave), else None."""
    m = re.fullmatch(rf"{re.escape(job_id)}-r{round_index}-a(\d+)(?:-x\d+)?", inv_id)
    return int(m.group(1)) if m else None


def retry_note(r: scaler_pb2.InvocationResult) -> str | None:
    """The round-report note of an invocation that succeeded only after the scaler retried it, else None."""
    if not r.ok or r.attempts <= 1:
        return None
    return f"actor {r.invocation_id} succeeded on attempt {r.attempts}, {r.error_message[:200] or 'after retries'}"


def derived_seed(seed: int, *parts: int) -> int:
    return int(np.random.SeedSequence([seed, *parts]).generate_state(1)[0])


def job_dir(data_dir: str, job_id: str) -> str:
    return os.path.join(data_dir, "jobs", job_id)


class RoundLoop:
    """Base of the on- and off-policy loops; subclasses build `self.learner` and run rounds."""

    learner_class: type = None  # set by subclasses
    cpu_only = False  # True where the model stays on the CPU whatever the learner's device

    def __init__(self, job: Job, deps: LearnerDeps):
        self.job, self.deps, self.spec = job, deps, job.spec
        self.device = "cpu" if self.cpu_only else deps.device
        self.cfg = algo_config(self.spec)
        obs_space, act_space = env_spaces(self.spec.env_id, **self.spec.env_kwargs)
        self.model_spec = spec_for_spaces(obs_space, act_space, hidden_sizes=self.cfg.hidden_sizes,
                                          activation=self.cfg.activation, obs_norm=self.cfg.obs_norm,
                                          init_log_std=self.cfg.init_log_std)
        self.learner = self.learner_class(self.model_spec, self.cfg, seed=self.spec.seed, device=self.device)
        self.policies = PolicyStore(deps.redis, job.job_id, ttl_s=POLICY_TTL_S)
        self.reader = TrajectoryReader(deps.redis, job.job_id, deps.hmac_key, consumer=f"learner-{job.job_id}")
        self.version = 0
        self.total_steps = 0
        self.next_round = 0
        self.recent_returns: list[float] = []
        self.recent_lengths: list[int] = []  # of the same episodes as recent_returns
        self.last_actors = self.spec.scaler.i_min
        self.last_plan_time = time.monotonic()
        self.rng = np.random.default_rng(self.spec.seed)
        self.pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix=f"{job.job_id}-io")
        self.dir = job_dir(deps.data_dir, job.job_id)
        os.makedirs(self.dir, exist_ok=True)
        self._exported_rejected: dict[str, int] = {}
        self._exported_duplicates = 0
        self.counted_before: dict[str, bool] = {}  # from the checkpoint: see commit's `counted`
        self.resumed = False  # the next report is the first of a resumed learner (asynchronous loops)

    # -- the job's life ---------------------------------------------------------------------
    def run(self, resume: bool = False) -> None:
        """Run the job to its end state; a drained job is left resumable."""
        job = self.job
        job.set_state(training_pb2.JOB_STATE_RUNNING)
        self.save_job_state("RUNNING")
        failed, resumable = training_pb2.JOB_STATE_FAILED, False
        try:
            end_state, end_message = self.train(resume)
        except Exception as exc:  # noqa: BLE001 - a dependency's outage ends the job resumable; others propagate
            reason = dependency_failure(exc)
            if reason is not None:
                log.warning("job %s: %s; it ends FAILED, resumable", job.job_id, reason)
                end_state, resumable = failed, True
                end_message = resume_advice(reason, job.job_id, len(job.reports), self.spec.rounds)
            elif isinstance(exc, JobAborted):
                end_state, end_message = failed, str(exc)
            else:
                raise
        finally:
            self.shutdown()
            metrics.forget_job(job.job_id)  # a finished job leaves no series behind
        if end_state == training_pb2.JOB_STATE_STOPPED and job.stop_reason == "learner shutting down":
            resumable = True
            end_message += f"; resume with `nitro train --resume {job.job_id}`"
        elif end_state == failed and end_message.startswith(NO_SAMPLES):
            # Nothing was trained on in those rounds: once the actors work again the job can go on.
            resumable = True
            end_message = resume_advice(
                f"{end_message}: the actors produced no batches (the round notes say why; see the actor "
                f"endpoint's or function's log)", job.job_id, len(job.reports), self.spec.rounds,
                fix="fix the actors, then")
        self.save_job_state(training_pb2.JobState.Name(end_state).removeprefix("JOB_STATE_"), end_message,
                            resumable=resumable)
        job.set_state(end_state, end_message)

    def train(self, resume: bool) -> tuple[int, str]:
        """The loop proper: returns (end state, message). Subclasses implement it."""
        raise NotImplementedError

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    # -- resilience helpers ---------------------------------------------------------------
    def redis_call(self, fn: Callable, what: str):
        """Run a Redis operation, riding out a restart of the server for up to REDIS_PATIENCE_S."""
        deadline = time.monotonic() + REDIS_PATIENCE_S
        delay = 0.1
        while True:
            try:
                return fn()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                    redis.exceptions.BusyLoadingError) as exc:
                if time.monotonic() + delay > deadline:
                    raise DependencyUnavailable(f"Redis unavailable for {REDIS_PATIENCE_S:g} s during {what}: "
                                                f"{exc}") from exc
                log.warning("job %s: Redis unavailable during %s (%s); retrying in %.1f s", self.job.job_id,
                            what, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def rpc(self, method: Callable, request, *, timeout: float, patience: float, what: str):
        """Call a scaler/detector RPC, retrying UNAVAILABLE / DEADLINE_EXCEEDED until `patience` runs out."""
        deadline = time.monotonic() + patience
        delay = 0.2
        while True:
            try:
                return method(request, timeout=timeout, metadata=self.deps.call_metadata or None)
            except grpc.RpcError as exc:
                if exc.code() not in RPC_RETRYABLE or time.monotonic() + delay > deadline:
                    raise
                log.warning("job %s: %s failed (%s); retrying in %.1f s", self.job.job_id, what,
                            exc.code().name, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def export_reader_counters(self) -> tuple[int, int]:
        """Push the reader's rejected/duplicate counts into metrics; returns the deltas since last call."""
        d_rej = 0
        for reason, count in self.reader.rejected.items():
            delta = count - self._exported_rejected.get(reason, 0)
            if delta:
                metrics.REJECTED_PAYLOADS.labels(reason).inc(delta)
                d_rej += delta
            self._exported_rejected[reason] = count
        d_dup = self.reader.duplicates - self._exported_duplicates
        if d_dup:
            metrics.DUPLICATE_BATCHES.inc(d_dup)
        self._exported_duplicates = self.reader.duplicates
        return d_rej, d_dup

    # -- asynchronous rounds (off-policy and stellaris loops) ------------------------------
    def _poll_launch(self, rnd: dict, notes: list[str]) -> None:
        fut = rnd["future"]
        if rnd["resp"] is not None or not fut.done():
            return
        rnd["done_at"] = time.perf_counter()
        try:
            rnd["resp"] = fut.result()
        except grpc.RpcError as exc:
            notes.append(f"launch failed: {exc.code().name}: {exc.details()}")
            rnd["resp"] = scaler_pb2.LaunchResponse()
            rnd["failed"] = set(range(rnd["actors"]))
        notes += [note for note in map(retry_note, rnd["resp"].invocations) if note]
        for r in rnd["resp"].invocations:
            if not r.ok:
                slot = slot_index(r.invocation_id, self.job.job_id, rnd["k"])
                if slot is not None:
                    rnd["failed"].add(slot)
                notes.append(f"actor {r.invocation_id} failed after {r.attempts} attempt(s): {r.error_type}: "
                             f"{r.error_message[:200]}")

    def _round_closed(self, rnd: dict) -> bool:
        if rnd["resp"] is None:
            return time.perf_counter() - rnd["start"] > self.spec.round_deadline_s
        waiting = set(range(rnd["actors"])) - rnd["covered"]
        return not waiting or waiting <= rnd["failed"] or \
            time.perf_counter() - rnd["done_at"] > LOST_BATCH_GRACE_S

    # -- scaler and detector ----------------------------------------------------------
    def scaler_spec(self) -> common_pb2.ScalerSpec:
        sc = self.spec.scaler
        return common_pb2.ScalerSpec(policy=sc.policy, i_min=sc.i_min, i_max=sc.i_max, fixed_actors=sc.fixed_actors,
                                     decay=sc.decay, window=sc.window, period=sc.period, scheduler=sc.scheduler,
                                     actors_by_round=sc.actors_by_round, floor_actors=sc.floor_actors,
                                     floor_decay=sc.floor_decay)

    def plan(self, round_index: int, score: float, gns: float, fallback_actors: int = 0,
             last: dict | None = None, cloud_seconds: float = 0.0) -> scaler_pb2.PlanResponse:
        """Ask the scaler for round `round_index`'s actors; `last` describes the round just finished,
        `cloud_seconds` is its modelled cloud time (the learner server's bill on the cloud clock)."""
        last = last or {}
        now = time.monotonic()
        learner_seconds, self.last_plan_time = now - self.last_plan_time, now
        try:
            resp = self.rpc(self.deps.scaler.Plan, scaler_pb2.PlanRequest(
                job_id=self.job.job_id, round=round_index, score=min(max(score, 0.0), 1.0),
                scaler=self.scaler_spec(), budget_usd=self.spec.budget_usd,
                steps_per_actor=self.spec.steps_per_actor, actor_memory_mb=self.spec.actor_memory_mb,
                learner_seconds=learner_seconds, gradient_noise_scale=gns, fallback_actors=fallback_actors,
                learner_loss=last.get("loss", 0.0), eval_return=_finite(last.get("eval_return", 0.0)),
                approx_kl=last.get("kl", 0.0), update_seconds=last.get("update_seconds", 0.0),
                actor_seconds=last.get("actor_seconds", 0.0), round_seconds=last.get("round_seconds", 0.0),
                target_return=self.spec.target_return, rounds=self.spec.rounds,
                cloud_learner_seconds=max(0.0, cloud_seconds), budget_clock=self.spec.budget_clock),
                timeout=DEADLINES["Plan"], patience=self.spec.round_deadline_s, what="Plan")
        except grpc.RpcError as exc:
            if exc.code() not in RPC_RETRYABLE:  # the scaler refused the plan: retrying cannot help
                raise JobAborted(f"the scaler refused to plan round {round_index}: {exc.code().name}: "
                                 f"{exc.details()}") from exc
            raise DependencyUnavailable(f"scaler unavailable for planning: {exc.code().name}: "
                                        f"{exc.details()}") from exc
        if resp.actors > 0:
            self.last_actors = resp.actors
        return resp

    def launch(self, round_index: int, slots: list[int], wave: int = 0) -> scaler_pb2.LaunchResponse:
        """Invoke the given actor slots (wave > 0: replacements with fresh invocation ids)."""
        req = scaler_pb2.LaunchRequest(
            job_id=self.job.job_id, round=round_index, policy_version=self.version, actors=len(slots),
            steps_per_actor=self.spec.steps_per_actor, env_id=self.spec.env_id,
            seed=derived_seed(self.spec.seed, round_index, wave), function_name=self.spec.function_name,
            deadline_s=self.spec.round_deadline_s, actor_memory_mb=self.spec.actor_memory_mb, wait=True,
            slots=slots, wave=wave, reset_episodes=self.spec.reproducible,
            env_kwargs_json=env_kwargs_to_wire(self.spec.env_kwargs), envs_per_actor=self.spec.envs_per_actor)
        return self.rpc(self.deps.scaler.Launch, req, timeout=self.spec.round_deadline_s + 30.0,
                        patience=self.spec.round_deadline_s, what="Launch")

    def cost(self) -> scaler_pb2.GetCostResponse:
        return self.rpc(self.deps.scaler.GetCost, scaler_pb2.GetCostRequest(job_id=self.job.job_id),
                        timeout=DEADLINES["GetCost"], patience=30.0, what="GetCost")

    def note_episodes(self, batch: dict) -> None:
        """Remember the returns and lengths of the episodes that finished inside an actor batch."""
        self.recent_returns = (self.recent_returns + list(batch["episode_returns"]))[-RECENT_EPISODES:]
        self.recent_lengths = (self.recent_lengths + list(batch.get("episode_lengths", [])))[-RECENT_EPISODES:]

    def closing_report_fields(self, *, eval_return: float, score_resp, next_plan, phases: dict[str, float],
                              round_seconds: float, notes: list[str], fallback: int,
                              cloud_phases: dict[str, float] | None = None) -> dict:
        """RoundReport fields every loop fills alike when a round closes; exports the round's gauges too."""
        cost = self.cost()
        cloud_phases = cloud_phases or {}
        last = self.job.reports[-1] if self.job.reports else None
        prev_total = last.total_cost_usd if last else 0.0
        prev_cloud = last.cloud_total_cost_usd if last else 0.0
        metrics.ROUND_SECONDS.observe(round_seconds)
        for phase, seconds in cloud_phases.items():
            metrics.CLOUD_PHASE_SECONDS.labels(phase).observe(seconds)
        if math.isfinite(eval_return):
            metrics.set_job(metrics.EVAL_RETURN, self.job.job_id, eval_return)
        metrics.set_job(metrics.BUDGET_LEFT_USD, self.job.job_id, cost.budget_left_usd)
        fallback_used = fallback > 0 and next_plan.reason.startswith(FALLBACK_REASON)
        if fallback > 0 and not fallback_used:
            notes = [*notes, f"scaler policy {self.spec.scaler.policy!r} does not read the score: its plan needs no "
                             "fallback"]
        return dict(
            job_id=self.job.job_id,
            train_return=float(np.mean(self.recent_returns)) if self.recent_returns else float("nan"),
            mean_episode_length=float(np.mean(self.recent_lengths)) if self.recent_lengths else 0.0,
            eval_return=eval_return, lambda_max=score_resp.lambda_max, lambda_min=score_resp.lambda_min,
            convexity_ratio=score_resp.convexity_ratio, score=score_resp.score,
            round_cost_usd=max(0.0, cost.total_cost_usd - prev_total), total_cost_usd=cost.total_cost_usd,
            serverful_cost_usd=cost.serverful_cost_usd, budget_left_usd=cost.budget_left_usd,
            phases=[common_pb2.PhaseLatency(phase=p, seconds=s) for p, s in phases.items()],
            round_seconds=round_seconds, next_actors=next_plan.actors, scaler_reason=next_plan.reason,
            notes=notes[:50], detector_seconds=score_resp.seconds, fallback_plan=fallback_used,
            cloud_round_seconds=nitro_cost.cloud_round_seconds(cloud_phases),
            cloud_round_cost_usd=max(0.0, cost.cloud_total_cost_usd - prev_cloud),
            cloud_total_cost_usd=cost.cloud_total_cost_usd, evaluated=not math.isnan(eval_return),
            cloud_phases=[common_pb2.PhaseLatency(phase=p, seconds=s) for p, s in cloud_phases.items()])

    def score(self, round_index: int, ref: str, algo: str = "ppo") -> detector_pb2.ScoreResponse:
        sc = self.spec.scaler
        return self.deps.detector.Score(detector_pb2.ScoreRequest(
            job_id=self.job.job_id, round=round_index, policy_version=self.version, sample_ref=ref,
            algo=algo, clip=self.cfg.clip, window=sc.window, decay=sc.decay,
            seed=derived_seed(self.spec.seed, round_index, 1) % (2**62),
            normalize_advantages=getattr(self.cfg, "normalize_advantages", False)),
            timeout=self.spec.detector_timeout_s, metadata=self.deps.call_metadata or None)

    def _wave_keys(self, round_index: int) -> tuple[str, str]:
        """The round's wave counter and the wall time its latest wave was launched."""
        key = f"nitro:{self.job.job_id}:waves:{round_index}"
        return key, f"{key}:at"

    def new_wave(self, round_index: int) -> int:
        """A fresh wave number for this round; kept in Redis so a restarted learner never reuses one, and
        knows what the learner before it launched (`launched_waves`)."""
        key, at = self._wave_keys(round_index)

        def incr():
            pipe = self.deps.redis.pipeline(transaction=True)
            pipe.incr(key)
            pipe.set(at, repr(time.time()), ex=WAVE_RECORD_TTL_S)
            pipe.expire(key, WAVE_RECORD_TTL_S)
            return pipe.execute()[0]

        return int(self.redis_call(incr, "wave counter")) - 1

    def launched_waves(self, round_index: int) -> tuple[int, float | None]:
        """(waves launched for this round so far, wall time of the latest launch or None): what a learner
        before this one launched, when this one resumes the round."""
        key, at = self._wave_keys(round_index)
        count, t = self.redis_call(lambda: self.deps.redis.mget(key, at), "wave record")
        return int(count or 0), float(t) if t is not None else None

    def fallback_actors(self) -> int:
        return self.spec.scaler.i_min if self.spec.detector_fallback == "i_min" else self.last_actors

    def last_eval(self, eval_return: float) -> float:
        """This round's eval return, or the latest one measured (rounds between evaluations have none)."""
        if math.isfinite(eval_return):
            return eval_return
        return next((r.eval_return for r in reversed(self.job.reports) if r.evaluated), 0.0)

    def last_score(self) -> float:
        return self.job.reports[-1].score if self.job.reports else 0.0

    # -- what the asynchronous loops (IMPACT, Stellaris) share --------------------------------
    def open_async(self, resume: bool) -> dict | tuple:
        """Restore, publish and launch the first round; the launched round, or (state, message) to end.

        A round committed but not reported (killed while evaluating it) is finished first."""
        if resume:
            pending = self.restore()
            self.resumed = True
            if pending:
                end = self.finish_async_round(pending, dict(pending["phases"]), {})
                if end is not None:
                    return end
            elif self.job.reports:  # killed after the job's last report, before its end state was saved
                last = self.job.reports[-1]
                end = self.async_end(last.round, last.eval_return, scaler_pb2.PlanResponse())
                if end is not None:
                    return end
        self.publish()
        plan = self.plan(self.next_round, self.last_score(), 0.0)
        if plan.budget_exhausted:
            return training_pb2.JOB_STATE_SUCCEEDED, f"budget exhausted: {plan.reason}"
        return self._launch_round(self.next_round, plan.actors)

    def async_pending(self, k: int, fields: dict, *, score_resp, next_plan, notes: list[str], fallback: int,
                      cloud: dict, phases: dict, started: float, ending: bool, **extra) -> dict:
        """What a closed asynchronous round still needs for its report once committed: the checkpoint keeps
        it, so a learner killed before the report finishes the round on resume. `fields`: the loop's
        RoundReport fields; `ending`: the job's last round (its rounds or its budget are spent); `extra`:
        the loop's own (settle_at_end)."""
        return {"round": k, "fields": fields, "score": score_resp.SerializeToString(),
                "plan": next_plan.SerializeToString(), "notes": list(notes), "fallback": fallback,
                "cloud": dict(cloud), "phases": dict(phases), "t": started, "ending": ending, **extra}

    def finish_async_round(self, pending: dict, phases: dict, carried: dict) -> tuple | None:
        """Evaluate a committed round and report it; how the job ends, or None when it goes on.

        checkpoint.pt is the policy evaluated here, so best.pt is kept before anything changes it."""
        k = pending["round"]
        next_plan = scaler_pb2.PlanResponse.FromString(pending["plan"])
        self.next_round = k + 1
        if "report" in pending:  # committed with its finished report (settle_at_end): only write it
            report = training_pb2.RoundReport.FromString(pending["report"])
            self.write_report(report)
            return self.async_end(k, report.eval_return, next_plan)
        with metrics.timed("evaluate", phases, carried):
            eval_return = self.evaluate_policy(k, last=pending["ending"])
        self.keep_best(eval_return)
        end = self.async_end(k, eval_return, next_plan)
        settled = None
        if end is not None and not pending["ending"]:  # the target is reached: the job ends before its rounds
            pending, settled = self.settle_at_end(pending, phases)
        notes = list(pending["notes"])
        resumed, self.resumed = self.resumed, False
        if resumed:
            notes.append("learner resumed from checkpoint")
        report = training_pb2.RoundReport(
            **pending["fields"], resumed=resumed,
            **self.closing_report_fields(eval_return=eval_return,
                                         score_resp=detector_pb2.ScoreResponse.FromString(pending["score"]),
                                         next_plan=next_plan, phases=phases, round_seconds=time.time() - pending["t"],
                                         notes=notes, fallback=pending["fallback"], cloud_phases=pending["cloud"]))
        if settled is not None:  # what settling learned is durable before the job ends, with its report
            self.commit(k, {**pending, "report": report.SerializeToString()}, *settled)
        self.write_report(report)
        return end

    def settle_at_end(self, pending: dict, phases: dict) -> tuple[dict, tuple | None]:
        """A loop's last work when its target ends the job early: the pending round's new fields and notes,
        and (entries, counted) to commit with the report, or None. Nothing to do by default."""
        return pending, None

    def async_end(self, k: int, eval_return: float, next_plan) -> tuple | None:
        """How the job ends after round k, or None when it goes on."""
        spec = self.spec
        if next_plan.budget_exhausted:
            return training_pb2.JOB_STATE_SUCCEEDED, f"budget exhausted: {next_plan.reason}"
        if k + 1 >= spec.rounds:
            return training_pb2.JOB_STATE_SUCCEEDED, f"completed {spec.rounds} rounds"
        if spec.target_return and eval_return >= spec.target_return:
            return training_pb2.JOB_STATE_SUCCEEDED, f"target return {spec.target_return:g} reached"
        return None

    def score_or_fallback(self, k: int, ref: str, algo: str, notes: list[str]):
        """(ScoreResponse, fallback actors): the score, or the configured fallback when the detector fails."""
        if not ref:
            return detector_pb2.ScoreResponse(), 0
        try:
            return self.score(k, ref, algo=algo), 0
        except grpc.RpcError as exc:
            fallback = self.fallback_actors()
            notes.append(f"detector unavailable ({exc.code().name}); fallback for a policy that reads the score: "
                         f"{fallback} actors")
            return detector_pb2.ScoreResponse(), fallback

    def async_plan_inputs(self, means: dict, cloud: dict) -> dict:
        """The last round's inputs for a learned scheduler, from an asynchronous round's accumulators;
        times on the cloud clock, so they do not move with this machine's load."""
        return {"loss": means.get("policy_loss", 0.0) + means.get("value_loss", 0.0), "kl": means.get("kl", 0.0),
                "update_seconds": cloud.get("update", 0.0), "actor_seconds": cloud.get("sample", 0.0),
                "round_seconds": nitro_cost.cloud_round_seconds(cloud), "eval_return": self.last_eval(math.nan)}

    # -- data plane ---------------------------------------------------------------------
    def publish(self) -> None:
        blob = policy_to_blob(self.learner.policy, self.version, self.deps.hmac_key)
        self.redis_call(lambda: self.policies.put(self.version, blob), "policy publish")

    def write_sample_subset(self, round_index: int, extra: dict | None = None) -> str:
        data = self.learner.last_data
        n = len(data["logp"])
        idx = np.sort(self.rng.choice(n, size=min(n, DETECTOR_SUBSET), replace=False))
        subset = {k: np.ascontiguousarray(_numpy(data[k])[idx]) for k in REQUIRED_FIELDS[self.spec.algo]}
        if extra:
            subset.update(extra)
        key = sample_key(self.job.job_id, round_index)
        blob = codec.encode(subset, self.deps.hmac_key)
        self.redis_call(lambda: self.deps.redis.set(key, blob, ex=POLICY_TTL_S), "sample subset write")
        return key

    def evaluates(self, round_index: int, last: bool = False) -> bool:
        """Whether round `round_index` is evaluated: every eval_every-th round and the job's last (`last`:
        it ends early, e.g. its budget is spent)."""
        spec = self.spec
        return spec.eval_episodes > 0 and (last or (round_index + 1) % spec.eval_every == 0
                                           or round_index + 1 >= spec.rounds)

    def evaluate_policy(self, round_index: int, last: bool = False) -> float:
        """Mean deterministic return over eval_episodes, each on its own eval seed; NaN when not evaluated."""
        if not self.evaluates(round_index, last):
            return float("nan")
        runner = PolicyRunner(self.model_spec, self.learner.policy.numpy_state(), self.version)
        return float(np.mean(evaluate(runner, self.spec.env_id, self.spec.eval_episodes,
                                      seed=derived_seed(self.spec.seed, round_index, EVAL_SEED_TAG, 0) % (2**31),
                                      env_kwargs=self.spec.env_kwargs)))

    # -- durability: one rule for every loop -------------------------------------------------
    def commit(self, round_index: int, pending: dict, entries: list, counted: dict | None = None) -> None:
        """Consume stream entries only once what was learned from them is durable: write the checkpoint,
        which names `entries`, then ack them.

        A learner killed before the (atomic) write gets them redelivered and learns from them in the round it
        redoes; one killed after it acks them on resume (restore) and does not learn from them again.
        `counted` ({entry id: its observations are in the statistics}): entries whose steps and episodes the
        checkpoint's counters hold but whose learning it does not (a Stellaris learner function still has
        them); redelivered after a resume they are learned from without being counted again."""
        self._write_checkpoint(round_index, pending, entries, counted or {})
        if entries:
            self.redis_call(lambda: self.reader.ack(entries), "stream ack")

    def _write_checkpoint(self, round_index: int, pending: dict, committed: list, counted: dict) -> None:
        path = os.path.join(self.dir, "checkpoint.pt")
        tmp = path + ".tmp"
        torch.save({"format": CHECKPOINT_FORMAT, "round": round_index, "version": self.version,
                    "env_steps": self.total_steps, "spec": self.spec.to_dict(),
                    "model_spec": self.model_spec.to_dict(), "learner": self.learner.state(),
                    "np_rng": self.rng.bit_generator.state, "recent_returns": self.recent_returns,
                    "recent_lengths": self.recent_lengths,
                    "last_actors": self.last_actors, "pending": pending,
                    "committed": [(e.entry_id, e.dedup_id) for e in committed], "counted": dict(counted)}, tmp)
        os.replace(tmp, path)  # atomic: a crash mid-write leaves the previous checkpoint intact
        self.job.checkpoint_path = path

    def restore(self) -> dict | None:
        """Load the last checkpoint and finish its commit; returns its pending (unreported) round, if any."""
        path = os.path.join(self.dir, "checkpoint.pt")
        if not os.path.exists(path):
            return None
        # Our own file in our own data dir; map_location: a GPU checkpoint resumes on a CPU learner too.
        ck = torch.load(path, weights_only=False, map_location=self.device)
        if ck.get("format") != CHECKPOINT_FORMAT:
            raise JobAborted(f"checkpoint {path} has format {ck.get('format')}, expected {CHECKPOINT_FORMAT}")
        self.learner.load_state(ck["learner"])
        self.version, self.total_steps = ck["version"], ck["env_steps"]
        self.rng.bit_generator.state = ck["np_rng"]
        self.recent_returns, self.last_actors = list(ck["recent_returns"]), ck["last_actors"]
        self.recent_lengths = list(ck.get("recent_lengths", []))  # absent from older checkpoints
        # Killed between the checkpoint and its ack: ack now, or those batches would be learned from twice.
        committed = [CommittedEntry(*ids) for ids in ck.get("committed", ())]
        if committed:
            self.redis_call(lambda: self.reader.ack(committed), "stream ack")
        self.counted_before = dict(ck.get("counted", {}))
        self.job.checkpoint_path = path
        reports = load_reports(self.dir)
        self.job.reports = reports
        if reports:
            self.job.total_cost_usd = reports[-1].total_cost_usd
            self.job.total_env_steps = reports[-1].total_env_steps
        self.next_round = ck["round"] + 1
        reported = reports[-1].round if reports else -1
        return ck["pending"] if ck["round"] > reported else None

    def keep_best(self, eval_return: float) -> None:
        """Copy checkpoint.pt to best.pt when this round's evaluation beats every earlier round's.

        checkpoint.pt holds exactly the policy evaluated: every loop commits round k before it evaluates
        it, and calls this before it trains any further. Ties keep the earlier round, as
        nitro.results.summarize's best_round does."""
        if math.isnan(eval_return):  # not evaluated
            return
        best = max((r.eval_return for r in self.job.reports if r.evaluated), default=-math.inf)
        if not eval_return > best:
            return
        path = os.path.join(self.dir, "best.pt")
        shutil.copyfile(os.path.join(self.dir, "checkpoint.pt"), path + ".tmp")
        os.replace(path + ".tmp", path)  # atomic, like the checkpoint itself

    def append_report(self, report: training_pb2.RoundReport) -> None:
        # best.pt first: a learner killed in between finishes the round again on resume and redoes both.
        self.keep_best(report.eval_return)
        self.write_report(report)

    def write_report(self, report: training_pb2.RoundReport) -> None:
        data = report.SerializeToString()
        with open(os.path.join(self.dir, "reports.pb"), "ab") as f:
            f.write(struct.pack("<I", len(data)) + data)
            f.flush()
            os.fsync(f.fileno())
        self.job.add_report(report)
        export_diagnostics(report)

    def save_job_state(self, state: str, message: str = "", resumable: bool = False) -> None:
        path = os.path.join(self.dir, "job.json")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"job_id": self.job.job_id, "state": state, "message": message, "resumable": resumable,
                       "spec": self.spec.to_dict()}, f)
        os.replace(tmp, path)


class CommittedEntry(NamedTuple):
    """A stream entry a checkpoint names, as TrajectoryReader.ack needs it."""

    entry_id: str
    dedup_id: str


RECENT_EPISODES = 20  # train_return and mean_episode_length average the latest this many episodes
# RoundReport learner diagnostics -> the UpdateStats field each averages over the round's SGD steps or updates
# (kl_coeff, the fifth, is the learner's own after the round).
DIAGNOSTICS = {"clip_fraction": "clip_frac", "grad_norm": "grad_norm", "explained_variance": "explained_variance"}


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


def _numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _finite(x: float) -> float:
    return float(x) if np.isfinite(x) else 0.0


def load_reports(directory: str) -> list[training_pb2.RoundReport]:
    path = os.path.join(directory, "reports.pb")
    out: list[training_pb2.RoundReport] = []
    if not os.path.exists(path):
        return out
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos + 4 <= len(data):
        (n,) = struct.unpack_from("<I", data, pos)
        if pos + 4 + n > len(data):
            break  # a torn last write: that round is finished again on resume
        out.append(training_pb2.RoundReport.FromString(data[pos + 4:pos + 4 + n]))
        pos += 4 + n
    return out
