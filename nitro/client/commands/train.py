"""`nitro train`: the flags of a training spec, the spec they build, the AWS backend checks, the run."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal

import grpc

from nitro.client.commands.common import (
    BAD_INPUT,
    CliError,
    add_state_dir,
    add_target,
    learner_client,
    raise_interrupt,
    resolve_target,
    routed_signals,
)
from nitro.client.commands.follow import FollowOptions, add_outputs, open_job_trackers, run_job
from nitro.client.commands.system import LocalSystemOptions, aws_backend, local_system_for_job
from nitro.contracts import FIXED_ACTORS_BY_ALGO, SCALING_POLICIES
from nitro.local import system_state
from nitro.spec import InvalidSpec, ScalerSettings, StellarisSettings, TrainingSpec, parse_policy

SCALER_POLICIES = "|".join(SCALING_POLICIES) + "|fixed:N"


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
     "comma-separated actor counts per round, e.g. 8,16,12; later rounds repeat the last (--scaler replay, "
     "noise-replay)"),
    ("--floor-actors", "scaler.floor_actors", int, "F of the floor round(F * d_f^(k^2)) (--scaler nitro-floor)"),
    ("--floor-decay", "scaler.floor_decay", float, "d_f of that floor (--scaler nitro-floor)"),
    ("--kappa", "scaler.kappa", float, "kappa of kappa * sqrt(B_simple * a / c) (--scaler noise, noise-adascale)"),
    ("--grow-f1", "scaler.grow_f1", float, "fraction of the job after which I_min doubles (--scaler grow)"),
    ("--grow-f2", "scaler.grow_f2", float, "fraction after which it doubles again (--scaler grow)"),
    ("--rounds", "rounds", int, "training rounds"),
    ("--steps-per-actor", "steps_per_actor", int, "environment steps each actor samples per round"),
    ("--envs-per-actor", "envs_per_actor", int, "environments each actor steps in lockstep with one batched "
     "inference per step (1-256; at most steps-per-actor // 32 run; --steps-per-actor stays the total an actor returns)"),
    ("--budget", "budget_usd", float, "budget in USD; the job stops when the next round is unaffordable"),
    ("--budget-clock", "budget_clock", str,
     "the bill the budget binds on: cloud (modelled AWS bill, default) or machine (docs/cost.md)"),
    ("--seed", "seed", int, "random seed"),
    ("--eval-episodes", "eval_episodes", int, "deterministic evaluation episodes per evaluated round"),
    ("--eval-every", "eval_every", int, "evaluate after every N-th round and after the last (default 1)"),
    ("--evaluation", "evaluation", str, "where evaluation episodes run: functions (serverless, in parallel with the "
     "next round; default) or learner (on the learner, between rounds); docs/evaluation.md"),
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
    ("--vtrace-critic", "vtrace_critic", str, "IMPACT: the critic V-trace reads, online (the learner's, recomputed "
     "every minibatch step) or target (the target network's, with the actors' bootstrap values) [the preset's: "
     "online]"),
]


def _dest(field: str) -> str:
    return "spec__" + field.replace(".", "__")


def _fixed_counts(prefix: str = "") -> str:
    """The fixed actor count of each algorithm, e.g. '8 for ppo, 16 for impact' (prefix 'fixed:' for --scaler)."""
    return ", ".join(f"{prefix}{n} for {algo}" for algo, n in FIXED_ACTORS_BY_ALGO.items())


def default_scaler() -> str:
    """The server's scaling policy when --scaler is not given, as --scaler would name it (fixed:N per algorithm)."""
    sc = _SCALER_DEFAULTS
    if sc.policy != "fixed":
        return sc.policy
    return _fixed_counts(f"{sc.policy}:")


def _default_of(field: str):
    if field == "scaler.fixed_actors":  # 0 in the spec: the algorithm's count
        return _fixed_counts()
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
    try:
        policy, count = parse_policy(text, "--scaler")
    except InvalidSpec as exc:
        raise argparse.ArgumentTypeError(exc.detail) from None
    if not policy:
        raise argparse.ArgumentTypeError(f"expected one of {SCALER_POLICIES}, got {text!r}")
    return policy, count


