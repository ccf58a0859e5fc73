"""The record of a round's invocations: what makes Launch idempotent and a resumed round quick.

Each invocation a Launch starts gets one field in its round's hash (`nitro.contracts.launches_key`): first
`running`, with the Launch call that runs it (its `owner`, whose liveness lease is
`nitro.contracts.launch_owner_key`) and the fingerprint of what it runs; then `done`, with its result and
what it was billed. A Launch retried with the same invocation ids answers from the record (waiting while the
owner still runs them) and invokes and bills nothing again; an invocation whose owner died before it returned
is answered as lost. A resumed learner reads the same record to see at once which actors of the waves its
predecessor launched failed (`round_status`).

Pure: encoding, decoding and the rules; the Redis calls are the scaler's (scaler_svc/launches.py) and the
learner's (learner_svc/clients.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field

RUNNING, DONE = "running", "done"
# The error type of an invocation whose Launch ended (its scaler died) before the invocation returned: its
# outcome is unknown, nothing more is billed for it, and a batch it sent still counts for its round.
LOST_ERROR = "Nitro.LaunchLost"
LOST_MESSAGE = ("the Launch that ran this invocation ended before it returned (its scaler stopped); "
                "not invoked or billed again, and a batch it sent still counts for its round")


class RecordError(ValueError):
    """A field of the record that is not a record (written by something else, or damaged)."""


@dataclass(frozen=True)
class InvocationRecord:
    state: str  # RUNNING or DONE
    fingerprint: str  # of the invocation's parameters (`fingerprint`): a retry must ask for the same thing
    owner: str  # the Launch call running it; its liveness lease is launch_owner_key(job, owner)
    result: dict = field(default_factory=dict)  # DONE: nitro.v1.InvocationResult's fields
    usd: float = 0.0  # DONE: what it was billed (the machine clock) ...
    cloud_usd: float = 0.0  # ... the modelled cloud bill ...
    cloud_seconds: float = 0.0  # ... and its modelled time

    @property
    def done(self) -> bool:
        return self.state == DONE

    @property
    def failed(self) -> bool:
        """Returned without success (a lost one is not: its outcome is unknown)."""
        return self.done and not self.result.get("ok", False) and self.result.get("error_type") != LOST_ERROR

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, raw: bytes | str) -> InvocationRecord:
        try:
            d = json.loads(raw)
            record = cls(state=str(d["state"]), fingerprint=str(d["fingerprint"]), owner=str(d["owner"]),
                         result=dict(d.get("result") or {}), usd=float(d.get("usd", 0.0)),
                         cloud_usd=float(d.get("cloud_usd", 0.0)), cloud_seconds=float(d.get("cloud_seconds", 0.0)))
        except (ValueError, TypeError, KeyError) as exc:
            raise RecordError(f"not an invocation record: {exc}") from None
        if record.state not in (RUNNING, DONE):
            raise RecordError(f"not an invocation record: state {record.state!r}")
        return record


def running(fingerprint: str, owner: str) -> InvocationRecord:
    return InvocationRecord(RUNNING, fingerprint, owner)


def lost(record: InvocationRecord, invocation_id: str) -> InvocationRecord:
    """A running record whose owner is gone: done, not ok, nothing billed."""
    return InvocationRecord(DONE, record.fingerprint, record.owner,
                            result={"invocation_id": invocation_id, "ok": False, "error_type": LOST_ERROR,
                                    "error_message": LOST_MESSAGE})


def fingerprint(parameters: Mapping[str, object]) -> str:
    """A short digest of what an invocation runs (everything a retry must repeat; not its deadline)."""
    canonical = json.dumps(dict(parameters), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def decode_all(fields: Mapping[bytes | str, bytes | str | None]) -> dict[str, InvocationRecord]:
    """{invocation id: record} of a round's hash (or an HMGET of it: missing fields are None), skipping
    fields that are not records."""
    out = {}
    for key, raw in fields.items():
        if raw is None:
            continue
        try:
            out[key.decode() if isinstance(key, bytes) else key] = InvocationRecord.decode(raw)
        except RecordError:
            continue
    return out


@dataclass(frozen=True)
class RoundStatus:
    """What a resumed learner knows of the invocations launched for a round before it started."""

    running: bool  # some invocation is still run by a live Launch
    failed: frozenset[int]  # slots all of whose recorded invocations returned without success


def round_status(records: Mapping[str, InvocationRecord], slot_of: Mapping[str, int],
                 live_owners: Iterable[str]) -> RoundStatus:
    """The status of the invocations in `slot_of` (invocation id -> slot) from their records.

    A running record counts as running only while its owner is alive (`live_owners`); one whose owner died is
    neither running nor failed: its actor may still deliver, so the learner gives it the lost-batch grace. A
    slot has failed when every one of its recorded invocations returned without success: the learner replaces
    it at once instead of waiting out the round's deadline."""
    alive = set(live_owners)
    mine = {inv: r for inv, r in records.items() if inv in slot_of}
    by_slot: dict[int, list[InvocationRecord]] = {}
    for inv, r in mine.items():
        by_slot.setdefault(slot_of[inv], []).append(r)
    return RoundStatus(
        running=any(not r.done and r.owner in alive for r in mine.values()),
        failed=frozenset(s for s, rs in by_slot.items() if all(r.failed for r in rs)))


def running_owners(records: Mapping[str, InvocationRecord]) -> set[str]:
    """The Launch calls that the records say are running something (whose leases to check)."""
    return {r.owner for r in records.values() if not r.done}
