"""The local Lambda endpoint, driven by a real boto3 lambda client."""

from __future__ import annotations

import base64
import json
import math
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from nitro.aws.lambda_report import parse_report
from nitro.contracts import DEFAULT_ACTOR_MEMORY_MB
from nitro.local.lambda_endpoint import FunctionConfig, LocalLambda
from nitro.local.lambda_endpoint.api import split_function_name

H = "nitro.tools.lambda_handlers."

FUNCTIONS = [
    FunctionConfig("noop", H + "noop"),
    FunctionConfig("echo", H + "echo"),
    FunctionConfig("ctx", H + "context_info", memory_mb=512, timeout_s=30),
    FunctionConfig("raise", H + "raise"),
    FunctionConfig("crash", H + "crash", max_workers=1),
    FunctionConfig("pid", H + "pid", max_workers=1),
    FunctionConfig("victim", H + "sleep", max_workers=1),
    FunctionConfig("timeout", H + "sleep", timeout_s=1, max_workers=1),
    FunctionConfig("limited", H + "sleep", concurrency=2),
    FunctionConfig("queued", H + "sleep", concurrency=8, max_workers=1),
    FunctionConfig("cold", H + "sleep", max_workers=1),
    FunctionConfig("big", H + "big_response"),
    FunctionConfig("env", H + "env_reader", env={"NITRO_TEST_VAR": "hello"}),
    FunctionConfig("record", H + "record", async_retries=2),
]


@pytest.fixture(scope="module")
def endpoint():
    with LocalLambda(FUNCTIONS) as ll:
        yield ll


def make_client(url: str, pool: int = 10):
    return boto3.client(
        "lambda", endpoint_url=url, region_name="us-east-1", aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"total_max_attempts": 1}, max_pool_connections=pool, read_timeout=30))


@pytest.fixture(scope="module")
def client(endpoint):
    return make_client(endpoint.endpoint_url)


def invoke(client, name, event=None, **kw):
    r = client.invoke(FunctionName=name, Payload=json.dumps(event if event is not None else {}), **kw)
    r["body"] = json.loads(r["Payload"].read() or b"null")
    r["headers"] = r["ResponseMetadata"]["HTTPHeaders"]
    return r


def wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_request_response(client):
    r = invoke(client, "echo", {"a": [1, 2], "b": "x"})
    assert r["StatusCode"] == 200
    assert r["body"] == {"a": [1, 2], "b": "x"}
    assert r["ExecutedVersion"] == "$LATEST"
    assert "FunctionError" not in r
    assert r["headers"]["x-amzn-requestid"]
    assert invoke(client, "noop")["body"] == {"ok": True}


def test_name_forms_and_context(client):
    for name in ("ctx", "ctx:$LATEST", "arn:aws:lambda:us-east-1:000000000000:function:ctx"):
        r = invoke(client, name)
        assert r["StatusCode"] == 200, name
    body = r["body"]
    assert body["function_name"] == "ctx"
    assert body["memory_limit_in_mb"] == "512"
    assert body["invoked_function_arn"].endswith(":function:ctx")
    assert 25_000 < body["remaining_ms"] <= 30_000
    assert body["aws_request_id"] == r["headers"]["x-amzn-requestid"]
    cc = base64.b64encode(json.dumps({"custom": {"k": "v"}}).encode()).decode()
    assert invoke(client, "ctx", ClientContext=cc)["body"]["client_custom"] == {"k": "v"}
    assert split_function_name("123456789012:function:f:alias") == ("f", "alias")


def test_event_runs_in_background(client, tmp_path):
    path = tmp_path / "ran.txt"
    r = client.invoke(FunctionName="record", InvocationType="Event", Payload=json.dumps({"path": str(path)}))
    assert r["StatusCode"] == 202
    assert wait_for(path.exists)
    assert path.read_text().strip() == r["ResponseMetadata"]["HTTPHeaders"]["x-amzn-requestid"]


