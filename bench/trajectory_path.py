"""Time one trajectory batch through the data plane, actor to learner.

Figure: ms per batch through the full signed path. Per iteration:
TrajectoryWriter.append_batch, as the actor calls it (pickle protocol 5 with
out-of-band buffers, one copy into the envelope, one ChaCha20-Poly1305 tag
under the invocation's own key written into its end, one XADD), then
TrajectoryReader.read (XREADGROUP, the invocation's key derived from the
master key, one tag check, one copy of the body, restricted unpickle, dedup
against the reader's copy of `seen`) and ack (XACK + XDEL + seen record in one
script). The ack is held back as the learner's commit holds it (ack(defer=True):
its checkpoint names the entries), so it rides with the next iteration's read:
every batch still pays its whole ack's work, one round trip fewer. So a batch
costs one tag pass and one round trip on each side. The learner acks a round's
batches together; here every batch pays an ack. Reference, measured in the
same run on the same server: a plain SET + GET of the raw pickle of the same
batch; path and reference alternate so both see the same machine noise.
Target: ratio <= 1.5 (issue 44).

After the timed loop: the stream floor, the same Redis commands the path sends
(XADD of an envelope, XREADGROUP with the previous batch's ack in front of it)
with no encoding, tag or decoding, alternating with its own SET + GET
reference: what the path would cost with a free codec. Then the codec alone
(encode, decode), one tag pass and one HMAC-SHA256 pass (the envelope's MAC
before NTR3) over the payload, and one PING, to show where the path's time
goes. `--ack-now` sends every ack at once instead (one round trip more per
batch, what the path cost before acks were held back).
The last stdout line is a JSON summary.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import hmac
import json
import pickle
import secrets
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from redis.utils import HIREDIS_AVAILABLE  # noqa: E402

from nitro.contracts import invocation_id, invocation_key, stream_key  # noqa: E402
from nitro.data import codec  # noqa: E402
from nitro.data.redis_client import connect  # noqa: E402
from nitro.data.store import TrajectoryReader, TrajectoryWriter  # noqa: E402
from nitro.local.redis_server import LocalRedis  # noqa: E402

TARGET_RATIO = 1.5  # issue 44 item 4
PARSER = "hiredis" if HIREDIS_AVAILABLE else "python"  # redis-py's reply parser, for path and reference alike
STEPS = 4096


def hopper_batch(steps: int = STEPS, seed: int = 0) -> dict:
    """Shape of one actor's PPO rollout on Hopper (obs 11, act 3), no next_obs copy."""
    rng = np.random.default_rng(seed)
    terminated = rng.random(steps) < 0.002
    return {
        "obs": rng.standard_normal((steps, 11)).astype(np.float32),
        "actions": rng.standard_normal((steps, 3)).astype(np.float32),
        "rewards": rng.standard_normal(steps).astype(np.float32),
        "terminated": terminated,
        "truncated": np.zeros(steps, dtype=bool),
        "logp": rng.standard_normal(steps).astype(np.float32),
        "values": rng.standard_normal(steps).astype(np.float32),
        "bootstrap_value": np.float32(0.3),
        "episode_returns": [float(x) for x in rng.normal(1000.0, 200.0, int(terminated.sum()) + 1)],
    }


