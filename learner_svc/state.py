"""Typed round state of the loops: a round's actor batches (Round: its launches, what it keeps of the stream,
what is missing, when it is closed), what a closed round still needs for its report, and the counters a round
of an asynchronous loop accumulates while it is open.

What a checkpoint keeps of them is plain data (`to_dict`/`from_dict`), with the keys of the dicts the
checkpoints of earlier learners hold, so a checkpoint resumes across versions of these classes.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import grpc

from learner_svc.clients import failure_note, retry_note
from learner_svc.constants import LOST_BATCH_GRACE_S
from learner_svc.slots import ActorSlots
from nitro.v1 import scaler_pb2


class Ingest(enum.Enum):
    """What a round makes of a stream entry (Round.ingest): the one rule every loop reads the stream by."""

    KEPT = "kept"  # one of the round's own invocations (at the round's version, on-policy): counts toward it
    LATE = "late"  # another round's, or an invocation the round did not launch: still data for an async loop
    STALE = "stale"  # another round's or version's, in an on-policy round: dropped (acked, not learned from)
    DUPLICATE = "duplicate"  # an entry the round already took: dropped


@dataclass
class Wave:
    """One Launch of some of a round's slots, from its RPC to its response."""

    number: int  # the wave's index in the round (invocation ids carry it)
    slots: list[int]
    future: Future  # the blocking Launch
    deadline: float  # perf_counter time: a Launch that has not returned by then closes the wave
    start: float = field(default_factory=time.perf_counter)
    resp: scaler_pb2.LaunchResponse | None = None
    done_at: float | None = None  # when the Launch returned
    failed: set[int] = field(default_factory=set)  # slots whose invocation returned failed

    def poll(self, slot_of, notes: list[str]) -> scaler_pb2.LaunchResponse | None:
        """The Launch's response the first time it is seen returned, else None. Failed slots (`slot_of` maps an
        invocation id to its slot) are recorded; retries and failures become notes."""
        if self.resp is not None or not self.future.done():
            return None
        self.done_at = time.perf_counter()
        try:
            self.resp = self.future.result()
        except grpc.RpcError as exc:
            notes.append(f"launch (wave {self.number}) failed: {exc.code().name}: {exc.details()}")
            self.resp = scaler_pb2.LaunchResponse()
            self.failed.update(self.slots)
        notes.extend(note for note in map(retry_note, self.resp.invocations) if note)
        for r in self.resp.invocations:
            if not r.ok:
                if (slot := slot_of(r.invocation_id)) is not None:
                    self.failed.add(slot)
                notes.append(failure_note(r))
        return self.resp

    def closed(self, waiting: set[int], now: float) -> bool:
        """Every slot still `waiting` failed, or is lost (LOST_BATCH_GRACE_S after the Launch returned with it
        OK), or nothing is waited for; or the Launch has not returned by the deadline."""
        if self.resp is None:
            return now > self.deadline
        return not waiting or waiting <= self.failed or now - self.done_at > LOST_BATCH_GRACE_S


@dataclass
class Round:
    """Round k's actor batches, in every loop: its waves of launches, which entries it keeps (`ingest`), which
    slots are still missing, when it is closed, and what its report says of its actors (`summary`).

    `on_policy`: only batches of this round's invocations sampled with `version` are kept; everything else is
    stale. Otherwise (IMPACT, Stellaris) other rounds' batches are late data the loop still learns from.
    `ids`: the invocation ids that count, registered per wave (on-policy; a resumed learner adds the waves it
    took over); None counts any actor invocation of this job and round."""

    job_id: str
    k: int
    actors: int
    version: int  # the policy version the round's actors were launched with
    on_policy: bool = False
    ids: dict[str, int] | None = None
    waves: list[Wave] = field(default_factory=list)
    slots: ActorSlots = field(init=False)  # which slots' batches are whole
    batches: int = 0  # entries (parts) kept
    steps: int = 0  # env steps kept
    late: int = 0
    stale: int = 0
    stale_steps: int = 0
    duplicates: int = 0
    _seen: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.slots = ActorSlots(self.job_id, self.k, self.actors, ids=self.ids)

    def launch(self, number: int, slots, future: Future, deadline_s: float, start: float | None = None) -> Wave:
        """A wave of `slots` launched (`future`: its Launch); its invocations count toward the round."""
        slots = list(slots)
        if self.slots.ids is not None:
            self.slots.expect(slots, number)
        start = time.perf_counter() if start is None else start
        wave = Wave(number, slots, future, deadline=start + deadline_s, start=start)
        self.waves.append(wave)
        return wave

    @property
    def wave(self) -> Wave:
        return self.waves[-1]

    @property
    def covered(self) -> set[int]:
        return self.slots.covered

    @property
    def failed(self) -> set[int]:
        return set().union(*(w.failed for w in self.waves)) - self.covered

    def poll(self, notes: list[str]) -> scaler_pb2.LaunchResponse | None:
        """The latest wave's response, the first time it is seen (Wave.poll)."""
        return self.wave.poll(self.slots.slot, notes)

    def ingest(self, entry) -> Ingest:
        """Classify a stream entry (a TrajectoryEntry: a batch or one part of a split one) and count it. A slot is
        covered once every part of one of its invocations is in (ActorSlots)."""
        if entry.dedup_id in self._seen:
            self.duplicates += 1
            return Ingest.DUPLICATE
        ours = entry.round == self.k and self.slots.slot(entry.invocation_id) is not None
        if ours and (not self.on_policy or entry.policy_version == self.version):
            self._seen.add(entry.dedup_id)
            self.slots.arrived(entry.invocation_id, entry.part, entry.parts)
            self.batches += 1
            self.steps += entry.steps
            return Ingest.KEPT
        if self.on_policy:
            self.stale += 1
            self.stale_steps += entry.steps
            return Ingest.STALE
        self.late += 1
        return Ingest.LATE

    def missing(self, slots=None) -> set[int]:
        """Of `slots` (all the round's by default), those without a whole batch yet."""
        return self.slots.waiting(slots)

    def closed(self, now: float | None = None) -> bool:
        """The latest wave is closed (Wave.closed) over the slots it launched that are still missing."""
        wave = self.wave
        now = time.perf_counter() if now is None else now
        return wave.closed(self.missing(wave.slots), now)

    def summary(self) -> LaunchSummary:
        resps = [w.resp for w in self.waves if w.resp is not None]
        return LaunchSummary(actors=self.actors, version=self.version, covered=set(self.covered),
                             failed=self.failed, retries=sum(r.retries for r in resps),
                             cloud_cost_usd=sum(r.cloud_cost_usd for r in resps))


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
    """What a round counts while it is open (each loop adds its own counters)."""

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
    """A closed round that is committed but not yet reported: what its report still needs.

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
        # The messages as hex: load_policy reads a checkpoint with torch.load(weights_only=True), which refuses
        # an empty bytes object (an unset ScoreResponse where nothing is scored).
        return {"round": self.round, "fields": self.fields, "score": self.score.hex(), "plan": self.plan.hex(),
                "notes": list(self.notes), "fallback": self.fallback, "cloud": dict(self.cloud),
                "phases": dict(self.phases), "t": self.t, "ending": self.ending, **self.extra}

    @classmethod
    def from_dict(cls, d: dict) -> PendingRound:
        fields = {key: d[key] for key in PENDING_KEYS}
        for key in ("score", "plan"):  # bytes in checkpoints written before they were hex
            if isinstance(fields[key], str):
                fields[key] = bytes.fromhex(fields[key])
        return cls(**fields, extra={key: v for key, v in d.items() if key not in PENDING_KEYS})
