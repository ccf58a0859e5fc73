"""Recovery from faults (issue 17): every loop, every fault kind, on a supervised local system.

For each loop (ppo on-policy, impact, stellaris) and each fault kind, one small CartPole-v1 job (preset
`fast`, a few fixed actors) runs on one local system started as `nitro up` starts it
(`python -m nitro.local.supervisor`, whose supervisor restarts what exits). Once round 1 is reported the
fault lands in the round under way (fault_round, normally 2), a real signal (os.kill) to a pid from the
system's state.json (a worker: a child of the endpoint's pid):

  worker       SIGKILL of an endpoint worker process while it runs an actor invocation
  redis        SIGKILL of redis-server
  detector     SIGKILL of the detector (while it scores, if seen busy within a round)
  scaler_hang  SIGSTOP of the scaler for 20 s, then SIGCONT
  learner      SIGKILL of the learner

The job is followed as a user would with the SDK (NitroClient.watch, which reopens its stream across a
learner restart); a job that ends FAILED but resumable is resumed once (`nitro train --resume`'s RPC),
and the entry says so. Per cell:

- completed: the job reached SUCCEEDED.
- batches: what the actors produced (every stream entry the bench saw, read every 50 ms while it sat in
  the stream, by dedup id; plus the scaler's ledger of successful invocations) against what the learner
  acked (the job's dedup record, `nitro:{job}:seen`) and what the round reports account for (batches
  trained = env_steps / steps_per_actor, plus on-policy stale drops; Stellaris: learner outcomes).
  batches_lost = produced but never acked + acked but in no report + successful invocations whose batch
  nobody saw + (Stellaris) counted but never given a learner outcome. duplicates_trained = batches the
  reports account for beyond the distinct batches acked + (Stellaris) learner outcomes beyond the batches
  counted. batches_discarded (accounted for by the reports, by design) = on-policy stale drops, Stellaris
  updates dropped as too stale, skipped, or whose learner function failed; batches_untrained = produced
  minus those whose learning the final policy holds (trained; Stellaris: updates applied), lost or not.
- recovery_seconds: from the fault (the kill; for scaler_hang the SIGCONT) to the first round report
  after it; fault_to_round_seconds the same from the fault's start (the SIGSTOP).
- Reference, same job: reference_round_seconds, the median wall time between consecutive round
  reports untouched by the fault; recovery_ratio = recovery_seconds / reference_round_seconds.

Target: every job completes, 0 lost, 0 duplicates, recovery_seconds <= 30 for every cell. Progress goes
to stderr; the last stdout line is one JSON object keyed by loop and fault kind.

    .venv/bin/python bench/faults_recovery.py                                 # all 15 cells, ~20-30 min
    .venv/bin/python bench/faults_recovery.py --loops ppo --faults detector   # one cell
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402
import redis  # noqa: E402

from nitro.client.sdk import NitroRpcError  # noqa: E402
from nitro.contracts import (  # noqa: E402
    scaler_state_key,  # noqa: E402
    seen_key,
    stream_key,
)
from nitro.local import system_state  # noqa: E402
from nitro.rpc.metrics import sample_value, scrape  # noqa: E402
from nitro.tools.faultkit import (  # noqa: E402
    all_serving,
    busy_worker,
    client_of,
    component,
    kill,
    redis_of,
    supervised,
    wait_until,
)

LOOPS = {
    "ppo": {},
    "impact": {"algo": "impact"},
    "stellaris": {"learner_mode": "stellaris", "stellaris": {"max_learners": 2, "learner_memory_mb": 1024}},
}
FAULTS = ("worker", "redis", "detector", "scaler_hang", "learner")
COMPONENT = {"worker": "lambda", "redis": "redis", "detector": "detector", "scaler_hang": "scaler",
             "learner": "learner"}
FAULT_AFTER_ROUND = 1  # the fault lands in the round after this one's report
HANG_S = 20.0
TARGET = {"completed": True, "batches_lost": 0, "duplicates_trained": 0, "recovery_seconds_max": 30.0}
T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[faults_recovery {time.monotonic() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def spec(loop: str, job_id: str, args) -> dict:
    return {"env_id": "CartPole-v1", "preset": "fast", "rounds": args.rounds, "steps_per_actor": args.steps,
            "eval_episodes": 1, "budget_usd": 5.0, "seed": 11, "round_deadline_s": 60.0, "job_id": job_id,
            # nitro pinned to one count: the same actors every round, and the detector is asked every round
            # (a fixed plan never asks it, so a detector fault would land on nothing).
            "scaler": {"policy": "nitro", "i_min": args.actors, "i_max": args.actors},
            **LOOPS[loop]}


class StreamObserver(threading.Thread):
    """Every entry written to the job's trajectory stream, by dedup id, read while it sits there.

    Entries stay until the learner's commit acks them (seconds), so a 50 ms poll sees each one; a Redis
    outage only pauses it (reconnects)."""

    def __init__(self, state_dir: Path, job_id: str, poll_s: float = 0.05):
        super().__init__(daemon=True)
        self.state_dir, self.key, self.poll_s = state_dir, stream_key(job_id), poll_s
        self.seen: dict[str, float] = {}  # dedup id -> monotonic time first seen
        self.entries = 0  # entries seen, duplicates (retries) included
        self._halt = threading.Event()
        self._cursor = "0-0"

    def run(self) -> None:
        r = None
        while not self._halt.is_set():
            try:
                r = r or redis_of(self.state_dir)
                self.poll(r)
            except (redis.RedisError, OSError):
                r = None  # Redis restarting: reconnect on the next poll
            self._halt.wait(self.poll_s)

    def poll(self, r: redis.Redis) -> None:
        while True:
            resp = r.xread({self.key: self._cursor}, count=256)
            msgs = resp[0][1] if resp else []
            if not msgs:
                return
            for entry_id, fields in msgs:
                self._cursor = entry_id.decode()
                self.entries += 1
                inv = fields.get(b"inv", b"").decode()
                parts = int(fields.get(b"parts", b"1"))
                dedup = inv if parts == 1 else f"{inv}#{int(fields[b'part'])}/{parts}"
                self.seen.setdefault(dedup, time.monotonic())

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


class Follower(threading.Thread):
    """Round reports as they arrive, through the SDK's watch (it rides out a learner restart)."""

    def __init__(self, state_dir: Path, job_id: str):
        super().__init__(daemon=True)
        self.state_dir, self.job_id = state_dir, job_id
        self.arrivals: dict[int, float] = {}  # round -> monotonic arrival time
        self.error: str | None = None

    def run(self) -> None:
        try:
            with client_of(self.state_dir) as client:
                for rep in client.watch(self.job_id, from_round=max(self.arrivals, default=-1) + 1):
                    self.arrivals.setdefault(rep.round, time.monotonic())
        except NitroRpcError as exc:  # the learner stayed away past the watch's patience
            self.error = f"{type(exc).__name__}: {exc}"


