"""Atari: preprocessing, the paper's CNN (torch and the actors' numpy twin), the actor handler on an
ALE env with a real Redis, and stream entries at the size limit (compression, splitting, rejection)."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from nitro.data import codec
from nitro.data.batching import split_batch, wants_compression
from nitro.data.store import PolicyStore, TrajectoryReader, TrajectoryWriter
from nitro.policy import cpu_ops, inference
from nitro.policy.envs import env_spaces, make_env
from nitro.policy.inference import PolicyRunner
from nitro.policy.models import (
    AtariCNN,
    OneDNNAtariCNNs,
    Policy,
    atari_cnn_pair_forward,
    fuse_atari_cnns,
    policy_to_blob,
    spec_for_spaces,
)
from nitro.policy.rollout import Sampler
from tests.credentials import grant, read_key, signer

ENV = "ALE/Qbert-v5"
JOB = "atari-test"
INV = f"{JOB}-r0-a0"  # the actor invocation every batch below belongs to


@pytest.fixture(scope="module")
def spec():
    return spec_for_spaces(*env_spaces(ENV), obs_norm=True)  # obs_norm is ignored for image observations


@pytest.fixture(scope="module")
def policy(spec):
    torch.manual_seed(0)
    p = Policy(spec)
    with torch.no_grad():  # non-trivial weights so every ReLU path is exercised
        for t in p.parameters():
            t.add_(0.05 * torch.randn_like(t))
    return p


def test_preprocessing_grayscale_84_frame_skip_and_configurable_stack():
    env = make_env(ENV, seed=0)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3, 84, 84) and obs.dtype == np.uint8
    assert env.observation_space.shape == (3, 84, 84)
    env.close()
    env4 = make_env(ENV, seed=0, frame_stack=4, frame_skip=2)
    assert env4.observation_space.shape == (4, 84, 84)
    env4.close()


@pytest.mark.slow
def test_the_emulator_observation_fetched_as_grayscale_changes_nothing():
    # The default fetches grayscale, which the wrapper ignores; ending episodes on a lost life resets often.
    envs = [make_env(ENV, terminal_on_life_loss=True), make_env(ENV, terminal_on_life_loss=True, obs_type="rgb")]
    assert [e.unwrapped._obs_type for e in envs] == ["grayscale", "rgb"]
    first = [e.reset(seed=3)[0] for e in envs]
    np.testing.assert_array_equal(*first)
    ends = 0
    for a in np.random.default_rng(0).integers(0, envs[0].action_space.n, 200):
        (o1, r1, te1, tr1, _), (o2, r2, te2, tr2, _) = (e.step(int(a)) for e in envs)
        np.testing.assert_array_equal(o1, o2)
        assert (r1, te1, tr1) == (r2, te2, tr2)
        if te1 or tr1:
            ends += 1
            first = [e.reset()[0] for e in envs]
            np.testing.assert_array_equal(*first)
    assert ends >= 2
    for e in envs:
        e.close()


def test_cnn_forward_backward_shapes(spec, policy):
    assert spec.arch == "cnn" and spec.action_kind == "discrete" and not spec.obs_norm
    obs = torch.randint(0, 256, (5, 3, 84, 84), dtype=torch.uint8)
    dist = policy.distribution(obs)
    assert dist.logits.shape == (5, spec.action_dim)
    v = policy.value(obs)
    assert v.shape == (5,)
    (policy.log_prob(dist, torch.zeros(5, dtype=torch.long)).sum() + v.sum()).backward()
    for net in (policy.actor, policy.critic):
        assert net.conv1.weight.grad.shape == (16, 3, 8, 8)
        assert net.conv2.weight.grad.shape == (32, 16, 4, 4)
        assert net.conv3.weight.grad.shape == (256, 32, 11, 11)  # the 11x11 layer sees an 11x11 map
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
    policy.zero_grad(set_to_none=True)
    # The paper's three conv layers, with RLlib's "same" padding: 84 -> 21 -> 11 -> 1.
    cnn = AtariCNN((3, 84, 84), 6, 1.0)
    pad1, pad2, last = cnn.geometry
    h1 = cnn.conv1(torch.nn.functional.pad(torch.zeros(1, 3, 84, 84), pad1))
    assert h1.shape == (1, 16, 21, 21) and cnn.conv2(torch.nn.functional.pad(h1, pad2)).shape == (1, 32, 11, 11)
    assert last == (11, 11) and cnn(torch.zeros(2, 3, 84, 84, dtype=torch.uint8)).shape == (2, 6)


@pytest.mark.slow
def test_numpy_actor_matches_torch(spec, policy):
    runner = PolicyRunner(spec, policy.numpy_state(), 0)
    sampler = Sampler(ENV, seed=1)
    batch = sampler.sample(runner, 40, np.random.default_rng(0))
    sampler.close()
    obs = torch.as_tensor(batch["obs"])
    with torch.no_grad():
        dist = policy.distribution(obs)
        logp = policy.log_prob(dist, torch.as_tensor(batch["actions"])).numpy()
        values = policy.value(obs).numpy()
    np.testing.assert_allclose(batch["logp"], logp, atol=1e-4)
    np.testing.assert_allclose(batch["values"], values, atol=1e-4)  # computed batched after the rollout
    out, value = runner._heads(batch["obs"][7])
    log_softmax = out - np.log(np.exp(out - out.max()).sum()) - out.max()
    np.testing.assert_allclose(log_softmax, dist.logits[7].numpy(), atol=1e-4)
    assert abs(value - values[7]) < 1e-4 and abs(runner.value(batch["obs"][7]) - values[7]) < 1e-4
    assert batch["obs"].dtype == np.uint8 and wants_compression(batch)


@pytest.mark.parametrize("obs_shape", [(3, 84, 84), (4, 84, 84), (2, 61, 50)])  # last: asymmetric "same" pads
def test_fused_actor_critic_forward_equals_the_two_networks(obs_shape):
    spec = spec_for_spaces(gym.spaces.Box(0, 255, obs_shape, np.uint8), gym.spaces.Discrete(7))
    torch.manual_seed(1)
    policy = Policy(spec)
    with torch.no_grad():  # non-trivial weights so every ReLU path is exercised
        for t in policy.parameters():
            t.add_(0.05 * torch.randn_like(t))
    obs = np.random.default_rng(2).integers(0, 256, (9, *obs_shape), dtype=np.uint8)
    x = torch.from_numpy(obs)
    with torch.no_grad():
        logits_ref, values_ref = policy.actor(x).numpy(), policy.value(x).numpy()
        fused = fuse_atari_cnns(dict(policy.actor.named_parameters()), dict(policy.critic.named_parameters()))
        logits, values = atari_cnn_pair_forward(x, fused, policy.actor.geometry)
    assert logits.shape == (9, 7) and values.shape == (9, 1)
    assert np.abs(values_ref).max() > 1e-2 and np.abs(logits_ref).max() > 1e-3  # not all-zero outputs
    np.testing.assert_allclose(logits.numpy(), logits_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(values[:, 0].numpy(), values_ref, rtol=1e-5, atol=1e-5)
    # The actor's runner: act_batch's values come from the fused pass, its logits equal the actor-only pass.
    runner = PolicyRunner(spec, policy.numpy_state(), 0)
    assert runner.step_values(8) and runner.step_values(32) and not runner.step_values(4)
    out_v, v = runner._heads_batch(obs, with_value=True)
    out_a, zeros = runner._heads_batch(obs, with_value=False)
    np.testing.assert_allclose(out_v, logits_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out_a, logits_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(v, values_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(runner.value_batch(obs), values_ref, rtol=1e-5, atol=1e-5)
    assert v.dtype == np.float32 and not zeros.any()
    a1, lp1, v1 = runner.act_batch(obs, np.random.default_rng(5))
    a0, lp0, _ = runner.act_batch(obs, np.random.default_rng(5), with_value=False)
    np.testing.assert_array_equal(a1, a0)  # same rng, same actions
    np.testing.assert_allclose(lp1, lp0, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(v1, v)


@pytest.mark.skipif(not OneDNNAtariCNNs.available(), reason="oneDNN's prepacked ops are not in this torch build")
@pytest.mark.parametrize("obs_shape", [(3, 84, 84), (3, 84, 82), (2, 61, 50)])  # layer-1 pads: even; 2 vs 3; uneven
def test_prepacked_forward_equals_the_networks_at_any_row_count(obs_shape):
    spec = spec_for_spaces(gym.spaces.Box(0, 255, obs_shape, np.uint8), gym.spaces.Discrete(5))
    torch.manual_seed(3)
    policy = Policy(spec)
    with torch.no_grad():
        for t in policy.parameters():
            t.add_(0.05 * torch.randn_like(t))
    nets = [dict(policy.actor.named_parameters()), dict(policy.critic.named_parameters())]
    geometry = policy.actor.geometry
    pair, actor = OneDNNAtariCNNs(nets, geometry, batch=16), OneDNNAtariCNNs(nets[:1], geometry, batch=16)
    obs = torch.from_numpy(np.random.default_rng(4).integers(0, 256, (16, *obs_shape), dtype=np.uint8))
    for rows in (16, 9, 1):  # packed for 16 rows; the last lockstep step and batch 1 run fewer
        x = obs[:rows]
        with torch.no_grad():
            logits_ref, values_ref = policy.actor(x), policy.critic(x)
            (logits, values), (alone,) = pair(x), actor(x)
        assert logits.shape == (rows, 5) and values.shape == (rows, 1) and float(values_ref.abs().max()) > 1e-2
        torch.testing.assert_close(logits, logits_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(values, values_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(alone, logits_ref, rtol=1e-5, atol=1e-5)


def test_runner_prepacks_once_per_version_and_falls_back_without_onednn(monkeypatch):
    spec = spec_for_spaces(gym.spaces.Box(0, 255, (3, 84, 84), np.uint8), gym.spaces.Discrete(4))
    torch.manual_seed(5)
    policy = Policy(spec)
    obs = np.random.default_rng(6).integers(0, 256, (8, 3, 84, 84), dtype=np.uint8)
    with torch.no_grad():
        x = torch.from_numpy(obs)
        logits_ref, values_ref = policy.actor(x).numpy(), policy.value(x).numpy()
    packed = PolicyRunner(spec, policy.numpy_state(), 0)
    out, v = packed._heads_batch(obs, with_value=True)
    built = packed._packed_cnn(("actor", "critic"), 8)
    assert (built is not None) == OneDNNAtariCNNs.available()
    packed._heads_batch(obs[:3], with_value=True)
    assert packed._packed_cnn(("actor", "critic"), 3) is built  # cached per runner, whatever the row count
    np.testing.assert_allclose(packed.value_batch(obs), values_ref, rtol=1e-5, atol=1e-5)  # the critic alone
    monkeypatch.setattr(cpu_ops, "ENABLED", False)  # NITRO_CPU_OPS=0: the dense-weight torch forward
    dense = PolicyRunner(spec, policy.numpy_state(), 0)
    out_d, v_d = dense._heads_batch(obs, with_value=True)
    assert dense._packed_cnn(("actor", "critic"), 8) is None
    for o, val in ((out, v), (out_d, v_d)):
        np.testing.assert_allclose(o, logits_ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(val, values_ref, rtol=1e-5, atol=1e-5)


def test_a_prepacked_forward_that_fails_on_this_cpu_falls_back_to_the_dense_one(monkeypatch, caplog):
    """A kernel the CPU lacks fails at the first call: that call and every later one take the dense forward."""
    spec = spec_for_spaces(gym.spaces.Box(0, 255, (3, 84, 84), np.uint8), gym.spaces.Discrete(4))
    policy = Policy(spec)
    obs = np.random.default_rng(7).integers(0, 256, (8, 3, 84, 84), dtype=np.uint8)

    def unsupported(self, x):
        raise RuntimeError("could not create a primitive")

    monkeypatch.setattr(OneDNNAtariCNNs, "available", staticmethod(lambda: True))
    monkeypatch.setattr(OneDNNAtariCNNs, "__call__", unsupported)
    monkeypatch.setattr(inference, "_packed_failed", False)  # restored afterwards: the flag is process-wide
    runner = PolicyRunner(spec, policy.numpy_state(), 0)
    out, v = runner._heads_batch(obs, with_value=True)
    assert runner._packed_cnn(("actor", "critic"), 8) is None and "dense forward" in caplog.text
    with torch.no_grad():
        np.testing.assert_allclose(v, policy.value(torch.from_numpy(obs)).numpy(), rtol=1e-5, atol=1e-5)
    caplog.clear()  # the next policy version neither rebuilds nor warns again
    later = PolicyRunner(spec, policy.numpy_state(), 1)
    later._heads_batch(obs, with_value=True)
    assert inference._packed_failed and later._packed_cnn(("actor", "critic"), 8) is None and not caplog.text


def event(redis_client, redis_server, hmac_key, **kw):
    e = {"job_id": JOB, "round": 0, "policy_version": 1, "env_id": ENV, "num_steps": 64, "seed": 3,
         "invocation_id": INV, "redis_url": redis_server.url}
    e.update(kw)
    return {**e, **grant(redis_client, hmac_key, JOB, e["invocation_id"])}


@pytest.mark.slow
def test_handler_samples_an_ale_env_into_a_compressed_signed_batch(fresh_handler, redis_server, redis_client,
                                                                    hmac_key, policy):
    PolicyStore(redis_client, JOB).put(1, policy_to_blob(policy, 1, read_key(hmac_key, JOB)))
    summary = fresh_handler(event(redis_client, redis_server, hmac_key), None)
    assert summary["ok"] and summary["steps"] == 64 and summary["entries"] == 1
    raw = redis_client.xrange(f"nitro:{JOB}:traj")[0][1][b"payload"]
    assert raw[4] & 0x01  # envelope flag: zlib, switched on automatically for uint8 frames
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    (entry,) = reader.read(count=10, block_ms=1000)
    batch = entry.batch
    assert len(raw) < batch["obs"].nbytes / 2  # frames compress well
    assert batch["obs"].shape == (64, 3, 84, 84) and batch["obs"].dtype == np.uint8
    assert batch["actions"].dtype == np.int64 and batch["actions"].max() < policy.spec.action_dim
    for name in ("rewards", "terminated", "truncated", "logp", "values", "final_values"):
        assert len(batch[name]) == 64, name
    assert (entry.part, entry.parts, entry.dedup_id) == (0, 1, INV)
    reader.ack([entry])


@pytest.mark.slow
def test_handler_splits_a_batch_above_the_entry_cap(fresh_handler, redis_server, redis_client, hmac_key, policy):
    PolicyStore(redis_client, JOB).put(1, policy_to_blob(policy, 1, read_key(hmac_key, JOB)))
    summary = fresh_handler(event(redis_client, redis_server, hmac_key, num_steps=48, compress=False, max_entry_bytes=400_000), None)
    assert summary["entries"] >= 3  # 48 x 21168 bytes of frames, at most 400 kB per entry
    reader = TrajectoryReader(redis_client, JOB, hmac_key)
    entries = reader.read(count=10, block_ms=1000)
    assert len(entries) == summary["entries"] and sum(e.steps for e in entries) == 48
    assert sorted(e.part for e in entries) == list(range(entries[0].parts))
    assert len({e.dedup_id for e in entries}) == len(entries)
    with pytest.raises(Exception, match="max_entry_bytes"):
        fresh_handler(event(redis_client, redis_server, hmac_key, max_entry_bytes="big"), None)


# -- stream entries at the limit -----------------------------------------------------------


def fake_batch(n=40, seed=0):
    rng = np.random.default_rng(seed)
    term = np.isin(np.arange(n), [9, 25])
    trunc = np.arange(n) == 31
    return {"obs": rng.integers(0, 256, (n, 3, 84, 84), dtype=np.uint8), "actions": rng.integers(0, 6, n),
            "rewards": rng.normal(size=n).astype(np.float32), "terminated": term, "truncated": trunc,
            "logp": rng.normal(size=n).astype(np.float32), "values": rng.normal(size=n).astype(np.float32),
            "final_values": np.where(trunc, 1.5, 0.0).astype(np.float32), "bootstrap_value": 0.7,
            "episode_returns": [1.0, 2.0, 3.0][:int((term | trunc).sum())],
            "episode_lengths": [10, 16, 6][:int((term | trunc).sum())], "policy_version": 2,
            "invocation_id": INV}


def encoded_size(batch, key, compress=False):
    return len(codec.encode((INV, 0, 2, len(batch["rewards"]), batch), key, compress=compress))


def read_all(client, key, **kw):
    reader = TrajectoryReader(client, JOB, key, **kw)
    entries = reader.read(count=100, block_ms=500)
    reader.ack(entries)
    return reader, sorted(entries, key=lambda e: e.part)


def test_batch_exactly_at_the_cap_is_one_entry(redis_client, hmac_key):
    batch = fake_batch()
    size = encoded_size(batch, hmac_key)
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB), max_entry_bytes=size)
    assert len(writer.append_batch(invocation_id=INV, round=0, policy_version=2, batch=batch,
                                   compress=False)) == 1
    _, (entry,) = read_all(redis_client, hmac_key)
    assert entry.parts == 1 and np.array_equal(entry.batch["obs"], batch["obs"])


def test_batch_one_byte_above_the_cap_is_split_and_round_trips(redis_client, hmac_key):
    batch = fake_batch()
    size = encoded_size(batch, hmac_key)
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB), max_entry_bytes=size - 1)
    ids = writer.append_batch(invocation_id=INV, round=0, policy_version=2, batch=batch, compress=False)
    assert len(ids) >= 2
    assert all(len(f[b"payload"]) <= size - 1 for _, f in redis_client.xrange(f"nitro:{JOB}:traj"))
    _, entries = read_all(redis_client, hmac_key)
    assert [e.part for e in entries] == list(range(len(ids))) and {e.parts for e in entries} == {len(ids)}
    parts = [e.batch for e in entries]
    for name in ("obs", "actions", "rewards", "terminated", "truncated", "logp", "values", "final_values"):
        assert np.array_equal(np.concatenate([p[name] for p in parts]), batch[name]), name
    assert sum((p["episode_returns"] for p in parts), []) == batch["episode_returns"]
    assert parts[-1]["bootstrap_value"] == 0.7
    for p, nxt in zip(parts[:-1], parts[1:]):  # a mid-episode cut bootstraps from the next part's first value
        ended = p["terminated"][-1] or p["truncated"][-1]
        assert p["bootstrap_value"] == (0.0 if ended else float(nxt["values"][0]))
    assert all(p["policy_version"] == 2 and p["invocation_id"] == INV for p in parts)
    assert sum(e.steps for e in entries) == 40


def test_compression_keeps_an_atari_like_batch_in_one_entry(redis_client, hmac_key):
    batch = fake_batch()
    frames = np.zeros((40, 3, 84, 84), np.uint8)  # flat backgrounds and a few sprites, like real screens
    for t in range(40):
        frames[t, :, 20 + t % 30:30 + t % 30, 40:48] = 200
        frames[t, :, 70:84, :] = 90
    batch["obs"] = frames
    raw = encoded_size(batch, hmac_key)
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB), max_entry_bytes=raw // 4)
    assert len(writer.append_batch(invocation_id=INV, round=0, policy_version=2, batch=batch)) == 1  # auto
    _, (entry,) = read_all(redis_client, hmac_key)
    assert np.array_equal(entry.batch["obs"], batch["obs"])


def test_entries_above_the_readers_max_are_rejected(redis_client, hmac_key):
    batch = fake_batch()
    size = encoded_size(batch, hmac_key)
    TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB), max_entry_bytes=size).append_batch(
        invocation_id=INV, round=0, policy_version=2, batch=batch, compress=False)
    reader, entries = read_all(redis_client, hmac_key, max_payload_bytes=size - 1)
    assert entries == [] and reader.rejected["too_large"] == 1
    assert redis_client.xlen(f"nitro:{JOB}:traj") == 0  # dropped, not left pending


def test_a_single_step_above_the_cap_cannot_be_split(redis_client, hmac_key):
    with pytest.raises(codec.PayloadTooLargeError, match="one step"):
        TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB), max_entry_bytes=10_000).append_batch(
            invocation_id=INV, round=0, policy_version=2, batch=fake_batch(4), compress=False)
    with pytest.raises(ValueError, match="proto-max-bulk-len"):
        TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB), max_entry_bytes=(512 << 20) + 1)


def test_relabelled_part_is_rejected_and_duplicate_parts_dropped(redis_client, hmac_key):
    batch = fake_batch()
    writer = TrajectoryWriter(redis_client, JOB, signer(hmac_key, JOB), max_entry_bytes=encoded_size(batch, hmac_key) // 2)
    ids = writer.append_batch(invocation_id=INV, round=0, policy_version=2, batch=batch, compress=False)
    redis_client.xadd(f"nitro:{JOB}:traj", {**redis_client.xrange(f"nitro:{JOB}:traj")[0][1], b"part": b"1"})
    writer.append_batch(invocation_id=INV, round=0, policy_version=2, batch=batch, compress=False)  # a retry
    reader, entries = read_all(redis_client, hmac_key)
    assert len(entries) == len(ids) and reader.rejected["bad_signature"] == 1 and reader.duplicates == len(ids)


def test_split_batch_validates_part_count():
    with pytest.raises(ValueError):
        split_batch(fake_batch(3), 4)
    assert split_batch(fake_batch(3), 1)[0]["rewards"].shape == (3,)
