"""TrainingService: validates specs, runs jobs, streams round reports."""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading

import grpc

from learner_svc.clients import LearnerDeps, end_job
from learner_svc.durability import JobFiles, job_dir, load_reports
from learner_svc.jobs import Job, JobManager
from learner_svc.offpolicy import OffPolicyLoop
from learner_svc.onpolicy import OnPolicyLoop
from learner_svc.parameter_service import StellarisLoop
from nitro.cmdline import REDIS_PASSWORD_INSTEAD, URLWithoutPassword
from nitro.data import codec
from nitro.data.redis_client import connect, url_from_env, warn_if_not_persistent, with_credentials
from nitro.devices import resolve_device
from nitro.errors import ConfigError
from nitro.rpc import auth
from nitro.rpc.grpc_util import Service, configure_logging, make_channel
from nitro.rpc.metrics import serve_metrics
from nitro.spec import ASYNCHRONOUS_ALGOS, ScalerSettings, TrainingSpec, from_proto, refusal, validate
from nitro.v1 import detector_pb2_grpc, scaler_pb2_grpc, training_pb2, training_pb2_grpc

log = logging.getLogger("learner_svc")

RELEASE_PATIENCE_S = 60.0  # how long the learner's start keeps asking the scaler to end a job's Redis user


def redis_unavailable(context, redis_url: str, exc: Exception):
    safe = redis_url.split("@")[-1]
    context.abort(grpc.StatusCode.UNAVAILABLE, f"Redis at {safe} is unreachable: {exc}")


class TrainingServicer(training_pb2_grpc.TrainingServiceServicer):
    def __init__(self, deps: LearnerDeps, redis_url: str):
        self.deps = deps
        self.redis_url = redis_url
        self.jobs = JobManager(self._run)
        self.unreleased: list[str] = []  # ended jobs whose Redis user the scaler has not confirmed deleted

    def _run(self, job: Job, resume: bool = False) -> None:
        loop = (StellarisLoop if job.spec.learner_mode == "stellaris"
                else OffPolicyLoop if job.spec.algo in ASYNCHRONOUS_ALGOS else OnPolicyLoop)
        loop(job, self.deps).run(resume=resume)

    def _job(self, job_id: str, context) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no training job with id {job_id!r}")
        return job

    # -- jobs on disk -------------------------------------------------------------------
    def _saved(self, job_id: str) -> dict | None:
        path = os.path.join(job_dir(self.deps.data_dir, job_id), "job.json")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)

    def load_saved_jobs(self, resume: bool = True) -> list[str]:
        """After a restart: list ended jobs again and resume the interrupted ones (killed or drained).

        A job that FAILED resumable (a dependency stayed down) waits for `nitro train --resume`: its
        cause may still be there."""
        root = os.path.join(self.deps.data_dir, "jobs")
        resumed = []
        for job_id in sorted(os.listdir(root)) if os.path.isdir(root) else []:
            saved = self._saved(job_id)
            if saved is None or self.jobs.get(job_id) is not None:
                continue
            spec = _spec_from_dict(saved["spec"])
            interrupted = saved["state"] == "RUNNING" or (saved["state"] == "STOPPED" and saved.get("resumable"))
            if resume and interrupted:
                log.info("resuming job %s from its checkpoint", job_id)
                self.jobs.start(spec, resume=True)
                resumed.append(job_id)
            else:
                if not saved.get("actor_user_released"):  # its end never reached the scaler, or it was cut short
                    self.unreleased.append(job_id)
                job = Job(spec)
                files = JobFiles(job_dir(self.deps.data_dir, job_id))
                job.reports = load_reports(files.dir)
                if os.path.isfile(files.checkpoint):  # the status names it, as while the job ran
                    job.checkpoint_path = files.checkpoint
                if interrupted:  # not resumed automatically: say so, and how
                    job.state, job.interrupted = training_pb2.JOB_STATE_STOPPED, True
                    job.message = f"interrupted (learner restarted); resume with `nitro train --resume {job_id}`"
                else:
                    job.state = training_pb2.JobState.Value(f"JOB_STATE_{saved['state']}")
                    job.message = saved.get("message", "")
                if job.reports:
                    job.total_cost_usd = job.reports[-1].total_cost_usd
                    job.total_env_steps = job.reports[-1].total_env_steps
                self.jobs.add_finished(job)
        return resumed

    def release_actor_users(self) -> list[str]:
        """Ask the scaler to delete the Redis users of the jobs `load_saved_jobs` found ended or left interrupted
        without the scaler's confirmation (EndJob; their job.json records it); the jobs it confirmed. A job resumed
        meanwhile is skipped: its launches use its user."""
        released = []
        for job_id in list(self.unreleased):
            current = self.jobs.get(job_id)
            if current is None or current.done:
                if end_job(self.deps, job_id, patience=RELEASE_PATIENCE_S):
                    JobFiles(job_dir(self.deps.data_dir, job_id)).mark_actor_user_released()
                    released.append(job_id)
            self.unreleased.remove(job_id)
        return released

    def _resume(self, job_id: str, context) -> Job:
        """Continue an interrupted or resumable job from its checkpoint (round 0 when it has none); a job
        that is running already (a restarted learner resumed it) is returned as it is, to attach to."""
        if not job_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "spec.job_id: is required to resume a job")
        current = self.jobs.get(job_id)
        if current is not None and not current.done:
            return current
        saved = self._saved(job_id)
        if saved is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {job_id!r} in this learner's data dir")
        if saved["state"] in ("SUCCEEDED", "FAILED") and not saved.get("resumable"):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"job {job_id!r} already ended ({saved['state']}: {saved.get('message', '')}); "
                          f"it cannot be resumed: `nitro watch {job_id}` shows its rounds")
        try:
            return self.jobs.start(_spec_from_dict(saved["spec"]), resume=True)
        except FileExistsError:  # another resume won the race: attach to that one
            return self.jobs.get(job_id)

    def StartTraining(self, request, context):
        if self.jobs.draining:
            context.abort(grpc.StatusCode.UNAVAILABLE, "learner is shutting down; retry on another replica")
        try:
            self.deps.redis.ping()
        except Exception as exc:  # redis raises several connection error types
            redis_unavailable(context, self.redis_url, exc)
        if request.resume:
            return self._resume(request.spec.job_id, context).status()
        try:
            spec = validate(from_proto(request.spec))
        except ConfigError as exc:
            status, detail = refusal(exc)
            context.abort(grpc.StatusCode[status], detail)
        if self._saved(spec.job_id) is not None:
            context.abort(grpc.StatusCode.ALREADY_EXISTS,
                          f"job {spec.job_id!r} exists; resume it or choose another job_id")
        try:
            job = self.jobs.start(spec)
        except FileExistsError:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, f"job {spec.job_id!r} is already running")
        return job.status()

    def WatchTraining(self, request, context):
        job = self._job(request.job_id, context)
        context.send_initial_metadata(())  # tells a client at once that it is attached (NitroClient.watch)
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


