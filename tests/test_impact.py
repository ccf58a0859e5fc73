"""IMPACT: loss pieces by hand, the learner (target refresh, off-policy data, checkpoints), replay, detector."""

import io
import math

import numpy as np
import pytest
import torch

from nitro.algos.impact import IMPACTLearner, impact_loss, impact_surrogate, reference_logp
from nitro.algos.ppo import UpdateStats
from nitro.algos.replay import ReplayBuffer
from nitro.config import IMPACT_PRESETS, IMPACTConfig, impact_config, make_config
from nitro.detector.core import REQUIRED_FIELDS, detect
from nitro.errors import ConfigError
from nitro.policy.inference import PolicyRunner
from nitro.policy.models import ModelSpec, Policy
from nitro.policy.rollout import Sampler

T = torch.tensor


def test_reference_logp_is_rllibs_clamped_ratio_and_carries_no_gradient():
    lt = T([0.0, 0.0, 0.0], requires_grad=True)  # pi_target = 1
    lb = T([math.log(4.0), 0.0, math.log(0.25)])  # mu = 4, 1, 1/4
    ref = reference_logp(lt, lb, is_ratio_clip=2.0)
    torch.testing.assert_close(ref, torch.log(T([2.0, 1.0, 1.0])))  # max(pi_target, mu / 2)
    assert not ref.requires_grad
    # RLlib's ratio min(2, mu / pi_target) * pi_theta / mu at pi_theta = 1: 2/4, 1, (1/4)/(1/4)
    torch.testing.assert_close(torch.exp(-ref), T([0.5, 1.0, 1.0]))


def test_surrogate_by_hand():
    # r = pi/pi_target = (1.5, 0.5, 1.0), A = (1, 1, -1), w = (1, 2, 0.5), clip 0.2:
    # min(1.5, 1.2) * 1 = 1.2;  min(0.5, 0.8) * 2 = 1.0;  -1 * 0.5 = -0.5  -> mean 1.7 / 3
    lt = T([0.0, 0.0, 0.0])
    ln = torch.log(T([1.5, 0.5, 1.0]))
    val = impact_surrogate(ln, lt, T([1.0, 2.0, 0.5]), T([1.0, 1.0, -1.0]), clip=0.2)
    assert math.isclose(float(val), 1.7 / 3, rel_tol=1e-6)


def test_surrogate_gradient_vanishes_only_on_the_pessimistic_clipped_side():
    ln = torch.log(T([1.5, 1.5, 0.5, 0.5])).requires_grad_()
    adv = T([1.0, -1.0, 1.0, -1.0])
    impact_surrogate(ln, torch.zeros(4), torch.ones(4), adv, clip=0.2).backward()
    g = ln.grad
    assert g[0] == 0 and g[3] == 0  # r above 1+eps with A > 0, below 1-eps with A < 0: clipped
    assert g[1] != 0 and g[2] != 0  # the unclipped branch is the minimum


def test_loss_composition_by_hand():
    ln, lt = torch.log(T([1.0, 1.0])), T([0.0, 0.0])
    w, adv = T([1.0, 1.0]), T([2.0, 4.0])  # surrogate = 3
    v, vs = T([1.0, 3.0]), T([0.0, 1.0])  # 0.5 * mean(1, 4) = 1.25
    ent, kl = T([0.5, 1.5]), T([0.1, 0.3])  # means 1.0 and 0.2
    total, parts = impact_loss(ln, lt, w, adv, v, vs, ent, kl, clip=0.4, kl_coeff=2.0, value_coeff=0.5,
                               entropy_coeff=0.1)
    assert math.isclose(float(parts["policy_loss"]), -3.0, rel_tol=1e-6)
    assert math.isclose(float(parts["value_loss"]), 1.25, rel_tol=1e-6)
    assert math.isclose(float(total), -3.0 + 2.0 * 0.2 + 0.5 * 1.25 - 0.1 * 1.0, rel_tol=1e-6)
    assert float(parts["clip_frac"]) == 0.0


# -- config --------------------------------------------------------------------------------


def test_paper_preset_is_table_1():
    p = impact_config("paper")
    assert (p.lr, p.gamma, p.clip, p.kl_coeff, p.kl_target, p.entropy_coeff, p.value_coeff) == (
        5e-4, 0.99, 0.4, 1.0, 0.01, 0.01, 1.0)
    assert (p.batch_size, p.target_update_freq, p.rho_bar, p.c_bar) == (4096, 1, 1.0, 1.0)
    assert impact_config("paper-atari").batch_size == 256
    assert (impact_config("paper").reward_clip, impact_config("paper-atari").reward_clip) == (0.0, 1.0)
    assert set(IMPACT_PRESETS) == {"paper", "paper-atari", "tuned", "fast"}
    assert isinstance(make_config("impact", "fast"), IMPACTConfig)


