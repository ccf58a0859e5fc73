"""Signed envelope for trajectories and policies crossing Redis.

Layout: MAGIC (4) | flags (1) | HMAC-SHA256(key, MAGIC+flags+body) (32) | body.
The body is a protocol-5 pickle, zlib-compressed when flag bit 0 is set.
The MAC is checked before anything is decompressed or unpickled, and the
unpickler only resolves the few globals numpy arrays and builtin containers
need, so a payload can never name a callable such as os.system.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import pickle
import secrets
import zlib
from collections.abc import Mapping

import numpy as np
from numpy._core import multiarray as _np_multiarray
from numpy._core import numeric as _np_numeric

from nitro.errors import ConfigError

MAGIC = b"NTR1"
_FLAG_ZLIB = 0x01
_KNOWN_FLAGS = _FLAG_ZLIB
_MAC_LEN = hashlib.sha256().digest_size
_HEADER_LEN = len(MAGIC) + 1
_BODY_OFFSET = _HEADER_LEN + _MAC_LEN
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


def _mac(key: bytes, header, body) -> bytes:
    h = hmac.new(key, header, hashlib.sha256)
    h.update(body)  # separate update: no header+body concatenation copy
    return h.digest()


def _check_key(key: bytes) -> None:
    if not isinstance(key, (bytes, bytearray)) or not key:
        raise TypeError("HMAC key must be non-empty bytes")


def encode(obj, key: bytes, *, compress: bool = False) -> bytes:
    """Pickle `obj` (numpy arrays, builtin containers/scalars) and sign it."""
    _check_key(key)
    body = pickle.dumps(obj, protocol=5)
    flags = 0
    if compress:
        body = zlib.compress(body, 1)
        flags |= _FLAG_ZLIB
    header = MAGIC + bytes((flags,))
    return b"".join((header, _mac(key, header, body), body))


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


def _safe_frombuffer(buf, dtype, shape, order):
    if not isinstance(buf, (bytes, bytearray)):
        raise DisallowedTypeError(f"numpy._frombuffer({type(buf).__name__})")
    _require_plain_dtype(dtype)
    return _np_numeric._frombuffer(buf, dtype, shape, order)


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
    """Verify and unpickle an envelope from `encode`; raise a PayloadError subclass otherwise."""
    _check_key(key)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise UnsignedPayloadError(f"payload is {type(data).__name__}, not bytes")
    view = memoryview(data)
    if max_size is not None and view.nbytes > max_size:
        raise PayloadTooLargeError(f"payload is {view.nbytes} bytes, limit {max_size}")
    if view.nbytes < _BODY_OFFSET or view[: len(MAGIC)] != MAGIC:
        raise UnsignedPayloadError("payload lacks the nitro envelope header")
    header, mac, body = view[:_HEADER_LEN], view[_HEADER_LEN:_BODY_OFFSET], view[_BODY_OFFSET:]
    if not hmac.compare_digest(_mac(key, header, body), mac):
        raise BadSignatureError("payload signature does not match")
    flags = header[-1]
    if flags & ~_KNOWN_FLAGS:
        raise MalformedPayloadError(f"unknown envelope flags {flags:#x}")
    if flags & _FLAG_ZLIB:
        stream = io.BytesIO(_inflate(body, max_size))
    elif isinstance(data, bytes):
        stream = io.BytesIO(data)  # shares the bytes object's buffer: no copy of the body
        stream.seek(_BODY_OFFSET)
    else:
        stream = io.BytesIO(body)
    try:
        return _RestrictedUnpickler(stream).load()
    except PayloadError:
        raise
    except Exception as exc:  # any failure inside a verified body is corruption
        raise MalformedPayloadError(f"cannot unpickle payload: {type(exc).__name__}") from None


def _inflate(body, max_size: int | None) -> bytes:
    d = zlib.decompressobj()
    try:
        # Bounded output so a small compressed body cannot expand without limit.
        out = d.decompress(body, 0 if max_size is None else max_size + 1)
        if max_size is not None and len(out) > max_size:
            raise PayloadTooLargeError(f"decompressed payload exceeds {max_size} bytes")
        if not d.eof:
            raise MalformedPayloadError("truncated zlib stream")
        return out
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
