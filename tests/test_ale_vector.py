"""Atari actors on ALE's C++ vector env (nitro.policy.ale_vector) against the VecSampler on make_env's envs.

With no-op starts off (noop_max=0) both backends are deterministic for the same seeds and actions, so the
batches must be identical, through terminations, frame-limit truncations, segment cuts and warm continuation.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import actor_fn.handler as handler_mod
from nitro.data.batching import split_batch
from nitro.data.store import PolicyStore, TrajectoryReader, TrajectoryWriter
from nitro.policy.ale_vector import ENABLE_VAR, ALEVecSampler
from nitro.policy.envs import ale_vector_kwargs, env_spaces, make_env, resolve_env_id
from nitro.policy.inference import PolicyRunner
from nitro.policy.models import Policy, policy_to_blob, spec_for_spaces
from nitro.policy.rollout import Sampler, VecSampler, env_seed, make_sampler
from tests.credentials import grant, read_key, signer

# Berzerk under a near-uniform policy ends episodes in ~140-230 steps; a limit of 800 frames cuts them at 200
# steps, so a few hundred steps per env see both terminations and truncations. (gym.make's max_episode_steps:
# with no no-ops it counts frames from the end of the reset, as the vector env does, where the ALE env's own
# max_num_frames_per_episode counts Berzerk's start-up frames too; nitro.policy.envs.ale_vector_kwargs.)
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
    ("ALE/Qbert-v5", {"noop_max": 1}),  # make_env: always one no-op; the vector env: never
    ("ALE/QbertModeForTests-v5", None),  # registered with a mode of its own
])
def test_settings_the_vector_env_cannot_reproduce_keep_the_python_envs(env_id, kw):
    registered = env_id == "ALE/QbertModeForTests-v5"
    if registered:
        resolve_env_id("ALE/Qbert-v5")  # registers ale_py's ids (and its entry point)
        gym.register(env_id, entry_point="ale_py.env:AtariEnv", kwargs={"game": "qbert", "mode": 0})
    try:
        assert ale_vector_kwargs(env_id, kw) is None
        if env_id.startswith("ALE/") and (kw or {}).keys() <= {"terminal_on_life_loss", "mode"}:
            sampler = make_sampler(env_id, 0, kw, 2)
            assert type(sampler) is VecSampler
            sampler.close()
    finally:
        if registered:
            gym.registry.pop(env_id)


@pytest.mark.slow
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


@pytest.mark.slow
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


def expected_uneven(want: dict, n_envs: int, runner: PolicyRunner) -> dict:
    """What the vector env's (8 n - 2)-step batch must be, from the Python envs' 8 n-step batch with the same
    actions: that batch less the 8th step of the last two envs, whose segments end one step earlier. The
    second-to-last env's segment is cut there, bootstrapped from V(the left-out step's observation); the last
    env's is the batch's end, so that value is the bootstrap. An episode that ended at a left-out step stays
    listed, at its env's last row."""
    removed = [(n_envs - 2) * 8 + 7, (n_envs - 1) * 8 + 7]
    keep = np.setdiff1d(np.arange(8 * n_envs), removed)
    lean = ("final_obs", "bootstrap_obs")  # a batch without values: the observations of its bootstrap values
    out = {k: (v[keep] if isinstance(v, np.ndarray) and k not in lean else v) for k, v in want.items()}
    if "final_obs" in want:  # by row; the left-out steps' truncations go, the cut's observation comes
        final_of = {int(r): o for r, o in zip(np.flatnonzero(want["truncated"]), want["final_obs"]) if r not in removed}
        final_of[removed[0] - 1] = want["obs"][removed[0]]
        out["final_obs"] = np.stack([final_of[r] for r in sorted(final_of)])
        out["bootstrap_obs"] = want["obs"][removed[1]]
    v_removed = runner.value_batch(want["obs"][removed])
    cut_row = (n_envs - 2) * 8 + 6
    out["truncated"], out["cut"], out["final_values"] = out["truncated"].copy(), out["cut"].copy(), \
        out["final_values"].copy()
    out["truncated"][cut_row] = out["cut"][cut_row] = True
    out["final_values"][cut_row] = v_removed[0]
    out["bootstrap_value"] = float(v_removed[1])
    done = want["terminated"] | (want["truncated"] & ~want["cut"])
    rows = [int(r) for r in np.flatnonzero(done)]
    position = {r: i for i, r in enumerate(keep)}
    if set(rows) & set(removed):
        out["episode_rows"] = [position[r] if r in position else position[r - 1] for r in rows]
    return out


