"""Redis layout of a job (DESIGN section 3): policy blobs and the trajectory stream.

Every key is bounded: policies expire, acked stream entries are deleted, the
stream has a MAXLEN safety cap, and the dedup record keeps a time window.

Entry size: a stream entry holds one signed batch. `append_batch` keeps each
entry under the writer's `max_entry_bytes` (default 32 MiB, far below Redis's
proto-max-bulk-len of 512 MiB and the reader's max_payload_bytes of 256 MiB):
image observations are compressed, and a batch still too large is split into
contiguous parts (nitro.data.batching) written atomically, each a complete batch whose
signed record carries (part, parts). A part is deduplicated by
"invocation_id#part/parts"; an unsplit entry keeps the exact earlier format.

Keys: an actor signs with its invocation's own key (nitro.contracts.invocation_key, handed to it in its event);
the reader holds the master key and derives, for each entry, the key of the invocation the entry names, so an
entry verifies only as the batch of that invocation of this job: one signed with another job's or another
invocation's key is rejected as `bad_signature`, before it can claim that invocation's dedup id.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis

from nitro.contracts import (
    check_job_id,
    invocation_key,
    latest_policy_key,
    parse_invocation_id,
    policy_key,
    seen_key,
    stream_key,
)
from nitro.data.batching import split_batch, steps_of, wants_compression
from nitro.data.codec import (
    BadSignatureError,
    MalformedPayloadError,
    PayloadError,
    PayloadTooLargeError,
    UnsignedPayloadError,
    decode,
    encode_buffer,
)

log = logging.getLogger(__name__)

_FIELDS = (b"inv", b"round", b"version", b"steps")
_PART_FIELDS = (b"part", b"parts")
DEFAULT_MAX_ENTRY_BYTES = 32 << 20
# Consuming entries, as one script so no other client runs between its commands: XACK and XDEL the entry
# ids, ZADD (score, dedup id) pairs to the job's seen record, and, when a trim point is given, drop older ids
# and renew the record's expiry. Returns how many dedup ids were new. As with MULTI/EXEC, a command that
# fails does not undo those before it; all are idempotent, so sending the ack again completes it. Ids go to
# Lua in slices: unpack() of more values than its stack holds (about 8,000) fails. KEYS: stream, seen
# record. ARGV: group, ttl_s, trim point or "", n, n entry ids, then the pairs. (Measured on 2026-11-27:
# 0.110 ms an ack, against 0.132 ms as MULTI/EXEC.)
_CONSUME_SCRIPT = """
local group, ttl, trim_before, n = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local last = 4 + n
for i = 5, last, 4000 do
  local j = math.min(i + 3999, last)
  redis.call('XACK', KEYS[1], group, unpack(ARGV, i, j))
  redis.call('XDEL', KEYS[1], unpack(ARGV, i, j))
