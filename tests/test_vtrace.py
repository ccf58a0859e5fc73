"""V-trace: a hand-computed example, episode boundaries, truncation, and the on-policy reduction."""

import math

import numpy as np
import pytest

from nitro.algos.advantages import batch_gae, gae, next_values
from nitro.algos.vtrace import batch_vtrace, vtrace
from nitro.data.batching import split_batch

F, T_ = False, True


def hand_case(terminated=(F, F, F), truncated=(F, F, F), final_values=(0.0, 0.0, 0.0)):
    # gamma 0.5, pi/mu = (2, 0.5, 1): rho = c = (1, 0.5, 1) after truncation at 1.
    rewards, values, bootstrap = [1.0, 2.0, 3.0], [0.5, 1.0, 2.0], 4.0
    nv = next_values(np.array(values, np.float32), np.array(final_values, np.float32), bootstrap,
                     np.array(terminated), np.array(truncated))
    return vtrace(np.log([2.0, 0.5, 1.0]), rewards, values, nv, np.array(terminated), np.array(truncated),
                  gamma=0.5, rho_bar=1.0, c_bar=1.0)


def test_hand_computed_example():
    # deltas: 1*(1 + .5*1 - .5) = 1, .5*(2 + .5*2 - 1) = 1, 1*(3 + .5*4 - 2) = 3
    # v_2 - V_2 = 3; v_1 - V_1 = 1 + .5*.5*3 = 1.75; v_0 - V_0 = 1 + .5*1*1.75 = 1.875
    vs, adv = hand_case()
    np.testing.assert_allclose(vs, [2.375, 2.75, 5.0], rtol=1e-6)
    # A_t = rho_t (r_t + gamma v_{t+1} - V_t): 1 + .5*2.75 - .5, .5*(2 + .5*5 - 1), 3 + .5*4 - 2
    np.testing.assert_allclose(adv, [1.875, 1.75, 3.0], rtol=1e-6)


def test_terminated_step_neither_bootstraps_nor_carries():
    vs, adv = hand_case(terminated=(F, T_, F))
    # delta_1 = .5*(2 + 0 - 1) = .5 and nothing flows from step 2 into step 1
    np.testing.assert_allclose(vs, [0.5 + 1.25, 1.0 + 0.5, 5.0], rtol=1e-6)
    np.testing.assert_allclose(adv, [1.0 + 0.5 * 1.5 - 0.5, 0.5 * (2.0 - 1.0), 3.0], rtol=1e-6)


def test_truncated_step_bootstraps_from_final_value_and_cuts_the_trace():
    vs, adv = hand_case(truncated=(F, T_, F), final_values=(0.0, 6.0, 0.0))
    # delta_1 = .5*(2 + .5*6 - 1) = 2; v_0 - V_0 = 1 + .5*2 = 2
    np.testing.assert_allclose(vs, [2.5, 3.0, 5.0], rtol=1e-6)
    np.testing.assert_allclose(adv, [1.0 + 0.5 * 3.0 - 0.5, 0.5 * (2.0 + 3.0 - 1.0), 3.0], rtol=1e-6)


def random_batch(rng, n=200, p_term=0.03, p_trunc=0.02):
    term = rng.random(n) < p_term
    trunc = (rng.random(n) < p_trunc) & ~term
    return {
        "obs": rng.normal(size=(n, 3)).astype(np.float32), "actions": rng.integers(0, 2, n),
        "rewards": rng.normal(size=n).astype(np.float32), "values": rng.normal(size=n).astype(np.float32),
        "terminated": term, "truncated": trunc,
        "final_values": np.where(trunc, rng.normal(size=n), 0.0).astype(np.float32),
        "logp": rng.normal(size=n).astype(np.float32) - 1.0, "bootstrap_value": float(rng.normal()),
        "episode_returns": [1.0] * int((term | trunc).sum()), "episode_lengths": [1] * int((term | trunc).sum()),
    }


@pytest.mark.parametrize("gamma", [0.99, 0.9, 1.0])
def test_on_policy_reduces_to_n_step_returns(gamma):
    """pi == mu, rho_bar = c_bar = 1: v_s is the bootstrapped n-step return, A the GAE(lambda=1) advantage."""
    b = random_batch(np.random.default_rng(0))
    vs, adv = batch_vtrace(b, b["logp"], b["values"], gamma=gamma, rho_bar=1.0, c_bar=1.0)
    gae_adv, gae_ret = batch_gae(b, gamma, 1.0)
    np.testing.assert_allclose(vs, gae_ret, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv, gae_adv, rtol=1e-5, atol=1e-5)
    # And explicitly: inside the last (unfinished) episode, v_s = sum gamma^k r + gamma^n bootstrap.
    last_end = int(np.flatnonzero(b["terminated"] | b["truncated"]).max()) + 1
    s = last_end
    n = len(b["rewards"]) - s
    expected = sum(gamma ** k * float(b["rewards"][s + k]) for k in range(n)) + gamma ** n * b["bootstrap_value"]
    assert math.isclose(vs[s], expected, rel_tol=1e-5, abs_tol=1e-5)


