"""The on-policy (PPO) round loop of DESIGN section 4.

Round k: launch the planned actors with policy v -> ingest their batches from
the stream (until all arrived or the round deadline) -> update -> publish v+1
and the detector's sample subset -> [detector scores v+1 while the learner
evaluates it] -> the scaler plans round k+1 -> report.

Phase latencies are measured on the learner's critical path, so they stack up
to the round's wall time: `sample` is time spent waiting for actors, `ingest`
verifying/decoding/acking batches, `invoke` the scaler's dispatch time,
`detect` only the wait for the detector after evaluation finished (its own
compute time is reported separately as detector_seconds).
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import numpy as np
import redis
import torch

from learner_svc.jobs import Job
from nitro import codec, metrics
from nitro.algos.ppo import PPOLearner
from nitro.envs import env_spaces
from nitro.grpc_util import DEADLINES
from nitro.inference import PolicyRunner
from nitro.models import policy_to_blob, spec_for_spaces
from nitro.rollout import evaluate
from nitro.spec import TrainingSpec, algo_config
from nitro.store import PolicyStore, TrajectoryReader
from nitro.v1 import common_pb2, detector_pb2, scaler_pb2, training_pb2

log = logging.getLogger(__name__)

SAMPLE_TTL_S = 3600
DETECTOR_SUBSET = 512
MAX_EMPTY_ROUNDS = 3


@dataclass
class LearnerDeps:
    redis: redis.Redis
    hmac_key: bytes
    detector: object  # BoostingDetectorStub
    scaler: object  # ActorScalerStub
    data_dir: str


def sample_key(job_id: str, round_index: int) -> str:
    return f"nitro:{job_id}:sample:{round_index}"


def invocation_id(job_id: str, round_index: int, actor: int) -> str:
    # Deterministic: a retried invocation carries the same id, so the stream drops the copy.
    return f"{job_id}-r{round_index}-a{actor}"


def actor_seed(seed: int, round_index: int, actor: int) -> int:
    return int(np.random.SeedSequence([seed, round_index, actor]).generate_state(1)[0])


def scaler_spec(spec: TrainingSpec) -> common_pb2.ScalerSpec:
    sc = spec.scaler
    return common_pb2.ScalerSpec(policy=sc.policy, i_min=sc.i_min, i_max=sc.i_max, fixed_actors=sc.fixed_actors,
                                 decay=sc.decay, window=sc.window, period=sc.period)


class OnPolicyLoop:
    def __init__(self, job: Job, deps: LearnerDeps):
        self.job, self.deps, self.spec = job, deps, job.spec
        self.cfg = algo_config(self.spec)
        obs_space, act_space = env_spaces(self.spec.env_id)
        self.model_spec = spec_for_spaces(obs_space, act_space, hidden_sizes=self.cfg.hidden_sizes,
                                          activation=self.cfg.activation, obs_norm=self.cfg.obs_norm,
                                          init_log_std=self.cfg.init_log_std)
        self.learner = PPOLearner(self.model_spec, self.cfg, seed=self.spec.seed)
        self.policies = PolicyStore(deps.redis, self.job.job_id, ttl_s=SAMPLE_TTL_S)
        self.reader = TrajectoryReader(deps.redis, self.job.job_id, deps.hmac_key, consumer=f"learner-{job.job_id}")
        self.version = 0
        self.total_steps = 0
        self.recent_returns: list[float] = []
        self.last_plan_time = time.monotonic()
        self.rng = np.random.default_rng(self.spec.seed)
        self.pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix=f"{job.job_id}-io")

    # -- helpers -----------------------------------------------------------------------
    def _publish(self) -> None:
        self.policies.put(self.version, policy_to_blob(self.learner.policy, self.version, self.deps.hmac_key))

    def _plan(self, round_index: int, score: float, gns: float) -> scaler_pb2.PlanResponse:
        now = time.monotonic()
        learner_seconds, self.last_plan_time = now - self.last_plan_time, now
        return self.deps.scaler.Plan(scaler_pb2.PlanRequest(
            job_id=self.job.job_id, round=round_index, score=score, scaler=scaler_spec(self.spec),
            budget_usd=self.spec.budget_usd, steps_per_actor=self.spec.steps_per_actor,
            actor_memory_mb=self.spec.actor_memory_mb, learner_seconds=learner_seconds,
            gradient_noise_scale=gns), timeout=DEADLINES["Plan"])

    def _launch(self, round_index: int, actors: int) -> scaler_pb2.LaunchResponse:
        return self.deps.scaler.Launch(scaler_pb2.LaunchRequest(
            job_id=self.job.job_id, round=round_index, policy_version=self.version, actors=actors,
            steps_per_actor=self.spec.steps_per_actor, env_id=self.spec.env_id,
            seed=actor_seed(self.spec.seed, round_index, 0), function_name=self.spec.function_name,
            deadline_s=self.spec.round_deadline_s, actor_memory_mb=self.spec.actor_memory_mb, wait=True),
            timeout=self.spec.round_deadline_s + 30.0)

    def _collect(self, round_index: int, actors: int, phases: dict, notes: list[str]):
        """Launch the round's actors and ingest their batches until complete or the deadline."""
        expected = {invocation_id(self.job.job_id, round_index, i) for i in range(actors)}
        t0 = time.perf_counter()
        launch: Future = self.pool.submit(self._launch, round_index, actors)
        deadline = t0 + self.spec.round_deadline_s
        batches: dict[str, dict] = {}
        processed_before = self.reader.processing_seconds
        ack_seconds = 0.0
        launch_resp = None
        failed: set[str] = set()
        while time.perf_counter() < deadline and not self.job.stop_requested.is_set():
            if launch_resp is None and launch.done():
                try:
                    launch_resp = launch.result()
                    failed = {r.invocation_id for r in launch_resp.invocations if not r.ok}
                except grpc.RpcError as exc:
                    notes.append(f"launch failed: {exc.code().name}: {exc.details()}")
                    launch_resp = scaler_pb2.LaunchResponse()
                    failed = expected - set(batches)
            if expected <= set(batches) | failed and launch_resp is not None:
                break
            entries = self.reader.read(count=64, block_ms=100)
            if not entries:
                continue
            keep = []
            for e in entries:
                if e.invocation_id in expected and e.policy_version == self.version:
                    keep.append(e)
                else:  # a straggler from an earlier round or version: on-policy data only
                    notes.append(f"dropped stale batch {e.invocation_id} (policy v{e.policy_version})")
            for e in keep:
                batches[e.invocation_id] = e.batch
            t_ack = time.perf_counter()
            self.reader.ack(entries)  # acked once buffered: a learner crash before this redelivers them
            ack_seconds += time.perf_counter() - t_ack
        wall = time.perf_counter() - t0
        ingest = self.reader.processing_seconds - processed_before + ack_seconds
        if launch_resp is None:
            notes.append(f"round deadline ({self.spec.round_deadline_s:g} s) passed with "
                         f"{len(batches)}/{actors} batches")
            launch_resp = scaler_pb2.LaunchResponse(launched=actors)
        invoke = min(launch_resp.dispatch_seconds, max(0.0, wall - ingest))
        metrics.observe_phase("invoke", invoke, phases)
        metrics.observe_phase("ingest", ingest, phases)
        metrics.observe_phase("sample", max(0.0, wall - ingest - invoke), phases)
        for r in launch_resp.invocations:
            if not r.ok:
                notes.append(f"actor {r.invocation_id} failed: {r.error_type}: {r.error_message[:200]}")
        return [batches[k] for k in sorted(batches)], launch_resp

    def _write_sample_subset(self, round_index: int) -> str:
        data = self.learner.last_data
        n = len(data["logp"])
        idx = np.sort(self.rng.choice(n, size=min(n, DETECTOR_SUBSET), replace=False))
        subset = {k: np.ascontiguousarray(data[k][idx]) for k in ("obs", "actions", "logp", "advantages")}
        key = sample_key(self.job.job_id, round_index)
        self.deps.redis.set(key, codec.encode(subset, self.deps.hmac_key), ex=SAMPLE_TTL_S)
        return key

    def _score(self, round_index: int, ref: str) -> detector_pb2.ScoreResponse:
        sc = self.spec.scaler
        return self.deps.detector.Score(detector_pb2.ScoreRequest(
            job_id=self.job.job_id, round=round_index, policy_version=self.version, sample_ref=ref,
            algo=self.spec.algo, clip=self.cfg.clip, window=sc.window, decay=sc.decay,
            seed=actor_seed(self.spec.seed, round_index, 1) % (2**62),
            normalize_advantages=self.cfg.normalize_advantages), timeout=DEADLINES["Score"])

    def _evaluate(self, round_index: int) -> float:
        if self.spec.eval_episodes <= 0:
            return float("nan")
        runner = PolicyRunner(self.model_spec, self.learner.policy.numpy_state(), self.version)
        return float(np.mean(evaluate(runner, self.spec.env_id, self.spec.eval_episodes,
                                      seed=actor_seed(self.spec.seed, round_index, 2) % (2**31))))

    def _checkpoint(self, round_index: int) -> None:
        import os

        path = os.path.join(self.deps.data_dir, "jobs", self.job.job_id, "checkpoint.pt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        torch.save({"format": 1, "round": round_index, "version": self.version, "env_steps": self.total_steps,
                    "spec": self.spec.to_dict(), "model_spec": self.model_spec.to_dict(),
                    "learner": self.learner.state()}, tmp)
        os.replace(tmp, path)  # atomic: a crash mid-write leaves the previous checkpoint intact
        self.job.checkpoint_path = path

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> None:
        job, spec = self.job, self.spec
        job.set_state(training_pb2.JOB_STATE_RUNNING)
        self._publish()
        plan = self._plan(0, 0.0, 0.0)
        empty_rounds = 0
        end_message = f"completed {spec.rounds} rounds"
        end_state = training_pb2.JOB_STATE_SUCCEEDED
        try:
            for k in range(spec.rounds):
                if plan.budget_exhausted:
                    end_message, end_state = f"budget exhausted: {plan.reason}", training_pb2.JOB_STATE_SUCCEEDED
                    break
                if job.stop_requested.is_set():
                    end_message, end_state = f"stopped: {job.stop_reason}", training_pb2.JOB_STATE_STOPPED
                    break
                metrics.CURRENT_ROUND.labels(job.job_id).set(k)
                report, plan = self._round(k, plan)
                if report is None:
                    if job.stop_requested.is_set():
                        continue  # the check at the top of the loop ends the job
                    empty_rounds += 1
                    if empty_rounds >= MAX_EMPTY_ROUNDS:
                        end_message, end_state = (f"no samples arrived in {MAX_EMPTY_ROUNDS} consecutive rounds",
                                                  training_pb2.JOB_STATE_FAILED)
                        break
                    continue
                empty_rounds = 0
                job.add_report(report)
                if spec.target_return and report.eval_return >= spec.target_return:
                    end_message = f"target return {spec.target_return:g} reached"
                    break
            else:
                if job.stop_requested.is_set() and len(job.reports) < spec.rounds:
                    end_message, end_state = f"stopped: {job.stop_reason}", training_pb2.JOB_STATE_STOPPED
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)
        job.set_state(end_state, end_message)

    def _round(self, k: int, plan: scaler_pb2.PlanResponse):
        job, spec = self.job, self.spec
        phases: dict[str, float] = {}
        notes: list[str] = []
        t_round = time.perf_counter()
        actors = plan.actors
        metrics.ACTORS_PER_ROUND.labels(job.job_id).set(actors)
        batches, launch = self._collect(k, actors, phases, notes)
        if job.stop_requested.is_set() and len(batches) < actors:
            return None, plan  # the loop sees the stop request and ends the job
        expected_steps = actors * spec.steps_per_actor
        steps = sum(len(b["rewards"]) for b in batches)
        if steps == 0 or steps < spec.min_sample_fraction * expected_steps:
            log.warning("job %s round %d: only %d/%d steps arrived", job.job_id, k, steps, expected_steps)
            if steps == 0:
                return None, self._plan(k, 0.0, 0.0)
            notes.append(f"proceeding with {steps}/{expected_steps} steps")
        behaviour_version = self.version
        for b in batches:
            self.recent_returns.extend(b["episode_returns"])
        self.recent_returns = self.recent_returns[-20:]

        with metrics.timed("update", phases):
            stats = self.learner.update(batches)
            self.learner.policy.update_obs_stats(np.concatenate([b["obs"] for b in batches]))
        self.total_steps += steps
        metrics.ENV_STEPS.inc(steps)
        with metrics.timed("publish", phases):
            self.version += 1
            self._publish()
            ref = self._write_sample_subset(k)
            # The detector scores and the checkpoint is written while the learner evaluates.
            score_future = self.pool.submit(self._score, k, ref)
            checkpoint_future = self.pool.submit(self._checkpoint, k)
        with metrics.timed("evaluate", phases):
            eval_return = self._evaluate(k)
        with metrics.timed("publish", phases):
            checkpoint_future.result()  # a round is reported only once it can be resumed from
        score_resp = detector_pb2.ScoreResponse()
        with metrics.timed("detect", phases):
            try:
                score_resp = score_future.result(timeout=DEADLINES["Score"])
            except (grpc.RpcError, TimeoutError) as exc:
                detail = exc.details() if isinstance(exc, grpc.RpcError) else "timed out"
                notes.append(f"detector unavailable ({detail}); planned with score 0")
        with metrics.timed("plan", phases):
            next_plan = self._plan(k + 1, score_resp.score, stats.gradient_noise_scale)
        cost = self.deps.scaler.GetCost(scaler_pb2.GetCostRequest(job_id=job.job_id), timeout=DEADLINES["GetCost"])
        prev_total = job.reports[-1].total_cost_usd if job.reports else 0.0
        round_seconds = time.perf_counter() - t_round
        metrics.ROUND_SECONDS.observe(round_seconds)
        metrics.EVAL_RETURN.labels(job.job_id).set(eval_return)
        metrics.BOOSTING_SCORE.labels(job.job_id).set(score_resp.score)
        metrics.CONVEXITY_RATIO.labels(job.job_id).set(score_resp.convexity_ratio)
        metrics.BUDGET_LEFT_USD.labels(job.job_id).set(cost.budget_left_usd)
        report = training_pb2.RoundReport(
            job_id=job.job_id, round=k, policy_version=behaviour_version, actors_launched=actors,
            actors_completed=len(batches), actors_failed=launch.failed, env_steps=steps,
            total_env_steps=self.total_steps,
            train_return=float(np.mean(self.recent_returns)) if self.recent_returns else float("nan"),
            eval_return=eval_return, lambda_max=score_resp.lambda_max, lambda_min=score_resp.lambda_min,
            convexity_ratio=score_resp.convexity_ratio, score=score_resp.score,
            round_cost_usd=max(0.0, cost.total_cost_usd - prev_total), total_cost_usd=cost.total_cost_usd,
            serverful_cost_usd=cost.serverful_cost_usd, budget_left_usd=cost.budget_left_usd,
            phases=[common_pb2.PhaseLatency(phase=p, seconds=s) for p, s in phases.items()],
            round_seconds=round_seconds, next_actors=next_plan.actors, scaler_reason=next_plan.reason,
            policy_loss=stats.policy_loss, value_loss=stats.value_loss, entropy=stats.entropy, kl=stats.kl,
            invocation_retries=launch.retries, notes=notes[:50], detector_seconds=score_resp.seconds,
            gradient_noise_scale=stats.gradient_noise_scale)
        log.info("job %s round %d: actors %d steps %d eval %.1f score %.3f cost $%.4f (%.2fs)", job.job_id, k,
                 actors, steps, eval_return if not math.isnan(eval_return) else -1, score_resp.score,
                 cost.total_cost_usd, round_seconds)
        return report, next_plan
