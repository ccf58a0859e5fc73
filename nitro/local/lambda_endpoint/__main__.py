"""CLI: python -m nitro.local.lambda_endpoint --port P --function NAME=module.func [...]"""

from __future__ import annotations

import argparse
import json
import logging
import os

from nitro.contracts import DEFAULT_ACTOR_MEMORY_MB

from .config import FUNCTIONS_ENV, FunctionConfig
from .server import run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m nitro.local.lambda_endpoint",
                                description="Local AWS Lambda-compatible invoke endpoint.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed once listening)")
    p.add_argument("--function", action="append", default=[], metavar="NAME=module.func",
                   help="a function to serve; repeatable")
    p.add_argument("--memory", type=int, default=DEFAULT_ACTOR_MEMORY_MB,
                   help="memory size in MB (reported, not enforced; default %(default)s)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--workers", type=int, default=None, help="warm worker processes per function")
    p.add_argument("--async-retries", type=int, default=2)
    # Used by LocalLambda: its handshake pipes (the full FunctionConfigs come as JSON in $NITRO_LAMBDA_FUNCTIONS).
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--lifeline-fd", type=int, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    # Popped: the workers' environment is built from this process's, and they need no copy of it.
    functions = [FunctionConfig.from_dict(d) for d in json.loads(os.environ.pop(FUNCTIONS_ENV, "") or "[]")]
    for spec in args.function:
        name, sep, handler = spec.partition("=")
        if not sep:
            raise SystemExit(f"--function expects NAME=module.func, got {spec!r}")
        functions.append(FunctionConfig(name, handler, memory_mb=args.memory, timeout_s=args.timeout,
                                        concurrency=args.concurrency, max_workers=args.workers,
                                        async_retries=args.async_retries))
    if not functions:
        raise SystemExit("no functions: pass at least one --function NAME=module.func")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    run(functions, args.host, args.port, ready_fd=args.ready_fd, lifeline_fd=args.lifeline_fd,
        print_url=args.ready_fd is None)


if __name__ == "__main__":
    main()
