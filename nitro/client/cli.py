"""The `nitro` command: run the local system and train through the SDK.

One `_add_<command>` function builds each subcommand's parser and points it at
`cmd_<command>`; a new subcommand is one more pair and one more entry in
COMMANDS. Errors end as one line on stderr, "error: <STATUS>: <message>",
with exit code 2 for bad input and 1 otherwise; Ctrl-C exits with 130.
`train` and `watch` end with the job's state: 0 SUCCEEDED, 1 FAILED, 3 STOPPED;
they follow a job across a learner restart, and a job they leave unfinished is
exit code 1 with its last known state and the commands that go on with it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import grpc

from nitro.client.sdk import DEFAULT_TARGET, NitroClient, NitroRpcError
from nitro.local import system as ls
from nitro.spec import InvalidSpec, ScalerSettings, StellarisSettings, TrainingSpec
from nitro.v1 import training_pb2

BAD_INPUT = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.NOT_FOUND,
             grpc.StatusCode.ALREADY_EXISTS}
SCALER_POLICIES = "nitro|fixed|max|hydrozoa|kungfu|minions|schedule|replay|nitro-floor|fixed:N"


class CliError(Exception):
    def __init__(self, message: str, exit_code: int = 1):
        self.exit_code = exit_code
        super().__init__(message)


# --- nitro up / down / status -----------------------------------------------------------------


_STATE_DIR_DEFAULT = os.environ.get("NITRO_STATE_DIR", ".nitro")


def _add_state_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", default=_STATE_DIR_DEFAULT,
                   help="where the local system keeps state.json, logs, keys and data (default: %(default)s)")


def _add_up(sub) -> None:
    p = sub.add_parser("up", help="start Redis, the local Lambda endpoint and the three services",
                       description="Start the local system and print its addresses.")
    _add_state_dir(p)
    p.add_argument("--foreground", action="store_true", help="stay attached; Ctrl-C stops everything")
    p.add_argument("--concurrency", type=int, default=64, help="actor function concurrency (default: %(default)s)")
    p.add_argument("--startup-timeout", type=float, default=180.0,
                   help="seconds each component may take to become healthy (default: %(default)s)")
    p.add_argument("--learner-port", type=int, default=None,
                   help="learner gRPC port (default: any free port; 50051 makes NitroClient() find it)")
    restarts = p.add_argument_group("restarts", "a component that exits on its own is restarted on its ports "
                                                "after 0.5 s, 1 s, 2 s, ... (at most 30 s)")
    ls.add_restart_args(restarts)
    p.add_argument("--rotate-secrets", action="store_true",
                   help="replace the state dir's secrets (access token, HMAC key, Redis passwords) with new ones "
                        "before starting; batches signed with the old key that are still in Redis are then rejected")
    p.set_defaults(func=cmd_up)


def cmd_up(args) -> int:
    state = ls.running_state(args.state_dir)
    if state:
        print(f"nitro is already up (supervisor pid {state['supervisor_pid']})")
        _print_addresses(state)
        return 0
    if ls.lock_held(args.state_dir):
        raise CliError(f"nitro is already starting in {args.state_dir} (see `nitro status`)")
    if args.rotate_secrets:
        removed = ls.rotate_secrets(args.state_dir)
        print(f"new secrets replace {', '.join(removed)}" if removed else "no secrets yet; new ones are created")
    if args.foreground:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        system = _local_system(args)
        return ls.run_foreground(system, on_ready=lambda s: (
            _print_addresses(ls.read_state(s.state_dir)), print("Ctrl-C to stop everything", flush=True)))
    extra = ["--concurrency", str(args.concurrency), "--startup-timeout", str(args.startup_timeout),
             *ls.restart_args(args)]
    if args.learner_port:
        extra += ["--learner-port", str(args.learner_port)]
    proc = ls.spawn_supervisor(args.state_dir, extra)
    print(f"starting nitro (supervisor pid {proc.pid}, logs in {Path(args.state_dir) / 'logs'}) ...", flush=True)
    try:
        state = ls.wait_until_ready(args.state_dir, proc, timeout_s=4 * args.startup_timeout + 60)
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


def _local_system(args) -> ls.LocalSystem:
    ports = {"learner": args.learner_port} if getattr(args, "learner_port", None) else None
    aws = dict(getattr(args, "aws_system", None) or {})  # --backend aws: see _aws_backend
    if "redis_port" in aws:  # the functions reach Redis on the port of --actor-redis-url
        ports = {**(ports or {}), "redis": aws.pop("redis_port")}
    policy = ls.restart_policy_from_args(args) if hasattr(args, "max_restarts") else ls.RestartPolicy()
    return ls.LocalSystem(args.state_dir, ports, concurrency=getattr(args, "concurrency", 64),
                          startup_timeout_s=getattr(args, "startup_timeout", 180.0), restart_policy=policy, **aws)


def _print_addresses(state: dict) -> None:
    comps = state["components"]
    rows = [("learner", comps["learner"]["address"], comps["learner"]["metrics_url"]),
            ("detector", comps["detector"]["address"], comps["detector"]["metrics_url"]),
            ("scaler", comps["scaler"]["address"], comps["scaler"]["metrics_url"]),
            ("lambda", comps["lambda"]["url"], ""),
            ("redis", comps["redis"]["url"], "")]
    for name, address, metrics in rows:
        print(f"  {name:<9} {address:<28} {'metrics ' + metrics if metrics else ''}".rstrip())
    print(f"  state     {Path(state['state_dir']) / ls.STATE_FILE}  (logs in {Path(state['state_dir']) / 'logs'})")
    sys.stdout.flush()


def _health(state: dict) -> dict[str, str]:
    return {n: ls.probe(n, c, state["state_dir"]) for n, c in state["components"].items()}


def _add_down(sub) -> None:
    p = sub.add_parser("down", help="stop the local system", description="Stop everything `nitro up` started.")
    _add_state_dir(p)
    p.add_argument("--timeout", type=float, default=150.0,
                   help="seconds to wait before killing what is left (default: %(default)s)")
    p.set_defaults(func=cmd_down)


def cmd_down(args) -> int:
    state = ls.read_state(args.state_dir)
    if state is None:
        print(f"nitro is not up (no {Path(args.state_dir) / ls.STATE_FILE})")
        return 0
    if not ls.pid_alive(state.get("supervisor_pid"), state.get("supervisor_start_time")):
        killed = ls.cleanup_stale(args.state_dir, state)
        print("nitro was not running; removed its stale state" + (f" and killed {', '.join(killed)}" if killed else ""))
        return 0
    print(f"stopping nitro (supervisor pid {state['supervisor_pid']}; a running round may take a minute) ...",
          flush=True)
    stopped = ls.shutdown(args.state_dir, timeout_s=args.timeout)
    print(f"stopped: {', '.join(stopped)}")
    return 0


def _add_status(sub) -> None:
    p = sub.add_parser("status", help="health of each component and the jobs",
                       description="Show each component's address and health, and the learner's jobs. "
                                   "Exit code 0 when everything is healthy, 1 otherwise.")
    _add_state_dir(p)
    _add_target(p, "a learner to ask instead of the local system")
    p.set_defaults(func=cmd_status)


def cmd_status(args) -> int:
    healthy = True
    if args.target:
        target = args.target
        health = ls.grpc_health(target)
        print(f"learner {target}: {health}")
        healthy = health == "SERVING"
    else:
        state = ls.running_state(args.state_dir)
        if state is None:
            print(f"nitro is not up (no running supervisor for {Path(args.state_dir) / ls.STATE_FILE})")
            gave_up = ls.last_failure(args.state_dir)
            if gave_up:
                print(f"the supervisor's last error ({Path(args.state_dir) / 'logs' / ls.SUPERVISOR_LOG}):\n"
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
                  f"{Path(state['state_dir']) / 'logs' / ls.SUPERVISOR_LOG}):\n" + "\n".join(notes))
    try:
        with _client(args, target) as client:
            jobs = client.list()
    except NitroRpcError as exc:
        print(f"jobs: unavailable ({exc})")
        return 1
    print("jobs: none" if not jobs else "jobs:\n" + "\n".join("  " + line for line in _job_table(jobs)))
    return 0 if healthy else 1


def _job_table(jobs) -> list[str]:
    """A header and a row per job: id, state, rounds done/planned, both cost clocks (docs/cost.md), message."""
    lines = [f"{'JOB':<32} {'STATE':<10} {'ROUNDS':>9} {'CLOUD $':>10} {'MACHINE $':>10}  MESSAGE"]
    for j in jobs:
        rounds = f"{j.rounds_done}/{j.spec.rounds}" if j.HasField("spec") else str(j.rounds_done)
        lines.append(f"{j.job_id:<32} {j.state_name:<10} {rounds:>9} {format(j.cloud_total_cost_usd, '.4f'):>10} "
                     f"{format(j.total_cost_usd, '.4f'):>10}  {j.message}".rstrip())
    return lines


# --- nitro train ----------------------------------------------------------------------------------

_DEFAULTS, _SCALER_DEFAULTS, _STELLARIS_DEFAULTS = TrainingSpec(), ScalerSettings(), StellarisSettings()
_NESTED = ("scaler", "stellaris")

# (flag, spec field ("scaler.x" / "stellaris.x" for nested settings), type, help). Every flag defaults to None:
# only what the user gave is sent, so the server's defaults apply to the rest.
TRAIN_FIELDS = [
    ("--env", "env_id", str, "Gymnasium environment id, e.g. Hopper-v5, CartPole-v1 (required)"),
    ("--algo", "algo", str, "algorithm"),
    ("--preset", "preset", str, "hyperparameter preset (tuned, paper, fast, paper-atari) or an environment "
                                "preset (hopper-ppo, walker2d-impact, qbert-ppo, ...; see docs/algorithms.md)"),
    ("--i-min", "scaler.i_min", int, "fewest actors per round"),
    ("--i-max", "scaler.i_max", int, "most actors per round"),
    ("--fixed-actors", "scaler.fixed_actors", int, "actors per round for --scaler fixed"),
    ("--decay", "scaler.decay", float, "boosting score decay d in (0, 1] (--scaler nitro)"),
    ("--window", "scaler.window", int, "sliding window n of convexity ratios (--scaler nitro)"),
    ("--period", "scaler.period", int, "rounds between doublings (--scaler hydrozoa)"),
    ("--scheduler", "scaler.scheduler", str, "pre-trained scheduler checkpoint (--scaler minions)"),
    ("--actors-by-round", "scaler.actors_by_round", str,
     "comma-separated actor counts per round, e.g. 8,16,12; later rounds repeat the last (--scaler replay)"),
    ("--floor-actors", "scaler.floor_actors", int, "F of the floor round(F * d_f^(k^2)) (--scaler nitro-floor)"),
    ("--floor-decay", "scaler.floor_decay", float, "d_f of that floor (--scaler nitro-floor)"),
    ("--rounds", "rounds", int, "training rounds"),
    ("--steps-per-actor", "steps_per_actor", int, "environment steps each actor samples per round"),
    ("--budget", "budget_usd", float, "budget in USD; the job stops when the next round is unaffordable"),
    ("--budget-clock", "budget_clock", str,
     "the bill the budget binds on: cloud (modelled AWS bill, default) or machine (docs/cost.md)"),
    ("--seed", "seed", int, "random seed"),
    ("--eval-episodes", "eval_episodes", int, "deterministic evaluation episodes per evaluated round"),
    ("--eval-every", "eval_every", int, "evaluate after every N-th round and after the last (default 1)"),
    ("--round-deadline", "round_deadline_s", float, "seconds a round waits for its actors"),
    ("--job-id", "job_id", str, "job id (generated when not given)"),
    ("--actor-memory", "actor_memory_mb", int, "actor function memory in MB (billing)"),
    ("--function", "function_name", str, "actor function name"),
    ("--target-return", "target_return", float, "stop once the eval return reaches this (0 = off)"),
    ("--min-sample-fraction", "min_sample_fraction", float,
     "at the round deadline, proceed with at least this share of the samples"),
    ("--detector-fallback", "detector_fallback", str,
     "plan when the detector is down or slow: i_min or last (the previous decision)"),
    ("--detector-timeout", "detector_timeout_s", float, "seconds the learner waits for a boosting score"),
    ("--learner-mode", "learner_mode", str,
     "central (the learner service updates) or stellaris (serverless learner functions, docs/stellaris.md)"),
    ("--learner-function", "stellaris.learner_function", str, "learner function name (stellaris)"),
    ("--learner-memory", "stellaris.learner_memory_mb", int, "learner function memory in MB (stellaris, billing)"),
    ("--max-learners", "stellaris.max_learners", int, "learner functions in flight at once (stellaris)"),
    ("--staleness-weight", "stellaris.staleness_weight", str,
     "weight of a stale update: inverse (1+s)^-decay, exp exp(-decay s) or none (stellaris)"),
    ("--staleness-decay", "stellaris.staleness_decay", float, "decay of the staleness weight (stellaris)"),
    ("--staleness-bound-start", "stellaris.bound_start", int, "largest staleness applied in the first round"),
    ("--staleness-bound-end", "stellaris.bound_end", int, "largest staleness applied in the last round"),
    ("--staleness-bound-schedule", "stellaris.bound_schedule", str,
     "how the bound tightens: linear, geometric or constant (stellaris)"),
    ("--rho-bar", "stellaris.rho_bar", float, "cap of the global importance-sampling truncation (stellaris)"),
    ("--recent-versions", "stellaris.recent_versions", int,
     "newest policy versions whose ratios truncate a learner's weights; 0 = learner-local (stellaris)"),
    ("--hidden-sizes", "hidden_sizes", lambda text: parse_widths(text), "hidden layer widths of the policy's MLPs, "
     "comma-separated, e.g. 64,64 [the preset's: 256,256]"),
    ("--activation", "activation", str, "hidden activation of the MLPs: tanh or relu [the preset's: tanh]"),
]


def _dest(field: str) -> str:
    return "spec__" + field.replace(".", "__")


def _default_of(field: str):
    if field.startswith("scaler."):
        return getattr(_SCALER_DEFAULTS, field.removeprefix("scaler."))
    if field.startswith("stellaris."):
        return getattr(_STELLARIS_DEFAULTS, field.removeprefix("stellaris."))
    return getattr(_DEFAULTS, field)


def parse_hp(text: str) -> tuple[str, float]:
    """--hp NAME=VALUE: a numeric hyperparameter override (true/false mean 1/0)."""
    name, sep, raw = text.partition("=")
    name, raw = name.strip(), raw.strip()
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, e.g. lr=3e-4, got {text!r}")
    if raw.lower() in ("true", "false"):
        return name, float(raw.lower() == "true")
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}: value must be a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{name}: value must be finite, got {raw!r}")
    return name, value


def parse_widths(text: str) -> list[int]:
    """--hidden-sizes 64,64: layer widths (ranges are the server's to check)."""
    try:
        return [int(w) for w in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, e.g. 64,64, got {text!r}") from None


def parse_env_kwarg(text: str) -> tuple[str, object]:
    """--env-kwarg NAME=VALUE: VALUE is read as JSON (50, true, [1, 2], "x"), else kept as a string."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, e.g. max_episode_steps=200, got {text!r}")
    try:
        return name, json.loads(raw)
    except ValueError:
        return name, raw


def parse_scaler(text: str) -> tuple[str, int | None]:
    """--scaler POLICY or fixed:N. Policy names are checked by the server, which knows them all."""
    policy, sep, count = text.strip().partition(":")
    if not policy:
        raise argparse.ArgumentTypeError(f"expected one of {SCALER_POLICIES}, got {text!r}")
    if not sep:
        return policy, None
    if policy != "fixed":
        raise argparse.ArgumentTypeError(f"only 'fixed' takes an actor count (fixed:N), got {text!r}")
    try:
        n = int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"the count in {text!r} must be an integer, e.g. fixed:16") from None
    return policy, n


def _add_target(p: argparse.ArgumentParser, help_text: str) -> None:
    p.add_argument("--target", default=os.environ.get("NITRO_TARGET"), metavar="HOST:PORT",
                   help=f"{help_text} (default: $NITRO_TARGET, else the learner in --state-dir's state.json)")
    p.add_argument("--token", default=None,
                   help="access token (default: the local system's when the target is its learner, else "
                        "$NITRO_TOKEN or $NITRO_TOKEN_FILE); prefer the variables: flags show in `ps`")
    p.add_argument("--tls-ca", default=os.environ.get("NITRO_TLS_CA"), metavar="PEM",
                   help="CA certificate of a learner serving TLS (default: $NITRO_TLS_CA)")


def _client(args, target: str) -> NitroClient:
    """A client for `target`; the local system's token goes only to the local system's learner."""
    token = args.token
    if not token:
        state = ls.running_state(args.state_dir)
        if state and state.get("learner") == target:
            token = ls.local_token(args.state_dir)
    args.learner_target = target  # named in an UNAVAILABLE error (main)
    return NitroClient(target, token=token, tls_ca=args.tls_ca)  # token None: the SDK tries $NITRO_TOKEN(_FILE)


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="submit a training job, watch it, write the results",
                       description="Start a job, show its progress, and write results/<job>/{rounds.csv, "
                                   "summary.json, training.png, checkpoint.pt}. Flags not given take the "
                                   "server's defaults (shown in brackets).")
    spec = p.add_argument_group("training spec")
    for flag, field, typ, text in TRAIN_FIELDS:
        default = _default_of(field)
        shown = f" [{default}]" if default not in ("", None, [], {}) else ""
        metavar = {int: "N", float: "X", str: field.upper()}.get(typ, "W,W")
        spec.add_argument(flag, dest=_dest(field), type=typ, default=None, metavar=metavar, help=text + shown)
    spec.add_argument("--scaler", type=parse_scaler, default=None, metavar="POLICY",
                      help=f"scaling policy: {SCALER_POLICIES} [{_SCALER_DEFAULTS.policy}]")
    spec.add_argument("--reproducible", action="store_const", const=True, default=None,
                      help="actors start fresh episodes from their seeds, so the same seed gives the same run "
                           "(PPO, central learner; docs/algorithms.md)")
    spec.add_argument("--hp", type=parse_hp, action="append", default=[], metavar="NAME=VALUE",
                      help="override a numeric hyperparameter of the preset; repeatable")
    spec.add_argument("--env-kwarg", type=parse_env_kwarg, action="append", default=[], metavar="NAME=VALUE",
                      help="keyword argument for every environment of the job (gym.make), VALUE read as JSON, "
                           "e.g. max_episode_steps=200; repeatable")
    spec.add_argument("--config", metavar="FILE", default=None,
                      help="a spec file (YAML or JSON, the SDK's dict spec); flags given as well override it "
                           "(see `nitro presets` and docs/cli.md)")
    run = p.add_argument_group("running")
    _add_target(run, "learner address")
    _add_state_dir(run)
    run.add_argument("--local", action="store_true",
                     help="start the local system for this job and stop it afterwards (reuses one already up)")
    run.add_argument("--backend", choices=("local", "aws"), default="local",
                     help="where actors run: the local Lambda endpoint, or real AWS Lambda (needs --function; "
                          "with --local also --actor-redis-url and AWS credentials) (default: %(default)s)")
    run.add_argument("--actor-redis-url", default=os.environ.get("NITRO_ACTOR_REDIS_URL"), metavar="URL",
                     help="--backend aws --local: Redis as the functions reach it, without password "
                          "(default: $NITRO_ACTOR_REDIS_URL)")
    run.add_argument("--region", default=None,
                     help="--backend aws --local: the function's AWS region (default: the AWS configuration)")
    run.add_argument("--resume", metavar="JOB_ID", default=None,
                     help="continue an interrupted job from its last checkpoint (its spec is the saved one; "
                          "spec flags are ignored)")
    _add_outputs(p)
    p.set_defaults(func=cmd_train)


def _add_outputs(p: argparse.ArgumentParser) -> None:
    """Flags of the commands that follow a job and write its results (train, watch)."""
    out = p.add_argument_group("results and tracking")
    out.add_argument("--results-dir", default="results", help="where results/<job>/ goes (default: %(default)s)")
    out.add_argument("--no-progress", action="store_true", help="a plain line per round instead of a progress bar")
    out.add_argument("--tensorboard", default=None, metavar="DIR",
                     help="also log every round to TensorBoard event files in DIR/<job>/ (needs tensorboard)")
    out.add_argument("--wandb-project", default=None, metavar="NAME",
                     help="also log every round to a Weights & Biases run in project NAME (needs wandb; "
                          "WANDB_MODE=offline logs without a network)")
    out.add_argument("--reattach-timeout", type=float, default=REATTACH_TIMEOUT_S, metavar="SECONDS",
                     help="how long to wait for a learner that went away (restarting) before giving up on "
                          "following the job; the job itself goes on (default: %(default)s)")


def build_spec(args) -> dict:
    """The flags the user gave, as a partial spec dict for NitroClient.start_training."""
    spec: dict = {}
    for _, field, _, _ in TRAIN_FIELDS:
        value = getattr(args, _dest(field))
        if value is None:
            continue
        group, dot, name = field.partition(".")
        if dot and group in _NESTED:
            spec.setdefault(group, {})[name] = value
        else:
            spec[field] = value
    if args.scaler is not None:
        policy, count = args.scaler
        scaler = spec.setdefault("scaler", {})
        scaler["policy"] = policy
        if count is not None:
            if scaler.get("fixed_actors", count) != count:
                raise InvalidSpec("scaler.fixed_actors",
                                  f"--scaler fixed:{count} and --fixed-actors {scaler['fixed_actors']} disagree")
            scaler["fixed_actors"] = count
    if getattr(args, "reproducible", None):
        spec["reproducible"] = True
    if args.hp:
        spec["hyperparameters"] = dict(args.hp)
    if getattr(args, "env_kwarg", None):
        spec["env_kwargs"] = dict(args.env_kwarg)
    scheduler = spec.get("scaler", {}).get("scheduler")
    if scheduler:  # the services resolve paths against their own working directory
        spec["scaler"]["scheduler"] = os.path.abspath(os.path.expanduser(scheduler))
    from nitro import spec_file

    if getattr(args, "config", None):  # the file, then the flags over it
        spec = spec_file.merge(spec_file.load(args.config), spec)
    spec_file.check_keys(spec)  # e.g. a hyperparameter name the algorithm does not have
    from nitro.presets import is_env_preset

    if not spec.get("env_id") and not is_env_preset(spec.get("preset", "")):
        raise InvalidSpec("env_id", "is required: pass --env, e.g. --env CartPole-v1, or an environment preset "
                                    "such as --preset hopper-ppo, or env_id in a --config file")
    return spec


def _resolve_target(args) -> str:
    if args.target:
        return args.target
    state = ls.running_state(args.state_dir)
    if state:
        return state["learner"]
    raise CliError(f"nitro is not up (no running system in {args.state_dir}): run `nitro up`, "
                   f"or pass --local, or --target HOST:PORT (e.g. {DEFAULT_TARGET})")


@contextlib.contextmanager
def _signals(handler, signals=(signal.SIGINT, signal.SIGTERM)):
    """Route the signals to `handler` inside the block."""
    old = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _raise_interrupt(*_):
    raise KeyboardInterrupt


@contextlib.contextmanager
def _local_for_job(args):
    """Yield a learner address from a local system started here (and stopped on the way out)."""
    if ls.running_state(args.state_dir):
        backend = ls.running_state(args.state_dir).get("lambda_backend", "local")
        if backend != getattr(args, "backend", "local"):
            raise CliError(f"the local system up in {args.state_dir} runs actors on {backend!r}, not "
                           f"{args.backend!r}: `nitro down` first", exit_code=2)
        print(f"using the local system already up in {args.state_dir}")
        yield ls.running_state(args.state_dir)["learner"]
        return
    system = _local_system(args)
    print(f"starting the local system in {args.state_dir} ...", flush=True)
    try:
        # While starting, Ctrl-C/SIGTERM ask start() to give up cleanly rather than raising anywhere.
        with _signals(lambda *_: system.request_stop()):
            system.start()
        print(f"local system up; learner at {system.learner_address}", flush=True)
        with _signals(_raise_interrupt):  # `nitro down` (SIGTERM) ends the job like Ctrl-C
            yield system.learner_address
    except ls.StartupAborted:
        raise KeyboardInterrupt from None
    finally:
        print("stopping the local system ...", flush=True)
        with _signals(lambda *_: system.request_stop()):  # a second Ctrl-C skips the grace periods
            system.stop()


def _aws_backend(args) -> dict:
    """Check `--backend aws` before anything starts; LocalSystem keyword arguments for --local.

    Actors then run on real AWS Lambda: the scaler runs without --lambda-endpoint, and the
    functions must reach Redis and share the HMAC key and Redis password they were deployed with.
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
        raise CliError("--actor-redis-url must not carry the password: the functions read it from "
                       "NITRO_REDIS_PASSWORD", exit_code=2)
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
    secrets = {}
    for name, kwarg in (("NITRO_HMAC_KEY", "hmac_key"), ("NITRO_REDIS_PASSWORD", "redis_password")):
        value = os.environ.get(name)
        if not value and os.environ.get(f"{name}_FILE"):
            try:
                value = Path(os.environ[f"{name}_FILE"]).read_text().strip()
            except OSError as exc:
                raise CliError(f"{name}_FILE cannot be read: {exc.strerror}", exit_code=2) from None
        if not value:
            raise CliError(f"--backend aws --local needs {name} (or {name}_FILE): the same value the function "
                           f"was deployed with (nitro deploy-lambda --env {name}=...)", exit_code=2)
        secrets[kwarg] = value
    return {"lambda_backend": "aws", "actor_redis_url": args.actor_redis_url, "aws_region": session.region_name,
            "redis_bind": "0.0.0.0", "redis_port": url.port or 6379, **secrets}


def cmd_train(args) -> int:
    spec = {"job_id": args.resume} if args.resume else build_spec(args)
    trackers = _trackers(args)  # a missing tracking package is bad input, before a system or job starts
    if args.backend == "aws":
        args.aws_system = _aws_backend(args)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_signals(_raise_interrupt, (signal.SIGTERM,)))  # a kill ends it like Ctrl-C
        target = stack.enter_context(_local_for_job(args)) if args.local else _resolve_target(args)
        client = stack.enter_context(_client(args, target))
        return _run_job(client, spec, args, trackers)


def _round_line(r) -> str:
    return (f"round {r.round:>4}  actors {r.actors_launched:>3}  eval {r.eval_return:10.2f}  "
            f"train {r.train_return:10.2f}  score {r.score:4.2f}  "
            f"cost cloud ${r.cloud_total_cost_usd:.4f} / this machine ${r.total_cost_usd:.4f}")


JOB_EXIT_CODES = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 3}  # any other state (still running): 1


