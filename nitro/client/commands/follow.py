"""Following a job to its end (train and watch): progress, reattaching across a learner restart, result files."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from nitro.client.commands.common import STATE_DIR_DEFAULT, CliError
from nitro.client.sdk import (
    LEARNER_AWAY,
    FailedPreconditionError,
    NitroClient,
    NitroRpcError,
    RoundReport,
    TrainingStatus,
)
from nitro.local import system_state
from nitro.local.processes import pid_alive
from nitro.spec import TrainingSpec
from nitro.v1 import training_pb2


def add_outputs(p: argparse.ArgumentParser) -> None:
    """Flags of the commands that follow a job and write its results (train, watch)."""
    out = p.add_argument_group("results and tracking")
    out.add_argument("--results-dir", default="results", help="where results/<job>/ goes (default: %(default)s)")
    out.add_argument("--no-progress", action="store_true", help="a plain line per round instead of a progress bar")
    out.add_argument("--tensorboard", default=None, metavar="DIR",
                     help="also log every round to TensorBoard event files in DIR/<job>/ (needs tensorboard)")
    out.add_argument("--wandb-project", default=None, metavar="NAME",
                     help="also log every round to a Weights & Biases run in project NAME (needs wandb; "
                          "WANDB_MODE=offline logs without a network)")
    out.add_argument("--reattach-timeout", type=float, default=REATTACH_TIMEOUT_S, metavar="SECONDS",
                     help="how long to wait for a learner that went away (restarting) before giving up on "
                          "following the job; the job itself goes on (default: %(default)s)")


def _round_line(r) -> str:
    return (f"round {r.round:>4}  actors {r.actors_launched:>3}  eval {r.eval_return:10.2f}  "
            f"train {r.train_return:10.2f}  score {r.score:4.2f}  "
            f"cost cloud ${r.cloud_total_cost_usd:.4f} / this machine ${r.total_cost_usd:.4f}")


JOB_EXIT_CODES = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 3}  # any other state (still running): 1


# The job did not end: the nitro system or the job's learner went away and nothing brought it back (the system is
# down, the learner stayed unreachable, or it restarted without resuming the job). It keeps its checkpoint; the
# CLI prints the commands that continue it.
INTERRUPTED_EXIT = 4


def open_job_trackers(opts: FollowOptions):
    from nitro.client.tracking import TrackingError, open_trackers

    try:
        return open_trackers(opts.tensorboard, opts.wandb_project)
    except TrackingError as exc:
        raise CliError(str(exc), exit_code=2) from None


REATTACH_TIMEOUT_S = 300.0  # train/watch: how long to wait for a restarting learner (--reattach-timeout)


@dataclass(frozen=True)
class FollowOptions:
    """How train and watch follow a job (the flags of add_outputs, and where its learner runs)."""

    state_dir: str
    target: str | None = None  # --target; None: the learner of the local system in state_dir
    results_dir: str = "results"
    no_progress: bool = False
    tensorboard: str | None = None
    wandb_project: str | None = None
    reattach_timeout_s: float = REATTACH_TIMEOUT_S
    local: bool = False  # `nitro train --local`: this command runs the system (and stops it when it leaves)

    @classmethod
    def from_args(cls, args) -> FollowOptions:
        return cls(state_dir=args.state_dir, target=args.target, results_dir=args.results_dir,
                   no_progress=args.no_progress, tensorboard=args.tensorboard, wandb_project=args.wandb_project,
                   reattach_timeout_s=args.reattach_timeout, local=getattr(args, "local", False))


class _LearnerGone(CliError):
    """Following a job stopped because its learner went away for good: the local system it ran on is down,
    the learner stayed unreachable, or it came back without resuming the job."""

    def __init__(self, message: str):
        super().__init__(message, exit_code=INTERRUPTED_EXIT)


def _exited(pid: int | None, start_time: str | None) -> bool:
    """Whether a process of this one's has ended: gone, or a zombie not yet reaped."""
    if not pid_alive(pid, start_time):
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


def _stopped_by_its_learner(status) -> bool:
    """STOPPED because its learner shut down (TrainingStatus.interrupted), not by a request: not an end."""
    return status.finished and status.interrupted


