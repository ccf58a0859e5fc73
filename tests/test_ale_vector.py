"""Atari actors on ALE's C++ vector env (nitro.policy.ale_vector) against the VecSampler on make_env's envs.

With no-op starts off (noop_max=0) both backends are deterministic for the same seeds and actions, so the
batches must be identical, through terminations, frame-limit truncations, segment cuts and warm continuation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import actor_fn.handler as handler_mod
from nitro.data.store import PolicyStore, TrajectoryReader
from nitro.policy.ale_vector import ENABLE_VAR, ALEVecSampler
from nitro.policy.envs import ale_vector_kwargs, env_spaces, make_env
from nitro.policy.inference import PolicyRunner
from nitro.policy.models import Policy, policy_to_blob, spec_for_spaces
from nitro.policy.rollout import Sampler, VecSampler, make_sampler

# Berzerk under a near-uniform policy ends episodes in ~140-230 steps; a limit of 800 frames cuts them at 200
# steps, so a few hundred steps per env see both terminations and truncations. (gym.make's max_episode_steps,
# which counts frames from the end of the reset as the vector env does; see nitro.policy.envs.ale_vector_kwargs.)
BERZERK, BERZERK_KW = "ALE/Berzerk-v5", {"noop_max": 0, "max_episode_steps": 800}


def runner_for(env_id: str, kw: dict | None = None, seed: int = 0, **runner_kw) -> PolicyRunner:
    spec = spec_for_spaces(*env_spaces(env_id, **(kw or {})))
    torch.manual_seed(seed)
    return PolicyRunner(spec, Policy(spec).numpy_state(), 0, **runner_kw)


def assert_same_batch(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k, v in want.items():
        if isinstance(v, np.ndarray):
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            np.testing.assert_array_equal(got[k], v, err_msg=k)
        else:
            assert got[k] == v, k


def test_vector_kwargs_carry_make_envs_preprocessing():
    kw = ale_vector_kwargs("ALE/Qbert-v5")
    assert kw == {"game": "qbert", "frameskip": 4, "stack_num": 3, "img_height": 84, "img_width": 84,
                  "noop_max": 30, "grayscale": True, "maxpool": True, "repeat_action_probability": 0.0,
                  "episodic_life": False, "reward_clipping": False, "use_fire_reset": False,
                  "full_action_space": False, "max_num_frames_per_episode": 108_000}
    kw = ale_vector_kwargs("ALE/SpaceInvaders-v5", {"frame_stack": 4, "frame_skip": 3, "screen_size": 64,
                                                     "noop_max": 0, "max_episode_steps": 500,
                                                     "full_action_space": True, "obs_type": "rgb"})
    assert kw["game"] == "space_invaders" and (kw["stack_num"], kw["frameskip"], kw["noop_max"]) == (4, 3, 0)
    assert (kw["img_height"], kw["img_width"], kw["full_action_space"]) == (64, 64, True)
    assert kw["max_num_frames_per_episode"] == 500  # the smaller of the two frame limits
    assert ale_vector_kwargs("QbertNoFrameskip-v4")["game"] == "qbert"


@pytest.mark.parametrize("env_id,kw", [
    ("Hopper-v5", None),
    ("ALE/Qbert-v5", {"terminal_on_life_loss": True}),
    ("ALE/Qbert-v5", {"mode": 0}),
    ("ALE/Qbert-v5", {"difficulty": 1}),
    ("ALE/Qbert-v5", {"obs_type": "ram"}),
    ("ALE/Qbert-v5", {"frame_skip": 4.0}),
    ("ALE/Qbert-v5", {"max_episode_steps": 0}),
    ("ALE/Qbert-v5", {"max_num_frames_per_episode": True}),
    ("ALE/Qbert-v5", {"noop_max": -1}),
])
def test_settings_the_vector_env_cannot_reproduce_keep_the_python_envs(env_id, kw):
    assert ale_vector_kwargs(env_id, kw) is None
    if env_id.startswith("ALE/") and kw.keys() <= {"terminal_on_life_loss", "mode"}:
        sampler = make_sampler(env_id, 0, kw, 2)
        assert type(sampler) is VecSampler
        sampler.close()


def test_make_sampler_takes_the_vector_env_for_atari_and_can_be_switched_off(monkeypatch):
    one, many = make_sampler("ALE/Qbert-v5", 0, None, 1), make_sampler("ALE/Qbert-v5", 0, None, 4)
    assert type(one) is Sampler and type(many) is ALEVecSampler and many.num_envs == 4
    assert many.obs.shape == (4, 3, 84, 84) and many.obs.dtype == np.uint8
    assert many.observation_space == one.env.observation_space and many.action_space == one.env.action_space
    monkeypatch.setenv(ENABLE_VAR, "0")
    off = make_sampler("ALE/Qbert-v5", 0, None, 4)
    assert type(off) is VecSampler
    for s in (one, many, off):
        s.close()
    with pytest.raises(ValueError, match="envs_per_actor"):
        ALEVecSampler("ALE/Qbert-v5", 0)


@pytest.mark.parametrize("n_envs,steps,runner_kw", [
    (4, 800, {}),  # below FUSED_MIN_BATCH: the critic over the rollout afterwards
    (8, 1600, {}),  # the fused per-step actor-critic pass
    (4, 800, {"behaviour_values": False}),  # an IMPACT job's actors
])
def test_batches_equal_the_python_envs_through_episode_ends(n_envs, steps, runner_kw):
    runner = runner_for(BERZERK, BERZERK_KW, **runner_kw)
    vector, python = ALEVecSampler(BERZERK, n_envs, seed=3, env_kwargs=BERZERK_KW), \
        VecSampler(BERZERK, n_envs, seed=3, env_kwargs=BERZERK_KW)
    rngs = np.random.default_rng(1), np.random.default_rng(1)
    terminated = truncated = 0
    for _ in range(2):  # the second call continues the episodes
        got, want = (s.sample(runner, steps, g) for s, g in zip((vector, python), rngs))
        assert_same_batch(got, want)
        terminated += int(got["terminated"].sum())
        truncated += int((got["truncated"] & ~got["cut"]).sum())
    assert terminated >= 2 and truncated >= 2  # both kinds of episode end were compared
    vector.close()
    python.close()


def test_uneven_steps_record_the_same_rows_and_leave_the_extra_step_out():
    """30 steps over 4 envs: envs 2 and 3 take the last lockstep step unrecorded. The Python envs stepping
    32 (every env 8) draw the same actions, so the batch is theirs less those two rows, the two segments cut
    where the rows were; an episode that ended at such a step is still listed, and both samplers are then in
    the same state. 768 = 4 x 192 steps first puts each env's 200th step, its frame-limit truncation, last."""
    env_id, kw = "ALE/Pong-v5", {"noop_max": 0, "max_episode_steps": 800}  # Pong lasts; 200-step limit
    runner = runner_for(env_id, kw, seed=1)
    vector, python = ALEVecSampler(env_id, 4, seed=5, env_kwargs=kw), VecSampler(env_id, 4, seed=5, env_kwargs=kw)
    rngs = np.random.default_rng(2), np.random.default_rng(2)
    got, want = (s.sample(runner, 768, g) for s, g in zip((vector, python), rngs))
    assert_same_batch(got, want)

    got, want = vector.sample(runner, 30, rngs[0]), python.sample(runner, 32, rngs[1])
    removed = [2 * 8 + 7, 3 * 8 + 7]  # env 2's and env 3's 8th step
    assert want["truncated"][removed].all() and not want["cut"][removed].any()  # each ended at its limit
    keep = np.setdiff1d(np.arange(32), removed)
    for k in ("obs", "actions", "rewards", "logp", "terminated"):
        np.testing.assert_array_equal(got[k], want[k][keep], err_msg=k)
    np.testing.assert_allclose(got["values"], want["values"][keep], rtol=1e-5, atol=1e-6)
    # Env 2's segment (rows 16-22 of 30) is cut where the left-out step starts, bootstrapped from that
    # observation's value; env 3's is the batch's last, so that value is the batch's bootstrap.
    expect_trunc, expect_cut = want["truncated"][keep].copy(), want["cut"][keep].copy()
    expect_trunc[22] = expect_cut[22] = True
    np.testing.assert_array_equal(got["truncated"], expect_trunc)
    np.testing.assert_array_equal(got["cut"], expect_cut)
    final = want["final_values"][keep].copy()
    final[22] = want["values"][23]
    np.testing.assert_allclose(got["final_values"], final, rtol=1e-5, atol=1e-6)
    assert got["bootstrap_value"] == pytest.approx(float(want["values"][31]), rel=1e-5, abs=1e-6)
    assert want["bootstrap_value"] == 0.0 and not got["terminated"][-1] and not got["truncated"][-1]
    # The four episodes ended at their 200th step, two of them at a left-out step: all listed, in env order.
    assert got["episode_returns"] == want["episode_returns"] and len(got["episode_returns"]) == 4
    assert got["episode_lengths"] == want["episode_lengths"] == [200] * 4

    got, want = vector.sample(runner, 64, rngs[0]), python.sample(runner, 64, rngs[1])
    assert_same_batch(got, want)  # fresh episodes everywhere: the same state again
    vector.close()
    python.close()


