"""Cost arithmetic against bills computed by hand from the paper's prices."""

from __future__ import annotations

import json

import pytest
import yaml

from nitro.cost import (
    CostLedger,
    Prices,
    billed_duration_ms,
    budget_spent,
    cloud_detect_wait,
    cloud_launch,
    cloud_round_seconds,
    cold_invocations,
    estimate_round_cost,
    lambda_cost,
    lambda_invocation_cost,
    learner_cost,
    modelled_invocation_ms,
    provisioned_concurrency_cost,
    serverful_job_cost,
    serverful_round_cost,
    serverful_vm_count,
)
from nitro.errors import ConfigError

P = Prices()


def test_paper_defaults():
    assert P.learner_usd_per_hour == 3.06 and P.actor_vm_usd_per_hour == 0.68 and P.actor_vm_name == "c5.4xlarge"
    assert P.lambda_usd_per_gb_second == 0.0000166667 and P.lambda_usd_per_million_requests == 0.20
    assert P.provisioned_usd_per_gb_second == 0.0000041667


def test_billed_duration_rounds_up_to_the_millisecond():
    assert billed_duration_ms(1234.2) == 1235
    assert billed_duration_ms(1234.0) == 1234
    assert billed_duration_ms(0.1) == 1 and billed_duration_ms(0) == 1
    with pytest.raises(ConfigError, match="duration_ms"):
        billed_duration_ms(-1)


def test_thousand_invocations_bill():
    # 1,000 x 1,234.2 ms -> 1,235 ms billed each at 1,024 MB = 1,235 GB-s
    # 1,235 x 0.0000166667 = 0.0205833745 USD duration; 1,000 requests x 0.20 / 1e6 = 0.0002 USD
    per = lambda_invocation_cost(1234.2, 1024, P)
    assert per == pytest.approx(1.235 * 0.0000166667 + 0.0000002, rel=1e-12)
    assert 1000 * per == pytest.approx(0.0207833745, rel=1e-12)
    assert lambda_cost(1000 * billed_duration_ms(1234.2), 1000, 1024, P) == pytest.approx(0.0207833745, rel=1e-12)


def test_memory_is_in_binary_gigabytes():
    # 512 MB = 0.5 GB; 100 ms -> 0.05 GB-s x 0.0000166667 = 8.33335e-7, + 2e-7 request fee
    assert lambda_invocation_cost(100, 512, P) == pytest.approx(1.033335e-6, rel=1e-12)


def test_provisioned_rates():
    # duration on provisioned instances: 1,235 GB-s x 0.0000097222 = 0.012006917 + 0.0002
    assert lambda_cost(1_235_000, 1000, 1024, P, provisioned=True) == pytest.approx(0.012206917, rel=1e-12)
    # 64 instances x 1 GB configured for an hour: 64 x 3600 x 0.0000041667 = 0.96000768
    assert provisioned_concurrency_cost(64, 1024, 3600, P) == pytest.approx(0.96000768, rel=1e-12)
    # 301 s rounds up to 600 s: 64 x 600 x 0.0000041667 = 0.16000128
    assert provisioned_concurrency_cost(64, 1024, 301, P) == pytest.approx(0.16000128, rel=1e-12)
    assert provisioned_concurrency_cost(64, 1024, 301, P, round_up=False) == pytest.approx(64 * 301 * 0.0000041667)
    assert provisioned_concurrency_cost(0, 1024, 3600, P) == 0.0


def test_learner_bill():
    assert learner_cost(1800, P) == pytest.approx(1.53, rel=1e-12)
    assert learner_cost(0, P) == 0.0