@pytest.mark.parametrize("field,value", [("clip", 1.0), ("rho_bar", 0.0), ("c_bar", -1.0),
                                         ("target_update_freq", 0), ("replay_max_reuse", 0),
                                         ("is_ratio_clip", float("inf")), ("lr", 0.0),
                                         ("reward_clip", -1.0), ("reward_clip", float("nan"))])
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        impact_config("paper", **{field: value})


def test_unknown_fields_and_presets():
    with pytest.raises(ConfigError, match="unknown hyperparameter"):
        impact_config("fast", gae_lambda=0.9)  # a PPO field
    with pytest.raises(ConfigError, match="unknown IMPACT preset"):
        impact_config("nope")


# -- learner -------------------------------------------------------------------------------

SPEC = ModelSpec((4,), "discrete", 2, hidden_sizes=(16, 16))


def cartpole_batches(policy: Policy, n=2, steps=128, seed=0):
    """Batches as an IMPACT job's actors sample them: no per-step values, the bootstrap observations shipped."""
    runner = PolicyRunner(SPEC, policy.numpy_state(), 0, behaviour_values=False)
    out = []
    for i in range(n):
        s = Sampler("CartPole-v1", seed=seed + i)
        out.append(s.sample(runner, steps, np.random.default_rng(seed + i)))
        s.close()
    return out


def params_of(p: Policy) -> list[torch.Tensor]:
    return [t.detach().clone() for t in p.parameters()]


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_reward_clip_changes_vtrace_targets_not_the_batch():
    learner = IMPACTLearner(SPEC, impact_config("fast"), seed=0)
    batches = cartpole_batches(learner.policy)
    scaled = [dict(b, rewards=b["rewards"] * 10.0) for b in batches]
    clipped = IMPACTLearner(SPEC, impact_config("fast", reward_clip=1.0), seed=0)
    data_plain, _ = learner.prepare(batches)
    data_clipped, _ = clipped.prepare(scaled)
    np.testing.assert_allclose(data_clipped["vs"], data_plain["vs"], rtol=1e-5)  # CartPole rewards are all 1
    assert not np.allclose(learner.prepare(scaled)[0]["vs"], data_plain["vs"])
    assert all(np.all(b["rewards"] == 10.0) for b in scaled)  # the batch itself is untouched


def test_update_stats_and_detector_data():
    cfg = impact_config("fast", minibatch_size=64, epochs=2)
    learner = IMPACTLearner(SPEC, cfg, seed=0)
    stats = learner.update(cartpole_batches(learner.policy))
    assert isinstance(stats, UpdateStats) and stats.samples == 256
    for name in ("policy_loss", "value_loss", "entropy", "kl", "clip_frac", "grad_norm", "explained_variance",
                 "gradient_noise_scale"):
        assert math.isfinite(getattr(stats, name)), name
    assert stats.gradient_noise_scale != 0.0  # several first-epoch minibatches: defined
    assert stats.target_refreshed and math.isclose(stats.is_weight_mean, 1.0, rel_tol=1e-4)  # on-policy data
    data = learner.last_data
    for k in REQUIRED_FIELDS["impact"] + ("logp",):
        assert len(data[k]) == 256, k
    np.testing.assert_allclose(data["is_weights"], 1.0, rtol=1e-4)


def test_target_network_refreshes_every_target_update_freq_updates():
    learner = IMPACTLearner(SPEC, impact_config("fast", target_update_freq=3), seed=0)
    batches = cartpole_batches(learner.policy)
    snapshots = [params_of(learner.policy)]
    refreshed = []
    for _ in range(7):
        refreshed.append(learner.update(batches).target_refreshed)
        snapshots.append(params_of(learner.policy))
    # Refresh at the start of updates 0, 3, 6: the target is the policy as update 6 began.
    assert refreshed == [True, False, False, True, False, False, True]
    assert same(params_of(learner.target), snapshots[6]) and not same(params_of(learner.target), snapshots[7])
    assert learner.target_refreshes == 3
    assert all(not p.requires_grad for p in learner.target.parameters())


