"""Actors of a learner that does not read per-step values (IMPACT) skip the per-step critic.

The learner says so in every policy version it publishes (`behaviour_values`, nitro.spec.BEHAVIOUR_VALUE_ALGOS);
the samplers then leave `values` out of the batch and evaluate the critic only for the bootstrap values
(truncations' final observations, the next observations), which must equal those of a run that records
everything. Real environments, a real Redis and the real actor handler.
"""

import numpy as np
import pytest
import torch

from nitro.algos.impact import IMPACTLearner
from nitro.algos.ppo import collate
from nitro.algos.stellaris import compute_update
from nitro.config import IMPACTConfig
from nitro.data.batching import split_batch
from nitro.data.store import PolicyStore, TrajectoryReader
from nitro.policy.envs import env_spaces
from nitro.policy.inference import PolicyRunner
from nitro.policy.model_spec import blob_to_doc
from nitro.policy.models import Policy, policy_to_blob, spec_for_spaces
from nitro.policy.rollout import lockstep_layout, make_sampler
from nitro.spec import ALGOS, BEHAVIOUR_VALUE_ALGOS
from tests.credentials import grant, read_key

ENV = "CartPole-v1"
KW = {"max_episode_steps": 15}  # a random policy meets both time limits and terminations


def runners(env_id: str, env_kwargs: dict | None = None, **spec_kw) -> tuple[PolicyRunner, PolicyRunner]:
    spec = spec_for_spaces(*env_spaces(env_id, **(env_kwargs or {})), **spec_kw)
    torch.manual_seed(0)  # the same weights every run, so the batches (and where the splits fall) are fixed
    state = Policy(spec).numpy_state()
    return PolicyRunner(spec, state, 1), PolicyRunner(spec, state, 1, behaviour_values=False)


def critic_calls(runner: PolicyRunner) -> tuple[list[int], list[bool]]:
    """Record the row counts of the runner's batched critic calls and the with_value of its acting calls."""
    rows, valued = [], []
    batched, act, act_batch = runner.value_batch, runner.act, runner.act_batch
    runner.value_batch = lambda obs, **kw: (rows.append(len(obs)), batched(obs, **kw))[1]
    runner.act = lambda *a, with_value=True, **kw: (valued.append(with_value), act(*a, with_value=with_value,
                                                                                      **kw))[1]
    runner.act_batch = lambda *a, with_value=True, **kw: (valued.append(with_value),
                                                          act_batch(*a, with_value=with_value, **kw))[1]
    return rows, valued


@pytest.mark.parametrize("env_id,n_envs,steps,kw,spec_kw", [
    (ENV, 1, 300, KW, {}),
    (ENV, 4, 300, KW, {"obs_norm": True}),
    ("Pendulum-v1", 1, 90, {"max_episode_steps": 30}, {}),  # Box actions
    ("Pendulum-v1", 3, 90, {"max_episode_steps": 20}, {}),
    # the CNN: fused actor-critic pass when recording
    pytest.param("ALE/Qbert-v5", 8, 48, {"max_episode_steps": 10}, {}, marks=pytest.mark.slow),
    # The Python envs (terminal_on_life_loss keeps them) rather than ALE's vector env
    pytest.param("ALE/Qbert-v5", 8, 48, {"max_episode_steps": 10, "terminal_on_life_loss": True}, {},
                 marks=pytest.mark.slow),
])
def test_without_behaviour_values_the_batch_is_the_same_less_values(env_id, n_envs, steps, kw, spec_kw):
    full, lean = runners(env_id, kw, **spec_kw)
    (full_rows, full_acts), (rows, acts) = critic_calls(full), critic_calls(lean)
    batches = []
    for runner in (full, lean):
        sampler = make_sampler(env_id, 7, kw, n_envs)
        rng = np.random.default_rng(3)
        batches.append([sampler.sample(runner, steps, rng) for _ in range(2)])  # the second continues episodes
        sampler.close()
    assert any(a["truncated"].any() for a in batches[0])  # bootstraps through time limits are exercised
    for a, b in zip(*batches):
        assert "values" in a and "values" not in b
        assert set(a) - set(b) == {"values"} and set(b) - set(a) == {"final_obs", "bootstrap_obs"}
        for k in b:
            if k in ("final_obs", "bootstrap_obs"):  # checked below
                continue
            if k in ("final_values", "bootstrap_value"):  # the critic on the same observations
                np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-5, err_msg=k)
            elif isinstance(b[k], np.ndarray):
                np.testing.assert_array_equal(b[k], a[k], err_msg=k)
            else:
                assert b[k] == a[k], k
    # Recording, the critic runs on every step (batched afterwards, or fused into the acting pass); without,
    # it sees only the bootstrap observations.
    assert max(full_rows, default=0) >= steps or any(full_acts)
    bootstraps = [int((b["truncated"] & ~b["cut"]).sum()) + n_envs for b in batches[1]] if n_envs > 1 else []
    assert rows == bootstraps and not any(acts)  # one env values its few bootstraps one at a time
    # The batch without values carries the observations its bootstrap values were computed on, so a learner
    # can value them with its own critic (IMPACT's vtrace_critic "online").
    for b in batches[1]:
        trunc = b["truncated"]
        assert b["final_obs"].shape == (int(trunc.sum()), *b["obs"].shape[1:])
        assert b["final_obs"].dtype == b["bootstrap_obs"].dtype == b["obs"].dtype
        assert b["bootstrap_obs"].shape == b["obs"].shape[1:]
        if trunc.any():
            np.testing.assert_allclose(full.value_batch(b["final_obs"]), b["final_values"][trunc], rtol=1e-5,
                                       atol=1e-5)
        if not (trunc[-1] or b["terminated"][-1]):
            assert full.value_batch(b["bootstrap_obs"][None])[0] == pytest.approx(b["bootstrap_value"], abs=1e-5)
    # The second batch continues the first: its last environment's segment starts from that observation.
    last_start = lockstep_layout(steps, n_envs)[1][-1]
    np.testing.assert_array_equal(batches[1][0]["bootstrap_obs"], batches[1][1]["obs"][last_start])


