"""ActorScaler: plans actors per round within the budget, invokes them, accounts for cost.

Per-job state lives in one Redis hash (`nitro:{job}:scaler`): the scaling
policy's JSON state, cost counters updated with HINCRBYFLOAT (atomic across
replicas), and each round's plan so a retried Plan returns the same decision
and never bills learner time twice.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import threading
import time

import grpc

from nitro import auth, cost, metrics
from nitro.errors import ConfigError
from nitro.grpc_util import REPLICA_CONNECTION_AGE_S, Service, configure_logging
from nitro.metrics import serve_metrics
from nitro.redis_server import connect, warn_if_not_persistent, with_credentials
from nitro.scaling.base import FALLBACK_REASON, RoundInputs
from nitro.scaling.budget import plan_within_budget
from nitro.scaling.minions import OBS_NAMES, SchedulerCheckpointError, SchedulerMismatchError, observation
from nitro.scaling.policies import make_policy
from nitro.spec import JOB_ID_RE, MAX_ACTORS, MAX_BUDGET_USD, SCALER_POLICIES, InvalidSpec, env_kwargs_from_wire
from nitro.v1 import scaler_pb2, scaler_pb2_grpc
from scaler_svc.invoker import Invocation, Invoker, lambda_client

log = logging.getLogger("scaler_svc")

STATE_TTL_S = 7 * 24 * 3600
DEFAULT_MS_PER_STEP = 1.0
FIRST_ROUND_LEARNER_S = 10.0  # learner time assumed for round 0, before anything was measured
LEARNER_ROUND_MARGIN = 1.5  # first-round guess of billed actor time per env step; replaced by measurements


def strip_password(url: str) -> str:
    """Actors get the address only; their password comes from their own environment."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.split('@')[-1]}" if sep else url


def check_job_id(job_id: str, context) -> None:
    if not JOB_ID_RE.match(job_id or ""):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      "job_id: must be 1-64 characters of letters, digits, '-' or '_'")


def check_memory(memory_mb: int, context) -> None:
    if memory_mb and not 128 <= memory_mb <= 10240:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f"actor_memory_mb: must be in [128, 10240] (AWS Lambda limits) or 0 for 1024, got {memory_mb}")


LAUNCH_KINDS = ("actor", "learner")
_PAYLOAD_REF_RE = re.compile(r"[A-Za-z0-9_:.#-]{1,256}")
# Ledger fields per kind of function: learner functions (stellaris) are billed at the same Lambda
# prices as actors, in their own counters so the actors' cost per step stays theirs.
_LEDGER = {"actor": ("actor_cost_usd", "invocations", "billed_ms"),
           "learner": ("learner_fn_cost_usd", "learner_fn_invocations", "learner_fn_billed_ms")}
# The same per kind on the cloud clock (docs/cost.md): modelled billed ms and their dollars.
_CLOUD_LEDGER = {"actor": ("cloud_actor_cost_usd", "cloud_billed_ms"),
                 "learner": ("cloud_learner_fn_cost_usd", "cloud_learner_fn_billed_ms")}


def state_key(job_id: str) -> str:
    return f"nitro:{job_id}:scaler"


def policy_params(sc) -> tuple[str, dict]:
    name = sc.policy or "nitro"
    if name == "fixed":
        return name, {"actors": sc.fixed_actors or 16}
    if name == "hydrozoa":
        return name, {"every": sc.period or 10}
    if name == "minions":
        return name, {"scheduler": sc.scheduler}
    if name == "schedule":
        return name, {"decay": sc.decay or 0.96}
    if name == "replay":
        return name, {"actors_by_round": sc.actors_by_round}
    if name == "nitro-floor":
        return name, {"floor_actors": sc.floor_actors or 64, "floor_decay": sc.floor_decay or 0.96}
    return name, {}


