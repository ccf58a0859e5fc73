"""The scaler and the detector as the round loops call them: requests built from the job's spec, deadlines,
retries, the errors that end a job, and the invocation ids and wave records of actor launches."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import numpy as np
import redis

from learner_svc.constants import COST_PATIENCE_S, LAUNCH_TIMEOUT_SLACK_S, WAVE_RECORD_TTL_S
from learner_svc.resilience import RPC_RETRYABLE, DependencyUnavailable, JobAborted, redis_call, rpc_call
from nitro import launches
from nitro.contracts import eval_episodes_per_function, launch_owner_key, launches_key, waves_key
from nitro.policy.envs import episode_step_limit
from nitro.rpc.grpc_util import DEADLINES
from nitro.seeds import derived_seed
from nitro.spec import TrainingSpec, env_kwargs_to_wire, scaler_to_proto
from nitro.v1 import common_pb2, detector_pb2, scaler_pb2

log = logging.getLogger(__name__)


@dataclass
class LearnerDeps:
    redis: redis.Redis
    hmac_key: bytes
    detector: object  # BoostingDetectorStub
    scaler: object  # ActorScalerStub
    data_dir: str
    call_metadata: tuple = ()  # e.g. the bearer token for detector/scaler calls
    device: str = "cpu"  # torch device of the learner's model and updates (nitro.devices.resolve_device)


@dataclass
class LastRound:
    """What a learned scheduler reads of the round just finished; times on the cloud clock."""

    loss: float = 0.0
    kl: float = 0.0
    eval_return: float = 0.0
    update_seconds: float = 0.0
    actor_seconds: float = 0.0
    round_seconds: float = 0.0
    env_steps: int = 0  # samples the round trained on (the "noise" scaler's per-sample cost)
    policy_noise_scale: float = 0.0  # B_simple of the policy's gradient alone; 0 = unknown
    policy_grad_sq: float = 0.0  # its terms ("noise" averages them); both 0 = not measured
    policy_trace_sigma: float = 0.0


def end_job(deps: LearnerDeps, job_id: str, patience: float = COST_PATIENCE_S) -> bool:
    """Tell the scaler the job ended, so it deletes the job's functions' Redis user (EndJob); whether it did. A
    scaler that stays unavailable for `patience` is logged and left to the learner's next start."""
    try:
        rpc_call(deps.scaler.EndJob, scaler_pb2.EndJobRequest(job_id=job_id), timeout=DEADLINES["EndJob"],
                 patience=patience, what="EndJob", job_id=job_id, metadata=deps.call_metadata)
        return True
    except grpc.RpcError as exc:
        log.warning("job %s: the scaler did not delete the job's Redis user (%s: %s); the learner's next start asks "
                    "again", job_id, exc.code().name, exc.details())
        return False


def retry_note(r: scaler_pb2.InvocationResult) -> str | None:
    """The round-report note of an invocation that succeeded only after the scaler retried it, else None."""
    if not r.ok or r.attempts <= 1:
        return None
    return f"actor {r.invocation_id} succeeded on attempt {r.attempts}, {r.error_message[:200] or 'after retries'}"


def failure_note(r: scaler_pb2.InvocationResult) -> str:
    return f"actor {r.invocation_id} failed after {r.attempts} attempt(s): {r.error_type}: {r.error_message[:200]}"


def _finite(x: float) -> float:
    return float(x) if np.isfinite(x) else 0.0


def scaler_spec(spec: TrainingSpec) -> common_pb2.ScalerSpec:
    """What the scaler plans by: the validated spec's scaler settings, through the spec's one conversion."""
    return scaler_to_proto(spec.scaler)


