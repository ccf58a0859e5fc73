"""Local mode: Redis, the local Lambda endpoint and the three services as loopback processes.

`LocalSystem(state_dir).start()` brings them up in dependency order, each on a
free port with its own log in <state_dir>/logs, and waits until each answers
its health check. <state_dir>/state.json says where everything is (no secrets).
Secrets are created once per state dir, mode 0600, and reused by every later
start (a restart must not look like an attack: batches signed before it still
verify); they reach components through their environment, never their command
line: the gRPC access token (<state_dir>/token), the HMAC key (hmac.key) and the
passwords of the Redis ACL users `nitro-service` (redis.password) and
`nitro-actor` (redis-actor.password). `rotate_secrets` removes them while the
system is down. Redis keeps an append-only file in <state_dir>/redis. `stop()`
ends the components in reverse order.

`python -m nitro.local.system --state-dir DIR` is the supervisor: it runs the
system in the foreground until SIGTERM/SIGINT (`nitro up` starts it detached)
and restarts a component that exits on its own, on the same ports, with
exponential backoff within a restart budget (RestartPolicy); a component that
exhausts it stops everything.

Every child runs in its own session, so a terminal Ctrl-C reaches only the
supervisor, which then stops the children in order; and (on Linux) with a
parent-death signal, so none outlives a supervisor that is killed outright.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from urllib.parse import quote, urlparse, urlunparse

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nitro.data.codec import generate_hmac_key
from nitro.local.redis_server import (
    ACTOR_USER,
    SERVICE_USER,
    LocalRedis,
    RedisServerError,
    find_redis_server_binary,
    nitro_users,
)
from nitro.rpc import auth

log = logging.getLogger("nitro.local.system")

STATE_FILE = "state.json"
HMAC_KEY_FILE = "hmac.key"
REDIS_PASSWORD_FILE = "redis.password"  # the nitro-service ACL user's
REDIS_ACTOR_PASSWORD_FILE = "redis-actor.password"
TOKEN_FILE = "token"
SECRET_FILES = (HMAC_KEY_FILE, REDIS_PASSWORD_FILE, REDIS_ACTOR_PASSWORD_FILE, TOKEN_FILE)
SUPERVISOR_LOG = "supervisor.log"
LOCK_FILE = "lock"
COMPONENTS = ("redis", "lambda", "detector", "scaler", "learner")
SERVICES = ("detector", "scaler", "learner")
ACTOR_FUNCTION = "nitro-actor=actor_fn.handler.handler"
LEARNER_FUNCTION = "nitro-learner=actor_fn.learner_handler.handler"  # learner_mode "stellaris"
# The learner finishes or checkpoints its round in flight when told to stop.
STOP_GRACE_S = {"learner": 60.0}
DEFAULT_STOP_GRACE_S = 20.0

# Runs between fork and the real program: new session, SIGTERM when the parent dies, exec.
_SHIM = """import os, sys
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


@dataclass(frozen=True)
class RestartPolicy:
    """When the supervisor restarts a component that exited on its own (like Kubernetes' crash-loop
    backoff or compose's `restart: on-failure`): after first_delay_s, doubling with every restart in
    the last window_s seconds up to max_delay_s; the (max_restarts + 1)-th exit within window_s stops
    everything. The first delays stay well inside the learner's Redis patience (rounds.REDIS_PATIENCE_S)."""

    max_restarts: int = 5
    window_s: float = 600.0
    first_delay_s: float = 0.5
    max_delay_s: float = 30.0


def restart_delay(policy: RestartPolicy, restarts: Sequence[float], now: float) -> float | None:
    """Seconds to wait before restarting a component that just exited, or None when its restart budget
    is spent. `restarts`: the times (same clock as `now`) of its earlier restarts."""
    recent = sum(1 for t in restarts if now - t < policy.window_s)
    if recent >= policy.max_restarts:
        return None
    return min(policy.max_delay_s, policy.first_delay_s * 2 ** recent)


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


class LocalSystemError(RuntimeError):
    """A component could not be started, or the system is already up."""


class StartupAborted(LocalSystemError):
    """stop was requested while the system was starting."""


@dataclass
class Component:
    name: str
    pid: int
    address: str
    log: str
    url: str = ""
    metrics_port: int | None = None
    metrics_url: str = ""
    start_time: str | None = None  # from /proc: tells our process from a reused pid
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "proc"}


# --- small OS helpers -------------------------------------------------------------------


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