def test_event_retried_twice_on_error(client, tmp_path):
    path = tmp_path / "attempts.txt"
    r = client.invoke(FunctionName="record", InvocationType="Event",
                      Payload=json.dumps({"path": str(path), "fail": True}))
    assert r["StatusCode"] == 202
    assert wait_for(lambda: path.exists() and len(path.read_text().split()) >= 3)
    time.sleep(0.3)  # no fourth attempt
    ids = path.read_text().split()
    assert ids == [r["ResponseMetadata"]["HTTPHeaders"]["x-amzn-requestid"]] * 3


def test_dry_run(client):
    assert client.invoke(FunctionName="noop", InvocationType="DryRun")["StatusCode"] == 204


def test_handler_exception(client):
    r = invoke(client, "raise")
    assert r["StatusCode"] == 200
    assert r["FunctionError"] == "Unhandled"
    assert r["body"]["errorMessage"] == "boom"
    assert r["body"]["errorType"] == "ValueError"
    assert any("raise_error" in line for line in r["body"]["stackTrace"])


def test_request_too_large(client):
    payload = b'"' + b"a" * (6 * 1024 * 1024) + b'"'
    with pytest.raises(ClientError) as e:
        client.invoke(FunctionName="noop", Payload=payload)
    assert e.value.response["Error"]["Code"] == "RequestEntityTooLargeException"
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 413
    assert invoke(client, "noop")["StatusCode"] == 200  # the connection pool is still healthy


def test_response_too_large(client):
    r = invoke(client, "big", {"bytes": 7 * 1024 * 1024})
    assert r["FunctionError"] == "Unhandled"
    assert r["body"]["errorType"] == "Function.ResponseSizeTooLarge"
    assert len(invoke(client, "big", {"bytes": 1024})["body"]) == 1024


def test_throttled_beyond_concurrency(endpoint):
    c = make_client(endpoint.endpoint_url, pool=4)

    def call(_):
        try:
            return invoke(c, "limited", {"seconds": 1.0})["StatusCode"]
        except c.exceptions.TooManyRequestsException as exc:
            assert exc.response["Reason"] == "ReservedFunctionConcurrentInvocationLimitExceeded"
            return 429

    with ThreadPoolExecutor(3) as ex:
        codes = sorted(ex.map(call, range(3)))
    assert codes == [200, 200, 429]


def while_limited_is_full(c, call, tmp_path):
    """call() while both of the "limited" function's slots are busy (for 1.5 s): it is throttled."""
    marks = [tmp_path / f"busy-{i}" for i in range(2)]
    with ThreadPoolExecutor(2) as ex:
        busy = [ex.submit(invoke, c, "limited", {"seconds": 1.5, "started": str(m)}) for m in marks]
        assert wait_for(lambda: all(m.exists() for m in marks))  # both slots are taken, however slow the start
        out = call()
        assert [f.result()["StatusCode"] for f in busy] == [200, 200]
    return out

def test_a_throttled_invocation_is_retried_and_never_billed(endpoint, tmp_path):
    from scaler_svc.invoker import Invocation, Invoker

    c = make_client(endpoint.endpoint_url, pool=4)
    out = while_limited_is_full(c, lambda: Invoker(c, max_attempts=2, backoff_s=0.01).invoke(
        "limited", Invocation("t-1", {"seconds": 0}), time.monotonic() + 30), tmp_path)
    assert not out.ok and out.error_type == "TooManyRequestsException" and out.attempts == 2
    # AWS bills neither a request nor duration for a throttle (the scaler's ledger and warm count read this)
    assert out.requests == 0 and out.billed_attempts_ms == 0 and out.modelled_attempts_ms == 0

