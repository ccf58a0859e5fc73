"""Per-function execution: concurrency admission, a warm worker pool, timeouts, crashes.

Invocations waiting for a worker sit in a queue of jobs; a worker that answers is handed the
next job from inside its pipe callback, so a busy pool turns over without waiting for the
event loop to resume any task.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import time
from dataclasses import dataclass

from . import protocol
from .config import FunctionConfig
from .workers import InitError, Worker

log = logging.getLogger("nitro.local.lambda_endpoint")


class Throttled(Exception):
    """More invocations in flight than the function's concurrency."""


class _WorkerGone(Exception):
    pass


@dataclass(slots=True)
class Outcome:
    """One execution, ready to be turned into an Invoke response."""

    body: bytes
    function_error: str | None  # "Unhandled" or None
    duration_ms: float
    init_ms: float | None       # set on a cold start only
    max_memory_mb: int
    output: str = ""
    bad_request: bool = False   # the payload was not JSON (HTTP 400, nothing ran)
    queue_ms: float = 0.0       # waiting for a free worker


class _Job:
    __slots__ = ("request_id", "payload", "arn", "client_context", "capture", "future", "queued",
                 "started", "timer", "worker", "init_ms")

    def __init__(self, request_id, payload, arn, client_context, capture, future) -> None:
        self.request_id = request_id
        self.payload = payload
        self.arn = arn
        self.client_context = client_context
        self.capture = capture
        self.future: asyncio.Future = future
        self.queued = time.perf_counter()
        self.started = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.worker: Worker | None = None
        self.init_ms: float | None = None


def _error_json(error_type: str, message: str) -> bytes:
    return json.dumps({"errorMessage": message, "errorType": error_type}).encode()


