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

The pickle is protocol 5 with out-of-band buffers: numpy arrays travel as raw
bytes after it (a strided one as a contiguous copy), so encoding neither copies
contiguous ones into the pickle nor walks them (encode_buffer copies them once,
into the envelope, and writes the tag into its end), and decoding makes one copy of
the body (arrays come back writable, as views into it, each at a 16-byte
aligned offset). A dtype is pickled as numpy.dtype("<f4"), with no state to
BUILD. Flag bit 0: the body is zlib-compressed (the tag covers the compressed
bytes).

The tag is checked before the body is decompressed, parsed or unpickled; the
buffer table must then account for every byte of the body; the pickle's
opcodes are walked before it is unpickled (no BUILD, no length past its end,
and under a size limit no more objects than the limit: _check_pickle); the
unpickler only resolves the few globals numpy arrays, numpy scalars and complex
numbers need (an out-of-band buffer is bytes, never a callable), so a payload
can never name a callable such as os.system. Earlier versions (NTR1: in-band
pickle; NTR2: HMAC-SHA256) are refused with an error that names them.
"""

from __future__ import annotations

import copyreg
import hmac
import io
import os
import pickle
import secrets
import struct
import threading
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
    return bytes(encode_buffer(obj, key, compress=compress))


def encode_buffer(obj, key: bytes, *, compress: bool = False) -> bytearray:
    """`encode`'s envelope in the bytearray it is built in: the arrays copied once, into it, and the tag written
    into its last 16 bytes, with no copy into bytes after (for a caller that sends it at once: the trajectory
    writer; redis-py sends a bytearray as it is)."""
    _check_key(key)
    buffers: list[pickle.PickleBuffer] = []
    pickled = _pickle(obj, buffers.append)
    raws = [b.raw() for b in buffers]  # numpy hands out only contiguous buffers
    flags = _FLAG_ZLIB if compress else 0
    nonce = os.urandom(_NONCE_LEN)
    table = _TABLE_HEAD.pack(len(raws), len(pickled)) + struct.pack(f"<{len(raws)}Q", *(r.nbytes for r in raws))
    pieces = [MAGIC, bytes((flags,)), nonce, table, pickled]
    pos = len(table) + len(pickled)
    for raw in raws:
        pad = -pos % _ALIGN
        if pad:
            pieces.append(bytes(pad))
        pieces.append(raw)
        pos += pad + raw.nbytes
    if compress:
        pieces[3:] = [zlib.compress(b"".join(pieces[3:]), 1)]
    pieces.append(bytes(_TAG_LEN))  # the tag's place
    envelope = bytearray().join(pieces)
    with memoryview(envelope) as view:
        view[-_TAG_LEN:] = _poly1305(bytes(key), nonce, view[:-_TAG_LEN]).finalize()
    return envelope


# --- pickling ------------------------------------------------------------------

# The pickle leaves no object state for the unpickler to apply with BUILD (decode refuses BUILD). numpy's own
# pickle of a dtype is numpy.dtype("f4", False, True) plus BUILD with its byte order, and numpy's
# dtype.__setstate__ takes states no real dtype has (fields at any offset past the item, a subarray, the
# object flag; a datetime one given a version-3 state crashes the process), so encode writes a dtype as
# numpy.dtype(<its full string>) ("<f4", "|S8", "<M8[s]"), which needs no state. And every array of a plain
# dtype travels out of band as _frombuffer(<its bytes>, dtype, shape, order), as numpy sends contiguous ones:
# a strided one as a contiguous copy, a datetime one too (numpy pickles those in band, with BUILD).
_DTYPE_CHARS = "?bBhHiIlLqQefdgFDGSUMm"  # one dtype of every class the allowed kinds have (_ALLOWED_DTYPE_KINDS)


def _reduce_dtype(dtype: np.dtype):
    return np.dtype, (dtype.str,)


def _reduce_array(arr: np.ndarray):
    dtype = arr.dtype
    if arr.flags.c_contiguous and dtype.kind in "biufcSU":
        return arr.__reduce_ex__(5)  # numpy's own (in C): _frombuffer over the array's buffer
    if dtype.hasobject or dtype.kind not in _ALLOWED_DTYPE_KINDS or dtype.names is not None:
        return arr.__reduce_ex__(5)  # numpy's in-band form, which decode refuses
    order = "F" if arr.flags.f_contiguous and not arr.flags.c_contiguous else "C"
    if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
        arr = np.ascontiguousarray(arr)
    raw = arr.reshape(-1, order=order).view(np.uint8)  # bytes in memory order: a view, for any dtype
    return _np_numeric._frombuffer, (pickle.PickleBuffer(raw), dtype, arr.shape, order)


class _Pickler(pickle.Pickler):
    dispatch_table = {**copyreg.dispatch_table, np.ndarray: _reduce_array,
                      **{type(np.dtype(c)): _reduce_dtype for c in _DTYPE_CHARS}}


def _pickle(obj, buffer_callback) -> bytes:
    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=buffer_callback).dump(obj)
    return out.getvalue()


# --- restricted unpickling -------------------------------------------------

# numpy dtype kinds a payload may carry: numeric, bool, fixed strings, datetimes.
# Object ("O") and void/structured ("V") are refused; without an object dtype
# no array can hold references to arbitrary Python objects.
_ALLOWED_DTYPE_KINDS = frozenset("biufcUSMm")


def _require_plain_dtype(dtype) -> None:
    if (not isinstance(dtype, np.dtype) or dtype.hasobject or dtype.kind not in _ALLOWED_DTYPE_KINDS
            or dtype.names is not None or dtype.subdtype is not None):
        raise DisallowedTypeError(f"numpy.dtype({dtype!s})")


def _safe_dtype(spec, *args):
    # encode writes numpy.dtype("<f4"); numpy's numpy.dtype("f4", False, True) reads too. Only a type string is
    # accepted, and as the pickle cannot BUILD, nothing changes the dtype after this check.
    if not isinstance(spec, str) or not all(type(a) is bool for a in args):
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


# Per decode (and thread): how many bytes numpy scalars may still copy, what the walk left of the limit. The one
# allowed call that copies its argument: scalar(dtype("|S60000"), <the same 60 kB, 4,000 times>) would build 240 MB.
_SCALAR_ROOM = threading.local()


def _safe_scalar(dtype, data=None):
    _require_plain_dtype(dtype)  # scalar(dtype('O'), obj) would return obj itself
    if not isinstance(data, bytes):
        raise DisallowedTypeError(f"numpy.scalar({type(data).__name__})")
    room = getattr(_SCALAR_ROOM, "bytes", None)
    if room is not None:
        _SCALAR_ROOM.bytes = room = room - dtype.itemsize
        if room < 0:
            raise PayloadTooLargeError("the pickle's numpy scalars copy more than the size limit allows")
    return _np_multiarray.scalar(dtype, data)


# What encode's pickles name: numpy arrays (_frombuffer over an out-of-band buffer, with a dtype), numpy scalars
# and complex numbers. Containers, strings, bytes and numbers are opcodes, never calls; so no builtin such as
# bytes(10**9) or list(<a long list>) can be called to allocate what the pickle does not hold.
_ALLOWED_GLOBALS = {
    ("numpy", "dtype"): _safe_dtype,
    ("numpy._core.numeric", "_frombuffer"): _safe_frombuffer,
    ("numpy._core.multiarray", "scalar"): _safe_scalar,
    ("builtins", "complex"): complex,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise DisallowedTypeError(f"{module}.{name}") from None


class _PickleReader:
    """The pickle inside the body as a file for the unpickler, read without copying it (reads are views)."""

    __slots__ = ("_body", "_view", "pos", "_end")

    def __init__(self, body: bytearray, start: int, end: int):
        self._body, self._view, self.pos, self._end = body, memoryview(body), start, end

    def read(self, n: int = -1) -> memoryview:
        pos = self.pos
        self.pos = self._end if n is None or n < 0 else min(self._end, pos + n)
        return self._view[pos : self.pos]

    def readinto(self, buf) -> int:
        pos = self.pos
        n = min(len(buf), self._end - pos)
        buf[:n] = self._view[pos : pos + n]
        self.pos = pos + n
        return n

    def readline(self) -> memoryview:
        pos = self.pos
        newline = self._body.find(b"\n", pos, self._end)
        self.pos = self._end if newline < 0 else newline + 1
        return self._view[pos : self.pos]

    def peek(self, n: int = 0) -> memoryview:
        return self._view[self.pos : self._end]


# --- what a pickle may make the unpickler do, checked before it runs ----------------

# The C unpickler trusts what a pickle declares: BINBYTES, BINBYTES8 and BYTEARRAY8 allocate their declared
# length before reading it, and a memo index (PUT, LONG_BINPUT) grows the memo to twice the index, zeroed
# (CPython issue 115952). A one-byte opcode can build a 216-byte object (an empty set). So before unpickling,
# decode walks the opcodes once, building nothing, and refuses: BUILD (it calls an object's __setstate__: see
# _reduce_dtype), a length past the pickle's end, a memo index above the pickle's offset, an opcode that does
# not exist, and, under a size limit, a pickle whose objects could take more than the limit by these upper
# bounds (tests/test_codec_fuzz.py and bench/fuzz_codec.py measure them against tracemalloc):
_BASE_COST = 16 << 10  # the unpickler itself, and the error it may raise
_OPCODE_COST = 320  # any opcode: the object it builds (an empty set: 216 bytes), its stack, memo, container slots
_CALL_COST = 1024  # a call of an allowed global (REDUCE and friends); and once, a copy of the largest argument
_TEXT_COST = 8  # per byte of a str, int or line argument: up to 4 bytes a character, plus the decoder's copy
_MIN_OBJECT_BUDGET = 256 << 10  # what the objects may take under any size limit, however small

# Opcode table: > 0, an opcode of that fixed length; < 0, one the walk looks into (by frequency in encode's pickles).
(_OP_BYTES1, _OP_TEXT1, _OP_CALL, _OP_NEXT_BUFFER, _OP_STOP, _OP_BYTES4, _OP_TEXT4, _OP_BYTES8, _OP_TEXT8, _OP_LINE,
 _OP_LINE2, _OP_CALL_LINE2, _OP_PUT, _OP_BINPUT, _OP_LONG_BINPUT, _OP_FRAME, _OP_BUILD, _OP_NONE) = range(-1, -19, -1)
_OPCODES = [_OP_NONE] * 256
for _ops, _kind in (
    (b"N\x88\x89\x98]ael)t\x85\x86\x87}dsu\x8f\x90\x91021(\x94\x93Q", 1),  # no argument
    (b"K\x80h\x82", 2), (b"M\x83", 3), (b"Jj\x84", 5), (b"G", 9),  # an argument of fixed size
    (b"C", _OP_BYTES1), (b"\x8c\x8aU", _OP_TEXT1), (b"Ro\x81\x92", _OP_CALL), (b"\x97", _OP_NEXT_BUFFER),
    (b".", _OP_STOP), (b"B", _OP_BYTES4), (b"XT\x8b", _OP_TEXT4), (b"\x8e\x96", _OP_BYTES8), (b"\x8d", _OP_TEXT8),
    (b"ILSVFgP", _OP_LINE), (b"c", _OP_LINE2), (b"i", _OP_CALL_LINE2), (b"p", _OP_PUT), (b"q", _OP_BINPUT),
    (b"r", _OP_LONG_BINPUT), (b"\x95", _OP_FRAME), (b"b", _OP_BUILD),
):
    for _op in _ops:
        _OPCODES[_op] = _kind
_OPCODES = tuple(_OPCODES)


def _check_pickle(body: bytearray, start: int, end: int, budget: int | None) -> tuple[int | None, int, int]:
    """Walk the opcodes of body[start:end] as the unpickler reads them; return the offset of the STOP (None: the
    pickle ends first, which the unpickler reports), how many out-of-band buffers the pickle takes and the bound
    on what its objects take (what numpy scalars copy aside: _safe_scalar counts that)."""
    opcodes, op_cost = _OPCODES, _OPCODE_COST
    limit = (1 << 63) if budget is None else budget
    extra, n_ops, max_text, calls, n_buffers, memo_top, stop = _BASE_COST, 0, 0, 0, 0, 0, None
    i = start
    while True:
        # Every opcode is a byte at least, so before `horizon` the cost cannot pass the limit: no check per
        # opcode; an opcode that costs more than one opcode's worth brings the horizon closer.
        horizon = min(end, i + max(1, (limit - extra) // op_cost - n_ops))
        while i < horizon:
            kind = opcodes[body[i]]
            n_ops += 1
            if kind > 0:
                i += kind
                continue
            if kind >= _OP_TEXT1:  # a one-byte length, then that many bytes
                if i + 1 >= end:
                    i = end
                    break
                size = body[i + 1]
                i += 2 + size
                if i > end:
                    raise MalformedPayloadError(f"cannot unpickle payload: opcode at {i - 2 - size - start} "
                                                f"declares {size} bytes, {end - i + size} left")
                if kind == _OP_BYTES1:
                    added = size
                else:
                    added = _TEXT_COST * size
                    if size > max_text:
                        max_text = size
                extra += added
                horizon -= added // op_cost + 1
            elif kind == _OP_CALL:
                calls += 1
                extra += _CALL_COST
                horizon -= _CALL_COST // op_cost + 1
                i += 1
            elif kind == _OP_NEXT_BUFFER:
                n_buffers += 1
                i += 1
            elif kind == _OP_STOP:
                stop, i = i, end
                break
            elif kind >= _OP_TEXT8:  # a four- or eight-byte length, then that many bytes
                width = 4 if kind >= _OP_TEXT4 else 8
                if i + 1 + width > end:
                    i = end
                    break
                size = int.from_bytes(body[i + 1 : i + 1 + width], "little")
                if size > end - i - 1 - width:
                    raise MalformedPayloadError(f"cannot unpickle payload: opcode {body[i]:#04x} at {i - start} "
                                                f"declares {size} bytes, {end - i - 1 - width} left")
                i += 1 + width + size
                if kind in (_OP_BYTES4, _OP_BYTES8):
                    extra += size
                else:
                    extra += _TEXT_COST * size
                    max_text = max(max_text, size)
                break  # a new horizon
            elif kind >= _OP_PUT:  # argument(s) up to a newline
                newline = body.find(b"\n", i + 1, end)
                if kind in (_OP_LINE2, _OP_CALL_LINE2) and newline >= 0:
                    newline = body.find(b"\n", newline + 1, end)
                size = (end if newline < 0 else newline) - i
                extra += _TEXT_COST * size
                max_text = max(max_text, size)
                if kind == _OP_CALL_LINE2:
                    calls += 1
                    extra += _CALL_COST
                if newline < 0:
                    i = end  # the unpickler reads to the end and stops there
                    break
                if kind == _OP_PUT:
                    try:
                        index = int(body[i + 1 : newline])
                    except ValueError:
                        raise MalformedPayloadError(f"cannot unpickle payload: PUT at {i - start}") from None
                    extra, memo_top = _memo_put(index, i - start, extra, memo_top)
                i = newline + 1
                break
            elif kind >= _OP_LONG_BINPUT:
                width = 1 if kind == _OP_BINPUT else 4
                if i + 1 + width > end:
                    i = end
                    break
                extra, memo_top = _memo_put(int.from_bytes(body[i + 1 : i + 1 + width], "little"), i - start, extra,
                                            memo_top)
                i += 1 + width
                break
            elif kind == _OP_FRAME:
                if i + 9 > end:
                    i = end
                    break
                size = int.from_bytes(body[i + 1 : i + 9], "little")
                if size > end - i - 9:
                    raise MalformedPayloadError(f"cannot unpickle payload: a frame declares {size} bytes, "
                                                f"{end - i - 9} left")
                i += 9
            elif kind == _OP_BUILD:
                raise DisallowedTypeError("BUILD (an object's __setstate__; numpy's own dtype pickle: a sender "
                                          "older than this nitro?)")
            else:
                raise MalformedPayloadError(f"cannot unpickle payload: no opcode {body[i]:#04x} (at {i - start})")
        if i >= end and calls:
            extra += max_text  # a call's working copy of a str argument: complex("١" * 60000)
        cost = extra + op_cost * n_ops
        if cost > limit:
            raise PayloadTooLargeError(f"the pickle could build more than {limit} bytes of objects (limit {budget})")
        if i >= end:
            return stop, n_buffers, cost


def _memo_put(index: int, offset: int, cost: int, top: int) -> tuple[int, int]:
    """PUT-family memo index: at most one entry per opcode so far; the memo grows to twice the highest (8-byte
    slots)."""
    if not 0 <= index <= offset:
        raise MalformedPayloadError(f"cannot unpickle payload: memo index {index} at offset {offset}")
    return (cost + 16 * (index - top), index) if index > top else (cost, top)


def decode(data: bytes, key: bytes, *, max_size: int | None = None) -> object:
    """Verify and unpickle an envelope from `encode`; raise a PayloadError subclass otherwise.

    Arrays come back writable (unless sent read-only), as views into one private copy of the body. Under
    max_size, decoding allocates at most about twice max_size: the body's copy, and the objects the pickle
    builds, which _check_pickle bounds by max_size (at least _MIN_OBJECT_BUDGET) before unpickling.
    """
    _check_key(key)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise UnsignedPayloadError(f"payload is {type(data).__name__}, not bytes")
    if max_size is not None and memoryview(data).nbytes > max_size:  # before any copy
        raise PayloadTooLargeError(f"payload is {memoryview(data).nbytes} bytes, limit {max_size}")
    if not isinstance(data, bytes):
        data = bytes(data)  # immutable from here on: what was verified is what gets decoded
    view = memoryview(data)
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
    return _unpickle(body, max_size)


def _unpickle(body: bytearray, max_size: int | None) -> object:
    """The object in a verified body: the buffer table, the pickle's walk (_check_pickle), then the unpickler."""
    start, end, n = _table(body)
    budget = None if max_size is None else max(max_size, _MIN_OBJECT_BUDGET)
    stop, taken, cost = _check_pickle(body, start, end, budget)
    if stop is not None and stop + 1 != end:
        raise MalformedPayloadError(f"pickle_len: {end - stop - 1} bytes after the pickle's end")
    if n > taken:
        raise MalformedPayloadError("n_buffers: the pickle uses fewer out-of-band buffers than the table lists")
    buffers = _buffers(body, end, n)
    reader = _PickleReader(body, start, end)
    unused = iter(buffers)
    _SCALAR_ROOM.bytes = None if budget is None else budget - cost
    try:
        obj = _RestrictedUnpickler(reader, buffers=unused).load()
    except PayloadError:
        raise
    except Exception as exc:  # any failure inside a verified body is corruption; no payload text in the message
        raise MalformedPayloadError(f"cannot unpickle payload: {type(exc).__name__}") from None
    finally:
        _SCALAR_ROOM.bytes = None
    if reader.pos != end:  # the walk found the same STOP: a second check
        raise MalformedPayloadError(f"pickle_len: {end - reader.pos} bytes after the pickle's end")
    if next(unused, None) is not None:
        raise MalformedPayloadError("n_buffers: the pickle uses fewer out-of-band buffers than the table lists")
    return obj


