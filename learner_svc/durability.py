"""A job's files in the learner's data dir, each written so that a crash leaves the previous version whole.

- `checkpoint.pt`: everything a resumed learner needs (written atomically by `RoundLoop.commit`, which names
  the stream entries it consumes);
- `best.pt`: a copy of the checkpoint of the best evaluated round so far;
- `reports.pb`: the round reports, length-prefixed, each fsynced (a torn last write is finished again on resume);
- `job.json`: the job's state, end message, whether it is resumable, and its spec.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from typing import NamedTuple

import torch

from learner_svc.constants import CHECKPOINT_FORMAT
from learner_svc.resilience import JobAborted
from nitro.v1 import training_pb2


class CommittedEntry(NamedTuple):
    """A stream entry a checkpoint names, as TrajectoryReader.ack needs it."""

    entry_id: str
    dedup_id: str


def job_dir(data_dir: str, job_id: str) -> str:
    return os.path.join(data_dir, "jobs", job_id)


class JobFiles:
    """The files of one job's directory."""

    def __init__(self, directory: str):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.checkpoint = os.path.join(directory, "checkpoint.pt")
        self.best = os.path.join(directory, "best.pt")
        self.reports = os.path.join(directory, "reports.pb")
        self.job_state = os.path.join(directory, "job.json")

    def write_checkpoint(self, payload: dict) -> str:
        """Write checkpoint.pt atomically: a crash mid-write leaves the previous checkpoint intact."""
        tmp = self.checkpoint + ".tmp"
        torch.save({"format": CHECKPOINT_FORMAT, **payload}, tmp)
        os.replace(tmp, self.checkpoint)
        return self.checkpoint

    def read_checkpoint(self, map_location) -> dict | None:
        """The last checkpoint, or None when there is none; a checkpoint of another format ends the job."""
        if not os.path.exists(self.checkpoint):
            return None
        # Our own file in our own data dir; map_location: a GPU checkpoint resumes on a CPU learner too.
        ck = torch.load(self.checkpoint, weights_only=False, map_location=map_location)
        if ck.get("format") != CHECKPOINT_FORMAT:
            raise JobAborted(f"checkpoint {self.checkpoint} has format {ck.get('format')}, "
                             f"expected {CHECKPOINT_FORMAT}")
        return ck

    def keep_best(self, eval_return: float, reports: list[training_pb2.RoundReport]) -> None:
        """Copy checkpoint.pt to best.pt when `eval_return` beats every evaluated round of `reports`.

        Ties keep the earlier round, as nitro.client.results.summarize's best_round does."""
        if math.isnan(eval_return):  # not evaluated
            return
        best = max((r.eval_return for r in reports if r.evaluated), default=-math.inf)
        if not eval_return > best:
            return
        shutil.copyfile(self.checkpoint, self.best + ".tmp")
        os.replace(self.best + ".tmp", self.best)  # atomic, like the checkpoint itself

    def append_report(self, report: training_pb2.RoundReport) -> None:
        data = report.SerializeToString()
        with open(self.reports, "ab") as f:
            f.write(struct.pack("<I", len(data)) + data)
            f.flush()
            os.fsync(f.fileno())

    def save_job_state(self, job_id: str, state: str, message: str, resumable: bool, spec: dict, *,
                       actor_user_released: bool = False) -> None:
        """actor_user_released: the scaler confirmed that the ended job's Redis user is gone (EndJob); an ended job
        without it is ended again by the learner's next start (TrainingServicer.release_actor_users)."""
        tmp = self.job_state + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"job_id": job_id, "state": state, "message": message, "resumable": resumable,
                       "spec": spec, "actor_user_released": actor_user_released}, f)
        os.replace(tmp, self.job_state)

    def mark_actor_user_released(self) -> None:
        """Record in job.json that the scaler deleted the job's Redis user."""
        with open(self.job_state) as f:
            saved = json.load(f)
        saved["actor_user_released"] = True
        tmp = self.job_state + ".tmp"
        with open(tmp, "w") as f:
            json.dump(saved, f)
        os.replace(tmp, self.job_state)


def load_reports(directory: str) -> list[training_pb2.RoundReport]:
    path = os.path.join(directory, "reports.pb")
    out: list[training_pb2.RoundReport] = []
    if not os.path.exists(path):
        return out
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos + 4 <= len(data):
        (n,) = struct.unpack_from("<I", data, pos)
        if pos + 4 + n > len(data):
            break  # a torn last write: that round is finished again on resume
        out.append(training_pb2.RoundReport.FromString(data[pos + 4:pos + 4 + n]))
        pos += 4 + n
    return out