def _trackers(args):
    from nitro.client.tracking import TrackingError, open_trackers

    try:
        return open_trackers(getattr(args, "tensorboard", None), getattr(args, "wandb_project", None))
    except TrackingError as exc:
        raise CliError(str(exc), exit_code=2) from None


REATTACH_TIMEOUT_S = 300.0  # train/watch: how long to wait for a restarting learner (--reattach-timeout)


class _LearnerGone(CliError):
    """Following a job stopped: its learner stayed away, or the local system it ran on is down."""


class _Waiting:
    """While the learner is away (a restart): a progress line now and then; gives up at once when the
    local system the job runs on is down (no supervisor will bring the learner back)."""

    def __init__(self, args, job: str, write):
        self.job, self.write = job, write
        self.state_dir = None if getattr(args, "target", None) else args.state_dir
        self.timeout_s = getattr(args, "reattach_timeout", REATTACH_TIMEOUT_S)
        self.shown_at = None  # seconds waited when the last line was shown; None: not waiting

    def __call__(self, err: NitroRpcError, waited_s: float) -> None:
        if self.state_dir is not None and ls.running_state(self.state_dir) is None:
            raise _LearnerGone(f"the local system in {self.state_dir} is down (its log: "
                               f"{Path(self.state_dir) / 'logs' / ls.SUPERVISOR_LOG})")
        if self.shown_at is None or waited_s - self.shown_at >= 15:
            self.shown_at = waited_s
            self.write(f"learner unavailable ({err.code.name}): waiting for it to come back, "
                       f"{waited_s:.0f} s of {self.timeout_s:.0f} s (job {self.job} goes on; Ctrl-C leaves)")

    def back(self) -> None:
        if self.shown_at is not None:
            self.write("learner back: following the job again")
        self.shown_at = None

    def patiently(self, call):
        """`call()`, retried while the learner is unavailable, for up to the reattach timeout."""
        t0, delay = time.monotonic(), 0.5
        while True:
            try:
                result = call()
            except NitroRpcError as exc:
                waited = time.monotonic() - t0
                if exc.code != grpc.StatusCode.UNAVAILABLE or waited >= self.timeout_s:
                    raise
                self(exc, waited)
                time.sleep(delay)
                delay = min(2 * delay, 5.0)
            else:
                self.back()
                return result


