"""A Stellaris learner function's Launch in fields of its own meaning (LaunchRequest.learner), and the borrowed
actor fields a learner of the previous version sends still read the same for one version."""

from __future__ import annotations

import grpc
import pytest

from learner_svc.parameter_service import learner_fn_launch_request
from nitro import cost
from nitro.spec import StellarisSettings, TrainingSpec
from nitro.v1 import scaler_pb2
from scaler_svc.server import ScalerServicer, launch_shape
from tests.recording_invoker import RecordingInvoker

JOB = "ll-job"
REF = f"nitro:{JOB}:learn:parcel:{JOB}-r2-g5"


class _Context:
    def time_remaining(self):
        return None

    def abort(self, code, details):
        raise grpc.RpcError(f"{code.name}: {details}")


def test_the_learner_sends_its_own_fields_and_borrows_none():
    spec = TrainingSpec(env_id="CartPole-v1", learner_mode="stellaris",
                        stellaris=StellarisSettings(learner_function="my-learner", learner_memory_mb=3008))
    req = learner_fn_launch_request(spec, JOB, 2, 5, 7, REF)
    assert (req.kind, list(req.slots), req.function_name) == ("learner", [5], "my-learner")
    assert (req.learner.payload_ref, req.learner.memory_mb) == (REF, 3008)
    assert (req.actors, req.steps_per_actor, req.actor_memory_mb, req.payload_ref, req.env_id) == (0, 0, 0, "", "")
    shape = launch_shape(req)
    assert (shape.count, shape.steps, shape.memory_mb, shape.payload_ref) == (1, None, 3008, REF)


def bill(redis_client, job: str, request) -> tuple[list, dict]:
    rec = RecordingInvoker()
    svc = ScalerServicer(redis_client, rec, cost.Prices(), "redis://127.0.0.1:1/0", hmac_key=b"m" * 32)
    resp = svc.Launch(request, _Context())
    assert resp.succeeded == 1
    state = {k.decode(): v.decode() for k, v in redis_client.hgetall(f"nitro:{job}:scaler").items()}
    return rec.calls, state


def test_the_new_and_the_old_form_launch_and_bill_the_same(redis_client):
    spec = TrainingSpec(env_id="CartPole-v1", learner_mode="stellaris",
                        stellaris=StellarisSettings(learner_memory_mb=3008))
    new = learner_fn_launch_request(spec, JOB, 2, 5, 7, REF)
    old_job = "ll-old"
    old_ref = REF.replace(JOB, old_job)
    old = scaler_pb2.LaunchRequest(  # what a learner of the previous version sends
        job_id=old_job, round=2, policy_version=7, actors=1, steps_per_actor=128, env_id="CartPole-v1", seed=0,
        function_name="nitro-learner", deadline_s=spec.round_deadline_s, actor_memory_mb=3008, wait=True, slots=[5],
        kind="learner", payload_ref=old_ref)
    (new_calls, new_state), (old_calls, old_state) = bill(redis_client, JOB, new), bill(redis_client, old_job, old)
    assert new_calls[0][1][0]["payload_ref"] == REF and old_calls[0][1][0]["payload_ref"] == old_ref
    assert new_calls[0][1][0]["invocation_id"] == f"{JOB}-r2-g5"
    for field in ("learner_fn_cost_usd", "learner_fn_invocations", "cloud_learner_fn_cost_usd"):
        assert new_state[field] == old_state[field], field
    assert float(new_state["learner_fn_cost_usd"]) == pytest.approx(cost.lambda_cost(400, 1, 3008, cost.Prices()))
    assert "steps_billed" not in new_state and "steps_billed" not in old_state  # a learner function has no steps


@pytest.mark.parametrize("learner,field", [
    ({"payload_ref": "nitro:other:learn:parcel:x"}, "learner.payload_ref"),
    ({"payload_ref": REF, "memory_mb": 64}, "learner.memory_mb"),
])
def test_a_bad_learner_field_is_named(redis_client, learner, field):
    svc = ScalerServicer(redis_client, RecordingInvoker(), cost.Prices(), "redis://127.0.0.1:1/0", hmac_key=b"m" * 32)
    req = scaler_pb2.LaunchRequest(job_id=JOB, round=2, kind="learner", learner=scaler_pb2.LearnerLaunch(**learner),
                                   slots=[5], function_name="nitro-learner", deadline_s=10.0)
    with pytest.raises(grpc.RpcError, match=f"INVALID_ARGUMENT: {field}:"):
        svc.Launch(req, _Context())