def _table(body: bytearray) -> tuple[int, int, int]:
    """Where the pickle lies in a verified body, and how many buffers the table lists."""
    size = len(body)
    if size < _TABLE_HEAD.size:
        raise MalformedPayloadError(f"body is {size} bytes, shorter than the buffer table header")
    n, pickle_len = _TABLE_HEAD.unpack_from(body)
    start = _TABLE_HEAD.size + 8 * n
    if start > size:
        raise MalformedPayloadError(f"n_buffers: {n} buffer lengths do not fit in a {size}-byte body")
    if pickle_len > size - start:
        raise MalformedPayloadError(f"pickle_len: {pickle_len} bytes declared, {size - start} left in the body")
    return start, start + pickle_len, n


def _buffers(body: bytearray, pos: int, n: int) -> list[memoryview]:
    """The n out-of-band buffers from `pos` (the pickle's end) on; the table must account for every byte."""
    size = len(body)
    view = memoryview(body)
    buffers = []
    for i, (length,) in enumerate(struct.iter_unpack("<Q", view[_TABLE_HEAD.size : _TABLE_HEAD.size + 8 * n])):
        pos += -pos % _ALIGN  # padding: signed, never read
        if length > size - pos:
            raise MalformedPayloadError(f"buffer_len[{i}]: {length} bytes declared, {max(size - pos, 0)} left")
        buffers.append(view[pos : pos + length])
        pos += length
    if pos != size:
        raise MalformedPayloadError(f"body has {size - pos} bytes beyond its buffer table")
    return buffers