def test_serverful_comparator():
    assert serverful_vm_count(64, P) == 4 and serverful_vm_count(65, P) == 5 and serverful_vm_count(1, P) == 1
    # 4 x c5.4xlarge + learner for 100 s: (2.72 + 3.06) x 100 / 3600
    assert serverful_round_cost(100, 64, P) == pytest.approx(5.78 * 100 / 3600, rel=1e-12)
    assert serverful_round_cost(100, 64, P, include_learner=False) == pytest.approx(2.72 * 100 / 3600, rel=1e-12)
    # 3,540 s job + 60 s startup = one hour: 4 x 0.68 + 3.06 = 5.78
    assert serverful_job_cost(3540, 64, P) == pytest.approx(5.78, rel=1e-12)
    # per-hour billing: 3,541 + 60 s -> 2 VM-hours each = 5.44, learner pro rata 3,601 s = 3.06085
    hourly = Prices(actor_vm_billing="per_hour")
    assert serverful_job_cost(3541, 64, hourly) == pytest.approx(5.44 + 3.06 * 3601 / 3600, rel=1e-12)
    # per-second minimum: a 0 s job with no startup still pays 60 s per VM
    quick = Prices(actor_vm_startup_s=0.0)
    assert serverful_job_cost(0, 64, quick, include_learner=False) == pytest.approx(4 * 0.68 * 60 / 3600)
    # the paper's 'without serverless' ablation: one big VM, e.g. 72 vCPUs at a configured price
    big = Prices.from_mapping({"actor_vm_name": "c5.18xlarge", "actor_vm_vcpus": 72, "actor_vm_usd_per_hour": 3.06})
    assert serverful_vm_count(64, big) == 1


def test_estimate_round_cost():
    # 32 x (1.235 GB-s x 0.0000166667 + 2e-7 = 2.07833745e-5) + 60 s of learner (0.051) = 0.05166506798
    assert estimate_round_cost(32, 1234.2, 1024, 60, P) == pytest.approx(0.05166506798, rel=1e-10)
    assert estimate_round_cost(0, 1000, 1024, 0, P) == 0.0


def test_ledger_accumulates_and_round_trips():
    led = CostLedger()
    led, r1 = led.add_round(invocations=64, billed_ms=64 * 1235, memory_mb=1024, round_seconds=30, i_max=64,
                            prices=P, provisioned_concurrency=64)
    led, r2 = led.add_round(invocations=8, billed_ms=8 * 1100, memory_mb=1024, round_seconds=20, i_max=64, prices=P,
                            provisioned_concurrency=64)
    assert (led.rounds, led.invocations, led.billed_ms, led.wall_seconds) == (2, 72, 64 * 1235 + 8800, 50.0)
    assert r1.actor_usd == pytest.approx(64 * 1.235 * 0.0000166667 + 64 * 2e-7, rel=1e-12)
    assert r2.learner_usd == pytest.approx(3.06 * 20 / 3600, rel=1e-12)
    assert r1.provisioned_usd == pytest.approx(64 * 30 * 0.0000041667, rel=1e-12)
    assert led.actor_usd == pytest.approx(r1.actor_usd + r2.actor_usd)
    assert led.total_usd == pytest.approx(r1.total_usd + r2.total_usd)
    # the comparator: first round carries the VM startup (and the learner waiting for it)
    assert r1.serverful_usd == pytest.approx(5.78 * 90 / 3600, rel=1e-12)
    assert r2.serverful_usd == pytest.approx(5.78 * 20 / 3600, rel=1e-12)
    assert led.serverful_usd == pytest.approx(serverful_job_cost(50, 64, P), rel=1e-12)
    restored = CostLedger.from_dict(json.loads(json.dumps(led.to_dict())))
    assert restored == led
    assert r1.to_dict()["total_usd"] == pytest.approx(r1.total_usd)
    with pytest.raises(ConfigError, match="bogus"):
        CostLedger.from_dict({"bogus": 1})


def test_ledger_comparator_telescopes_under_hourly_billing():
    hourly = Prices(actor_vm_billing="per_hour")
    led = CostLedger()
    for secs in [1000, 1000, 1000, 1000]:  # crosses the first hour boundary in round 4 (4,060 s incl. startup)
        led, rc = led.add_round(invocations=1, billed_ms=1, memory_mb=1024, round_seconds=secs, i_max=64,
                                prices=hourly)
    assert led.serverful_usd == pytest.approx(serverful_job_cost(4000, 64, hourly), rel=1e-12)
    assert rc.serverful_usd > 2.72  # the last round pays for a whole new VM-hour


