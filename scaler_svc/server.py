"""ActorScaler: plans actors per round within the budget, invokes them, accounts for cost.

Per-job state lives in one Redis hash (`nitro:{job}:scaler`): the scaling
policy's JSON state, the job's cost ledger (`nitro.cost.CostLedger`, counters
updated with HINCRBY / HINCRBYFLOAT: atomic across replicas), and each round's
plan so a retried Plan returns the same decision and never bills learner time
twice. The rules are pure functions elsewhere (the bills and the round's
estimate in nitro.cost, the policies and the budget guard in nitro.scaling);
the servicer validates, loads the state, calls them and stores the result.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import secrets
import threading
import time

import grpc
import redis

from nitro import cost, launches
from nitro.cmdline import REDIS_PASSWORD_INSTEAD, URLWithoutPassword
from nitro.contracts import (
    DEFAULT_ACTOR_MEMORY_MB,
    DEFAULT_I_MAX,
    FUNCTION_KINDS,
    JOB_ID_RULE,
    MAX_ENVS_PER_ACTOR,
    MIN_STEPS_PER_ENV,
    SCALER_STATE_TTL_S,
    SCALING_POLICIES,
    eval_slices,
    function_credentials,
    invocation_id,
    is_job_id,
    is_learn_key,
    launch_owner_key,
    learn_prefix,
    scaler_state_key,
)
from nitro.data import codec
from nitro.data.redis_client import connect, url_from_env, warn_if_not_persistent, with_credentials
from nitro.errors import ConfigError
from nitro.events import EVAL_KIND, MAX_EVAL_EPISODES, ActorEvent, EvalEvent, LearnerEvent
from nitro.rpc import auth, metrics
from nitro.rpc.grpc_util import REPLICA_CONNECTION_AGE_S, Service, configure_logging
from nitro.rpc.metrics import serve_metrics
from nitro.scaling.base import FALLBACK_REASON, RoundInputs
from nitro.scaling.budget import plan_within_budget
from nitro.scaling.minions import OBS_NAMES, SchedulerCheckpointError, SchedulerMismatchError, observation
from nitro.scaling.policies import fleet_actors, make_policy
from nitro.spec import MAX_ACTORS, MAX_BUDGET_USD, InvalidSpec, ScalerSettings, env_kwargs_from_wire, scaler_from_proto
from nitro.v1 import scaler_pb2, scaler_pb2_grpc
from scaler_svc.actor_users import ActorUsers
from scaler_svc.invoker import Invocation, Invoker, lambda_client
from scaler_svc.launches import LaunchConflict, LaunchRecords
from scaler_svc.leases import LaunchLeases

log = logging.getLogger("scaler_svc")


def strip_password(url: str) -> str:
    """Actors get the address only; their job's user and password come in their event's credentials."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.split('@')[-1]}" if sep else url


# The state hash's fields each handler reads (docs/architecture.md lists the hash).
COST_FIELDS = (*cost.CostLedger.field_names(), "budget_usd", "budget_clock", "fleet_actors", "i_max")


# The cost metrics' component of each kind of function (nitro_cost_usd_total{component=...}).
COST_COMPONENTS = {"actor": "actors", "learner": "learner_functions", "eval": "eval_functions"}


def launch_fields(kind: str) -> tuple[str, str]:
    """What Launch reads: the job's warm sandboxes and the init CPU fresh workers reported, for `kind`."""
    return f"warm_sandboxes:{kind}", f"init_ms:{kind}"


# What Plan reads of the job's hash: the ledger, the policy's state, and the cold-start CPU that prices the final
# evaluation's reserve.
PLAN_FIELDS = (*cost.CostLedger.field_names(), "policy_state", "rounds_planned", launch_fields("eval")[1],
               launch_fields("actor")[1])


def state_fields(fields: tuple[str, ...], values: list) -> dict:
    """{field: value} (str) for the fields of an HMGET that are set."""
    return {f: v.decode() for f, v in zip(fields, values) if v is not None}


def check_job_id(job_id: str, context) -> None:
    if not is_job_id(job_id):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"job_id: must be {JOB_ID_RULE}")


def actor_memory(memory_mb: int, context, field: str = "actor_memory_mb") -> int:
    """The request's function memory in MB (0 means DEFAULT_ACTOR_MEMORY_MB); anything else outside Lambda's limits
    is invalid."""
    if memory_mb != 0 and not 128 <= memory_mb <= 10240:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f"{field}: must be in [128, 10240] (AWS Lambda limits) or 0 for "
                      f"{DEFAULT_ACTOR_MEMORY_MB}, got {memory_mb}")
    return memory_mb or DEFAULT_ACTOR_MEMORY_MB


