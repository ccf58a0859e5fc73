"""nitro.data.codec: signed envelope round trips, and every way a payload is refused."""

from __future__ import annotations

import builtins
import hashlib
import hmac
import os
import pickle
import pickletools
import struct
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nitro.data import codec
from nitro.data.codec import (
    BadSignatureError,
    DisallowedTypeError,
    MalformedPayloadError,
    PayloadError,
    PayloadTooLargeError,
    UnsignedPayloadError,
    decode,
    encode,
    generate_hmac_key,
    load_hmac_key,
)
from nitro.errors import ConfigError
from nitro.tools import codec_fuzz
from tests import envelopes
from tests.envelopes import BODY, HEADER, TAG
from tests.envelopes import body as _body
from tests.envelopes import oob_body as _oob_body


def _batch() -> dict:
    rng = np.random.default_rng(0)
    n = 4096
    return {
        "obs": rng.standard_normal((n, 11)).astype(np.float32),
        "actions": rng.standard_normal((n, 3)).astype(np.float32),
        "rewards": rng.standard_normal(n).astype(np.float32),
        "values64": rng.standard_normal(n),
        "terminated": rng.random(n) < 0.01,
        "steps": np.arange(n, dtype=np.int64),
        "frames": rng.integers(0, 255, (4, 84, 84), dtype=np.uint8),
        "strided": np.arange(10.0)[::3],  # non-contiguous: pickled via _reconstruct
        "fortran": np.asfortranarray(np.ones((3, 2), np.float32)),
        "bootstrap": np.array(0.5, dtype=np.float32),  # 0-d array
        "gamma": np.float32(0.99),
        "count": np.int64(7),
        "flag": np.bool_(True),
        "scalars": [1, 2.5, "x", b"raw", None, True, 3 + 4j, bytearray(b"ba")],
        "nested": {
            "returns": [1.0, -2.0],
            "sets": ({1, 2}, frozenset({"a"})),
            "arr": [np.zeros(2, np.float64)],
        },
    }


