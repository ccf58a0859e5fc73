"""`nitro up`, `nitro down`, `nitro status`: the local system, and a local system started for one job."""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from nitro.client.commands.common import (
    CliError,
    add_state_dir,
    add_target,
    learner_client,
    raise_interrupt,
    routed_signals,
)
from nitro.client.sdk import NitroRpcError
from nitro.errors import StartupAborted
from nitro.local import health as local_health
from nitro.local import monitoring, processes, supervisor, system_state
from nitro.local.restarts import RestartPolicy, add_restart_args, restart_args, restart_policy_from_args
from nitro.local.system import LocalSystem


def add_up(sub) -> None:
    p = sub.add_parser("up", help="start Redis, the local Lambda endpoint and the three services",
                       description="Start the local system and print its addresses.")
    add_state_dir(p)
    p.add_argument("--foreground", action="store_true", help="stay attached; Ctrl-C stops everything")
    p.add_argument("--concurrency", type=int, default=64, help="actor function concurrency (default: %(default)s)")
    p.add_argument("--startup-timeout", type=float, default=180.0,
                   help="seconds each component may take to become healthy (default: %(default)s)")
    p.add_argument("--learner-port", type=int, default=None,
                   help="learner gRPC port (default: any free port; 50051 makes NitroClient() find it)")
    restart_group = p.add_argument_group("restarts", "a component that exits on its own is restarted on its ports "
                                                "after 0.5 s, 1 s, 2 s, ... (at most 30 s)")
    add_restart_args(restart_group)
    p.add_argument("--rotate-secrets", action="store_true",
                   help="replace the state dir's secrets (access token, HMAC key, Redis passwords) with new ones "
                        "before starting; batches signed with the old key that are still in Redis are then rejected")
    p.add_argument("--monitoring", action="store_true",
                   help="also start a Prometheus (the `prometheus` binary must be on PATH) with nitro's alert rules, "
                        f"scraping the services through {monitoring.TARGETS_FILE} in the state dir, which every "
                        "start writes (docs/operations.md)")
    p.set_defaults(func=cmd_up)


def cmd_up(args) -> int:
    state = system_state.running_state(args.state_dir)
    if state:
        print(f"nitro is already up (supervisor pid {state['supervisor_pid']})")
        _print_addresses(state)
        return 0
    if system_state.lock_held(args.state_dir):
        raise CliError(f"nitro is already starting in {args.state_dir} (see `nitro status`)")
    if args.monitoring and monitoring.find_prometheus() is None:
        raise CliError(monitoring.no_binary_message(Path(args.state_dir).resolve()))
    if args.rotate_secrets:
        removed = system_state.rotate_secrets(args.state_dir)
        print(f"new secrets replace {', '.join(removed)}" if removed else "no secrets yet; new ones are created")
    if args.foreground:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        system = _local_system(LocalSystemOptions(
            args.state_dir, learner_port=args.learner_port, concurrency=args.concurrency,
            startup_timeout_s=args.startup_timeout, restart_policy=restart_policy_from_args(args),
            monitoring=args.monitoring))
        return supervisor.run_foreground(system, on_ready=lambda s: (
            _print_addresses(system_state.read_state(s.state_dir)), print("Ctrl-C to stop everything", flush=True)))
    extra = ["--concurrency", str(args.concurrency), "--startup-timeout", str(args.startup_timeout),
             *restart_args(args)]
    if args.learner_port:
        extra += ["--learner-port", str(args.learner_port)]
    if args.monitoring:
        extra.append("--monitoring")
    proc = supervisor.spawn_supervisor(args.state_dir, extra)
    print(f"starting nitro (supervisor pid {proc.pid}, logs in {Path(args.state_dir) / 'logs'}) ...", flush=True)
    try:
        state = supervisor.wait_until_ready(args.state_dir, proc, timeout_s=4 * args.startup_timeout + 60)
    except KeyboardInterrupt:
        proc.terminate()  # the supervisor stops what it started
        proc.wait()
        raise
    unhealthy = {n: h for n, h in _health(state).items() if h != "SERVING"}
    if unhealthy:
        raise CliError(f"started, but unhealthy: {unhealthy}; see {Path(args.state_dir) / 'logs'}")
    print("nitro is up")
    _print_addresses(state)
    return 0


@dataclass(frozen=True)
class LocalSystemOptions:
    """How a command starts a local system (`nitro up`, `train --local`, `pretrain-minions --via system`)."""

    state_dir: str
    backend: str = "local"  # where actors run: the local Lambda endpoint, or "aws"
    aws: dict = field(default_factory=dict)  # --backend aws: LocalSystem keyword arguments (aws_backend)
    learner_port: int | None = None
    concurrency: int = 64
    startup_timeout_s: float = 180.0
    restart_policy: RestartPolicy = field(default_factory=RestartPolicy)
    monitoring: bool = False  # `nitro up --monitoring`: a Prometheus beside the services


