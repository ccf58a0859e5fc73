"""Stellaris mode without the services: weights, bounds and aggregation on scripted version histories,
the global importance-sampling truncation against a hand-computed example, the learner's update,
the learner function handler on a real Redis, the parameter service's aggregation path, the scaler's
kind "learner" Launch and its bill, and the spec."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
import torch

from actor_fn import learner_handler
from learner_svc.clients import LearnerDeps
from learner_svc.jobs import Job
from learner_svc.parameter_service import StellarisLoop
from nitro import cost
from nitro.algos.impact import IMPACTLearner
from nitro.algos.ppo import PPOLearner
from nitro.algos.stellaris import (
    ParameterServer,
    StalenessLedger,
    UpdateRecord,
    aggregate_queue,
    base_staleness,
    certainly_dropped,
    combined_update,
    compute_update,
    flat_parameters,
    global_truncated_ratio,
    make_parcel,
    prepare,
    skip_record,
    staleness_bound,
    staleness_weight,
)
from nitro.config import impact_config, ppo_config, preset_names
from nitro.contracts import invocation_key, parcel_key, staleness_record_key, update_stream_key
from nitro.data import codec
from nitro.data.store import PolicyStore
from nitro.errors import ConfigError
from nitro.policy.envs import env_spaces
from nitro.policy.inference import PolicyRunner
from nitro.policy.models import Policy, policy_to_blob, spec_for_spaces
from nitro.policy.rollout import Sampler
from nitro.spec import InvalidSpec, TrainingSpec, from_proto, to_proto, validate
from nitro.stellaris_records import decode_staleness_record, decode_update, encode_staleness_record, encode_update
from nitro.v1 import scaler_pb2
from scaler_svc.server import ScalerServicer
from tests.credentials import grant, read_key
from tests.recording_invoker import RecordingInvoker

ENV = "CartPole-v1"


# -- staleness weights and the bound ----------------------------------------------------------------

def test_staleness_weights():
    assert [staleness_weight(s) for s in (0, 1, 3)] == [1.0, 0.5, 0.25]  # 1 / (1 + s)
    assert staleness_weight(3, "inverse", 2.0) == pytest.approx(1 / 16)
    assert [staleness_weight(s, "exp", 0.5) for s in (0, 2)] == [1.0, pytest.approx(math.exp(-1.0))]
    assert {staleness_weight(s, "none") for s in (0, 5, 100)} == {1.0}
    for kind in ("inverse", "exp"):
        ws = [staleness_weight(s, kind, 0.7) for s in range(10)]
        assert ws[0] == 1.0 and all(a > b for a, b in zip(ws, ws[1:]))
    with pytest.raises(ValueError):
        staleness_weight(-1)
    with pytest.raises(ConfigError):
        staleness_weight(1, "linear")


def test_dynamic_bound_tightens_over_rounds():
    assert [staleness_bound(k, 7, 8, 2, "linear") for k in range(7)] == [8, 7, 6, 5, 4, 3, 2]
    # 1 + b = 16 (1/16)^(k/4): halves every round
    assert [staleness_bound(k, 5, 15, 0, "geometric") for k in range(5)] == [15, 7, 3, 1, 0]
    assert [staleness_bound(k, 4, 5, 1, "constant") for k in range(4)] == [5, 5, 5, 5]
    assert [staleness_bound(k, 4, 3, 0, "linear") for k in range(4)] == [3, 2, 1, 0]
    assert staleness_bound(0, 1, 6, 2) == 6  # a one-round job keeps the start bound
    assert staleness_bound(99, 10, 6, 2) == 2  # rounds past the plan stay at the end bound
    bounds = [staleness_bound(k, 50, 20, 3, "geometric") for k in range(50)]
    assert bounds[0] == 20 and bounds[-1] == 3 and bounds == sorted(bounds, reverse=True)


def test_scripted_version_history():
    """A parameter service's clock (one tick per aggregation that applies something) and its ledger under
    scripted launches and arrivals: a base gets staler only with versions that applied another base's update."""
    ledger, version, produced, applied, dropped = StalenessLedger(), 0, 0, 0, 0
    history = [  # (learners launched from the clock now, bases of the updates read together, bound)
        (3, [0, 0], 2),  # two of v0's three learners, read together: both fresh, each 1/3 of v0's step
        (2, [1], 2),  # one of v1's two: fresh, 1/2; version 2 applied v1's update: v0 is one version staler
        (0, [0, 1], 2),  # v0's third (s = 1: w 1/2, coefficient 1/6) and v1's second, still fresh: version 2
        #                 was v1's alone, a piece of v1's step (the version count said s = 1, coefficient 1/4)
        (1, [3], 1),  # v3's lone learner; v0 (s = 3) and v1 (s = 2) are now beyond the bound: forgotten
        (0, [1], 1),  # a forgotten base is measured by the version count, 4 - 1 = 3 > 1: dropped
        (0, [9], 1),  # a base from the future (another service's, or forged): dropped
    ]
    expect = [  # staleness, weights w(s), coefficients w(s) / n_base, applied
        ((0, 0), (1.0, 1.0), (1 / 3, 1 / 3), (True, True)),
        ((0,), (1.0,), (1 / 2,), (True,)),
        ((1, 0), (0.5, 1.0), (1 / 6, 1 / 2), (True, True)),
        ((0,), (1.0,), (1.0,), (True,)),
        ((3,), (0.0,), (0.0,), (False,)),
        ((-5,), (0.0,), (0.0,), (False,)),
    ]
    ledgers = [{0: 0}, {0: 1, 1: 0}, {0: 2, 1: 1}, {3: 0}, {3: 0}, {3: 0}]
    versions, per_base = [], {}
    for (launches, bases, bound), (stal, weights, coeffs, ok), after in zip(history, expect, ledgers):
        for _ in range(launches):
            ledger.launch(version)
        agg = ledger.aggregate(bases, version, bound)
        assert agg.staleness == stal and agg.applied == ok
        assert agg.weights == pytest.approx(weights) and agg.coefficients == pytest.approx(coeffs)
        # one clock for the whole queue: the decisions do not depend on the order within it
        back = ledger.aggregate(bases[::-1], version, bound)
        assert back.staleness == stal[::-1] and back.coefficients == pytest.approx(coeffs[::-1])
        for b, c in zip(bases, agg.coefficients):
            per_base[b] = per_base.get(b, 0.0) + c
        produced += len(bases)
        applied += agg.n_applied
        dropped += agg.n_dropped
        if agg.n_applied:
            ledger.advance(bases, agg)
            ledger.forget(bound)
            version += 1
        versions.append(version)
        assert ledger.staleness == after
        assert all(s <= version - b for b, s in ledger.staleness.items())  # never staler than the version count
    assert versions == [1, 2, 3, 4, 4, 4]
    assert (produced, applied, dropped) == (8, 6, 2) and produced == applied + dropped
    assert all(total <= 1.0 + 1e-12 for total in per_base.values())  # no base moves the policy more than one step
    assert per_base[0] == pytest.approx(5 / 6) and per_base[1] == pytest.approx(1.0) and per_base[3] == 1.0
    assert ledger.launched == {3: 1}


