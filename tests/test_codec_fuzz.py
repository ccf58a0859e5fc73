"""The envelope decoder under a few hundred fuzzed cases: bench/fuzz_codec.py's properties, on the suite's budget.

The cases and the properties are nitro.tools.codec_fuzz's (the bench draws >= 10,000 of the same): (a) nothing
that is not validly signed decodes or gets past the tag check, (b) decode raises nothing but a PayloadError,
(c) one decode's peak allocation stays within the body's copy and the objects' budget (each at most the size
limit), (d) nothing but plain data decodes and nothing the payload names is called, (e) valid envelopes decode
to what was encoded. Hypothesis is derandomized: the same cases on every run. The tests at the end check that
`check` itself reports each kind of violation.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from nitro.data import codec
from nitro.tools import codec_fuzz as fuzz
from nitro.tools.codec_fuzz import Case

FUZZ = dict(deadline=None, database=None, derandomize=True, print_blob=False,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                                   HealthCheck.filter_too_much])


def _holds(case: Case) -> None:
    outcome = fuzz.check(case)
    assert not outcome.failures, f"{case!r}: {outcome.failures}"


def test_the_harness_signs_as_the_decoder_reads():
    fuzz.check_signer()  # else every hostile case below would stop at the tag


@pytest.mark.slow
@settings(max_examples=120, **FUZZ)
@given(case=fuzz.unsigned_cases())
def test_unsigned_envelopes_never_decode(case):
    assert not case.signed or case.category == "mutated"  # a mutation may undo itself
    _holds(case)


@pytest.mark.slow
@settings(max_examples=240, **FUZZ)
@given(case=fuzz.hostile_cases())
def test_signed_hostile_envelopes_are_refused_or_plain(case):
    assert case.signed
    _holds(case)


@pytest.mark.slow
@settings(max_examples=60, **FUZZ)
@given(case=fuzz.valid())
def test_valid_envelopes_round_trip(case):
    _holds(case)


def test_the_allocation_bound_covers_valid_envelopes_at_the_limit():
    # What a sender may cost within the limit: the bound is not so tight that valid envelopes break it.
    for compress in (False, True):
        blob = codec.encode([bytes(fuzz.LIMIT // 2), np.zeros(fuzz.LIMIT // 4, np.uint8)], fuzz.KEY, compress=compress)
        outcome = fuzz.check(Case("valid", blob, True))
        assert outcome.result == "decoded" and not outcome.failures, outcome
        assert outcome.peak > fuzz.LIMIT // 2  # and tracemalloc saw the decode


# --- check() reports every kind of violation ------------------------------------------------------


def _unsigned_ntr3() -> Case:
    blob = bytearray(codec.encode({"x": 1}, fuzz.KEY))
    blob[fuzz.HEADER] ^= 1  # the nonce
    return Case("mutated", bytes(blob), False)


@pytest.mark.parametrize("fake, case, expected", [
    (lambda data, key, max_size: {"x": 1}, _unsigned_ntr3(), "(a) decoded a payload that is not validly signed"),
    (lambda data, key, max_size: (_ for _ in ()).throw(codec.DisallowedTypeError("os.system")), _unsigned_ntr3(),
     "(a) an unsigned payload reached the unpickler"),
    (lambda data, key, max_size: (_ for _ in ()).throw(codec.MalformedPayloadError("table")), _unsigned_ntr3(),
     "(a) an NTR3 payload within the limit was refused as malformed"),
    (lambda data, key, max_size: {}[data], _unsigned_ntr3(), "(b) raised KeyError"),
    (lambda data, key, max_size: bytearray(3 * fuzz.LIMIT) and None, Case("resigned", b"x" * 64, True),
     "(c) allocated"),
    (lambda data, key, max_size: [os.system], Case("resigned", b"x" * 64, True), "(d) decoded a "),
    (lambda data, key, max_size: fuzz.canary("touch /tmp/x"), Case("resigned", b"x" * 64, True),
     "(d) called a function the payload named"),
    (lambda data, key, max_size: np.zeros(2, np.dtype("f8")).astype(object), Case("resigned", b"x" * 64, True),
     "(d) decoded a numpy ndarray of dtype dtype('O')"),
    (lambda data, key, max_size: {"x": 2}, Case("valid", b"x" * 64, True, {"x": 1}),
     "(e) decoded something else than what was encoded"),
    (lambda data, key, max_size: (_ for _ in ()).throw(codec.PayloadTooLargeError("big")),
     Case("valid", b"x" * 64, True, {"x": 1}), "(e) refused a valid envelope"),
], ids=["decoded-unsigned", "unsigned-unpickled", "unsigned-parsed", "foreign-exception", "over-allocation",
        "impure-result", "executed", "object-array", "valid-changed", "valid-refused"])
def test_check_reports_each_violation(monkeypatch, fake, case, expected):
    monkeypatch.setattr(codec, "decode", fake)
    failures = fuzz.check(case).failures
    assert any(f.startswith(expected) for f in failures), failures


def test_check_passes_the_real_decoder_on_those_cases():
    # The control for the test above: the same cases, judged against the real decode.
    for case in (_unsigned_ntr3(), Case("resigned", b"x" * 64, True)):
        assert fuzz.check(case).failures == []
