"""End to end through the SDK against real processes: Redis, the Lambda endpoint, three services.

CartPole-v1, 3 rounds, Nitro boosting on; reports streamed, metrics scraped,
results written, bad requests answered with the right status and no crash.
"""

from __future__ import annotations

import math
import subprocess
import sys

import grpc
import pytest

from nitro.client import results
from nitro.client.sdk import InvalidArgumentError, NitroClient, NotFoundError, UnavailableError
from nitro.rpc.grpc_util import check_health
from nitro.rpc.metrics import PHASES, sample_value, scrape
from tests.system import shared_system

pytestmark = pytest.mark.timeout(300)


system = shared_system()



@pytest.fixture(scope="module")
def finished_job(client):
    spec = {"env_id": "CartPole-v1", "preset": "fast", "rounds": 3, "steps_per_actor": 128, "eval_episodes": 2,
            "budget_usd": 1.0, "seed": 3, "scaler": {"policy": "nitro", "i_min": 2, "i_max": 6}}
    status = client.start_training(spec)
    reports = list(client.watch(status.job_id))
    return client.get(status.job_id), reports


def published_behaviour_values(system, job_id: str) -> bool:
    """Whether the job's latest policy version asks its actors to record per-step values."""
    from nitro.contracts import job_read_key
    from nitro.data.redis_client import connect
    from nitro.data.store import PolicyStore
    from nitro.policy.model_spec import blob_to_doc

    store = PolicyStore(connect(system.redis_url), job_id)
    read_key = job_read_key(bytes.fromhex(system.hmac_key), job_id)  # what the job's policies are signed with
    return blob_to_doc(store.get(store.latest()), read_key)["behaviour_values"]


def actor_bill_of_the_rounds_is_the_ledgers(system, job_id: str, reports) -> None:
    """Each round carries its own launches' Lambda bill on the cloud clock; together they are the job's."""
    from nitro.contracts import scaler_state_key
    from nitro.data.redis_client import connect

    ledger = connect(system.redis_url).hgetall(scaler_state_key(job_id))
    assert all(r.cloud_actor_cost_usd > 0 for r in reports), [r.cloud_actor_cost_usd for r in reports]
    assert sum(r.cloud_actor_cost_usd for r in reports) == pytest.approx(float(ledger[b"cloud_actor_cost_usd"]),
                                                                          rel=1e-6)


def test_three_rounds_streamed_with_complete_reports(finished_job, system):
    status, reports = finished_job
    actor_bill_of_the_rounds_is_the_ledgers(system, status.job_id, reports)
    assert status.state_name == "SUCCEEDED", status.message
    assert published_behaviour_values(system, status.job_id) is True  # PPO's GAE reads them
    assert [r.round for r in reports] == [0, 1, 2]
    total = 0
    for r in reports:
        assert 2 <= r.actors_launched <= 6
        assert r.actors_completed == r.actors_launched and r.actors_failed == 0
        assert r.env_steps == r.actors_launched * 128
        total += r.env_steps
        assert r.total_env_steps == total
        assert math.isfinite(r.eval_return) and r.eval_return > 0
        assert math.isfinite(r.convexity_ratio) and 0.0 <= r.score <= 1.0
        assert r.lambda_max != 0.0 or r.lambda_min != 0.0, "the detector really ran"
        assert set(r.phases) == set(PHASES), r.phases
        assert sum(r.phases.values()) <= r.round_seconds * 1.01
        assert r.total_cost_usd > 0 and r.serverful_cost_usd > 0
        assert 2 <= r.next_actors <= 6 and r.scaler_reason.startswith("nitro")
        # The cloud clock: the modelled critical path, phase by phase, and its bill.
        assert {"sample", "ingest", "update", "publish", "evaluate", "detect"} <= set(r.cloud_phases), r.cloud_phases
        assert r.cloud_phases["sample"] > 0 and r.cloud_phases["update"] > 0
        assert r.cloud_round_seconds == pytest.approx(sum(r.cloud_phases.values()), rel=1e-9)
        assert r.cloud_round_cost_usd > 0 and r.evaluated
    costs = [r.total_cost_usd for r in reports]
    assert costs == sorted(costs) and sum(r.round_cost_usd for r in reports) == pytest.approx(costs[-1], rel=1e-6)
    cloud = [r.cloud_total_cost_usd for r in reports]
    assert sum(r.cloud_round_cost_usd for r in reports) == pytest.approx(cloud[-1], rel=1e-6)
    assert status.cloud_total_cost_usd == pytest.approx(cloud[-1])
    assert status.total_env_steps == total and status.checkpoint_path


