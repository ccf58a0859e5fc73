"""Cost arithmetic against bills computed by hand from the paper's prices."""

from __future__ import annotations

import dataclasses
import math

import pytest
import yaml

from nitro.contracts import DEFAULT_ACTOR_MEMORY_MB, LAMBDA_FULL_VCPU_MB
from nitro.cost import (
    DEFAULT_MS_PER_STEP,
    FIRST_ROUND_LEARNER_S,
    LEARNER_ROUND_MARGIN,
    PAPER_PRICES,
    Charge,
    CostLedger,
    Prices,
    billed_duration_ms,
    budget_spent,
    cloud_launch,
    cloud_round_seconds,
    cold_invocations,
    estimate_round,
    evaluation_reserve,
    invocation_charge,
    lambda_cost,
    lambda_cpu_slowdown,
    lambda_duration_ms,
    lambda_invocation_cost,
    learner_charge,
    learner_cost,
    modelled_invocation_ms,
    phase_bill,
    provisioned_concurrency_cost,
    serverful_job_cost,
    serverful_vm_count,
)
from nitro.errors import ConfigError

P = PAPER_PRICES  # hand bills below use the paper's prices (a full vCPU at any memory size)


def test_default_prices_price_the_machine_that_measured():
    # The cloud clock measures the learner in CPU time on a 2-vCPU Ice Lake: priced as a c6i.large, not a GPU server;
    # actors get a full vCPU at 1,769 MB, the default size.
    d = Prices()
    assert (d.learner_instance, d.learner_usd_per_hour, d.lambda_full_vcpu_mb) == ("c6i.large", 0.085, 1769.0)
    assert DEFAULT_ACTOR_MEMORY_MB == LAMBDA_FULL_VCPU_MB == 1769
    assert (P.learner_instance, P.lambda_full_vcpu_mb) == ("p3.2xlarge", 0.0)


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
    # 3,540 s job + 60 s startup = one hour: 4 x 0.68 + 3.06 = 5.78
    assert serverful_job_cost(3540, 64, P) == pytest.approx(5.78, rel=1e-12)
    # per-hour billing: 3,541 + 60 s -> 2 VM-hours each = 5.44, learner pro rata 3,601 s = 3.06085
    hourly = dataclasses.replace(P, actor_vm_billing="per_hour")
    assert serverful_job_cost(3541, 64, hourly) == pytest.approx(5.44 + 3.06 * 3601 / 3600, rel=1e-12)
    # per-second minimum: a 0 s job with no startup still pays 60 s per VM
    quick = dataclasses.replace(P, actor_vm_startup_s=0.0)
    assert serverful_job_cost(0, 64, quick, include_learner=False) == pytest.approx(4 * 0.68 * 60 / 3600)
    # the paper's 'without serverless' ablation: one big VM, e.g. 72 vCPUs at a configured price
    big = Prices.from_mapping({"actor_vm_name": "c5.18xlarge", "actor_vm_vcpus": 72, "actor_vm_usd_per_hour": 3.06})
    assert serverful_vm_count(64, big) == 1


def test_a_ledger_adds_charges_and_reads_a_stored_hash():
    led = CostLedger()
    led = led.add(learner_charge(30, 2, P))
    led = led.add(invocation_charge("actor", requests=2, billed_ms=1235, modelled_ms=300.4, cpu_ms=0.0, init_ms=250, cold=True,
                                    steps=512, memory_mb=1024, prices=P))
    led = led.add(invocation_charge("learner", requests=1, billed_ms=400, modelled_ms=100, cpu_ms=0.0, init_ms=0, cold=False,
                                    steps=512, memory_mb=2048, prices=P))
    assert (led.invocations, led.billed_ms, led.cloud_billed_ms, led.steps_billed) == (2, 1235, 551, 512)
    assert (led.learner_fn_invocations, led.learner_fn_billed_ms, led.cloud_learner_fn_billed_ms) == (1, 400, 100)
    assert (led.wall_seconds, led.cloud_seconds) == (30.0, 2.0)
    # what Redis hands back: bytes, counters as HINCRBY / HINCRBYFLOAT write them, other fields of the hash
    stored = {f.encode(): repr(v).encode() for f, v in dataclasses.asdict(led).items()}
    stored[b"policy_state"], stored[b"plan:0"] = b"{}", b'{"actors": 1}'
    assert CostLedger.from_fields(stored) == led
    assert CostLedger.from_fields({"invocations": "3"}) == CostLedger(invocations=3)
    with pytest.raises(ConfigError, match="bogus"):
        CostLedger().add(Charge({"bogus": 1}, 0.0, 0.0))