def _run_job(client: NitroClient, spec: dict, args, trackers=None) -> int:
    t0 = time.monotonic()
    trackers = trackers if trackers is not None else _trackers(args)
    if getattr(args, "resume", None):  # attaches to the job when the learner runs it already: safe to retry
        status = _Waiting(args, args.resume, print).patiently(lambda: client.resume(args.resume))
    else:
        status = client.start_training(spec)
    return _follow(client, status, args, trackers, t0)


def _follow(client: NitroClient, status, args, trackers, t0: float | None = None, leave_running: bool = False) -> int:
    """Show a job's rounds from round 0 on as they arrive, append each to rounds.csv and the trackers, and
    write the results once the job has ended; the exit code is its state's (JOB_EXIT_CODES).

    Ctrl-C stops the job, or with `leave_running` (watch) leaves it running. t0 None: the wall time is the
    job's own (created to finished), for a job followed from elsewhere."""
    from tqdm import tqdm

    from nitro.client import results

    job = status.job_id
    s = status.spec
    print(f"job {job}: {s.env_id} {s.algo}, scaler {s.scaler.policy}, {s.rounds} rounds", flush=True)
    out = Path(args.results_dir) / job
    plain = args.no_progress or not sys.stderr.isatty()
    bar = tqdm(total=s.rounds or None, unit="round", desc=job, disable=plain, dynamic_ncols=True)
    reports, interrupted, failure = [], False, None
    waiting = _Waiting(args, job, lambda line: tqdm.write(line, file=sys.stdout))
    trackers.start(job, status.to_dict()["spec"] or {})
    with results.RoundsCsvWriter(out / "rounds.csv") as rounds_csv:

        def take(r) -> None:
            reports.append(r)
            rounds_csv.append(r)  # flushed: rounds.csv grows while the job runs
            trackers.log_round(r.to_dict())

        try:
            for r in client.watch(job, patience_s=waiting.timeout_s, on_wait=waiting):
                waiting.back()
                take(r)
                bar.update(1)
                bar.set_postfix_str(f"actors {r.actors_launched} eval {r.eval_return:.1f} "
                                    f"cloud ${r.cloud_total_cost_usd:.4f} score {r.score:.2f}")
                if plain:
                    print(_round_line(r), flush=True)
        except KeyboardInterrupt:
            interrupted = True
            bar.close()
            if leave_running:
                print(f"\ninterrupted: job {job} keeps running (`nitro stop {job}` stops it)", flush=True)
            else:
                print(f"\ninterrupted: stopping job {job} (Ctrl-C again to leave without waiting) ...", flush=True)
                with contextlib.suppress(NitroRpcError):
                    status = client.stop(job)
        except NitroRpcError as exc:
            failure = exc  # write what arrived, then say what is known
        except _LearnerGone as exc:
            failure = exc
        finally:
            bar.close()
        # The stream can close just before the state flips; a stopped job finishes its round in flight.
        wait_s = 0 if failure or (interrupted and leave_running) else 60 if interrupted else 15
        status = _final_status(client, job, status, wait_s=wait_s)
        if (interrupted or failure) and status.finished:
            for r in _remaining_reports(client, job, reports):
                take(r)
    status = _known_status(status, reports)
    wall_s = time.monotonic() - t0 if t0 is not None else _job_seconds(status)
    out = _write_results(out, status, reports, wall_s, trackers)
    if interrupted:
        return 130
    if not status.finished:
        print(_unfinished(args, status, failure), file=sys.stderr)
        return 1
    return JOB_EXIT_CODES.get(status.state_name, 1)


