"""IMPACT (Luo et al., ICLR 2020): a clipped surrogate against a target network, off-policy.

Three policies meet in every sample: the behaviour policy mu that the actor ran
(its log-prob travels in the batch), the target network pi_target (a copy of
the policy refreshed every `target_update_freq` updates) and the current policy
pi_theta being optimised. Per sample, with A the V-trace policy-gradient advantage
computed with the target network, which already carries the importance weight
min(pg_rho_bar, pi_target / mu) (nitro.algos.vtrace), the loss applies no second
weight; as RLlib's APPO, the surrogate's ratio is

    r     = min(is_ratio_clip, mu / pi_target) * pi_theta / mu  =  pi_theta / pi_ref,
    pi_ref = max(pi_target, mu / is_ratio_clip)                 (data, no gradient)

i.e. pi_theta / pi_target unless the target network gives the action less than
1 / is_ratio_clip of the behaviour probability, and

    L_pi  = -mean( min(r A, clip(r, 1 - eps, 1 + eps) A) )
    L     = L_pi + value_coeff * 0.5 * mean((V_theta - v_s)^2) - entropy_coeff * mean(H)
            + kl_coeff * mean(KL(pi_target || pi_theta))

kl_coeff adapts after every update towards kl_target (as PPO's). The loss pieces
are pure functions of tensors; `IMPACTLearner` owns the policy, the target
network, Adam and the KL coefficient.

V-trace's values V(x) come from the critic `vtrace_critic` names. "online" (the
default, RLlib APPO's semantics): the critic being trained, on the batch's
observations and on the bootstrap observations the actors ship, recomputed before
every minibatch step, so a step's targets v_s and advantages A use the critic as
the previous step left it. "target": the target network's critic, once per update,
bootstrapped from the actor's values (the behaviour before, for comparisons).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from nitro.algos.ppo import UpdateStats, adapt_kl_coeff, minibatch_advantages, normalize
from nitro.algos.sgd import adam, epoch_loss_from, minibatch_sgd, policy_kl, policy_terms
from nitro.algos.vtrace import VTracePlan, vtrace_batches, vtrace_from_plan, vtrace_plan
from nitro.config import IMPACTConfig
from nitro.policy.models import ModelSpec, Policy

FORWARD_CHUNK = 1024  # rows per no-grad target-network pass: bounds memory on Atari batches


def reference_logp(logp_target: torch.Tensor, logp_behaviour: torch.Tensor, is_ratio_clip: float) -> torch.Tensor:
    """log pi_ref = log max(pi_target, mu / is_ratio_clip) per sample, the denominator of IMPACT's ratio.

    RLlib's APPO writes the ratio as min(is_ratio_clip, mu / pi_target) * pi_theta / mu, which is
    pi_theta / pi_ref. Both log-probs are data, so no gradient flows.
    """
    return torch.maximum(logp_target, logp_behaviour - math.log(is_ratio_clip)).detach()


def impact_surrogate(logp_new: torch.Tensor, logp_target: torch.Tensor, is_weights: torch.Tensor,
                     adv: torch.Tensor, clip: float) -> torch.Tensor:
    """mean(w * min(r A, clip(r, 1-eps, 1+eps) A)), r = exp(logp_new - logp_target): a weighted clipped surrogate.

    IMPACT maximises it with logp_target = `reference_logp(...)` and w = 1 (its advantages already
    carry the importance weight); Stellaris with its base policy's log-probs and its truncated rho as w.
    """
    ratio = torch.exp(logp_new - logp_target)
    return (is_weights * torch.minimum(ratio * adv, ratio.clamp(1.0 - clip, 1.0 + clip) * adv)).mean()


def vtrace_value_loss(v_new: torch.Tensor, vs: torch.Tensor) -> torch.Tensor:
    """0.5 * E[(V - v_s)^2] against the V-trace targets."""
    return 0.5 * (v_new - vs).pow(2).mean()


def impact_loss(logp_new: torch.Tensor, logp_target: torch.Tensor, is_weights: torch.Tensor, adv: torch.Tensor,
                v_new: torch.Tensor, vs: torch.Tensor, entropy: torch.Tensor, kl: torch.Tensor, *, clip: float,
                kl_coeff: float, value_coeff: float, entropy_coeff: float
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total loss = -surrogate + kl_coeff * KL(target || current) + value_coeff * L_V - entropy_coeff * H.

    logp_target is the ratio's denominator (IMPACT: `reference_logp`), is_weights the surrogate's weight.
    """
    pg = -impact_surrogate(logp_new, logp_target, is_weights, adv, clip)
    vl = vtrace_value_loss(v_new, vs)
    ent = entropy.mean()
    kl_mean = kl.mean()
    clip_frac = ((torch.exp(logp_new - logp_target) - 1.0).abs() > clip).float().mean()
    total = pg + kl_coeff * kl_mean + value_coeff * vl - entropy_coeff * ent
    return total, {"policy_loss": pg, "value_loss": vl, "entropy": ent, "kl": kl_mean, "clip_frac": clip_frac}