def test_prices_from_mapping_and_validation():
    doc = yaml.safe_load("learner_usd_per_hour: 1.5\nactor_vm_billing: per_hour\nactor_vm_vcpus: 36\n")
    p = Prices.from_mapping(doc)
    assert p.learner_usd_per_hour == 1.5 and p.actor_vm_billing == "per_hour" and p.actor_vm_vcpus == 36
    assert Prices.from_mapping(p.to_dict()) == p and Prices.from_mapping(None) == Prices()
    with pytest.raises(ConfigError, match="lambda_usd_per_gb_sec"):
        Prices.from_mapping({"lambda_usd_per_gb_sec": 1.0})
    for bad in ({"learner_usd_per_hour": -1}, {"learner_usd_per_hour": float("nan")},
                {"learner_usd_per_hour": "3"}, {"actor_vm_vcpus": 0}, {"actor_vm_billing": "monthly"},
                {"actor_vm_name": ""}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            Prices.from_mapping(bad)
    with pytest.raises(AttributeError):
        P.learner_usd_per_hour = 1.0  # frozen


# --- the cloud clock (docs/cost.md) ---------------------------------------------------------------


def test_modelled_invocation_counts_cpu_outside_redis_and_wall_inside():
    # 900 ms of CPU of which 40 ms were inside Redis calls that took 100 ms of wall time -> 960 ms
    assert modelled_invocation_ms(900.0, 40.0, 100.0) == pytest.approx(960.0)
    assert modelled_invocation_ms(10.0, 30.0, 5.0) == pytest.approx(5.0)  # never negative outside I/O
    with pytest.raises(ConfigError, match="io_wall_ms"):
        modelled_invocation_ms(1.0, 0.0, -1.0)


def test_cold_invocations_beyond_the_warm_sandboxes():
    assert cold_invocations(8, 0) == 8
    assert cold_invocations(8, 8) == 0
    assert cold_invocations(64, 8) == 56  # a boosted round starts new sandboxes ...
    assert cold_invocations(8, 64) == 0  # ... which stay warm for the rounds after it


def test_cloud_launch_is_its_slowest_invocation_and_bills_init_when_cold():
    p = Prices(lambda_cold_start_s=0.25, lambda_invoke_overhead_s=0.03)
    seconds, billed = cloud_launch([(500.0, 300.0, False), (400.0, 300.0, True), (100.2, 0.0, False)], p)
    # warm: 0.03 + 0.5 = 0.53; cold: 0.03 + 0.25 + 0.3 + 0.4 = 0.98
    assert seconds == pytest.approx(0.98)
    assert billed == [500, 700, 101]  # init billed only when cold; rounded up to the ms
    assert cloud_launch([], p) == (0.0, [])


def test_cloud_round_is_its_phases_end_to_end_and_the_detector_overlaps_evaluation():
    assert cloud_detect_wait(0.3, 0.5) == 0.0
    assert cloud_detect_wait(0.8, 0.5) == pytest.approx(0.3)
    assert cloud_round_seconds({"sample": 0.98, "update": 1.0, "evaluate": 0.5, "detect": 0.3}) == pytest.approx(2.78)
    with pytest.raises(ConfigError, match="update"):
        cloud_round_seconds({"update": -1.0})


def test_budget_binds_on_the_named_clock():
    assert budget_spent(2.0, 0.5, "cloud") == 0.5
    assert budget_spent(2.0, 0.5, "machine") == 2.0
    with pytest.raises(ConfigError, match="budget_clock"):
        budget_spent(2.0, 0.5, "wall")


def test_invocation_clock_counts_cpu_and_redis_wait_not_other_waits():
    import time

    from nitro.clock import InvocationClock

    clock = InvocationClock()
    time.sleep(0.2)  # waiting outside a Redis call (e.g. for a busy core) is not billed on the cloud clock
    with clock.io():
        time.sleep(0.1)  # waiting on Redis is
    t = time.process_time()
    while time.process_time() - t < 0.1:  # 100 ms of CPU work
        pass
    report = clock.report(cold=False)
    assert 0.1 * 1e3 <= report["io_wall_ms"] < 0.18 * 1e3
    assert 0.19 * 1e3 <= report["modelled_ms"] < 0.3 * 1e3, report
    assert report["init_ms"] == 0.0
    assert clock.report(cold=True)["init_ms"] > 0  # a cold one reports the process's CPU before it began
