"""The optimised PPO and IMPACT updates against a straightforward per-minibatch implementation kept here.

The learners gather each field once per epoch, normalise observations once per update, compute the
Gaussian terms without distribution objects and keep the loop's sums on the device. The reference
below does it the plain way: per minibatch, index every field with perm[start:stop], call
Policy.distribution / log_prob / entropy / value, torch.distributions' KL, and sync every scalar. Same
seed, same batch, same minibatches: the weights and the reported statistics must agree to float32
rounding. Plus device plumbing: every tensor the update creates is on the model's device.
"""

import math

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nitro.algos.impact import IMPACTLearner, impact_loss
from nitro.algos.ppo import PPOLearner, adapt_kl_coeff, collate, normalize, ppo_loss, standardize_batch
from nitro.algos.vtrace import vtrace_batches
from nitro.config import impact_config, ppo_config
from nitro.policy.models import ModelSpec

BOX = ModelSpec((5,), "box", 2, (-1.0, -1.0), (1.0, 1.0), hidden_sizes=(32, 32), obs_norm=True)
DISCRETE = ModelSpec((4,), "discrete", 3, hidden_sizes=(16, 16))


def batches(spec, policy, n_batches=2, steps=96, seed=0):
    """Actor-like batches: behaviour log-probs from a slightly different policy, some episode ends, and the
    bootstrap observations (final observations of the truncated steps, the observation after the last)."""
    rng, extra = np.random.default_rng(seed), np.random.default_rng(seed + 1000)
    out = []
    for _ in range(n_batches):
        obs = (rng.normal(size=(steps, *spec.obs_shape)) * 2 + 1).astype(np.float32)
        with torch.no_grad():
            dist = policy.distribution(torch.as_tensor(obs))
            actions = dist.sample()
            logp = policy.log_prob(dist, actions).numpy() + rng.normal(0, 0.1, steps).astype(np.float32)
            values = policy.value(torch.as_tensor(obs)).numpy()
        out.append({"obs": obs, "actions": actions.numpy(), "rewards": rng.normal(1, 1, steps).astype(np.float32),
                    "terminated": rng.random(steps) < 0.05, "truncated": rng.random(steps) < 0.02,
                    "logp": logp.astype(np.float32), "values": values.astype(np.float32),
                    "final_values": rng.normal(size=steps).astype(np.float32), "bootstrap_value": 0.3})
        b = out[-1]
        b["terminated"] &= ~b["truncated"]
        b["terminated"][-1] = b["truncated"][-1] = False  # the batch ends mid-episode: bootstrap_obs is read
        b["final_obs"] = (extra.normal(size=(int(b["truncated"].sum()), *spec.obs_shape)) * 2 + 1).astype(np.float32)
        b["bootstrap_obs"] = (extra.normal(size=spec.obs_shape) * 2 + 1).astype(np.float32)
    return out


def _kl(old, idx, dist):
    if isinstance(old, torch.distributions.Normal):
        return torch.distributions.kl_divergence(torch.distributions.Normal(old.loc[idx], old.scale[idx]), dist).sum(-1)
    return torch.distributions.kl_divergence(torch.distributions.Categorical(logits=old.logits[idx]), dist)


def _sgd(learner, n, loss_of):
    """Plain epochs of minibatches, one sync per scalar, noise-scale sums from the flattened gradients."""
    cfg, params = learner.config, list(learner.policy.parameters())
    mb = n if cfg.minibatch_size <= 0 else min(cfg.minibatch_size, n)
    sums, steps, small_sq, grad_sum = {}, 0, [], None
    for epoch in range(cfg.epochs):
        perm = torch.randperm(n, generator=learner.generator)
        for start in range(0, n - mb + 1, mb):
            loss, parts = loss_of(perm[start:start + mb])
            learner.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            if epoch == 0 and n > mb:
                small_sq.append(float(flat.pow(2).sum()))
                grad_sum = flat.clone() if grad_sum is None else grad_sum + flat
            gn = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm) if cfg.max_grad_norm > 0 \
                else flat.norm()
            learner.optimizer.step()
            for k, v in {**parts, "grad_norm": gn, "loss": loss}.items():
                sums[k] = sums.get(k, 0.0) + float(v.detach())
            steps += 1
    big = float((grad_sum / len(small_sq)).pow(2).sum()) if len(small_sq) >= 2 else None
    return {k: v / steps for k, v in sums.items()}, small_sq, big


