"""What every nitro subcommand shares: errors, the state-dir and learner-target flags, the client of a
learner, signal routing."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal

import grpc

from nitro.client.sdk import DEFAULT_TARGET, TARGET_ENV, NitroClient, find_target
from nitro.cmdline import RefusedSecretFlag
from nitro.errors import ConfigError
from nitro.local import system_state
from nitro.rpc import auth

BAD_INPUT = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.NOT_FOUND,
             grpc.StatusCode.ALREADY_EXISTS}


class CliError(Exception):
    def __init__(self, message: str, exit_code: int = 1):
        self.exit_code = exit_code
        super().__init__(message)


STATE_DIR_DEFAULT = system_state.default_state_dir()


def add_state_dir(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--state-dir", default=STATE_DIR_DEFAULT,
                   help="where the local system keeps state.json, logs, keys and data (default: %(default)s)")


def add_target(p: argparse.ArgumentParser | argparse._ArgumentGroup, help_text: str) -> None:
    p.add_argument("--target", default=os.environ.get(TARGET_ENV), metavar="HOST:PORT",
                   help=f"{help_text} (default: $NITRO_TARGET, else the learner in --state-dir's state.json)")
    p.add_argument("--token-file", default=None, metavar="FILE",
                   help="a file holding the access token (its first line; default: the local system's when the "
                        "target is its learner, else $NITRO_TOKEN or $NITRO_TOKEN_FILE)")
    p.add_argument("--token", action=RefusedSecretFlag, what="an access token",
                   instead="--token-file FILE, or $NITRO_TOKEN_FILE or $NITRO_TOKEN in the environment")
    p.add_argument("--tls-ca", default=os.environ.get("NITRO_TLS_CA"), metavar="PEM",
                   help="CA certificate of a learner serving TLS (default: $NITRO_TLS_CA)")


def learner_client(args, target: str) -> NitroClient:
    """A client for `target` with the token of --token-file, else the one the SDK finds (`sdk.find_token`: the
    local system's goes only to the local system's learner)."""
    token = None
    try:
        if args.token_file:
            token = auth.read_token_file(args.token_file, f"--token-file {args.token_file!r}")[0]
        return NitroClient(target, token=token, state_dir=args.state_dir, tls_ca=args.tls_ca)
    except ConfigError as exc:  # a token file or $NITRO_TOKEN(_FILE) that cannot be used
        raise CliError(str(exc), exit_code=2) from None


def resolve_target(args) -> str:
    """--target, else $NITRO_TARGET, else the learner of the local system up in --state-dir (`sdk.find_target`)."""
    target = find_target(args.target, args.state_dir)
    if target:
        return target
    raise CliError(f"nitro is not up (no running system in {args.state_dir}): run `nitro up`, "
                   f"or pass --local, or --target HOST:PORT (e.g. {DEFAULT_TARGET})")


@contextlib.contextmanager
def routed_signals(handler, signals=(signal.SIGINT, signal.SIGTERM)):
    """Route the signals to `handler` inside the block."""
    old = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def raise_interrupt(*_):
    raise KeyboardInterrupt


def at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {value}")
        return value

    return parse
