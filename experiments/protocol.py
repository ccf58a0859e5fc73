"""Evaluation protocol for "does boosting buy a better policy per dollar?" (docs/results.md, "Evaluation protocol").

    python -m experiments protocol          # paper scale: Hopper-v5, PPO tuned, 50 rounds, I_min 8, I_max 64,
                                            # 512 steps per actor, 10 seeds, nitro beside every control
    python -m experiments protocol-budget   # the same schemes at one modelled-dollar budget (return at equal $)
    python -m experiments protocol --smoke  # CartPole-v1, preset fast, 10 rounds, 2 seeds: a minute or two

Every run evaluates after every `eval_every`-th round (5) and after its last one, with `eval_episodes`
(10) deterministic episodes on the learner's evaluation seeds; a run's "final" return is the mean of its
last 3 evaluations. Aggregates over seeds are interquartile means with 95% stratified-bootstrap
confidence intervals and probabilities of improvement (rliable), never a bare standard deviation.
Dollars are the modelled cloud bill (RoundReport.cloud_total_cost_usd: every actor on its own vCPU on
AWS), not this machine's wall-time bill.

Schemes (--schemes): nitro, the independent controls fixed:imin (= fixed:I_min), max, schedule (the
decay without the detector), nitro-floor (the authors' artifact floor), any other policy (hydrozoa,
kungfu, fixed:N), and two controls derived from the nitro run of the same seed, planned once that
run has finished:

    fixed:nbar  fixed:N-bar, N-bar = round(mean actors per round of nitro's run): the same samples,
                without the timing
    shuffled    replay of nitro's own scores shuffled across rounds: S_k / d^k, permuted with a
                seeded RNG, times d^k again, mapped through the nitro rule to actor counts

MinionsRL (--scheduler PATH, docs/minions.md): the scheme `minions` runs the scaler policy minions with a
scheduler pre-trained by `nitro pretrain-minions` (with --scheduler and no --schemes it joins the default
schemes). The file is copied into the grid directory (minions-scheduler.npz) and its sha256 pinned in
grid.json and in every minions run's run.json, so a resumed grid uses that copy and refuses another scheduler.
Its pre-training cost (the checkpoint's metadata) is shown beside the minions row and added to it. A scheduler
for the paper-scale grid (Hopper-v5, I_max 64, 512 steps per actor, preset tuned, no budget limit), estimated
from a smoke of it at about 22 CPU minutes and $0.6 modelled (at most 43 minutes, $1.2; docs/results.md):

    nitro pretrain-minions --env Hopper-v5 --i-max 64 --steps-per-actor 512 --preset tuned \\
        --rounds-per-episode 4 --episodes 20 --budget 1000 --budget-min 0 --out /abs/hopper-v5-i64.npz
    python -m experiments protocol --schemes minions --scheduler /abs/hopper-v5-i64.npz

Stellaris (--learner-mode stellaris, docs/stellaris.md): every run on-policy with serverless learner functions
instead of the central learner; a grid of its own (the name ends in -stellaris). Combinations the system refuses
(--reproducible with stellaris or with minions, a scheduler trained for another I_max) are refused before any
run by the learner's own spec validation (nitro.spec.validate).

Runs are one at a time (one per 2 cores), resumable (a run with summary.json is done), and can run
from a clone at a fixed commit (--clone DIR --commit REV) so edits never reach a running grid; each
finished run is committed to the results directory of the main repository (--no-commit-results to
skip). --background detaches (nohup-style) and logs to results/protocol-logs/.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from experiments.harness import Run, finished_as_planned, load_rounds, run_one, runs_dir

ROOT = Path(__file__).resolve().parents[1]  # the code that runs (a clone in --clone mode)

PAPER = {"env_id": "Hopper-v5", "algo": "ppo", "preset": "tuned", "rounds": 50, "steps_per_actor": 512,
         "i_min": 8, "i_max": 64, "seeds": 10}
SMOKE = {"env_id": "CartPole-v1", "algo": "ppo", "preset": "fast", "rounds": 10, "steps_per_actor": 128,
         "i_min": 1, "i_max": 8, "seeds": 2}
DEFAULT_SCHEMES = ("nitro", "fixed:imin", "max", "fixed:nbar", "schedule", "shuffled", "nitro-floor")
DERIVED = ("fixed-nbar", "shuffled", "noise-replay")  # internal labels of the schemes derived from another run
NITRO_DERIVED = ("fixed-nbar", "shuffled")  # ... from the nitro run of the same seed
NOISE_SCHEMES = ("noise", "noise-adascale")  # the schemes --kappa applies to
BUDGET_ROUNDS_FACTOR = 4  # budget mode: rounds = 4x the paper's unless given, so the budget binds
UNLIMITED_USD = 1000.0  # "no budget": far above any run of this protocol (paper scale costs about a dollar)
FINAL_EVALS = 3
EVAL_EVERY = 5
EVAL_EPISODES = 10
BOOTSTRAP_REPS = 2000
LOCK_NAME = ".nitro-protocol.lock"
SCHEDULER_FILE = "minions-scheduler.npz"  # the grid's own copy of the minions scheduler
PLANNED_FILE = "planned.json"  # scheme -> the seeds the grid's commands asked for (record_planned)


# -- configuration ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Protocol:
    """One grid: a scale, the schemes and the seeds. Everything but seeds and schemes is fixed per out dir."""

    name: str
    env_id: str = PAPER["env_id"]
    algo: str = PAPER["algo"]
    preset: str = PAPER["preset"]
    rounds: int = PAPER["rounds"]
    steps_per_actor: int = PAPER["steps_per_actor"]
    i_min: int = PAPER["i_min"]
    i_max: int = PAPER["i_max"]
    seeds: tuple[int, ...] = tuple(range(PAPER["seeds"]))
    schemes: tuple[str, ...] = DEFAULT_SCHEMES
    eval_every: int = EVAL_EVERY
    eval_episodes: int = EVAL_EPISODES
    final_evals: int = FINAL_EVALS
    decay: float = 0.96
    budget_usd: float | None = None  # budget-matched mode: every run gets this modelled-dollar budget
    reproducible: bool = False
    shuffle_seed: int = 0  # the shuffled control's RNG: numpy default_rng([shuffle_seed, run seed])
    learner_mode: str = "central"  # nitro.spec.LEARNER_MODES: "stellaris" learns in serverless learner functions
    vtrace_critic: str = ""  # IMPACT: the critic V-trace reads ("online", "target"); "" is the preset's
    kappa: float | None = None  # noise, noise-adascale: scaler.kappa (None: the system's NOISE_KAPPA)
    grow_f1: float | None = None  # grow: scaler.grow_f1 / grow_f2 (None: the system's GROW_FRACTIONS)
    grow_f2: float | None = None
    envs_per_actor: int | None = None  # TrainingSpec.envs_per_actor (None: the system's default)
    # The harness stops each job once its bill at the reference rates `stop_rates` (nitro.cost.ReferenceRates
    # fields) reaches stop_usd (experiments/harness.py reference_bill): runs end at equal reference dollars,
    # whatever the machine's load does to the job's own cloud clock. None: jobs end on rounds or budget.
    stop_usd: float | None = None
    stop_rates: dict | None = None
    # Scheme minions: the pre-trained scheduler's absolute path (the grid's copy once check_out_dir adopted it)
    # and its sha256; not part of the scale, since minions may join a grid later (check_out_dir pins them).
    scheduler: str = ""
    scheduler_sha256: str = ""

    def __post_init__(self) -> None:
        if self.scheduler and not self.scheduler_sha256:
            if not Path(self.scheduler).is_file():
                raise ValueError(f"scheduler (--scheduler): no file at {self.scheduler}; pre-train one with `nitro "
                                 "pretrain-minions` (python -m experiments protocol --help)")
            object.__setattr__(self, "scheduler", str(Path(self.scheduler).resolve()))
            object.__setattr__(self, "scheduler_sha256", file_sha256(self.scheduler))
        object.__setattr__(self, "schemes", tuple(resolve_schemes(self.schemes, self.i_min, bool(self.scheduler))))
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        for name in ("rounds", "steps_per_actor", "i_min", "i_max", "eval_every", "final_evals"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.i_min > self.i_max:
            raise ValueError(f"i_min ({self.i_min}) must be <= i_max ({self.i_max})")
        if self.eval_episodes < 1:
            raise ValueError(f"eval_episodes: must be >= 1, got {self.eval_episodes}")
        if not self.seeds:
            raise ValueError("seeds: at least one")
        if self.budget_usd is not None and not (self.budget_usd > 0 and math.isfinite(self.budget_usd)):
            raise ValueError(f"budget_usd: must be a positive number, got {self.budget_usd}")
        if self.stop_usd is not None:
            if not (self.stop_usd > 0 and math.isfinite(self.stop_usd)):
                raise ValueError(f"stop_usd (--stop-at-reference-usd): must be a positive number, got {self.stop_usd}")
            if not self.stop_rates:
                raise ValueError("stop_usd (--stop-at-reference-usd) needs the reference rates (--rates FILE)")
            from nitro.cost import ReferenceRates

            ReferenceRates(**self.stop_rates)  # ConfigError naming a bad rate

    def scale(self) -> dict:
        """What must match to resume into an out dir (seeds and schemes may grow)."""
        d = asdict(self)
        for k in ("seeds", "schemes", "name", "scheduler", "scheduler_sha256"):
            d.pop(k)
        if not d["vtrace_critic"]:  # grids made before the option existed do not name it
            d.pop("vtrace_critic")
        for k in ("kappa", "grow_f1", "grow_f2", "stop_usd", "stop_rates", "envs_per_actor"):  # likewise
            if d[k] is None:
                d.pop(k)
        return d

    def describe(self) -> str:
        budget = (f"budget ${self.budget_usd:g} modelled cloud USD per run (budget_clock cloud)"
                  if self.budget_usd is not None else "no budget limit")
        return (f"{self.env_id}, {self.algo} preset {self.preset}, {self.rounds} rounds, {self.steps_per_actor} steps "
                f"per actor, I_min={self.i_min}, I_max={self.i_max}, d={self.decay:g}, {len(self.seeds)} seeds, "
                f"evaluation every {self.eval_every} rounds and after the last, {self.eval_episodes} deterministic "
                f"episodes, final = mean of the last {self.final_evals} evaluations, {budget}"
                + (", reproducible sampling" if self.reproducible else "")
                + (f", learner mode {self.learner_mode}" if self.learner_mode != "central" else "")
                + (f", V-trace from the {self.vtrace_critic} critic" if self.vtrace_critic else "")
                + (f", kappa {self.kappa:g}" if self.kappa is not None else "")
                + (f", {self.envs_per_actor} envs per actor" if self.envs_per_actor is not None else "")
                + (f", each job stopped at ${self.stop_usd:g} at reference rates" if self.stop_usd else "")
                + (f", grow at {self.grow_f1 if self.grow_f1 is not None else 'default'}/"
                   f"{self.grow_f2 if self.grow_f2 is not None else 'default'}"
                   if (self.grow_f1, self.grow_f2) != (None, None) else "")
                + (f", minions scheduler sha256 {self.scheduler_sha256[:12]}" if self.scheduler else ""))

    # -- runs ---------------------------------------------------------------------------------------
    def run(self, scheme: str, seed: int, scaler: dict | None = None, meta: dict | None = None) -> Run:
        extra: dict = {"eval_every": self.eval_every, "scaler": {"decay": self.decay, **(scaler or {})}}
        if self.budget_usd is not None:
            extra["budget_clock"] = "cloud"
        if self.reproducible:
            extra["reproducible"] = True
        if self.learner_mode != "central":
            extra["learner_mode"] = self.learner_mode
        if self.vtrace_critic:
            extra["vtrace_critic"] = self.vtrace_critic
        if self.envs_per_actor is not None:
            extra["envs_per_actor"] = self.envs_per_actor
        if scheme in NOISE_SCHEMES and self.kappa is not None:
            extra["scaler"]["kappa"] = self.kappa
        if scheme == "grow":
            extra["scaler"].update({k: getattr(self, k) for k in ("grow_f1", "grow_f2") if getattr(self, k) is not None})
        if scheme == "minions":
            extra["scaler"]["scheduler"] = self.scheduler
            meta = {"scheduler": self.scheduler, "scheduler_sha256": self.scheduler_sha256, **(meta or {})}
        return Run(self.name, self.env_id, self.algo, scheme, seed, self.rounds, self.steps_per_actor, self.i_min,
                   self.i_max, preset=self.preset, eval_episodes=self.eval_episodes,
                   budget_usd=self.budget_usd if self.budget_usd is not None else UNLIMITED_USD,
                   extra=extra, meta=meta or {}, stop_usd=self.stop_usd or 0.0, stop_rates=dict(self.stop_rates or {}))


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def resolve_schemes(schemes: Sequence[str], i_min: int, scheduler: bool = False) -> list[str]:
    """Scheme tokens -> internal labels (fixed:imin -> fixed:<I_min>, fixed:nbar -> fixed-nbar); nitro first
    and added when a derived control needs it; minions only with a scheduler. ValueError naming a bad token."""
    from nitro.contracts import SCALING_POLICIES

    out: list[str] = []
    for token in schemes:
        t = str(token).strip().lower()
        if t in ("fixed:imin", "fixed:i_min"):
            t = f"fixed:{i_min}"
        elif t in ("fixed:nbar", "fixed:n-bar", "fixed-nbar", "nbar"):
            t = "fixed-nbar"
        elif t.startswith("fixed:"):
            if not t[6:].isdigit() or int(t[6:]) < 1:
                raise ValueError(f"scheme {token!r}: fixed:N needs an integer N >= 1 (or fixed:imin, fixed:nbar)")
        elif t == "replay":
            raise ValueError("scheme 'replay' needs a list; the protocol's replay controls are 'shuffled' and "
                             "'noise-replay'")
        elif t not in DERIVED and t not in SCALING_POLICIES:
            raise ValueError(f"unknown scheme {token!r}; allowed: nitro, fixed:imin, fixed:N, fixed:nbar, max, "
                             f"schedule, shuffled, nitro-floor, hydrozoa, kungfu, grow, noise, noise-adascale, "
                             f"noise-replay, minions (with --scheduler)")
        if t == "minions" and not scheduler:
            raise ValueError("scheme 'minions' needs a pre-trained scheduler: pass --scheduler PATH, a checkpoint "
                             "written by `nitro pretrain-minions` (python -m experiments protocol --help)")
        if t not in out:
            out.append(t)
    if any(t in NITRO_DERIVED for t in out) and "nitro" not in out:
        out.insert(0, "nitro")
    if "nitro" in out:
        out.remove("nitro")
        out.insert(0, "nitro")
    return out


def title(scheme: str, i_min: int | None = None, i_max: int | None = None) -> str:
    if scheme == "fixed-nbar":
        return "fixed:N̄ (nitro's mean)"
    if scheme == "shuffled":
        return "shuffled scores (replay)"
    if scheme == "noise-replay":
        return "noise-replay (another seed's noise counts)"
    if scheme == "schedule":
        return "schedule (decay only)"
    if scheme == "nitro-floor":
        return "nitro + artifact floor"
    if scheme == "max":
        return f"max ({i_max})" if i_max else "max"
    if i_min is not None and scheme == f"fixed:{i_min}":
        return f"fixed:{i_min} (I_min)"
    return scheme


# -- derived controls ----------------------------------------------------------------------------------


def round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def nbar(rounds: Sequence[dict]) -> tuple[int, float]:
    """N-bar of a nitro run: (round(mean actors launched per round), the mean)."""
    mean = float(np.mean([r.get("actors_launched", 0) for r in rounds])) if rounds else 0.0
    return max(1, round_half_up(mean)), mean


def shuffled_actor_counts(rounds: Sequence[dict], decay: float, i_min: int, i_max: int, length: int,
                          rng_seed: Sequence[int]) -> tuple[list[int], dict]:
    """The shuffled-score control's actor counts for `length` rounds, and how they were made.

    Round j > 0 of nitro was planned from the score S_{j-1} of the round before (it carries d^(j-1)), round 0
    from no score (I_min). The scores that planned rounds 1..K-1 (S_0..S_{K-2}) are undecayed (U = S_k / d^k),
    permuted with numpy default_rng(rng_seed) and decayed again at their new position; round 0 stays at the
    nitro rule's decision for no score. Past the nitro run's length (budget mode) further permutations of
    the same U's follow, so every round has a count.
    """
    from nitro.scaling.base import RoundInputs
    from nitro.scaling.policies import NitroPolicy

    scores = [float(r.get("score", 0.0) or 0.0) for r in rounds][: max(0, len(rounds) - 1)]
    undecayed = []
    for k, s in enumerate(scores):
        dk = decay ** k
        u = s / dk if dk > 0 and math.isfinite(s) else 0.0
        undecayed.append(min(max(u, 0.0), 1.0))
    rng = np.random.default_rng([int(x) for x in rng_seed])
    order: list[int] = []
    while undecayed and len(order) < length - 1:
        order += [int(i) for i in rng.permutation(len(undecayed))]
    order = order[: max(0, length - 1)]
    policy = NitroPolicy()
    counts = [policy.decide({}, RoundInputs(0, score=0.0, i_min=i_min, i_max=i_max))[0]]
    for j in range(1, length):
        u = undecayed[order[j - 1]] if order else 0.0
        s = u * decay ** (j - 1)
        counts.append(policy.decide({}, RoundInputs(j, score=s, i_min=i_min, i_max=i_max))[0])
    return counts, {"undecayed_scores": undecayed, "permutation": order, "rng_seed": list(rng_seed)}


# -- planning ---------------------------------------------------------------------------------------------


@dataclass
class Planned:
    scheme: str
    seed: int
    run: Run | None  # None: waits for its nitro run
    why: str = ""


def is_done(out: Path, run: Run) -> bool:
    return (runs_dir(out) / run.run_id / "summary.json").exists()


def scale_diff(proto: Protocol, saved: dict) -> dict[str, tuple]:
    """{field: (grid.json's value, this protocol's)} where the scale differs; grids older than a field have its
    default."""
    defaults = {f.name: f.default for f in dataclasses.fields(Protocol)}
    had = saved.get("scale", {})
    mine = json.loads(json.dumps(proto.scale()))
    return {k: (had.get(k, defaults.get(k)), v) for k, v in mine.items() if had.get(k, defaults.get(k)) != v}


def same_scale(proto: Protocol, out: Path) -> bool:
    """`out` holds no grid yet, or one of this protocol's scale (check_out_dir refuses another)."""
    path = Path(out) / "grid.json"
    return not path.exists() or not scale_diff(proto, json.loads(path.read_text()))


