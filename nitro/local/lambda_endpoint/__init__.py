"""A local AWS Lambda-compatible invoke endpoint: boto3's lambda client works against it unchanged.

    with LocalLambda([FunctionConfig("actor", "actor_fn.handler.handler")]) as ll:
        boto3.client("lambda", endpoint_url=ll.endpoint_url, ...).invoke(FunctionName="actor")

Each function runs in a pool of warm worker processes and honours AWS's concurrency (429),
payload (413, Function.ResponseSizeTooLarge), timeout (Sandbox.Timedout) and crash
(Runtime.ExitError) behaviour. Billing: nitro.aws.lambda_report.parse_report(LogResult) reads the REPORT
line of a LogType="Tail" response, here and on AWS; locally every synchronous response also carries
X-Nitro-Duration-Ms, X-Nitro-Billed-Duration-Ms, X-Nitro-Init-Duration-Ms, X-Nitro-Cold-Start,
X-Nitro-Queue-Ms (waiting for a free worker) and X-Nitro-Server-Ms (time inside the endpoint).
"""

from .config import FunctionConfig
from .local import LocalLambda

__all__ = ["FunctionConfig", "LocalLambda"]