def follow_to_end(state_dir: Path, job_id: str, timeout_s: float, arrivals: dict, on_fault=None) -> dict:
    """Follow the job until it ends; resume it once if it ends FAILED and resumable, as its message says.
    `on_fault(arrivals)` runs in this thread once round FAULT_AFTER_ROUND is reported."""
    out = {"resumed_by_hand": False, "watch_errors": []}
    deadline = time.monotonic() + timeout_s
    fault_done = on_fault is None
    while True:
        follower = Follower(state_dir, job_id)
        follower.arrivals = arrivals
        follower.start()
        while follower.is_alive() and time.monotonic() < deadline:
            if not fault_done and FAULT_AFTER_ROUND in arrivals:
                fault_done = True
                out.update(on_fault(arrivals))
            follower.join(0.1)
        if follower.error:
            out["watch_errors"].append(follower.error)
        status = job_status(state_dir, job_id)
        if status is not None and status.finished:
            if status.state_name == "FAILED" and saved_job(state_dir, job_id).get("resumable") \
                    and not out["resumed_by_hand"]:
                say(f"{job_id} FAILED, resumable ({status.message[:160]}); resuming it as the message says")
                with client_of(state_dir) as client:
                    client.resume(job_id)
                out["resumed_by_hand"] = True
                continue
            out["status"] = status
            return out
        if time.monotonic() > deadline:
            with client_of(state_dir) as client:  # so it does not run on into the next cell
                out["status"] = client.stop(job_id)
            out["timed_out"] = True
            return out
        time.sleep(1.0)  # the watch gave up while the learner was away: look again, as a user would


def job_status(state_dir: Path, job_id: str):
    try:
        with client_of(state_dir) as client:
            return client.get(job_id)
    except NitroRpcError:
        return None


