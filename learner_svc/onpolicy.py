"""The on-policy (PPO) round loop of DESIGN section 4.

Round k: launch the planned actors with policy v -> ingest their batches from
the stream (until all arrived or the round deadline) -> update -> publish v+1
and the detector's sample subset -> [detector scores v+1 while the learner
checkpoints and evaluates it] -> the scaler plans round k+1 -> report.

Faults: failed invocations are retried by the scaler with the same id; those
still failed, and successful ones whose batch never arrived, get a wave of
replacement invocations within budget while the round is short (up to
MAX_WAVES waves in all). At the deadline the round proceeds with what arrived
if that is at least min_sample_fraction of the planned steps. A resumed learner
takes over the waves its predecessor launched for the round it redoes (their
invocations outlive it) and waits for them like for its own launch while the
scaler still runs them (its invocation records, nitro.launches), then
LOST_BATCH_GRACE_S more; only their shortfall gets replacements, at once for
slots whose invocations the records show failed. A detector that does not answer in
detector_timeout_s gives the configured fallback plan; a scaler or Redis that
is briefly down is retried. Every such event is a note in the round report.

Phase latencies are measured on the learner's critical path, so they stack up
to the round's wall time: `sample` is time spent waiting for actors, `ingest`
verifying/decoding/acking batches, `invoke` the scaler's dispatch time,
`detect` only the wait for the detector after evaluation finished (its own
compute time is reported separately as detector_seconds).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import grpc
import numpy as np

from learner_svc.collector import Collector
from learner_svc.constants import DRAIN_STOP_REASON, LOST_BATCH_GRACE_S, MAX_WAVES, ONPOLICY_READ, TAKEOVER_POLL_S
from learner_svc.policy_owner import GradientLearner
from learner_svc.reporting import DIAGNOSTICS, add_evaluation
from learner_svc.rounds import End, RoundLoop
from learner_svc.state import Ingest, Round
from nitro.algos.ppo import PPOLearner
from nitro.clock import critical_path_cpu_seconds
from nitro.contracts import NOISE_EMA, invocation_id
from nitro.cost import cloud_detect_wait, cloud_round_seconds
from nitro.launches import RoundStatus
from nitro.rpc import metrics
from nitro.scaling.noise import adascale_update, b_simple_of, ema_terms
from nitro.scaling.policies import scales_update
from nitro.v1 import detector_pb2, scaler_pb2, training_pb2

log = logging.getLogger(__name__)

@dataclass
class Collected:
    batches: list[dict]
    launched: int
    failed: int = 0
    replaced: int = 0
    retries: int = 0
    completed: int = 0  # invocations whose whole batch (every part) arrived
    stale: int = 0
    stale_steps: int = 0
    duplicates: int = 0
    waves: int = 0
    cloud_seconds: float = 0.0  # modelled sampling time: each wave's slowest invocation, waves in sequence
    cloud_cost_usd: float = 0.0  # modelled Lambda bill of the round's waves (the report's cloud_actor_cost_usd)
    entries: list = field(default_factory=list)  # kept stream entries, acked after the checkpoint
    notes: list[str] = field(default_factory=list)


@dataclass
class SampledRound:
    """An on-policy round from its launch to its update."""

    k: int
    actors: int  # planned
    t_round: float  # perf_counter when the round began
    got: Collected | None = None
    phases: dict[str, float] = field(default_factory=dict)
    cloud: dict[str, float] = field(default_factory=dict)  # the same phases on the cloud clock (docs/cost.md)
    rejected: int = 0
    duplicates: int = 0

    @property
    def steps(self) -> int:
        return sum(len(b["rewards"]) for b in self.got.batches)


def takeover_wait_end(*, started: float, launched_at: float | None, deadline_s: float,
                      stopped_at: float | None) -> float:
    """When a resumed learner stops waiting for the waves an earlier learner launched (wall-clock times).

    Their own round deadline, counted from their launch (`launched_at`, else from `started`), but at least
    LOST_BATCH_GRACE_S to read what is in the stream already. Once no wave runs any more (`stopped_at`:
    when this learner first saw none of their leases alive; None while one is), LOST_BATCH_GRACE_S more
    for their last batches, never past that deadline."""
    deadline = max((launched_at or started) + deadline_s, started + LOST_BATCH_GRACE_S)
    return deadline if stopped_at is None else min(deadline, stopped_at + LOST_BATCH_GRACE_S)


@dataclass
class TakenOver:
    """The waves an earlier learner launched for the round a resumed learner redoes.

    Their invocations outlive that learner, but not the scaler that runs them: the scaler's invocation
    records (nitro.launches) say which still run under a live Launch and which returned failed. After a
    crash of the whole system none runs, and the round goes on after LOST_BATCH_GRACE_S instead of waiting
    out the round deadline for nothing; slots whose every invocation failed are replaced at once. On AWS a
    Lambda may outlive a dead scaler: the learner replaces it after the grace and drops its late batch as
    stale."""

    count: int
    launched_at: float | None  # wall time of the latest launch
    deadline_s: float
    slot_of: dict[str, int]  # the ids their invocations can have -> slot
    status: Callable[[], RoundStatus]  # from their records
    started: float = field(default_factory=time.time)
    stopped_at: float | None = None
    failed: frozenset[int] = frozenset()  # slots whose every invocation returned failed
    checked_at: float = -math.inf

    def deadline(self) -> float:
        """The perf_counter time to stop waiting; reads `status` at most every TAKEOVER_POLL_S."""
        now = time.time()
        if now - self.checked_at >= TAKEOVER_POLL_S:
            self.checked_at = now
            st = self.status()
            self.failed = st.failed
            self.stopped_at = None if st.running else (self.stopped_at or now)
        end = takeover_wait_end(started=self.started, launched_at=self.launched_at, deadline_s=self.deadline_s,
                                stopped_at=self.stopped_at)
        return time.perf_counter() + end - now

    def all_failed(self, waiting: set[int]) -> bool:
        """Nothing runs any more and every slot still waited for failed: replace them now."""
        return self.stopped_at is not None and waiting <= self.failed


class OnPolicyLoop(RoundLoop[SampledRound]):
    """PPO's rounds: sample (launch, collect every batch, replace what is missing), update, finish."""

    learner_class = PPOLearner
    learner: GradientLearner
    # On-policy data is used only at the version it was sampled with: the newest version, and the one before
    # for the closed round's stragglers (their batches are dropped as stale; a late retry fails to load it).
    keep_versions = 2
    inherit_round: int | None = None  # the round a resumed learner redoes: its waves may be out already
    next_plan: scaler_pb2.PlanResponse  # the plan of the round about to begin
    # The policy gradient's |G|^2 and tr(Sigma), each averaged over the rounds so far ("noise-adascale" reads
    # their ratio); a resumed learner starts them again from its first round.
    policy_noise_terms: tuple[float, float] | None = None

    def __init__(self, job, deps):
        super().__init__(job, deps)
        self.collector = Collector(self)
        self.held: tuple[training_pb2.RoundReport, Future] | None = None  # a report waiting for its evaluation

    # -- sampling ---------------------------------------------------------------------------
    def _collect(self, k: int, actors: int, phases: dict, cloud: dict) -> Collected:
        """Launch the round's actors and ingest their batches; replace failures while below the minimum.

        A round a learner before this one launched already (`inherit_round`) is not launched again: its waves
        are waited for like a launch whose response is lost, and their batches (pending or still to come)
        used; a second launch would be billed and, arriving after the round closed, dropped as stale.
        `cloud` gets the modelled sampling time (the waves' slowest invocations, those of inherited waves
        unknown: their responses died with that learner) and the learner's CPU."""
        out = Collected(batches=[], launched=actors)
        spec = self.spec
        expected_steps = actors * spec.steps_per_actor
        # The ids of the waves launched or taken over count; only this round's batches of this version are kept.
        rnd = Round(self.job.job_id, k, actors, self.version, on_policy=True, ids={})
        batches: dict[str, dict] = {}  # dedup id -> batch: every in-version batch (or part) of this round is used
        t0, cpu0 = time.perf_counter(), critical_path_cpu_seconds()
        processed_before, ack_seconds, dispatch = self.reader.processing_seconds, 0.0, 0.0
        slots, failed_total = list(range(actors)), set()
        inherited = self._inherited_waves(k, slots)

        def account(resp: scaler_pb2.LaunchResponse) -> None:
            nonlocal dispatch
            dispatch += resp.dispatch_seconds
            out.retries += resp.retries
            out.cloud_seconds += resp.cloud_seconds
            out.cloud_cost_usd += resp.cloud_cost_usd

        while True:
            if inherited is not None:  # every slot is out already; no response will come for them
                taken, inherited, wave = inherited, None, None
                rnd.slots.ids.update(taken.slot_of)
                label = f"the {taken.count} wave(s) launched before the learner restarted"
                out.waves += 1  # as the round's planned launch: its shortfall still gets replacement waves
                wave_deadline = taken.deadline()
            else:
                taken = None
                wave = self.collector.launch(rnd, slots, spec.round_deadline_s)
                out.waves += 1
                label = f"wave {wave.number}"
                wave_deadline = wave.deadline
            wave_began = time.perf_counter()

            def done() -> bool:
                nonlocal wave_deadline
                if taken is not None:
                    wave_deadline = taken.deadline()
                waiting, now = rnd.missing(slots), time.perf_counter()
                # All in; or the rest failed, or their batches were lost after the invocation said OK; or the
                # waves taken over ended and the rest failed (replaced without waiting); or the deadline.
                return (not waiting or now >= wave_deadline or (wave is not None and wave.closed(waiting, now))
                        or (taken is not None and taken.all_failed(waiting)))

            def keep(entries, pumped) -> None:
                drop = []
                for e, outcome in entries:  # the reader verified each batch with its job's key
                    if outcome is Ingest.KEPT:
                        batches[e.dedup_id] = e.batch
                        out.entries.append(e)  # unacked until the round's commit (RoundLoop.commit)
                    else:  # a duplicate, or a straggler of an earlier round or policy version: on-policy only
                        drop.append(e)
                if drop:  # acked with the next read: never learned from, they are dropped again after a crash
                    pumped.timed("ingest", self.redis_call, lambda: self.reader.ack(drop, defer=True), "stream ack")

            pumped = self.collector.pump(rnd, done, keep, read=ONPOLICY_READ, notes=out.notes, on_response=account)
            ack_seconds += pumped.counted.get("ingest", 0.0)
            missing_now = rnd.missing(slots)
            if taken is not None:
                gone = ", their actors no longer running" if taken.stopped_at is not None else ""
                out.notes.append(f"took over {label}: {actors - len(rnd.missing())}/{actors} batches in "
                                 f"{time.perf_counter() - wave_began:.1f} s{gone}")
                failed = set(taken.failed) if taken.all_failed(missing_now) else set()
            else:
                if wave.resp is None and not missing_now:
                    try:  # every batch is in: the invocations are returning, collect their retry counts
                        wave.future.result(timeout=2.0)
                        if (resp := wave.poll(rnd.slots.slot, out.notes)) is not None:
                            account(resp)
                    except Exception:  # noqa: BLE001 - bookkeeping only; the data is already here
                        pass
                if wave.resp is None and missing_now and not self.job.stop_requested.is_set():
                    out.notes.append(f"{label}: round deadline ({spec.round_deadline_s:g} s) passed with "
                                     f"{len(slots) - len(missing_now)}/{len(slots)} batches")
                failed = wave.failed
            failed_total |= failed - rnd.covered
            missing = sorted(rnd.missing())
            steps = sum(len(b["rewards"]) for b in batches.values())
            if not missing or self.job.stop_requested.is_set() or steps >= spec.min_sample_fraction * expected_steps:
                break
            if out.waves >= MAX_WAVES:
                out.notes.append(f"{len(missing)} actor(s) missing after {out.waves} waves")
                break
            slots = self._affordable(missing)
            if not slots:
                out.notes.append(f"{len(missing)} actor(s) missing and no replacement is affordable")
                break
            out.replaced += len(slots)
            out.notes.append(f"only {steps}/{expected_steps} steps: launching {len(slots)} replacement actor(s)")
        wall = time.perf_counter() - t0
        ingest = self.reader.processing_seconds - processed_before + ack_seconds
        out.failed = len(failed_total)
        invoke = min(dispatch, max(0.0, wall - ingest))
        metrics.observe_phase("invoke", invoke, phases)
        metrics.observe_phase("ingest", ingest, phases)
        metrics.observe_phase("sample", max(0.0, wall - ingest - invoke), phases)
        cloud["sample"] = cloud.get("sample", 0.0) + out.cloud_seconds
        cloud["ingest"] = cloud.get("ingest", 0.0) + max(0.0, critical_path_cpu_seconds() - cpu0)
        out.batches = [batches[i] for i in sorted(batches)]
        out.completed = rnd.slots.completed
        out.stale, out.stale_steps, out.duplicates = rnd.stale, rnd.stale_steps, rnd.duplicates
        return out

    def _inherited_waves(self, k: int, slots: list[int]) -> TakenOver | None:
        """The waves an earlier learner launched for round k, when this learner resumed into it; asked once,
        so a retried empty round launches afresh."""
        if self.inherit_round != k:
            return None
        self.inherit_round = None
        n, launched_at = self.launched_waves(k)
        if not n:
            return None
        # The ids those waves can have: every slot of each (replacement waves launch some of them).
        slot_of = {invocation_id(self.job.job_id, k, s, w): s for w in range(n) for s in slots}
        return TakenOver(n, launched_at, self.spec.round_deadline_s, slot_of, lambda: self.launch_status(k, slot_of))

    def _affordable(self, slots: list[int]) -> list[int]:
        """As many of `slots` as the budget left pays for, at this job's mean cost per invocation."""
        try:
            cost = self.cost()
        except grpc.RpcError:
            return []
        spent = cost.cloud_actor_cost_usd if cost.budget_clock == "cloud" else cost.actor_cost_usd
        per_actor = spent / cost.invocations if cost.invocations else 0.0
        if per_actor <= 0:
            return slots
        return slots[:int(max(0.0, cost.budget_left_usd) // per_actor)]

    # -- the hooks of RoundLoop.train ------------------------------------------------------------
    def open(self, resume: bool) -> End | None:
        if resume:
            pending = self.restore()
            self.inherit_round = self.next_round
            self.resumed = True
            if pending is not None:  # died after the update, before the report: finish that round
                k = self.next_round - 1
                self.publish()
                report, self.next_plan, evaluation = self._finish_round(k, pending)
                self._report(report, evaluation)
                return None
            self.publish()
            self.next_plan = self.plan(self.next_round, self.last_score(), 0.0)
            return None
        self.publish()
        self.next_plan = self.plan(0, 0.0, 0.0)
        return None

    def end_before_round(self, k: int) -> End | None:
        end = self.end_after(k, math.nan, self.next_plan)  # rounds and budget (a resumed job may be at its end)
        if end is not None:
            return end
        if self.job.stop_requested.is_set():
            return End(training_pb2.JOB_STATE_STOPPED, f"stopped: {self.job.stop_reason}")
        return None

    def sample_round(self, k: int) -> SampledRound:
        actors = self.next_plan.actors
        rnd = SampledRound(k=k, actors=actors, t_round=time.perf_counter())
        metrics.set_job(metrics.ACTORS_PER_ROUND, self.job.job_id, actors)
        rnd.got = self._collect(k, actors, rnd.phases, rnd.cloud)
        rnd.rejected, rnd.duplicates = self.export_reader_counters(rnd.got.notes)
        return rnd

    def abandons(self, rnd: SampledRound) -> bool:
        """Abandoned mid-sampling (or with nothing to train on): the last checkpoint is the previous round."""
        return len(rnd.got.batches) < rnd.actors or rnd.steps == 0

    def is_empty(self, rnd: SampledRound) -> bool:
        return rnd.steps == 0

    def close_round(self, k: int, rnd: SampledRound) -> End | None:
        pending = self._learn(k, rnd)
        # Round k-1's evaluation ran while this round sampled and updated: its report goes out now, before
        # round k's commit replaces the checkpoint it evaluated (best.pt is copied from it).
        self._report_held(pending)
        report, self.next_plan, evaluation = self._finish_round(k, pending, to_ack=rnd.got.entries)
        if evaluation is None or evaluation.done():
            self._report(report, evaluation)
        else:
            self.held = (report, evaluation)
        return self.end_after(k + 1, self.last_eval(math.nan), self.next_plan)

    def settle(self) -> None:
        if self.held is not None and self.job.stop_reason == DRAIN_STOP_REASON:
            # Not waited for: the held round is the checkpoint's unreported one, which the resume finishes.
            log.info("job %s: round %d's report waits for the resume (its evaluation was running)",
                     self.job.job_id, self.held[0].round)
            self.held = None
            return
        self._report_held(None)

    def _report_held(self, pending: dict | None) -> None:
        """Report the round held back for its evaluation; the wait (normally none: it ran beside this round)
        counts in this round's `pending` phases, on the cloud clock only as far as the evaluation functions
        outlast this round so far."""
        if self.held is None:
            return
        (report, evaluation), self.held = self.held, None
        t0 = time.perf_counter()
        result = evaluation.result()
        if pending is not None:
            phases, cloud = pending["phases"], pending["cloud_phases"]
            phases["evaluate"] = phases.get("evaluate", 0.0) + (time.perf_counter() - t0)
            cloud["evaluate"] = cloud.get("evaluate", 0.0) + max(0.0, result.cloud_seconds - cloud_round_seconds(cloud))
        self._report(report, evaluation)

    def _report(self, report: training_pb2.RoundReport, evaluation) -> None:
        """Append a round's report with its evaluation (waited for)."""
        if evaluation is not None:
            add_evaluation(report, evaluation.result())
        log.info("job %s round %d: actors %d steps %d eval %s score %.3f cost $%.4f (%.2fs)%s", self.job.job_id,
                 report.round, report.actors_launched, report.env_steps,
                 f"{report.eval_return:.1f}" if report.evaluated else "-", report.score, report.total_cost_usd,
                 report.round_seconds, f" notes: {list(report.notes)}" if report.notes else "")
        self.append_report(report)

    def _learn(self, k: int, rnd: SampledRound) -> dict:
        """Update on the round's batches; the round's pending report (what the checkpoint keeps of it)."""
        spec, got, phases, cloud = self.spec, rnd.got, rnd.phases, rnd.cloud
        actors = rnd.actors
        expected_steps = actors * spec.steps_per_actor
        steps = rnd.steps
        if steps < spec.min_sample_fraction * expected_steps:
            got.notes.append(f"below min_sample_fraction after replacements: training on {steps}/{expected_steps} steps")
        elif steps < expected_steps:
            got.notes.append(f"proceeding with {steps}/{expected_steps} steps "
                             f"(min_sample_fraction {spec.min_sample_fraction:g})")
        behaviour_version = self.version
        for b in got.batches:
            self.note_episodes(b)

        minibatch, lr_factor = None, 1.0
        if scales_update(spec.scaler.policy):  # "noise-adascale": the update grows with the round
            cfg = self.learner.config
            minibatch, lr_factor = adascale_update(steps, cfg.batch_size, cfg.minibatch_size,
                                                   b_simple_of(self.policy_noise_terms))
        with metrics.timed("update", phases, cloud):
            stats = self.learner.update(got.batches, minibatch_size=minibatch, lr_factor=lr_factor)
            self.learner.policy.update_obs_stats(np.concatenate([b["obs"] for b in got.batches]))
        measured = (stats.policy_grad_sq, stats.policy_trace_sigma)
        self.policy_noise_terms = ema_terms(self.policy_noise_terms, measured if any(measured) else None, NOISE_EMA)
        self.total_steps += steps
        metrics.ENV_STEPS.inc(steps)
        self.version += 1
        return {
            "round": k, "policy_version": behaviour_version, "actors_launched": actors,
            "actors_completed": got.completed, "actors_failed": got.failed, "actors_replaced": got.replaced,
            "env_steps": steps, "total_env_steps": self.total_steps, "invocation_retries": got.retries,
            "duplicates_dropped": rnd.duplicates + got.duplicates, "rejected_batches": rnd.rejected,
            "stale_batches_dropped": got.stale, "cloud_actor_cost_usd": got.cloud_cost_usd,
            "policy_loss": stats.policy_loss, "value_loss": stats.value_loss, "entropy": stats.entropy,
            "kl": stats.kl, "gradient_noise_scale": stats.gradient_noise_scale, "notes": got.notes[:50],
            "policy_noise_scale": stats.policy_noise_scale, "learning_rate": stats.learning_rate,
            "policy_grad_sq": stats.policy_grad_sq, "policy_trace_sigma": stats.policy_trace_sigma,
            "minibatch_size": stats.minibatch_size,
            **{key: float(getattr(stats, name)) for key, name in DIAGNOSTICS.items()}, "kl_coeff": stats.kl_coeff,
            "phases": dict(phases), "cloud_phases": dict(cloud),
            "t_round": time.time() - (time.perf_counter() - rnd.t_round),
        }

    def _finish_round(self, k: int, pending: dict, to_ack: list | None = None):
        """Publish, checkpoint, score, start the evaluation, plan the next round, build the report; the report
        (its evaluation still to fill in), the plan and the evaluation's Future (None: not evaluated)."""
        phases = dict(pending["phases"])
        cloud = dict(pending.get("cloud_phases", {}))
        notes = list(pending["notes"])
        resumed = self.take_resumed(notes)
        with metrics.timed("publish", phases, cloud):
            self.publish()
            ref = self.write_sample_subset(k)
            # The detector scores and the round is committed (checkpoint, then ack) while the learner evaluates.
            score_future = self.pool.submit(self.score, k, ref) if ref else None
            commit_future = self.pool.submit(self.commit, k, pending, to_ack or [])
        try:
            with metrics.timed("evaluate", phases, cloud):  # "functions": only its launch; "learner": all of it
                evaluation = self.start_evaluation(k)
        finally:  # even when evaluation fails: no commit may still be running (and holding an ack) after it
            with metrics.timed("publish", phases, cloud):
                commit_future.result()  # a round is reported only once it can be resumed from
        score_resp, fallback = detector_pb2.ScoreResponse(), 0
        with metrics.timed("detect", phases):  # ~0 s when the plan reads no score: nothing was asked
            try:
                if score_future is not None:
                    score_resp = score_future.result(timeout=self.spec.detector_timeout_s + 1.0)
                elif self.scores:
                    raise TimeoutError("no sample subset (round finished after a resume)")
            except (grpc.RpcError, TimeoutError) as exc:
                detail = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.RpcError) else str(exc)
                fallback = self.detector_fallback(detail, notes)
        # On the cloud the detector scores on the learner server while the learner evaluates (if it does).
        cloud["detect"] = cloud_detect_wait(score_resp.cpu_seconds, cloud.get("evaluate", 0.0))
        # The plan reads this round's return when it is in already (evaluation "learner"), else the latest one.
        eval_return = evaluation.result().eval_return if evaluation is not None and evaluation.done() else math.nan
        with metrics.timed("plan", phases):
            # A learned scheduler reads times on the cloud clock: they do not move with this machine's load.
            last = self.plan_inputs(cloud, loss=pending["policy_loss"] + pending["value_loss"], kl=pending["kl"],
                                    eval_return=eval_return, env_steps=pending["env_steps"],
                                    policy_noise_scale=pending.get("policy_noise_scale", 0.0),
                                    policy_grad_sq=pending.get("policy_grad_sq", 0.0),
                                    policy_trace_sigma=pending.get("policy_trace_sigma", 0.0))
            next_plan = self.plan(k + 1, score_resp.score, pending["gradient_noise_scale"], fallback, last,
                                  cloud_seconds=cloud_round_seconds(cloud))
        if next_plan.budget_exhausted and evaluation is None:  # the job's last round: always evaluated
            with metrics.timed("evaluate", phases, cloud):
                evaluation = self.start_evaluation(k, last=True)
        round_seconds = max(time.time() - pending["t_round"], sum(phases.values()))
        keep = {key: pending[key] for key in (
            "round", "policy_version", "actors_launched", "actors_completed", "actors_failed", "actors_replaced",
            "env_steps", "total_env_steps", "invocation_retries", "duplicates_dropped", "rejected_batches",
            "stale_batches_dropped", "policy_loss", "value_loss", "entropy", "kl", "gradient_noise_scale")}
        # Absent from the pending round of a checkpoint written before the diagnostics (and the round's own
        # actor bill) were reported.
        keep.update({key: pending.get(key, 0.0) for key in (*DIAGNOSTICS, "kl_coeff", "cloud_actor_cost_usd",
                                                            "policy_noise_scale", "learning_rate",
                                                            "policy_grad_sq", "policy_trace_sigma")})
        keep["minibatch_size"] = int(pending.get("minibatch_size", 0))
        report = training_pb2.RoundReport(
            **keep, resumed=resumed,
            **self.closing_report_fields(eval_return=math.nan, score_resp=score_resp, next_plan=next_plan,
                                         phases=phases, round_seconds=round_seconds, notes=notes,
                                         fallback=fallback, cloud_phases=cloud))
        return report, next_plan, evaluation
