"""A local AWS Lambda-compatible invoke endpoint (boto3's lambda client works against it).

    with LocalLambda([FunctionConfig("actor", "actor_fn.handler.handle")]) as ll:
        boto3.client("lambda", endpoint_url=ll.endpoint_url, ...).invoke(FunctionName="actor")
"""

from .config import FunctionConfig
from .local import LocalLambda
from .report import parse_report

__all__ = ["FunctionConfig", "LocalLambda", "parse_report"]