def saved_job(state_dir: Path, job_id: str) -> dict:
    try:
        return json.loads((state_dir / "data" / "jobs" / job_id / "job.json").read_text())
    except (OSError, ValueError):
        return {}


# --- faults ---------------------------------------------------------------------------------------------------


def busy(proc: psutil.Process) -> bool:
    proc.cpu_percent(None)
    time.sleep(0.25)
    return proc.cpu_percent(None) > 20


def inject(state_dir: Path, fault: str, ref_gap: float) -> dict:
    """Land `fault` in the round under way; returns its start and end (monotonic) and where it landed."""
    mid = 0.4 * ref_gap  # into the round, past its launch
    if fault == "worker":
        endpoint = psutil.Process(component(state_dir, "lambda")["pid"])
        victim = wait_until(lambda: busy_worker(endpoint, "nitro-actor", min_cpu=5.0), 2 * ref_gap + 30,
                            "an actor invocation running", poll_s=0)
        t = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        return {"start": t, "end": t, "landed": f"actor worker pid {victim.pid} mid-invocation"}
    if fault == "detector":
        det = psutil.Process(component(state_dir, "detector")["pid"])
        seen_busy = False
        try:
            # At most 1.5 rounds (1 s on a machine whose rounds are shorter): a longer wait could outlast a
            # short job, and the kill would land after it ended.
            wait_until(lambda: busy(det), max(1.5 * ref_gap, 1.0), "the detector scoring", poll_s=0)
            seen_busy = True
        except AssertionError:
            pass
        t = time.monotonic()
        kill(state_dir, "detector")
        return {"start": t, "end": t, "landed": "detector mid-score" if seen_busy else "detector idle"}
    time.sleep(mid)
    if fault == "scaler_hang":
        t = time.monotonic()
        pid = kill(state_dir, "scaler", signal.SIGSTOP)
        try:
            time.sleep(HANG_S)
        finally:
            os.kill(pid, signal.SIGCONT)
        return {"start": t, "end": time.monotonic(), "landed": f"scaler stopped {HANG_S:g} s mid-round"}
    t = time.monotonic()
    kill(state_dir, COMPONENT[fault])
    return {"start": t, "end": t, "landed": f"{COMPONENT[fault]} killed mid-round"}


# --- accounting -------------------------------------------------------------------------------------------------


def settle(state_dir: Path, timeout_s: float = 60.0) -> bool:
    """Wait until no actor invocation is in flight, so a straggler still writing is counted."""
    def idle() -> bool:
        try:
            port = component(state_dir, "scaler")["metrics_port"]
            return sample_value(scrape(port)["nitro_actors_in_flight"], "nitro_actors_in_flight") == 0
        except (OSError, KeyError):
            return False
    try:
        wait_until(idle, timeout_s, "actor invocations to end", poll_s=0.5)
        return True
    except AssertionError:
        return False


def account(state_dir: Path, job_id: str, steps: int, observer: StreamObserver, reports: list) -> dict:
    r = redis_of(state_dir)
    try:
        observer.poll(r)
        acked = {m.decode() for m in r.zrange(seen_key(job_id), 0, -1)}
        billed = int(r.hget(scaler_state_key(job_id), "steps_billed") or 0)
        left = r.xlen(stream_key(job_id))
        try:
            pending = r.xpending(stream_key(job_id), "learner")["pending"]
        except redis.ResponseError:
            pending = 0
    finally:
        r.close()
    produced = set(observer.seen) | acked
    invocations_ok = billed // steps
    trained_steps = sum(rep.env_steps for rep in reports)
    trained = trained_steps // steps
    stale = sum(rep.stale_batches_dropped for rep in reports)
    accounted = trained + stale
    unacked = sorted(produced - acked)
    lost = len(unacked) + max(0, len(acked) - accounted) + max(0, invocations_ok - len(produced))
    dup = max(0, accounted - len(acked))
    discarded = {"stale_dropped": stale}
    in_model = trained  # batches whose learning the final policy holds
    if any(rep.learner_functions_launched for rep in reports):  # stellaris: every counted batch gets an outcome
        produced_u = sum(rep.gradients_produced for rep in reports)
        skipped = sum(rep.learner_functions_skipped for rep in reports)
        failed = sum(rep.learner_functions_failed for rep in reports)
        learned = produced_u + skipped + failed
        lost += max(0, trained - learned)
        dup += max(0, learned - trained)
        discarded.update(gradients_dropped=sum(rep.gradients_dropped for rep in reports), learner_skipped=skipped,
                         learner_failed=failed)
        in_model = sum(rep.gradients_applied for rep in reports)
    return {"batches_produced": len(produced), "actor_invocations_ok": invocations_ok,
            "stream_entries_seen": observer.entries, "batches_acked": len(acked), "batches_trained": trained,
            "batches_discarded": discarded, "batches_untrained": max(0, len(produced) - in_model), "batches_lost": lost, "duplicates_trained": dup,
            "unacked_examples": unacked[:5], "stream_left": left, "pending_left": pending,
            "trained_steps_match": trained_steps == trained * steps}


