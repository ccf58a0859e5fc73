"""`nitro train --seeds N`: one spec over N seeds at once, within the one budget the spec names, summarised.

The seeds are the spec's seed and the N-1 after it; job ids are GROUP-s<seed>, GROUP being --job-id or a new id.
The budget (--budget, else the spec's default) is the group's: each job gets an equal share, so every seed runs
under the same constraint (a final return measured at a different spend would not be the same experiment), and
each job's own budget guard keeps it within its share (docs/cost.md). The final return of a job is the
evaluation return of its last evaluated round; the group's is their interquartile mean with a 95% percentile
interval from a stratified bootstrap over seeds (nitro.stats). results/GROUP/ holds seeds.json, seeds.png and
one folder per job (as `nitro train` writes it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from nitro import stats
from nitro.client.commands.common import CliError
from nitro.client.commands.follow import FollowOptions
from nitro.client.multirun import JobRun, NextJob, final_return, json_safe, run_jobs
from nitro.client.sdk import NitroClient
from nitro.spec import TrainingSpec, new_job_id

MAX_SEEDS = 64


def check_seeds(n: int) -> None:
    if not 2 <= n <= MAX_SEEDS:
        raise CliError(f"--seeds: must be an integer in [2, {MAX_SEEDS}] (one seed is plain `nitro train`), got {n}",
                       exit_code=2)


def seed_jobs(spec: dict, n: int) -> tuple[str, float, list[NextJob]]:
    """(group id, the group's budget, one job per seed): `spec` with seed s0 + i, job id GROUP-s<seed> and an
    equal share of the budget."""
    check_seeds(n)
    first = int(spec.get("seed", TrainingSpec.seed))
    total = float(spec.get("budget_usd", TrainingSpec.budget_usd))
    last_suffix = f"-s{first + n - 1}"
    group = spec.get("job_id") or new_job_id(spec.get("env_id") or spec.get("preset") or "seeds")
    group = group[:64 - len(last_suffix)]  # every GROUP-s<seed> stays a valid job id (64 characters at most)
    jobs = []
    for seed in range(first, first + n):
        job = {**spec, "seed": seed, "job_id": f"{group}-s{seed}", "budget_usd": total / n}
        jobs.append(NextJob(seed, job, total / n))
    return group, total, jobs


def summarise(group: str, runs: list[JobRun], budget_usd: float, reps: int = stats.BOOTSTRAP_REPS) -> dict:
    """seeds.json: every job, and the final return's IQM with its interval over the jobs that have one."""
    spec = runs[0].spec if runs else {}
    finals = [r.final_return for r in runs]
    counted = [f for f in finals if math.isfinite(f)]
    ci = stats.iqm_interval(counted, reps=reps)
    curves = []
    for r in runs:
        evals = [(x.round, x.eval_return) for x in r.reports if x.evaluated and math.isfinite(x.eval_return)]
        if evals:
            curves.append(([x for x, _ in evals], [y for _, y in evals]))
    return {
        "group": group,
        "env_id": spec.get("env_id", ""),
        "preset": spec.get("preset", ""),
        "seeds": [r.key for r in runs],
        "budget_usd": budget_usd,
        "budget_per_seed_usd": budget_usd / len(runs) if runs else None,
        "cloud_total_cost_usd": sum(r.cloud_cost_usd for r in runs),
        "final_return": {
            "iqm": ci.point, "ci_low": ci.low, "ci_high": ci.high, "confidence": ci.confidence, "reps": ci.reps,
            "runs": len(counted),
            "mean": float(np.mean(counted)) if counted else math.nan,
            "median": float(np.median(counted)) if counted else math.nan,
            "method": "interquartile mean over seeds; percentile interval of a stratified bootstrap over seeds "
                      "(nitro.stats); a job's final return is its last evaluated round's eval_return",
        },
        "curve": stats.iqm_curve(curves, reps=max(1, reps // 4)),  # eval return by round, IQM over seeds
        "jobs": [{"seed": r.key, "job_id": r.job_id, "state": r.state,
                  "message": str(r.status.message) if r.status is not None else r.error,
                  "rounds": r.rounds, "final_return": f, "cloud_cost_usd": r.cloud_cost_usd,
                  "results_dir": str(r.results_dir) if r.results_dir else ""} for r, f in zip(runs, finals)],
    }


def plot_seeds(path: Path, summary: dict, runs: list[JobRun]) -> Path:
    """Left: each seed's evaluation return by round, and their IQM with its band. Right: each seed's final
    return, and the IQM with its interval."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    curves, finals = fig.subplots(1, 2, width_ratios=(3, 1))
    for r in runs:
        pts = [(x.round, x.eval_return) for x in r.reports if x.evaluated]
        if pts:
            curves.plot(*zip(*pts), lw=0.8, alpha=0.5, label=f"seed {r.key}")
    curve = summary.get("curve")
    if curve:
        curves.plot(curve["x"], curve["iqm"], color="black", lw=2, label="IQM")
        curves.fill_between(curve["x"], curve["low"], curve["high"], color="black", alpha=0.15, label="95% CI")
    curves.set_xlabel("round")
    curves.set_ylabel("evaluation return")
    curves.legend(loc="best", fontsize="small")
    fr = summary["final_return"]
    ys = [j["final_return"] for j in summary["jobs"] if math.isfinite(j["final_return"])]
    finals.scatter(np.zeros(len(ys)), ys, alpha=0.6, label="seeds")
    if math.isfinite(fr["iqm"]):
        finals.errorbar([0.25], [fr["iqm"]], yerr=[[fr["iqm"] - fr["ci_low"]], [fr["ci_high"] - fr["iqm"]]],
                        fmt="o", color="black", capsize=4, label="IQM, 95% CI")
    finals.set_xlim(-0.5, 0.75)
    finals.set_xticks([])
    finals.set_ylabel("final return")
    finals.legend(loc="best", fontsize="small")
    fig.suptitle(f"{summary['group']}: {summary['env_id'] or summary['preset']}, {len(runs)} seeds")
    fig.savefig(path, dpi=100)
    return path


def _num(v: float, fmt: str = ".2f") -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and math.isfinite(v) else "n/a"


def table(summary: dict, out: Path) -> str:
    """The lines printed at the end: a row per seed, then the aggregate."""
    rows = [f"seeds of {summary['group']} ({summary['env_id'] or summary['preset']}): "
            f"${summary['budget_usd']:g} split ${summary['budget_per_seed_usd']:g} per seed",
            f"  {'seed':>6}  {'job':<32} {'state':<11} {'rounds':>6}  {'final return':>12}  {'cloud $':>9}"]
    for j in summary["jobs"]:
        rows.append(f"  {j['seed']:>6}  {j['job_id'] or '-':<32} {j['state']:<11} {j['rounds']:>6}  "
                    f"{_num(j['final_return']):>12}  {j['cloud_cost_usd']:>9.4f}")
    fr = summary["final_return"]
    one = " (one seed: no interval)" if fr["runs"] == 1 else ""
    rows.append(f"  final return  IQM {_num(fr['iqm'])}, 95% CI [{_num(fr['ci_low'])}, {_num(fr['ci_high'])}] over "
                f"{fr['runs']} seeds{one} (stratified bootstrap, {fr['reps']} resamples); mean {_num(fr['mean'])}, "
                f"median {_num(fr['median'])}")
    rows.append(f"  cost (cloud)  ${summary['cloud_total_cost_usd']:.4f} in all, of ${summary['budget_usd']:g}")
    rows.append(f"  results       {out}/ (seeds.json, seeds.png, one folder per seed)")
    return "\n".join(rows)


def exit_code(runs: list[JobRun]) -> int:
    """0 when every job SUCCEEDED (a job that spent its budget did), 3 when the others were STOPPED, else 1 (as
    `nitro train`'s exit codes)."""
    states = {r.state for r in runs}
    if states <= {"SUCCEEDED"}:
        return 0
    return 3 if states <= {"SUCCEEDED", "STOPPED"} else 1


def run_seeds(client: NitroClient, spec: dict, n: int, opts: FollowOptions) -> int:
    """Run `spec` over n seeds at once and summarise them; the exit code (`exit_code`)."""
    group, total, jobs = seed_jobs(spec, n)
    out = Path(opts.results_dir) / group
    print(f"{n} seeds of one spec ({', '.join(str(j.key) for j in jobs)}) as jobs {group}-s*, at once; "
          f"budget ${total:g} in all, ${total / n:g} each", flush=True)
    queued = iter(jobs)
    runs = run_jobs(client, lambda: next(queued, None), parallel=n, results_dir=out, opts=opts,
                    on_done=lambda r: print(f"[{r.job_id}] {r.state}: {r.rounds} rounds, final return "
                                            f"{_num(final_return(r.reports))}"
                                            + (f" ({r.error})" if r.error else ""), flush=True))
    summary = summarise(group, runs, total)
    out.mkdir(parents=True, exist_ok=True)
    (out / "seeds.json").write_text(json.dumps(json_safe(summary), indent=2, default=str) + "\n")
    plot_seeds(out / "seeds.png", summary, runs)
    print("\n" + table(summary, out), flush=True)
    return exit_code(runs)