def test_seeds_reproduce_the_run_and_reseed_restarts_it():
    runner = runner_for("ALE/Qbert-v5")
    batches = []
    for seed in (11, 11, 12):  # no-op starts on (noop_max 30): the seed decides them
        s = make_sampler("ALE/Qbert-v5", seed, None, 4)
        batches.append(s.sample(runner, 64, np.random.default_rng(0)))
        if seed == 12:
            s.reseed(11)
            batches.append(s.sample(runner, 64, np.random.default_rng(0)))
        s.close()
    assert_same_batch(batches[1], batches[0])
    assert_same_batch(batches[3], batches[0])
    assert not np.array_equal(batches[2]["obs"], batches[0]["obs"])
    # Without a seed, each sampler draws its own no-op starts.
    unseeded = [make_sampler("ALE/Qbert-v5", None, None, 8) for _ in range(2)]
    assert not np.array_equal(unseeded[0].obs, unseeded[1].obs)
    for s in unseeded:
        s.close()


def test_a_box_policy_is_refused_with_a_clear_error():
    spec = spec_for_spaces(*env_spaces("Pendulum-v1"))
    runner = PolicyRunner(spec, Policy(spec).numpy_state(), 0)
    sampler = ALEVecSampler("ALE/Qbert-v5", 2, seed=0)
    with pytest.raises(ValueError, match="discrete actions"):
        sampler.sample(runner, 8, np.random.default_rng(0))
    sampler.close()


