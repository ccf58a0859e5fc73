"""learner_mode "stellaris" end to end: Redis, the Lambda endpoint hosting nitro-actor and nitro-learner,
detector, scaler and learner as real processes; CartPole-v1, a few rounds.

Every trajectory batch gets exactly one learner function through the scaler's Launch; every update
it pushes is counted once as applied or dropped, every learner that skipped (its base already certain
to be dropped when it started) once in the round's note; the scaler bills the learner functions;
boosting (detector score -> scaler plan) keeps working.
"""

from __future__ import annotations

import math
import re

import pytest

from nitro.algos.stellaris import staleness_bound
from nitro.client.sdk import InvalidArgumentError
from nitro.data.redis_client import connect
from nitro.rpc.metrics import sample_value, scrape
from nitro.v1 import scaler_pb2
from tests.system import module_system

pytestmark = pytest.mark.timeout(400)

ROUNDS, STEPS = 4, 128


system = module_system("nitro-stellaris", concurrency=4)



@pytest.fixture(scope="module")
def finished(client):
    # bound 3 -> 0: in the last round (bound 0) an update is applied only if no version was published
    # since its base, so learners overlapping other rounds' aggregations may be dropped or skip.
    spec = {"env_id": "CartPole-v1", "preset": "fast", "rounds": ROUNDS, "steps_per_actor": STEPS,
            "eval_episodes": 1, "budget_usd": 1.0, "seed": 5, "scaler": {"policy": "nitro", "i_min": 2, "i_max": 4},
            "learner_mode": "stellaris",
            "stellaris": {"max_learners": 4, "bound_start": 3, "bound_end": 0, "learner_memory_mb": 1024}}
    status = client.start_training(spec)
    reports = list(client.watch(status.job_id))
    return client.get(status.job_id), reports


def skipped_in(report) -> int:
    """Learners that skipped: the report's field, which the round's stellaris note repeats."""
    (note,) = [n for n in report.notes if n.startswith("stellaris:")]
    assert int(re.search(r"(\d+) skipped", note).group(1)) == report.learner_functions_skipped
    return report.learner_functions_skipped


def test_stellaris_job_runs_with_exact_gradient_accounting(finished):
    status, reports = finished
    assert status.state_name == "SUCCEEDED", status.message
    assert [r.round for r in reports] == list(range(ROUNDS))
    assert status.proto.spec.learner_mode == "stellaris"
    batches = status.total_env_steps // STEPS
    produced = sum(r.gradients_produced for r in reports)
    applied = sum(r.gradients_applied for r in reports)
    dropped = sum(r.gradients_dropped for r in reports)
    launched = sum(r.learner_functions_launched for r in reports)
    failed = sum(r.learner_functions_failed for r in reports)
    skipped = sum(skipped_in(r) for r in reports)
    for r in reports:  # each round's window, and so the job, balances
        assert r.gradients_produced == r.gradients_applied + r.gradients_dropped, r
        assert r.staleness_bound == staleness_bound(r.round, ROUNDS, 3, 0, "linear") == 3 - r.round
        assert 2 <= r.actors_launched <= 4 and r.actors_completed == r.actors_launched
        assert math.isfinite(r.eval_return) and r.eval_return > 0
        assert r.lambda_max != 0.0 or r.lambda_min != 0.0, "the detector scored the round"
        assert 2 <= r.next_actors <= 4 and r.scaler_reason.startswith("nitro")
        assert r.cloud_phases["sample"] >= 0 and r.cloud_phases["update"] > 0 and r.cloud_round_cost_usd > 0
    assert failed == 0, [n for r in reports for n in r.notes]
    assert launched == batches == produced + skipped  # one learner per batch, one update (or skip) per learner
    assert produced == applied + dropped and applied >= 1
    assert reports[-1].gradients_produced + skipped_in(reports[-1]) >= 1  # the last round waited for its learners
    assert status.total_env_steps == sum(r.env_steps for r in reports)


def test_learner_functions_are_billed_and_redis_is_clean(system, finished):
    status, reports = finished
    job = status.job_id
    cost = system_scaler(system).GetCost(scaler_pb2.GetCostRequest(job_id=job), timeout=10)
    launched = sum(r.learner_functions_launched for r in reports)
    assert cost.learner_function_invocations == launched
    assert cost.learner_function_cost_usd > 0
    assert cost.eval_function_invocations > 0  # its evaluation ran as evaluation functions (the default)
    assert cost.total_cost_usd == pytest.approx(cost.actor_cost_usd + cost.learner_cost_usd
                                                + cost.learner_function_cost_usd + cost.eval_function_cost_usd)
    assert reports[-1].total_cost_usd == pytest.approx(cost.total_cost_usd)
    r = connect(system.redis_url)
    try:
        assert list(r.scan_iter(f"nitro:{job}:learn:parcel:*")) == []  # every parcel deleted after its learner
        assert r.xlen(f"nitro:{job}:learn:updates") == 0  # every update read and deleted
    finally:
        r.close()


def test_gradient_metrics_match_the_reports(system, finished):
    _, reports = finished
    learner = scrape(system.components["learner"].metrics_port)
    produced = sum(r.gradients_produced for r in reports)
    dropped = sum(r.gradients_dropped for r in reports)
    assert sample_value(learner["nitro_gradients_produced"], "nitro_gradients_produced_total") == produced
    assert sample_value(learner["nitro_gradients_applied"], "nitro_gradients_applied_total") == produced - dropped
    assert sample_value(learner["nitro_gradients_dropped"], "nitro_gradients_dropped_total") == dropped
    assert sample_value(learner["nitro_gradient_staleness"], "nitro_gradient_staleness_count") == produced
    scaler = scrape(system.components["scaler"].metrics_port)
    assert sample_value(scaler["nitro_cost_usd"], "nitro_cost_usd_total", component="learner_functions") > 0
    assert sample_value(scaler["nitro_learner_function_invocations"],
                        "nitro_learner_function_invocations_total") >= produced


@pytest.mark.parametrize("stellaris,field", [
    ({"bound_start": 1, "bound_end": 3}, "stellaris.bound_end"),
    ({"staleness_weight": "linear"}, "stellaris.staleness_weight"),
    ({"rho_bar": 0.5}, "stellaris.rho_bar"),
    ({"bound_schedule": "cosine"}, "stellaris.bound_schedule"),
])
def test_bad_stellaris_settings_are_invalid_argument_naming_the_field(client, stellaris, field):
    with pytest.raises(InvalidArgumentError) as err:
        client.start_training({"env_id": "CartPole-v1", "learner_mode": "stellaris", "stellaris": stellaris})
    assert field in str(err.value)


def test_unknown_learner_mode_is_invalid_argument(client):
    with pytest.raises(InvalidArgumentError) as err:
        client.start_training({"env_id": "CartPole-v1", "learner_mode": "async"})
    assert "learner_mode" in str(err.value)


def system_scaler(system):
    from nitro.rpc.grpc_util import make_channel
    from nitro.v1 import scaler_pb2_grpc

    return scaler_pb2_grpc.ActorScalerStub(make_channel(system.components["scaler"].address, token=system.token))