class FunctionPool:
    def __init__(self, cfg: FunctionConfig) -> None:
        self.cfg = cfg
        self.max_workers = cfg.workers
        self.in_flight = 0
        self._idle: list[Worker] = []
        self._live = 0  # running or starting
        self._jobs: collections.deque[_Job] = collections.deque()
        self._slot_waiters: collections.deque[asyncio.Future] = collections.deque()
        self._all: set[Worker] = set()
        self._env = {**os.environ, **{k: str(v) for k, v in cfg.env.items()}}
        self._closing = False

    # -- concurrency admission -------------------------------------------------
    def admit(self) -> None:
        """Synchronous invocations are rejected (429) rather than queued, as on AWS."""
        if self.in_flight >= self.cfg.concurrency:
            raise Throttled()
        self.in_flight += 1

    async def admit_async(self) -> None:
        """Asynchronous events wait in the function's own queue for capacity instead."""
        if self.in_flight < self.cfg.concurrency and not self._slot_waiters:
            self.in_flight += 1
            return
        fut = asyncio.get_running_loop().create_future()
        self._slot_waiters.append(fut)
        await fut  # the slot is handed over by leave()

    def leave(self) -> None:
        while self._slot_waiters:
            fut = self._slot_waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # hand the slot over: in_flight unchanged
                return
        self.in_flight -= 1

    # -- jobs and workers --------------------------------------------------------
    def _start(self, w: Worker, job: _Job) -> None:
        job.worker, w.job = w, job
        job.init_ms = w.init_ms if w.fresh else None
        w.fresh = False
        job.started = time.perf_counter()
        timeout = self.cfg.timeout_s
        w.send(protocol.encode((protocol.RESULT, job.request_id, job.payload, job.arn,
                                time.time() * 1000 + timeout * 1000, job.client_context, job.capture)))
        job.timer = asyncio.get_running_loop().call_later(timeout, w.time_out)  # EOF follows the kill

    def _next(self, w: Worker) -> None:
        """Give a free worker the oldest waiting job, or park it (most recent first: stays warm)."""
        while self._jobs:
            job = self._jobs.popleft()
            if not job.future.done():  # skip callers that went away
                self._start(w, job)
                return
        self._idle.append(w)

    def _on_message(self, w: Worker, msg: tuple) -> None:
        job, w.job = w.job, None
        if job is not None:
            job.timer.cancel()
            w.max_memory_mb = msg[4]
            if not job.future.done():
                job.future.set_result(msg)
        self._next(w)

    def _on_gone(self, w: Worker) -> None:
        self._all.discard(w)
        if w in self._idle:
            self._idle.remove(w)
        self._live -= 1
        job, w.job = w.job, None
        if job is not None:
            job.timer.cancel()
            if not job.future.done():
                job.future.set_exception(_WorkerGone())
        self._maybe_spawn()

    def _maybe_spawn(self) -> None:
        if self._jobs and self._live < self.max_workers and not self._closing:
            self._live += 1
            asyncio.get_running_loop().create_task(self._spawn())

    async def _spawn(self) -> None:
        w = Worker(self.cfg)
        try:
            await w.start(self._env)
        except Exception as exc:
            self._live -= 1
            if not isinstance(exc, InitError):
                log.exception("could not start a worker for %s", self.cfg.name)
                exc = InitError("Runtime.Unknown", f"could not start a worker: {exc}")
            while self._jobs:  # like AWS, the failed init is the answer to one invocation
                job = self._jobs.popleft()
                if not job.future.done():
                    job.future.set_exception(exc)
                    break
            self._maybe_spawn()
            return
        if self._closing:
            w.close()
            return
        w.on_message, w.on_gone = self._on_message, self._on_gone
        self._all.add(w)
        self._next(w)

    # -- one execution -----------------------------------------------------------
    async def execute(self, request_id: str, payload: bytes, arn: str, client_context, capture: bool) -> Outcome:
        job = _Job(request_id, payload, arn, client_context, capture, asyncio.get_running_loop().create_future())
        while self._idle:
            w = self._idle.pop()
            if w.alive:
                self._start(w, job)
                break
        else:
            self._jobs.append(job)
            self._maybe_spawn()
        try:
            msg = await job.future
        except InitError as exc:
            return Outcome(_error_json(exc.error_type, exc.message), "Unhandled", 0.0, None, 0)
        except _WorkerGone:
            return await self._died(job)
        queue_ms = (job.started - job.queued) * 1000
        _, status, body, duration_ms, max_memory_mb, output = msg
        if status == protocol.BAD_REQUEST:
            if job.init_ms is not None:
                job.worker.fresh = True  # nothing ran: the cold start is still ahead
            return Outcome(body, None, 0.0, None, max_memory_mb, bad_request=True, queue_ms=queue_ms)
        error = "Unhandled" if status == protocol.FUNCTION_ERROR else None
        return Outcome(body, error, duration_ms, job.init_ms, max_memory_mb, output, queue_ms=queue_ms)

    async def _died(self, job: _Job) -> Outcome:
        w = job.worker
        queue_ms = (job.started - job.queued) * 1000
        timeout = self.cfg.timeout_s
        if w.timed_out:
            message = f"RequestId: {job.request_id} Error: Task timed out after {timeout:.2f} seconds"
            log.warning("%s: invocation %s timed out after %.2f s; its worker was killed", self.cfg.name,
                        job.request_id, timeout)
            return Outcome(_error_json("Sandbox.Timedout", message), "Unhandled", timeout * 1000,
                           job.init_ms, w.max_memory_mb, message, queue_ms=queue_ms)
        elapsed_ms = (time.perf_counter() - job.started) * 1000
        status = await w.exit_status()
        message = f"RequestId: {job.request_id} Error: Runtime exited with error: {status}"
        log.warning("%s: the worker (pid %s) running invocation %s died after %.0f ms (%s); the invocation "
                    "fails with Runtime.ExitError and its caller may retry it", self.cfg.name,
                    w.proc.pid if w.proc else "?", job.request_id, elapsed_ms, status)
        return Outcome(_error_json("Runtime.ExitError", message), "Unhandled", elapsed_ms,
                       job.init_ms, w.max_memory_mb, message, queue_ms=queue_ms)

    async def close(self, grace_s: float = 2.0) -> None:
        """Stop every worker: end of input first, SIGKILL for those still running after grace_s."""
        self._closing = True
        workers = list(self._all)
        for w in workers:
            w.close()
        procs = [asyncio.ensure_future(w.proc.wait()) for w in workers if w.proc is not None]
        if procs:
            _, pending = await asyncio.wait(procs, timeout=grace_s)
            for w in workers:
                w.kill()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