_INFLATE_CHUNK = 64 << 10


class _Inflater:
    """A zlib stream's output in pieces of at most 64 KiB, fed 64 KiB of input at a time (a larger feed or output
    would be copied whole: the output, and the input zlib leaves unconsumed)."""

    def __init__(self, data):
        self.zlib, self.data, self.fed, self.tail, self.pending = zlib.decompressobj(), memoryview(data), 0, b"", b""

    def piece(self) -> bytes:
        """The next piece; b"" at the stream's end (or at the input's, for a truncated stream)."""
        if self.pending:
            piece, self.pending = self.pending, b""
            return piece
        while not self.zlib.eof:
            if not self.tail and self.fed < len(self.data):
                self.tail = self.data[self.fed : self.fed + _INFLATE_CHUNK]
                self.fed += len(self.tail)
            before = len(self.tail)
            piece = self.zlib.decompress(self.tail, _INFLATE_CHUNK)
            self.tail = self.zlib.unconsumed_tail
            if piece:
                return piece
            if len(self.tail) == before and (self.tail or self.fed >= len(self.data)):
                break  # no progress: no more input, or none zlib will take
        return b""

    def read(self, n: int) -> bytes:
        """The next n bytes of output, fewer at the end."""
        if n <= 0:
            return b""
        pieces, got = [], 0
        while got < n:
            piece = self.piece()
            if not piece:
                break
            pieces.append(piece)
            got += len(piece)
        out = b"".join(pieces)
        self.pending = out[n:]
        return out[:n]

    def skip(self, limit: int) -> int:
        """Inflate and drop up to `limit` + 1 more bytes; how many there were."""
        count = len(self.pending)
        self.pending = b""
        while count <= limit:
            piece = self.piece()
            if not piece:
                break
            count += len(piece)
        return count

    def finish(self) -> None:
        if not self.zlib.eof:
            raise MalformedPayloadError("truncated zlib stream")
        after = len(self.zlib.unused_data) + len(self.data) - self.fed
        if after:
            raise MalformedPayloadError(f"{after} bytes after the zlib stream")


