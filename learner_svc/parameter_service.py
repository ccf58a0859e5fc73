"""learner_mode "stellaris": the learner service as Stellaris's parameter service, learners as serverless functions.

Names (docs/architecture.md, "Which learner"): here a learner is a learner function (actor_fn/learner_handler.py;
`learner_fn` in names); the loop's policy owner (RoundLoop.learner) is the parameter server, ParameterServer
of nitro.algos.stellaris, the algorithm's layer; this module is the service's.

The service keeps the authoritative policy and its version clock and computes
no gradients itself. Round k launches the planned actors with the current
version v_k through the scaler, as the other loops do (the detector and scaler
keep working: boosting still decides the actor count). Every trajectory batch
that arrives is parked in Redis as a signed parcel with the version current at
that moment (the learner's base) and a learner function is invoked for it on
demand, through the same scaler Launch (kind "learner"), so the cost model
bills it like an actor. Learner functions push signed updates to
nitro:{job}:learn:updates; whatever is queued there is aggregated with
staleness-aware weights, the updates launched from one base sharing one step,
too-stale updates are dropped (nitro.algos.stellaris), and each aggregation
that applies something advances the version clock by one and publishes that
version, which later learners start from. A base's staleness counts the
versions since it that applied another base's update (StalenessLedger), so the
learners launched from one base have the same staleness however their updates
are grouped into polls; the service writes it per base as a signed record
(learn:staleness) before each version it publishes. Each parcel carries the
round's staleness bound; a learner that starts when that record already puts
its base beyond the bound computes nothing and pushes a signed skip record
instead, counted as skipped in the round's notes.

Round k closes when its actors' batches are in, then the policy is scored,
round k+1 is planned and launched, and round k is evaluated and reported while
learners of round k still run; their updates are aggregated during round k+1,
staler by then. The pipeline is one round deep: round k+1's actors launch only
once the learners of rounds before k are done, so sampling never runs ahead of
learning by more than a round (without this, cold-starting learners let the
actors sample round after round with one stale version). The job's last round
waits for every learner in flight, so over a job's reports every update
produced is counted once, as applied or dropped. A learner invocation that
fails, or whose update never arrives, is counted in learner_functions_failed;
one that skipped, in the note (launched = produced + failed + skipped).

At most `max_learners` learner functions are in flight; further batches wait
in order and take the version current when their learner starts.

The round's skeleton is PipelinedLoop's (pipelined.py); this loop supplies its
event pump (`sample_round`), the drains and backpressure before the next
launch (`close_cloud`, `before_next_launch`) and its report's fields.

Durability (RoundLoop.commit): a batch is counted when it arrives but learned
from only once its learner's outcome is known (its update aggregated, applied
or dropped, its skip record read, or the learner failed); it is acked at the
first commit after that. A commit names the batches still waiting or with a
learner as counted: after a resume they are redelivered and get a learner
again without being counted twice, and the updates of learners the dead
process launched are discarded (their batches are being learned from again).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import numpy as np

from learner_svc.clients import derived_seed
from learner_svc.constants import (
    LOST_UPDATE_GRACE_S,
    MAX_LEARNER_THREADS,
    PIPELINED_READ,
    POLICY_TTL_S,
    UPDATE_STREAM_TTL_S,
)
from learner_svc.pipelined import OpenRound, PipelinedLoop
from learner_svc.policy_owner import ParameterAggregator
from learner_svc.reporting import DIAGNOSTICS
from learner_svc.state import Ingest, LaunchSummary, PendingRound, Round, RoundStats
from nitro.algos.ppo import collate, standardize_batch
from nitro.algos.stellaris import (
    ParameterServer,
    StalenessLedger,
    make_parcel,
    prepare,
    staleness_bound,
)
from nitro.contracts import (
    invocation_id,
    invocation_key,
    learn_counter_key,
    parcel_key,
    policy_key,
    staleness_record_key,
    update_stream_key,
)
from nitro.data import codec
from nitro.rpc import metrics
from nitro.spec import TrainingSpec
from nitro.stellaris_records import decode_update, encode_staleness_record
from nitro.v1 import scaler_pb2

log = logging.getLogger(__name__)


@dataclass
class StellarisStats(RoundStats):
    """What a Stellaris round counts while it is open (kept in the checkpoint of a closed round: `to_dict`)."""

    k: int = 0
    bound: int = 0  # the round's staleness bound
    batches: list[dict] = field(default_factory=list)  # the round's batches, for the detector
    produced: int = 0  # updates that arrived
    applied: int = 0
    dropped: int = 0
    skipped: int = 0  # learners that found their base beyond the bound and computed nothing
    staleness: list[int] = field(default_factory=list)
    launched: int = 0  # learner functions
    failed: int = 0
    rejected: int = 0
    duplicates: int = 0
    aggregations: int = 0
    busy: float = 0.0  # the service's CPU seconds (cloud clock)
    learner_fn_seconds: float = 0.0  # the slowest learner function's modelled time
    relearned: int = 0  # batches counted before a resume, learned from again
    discarded: int = 0  # updates of learners launched before a resume (or given up on)

    def means(self) -> dict[str, float]:
        return self.means_over(self.applied)

    def to_dict(self) -> dict:
        """Plain data for the checkpoint, without the round's batches."""
        return dataclasses.asdict(dataclasses.replace(self, batches=[]))

    @classmethod
    def from_dict(cls, d: dict) -> StellarisStats:
        return cls(**copy.deepcopy(d))