def test_target_update_freq_1_tracks_the_policy_at_each_update_start():
    learner = IMPACTLearner(SPEC, impact_config("fast", target_update_freq=1), seed=0)
    batches = cartpole_batches(learner.policy)
    learner.update(batches)
    before = params_of(learner.policy)
    learner.update(batches)
    assert same(params_of(learner.target), before)


def test_off_policy_batches_get_truncated_weights():
    cfg = impact_config("fast", is_ratio_clip=1.5)
    learner = IMPACTLearner(SPEC, cfg, seed=0)
    stale = Policy(SPEC)  # a different (behaviour) policy
    with torch.no_grad():
        for p in stale.parameters():
            p.add_(torch.randn_like(p))
    stats = learner.update(cartpole_batches(stale))
    d = learner.last_data
    ratio = np.exp(d["logp_target_net"].astype(np.float64) - d["logp"])  # pi_target / mu
    # The policy gradient's only importance weight is the one V-trace puts into the advantages ...
    np.testing.assert_allclose(d["pg_weights"], np.minimum(cfg.pg_rho_bar, ratio), rtol=1e-5)
    np.testing.assert_allclose(d["is_weights"], 1.0)  # ... so the surrogate itself is not weighted again
    # The ratio's denominator is pi_target floored at mu / is_ratio_clip.
    np.testing.assert_allclose(d["logp_target"], np.maximum(d["logp_target_net"], d["logp"] - math.log(1.5)),
                               rtol=1e-5, atol=1e-6)
    assert (ratio < 1 / 1.5).any() and (ratio > 1.0).any()
    assert not math.isclose(stats.is_weight_mean, 1.0, rel_tol=1e-3)
    assert math.isfinite(stats.loss)


def _terminal_batch(policy: Policy, ratios: np.ndarray, rewards: np.ndarray, seed=0):
    """A hand-made batch of one-step episodes whose behaviour log-probs make pi_target / mu = ratios
    (the target network is `policy` as the update starts). Returns the batch, log pi_target and V."""
    n = len(ratios)
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    actions = rng.integers(0, 2, size=n)
    with torch.no_grad():
        dist = policy.distribution(torch.as_tensor(obs))
        logp_target = policy.log_prob(dist, torch.as_tensor(actions)).double().numpy()
        values = policy.value(torch.as_tensor(obs)).double().numpy()
    batch = {"obs": obs, "actions": actions, "rewards": rewards.astype(np.float32), "terminated": np.ones(n, bool),
             "truncated": np.zeros(n, bool), "logp": (logp_target - np.log(ratios)).astype(np.float32),
             "values": values.astype(np.float32), "final_values": np.zeros(n, np.float32), "bootstrap_value": 0.0}
    return batch, logp_target, values


def _rllib_appo_policy_loss(logp_new, logp_target, logp_mu, adv, clip):
    """RLlib APPO's policy loss, written out independently: is_ratio = clip(mu / pi_target, 0, 2),
    r = is_ratio * pi_theta / mu, L = -mean(min(r A, clip(r, 1 - eps, 1 + eps) A))."""
    is_ratio = torch.clamp(torch.exp(logp_mu - logp_target), 0.0, 2.0)
    r = is_ratio * torch.exp(logp_new - logp_mu)
    return -torch.mean(torch.minimum(r * adv, torch.clamp(r, 1 - clip, 1 + clip) * adv))