def _inflate(body, max_size: int | None) -> bytearray:
    """The decompressed body. Under max_size, it goes into a bytearray of the size its buffer table gives, a
    piece at a time: inflating takes the body's memory and a few pieces', whatever the stream holds."""
    inflater = _Inflater(body)
    try:
        if max_size is None:
            out = bytearray()
            while piece := inflater.piece():
                out += piece
        else:
            out = _inflate_sized(inflater, max_size)
        inflater.finish()
        return out
    except zlib.error:
        raise MalformedPayloadError("corrupt zlib stream") from None


def _inflate_sized(inflater: _Inflater, max_size: int) -> bytearray:
    head = inflater.read(_TABLE_HEAD.size)
    if len(head) < _TABLE_HEAD.size:
        return bytearray(head)  # shorter than its table: _table says so
    n, pickle_len = _TABLE_HEAD.unpack_from(head)
    if _TABLE_HEAD.size + 8 * n > max_size:
        if inflater.skip(max_size - len(head)) + len(head) > max_size:
            raise PayloadTooLargeError(f"decompressed payload exceeds {max_size} bytes")
        raise MalformedPayloadError(f"n_buffers: {n} buffer lengths do not fit in the decompressed body")
    lengths = inflater.read(8 * n)
    total = _TABLE_HEAD.size + 8 * n + pickle_len
    for (length,) in struct.iter_unpack("<Q", lengths[: len(lengths) - len(lengths) % 8]):
        total += -total % _ALIGN + length
        if total > max_size:
            break
    if len(lengths) < 8 * n:
        return bytearray(head + lengths)  # shorter than its table
    if total > max_size:
        seen = _TABLE_HEAD.size + len(lengths)
        if inflater.skip(max_size - seen) + seen > max_size:
            raise PayloadTooLargeError(f"decompressed payload exceeds {max_size} bytes")
        raise MalformedPayloadError(f"buffer_len: the table accounts for more than the {max_size}-byte limit, "
                                    "the stream inflates to less")
    out = bytearray(total)
    out[: _TABLE_HEAD.size] = head
    out[_TABLE_HEAD.size : _TABLE_HEAD.size + len(lengths)] = lengths
    pos = _TABLE_HEAD.size + len(lengths)
    del lengths
    while pos < total:
        piece = inflater.piece()
        if not piece:
            del out[pos:]  # shorter than its table says: _table or _buffers says how
            return out
        take = min(len(piece), total - pos)
        out[pos : pos + take] = memoryview(piece)[:take]
        pos += take
        if take < len(piece):
            inflater.pending = piece[take:]
            break
    beyond = inflater.skip(max_size - total)
    if total + beyond > max_size:
        raise PayloadTooLargeError(f"decompressed payload exceeds {max_size} bytes")
    if beyond:
        raise MalformedPayloadError(f"body has {beyond} bytes beyond its buffer table")
    return out


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
