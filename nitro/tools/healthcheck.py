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
          ca_file: str | None = None, server_name: str | None = None) -> str:
    """The serving status name, or 'unreachable: <why>'. Health needs no token (nitro.rpc.auth leaves it open)."""
    options = [("grpc.enable_http_proxy", 0)]  # a probe talks to its own container, never through a proxy
    if tls:
        root = None
        if ca_file:
            with open(ca_file, "rb") as f:
                root = f.read()
        if server_name:  # the certificate names the service, while the probe dials 127.0.0.1
            options.append(("grpc.ssl_target_name_override", server_name))
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root), options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    try:
        with channel:
            resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                             timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    except grpc.RpcError as exc:
        return f"unreachable: {exc.code().name}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nitro.tools.healthcheck",
                                description="Ask a gRPC health service whether it is SERVING.")
    p.add_argument("address", nargs="?", default=os.environ.get("NITRO_HEALTH_ADDR"),
                   help="HOST:PORT, e.g. 127.0.0.1:50051 (default: $NITRO_HEALTH_ADDR, which the images set)")
    p.add_argument("--service", default="", help="service name to ask about (default: the whole server)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds (default: %(default)s)")
    # A service started with NITRO_TLS_CERT serves TLS only: follow it, so the image's HEALTHCHECK keeps working.
    p.add_argument("--tls", action="store_true", default=bool(os.environ.get("NITRO_TLS_CERT")),
                   help="connect with TLS (default: on when $NITRO_TLS_CERT is set)")
    p.add_argument("--ca-file", default=os.environ.get("NITRO_TLS_CA"),
                   help="PEM roots for --tls (default: $NITRO_TLS_CA, else the system's)")
    p.add_argument("--server-name", default=os.environ.get("NITRO_HEALTH_SERVER_NAME"),
                   help="name to verify in the server certificate (default: $NITRO_HEALTH_SERVER_NAME)")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing")
    args = p.parse_args(argv)
    if not args.address:
        p.error("give HOST:PORT or set NITRO_HEALTH_ADDR")
    status = check(args.address, args.service, args.timeout, tls=args.tls, ca_file=args.ca_file,
                   server_name=args.server_name)
    if not args.quiet:
        print(f"{args.address} {args.service or '(server)'}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
