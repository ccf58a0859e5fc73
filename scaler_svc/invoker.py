"""Invoke actor functions through boto3's Lambda client, concurrently, and collect their bills.

The same code path serves AWS Lambda and the local endpoint: only endpoint_url
and credentials differ. Invocations are synchronous (RequestResponse) with the
log tail requested, so the platform's REPORT line gives the billed duration.
A throttled (429) or failed invocation is retried with the SAME invocation id:
the trajectory stream drops a duplicate if the first attempt did push its batch.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, ReadTimeoutError

from nitro.aws.lambda_report import parse_report

log = logging.getLogger(__name__)

# AuthenticationError: a restarted Redis has forgotten the job's user until the scaler sets it again
# (scaler_svc/actor_users.py, every LAUNCH_LEASE_REFRESH_S while the launch runs).
RETRYABLE_ERRORS = {"TooManyRequestsException", "Sandbox.Timedout", "Runtime.ExitError", "ServiceException",
                    "RedisUnavailableError", "EndpointConnectionError", "ReadTimeoutError", "ConnectionError",
                    "AuthenticationError"}


def episode_returns(body: dict) -> list[float]:
    """The returns an evaluation function answered with: finite numbers only (anything else is dropped, so a
    broken answer counts as fewer episodes, never as a made-up return)."""
    values = body.get("episode_returns")
    if not isinstance(values, list):
        return []
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)]


@dataclass
class Invocation:
    invocation_id: str
    event: dict


@dataclass
class InvocationOutcome:
    invocation_id: str
    ok: bool
    error_type: str = ""
    error_message: str = ""
    duration_ms: float = 0.0
    billed_ms: int = 0
    init_ms: float = 0.0
    attempts: int = 1
    billed_attempts_ms: int = 0  # every attempt's billed time: what the platform charges
    # Attempts that ran the function: the requests Lambda bills. A ClientError (throttled, not found, invalid or
    # too large) is the service refusing the request before it ran; AWS bills only requests that start executing.
    requests: int = 0
    # The cloud clock (docs/cost.md): from the function's own "clock" report; an attempt without one
    # (a function error, a timeout) is modelled by its billed wall time.
    modelled_ms: float = 0.0  # the last attempt's
    modelled_attempts_ms: float = 0.0  # every attempt's: what the caller waits for and what is billed
    modelled_cpu_attempts_ms: float = 0.0  # the CPU-bound part of it (slowed by the memory's CPU share)
    measured_init_ms: float = 0.0  # init CPU reported by an attempt that ran in a fresh process
    retried: list[tuple[str, str]] = field(default_factory=list)  # (error type, message) of each retried attempt
    episode_returns: list[float] = field(default_factory=list)  # an evaluation function's answer (kind "eval")


def lambda_client(endpoint_url: str | None, region: str, *, max_connections: int, read_timeout: float):
    cfg = Config(region_name=region, max_pool_connections=max_connections, read_timeout=read_timeout,
                 connect_timeout=5, retries={"total_max_attempts": 1})  # retries are ours, with the same id
    kwargs = {"endpoint_url": endpoint_url} if endpoint_url else {}
    if endpoint_url and endpoint_url.startswith("http://127.0.0.1"):
        # The local endpoint ignores credentials; never require real ones for it.
        kwargs.update(aws_access_key_id="local", aws_secret_access_key="local")
    return boto3.client("lambda", config=cfg, **kwargs)


class Invoker:
    def __init__(self, client, *, max_attempts: int = 3, backoff_s: float = 0.2, max_concurrency: int = 256):
        self.client = client
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        # One long-lived pool: starting threads per round shows up in the round's invoke phase.
        self.pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="invoke")

    def _once(self, function_name: str, payload: bytes) -> tuple[bool, str, str, dict, dict]:
        resp = self.client.invoke(FunctionName=function_name, InvocationType="RequestResponse", LogType="Tail",
                                  Payload=payload)
        body = resp["Payload"].read()
        report = parse_report(resp["LogResult"]) if resp.get("LogResult") else {}
        if resp.get("FunctionError"):
            try:
                err = json.loads(body)
            except ValueError:
                err = {"errorMessage": body[:500].decode(errors="replace")}
            return False, str(err.get("errorType", "Unhandled")), str(err.get("errorMessage", "")), report, {}
        return True, "", "", report, json.loads(body) if body else {}

    def invoke(self, function_name: str, inv: Invocation, deadline: float) -> InvocationOutcome:
        out = InvocationOutcome(inv.invocation_id, ok=False, attempts=0)
        payload = json.dumps(inv.event).encode()
        for attempt in range(1, self.max_attempts + 1):
            out.attempts = attempt
            body = {}
            try:
                ok, etype, emsg, report, body = self._once(function_name, payload)
                out.requests += 1
            except ClientError as exc:  # refused by the service before the function ran: not billed
                ok, etype, emsg, report = False, exc.response["Error"].get("Code", "ClientError"), str(exc), {}
            except BotoCoreError as exc:
                ok, etype, emsg, report = False, type(exc).__name__, str(exc), {}
                if isinstance(exc, ReadTimeoutError):  # the function ran (and is billed); its answer was lost
                    out.requests += 1
            if report:
                out.duration_ms = report.get("duration_ms", 0.0)
                out.billed_ms = int(report.get("billed_ms", 0))
                out.init_ms = report.get("init_ms", 0.0) or 0.0
                out.billed_attempts_ms += out.billed_ms
            clock = body.get("clock") if isinstance(body, dict) else None
            if isinstance(clock, dict):
                out.modelled_ms = float(clock.get("modelled_ms", 0.0))
                # On a full vCPU: everything but the wall time of its Redis calls is CPU-bound.
                out.modelled_cpu_attempts_ms += max(0.0, out.modelled_ms - float(clock.get("io_wall_ms", 0.0)))
                out.measured_init_ms = max(out.measured_init_ms, float(clock.get("init_ms", 0.0)))
            else:
                out.modelled_ms = float(out.billed_ms) if report else 0.0
            out.modelled_attempts_ms += out.modelled_ms
            out.ok, out.error_type, out.error_message = ok, etype, emsg
            if ok and isinstance(body, dict):
                out.episode_returns = episode_returns(body)
            if ok or etype not in RETRYABLE_ERRORS:
                break
            pause = self.backoff_s * (2 ** (attempt - 1)) * (0.5 + random.random())
            if attempt == self.max_attempts or time.monotonic() + pause >= deadline:
                break
            out.retried.append((etype, emsg[:300]))
            log.warning("invocation %s of %s: attempt %d failed (%s: %s); retrying in %.2f s with the same id",
                        inv.invocation_id, function_name, attempt, etype, emsg[:300], pause)
            time.sleep(pause)
        if out.retried:
            log.log(logging.INFO if out.ok else logging.WARNING, "invocation %s of %s: %s after %d attempt(s)",
                    inv.invocation_id, function_name, "succeeded" if out.ok else f"failed ({out.error_type})",
                    out.attempts)
        return out

    def invoke_all(self, function_name: str, invocations: list[Invocation], deadline_s: float,
                   on_done=None) -> tuple[list[InvocationOutcome], float]:
        """Run all invocations concurrently; returns outcomes and the dispatch time in seconds."""
        if not invocations:
            return [], 0.0
        deadline = time.monotonic() + deadline_s
        t0 = time.perf_counter()
        futures = [self.pool.submit(self.invoke, function_name, inv, deadline) for inv in invocations]
        dispatch = time.perf_counter() - t0
        outcomes = []
        for f in futures:
            o = f.result()
            if on_done is not None:
                on_done(o)
            outcomes.append(o)
        return outcomes, dispatch
