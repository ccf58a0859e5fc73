"""Lambda handlers that exercise the local endpoint (nitro.local.lambda_endpoint) rather than train: its tests
and bench/local_lambda.py load them by dotted name (FunctionConfig(..., "nitro.tools.lambda_handlers.echo"))."""

import os
import signal
import time


def noop(event, context):
    return {"ok": True}


def echo(event, context):
    return event


def sleep(event, context):
    """Sleeps event["seconds"]; with event["started"] (a path) it first creates that file and writes its pid
    there, so a test can act while the invocation is known to be running rather than after a guessed delay."""
    seconds = float(event.get("seconds", 0))
    if event.get("started"):
        with open(event["started"], "x") as f:
            f.write(str(os.getpid()))
    time.sleep(seconds)
    return {"slept": seconds, "pid": os.getpid()}


def slow_actor(event, context):
    """Stands in for an actor launched by the scaler: takes one millisecond per step it was asked for."""
    time.sleep(event["num_steps"] / 1000)
    return {"invocation_id": event["invocation_id"]}


def raise_error(event, context):
    raise ValueError("boom")


globals()["raise"] = raise_error  # so the handler string "nitro.tools.lambda_handlers.raise" works too


def crash(event, context):
    os.kill(os.getpid(), signal.SIGKILL)


def big_response(event, context):
    return "x" * int(event.get("bytes", 7 * 1024 * 1024))


def env_reader(event, context):
    return os.environ.get(event.get("name", ""))


def pid(event, context):
    return os.getpid()


def context_info(event, context):
    return {
        "aws_request_id": context.aws_request_id,
        "function_name": context.function_name,
        "memory_limit_in_mb": context.memory_limit_in_mb,
        "invoked_function_arn": context.invoked_function_arn,
        "remaining_ms": context.get_remaining_time_in_millis(),
        "client_custom": context.client_context.custom if context.client_context else None,
    }


def record(event, context):
    """Append the request id to event["path"]; then fail if event["fail"] (for retry tests)."""
    with open(event["path"], "a") as f:
        f.write(context.aws_request_id + "\n")
    if event.get("fail"):
        raise RuntimeError("failing on purpose")
    return {"recorded": True}


def print_and_return(event, context):
    print("hello from the handler")
    return {"printed": True}