def command_finished(proto: Protocol, out: Path) -> bool:
    """Every run this command asks for has finished in `out`, at the scale grid.json pins (another scale is
    left to the run, which refuses it), and its table exists."""
    if not (Path(out) / "grid.json").exists() or not (Path(out) / "table.md").exists() or not same_scale(proto, out):
        return False
    return all(p.run is not None and is_done(out, p.run) for p in plan(proto, out))


def _summary(out: Path, run: Run) -> dict | None:
    path = runs_dir(out) / run.run_id / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def noise_replay_source(seed: int) -> int:
    """The seed whose noise run noise-replay replays on `seed`: its pair (0 <-> 1, 2 <-> 3, ...), another seed of
    the same block of ten, so a stage of seeds 0-9 (or 10-29) replays only runs of its own stage."""
    return seed ^ 1


def derive(proto: Protocol, scheme: str, seed: int, out: Path) -> Planned:
    """The derived control `scheme` of `seed`, once its source run has finished: the nitro run of the same seed,
    or for noise-replay the noise run of another seed (noise_replay_source)."""
    if scheme == "noise-replay":
        return derive_noise_replay(proto, seed, out)
    source = proto.run("nitro", seed)
    summary = _summary(out, source)
    if summary is None:
        return Planned(scheme, seed, None, f"waits for {source.run_id}")
    if not finished_as_planned(summary):
        return Planned(scheme, seed, None, f"not derivable: {source.run_id} ended {summary.get('state')}")
    rounds = load_rounds(runs_dir(out), source)
    decay = float(((summary.get("spec") or {}).get("scaler") or {}).get("decay") or proto.decay)
    meta = {"derived_from": source.run_id, "source_rounds": len(rounds)}
    if scheme == "fixed-nbar":
        n, mean = nbar(rounds)
        meta.update(nbar=n, nbar_mean=mean)
        return Planned(scheme, seed, proto.run(scheme, seed, {"policy": "fixed", "fixed_actors": n}, meta))
    from nitro.scaling.policies import format_actor_counts

    counts, how = shuffled_actor_counts(rounds, decay, proto.i_min, proto.i_max, proto.rounds,
                                        (proto.shuffle_seed, seed))
    meta.update(how, actors_by_round=counts, decay=decay)
    return Planned(scheme, seed, proto.run(scheme, seed, {"policy": "replay",
                                                          "actors_by_round": format_actor_counts(counts)}, meta))


