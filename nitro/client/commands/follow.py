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

import grpc

from nitro.client.commands.common import STATE_DIR_DEFAULT, CliError
from nitro.client.sdk import FailedPreconditionError, NitroClient, NitroRpcError
from nitro.local import system_state
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

    @classmethod
    def from_args(cls, args) -> FollowOptions:
        return cls(state_dir=args.state_dir, target=args.target, results_dir=args.results_dir,
                   no_progress=args.no_progress, tensorboard=args.tensorboard, wandb_project=args.wandb_project,
                   reattach_timeout_s=args.reattach_timeout)


class _LearnerGone(CliError):
    """Following a job stopped: its learner stayed away, or the local system it ran on is down."""


class Reattacher:
    """While the learner is away (a restart): a progress line now and then; gives up at once when the
    local system the job runs on is down (no supervisor will bring the learner back)."""

    def __init__(self, opts: FollowOptions, job: str, write):
        self.job, self.write = job, write
        self.state_dir = None if opts.target else opts.state_dir
        self.timeout_s = opts.reattach_timeout_s
        self.shown_at = None  # seconds waited when the last line was shown; None: not waiting

    def __call__(self, err: NitroRpcError, waited_s: float) -> None:
        if self.state_dir is not None and system_state.running_state(self.state_dir) is None:
            raise _LearnerGone(f"the local system in {self.state_dir} is down (its log: "
                               f"{Path(self.state_dir) / 'logs' / system_state.SUPERVISOR_LOG})")
        if self.shown_at is None or waited_s - self.shown_at >= 15:
            self.shown_at = waited_s
            self.write(f"learner unavailable ({err.code.name}): waiting for it to come back, "
                       f"{waited_s:.0f} s of {self.timeout_s:.0f} s (job {self.job} goes on; Ctrl-C leaves)")

    def back(self) -> None:
        if self.shown_at is not None:
            self.write("learner back: following the job again")
        self.shown_at = None

    def patiently(self, call):
        """`call()`, retried while the learner is unavailable, for up to the reattach timeout."""
        t0, delay = time.monotonic(), 0.5
        while True:
            try:
                result = call()
            except NitroRpcError as exc:
                waited = time.monotonic() - t0
                if exc.code != grpc.StatusCode.UNAVAILABLE or waited >= self.timeout_s:
                    raise
                self(exc, waited)
                time.sleep(delay)
                delay = min(2 * delay, 5.0)
            else:
                self.back()
                return result


def run_job(client: NitroClient, spec: dict, opts: FollowOptions, trackers, resume: str | None = None) -> int:
    """Start the job of `spec`, or resume job `resume`, and follow it to its end."""
    t0 = time.monotonic()
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
    return follow_job(client, status, opts, trackers, t0)


def follow_job(client: NitroClient, status, opts: FollowOptions, trackers, t0: float | None = None,
               leave_running: bool = False) -> int:
    """Show a job's rounds from round 0 on as they arrive, append each to rounds.csv and the trackers, and
    write the results once the job has ended; the exit code is its state's (JOB_EXIT_CODES).

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
    reports, interrupted, failure = [], False, None
    waiting = Reattacher(opts, job, lambda line: tqdm.write(line, file=sys.stdout))
    trackers.start(job, status.to_dict()["spec"] or {})
    with results.RoundsCsvWriter(out / "rounds.csv") as rounds_csv:

        def take(r) -> None:
            reports.append(r)
            rounds_csv.append(r)  # flushed: rounds.csv grows while the job runs
            trackers.log_round(r.to_dict())

        try:
            for r in client.watch(job, patience_s=waiting.timeout_s, on_wait=waiting):
                waiting.back()
                take(r)
                bar.update(1)
                bar.set_postfix_str(f"actors {r.actors_launched} eval {r.eval_return:.1f} "
                                    f"cloud ${r.cloud_total_cost_usd:.4f} score {r.score:.2f}")
                if plain:
                    print(_round_line(r), flush=True)
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
        # The stream can close just before the state flips; a stopped job finishes its round in flight.
        wait_s = 0 if failure or (interrupted and leave_running) else 60 if interrupted else 15
        status = final_status(client, job, status, wait_s=wait_s)
        if (interrupted or failure) and status.finished:
            for r in _remaining_reports(client, job, reports):
                take(r)
    status = _known_status(status, reports)
    wall_s = time.monotonic() - t0 if t0 is not None else _job_seconds(status)
    out = write_results(out, status, reports, wall_s, trackers)
    if interrupted:
        return 130
    if not status.finished:
        print(_unfinished(opts, status, failure), file=sys.stderr)
        return 1
    return JOB_EXIT_CODES.get(status.state_name, 1)


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
    """What a job that was left before its end is known to be doing, and the commands that go on with it."""
    job = status.job_id
    why = f": {failure}" if failure else ""
    lines = [f"job {job} has not finished; last known state {status.state_name}, {status.rounds_done}"
             f"{f'/{status.spec.rounds}' if status.HasField('spec') else ''} rounds (following it stopped{why})"]
    target = opts.target
    default_dir = opts.state_dir == STATE_DIR_DEFAULT
    where = f" --target {target}" if target else "" if default_dir else f" --state-dir {opts.state_dir}"
    if not target and system_state.running_state(opts.state_dir) is None:
        lines.append(f"  the local system is down: `nitro up{'' if default_dir else f' --state-dir {opts.state_dir}'}`"
                     f", then")
    lines.append(f"  follow it:   nitro watch {job}{where}")
    lines.append(f"  continue it: nitro train --resume {job}{where}   (attaches to it if the learner runs it already)")
    return "\n".join(lines)


def _job_seconds(status) -> float:
    """A job's wall time by the learner's clock: created to finished, or to now while it runs."""
    if not status.created_unix:
        return 0.0
    return (status.finished_unix if status.finished and status.finished_unix else time.time()) - status.created_unix


def _remaining_reports(client: NitroClient, job: str, reports: list) -> list:
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
                if exc.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() >= deadline:
                    return last
            else:
                if last.finished or time.monotonic() >= deadline:
                    return last
            time.sleep(0.5)
    except KeyboardInterrupt:  # stop waiting, still write what arrived
        return last


def _copy_checkpoint(path: str, dest: Path) -> str:
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
    ckpt_line = _copy_checkpoint(status.checkpoint_path, out / "checkpoint.pt") if status.finished or \
        status.checkpoint_path else "kept by the learner (not finished; `nitro train --resume` continues from it)"
    best_line = _copy_checkpoint(summary["best_checkpoint_path"], out / "best.pt")

    def num(v, fmt):
        return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)

    planned = f" / {summary['rounds_planned']}" if summary.get("rounds_planned") else ""
    state = summary["state"] if status.finished else f"not finished (last known state {summary['state']})"
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
