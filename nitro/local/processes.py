"""Process helpers of the local system: free ports, whether a recorded pid is still our process, who
listens on a port, log tails, exit descriptions, and the shim every child is started through.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from pathlib import Path

# Runs between fork and the real program: new session, SIGTERM when the parent dies, exec.
CHILD_SHIM = """import os, sys
try:
    os.setsid()
except OSError:
    pass
try:
    import ctypes, signal
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    os._exit(70)  # the parent died before the death signal was armed
os.execvp(sys.argv[2], sys.argv[2:])
"""


def describe_exit(returncode: int | None) -> str:
    """'signal SIGKILL', 'exit code 1', or 'did not start' (no exit status)."""
    if returncode is None:
        return "did not start"
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_start_time(pid: int) -> str | None:
    """Start time in clock ticks since boot (Linux), None where /proc is unavailable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else fields[19]


def pid_alive(pid: int | None, start_time: str | None = None) -> bool:
    """True if `pid` runs and (when known) is the same process that was recorded."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return start_time is None
    if Path("/proc/self/stat").exists():
        now = process_start_time(pid)
        return now is not None and (start_time is None or now == start_time)
    return True


def listens_on(pid: int, port: int) -> bool | None:
    """Whether `pid` holds a socket listening on TCP `port` (None where /proc cannot tell).

    A health answer on a port proves nothing by itself: another process may hold
    that port (ours then fails to bind), and its health must not pass for ours.
    """
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{cols[9]}]")
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
    return False


def log_tail(path: str | os.PathLike, lines: int = 25) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"
