"""The on-policy (PPO) round loop of DESIGN section 4: PipelinedLoop (pipelined.py) at depth 0.

Round k: its actors, launched with policy v when round k-1 closed -> ingest their batches from the stream
(until all arrived or the round deadline) -> update (`learn_round`) -> publish v+1 and the detector's sample
subset -> score -> the scaler plans round k+1 -> launch round k+1 with v+1 -> commit round k -> evaluate v+1 and
report round k while round k+1 samples. Round k+1 needs the policy round k's update made, so it launches as
soon as it can and no sooner: the pipeline's depth is 0. With evaluation functions the report waits for them
until round k+1 closes (`holds_reports`, docs/evaluation.md).

Faults: failed invocations are retried by the scaler with the same id; those
still failed, and successful ones whose batch never arrived, get a wave of
replacement invocations within budget while the round is short (up to
MAX_WAVES waves in all). At the deadline the round proceeds with what arrived
if that is at least min_sample_fraction of the planned steps. A resumed learner
takes over the waves its predecessor launched for the round it redoes (their
invocations outlive it) and waits for them like for its own launch while the
scaler still runs them (its invocation records, nitro.launches), then
LOST_BATCH_GRACE_S more; only their shortfall gets replacements, at once for
slots whose invocations the records show failed. A detector that does not answer
gives the configured fallback plan (RoundLoop.detector_fallback); a scaler or Redis
that is briefly down is retried. Every such event is a note in the round report.

Phase latencies are measured on the learner's critical path, so they stack up
to the round's wall time: `sample` is time spent waiting for actors, `ingest`
verifying/decoding/acking batches, `invoke` the scaler's dispatch time and the
next round's launch, `detect` the Score call (its own compute time is reported
separately as detector_seconds); the commit and the evaluation of round k run
while round k+1 samples, and on the cloud clock they are round k+1's.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import numpy as np

from learner_svc.constants import LOST_BATCH_GRACE_S, MAX_WAVES, ONPOLICY_READ, TAKEOVER_POLL_S
from learner_svc.pipelined import NOISE_TERMS, OpenRound, PipelinedLoop
from learner_svc.policy_owner import GradientLearner
from learner_svc.reporting import DIAGNOSTICS
from learner_svc.state import Ingest, PendingRound, Round, RoundStats
from nitro.algos.ppo import PPOLearner
from nitro.clock import critical_path_cpu_seconds
from nitro.contracts import NOISE_EMA, invocation_id
from nitro.cost import cloud_round_seconds
from nitro.launches import RoundStatus
from nitro.rpc import metrics
from nitro.scaling.noise import adascale_update, b_simple_of, ema_terms
from nitro.scaling.policies import scales_update
from nitro.v1 import detector_pb2, scaler_pb2

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
class OnPolicyStats(RoundStats):
    """What an on-policy round counts from its sampling to its update."""

    got: Collected | None = None
    rejected: int = 0
    duplicates: int = 0
    fields: dict = field(default_factory=dict)  # its RoundReport fields, once updated (learn_round)

    def means(self) -> dict[str, float]:
        return self.means_over(1)  # one update


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


class OnPolicyLoop(PipelinedLoop[OnPolicyStats]):
    """PPO's rounds: sample (collect every batch, replace what is missing), update, then PipelinedLoop's close."""

    learner_class = PPOLearner
    learner: GradientLearner
    # On-policy data is used only at the version it was sampled with: the newest version, and the one before
    # for the closed round's stragglers (their batches are dropped as stale; a late retry fails to load it).
    keep_versions = 2
    holds_reports = True  # evaluation functions run beside the next round; its close reports this one
    inherit_round: int | None = None  # the round a resumed learner redoes: its waves may be out already
    inherited: TakenOver | None = None  # the waves an earlier learner launched for the round about to sample
    # The policy gradient's |G|^2 and tr(Sigma), each averaged over the rounds so far ("noise-adascale" reads
    # their ratio); a resumed learner starts them again from its first round.
    policy_noise_terms: tuple[float, float] | None = None

    # -- sampling ---------------------------------------------------------------------------
    def _collect(self, rnd: Round, phases: dict, cloud: dict) -> Collected:
        """Ingest the batches of the round's launched wave (or of the waves taken over: `inherited`); replace
        failures while below the minimum.

        A round a learner before this one launched already (`inherit_round`) is not launched again: its waves
        are waited for like a launch whose response is lost, and their batches (pending or still to come)
        used; a second launch would be billed and, arriving after the round closed, dropped as stale.
        `cloud` gets the modelled sampling time (the waves' slowest invocations, those of inherited waves
        unknown: their responses died with that learner) and the learner's CPU."""
        actors = rnd.actors
        out = Collected(batches=[], launched=actors)
        spec = self.spec
        expected_steps = actors * spec.steps_per_actor
        batches: dict[str, dict] = {}  # dedup id -> batch: every in-version batch (or part) of this round is used
        t0, cpu0 = time.perf_counter(), critical_path_cpu_seconds()
        processed_before, ack_seconds, dispatch = self.reader.processing_seconds, 0.0, 0.0
        slots, failed_total = list(range(actors)), set()
        inherited, self.inherited = self.inherited, None
        wave = rnd.wave if rnd.waves else None  # launched when the round before closed (or by open)

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
                if wave is None:  # a replacement wave
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
            wave = None
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

    def _inherited_waves(self, k: int, actors: int) -> TakenOver | None:
        """The waves an earlier learner launched for round k, when this learner resumed into it; asked once,
        so a retried empty round launches afresh."""
        if self.inherit_round != k:
            return None
        self.inherit_round = None
        n, launched_at = self.launched_waves(k)
        if not n:
            return None
        # The ids those waves can have: every slot of each (replacement waves launch some of them).
        slot_of = {invocation_id(self.job.job_id, k, s, w): s for w in range(n) for s in range(actors)}
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

    # -- PipelinedLoop's hooks --------------------------------------------------------------------
    def restore(self) -> dict | None:
        pending = super().restore()
        self.inherit_round = self.next_round  # launched already if the learner before died after its launch
        return pending

    def new_round(self, k: int, actors: int) -> Round:
        # The ids of the waves launched or taken over count; only this round's batches of this version are kept.
        return Round(self.job.job_id, k, actors, self.version, on_policy=True, ids={})

    def launch_round(self, k: int, actors: int) -> Round:
        """Launch round k, or take over the waves an earlier learner launched for it (sample_round waits for
        them): a second launch would be billed and its batches dropped as stale."""
        self.inherited = self._inherited_waves(k, actors)
        if self.inherited is None:
            return super().launch_round(k, actors)
        metrics.set_job(metrics.ACTORS_PER_ROUND, self.job.job_id, actors)
        return self.new_round(k, actors)

    def sample_round(self, k: int) -> OpenRound[OnPolicyStats]:
        carried, self.carried = self.carried, {}
        rnd = OpenRound(self.launched, OnPolicyStats())
        got = rnd.stats.got = self._collect(rnd.launch, rnd.phases, rnd.cloud)
        rnd.stats.notes, rnd.stats.steps = got.notes, sum(len(b["rewards"]) for b in got.batches)
        rnd.stats.rejected, rnd.stats.duplicates = self.export_reader_counters(got.notes)
        # The round before's commit and evaluation ran on the learner while this round's actors sampled: on the
        # cloud clock only what outlasted the sampling is on this round's critical path ("sample" stays the
        # actors' time, which the scaler plans from).
        overlapped = sum(carried.values())
        beyond = max(0.0, overlapped - got.cloud_seconds) / overlapped if overlapped else 0.0
        for phase in ("publish", "evaluate"):
            rnd.cloud[phase] = rnd.cloud.get(phase, 0.0) + carried.get(phase, 0.0) * beyond
        return rnd

    def abandons(self, rnd: OpenRound[OnPolicyStats]) -> bool:
        """Abandoned mid-sampling (or with nothing to train on): the last checkpoint is the previous round."""
        return len(rnd.stats.got.batches) < rnd.launch.actors or rnd.stats.steps == 0

    def is_empty(self, rnd: OpenRound[OnPolicyStats]) -> bool:
        return rnd.stats.steps == 0

    def learn_round(self, k: int, rnd: OpenRound[OnPolicyStats]) -> None:
        """The PPO update on the round's batches; its report fields go into the round's stats."""
        spec, acc, phases, cloud = self.spec, rnd.stats, rnd.phases, rnd.cloud
        got, actors = acc.got, rnd.launch.actors
        expected_steps = actors * spec.steps_per_actor
        steps = acc.steps
        if steps < spec.min_sample_fraction * expected_steps:
            acc.notes.append(f"below min_sample_fraction after replacements: training on {steps}/{expected_steps} steps")
        elif steps < expected_steps:
            acc.notes.append(f"proceeding with {steps}/{expected_steps} steps "
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
        for name in ("policy_loss", "value_loss", "kl", "gradient_noise_scale", *NOISE_TERMS):
            acc.add(name, float(getattr(stats, name)))
        acc.fields = {
            "round": k, "policy_version": behaviour_version, "actors_launched": actors,
            "actors_completed": got.completed, "actors_failed": got.failed, "actors_replaced": got.replaced,
            "env_steps": steps, "total_env_steps": self.total_steps, "invocation_retries": got.retries,
            "duplicates_dropped": acc.duplicates + got.duplicates, "rejected_batches": acc.rejected,
            "stale_batches_dropped": got.stale, "cloud_actor_cost_usd": got.cloud_cost_usd,
            "policy_loss": stats.policy_loss, "value_loss": stats.value_loss, "entropy": stats.entropy,
            "kl": stats.kl, "gradient_noise_scale": stats.gradient_noise_scale,
            "learning_rate": stats.learning_rate, "minibatch_size": stats.minibatch_size,
            **{name: float(getattr(stats, name)) for name in NOISE_TERMS},
            **{key: float(getattr(stats, name)) for key, name in DIAGNOSTICS.items()}, "kl_coeff": stats.kl_coeff,
        }

    def pending_parts(self, k: int, rnd: OpenRound[OnPolicyStats]) -> tuple[dict, list[str], dict]:
        return rnd.stats.fields, list(rnd.stats.notes), {}

    def settlement(self, rnd: OpenRound[OnPolicyStats]) -> tuple[list, None]:
        return rnd.stats.got.entries, None

    def pending_round(self, pending: dict) -> PendingRound:
        return super().pending_round(pending) if "plan" in pending else self._pending_of_old(pending)

    def _pending_of_old(self, old: dict) -> PendingRound:
        """The pending round of a checkpoint written before this loop closed through PipelinedLoop: the update's
        report fields, its phases and notes, no score or plan. Its close is finished the way that learner would
        have: its sample subset died with it, so a policy that reads the score falls back; then round k+1 is
        planned from the round."""
        k, notes = old["round"], list(old["notes"])
        phases, cloud = dict(old["phases"]), dict(old.get("cloud_phases", {}))
        fallback = self.detector_fallback("no sample subset (round finished after a resume)", notes) \
            if self.scores else 0
        last = self.plan_inputs(cloud, loss=old["policy_loss"] + old["value_loss"], kl=old["kl"],
                                eval_return=math.nan, env_steps=old["env_steps"],
                                **{name: old.get(name, 0.0) for name in NOISE_TERMS})
        next_plan = self.plan(k + 1, 0.0, old["gradient_noise_scale"], fallback, last,
                              cloud_seconds=cloud_round_seconds(cloud))
        # Absent from checkpoints written before the diagnostics (and the round's own actor bill) were reported.
        fields = {key: old[key] for key in (
            "round", "policy_version", "actors_launched", "actors_completed", "actors_failed", "actors_replaced",
            "env_steps", "total_env_steps", "invocation_retries", "duplicates_dropped", "rejected_batches",
            "stale_batches_dropped", "policy_loss", "value_loss", "entropy", "kl", "gradient_noise_scale")}
        fields.update({key: old.get(key, 0.0) for key in (*DIAGNOSTICS, "kl_coeff", "cloud_actor_cost_usd",
                                                          "learning_rate", *NOISE_TERMS)})
        fields["minibatch_size"] = int(old.get("minibatch_size", 0))
        return PendingRound(round=k, fields=fields, score=detector_pb2.ScoreResponse().SerializeToString(),
                            plan=next_plan.SerializeToString(), notes=notes, fallback=fallback, cloud=cloud,
                            phases=phases, t=old["t_round"],
                            ending=k + 1 >= self.spec.rounds or next_plan.budget_exhausted)
