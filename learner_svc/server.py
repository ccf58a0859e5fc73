"""TrainingService: validates specs, runs jobs, streams round reports."""

from __future__ import annotations

import argparse
import logging
import os

import grpc

from learner_svc.jobs import Job, JobManager
from learner_svc.onpolicy import LearnerDeps, OnPolicyLoop
from nitro import codec
from nitro.errors import ConfigError
from nitro.grpc_util import Service, configure_logging, make_channel
from nitro.metrics import serve_metrics
from nitro.redis_server import connect
from nitro.spec import InvalidSpec, from_proto, validate
from nitro.v1 import detector_pb2_grpc, scaler_pb2_grpc, training_pb2, training_pb2_grpc

log = logging.getLogger("learner_svc")


def redis_unavailable(context, redis_url: str, exc: Exception):
    safe = redis_url.split("@")[-1]
    context.abort(grpc.StatusCode.UNAVAILABLE, f"Redis at {safe} is unreachable: {exc}")


class TrainingServicer(training_pb2_grpc.TrainingServiceServicer):
    def __init__(self, deps: LearnerDeps, redis_url: str):
        self.deps = deps
        self.redis_url = redis_url
        self.jobs = JobManager(self._run)

    def _run(self, job: Job) -> None:
        OnPolicyLoop(job, self.deps).run()

    def _job(self, job_id: str, context) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no training job with id {job_id!r}")
        return job

    def StartTraining(self, request, context):
        if self.jobs.draining:
            context.abort(grpc.StatusCode.UNAVAILABLE, "learner is shutting down; retry on another replica")
        try:
            spec = validate(from_proto(request.spec))
        except InvalidSpec as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except ConfigError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            self.deps.redis.ping()
        except Exception as exc:  # redis raises several connection error types
            redis_unavailable(context, self.redis_url, exc)
        try:
            job = self.jobs.start(spec)
        except FileExistsError:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, f"job {spec.job_id!r} is already running")
        return job.status()

    def WatchTraining(self, request, context):
        job = self._job(request.job_id, context)
        yield from job.follow(max(0, request.from_round), context.is_active)

    def GetTraining(self, request, context):
        return self._job(request.job_id, context).status()

    def StopTraining(self, request, context):
        job = self._job(request.job_id, context)
        if not job.done:
            job.request_stop("requested by client")
        return job.status()

    def ListTrainings(self, request, context):
        return training_pb2.ListTrainingsResponse(jobs=[j.status() for j in self.jobs.list()])


def build(args) -> tuple[Service, TrainingServicer]:
    key = codec.load_hmac_key()
    client = connect(args.redis_url, socket_timeout=30.0)
    deps = LearnerDeps(redis=client, hmac_key=key,
                       detector=detector_pb2_grpc.BoostingDetectorStub(make_channel(args.detector)),
                       scaler=scaler_pb2_grpc.ActorScalerStub(make_channel(args.scaler)), data_dir=args.data_dir)
    servicer = TrainingServicer(deps, args.redis_url)
    service = Service("learner", args.host, args.port)
    service.add("nitro.v1.TrainingService",
                lambda s: training_pb2_grpc.add_TrainingServiceServicer_to_server(servicer, s))
    service.on_drain(servicer.jobs.drain)
    return service, servicer


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="learner_svc", description="nitro TrainingService (the learner)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50051)
    p.add_argument("--metrics-port", type=int, default=9101)
    p.add_argument("--redis-url", default=os.environ.get("NITRO_REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--detector", default=os.environ.get("NITRO_DETECTOR", "127.0.0.1:50052"))
    p.add_argument("--scaler", default=os.environ.get("NITRO_SCALER", "127.0.0.1:50053"))
    p.add_argument("--data-dir", default=os.environ.get("NITRO_DATA_DIR", ".nitro/learner"))
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    configure_logging(args.log_level)
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    service, _ = build(args)
    serve_metrics(args.metrics_port, args.host)
    service.install_signal_handlers()
    service.start()
    service.wait()
