"""The sequential experiment of issue 40: do the evidence-based scaling policies beat the best fixed count?

    python -m experiments sequential --plan                  # B per environment, the stop and grow settings
    python -m experiments sequential --fit-kappa             # kappa from Hopper-v5 seeds 0-9 (then frozen)
    python -m experiments sequential [--seeds 0-9] [--out docs/results/evidence/sequential-40]

Every run of the issue's grids (ENVS: Hopper-v5 and Walker2d-v5, PPO tuned) is priced round by round at its
environment's pinned reference rates under the `cpu` pricing (experiments/equal_cost.py), so runs compare at
equal reference dollars whatever the machine's load did to their own clocks. B is fixed:8's bill over 100 rounds
(the median over its seeds). A run's primary metric is its mean evaluation return (10 deterministic episodes)
at 8 budget points, 0.3 B to 1.0 B, each interpolated linearly in the run's bill between the evaluations either
side. Each arm is compared seed-paired with the best fixed count of its environment (the fixed arm with the
highest mean metric): the mean difference with a 95% bootstrap CI over seeds, as a share of the best fixed
count's mean, and per budget point.

Stopping rule (the issue's): stop for futility when the best new policy's paired 95% CI against the best fixed
count lies below +5% in both environments; otherwise extend (stage 2). A win: the paired CI above 0 in both
environments, never below 0 at any budget point, and for noise, above noise-replay.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments.equal_cost import DEFAULT_PRICING, PricedRun, final_at, load_runs, price
from experiments.protocol import evaluations, paired_difference
from nitro.cost import (
    Prices,
    ReferenceRates,
    reference_evaluation_seconds,
    reference_round,
)

ROOT = Path(__file__).resolve().parents[1]
GRIDS = ROOT / "docs/results/grids"
EVIDENCE = ROOT / "docs/results/evidence"
POINTS = tuple(round(0.3 + 0.1 * i, 1) for i in range(8))  # 0.3 B ... 1.0 B
FIXED_ARMS = ("fixed:4", "fixed:8", "fixed:16")
NEW_ARMS = ("grow", "noise", "noise-adascale", "noise-replay")
STOP_FACTOR = 1.1  # the harness stops each new arm's job at 1.1 B reference dollars
FUTILITY = 0.05  # stop when the best new policy's CI lies below +5% of the best fixed count in both environments
GROW_AT = (0.4, 0.8)  # grow's doublings at these shares of B


@dataclass(frozen=True)
class Env:
    env_id: str
    slug: str  # the grids' stem: protocol-<slug>-ppo-tuned...
    rates: str  # the pinned reference rates file under docs/results/evidence

    def grids(self) -> list[Path]:
        stem = f"protocol-{self.slug}-ppo-tuned"
        names = [f"{stem}-r100", f"{stem}-r200", f"{stem}-fixed16", f"{stem}-grow", f"{stem}-noise"]
        return [GRIDS / n for n in names if (GRIDS / n / "grid.json").exists()]

    def reference_rates(self) -> ReferenceRates:
        return ReferenceRates(**json.loads((EVIDENCE / self.rates).read_text()))


ENVS = (Env("Hopper-v5", "hopper-v5", "hopper-v5-ppo-tuned-rates.json"),
        Env("Walker2d-v5", "walker2d-v5", "walker2d-v5-ppo-tuned-rates.json"))


def priced_runs(env: Env, seeds: set[int] | None = None) -> list[PricedRun]:
    """The environment's finished runs (arms of this experiment only), priced at its reference rates."""
    runs = [r for r in load_runs(env.grids()) if r.scheme in FIXED_ARMS + NEW_ARMS
            and (seeds is None or r.seed in seeds)]
    price(runs, env.reference_rates(), DEFAULT_PRICING)
    return runs


def budget_b(runs: list[PricedRun]) -> float:
    """fixed:8's bill over 100 rounds: the median over its seeds."""
    bills = [r.cum_usd[99] for r in runs if r.scheme == "fixed:8" and len(r.cum_usd) >= 100]
    if not bills:
        raise SystemExit("no fixed:8 run of 100 rounds: B is undefined")
    return float(np.median(bills))


def returns_at(run: PricedRun, budgets) -> list[float]:
    """The run's evaluation return at each budget, linear in its bill between the evaluations either side (NaN
    before its first evaluation; its last evaluation past its end)."""
    by_round = {int(x.get("round", i)): i for i, x in enumerate(run.rounds)}
    evals = evaluations(run.rounds, run.eval_every)
    bills = [run.cum_usd[by_round[e["round"]]] for e in evals]
    rets = [e["return"] for e in evals]
    return [final_at(bills, rets, b)[0] for b in budgets]


