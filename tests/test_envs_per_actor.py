"""Several environments per actor (nitro.rollout.VecSampler) against the single-env Sampler.

Real environments throughout. The scripted policy is a real PolicyRunner whose actor
weights make it a deterministic bang-bang CartPole controller (logits of +-1e12, so
the Gumbel noise never decides), which lets each env of a VecSampler be replayed by
a single-env Sampler on the same seed: same observations, actions, rewards,
episode ends, episode returns, truncation bootstraps and GAE.
"""

import grpc
import gymnasium as gym
import numpy as np
import pytest
import redis

import actor_fn.handler as handler_mod
from nitro.algos.advantages import batch_gae
from nitro.data.batching import split_batch
from nitro.data.store import PolicyStore, TrajectoryReader
from nitro.errors import ConfigError
from nitro.policy.envs import env_spaces
from nitro.policy.inference import PolicyRunner
from nitro.policy.models import Policy, policy_to_blob, spec_for_spaces
from nitro.policy.rollout import Sampler, VecSampler, env_seed, make_sampler
from nitro.spec import InvalidSpec, TrainingSpec, from_proto, to_proto, validate
from tests.credentials import grant, read_key

ENV = "CartPole-v1"
KW = {"max_episode_steps": 60}  # short time limit: both truncations and terminations in a few hundred steps
PER_STEP = ("obs", "actions", "rewards", "terminated", "logp")


def scripted_runner(gain_v: float = 0.05) -> PolicyRunner:
    """Push right iff 10*angle + gain_v*angular_velocity > 0 (a real numpy MLP policy; the weak damping of
    the default gain lets some episodes fall before the time limit), random critic,
    non-trivial observation normalisation (the controller's inputs are left at mean 0, variance 1)."""
    spec = spec_for_spaces(*env_spaces(ENV), hidden_sizes=(16, 16), obs_norm=True)
    state = Policy(spec).numpy_state()
    for name in list(state):
        if name.startswith("actor."):
            state[name] = np.zeros_like(state[name])
    state["actor.layers.0.weight"][0, 2:] = [10.0, gain_v]
    state["actor.layers.1.weight"][0, 0] = 5.0
    state["actor.out.weight"][:, 0] = [-1e12, 1e12]
    state["obs_mean"] = np.array([0.3, -0.2, 0.0, 0.0])
    state["obs_var"] = np.array([4.0, 2.0, 1.0, 1.0])
    return PolicyRunner(spec, state, 0)


