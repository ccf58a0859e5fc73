"""Signed envelope for trajectories and policies crossing Redis.

Layout (version NTR3, all integers little-endian):

    MAGIC "NTR3" (4) | flags (1) | nonce (12) | body | tag (16)
    body = n_buffers u32 | pickle_len u64 | buffer_len u64 x n_buffers
           | pickle | (zero padding to a 16-byte body offset | buffer) x n_buffers
    tag  = ChaCha20-Poly1305 (RFC 8439) under mac_key and nonce, empty plaintext,
           associated data = MAGIC + flags + nonce + body
    mac_key = HMAC-SHA256(key, "nitro envelope NTR3 mac key"); nonce: 12 random bytes per envelope

The tag is a Poly1305 MAC under a one-time key that ChaCha20 derives from
(mac_key, nonce): about four times cheaper per byte than HMAC-SHA256 (the
envelope's MAC before NTR3), which made the two MAC passes the largest part of
a batch's trip. It stays unforgeable without the key as long as nonces do not
repeat under one key: 96 random bits, so rotate the key before ~2^32
envelopes (docs/security.md).

The pickle is protocol 5 with out-of-band buffers: contiguous numpy arrays
travel as raw bytes after it, so encoding neither copies them into the pickle
nor walks them, and decoding makes one copy of the body (arrays come back
writable, as views into it, each at a 16-byte aligned offset). Flag bit 0:
the body is zlib-compressed (the tag covers the compressed bytes).

The tag is checked before the body is decompressed, parsed or unpickled; the
buffer table must then account for every byte of the body; the unpickler only
resolves the few globals numpy arrays and builtin containers need (an
out-of-band buffer is bytes, never a callable), so a payload can never name a
callable such as os.system. Earlier versions (NTR1: in-band pickle; NTR2:
HMAC-SHA256) are refused with an error that names them.
"""

from __future__ import annotations

import hmac
import io
import os
import pickle
import secrets
import struct
import zlib
from collections.abc import Mapping
from functools import lru_cache

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.ciphers import Cipher
from cryptography.hazmat.primitives.ciphers.algorithms import ChaCha20
from cryptography.hazmat.primitives.poly1305 import Poly1305
from numpy._core import multiarray as _np_multiarray
from numpy._core import numeric as _np_numeric

from nitro.errors import ConfigError

MAGIC = b"NTR3"
# Earlier layouts: refused with an error that names the version, so an outdated sender is easy to spot.
_RETIRED_VERSIONS = frozenset({"NTR1", "NTR2"})
_FLAG_ZLIB = 0x01
_KNOWN_FLAGS = _FLAG_ZLIB
_NONCE_LEN = 12
_TAG_LEN = 16
_HEADER_LEN = len(MAGIC) + 1
_BODY_OFFSET = _HEADER_LEN + _NONCE_LEN
_MAC_KEY_LABEL = b"nitro envelope NTR3 mac key"
_TABLE_HEAD = struct.Struct("<IQ")  # n_buffers, pickle_len
_AEAD_LENGTHS = struct.Struct("<QQ")  # the AEAD's closing block: associated data's length, ciphertext's (0)
_ALIGN = 16  # >= the alignment of every allowed dtype, so arrays come back aligned
_MIN_KEY_BYTES = 16
_MIN_HEX_CHARS = 32


class PayloadError(Exception):
    """A payload that must not be used; `.reason` is a stable metric label."""

    reason = "malformed"


class UnsignedPayloadError(PayloadError):
    reason = "unsigned"


class BadSignatureError(PayloadError):
    reason = "bad_signature"


class DisallowedTypeError(PayloadError):
    reason = "disallowed_type"

    def __init__(self, name: str):
        self.name = name
        super().__init__(f"payload references disallowed type {name}")


class MalformedPayloadError(PayloadError):
    reason = "malformed"


class PayloadTooLargeError(PayloadError):
    reason = "too_large"


def _check_key(key: bytes) -> None:
    if not isinstance(key, (bytes, bytearray)) or not key:
        raise TypeError("HMAC key must be non-empty bytes")