def derive_noise_replay(proto: Protocol, seed: int, out: Path) -> Planned:
    """noise-replay on `seed`: the actor counts the noise run of another seed launched, round by round (the
    shuffled-signal control of the noise policy: the same kind of schedule, not driven by this run's gradients)."""
    from nitro.scaling.policies import format_actor_counts

    source = proto.run("noise", noise_replay_source(seed))
    summary = _summary(out, source)
    if summary is None:
        return Planned("noise-replay", seed, None, f"waits for {source.run_id}")
    if not finished_as_planned(summary):
        return Planned("noise-replay", seed, None, f"not derivable: {source.run_id} ended {summary.get('state')}")
    counts = [int(r["actors_launched"]) for r in load_rounds(runs_dir(out), source) if int(r["actors_launched"]) > 0]
    if not counts:
        return Planned("noise-replay", seed, None, f"not derivable: {source.run_id} launched no actors")
    meta = {"derived_from": source.run_id, "source_rounds": len(counts), "actors_by_round": counts}
    return Planned("noise-replay", seed, proto.run("noise-replay", seed, {
        "policy": "noise-replay", "actors_by_round": format_actor_counts(counts)}, meta))


def plan(proto: Protocol, out: Path) -> list[Planned]:
    """Every run of the grid in execution order: per seed, nitro, then the independent schemes, then the
    derived ones (a derived run has no Run until its nitro run has a summary)."""
    planned = []
    for seed in proto.seeds:
        for scheme in proto.schemes:
            if scheme in DERIVED:
                continue
            planned.append(Planned(scheme, seed, proto.run(scheme, seed)))
        for scheme in proto.schemes:
            if scheme in DERIVED:
                planned.append(derive(proto, scheme, seed, out))
    return planned


def check_specs(proto: Protocol) -> None:
    """Every scheme's job spec passes the learner's own check (nitro.spec.validate, after the same proto round trip
    StartTraining does), so a combination the system refuses (--reproducible with learner mode stellaris or with
    minions, a scheduler trained for another I_max) stops the grid before any run, with the system's reason.
    The derived controls are checked with I_min standing in for the counts their nitro run will give."""
    from nitro.client.sdk import spec_to_proto
    from nitro.errors import ConfigError
    from nitro.spec import from_proto, refusal, validate

    stand_in = {"fixed-nbar": {"policy": "fixed", "fixed_actors": proto.i_min},
                "shuffled": {"policy": "replay", "actors_by_round": ",".join([str(proto.i_min)] * proto.rounds)},
                "noise-replay": {"policy": "noise-replay", "actors_by_round": str(proto.i_min)}}
    for scheme in proto.schemes:
        run = proto.run(scheme, proto.seeds[0], stand_in.get(scheme))
        try:
            validate(from_proto(spec_to_proto(run.spec())))
        except ConfigError as exc:
            status, detail = refusal(exc)
            raise ValueError(f"scheme {scheme}: the system refuses its job spec ({status}: {detail})") from None


def check_out_dir(proto: Protocol, out: Path) -> Protocol:
    """grid.json pins the scale of an out dir: resuming with another scale is an error, not a silent mix.

    It also pins the minions scheduler: the first command with one copies it into the out dir (SCHEDULER_FILE)
    and records its sha256; a later command with another file, or a finished minions run that used another one,
    is refused. Returns the protocol with its scheduler pointing at the grid's copy."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "grid.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    if saved:
        diff = scale_diff(proto, saved)
        if diff:
            what = ", ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())
            raise SystemExit(f"{out} holds a grid of another scale ({what}); pass --name or --out for a new grid")
        seeds = sorted(set(saved.get("seeds", [])) | set(proto.seeds))
        schemes = list(dict.fromkeys(list(saved.get("schemes", [])) + list(proto.schemes)))
    else:
        seeds, schemes = list(proto.seeds), list(proto.schemes)
    record = saved.get("scheduler")
    if proto.scheduler:
        proto, record = _adopt_scheduler(proto, out, record)
    grid = {"name": proto.name, "scale": proto.scale(), "seeds": seeds, "schemes": schemes}
    if record:
        grid["scheduler"] = record
    path.write_text(json.dumps(grid, indent=2) + "\n")
    return proto


def record_planned(proto: Protocol, out: Path) -> None:
    """Add the runs this command asked for (its schemes x its seeds) to the grid's PLANNED_FILE. Only a command
    that runs its grid records (not --report-only), and the file is this tree's own: grid.json is rewritten by
    every command, also by a clone's older code. grid.json's seeds and schemes are unions, so without this
    record a scheme added on fewer seeds (max, the floor: 5 of 10) would count as unfinished on the others."""
    path = Path(out) / PLANNED_FILE
    planned = {s: set(v) for s, v in (json.loads(path.read_text()) if path.exists() else {}).items()}
    for scheme in proto.schemes:
        planned.setdefault(scheme, set()).update(proto.seeds)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({s: sorted(v) for s, v in planned.items()}, indent=2) + "\n")
    os.replace(tmp, path)


def planned_runs(proto: Protocol, out: Path) -> set[tuple[str, int]] | None:
    """(scheme, seed) of every run the grid's commands asked for (PLANNED_FILE), and every run the out dir
    holds, finished or started; None for a grid without the record (its table counts every scheme on every
    seed, as before the record existed)."""
    path = Path(out) / PLANNED_FILE
    if not path.exists():
        return None
    pairs = {(s, seed) for s, seeds in json.loads(path.read_text()).items() for seed in seeds}
    return pairs | {(p.scheme, p.seed) for p in plan(whole_grid(proto, out), out)
                    if p.run is not None and (runs_dir(out) / p.run.run_id / "run.json").exists()}


def _adopt_scheduler(proto: Protocol, out: Path, record: dict | None) -> tuple[Protocol, dict]:
    """Refuse a scheduler other than the grid's; copy it into the grid once. Returns (protocol, grid.json record)."""
    sha = proto.scheduler_sha256
    if record and record.get("sha256") != sha:
        raise SystemExit(f"--scheduler {proto.scheduler} (sha256 {sha[:12]}) is not the scheduler of the grid in {out} "
                         f"({record.get('file')}, sha256 {str(record.get('sha256'))[:12]}, copied from "
                         f"{record.get('source')}): one grid compares one scheduler; pass that file (or no "
                         "--scheduler: the grid's copy is used), or --name/--out for a new grid")
    for run_json in sorted(runs_dir(out).glob("*/run.json")):
        run = json.loads(run_json.read_text())
        if run.get("scaler") != "minions" or not (run_json.parent / "summary.json").exists():
            continue
        used = (run.get("meta") or {}).get("scheduler_sha256")
        if used != sha:
            raise SystemExit(f"--scheduler {proto.scheduler} (sha256 {sha[:12]}) is not the scheduler the finished "
                             f"minions run {run_json.parent.name} used (sha256 {str(used)[:12]}): a grid must not "
                             "mix schedulers; pass that run's scheduler, or --name/--out for a new grid")
    copy = (out / SCHEDULER_FILE).resolve()
    if not copy.exists() or file_sha256(copy) != sha:
        tmp = copy.with_suffix(".tmp")
        shutil.copyfile(proto.scheduler, tmp)
        os.replace(tmp, copy)
    if record is None:
        record = _new_scheduler_record(copy, sha, proto.scheduler)
    return dataclasses.replace(proto, scheduler=str(copy)), record


def _new_scheduler_record(path: Path, sha256: str, source: str) -> dict:
    """grid.json's record of a minions scheduler: its file, sha256, origin and pre-training metadata."""
    from nitro.scaling.minions import pretraining_info

    return {"file": Path(path).name, "sha256": sha256, "source": source,
            "pretraining": {k: v for k, v in pretraining_info(path).items() if k != "jobs"}}


def _pinned_scheduler(out: Path) -> dict | None:
    """The scheduler record grid.json pins, if any."""
    path = Path(out) / "grid.json"
    return json.loads(path.read_text()).get("scheduler") if path.exists() else None