def assert_batch_close(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k, v in want.items():
        if k in ("values", "final_values", "bootstrap_value"):  # the same critic in other batch compositions
            np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
        elif isinstance(v, np.ndarray):
            np.testing.assert_array_equal(got[k], v, err_msg=k)
        else:
            assert got[k] == v, k


@pytest.mark.slow
@pytest.mark.parametrize("n_envs,runner_kw", [(4, {}), (8, {}), (4, {"behaviour_values": False})])
def test_uneven_steps_record_the_same_rows_and_leave_the_extra_step_out(n_envs, runner_kw, redis_client, hmac_key):
    """8 n - 2 steps over n envs: the last two envs take the last lockstep step unrecorded. The Python envs
    stepping 8 n (every env 8) draw the same actions, so both samplers end each call in the same state, and the
    vector env's batch follows from theirs (expected_uneven). 192 n steps first put each env's 200th step, its
    time-limit truncation, at the left-out step; later an uneven call leaves out a step mid-episode."""
    env_id, kw = "ALE/Pong-v5", {"noop_max": 0, "max_episode_steps": 800}  # Pong lasts; 200-step limit
    runner = runner_for(env_id, kw, seed=1, **runner_kw)
    vector, python = ALEVecSampler(env_id, n_envs, seed=5, env_kwargs=kw), \
        VecSampler(env_id, n_envs, seed=5, env_kwargs=kw)
    rngs = np.random.default_rng(2), np.random.default_rng(2)
    for call, per_env in enumerate((192, 8, 16, 8, 16)):
        uneven = per_env == 8
        steps = per_env * n_envs
        got, want = vector.sample(runner, steps - 2 * uneven, rngs[0]), python.sample(runner, steps, rngs[1])
        if not uneven:
            assert_same_batch(got, want)
            continue
        assert_batch_close(got, expected_uneven(want, n_envs, runner))
        if call == 1:  # every env's steps 193-200: all episodes end at their 200th step
            assert got["episode_lengths"] == [200] * n_envs and got["episode_rows"][-2:] == \
                [(n_envs - 2) * 8 + 6, 8 * n_envs - 3]
            # Split, each part lists the episodes that ended in it, those at a left-out step included; also
            # through the stream, where a batch above max_entry_bytes goes as signed parts.
            parts = split_batch(got, 3, value_of=runner.value_batch)
            job = f"uneven{n_envs}"
            writer = TrajectoryWriter(redis_client, job, signer(hmac_key, job), max_entry_bytes=250_000)
            writer.append_batch(invocation_id=f"{job}-r0-a1", round=0, policy_version=0, batch=got, compress=False,
                                value_of=runner.value_batch)
            reader = TrajectoryReader(redis_client, f"uneven{n_envs}", hmac_key)
            streamed = [e.batch for e in reader.read(count=10, block_ms=1000)]
            assert len(streamed) >= 3
            for split in (parts, streamed):
                for k in ("episode_returns", "episode_lengths"):
                    assert sum((p[k] for p in split), []) == got[k], k
                starts = np.cumsum([0] + [len(p["rewards"]) for p in split[:-1]])
                for p, start in zip(split, starts):
                    assert [r + start for r in p["episode_rows"]] == \
                        [r for r in got["episode_rows"] if start <= r < start + len(p["rewards"])]
        else:  # steps 17-24 of fresh episodes: the left-out step is mid-episode
            assert not got["episode_returns"] and "episode_rows" not in got and got["cut"][(n_envs - 2) * 8 + 6]
    assert vector.episode_lengths.tolist() == python.episode_lengths  # same state at the end
    assert vector.episode_returns.tolist() == python.episode_returns
    vector.close()
    python.close()


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("kw", [
    {"frame_skip": 2, "frame_stack": 4, "screen_size": 64},
    {"full_action_space": True, "obs_type": "rgb", "frame_stack": 1},
    {"max_num_frames_per_episode": 240, "frame_skip": 3},  # truncations at 80 steps
])
def test_other_preprocessing_settings_give_the_python_envs_batches(kw):
    kw = {"noop_max": 0, **kw}
    runner = runner_for("ALE/SpaceInvaders-v5", kw)
    got, want = (cls("ALE/SpaceInvaders-v5", 2, seed=4, env_kwargs=kw).sample(runner, 200, np.random.default_rng(0))
                 for cls in (ALEVecSampler, VecSampler))
    assert got["obs"].shape == (200, kw.get("frame_stack", 3), kw.get("screen_size", 84), kw.get("screen_size", 84))
    assert_same_batch(got, want)
    if "max_num_frames_per_episode" in kw:
        assert (got["truncated"] & ~got["cut"]).sum() == 2


@pytest.mark.slow
def test_env_i_is_seeded_as_the_python_envs_seed_it():
    kw = ale_vector_kwargs("ALE/Qbert-v5")  # no-op starts on: the seed decides them
    sampler = ALEVecSampler("ALE/Qbert-v5", 3, seed=2**40 + 7)
    from ale_py.vector_env import AtariVectorEnv

    for i in range(3):
        one = AtariVectorEnv(kw["game"], 1, num_threads=1, autoreset_mode="SameStep",
                             **{k: v for k, v in kw.items() if k != "game"})
        obs, _ = one.reset(seed=np.array([env_seed(2**40 + 7, i) % 2**31]))
        np.testing.assert_array_equal(sampler.obs[i], obs[0])
        one.close()
    sampler.close()


@pytest.mark.slow
def test_a_box_policy_is_refused_with_a_clear_error():
    spec = spec_for_spaces(*env_spaces("Pendulum-v1"))
    runner = PolicyRunner(spec, Policy(spec).numpy_state(), 0)
    sampler = ALEVecSampler("ALE/Qbert-v5", 2, seed=0)
    with pytest.raises(ValueError, match="discrete actions"):
        sampler.sample(runner, 8, np.random.default_rng(0))
    sampler.close()


@pytest.mark.slow
def test_make_env_stacks_zeros_before_the_first_frame():
    obs, _ = make_env("ALE/Qbert-v5", noop_max=0).reset(seed=0)
    assert obs.shape == (3, 84, 84) and not obs[:2].any() and obs[2].any()
    vec = ALEVecSampler("ALE/Qbert-v5", 2, seed=0, env_kwargs={"noop_max": 0})
    np.testing.assert_array_equal(vec.obs[0], obs)
    vec.close()


@pytest.mark.slow
def test_the_actor_handler_samples_atari_on_the_vector_env(fresh_handler, redis_server, redis_client, hmac_key):
    spec = spec_for_spaces(*env_spaces("ALE/Qbert-v5"))
    PolicyStore(redis_client, "alev").put(1, policy_to_blob(Policy(spec), 1, read_key(hmac_key, "alev")))
    event = {"job_id": "alev", "round": 0, "policy_version": 1, "env_id": "ALE/Qbert-v5", "num_steps": 64,
             "seed": 5, "invocation_id": "alev-r0-a1", "redis_url": redis_server.url, "reset_episodes": True,
             "envs_per_actor": 4, **grant(redis_client, hmac_key, "alev", "alev-r0-a1")}
    summary = fresh_handler(event, None)
    assert summary["ok"] and summary["steps"] == 64
    assert isinstance(handler_mod._Warm.sampler, ALEVecSampler) and handler_mod._Warm.sampler.num_envs == 4
    reader = TrajectoryReader(redis_client, "alev", hmac_key)
    entries = reader.read(count=10, block_ms=1000)
    reader.ack(entries)
    batch = entries[0].batch
    assert len(entries) == 1 and batch["obs"].shape == (64, 3, 84, 84) and batch["cut"][[15, 31, 47]].all()
