"""The `nitro` command: run the local system and train through the SDK.

Each subcommand lives in nitro.client.commands: an `add_<command>` function builds
its parser and points it at `cmd_<command>`, which takes what it needs from the
parsed flags as explicit values (FollowOptions, LocalSystemOptions); a new
subcommand is one more pair and one more entry in COMMANDS. Errors end as one line on stderr, "error: <STATUS>: <message>",
with exit code 2 for bad input and 1 otherwise; Ctrl-C exits with 130.
`train` and `watch` end with the job's state: 0 SUCCEEDED, 1 FAILED, 3 STOPPED;
they follow a job across a learner restart, and a job they leave unfinished is
exit code 4 when the system or its learner went away for good (1 for any other
cause), with its last known state, its checkpoint and the commands that go on with it.
"""

from __future__ import annotations

import argparse
import os
import sys

import nitro

# `pip install nitro-rl` alone (the core) lacks the training system that every command runs on: then `nitro
# --version` and `--help` still answer, and a command says which extra to install (_without_system).
_MISSING: ModuleNotFoundError | None = None
try:
    import grpc

    from nitro.client.commands.common import BAD_INPUT, CliError
    from nitro.client.commands.deploy import add_deploy_lambda
    from nitro.client.commands.environment import add_check_env
    from nitro.client.commands.jobs import add_list, add_stop, add_watch
    from nitro.client.commands.minions import add_pretrain_minions
    from nitro.client.commands.policy import add_eval, add_export
    from nitro.client.commands.presets import add_presets
    from nitro.client.commands.system import add_down, add_status, add_up
    from nitro.client.commands.train import add_train
    from nitro.client.commands.tune import add_tune
    from nitro.client.sdk import NitroRpcError
    from nitro.errors import LocalSystemError
    from nitro.spec import InvalidSpec
except ModuleNotFoundError as exc:
    if nitro._needs_system("nitro", exc) is None:
        raise
    _MISSING = exc
else:
    COMMANDS = (add_up, add_down, add_status, add_train, add_watch, add_stop, add_list, add_eval,
                add_export, add_check_env, add_deploy_lambda, add_pretrain_minions, add_presets, add_tune)


def _base_parser(epilog: str | None = None) -> argparse.ArgumentParser:
    """The parser's program name, description and --version, with or without the commands; `epilog` as written."""
    p = argparse.ArgumentParser(prog="nitro", description="Distributed deep RL with serverless actors and "
                                                          "Nitro boosting.", epilog=epilog,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"nitro {nitro.__version__}")
    return p


def build_parser() -> argparse.ArgumentParser:
    p = _base_parser()
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return p


def _without_system(argv: list[str] | None, missing: ModuleNotFoundError) -> int:
    """`nitro` where only the core is installed: --version and --help answer; a command fails, naming the extra."""
    import textwrap

    error = nitro._needs_system("Every nitro command (train, eval, export, up ...)", missing)
    epilog = (f"{error}. Without it, nitro loads and runs exported policies from Python: "
              f"nitro.load_policy(DIR).predict(obs).")
    p = _base_parser(epilog=textwrap.fill(epilog, 100, break_on_hyphens=False))
    p.add_argument("command", metavar="COMMAND", help="a nitro command (all need the training system)")
    args, _ = p.parse_known_args(argv)  # the command's own flags: whatever they are, the answer is the same
    print(f"error: {nitro._needs_system(f'nitro {args.command}', missing)}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    if _MISSING is not None:
        return _without_system(argv, _MISSING)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except NitroRpcError as exc:
        target = exc.target
        if exc.code == grpc.StatusCode.UNAVAILABLE:
            hint = f" (is a learner up at {target}? `nitro status`)" if target else " (is the system up? `nitro status`)"
        else:
            hint = f" ({exc.hint})" if exc.hint else ""  # UNAUTHENTICATED: where the token is
        print(f"error: {exc.code.name}: {exc.details}{hint}", file=sys.stderr)
        return 2 if exc.code in BAD_INPUT else 1
    except InvalidSpec as exc:
        print(f"error: INVALID_ARGUMENT: {exc}", file=sys.stderr)
        return 2
    except (CliError, LocalSystemError) as exc:
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
