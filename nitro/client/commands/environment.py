"""`nitro check-env`: build and step an environment exactly as an actor does."""

from __future__ import annotations

import json
import sys

from nitro.client.commands.common import CliError, at_least
from nitro.client.commands.train import parse_env_kwarg


def add_check_env(sub) -> None:
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
    p.add_argument("--steps", type=at_least(1), default=1000, metavar="N",
                   help="environment steps to sample (default: %(default)s)")
    p.add_argument("--env-kwarg", type=parse_env_kwarg, action="append", default=[], metavar="NAME=VALUE",
                   help="keyword argument for gym.make, VALUE read as JSON, as `nitro train --env-kwarg`; "
                        "repeatable")
    p.add_argument("--seed", type=at_least(0), default=0, metavar="S",
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
