"""The asynchronous loops' round, written once: off-policy IMPACT (offpolicy.py) and the Stellaris parameter
service (parameter_service.py) supply only how they learn while a round is open.

Round k's actors are launched as soon as round k-1 closed and was planned. The loop pumps the stream until
round k closes (every actor's batch is in, failed or lost, or its deadline passed); then it publishes and
scores the round's samples, plans round k+1 and launches it, commits round k, and only then evaluates and
reports round k, so evaluation overlaps round k+1's sampling. What a committed round still needs for its
report (`PendingRound`) is in its checkpoint: a learner killed before the report finishes the round on
resume.

Hooks of a pipelined loop (besides RoundLoop.sample_round, which pumps until `self.launched` closes):
`close_cloud` (the round's phases on the cloud clock, once its sampling ended), `publish_for_detector`,
`before_next_launch`, `pending_parts` (the report's fields and notes, and what `settle_at_end` needs),
`settlement` (the entries a commit consumes) and `settle_at_end`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import grpc

from learner_svc.collector import Collector
from learner_svc.rounds import End, RoundLoop
from learner_svc.state import PendingRound, Round, RoundStats
from nitro import cost as nitro_cost
from nitro.rpc import metrics
from nitro.v1 import detector_pb2, scaler_pb2, training_pb2

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

    def __init__(self, job, deps):
        super().__init__(job, deps)
        self.collector = Collector(self)
        self.launched: Round | None = None  # the round sampling now
        self.carried: dict[str, float] = {}  # learner CPU of the last commit + evaluation (cloud clock)

    # -- RoundLoop's hooks --------------------------------------------------------------------------
    def open(self, resume: bool) -> End | None:
        """Restore, publish and launch the first round.

        A round committed but not reported (killed while evaluating it) is finished first."""
        if resume:
            pending = self.restore()
            self.resumed = True
            if pending:
                self.publish()  # the version it evaluates (evaluation functions read it from Redis)
                end = self.finish_async_round(PendingRound.from_dict(pending), dict(pending["phases"]), {})
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
        self.launched = self.launch_round(self.next_round, plan.actors)
        return None

    def is_empty(self, rnd: OpenRound) -> bool:
        return rnd.stats.steps == 0 and rnd.launch.batches == 0

    def retry_round(self, k: int, rnd: OpenRound) -> None:
        self.launched = self.launch_round(k, rnd.launch.actors)  # fresh invocation ids

    def close_round(self, k: int, rnd: OpenRound[S]) -> End | None:
        """Publish and score the round's samples, plan and launch k+1, commit k, then evaluate and report k."""
        spec, phases = self.spec, rnd.phases
        cloud = self.close_cloud(k, rnd)
        with metrics.timed("publish", phases, cloud):
            self.publish_for_detector(rnd)
            ref = self.write_sample_subset(k)
        with metrics.timed("detect", phases):
            score_resp, fallback = self.score_or_fallback(k, ref, spec.algo, rnd.stats.notes)
        cloud["detect"] = score_resp.cpu_seconds
        means = rnd.stats.means()  # for the plan; the report's fields may count more (before_next_launch)
        last = self.plan_inputs(cloud, loss=means.get("policy_loss", 0.0) + means.get("value_loss", 0.0),
                                kl=means.get("kl", 0.0), eval_return=math.nan, env_steps=rnd.stats.steps)
        with metrics.timed("plan", phases):
            next_plan = self.plan(k + 1, score_resp.score, means.get("gradient_noise_scale", 0.0), fallback, last,
                                  cloud_seconds=nitro_cost.cloud_round_seconds(cloud))
        ending = k + 1 >= spec.rounds or next_plan.budget_exhausted
        self.before_next_launch(k, rnd, ending)
        if not ending:
            with metrics.timed("invoke", phases):
                self.launched = self.launch_round(k + 1, next_plan.actors)
        fields, notes, extra = self.pending_parts(k, rnd)
        pending = PendingRound(round=k, fields=fields, score=score_resp.SerializeToString(),
                               plan=next_plan.SerializeToString(), notes=list(notes), fallback=fallback,
                               cloud=dict(cloud), phases=dict(phases), t=rnd.stats.t, ending=ending, extra=extra)
        # Commit and evaluation overlap the next round's sampling: on the cloud clock they are learner CPU of
        # the next round ("update"), not of this one.
        self.carried = {}
        with metrics.timed("publish", phases, self.carried):
            self.commit(k, pending.to_dict(), *self.settlement(rnd))
        return self.finish_async_round(pending, phases, self.carried)

    # -- the pipelined loop's hooks -------------------------------------------------------------------
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
        rnd = Round(job_id=self.job.job_id, k=k, actors=actors, version=self.version)
        self.collector.launch(rnd, range(actors), self.spec.round_deadline_s)
        return rnd

    def finish_async_round(self, pending: PendingRound, phases: dict, carried: dict) -> End | None:
        """Evaluate a committed round and report it; how the job ends, or None when it goes on.

        checkpoint.pt is the policy evaluated here, so best.pt is kept before anything changes it."""
        k = pending.round
        next_plan = scaler_pb2.PlanResponse.FromString(pending.plan)
        self.next_round = k + 1
        if "report" in pending.extra:  # committed with its finished report (settle_at_end): only write it
            report = training_pb2.RoundReport.FromString(pending.extra["report"])
            self.write_report(report)
            return self.end_after(k + 1, report.eval_return, next_plan)
        eval_notes: list[str] = []
        with metrics.timed("evaluate", phases, carried):
            eval_return = self.evaluate_policy(k, last=pending.ending, notes=eval_notes)
        self.keep_best(eval_return)
        end = self.end_after(k + 1, eval_return, next_plan)
        settled = None
        if end is not None and not pending.ending:  # the target is reached: the job ends before its rounds
            pending, settled = self.settle_at_end(pending, phases)
        notes = list(pending.notes) + eval_notes
        resumed = self.take_resumed(notes)
        report = training_pb2.RoundReport(
            **pending.fields, resumed=resumed,
            **self.closing_report_fields(eval_return=eval_return,
                                         score_resp=detector_pb2.ScoreResponse.FromString(pending.score),
                                         next_plan=next_plan, phases=phases, round_seconds=time.time() - pending.t,
                                         notes=notes, fallback=pending.fallback, cloud_phases=pending.cloud))
        if settled is not None:  # what settling learned is durable before the job ends, with its report
            self.commit(k, {**pending.to_dict(), "report": report.SerializeToString()}, *settled)
        self.write_report(report)
        return end

    def score_or_fallback(self, k: int, ref: str, algo: str, notes: list[str]):
        """(ScoreResponse, fallback actors): the score, or the configured fallback when the detector fails."""
        if not ref:
            return detector_pb2.ScoreResponse(), 0
        try:
            return self.score(k, ref, algo=algo), 0
        except grpc.RpcError as exc:
            return detector_pb2.ScoreResponse(), self.detector_fallback(exc.code().name, notes)
