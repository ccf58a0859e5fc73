"""The scaler's Plan and GetCost over a real Redis: what a job is billed, what a round is estimated to cost,
and when the budget stops a job. Expected values are built from the cost model's unit prices, so these tests
pin the scaler's bookkeeping, not the prices."""

from __future__ import annotations

import math

import grpc
import pytest

from nitro import cost
from nitro.contracts import DEFAULT_ACTOR_MEMORY_MB, scaler_state_key
from nitro.v1 import common_pb2, scaler_pb2
from scaler_svc.server import ScalerServicer

P = cost.Prices()


class Aborted(Exception):
    pass


class Context:
    def time_remaining(self):  # no deadline, as a call without one
        return None

    def abort(self, code, details):
        raise Aborted(code, details)


@pytest.fixture
def svc(redis_client):
    return ScalerServicer(redis_client, None, P, "redis://127.0.0.1:1/0")  # Plan and GetCost invoke nothing


def stored(redis_client, job: str) -> dict:
    return {k.decode(): v.decode() for k, v in redis_client.hgetall(scaler_state_key(job)).items()}


def plan(svc, job="j", round=0, *, budget=1.0, clock="", learner_s=2.0, cloud_s=0.5, steps=100, memory=0,
         policy="fixed", fixed=4, i_min=1, i_max=8, **extra):
    return svc.Plan(scaler_pb2.PlanRequest(
        job_id=job, round=round, budget_usd=budget, budget_clock=clock, learner_seconds=learner_s,
        cloud_learner_seconds=cloud_s, steps_per_actor=steps, actor_memory_mb=memory,
        scaler=common_pb2.ScalerSpec(policy=policy, fixed_actors=fixed, i_min=i_min, i_max=i_max), **extra),
        Context())


def bill_actors(redis_client, job, *, billed_ms, cloud_billed_ms, steps, usd, cloud_usd, invocations=4):
    """What Launch leaves in the ledger after `invocations` actors succeeded."""
    key = scaler_state_key(job)
    redis_client.hincrby(key, "billed_ms", billed_ms)
    redis_client.hincrby(key, "cloud_billed_ms", cloud_billed_ms)
    redis_client.hincrby(key, "steps_billed", steps)
    redis_client.hincrby(key, "invocations", invocations)
    redis_client.hincrbyfloat(key, "actor_cost_usd", usd)
    redis_client.hincrbyfloat(key, "cloud_actor_cost_usd", cloud_usd)


def test_first_plan_bills_the_learner_on_both_clocks_and_estimates_from_the_defaults(svc, redis_client):
    resp = plan(svc)
    st = stored(redis_client, "j")
    assert float(st["learner_cost_usd"]) == pytest.approx(cost.learner_cost(2.0, P))
    assert float(st["cloud_learner_cost_usd"]) == pytest.approx(cost.learner_cost(0.5, P))
    assert (float(st["wall_seconds"]), float(st["cloud_seconds"])) == (2.0, 0.5)
    assert (st["fleet_actors"], float(st["budget_usd"]), st["budget_clock"], st["rounds_planned"]) == ("4", 1.0, "cloud",
                                                                                                        "1")
    assert resp.actors == 4 and not resp.budget_exhausted and "within budget" in resp.reason
    # Round 0: 1 ms per env step and 10 s of learner time are assumed; the budget binds on the cloud bill.
    per_actor = cost.lambda_invocation_cost(1.0 * 100, DEFAULT_ACTOR_MEMORY_MB, P)
    assert resp.estimated_round_cost_usd == pytest.approx(4 * per_actor + cost.learner_cost(10.0, P), rel=1e-12)
    assert resp.budget_left_usd == pytest.approx(1.0 - cost.learner_cost(0.5, P), rel=1e-12)


