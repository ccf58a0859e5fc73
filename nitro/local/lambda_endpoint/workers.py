"""One worker process as seen from the endpoint's event loop: spawn, send, kill."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Callable

from . import protocol
from .config import FunctionConfig


class InitError(Exception):
    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message


def exit_description(returncode: int | None) -> str:
    """Phrased like the Lambda runtime: 'signal: killed' or 'exit status 1'."""
    if returncode is None:
        return "exit status unknown"
    if returncode < 0:
        try:
            return f"signal: {signal.strsignal(-returncode).lower()}"
        except (ValueError, AttributeError):
            return f"signal: {-returncode}"
    return f"exit status {returncode}"


class _Pipe(asyncio.Protocol):
    def __init__(self, worker: "Worker") -> None:
        self.worker = worker
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        for msg in protocol.split_frames(self.buf):
            self.worker.on_message(self.worker, msg)

    def connection_lost(self, exc) -> None:
        self.worker.gone()


class Worker:
    """Messages from the process go to on_message(worker, msg); its death to on_gone(worker),
    both called straight from the pipe callback so the pool can hand over the next job at once."""

    def __init__(self, cfg: FunctionConfig) -> None:
        self.cfg = cfg
        self.proc: asyncio.subprocess.Process | None = None
        self.fresh = True          # its first invocation is the cold start
        self.init_ms = 0.0         # spawn + interpreter start + handler import
        self.max_memory_mb = 0
        self.alive = False
        self.timed_out = False
        self.job = None            # the invocation it is running, owned by the pool
        self.on_message: Callable[["Worker", tuple], None] = lambda w, m: None
        self.on_gone: Callable[["Worker"], None] = lambda w: None
        self._writer: asyncio.WriteTransport | None = None

    async def start(self, env: dict[str, str]) -> None:
        """Spawn the process and wait until its handler is imported; raises InitError."""
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        cfg = json.dumps({"name": self.cfg.name, "handler": self.cfg.handler, "memory_mb": self.cfg.memory_mb,
                          "parent_pid": os.getpid()})  # the worker dies with the endpoint (worker.die_with_parent)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "nitro.local.lambda_endpoint.worker", str(to_worker_r), str(from_worker_w), cfg,
                pass_fds=(to_worker_r, from_worker_w), env=env, stdin=asyncio.subprocess.DEVNULL)
        except BaseException:
            os.close(to_worker_w)
            os.close(from_worker_r)
            raise
        finally:
            os.close(to_worker_r)  # the child holds its own copies; ours would mask EOF
            os.close(from_worker_w)
        first = loop.create_future()
        self.on_message = lambda w, msg: first.done() or first.set_result(msg)
        self.on_gone = lambda w: first.done() or first.set_result(None)
        self._writer, _ = await loop.connect_write_pipe(asyncio.BaseProtocol, os.fdopen(to_worker_w, "wb", 0))
        await loop.connect_read_pipe(lambda: _Pipe(self), os.fdopen(from_worker_r, "rb", 0))
        msg = await first
        if msg is None:
            raise InitError("Runtime.ExitError", f"Runtime exited during init: {await self.exit_status()}")
        if msg[0] == protocol.INIT_ERROR:
            self.kill()
            raise InitError(msg[1], msg[2])
        self.alive = True
        self.init_ms = (time.perf_counter() - t0) * 1000

    def send(self, data: bytes) -> None:
        self._writer.write(data)

    def gone(self) -> None:
        self.alive = False
        if self._writer is not None:
            self._writer.close()
        self.on_gone(self)

    async def exit_status(self) -> str:
        rc = await self.proc.wait() if self.proc else None
        return exit_description(rc)

    def time_out(self) -> None:
        self.timed_out = True
        self.kill()

    def kill(self) -> None:
        self.alive = False
        if self.proc is not None and self.proc.returncode is None:
            # os.kill, not Popen.kill: that one polls first, reaping the child under asyncio's
            # child watcher, which then reports exit status 255 instead of the real one.
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """Ask the worker to exit: end of its request pipe (it finishes a running invocation first)."""
        if self._writer is not None:
            self._writer.close()
