"""Job bookkeeping: state, round reports, watchers, stop requests, one thread per job."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from learner_svc.constants import DRAIN_STOP_REASON
from nitro.rpc import metrics
from nitro.spec import TrainingSpec
from nitro.v1 import training_pb2

log = logging.getLogger(__name__)

TERMINAL = {training_pb2.JOB_STATE_SUCCEEDED, training_pb2.JOB_STATE_FAILED, training_pb2.JOB_STATE_STOPPED}


class Job:
    def __init__(self, spec: TrainingSpec):
        self.spec = spec
        self.job_id = spec.job_id
        self.state = training_pb2.JOB_STATE_PENDING
        self.message = ""
        self.reports: list[training_pb2.RoundReport] = []
        self.checkpoint_path = ""
        self.interrupted = False  # STOPPED by the learner's shutdown, not by a request: TrainingStatus.interrupted
        self.total_cost_usd = 0.0
        self.total_env_steps = 0
        self.created = time.time()
        self.finished = 0.0
        self.stop_requested = threading.Event()
        self.stop_reason = ""
        self._cond = threading.Condition()
        self.thread: threading.Thread | None = None

    # -- updates from the training loop --------------------------------------------
    def set_state(self, state: int, message: str = "") -> None:
        with self._cond:
            self.state = state
            if message:
                self.message = message
            if state in TERMINAL:
                self.finished = time.time()
            self._cond.notify_all()
        metrics.job_state(self.job_id, training_pb2.JobState.Name(state).removeprefix("JOB_STATE_"))

    def add_report(self, report: training_pb2.RoundReport) -> None:
        with self._cond:
            self.reports.append(report)
            self.total_cost_usd = report.total_cost_usd
            self.total_env_steps = report.total_env_steps
            self._cond.notify_all()

    def request_stop(self, reason: str) -> None:
        self.stop_reason = reason
        self.stop_requested.set()
        with self._cond:
            self._cond.notify_all()

    # -- reads from RPCs --------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    def follow(self, from_round: int, is_active: Callable[[], bool]) -> Iterator[training_pb2.RoundReport]:
        """Yield reports with round >= from_round as they arrive, until the job ends.

        Filtered after every wait: a resumed job's earlier reports arrive all at once (restore)."""
        i = 0
        while True:
            with self._cond:
                while i >= len(self.reports) and not self.done and is_active():
                    self._cond.wait(timeout=1.0)
                new = self.reports[i:]
                finished = self.done
            i += len(new)
            for r in new:
                if r.round >= from_round:
                    yield r
            if (finished and i >= len(self.reports)) or not is_active():
                return

    def status(self) -> training_pb2.TrainingStatus:
        from nitro.spec import to_proto

        with self._cond:
            msg = training_pb2.TrainingStatus(
                job_id=self.job_id, state=self.state, spec=to_proto(self.spec), rounds_done=len(self.reports),
                message=self.message, total_cost_usd=self.total_cost_usd, total_env_steps=self.total_env_steps,
                checkpoint_path=self.checkpoint_path, created_unix=self.created, finished_unix=self.finished,
                interrupted=self.interrupted,
                cloud_total_cost_usd=self.reports[-1].cloud_total_cost_usd if self.reports else 0.0)
            if self.reports:
                msg.last_report.CopyFrom(self.reports[-1])
        return msg


class JobManager:
    def __init__(self, run_job: Callable[[Job], None]):
        self._run_job = run_job
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self.draining = False

    def start(self, spec: TrainingSpec, resume: bool = False) -> Job:
        with self._lock:
            if spec.job_id in self._jobs and not self._jobs[spec.job_id].done:
                raise FileExistsError(spec.job_id)
            job = Job(spec)
            self._jobs[spec.job_id] = job
        metrics.job_state(job.job_id, "PENDING")  # until its thread runs it
        job.thread = threading.Thread(target=self._guarded, args=(job, resume), name=f"job-{job.job_id}",
                                      daemon=True)
        job.thread.start()
        return job

    def add_finished(self, job: Job) -> None:
        """A job that ended before this process started (loaded from disk): listed, not run."""
        with self._lock:
            self._jobs.setdefault(job.job_id, job)

    def _guarded(self, job: Job, resume: bool) -> None:
        try:
            self._run_job(job, resume)
        except Exception as exc:  # the service must outlive any one job
            log.exception("job %s failed", job.job_id)
            # Its saved state still says RUNNING, so a resume (or a restarted learner) retries it.
            job.set_state(training_pb2.JOB_STATE_FAILED,
                          f"{type(exc).__name__}: {exc} (an error inside the learner: its log has the traceback; "
                          f"`nitro train --resume {job.job_id}` retries from the last checkpoint)")

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def list(self) -> list[Job]:
        with self._lock:
            return sorted(self._jobs.values(), key=lambda j: j.created)

    def drain(self, timeout: float = 600.0) -> None:
        """Stop every running job after its current round (which checkpoints) and wait for them."""
        self.draining = True
        jobs = [j for j in self.list() if not j.done]
        for j in jobs:
            j.request_stop(DRAIN_STOP_REASON)
        deadline = time.time() + timeout
        for j in jobs:
            if j.thread is not None:
                j.thread.join(max(0.0, deadline - time.time()))
