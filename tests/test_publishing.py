"""What a loop's Publisher leaves in Redis (learner_svc/publishing.py) and which policy versions a loop keeps
(RoundLoop.publish with keep_versions), on a real Redis."""

from __future__ import annotations

import numpy as np
import pytest

from learner_svc.publishing import Publisher
from learner_svc.rounds import RoundLoop
from nitro.contracts import policy_key, sample_key
from nitro.data import codec
from nitro.policy.envs import env_spaces
from nitro.policy.model_spec import spec_for_spaces
from nitro.policy.models import Policy

JOB = "pub-job"


@pytest.fixture
def publisher(redis_client, hmac_key):
    return Publisher(redis_client, JOB, hmac_key, retry=lambda fn, what: fn())


def test_a_rounds_subset_replaces_the_previous_rounds(publisher, redis_client, hmac_key):
    subset = {"obs": np.zeros((4, 3), np.float32), "advantages": np.ones(4, np.float32)}
    assert publisher.sample_subset(0, subset) == sample_key(JOB, 0)
    publisher.sample_subset(1, subset)
    publisher.sample_subset(2, subset)
    assert [k for k in range(3) if redis_client.exists(sample_key(JOB, k))] == [2]
    assert codec.decode(redis_client.get(sample_key(JOB, 2)), hmac_key)["obs"].shape == (4, 3)


class Loop:
    """RoundLoop.publish on its own: the attributes it reads, nothing else of a loop."""

    publish = RoundLoop.publish

    def __init__(self, publisher, keep):
        self.publisher, self.keep_versions, self.kept_versions, self.version = publisher, keep, [], 0
        self.learner = type("L", (), {"policy": Policy(spec_for_spaces(*env_spaces("CartPole-v1")))})()


@pytest.mark.parametrize("keep", [None, 1, 2, 3])
def test_a_loop_keeps_its_newest_published_versions(publisher, redis_client, keep):
    loop, published = Loop(publisher, keep), [0, 3, 3, 7, 8, 12]  # IMPACT: versions many updates apart
    for v in published:  # 3 twice: a resumed loop publishes its restored version again
        loop.version = v
        loop.publish()
    stored = [v for v in range(13) if redis_client.exists(policy_key(JOB, v))]
    assert stored == ([0, 3, 7, 8, 12] if keep is None else [0, 3, 7, 8, 12][-keep:])
    assert publisher.policies.latest() == 12