def test_split_batch_without_values_takes_the_cut_bootstraps_from_the_critic():
    full, lean = runners(ENV, KW)
    batches = []
    for runner in (full, lean):
        sampler = make_sampler(ENV, 2, KW, 1)
        batches.append(sampler.sample(runner, 240, np.random.default_rng(0)))
        sampler.close()
    with pytest.raises(ValueError, match="value_of"):
        split_batch(batches[1], 3)
    ref, parts = split_batch(batches[0], 3), split_batch(batches[1], 3, value_of=lean.value_batch)
    assert len(parts) == 3 and any(p["bootstrap_value"] != 0.0 for p in ref[:-1])  # a cut falls mid-episode
    for p_ref, p in zip(ref, parts):
        assert p["bootstrap_value"] == pytest.approx(p_ref["bootstrap_value"], abs=1e-5)
        assert "values" not in p and len(p["rewards"]) == len(p_ref["rewards"])
    # Each part carries its truncations' final observations and, as its bootstrap observation, the next part's
    # first one (the whole batch's for the last part).
    assert batches[1]["truncated"].any() and len(batches[1]["final_obs"]) == batches[1]["truncated"].sum()
    np.testing.assert_array_equal(np.concatenate([p["final_obs"] for p in parts]), batches[1]["final_obs"])
    for p, nxt in zip(parts, parts[1:]):
        assert len(p["final_obs"]) == p["truncated"].sum()
        np.testing.assert_array_equal(p["bootstrap_obs"], nxt["obs"][0])
        assert p["bootstrap_value"] == 0.0 or p["bootstrap_value"] == pytest.approx(
            float(lean.value_batch(p["bootstrap_obs"][None])[0]), abs=1e-6)
    np.testing.assert_array_equal(parts[-1]["bootstrap_obs"], batches[1]["bootstrap_obs"])
    assert split_batch(batches[1], 1) == [batches[1]]  # nothing to cut, no critic needed


def test_the_flag_travels_in_the_signed_policy_document_and_defaults_on(hmac_key):
    policy = Policy(spec_for_spaces(*env_spaces(ENV)))
    for flag in (True, False):
        doc = blob_to_doc(policy_to_blob(policy, 3, hmac_key, behaviour_values=flag), hmac_key)
        assert doc["behaviour_values"] is flag and PolicyRunner.from_doc(doc).behaviour_values is flag
    older = blob_to_doc(policy_to_blob(policy, 3, hmac_key), hmac_key)
    del older["behaviour_values"]  # a policy published before the field existed
    assert PolicyRunner.from_doc(older).behaviour_values is True
    assert set(BEHAVIOUR_VALUE_ALGOS) == {"ppo"} and set(BEHAVIOUR_VALUE_ALGOS) < set(ALGOS)


def _event(redis_client, hmac_key, redis_server, **kw):
    e = {"job_id": "bv", "round": 0, "policy_version": 1, "env_id": ENV, "env_kwargs": KW, "num_steps": 200,
         "seed": 5, "invocation_id": "bv-r0-a1", "redis_url": redis_server.url, "reset_episodes": True}
    e.update(kw)
    return {**e, **grant(redis_client, hmac_key, "bv", e["invocation_id"])}


@pytest.mark.slow
def test_an_impact_policy_gets_batches_without_values_that_impact_learns_from_and_ppo_refuses(
        fresh_handler, redis_server, redis_client, hmac_key):
    spec = spec_for_spaces(*env_spaces(ENV))
    policy = Policy(spec)
    PolicyStore(redis_client, "bv").put(1, policy_to_blob(policy, 1, read_key(hmac_key, "bv"), behaviour_values=False))
    fresh_handler(_event(redis_client, hmac_key, redis_server, envs_per_actor=4), None)
    # A cap that forces a split: the parts' cut bootstraps come from the actor's critic.
    summary = fresh_handler(_event(redis_client, hmac_key, redis_server, invocation_id="bv-r0-a2",
                                   max_entry_bytes=3000), None)
    assert summary["entries"] > 1
    reader = TrajectoryReader(redis_client, "bv", hmac_key)
    entries = reader.read(count=20, block_ms=1000)
    reader.ack(entries)
    batches = [e.batch for e in entries]
    assert len(batches) == 1 + summary["entries"] and all("values" not in b for b in batches)
    assert sum(len(b["rewards"]) for b in batches) == 400
    learner = IMPACTLearner(spec, IMPACTConfig(minibatch_size=64, epochs=1))
    stats = learner.update(batches)
    assert stats.samples == 400 and np.isfinite(stats.value_loss)
    with pytest.raises(ValueError, match="'values'"):
        collate(batches, 0.99, 0.95)
    # Stellaris's learner functions in IMPACT mode take the same batches (V-trace on pi_2's values).
    g, _ = compute_update(policy, batches, IMPACTConfig(minibatch_size=64, epochs=1), "impact", seed=1)
    assert g.shape == (sum(p.numel() for p in policy.parameters()),) and np.isfinite(g).all() and np.abs(g).max() > 0