def test_a_launch_whose_invocations_were_all_throttled_bills_nothing_and_warms_nothing(endpoint, redis_client,
                                                                                        tmp_path):
    from nitro.contracts import scaler_state_key
    from nitro.cost import Prices
    from nitro.v1 import scaler_pb2
    from scaler_svc.invoker import Invoker
    from scaler_svc.server import ScalerServicer

    class Context:
        def time_remaining(self):  # no deadline, as a call without one
            return None

        def abort(self, code, details):
            raise AssertionError(details)

    c = make_client(endpoint.endpoint_url, pool=8)
    svc = ScalerServicer(redis_client, Invoker(c, max_attempts=1), Prices(), "redis://127.0.0.1:1/0", hmac_key=b"k" * 32)
    launch = scaler_pb2.LaunchRequest(job_id="thr", actors=2, steps_per_actor=8, env_id="CartPole-v1",
                                      function_name="limited", deadline_s=20.0)
    resp = while_limited_is_full(c, lambda: svc.Launch(launch, Context()), tmp_path)
    assert (resp.launched, resp.failed, resp.cost_usd) == (2, 2, 0.0)
    state = redis_client.hgetall(scaler_state_key("thr"))
    assert int(state.get(b"warm_sandboxes:actor", 0)) == 0  # nothing ran, nothing stays warm
    assert int(state.get(b"invocations", 0)) == 0 and float(state.get(b"cloud_actor_cost_usd", 0)) == 0.0
    again = svc.Launch(launch, Context())  # the same ids again: a retry, answered from the record
    assert (again.recorded, again.failed, again.cost_usd) == (2, 2, 0.0)
    launch.wave = 1  # a replacement wave: the slots are free again, both run (the handler ignores the event)
    resp = svc.Launch(launch, Context())
    assert (resp.launched, resp.failed, resp.recorded) == (2, 0, 0) and resp.cost_usd > 0
    state = redis_client.hgetall(scaler_state_key("thr"))
    assert int(state[b"warm_sandboxes:actor"]) == 2 and int(state[b"invocations"]) == 2

def test_queued_when_workers_below_concurrency(endpoint):
    c = make_client(endpoint.endpoint_url, pool=4)
    invoke(c, "queued", {"seconds": 0})  # warm the single worker
    t0 = time.monotonic()
    with ThreadPoolExecutor(3) as ex:
        results = list(ex.map(lambda _: invoke(c, "queued", {"seconds": 0.3}), range(3)))
    elapsed = time.monotonic() - t0
    assert [r["StatusCode"] for r in results] == [200] * 3
    assert len({r["body"]["pid"] for r in results}) == 1  # one worker served them in turn
    assert elapsed >= 0.85
    assert max(float(r["headers"]["x-nitro-queue-ms"]) for r in results) >= 500


def test_timeout_kills_and_recovers(client):
    t0 = time.monotonic()
    r = invoke(client, "timeout", {"seconds": 5}, LogType="Tail")
    assert time.monotonic() - t0 < 3
    assert r["FunctionError"] == "Unhandled"
    assert r["body"]["errorType"] == "Sandbox.Timedout"
    assert "Task timed out after 1.00 seconds" in r["body"]["errorMessage"]
    assert parse_report(r["LogResult"])["billed_ms"] == 1000
    ok = invoke(client, "timeout", {"seconds": 0})
    assert ok["StatusCode"] == 200 and "FunctionError" not in ok
    assert ok["headers"]["x-nitro-cold-start"] == "true"  # a replacement worker


def test_crash_reported_and_recovers(client, tmp_path):
    r = invoke(client, "crash")
    assert r["FunctionError"] == "Unhandled"
    assert r["body"]["errorType"] == "Runtime.ExitError"
    assert "signal: killed" in r["body"]["errorMessage"]
    # kill -9 of a warm worker mid-invocation: reported, then a fresh worker takes over.
    old_pid = invoke(client, "victim", {"seconds": 0})["body"]["pid"]
    with ThreadPoolExecutor(1) as ex:
        started = tmp_path / "victim-started"
        pending = ex.submit(invoke, client, "victim", {"seconds": 5, "started": str(started)})
        assert wait_for(started.exists)  # killed mid-invocation, not before it reached the worker
        os.kill(old_pid, signal.SIGKILL)
        r = pending.result(timeout=5)
    assert r["body"]["errorType"] == "Runtime.ExitError"
    assert "signal: killed" in r["body"]["errorMessage"]
    after = invoke(client, "victim", {"seconds": 0})
    assert "FunctionError" not in after and after["body"]["pid"] != old_pid