def _known_status(status, reports: list):
    """`status`, with what the reports prove: a job that reported rounds was RUNNING, whatever an early
    status (PENDING) said before the learner became unreachable."""
    if status.finished or not reports or len(reports) <= status.rounds_done:
        return status
    proto = type(status.proto)()
    proto.CopyFrom(status.proto)
    proto.state = training_pb2.JOB_STATE_RUNNING
    proto.rounds_done = len(reports)
    proto.last_report.CopyFrom(reports[-1].proto)
    return type(status)(proto)


def _unfinished(args, status, failure) -> str:
    """What a job that was left before its end is known to be doing, and the commands that go on with it."""
    job = status.job_id
    why = f": {failure}" if failure else ""
    lines = [f"job {job} has not finished; last known state {status.state_name}, {status.rounds_done}"
             f"{f'/{status.spec.rounds}' if status.HasField('spec') else ''} rounds (following it stopped{why})"]
    target = getattr(args, "target", None)
    default_dir = args.state_dir == _STATE_DIR_DEFAULT
    where = f" --target {target}" if target else "" if default_dir else f" --state-dir {args.state_dir}"
    if not target and ls.running_state(args.state_dir) is None:
        lines.append(f"  the local system is down: `nitro up{'' if default_dir else f' --state-dir {args.state_dir}'}`"
                     f", then")
    lines.append(f"  follow it:   nitro watch {job}{where}")
    lines.append(f"  continue it: nitro train --resume {job}{where}   (attaches to it if the learner runs it already)")
    return "\n".join(lines)


