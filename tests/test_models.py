"""Model shapes, weight serialisation by version, and actor/learner agreement."""

import numpy as np
import pytest
import torch

from nitro.errors import ConfigError
from nitro.policy.inference import PolicyRunner
from nitro.policy.models import ModelSpec, Policy, blob_to_doc, policy_from_blob, policy_to_blob

BOX = ModelSpec((11,), "box", 3, (-1.0,) * 3, (1.0,) * 3, obs_norm=True)
DISC = ModelSpec((4,), "discrete", 2)
# Box observations that are not 1-D go through the MLP flattened, in the learner (torch) as in the actors (numpy).
GRID = ModelSpec((4, 4), "discrete", 3, obs_norm=True)
SCALAR = ModelSpec((), "box", 1, (-2.0,), (2.0,), obs_norm=True)


def test_default_architecture_is_separate_2x256_tanh():
    p = Policy(BOX)
    assert [layer.out_features for layer in p.actor.layers] == [256, 256]
    assert [layer.out_features for layer in p.critic.layers] == [256, 256]
    assert isinstance(p.actor.act, torch.nn.Tanh)
    assert p.actor.layers[0].weight.data_ptr() != p.critic.layers[0].weight.data_ptr()
    assert isinstance(p.distribution(torch.zeros(5, 11)), torch.distributions.Normal)
    assert isinstance(Policy(DISC).distribution(torch.zeros(5, 4)), torch.distributions.Categorical)


def test_blob_roundtrip_carries_version_and_obs_stats():
    key = b"k" * 32
    p = Policy(BOX)
    p.update_obs_stats(np.random.default_rng(0).normal(3.0, 2.0, size=(500, 11)))
    blob = policy_to_blob(p, 7, key)
    q, version = policy_from_blob(blob, key)
    assert version == 7
    for (k, a), b in zip(p.state_dict().items(), q.state_dict().values()):
        assert torch.equal(a, b), k
    assert float(q.obs_mean.mean()) == pytest.approx(3.0, abs=0.3)


def test_blob_with_wrong_key_is_rejected():
    from nitro.data.codec import PayloadError

    blob = policy_to_blob(Policy(DISC), 1, b"a" * 32)
    with pytest.raises(PayloadError):
        blob_to_doc(blob, b"b" * 32)


@pytest.mark.parametrize("spec", [BOX, DISC, GRID, SCALAR], ids=["box", "discrete", "2d-obs", "scalar-obs"])
def test_numpy_runner_agrees_with_torch_policy(spec):
    p = Policy(spec)
    rng = np.random.default_rng(0)
    p.update_obs_stats(rng.normal(1.0, 3.0, size=(200, *spec.obs_shape)))
    runner = PolicyRunner(spec, p.numpy_state(), 0)
    for _ in range(20):
        obs = rng.normal(size=spec.obs_shape).astype(np.float32)
        action, logp, value = runner.act(obs, rng)
        with torch.no_grad():
            o = torch.as_tensor(obs[None])
            d = p.distribution(o)
            ref_logp = float(p.log_prob(d, torch.as_tensor(np.asarray(action)[None])))
            ref_value = float(p.value(o))
        assert logp == pytest.approx(ref_logp, abs=1e-4)
        assert value == pytest.approx(ref_value, abs=1e-4)


def test_obs_stats_merge_matches_full_batch_moments():
    p = Policy(BOX)
    x = np.random.default_rng(1).normal(2.0, 5.0, size=(1000, 11))
    for chunk in np.array_split(x, 7):
        p.update_obs_stats(chunk)
    np.testing.assert_allclose(p.obs_mean.numpy(), x.mean(0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(p.obs_var.numpy(), x.var(0), rtol=1e-4)


def test_loading_mismatched_weights_names_the_problem():
    with pytest.raises(ConfigError, match="missing"):
        Policy(BOX).load_numpy_state(Policy(DISC).numpy_state())