def reference_ppo_update(learner: PPOLearner, batch_list):
    cfg, policy = learner.config, learner.policy
    data = collate(batch_list, cfg.gamma, cfg.gae_lambda, cfg.reward_clip)
    if cfg.normalize_batch_advantages:
        data["advantages"] = standardize_batch(data["advantages"])
    obs, actions, logp_old, v_old, adv_all, returns = (
        torch.as_tensor(data[k]) for k in ("obs", "actions", "logp", "values", "advantages", "returns"))
    with torch.no_grad():
        old = policy.distribution(obs)

    def loss_of(idx):
        dist = policy.distribution(obs[idx])
        adv = normalize(adv_all[idx]) if cfg.normalize_advantages else adv_all[idx]
        kl = _kl(old, idx, dist)
        if learner.kl_coeff == 0:
            kl = kl.detach()
        return ppo_loss(policy.log_prob(dist, actions[idx]), logp_old[idx], adv, policy.value(obs[idx]), v_old[idx],
                        returns[idx], policy.entropy(dist), kl, clip=cfg.clip, kl_coeff=learner.kl_coeff,
                        value_coeff=cfg.value_coeff, entropy_coeff=cfg.entropy_coeff, value_clip=cfg.value_clip,
                        value_clip_mode=cfg.value_clip_mode)

    means, small_sq, big = _sgd(learner, len(obs), loss_of)
    with torch.no_grad():
        means["kl"] = float(_kl(old, slice(None), policy.distribution(obs)).mean())
    if cfg.kl_coeff > 0:
        learner.kl_coeff = adapt_kl_coeff(learner.kl_coeff, means["kl"], cfg.kl_target)
    learner.updates += 1
    return means, small_sq, big


def reference_impact_update(learner: IMPACTLearner, batch_list):
    cfg, policy = learner.config, learner.policy
    if learner.updates % cfg.target_update_freq == 0:
        learner.refresh_target()
    data, target_dist = learner.prepare(batch_list)
    obs, actions = data["obs"], data["actions"]
    logp_t, w, adv_all, vs = (torch.as_tensor(data[k]) for k in ("logp_target", "is_weights", "advantages", "vs"))

    def online_targets():
        """The policy's critic as it is now on every observation, written into the batches' value fields,
        then the numpy V-trace (the target network's log-probs for the weights)."""
        with torch.no_grad():
            own = []
            for b in batch_list:
                final = np.zeros(len(b["rewards"]), np.float32)
                final[b["truncated"]] = policy.value(torch.as_tensor(b["final_obs"])).numpy()
                own.append(dict(b, final_values=final,
                                bootstrap_value=float(policy.value(torch.as_tensor(b["bootstrap_obs"][None]))[0])))
            values = policy.value(obs).numpy()
        return (torch.as_tensor(x) for x in vtrace_batches(own, data["logp_target_net"], values, cfg))

    def loss_of(idx):
        nonlocal vs, adv_all
        if cfg.vtrace_critic == "online":  # before every step
            vs, adv_all = online_targets()
        dist = policy.distribution(obs[idx])
        adv = normalize(adv_all[idx]) if cfg.normalize_advantages else adv_all[idx]
        kl = _kl(target_dist, idx, dist)
        if learner.kl_coeff == 0:
            kl = kl.detach()
        return impact_loss(policy.log_prob(dist, actions[idx]), logp_t[idx], w[idx], adv, policy.value(obs[idx]),
                           vs[idx], policy.entropy(dist), kl, clip=cfg.clip, kl_coeff=learner.kl_coeff,
                           value_coeff=cfg.value_coeff, entropy_coeff=cfg.entropy_coeff)

    means, small_sq, big = _sgd(learner, len(obs), loss_of)
    with torch.no_grad():
        means["kl"] = float(_kl(target_dist, slice(None), policy.distribution(obs)).mean())
    if cfg.kl_coeff > 0:
        learner.kl_coeff = adapt_kl_coeff(learner.kl_coeff, means["kl"], cfg.kl_target)
    learner.updates += 1
    return means, small_sq, big


