"""Typed round state of the loops: an actor launch in flight, what a closed round still needs for its report,
and the counters a round of an asynchronous loop accumulates while it is open.

What a checkpoint keeps of them is plain data (`to_dict`/`from_dict`), with the keys of the dicts the
checkpoints of earlier learners hold, so a checkpoint resumes across versions of these classes.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import grpc

from learner_svc.clients import failure_note, retry_note
from learner_svc.constants import LOST_BATCH_GRACE_S
from learner_svc.slots import ActorSlots
from nitro.v1 import scaler_pb2


@dataclass
class LaunchedRound:
    """An asynchronous round's actor launch, from its Launch RPC to the round's close."""

    job_id: str
    k: int
    actors: int
    version: int  # the policy version the round's actors were launched with
    future: Future  # the blocking Launch
    start: float = field(default_factory=time.perf_counter)
    resp: scaler_pb2.LaunchResponse | None = None
    done_at: float | None = None  # when the Launch returned
    slots: ActorSlots = field(init=False)  # which slots' batches are whole, which failed
    batches: int = 0  # entries (parts) of this round arrived
    steps: int = 0

    def __post_init__(self) -> None:
        self.slots = ActorSlots(self.job_id, self.k, self.actors)

    @property
    def covered(self) -> set[int]:
        return self.slots.covered

    @property
    def failed(self) -> set[int]:
        return self.slots.failed

    def poll(self, notes: list[str]) -> None:
        """Take the Launch's response once it returned: failed slots, and notes on retries and failures."""
        if self.resp is not None or not self.future.done():
            return
        self.done_at = time.perf_counter()
        try:
            self.resp = self.future.result()
        except grpc.RpcError as exc:
            notes.append(f"launch failed: {exc.code().name}: {exc.details()}")
            self.resp = scaler_pb2.LaunchResponse()
            self.failed.update(range(self.actors))
        notes.extend(note for note in map(retry_note, self.resp.invocations) if note)
        for r in self.resp.invocations:
            if not r.ok:
                slot = self.slots.slot(r.invocation_id)
                if slot is not None:
                    self.failed.add(slot)
                notes.append(failure_note(r))

    def closed(self, deadline_s: float) -> bool:
        """Every slot's whole batch is in, or failed, or lost (LOST_BATCH_GRACE_S after the Launch returned); or
        the Launch has not returned within the round deadline."""
        if self.resp is None:
            return time.perf_counter() - self.start > deadline_s
        waiting = self.slots.waiting()
        return not waiting or waiting <= self.failed or time.perf_counter() - self.done_at > LOST_BATCH_GRACE_S

    def covers(self, entry) -> bool:
        """Count an arriving entry (a TrajectoryEntry: a batch or one part of a split one) of this round toward
        it; whether it is one of this round's actor invocations. Its slot is covered once every part is in."""
        self.batches += 1
        return self.slots.arrived(entry.invocation_id, entry.part, entry.parts) is not None

    def summary(self) -> LaunchSummary:
        return LaunchSummary(actors=self.actors, version=self.version, covered=set(self.covered),
                             failed=set(self.failed), retries=self.resp.retries if self.resp is not None else 0,
                             cloud_cost_usd=self.resp.cloud_cost_usd if self.resp is not None else 0.0)


@dataclass
class LaunchSummary:
    """What a round's report needs of its launch."""

    actors: int
    version: int
    covered: set[int]
    failed: set[int]
    retries: int = 0
    cloud_cost_usd: float = 0.0  # the launch's modelled Lambda bill (LaunchResponse.cloud_cost_usd)

    def report_fields(self, k: int) -> dict:
        return dict(round=k, policy_version=self.version, actors_launched=self.actors,
                    actors_completed=len(self.covered), actors_failed=len(self.failed - self.covered),
                    invocation_retries=self.retries, cloud_actor_cost_usd=self.cloud_cost_usd)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> LaunchSummary:
        return cls(**copy.deepcopy(d))


@dataclass
class RoundStats:
    """What a round of an asynchronous loop counts while it is open."""

    notes: list[str] = field(default_factory=list)
    steps: int = 0  # fresh env steps counted in this round
    late: int = 0  # batches of earlier rounds that arrived in this one
    sums: dict[str, float] = field(default_factory=dict)  # update statistics, summed
    t: float = field(default_factory=time.time)  # wall time the round began

    def add(self, name: str, value: float) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + value

    def means_over(self, n: int) -> dict[str, float]:
        n = max(n, 1)
        return {name: v / n for name, v in self.sums.items()}

    def means(self) -> dict[str, float]:
        """The round's mean update statistics."""
        raise NotImplementedError


PENDING_KEYS = ("round", "fields", "score", "plan", "notes", "fallback", "cloud", "phases", "t", "ending")


@dataclass
class PendingRound:
    """A closed asynchronous round that is committed but not yet reported: what its report still needs.

    The checkpoint keeps it, so a learner killed before the report finishes the round on resume."""

    round: int
    fields: dict[str, Any]  # the loop's RoundReport fields, fixed when the round closed
    score: bytes  # detector_pb2.ScoreResponse
    plan: bytes  # scaler_pb2.PlanResponse of the next round
    notes: list[str]
    fallback: int  # fallback actors when the detector failed, else 0
    cloud: dict[str, float]
    phases: dict[str, float]
    t: float  # wall time the round began
    ending: bool  # the job's last round (its rounds or its budget are spent)
    extra: dict[str, Any] = field(default_factory=dict)  # the loop's own (settle_at_end); "report" once finished

    def to_dict(self) -> dict:
        return {"round": self.round, "fields": self.fields, "score": self.score, "plan": self.plan,
                "notes": list(self.notes), "fallback": self.fallback, "cloud": dict(self.cloud),
                "phases": dict(self.phases), "t": self.t, "ending": self.ending, **self.extra}

    @classmethod
    def from_dict(cls, d: dict) -> PendingRound:
        return cls(**{key: d[key] for key in PENDING_KEYS},
                   extra={key: v for key, v in d.items() if key not in PENDING_KEYS})