def _assert_same(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def _sign(body: bytes, key: bytes, flags: int = 0, magic: bytes = codec.MAGIC) -> bytes:
    return envelopes.sign(body, key, flags, magic)


def _unpack(blob: bytes) -> tuple[bytes, list[bytes]]:
    """The pickle and out-of-band buffers of an envelope, read with the documented layout."""
    body = envelopes.body_of(blob)
    if blob[HEADER - 1] & 1:
        body = zlib.decompress(body)
    n, pickle_len = struct.unpack_from("<IQ", body)
    lengths = struct.unpack_from(f"<{n}Q", body, 12)
    pos = 12 + 8 * n
    pickled, pos = body[pos : pos + pickle_len], pos + pickle_len
    buffers = []
    for length in lengths:
        pos += -pos % 16
        buffers.append(body[pos : pos + length])
        pos += length
    assert pos == len(body)
    return pickled, buffers


@pytest.mark.parametrize("compress", [False, True])
def test_round_trip(hmac_key, compress):
    batch = _batch()
    blob = encode(batch, hmac_key, compress=compress)
    assert blob.startswith(codec.MAGIC)
    out = decode(blob, hmac_key)
    _assert_same(batch, out)
    assert out["obs"].flags.writeable  # learner can use arrays in place
    assert out["fortran"].flags.f_contiguous and not out["fortran"].flags.c_contiguous
    assert all(a.flags.aligned for a in (out["obs"], out["values64"], out["steps"], out["frames"]))


def _hopper_batch(steps: int = 4096) -> dict:
    """What an actor sends after a Hopper rollout (nitro.policy.rollout's batch layout)."""
    rng = np.random.default_rng(1)
    done = rng.random(steps) < 0.002
    return {
        "obs": rng.standard_normal((steps, 11)).astype(np.float32),
        "actions": rng.standard_normal((steps, 3)).astype(np.float32),
        "rewards": rng.standard_normal(steps).astype(np.float32),
        "terminated": done,
        "truncated": np.zeros(steps, dtype=bool),
        "logp": rng.standard_normal(steps).astype(np.float32),
        "values": rng.standard_normal(steps).astype(np.float32),
        "bootstrap_value": np.float32(0.3),
        "episode_returns": [float(x) for x in rng.normal(1000.0, 200.0, int(done.sum()) + 1)],
    }


def test_hopper_batch_round_trip_keeps_dtype_shape_contiguity(hmac_key):
    batch = _hopper_batch()
    record = ("inv-7", 3, 2, 4096, batch)
    out = decode(encode(record, hmac_key), hmac_key)
    _assert_same(record, out)
    for name, arr in out[4].items():
        if isinstance(arr, np.ndarray) and arr.ndim:
            assert arr.flags.c_contiguous and arr.flags.aligned and arr.flags.writeable, name
    # Writable memory of the decoder's own: changing it touches neither the sender's arrays nor another decode.
    again = decode(encode(record, hmac_key), hmac_key)
    out[4]["obs"][:] = 0
    assert batch["obs"].any() and again[4]["obs"].any()


def test_arrays_travel_out_of_band(hmac_key):
    batch = _hopper_batch()
    blob = encode(batch, hmac_key)
    pickled, buffers = _unpack(blob)
    arrays = [v for v in batch.values() if isinstance(v, np.ndarray) and v.ndim]
    assert len(buffers) == len(arrays)  # every contiguous array is a buffer of its own ...
    assert len(pickled) < 2048  # ... so the pickle holds only structure
    assert [bytes(b) for b in buffers] == [a.tobytes() for a in arrays]
    assert len(blob) < len(pickle.dumps(batch, protocol=5)) + 256  # table and padding cost a few bytes


def test_envelope_layout_and_mac(hmac_key):
    blob = encode({"a": np.arange(5, dtype=np.int16), "b": np.ones(3)}, hmac_key)
    assert blob[:HEADER] == codec.MAGIC + b"\x00"
    # The tag is ChaCha20-Poly1305's over everything before it, under the documented derived key.
    assert envelopes.sign(envelopes.body_of(blob), hmac_key, nonce=blob[HEADER:BODY]) == blob
    assert encode({"a": 1}, hmac_key)[HEADER:BODY] != encode({"a": 1}, hmac_key)[HEADER:BODY]  # fresh nonces
    n, pickle_len = struct.unpack_from("<IQ", blob, BODY)
    assert n == 2 and struct.unpack_from("<2Q", blob, BODY + 12) == (10, 24)
    first = 12 + 16 + pickle_len
    first += -first % 16  # buffers start at 16-byte offsets of the body
    assert blob[BODY + first : BODY + first + 10] == np.arange(5, dtype=np.int16).tobytes()


def test_the_envelope_built_in_place_is_the_aead_envelope(hmac_key):
    """encode_buffer joins the pieces into a bytearray and writes the tag into its last 16 bytes: with arrays
    of sizes that leave every kind of partial block, that is the AEAD's envelope, and encode's is its bytes."""
    obj = {f"a{n}": np.arange(n, dtype=np.uint8) for n in (255, 256, 300, 1000, 4099, 70_001)}
    obj["f"] = np.arange(4096 * 11, dtype=np.float32).reshape(4096, 11)
    for compress in (False, True):
        built = codec.encode_buffer(obj, hmac_key, compress=compress)
        assert type(built) is bytearray and built[HEADER - 1] == compress
        assert envelopes.sign(envelopes.body_of(built), hmac_key, compress, nonce=built[HEADER:BODY]) == built
        _assert_same(obj, decode(built, hmac_key))
        blob = encode(obj, hmac_key, compress=compress)
        assert type(blob) is bytes
        assert envelopes.sign(envelopes.body_of(blob), hmac_key, compress, nonce=blob[HEADER:BODY]) == blob


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 63, 64, 127, 128, 129, 191, 4096 + 80, 287_313, 287_361])
def test_the_incremental_tag_is_the_aead_tag(hmac_key, size):
    """codec feeds Poly1305 in pieces (whole 128-byte chunks, the tail, the padding and lengths): at every
    length, chunk boundary or not, the envelope it signs carries the AEAD's own tag, and decode accepts the
    AEAD-signed one."""
    body = os.urandom(size)
    nonce = os.urandom(12)
    by_aead = envelopes.sign(body, hmac_key, nonce=nonce)
    signed = by_aead[:-16]
    assert codec._poly1305(hmac_key, nonce, memoryview(signed)).finalize() == by_aead[-16:]
    with pytest.raises(codec.MalformedPayloadError):  # verified, then refused as a body: not a bad signature
        decode(by_aead, hmac_key)
    with pytest.raises(codec.BadSignatureError):
        decode(by_aead[:-1] + bytes([by_aead[-1] ^ 1]), hmac_key)


def test_axis_permuted_and_read_only_arrays(hmac_key):
    permuted = np.arange(24, dtype=np.float32).reshape(2, 3, 4).transpose(1, 0, 2)  # pickled as order "K"
    frozen = np.arange(4.0)
    frozen.flags.writeable = False
    out = decode(encode({"p": permuted, "f": frozen}, hmac_key), hmac_key)
    _assert_same({"p": permuted, "f": frozen}, out)
    assert not out["f"].flags.writeable  # a read-only array stays read-only, as pickle defines
    assert out["p"].flags.writeable


