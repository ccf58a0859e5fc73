"""A warm worker process: imports one handler once, then serves invocations over pipes.

Started by the endpoint as `python -m nitro.local.lambda_endpoint.worker IN_FD OUT_FD CONFIG_JSON`
(a fresh interpreter, like the spawn start method: safe to import torch in handlers).
"""

from __future__ import annotations

import ctypes
import importlib
import io
import json
import os
import resource
import signal
import sys
import threading
import time
import traceback

from . import protocol
from .config import SYNC_PAYLOAD_LIMIT


class ClientContext:
    def __init__(self, raw: dict) -> None:
        self.client = raw.get("client")
        self.custom = raw.get("custom")
        self.env = raw.get("env")


class LambdaContext:
    """The attributes of the AWS Python runtime's context object."""

    function_version = "$LATEST"
    identity = None

    def __init__(self, cfg: dict, request_id: str, arn: str, deadline_ms: float, client_context):
        self.aws_request_id = request_id
        self.function_name = cfg["name"]
        self.memory_limit_in_mb = str(cfg["memory_mb"])  # a string, as in the AWS runtime
        self.invoked_function_arn = arn
        self.log_group_name = f"/aws/lambda/{cfg['name']}"
        self.log_stream_name = "local"
        self.client_context = ClientContext(client_context) if client_context else None
        self._deadline_ms = deadline_ms

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int(self._deadline_ms - time.time() * 1000))


def _error_body(exc: BaseException, request_id: str, skip_frames: int = 1) -> bytes:
    tb = traceback.extract_tb(exc.__traceback__)[skip_frames:]
    return json.dumps({
        "errorMessage": str(exc),
        "errorType": type(exc).__name__,
        "requestId": request_id,
        "stackTrace": traceback.format_list(tb),
    }).encode()


def _error(error_type: str, message: str, request_id: str) -> bytes:
    return json.dumps({"errorMessage": message, "errorType": error_type,
                       "requestId": request_id, "stackTrace": []}).encode()


def _max_memory_mb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # KiB on Linux


def _invoke(handler, cfg: dict, msg: tuple) -> tuple:
    _, request_id, payload, arn, deadline_ms, client_context, capture = msg
    try:
        event = json.loads(payload) if payload.strip() else {}
    except ValueError as exc:
        return (protocol.RESULT, protocol.BAD_REQUEST, f"Could not parse request body into json: {exc}".encode(),
                0.0, _max_memory_mb(), "")
    ctx = LambdaContext(cfg, request_id, arn, deadline_ms, client_context)
    out = io.StringIO() if capture else None
    saved = sys.stdout, sys.stderr
    if out is not None:
        sys.stdout = sys.stderr = out
    status = protocol.OK
    t0 = time.perf_counter()
    try:
        result = handler(event, ctx)
    except Exception as exc:  # an Unhandled function error, as the Lambda runtime reports it
        duration_ms = (time.perf_counter() - t0) * 1000
        status, body = protocol.FUNCTION_ERROR, _error_body(exc, request_id)
        traceback.print_exc()
    else:
        duration_ms = (time.perf_counter() - t0) * 1000
        try:
            body = json.dumps(result).encode()
        except (TypeError, ValueError) as exc:
            status = protocol.FUNCTION_ERROR
            body = _error("Runtime.MarshalError", f"Unable to marshal response: {exc}", request_id)
        else:
            if len(body) > SYNC_PAYLOAD_LIMIT:
                status = protocol.FUNCTION_ERROR
                body = _error("Function.ResponseSizeTooLarge",
                              f"Response payload size ({len(body)} bytes) exceeded maximum allowed "
                              f"payload size ({SYNC_PAYLOAD_LIMIT} bytes).", request_id)
    finally:
        sys.stdout, sys.stderr = saved
    output = ""
    if out is not None:
        output = out.getvalue()
        sys.stderr.write(output)  # the captured lines still reach the endpoint's log
    return (protocol.RESULT, status, body, duration_ms, _max_memory_mb(), output)


PR_SET_PDEATHSIG = 1  # linux/prctl.h
PARENT_POLL_S = 0.5


def die_with_parent(parent_pid: int) -> None:
    """End this worker when the endpoint that started it ends.

    An orphaned worker would run its invocation on: its batch would reach a round that no longer waits for it,
    and the caller, which saw the invocation fail, would retry or replace it, paying twice for one slot. On
    Linux the kernel kills the worker with its parent (PR_SET_PDEATHSIG); elsewhere a thread polls the parent.
    A parent that died before this ran is caught by the pid check."""
    try:
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):
        def watch() -> None:
            while os.getppid() == parent_pid:
                time.sleep(PARENT_POLL_S)
            os._exit(1)

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    if os.getppid() != parent_pid:
        os._exit(1)


def _load_handler(spec: str):
    module_name, _, func_name = spec.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        return None, ("Runtime.ImportModuleError", f"Unable to import module '{module_name}': {exc}")
    handler = getattr(module, func_name, None)
    if not callable(handler):
        return None, ("Runtime.HandlerNotFound", f"Handler '{func_name}' missing on module '{module_name}'")
    return handler, None


def main(argv: list[str]) -> int:
    in_fd, out_fd, cfg = int(argv[0]), int(argv[1]), json.loads(argv[2])
    if cfg.get("parent_pid"):
        die_with_parent(int(cfg["parent_pid"]))
    os.environ.update({
        "AWS_LAMBDA_FUNCTION_NAME": cfg["name"],
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(cfg["memory_mb"]),
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "_HANDLER": cfg["handler"],
    })
    handler, err = _load_handler(cfg["handler"])
    if err:
        protocol.write_frame(out_fd, (protocol.INIT_ERROR, *err))
        return 1
    protocol.write_frame(out_fd, (protocol.READY,))
    with os.fdopen(in_fd, "rb") as requests:
        while (msg := protocol.read_frame(requests)) is not None:  # EOF: the endpoint is gone
            protocol.write_frame(out_fd, _invoke(handler, cfg, msg))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