@dataclasses.dataclass(frozen=True)
class LaunchShape:
    """What a LaunchRequest asks for, whatever its kind, with the request's name of each field (for errors)."""

    kind: str
    count: int  # invocations
    steps: int | None  # an actor's environment steps (billed); None: a learner function's launch, which has none
    memory_mb: int  # 0: DEFAULT_ACTOR_MEMORY_MB
    payload_ref: str  # kind "learner": its parcel
    fields: tuple[str, str, str, str]  # the request's names of count, steps, memory_mb and payload_ref (for errors)


def launch_shape(request) -> LaunchShape:
    """A learner launch reads its own fields (LaunchRequest.learner); one without them (a learner of the previous
    version) the actor fields it used to borrow: actors, steps_per_actor (checked as before, never billed),
    actor_memory_mb. The fallback goes with the next version."""
    kind = request.kind or "actor"
    if kind == "eval":
        ev = request.evaluation
        slices = len(eval_slices(ev.episodes, ev.episodes_per_function)) if valid_eval(ev) else 0
        return LaunchShape(kind, len(request.slots) or slices, None, request.actor_memory_mb, "",
                           ("slots", "", "actor_memory_mb", ""))
    if kind == "learner" and request.HasField("learner"):
        ln = request.learner
        return LaunchShape(kind, len(request.slots) or 1, None, ln.memory_mb, ln.payload_ref,
                           ("slots", "", "learner.memory_mb", "learner.payload_ref"))
    return LaunchShape(kind, request.actors, request.steps_per_actor, request.actor_memory_mb, request.payload_ref,
                       ("actors", "steps_per_actor", "actor_memory_mb", "payload_ref"))


def valid_eval(ev) -> bool:
    """Whether an EvalLaunch's episodes and episodes_per_function are within their ranges."""
    return 1 <= ev.episodes <= MAX_EVAL_EPISODES and 1 <= ev.episodes_per_function <= ev.episodes


_PAYLOAD_REF_RE = re.compile(r"[A-Za-z0-9_:.#-]{1,256}")


def policy_params(sc, algo: str = "") -> tuple[str, dict]:
    """The scaling policy's name and parameters of a ScalerSpec (or its ScalerSettings), read by the spec's one
    conversion (nitro.spec.scaler_from_proto): unset fields get ScalerSettings' defaults, nitro.contracts', and
    "fixed" with no count the count of the job's algorithm `algo` (ScalerSettings.fixed_count). No default here."""
    if not isinstance(sc, ScalerSettings):
        sc = scaler_from_proto(sc)
    params = {
        "fixed": {"actors": sc.fixed_count(algo)},
        "hydrozoa": {"every": sc.period},
        "minions": {"scheduler": sc.scheduler},
        "schedule": {"decay": sc.decay},
        "replay": {"actors_by_round": sc.actors_by_round},
        "noise-replay": {"actors_by_round": sc.actors_by_round},
        "noise": {"kappa": sc.kappa},
        "noise-adascale": {"kappa": sc.kappa},
        "grow": {"f1": sc.grow_f1, "f2": sc.grow_f2},  # a set 0 is a valid fraction (grow from the start)
        "nitro-floor": {"floor_actors": sc.floor_actors, "floor_decay": sc.floor_decay},
    }
    return sc.policy, params.get(sc.policy, {})