def write_secret(path: Path, value: str) -> None:
    """Mode 0600 from the first byte: never readable by others, even briefly."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")


def load_or_create_secret(path: Path, generate: Callable[[], str]) -> str:
    """The secret kept in `path`, created by `generate` (mode 0600) when there is none yet.

    A file others may read is refused rather than used: it may have leaked."""
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        value = generate()
        write_secret(path, value)
        return value
    if mode & 0o077:
        raise LocalSystemError(f"{path} is readable by other users (mode {mode:o}): remove it for a new secret "
                               f"(`nitro up --rotate-secrets`), or `chmod 600 {path}` if it never leaked")
    value = path.read_text().strip()
    if not value:
        raise LocalSystemError(f"{path} is empty: remove it (`nitro up --rotate-secrets`) for a new secret")
    return value


def rotate_secrets(state_dir: str | os.PathLike) -> list[str]:
    """Remove the state dir's secrets so that the next start creates new ones; only while nothing runs.

    Batches signed with the old HMAC key and not yet consumed are then rejected (bad_signature)."""
    if running_state(state_dir) is not None or lock_held(state_dir):
        raise LocalSystemError(f"a local system is up in {state_dir}: `nitro down` before rotating its secrets")
    removed = []
    for name in SECRET_FILES:
        path = Path(state_dir) / name
        if path.exists():
            path.unlink()
            removed.append(name)
    return removed


def _repo_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


# --- health probes (also used by `nitro status`) -------------------------------------------


def grpc_health(address: str, timeout: float = 2.0) -> str:
    """SERVING, NOT_SERVING, SERVICE_UNKNOWN or 'unreachable'."""
    try:
        with grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)]) as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    except grpc.RpcError:
        return "unreachable"


def http_health(url: str, timeout: float = 2.0) -> str:
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
        with opener.open(f"{url}/healthz", timeout=timeout) as resp:
            return "SERVING" if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except OSError:
        return "unreachable"


def redis_health(url: str, password: str | None, timeout: float = 2.0) -> str:
    """`url` may name the user (redis://user@host:port/0); the password comes separately."""
    import redis

    client = redis.Redis.from_url(url, password=password, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return "SERVING" if client.ping() else "NOT_SERVING"
    except redis.AuthenticationError:
        return "NOT_SERVING (authentication failed)"
    except redis.RedisError:
        return "unreachable"
    finally:
        client.close()


def probe(name: str, comp: dict, state_dir: str | os.PathLike) -> str:
    if name == "redis":
        pw_file = Path(state_dir) / REDIS_PASSWORD_FILE
        password = pw_file.read_text().strip() if pw_file.exists() else None
        return redis_health(comp["url"], password)
    if name == "lambda":
        return http_health(comp["url"])
    return grpc_health(comp["address"])


def _with_user(url: str, user: str) -> str:
    """url with `user@` as its user name (kept if it already names one; never a password)."""
    parsed = urlparse(url)
    if parsed.username:
        return url
    return urlunparse(parsed._replace(netloc=f"{quote(user, safe='')}@{parsed.netloc}"))


# --- the system ---------------------------------------------------------------------------


class LocalSystem:
    """Start/stop the whole local deployment. Use from the main thread (parent-death signal)."""

    def __init__(self, state_dir: str | os.PathLike = ".nitro", ports: dict[str, int] | None = None, *,
                 concurrency: int = 64, actor_timeout_s: float = 60.0, actor_memory_mb: int = 1024,
                 startup_timeout_s: float = 180.0, python: str = sys.executable,
                 lambda_backend: str = "local", actor_redis_url: str | None = None, aws_region: str | None = None,
                 hmac_key: str | None = None, redis_password: str | None = None, redis_bind: str = "127.0.0.1",
                 restart_policy: RestartPolicy = RestartPolicy()):
        """lambda_backend "aws": no local endpoint; the scaler invokes the deployed functions through
        boto3's standard endpoint and credentials. The functions reach Redis at actor_redis_url (no
        password in it) as the restricted actor user with redis_password (their NITRO_REDIS_PASSWORD),
        and sign with hmac_key (their NITRO_HMAC_KEY); redis_bind opens Redis beyond loopback.
        restart_policy: what `supervise` does when a component exits on its own."""
        if lambda_backend not in ("local", "aws"):
            raise LocalSystemError(f"lambda_backend must be 'local' or 'aws', got {lambda_backend!r}")
        if lambda_backend == "aws":
            missing = [n for n, v in (("actor_redis_url", actor_redis_url), ("hmac_key", hmac_key),
                                      ("redis_password", redis_password)) if not v]
            if missing:
                raise LocalSystemError(f"lambda_backend 'aws' needs {', '.join(missing)}: the values the deployed "
                                       f"function uses")
        self.lambda_backend = lambda_backend
        self._aws = {"actor_redis_url": actor_redis_url, "region": aws_region, "hmac_key": hmac_key,
                     "redis_password": redis_password} if lambda_backend == "aws" else None
        self.redis_bind = redis_bind
        self.state_dir = Path(state_dir).resolve()
        self.logs_dir = self.state_dir / "logs"
        self.data_dir = self.state_dir / "data"
        self.ports = dict(ports or {})
        self.concurrency = concurrency
        self.actor_timeout_s = actor_timeout_s
        self.actor_memory_mb = actor_memory_mb
        self.startup_timeout_s = startup_timeout_s
        self.python = python
        self.components: dict[str, Component] = {}
        self.hmac_key: str | None = None
        self._redis: LocalRedis | None = None
        self._redis_password: str | None = None  # nitro-service's
        self._actor_password: str | None = None
        self.token: str | None = None  # gRPC access token of this system; never print it
        self._status = "stopped"
        self._taken: set[int] = set()
        self._assigned: dict[str, int] = {}  # ports picked for this system: a restarted component keeps its own
        self.restart_policy = restart_policy
        self._restart_times: dict[str, list[float]] = {}  # monotonic
        self.restarts: dict[str, dict] = {}  # name -> {count, last_exit, last_restart_unix, restarting}
        self._launchers: dict[str, Callable[[], None]] = {}
        self._relaunches: dict[str, int] = {}
        # Plain flags, not Events: request_stop runs in signal handlers, where taking a lock can deadlock.
        self._stop_requested = False
        self._hurry = False
        self._lock = threading.Lock()
        self._lock_fd: int | None = None

    # addresses --------------------------------------------------------------------------
    @property
    def learner_address(self) -> str:
        return self.components["learner"].address

    @property
    def redis_url(self) -> str:
        """The nitro-service ACL user's URL, with its password: for code in this process only, never print it."""
        return self._redis.url

    @property
    def redis_actor_url(self) -> str:
        """The nitro-actor ACL user's URL (XADD to trajectory streams, GET policies), with its password."""
        return self._redis.url_for(ACTOR_USER)

    @property
    def state_file(self) -> Path:
        return self.state_dir / STATE_FILE

    def child_env(self) -> dict[str, str]:
        """The environment of the services: the system's HMAC key, access token and import path."""
        env = dict(os.environ)
        # Credentials from the caller's environment must not leak into the components.
        for var in ("NITRO_HMAC_KEY_FILE", "NITRO_TOKEN_FILE", "NITRO_REDIS_PASSWORD", "NITRO_REDIS_PASSWORD_FILE",
                    "NITRO_REDIS_USERNAME", "NITRO_REDIS_URL", "NITRO_LAMBDA_ENDPOINT", "NITRO_ACTOR_REDIS_URL"):
            env.pop(var, None)
        env["NITRO_HMAC_KEY"] = self.hmac_key
        env["NITRO_TOKEN"] = self.token
        # Absolute: the components run in the state dir, where a relative entry (PYTHONPATH=.) would point
        # elsewhere, and user environment modules ('module:EnvId', docs/custom-envs.md) would not import.
        user = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*user, _repo_root()]))
        env["PYTHONUNBUFFERED"] = "1"
        # Everything here is loopback: an HTTP(S) proxy from the environment must not intercept it.
        for var in ("NO_PROXY", "no_proxy"):
            env[var] = ",".join(p for p in (env.get(var), "127.0.0.1,localhost") if p)
        return env

    def actor_env(self) -> dict[str, str]:
        """The Lambda endpoint's (and so the actors') environment: no access token, the actor Redis user."""
        env = self.child_env()
        env.pop("NITRO_TOKEN")
        env["NITRO_REDIS_USERNAME"] = ACTOR_USER
        env["NITRO_REDIS_PASSWORD_FILE"] = str(self.state_dir / REDIS_ACTOR_PASSWORD_FILE)
        return env

    # lifecycle --------------------------------------------------------------------------
    def start(self) -> LocalSystem:
        if self._status != "stopped":
            return self
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._hold_lock()
        existing = read_state(self.state_dir)
        if existing and pid_alive(existing.get("supervisor_pid"), existing.get("supervisor_start_time")):
            self._release_lock()
            raise LocalSystemError(f"a local system is already up in {self.state_dir} "
                                   f"(supervisor pid {existing['supervisor_pid']}); run `nitro down` first")
        if existing:
            cleanup_stale(self.state_dir, existing)
        self._status, self._stop_requested, self._hurry = "starting", False, False
        try:
            self._start_all()
        except BaseException:
            self.stop()
            raise
        self._status = "ready"
        self._write_state()
        return self

    def _hold_lock(self) -> None:
        """One system per state dir, even when two `nitro up` race: the lock lives as long as we do."""
        fd = os.open(self.state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LocalSystemError(f"another local system is starting or running in {self.state_dir}") from None
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

    def _start_all(self) -> None:
        for d in (self.state_dir, self.logs_dir, self.data_dir):
            d.mkdir(parents=True, exist_ok=True)
        aws = self._aws or {}

        def secret(name: str, given: str | None, generate: Callable[[], str]) -> str:
            if given:  # what deployed functions were given wins over what the state dir kept
                write_secret(self.state_dir / name, given)
                return given
            return load_or_create_secret(self.state_dir / name, generate)

        self.hmac_key = secret(HMAC_KEY_FILE, aws.get("hmac_key"), generate_hmac_key)
        self.token = secret(TOKEN_FILE, None, auth.generate_token)
        self._redis_password = secret(REDIS_PASSWORD_FILE, None, lambda: secrets.token_urlsafe(24))
        # Deployed functions log in as the actor user with the password they were given.
        self._actor_password = secret(REDIS_ACTOR_PASSWORD_FILE, aws.get("redis_password"),
                                      lambda: secrets.token_urlsafe(24))

        self._start_redis()
        self._write_state()
        if self._aws:
            self._start_services(lambda_args=["--actor-redis-url", _with_user(aws["actor_redis_url"], ACTOR_USER),
                                              *(["--region", aws["region"]] if aws["region"] else [])])
            return
        actor_redis_url = self._redis.url_without_password

        def start_lambda() -> None:
            port = self._port("lambda")
            self._spawn("lambda", ["-m", "nitro.local.lambda_endpoint", "--host", "127.0.0.1", "--port", str(port),
                                   "--function", ACTOR_FUNCTION, "--function", LEARNER_FUNCTION,
                                   "--concurrency", str(self.concurrency),
                                   "--timeout", str(self.actor_timeout_s), "--memory", str(self.actor_memory_mb)],
                        base_env=self.actor_env(), address=f"127.0.0.1:{port}", url=f"http://127.0.0.1:{port}")

        self._launch("lambda", start_lambda)
        self._wait_healthy(["lambda"])
        self._start_services(lambda_args=["--lambda-endpoint", self.components["lambda"].url,
                                          "--actor-redis-url", actor_redis_url])

    def _start_services(self, lambda_args: list[str]) -> None:
        # The detector and scaler do not depend on each other: start both, then wait.
        self._launch("detector", lambda: self._spawn_service("detector", []))
        self._launch("scaler", lambda: self._spawn_service("scaler", lambda_args))
        self._wait_healthy(["detector", "scaler"])
        self._launch("learner", lambda: self._spawn_service("learner", [
            "--detector", self.components["detector"].address,
            "--scaler", self.components["scaler"].address, "--data-dir", str(self.data_dir)]))
        self._wait_healthy(["learner"])

    def _launch(self, name: str, launcher: Callable[[], None]) -> None:
        self._launchers[name] = launcher
        launcher()

    def _relaunch_after_port_clash(self, comp: Component) -> bool:
        """A picked port can be taken by someone else before the child binds it: pick new ones."""
        name = comp.name
        if any(k in self.ports for k in (name, f"{name}_metrics")) or self._relaunches.get(name, 0) >= 3:
            return False
        if "address already in use" not in log_tail(comp.log, 80).lower():
            return False
        self._relaunches[name] = self._relaunches.get(name, 0) + 1
        log.warning("%s could not bind its port; retrying on another", name)
        for key in (name, f"{name}_metrics"):
            self._assigned.pop(key, None)
        self._launchers[name]()
        return True

    def _port(self, name: str) -> int:
        """The given port, else the one picked for `name` earlier (a restart keeps its address), else a free one."""
        if name in self.ports:
            return self.ports[name]
        if name in self._assigned:
            return self._assigned[name]
        port = free_port()
        while port in self._taken:  # the OS may hand the same free port out twice
            port = free_port()
        self._taken.add(port)
        self._assigned[name] = port
        return port

    def _start_redis(self) -> None:
        self._check_abort()
        wrapper = self.state_dir / "bin" / "redis-server"
        wrapper.parent.mkdir(exist_ok=True)
        # LocalRedis launches `binary conf`: a wrapper gives redis the same session and death signal.
        wrapper.write_text("#!/bin/sh\nexec " + shlex.join([self.python, "-I", "-S", "-c", _SHIM]) + ' "$PPID" '
                           + shlex.quote(find_redis_server_binary()) + ' "$@"\n')
        wrapper.chmod(0o700)
        # AOF with fsync every second in a directory we own: a Redis restart loses at most ~1 s of writes.
        try:
            self._redis = LocalRedis(data_dir=self.state_dir / "redis", port=self.ports.get("redis"),
                                     users=nitro_users(self._redis_password, self._actor_password), appendonly=True,
                                     binary=str(wrapper), bind=self.redis_bind)
        except ValueError as exc:  # a given password or bind address Redis cannot take
            raise LocalSystemError(f"cannot configure Redis: {exc}") from None
        self._redis.start()
        self._register_redis()

    def _register_redis(self) -> None:
        pid = self._redis.pid
        self.components["redis"] = Component(
            "redis", pid, f"127.0.0.1:{self._redis.port}", str(self._redis.data_dir / "redis.log"),
            url=f"redis://{SERVICE_USER}@127.0.0.1:{self._redis.port}/0", start_time=process_start_time(pid))
        log.info("redis (pid %d) listening on %s", pid, self._redis.url_without_password)

    def _spawn_service(self, name: str, extra: list[str]) -> None:
        port, metrics_port = self._port(name), self._port(f"{name}_metrics")
        auth.remember_local_token(f"127.0.0.1:{port}", self.token)  # NitroClient in this process finds it
        # The Redis URL carries the password: pass it in the environment, never on the command line (ps).
        self._spawn(name, ["-m", f"{name}_svc", "--host", "127.0.0.1", "--port", str(port),
                           "--metrics-port", str(metrics_port), *extra],
                    env={"NITRO_REDIS_URL": self._redis.url},
                    address=f"127.0.0.1:{port}", metrics_port=metrics_port,
                    metrics_url=f"http://127.0.0.1:{metrics_port}/metrics")

    def _spawn(self, name: str, args: list[str], *, env: dict[str, str] | None = None,
               base_env: dict[str, str] | None = None, **info) -> Component:
        self._check_abort()
        log_path = self.logs_dir / f"{name}.log"
        shown = " ".join(a.replace(self._redis_password, "***") for a in args)
        with open(log_path, "ab") as out:
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} nitro local: python {shown}\n".encode())
            out.flush()
            with self._lock:  # so stop() from another thread never misses a just-started child
                proc = subprocess.Popen(
                    [self.python, "-I", "-S", "-c", _SHIM, str(os.getpid()), self.python, *args],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=self.state_dir,
                    env={**(self.child_env() if base_env is None else base_env), **(env or {})})
                comp = Component(name, proc.pid, log=str(log_path), proc=proc, **info)
                self.components[name] = comp
        comp.start_time = process_start_time(proc.pid)
        log.info("started %s (pid %d) on %s", name, proc.pid, comp.address)
        self._write_state()
        return comp

    def _check_abort(self) -> None:
        if self._stop_requested:
            raise StartupAborted("stop requested during startup")

    def _wait_healthy(self, names: list[str]) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        pending, delay = list(names), 0.2
        while pending:
            self._check_abort()
            for name in list(pending):
                comp = self.components[name]
                rc = comp.proc.poll()
                if rc is not None and self._relaunch_after_port_clash(comp):
                    continue
                if rc is not None:
                    raise LocalSystemError(f"{name} exited with code {rc} during startup; "
                                           f"last lines of {comp.log}:\n{log_tail(comp.log)}")
                port = int(comp.address.rsplit(":", 1)[1])
                if (probe(name, comp.to_dict(), self.state_dir) == "SERVING"
                        and listens_on(comp.pid, port) is not False):
                    pending.remove(name)
                    log.info("%s is healthy", name)
            if pending and time.monotonic() > deadline:
                name = pending[0]
                comp = self.components[name]
                raise LocalSystemError(f"{name} did not become healthy within {self.startup_timeout_s:.0f} s; "
                                       f"last lines of {comp.log}:\n{log_tail(comp.log)}")
            if pending:
                time.sleep(delay)
                delay = min(delay * 1.5, 1.0)

    def request_stop(self) -> None:
        """Thread- and signal-safe: ends start() or supervise(); a second request hurries stop()."""
        if self._stop_requested:
            self._hurry = True
        self._stop_requested = True

    def _exit_status(self, name: str) -> tuple[bool, int | None]:
        """(whether the component's process has ended, its exit status when known)."""
        if name == "redis":
            return not self._redis.running, self._redis.returncode
        rc = self.components[name].proc.poll()
        return rc is not None, rc

    def supervise(self, poll_s: float = 0.5) -> str | None:
        """Restart components that exit on their own, following restart_policy, until stop is requested
        (returns None) or a component exits once more than its restart budget allows (returns its name).

        A restarted component keeps its ports, so nothing that talks to it needs a new address: Redis
        comes back from its AOF with the same users, a restarted learner resumes its interrupted jobs from
        their checkpoints. Call it from the thread that started the system (parent-death signal)."""
        due: dict[str, float] = {}  # name -> monotonic time of its scheduled restart
        while not self._stop_requested:
            time.sleep(poll_s)
            for name in list(self.components):
                if self._stop_requested:
                    break
                now = time.monotonic()
                if name in due:
                    if now >= due[name]:
                        del due[name]
                        self._restart(name, now)
                    continue
                ended, rc = self._exit_status(name)
                if not ended:
                    continue
                delay = restart_delay(self.restart_policy, self._restart_times.get(name, []), now)
                info = self.restarts.setdefault(name, {"count": 0, "last_exit": "", "last_restart_unix": None,
                                                       "restarting": False})
                info["last_exit"] = describe_exit(rc)
                comp = self.components[name]
                if delay is None:
                    self._write_state()
                    return name
                info["restarting"] = True
                self._write_state()
                log.warning("%s (pid %d) exited (%s); restarting it in %.1f s (restart %d; at most %d within %.0f s). "
                            "Last lines of %s:\n%s", name, comp.pid, info["last_exit"], delay, info["count"] + 1,
                            self.restart_policy.max_restarts, self.restart_policy.window_s, comp.log,
                            log_tail(comp.log, 10))
                due[name] = now + delay
        return None

    def _restart(self, name: str, now: float) -> None:
        """Start `name` again on its ports. A failed start is logged; the next poll sees it as another exit."""
        self._restart_times.setdefault(name, []).append(now)
        info = self.restarts[name]
        info.update(count=info["count"] + 1, last_restart_unix=time.time(), restarting=False)
        try:
            if name == "redis":
                self._redis.start()  # same port, data dir (AOF) and ACL users
                self._register_redis()
            else:
                self._launchers[name]()
        except (LocalSystemError, RedisServerError, OSError) as exc:
            log.error("restarting %s failed: %s", name, exc)
        else:
            log.warning("restarted %s (pid %d, restart %d)", name, self.components[name].pid, info["count"])
        self._write_state()

    def restart_budget_message(self, name: str) -> str:
        """Why the supervisor gives up on `name`, with what to do and the end of its log."""
        info, comp, policy = self.restarts.get(name, {}), self.components[name], self.restart_policy
        budget = (f"it was restarted {info.get('count', 0)} time(s), the most allowed within {policy.window_s:.0f} s"
                  if policy.max_restarts else "restarts are off (--max-restarts 0)")
        return (f"{name} exited ({info.get('last_exit', 'unknown')}) and {budget}; stopping everything. Fix the "
                f"cause and `nitro up` again: interrupted jobs resume from their checkpoints. "
                f"Last lines of {comp.log}:\n{log_tail(comp.log)}")

    def stop(self) -> list[str]:
        """Stop every component in reverse start order (SIGTERM, then SIGKILL after a grace period)."""
        self._stop_requested = True
        with self._lock:
            names = list(self.components)
        stopped = []
        for name in reversed(names):
            comp = self.components[name]
            if name == "redis":
                self._redis.close()
                self._redis = None
            else:
                self._terminate(comp)
                auth.forget_local_token(comp.address)
            stopped.append(name)
            log.info("stopped %s (pid %d)", name, comp.pid)
        if self._redis is not None:  # started but never became a component
            self._redis.close()
            self._redis = None
        self.components.clear()
        self._status = "stopped"
        state = read_state(self.state_dir)
        if state and state.get("supervisor_pid") == os.getpid():
            self.state_file.unlink(missing_ok=True)  # the secrets stay for the next start (rotate_secrets)
        self._release_lock()
        return stopped

    def _terminate(self, comp: Component) -> None:
        proc = comp.proc
        if proc.poll() is None:
            proc.terminate()
            deadline = time.monotonic() + STOP_GRACE_S.get(comp.name, DEFAULT_STOP_GRACE_S)
            while proc.poll() is None and time.monotonic() < deadline and not self._hurry:
                time.sleep(0.05)
            if proc.poll() is None:
                log.warning("%s did not stop after SIGTERM; killing it", comp.name)
                proc.kill()
        proc.wait()

    def _write_state(self) -> None:
        comps = {n: {**c.to_dict(), "restarts": dict(self.restarts.get(n, {"count": 0}))}
                 for n, c in self.components.items()}
        state = {
            "version": 1,
            "status": self._status,
            "supervisor_pid": os.getpid(),
            "supervisor_start_time": process_start_time(os.getpid()),
            "state_dir": str(self.state_dir),
            "updated_unix": time.time(),
            "learner": comps.get("learner", {}).get("address", ""),
            "redis_url": comps.get("redis", {}).get("url", ""),
            "lambda_endpoint": comps.get("lambda", {}).get("url", ""),
            "lambda_backend": self.lambda_backend,
            "hmac_key_file": str(self.state_dir / HMAC_KEY_FILE),
            "redis_user": SERVICE_USER,
            "redis_password_file": str(self.state_dir / REDIS_PASSWORD_FILE),
            "redis_actor_password_file": str(self.state_dir / REDIS_ACTOR_PASSWORD_FILE),
            "token_file": str(self.state_dir / TOKEN_FILE),
            "components": comps,
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.state_file)

    def __enter__(self) -> LocalSystem:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --- state.json for other processes (the CLI) -------------------------------------------