def _noise_scale(small_sq, big, mb):
    from nitro.scaling.noise import noise_scale_estimates

    est = noise_scale_estimates(small_sq, big, mb, mb * len(small_sq)).b_simple
    return float(est) if est is not None else 0.0


def _flat(learner):
    return torch.cat([p.detach().flatten() for p in learner.policy.parameters()])


CASES = [
    ("ppo", BOX, dict(preset="tuned", minibatch_size=48, epochs=3)),  # per-minibatch advantages, KL reported only
    ("ppo", BOX, dict(preset="paper", minibatch_size=64, epochs=2, kl_coeff=0.5)),  # KL in the loss, capped value loss
    ("ppo", BOX, dict(preset="tuned", minibatch_size=48, epochs=2, value_clip=0.2, entropy_coeff=0.01,
                      max_grad_norm=0.0)),
    ("ppo", DISCRETE, dict(preset="fast", minibatch_size=40, epochs=2, kl_coeff=0.2)),
    ("impact", BOX, dict(preset="tuned", minibatch_size=48, epochs=2)),  # V-trace on the online critic, per step
    ("impact", DISCRETE, dict(preset="fast", minibatch_size=0, epochs=2)),  # full batch: no noise estimate
    ("impact", BOX, dict(preset="tuned", minibatch_size=48, epochs=2, vtrace_critic="target")),  # once per update
    ("impact", DISCRETE, dict(preset="fast", minibatch_size=0, epochs=2, vtrace_critic="target")),
]


@pytest.mark.parametrize("algo,spec,cfg", CASES)
def test_optimised_update_equals_the_straightforward_one(algo, spec, cfg):
    cfg = dict(cfg)
    preset = cfg.pop("preset")
    make = (lambda: PPOLearner(spec, ppo_config(preset, **cfg), seed=3)) if algo == "ppo" else \
        (lambda: IMPACTLearner(spec, impact_config(preset, **cfg), seed=3))
    fast, plain = make(), make()
    assert torch.equal(_flat(fast), _flat(plain))
    data = batches(spec, fast.policy)
    for learner in (fast, plain):
        learner.policy.update_obs_stats(np.concatenate([b["obs"] for b in data]))
    reference = reference_ppo_update if algo == "ppo" else reference_impact_update
    for _ in range(2):  # the second update runs with Adam's moments and an adapted KL coefficient
        before = _flat(fast)
        stats = fast.update(data)
        means, small_sq, big = reference(plain, data)
        moved = (_flat(plain) - before).abs().max()
        assert moved > 1e-4  # the update does move the weights, so agreeing below is not vacuous
        torch.testing.assert_close(_flat(fast), _flat(plain), rtol=1e-4, atol=1e-6)
        for key in ("policy_loss", "value_loss", "entropy", "kl", "clip_frac", "grad_norm", "loss"):
            assert getattr(stats, key) == pytest.approx(means[key], rel=1e-4, abs=1e-6), key
        assert stats.kl_coeff == plain.kl_coeff
        mb = cfg["minibatch_size"] or stats.samples
        expected_noise = _noise_scale(small_sq, big, mb) if big is not None else 0.0
        assert stats.gradient_noise_scale == pytest.approx(expected_noise, rel=1e-3)
        assert (stats.gradient_noise_scale != 0.0) == (mb < stats.samples)


