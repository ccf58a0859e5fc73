"""The round loop, written once (`RoundLoop.train`), and what every loop shares.

    open (restore, finish a round committed but not reported, publish, plan and launch the first round)
    for each round k:
        stopped? (a stop or drain ends the job before a round samples)
        pump the stream until round k closes      sample_round(k)
        stopped? empty? (MAX_EMPTY_ROUNDS in a row end the job, resumable; else the round is retried)
        close: learn, publish, score, plan and launch the next round, commit, evaluate, report; end conditions
                                                  close_round(k, rnd)

Every loop closes its rounds through PipelinedLoop.close_round (pipelined.py: the next round launches before
this one is committed and evaluated) and supplies its own pump and learning: on-policy PPO (onpolicy.py, the
pipeline at depth 0: it learns when the round closed, then launches the next), off-policy IMPACT
(offpolicy.py) and the Stellaris parameter service (parameter_service.py).

Durability, one rule for every loop (`RoundLoop.commit`): a stream entry is acked
only after the checkpoint that holds what was learned from it, and that
checkpoint names it. `checkpoint.pt` (model, optimiser, RNG states, counters, the
half-built report of its round, the entries it consumes) is written atomically,
then its entries are acked; the report is appended to `reports.pb` once the round
is complete, and `best.pt`, a copy of the checkpoint of the best evaluated round
so far, just before. A learner that dies before the checkpoint gets the round's
entries redelivered and learns from them once, in the round it redoes; one that
dies between the checkpoint and the ack acks them on resume without learning
from them again; one that dies before the report finishes that round on resume
(score or evaluate, plan, report) instead of skipping it.

The rest lives beside this module, one job each: constants.py (every loop constant), resilience.py (retries,
the errors that end a job), clients.py (the scaler and detector), publishing.py (policies and sample
subsets), durability.py (the job's files), reporting.py (round-report fields and metrics), state.py (typed
round state), policy_owner.py (the PolicyOwner protocols).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, NamedTuple, TypeVar

import numpy as np

from learner_svc import evaluation
from learner_svc.clients import LastRound, LearnerDeps, Services, end_job
from learner_svc.constants import DRAIN_END_JOB_PATIENCE_S, DRAIN_STOP_REASON, IO_THREADS, MAX_WAVES, RECENT_EPISODES
from learner_svc.durability import CommittedEntry, JobFiles, job_dir, load_reports
from learner_svc.evaluation import eval_seed
from learner_svc.jobs import Job
from learner_svc.policy_owner import PolicyOwner, PolicyOwnerFactory
from learner_svc.publishing import Publisher, detector_subset
from learner_svc.reporting import closing_report_fields, export_diagnostics
from learner_svc.resilience import (
    NO_SAMPLES,
    JobAborted,
    dependency_failure,
    redis_call,
    resume_advice,
)
from nitro.contracts import MAX_EMPTY_ROUNDS, job_read_key
from nitro.cost import cloud_round_seconds
from nitro.data.store import TrajectoryReader
from nitro.detector.core import REQUIRED_FIELDS
from nitro.policy.envs import env_spaces
from nitro.policy.inference import PolicyRunner
from nitro.policy.models import spec_for_spaces
from nitro.policy.rollout import evaluate
from nitro.rpc import metrics
from nitro.scaling.policies import reads_score
from nitro.spec import BEHAVIOUR_VALUE_ALGOS, algo_config
from nitro.v1 import detector_pb2, scaler_pb2, training_pb2

log = logging.getLogger(__name__)


class End(NamedTuple):
    """How a job ends: its state and message."""

    state: int
    message: str


def succeeded(message: str) -> End:
    return End(training_pb2.JOB_STATE_SUCCEEDED, message)


def job_end(*, rounds_done: int, rounds: int, budget_exhausted: bool = False, budget_reason: str = "",
            eval_return: float = math.nan, target_return: float = 0.0) -> End | None:
    """How a job ends once `rounds_done` rounds are reported, or None when it goes on: the one ending rule of every
    loop. The target first (what the job was for), then its rounds, then its budget (the plan of the next round)."""
    if target_return and eval_return >= target_return:
        return succeeded(f"target return {target_return:g} reached")
    if rounds_done >= rounds:
        return succeeded(f"completed {rounds} rounds")
    if budget_exhausted:
        return succeeded(f"budget exhausted: {budget_reason}")
    return None


R = TypeVar("R")  # a loop's round while it is open: what sample_round hands to close_round


class RoundLoop(Generic[R]):
    """The skeleton of every loop (`train`) and what they share; subclasses supply the hooks."""

    learner_class: PolicyOwnerFactory  # set by subclasses
    learner: PolicyOwner
    cpu_only = False  # True where the model stays on the CPU whatever the learner's device
    # How many of its newest published versions a loop keeps in Redis, deleting older ones as it publishes;
    # None: all, until they expire (POLICY_TTL_S). A long job otherwise holds an hour of versions.
    keep_versions: int | None = None

    def __init__(self, job: Job, deps: LearnerDeps):
        self.job, self.deps, self.spec = job, deps, job.spec
        self.device = "cpu" if self.cpu_only else deps.device
        self.cfg = algo_config(self.spec)
        obs_space, act_space = env_spaces(self.spec.env_id, **self.spec.env_kwargs)
        self.model_spec = spec_for_spaces(obs_space, act_space, hidden_sizes=self.cfg.hidden_sizes,
                                          activation=self.cfg.activation, obs_norm=self.cfg.obs_norm,
                                          init_log_std=self.cfg.init_log_std)
        self.learner = self.learner_class(self.model_spec, self.cfg, seed=self.spec.seed, device=self.device)
        self.services = Services(job.job_id, self.spec, self.cfg, deps)
        # What the job's functions verify (policies, parcels) is signed with the job's read key; what they send back
        # is verified with each invocation's own key, which the reader derives from the master key.
        self.read_key = job_read_key(deps.hmac_key, job.job_id)
        self.publisher = Publisher(deps.redis, job.job_id, self.read_key, self.redis_call,
                                   behaviour_values=self.spec.algo in BEHAVIOUR_VALUE_ALGOS)
        self.policies = self.publisher.policies
        self.reader = TrajectoryReader(deps.redis, job.job_id, deps.hmac_key, consumer=f"learner-{job.job_id}")
        self.version = 0
        self.total_steps = 0
        self.next_round = 0
        self.recent_returns: list[float] = []
        self.recent_lengths: list[int] = []  # of the same episodes as recent_returns
        self.last_actors = self.spec.scaler.i_min
        # A policy that does not plan from the score (fixed, max, schedule, ...) gets no detector call: no
        # sample subset, no Hessian-vector products on the critical path or the bill.
        self.scores = reads_score(self.spec.scaler.policy)
        self.rng = np.random.default_rng(self.spec.seed)
        self.pool = ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix=f"{job.job_id}-io")
        self.files = JobFiles(job_dir(deps.data_dir, job.job_id))
        self.dir = self.files.dir
        self._exported_rejected: dict[str, int] = {}
        self._exported_duplicates = 0
        self.counted_before: dict[str, bool] = {}  # from the checkpoint: see commit's `counted`
        self.resumed = False  # the next report is the first of a resumed learner
        self.kept_versions: list[int] = []  # versions this learner published and still keeps (keep_versions)

    # -- the job's life ---------------------------------------------------------------------
    def run(self, resume: bool = False) -> None:
        """Run the job to its end state; a drained job is left resumable."""
        job = self.job
        job.set_state(training_pb2.JOB_STATE_RUNNING)
        self.save_job_state("RUNNING")
        failed, resumable = training_pb2.JOB_STATE_FAILED, False
        try:
            end_state, end_message = self.train(resume)
            # The last commit's ack (and those of entries dropped since), held back for a read that will not
            # come; a Redis outage here ends the job resumable (as a failed ack in the commit itself would), and
            # the resume acks it.
            self.redis_call(self.reader.flush, "stream ack")
        except Exception as exc:  # noqa: BLE001 - a dependency's outage ends the job resumable; others propagate
            reason = dependency_failure(exc)
            if reason is not None:
                log.warning("job %s: %s; it ends FAILED, resumable", job.job_id, reason)
                end_state, resumable = failed, True
                end_message = resume_advice(reason, job.job_id, len(job.reports), self.spec.rounds)
            elif isinstance(exc, JobAborted):
                end_state, end_message = failed, str(exc)
            else:
                raise
        finally:
            self.send_held_acks()
            self.shutdown()
            metrics.forget_job(job.job_id)  # a finished job leaves no series behind
        if end_state == training_pb2.JOB_STATE_STOPPED and job.stop_reason == DRAIN_STOP_REASON:
            resumable = job.interrupted = True
            end_message += f"; resume with `nitro train --resume {job.job_id}`"
        elif end_state == failed and end_message.startswith(NO_SAMPLES):
            # Nothing was trained on in those rounds: once the actors work again the job can go on.
            resumable = True
            end_message = resume_advice(
                f"{end_message}: the actors produced no batches (the round notes say why; see the actor "
                f"endpoint's or function's log)", job.job_id, len(job.reports), self.spec.rounds,
                fix="fix the actors, then")
        # The job's functions lose their Redis user now (a resume's first launch makes a new one); a scaler that
        # cannot be told is asked again by the learner's next start (job.json says so).
        released = self.release_actor_user()
        self.save_job_state(training_pb2.JobState.Name(end_state).removeprefix("JOB_STATE_"), end_message,
                            resumable=resumable, actor_user_released=released)
        job.set_state(end_state, end_message)

    def train(self, resume: bool) -> End:
        """The skeleton of every loop: returns how the job ends, once every round it closed is reported."""
        end = self._rounds(resume)
        self.settle()
        return end

    def _rounds(self, resume: bool) -> End:
        job = self.job
        end = self.open(resume)
        if end is not None:
            return end
        k, empty_rounds = self.next_round, 0
        while True:
            if job.stop_requested.is_set():  # nothing was launched for a job that is stopping: it ends here
                return End(training_pb2.JOB_STATE_STOPPED, f"stopped: {job.stop_reason}")
            # A healthy round samples for at most MAX_WAVES round deadlines: past one more it has stalled.
            metrics.round_started(job.job_id, k, (MAX_WAVES + 1) * self.spec.round_deadline_s)
            rnd = self.sample_round(k)
            if job.stop_requested.is_set() and self.abandons(rnd):
                return End(training_pb2.JOB_STATE_STOPPED, f"stopped: {job.stop_reason}")
            if self.is_empty(rnd):
                log.warning("job %s round %d: no samples arrived; the round is tried again", job.job_id, k)
                empty_rounds += 1
                if empty_rounds >= MAX_EMPTY_ROUNDS:
                    return End(training_pb2.JOB_STATE_FAILED, f"{NO_SAMPLES} in {MAX_EMPTY_ROUNDS} consecutive rounds")
                self.retry_round(k, rnd)  # the same round again: nothing was trained on
                continue
            empty_rounds = 0
            end = self.close_round(k, rnd)
            if end is not None:
                return end
            k += 1
            self.next_round = k

    # -- the hooks ------------------------------------------------------------------------------
    def open(self, resume: bool) -> End | None:
        """Restore (`resume`), finish a round committed but not reported, publish and plan (or launch) the
        first round; how the job ends, or None when it goes on."""
        raise NotImplementedError

    def sample_round(self, k: int) -> R:
        """Pump the stream until round k (launched by the close of the round before, or by open) closes."""
        raise NotImplementedError

    def abandons(self, rnd: R) -> bool:
        """Whether a stop requested while `rnd` sampled ends the job before closing it. Yes by default."""
        return True

    def is_empty(self, rnd: R) -> bool:
        """No sample arrived in the round: it is tried again."""
        raise NotImplementedError

    def retry_round(self, k: int, rnd: R) -> None:
        """Prepare round k again after it sampled nothing. Nothing by default."""

    def close_round(self, k: int, rnd: R) -> End | None:
        """Learn from, commit and report round k and plan and launch the next; how the job ends, or None."""
        raise NotImplementedError

    def settle(self) -> None:
        """The job ends: report what is still held back (a round whose evaluation was running). Nothing by default."""

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def send_held_acks(self) -> None:
        """On the way out of a job that failed: send the last commit's held-back ack if Redis answers. If not,
        the checkpoint still names its entries: a resumed learner acks them, and until then they stay pending."""
        try:
            self.reader.flush()
        except Exception as exc:  # noqa: BLE001 - the job's end state must still be written
            log.warning("job %s: the last round's stream ack was not sent (%s); resuming the job sends it",
                        self.job.job_id, exc)

    # -- resilience helpers ---------------------------------------------------------------
    def redis_call(self, fn: Callable, what: str):
        """Run a Redis operation, riding out a restart of the server for up to REDIS_PATIENCE_S."""
        return redis_call(fn, what, self.job.job_id)

    def rpc(self, method: Callable, request, *, timeout: float, patience: float, what: str):
        """Call a scaler/detector RPC, retrying UNAVAILABLE / DEADLINE_EXCEEDED until `patience` runs out."""
        return self.services.rpc(method, request, timeout=timeout, patience=patience, what=what)

    def export_reader_counters(self, notes: list[str] | None = None) -> tuple[int, int]:
        """Push the reader's rejected/duplicate counts into metrics; returns the deltas since last call. With
        `notes`, the rejections since the last call become one report note naming their reasons (the learner's
        log names each entry)."""
        d_rej, by_reason = 0, {}
        for reason, count in self.reader.rejected.items():
            delta = count - self._exported_rejected.get(reason, 0)
            if delta:
                metrics.REJECTED_PAYLOADS.labels(reason).inc(delta)
                d_rej += delta
                by_reason[reason] = delta
            self._exported_rejected[reason] = count
        if notes is not None and by_reason:
            notes.append(f"rejected {d_rej} stream entr{'y' if d_rej == 1 else 'ies'} ("
                         + ", ".join(f"{reason} {n}" for reason, n in sorted(by_reason.items()))
                         + "): not trained on (docs/security.md)")
        d_dup = self.reader.duplicates - self._exported_duplicates
        if d_dup:
            metrics.DUPLICATE_BATCHES.inc(d_dup)
        self._exported_duplicates = self.reader.duplicates
        return d_rej, d_dup

    # -- scaler and detector ----------------------------------------------------------
    def plan(self, round_index: int, score: float, gns: float, fallback_actors: int = 0,
             last: LastRound | None = None, cloud_seconds: float = 0.0) -> scaler_pb2.PlanResponse:
        """Ask the scaler for round `round_index`'s actors (clients.Services.plan)."""
        resp = self.services.plan(round_index, score, gns, fallback_actors, last or LastRound(), cloud_seconds)
        if resp.actors > 0:
            self.last_actors = resp.actors
        return resp

    def launch(self, round_index: int, slots: list[int], wave: int = 0) -> scaler_pb2.LaunchResponse:
        """Invoke the given actor slots with the current policy (wave > 0: replacements with fresh ids)."""
        return self.services.launch(round_index, self.version, slots, wave)

    def cost(self) -> scaler_pb2.GetCostResponse:
        return self.services.cost()

    def score(self, round_index: int, ref: str, algo: str = "ppo") -> detector_pb2.ScoreResponse:
        return self.services.score(round_index, self.version, ref, algo)

    def new_wave(self, round_index: int) -> int:
        return self.services.new_wave(round_index)

    def launched_waves(self, round_index: int) -> tuple[int, float | None]:
        return self.services.launched_waves(round_index)

    def launch_status(self, round_index: int, slot_of: dict[str, int]):
        return self.services.launch_status(round_index, slot_of)

    def fallback_actors(self) -> int:
        return self.spec.scaler.i_min if self.spec.detector_fallback == "i_min" else self.last_actors

    def detector_fallback(self, detail: str, notes: list[str]) -> int:
        """The detector gave no score (`detail`: why): the fallback actors for a policy that reads the score, said
        in the round's notes. The one fallback rule of every loop."""
        fallback = self.fallback_actors()
        notes.append(f"detector unavailable ({detail}); fallback for a policy that reads the score: {fallback} actors "
                     f"({self.spec.detector_fallback})")
        return fallback

    def end_after(self, rounds_done: int, eval_return: float, next_plan) -> End | None:
        """How the job ends after its round `rounds_done - 1` (job_end with the spec and the next round's plan)."""
        return job_end(rounds_done=rounds_done, rounds=self.spec.rounds, budget_exhausted=next_plan.budget_exhausted,
                       budget_reason=next_plan.reason, eval_return=eval_return,
                       target_return=self.spec.target_return)

    def plan_inputs(self, cloud: dict[str, float], *, loss: float, kl: float, eval_return: float, env_steps: int,
                    policy_noise_scale: float = 0.0, policy_grad_sq: float = 0.0,
                    policy_trace_sigma: float = 0.0) -> LastRound:
        """What the scaler plans the next round from, of the round just finished: the one plan-input builder of
        every loop. Times on the cloud clock, so a learned scheduler's inputs do not move with this machine's load."""
        return LastRound(loss=loss, kl=kl, eval_return=self.last_eval(eval_return),
                         update_seconds=cloud.get("update", 0.0), actor_seconds=cloud.get("sample", 0.0),
                         round_seconds=cloud_round_seconds(cloud), env_steps=int(env_steps),
                         policy_noise_scale=policy_noise_scale, policy_grad_sq=policy_grad_sq,
                         policy_trace_sigma=policy_trace_sigma)

    def last_eval(self, eval_return: float) -> float:
        """This round's eval return, or the latest one measured (rounds between evaluations have none); 0 when
        none was: what the scaler plans from."""
        latest = self.latest_eval(eval_return)
        return latest if math.isfinite(latest) else 0.0

    def latest_eval(self, eval_return: float = math.nan) -> float:
        """This round's eval return, or the latest one reported; NaN when none was: what the end conditions
        read (a round whose report is held counts once it is reported)."""
        if math.isfinite(eval_return):
            return eval_return
        return next((r.eval_return for r in reversed(self.job.reports) if r.evaluated), math.nan)

    def last_score(self) -> float:
        return self.job.reports[-1].score if self.job.reports else 0.0

    # -- round reports -------------------------------------------------------------------------
    def note_episodes(self, batch: dict) -> None:
        """Remember the returns and lengths of the episodes that finished inside an actor batch."""
        self.recent_returns = (self.recent_returns + list(batch["episode_returns"]))[-RECENT_EPISODES:]
        self.recent_lengths = (self.recent_lengths + list(batch.get("episode_lengths", [])))[-RECENT_EPISODES:]

    def take_resumed(self, notes: list[str]) -> bool:
        """Whether this report is the first of a resumed learner (said once, in its notes too)."""
        resumed, self.resumed = self.resumed, False
        if resumed:
            notes.append("learner resumed from checkpoint")
        return resumed

    def closing_report_fields(self, *, eval_return: float, score_resp, next_plan, phases: dict[str, float],
                              round_seconds: float, notes: list[str], fallback: int,
                              cloud_phases: dict[str, float] | None = None) -> dict:
        """RoundReport fields every loop fills alike when a round closes (reporting.closing_report_fields)."""
        cost = self.cost()
        return closing_report_fields(
            job_id=self.job.job_id, scaler_policy=self.spec.scaler.policy, cost=cost,
            last=self.job.reports[-1] if self.job.reports else None, recent_returns=self.recent_returns,
            recent_lengths=self.recent_lengths, eval_return=eval_return, score_resp=score_resp,
            next_plan=next_plan, phases=phases, round_seconds=round_seconds, notes=notes, fallback=fallback,
            cloud_phases=cloud_phases)

    # -- data plane ---------------------------------------------------------------------
    def publish(self) -> None:
        """Publish the current version; with keep_versions, delete (in the same transaction) this learner's
        older versions beyond the newest keep_versions. Versions a learner before a resume published expire."""
        if self.keep_versions is None:
            self.publisher.policy(self.learner.policy, self.version)
            return
        kept = [v for v in self.kept_versions if v != self.version] + [self.version]
        self.publisher.policy(self.learner.policy, self.version, drop=kept[:-self.keep_versions])
        self.kept_versions = kept[-self.keep_versions:]

    def write_sample_subset(self, round_index: int, extra: dict | None = None) -> str:
        """The round's sample subset for the detector, stored under its sample key; "" when nothing is scored
        (the scaling policy does not read the score, or no update has run since a resume)."""
        if not self.scores or self.learner.last_data is None:
            return ""
        subset = detector_subset(self.learner.last_data, REQUIRED_FIELDS[self.spec.algo], self.rng, extra)
        return self.publisher.sample_subset(round_index, subset)

    def evaluates(self, round_index: int, last: bool = False) -> bool:
        """Whether round `round_index` is evaluated: every eval_every-th round and the job's last (`last`:
        it ends early, e.g. its budget is spent)."""
        spec = self.spec
        return spec.eval_episodes > 0 and (last or (round_index + 1) % spec.eval_every == 0
                                           or round_index + 1 >= spec.rounds)

    def start_evaluation(self, round_index: int, last: bool = False) -> Future | None:
        """Evaluate the current version if round `round_index` is evaluated (else None): a Future of its
        Evaluated. With evaluation "functions" it runs as evaluation functions while the caller goes on; with
        "learner" it runs here, now, and the Future is done."""
        if not self.evaluates(round_index, last):
            return None
        seed = eval_seed(self.spec.seed, round_index)
        if self.spec.evaluation == "functions":
            return self.pool.submit(lambda v=self.version: evaluation.from_launch(
                self.services.launch_eval(round_index, v, seed), self.spec.eval_episodes))
        runner = PolicyRunner(self.model_spec, self.learner.policy.numpy_state(), self.version)
        return evaluation.done(evaluation.from_returns(evaluate(
            runner, self.spec.env_id, self.spec.eval_episodes, seed=seed, env_kwargs=self.spec.env_kwargs)))

    # -- durability: one rule for every loop -------------------------------------------------
    def commit(self, round_index: int, pending: dict, entries: list, counted: dict | None = None) -> None:
        """Consume stream entries only once what was learned from them is durable: write the checkpoint,
        which names `entries`, then ack them.

        A learner killed before the (atomic) write gets them redelivered and learns from them in the round it
        redoes; one killed after it acks them on resume (restore) and does not learn from them again.
        `pending`: what the round's report still needs (plain data). `counted` ({entry id: its observations
        are in the statistics}): entries whose steps and episodes the checkpoint's counters hold but whose
        learning it does not (a Stellaris learner function still has them); redelivered after a resume they
        are learned from without being counted again."""
        # The ack is held back to ride with the next read (one round trip fewer a round), which is safe only
        # while the newest checkpoint names every held-back entry: send an earlier round's first.
        self.redis_call(self.reader.flush, "stream ack")
        self._write_checkpoint(round_index, pending, entries, counted or {})
        if entries:
            self.redis_call(lambda: self.reader.ack(entries, defer=True), "stream ack")

    def _write_checkpoint(self, round_index: int, pending: dict, committed: list, counted: dict) -> None:
        self.job.checkpoint_path = self.files.write_checkpoint({
            "round": round_index, "version": self.version, "env_steps": self.total_steps,
            "spec": self.spec.to_dict(), "model_spec": self.model_spec.to_dict(), "learner": self.learner.state(),
            "np_rng": self.rng.bit_generator.state, "recent_returns": self.recent_returns,
            "recent_lengths": self.recent_lengths, "last_actors": self.last_actors, "pending": pending,
            "committed": [(e.entry_id, e.dedup_id) for e in committed], "counted": dict(counted)})

    def restore(self) -> dict | None:
        """Load the last checkpoint and finish its commit; returns its pending (unreported) round, if any."""
        ck = self.files.read_checkpoint(self.device)
        if ck is None:
            return None
        self.learner.load_state(ck["learner"])
        self.version, self.total_steps = ck["version"], ck["env_steps"]
        self.rng.bit_generator.state = ck["np_rng"]
        self.recent_returns, self.last_actors = list(ck["recent_returns"]), ck["last_actors"]
        self.recent_lengths = list(ck.get("recent_lengths", []))  # absent from older checkpoints
        # Killed between the checkpoint and its ack: ack now, or those batches would be learned from twice.
        committed = [CommittedEntry(*ids) for ids in ck.get("committed", ())]
        if committed:
            self.redis_call(lambda: self.reader.ack(committed), "stream ack")
        self.counted_before = dict(ck.get("counted", {}))
        self.job.checkpoint_path = self.files.checkpoint
        reports = load_reports(self.dir)
        self.job.reports = reports
        if reports:
            self.job.total_cost_usd = reports[-1].total_cost_usd
            self.job.total_env_steps = reports[-1].total_env_steps
        self.next_round = ck["round"] + 1
        reported = reports[-1].round if reports else -1
        return ck["pending"] if ck["round"] > reported else None

    def keep_best(self, eval_return: float) -> None:
        """Copy checkpoint.pt to best.pt when this round's evaluation beats every earlier round's.

        checkpoint.pt holds exactly the policy evaluated: every loop commits round k before it evaluates
        it, and calls this before its next commit replaces checkpoint.pt."""
        self.files.keep_best(eval_return, self.job.reports)

    def append_report(self, report: training_pb2.RoundReport) -> None:
        # best.pt first: a learner killed in between finishes the round again on resume and redoes both.
        self.keep_best(report.eval_return)
        self.write_report(report)

    def write_report(self, report: training_pb2.RoundReport) -> None:
        log.info("job %s round %d: actors %d steps %d eval %s score %.3f cost $%.4f (%.2fs)%s", self.job.job_id,
                 report.round, report.actors_launched, report.env_steps,
                 f"{report.eval_return:.1f}" if report.evaluated else "-", report.score, report.total_cost_usd,
                 report.round_seconds, f" notes: {list(report.notes)}" if report.notes else "")
        self.files.append_report(report)
        self.job.add_report(report)
        export_diagnostics(report)

    def save_job_state(self, state: str, message: str = "", resumable: bool = False,
                       actor_user_released: bool = False) -> None:
        self.files.save_job_state(self.job.job_id, state, message, resumable, self.spec.to_dict(),
                                  actor_user_released=actor_user_released)

    def release_actor_user(self) -> bool:
        """The job ended: the scaler deletes its functions' Redis user (EndJob). Whether it confirmed; a failure
        never changes how the job ends. A job that ends while its learner shuts down asks only briefly
        (DRAIN_END_JOB_PATIENCE_S)."""
        try:
            if self.job.stop_reason == DRAIN_STOP_REASON:
                return end_job(self.deps, self.job.job_id, patience=DRAIN_END_JOB_PATIENCE_S)
            return end_job(self.deps, self.job.job_id)
        except Exception as exc:  # noqa: BLE001 - e.g. no scaler at all; the next start asks again
            log.warning("job %s: could not end the job's Redis user: %s", self.job.job_id, exc)
            return False
