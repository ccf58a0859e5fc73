"""nitro.data.store against a real redis-server: policies and the trajectory stream."""

from __future__ import annotations

import pickle
import struct
import threading
import time

import numpy as np
import pytest
import redis

from nitro.contracts import invocation_id, invocation_key, policy_key, seen_key, stream_key
from nitro.data import codec
from nitro.data.codec import encode
from nitro.data.redis_client import connect
from nitro.data.store import (
    PolicyNotFoundError,
    PolicyStore,
    TrajectoryEntry,
    TrajectoryReader,
    TrajectoryWriter,
)
from nitro.local.redis_server import LocalRedis
from tests.credentials import signer
from tests.envelopes import BODY, TAG, body_of, resign, sign_ntr2

JOB = "job-1"


def inv(slot: int, round_index: int = 1) -> str:
    """An actor invocation id of JOB: what the reader accepts (the batch's round must be its round)."""
    return invocation_id(JOB, round_index, slot)


def _batch(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.standard_normal((64, 11)).astype(np.float32),
        "rewards": rng.standard_normal(64).astype(np.float32),
        "terminated": np.zeros(64, bool),
    }


def _append(writer: TrajectoryWriter, inv: str, seed: int = 0, **kw) -> str:
    return writer.append(invocation_id=inv, round=1, policy_version=3, steps=64, batch=_batch(seed), **kw)


# --- keys and policies -------------------------------------------------------------


def test_keys_and_job_id_validation():
    assert policy_key("j", 7) == "nitro:j:policy:7"
    assert stream_key("j") == "nitro:j:traj"
    assert seen_key("j") == "nitro:j:seen"
    for bad in ["", "a b", "x" * 65, "a:b", "a{b}"]:
        with pytest.raises(ValueError, match="job_id"):
            stream_key(bad)
    with pytest.raises(ValueError, match="version"):
        policy_key("j", -1)


def test_policy_put_get_latest(redis_client):
    store = PolicyStore(redis_client, JOB, ttl_s=60)
    assert store.latest() is None
    store.put(1, b"w1")
    store.put(2, b"w2")
    assert store.get(1) == b"w1" and store.get(2) == b"w2"
    assert store.latest() == 2
    assert 0 < redis_client.ttl(policy_key(JOB, 2)) <= 60
    assert 0 < redis_client.ttl(f"nitro:{JOB}:policy:latest") <= 60


def test_policy_put_drops_the_versions_it_is_told_to(redis_client):
    store = PolicyStore(redis_client, JOB, ttl_s=60)
    for v in range(4):
        store.put(v, b"w%d" % v)
    store.put(4, b"w4", drop=[0, 1, 7])  # 7 was never published: nothing to delete
    assert [v for v in range(5) if redis_client.exists(policy_key(JOB, v))] == [2, 3, 4]
    assert store.latest() == 4


def test_policy_not_found(redis_client):
    store = PolicyStore(redis_client, JOB)
    with pytest.raises(PolicyNotFoundError) as exc:
        store.get(9)
    assert exc.value.version == 9 and JOB in str(exc.value)


def test_policy_expires(redis_client):
    store = PolicyStore(redis_client, JOB, ttl_s=1)
    store.put(1, b"w")
    time.sleep(1.2)
    with pytest.raises(PolicyNotFoundError):
        store.get(1)


# --- trajectory stream -----------------------------------------------------------------


def test_append_read_ack_round_trip(redis_client, hmac_key):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    eid = _append(writer, inv(1), compress=True)
    [entry] = reader.read(count=10, block_ms=100)
    assert entry.entry_id == eid
    assert (entry.invocation_id, entry.round, entry.policy_version, entry.steps) == (inv(1), 1, 3, 64)
    np.testing.assert_array_equal(entry.batch["obs"], _batch()["obs"])
    assert reader.pending_count() == 1
    reader.ack([entry])
    assert reader.pending_count() == 0
    assert redis_client.xlen(stream_key(JOB)) == 0
    assert reader.read(count=10, block_ms=10) == []


def test_group_creation_is_idempotent(redis_client, hmac_key):
    TrajectoryReader(redis_client, JOB, hmac_key)
    TrajectoryReader(redis_client, JOB, hmac_key)
    assert len(redis_client.xinfo_groups(stream_key(JOB))) == 1


