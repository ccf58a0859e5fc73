"""Writers for a training run's results: rounds.csv, summary.json and training.png.

Pure functions of what the SDK returned, so experiment scripts can reuse them;
RoundsCsvWriter writes rounds.csv a row at a time while a job runs.
Reports and statuses may be SDK wrappers (nitro.client.sdk.RoundReport/TrainingStatus),
proto messages or plain dicts with the proto's field names.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path


def as_dict(obj) -> dict:
    if obj is None:
        return {}
    if isinstance(obj, dict):
        return obj
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    from nitro.client.sdk import message_to_dict  # a proto message

    return message_to_dict(obj)


_PHASE_COLUMNS = {"phases": "phase_{}_s", "cloud_phases": "cloud_phase_{}_s"}  # this machine / cloud clock


def round_rows(reports: Iterable) -> tuple[list[str], list[dict]]:
    """Flat CSV rows (`flat_row`) and the columns they use: report fields, then phase columns."""
    rows = [flat_row(r) for r in reports]
    if not rows:  # header only: the fields a report would have
        return _report_fields(), []
    columns, phase_cols = [], []
    for row in rows:
        for key in row:
            target = phase_cols if key.startswith(("phase_", "cloud_phase_")) else columns
            if key not in target:
                target.append(key)
    return columns + phase_cols, rows


def flat_row(report) -> dict:
    """One report as a CSV row: phases become phase_<name>_s columns (cloud_phases cloud_phase_<name>_s),
    notes one '; '-joined string."""
    d = as_dict(report)
    row = {k: ("; ".join(v) if isinstance(v, list) else v) for k, v in d.items() if k not in _PHASE_COLUMNS}
    for key, column in _PHASE_COLUMNS.items():
        for name, seconds in _phase_dict(d.get(key)).items():
            row[column.format(name)] = seconds
    return row


def _report_fields() -> list[str]:
    from nitro.v1 import training_pb2

    return [f.name for f in training_pb2.RoundReport.DESCRIPTOR.fields if f.name not in _PHASE_COLUMNS]


def stable_columns() -> list[str]:
    """A header that fits every report: all RoundReport fields, then a column per phase on both clocks
    (nitro.rpc.metrics.PHASES names every phase a loop times)."""
    from nitro.rpc.metrics import PHASES

    return _report_fields() + [column.format(p) for column in _PHASE_COLUMNS.values() for p in PHASES]


class RoundsCsvWriter:
    """rounds.csv written while a job runs: the stable header at once, then one flushed row per report,
    so the file can be read (or tailed) before the job ends."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=stable_columns(), restval="", extrasaction="ignore")
        self._writer.writeheader()
        self._file.flush()

    def append(self, report) -> None:
        self._writer.writerow(flat_row(report))
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RoundsCsvWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _phase_dict(value) -> dict[str, float]:
    """{phase: seconds} from a dict or from a list of {"phase", "seconds"} (a repeated PhaseLatency)."""
    if not value:
        return {}
    if isinstance(value, dict):
        return dict(value)
    return {p["phase"]: p["seconds"] for p in value}


def write_rounds_csv(path: str | os.PathLike, reports: Sequence) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns, rows = round_rows(reports)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
    return path


