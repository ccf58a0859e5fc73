"""Scaling policies: actor sequences for scripted inputs, the noise-scale estimator, the budget guard."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from nitro.contracts import FIXED_ACTORS
from nitro.errors import ConfigError
from nitro.scaling import (
    EXHAUSTED,
    NoiseEstimate,
    RoundInputs,
    make_policy,
    noise_scale_estimates,
    plan_within_budget,
)
from nitro.scaling.policies import reads_score


def run(policy_name, params=None, scores=None, noise=None, rounds=None, i_min=8, i_max=64):
    """Drive a policy through rounds, carrying its state through JSON as the service would."""
    policy = make_policy(policy_name, params)
    n = rounds if rounds is not None else len(scores if scores is not None else noise)
    state, out = {}, []
    for k in range(n):
        inputs = RoundInputs(k, score=scores[k] if scores is not None else 0.0, i_min=i_min, i_max=i_max,
                             noise_scale=noise[k] if noise is not None else None)
        actors, new_state, reason = policy.decide(state, inputs)
        assert isinstance(actors, int) and isinstance(reason, str) and reason
        state = json.loads(json.dumps(new_state))
        out.append(actors)
    return out


SCORES = [0.0, 1.0, 0.5, 0.25, 0.124, 0.126, 0.9, float("nan"), 0.2, 1.7, -0.3, 0.0078125 * 65]


def test_nitro_sequence():
    # round(64 S): 0->8 (clipped up), 64, 32, 16, 7.94->8, 8.06->8, 57.6->58, NaN->8, 12.8->13, >1 -> 64, <0 -> 8,
    # 0.5078125*64 = 32.5 -> 33 (halves round up)
    assert run("nitro", scores=SCORES) == [8, 64, 32, 16, 8, 8, 58, 8, 13, 64, 8, 33]


def test_nitro_respects_custom_range():
    assert run("nitro", scores=[0.0, 0.5, 1.0], i_min=2, i_max=10) == [2, 5, 10]


@pytest.mark.parametrize("name, params", [
    ("nitro", None), ("nitro-floor", None), ("fixed", None), ("fixed:16", None), ("max", None), ("hydrozoa", None),
    ("kungfu", None), ("schedule", None), ("replay", {"actors_by_round": "8,16"}),
])
def test_reads_score_by_name_agrees_with_the_policy(name, params):
    """The learner decides by name whether to ask the detector; the built policy must agree."""
    assert reads_score(name) == bool(getattr(make_policy(name, params), "reads_score", False))


def test_only_the_detector_policies_read_the_score():
    assert [n for n in ("nitro", "nitro-floor", "fixed", "fixed:8", "max", "hydrozoa", "kungfu", "minions",
                        "schedule", "replay") if reads_score(n)] == ["nitro", "nitro-floor"]


def test_fixed_and_max_sequences():
    assert run("fixed:16", scores=SCORES) == [16] * len(SCORES)
    assert run("fixed", {"actors": 4}, rounds=3) == [4, 4, 4]
    assert run("fixed", rounds=2) == [FIXED_ACTORS] * 2  # no count: nitro.contracts.FIXED_ACTORS
    assert run("max", scores=SCORES) == [64] * len(SCORES)


def test_hydrozoa_doubles_every_m_rounds_up_to_i_max():
    seq = run("hydrozoa", rounds=50)
    assert seq[:10] == [8] * 10 and seq[10:20] == [16] * 10 and seq[20:30] == [32] * 10 and seq[30:] == [64] * 20
    assert run("hydrozoa", {"every": 2}, rounds=7, i_min=3, i_max=20) == [3, 3, 6, 6, 12, 12, 20]
    assert run("hydrozoa", rounds=1, i_min=8, i_max=8) == [8]
    assert make_policy("hydrozoa").decide({}, RoundInputs(10 ** 6))[0] == 64  # no overflow


def test_kungfu_proportional_to_noise_scale_and_never_down():
    noise = [100.0, 150.0, 120.0, 300.0, None, 250.0, float("nan"), 700.0, 1e6, 50.0]
    # anchored at 100 -> 8; 150 -> 12; 120 -> 9.6 but never down -> 12; 300 -> 24; unknown -> keep 24;
    # 250 -> 20 < 24 keep; NaN keep; 700 -> 56; huge -> 64 (clip); small -> keep 64
    assert run("kungfu", noise=noise) == [8, 12, 12, 24, 24, 24, 24, 56, 64, 64]
    seq = run("kungfu", noise=list(np.random.default_rng(0).lognormal(5, 1, 40)))
    assert all(b >= a for a, b in zip(seq, seq[1:])) and seq[0] == 8 and all(8 <= x <= 64 for x in seq)


def test_kungfu_anchors_on_first_known_value_and_accepts_reference():
    assert run("kungfu", noise=[None, None, 40.0, 80.0]) == [8, 8, 8, 16]
    assert run("kungfu", {"reference": 10.0}, noise=[20.0, 15.0, 40.0]) == [16, 16, 32]


def test_policies_do_not_mutate_state():
    state = {"actors": 12, "reference": 5.0}
    frozen = dict(state)
    for name in ("nitro", "fixed:3", "max", "hydrozoa", "kungfu", "schedule", "nitro-floor"):
        make_policy(name).decide(state, RoundInputs(4, score=0.3, noise_scale=50.0))
    make_policy("replay", {"actors_by_round": [3]}).decide(state, RoundInputs(4))
    assert state == frozen


def test_schedule_is_the_decay_without_the_detector():
    # round(64 * 0.96^k): 64, 61.44, 58.98, 56.62, 54.36; k=10: 42.55; k=50: 8.29; k=51: 7.96 -> I_min
    seq = run("schedule", scores=[1.0] * 52)  # the score is ignored
    assert seq[:5] == [64, 61, 59, 57, 54] and seq[10] == 43 and seq[50] == 8 and seq[51] == 8
    assert run("schedule", rounds=60) == seq + [8] * 8
    # d = 0.5 on [2, 16]: 16, 8, 4, 2, 1 -> 2
    assert run("schedule", {"decay": 0.5}, rounds=5, i_min=2, i_max=16) == [16, 8, 4, 2, 2]
    assert run("schedule", {"decay": 1.0}, rounds=3) == [64, 64, 64]


def test_replay_plays_its_list_clipped_and_repeats_the_last_entry():
    counts = [1, 100, 9, 16]
    assert run("replay", {"actors_by_round": counts}, rounds=6) == [8, 64, 9, 16, 16, 16]
    assert run("replay", {"actors_by_round": "1, 100,9,16"}, rounds=6) == [8, 64, 9, 16, 16, 16]
    assert run("replay", {"actors_by_round": (3,)}, rounds=3, i_min=1, i_max=4) == [3, 3, 3]
    _, _, reason = make_policy("replay", {"actors_by_round": counts}).decide({}, RoundInputs(7))
    assert "past the list's end" in reason


def test_nitro_floor_front_loads_like_the_authors_artifact():
    # floor round(64 * 0.96^(k^2)): 64, 61.44, 54.36, 44.38, 33.42, 23.09, 14.67, 8.59, 4.68 ...
    assert run("nitro-floor", scores=[0.0] * 10) == [64, 61, 54, 44, 33, 23, 15, 9, 8, 8]
    # nitro's own decision wins when it is higher: round(64 * 0.5) = 32 > 23 at k = 5
    assert run("nitro-floor", scores=[0.0] * 5 + [0.5, 1.0, 0.0]) == [64, 61, 54, 44, 33, 32, 64, 9]
    # F = 32, d_f = 0.5 on [1, 64]: 32, 16, 2, 0.0625 -> nitro's round(64 * 0.25) = 16
    assert run("nitro-floor", {"floor_actors": 32, "floor_decay": 0.5}, scores=[0.0, 0.0, 0.0, 0.25],
               i_min=1) == [32, 16, 2, 16]
    # the floor is capped at I_max like every decision
    assert run("nitro-floor", scores=[0.0, 0.0], i_min=1, i_max=4) == [4, 4]


def test_scaler_service_maps_scaler_spec_to_policy_params():
    from nitro.v1 import common_pb2
    from scaler_svc.server import policy_params

    assert policy_params(common_pb2.ScalerSpec(policy="schedule", decay=0.9)) == ("schedule", {"decay": 0.9})
    assert policy_params(common_pb2.ScalerSpec(policy="schedule")) == ("schedule", {"decay": 0.96})
    name, params = policy_params(common_pb2.ScalerSpec(policy="replay", actors_by_round="8,16,12"))
    assert run(name, params, rounds=4) == [8, 16, 12, 12]
    assert policy_params(common_pb2.ScalerSpec(policy="nitro-floor")) == \
        ("nitro-floor", {"floor_actors": 64, "floor_decay": 0.96})
    assert policy_params(common_pb2.ScalerSpec(policy="nitro-floor", floor_actors=16, floor_decay=0.5))[1] == \
        {"floor_actors": 16, "floor_decay": 0.5}
    with pytest.raises(ConfigError, match="replay.actors_by_round"):  # Plan answers INVALID_ARGUMENT
        make_policy(*policy_params(common_pb2.ScalerSpec(policy="replay")))


@pytest.mark.parametrize("name,params,field", [
    ("boost", None, "unknown scaling policy"),
    ("schedule", {"decay": 0.0}, "schedule.decay"),
    ("schedule", {"decay": 1.5}, "schedule.decay"),
    ("schedule", {"decay": "0.9"}, "schedule.decay"),
    ("schedule:4", None, "only 'fixed'"),
    ("replay", None, "replay.actors_by_round"),
    ("replay", {"actors_by_round": []}, "replay.actors_by_round"),
    ("replay", {"actors_by_round": ""}, "replay.actors_by_round"),
    ("replay", {"actors_by_round": "8,x"}, "replay.actors_by_round"),
    ("replay", {"actors_by_round": [8, 0]}, r"replay.actors_by_round\[1\]"),
    ("replay", {"actors_by_round": [8, 2.5]}, r"replay.actors_by_round\[1\]"),
    ("replay", {"actors_by_round": 8}, "replay.actors_by_round"),
    ("replay", {"actors": [8]}, "unknown parameter"),
    ("nitro-floor", {"floor_actors": 0}, "nitro-floor.floor_actors"),
    ("nitro-floor", {"floor_decay": float("nan")}, "nitro-floor.floor_decay"),
    ("fixed:0", None, "fixed.actors"),
    ("fixed:x", None, "fixed.actors"),
    ("fixed", {"actors": -1}, "fixed.actors"),
    ("fixed:8", {"actors": 16}, "fixed.actors"),
    ("fixed", {"actor": 16}, "unknown parameter"),
    ("nitro:4", None, "only 'fixed'"),
    ("nitro", {"i_max": 4}, "unknown parameter"),
    ("hydrozoa", {"every": 0}, "hydrozoa.every"),
    ("kungfu", {"reference": 0.0}, "kungfu.reference"),
    ("kungfu", {"reference": float("inf")}, "kungfu.reference"),
])
def test_invalid_policy_parameters(name, params, field):
    with pytest.raises(ConfigError, match=field):
        make_policy(name, params)


@pytest.mark.parametrize("kwargs,field", [
    ({"i_min": 0}, "i_min"), ({"i_min": 10, "i_max": 9}, "i_max"), ({"i_min": 2.5}, "i_min"),
    ({"round_index": -1}, "round_index"),
])
def test_invalid_round_inputs(kwargs, field):
    args = {"round_index": 0, **kwargs}
    with pytest.raises(ConfigError, match=field):
        RoundInputs(**args)


# -- gradient noise scale (McCandlish et al. 2018, appendix A) --------------------------------------------

def test_noise_scale_recovers_known_gradient_and_noise():
    """Per-example gradients g_i = G + noise with known |G|^2 and tr(Sigma); estimates from the two batch sizes."""
    rng = np.random.default_rng(0)
    d, n, b_small = 50, 4096, 128
    G = rng.standard_normal(d) * 0.1  # |G|^2 ~ 0.5
    sigma = 0.8  # per-coordinate std: tr(Sigma) = d * sigma^2 = 32
    small, big = [], []
    for _ in range(30):
        g = G + sigma * rng.standard_normal((n, d))
        small.extend(float(np.sum(m.mean(0) ** 2)) for m in np.split(g, n // b_small))
        big.append(float(np.sum(g.mean(0) ** 2)))
    est = noise_scale_estimates(small, float(np.mean(big)), b_small, n)
    assert est.grad_sq == pytest.approx(float(G @ G), rel=0.1)
    assert est.trace_sigma == pytest.approx(d * sigma ** 2, rel=0.05)
    assert est.b_simple == pytest.approx(d * sigma ** 2 / float(G @ G), rel=0.15)


def test_noise_scale_formulas_exact_and_guards():
    # |G|^2 = 2, tr(Sigma) = 64: E|G_B|^2 = 2 + 64 / B
    est = noise_scale_estimates([2 + 64 / 32] * 3, 2 + 64 / 256, 32, 256)
    assert est.grad_sq == pytest.approx(2.0) and est.trace_sigma == pytest.approx(64.0)
    assert est.b_simple == pytest.approx(32.0)
    assert NoiseEstimate(-1.0, 5.0).b_simple is None and NoiseEstimate(0.0, 5.0).b_simple is None
    assert NoiseEstimate(float("nan"), 5.0).b_simple is None
    with pytest.raises(ConfigError, match="b_small"):
        noise_scale_estimates([1.0], 1.0, 256, 256)
    with pytest.raises(ConfigError, match="small_sq_norms"):
        noise_scale_estimates([], 1.0, 32, 256)


# -- budget -----------------------------------------------------------------------------------------

BUDGET_TABLE = [
    # desired, i_min, per_actor, fixed, left -> actors, exhausted
    (32, 8, 0.01, 0.10, 10.0, 32, False),  # plenty
    (32, 8, 0.01, 0.10, 0.30, 20, False),  # scale down: (0.30 - 0.10) / 0.01 = 20
    (32, 8, 0.01, 0.10, 0.18, 8, False),  # exactly I_min affordable
    (32, 8, 0.01, 0.10, 0.17, 0, True),  # even I_min is not
    (32, 8, 0.01, 0.10, 0.18 - 1e-6, 0, True),  # a micro-dollar short is short
    (32, 8, 0.01, 0.10, 0.05, 0, True),  # not even the learner
    (4, 8, 0.01, 0.10, 0.14, 4, False),  # a fixed:4 policy below I_min still runs while affordable
    (32, 8, 0.0, 0.10, 0.10, 32, False),  # free actors
    (32, 8, 0.01, 0.10, None, 32, False),  # no budget
    (32, 8, 0.01, 0.10, math.inf, 32, False),
]


@pytest.mark.parametrize("desired,i_min,per_actor,fixed,left,actors,exhausted", BUDGET_TABLE)
def test_plan_within_budget(desired, i_min, per_actor, fixed, left, actors, exhausted):
    got, ex, reason = plan_within_budget(desired, i_min, per_actor, fixed, left)
    assert (got, ex) == (actors, exhausted)
    assert (reason == EXHAUSTED) == exhausted
    if left is not None and not ex:
        assert fixed + got * per_actor <= left + 1e-9  # never plans a round it cannot pay for


def test_budget_never_overspends_with_awkward_floats():
    rng = np.random.default_rng(1)
    for _ in range(2000):
        per, fixed, left = rng.uniform(1e-5, 0.1), rng.uniform(0, 0.5), rng.uniform(0, 3)
        got, ex, _ = plan_within_budget(64, 8, per, fixed, left)
        if not ex:
            assert fixed + got * per <= left + 1e-9 and (got == 64 or fixed + (got + 1) * per > left)


def test_budget_run_ends_with_exhaustion():
    """A scripted job: the nitro policy under a budget scales down, then stops with the reason."""
    policy, left, state, log = make_policy("nitro"), 1.0, {}, []
    for k, s in enumerate([1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0]):
        want, state, _ = policy.decide(state, RoundInputs(k, score=s))
        got, ex, reason = plan_within_budget(want, 8, 0.005, 0.02, left)
        log.append((want, got, ex))
        if ex:
            assert reason == "budget exhausted"
            break
        left -= 0.02 + got * 0.005
    assert log[0] == (64, 64, False) and log[1] == (64, 64, False)
    assert any(0 < got < want for want, got, _ in log)
    assert log[-1][2] is True


@pytest.mark.parametrize("args,field", [
    ((0, 8, 0.1, 0.1, 1.0), "desired_actors"), ((8, 0, 0.1, 0.1, 1.0), "i_min"),
    ((8, 8, -0.1, 0.1, 1.0), "cost_per_actor_usd"), ((8, 8, 0.1, float("nan"), 1.0), "fixed_round_cost_usd"),
    ((8, 8, 0.1, 0.1, float("nan")), "budget_left_usd"),
])
def test_budget_invalid_arguments(args, field):
    with pytest.raises(ConfigError, match=field):
        plan_within_budget(*args)


@pytest.mark.parametrize("written", ["fixed:16", " fixed:4 ", "fixed", "nitro", "fixed:x", "fixed:", "nitro:4", "max:"])
def test_make_policy_reads_fixed_n_as_the_spec_does(written):
    """One parser of "fixed:N" (split_policy): the scaler's make_policy and the spec's parse_policy (CLI, spec files,
    the wire) take the same count from a name and refuse the same names with the same words."""
    from nitro.scaling.policies import split_policy
    from nitro.spec import InvalidSpec, parse_policy

    try:
        parsed = parse_policy(written)
    except InvalidSpec as exc:
        with pytest.raises(ConfigError) as err:
            make_policy(written)
        assert str(err.value) == exc.detail and exc.field == "scaler.policy"
        return
    assert parsed == split_policy(written)
    policy = make_policy(written)
    assert policy.name == parsed[0] and (parsed[1] is None or policy.actors == parsed[1])
