"""Several jobs at once on one learner, under one dollar budget: what `nitro train --seeds` and `nitro tune` share.

`run_jobs` starts jobs as a caller hands them out (`next_job`), at most `parallel` at a time, follows each in a
thread of its own (its round reports to rounds.csv and to `on_report`, which may ask for the job to be stopped:
a pruned trial), writes each job's results (results_dir/<job>/: rounds.csv, summary.json, training.png, the
checkpoints) and hands every ended job to `on_done` in the calling thread. Ctrl-C stops every job it started.

`BudgetPool` is the dollar rule: a job starts only when its own budget fits in what the pool has left, counting
the jobs that ended at what they spent and the running ones at the larger of their budget and their spend so far
(both on the cloud clock, docs/cost.md), so the jobs together stay within the pool however they end.
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nitro.client.commands.follow import (
    FollowOptions,
    Reattacher,
    copy_checkpoint,
    final_status,
    job_ended,
    remaining_reports,
)
from nitro.client.sdk import NitroClient, NitroRpcError, RoundReport, TrainingStatus

WAIT = object()  # next_job's answer "nothing to start now; ask again when a job ends"
USD_TOLERANCE = 1e-9  # as the budget guard's (nitro.scaling.budget): 0.30 - 0.10 fits 0.20


def final_return(reports: list[RoundReport] | list[dict]) -> float:
    """A job's final return: the evaluation return of its last evaluated round (nan without one)."""
    for r in reversed(reports):
        d = r if isinstance(r, dict) else r.to_dict()
        if d.get("evaluated") and math.isfinite(d.get("eval_return", math.nan)):
            return float(d["eval_return"])
    return math.nan


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float as None, so the file is strict JSON (NaN is not)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


@dataclass
class JobRun:
    """One job of a group: what it was given, what it reported and how it ended."""

    key: Any  # the caller's name for it (a seed, a trial number)
    spec: dict
    budget_usd: float
    job_id: str = ""
    status: TrainingStatus | None = None
    reports: list[RoundReport] = field(default_factory=list)
    results_dir: Path | None = None
    stop_reason: str = ""  # why the caller stopped it ("" if it was not stopped)
    error: str = ""  # why it could not be started or followed to its end

    @property
    def ended(self) -> bool:
        """It ended for good (SUCCEEDED, FAILED, or STOPPED other than by its learner shutting down)."""
        return self.status is not None and job_ended(self.status)

    @property
    def state(self) -> str:
        """Its final state; UNFINISHED when following it stopped before its end, NOT_STARTED when it never ran."""
        if self.status is None:
            return "NOT_STARTED"
        return self.status.state_name if self.ended else "UNFINISHED"

    @property
    def cloud_cost_usd(self) -> float:
        """What the job spent on the cloud clock, as far as is known (its status, else its last report)."""
        spent = float(self.status.cloud_total_cost_usd) if self.status is not None else 0.0
        if self.reports:
            spent = max(spent, float(self.reports[-1].cloud_total_cost_usd))
        return spent

    @property
    def final_return(self) -> float:
        return final_return(self.reports)

    @property
    def rounds(self) -> int:
        return len(self.reports)


