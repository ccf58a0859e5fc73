"""`nitro tune STUDY.yaml`: Optuna over real jobs, each with its own dollar budget, within the study's.

Each trial is a job of the base spec with the trial's parameters (nitro.tuning), its own budget (--trial-budget,
on the cloud clock) and the id STUDY-t<number>. TPE samples the parameters; the pruner (successive halving by
default) reads each evaluated round's return as the trial's intermediate value at step = its round, and a trial
it prunes is stopped (it finishes the round in flight and ends STOPPED). The study's money is a BudgetPool
(nitro.client.multirun): a trial starts only when its whole budget fits beside the spend of the trials that
ended and the budgets of those running, so the trials together stay within --study-budget. A trial's value is
its final return (the last evaluated round's eval_return). results/STUDY/: trials.csv, best.yaml (a --config
file), study.json, Optuna's plots, and one folder per trial's job.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import signal
import threading
import warnings
from pathlib import Path
from typing import Any

from nitro.client.commands.common import (
    CliError,
    add_state_dir,
    add_target,
    learner_client,
    raise_interrupt,
    resolve_target,
    routed_signals,
)
from nitro.client.commands.follow import REATTACH_TIMEOUT_S, FollowOptions
from nitro.client.multirun import WAIT, BudgetPool, JobRun, NextJob, json_safe, run_jobs
from nitro.spec import new_job_id

PLOTS = ("plot_optimization_history", "plot_intermediate_values", "plot_param_importances", "plot_slice")


def add_tune(sub) -> None:
    p = sub.add_parser("tune", help="tune a spec's hyperparameters with Optuna, each trial a job within one budget",
                       description="Run trials of a base spec with parameters from a search space (a YAML study "
                                   "file, docs/cli.md), each a real job with its own budget, within the study's "
                                   "budget; prune poor trials from their round reports; write results/STUDY/.")
    p.add_argument("study_file", metavar="STUDY.yaml", help="the study: base spec, search space, pruner, sampler")
    p.add_argument("--config", metavar="FILE", default=None,
                   help="a base spec file (as `nitro train --config`); the study file's spec: lies over it")
    p.add_argument("--trials", type=int, default=20, help="most trials to run (default: %(default)s)")
    p.add_argument("--study-budget", type=float, required=True, metavar="USD",
                   help="the study's dollars on the cloud clock: no trial starts that could take it past this")
    p.add_argument("--trial-budget", type=float, required=True, metavar="USD",
                   help="each trial's own budget (the job's budget_usd, cloud clock)")
    p.add_argument("--parallel", type=int, default=1, metavar="N",
                   help="trials running at once (default: %(default)s)")
    p.add_argument("--name", default=None, help="the study's name: results/NAME/, jobs NAME-t<trial> "
                                                "(default: a new id)")
    add_target(p, "learner address")
    add_state_dir(p)
    p.add_argument("--local", action="store_true",
                   help="start the local system for the study and stop it afterwards (reuses one already up)")
    p.add_argument("--results-dir", default="results", help="where results/<study>/ goes (default: %(default)s)")
    p.add_argument("--reattach-timeout", type=float, default=REATTACH_TIMEOUT_S, metavar="SECONDS",
                   help="how long to wait for a learner that went away (default: %(default)s)")
    p.set_defaults(func=cmd_tune)


def _optuna():
    try:
        import optuna
    except ImportError as exc:
        raise CliError(f"nitro tune needs Optuna, which is not installed ({exc}): pip install 'nitro-rl[tune]'",
                       exit_code=2) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def make_study(optuna, study, name: str):
    """An in-memory Optuna study: TPE (seeded as the file says) and the file's pruner, maximising."""
    sampler = optuna.samplers.TPESampler(seed=study.sampler.get("seed"),
                                         n_startup_trials=study.sampler.get("n_startup_trials", 10))
    kind = study.pruner["type"]
    if kind == "successive_halving":
        pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=study.pruner.get("min_resource", "auto"),
                                                        reduction_factor=study.pruner.get("reduction_factor", 4))
    elif kind == "median":
        pruner = optuna.pruners.MedianPruner(n_startup_trials=study.pruner.get("n_startup_trials", 5),
                                             n_warmup_steps=study.pruner.get("n_warmup_steps", 0))
    else:
        pruner = optuna.pruners.NopPruner()
    s = optuna.create_study(study_name=name, direction="maximize", sampler=sampler, pruner=pruner)
    for params in study.enqueue:
        s.enqueue_trial(params, skip_if_exists=True)
    return s


def suggest(trial, param) -> Any:
    if param.kind == "categorical":
        return trial.suggest_categorical(param.name, list(param.choices))
    if param.kind == "int":
        return trial.suggest_int(param.name, param.low, param.high, step=param.step or 1, log=param.log)
    return trial.suggest_float(param.name, param.low, param.high, step=param.step, log=param.log)