@pytest.mark.parametrize("clock", ["cloud", "machine"])
def test_later_plans_estimate_from_what_the_job_measured_on_the_budgets_clock(svc, redis_client, clock):
    plan(svc, clock=clock)
    bill_actors(redis_client, "j", billed_ms=1200, cloud_billed_ms=800, steps=400, usd=0.001, cloud_usd=0.0004)
    resp = plan(svc, round=1, clock=clock, learner_s=3.0, cloud_s=0.7, memory=2048)
    cloud = clock == "cloud"
    ms_per_step = (800 if cloud else 1200) / 400
    per_round = 1.5 * max((1.2 if cloud else 5.0) / 1, 0.7 if cloud else 3.0)  # padded mean or last, the larger
    per_actor = cost.lambda_invocation_cost(ms_per_step * 100, 2048, P)
    assert resp.estimated_round_cost_usd == pytest.approx(4 * per_actor + cost.learner_cost(per_round, P), rel=1e-12)
    spent = (0.0004 + cost.learner_cost(0.5, P) + cost.learner_cost(0.7, P) if cloud
             else 0.001 + cost.learner_cost(2.0, P) + cost.learner_cost(3.0, P))
    assert resp.budget_left_usd == pytest.approx(1.0 - spent, rel=1e-12)


def test_a_retried_plan_gives_the_same_answer_and_bills_nothing_again(svc, redis_client):
    plan(svc)
    first = plan(svc, round=1, learner_s=3.0)
    before = stored(redis_client, "j")
    again = plan(svc, round=1, learner_s=3.0)
    assert again == first and stored(redis_client, "j") == before


def test_learner_functions_add_their_mean_cost_to_each_actor(svc, redis_client):
    plan(svc)
    key = scaler_state_key("j")
    redis_client.hincrby(key, "learner_fn_invocations", 2)
    redis_client.hincrbyfloat(key, "learner_fn_cost_usd", 0.0006)
    redis_client.hincrbyfloat(key, "cloud_learner_fn_cost_usd", 0.0002)
    resp = plan(svc, round=1, learner_s=3.0, cloud_s=0.7)
    per_actor = cost.lambda_invocation_cost(1.0 * 100, DEFAULT_ACTOR_MEMORY_MB, P) + 0.0002 / 2  # cloud clock: the cloud mean
    per_round = 1.5 * max(1.2, 0.7)
    assert resp.estimated_round_cost_usd == pytest.approx(4 * per_actor + cost.learner_cost(per_round, P), rel=1e-12)
    spent = 0.0002 + cost.learner_cost(0.5, P) + cost.learner_cost(0.7, P)
    assert resp.budget_left_usd == pytest.approx(1.0 - spent, rel=1e-12)


def test_the_budget_scales_a_round_down_then_ends_the_job(svc):
    per_actor = cost.lambda_invocation_cost(1.0 * 100, DEFAULT_ACTOR_MEMORY_MB, P)
    fixed = cost.learner_cost(10.0, P)
    spent = cost.learner_cost(0.5, P)
    # Enough for the learner and 2.5 actors: 2 of the 4 wanted, as long as I_min allows it.
    budget = spent + fixed + 2.5 * per_actor
    resp = plan(svc, job="tight", budget=budget, i_min=2)
    assert (resp.actors, resp.budget_exhausted) == (2, False) and "scaled down from 4 to 2" in resp.reason
    assert resp.estimated_round_cost_usd == pytest.approx(2 * per_actor + fixed, rel=1e-12)
    resp = plan(svc, job="broke", budget=budget, i_min=3)  # I_min 3 is not affordable: the job ends
    assert (resp.actors, resp.budget_exhausted) == (0, True) and resp.reason.endswith("budget exhausted")
    assert resp.estimated_round_cost_usd == pytest.approx(fixed, rel=1e-12)