def primary(run: PricedRun, b: float) -> dict:
    """{metric: mean return over the POINTS, at: the return at each point, short: the run ended below B}."""
    at = returns_at(run, [p * b for p in POINTS])
    return {"metric": float(np.mean(at)), "at": at, "short": bool(run.cum_usd[-1] < 0.95 * b)}


def compare_env(runs: list[PricedRun], reps: int = 2000) -> dict:
    """Per arm: the per-seed metric; against the best fixed count: the seed-paired difference (absolute, share
    of the best fixed count's mean) overall and at each budget point; noise against noise-replay."""
    b = budget_b(runs)
    per = {}
    for r in runs:
        per.setdefault(r.scheme, {})[r.seed] = primary(r, b)
    arms = {a: {"seeds": sorted(v), "mean": float(np.mean([x["metric"] for x in v.values()])),
                "short": sorted(s for s, x in v.items() if x["short"])} for a, v in per.items()}
    fixed = [a for a in FIXED_ARMS if a in per]
    best = max(fixed, key=lambda a: arms[a]["mean"])
    base = arms[best]["mean"]
    for a, v in per.items():
        metric = {s: x["metric"] for s, x in v.items()}
        ref = {s: x["metric"] for s, x in per[best].items()}
        d = paired_difference(metric, ref, reps=reps) if a != best else None
        if d is not None:
            d.update(rel_mean=d["mean"] / base, rel_low=d["low"] / base, rel_high=d["high"] / base)
        arms[a]["vs_best_fixed"] = d
        arms[a]["by_point"] = [paired_difference({s: x["at"][i] for s, x in v.items()},
                                                 {s: x["at"][i] for s, x in per[best].items()}, reps=reps)
                               if a != best else None for i in range(len(POINTS))]
    if "noise" in per and "noise-replay" in per:
        arms["noise"]["vs_noise_replay"] = paired_difference(
            {s: x["metric"] for s, x in per["noise"].items()},
            {s: x["metric"] for s, x in per["noise-replay"].items()}, reps=reps)
    return {"budget_usd": b, "best_fixed": best, "arms": arms}


def decide(results: dict[str, dict]) -> dict:
    """The issue's rule over the environments' comparisons: futility, a win, or extend."""
    new = sorted({a for r in results.values() for a in r["arms"] if a in NEW_ARMS and a != "noise-replay"})
    complete = [a for a in new if all(a in r["arms"] and r["arms"][a].get("vs_best_fixed") for r in results.values())]
    if not complete:
        return {"decision": "incomplete", "why": "no new policy has been run in every environment yet"}

    def mean_rel(a):
        return float(np.mean([r["arms"][a]["vs_best_fixed"]["rel_mean"] for r in results.values()]))

    best = max(complete, key=mean_rel)
    highs = {e: r["arms"][best]["vs_best_fixed"]["rel_high"] for e, r in results.items()}
    wins = []
    for a in complete:
        rows = [r["arms"][a] for r in results.values()]
        above = all(x["vs_best_fixed"]["low"] > 0 for x in rows)
        never_below = all(p is None or p["high"] >= 0 for x in rows for p in x["by_point"])
        signal = a != "noise" or all((x.get("vs_noise_replay") or {}).get("low", -1.0) > 0 for x in rows)
        if above and never_below and signal:
            wins.append(a)
    if wins:
        return {"decision": "win", "policies": wins, "best": best}
    if all(h < FUTILITY for h in highs.values()):
        return {"decision": "futility", "best": best, "rel_high": highs,
                "why": f"the best new policy ({best}): paired 95% CI below +{FUTILITY:.0%} of the best fixed count "
                       "in every environment"}
    return {"decision": "extend", "best": best, "rel_high": highs}


# -- planning the grids and fitting kappa ---------------------------------------------------------------------

def plan_settings() -> dict:
    """Per environment: B, the harness's stop (STOP_FACTOR x B), and grow's rounds and fractions that put its
    doublings at GROW_AT of B at reference rates (with the mean evaluation time per round of the fixed:8 runs)."""
    out = {}
    for env in ENVS:
        runs = [r for r in priced_runs(env) if r.scheme == "fixed:8"]
        b = budget_b(runs)
        rates = env.reference_rates()
        ev = float(np.mean([np.mean(reference_evaluation_seconds(r.rounds, rates, r.steps_per_actor)) for r in runs]))
        steps = runs[0].steps_per_actor
        per_round = {n: reference_round(n, steps, n, rates, Prices(), evaluation_s=ev)[1] for n in (4, 8, 16)}
        r1 = GROW_AT[0] * b / per_round[4]
        r2 = r1 + (GROW_AT[1] - GROW_AT[0]) * b / per_round[8]
        total = r2 + (STOP_FACTOR - GROW_AT[1]) * b / per_round[16]
        out[env.env_id] = {"B": b, "stop_usd": STOP_FACTOR * b, "grow_rounds": math.ceil(total),
                           "grow_f1": r1 / math.ceil(total), "grow_f2": r2 / math.ceil(total),
                           "usd_per_round": per_round, "evaluation_s_per_round": ev}
    return out


