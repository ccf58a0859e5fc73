"""Run a grid of training jobs through the real local system; resumable, core-aware.

Each run is one job (env x algo x scaler x seed) started through the SDK
against a LocalSystem (Redis, the Lambda endpoint, the three services). Every
round report is appended to <out>/<run>/rounds.jsonl the moment it arrives and
summary.json is written when the job ends, so an interrupted grid resumes by
skipping runs that have a summary and redoing the one that was cut short.
Jobs run one at a time by default: on this 2-core machine each job's actors
already use both cores; `parallel` may raise it on bigger machines.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nitro.client import results
from nitro.client.sdk import NitroClient
from nitro.contracts import DEFAULT_ACTOR_MEMORY_MB
from nitro.cost import Prices, ReferenceRates, delivered_actors, reference_evaluation_seconds, reference_job
from nitro.local.system import LocalSystem


def runs_dir(out: Path | str) -> Path:
    """Where a grid's per-run files live. A grid published under docs/results/grids/NAME keeps its tables and
    plots there and its raw runs (run.json, rounds.jsonl, summary.json per run) in data/grids/NAME/runs of the
    same repository, so docs/ holds documentation; any other grid directory holds them in OUT/runs."""
    out = Path(out)
    if len(out.parents) >= 4 and [p.name for p in out.parents[:3]] == ["grids", "results", "docs"]:
        return out.parents[3] / "data" / "grids" / out.name / "runs"
    return out / "runs"

@dataclass(frozen=True)
class Run:
    figure: str
    env_id: str
    algo: str
    scaler: str  # "nitro", "fixed:4", "max", "hydrozoa", "kungfu", "minions"
    seed: int
    rounds: int
    steps_per_actor: int
    i_min: int
    i_max: int
    preset: str = "tuned"
    eval_episodes: int = 3
    budget_usd: float = 50.0
    extra: dict = field(default_factory=dict, hash=False, compare=False)
    # Written to run.json, never sent: where a derived run's settings came from (experiments/protocol.py).
    meta: dict = field(default_factory=dict, hash=False, compare=False)
    # > 0: the harness stops the job once its bill at the reference rates `stop_rates` (nitro.cost.ReferenceRates
    # fields; the default prices, evaluation billed) reaches this many dollars (reference_bill): a comparison at
    # equal reference dollars then needs no job to run on, however long its rounds (experiments/sequential.py).
    stop_usd: float = field(default=0.0, compare=False)
    stop_rates: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def run_id(self) -> str:
        name = f"{self.env_id}-{self.algo}-{self.scaler}-s{self.seed}"
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-").lower()

    def spec(self) -> dict:
        policy, _, n = self.scaler.partition(":")
        scaler = {"policy": policy, "i_min": self.i_min, "i_max": self.i_max}
        if n:
            scaler["fixed_actors"] = int(n)
        scaler.update(self.extra.get("scaler", {}))
        spec = {"env_id": self.env_id, "algo": self.algo, "preset": self.preset, "rounds": self.rounds,
                "steps_per_actor": self.steps_per_actor, "eval_episodes": self.eval_episodes,
                "budget_usd": self.budget_usd, "seed": self.seed, "scaler": scaler}
        spec.update({k: v for k, v in self.extra.items() if k != "scaler"})
        return spec


def run_one(client: NitroClient, run: Run, out_dir: Path) -> dict:
    run_dir = out_dir / run.run_id
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a run cut short is redone from scratch
    run_dir.mkdir(parents=True)
    # What the run's reports are billed at: the local system's scaler runs with the default prices (a later
    # re-pricing reads the reports back in these units: experiments/equal_cost.py).
    billing = {"prices": Prices().to_dict(), "actor_memory_mb": run.extra.get("actor_memory_mb", DEFAULT_ACTOR_MEMORY_MB)}
    (run_dir / "run.json").write_text(json.dumps({**asdict(run), "billing": billing}, indent=2) + "\n")
    t0 = time.time()
    job = client.start_training(run.spec())
    reports, rounds, stopped = [], [], None
    rates = ReferenceRates(**run.stop_rates) if run.stop_usd > 0 else None
    with open(run_dir / "rounds.jsonl", "w") as f:
        for rep in client.watch(job.job_id):
            reports.append(rep)
            rounds.append(results.as_dict(rep))
            f.write(json.dumps(rounds[-1], default=str) + "\n")
            f.flush()
            if rates is not None and stopped is None:
                bill = reference_bill(rounds, run.steps_per_actor, rates)
                if bill >= run.stop_usd:
                    stopped = {"reference_usd": bill, "round": len(rounds) - 1}
                    client.stop(job.job_id)  # the watch ends with the job's last report
    status = client.get(job.job_id)
    wall = time.time() - t0
    results.write_rounds_csv(run_dir / "rounds.csv", reports)
    summary = results.write_summary(run_dir / "summary.tmp.json", status, reports, wall)
    if stopped is not None:  # a job the harness stopped ended as planned: it reached the reference budget
        summary.update(stopped_at_reference_usd=stopped)
        (run_dir / "summary.tmp.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    os.replace(run_dir / "summary.tmp.json", run_dir / "summary.json")  # its presence marks the run done
    return summary


def finished_as_planned(summary: dict) -> bool:
    """The run ended as its grid planned: SUCCEEDED, or stopped by the harness at its reference budget."""
    return summary.get("state") == "SUCCEEDED" or (summary.get("state") == "STOPPED"
                                                   and "stopped_at_reference_usd" in summary)


def reference_bill(rounds: list[dict], steps_per_actor: int, rates: ReferenceRates) -> float:
    """A run's bill so far at reference rates and the default prices, evaluation billed as learner time (the
    `cpu` pricing of experiments/equal_cost.py)."""
    return reference_job([delivered_actors(r) for r in rounds], steps_per_actor, rates, Prices(),
                         evaluation_s=reference_evaluation_seconds(rounds, rates, steps_per_actor))[-1]


def run_grid(runs: list[Run], out_dir: str | Path, *, state_dir: str | Path | None = None,
             parallel: int = 1, concurrency: int = 64, log=print) -> list[dict]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    todo = [r for r in runs if not (out / r.run_id / "summary.json").exists()]
    done = len(runs) - len(todo)
    log(f"{len(runs)} runs, {done} already done, {len(todo)} to go (parallel {parallel})")
    if todo:
        state = Path(state_dir or out / ".nitro")
        # A run cut short by a restart is redone from scratch below: the learner must not resume it as well.
        system = LocalSystem(state_dir=state, concurrency=concurrency, resume_jobs=False).start()
        try:
            with NitroClient(system.learner_address) as client:
                def go(run: Run) -> None:
                    t = time.time()
                    s = run_one(client, run, out)
                    log(f"  {run.run_id}: {s['state']}, final eval {s['final_eval_return']}, "
                        f"cost ${s['total_cost_usd']:.4f}, {time.time() - t:.0f} s")

                with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
                    list(pool.map(go, todo))
        finally:
            system.stop()
    return [load_summary(out, r) for r in runs]


def load_summary(out: Path, run: Run) -> dict:
    return json.loads((Path(out) / run.run_id / "summary.json").read_text())


def load_rounds(out: Path, run: Run) -> list[dict]:
    path = Path(out) / run.run_id / "rounds.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def default_parallel() -> int:
    return max(1, (os.cpu_count() or 2) // 4)