class BudgetPool:
    """A study's or a seed group's dollars: `total_usd` shared by jobs that each bring a budget of their own."""

    def __init__(self, total_usd: float):
        if not (math.isfinite(total_usd) and total_usd > 0):
            raise ValueError(f"a budget must be a finite number > 0, got {total_usd!r}")
        self.total_usd = total_usd
        self._lock = threading.Lock()
        self._running: dict[Any, list[float]] = {}  # key -> [budget, spent so far]
        self.spent_usd = 0.0  # jobs that ended: what they spent

    def committed_usd(self) -> float:
        """Spent by ended jobs, plus each running job's budget (or its spend, should it pass its budget)."""
        with self._lock:
            return self.spent_usd + sum(max(b, s) for b, s in self._running.values())

    def left_usd(self) -> float:
        return self.total_usd - self.committed_usd()

    def fits(self, budget_usd: float) -> bool:
        return budget_usd <= self.left_usd() + USD_TOLERANCE

    def reserve(self, key: Any, budget_usd: float) -> bool:
        """Hold `budget_usd` for job `key` if it fits; whether it did."""
        with self._lock:
            committed = self.spent_usd + sum(max(b, s) for b, s in self._running.values())
            if budget_usd > self.total_usd - committed + USD_TOLERANCE:
                return False
            self._running[key] = [budget_usd, 0.0]
            return True

    def update(self, key: Any, spent_usd: float) -> None:
        """A running job's spend so far."""
        with self._lock:
            if key in self._running:
                self._running[key][1] = max(self._running[key][1], spent_usd)

    def settle(self, key: Any, spent_usd: float) -> None:
        """Job `key` ended having spent `spent_usd`: the rest of its reservation returns to the pool."""
        with self._lock:
            budget, seen = self._running.pop(key, [0.0, 0.0])
            self.spent_usd += max(spent_usd, seen)

    def release(self, key: Any) -> None:
        """Job `key` never started: its reservation returns whole."""
        with self._lock:
            self._running.pop(key, None)


@dataclass(frozen=True)
class NextJob:
    """A job to start: the caller's key for it, its spec (a dict for NitroClient.start_training) and its budget."""

    key: Any
    spec: dict
    budget_usd: float


def _line(run: JobRun, r: RoundReport) -> str:
    ev = f"eval {r.eval_return:9.2f}" if r.evaluated else "eval         -"
    return (f"[{run.job_id}] round {r.round:>3}  actors {r.actors_launched:>3}  {ev}  "
            f"cloud ${r.cloud_total_cost_usd:.4f}")


def _write_results(run: JobRun, out: Path, wall_s: float) -> None:
    """summary.json, training.png and the checkpoints of one ended job (rounds.csv grew while it ran)."""
    from nitro.client import results

    summary = results.write_summary(out / "summary.json", run.status, run.reports, wall_s)
    results.plot_training(out / "training.png", run.reports)
    if run.status is not None and job_ended(run.status):
        copy_checkpoint(run.status.checkpoint_path, out / "checkpoint.pt")
    copy_checkpoint(summary["best_checkpoint_path"], out / "best.pt")


class _Follower(threading.Thread):
    """Follows one started job to its end in its own thread; puts the JobRun on `done` when it is over."""

    def __init__(self, client: NitroClient, run: JobRun, opts: FollowOptions, results_dir: Path,
                 on_report: Callable[[JobRun, RoundReport], str] | None, done: queue.Queue, log: Callable[[str], None]):
        super().__init__(name=f"follow-{run.job_id}", daemon=True)
        self.client, self.run_, self.opts, self.results_dir = client, run, opts, results_dir
        self.on_report, self.done, self.log = on_report, done, log
        self.t0 = time.monotonic()

    def run(self) -> None:
        from nitro.client import results

        run, client = self.run_, self.client
        out = self.results_dir / run.job_id
        run.results_dir = out
        try:
            with results.RoundsCsvWriter(out / "rounds.csv") as csv:
                self._follow(csv)
        except Exception as exc:  # noqa: BLE001 - any failure of one job is that job's, not the group's
            run.error = run.error or f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(NitroRpcError):
                run.status = final_status(client, run.job_id, run.status, wait_s=0)
        finally:
            try:
                _write_results(run, out, time.monotonic() - self.t0)
            except Exception as exc:  # noqa: BLE001
                run.error = run.error or f"writing its results failed: {exc}"
            self.done.put(run)

    def _take(self, csv, r: RoundReport) -> None:
        run = self.run_
        if run.reports and r.round <= run.reports[-1].round:  # a resumed job's rounds, replayed
            return
        run.reports.append(r)
        csv.append(r)
        self.log(_line(run, r))
        if self.on_report is not None and not run.stop_reason:
            reason = self.on_report(run, r)
            if reason:
                run.stop_reason = reason
                self.log(f"[{run.job_id}] stopping: {reason}")
                with contextlib.suppress(NitroRpcError):
                    self.client.stop(run.job_id)  # it finishes the round in flight, then ends STOPPED

    def _follow(self, csv) -> None:
        run, client = self.run_, self.client
        waiting = Reattacher(self.opts, run.job_id, self.log)
        while True:
            start = run.reports[-1].round + 1 if run.reports else 0
            for r in client.watch(run.job_id, from_round=start, patience_s=waiting.timeout_s, on_wait=waiting):
                waiting.back()
                self._take(csv, r)
            run.status = waiting.after_stream(client)
            if job_ended(run.status):
                for r in remaining_reports(client, run.job_id, run.reports):
                    self._take(csv, r)
                run.status = final_status(client, run.job_id, run.status, wait_s=0)
                return