def online_costs(rnd: dict, prices: Prices = Prices()) -> tuple[float, float]:
    """(a, c) as the scaler prices a round from its report (nitro.cost.round_and_sample_costs with the round's
    own actor bill per step in place of the ledger's average)."""
    from nitro.cost import round_and_sample_costs

    cloud = rnd.get("cloud_phases") or {}
    steps = int(rnd.get("env_steps") or 0)
    round_s = float(rnd.get("cloud_round_seconds") or 0.0)
    spa = max(1, steps // max(1, int(rnd.get("actors_completed") or rnd.get("actors_launched") or 1)))
    per_actor = float(rnd.get("cloud_actor_cost_usd") or 0.0) / max(1, steps) * spa
    return round_and_sample_costs(per_actor, round_s, float(cloud.get("update", 0.0)), steps, spa, prices)


def fit_kappa(seeds=range(10), ema_weight: float | None = None, source: str = "grow") -> dict:
    """kappa from Hopper-v5 seeds 0-9: noise should switch from 4 to 8 actors (the pow2 boundary 4 sqrt 2) at the
    spend b* where fixed:8's return overtakes fixed:4's for good (their seed-mean curves at equal reference
    dollars), with the policy's noise scale there and the a and c a run sees there. The noise scale is read from
    the `source` arm's runs (grow: the first arm run with the learner's fixed-parameter probe,
    nitro.algos.ppo.policy_noise_probe) at the env steps fixed:8 has taken at b*, averaged as the policy
    averages them (nitro.scaling.noise.ema_terms), the median over the runs."""
    from nitro.contracts import NOISE_EMA
    from nitro.scaling.noise import b_simple_of, ema_terms

    weight = NOISE_EMA if ema_weight is None else ema_weight
    env = ENVS[0]
    runs = priced_runs(env, set(seeds))
    b = budget_b(runs)
    grid = np.linspace(0.05, 1.0, 96) * b
    mean = {a: np.nanmean([returns_at(r, grid) for r in runs if r.scheme == a], axis=0) for a in ("fixed:4", "fixed:8")}
    ahead = mean["fixed:8"] > mean["fixed:4"]
    last_behind = np.flatnonzero(~ahead)
    i = int(last_behind[-1]) + 1 if len(last_behind) else 0
    if i >= len(grid):
        raise SystemExit("fixed:8 never overtakes fixed:4 for good: kappa cannot be fitted this way")
    b_star = float(grid[i])
    steps_at = [np.interp(b_star, r.cum_usd, np.cumsum([x.get("env_steps", 0) for x in r.rounds]))
                for r in runs if r.scheme == "fixed:8"]
    n_star = float(np.median(steps_at))
    b_noise, a_c = [], []
    for r in (r for r in runs if r.scheme == source):
        avg, total = None, 0
        for rnd in r.rounds:  # the noise policy's average of the policy gradient's terms, as it would keep it
            terms = (float(rnd.get("policy_grad_sq") or 0.0), float(rnd.get("policy_trace_sigma") or 0.0))
            avg = ema_terms(avg, terms if any(terms) else None, weight)
            total += int(rnd.get("env_steps") or 0)
            a, c = online_costs(rnd)
            if total >= n_star:
                noise = b_simple_of(avg)
                if noise is not None and a > 0 and c > 0:
                    b_noise.append(noise)
                    a_c.append(a / c)
                break
    if not b_noise:
        raise SystemExit(f"no {source} run with a defined policy noise scale reaches b*: run its grid first")
    steps = runs[0].steps_per_actor
    boundary = 4 * math.sqrt(2) * steps  # samples at which pow2 turns 4 actors into 8
    b_med, ac_med = float(np.median(b_noise)), float(np.median(a_c))
    return {"kappa": boundary / math.sqrt(b_med * ac_med), "b_star_usd": b_star, "b_star_share": b_star / b,
            "env_steps_at_b_star": n_star, "policy_b_simple_ema": b_med, "a_over_c": ac_med,
            "source": source, "source_runs": len(b_noise), "seeds": sorted(set(seeds)), "ema_weight": weight}


# -- why noise grows as it does ---------------------------------------------------------------------------

SPIKE, SPIKE_WINDOW = 3.0, 10  # a spike: a plan's noise scale above 3x the median of the 10 plans before it


def planned_noise_scales(rounds: list[dict]) -> np.ndarray:
    """The noise scale each round's plan read (the scaler's EMA of the policy gradient's terms), from its reason
    ("noise: B_simple=... (averaged terms), ..."), NaN where the plan gave none."""
    found = (re.search(r"B_simple=([0-9.e+-]+) \(averaged terms\)", r.get("scaler_reason") or "") for r in rounds)
    return np.array([float(m.group(1)) if m else math.nan for m in found])


def ratchet(run: PricedRun, spike: float = SPIKE) -> dict:
    """A noise run's plans: the noise scale's median, 90th percentile and largest value (with its round), the
    rounds where the actor count went up, and which of those a spike drove (a value above `spike` x the median of
    the SPIKE_WINDOW plans before it; the scale's own growth is about 2x over as many rounds): noise never lowers
    the count, so one spike sets every later round."""
    b = planned_noise_scales(run.rounds)
    nxt = [int(r.get("next_actors") or 0) for r in run.rounds]
    ups = [k for k in range(len(nxt)) if nxt[k] > (nxt[k - 1] if k else run.i_min)]
    spikes = [k for k in ups if np.isfinite(b[k]) and np.isfinite(b[max(0, k - SPIKE_WINDOW):k]).any()
              and b[k] > spike * np.nanmedian(b[max(0, k - SPIKE_WINDOW):k])]
    ok = np.isfinite(b)
    peak = int(np.nanargmax(b)) if ok.any() else -1
    return {"seed": run.seed, "rounds": len(run.rounds), "median": float(np.nanmedian(b)) if ok.any() else math.nan,
            "p90": float(np.nanpercentile(b, 90)) if ok.any() else math.nan,
            "max": float(b[peak]) if peak >= 0 else math.nan, "max_round": peak, "final_actors": nxt[-1] if nxt else 0,
            "ups": ups, "spike_ups": spikes}


def ratchet_report(runs_by_env: dict[str, list[PricedRun]]) -> list[str]:
    lines = ["#### noise's actor counts: what its plans read", "",
             "| environment | seed | rounds | noise scale: median / p90 / max (round) | final actors | count raised at "
             "rounds (a spike drove: *) |", "|---|---:|---:|---|---:|---|"]
    for env_id, runs in runs_by_env.items():
        for r in sorted((r for r in runs if r.scheme == "noise"), key=lambda r: r.seed):
            x = ratchet(r)
            ups = ", ".join(f"{k}*" if k in x["spike_ups"] else str(k) for k in x["ups"]) or "none"
            lines.append(f"| {env_id} | {x['seed']} | {x['rounds']} | {x['median']:,.0f} / {x['p90']:,.0f} / "
                         f"{x['max']:,.0f} ({x['max_round']}) | {x['final_actors']} | {ups} |")
    return lines + ["", f"A spike: a plan's noise scale above {SPIKE:g}x the median of the {SPIKE_WINDOW} plans before"
                    " it."
                    " noise never lowers the count (docs/scaling.md), so the largest value a run's EMA reaches sets"
                    " its actors from then on.", ""]


# -- the report ---------------------------------------------------------------------------------------------

def _cell(d: dict | None, rel: bool = True) -> str:
    if not d:
        return "—"
    if rel and "rel_mean" in d:
        return f"{d['mean']:+.0f} [{d['low']:+.0f}, {d['high']:+.0f}] ({d['rel_mean']:+.1%} [{d['rel_low']:+.1%}, " \
               f"{d['rel_high']:+.1%}]), {d['wins']}/{d['seeds']}"
    return f"{d['mean']:+.0f} [{d['low']:+.0f}, {d['high']:+.0f}], {d['wins']}/{d['seeds']}"


def report(results: dict[str, dict], verdict: dict, command: str, extra: list[str] = ()) -> str:
    lines = ["### Growing rounds against the best fixed count (issue 40)", "", f"Command: `{command}`", ""]
    for env_id, r in results.items():
        lines += [f"#### {env_id}: B = ${r['budget_usd']:.5f}; best fixed count {r['best_fixed']}", "",
                  "| arm | seeds | primary metric, mean | minus the best fixed count, seed-paired [95% CI] (share), "
                  "wins | below it at a budget point | against noise-replay |", "|---|---:|---:|---|---|---|"]
        order = [a for a in FIXED_ARMS + NEW_ARMS if a in r["arms"]]
        for a in order:
            x = r["arms"][a]
            below = [f"{p:.1f}B" for p, d in zip(POINTS, x["by_point"]) if d and d["high"] < 0]
            short = f" ({len(x['short'])} short)" if x["short"] else ""
            lines.append(f"| {a} | {len(x['seeds'])}{short} | {x['mean']:.0f} | {_cell(x.get('vs_best_fixed'))} | "
                         f"{', '.join(below) or 'none'} | {_cell(x.get('vs_noise_replay'), rel=False)} |")
        lines.append("")
    lines += list(extra)
    lines += [f"**Decision: {verdict['decision']}**" + (f" ({verdict.get('why')})" if verdict.get("why") else ""), "",
              "Primary metric: a run's mean evaluation return (10 deterministic episodes) at 0.3 B, 0.4 B, ..., 1.0 B "
              "reference dollars (`cpu` pricing, the environment's pinned rates), each interpolated in the run's "
              "bill; B = fixed:8's median bill over 100 rounds. CIs: 95% percentile bootstrap over seeds of the "
              "seed-paired difference; share = of the best fixed count's mean. 'below at a budget point': the paired "
              "CI at that point lies below 0. 'short': runs whose whole bill stayed below 0.95 B."]
    return "\n".join(lines) + "\n"


def plot(runs_by_env: dict[str, list[PricedRun]], path: Path) -> Path:
    """Per environment: each arm's mean evaluation return against reference dollars (in B) and its actors per
    round against dollars, over its seeds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.5 * len(runs_by_env)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(runs_by_env), 2, squeeze=False)
    grid = np.linspace(0.05, 1.1, 64)
    for (env_id, runs), (ret_ax, act_ax) in zip(runs_by_env.items(), axes):
        b = budget_b(runs)
        for arm in FIXED_ARMS + NEW_ARMS:
            mine = [r for r in runs if r.scheme == arm]
            if not mine:
                continue
            curve = np.nanmean([returns_at(r, grid * b) for r in mine], axis=0)
            ret_ax.plot(grid, curve, label=f"{arm} ({len(mine)})")
            acts = [np.interp(grid * b, r.cum_usd, [x.get("actors_launched", 0) for x in r.rounds],
                              right=np.nan) for r in mine]
            with warnings.catch_warnings():  # past a run's end its actors are NaN; all-NaN columns stay NaN
                warnings.simplefilter("ignore", RuntimeWarning)
                act_ax.plot(grid, np.nanmean(acts, axis=0), label=arm)
        for ax in (ret_ax, act_ax):
            ax.axvspan(POINTS[0], POINTS[-1], color="0.92", zorder=0)
            ax.set_xlabel(f"reference dollars, in B (${b:.5f})")
        ret_ax.set_ylabel(f"{env_id}: evaluation return (seed mean)")
        act_ax.set_ylabel("actors per round (seed mean)")
        ret_ax.legend(loc="upper left", fontsize=8)
    fig.savefig(path, dpi=110)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments sequential", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", action="store_true", help="print B, the stop and grow's settings per environment")
    p.add_argument("--fit-kappa", action="store_true", help="fit kappa on Hopper-v5 seeds 0-9")
    p.add_argument("--seeds", default="0-9", help="seeds to compare, e.g. 0-9 or 0-29 (default %(default)s)")
    p.add_argument("--reps", type=int, default=2000)
    p.add_argument("--out", help="write <out>.md and <out>.json")
    args = p.parse_args(argv)
    if args.plan:
        print(json.dumps(plan_settings(), indent=1))
        return 0
    if args.fit_kappa:
        print(json.dumps(fit_kappa(), indent=1))
        return 0
    lo, _, hi = args.seeds.partition("-")
    seeds = set(range(int(lo), int(hi or lo) + 1))
    runs = {e.env_id: priced_runs(e, seeds) for e in ENVS}
    results = {env_id: compare_env(r, reps=args.reps) for env_id, r in runs.items()}
    verdict = decide(results)
    command = "python -m experiments sequential " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(results, verdict, command, ratchet_report(runs))
    print(text)
    if args.out:
        Path(args.out + ".md").write_text(text)
        Path(args.out + ".json").write_text(json.dumps({"results": results, "decision": verdict}, indent=1,
                                                       default=float) + "\n")
        print(f"curves: {plot(runs, Path(args.out + '.png'))}")
    return 0