def read_state(state_dir: str | os.PathLike) -> dict | None:
    try:
        return json.loads((Path(state_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def lock_held(state_dir: str | os.PathLike) -> bool:
    """True while a LocalSystem (starting or running) holds `state_dir`."""
    try:
        fd = os.open(Path(state_dir) / LOCK_FILE, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def local_target(state_dir: str | os.PathLike = ".nitro") -> str:
    """The learner address of the local system running in `state_dir` (for NitroClient)."""
    state = running_state(state_dir)
    if state is None:
        raise LocalSystemError(f"no local system is up in {state_dir}: run `nitro up`")
    return state["learner"]


def local_token(state_dir: str | os.PathLike = ".nitro") -> str | None:
    """The access token of the local system in `state_dir` (None when it is not up)."""
    if running_state(state_dir) is None:
        return None
    try:
        return (Path(state_dir) / TOKEN_FILE).read_text().strip() or None
    except OSError:
        return None


def running_state(state_dir: str | os.PathLike) -> dict | None:
    """state.json if its supervisor is alive, else None."""
    state = read_state(state_dir)
    if state and pid_alive(state.get("supervisor_pid"), state.get("supervisor_start_time")):
        return state
    return None


def _kill_leftovers(state: dict, sig: int) -> list[str]:
    hit = []
    for name, comp in reversed(list(state.get("components", {}).items())):
        if pid_alive(comp.get("pid"), comp.get("start_time")):
            with contextlib.suppress(ProcessLookupError):
                os.kill(comp["pid"], sig)
            hit.append(name)
    return hit


def cleanup_stale(state_dir: str | os.PathLike, state: dict) -> list[str]:
    """The supervisor died without cleaning up: kill what it left and forget it (its secrets stay)."""
    left = _kill_leftovers(state, signal.SIGKILL)
    (Path(state_dir) / STATE_FILE).unlink(missing_ok=True)
    return left


def shutdown(state_dir: str | os.PathLike, timeout_s: float = 150.0) -> list[str] | None:
    """SIGTERM the supervisor and wait until it and every component are gone.

    Returns the names of what was running, or None if nothing was up. Anything
    still alive after `timeout_s` is killed.
    """
    state = read_state(state_dir)
    if state is None:
        return None
    pid, start = state.get("supervisor_pid"), state.get("supervisor_start_time")
    if not pid_alive(pid, start):
        left = cleanup_stale(state_dir, state)
        return left or None
    running = [n for n, c in state.get("components", {}).items() if pid_alive(c.get("pid"), c.get("start_time"))]
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    comps = state.get("components", {}).values()
    while time.monotonic() < deadline:
        if not pid_alive(pid, start) and not any(pid_alive(c.get("pid"), c.get("start_time")) for c in comps):
            break
        time.sleep(0.2)
    else:
        with contextlib.suppress(ProcessLookupError):
            if pid_alive(pid, start):
                os.kill(pid, signal.SIGKILL)
        _kill_leftovers(state, signal.SIGKILL)
    if (Path(state_dir) / STATE_FILE).exists() and not pid_alive(pid, start):
        cleanup_stale(state_dir, state)
    return list(reversed(running)) + ["supervisor"]


def last_failure(state_dir: str | os.PathLike) -> str | None:
    """The supervisor's last error line (why it stopped everything), if its log ends with one."""
    try:
        lines = (Path(state_dir) / "logs" / SUPERVISOR_LOG).read_text(errors="replace").splitlines()
    except OSError:
        return None
    starts = [i for i, line in enumerate(lines) if " supervisor " in line]
    errors = [i for i in starts if " supervisor ERROR: " in lines[i]]
    if not errors or any(" local system ready" in lines[i] for i in starts if i > errors[-1]):
        return None
    return lines[errors[-1]].split(" supervisor ERROR: ", 1)[1]


def spawn_supervisor(state_dir: str | os.PathLike, args: list[str] = ()) -> subprocess.Popen:
    """Start `python -m nitro.local.system` detached (own session), logging to <state_dir>/logs."""
    logs = Path(state_dir).resolve() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / SUPERVISOR_LOG, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "nitro.local.system", "--state-dir", str(state_dir), *args],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def wait_until_ready(state_dir: str | os.PathLike, proc: subprocess.Popen, timeout_s: float = 600.0) -> dict:
    """Wait for a spawned supervisor to report "ready"; on failure stop it and raise with its log."""
    deadline = time.monotonic() + timeout_s
    supervisor_log = Path(state_dir) / "logs" / SUPERVISOR_LOG
    while True:
        state = read_state(state_dir)
        if state and state.get("supervisor_pid") == proc.pid and state.get("status") == "ready":
            return state
        rc = proc.poll()
        if rc is not None:
            raise LocalSystemError(f"the local system failed to start (exit code {rc}); "
                                   f"last lines of {supervisor_log}:\n{log_tail(supervisor_log, 40)}")
        if time.monotonic() > deadline:
            proc.terminate()
            proc.wait()
            raise LocalSystemError(f"the local system was not ready within {timeout_s:.0f} s; "
                                   f"last lines of {supervisor_log}:\n{log_tail(supervisor_log, 40)}")
        time.sleep(0.25)


# --- the supervisor ---------------------------------------------------------------------


def run_foreground(system: LocalSystem, on_ready=None) -> int:
    """Start, run until SIGTERM/SIGINT or a component dies, stop. Returns an exit code."""
    old = {s: signal.signal(s, lambda *_: system.request_stop()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        system.start()
        log.info("local system ready; learner at %s", system.learner_address)
        if on_ready:
            on_ready(system)
        dead = system.supervise()
        if dead:
            log.error("%s", system.restart_budget_message(dead))
            return 1
        return 0
    except StartupAborted:
        log.info("startup interrupted")
        return 130
    except LocalSystemError as exc:
        log.error("%s", exc)
        return 1
    finally:
        system.stop()
        for s, h in old.items():
            signal.signal(s, h)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nitro.local.system",
                                description="Run the local Nitro system in the foreground until SIGTERM/SIGINT.")
    p.add_argument("--state-dir", default=".nitro")
    p.add_argument("--concurrency", type=int, default=64, help="actor function concurrency limit")
    p.add_argument("--startup-timeout", type=float, default=180.0, help="seconds each component may take")
    p.add_argument("--learner-port", type=int, default=None, help="learner gRPC port (default: any free one)")
    add_restart_args(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s supervisor %(levelname)s: %(message)s")
    ports = {"learner": args.learner_port} if args.learner_port else None
    system = LocalSystem(args.state_dir, ports, concurrency=args.concurrency, startup_timeout_s=args.startup_timeout,
                         restart_policy=restart_policy_from_args(args))
    return run_foreground(system)


def add_restart_args(p: argparse.ArgumentParser) -> None:
    """The restart policy's flags (`nitro up` and the supervisor share them)."""
    def bounded(kind, low: float, strict: bool):
        def parse(text: str):
            value = kind(text)
            if value < low or (strict and value == low):
                raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {low:g}, got {text}")
            return value
        return parse

    d = RestartPolicy()
    p.add_argument("--max-restarts", type=bounded(int, 0, False), default=d.max_restarts, metavar="N",
                   help="restarts of one component allowed within --restart-window before everything stops; "
                        "0: stop everything when any component exits (default: %(default)s)")
    p.add_argument("--restart-window", type=bounded(float, 0, True), default=d.window_s, metavar="SECONDS",
                   help="the window of --max-restarts (default: %(default)s)")


def restart_policy_from_args(args) -> RestartPolicy:
    return RestartPolicy(max_restarts=args.max_restarts, window_s=args.restart_window)


def restart_args(args) -> list[str]:
    """The supervisor's command-line flags for the restart policy in `args`."""
    return ["--max-restarts", str(args.max_restarts), "--restart-window", str(args.restart_window)]


if __name__ == "__main__":
    sys.exit(main())