def _local_system(opts: LocalSystemOptions) -> LocalSystem:
    ports = {"learner": opts.learner_port} if opts.learner_port else None
    aws = dict(opts.aws)
    if "redis_port" in aws:  # the functions reach Redis on the port of --actor-redis-url
        ports = {**(ports or {}), "redis": aws.pop("redis_port")}
    return LocalSystem(opts.state_dir, ports, concurrency=opts.concurrency, startup_timeout_s=opts.startup_timeout_s,
                          restart_policy=opts.restart_policy, monitoring=opts.monitoring, **aws)


def _print_addresses(state: dict) -> None:
    comps = state["components"]
    rows = [("learner", comps["learner"]["address"], comps["learner"]["metrics_url"]),
            ("detector", comps["detector"]["address"], comps["detector"]["metrics_url"]),
            ("scaler", comps["scaler"]["address"], comps["scaler"]["metrics_url"]),
            ("lambda", comps["lambda"]["url"], ""),
            ("redis", comps["redis"]["url"], "")]
    if "prometheus" in comps:
        rows.append(("prometheus", comps["prometheus"]["url"], ""))
    for name, address, metrics in rows:
        print(f"  {name:<10} {address:<28} {'metrics ' + metrics if metrics else ''}".rstrip())
    print(f"  targets    {Path(state['state_dir']) / monitoring.TARGETS_FILE}  (Prometheus file_sd)")
    print(f"  state      {Path(state['state_dir']) / system_state.STATE_FILE}  (logs in {Path(state['state_dir']) / 'logs'})")
    sys.stdout.flush()


def _health(state: dict) -> dict[str, str]:
    return {n: local_health.probe(n, c, state["state_dir"]) for n, c in state["components"].items()}


def add_down(sub) -> None:
    p = sub.add_parser("down", help="stop the local system", description="Stop everything `nitro up` started.")
    add_state_dir(p)
    p.add_argument("--timeout", type=float, default=150.0,
                   help="seconds to wait before killing what is left (default: %(default)s)")
    p.set_defaults(func=cmd_down)


def cmd_down(args) -> int:
    state = system_state.read_state(args.state_dir)
    if state is None:
        print(f"nitro is not up (no {Path(args.state_dir) / system_state.STATE_FILE})")
        return 0
    if not processes.pid_alive(state.get("supervisor_pid"), state.get("supervisor_start_time")):
        killed = system_state.cleanup_stale(args.state_dir, state)
        print("nitro was not running; removed its stale state" + (f" and killed {', '.join(killed)}" if killed else ""))
        return 0
    print(f"stopping nitro (supervisor pid {state['supervisor_pid']}; a running round may take a minute) ...",
          flush=True)
    stopped = system_state.shutdown(args.state_dir, timeout_s=args.timeout)
    print(f"stopped: {', '.join(stopped)}")
    return 0


def add_status(sub) -> None:
    p = sub.add_parser("status", help="health of each component and the jobs",
                       description="Show each component's address and health, and the learner's jobs. "
                                   "Exit code 0 when everything is healthy, 1 otherwise.")
    add_state_dir(p)
    add_target(p, "a learner to ask instead of the local system")
    p.set_defaults(func=cmd_status)


def cmd_status(args) -> int:
    healthy = True
    if args.target:
        target = args.target
        health = local_health.grpc_health(target)
        print(f"learner {target}: {health}")
        healthy = health == "SERVING"
    else:
        state = system_state.running_state(args.state_dir)
        if state is None:
            print(f"nitro is not up (no running supervisor for {Path(args.state_dir) / system_state.STATE_FILE})")
            gave_up = system_state.last_failure(args.state_dir)
            if gave_up:
                print(f"the supervisor's last error ({Path(args.state_dir) / 'logs' / system_state.SUPERVISOR_LOG}):\n"
                      f"  {gave_up}")
            return 1
        target = state["learner"]
        print(f"nitro local system (supervisor pid {state['supervisor_pid']}, {state['status']})")
        print(f"  {'COMPONENT':<10} {'HEALTH':<12} {'PID':>7}  {'ADDRESS':<40} {'RESTARTS':<8} METRICS")
        health = _health(state)
        notes = []
        for name, comp in state["components"].items():
            restarts = comp.get("restarts") or {}
            if restarts.get("restarting"):
                health[name] = "restarting"
            healthy &= health[name] == "SERVING"
            print(f"  {name:<10} {health[name]:<12} {comp['pid']:>7}  {comp['url'] or comp['address']:<40} "
                  f"{restarts.get('count', 0):<8} {comp.get('metrics_url') or ''}".rstrip())
            if restarts.get("last_exit"):
                when = restarts.get("last_restart_unix")
                at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if when else "not yet"
                notes.append(f"  {name}: last exit {restarts['last_exit']}; last restart {at} "
                             f"(log {comp['log']})")
        if notes:
            print("restarts (the supervisor's log says why: "
                  f"{Path(state['state_dir']) / 'logs' / system_state.SUPERVISOR_LOG}):\n" + "\n".join(notes))
    try:
        with learner_client(args, target) as client:
            jobs = client.list()
    except NitroRpcError as exc:
        print(f"jobs: unavailable ({exc})")
        return 1
    print("jobs: none" if not jobs else "jobs:\n" + "\n".join("  " + line for line in job_table(jobs)))
    return 0 if healthy else 1