def grid_scheduler(out: Path) -> str:
    """The grid's copy of its minions scheduler ("" when it has none); refuses a copy that is not the pinned file."""
    path = Path(out) / "grid.json"
    record = _pinned_scheduler(out)
    if not record:
        return ""
    copy = Path(out) / record["file"]
    if not copy.exists() or file_sha256(copy) != record["sha256"]:
        raise SystemExit(f"{copy}: missing or changed since the grid pinned it (sha256 {record['sha256'][:12]} in "
                         f"{path}); restore it, or pass --scheduler with the original ({record.get('source')})")
    return str(copy.resolve())


def whole_grid(proto: Protocol, out: Path) -> Protocol:
    """The protocol with every scheme and seed its out dir holds (grid.json keeps their union), so a table
    rebuilt after a second command that added schemes (e.g. max and the floor on fewer seeds) covers both."""
    path = Path(out) / "grid.json"
    if not path.exists():
        return proto
    saved = json.loads(path.read_text())
    schemes = tuple(dict.fromkeys(list(saved.get("schemes", [])) + list(proto.schemes)))
    seeds = tuple(sorted(set(saved.get("seeds", [])) | set(proto.seeds)))
    return dataclasses.replace(proto, schemes=schemes, seeds=seeds)


# -- execution --------------------------------------------------------------------------------------------


def tree_cpu_seconds() -> float | None:
    """CPU seconds of this process and all its descendants (the local system's services, endpoint workers)."""
    try:
        import psutil
    except ImportError:
        return None
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
        except psutil.Error:
            continue
    return total


def code_version(root: Path = ROOT) -> str:
    """The commit of the code that runs, with "+dirty" when its tracked files differ from it."""
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


class LocalRunner:
    """Runs jobs through one LocalSystem, started on first use."""

    def __init__(self, state_dir: Path, concurrency: int = 64):
        self.state_dir, self.concurrency = Path(state_dir), concurrency
        self.system = self.client = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self.client is None:
                from nitro.client.sdk import NitroClient
                from nitro.local.system import LocalSystem

                # A run cut short by a restart is redone from scratch (run_one): the learner must not resume it
                # as well, or a twin would share the cores and the endpoint's actor concurrency with the rerun.
                self.system = LocalSystem(state_dir=self.state_dir, concurrency=self.concurrency,
                                          resume_jobs=False).start()
                self.client = NitroClient(self.system.learner_address)

    def __call__(self, run: Run, out_dir: Path) -> dict:
        self.start()
        return run_one(self.client, run, out_dir)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.system is not None:
            self.system.stop()
        self.system = self.client = None


def _same_files(a: Path, b: Path) -> bool:
    """Two run directories hold the same files with the same bytes (a lent copy that came back unchanged)."""
    files = lambda d: sorted(p.relative_to(d) for p in d.rglob("*") if p.is_file())  # noqa: E731
    if not b.is_dir() or files(a) != files(b):
        return False
    return all((a / f).read_bytes() == (b / f).read_bytes() for f in files(a))


def lend_runs(out: Path) -> list[str]:
    """Copy a published grid's finished runs (runs_dir: data/grids/NAME/runs) to OUT/runs, where a clone whose code
    predates runs_dir looks for them: the runs it derives controls from (noise-replay replays another seed's noise
    run) and those it skips as done. adopt_runs takes them back; the run ids lent."""
    legacy, home = Path(out) / "runs", runs_dir(out)
    if legacy.resolve() == home.resolve() or not home.is_dir():
        return []
    lent = []
    for d in sorted(p for p in home.iterdir() if p.is_dir()):
        if not (legacy / d.name).exists():
            shutil.copytree(d, legacy / d.name)
            lent.append(d.name)
    return lent


def adopt_runs(out: Path, commit: bool = False) -> list[str]:
    """Move the runs a clone whose code predates runs_dir wrote beside a published grid (OUT/runs) to where they
    live (runs_dir: data/grids/NAME/runs), replacing a copy there; the run ids moved. Copies lend_runs made that
    came back unchanged are dropped, not moved. A run still being written is not there: the clone has exited
    when this runs."""
    legacy, home = Path(out) / "runs", runs_dir(out)
    if legacy.resolve() == home.resolve() or not legacy.is_dir():
        return []
    home.mkdir(parents=True, exist_ok=True)
    moved = []
    for d in sorted(p for p in legacy.iterdir() if p.is_dir()):
        if _same_files(d, home / d.name):
            shutil.rmtree(d)
            continue
        if (home / d.name).exists():
            shutil.rmtree(home / d.name)
        shutil.move(str(d), str(home / d.name))
        moved.append(d.name)
    shutil.rmtree(legacy)
    if commit and moved:
        message = f"protocol {Path(out).name}: {', '.join(moved)} moved to {home.parent.name}'s data folder"
        top = git_toplevel(home)
        if top is not None:  # both sides of the move in one commit
            subprocess.run(["git", "-C", str(top), "add", "-A", "--", str(legacy.relative_to(top)),
                            str(home.relative_to(top))], capture_output=True)
            subprocess.run(["git", "-C", str(top), "commit", "-q", "-m", message, "--",
                            str(legacy.relative_to(top)), str(home.relative_to(top))], capture_output=True)
    return moved