def test_unacked_entries_return_to_restarted_reader(redis_client, hmac_key):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    for i in range(3):
        _append(writer, inv(i), seed=i)
    first = TrajectoryReader(redis_client, JOB, hmac_key)
    got = first.read(count=2, block_ms=100)
    assert [e.invocation_id for e in got] == [inv(0), inv(1)]
    del first  # "crash" before ack

    again = TrajectoryReader(redis_client, JOB, hmac_key)  # same consumer name
    backlog = again.read(count=10, block_ms=100)
    assert [e.invocation_id for e in backlog] == [inv(0), inv(1)]
    np.testing.assert_array_equal(backlog[1].batch["obs"], _batch(1)["obs"])
    assert [e.invocation_id for e in again.read(count=10, block_ms=100)] == [inv(2)]
    assert again.duplicates == 0


def test_stale_entries_claimed_from_dead_consumer(redis_client, hmac_key):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    _append(writer, inv(10))
    _append(writer, inv(11), seed=1)
    dead = TrajectoryReader(redis_client, JOB, hmac_key, consumer="learner-0")
    assert len(dead.read(count=10, block_ms=100)) == 2

    other = TrajectoryReader(redis_client, JOB, hmac_key, consumer="learner-1")
    assert other.claim_stale(min_idle_ms=60_000, count=10) == []  # not idle long enough
    time.sleep(0.06)
    claimed = other.claim_stale(min_idle_ms=50, count=10)
    assert sorted(e.invocation_id for e in claimed) == [inv(10), inv(11)]
    other.ack(claimed)
    assert other.pending_count() == 0 and redis_client.xlen(stream_key(JOB)) == 0


def test_claim_of_own_held_entry_is_not_a_duplicate(redis_client, hmac_key):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    _append(writer, inv(10))
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    [entry] = reader.read(count=10, block_ms=100)
    time.sleep(0.02)
    assert reader.claim_stale(min_idle_ms=10, count=10) == []  # already in the caller's hands
    assert reader.duplicates == 0 and redis_client.xlen(stream_key(JOB)) == 1
    reader.ack([entry])
    assert redis_client.xlen(stream_key(JOB)) == 0


def test_duplicate_in_same_read(redis_client, hmac_key):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    _append(writer, inv(1))
    _append(writer, inv(1))  # a Lambda retry
    _append(writer, inv(2))
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    got = reader.read(count=10, block_ms=100)
    assert [e.invocation_id for e in got] == [inv(1), inv(2)]
    assert reader.duplicates == 1
    assert redis_client.xlen(stream_key(JOB)) == 3  # the duplicate's ack is held back, to ride with the next read
    assert reader.read(count=10, block_ms=10) == []
    assert redis_client.xlen(stream_key(JOB)) == 2  # the duplicate is deleted, the two kept entries wait
    assert reader.duplicates == 1 and reader.pending_count() == 2


def test_duplicate_across_reads_and_readers(redis_client, hmac_key):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    _append(writer, inv(1))
    [first] = reader.read(count=10, block_ms=100)
    _append(writer, inv(1))  # arrives before the first is acked
    assert reader.read(count=10, block_ms=50) == []
    assert reader.duplicates == 1
    reader.ack([first])

    _append(writer, inv(1))  # arrives after ack
    assert reader.read(count=10, block_ms=50) == []
    assert reader.duplicates == 2

    fresh = TrajectoryReader(redis_client, JOB, hmac_key, consumer="learner-9")  # no local memory
    _append(writer, inv(1))
    _append(writer, inv(2))
    assert [e.invocation_id for e in fresh.read(count=10, block_ms=50)] == [inv(2)]
    assert fresh.duplicates == 1


def test_dedup_reads_the_seen_record_once(redis_client, hmac_key):
    """After the first batch, a read is one XREADGROUP: no per-read dedup round trip to Redis."""
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    redis_client.config_resetstat()
    for i in range(5):
        _append(writer, inv(i))
        reader.ack(reader.read(count=10, block_ms=100))
    stats = redis_client.info("commandstats")
    assert stats["cmdstat_xreadgroup"]["calls"] >= 5
    assert stats["cmdstat_zrangebyscore"]["calls"] == 1
    assert "cmdstat_zmscore" not in stats and "cmdstat_zscore" not in stats
    _append(writer, inv(3))  # a late retry of a consumed invocation is still dropped
    assert reader.read(count=10, block_ms=50) == [] and reader.duplicates == 1