def job_table(jobs) -> list[str]:
    """A header and a row per job: id, state, rounds done/planned, both cost clocks (docs/cost.md), message."""
    lines = [f"{'JOB':<32} {'STATE':<10} {'ROUNDS':>9} {'CLOUD $':>10} {'MACHINE $':>10}  MESSAGE"]
    for j in jobs:
        rounds = f"{j.rounds_done}/{j.spec.rounds}" if j.HasField("spec") else str(j.rounds_done)
        lines.append(f"{j.job_id:<32} {j.state_name:<10} {rounds:>9} {format(j.cloud_total_cost_usd, '.4f'):>10} "
                     f"{format(j.total_cost_usd, '.4f'):>10}  {j.message}".rstrip())
    return lines


@contextlib.contextmanager
def local_system_for_job(opts: LocalSystemOptions):
    """Yield a learner address from the local system up in opts.state_dir, else from one started here (and
    stopped on the way out)."""
    state = system_state.running_state(opts.state_dir)
    if state:
        backend = state.get("lambda_backend", "local")
        if backend != opts.backend:
            raise CliError(f"the local system up in {opts.state_dir} runs actors on {backend!r}, not "
                           f"{opts.backend!r}: `nitro down` first", exit_code=2)
        print(f"using the local system already up in {opts.state_dir}")
        yield state["learner"]
        return
    system = _local_system(opts)
    print(f"starting the local system in {opts.state_dir} ...", flush=True)
    try:
        # While starting, Ctrl-C/SIGTERM ask start() to give up cleanly rather than raising anywhere.
        with routed_signals(lambda *_: system.request_stop()):
            system.start()
        print(f"local system up; learner at {system.learner_address}", flush=True)
        with routed_signals(raise_interrupt):  # `nitro down` (SIGTERM) ends the job like Ctrl-C
            yield system.learner_address
    except StartupAborted:
        raise KeyboardInterrupt from None
    finally:
        print("stopping the local system ...", flush=True)
        with routed_signals(lambda *_: system.request_stop()):  # a second Ctrl-C skips the grace periods
            system.stop()


def aws_backend(args) -> dict:
    """Check `--backend aws` before anything starts; LocalSystem keyword arguments for --local.

    Actors then run on real AWS Lambda: the scaler runs without --lambda-endpoint, and the
    functions must reach Redis; each invocation's event carries its job's Redis user and its keys, so the
    deployed function holds no secret.
    """
    if not args.spec__function_name:
        raise CliError("--backend aws needs --function NAME: the deployed actor function, e.g. nitro-actor:live "
                       "(nitro deploy-lambda prints it)", exit_code=2)
    if not args.local:
        # A running learner's scaler decides where actors run; there is nothing to start here.
        return {}
    from urllib.parse import urlparse

    if not args.actor_redis_url:
        raise CliError("--backend aws --local needs --actor-redis-url redis://HOST:PORT/0: the local Redis as "
                       "the Lambda functions reach it (a public or VPN address, not 127.0.0.1)", exit_code=2)
    url = urlparse(args.actor_redis_url)
    if url.scheme not in ("redis", "rediss") or not url.hostname:
        raise CliError(f"--actor-redis-url must look like redis://HOST:PORT/0, got {args.actor_redis_url!r}",
                       exit_code=2)
    if url.password:
        raise CliError("--actor-redis-url must not carry the password: each invocation gets its job's own Redis user "
                       "and password in its event", exit_code=2)
    if url.hostname in ("127.0.0.1", "localhost", "::1"):
        raise CliError(f"--actor-redis-url {args.actor_redis_url} is loopback: AWS Lambda cannot reach it",
                       exit_code=2)
    import boto3

    session = boto3.session.Session(region_name=args.region)
    if not session.region_name:
        raise CliError("--backend aws: no AWS region: pass --region or set AWS_REGION", exit_code=2)
    if session.get_credentials() is None:
        raise CliError("--backend aws: no AWS credentials found (environment, ~/.aws, SSO or an instance role); "
                       "the scaler invokes the function with them", exit_code=2)
    return {"lambda_backend": "aws", "actor_redis_url": args.actor_redis_url, "aws_region": session.region_name,
            "redis_bind": "0.0.0.0", "redis_port": url.port or 6379}