def invocation_event(request, shape: LaunchShape, slot: int, inv_id: str, creds, redis_url: str,
                     env_kwargs: dict) -> ActorEvent | LearnerEvent | EvalEvent:
    """The event of slot `slot` of a valid LaunchRequest (nitro.events: the handlers read the same type)."""
    common = dict(job_id=request.job_id, round=request.round, policy_version=request.policy_version,
                  invocation_id=inv_id, credentials=creds, redis_url=redis_url)
    if shape.kind == "eval":
        start, episodes = eval_slices(request.evaluation.episodes, request.evaluation.episodes_per_function)[slot]
        return EvalEvent(**common, kind=EVAL_KIND, env_id=request.env_id, episodes=episodes,
                         seed=(request.seed + start) % (2**62), env_kwargs=env_kwargs)
    if shape.kind != "actor":
        return LearnerEvent(**common, payload_ref=shape.payload_ref)
    # At most one env per MIN_STEPS_PER_ENV steps: no env's trajectory segment is shorter.
    envs = min(max(request.envs_per_actor, 1), max(1, request.steps_per_actor // MIN_STEPS_PER_ENV))
    return ActorEvent(**common, env_id=request.env_id, num_steps=request.steps_per_actor,
                      seed=(request.seed + slot) % (2**62), reset_episodes=request.reset_episodes,
                      env_kwargs=env_kwargs, envs_per_actor=envs)


def policy_noise_terms(request) -> tuple[float, float] | None:
    """The last round's |G|^2 and tr(Sigma) of the policy's gradient; None when not measured (both 0 on the wire)."""
    terms = (request.policy_grad_sq, request.policy_trace_sigma)
    return terms if any(terms) else None


def decide(policy, state: dict, inputs: RoundInputs, fallback_actors: int) -> tuple[int, dict, str]:
    """The policy's (actors, new_state, reason); with fallback_actors > 0 (the learner got no boosting score
    this round), a policy that reads the score gets the fallback instead, clipped to [I_min, I_max]."""
    if fallback_actors > 0 and getattr(policy, "reads_score", False):
        desired = max(inputs.i_min, min(inputs.i_max, fallback_actors))
        return desired, state, f"{FALLBACK_REASON}: {desired} actors (no boosting score this round)"
    return policy.decide(state, inputs)


def add_charge(pipe, key: str, charge: cost.Charge) -> None:
    """Queue a charge's increments on the job's ledger hash (atomic per field, so replicas may bill at once)."""
    for field, amount in charge.amounts.items():
        if isinstance(amount, int):
            pipe.hincrby(key, field, amount)
        else:
            pipe.hincrbyfloat(key, field, amount)


def error_fields(o) -> dict:
    """An InvocationResult's error_type and error_message: why it failed, or for one that succeeded after
    retries, why the retried attempts failed (so the round report can say what happened)."""
    if o.ok and o.retried:
        etype = o.retried[-1][0]
        detail = "; ".join(f"attempt {i}: {t}: {m}" for i, (t, m) in enumerate(o.retried, 1))
        return {"error_type": etype, "error_message": f"retried after {detail}"[:1000]}
    return {"error_type": o.error_type, "error_message": o.error_message[:1000]}


def result_fields(o, *, cold: bool) -> dict:
    """An invocation's outcome as nitro.v1.InvocationResult's fields (the response's and the record's)."""
    return {"invocation_id": o.invocation_id, "ok": o.ok, **error_fields(o), "duration_ms": o.duration_ms,
            "billed_ms": o.billed_ms, "init_ms": o.init_ms, "attempts": o.attempts, "modelled_ms": o.modelled_ms,
            "modelled_init_ms": o.measured_init_ms, "modelled_cold": cold,
            **({"episode_returns": list(o.episode_returns)} if o.episode_returns else {})}


def still_running(invocation_id: str) -> dict:
    """The result of an invocation that another Launch call still ran when this one had to answer."""
    return {"invocation_id": invocation_id, "ok": False, "error_type": "Nitro.StillRunning",
            "error_message": "run by an earlier Launch call with the same ids that had not returned by this call's "
                             "deadline; not invoked or billed again"}


class ScalerServicer(scaler_pb2_grpc.ActorScalerServicer):
    def __init__(self, redis_client, invoker: Invoker, prices: cost.Prices, actor_redis_url: str,
                 leases: LaunchLeases | None = None, *, hmac_key: bytes | None = None,
                 actor_users: ActorUsers | None = None, records: LaunchRecords | None = None):
        """hmac_key: the deployment's master key, from which each invocation's signing key and its job's read key
        are derived (nitro.contracts.function_credentials); without it Launch refuses (Plan and GetCost work)."""
        self.redis, self.invoker, self.prices = redis_client, invoker, prices
        self.actor_redis_url = strip_password(actor_redis_url)  # the job's user and password go in the events
        self.hmac_key = hmac_key
        self.leases = leases or LaunchLeases(redis_client)  # tests pass short TTLs
        self.records = records or LaunchRecords(redis_client)
        self.actor_users = actor_users or ActorUsers(redis_client)
        self._in_flight = 0
        self._lock = threading.Lock()
        self._init_ms: dict[str, float] = {}  # function name -> init CPU a fresh worker last reported

    # -- state ---------------------------------------------------------------------------
    def _state(self, job_id: str, fields: tuple[str, ...]) -> dict:
        """The named fields of the job's state hash that are set. Never the whole hash: it keeps every round's
        plan, so reading it all would make each round's bookkeeping grow with the job's length."""
        return state_fields(fields, self.redis.hmget(scaler_state_key(job_id), fields))

    # -- RPCs ----------------------------------------------------------------------------
    def _check_plan(self, request, context) -> tuple[str, object, RoundInputs, str, int]:
        """(policy base name, policy, round inputs, budget clock, actor memory MB) of a valid PlanRequest."""
        try:
            sc = scaler_from_proto(request.scaler)
        except InvalidSpec as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        name, params = policy_params(sc, request.algo)
        base = name  # scaler_from_proto took any ":N" off (parse_policy)
        if base not in SCALING_POLICIES:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"scaler.policy: unknown {name!r}; allowed: {list(SCALING_POLICIES)}")
        check_job_id(request.job_id, context)
        if request.round < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"round: must be >= 0, got {request.round}")
        if not 0 < request.budget_usd <= MAX_BUDGET_USD:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"budget_usd: must be in (0, {MAX_BUDGET_USD:g}], got {request.budget_usd}")
        memory = actor_memory(request.actor_memory_mb, context)
        if not 0 <= request.learner_seconds < 1e7 or not 0.0 <= request.score <= 1.0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "learner_seconds must be in [0, 1e7) and score in [0, 1]")
        for field in ("cloud_learner_seconds", "update_seconds", "actor_seconds", "round_seconds"):
            if not 0 <= getattr(request, field) < 1e7:  # NaN fails both comparisons
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"{field}: must be in [0, 1e7), got {getattr(request, field)}")
        if request.env_steps < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"env_steps: must be >= 0, got {request.env_steps}")
        if not 0 <= request.final_eval_episodes <= MAX_EVAL_EPISODES:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"final_eval_episodes: must be in [0, {MAX_EVAL_EPISODES}], "
                                                            f"got {request.final_eval_episodes}")
        if request.eval_episode_steps < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"eval_episode_steps: must be >= 0, got {request.eval_episode_steps}")
        clock = request.budget_clock or "cloud"
        if clock not in cost.CLOCKS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"budget_clock: unknown {request.budget_clock!r}; allowed: {list(cost.CLOCKS)}")
        try:
            policy = make_policy(name, params)
            inputs = RoundInputs(round_index=request.round, score=request.score, i_min=sc.i_min, i_max=sc.i_max,
                                 noise_scale=request.gradient_noise_scale or None,
                                 policy_noise_terms=policy_noise_terms(request), rounds=request.rounds,
                                 learner_loss=request.learner_loss, eval_return=request.eval_return,
                                 approx_kl=request.approx_kl, update_seconds=request.update_seconds,
                                 actor_seconds=request.actor_seconds, round_seconds=request.round_seconds,
                                 target_return=request.target_return, budget_usd=request.budget_usd,
                                 steps_per_actor=max(request.steps_per_actor, 0))
            if hasattr(policy, "check"):  # before anything is billed: a mismatched scheduler plans nothing
                policy.check(inputs)
        except SchedulerMismatchError as exc:  # a valid checkpoint trained for another I_max / format
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except SchedulerCheckpointError as exc:  # missing or corrupt checkpoint
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except ConfigError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"scaler: {exc}")
        return base, policy, inputs, clock, memory

    def Plan(self, request, context):
        base, policy, inputs, clock, memory = self._check_plan(request, context)
        key = scaler_state_key(request.job_id)
        cached = self.redis.hget(key, f"plan:{request.round}")
        if cached:  # a retried Plan: same answer, learner time not billed again
            return scaler_pb2.PlanResponse(**json.loads(cached))

        learner = cost.learner_charge(request.learner_seconds, request.cloud_learner_seconds, self.prices)
        pipe = self.redis.pipeline(transaction=True)
        add_charge(pipe, key, learner)
        pipe.hset(key, mapping={"fleet_actors": fleet_actors(policy, inputs.i_max), "budget_usd": request.budget_usd,
                                "budget_clock": clock})
        pipe.hmget(key, PLAN_FIELDS)  # the ledger with this charge, in the same transaction
        st = state_fields(PLAN_FIELDS, pipe.execute()[-1])
        metrics.inc_job(metrics.COST_USD, request.job_id, learner.usd, "learner")
        metrics.inc_job(metrics.CLOUD_COST_USD, request.job_id, learner.cloud_usd, "learner")

        ledger = cost.CostLedger.from_fields(st)
        estimate = self._estimate(ledger, clock, st, request, memory)
        # What a round and a sample cost on the cloud clock, whatever the budget's clock ("noise" plans by them).
        per_actor = (estimate if clock == "cloud" else self._estimate(ledger, "cloud", st, request, memory)).per_actor_usd
        a, c = cost.round_and_sample_costs(per_actor, request.round_seconds, request.update_seconds,
                                           request.env_steps, request.steps_per_actor, self.prices)
        inputs = dataclasses.replace(inputs, budget_left_usd=ledger.budget_left(request.budget_usd, clock),
                                     round_cost_usd=a, sample_cost_usd=c)
        desired, new_state, reason = decide(policy, json.loads(st.get("policy_state", "{}")), inputs,
                                            request.fallback_actors)
        if base == "minions":
            metrics.set_job(metrics.SCHEDULER_ACTORS, request.job_id, desired)
            for input_name, value in zip(OBS_NAMES, observation(inputs)):
                metrics.set_job(metrics.SCHEDULER_INPUT, request.job_id, float(value), input_name)
        # The round must leave the job's final evaluation paid for (cost.evaluation_reserve).
        actors, exhausted, budget_reason = plan_within_budget(desired, inputs.i_min, estimate.per_actor_usd,
                                                              estimate.fixed_usd + estimate.reserve_usd,
                                                              inputs.budget_left_usd)
        if budget_reason:
            reason = f"{reason}; {budget_reason}"
            if estimate.reserve_usd > 0 and budget_reason not in ("within budget", "no budget limit"):
                reason += f" (keeping {estimate.reserve_usd:.6f} USD for the final evaluation)"
        plan = {"actors": int(actors), "reason": reason, "budget_exhausted": bool(exhausted),
                "estimated_round_cost_usd": estimate.cost_usd(actors), "budget_left_usd": inputs.budget_left_usd,
                "eval_reserve_usd": estimate.reserve_usd}
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, mapping={"policy_state": json.dumps(new_state), f"plan:{request.round}": json.dumps(plan)})
        pipe.hincrby(key, "rounds_planned", 1)
        pipe.expire(key, SCALER_STATE_TTL_S)
        pipe.execute()
        metrics.set_job(metrics.BUDGET_LEFT_USD, request.job_id, inputs.budget_left_usd)
        metrics.set_job(metrics.BUDGET_USD, request.job_id, request.budget_usd)
        metrics.forget_idle_jobs()
        return scaler_pb2.PlanResponse(**plan)

    def _estimate(self, ledger: cost.CostLedger, clock: str, st: dict, request, memory: int) -> cost.RoundEstimate:
        return cost.estimate_round(
            ledger, clock, rounds_planned=int(st.get("rounds_planned", 0)),
            last_learner_seconds=request.cloud_learner_seconds if clock == "cloud" else request.learner_seconds,
            steps_per_actor=request.steps_per_actor, memory_mb=memory, prices=self.prices,
            final_eval_episodes=request.final_eval_episodes, eval_episode_steps=request.eval_episode_steps,
            eval_init_ms=self._eval_init_ms(st))

    def _eval_init_ms(self, st: dict) -> float:
        """An evaluation function's cold start as the cloud clock bills it: what a fresh evaluation worker of the
        job reported, else a fresh actor worker, else the configured lambda_init_ms (Launch's rule)."""
        for kind in ("eval", "actor"):
            if st.get(launch_fields(kind)[1]):
                return float(st[launch_fields(kind)[1]])
        return self.prices.lambda_init_ms

    def Launch(self, request, context):
        check_job_id(request.job_id, context)
        if request.round < 0 or request.policy_version < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "round and policy_version: must be >= 0")
        shape = launch_shape(request)
        if shape.kind == "eval" and not valid_eval(request.evaluation):
            ev = request.evaluation
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"evaluation: kind 'eval' needs episodes in [1, {MAX_EVAL_EPISODES}] and "
                          f"episodes_per_function in [1, episodes], got {ev.episodes} and {ev.episodes_per_function}")
        n_field, steps_field, memory_field, ref_field = shape.fields
        memory = actor_memory(shape.memory_mb, context, memory_field)
        if not 1 <= shape.count <= MAX_ACTORS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{n_field}: must be in [1, {MAX_ACTORS}], got {shape.count}")
        if shape.steps is not None and not 1 <= shape.steps <= 1_000_000:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{steps_field}: must be in [1, 1000000], got {shape.steps}")
        if not 0 <= request.envs_per_actor <= MAX_ENVS_PER_ACTOR:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"envs_per_actor: must be in [1, {MAX_ENVS_PER_ACTOR}] "
                          f"(0: 1), got {request.envs_per_actor}")
        kind = shape.kind
        if kind not in FUNCTION_KINDS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"kind: unknown {request.kind!r}; allowed: {list(FUNCTION_KINDS)}")
        if not request.function_name or (kind in ("actor", "eval") and not request.env_id):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "env_id and function_name are required")
        if kind == "learner" and not (_PAYLOAD_REF_RE.fullmatch(shape.payload_ref)
                                      and is_learn_key(request.job_id, shape.payload_ref)):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{ref_field}: kind 'learner' needs a key '{learn_prefix(request.job_id)}...' of at most "
                          "256 letters, digits and '_:.#-'")
        if not 0 < request.deadline_s <= 3600:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "deadline_s: must be in (0, 3600]")
        try:
            env_kwargs = env_kwargs_from_wire(request.env_kwargs_json)
        except InvalidSpec as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"env_kwargs_json: {exc.detail}")
        slots = list(request.slots) or list(range(shape.count))
        if len(slots) != shape.count or len(set(slots)) != len(slots) or min(slots) < 0 or request.wave < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "slots: must be distinct non-negative integers, as many as actors; wave must be >= 0")
        if kind == "eval" and max(slots) >= len(eval_slices(request.evaluation.episodes,
                                                            request.evaluation.episodes_per_function)):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "slots: an evaluation's slots are 0 .. "
                          "ceil(episodes / episodes_per_function) - 1")
        if self.hmac_key is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "the scaler has no master key (NITRO_HMAC_KEY): it cannot give invocations their keys")
        # The job's own Redis user, created at its first launch; each invocation gets its password and keys.
        try:
            password = self.actor_users.ensure(request.job_id)
        except redis.exceptions.NoPermissionError:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "the scaler's Redis user may not create the job's Redis user (ACL SETUSER): run the scaler "
                          "as nitro-scaler (docs/security.md, Redis)")
        invocations = []
        for i in slots:
            inv_id = invocation_id(request.job_id, request.round, i, kind=kind, wave=request.wave)
            creds = function_credentials(self.hmac_key, request.job_id, inv_id, password)
            event = invocation_event(request, shape, i, inv_id, creds, self.actor_redis_url, env_kwargs)
            invocations.append(Invocation(inv_id, event.to_dict()))
        key = scaler_state_key(request.job_id)
        usd_total = cloud_usd_total = 0.0
        actors = kind == "actor"
        # Cloud clock: which invocations would start cold on AWS (beyond the sandboxes the job's earlier
        # launches left warm), and their init CPU (measured by fresh workers, remembered per job).
        warm_field, init_field = launch_fields(kind)
        st = self._state(request.job_id, (warm_field, init_field))
        warm = int(st.get(warm_field, 0))
        init_ms = float(st.get(init_field) or self._init_ms.get(request.function_name)
                        or self.prices.lambda_init_ms)
        cloud: dict[str, float] = {}  # invocation id -> modelled seconds
        results: dict[str, dict] = {}  # invocation id -> its InvocationResult's fields
        # What each invocation runs: a retried Launch must ask for the same (nitro.launches).
        fingerprint = launches.fingerprint({f.name: v for f, v in request.ListFields()
                                            if f.name not in ("deadline_s", "wait", "slots", "actors")})
        owner = secrets.token_hex(8)
        cold_ids: set[str] = set()

        def account(o):
            nonlocal usd_total, cloud_usd_total
            charge = cost.invocation_charge(
                kind, requests=o.requests, billed_ms=o.billed_attempts_ms, modelled_ms=o.modelled_attempts_ms,
                cpu_ms=o.modelled_cpu_attempts_ms,
                init_ms=o.measured_init_ms or init_ms, cold=o.invocation_id in cold_ids,
                steps=(shape.steps or 0) if o.ok else 0, memory_mb=memory, prices=self.prices)
            cloud[o.invocation_id] = charge.cloud_seconds
            usd_total += charge.usd
            cloud_usd_total += charge.cloud_usd
            results[o.invocation_id] = result_fields(o, cold=o.invocation_id in cold_ids)
            pipe = self.redis.pipeline(transaction=False)
            add_charge(pipe, key, charge)
            self.records.finished(pipe, request.job_id, request.round, o.invocation_id, launches.InvocationRecord(
                launches.DONE, fingerprint, owner, results[o.invocation_id], usd=charge.usd,
                cloud_usd=charge.cloud_usd, cloud_seconds=charge.cloud_seconds))
            if o.measured_init_ms > 0:
                pipe.hset(key, init_field, o.measured_init_ms)
                self._init_ms[request.function_name] = o.measured_init_ms
            pipe.expire(key, SCALER_STATE_TTL_S)
            pipe.execute()
            component = COST_COMPONENTS[kind]
            metrics.inc_job(metrics.COST_USD, request.job_id, charge.usd, component)
            metrics.inc_job(metrics.CLOUD_COST_USD, request.job_id, charge.cloud_usd, component)
            {"actor": metrics.INVOCATIONS, "learner": metrics.LEARNER_INVOCATIONS,
             "eval": metrics.EVAL_INVOCATIONS}[kind].inc(o.requests)
            if o.attempts > 1:
                metrics.INVOCATION_RETRIES.inc(o.attempts - 1)
            if not o.ok:
                metrics.INVOCATION_FAILURES.labels(o.error_type or "unknown").inc()
            if actors:
                with self._lock:
                    self._in_flight -= 1
                    metrics.ACTORS_IN_FLIGHT.set(self._in_flight)

        t0 = time.perf_counter()
        # The lease of this call is held before its invocations are claimed: a running record always has a live
        # owner until the owner dies, and the owner writes every outcome before it lets go.
        with (metrics.SCALER_LAUNCH_SECONDS.labels(kind).time(),
              self.leases.hold(launch_owner_key(request.job_id, owner)), self.actor_users.hold(request.job_id)):
            try:
                mine, recorded = self.records.claim(request.job_id, request.round,
                                                    [inv.invocation_id for inv in invocations], fingerprint, owner)
            except LaunchConflict as exc:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"slots/wave: {exc}")
            claimed = set(mine)
            new = [inv for inv in invocations if inv.invocation_id in claimed]
            cold_ids = {inv.invocation_id for inv in new[:cost.cold_invocations(len(new), warm)]}
            if actors:
                with self._lock:
                    self._in_flight += len(new)
                    metrics.ACTORS_IN_FLIGHT.set(self._in_flight)
            outcomes, dispatch = self.invoker.invoke_all(request.function_name, new, request.deadline_s,
                                                          on_done=account)
            # A retried Launch: what an earlier call with the same ids ran, once it is done (or lost).
            remaining = context.time_remaining()  # None: the caller set no deadline
            wait_s = request.deadline_s if remaining is None else min(request.deadline_s, remaining - 1.0)
            recorded = self.records.wait(request.job_id, request.round, recorded,
                                         until=time.monotonic() + max(0.0, wait_s))
        if recorded:
            log.info("Launch of job %s round %d: %d of %d invocation(s) answered from the record of an earlier call "
                     "(not invoked or billed again)", request.job_id, request.round, len(recorded), len(invocations))
        for inv_id, r in recorded.items():
            results[inv_id] = r.result if r.done else still_running(inv_id)
            cloud[inv_id] = r.cloud_seconds
            usd_total += r.usd
            cloud_usd_total += r.cloud_usd
        if new:  # only invocations that ran leave a sandbox behind (a throttled or refused one never started)
            self.redis.hset(key, warm_field, max(warm, sum(o.requests > 0 for o in outcomes)))
        ordered = [scaler_pb2.InvocationResult(**results[inv.invocation_id]) for inv in invocations]
        return scaler_pb2.LaunchResponse(
            launched=len(invocations), succeeded=sum(r.ok for r in ordered),
            failed=sum(not r.ok for r in ordered), cost_usd=usd_total, seconds=time.perf_counter() - t0,
            retries=sum(max(0, r.attempts - 1) for r in ordered), dispatch_seconds=dispatch,
            cloud_seconds=max(cloud.values(), default=0.0), cloud_cost_usd=cloud_usd_total,
            invocations=ordered, recorded=len(recorded))

    def EndJob(self, request, context):
        """The job ended: delete its functions' Redis user and password (a resume's Launch makes new ones)."""
        check_job_id(request.job_id, context)
        deleted = self.actor_users.end(request.job_id)
        log.info("job %s ended: its Redis user %s", request.job_id, "deleted" if deleted else "was already gone")
        metrics.forget_job_after(request.job_id)  # its cost counters and gauges end with it, once scraped
        return scaler_pb2.EndJobResponse(user_deleted=deleted)

    def GetCost(self, request, context):
        check_job_id(request.job_id, context)
        st = self._state(request.job_id, COST_FIELDS)
        if not st:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no cost records for job {request.job_id!r}")
        budget, clock = float(st.get("budget_usd", 0.0)), st.get("budget_clock", "cloud")
        ledger = cost.CostLedger.from_fields(st)
        # The serverful comparator's fleet: sized for the job's peak ("i_max": records written before fleet_actors).
        fleet = int(st.get("fleet_actors") or st.get("i_max") or DEFAULT_I_MAX)
        machine, cloud = ledger.bill("machine", fleet, self.prices), ledger.bill("cloud", fleet, self.prices)
        return scaler_pb2.GetCostResponse(
            actor_cost_usd=machine.actor_usd, learner_cost_usd=machine.learner_usd, total_cost_usd=machine.total_usd,
            serverful_cost_usd=machine.serverful_usd, invocations=ledger.invocations, billed_ms=ledger.billed_ms,
            budget_usd=budget, budget_left_usd=ledger.budget_left(budget, clock),
            learner_function_cost_usd=machine.learner_fn_usd, eval_function_cost_usd=machine.eval_fn_usd,
            eval_function_invocations=ledger.eval_fn_invocations, cloud_eval_function_cost_usd=cloud.eval_fn_usd,
            learner_function_invocations=ledger.learner_fn_invocations,
            cloud_actor_cost_usd=cloud.actor_usd, cloud_learner_cost_usd=cloud.learner_usd,
            cloud_learner_function_cost_usd=cloud.learner_fn_usd, cloud_total_cost_usd=cloud.total_usd,
            cloud_serverful_cost_usd=cloud.serverful_usd, cloud_billed_ms=ledger.cloud_billed_ms,
            cloud_seconds=cloud.seconds, budget_clock=clock)