def test_unknown_function_and_bad_json(client):
    with pytest.raises(client.exceptions.ResourceNotFoundException):
        client.invoke(FunctionName="nope", Payload=b"{}")
    with pytest.raises(client.exceptions.InvalidRequestContentException):
        client.invoke(FunctionName="echo", Payload=b"{not json")
    assert invoke(client, "echo", [1])["body"] == [1]


def test_billed_and_init_duration(client):
    cold = invoke(client, "cold", {"seconds": 0.0123}, LogType="Tail")
    warm = invoke(client, "cold", {"seconds": 0.0123}, LogType="Tail")
    rc, rw = parse_report(cold["LogResult"]), parse_report(warm["LogResult"])
    assert rc["init_ms"] is not None and rc["init_ms"] > 0
    assert rw["init_ms"] is None
    assert float(cold["headers"]["x-nitro-init-duration-ms"]) > 0
    assert warm["headers"]["x-nitro-init-duration-ms"] == "0.000"
    assert (cold["headers"]["x-nitro-cold-start"], warm["headers"]["x-nitro-cold-start"]) == ("true", "false")
    for r, rep in ((cold, rc), (warm, rw)):
        assert rep["duration_ms"] >= 12.3
        duration = float(r["headers"]["x-nitro-duration-ms"])
        assert rep["billed_ms"] == int(r["headers"]["x-nitro-billed-duration-ms"]) == math.ceil(duration)
        assert rep["memory_mb"] == DEFAULT_ACTOR_MEMORY_MB
    assert base64.b64decode(warm["LogResult"]).decode().rstrip("\n").splitlines()[-1].startswith("REPORT ")


def test_parse_report_of_aws_line():
    line = ("REPORT RequestId: 1f0e\tDuration: 12.34 ms\tBilled Duration: 13 ms\tMemory Size: 1024 MB\t"
            "Max Memory Used: 80 MB\tInit Duration: 123.45 ms\t\n")
    rep = parse_report(base64.b64encode(("START x\nEND x\n" + line).encode()).decode())
    assert rep == {"duration_ms": 12.34, "billed_ms": 13, "init_ms": 123.45, "memory_mb": 1024,
                   "max_memory_used_mb": 80}


def test_warm_reuse_and_env(client):
    pids = {invoke(client, "pid")["body"] for _ in range(5)}
    assert len(pids) == 1 and os.getpid() not in pids
    assert invoke(client, "env", {"name": "NITRO_TEST_VAR"})["body"] == "hello"


@pytest.mark.system
def test_cli_prints_url_and_stops_on_sigterm():
    proc = subprocess.Popen([sys.executable, "-m", "nitro.local.lambda_endpoint", "--port", "0",
                             "--function", f"noop={H}noop", "--workers", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        assert invoke(make_client(url), "noop")["body"] == {"ok": True}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def process_alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@pytest.mark.system
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_an_endpoint_that_dies_takes_its_running_workers_with_it(tmp_path):
    """Issue 41: an orphaned worker would finish its invocation for a caller that saw it fail (and retries or
    replaces it): its batch would reach a round that no longer waits for it, paid twice."""
    started = tmp_path / "started"
    ll = LocalLambda([FunctionConfig("victim", H + "sleep", max_workers=1)]).start()
    try:
        c = make_client(ll.endpoint_url)
        with ThreadPoolExecutor(1) as ex:
            call = ex.submit(invoke, c, "victim", {"seconds": 60, "started": str(started)})
            deadline = time.monotonic() + 30
            while not (started.exists() and started.read_text()) and time.monotonic() < deadline:
                time.sleep(0.02)
            worker = int(started.read_text())
            assert process_alive(worker)
            os.kill(ll.pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while process_alive(worker) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not process_alive(worker), "the worker ran on after its endpoint died"
            with pytest.raises(Exception):  # the caller sees the invocation fail (and may retry it)
                call.result(timeout=30)
    finally:
        ll.stop()
