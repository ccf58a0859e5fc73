"""The signal test: does any round-level signal predict what boosting that round buys?

    python -m experiments signal --env Hopper-v5 --seeds 10          # runs (resumable, one file per seed)
    python -m experiments signal --env Hopper-v5 --report            # the Spearman table and decision test
    python -m experiments signal --pool DIR_HOPPER DIR_WALKER        # rho averaged over environments

For every seed a base run trains PPO with 8 actors x 512 steps per round (fixed:8) and, at branch
rounds k spread over training, forks its learner: arm (a) continues the base run (round k+1 with 8
actors, then H rounds with 8), arm (b) samples round k+1 with 64 actors (its first 8 with the same
seeds as arm a's), then the same H rounds with 8 actors and the same seeds. Both are evaluated on the
same 20 evaluation seeds; B_k = eval(b) - eval(a) is the benefit of boosting round k+1. Runs are
in-process (the learner and actor code of the services, without the network), in reproducible mode:
every actor starts fresh episodes from its own seed, so arm a is exactly the base run.

Candidate signals are computed at round k, after its update and before branching, from what the
system would know then: the convexity ratio R_k (paper Eq. 2) on the detector's 512-step subset
(three subset seeds, for its reliability) and on the whole batch, the boosting score S_k over R's
window (both orientations: the paper's R of the objective and R of the loss = 1/R), the gradient
noise scale B_simple and the gradient signal-to-noise ratio of the policy gradient alone, approx KL,
clip fraction and explained variance of update k, the curvature of the surrogate along update k's
step (u^T H u / |u|^2), the round index, and a random score. The report gives Spearman's rho of each
with B_k (95% CI by a bootstrap over seeds), the batch-size confound (R after the 64-actor round vs R
after the 8-actor round at the same k), and a decision test: the summed B_k of the m rounds each
signal would boost vs the best possible choice, random rounds and the earliest rounds.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from nitro.algos.ppo import PPOLearner
from nitro.config import make_config
from nitro.detector.core import detect
from nitro.detector.hvp import make_hvp, ppo_objective, select_subset
from nitro.detector.score import boosting_score
from nitro.policy.envs import env_spaces
from nitro.policy.inference import PolicyRunner
from nitro.policy.models import spec_for_spaces
from nitro.policy.rollout import Sampler, evaluate
from nitro.seeds import derived_seed

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "experiments" / "signal"

# Signals and the direction the paper (or common sense) says means "boost": +1 higher, -1 lower.
SIGNALS = {"R_sub": -1, "R_full": -1, "S_sub": 1, "S_full": 1, "S_loss": 1, "inv_R_sub": -1, "gns": 1,
           "gsnr": -1, "kl": 1, "clip_frac": 1, "curvature": -1, "explained_variance": -1, "round": -1,
           "random": 1}


@dataclass(frozen=True)
class SignalConfig:
    env_id: str = "Hopper-v5"
    preset: str = "tuned"
    base_rounds: int = 30
    branches: int = 10
    actors: int = 8
    boost: int = 64
    steps: int = 512
    horizon: int = 3
    eval_episodes: int = 20
    subset: int = 512
    subset_seeds: int = 3
    window: int = 6
    decay: float = 0.96
    hp: dict = field(default_factory=dict, hash=False)

    def branch_rounds(self) -> list[int]:
        """k in [1, base_rounds - horizon - 2], evenly spread: the base run covers k + 1 + horizon."""
        last = self.base_rounds - self.horizon - 2
        return sorted({int(round(x)) for x in np.linspace(1, last, self.branches)})


class Trainer:
    """A PPO learner and its actors, in process, reproducible: actor i of round r uses seed (seed, r, i)."""

    def __init__(self, cfg: SignalConfig, seed: int):
        self.cfg, self.seed = cfg, seed
        self.algo = make_config("ppo", cfg.preset, **cfg.hp)
        obs_space, act_space = env_spaces(cfg.env_id)
        self.spec = spec_for_spaces(obs_space, act_space, hidden_sizes=self.algo.hidden_sizes,
                                    activation=self.algo.activation, obs_norm=self.algo.obs_norm,
                                    init_log_std=self.algo.init_log_std)
        self.learner = PPOLearner(self.spec, self.algo, seed=seed)
        self.samplers: list[Sampler] = []
        self.version = 0

    def sampler(self, i: int) -> Sampler:
        while len(self.samplers) <= i:
            self.samplers.append(Sampler(self.cfg.env_id, seed=0))
        return self.samplers[i]

    def round(self, r: int, actors: int):
        runner = PolicyRunner(self.spec, self.learner.policy.numpy_state(), self.version)
        batches = []
        for i in range(actors):
            s = derived_seed(self.seed, r, i) % (2**31)
            sampler = self.sampler(i)
            sampler.reseed(s)
            batches.append(sampler.sample(runner, self.cfg.steps, np.random.default_rng(s)))
        before = [p.detach().clone() for p in self.learner.policy.policy_parameters()]
        stats = self.learner.update(batches)
        self.learner.policy.update_obs_stats(np.concatenate([b["obs"] for b in batches]))
        self.version += 1
        step = torch.cat([(p.detach() - b).reshape(-1) for p, b in zip(self.learner.policy.policy_parameters(),
                                                                        before)])
        return stats, step

    def evaluate(self, eval_seed: int) -> list[float]:
        runner = PolicyRunner(self.spec, self.learner.policy.numpy_state(), self.version)
        return evaluate(runner, self.cfg.env_id, self.cfg.eval_episodes, seed=eval_seed)

    def fork(self) -> "Trainer":
        other = copy.copy(self)
        other.learner = copy.deepcopy(self.learner)
        other.samplers = []  # fresh environments: every actor reseeds before it samples anyway
        return other

    def close(self) -> None:
        for s in self.samplers:
            s.close()


def ratio(policy, data: dict, clip: float, *, subset: int, seed: int, full: bool = False) -> float:
    return detect(policy, data, clip=clip, subset_size=subset, seed=seed, full_batch=full).ratio


def gradient_signals(policy, data: dict, clip: float, minibatch: int = 256) -> tuple[float, float]:
    """(B_simple, GSNR) of the policy surrogate's gradient alone, from the batch's minibatch gradients.

    B_simple = tr(Sigma) / |G|^2 with the unbiased small/large-batch estimates; GSNR = the mean over
    parameters of E[g]^2 / Var[g] across minibatches (Liu et al. 2020's definition)."""
    n = len(data["obs"])
    minibatch = max(2, min(minibatch, n // 4))  # at least 4 minibatches for the variance
    if n < 2 * minibatch:
        return float("nan"), float("nan")
    params = [p for p in policy.policy_parameters() if p.requires_grad]
    grads = []
    for start in range(0, n - minibatch + 1, minibatch):
        idx = np.arange(start, start + minibatch)
        obj = ppo_objective(policy, torch.as_tensor(data["obs"][idx]), torch.as_tensor(data["actions"][idx]),
                            torch.as_tensor(data["logp"][idx]), torch.as_tensor(data["advantages"][idx]), clip)
        g = torch.autograd.grad(obj(), params, allow_unused=True)
        grads.append(torch.cat([(x if x is not None else torch.zeros_like(p)).reshape(-1)
                                for x, p in zip(g, params)]).double())
    g = torch.stack(grads)
    b, big = minibatch, minibatch * len(grads)
    small_sq = float((g * g).sum(dim=1).mean())
    mean = g.mean(dim=0)
    big_sq = float(mean @ mean)
    true_sq = (big * big_sq - b * small_sq) / (big - b)
    trace = (small_sq - big_sq) / (1.0 / b - 1.0 / big)
    b_simple = trace / true_sq if true_sq > 0 else float("nan")
    var = g.var(dim=0, unbiased=True)
    gsnr = float(((mean * mean) / var.clamp_min(1e-30)).mean())
    return b_simple, gsnr


def curvature_along(policy, data: dict, clip: float, step: torch.Tensor, *, subset: int, seed: int) -> float:
    """u^T H u / |u|^2 of the surrogate at the updated policy along the update's step u."""
    if float(step @ step) == 0.0:
        return 0.0
    idx = select_subset(len(data["obs"]), subset, seed)
    obj = ppo_objective(policy, torch.as_tensor(data["obs"][idx]), torch.as_tensor(data["actions"][idx]),
                        torch.as_tensor(data["logp"][idx]), torch.as_tensor(data["advantages"][idx]), clip)
    params = [p for p in policy.policy_parameters() if p.requires_grad]
    with torch.enable_grad():
        hvp, _ = make_hvp(obj, params)
        return float(step @ hvp(step) / (step @ step))


def signals_at(trainer: Trainer, stats, step: torch.Tensor, k: int, history: dict[str, list[float]],
               rng: np.random.Generator) -> dict:
    cfg, policy, data, clip = trainer.cfg, trainer.learner.policy, trainer.learner.last_data, trainer.algo.clip
    subs = [ratio(policy, data, clip, subset=cfg.subset, seed=s) for s in range(cfg.subset_seeds)]
    full = ratio(policy, data, clip, subset=cfg.subset, seed=0, full=True)
    history["R_sub"].append(subs[0])
    history["R_full"].append(full)
    history["inv_R_sub"].append(1.0 / subs[0] if subs[0] != 0 else 0.0)
    gns, gsnr = gradient_signals(policy, data, clip)
    return {
        "R_sub": subs[0], "R_sub_seeds": subs, "R_full": full, "inv_R_sub": history["inv_R_sub"][-1],
        "S_sub": boosting_score(history["R_sub"], k, cfg.decay, cfg.window),
        "S_full": boosting_score(history["R_full"], k, cfg.decay, cfg.window),
        "S_loss": boosting_score(history["inv_R_sub"], k, cfg.decay, cfg.window),
        "gns": gns, "gsnr": gsnr, "kl": stats.kl, "clip_frac": stats.clip_frac,
        "explained_variance": stats.explained_variance,
        "curvature": curvature_along(policy, data, clip, step, subset=cfg.subset, seed=0),
        "round": k, "random": float(rng.random()),
    }


def run_seed(cfg: SignalConfig, seed: int, out: Path, log=print) -> Path:
    """Base run plus every branch of one seed; one JSON line per branch; the file is written whole at the end."""
    path = out / f"seed{seed}.jsonl"
    if path.exists():
        log(f"  seed {seed}: done already")
        return path
    t0 = time.time()
    torch.set_num_threads(1)
    branch = set(cfg.branch_rounds())
    base = Trainer(cfg, seed)
    rng = np.random.default_rng(derived_seed(seed, 7))
    history: dict[str, list[float]] = {"R_sub": [], "R_full": [], "inv_R_sub": []}
    pending: dict[int, dict] = {}  # branch round -> its record, waiting for arm a (the base run) to get there
    records = []
    for r in range(cfg.base_rounds):
        stats, step = base.round(r, cfg.actors)
        sig = signals_at(base, stats, step, r, history, rng)
        for k, rec in list(pending.items()):
            if r == k + 1:
                rec["R_after_8"] = sig["R_sub"]  # the confound check: R after an 8-actor round at k + 1
            if r == k + 1 + cfg.horizon:
                rec["eval_a"] = base.evaluate(rec["eval_seed"])
                rec["benefit"] = float(np.mean(rec["eval_b"]) - np.mean(rec["eval_a"]))
                records.append(pending.pop(k))
                log(f"  seed {seed} k={k:>2}: B_k = {rec['benefit']:+8.1f} (a {np.mean(rec['eval_a']):7.1f}, "
                    f"b {np.mean(rec['eval_b']):7.1f}), R_k {rec['signals']['R_sub']:.3g}, "
                    f"S_k {rec['signals']['S_sub']:.3f} [{time.time() - t0:.0f} s]")
        if r in branch:
            eval_seed = derived_seed(seed, r, 99) % (2**31)
            arm = base.fork()
            _, _ = arm.round(r + 1, cfg.boost)
            r_after_boost = ratio(arm.learner.policy, arm.learner.last_data, arm.algo.clip, subset=cfg.subset, seed=0)
            for j in range(r + 2, r + 2 + cfg.horizon):
                arm.round(j, cfg.actors)
            pending[r] = {"seed": seed, "k": r, "signals": sig, "eval_seed": eval_seed,
                          "eval_b": arm.evaluate(eval_seed), "R_after_64": r_after_boost,
                          "actors": cfg.actors, "boost": cfg.boost, "horizon": cfg.horizon}
            arm.close()
    base.close()
    out.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(rec) + "\n" for rec in records))
    tmp.replace(path)
    log(f"  seed {seed}: {len(records)} branches in {time.time() - t0:.0f} s")
    return path


# -- the report --------------------------------------------------------------------------------------------


def load(out: Path) -> list[dict]:
    return [json.loads(line) for p in sorted(out.glob("seed*.jsonl")) for line in p.read_text().splitlines() if line]


def spearman(x, y) -> float:
    from scipy.stats import spearmanr

    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return float("nan")
    return float(spearmanr(x[ok], y[ok]).statistic)


def partial_spearman(x, y, z) -> float:
    """Spearman's rho of x and y with z (the round index) partialled out: the correlation of the ranks'
    residuals after a linear fit on z's ranks. A signal that only tracks the round scores ~0 here."""
    from scipy.stats import rankdata

    x, y, z = (np.asarray(v, float) for v in (x, y, z))
    ok = np.isfinite(x) & np.isfinite(y) & np.isfinite(z)
    if ok.sum() < 4:
        return float("nan")
    rx, ry, rz = (rankdata(v[ok]) for v in (x, y, z))
    design = np.column_stack([np.ones_like(rz), rz])

    def resid(r):
        return r - design @ np.linalg.lstsq(design, r, rcond=None)[0]

    ex, ey = resid(rx), resid(ry)
    if min(ex @ ex, ey @ ey) < 1e-9 * len(rx):  # nothing left once the round is accounted for (x is the round)
        return float("nan")
    return float(ex @ ey / np.sqrt((ex @ ex) * (ey @ ey)))


def clustered_ci(records: list[dict], fn, reps: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """fn(records) and its 95% percentile CI from resampling whole seeds with replacement."""
    by_seed: dict[int, list[dict]] = {}
    for r in records:
        by_seed.setdefault(r["seed"], []).append(r)
    seeds = sorted(by_seed)
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(reps):
        pick = rng.choice(len(seeds), size=len(seeds), replace=True)
        v = fn([r for i in pick for r in by_seed[seeds[i]]])
        if math.isfinite(v):
            stats.append(v)
    lo, hi = (np.percentile(stats, [2.5, 97.5]) if stats else (float("nan"), float("nan")))
    return fn(records), float(lo), float(hi)


def pooled_ci(groups: list[list[dict]], fn, reps: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """The mean over groups (environments) of fn(group) and its 95% percentile CI from a bootstrap that
    resamples whole seeds within each group (stratified by environment)."""
    by_group = []
    for recs in groups:
        by_seed: dict[int, list[dict]] = {}
        for r in recs:
            by_seed.setdefault(r["seed"], []).append(r)
        by_group.append([by_seed[s] for s in sorted(by_seed)])
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(reps):
        vals = []
        for seeds in by_group:
            pick = rng.choice(len(seeds), size=len(seeds), replace=True)
            vals.append(fn([r for i in pick for r in seeds[i]]))
        if all(math.isfinite(v) for v in vals):
            stats.append(float(np.mean(vals)))
    lo, hi = (np.percentile(stats, [2.5, 97.5]) if stats else (float("nan"), float("nan")))
    return float(np.mean([fn(recs) for recs in groups])), float(lo), float(hi)


def decision_gain(records: list[dict], choose, m: int) -> float:
    """Mean over seeds of the summed B_k of the m rounds `choose(seed_records, m)` boosts."""
    by_seed: dict[int, list[dict]] = {}
    for r in records:
        by_seed.setdefault(r["seed"], []).append(r)
    return float(np.mean([sum(r["benefit"] for r in choose(recs, m)) for recs in by_seed.values()]))


def pooled_report(outs: list[Path], reps: int = 2000) -> str:
    """Each signal's Spearman rho with B_k averaged over environments (ranks are taken within an
    environment, so returns of different scales never mix), raw and with the round partialled out,
    with CIs from a bootstrap over seeds stratified by environment; plus the per-environment values
    and whether their signs agree with the direction the paper (or common sense) expects."""
    groups = [load(Path(o)) for o in outs]
    if not all(groups):
        missing = [str(o) for o, g in zip(outs, groups) if not g]
        return f"no signal-test records under {', '.join(missing)}"
    names = [Path(o).name for o in outs]
    lines = [f"Signal test pooled over {len(groups)} environments ({', '.join(names)}; "
             f"{sum(len(g) for g in groups)} branches): mean of the per-environment Spearman rho, 95% CI from a "
             "seed bootstrap stratified by environment", "",
             "| signal | expected sign | rho | 95% CI | rho, round partialled out | 95% CI | "
             "partialled minus S_sub's (the detector's score) [95% CI] | "
             + " | ".join(f"partialled, {n}" for n in names) + " |",
             "|---|---:|---:|---|---:|---|---|" + "---:|" * len(names)]

    def raw(rs, n):
        return spearman([r["signals"][n] for r in rs], [r["benefit"] for r in rs])

    def part(rs, n):
        return partial_spearman([r["signals"][n] for r in rs], [r["benefit"] for r in rs], [r["k"] for r in rs])

    for name, sign in SIGNALS.items():
        rho, lo, hi = pooled_ci(groups, lambda rs, n=name: raw(rs, n), reps)
        if name == "round":
            prho = plo = phi = float("nan")
            diff = "n/a"
        else:
            prho, plo, phi = pooled_ci(groups, lambda rs, n=name: part(rs, n), reps)
            # oriented by the expected sign, so "better than S_sub" is positive whatever the signal's direction
            d, dlo, dhi = pooled_ci(groups, lambda rs, n=name, sg=sign: sg * part(rs, n) - part(rs, "S_sub"), reps)
            diff = "—" if name == "S_sub" else f"{d:+.3f} [{dlo:+.3f}, {dhi:+.3f}]"
        per_env = " | ".join(f"{part(g, name):+.3f}" for g in groups)
        lines.append(f"| {name} | {'+' if sign > 0 else '-'} | {rho:+.3f} | [{lo:+.3f}, {hi:+.3f}] | {prho:+.3f} | "
                     f"[{plo:+.3f}, {phi:+.3f}] | {diff} | {per_env} |")
    benefits = [f"{n}: mean {np.mean([r['benefit'] for r in g]):+.1f}, share > 0 "
                f"{np.mean([r['benefit'] > 0 for r in g]):.2f}" for n, g in zip(names, groups)]
    lines += ["", "B_k per environment: " + "; ".join(benefits) + ".",
              f"With {len(SIGNALS)} signals, about {0.05 * len(SIGNALS):.1f} CIs are expected to exclude 0 by "
              "chance alone; a signal worth a scaling policy has to exclude 0 in its expected direction, "
              "pooled and with the round partialled out, and agree in sign in every environment."]
    return "\n".join(lines)


def report(out: Path, m: int = 3, reps: int = 2000) -> str:
    """The signal test's table for the records under `out`; `reps`: bootstrap resamples per CI."""
    records = load(out)
    if not records:
        return f"no signal-test records under {out}"
    seeds = sorted({r["seed"] for r in records})
    benefit = [r["benefit"] for r in records]
    lines = [f"Signal test: {len(records)} branches over {len(seeds)} seeds ({out})",
             f"B_k: mean {np.mean(benefit):+.1f}, median {np.median(benefit):+.1f}, "
             f"share > 0: {np.mean(np.asarray(benefit) > 0):.2f}", "",
             "| signal | Spearman rho with B_k | 95% CI (seed bootstrap) | rho with the round index partialled out "
             "| 95% CI |", "|---|---:|---|---:|---|"]
    for name in SIGNALS:
        rho, lo, hi = clustered_ci(records, lambda rs, n=name: spearman([r["signals"][n] for r in rs],
                                                                       [r["benefit"] for r in rs]), reps)
        prho, plo, phi = clustered_ci(records, lambda rs, n=name: partial_spearman(
            [r["signals"][n] for r in rs], [r["benefit"] for r in rs], [r["k"] for r in rs]), reps)
        lines.append(f"| {name} | {rho:+.3f} | [{lo:+.3f}, {hi:+.3f}] | {prho:+.3f} | [{plo:+.3f}, {phi:+.3f}] |")
    rel = [spearman([r["signals"]["R_sub_seeds"][0] for r in records], [r["signals"]["R_sub_seeds"][j] for r in records])
           for j in range(1, len(records[0]["signals"]["R_sub_seeds"]))]
    lines += ["", "R_k reliability across subset seeds (Spearman of seed 0 with the others): "
              + ", ".join(f"{v:+.3f}" for v in rel),
              f"R_k on the 512 subset vs the whole batch: Spearman {spearman([r['signals']['R_sub'] for r in records], [r['signals']['R_full'] for r in records]):+.3f}"]
    diff = [r["R_after_64"] - r["R_after_8"] for r in records if "R_after_8" in r]
    lines.append(f"Batch-size confound: R after the boosted round minus R after an unboosted one at the same k: "
                 f"median {np.median(diff):+.3g}, share > 0 {np.mean(np.asarray(diff) > 0):.2f} (n={len(diff)})")
    lines += ["", f"Decision test: summed B_k of the m={m} boosted rounds per seed (mean over seeds; signals "
              "oriented by the sign of rho on the other seeds):", "",
              "| choice | gain |", "|---|---:|"]
    lines.append(f"| best possible | {decision_gain(records, lambda rs, m: sorted(rs, key=lambda r: -r['benefit'])[:m], m):+.1f} |")
    lines.append(f"| random rounds (expected) | {m * np.mean([np.mean([r['benefit'] for r in records if r['seed'] == s]) for s in seeds]):+.1f} |")
    lines.append(f"| earliest rounds | {decision_gain(records, lambda rs, m: sorted(rs, key=lambda r: r['k'])[:m], m):+.1f} |")
    for name in SIGNALS:
        def choose(rs, m, n=name):
            others = [r for r in records if r["seed"] != rs[0]["seed"]]
            rho = spearman([r["signals"][n] for r in others], [r["benefit"] for r in others])
            sign = 1.0 if not math.isfinite(rho) or rho >= 0 else -1.0
            return sorted(rs, key=lambda r: -sign * r["signals"][n])[:m]

        lines.append(f"| {name} | {decision_gain(records, choose, m):+.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments signal", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = SignalConfig()
    p.add_argument("--env", default=d.env_id)
    p.add_argument("--preset", default=d.preset)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=d.base_rounds, help="base-run rounds")
    p.add_argument("--branches", type=int, default=d.branches)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--actors", type=int, default=d.actors)
    p.add_argument("--boost", type=int, default=d.boost)
    p.add_argument("--horizon", type=int, default=d.horizon)
    p.add_argument("--eval-episodes", type=int, default=d.eval_episodes)
    p.add_argument("--out", default=None, help="default results/experiments/signal/<env>-<preset>")
    p.add_argument("--report", action="store_true", help="print the table from the runs there")
    p.add_argument("--m", type=int, default=3, help="rounds boosted per seed in the decision test")
    p.add_argument("--pool", nargs="+", metavar="DIR", help="print the table pooled over these environments' "
                   "result directories (and write it to pooled.md beside the first)")
    args = p.parse_args(argv)
    if args.pool:
        text = pooled_report([Path(d) for d in args.pool])
        print(text)
        (Path(args.pool[0]).parent / "pooled.md").write_text(text + "\n")
        return 0
    cfg = SignalConfig(env_id=args.env, preset=args.preset, base_rounds=args.rounds, branches=args.branches,
                       actors=args.actors, boost=args.boost, steps=args.steps, horizon=args.horizon,
                       eval_episodes=args.eval_episodes)
    out = Path(args.out) if args.out else OUT / f"{cfg.env_id.lower().replace('/', '-')}-{cfg.preset}"
    if args.report:
        text = report(out, args.m)
        print(text)
        (out / "report.md").write_text(text + "\n")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    print(f"signal test: {cfg.env_id} {cfg.preset}, base {cfg.base_rounds} rounds x {cfg.actors} actors x "
          f"{cfg.steps} steps, branches at {cfg.branch_rounds()}, boost {cfg.boost}, horizon {cfg.horizon}, "
          f"{cfg.eval_episodes} eval episodes; seeds {args.first_seed}..{args.first_seed + args.seeds - 1} -> {out}")
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        run_seed(cfg, seed, out)
    print(report(out, args.m))
    return 0
