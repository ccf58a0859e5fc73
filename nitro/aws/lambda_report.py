"""Lambda-style execution log tail (START/END/REPORT lines) and its parser.

parse_report reads the REPORT line that both real AWS Lambda and the local endpoint
(nitro.local.lambda_endpoint, which writes it with these helpers) put at the end of the base64
X-Amz-Log-Result (LogType=Tail), so the scaler accounts billed time the same way in both places.
"""

from __future__ import annotations

import base64
import math
import re

LOG_TAIL_LIMIT = 4096  # X-Amz-Log-Result carries the last 4 KB of the log


def billed_ms(duration_ms: float) -> int:
    """Lambda bills whole milliseconds, rounded up, at least 1."""
    return max(1, math.ceil(duration_ms - 1e-9))


def report_line(
    request_id: str,
    duration_ms: float,
    memory_mb: int,
    max_memory_used_mb: int,
    init_ms: float | None = None,
) -> str:
    fields = [
        f"REPORT RequestId: {request_id}",
        f"Duration: {duration_ms:.2f} ms",
        f"Billed Duration: {billed_ms(duration_ms)} ms",
        f"Memory Size: {memory_mb} MB",
        f"Max Memory Used: {max_memory_used_mb} MB",
    ]
    if init_ms is not None:
        fields.append(f"Init Duration: {init_ms:.2f} ms")
    return "\t".join(fields) + "\t"


def log_tail_b64(request_id: str, function_output: str, report: str) -> str:
    """base64 of the last 4 KB of START, the function's output, END and REPORT."""
    if function_output and not function_output.endswith("\n"):
        function_output += "\n"
    text = (
        f"START RequestId: {request_id} Version: $LATEST\n"
        f"{function_output}END RequestId: {request_id}\n{report}\n"
    )
    raw = text.encode("utf-8", "replace")[-LOG_TAIL_LIMIT:]
    return base64.b64encode(raw).decode("ascii")


_FIELD = re.compile(r"(Duration|Billed Duration|Memory Size|Max Memory Used|Init Duration): ([\d.]+) (ms|MB)")
_KEYS = {
    "Duration": "duration_ms",
    "Billed Duration": "billed_ms",
    "Init Duration": "init_ms",
    "Memory Size": "memory_mb",
    "Max Memory Used": "max_memory_used_mb",
}


def parse_report(log_result_b64: str) -> dict:
    """Fields of the last REPORT line: duration_ms, billed_ms, init_ms (None when warm),
    memory_mb, max_memory_used_mb. Raises ValueError when there is no REPORT line."""
    text = base64.b64decode(log_result_b64).decode("utf-8", "replace")
    line = next((ln for ln in reversed(text.splitlines()) if ln.startswith("REPORT ")), None)
    if line is None:
        raise ValueError("no REPORT line in the log tail")
    out: dict = {"duration_ms": None, "billed_ms": None, "init_ms": None, "memory_mb": None,
                 "max_memory_used_mb": None}
    for name, value, _unit in _FIELD.findall(line):
        key = _KEYS[name]
        out[key] = float(value) if key in ("duration_ms", "init_ms") else int(float(value))
    if out["billed_ms"] is None:
        raise ValueError(f"REPORT line without Billed Duration: {line!r}")
    return out
