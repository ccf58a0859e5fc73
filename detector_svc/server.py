"""BoostingDetector: scores a policy version from the Hessian spectrum of its surrogate.

Per-job state (the convexity ratios of past rounds) lives in Redis as a hash
round -> R, so any replica can serve any job and a retried Score for the same
round overwrites instead of appending twice. A round's score is taken over the
ratios of the rounds up to it (nitro.detector.score.ScoreWindow).
"""

from __future__ import annotations

import argparse
import logging
import threading
import time

import grpc
import numpy as np
import torch

from nitro.clock import critical_path_cpu_seconds
from nitro.cmdline import REDIS_PASSWORD_INSTEAD, URLWithoutPassword
from nitro.contracts import (
    DETECTOR_SUBSET,
    JOB_ID_RULE,
    LANCZOS_STEPS,
    SCORE_DECAY,
    SCORE_WINDOW,
    detector_ratios_key,
    is_job_id,
    job_read_key,
    sample_key,
)
from nitro.data import codec
from nitro.data.redis_client import connect, url_from_env, warn_if_not_persistent, with_credentials
from nitro.data.store import PolicyNotFoundError, PolicyStore
from nitro.detector.core import ALGOS as DETECTOR_ALGOS
from nitro.detector.core import detect
from nitro.detector.score import FAILED_RATIO, round_score, window_ratios
from nitro.errors import ConfigError
from nitro.policy.models import Policy, blob_to_doc
from nitro.rpc import auth, metrics
from nitro.rpc.grpc_util import REPLICA_CONNECTION_AGE_S, Service, configure_logging
from nitro.rpc.metrics import serve_metrics
from nitro.v1 import detector_pb2, detector_pb2_grpc

log = logging.getLogger("detector_svc")

STATE_TTL_S = 7 * 24 * 3600
RATIO_LOOKBACK = 4  # windows of rounds a Score reads back before falling back to every stored ratio
DEFAULTS = {"subset_size": DETECTOR_SUBSET, "lanczos_steps": LANCZOS_STEPS, "window": SCORE_WINDOW, "decay": SCORE_DECAY}


