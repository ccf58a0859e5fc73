"""A small HTTP/1.1 server on asyncio streams: keep-alive, Content-Length bodies only.

That is all boto3 (urllib3) sends, and a hand-rolled loop costs far less per request than
http.server's thread-per-connection design when 64 keep-alive connections share two cores.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, Protocol

log = logging.getLogger("nitro.local.lambda_endpoint")

_REASONS = {200: "OK", 202: "Accepted", 204: "No Content", 400: "Bad Request", 404: "Not Found",
            405: "Method Not Allowed", 411: "Length Required", 413: "Request Entity Too Large",
            429: "Too Many Requests", 500: "Internal Server Error"}
_MAX_HEAD = 64 * 1024
_MAX_DRAIN = 64 * 1024 * 1024  # beyond this an oversized body is not read, the connection is closed


class Request:
    __slots__ = ("method", "path", "query", "headers", "body", "received", "body_wait_ms")

    def __init__(self, method: str, path: str, query: str, headers: dict[str, str], body: bytes | None,
                 received: float, body_wait_ms: float) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers  # lower-cased names
        self.body = body        # None when it exceeded the app's body limit (and was discarded)
        self.received = received  # perf_counter once the whole request had been read
        # Head read -> body read. urllib3 2 sends the head and the body in two send() calls, and a
        # client thread that loses its GIL in between delays the body: client time, not ours.
        self.body_wait_ms = body_wait_ms


Response = tuple[int, list[tuple[str, str]], bytes]


class App(Protocol):
    def body_limit(self, method: str, path: str, headers: dict[str, str]) -> int: ...
    def handle(self, request: Request) -> Awaitable[Response]: ...


def _encode(status: int, headers: list[tuple[str, str]], body: bytes, close: bool) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers]
    if close:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if len(body) < 65536 else head  # large bodies go out without a copy


async def _drain_body(reader: asyncio.StreamReader, n: int) -> None:
    while n > 0:
        chunk = await reader.read(min(n, 1 << 20))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", n)
        n -= len(chunk)


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str], bool]:
    """-> method, path, query, lower-cased headers, whether to close after the response."""
    request_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
    method, target, version = request_line.split(" ", 2)
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    connection = headers.get("connection", "").lower()
    close = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
    path, _, query = target.partition("?")
    return method, path, query, headers, close


def connection_handler(app: App) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return  # the client closed its keep-alive connection
                head_read = time.perf_counter()
                method, path, query, headers, close = _parse_head(head)
                if "chunked" in headers.get("transfer-encoding", ""):
                    writer.write(_encode(411, [], b"", True))
                    return
                length = int(headers.get("content-length") or 0)
                if headers.get("expect", "").lower() == "100-continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                if length > app.body_limit(method, path, headers):
                    if length > _MAX_DRAIN:
                        close = True
                    else:
                        await _drain_body(reader, length)  # answering mid-upload would reset the socket
                    body = None
                else:
                    body = await reader.readexactly(length) if length else b""
                received = time.perf_counter()
                try:
                    status, out_headers, out_body = await app.handle(
                        Request(method, path, query, headers, body, received, (received - head_read) * 1000))
                except Exception:
                    log.exception("error while handling %s %s", method, path)
                    status, out_headers, out_body = 500, [], b"internal error"
                writer.write(_encode(status, out_headers, out_body, close))
                if len(out_body) >= 65536:
                    writer.write(out_body)
                if writer.transport.get_write_buffer_size() > 1 << 20:
                    await writer.drain()
                if close:
                    return
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            return  # malformed or vanished client: drop the connection
        except asyncio.CancelledError:
            return  # shutdown; returning (not re-raising) keeps 3.11's stream callback quiet
        finally:
            writer.close()

    return serve


async def start_server(app: App, host: str, port: int) -> asyncio.base_events.Server:
    return await asyncio.start_server(connection_handler(app), host, port, limit=_MAX_HEAD, backlog=1024)