def test_the_comparison_detects_a_changed_minibatch_draw():
    """The check above can fail: a learner that draws its minibatches from another seed diverges."""
    cfg = ppo_config("tuned", minibatch_size=48, epochs=2)
    fast, plain = PPOLearner(BOX, cfg, seed=3), PPOLearner(BOX, cfg, seed=3)
    fast.generator.manual_seed(99)
    data = batches(BOX, fast.policy)
    fast.update(data)
    reference_ppo_update(plain, data)
    assert not torch.allclose(_flat(fast), _flat(plain), rtol=1e-4, atol=1e-6)


class _Devices(TorchDispatchMode):
    """Records the device of every tensor an aten op produces."""

    def __init__(self):
        super().__init__()
        self.devices: set[torch.device] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                self.devices.add(t.device)
        return out


@pytest.mark.parametrize("algo", ["ppo", "impact"])
def test_every_tensor_the_update_creates_is_on_the_models_device(algo):
    learner = PPOLearner(BOX, ppo_config("tuned", minibatch_size=48, epochs=1), seed=0) if algo == "ppo" else \
        IMPACTLearner(BOX, impact_config("tuned", minibatch_size=48, epochs=1), seed=0)
    data = batches(BOX, learner.policy)
    with _Devices() as mode:
        learner.update(data)
    device = next(learner.policy.parameters()).device
    assert mode.devices == {device}


def _factory_calls(learner, data):
    """(function name, device argument) of every tensor factory called during the update."""
    factories = {torch.as_tensor, torch.tensor, torch.zeros, torch.ones, torch.empty, torch.full, torch.arange,
                 torch.randperm, torch.randn, torch.rand, torch.eye, torch.linspace}
    seen = []

    class Mode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in factories:
                seen.append((func.__name__, kwargs.get("device")))
            return func(*args, **kwargs)

    with Mode():
        learner.update(data)
    return seen


@pytest.mark.parametrize("algo", ["ppo", "impact"])
def test_tensors_the_update_creates_name_the_learners_device(algo):
    """Factories inside the update pass the learner's device (no default, no hard-coded cpu); the one
    exception is the minibatch permutations, drawn on CPU generators and moved to the device (PPO's noise probe
    draws one more, for its own minibatches)."""
    learner = PPOLearner(BOX, ppo_config("tuned", minibatch_size=48, epochs=2), seed=0) if algo == "ppo" else \
        IMPACTLearner(BOX, impact_config("tuned", minibatch_size=48, epochs=2), seed=0)
    learner.device = torch.device("cpu")
    seen = _factory_calls(learner, batches(BOX, learner.policy))
    assert seen.count(("randperm", None)) == 2 + (algo == "ppo")  # one per epoch, and PPO's noise probe's
    others = [s for s in seen if s[0] != "randperm"]
    assert others and all(torch.device(d) == learner.device for _, d in others if d is not None), others
    assert all(d is not None for name, d in others if name == "as_tensor" and algo == "ppo"), others


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("algo", ["ppo", "impact"])
def test_update_on_cuda_matches_cpu(algo):
    def make(device):
        return PPOLearner(BOX, ppo_config("tuned", minibatch_size=48, epochs=2), seed=1, device=device) \
            if algo == "ppo" else IMPACTLearner(BOX, impact_config("tuned", minibatch_size=48, epochs=2), seed=1,
                                                device=device)
    cpu, gpu = make("cpu"), make("cuda")
    data = batches(BOX, cpu.policy)
    s_cpu, s_gpu = cpu.update(data), gpu.update(data)
    assert all(p.device.type == "cuda" for p in gpu.policy.parameters())
    torch.testing.assert_close(_flat(gpu).cpu(), _flat(cpu), rtol=1e-3, atol=1e-5)
    assert math.isclose(s_gpu.policy_loss, s_cpu.policy_loss, rel_tol=1e-3, abs_tol=1e-5)
