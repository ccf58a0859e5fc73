"""The serverless actor: an AWS Lambda handler that samples with one policy version.

Event (JSON):
  job_id          str   job namespace in Redis
  round           int   training round this batch belongs to
  policy_version  int   version to load from nitro:{job}:policy:{version}
  env_id          str   Gymnasium id (see nitro.policy.envs)
  env_kwargs      dict  optional keyword arguments for the environment
  num_steps       int   environment steps to sample
  seed            int   seeds the action noise (and the env on a cold sampler)
  invocation_id   str   unique per logical invocation; retries reuse it (the stream drops duplicates)
  credentials     obj   redis_username, redis_password (the job's own Redis user), signing_key (this
                        invocation's, hex) and read_key (the job's, hex): nitro.contracts.FunctionCredentials,
                        built by the scaler. Secrets: never echoed in an error or a log line
  redis_url       str   optional; else NITRO_REDIS_URL. Any user or password in it is replaced by the
                        credentials' (actor_fn.runtime.redis_url)
  compress        bool  optional; zlib-compress the payload. Default: on for image (uint8) observations
                        such as Atari frames, off otherwise
  max_entry_bytes int   optional; largest stream entry; a bigger batch is split into contiguous parts
                        (default NITRO_MAX_ENTRY_BYTES, else 32 MiB; see nitro.data.store)
  reset_episodes  bool  optional; start fresh episodes from `seed` instead of continuing the warm
                        environment's episode, so the batch depends on the event only (reproducible runs)
  envs_per_actor  int   optional (default 1); environments stepped in lockstep with one batched inference
                        per step, in [1, min(256, num_steps)]; num_steps stays the total over all of them
                        (nitro.policy.rollout.VecSampler: env i's steps are one contiguous segment of the batch;
                        Atari ids on ALE's C++ vector env, nitro.policy.ale_vector)

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

from actor_fn.runtime import check_fields, credentials, redis_url, warm_client
from nitro.clock import InvocationClock
from nitro.contracts import MAX_ENVS_PER_ACTOR
from nitro.data.store import DEFAULT_MAX_ENTRY_BYTES, REDIS_MAX_BULK_BYTES, PolicyStore, TrajectoryWriter
from nitro.errors import ConfigError
from nitro.policy.ale_vector import ALEVecSampler
from nitro.policy.inference import PolicyRunner
from nitro.policy.model_spec import blob_to_doc
from nitro.policy.rollout import Sampler, VecSampler, make_sampler

REQUIRED = {"job_id": str, "round": int, "policy_version": int, "env_id": str, "num_steps": int, "seed": int,
            "invocation_id": str}
MAX_STEPS = 1_000_000


class _Warm:
    """What survives between invocations in one execution environment."""

    sampler: Sampler | VecSampler | ALEVecSampler | None = None
    sampler_key: tuple | None = None
    runner: PolicyRunner | None = None
    runner_key: tuple | None = None
    invocations = 0


def _validate(event: dict) -> None:
    check_fields(event, REQUIRED)
    if not isinstance(event.get("reset_episodes", False), bool):
        raise ConfigError("event field 'reset_episodes' must be true or false")
    if not 1 <= event["num_steps"] <= MAX_STEPS:
        raise ConfigError(f"event field 'num_steps' must be in [1, {MAX_STEPS}], got {event['num_steps']}")
    envs = event.get("envs_per_actor", 1)
    top = min(MAX_ENVS_PER_ACTOR, event["num_steps"])
    if isinstance(envs, bool) or not isinstance(envs, int) or not 1 <= envs <= top:
        raise ConfigError(f"event field 'envs_per_actor' must be an integer in [1, {top}] "
                          f"(at most {MAX_ENVS_PER_ACTOR} and at most num_steps), got {envs!r}")


def _max_entry_bytes(event: dict) -> int:
    value = event.get("max_entry_bytes", os.environ.get("NITRO_MAX_ENTRY_BYTES", DEFAULT_MAX_ENTRY_BYTES))
    try:
        value = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"max_entry_bytes must be an integer, got {value!r}") from None
    if not 1 <= value <= REDIS_MAX_BULK_BYTES:
        raise ConfigError(f"max_entry_bytes must be in [1, {REDIS_MAX_BULK_BYTES}], got {value}")
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


def handler(event: dict, context=None) -> dict:
    clock = InvocationClock()
    t0 = time.perf_counter()
    _validate(event)
    creds = credentials(event)
    cold = _Warm.invocations == 0
    _Warm.invocations += 1
    env_kwargs = event.get("env_kwargs") or {}
    if not isinstance(env_kwargs, dict):
        raise ConfigError("event field 'env_kwargs' must be an object")
    max_entry_bytes = _max_entry_bytes(event)

    sampler = _sampler(event["job_id"], event["env_id"], env_kwargs, event["seed"], event.get("envs_per_actor", 1))
    if event.get("reset_episodes"):  # reproducible runs: what this invocation samples depends on its seed only
        sampler.reseed(event["seed"])
    client = warm_client(redis_url(event, creds), clock)
    runner = _runner(client, event["job_id"], event["policy_version"], creds.read_key_bytes, clock)
    t_loaded = time.perf_counter()

    batch = sampler.sample(runner, event["num_steps"], np.random.default_rng(event["seed"]))
    t_sampled = time.perf_counter()
    batch["policy_version"] = event["policy_version"]
    batch["invocation_id"] = event["invocation_id"]
    writer = TrajectoryWriter(client, event["job_id"], creds.signing_key_bytes, max_entry_bytes=max_entry_bytes,
                              io=clock.io)
    compress = event.get("compress")
    entry_ids = writer.append_batch(invocation_id=event["invocation_id"], round=event["round"],
                                    policy_version=event["policy_version"], batch=batch,
                                    compress=None if compress is None else bool(compress),
                                    value_of=runner.value_batch)
    t_pushed = time.perf_counter()
    returns = batch["episode_returns"]
    return {
        "ok": True,
        "job_id": event["job_id"],
        "invocation_id": event["invocation_id"],
        "round": event["round"],
        "policy_version": event["policy_version"],
        "entry_id": entry_ids[0],
        "entries": len(entry_ids),
        "steps": event["num_steps"],
        "episodes": len(returns),
        "mean_episode_return": float(np.mean(returns)) if returns else None,
        "cold": cold,
        "load_ms": round((t_loaded - t0) * 1e3, 3),
        "sample_ms": round((t_sampled - t_loaded) * 1e3, 3),
        "push_ms": round((t_pushed - t_sampled) * 1e3, 3),
        "duration_ms": round((t_pushed - t0) * 1e3, 3),
        "clock": clock.report(cold),  # the cloud clock's measurements (docs/cost.md)
    }
