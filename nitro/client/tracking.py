"""Experiment tracking: a job's round reports, as they arrive, to TensorBoard and Weights & Biases.

`nitro train` and `nitro watch` hand every RoundReport to the trackers asked for
(--tensorboard DIR, --wandb-project NAME). A tracker logs the spec once as
hyperparameters, then each round's scalars (`SCALARS`) against total env steps,
the x axis of Stable-Baselines3, RLlib and CleanRL. Their packages are imported
only when asked for, so nitro needs neither; a missing one is a TrackingError
that names it, raised before any job starts.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path

from nitro.errors import NitroError

# (tag, RoundReport field). The eval return is logged only on evaluated rounds (RoundReport.evaluated).
SCALARS: tuple[tuple[str, str], ...] = (
    ("eval/return", "eval_return"),
    ("train/return", "train_return"),
    ("train/episode_length", "mean_episode_length"),
    ("actors/launched", "actors_launched"),
    ("actors/completed", "actors_completed"),
    ("actors/next", "next_actors"),
    ("boosting/score", "score"),
    ("boosting/convexity_ratio", "convexity_ratio"),
    ("cost/cloud_total_usd", "cloud_total_cost_usd"),
    ("cost/machine_total_usd", "total_cost_usd"),
    ("loss/policy", "policy_loss"),
    ("loss/value", "value_loss"),
    ("loss/entropy", "entropy"),
    ("learner/kl", "kl"),
    ("learner/kl_coeff", "kl_coeff"),
    ("learner/clip_fraction", "clip_fraction"),
    ("learner/grad_norm", "grad_norm"),
    ("learner/explained_variance", "explained_variance"),
    ("time/round_seconds", "round_seconds"),
    ("time/cloud_round_seconds", "cloud_round_seconds"),
    ("progress/round", "round"),
)
STEP_FIELD = "total_env_steps"


class TrackingError(NitroError):
    """A tracker that cannot be used (its package is missing)."""


def round_scalars(report: Mapping) -> dict[str, float]:
    """{tag: value} of one report as a dict: finite values only, the eval return only when it was measured."""
    out = {}
    for tag, name in SCALARS:
        value = report.get(name)
        if name == "eval_return" and not report.get("evaluated"):
            continue
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[tag] = float(value)
    return out


def flat_spec(spec: Mapping, prefix: str = "") -> dict[str, str | float | bool]:
    """The spec as flat hyperparameters: nested settings become "scaler.i_max", "hyperparameters.lr"."""
    out: dict = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_spec(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        elif value is not None:
            out[name] = str(value)
    return out


class TensorBoardTracker:
    """Event files in DIR/<job id>/ (one run per job), written through torch.utils.tensorboard."""

    name = "tensorboard"

    def __init__(self, log_dir: str):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise TrackingError("--tensorboard needs the tensorboard package: pip install 'nitro-rl[tracking]'") from None
        self._writer_class, self.log_dir, self.writer = SummaryWriter, Path(log_dir), None

    def start(self, job_id: str, spec: Mapping) -> None:
        from torch.utils.tensorboard.summary import hparams

        self.run_dir = self.log_dir / job_id
        self.writer = self._writer_class(str(self.run_dir))
        # The hparams plugin's records go into this run, beside its scalars (add_hparams would start another).
        for summary in hparams(flat_spec(spec), {tag: 0.0 for tag, _ in SCALARS}):
            self.writer._get_file_writer().add_summary(summary)
        self.writer.add_text("spec", "```\n" + json.dumps(dict(spec), indent=2, default=str) + "\n```")
        self.writer.flush()

    def log_round(self, report: Mapping) -> None:
        step = int(report.get(STEP_FIELD) or 0)
        for tag, value in round_scalars(report).items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()  # each round is visible in TensorBoard as soon as it is reported

    def finish(self, summary: Mapping) -> None:
        self.writer.add_text("result", f"{summary.get('state')}: {summary.get('message', '')}")
        self.writer.close()

    def where(self) -> str:
        return f"{self.run_dir} (tensorboard --logdir {self.log_dir})"


class WandbTracker:
    """A W&B run named after the job; WANDB_MODE=offline logs without a network (wandb sync uploads it later)."""

    name = "wandb"

    def __init__(self, project: str):
        try:
            import wandb
        except ImportError:
            raise TrackingError("--wandb-project needs the wandb package: pip install 'nitro-rl[tracking]' "
                                "(WANDB_MODE=offline logs without a network)") from None
        self._wandb, self.project, self.run = wandb, project, None

    def start(self, job_id: str, spec: Mapping) -> None:
        self.run = self._wandb.init(project=self.project, name=job_id, config=flat_spec(spec), job_type="train")
        self.run.define_metric(STEP_FIELD)
        self.run.define_metric("*", step_metric=STEP_FIELD)  # every chart's x axis: env steps

    def log_round(self, report: Mapping) -> None:
        self.run.log({**round_scalars(report), STEP_FIELD: int(report.get(STEP_FIELD) or 0)})

    def finish(self, summary: Mapping) -> None:
        self.run.summary.update({k: summary[k] for k in ("state", "message", "final_eval_return", "best_eval_return",
                                                          "cloud_total_cost_usd", "total_cost_usd") if k in summary})
        self.run.finish(exit_code=0 if summary.get("state") == "SUCCEEDED" else 1)

    def where(self) -> str:
        run_dir = Path(self.run.dir).parent  # run.dir is the run's files/ folder
        return f"{run_dir} (offline; upload with: wandb sync {run_dir})" if self.run.offline else str(self.run.url)


class Trackers:
    """Fans each call out to the trackers; one that fails is dropped with a warning, so the job's own
    results are still written."""

    def __init__(self, trackers: list):
        self.active = list(trackers)

    def _each(self, method: str, *args) -> None:
        for tracker in list(self.active):
            try:
                getattr(tracker, method)(*args)
            except Exception as exc:  # noqa: BLE001 - tracking must not lose the job's results
                self.active.remove(tracker)
                print(f"warning: {tracker.name} tracking stopped: {type(exc).__name__}: {exc}", file=sys.stderr)

    def start(self, job_id: str, spec: Mapping) -> None:
        self._each("start", job_id, spec)

    def log_round(self, report: Mapping) -> None:
        self._each("log_round", report)

    def finish(self, summary: Mapping) -> list[str]:
        """Close every tracker; one line per tracker saying where its run is."""
        lines = [f"{t.name:<13} {t.where()}" for t in self.active]
        self._each("finish", summary)
        return lines


def open_trackers(tensorboard_dir: str | None = None, wandb_project: str | None = None) -> Trackers:
    """The trackers asked for; TrackingError when one's package is missing."""
    trackers = []
    if tensorboard_dir:
        trackers.append(TensorBoardTracker(tensorboard_dir))
    if wandb_project:
        trackers.append(WandbTracker(wandb_project))
    return Trackers(trackers)