def segments(batch: dict, n_envs: int):
    T = len(batch["rewards"])
    lengths = np.full(n_envs, T // n_envs)
    lengths[:T % n_envs] += 1
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return [slice(int(a), int(a + n)) for a, n in zip(starts, lengths)]


def replay_singles(seed: int, n_envs: int, sizes: list[list[int]], runner, kwargs=KW):
    """Per env i: Sampler(env_seed(seed, i)) sampling sizes[call][i] steps per call."""
    singles = [Sampler(ENV, seed=env_seed(seed, i), env_kwargs=kwargs) for i in range(n_envs)]
    rng = np.random.default_rng(0)  # the scripted policy ignores the noise
    out = [[s.sample(runner, call[i], rng) for i, s in enumerate(singles)] for call in sizes]
    for s in singles:
        s.close()
    return out


@pytest.mark.parametrize("n_envs,steps", [(4, 400), (3, 301)])
def test_each_env_segment_is_the_single_env_trajectory(n_envs, steps):
    runner = scripted_runner()
    vec = VecSampler(ENV, n_envs, seed=11, env_kwargs=KW)
    rng = np.random.default_rng(5)
    vbatches = [vec.sample(runner, steps, rng) for _ in range(2)]  # the second call continues the episodes
    vec.close()
    sizes = [[s.stop - s.start for s in segments(b, n_envs)] for b in vbatches]
    singles = replay_singles(11, n_envs, sizes, runner)
    total_trunc = total_term = 0
    for vb, sbs in zip(vbatches, singles):
        assert len(vb["rewards"]) == steps  # steps_per_actor stays the total
        segs = segments(vb, n_envs)
        for i, (seg, sb) in enumerate(zip(segs, sbs)):
            for k in PER_STEP:
                np.testing.assert_array_equal(vb[k][seg], sb[k], err_msg=f"{k} env {i}")
            np.testing.assert_array_equal(vb["actions"][seg], sb["actions"])
            np.testing.assert_allclose(vb["values"][seg], sb["values"], rtol=1e-5, atol=1e-6)
            cut = vb["cut"][seg]
            # Truncations of the single env are truncations here, with the same final-observation value.
            np.testing.assert_array_equal(vb["truncated"][seg] & ~cut, sb["truncated"])
            np.testing.assert_allclose(vb["final_values"][seg][sb["truncated"]], sb["final_values"][sb["truncated"]],
                                       rtol=1e-5, atol=1e-6)
            last_single_done = bool(sb["terminated"][-1] or sb["truncated"][-1])
            if i < n_envs - 1:  # cut iff the env's segment ended mid-episode; it bootstraps like the single batch
                assert cut[-1] == (not last_single_done) and cut[:-1].sum() == 0
                if cut[-1]:
                    assert vb["truncated"][seg][-1]
                    assert vb["final_values"][seg][-1] == pytest.approx(sb["bootstrap_value"], rel=1e-5, abs=1e-6)
            else:
                assert not cut.any()
                assert vb["bootstrap_value"] == pytest.approx(sb["bootstrap_value"], rel=1e-5, abs=1e-6)
            # The learner's GAE over the whole env-major batch equals the single env's, segment by segment.
            v_adv, v_ret = batch_gae(vb, 0.99, 0.95)
            s_adv, s_ret = batch_gae(sb, 0.99, 0.95)
            np.testing.assert_allclose(v_adv[seg], s_adv, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(v_ret[seg], s_ret, rtol=1e-4, atol=1e-5)
            total_trunc += int(sb["truncated"].sum())
            total_term += int(sb["terminated"].sum())
        # Same episodes: the multiset of returns and lengths, ordered by where each ended in the batch.
        ends = [(seg.start + int(j), r, n) for seg, sb in zip(segs, sbs)
                for j, r, n in zip(np.flatnonzero(sb["terminated"] | sb["truncated"]), sb["episode_returns"],
                                   sb["episode_lengths"])]
        ends.sort()
        assert vb["episode_returns"] == [r for _, r, _ in ends]
        assert vb["episode_lengths"] == [n for _, _, n in ends]
    assert total_trunc > 0 and total_term > 0  # the scenario exercises both kinds of episode end


def test_gae_on_a_scripted_truncated_episode_bootstraps_from_the_final_observation():
    runner = scripted_runner()
    vec = VecSampler(ENV, 2, seed=3, env_kwargs={"max_episode_steps": 20})
    b = vec.sample(runner, 60, np.random.default_rng(0))  # 30 steps per env: one 20-step truncated episode each
    vec.close()
    assert list(np.flatnonzero(b["truncated"] & ~b["cut"])) == [19, 49] and not b["terminated"].any()
    assert list(np.flatnonzero(b["cut"])) == [29]
    gamma, lam = 0.9, 0.8
    adv, _ = batch_gae(b, gamma, lam)
    # By hand for env 0's episode (steps 0..19): next value = V(s_{t+1}), at step 19 V(final observation).
    v, r = b["values"].astype(np.float64), b["rewards"].astype(np.float64)
    nv = np.append(v[1:20], b["final_values"][19])
    assert b["final_values"][19] != 0.0
    delta = r[:20] + gamma * nv - v[:20]
    expect, acc = np.empty(20), 0.0
    for t in range(19, -1, -1):
        acc = delta[t] + gamma * lam * acc
        expect[t] = acc
    np.testing.assert_allclose(adv[:20], expect, rtol=1e-5, atol=1e-5)
    # The truncation's bootstrap is the critic's value of the real final observation (not of the reset one).
    single = Sampler(ENV, seed=3, env_kwargs={"max_episode_steps": 20})
    sb = single.sample(runner, 20, np.random.default_rng(0))
    single.close()
    assert b["final_values"][19] == pytest.approx(sb["final_values"][19], rel=1e-5, abs=1e-6)


def test_obs_normaliser_statistics_equal_a_sequential_computation():
    runner = scripted_runner()
    vec = VecSampler(ENV, 4, seed=2, env_kwargs=KW)
    vb = vec.sample(runner, 256, np.random.default_rng(0))
    vec.close()
    (sbs,) = replay_singles(2, 4, [[64] * 4], runner)
    batched, sequential = Policy(runner.spec), Policy(runner.spec)
    batched.update_obs_stats(vb["obs"])
    for sb in sbs:  # env by env, then step by step in chunks: the parallel-merge update in another order
        for a in range(0, 64, 16):
            sequential.update_obs_stats(sb["obs"][a:a + 16])
    for name in ("obs_mean", "obs_var", "obs_count"):
        np.testing.assert_allclose(getattr(batched, name).numpy(), getattr(sequential, name).numpy(), rtol=1e-9)
    allobs = np.concatenate([sb["obs"] for sb in sbs]).astype(np.float64)
    np.testing.assert_allclose(batched.obs_mean.numpy(), allobs.mean(0) * 256 / (256 + 1e-4), rtol=1e-6, atol=1e-9)


def test_split_batch_keeps_cuts_apart_from_episode_ends():
    runner = scripted_runner()
    vec = VecSampler(ENV, 4, seed=7, env_kwargs=KW)
    b = vec.sample(runner, 400, np.random.default_rng(0))
    vec.close()
    assert b["cut"].any()
    whole_adv, _ = batch_gae(b, 0.99, 0.95)
    for parts in (2, 3, 7):
        ps = split_batch(b, parts)
        assert sum(len(p["rewards"]) for p in ps) == 400
        assert [r for p in ps for r in p["episode_returns"]] == b["episode_returns"]
        for p in ps:
            ended = (p["terminated"] | p["truncated"]) & ~p["cut"]
            assert len(p["episode_returns"]) == int(ended.sum())
        # GAE over the parts equals the whole batch's at every step whose episode or segment ends in its part.
        adv = np.concatenate([batch_gae(p, 0.99, 0.95)[0] for p in ps])
        done = b["terminated"] | b["truncated"]
        bounds = np.cumsum([len(p["rewards"]) for p in ps])
        same = np.ones(400, dtype=bool)
        for end in bounds[:-1]:
            last_done = np.flatnonzero(done[:end])
            start = last_done[-1] + 1 if len(last_done) else 0
            same[start:end] = False  # a part cut mid-episode bootstraps from V at the cut (a shorter trace)
        np.testing.assert_allclose(adv[same], whole_adv[same], rtol=1e-4, atol=1e-5)


def test_env_seeds_and_reproducible_reseed():
    assert env_seed(123, 0) == 123 and env_seed(None, 3) is None
    seeds = [env_seed(123, i) for i in range(64)]
    assert len(set(seeds)) == 64 and seeds == [env_seed(123, i) for i in range(64)]
    assert env_seed(124, 1) not in seeds  # not seed + i: actor a's env 1 is not actor a+1's env 0
    spec = spec_for_spaces(*env_spaces("Hopper-v5"), obs_norm=True)
    runner = PolicyRunner(spec, Policy(spec).numpy_state(), 0)
    vec = VecSampler("Hopper-v5", 3, seed=9)
    vec.sample(runner, 50, np.random.default_rng(1))  # advance the warm episodes
    vec.reseed(42)
    a = vec.sample(runner, 90, np.random.default_rng(42))
    vec.reseed(42)
    b = vec.sample(runner, 90, np.random.default_rng(42))
    vec.close()
    for k in ("obs", "actions", "rewards", "logp", "values", "terminated", "truncated", "final_values", "cut"):
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    starts = a["obs"][[0, 30, 60]]
    assert len({s.tobytes() for s in starts}) == 3  # each env its own seed
    single = Sampler("Hopper-v5", seed=0)
    single.reseed(42)
    np.testing.assert_array_equal(single.obs, starts[0])  # env 0 reseeds exactly like the single-env actor
    single.close()


def test_one_env_per_actor_is_the_single_env_sampler_bitwise():
    spec = spec_for_spaces(*env_spaces("Hopper-v5"), obs_norm=True)
    runner = PolicyRunner(spec, Policy(spec).numpy_state(), 0)
    a, b = make_sampler("Hopper-v5", 4, None, 1), Sampler("Hopper-v5", seed=4)
    assert type(a) is Sampler
    ra, rb = np.random.default_rng(8), np.random.default_rng(8)
    for _ in range(2):
        ba, bb = a.sample(runner, 300, ra), b.sample(runner, 300, rb)
        assert ba.keys() == bb.keys() and "cut" not in ba
        for k, v in ba.items():
            if isinstance(v, np.ndarray):
                assert v.dtype == bb[k].dtype and v.tobytes() == bb[k].tobytes(), k
            else:
                assert v == bb[k], k
    a.close()
    b.close()


@pytest.mark.parametrize("env_id", ["Hopper-v5", "CartPole-v1"])
def test_batched_inference_matches_one_at_a_time(env_id):
    spec = spec_for_spaces(*env_spaces(env_id), obs_norm=True)
    state = Policy(spec).numpy_state()
    state["obs_mean"] = state["obs_mean"] + 0.1
    runner = PolicyRunner(spec, state, 0)
    obs = np.random.default_rng(0).normal(size=(7, *spec.obs_shape))
    acts, logp, values = runner.act_batch(obs, np.random.default_rng(3))
    rng = np.random.default_rng(3)  # (N, d) noise is the same draws as N calls of d
    for i, o in enumerate(obs):
        a, lp, v = runner.act(o, rng)
        np.testing.assert_allclose(acts[i], a, rtol=1e-5, atol=1e-6)
        assert logp[i] == pytest.approx(lp, rel=1e-5, abs=1e-5) and values[i] == pytest.approx(v, rel=1e-5, abs=1e-6)
    np.testing.assert_allclose(runner.value_batch(obs), values, rtol=1e-6)


# -- Atari: batched CNN inference ---------------------------------------------------------------------

def _perturbed_policy(spec, seed: int):
    """A CNN policy whose weights are moved off their init, so the actions and values are not all alike."""
    import torch

    torch.manual_seed(seed)
    policy = Policy(spec)
    with torch.no_grad():
        for t in policy.parameters():
            t.add_(0.05 * torch.randn_like(t))
    return policy


@pytest.mark.slow
def test_atari_vec_sampler_batches_the_cnn():
    import torch

    env_id = "ALE/Qbert-v5"
    spec = spec_for_spaces(*env_spaces(env_id))
    policy = _perturbed_policy(spec, seed=0)
    runner = PolicyRunner(spec, policy.numpy_state(), 0)
    vec = VecSampler(env_id, 3, seed=1)
    b = vec.sample(runner, 20, np.random.default_rng(0))
    vec.close()
    assert b["obs"].shape == (20, 3, 84, 84) and b["obs"].dtype == np.uint8 and list(np.flatnonzero(b["cut"])) \
        in ([6, 13], [6], [13], [])
    # The batched torch actor gives the numpy batch-1 actor's logits; the values are the torch critic's.
    out, _ = runner._heads_batch(b["obs"][:5], with_value=False)
    for o, row in zip(b["obs"][:5], out):
        np.testing.assert_allclose(row, runner._heads(o, with_value=False)[0], rtol=1e-4, atol=1e-4)
        with torch.no_grad():
            ref = policy.value(torch.as_tensor(o[None])).numpy()[0]
    np.testing.assert_allclose(b["values"][:5], policy.value(torch.as_tensor(b["obs"][:5])).detach().numpy(),
                               rtol=1e-4, atol=1e-4)
    assert np.isfinite(ref)
    with torch.no_grad():
        dist = policy.distribution(torch.as_tensor(b["obs"]))
        lp = dist.log_prob(torch.as_tensor(b["actions"])).numpy()
    np.testing.assert_allclose(b["logp"], lp, rtol=1e-4, atol=1e-4)


class SeparateCriticPass(PolicyRunner):
    """The VecSampler path before the fused CNN forward: the actor alone per step, then one critic pass."""

    def step_values(self, batch):
        return False


class RecordFinal(gym.Wrapper):
    """Keeps the final observation of every time-limit truncation."""

    def __init__(self, env):
        super().__init__(env)
        self.finals = []

    def step(self, action):
        ob, r, term, trunc, info = self.env.step(action)
        if trunc and not term:
            self.finals.append(np.array(ob))
        return ob, r, term, trunc, info


@pytest.mark.slow
def test_atari_vec_sampler_step_values_equal_the_separate_critic_pass():
    import torch

    env_id, kw = "ALE/Qbert-v5", {"max_episode_steps": 100}  # 100 frames = ~25 steps: real truncations
    spec = spec_for_spaces(*env_spaces(env_id))
    policy = _perturbed_policy(spec, seed=3)
    state = policy.numpy_state()
    fused, separate = PolicyRunner(spec, state, 0), SeparateCriticPass(spec, state, 0)
    n = 8  # the fewest envs that take the fused pass (FUSED_MIN_BATCH)
    assert fused.step_values(n) and not fused.step_values(n - 1) and not separate.step_values(n)
    vecs = [VecSampler(env_id, n, seed=2, env_kwargs=kw) for _ in range(2)]
    vecs[0].envs = [RecordFinal(e) for e in vecs[0].envs]
    rngs = [np.random.default_rng(4), np.random.default_rng(4)]
    trunc = cuts = 0
    for _ in range(2):  # the second call continues the episodes
        b, ref = (v.sample(r, 165, g) for v, r, g in zip(vecs, (fused, separate), rngs))  # 5 x 21 + 3 x 20 steps
        assert b.keys() == ref.keys()
        for k in ("obs", "actions", "rewards", "terminated", "truncated", "cut"):
            np.testing.assert_array_equal(b[k], ref[k], err_msg=k)
        assert b["episode_returns"] == ref["episode_returns"] and b["episode_lengths"] == ref["episode_lengths"]
        for k in ("logp", "values", "final_values"):
            assert b[k].dtype == np.float32
            np.testing.assert_allclose(b[k], ref[k], rtol=1e-5, atol=1e-5, err_msg=k)
        assert b["bootstrap_value"] == pytest.approx(ref["bootstrap_value"], rel=1e-5, abs=1e-5)
        with torch.no_grad():
            np.testing.assert_allclose(b["values"], policy.value(torch.as_tensor(b["obs"])).numpy(),
                                       rtol=1e-5, atol=1e-5)
        cuts += int(b["cut"].sum())
        # Independently of either path's bookkeeping: the numpy batch-1 critic on the recorded observations.
        for i, seg in enumerate(segments(b, n)):
            env, cut, fv = vecs[0].envs[i], b["cut"][seg], b["final_values"][seg]
            ends = b["terminated"][seg] | (b["truncated"][seg] & ~cut)
            rows = np.flatnonzero(b["truncated"][seg] & ~cut)
            assert len(rows) == len(env.finals)
            for row, final in zip(rows, env.finals):
                assert fv[row] == pytest.approx(fused.value(final), rel=1e-5, abs=1e-5)
            trunc += len(rows)
            env.finals.clear()
            if ends[-1]:  # nothing to bootstrap
                assert not cut[-1] and (i < n - 1 or b["bootstrap_value"] == 0.0)
                continue
            next_v = fused.value(vecs[0].obs[i])  # cut mid-episode: V(the env's next observation)
            if i < n - 1:
                assert cut[-1] and fv[-1] == pytest.approx(next_v, rel=1e-5, abs=1e-5)
            else:
                assert b["bootstrap_value"] == pytest.approx(next_v, rel=1e-5, abs=1e-5)
    assert trunc > 0 and cuts > 0 and np.abs(b["values"]).max() > 1e-2
    for v in vecs:
        v.close()


# -- plumbing: spec, scaler, handler ------------------------------------------------------------------

@pytest.mark.parametrize("bad", [0, -1, 257, 2.0, True, "4"])
def test_spec_rejects_bad_envs_per_actor_naming_the_field(bad):
    with pytest.raises(InvalidSpec) as err:
        validate(TrainingSpec(env_id=ENV, envs_per_actor=bad))
    assert err.value.field == "envs_per_actor" and "[1, 256]" in str(err.value)


def test_spec_round_trips_envs_per_actor():
    assert TrainingSpec().envs_per_actor == 1  # the single-env path stays the default (nitro.contracts)
    spec = validate(TrainingSpec(env_id=ENV, envs_per_actor=16))
    assert from_proto(to_proto(spec)).envs_per_actor == 16
    from nitro.client.sdk import spec_to_proto

    assert spec_to_proto({"env_id": ENV, "envs_per_actor": 4}).envs_per_actor == 4
    assert from_proto(spec_to_proto({"env_id": ENV})).envs_per_actor == TrainingSpec().envs_per_actor


class _Recorder:
    """Records the events the scaler would invoke (no environments run in this test)."""

    def __init__(self):
        self.events = []

    def invoke_all(self, function_name, invocations, deadline_s, on_done=None):
        from scaler_svc.invoker import InvocationOutcome

        self.events += [i.event for i in invocations]
        outs = [InvocationOutcome(i.invocation_id, ok=True, duration_ms=10.0, billed_ms=10, attempts=1,
                                  billed_attempts_ms=10, requests=1) for i in invocations]
        for o in outs:
            on_done(o)
        return outs, 0.001


def test_scaler_passes_envs_per_actor_to_the_event_and_rejects_bad_values_over_grpc(redis_client):
    from concurrent import futures

    from nitro import cost
    from nitro.v1 import scaler_pb2, scaler_pb2_grpc
    from scaler_svc.server import ScalerServicer

    rec = _Recorder()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    scaler_pb2_grpc.add_ActorScalerServicer_to_server(ScalerServicer(redis_client, rec, cost.Prices(), "redis://x",
                                                                     hmac_key=b"k" * 32), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = scaler_pb2_grpc.ActorScalerStub(ch)
            # Each launch its own round: the same invocation ids twice would be a retry (nitro.launches).
            base = dict(job_id="epa-job", policy_version=0, actors=2, steps_per_actor=512, env_id=ENV,
                        function_name="nitro-actor", deadline_s=10.0)
            stub.Launch(scaler_pb2.LaunchRequest(envs_per_actor=8, round=0, **base), timeout=10)
            assert [e["envs_per_actor"] for e in rec.events] == [8, 8]
            stub.Launch(scaler_pb2.LaunchRequest(envs_per_actor=200, round=1, **base), timeout=10)  # one env / 32 steps
            assert [e["envs_per_actor"] for e in rec.events[2:]] == [16, 16]
            stub.Launch(scaler_pb2.LaunchRequest(envs_per_actor=1, round=2, **base), timeout=10)  # 1: today's event
            stub.Launch(scaler_pb2.LaunchRequest(round=3, **base), timeout=10)
            stub.Launch(scaler_pb2.LaunchRequest(envs_per_actor=16, round=4, **{**base, "steps_per_actor": 32}),
                        timeout=10)
            assert len(rec.events) == 10 and all("envs_per_actor" not in e for e in rec.events[4:])
            for bad in (-1, 257):
                with pytest.raises(grpc.RpcError) as err:
                    stub.Launch(scaler_pb2.LaunchRequest(envs_per_actor=bad, round=5, **base), timeout=10)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "envs_per_actor" in err.value.details() and "[1, 256]" in err.value.details()
    finally:
        server.stop(None)


def _event(redis_server, hmac_key=b"k" * 32, **kw):
    e = {"job_id": "epa", "round": 0, "policy_version": 1, "env_id": "Hopper-v5", "num_steps": 200, "seed": 5,
         "invocation_id": "epa-r0-a1", "redis_url": redis_server.url, "reset_episodes": True}
    e.update(kw)
    with redis.Redis.from_url(redis_server.url) as client:
        return {**e, **grant(client, hmac_key, "epa", e["invocation_id"])}


def _read_one(redis_client, key):
    reader = TrajectoryReader(redis_client, "epa", key)
    entries = reader.read(count=10, block_ms=1000)
    reader.ack(entries)
    assert len(entries) == 1
    return entries[0].batch


def test_handler_one_env_is_todays_batch_and_n_envs_reach_the_stream(fresh_handler, redis_server, redis_client,
                                                                     hmac_key):
    spec = spec_for_spaces(*env_spaces("Hopper-v5"), obs_norm=True)
    policy = Policy(spec)
    PolicyStore(redis_client, "epa").put(1, policy_to_blob(policy, 1, read_key(hmac_key, "epa")))
    fresh_handler(_event(redis_server, hmac_key), None)
    today = _read_one(redis_client, hmac_key)
    fresh_handler(_event(redis_server, hmac_key, envs_per_actor=1, invocation_id="epa-r0-a2"), None)
    one = _read_one(redis_client, hmac_key)
    # What today's actor samples for this event, computed directly.
    runner = PolicyRunner.from_doc({"spec": spec, "state": policy.numpy_state(), "version": 1})
    direct = Sampler("Hopper-v5", seed=5)
    direct.reseed(5)
    ref = direct.sample(runner, 200, np.random.default_rng(5))
    direct.close()
    for k, v in ref.items():
        for got in (today, one):
            if isinstance(v, np.ndarray):
                assert got[k].tobytes() == v.tobytes(), k
            else:
                assert got[k] == v, k
    summary = fresh_handler(_event(redis_server, hmac_key, envs_per_actor=8, invocation_id="epa-r0-a3"), None)
    assert summary["ok"] and summary["steps"] == 200
    vb = _read_one(redis_client, hmac_key)
    assert len(vb["rewards"]) == 200 and vb["cut"].dtype == bool and vb["obs"].shape == (200, 11)
    np.testing.assert_array_equal(vb["obs"][0], ref["obs"][0])  # env 0 starts where the single env starts
    assert isinstance(handler_mod._Warm.sampler, VecSampler) and handler_mod._Warm.sampler.num_envs == 8


@pytest.mark.parametrize("bad", [0, 257, 201, -3, True, 2.5, "8"])
def test_handler_rejects_a_bad_envs_per_actor(fresh_handler, redis_server, bad):
    with pytest.raises(ConfigError, match=r"envs_per_actor.*\[1, 200\]"):
        fresh_handler(_event(redis_server, envs_per_actor=bad), None)


@pytest.mark.slow
def test_ppo_with_eight_envs_per_actor_still_solves_cartpole(one_thread):
    from nitro.config import ppo_config
    from tests.inprocess import train_ppo

    # Judged on training returns only: the deterministic evaluation (a third of the time) is skipped, and
    # skipping it leaves training unchanged (it has its own env and rng).
    result = train_ppo("CartPole-v1", ppo_config("fast"), actors=4, steps_per_actor=512, max_env_steps=100_000,
                       seed=0, eval_episodes=0, stop=lambda rec: rec.train_return >= 195, envs_per_actor=8)
    best = max(r.train_return for r in result.rounds)
    assert best >= 195, [(r.env_steps, round(r.train_return, 1)) for r in result.rounds]