def _job_seconds(status) -> float:
    """A job's wall time by the learner's clock: created to finished, or to now while it runs."""
    if not status.created_unix:
        return 0.0
    return (status.finished_unix if status.finished and status.finished_unix else time.time()) - status.created_unix


def _remaining_reports(client: NitroClient, job: str, reports: list) -> list:
    """Reports of rounds that ended after the stream was left (the job has ended, so this returns)."""
    try:
        return list(client.watch(job, from_round=reports[-1].round + 1 if reports else 0))
    except NitroRpcError:
        return []


def _final_status(client: NitroClient, job: str, last, wait_s: float):
    """The job's status once it has ended, or the latest one known after `wait_s` (an unreachable learner
    is asked again meanwhile)."""
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                last = client.get(job)
            except NitroRpcError as exc:
                if exc.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() >= deadline:
                    return last
            else:
                if last.finished or time.monotonic() >= deadline:
                    return last
            time.sleep(0.5)
    except KeyboardInterrupt:  # stop waiting, still write what arrived
        return last


def _copy_checkpoint(path: str, dest: Path) -> str:
    """Copy the learner's file into the results when it is reachable from here; the line that says where it is."""
    if path and os.path.isfile(path):
        shutil.copy2(path, dest)
        return str(dest)
    return f"{path} (not reachable from here)" if path else "none"


def _write_results(out: Path, status, reports: list, wall_s: float, trackers=None) -> Path:
    """summary.json, training.png and the checkpoints (rounds.csv was written as the rounds arrived)."""
    from nitro.client import results

    out.mkdir(parents=True, exist_ok=True)
    summary = results.write_summary(out / "summary.json", status, reports, wall_s)
    results.plot_training(out / "training.png", reports)
    ckpt_line = _copy_checkpoint(status.checkpoint_path, out / "checkpoint.pt") if status.finished or \
        status.checkpoint_path else "kept by the learner (not finished; `nitro train --resume` continues from it)"
    best_line = _copy_checkpoint(summary["best_checkpoint_path"], out / "best.pt")

    def num(v, fmt):
        return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)

    planned = f" / {summary['rounds_planned']}" if summary.get("rounds_planned") else ""
    state = summary["state"] if status.finished else f"not finished (last known state {summary['state']})"
    print(f"\njob {summary['job_id']} {state}" + (f": {summary['message']}" if summary["message"] else ""))
    print(f"  rounds        {summary['rounds']}{planned}")
    print(f"  eval return   final {num(summary['final_eval_return'], '.2f')}, "
          f"best {num(summary['best_eval_return'], '.2f')} (round {summary['best_round']})")
    print(f"  env steps     {summary['total_env_steps']:,}")
    print(f"  cost (cloud)  ${summary['cloud_total_cost_usd']:.4f} modelled for AWS, {summary['cloud_seconds']:.1f} s "
          f"(serverful comparator ${summary['cloud_serverful_cost_usd']:.4f}; docs/cost.md)")
    print(f"  cost (here)   ${summary['total_cost_usd']:.4f} at this machine's wall time "
          f"(serverful comparator ${summary['serverful_cost_usd']:.4f})")
    print(f"  wall time     {wall_s:.1f} s on this machine")
    print(f"  checkpoint    {ckpt_line}")
    if summary["best_checkpoint_path"]:
        use = f"; try `nitro eval {best_line}`" if best_line == str(out / "best.pt") else ""
        print(f"  best policy   {best_line} (round {summary['best_round']}{use})")
    for line in trackers.finish(summary) if trackers is not None else []:
        print(f"  {line}")
    print(f"  results       {out}/ (rounds.csv, summary.json, training.png)", flush=True)
    return out


# --- nitro watch / stop / list --------------------------------------------------------------------


def _add_job_target(p: argparse.ArgumentParser) -> None:
    p.add_argument("job_id", metavar="JOB", help="job id (`nitro list` shows them)")
    run = p.add_argument_group("running")
    _add_target(run, "learner address")
    _add_state_dir(run)


def _add_watch(sub) -> None:
    p = sub.add_parser("watch", help="follow a running or finished job to its end and write its results",
                       description="Replay a job's round reports from round 0, follow it until it ends and write "
                                   "results/<job>/ as `nitro train` does (rounds.csv row by row, then "
                                   "summary.json and training.png), with the same progress display and tracking "
                                   "flags. Ctrl-C leaves the job running. Exit code 0 when the job SUCCEEDED, "
                                   "1 FAILED, 3 STOPPED; 2 for an unknown job id.")
    _add_job_target(p)
    _add_outputs(p)
    p.set_defaults(func=cmd_watch)


def cmd_watch(args) -> int:
    trackers = _trackers(args)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_signals(_raise_interrupt, (signal.SIGTERM,)))  # a kill leaves like Ctrl-C
        client = stack.enter_context(_client(args, _resolve_target(args)))
        # An unknown id is NOT_FOUND before anything is written; a restarting learner is waited for.
        status = _Waiting(args, args.job_id, print).patiently(lambda: client.get(args.job_id))
        return _follow(client, status, args, trackers, leave_running=True)