class Services:
    """One job's calls to the scaler, the detector and the wave records in Redis."""

    def __init__(self, job_id: str, spec: TrainingSpec, cfg, deps: LearnerDeps):
        self.job_id, self.spec, self.cfg, self.deps = job_id, spec, cfg, deps
        self.last_plan_time = time.monotonic()
        self._eval_episode_steps: int | None = None  # the env's step limit, read at the first plan

    def final_evaluation(self) -> tuple[int, int]:
        """(episodes, the env's step limit) of the job's final evaluation as evaluation functions bill it, for the
        plan's reserve (nitro.cost.evaluation_reserve); (0, 0) when the learner evaluates (or nothing is)."""
        spec = self.spec
        if spec.evaluation != "functions" or spec.eval_episodes <= 0:
            return 0, 0
        if self._eval_episode_steps is None:
            self._eval_episode_steps = episode_step_limit(spec.env_id, **spec.env_kwargs)
        return spec.eval_episodes, self._eval_episode_steps

    def rpc(self, method: Callable, request, *, timeout: float, patience: float, what: str):
        return rpc_call(method, request, timeout=timeout, patience=patience, what=what, job_id=self.job_id,
                        metadata=self.deps.call_metadata)

    def redis(self, fn: Callable, what: str):
        return redis_call(fn, what, self.job_id)

    # -- the scaler -----------------------------------------------------------------------------------
    def plan(self, round_index: int, score: float, gns: float, fallback_actors: int, last: LastRound,
             cloud_seconds: float) -> scaler_pb2.PlanResponse:
        """Ask the scaler for round `round_index`'s actors; `last` describes the round just finished,
        `cloud_seconds` is its modelled cloud time (the learner server's bill on the cloud clock)."""
        spec = self.spec
        now = time.monotonic()
        learner_seconds, self.last_plan_time = now - self.last_plan_time, now
        final_eval_episodes, eval_episode_steps = self.final_evaluation()
        try:
            return self.rpc(self.deps.scaler.Plan, scaler_pb2.PlanRequest(
                job_id=self.job_id, round=round_index, score=min(max(score, 0.0), 1.0), algo=spec.algo,
                scaler=scaler_spec(spec), budget_usd=spec.budget_usd,
                steps_per_actor=spec.steps_per_actor, actor_memory_mb=spec.actor_memory_mb,
                learner_seconds=learner_seconds, gradient_noise_scale=gns, fallback_actors=fallback_actors,
                learner_loss=last.loss, eval_return=_finite(last.eval_return),
                approx_kl=last.kl, update_seconds=last.update_seconds,
                actor_seconds=last.actor_seconds, round_seconds=last.round_seconds,
                target_return=spec.target_return, rounds=spec.rounds,
                cloud_learner_seconds=max(0.0, cloud_seconds), budget_clock=spec.budget_clock,
                policy_noise_scale=_finite(last.policy_noise_scale), env_steps=max(0, int(last.env_steps)),
                policy_grad_sq=_finite(last.policy_grad_sq), policy_trace_sigma=_finite(last.policy_trace_sigma),
                final_eval_episodes=final_eval_episodes, eval_episode_steps=eval_episode_steps),
                timeout=DEADLINES["Plan"], patience=spec.round_deadline_s, what="Plan")
        except grpc.RpcError as exc:
            if exc.code() not in RPC_RETRYABLE:  # the scaler refused the plan: retrying cannot help
                raise JobAborted(f"the scaler refused to plan round {round_index}: {exc.code().name}: "
                                 f"{exc.details()}") from exc
            raise DependencyUnavailable(f"scaler unavailable for planning: {exc.code().name}: "
                                        f"{exc.details()}") from exc

    def launch(self, round_index: int, policy_version: int, slots: list[int],
               wave: int = 0) -> scaler_pb2.LaunchResponse:
        """Invoke the given actor slots with `policy_version` (wave > 0: replacements with fresh invocation ids)."""
        spec = self.spec
        req = scaler_pb2.LaunchRequest(
            job_id=self.job_id, round=round_index, policy_version=policy_version, actors=len(slots),
            steps_per_actor=spec.steps_per_actor, env_id=spec.env_id,
            seed=derived_seed(spec.seed, round_index, wave), function_name=spec.function_name,
            deadline_s=spec.round_deadline_s, actor_memory_mb=spec.actor_memory_mb, wait=True,
            slots=slots, wave=wave, reset_episodes=spec.reproducible,
            env_kwargs_json=env_kwargs_to_wire(spec.env_kwargs), envs_per_actor=spec.envs_per_actor)
        return self.launch_request(req, "Launch")

    def launch_eval(self, round_index: int, policy_version: int, seed: int) -> scaler_pb2.LaunchResponse:
        """Run round `round_index`'s evaluation episodes of `policy_version` as evaluation functions (kind "eval"):
        episode j on seed `seed + j`, spread over at most MAX_EVAL_FUNCTIONS functions."""
        spec = self.spec
        req = scaler_pb2.LaunchRequest(
            job_id=self.job_id, round=round_index, policy_version=policy_version, kind="eval", env_id=spec.env_id,
            seed=seed, function_name=spec.function_name, deadline_s=spec.round_deadline_s,
            actor_memory_mb=spec.actor_memory_mb, wait=True, env_kwargs_json=env_kwargs_to_wire(spec.env_kwargs),
            evaluation=scaler_pb2.EvalLaunch(episodes=spec.eval_episodes,
                                             episodes_per_function=eval_episodes_per_function(spec.eval_episodes)))
        return self.launch_request(req, "Launch (evaluation)")

    def launch_request(self, req: scaler_pb2.LaunchRequest, what: str) -> scaler_pb2.LaunchResponse:
        """A blocking Launch, retried while the scaler is briefly unavailable within the round deadline."""
        return self.rpc(self.deps.scaler.Launch, req, timeout=self.spec.round_deadline_s + LAUNCH_TIMEOUT_SLACK_S,
                        patience=self.spec.round_deadline_s, what=what)

    def cost(self) -> scaler_pb2.GetCostResponse:
        return self.rpc(self.deps.scaler.GetCost, scaler_pb2.GetCostRequest(job_id=self.job_id),
                        timeout=DEADLINES["GetCost"], patience=COST_PATIENCE_S, what="GetCost")

    # -- the detector ---------------------------------------------------------------------------------
    def score(self, round_index: int, policy_version: int, ref: str, algo: str = "ppo") -> detector_pb2.ScoreResponse:
        sc = self.spec.scaler
        return self.deps.detector.Score(detector_pb2.ScoreRequest(
            job_id=self.job_id, round=round_index, policy_version=policy_version, sample_ref=ref,
            algo=algo, clip=self.cfg.clip, window=sc.window, decay=sc.decay,
            seed=derived_seed(self.spec.seed, round_index, 1) % (2**62),
            normalize_advantages=getattr(self.cfg, "normalize_advantages", False)),
            timeout=self.spec.detector_timeout_s, metadata=self.deps.call_metadata or None)

    # -- wave records ----------------------------------------------------------------------------------
    def _wave_keys(self, round_index: int) -> tuple[str, str]:
        """The round's wave counter and the wall time its latest wave was launched."""
        key = waves_key(self.job_id, round_index)
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

        return int(self.redis(incr, "wave counter")) - 1

    def launched_waves(self, round_index: int) -> tuple[int, float | None]:
        """(waves launched for this round so far, wall time of the latest launch or None): what a learner
        before this one launched, when this one resumes the round."""
        key, at = self._wave_keys(round_index)
        count, t = self.redis(lambda: self.deps.redis.mget(key, at), "wave record")
        return int(count or 0), float(t) if t is not None else None

    def launch_status(self, round_index: int, slot_of: dict[str, int]) -> launches.RoundStatus:
        """Whether a live Launch still runs any of the invocations in `slot_of` (id -> slot), and the slots all of
        whose recorded invocations failed: from the scaler's invocation records (nitro.launches)."""

        def read():
            records = launches.decode_all(self.deps.redis.hgetall(launches_key(self.job_id, round_index)))
            owners = sorted(launches.running_owners({i: r for i, r in records.items() if i in slot_of}))
            pipe = self.deps.redis.pipeline(transaction=False)
            for o in owners:
                pipe.exists(launch_owner_key(self.job_id, o))
            alive = [o for o, n in zip(owners, pipe.execute() if owners else []) if n]
            return launches.round_status(records, slot_of, alive)

        return self.redis(read, "launch records")
