"""Every loop's round close, written once: on-policy PPO (onpolicy.py), off-policy IMPACT (offpolicy.py) and
the Stellaris parameter service (parameter_service.py) supply how they learn and what they report.

Round k's actors are launched as soon as round k-1 closed and was planned (its first round's by `open`). The
loop pumps the stream until round k closes (every actor's batch is in, failed or lost, or its deadline
passed); then `close_round` learns from it (`learn_round`: PPO's update; IMPACT and Stellaris learned while
pumping), publishes and scores the round's samples, plans round k+1 and launches it, commits round k, and
only then evaluates and reports round k, so commit and evaluation overlap round k+1's sampling. The
on-policy loop is this pipeline at depth 0: round k+1 needs the policy round k's update made, which is
exactly when it launches. What a committed round still needs for its report (`PendingRound`) is in its
checkpoint: a learner killed before the report finishes the round on resume.

A loop with `holds_reports` (on-policy) does not wait for evaluation functions: the round's report is held
(`held`) and completed at the next close, before the next commit replaces the checkpoint it evaluated
(`report_held`), or when the job ends (`settle`). The others wait for their evaluation here.

Hooks of a pipelined loop (besides RoundLoop.sample_round, which pumps until `self.launched` closes):
`learn_round`, `new_round`, `close_cloud` (the round's phases on the cloud clock, once its sampling ended),
`publish_for_detector`, `before_next_launch`, `pending_parts` (the report's fields and notes, and what
`settle_at_end` needs), `pending_round` (a checkpoint's pending round), `settlement` (the entries a commit
consumes) and `settle_at_end`.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import grpc

from learner_svc.collector import Collector
from learner_svc.constants import DRAIN_STOP_REASON
from learner_svc.reporting import add_evaluation, bill_fields
from learner_svc.rounds import End, RoundLoop
from learner_svc.state import PendingRound, Round, RoundStats
from nitro import cost as nitro_cost
from nitro.rpc import metrics
from nitro.v1 import detector_pb2, scaler_pb2, training_pb2

# The policy gradient's noise terms a round may report and the scaler plans from (on-policy: PPO's own).
NOISE_TERMS = ("policy_noise_scale", "policy_grad_sq", "policy_trace_sigma")

log = logging.getLogger(__name__)

S = TypeVar("S", bound=RoundStats)


@dataclass
class OpenRound(Generic[S]):
    """A round of a pipelined loop from its launch to its close."""

    launch: Round
    stats: S
    phases: dict[str, float] = field(default_factory=dict)
    cloud: dict[str, float] = field(default_factory=dict)  # the same phases on the cloud clock (docs/cost.md)


class PipelinedLoop(RoundLoop[OpenRound[S]]):
    """RoundLoop with a pipelined close: the next round samples while this one is committed and evaluated."""

    # Whether a round's report waits for its evaluation functions at the next close (on-policy: they run beside
    # the next round) instead of here.
    holds_reports = False

    def __init__(self, job, deps):
        super().__init__(job, deps)
        self.collector = Collector(self)
        self.launched: Round | None = None  # the round sampling now
        self.carried: dict[str, float] = {}  # learner CPU of the last commit + evaluation (cloud clock)
        self.held: tuple[training_pb2.RoundReport, Future] | None = None  # a report waiting for its evaluation

    # -- RoundLoop's hooks --------------------------------------------------------------------------
    def open(self, resume: bool) -> End | None:
        """Restore, publish and launch the first round.

        A round committed but not reported (killed while evaluating it) is finished first."""
        if resume:
            pending = self.restore()
            self.resumed = True
            if pending:
                self.publish()  # the version it evaluates (evaluation functions read it from Redis)
                pending = self.pending_round(pending)
                end = self.finish_async_round(pending, dict(pending.phases), {})
                if end is not None:
                    return end
            elif self.job.reports:  # killed after the job's last report, before its end state was saved
                last = self.job.reports[-1]
                end = self.end_after(last.round + 1, last.eval_return, scaler_pb2.PlanResponse())
                if end is not None:
                    return end
        self.publish()
        plan = self.plan(self.next_round, self.last_score(), 0.0)
        end = self.end_after(self.next_round, math.nan, plan)  # the budget may not pay for a first round
        if end is not None:
            return end
        if not self.job.stop_requested.is_set():  # stopped: RoundLoop.train ends it before it samples
            self.launched = self.launch_round(self.next_round, plan.actors)
        return None

    def is_empty(self, rnd: OpenRound) -> bool:
        return rnd.stats.steps == 0 and rnd.launch.batches == 0

    def retry_round(self, k: int, rnd: OpenRound) -> None:
        self.launched = self.launch_round(k, rnd.launch.actors)  # fresh invocation ids

    def close_round(self, k: int, rnd: OpenRound[S]) -> End | None:
        """Learn from the round, publish and score its samples, plan and launch k+1, commit k, then evaluate and
        report k."""
        spec, phases = self.spec, rnd.phases
        self.learn_round(k, rnd)
        cloud = self.close_cloud(k, rnd)
        # A report held for its evaluation goes out before anything reads the job's reports again (the plan's
        # latest evaluation, the end conditions) and before this round's commit replaces the checkpoint it
        # evaluated (best.pt is copied from it).
        self.report_held(phases, cloud)
        with metrics.timed("publish", phases, cloud):
            self.publish_for_detector(rnd)
            ref = self.write_sample_subset(k)
        with metrics.timed("detect", phases):
            score_resp, fallback = self.score_or_fallback(k, ref, spec.algo, rnd.stats.notes)
        cloud["detect"] = score_resp.cpu_seconds
        means = rnd.stats.means()  # for the plan; the report's fields may count more (before_next_launch)
        last = self.plan_inputs(cloud, loss=means.get("policy_loss", 0.0) + means.get("value_loss", 0.0),
                                kl=means.get("kl", 0.0), eval_return=math.nan, env_steps=rnd.stats.steps,
                                **{name: means.get(name, 0.0) for name in NOISE_TERMS})
        with metrics.timed("plan", phases):
            next_plan = self.plan(k + 1, score_resp.score, means.get("gradient_noise_scale", 0.0), fallback, last,
                                  cloud_seconds=nitro_cost.cloud_round_seconds(cloud))
        ending = k + 1 >= spec.rounds or next_plan.budget_exhausted
        self.before_next_launch(k, rnd, ending)
        # No launch the job would abandon: its rounds or budget are spent, a held round's evaluation reached the
        # target (the job ends after this round, whatever this round's own evaluation says), or it was stopped.
        end = self.end_after(k + 1, self.latest_eval(), next_plan)
        if end is None and not self.job.stop_requested.is_set():
            with metrics.timed("invoke", phases):
                self.launched = self.launch_round(k + 1, next_plan.actors)
        fields, notes, extra = self.pending_parts(k, rnd)
        pending = PendingRound(round=k, fields=fields, score=score_resp.SerializeToString(),
                               plan=next_plan.SerializeToString(), notes=list(notes), fallback=fallback,
                               cloud=dict(cloud), phases=dict(phases), t=rnd.stats.t, ending=ending, extra=extra)
        # Commit and evaluation overlap the next round's sampling: on the cloud clock they are learner CPU of
        # the next round (`carried`: its "update" in IMPACT and Stellaris, its "publish" and "evaluate"
        # on-policy), not of this one.
        self.carried = {}
        with metrics.timed("publish", phases, self.carried):
            self.commit(k, pending.to_dict(), *self.settlement(rnd))
        finished = self.finish_async_round(pending, phases, self.carried)
        return finished if finished is not None else end

    def settle(self) -> None:
        if self.held is not None and self.job.stop_reason == DRAIN_STOP_REASON:
            # Not waited for: the held round is the checkpoint's unreported one, which the resume finishes.
            log.info("job %s: round %d's report waits for the resume (its evaluation was running)",
                     self.job.job_id, self.held[0].round)
            self.held = None
            return
        self.report_held(last=True)

    # -- the pipelined loop's hooks -------------------------------------------------------------------
    def learn_round(self, k: int, rnd: OpenRound[S]) -> None:
        """Learn from the closed round before it is published (on-policy: the update). Nothing by default: the
        asynchronous loops learned while it was open."""

    def new_round(self, k: int, actors: int) -> Round:
        """Round k's Round before its first wave: any actor invocation of this job and round counts."""
        return Round(job_id=self.job.job_id, k=k, actors=actors, version=self.version)

    def pending_round(self, pending: dict) -> PendingRound:
        """The checkpoint's pending round (plain data) as a PendingRound."""
        return PendingRound.from_dict(pending)

    def close_cloud(self, k: int, rnd: OpenRound[S]) -> dict[str, float]:
        """The round's phases on the cloud clock once its sampling ended; the pump's by default."""
        return rnd.cloud

    def publish_for_detector(self, rnd: OpenRound[S]) -> None:
        """Make the policy and `learner.last_data` the detector's sample subset is drawn from current."""
        self.publish()

    def before_next_launch(self, k: int, rnd: OpenRound[S], ending: bool) -> None:
        """The loop's last work on round k before k+1 launches (`ending`: none will). Nothing by default."""

    def pending_parts(self, k: int, rnd: OpenRound[S]) -> tuple[dict, list[str], dict]:
        """The closed round's RoundReport fields (those neither its evaluation nor its closing depend on),
        its notes, and the loop's own data the checkpoint keeps for settle_at_end."""
        raise NotImplementedError

    def settlement(self, rnd: OpenRound[S]) -> tuple[list, dict | None]:
        """What the round's commit consumes: (stream entries, counted) as RoundLoop.commit takes them."""
        raise NotImplementedError

    def settle_at_end(self, pending: PendingRound, phases: dict) -> tuple[PendingRound, tuple | None]:
        """A loop's last work when its target ends the job early: the pending round with new fields and notes,
        and (entries, counted) to commit with the report, or None. Nothing to do by default."""
        return pending, None

    # -- launching, closing, reporting ----------------------------------------------------------------
    def launch_round(self, k: int, actors: int) -> Round:
        metrics.set_job(metrics.ACTORS_PER_ROUND, self.job.job_id, actors)
        rnd = self.new_round(k, actors)
        self.collector.launch(rnd, range(actors), self.spec.round_deadline_s)
        return rnd

    def finish_async_round(self, pending: PendingRound, phases: dict, carried: dict) -> End | None:
        """Evaluate a committed round and report it (or hold its report: `holds_reports`); how the job ends, or
        None when it goes on.

        checkpoint.pt is the policy evaluated here, so best.pt is kept before anything changes it."""
        k = pending.round
        next_plan = scaler_pb2.PlanResponse.FromString(pending.plan)
        self.next_round = k + 1
        if "report" in pending.extra:  # committed with its finished report (settle_at_end): only write it
            report = training_pb2.RoundReport.FromString(pending.extra["report"])
            self.write_report(report)
            return self.end_after(k + 1, report.eval_return, next_plan)
        with metrics.timed("evaluate", phases, carried):  # "functions" and held: only their launch
            evaluation = self.start_evaluation(k, last=pending.ending)
            if evaluation is not None and not self.holds_reports:
                evaluation.result()
        if evaluation is not None and not evaluation.done():  # holds_reports: finished by report_held
            self.held = (self.round_report(pending, phases, next_plan), evaluation)
            return self.end_after(k + 1, self.latest_eval(), next_plan)
        result = evaluation.result() if evaluation is not None else None
        eval_return = result.eval_return if result is not None else math.nan
        self.keep_best(eval_return)
        end = self.end_after(k + 1, self.latest_eval(eval_return), next_plan)
        settled = None
        if end is not None and not pending.ending:  # the target is reached: the job ends before its rounds
            pending, settled = self.settle_at_end(pending, phases)
        report = self.round_report(pending, phases, next_plan)
        if result is not None:
            add_evaluation(report, result)
        if settled is not None:  # what settling learned is durable before the job ends, with its report
            self.commit(k, {**pending.to_dict(), "report": report.SerializeToString()}, *settled)
        self.write_report(report)
        return end

    def round_report(self, pending: PendingRound, phases: dict,
                     next_plan: scaler_pb2.PlanResponse) -> training_pb2.RoundReport:
        """A committed round's report, its evaluation still to fill in (reporting.add_evaluation)."""
        notes = list(pending.notes)
        resumed = self.take_resumed(notes)
        return training_pb2.RoundReport(
            **pending.fields, resumed=resumed,
            **self.closing_report_fields(eval_return=math.nan,
                                         score_resp=detector_pb2.ScoreResponse.FromString(pending.score),
                                         next_plan=next_plan, phases=phases,
                                         round_seconds=max(time.time() - pending.t, sum(phases.values())),
                                         notes=notes, fallback=pending.fallback, cloud_phases=pending.cloud))

    def report_held(self, phases: dict | None = None, cloud: dict | None = None, last: bool = False) -> None:
        """Report the round held back for its evaluation. The wait (normally none: it ran beside this round)
        counts in this round's `phases`, on the `cloud` clock only as far as the evaluation functions outlast
        this round so far. The job's `last` report takes its bill again once the evaluation is in: that
        evaluation's functions were billed after the report was built, and nothing later would count them."""
        if self.held is None:
            return
        (report, evaluation), self.held = self.held, None
        t0 = time.perf_counter()
        result = evaluation.result()
        if phases is not None and cloud is not None:
            phases["evaluate"] = phases.get("evaluate", 0.0) + (time.perf_counter() - t0)
            cloud["evaluate"] = cloud.get("evaluate", 0.0) + max(
                0.0, result.cloud_seconds - nitro_cost.cloud_round_seconds(cloud))
        add_evaluation(report, result)
        if last:
            try:
                bill = bill_fields(self.cost(), self.job.reports[-1] if self.job.reports else None)
            except grpc.RpcError as exc:  # the report keeps its earlier bill; the scaler's GetCost has the rest
                report.notes.append(f"the final evaluation's bill is not in this report: GetCost {exc.code().name}")
            else:
                for name, value in bill.items():
                    setattr(report, name, value)
        self.append_report(report)

    def score_or_fallback(self, k: int, ref: str, algo: str, notes: list[str]):
        """(ScoreResponse, fallback actors): the score, or the configured fallback when the detector fails."""
        if not ref:
            return detector_pb2.ScoreResponse(), 0
        try:
            return self.score(k, ref, algo=algo), 0
        except grpc.RpcError as exc:
            return detector_pb2.ScoreResponse(), self.detector_fallback(exc.code().name, notes)
