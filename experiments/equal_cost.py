"""Return at equal modelled dollars: every run cut at the same spend.

    python -m experiments protocol-equal-cost --grids docs/results/grids/protocol-hopper-v5-ppo-tuned \\
        docs/results/grids/protocol-hopper-v5-ppo-tuned-r100 [--budget auto|USD] [--rates FILE] \\
        [--pricing FILE ...] [--cut interpolate|last-eval]

Every finished run of the given grids (one env and preset) is priced round by round at reference rates
(nitro.cost.ReferenceRates: the cloud model at fixed per-unit speeds, calibrated from the quietest decile
of the grids' own rounds unless --rates pins them) under one or more pricings (nitro.cost.Pricing: unit prices,
the actors' memory size and its CPU share, the priced learner's speed, whether evaluation is billed; files in
docs/results/evidence/pricing/), and cut at one spend. `--cut interpolate` (the default) gives every run its
return at exactly the budget: the run's final return (the mean of its last 3 evaluations) as a function of its
bill, interpolated linearly between the evaluations either side of the budget. `--cut last-eval` (the method
before 2026-12-02) takes the last evaluation inside the budget, which strands up to an evaluation period's
spend, most for schemes with expensive rounds. No scaling policy here reads the budget (the budget only ends
a job), so a run cut at B is the run a budget of B would have produced, without the measured clock's
dependence on machine load (docs/cost.md). A run that ends below the budget keeps its last value and is
flagged: its return is then a lower bound of what the budget buys. The default budget is, per pricing, the
smallest bill of a whole nitro run, so that every nitro run reaches it; every table is given at that budget and
at half of it, and with several pricings a verdict table says, per scheme, whether the comparison with nitro
holds under all of them.

    python -m experiments protocol-equal-cost --pool A.json B.json ... [--out F.md]

pools the tables of several tasks (the .json each command above writes, e.g. Hopper, Walker2d, Humanoid): per
scheme, P(nitro > scheme) at each task's budget averaged over the tasks (rliable's definition for several
tasks), with a 95% CI from a bootstrap that resamples each task's runs on their own (tasks may hold different
numbers of seeds), and the seeds nitro wins summed over the tasks. With several pricings the first one's
table is pooled.
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

from experiments.harness import finished_as_planned, runs_dir
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
from nitro.cost import (
    LEGACY_ACTOR_MEMORY_MB,
    PAPER_PRICES,
    Prices,
    Pricing,
    ReferenceRates,
    calibrate_reference_rates,
    delivered_actors,
    reference_evaluation_seconds,
    reference_job,
)
from nitro.errors import ConfigError
from nitro.spec import ASYNCHRONOUS_ALGOS

REACHED_OK = 0.95  # a run whose whole bill stays below this share of the budget ended short of it: flagged
CUTS = ("interpolate", "last-eval")
# The pricing of every table before 2026-12-02: the paper's GPU learner price for CPU-measured time, 1,024 MB actors
# on a full vCPU, evaluation not billed. Pricing with it (and --cut last-eval) reproduces the old tables.
OLD_PRICING = Pricing("old", PAPER_PRICES, actor_memory_mb=float(LEGACY_ACTOR_MEMORY_MB), bill_evaluation=False,
                      note="the paper's p3.2xlarge for CPU-measured learner time; 1,024 MB actors on a full vCPU; "
                           "evaluation not billed")
DEFAULT_PRICING = Pricing("cpu", note="the learner as the CPU instance that measured it (c6i.large); 1,769 MB "
                                      "actors; evaluation billed as learner time")


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
    # What the run's own reports were billed at (run.json "billing"; runs before 2026-12-02 recorded none and
    # were billed at the paper's prices with 1,024 MB actors on a full vCPU): calibration reads them back in it.
    billed_prices: Prices = PAPER_PRICES
    billed_memory_mb: float = float(LEGACY_ACTOR_MEMORY_MB)
    cum_usd: list[float] = field(default_factory=list)


def load_runs(grids: list[Path]) -> list[PricedRun]:
    """The runs of the grids that finished as planned (harness.finished_as_planned); a (scheme, seed) present in several grids is taken from the one
    with the most rounds (the longer run contains the shorter one's cut)."""
    best: dict[tuple[str, int], PricedRun] = {}
    for g in grids:
        g = Path(g)
        gj = g / "grid.json"
        if not gj.exists():
            raise SystemExit(f"--grids {g}: no grid.json (not a protocol grid directory)")
        scale = json.loads(gj.read_text()).get("scale", {})
        for d in sorted(runs_dir(g).glob("*")):
            summ, spec = d / "summary.json", d / "run.json"
            if not summ.exists() or not spec.exists():
                continue
            if not finished_as_planned(json.loads(summ.read_text())):
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
            billing = run.get("billing")
            if billing:
                pr.billed_prices = Prices.from_mapping(billing.get("prices"))
                pr.billed_memory_mb = float(billing.get("actor_memory_mb", LEGACY_ACTOR_MEMORY_MB))
            key = (pr.scheme, pr.seed)
            if key not in best or len(rounds) > len(best[key].rounds):
                best[key] = pr
    return sorted(best.values(), key=lambda r: (r.scheme, r.seed))


def price(runs: list[PricedRun], rates: ReferenceRates, pricing: Pricing = DEFAULT_PRICING) -> None:
    """Each run's cumulative bill after each round under `pricing`, from the reference rates measured (its
    evaluations at reference speed when the pricing bills them: nitro.cost.reference_evaluation_seconds)."""
    priced = pricing.rates(rates)
    for r in runs:
        ev = reference_evaluation_seconds(r.rounds, rates, r.steps_per_actor) if pricing.bill_evaluation else None
        r.cum_usd = reference_job([delivered_actors(x) for x in r.rounds], r.steps_per_actor, priced, pricing.prices,
                                  pricing.actor_memory_mb, asynchronous=r.asynchronous, evaluation_s=ev)


def calibrate(runs: list[PricedRun], prices: Prices | None = None) -> ReferenceRates:
    """Reference rates from the runs' own rounds (one learner kind: all synchronous or all asynchronous), read
    back in what the runs were billed at (`prices`: instead of the runs' own record)."""
    kinds = {r.asynchronous for r in runs}
    if len(kinds) > 1:
        raise ConfigError("the grids mix synchronous (PPO) and asynchronous (IMPACT) runs; compare one algorithm "
                          "at a time")
    billed = {(r.billed_prices, r.billed_memory_mb) for r in runs}
    if len(billed) > 1 and prices is None:
        raise ConfigError("the grids' runs were billed at different prices or actor memory sizes (run.json "
                          "'billing'); calibrate them apart, or pin --rates")
    run_prices, memory = billed.pop()
    return calibrate_reference_rates([x for r in runs for x in r.rounds], runs[0].steps_per_actor,
                                     prices or run_prices, asynchronous=kinds.pop(), actor_memory_mb=memory)


def _points(run: PricedRun, final_evals: int) -> list[tuple[float, float, int, int]]:
    """(bill, final return so far, rounds, env steps) at each evaluation of the run."""
    by_round = {int(x.get("round", i)): i for i, x in enumerate(run.rounds)}
    evals = evaluations(run.rounds, run.eval_every)
    return [(run.cum_usd[by_round[e["round"]]], final_return(evals[: i + 1], final_evals), by_round[e["round"]] + 1,
             int(e["env_steps"])) for i, e in enumerate(evals)]


def final_at(bills, finals, budget: float, method: str = "interpolate") -> tuple[float, int, float]:
    """A run's final return at `budget` from its (bill, final return so far) at each evaluation, in order:
    (final, i, w): i the last evaluation inside the budget (-1: none, final NaN), w the weight of the next one
    (`interpolate`: linear in the bill between the two either side; 0 at or beyond the last evaluation, and
    with `last-eval`)."""
    if method not in CUTS:
        raise ConfigError(f"invalid value for cut: must be one of {list(CUTS)}, got {method!r}")
    inside = [i for i, b in enumerate(bills) if b <= budget * (1 + 1e-9)]
    if not inside:
        return math.nan, -1, 0.0
    i = inside[-1]
    if method == "interpolate" and i + 1 < len(bills) and bills[i + 1] > bills[i]:
        w = (budget - bills[i]) / (bills[i + 1] - bills[i])
        return finals[i] + w * (finals[i + 1] - finals[i]), i, w
    return finals[i], i, 0.0


def cut(run: PricedRun, budget: float, final_evals: int = FINAL_EVALS, method: str = "interpolate") -> dict:
    """The run as a budget of `budget` reference dollars would have ended it: {final, spent, rounds, env_steps,
    short}. `interpolate`: the final return at exactly the budget, linear between the evaluations either side
    of it; `last-eval`: at the last evaluation inside it. short: the whole run cost less than REACHED_OK x
    budget, so the budget would have bought more (its last value is kept: a lower bound)."""
    pts = _points(run, final_evals)
    final, i, w = final_at([p[0] for p in pts], [p[1] for p in pts], budget, method)
    if i < 0:
        return {"final": math.nan, "spent": 0.0, "rounds": 0, "env_steps": 0, "short": False}
    short = bool(run.cum_usd) and run.cum_usd[-1] < REACHED_OK * budget
    usd, _, rounds, steps = pts[i]
    if w > 0:
        nxt = pts[i + 1]
        return {"final": final, "spent": float(budget), "rounds": rounds + w * (nxt[2] - rounds),
                "env_steps": steps + w * (nxt[3] - steps), "short": short}
    return {"final": final, "spent": usd, "rounds": rounds, "env_steps": steps, "short": short}


def auto_budget(runs: list[PricedRun]) -> float:
    """The smallest reference bill of a whole nitro run: every nitro run reaches it, so none is cut short."""
    ends = [r.cum_usd[-1] for r in runs if r.scheme == "nitro" and r.cum_usd]
    if not ends:
        raise SystemExit("--budget auto: no finished nitro run in the grids; pass --budget USD")
    return float(min(ends))


def describe(pricing: Pricing, rates: ReferenceRates) -> str:
    priced = pricing.rates(rates)
    pr = pricing.prices
    share = (f"{pricing.actor_memory_mb:.0f} MB actors at {min(1.0, pricing.actor_memory_mb / pr.lambda_full_vcpu_mb):.2f}"
             " of a vCPU" if pr.lambda_full_vcpu_mb > 0 else f"{pricing.actor_memory_mb:.0f} MB actors on a full vCPU")
    return (f"pricing `{pricing.name}`: learner {pr.learner_instance} ${pr.learner_usd_per_hour:g}/h at "
            f"{priced.learner_s_per_sample * 1e6:.1f} us/sample + {priced.learner_s_per_round:.3f} s/round; "
            f"actor {rates.actor_s_per_step * 1e6:.1f} us/step on a full vCPU, {share}; evaluation "
            f"{'billed as learner time' if pricing.bill_evaluation else 'not billed'}"
            + (f" ({pricing.note})" if pricing.note else ""))


def cut_all(runs: list[PricedRun], budget: float, method: str) -> dict[str, dict[int, dict]]:
    cuts: dict[str, dict[int, dict]] = {}
    for r in runs:
        cuts.setdefault(r.scheme, {})[r.seed] = cut(r, budget, method=method)
    return cuts


def compare(cuts: dict[str, dict[int, dict]], reps: int = BOOTSTRAP_REPS) -> dict[str, dict]:
    """Per scheme: its cuts, IQM [CI] of their finals, P(nitro > scheme) and the seed-paired difference."""
    order = ["nitro"] + sorted(s for s in cuts if s != "nitro")
    order = [s for s in order if s in cuts]
    finals = {s: [c["final"] for c in cuts[s].values() if math.isfinite(c["final"])] for s in order}
    ci = iqm_interval(finals, reps)
    ref = {seed: c["final"] for seed, c in cuts.get("nitro", {}).items()}
    rows = {}
    for s in order:
        p = probability_of_improvement(finals["nitro"], finals[s], reps) if s != "nitro" and finals.get("nitro") \
            else None
        pair = paired_difference(ref, {k: c["final"] for k, c in cuts[s].items()}, reps) if s != "nitro" else None
        rows[s] = {"runs": len(cuts[s]), "iqm": ci.get(s), "p_nitro_better": p, "paired": pair, "cuts": cuts[s]}
    return rows


def verdict(p) -> str:
    """What P(nitro > scheme) [CI] says: a side when the CI excludes 0.5, else level."""
    if not p or not all(map(math.isfinite, p)):
        return "n/a"
    return "nitro ahead" if p[1] > 0.5 else "scheme ahead" if p[2] < 0.5 else "level"


def table(runs: list[PricedRun], budget: float, rates: ReferenceRates, reps: int = BOOTSTRAP_REPS, *,
          pricing: Pricing = DEFAULT_PRICING, method: str = "interpolate") -> tuple[str, dict]:
    rows = compare(cut_all(runs, budget, method), reps)
    r0 = runs[0]
    lines = [f"Budget: ${budget:.4f} per run; {describe(pricing, rates)}; cut: {method}.", "",
             "| scheme | runs | final return at the budget, IQM [95% CI] | spent / budget (mean) | rounds (mean) | "
             "env steps (mean) | runs that end below the budget | P(nitro > scheme) [95% CI] | "
             "nitro - scheme, seed-paired [95% CI] | nitro wins |",
             "|---|---|---|---:|---:|---:|---:|---|---|---|"]
    for s, row in rows.items():
        cs = list(row["cuts"].values())
        short = sum(c["short"] for c in cs)
        p, pair, iq = row["p_nitro_better"], row["paired"], row["iqm"]
        flag = " (lower bound: runs end below the budget)" if short else ""
        iq_txt = f"{iq[0]:.1f} [{iq[1]:.1f}, {iq[2]:.1f}]" if iq else "n/a"
        p_txt = f"{p[0]:.2f} [{p[1]:.2f}, {p[2]:.2f}]" if p and all(map(math.isfinite, p)) else "—"
        pair_txt = (f"{pair['mean']:+.1f} [{pair['low']:+.1f}, {pair['high']:+.1f}]", f"{pair['wins']}/{pair['seeds']}") \
            if pair else ("—", "—")
        lines.append(f"| {title(s, r0.i_min, r0.i_max)}{flag} | {len(cs)} | {iq_txt} | "
                     f"{np.mean([c['spent'] for c in cs]) / budget:.3f} | {np.mean([c['rounds'] for c in cs]):.1f} | "
                     f"{np.mean([c['env_steps'] for c in cs]):,.0f} | {short} | {p_txt} | {pair_txt[0]} | {pair_txt[1]} |")
    fractions = (0.25, 0.5, 0.75, 1.0)
    lines += ["", "Final return IQM at smaller budgets (the same cut; * = some runs end below that budget):", "",
              "| scheme | " + " | ".join(f"${budget * f:.4f}" for f in fractions) + " |",
              "|---|" + "---:|" * len(fractions)]
    for s in rows:
        cells = []
        for f in fractions:
            cs = [cut(r, budget * f, method=method) for r in runs if r.scheme == s]
            vals = [c["final"] for c in cs if math.isfinite(c["final"])]
            cells.append(f"{iqm(vals):.0f}{'*' if any(c['short'] for c in cs) else ''}" if vals else "n/a")
        lines.append(f"| {title(s, r0.i_min, r0.i_max)} | " + " | ".join(cells) + " |")
    how = ("its final return interpolated linearly, in its bill, between the evaluations either side of the budget"
           if method == "interpolate" else "at its last evaluation inside the budget")
    lines += ["", f"Each run is cut at the budget, {how} (a run whose whole bill is below {REACHED_OK:.0%} of the "
              "budget ended short of it and is counted as ending below); final return = mean of its last 3 "
              "evaluations there (10 deterministic episodes each). IQM CIs: 95% stratified bootstrap over runs "
              "(rliable); P(nitro > scheme): probability that a random nitro run beats a random run of the scheme; "
              "seed-paired: nitro's final minus the scheme's on the same seed, bootstrap over seeds."]
    return "\n".join(lines), {"budget_usd": budget, "rates": rates.to_dict(), "pricing": pricing.to_dict(),
                              "cut": method, "schemes": rows}


def verdict_table(results: list[dict], runs: list[PricedRun]) -> str:
    """Per scheme, what P(nitro > scheme) says under each pricing at the full and the half budget, and whether it
    is the same under all of them."""
    r0 = runs[0]
    schemes = [s for s in results[0]["full"]["schemes"] if s != "nitro"]
    head = [f"{d['pricing']['name']} {k}" for d in results for k in ("B", "B/2")]
    lines = ["| scheme | " + " | ".join(head) + " | holds under every pricing |", "|---|" + "---|" * len(head) + "---|"]
    for s in schemes:
        cells, kinds = [], set()
        for d in results:
            for k in ("full", "half"):
                row = d[k]["schemes"].get(s, {})
                p = row.get("p_nitro_better")
                v = verdict(p)
                kinds.add((k, v))
                cells.append(f"{v} ({p[0]:.2f})" if p and math.isfinite(p[0]) else v)
        same = all(len({v for kk, v in kinds if kk == k}) == 1 for k in ("full", "half"))
        lines.append(f"| {title(s, r0.i_min, r0.i_max)} | " + " | ".join(cells) + f" | {'yes' if same else 'no'} |")
    return "\n".join(lines + ["", "Each cell: what P(nitro > scheme) says at that pricing's budget B (the smallest "
                                   "bill of a whole nitro run) or at B/2: 'nitro ahead' or 'scheme ahead' when its "
                                   "95% CI excludes 0.5, else 'level'; the point estimate in brackets. 'holds': the "
                                   "same at B under every pricing, and the same at B/2."])


def summary(data: dict, before: dict | None = None) -> str:
    """One line per scheme across the pricings of an equal-cost .json (its "pricings"): the IQM final return at
    each pricing's B with P(nitro > scheme) in brackets; `before`, another table's .json (the committed table
    made before 2026-12-02), adds its figures as the first column."""
    cols = ([("before", before)] if before else []) + [
        (d["pricing"]["name"], d["full"]) for d in data["pricings"]]
    schemes = list(data["pricings"][0]["full"]["schemes"])

    def cell(t: dict, s: str) -> str:
        row = t["schemes"].get(s)
        if not row or not row.get("iqm"):
            return "—"
        p = row.get("p_nitro_better")
        short = any(c.get("short") for c in row["cuts"].values())
        return f"{row['iqm'][0]:.0f}{'*' if short else ''}" + (f" ({p[0]:.2f})" if p and math.isfinite(p[0]) else "")
    head = [f"{name} (${t['budget_usd']:.4f})" for name, t in cols]
    lines = ["| scheme | " + " | ".join(head) + " |", "|---|" + "---:|" * len(cols)]
    lines += [f"| {title(s)} | " + " | ".join(cell(t, s) for _, t in cols) + " |" for s in schemes]
    return "\n".join(lines + ["", "IQM final return at each pricing's budget B (P(nitro > scheme) in brackets; "
                                   "* some runs end below B)."])


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


def budget_curves(runs: list[PricedRun], budget: float, reps: int = CURVE_REPS,
                  method: str = "interpolate") -> dict[str, dict[str, list]]:
    """Per scheme, the final return at equal dollars as a function of the budget: {scheme: {"usd", "iqm", "low",
    "high", "short"}} at CURVE_POINTS budgets up to `budget` (short: some runs ended below that budget)."""
    out: dict[str, dict[str, list]] = {}
    for s in dict.fromkeys(r.scheme for r in runs):
        c = out.setdefault(s, {"usd": [], "iqm": [], "low": [], "high": [], "short": []})
        for b in np.linspace(budget / CURVE_POINTS, budget, CURVE_POINTS):
            cs = [cut(r, b, method=method) for r in runs if r.scheme == s]
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


def load_pricing(path: str) -> Pricing:
    try:
        return Pricing.from_mapping(json.loads(Path(path).read_text()))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--pricing {path}: not a readable pricing file ({exc})") from None
    except (ConfigError, TypeError) as exc:
        raise SystemExit(f"--pricing {path}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments protocol-equal-cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--grids", nargs="+", metavar="DIR", help="protocol grid directories (one env "
                     "and preset); a scheme and seed in several is taken from the longest run")
    src.add_argument("--pool", nargs="+", metavar="JSON", help="pool the .json tables of several tasks (written by "
                     "--grids commands): P(nitro > scheme) averaged over tasks, with a CI")
    src.add_argument("--summary", metavar="JSON", help="one line per scheme across the pricings of a .json written "
                     "by --grids with --pricing (IQM at each B, P(nitro > scheme)); --before JSON adds an older table")
    p.add_argument("--before", metavar="JSON", help="with --summary: a table made before 2026-12-02, as its first column")
    p.add_argument("--budget", default="auto", help="reference USD per run under every pricing, or 'auto': per "
                   "pricing, the smallest bill of a whole nitro run (default)")
    p.add_argument("--rates", help="a JSON file of nitro.cost.ReferenceRates fields (default: calibrated from the "
                   "grids' rounds, their quietest decile)")
    p.add_argument("--pricing", nargs="+", metavar="FILE", help="pricing files (nitro.cost.Pricing as JSON; "
                   "docs/results/evidence/pricing/): one table each, and a verdict table across them (default: "
                   "the default prices, 1,769 MB actors, evaluation billed)")
    p.add_argument("--cut", choices=CUTS, default="interpolate", help="where a run is cut: its return interpolated at "
                   "exactly the budget (default), or its last evaluation inside it (the method before 2026-12-02)")
    p.add_argument("--actor-rate-from", nargs="+", metavar="DIR", help="take the actor's seconds per env step "
                   "from these grids instead (same env, network and steps per actor): asynchronous runs measure "
                   "their actors while the learner shares the cores, which inflates the actors' CPU time")
    p.add_argument("--reps", type=int, default=BOOTSTRAP_REPS, help="bootstrap resamples (default %(default)s)")
    p.add_argument("--out", help="write the table (.md) and its data (.json) here (default: equal-cost-<first "
                   "grid>.md beside the grids)")
    args = p.parse_args(argv)
    if args.pool:
        return main_pool(args)
    if args.summary:
        try:
            data = json.loads(Path(args.summary).read_text())
            before = json.loads(Path(args.before).read_text()) if args.before else None
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--summary: not a readable equal-cost table ({exc})") from None
        if "pricings" not in data:
            raise SystemExit(f"--summary {args.summary}: no 'pricings' (written before --pricing existed); re-run "
                             "--grids with --pricing")
        print(summary(data, before))
        return 0
    if args.rates and args.actor_rate_from:  # the file's rates are used as they are: say so, do not ignore one
        p.error("--actor-rate-from calibrates the actor's rate, --rates pins every rate: give one of them "
                "(write the actor rate you want into the --rates file)")
    pricings = [load_pricing(f) for f in args.pricing] if args.pricing else [DEFAULT_PRICING]
    if len({x.name for x in pricings}) != len(pricings):
        raise SystemExit("--pricing: two pricings with the same name; give each file its own 'name'")
    grids = [Path(g) for g in args.grids]
    runs = load_runs(grids)
    if not runs:
        raise SystemExit(f"no finished runs in {', '.join(map(str, grids))}")
    if args.rates:
        rates = ReferenceRates(**json.loads(Path(args.rates).read_text()))
    else:
        try:
            rates = calibrate(runs)
            if args.actor_rate_from:
                donors = load_runs([Path(g) for g in args.actor_rate_from])
                steps = {r.steps_per_actor for r in donors}
                if not donors or steps != {runs[0].steps_per_actor}:
                    raise ConfigError(f"--actor-rate-from: needs finished runs with {runs[0].steps_per_actor} steps "
                                      f"per actor, got {sorted(steps) or 'none'}")
                rates = dataclasses.replace(rates, actor_s_per_step=calibrate(donors).actor_s_per_step)
        except ConfigError as exc:
            print(f"protocol-equal-cost: {exc} (or pass --rates FILE)", file=sys.stderr)
            return 2
    command = "python -m experiments protocol-equal-cost --grids " + " ".join(map(str, args.grids)) + \
        ("" if args.budget == "auto" else f" --budget {args.budget}") + \
        ("" if not args.rates else f" --rates {args.rates}") + \
        ("" if not args.actor_rate_from else " --actor-rate-from " + " ".join(args.actor_rate_from)) + \
        ("" if not args.pricing else " --pricing " + " ".join(args.pricing)) + \
        ("" if args.cut == "interpolate" else f" --cut {args.cut}")
    out = Path(args.out) if args.out else grids[0].parent / f"equal-cost-{grids[0].name}.md"
    parts, results = [f"### Return at equal modelled dollars: {grids[0].name}", "", f"Command: `{command}`", ""], []
    for i, pricing in enumerate(pricings):
        price(runs, rates, pricing)
        try:
            budget = auto_budget(runs) if args.budget == "auto" else float(args.budget)
        except ValueError:
            raise SystemExit(f"--budget: a number of USD or 'auto', got {args.budget!r}") from None
        if not budget > 0:
            raise SystemExit(f"--budget: must be > 0, got {budget}")
        full_text, full = table(runs, budget, rates, args.reps, pricing=pricing, method=args.cut)
        half_text, half = table(runs, budget / 2, rates, args.reps, pricing=pricing, method=args.cut)
        parts += [f"#### Pricing `{pricing.name}`: at the budget B", "", full_text, "",
                  f"#### Pricing `{pricing.name}`: at B/2", "", half_text, ""]
        results.append({"pricing": pricing.to_dict(), "full": full, "half": half})
        if i == 0:
            curves = budget_curves(runs, budget, min(args.reps, CURVE_REPS), args.cut)
            plot_budget_curves(curves, runs, out.with_suffix(".png"),
                               f"{grids[0].name}: final return at equal dollars (pricing {pricing.name}, every run "
                               f"cut at each budget)")
    if len(results) > 1:
        parts += ["#### Does each comparison hold under every pricing?", "", verdict_table(results, runs), ""]
    text = "\n".join(parts)
    print(text)
    out.write_text(text + "\n")
    data = {**results[0]["full"], "curves": curves, "pricings": results}
    out.with_suffix(".json").write_text(json.dumps(data, indent=2, default=float) + "\n")
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