class Reattacher:
    """While the learner is away (a restart): a progress line now and then; gives up at once when the
    local system the job runs on is down (no supervisor will bring the learner back)."""

    def __init__(self, opts: FollowOptions, job: str, write):
        self.job, self.write = job, write
        self.state_dir = None if opts.target else opts.state_dir
        self.timeout_s = opts.reattach_timeout_s
        self.shown_at: float | None = None  # seconds waited when the last line was shown; None: not waiting
        self.went_away = False  # the learner was unreachable since the job was last seen running

    def check_system(self) -> None:
        """_LearnerGone when the job runs on the local system in state_dir and that system is down, or when
        this process runs that system (`nitro train --local`, which restarts nothing) and its learner is gone."""
        if self.state_dir is None:
            return
        state = system_state.running_state(self.state_dir)
        if state is None:
            raise _LearnerGone(f"the nitro system went down: the local system in {self.state_dir} stopped "
                               f"(its log: {Path(self.state_dir) / 'logs' / system_state.SUPERVISOR_LOG})")
        learner = state.get("components", {}).get("learner", {})
        ours = state.get("supervisor_pid") == os.getpid()
        if ours and learner and _exited(learner.get("pid"), learner.get("start_time")):
            raise _LearnerGone(f"the nitro system went down: the learner of the local system this command started "
                               f"exited, and nothing restarts it under `nitro train --local` (its log: "
                               f"{learner.get('log')})")

    def __call__(self, err: NitroRpcError, waited_s: float) -> None:
        self.went_away = True
        self.check_system()
        if self.shown_at is None or waited_s - self.shown_at >= 15:
            self.shown_at = waited_s
            self.write(f"learner unavailable ({err.code.name}): waiting for it to come back, "
                       f"{waited_s:.0f} s of {self.timeout_s:.0f} s (job {self.job} goes on; Ctrl-C leaves)")

    def back(self) -> None:
        if self.shown_at is not None:
            self.write("learner back: following the job again")
        self.shown_at, self.went_away = None, False

    def after_stream(self, client: NitroClient):
        """The job's status once its stream ended: when it ended for good, or when it runs (again: a restarted
        learner resumed it; follow it on). A learner that stops the job to shut down leaves it STOPPED,
        interrupted (`_stopped_by_its_learner`): wait for a learner to resume it. _LearnerGone when the local
        system is down, when a learner came back without resuming the job (automatic resume off), or when none
        answered within the reattach timeout."""
        t0, delay, said = time.monotonic(), 0.5, False
        while True:
            self.check_system()
            waited = time.monotonic() - t0
            try:
                current = client.get(self.job)
            except NitroRpcError as exc:
                # NOT_FOUND: a restarted learner lists its jobs just after it starts serving.
                if exc.code not in LEARNER_AWAY and exc.code != grpc.StatusCode.NOT_FOUND:
                    raise
                self(exc, waited)
            else:
                if not _stopped_by_its_learner(current):  # ended for good, or running (again)
                    self.back()
                    return current
                if not said:
                    self.write(f"job {self.job} was stopped by its learner shutting down: waiting for a learner to "
                               f"resume it")
                    said = True
                # A serving learner shows it interrupted: it is not the one shutting down (that one drains, not
                # serving), it came up after it and did not resume the job, and it will not.
                if self.went_away or client.serving():
                    raise _LearnerGone("its learner restarted without resuming it (automatic resume is off: "
                                       "the learner runs with --no-resume-jobs or NITRO_RESUME_JOBS=0)")
            if waited >= self.timeout_s:
                raise _LearnerGone(f"its learner went away and no learner ran the job again within "
                                   f"{self.timeout_s:.0f} s (--reattach-timeout)")
            time.sleep(delay)
            delay = min(2 * delay, 2.0)

    def patiently(self, call):
        """`call()`, retried while the learner is unavailable, for up to the reattach timeout."""
        t0, delay = time.monotonic(), 0.5
        while True:
            try:
                result = call()
            except NitroRpcError as exc:
                waited = time.monotonic() - t0
                if exc.code not in LEARNER_AWAY or waited >= self.timeout_s:
                    raise
                self(exc, waited)
                time.sleep(delay)
                delay = min(2 * delay, 5.0)
            else:
                self.back()
                return result


@dataclass(frozen=True)
class FollowedJob:
    """What following a job gave (`nitro train` and `watch`, `nitro.train`): its last known status, the rounds
    received, the directory its results were written to, and the command's exit code."""

    status: TrainingStatus
    reports: list[RoundReport]
    results_dir: Path
    exit_code: int
    interrupted: bool = False  # Ctrl-C (or SIGTERM under the CLI) ended the following
    unfinished: str = ""  # why following stopped before the job's end, and how to go on with it; "" if it ended