def test_learner_charge_bills_the_server_on_both_clocks():
    c = learner_charge(60, 6, P)
    assert (c.usd, c.cloud_usd) == (pytest.approx(0.051, rel=1e-12), pytest.approx(0.0051, rel=1e-12))
    assert c.amounts == {"learner_cost_usd": c.usd, "wall_seconds": 60.0, "cloud_learner_cost_usd": c.cloud_usd,
                         "cloud_seconds": 6.0}


def test_invocation_charge_on_both_clocks():
    # 3 attempts billed 1,235 ms together; modelled 300.4 ms + 250 ms init when cold -> 551 ms billed on the cloud.
    c = invocation_charge("actor", requests=3, billed_ms=1235, modelled_ms=300.4, cpu_ms=0.0, init_ms=250, cold=True, steps=64,
                          memory_mb=1024, prices=P)
    assert c.usd == pytest.approx(1.235 * 0.0000166667 + 3 * 2e-7, rel=1e-12)
    assert c.cloud_usd == pytest.approx(0.551 * 0.0000166667 + 3 * 2e-7, rel=1e-12)
    assert c.cloud_seconds == pytest.approx(P.lambda_invoke_overhead_s + P.lambda_cold_start_s + 0.25 + 0.3004)
    assert c.amounts == {"actor_cost_usd": c.usd, "invocations": 3, "billed_ms": 1235, "cloud_actor_cost_usd":
                         c.cloud_usd, "cloud_billed_ms": 551, "steps_billed": 64}
    warm = invocation_charge("actor", requests=1, billed_ms=400, modelled_ms=300.4, cpu_ms=0.0, init_ms=250, cold=False, steps=0,
                             memory_mb=1024, prices=P)
    assert warm.amounts["cloud_billed_ms"] == 301 and "steps_billed" not in warm.amounts  # failed: no steps
    # Learner functions: the same prices, counters of their own, no env steps.
    fn = invocation_charge("learner", requests=1, billed_ms=400, modelled_ms=300.4, cpu_ms=0.0, init_ms=250, cold=False,
                           steps=64, memory_mb=1024, prices=P)
    assert fn.amounts == {"learner_fn_cost_usd": warm.usd, "learner_fn_invocations": 1, "learner_fn_billed_ms": 400,
                          "cloud_learner_fn_cost_usd": warm.cloud_usd, "cloud_learner_fn_billed_ms": 301}
    # Never reached the platform (connection refused): nothing billed on either clock.
    lost = invocation_charge("actor", requests=0, billed_ms=0, modelled_ms=0, cpu_ms=0.0, init_ms=250, cold=True, steps=0,
                             memory_mb=1024, prices=P)
    assert (lost.usd, lost.cloud_usd, lost.amounts["cloud_billed_ms"]) == (0.0, 0.0, 0)
    with pytest.raises(ConfigError, match="kind"):
        invocation_charge("critic", requests=1, billed_ms=1, modelled_ms=1, cpu_ms=0, init_ms=0, cold=False, steps=0,
                          memory_mb=1024, prices=P)


