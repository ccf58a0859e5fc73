"""PPO: clipped surrogate, adaptive KL penalty, value and entropy terms.

Advantages may be standardised once over the train batch (`normalize_batch_advantages`,
RLlib's PPO) and/or per minibatch (`normalize_advantages`); the value loss is clipped in
PPO2's form around the behaviour value or in RLlib's form, which caps the squared error
(`value_clip_mode`).

The loss pieces are pure functions of tensors; `PPOLearner` owns the model, the
Adam optimiser and the adaptive KL coefficient, and turns a round's batches into
one update.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from nitro.algos.advantages import batch_gae
from nitro.algos.sgd import (
    LossTerms,
    actor_terms,
    adam,
    dist_params,
    epoch_loss_from,
    minibatch_length,
    minibatch_sgd,
    policy_kl,
)
from nitro.config import PPOConfig
from nitro.policy.models import ModelSpec, Policy
from nitro.scaling.noise import NoiseEstimate, noise_scale_estimates


def clipped_surrogate(logp_new: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor,
                      clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """-E[min(r A, clip(r, 1-eps, 1+eps) A)] with r = pi_new/pi_old; also the clipped fraction."""
    ratio = torch.exp(logp_new - logp_old)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * adv
    loss = -torch.minimum(unclipped, clipped).mean()
    clip_frac = ((ratio - 1.0).abs() > clip).float().mean()
    return loss, clip_frac


def value_loss(v_new: torch.Tensor, v_old: torch.Tensor, returns: torch.Tensor, clip: float,
               mode: str = "ppo2") -> torch.Tensor:
    """The value loss L_V; clip == 0 means no clipping.

    "ppo2": 0.5 * E[max((V - R)^2, (V_clip - R)^2)], V_clip = V_old + clip(V - V_old, -clip, clip)
    (plain 0.5 * E[(V - R)^2] with clip 0). "rllib": E[min((V - R)^2, clip)], RLlib's vf_clip_param:
    the squared error itself is capped, so samples beyond it give no value gradient; no 0.5 factor.
    """
    err = (v_new - returns).pow(2)
    if mode == "rllib":
        return (err.clamp(max=clip) if clip > 0 else err).mean()
    if mode != "ppo2":
        raise ValueError(f"unknown value clip mode {mode!r}; allowed: ['ppo2', 'rllib']")
    if clip > 0:
        v_clipped = v_old + (v_new - v_old).clamp(-clip, clip)
        err = torch.maximum(err, (v_clipped - returns).pow(2))
    return 0.5 * err.mean()


def ppo_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, v_new: torch.Tensor,
             v_old: torch.Tensor, returns: torch.Tensor, entropy: torch.Tensor, kl: torch.Tensor,
             *, clip: float, kl_coeff: float, value_coeff: float, entropy_coeff: float,
             value_clip: float = 0.0, value_clip_mode: str = "ppo2"
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Total loss = surrogate + kl_coeff * KL - entropy_coeff * H + value_coeff * L_V (L_V: `value_loss`):
    `ppo_actor_loss` plus `ppo_critic_loss`, the terms the update computes on two threads."""
    actor, parts = ppo_actor_loss(logp_new, logp_old, adv, entropy, kl, clip=clip, kl_coeff=kl_coeff,
                                  entropy_coeff=entropy_coeff)
    critic, critic_parts = ppo_critic_loss(v_new, v_old, returns, value_coeff=value_coeff, value_clip=value_clip,
                                           value_clip_mode=value_clip_mode)
    return actor + critic, {**parts, **critic_parts}


def ppo_actor_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, entropy: torch.Tensor,
                   kl: torch.Tensor, *, clip: float, kl_coeff: float, entropy_coeff: float
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The actor's terms of `ppo_loss`: surrogate + kl_coeff * KL - entropy_coeff * H."""
    pg, clip_frac = clipped_surrogate(logp_new, logp_old, adv, clip)
    ent = entropy.mean()
    kl_mean = kl.mean()
    return pg + kl_coeff * kl_mean - entropy_coeff * ent, {"policy_loss": pg, "entropy": ent, "kl": kl_mean,
                                                           "clip_frac": clip_frac}


def ppo_critic_loss(v_new: torch.Tensor, v_old: torch.Tensor, returns: torch.Tensor, *, value_coeff: float,
                    value_clip: float = 0.0, value_clip_mode: str = "ppo2") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The critic's term of `ppo_loss`: value_coeff * L_V."""
    vl = value_loss(v_new, v_old, returns, value_clip, value_clip_mode)
    return value_coeff * vl, {"value_loss": vl}