def test_decode_accepts_bytes_like(hmac_key):
    blob = encode({"x": np.ones(3)}, hmac_key)
    for data in (bytearray(blob), memoryview(blob)):
        np.testing.assert_array_equal(decode(data, hmac_key)["x"], np.ones(3))


def test_compression_shrinks_redundant_data(hmac_key):
    batch = {"zeros": np.zeros((4096, 11), np.float32)}
    assert len(encode(batch, hmac_key, compress=True)) < len(encode(batch, hmac_key)) / 10


def test_raw_pickle_is_unsigned(hmac_key):
    with pytest.raises(UnsignedPayloadError) as exc:
        decode(pickle.dumps(_batch(), protocol=5), hmac_key)
    assert exc.value.reason == "unsigned"


@pytest.mark.parametrize("data", [b"", codec.MAGIC, codec.MAGIC + b"\x00" * 10, b"XXXX" + b"\x00" * 64])
def test_short_or_foreign_data_is_unsigned(hmac_key, data):
    with pytest.raises(UnsignedPayloadError):
        decode(data, hmac_key)


def test_previous_and_unknown_versions_are_refused(hmac_key):
    # NTR1: in-band pickle right after the MAC, correctly signed with the same key. Never unpickled.
    header = b"NTR1\x00"
    body = pickle.dumps({"obs": np.ones(3)}, protocol=5)
    ntr1 = header + hmac.new(hmac_key, header + body, hashlib.sha256).digest() + body
    with pytest.raises(MalformedPayloadError, match="'NTR1'.*NTR3.*older nitro"):
        decode(ntr1, hmac_key)
    # NTR2: today's body under HMAC-SHA256, correctly signed: refused too, never parsed.
    with pytest.raises(MalformedPayloadError, match="'NTR2'.*NTR3.*older nitro"):
        decode(envelopes.sign_ntr2(_oob_body({"obs": np.ones(3)}), hmac_key), hmac_key)
    with pytest.raises(MalformedPayloadError, match="'NTR9'.*unknown version"):
        decode(_sign(_oob_body([1]), hmac_key, magic=b"NTR9"), hmac_key)


def test_truncated_payload(hmac_key):
    blob = encode(_batch(), hmac_key)
    with pytest.raises(BadSignatureError):  # cut in transit: the MAC covers the length
        decode(blob[:-100], hmac_key)
    with pytest.raises(UnsignedPayloadError):
        decode(blob[:20], hmac_key)


def _offsets(blob: bytes) -> dict:
    n, pickle_len = struct.unpack_from("<IQ", blob, BODY)
    first = 12 + 8 * n + pickle_len
    first += -first % 16
    return {"magic": 0, "flags": 4, "nonce": 10, "mac": len(blob) - TAG + 3, "n_buffers": BODY, "pickle_len": BODY + 4, "buffer_len": BODY + 12,
            "pickle": BODY + 12 + 8 * n + pickle_len // 2, "first_buffer": BODY + first,
            "last_body_byte": len(blob) - TAG - 1, "last_byte": len(blob) - 1}


@pytest.mark.parametrize("where", ["flags", "nonce", "mac", "n_buffers", "pickle_len", "buffer_len", "pickle",
                                   "first_buffer", "last_body_byte", "last_byte"])
def test_tampering_breaks_signature(hmac_key, where):
    blob = bytearray(encode(_batch(), hmac_key))
    blob[_offsets(bytes(blob))[where]] ^= 0x01
    with pytest.raises(BadSignatureError) as exc:
        decode(bytes(blob), hmac_key)
    assert exc.value.reason == "bad_signature"


def test_lengths_moved_between_buffers_break_signature(hmac_key):
    # Same total size, bytes reassigned from the second buffer to the first: still the MAC's business.
    blob = bytearray(encode({"a": np.zeros(8, np.uint8), "b": np.zeros(32, np.uint8)}, hmac_key))
    struct.pack_into("<2Q", blob, BODY + 12, 24, 16)
    with pytest.raises(BadSignatureError):
        decode(bytes(blob), hmac_key)


def test_wrong_key(hmac_key):
    blob = encode(_batch(), hmac_key)
    with pytest.raises(BadSignatureError):
        decode(blob, os.urandom(32))


def _buffered_pickle() -> tuple[bytes, list[bytes]]:
    return envelopes.oob_pickle({"a": np.arange(4.0), "b": np.ones(3, np.int32)})


