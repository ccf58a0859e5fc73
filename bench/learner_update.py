"""Learner update time for the demo's batch: Hopper-v5 PPO `tuned`, 8 actors x 512 steps = 4,096 samples,
10 epochs of minibatch 256 (160 Adam steps), 2x256 tanh actor and critic, observation normalisation.

Figure: the median wall time of `PPOLearner.update` (GAE, collation and the SGD epochs, as the
learner service calls it). Reference in the same run: the implementation before the per-minibatch
overhead was removed (kept below, verbatim but for names: a `loss_fn(idx)` per minibatch that indexes
every field, normalises the observations twice and builds torch.distributions objects, and a loop that
syncs seven scalars per step), on the same batch, from the same initial weights, repetitions
interleaved (order alternating), for 1 and 2 torch threads. Ratio = figure / reference (< 1: faster).
Process CPU seconds are reported beside the wall times: on a machine shared with other work they
are the steadier measure of the update's own cost.
Also IMPACT `tuned` (4 epochs x 256) with vtrace_critic "target" (V-trace once per update, as the reference
computes it) on the same batch, same method; and, with one torch thread, the PPO
update with its critic on a second thread (PPOLearner's default on CPU) against the same update on one thread
(`critic_thread=False`), under "critic_thread" in the JSON. PPOLearner uses the critic thread only with one
torch thread, so the 1-thread PPO figure above includes it and the 2-thread one does not. And, under "cpu_ops", the
PPO update (1 torch thread with the critic thread; 2 torch threads) with the MLPs' oneDNN linear and numpy tanh
(nitro.policy.cpu_ops, on by default; the reference above uses them too) against the same update on torch's own
CPU ops. The batch is real
Hopper-v5 data sampled by the initial policy. NITRO_BENCH_REPS sets the repetitions per thread count (default 7).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from nitro.algos.impact import IMPACTLearner, IMPACTUpdateStats, impact_loss  # noqa: E402
from nitro.algos.ppo import (  # noqa: E402
    PPOLearner,
    UpdateStats,
    adapt_kl_coeff,
    collate,
    normalize,
    ppo_loss,
    standardize_batch,  # noqa: E402
)
from nitro.algos.sgd import LOSS_PARTS, SGDResult, _noise_scale, kl_per_sample, kl_term  # noqa: E402
from nitro.config import impact_config, ppo_config  # noqa: E402
from nitro.policy import cpu_ops  # noqa: E402

ENV, ACTORS, STEPS, THREADS = "Hopper-v5", 8, 512, (1, 2)
REPS = int(os.environ.get("NITRO_BENCH_REPS", "7"))


# -- the reference: the update as it was before this change ---------------------------------------

def reference_minibatch_sgd(params, optimizer, generator, n, *, epochs, minibatch_size, max_grad_norm, device,
                            loss_fn, estimate_noise=True) -> SGDResult:
    mb = n if minibatch_size <= 0 else min(minibatch_size, n)
    sums = dict.fromkeys((*LOSS_PARTS, "grad_norm", "loss"), 0.0)
    steps = 0
    small_sq: list[float] = []
    grad_sum = None
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=generator).to(device)
        for start in range(0, n - mb + 1, mb):
            loss, parts = loss_fn(perm[start:start + mb])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if estimate_noise and epoch == 0 and n > mb:
                flat = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])
                small_sq.append(float(flat.pow(2).sum()))
                grad_sum = flat.clone() if grad_sum is None else grad_sum.add_(flat)
            if max_grad_norm > 0:
                gn = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            else:
                gn = torch.sqrt(sum(p.grad.pow(2).sum() for p in params if p.grad is not None))
            optimizer.step()
            for k, v in parts.items():
                sums[k] += float(v.detach())
            sums["grad_norm"] += float(gn)
            sums["loss"] += float(loss.detach())
            steps += 1
    means = {k: v / max(steps, 1) for k, v in sums.items()}
    big = float((grad_sum / len(small_sq)).pow(2).sum()) if grad_sum is not None and len(small_sq) >= 2 else None
    return SGDResult(means, mb, steps, _noise_scale(small_sq, big, mb))


class ReferencePPOLearner(PPOLearner):
    def update(self, batches: list[dict]) -> UpdateStats:
        cfg = self.config
        t0 = time.perf_counter()
        data = collate(batches, cfg.gamma, cfg.gae_lambda, cfg.reward_clip)
        if cfg.normalize_batch_advantages:
            data["advantages"] = standardize_batch(data["advantages"])
        self.last_data = data
        dev = self.device
        obs = torch.as_tensor(data["obs"], device=dev)
        actions = torch.as_tensor(data["actions"], device=dev)
        logp_old = torch.as_tensor(data["logp"], device=dev)
        v_old = torch.as_tensor(data["values"], device=dev)
        adv_all = torch.as_tensor(data["advantages"], device=dev)
        returns = torch.as_tensor(data["returns"], device=dev)
        n = obs.shape[0]
        with torch.no_grad():
            old_dist = self.policy.distribution(obs)
        kl_coeff = self.kl_coeff

        def loss_fn(idx):
            dist = self.policy.distribution(obs[idx])
            adv = normalize(adv_all[idx]) if cfg.normalize_advantages else adv_all[idx]
            return ppo_loss(
                self.policy.log_prob(dist, actions[idx]), logp_old[idx], adv, self.policy.value(obs[idx]),
                v_old[idx], returns[idx], self.policy.entropy(dist), kl_term(old_dist, dist, idx, kl_coeff),
                clip=cfg.clip, kl_coeff=kl_coeff, value_coeff=cfg.value_coeff, entropy_coeff=cfg.entropy_coeff,
                value_clip=cfg.value_clip, value_clip_mode=cfg.value_clip_mode)

        sgd = reference_minibatch_sgd(list(self.policy.parameters()), self.optimizer, self.generator, n,
                                      epochs=cfg.epochs, minibatch_size=cfg.minibatch_size,
                                      max_grad_norm=cfg.max_grad_norm, device=dev, loss_fn=loss_fn)
        means = sgd.means
        with torch.no_grad():
            final_kl = float(kl_per_sample(old_dist, self.policy.distribution(obs), slice(None)).mean())
        if cfg.kl_coeff > 0:
            self.kl_coeff = adapt_kl_coeff(self.kl_coeff, final_kl, cfg.kl_target)
        self.updates += 1
        var = float(np.var(data["returns"]))
        ev = float(1.0 - np.var(data["returns"] - data["values"]) / var) if var > 1e-12 else 0.0
        return UpdateStats(samples=n, policy_loss=means["policy_loss"], value_loss=means["value_loss"],
                           entropy=means["entropy"], kl=final_kl, clip_frac=means["clip_frac"],
                           kl_coeff=self.kl_coeff, grad_norm=means["grad_norm"], explained_variance=ev,
                           seconds=time.perf_counter() - t0, loss=means["loss"],
                           gradient_noise_scale=sgd.noise_scale)


class ReferenceIMPACTLearner(IMPACTLearner):
    def update(self, batches: list[dict]) -> IMPACTUpdateStats:
        cfg = self.config
        t0 = time.perf_counter()
        refreshed = self.updates % cfg.target_update_freq == 0
        if refreshed:
            self.refresh_target()
        data, target_dist = self.prepare(batches)
        obs, actions = data["obs"], data["actions"]
        dev = self.device
        logp_target = torch.as_tensor(data["logp_target"], device=dev)
        weights = torch.as_tensor(data["is_weights"], device=dev)
        adv_all = torch.as_tensor(data["advantages"], device=dev)
        vs = torch.as_tensor(data["vs"], device=dev)
        n = obs.shape[0]

        def loss_fn(idx):
            dist = self.policy.distribution(obs[idx])
            adv = normalize(adv_all[idx]) if cfg.normalize_advantages else adv_all[idx]
            return impact_loss(
                self.policy.log_prob(dist, actions[idx]), logp_target[idx], weights[idx], adv,
                self.policy.value(obs[idx]), vs[idx], self.policy.entropy(dist),
                kl_term(target_dist, dist, idx, self.kl_coeff), clip=cfg.clip, kl_coeff=self.kl_coeff,
                value_coeff=cfg.value_coeff, entropy_coeff=cfg.entropy_coeff)

        sgd = reference_minibatch_sgd(list(self.policy.parameters()), self.optimizer, self.generator, n,
                                      epochs=cfg.epochs, minibatch_size=cfg.minibatch_size,
                                      max_grad_norm=cfg.max_grad_norm, device=dev, loss_fn=loss_fn)
        means = sgd.means
        chunk = 1024
        with torch.no_grad():
            final_kl = float(torch.cat([
                kl_per_sample(target_dist, self.policy.distribution(obs[i:i + chunk]), slice(i, i + chunk))
                for i in range(0, n, chunk)]).mean())
        if cfg.kl_coeff > 0:
            self.kl_coeff = adapt_kl_coeff(self.kl_coeff, final_kl, cfg.kl_target)
        self.updates += 1
        return IMPACTUpdateStats(
            samples=n, policy_loss=means["policy_loss"], value_loss=means["value_loss"], entropy=means["entropy"],
            kl=final_kl, clip_frac=means["clip_frac"], kl_coeff=self.kl_coeff, grad_norm=means["grad_norm"],
            explained_variance=0.0, seconds=time.perf_counter() - t0, loss=means["loss"],
            gradient_noise_scale=sgd.noise_scale, target_refreshed=refreshed)


class TorchOpsPPOLearner(PPOLearner):
    """PPOLearner on torch's own CPU kernels (cpu_ops off for its updates only)."""

    def update(self, batches: list[dict]) -> UpdateStats:
        enabled, cpu_ops.ENABLED = cpu_ops.ENABLED, False
        try:
            return super().update(batches)
        finally:
            cpu_ops.ENABLED = enabled


