"""Two protocol grids that differ in one setting, scheme against the same scheme, over the same rounds (equal
samples for fixed counts; nitro picks its own in each grid):

    python -m experiments protocol-versus docs/results/grids/protocol-hopper-v5-ppo-tuned-stellaris \\
        docs/results/grids/protocol-hopper-v5-ppo-tuned [--out F.md]

For each scheme both grids hold (e.g. nitro and fixed:8 with the Stellaris learner against the central one),
the final-return IQM of each with its 95% CI, P(A > B), the seed-paired difference A - B and its CI, and the
means of env steps, measured cloud dollars and wall time. The grids must train the same env and algorithm;
every other setting in which they differ is named in the report (that is the comparison). Dollars here are
the measured cloud clock, which moves with the machine's load between days: compare them only for runs made
side by side (the equal-cost comparison's reference pricing does not model learner functions). With
--cut-usd X, every scheme of both grids is also cut at X measured dollars: its final return (the mean of its last
evaluations so far) interpolated in its bill between the evaluations either side of X, as protocol-equal-cost
cuts (a run whose whole bill stays below X keeps its last value and is counted as ending below, however close
to X it came), with P(A > B) at the cut.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np

from experiments.protocol import (
    BOOTSTRAP_REPS,
    Protocol,
    SchemeData,
    _ci,
    collect,
    final_return,
    grid_scheduler,
    iqm_interval,
    paired_difference,
    probability_of_improvement,
    scale_diff,
    title,
)

MUST_MATCH = ("env_id", "algo")  # beyond these, a difference between the grids is what is being compared


def load_grid(out: Path) -> Protocol:
    """The protocol a grid directory records (grid.json: its scale, and the union of its seeds and schemes)."""
    path = Path(out) / "grid.json"
    if not path.is_file():
        raise SystemExit(f"{out}: no grid.json (not a protocol grid directory)")
    saved = json.loads(path.read_text())
    fields = {f.name for f in dataclasses.fields(Protocol)}
    scale = {k: v for k, v in saved.get("scale", {}).items() if k in fields}
    scheduler = grid_scheduler(out) if "minions" in saved.get("schemes", []) else ""
    try:
        return Protocol(name=saved.get("name", Path(out).name), seeds=tuple(saved.get("seeds", ())),
                        schemes=tuple(saved.get("schemes", ())), scheduler=scheduler, **scale)
    except ValueError as e:  # the grid's record, not a flag of this command, is what is wrong
        raise SystemExit(f"{path}: not a grid this code can read ({e})") from None


def differences(a: Protocol, b: Protocol) -> dict[str, tuple]:
    """The scale settings in which the two grids differ: {field: (a's, b's)}; SystemExit if MUST_MATCH differ."""
    diff = {k: (va, vb) for k, (vb, va) in sorted(scale_diff(a, {"scale": b.scale()}).items())}
    bad = [k for k in MUST_MATCH if k in diff]
    if bad:
        raise SystemExit("the grids train different jobs (" + ", ".join(f"{k}: {diff[k][0]} vs {diff[k][1]}"
                         for k in bad) + "); protocol-versus compares one job under two settings")
    return diff


def _mean(xs) -> float:
    return float(np.mean(xs)) if len(xs) else math.nan


def cut_at(curves_usd: list, usd: float, final_evals: int, method: str = "interpolate") -> tuple[list[float], int]:
    """Each run's final return at `usd` measured dollars and how many runs end below it (their whole bill is
    smaller). `interpolate` (as protocol-equal-cost): the final return (mean of the last evaluations so far)
    linear in the bill between the evaluations either side of `usd`; `last-eval`: at the last one inside it."""
    from experiments.equal_cost import final_at

    finals, below = [], 0
    for curve in curves_usd:
        so_far = [final_return([{"return": r} for _, r in curve[: i + 1]], final_evals) for i in range(len(curve))]
        finals.append(final_at([u for u, _ in curve], so_far, usd, method)[0])
        below += bool(curve) and curve[-1][0] < usd
    return finals, below


def cut_table(grids: list[tuple[str, Protocol, dict[str, SchemeData]]], usd: float, reps: int) -> tuple[list[str], dict]:
    lines = [f"At equal measured dollars: every run cut at ${usd:.4f} (measured cloud clock; its return interpolated "
             "between the evaluations either side of the cut)", "",
             "| grid | scheme | runs | final return at the cut, IQM [95% CI] | runs that end below the cut |",
             "|---|---|---|---|---:|"]
    numbers: dict = {}
    for label, proto, data in grids:
        for s, d in data.items():
            if not d.final:
                continue
            finals, below = cut_at(d.curves_usd, usd, proto.final_evals)
            ok = [f for f in finals if math.isfinite(f)]
            ci = iqm_interval({"x": ok}, reps).get("x") if ok else None
            numbers.setdefault(label, {})[s] = {"final": finals, "iqm": ci, "below": below}
            lines.append(f"| {label} | {title(s, proto.i_min, proto.i_max)} | {len(ok)} of {len(finals)} | "
                         f"{_ci(ci, '.0f')} | {below} |")
    if len(grids) == 2:
        (la, _, _), (lb, _, _) = grids
        for s in sorted(set(numbers.get(la, {})) & set(numbers.get(lb, {}))):
            x = [f for f in numbers[la][s]["final"] if math.isfinite(f)]
            y = [f for f in numbers[lb][s]["final"] if math.isfinite(f)]
            if x and y:
                p = probability_of_improvement(x, y, reps)
                numbers[la][s]["p_a_better"] = p
                lines.append(f"| P({la} > {lb}) | {title(s)} | | {p[0]:.2f} [{p[1]:.2f}, {p[2]:.2f}] | |")
    lines += ["", "A run with no evaluation inside the cut is not counted (\"k of n\"). A run ends below the cut when "
              "its whole bill is smaller, however close it came: its return there is a lower bound of what the cut's "
              "dollars would have bought."]
    return lines, numbers


def compare(a_dir: Path, b_dir: Path, reps: int = BOOTSTRAP_REPS,
            cut_usd: float | None = None) -> tuple[str, dict]:
    """The markdown report and its numbers: {scheme: {...}} for every scheme with finished runs in both grids;
    with cut_usd, also every scheme of both grids cut at that measured bill ({"cut": {...}})."""
    a, b = load_grid(a_dir), load_grid(b_dir)
    diff = differences(a, b)
    common = [s for s in a.schemes if s in b.schemes]
    if not common:
        raise SystemExit(f"the grids share no scheme ({', '.join(a.schemes)} vs {', '.join(b.schemes)})")
    da: dict[str, SchemeData] = collect(a, Path(a_dir))
    db: dict[str, SchemeData] = collect(b, Path(b_dir))
    what = "; ".join(f"{k}: {va} (A) vs {vb} (B)" for k, (va, vb) in diff.items()) or "no setting (same scale)"
    lines = [f"### {a.name} (A) against {b.name} (B)", "",
             f"Job: {a.env_id}, {a.algo}. The grids differ in {what}.", "",
             "| scheme | runs A / B | A: final return, IQM [95% CI] | B: final return, IQM [95% CI] | "
             "P(A > B) [95% CI] | A − B, seed-paired [95% CI] | A wins | env steps A / B (mean) | "
             "measured $ A / B (mean) | wall s A / B (mean) |",
             "|---|---|---|---|---|---|---|---:|---:|---:|"]
    numbers: dict[str, dict] = {}
    unfinished = []
    for s in common:
        x, y = da[s], db[s]
        fx = {k: v for k, v in zip(x.seeds, x.final) if math.isfinite(v)}
        fy = {k: v for k, v in zip(y.seeds, y.final) if math.isfinite(v)}
        if not fx or not fy:
            unfinished.append(title(s, a.i_min, a.i_max))
            continue
        ci = iqm_interval({"a": list(fx.values()), "b": list(fy.values())}, reps)
        p = probability_of_improvement(list(fx.values()), list(fy.values()), reps)
        pd = paired_difference(fx, fy, reps)
        paired = (f"{pd['mean']:+.0f} [{pd['low']:+.0f}, {pd['high']:+.0f}]", f"{pd['wins']}/{pd['seeds']}") \
            if pd else ("n/a", "n/a")
        numbers[s] = {"a": {"seeds": x.seeds, "final": x.final, "iqm": ci["a"], "usd": x.usd, "steps": x.steps,
                            "wall_s": x.wall_s},
                      "b": {"seeds": y.seeds, "final": y.final, "iqm": ci["b"], "usd": y.usd, "steps": y.steps,
                            "wall_s": y.wall_s},
                      "p_a_beats_b": p, "paired": pd}
        lines.append(f"| {title(s, a.i_min, a.i_max)} | {len(fx)} / {len(fy)} | {_ci(ci['a'], '.0f')} | "
                     f"{_ci(ci['b'], '.0f')} | {_ci(p, '.2f')} | {paired[0]} | {paired[1]} | "
                     f"{_mean(x.steps):,.0f} / {_mean(y.steps):,.0f} | {_mean(x.usd):.4f} / {_mean(y.usd):.4f} | "
                     f"{_mean(x.wall_s):.0f} / {_mean(y.wall_s):.0f} |")
    if not numbers:
        raise SystemExit(f"no scheme has finished runs in both grids (shared: {', '.join(common)})")
    lines += ["", "Final return: the mean of each run's last evaluations (the grids' own protocol). IQM CIs: 95% "
              "stratified bootstrap over runs (rliable); P(A > B): the probability that a random run of A beats a "
              "random run of B; seed-paired: A's final minus B's on the seeds both hold, bootstrap over seeds. "
              "Measured dollars and wall time follow the machine's load on the day each run was made."]
    if unfinished:
        lines += ["", "Shared but without a finished, evaluated run in both grids: " + ", ".join(unfinished) + "."]
    result = {"a": a.name, "b": b.name, "differences": {k: list(v) for k, v in diff.items()}, "schemes": numbers}
    if cut_usd is not None:
        more, result["cut"] = cut_table([("A", a, da), ("B", b, db)], cut_usd, reps)
        result["cut_usd"] = cut_usd
        lines += [""] + more
    return "\n".join(lines) + "\n", result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments protocol-versus", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", type=Path, help="grid directory A (e.g. the one with the setting under test)")
    p.add_argument("b", type=Path, help="grid directory B (the reference)")
    p.add_argument("--out", type=Path, default=None, help="also write the report here (and its numbers beside "
                   "it, .json)")
    p.add_argument("--cut-usd", type=float, default=None, metavar="USD",
                   help="also cut every run of both grids at this measured bill (runs made side by side only)")
    p.add_argument("--reps", type=int, default=BOOTSTRAP_REPS, help="bootstrap resamples (default %(default)s)")
    args = p.parse_args(argv)
    if args.reps < 100:
        p.error(f"--reps: at least 100, got {args.reps}")
    if args.cut_usd is not None and not (args.cut_usd > 0 and math.isfinite(args.cut_usd)):
        p.error(f"--cut-usd: a positive number of dollars, got {args.cut_usd}")
    text, numbers = compare(args.a, args.b, args.reps, args.cut_usd)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(numbers, indent=1, default=float) + "\n")
        print(f"report: {args.out}", file=sys.stderr)
    return 0
