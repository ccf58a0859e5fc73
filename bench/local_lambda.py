"""Overhead of the local Lambda endpoint: 1,000 no-op invocations through boto3 at concurrency 64.

Primary figure: the endpoint's own added overhead per invocation, measured server-side from
the request fully read to the response handed to the socket, minus the handler's duration
(X-Nitro-Server-Ms - X-Nitro-Duration-Ms). Client-observed latency is printed beside it; with 64
boto3 threads in one process on a 2-core machine it is dominated by the client's own GIL
queueing (signing, serialising, parsing), which is not the endpoint's cost.

    .venv/bin/python bench/local_lambda.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import urllib3
from botocore.config import Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's nitro, here and in the workers

from nitro.local.lambda_endpoint import FunctionConfig, LocalLambda  # noqa: E402
from nitro.tools import lambda_handlers  # noqa: E402

N = 1000
CONCURRENCY = 64
TARGET_MS = 5.0


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def cpu_seconds(root_pid: int) -> tuple[float, float]:
    """CPU time (user+system) of the endpoint process and, separately, of its worker children."""
    tick = os.sysconf("SC_CLK_TCK")
    own = children = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        if int(entry) == root_pid:
            own += cpu
        elif int(fields[1]) == root_pid:  # ppid
            children += cpu
    return own, children


def run_parallel(fn, n: int, threads: int) -> tuple[list, float]:
    """Call fn() n times from `threads` threads; return (results, wall seconds)."""
    counter = iter(range(n))
    lock = threading.Lock()
    results: list = []

    def loop() -> None:
        while True:
            with lock:
                if next(counter, None) is None:
                    return
            r = fn()
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        for f in [ex.submit(loop) for _ in range(threads)]:
            f.result()
    return results, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default: the endpoint's)")
    args = parser.parse_args()
    fn = FunctionConfig("noop", "nitro.tools.lambda_handlers.noop", concurrency=CONCURRENCY,
                        max_workers=args.workers)
    with LocalLambda([fn]) as ll:
        client = boto3.client(
            "lambda", endpoint_url=ll.endpoint_url, region_name="us-east-1", aws_access_key_id="test",
            aws_secret_access_key="test",
            config=Config(max_pool_connections=CONCURRENCY, retries={"total_max_attempts": 1}))

        def invoke() -> tuple[float, float, float, float]:
            t0 = time.perf_counter()
            r = client.invoke(FunctionName="noop", Payload=b"{}")
            r["Payload"].read()
            latency = (time.perf_counter() - t0) * 1000
            h = r["ResponseMetadata"]["HTTPHeaders"]
            assert r["StatusCode"] == 200 and "FunctionError" not in r, r
            return (latency, float(h["x-nitro-duration-ms"]), float(h["x-nitro-server-ms"]),
                    float(h["x-nitro-queue-ms"]), float(h["x-nitro-body-wait-ms"]))

        run_parallel(invoke, 300, CONCURRENCY)  # warm-up: connections, workers, imports
        seq, _ = run_parallel(invoke, 200, 1)
        cpu0 = cpu_seconds(ll.pid)
        results, wall = run_parallel(invoke, N, CONCURRENCY)
        cpu1 = cpu_seconds(ll.pid)
        server_cpu_ms = (cpu1[0] - cpu0[0]) * 1000 / N
        worker_cpu_ms = (cpu1[1] - cpu0[1]) * 1000 / N

        # Reference 1: a bare HTTP round trip to /healthz at the same concurrency, plain urllib3.
        http = urllib3.PoolManager(maxsize=CONCURRENCY)
        health_url = ll.endpoint_url + "/healthz"

        def healthz() -> float:
            t0 = time.perf_counter()
            http.request("GET", health_url).data
            return (time.perf_counter() - t0) * 1000

        run_parallel(healthz, 300, CONCURRENCY)
        health, health_wall = run_parallel(healthz, N, CONCURRENCY)

    # Reference 2: the handler called directly in-process.
    reps = 100_000
    t0 = time.perf_counter()
    for _ in range(reps):
        lambda_handlers.noop({}, None)
    direct_ms = (time.perf_counter() - t0) * 1000 / reps

    latency = [r[0] for r in results]
    duration = [r[1] for r in results]
    server_overhead = [r[2] - r[1] for r in results]
    client_overhead = [r[0] - r[1] for r in results]
    queue = [r[3] for r in results]
    body_wait = [r[4] for r in results]
    amortized = wall * 1000 / N
    health_amortized = health_wall * 1000 / N
    median_overhead = statistics.median(server_overhead)

    print(f"local lambda, {N} no-op invocations via boto3, {CONCURRENCY} client threads, concurrency {CONCURRENCY}, "
          f"{fn.workers} workers, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    print(f"  endpoint-added overhead (server-side, whole request read -> response written, minus handler): "
          f"median {median_overhead:.3f} ms, p90 {pct(server_overhead, 0.9):.3f} ms, p99 {pct(server_overhead, 0.99):.3f} ms")
    print(f"    of which waiting for a free worker: median {statistics.median(queue):.3f} ms, p90 {pct(queue, 0.9):.3f} ms")
    print(f"  client-side gap between its request head and body (urllib3 2 sends them separately; the "
          f"thread re-acquires the GIL in between), not counted above: median {statistics.median(body_wait):.3f} ms, "
          f"p90 {pct(body_wait, 0.9):.3f} ms")
    print(f"  handler duration reported by the worker: median {statistics.median(duration) * 1000:.1f} us")
    print(f"  client-observed latency (incl. boto3 GIL queueing of 64 threads): median {statistics.median(latency):.2f} ms, "
          f"p90 {pct(latency, 0.9):.2f} ms; minus handler: median {statistics.median(client_overhead):.2f} ms")
    print(f"  sequential (1 client thread) latency: median {statistics.median(r[0] for r in seq):.2f} ms, "
          f"server-side overhead median {statistics.median(r[2] - r[1] for r in seq):.3f} ms")
    print(f"  CPU per invocation: endpoint process {server_cpu_ms:.3f} ms, worker processes {worker_cpu_ms:.3f} ms "
          f"(the rest of {amortized * os.cpu_count():.2f} core-ms goes to the boto3 client and anything else running)")
    print(f"  amortized wall per invocation: {amortized:.3f} ms ({N / wall:.0f} invocations/s)")
    print(f"  reference: bare GET /healthz via urllib3 at concurrency {CONCURRENCY}: median {statistics.median(health):.2f} ms, "
          f"amortized {health_amortized:.3f} ms ({N / health_wall:.0f}/s)")
    print(f"  reference: direct in-process handler call: {direct_ms * 1000:.3f} us")
    print(f"  ratio (amortized invoke / amortized bare HTTP round trip): {amortized / health_amortized:.2f}")
    print(json.dumps({
        "benchmark": "local_lambda",
        "invocations": N,
        "concurrency": CONCURRENCY,
        "median_overhead_ms": round(median_overhead, 4),
        "p90_overhead_ms": round(pct(server_overhead, 0.9), 4),
        "overhead_basis": "server-side: whole request read -> response written, minus handler duration",
        "client_head_body_gap_median_ms": round(statistics.median(body_wait), 3),
        "client_median_latency_ms": round(statistics.median(latency), 3),
        "client_p90_latency_ms": round(pct(latency, 0.9), 3),
        "client_median_overhead_ms": round(statistics.median(client_overhead), 3),
        "amortized_ms_per_invocation": round(amortized, 4),
        "throughput_per_s": round(N / wall, 1),
        "endpoint_cpu_ms_per_invocation": round(server_cpu_ms, 3),
        "worker_cpu_ms_per_invocation": round(worker_cpu_ms, 3),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "reference_direct_call_ms": round(direct_ms, 6),
        "reference_healthz_amortized_ms": round(health_amortized, 4),
        "reference_healthz_median_ms": round(statistics.median(health), 3),
        "ratio": round(amortized / health_amortized, 3),
        "ratio_basis": "amortized invoke / amortized bare GET /healthz, same concurrency",
        "target_ms": TARGET_MS,
        "meets_target": median_overhead <= TARGET_MS,
    }))


if __name__ == "__main__":
    main()