def test_bills_and_budget_left_per_clock():
    led = CostLedger(actor_cost_usd=0.5, learner_cost_usd=1.0, learner_fn_cost_usd=0.25, wall_seconds=3540,
                     cloud_actor_cost_usd=0.1, cloud_learner_cost_usd=0.2, cloud_learner_fn_cost_usd=0.05,
                     cloud_seconds=100)
    machine, cloud = led.bill("machine", 64, P), led.bill("cloud", 64, P)
    assert (machine.total_usd, machine.seconds) == (1.75, 3540) and cloud.total_usd == pytest.approx(0.35)
    assert machine.serverful_usd == pytest.approx(5.78, rel=1e-12)  # 3,540 s + 60 s startup: one hour
    assert cloud.serverful_usd == pytest.approx(serverful_job_cost(100, 64, P))
    assert led.budget_left(2.0, "machine") == pytest.approx(0.25)
    assert led.budget_left(2.0, "cloud") == pytest.approx(1.65)
    with pytest.raises(ConfigError, match="clock"):
        led.bill("wall", 64, P)


def test_the_first_round_is_estimated_from_the_defaults():
    est = estimate_round(CostLedger(), "cloud", rounds_planned=0, last_learner_seconds=0.0, steps_per_actor=1234,
                         memory_mb=1024, prices=P)
    assert (DEFAULT_MS_PER_STEP, FIRST_ROUND_LEARNER_S) == (1.0, 10.0)
    # 1,234 ms per actor: 1.234 GB-s x 0.0000166667 + 2e-7; the learner for 10 s
    assert est.per_actor_usd == pytest.approx(1.234 * 0.0000166667 + 2e-7, rel=1e-12)
    assert est.fixed_usd == pytest.approx(3.06 * 10 / 3600, rel=1e-12)
    assert est.cost_usd(32) == pytest.approx(32 * est.per_actor_usd + est.fixed_usd, rel=1e-12)
    assert est.cost_usd(0) == est.fixed_usd


@pytest.mark.parametrize("clock", ["cloud", "machine"])
def test_later_rounds_are_estimated_from_what_the_job_measured(clock):
    led = CostLedger(billed_ms=6000, cloud_billed_ms=3000, steps_billed=1000, wall_seconds=40.0, cloud_seconds=8.0,
                     learner_fn_invocations=4, learner_fn_cost_usd=0.004, cloud_learner_fn_cost_usd=0.002)
    est = estimate_round(led, clock, rounds_planned=2, last_learner_seconds=5.0, steps_per_actor=100,
                         memory_mb=2048, prices=P)
    cloud = clock == "cloud"
    ms = (3.0 if cloud else 6.0) * 100  # billed ms per step on the clock, times the steps
    fn = (0.002 if cloud else 0.004) / 4  # each actor's batch pays one learner function
    assert est.per_actor_usd == pytest.approx(lambda_invocation_cost(ms, 2048, P) + fn, rel=1e-12)
    # padded: the larger of the mean per round (4 s cloud, 20 s machine) and the last round (5 s)
    assert est.fixed_usd == pytest.approx(learner_cost(LEARNER_ROUND_MARGIN * (5.0 if cloud else 20.0), P), rel=1e-12)
    with pytest.raises(ConfigError, match="clock"):
        estimate_round(led, "wall", rounds_planned=2, last_learner_seconds=5.0, steps_per_actor=100,
                       memory_mb=2048, prices=P)


@pytest.mark.parametrize("clock", ["cloud", "machine"])
def test_the_evaluation_functions_mean_bill_per_round_is_in_the_estimate(clock):
    led = CostLedger(wall_seconds=40.0, cloud_seconds=8.0)
    evaluated = CostLedger(wall_seconds=40.0, cloud_seconds=8.0, eval_fn_invocations=10, eval_fn_cost_usd=0.006,
                           cloud_eval_fn_cost_usd=0.002)
    args = dict(rounds_planned=4, last_learner_seconds=1.0, steps_per_actor=100, memory_mb=2048, prices=P)
    without, with_eval = estimate_round(led, clock, **args), estimate_round(evaluated, clock, **args)
    assert with_eval.fixed_usd - without.fixed_usd == pytest.approx((0.002 if clock == "cloud" else 0.006) / 4)
    assert with_eval.per_actor_usd == without.per_actor_usd


