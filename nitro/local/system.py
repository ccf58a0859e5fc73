"""Local mode: Redis, the local Lambda endpoint and the three services as loopback processes.

`LocalSystem(state_dir).start()` brings them up, Redis first and the rest
together, each on a free port with its own log in <state_dir>/logs, and waits
until each answers its health check. <state_dir>/state.json says where everything is (no secrets).
Secrets are created once per state dir, mode 0600, and reused by every later
start (a restart must not look like an attack: batches signed before it still
verify); they reach components through their environment, never their command
line: the gRPC access token (<state_dir>/token), the master HMAC key (hmac.key) and the
passwords of the Redis ACL users `nitro-service` (redis.password, the learner and
detector) and `nitro-scaler` (redis-scaler.password, the scaler, which creates each
job's own user for its functions) (nitro.local.secret_files). The Lambda endpoint and
its functions get none of them: each invocation's event carries what it needs;
`system_state.rotate_secrets` removes them while the system is down. Redis keeps an append-only file in <state_dir>/redis. `stop()`
ends the components in reverse order (the detector and scaler together).

`python -m nitro.local.supervisor --state-dir DIR` runs the system in the
foreground until SIGTERM/SIGINT (`nitro up` starts it detached); LocalSystem
restarts a component that exits on its own, on the same ports, with exponential
backoff within a restart budget (nitro.local.restarts); a component that
exhausts it stops everything.

Every child runs in its own session, so a terminal Ctrl-C reaches only the
supervisor, which then stops the children in order; and (on Linux) with a
parent-death signal, so none outlives a supervisor that is killed outright.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from nitro.contracts import DEFAULT_ACTOR_MEMORY_MB
from nitro.data.codec import generate_hmac_key
from nitro.errors import LocalSystemError, StartupAborted
from nitro.local import monitoring as local_monitoring
from nitro.local.health import probe
from nitro.local.processes import (
    CHILD_SHIM,
    describe_exit,
    free_port,
    listens_on,
    log_tail,
    pid_alive,
    process_start_time,
)
from nitro.local.redis_server import (
    SCALER_USER,
    SERVICE_USER,
    LocalRedis,
    RedisServerError,
    find_redis_server_binary,
    nitro_users,
)
from nitro.local.restarts import RestartPolicy, restart_delay
from nitro.local.secret_files import (
    HMAC_KEY_FILE,
    REDIS_PASSWORD_FILE,
    REDIS_SCALER_PASSWORD_FILE,
    RETIRED_ACTOR_PASSWORD_FILE,
    TOKEN_FILE,
    load_or_create_secret,
    write_secret,
)
from nitro.local.system_state import LOCK_FILE, STATE_FILE, cleanup_stale, read_state
from nitro.rpc import auth

log = logging.getLogger("nitro.local.system")


COMPONENTS = ("redis", "lambda", "detector", "scaler", "learner")


SERVICES = ("detector", "scaler", "learner")


ACTOR_FUNCTION = "nitro-actor=actor_fn.handler.handler"


LEARNER_FUNCTION = "nitro-learner=actor_fn.learner_handler.handler"  # learner_mode "stellaris"


# The learner finishes or checkpoints its round in flight when told to stop.
STOP_GRACE_S = {"learner": 60.0}


DEFAULT_STOP_GRACE_S = 20.0


# Stopped at the same time (stop() is otherwise one component after another, in reverse start order): the
# detector and the scaler need nothing of each other, and a stop waits on each for a second or more.
STOP_TOGETHER = frozenset({"detector", "scaler"})


# Startup polls a starting component's health this often at most: a probe costs a few milliseconds, and a
# longer wait only delays the start.
HEALTH_POLL_MAX_S = 0.25


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


def _repo_root() -> str:
    """The directory that holds the nitro package (and learner_svc, ...): on the components' PYTHONPATH it makes
    them run this tree's code, not whatever an editable install of another checkout points at."""
    return str(Path(__file__).resolve().parents[2])