def _add_stop(sub) -> None:
    p = sub.add_parser("stop", help="stop a job and print its state",
                       description="Ask the learner to stop a job, wait for it to end (its round in flight ends "
                                   "first) and print its state. The checkpoint and reports so far stay. Exit code 0 "
                                   "once the job has ended (or had already), 1 when it still runs after --wait, "
                                   "2 for an unknown job id.")
    _add_job_target(p)
    p.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                   help="how long to wait for the job to end; 0 returns once the request is sent "
                        "(default: %(default)s)")
    p.set_defaults(func=cmd_stop)


def _state_line(status) -> str:
    planned = f"/{status.spec.rounds}" if status.HasField("spec") else ""
    return (f"{status.state_name}" + (f": {status.message}" if status.message else "")
            + f" ({status.rounds_done}{planned} rounds, cloud ${status.cloud_total_cost_usd:.4f}, "
              f"this machine ${status.total_cost_usd:.4f})")


def cmd_stop(args) -> int:
    with _client(args, _resolve_target(args)) as client:
        status = client.stop(args.job_id)
        if status.finished:
            print(f"job {status.job_id} had already ended: {_state_line(status)}")
            return 0
        if args.wait > 0:
            print(f"stopping job {status.job_id} (waiting up to {args.wait:g} s for its round in flight) ...",
                  flush=True)
            status = _final_status(client, status.job_id, status, wait_s=args.wait)
    if status.finished:
        print(f"job {status.job_id} {_state_line(status)}")
        return 0
    print(f"job {status.job_id} stop requested; still {_state_line(status)}")
    return 0 if args.wait <= 0 else 1


def _add_list(sub) -> None:
    p = sub.add_parser("list", help="the learner's jobs as a table: state, rounds, both cost clocks",
                       description="One row per job the learner knows, running or ended: id, state, rounds "
                                   "done/planned, the modelled cloud cost and this machine's (docs/cost.md), "
                                   "and why it ended.")
    run = p.add_argument_group("running")
    _add_target(run, "learner address")
    _add_state_dir(run)
    p.set_defaults(func=cmd_list)


def cmd_list(args) -> int:
    with _client(args, _resolve_target(args)) as client:
        jobs = client.list()
    print("\n".join(_job_table(jobs)) if jobs else "no jobs")
    return 0


# --- nitro deploy-lambda --------------------------------------------------------------------------


def _add_deploy_lambda(sub) -> None:
    p = sub.add_parser("deploy-lambda", help="create or update the actor function on AWS Lambda from an ECR image",
                       description="Create or update the actor function (container image), publish a version, "
                                   "point an alias at it and set its concurrency. One line per action; "
                                   "exit code 2 for bad input, a missing role or image.")
    p.add_argument("--function", required=True, help="function name, e.g. nitro-actor")
    p.add_argument("--image-uri", required=True,
                   help="ECR image, ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG or @sha256:DIGEST")
    p.add_argument("--role-arn", required=True, help="execution role (trust: deploy/aws/lambda-trust-policy.json)")
    p.add_argument("--memory", type=int, default=1024, help="MB, 128-10240; also sets vCPU share (default: %(default)s)")
    p.add_argument("--timeout", type=int, default=60, help="seconds, 1-900 (default: %(default)s)")
    p.add_argument("--architecture", choices=("x86_64", "arm64"), default="x86_64",
                   help="must match the image's platform (default: %(default)s)")
    p.add_argument("--reserved-concurrency", type=int, default=None, metavar="N",
                   help="reserve N concurrent executions for the function (0 removes the reservation)")
    p.add_argument("--provisioned-concurrency", type=int, default=None, metavar="N",
                   help="keep N execution environments warm on the alias (0 removes it; billed while configured)")
    p.add_argument("--wait-provisioned", type=float, default=0.0, metavar="SECONDS",
                   help="wait up to SECONDS for provisioned concurrency to be READY (default: do not wait)")
    p.add_argument("--alias", default="live", help="alias to point at the new version (default: %(default)s)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment variable, repeatable; KEY=@FILE reads the value from FILE. Merged over the "
                        "function's current variables. The actors need NITRO_HMAC_KEY and NITRO_REDIS_PASSWORD")
    p.add_argument("--subnet-ids", metavar="ID,ID", help="run in these VPC subnets (to reach a private Redis)")
    p.add_argument("--security-group-ids", metavar="ID,ID", help="security groups for --subnet-ids")
    p.add_argument("--region", default=None, help="AWS region (default: the AWS configuration)")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout (action lines go to stderr)")
    p.set_defaults(func=cmd_deploy_lambda)


def cmd_deploy_lambda(args) -> int:
    from nitro.aws import lambda_deploy

    try:
        return lambda_deploy.run(args)
    except lambda_deploy.DeployError as exc:
        raise CliError(str(exc), exit_code=exc.exit_code) from None


# --- nitro pretrain-minions -----------------------------------------------------------------------