end
local added = 0
for i = last + 1, #ARGV, 4000 do
  added = added + redis.call('ZADD', KEYS[2], unpack(ARGV, i, math.min(i + 3999, #ARGV)))
end
if trim_before ~= '' then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', trim_before)
  redis.call('EXPIRE', KEYS[2], ttl)
end
return added
"""
REDIS_MAX_BULK_BYTES = 512 << 20  # Redis's default proto-max-bulk-len: no single value may be larger


class ForeignInvocationError(PayloadError):
    """A signed entry that is not the batch of one of this job's actor invocations for the round its id names."""

    reason = "foreign_invocation"


class PolicyNotFoundError(LookupError):
    def __init__(self, job_id: str, version: int):
        self.job_id, self.version = job_id, version
        super().__init__(f"policy version {version} of job {job_id!r} not found (never published or expired)")


class PolicyStore:
    """Serialized policy weights by version; one writer (the learner), many readers."""

    def __init__(self, client: redis.Redis, job_id: str, ttl_s: int = 3600):
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s!r}")
        self._r, self.job_id, self.ttl_s = client, check_job_id(job_id), int(ttl_s)

    def put(self, version: int, blob: bytes, drop: Iterable[int] = ()) -> None:
        """Publish `version` as the latest; delete the versions in `drop` in the same transaction."""
        pipe = self._r.pipeline(transaction=True)
        pipe.set(policy_key(self.job_id, version), blob, ex=self.ttl_s)
        pipe.set(latest_policy_key(self.job_id), version, ex=self.ttl_s)
        stale = [policy_key(self.job_id, v) for v in drop]
        if stale:
            pipe.delete(*stale)
        pipe.execute()

    def get(self, version: int) -> bytes:
        blob = self._r.get(policy_key(self.job_id, version))
        if blob is None:
            raise PolicyNotFoundError(self.job_id, version)
        return blob

    def latest(self) -> int | None:
        v = self._r.get(latest_policy_key(self.job_id))
        return int(v) if v is not None else None


class TrajectoryWriter:
    """Actor side: one signed stream entry per invocation (several when `append_batch` splits it)."""

    def __init__(self, client: redis.Redis, job_id: str, key: bytes | Callable[[str], bytes], maxlen: int = 10000,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES, io=contextlib.nullcontext):
        """`key`: the signing key of the invocation this writer appends for (an actor's, from its event), or a
        function from invocation id to its key (a holder of the master key: tests and benchmarks).
        `io`: a context-manager factory entered around each network round trip (the cloud clock's
        InvocationClock.io), so encoding and signing stay outside it."""
        if not 0 < max_entry_bytes <= REDIS_MAX_BULK_BYTES:
            raise ValueError(f"max_entry_bytes must be in (0, {REDIS_MAX_BULK_BYTES}] (Redis proto-max-bulk-len), "
                             f"got {max_entry_bytes!r}")
        self._r, self._stream, self._maxlen = client, stream_key(job_id), maxlen
        self._key_of = key if callable(key) else (lambda invocation_id: key)
        self.max_entry_bytes = int(max_entry_bytes)
        self._io = io

    def append(
        self,
        *,
        invocation_id: str,
        round: int,
        policy_version: int,
        steps: int,
        batch: dict,
        compress: bool = False,
    ) -> str:
        if not invocation_id or not isinstance(invocation_id, str):
            raise ValueError("invocation_id must be a non-empty str")
        meta = (invocation_id, int(round), int(policy_version), int(steps))
        # The stream fields are readable without decoding, but the signed copy is
        # what the reader trusts: re-labelling a valid payload cannot dodge dedup.
        payload = encode_buffer((*meta, batch), self._key_of(invocation_id), compress=compress)
        return self._xadd([(meta, payload)])[0]

    def append_batch(self, *, invocation_id: str, round: int, policy_version: int, batch: dict,
                     compress: bool | None = None, value_of: Callable | None = None) -> list[str]:
        """Append a batch as one entry, or as contiguous parts if it encodes above max_entry_bytes.

        compress=None compresses image observations (nitro.data.batching.wants_compression).
        value_of: the critic, for the bootstrap values at the cuts of a batch without per-step values.
        Parts go in one MULTI/EXEC, so the learner never sees half of a split batch.
        Raises PayloadTooLargeError when even a single step is over the cap.
        """
        if not invocation_id or not isinstance(invocation_id, str):
            raise ValueError("invocation_id must be a non-empty str")
        compress = wants_compression(batch) if compress is None else bool(compress)
        steps = steps_of(batch)
        meta = (invocation_id, int(round), int(policy_version), int(steps))
        key = self._key_of(invocation_id)
        payload = encode_buffer((*meta, batch), key, compress=compress)
        if len(payload) <= self.max_entry_bytes:
            return [self._xadd([(meta, payload)])[0]]
        parts = -(-len(payload) // self.max_entry_bytes) + 1  # parts compress unevenly: start with slack
        while True:
            if parts > steps:
                raise PayloadTooLargeError(f"one step of the batch encodes above max_entry_bytes="
                                           f"{self.max_entry_bytes}; raise the cap or sample smaller observations")
            encoded = []
            for i, piece in enumerate(split_batch(batch, parts, value_of)):
                pmeta = (invocation_id, int(round), int(policy_version), steps_of(piece), i, parts)
                encoded.append((pmeta, encode_buffer((*pmeta[:4], piece, i, parts), key, compress=compress)))
            if max(len(p) for _, p in encoded) <= self.max_entry_bytes:
                return self._xadd(encoded)
            parts = min(parts * 2, max(steps, 1)) if parts < steps else parts + 1

    def _xadd(self, encoded: list[tuple[tuple, bytes | bytearray]]) -> list[str]:
        """XADD each (meta, payload); the parts of a split batch in one MULTI/EXEC. A single entry goes
        alone: one XADD is atomic already, and MULTI/EXEC around it cost a second server pass."""
        entries = []
        for meta, payload in encoded:
            fields = dict(zip(_FIELDS + _PART_FIELDS, (str(v).encode() for v in meta)))
            fields[b"payload"] = payload
            entries.append(fields)
        # Approximate MAXLEN is a memory cap for a stalled learner, not the normal cleanup (ack deletes).
        if len(entries) == 1:
            with self._io():
                ids = [self._r.xadd(self._stream, entries[0], maxlen=self._maxlen, approximate=True)]
        else:
            pipe = self._r.pipeline(transaction=True)
            for fields in entries:
                pipe.xadd(self._stream, fields, maxlen=self._maxlen, approximate=True)
            with self._io():
                ids = pipe.execute()
        return [eid.decode() if isinstance(eid, bytes) else str(eid) for eid in ids]


@dataclass
class TrajectoryEntry:
    entry_id: str
    invocation_id: str
    round: int
    policy_version: int
    steps: int
    batch: dict
    part: int = 0  # index of this contiguous part of a split batch (0 of 1 when unsplit)
    parts: int = 1

    @property
    def dedup_id(self) -> str:
        """What the stream deduplicates on: the invocation id, per part for a split batch."""
        return self.invocation_id if self.parts == 1 else f"{self.invocation_id}#{self.part}/{self.parts}"


class _RecentIds:
    """invocation id -> entry id of entries this reader handed out, oldest evicted first.

    The size cap bounds memory; the Redis window covers ids evicted here.
    """

    def __init__(self, cap: int):
        self._ids: dict[str, str] = {}
        self._cap = cap

    def get(self, invocation_id: str) -> str | None:
        return self._ids.get(invocation_id)

    def add(self, invocation_id: str, entry_id: str) -> None:
        self._ids[invocation_id] = entry_id
        if len(self._ids) > self._cap:
            del self._ids[next(iter(self._ids))]


class _HeldAcks:
    """Acks held back until sent (`TrajectoryReader.ack(defer=True)`'s, and those of the entries the reader
    dropped): entry ids, dedup id -> ack time, the seen record's trim point. A send takes a snapshot and
    forgets exactly it, so an ack added meanwhile (from another thread) is kept for the next send."""

    def __init__(self):
        self._lock = threading.Lock()
        self._ids: list = []
        self._seen: dict[str, float] = {}
        self._trim: float | None = None

    def add(self, entry_ids: list, seen: dict[str, float], trim_before: float | None) -> None:
        with self._lock:
            self._ids.extend(entry_ids)
            self._seen.update(seen)
            if trim_before is not None:
                self._trim = trim_before

    def snapshot(self) -> tuple[list, dict[str, float], float | None] | None:
        """(entry ids, seen, trim point) to send, or None when nothing is held back."""
        with self._lock:
            return (list(self._ids), dict(self._seen), self._trim) if self._ids else None

    def forget(self, sent: tuple) -> None:
        ids, seen, trim = sent
        with self._lock:
            del self._ids[: len(ids)]  # ids are only ever appended: the sent ones are the oldest
            for dedup_id, t in seen.items():
                if self._seen.get(dedup_id) == t:
                    del self._seen[dedup_id]
            if self._trim == trim:
                self._trim = None


class TrajectoryReader:
    """Learner side of the stream: verified, deduplicated, at-least-once batches.

    `key` is the master key: each entry is verified with the key of the invocation it names
    (nitro.contracts.invocation_key), derived here.

    An entry stays pending until `ack`, so a learner that dies mid-batch gets it
    back (same consumer name: on its first `read`; another consumer: `claim_stale`).
    Rejected and duplicate entries are only counted; their ack and delete are held back like
    `ack(defer=True)`'s and go with the next read (or `flush`, `claim_stale`, `pending_count`).

    Per batch, on the path the learner takes: one MAC pass (the envelope's tag, checked in `decode`), one
    round trip (XREADGROUP, with every held-back ack in front of it in one pipeline), and no dedup round trip
    (the `seen` record is read once per reader, below); the actor side's `append_batch` is one tag pass and
    one XADD.

    Dedup reads the job's `seen` record once, when the first batch arrives, and
    keeps it in memory from then on (every id this reader acks goes to both), so
    a read costs no extra round trip. That holds while this reader is the job's
    only consumer, which the learner's per-job consumer name ensures; an id that
    another consumer acked meanwhile is still noticed at `ack` (`late_duplicates`).
    """

    def __init__(
        self,
        client: redis.Redis,
        job_id: str,
        key: bytes,
        group: str = "learner",
        consumer: str = "learner-0",
        max_payload_bytes: int = 256 << 20,
        dedup_window_s: int = 24 * 3600,
        recent_cap: int = 100_000,
    ):
        self._r, self._key = client, key
        self.job_id = check_job_id(job_id)
        self._stream, self._seen_key = stream_key(job_id), seen_key(job_id)
        self.group, self.consumer = group, consumer
        self.max_payload_bytes = max_payload_bytes
        self.dedup_window_s = int(dedup_window_s)
        self.rejected: Counter[str] = Counter()
        self.duplicates = 0
        self.processing_seconds = 0.0  # verify + decode + dedup time: the learner's "ingest" phase
        self.lost = 0  # pending entries whose data was trimmed away before they were acked
        self.late_duplicates = 0  # ids another consumer had acked by the time this one acked them
        self._recent = _RecentIds(recent_cap)
        self._seen: dict[str, float] | None = None  # dedup id -> ack time, within the window; loaded on first use
        self._backlog_from: str | None = "0"  # own pending entries are replayed first
        self._claim_from = "0-0"
        self._next_trim = 0.0
        self._held = _HeldAcks()
        self._create_group()

    def _create_group(self) -> None:
        try:
            self._r.xgroup_create(self._stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _grouped(self, fn, *args, **kwargs):
        """Run a group command, recreating the group once if Redis lost it (restart without AOF)."""
        try:
            return fn(*args, **kwargs)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            log.warning("consumer group %s of job %s was missing; recreated", self.group, self.job_id)
            self._create_group()
            return fn(*args, **kwargs)

    def read(self, count: int, block_ms: int) -> list[TrajectoryEntry]:
        """Up to `count` entries, waiting at most `block_ms` (<= 0: no wait) for new ones.

        Returns [] on timeout, and may return [] early when everything it
        received was rejected or a duplicate. The client's socket_timeout must
        exceed block_ms.
        """
        while self._backlog_from is not None:
            msgs = self._xreadgroup(self._backlog_from, count, None)
            if not msgs:
                self._backlog_from = None
                break
            self._backlog_from = msgs[-1][0]
            entries = self._admit(msgs)
            if entries:
                return entries
        msgs = self._xreadgroup(">", count, block_ms if block_ms > 0 else None)
        return self._admit(msgs) if msgs else []

    def ack(self, entries: list[TrajectoryEntry], *, defer: bool = False) -> None:
        """Mark entries consumed: ack, delete, and remember their dedup ids, atomically.

        defer=True sends those commands with this reader's next `read` (in one pipeline with it),
        `claim_stale`, `pending_count`, `flush` or ack sent at once, rather than now: one round trip fewer. Only for a
        caller that has recorded the entries durably first, as the learner's checkpoint does (it names them
        and a restored learner acks them again), since a process that dies before that call leaves them
        pending. This reader's own dedup knows them at once either way. An ack sent at once sends every
        ack held back too (those of dropped entries included), even for no entries.
        """
        if not entries:
            if not defer:
                self.flush()
            return
        now = time.time()
        acked = {e.dedup_id: now for e in entries}
        seen = self._seen_record()
        trim_before = None
        if now >= self._next_trim:  # the window needs no per-ack precision; keep acks lean
            self._next_trim = now + min(60.0, self.dedup_window_s / 10)
            trim_before = now - self.dedup_window_s
            for dedup_id in [i for i, t in seen.items() if t < trim_before]:
                del seen[dedup_id]
        seen.update(acked)
        self._held.add([e.entry_id for e in entries], acked, trim_before)
        if not defer:
            self.flush()

    def flush(self) -> None:
        """Send the acks that `ack(defer=True)` held back; nothing when there are none."""
        held = self._held.snapshot()
        if held is not None:
            self._sent(held, self._grouped(self._consume, *held))

    def claim_stale(self, min_idle_ms: int, count: int) -> list[TrajectoryEntry]:
        """Take over entries another (dead) consumer left pending for at least `min_idle_ms`."""
        self.flush()
        resp = self._grouped(
            self._r.xautoclaim,
            self._stream, self.group, self.consumer, min_idle_ms, start_id=self._claim_from, count=count,
        )
        # SCAN-like cursor: continue where the last call stopped, wrap at "0-0".
        cursor = resp[0]
        self._claim_from = cursor.decode() if isinstance(cursor, bytes) else str(cursor)
        return self._admit(resp[1])

    def pending_count(self) -> int:
        """Entries delivered to any consumer of the group and not yet acked."""
        self.flush()
        return int(self._grouped(self._r.xpending, self._stream, self.group)["pending"])

    # --- internals -------------------------------------------------------------
    def _xreadgroup(self, start: str, count: int, block: int | None) -> list:
        def call():
            held = self._held.snapshot()
            if held is None:
                return self._r.xreadgroup(self.group, self.consumer, {self._stream: start}, count=count, block=block)
            # Held-back acks ride in front of the read: one round trip for both. Not a MULTI/EXEC, whose
            # XREADGROUP would not block; the acks stay atomic because they are one script.
            pipe = self._r.pipeline(transaction=False)
            self._queue_consume(pipe, *held)
            pipe.xreadgroup(self.group, self.consumer, {self._stream: start}, count=count, block=block)
            added, resp = pipe.execute(raise_on_error=False)
            if isinstance(added, Exception):
                if resp and not isinstance(resp, Exception):
                    self._backlog_from = "0"  # delivered to us, never handed out: the next read replays them
                raise added
            self._sent(held, added)  # before a failed read raises: a retry must not send the acks again
            if isinstance(resp, Exception):
                raise resp
            return resp

        resp = self._grouped(call)
        return resp[0][1] if resp else []

    def _admit(self, msgs: list) -> list[TrajectoryEntry]:
        t0 = time.perf_counter()
        try:
            return self._admit_timed(msgs)
        finally:
            self.processing_seconds += time.perf_counter() - t0

    def _admit_timed(self, msgs: list) -> list[TrajectoryEntry]:
        entries: list[TrajectoryEntry] = []
        drop: list[bytes] = []
        for entry_id, fields in msgs:
            if entry_id is None:
                # XAUTOCLAIM (Redis 6.2) hides the id of a trimmed entry it just moved
                # to us; the next read's pass over our own pending entries acks it.
                self.lost += 1
                self._backlog_from = "0"
                continue
            if not fields:
                self.lost += 1
                drop.append(entry_id)
                continue
            try:
                entries.append(self._verify(entry_id, fields))
            except PayloadError as exc:
                self.rejected[exc.reason] += 1
                log.warning("rejected trajectory entry %s of job %s: %s", entry_id, self.job_id, exc.reason)
                drop.append(entry_id)
        entries = self._drop_duplicates(entries, drop)
        if drop:
            # Held back like a commit's ack: it rides with the next read (no round trip of its own). Unlike a
            # commit's, it needs no checkpoint: if this process dies first, the entries come back and are
            # dropped again (a rejected one fails again; a duplicate meets the same dedup record or, if its
            # original was not consumed either, the first of the two to be read is kept).
            self._held.add(drop, {}, None)
        return entries

    def _consume(self, entry_ids: list, seen: dict[str, float], trim_before: float | None = None) -> int:
        """Ack and delete `entry_ids` and add `seen` (dedup id -> ack time) to the job's record, atomically;
        trim the record's ids older than `trim_before`. Returns how many dedup ids were new."""
        pipe = self._r.pipeline(transaction=False)
        self._queue_consume(pipe, entry_ids, seen, trim_before)
        return int(pipe.execute()[0])

    def _queue_consume(self, pipe, entry_ids: list, seen: dict[str, float], trim_before: float | None) -> None:
        members = [v for dedup_id, t in seen.items() for v in (repr(t), dedup_id)]
        pipe.eval(_CONSUME_SCRIPT, 2, self._stream, self._seen_key, self.group, self.dedup_window_s,
                  "" if trim_before is None else repr(trim_before), len(entry_ids), *entry_ids, *members)

    def _sent(self, held: tuple, added: int) -> None:
        """The held-back acks of `held` are in Redis: count the ids another reader had consumed first, and
        forget them."""
        late = len(held[1]) - int(added)
        if late > 0:
            self.late_duplicates += late
            log.warning("job %s: %d acked batch(es) had already been consumed by another reader of the stream",
                        self.job_id, late)
        self._held.forget(held)

    def _verify(self, entry_id: Any, fields: dict) -> TrajectoryEntry:
        payload = fields.get(b"payload")
        if payload is None:
            raise UnsignedPayloadError("entry has no payload field")
        named = fields.get(b"inv")
        if not named:
            raise UnsignedPayloadError("entry names no invocation: there is no key to verify it with")
        # The key of the invocation the entry names: a batch signed with any other key (another job's, another
        # invocation's) fails here, before it is parsed and before it can take that invocation's dedup id.
        key = invocation_key(self._key, self.job_id, named.decode("utf-8", "surrogateescape"))
        signed = decode(payload, key, max_size=self.max_payload_bytes)
        if not (isinstance(signed, tuple) and len(signed) in (5, 7)):
            raise MalformedPayloadError("payload is not a trajectory record")
        inv, rnd, version, steps, batch = signed[:5]
        part, parts = signed[5:] if len(signed) == 7 else (0, 1)
        ints = all(type(v) is int for v in (rnd, version, steps, part, parts)) and 0 <= part < parts
        if not (isinstance(inv, str) and ints and isinstance(batch, dict)):
            raise MalformedPayloadError("payload is not a trajectory record")
        names, meta = _FIELDS, (inv, rnd, version, steps)
        if len(signed) == 7:
            names, meta = _FIELDS + _PART_FIELDS, (*meta, part, parts)
        elif any(f in fields for f in _PART_FIELDS):
            raise BadSignatureError("stream fields differ from the signed metadata")
        claimed = tuple(fields.get(f) for f in names)
        if claimed != tuple(str(v).encode() for v in meta):
            raise BadSignatureError("stream fields differ from the signed metadata")
        parsed = parse_invocation_id(inv)
        if parsed is None or parsed.kind != "actor" or parsed.job_id != self.job_id or parsed.round_index != rnd:
            raise ForeignInvocationError(f"invocation {inv[:200]!r} is not an actor invocation of job {self.job_id!r} "
                                         f"for round {rnd}")
        eid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        return TrajectoryEntry(eid, inv, rnd, version, steps, batch, part, parts)

    def _seen_record(self) -> dict[str, float]:
        """The ids consumed within the dedup window: Redis's record once, then this reader's own acks."""
        if self._seen is None:
            since = time.time() - self.dedup_window_s
            rows = self._r.zrangebyscore(self._seen_key, since, "+inf", withscores=True)
            self._seen = {(i.decode() if isinstance(i, bytes) else i): float(t) for i, t in rows}
        return self._seen

    def _drop_duplicates(self, entries: list[TrajectoryEntry], drop: list) -> list[TrajectoryEntry]:
        if not entries:
            return entries
        seen = self._seen_record()
        kept: list[TrajectoryEntry] = []
        for e in entries:
            handed_out = self._recent.get(e.dedup_id)
            if handed_out == e.entry_id:
                continue  # the same entry again (re-scan/claim of our own pending): caller has it
            if handed_out is not None or e.dedup_id in seen:
                self.duplicates += 1  # another entry for an invocation already consumed (retry)
                drop.append(e.entry_id)
                continue
            self._recent.add(e.dedup_id, e.entry_id)  # also catches a repeat later in this batch
            kept.append(e)
        return kept
