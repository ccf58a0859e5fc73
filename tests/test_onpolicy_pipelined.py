"""The on-policy loop is PipelinedLoop at depth 0 (learner_svc/onpolicy.py): round k+1 is launched once round k's
update and plan are made, before round k's commit, so the commit and the evaluation overlap round k+1's sampling;
and a checkpoint whose pending round an earlier learner wrote (the plain dict of its update, no score or plan)
still resumes.

In one process, all real: a redis-server with nitro's ACL users, the scaler's servicer (Plan, Launch, GetCost,
EndJob) and the actor handler run by a stand-in invoker with the event the scaler built (tests/test_job_isolation.py).
"""

from __future__ import annotations

import time

import pytest

from learner_svc.clients import LearnerDeps
from learner_svc.jobs import Job
from learner_svc.offpolicy import OffPolicyLoop
from learner_svc.onpolicy import OnPolicyLoop
from nitro.spec import ScalerSettings, TrainingSpec, validate
from nitro.v1 import training_pb2
from tests.test_job_isolation import MASTER, STEPS, _Context, scaler, server, service  # noqa: F401 - fixtures


class Scaler:
    """The learner's ActorScalerStub, every method calling the servicer in this process."""

    def __init__(self, servicer):
        self.servicer = servicer

    def __getattr__(self, method):
        return lambda request, timeout=None, metadata=None: getattr(self.servicer, method)(request, _Context())


def loop_of(service, tmp_path, svc, job_id: str, rounds: int, algo: str = "ppo"):  # noqa: F811 - the fixture's value
    spec = validate(TrainingSpec(env_id="CartPole-v1", algo=algo, preset="fast", job_id=job_id, steps_per_actor=STEPS,
                                 rounds=rounds, eval_episodes=0, evaluation="learner",
                                 scaler=ScalerSettings(policy="fixed", fixed_actors=2, i_min=1, i_max=2)))
    loop = OnPolicyLoop if algo == "ppo" else OffPolicyLoop
    return loop(Job(spec), LearnerDeps(redis=service, hmac_key=MASTER, detector=None, scaler=Scaler(svc),
                                       data_dir=str(tmp_path)))


def test_round_k_is_committed_after_round_k_plus_1_was_launched(service, scaler, tmp_path):  # noqa: F811
    svc, _actors = scaler
    loop = loop_of(service, tmp_path, svc, "depth0", rounds=3)
    events: list[tuple[str, int]] = []
    launch, write = loop.collector.launch, loop._write_checkpoint

    def launched(rnd, slots, deadline_s):
        events.append(("launch", rnd.k))
        return launch(rnd, slots, deadline_s)

    def checkpoint(round_index, *args):
        events.append(("checkpoint", round_index))
        return write(round_index, *args)

    loop.collector.launch, loop._write_checkpoint = launched, checkpoint
    loop.run()
    assert loop.job.state == training_pb2.JOB_STATE_SUCCEEDED, loop.job.message
    assert [r.round for r in loop.job.reports] == [0, 1, 2]
    # Round k's checkpoint follows round k+1's launch; the last round launches nothing after it.
    assert events == [("launch", 0), ("launch", 1), ("checkpoint", 0), ("launch", 2), ("checkpoint", 1),
                      ("checkpoint", 2)]


def test_a_checkpoint_with_an_old_format_pending_round_resumes(service, scaler, tmp_path):  # noqa: F811
    """A learner before this one checkpointed round 1 with its update's plain dict and died before the report:
    the resumed learner plans round 2 from it, reports round 1 with that update's fields, and goes on."""
    svc, _actors = scaler
    old = loop_of(service, tmp_path, svc, "old-pending", rounds=3)
    old.write_report(training_pb2.RoundReport(job_id="old-pending", round=0, env_steps=2 * STEPS,
                                              total_env_steps=2 * STEPS))
    old.version, old.total_steps = 2, 4 * STEPS
    pending = {  # what OnPolicyLoop._learn returned before on-policy closed through PipelinedLoop
        "round": 1, "policy_version": 1, "actors_launched": 2, "actors_completed": 2, "actors_failed": 0,
        "actors_replaced": 0, "env_steps": 2 * STEPS, "total_env_steps": 4 * STEPS, "invocation_retries": 0,
        "duplicates_dropped": 0, "rejected_batches": 0, "stale_batches_dropped": 0, "cloud_actor_cost_usd": 0.001,
        "policy_loss": -0.25, "value_loss": 3.5, "entropy": 0.69, "kl": 0.01, "gradient_noise_scale": 12.0,
        "notes": ["written by an earlier learner"], "policy_noise_scale": 0.0, "learning_rate": 3e-4,
        "policy_grad_sq": 0.0, "policy_trace_sigma": 0.0, "minibatch_size": 64, "clip_fraction": 0.1,
        "grad_norm": 0.5, "explained_variance": 0.2, "kl_coeff": 0.2,
        "phases": {"sample": 1.0, "update": 0.5}, "cloud_phases": {"sample": 0.8, "update": 0.4},
        "t_round": time.time() - 5.0,
    }
    old.commit(1, pending, [])
    assert "plan" not in old.files.read_checkpoint("cpu")["pending"]

    resumed = loop_of(service, tmp_path, svc, "old-pending", rounds=3)
    resumed.run(resume=True)
    assert resumed.job.state == training_pb2.JOB_STATE_SUCCEEDED, resumed.job.message
    reports = resumed.job.reports
    assert [r.round for r in reports] == [0, 1, 2]
    one = reports[1]
    assert (one.policy_loss, one.value_loss, one.gradient_noise_scale, one.env_steps) == (-0.25, 3.5, 12.0, 2 * STEPS)
    assert one.resumed and "written by an earlier learner" in one.notes
    assert one.next_actors == 2 and {p.phase: p.seconds for p in one.cloud_phases}["update"] == 0.4
    assert reports[2].total_env_steps == 4 * STEPS + reports[2].env_steps > 4 * STEPS


@pytest.mark.parametrize("algo", ["ppo", "impact"])
def test_a_stop_during_a_close_launches_no_next_round(service, scaler, tmp_path, algo):  # noqa: F811
    """A stop (or drain) requested while round 0 closes: round 0 is finished and reported, and round 1, which the
    job would abandon, is never launched (nor billed). Every loop closes the same way."""
    svc, _actors = scaler
    loop = loop_of(service, tmp_path, svc, f"stopped-{algo}", rounds=3, algo=algo)
    launched, plan = [], loop.plan
    launch = loop.collector.launch

    def launching(rnd, slots, deadline_s):
        launched.append(rnd.k)
        return launch(rnd, slots, deadline_s)

    def planned(round_index, *args, **kw):
        if round_index == 1:
            loop.job.request_stop("stopped by the test")
        return plan(round_index, *args, **kw)

    loop.collector.launch, loop.plan = launching, planned
    loop.run()
    assert loop.job.state == training_pb2.JOB_STATE_STOPPED, loop.job.message
    assert [r.round for r in loop.job.reports] == [0] and launched == [0]