@pytest.mark.parametrize("defer", [False, True], ids=["ack-at-once", "ack-held-back"])
def test_ack_counts_an_id_another_reader_consumed(redis_client, hmac_key, defer):
    """Two consumers each take one copy of a retried invocation; the second ack notices (once it is sent)."""
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    _append(writer, inv(1))
    _append(writer, inv(1))  # a Lambda retry
    a = TrajectoryReader(redis_client, JOB, hmac_key, consumer="learner-a")
    b = TrajectoryReader(redis_client, JOB, hmac_key, consumer="learner-b")
    [ea], [eb] = a.read(count=1, block_ms=100), b.read(count=1, block_ms=100)
    a.ack([ea])
    assert a.late_duplicates == 0
    b.ack([eb], defer=defer)
    if defer:
        assert b.late_duplicates == 0  # not known until it is sent
        b.read(count=1, block_ms=0)
    assert b.late_duplicates == 1 and redis_client.xlen(stream_key(JOB)) == 0


def _count_sends(monkeypatch) -> list:
    """Spy on the real connection: one item per send to Redis (a pipeline is one send)."""
    sends: list = []
    original = redis.connection.AbstractConnection.send_packed_command

    def counted(self, command, check_health=True):
        sends.append(command)
        return original(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    return sends


def test_a_held_back_ack_rides_with_the_next_read(redis_client, hmac_key, monkeypatch):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    _append(writer, inv(1))
    [entry] = reader.read(count=10, block_ms=100)
    sends = _count_sends(monkeypatch)
    reader.ack([entry], defer=True)
    assert sends == [], "a held-back ack sends nothing"
    assert redis_client.xpending(stream_key(JOB), "learner")["pending"] == 1
    assert redis_client.zscore(seen_key(JOB), inv(1)) is None
    _append(writer, inv(2))
    _append(writer, inv(1))  # a retry of the consumed invocation: this reader's dedup knows it already
    sends.clear()
    got = reader.read(count=1, block_ms=100)
    assert len(sends) == 1, "the held-back ack and the read went in one round trip"
    assert [e.invocation_id for e in got] == [inv(2)]
    assert redis_client.zscore(seen_key(JOB), inv(1)) is not None
    assert reader.read(count=10, block_ms=100) == [] and reader.duplicates == 1  # the retry, dropped
    assert redis_client.xpending(stream_key(JOB), "learner")["pending"] == 2  # its ack too waits for a read
    reader.flush()
    assert redis_client.xpending(stream_key(JOB), "learner")["pending"] == 1  # only inv-2 waits
    assert redis_client.xlen(stream_key(JOB)) == 1


@pytest.mark.parametrize("dropped", ["duplicate", "rejected"])
def test_a_dropped_entry_costs_no_round_trip_of_its_own(redis_client, hmac_key, monkeypatch, dropped):
    """Per batch the reader makes one round trip: the ack of an entry it drops (a retry's duplicate, a
    rejected one) goes with the next read, as a held-back commit ack does; a crash before then only brings
    the entry back, to be dropped again."""
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    stream = stream_key(JOB)

    def add_dropped() -> None:
        if dropped == "duplicate":
            _append(writer, inv(1))  # a retry of an invocation this reader has handed out
        else:
            redis_client.xadd(stream, {b"inv": inv(9).encode(), b"round": b"1", b"version": b"3", b"steps": b"64",
                                       b"payload": b"not an envelope"})

    _append(writer, inv(1))
    assert [e.invocation_id for e in reader.read(count=10, block_ms=100)] == [inv(1)]
    add_dropped()
    sends = _count_sends(monkeypatch)
    assert reader.read(count=10, block_ms=100) == []
    assert len(sends) == 1, "the read that dropped the entry made one round trip, no ack of its own"
    assert redis_client.xlen(stream) == 2  # the dropped entry is still there, its ack held back
    _append(writer, inv(2))
    sends.clear()
    assert [e.invocation_id for e in reader.read(count=10, block_ms=100)] == [inv(2)]
    assert len(sends) == 1, "the held-back ack went in front of the next read"
    assert redis_client.xlen(stream) == 2  # inv-1 and inv-2 wait for their commit; the dropped entry is gone
    assert (reader.duplicates, dict(reader.rejected)) == ((1, {}) if dropped == "duplicate" else (0, {"unsigned": 1}))
    # The process dies with a dropped entry's ack held back: the restarted reader drops it again.
    add_dropped()
    assert reader.read(count=10, block_ms=100) == [] and redis_client.xlen(stream) == 3
    restarted = TrajectoryReader(redis_client, JOB, hmac_key)  # the same consumer: its backlog comes first
    assert [e.invocation_id for e in restarted.read(count=10, block_ms=100)] == [inv(1), inv(2)]
    assert (restarted.duplicates, dict(restarted.rejected)) == ((1, {}) if dropped == "duplicate"
                                                                else (0, {"unsigned": 1}))
    restarted.flush()
    assert redis_client.xlen(stream) == 2 and restarted.pending_count() == 2


def test_an_ack_sent_at_once_or_by_flush(redis_client, hmac_key):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    for slot in (1, 2, 3):
        _append(writer, inv(slot))
    first, second, third = reader.read(count=10, block_ms=100)
    reader.ack([first])  # the control: sent at once
    assert redis_client.xpending(stream_key(JOB), "learner")["pending"] == 2
    reader.ack([second], defer=True)
    assert redis_client.xpending(stream_key(JOB), "learner")["pending"] == 2
    reader.flush()
    assert redis_client.xpending(stream_key(JOB), "learner")["pending"] == 1
    reader.ack([third], defer=True)
    assert reader.pending_count() == 0, "pending_count sends held-back acks first"
    assert redis_client.xlen(stream_key(JOB)) == 0 and reader.late_duplicates == 0
    reader.flush()  # nothing held back: nothing sent, no error


def test_an_ack_held_back_while_another_is_being_sent_is_kept(redis_client, hmac_key, monkeypatch):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    _append(writer, inv(1))
    _append(writer, inv(2))
    first, second = reader.read(count=10, block_ms=100)
    consume = reader._consume

    def consume_while_acking(*args):  # another thread holds back an ack while this send is in flight
        reader.ack([second], defer=True)
        return consume(*args)

    reader.ack([first], defer=True)
    monkeypatch.setattr(reader, "_consume", consume_while_acking)
    reader.flush()
    monkeypatch.setattr(reader, "_consume", consume)
    assert redis_client.xpending(stream_key(JOB), "learner")["pending"] == 1, "the second ack is still held"
    reader.flush()
    assert redis_client.xpending(stream_key(JOB), "learner")["pending"] == 0 and reader.late_duplicates == 0


def test_a_failed_held_back_ack_does_not_swallow_the_read_beside_it(redis_client, hmac_key):
    """The ack script and XREADGROUP go in one pipeline, not a transaction: when the script fails the read
    still delivered its entries to this consumer, and the next read hands them out."""
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    _append(writer, inv(1))
    [entry] = reader.read(count=10, block_ms=100)
    reader.ack([entry], defer=True)
    _append(writer, inv(2))
    redis_client.set(seen_key(JOB), "not a sorted set")  # the script's ZADD fails: WRONGTYPE
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        reader.read(count=10, block_ms=100)
    # inv-2 delivered but not handed out; inv-1 acked all the same (Redis does not undo a failed script's
    # earlier writes, as EXEC did not undo a transaction's), its seen record still to be written
    pending = redis_client.xpending_range(stream_key(JOB), "learner", "-", "+", 10)
    assert [p["message_id"] for p in pending] == [redis_client.xrange(stream_key(JOB))[0][0]]
    redis_client.delete(seen_key(JOB))
    assert [e.invocation_id for e in reader.read(count=10, block_ms=100)] == [inv(2)]
    assert redis_client.xpending(stream_key(JOB), "learner")["pending"] == 1  # the held-back ack went too
    assert redis_client.zscore(seen_key(JOB), inv(1)) is not None


def test_an_ack_of_more_ids_than_a_lua_call_takes(redis_client, hmac_key):
    """The ack script passes ids to XACK/XDEL/ZADD in slices: one unpack() of 9,000 values would fail."""
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    pipe = redis_client.pipeline(transaction=False)
    for i in range(9000):
        pipe.xadd(stream_key(JOB), {"n": str(i)})
    pipe.execute()
    msgs = redis_client.xreadgroup("learner", "learner-0", {stream_key(JOB): ">"}, count=9000)[0][1]
    entries = [TrajectoryEntry(eid.decode(), inv(i), 1, 3, 1, {}) for i, (eid, _) in enumerate(msgs)]
    assert redis_client.xpending(stream_key(JOB), "learner")["pending"] == 9000
    reader.ack(entries)
    assert redis_client.xpending(stream_key(JOB), "learner")["pending"] == 0
    assert redis_client.xlen(stream_key(JOB)) == 0 and redis_client.zcard(seen_key(JOB)) == 9000
    assert reader.late_duplicates == 0


def test_rejected_entries_are_counted_and_skipped(redis_client, hmac_key):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    stream = stream_key(JOB)
    meta = {b"round": b"1", b"version": b"3", b"steps": b"64"}
    _append(writer, inv(21))
    redis_client.xadd(stream, {**meta, b"inv": inv(60).encode(), b"payload": pickle.dumps(_batch(), protocol=5)})
    redis_client.xadd(stream, {**meta, b"inv": inv(61).encode()})
    forged = encode((inv(62), 1, 3, 64, _batch()), b"not-the-deployment-key-0123456789")
    redis_client.xadd(stream, {**meta, b"inv": inv(62).encode(), b"payload": forged})
    tampered = bytearray(encode((inv(63), 1, 3, 64, _batch()), invocation_key(hmac_key, JOB, inv(63))))
    tampered[-5] ^= 0xFF
    redis_client.xadd(stream, {**meta, b"inv": inv(63).encode(), b"payload": bytes(tampered)})
    # valid payload, fields lie: verified with the key of the invocation the fields name, it fails
    relabelled = encode((inv(21), 1, 3, 64, _batch()), invocation_key(hmac_key, JOB, inv(21)))
    redis_client.xadd(stream, {**meta, b"inv": inv(64).encode(), b"payload": relabelled})
    _append(writer, inv(22))

    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    got = reader.read(count=100, block_ms=100)
    assert [e.invocation_id for e in got] == [inv(21), inv(22)]
    assert reader.rejected == {"unsigned": 2, "bad_signature": 3}
    assert reader.pending_count() == 2  # rejected ones were acked
    reader.ack(got)
    assert redis_client.xlen(stream) == 0


def _hopper_batch(steps: int = 4096) -> dict:
    rng = np.random.default_rng(2)
    return {
        "obs": rng.standard_normal((steps, 11)).astype(np.float32),
        "actions": rng.standard_normal((steps, 3)).astype(np.float32),
        "rewards": rng.standard_normal(steps).astype(np.float32),
        "terminated": rng.random(steps) < 0.002,
        "truncated": np.zeros(steps, dtype=bool),
        "logp": rng.standard_normal(steps).astype(np.float32),
        "values": rng.standard_normal(steps).astype(np.float32),
        "bootstrap_value": np.float32(0.3),
        "episode_returns": [812.5, 1040.0],
    }


def test_hopper_batch_through_the_stream(redis_client, hmac_key):
    batch = _hopper_batch()
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    writer.append_batch(invocation_id=inv(1, 2), round=2, policy_version=5, batch=batch)
    [(_, fields)] = redis_client.xrange(stream_key(JOB))
    payload = fields[b"payload"]
    assert payload[:5] == codec.MAGIC + b"\x00"  # float32 batches travel uncompressed
    assert struct.unpack_from("<I", payload, BODY)[0] == 7  # each array out of band: n_buffers
    [entry] = reader.read(count=10, block_ms=100)
    assert (entry.invocation_id, entry.round, entry.policy_version, entry.steps) == (inv(1, 2), 2, 5, 4096)
    for name, sent in batch.items():
        got = entry.batch[name]
        if isinstance(sent, np.ndarray) and sent.ndim:
            assert (got.dtype, got.shape) == (sent.dtype, sent.shape), name
            assert got.flags.c_contiguous and got.flags.writeable and got.flags.aligned, name
            np.testing.assert_array_equal(got, sent)
        else:
            assert got == sent and type(got) is type(sent), name
    reader.ack([entry])
    assert redis_client.xlen(stream_key(JOB)) == 0 and reader.rejected == {}


def _hostile_payload(case: str, key: bytes, record: tuple) -> bytes:
    good = encode(record, key)
    if case in ("buffer_len", "last_buffer_byte"):
        bad = bytearray(good)
        bad[BODY + 12 if case == "buffer_len" else -TAG - 1] ^= 0x01
        return bytes(bad)
    if case == "truncated":
        return good[:-1000]
    if case == "unknown_flags":
        return resign(good, key, flags=0x40)
    if case == "ntr1":  # the previous layout: in-band pickle, signed with the deployment key
        return resign(good, key, magic=b"NTR1", new_body=pickle.dumps(record, protocol=5))
    if case == "ntr2":  # the previous MAC: HMAC-SHA256, signed with the deployment key
        return sign_ntr2(body_of(good), key)
    if case == "table_past_end":
        body = bytearray(body_of(good))
        struct.pack_into("<Q", body, 12, 1 << 30)  # buffer 0 claims a GiB
        return resign(good, key, new_body=bytes(body))
    if case == "oob_global":  # posix.system(<out-of-band buffer>)
        pickled = b"\x80\x05cposix\nsystem\n\x97\x85R."
        body = struct.pack("<IQQ", 1, len(pickled), 4) + pickled
        return resign(good, key, new_body=body + bytes(-len(body) % 16) + b"true")
    raise AssertionError(case)


@pytest.mark.parametrize("case, reason", [
    ("buffer_len", "bad_signature"), ("last_buffer_byte", "bad_signature"), ("truncated", "bad_signature"),
    ("unknown_flags", "malformed"), ("ntr1", "malformed"), ("ntr2", "malformed"), ("table_past_end", "malformed"),
    ("oob_global", "disallowed_type"),
])
def test_hostile_envelopes_in_the_stream(redis_client, hmac_key, case, reason):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    record = (inv(50), 1, 3, 64, _batch())  # what a compromised actor holding its invocation's key could send
    fields = {b"inv": inv(50).encode(), b"round": b"1", b"version": b"3", b"steps": b"64",
              b"payload": _hostile_payload(case, invocation_key(hmac_key, JOB, inv(50)), record)}
    redis_client.xadd(stream_key(JOB), fields)
    _append(writer, inv(20))
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    assert [e.invocation_id for e in reader.read(count=10, block_ms=100)] == [inv(20)]
    assert reader.rejected == {reason: 1}
    assert reader.pending_count() == 1  # the rejected entry is acked and deleted, the good one waits


def test_oversized_payload_rejected(redis_client, hmac_key):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    _append(writer, inv(23))
    reader = TrajectoryReader(redis_client, JOB, hmac_key, max_payload_bytes=1000)
    assert reader.read(count=10, block_ms=50) == []
    assert reader.rejected == {"too_large": 1}


@pytest.mark.slow
def test_memory_bounded(redis_client, hmac_key):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    reader = TrajectoryReader(redis_client, JOB, hmac_key, dedup_window_s=3600)
    stream = stream_key(JOB)

    def cycle(start: int, n: int) -> None:
        for i in range(start, start + n):
            _append(writer, inv(i), seed=i % 4)
            reader.ack(reader.read(count=10, block_ms=100))
        assert redis_client.xlen(stream) == 0

    cycle(0, 200)
    used_after_warmup = redis_client.info("memory")["used_memory"]
    cycle(200, 1000)
    used_after = redis_client.info("memory")["used_memory"]
    assert redis_client.xlen(stream) == 0 and reader.pending_count() == 0
    # Payloads (~3 KB each, ~3 MB in total) are gone; only small dedup records remain.
    assert used_after - used_after_warmup < 500_000
    assert 0 < redis_client.ttl(seen_key(JOB)) <= 3600
    assert redis_client.zcard(seen_key(JOB)) == 1200


def test_dedup_window_trims_old_ids(redis_client, hmac_key):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    reader = TrajectoryReader(redis_client, JOB, hmac_key, dedup_window_s=1)
    _append(writer, inv(70))
    reader.ack(reader.read(count=10, block_ms=100))
    time.sleep(1.1)
    _append(writer, inv(71))
    reader.ack(reader.read(count=10, block_ms=100))
    assert redis_client.zrange(seen_key(JOB), 0, -1) == [inv(71).encode()]


def test_maxlen_caps_stream(redis_client, hmac_key):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB), maxlen=100)
    for i in range(1000):
        _append(writer, inv(i))  # nobody reads: the cap is what bounds memory
    assert redis_client.xlen(stream_key(JOB)) < 300