@pytest.mark.parametrize("clock", ["cloud", "machine"])
def test_the_final_evaluation_is_kept_back_from_every_plan(clock):
    """The job's last evaluation is billed after the plan that ended the job: every estimate keeps it back, as
    its functions running every episode to the step limit at the job's ms per step, or the mean evaluation
    function measured, the larger."""
    cloud = clock == "cloud"
    led = CostLedger(billed_ms=6000, cloud_billed_ms=3000, steps_billed=1000, invocations=10)  # 6 / 3 ms a step
    args = dict(rounds_planned=2, last_learner_seconds=1.0, steps_per_actor=100, memory_mb=2048, prices=P)
    assert estimate_round(led, clock, **args).reserve_usd == 0.0  # no evaluation functions: nothing kept
    est = estimate_round(led, clock, **args, final_eval_episodes=20, eval_episode_steps=1000)
    # 20 episodes: 2 a function (at most MAX_EVAL_FUNCTIONS, 16), so 10 functions each billed 2 x 1,000 steps
    # (an actor invocation's 300 / 600 ms of start-up, as the mean actor invocation bills)
    per_function = lambda_invocation_cost((3.0 if cloud else 6.0) * (100 + 2 * 1000), 2048, P)
    assert est.reserve_usd == pytest.approx(10 * per_function, rel=1e-12)
    # A cold start of 400 ms more per function (at 1,024 MB the cloud clock runs it at that size's CPU share).
    cold = estimate_round(led, clock, **{**args, "memory_mb": 1024}, final_eval_episodes=20, eval_episode_steps=1000,
                          eval_init_ms=400.0).reserve_usd
    slow = lambda_cpu_slowdown(1024, P) if cloud else 1.0
    assert slow >= 1.0 and cold == pytest.approx(10 * lambda_invocation_cost(
        400.0 * slow + (3.0 if cloud else 6.0) * (100 + 2 * 1000), 1024, P), rel=1e-12)
    assert est.cost_usd(4) == estimate_round(led, clock, **args).cost_usd(4)  # the round's own cost is unchanged
    # Measured evaluation functions dearer than the model (cold starts, say) set the reserve instead.
    dear = dataclasses.replace(led, eval_fn_invocations=4, eval_fn_cost_usd=4 * 2 * per_function,
                               cloud_eval_fn_cost_usd=4 * 2 * per_function)
    assert estimate_round(dear, clock, **args, final_eval_episodes=20,
                          eval_episode_steps=1000).reserve_usd == pytest.approx(10 * 2 * per_function, rel=1e-12)
    # An env without a step limit: only what evaluations measured counts.
    assert evaluation_reserve(led, clock, episodes=5, episode_steps=0, memory_mb=2048, prices=P) == 0.0
    assert evaluation_reserve(dear, clock, episodes=5, episode_steps=0, memory_mb=2048,
                              prices=P) == pytest.approx(5 * 2 * per_function, rel=1e-12)
    with pytest.raises(ConfigError, match="episode_steps"):
        evaluation_reserve(led, clock, episodes=5, episode_steps=-1, memory_mb=2048, prices=P)


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


def test_cloud_round_is_its_phases_end_to_end():
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
    time.sleep(0.5)  # waiting outside a Redis call (e.g. for a busy core) is not billed on the cloud clock
    with clock.io():
        time.sleep(0.1)  # waiting on Redis is
    t = time.process_time()
    while time.process_time() - t < 0.1:  # 100 ms of CPU work
        pass
    report = clock.report(cold=False)
    # Upper bounds well below the 0.5 s outside wait, with room for a sleep that overruns on a loaded runner.
    assert 0.1 * 1e3 <= report["io_wall_ms"] < 0.4 * 1e3, report
    assert 0.19 * 1e3 <= report["modelled_ms"] < 0.45 * 1e3, report
    assert report["init_ms"] == 0.0
    assert clock.report(cold=True)["init_ms"] > 0  # a cold one reports the process's CPU before it began