def test_make_env_stacks_zeros_before_the_first_frame():
    obs, _ = make_env("ALE/Qbert-v5", noop_max=0).reset(seed=0)
    assert obs.shape == (3, 84, 84) and not obs[:2].any() and obs[2].any()
    vec = ALEVecSampler("ALE/Qbert-v5", 2, seed=0, env_kwargs={"noop_max": 0})
    np.testing.assert_array_equal(vec.obs[0], obs)
    vec.close()


def test_the_actor_handler_samples_atari_on_the_vector_env(fresh_handler, redis_server, redis_client, hmac_key):
    spec = spec_for_spaces(*env_spaces("ALE/Qbert-v5"))
    PolicyStore(redis_client, "alev").put(1, policy_to_blob(Policy(spec), 1, hmac_key))
    event = {"job_id": "alev", "round": 0, "policy_version": 1, "env_id": "ALE/Qbert-v5", "num_steps": 64,
             "seed": 5, "invocation_id": "alev-1", "redis_url": redis_server.url, "reset_episodes": True,
             "envs_per_actor": 4}
    summary = fresh_handler(event, None)
    assert summary["ok"] and summary["steps"] == 64
    assert isinstance(handler_mod._Warm.sampler, ALEVecSampler) and handler_mod._Warm.sampler.num_envs == 4
    reader = TrajectoryReader(redis_client, "alev", hmac_key)
    entries = reader.read(count=10, block_ms=1000)
    reader.ack(entries)
    batch = entries[0].batch
    assert len(entries) == 1 and batch["obs"].shape == (64, 3, 84, 84) and batch["cut"][[15, 31, 47]].all()