def _add_pretrain_minions(sub) -> None:
    from nitro.data.redis_client import url_from_env
    from nitro.scaling.minions_pretrain import PretrainSettings

    d = PretrainSettings()
    p = sub.add_parser("pretrain-minions", help="pre-train the MinionsRL actor scheduler for --scaler minions",
                       description="Train the learned actor scheduler (docs/minions.md) over short training jobs "
                                   "on the environment it will serve: each episode is one job whose actor counts "
                                   "the scheduler samples; PPO updates it after every few jobs. Writes a checkpoint "
                                   "for `nitro train --scaler minions --scheduler PATH` and prints the "
                                   "pre-training's wall time, CPU seconds, modelled dollar cost and the "
                                   "distribution of the actor counts the scheduler chooses.")
    p.add_argument("--env", default=d.env_id,
                   help="Gymnasium id of the training jobs: the environment the scheduler will serve "
                        "(default: %(default)s)")
    p.add_argument("--episodes", type=int, default=d.episodes, help="training jobs to run (default: %(default)s)")
    p.add_argument("--episodes-per-update", type=int, default=d.episodes_per_update, metavar="N",
                   help="jobs per PPO update of the scheduler (default: %(default)s)")
    p.add_argument("--rounds-per-episode", type=int, default=d.rounds_per_episode, metavar="R",
                   help="rounds of each job (default: %(default)s)")
    p.add_argument("--i-max", type=int, default=d.i_max, metavar="M",
                   help="most actors per round; jobs using the checkpoint need the same scaler.i_max "
                        "(default: %(default)s)")
    p.add_argument("--steps-per-actor", type=int, default=d.steps_per_actor, metavar="S",
                   help="environment steps per actor per round (default: %(default)s)")
    p.add_argument("--budget", type=float, default=d.budget_usd, metavar="USD",
                   help="budget of each job, the largest with --budget-min (default: %(default)s)")
    p.add_argument("--budget-min", type=float, default=d.budget_min_usd, metavar="USD",
                   help="each job's budget is drawn log-uniformly from [--budget-min, --budget], so the scheduler "
                        "learns what a short budget means; 0 gives every job --budget (default: %(default)s)")
    p.add_argument("--target-return", type=float, default=d.target_return, metavar="X",
                   help="return that ends a job with the terminal bonus; use the target of the jobs the "
                        "scheduler will serve (default: none)")
    p.add_argument("--return-scale", type=float, default=d.return_scale, metavar="X",
                   help="return gain worth one job's time allowance in the reward (default: measured, the "
                        "median spread of eval returns within the first update's jobs)")
    p.add_argument("--preset", default=d.preset, help="PPO preset of the training jobs (default: %(default)s)")
    p.add_argument("--eval-episodes", type=int, default=d.eval_episodes, metavar="N",
                   help="evaluation episodes per round; the reward needs them (default: %(default)s)")
    p.add_argument("--round-seconds-ref", type=float, default=d.round_seconds_ref, metavar="SECONDS",
                   help="reference round time of the time penalty (default: the first update's median)")
    p.add_argument("--holdout-jobs", type=int, default=d.holdout_jobs, metavar="N",
                   help="jobs the trained scheduler serves on unseen seeds to show its decisions "
                        "(--via inprocess; default: %(default)s)")
    p.add_argument("--out", default=d.out, help="checkpoint path (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="random seed (default: %(default)s)")
    run = p.add_argument_group("running")
    run.add_argument("--via", choices=("inprocess", "system"), default="inprocess",
                     help="run the jobs in this process, billed by the serverless round model (default), or "
                          "through a nitro system (the local one in --state-dir, or --target)")
    run.add_argument("--work-dir", default="", metavar="DIR",
                     help="--via system: where exploration checkpoints go; the scaler must read them "
                          "(default: a temporary dir)")
    _add_target(run, "--via system: learner address of a running system (needs --redis-url)")
    run.add_argument("--redis-url", default=url_from_env(default=None), metavar="URL",
                     help="--via system with --target: the system's Redis as the services' user (the "
                          "scheduler's decisions are read from the scaler's job state) (default: $NITRO_REDIS_URL)")
    _add_state_dir(run)
    p.set_defaults(func=cmd_pretrain_minions)


def _print_distribution(title: str, hist: dict[int, int]) -> None:
    from nitro.scaling.minions import format_distribution

    print(f"  {title}")
    for line in format_distribution(hist):
        print(f"    {line}")


def cmd_pretrain_minions(args) -> int:
    from nitro.config import make_config
    from nitro.data.redis_client import connect
    from nitro.errors import ConfigError, UnknownEnvironmentError
    from nitro.policy.envs import resolve_env_id
    from nitro.scaling.minions_pretrain import PretrainError, PretrainSettings, pretrain, redis_for_state_dir

    try:
        settings = PretrainSettings(
            env_id=args.env, episodes=args.episodes, episodes_per_update=args.episodes_per_update,
            rounds_per_episode=args.rounds_per_episode, i_max=args.i_max, steps_per_actor=args.steps_per_actor,
            budget_usd=args.budget, budget_min_usd=args.budget_min, target_return=args.target_return, return_scale=args.return_scale,
            seed=args.seed, preset=args.preset, eval_episodes=args.eval_episodes,
            round_seconds_ref=args.round_seconds_ref, holdout_jobs=args.holdout_jobs, out=args.out,
            work_dir=args.work_dir).validate()
        resolve_env_id(settings.env_id)
        if args.via == "inprocess":  # a system expands environment presets itself
            make_config("ppo", settings.preset)
    except UnknownEnvironmentError as exc:
        raise CliError(f"INVALID_ARGUMENT: env: {exc}", exit_code=2) from None
    except ConfigError as exc:
        raise CliError(f"INVALID_ARGUMENT: {exc}", exit_code=2) from None
    system = args.via == "system"
    explicit_target = args.target and args.target != os.environ.get("NITRO_TARGET")  # not just the variable
    if not system and (explicit_target or args.work_dir):
        flag = "--target" if explicit_target else "--work-dir"
        raise CliError(f"{flag} is only used with --via system (the default runs the jobs in this process)",
                       exit_code=2)
    if system and args.target and not args.redis_url:
        raise CliError("--target needs --redis-url (or $NITRO_REDIS_URL): the scheduler's decisions are read "
                       "from the scaler's job state", exit_code=2)
    print(f"pre-training the minions scheduler on {settings.env_id} ({args.via}): {settings.episodes} episodes x "
          f"{settings.rounds_per_episode} rounds, {settings.episodes_per_update} per update, I_max {settings.i_max}, "
          f"{settings.steps_per_actor} steps per actor, budget "
          + (f"${settings.budget_min_usd:g}-${settings.budget_usd:g}" if 0 < settings.budget_min_usd < settings.budget_usd
             else f"${settings.budget_usd:g}") + "/episode, target return "
          f"{settings.target_return:g}", flush=True)

    def log(line: str) -> None:
        print(line, flush=True)

    with contextlib.ExitStack() as stack:
        stack.enter_context(_signals(_raise_interrupt, (signal.SIGTERM,)))
        try:
            if not system:
                result = pretrain(settings, log=log)
            else:
                if args.target:
                    target, redis_client = args.target, connect(args.redis_url)
                else:
                    args.backend = "local"
                    target = stack.enter_context(_local_for_job(args))
                    redis_client = redis_for_state_dir(args.state_dir)
                client = stack.enter_context(_client(args, target))
                result = pretrain(settings, client, redis_client, log=log)
        except (PretrainError, ConfigError) as exc:
            raise CliError(str(exc)) from None
    trained = sum(ep.trained for ep in result.episodes)
    print(f"\nscheduler checkpoint  {result.path}  (use: nitro train --env {settings.env_id} --scaler minions "
          f"--scheduler {result.path} --i-min 1 --i-max {settings.i_max})")
    print(f"  episodes    {len(result.episodes)} ({trained} trained on)")
    print(f"  wall time   {result.wall_seconds:.1f} s")
    print(f"  CPU time    {result.cpu_seconds:.1f} s (this process and its children)")
    if result.via == "inprocess":
        print(f"  cost        ${result.cost_usd:.4f} modelled: the CPU seconds billed as Lambda actors (sampling) "
              f"and learner-server time (the rest); the jobs as cloud jobs would bill ${result.jobs_cost_usd:.4f}")
    else:
        print(f"  cost        ${result.cost_usd:.4f} (training jobs ${result.jobs_cost_usd:.4f} from the scaler's "
              f"ledger + this process's CPU as learner-server time ${result.cpu_cost_usd:.6f})")
    print(f"  references  round time {result.round_seconds_ref:.3f} s, return gain {result.return_scale:.4g}")
    print("decisions (greedy, as served; I_min 1):")
    if "holdout_jobs" in result.decisions:
        _print_distribution(f"in {settings.holdout_jobs} held-out jobs (unseen seeds):", result.decisions["holdout_jobs"])
    _print_distribution("on the inputs of the last update's jobs:", result.decisions["last_episodes"])
    sys.stdout.flush()
    return 0


# --- nitro eval / export --------------------------------------------------------------------------


def _at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {value}")
        return value

    return parse


def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help="run deterministic episodes with a trained policy: mean, IQM and a 95%% CI",
                       description="Load a checkpoint (checkpoint.pt, best.pt) or an export directory and run "
                                   "deterministic episodes, episode i on seed S+i, as the learner evaluates. "
                                   "Prints the mean return and the interquartile mean with a 95% bootstrap CI; "
                                   "exit code 2 for a missing or unreadable policy, an environment whose spaces "
                                   "do not fit it, or bad flags.")
    p.add_argument("policy", metavar="CHECKPOINT", help="checkpoint.pt, best.pt, or a directory from `nitro export`")
    p.add_argument("--env", default="", metavar="ID",
                   help="Gymnasium id (default: the environment the policy was trained on)")
    p.add_argument("--episodes", type=_at_least(1), default=10, metavar="N", help="episodes (default: %(default)s)")
    p.add_argument("--seed", type=_at_least(0), default=0, metavar="S",
                   help="episode i runs on seed S+i (default: %(default)s)")
    p.add_argument("--video", default=None, metavar="PATH",
                   help="record the first episode to PATH, .mp4 or .gif (rgb_array frames)")
    p.add_argument("--json", action="store_true",
                   help="print the result as one JSON object on stdout (the readable lines go to stderr)")
    p.set_defaults(func=cmd_eval)


def _policy_line(path: str, info: dict) -> str:
    known = [f"{info['env_id']} ({info.get('algo') or '?'})" if info.get("env_id") else ""]
    known += [f"{name} {info[key]}" for key, name in (("round", "round"), ("version", "policy version"))
              if info.get(key) is not None]
    return f"{path}: " + ", ".join(k for k in known if k)