def test_trimmed_pending_entry_is_cleared(redis_client, hmac_key):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    _append(writer, inv(10))
    dead = TrajectoryReader(redis_client, JOB, hmac_key, consumer="learner-0")
    [entry] = dead.read(count=10, block_ms=100)
    redis_client.xdel(stream_key(JOB), entry.entry_id)  # as a MAXLEN trim would
    time.sleep(0.02)
    other = TrajectoryReader(redis_client, JOB, hmac_key, consumer="learner-1")
    assert other.claim_stale(min_idle_ms=10, count=10) == []
    assert other.read(count=10, block_ms=10) == []
    assert other.lost >= 1 and other.pending_count() == 0


def test_read_blocks_for_block_ms_when_empty(redis_client, hmac_key):
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    reader.read(count=10, block_ms=10)  # consume the one-off backlog pass
    calls = 0
    original = redis_client.xreadgroup

    def counting(*args, **kwargs):
        nonlocal calls
        calls += 1
        return original(*args, **kwargs)

    redis_client.xreadgroup = counting
    t0 = time.monotonic()
    assert reader.read(count=10, block_ms=300) == []
    waited = time.monotonic() - t0
    assert 0.28 <= waited < 1.0
    assert calls == 1  # one blocking call, not a polling loop


def test_read_wakes_up_when_entry_arrives(redis_client, hmac_key):
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    reader.read(count=10, block_ms=10)
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    timer = threading.Timer(0.1, lambda: _append(writer, inv(40)))
    timer.start()
    t0 = time.monotonic()
    got = reader.read(count=10, block_ms=5000)
    assert [e.invocation_id for e in got] == [inv(40)]
    assert time.monotonic() - t0 < 2.0
    timer.join()