@dataclass
class LearnerFnCall:
    """A learner function in flight."""

    inv: str  # its invocation id
    ref: str  # its parcel's key
    base: int  # the version its update starts from
    round: int


def learner_fn_launch_request(spec: TrainingSpec, job_id: str, k: int, slot: int, base: int,
                           ref: str) -> scaler_pb2.LaunchRequest:
    """The Launch of one learner function (slot `slot` of round `k`, base version `base`, its parcel at `ref`), in
    the learner's own fields (LaunchRequest.learner), none borrowed from an actor launch."""
    learner = scaler_pb2.LearnerLaunch(payload_ref=ref, memory_mb=spec.stellaris.learner_memory_mb)
    return scaler_pb2.LaunchRequest(job_id=job_id, round=k, policy_version=base, kind="learner", learner=learner,
                                    slots=[slot], function_name=spec.stellaris.learner_function,
                                    deadline_s=spec.round_deadline_s, wait=True)


class StellarisLoop(PipelinedLoop[StellarisStats]):
    learner_class = ParameterServer
    learner: ParameterAggregator
    cpu_only = True  # gradients are computed by learner functions; applying them is cheap vector arithmetic

    def __init__(self, job, deps):
        super().__init__(job, deps)
        self.st = self.spec.stellaris
        threads = min(self.st.max_learners, MAX_LEARNER_THREADS)
        self.learner_fn_pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"{job.job_id}-learn")
        self.max_in_flight = threads
        self.waiting: deque = deque()  # (round, entry) batches waiting for a learner slot
        self.in_flight: dict[Future, LearnerFnCall] = {}
        self.learner_fns: dict[str, object] = {}  # invocation id -> its batch's entry, outcome not yet known
        self.settled: list = []  # entries whose learner's outcome is known, acked at the next commit
        self.expected: dict[str, tuple[float, int]] = {}  # learner said OK, update not here: (give-up time, round)
        self.received: set[str] = set()  # learner invocation ids whose update arrived (dedup)
        self.cursor = "0-0"
        self.published: set[int] = set()
        self.pending_obs: dict[str, np.ndarray] = {}  # entry id -> observations the next aggregation folds in
        # Per base version: learners launched from it (its updates' n) and its staleness. Not checkpointed: a
        # resumed service discards every update of the learners launched before it, so it starts empty.
        self.ledger = StalenessLedger()
        self.bound = self.st.bound_start
        self.stream = update_stream_key(job.job_id)
        self.actor_versions: set[int] = set()
        self.acc: StellarisStats | None = None  # the open round's, kept over its retries

    def shutdown(self) -> None:
        super().shutdown()
        self.learner_fn_pool.shutdown(wait=False, cancel_futures=True)

    # -- the round: PipelinedLoop's hooks --------------------------------------------------------
    def sample_round(self, k: int) -> OpenRound[StellarisStats]:
        if self.acc is None or self.acc.k != k:  # what a retried round's learners settled stays counted
            self.acc = self._new_acc(k)
            self.acc.busy = sum(self.carried.values())
        rnd = OpenRound(self.launched, self.acc)
        metrics.set_job(metrics.STALENESS_BOUND, self.job.job_id, self.bound)
        self._pump_until(rnd.launch.closed, rnd.launch, rnd.stats, rnd.phases)
        return rnd

    def close_cloud(self, k: int, rnd: OpenRound[StellarisStats]) -> dict[str, float]:
        if k + 1 >= self.spec.rounds:  # the job's last round: count every learner still running
            self._drain(rnd.launch, rnd.stats, rnd.phases)
        return self._cloud_phases(rnd.launch, rnd.stats)

    def publish_for_detector(self, rnd: OpenRound[StellarisStats]) -> None:
        self.learner.last_data = self._detector_data(rnd.stats.batches)  # every aggregation published already

    def before_next_launch(self, k: int, rnd: OpenRound[StellarisStats], ending: bool) -> None:
        if ending:
            if k + 1 < self.spec.rounds:
                self._drain(rnd.launch, rnd.stats, rnd.phases)  # the budget ends the job: count every learner
        else:
            self._wait_for_rounds_before(k, rnd.launch, rnd.stats, rnd.phases)

    def pending_parts(self, k: int, rnd: OpenRound[StellarisStats]) -> tuple[dict, list[str], dict]:
        acc, summary = dataclasses.replace(rnd.stats, batches=[]), rnd.launch.summary()
        self._count_reader(acc)
        return self._fields(k, summary, acc), self._notes(acc), {"acc": acc.to_dict(), "rnd": summary.to_dict()}

    def settlement(self, rnd: OpenRound[StellarisStats] | None = None) -> tuple[list, dict]:
        """What a commit consumes (entries whose learner's outcome is known) and what it names as counted
        (entries waiting or with a learner: {entry id: its observations are in the statistics})."""
        settled, self.settled = self.settled, []
        counted = {e.entry_id: self.counted_before.get(e.entry_id, False) for _, e in self.waiting}
        counted.update({e.entry_id: e.entry_id not in self.pending_obs for e in self.learner_fns.values()})
        return settled, counted

    def settle_at_end(self, pending: PendingRound, phases: dict) -> tuple[PendingRound, tuple]:
        """The target ends the job: wait for every learner still running, so the last report counts them."""
        acc = StellarisStats.from_dict(pending.extra["acc"])
        self._drain(None, acc, phases)
        self._count_reader(acc)
        k = pending.round
        fields = self._fields(k, LaunchSummary.from_dict(pending.extra["rnd"]), acc)
        return dataclasses.replace(pending, fields=fields, notes=self._notes(acc),
                                   extra={**pending.extra, "acc": acc.to_dict()}), self.settlement()

    def _count_reader(self, acc: StellarisStats) -> None:
        rejected, duplicates = self.export_reader_counters(acc.notes)
        acc.rejected += rejected
        acc.duplicates += duplicates

    def _new_acc(self, k: int) -> StellarisStats:
        """Per-round counters; the round's staleness bound takes effect now."""
        self.bound = staleness_bound(k, self.spec.rounds, self.st.bound_start, self.st.bound_end,
                                     self.st.bound_schedule)
        return StellarisStats(k=k, bound=self.bound)

    # -- actors ---------------------------------------------------------------------------
    def launch_round(self, k: int, actors: int) -> Round:
        self.actor_versions = {self.version}  # actors load it whenever they start: keep it published
        return super().launch_round(k, actors)

    # -- the event pump -------------------------------------------------------------------
    def _pump_until(self, done, rnd: Round | None, acc: StellarisStats, phases: dict) -> None:
        """Ingest batches, dispatch learners, collect their outcomes and aggregate updates until `done()`."""

        def step(entries, pumped) -> None:
            pumped.timed("ingest", lambda: [self._ingest(e, outcome, acc) for e, outcome in entries])
            self._poll_learner_fns(acc)
            t_u = time.perf_counter()
            if self._collect_updates(acc):
                pumped.add("update", time.perf_counter() - t_u)
            pumped.timed("ingest", self._dispatch, acc)  # after the aggregation: new learners start from the newest

        pumped = self.collector.pump(rnd, done, step, read=PIPELINED_READ, notes=acc.notes,
                                     on_idle=lambda pumped: step([], pumped))
        metrics.observe_phase("ingest", pumped.ingest, phases)
        metrics.observe_phase("update", pumped.counted.get("update", 0.0), phases)
        metrics.observe_phase("sample", pumped.sample(), phases)
        acc.busy += pumped.cpu

    def _drain(self, rnd: Round | None, acc: StellarisStats, phases: dict) -> None:
        """Wait for every batch's learner and every update still due (bounded by the round deadline)."""
        deadline = time.perf_counter() + self.spec.round_deadline_s
        self._pump_until(lambda: (not self.waiting and not self.in_flight and not self.expected)
                         or time.perf_counter() > deadline, rnd, acc, phases)
        if self.waiting or self.in_flight or self.expected:
            acc.notes.append(f"job end: gave up on {len(self.waiting)} waiting batch(es), {len(self.in_flight)} "
                                f"learner(s) in flight and {len(self.expected)} missing update(s)")
            acc.failed += len(self.in_flight) + len(self.expected)
            # The job ends: these batches are settled as they are, counted but not learned from.
            self.settled += [e for _, e in self.waiting] + list(self.learner_fns.values())
            self.waiting.clear()
            self.in_flight.clear()
            self.expected.clear()
            self.learner_fns.clear()

    def _wait_for_rounds_before(self, k: int, rnd: Round, acc: StellarisStats, phases: dict) -> None:
        """Backpressure: learners of rounds < k finish (and their updates arrive) before round k+1 samples."""
        def older_done() -> bool:
            return not any(r < k for r, _ in self.waiting) and \
                not any(info.round < k for info in self.in_flight.values()) and \
                not any(r < k for _, r in self.expected.values())

        deadline = time.perf_counter() + self.spec.round_deadline_s
        self._pump_until(lambda: older_done() or time.perf_counter() > deadline, rnd, acc, phases)
        if not older_done():
            acc.notes.append(f"learners of rounds before {k} still busy after {self.spec.round_deadline_s:g} s; "
                                "launching the next round anyway")

    def _ingest(self, e, outcome: Ingest, acc: StellarisStats) -> None:
        """A batch the round classified (Round.ingest) goes to a learner function."""
        if e.entry_id in self.counted_before:  # counted before a resume, its learner lost: learn from it only
            acc.relearned += 1
            self.waiting.append((acc.k, e))
            return
        # A straggler of an earlier round (or of a launch before a resume) is still good data: IS truncation
        # handles it. The reader drops repeated entries before this.
        if outcome is not Ingest.KEPT:
            acc.late += 1
        acc.steps += e.steps
        self.total_steps += e.steps
        metrics.ENV_STEPS.inc(e.steps)
        acc.batches.append(e.batch)
        self.note_episodes(e.batch)
        metrics.POLICY_LAG.observe(self.version - e.policy_version)
        self.waiting.append((acc.k, e))

    # -- learner functions ----------------------------------------------------------------
    def _dispatch(self, acc: StellarisStats) -> None:
        """Park a parcel and invoke a learner for waiting batches while slots are free.

        The base is the clock now (staleness 0), so no learner is launched certain to be dropped;
        the parcel carries this round's bound for the learner's own check when it starts."""
        while self.waiting and len(self.in_flight) < self.max_in_flight:
            k, e = self.waiting.popleft()
            slot = int(self.redis_call(lambda: self.deps.redis.incr(learn_counter_key(self.job.job_id)),
                                       "learner counter"))
            inv = invocation_id(self.job.job_id, k, slot, kind="learner")
            ref = parcel_key(self.job.job_id, inv)
            base = self.version
            parcel = make_parcel(job_id=self.job.job_id, round_index=k, base_version=base, algo=self.spec.algo,
                                 config=self.cfg.to_dict(), kl_coeff=self.learner.kl_coeff, rho_bar=self.st.rho_bar,
                                 recent_versions=self.st.recent_versions,
                                 seed=derived_seed(self.spec.seed, k, slot) % (2**31), batches=[e.batch],
                                 behaviour_versions=[e.policy_version], max_staleness=self.bound)
            blob = codec.encode(parcel, self.read_key)
            self.redis_call(lambda: self.deps.redis.set(ref, blob, ex=POLICY_TTL_S), "parcel write")
            if not self.counted_before.pop(e.entry_id, False):  # not already in the restored statistics
                self.pending_obs[e.entry_id] = e.batch["obs"]
            fut = self.learner_fn_pool.submit(self._launch_learner_fn, k, slot, base, ref)
            self.in_flight[fut] = LearnerFnCall(inv=inv, ref=ref, base=base, round=k)
            self.learner_fns[inv] = e
            self.ledger.launch(base)
            acc.launched += 1

    def _launch_learner_fn(self, k: int, slot: int, base: int, ref: str) -> scaler_pb2.LaunchResponse:
        req = learner_fn_launch_request(self.spec, self.job.job_id, k, slot, base, ref)
        return self.services.launch_request(req, "Launch (learner)")

    def _poll_learner_fns(self, acc: StellarisStats) -> None:
        now = time.monotonic()
        done = [f for f in self.in_flight if f.done()]
        for fut in done:
            info = self.in_flight.pop(fut)
            try:
                resp = fut.result()
                acc.learner_fn_seconds = max(acc.learner_fn_seconds, resp.cloud_seconds)
                res = resp.invocations[0] if resp.invocations else None
                ok, why = (res is not None and res.ok), (f"{res.error_type}: {res.error_message[:200]}" if res else
                                                         "no invocation result")
            except grpc.RpcError as exc:
                ok, why = False, f"launch failed: {exc.code().name}: {exc.details()}"
            if info.inv in self.received:
                pass  # its update (or skip) arrived first and settled it
            elif ok:
                self.expected[info.inv] = (now + LOST_UPDATE_GRACE_S, info.round)
            else:
                acc.failed += 1
                acc.notes.append(f"learner {info.inv} failed: {why}")
                self._settle(info.inv)
            self.redis_call(lambda: self.deps.redis.delete(info.ref), "parcel delete")
        for inv, (give_up, _) in list(self.expected.items()):
            if now > give_up:
                del self.expected[inv]
                acc.failed += 1
                acc.notes.append(f"learner {inv} returned OK but its update never arrived")
                self._settle(inv)

    def _settle(self, inv: str) -> None:
        """The learner's outcome is known: its batch is acked at the next commit."""
        self.settled.append(self.learner_fns.pop(inv))

    # -- aggregation ------------------------------------------------------------------------
    def _collect_updates(self, acc: StellarisStats) -> bool:
        """Read every queued update, aggregate them once; True if anything was read."""
        resp = self.redis_call(lambda: self.deps.redis.xread({self.stream: self.cursor}, count=64), "update read")
        msgs = resp[0][1] if resp else []
        if not msgs:
            return False
        records, ids = [], []
        for entry_id, fields in msgs:
            eid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
            self.cursor = eid
            ids.append(eid)
            try:
                rec = self._verified_update(fields)
            except codec.PayloadError as exc:
                acc.rejected += 1
                metrics.REJECTED_PAYLOADS.labels(exc.reason).inc()
                log.warning("job %s: rejected learner update %s: %s", self.job.job_id, eid, exc)
                continue
            if rec.invocation_id in self.received:
                acc.duplicates += 1  # a retried learner pushed again
                continue
            if rec.invocation_id not in self.learner_fns:
                # Launched before a resume (its batch is learned from again) or given up on as lost (counted
                # failed): applying it would learn from a batch twice.
                acc.discarded += 1
                continue
            self.received.add(rec.invocation_id)
            self.expected.pop(rec.invocation_id, None)
            self._settle(rec.invocation_id)
            if rec.skipped:  # the learner found its base certain to be dropped and computed nothing
                acc.skipped += 1
                continue
            records.append(rec)
        def delete():
            pipe = self.deps.redis.pipeline(transaction=False)
            pipe.xdel(self.stream, *ids)
            pipe.expire(self.stream, UPDATE_STREAM_TTL_S)
            return pipe.execute()

        self.redis_call(delete, "update delete")
        if records:
            self._aggregate(records, acc)
        return True

    def _verified_update(self, fields: dict):
        """The update record of an update-stream entry, verified with the key of the learner function the entry
        names (nitro.contracts.invocation_key): an update signed with any other key, an actor's of this job
        included, fails as `bad_signature`."""
        named = fields.get(b"inv")
        if not named:
            raise codec.UnsignedPayloadError("update entry names no invocation: there is no key to verify it with")
        inv = named.decode("utf-8", "surrogateescape")
        rec = decode_update(fields.get(b"payload", b""), invocation_key(self.deps.hmac_key, self.job.job_id, inv),
                            self.learner.n_params)
        if rec.invocation_id != inv:
            raise codec.BadSignatureError("update entry's invocation differs from the signed one")
        return rec

    def _aggregate(self, records: list, acc: StellarisStats) -> None:
        st = self.st
        bases = [r.base_version for r in records]
        agg = self.ledger.aggregate(bases, self.version, self.bound, st.staleness_weight, st.staleness_decay)
        moved = self.learner.aggregate([r.update for r in records], agg, kls=[float(r.stats.get("kl", 0.0))
                                                                              for r in records],
                                       obs=list(self.pending_obs.values()))
        acc.produced += len(records)
        acc.applied += agg.n_applied
        acc.dropped += agg.n_dropped
        acc.staleness.extend(agg.staleness)
        metrics.GRADIENTS_PRODUCED.inc(len(records))
        metrics.GRADIENTS_APPLIED.inc(agg.n_applied)
        for s, applied, r in zip(agg.staleness, agg.applied, records):
            metrics.GRADIENT_STALENESS.observe(max(s, 0))
            if not applied:
                metrics.GRADIENTS_DROPPED.labels("stale" if s >= 0 else "future_base").inc()
                continue
            for name in ("policy_loss", "value_loss", "entropy", "kl", "rho_mean", *DIAGNOSTICS.values()):
                acc.add(name, float(r.stats.get(name, 0.0)))
        if moved:
            self.pending_obs = {}
            self.ledger.advance(bases, agg)  # one version staler: every base but one whose updates alone it applied
            self.ledger.forget(self.bound)  # their updates can no longer be applied: the counts are not needed
            self.version += 1  # one aggregation, one published version
            acc.aggregations += 1
            self.publish()

    # -- publishing and the detector --------------------------------------------------------
    def publish(self) -> None:
        """The staleness record first, then the version: a learner that reads `policy:latest` and then the
        record sees one at least as new as that version. The first publish (at open) replaces a record a
        killed service left, whose bases are not this service's."""
        blob = encode_staleness_record(self.ledger.record(self.version), self.read_key)
        key = staleness_record_key(self.job.job_id)
        self.redis_call(lambda: self.deps.redis.set(key, blob, ex=POLICY_TTL_S), "staleness record write")
        super().publish()
        self.published.add(self.version)
        self._prune()

    def _prune(self) -> None:
        """Delete published versions nobody can still ask for: every aggregation publishes one."""
        keep = set(sorted(self.published)[-(self.st.recent_versions + 2):])  # latest and the truncation window
        keep |= {info.base for info in self.in_flight.values()}
        keep |= self.actor_versions
        stale = [v for v in self.published if v not in keep and v < self.version]
        if stale:
            self.redis_call(lambda: self.deps.redis.delete(*(policy_key(self.job.job_id, v) for v in stale)),
                            "policy prune")
            self.published.difference_update(stale)

    def _detector_data(self, batches: list[dict]) -> dict | None:
        """The round's samples with the fields the detector needs for this algorithm, at the current policy."""
        if not batches:
            return None
        if self.spec.algo == "ppo":
            data = collate(batches, self.cfg.gamma, self.cfg.gae_lambda, self.cfg.reward_clip)
            if self.cfg.normalize_batch_advantages:  # as the update saw them (the paper presets)
                data["advantages"] = standardize_batch(data["advantages"])
            return data
        # IMPACT mode: the surrogate as the learner functions apply it, the weight once, in the advantage.
        data, _ = prepare(self.learner.policy, batches, self.cfg, "impact", rho_bar=self.st.rho_bar)
        return {"obs": data["obs"].numpy(), "actions": data["actions"].numpy(), "logp": data["logp"].numpy(),
                "logp_target": data["logp_ref"].numpy(), "is_weights": data["is_weights"].numpy(),
                "advantages": data["advantages"].numpy()}

    # -- reports ------------------------------------------------------------------------------
    @staticmethod
    def _cloud_phases(rnd: Round, acc: StellarisStats) -> dict[str, float]:
        """The round so far on the cloud clock (docs/cost.md): actors, then their learner functions, in
        parallel with the service's own CPU time ("update"); "sample" is what the functions take beyond it."""
        sampling = (rnd.wave.resp.cloud_seconds if rnd.wave.resp is not None else 0.0) + acc.learner_fn_seconds
        return {"update": acc.busy, "sample": max(0.0, sampling - acc.busy)}

    def _fields(self, k: int, launch: LaunchSummary, acc: StellarisStats) -> dict:
        """The round's RoundReport fields that neither its evaluation nor its closing depend on."""
        means = acc.means()
        stal = acc.staleness
        return dict(
            **launch.report_fields(k), env_steps=acc.steps, total_env_steps=self.total_steps,
            policy_loss=means.get("policy_loss", 0.0), value_loss=means.get("value_loss", 0.0),
            entropy=means.get("entropy", 0.0), kl=means.get("kl", 0.0),
            **{key: means.get(name, 0.0) for key, name in DIAGNOSTICS.items()}, kl_coeff=self.learner.kl_coeff,
            duplicates_dropped=acc.duplicates, rejected_batches=acc.rejected,
            gradients_produced=acc.produced, gradients_applied=acc.applied, gradients_dropped=acc.dropped,
            mean_staleness=float(np.mean(stal)) if stal else 0.0, staleness_bound=acc.bound,
            learner_functions_launched=acc.launched, learner_functions_failed=acc.failed,
            learner_functions_skipped=acc.skipped)

    @staticmethod
    def _notes(acc: StellarisStats) -> list[str]:
        stal = acc.staleness
        mean_stal = float(np.mean(stal)) if stal else 0.0
        resumed = (f", {acc.relearned} batch(es) counted before a resume learned from again and "
                   f"{acc.discarded} update(s) of learners launched before it (or given up on) discarded"
                   if acc.relearned or acc.discarded else "")
        return [*acc.notes, (
            f"stellaris: {acc.launched} learner(s) launched, {acc.produced} update(s) produced, "
            f"{acc.applied} applied in {acc.aggregations} aggregation(s), {acc.dropped} dropped "
            f"(bound {acc.bound}, staleness mean {mean_stal:.2f}, "
            f"max {max(stal) if stal else 0}), {acc.skipped} skipped (base already beyond the bound when the "
            f"learner started), {acc.late} late batch(es){resumed}")]
