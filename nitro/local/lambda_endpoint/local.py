"""LocalLambda: run the endpoint as a child process and hand back its URL.

A separate process keeps the endpoint off the caller's GIL: a scaler or benchmark with dozens
of boto3 threads would otherwise add their scheduling delays to every invocation.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

from .config import FUNCTIONS_ENV, FunctionConfig


def _child_pythonpath() -> str:
    """The caller's import roots, so handlers importable here are importable in the workers."""
    prefixes = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
    paths = [os.path.abspath(p or ".") for p in sys.path]
    paths = [p for p in paths if os.path.isdir(p) and not p.startswith(prefixes)]
    existing = os.environ.get("PYTHONPATH")
    return os.pathsep.join(dict.fromkeys(paths + ([existing] if existing else [])))


class LocalLambda:
    def __init__(self, functions: list[FunctionConfig], host: str = "127.0.0.1", port: int = 0,
                 startup_timeout_s: float = 30.0) -> None:
        if not functions:
            raise ValueError("at least one function is required")
        self.functions = list(functions)
        self.host = host
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.endpoint_url: str | None = None
        self._proc: subprocess.Popen | None = None
        self._lifeline_w: int | None = None

    def start(self) -> "LocalLambda":
        """Start the endpoint process; returns once it is listening."""
        if self._proc is not None:
            return self
        ready_r, ready_w = os.pipe()
        lifeline_r, lifeline_w = os.pipe()
        cmd = [sys.executable, "-m", "nitro.local.lambda_endpoint", "--host", self.host, "--port", str(self.port),
               "--ready-fd", str(ready_w), "--lifeline-fd", str(lifeline_r)]
        # The configs (their env may hold secrets) travel in the environment: a command line shows in `ps`.
        env = {**os.environ, "PYTHONPATH": _child_pythonpath(),
               FUNCTIONS_ENV: json.dumps([f.to_dict() for f in self.functions])}
        # A session of its own: under Linux autogroup scheduling the endpoint and its workers then
        # share the CPU with a busy caller as a group, instead of each waking worker queueing behind
        # the caller's threads (that measured as a 10-50 ms wait per invocation on 2 loaded cores).
        # Ctrl-C in the caller's terminal no longer reaches it; stop() and the lifeline do.
        try:
            self._proc = subprocess.Popen(cmd, pass_fds=(ready_w, lifeline_r), env=env, stdin=subprocess.DEVNULL,
                                          start_new_session=True)
        finally:
            os.close(ready_w)
            os.close(lifeline_r)
        self._lifeline_w = lifeline_w
        try:
            self.endpoint_url = self._read_url(ready_r)
        except BaseException:
            self.stop()
            raise
        finally:
            os.close(ready_r)
        return self

    @property
    def pid(self) -> int | None:
        """The endpoint process (its workers are its children)."""
        return self._proc.pid if self._proc is not None else None

    def _read_url(self, fd: int) -> str:
        deadline = time.monotonic() + self.startup_timeout_s
        data = b""
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"local lambda did not start within {self.startup_timeout_s} s")
            chunk = os.read(fd, 256)
            if not chunk:
                raise RuntimeError(f"local lambda exited during startup (code {self._proc.wait()})")
            data += chunk
        return data.decode().strip()

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the endpoint (it stops its workers), SIGKILL if it does not exit in time."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self._lifeline_w is not None:
            os.close(self._lifeline_w)
            self._lifeline_w = None

    def __enter__(self) -> "LocalLambda":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