def test_reader_survives_redis_data_loss(redis_client, hmac_key):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    _append(writer, inv(42))
    [entry] = reader.read(count=10, block_ms=100)
    redis_client.flushall()  # as a restart without persistence would
    reader.ack([entry])  # nothing left to ack: must not raise
    assert reader.pending_count() == 0  # group recreated on demand
    _append(writer, inv(41))
    assert [e.invocation_id for e in reader.read(count=10, block_ms=100)] == [inv(41)]


def test_unacked_entries_survive_redis_restart(tmp_path, hmac_key):
    with LocalRedis(data_dir=tmp_path, appendonly=True) as server:
        client = connect(server.url)
        writer = TrajectoryWriter(client, JOB, signer(hmac_key, JOB))
        _append(writer, inv(1))
        assert len(TrajectoryReader(client, JOB, hmac_key).read(count=10, block_ms=100)) == 1
        server.restart()  # the learner and Redis both restart before the ack
        reader = TrajectoryReader(client, JOB, hmac_key)
        [entry] = reader.read(count=10, block_ms=100)
        assert entry.invocation_id == inv(1)
        reader.ack([entry])
        assert client.xlen(stream_key(JOB)) == 0
        client.close()


def test_a_single_entry_is_appended_without_a_transaction(redis_client, hmac_key):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    redis_client.config_resetstat()
    writer.append_batch(invocation_id=inv(30), round=1, policy_version=3, batch=_batch())
    assert "cmdstat_multi" not in redis_client.info("commandstats")
    small = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB), max_entry_bytes=2048)
    small.append_batch(invocation_id=inv(31), round=1, policy_version=3,
                       batch={**_batch(), "truncated": np.zeros(64, bool), "values": np.zeros(64, np.float32),
                              "bootstrap_value": 0.0})
    assert redis_client.info("commandstats")["cmdstat_multi"]["calls"] == 1  # the parts stay atomic
    assert redis_client.xlen(stream_key(JOB)) > 2


def test_an_ack_sent_at_once_sends_held_back_drops_even_for_no_entries(redis_client, hmac_key, monkeypatch):
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB))
    _append(writer, inv(1))
    _append(writer, inv(1))  # a retry: dropped, its ack held back
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    got = reader.read(count=10, block_ms=100)
    assert [e.invocation_id for e in got] == [inv(1)] and redis_client.xlen(stream_key(JOB)) == 2
    sends = _count_sends(monkeypatch)
    reader.ack([], defer=True)
    assert sends == []
    reader.ack([])
    assert len(sends) == 1
    reader.ack([])
    assert len(sends) == 1, "nothing held back: nothing sent"
    assert redis_client.xlen(stream_key(JOB)) == 1  # the retry is gone, inv-1 waits
