"""Return at equal modelled dollars, by truncation:

    python -m experiments protocol-equal-cost --grids docs/results/grids/protocol-hopper-v5-ppo-tuned \\
        docs/results/grids/protocol-hopper-v5-ppo-tuned-r100 [--budget auto|USD] [--rates FILE]

Every finished run of the given grids (one env and preset) is priced round by round at reference rates
(nitro.cost.ReferenceRates: the cloud model at fixed per-unit speeds, calibrated from the quietest decile
of the grids' own rounds unless --rates pins them), and cut at the budget: its final return is the mean of
its last 3 evaluations made before its bill passed the budget. No scaling policy here reads the budget
(the budget only ends a job), so a run cut at B is the run a budget of B would have produced, without
the measured clock's dependence on machine load (docs/cost.md). A run that ends below the budget keeps
all its evaluations and is flagged: its return is then a lower bound of what the budget buys.
The default budget is the smallest reference bill of a whole nitro run, so that every nitro run reaches it.

    python -m experiments protocol-equal-cost --pool A.json B.json ... [--out F.md]

pools the tables of several tasks (the .json each command above writes, e.g. Hopper, Walker2d, Humanoid): per
scheme, P(nitro > scheme) at each task's budget averaged over the tasks (rliable's definition for several
tasks), with a 95% CI from a bootstrap that resamples each task's runs on their own (tasks may hold different
numbers of seeds), and the seeds nitro wins summed over the tasks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from experiments.protocol import (
    BOOTSTRAP_REPS,
    EVAL_EVERY,
    FINAL_EVALS,
    evaluations,
    final_return,
    iqm,
    iqm_interval,
    paired_difference,
    probability_of_improvement,
    title,
)
from nitro.cost import Prices, ReferenceRates, calibrate_reference_rates, delivered_actors, reference_job
from nitro.errors import ConfigError
from nitro.spec import ASYNCHRONOUS_ALGOS

REACHED_OK = 0.95  # a run whose whole bill stays below this share of the budget ended short of it: flagged


@dataclass
class PricedRun:
    scheme: str
    seed: int
    rounds: list[dict]
    steps_per_actor: int
    i_min: int
    i_max: int
    eval_every: int
    source: str
    asynchronous: bool = False  # IMPACT: the update overlaps sampling (nitro.cost.reference_round)
    cum_usd: list[float] = field(default_factory=list)


def load_runs(grids: list[Path]) -> list[PricedRun]:
    """The SUCCEEDED runs of the grids; a (scheme, seed) present in several grids is taken from the one
    with the most rounds (the longer run contains the shorter one's cut)."""
    best: dict[tuple[str, int], PricedRun] = {}
    for g in grids:
        g = Path(g)
        gj = g / "grid.json"
        if not gj.exists():
            raise SystemExit(f"--grids {g}: no grid.json (not a protocol grid directory)")
        scale = json.loads(gj.read_text()).get("scale", {})
        for d in sorted((g / "runs").glob("*")):
            summ, spec = d / "summary.json", d / "run.json"
            if not summ.exists() or not spec.exists():
                continue
            if json.loads(summ.read_text()).get("state") != "SUCCEEDED":
                continue
            run = json.loads(spec.read_text())
            if run.get("extra", {}).get("learner_mode", "central") != "central":
                raise SystemExit(f"--grids {g}: learner mode {run['extra']['learner_mode']!r} is not modelled by "
                                 "reference pricing (it bills learner functions); compare central-learner grids")
            rounds = [json.loads(x) for x in (d / "rounds.jsonl").read_text().splitlines() if x.strip()]
            pr = PricedRun(scheme=run.get("meta", {}).get("scheme") or run.get("scaler", "?"), seed=int(run["seed"]),
                           rounds=rounds, steps_per_actor=int(run.get("steps_per_actor", scale.get("steps_per_actor"))),
                           i_min=int(run.get("i_min", scale.get("i_min", 1))),
                           i_max=int(run.get("i_max", scale.get("i_max", 1))),
                           eval_every=int(run.get("extra", {}).get("eval_every", scale.get("eval_every", EVAL_EVERY))),
                           source=str(d), asynchronous=str(run.get("algo", scale.get("algo", "ppo"))) in ASYNCHRONOUS_ALGOS)
            key = (pr.scheme, pr.seed)
            if key not in best or len(rounds) > len(best[key].rounds):
                best[key] = pr
    return sorted(best.values(), key=lambda r: (r.scheme, r.seed))


def price(runs: list[PricedRun], rates: ReferenceRates, prices: Prices) -> None:
    for r in runs:
        r.cum_usd = reference_job([delivered_actors(x) for x in r.rounds], r.steps_per_actor, rates, prices,
                                  asynchronous=r.asynchronous)


def calibrate(runs: list[PricedRun], prices: Prices) -> ReferenceRates:
    """Reference rates from the runs' own rounds (one learner kind: all synchronous or all asynchronous)."""
    kinds = {r.asynchronous for r in runs}
    if len(kinds) > 1:
        raise ConfigError("the grids mix synchronous (PPO) and asynchronous (IMPACT) runs; compare one algorithm "
                          "at a time")
    return calibrate_reference_rates([x for r in runs for x in r.rounds], runs[0].steps_per_actor, prices,
                                     asynchronous=kinds.pop())


def cut(run: PricedRun, budget: float, final_evals: int = FINAL_EVALS) -> dict:
    """The run as a budget of `budget` reference dollars would have ended it: {final, spent, rounds, env_steps,
    short}; short: the whole run cost less than REACHED_OK x budget, so the budget would have bought more."""
    by_round = {int(x.get("round", i)): i for i, x in enumerate(run.rounds)}
    inside = [e for e in evaluations(run.rounds, run.eval_every)
              if run.cum_usd[by_round[e["round"]]] <= budget * (1 + 1e-9)]
    if not inside:
        return {"final": math.nan, "spent": 0.0, "rounds": 0, "env_steps": 0, "short": False}
    last = by_round[inside[-1]["round"]]
    return {"final": final_return(inside, final_evals), "spent": run.cum_usd[last], "rounds": last + 1,
            "env_steps": inside[-1]["env_steps"], "short": run.cum_usd[-1] < REACHED_OK * budget}


def auto_budget(runs: list[PricedRun]) -> float:
    """The smallest reference bill of a whole nitro run: every nitro run reaches it, so none is cut short."""
    ends = [r.cum_usd[-1] for r in runs if r.scheme == "nitro" and r.cum_usd]
    if not ends:
        raise SystemExit("--budget auto: no finished nitro run in the grids; pass --budget USD")
    return float(min(ends))


def table(runs: list[PricedRun], budget: float, rates: ReferenceRates, reps: int = BOOTSTRAP_REPS) -> tuple[str, dict]:
    cuts: dict[str, dict[int, dict]] = {}
    for r in runs:
        cuts.setdefault(r.scheme, {})[r.seed] = cut(r, budget)
    order = ["nitro"] + sorted(s for s in cuts if s != "nitro")
    order = [s for s in order if s in cuts]
    finals = {s: [c["final"] for c in cuts[s].values() if math.isfinite(c["final"])] for s in order}
    ci = iqm_interval(finals, reps)
    ref = {seed: c["final"] for seed, c in cuts.get("nitro", {}).items()}
    r0 = runs[0]
    lines = [f"Budget: ${budget:.4f} per run at reference rates (actor {rates.actor_s_per_step * 1e6:.1f} us/step, "
             f"learner {rates.learner_s_per_sample * 1e6:.1f} us/sample + {rates.learner_s_per_round:.3f} s/round; "
             "training rounds only, evaluation not billed).", "",
             "| scheme | runs | final return at the budget, IQM [95% CI] | rounds (mean) | env steps (mean) | "
             "runs that end below the budget | P(nitro > scheme) [95% CI] | nitro - scheme, seed-paired [95% CI] | nitro wins |",
             "|---|---|---|---:|---:|---:|---|---|---|"]
    rows = {}
    for s in order:
        cs = list(cuts[s].values())
        short = sum(c["short"] for c in cs)
        p = probability_of_improvement(finals["nitro"], finals[s], reps) if s != "nitro" and finals.get("nitro") \
            else None
        pair = paired_difference(ref, {k: c["final"] for k, c in cuts[s].items()}, reps) if s != "nitro" else None
        name = title(s, r0.i_min, r0.i_max)
        flag = " (lower bound: runs end below the budget)" if short else ""
        iq = ci.get(s)
        iq_txt = f"{iq[0]:.1f} [{iq[1]:.1f}, {iq[2]:.1f}]" if iq else "n/a"
        p_txt = f"{p[0]:.2f} [{p[1]:.2f}, {p[2]:.2f}]" if p and all(map(math.isfinite, p)) else "—"
        pair_txt = (f"{pair['mean']:+.1f} [{pair['low']:+.1f}, {pair['high']:+.1f}]", f"{pair['wins']}/{pair['seeds']}") \
            if pair else ("—", "—")
        lines.append(f"| {name}{flag} | {len(cs)} | {iq_txt} | {np.mean([c['rounds'] for c in cs]):.1f} | "
                     f"{np.mean([c['env_steps'] for c in cs]):,.0f} | {short} | {p_txt} | {pair_txt[0]} | "
                     f"{pair_txt[1]} |")
        rows[s] = {"runs": len(cs), "iqm": iq, "p_nitro_better": p, "paired": pair, "cuts": cuts[s]}
    fractions = (0.25, 0.5, 0.75, 1.0)
    lines += ["", "Final return IQM at smaller budgets (the same cut; * = some runs end below that budget):", "",
              "| scheme | " + " | ".join(f"${budget * f:.4f}" for f in fractions) + " |",
              "|---|" + "---:|" * len(fractions)]
    for s in order:
        cells = []
        for f in fractions:
            cs = [cut(r, budget * f) for r in runs if r.scheme == s]
            vals = [c["final"] for c in cs if math.isfinite(c["final"])]
            cells.append(f"{iqm(vals):.0f}{'*' if any(c['short'] for c in cs) else ''}" if vals else "n/a")
        lines.append(f"| {title(s, r0.i_min, r0.i_max)} | " + " | ".join(cells) + " |")
    lines += ["", f"Each run is cut at its last evaluation inside the budget (a run whose whole bill is below "
              f"{REACHED_OK:.0%} of the budget ended short of it and is counted as ending below); final return = mean of its last 3 "
              "evaluations there (10 deterministic episodes each). IQM CIs: 95% stratified bootstrap over runs "
              "(rliable); P(nitro > scheme): probability that a random nitro run beats a random run of the scheme; "
              "seed-paired: nitro's final minus the scheme's on the same seed, bootstrap over seeds."]
    return "\n".join(lines), {"budget_usd": budget, "rates": rates.to_dict(), "schemes": rows}


def p_greater(x, y) -> float:
    """P(X > Y) for one task: the share of (x, y) pairs with x > y, ties counted half."""
    x, y = np.asarray(x, dtype=float)[:, None], np.asarray(y, dtype=float)[None, :]
    return float(np.mean((x > y) + 0.5 * (x == y)))


def pooled_probability(xs: list, ys: list, reps: int = BOOTSTRAP_REPS, seed: int = 0) -> tuple[float, float, float]:
    """P(X > Y) averaged over tasks (xs[t], ys[t]: the runs of task t) and its 95% percentile CI from a
    bootstrap that resamples every task's x and y runs independently (stratified by task and scheme)."""
    if not xs or len(xs) != len(ys) or any(len(x) == 0 or len(y) == 0 for x, y in zip(xs, ys)):
        raise ValueError("pooled_probability: every task needs runs of both schemes")
    xs = [np.asarray(x, dtype=float) for x in xs]
    ys = [np.asarray(y, dtype=float) for y in ys]
    point = float(np.mean([p_greater(x, y) for x, y in zip(xs, ys)]))
    rng = np.random.default_rng(seed)
    boots = np.empty(reps)
    for i in range(reps):
        boots[i] = np.mean([p_greater(x[rng.integers(0, len(x), len(x))], y[rng.integers(0, len(y), len(y))])
                            for x, y in zip(xs, ys)])
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return point, float(lo), float(hi)


def pool(tables: dict[str, dict], reps: int = BOOTSTRAP_REPS) -> tuple[str, dict]:
    """{task: an equal-cost .json} -> the pooled markdown and its numbers, for each scheme every task holds."""
    finals = {t: {s: {int(k): c["final"] for k, c in row["cuts"].items() if math.isfinite(c["final"])}
                  for s, row in d["schemes"].items()} for t, d in tables.items()}
    for t, f in finals.items():
        if not f.get("nitro"):
            raise SystemExit(f"--pool {t}: no nitro run at the budget; every task needs nitro to compare against")
    schemes = [s for s in next(iter(finals.values())) if s != "nitro" and all(s in f and f[s] for f in finals.values())]
    if not schemes:
        raise SystemExit("--pool: no scheme besides nitro is in every task's table")
    tasks = list(tables)
    lines = ["### Return at equal modelled dollars, pooled over " + ", ".join(tasks), "",
             "Budgets (reference USD per run): " + ", ".join(f"{t} ${tables[t]['budget_usd']:.4f}" for t in tasks) + ".",
             "", "| scheme | " + " | ".join(f"P(nitro > scheme), {t}" for t in tasks)
             + " | pooled P(nitro > scheme) [95% CI] | nitro wins, same seed |",
             "|---|" + "---|" * len(tasks) + "---|---|"]
    numbers: dict[str, dict] = {}
    for s in schemes:
        xs = [list(finals[t]["nitro"].values()) for t in tasks]
        ys = [list(finals[t][s].values()) for t in tasks]
        per_task = [p_greater(x, y) for x, y in zip(xs, ys)]
        p = pooled_probability(xs, ys, reps)
        wins = seeds = 0
        for t in tasks:
            common = set(finals[t]["nitro"]) & set(finals[t][s])
            wins += sum(finals[t]["nitro"][k] > finals[t][s][k] for k in common)
            seeds += len(common)
        numbers[s] = {"per_task": dict(zip(tasks, per_task)), "pooled": p, "wins": wins, "seeds": seeds,
                      "runs": {t: [len(x), len(y)] for t, x, y in zip(tasks, xs, ys)}}
        lines.append(f"| {title(s)} | " + " | ".join(f"{v:.2f} ({len(x)} vs {len(y)} runs)" for v, x, y in
                                            zip(per_task, xs, ys))
                     + f" | {p[0]:.2f} [{p[1]:.2f}, {p[2]:.2f}] | {wins}/{seeds} |")
    lines += ["", "Each task's runs are cut at its own budget (its table); P(nitro > scheme) per task: the share of "
              "(nitro run, scheme run) pairs that nitro wins, ties half; pooled: their mean over tasks, 95% CI from "
              "a bootstrap resampling each task's runs of each scheme on their own."]
    return "\n".join(lines) + "\n", {"tasks": tasks, "schemes": numbers}


CURVE_POINTS = 10  # budgets from a tenth of the budget to all of it
CURVE_REPS = 500  # bootstrap resamples per point (the table's CIs use --reps)


def budget_curves(runs: list[PricedRun], budget: float, reps: int = CURVE_REPS) -> dict[str, dict[str, list]]:
    """Per scheme, the final return at equal dollars as a function of the budget: {scheme: {"usd", "iqm", "low",
    "high", "short"}} at CURVE_POINTS budgets up to `budget` (short: some runs ended below that budget)."""
    out: dict[str, dict[str, list]] = {}
    for s in dict.fromkeys(r.scheme for r in runs):
        c = out.setdefault(s, {"usd": [], "iqm": [], "low": [], "high": [], "short": []})
        for b in np.linspace(budget / CURVE_POINTS, budget, CURVE_POINTS):
            cs = [cut(r, b) for r in runs if r.scheme == s]
            vals = [x["final"] for x in cs if math.isfinite(x["final"])]
            if not vals:
                continue
            q = iqm_interval({s: vals}, reps)[s]
            for k, v in zip(("usd", "iqm", "low", "high", "short"), (float(b), *q, any(x["short"] for x in cs))):
                c[k].append(v)
    return out


def plot_budget_curves(curves: dict[str, dict[str, list]], runs: list[PricedRun], path: Path, heading: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    r0 = runs[0]
    order = ["nitro"] + sorted(s for s in curves if s != "nitro")
    for i, s in enumerate(x for x in order if x in curves):
        c, color = curves[s], f"C{i}"
        n = sum(r.scheme == s for r in runs)
        ax.plot(c["usd"], c["iqm"], color=color, marker="o", ms=3, label=f"{title(s, r0.i_min, r0.i_max)} ({n})")
        ax.fill_between(c["usd"], c["low"], c["high"], color=color, alpha=0.12)
        short = [k for k, v in enumerate(c["short"]) if v]
        ax.scatter([c["usd"][k] for k in short], [c["iqm"][k] for k in short], color=color, marker="x", s=30)
    ax.set_xlabel("budget per run, reference-priced USD (x: some runs ended below it)")
    ax.set_ylabel("final return at the budget (IQM, 95% CI)")
    ax.legend(fontsize=7)
    fig.suptitle(heading, fontsize=8)
    fig.savefig(path, dpi=80)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments protocol-equal-cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--grids", nargs="+", metavar="DIR", help="protocol grid directories (one env "
                     "and preset); a scheme and seed in several is taken from the longest run")
    src.add_argument("--pool", nargs="+", metavar="JSON", help="pool the .json tables of several tasks (written by "
                     "--grids commands): P(nitro > scheme) averaged over tasks, with a CI")
    p.add_argument("--budget", default="auto", help="reference USD per run, or 'auto': the smallest reference bill of "
                   "a whole nitro run (default)")
    p.add_argument("--rates", help="a JSON file of nitro.cost.ReferenceRates fields (default: calibrated from the "
                   "grids' rounds, their quietest decile)")
    p.add_argument("--actor-rate-from", nargs="+", metavar="DIR", help="take the actor's seconds per env step "
                   "from these grids instead (same env, network and steps per actor): asynchronous runs measure "
                   "their actors while the learner shares the cores, which inflates the actors' CPU time")
    p.add_argument("--reps", type=int, default=BOOTSTRAP_REPS, help="bootstrap resamples (default %(default)s)")
    p.add_argument("--out", help="write the table (.md) and its data (.json) here (default: equal-cost-<first "
                   "grid>.md beside the grids)")
    args = p.parse_args(argv)
    if args.pool:
        return main_pool(args)
    if args.rates and args.actor_rate_from:  # the file's rates are used as they are: say so, do not ignore one
        p.error("--actor-rate-from calibrates the actor's rate, --rates pins every rate: give one of them "
                "(write the actor rate you want into the --rates file)")
    grids = [Path(g) for g in args.grids]
    runs = load_runs(grids)
    if not runs:
        raise SystemExit(f"no finished runs in {', '.join(map(str, grids))}")
    prices = Prices()
    if args.rates:
        rates = ReferenceRates(**json.loads(Path(args.rates).read_text()))
    else:
        try:
            rates = calibrate(runs, prices)
            if args.actor_rate_from:
                donors = load_runs([Path(g) for g in args.actor_rate_from])
                steps = {r.steps_per_actor for r in donors}
                if not donors or steps != {runs[0].steps_per_actor}:
                    raise ConfigError(f"--actor-rate-from: needs finished runs with {runs[0].steps_per_actor} steps "
                                      f"per actor, got {sorted(steps) or 'none'}")
                rates = dataclasses.replace(rates, actor_s_per_step=calibrate(donors, prices).actor_s_per_step)
        except ConfigError as exc:
            print(f"protocol-equal-cost: {exc} (or pass --rates FILE)", file=sys.stderr)
            return 2
    price(runs, rates, prices)
    try:
        budget = auto_budget(runs) if args.budget == "auto" else float(args.budget)
    except ValueError:
        raise SystemExit(f"--budget: a number of USD or 'auto', got {args.budget!r}") from None
    if not budget > 0:
        raise SystemExit(f"--budget: must be > 0, got {budget}")
    text, data = table(runs, budget, rates, args.reps)
    command = "python -m experiments protocol-equal-cost --grids " + " ".join(map(str, args.grids)) + \
        ("" if args.budget == "auto" else f" --budget {args.budget}") + \
        ("" if not args.rates else f" --rates {args.rates}") + \
        ("" if not args.actor_rate_from else " --actor-rate-from " + " ".join(args.actor_rate_from))
    text = f"### Return at equal modelled dollars: {grids[0].name}\n\nCommand: `{command}`\n\n" + text
    print(text)
    out = Path(args.out) if args.out else grids[0].parent / f"equal-cost-{grids[0].name}.md"
    out.write_text(text + "\n")
    data["curves"] = budget_curves(runs, budget, min(args.reps, CURVE_REPS))
    out.with_suffix(".json").write_text(json.dumps(data, indent=2, default=float) + "\n")
    plot_budget_curves(data["curves"], runs, out.with_suffix(".png"),
                       f"{grids[0].name}: final return at equal reference dollars (each run cut at the budget)")
    print(f"\ntable: {out}\nplot: {out.with_suffix('.png')}")
    return 0


def main_pool(args) -> int:
    tables = {}
    for f in args.pool:
        path = Path(f)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--pool {f}: not a readable equal-cost table ({exc})") from None
        if not isinstance(data, dict) or "schemes" not in data or "budget_usd" not in data:
            raise SystemExit(f"--pool {f}: not an equal-cost table (no 'schemes' and 'budget_usd'); pass the .json "
                             "that protocol-equal-cost --grids writes")
        task = path.stem.removeprefix("equal-cost-").removeprefix("protocol-").removesuffix("-equal-cost")
        if task in tables:
            raise SystemExit(f"--pool {f}: a second table for the task {task!r}; pool each task once")
        tables[task] = data
    if len(tables) < 2:
        raise SystemExit(f"--pool: at least two tasks' tables, got {len(tables)}")
    text, numbers = pool(tables, args.reps)
    command = "python -m experiments protocol-equal-cost --pool " + " ".join(args.pool)
    text = f"Command: `{command}`\n\n" + text
    print(text)
    if args.out:
        out = Path(args.out)
        out.write_text(text)
        out.with_suffix(".json").write_text(json.dumps(numbers, indent=2, default=float) + "\n")
        print(f"table: {out}")
    return 0
