"""`nitro watch`, `nitro stop`, `nitro list`: jobs already running on a learner."""

from __future__ import annotations

import argparse
import contextlib
import signal

from nitro.client.commands.common import (
    add_state_dir,
    add_target,
    learner_client,
    raise_interrupt,
    resolve_target,
    routed_signals,
)
from nitro.client.commands.follow import (
    FollowOptions,
    Reattacher,
    add_outputs,
    final_status,
    follow_job,
    open_job_trackers,
)
from nitro.client.commands.system import job_table


def _add_job_target(p: argparse.ArgumentParser) -> None:
    p.add_argument("job_id", metavar="JOB", help="job id (`nitro list` shows them)")
    run = p.add_argument_group("running")
    add_target(run, "learner address")
    add_state_dir(run)


def add_watch(sub) -> None:
    p = sub.add_parser("watch", help="follow a running or finished job to its end and write its results",
                       description="Replay a job's round reports from round 0, follow it until it ends and write "
                                   "results/<job>/ as `nitro train` does (rounds.csv row by row, then "
                                   "summary.json and training.png), with the same progress display and tracking "
                                   "flags. Ctrl-C leaves the job running. Exit code 0 when the job SUCCEEDED, "
                                   "1 FAILED, 3 STOPPED, 4 when it did not end because the system or its learner "
                                   "went away; 2 for an unknown job id.")
    _add_job_target(p)
    add_outputs(p)
    p.set_defaults(func=cmd_watch)


def cmd_watch(args) -> int:
    follow = FollowOptions.from_args(args)
    trackers = open_job_trackers(follow)
    with contextlib.ExitStack() as stack:
        stack.enter_context(routed_signals(raise_interrupt, (signal.SIGTERM,)))  # a kill leaves like Ctrl-C
        client = stack.enter_context(learner_client(args, resolve_target(args)))
        # An unknown id is NOT_FOUND before anything is written; a restarting learner is waited for.
        status = Reattacher(follow, args.job_id, print).patiently(lambda: client.get(args.job_id))
        return follow_job(client, status, follow, trackers, leave_running=True)


def add_stop(sub) -> None:
    p = sub.add_parser("stop", help="stop a job and print its state",
                       description="Ask the learner to stop a job, wait for it to end (its round in flight ends "
                                   "first) and print its state. The checkpoint and reports so far stay. Exit code 0 "
                                   "once the job has ended (or had already), 1 when it still runs after --wait, "
                                   "2 for an unknown job id.")
    _add_job_target(p)
    p.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                   help="how long to wait for the job to end; 0 returns once the request is sent "
                        "(default: %(default)s)")
    p.set_defaults(func=cmd_stop)


def _state_line(status) -> str:
    planned = f"/{status.spec.rounds}" if status.HasField("spec") else ""
    return (f"{status.state_name}" + (f": {status.message}" if status.message else "")
            + f" ({status.rounds_done}{planned} rounds, cloud ${status.cloud_total_cost_usd:.4f}, "
              f"this machine ${status.total_cost_usd:.4f})")


def cmd_stop(args) -> int:
    with learner_client(args, resolve_target(args)) as client:
        status = client.stop(args.job_id)
        if status.finished:
            print(f"job {status.job_id} had already ended: {_state_line(status)}")
            return 0
        if args.wait > 0:
            print(f"stopping job {status.job_id} (waiting up to {args.wait:g} s for its round in flight) ...",
                  flush=True)
            status = final_status(client, status.job_id, status, wait_s=args.wait)
    if status.finished:
        print(f"job {status.job_id} {_state_line(status)}")
        return 0
    print(f"job {status.job_id} stop requested; still {_state_line(status)}")
    return 0 if args.wait <= 0 else 1


def add_list(sub) -> None:
    p = sub.add_parser("list", help="the learner's jobs as a table: state, rounds, both cost clocks",
                       description="One row per job the learner knows, running or ended: id, state, rounds "
                                   "done/planned, the modelled cloud cost and this machine's (docs/cost.md), "
                                   "and why it ended.")
    run = p.add_argument_group("running")
    add_target(run, "learner address")
    add_state_dir(run)
    p.set_defaults(func=cmd_list)


def cmd_list(args) -> int:
    with learner_client(args, resolve_target(args)) as client:
        jobs = client.list()
    print("\n".join(job_table(jobs)) if jobs else "no jobs")
    return 0
