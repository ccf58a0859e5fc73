"""How the round loops fail and ride out failures: retries with backoff for Redis and the scaler/detector
RPCs, the errors that end a job, and the message of a resumable failure."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import grpc
import redis

from learner_svc.constants import MAX_RETRY_DELAY_S, REDIS_FIRST_RETRY_S, REDIS_PATIENCE_S, RPC_FIRST_RETRY_S

log = logging.getLogger(__name__)

RPC_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
REDIS_OUTAGE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.BusyLoadingError)
NO_SAMPLES = "no samples arrived"  # how the loops' end message for rounds without samples begins


class JobAborted(RuntimeError):
    """The job cannot go on; it ends FAILED with this message."""


class DependencyUnavailable(JobAborted):
    """Redis or the scaler stayed unavailable past its patience: the job ends FAILED, resumable from its
    last checkpoint once the dependency is back."""


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


def _with_backoff(fn: Callable, *, retryable: Callable[[Exception], bool], patience: float, first_delay: float,
                  give_up: Callable[[Exception], BaseException | None], note: Callable[[Exception, float], None]):
    """fn(), retried while `retryable(exc)` with doubling delays until `patience` runs out; then the error
    `give_up(exc)` returns is raised from it (None: `exc` itself)."""
    deadline = time.monotonic() + patience
    delay = first_delay
    while True:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - what is not retryable is raised again at once
            if not retryable(exc):
                raise
            if time.monotonic() + delay > deadline:
                error = give_up(exc)
                if error is None:
                    raise
                raise error from exc
            note(exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_DELAY_S)


def redis_call(fn: Callable, what: str, job_id: str):
    """Run a Redis operation, riding out a restart of the server for up to REDIS_PATIENCE_S."""
    return _with_backoff(
        fn, retryable=lambda exc: isinstance(exc, REDIS_OUTAGE), patience=REDIS_PATIENCE_S,
        first_delay=REDIS_FIRST_RETRY_S,
        give_up=lambda exc: DependencyUnavailable(f"Redis unavailable for {REDIS_PATIENCE_S:g} s during {what}: "
                                                  f"{exc}"),
        note=lambda exc, delay: log.warning("job %s: Redis unavailable during %s (%s); retrying in %.1f s",
                                            job_id, what, exc, delay))


def rpc_call(method: Callable, request, *, timeout: float, patience: float, what: str, job_id: str,
             metadata: tuple = ()):
    """Call a scaler/detector RPC, retrying UNAVAILABLE / DEADLINE_EXCEEDED until `patience` runs out."""
    return _with_backoff(
        lambda: method(request, timeout=timeout, metadata=metadata or None),
        retryable=lambda exc: isinstance(exc, grpc.RpcError) and exc.code() in RPC_RETRYABLE, patience=patience,
        first_delay=RPC_FIRST_RETRY_S, give_up=lambda exc: None,
        note=lambda exc, delay: log.warning("job %s: %s failed (%s); retrying in %.1f s", job_id, what,
                                            exc.code().name, delay))