def test_updates_from_one_base_read_together_share_staleness():
    # Sixteen learners launched from v5 (a boosted round) whose updates are read at clock 5: all are fresh,
    # none is dropped at bound 4, and together they take one step (coefficients 1/16 each, summing to 1).
    agg = aggregate_queue([5] * 16, 5, bound=4)
    assert agg.staleness == (0,) * 16 and agg.n_applied == 16 and agg.n_dropped == 0
    assert sum(agg.weights) == 16 and sum(agg.coefficients) == pytest.approx(1.0)
    # launched from v5 but only 10 arrived yet: 10/16 of the step, the rest is the late ones' share
    assert sum(aggregate_queue([5] * 10, 5, 4, launched={5: 16}).coefficients) == pytest.approx(10 / 16)


def test_certainly_dropped():
    assert not certainly_dropped(0, 0)  # launched fresh: never certain
    assert not certainly_dropped(4, 4)  # s = 4 <= 4 can still be applied
    assert certainly_dropped(5, 4)  # s = 5 now, and it only grows
    assert not certainly_dropped(None, 0) and not certainly_dropped(9, None)  # no record, or no bound: not certain
    for base, stale, bound in [(5, 5, 4), (1, 3, 2), (7, 1, 0)]:
        ledger, version = StalenessLedger(), base - 1
        for _ in range(stale + 4):
            ledger.launch(base - 1)  # an older base's learners, applied one per poll

        def apply_older():
            nonlocal version
            agg = ledger.aggregate([base - 1], version, 16)
            assert agg.n_applied == 1
            ledger.advance([base - 1], agg)
            version += 1

        apply_older()
        ledger.launch(base)  # the clock reads v_base
        for _ in range(stale):  # each version holds another base's update: v_base one version staler
            apply_older()
        assert ledger.staleness[base] == stale and certainly_dropped(ledger.staleness[base], bound)
        for _ in range(3):  # no later aggregation and no tighter bound applies it
            for tighter in range(bound + 1):
                assert ledger.aggregate([base], version, tighter).n_applied == 0
            apply_older()


def test_the_staleness_record_tells_a_learner_its_base(hmac_key):
    """What a learner function reads before it computes: its base's staleness from the signed record."""
    ledger = StalenessLedger()
    for base in (3, 3, 4):
        ledger.launch(base)
    ledger.staleness = {3: 0, 4: 2}
    back = decode_staleness_record(encode_staleness_record(ledger.record(9), hmac_key), hmac_key)
    assert back == {"format": 1, "version": 9, "staleness": {3: 0, 4: 2}}
    assert base_staleness(back, 3) == 0  # six versions since v3, all its own siblings': fresh
    assert base_staleness(back, 4) == 2
    assert base_staleness(back, 9) == 0  # handed out after the record was written
    assert base_staleness(back, 1) == 8  # forgotten (beyond the bound): the version count, also beyond it
    assert decode_staleness_record(encode_staleness_record(ledger.record(9), b"x" * 32), hmac_key) is None
    assert decode_staleness_record(None, hmac_key) is None and base_staleness(None, 3) is None
    assert staleness_record_key("j") == "nitro:j:learn:staleness"


# -- siblings: one staleness however their arrivals are grouped ----------------------------------------

def _sibling_total(groups: list[int], bound: int, ledger: bool = True) -> tuple[float, int, tuple[int, ...]]:
    """16 learners launched from v5, their updates read in polls of `groups` sizes, nothing else applied:
    (sum of the coefficients applied, updates dropped, their staleness). ledger=False: the version count."""
    led = StalenessLedger()
    for _ in range(16):
        led.launch(5)
    version, total, dropped, stal = 5, 0.0, 0, ()
    for n in groups:
        bases = [5] * n
        agg = led.aggregate(bases, version, bound) if ledger else aggregate_queue(bases, version, bound,
                                                                                  launched={5: 16})
        total, dropped, stal = total + sum(agg.coefficients), dropped + agg.n_dropped, stal + agg.staleness
        if agg.n_applied:
            led.advance(bases, agg)
            led.forget(bound)
            version += 1
    return total, dropped, stal


@pytest.mark.parametrize("bound", [16, 4, 0])
@pytest.mark.parametrize("groups", [[16], [4] * 4, [1] * 16, [3, 1, 7, 5]])
def test_siblings_apply_one_step_however_their_arrivals_are_grouped(groups, bound):
    total, dropped, stal = _sibling_total(groups, bound)
    assert total == pytest.approx(1.0) and dropped == 0 and stal == (0,) * 16  # as 16 read in one poll


def test_sixteen_siblings_before_and_after():
    """The audit's example (docs/stellaris.md): staleness as the version count made siblings arriving in
    separate polls penalise each other; the ledger gives them one staleness."""
    before = {name: _sibling_total(groups, bound, ledger=False)[:2] for name, groups, bound in
              [("one poll", [16], 16), ("4 per poll", [4] * 4, 16), ("1 per poll", [1] * 16, 16),
               ("1 per poll, bound 4", [1] * 16, 4)]}
    assert {k: (round(t, 3), d) for k, (t, d) in before.items()} == {
        "one poll": (1.0, 0), "4 per poll": (0.521, 0), "1 per poll": (0.211, 0), "1 per poll, bound 4": (0.143, 11)}
    assert _sibling_total([1] * 16, 4) == (pytest.approx(1.0), 0, (0,) * 16)