def run_jobs(client: NitroClient, next_job: Callable[[], NextJob | object | None], *, parallel: int,
             results_dir: str | Path, opts: FollowOptions, pool: BudgetPool | None = None,
             on_report: Callable[[JobRun, RoundReport], str] | None = None,
             on_done: Callable[[JobRun], None] | None = None, on_start: Callable[[JobRun], None] | None = None,
             log: Callable[[str], None] = print) -> list[JobRun]:
    """Start the jobs `next_job` hands out (a NextJob; WAIT: none now, ask again when one ends; None: no more),
    at most `parallel` at once, and follow each to its end; every JobRun, in the order they started.

    With a `pool`, a job starts only when its budget fits (`BudgetPool.reserve`); one that does not is handed
    back to `next_job`'s caller by asking again after a job ends, and when none runs the group is over.
    `on_report(run, report)` runs in the job's thread for each round: a non-empty answer stops the job (the
    reason is kept in `run.stop_reason`). `on_start` and `on_done` run in this thread. Ctrl-C stops every
    running job, waits up to a minute for them to end, writes their results and raises KeyboardInterrupt."""
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    out = Path(results_dir)
    done: queue.Queue[JobRun] = queue.Queue()
    runs: list[JobRun] = []
    running: dict[str, JobRun] = {}
    pending: NextJob | None = None  # handed out but not yet affordable
    exhausted = False

    def report(run: JobRun, r: RoundReport) -> str:
        if pool is not None:
            pool.update(run.key, float(r.cloud_total_cost_usd))
        return on_report(run, r) if on_report is not None else ""

    def finish(run: JobRun) -> None:
        running.pop(run.job_id, None)
        if pool is not None:
            pool.settle(run.key, run.cloud_cost_usd)
        if on_done is not None:
            on_done(run)

    try:
        while True:
            while not exhausted and len(running) < parallel:
                job = pending or next_job()
                pending = None
                if job is None:
                    exhausted = True
                    break
                if job is WAIT:
                    break
                assert isinstance(job, NextJob)
                if pool is not None and not pool.reserve(job.key, job.budget_usd):
                    if not running:  # nothing will free any money
                        exhausted = True
                        log(f"not starting {job.key}: its ${job.budget_usd:g} budget does not fit in the "
                            f"${pool.left_usd():.4f} left of ${pool.total_usd:g}")
                    else:
                        pending = job
                    break
                run = JobRun(job.key, job.spec, job.budget_usd)
                runs.append(run)
                try:
                    status = client.start_training(job.spec)
                except NitroRpcError as exc:
                    if pool is not None:
                        pool.release(job.key)
                    run.error = f"{exc.code.name}: {exc.details}"
                    if on_done is not None:
                        on_done(run)
                    raise
                run.job_id, run.status = str(status.job_id), status
                running[run.job_id] = run
                if on_start is not None:
                    on_start(run)
                _Follower(client, run, opts, out, report, done, log).start()
            if not running:
                return runs
            with contextlib.suppress(queue.Empty):
                finish(done.get(timeout=0.5))
                while True:  # every other one that ended meanwhile
                    finish(done.get_nowait())
    except KeyboardInterrupt:
        log(f"\ninterrupted: stopping {len(running)} running job(s) (Ctrl-C again to leave without waiting)")
        for job_id in list(running):
            with contextlib.suppress(NitroRpcError):
                client.stop(job_id)
        deadline = time.monotonic() + 60
        with contextlib.suppress(KeyboardInterrupt):
            while running and time.monotonic() < deadline:
                with contextlib.suppress(queue.Empty):
                    finish(done.get(timeout=0.5))
        raise
