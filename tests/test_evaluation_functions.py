"""Evaluation off the learner's critical path (docs/evaluation.md): evaluation functions give the same returns as the
learner's own evaluation of the same versions, are billed in counters of their own, and best.pt stays exactly the
best evaluated version although its report is written a round later."""

from __future__ import annotations

import math
import os

import pytest
import torch

from learner_svc import evaluation
from learner_svc.durability import job_dir
from nitro.cost import Prices
from nitro.v1 import scaler_pb2
from tests.system import shared_system

system = shared_system()


def result(inv_id: str, returns=(), ok=True, error_type=""):
    return scaler_pb2.InvocationResult(invocation_id=inv_id, ok=ok, episode_returns=list(returns),
                                       error_type=error_type, error_message="boom" if not ok else "")


def test_the_mean_of_the_episodes_that_came_back_in_episode_order():
    resp = scaler_pb2.LaunchResponse(invocations=[result("j-r0-e1", [3.0]), result("j-r0-e0", [1.0, 2.0])],
                                     cost_usd=0.5, cloud_cost_usd=0.25, cloud_seconds=1.5)
    out = evaluation.from_launch(resp, 3)
    assert (out.eval_return, out.episodes, out.usd, out.cloud_usd, out.cloud_seconds) == (2.0, 3, 0.5, 0.25, 1.5)
    assert out.notes == []


def test_failed_functions_are_named_and_none_back_is_not_evaluated():
    part = evaluation.from_launch(scaler_pb2.LaunchResponse(
        invocations=[result("j-r0-e0", [4.0]), result("j-r0-e1", ok=False, error_type="Nitro.Timeout")]), 2)
    assert part.eval_return == 4.0 and "1 of 2 function(s) failed (Nitro.Timeout" in part.notes[0]
    none = evaluation.from_launch(scaler_pb2.LaunchResponse(
        invocations=[result("j-r0-e0", ok=False, error_type="X")]), 1)
    assert math.isnan(none.eval_return) and none.episodes == 0 and "0/1 episodes" in none.notes[0]


def test_the_eval_seed_is_never_an_actor_launchs():
    from nitro.seeds import derived_seed

    seeds = {evaluation.eval_seed(7, k) for k in range(50)}
    actor_seeds = {derived_seed(7, k, w) % (2**31) for k in range(50) for w in range(4)}
    assert len(seeds) == 50 and not seeds & actor_seeds


def run(client, system, mode: str) -> tuple[list, dict, str]:
    spec = {"env_id": "CartPole-v1", "preset": "fast", "rounds": 4, "steps_per_actor": 128, "eval_episodes": 3,
            "budget_usd": 1.0, "seed": 17, "reproducible": True, "evaluation": mode,
            "scaler": {"policy": "fixed", "fixed_actors": 2}}
    job = client.start_training(spec)
    reports = list(client.watch(job.job_id))
    from nitro.contracts import scaler_state_key
    from nitro.cost import CostLedger
    from nitro.data.redis_client import connect

    ledger = CostLedger.from_fields(connect(system.redis_url).hgetall(scaler_state_key(job.job_id)))
    return reports, ledger, job.job_id


@pytest.mark.timeout(600)
def test_functions_evaluate_each_version_as_the_learner_does_and_keep_best_exact(client, system):
    by_functions, ledger_f, job_f = run(client, system, "functions")
    on_learner, ledger_l, job_l = run(client, system, "learner")
    assert len(by_functions) == len(on_learner) == 4
    assert all(r.evaluated for r in by_functions + on_learner)
    # The same versions, the same seeds, deterministic actions: the same returns, round for round.
    assert [r.eval_return for r in by_functions] == [r.eval_return for r in on_learner]
    # Billed as evaluation functions (one per episode), in the job's total; the learner's evaluation costs none.
    assert ledger_f.eval_fn_invocations == 4 * 3 and ledger_f.cloud_eval_fn_cost_usd > 0
    assert all(r.eval_cost_usd > 0 and r.cloud_eval_cost_usd > 0 for r in by_functions)
    assert sum(r.cloud_eval_cost_usd for r in by_functions) == pytest.approx(ledger_f.cloud_eval_fn_cost_usd)
    assert ledger_l.eval_fn_invocations == 0 and all(r.eval_cost_usd == 0 for r in on_learner)
    assert ledger_f.bill("cloud", 2, Prices()).total_usd == pytest.approx(
        ledger_f.cloud_actor_cost_usd + ledger_f.cloud_learner_cost_usd + ledger_f.cloud_eval_fn_cost_usd)
    # best.pt: the checkpoint of the first round with the best return, in both modes.
    best_round = max(range(4), key=lambda k: (by_functions[k].eval_return, -k))
    for job_id in (job_f, job_l):
        ck = torch.load(os.path.join(job_dir(str(system.data_dir), job_id), "best.pt"), map_location="cpu",
                        weights_only=False)
        assert ck["round"] == best_round, job_id