def test_other_bases_still_make_a_base_stale():
    """Versions that applied another base's update count, alone or mixed with the base's own siblings."""
    ledger, version = StalenessLedger(), 5
    for _ in range(4):
        ledger.launch(5)
    coefficients = []

    def poll(bases, bound=16):
        nonlocal version
        agg = ledger.aggregate(bases, version, bound)
        coefficients.append(agg.coefficients)
        if agg.n_applied:
            ledger.advance(bases, agg)
            ledger.forget(bound)
            version += 1
        return agg

    assert poll([5]).staleness == (0,)  # v6: v5's alone
    ledger.launch(6)  # a batch dispatched at v6
    assert poll([6]).staleness == (0,)  # v7: v6's alone; v5's siblings missed it
    assert ledger.staleness == {5: 1, 6: 0}
    assert poll([5, 6]).staleness == (1, 0)  # v8: mixed, both get staler
    assert ledger.staleness == {5: 2, 6: 1}
    ledger.launch(8)
    assert poll([8]).staleness == (0,)
    assert ledger.staleness == {5: 3, 6: 2, 8: 0} and version == 9
    assert poll([5]).staleness == (3,)  # another of v5's four: w = 1/4 of its 1/4 share
    assert coefficients[-1] == pytest.approx((1 / 16,))
    assert ledger.staleness == {5: 3, 6: 3, 8: 1}  # v10 was v5's alone: v5 stays at 3, the others move
    # the drop rule: beyond the bound dropped, forgotten, and then measured by the version count (also beyond it)
    agg = poll([6], bound=2)
    assert agg.applied == (False,) and agg.staleness == (3,) and version == 10
    assert poll([8], bound=2).applied == (True,)  # s = 1 <= 2
    assert 5 not in ledger.staleness and 6 not in ledger.staleness and ledger.staleness == {8: 1}
    late = ledger.aggregate([6, 5], version, 2)
    assert late.applied == (False, False) and late.staleness == (version - 6, version - 5)
    assert ledger.aggregate([version + 1], version, 2).staleness == (-1,)  # a base from the future


# -- the weight really scales what is applied ---------------------------------------------------------

def _spec_and_cfg(algo="ppo", preset="fast", **hp):
    cfg = (ppo_config if algo == "ppo" else impact_config)(preset, hidden_sizes=(16, 16), **hp)
    obs, act = env_spaces(ENV)
    return spec_for_spaces(obs, act, hidden_sizes=cfg.hidden_sizes), cfg


@pytest.mark.parametrize("kind,decay,stale,w", [("inverse", 1.0, 3, 0.25), ("exp", 0.5, 2, math.exp(-1.0)),
                                                ("none", 1.0, 3, 1.0)])
def test_staleness_weight_scales_the_applied_update(kind, decay, stale, w):
    spec, cfg = _spec_and_cfg()
    ps = ParameterServer(spec, cfg, seed=0)
    g = np.random.default_rng(0).normal(size=ps.n_params).astype(np.float32)
    before = flat_parameters(ps.policy)
    assert ps.aggregate([g], aggregate_queue([0], stale, bound=10, kind=kind, decay=decay))
    moved = before - flat_parameters(ps.policy)
    assert torch.allclose(moved, torch.as_tensor(w * g), atol=1e-6)
    # the same update, fresh, moves the policy by exactly g: the ratio is the weight
    fresh = ParameterServer(spec, cfg, seed=0)
    fresh.aggregate([g], aggregate_queue([0], 0, bound=10, kind=kind, decay=decay))
    full = before - flat_parameters(fresh.policy)
    assert float(moved.norm() / full.norm()) == pytest.approx(w, rel=1e-5)


def test_updates_from_one_base_share_one_step():
    # Different bases: each lone update keeps its own weight (a weighted mean by sum w would count a lone
    # stale update in full; n = 1 for each here).
    g1, g2 = np.ones(4, np.float32), np.full(4, 3.0, np.float32)
    agg = aggregate_queue([5, 3], 5, bound=4)  # s = 0 and 2: w = 1 and 1/3
    assert torch.allclose(combined_update([g1, g2], agg), torch.full((4,), 1.0 + 1.0))
    lone = aggregate_queue([3], 5, bound=4)
    assert torch.allclose(combined_update([g2], lone), torch.full((4,), 1.0))  # 3 * 1/3, not 3
    assert combined_update([g1], aggregate_queue([0], 5, bound=4)) is None  # dropped: nothing to apply
    # One base: the updates' mean, not their sum
    gs = [np.full(4, float(i), np.float32) for i in range(1, 9)]
    assert torch.allclose(combined_update(gs, aggregate_queue([2] * 8, 2, bound=4)), torch.full((4,), 4.5))
    stale = aggregate_queue([2] * 8, 4, bound=4)  # the same, two versions late: w = 1/3 of the mean
    assert torch.allclose(combined_update(gs, stale), torch.full((4,), 1.5))


def _boosted_round_moves(n: int, bound: int, groups: list[int]) -> tuple[float, int, int]:
    """n learners launched from one base, equal updates g read in polls of `groups` sizes:
    (|moved| / |g|, applied, clock ticks)."""
    spec, cfg = _spec_and_cfg()
    ps = ParameterServer(spec, cfg, seed=0)
    g = np.random.default_rng(0).normal(size=ps.n_params).astype(np.float32)
    before, version, base, applied, ledger = flat_parameters(ps.policy), 7, 7, 0, StalenessLedger()
    for _ in range(n):
        ledger.launch(base)
    for size in groups:
        bases = [base] * size
        agg = ledger.aggregate(bases, version, bound)
        if ps.aggregate([g] * size, agg):
            ledger.advance(bases, agg)
            ledger.forget(bound)
            version += 1
        applied += agg.n_applied
    moved = before - flat_parameters(ps.policy)
    cos = float(torch.nn.functional.cosine_similarity(moved, torch.as_tensor(g), dim=0))
    assert cos == pytest.approx(1.0, abs=1e-5)
    return float(moved.norm() / np.linalg.norm(g)), applied, version - 7


