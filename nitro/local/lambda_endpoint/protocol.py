"""Framing on the persistent pipes between the endpoint and its worker processes.

A frame is a 4-byte big-endian length followed by a pickled tuple. Both ends are this
package's own processes, so pickle is safe here and is the cheapest codec for bytes.
"""

from __future__ import annotations

import os
import pickle
import struct

_LEN = struct.Struct("!I")

# Worker -> endpoint message kinds.
READY = "ready"            # (READY,)
INIT_ERROR = "init_error"  # (INIT_ERROR, error_type, message)
RESULT = "result"          # (RESULT, status, body, duration_ms, max_memory_mb, output)

# RESULT statuses.
OK = "ok"
FUNCTION_ERROR = "function_error"  # body is the Lambda error JSON
BAD_REQUEST = "bad_request"        # the payload was not JSON; body is a message


def encode(msg: tuple) -> bytes:
    data = pickle.dumps(msg, protocol=5)
    return _LEN.pack(len(data)) + data


def split_frames(buf: bytearray) -> list[tuple]:
    """Remove every complete frame from buf and return the decoded messages."""
    out = []
    pos = 0
    with memoryview(buf) as view:  # released before buf is resized below
        while len(buf) - pos >= 4:
            (n,) = _LEN.unpack_from(buf, pos)
            if len(buf) - pos - 4 < n:
                break
            out.append(pickle.loads(view[pos + 4:pos + 4 + n]))
            pos += 4 + n
    if pos:
        del buf[:pos]
    return out


def write_frame(fd: int, msg: tuple) -> None:
    data = memoryview(encode(msg))
    while data:
        data = data[os.write(fd, data):]


def read_frame(f) -> tuple | None:
    """Blocking read of one frame from a binary file; None at end of file."""
    head = f.read(4)
    if len(head) < 4:
        return None
    (n,) = _LEN.unpack(head)
    data = f.read(n)
    if len(data) < n:
        return None
    return pickle.loads(data)