def _ms(samples: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(samples, n=10)
    return statistics.median(samples) * 1e3, q[8] * 1e3


def _median_ms(fn, n: int) -> float:
    fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def _stream_floor(client, reader: TrajectoryReader, key: bytes, raw: bytes, n: int) -> tuple[list, list]:
    """Per iteration, the path's Redis commands alone (the writer's XADD of one envelope, the reader's
    XREADGROUP with the previous ack held in front of it), then SET + GET of the raw pickle: seconds of each."""
    inv = invocation_id("bench", 0, 1)
    writer = TrajectoryWriter(client, "bench", invocation_key(key, "bench", inv))
    blob = codec.encode((inv, 0, 0, STEPS, hopper_batch()), invocation_key(key, "bench", inv))
    floor: list[float] = []
    reference: list[float] = []
    for i in range(n + 5):
        t0 = time.perf_counter()
        writer._xadd([((inv, 0, 0, STEPS), blob)])
        msgs = reader._xreadgroup(">", 1, 1000)
        reader._held.add([entry_id for entry_id, _ in msgs], {f"floor-{i}": time.time()}, None)
        t1 = time.perf_counter()
        client.set("bench:ref", raw)
        ref = client.get("bench:ref")
        t2 = time.perf_counter()
        assert len(msgs) == 1 and ref is not None
        if i >= 5:
            floor.append(t1 - t0)
            reference.append(t2 - t1)
    return floor, reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--compress", action="store_true", help="zlib the body (what image batches get)")
    parser.add_argument("--ack-now", action="store_true",
                        help="send each ack at once instead of with the next read (one round trip more a batch)")
    args = parser.parse_args()

    batch = hopper_batch()
    raw = pickle.dumps(batch, protocol=5)
    key = secrets.token_bytes(32)  # the master key: the reader derives each entry's invocation key from it
    with LocalRedis() as server:
        client = connect(server.url)
        reader = TrajectoryReader(client, "bench", key)
        # Each iteration is one actor invocation of round i, with its own key (the scaler derives it, outside
        # the timed path: the actor receives it in its event).
        ids = [invocation_id("bench", i, 0) for i in range(args.warmup + args.iterations)]
        writers = [TrajectoryWriter(client, "bench", invocation_key(key, "bench", inv)) for inv in ids]

        # GC is off while timing, as in timeit.
        path: list[float] = []
        reference: list[float] = []
        gc.disable()
        try:
            for i in range(args.warmup + args.iterations):
                t0 = time.perf_counter()
                writers[i].append_batch(invocation_id=ids[i], round=i, policy_version=i, batch=batch,
                                        compress=args.compress)
                entries = reader.read(count=1, block_ms=1000)
                reader.ack(entries, defer=not args.ack_now)
                t1 = time.perf_counter()
                client.set("bench:ref", raw)
                ref = client.get("bench:ref")
                t2 = time.perf_counter()
                assert len(entries) == 1 and entries[0].batch["obs"].shape == (STEPS, 11) and ref is not None
                if i >= args.warmup:
                    path.append(t1 - t0)
                    reference.append(t2 - t1)
            floor, floor_reference = _stream_floor(client, reader, key, raw, max(args.iterations, 20))
            record = ("inv-x", 1, 1, STEPS, batch)
            blob = codec.encode(record, key, compress=args.compress)
            n = max(args.iterations // 2, 20)
            encode_ms = _median_ms(lambda: codec.encode_buffer(record, key, compress=args.compress), n)  # what the writer sends
            decode_ms = _median_ms(lambda: codec.decode(blob, key), n)
            hmac_ms = _median_ms(lambda: hmac.new(key, blob, hashlib.sha256).digest(), n)
            signed, nonce = memoryview(blob)[:-codec._TAG_LEN], blob[codec._HEADER_LEN:codec._BODY_OFFSET]
            tag_ms = _median_ms(lambda: codec._poly1305(key, nonce, signed).finalize(), n)
            ping_ms = _median_ms(client.ping, n)
        finally:
            gc.enable()
        reader.flush()  # the last batch's ack
        assert client.xlen(stream_key("bench")) == 0 and not reader.rejected and reader.duplicates == 0
        client.close()

    median, p90 = _ms(path)
    ref_median, _ = _ms(reference)
    ratio = median / ref_median
    floor_median, floor_ref_median = _ms(floor)[0], _ms(floor_reference)[0]
    print(f"batch: {STEPS} Hopper steps, raw pickle {len(raw) / 1024:.0f} KiB, envelope {len(blob) / 1024:.0f} KiB "
          f"({codec.MAGIC.decode()}), compress={args.compress}, reply parser {PARSER}, "
          f"ack {'at once' if args.ack_now else 'with the next read'}")
    print(f"signed stream path (append+read+verify+decode+ack): median {median:.3f} ms, p90 {p90:.3f} ms")
    print(f"reference (SET+GET of raw pickle): median {ref_median:.3f} ms")
    print(f"codec alone: encode {encode_ms:.3f} ms, decode {decode_ms:.3f} ms; one tag pass {tag_ms:.3f} ms "
          f"(one HMAC-SHA256 pass, NTR2's MAC: {hmac_ms:.3f} ms); one PING round trip {ping_ms:.3f} ms")
    print(f"stream floor (the path's Redis commands, no codec): median {floor_median:.3f} ms against its reference's "
          f"{floor_ref_median:.3f} ms, ratio {floor_median / floor_ref_median:.2f}")
    print(f"ratio {ratio:.2f}, target <= {TARGET_RATIO}: {'met' if ratio <= TARGET_RATIO else 'NOT met'}")
    print(json.dumps({
        "benchmark": "trajectory_path",
        "iterations": args.iterations,
        "compress": args.compress,
        "ack": "at once" if args.ack_now else "with the next read",
        "reply_parser": PARSER,
        "payload_bytes": len(raw),
        "envelope_bytes": len(blob),
        "median_ms": round(median, 4),
        "p90_ms": round(p90, 4),
        "reference_set_get_ms": round(ref_median, 4),
        "ratio_to_reference": round(ratio, 3),
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio <= TARGET_RATIO,
        "codec_encode_ms": round(encode_ms, 4),
        "codec_decode_ms": round(decode_ms, 4),
        "tag_pass_ms": round(tag_ms, 4),
        "hmac_sha256_pass_ms": round(hmac_ms, 4),
        "ping_ms": round(ping_ms, 4),
        "stream_floor_ms": round(floor_median, 4),
        "stream_floor_ratio": round(floor_median / floor_ref_median, 3),
    }))


if __name__ == "__main__":
    main()
