"""Fuzzing the envelope decoder and its restricted unpickler: Hypothesis strategies and the properties.

bench/fuzz_codec.py draws >= 10,000 cases from `cases()`, tests/test_codec_fuzz.py a few hundred; both judge
each one with `check()`. A case is bytes for the decoder's public entry point,
nitro.data.codec.decode(data, KEY, max_size=LIMIT), with keys made here: valid envelopes (codec.encode),
those envelopes mutated byte-wise (flips, truncations, extensions, header and length fields), random bytes,
envelopes under another key, and envelopes signed with the right key that carry hostile pickles or hostile
bodies (globals outside the allow-list, calls of the allowed ones with hostile arguments, BUILD, lengths
declared past the end, memo indices, deep nesting, opcodes that build many objects, copies of one large
argument, random opcodes, decompression bombs, inconsistent buffer tables), so the unpickler itself is
exercised. Hostile envelopes follow the documented layout (docs/security.md "The HMAC key"), independently
of codec.encode; `check_signer()` makes sure the decoder still accepts what `sign()` makes.

The properties, checked by `check()` on every case:
  (a) nothing that is not validly signed decodes, and it is refused before the unpickler: by the size limit,
      the header or the tag (reason unsigned, too_large, malformed for another version, bad_signature; an
      NTR3 header within the limit can only be bad_signature);
  (b) decode raises nothing but codec.PayloadError subclasses;
  (c) the peak of what tracemalloc traces during one decode stays within `alloc_bound()`: the body's private
      copy (at most the limit) and the objects (at most the limit), plus ALLOC_SLACK;
  (d) what decodes holds only plain data (builtin containers and scalars, numpy arrays, scalars and dtypes
      of a plain dtype, buffers), and nothing the payload named was called;
  (e) a valid envelope decodes to what was encoded.

Needs hypothesis, a dev dependency (`pip install -c constraints.txt -e '.[dev]'`).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
import tracemalloc
import zlib
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from nitro.data import codec
from nitro.data.codec import PayloadError

KEY = hashlib.sha256(b"nitro codec fuzz: the deployment key").digest()
OTHER_KEY = hashlib.sha256(b"nitro codec fuzz: another key").digest()
LIMIT = 256 << 10  # decode's max_size in every case
ALLOC_SLACK = 64 << 10  # the decoder's own small allocations, an exception, numpy's caches
PRE_TAG_REASONS = frozenset({"unsigned", "too_large", "malformed", "bad_signature"})

MAGIC = b"NTR3"
HEADER = 5  # magic + flags
BODY = HEADER + 12  # + nonce
TAG = 16
PROTO = b"\x80\x05"


# --- the documented layout ----------------------------------------------------------------------


@lru_cache(maxsize=4)
def _aead(key: bytes) -> ChaCha20Poly1305:
    return ChaCha20Poly1305(hmac.digest(key, b"nitro envelope NTR3 mac key", "sha256"))


def sign(body: bytes, key: bytes = KEY, flags: int = 0, magic: bytes = MAGIC, nonce: bytes = bytes(12)) -> bytes:
    """magic | flags | nonce | body | ChaCha20-Poly1305 tag over everything before it."""
    signed = magic + bytes((flags,)) + nonce + body
    return signed + _aead(key).encrypt(nonce, b"", signed)


def body(pickled: bytes, buffers=(), *, lengths=None, n=None, pickle_len=None) -> bytes:
    """Buffer table, pickle, 16-byte aligned buffers; lengths / n / pickle_len override what the table says."""
    lengths = [len(b) for b in buffers] if lengths is None else list(lengths)
    table = struct.pack("<IQ", len(lengths) if n is None else n, len(pickled) if pickle_len is None else pickle_len)
    out = bytearray(table + struct.pack(f"<{len(lengths)}Q", *lengths) + pickled)
    for b in buffers:
        out += bytes(-len(out) % 16) + bytes(b)
    return bytes(out)


def body_of(blob: bytes) -> bytes:
    return blob[BODY:-TAG]


def check_signer() -> None:
    """The decoder accepts what sign() makes: else every hostile case would only test the tag check."""
    blob = codec.encode({"x": np.arange(3.0)}, KEY)
    for flags in (0, 1):
        inner = body_of(blob) if flags == 0 else zlib.compress(body_of(blob))
        try:
            out = codec.decode(sign(inner, KEY, flags=flags), KEY, max_size=LIMIT)
        except PayloadError as exc:
            raise AssertionError(f"decode refuses an envelope signed by nitro.tools.codec_fuzz.sign ({exc}): "
                                 "the envelope layout changed, update sign()") from None
        assert np.array_equal(out["x"], np.arange(3.0))


# --- pickle pieces --------------------------------------------------------------------------------


def p_str(s: str) -> bytes:
    b = s.encode("utf-8", "surrogatepass")
    return (b"\x8c" + bytes((len(b),)) if len(b) < 256 else b"X" + struct.pack("<I", len(b))) + b


def p_bytes(b: bytes) -> bytes:
    return (b"C" + bytes((len(b),)) if len(b) < 256 else b"B" + struct.pack("<I", len(b))) + b


def p_int(n: int) -> bytes:
    if 0 <= n < 256:
        return b"K" + bytes((n,))
    if 0 <= n < 65536:
        return b"M" + struct.pack("<H", n)
    if -(2**31) <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return (b"\x8a" + bytes((len(raw),)) if len(raw) < 256 else b"\x8b" + struct.pack("<i", len(raw))) + raw


def p_global(module: str, name: str, stack: bool = True) -> bytes:
    if stack:
        return p_str(module) + p_str(name) + b"\x93"
    return b"c" + module.encode("utf-8", "surrogatepass") + b"\n" + name.encode("utf-8", "surrogatepass") + b"\n"


def p_tuple(items) -> bytes:
    items = list(items)
    return b"".join(items) + {0: b")", 1: b"\x85", 2: b"\x86", 3: b"\x87"}[len(items)] if len(items) <= 3 \
        else b"(" + b"".join(items) + b"t"


def p_call(func: bytes, args, form: str = "reduce") -> bytes:
    if form == "obj":
        return b"(" + func + b"".join(args) + b"o"
    if form == "newobj":
        return func + p_tuple(args) + b"\x81"
    if form == "newobj_ex":
        return func + p_tuple(args) + b"}\x92"
    return func + p_tuple(args) + b"R"


ALLOWED = [("numpy", "dtype"), ("numpy._core.numeric", "_frombuffer"), ("numpy._core.multiarray", "scalar"),
           ("builtins", "complex")]
# Names a payload might ask for: anything here that resolves is a failure. None of them is ever called: a call
# goes to CANARY's function instead, which only records that it ran.
FORBIDDEN = [
    ("os", "system"), ("posix", "system"), ("nt", "system"), ("builtins", "eval"), ("builtins", "exec"),
    ("builtins", "getattr"), ("builtins", "__import__"), ("builtins", "open"), ("builtins", "bytes"),
    ("builtins", "bytearray"), ("builtins", "list"), ("builtins", "dict"), ("builtins", "set"), ("builtins", "int"),
    ("builtins", "str"), ("builtins", "tuple"), ("builtins", "frozenset"), ("builtins", "type"),
    ("builtins", "object"), ("subprocess", "Popen"), ("subprocess", "call"), ("numpy", "load"),
    ("numpy", "ndarray"), ("numpy", "frombuffer"), ("numpy", "array"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy.core.numeric", "_frombuffer"), ("copyreg", "_reconstructor"),
    ("pickle", "loads"), ("io", "open"), ("shutil", "rmtree"), ("nitro.data.codec", "decode"),
    ("nitro.data.codec", "_safe_dtype"), ("numpy", "dtype.__class__"), ("numpy ", "dtype"), ("numpy", "dtype\x00"),
    ("builtins", "complex.__new__"), ("Builtins", "complex"), ("__main__", "x"), ("", ""),
]
_DECODE = codec.decode  # check() calls codec.decode, which a test may replace
CANARY_GLOBAL = ("nitro.tools.codec_fuzz", "canary")
CANARY: list = []


def canary(*args, **kwargs):
    """What a hostile pickle calls, by name: it records that it ran (a failure) and does nothing else."""
    CANARY.append(len(args))


# --- cases ------------------------------------------------------------------------------------------


_NOTHING = object()


class Case:
    """Bytes to decode. signed: validly signed with KEY (the decoder may decode them); expect: what a valid
    envelope must decode to. Not a dataclass: Hypothesis would print all the bytes of a failing one."""

    __slots__ = ("category", "data", "signed", "expect")

    def __init__(self, category: str, data: bytes, signed: bool, expect: object = _NOTHING):
        self.category, self.data, self.signed, self.expect = category, data, signed, expect

    def __repr__(self) -> str:
        return (f"Case({self.category!r}, {len(self.data)} bytes, signed={self.signed}, "
                f"data[:128]={self.data[:128].hex()})")


def _hostile(category: str, pickled: bytes, buffers=(), compress: bool = False, **table) -> Case:
    inner = body(pickled, buffers, **table)
    return Case(f"hostile:{category}", sign(zlib.compress(inner, 1) if compress else inner, flags=int(compress)),
                True)


# valid objects: what nitro sends, and more of the same kinds
PLAIN_DTYPES = ["<f4", "<f8", ">f8", "<i8", ">i4", "|u1", "|i1", "|b1", "<c8", "<c16", "<f2", "|S3", "<U2", ">U1",
                "<M8[s]", "<m8[ms]", "<M8[D]"]


@st.composite
def _arrays(draw):
    dtype = np.dtype(draw(st.sampled_from(PLAIN_DTYPES)))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
    arr = draw(hnp.arrays(dtype, shape))
    layout = draw(st.sampled_from(["c", "f", "strided", "permuted", "readonly"]))
    if layout == "f":
        arr = np.asfortranarray(arr)
    elif layout == "strided" and arr.ndim:
        arr = arr[::2]
    elif layout == "permuted" and arr.ndim >= 2:
        arr = arr.transpose(*range(arr.ndim - 1, -1, -1)) if arr.ndim == 2 else arr.transpose(1, 0, 2)
    elif layout == "readonly":
        arr.flags.writeable = False
    return arr


@st.composite
def _numpy_scalars(draw):
    dtype = np.dtype(draw(st.sampled_from(PLAIN_DTYPES)))
    return draw(hnp.arrays(dtype, ())).reshape(1)[0]


_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(2**200), 2**200), st.floats(), st.complex_numbers(),
    st.text(max_size=20), st.binary(max_size=40), st.binary(max_size=20).map(bytearray), _arrays(), _numpy_scalars(),
)
_HASHABLE = st.one_of(st.integers(), st.text(max_size=8), st.binary(max_size=8))


def valid_objects():
    return st.recursive(
        _LEAVES,
        lambda children: st.one_of(
            st.lists(children, max_size=4), st.lists(children, max_size=4).map(tuple),
            st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), children, max_size=4),
            st.sets(_HASHABLE, max_size=4), st.frozensets(_HASHABLE, max_size=4),
        ),
        max_leaves=10,
    )


@st.composite
def _valid_envelopes(draw) -> tuple[object, bytes]:
    obj = draw(valid_objects())
    return obj, codec.encode(obj, KEY, compress=draw(st.booleans()))


@st.composite
def valid(draw) -> Case:
    obj, blob = draw(_valid_envelopes())
    return Case("valid", blob, True, obj)


_FIELD_VALUES = st.one_of(st.sampled_from([0, 1, 2, 7, 8, 16, 255, 256, 2**31, 2**32 - 1, 2**63, 2**64 - 1, LIMIT]),
                          st.integers(0, 2**64 - 1))


@st.composite
def _mutate(draw, data: bytes, fields: dict[str, tuple[int, str]]) -> bytes:
    """1-4 byte-wise mutations of `data`; `fields`: name -> (offset, struct format) of its header/table fields."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "extend", "duplicate", "zero",
                                   "field"]))
        pos = draw(st.integers(0, 1 << 20)) % (len(out) + 1)
        if op == "flip" and pos < len(out):
            out[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and pos < len(out):
            out[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del out[pos : pos + draw(st.integers(1, 64))]
        elif op == "truncate":
            del out[pos:]
        elif op == "extend":
            out += draw(st.one_of(st.binary(min_size=1, max_size=64), st.just(bytes(out[pos : pos + 256]))))
        elif op == "duplicate":
            out[pos:pos] = out[pos : pos + draw(st.integers(1, 256))]
        elif op == "zero":
            n = draw(st.integers(1, 64))
            out[pos : pos + n] = bytes(len(out[pos : pos + n]))
        elif op == "field" and fields:
            offset, fmt = fields[draw(st.sampled_from(sorted(fields)))]
            size = struct.calcsize(fmt)
            if offset + size <= len(out):
                if fmt == "4s":
                    value = draw(st.sampled_from([b"NTR1", b"NTR2", b"NTR4", b"NTR\x00", b"ntr3", b"XXXX"]))
                    out[offset : offset + 4] = value
                else:
                    value = draw(_FIELD_VALUES) % (1 << (8 * size))
                    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def _table_fields(inner: bytes, base: int) -> dict[str, tuple[int, str]]:
    fields = {"n_buffers": (base, "<I"), "pickle_len": (base + 4, "<Q")}
    if len(inner) >= 12:
        n = struct.unpack_from("<I", inner)[0]
        for i in range(min(n, 4)):
            fields[f"buffer_len[{i}]"] = (base + 12 + 8 * i, "<Q")
    return fields


@st.composite
def mutated(draw) -> Case:
    """A valid envelope, mutated anywhere (not signed again): never decodes unless the mutations undo each other."""
    obj, blob = draw(_valid_envelopes())
    fields = {"magic": (0, "4s"), "flags": (4, "<B"), "nonce": (5, "<Q"), "tag": (len(blob) - TAG, "<Q"),
              **_table_fields(body_of(blob), BODY)}
    data = draw(_mutate(blob, fields))
    return Case("mutated", data, data == blob, obj if data == blob else _NOTHING)


@st.composite
def resigned(draw) -> Case:
    """A valid envelope's body, mutated, then signed with the right key: what a key holder could send."""
    _, blob = draw(_valid_envelopes())
    inner, flags = body_of(blob), blob[HEADER - 1]
    if flags & 1 and draw(st.booleans()):  # mutate what the compressed body inflates to
        inner = zlib.compress(draw(_mutate(zlib.decompress(inner), _table_fields(zlib.decompress(inner), 0))), 1)
    else:
        inner = draw(_mutate(inner, _table_fields(inner, 0) if not flags & 1 else {}))
    if draw(st.integers(0, 9)) == 0:
        flags = draw(st.integers(0, 255))
    return Case("resigned", sign(inner, flags=flags), True)


@st.composite
def random_bytes(draw) -> Case:
    prefix = draw(st.sampled_from([b"", b"", MAGIC, MAGIC + b"\x00", MAGIC + b"\x01", MAGIC + bytes(13), b"NTR1",
                                   b"NTR2", b"NTR9", b"\x80\x05"]))
    rest = draw(st.one_of(st.binary(max_size=256), st.integers(LIMIT - 64, LIMIT + 64).map(bytes)))
    return Case("random", prefix + rest, False)


@st.composite
def wrong_key(draw) -> Case:
    _, blob = draw(_valid_envelopes())
    other = sign(body_of(blob), OTHER_KEY, flags=blob[HEADER - 1], nonce=blob[HEADER:BODY])
    return Case("wrong_key", other, False)


# hostile pickles, signed with the right key

DTYPE_SPECS = ["<f4", ">f8", "|b1", "<i8", "|u1", "<c16", "|S8", "<U2", "<M8[s]", "<m8[ms]", "f8", "O", "|O", "O8",
               "V8", "|V16", "(2,)f8", "f8,i4", "S0", "U0", "S4000", "U100000", "U2000000000", "S9223372036854775807",
               "M8[as]", "M8[1000000000000000000as]", "<f2", "<f16", "T", "?", "b", "e", "g", "G", "bogus", "",
               "i4\x00", "[('a','f8')]", "<f4 ", "M8", "m8[Y]", "U", "S"]
_INTS = st.one_of(st.sampled_from([0, 1, -1, 2, 3, 255, 256, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64,
                                   10**9, LIMIT, LIMIT + 1, -(2**63), 10**100]), st.integers())
_TEXT = st.one_of(st.sampled_from(DTYPE_SPECS + ["C", "F", "K", "A", "Z", "1+2j", "nan", "inf", "1e999", "0x10"]),
                  st.text(max_size=12))


@st.composite
def _values(draw, depth: int = 0) -> tuple[bytes, list[bytes]]:
    """(pickle bytes that push one hostile value, the out-of-band buffers they take)."""
    kind = draw(st.integers(0, 10 if depth < 2 else 7))
    if kind == 0:
        return p_int(draw(_INTS)), []
    if kind == 1:
        return p_str(draw(_TEXT)), []
    if kind == 2:
        data = draw(st.one_of(st.binary(max_size=64), st.sampled_from([4000, 8, 16, 65536]).map(bytes)))
        return (b"\x96" + struct.pack("<Q", len(data)) + data if draw(st.booleans()) else p_bytes(data)), []
    if kind == 3:
        buf = draw(st.one_of(st.binary(max_size=64), st.sampled_from([16, 4000]).map(bytes)))
        return b"\x97" + (b"\x98" if draw(st.booleans()) else b""), [buf]
    if kind == 4:
        return draw(st.sampled_from([b"N", b"\x88", b"\x89", b")", b"]", b"}", b"\x8f"])), []
    if kind == 5:
        return b"G" + struct.pack(">d", draw(st.floats())), []
    if kind == 6:  # a shape
        return p_tuple(p_int(n) for n in draw(st.lists(_INTS, max_size=5))), []
    if kind == 7:
        return p_global(*draw(st.sampled_from(ALLOWED))), []
    parts = draw(st.lists(_values(depth + 1), max_size=4))
    items, buffers = [p for p, _ in parts], [b for _, bs in parts for b in bs]
    if kind == 8:
        return p_tuple(items), buffers
    if kind == 9:
        return b"](" + b"".join(items) + b"e", buffers
    func = p_global(*draw(st.sampled_from(ALLOWED)), stack=draw(st.booleans()))
    return p_call(func, items, draw(st.sampled_from(["reduce", "reduce", "obj", "newobj", "newobj_ex"]))), buffers


@st.composite
def hostile_globals(draw) -> Case:
    module, name = draw(st.one_of(st.sampled_from(FORBIDDEN), st.tuples(st.from_regex(r"[a-z_.]{1,12}", fullmatch=True),
                                                                       st.from_regex(r"[a-z_]{1,12}", fullmatch=True))))
    form = draw(st.sampled_from(["stack", "text", "inst"]))
    if form == "inst":  # INST: the name, then a call of it
        pickled = b"(" + f"i{module}\n{name}\n".encode("utf-8", "surrogatepass")
    else:
        pickled = p_global(module, name, stack=form == "stack")
    if draw(st.booleans()):  # the canary is the only name ever called
        parts = draw(st.lists(_values(2), max_size=3))
        pickled = p_call(p_global(*CANARY_GLOBAL, stack=draw(st.booleans())), [p for p, _ in parts],
                         draw(st.sampled_from(["reduce", "obj", "newobj"])))
        return _hostile("canary", PROTO + pickled + b".", [b for _, bs in parts for b in bs])
    return _hostile("global", PROTO + pickled + b".", compress=draw(st.booleans()))


@st.composite
def hostile_calls(draw) -> Case:
    func = draw(st.sampled_from(ALLOWED))
    parts = draw(st.lists(_values(), max_size=6))
    form = draw(st.sampled_from(["reduce", "reduce", "reduce", "obj", "newobj", "newobj_ex"]))
    pickled = p_call(p_global(*func, stack=draw(st.booleans())), [p for p, _ in parts], form)
    return _hostile("call", PROTO + pickled + b".", [b for _, bs in parts for b in bs], compress=draw(st.booleans()))


def _p_dtype(spec: str, numpy_form: bool = False) -> bytes:
    args = [p_str(spec)] + ([b"\x89", b"\x88"] if numpy_form else [])  # numpy's: dtype(spec, False, True)
    return p_call(p_global("numpy", "dtype"), args)


@st.composite
def _dtype_states(draw) -> bytes:
    """numpy's dtype state (version, byte order, subarray, names, fields, itemsize, alignment, flags[, metadata]),
    with the values that made one dtype another: a subarray, fields past the item, the object flag."""
    version = draw(st.sampled_from([3, 4]))
    inner = _p_dtype(draw(st.sampled_from(["<f8", "|u1", "|S8"])), True)
    subarray = draw(st.sampled_from([b"N", inner + p_tuple([p_int(10**6)])]))
    offset = p_int(draw(st.sampled_from([0, 8, 10**8, 2**62])))
    names, fields = draw(st.sampled_from([(b"N", b"N"), (p_tuple([p_str("a")]), b"}" + p_str("a") + p_tuple(
        [inner, offset]) + b"s")]))
    items = [p_int(version), p_str(draw(st.sampled_from(["<", ">", "|", "="]))), subarray, names, fields,
             p_int(draw(st.sampled_from([-1, 0, 8, 10**6]))), p_int(draw(st.sampled_from([-1, 1, 8]))),
             p_int(draw(st.sampled_from([0, 1, 3, 16, 63, -1])))]
    if version == 4:
        items.append(draw(st.sampled_from([b"N", p_tuple([b"N", p_tuple([p_bytes(b"s"), b"K\x01", b"K\x01",
                                                                        b"K\x01"])]), p_tuple([b"}"])])))
    return p_tuple(items)


@st.composite
def hostile_build(draw) -> Case:
    """An object, then BUILD with a state: what changed a numpy dtype into one with fields past its item, an array
    into one that holds objects, or crashed the process (a datetime dtype given a version-3 state)."""
    target, t_buffers = draw(st.one_of(
        st.tuples(st.sampled_from(["<f8", "|S8", "<U2", "M8", "<M8[s]", "m8"]).map(lambda s: _p_dtype(s, True)),
                  st.just([])),
        _values(1)))
    if draw(st.booleans()):
        state, s_buffers = draw(_dtype_states()), []
    else:
        state_items = draw(st.lists(_values(2), max_size=9))
        state = p_tuple([p for p, _ in state_items]) if draw(st.booleans()) else \
            b"}(" + b"".join(p_str(f"k{i}") + p for i, (p, _) in enumerate(state_items)) + b"u"
        s_buffers = [b for _, bs in state_items for b in bs]
    return _hostile("build", PROTO + target + state + b"b.", t_buffers + s_buffers)


_COUNTED = [(b"B", "<I"), (b"\x8e", "<Q"), (b"\x96", "<Q"), (b"X", "<I"), (b"\x8d", "<Q"), (b"T", "<I"),
            (b"\x8b", "<I"), (b"\x95", "<Q"), (b"C", "<B"), (b"\x8c", "<B"), (b"U", "<B"), (b"\x8a", "<B")]


@st.composite
def hostile_lengths(draw) -> Case:
    """A length declared past the pickle's end: CPython's unpickler allocates it before reading."""
    op, fmt = draw(st.sampled_from(_COUNTED))
    width = struct.calcsize(fmt)
    declared = draw(st.one_of(st.sampled_from([2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1, LIMIT + 1,
                                               10**8, 10**6]), st.integers(0, 2**64 - 1))) % (1 << (8 * width))
    data = draw(st.binary(max_size=64))
    prefix = draw(st.sampled_from([b"", b"](", b"N"]))
    return _hostile("lengths", PROTO + prefix + op + struct.pack(fmt, declared) + data + b".")


@st.composite
def hostile_memo(draw) -> Case:
    """Memo indices: PUT-family ones resize CPython's memo to twice the index."""
    index = draw(st.one_of(st.sampled_from([255, 256, 10**6, 10**7, 2**31 - 1, 2**32 - 1]), st.integers(0, 2**32 - 1)))
    pushes = b"N" * draw(st.integers(1, 64))
    op = draw(st.sampled_from(["put", "binput", "long_binput", "get", "binget", "long_binget"]))
    arg = {"put": b"p%d\n" % index, "binput": b"q" + bytes((index % 256,)), "long_binput": b"r" + struct.pack("<I", index),
           "get": b"g%d\n" % index, "binget": b"h" + bytes((index % 256,)), "long_binget": b"j" + struct.pack("<I", index)}
    return _hostile("memo", PROTO + pushes + arg[op] + b".")


_NESTING = {"list": (b"]", b"a"), "tuple": (b"", b"\x85"), "dict": (b"}K\x01", b"s"), "mark_list": (b"(", b"l"),
            "mark_tuple": (b"(", b"t"), "frozenset": (b"(", b"\x91"), "set": (b"\x8f(", b"\x90")}


@st.composite
def hostile_nesting(draw) -> Case:
    """Containers nested `depth` deep, each level holding the one inside it."""
    opening, closing = _NESTING[draw(st.sampled_from(sorted(_NESTING)))]
    depth = draw(st.one_of(st.integers(1, 100), st.integers(100, 120_000)))
    return _hostile("nesting", PROTO + opening * depth + b"N" + closing * depth + b".")


_AMPLIFIERS = [b"\x8f", b"}", b"]", b"(\x91", b")", b"N", b"\x94", b"h\x00", b"2", b"(", b"\x8c\x00", b"C\x00",
               b"\x96" + bytes(8), b"K\x05", b"J\x01\x02\x03\x04", b"G" + bytes(8), b"\x8c\x04\xf0\x9f\x98\x80",
               b"\x8a\x08" + b"\xff" * 8]


@st.composite
def hostile_amplifiers(draw) -> Case:
    """One-byte opcodes that build objects of up to 216 bytes, many times: bounded by the limit."""
    pattern = draw(st.sampled_from(_AMPLIFIERS))
    count = draw(st.one_of(st.integers(1, 2000), st.integers(1, 2 * LIMIT // len(pattern))))
    wrapper = draw(st.sampled_from(["list", "appends", "tuple", "stack"]))
    core = pattern * count
    prefix = b"N\x94" if pattern == b"h\x00" else b"N" if pattern == b"2" else b""
    pickled = {"list": b"(" + core + b"l", "appends": b"](" + core + b"e", "tuple": b"(" + core + b"t",
               "stack": core + b"N"}[wrapper]
    return _hostile("amplifier", PROTO + prefix + pickled + b".")


@st.composite
def hostile_buffers(draw) -> Case:
    """Out-of-band buffers in numbers: one memoryview each, so the table may not list more than the pickle takes."""
    n = draw(st.integers(0, 40_000))
    taken = draw(st.sampled_from([n, 0, max(n - 1, 0), n + 1]))
    pickled = PROTO + b"(" + b"\x97" * taken + b"l."
    return _hostile("buffers", pickled, [b""] * n)


@st.composite
def hostile_copies(draw) -> Case:
    """One large argument, taken by many calls: each may copy it (numpy.scalar does)."""
    size = draw(st.sampled_from([16, 1000, 4000, 60_000]))
    calls = draw(st.integers(1, 4000))
    spec = draw(st.sampled_from([f"|S{size}", f"<U{size // 4}", f"|S{size // 2}", "<f8", "<c16"]))
    func = draw(st.sampled_from(["scalar", "frombuffer", "complex"]))
    data = p_bytes(bytes(size)) if func != "complex" else p_str("1" * size)
    head = PROTO + p_global(*ALLOWED[0]) + b"\x94" + p_str(spec) + b"\x85R\x94" + data + b"\x94"  # memo 0, 1, 2
    g = {"scalar": ALLOWED[2], "frombuffer": ALLOWED[1], "complex": ALLOWED[3]}[func]
    head += p_global(*g) + b"\x94"  # memo 3
    one = {"scalar": b"h\x03h\x01h\x02\x86R", "frombuffer": b"h\x03(h\x02h\x01J\xff\xff\xff\xff\x85\x8c\x01CtR",
           "complex": b"h\x03h\x02\x85R"}[func]
    return _hostile("copies", head + b"(" + one * calls + b"l.")


_SOUP_FIXED = [b"N", b"\x88", b"\x89", b"]", b"a", b"e", b"l", b")", b"t", b"\x85", b"\x86", b"\x87", b"}", b"d",
               b"s", b"u", b"\x8f", b"\x90", b"\x91", b"0", b"2", b"(", b"1", b"\x94", b"\x93", b"R", b"b", b"o",
               b"\x81", b"\x92", b"\x97", b"\x98", b"Q", b".", b"\xff", b"\x00", b"\x99"]


@st.composite
def _soup_op(draw) -> bytes:
    kind = draw(st.integers(0, 6))
    if kind <= 2:
        return draw(st.sampled_from(_SOUP_FIXED))
    if kind == 3:
        return draw(st.sampled_from([b"K", b"h", b"q", b"\x80", b"\x82", b"U", b"C", b"\x8c", b"\x8a"])) + \
            draw(st.binary(min_size=1, max_size=1))
    if kind == 4:
        return draw(st.sampled_from([b"M", b"J", b"j", b"r", b"\x83", b"\x84", b"G", b"B", b"X", b"T", b"\x8b",
                                     b"\x8e", b"\x96", b"\x8d", b"\x95"])) + draw(st.binary(min_size=2, max_size=9))
    if kind == 5:
        return draw(st.sampled_from([b"I", b"L", b"F", b"S", b"V", b"g", b"p", b"P", b"c", b"i"])) + \
            draw(st.binary(max_size=12)) + b"\n" + draw(st.sampled_from([b"", b"x\n"]))
    return draw(_values(1))[0]


@st.composite
def hostile_soup(draw) -> Case:
    ops = draw(st.lists(_soup_op(), min_size=1, max_size=40))
    buffers = draw(st.lists(st.binary(max_size=32), max_size=4))
    return _hostile("soup", draw(st.sampled_from([PROTO, b"", b"\x80\x02"])) + b"".join(ops) +
                    draw(st.sampled_from([b".", b""])), buffers)


@lru_cache(maxsize=16)
def _zeros_compressed(size: int) -> bytes:
    c = zlib.compressobj(9)
    parts = [c.compress(bytes(1 << 16)) for _ in range(size >> 16)]
    return b"".join(parts) + c.compress(bytes(size & 0xFFFF)) + c.flush()


@st.composite
def hostile_bombs(draw) -> Case:
    """zlib bodies that inflate to about the limit, or far past it."""
    size = draw(st.sampled_from([LIMIT - 1, LIMIT, LIMIT + 1, LIMIT - 4096, 4 * LIMIT, 64 * LIMIT]))
    kind = draw(st.sampled_from(["zeros", "pickle", "trailing"]))
    if kind == "zeros":
        inner = _zeros_compressed(size)
    else:  # a valid pickle of one long bytes object, inflating to about `size`
        n = max(size - 64, 0)
        inner = zlib.compress(body(PROTO + b"B" + struct.pack("<I", n) + bytes(n) + b"."), 1)
        if kind == "trailing":
            inner += draw(st.binary(min_size=1, max_size=16))
    return Case("hostile:bomb", sign(inner, flags=1), True)


@st.composite
def hostile_tables(draw) -> Case:
    """A valid pickle with a buffer table that does not match it."""
    parts = draw(st.lists(_values(2), max_size=3))
    pickled = PROTO + p_tuple([p for p, _ in parts]) + b"."
    buffers = [b for _, bs in parts for b in bs]
    table = draw(st.fixed_dictionaries({}, optional={
        "n": st.one_of(st.integers(0, 64), _FIELD_VALUES.map(lambda v: v % 2**32)),
        "pickle_len": st.one_of(st.integers(0, len(pickled) + 64), _FIELD_VALUES),
        "lengths": st.lists(st.one_of(st.integers(0, 64), _FIELD_VALUES), max_size=6)}))
    return _hostile("table", pickled, buffers, **table)


HOSTILE = [hostile_globals, hostile_calls, hostile_build, hostile_lengths, hostile_memo, hostile_nesting,
           hostile_amplifiers, hostile_buffers, hostile_copies, hostile_soup, hostile_bombs, hostile_tables]


def cases():
    """Every kind of case: about a third unsigned or valid, two thirds signed hostile payloads."""
    return st.one_of(valid(), mutated(), resigned(), random_bytes(), wrong_key(), *(h() for h in HOSTILE))


def unsigned_cases():
    return st.one_of(mutated(), random_bytes(), wrong_key())


def hostile_cases():
    return st.one_of(resigned(), *(h() for h in HOSTILE))


# --- the properties ------------------------------------------------------------------------------------


@dataclass
class Outcome:
    category: str
    result: str  # "decoded", a PayloadError reason, or the name of a foreign exception
    peak: int  # bytes, tracemalloc's peak during the decode above what was traced before it
    bound: int
    failures: list[str] = field(default_factory=list)


def alloc_bound(data: bytes) -> int:
    """The decode's peak allocation may reach its private copy of the body (the envelope's size, or the limit
    when the body is compressed) plus the objects' budget (the limit), plus ALLOC_SLACK."""
    compressed = data[:4] == MAGIC and len(data) > 4 and data[4] & 1
    return (LIMIT if compressed else min(len(data), LIMIT)) + LIMIT + ALLOC_SLACK


def check(case: Case) -> Outcome:
    """Decode `case` under tracemalloc and judge it by properties (a)-(e)."""
    CANARY.clear()
    tracing = tracemalloc.is_tracing()  # else traced for the decode alone (tracing the generator is slow)
    if tracing:
        tracemalloc.reset_peak()
    else:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    obj, error, foreign = None, None, None
    try:
        obj = codec.decode(case.data, KEY, max_size=LIMIT)
    except PayloadError as exc:
        error = exc
    except Exception as exc:  # (b): anything else is a failure
        foreign = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1] - before
        if not tracing:
            tracemalloc.stop()
    bound = alloc_bound(case.data)
    result = "decoded" if error is None and foreign is None else \
        error.reason if foreign is None else type(foreign).__name__
    out = Outcome(case.category, result, peak, bound)
    fail = out.failures.append
    if foreign is not None:
        fail(f"(b) raised {type(foreign).__name__}, not a PayloadError: {str(foreign)[:200]}")
    if not case.signed:
        if error is None and foreign is None:
            fail("(a) decoded a payload that is not validly signed")
        elif error is not None:
            if error.reason not in PRE_TAG_REASONS:
                fail(f"(a) an unsigned payload reached the unpickler ({error.reason}: {error})")
            elif (case.data[:4] == MAGIC and BODY + TAG <= len(case.data) <= LIMIT
                  and error.reason != "bad_signature"):
                fail(f"(a) an NTR3 payload within the limit was refused as {error.reason}, not by its tag: {error}")
    if peak > bound:
        fail(f"(c) allocated {peak} bytes during the decode, bound {bound}")
    if CANARY:
        fail("(d) called a function the payload named")
    if error is None and foreign is None:
        impure = _impure(obj)
        if impure:
            fail(f"(d) decoded {impure}")
    if case.expect is not _NOTHING:
        if error is not None:
            fail(f"(e) refused a valid envelope: {error.reason}: {error}")
        elif foreign is None and not same(case.expect, obj):
            fail("(e) decoded something else than what was encoded")
    return out


_PLAIN_KINDS = frozenset("biufcSUMm")
_SCALARS = (type(None), bool, int, float, complex, str, bytes, bytearray, memoryview)
_CONTAINERS = (list, tuple, set, frozenset)


def _plain_dtype(dtype) -> bool:
    return (isinstance(dtype, np.dtype) and dtype.kind in _PLAIN_KINDS and not dtype.hasobject
            and dtype.names is None and dtype.subdtype is None)


def _impure(obj) -> str | None:
    """What in a decoded object is not plain data (None: all of it is)."""
    todo, seen = [obj], set()
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        t = type(x)
        if t in _SCALARS:
            continue
        if t in _CONTAINERS:
            todo.extend(x)
        elif t is dict:
            todo.extend(x.keys())
            todo.extend(x.values())
        elif t is np.ndarray or isinstance(x, np.generic):
            if not _plain_dtype(x.dtype):
                return f"a numpy {t.__name__} of dtype {x.dtype!r} (hasobject={x.dtype.hasobject})"
        elif isinstance(x, np.dtype):
            if not _plain_dtype(x):
                return f"a dtype {x!r}"
        elif not any(x is allowed for allowed in _allowed_objects()):
            return f"a {t.__module__}.{t.__qualname__}"
    return None


@lru_cache(maxsize=1)
def _allowed_objects() -> tuple:
    """What the allowed globals resolve to. A pickle may return one itself: harmless, as all they make is plain
    data (a dtype, an array over a buffer, a numpy scalar, a complex number)."""
    found = []
    for module, name in ALLOWED:
        try:
            found.append(_DECODE(sign(body(PROTO + p_global(module, name) + b".")), KEY))
        except PayloadError:
            pass
    return tuple(found)


def same(a, b) -> bool:
    """Equal, with the same types; arrays with the same dtype and shape; NaN equals NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (np.ndarray, np.generic)):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fcmM"))
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, complex):
        return same(a.real, b.real) and same(a.imag, b.imag)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b