class DetectorServicer(detector_pb2_grpc.BoostingDetectorServicer):
    def __init__(self, redis_client, hmac_key: bytes, redis_url: str):
        """hmac_key: the master key; a job's policies and sample subsets verify with its read key, derived from it."""
        self.redis, self.key, self.redis_url = redis_client, hmac_key, redis_url
        self._policy_cache: dict[str, Policy] = {}
        self._lock = threading.Lock()

    def _checkout(self, job_id: str, version: int) -> Policy:
        """A policy module holding `version`'s weights, exclusively ours until `_checkin`.

        Modules are reused across rounds (building one costs more than loading weights);
        a concurrent Score for the same job simply builds its own.
        """
        doc = blob_to_doc(PolicyStore(self.redis, job_id).get(version), job_read_key(self.key, job_id))
        with self._lock:
            policy = self._policy_cache.pop(job_id, None)
        if policy is None or policy.spec != doc["spec"]:
            policy = Policy(doc["spec"])
        policy.load_numpy_state(doc["state"])
        return policy

    def _checkin(self, job_id: str, policy: Policy) -> None:
        with self._lock:
            self._policy_cache[job_id] = policy
            while len(self._policy_cache) > 16:
                self._policy_cache.pop(next(iter(self._policy_cache)))

    def _store_ratio(self, job_id: str, round_index: int, ratio: float, window: int) -> list[float]:
        """Store round `round_index`'s entry (its ratio, or FAILED_RATIO); the stored entries of rounds up to it,
        oldest first and its own last, holding the newest `window` valid ratios among them (window_ratios).

        Reads the last RATIO_LOOKBACK windows of rounds, not the whole hash (which grows by a round a round);
        only when those hold fewer than `window` valid ratios (rounds without a score, failed detections) does it
        read all of them."""
        key = detector_ratios_key(job_id)
        first = max(0, round_index - RATIO_LOOKBACK * window + 1)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, str(round_index), repr(float(ratio)))
        pipe.expire(key, STATE_TTL_S)
        pipe.hmget(key, [str(k) for k in range(first, round_index + 1)])
        entries = [float(v) for v in pipe.execute()[-1] if v is not None]
        if len(window_ratios(entries, window)) < window and first > 0:
            stored = sorted((int(k), float(v)) for k, v in self.redis.hgetall(key).items())
            entries = [r for k, r in stored if k <= round_index]
        return entries

    def Score(self, request, context):
        t0, cpu0 = time.perf_counter(), critical_path_cpu_seconds()
        p = {k: getattr(request, k) or v for k, v in DEFAULTS.items()}
        if not is_job_id(request.job_id):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"job_id: must be {JOB_ID_RULE}")
        if request.sample_ref != sample_key(request.job_id, request.round):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "sample_ref: must be the round's sample key nitro:{job_id}:sample:{round}")
        if request.round < 0 or request.policy_version < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "round and policy_version: must be >= 0")
        if request.algo not in ("", *DETECTOR_ALGOS):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"algo: unknown {request.algo!r}; allowed: {list(DETECTOR_ALGOS)}")
        if not 0.0 < request.clip < 1.0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"clip: must be in (0, 1), got {request.clip}")
        if not 0.0 < p["decay"] <= 1.0 or not 1 <= p["window"] <= 1000:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "decay must be in (0, 1] and window in [1, 1000]")
        if not 1 <= p["subset_size"] <= 1_000_000 or not 1 <= p["lanczos_steps"] <= 1000:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "subset_size must be in [1, 1000000] and lanczos_steps in [1, 1000]")
        try:
            policy = self._checkout(request.job_id, request.policy_version)
            raw = self.redis.get(request.sample_ref) if request.sample_ref else None
        except PolicyNotFoundError as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except codec.PayloadError as exc:
            metrics.REJECTED_PAYLOADS.labels(exc.reason).inc()
            context.abort(grpc.StatusCode.DATA_LOSS, f"policy version {request.policy_version} rejected: {exc}")
        except (ValueError, ConfigError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:  # redis connection errors
            context.abort(grpc.StatusCode.UNAVAILABLE, f"Redis at {self.redis_url.split('@')[-1]}: {exc}")
        if raw is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"sample_ref {request.sample_ref!r} not found (expired?)")
        try:
            samples = codec.decode(raw, job_read_key(self.key, request.job_id))
        except codec.PayloadError as exc:
            metrics.REJECTED_PAYLOADS.labels(exc.reason).inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"sample_ref payload rejected: {exc}")
        try:
            res = detect(policy, samples, clip=request.clip, subset_size=p["subset_size"],
                         lanczos_steps=p["lanczos_steps"], seed=request.seed,
                         normalize_advantages=request.normalize_advantages, algo=request.algo or "ppo")
        except ConfigError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        finally:
            self._checkin(request.job_id, policy)
        entry = res.ratio if res.finite else FAILED_RATIO  # stored for bookkeeping, in no window (window_ratios)
        window, score = round_score(self._store_ratio(request.job_id, request.round, entry, p["window"]),
                                    request.round, p["decay"], p["window"])
        seconds = time.perf_counter() - t0
        metrics.DETECTOR_SECONDS.observe(seconds)
        metrics.set_job(metrics.BOOSTING_SCORE, request.job_id, score)
        metrics.set_job(metrics.CONVEXITY_RATIO, request.job_id, res.ratio)
        metrics.forget_idle_jobs()
        return detector_pb2.ScoreResponse(
            lambda_max=_finite(res.lambda_max), lambda_min=_finite(res.lambda_min), convexity_ratio=res.ratio,
            score=score, converged=res.converged, convergence_delta=_finite(res.convergence_delta),
            samples_used=res.samples_used, seconds=seconds, window=window.to_list(),
            cpu_seconds=max(0.0, critical_path_cpu_seconds() - cpu0))


def _finite(x: float) -> float:
    return float(x) if np.isfinite(x) else 0.0


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="detector_svc", description="nitro BoostingDetector")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50052)
    p.add_argument("--metrics-host", default="127.0.0.1", help="metrics are unauthenticated: loopback by default")
    p.add_argument("--metrics-port", type=int, default=9102)
    p.add_argument("--redis-url", default=url_from_env(), action=URLWithoutPassword, instead=REDIS_PASSWORD_INSTEAD)
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (1: no worker threads to starve when cores are shared)")
    p.add_argument("--log-level", default="INFO")
    auth.add_server_args(p)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    configure_logging(args.log_level)
    torch.set_num_threads(args.threads)
    try:
        args.redis_url = with_credentials(args.redis_url)  # NITRO_REDIS_PASSWORD(_FILE) when the URL has none
        security = auth.server_security(args, "detector")
        key = codec.load_hmac_key()
    except ConfigError as exc:
        raise SystemExit(f"detector_svc: {exc}") from None
    client = connect(args.redis_url)
    warn_if_not_persistent(client, args.redis_url, "detector")
    servicer = DetectorServicer(client, key, args.redis_url)
    service = Service("detector", args.host, args.port, max_workers=4, interceptors=security.interceptors,
                      server_credentials=security.credentials,
                      max_connection_age_s=REPLICA_CONNECTION_AGE_S)
    service.add("nitro.v1.BoostingDetector",
                lambda s: detector_pb2_grpc.add_BoostingDetectorServicer_to_server(servicer, s))
    serve_metrics(args.metrics_port, args.metrics_host)
    service.install_signal_handlers()
    service.start()
    service.wait()