def run_job(client: NitroClient, spec: dict, opts: FollowOptions, trackers, resume: str | None = None) -> int:
    """Start the job of `spec`, or resume job `resume`, and follow it to its end; the exit code."""
    return start_and_follow(client, spec, opts, trackers, resume).exit_code


def start_and_follow(client: NitroClient, spec: dict[str, Any] | TrainingSpec, opts: FollowOptions, trackers,
                     resume: str | None = None) -> FollowedJob:
    """Start the job of `spec`, or resume job `resume`, and follow it to its end (`follow`)."""
    t0: float | None = time.monotonic()
    if resume:  # attaches to the job when the learner runs it already: safe to retry
        try:
            status = Reattacher(opts, resume, print).patiently(lambda: client.resume(resume))
        except FailedPreconditionError:
            # It ended before this resume, e.g. a restarted learner resumed and finished it first: following
            # it to its end is showing its rounds and results, with its state's exit code.
            status = client.get(resume)
            if not status.finished:
                raise
            print(f"job {resume} ended before this resume ({status.state_name}: {status.message}); "
                  f"its rounds and results follow", flush=True)
            t0 = None
    else:
        status = client.start_training(spec)
    return follow(client, status, opts, trackers, t0)


def follow_job(client: NitroClient, status, opts: FollowOptions, trackers, t0: float | None = None,
               leave_running: bool = False) -> int:
    """`follow`'s exit code: the job's state's (JOB_EXIT_CODES), 130 interrupted, 4 or 1 unfinished."""
    return follow(client, status, opts, trackers, t0, leave_running).exit_code


def follow(client: NitroClient, status, opts: FollowOptions, trackers, t0: float | None = None,
           leave_running: bool = False) -> FollowedJob:
    """Show a job's rounds from round 0 on as they arrive, append each to rounds.csv and the trackers, and
    write the results once the job has ended.

    Ctrl-C stops the job, or with `leave_running` (watch) leaves it running. t0 None: the wall time is the
    job's own (created to finished), for a job followed from elsewhere."""
    from tqdm import tqdm

    from nitro.client import results

    job = status.job_id
    s = status.spec
    print(f"job {job}: {s.env_id} {s.algo}, scaler {s.scaler.policy}, {s.rounds} rounds", flush=True)
    out = Path(opts.results_dir) / job
    plain = opts.no_progress or not sys.stderr.isatty()
    bar = tqdm(total=s.rounds or None, unit="round", desc=job, disable=plain, dynamic_ncols=True)
    reports: list[RoundReport] = []
    interrupted = False
    failure: NitroRpcError | _LearnerGone | None = None  # what ended the following before the job's end
    waiting = Reattacher(opts, job, lambda line: tqdm.write(line, file=sys.stdout))
    trackers.start(job, status.to_dict()["spec"] or {})
    with results.RoundsCsvWriter(out / "rounds.csv") as rounds_csv:

        def take(r) -> bool:
            if reports and r.round <= reports[-1].round:  # a resumed job's earlier rounds, replayed
                return False
            reports.append(r)
            rounds_csv.append(r)  # flushed: rounds.csv grows while the job runs
            trackers.log_round(r.to_dict())
            return True

        refreshed = -math.inf

        def show(r) -> None:
            nonlocal status, refreshed
            if not take(r):
                return
            # The status now and then: its checkpoint's path is then known should the learner go away.
            if time.monotonic() - refreshed >= STATUS_REFRESH_S:
                status, refreshed = _refreshed(client, job, status), time.monotonic()
            bar.update(1)
            bar.set_postfix_str(f"actors {r.actors_launched} eval {r.eval_return:.1f} "
                                f"cloud ${r.cloud_total_cost_usd:.4f} score {r.score:.2f}")
            if plain:
                print(_round_line(r), flush=True)

        try:
            while True:
                for r in client.watch(job, from_round=reports[-1].round + 1 if reports else 0,
                                      patience_s=waiting.timeout_s, on_wait=waiting):
                    waiting.back()
                    show(r)
                # The stream ended: with the job, or because its learner went away, which is no end of the job.
                status = waiting.after_stream(client)
                if job_ended(status):  # a restarted learner may have resumed and finished it meanwhile
                    for r in remaining_reports(client, job, reports):
                        show(r)
                    status = _refreshed(client, job, status)  # after the last report: its final numbers
                    break
        except KeyboardInterrupt:
            interrupted = True
            bar.close()
            if leave_running:
                print(f"\ninterrupted: job {job} keeps running (`nitro stop {job}` stops it)", flush=True)
            else:
                print(f"\ninterrupted: stopping job {job} (Ctrl-C again to leave without waiting) ...", flush=True)
                with contextlib.suppress(NitroRpcError):
                    status = client.stop(job)
        except NitroRpcError as exc:
            failure = exc  # write what arrived, then say what is known
        except _LearnerGone as exc:
            failure = exc
        finally:
            bar.close()
        if interrupted or failure:  # a stopped job finishes its round in flight
            status = final_status(client, job, status, wait_s=0 if failure or leave_running else 60)
            if status.finished:
                for r in remaining_reports(client, job, reports):
                    take(r)
    status = _known_status(status, reports)
    wall_s = time.monotonic() - t0 if t0 is not None else _job_seconds(status)
    out = write_results(out, status, reports, wall_s, trackers)
    if interrupted:
        return FollowedJob(status, reports, out, 130, interrupted=True)
    if not job_ended(status):
        why = _unfinished(opts, status, failure)
        print(why, file=sys.stderr)
        code = INTERRUPTED_EXIT if _learner_went_away(failure) or status.interrupted else 1
        return FollowedJob(status, reports, out, code, unfinished=why)
    return FollowedJob(status, reports, out, JOB_EXIT_CODES.get(status.state_name, 1))