@pytest.mark.parametrize(
    "make_body, field",
    [
        (lambda p, b: _body(p, b, lengths=[32, 4096]), "buffer_len"),  # truncated: a buffer runs past the end
        (lambda p, b: _body(p, b, n=10**6), "n_buffers"),
        (lambda p, b: _body(p, b, pickle_len=1 << 40), "pickle_len"),
        (lambda p, b: _body(p, b) + b"\x00" * 16, "beyond its buffer table"),
        (lambda p, b: _body(p, b)[:8], "shorter than the buffer table"),
        (lambda p, b: _body(p, b[:1]), "cannot unpickle"),  # the pickle asks for a buffer the table lacks
        (lambda p, b: _body(p, b + [b"spare"]), "n_buffers"),  # a buffer the pickle never uses
        (lambda p, b: _body(p + b"trailing", b), "pickle_len"),  # bytes after the pickle's STOP
        (lambda p, b: _body(p[: len(p) // 2], b), "cannot unpickle"),  # truncated pickle
    ],
    ids=["buffer-truncated", "n-buffers", "pickle-len", "extra-bytes", "short-body", "missing-buffer",
         "unused-buffer", "trailing-pickle", "truncated-pickle"],
)
def test_signed_but_inconsistent_body_is_malformed(hmac_key, make_body, field):
    pickled, buffers = _buffered_pickle()
    with pytest.raises(MalformedPayloadError, match=field) as exc:
        decode(_sign(make_body(pickled, buffers), hmac_key), hmac_key)
    assert exc.value.reason == "malformed"


@pytest.mark.parametrize("flags", [0x02, 0x80, 0x81])
def test_unknown_flags_are_refused(hmac_key, flags):
    with pytest.raises(MalformedPayloadError, match="flags"):
        decode(_sign(_oob_body({"a": np.ones(100)}), hmac_key, flags=flags), hmac_key)


def test_disallowed_global(hmac_key):
    body = _oob_body({"f": os.path.join})
    with pytest.raises(DisallowedTypeError) as exc:
        decode(_sign(body, hmac_key), hmac_key)
    assert exc.value.reason == "disallowed_type"
    assert "join" in str(exc.value)


def test_disallowed_global_beside_out_of_band_arrays(hmac_key):
    body = _oob_body({"obs": np.ones((64, 11), np.float32), "f": os.path.join, "r": np.zeros(64)})
    with pytest.raises(DisallowedTypeError, match="join"):
        decode(_sign(body, hmac_key), hmac_key)


@pytest.mark.parametrize("dtype_ops", [b"cnumpy\ndtype\n(VO8\nI00\nI01\ntR", b"VO\n"], ids=["dtype-O", "bare-O"])
def test_out_of_band_buffer_cannot_make_an_object_array(hmac_key, dtype_ops):
    # _frombuffer(<buffer>, "O", ...) would read pointers out of the buffer's bytes.
    pickled = b"\x80\x05cnumpy._core.numeric\n_frombuffer\n(\x97" + dtype_ops + b"(I2\ntVC\ntR."
    with pytest.raises(DisallowedTypeError, match="dtype"):
        decode(_sign(_body(pickled, [bytes(16)]), hmac_key), hmac_key)


def test_object_dtype_is_disallowed_even_in_band(hmac_key):
    with pytest.raises(DisallowedTypeError):
        decode(_sign(_body(pickle.dumps(np.array([1, "a"], dtype=object), protocol=5)), hmac_key), hmac_key)


@pytest.mark.parametrize(
    "obj", [np.array([1, "a"], dtype=object), {"x": [np.empty(3, dtype=object)]}, np.dtype("O")]
)
def test_object_dtype_is_disallowed(hmac_key, obj):
    with pytest.raises(DisallowedTypeError):
        decode(encode(obj, hmac_key), hmac_key)


def test_structured_dtype_is_disallowed(hmac_key):
    with pytest.raises(DisallowedTypeError):
        decode(encode(np.zeros(2, dtype=[("a", "f4"), ("b", "i4")]), hmac_key), hmac_key)


@pytest.mark.parametrize("max_size", [None, 1 << 20])  # under a limit, the body is inflated into its own size
def test_corrupt_zlib(hmac_key, max_size):
    with pytest.raises(MalformedPayloadError) as exc:
        decode(_sign(b"definitely not zlib", hmac_key, flags=0x01), hmac_key, max_size=max_size)
    assert exc.value.reason == "malformed"
    body = _oob_body([1, 2, 3])
    with pytest.raises(MalformedPayloadError, match="truncated"):
        decode(_sign(zlib.compress(body)[:-3], hmac_key, flags=0x01), hmac_key, max_size=max_size)
    with pytest.raises(MalformedPayloadError, match="after the zlib stream"):
        decode(_sign(zlib.compress(body) + b"junk", hmac_key, flags=0x01), hmac_key, max_size=max_size)
    with pytest.raises(MalformedPayloadError, match="beyond its buffer table"):
        decode(_sign(zlib.compress(body + bytes(100)), hmac_key, flags=0x01), hmac_key, max_size=max_size)
    assert decode(_sign(zlib.compress(body), hmac_key, flags=0x01), hmac_key, max_size=max_size) == [1, 2, 3]


def test_too_large(hmac_key):
    blob = encode(_batch(), hmac_key)
    with pytest.raises(PayloadTooLargeError) as exc:
        decode(blob, hmac_key, max_size=len(blob) - 1)
    assert exc.value.reason == "too_large"
    assert decode(blob, hmac_key, max_size=len(blob))["obs"].shape == (4096, 11)


def test_decompression_bomb_is_too_large(hmac_key):
    blob = encode({"z": np.zeros(10_000_000, np.uint8)}, hmac_key, compress=True)
    assert len(blob) < 100_000
    with pytest.raises(PayloadTooLargeError):
        decode(blob, hmac_key, max_size=1_000_000)


# --- malicious pickles: refused even when signed with the right key ---------------

KEY = b"k" * 32


class _SystemCall:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _EvalCall:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (builtins.eval, (f"open({str(self.marker)!r}, 'w').close()",))


class _SubprocessCall:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (subprocess.call, (["touch", str(self.marker)],))


def _posix_system_pickle(marker) -> bytes:
    # Hand-written protocol-0 pickle naming posix.system explicitly.
    return b"cposix\nsystem\n(V" + f"touch {marker}".encode() + b"\ntR."


def _getattr_pickle(marker) -> bytes:
    # getattr(__import__("os"), "system")(...) - a classic allow-list bypass attempt.
    return (
        b"cbuiltins\ngetattr\n(cbuiltins\n__import__\n(Vos\ntRVsystem\ntR(V"
        + f"touch {marker}".encode()
        + b"\ntR."
    )


# posix.system(<first out-of-band buffer>): the command travels as buffer bytes, the callable is refused.
_NEXT_BUFFER_TO_SYSTEM = b"\x80\x05cposix\nsystem\n\x97\x85R."


@pytest.mark.parametrize(
    "make",
    [
        lambda m: encode({"obs": np.zeros(3), "evil": _SystemCall(m)}, KEY),
        lambda m: encode([_EvalCall(m)], KEY),
        lambda m: encode((_SubprocessCall(m),), KEY, compress=True),
        lambda m: _sign(_body(_posix_system_pickle(m)), KEY),
        lambda m: _sign(_body(_getattr_pickle(m)), KEY),
        lambda m: _sign(_body(_NEXT_BUFFER_TO_SYSTEM, [f"touch {m}".encode()]), KEY),
    ],
    ids=["os.system", "builtins.eval", "subprocess.call", "posix.system", "builtins.getattr",
         "out-of-band-argument"],
)
def test_malicious_pickle_is_never_executed(tmp_path, make):
    marker = tmp_path / "pwned"
    blob = make(marker)
    with pytest.raises(DisallowedTypeError):
        decode(blob, KEY)
    assert not marker.exists()
    # Control: plain pickle would run the same body, so the payload is a real exploit.
    pickled, buffers = _unpack(blob)
    pickle.loads(pickled, buffers=buffers)
    assert marker.exists()


def test_error_hierarchy():
    for cls, reason in [
        (UnsignedPayloadError, "unsigned"),
        (BadSignatureError, "bad_signature"),
        (DisallowedTypeError, "disallowed_type"),
        (MalformedPayloadError, "malformed"),
        (PayloadTooLargeError, "too_large"),
    ]:
        assert issubclass(cls, PayloadError) and cls.reason == reason


# --- found by the fuzz bench (bench/fuzz_codec.py): signed payloads that harmed the decoder -------------
# Each was decoded, crashed the process or allocated far more than the payload holds before the fix.

def _peak(fn) -> tuple[int, object]:
    """tracemalloc's peak while fn runs, and what it returned or the PayloadError it raised."""
    tracemalloc.start()
    try:
        try:
            result = fn()
        except PayloadError as exc:
            result = exc
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


_FRAMES = b"cnumpy._core.numeric\n_frombuffer\n"  # a global both numpy and the codec resolve
_F8 = b"cnumpy\ndtype\n(Vf8\nI00\nI01\ntR"  # numpy.dtype("f8", False, True), as numpy pickles it
_FIELDS_PAST_THE_ITEM = b"(I3\nV<\nN(Va\nt(dVa\n(" + _F8 + b"I100000000\ntsI-1\nI-1\nI0\ntb"
_OBJECT_FLAG = b"(I3\nV<\nNNNI-1\nI-1\nI1\ntb"


@pytest.mark.parametrize("pickled, harm", [
    # an f8 array whose dtype got a field 100 MB past its item: reading it read other memory
    (b"\x80\x05" + _FRAMES + b"(\x97" + _F8 + _FIELDS_PAST_THE_ITEM + b"(I2\ntVC\ntR.", "fields"),
    # an array rebuilt with a dtype flagged as holding objects: the allow-list's own invariant, broken
    (b"\x80\x05cnumpy._core.multiarray\n_reconstruct\n(cnumpy\nndarray\n(I0\ntC\x01btR(I1\n(I2\nt" + _F8
     + _OBJECT_FLAG + b"I00\nC\x10" + bytes(16) + b"tb.", "hasobject"),
], ids=["dtype-fields-past-the-item", "array-with-object-flag"])
def test_a_pickled_dtype_state_never_reaches_numpy(hmac_key, pickled, harm):
    buffers = [bytes(16)] if b"\x97" in pickled else []
    with pytest.raises(DisallowedTypeError, match="BUILD"):
        decode(_sign(_body(pickled, buffers), hmac_key), hmac_key)
    # Control: numpy applies the state, so the payload did what it says (the dtype alone for the object flag:
    # numpy cannot even free an array of it).
    if harm == "fields":
        assert pickle.loads(pickled, buffers=buffers).dtype.names == ("a",)
    else:
        assert pickle.loads(b"\x80\x05" + _F8 + _OBJECT_FLAG + b".").hasobject


def test_a_datetime_dtype_state_does_not_crash_the_decoder(hmac_key):
    # numpy.dtype("M8") given a version-3 state (no datetime metadata) killed the process with SIGSEGV.
    pickled = b"\x80\x05cnumpy\ndtype\n(VM8\nI00\nI01\ntR(I3\nV|\nNNNI-1\nI-1\nI0\ntb."
    script = ("import sys; from nitro.data.codec import decode, DisallowedTypeError\n"
              "try:\n    decode(bytes.fromhex(sys.argv[1]), bytes.fromhex(sys.argv[2]))\n"
              "except DisallowedTypeError:\n    print('refused')\n")
    proc = subprocess.run([sys.executable, "-c", script, _sign(_body(pickled), hmac_key).hex(), hmac_key.hex()],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert (proc.returncode, proc.stdout.strip()) == (0, "refused"), proc.stderr[-2000:]


_HUGE = b"J\x00\xe1\xf5\x05"  # 100,000,000


@pytest.mark.parametrize("pickled", [
    b"\x80\x05cbuiltins\nbytes\n" + _HUGE + b"\x85R.",
    b"\x80\x05cbuiltins\nbytearray\n" + _HUGE + b"\x85R.",
    b"\x80\x05cnumpy._core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + _HUGE + b"\x85C\x01b\x87R.",
    b"\x80\x05cbuiltins\nlist\n\x94(" + b"N" * 1000 + b"l\x94(" + b"h\x00h\x01\x85R" * 1000 + b"l.",
], ids=["bytes(n)", "bytearray(n)", "_reconstruct(shape)", "list(list)-copies"])
def test_no_allowed_call_builds_what_the_pickle_does_not_hold(hmac_key, pickled):
    peak, result = _peak(lambda: decode(_sign(_body(pickled), hmac_key), hmac_key))
    assert isinstance(result, DisallowedTypeError)
    assert peak < 1 << 20  # was 100 MB (8 MB for the copies) from a pickle of a few dozen bytes


@pytest.mark.parametrize("opcode, width", [(b"B", 4), (b"\x8e", 8), (b"\x96", 8)],
                         ids=["BINBYTES", "BINBYTES8", "BYTEARRAY8"])
def test_a_length_past_the_pickle_is_refused_before_the_unpickler_allocates_it(hmac_key, opcode, width):
    pickled = b"\x80\x05" + opcode + (10**8).to_bytes(width, "little") + b"abc."
    peak, result = _peak(lambda: decode(_sign(_body(pickled), hmac_key), hmac_key))
    assert isinstance(result, MalformedPayloadError) and "declares 100000000 bytes" in str(result)
    assert peak < 1 << 20  # CPython's unpickler allocates a declared length before it reads it


@pytest.mark.parametrize("put", [b"r\x80\x96\x98\x00", b"p10000000\n"], ids=["LONG_BINPUT", "PUT"])
def test_a_memo_index_past_the_pickle_is_refused(hmac_key, put):
    peak, result = _peak(lambda: decode(_sign(_body(b"\x80\x05N" + put + b"."), hmac_key), hmac_key))
    assert isinstance(result, MalformedPayloadError) and "memo index 10000000" in str(result)
    assert peak < 1 << 20  # the unpickler's memo grows to twice the index: 160 MB, zeroed


def test_the_objects_a_pickle_builds_are_bounded_by_the_size_limit(hmac_key):
    sets = _sign(_body(b"\x80\x05(" + b"\x8f" * 50_000 + b"l."), hmac_key)  # 50 kB: 50,000 empty sets, 11 MB
    peak, result = _peak(lambda: decode(sets, hmac_key, max_size=1 << 20))
    assert isinstance(result, PayloadTooLargeError) and peak < 1 << 20
    assert len(decode(sets, hmac_key)) == 50_000  # no limit, no bound: a valid pickle after all


def test_copies_of_one_argument_are_bounded_by_the_size_limit(hmac_key):
    # numpy.scalar copies its bytes: 100 scalars of the same 60 kB make 6 MB from a 61 kB pickle.
    pickled = (b"\x80\x05cnumpy._core.multiarray\nscalar\n\x94cnumpy\ndtype\n\x8c\x07|S60000\x85R\x94B"
               + struct.pack("<I", 60_000) + bytes(60_000) + b"\x94(" + b"h\x00h\x01h\x02\x86R" * 100 + b"l.")
    blob = _sign(_body(pickled), hmac_key)
    peak, result = _peak(lambda: decode(blob, hmac_key, max_size=1 << 20))
    assert isinstance(result, PayloadTooLargeError) and "scalars" in str(result)
    assert peak < 2 << 20
    assert len(decode(blob, hmac_key)) == 100


def test_the_table_lists_no_more_buffers_than_the_pickle_takes(hmac_key):
    blob = _sign(_body(b"\x80\x05].", [b""] * 100_000), hmac_key)  # one memoryview each: 18 MB
    peak, result = _peak(lambda: decode(blob, hmac_key, max_size=1 << 20))
    assert isinstance(result, MalformedPayloadError) and "n_buffers" in str(result)
    assert peak < 1 << 20


def test_a_compressed_body_is_inflated_once(hmac_key):
    blob = encode({"frames": np.zeros(1 << 20, np.uint8)}, hmac_key, compress=True)
    peak, result = _peak(lambda: decode(blob, hmac_key, max_size=2 << 20))
    assert result["frames"].nbytes == 1 << 20
    assert peak < (1 << 20) + (512 << 10)  # was 3 MB: zlib's output, a copy of it, and a writable copy


def test_every_array_and_dtype_travels_without_build(hmac_key):
    batch = {**_batch(), "when": np.arange(3).astype("M8[s]"), "big_endian": np.arange(4, dtype=">i4")}
    pickled, buffers = _unpack(encode(batch, hmac_key))
    ops = [op.name for op, _, _ in pickletools.genops(pickled)]
    assert "BUILD" not in ops and b"_reconstruct" not in pickled
    arrays = [v for v in [*batch.values(), *batch["nested"]["arr"]] if isinstance(v, np.ndarray)]
    assert len(buffers) == len(arrays)  # strided, datetime and 0-d arrays too
    _assert_same(batch, decode(encode(batch, hmac_key), hmac_key))


def test_numpys_own_pickle_of_an_array_is_refused(hmac_key):
    # numpy.dtype("f8", False, True) + BUILD: what nitro before this walk sent. Refused, never misread.
    buffers = []
    pickled = pickle.dumps(np.arange(3.0), protocol=5, buffer_callback=buffers.append)
    with pytest.raises(DisallowedTypeError, match="BUILD"):
        decode(_sign(_body(pickled, [b.raw() for b in buffers]), hmac_key), hmac_key)


def test_the_opcode_table_is_pickletools():
    kinds = {"uint1": 2, "uint2": 3, "int4": 5, "uint4": 5, "float8": 9}
    for op in pickletools.opcodes:
        code = op.code.encode("latin-1")[0]
        kind = codec._OPCODES[code]
        if op.name in ("BUILD", "STOP", "NEXT_BUFFER", "FRAME", "BINPUT", "LONG_BINPUT", "PUT") or \
                op.name in ("REDUCE", "OBJ", "NEWOBJ", "NEWOBJ_EX", "INST"):
            assert kind < 0, op.name  # the walk looks into these
        elif op.arg is None:
            assert kind == 1, op.name
        elif op.arg.n >= 0:
            assert kind == kinds[op.arg.name] == 1 + op.arg.n, op.name
        else:
            assert kind < 0, op.name
    names = {op.code.encode("latin-1")[0] for op in pickletools.opcodes}
    assert all(codec._OPCODES[b] == codec._OP_NONE for b in range(256) if b not in names)


def _counted(op: bytes, fmt: str):
    return st.binary(max_size=40).map(lambda data: op + struct.pack(fmt, len(data)) + data)


# Opcodes with arguments pickletools reads: what a pickle may hold, whatever it means.
_WELL_FORMED_OPS = st.one_of(
    st.sampled_from([bytes((op.code.encode("latin-1")[0],)) for op in pickletools.opcodes if op.arg is None]),
    st.tuples(st.sampled_from([b"K", b"h", b"q", b"\x82"]), st.binary(min_size=1, max_size=1)).map(b"".join),
    st.tuples(st.sampled_from([b"M", b"\x83"]), st.binary(min_size=2, max_size=2)).map(b"".join),
    st.tuples(st.sampled_from([b"J", b"j", b"r", b"\x84"]), st.binary(min_size=4, max_size=4)).map(b"".join),
    st.binary(min_size=8, max_size=8).map(lambda b: b"G" + b),
    *[_counted(op, "<B") for op in (b"C", b"\x8c", b"U", b"\x8a")],
    *[_counted(op, "<I") for op in (b"B", b"X", b"T", b"\x8b")],
    *[_counted(op, "<Q") for op in (b"\x8e", b"\x96", b"\x8d")],
    st.integers(0, 64).map(lambda n: b"\x95" + struct.pack("<Q", n)),
    st.tuples(st.sampled_from([b"I", b"L", b"g", b"p"]), st.integers(0, 10**6)).map(lambda t: t[0] + b"%d\n" % t[1]),
    st.floats(allow_nan=False).map(lambda x: b"F%r\n" % x),
    st.text("abc\u00e9", max_size=8).map(lambda t: b"V" + t.encode("raw-unicode-escape") + b"\n"),
    st.sampled_from([b"S'abc'\n", b"Pid\n", b"cmod\nname\n", b"imod\nname\n"]),
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ops=st.lists(st.one_of(_WELL_FORMED_OPS, codec_fuzz._soup_op()), min_size=1, max_size=30))
def test_the_walk_reads_a_pickle_as_pickletools_does(ops):
    pickled = b"\x80\x05" + b"".join(ops) + b"."
    try:
        parsed = list(pickletools.genops(pickled))
    except Exception:
        return  # not a pickle pickletools reads through; the fuzz bench has the unpickler's verdict on it
    body = bytearray(pickled)
    try:
        stop, buffers, _ = codec._check_pickle(body, 0, len(body), None)
    except PayloadError:
        return  # refused (BUILD, a length past the end, a memo index): never unpickled
    stops = [pos for op, _, pos in parsed if op.name == "STOP"]
    assert stop == (stops[0] if stops else None)
    assert buffers == sum(op.name == "NEXT_BUFFER" for op, _, pos in parsed if pos <= (stop or len(body)))


# --- keys ----------------------------------------------------------------------------


def test_load_hmac_key_hex():
    hexkey = generate_hmac_key()
    assert len(hexkey) == 64
    assert load_hmac_key({"NITRO_HMAC_KEY": hexkey}) == bytes.fromhex(hexkey)


def test_load_hmac_key_passphrase():
    assert load_hmac_key({"NITRO_HMAC_KEY": "correct horse battery"}) == b"correct horse battery"


def test_load_hmac_key_too_short_does_not_leak_key():
    with pytest.raises(ConfigError) as exc:
        load_hmac_key({"NITRO_HMAC_KEY": "s3cr3t"})
    assert "NITRO_HMAC_KEY" in str(exc.value) and "s3cr3t" not in str(exc.value)


def test_load_hmac_key_file(tmp_path):
    path = tmp_path / "key"
    hexkey = generate_hmac_key()
    path.write_text(hexkey + "\n")
    assert load_hmac_key({"NITRO_HMAC_KEY_FILE": str(path)}) == bytes.fromhex(hexkey)
    path.write_bytes(b"a passphrase of enough length\n")
    assert load_hmac_key({"NITRO_HMAC_KEY_FILE": str(path)}) == b"a passphrase of enough length"


def test_load_hmac_key_env_wins_over_file(tmp_path):
    path = tmp_path / "key"
    path.write_text(generate_hmac_key())
    hexkey = generate_hmac_key()
    env = {"NITRO_HMAC_KEY": hexkey, "NITRO_HMAC_KEY_FILE": str(path)}
    assert load_hmac_key(env) == bytes.fromhex(hexkey)


def test_load_hmac_key_missing(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_hmac_key({})
    assert "NITRO_HMAC_KEY" in str(exc.value) and "NITRO_HMAC_KEY_FILE" in str(exc.value)
    with pytest.raises(ConfigError, match="NITRO_HMAC_KEY_FILE"):
        load_hmac_key({"NITRO_HMAC_KEY_FILE": str(tmp_path / "absent")})
    with pytest.raises(ConfigError):
        load_hmac_key({"NITRO_HMAC_KEY": ""})