def _check_numbers(args) -> None:
    for flag, value in (("--study-budget", args.study_budget), ("--trial-budget", args.trial_budget)):
        if not (math.isfinite(value) and value > 0):
            raise CliError(f"{flag}: must be a finite number of dollars > 0, got {value}", exit_code=2)
    if args.trial_budget > args.study_budget:
        raise CliError(f"--trial-budget ({args.trial_budget:g}) must be <= --study-budget ({args.study_budget:g}): "
                       f"no trial would fit", exit_code=2)
    for flag, value in (("--trials", args.trials), ("--parallel", args.parallel)):
        if value < 1:
            raise CliError(f"{flag}: must be an integer >= 1, got {value}", exit_code=2)


def cmd_tune(args) -> int:
    from nitro import spec_file, tuning
    from nitro.local import system_state

    _check_numbers(args)
    base = spec_file.load(args.config) if args.config else None
    study_file = tuning.load(args.study_file, base)
    tuning.check(study_file, args.study_file)  # a bad range costs no system start and no job
    optuna = _optuna()
    name = args.name or new_job_id(study_file.base.get("env_id") or study_file.base.get("preset") or "study")
    name = name[:64 - len(f"-t{args.trials - 1}")]
    opts = FollowOptions(state_dir=args.state_dir, target=args.target, results_dir=args.results_dir,
                         no_progress=True, reattach_timeout_s=args.reattach_timeout, local=args.local)
    if args.local and not system_state.running_state(args.state_dir):
        from nitro.client.commands.train import check_before_starting

        check_before_starting(tuning.trial_spec(study_file.base, {}, budget_usd=args.trial_budget))
    from nitro.client.commands.system import LocalSystemOptions, local_system_for_job

    with contextlib.ExitStack() as stack:
        stack.enter_context(routed_signals(raise_interrupt, (signal.SIGTERM,)))
        target = stack.enter_context(local_system_for_job(LocalSystemOptions(args.state_dir))) if args.local \
            else resolve_target(args)
        client = stack.enter_context(learner_client(args, target))
        tuner = Tuner(optuna, study_file, name, args.trials, args.study_budget, args.trial_budget)
        out = Path(args.results_dir) / name
        print(f"study {name}: up to {args.trials} trials of ${args.trial_budget:g} each within "
              f"${args.study_budget:g} (cloud clock), {args.parallel} at a time; pruner "
              f"{study_file.pruner['type']}", flush=True)
        try:
            run_jobs(client, tuner.next_job, parallel=args.parallel, results_dir=out, opts=opts, pool=tuner.pool,
                     on_report=tuner.on_report, on_done=tuner.on_done)
        finally:
            tuner.close_unstarted()
            write_results(out, tuner)
    return 0 if tuner.best() is not None else 1


class Tuner:
    """The study's side of run_jobs: hands out trials while the budget allows, feeds the pruner, records ends."""

    def __init__(self, optuna, study_file, name: str, trials: int, study_budget: float, trial_budget: float):
        self.optuna, self.study_file, self.name = optuna, study_file, name
        self.study = make_study(optuna, study_file, name)
        self.trials, self.trial_budget = trials, trial_budget
        self.pool = BudgetPool(study_budget)
        self.asked: dict[int, Any] = {}  # trial number -> optuna Trial
        self.runs: dict[int, JobRun] = {}
        self.told: set[int] = set()
        self.lock = threading.Lock()  # trial.report / should_prune from the followers' threads

    def next_job(self):
        if len(self.asked) >= self.trials:
            return None
        if not self.pool.fits(self.trial_budget):
            return WAIT  # a running trial may end under its budget; with none running, the study is over
        trial = self.study.ask()
        self.asked[trial.number] = trial
        params = {p.name: suggest(trial, p) for p in self.study_file.space}
        from nitro.tuning import trial_spec

        spec = trial_spec(self.study_file.base, params, f"{self.name}-t{trial.number}", self.trial_budget)
        return NextJob(trial.number, spec, self.trial_budget)

    def on_report(self, run: JobRun, report) -> str:
        if not report.evaluated or not math.isfinite(report.eval_return):
            return ""
        trial = self.asked[run.key]
        with self.lock:
            trial.report(float(report.eval_return), step=int(report.round))
            prune = trial.should_prune()
        return f"pruned at round {report.round} ({self.study_file.pruner['type']})" if prune else ""

    def on_done(self, run: JobRun) -> None:
        self.runs[run.key] = run
        trial, states = self.asked[run.key], self.optuna.trial.TrialState
        value = run.final_return
        with self.lock:
            if run.stop_reason and run.ended:
                self.study.tell(trial, state=states.PRUNED)
            elif run.state == "SUCCEEDED" and math.isfinite(value):
                self.study.tell(trial, value)
            else:
                self.study.tell(trial, state=states.FAIL)
        self.told.add(run.key)
        print(f"trial {run.key} ({run.job_id}): {self.state_of(run.key)}, value {value:.2f}, "
              f"{run.rounds} rounds, ${run.cloud_cost_usd:.4f}; study spent ${self.pool.spent_usd:.4f} of "
              f"${self.pool.total_usd:g}", flush=True)

    def close_unstarted(self) -> None:
        """Trials asked for but never run (the study was interrupted) end FAIL, so the study holds no RUNNING one."""
        for number, trial in self.asked.items():
            if number not in self.told:
                with contextlib.suppress(Exception):
                    self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)

    def state_of(self, number: int) -> str:
        return self.study.trials[number].state.name

    def best(self):
        done = [t for t in self.study.trials if t.state.name == "COMPLETE"]
        return max(done, key=lambda t: t.value) if done else None

    def rows(self) -> list[dict]:
        rows = []
        for t in self.study.trials:
            run = self.runs.get(t.number)
            rows.append({"trial": t.number, "state": t.state.name, "value": t.value,
                         "job_id": run.job_id if run else "", "job_state": run.state if run else "NOT_STARTED",
                         "rounds": run.rounds if run else 0,
                         "last_intermediate": (t.intermediate_values[max(t.intermediate_values)]
                                               if t.intermediate_values else None),
                         "cloud_cost_usd": run.cloud_cost_usd if run else 0.0,
                         "budget_usd": self.trial_budget, "stop_reason": run.stop_reason if run else "",
                         **{f"param:{k}": v for k, v in t.params.items()}})
        return rows


