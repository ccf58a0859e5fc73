"""The serverless actor: an AWS Lambda handler that samples with one policy version, or evaluates one.

An event whose "kind" is "eval" (nitro.events.EvalEvent) runs deterministic evaluation episodes of a published
version instead and answers with their returns (evaluation off the learner's critical path, docs/evaluation.md):
the same function, so it shares the actors' warm sandboxes and deployment.

Event (JSON): nitro.events.ActorEvent, its fields and their rules, read with ActorEvent.from_dict (a ConfigError
naming the field for a missing, unknown or bad one). In short: job_id, round, policy_version, invocation_id,
env_id, num_steps, seed, credentials (the job's Redis user and password, this invocation's signing key and
the job's read key: nitro.contracts.FunctionCredentials, built by the scaler; secrets, never echoed in an
error or a log line), and optionally redis_url (else NITRO_REDIS_URL; any user or password in it is replaced
by the credentials'), env_kwargs, compress, max_entry_bytes (else NITRO_MAX_ENTRY_BYTES, else 32 MiB; a bigger
batch is split into contiguous parts, nitro.data.store), reset_episodes and envs_per_actor (environments
stepped in lockstep with one batched inference per step, nitro.policy.rollout.VecSampler; Atari ids on
ALE's C++ vector env, nitro.policy.ale_vector).

The batch is signed with the invocation's own key, so it verifies only as this
invocation's batch of this job; the policy is verified with the job's read key,
which cannot write policies (the job's Redis user may only read them). The
function holds no key of its own (no NITRO_HMAC_KEY). A warm execution
environment keeps its Redis connection (per job), its environment (episodes
continue across invocations of the same job) and the last policy version; it
reloads only when the version changes. Errors are raised as typed exceptions so the
platform reports them as function errors with a clear errorType/errorMessage.
"""

from __future__ import annotations

import os
import time

import numpy as np

from actor_fn.runtime import redis_url, warm_client
from nitro.clock import InvocationClock
from nitro.data.store import DEFAULT_MAX_ENTRY_BYTES, REDIS_MAX_BULK_BYTES, PolicyStore, TrajectoryWriter
from nitro.errors import ConfigError
from nitro.events import ActorEvent, EvalEvent, is_eval_event
from nitro.policy.ale_vector import ALEVecSampler
from nitro.policy.inference import PolicyRunner
from nitro.policy.model_spec import blob_to_doc
from nitro.policy.rollout import Sampler, VecSampler, evaluate, make_sampler


class _Warm:
    """What survives between invocations in one execution environment."""

    sampler: Sampler | VecSampler | ALEVecSampler | None = None
    sampler_key: tuple | None = None
    runner: PolicyRunner | None = None
    runner_key: tuple | None = None
    invocations = 0


def _max_entry_bytes(ev: ActorEvent) -> int:
    """The event's max_entry_bytes (checked by ActorEvent), else the function's NITRO_MAX_ENTRY_BYTES, else the
    default."""
    if ev.max_entry_bytes is not None:
        return ev.max_entry_bytes
    value = os.environ.get("NITRO_MAX_ENTRY_BYTES", DEFAULT_MAX_ENTRY_BYTES)
    try:
        value = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"NITRO_MAX_ENTRY_BYTES must be an integer, got {value!r}") from None
    if not 1 <= value <= REDIS_MAX_BULK_BYTES:
        raise ConfigError(f"NITRO_MAX_ENTRY_BYTES must be in [1, {REDIS_MAX_BULK_BYTES}], got {value}")
    return value


def _runner(client, job_id: str, version: int, key: bytes, clock: InvocationClock) -> PolicyRunner:
    """Policy `version` of the job, verified with the job's read key `key` (cached while warm)."""
    rk = (job_id, version, key)
    if _Warm.runner_key != rk:
        with clock.io():
            blob = PolicyStore(client, job_id).get(version)  # raises PolicyNotFoundError naming job and version
        _Warm.runner = PolicyRunner.from_doc(blob_to_doc(blob, key))
        _Warm.runner_key = rk
    return _Warm.runner