def test_cpu_bound_work_runs_at_the_memory_size_s_share_of_a_vcpu():
    d = Prices()
    assert lambda_cpu_slowdown(1769, d) == 1.0 and lambda_cpu_slowdown(10240, d) == 1.0
    assert lambda_cpu_slowdown(1024, d) == pytest.approx(1769 / 1024)
    assert lambda_cpu_slowdown(1024, P) == 1.0  # the old model: a full vCPU at any size
    # 300.4 ms on a full vCPU, of which 290 ms CPU-bound and 10.4 ms waiting on Redis
    assert lambda_duration_ms(300.4, 290.0, 1769, d) == pytest.approx(300.4)
    assert lambda_duration_ms(300.4, 290.0, 512, d) == pytest.approx(10.4 + 290.0 * 1769 / 512)
    with pytest.raises(ConfigError, match="memory_mb"):
        lambda_cpu_slowdown(0, d)


def test_the_cloud_bill_of_an_invocation_slows_its_cpu_and_its_init_below_a_full_vcpu():
    d = Prices()
    full = invocation_charge("actor", requests=1, billed_ms=500, modelled_ms=300.4, cpu_ms=290.0, init_ms=250,
                             cold=True, steps=64, memory_mb=1769, prices=d)
    part = invocation_charge("actor", requests=1, billed_ms=500, modelled_ms=300.4, cpu_ms=290.0, init_ms=250,
                             cold=True, steps=64, memory_mb=1024, prices=d)
    slow = 1769 / 1024
    assert full.amounts["cloud_billed_ms"] == 551
    assert part.amounts["cloud_billed_ms"] == math.ceil(10.4 + 290.0 * slow + 250 * slow)
    assert part.cloud_seconds == pytest.approx(d.lambda_invoke_overhead_s + d.lambda_cold_start_s
                                               + (250 + 290.0) * slow / 1e3 + 0.0104)
    # CPU-bound GB-seconds are the same at both sizes (slower, but a smaller share): only the Redis wait is cheaper
    def gb_s(m, r):
        return r.amounts["cloud_billed_ms"] / 1e3 * m / 1024
    assert gb_s(1024, part) == pytest.approx(gb_s(1769, full) - 10.4e-3 * (1769 - 1024) / 1024, abs=2e-3)
    assert part.usd == lambda_cost(500, 1, 1024, d)  # this machine's clock bills what the endpoint measured


def test_a_jobs_bill_phase_by_phase_under_other_prices():
    d = Prices()
    # one round billed the old way: 1,024 MB actors on a full vCPU, the learner at $3.06/h
    lam = lambda_cost(8 * 100, 8, 1024, P)
    rep = {"actors_launched": 8, "cloud_actor_cost_usd": lam,
           "cloud_phases": {"sample": 0.13, "update": 0.6, "evaluate": 0.1}}
    old = phase_bill([rep], P, 1024, P, 1024)
    assert old["update"] == pytest.approx(learner_cost(0.6, P)) and old["actors"] == pytest.approx(lam)
    assert old["total"] == pytest.approx(learner_cost(0.83, P) + lam)
    new = phase_bill([rep], P, 1024, d, 1769)  # same full-vCPU work, today's prices and size
    assert new["update"] == pytest.approx(0.6 * 0.085 / 3600) and new["sample"] == pytest.approx(0.13 * 0.085 / 3600)
    assert new["actors"] == pytest.approx(lambda_cost(800, 8, 1769, d))
    part = phase_bill([rep], P, 1024, d, 1024)  # 1,024 MB with its CPU share: slower and as dear in CPU GB-s
    slow = 1769 / 1024
    assert part["sample"] == pytest.approx((0.03 + 0.1 * slow) * 0.085 / 3600)
    assert part["actors"] == pytest.approx(lambda_cost(800 * slow, 8, 1024, d))
