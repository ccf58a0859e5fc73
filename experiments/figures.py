"""One command per figure of the paper's evaluation, scaled to a 2-core machine.

    python -m experiments fig10 [--seeds 3] [--rounds 15]   # PPO: nitro vs fixed:I_min vs fixed:16 vs max
    python -m experiments fig11                             # the same with IMPACT
    python -m experiments fig15                             # nitro vs hydrozoa vs kungfu vs minions
    python -m experiments fig17                             # ablation: w/o boosting, w/o serverless
    python -m experiments fig18                             # actor scalability on the local endpoint
    python -m experiments fig20                             # per-phase latency breakdown

Runs land in results/experiments/<figure>/ (resumable); plots and tables in
docs/results/. The scale (rounds, steps per actor, I_min/I_max, seeds) is
printed with every figure and written next to it.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from experiments.harness import Run, load_rounds, run_grid

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "experiments"
DOCS = ROOT / "docs" / "results"

ENV = "Hopper-v5"
I_MIN, I_MAX, STEPS = 4, 32, 256


def _scale(rounds: int, seeds: int) -> str:
    return (f"{ENV}, {rounds} rounds, {STEPS} steps per actor, I_min={I_MIN}, I_max={I_MAX}, "
            f"{seeds} seeds, 2-core machine, local Lambda endpoint")


def _grid(figure: str, algo: str, schemes: list[str], seeds: int, rounds: int, preset: str, **extra) -> list[Run]:
    return [Run(figure, ENV, algo, scheme, seed, rounds, STEPS, I_MIN, I_MAX, preset=preset, extra=extra)
            for scheme in schemes for seed in range(seeds)]


def _mean_std(values: list[float]) -> tuple[float, float]:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), statistics.pstdev(vals) if len(vals) > 1 else 0.0


def _curves(out: Path, runs: list[Run]) -> dict[str, dict]:
    """Per scheme: eval return per round (mean, std over seeds), actors per round, cost, wall time."""
    by: dict[str, list[list[dict]]] = {}
    for run in runs:
        by.setdefault(run.scaler, []).append(load_rounds(out, run))
    curves = {}
    for scheme, seed_rounds in by.items():
        n = min(len(r) for r in seed_rounds)
        curves[scheme] = {
            "eval": [_mean_std([r[i]["eval_return"] for r in seed_rounds]) for i in range(n)],
            "actors": [statistics.fmean(r[i]["actors_launched"] for r in seed_rounds) for i in range(n)],
            "cost": _mean_std([r[-1]["total_cost_usd"] for r in seed_rounds]),
            "serverful": _mean_std([r[-1]["serverful_cost_usd"] for r in seed_rounds]),
            "final": _mean_std([r[-1]["eval_return"] for r in seed_rounds]),
            "best": _mean_std([max(x["eval_return"] for x in r) for r in seed_rounds]),
            "steps": _mean_std([r[-1]["total_env_steps"] for r in seed_rounds]),
            "wall": _mean_std([sum(x["round_seconds"] for x in r) for r in seed_rounds]),
            "rounds": seed_rounds,
        }
    return curves


def _plot_schemes(curves: dict[str, dict], title: str, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    ret, actors, cost = fig.subplots(1, 3, gridspec_kw={"width_ratios": [2, 1.4, 1]})
    for scheme, c in curves.items():
        xs = list(range(len(c["eval"])))
        m = [v[0] for v in c["eval"]]
        s = [v[1] for v in c["eval"]]
        ret.plot(xs, m, label=scheme)
        ret.fill_between(xs, [a - b for a, b in zip(m, s)], [a + b for a, b in zip(m, s)], alpha=0.15)
        actors.step(xs, c["actors"], where="mid", label=scheme)
    ret.set_xlabel("round")
    ret.set_ylabel("eval return (mean ± std over seeds)")
    ret.legend(fontsize=8)
    actors.set_xlabel("round")
    actors.set_ylabel("actors per round (mean)")
    names = list(curves)
    cost.bar(names, [curves[n]["cost"][0] for n in names], yerr=[curves[n]["cost"][1] for n in names])
    cost.set_ylabel("total cost (USD)")
    cost.tick_params(axis="x", rotation=45, labelsize=8)
    fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)


def _table(curves: dict[str, dict]) -> str:
    lines = ["| scheme | final eval return | best eval return | env steps | total cost (USD) | "
             "serverful comparator (USD) | wall time (s) |", "|---|---|---|---|---|---|---|"]
    for scheme, c in curves.items():
        def f(pair, fmt="{:.1f}"):
            return f"{fmt.format(pair[0])} ± {fmt.format(pair[1])}"
        lines.append(f"| {scheme} | {f(c['final'])} | {f(c['best'])} | {f(c['steps'], '{:.0f}')} | "
                     f"{f(c['cost'], '{:.4f}')} | {f(c['serverful'], '{:.4f}')} | {f(c['wall'], '{:.0f}')} |")
    return "\n".join(lines)


def _write(name: str, title: str, scale: str, table: str, extra: dict | None = None) -> None:
    DOCS.mkdir(parents=True, exist_ok=True)
    (DOCS / f"{name}.md").write_text(f"### {title}\n\nScale: {scale}.\n\n{table}\n")
    if extra is not None:
        (DOCS / f"{name}.json").write_text(json.dumps(extra, indent=2, default=str) + "\n")
    print(f"\n{title}\nScale: {scale}\n{table}\nplot: {DOCS / (name + '.png')}")


def scheme_figure(name: str, algo: str, schemes: list[str], seeds: int, rounds: int, preset: str,
                  title: str) -> dict[str, dict]:
    runs = _grid(name, algo, schemes, seeds, rounds, preset)
    out = RESULTS / name
    run_grid(runs, out)
    curves = _curves(out, runs)
    _plot_schemes(curves, f"{title} — {_scale(rounds, seeds)}", DOCS / f"{name}.png")
    _write(name, title, _scale(rounds, seeds), _table(curves),
           {s: {k: v for k, v in c.items() if k != "rounds"} for s, c in curves.items()})
    return curves


def fig10(seeds: int = 3, rounds: int = 15) -> dict:
    return scheme_figure("fig10", "ppo", ["nitro", f"fixed:{I_MIN}", "fixed:16", "max"], seeds, rounds, "tuned",
                         "Figures 10/14: PPO with Nitro vs fixed actor counts")


def fig11(seeds: int = 3, rounds: int = 15) -> dict:
    return scheme_figure("fig11", "impact", ["nitro", f"fixed:{I_MIN}", "fixed:16", "max"], seeds, rounds, "tuned",
                         "Figure 11: IMPACT with Nitro vs fixed actor counts")


def fig15(seeds: int = 3, rounds: int = 15) -> dict:
    """nitro vs hydrozoa vs kungfu (vs minions, with its pre-training cost shown separately)."""
    schemes = ["nitro", "hydrozoa", "kungfu"]
    extra_runs: list[Run] = []
    pretrain = _minions_checkpoint()
    if pretrain is not None:
        extra_runs = [Run("fig15", ENV, "ppo", "minions", seed, rounds, STEPS, I_MIN, I_MAX,
                          extra={"scaler": {"scheduler": pretrain["path"]}}) for seed in range(seeds)]
    runs = _grid("fig15", "ppo", schemes, seeds, rounds, "tuned", scaler={"period": 4}) + extra_runs
    out = RESULTS / "fig15"
    run_grid(runs, out)
    curves = _curves(out, runs)
    _plot_schemes(curves, f"Figure 15: scaling schemes — {_scale(rounds, seeds)}", DOCS / "fig15.png")
    table = _table(curves)
    if pretrain is not None:
        table += (f"\n\nminions pre-training (not in the table above; add it to minions' cost): "
                  f"{pretrain['episodes']} episodes, {pretrain['wall_s']:.0f} s, ${pretrain['cost_usd']:.4f}; "
                  f"minions total with pre-training: ${curves['minions']['cost'][0] + pretrain['cost_usd']:.4f} "
                  f"per run (pre-training amortised over no other jobs)")
    _write("fig15", "Figure 15: Nitro vs Hydrozoa vs KungFu vs MinionsRL", _scale(rounds, seeds), table,
           {"pretrain": pretrain, **{s: {k: v for k, v in c.items() if k != "rounds"} for s, c in curves.items()}})
    return curves


def _minions_checkpoint() -> dict | None:
    """Pre-train the MinionsRL scheduler once, in process, on the figure's own environment and scale
    (docs/minions.md: a scheduler pre-trained on CartPole never asked for more than I_min here)."""
    out = RESULTS / "fig15" / "minions-scheduler.npz"
    info_path = out.with_suffix(".json")
    if info_path.exists():
        info = json.loads(info_path.read_text())
        if info.get("env_id") == ENV:
            return info
    from nitro.scaling.minions import format_distribution
    from nitro.training.minions_pretrain import PretrainSettings, pretrain

    settings = PretrainSettings(env_id=ENV, episodes=32, rounds_per_episode=5, i_max=I_MAX, steps_per_actor=STEPS,
                                out=str(out), seed=0)
    res = pretrain(settings)
    info = {"path": str(res.path), "env_id": ENV, "episodes": settings.episodes, "wall_s": res.wall_seconds,
            "cpu_s": res.cpu_seconds, "cost_usd": res.cost_usd,
            "decisions": {k: format_distribution(v) for k, v in res.decisions.items()}}
    info_path.parent.mkdir(parents=True, exist_ok=True)
    info_path.write_text(json.dumps(info, indent=2) + "\n")
    return info


def fig17(seeds: int = 3, rounds: int = 15) -> None:
    """Ablation from the fig10 runs: w/o boosting = fixed:16 (paper 8.5), w/o serverless = the same nitro run
    billed as an actor VM fleet sized for I_max, whose startup delay is added to the wall time."""
    from nitro.cost import Prices

    curves = fig10(seeds, rounds)
    prices = Prices()
    nitro = curves["nitro"]
    rows = {
        "nitro": (nitro["final"], nitro["cost"], nitro["wall"]),
        "nitro w/o boosting (fixed:16)": (curves["fixed:16"]["final"], curves["fixed:16"]["cost"],
                                          curves["fixed:16"]["wall"]),
        "nitro w/o serverless (actor VM)": (nitro["final"], nitro["serverful"],
                                            (nitro["wall"][0] + prices.actor_vm_startup_s, nitro["wall"][1])),
    }
    lines = ["| variant | final eval return | total cost (USD) | wall time (s) |", "|---|---|---|---|"]
    for k, (ret, cost, wall) in rows.items():
        lines.append(f"| {k} | {ret[0]:.1f} ± {ret[1]:.1f} | {cost[0]:.4f} ± {cost[1]:.4f} | {wall[0]:.0f} |")
    _bar(rows, DOCS / "fig17.png", f"Figure 17: ablation — {_scale(rounds, seeds)}")
    _write("fig17", "Figure 17: ablation (without boosting, without serverless)", _scale(rounds, seeds),
           "\n".join(lines))


def _bar(rows: dict, path: Path, title: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.2), layout="constrained")
    FigureCanvasAgg(fig)
    a, b = fig.subplots(1, 2)
    names = list(rows)
    a.bar(names, [rows[n][0][0] for n in names], yerr=[rows[n][0][1] for n in names])
    a.set_ylabel("final eval return")
    b.bar(names, [rows[n][1][0] for n in names], yerr=[rows[n][1][1] for n in names])
    b.set_ylabel("total cost (USD)")
    for ax in (a, b):
        ax.tick_params(axis="x", rotation=15, labelsize=7)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=80)


def fig20(seeds: int = 3, rounds: int = 15) -> None:
    """Per-phase latency of a round (from the fig10 nitro runs) and the detector overhead ablation."""
    curves = fig10(seeds, rounds)
    phases: dict[str, list[float]] = {}
    for seed_rounds in curves["nitro"]["rounds"]:
        for r in seed_rounds:
            for p, s in (r.get("phases") or {}).items():
                phases.setdefault(p, []).append(s)
    means = {p: statistics.fmean(v) for p, v in phases.items()}
    total = sum(means.values())
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 2.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    left = 0.0
    for p, s in sorted(means.items(), key=lambda kv: -kv[1]):
        ax.barh(["round"], [s], left=left, label=f"{p} {s:.2f}s")
        left += s
    ax.set_xlabel("seconds (mean over rounds and seeds)")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    fig.suptitle("Figure 20(a): latency breakdown of one nitro round (PPO, Hopper-v5)", fontsize=10)
    fig.savefig(DOCS / "fig20.png", dpi=80)
    overhead = sum(s for p, s in means.items() if p not in ("sample", "update", "evaluate"))
    lines = ["| phase | mean seconds per round | share |", "|---|---|---|"]
    lines += [f"| {p} | {s:.3f} | {s / total:.1%} |" for p, s in sorted(means.items(), key=lambda kv: -kv[1])]
    lines.append(f"\nOverhead outside sample/update/evaluate: {overhead / total:.1%} of the round.")
    _write("fig20", "Figure 20(a): per-phase latency breakdown", _scale(rounds, seeds), "\n".join(lines),
           {"phase_means_s": means})


def fig18(sizes=(100, 200, 400, 700, 1000), steps: int = 256) -> None:
    """Actor scalability: total time of a group of N concurrent invocations, invoke -> all batches in Redis.

    1,000 real Hopper actors cannot run at once on 2 cores, so each invocation is a calibrated stand-in
    (experiments/standin.py): it sleeps for the measured duration of a real Hopper actor invocation of
    `steps` steps and pushes a real-size signed batch. The local endpoint runs up to 64 worker processes,
    so beyond 64 invocations queue for a worker; on AWS every invocation gets its own environment.
    """
    from experiments.scalability import measure

    rows = measure(sizes, steps)
    lines = ["| concurrent invocations | total execution time (s) | ideal (one actor's duration, s) | "
             "batches received |", "|---|---|---|---|"]
    lines += [f"| {r['n']} | {r['total_s']:.2f} | {r['actor_s']:.3f} | {r['received']} |" for r in rows]
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot([r["n"] for r in rows], [r["total_s"] for r in rows], marker="o", label="local endpoint, 64 workers")
    ax.plot([r["n"] for r in rows], [r["n"] / 64 * r["actor_s"] for r in rows], ls="--",
            label="N/64 x actor duration")
    ax.set_xlabel("concurrent actor invocations")
    ax.set_ylabel("total execution time (s)")
    ax.legend(fontsize=8)
    fig.suptitle("Figure 18: actor scalability (calibrated Hopper stand-in)", fontsize=9)
    DOCS.mkdir(parents=True, exist_ok=True)
    fig.savefig(DOCS / "fig18.png", dpi=80)
    _write("fig18", "Figure 18: actor scalability", f"stand-in calibrated to a real Hopper-v5 actor of {steps} "
           "steps; local endpoint with 64 worker processes", "\n".join(lines), {"rows": rows})


FIGURES = {"fig10": fig10, "fig11": fig11, "fig15": fig15, "fig17": fig17, "fig18": fig18, "fig20": fig20}