def test_importance_weight_is_applied_once_as_in_rllib_appo():
    cfg = impact_config("paper")  # one full-batch step, clip 0.4, pg_rho_bar 1, is_ratio_clip 2
    learner = IMPACTLearner(SPEC, cfg, seed=0)
    ratios = np.array([3.0, 1.5, 1.0, 0.8, 0.4, 0.25] * 4)  # pi_target / mu
    rewards = np.array([1.0, -1.0, 2.0, 1.0] * 6)
    batch, logp_target, values = _terminal_batch(learner.policy, ratios, rewards)
    logp_mu = batch["logp"].astype(np.float64)
    # One-step episodes: V-trace's advantage is min(pg_rho_bar, pi_target / mu) (r - V), by hand.
    adv = np.minimum(cfg.pg_rho_bar, ratios) * (rewards - values)
    T64 = lambda x: torch.as_tensor(x, dtype=torch.float64)  # noqa: E731
    # The update's single step runs at pi_theta = pi_target: RLlib's loss there, and the old loss,
    # which multiplied the surrogate by min(2, pi_target / mu) a second time.
    expected = float(_rllib_appo_policy_loss(T64(logp_target), T64(logp_target), T64(logp_mu), T64(adv), cfg.clip))
    double = -np.mean(np.minimum(cfg.is_ratio_clip, ratios) * adv)
    assert abs(expected - double) > 0.1
    stats = learner.update([batch])
    assert stats.policy_loss == pytest.approx(expected, rel=1e-4)
    d = learner.last_data
    np.testing.assert_allclose(d["advantages"], adv, rtol=1e-4, atol=1e-6)

    # Gradients away from the target policy (clipping active on some samples): the learner's loss
    # on its own data against RLlib's formula, and the old double weighting against both.
    logp_new = (T64(logp_target) + T64(np.random.default_rng(1).normal(0.0, 0.3, len(ratios)))).requires_grad_()
    ours = impact_loss(logp_new, T64(d["logp_target"]), T64(d["is_weights"]), T64(d["advantages"]), T64(values),
                       T64(values), torch.zeros(len(ratios)), torch.zeros(len(ratios)), clip=cfg.clip, kl_coeff=0.0,
                       value_coeff=0.0, entropy_coeff=0.0)[1]["policy_loss"]
    g_ours, = torch.autograd.grad(ours, logp_new)
    ref = _rllib_appo_policy_loss(logp_new, T64(logp_target), T64(logp_mu), T64(adv), cfg.clip)
    g_ref, = torch.autograd.grad(ref, logp_new)
    torch.testing.assert_close(ours.detach(), ref.detach(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-4, atol=1e-6)
    old = -impact_surrogate(logp_new, T64(logp_target), T64(np.minimum(cfg.is_ratio_clip, ratios)), T64(adv), cfg.clip)
    g_old, = torch.autograd.grad(old, logp_new)
    assert (g_old - g_ref).abs().max() > 1e-2


def test_update_moves_towards_higher_surrogate_and_kl_coeff_adapts():
    cfg = impact_config("paper", kl_coeff=1.0, kl_target=1e-6)  # any update exceeds 2x this target
    learner = IMPACTLearner(SPEC, cfg, seed=0)
    stats = learner.update(cartpole_batches(learner.policy))
    assert stats.kl > 2e-6 and learner.kl_coeff == 1.5
    cfg0 = impact_config("paper", kl_coeff=0.0)
    assert IMPACTLearner(SPEC, cfg0, seed=0).kl_coeff == 0.0


def test_state_round_trip_continues_identically():
    cfg = impact_config("fast", target_update_freq=2)
    a = IMPACTLearner(SPEC, cfg, seed=0)
    batches = cartpole_batches(a.policy)
    a.update(batches)
    buf = io.BytesIO()
    torch.save(a.state(), buf)  # as a checkpoint: no tensors shared between the two learners
    buf.seek(0)
    b = IMPACTLearner(SPEC, cfg, seed=5)
    b.load_state(torch.load(buf, weights_only=False))
    sa, sb = a.update(batches), b.update(batches)
    assert sa.loss == sb.loss and same(params_of(a.policy), params_of(b.policy))
    assert same(params_of(a.target), params_of(b.target)) and a.updates == b.updates == 2


def test_box_actions():
    spec = ModelSpec((3,), "box", 1, (-2.0,), (2.0,), hidden_sizes=(16,))
    learner = IMPACTLearner(spec, impact_config("fast", minibatch_size=0), seed=0)
    runner = PolicyRunner(spec, learner.policy.numpy_state(), 0, behaviour_values=False)
    s = Sampler("Pendulum-v1", seed=0)
    batch = s.sample(runner, 200, np.random.default_rng(0))
    s.close()
    stats = learner.update([batch])
    assert math.isfinite(stats.loss) and learner.last_data["actions"].shape == (200, 1)


# -- replay buffer -------------------------------------------------------------------------


def b(i, n=10):
    return {"rewards": np.zeros(n), "id": i}


def test_replay_buffer_is_bounded_and_evicts_oldest():
    buf = ReplayBuffer(capacity=3, max_reuse=5, seed=0)
    for i in range(5):
        buf.add(b(i))
    assert len(buf) == 3 and buf.steps == 30
    assert sorted(x["id"] for x in buf.sample(10)) == [2, 3, 4]


def test_replay_buffer_drops_batches_after_max_reuse():
    buf = ReplayBuffer(capacity=4, max_reuse=2, seed=0)
    for i in range(2):
        buf.add(b(i))
    assert len(buf.sample(2)) == 2 and len(buf) == 2
    assert len(buf.sample(5)) == 2 and len(buf) == 0  # each used twice now
    assert buf.sample(1) == [] and buf.replayed == 4


def test_replay_buffer_samples_distinct_batches_and_capacity_zero_disables():
    buf = ReplayBuffer(capacity=8, max_reuse=100, seed=1)
    for i in range(8):
        buf.add(b(i))
    got = [x["id"] for x in buf.sample(5)]
    assert len(set(got)) == 5 and got == sorted(got)
    off = ReplayBuffer(capacity=0)
    off.add(b(0))
    assert len(off) == 0 and off.sample(1) == []
    with pytest.raises(ConfigError, match="capacity"):
        ReplayBuffer(capacity=-1)
    with pytest.raises(ConfigError, match="max_reuse"):
        ReplayBuffer(capacity=1, max_reuse=0)


# -- detector ------------------------------------------------------------------------------


@pytest.mark.slow
def test_detector_scores_the_impact_surrogate():
    learner = IMPACTLearner(SPEC, impact_config("fast"), seed=0)
    learner.update(cartpole_batches(learner.policy, steps=200))
    samples = learner.last_data
    fast = detect(learner.policy, samples, clip=0.2, algo="impact", seed=1)
    exact = detect(learner.policy, samples, clip=0.2, algo="impact", seed=1, method="explicit")
    assert math.isclose(fast.lambda_max, exact.lambda_max, rel_tol=1e-3, abs_tol=1e-6)
    assert math.isclose(fast.lambda_min, exact.lambda_min, rel_tol=1e-3, abs_tol=1e-6)
    ppo = detect(learner.policy, samples, clip=0.2, algo="ppo", seed=1, method="explicit")
    assert ppo.lambda_max != exact.lambda_max  # a different objective
    with pytest.raises(ConfigError, match="logp_target"):
        detect(learner.policy, {k: v for k, v in samples.items() if k != "logp_target"}, clip=0.2, algo="impact")
    with pytest.raises(ConfigError, match="algo"):
        detect(learner.policy, samples, clip=0.2, algo="sac")


def test_impact_objective_equals_minus_the_policy_loss():
    from nitro.detector.hvp import impact_objective

    learner = IMPACTLearner(SPEC, impact_config("fast"), seed=0)
    stale = Policy(SPEC)  # off-policy data, so that the ratio's floor and the advantages' weights matter
    with torch.no_grad():
        for p in stale.parameters():
            p.add_(torch.randn_like(p))
    learner.update(cartpole_batches(stale))
    d = learner.last_data
    obj = impact_objective(learner.policy, torch.as_tensor(d["obs"]), torch.as_tensor(d["actions"]),
                           torch.as_tensor(d["logp_target"]), torch.as_tensor(d["is_weights"]),
                           torch.as_tensor(d["advantages"]), 0.2)().detach()
    dist = learner.policy.distribution(torch.as_tensor(d["obs"]))
    logp_new = learner.policy.log_prob(dist, torch.as_tensor(d["actions"]))
    ref = impact_surrogate(logp_new, torch.as_tensor(d["logp_target"]), torch.as_tensor(d["is_weights"]),
                           torch.as_tensor(d["advantages"]), 0.2).detach()
    assert math.isclose(float(obj), float(ref), rel_tol=1e-6)
    # ... and that is RLlib APPO's surrogate on the target network's own log-probs (is_ratio_clip 2).
    rllib = -_rllib_appo_policy_loss(logp_new, torch.as_tensor(d["logp_target_net"]), torch.as_tensor(d["logp"]),
                                     torch.as_tensor(d["advantages"]), 0.2).detach()
    assert math.isclose(float(obj), float(rllib), rel_tol=1e-5, abs_tol=1e-7)


# -- V-trace's critic (vtrace_critic) ---------------------------------------------------------------


def test_vtrace_critic_is_validated_naming_the_field_and_the_allowed_values():
    assert impact_config("paper").vtrace_critic == "online" and IMPACTConfig().vtrace_critic == "online"
    assert impact_config("paper", vtrace_critic="target").vtrace_critic == "target"
    with pytest.raises(ConfigError, match=r"vtrace_critic: must be one of \['online', 'target'\]"):
        impact_config("paper", vtrace_critic="behaviour")


def limited_batches(policy: Policy, n=2, steps=100):
    """As `cartpole_batches`, with 15-step episodes: batches with time-limit truncations (final observations to
    bootstrap from) and terminations that end mid-episode (the bootstrap observation), the first n seeds'."""
    runner = PolicyRunner(SPEC, policy.numpy_state(), 0, behaviour_values=False)
    out = []
    for seed in range(50):
        s = Sampler("CartPole-v1", seed=seed, env_kwargs={"max_episode_steps": 15})
        b = s.sample(runner, steps, np.random.default_rng(seed))
        s.close()
        if b["truncated"].any() and b["terminated"].any() and not (b["truncated"][-1] or b["terminated"][-1]):
            out.append(b)
        if len(out) == n:
            return out
    raise AssertionError("no seed gave such batches")


def online_reference(policy: Policy, batches: list[dict], logp_target: np.ndarray, cfg):
    """V-trace as the online critic defines it, written out independently of the learner: the policy's
    critic on every observation and on the bootstrap observations, put where the actor's values would be
    (`final_values`, `bootstrap_value`), then the numpy V-trace against the target network's log-probs."""
    from nitro.algos.vtrace import vtrace_batches

    with torch.no_grad():
        own = []
        for b in batches:
            final = np.zeros(len(b["rewards"]), np.float32)
            if b["truncated"].any():
                final[b["truncated"]] = policy.value(torch.as_tensor(b["final_obs"])).numpy()
            own.append(dict(b, final_values=final,
                            bootstrap_value=float(policy.value(torch.as_tensor(b["bootstrap_obs"][None]))[0])))
        values = policy.value(torch.as_tensor(np.concatenate([b["obs"] for b in batches]))).numpy()
    return vtrace_batches(own, logp_target, values, cfg)


def perturb(module: torch.nn.Module, scale=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def test_online_targets_follow_the_policys_critic_not_the_target_networks():
    cfg = impact_config("fast")
    learner = IMPACTLearner(SPEC, cfg, seed=0)
    behaviour = Policy(SPEC)  # off-policy data: the importance weights are not all 1
    batches = limited_batches(behaviour)
    base = learner.prepare(batches)[0]
    vs, adv = online_reference(learner.policy, batches, base["logp_target_net"], cfg)
    np.testing.assert_allclose(base["vs"], vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(base["advantages"], adv, rtol=1e-5, atol=1e-5)

    perturb(learner.target.critic)  # the target network's critic: not read
    same = learner.prepare(batches)[0]
    for k in ("vs", "advantages", "values", "logp_target_net", "pg_weights"):
        np.testing.assert_array_equal(same[k], base[k], err_msg=k)

    perturb(learner.policy.critic)  # the critic being trained: the targets move with it
    moved = learner.prepare(batches)[0]
    assert np.abs(moved["vs"] - base["vs"]).max() > 1e-2
    assert np.abs(moved["advantages"] - base["advantages"]).max() > 1e-2
    np.testing.assert_array_equal(moved["logp_target_net"], base["logp_target_net"])  # weights: the target's
    vs, adv = online_reference(learner.policy, batches, base["logp_target_net"], cfg)
    np.testing.assert_allclose(moved["vs"], vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(moved["advantages"], adv, rtol=1e-5, atol=1e-5)


def test_online_bootstrap_values_come_from_the_learners_critic_on_the_shipped_observations():
    cfg = impact_config("fast", rho_bar=1.0)
    learner = IMPACTLearner(SPEC, cfg, seed=0)
    batches = limited_batches(Policy(SPEC))
    base = learner.prepare(batches)[0]
    # The actor's bootstrap values are not read: poisoning them changes nothing ...
    poisoned = [dict(b, final_values=b["final_values"] + 1e3, bootstrap_value=1e3) for b in batches]
    np.testing.assert_array_equal(learner.prepare(poisoned)[0]["vs"], base["vs"])
    # ... while the old mode reads exactly them.
    old = IMPACTLearner(SPEC, impact_config("fast", rho_bar=1.0, vtrace_critic="target"), seed=0)
    assert np.abs(old.prepare(poisoned)[0]["vs"] - old.prepare(batches)[0]["vs"]).max() > 100

    # Where a trace ends at a truncation or at the batch's end, v_t = V(x_t) + rho_t (r_t + gamma V(x') - V(x_t))
    # with V the learner's critic and x' the shipped observation.
    def v(obs):
        with torch.no_grad():
            return learner.policy.value(torch.as_tensor(obs)).double().numpy()
    rho = np.minimum(cfg.rho_bar, np.exp(base["logp_target_net"].astype(np.float64) - base["logp"]))
    start = 0
    for b in batches:
        rows = np.flatnonzero(b["truncated"])
        ends = {**dict(zip(rows, v(b["final_obs"]))), len(b["rewards"]) - 1: v(b["bootstrap_obs"][None])[0]}
        for t, v_next in ends.items():
            i = start + t
            v_t = v(b["obs"][t][None])[0]
            expected = v_t + rho[i] * (b["rewards"][t] + cfg.gamma * v_next - v_t)
            assert base["vs"][i] == pytest.approx(expected, rel=1e-5, abs=1e-5)
        start += len(b["rewards"])
    # Another bootstrap observation: only the targets of the batch's last episode move.
    other = [dict(batches[0], bootstrap_obs=batches[0]["bootstrap_obs"] + 1.0), batches[1]]
    moved = learner.prepare(other)[0]["vs"]
    n0 = len(batches[0]["rewards"])
    last_episode = int(np.flatnonzero(batches[0]["terminated"] | batches[0]["truncated"])[-1]) + 1
    assert np.all(moved[last_episode:n0] != base["vs"][last_episode:n0])
    np.testing.assert_array_equal(moved[:last_episode], base["vs"][:last_episode])
    np.testing.assert_array_equal(moved[n0:], base["vs"][n0:])


def test_online_batches_without_bootstrap_observations_are_refused_naming_the_field():
    learner = IMPACTLearner(SPEC, impact_config("fast"), seed=0)
    batches = limited_batches(learner.policy)
    for field in ("final_obs", "bootstrap_obs"):
        lacking = [{k: v for k, v in b.items() if k != field} for b in batches]
        with pytest.raises(ValueError, match=f"'{field}'.*vtrace_critic 'target'"):
            learner.update(lacking)
        IMPACTLearner(SPEC, impact_config("fast", vtrace_critic="target"), seed=0).update(lacking)  # never read


def _steps_seen(monkeypatch, learner):
    """Record, for every minibatch step of the learner's next update, a copy of the policy as the step began
    and the targets and advantages its loss received."""
    import copy

    import nitro.algos.impact as impact_mod

    seen, real = [], impact_mod.impact_loss

    def spy(logp_new, logp_target, is_weights, adv, v_new, vs, *rest, **kw):
        seen.append((copy.deepcopy(learner.policy), vs.detach().clone().numpy(), adv.detach().clone().numpy()))
        return real(logp_new, logp_target, is_weights, adv, v_new, vs, *rest, **kw)

    monkeypatch.setattr(impact_mod, "impact_loss", spy)
    return seen


@pytest.mark.parametrize("critic", ["online", "target"])
def test_each_minibatch_step_gets_the_targets_of_the_critic_the_previous_step_left(monkeypatch, critic):
    cfg = impact_config("fast", epochs=2, minibatch_size=100, normalize_advantages=False, lr=1e-2,
                        vtrace_critic=critic)
    learner = IMPACTLearner(SPEC, cfg, seed=0)
    batches = limited_batches(Policy(SPEC))
    n = sum(len(b["rewards"]) for b in batches)
    draw = torch.Generator()
    draw.set_state(learner.generator.get_state())  # the update's minibatches: one permutation per epoch
    rows = [p[k:k + 100] for p in (torch.randperm(n, generator=draw) for _ in range(2)) for k in (0, 100)]
    seen = _steps_seen(monkeypatch, learner)
    learner.update(batches)
    assert len(seen) == 4
    logp_target = learner.last_data["logp_target_net"]
    for (policy, vs, adv), idx in zip(seen, rows):
        if critic == "online":  # the critic as this step began, on every row and bootstrap observation
            ref_vs, ref_adv = online_reference(policy, batches, logp_target, cfg)
        else:  # the target network's critic and the actor's values, fixed at the update's start
            ref_vs, ref_adv = learner.last_data["vs"], learner.last_data["advantages"]
        np.testing.assert_allclose(vs, ref_vs[idx], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(adv, ref_adv[idx], rtol=1e-5, atol=1e-5)
    if critic == "online":  # the first step moved the critic, so the second step's targets are not the first's
        first_vs = online_reference(seen[0][0], batches, logp_target, cfg)[0]
        assert np.abs(seen[1][1] - first_vs[rows[1]]).max() > 1e-2
    # The detector's copy holds the targets and advantages as the first step used them.
    np.testing.assert_allclose(learner.last_data["vs"][rows[0]], seen[0][1], rtol=1e-6)


def test_target_mode_reproduces_the_old_targets():
    """vtrace_critic "target": the target network's log-probs and values, the actor's bootstrap values, and the
    numpy V-trace, exactly as before the online critic existed."""
    from nitro.algos.vtrace import vtrace_batches

    cfg = impact_config("fast", vtrace_critic="target")
    learner = IMPACTLearner(SPEC, cfg, seed=0)
    batches = limited_batches(Policy(SPEC))
    perturb(learner.policy.critic)  # the online critic differs from the target network's: not read
    data = learner.prepare(batches)[0]
    obs = torch.as_tensor(np.concatenate([b["obs"] for b in batches]))
    with torch.no_grad():
        dist = learner.target.distribution(obs)
        logp = learner.target.log_prob(dist, torch.as_tensor(np.concatenate([b["actions"] for b in batches])))
        values = learner.target.value(obs)
    vs, adv = vtrace_batches(batches, logp.numpy(), values.numpy(), cfg)
    np.testing.assert_array_equal(data["vs"], vs)
    np.testing.assert_array_equal(data["advantages"], adv)
    np.testing.assert_array_equal(data["values"], values.numpy())


def test_the_torch_vtrace_equals_the_numpy_one_given_the_same_values():
    from nitro.algos.vtrace import vtrace_batches, vtrace_from_plan, vtrace_plan

    rng = np.random.default_rng(0)
    cfg = impact_config("fast", rho_bar=1.5, c_bar=0.9, pg_rho_bar=1.2, reward_clip=2.0, gamma=0.97)
    batches, values, boot_values = [], [], []
    for size, end in [(1, "mid"), (7, "terminated"), (300, "mid"), (40, "truncated"), (2, "terminated")]:
        term, trunc = rng.random(size) < 0.1, rng.random(size) < 0.1
        if size == 300:  # one uncut 300-step trace: the scan's nine doubling rounds all matter
            term[:], trunc[:] = False, False
        term &= ~trunc
        term[-1], trunc[-1] = end == "terminated", end == "truncated"
        v = rng.normal(size=size)
        fv = np.where(trunc, rng.normal(size=size), 0.0)
        bv = rng.normal() if end == "mid" else 0.0
        batches.append({"rewards": rng.normal(0, 2, size).astype(np.float32), "terminated": term, "truncated": trunc,
                        "logp": rng.normal(-1, 0.5, size).astype(np.float32), "obs": np.zeros((size, 4), np.float32),
                        "final_values": fv.astype(np.float32), "bootstrap_value": float(bv),
                        "final_obs": np.zeros((int(trunc.sum()), 4), np.float32),
                        "bootstrap_obs": np.zeros(4, np.float32)})
        values.append(v)
        boot_values += [*fv[trunc], *([bv] if end == "mid" else [])]
    target_logp = rng.normal(-1, 0.5, sum(len(b["rewards"]) for b in batches)).astype(np.float32)
    values = np.concatenate(values).astype(np.float32)
    plan, boot_obs = vtrace_plan(batches, torch.as_tensor(target_logp), cfg)
    assert len(boot_obs) == len(boot_values) and plan.rounds == 9  # the 300-step batch: ceil(log2(300))
    vs, adv = vtrace_from_plan(plan, torch.as_tensor(values), torch.as_tensor(np.float32(boot_values)))
    ref_vs, ref_adv = vtrace_batches(batches, target_logp, values, cfg)
    np.testing.assert_allclose(vs.numpy(), ref_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-5, atol=1e-5)


def test_the_spec_field_reaches_the_config_and_the_wire_and_is_validated():
    from nitro.client import sdk
    from nitro.spec import InvalidSpec, TrainingSpec, algo_config, from_proto, to_proto, validate

    def spec(**kw):
        return TrainingSpec(**{"env_id": "CartPole-v1", "algo": "impact", "preset": "fast", **kw})

    assert algo_config(validate(spec())).vtrace_critic == "online"  # empty: the preset's
    old = validate(spec(vtrace_critic="target"))
    assert algo_config(old).vtrace_critic == "target"
    assert from_proto(to_proto(old)).vtrace_critic == "target"
    assert sdk.spec_to_proto({"env_id": "CartPole-v1", "algo": "impact", "vtrace_critic": "target"}).vtrace_critic \
        == "target"
    with pytest.raises(InvalidSpec, match=r"^vtrace_critic: unknown 'behaviour'; allowed: \['online', 'target'\]"):
        validate(spec(vtrace_critic="behaviour"))
    for other in (dict(algo="ppo"), dict(learner_mode="stellaris")):  # learners that do not read it
        with pytest.raises(InvalidSpec, match="^vtrace_critic: is read only by algo 'impact' with learner_mode "
                                              "'central'"):
            validate(spec(vtrace_critic="online", **other))
    with pytest.raises(InvalidSpec, match="^hyperparameters.vtrace_critic: is not numeric.*vtrace_critic field"):
        validate(spec(hyperparameters={"vtrace_critic": 1.0}))
