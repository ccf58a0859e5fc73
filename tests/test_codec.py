"""nitro.codec: signed envelope round trips, and every way a payload is refused."""

from __future__ import annotations

import builtins
import hashlib
import hmac
import os
import pickle
import subprocess
import zlib

import numpy as np
import pytest

from nitro import codec
from nitro.codec import (
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


def _sign(body: bytes, key: bytes, flags: int = 0) -> bytes:
    """An envelope built independently of codec.encode, for hand-made bodies."""
    header = codec.MAGIC + bytes((flags,))
    return header + hmac.new(key, header + body, hashlib.sha256).digest() + body


@pytest.mark.parametrize("compress", [False, True])
def test_round_trip(hmac_key, compress):
    batch = _batch()
    blob = encode(batch, hmac_key, compress=compress)
    assert blob.startswith(codec.MAGIC)
    out = decode(blob, hmac_key)
    _assert_same(batch, out)
    assert out["obs"].flags.writeable  # learner can use arrays in place


def test_compression_shrinks_redundant_data(hmac_key):
    batch = {"zeros": np.zeros((4096, 11), np.float32)}
    assert len(encode(batch, hmac_key, compress=True)) < len(encode(batch, hmac_key)) / 10


def test_raw_pickle_is_unsigned(hmac_key):
    with pytest.raises(UnsignedPayloadError) as exc:
        decode(pickle.dumps(_batch(), protocol=5), hmac_key)
    assert exc.value.reason == "unsigned"


@pytest.mark.parametrize("data", [b"", b"NTR1", b"NTR1\x00" + b"\x00" * 10, b"XXXX" + b"\x00" * 64])
def test_short_or_foreign_data_is_unsigned(hmac_key, data):
    with pytest.raises(UnsignedPayloadError):
        decode(data, hmac_key)


def test_truncated_payload(hmac_key):
    blob = encode(_batch(), hmac_key)
    with pytest.raises(BadSignatureError):
        decode(blob[:-100], hmac_key)
    with pytest.raises(UnsignedPayloadError):
        decode(blob[:20], hmac_key)


@pytest.mark.parametrize("where", ["body", "mac", "flags"])
def test_tampering_breaks_signature(hmac_key, where):
    blob = bytearray(encode(_batch(), hmac_key))
    offset = {"body": len(blob) // 2, "mac": 10, "flags": 4}[where]
    blob[offset] ^= 0x01
    with pytest.raises(BadSignatureError) as exc:
        decode(bytes(blob), hmac_key)
    assert exc.value.reason == "bad_signature"


def test_wrong_key(hmac_key):
    blob = encode(_batch(), hmac_key)
    with pytest.raises(BadSignatureError):
        decode(blob, os.urandom(32))


def test_disallowed_global(hmac_key):
    body = pickle.dumps({"f": os.path.join}, protocol=5)
    with pytest.raises(DisallowedTypeError) as exc:
        decode(_sign(body, hmac_key), hmac_key)
    assert exc.value.reason == "disallowed_type"
    assert "join" in str(exc.value)


@pytest.mark.parametrize(
    "obj", [np.array([1, "a"], dtype=object), {"x": [np.empty(3, dtype=object)]}, np.dtype("O")]
)
def test_object_dtype_is_disallowed(hmac_key, obj):
    with pytest.raises(DisallowedTypeError):
        decode(encode(obj, hmac_key), hmac_key)


def test_structured_dtype_is_disallowed(hmac_key):
    with pytest.raises(DisallowedTypeError):
        decode(encode(np.zeros(2, dtype=[("a", "f4"), ("b", "i4")]), hmac_key), hmac_key)


def test_corrupt_zlib(hmac_key):
    with pytest.raises(MalformedPayloadError) as exc:
        decode(_sign(b"definitely not zlib", hmac_key, flags=0x01), hmac_key)
    assert exc.value.reason == "malformed"
    truncated = zlib.compress(pickle.dumps([1, 2, 3], protocol=5))[:-3]
    with pytest.raises(MalformedPayloadError):
        decode(_sign(truncated, hmac_key, flags=0x01), hmac_key)


def test_corrupt_pickle_and_unknown_flags(hmac_key):
    good = pickle.dumps({"a": np.ones(100)}, protocol=5)
    with pytest.raises(MalformedPayloadError):
        decode(_sign(good[: len(good) // 2], hmac_key), hmac_key)
    with pytest.raises(MalformedPayloadError):
        decode(_sign(good, hmac_key, flags=0x80), hmac_key)


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


@pytest.mark.parametrize(
    "make",
    [
        lambda m: encode({"obs": np.zeros(3), "evil": _SystemCall(m)}, KEY),
        lambda m: encode([_EvalCall(m)], KEY),
        lambda m: encode((_SubprocessCall(m),), KEY, compress=True),
        lambda m: _sign(_posix_system_pickle(m), KEY),
        lambda m: _sign(_getattr_pickle(m), KEY),
    ],
    ids=["os.system", "builtins.eval", "subprocess.call", "posix.system", "builtins.getattr"],
)
def test_malicious_pickle_is_never_executed(tmp_path, make):
    marker = tmp_path / "pwned"
    blob = make(marker)
    with pytest.raises(DisallowedTypeError):
        decode(blob, KEY)
    assert not marker.exists()
    # Control: plain pickle would run the same body, so the payload is a real exploit.
    body = blob[len(codec.MAGIC) + 1 + 32 :]
    pickle.loads(zlib.decompress(body) if blob[4] & 1 else body)
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