# -- the benchmark ---------------------------------------------------------------------------------

def hopper_batches(spec) -> list[dict]:
    from nitro.policy.inference import PolicyRunner
    from nitro.policy.models import Policy
    from nitro.policy.rollout import Sampler

    torch.manual_seed(0)
    runner = PolicyRunner(spec, Policy(spec).numpy_state(), 0)
    out = []
    for i in range(ACTORS):
        sampler = Sampler(ENV, seed=i)
        out.append(sampler.sample(runner, STEPS, np.random.default_rng(i)))
        sampler.close()
    return out


def timed(learner, batches) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one update; CPU time is the steadier figure on a loaded machine."""
    t0, c0 = time.perf_counter(), time.process_time()
    learner.update(batches)
    return time.perf_counter() - t0, time.process_time() - c0


def compare(make, make_ref, batches, threads: int) -> dict:
    """Median update seconds of the current and the reference learner, repetitions interleaved."""
    torch.set_num_threads(threads)
    new, ref = make(), make_ref()
    for learner in (new, ref):  # warm-up (first-call allocations), not timed
        learner.update(batches)
    times: dict[str, list[float]] = {"new": [], "ref": []}
    cpu: dict[str, list[float]] = {"new": [], "ref": []}
    for rep in range(REPS):
        order = (("new", new), ("ref", ref)) if rep % 2 == 0 else (("ref", ref), ("new", new))
        for name, learner in order:
            wall, used = timed(learner, batches)
            times[name].append(wall)
            cpu[name].append(used)
    med, ref_med = statistics.median(times["new"]), statistics.median(times["ref"])
    cpu_med, cpu_ref = statistics.median(cpu["new"]), statistics.median(cpu["ref"])
    print(f"  {type(new).__name__}, {threads} thread(s): wall {[round(t, 3) for t in times['new']]} vs reference "
          f"{[round(t, 3) for t in times['ref']]}", flush=True)
    return {"seconds": round(med, 4), "reference_seconds": round(ref_med, 4), "ratio": round(med / ref_med, 3),
            "speedup": round(ref_med / med, 2), "cpu_seconds": round(cpu_med, 4),
            "reference_cpu_seconds": round(cpu_ref, 4), "cpu_ratio": round(cpu_med / cpu_ref, 3)}


def main() -> None:
    from nitro.policy.envs import make_env
    from nitro.policy.model_spec import spec_for_spaces

    # IMPACT with the targets fixed for the update, as the reference has them (the online critic's per-step
    # recomputation, the default, is priced in docs/algorithms.md, IMPACT)
    ppo_cfg, impact_cfg = ppo_config("tuned"), impact_config("tuned", vtrace_critic="target")
    env = make_env(ENV)
    spec = spec_for_spaces(env.observation_space, env.action_space, hidden_sizes=ppo_cfg.hidden_sizes,
                           activation=ppo_cfg.activation, obs_norm=ppo_cfg.obs_norm)
    env.close()
    batches = hopper_batches(spec)
    all_obs = np.concatenate([b["obs"] for b in batches])

    def with_stats(learner):
        learner.policy.update_obs_stats(all_obs)  # as the learner service does after every update
        if isinstance(learner, IMPACTLearner):
            learner.target.load_state_dict(learner.policy.state_dict())
        return learner

    results = {"ppo": {}, "impact": {}}
    for threads in THREADS:
        results["ppo"][threads] = compare(lambda: with_stats(PPOLearner(spec, ppo_cfg, seed=0)),
                                          lambda: with_stats(ReferencePPOLearner(spec, ppo_cfg, seed=0)),
                                          batches, threads)
        results["impact"][threads] = compare(lambda: with_stats(IMPACTLearner(spec, impact_cfg, seed=0)),
                                             lambda: with_stats(ReferenceIMPACTLearner(spec, impact_cfg, seed=0)),
                                             batches, threads)
    results["critic_thread"] = compare(lambda: with_stats(PPOLearner(spec, ppo_cfg, seed=0)),
                                       lambda: with_stats(PPOLearner(spec, ppo_cfg, seed=0, critic_thread=False)),
                                       batches, 1)
    results["cpu_ops"] = {threads: compare(lambda: with_stats(PPOLearner(spec, ppo_cfg, seed=0)),
                                           lambda: with_stats(TorchOpsPPOLearner(spec, ppo_cfg, seed=0)), batches,
                                           threads) for threads in THREADS}
    split, kernels = results.pop("critic_thread"), results.pop("cpu_ops")
    load = os.getloadavg()
    print(f"{ENV}, {ACTORS} x {STEPS} = {ACTORS * STEPS} samples, PPO tuned ({ppo_cfg.epochs} epochs x "
          f"{ppo_cfg.minibatch_size}) and IMPACT tuned ({impact_cfg.epochs} epochs x {impact_cfg.minibatch_size}), "
          f"{REPS} interleaved repetitions, load average {load[0]:.2f} on {os.cpu_count()} cores")
    for algo, per in results.items():
        for threads, r in per.items():
            print(f"  {algo:>6} {threads} thread(s): {r['seconds']:.3f} s vs reference {r['reference_seconds']:.3f} s"
                  f"  ratio {r['ratio']:.3f} ({r['speedup']:.2f}x faster); CPU time {r['cpu_seconds']:.3f} s vs "
                  f"{r['reference_cpu_seconds']:.3f} s, ratio {r['cpu_ratio']:.3f}")
    print(f"     ppo, critic on a second thread, 1 torch thread: {split['seconds']:.3f} s vs {split['reference_seconds']:.3f} s "
          f"on one thread ({split['speedup']:.2f}x faster); CPU time {split['cpu_seconds']:.3f} s vs "
          f"{split['reference_cpu_seconds']:.3f} s")
    for threads, k in kernels.items():
        print(f"     ppo, oneDNN linear + numpy tanh (cpu_ops), {threads} torch thread(s): {k['seconds']:.3f} s vs "
              f"{k['reference_seconds']:.3f} s on torch's ops ({k['speedup']:.2f}x faster); CPU time "
              f"{k['cpu_seconds']:.3f} s vs {k['reference_cpu_seconds']:.3f} s")
    ppo1 = results["ppo"][1]
    print(json.dumps({
        "benchmark": "learner_update", "env": ENV, "samples": ACTORS * STEPS, "epochs": ppo_cfg.epochs,
        "minibatch_size": ppo_cfg.minibatch_size, "repetitions": REPS, "load_average_1m": round(load[0], 2),
        "seconds": ppo1["seconds"], "reference_seconds": ppo1["reference_seconds"], "ratio": ppo1["ratio"],
        "threads": {str(t): r for t, r in results["ppo"].items()},
        "impact_threads": {str(t): r for t, r in results["impact"].items()},
        "critic_thread": split, "cpu_ops": {str(t): k for t, k in kernels.items()},
    }))


if __name__ == "__main__":
    main()