def test_every_plan_keeps_the_final_evaluation_paid_for(svc):
    """The job's last evaluation is billed after the plan that ended the job: a round is planned only if the
    budget still pays for that evaluation after it (cost.evaluation_reserve), and the plan says what it kept."""
    per_actor = cost.lambda_invocation_cost(1.0 * 100, DEFAULT_ACTOR_MEMORY_MB, P)
    fixed = cost.learner_cost(10.0, P)
    # 5 functions, each a cold start (no worker measured one yet: the configured init) and 500 steps at 1 ms
    cold = P.lambda_init_ms * cost.lambda_cpu_slowdown(DEFAULT_ACTOR_MEMORY_MB, P)
    reserve = 5 * cost.lambda_invocation_cost(cold + 1.0 * 500, DEFAULT_ACTOR_MEMORY_MB, P)
    assert reserve > 4 * per_actor  # so without it the budget below buys all 4 actors
    budget = cost.learner_cost(0.5, P) + fixed + reserve + 2.5 * per_actor
    evaluation = dict(final_eval_episodes=5, eval_episode_steps=500)
    assert plan(svc, job="free", budget=budget).actors == 4  # without an evaluation to pay, all 4 fit
    resp = plan(svc, job="kept", budget=budget, **evaluation)
    assert resp.eval_reserve_usd == pytest.approx(reserve, rel=1e-12)
    assert (resp.actors, resp.budget_exhausted) == (2, False)
    assert f"keeping {reserve:.6f} USD for the final evaluation" in resp.reason
    assert resp.estimated_round_cost_usd == pytest.approx(2 * per_actor + fixed, rel=1e-12)
    resp = plan(svc, job="ends", budget=budget - 2 * per_actor, **evaluation)  # not even one actor is left over
    assert (resp.actors, resp.budget_exhausted) == (0, True)
    with pytest.raises(Aborted, match="final_eval_episodes"):
        plan(svc, job="bad", final_eval_episodes=-1)
    with pytest.raises(Aborted, match="eval_episode_steps"):
        plan(svc, job="bad", final_eval_episodes=1, eval_episode_steps=-5)


def test_serverful_fleet_is_sized_for_the_policys_peak(svc, redis_client):
    """fixed:N runs N actors whatever I_max says; every other policy stays within I_max."""
    assert cost.serverful_vm_count(40, P) > cost.serverful_vm_count(8, P)  # so the two sizes bill differently
    plan(svc, job="f", policy="fixed", fixed=40, i_max=8)
    plan(svc, job="n", policy="nitro", i_max=8)
    assert (stored(redis_client, "f")["fleet_actors"], stored(redis_client, "n")["fleet_actors"]) == ("40", "8")

    def serverful(job):
        return svc.GetCost(scaler_pb2.GetCostRequest(job_id=job), Context()).cloud_serverful_cost_usd

    assert serverful("f") == pytest.approx(cost.serverful_job_cost(0.5, 40, P))
    assert serverful("n") == pytest.approx(cost.serverful_job_cost(0.5, 8, P))
    # A record written before fleet_actors existed: its i_max sizes the fleet.
    redis_client.hdel(scaler_state_key("n"), "fleet_actors")
    redis_client.hset(scaler_state_key("n"), "i_max", 40)
    assert serverful("n") == pytest.approx(cost.serverful_job_cost(0.5, 40, P))


def test_get_cost_reports_both_bills_and_the_serverful_comparator(svc, redis_client):
    plan(svc, clock="machine")
    bill_actors(redis_client, "j", billed_ms=1200, cloud_billed_ms=800, steps=400, usd=0.001, cloud_usd=0.0004)
    c = svc.GetCost(scaler_pb2.GetCostRequest(job_id="j"), Context())
    assert c.actor_cost_usd == pytest.approx(0.001) and c.cloud_actor_cost_usd == pytest.approx(0.0004)
    assert c.learner_cost_usd == pytest.approx(cost.learner_cost(2.0, P))
    assert c.cloud_learner_cost_usd == pytest.approx(cost.learner_cost(0.5, P))
    assert c.total_cost_usd == pytest.approx(0.001 + cost.learner_cost(2.0, P))
    assert c.cloud_total_cost_usd == pytest.approx(0.0004 + cost.learner_cost(0.5, P))
    assert c.serverful_cost_usd == pytest.approx(cost.serverful_job_cost(2.0, 4, P))  # fixed:4's fleet
    assert c.cloud_serverful_cost_usd == pytest.approx(cost.serverful_job_cost(0.5, 4, P))
    assert (c.invocations, c.billed_ms, c.cloud_billed_ms, c.cloud_seconds) == (4, 1200, 800, 0.5)
    assert (c.budget_usd, c.budget_clock) == (1.0, "machine")
    assert c.budget_left_usd == pytest.approx(1.0 - c.total_cost_usd, rel=1e-12)
    with pytest.raises(Aborted) as err:
        svc.GetCost(scaler_pb2.GetCostRequest(job_id="nobody"), Context())
    assert err.value.args[0] == grpc.StatusCode.NOT_FOUND