@lru_cache(maxsize=16)
def _mac_key(key: bytes) -> bytes:
    """The envelope's 32-byte MAC key for a deployment key, whatever its length."""
    return hmac.digest(key, _MAC_KEY_LABEL, "sha256")


# Poly1305 input goes in as whole 128-byte chunks, then the tail: OpenSSL's AVX-512 Poly1305 takes an input of
# an odd number of 64-byte blocks at half speed (measured on a 287 KB envelope: 38.7 us one pass, 19.4 us with
# one block more or less; split like this, 24.9 us either way, the Python calls included).
_POLY_CHUNK = 128


def _poly1305(key: bytes, nonce: bytes, signed) -> Poly1305:
    """RFC 8439's ChaCha20-Poly1305 MAC, as the AEAD computes it for an empty plaintext and associated data
    `signed`, ready to finalize or verify: Poly1305 under the one-time key of ChaCha20 block 0 (mac_key,
    nonce), over signed | zero padding to 16 bytes | len(signed) u64 | 0 u64."""
    one_time_key = Cipher(ChaCha20(_mac_key(key), bytes(4) + bytes(nonce)), mode=None).encryptor().update(bytes(32))
    mac = Poly1305(one_time_key)
    size = len(signed)
    cut = size - size % _POLY_CHUNK
    mac.update(signed[:cut])
    mac.update(signed[cut:])
    mac.update(bytes(-size % 16) + _AEAD_LENGTHS.pack(size, 0))
    return mac


def encode(obj, key: bytes, *, compress: bool = False) -> bytes:
    """Pickle `obj` (numpy arrays, builtin containers/scalars) and sign it.

    compress=True zlib-compresses the body: worth it for image observations
    (uint8 frames shrink several-fold), not for float trajectories (their
    mantissas look random: about 10% smaller, for several times the cost of
    the whole uncompressed path; bench/trajectory_path.py --compress).
    """
    _check_key(key)
    buffers: list[pickle.PickleBuffer] = []
    pickled = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]  # numpy hands out only contiguous buffers
    pieces = [_TABLE_HEAD.pack(len(raws), len(pickled)) + struct.pack(f"<{len(raws)}Q", *(r.nbytes for r in raws)),
              pickled]
    pos = len(pieces[0]) + len(pickled)
    for raw in raws:
        pad = -pos % _ALIGN
        if pad:
            pieces.append(bytes(pad))
        pieces.append(raw)
        pos += pad + raw.nbytes
    flags = 0
    if compress:
        pieces = [zlib.compress(b"".join(pieces), 1)]
        flags |= _FLAG_ZLIB
    nonce = os.urandom(_NONCE_LEN)
    signed = b"".join((MAGIC, bytes((flags,)), nonce, *pieces))
    return signed + _poly1305(bytes(key), nonce, memoryview(signed)).finalize()


# --- restricted unpickling -------------------------------------------------

# numpy dtype kinds a payload may carry: numeric, bool, fixed strings, datetimes.
# Object ("O") and void/structured ("V") are refused; without an object dtype
# no array can hold references to arbitrary Python objects.
_ALLOWED_DTYPE_KINDS = frozenset("biufcUSMm")


def _require_plain_dtype(dtype) -> None:
    if not isinstance(dtype, np.dtype) or dtype.hasobject or dtype.kind not in _ALLOWED_DTYPE_KINDS:
        raise DisallowedTypeError(f"numpy.dtype({dtype!s})")


def _safe_dtype(spec, *args):
    # Pickles call numpy.dtype("f4", False, True); only a type string is accepted.
    if not isinstance(spec, str):
        raise DisallowedTypeError(f"numpy.dtype({type(spec).__name__} spec)")
    dtype = np.dtype(spec, *args)
    _require_plain_dtype(dtype)
    return dtype


def _safe_frombuffer(buf, dtype, shape, order, axis_order=None):
    # buf: in-band bytes/bytearray, or an out-of-band buffer (a memoryview of the body: bytes, not code).
    # axis_order: numpy >= 2.3 pickles axis-permuted contiguous arrays as order "K" plus the permutation.
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise DisallowedTypeError(f"numpy._frombuffer({type(buf).__name__})")
    _require_plain_dtype(dtype)
    return _np_numeric._frombuffer(buf, dtype, shape, order, axis_order)


