"""The Lambda Invoke API (POST /2015-03-31/functions/{name}/invocations) over FunctionPools."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
import uuid
from urllib.parse import parse_qs, unquote

from nitro.aws.lambda_report import billed_ms, log_tail_b64, report_line

from .config import ASYNC_PAYLOAD_LIMIT, SYNC_PAYLOAD_LIMIT, FunctionConfig, function_arn
from .httpd import Request, Response
from .pool import FunctionPool, Outcome, Throttled

log = logging.getLogger("nitro.local.lambda_endpoint")

_PREFIX = "/2015-03-31/functions/"
_SUFFIX = "/invocations"
_JSON = ("Content-Type", "application/json")


def split_function_name(raw: str) -> tuple[str, str | None]:
    """'name', 'name:qual', 'ACCOUNT:function:name[:qual]' or a full ARN -> (name, qualifier)."""
    parts = unquote(raw).split(":")
    if "function" in parts[:-1]:
        i = parts.index("function")
        parts = parts[i + 1:]
    return parts[0], (parts[1] if len(parts) > 1 and parts[1] else None)


def _error(status: int, error_type: str, body: dict, request_id: str) -> Response:
    return status, [_JSON, ("x-amzn-RequestId", request_id), ("x-amzn-ErrorType", error_type)], \
        json.dumps(body).encode()


class LambdaApi:
    def __init__(self, functions: list[FunctionConfig]) -> None:
        self.pools = {f.name: FunctionPool(f) for f in functions}
        self._background: set[asyncio.Task] = set()
        self._arns: dict[tuple[str, str | None], str] = {}

    def body_limit(self, method: str, path: str, headers: dict[str, str]) -> int:
        if headers.get("x-amz-invocation-type") == "Event":
            return ASYNC_PAYLOAD_LIMIT
        return SYNC_PAYLOAD_LIMIT

    async def handle(self, req: Request) -> Response:
        if req.path.startswith(_PREFIX) and req.path.endswith(_SUFFIX):
            if req.method != "POST":
                return 405, [], b""
            return await self._invoke(req, req.path[len(_PREFIX):-len(_SUFFIX)])
        if req.path == "/healthz" and req.method == "GET":
            return 200, [("Content-Type", "text/plain")], b"ok"
        return 404, [("Content-Type", "text/plain")], b"not found"

    async def _invoke(self, req: Request, raw_name: str) -> Response:
        request_id = str(uuid.uuid4())
        name, qualifier = split_function_name(raw_name)
        qualifier = qualifier or parse_qs(req.query).get("Qualifier", [None])[0]
        pool = self.pools.get(name)
        if pool is None:
            return _error(404, "ResourceNotFoundException",
                          {"Type": "User", "Message": f"Function not found: {function_arn(name, qualifier)}"},
                          request_id)
        invocation_type = req.headers.get("x-amz-invocation-type", "RequestResponse")
        if invocation_type not in ("RequestResponse", "Event", "DryRun"):
            return _error(400, "InvalidParameterValueException",
                          {"Type": "User", "message": f"Unsupported invocation type {invocation_type}"}, request_id)
        if req.body is None:
            limit = ASYNC_PAYLOAD_LIMIT if invocation_type == "Event" else SYNC_PAYLOAD_LIMIT
            operation = "InvokeAsync" if invocation_type == "Event" else "InvokeFunction"
            return _error(413, "RequestEntityTooLargeException",
                          {"Type": "User", "message": f"Request must be smaller than {limit} bytes for the "
                                                      f"{operation} operation"}, request_id)
        client_context = None
        if "x-amz-client-context" in req.headers:
            try:
                client_context = json.loads(base64.b64decode(req.headers["x-amz-client-context"]))
            except (ValueError, binascii.Error):
                return _error(400, "InvalidRequestContentException",
                              {"Type": "User", "message": "Client context must be a valid Base64-encoded JSON "
                                                          "object."}, request_id)
        if invocation_type == "DryRun":
            return 204, [("x-amzn-RequestId", request_id)], b""
        arn = self._arns.get((name, qualifier))
        if arn is None:  # cached: reading the region from the environment each time shows in profiles
            arn = self._arns[name, qualifier] = function_arn(name, qualifier)
        if invocation_type == "Event":
            return self._accept_event(pool, request_id, req.body, arn)
        return await self._run_sync(pool, request_id, req, arn, client_context)

    def _accept_event(self, pool: FunctionPool, request_id: str, payload: bytes, arn: str) -> Response:
        try:
            if payload.strip():
                json.loads(payload)  # AWS rejects a bad event up front, before answering 202
        except ValueError as exc:
            return _bad_json(f"Could not parse request body into json: {exc}", request_id)
        task = asyncio.get_running_loop().create_task(self._run_event(pool, request_id, payload, arn))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return 202, [("x-amzn-RequestId", request_id)], b""

    async def _run_sync(self, pool: FunctionPool, request_id: str, req: Request, arn: str,
                        client_context) -> Response:
        try:
            pool.admit()
        except Throttled:
            return _error(429, "TooManyRequestsException",
                          {"Reason": "ReservedFunctionConcurrentInvocationLimitExceeded", "Type": "User",
                           "message": "Rate Exceeded."}, request_id)
        capture = req.headers.get("x-amz-log-type") == "Tail"
        try:
            outcome = await pool.execute(request_id, req.body, arn, client_context, capture)
        finally:
            pool.leave()
        if outcome.bad_request:
            return _bad_json(outcome.body.decode(), request_id)
        return self._response(pool, request_id, outcome, capture, req)

    @staticmethod
    def _response(pool: FunctionPool, request_id: str, o: Outcome, tail: bool, req: Request) -> Response:
        headers = [_JSON, ("x-amzn-RequestId", request_id), ("X-Amz-Executed-Version", "$LATEST")]
        if o.function_error:
            headers.append(("X-Amz-Function-Error", o.function_error))
        if tail:
            report = report_line(request_id, o.duration_ms, pool.cfg.memory_mb, o.max_memory_mb, o.init_ms)
            headers.append(("X-Amz-Log-Result", log_tail_b64(request_id, o.output, report)))
        headers += [
            ("X-Nitro-Duration-Ms", f"{o.duration_ms:.3f}"),
            ("X-Nitro-Billed-Duration-Ms", str(billed_ms(o.duration_ms))),
            ("X-Nitro-Init-Duration-Ms", f"{o.init_ms or 0.0:.3f}"),
            ("X-Nitro-Cold-Start", "true" if o.init_ms is not None else "false"),
            ("X-Nitro-Queue-Ms", f"{o.queue_ms:.3f}"),
            # Time inside the endpoint, from the whole request read to the response handed to the socket.
            ("X-Nitro-Server-Ms", f"{(time.perf_counter() - req.received) * 1000:.3f}"),
            ("X-Nitro-Body-Wait-Ms", f"{req.body_wait_ms:.3f}"),
        ]
        return 200, headers, o.body

    async def _run_event(self, pool: FunctionPool, request_id: str, payload: bytes, arn: str) -> None:
        """Run an accepted event; on a function error or timeout retry it with the same request id."""
        retries = pool.cfg.async_retries
        for attempt in range(retries + 1):
            await pool.admit_async()
            try:
                outcome = await pool.execute(request_id, payload, arn, None, False)
            finally:
                pool.leave()
            if outcome.function_error is None:
                return
            log.warning("async invocation %s of %s failed (attempt %d/%d): %s", request_id, pool.cfg.name,
                        attempt + 1, retries + 1, outcome.body[:500].decode(errors="replace"))
            if attempt < retries and pool.cfg.async_retry_delay_s > 0:
                await asyncio.sleep(pool.cfg.async_retry_delay_s)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*(p.close() for p in self.pools.values()))


def _bad_json(message: str, request_id: str) -> Response:
    return _error(400, "InvalidRequestContentException", {"Type": "User", "message": message}, request_id)