def adapt_kl_coeff(coeff: float, kl: float, target: float) -> float:
    """Adaptive KL penalty (Schulman et al. 2017, sec. 4): x1.5 above 2*target, x0.5 below target/2."""
    if kl > 2.0 * target:
        return coeff * 1.5
    if kl < 0.5 * target:
        return coeff * 0.5
    return coeff


def normalize(x: torch.Tensor) -> torch.Tensor:
    """Per-minibatch standardisation: (x - mean) / (std + 1e-8), population std."""
    return (x - x.mean()) / (x.std(unbiased=False) + 1e-8) if x.numel() > 1 else x - x.mean()


def normalize_slices(x: torch.Tensor, size: int) -> torch.Tensor:
    """`normalize` of each consecutive slice x[i:i + size] (the last one may be shorter), the full slices in
    one pass: an epoch's minibatches standardised at once instead of with ~5 small ops per step. Equal to the
    per-slice `normalize` to float rounding; bit for bit from 3 samples a slice up to torch's reduction block
    (32,768) on one thread."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    full = len(x) // size * size
    out = torch.empty_like(x)
    if full:
        rows = x[:full].view(-1, size)
        mean, std = rows.mean(1, keepdim=True), rows.std(1, unbiased=False, keepdim=True)
        out[:full] = ((rows - mean) / (std + 1e-8)).view(-1)
    if full < len(x):  # the shorter last slice
        out[full:] = normalize(x[full:])
    return out


def minibatch_advantages(n: int, minibatch_size: int) -> Callable[[dict], dict]:
    """`epoch_loss_from`'s per_epoch map that standardises the advantages ("adv") of every minibatch of an
    epoch in one pass (PPO's and IMPACT's normalize_advantages)."""
    size = minibatch_length(n, minibatch_size)
    return lambda fields: {**fields, "adv": normalize_slices(fields["adv"], size)}


POLICY_NOISE_MINIBATCHES = 16  # minibatches the policy-noise probe takes its gradients on (at most)


def policy_noise_probe(policy, params: list[torch.nn.Parameter], fields: dict, minibatches: list[torch.Tensor], *,
                       cfg: PPOConfig, kl_coeff: float) -> NoiseEstimate | None:
    """|G|^2 and tr(Sigma) of the policy loss's gradient at the current parameters: the actor's loss on each of
    `minibatches` (equal-sized index tensors into `fields`, PPOLearner.update's per-sample tensors; advantages
    standardised per minibatch when the config does), differentiated with respect to `params` without a step in
    between, then McCandlish et al.'s two-batch-size estimates (nitro.scaling.noise.noise_scale_estimates).
    The SGD loop's own estimate takes its minibatch gradients while the parameters move, and for the policy that
    drift makes the large-batch norm come out too small late in training (|G|^2 < 0 in most rounds past
    Hopper-v5's ~250k steps); here nothing moves. None with fewer than two minibatches."""
    if len(minibatches) < 2:
        return None
    small_sq, total = [], None
    for idx in minibatches:
        adv = fields["adv"][idx]
        if cfg.normalize_advantages:
            adv = normalize_slices(adv, len(adv))
        logp, entropy, kl = actor_terms(policy, fields["x"][idx], fields["actions"][idx],
                                        tuple(t[idx] for t in fields["old"]), kl_grad=kl_coeff > 0)
        loss, _ = ppo_actor_loss(logp, fields["logp_old"][idx], adv, entropy, kl, clip=cfg.clip, kl_coeff=kl_coeff,
                                 entropy_coeff=cfg.entropy_coeff)
        grads = [g if g is not None else torch.zeros_like(p)
                 for g, p in zip(torch.autograd.grad(loss, params, allow_unused=True), params)]
        small_sq.append(float(sum(g.double().square().sum() for g in grads)))
        total = [g.detach().clone() for g in grads] if total is None else [t.add_(g) for t, g in zip(total, grads)]
    big_sq = float(sum((t.double() / len(minibatches)).square().sum() for t in total))
    size = len(minibatches[0])
    return noise_scale_estimates(small_sq, big_sq, size, size * len(minibatches))


def standardize_batch(x: np.ndarray) -> np.ndarray:
    """Whole-batch standardisation as RLlib's PPO does it: (x - mean) / max(std, 1e-4), population std."""
    x64 = np.asarray(x, dtype=np.float64)
    return ((x64 - x64.mean()) / max(float(x64.std()), 1e-4)).astype(np.float32)


@dataclass
class UpdateStats:
    samples: int
    policy_loss: float
    value_loss: float
    entropy: float
    kl: float
    clip_frac: float
    kl_coeff: float
    grad_norm: float
    explained_variance: float
    seconds: float
    loss: float = 0.0
    gradient_noise_scale: float = 0.0  # B_simple from the first epoch's minibatch gradients; 0 = undefined
    policy_noise_scale: float = 0.0  # the same from the policy's parameters alone
    policy_grad_sq: float = 0.0  # its terms |G|^2 and tr(Sigma) (the "noise" scaler averages them); 0, 0: none
    policy_trace_sigma: float = 0.0
    learning_rate: float = 0.0  # the update's learning rate
    minibatch_size: int = 0  # the update's minibatch size (samples per SGD step)


def collate(batches: list[dict], gamma: float, lam: float, reward_clip: float = 0.0) -> dict[str, np.ndarray]:
    """Concatenate actor batches after computing advantages per batch (each is contiguous)."""
    if any("values" not in b for b in batches):  # GAE needs V(obs_t); actors leave it out only for IMPACT
        raise ValueError("a batch has no per-step 'values': its actors sampled with behaviour_values off, which only "
                         "learners outside nitro.spec.BEHAVIOUR_VALUE_ALGOS (IMPACT) accept")
    advs, rets = zip(*(batch_gae(b, gamma, lam, reward_clip) for b in batches))
    return {
        "obs": np.concatenate([b["obs"] for b in batches]),
        "actions": np.concatenate([b["actions"] for b in batches]),
        "logp": np.concatenate([b["logp"] for b in batches]).astype(np.float32),
        "values": np.concatenate([b["values"] for b in batches]).astype(np.float32),
        "advantages": np.concatenate(advs),
        "returns": np.concatenate(rets),
    }


class PPOLearner:
    """Owns the policy, Adam and the KL coefficient; `update(batches)` does one round's SGD."""

    def __init__(self, spec: ModelSpec, config: PPOConfig, seed: int = 0, device: str = "cpu",
                 critic_thread: bool = True):
        """critic_thread: on CPU with one torch thread, each minibatch's critic forward and backward run on a
        second thread beside the actor's (the two nets share no parameter, so the gradients are those of the
        joint loss). Measured on 2 cores (bench/learner_update.py, 2026-11-27): the demo's update 1.53x
        faster when the cores are free, 4% slower beside one busy process. Nothing of a PPO job samples
        during its update."""
        torch.manual_seed(seed)
        self.config = config
        self.device = torch.device(device)
        self.policy = Policy(spec).to(self.device)
        shared = {id(p) for p in self.policy.actor.parameters()} & {id(p) for p in self.policy.critic.parameters()}
        if shared:  # the split would count their gradient once per term
            raise ValueError("the actor and the critic must not share parameters")
        self.critic_thread = critic_thread and self.device.type == "cpu"
        self._critic_pool: ThreadPoolExecutor | None = None  # made on first use; copies make their own
        self.optimizer = adam(self.policy.parameters(), config.lr, config.adam_eps)
        self.kl_coeff = config.kl_coeff
        self.generator = torch.Generator().manual_seed(seed)
        # The policy-noise probe's minibatches come from a generator of their own: the SGD's stay as they were.
        self.noise_generator = torch.Generator().manual_seed(seed + 1)
        self.updates = 0
        self.last_data: dict[str, np.ndarray] | None = None

    def update(self, batches: list[dict], minibatch_size: int | None = None, lr_factor: float = 1.0) -> UpdateStats:
        """One round's SGD. `minibatch_size` (None: the config's) and `lr_factor` (times the config's learning
        rate) scale the update to the round ("noise-adascale", nitro.scaling.noise.adascale_update)."""
        cfg = self.config
        t0 = time.perf_counter()
        if not (lr_factor > 0 and math.isfinite(lr_factor)):
            raise ValueError(f"lr_factor must be a finite number > 0, got {lr_factor!r}")
        mb_size = cfg.minibatch_size if minibatch_size is None else int(minibatch_size)
        lr = cfg.lr * lr_factor
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        data = collate(batches, cfg.gamma, cfg.gae_lambda, cfg.reward_clip)
        if cfg.normalize_batch_advantages:  # once, over the whole batch, before any minibatch is drawn
            data["advantages"] = standardize_batch(data["advantages"])
        # Kept for the boosting detector's sample subset: its advantages are the ones the surrogate
        # used, short of the per-minibatch standardisation, which the detector repeats itself.
        self.last_data = data
        dev = self.device
        obs = torch.as_tensor(data["obs"], device=dev)
        n = obs.shape[0]
        policy, kl_coeff = self.policy, self.kl_coeff
        with torch.no_grad():
            # Observation statistics do not change during an update: normalise once, not per minibatch.
            x_all = policy.normalize(obs)
            old = dist_params(policy, obs)  # behaviour distribution = the policy before this update (on-policy)
        per_sample = dict(x=x_all, old=old, actions=torch.as_tensor(data["actions"], device=dev),
                          logp_old=torch.as_tensor(data["logp"], device=dev),
                          v_old=torch.as_tensor(data["values"], device=dev),
                          adv=torch.as_tensor(data["advantages"], device=dev),
                          returns=torch.as_tensor(data["returns"], device=dev))

        def minibatch_loss(mb):  # mb.<field>: this minibatch's slice of per_sample
            def critic():
                value = policy.critic(mb.x).squeeze(-1)
                return ppo_critic_loss(value, mb.v_old, mb.returns, value_coeff=cfg.value_coeff,
                                       value_clip=cfg.value_clip, value_clip_mode=cfg.value_clip_mode)

            def actor():  # mb.adv: standardised over this minibatch already (per_epoch below), if configured
                logp, entropy, kl = actor_terms(policy, mb.x, mb.actions, mb.old, kl_grad=kl_coeff > 0)
                return ppo_actor_loss(logp, mb.logp_old, mb.adv, entropy, kl, clip=cfg.clip, kl_coeff=kl_coeff,
                                      entropy_coeff=cfg.entropy_coeff)
            return LossTerms((critic, actor))  # the sum is ppo_loss; the critic's term runs on _term_pool()

        probe_mb = minibatch_length(n, mb_size)
        order = torch.randperm(n, generator=self.noise_generator).to(dev)
        probe = policy_noise_probe(policy, self.policy_parameters(), per_sample,
                                   [order[i * probe_mb:(i + 1) * probe_mb]
                                    for i in range(min(POLICY_NOISE_MINIBATCHES, n // probe_mb))],
                                   cfg=cfg, kl_coeff=kl_coeff) if n > probe_mb else None
        per_epoch = minibatch_advantages(n, mb_size) if cfg.normalize_advantages else None
        sgd = minibatch_sgd(list(policy.parameters()), self.optimizer, self.generator, n, epochs=cfg.epochs,
                            minibatch_size=mb_size, max_grad_norm=cfg.max_grad_norm, device=dev,
                            epoch_loss_fn=epoch_loss_from(per_sample, minibatch_loss, per_epoch),
                            term_pool=self._term_pool())
        means = sgd.means
        with torch.no_grad():
            final_kl = float(policy_kl(policy, x_all, old).mean())
        if cfg.kl_coeff > 0:
            self.kl_coeff = adapt_kl_coeff(self.kl_coeff, final_kl, cfg.kl_target)
        self.updates += 1
        var = float(np.var(data["returns"]))
        ev = float(1.0 - np.var(data["returns"] - data["values"]) / var) if var > 1e-12 else 0.0
        return UpdateStats(samples=n, policy_loss=means["policy_loss"], value_loss=means["value_loss"],
                           entropy=means["entropy"], kl=final_kl, clip_frac=means["clip_frac"],
                           kl_coeff=self.kl_coeff, grad_norm=means["grad_norm"], explained_variance=ev,
                           seconds=time.perf_counter() - t0, loss=means["loss"],
                           gradient_noise_scale=sgd.noise_scale,
                           policy_noise_scale=float(probe.b_simple or 0.0) if probe else 0.0,
                           policy_grad_sq=probe.grad_sq if probe else 0.0,
                           policy_trace_sigma=probe.trace_sigma if probe else 0.0,
                           learning_rate=lr, minibatch_size=sgd.minibatch_size)

    def policy_parameters(self) -> list[torch.nn.Parameter]:
        """The policy's parameters (the actor network and its log-std), which the critic's loss never reaches."""
        critic = {id(p) for p in self.policy.critic.parameters()}
        return [p for p in self.policy.parameters() if id(p) not in critic]

    def _term_pool(self) -> ThreadPoolExecutor | None:
        """The critic's thread, when it is on and torch runs one intra-op thread (with more, the two halves
        would each run that many, more threads than cores)."""
        if not self.critic_thread or torch.get_num_threads() != 1:
            return None
        if self._critic_pool is None:
            self._critic_pool = ThreadPoolExecutor(1, thread_name_prefix="ppo-critic")
        return self._critic_pool

    def __getstate__(self) -> dict:  # copy.deepcopy and pickle: a thread pool is not copied
        return {**self.__dict__, "_critic_pool": None}

    # -- checkpointing -----------------------------------------------------------------
    def state(self) -> dict:
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
                "kl_coeff": self.kl_coeff, "updates": self.updates, "generator": self.generator.get_state()}

    def load_state(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.kl_coeff = state["kl_coeff"]
        self.updates = state["updates"]
        self.generator.set_state(state["generator"])