def sweep_actor_users(users: ActorUsers) -> threading.Thread:
    """At start, in the background (an unreachable Redis must not delay startup): delete the Redis users of jobs
    that ended (ActorUsers.sweep)."""

    def sweep() -> None:
        try:
            users.sweep()
        except Exception as exc:  # noqa: BLE001 - advice: the next start sweeps again
            log.warning("could not sweep the Redis users of ended jobs: %s", exc)

    t = threading.Thread(target=sweep, name="actor-user-sweep", daemon=True)
    t.start()
    return t


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="scaler_svc", description="nitro ActorScaler")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50053)
    p.add_argument("--metrics-host", default="127.0.0.1", help="metrics are unauthenticated: loopback by default")
    p.add_argument("--metrics-port", type=int, default=9103)
    p.add_argument("--redis-url", default=url_from_env(), action=URLWithoutPassword, instead=REDIS_PASSWORD_INSTEAD)
    p.add_argument("--lambda-endpoint", default=os.environ.get("NITRO_LAMBDA_ENDPOINT"),
                   help="Lambda invoke endpoint; omit for real AWS Lambda (region and credentials from the "
                        "usual AWS environment)")
    p.add_argument("--region", default=os.environ.get("AWS_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-2")))
    p.add_argument("--actor-redis-url", default=os.environ.get("NITRO_ACTOR_REDIS_URL"), action=URLWithoutPassword,
                   instead="leave the password out: each invocation gets its job's own Redis user and password in "
                           "its event",
                   help="Redis address as the actors see it (no user or password: each invocation gets its job's "
                        "own in its event)")
    p.add_argument("--prices", default=os.environ.get("NITRO_PRICES"), help="YAML/JSON file overriding prices")
    p.add_argument("--max-concurrency", type=int, default=256)
    p.add_argument("--log-level", default="INFO")
    auth.add_server_args(p)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    configure_logging(args.log_level)
    try:
        args.redis_url = with_credentials(args.redis_url)  # NITRO_REDIS_PASSWORD(_FILE) when the URL has none
        security = auth.server_security(args, "scaler")
        hmac_key = codec.load_hmac_key()  # the master key: invocation and read keys are derived from it
    except ConfigError as exc:
        raise SystemExit(f"scaler_svc: {exc}") from None
    prices = cost.Prices()
    if args.prices:
        import yaml

        with open(args.prices) as f:
            prices = cost.Prices.from_mapping(yaml.safe_load(f))
    client = lambda_client(args.lambda_endpoint, args.region, max_connections=args.max_concurrency,
                           read_timeout=900)
    actor_url = args.actor_redis_url or args.redis_url
    redis_client = connect(args.redis_url)
    warn_if_not_persistent(redis_client, args.redis_url, "scaler")
    servicer = ScalerServicer(redis_client, Invoker(client, max_concurrency=args.max_concurrency), prices, actor_url,
                              hmac_key=hmac_key)
    sweep_actor_users(servicer.actor_users)
    service = Service("scaler", args.host, args.port, max_workers=32, interceptors=security.interceptors,
                      server_credentials=security.credentials,
                      max_connection_age_s=REPLICA_CONNECTION_AGE_S)
    service.add("nitro.v1.ActorScaler", lambda s: scaler_pb2_grpc.add_ActorScalerServicer_to_server(servicer, s))
    serve_metrics(args.metrics_port, args.metrics_host)
    service.install_signal_handlers()
    service.start()
    service.wait()
