"""Function configuration and the AWS Lambda limits the endpoint enforces."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from nitro.contracts import DEFAULT_ACTOR_MEMORY_MB

# AWS quotas (bytes): synchronous request and response payloads, asynchronous events.
SYNC_PAYLOAD_LIMIT = 6 * 1024 * 1024
ASYNC_PAYLOAD_LIMIT = 1024 * 1024

ACCOUNT_ID = "000000000000"

# LocalLambda hands the endpoint its FunctionConfigs (`env` included, which may hold secrets) as JSON in this
# environment variable, never on the command line (docs/security.md, "Command lines"); the endpoint removes it
# from its own environment before it starts workers.
FUNCTIONS_ENV = "NITRO_LAMBDA_FUNCTIONS"


def region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def function_arn(name: str, qualifier: str | None = None) -> str:
    arn = f"arn:aws:lambda:{region()}:{ACCOUNT_ID}:function:{name}"
    return f"{arn}:{qualifier}" if qualifier else arn


@dataclass
class FunctionConfig:
    """One function served by the endpoint; handler is "package.module.func"."""

    name: str
    handler: str
    memory_mb: int = DEFAULT_ACTOR_MEMORY_MB
    timeout_s: float = 60.0
    concurrency: int = 64
    env: dict[str, str] = field(default_factory=dict)
    max_workers: int | None = None
    # Like AWS (MaximumRetryAttempts, 0..2): an async invocation that errors or times out is retried.
    async_retries: int = 2
    # AWS waits ~1 then ~2 minutes between async retries; locally the default is immediate.
    async_retry_delay_s: float = 0.0

    def __post_init__(self) -> None:
        if "." not in self.handler:
            raise ValueError(f"handler must be 'module.function', got {self.handler!r}")
        if self.concurrency < 1 or self.timeout_s <= 0 or self.memory_mb < 1:
            raise ValueError(f"invalid limits for function {self.name!r}")
        if not 0 <= self.async_retries <= 2:
            raise ValueError("async_retries must be between 0 and 2, as on AWS")

    @property
    def workers(self) -> int:
        """Worker processes kept warm: enough to cover the cores without oversubscribing them."""
        if self.max_workers is not None:
            return max(1, min(self.max_workers, self.concurrency))
        return max(1, min(self.concurrency, (os.cpu_count() or 1) * 2))

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict) -> "FunctionConfig":
        return cls(**d)