def test_plan_and_get_cost_read_the_same_state_however_many_rounds_the_job_planned(svc, redis_client):
    """The hash keeps every round's plan; a round's bookkeeping must not read them all (it grew with the job)."""
    plan(svc, round=0, budget=100.0)

    def reply_bytes(call) -> int:  # what Redis sent back while `call` ran (plus one INFO reply, ~1 KB)
        before = redis_client.info("stats")["total_net_output_bytes"]
        call()
        return redis_client.info("stats")["total_net_output_bytes"] - before

    def bookkeeping(k):
        return (reply_bytes(lambda: plan(svc, round=k, budget=100.0)),
                reply_bytes(lambda: svc.GetCost(scaler_pb2.GetCostRequest(job_id="j"), Context())))

    short = bookkeeping(1)
    # 3,000 stored plans as a long job leaves them (~700 KB of hash)
    redis_client.hset(scaler_state_key("j"), mapping={f"plan:{k}": '{"actors": 4, "reason": "%s"}' % ("x" * 200)
                                                      for k in range(2, 3002)})
    long = bookkeeping(3002)
    assert long[0] < short[0] + 512 and long[1] < short[1] + 512, (short, long)
    planned = stored(redis_client, "j")["rounds_planned"]
    plan(svc, round=3002, budget=100.0)  # a retried plan still finds its own: nothing planned or billed again
    assert stored(redis_client, "j")["rounds_planned"] == planned == "3"


def test_a_policy_with_state_gets_it_back_from_the_hash(svc):
    """KungFu never scales down: the actors it chose are in the policy state Plan stores and reads back."""
    first = plan(svc, round=0, policy="kungfu", i_min=2, i_max=16, gradient_noise_scale=10.0)
    assert first.actors == 2  # anchored on the first noise scale
    assert plan(svc, round=1, policy="kungfu", i_min=2, i_max=16, gradient_noise_scale=40.0).actors == 8
    assert plan(svc, round=2, policy="kungfu", i_min=2, i_max=16, gradient_noise_scale=10.0).actors == 8


def test_noise_plans_from_the_ledgers_per_round_and_per_sample_costs(svc, redis_client):
    """The scaler prices the last round from the job's ledger (an actor's measured cost per step, the learner's
    round less its update per round, the update per sample) and noise plans kappa sqrt(B a / c) from it."""
    kw = dict(policy="noise", i_min=1, i_max=64, steps=100)
    assert plan(svc, round=0, **kw).actors == 1  # nothing measured yet
    bill_actors(redis_client, "j", billed_ms=400, cloud_billed_ms=300, steps=400, usd=1e-6, cloud_usd=1e-6)
    sc = common_pb2.ScalerSpec(policy="noise", kappa=4.0, i_min=1, i_max=64)
    req = scaler_pb2.PlanRequest(job_id="j", round=1, budget_usd=1.0, learner_seconds=2.0, cloud_learner_seconds=0.5,
                                 steps_per_actor=100, scaler=sc, policy_grad_sq=0.002, policy_trace_sigma=10.0,
                                 env_steps=400,
                                 update_seconds=0.2, round_seconds=0.5)
    resp = svc.Plan(req, Context())
    per_actor = cost.lambda_invocation_cost(300 / 400 * 100, DEFAULT_ACTOR_MEMORY_MB, P)
    a = cost.learner_cost(0.5 - 0.2, P)
    c = per_actor / 100 + cost.learner_cost(0.2, P) / 400
    wanted = 4.0 * (5000.0 * a / c) ** 0.5 / 100
    assert resp.actors == 2 ** round(math.log2(wanted)) and resp.actors > 1
    assert f"a=${a:.3g}" in resp.reason and f"c=${c:.3g}/sample" in resp.reason