@dataclass
class OnlineTargets:
    """V-trace against the policy's own critic for one update's batches: `targets()` evaluates the critic as
    it is now on the (normalised) batch and bootstrap observations and returns (v_s, advantages, V(x))."""

    policy: Policy
    plan: VTracePlan
    x: torch.Tensor       # the batch's observations through policy.normalize
    x_boot: torch.Tensor  # the bootstrap observations (nitro.algos.vtrace.vtrace_plan), likewise

    @torch.no_grad()
    def targets(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        values = critic_values(self.policy, self.x)
        vs, adv = vtrace_from_plan(self.plan, values, critic_values(self.policy, self.x_boot))
        return vs, adv, values


def critic_values(policy: Policy, x: torch.Tensor) -> torch.Tensor:
    """policy.critic on normalised observations, FORWARD_CHUNK rows at a time, as a (len(x),) tensor."""
    if len(x) == 0:
        return x.new_zeros(0, dtype=torch.float32)
    return torch.cat([policy.critic(x[i:i + FORWARD_CHUNK]).squeeze(-1) for i in range(0, len(x), FORWARD_CHUNK)])


@dataclass
class IMPACTUpdateStats(UpdateStats):
    # mean min(pg_rho_bar, pi_target / mu), the weight V-trace's advantages carry: how off-policy the data was
    is_weight_mean: float = 0.0
    target_refreshed: bool = False  # the target network was refreshed at the start of this update


class IMPACTLearner:
    """Owns the policy, its target network, Adam and the KL coefficient; `update(batches)` is one update.

    Batches may come from any policy version (fresh, lagging or replayed): V-trace and
    the truncated weights correct for it. Refresh rule: the target network is copied
    from the policy at the start of every `target_update_freq`-th update (the first
    one included), so with frequency 1 it is the policy as the update starts.
    """

    def __init__(self, spec: ModelSpec, config: IMPACTConfig, seed: int = 0, device: str = "cpu"):
        torch.manual_seed(seed)
        self.config = config
        self.device = torch.device(device)
        self.policy = Policy(spec).to(self.device)
        self.target = Policy(spec).to(self.device)
        self.target.load_state_dict(self.policy.state_dict())
        self.target.requires_grad_(False)
        self.optimizer = adam(self.policy.parameters(), config.lr, config.adam_eps)
        self.kl_coeff = config.kl_coeff
        self.generator = torch.Generator().manual_seed(seed)
        self.updates = 0
        self.target_refreshes = 0
        self.last_data: dict[str, np.ndarray] | None = None

    def refresh_target(self) -> None:
        """pi_target <- pi_theta (weights and observation statistics)."""
        self.target.load_state_dict(self.policy.state_dict())
        self.target_refreshes += 1

    @torch.no_grad()
    def _target_outputs(self, obs: torch.Tensor, actions: torch.Tensor, with_values: bool = True):
        """The target network's log-probs of the actions, its values (None unless with_values) and its
        distribution on obs."""
        logps, values, params = [], [], []
        for i in range(0, obs.shape[0], FORWARD_CHUNK):
            dist = self.target.distribution(obs[i:i + FORWARD_CHUNK])
            logps.append(self.target.log_prob(dist, actions[i:i + FORWARD_CHUNK]))
            if with_values:
                values.append(self.target.value(obs[i:i + FORWARD_CHUNK]))
            params.append((dist.loc, dist.scale) if isinstance(dist, torch.distributions.Normal) else dist.logits)
        if isinstance(params[0], tuple):
            dist = torch.distributions.Normal(torch.cat([p[0] for p in params]), torch.cat([p[1] for p in params]))
        else:
            dist = torch.distributions.Categorical(logits=torch.cat(params))
        return torch.cat(logps), torch.cat(values) if with_values else None, dist

    def prepare(self, batches: list[dict]) -> tuple[dict[str, np.ndarray], torch.distributions.Distribution]:
        """Target-network log-probs, the critic's values (`vtrace_critic`), then V-trace per batch (each is
        contiguous), concatenated: the targets and advantages as the update's first step uses them.

        Fields for the surrogate and the detector: `logp_target` is log pi_ref (`reference_logp`: the
        target network's log-prob, floored at log(mu / is_ratio_clip)) and `is_weights` is 1, since
        the V-trace `advantages` already carry the importance weight; `logp_target_net` is the target
        network's own log-prob and `pg_weights` the weight min(pg_rho_bar, pi_target / mu) in the advantages;
        `values` are V-trace's V(x) (the online critic's, or the target network's).
        """
        data, target_dist, _ = self._prepare(batches)
        return {k: v for k, v in data.items() if k not in ("x", "vs_t", "adv_t")}, target_dist

    def _prepare(self, batches: list[dict]) -> tuple[dict, torch.distributions.Distribution, OnlineTargets | None]:
        """`prepare`, plus the normalised observations (data["x"]) and, with vtrace_critic "online", the
        `OnlineTargets` that recompute the targets for later steps (data["vs_t"], data["adv_t"]: the first
        step's, as tensors on the learner's device)."""
        cfg = self.config
        obs = torch.as_tensor(np.concatenate([b["obs"] for b in batches]), device=self.device)
        actions = torch.as_tensor(np.concatenate([b["actions"] for b in batches]), device=self.device)
        with torch.no_grad():  # observation statistics do not change during an update: normalise once
            x_all = self.policy.normalize(obs)
        online = None
        if cfg.vtrace_critic == "online":
            logp_t, _, target_dist = self._target_outputs(obs, actions, with_values=False)
            plan, boot_obs = vtrace_plan(batches, logp_t, cfg)
            boot = torch.as_tensor(boot_obs, device=self.device)
            with torch.no_grad():
                x_boot = self.policy.normalize(boot) if len(boot) else boot
            online = OnlineTargets(self.policy, plan, x_all, x_boot)
            vs_t, adv_t, values_t = online.targets()
            logp_target, values = logp_t.cpu().numpy(), values_t.cpu().numpy()
            vs, adv = vs_t.cpu().numpy(), adv_t.cpu().numpy()
        else:  # the target network's critic, the actor's bootstrap values
            logp_t, values_t, target_dist = self._target_outputs(obs, actions)
            logp_target, values = logp_t.cpu().numpy(), values_t.cpu().numpy()
            vs, adv = vtrace_batches(batches, logp_target, values, cfg)
            vs_t, adv_t = torch.as_tensor(vs, device=self.device), torch.as_tensor(adv, device=self.device)
        logp = np.concatenate([b["logp"] for b in batches]).astype(np.float32)
        logp_ref = reference_logp(torch.as_tensor(logp_target, dtype=torch.float64),
                                  torch.as_tensor(logp, dtype=torch.float64), cfg.is_ratio_clip)
        pg_weights = np.minimum(cfg.pg_rho_bar, np.exp(logp_target.astype(np.float64) - logp)).astype(np.float32)
        data = {"obs": obs, "actions": actions, "logp": logp, "logp_target": logp_ref.numpy().astype(np.float32),
                "logp_target_net": logp_target.astype(np.float32), "is_weights": np.ones_like(logp),
                "pg_weights": pg_weights, "values": values.astype(np.float32), "vs": vs, "advantages": adv,
                "x": x_all, "vs_t": vs_t, "adv_t": adv_t}
        return data, target_dist, online

    def update(self, batches: list[dict]) -> IMPACTUpdateStats:
        cfg = self.config
        t0 = time.perf_counter()
        refreshed = self.updates % cfg.target_update_freq == 0
        if refreshed:
            self.refresh_target()
        data, target_dist, online = self._prepare(batches)
        obs, actions, x_all = data["obs"], data["actions"], data["x"]
        dev = self.device
        n = obs.shape[0]
        policy, kl_coeff = self.policy, self.kl_coeff
        old = ((target_dist.loc, target_dist.scale) if isinstance(target_dist, torch.distributions.Normal)
               else (target_dist.logits,))
        per_sample = dict(x=x_all, old=old, actions=actions,
                          logp_target=torch.as_tensor(data["logp_target"], device=dev),
                          weights=torch.as_tensor(data["is_weights"], device=dev))

        def terms(mb, adv, vs):
            logp, entropy, value, kl = policy_terms(policy, mb.x, mb.actions, mb.old, kl_grad=kl_coeff > 0)
            return impact_loss(logp, mb.logp_target, mb.weights, adv, value, vs, entropy, kl, clip=cfg.clip,
                               kl_coeff=kl_coeff, value_coeff=cfg.value_coeff, entropy_coeff=cfg.entropy_coeff)

        if online is None:  # targets fixed for the update: gathered once per epoch with the other fields
            per_sample.update(adv=data["adv_t"], vs=data["vs_t"])
            per_epoch = minibatch_advantages(n, cfg.minibatch_size) if cfg.normalize_advantages else None

            def minibatch_loss(mb):  # mb.<field>: this minibatch's slice of per_sample (mb.adv standardised, if set)
                return terms(mb, mb.adv, mb.vs)
        else:  # every step recomputes the targets with the critic as the previous step left it
            per_sample["idx"] = torch.arange(n, device=dev)  # gathered: mb.idx are the minibatch's rows
            per_epoch = None
            first = [(data["vs_t"], data["adv_t"])]  # no weight has moved before the first step

            def minibatch_loss(mb):
                vs_all, adv_all = first.pop() if first else online.targets()[:2]
                adv = adv_all[mb.idx]
                return terms(mb, normalize(adv) if cfg.normalize_advantages else adv, vs_all[mb.idx])

        sgd = minibatch_sgd(list(policy.parameters()), self.optimizer, self.generator, n, epochs=cfg.epochs,
                            minibatch_size=cfg.minibatch_size, max_grad_norm=cfg.max_grad_norm, device=dev,
                            epoch_loss_fn=epoch_loss_from(per_sample, minibatch_loss, per_epoch))
        means = sgd.means
        with torch.no_grad():
            final_kl = float(torch.cat([
                policy_kl(policy, x_all[i:i + FORWARD_CHUNK], tuple(o[i:i + FORWARD_CHUNK] for o in old))
                for i in range(0, n, FORWARD_CHUNK)]).mean())
        if cfg.kl_coeff > 0:
            self.kl_coeff = adapt_kl_coeff(self.kl_coeff, final_kl, cfg.kl_target)
        self.updates += 1
        self.last_data = {"obs": obs.cpu().numpy(), "actions": actions.cpu().numpy(),
                          **{k: data[k] for k in ("logp", "logp_target", "logp_target_net", "is_weights", "pg_weights",
                                                  "advantages", "vs", "values")}}
        var = float(np.var(data["vs"]))
        ev = float(1.0 - np.var(data["vs"] - data["values"]) / var) if var > 1e-12 else 0.0
        return IMPACTUpdateStats(
            samples=n, policy_loss=means["policy_loss"], value_loss=means["value_loss"], entropy=means["entropy"],
            kl=final_kl, clip_frac=means["clip_frac"], kl_coeff=self.kl_coeff, grad_norm=means["grad_norm"],
            explained_variance=ev, seconds=time.perf_counter() - t0, loss=means["loss"],
            gradient_noise_scale=sgd.noise_scale,
            is_weight_mean=float(data["pg_weights"].mean()), target_refreshed=refreshed)

    # -- checkpointing -----------------------------------------------------------------
    def state(self) -> dict:
        return {"policy": self.policy.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict(), "kl_coeff": self.kl_coeff, "updates": self.updates,
                "target_refreshes": self.target_refreshes, "generator": self.generator.get_state()}

    def load_state(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.kl_coeff = state["kl_coeff"]
        self.updates = state["updates"]
        self.target_refreshes = state["target_refreshes"]
        self.generator.set_state(state["generator"])