def write_results(out: Path, tuner: Tuner) -> None:
    """trials.csv, best.yaml, study.json and the plots; prints the trials table and where they are."""
    import yaml

    from nitro.tuning import trial_spec

    out.mkdir(parents=True, exist_ok=True)
    rows = tuner.rows()
    columns = list(dict.fromkeys(k for r in rows for k in r)) or ["trial"]
    with open(out / "trials.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
    best = tuner.best()
    if best is not None:
        spec = trial_spec(tuner.study_file.base, best.params, budget_usd=tuner.trial_budget)
        spec.pop("job_id", None)
        header = (f"# nitro tune {tuner.name}: trial {best.number}, final return {best.value:.4g}; "
                  f"`nitro train --config best.yaml` runs it\n")
        (out / "best.yaml").write_text(header + yaml.safe_dump(spec, sort_keys=False))
    plots = write_plots(out, tuner)
    (out / "study.json").write_text(json.dumps(json_safe({
        "study": tuner.name, "direction": "maximize", "objective": "final return (last evaluated eval_return)",
        "pruner": tuner.study_file.pruner, "sampler": {"type": "tpe", **tuner.study_file.sampler},
        "study_budget_usd": tuner.pool.total_usd, "trial_budget_usd": tuner.trial_budget,
        "spent_usd": tuner.pool.spent_usd, "trials": rows,
        "best": {"trial": best.number, "value": best.value, "params": best.params} if best else None,
        "plots": plots,
    }), indent=2, default=str) + "\n")
    print(f"\nstudy {tuner.name}: {len(rows)} trials, ${tuner.pool.spent_usd:.4f} spent of ${tuner.pool.total_usd:g}")
    print(f"  {'trial':>5}  {'state':<9} {'value':>9}  {'rounds':>6}  {'cloud $':>8}  params")
    for r in rows:
        value = "-" if r["value"] is None else f"{r['value']:.2f}"
        params = ", ".join(f"{k[6:]}={v:.4g}" if isinstance(v, float) else f"{k[6:]}={v}"
                           for k, v in r.items() if k.startswith("param:"))
        print(f"  {r['trial']:>5}  {r['state']:<9} {value:>9}  {r['rounds']:>6}  {r['cloud_cost_usd']:>8.4f}  {params}")
    if best is not None:
        print(f"  best          trial {best.number}: {best.value:.2f} -> {out / 'best.yaml'}")
    else:
        print("  best          none: no trial completed")
    made = [k for k, v in plots.items() if v == "written"]
    skipped = {k: v for k, v in plots.items() if v != "written"}
    print(f"  plots         {', '.join(made) or 'none'}" + (f" (skipped: {skipped})" if skipped else ""))
    print(f"  results       {out}/ (trials.csv, best.yaml, study.json, one folder per trial)", flush=True)


def write_plots(out: Path, tuner: Tuner) -> dict[str, str]:
    """Optuna's matplotlib plots as PNGs: {name: "written" or why not}."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display; the plots go to files
        import matplotlib.pyplot as plt
        from optuna.visualization import matplotlib as ovm
    except ImportError as exc:
        return dict.fromkeys(PLOTS, f"Optuna's visualization needs matplotlib: {exc}")
    done: dict[str, str] = {}
    for name in PLOTS:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # ExperimentalWarning: the matplotlib backend is marked so
                ax = getattr(ovm, name)(tuner.study)
            fig = ax.flat[0].figure if hasattr(ax, "flat") else ax.figure
            fig.savefig(out / f"{name.removeprefix('plot_')}.png", dpi=100, bbox_inches="tight")
            plt.close(fig)
            done[name] = "written"
        except Exception as exc:  # noqa: BLE001 - a plot Optuna cannot draw (too few trials) is skipped, said so
            done[name] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:200]
    return done