def add_train(sub) -> None:
    p = sub.add_parser("train", help="submit a training job, watch it, write the results",
                       description="Start a job, show its progress, and write results/<job>/{rounds.csv, "
                                   "summary.json, training.png, checkpoint.pt}. Flags not given take the "
                                   "server's defaults (shown in brackets).")
    spec = p.add_argument_group("training spec")
    for flag, field, typ, text in TRAIN_FIELDS:
        default = _default_of(field)
        shown = f" [{default}]" if default not in ("", None, [], {}) else ""
        metavars: dict[object, str] = {int: "N", float: "X", str: field.upper()}
        metavar = metavars.get(typ, "W,W")
        spec.add_argument(flag, dest=_dest(field), type=typ, default=None, metavar=metavar, help=text + shown)
    spec.add_argument("--scaler", type=parse_scaler, default=None, metavar="POLICY",
                      help=f"scaling policy: {SCALER_POLICIES} [{default_scaler()}]")
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
    add_target(run, "learner address")
    add_state_dir(run)
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
    run.add_argument("--seeds", type=int, default=None, metavar="N",
                     help="run the spec over N seeds at once (--seed and the N-1 after it) within the one budget "
                          "(--budget, split equally), then summarise the final return (IQM, 95%% stratified-bootstrap "
                          "CI) in results/<job>/seeds.json and seeds.png (docs/cli.md)")
    run.add_argument("--resume", metavar="JOB_ID", default=None,
                     help="continue an interrupted job from its last checkpoint (its spec is the saved one; "
                          "spec flags are ignored)")
    add_outputs(p)
    p.set_defaults(func=cmd_train)


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
    if args.reproducible:
        spec["reproducible"] = True
    if args.hp:
        spec["hyperparameters"] = dict(args.hp)
    if args.env_kwarg:
        spec["env_kwargs"] = dict(args.env_kwarg)
    scheduler = spec.get("scaler", {}).get("scheduler")
    if scheduler:  # the services resolve paths against their own working directory
        spec["scaler"]["scheduler"] = os.path.abspath(os.path.expanduser(scheduler))
    from nitro import spec_file

    if args.config:  # the file, then the flags over it
        spec = spec_file.merge(spec_file.load(args.config), spec)
    spec_file.check_keys(spec)  # e.g. a hyperparameter name the algorithm does not have
    from nitro.presets import is_env_preset

    if not spec.get("env_id") and not is_env_preset(spec.get("preset", "")):
        raise InvalidSpec("env_id", "is required: pass --env, e.g. --env CartPole-v1, or an environment preset "
                                    "such as --preset hopper-ppo, or env_id in a --config file")
    return spec


def check_before_starting(spec: dict) -> None:
    """Refuse a spec here as the local learner would (the same code, `nitro.spec.validate`), so bad input costs
    no system start. CliError with the learner's status and detail, and the exit code that answer gets."""
    from nitro.client.sdk import spec_to_proto
    from nitro.errors import ConfigError
    from nitro.spec import from_proto, refusal, validate

    try:
        validate(from_proto(spec_to_proto(spec)))
    except ConfigError as exc:
        status, detail = refusal(exc)
        raise CliError(f"{status}: {detail}", exit_code=2 if grpc.StatusCode[status] in BAD_INPUT else 1) from None


def cmd_train(args) -> int:
    if args.seeds is not None:
        _check_seed_flags(args)
    spec = {"job_id": args.resume} if args.resume else build_spec(args)
    if args.local and not args.resume and not system_state.running_state(args.state_dir):
        check_before_starting(spec)  # a system already up decides itself: its learner's PYTHONPATH may differ
    follow = FollowOptions.from_args(args)
    trackers = open_job_trackers(follow)  # a missing tracking package is bad input, before a system or job starts
    aws = aws_backend(args) if args.backend == "aws" else {}
    system = LocalSystemOptions(args.state_dir, backend=args.backend, aws=aws)
    with contextlib.ExitStack() as stack:
        stack.enter_context(routed_signals(raise_interrupt, (signal.SIGTERM,)))  # a kill ends it like Ctrl-C
        target = stack.enter_context(local_system_for_job(system)) if args.local else resolve_target(args)
        client = stack.enter_context(learner_client(args, target))
        if args.seeds is not None:
            from nitro.client.commands.seeds import run_seeds

            return run_seeds(client, spec, args.seeds, follow)
        return run_job(client, spec, follow, trackers, resume=args.resume)


def _check_seed_flags(args) -> None:
    """--seeds: flags that follow one job do not combine with it."""
    from nitro.client.commands.seeds import check_seeds

    check_seeds(args.seeds)
    for flag, given in (("--resume", args.resume), ("--tensorboard", args.tensorboard),
                        ("--wandb-project", args.wandb_project)):
        if given:
            raise CliError(f"{flag} follows one job; it does not combine with --seeds (resume or log each job "
                           f"GROUP-s<seed> with its own command)", exit_code=2)