def cmd_eval(args) -> int:
    from nitro.errors import NitroError
    from nitro.policy.evaluation import evaluate_policy
    from nitro.policy.trained import load_policy

    out = sys.stderr if args.json else sys.stdout
    try:
        policy = load_policy(args.policy)
        print(f"policy    {_policy_line(args.policy, policy.info)}", file=out, flush=True)
        result = evaluate_policy(policy, args.env, args.episodes, args.seed, args.video)
    except NitroError as exc:  # PolicyError, ConfigError, UnknownEnvironmentError: all bad input
        raise CliError(str(exc), exit_code=2) from None
    except OSError as exc:  # e.g. a video path that cannot be written
        raise CliError(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "), exit_code=2) from None
    doc = {"policy": args.policy, "policy_info": policy.info, **result.to_dict()}
    last = f"{result.seed}..{result.seed + len(result.returns) - 1}" if len(result.returns) > 1 else str(result.seed)
    print(f"episodes  {len(result.returns)} on {result.env_id}, seeds {last}, deterministic", file=out)
    print(f"return    mean {doc['mean']:.2f} (std {doc['std']:.2f}, min {doc['min']:.2f}, max {doc['max']:.2f})",
          file=out)
    low, high = result.iqm_ci95
    print(f"IQM       {result.iqm:.2f}, 95% CI [{low:.2f}, {high:.2f}] ({result.ci_method})", file=out)
    if result.video:
        print(f"video     {result.video}: episode 0 (seed {result.seed}), {result.video_frames} frames", file=out)
    if args.json:
        print(json.dumps(doc))
    return 0


def _add_export(sub) -> None:
    p = sub.add_parser("export", help="write a trained policy as weights + JSON, loadable without nitro's services",
                       description="Write policy.json (model spec, observation normalisation, source) and the "
                                   "weights (safetensors when installed, else numpy .npz) into DIR; "
                                   "nitro.load_policy(DIR) and `nitro eval DIR` read it back.")
    p.add_argument("policy", metavar="CHECKPOINT", help="checkpoint.pt, best.pt, or a directory from `nitro export`")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write (created if missing)")
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    from nitro.errors import PolicyError
    from nitro.policy.trained import export_policy, load_policy

    try:
        policy = load_policy(args.policy)
        path = export_policy(policy, args.out)
    except PolicyError as exc:
        raise CliError(str(exc), exit_code=2) from None
    except OSError as exc:
        raise CliError(f"--out {args.out}: {exc.strerror or exc}", exit_code=2) from None
    weights = json.loads(path.read_text())["weights"]
    print(f"exported {_policy_line(args.policy, policy.info)}")
    print(f"  to      {path.parent}/ ({path.name}, {weights})")
    print(f"  use     nitro.load_policy({str(path.parent)!r}) or nitro eval {path.parent}")
    return 0


# --- nitro check-env -----------------------------------------------------------------------------


def _add_check_env(sub) -> None:
    p = sub.add_parser("check-env", help="build and step an environment as an actor does: spaces, policy, speed",
                       description="Resolve ID as the services do (Gymnasium registry, ALE ids, 'module:EnvId' "
                                   "with the module listed in NITRO_ENV_MODULES), build it with the keyword "
                                   "arguments, and sample N steps with the actor's sampler and a freshly "
                                   "initialised policy. Prints the spaces, the network nitro would train, the "
                                   "episodes that ended, steps/s and warnings. Exit code 0 when nitro can train "
                                   "on it, 1 when it cannot (unsupported spaces, an error or NaN while "
                                   "stepping), 2 when it cannot be built (unknown id, module not allowed or not "
                                   "importable, keyword arguments rejected) or for bad flags.")
    p.add_argument("env", metavar="ID", help="Gymnasium id, e.g. CartPole-v1 or mymodule:MyEnv-v0")
    p.add_argument("--steps", type=_at_least(1), default=1000, metavar="N",
                   help="environment steps to sample (default: %(default)s)")
    p.add_argument("--env-kwarg", type=parse_env_kwarg, action="append", default=[], metavar="NAME=VALUE",
                   help="keyword argument for gym.make, VALUE read as JSON, as `nitro train --env-kwarg`; "
                        "repeatable")
    p.add_argument("--seed", type=_at_least(0), default=0, metavar="S",
                   help="seed of the environment's reset and the policy (default: %(default)s)")
    p.add_argument("--json", action="store_true",
                   help="print the report as one JSON object on stdout (the readable lines go to stderr)")
    p.set_defaults(func=cmd_check_env)


def cmd_check_env(args) -> int:
    import numpy as np

    from nitro.policy.env_check import EnvCheckError, check_env

    out = sys.stderr if args.json else sys.stdout
    try:
        r = check_env(args.env, steps=args.steps, env_kwargs=dict(args.env_kwarg), seed=args.seed)
    except EnvCheckError as exc:
        raise CliError(f"INVALID_ARGUMENT: {exc}", exit_code=exc.exit_code) from None
    source = f" (registered as {r.registered_id}" + (f", module {r.module_file}" if r.module_file else "") + ")" \
        if r.registered_id != r.env_id else ""
    print(f"environment  {r.env_id}{source}", file=out)
    if r.env_kwargs:
        print(f"env_kwargs   {json.dumps(r.env_kwargs)}", file=out)
    print(f"observation  {r.observation_space}", file=out)
    print(f"action       {r.action_space}", file=out)
    print(f"policy       {r.policy or 'none: these spaces are not supported'}", file=out)
    if r.steps:
        env_share = 100.0 * r.env_seconds / r.sample_seconds if r.sample_seconds > 0 else 0.0
        print(f"sampled      {r.steps} steps as an actor does, with an untrained policy: {r.episodes} "
              f"episode{'' if r.episodes == 1 else 's'} ended", file=out)
        if r.episodes:
            print(f"episodes     return mean {np.mean(r.episode_returns):.3g} (min {min(r.episode_returns):.3g}, "
                  f"max {max(r.episode_returns):.3g}), length mean {np.mean(r.episode_lengths):.1f}", file=out)
        print(f"speed        {r.steps_per_second:,.0f} steps/s, {env_share:.0f}% of it in the "
              f"environment (the rest: policy inference)", file=out)
    for w in r.warnings:
        print(f"warning      {w}", file=out)
    for problem in r.problems:
        print(f"problem      {problem}", file=out)
    print(f"{'ok' if r.ok else 'NOT OK'}: nitro {'can' if r.ok else 'cannot'} train on {r.env_id}", file=out)
    if args.json:
        print(json.dumps(r.to_dict()))
    return 0 if r.ok else 1


# --- entry point ---------------------------------------------------------------------------------

def _add_presets(sub) -> None:
    p = sub.add_parser("presets", help="list the algorithm and environment presets and what each sets",
                       description="One line per preset: algorithm presets (--preset with --algo) and environment "
                                   "presets (--preset alone).")
    p.set_defaults(func=cmd_presets)


def cmd_presets(args) -> int:
    from nitro.preset_catalog import lines

    print("\n".join(lines()))
    return 0


COMMANDS = (_add_up, _add_down, _add_status, _add_train, _add_watch, _add_stop, _add_list, _add_eval,
            _add_export, _add_check_env, _add_deploy_lambda, _add_pretrain_minions, _add_presets)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nitro", description="Distributed deep RL with serverless actors and "
                                                          "Nitro boosting.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except NitroRpcError as exc:
        target = getattr(args, "learner_target", None)
        hint = "" if exc.code != grpc.StatusCode.UNAVAILABLE else \
            f" (is a learner up at {target}? `nitro status`)" if target else " (is the system up? `nitro status`)"
        print(f"error: {exc.code.name}: {exc.details}{hint}", file=sys.stderr)
        return 2 if exc.code in BAD_INPUT else 1
    except InvalidSpec as exc:
        print(f"error: INVALID_ARGUMENT: {exc}", file=sys.stderr)
        return 2
    except (CliError, ls.LocalSystemError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `nitro status | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