def left_in_redis(system, job_id: str, rounds: int) -> tuple[int, list[int], list[int]]:
    """(the latest policy version, the versions still stored, the rounds whose sample subset is still stored)."""
    from nitro.contracts import latest_policy_key, policy_key, sample_key
    from nitro.data.redis_client import connect

    r = connect(system.redis_url)
    latest = int(r.get(latest_policy_key(job_id)))
    return (latest, [v for v in range(latest + 1) if r.exists(policy_key(job_id, v))],
            [k for k in range(rounds) if r.exists(sample_key(job_id, k))])


def test_a_finished_ppo_job_leaves_only_its_newest_two_policies_and_last_sample_subset(system, finished_job):
    """On-policy data is used only at the version it was sampled with: older versions and scored subsets go
    (they used to stay for an hour, ~0.5 MB a round for Hopper)."""
    status, reports = finished_job
    latest, versions, subsets = left_in_redis(system, status.job_id, len(reports))
    assert latest == len(reports)  # version 0, then one per round's update
    assert versions == [latest - 1, latest]
    assert subsets == [len(reports) - 1]


def test_metrics_scraped_from_every_service(system, finished_job):
    comps = system.components
    learner = scrape(comps["learner"].metrics_port)
    phases = {s.labels.get("phase") for s in learner["nitro_round_phase_seconds"]
              if s.name.endswith("_count")}
    assert {"sample", "ingest", "update", "publish", "evaluate", "detect", "plan", "invoke"} <= phases
    assert sample_value(learner["nitro_env_steps"], "nitro_env_steps_total") >= 3 * 2 * 128
    assert "nitro_current_round" in learner and "nitro_budget_left_usd" in learner
    scaler = scrape(comps["scaler"].metrics_port)
    assert sample_value(scaler["nitro_actor_invocations"], "nitro_actor_invocations_total") >= 6
    assert sample_value(scaler["nitro_cost_usd"], "nitro_cost_usd_total", component="actors") > 0
    assert "nitro_actors_in_flight" in scaler
    # The scaler's own latency has its own name; a round phase is the learner's alone.
    assert sample_value(scaler["nitro_scaler_launch_seconds"], "nitro_scaler_launch_seconds_count", kind="actor") >= 3
    assert not [s for s in scaler["nitro_round_phase_seconds"] if s.name.endswith("_count")]
    detector = scrape(comps["detector"].metrics_port)
    assert sample_value(detector["nitro_detector_seconds"], "nitro_detector_seconds_count") >= 3
    for fam in (learner, scaler, detector):  # no label per round or per actor
        for samples in fam.values():
            for s in samples:
                assert not {"round", "actor", "invocation"} & set(s.labels)