def summarize(status, reports: Sequence, wall_s: float) -> dict:
    """The numbers a user wants at the end of a run (also what summary.json holds)."""
    st = as_dict(status)
    reps = [as_dict(r) for r in reports]
    last = reps[-1] if reps else (st.get("last_report") or {})
    evals = [(r.get("eval_return", math.nan), r.get("round")) for r in reps]
    finite = [(v, k) for v, k in evals if isinstance(v, (int, float)) and math.isfinite(v)]
    best = max(finite, key=lambda vk: vk[0]) if finite else (None, None)
    spec = st.get("spec") or {}
    return {
        "job_id": st.get("job_id") or last.get("job_id", ""),
        "state": st.get("state", "UNKNOWN"),
        "interrupted": bool(st.get("interrupted", False)),  # STOPPED by its learner's shutdown: not an end
        "message": st.get("message", ""),
        "env_id": spec.get("env_id", ""),
        "algo": spec.get("algo", ""),
        "scaler": (spec.get("scaler") or {}).get("policy", ""),
        "rounds": len(reps) if reps else st.get("rounds_done", 0),
        "rounds_planned": spec.get("rounds"),
        "final_eval_return": last.get("eval_return") if last else None,
        "best_eval_return": best[0],
        "best_round": best[1],
        "total_env_steps": st.get("total_env_steps") or last.get("total_env_steps", 0),
        # Two clocks (docs/cost.md): cloud_* is the modelled AWS bill, the others this machine's.
        "cloud_total_cost_usd": st.get("cloud_total_cost_usd") or last.get("cloud_total_cost_usd", 0.0),
        "cloud_seconds": sum(r.get("cloud_round_seconds", 0.0) for r in reps),
        "cloud_serverful_cost_usd": _cloud_serverful(reps, spec),
        "total_cost_usd": st.get("total_cost_usd") or last.get("total_cost_usd", 0.0),
        "serverful_cost_usd": last.get("serverful_cost_usd", 0.0),
        "actors_launched": sum(r.get("actors_launched", 0) for r in reps),
        "wall_s": wall_s,
        "checkpoint_path": st.get("checkpoint_path", ""),
        "best_checkpoint_path": best_checkpoint_path(st.get("checkpoint_path", "")) if finite else "",
        "created_unix": st.get("created_unix"),
        "finished_unix": st.get("finished_unix"),
        "spec": spec,
    }


def best_checkpoint_path(checkpoint_path: str) -> str:
    """Where the learner keeps best.pt: beside checkpoint.pt (learner_svc.rounds.RoundLoop.keep_best)."""
    return os.path.join(os.path.dirname(checkpoint_path), "best.pt") if checkpoint_path else ""


def _cloud_serverful(reps: list[dict], spec: dict) -> float:
    """The serverful comparator (an actor VM fleet for I_max) over the job's modelled cloud time."""
    from nitro.cost import Prices, serverful_job_cost

    seconds = sum(r.get("cloud_round_seconds", 0.0) for r in reps)
    i_max = int((spec.get("scaler") or {}).get("i_max") or 64)
    return serverful_job_cost(seconds, i_max, Prices()) if reps else 0.0


def write_summary(path: str | os.PathLike, status, reports: Sequence, wall_s: float) -> dict:
    summary = summarize(status, reports, wall_s)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def plot_training(path: str | os.PathLike, reports: Sequence) -> Path:
    """Three stacked panels: eval/train return, actors and cumulative cost per round."""
    # Figure without pyplot: no global state, no GUI backend, safe from threads.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    reps = [as_dict(r) for r in reports]
    x = [r.get("round", i) for i, r in enumerate(reps)]

    def col(name):
        return [r.get(name, math.nan) for r in reps]

    fig = Figure(figsize=(8, 9), layout="constrained")
    FigureCanvasAgg(fig)
    ret, actors, cost = fig.subplots(3, 1, sharex=True)
    ret.plot(x, col("eval_return"), marker="o", ms=3, label="eval return")
    ret.plot(x, col("train_return"), alpha=0.6, label="train return")
    ret.set_ylabel("return")
    ret.legend(loc="best")
    actors.step(x, col("actors_launched"), where="mid", label="launched")
    actors.plot(x, col("actors_completed"), ls="", marker=".", label="completed")
    actors.set_ylabel("actors")
    actors.set_ylim(bottom=0)
    actors.yaxis.set_major_locator(MaxNLocator(integer=True))
    actors.legend(loc="best")
    cost.plot(x, col("cloud_total_cost_usd"), label="modelled cloud (AWS)")
    cost.plot(x, col("total_cost_usd"), ls=":", label="this machine")
    cost.plot(x, col("serverful_cost_usd"), ls="--", label="serverful comparator (this machine)")
    cost.set_ylabel("cumulative cost (USD)")
    cost.set_ylim(bottom=0)
    cost.set_xlabel("round")
    cost.xaxis.set_major_locator(MaxNLocator(integer=True))
    cost.legend(loc="best")
    job = reps[0].get("job_id", "") if reps else ""
    fig.suptitle(f"training {job}".strip() if reps else "no rounds reported")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path