STATUS_REFRESH_S = 2.0  # while reports arrive, the job's status is asked for at most this often


def _refreshed(client: NitroClient, job: str, status):
    """The job's status now (its checkpoint's path once one is written), else `status`."""
    try:
        return client.get(job)
    except NitroRpcError:
        return status


def job_ended(status) -> bool:
    """The job ended for good: SUCCEEDED, FAILED, or STOPPED other than by its learner's shutdown."""
    return status.finished and not status.interrupted


def _learner_went_away(failure) -> bool:
    return isinstance(failure, _LearnerGone) or (isinstance(failure, NitroRpcError) and failure.code in LEARNER_AWAY)


def _known_status(status, reports: list):
    """`status`, with what the reports prove: a job that reported rounds was RUNNING, whatever an early
    status (PENDING) said before the learner became unreachable."""
    if status.finished or not reports or len(reports) <= status.rounds_done:
        return status
    proto = type(status.proto)()
    proto.CopyFrom(status.proto)
    proto.state = training_pb2.JOB_STATE_RUNNING
    proto.rounds_done = len(reports)
    proto.last_report.CopyFrom(reports[-1].proto)
    return type(status)(proto)


def _unfinished(opts: FollowOptions, status, failure) -> str:
    """Why following a job stopped before its end, what is known of it (state, rounds, checkpoint), and the
    exact commands that continue it."""
    job = status.job_id
    if isinstance(failure, _LearnerGone):
        why = str(failure)
    elif _learner_went_away(failure):
        why = (f"its learner{f' at {opts.target}' if opts.target else ''} stayed unreachable "
               f"(--reattach-timeout {opts.reattach_timeout_s:.0f} s): {failure}")
    elif failure:
        why = f"following it stopped: {failure}"
    elif status.interrupted:
        why = "its learner stopped it while shutting down"
    else:
        why = "following it stopped before its end"
    planned = f"/{status.spec.rounds}" if status.HasField("spec") else ""
    last = f" (the last: round {status.last_report.round})" if status.HasField("last_report") else ""
    interrupted = " (interrupted by its learner's shutdown)" if status.interrupted else ""
    target = opts.target
    default_dir = opts.state_dir == STATE_DIR_DEFAULT
    where = f" --target {target}" if target else "" if default_dir else f" --state-dir {opts.state_dir}"
    lines = [f"job {job} did not finish: {why}",
             f"  last known state  {status.state_name}{interrupted}, {status.rounds_done}{planned} rounds done{last}",
             f"  checkpoint        {_checkpoint_where(status.checkpoint_path)}",
             "  to continue it:"]
    if opts.local and not target:  # this command's system stops with it
        lines.append(f"    nitro train --local --resume {job}{where}")
        return "\n".join(lines)
    if not target and system_state.running_state(opts.state_dir) is None:
        lines.append(f"    nitro up{'' if default_dir else f' --state-dir {opts.state_dir}'}")
    elif target and _learner_went_away(failure):
        lines.append(f"    nitro status --target {target}   (once the learner answers again)")
    lines.append(f"    nitro train --resume {job}{where}   (attaches to it if the learner runs it already)")
    lines.append(f"  to only follow it: nitro watch {job}{where}")
    return "\n".join(lines)


