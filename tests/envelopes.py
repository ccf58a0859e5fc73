"""Signed envelopes built from the documented layout (docs/security.md), independently of codec.encode.

Tests use these to hand-craft what codec.encode would never produce: inconsistent bodies, unknown
flags, forged pickles signed with the real key (what a compromised actor could send), and the
retired NTR1/NTR2 versions.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import pickle
import struct

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

MAGIC = b"NTR3"
HEADER = 5  # magic + flags
BODY = HEADER + 12  # + nonce
TAG = 16  # Poly1305 tag, after the body


def mac_key(key: bytes) -> bytes:
    return hmac.digest(key, b"nitro envelope NTR3 mac key", "sha256")


def sign(body: bytes, key: bytes, flags: int = 0, magic: bytes = MAGIC, nonce: bytes | None = None) -> bytes:
    """magic | flags | nonce | body | ChaCha20-Poly1305 tag over everything before it."""
    nonce = os.urandom(12) if nonce is None else nonce
    signed = magic + bytes((flags,)) + nonce + body
    return signed + ChaCha20Poly1305(mac_key(key)).encrypt(nonce, b"", signed)


def sign_ntr2(body: bytes, key: bytes, flags: int = 0) -> bytes:
    """The retired NTR2 envelope: magic | flags | HMAC-SHA256 | body."""
    header = b"NTR2" + bytes((flags,))
    return header + hmac.new(key, header + body, hashlib.sha256).digest() + body


def body(pickled: bytes, buffers=(), *, lengths=None, n=None, pickle_len=None) -> bytes:
    """Buffer table, pickle, 16-byte aligned out-of-band buffers.

    lengths / n / pickle_len override what the table declares, for inconsistent (but signed) bodies.
    """
    lengths = [len(bytes(b)) for b in buffers] if lengths is None else list(lengths)
    table = struct.pack("<IQ", len(lengths) if n is None else n, len(pickled) if pickle_len is None else pickle_len)
    out = bytearray(table + struct.pack(f"<{len(lengths)}Q", *lengths) + pickled)
    for b in buffers:
        out += bytes(-len(out) % 16) + bytes(b)
    return bytes(out)


class _Pickler(pickle.Pickler):
    """Protocol 5 as the layout has it: a dtype as numpy.dtype(<its string>), with no state for BUILD (numpy's
    own pickle of a dtype BUILDs its byte order, and the receiver refuses BUILD)."""

    def reducer_override(self, obj):
        return (np.dtype, (obj.str,)) if isinstance(obj, np.dtype) else NotImplemented


def oob_pickle(obj) -> tuple[bytes, list[bytes]]:
    """`obj` pickled as the layout has it, and its out-of-band buffers."""
    buffers, out = [], io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=buffers.append).dump(obj)
    return out.getvalue(), [bytes(b.raw()) for b in buffers]


def oob_body(obj) -> bytes:
    """The body of `obj` pickled with out-of-band buffers."""
    return body(*oob_pickle(obj))


def body_of(blob: bytes) -> bytes:
    """The (possibly compressed) body of an NTR3 envelope."""
    return blob[BODY:-TAG]


def resign(blob: bytes, key: bytes, *, flags: int | None = None, magic: bytes | None = None,
           new_body: bytes | None = None) -> bytes:
    """`blob` with its header or body replaced, signed again with `key` (a key holder's forgery)."""
    return sign(body_of(blob) if new_body is None else new_body, key,
                blob[HEADER - 1] if flags is None else flags, magic or blob[:4])
