"""GAE against hand-computed values, including termination vs truncation."""

import numpy as np
import pytest

from nitro.algos.advantages import batch_gae, clip_rewards, gae, next_values

R = np.array([1.0, 1.0, 1.0], dtype=np.float32)
V = np.array([0.5, 0.4, 0.3], dtype=np.float32)
NO = np.zeros(3, dtype=bool)


def test_gae_no_episode_end_bootstraps_from_batch_end():
    nv = next_values(V, np.zeros(3), 0.2, NO, NO)
    np.testing.assert_allclose(nv, [0.4, 0.3, 0.2], rtol=1e-6)
    adv, ret = gae(R, V, nv, NO, NO, gamma=0.9, lam=0.8)
    # deltas 0.86, 0.87, 0.88; A2 = .88, A1 = .87 + .72*.88, A0 = .86 + .72*A1
    np.testing.assert_allclose(adv, [1.942592, 1.5036, 0.88], rtol=1e-5)
    np.testing.assert_allclose(ret, adv + V, rtol=1e-6)


def test_gae_termination_cuts_and_does_not_bootstrap():
    term = np.array([False, True, False])
    nv = next_values(V, np.zeros(3), 0.2, term, NO)
    np.testing.assert_allclose(nv, [0.4, 0.0, 0.2], rtol=1e-6)
    adv, _ = gae(R, V, nv, term, NO, gamma=0.9, lam=0.8)
    np.testing.assert_allclose(adv, [0.86 + 0.72 * 0.6, 0.6, 0.88], rtol=1e-5)


def test_gae_truncation_bootstraps_from_final_observation_value():
    trunc = np.array([False, True, False])
    final = np.array([0.0, 0.7, 0.0], dtype=np.float32)
    nv = next_values(V, final, 0.2, NO, trunc)
    np.testing.assert_allclose(nv, [0.4, 0.7, 0.2], rtol=1e-6)
    adv, _ = gae(R, V, nv, NO, trunc, gamma=0.9, lam=0.8)
    # delta1 = 1 + .9*.7 - .4 = 1.23 and nothing flows from step 2 into step 1
    np.testing.assert_allclose(adv, [0.86 + 0.72 * 1.23, 1.23, 0.88], rtol=1e-5)


def test_lambda_one_gives_discounted_returns_minus_values():
    rng = np.random.default_rng(0)
    r = rng.normal(size=6).astype(np.float32)
    v = rng.normal(size=6).astype(np.float32)
    nv = next_values(v, np.zeros(6), 0.0, np.array([0, 0, 0, 0, 0, 1], bool), np.zeros(6, bool))
    adv, ret = gae(r, v, nv, np.array([0, 0, 0, 0, 0, 1], bool), np.zeros(6, bool), gamma=0.95, lam=1.0)
    disc = [sum(0.95 ** (k - t) * r[k] for k in range(t, 6)) for t in range(6)]
    np.testing.assert_allclose(ret, disc, rtol=1e-4, atol=1e-5)


def test_batch_gae_uses_rollout_fields():
    batch = {"rewards": R, "values": V, "final_values": np.zeros(3, np.float32), "bootstrap_value": 0.2,
             "terminated": NO, "truncated": NO}
    adv, _ = batch_gae(batch, 0.9, 0.8)
    assert adv[0] == pytest.approx(1.942592, rel=1e-5)


def test_reward_clip_bounds_training_rewards_only_when_asked():
    r = np.array([-7.0, -0.5, 0.0, 0.25, 30.0])
    np.testing.assert_array_equal(clip_rewards(r, 1.0), [-1.0, -0.5, 0.0, 0.25, 1.0])
    np.testing.assert_array_equal(clip_rewards(r, 0.0), r)
    big = {"rewards": np.array([100.0, 0.0, 25.0], np.float32), "values": V, "final_values": np.zeros(3, np.float32),
           "bootstrap_value": 0.2, "terminated": NO, "truncated": NO}
    unit = dict(big, rewards=np.array([1.0, 0.0, 1.0], np.float32))
    np.testing.assert_allclose(batch_gae(big, 0.9, 0.8, reward_clip=1.0)[0], batch_gae(unit, 0.9, 0.8)[0])
    assert not np.allclose(batch_gae(big, 0.9, 0.8)[0], batch_gae(unit, 0.9, 0.8)[0])
