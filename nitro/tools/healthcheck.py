"""`python -m nitro.tools.healthcheck [HOST:PORT]`: exit 0 when the gRPC health service says SERVING.

For container HEALTHCHECKs and exec probes. It imports grpc and the health
stubs only, so a probe costs a fraction of a second rather than a torch import.
Exit codes: 0 SERVING, 1 anything else (NOT_SERVING, SERVICE_UNKNOWN, unreachable).
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, service: str = "", timeout: float = 3.0, *, tls: bool = False,
          ca_file: str | None = None, token: str | None = None) -> str:
    """The serving status name, or 'unreachable: <why>'."""
    options = [("grpc.enable_http_proxy", 0)]  # a probe talks to its own pod, never through a proxy
    if tls:
        root = None
        if ca_file:
            with open(ca_file, "rb") as f:
                root = f.read()
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root), options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    metadata = [("authorization", f"Bearer {token}")] if token else None
    try:
        with channel:
            resp = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout, metadata=metadata)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    except grpc.RpcError as exc:
        return f"unreachable: {exc.code().name}"


def _token() -> str | None:
    if os.environ.get("NITRO_TOKEN"):
        return os.environ["NITRO_TOKEN"]
    path = os.environ.get("NITRO_TOKEN_FILE")
    if path and os.path.isfile(path):
        with open(path) as f:
            return f.read().strip() or None
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nitro.tools.healthcheck",
                                description="Ask a gRPC health service whether it is SERVING.")
    p.add_argument("address", nargs="?", default=os.environ.get("NITRO_HEALTH_ADDR"),
                   help="HOST:PORT, e.g. 127.0.0.1:50051 (default: $NITRO_HEALTH_ADDR, which the images set)")
    p.add_argument("--service", default="", help="service name to ask about (default: the whole server)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds (default: %(default)s)")
    p.add_argument("--tls", action="store_true", help="connect with TLS")
    p.add_argument("--ca-file", help="PEM roots for --tls (default: the system's)")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing")
    args = p.parse_args(argv)
    if not args.address:
        p.error("give HOST:PORT or set NITRO_HEALTH_ADDR")
    # The bearer token (if the server wants one) is read from the service's own environment.
    status = check(args.address, args.service, args.timeout, tls=args.tls, ca_file=args.ca_file, token=_token())
    if not args.quiet:
        print(f"{args.address} {args.service or '(server)'}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