def reference_gap(arrivals: dict, fault: dict | None) -> float | None:
    """Median wall time between consecutive round reports, leaving out gaps the fault touched."""
    rounds = sorted(arrivals)
    after = first_after(arrivals, fault["end"]) if fault else None
    gaps = []
    for a, b in zip(rounds, rounds[1:]):
        ta, tb = arrivals[a], arrivals[b]
        touched = fault is not None and ta < (after if after is not None else float("inf")) and tb > fault["start"]
        if not touched:
            gaps.append(tb - ta)
    return statistics.median(gaps) if gaps else None


def first_after(arrivals: dict, t: float) -> float | None:
    later = [a for a in arrivals.values() if a > t]
    return min(later) if later else None


# --- one cell --------------------------------------------------------------------------------------------------


def run_cell(state_dir: Path, loop: str, fault: str, args) -> dict:
    job_id = f"fr-{loop}-{fault.replace('_', '-')}-{int(time.time())}"
    comp_name = COMPONENT[fault]
    restarts0 = component(state_dir, comp_name)["restarts"]["count"]
    observer = StreamObserver(state_dir, job_id)
    observer.start()
    arrivals: dict[int, float] = {}
    cell: dict = {"load_avg_1m": round(os.getloadavg()[0], 2)}
    t_start = time.monotonic()
    with client_of(state_dir) as client:
        client.start_training(spec(loop, job_id, args))
    say(f"{loop} x {fault}: job {job_id} started ({args.rounds} rounds, {args.actors} actors x {args.steps} steps)")

    def on_fault(arr: dict) -> dict:
        ref_gap = arr[FAULT_AFTER_ROUND] - arr.get(FAULT_AFTER_ROUND - 1, t_start)
        info = inject(state_dir, fault, ref_gap)
        info["round"] = max((k for k, t in arr.items() if t < info["start"]), default=-1) + 1
        say(f"{loop} x {fault}: fault landed in round {info['round']} ({info['landed']})")
        return {"fault": info}

    try:
        out = follow_to_end(state_dir, job_id, args.job_timeout, arrivals, on_fault)
    finally:
        settled = settle(state_dir)
        observer.stop()
    status = out.get("status")
    info = out.get("fault")
    with client_of(state_dir) as client:
        try:
            reports = list(client.watch(job_id))
        except NitroRpcError:
            reports = []
    cell["completed"] = bool(status is not None and status.state_name == "SUCCEEDED")
    cell["state"] = status.state_name if status is not None else "UNKNOWN"
    if not cell["completed"] and status is not None:
        cell["message"] = status.message[:300]
    cell.update(account(state_dir, job_id, args.steps, observer, reports))
    cell["rounds_reported"] = [rep.round for rep in reports] == list(range(args.rounds))
    if info is None:
        cell.update(recovery_seconds=None, note="the fault never landed (round 1 never reported)")
    else:
        after = first_after(arrivals, info["end"])
        ref = reference_gap(arrivals, info)
        rec = after - info["end"] if after is not None else None
        cell.update(
            landed=info["landed"], fault_round=info["round"],
            recovery_seconds=round(rec, 2) if rec is not None else None,
            fault_to_round_seconds=round(after - info["start"], 2) if after is not None else None,
            reference_round_seconds=round(ref, 2) if ref is not None else None,
            recovery_ratio=round(rec / ref, 2) if rec is not None and ref else None)
    cell["restarts"] = component(state_dir, comp_name)["restarts"]["count"] - restarts0
    cell["resumed_by_hand"] = out["resumed_by_hand"]
    cell["learner_resumed"] = any(rep.resumed for rep in reports)
    cell["fallback_plans"] = sum(rep.fallback_plan for rep in reports)
    cell["invocation_retries"] = sum(rep.invocation_retries for rep in reports)
    if not settled:
        cell["note"] = "actor invocations still in flight 60 s after the job ended"
    if out.get("timed_out"):
        cell["note"] = f"the job had not ended after {args.job_timeout:g} s"
    for n in (n for rep in reports for n in rep.notes if any(w in n for w in ("fail", "fallback", "resum",
                                                                                  "unavailable", "retr", "gave up"))):
        say(f"{loop} x {fault}: note: {n[:220]}")
    cell["meets_target"] = meets(cell)
    say(f"{loop} x {fault}: {json.dumps(cell)}")
    return cell