def _checkpoint_where(path: str) -> str:
    """The job's checkpoint file as this machine sees it."""
    if path and os.path.isfile(path):
        return path
    return f"{path} (on the learner's machine)" if path else "none written yet (the learner writes one every round)"


def _job_seconds(status) -> float:
    """A job's wall time by the learner's clock: created to finished, or to now while it runs."""
    if not status.created_unix:
        return 0.0
    return (status.finished_unix if status.finished and status.finished_unix else time.time()) - status.created_unix


def remaining_reports(client: NitroClient, job: str, reports: list) -> list:
    """Reports of rounds that ended after the stream was left (the job has ended, so this returns)."""
    try:
        return list(client.watch(job, from_round=reports[-1].round + 1 if reports else 0))
    except NitroRpcError:
        return []


def final_status(client: NitroClient, job: str, last, wait_s: float):
    """The job's status once it has ended, or the latest one known after `wait_s` (an unreachable learner
    is asked again meanwhile)."""
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                last = client.get(job)
            except NitroRpcError as exc:
                if exc.code not in LEARNER_AWAY or time.monotonic() >= deadline:
                    return last
            else:
                if last.finished or time.monotonic() >= deadline:
                    return last
            time.sleep(0.5)
    except KeyboardInterrupt:  # stop waiting, still write what arrived
        return last


def copy_checkpoint(path: str, dest: Path) -> str:
    """Copy the learner's file into the results when it is reachable from here; the line that says where it is."""
    if path and os.path.isfile(path):
        shutil.copy2(path, dest)
        return str(dest)
    return f"{path} (not reachable from here)" if path else "none"


def write_results(out: Path, status, reports: list, wall_s: float, trackers=None) -> Path:
    """summary.json, training.png and the checkpoints (rounds.csv was written as the rounds arrived)."""
    from nitro.client import results

    out.mkdir(parents=True, exist_ok=True)
    summary = results.write_summary(out / "summary.json", status, reports, wall_s)
    results.plot_training(out / "training.png", reports)
    ended = job_ended(status)
    ckpt_line = copy_checkpoint(status.checkpoint_path, out / "checkpoint.pt") if ended else \
        f"{_checkpoint_where(status.checkpoint_path)} (the job has not finished: `nitro train --resume " \
        f"{status.job_id}` continues from it)"
    best_line = copy_checkpoint(summary["best_checkpoint_path"], out / "best.pt")

    def num(v, fmt):
        return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)

    planned = f" / {summary['rounds_planned']}" if summary.get("rounds_planned") else ""
    state = summary["state"] if ended else f"not finished (last known state {summary['state']})"
    print(f"\njob {summary['job_id']} {state}" + (f": {summary['message']}" if summary["message"] else ""))
    print(f"  rounds        {summary['rounds']}{planned}")
    print(f"  eval return   final {num(summary['final_eval_return'], '.2f')}, "
          f"best {num(summary['best_eval_return'], '.2f')} (round {summary['best_round']})")
    print(f"  env steps     {summary['total_env_steps']:,}")
    print(f"  cost (cloud)  ${summary['cloud_total_cost_usd']:.4f} modelled for AWS, {summary['cloud_seconds']:.1f} s "
          f"(serverful comparator ${summary['cloud_serverful_cost_usd']:.4f}; docs/cost.md)")
    print(f"  cost (here)   ${summary['total_cost_usd']:.4f} at this machine's wall time "
          f"(serverful comparator ${summary['serverful_cost_usd']:.4f})")
    print(f"  wall time     {wall_s:.1f} s on this machine")
    print(f"  checkpoint    {ckpt_line}")
    if summary["best_checkpoint_path"]:
        use = f"; try `nitro eval {best_line}`" if best_line == str(out / "best.pt") else ""
        print(f"  best policy   {best_line} (round {summary['best_round']}{use})")
    for line in trackers.finish(summary) if trackers is not None else []:
        print(f"  {line}")
    print(f"  results       {out}/ (rounds.csv, summary.json, training.png)", flush=True)
    return out