@pytest.mark.parametrize("field", ["update_seconds", "round_seconds", "actor_seconds"])
def test_a_negative_or_nan_round_time_is_invalid_naming_it(svc, field):
    for bad in (-1.0, float("nan")):
        with pytest.raises(Aborted) as err:
            plan(svc, **{field: bad})
        code, details = err.value.args
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(f"{field}: must be in [0, 1e7)")


class Recorder:
    """An invoker whose every invocation succeeds in 100 ms; fresh workers report `init_ms` of init CPU."""

    def __init__(self, init_ms: float = 0.0):
        self.init_ms = init_ms

    def invoke_all(self, function_name, invocations, deadline_s, on_done=None):
        from scaler_svc.invoker import InvocationOutcome

        outs = [InvocationOutcome(i.invocation_id, ok=True, duration_ms=100.0, billed_ms=100, attempts=1,
                                  billed_attempts_ms=100, requests=1, modelled_ms=100.0, modelled_attempts_ms=100.0,
                                  modelled_cpu_attempts_ms=90.0, measured_init_ms=self.init_ms) for i in invocations]
        for o in outs:
            on_done(o)
        return outs, 0.001


def launch(svc, actors: int, wave: int):
    return svc.Launch(scaler_pb2.LaunchRequest(job_id="j", round=0, wave=wave, policy_version=0, actors=actors,
                                               steps_per_actor=100, env_id="CartPole-v1", function_name="fn",
                                               deadline_s=10.0), Context())


def test_launch_reads_the_jobs_warm_sandboxes_and_measured_init_from_the_hash(redis_client):
    """What one scaler replica learned (sandboxes left warm, a fresh worker's init CPU), another reads back."""
    first = launch(ScalerServicer(redis_client, Recorder(init_ms=750.0), P, "redis://x", hmac_key=b"k" * 32), 3, wave=0)
    assert [r.modelled_cold for r in first.invocations] == [True] * 3
    replica = ScalerServicer(redis_client, Recorder(), P, "redis://x", hmac_key=b"k" * 32)  # remembers nothing in memory
    second = launch(replica, 5, wave=1)
    assert sorted(r.modelled_cold for r in second.invocations) == [False] * 3 + [True] * 2
    charge = lambda cold: cost.invocation_charge("actor", requests=1, billed_ms=100, modelled_ms=100.0,  # noqa: E731
                                                 cpu_ms=90.0, init_ms=750.0, cold=cold, steps=100,
                                                 memory_mb=DEFAULT_ACTOR_MEMORY_MB, prices=P)
    assert second.cloud_cost_usd == pytest.approx(3 * charge(False).cloud_usd + 2 * charge(True).cloud_usd)
    assert P.lambda_init_ms != 750.0  # so the default init would have given another bill


@pytest.mark.parametrize("memory", [-1, -1024, 1, 127, 10241, 2**31 - 1])
@pytest.mark.parametrize("rpc", ["Plan", "Launch"])
def test_an_actor_memory_outside_lambdas_limits_is_invalid(svc, rpc, memory):
    with pytest.raises(Aborted) as err:
        if rpc == "Plan":
            plan(svc, memory=memory)
        else:
            svc.Launch(scaler_pb2.LaunchRequest(job_id="j", actors=1, steps_per_actor=1, env_id="CartPole-v1",
                                                function_name="f", deadline_s=5.0, actor_memory_mb=memory),
                       Context())
    code, details = err.value.args
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("actor_memory_mb: ") and "[128, 10240]" in details and str(memory) in details