def error_fields(o) -> dict:
    """An InvocationResult's error_type and error_message: why it failed, or for one that succeeded after
    retries, why the retried attempts failed (so the round report can say what happened)."""
    if o.ok and o.retried:
        etype = o.retried[-1][0]
        detail = "; ".join(f"attempt {i}: {t}: {m}" for i, (t, m) in enumerate(o.retried, 1))
        return {"error_type": etype, "error_message": f"retried after {detail}"[:1000]}
    return {"error_type": o.error_type, "error_message": o.error_message[:1000]}


class ScalerServicer(scaler_pb2_grpc.ActorScalerServicer):
    def __init__(self, redis_client, invoker: Invoker, prices: cost.Prices, actor_redis_url: str):
        self.redis, self.invoker, self.prices = redis_client, invoker, prices
        self.actor_redis_url = actor_redis_url
        self._in_flight = 0
        self._lock = threading.Lock()
        self._init_ms: dict[str, float] = {}  # function name -> init CPU a fresh worker last reported

    # -- state ---------------------------------------------------------------------------
    def _state(self, job_id: str) -> dict:
        raw = self.redis.hgetall(state_key(job_id))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def _ledger(self, st: dict, budget: float) -> dict:
        """Both bills of a job; "left" is the budget minus the bill its budget_clock names."""
        out = {"budget": budget, "clock": st.get("budget_clock", "cloud")}
        for prefix, wall_field in (("", "wall_seconds"), ("cloud_", "cloud_seconds")):
            actor = float(st.get(f"{prefix}actor_cost_usd", 0.0))
            learner = float(st.get(f"{prefix}learner_cost_usd", 0.0))
            learner_fn = float(st.get(f"{prefix}learner_fn_cost_usd", 0.0))
            wall = float(st.get(wall_field, 0.0))
            out.update({f"{prefix}actor": actor, f"{prefix}learner": learner, f"{prefix}learner_fn": learner_fn,
                        f"{prefix}total": actor + learner + learner_fn, f"{prefix}seconds": wall,
                        f"{prefix}serverful": cost.serverful_job_cost(wall, int(st.get("i_max", 64)), self.prices)})
        out["left"] = budget - cost.budget_spent(out["total"], out["cloud_total"], out["clock"])
        return out

    # -- RPCs ----------------------------------------------------------------------------
    def Plan(self, request, context):
        sc = request.scaler
        name, params = policy_params(sc)
        base = name.partition(":")[0]
        if base not in SCALER_POLICIES:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"scaler.policy: unknown {name!r}; allowed: {list(SCALER_POLICIES)}")
        check_job_id(request.job_id, context)
        if request.round < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"round: must be >= 0, got {request.round}")
        if not 0 < request.budget_usd <= MAX_BUDGET_USD:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"budget_usd: must be in (0, {MAX_BUDGET_USD:g}], got {request.budget_usd}")
        check_memory(request.actor_memory_mb, context)
        if not 0 <= request.learner_seconds < 1e7 or not 0.0 <= request.score <= 1.0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "learner_seconds must be in [0, 1e7) and score in [0, 1]")
        if not 0 <= request.cloud_learner_seconds < 1e7:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"cloud_learner_seconds: must be in [0, 1e7), got {request.cloud_learner_seconds}")
        clock = request.budget_clock or "cloud"
        if clock not in cost.CLOCKS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"budget_clock: unknown {request.budget_clock!r}; allowed: {list(cost.CLOCKS)}")
        try:
            policy = make_policy(name, params)
            inputs = RoundInputs(round_index=request.round, score=request.score, i_min=sc.i_min, i_max=sc.i_max,
                                 noise_scale=request.gradient_noise_scale or None, rounds=request.rounds,
                                 learner_loss=request.learner_loss, eval_return=request.eval_return,
                                 approx_kl=request.approx_kl, update_seconds=request.update_seconds,
                                 actor_seconds=request.actor_seconds, round_seconds=request.round_seconds,
                                 target_return=request.target_return, budget_usd=request.budget_usd)
            if hasattr(policy, "check"):  # before anything is billed: a mismatched scheduler plans nothing
                policy.check(inputs)
        except SchedulerMismatchError as exc:  # a valid checkpoint trained for another I_max / format
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except SchedulerCheckpointError as exc:  # missing or corrupt checkpoint
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except ConfigError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"scaler: {exc}")
        key = state_key(request.job_id)
        st = self._state(request.job_id)
        cached = st.get(f"plan:{request.round}")
        if cached:  # a retried Plan: same answer, learner time not billed again
            return scaler_pb2.PlanResponse(**json.loads(cached))

        learner_usd = cost.learner_cost(request.learner_seconds, self.prices)
        cloud_learner_usd = cost.learner_cost(request.cloud_learner_seconds, self.prices)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hincrbyfloat(key, "learner_cost_usd", learner_usd)
        pipe.hincrbyfloat(key, "wall_seconds", request.learner_seconds)
        pipe.hincrbyfloat(key, "cloud_learner_cost_usd", cloud_learner_usd)
        pipe.hincrbyfloat(key, "cloud_seconds", request.cloud_learner_seconds)
        pipe.hset(key, mapping={"i_max": sc.i_max, "budget_usd": request.budget_usd, "budget_clock": clock})
        pipe.execute()
        metrics.COST_USD.labels("learner").inc(learner_usd)
        metrics.CLOUD_COST_USD.labels("learner").inc(cloud_learner_usd)
        st = self._state(request.job_id)

        policy_state = json.loads(st.get("policy_state", "{}"))
        ledger = self._ledger(st, request.budget_usd)
        inputs = dataclasses.replace(inputs, budget_left_usd=ledger["left"])
        # Only a policy that reads the boosting score needs a fallback when the score is missing.
        if request.fallback_actors > 0 and getattr(policy, "reads_score", False):
            desired = max(sc.i_min, min(sc.i_max, request.fallback_actors))
            new_state, reason = policy_state, f"{FALLBACK_REASON}: {desired} actors (no boosting score this round)"
        else:
            desired, new_state, reason = policy.decide(policy_state, inputs)
        if base == "minions":
            metrics.set_job(metrics.SCHEDULER_ACTORS, request.job_id, desired)
            for input_name, value in zip(OBS_NAMES, observation(inputs)):
                metrics.set_job(metrics.SCHEDULER_INPUT, request.job_id, float(value), input_name)
        # Estimates on the budget's clock. Learner time per round, padded: a plan must stay
        # affordable even if the round runs long.
        cloud = clock == "cloud"
        p = "cloud_" if cloud else ""
        last_seconds = request.cloud_learner_seconds if cloud else request.learner_seconds
        rounds_seen = int(st.get("rounds_planned", 0))
        learner_per_round = (LEARNER_ROUND_MARGIN * max(ledger[f"{p}seconds"] / rounds_seen, last_seconds)
                             if rounds_seen else FIRST_ROUND_LEARNER_S)
        billed = float(st.get("cloud_billed_ms" if cloud else "billed_ms", 0))
        ms_per_step = billed / float(st.get("steps_billed", 0)) \
            if float(st.get("steps_billed", 0)) > 0 else DEFAULT_MS_PER_STEP
        memory = request.actor_memory_mb or 1024
        per_actor = cost.lambda_invocation_cost(ms_per_step * max(1, request.steps_per_actor), memory, self.prices)
        fn_calls = int(st.get("learner_fn_invocations", 0))
        if fn_calls:  # stellaris: each actor's batch also pays one learner function (measured mean)
            per_actor += ledger[f"{p}learner_fn"] / fn_calls
        fixed = cost.learner_cost(learner_per_round, self.prices)
        actors, exhausted, budget_reason = plan_within_budget(desired, sc.i_min, per_actor, fixed, ledger["left"])
        if budget_reason:
            reason = f"{reason}; {budget_reason}"
        plan = {"actors": int(actors), "reason": reason, "budget_exhausted": bool(exhausted),
                "estimated_round_cost_usd": per_actor * actors + fixed, "budget_left_usd": ledger["left"]}
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, mapping={"policy_state": json.dumps(new_state), f"plan:{request.round}": json.dumps(plan)})
        pipe.hincrby(key, "rounds_planned", 1)
        pipe.expire(key, STATE_TTL_S)
        pipe.execute()
        metrics.set_job(metrics.BUDGET_LEFT_USD, request.job_id, ledger["left"])
        metrics.forget_idle_jobs()
        return scaler_pb2.PlanResponse(**plan)

    def Launch(self, request, context):
        check_job_id(request.job_id, context)
        if request.round < 0 or request.policy_version < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "round and policy_version: must be >= 0")
        check_memory(request.actor_memory_mb, context)
        if not 1 <= request.actors <= MAX_ACTORS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"actors: must be in [1, {MAX_ACTORS}], got {request.actors}")
        if not 1 <= request.steps_per_actor <= 1_000_000:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "steps_per_actor: must be in [1, 1000000]")
        from nitro.spec import MAX_ENVS_PER_ACTOR, MIN_STEPS_PER_ENV

        if not 0 <= request.envs_per_actor <= MAX_ENVS_PER_ACTOR:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"envs_per_actor: must be in [1, {MAX_ENVS_PER_ACTOR}] "
                          f"(0: 1), got {request.envs_per_actor}")
        kind = request.kind or "actor"
        if kind not in LAUNCH_KINDS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"kind: unknown {request.kind!r}; allowed: {list(LAUNCH_KINDS)}")
        if not request.function_name or (kind == "actor" and not request.env_id):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "env_id and function_name are required")
        if kind == "learner" and not (_PAYLOAD_REF_RE.fullmatch(request.payload_ref)
                                      and request.payload_ref.startswith(f"nitro:{request.job_id}:learn:")):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"payload_ref: kind 'learner' needs a key 'nitro:{request.job_id}:learn:...' of at most 256 "
                          "letters, digits and '_:.#-'")
        if not 0 < request.deadline_s <= 3600:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "deadline_s: must be in (0, 3600]")
        try:
            env_kwargs = env_kwargs_from_wire(request.env_kwargs_json)
        except InvalidSpec as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"env_kwargs_json: {exc.detail}")
        memory = request.actor_memory_mb or 1024
        slots = list(request.slots) or list(range(request.actors))
        if len(slots) != request.actors or len(set(slots)) != len(slots) or min(slots) < 0 or request.wave < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "slots: must be distinct non-negative integers, as many as actors; wave must be >= 0")
        invocations = []
        for i in slots:
            letter = "a" if kind == "actor" else "g"
            inv_id = f"{request.job_id}-r{request.round}-{letter}{i}" + (f"-x{request.wave}" if request.wave else "")
            event = {"job_id": request.job_id, "round": request.round, "policy_version": request.policy_version,
                     "invocation_id": inv_id, "redis_url": self.actor_redis_url}
            if kind == "actor":
                event.update(env_id=request.env_id, num_steps=request.steps_per_actor, seed=(request.seed + i) % (2**62))
                if request.reset_episodes:
                    event["reset_episodes"] = True
                if env_kwargs:
                    event["env_kwargs"] = env_kwargs
                # At most one env per MIN_STEPS_PER_ENV steps: no env's trajectory segment is shorter.
                envs = min(request.envs_per_actor, max(1, request.steps_per_actor // MIN_STEPS_PER_ENV))
                if envs > 1:
                    event["envs_per_actor"] = envs
            else:
                event["payload_ref"] = request.payload_ref
            invocations.append(Invocation(inv_id, event))
        key = state_key(request.job_id)
        usd_total = cloud_usd_total = 0.0
        cost_field, calls_field, ms_field = _LEDGER[kind]
        cloud_cost_field, cloud_ms_field = _CLOUD_LEDGER[kind]
        actors = kind == "actor"
        # Cloud clock: which invocations would start cold on AWS (beyond the sandboxes the job's earlier
        # launches left warm), and their init CPU (measured by fresh workers, remembered per job).
        st = self._state(request.job_id)
        warm = int(st.get(f"warm_sandboxes:{kind}", 0))
        cold_ids = {inv.invocation_id for inv in invocations[:cost.cold_invocations(len(invocations), warm)]}
        init_ms = float(st.get(f"init_ms:{kind}") or self._init_ms.get(request.function_name)
                        or self.prices.lambda_init_ms)
        cloud: dict[str, float] = {}  # invocation id -> modelled seconds

        def account(o):
            nonlocal usd_total, cloud_usd_total
            cold = o.invocation_id in cold_ids
            (seconds, [cloud_ms]) = cost.cloud_launch(
                [(o.modelled_attempts_ms, o.measured_init_ms or init_ms, cold)], self.prices)
            cloud[o.invocation_id] = seconds
            usd = cost.lambda_cost(o.billed_attempts_ms, o.requests, memory, self.prices)
            cloud_usd = cost.lambda_cost(cloud_ms, o.requests, memory, self.prices) if o.requests else 0.0
            usd_total += usd
            cloud_usd_total += cloud_usd
            pipe = self.redis.pipeline(transaction=False)
            pipe.hincrbyfloat(key, cost_field, usd)
            pipe.hincrby(key, calls_field, o.requests)
            pipe.hincrby(key, ms_field, o.billed_attempts_ms)
            pipe.hincrbyfloat(key, cloud_cost_field, cloud_usd)
            pipe.hincrby(key, cloud_ms_field, cloud_ms if o.requests else 0)
            if o.measured_init_ms > 0:
                pipe.hset(key, f"init_ms:{kind}", o.measured_init_ms)
                self._init_ms[request.function_name] = o.measured_init_ms
            if o.ok and actors:
                pipe.hincrby(key, "steps_billed", request.steps_per_actor)
            pipe.expire(key, STATE_TTL_S)
            pipe.execute()
            metrics.COST_USD.labels("actors" if actors else "learner_functions").inc(usd)
            metrics.CLOUD_COST_USD.labels("actors" if actors else "learner_functions").inc(cloud_usd)
            (metrics.INVOCATIONS if actors else metrics.LEARNER_INVOCATIONS).inc(o.requests)
            if o.attempts > 1:
                metrics.INVOCATION_RETRIES.inc(o.attempts - 1)
            if not o.ok:
                metrics.INVOCATION_FAILURES.labels(o.error_type or "unknown").inc()
            if actors:
                with self._lock:
                    self._in_flight -= 1
                    metrics.ACTORS_IN_FLIGHT.set(self._in_flight)

        if actors:
            with self._lock:
                self._in_flight += len(invocations)
                metrics.ACTORS_IN_FLIGHT.set(self._in_flight)
        t0 = time.perf_counter()
        with metrics.timed("invoke"):
            outcomes, dispatch = self.invoker.invoke_all(request.function_name, invocations, request.deadline_s,
                                                          on_done=account)
        self.redis.hset(key, f"warm_sandboxes:{kind}", max(warm, len(invocations)))
        cloud_seconds = max(cloud.values(), default=0.0)
        return scaler_pb2.LaunchResponse(
            launched=len(invocations), succeeded=sum(o.ok for o in outcomes),
            failed=sum(not o.ok for o in outcomes), cost_usd=usd_total, seconds=time.perf_counter() - t0,
            retries=sum(o.attempts - 1 for o in outcomes), dispatch_seconds=dispatch,
            cloud_seconds=cloud_seconds, cloud_cost_usd=cloud_usd_total,
            invocations=[scaler_pb2.InvocationResult(
                invocation_id=o.invocation_id, ok=o.ok, **error_fields(o),
                duration_ms=o.duration_ms, billed_ms=o.billed_ms, init_ms=o.init_ms, attempts=o.attempts,
                modelled_ms=o.modelled_ms, modelled_init_ms=o.measured_init_ms,
                modelled_cold=o.invocation_id in cold_ids)
                for o in outcomes])

    def GetCost(self, request, context):
        check_job_id(request.job_id, context)
        st = self._state(request.job_id)
        if not st:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no cost records for job {request.job_id!r}")
        budget = float(st.get("budget_usd", 0.0))
        ledger = self._ledger(st, budget)
        return scaler_pb2.GetCostResponse(
            actor_cost_usd=ledger["actor"], learner_cost_usd=ledger["learner"], total_cost_usd=ledger["total"],
            serverful_cost_usd=ledger["serverful"], invocations=int(st.get("invocations", 0)),
            billed_ms=int(st.get("billed_ms", 0)), budget_usd=budget, budget_left_usd=ledger["left"],
            learner_function_cost_usd=ledger["learner_fn"],
            learner_function_invocations=int(st.get("learner_fn_invocations", 0)),
            cloud_actor_cost_usd=ledger["cloud_actor"], cloud_learner_cost_usd=ledger["cloud_learner"],
            cloud_learner_function_cost_usd=ledger["cloud_learner_fn"], cloud_total_cost_usd=ledger["cloud_total"],
            cloud_serverful_cost_usd=ledger["cloud_serverful"], cloud_billed_ms=int(st.get("cloud_billed_ms", 0)),
            cloud_seconds=ledger["cloud_seconds"], budget_clock=ledger["clock"])


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="scaler_svc", description="nitro ActorScaler")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50053)
    p.add_argument("--metrics-host", default="127.0.0.1", help="metrics are unauthenticated: loopback by default")
    p.add_argument("--metrics-port", type=int, default=9103)
    p.add_argument("--redis-url", default=os.environ.get("NITRO_REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--lambda-endpoint", default=os.environ.get("NITRO_LAMBDA_ENDPOINT"),
                   help="Lambda invoke endpoint; omit for real AWS Lambda (region and credentials from the "
                        "usual AWS environment)")
    p.add_argument("--region", default=os.environ.get("AWS_REGION", os.environ.get("AWS_DEFAULT_REGION", "us-east-2")))
    p.add_argument("--actor-redis-url", default=os.environ.get("NITRO_ACTOR_REDIS_URL"),
                   help="Redis address as the actors see it (no password: actors read it from their env)")
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
    except ConfigError as exc:
        raise SystemExit(f"scaler_svc: {exc}") from None
    prices = cost.Prices()
    if args.prices:
        import yaml

        with open(args.prices) as f:
            prices = cost.Prices.from_mapping(yaml.safe_load(f))
    client = lambda_client(args.lambda_endpoint, args.region, max_connections=args.max_concurrency,
                           read_timeout=900)
    actor_url = args.actor_redis_url or strip_password(args.redis_url)
    redis_client = connect(args.redis_url)
    warn_if_not_persistent(redis_client, args.redis_url, "scaler")
    servicer = ScalerServicer(redis_client, Invoker(client, max_concurrency=args.max_concurrency), prices, actor_url)
    service = Service("scaler", args.host, args.port, max_workers=32, interceptors=security.interceptors,
                      server_credentials=security.credentials,
                      max_connection_age_s=REPLICA_CONNECTION_AGE_S)
    service.add("nitro.v1.ActorScaler", lambda s: scaler_pb2_grpc.add_ActorScalerServicer_to_server(servicer, s))
    serve_metrics(args.metrics_port, args.metrics_host)
    service.install_signal_handlers()
    service.start()
    service.wait()
