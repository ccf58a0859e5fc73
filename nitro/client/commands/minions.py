"""`nitro pretrain-minions`: pre-train the MinionsRL actor scheduler."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from nitro.client.commands.common import (
    CliError,
    add_state_dir,
    add_target,
    learner_client,
    raise_interrupt,
    routed_signals,
)
from nitro.client.commands.system import LocalSystemOptions, local_system_for_job
from nitro.cmdline import REDIS_PASSWORD_INSTEAD, URLWithoutPassword


def add_pretrain_minions(sub) -> None:
    from nitro.data.redis_client import url_from_env
    from nitro.training.minions_pretrain import PretrainSettings

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
    add_target(run, "--via system: learner address of a running system (needs --redis-url)")
    run.add_argument("--redis-url", default=url_from_env(default=None), metavar="URL", action=URLWithoutPassword,
                     instead=REDIS_PASSWORD_INSTEAD,
                     help="--via system with --target: the system's Redis as the services' user (the "
                          "scheduler's decisions are read from the scaler's job state) (default: $NITRO_REDIS_URL)")
    add_state_dir(run)
    p.set_defaults(func=cmd_pretrain_minions)


def _print_distribution(title: str, hist: dict[int, int]) -> None:
    from nitro.scaling.minions import format_distribution

    print(f"  {title}")
    for line in format_distribution(hist):
        print(f"    {line}")


def cmd_pretrain_minions(args) -> int:
    from nitro.config import make_config
    from nitro.data.redis_client import connect, with_credentials
    from nitro.errors import ConfigError, UnknownEnvironmentError
    from nitro.local.system_state import redis_for_state_dir
    from nitro.policy.envs import resolve_env_id
    from nitro.training.minions_pretrain import PretrainError, PretrainSettings, pretrain

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
        stack.enter_context(routed_signals(raise_interrupt, (signal.SIGTERM,)))
        try:
            if not system:
                result = pretrain(settings, log=log)
            else:
                if args.target:
                    target, redis_client = args.target, connect(with_credentials(args.redis_url))
                else:
                    target = stack.enter_context(local_system_for_job(LocalSystemOptions(args.state_dir)))
                    redis_client = redis_for_state_dir(args.state_dir)
                client = stack.enter_context(learner_client(args, target))
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