def meets(cell: dict) -> bool:
    rec = cell.get("recovery_seconds")
    return (cell["completed"] and cell["batches_lost"] == 0 and cell["duplicates_trained"] == 0
            and rec is not None and rec <= TARGET["recovery_seconds_max"])


def ensure_up(state_dir: Path, args) -> None:
    """Every component serving (a restarted one included) before the next cell; a stopped system is brought up."""
    if system_state.running_state(state_dir) is None:
        say(f"the local system is down ({system_state.last_failure(state_dir) or 'no reason logged'}); bringing it up")
        system_state.shutdown(state_dir)
        supervised(state_dir, "--concurrency", str(args.concurrency))
    wait_until(lambda: all_serving(state_dir), 120, "every component serving", poll_s=0.5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loops", default=",".join(LOOPS), help=f"comma-separated subset of {','.join(LOOPS)}")
    ap.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated subset of {','.join(FAULTS)}")
    ap.add_argument("--rounds", type=int, default=6, help="rounds per job (the fault lands in round 2)")
    ap.add_argument("--actors", type=int, default=2, help="fixed actors per round")
    ap.add_argument("--steps", type=int, default=2000, help="CartPole steps per actor (about a second)")
    ap.add_argument("--concurrency", type=int, default=6, help="the endpoint's concurrency (actors + learners)")
    ap.add_argument("--job-timeout", type=float, default=600.0, help="seconds a job may take, faults included")
    ap.add_argument("--state-dir", default=None, help="the local system's state dir (default: a temp dir)")
    args = ap.parse_args(argv)
    loops, faults = args.loops.split(","), args.faults.split(",")
    bad = [x for x in loops if x not in LOOPS] + [x for x in faults if x not in FAULTS]
    if bad or args.rounds < FAULT_AFTER_ROUND + 3:
        ap.error(f"unknown loop/fault {bad}" if bad else f"--rounds must be >= {FAULT_AFTER_ROUND + 3}")
    tmp = None if args.state_dir else tempfile.TemporaryDirectory(prefix="nitro-faults-")
    state_dir = Path(args.state_dir or tmp.name).resolve()
    result: dict = {}
    try:
        say(f"starting the local system in {state_dir}")
        supervised(state_dir, "--concurrency", str(args.concurrency))
        for loop in loops:
            for fault in faults:
                ensure_up(state_dir, args)
                try:
                    cell = run_cell(state_dir, loop, fault, args)
                except Exception as exc:  # noqa: BLE001 - one broken cell is a finding; the others still run
                    say(f"{loop} x {fault}: the cell broke: {type(exc).__name__}: {exc}")
                    traceback.print_exc(file=sys.stderr)
                    cell = {"completed": False, "error": f"{type(exc).__name__}: {exc}"[:300], "batches_lost": None,
                            "duplicates_trained": None, "recovery_seconds": None, "meets_target": False}
                result.setdefault(loop, {})[fault] = cell
    finally:
        say("stopping the local system")
        system_state.shutdown(state_dir)
        if tmp is not None:
            tmp.cleanup()
    result["target"] = {**TARGET, "recovery_from": "the kill; for scaler_hang the SIGCONT"}
    result["config"] = {"env": "CartPole-v1", "preset": "fast", "rounds": args.rounds, "actors": args.actors,
                        "steps_per_actor": args.steps, "fault_in_round": FAULT_AFTER_ROUND + 1, "hang_s": HANG_S,
                        "load_avg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}
    result["meets_target"] = all(c["meets_target"] for lp in loops for c in [result[lp][f] for f in faults])
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