def git_toplevel(path: Path) -> Path | None:
    """The work tree holding `path` when git tracks it (None outside a repository or under an ignored path)."""
    path = Path(path).resolve()
    probe = path if path.is_dir() else path.parent
    try:
        top = subprocess.run(["git", "-C", str(probe), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    ignored = subprocess.run(["git", "-C", top, "check-ignore", "-q", str(path)], capture_output=True)
    return None if ignored.returncode == 0 else Path(top)


def commit_results(path: Path, message: str, log: Callable[[str], None] = print, attempts: int = 20) -> bool:
    """git add + commit exactly `path` (nothing else that is staged) in the repository holding it."""
    path = Path(path).resolve()
    top = git_toplevel(path)
    if top is None:
        log(f"  (not committed: {path} is not tracked by git)")
        return False
    rel = str(path.relative_to(top))
    for i in range(attempts):
        add = subprocess.run(["git", "-C", str(top), "add", "--", rel], capture_output=True, text=True)
        res = add
        if add.returncode == 0:
            staged = subprocess.run(["git", "-C", str(top), "diff", "--cached", "--quiet", "--", rel])
            if staged.returncode == 0:
                return False  # nothing new
            res = subprocess.run(["git", "-C", str(top), "commit", "-q", "-m", message, "--", rel],
                                 capture_output=True, text=True)
            if res.returncode == 0:
                return True
        if "index.lock" not in (res.stderr + res.stdout):
            log(f"  (commit failed: {(res.stderr or res.stdout).strip()})")
            return False
        time.sleep(min(2.0 * (i + 1), 10.0))  # another git command holds the index
    log("  (commit failed: the index stayed locked)")
    return False


def _final_line(out: Path, run: Run, proto: Protocol) -> str:
    summ = _summary(out, run) or {}
    rounds = load_rounds(runs_dir(out), run)
    evals = evaluations(rounds, proto.eval_every)
    fin = final_return(evals, proto.final_evals)
    usd, clock = run_cost(rounds)
    return (f"{summ.get('state', '?')}, {len(rounds)} rounds, final {fin:.1f}, {clock} ${usd:.4f}"
            + (f" ({summ.get('message')})" if "budget" in str(summ.get("message", "")) else ""))


def execute(proto: Protocol, out: Path, *, runner: Callable[[Run, Path], dict] | None = None,
            state_dir: Path | None = None, chunk: int | None = None, parallel: int = 1, concurrency: int = 64,
            commit: bool = True, log: Callable[[str], None] = print) -> dict:
    """Run what is left of the grid (at most `chunk` runs); derived runs are planned as their nitro run ends.

    Returns {"done": finished runs of the grid, "total": its runs, "ran": runs finished by this call}.
    """
    out = Path(out)
    check_specs(proto)
    proto = check_out_dir(proto, out)
    record_planned(proto, out)
    runs_dir(out).mkdir(parents=True, exist_ok=True)
    own_runner = runner is None
    if runner is None:
        runner = LocalRunner(state_dir or ROOT / "results" / ".protocol-state" / proto.name, concurrency)
    version = code_version()
    if commit and git_toplevel(out) is None:
        log(f"results not committed: {out} is not tracked by git (ignored, or outside a repository)")
        commit = False
    total = len(plan(proto, out))
    lock = threading.Lock()
    in_progress: set[str] = set()
    counters = {"ran": 0, "started": 0}
    t_start = time.time()
    durations: list[float] = []

    def done_count() -> int:
        return sum(1 for p in plan(proto, out) if p.run is not None and is_done(out, p.run))

    first = done_count()
    log(f"{proto.name}: {total} runs, {first} already done, {total - first} to go "
        f"({proto.describe()}); out {out}")

    def next_run() -> tuple[Run, Planned] | None:
        with lock:
            if chunk is not None and counters["started"] >= chunk:
                return None
            for p in plan(proto, out):
                if p.run is not None and not is_done(out, p.run) and p.run.run_id not in in_progress:
                    in_progress.add(p.run.run_id)
                    counters["started"] += 1
                    return p.run, p
            return None

    def worker() -> None:
        while (item := next_run()) is not None:
            run, p = item
            meta = dict(run.meta, code_version=version, scheme=p.scheme)
            run = dataclasses.replace(run, meta=meta)
            if hasattr(runner, "start"):
                runner.start()  # the system's start-up is not the run's CPU time
            t0, cpu0 = time.time(), tree_cpu_seconds() if parallel == 1 else None
            runner(run, runs_dir(out))
            cpu1 = tree_cpu_seconds() if parallel == 1 else None
            took = time.time() - t0
            _annotate(out, run, cpu_s=None if cpu0 is None or cpu1 is None else cpu1 - cpu0, wall_s=took)
            csv = runs_dir(out) / run.run_id / "rounds.csv"
            csv.unlink(missing_ok=True)  # rounds.jsonl holds the same, and is what gets committed
            with lock:
                in_progress.discard(run.run_id)
                counters["ran"] += 1
                durations.append(took)
                n_done = done_count()
                left = total - n_done
                eta = left * float(np.mean(durations)) / max(1, parallel)
                log(f"[{n_done}/{total}] {run.run_id} ({title(p.scheme, proto.i_min, proto.i_max)}, seed {p.seed}): "
                    f"{_final_line(out, run, proto)}, {took:.0f} s; elapsed {time.time() - t_start:.0f} s, "
                    f"about {eta / 60:.0f} min left")
                if commit:
                    commit_results(out, f"protocol {proto.name}: {run.run_id} ({n_done}/{total} runs)", log)

    try:
        if parallel <= 1:
            worker()
        else:
            threads = [threading.Thread(target=worker, daemon=True) for _ in range(parallel)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        if own_runner:
            runner.close()
    waiting = [p for p in plan(proto, out) if p.run is None]
    for p in waiting:
        log(f"  {p.scheme} seed {p.seed}: {p.why}")
    return {"done": done_count(), "total": total, "ran": counters["ran"]}


def _annotate(out: Path, run: Run, **fields) -> None:
    """Add the protocol's measurements to a finished run's summary.json (atomically)."""
    path = runs_dir(out) / run.run_id / "summary.json"
    if not path.exists():
        return
    summary = json.loads(path.read_text())
    summary["protocol"] = {**summary.get("protocol", {}), **fields, "scheme": run.meta.get("scheme", run.scaler),
                           "code_version": run.meta.get("code_version")}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    os.replace(tmp, path)


# -- analysis ---------------------------------------------------------------------------------------------


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def evaluations(rounds: Sequence[dict], eval_every: int) -> list[dict]:
    """The evaluated rounds: {round, env_steps, usd (modelled cloud, else this machine's), return}.

    Rounds flagged `evaluated`; for reports without that flag, rounds with a finite eval_return after every
    eval_every-th round and after the last.
    """
    flagged = any(r.get("evaluated") for r in rounds)
    pts = []
    for i, r in enumerate(rounds):
        ret = r.get("eval_return")
        if not _finite(ret):
            continue
        if flagged and not r.get("evaluated"):
            continue
        if not flagged and not ((int(r.get("round", i)) + 1) % eval_every == 0 or i == len(rounds) - 1):
            continue
        cloud = r.get("cloud_total_cost_usd")
        usd = cloud if _finite(cloud) and cloud > 0 else r.get("total_cost_usd", 0.0)
        pts.append({"round": int(r.get("round", i)), "env_steps": int(r.get("total_env_steps", 0)),
                    "usd": float(usd), "return": float(ret)})
    return pts


def final_return(evals: Sequence[dict], n: int = FINAL_EVALS) -> float:
    """Mean of the last n evaluations (NaN without any)."""
    vals = [e["return"] for e in evals][-n:]
    return float(np.mean(vals)) if vals else math.nan


def run_cost(rounds: Sequence[dict]) -> tuple[float, str]:
    """(total USD, clock): the modelled cloud bill when the reports carry it, else this machine's."""
    if not rounds:
        return 0.0, "cloud"
    last = rounds[-1]
    cloud = last.get("cloud_total_cost_usd")
    if _finite(cloud) and cloud > 0:
        return float(cloud), "cloud"
    return float(last.get("total_cost_usd", 0.0) or 0.0), "machine"


def budget_bound(summary: dict) -> bool:
    return str(summary.get("message", "")).startswith("budget exhausted")


def _rly():
    try:
        from rliable import library, metrics
    except ImportError as exc:  # pragma: no cover - a dev dependency
        raise SystemExit(f"the protocol's aggregates need rliable ({exc}): pip install -e '.[dev]'") from None
    # arch (rliable's bootstrap) warns that a RandomState argument is deprecated; it is what rliable passes.
    warnings.filterwarnings("ignore", message="random_state is deprecated", category=FutureWarning)
    return library, metrics


@contextlib.contextmanager
def _seeded(seed: int):
    """rliable's stratified bootstrap draws its indices from numpy's global RNG (its random_state argument only
    reaches arch), so a reproducible interval seeds that, and restores it afterwards."""
    saved = np.random.get_state()
    np.random.seed(seed)
    try:
        yield np.random.RandomState(seed)
    finally:
        np.random.set_state(saved)


def iqm(values) -> float:
    """Interquartile mean: the mean of the middle 50% (25% trimmed from each end; rliable.metrics.aggregate_iqm)."""
    _, metrics = _rly()
    arr = np.asarray(values, dtype=float).reshape(-1, 1)
    return float(metrics.aggregate_iqm(arr)) if arr.size else math.nan


def iqm_interval(values_by_scheme: dict[str, Sequence[float]], reps: int = BOOTSTRAP_REPS,
                 seed: int = 0) -> dict[str, tuple[float, float, float]]:
    """IQM with a 95% stratified-bootstrap CI (runs x 1 task) per scheme: {scheme: (iqm, low, high)}.

    Each scheme is resampled with its own seeded RNG (nitro.policy.evaluation.iqm_interval, rliable), so its
    interval does not depend on the others.
    """
    from nitro.policy.evaluation import iqm_interval as one

    return {k: one(v, reps, seed)[:3] for k, v in values_by_scheme.items() if len(v)}


def probability_of_improvement(x: Sequence[float], y: Sequence[float], reps: int = BOOTSTRAP_REPS,
                               seed: int = 0) -> tuple[float, float, float]:
    """P(X > Y) (ties count half) for one task, with a 95% stratified-bootstrap CI: (p, low, high)."""
    library, metrics = _rly()
    xs, ys = np.asarray(x, dtype=float).reshape(-1, 1), np.asarray(y, dtype=float).reshape(-1, 1)
    if not xs.size or not ys.size:
        return math.nan, math.nan, math.nan
    with _seeded(seed) as rs:
        points, cis = library.get_interval_estimates({"x,y": (xs, ys)}, metrics.probability_of_improvement,
                                                     reps=reps, random_state=rs)
    return float(np.squeeze(points["x,y"])), float(np.squeeze(cis["x,y"][0])), float(np.squeeze(cis["x,y"][1]))


def paired_difference(x: dict[int, float], y: dict[int, float], reps: int = BOOTSTRAP_REPS,
                      seed: int = 0) -> dict | None:
    """x - y over the seeds both have (fixed:N-bar and shuffled are built from the same seed's nitro run,
    so seed-paired differences are the sharper test): mean with a 95% percentile bootstrap CI over seeds,
    and how many seeds x wins. None without a common seed."""
    common = sorted(set(x) & set(y))
    if not common:
        return None
    diff = np.asarray([x[k] - y[k] for k in common], dtype=float)
    rng = np.random.default_rng(seed)
    boots = diff[rng.integers(0, len(diff), size=(reps, len(diff)))].mean(axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"mean": float(diff.mean()), "low": float(lo), "high": float(hi), "wins": int((diff > 0).sum()),
            "seeds": len(common)}


def curve_on_grid(points: Sequence[tuple[float, float]], grid: np.ndarray) -> np.ndarray:
    """A run's (x, return) evaluations linearly interpolated at `grid` (x must lie within the run's range)."""
    xs = np.asarray([p[0] for p in points], dtype=float)
    ys = np.asarray([p[1] for p in points], dtype=float)
    order = np.argsort(xs, kind="stable")
    return np.interp(grid, xs[order], ys[order])


def iqm_curve(per_run: Sequence[Sequence[tuple[float, float]]], n: int = 40, reps: int = 500,
              seed: int = 0) -> dict | None:
    """IQM across runs (95% bootstrap band) on a common x grid spanning the range every run covers."""
    runs = [p for p in per_run if len(p) >= 1]
    if not runs:
        return None
    lo = max(min(x for x, _ in p) for p in runs)
    hi = min(max(x for x, _ in p) for p in runs)
    if not hi > lo:
        return None
    grid = np.linspace(lo, hi, n)
    mat = np.stack([curve_on_grid(p, grid) for p in runs])  # runs x points
    library, _ = _rly()
    from scipy.stats import trim_mean

    with _seeded(seed) as rs:
        points, cis = library.get_interval_estimates({"c": mat[:, None, :]},
                                                     lambda s: trim_mean(s.reshape(s.shape[0], -1), 0.25, axis=0),
                                                     reps=reps, random_state=rs)
    return {"x": grid, "iqm": points["c"], "low": cis["c"][0], "high": cis["c"][1]}


@dataclass
class SchemeData:
    scheme: str
    seeds: list[int] = field(default_factory=list)
    final: list[float] = field(default_factory=list)
    usd: list[float] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    mean_actors: list[float] = field(default_factory=list)
    cpu_s: list[float | None] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    bound: list[bool] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    clocks: set = field(default_factory=set)
    curves_steps: list = field(default_factory=list)
    curves_usd: list = field(default_factory=list)
    actors: list = field(default_factory=list)
    meta: list = field(default_factory=list)


def collect(proto: Protocol, out: Path) -> dict[str, SchemeData]:
    data = {s: SchemeData(s) for s in proto.schemes}
    for p in plan(proto, out):
        if p.run is None or not is_done(out, p.run):
            continue
        d = data[p.scheme]
        summ = _summary(out, p.run) or {}
        if not finished_as_planned(summ):
            d.failed.append(f"seed {p.seed}: {summ.get('state')} {summ.get('message', '')}".strip())
            continue
        rounds = load_rounds(runs_dir(out), p.run)
        evals = evaluations(rounds, proto.eval_every)
        usd, clock = run_cost(rounds)
        d.seeds.append(p.seed)
        d.final.append(final_return(evals, proto.final_evals))
        d.usd.append(usd)
        d.clocks.add(clock)
        d.steps.append(float(rounds[-1].get("total_env_steps", 0)) if rounds else 0.0)
        d.rounds.append(len(rounds))
        d.mean_actors.append(float(np.mean([r.get("actors_launched", 0) for r in rounds])) if rounds else 0.0)
        prot = summ.get("protocol") or {}
        d.cpu_s.append(prot.get("cpu_s"))
        d.wall_s.append(float(prot.get("wall_s") or summ.get("wall_s") or 0.0))
        d.bound.append(budget_bound(summ))
        d.curves_steps.append([(e["env_steps"], e["return"]) for e in evals])
        d.curves_usd.append([(e["usd"], e["return"]) for e in evals])
        d.actors.append([int(r.get("actors_launched", 0)) for r in rounds])
        d.meta.append(json.loads((runs_dir(out) / p.run.run_id / "run.json").read_text()).get("meta", {}))
    return data


# -- report -----------------------------------------------------------------------------------------------


def _ci(t: tuple[float, float, float] | None, fmt: str) -> str:
    if t is None or not all(math.isfinite(v) for v in t):
        return "n/a"
    return f"{format(t[0], fmt)} [{format(t[1], fmt)}, {format(t[2], fmt)}]"


def report(proto: Protocol, out: Path, command: str, *, reps: int = BOOTSTRAP_REPS, log=print,
           planned: set[tuple[str, int]] | None = None) -> dict:
    """Table (markdown), curves (PNG) and numbers (JSON) of whatever runs have finished; returns the numbers.
    `planned`: the (scheme, seed) runs the grid was asked for (`planned_runs`), when not every scheme of
    `proto` was asked for on every seed of it."""
    out = Path(out)
    data = collect(proto, out)
    finals = iqm_interval({s: d.final for s, d in data.items() if d.final}, reps)
    costs = iqm_interval({s: d.usd for s, d in data.items() if d.usd}, reps)
    steps = {s: iqm(d.steps) for s, d in data.items() if d.steps}
    nitro = data.get("nitro")
    poi = {}
    if nitro is not None and nitro.final:
        for s, d in data.items():
            if s != "nitro" and d.final:
                poi[s] = probability_of_improvement(nitro.final, d.final, reps)
    clocks = set().union(*(d.clocks for d in data.values())) if data else set()
    clock_name = "modelled cloud USD" if clocks <= {"cloud"} else "USD (this machine's clock: no cloud cost reported)"
    n_done = sum(len(d.final) + len(d.failed) for d in data.values())
    n_total = len(plan(proto, out) if planned is None else planned)
    sched = scheduler_record(proto, out) if "minions" in data else None
    pre_usd = (sched.get("pretraining") or {}).get("cost_usd") if sched else None
    with_pre = {}
    if _finite(pre_usd) and costs.get("minions"):  # the IQM and its bootstrap CI shift with a constant
        with_pre["minions"] = tuple(v + pre_usd for v in costs["minions"])
    lines = [f"### Evaluation protocol: {proto.name}", "",
             f"Scale: {proto.describe()}.", "",
             f"Command: `{command}`", "",
             f"Code: {sorted({m.get('code_version', '?') for d in data.values() for m in d.meta}) or ['n/a']}; "
             f"{n_done} of {n_total} runs finished" + ("" if n_done == n_total else " (partial)") + ".", "",
             f"| scheme | runs | final return, IQM [95% CI] | {clock_name}, IQM [95% CI] | env steps (IQM) | "
             f"actors/round (mean) | rounds (mean) | P(nitro > scheme) [95% CI] | CPU hours |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s, d in data.items():
        cpu = [c for c in d.cpu_s if c is not None]
        cpu_h = f"{sum(cpu) / 3600:.3g}" if cpu and len(cpu) == len(d.cpu_s) else \
            (f"≥{sum(cpu) / 3600:.3g}" if cpu else "n/a")
        name = title(s, proto.i_min, proto.i_max)
        if s == "fixed-nbar" and d.meta:
            name += f" = {', '.join(str(m.get('nbar')) for m in d.meta)}"
        pi = "—" if s == "nitro" else _ci(poi.get(s), ".2f")
        usd = _ci(costs.get(s), ".4f")
        if s in with_pre:
            usd += f" + {pre_usd:.4f} pre-training = {_ci(with_pre[s], '.4f')}"
        lines.append(f"| {name} | {len(d.final)}{f' ({len(d.failed)} failed)' if d.failed else ''} | "
                     f"{_ci(finals.get(s), '.1f')} | {usd} | "
                     f"{steps.get(s, math.nan):,.0f} | {np.mean(d.mean_actors) if d.mean_actors else math.nan:.1f} | "
                     f"{np.mean(d.rounds) if d.rounds else math.nan:.1f} | {pi} | {cpu_h} |")
    all_cpu = [c for d in data.values() for c in d.cpu_s if c is not None]
    lines += ["", "Final return: mean of each run's last "
              f"{proto.final_evals} evaluations ({proto.eval_episodes} deterministic episodes each); IQM = mean of the "
              "middle 50% of runs; CIs: 95% percentile stratified bootstrap over runs "
              f"({reps} resamples, rliable); P(nitro > scheme): probability that a random nitro run's final return "
              "beats a random run of the scheme (ties count half). Dollars: the run's modelled cloud bill at its end "
              "(every actor on its own vCPU; docs/cost.md). CPU hours: CPU time of the local system's processes "
              f"on this machine while the runs ran (all schemes: {sum(all_cpu) / 3600:.3g} h)."]
    if sched is not None:
        lines.append("\n" + minions_note(proto, sched, len(data["minions"].final)))
    if proto.budget_usd is not None:
        bound = {s: (sum(d.bound), len(d.bound)) for s, d in data.items()}
        lines.append(f"\nBudget ${proto.budget_usd:g} per run on the cloud clock; runs the budget stopped: "
                     + ", ".join(f"{title(s, proto.i_min, proto.i_max)} {b}/{n}" for s, (b, n) in bound.items()) + ".")
        loose = [s for s, (b, n) in bound.items() if b < n]
        if loose:
            lines.append(f"**Warning**: the budget did not bind for every run of {loose}: raise --rounds so the "
                         "comparison is at equal dollars.")
    for s, d in data.items():
        for f in d.failed:
            lines.append(f"\n{title(s, proto.i_min, proto.i_max)} {f}")
    paired = {}
    if nitro is not None and nitro.final:
        for s, d in data.items():
            if s != "nitro" and d.final:
                paired[s] = paired_difference(dict(zip(nitro.seeds, nitro.final)), dict(zip(d.seeds, d.final)), reps)
        rows = [f"| {title(s, proto.i_min, proto.i_max)} | {pd['mean']:+.1f} [{pd['low']:+.1f}, {pd['high']:+.1f}] | "
                f"{pd['wins']}/{pd['seeds']} |" for s, pd in paired.items() if pd]
        if rows:
            lines += ["", "Seed-paired: nitro's final return minus the scheme's on the same seed (95% bootstrap CI "
                      "over seeds) and the seeds nitro wins:", "", "| scheme | nitro - scheme | nitro wins |",
                      "|---|---|---|", *rows]
    waiting = [p for p in plan(proto, out) if p.run is None]
    if waiting:
        lines.append("\nNot run yet: " + "; ".join(f"{p.scheme} seed {p.seed} ({p.why})" for p in waiting))
    table = "\n".join(lines) + "\n"
    (out / "table.md").write_text(table)
    _plot(proto, data, out / "curves.png", clock_name)
    numbers = {"name": proto.name, "scale": proto.scale(), "command": command,
               "schemes": {s: {"seeds": d.seeds, "final": d.final, "usd": d.usd, "env_steps": d.steps,
                               "rounds": d.rounds, "mean_actors": d.mean_actors, "cpu_s": d.cpu_s,
                               "budget_bound": d.bound, "failed": d.failed, "derived": d.meta,
                               "final_iqm_ci": finals.get(s), "usd_iqm_ci": costs.get(s),
                               "p_nitro_better_ci": poi.get(s), "paired_vs_nitro": paired.get(s),
                               **({"usd_with_pretraining_iqm_ci": with_pre[s]} if s in with_pre else {})}
                           for s, d in data.items()}}
    if sched is not None:
        numbers["scheduler"] = sched
    (out / "report.json").write_text(json.dumps(numbers, indent=2, default=str) + "\n")
    log("\n" + table + f"\nplots: {out / 'curves.png'}\ntable: {out / 'table.md'}")
    return numbers


def scheduler_record(proto: Protocol, out: Path) -> dict | None:
    """The minions scheduler as grid.json pins it (file, sha256, source, pre-training metadata), else as
    proto names it."""
    record = _pinned_scheduler(out)
    if record or not proto.scheduler:
        return record
    return _new_scheduler_record(Path(proto.scheduler), proto.scheduler_sha256, proto.scheduler)


def minions_note(proto: Protocol, sched: dict, runs: int) -> str:
    """What the table says about the minions scheduler: which file, what its pre-training cost, and how that
    cost enters the row (shown separately and added to each run, as fig15 does)."""
    pre = sched.get("pretraining") or {}
    head = (f"minions: scheduler `{sched.get('file')}` in this grid (sha256 {str(sched.get('sha256'))[:12]}, "
            f"copied from {sched.get('source')})")
    if not _finite(pre.get("cost_usd")):
        return head + ("; its checkpoint has no pre-training record (not written by `nitro pretrain-minions`), so "
                       "its pre-training cost is unknown and not added.")
    text = (head + f", pre-trained by `nitro pretrain-minions` ({pre.get('via')}) on {pre.get('env_id')}, I_max "
            f"{pre.get('i_max')}, {pre.get('steps_per_actor')} steps per actor, preset {pre.get('preset')}, "
            f"{pre.get('episodes')} jobs of {pre.get('rounds_per_episode')} rounds: {pre.get('wall_seconds', 0):,.1f} s "
            f"wall, {pre.get('cpu_seconds', 0):,.1f} CPU s, ${pre['cost_usd']:.4f} modelled. That cost is not in the "
            "run's dollars: the minions row shows it beside them and adds it to each run (as fig15: amortised over "
            "no other job")
    if runs > 1:
        text += f"; shared by this grid's {runs} minions runs it would be ${pre['cost_usd'] / runs:.4f} per run"
    text += "); the curves leave it out."
    mine = {"env_id": proto.env_id, "i_max": proto.i_max, "steps_per_actor": proto.steps_per_actor,
            "preset": proto.preset}
    differ = [f"{k} {pre.get(k)!r} (grid {v!r})" for k, v in mine.items() if k in pre and pre.get(k) != v]
    if differ:
        text += " **Pre-trained for other jobs than this grid's**: " + ", ".join(differ) + "."
    return text


def _plot(proto: Protocol, data: dict[str, SchemeData], path: Path, clock_name: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    by_steps, by_usd, actors = fig.subplots(1, 3)
    for i, (s, d) in enumerate(data.items()):
        color = f"C{i}"
        label = f"{title(s, proto.i_min, proto.i_max)} ({len(d.final)})"
        for ax, curves in ((by_steps, d.curves_steps), (by_usd, d.curves_usd)):
            c = iqm_curve(curves)
            if c is not None:
                ax.plot(c["x"], c["iqm"], color=color, label=label)
                ax.fill_between(c["x"], c["low"], c["high"], color=color, alpha=0.15)
            elif curves:  # a single evaluation point per run
                ax.scatter([p[0] for cv in curves for p in cv], [p[1] for cv in curves for p in cv], color=color,
                           s=10, label=label)
        if d.actors:
            n = max(len(a) for a in d.actors)
            for a in d.actors:
                actors.plot(range(len(a)), a, color=color, alpha=0.15, lw=0.8)
            mean = [np.mean([a[k] for a in d.actors if len(a) > k]) for k in range(n)]
            actors.step(range(n), mean, where="mid", color=color, label=label)
    by_steps.set_xlabel("env steps")
    by_steps.set_ylabel("eval return (IQM over seeds, 95% CI)")
    by_usd.set_xlabel(clock_name)
    by_usd.set_ylabel("eval return (IQM over seeds, 95% CI)")
    actors.set_xlabel("round")
    actors.set_ylabel("actors per round (mean; thin: each seed)")
    by_steps.legend(fontsize=7)
    fig.suptitle(textwrap.fill(f"{proto.name}: {proto.describe()}", 180), fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)


# -- clone, background, command line ------------------------------------------------------------------------


def _git(*args: str, cwd: Path | None = None, check: bool = True) -> str:
    res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {(res.stderr or res.stdout).strip()}")
    return res.stdout.strip()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ensure_clone(main_repo: Path, clone: Path, rev: str, log=print) -> str:
    """A clone of `main_repo` at commit `rev` (created, or moved there when no grid runs in it), with the main
    repo's .venv symlinked unless it has its own. Returns the commit."""
    main_repo, clone = Path(main_repo).resolve(), Path(clone).resolve()
    sha = _git("-C", str(main_repo), "rev-parse", "--verify", f"{rev}^{{commit}}")
    if not clone.exists():
        _git("clone", "--quiet", "--no-checkout", str(main_repo), str(clone))
        _git("-C", str(clone), "checkout", "--quiet", "--detach", sha)
        log(f"cloned {main_repo} at {sha[:12]} into {clone}")
    else:
        if not (clone / ".git").exists():
            raise SystemExit(f"--clone {clone}: exists and is not a git clone")
        head = _git("-C", str(clone), "rev-parse", "HEAD")
        if head != sha:
            holder = _lock_holder(clone)
            if holder:
                raise SystemExit(f"--clone {clone}: a grid (pid {holder}) runs there at {head[:12]}; wait for it or "
                                 f"use another clone directory for {sha[:12]}")
            if _git("-C", str(clone), "status", "--porcelain", "--untracked-files=no"):
                raise SystemExit(f"--clone {clone}: has local changes; it must stay at a commit")
            _git("-C", str(clone), "fetch", "--quiet", str(main_repo), sha)
            _git("-C", str(clone), "checkout", "--quiet", "--detach", sha)
            log(f"moved clone {clone} from {head[:12]} to {sha[:12]}")
    venv = clone / ".venv"
    if not venv.exists() and (main_repo / ".venv").exists():
        venv.symlink_to(main_repo / ".venv", target_is_directory=True)
    return sha


def _lock_holder(clone: Path) -> int | None:
    path = Path(clone) / LOCK_NAME
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid != os.getpid() and _pid_alive(pid) else None


def _strip(argv: list[str], flags: dict[str, bool]) -> list[str]:
    """argv without the given flags (flag -> takes a value)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in flags:
            skip = flags[name] and "=" not in a
            continue
        out.append(a)
    return out


def build_parser(figure: str) -> argparse.ArgumentParser:
    from nitro.spec import LEARNER_MODES

    p = argparse.ArgumentParser(prog=f"python -m experiments {figure}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("scale (defaults: the paper's; --smoke: CartPole-v1, preset fast, 10 rounds, 2 seeds)")
    g.add_argument("--smoke", action="store_true", help="the quick configuration (flags below still override)")
    g.add_argument("--env", dest="env_id")
    g.add_argument("--algo")
    g.add_argument("--preset")
    g.add_argument("--rounds", type=int)
    g.add_argument("--steps-per-actor", type=int)
    g.add_argument("--i-min", type=int)
    g.add_argument("--i-max", type=int)
    g.add_argument("--seeds", type=int, help="seeds 0..N-1")
    g.add_argument("--seed-list", help="comma-separated seeds (instead of --seeds)")
    g.add_argument("--schemes", help=f"comma-separated (default {','.join(DEFAULT_SCHEMES)}); also hydrozoa, "
                                     "kungfu, fixed:N")
    g.add_argument("--decay", type=float, default=0.96, help="d of nitro and schedule (default %(default)s)")
    g.add_argument("--eval-every", type=int, default=EVAL_EVERY)
    g.add_argument("--eval-episodes", type=int, default=EVAL_EPISODES)
    g.add_argument("--final-evals", type=int, default=FINAL_EVALS)
    g.add_argument("--budget", help="modelled cloud USD per run (budget-matched mode), or 'auto': the IQM of the "
                                    "nitro runs' cost in the matching unbudgeted grid")
    g.add_argument("--reproducible", action="store_true", help="actors start fresh episodes from their seeds")
    g.add_argument("--shuffle-seed", type=int, default=0)
    g.add_argument("--learner-mode", choices=LEARNER_MODES, default="central",
                   help="central (default) or stellaris: on-policy learning in serverless learner functions "
                        "(docs/stellaris.md); a grid of its own, named ...-stellaris")
    g.add_argument("--vtrace-critic", choices=("online", "target"), help="IMPACT: the critic V-trace reads (default: "
                   "the preset's); a grid's runs all use one")
    g.add_argument("--kappa", type=float, help="kappa of the schemes noise and noise-adascale (default: the system's, "
                                               "nitro.contracts.NOISE_KAPPA)")
    g.add_argument("--stop-at-reference-usd", type=float, dest="stop_usd",
                   help="stop each job once its bill at the reference rates (--rates) reaches this many USD")
    g.add_argument("--rates", help="a JSON file of nitro.cost.ReferenceRates fields (with --stop-at-reference-usd)")
    g.add_argument("--envs-per-actor", type=int, help="environments each actor steps in lockstep (default: the "
                                                      "system's); a grid's runs all use one")
    g.add_argument("--grow-f1", type=float, help="f1 of the scheme grow (default: the system's)")
    g.add_argument("--grow-f2", type=float, help="f2 of the scheme grow (default: the system's)")
    g.add_argument("--scheduler", metavar="PATH",
                   help="the scheme minions: a scheduler checkpoint of `nitro pretrain-minions`, trained for this "
                        "I_max; copied into the grid, whose later commands use that copy (without --schemes: "
                        "the default schemes and minions). Its pre-training cost is shown and added to minions' row")
    r = p.add_argument_group("running")
    r.add_argument("--name", help="grid name (default from env, algo, preset and mode)")
    r.add_argument("--out", help="grid directory (default docs/results/grids/NAME; --smoke: results/experiments/NAME)")
    r.add_argument("--state-dir", help="local system state (default results/.protocol-state/NAME)")
    r.add_argument("--chunk", type=int, help="run at most N runs this time, then report and exit")
    r.add_argument("--parallel", type=int, default=1, help="runs at once (default 1: one per 2 cores)")
    r.add_argument("--concurrency", type=int, default=64, help="local Lambda endpoint workers")
    r.add_argument("--reps", type=int, default=BOOTSTRAP_REPS, help="bootstrap resamples")
    r.add_argument("--report-only", action="store_true", help="only rebuild the table and plots")
    r.add_argument("--no-commit-results", dest="commit_results", action="store_false",
                   help="do not git-commit each finished run (default: commit when the out dir is tracked by git)")
    r.add_argument("--clone", help="run from this clone of the repository at --commit (created when missing)")
    r.add_argument("--commit", default="HEAD", help="the commit the clone runs (default %(default)s, resolved now)")
    r.add_argument("--background", action="store_true", help="detach; progress goes to results/protocol-logs/")
    return p


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def protocol_from_args(args, figure: str) -> Protocol:
    base = dict(SMOKE if args.smoke else PAPER)
    budget_mode = figure == "protocol-budget" or args.budget is not None
    vals = {k: getattr(args, k) if getattr(args, k, None) is not None else base[k]
            for k in ("env_id", "algo", "preset", "rounds", "steps_per_actor", "i_min", "i_max")}
    if budget_mode and args.rounds is None:
        vals["rounds"] = base["rounds"] * BUDGET_ROUNDS_FACTOR
    seeds = [int(s) for s in args.seed_list.split(",")] if args.seed_list else \
        list(range(args.seeds if args.seeds is not None else base["seeds"]))
    schemes = args.schemes.split(",") if args.schemes else list(DEFAULT_SCHEMES)
    if args.scheduler:
        if not args.schemes:
            schemes.append("minions")
        elif "minions" not in (t.strip().lower() for t in schemes):
            raise ValueError("--scheduler: only the scheme minions uses it; add minions to --schemes (--schemes "
                             "minions adds it to an existing grid)")
    mode = "" if args.learner_mode == "central" else f"-{args.learner_mode}"
    stem = f"{_slug(vals['env_id'])}-{vals['algo']}-{_slug(vals['preset'])}{mode}" + ("-smoke" if args.smoke else "")
    name = args.name or (f"protocol-budget-{stem}" if budget_mode else f"protocol-{stem}")
    # Without --scheduler a grid that has one keeps using its own copy (a later command may not name it).
    scheduler = args.scheduler or grid_scheduler(out_dir(args, name))
    budget = None
    if budget_mode:
        if args.budget in (None, "auto"):
            budget = _auto_budget(args, vals, stem)
        else:
            budget = float(args.budget)
        reserve = first_round_reserve_usd()
        if budget <= reserve:
            raise ValueError(f"budget ${budget:g} is below the scaler's first-round reserve (${reserve:.4f}: the "
                             "learner time it assumes before anything is measured), so every run would end at round "
                             "0; pass a larger --budget")
    proto = Protocol(name=name, seeds=tuple(seeds), schemes=tuple(schemes), eval_every=args.eval_every,
                     eval_episodes=args.eval_episodes, final_evals=args.final_evals, decay=args.decay,
                     budget_usd=budget, reproducible=args.reproducible, shuffle_seed=args.shuffle_seed,
                     learner_mode=args.learner_mode, vtrace_critic=args.vtrace_critic or "",
                     kappa=args.kappa, grow_f1=args.grow_f1, grow_f2=args.grow_f2, stop_usd=args.stop_usd,
                     envs_per_actor=args.envs_per_actor,
                     stop_rates=json.loads(Path(args.rates).read_text()) if args.rates else None,
                     scheduler=scheduler or "", **vals)
    check_specs(proto)
    return proto


def out_dir(args, name: str) -> Path:
    """The grid directory of a command: --out, else the default for its name."""
    if args.out:
        return Path(args.out).resolve()
    return _default_out(name, args.smoke, Path(os.environ.get("NITRO_PROTOCOL_MAIN_REPO", ROOT)))


def first_round_reserve_usd() -> float:
    """What the scaler requires for round 0 before anything is measured: its assumed learner time, billed."""
    from nitro.cost import FIRST_ROUND_LEARNER_S, Prices, learner_cost

    return learner_cost(FIRST_ROUND_LEARNER_S, Prices())


def _default_out(name: str, smoke: bool, main_repo: Path = ROOT) -> Path:
    return main_repo / ("results/experiments" if smoke else "docs/results/grids") / name


def _auto_budget(args, vals: dict, stem: str) -> float:
    """The IQM of the nitro runs' modelled cost in the unbudgeted grid of the same scale."""
    ref_name = f"protocol-{stem}"
    ref_out = _default_out(ref_name, args.smoke, Path(os.environ.get("NITRO_PROTOCOL_MAIN_REPO", ROOT)))
    costs = []
    rdir = runs_dir(ref_out)
    if rdir.exists():
        for d in sorted(rdir.iterdir()):
            summ = d / "summary.json"
            if d.name.startswith(f"{_slug(vals['env_id'])}-{vals['algo']}-nitro-s") and summ.exists():
                rounds = [json.loads(x) for x in (d / "rounds.jsonl").read_text().splitlines() if x.strip()]
                costs.append(run_cost(rounds)[0])
    if not costs:
        raise SystemExit(f"--budget auto: no finished nitro runs in {ref_out}; run `python -m experiments protocol"
                         f"{' --smoke' if args.smoke else ''}` first (same scale) or pass --budget USD")
    return round(iqm(costs), 6)


def portable(text: str, main_repo: Path) -> str:
    """A recorded command without this machine's paths: the repository's own as relative paths, its siblings'
    (the grids' clones) as ../NAME, so the tables in docs/ read the same on any machine."""
    root = str(Path(main_repo).resolve())
    return text.replace(root + "/", "").replace(str(Path(root).parent) + "/", "../")


def main(figure: str, argv: list[str] | None = None) -> int:
    argv = list(sys.argv[2:] if argv is None else argv)
    args = build_parser(figure).parse_args(argv)
    main_repo = Path(os.environ.get("NITRO_PROTOCOL_MAIN_REPO", ROOT))
    command = os.environ.get("NITRO_PROTOCOL_COMMAND") or portable(shlex.join(
        ["python", "-m", "experiments", figure, *_strip(argv, {"--background": False})]), main_repo)
    try:
        proto = protocol_from_args(args, figure)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    out = out_dir(args, proto.name)
    if args.scheduler:  # the detached or cloned command runs elsewhere: give it the file's absolute path
        argv = _strip(argv, {"--scheduler": True}) + ["--scheduler", str(Path(args.scheduler).resolve())]

    if args.background:
        logs = ROOT / "results" / "protocol-logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{proto.name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        inner = _strip(argv, {"--background": False})
        env = dict(os.environ, NITRO_PROTOCOL_COMMAND=command,
                   PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
        with open(log_path, "ab") as f:
            proc = subprocess.Popen([sys.executable, "-m", "experiments", figure, *inner], cwd=ROOT, env=env,
                                    stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        print(f"{proto.name}: running in the background, pid {proc.pid}\n  log: {log_path}\n  follow: tail -f "
              f"{log_path}\n  stop: kill {proc.pid}   (resume with the same command)", flush=True)
        return 0

    if args.clone and not args.report_only and command_finished(proto, out):
        # A restarted queue passes every finished command again: no clone run, no rebuilt table (minutes each).
        record_planned(proto, out)
        if args.commit_results and git_toplevel(out) is not None:
            commit_results(out / PLANNED_FILE, f"protocol {proto.name}: planned runs")
        print(f"{proto.name}: every run of this command has finished; nothing to run "
              "(--report-only rebuilds the table)", flush=True)
        return 0

    if args.clone:
        clone = Path(args.clone).resolve()
        sha = ensure_clone(main_repo, clone, args.commit)
        if not (clone / "experiments" / "protocol.py").exists():
            raise SystemExit(f"commit {sha[:12]} has no experiments/protocol.py")
        inner = _strip(argv, {"--clone": True, "--commit": True, "--out": True}) + ["--out", str(out)]
        env = dict(os.environ, NITRO_PROTOCOL_COMMAND=command, NITRO_PROTOCOL_MAIN_REPO=str(main_repo),
                   PYTHONPATH=str(clone))
        if same_scale(proto, out):  # before the run: a grid cut short still knows what it was asked for
            out.mkdir(parents=True, exist_ok=True)
            record_planned(proto, out)
        (clone / LOCK_NAME).write_text(f"{os.getpid()}\n")
        lend_runs(out)  # a clone's code may predate runs_dir: it finds the grid's finished runs in OUT/runs
        print(f"{proto.name}: running from {clone} at {sha[:12]}; results in {out}", flush=True)
        try:
            child = subprocess.Popen([str(clone / ".venv" / "bin" / "python"), "-m", "experiments", figure, *inner],
                                     cwd=clone, env=env)
            try:
                rc = child.wait()
            except KeyboardInterrupt:
                child.send_signal(signal.SIGINT)
                return child.wait()
        finally:
            (clone / LOCK_NAME).unlink(missing_ok=True)
        adopt_runs(out, commit=args.commit_results)  # a clone's code may predate runs_dir: its runs move home
        if rc == 0:  # the clone's code may predate whole_grid: its table covers only this command's schemes
            report_whole_grid(proto, out, command, reps=args.reps, commit=args.commit_results)
        return rc

    if not args.report_only:
        state = Path(args.state_dir) if args.state_dir else ROOT / "results" / ".protocol-state" / proto.name
        execute(proto, out, state_dir=state, chunk=args.chunk, parallel=args.parallel,
                concurrency=args.concurrency, commit=args.commit_results)
    else:
        proto = check_out_dir(proto, out)
    report_whole_grid(proto, out, command, reps=args.reps, commit=args.commit_results)
    return 0


def report_whole_grid(proto: Protocol, out: Path, command: str, *, reps: int, commit: bool) -> None:
    """Table, curves and numbers of every scheme and seed the out dir holds (`whole_grid`), committed when asked
    and the out dir is in a repository. Runs in this tree's code, also after a grid ran from a clone: the runs
    are the clone's, the analysis is this one's."""
    report(whole_grid(proto, out), out, command, reps=reps, planned=planned_runs(proto, out))
    if commit and git_toplevel(out) is not None:
        commit_results(out, f"protocol {proto.name}: table and curves")