@pytest.mark.parametrize("n", [1, 4, 16])
def test_boosted_round_takes_one_step_whatever_the_actor_count(n):
    # The mean of n equal updates is one update, whatever n (summing them was sum_{s<n} 1/(1+s): 3.38 for
    # n = 16, 5 applied and 11 dropped at bound 4), and however the n arrivals are grouped into polls
    # (counting every version as staleness, one per poll moved it by sum_{s<n} 1/(1+s) / n: 0.21 for 16).
    for bound in (16, 4):
        for groups in ([n], [1] * n, [n // 2, n - n // 2] if n > 1 else [1]):
            ratio, applied, ticks = _boosted_round_moves(n, bound, groups)
            assert ratio == pytest.approx(1.0, rel=1e-5) and applied == n and ticks == len(groups)


def _stellaris_loop(redis_client, hmac_key, tmp_path, job_id):
    spec = validate(TrainingSpec(env_id=ENV, preset="fast", rounds=3, job_id=job_id, learner_mode="stellaris"))
    return StellarisLoop(Job(spec), LearnerDeps(redis=redis_client, hmac_key=hmac_key, detector=None, scaler=None,
                                                data_dir=str(tmp_path)))


def _push(redis_client, hmac_key, job_id, rec):
    """An update as the learner function `rec.invocation_id` pushes it: signed with its own key."""
    redis_client.xadd(update_stream_key(job_id), {
        b"inv": rec.invocation_id.encode(),
        b"payload": encode_update(rec, invocation_key(hmac_key, job_id, rec.invocation_id))})


def test_service_applies_weighted_updates_read_from_redis(redis_client, hmac_key, tmp_path):
    """The stellaris loop's own path: signed updates on the stream -> decode -> aggregate -> publish."""
    loop = _stellaris_loop(redis_client, hmac_key, tmp_path, "agg-job")
    loop.publish()
    loop.version = 3  # three versions published so far
    loop.ledger.launched = {2: 2, 3: 1}  # two learners were launched from v2, one from v3
    loop.ledger.staleness = {2: 1, 3: 0}  # version 3 applied an update from another base than v2
    n = loop.learner.n_params
    rng = np.random.default_rng(1)
    updates = [rng.normal(size=n).astype(np.float32) for _ in range(3)]
    for i, (base, g) in enumerate(zip((2, 0, 3), updates)):  # s = 1 (w 1/2, n 2), 3 (not listed, dropped), 0
        _push(redis_client, hmac_key, "agg-job", UpdateRecord(f"agg-job-r0-g{i}", 0, base, 64, g, {"kl": 0.0}))
    # a retried learner's second push
    _push(redis_client, hmac_key, "agg-job", UpdateRecord("agg-job-r0-g2", 0, 3, 64, updates[2], {}))
    _push(redis_client, hmac_key, "agg-job", skip_record("agg-job-r0-g3", 0, 0, 3, 2, 3))  # a learner that skipped
    # a learner this service did not launch (one launched before a resume): its batch is learned from again
    _push(redis_client, hmac_key, "agg-job", UpdateRecord("agg-job-r0-g9", 0, 3, 64, updates[1], {"kl": 0.0}))
    for i in range(5):  # the learners this service launched, each for its batch's stream entry
        loop.learner_fns[f"agg-job-r{i // 4}-g{i}"] = SimpleNamespace(entry_id=f"{i}-0")
    before = flat_parameters(loop.learner.policy)
    acc = loop._new_acc(0)
    loop.bound = 2  # as if this were a later round's bound
    loop.expected["agg-job-r0-g3"] = (1e18, 0)
    assert loop._collect_updates(acc)
    expect = 0.25 * updates[0] + 1.0 * updates[2]
    assert torch.allclose(before - flat_parameters(loop.learner.policy), torch.as_tensor(expect), atol=1e-5)
    assert (acc.produced, acc.applied, acc.dropped, acc.duplicates, acc.skipped) == (3, 2, 1, 1, 1)
    assert acc.discarded == 1 and [e.entry_id for e in loop.settled] == ["0-0", "1-0", "2-0", "3-0"]
    assert list(loop.learner_fns) == ["agg-job-r1-g4"]  # settled batches are acked at the next commit
    assert acc.staleness == [1, 3, 0] and loop.version == 4  # one aggregation, one version
    assert "agg-job-r0-g3" not in loop.expected and "agg-job-r0-g3" in loop.received
    assert PolicyStore(redis_client, "agg-job").latest() == 4  # the new version is published
    # version 4 applied updates from v2 and v3: each had another base's update in it
    assert loop.ledger.launched == {2: 2, 3: 1} and loop.ledger.staleness == {2: 2, 3: 1}  # 2 <= 2: still applies
    record = decode_staleness_record(redis_client.get(staleness_record_key("agg-job")), read_key(hmac_key, "agg-job"))
    assert record == {"format": 1, "version": 4, "staleness": {2: 2, 3: 1}}  # what v2's other learner reads
    loop.bound = 1  # a tighter round; after v4's update neither v2's nor v3's can be applied: counts forgotten
    _push(redis_client, hmac_key, "agg-job", UpdateRecord("agg-job-r1-g4", 1, 4, 64, updates[1], {"kl": 0.0}))
    assert loop._collect_updates(acc) and loop.version == 5 and loop.ledger.launched == loop.ledger.staleness == {}
    assert redis_client.xlen(update_stream_key("agg-job")) == 0
    assert not loop._collect_updates(acc)


def test_service_boosted_round_of_siblings_is_one_step(redis_client, hmac_key, tmp_path, monkeypatch):
    """16 batches dispatched at one version: 16 learners from one base whose updates all apply, as one step."""
    loop = _stellaris_loop(redis_client, hmac_key, tmp_path, "boost-job")
    loop.publish()
    monkeypatch.setattr(loop, "_launch_learner_fn", lambda *args: scaler_pb2.LaunchResponse())
    loop.version, loop.max_in_flight = 5, 16
    acc = loop._new_acc(0)
    loop.bound = 4  # the bound the old arrival-order staleness met with s = 0..15: 11 of 16 dropped
    obs_dim = env_spaces(ENV)[0].shape[0]
    for i in range(16):
        batch = {"obs": np.zeros((8, obs_dim), np.float32), "rewards": np.zeros(8, np.float32)}
        loop.waiting.append((0, SimpleNamespace(entry_id=f"{i}-0", batch=batch, policy_version=5, steps=8)))
    loop._dispatch(acc)
    assert acc.launched == 16 and {info.base for info in loop.in_flight.values()} == {5}
    g = np.random.default_rng(2).normal(size=loop.learner.n_params).astype(np.float32)
    for info in loop.in_flight.values():
        _push(redis_client, hmac_key, "boost-job", UpdateRecord(info.inv, 0, 5, 8, g, {"kl": 0.0}))
    before = flat_parameters(loop.learner.policy)
    loop.pending_obs = {}  # observation statistics are not what this test measures
    assert loop._collect_updates(acc)
    assert (acc.produced, acc.applied, acc.dropped) == (16, 16, 0) and acc.staleness == [0] * 16
    moved = before - flat_parameters(loop.learner.policy)
    assert torch.allclose(moved, torch.as_tensor(g), atol=1e-5)  # the mean of 16 equal updates: one update
    assert loop.version == 6 and loop.ledger.launched == {5: 16}
    parcels = [codec.decode(redis_client.get(info.ref), read_key(hmac_key, "boost-job"))
               for info in loop.in_flight.values()]
    assert {(p["base_version"], p["max_staleness"]) for p in parcels} == {(5, 4)}  # the bound for the skip check


def test_service_siblings_arriving_one_per_poll_are_one_step(redis_client, hmac_key, tmp_path, monkeypatch):
    """16 learners from one base whose updates arrive one per poll at bound 4: one step, as if read together
    (the version count applied 0.143 of it and dropped 11), and a sibling still to start is not skipped."""
    # a record a killed service left: this service's first publish replaces it
    redis_client.set(staleness_record_key("poll-job"), encode_staleness_record(
        {"format": 1, "version": 30, "staleness": {5: 99}}, read_key(hmac_key, "poll-job")))
    loop = _stellaris_loop(redis_client, hmac_key, tmp_path, "poll-job")
    loop.version = 5
    loop.publish()
    assert decode_staleness_record(redis_client.get(staleness_record_key("poll-job")),
                                   read_key(hmac_key, "poll-job")) == {
        "format": 1, "version": 5, "staleness": {}}
    monkeypatch.setattr(loop, "_launch_learner_fn", lambda *args: scaler_pb2.LaunchResponse())
    loop.max_in_flight = 16
    acc = loop._new_acc(0)
    loop.bound = 4
    obs_dim = env_spaces(ENV)[0].shape[0]
    for i in range(16):
        batch = {"obs": np.zeros((8, obs_dim), np.float32), "rewards": np.zeros(8, np.float32)}
        loop.waiting.append((0, SimpleNamespace(entry_id=f"{i}-0", batch=batch, policy_version=5, steps=8)))
    loop._dispatch(acc)
    g = np.random.default_rng(3).normal(size=loop.learner.n_params).astype(np.float32)
    before = flat_parameters(loop.learner.policy)
    for info in list(loop.in_flight.values()):
        loop.pending_obs = {}  # observation statistics are not what this test measures
        _push(redis_client, hmac_key, "poll-job", UpdateRecord(info.inv, 0, 5, 8, g, {"kl": 0.0}))
        assert loop._collect_updates(acc)
        record = decode_staleness_record(redis_client.get(staleness_record_key("poll-job")),
                                         read_key(hmac_key, "poll-job"))
        assert record["version"] == loop.version and not certainly_dropped(base_staleness(record, 5), loop.bound)
    assert (acc.produced, acc.applied, acc.dropped, acc.aggregations) == (16, 16, 0, 16)
    assert acc.staleness == [0] * 16 and loop.version == 21 and loop.ledger.staleness == {5: 0}
    assert torch.allclose(before - flat_parameters(loop.learner.policy), torch.as_tensor(g), atol=1e-5)


# -- global importance-sampling truncation ------------------------------------------------------------

def test_global_truncation_hand_computed():
    mu = torch.tensor([0.5, 0.2, 0.4, 0.1])  # behaviour pi_1(a_t|x_t)
    pi2 = torch.tensor([0.6, 0.1, 0.8, 0.3])  # the learner's base pi_2
    pi3 = torch.tensor([0.4, 0.3, 1.0, 0.25])  # the newest version pi_3
    # pi_2/pi_1 = [1.2, 0.5, 2.0, 3.0], pi_3/pi_1 = [0.8, 1.5, 2.5, 2.5]
    # rho = min(rho_bar=2.2, pi_2/pi_1, pi_3/pi_1) = [0.8, 0.5, 2.0, 2.2]
    rho = global_truncated_ratio(pi2.log(), mu.log(), pi3.log()[None], rho_bar=2.2)
    assert torch.allclose(rho, torch.tensor([0.8, 0.5, 2.0, 2.2]), atol=1e-6)
    local = global_truncated_ratio(pi2.log(), mu.log(), None, rho_bar=2.2)  # no newer version: min(rho_bar, pi_2/mu)
    assert torch.allclose(local, torch.tensor([1.2, 0.5, 2.0, 2.2]), atol=1e-6)
    pi4 = torch.tensor([0.5, 0.05, 0.2, 0.5])  # a second recent version: the minimum over all of them
    two = global_truncated_ratio(pi2.log(), mu.log(), torch.stack([pi3.log(), pi4.log()]), rho_bar=2.2)
    assert torch.allclose(two, torch.tensor([0.8, 0.25, 0.5, 2.2]), atol=1e-6)
    logp = pi2.log().clone().requires_grad_(True)
    assert not global_truncated_ratio(logp, mu.log(), pi3.log()[None], 2.2).requires_grad  # data, no gradient
    fresh = global_truncated_ratio(mu.log(), mu.log(), mu.log()[None], rho_bar=1.0)
    assert torch.equal(fresh, torch.ones(4))


# -- the learner's update -------------------------------------------------------------------------------

def _batch(spec, policy, steps=256, seed=1):
    s = Sampler(ENV, seed=seed)
    try:
        return s.sample(PolicyRunner(spec, policy.numpy_state(), 0), steps, np.random.default_rng(seed))
    finally:
        s.close()


@pytest.mark.parametrize("preset", preset_names("ppo"))
def test_fresh_update_is_the_central_ppo_update(preset):
    # Every preset: `paper` standardises advantages once over the batch and caps the squared value
    # error (value_clip_mode "rllib"); `tuned` and `fast` standardise per minibatch (PPO2 value loss).
    spec, cfg = _spec_and_cfg(preset=preset, epochs=3, minibatch_size=64)
    central = PPOLearner(spec, cfg, seed=4)
    base = copy.deepcopy(central.policy)
    batch = _batch(spec, base)
    g, stats = compute_update(base, [batch], cfg, "ppo", rho_bar=2.0, seed=4)
    central.update([batch])
    assert stats["sgd_steps"] == 12 and stats["rho_mean"] == pytest.approx(1.0, abs=1e-5)
    assert np.allclose(g, (flat_parameters(base) - flat_parameters(central.policy)).numpy(), atol=1e-6)
    assert np.abs(g).max() > cfg.lr  # and it did move (Adam: about lr per step)


def _moved(policy, scale, seed):
    """A copy of `policy` with its actor perturbed: a behaviour or newer version that differs from it."""
    out, rng = copy.deepcopy(policy), np.random.default_rng(seed)
    with torch.no_grad():
        for t in out.actor.parameters():
            t.add_(torch.as_tensor(rng.normal(scale=scale, size=t.shape), dtype=t.dtype))
    return out


@pytest.mark.parametrize("preset", ["paper", "fast"])
def test_local_impact_update_on_stale_data_is_the_impact_update(preset):
    # No newer version (R empty) and rho_bar >= pg_rho_bar: the single weight min(pg_rho_bar, rho) is
    # V-trace's own min(pg_rho_bar, pi_2/mu), so the learner function's update is IMPACT's with pi_2 as
    # the target network: the weight once in the advantage, ratio pi_theta / max(pi_2, mu / is_ratio_clip).
    spec, cfg = _spec_and_cfg("impact", preset, epochs=2, minibatch_size=64)
    # The central learner as the learner functions compute V-trace: pi_2's critic, once (vtrace_critic "target")
    central = IMPACTLearner(spec, cfg.replace(vtrace_critic="target"), seed=4)
    base = copy.deepcopy(central.policy)
    batch = _batch(spec, _moved(base, 0.5, seed=7))  # stale: sampled by another version mu
    data, _ = prepare(base, [batch], cfg, "impact", rho_bar=2.0)
    assert float(data["rho"].min()) < 0.9 and float(data["rho"].max()) > 1.1  # really off-policy
    g, _ = compute_update(base, [batch], cfg, "impact", rho_bar=2.0, seed=4)
    central.update([batch])
    assert np.allclose(g, (flat_parameters(base) - flat_parameters(central.policy)).numpy(), atol=1e-6)
    assert np.abs(g).max() > cfg.lr
    assert np.allclose(data["advantages"].numpy(), central.last_data["advantages"], rtol=1e-6, atol=1e-6)
    assert np.allclose(data["logp_ref"].numpy(), central.last_data["logp_target"], atol=1e-6)
    assert torch.equal(data["is_weights"], torch.ones(len(batch["rewards"])))


def test_impact_mode_applies_the_global_truncation_once_in_the_advantage():
    spec, cfg = _spec_and_cfg("impact", "fast", pg_rho_bar=1.5)
    base = Policy(spec)
    base.requires_grad_(False)
    batch = _batch(spec, _moved(base, 0.5, seed=7))
    newest = _moved(base, 0.5, seed=8)
    local, _ = prepare(base, [batch], cfg, "impact", rho_bar=2.0)
    glob, _ = prepare(base, [batch], cfg, "impact", rho_bar=2.0, recent=(newest,))
    own = torch.exp(local["logp_base"].double() - local["logp"].double())  # pi_2 / mu
    w = torch.clamp(glob["rho"].double(), max=1.5)  # min(pg_rho_bar, rho)
    assert bool((w < own.clamp(max=1.5) - 1e-3).any())  # the newest version truncates some samples
    # A_t = min(pg_rho_bar, rho_t) (r_t + gamma v_{t+1} - V(x_t)): V-trace's min(pg_rho_bar, pi_2/mu) replaced
    expect = local["advantages"].double() * w / own.clamp(max=1.5)
    assert torch.allclose(glob["advantages"].double(), expect, rtol=1e-5, atol=1e-6)
    assert torch.equal(glob["returns"], local["returns"])  # the value targets stay V-trace's against pi_2
    for d in (local, glob):  # and the surrogate adds no second weight
        assert torch.equal(d["is_weights"], torch.ones_like(d["rho"]))
        ref = torch.maximum(d["logp_base"].double(), d["logp"].double() - math.log(cfg.is_ratio_clip)).float()
        assert torch.allclose(d["logp_ref"], ref)
    _, ppo_cfg = _spec_and_cfg("ppo")  # PPO mode: GAE carries no weight, rho weights the surrogate
    ppo, _ = prepare(base, [batch], ppo_cfg, "ppo", rho_bar=2.0, recent=(newest,))
    assert torch.equal(ppo["is_weights"], ppo["rho"]) and torch.equal(ppo["logp_ref"], ppo["logp_base"])


def test_stale_data_is_truncated_by_the_newest_policy():
    spec, cfg = _spec_and_cfg(epochs=1, minibatch_size=0)
    ps = ParameterServer(spec, cfg, seed=2)
    behaviour = copy.deepcopy(ps.policy)
    batch = _batch(spec, behaviour)
    rng = np.random.default_rng(3)
    base, newest = copy.deepcopy(behaviour), copy.deepcopy(behaviour)
    for p in (base, newest):  # two later versions that moved in different directions
        with torch.no_grad():
            for t in p.actor.parameters():
                t.add_(torch.as_tensor(rng.normal(scale=0.3, size=t.shape), dtype=t.dtype))
    _, local = compute_update(base, [batch], cfg, "ppo", rho_bar=1.5, recent=(), seed=0)
    _, glob = compute_update(base, [batch], cfg, "ppo", rho_bar=1.5, recent=(newest,), seed=0)
    assert glob["rho_mean"] < local["rho_mean"] and glob["truncated_fraction"] > local["truncated_fraction"]


def test_impact_update_runs():
    spec, cfg = _spec_and_cfg("impact")
    ps = ParameterServer(spec, cfg, seed=0)
    g, stats = compute_update(ps.policy, [_batch(spec, ps.policy, 128)], cfg, "impact", rho_bar=2.0)
    assert g.shape == (ps.n_params,) and np.isfinite(g).all() and stats["samples"] == 128


def test_update_wire_format_rejects_bad_records(hmac_key):
    rec = UpdateRecord("j-r0-g1", 0, 2, 10, np.ones(5, np.float32), {"kl": 0.1})
    back = decode_update(encode_update(rec, hmac_key), hmac_key, 5)
    assert (back.invocation_id, back.base_version, back.stats) == ("j-r0-g1", 2, {"kl": 0.1})
    with pytest.raises(codec.MalformedPayloadError):
        decode_update(encode_update(rec, hmac_key), hmac_key, 6)  # another model's size
    bad = UpdateRecord("j-r0-g1", 0, 2, 10, np.array([1.0, np.nan, 0, 0, 0], np.float32), {})
    with pytest.raises(codec.MalformedPayloadError):
        decode_update(encode_update(bad, hmac_key), hmac_key, 5)
    with pytest.raises(codec.BadSignatureError):
        decode_update(encode_update(rec, b"x" * 32), hmac_key, 5)
    skip = decode_update(encode_update(skip_record("j-r0-g2", 0, 2, 9, 4, 5), hmac_key), hmac_key, 5)
    assert skip.skipped and skip.update is None and (skip.base_version, skip.stats["latest"]) == (2, 9)
    assert skip.stats["staleness"] == 5
    with pytest.raises(codec.MalformedPayloadError):
        decode_update(encode_update(UpdateRecord("j-r0-g1", 0, 2, 10, None, {}), hmac_key), hmac_key, 5)


# -- the learner function handler on a real Redis --------------------------------------------------------

@pytest.fixture
def handler_env(redis_server, redis_client, hmac_key, monkeypatch):
    monkeypatch.delenv("NITRO_HMAC_KEY", raising=False)  # a learner function holds no key of its own
    monkeypatch.delenv("NITRO_HMAC_KEY_FILE", raising=False)
    monkeypatch.setattr(learner_handler._Warm, "policies", type(learner_handler._Warm.policies)())
    return redis_server.url


def test_handler_pushes_the_signed_update(handler_env, redis_client, hmac_key):
    spec, cfg = _spec_and_cfg(epochs=2, minibatch_size=128)
    ps = ParameterServer(spec, cfg, seed=0)
    store = PolicyStore(redis_client, "lh-job")
    rk = read_key(hmac_key, "lh-job")
    store.put(3, policy_to_blob(ps.policy, 3, rk))
    newest = copy.deepcopy(ps.policy)
    with torch.no_grad():
        newest.actor.out.bias.add_(torch.tensor([0.5, -0.5]))
    store.put(4, policy_to_blob(newest, 4, rk))  # published after the learner's base
    batch = _batch(spec, ps.policy)
    inv = "lh-job-r1-g7"
    parcel = make_parcel(job_id="lh-job", round_index=1, base_version=3, algo="ppo", config=cfg.to_dict(),
                         kl_coeff=0.0, rho_bar=2.0, recent_versions=1, seed=11, batches=[batch],
                         behaviour_versions=[2])
    redis_client.set(parcel_key("lh-job", inv), codec.encode(parcel, rk))
    event = {"job_id": "lh-job", "round": 1, "policy_version": 3, "invocation_id": inv,
             "payload_ref": parcel_key("lh-job", inv), "redis_url": handler_env,
             **grant(redis_client, hmac_key, "lh-job", inv)}
    out = learner_handler.handler(event)
    assert out["ok"] and out["steps"] == 256 and out["recent_versions_used"] == 1 and out["policy_version"] == 3
    (_, entries), = redis_client.xread({update_stream_key("lh-job"): "0-0"})
    rec = decode_update(entries[0][1][b"payload"], invocation_key(hmac_key, "lh-job", inv), ps.n_params)
    assert (rec.invocation_id, rec.base_version, rec.round, rec.steps) == (inv, 3, 1, 256)
    g, _ = compute_update(ps.policy, [batch], cfg, "ppo", rho_bar=2.0, recent=(newest,), seed=11)
    assert np.allclose(rec.update, g, atol=1e-6)  # the handler runs exactly compute_update


def test_handler_skips_an_update_certain_to_be_dropped(handler_env, redis_client, hmac_key, monkeypatch):
    """The service's record puts the base beyond the parcel's bound: no compute, a signed skip record. The
    clock alone does not: versions made of the base's own siblings' updates do not make it stale."""
    import nitro.algos.stellaris as stellaris_mod

    spec, cfg = _spec_and_cfg(epochs=1, minibatch_size=0)
    ps = ParameterServer(spec, cfg, seed=0)
    store = PolicyStore(redis_client, "sk-job")
    rk = read_key(hmac_key, "sk-job")
    for v in (3, 6):
        store.put(v, policy_to_blob(ps.policy, v, rk))  # latest is 6: three versions past base 3
    batch = _batch(spec, ps.policy, 64)

    def run(inv, bound, staleness):
        if staleness is not None:  # the service's record at clock 6
            redis_client.set(staleness_record_key("sk-job"), encode_staleness_record(
                {"format": 1, "version": 6, "staleness": {3: staleness}}, rk))
        else:
            redis_client.delete(staleness_record_key("sk-job"))
        parcel = make_parcel(job_id="sk-job", round_index=2, base_version=3, algo="ppo", config=cfg.to_dict(),
                             kl_coeff=0.0, rho_bar=2.0, recent_versions=1, seed=1, batches=[batch],
                             behaviour_versions=[3], max_staleness=bound)
        redis_client.set(parcel_key("sk-job", inv), codec.encode(parcel, rk))
        return learner_handler.handler({"job_id": "sk-job", "round": 2, "policy_version": 3, "invocation_id": inv,
                                        "payload_ref": parcel_key("sk-job", inv), "redis_url": handler_env,
                                        **grant(redis_client, hmac_key, "sk-job", inv)})

    computed = []
    real = stellaris_mod.compute_update
    monkeypatch.setattr(stellaris_mod, "compute_update", lambda *a, **k: computed.append(1) or real(*a, **k))
    out = run("sk-job-r2-g1", bound=2, staleness=3)  # s = 3 > 2: certain to be dropped
    assert out["ok"] and out["skipped"] == "stale_base" and out["latest_version"] == 6 and not computed
    assert out["staleness"] == 3
    out = run("sk-job-r2-g2", bound=3, staleness=3)  # s = 3 <= 3: can still be applied, so it is computed
    assert out["ok"] and "skipped" not in out and computed == [1]
    out = run("sk-job-r2-g3", bound=2, staleness=0)  # 6 - 3 = 3 > 2, but versions 4-6 were its siblings'
    assert out["ok"] and "skipped" not in out and computed == [1, 1]
    out = run("sk-job-r2-g4", bound=2, staleness=None)  # no record: not certain, computed
    assert out["ok"] and "skipped" not in out and computed == [1, 1, 1]
    (_, entries), = redis_client.xread({update_stream_key("sk-job"): "0-0"})
    recs = [decode_update(f[b"payload"], invocation_key(hmac_key, "sk-job", f[b"inv"].decode()), ps.n_params)
            for _, f in entries]
    assert [(r.invocation_id, r.skipped) for r in recs] == [("sk-job-r2-g1", True), ("sk-job-r2-g2", False),
                                                           ("sk-job-r2-g3", False), ("sk-job-r2-g4", False)]
    assert recs[0].stats == {"skipped": "stale_base", "latest": 6, "bound": 2, "staleness": 3}


def test_handler_errors_are_clear(handler_env, redis_client, hmac_key):
    base = {"job_id": "lh-job", "round": 0, "policy_version": 0, "invocation_id": "lh-job-r0-g1",
            "redis_url": handler_env, **grant(redis_client, hmac_key, "lh-job", "lh-job-r0-g1")}
    with pytest.raises(ConfigError, match="payload_ref"):
        learner_handler.handler({**base, "payload_ref": "nitro:other-job:learn:parcel:i"})
    with pytest.raises(ConfigError, match="policy_version"):
        learner_handler.handler({**base, "policy_version": -1, "payload_ref": "nitro:lh-job:learn:parcel:i"})
    with pytest.raises(learner_handler.ParcelNotFoundError):
        learner_handler.handler({**base, "payload_ref": "nitro:lh-job:learn:parcel:gone"})
    redis_client.set("nitro:lh-job:learn:parcel:forged", codec.encode({"format": 1}, b"y" * 32))
    with pytest.raises(learner_handler.BadParcelError):
        learner_handler.handler({**base, "payload_ref": "nitro:lh-job:learn:parcel:forged"})


# -- the scaler: kind "learner" launches and bills like an actor -----------------------------------------

class _Abort(Exception):
    pass


class _Context:
    def time_remaining(self):  # no deadline, as a call without one
        return None

    def abort(self, code, details):
        raise _Abort(code, details)


def test_scaler_launches_and_bills_learner_functions(redis_client):
    inv = RecordingInvoker()
    prices = cost.Prices()
    svc = ScalerServicer(redis_client, inv, prices, "redis://127.0.0.1:1/0", hmac_key=b"m" * 32)
    ref = "nitro:bill-job:learn:parcel:bill-job-r2-g5"
    base = dict(job_id="bill-job", round=2, policy_version=7, actors=1, steps_per_actor=128, function_name="nitro-learner",
                deadline_s=30.0, actor_memory_mb=2048, slots=[5])
    resp = svc.Launch(scaler_pb2.LaunchRequest(kind="learner", payload_ref=ref, **base), _Context())
    assert resp.succeeded == 1 and resp.invocations[0].invocation_id == "bill-job-r2-g5"
    name, events = inv.calls[0]
    creds = events[0].pop("credentials")
    assert name == "nitro-learner" and events == [{"job_id": "bill-job", "round": 2, "policy_version": 7,
                                                   "invocation_id": "bill-job-r2-g5", "redis_url": "redis://127.0.0.1:1/0",
                                                   "payload_ref": ref}]
    # The learner function's own signing key (its update verifies only as its own), the job's read key and user.
    assert creds["signing_key"] == invocation_key(b"m" * 32, "bill-job", "bill-job-r2-g5").hex()
    assert creds["read_key"] == read_key(b"m" * 32, "bill-job").hex() and creds["redis_username"] == "nitro-actor-bill-job"
    svc.Launch(scaler_pb2.LaunchRequest(env_id=ENV, **{**base, "actor_memory_mb": 1024, "slots": [0]}), _Context())
    assert "env_id" in inv.calls[1][1][0] and inv.calls[1][1][0]["invocation_id"] == "bill-job-r2-a0"
    st = {k.decode(): v.decode() for k, v in redis_client.hgetall("nitro:bill-job:scaler").items()}
    learner_usd = cost.lambda_cost(400, 1, 2048, prices)  # the same Lambda prices as an actor
    assert float(st["learner_fn_cost_usd"]) == pytest.approx(learner_usd)
    assert float(st["actor_cost_usd"]) == pytest.approx(cost.lambda_cost(400, 1, 1024, prices))
    assert (st["learner_fn_invocations"], st["invocations"], st["steps_billed"]) == ("1", "1", "128")
    redis_client.hset("nitro:bill-job:scaler", "budget_usd", 1.0)
    c = svc.GetCost(scaler_pb2.GetCostRequest(job_id="bill-job"), _Context())
    assert c.learner_function_cost_usd == pytest.approx(learner_usd) and c.learner_function_invocations == 1
    assert c.total_cost_usd == pytest.approx(c.actor_cost_usd + c.learner_cost_usd + learner_usd)
    spent = c.cloud_total_cost_usd if c.budget_clock == "cloud" else c.total_cost_usd  # the bill the budget binds on
    assert c.budget_left_usd == pytest.approx(1.0 - spent)


@pytest.mark.parametrize("kind,ref,what", [("critic", "", "kind"), ("learner", "", "payload_ref"),
                                           ("learner", "nitro:other:learn:parcel:x", "payload_ref"),
                                           ("learner", "nitro:bad-job:policy:1", "payload_ref")])
def test_scaler_rejects_bad_learner_launches(redis_client, kind, ref, what):
    svc = ScalerServicer(redis_client, RecordingInvoker(), cost.Prices(), "redis://x", hmac_key=b"m" * 32)
    with pytest.raises(_Abort) as err:
        svc.Launch(scaler_pb2.LaunchRequest(job_id="bad-job", round=0, policy_version=0, actors=1, steps_per_actor=1,
                                            function_name="nitro-learner", deadline_s=5.0, kind=kind,
                                            payload_ref=ref), _Context())
    assert err.value.args[0] == grpc.StatusCode.INVALID_ARGUMENT and what in err.value.args[1]


# -- the spec ---------------------------------------------------------------------------------------------

def test_spec_round_trip_and_defaults():
    spec = validate(TrainingSpec(env_id=ENV, learner_mode="stellaris"))
    assert spec.stellaris.learner_function == "nitro-learner" and validate(TrainingSpec(env_id=ENV)).learner_mode == "central"
    spec.stellaris.bound_start, spec.stellaris.staleness_weight = 5, "exp"
    back = from_proto(to_proto(spec))
    assert back.learner_mode == "stellaris" and back.stellaris == spec.stellaris
    assert TrainingSpec(**{**spec.to_dict(), "scaler": spec.scaler}).stellaris == spec.stellaris  # job.json


@pytest.mark.parametrize("field,value", [("learner_function", "bad name"), ("learner_memory_mb", 64),
                                         ("max_learners", 0), ("staleness_weight", "cosine"),
                                         ("staleness_decay", float("nan")), ("bound_start", -1),
                                         ("bound_end", 40), ("bound_schedule", "step"), ("rho_bar", 0.9),
                                         ("recent_versions", 17)])
def test_bad_stellaris_settings_name_the_field(field, value):
    spec = TrainingSpec(env_id=ENV, learner_mode="stellaris")
    setattr(spec.stellaris, field, value)
    with pytest.raises(InvalidSpec) as err:
        validate(spec)
    assert err.value.field == f"stellaris.{field}"
    with pytest.raises(InvalidSpec) as err:
        validate(TrainingSpec(env_id=ENV, learner_mode="async"))
    assert err.value.field == "learner_mode"


def test_cli_flags_reach_the_stellaris_spec():
    from nitro.client import cli, sdk
    from nitro.client.commands import train

    args = cli.build_parser().parse_args([
        "train", "--env", ENV, "--learner-mode", "stellaris", "--learner-function", "fn", "--learner-memory", "512",
        "--max-learners", "3", "--staleness-weight", "exp", "--staleness-decay", "0.3",
        "--staleness-bound-start", "6", "--staleness-bound-end", "1", "--staleness-bound-schedule", "geometric",
        "--rho-bar", "1.5", "--recent-versions", "2"])
    msg = sdk.spec_to_proto(train.build_spec(args))
    st = from_proto(msg).stellaris
    assert msg.learner_mode == "stellaris"
    assert (st.learner_function, st.learner_memory_mb, st.max_learners, st.staleness_weight, st.staleness_decay,
            st.bound_start, st.bound_end, st.bound_schedule, st.rho_bar, st.recent_versions) == (
        "fn", 512, 3, "exp", pytest.approx(0.3), 6, 1, "geometric", 1.5, 2)