class LocalSystem:
    """Start/stop the whole local deployment. Use from the main thread (parent-death signal)."""

    def __init__(self, state_dir: str | os.PathLike = ".nitro", ports: dict[str, int] | None = None, *,
                 concurrency: int = 64, actor_timeout_s: float = 60.0, actor_memory_mb: int = DEFAULT_ACTOR_MEMORY_MB,
                 startup_timeout_s: float = 180.0, python: str = sys.executable,
                 lambda_backend: str = "local", actor_redis_url: str | None = None, aws_region: str | None = None,
                 redis_bind: str = "127.0.0.1",
                 restart_policy: RestartPolicy = RestartPolicy(), resume_jobs: bool | None = None,
                 monitoring: bool = False):
        """lambda_backend "aws": no local endpoint; the scaler invokes the deployed functions through
        boto3's standard endpoint and credentials. The functions reach Redis at actor_redis_url (any user or
        password in it is dropped) as their job's own user, with the password and keys their events carry: a
        deployed function needs no secret of its own; redis_bind opens Redis beyond loopback.
        restart_policy: what `supervise` does when a component exits on its own.
        resume_jobs False: the learner never resumes the jobs a killed learner left running (they wait for
        `nitro train --resume`); for a caller that redoes a cut-short job itself, such as the protocol's
        grids, where a resumed twin would share the cores and the actor concurrency with the rerun. None
        (default): the learner's own default, `NITRO_RESUME_JOBS` (resume unless it is 0).
        monitoring: also run a Prometheus (the `prometheus` binary on PATH) that scrapes the services through
        the target file every start writes (nitro.local.monitoring), with deploy/monitoring/alerts.yml."""
        if lambda_backend not in ("local", "aws"):
            raise LocalSystemError(f"lambda_backend must be 'local' or 'aws', got {lambda_backend!r}")
        if lambda_backend == "aws" and not actor_redis_url:
            raise LocalSystemError("lambda_backend 'aws' needs actor_redis_url: Redis as the deployed functions "
                                   "reach it")
        self.lambda_backend = lambda_backend
        self._aws = {"actor_redis_url": actor_redis_url, "region": aws_region} if lambda_backend == "aws" else None
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
        self._scaler_password: str | None = None  # nitro-scaler's
        self.token: str | None = None  # gRPC access token of this system; never print it
        self._status = "stopped"
        self._taken: set[int] = set()
        self._assigned: dict[str, int] = {}  # ports picked for this system: a restarted component keeps its own
        self.restart_policy = restart_policy
        self.resume_jobs = resume_jobs
        self.monitoring = monitoring
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
        """The Lambda endpoint's (and so the functions') environment: no secret at all (no access token, no HMAC
        key, no Redis password); each invocation's event carries its job's Redis user and its keys."""
        env = self.child_env()
        env.pop("NITRO_TOKEN")
        env.pop("NITRO_HMAC_KEY")
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
        if self.monitoring and local_monitoring.find_prometheus() is None:
            self._release_lock()
            raise LocalSystemError(local_monitoring.no_binary_message(self.state_dir))
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

        self.hmac_key = secret(HMAC_KEY_FILE, None, generate_hmac_key)
        self.token = secret(TOKEN_FILE, None, auth.generate_token)
        self._redis_password = secret(REDIS_PASSWORD_FILE, None, lambda: secrets.token_urlsafe(24))
        self._scaler_password = secret(REDIS_SCALER_PASSWORD_FILE, None, lambda: secrets.token_urlsafe(24))
        # The shared actor user of earlier releases is gone (each job has its own): so is its password.
        (self.state_dir / RETIRED_ACTOR_PASSWORD_FILE).unlink(missing_ok=True)

        self._start_redis()
        self._write_state()
        if self._aws:
            self._start_services(lambda: ["--actor-redis-url", aws["actor_redis_url"],
                                          *(["--region", aws["region"]] if aws["region"] else [])])
            self._start_monitoring()
            return
        actor_redis_url = self._redis.url_without_password

        def start_lambda() -> None:
            port = self._port("lambda")
            self._spawn("lambda", ["-m", "nitro.local.lambda_endpoint", "--host", "127.0.0.1", "--port", str(port),
                                   "--function", ACTOR_FUNCTION, "--function", LEARNER_FUNCTION,
                                   "--concurrency", str(self.concurrency),
                                   "--timeout", str(self.actor_timeout_s), "--memory", str(self.actor_memory_mb)],
                        base_env=self.actor_env(), address=f"127.0.0.1:{port}", url=f"http://127.0.0.1:{port}")

        # The endpoint starts beside the services, not before them: the scaler calls it only when a job launches
        # actors, and no job starts before start() returns, once all four are healthy.
        self._launch("lambda", start_lambda)
        self._start_services(lambda: ["--lambda-endpoint", self.components["lambda"].url,
                                      "--actor-redis-url", actor_redis_url], with_endpoint=True)
        self._start_monitoring()

    def _start_monitoring(self) -> None:
        """With monitoring: Prometheus last, once the target file names every service's metrics port."""
        if not self.monitoring:
            return

        def start_prometheus() -> None:
            binary = local_monitoring.find_prometheus()
            if binary is None:
                raise LocalSystemError(local_monitoring.no_binary_message(self.state_dir))
            _, rules = local_monitoring.write_config(self.state_dir)
            if rules is None:
                log.warning("no deploy/monitoring/alerts.yml beside the package: Prometheus runs without nitro's "
                            "alert rules")
            port = self._port("prometheus")
            self._spawn("prometheus", local_monitoring.prometheus_args(self.state_dir, port), program=binary,
                        address=f"127.0.0.1:{port}", url=f"http://127.0.0.1:{port}")

        self._launch("prometheus", start_prometheus)
        self._wait_healthy(["prometheus"])

    def _start_services(self, lambda_args: Callable[[], list[str]], with_endpoint: bool = False) -> None:
        """lambda_args: the scaler's arguments that say where the functions are, read at each (re)start.
        with_endpoint: the Lambda endpoint was just launched; wait for it too."""
        # All three at once: the learner dials the detector and scaler only when a job calls them (retrying
        # while they come up), so it imports torch while they start. One that had to move to another port (a
        # port clash) takes the learner along: it starts again with the new address. An endpoint that moved
        # takes the scaler along.
        given: dict[str, list[str]] = {}

        def start_scaler() -> None:
            given["scaler"] = lambda_args()
            self._spawn_service("scaler", given["scaler"])

        self._launch("detector", lambda: self._spawn_service("detector", []))
        self._launch("scaler", start_scaler)
        peers = self._learner_peers()
        self._launch("learner", lambda: self._spawn_service("learner", self._learner_args()))
        self._wait_healthy([*(["lambda"] if with_endpoint else []), "detector", "scaler", "learner"])
        if lambda_args() != given["scaler"]:
            log.warning("the Lambda endpoint moved to another port; restarting the scaler with its address")
            self._terminate(self.components["scaler"])
            self._launchers["scaler"]()
            self._wait_healthy(["scaler"])
        if self._learner_peers() != peers:
            log.warning("the detector or scaler moved to another port; restarting the learner with its address")
            self._terminate(self.components["learner"])
            self._launchers["learner"]()
            self._wait_healthy(["learner"])

    def _learner_peers(self) -> tuple[str, str]:
        return self.components["detector"].address, self.components["scaler"].address

    def _learner_args(self) -> list[str]:
        return ["--detector", self.components["detector"].address, "--scaler", self.components["scaler"].address,
                "--data-dir", str(self.data_dir),
                *([] if self.resume_jobs is None else ["--resume-jobs" if self.resume_jobs else "--no-resume-jobs"])]

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
        wrapper.write_text("#!/bin/sh\nexec " + shlex.join([self.python, "-I", "-S", "-c", CHILD_SHIM]) + ' "$PPID" '
                           + shlex.quote(find_redis_server_binary()) + ' "$@"\n')
        wrapper.chmod(0o700)
        # AOF with fsync every second in a directory we own: a Redis restart loses at most ~1 s of writes.
        try:
            self._redis = LocalRedis(data_dir=self.state_dir / "redis", port=self.ports.get("redis"),
                                     users=nitro_users(self._redis_password, self._scaler_password), appendonly=True,
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
                    # The scaler logs in as nitro-scaler, the only user that may create and delete the job users.
                    env={"NITRO_REDIS_URL": self._redis.url_for(SCALER_USER) if name == "scaler" else self._redis.url},
                    address=f"127.0.0.1:{port}", metrics_port=metrics_port,
                    metrics_url=f"http://127.0.0.1:{metrics_port}/metrics")

    def _spawn(self, name: str, args: list[str], *, env: dict[str, str] | None = None,
               base_env: dict[str, str] | None = None, program: str | None = None, **info) -> Component:
        self._check_abort()
        program = program or self.python
        log_path = self.logs_dir / f"{name}.log"
        shown = " ".join(a.replace(self._redis_password, "***") for a in args)
        with open(log_path, "ab") as out:
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} nitro local: "
                      f"{'python' if program == self.python else program} {shown}\n".encode())
            out.flush()
            with self._lock:  # so stop() from another thread never misses a just-started child
                proc = subprocess.Popen(
                    [self.python, "-I", "-S", "-c", CHILD_SHIM, str(os.getpid()), program, *args],
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
        pending, delay = list(names), min(0.2, HEALTH_POLL_MAX_S)
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
                delay = min(delay * 1.5, HEALTH_POLL_MAX_S)

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
        """Stop every component in reverse start order (SIGTERM, then SIGKILL after a grace period); the
        components of STOP_TOGETHER at the same time."""
        self._stop_requested = True
        with self._lock:
            names = list(self.components)
        stages: list[list[str]] = []
        for name in reversed(names):
            if stages and name in STOP_TOGETHER and stages[-1][-1] in STOP_TOGETHER:
                stages[-1].append(name)
            else:
                stages.append([name])
        stopped = []
        for stage in stages:
            comps = [self.components[name] for name in stage]
            if stage == ["redis"]:
                self._redis.close()
                self._redis = None
            else:
                self._terminate(*comps)
            for comp in comps:
                if comp.name != "redis":
                    auth.forget_local_token(comp.address)
                stopped.append(comp.name)
                log.info("stopped %s (pid %d)", comp.name, comp.pid)
        if self._redis is not None:  # started but never became a component
            self._redis.close()
            self._redis = None
        self.components.clear()
        self._status = "stopped"
        if self.state_dir.is_dir():
            local_monitoring.write_targets(self.state_dir, [])  # a Prometheus still reading it scrapes nothing
        state = read_state(self.state_dir)
        if state and state.get("supervisor_pid") == os.getpid():
            self.state_file.unlink(missing_ok=True)  # the secrets stay for the next start (rotate_secrets)
        self._release_lock()
        return stopped

    def _terminate(self, *comps: Component) -> None:
        """SIGTERM to each at once; SIGKILL to any still running after its grace period."""
        running = [comp for comp in comps if comp.proc.poll() is None]
        for comp in running:
            comp.proc.terminate()
        sent = time.monotonic()
        for comp in running:
            deadline = sent + STOP_GRACE_S.get(comp.name, DEFAULT_STOP_GRACE_S)
            while comp.proc.poll() is None and time.monotonic() < deadline and not self._hurry:
                time.sleep(0.05)
            if comp.proc.poll() is None:
                log.warning("%s did not stop after SIGTERM; killing it", comp.name)
                comp.proc.kill()
        for comp in comps:
            comp.proc.wait()

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
            "redis_scaler_password_file": str(self.state_dir / REDIS_SCALER_PASSWORD_FILE),
            "token_file": str(self.state_dir / TOKEN_FILE),
            "components": comps,
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.state_file)
        # Every start (and restart, port clash included) of a service rewrites where its metrics are.
        local_monitoring.write_targets(self.state_dir, local_monitoring.file_sd_groups(
            {n: c for n, c in comps.items() if n in SERVICES}))

    def __enter__(self) -> LocalSystem:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