def _sampler(job_id: str, env_id: str, env_kwargs: dict, seed: int,
             envs: int = 1) -> Sampler | VecSampler | ALEVecSampler:
    sk = (job_id, env_id, tuple(sorted(env_kwargs.items())), envs)
    if _Warm.sampler_key != sk:
        if _Warm.sampler is not None:
            _Warm.sampler.close()
        _Warm.sampler = None
        _Warm.sampler = make_sampler(env_id, seed, env_kwargs, envs)  # raises UnknownEnvironmentError
        _Warm.sampler_key = sk
    return _Warm.sampler


def _begin(event_type, event: dict):
    """An invocation's start: its clock, start time, checked event (a ConfigError naming a bad field) and whether
    this execution environment is cold."""
    clock, t0 = InvocationClock(), time.perf_counter()
    ev = event_type.from_dict(event)
    cold = _Warm.invocations == 0
    _Warm.invocations += 1
    return clock, t0, ev, cold


def _ms(start: float, end: float) -> float:
    return round((end - start) * 1e3, 3)


def _answer(ev: ActorEvent | EvalEvent, clock: InvocationClock, cold: bool, t0: float, t_end: float,
            **fields) -> dict:
    """What every function kind answers: the invocation's identity, its own fields, then its timings and the
    cloud clock's measurements (docs/cost.md)."""
    return {"ok": True, "job_id": ev.job_id, "invocation_id": ev.invocation_id, "round": ev.round,
            "policy_version": ev.policy_version, **fields, "cold": cold, "duration_ms": _ms(t0, t_end),
            "clock": clock.report(cold)}


def handler(event: dict, context=None) -> dict:
    if is_eval_event(event):
        return evaluation_handler(event, context)
    clock, t0, ev, cold = _begin(ActorEvent, event)
    creds = ev.credentials
    max_entry_bytes = _max_entry_bytes(ev)

    sampler = _sampler(ev.job_id, ev.env_id, ev.env_kwargs, ev.seed, ev.envs_per_actor)
    if ev.reset_episodes:  # reproducible runs: what this invocation samples depends on its seed only
        sampler.reseed(ev.seed)
    client = warm_client(redis_url(event, creds), clock)
    runner = _runner(client, ev.job_id, ev.policy_version, creds.read_key_bytes, clock)
    t_loaded = time.perf_counter()

    batch = sampler.sample(runner, ev.num_steps, np.random.default_rng(ev.seed))
    t_sampled = time.perf_counter()
    batch["policy_version"] = ev.policy_version
    batch["invocation_id"] = ev.invocation_id
    writer = TrajectoryWriter(client, ev.job_id, creds.signing_key_bytes, max_entry_bytes=max_entry_bytes,
                              io=clock.io)
    entry_ids = writer.append_batch(invocation_id=ev.invocation_id, round=ev.round,
                                    policy_version=ev.policy_version, batch=batch, compress=ev.compress,
                                    value_of=runner.value_batch)
    t_pushed = time.perf_counter()
    returns = batch["episode_returns"]
    return _answer(ev, clock, cold, t0, t_pushed,
                   entry_id=entry_ids[0],
                   entries=len(entry_ids),
                   steps=ev.num_steps,
                   episodes=len(returns),
                   mean_episode_return=float(np.mean(returns)) if returns else None,
                   load_ms=_ms(t0, t_loaded),
                   sample_ms=_ms(t_loaded, t_sampled),
                   push_ms=_ms(t_sampled, t_pushed))


def evaluation_handler(event: dict, context=None) -> dict:
    """Run an EvalEvent's episodes with the verified policy version (nitro.policy.rollout.evaluate: a fresh
    environment, deterministic actions, episode j on seed + j) and answer with their returns."""
    clock, t0, ev, cold = _begin(EvalEvent, event)
    creds = ev.credentials
    client = warm_client(redis_url(event, creds), clock)
    runner = _runner(client, ev.job_id, ev.policy_version, creds.read_key_bytes, clock)
    t_loaded = time.perf_counter()
    returns = evaluate(runner, ev.env_id, ev.episodes, ev.seed, env_kwargs=ev.env_kwargs)
    t_done = time.perf_counter()
    return _answer(ev, clock, cold, t0, t_done,
                   episode_returns=[float(r) for r in returns],
                   load_ms=_ms(t0, t_loaded),
                   eval_ms=_ms(t_loaded, t_done))
