"""What a loop publishes to Redis: signed policy versions for the actors, and each round's signed sample subset
for the detector."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import redis
import torch

from learner_svc.constants import POLICY_TTL_S
from nitro.contracts import DETECTOR_SUBSET, sample_key
from nitro.data import codec
from nitro.data.store import PolicyStore
from nitro.policy.models import Policy, policy_to_blob


def _numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def detector_subset(data: dict, fields, rng: np.random.Generator, extra: dict | None = None) -> dict:
    """Up to DETECTOR_SUBSET samples of the round (rows in order), with the fields the detector needs."""
    n = len(data["logp"])
    idx = np.sort(rng.choice(n, size=min(n, DETECTOR_SUBSET), replace=False))
    subset = {k: np.ascontiguousarray(_numpy(data[k])[idx]) for k in fields}
    if extra:
        subset.update(extra)
    return subset


class Publisher:
    """One job's writes of policies and sample subsets; `retry(fn, what)` rides out a Redis restart."""

    def __init__(self, client: redis.Redis, job_id: str, key: bytes, retry: Callable,
                 behaviour_values: bool = True):
        """key: the job's read key (nitro.contracts.job_read_key), which its functions and the detector verify with.
        behaviour_values: the job's learner reads the per-step values actors record (policy_to_blob)."""
        self.client, self.job_id, self.key, self.retry = client, job_id, key, retry
        self.behaviour_values = behaviour_values
        self.policies = PolicyStore(client, job_id, ttl_s=POLICY_TTL_S)

    def policy(self, policy: Policy, version: int, drop: Iterable[int] = ()) -> None:
        """Publish `version`; delete the versions in `drop`, which nobody will ask for any more."""
        blob = policy_to_blob(policy, version, self.key, self.behaviour_values)
        self.retry(lambda: self.policies.put(version, blob, drop), "policy publish")

    def sample_subset(self, round_index: int, subset: dict) -> str:
        """Write the round's sample subset (signed, expiring); returns its key. The previous round's subset
        goes: every loop has its score (or gave up on it) before it writes the next round's."""
        key = sample_key(self.job_id, round_index)
        blob = codec.encode(subset, self.key)

        def write():
            pipe = self.client.pipeline(transaction=False)
            pipe.set(key, blob, ex=POLICY_TTL_S)
            if round_index > 0:
                pipe.delete(sample_key(self.job_id, round_index - 1))
            pipe.execute()

        self.retry(write, "sample subset write")
        return key