def _spec_from_dict(d: dict) -> TrainingSpec:
    d = dict(d)
    d["scaler"] = ScalerSettings(**d["scaler"])
    return TrainingSpec(**d)


def build(args) -> tuple[Service, TrainingServicer]:
    device = resolve_device(args.device)  # before anything connects: a wrong device is a startup error
    security = auth.server_security(args, "learner")
    key = codec.load_hmac_key()
    client = connect(args.redis_url, socket_timeout=30.0)
    # The learner calls the detector and scaler with its own token, over TLS when --tls-ca is given.
    creds = auth.channel_credentials(getattr(args, "tls_ca", None))
    deps = LearnerDeps(redis=client, hmac_key=key,
                       detector=detector_pb2_grpc.BoostingDetectorStub(
                           make_channel(args.detector, creds, token=security.token)),
                       scaler=scaler_pb2_grpc.ActorScalerStub(make_channel(args.scaler, creds, token=security.token)),
                       data_dir=args.data_dir, device=device)
    servicer = TrainingServicer(deps, args.redis_url)
    service = Service("learner", args.host, args.port, interceptors=security.interceptors,
                      server_credentials=security.credentials)
    service.add("nitro.v1.TrainingService",
                lambda s: training_pb2_grpc.add_TrainingServiceServicer_to_server(servicer, s))
    service.on_drain(servicer.jobs.drain)
    return service, servicer


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="learner_svc", description="nitro TrainingService (the learner)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50051)
    p.add_argument("--metrics-host", default="127.0.0.1", help="metrics are unauthenticated: loopback by default")
    p.add_argument("--metrics-port", type=int, default=9101)
    p.add_argument("--redis-url", default=url_from_env(), action=URLWithoutPassword, instead=REDIS_PASSWORD_INSTEAD)
    p.add_argument("--detector", default=os.environ.get("NITRO_DETECTOR", "127.0.0.1:50052"))
    p.add_argument("--scaler", default=os.environ.get("NITRO_SCALER", "127.0.0.1:50053"))
    p.add_argument("--data-dir", default=os.environ.get("NITRO_DATA_DIR", ".nitro/learner"))
    p.add_argument("--torch-threads", type=int, default=int(os.environ.get("NITRO_TORCH_THREADS", "1")),
                   help="intra-op threads for updates (default 1; raise on a dedicated learner machine)")
    p.add_argument("--device", default=os.environ.get("NITRO_DEVICE", "cpu"),
                   help="torch device for updates: cpu, cuda, cuda:N, or auto (a GPU if torch sees one) "
                        "(default: %(default)s; Stellaris mode always applies updates on the CPU)")
    p.add_argument("--resume-jobs", action=argparse.BooleanOptionalAction,
                   default=os.environ.get("NITRO_RESUME_JOBS", "1") != "0",
                   help="on start, resume jobs a previous learner left running (default: yes)")
    p.add_argument("--log-level", default="INFO")
    auth.add_server_args(p, client=True)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    configure_logging(args.log_level)
    import torch

    from nitro.algos.sgd import preload

    # One thread by default: with more, torch's spinning worker threads collapse when the
    # detector, evaluation or co-located actors share the cores. Raise it on a dedicated learner.
    torch.set_num_threads(max(1, args.torch_threads))
    # The first optimizer's lazy imports (sgd.preload, ~0.8 s) before the service answers, so no job waits for
    # them. Not on a thread beside build(): two threads importing at once can meet in Python's import locks.
    preload()
    try:
        args.redis_url = with_credentials(args.redis_url)  # NITRO_REDIS_PASSWORD(_FILE) when the URL has none
        service, servicer = build(args)
        logging.getLogger("nitro.learner").info("learner: updates on %s", servicer.deps.device)
    except ConfigError as exc:
        raise SystemExit(f"learner_svc: {exc}") from None
    warn_if_not_persistent(servicer.deps.redis, args.redis_url, "learner")
    serve_metrics(args.metrics_port, args.metrics_host)
    service.install_signal_handlers()
    service.start()
    resumed = servicer.load_saved_jobs(resume=args.resume_jobs)
    if resumed:
        log.info("resumed %d interrupted job(s): %s", len(resumed), ", ".join(resumed))
    if servicer.unreleased:  # in the background: the scaler may still be starting
        threading.Thread(target=servicer.release_actor_users, name="release-actor-users", daemon=True).start()
    service.wait()
