"""The evidence-based scaling policies (grow, noise, noise-adascale, noise-replay) and the pure functions they
stand on: the cost-optimal batch, AdaScale's gain, the split of a round's cost into a and c, and the policy
gradient's own noise scale. No network, no Redis."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nitro import cost
from nitro.contracts import GROW_FRACTIONS, NOISE_EMA, NOISE_KAPPA, SCALING_POLICIES
from nitro.errors import ConfigError
from nitro.scaling import RoundInputs, make_policy
from nitro.scaling.noise import adascale_gain, adascale_update, b_simple_of, cost_optimal_batch, ema_terms
from nitro.scaling.policies import job_progress, nearest_power_of_two, scales_update

A, C, STEPS = 2.5e-5, 8e-9, 512  # a round's and a sample's cost, steps per actor: an a/c of 3,125 samples


def noise_inputs(k: int, b: float | None, *, i_min=4, i_max=64, a=A, c=C, steps=STEPS) -> RoundInputs:
    """Round inputs whose policy-gradient terms are |G|^2 = 1 and tr(Sigma) = b (B_simple = b)."""
    return RoundInputs(k, i_min=i_min, i_max=i_max, policy_noise_terms=None if b is None else (1.0, b),
                       round_cost_usd=a, sample_cost_usd=c, steps_per_actor=steps)


# -- grow -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("left,expected", [(1.0, 4), (0.61, 4), (0.6, 8), (0.21, 8), (0.2, 16), (0.0, 16)])
def test_grow_doubles_at_f1_and_again_at_f2_of_the_budget(left, expected):
    inputs = RoundInputs(0, i_min=4, i_max=64, budget_usd=2.0, budget_left_usd=2.0 * left, rounds=1000)
    actors, state, reason = make_policy("grow").decide({}, inputs)
    assert actors == expected and state == {"actors": expected}
    assert f"{1 - left:.1%} of the budget spent" in reason


def test_grow_follows_the_rounds_when_they_are_further_along_than_the_budget():
    policy = make_policy("grow", {"f1": 0.5, "f2": 0.75})
    counts = [policy.decide({}, RoundInputs(k, i_min=2, i_max=64, budget_usd=1000.0, budget_left_usd=999.0,
                                            rounds=8))[0] for k in range(8)]
    assert counts == [2, 2, 2, 2, 4, 4, 8, 8]


def test_grow_never_goes_down_and_never_passes_i_max():
    policy = make_policy("grow")
    assert policy.decide({"actors": 16}, RoundInputs(0, i_min=4, i_max=64))[0] == 16  # progress unknown: kept
    assert policy.decide({}, RoundInputs(0, i_min=4, i_max=64))[0] == 4
    late = RoundInputs(9, i_min=8, i_max=20, rounds=10)
    assert policy.decide({}, late)[0] == 20


def test_job_progress_is_the_larger_of_budget_and_rounds():
    assert job_progress(RoundInputs(5, rounds=10, budget_usd=1.0, budget_left_usd=0.9))[0] == pytest.approx(0.5)
    assert job_progress(RoundInputs(1, rounds=10, budget_usd=1.0, budget_left_usd=0.3))[0] == pytest.approx(0.7)
    assert job_progress(RoundInputs(1))[0] == 0.0
    assert job_progress(RoundInputs(1, budget_usd=1.0, budget_left_usd=-0.5))[0] == 1.0  # overspent: clamped


@pytest.mark.parametrize("params,field", [({"f1": 0.9, "f2": 0.5}, "grow.f2"), ({"f1": -0.1}, "grow.f1"),
                                          ({"f2": 1.5}, "grow.f2"), ({"f1": float("nan")}, "grow.f1"),
                                          ({"every": 3}, "unknown parameter")])
def test_grow_refuses_bad_fractions_naming_them(params, field):
    with pytest.raises(ConfigError, match=field):
        make_policy("grow", params)


# -- noise ----------------------------------------------------------------------------------------------------

def test_noise_starts_at_i_min_until_the_learner_measured_a_noise_scale():
    actors, state, reason = make_policy("noise").decide({}, noise_inputs(0, None))
    assert actors == 4 and "grad_sq" not in state and "no gradient noise scale yet" in reason


def test_noise_plans_kappa_sqrt_b_a_over_c_rounded_to_a_power_of_two():
    b, kappa = 2000.0, 3.0
    batch = kappa * math.sqrt(b * A / C)  # 7,500 samples = 14.6 actors of 512 steps -> 16
    actors, state, reason = make_policy("noise", {"kappa": kappa}).decide({}, noise_inputs(5, b))
    assert actors == 16 and state == {"actors": 16, "grad_sq": 1.0, "trace_sigma": b}
    assert f"{batch:.0f} samples" in reason


def test_noise_smooths_the_estimate_and_never_scales_down():
    policy = make_policy("noise", {"kappa": 3.0})
    state, counts = {}, []
    for k, b in enumerate([2000.0, 50.0, 50.0, 50.0, 20000.0]):
        n, state, _ = policy.decide(state, noise_inputs(k, b))
        counts.append(n)
    expected_ema = 2000.0
    for b in (50.0, 50.0, 50.0, 20000.0):
        expected_ema = (1 - NOISE_EMA) * expected_ema + NOISE_EMA * b
    assert state["trace_sigma"] == pytest.approx(expected_ema) and state["grad_sq"] == pytest.approx(1.0)
    assert counts[:4] == [16, 16, 16, 16], "a falling noise scale keeps the count"
    assert counts[4] >= 16


@pytest.mark.parametrize("terms", [None, (float("nan"), 10.0), (1.0, float("inf"))])
def test_unmeasured_terms_leave_the_averages_as_they_were(terms):
    state = {"actors": 8, "grad_sq": 2.0, "trace_sigma": 1400.0}
    inputs = RoundInputs(3, i_min=4, policy_noise_terms=terms, round_cost_usd=A, sample_cost_usd=C, steps_per_actor=STEPS)
    n, new, _ = make_policy("noise").decide(state, inputs)
    assert n == 8 and (new["grad_sq"], new["trace_sigma"]) == (2.0, 1400.0)


def test_the_terms_are_averaged_before_dividing_so_a_negative_signal_estimate_counts():
    """A round whose |G|^2 estimate came out <= 0 (its B_simple undefined) still moves the average: skipping it
    would bias B_simple down, since those rounds are the noisiest."""
    state = {"actors": 4, "grad_sq": 1.0, "trace_sigma": 1000.0}
    inputs = RoundInputs(3, i_min=4, policy_noise_terms=(-0.5, 800.0), round_cost_usd=A, sample_cost_usd=C,
                         steps_per_actor=STEPS)
    _, new, reason = make_policy("noise").decide(state, inputs)
    g2 = (1 - NOISE_EMA) * 1.0 + NOISE_EMA * -0.5
    tr = (1 - NOISE_EMA) * 1000.0 + NOISE_EMA * 800.0
    assert (new["grad_sq"], new["trace_sigma"]) == (pytest.approx(g2), pytest.approx(tr))
    assert f"B_simple={tr / g2:.4g}" in reason
    _, _, unknown = make_policy("noise").decide({}, RoundInputs(0, i_min=4, policy_noise_terms=(-1.0, 5.0)))
    assert "<= 0: noise scale unknown" in unknown


@pytest.mark.parametrize("a,c,steps", [(0.0, C, STEPS), (A, 0.0, STEPS), (A, C, 0), (float("inf"), C, STEPS)])
def test_noise_keeps_its_count_while_the_costs_are_unknown(a, c, steps):
    n, state, reason = make_policy("noise").decide({"actors": 8}, noise_inputs(3, 900.0, a=a, c=c, steps=steps))
    assert n == 8 and "round costs unknown" in reason and state["trace_sigma"] == 900.0


def test_noise_is_clipped_to_the_range():
    huge = make_policy("noise", {"kappa": 1e4}).decide({}, noise_inputs(1, 1e6, i_max=32))[0]
    tiny = make_policy("noise", {"kappa": 1e-4}).decide({}, noise_inputs(1, 1.0, i_min=3))[0]
    assert (huge, tiny) == (32, 3)


def test_noise_adascale_plans_as_noise_and_is_the_one_that_scales_the_update():
    inputs = noise_inputs(2, 5000.0)
    assert make_policy("noise-adascale").decide({}, inputs)[0] == make_policy("noise").decide({}, inputs)[0]
    assert scales_update("noise-adascale") and not any(scales_update(p) for p in SCALING_POLICIES
                                                       if p != "noise-adascale")


@pytest.mark.parametrize("kappa", [0, -1.0, float("inf"), True, "2"])
def test_noise_refuses_a_bad_kappa(kappa):
    with pytest.raises(ConfigError, match="noise.kappa"):
        make_policy("noise", {"kappa": kappa})


def test_the_default_kappa_is_the_contract_value():
    assert make_policy("noise").kappa == NOISE_KAPPA and make_policy("grow").f1 == GROW_FRACTIONS[0]


@pytest.mark.parametrize("x,expected", [(0.3, 1), (1.0, 1), (1.41, 1), (1.42, 2), (5.65, 4), (5.66, 8), (24, 32)])
def test_nearest_power_of_two_rounds_in_log_space(x, expected):
    assert nearest_power_of_two(x) == expected


# -- noise-replay ---------------------------------------------------------------------------------------------

def test_noise_replay_replays_under_its_own_name():
    policy = make_policy("noise-replay", {"actors_by_round": "4,8,16"})
    assert [policy.decide({}, RoundInputs(k, i_min=4, i_max=64))[0] for k in range(5)] == [4, 8, 16, 16, 16]
    assert policy.decide({}, RoundInputs(0, i_min=4, i_max=64))[2].startswith("noise-replay:")
    with pytest.raises(ConfigError, match="noise-replay.actors_by_round"):
        make_policy("noise-replay")


# -- the pure functions underneath ----------------------------------------------------------------------------

def test_the_cost_optimal_batch_minimises_dollars_to_a_loss_under_mccandlishs_model():
    b_noise, a, c = 3000.0, 2e-5, 1e-8

    def dollars(batch):  # steps (1 + B_noise / B) times the cost of a step, a + c B (S_min = 1)
        return (1 + b_noise / batch) * (a + c * batch)

    grid = np.exp(np.linspace(np.log(10.0), np.log(1e6), 20001))
    best = grid[np.argmin(dollars(grid))]
    assert cost_optimal_batch(b_noise, a, c) == pytest.approx(best, rel=1e-3)
    with pytest.raises(ConfigError, match="sample_cost"):
        cost_optimal_batch(1.0, 1.0, 0.0)


def test_adascale_gain_runs_from_one_for_pure_signal_to_the_scale_for_pure_noise():
    assert adascale_gain(1e-9, 256, 8.0) == pytest.approx(1.0, abs=1e-6)
    assert adascale_gain(1e12, 256, 8.0) == pytest.approx(8.0, rel=1e-6)
    assert adascale_gain(256.0, 256, 4.0) == pytest.approx(2.0 / (0.25 + 1.0))  # sigma^2 = mu^2
    assert adascale_gain(None, 256, 4.0) == 1.0 and adascale_gain(5000.0, 256, 1.0) == 1.0
    gains = [adascale_gain(b, 256, 4.0) for b in (10.0, 100.0, 1000.0, 10000.0)]
    assert gains == sorted(gains)
    with pytest.raises(ConfigError, match="scale"):
        adascale_gain(100.0, 256, 0.5)


def test_adascale_update_keeps_the_steps_per_epoch_and_leaves_small_rounds_alone():
    assert adascale_update(4096, 4096, 256, 1000.0) == (256, 1.0)
    assert adascale_update(2048, 4096, 256, 1000.0) == (256, 1.0)
    mb, factor = adascale_update(16384, 4096, 256, 1000.0)
    assert mb == 1024 and factor == pytest.approx(adascale_gain(1000.0, 256, 4.0))
    assert adascale_update(8192, 4096, 0, 1000.0) == (0, pytest.approx(adascale_gain(1000.0, 4096, 2.0)))


def test_ema_terms_average_each_term_and_skip_unmeasured_ones():
    assert ema_terms(None, (2.0, 100.0), 0.2) == (2.0, 100.0)
    assert ema_terms((2.0, 100.0), (1.0, 200.0), 0.5) == (1.5, 150.0)
    assert ema_terms((2.0, 100.0), None, 0.5) == ema_terms((2.0, 100.0), (float("nan"), 1.0), 0.5) == (2.0, 100.0)
    assert b_simple_of((2.0, 100.0)) == 50.0 and b_simple_of((-1.0, 100.0)) is None and b_simple_of(None) is None
    assert b_simple_of((2.0, -4.0)) == 0.0


def test_a_round_splits_into_a_per_round_and_a_per_sample_cost_that_add_back_up():
    p = cost.Prices()
    per_actor, round_s, update_s, actors = 3e-6, 1.2, 0.5, 8
    a, c = cost.round_and_sample_costs(per_actor, round_s, update_s, actors * STEPS, STEPS, p)
    assert a == pytest.approx(cost.learner_cost(round_s - update_s, p))
    assert a + c * actors * STEPS == pytest.approx(cost.learner_cost(round_s, p) + per_actor * actors)
    assert cost.round_and_sample_costs(per_actor, 0.0, 0.0, 100, STEPS, p) == (0.0, 0.0)
    assert cost.round_and_sample_costs(per_actor, 1.0, 0.5, 0, STEPS, p) == (0.0, 0.0)
    with pytest.raises(ConfigError, match="update_seconds"):
        cost.round_and_sample_costs(per_actor, 1.0, -0.5, 100, STEPS, p)


def test_the_policy_noise_probe_measures_the_actor_losss_gradients_at_fixed_parameters():
    """The probe's terms are McCandlish et al.'s estimates from the actor loss's gradients on its minibatches,
    all taken at the same parameters (compared with gradients computed here by hand), and it leaves the
    parameters as they were."""
    from nitro.algos.ppo import PPOLearner, policy_noise_probe, ppo_actor_loss
    from nitro.algos.sgd import actor_terms, dist_params
    from nitro.config import ppo_config
    from nitro.policy.models import ModelSpec
    from nitro.scaling.noise import noise_scale_estimates

    spec = ModelSpec((4,), "box", 2, (-1.0, -1.0), (1.0, 1.0), hidden_sizes=(16,))
    learner = PPOLearner(spec, ppo_config("tuned"), seed=0)
    cfg, policy = learner.config, learner.policy
    rng = np.random.default_rng(0)
    n, mb = 256, 32
    obs = torch.as_tensor(rng.normal(size=(n, 4)).astype(np.float32))
    with torch.no_grad():
        x = policy.normalize(obs)
        old = dist_params(policy, obs)
        actions = policy.distribution(obs).sample()
        logp_old = policy.log_prob(policy.distribution(obs), actions)
    fields = {"x": x, "old": old, "actions": actions, "logp_old": logp_old,
              "adv": torch.as_tensor(rng.normal(size=n).astype(np.float32)) + 3.0 * actions[:, 0]}
    minibatches = [torch.arange(i * mb, (i + 1) * mb) for i in range(4)]
    params = learner.policy_parameters()
    before = [p.detach().clone() for p in params]
    est = policy_noise_probe(policy, params, fields, minibatches, cfg=cfg, kl_coeff=0.0)
    sq, grads = [], []
    for idx in minibatches:
        a = fields["adv"][idx]
        a = (a - a.mean()) / (a.std(unbiased=False) + 1e-8)
        logp, ent, kl = actor_terms(policy, x[idx], actions[idx], tuple(t[idx] for t in old), kl_grad=False)
        loss, _ = ppo_actor_loss(logp, logp_old[idx], a, ent, kl, clip=cfg.clip, kl_coeff=0.0,
                                 entropy_coeff=cfg.entropy_coeff)
        g = torch.cat([t.flatten() for t in torch.autograd.grad(loss, params)]).double()
        grads.append(g)
        sq.append(float(g.square().sum()))
    big = float((torch.stack(grads).mean(0)).square().sum())
    want = noise_scale_estimates(sq, big, mb, 4 * mb)
    assert (est.grad_sq, est.trace_sigma) == (pytest.approx(want.grad_sq, rel=1e-5),
                                              pytest.approx(want.trace_sigma, rel=1e-5))
    assert all(torch.equal(a, b) for a, b in zip(before, params))
    assert policy_noise_probe(policy, params, fields, minibatches[:1], cfg=cfg, kl_coeff=0.0) is None


# -- through the spec and the wire ----------------------------------------------------------------------------

def test_the_scaler_maps_the_wire_to_the_policies_params():
    from nitro.v1 import common_pb2
    from scaler_svc.server import policy_params

    assert policy_params(common_pb2.ScalerSpec(policy="noise")) == ("noise", {"kappa": NOISE_KAPPA})
    assert policy_params(common_pb2.ScalerSpec(policy="noise-adascale", kappa=6.0)) == ("noise-adascale",
                                                                                         {"kappa": 6.0})
    assert policy_params(common_pb2.ScalerSpec(policy="grow")) == ("grow", {"f1": 0.4, "f2": 0.8})
    assert policy_params(common_pb2.ScalerSpec(policy="grow", grow_f1=0.0, grow_f2=0.5)) == ("grow",
                                                                                           {"f1": 0.0, "f2": 0.5})
    name, params = policy_params(common_pb2.ScalerSpec(policy="noise-replay", actors_by_round="4,8"))
    assert make_policy(name, params).actors_by_round == (4, 8)


@pytest.mark.parametrize("scaler,field", [({"policy": "noise", "kappa": 0.0}, "scaler.kappa"),
                                          ({"policy": "noise", "kappa": float("nan")}, "scaler.kappa"),
                                          ({"policy": "grow", "grow_f1": 1.5}, "scaler.grow_f1"),
                                          ({"policy": "grow", "grow_f1": 0.7, "grow_f2": 0.6}, "scaler.grow_f2"),
                                          ({"policy": "noise", "actors_by_round": "4,8"}, "scaler.actors_by_round")])
def test_the_spec_refuses_bad_settings_naming_the_field(scaler, field):
    from nitro.client.sdk import spec_to_proto
    from nitro.spec import InvalidSpec, from_proto, validate

    with pytest.raises(InvalidSpec) as err:
        validate(from_proto(spec_to_proto({"env_id": "CartPole-v1", "scaler": scaler})))
    assert err.value.field == field


def test_the_spec_carries_the_new_settings_through_the_wire():
    from nitro.client.sdk import spec_to_proto
    from nitro.spec import from_proto, validate

    spec = validate(from_proto(spec_to_proto({"env_id": "CartPole-v1", "scaler": {
        "policy": "noise-replay", "actors_by_round": "4,8", "kappa": 2.5, "grow_f1": 0.1, "grow_f2": 0.2}})))
    sc = spec.scaler
    assert (sc.policy, sc.actors_by_round, sc.kappa, sc.grow_f1, sc.grow_f2) == ("noise-replay", "4,8", 2.5, 0.1, 0.2)


# -- the update noise-adascale asks for -----------------------------------------------------------------------

def test_the_ppo_update_takes_the_rounds_minibatch_and_learning_rate_and_measures_the_policys_noise():
    from nitro.algos.ppo import PPOLearner
    from nitro.config import ppo_config
    from nitro.policy.models import ModelSpec

    spec = ModelSpec((4,), "box", 2, (-1.0, -1.0), (1.0, 1.0), hidden_sizes=(16,))
    rng = np.random.default_rng(0)
    n = 512
    actions = rng.normal(size=(n, 2)).astype(np.float32)
    # Rewards that favour the first action dimension: the policy gradient has a signal to measure.
    batch = {"obs": rng.normal(size=(n, 4)).astype(np.float32), "actions": actions,
             "rewards": 3.0 * actions[:, 0], "terminated": np.ones(n, bool),
             "truncated": np.zeros(n, bool), "values": np.zeros(n, np.float32),
             "final_values": np.zeros(n, np.float32), "bootstrap_value": 0.0}
    learner = PPOLearner(spec, ppo_config("tuned", epochs=1, minibatch_size=64), seed=0)
    with torch.no_grad():
        d = learner.policy.distribution(torch.as_tensor(batch["obs"]))
        batch["logp"] = learner.policy.log_prob(d, torch.as_tensor(batch["actions"])).numpy()
    plain = learner.update([dict(batch)])
    assert (plain.minibatch_size, plain.learning_rate) == (64, pytest.approx(learner.config.lr))
    assert plain.policy_noise_scale > 0 and plain.policy_noise_scale != plain.gradient_noise_scale
    assert plain.policy_noise_scale == pytest.approx(max(plain.policy_trace_sigma, 0) / plain.policy_grad_sq)
    scaled = learner.update([dict(batch)], minibatch_size=128, lr_factor=2.5)
    assert (scaled.minibatch_size, scaled.learning_rate) == (128, pytest.approx(2.5 * learner.config.lr))
    assert all(g["lr"] == pytest.approx(2.5 * learner.config.lr) for g in learner.optimizer.param_groups)
    with pytest.raises(ValueError, match="lr_factor"):
        learner.update([dict(batch)], lr_factor=0.0)