def test_importance_ratios_truncated_by_rho_bar_and_c_bar():
    rewards, values = np.array([1.0, 1.0]), np.array([0.0, 0.0])
    nv = np.array([0.0, 0.0])
    no = np.zeros(2, bool)
    big = np.log([5.0, 5.0])  # pi/mu = 5 everywhere
    vs, adv = vtrace(big, rewards, values, nv, no, no, gamma=1.0, rho_bar=1.0, c_bar=1.0)
    np.testing.assert_allclose(vs, [2.0, 1.0])  # rho = c = 1
    vs, adv = vtrace(big, rewards, values, nv, no, no, gamma=1.0, rho_bar=2.0, c_bar=0.5)
    np.testing.assert_allclose(vs, [2.0 + 0.5 * 2.0, 2.0])  # rho = 2, c = 0.5
    np.testing.assert_allclose(adv, [2.0 * (1.0 + 2.0), 2.0 * 1.0])  # pg weight defaults to rho_bar
    _, adv = vtrace(big, rewards, values, nv, no, no, gamma=1.0, rho_bar=2.0, c_bar=0.5, pg_rho_bar=1.0)
    np.testing.assert_allclose(adv, [1.0 + 2.0, 1.0])
    small = np.log([0.25, 0.25])  # below the caps: used as is
    vs, _ = vtrace(small, rewards, values, nv, no, no, gamma=1.0, rho_bar=1.0, c_bar=1.0)
    np.testing.assert_allclose(vs, [0.25 + 0.25 * 0.25, 0.25])


def test_off_policy_weights_differ_from_gae():
    rng = np.random.default_rng(1)
    b = random_batch(rng)
    target = b["logp"] + rng.normal(scale=0.5, size=len(b["logp"])).astype(np.float32)
    vs, _ = batch_vtrace(b, target, b["values"], gamma=0.99)
    _, ret = batch_gae(b, 0.99, 1.0)
    assert np.abs(vs - ret).max() > 1e-2
    assert vs.dtype == np.float32 and np.isfinite(vs).all()


def test_split_parts_are_valid_batches():
    """A split part bootstraps from V at the cut: targets of steps whose episode ends inside the part,
    and everything in the last part, equal the unsplit batch's; one-step TD targets equal everywhere."""
    rng = np.random.default_rng(2)
    b = random_batch(rng, n=97, p_term=0.08, p_trunc=0.04)
    target = b["logp"] + rng.normal(scale=0.3, size=97).astype(np.float32)
    vs, adv = batch_vtrace(b, target, b["values"], gamma=0.97)
    parts = split_batch(b, 4)
    bounds = np.cumsum([0] + [len(p["rewards"]) for p in parts])
    done = b["terminated"] | b["truncated"]
    for p, s, e in zip(parts, bounds[:-1], bounds[1:]):
        pvs, padv = batch_vtrace(p, target[s:e], p["values"], gamma=0.97)
        ends = np.flatnonzero(done[s:e])
        safe = e - s if e == len(done) else (ends.max() + 1 if len(ends) else 0)
        np.testing.assert_allclose(pvs[:safe], vs[s:s + safe], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(padv[:safe], adv[s:s + safe], rtol=1e-5, atol=1e-5)
        td_adv, td_ret = batch_gae(p, 0.97, 0.0)
        whole_adv, whole_ret = batch_gae(b, 0.97, 0.0)
        np.testing.assert_allclose(td_ret, whole_ret[s:e], rtol=1e-6, atol=1e-6)
    assert sum(len(p["episode_returns"]) for p in parts) == len(b["episode_returns"])


def test_gae_matches_vtrace_on_the_hand_example_when_on_policy():
    rewards, values = np.array([1.0, 2.0, 3.0]), np.array([0.5, 1.0, 2.0])
    no = np.zeros(3, bool)
    nv = np.array([1.0, 2.0, 4.0])
    adv, ret = gae(rewards, values, nv, no, no, 0.5, 1.0)
    vs, pg = vtrace(np.zeros(3), rewards, values, nv, no, no, gamma=0.5)
    np.testing.assert_allclose(vs, ret, rtol=1e-6)
    np.testing.assert_allclose(pg, adv, rtol=1e-6)