def test_results_written(tmp_path, finished_job):
    status, reports = finished_job
    out = tmp_path / status.job_id
    out.mkdir()
    results.write_rounds_csv(out / "rounds.csv", reports)
    results.write_summary(out / "summary.json", status, reports, wall_s=1.0)
    results.plot_training(out / "training.png", reports)
    assert len((out / "rounds.csv").read_text().strip().splitlines()) == 4
    assert (out / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


BAD_SPECS = [
    ({"env_id": "NoSuchEnv-v9"}, "env_id"),
    ({"env_id": "CartPole-v1", "algo": "dqn"}, "algo"),
    ({"env_id": "CartPole-v1", "scaler": {"policy": "random"}}, "scaler.policy"),
    ({"env_id": "CartPole-v1", "scaler": {"i_min": 9, "i_max": 4}}, "scaler.i_min"),
    ({"env_id": "CartPole-v1", "scaler": {"i_min": 0}}, "scaler.i_min"),
    ({"env_id": "CartPole-v1", "rounds": 0}, "rounds"),
    ({"env_id": "CartPole-v1", "rounds": -3}, "rounds"),
    ({"env_id": "CartPole-v1", "steps_per_actor": 0}, "steps_per_actor"),
    ({"env_id": "CartPole-v1", "budget_usd": 0.0}, "budget_usd"),
    ({"env_id": "CartPole-v1", "budget_usd": -1.0}, "budget_usd"),
    ({"env_id": "CartPole-v1", "budget_usd": float("nan")}, "budget_usd"),
    ({"env_id": "CartPole-v1", "preset": "nope"}, "preset"),
    ({"env_id": "CartPole-v1", "hyperparameters": {"lr": -1.0}}, "hyperparameters"),
    ({"env_id": "CartPole-v1", "algo": "impact", "reproducible": True}, "reproducible"),
    ({"env_id": "CartPole-v1", "scaler": {"policy": "minions"}, "reproducible": True}, "reproducible"),
]


@pytest.mark.parametrize("spec,field", BAD_SPECS, ids=[f for _, f in BAD_SPECS])
def test_bad_input_is_invalid_argument_naming_the_field(client, system, spec, field):
    with pytest.raises(InvalidArgumentError) as err:
        client.start_training(spec)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details and ("allowed" in err.value.details or "must" in err.value.details)
    assert check_health(system.learner_address)


def test_unknown_job_is_not_found(client):
    for call in (client.get, client.stop):
        with pytest.raises(NotFoundError, match="no-such-job"):
            call("no-such-job")
    with pytest.raises(NotFoundError):
        list(client.watch("no-such-job"))


def test_redis_unreachable_is_unavailable_with_address(system, tmp_path):
    from nitro.local.processes import free_port

    port = free_port()
    env = system.child_env()
    proc = subprocess.Popen([sys.executable, "-m", "learner_svc", "--port", str(port), "--metrics-port",
                             str(free_port()), "--redis-url", "redis://127.0.0.1:1/0",
                             "--detector", system.components["detector"].address,
                             "--scaler", system.components["scaler"].address, "--data-dir", str(tmp_path)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import time

        deadline = time.time() + 60
        while not check_health(f"127.0.0.1:{port}") and time.time() < deadline:
            time.sleep(0.2)
        with NitroClient(f"127.0.0.1:{port}", token=system.token) as c:
            with pytest.raises(UnavailableError, match="127.0.0.1:1"):
                c.start_training({"env_id": "CartPole-v1"})
        assert check_health(f"127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(30)


def test_services_expose_health_and_reflection(system):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    for name, service in (("learner", "nitro.v1.TrainingService"), ("detector", "nitro.v1.BoostingDetector"),
                          ("scaler", "nitro.v1.ActorScaler")):
        addr = system.components[name].address
        assert check_health(addr, service)
        with grpc.insecure_channel(addr) as ch:
            stub = reflection_pb2_grpc.ServerReflectionStub(ch)
            resp = next(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                  timeout=5, metadata=(("authorization", f"Bearer {system.token}"),)))
            names = {s.name for s in resp.list_services_response.service}
        assert service in names and "grpc.health.v1.Health" in names


@pytest.mark.parametrize("clock", ["cloud", "machine"])
def test_budget_exhaustion_ends_the_job_with_the_reason(client, system, clock):
    # 2,000 rounds of 2 actors cost about $0.0072 on the cloud clock at the default prices (the learner server a
    # c6i.large, 0.085 USD/h; actors at 1,769 MB), more on this machine's: these budgets end the job well before
    # the round count does. The cloud clock's $0.001 takes ~220 rounds, half of what $0.002 took to test the
    # same (3 runs beside the grid: $1.8e-6 to $2.4e-6 left). This machine's clock keeps $0.002: at $0.001 it
    # overspent in 1 run of 3 beside the grid, by $4.4e-6 (likely a last round that ran past its estimate's margin,
    # LEARNER_ROUND_MARGIN). $0.0005 overspent on the cloud clock in 1 run of 3, by $5.4e-7 after 102 rounds;
    # likely the last round's evaluation, decided after that round's plan and so not in its estimate.
    # The final evaluation (5 evaluation functions) is billed after the plan that ended the job: the plans keep it
    # back, so the scaler's ledger, which has it, is within the budget too (without the reserve it overspent).
    budget = {"cloud": 0.001, "machine": 0.002}[clock]
    spec = {"env_id": "CartPole-v1", "preset": "fast", "rounds": 2000, "steps_per_actor": 64, "eval_episodes": 5,
            "budget_usd": budget, "budget_clock": clock, "eval_every": 1000,
            "scaler": {"policy": "fixed", "fixed_actors": 2, "i_min": 1, "i_max": 2}}
    job = client.start_training(spec)
    reports = list(client.watch(job.job_id))
    status = client.get(job.job_id)
    assert status.state_name == "SUCCEEDED" and "budget exhausted" in status.message
    assert 2 <= len(reports) < 2000, len(reports)
    spent = reports[-1].cloud_total_cost_usd if clock == "cloud" else reports[-1].total_cost_usd
    assert spent <= budget + 1e-9, "never plans a round it cannot pay for"
    assert reports[-1].budget_left_usd == pytest.approx(budget - spent, abs=1e-9), "budget_left follows the clock"
    assert reports[-1].evaluated and not any(r.evaluated for r in reports[:-1]), "the last round is evaluated"
    assert reports[-1].eval_cost_usd > 0 and "for the final evaluation" in reports[-1].scaler_reason
    from nitro.rpc.grpc_util import make_channel
    from nitro.v1 import scaler_pb2, scaler_pb2_grpc

    with make_channel(system.components["scaler"].address, token=system.token) as channel:
        bill = scaler_pb2_grpc.ActorScalerStub(channel).GetCost(scaler_pb2.GetCostRequest(job_id=job.job_id),
                                                                timeout=10)
    assert bill.eval_function_invocations == 5 and bill.budget_clock == clock
    assert bill.budget_left_usd >= -1e-9, "the final evaluation was paid for from the reserve"
    # The last report's bill was taken again once its evaluation was in: it is the job's whole bill.
    assert (reports[-1].total_cost_usd, reports[-1].cloud_total_cost_usd) == pytest.approx(
        (bill.total_cost_usd, bill.cloud_total_cost_usd), abs=1e-12)


@pytest.mark.parametrize("policy,expected", [("fixed:3", [3, 3]), ("max", [4, 4]), ("hydrozoa", [1, 1])])
def test_scaling_policies_through_the_services(client, system, policy, expected):
    spec = {"env_id": "CartPole-v1", "preset": "fast", "rounds": 2, "steps_per_actor": 32, "eval_episodes": 1,
            "budget_usd": 1.0, "scaler": {"policy": policy, "i_min": 1, "i_max": 4}}
    scored_before = _detector_calls(system)
    job = client.start_training(spec)
    reports = list(client.watch(job.job_id))
    assert [r.actors_launched for r in reports] == expected
    assert all(r.scaler_reason.startswith(policy.split(":")[0]) for r in reports)
    # None of these plans reads the score: the learner never asks the detector, and says nothing about it.
    assert _detector_calls(system) == scored_before
    assert all(r.lambda_max == r.lambda_min == 0.0 and not any("detector" in n for n in r.notes) for r in reports)


def test_noise_adascale_grows_the_round_and_the_update_with_it(client):
    """noise plans from the policy gradient's noise scale the learner measured and the costs the scaler
    priced; with a huge kappa the second round jumps to I_max, and noise-adascale's learner then updates on it
    with minibatches as many times bigger as the round is bigger than the preset's batch (fast: 2,048 in
    minibatches of 256), at AdaScale's learning rate."""
    from nitro.config import ppo_config

    cfg = ppo_config("fast")
    spec = {"env_id": "CartPole-v1", "preset": "fast", "rounds": 2, "steps_per_actor": 1024, "eval_episodes": 1,
            "budget_usd": 1.0, "scaler": {"policy": "noise-adascale", "kappa": 1e4, "i_min": 1, "i_max": 4}}
    reports = list(client.watch(client.start_training(spec).job_id))
    assert [r.actors_launched for r in reports] == [1, 4]
    assert reports[0].policy_grad_sq > 0 and reports[0].policy_noise_scale == pytest.approx(
        max(reports[0].policy_trace_sigma, 0) / reports[0].policy_grad_sq)
    assert "B_simple=" in reports[0].scaler_reason
    assert (reports[0].minibatch_size, reports[0].learning_rate) == (cfg.minibatch_size, pytest.approx(cfg.lr))
    assert reports[1].minibatch_size == cfg.minibatch_size * 4 * 1024 // cfg.batch_size
    assert reports[1].learning_rate > cfg.lr


def _detector_calls(system) -> float:
    fam = scrape(system.components["detector"].metrics_port)
    return sample_value(fam["nitro_detector_seconds"], "nitro_detector_seconds_count")


def test_impact_asynchronous_three_rounds_through_the_services(client, system):
    spec = {"env_id": "CartPole-v1", "algo": "impact", "preset": "fast", "rounds": 3, "steps_per_actor": 128,
            "eval_episodes": 1, "budget_usd": 1.0, "seed": 2, "scaler": {"policy": "nitro", "i_min": 2, "i_max": 4}}
    job = client.start_training(spec)
    reports = list(client.watch(job.job_id))
    status = client.get(job.job_id)
    assert status.state_name == "SUCCEEDED", status.message
    assert [r.round for r in reports] == [0, 1, 2]
    assert sum(r.env_steps for r in reports) == status.total_env_steps > 0
    assert all(math.isfinite(r.convexity_ratio) and 0.0 <= r.score <= 1.0 for r in reports)
    assert any(r.lambda_max != 0.0 for r in reports), "the detector scored IMPACT's surrogate"
    assert any("policy lag" in n for r in reports for n in r.notes)
    assert published_behaviour_values(system, job.job_id) is False  # V-trace reads the target network's values
    latest, versions, subsets = left_in_redis(system, job.job_id, len(reports))
    # published at the start and at each round's close (many updates apart): the newest three stay
    assert len(versions) == 3 and versions[-1] == latest and 0 not in versions, (latest, versions)
    assert subsets == [len(reports) - 1]
    actor_bill_of_the_rounds_is_the_ledgers(system, job.job_id, reports)
    learner = scrape(system.components["learner"].metrics_port)
    assert sample_value(learner["nitro_policy_lag"], "nitro_policy_lag_count") > 0


def test_eval_every_evaluates_every_nth_round_and_the_last(client):
    spec = {"env_id": "CartPole-v1", "preset": "fast", "rounds": 5, "steps_per_actor": 32, "eval_episodes": 2,
            "eval_every": 2, "budget_usd": 1.0, "scaler": {"policy": "fixed", "fixed_actors": 1, "i_min": 1, "i_max": 1}}
    reports = list(client.watch(client.start_training(spec).job_id))
    assert [r.evaluated for r in reports] == [False, True, False, True, True]
    assert [math.isfinite(r.eval_return) for r in reports] == [False, True, False, True, True]


def test_reproducible_runs_repeat_exactly(client):
    """Same seed, reproducible: the same actors, samples, updates and evaluations, round for round."""
    def run() -> list[tuple]:
        job = client.start_training({"env_id": "CartPole-v1", "preset": "fast", "rounds": 3, "steps_per_actor": 128,
                                     "eval_episodes": 2, "budget_usd": 1.0, "seed": 21, "reproducible": True,
                                     "scaler": {"policy": "nitro", "i_min": 1, "i_max": 3}})
        return [(r.actors_completed, r.env_steps, r.eval_return, r.train_return, r.policy_loss, r.score)
                for r in client.watch(job.job_id)]

    first, second = run(), run()
    assert len(first) == 3 and first == second