def _safe_scalar(dtype, data=None):
    _require_plain_dtype(dtype)  # scalar(dtype('O'), obj) would return obj itself
    if not isinstance(data, bytes):
        raise DisallowedTypeError(f"numpy.scalar({type(data).__name__})")
    return _np_multiarray.scalar(dtype, data)


class _NdarrayToken:
    """Stands in for numpy.ndarray so a payload cannot call its constructor."""


_NDARRAY = _NdarrayToken()


def _safe_reconstruct(subtype, shape, typecode):
    # Non-contiguous arrays and datetimes pickle as _reconstruct(ndarray, ...) + BUILD;
    # the BUILD state's dtype comes from _safe_dtype, so it cannot be object.
    if subtype is not _NDARRAY:
        raise DisallowedTypeError("numpy._reconstruct(subclass)")
    arr = _np_multiarray._reconstruct(np.ndarray, shape, typecode)
    _require_plain_dtype(arr.dtype)  # the placeholder typecode could itself be "O"
    return arr


_ALLOWED_GLOBALS = {
    ("numpy", "dtype"): _safe_dtype,
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy._core.numeric", "_frombuffer"): _safe_frombuffer,
    ("numpy._core.multiarray", "scalar"): _safe_scalar,
    ("numpy._core.multiarray", "_reconstruct"): _safe_reconstruct,
    **{
        ("builtins", t.__name__): t
        for t in (dict, list, tuple, set, frozenset, str, bytes, bytearray, int, float, complex, bool)
    },
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise DisallowedTypeError(f"{module}.{name}") from None


def decode(data: bytes, key: bytes, *, max_size: int | None = None) -> object:
    """Verify and unpickle an envelope from `encode`; raise a PayloadError subclass otherwise.

    Arrays come back writable (unless sent read-only), as views into one private copy of the body.
    """
    _check_key(key)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise UnsignedPayloadError(f"payload is {type(data).__name__}, not bytes")
    if not isinstance(data, bytes):
        data = bytes(data)  # immutable from here on: what was verified is what gets decoded
    view = memoryview(data)
    if max_size is not None and view.nbytes > max_size:
        raise PayloadTooLargeError(f"payload is {view.nbytes} bytes, limit {max_size}")
    if view.nbytes < _BODY_OFFSET + _TAG_LEN or view[:3] != MAGIC[:3]:
        raise UnsignedPayloadError("payload lacks the nitro envelope header")
    if view[: len(MAGIC)] != MAGIC:
        version = bytes(view[: len(MAGIC)]).decode("ascii", "replace")
        hint = "the sender runs an older nitro" if version in _RETIRED_VERSIONS else "unknown version"
        raise MalformedPayloadError(f"envelope version {version!r} is not read here (this nitro reads "
                                    f"{MAGIC.decode()}): {hint}")
    signed, tag = view[:-_TAG_LEN], view[-_TAG_LEN:]
    try:
        _poly1305(bytes(key), view[_HEADER_LEN:_BODY_OFFSET], signed).verify(bytes(tag))  # constant-time
    except InvalidSignature:
        raise BadSignatureError("payload signature does not match") from None
    flags = view[_HEADER_LEN - 1]
    if flags & ~_KNOWN_FLAGS:
        raise MalformedPayloadError(f"unknown envelope flags {flags:#x}")
    # One copy: the arrays' writable memory, and nothing aliases the caller's buffer.
    body = signed[_BODY_OFFSET:]
    body = _inflate(body, max_size) if flags & _FLAG_ZLIB else bytearray(body)
    pickled, buffers = _split_body(body)
    stream = io.BytesIO(pickled)
    unused = iter(buffers)
    try:
        obj = _RestrictedUnpickler(stream, buffers=unused).load()
    except PayloadError:
        raise
    except Exception as exc:  # any failure inside a verified body is corruption; no payload text in the message
        raise MalformedPayloadError(f"cannot unpickle payload: {type(exc).__name__}") from None
    if stream.tell() != len(pickled):
        raise MalformedPayloadError(f"pickle_len: {len(pickled) - stream.tell()} bytes after the pickle's end")
    if next(unused, None) is not None:
        raise MalformedPayloadError("n_buffers: the pickle uses fewer out-of-band buffers than the table lists")
    return obj


def _split_body(body: bytearray) -> tuple[memoryview, list[memoryview]]:
    """The pickle and the out-of-band buffers of a verified body; the table must cover it exactly."""
    size = len(body)
    if size < _TABLE_HEAD.size:
        raise MalformedPayloadError(f"body is {size} bytes, shorter than the buffer table header")
    n, pickle_len = _TABLE_HEAD.unpack_from(body)
    pos = _TABLE_HEAD.size + 8 * n
    if pos > size:
        raise MalformedPayloadError(f"n_buffers: {n} buffer lengths do not fit in a {size}-byte body")
    lengths = struct.unpack_from(f"<{n}Q", body, _TABLE_HEAD.size)
    view = memoryview(body)
    if pickle_len > size - pos:
        raise MalformedPayloadError(f"pickle_len: {pickle_len} bytes declared, {size - pos} left in the body")
    pickled = view[pos : pos + pickle_len]
    pos += pickle_len
    buffers = []
    for i, length in enumerate(lengths):
        pos += -pos % _ALIGN  # padding: signed, never read
        if length > size - pos:
            raise MalformedPayloadError(f"buffer_len[{i}]: {length} bytes declared, {max(size - pos, 0)} left")
        buffers.append(view[pos : pos + length])
        pos += length
    if pos != size:
        raise MalformedPayloadError(f"body has {size - pos} bytes beyond its buffer table")
    return pickled, buffers


def _inflate(body, max_size: int | None) -> bytearray:
    d = zlib.decompressobj()
    try:
        # Bounded output so a small compressed body cannot expand without limit.
        out = d.decompress(body, 0 if max_size is None else max_size + 1)
        if max_size is not None and len(out) > max_size:
            raise PayloadTooLargeError(f"decompressed payload exceeds {max_size} bytes")
        if not d.eof:
            raise MalformedPayloadError("truncated zlib stream")
        if d.unused_data:
            raise MalformedPayloadError(f"{len(d.unused_data)} bytes after the zlib stream")
        return bytearray(out)
    except zlib.error:
        raise MalformedPayloadError("corrupt zlib stream") from None


# --- key management ----------------------------------------------------------


def _parse_key(raw: bytes, source: str) -> bytes:
    text = raw.strip()
    if len(text) >= _MIN_HEX_CHARS and len(text) % 2 == 0:
        try:
            return bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass  # not hex: use the bytes as they are
    if len(text) < _MIN_KEY_BYTES:
        raise ConfigError(
            f"{source} is too short: need >= {_MIN_HEX_CHARS} hex chars or >= {_MIN_KEY_BYTES} bytes"
        )
    return text


def load_hmac_key(environ: Mapping[str, str] = os.environ) -> bytes:
    """The deployment's trajectory-signing key from NITRO_HMAC_KEY or NITRO_HMAC_KEY_FILE.

    NITRO_HMAC_KEY wins when both are set. The key itself never appears in errors.
    """
    value = environ.get("NITRO_HMAC_KEY")
    if value:
        return _parse_key(value.encode("utf-8"), "NITRO_HMAC_KEY")
    path = environ.get("NITRO_HMAC_KEY_FILE")
    if path:
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise ConfigError(f"NITRO_HMAC_KEY_FILE={path!r} cannot be read: {exc.strerror}") from None
        return _parse_key(raw, f"key file NITRO_HMAC_KEY_FILE={path!r}")
    raise ConfigError("no HMAC key: set NITRO_HMAC_KEY (hex) or NITRO_HMAC_KEY_FILE")


def generate_hmac_key() -> str:
    """A fresh 32-byte key as hex, for local mode."""
    return secrets.token_hex(32)
