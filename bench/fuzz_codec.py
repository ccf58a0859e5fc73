"""Fuzz the envelope decoder and its restricted unpickler: >= 10,000 generated and mutated envelopes.

Every case comes from nitro.tools.codec_fuzz (Hypothesis strategies, shared with tests/test_codec_fuzz.py):
valid envelopes, the same mutated byte-wise (not signed again), random bytes, envelopes under another key,
and envelopes signed with the right key carrying hostile bodies and pickles (forbidden globals, calls of the
allowed ones with hostile arguments, BUILD, lengths past the end, memo indices, deep nesting, amplifying
opcodes, repeated copies, random opcodes, decompression bombs, inconsistent buffer tables). Each goes through
nitro.data.codec.decode(data, key, max_size=LIMIT) under tracemalloc, and codec_fuzz.check judges it: (a)
nothing that is not validly signed decodes or gets past the tag check, (b) nothing raises but a PayloadError,
(c) the peak allocation of one decode stays within 2 x the limit + 64 KiB (the body's copy and the objects),
(d) nothing decodes but plain data and nothing the payload names is called, (e) valid envelopes decode to
what was encoded. The categories get equal shares of --examples.

Figure: the largest peak allocation of one decode over all cases. Reference, measured in the same run: the
peak of decoding the valid envelopes that cost the decoder most at the same limit (an in-band bytes object,
an array, each filling the limit, plain and compressed). ratio = figure / reference: above 1, some hostile
input costs more than any valid one may; ratio_to_limit = figure / the limit. Target: no failure, and the
figure within the bound. The last stdout line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import tracemalloc
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import seed as hypothesis_seed  # noqa: E402

from nitro.data import codec  # noqa: E402
from nitro.tools import codec_fuzz as fuzz  # noqa: E402

PROPERTIES = {"(a)": "decoded_unsigned", "(b)": "foreign_exceptions", "(c)": "over_allocations",
              "(d)": "impure_or_executed", "(e)": "valid_refused"}


def categories() -> dict:
    return {"valid": fuzz.valid, "mutated": fuzz.mutated, "resigned": fuzz.resigned, "random": fuzz.random_bytes,
            "wrong_key": fuzz.wrong_key, **{h.__name__.replace("hostile_", "hostile:"): h for h in fuzz.HOSTILE}}


def reference_alloc() -> int:
    """The largest peak of decoding a valid envelope at the limit: what the limit lets a sender cost."""
    room = fuzz.LIMIT - (24 << 10)  # the envelope, and the unpickler's own share of the objects' budget
    peaks = []
    for obj in (bytes(room), np.zeros(room, np.uint8), [bytes(room // 2), np.zeros(room // 4, np.uint8)]):
        for compress in (False, True):
            blob = codec.encode(obj, fuzz.KEY, compress=compress)
            tracemalloc.start()
            codec.decode(blob, fuzz.KEY, max_size=fuzz.LIMIT)
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
    return max(peaks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", type=int, default=10_000, help="cases in all, shared equally by the categories")
    ap.add_argument("--seed", type=int, default=None, help="Hypothesis seed (default: derandomized, the same cases)")
    ap.add_argument("--show", type=int, default=10, help="failing cases to print")
    args = ap.parse_args()

    fuzz.check_signer()
    reference = reference_alloc()
    cats = categories()
    per_category = math.ceil(args.examples / len(cats))
    results: dict[str, Counter] = defaultdict(Counter)
    peaks: dict[str, int] = defaultdict(int)
    failures: list[tuple[str, list[str], str]] = []
    decode_s = 0.0
    t0 = time.perf_counter()
    for name, strategy in cats.items():
        @settings(max_examples=per_category, deadline=None, database=None, derandomize=args.seed is None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=strategy())
        def one(case):
            nonlocal decode_s
            t = time.perf_counter()
            outcome = fuzz.check(case)
            decode_s += time.perf_counter() - t
            results[name][outcome.result] += 1
            peaks[name] = max(peaks[name], outcome.peak)
            if outcome.failures:
                failures.append((name, outcome.failures, repr(case)))

        if args.seed is not None:
            one = hypothesis_seed(args.seed)(one)
        one()
    wall = time.perf_counter() - t0

    examples = sum(sum(c.values()) for c in results.values())
    failed = Counter(PROPERTIES[f[:3]] for _, fs, _ in failures for f in fs)
    max_alloc = max(peaks.values())
    bound = 2 * fuzz.LIMIT + fuzz.ALLOC_SLACK
    print(f"{examples} cases ({per_category} per category asked), size limit {fuzz.LIMIT} bytes, "
          f"allocation bound {bound} bytes")
    print(f"{'category':20s} {'cases':>6s} {'max alloc':>10s}  results")
    for name in cats:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(results[name].items(), key=lambda kv: -kv[1]))
        print(f"{name:20s} {sum(results[name].values()):6d} {peaks[name]:10d}  {counts}")
    print(f"failures: {len(failures)} cases ({', '.join(f'{k} {v}' for k, v in failed.items()) or 'none'})")
    for name, fs, case in failures[: args.show]:
        print(f"  {name}: {'; '.join(fs)}\n    {case[:400]}")
    print(f"{examples / wall:.0f} cases/s with generation, {examples / decode_s:.0f} decodes/s under tracemalloc")
    print(f"max allocation of one decode {max_alloc} bytes; valid envelopes at the limit (reference) {reference} "
          f"bytes; ratio {max_alloc / reference:.3f}; {max_alloc / fuzz.LIMIT:.3f} x the limit")
    print(json.dumps({
        "benchmark": "fuzz_codec",
        "examples": examples,
        "seed": args.seed,
        "failures": len(failures),
        **{key: failed.get(key, 0) for key in PROPERTIES.values()},
        "max_alloc_bytes": max_alloc,
        "reference_valid_alloc_bytes": reference,
        "ratio": round(max_alloc / reference, 4),
        "size_limit_bytes": fuzz.LIMIT,
        "ratio_to_limit": round(max_alloc / fuzz.LIMIT, 4),
        "alloc_bound_bytes": bound,
        "examples_per_s": round(examples / wall, 1),
        "categories": {name: sum(results[name].values()) for name in cats},
        "meets_target": not failures and max_alloc <= bound,
    }))


if __name__ == "__main__":
    main()
