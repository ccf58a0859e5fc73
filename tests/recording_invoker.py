"""An Invoker that stands in for the network leg only: the scaler's Launch runs for real and this keeps the
payloads it would send (as they travel: JSON) and answers as if every invocation succeeded, 400 ms billed.
For tests of what the scaler sends and bills; tests of the invoke path itself use the local Lambda endpoint."""

from __future__ import annotations

import json

from scaler_svc.invoker import InvocationOutcome


class RecordingInvoker:
    def __init__(self):
        self.calls: list[tuple[str, list[dict]]] = []  # (function name, the events of one invoke_all)

    @property
    def events(self) -> list[dict]:
        return [e for _, events in self.calls for e in events]

    def invoke_all(self, function_name, invocations, deadline_s, on_done=None):
        self.calls.append((function_name, [json.loads(json.dumps(i.event)) for i in invocations]))
        outs = [InvocationOutcome(i.invocation_id, ok=True, duration_ms=400.0, billed_ms=400, attempts=1,
                                  billed_attempts_ms=400, requests=1) for i in invocations]
        for o in outs:
            if on_done is not None:
                on_done(o)
        return outs, 0.0
