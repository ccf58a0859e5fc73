"""The minions scaling policy (MinionsRL's learned scheduler): observation and reward on scripted
round histories, checkpoints, the distribution of a scheduler's decisions, pre-training in process
(its decisions must not collapse to one actor count) and through the real system, the policy end
to end through the services, and the statuses for missing, corrupt and mismatched checkpoints."""

from __future__ import annotations

import json
import math

import grpc
import numpy as np
import pytest

from nitro.contracts import DEFAULT_ACTOR_MEMORY_MB
from nitro.errors import ConfigError
from nitro.scaling import RoundInputs, make_policy
from nitro.scaling import minions as m
from nitro.spec import InvalidSpec, ScalerSettings, TrainingSpec, validate
from tests.system import shared_system

LN_3601 = math.log(3601.0)
LN_1001 = math.log(1001.0)


def inputs(**kw) -> RoundInputs:
    base = dict(round_index=0, i_min=1, i_max=4, rounds=4, budget_usd=1.0, budget_left_usd=1.0)
    return RoundInputs(**{**base, **kw})


def random_state(i_max: int, seed: int = 0, scale: float = 0.5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    state = {k: rng.normal(0.0, scale, shape).astype(np.float32) for k, shape in m.weight_shapes(i_max).items()}
    state["obs_mean"], state["obs_var"] = np.zeros(m.OBS_DIM, np.float32), np.ones(m.OBS_DIM, np.float32)
    return state


# --- observation: a scripted job of 4 rounds, hand-computed features ------------------------------

# What the learner sends when planning rounds 0..3 (round 0 has no last round yet).
HISTORY = [
    dict(round_index=0),
    dict(round_index=1, learner_loss=math.e - 1, eval_return=50.0, approx_kl=0.001, update_seconds=1.0,
         actor_seconds=2.0, round_seconds=4.0, budget_left_usd=0.75),
    dict(round_index=2, learner_loss=-(math.e ** 5 - 1), eval_return=250.0, approx_kl=1.0, update_seconds=0.5,
         actor_seconds=3.5, round_seconds=3600.0, budget_left_usd=0.25),
    dict(round_index=3, learner_loss=float("nan"), eval_return=-400.0, approx_kl=5.0, update_seconds=9.0,
         actor_seconds=-1.0, round_seconds=3.0, budget_left_usd=-0.01),
]
EXPECTED = [
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
    # 1/4; symlog(e-1)/10; 50/200; ln(2)/ln(1001); 1/4; 2/4; ln(5)/ln(3601); 0.75/1
    [0.25, 0.1, 0.25, math.log(2) / LN_1001, 0.25, 0.5, math.log(5) / LN_3601, 0.75],
    # symlog of a loss of -(e^5 - 1) is -5; return above the target clips to 1; KL 1 saturates to 1
    [0.5, -0.5, 1.0, 1.0, 0.5 / 3600, 3.5 / 3600, 1.0, 0.25],
    # NaN loss counts as 0; -400/200 clips to -1; update longer than the round clips to 1; overspent -> 0
    [0.75, 0.0, -1.0, 1.0, 1.0, 0.0, math.log(4) / LN_3601, 0.0],
]


@pytest.mark.parametrize("k", range(4))
def test_observation_on_a_scripted_history(k):
    obs = m.observation(inputs(target_return=200.0, **HISTORY[k]))
    assert obs.dtype == np.float32 and obs.shape == (len(m.OBS_NAMES),)
    np.testing.assert_allclose(obs, EXPECTED[k], rtol=1e-5, atol=1e-6)


def test_observation_without_target_rounds_or_budget():
    obs = m.observation(RoundInputs(round_index=7, eval_return=math.e ** 5 - 1, learner_loss=math.inf))
    # no target: symlog(return)/10; rounds unknown: 0; no budget: 1; an infinite loss counts as 0
    np.testing.assert_allclose(obs, [0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 1.0], atol=1e-6)
    assert m.observation(inputs(round_index=9, rounds=4))[0] == 1.0  # past the planned rounds: clipped


# --- reward -----------------------------------------------------------------------------------------

COSTS, SECONDS = [0.01, 0.02, 0.01], [2.0, 4.0, 2.0]
REWARD_KW = dict(budget_usd=0.1, rounds=4, round_seconds_ref=2.0, target_return=100.0)


def test_round_penalty_is_budget_share_plus_time_share():
    # 0.01 / 0.1 + 2 / (4 * 2) = 0.1 + 0.25
    assert m.round_penalty(0.01, 2.0, budget_usd=0.1, rounds=4, round_seconds_ref=2.0) == pytest.approx(0.35)
    assert m.round_penalty(0.02, 4.0, budget_usd=0.1, rounds=4, round_seconds_ref=2.0,
                           cost_weight=2.0, time_weight=0.0) == pytest.approx(0.4)
    with pytest.raises(ConfigError):
        m.round_penalty(0.01, 2.0, budget_usd=0.0, rounds=4, round_seconds_ref=2.0)


def test_episode_rewards_bonus_only_when_target_reached_within_budget():
    reached = m.episode_rewards(COSTS, SECONDS, final_eval_return=120.0, **REWARD_KW)
    assert reached == pytest.approx([-0.35, -0.7, -0.35 + 2.0])
    missed = m.episode_rewards(COSTS, SECONDS, final_eval_return=99.0, **REWARD_KW)
    assert missed == pytest.approx([-0.35, -0.7, -0.35])
    over = m.episode_rewards([0.05, 0.05, 0.02], SECONDS, final_eval_return=120.0, **REWARD_KW)
    assert over[-1] == pytest.approx(-(0.2 + 0.25))  # 0.12 USD spent of 0.10: no bonus
    no_target = m.episode_rewards(COSTS, SECONDS, final_eval_return=1e9, **{**REWARD_KW, "target_return": 0.0})
    assert no_target == pytest.approx([-0.35, -0.7, -0.35])
    # Reaching the target in 2 rounds beats reaching it in 3, which beats not reaching it.
    fast = sum(m.episode_rewards(COSTS[:2], SECONDS[:2], final_eval_return=120.0, **REWARD_KW))
    assert fast > sum(reached) > sum(missed)


def test_progress_term_pays_for_what_the_actors_bought():
    # 10 -> 30 -> 25 -> 55 in units of 20: +1, -0.25, +1.5; a NaN (not evaluated) keeps the last return
    assert m.progress_rewards([30.0, 25.0, 55.0], return_scale=20.0, initial_eval_return=10.0) == \
        pytest.approx([1.0, -0.25, 1.5])
    assert m.progress_rewards([30.0, float("nan"), 55.0], return_scale=20.0, initial_eval_return=10.0) == \
        pytest.approx([1.0, 0.0, 1.25])
    assert m.progress_rewards([30.0, 25.0], return_scale=20.0) == pytest.approx([0.0, -0.25])  # no initial return
    with pytest.raises(ConfigError):
        m.progress_rewards([1.0], return_scale=0.0)
    kw = dict(REWARD_KW, target_return=0.0)
    plain = m.episode_rewards(COSTS, SECONDS, final_eval_return=55.0, **kw)
    with_progress = m.episode_rewards(COSTS, SECONDS, final_eval_return=55.0, eval_returns=[30.0, 25.0, 55.0],
                                      return_scale=20.0, initial_eval_return=10.0, **kw)
    assert with_progress == pytest.approx([p + g for p, g in zip(plain, [1.0, -0.25, 1.5])])
    # The penalty-only reward prefers the cheaper round whatever it bought: one actor is always best.
    cheap, dear = [0.01], [0.04]
    assert sum(m.episode_rewards(cheap, [1.0], final_eval_return=0.0, **kw)) > \
        sum(m.episode_rewards(dear, [4.0], final_eval_return=0.0, **kw))
    # With progress, a dearer round that bought more return can win.
    assert sum(m.episode_rewards(dear, [4.0], final_eval_return=0.0, eval_returns=[60.0], return_scale=20.0,
                                 initial_eval_return=10.0, **kw)) > \
        sum(m.episode_rewards(cheap, [1.0], final_eval_return=0.0, eval_returns=[15.0], return_scale=20.0,
                              initial_eval_return=10.0, **kw))
    with pytest.raises(ConfigError, match="eval returns"):
        m.episode_rewards(COSTS, SECONDS, final_eval_return=0.0, eval_returns=[1.0], return_scale=1.0, **kw)


# --- checkpoints and decisions ----------------------------------------------------------------------


def test_checkpoint_round_trip_and_argmax_decisions(tmp_path):
    path = m.save_checkpoint(tmp_path / "s.npz", random_state(4), 4, metadata={"note": "x"})
    sched = m.load_scheduler(path)
    assert (sched.i_max, sched.mode) == (4, "serve") and sched.meta["metadata"] == {"note": "x"}
    assert sched.meta["fingerprint_id"] == m.fingerprint_id(m.fingerprint(4))
    policy = make_policy("minions", {"scheduler": str(path)})
    rng = np.random.default_rng(1)
    for k in range(30):
        inp = inputs(round_index=k % 4, learner_loss=float(rng.normal(0, 50)), eval_return=float(rng.uniform(0, 300)),
                     approx_kl=float(rng.uniform(0, 0.1)), round_seconds=float(rng.uniform(0.1, 30)),
                     target_return=200.0)
        actors, state, reason = policy.decide({}, inp)
        again, _, _ = policy.decide({}, inp)
        assert 1 <= actors <= 4 and actors == again  # serving is deterministic
        assert state == {} and reason.startswith("minions: k=") and "(argmax" in reason
        assert actors == int(np.argmax(sched.probabilities(m.observation(inp)))) + 1
    floored, _, reason = policy.decide({}, inputs(i_min=4))
    assert floored == 4


def test_explore_mode_samples_reproducibly_and_records_the_trajectory(tmp_path):
    path = m.save_checkpoint(tmp_path / "e.npz", random_state(4, scale=0.01), 4, mode="explore", explore_seed=7)
    policy = make_policy("minions", {"scheduler": str(path)})
    state, chosen = {}, []
    for k in range(4):
        actors, state, reason = policy.decide(state, inputs(round_index=k))
        chosen.append(actors)
        assert "(sampled" in reason
    assert [t["round"] for t in state["trajectory"]] == [0, 1, 2, 3]
    assert [t["action"] + 1 for t in state["trajectory"]] == chosen
    np.testing.assert_allclose(state["trajectory"][0]["obs"], m.observation(inputs()))
    assert json.loads(json.dumps(state)) == state  # stored in Redis as JSON
    # a retried round replaces its entry; same seed and round, same sample
    _, retried, _ = policy.decide(state, inputs(round_index=2))
    assert [t["round"] for t in retried["trajectory"]] == [0, 1, 3, 2]
    assert retried["trajectory"][-1] == state["trajectory"][2]
    # near-uniform network: 200 rounds of sampling cover every actor count
    seen = {policy.decide({}, inputs(round_index=k))[0] for k in range(200)}
    assert seen == {1, 2, 3, 4}


def test_bad_checkpoints_are_told_apart(tmp_path):
    with pytest.raises(m.SchedulerCheckpointError, match="is required") as err:
        m.load_scheduler("")
    with pytest.raises(m.SchedulerCheckpointError, match="no scheduler checkpoint") as err:
        m.load_scheduler(tmp_path / "missing.npz")
    assert not isinstance(err.value, m.SchedulerMismatchError)
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"definitely not a zip archive")
    with pytest.raises(m.SchedulerCheckpointError, match="not a readable") as err:
        m.load_scheduler(garbage)
    assert not isinstance(err.value, m.SchedulerMismatchError)
    other = tmp_path / "other.npz"
    np.savez(other, x=np.zeros(3))
    with pytest.raises(m.SchedulerCheckpointError, match="not a minions scheduler"):
        m.load_scheduler(other)
    state = random_state(4)
    state["actor.out.bias"][0] = np.nan
    nan = m.save_checkpoint(tmp_path / "nan.npz", state, 4)
    with pytest.raises(m.SchedulerCheckpointError, match="corrupt weight"):
        m.load_scheduler(nan)

    def rewrite(path, **changes):
        with np.load(path) as npz:
            arrays = {k: npz[k] for k in npz.files}
        meta = json.loads(arrays[m.META_KEY].tobytes())
        for key, value in changes.items():
            target = meta["fingerprint"] if key in meta["fingerprint"] else meta
            target[key] = value
        arrays[m.META_KEY] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        np.savez(path, **arrays)

    old = m.save_checkpoint(tmp_path / "v1.npz", random_state(4), 4)
    rewrite(old, version=1)  # before the inputs were standardised
    with pytest.raises(m.SchedulerMismatchError, match="format version 1"):
        m.load_scheduler(old)
    state = random_state(4)
    state["obs_var"][3] = -1.0
    with pytest.raises(m.SchedulerCheckpointError, match="obs_var"):
        m.load_scheduler(m.save_checkpoint(tmp_path / "negvar.npz", state, 4))
    layout = m.save_checkpoint(tmp_path / "layout.npz", random_state(4), 4)
    rewrite(layout, obs_names=list(m.OBS_NAMES[::-1]))
    with pytest.raises(m.SchedulerMismatchError, match="obs_names"):
        m.load_scheduler(layout)
    policy = make_policy("minions", {"scheduler": m.save_checkpoint(tmp_path / "i4.npz", random_state(4), 4)})
    with pytest.raises(m.SchedulerMismatchError, match="i_max=4.*scaler.i_max=6"):
        policy.decide({}, inputs(i_max=6))
    with pytest.raises(ConfigError, match="unknown parameter"):
        make_policy("minions", {"scheduler": "x", "temperature": 1.0})


def test_loaded_scheduler_is_cached_per_path_and_reloaded_when_rewritten(tmp_path):
    path = str(tmp_path / "c.npz")
    m.save_checkpoint(path, random_state(4, seed=1), 4)
    first = m.load_scheduler_cached(path)
    assert m.load_scheduler_cached(path) is first
    m.save_checkpoint(path, random_state(4, seed=2), 4, mode="explore")
    assert m.load_scheduler_cached(path).mode == "explore"


def test_inputs_are_standardised_with_the_stored_statistics(tmp_path):
    from nitro.policy.model_spec import OBS_CLIP

    assert m.OBS_NORM_CLIP == OBS_CLIP
    state = random_state(4, seed=3)
    state["obs_mean"] = np.linspace(0.0, 0.7, m.OBS_DIM).astype(np.float32)
    state["obs_var"] = np.full(m.OBS_DIM, 0.04, np.float32)
    sched = m.load_scheduler(m.save_checkpoint(tmp_path / "n.npz", state, 4))
    built = m.scheduler_from_state(state, 4)
    assert built.i_max == sched.i_max and all(np.array_equal(w, v) for (w, _), (v, _) in zip(built.weights,
                                                                                             sched.weights))
    obs = np.full(m.OBS_DIM, 0.5, np.float32)
    z = (obs - state["obs_mean"]) / np.sqrt(0.04 + 1e-8)
    np.testing.assert_allclose(sched.standardise(obs), z, rtol=1e-5)
    np.testing.assert_allclose(sched.logits(obs), m.scheduler_from_state(state, 4).logits(obs), rtol=1e-6)
    far = np.full(m.OBS_DIM, 1e6, np.float32)
    assert np.all(sched.standardise(far) == OBS_CLIP)
    # the same network as torch computes it (nitro.policy.models.Policy with obs_norm)
    import torch

    from nitro.policy.models import Policy
    from nitro.training.minions_pretrain import scheduler_model_spec

    policy = Policy(scheduler_model_spec(4))
    policy.load_numpy_state({**state, "obs_count": np.array(10.0)})
    with torch.no_grad():
        probs = policy.distribution(torch.as_tensor(obs[None])).probs.numpy()[0]
    np.testing.assert_allclose(sched.probabilities(obs), probs, rtol=1e-4, atol=1e-6)


def constant_scheduler(tmp_path, i_max: int = 4, action: int = 0) -> str:
    """A checkpoint that always picks action+1 actors: its output bias dwarfs everything else."""
    state = random_state(i_max, seed=5, scale=0.01)
    state["actor.out.bias"] = np.full(i_max, -50.0, np.float32)
    state["actor.out.bias"][action] = 50.0
    return m.save_checkpoint(tmp_path / f"const{action}.npz", state, i_max)


def varied(hist: dict[int, int]) -> bool:
    """The decisions are not all the same actor count."""
    return sum(1 for c in hist.values() if c > 0) >= 2


def spread_of_inputs(n: int = 200, seed: int = 0) -> list[RoundInputs]:
    rng = np.random.default_rng(seed)
    return [inputs(round_index=int(rng.integers(0, 4)), learner_loss=float(rng.lognormal(0, 2)),
                   eval_return=float(rng.uniform(0, 300)), approx_kl=float(rng.lognormal(-5, 1)),
                   update_seconds=float(rng.uniform(0.05, 1)), actor_seconds=float(rng.uniform(0.05, 1)),
                   round_seconds=float(rng.uniform(1, 3)), budget_left_usd=float(rng.uniform(0, 1)))
            for _ in range(n)]


def test_decision_distribution_counts_greedy_decisions(tmp_path):
    path = m.save_checkpoint(tmp_path / "r.npz", random_state(4, seed=2), 4)
    sched = m.load_scheduler(path)
    spread = spread_of_inputs()
    hist = m.decision_distribution(path, spread)
    assert sorted(hist) == [1, 2, 3, 4] and sum(hist.values()) == len(spread)
    expected = [int(np.argmax(sched.probabilities(m.observation(x)))) + 1 for x in spread]
    assert hist == {n: expected.count(n) for n in range(1, 5)}
    # observations as an array give the same answer; i_min is a floor, as in a job
    obs = np.stack([m.observation(x) for x in spread])
    assert m.decision_distribution(sched, obs) == hist
    floored = m.decision_distribution(sched, obs, i_min=3)
    assert sorted(floored) == [3, 4] and floored[3] == hist[1] + hist[2] + hist[3] and floored[4] == hist[4]
    assert m.decision_distribution(sched, []) == {1: 0, 2: 0, 3: 0, 4: 0}
    with pytest.raises(ConfigError, match="i_min"):
        m.decision_distribution(sched, obs, i_min=5)
    lines = m.format_distribution({1: 3, 2: 1})
    assert lines[0].split()[:4] == ["1", "actors", "3", "75.0%"] and lines[0].endswith("#" * 40)
    # a scheduler that always returns I_min has one bar: what the pre-training test must not produce
    const = m.decision_distribution(constant_scheduler(tmp_path), spread)
    assert const == {1: len(spread), 2: 0, 3: 0, 4: 0} and not varied(const)


@pytest.mark.slow
def test_short_pretraining_in_process_does_not_collapse_to_one_count(tmp_path):
    """A few seconds of pre-training on a cheap setting: the scheduler's greedy decisions over the
    inputs its jobs produced are not all one count (a scheduler that always returns I_min fails)."""
    from nitro.training.minions_pretrain import PretrainSettings, pretrain

    settings = PretrainSettings("CartPole-v1", episodes=16, episodes_per_update=4, rounds_per_episode=4, i_max=4,
                                steps_per_actor=32, preset="fast", eval_episodes=1, holdout_jobs=1, seed=3,
                                out=str(tmp_path / "s.npz"))
    lines: list[str] = []
    result = pretrain(settings, log=lines.append)
    assert result.via == "inprocess" and len(result.episodes) == 16 and all(ep.trained for ep in result.episodes)
    assert sum(line.startswith("update after") for line in lines) == 4
    for ep in result.episodes:
        assert ep.state == "SUCCEEDED" and 1 <= ep.rounds <= 4 and len(ep.rewards) == len(ep.observations) == ep.rounds
        assert all(1 <= a <= 4 for a in ep.actors) and ep.cost_usd > 0
    observed = [o for ep in result.episodes for o in ep.observations]
    hist = m.decision_distribution(result.path, observed)
    assert sum(hist.values()) == len(observed)
    assert varied(hist), hist
    assert not varied(m.decision_distribution(constant_scheduler(tmp_path), observed))
    # what the command prints and the checkpoint records
    info = m.pretraining_info(result.path)
    assert info["via"] == "inprocess" and info["env_id"] == "CartPole-v1" and info["episodes_trained"] == 16
    assert set(result.decisions) == {"last_episodes", "holdout_jobs"}
    assert info["decisions"] == {k: {str(n): c for n, c in h.items()} for k, h in result.decisions.items()}
    assert sum(result.decisions["holdout_jobs"].values()) >= 1
    # cost: the CPU seconds, sampling billed as Lambda actors and the rest as learner-server time
    from nitro import cost

    assert result.cpu_seconds > 0 and info["cpu_seconds"] == result.cpu_seconds
    sampling = info["sampling"]
    assert 0 < sampling["cpu_seconds"] < result.cpu_seconds and sampling["invocations"] >= sum(
        sum(ep.actors) for ep in result.episodes)
    expected = cost.learner_cost(result.cpu_seconds - sampling["cpu_seconds"], cost.Prices()) + cost.lambda_cost(
        sampling["billed_ms"], sampling["invocations"], sampling["memory_mb"], cost.Prices())
    assert sampling["memory_mb"] == DEFAULT_ACTOR_MEMORY_MB
    assert result.cost_usd == pytest.approx(expected) and info["cost_usd"] == pytest.approx(expected)
    assert result.round_seconds_ref > 0 and result.return_scale > 0 and info["return_scale"] == result.return_scale
    assert m.load_scheduler(result.path).mode == "serve"


def test_pretraining_settings_are_validated():
    from nitro.training.minions_pretrain import PretrainSettings

    assert PretrainSettings().validate().env_id == "Hopper-v5"
    for change, message in ((dict(episodes=0), "episodes"), (dict(eval_episodes=0), "needs the evaluation return"),
                            (dict(episodes_per_update=0), "episodes_per_update"), (dict(gamma=1.5), "gamma"),
                            (dict(return_scale=-1.0), "return_scale"), (dict(budget_usd=math.nan), "budget"),
                            (dict(i_max=True), "i_max"), (dict(env_id=""), "env"),
                            (dict(budget_min_usd=1.0), "budget_min")):
        with pytest.raises(ConfigError, match=message):
            PretrainSettings(**change).validate()
    # each episode's budget: log-uniform in [min, budget], reproducible; min 0 gives every job the budget
    s = PretrainSettings(budget_usd=0.01, budget_min_usd=0.001, seed=4)
    budgets = [s.episode_budget(e) for e in range(200)]
    assert all(0.001 <= b <= 0.01 for b in budgets) and budgets == [s.episode_budget(e) for e in range(200)]
    assert min(budgets) < 0.0015 and max(budgets) > 0.007
    assert 0.002 < float(np.median(budgets)) < 0.005  # geometric middle ~0.0032
    assert PretrainSettings(budget_usd=0.01, budget_min_usd=0.0).episode_budget(3) == 0.01


def test_jobs_whose_budget_pays_for_no_round_are_skipped(tmp_path):
    from nitro.training.minions_pretrain import PretrainError, PretrainSettings, pretrain

    settings = PretrainSettings("CartPole-v1", episodes=2, rounds_per_episode=2, i_max=2, steps_per_actor=8,
                                preset="fast", eval_episodes=1, budget_usd=1e-9, budget_min_usd=0.0,
                                out=str(tmp_path / "none.npz"))
    lines: list[str] = []
    with pytest.raises(PretrainError, match="no episode ran a round"):
        pretrain(settings, log=lines.append)
    assert len(lines) == 2 and all("does not pay for one round; skipped" in line for line in lines)
    assert not (tmp_path / "none.npz").exists()


def test_trajectory_is_read_from_the_scalers_job_state():
    from nitro.training.minions_pretrain import read_trajectory

    class Hash:
        def hget(self, key, field):
            assert (key, field) == ("nitro:j-1:scaler", "policy_state")  # the scaler's hash (nitro.contracts)
            return json.dumps({"trajectory": [{"round": 1}, {"round": 0}]})

    assert read_trajectory(Hash(), "j-1") == [{"round": 0}, {"round": 1}]


def test_spec_validation_of_the_scheduler(tmp_path):
    def spec(**scaler):
        return TrainingSpec(env_id="CartPole-v1", scaler=ScalerSettings(**scaler))

    with pytest.raises(InvalidSpec) as err:
        validate(spec(policy="minions"))
    assert err.value.field == "scaler.scheduler" and "pretrain-minions" in str(err.value)
    with pytest.raises(InvalidSpec, match="scaler.scheduler: no scheduler checkpoint"):
        validate(spec(policy="minions", scheduler=str(tmp_path / "nope.npz")))
    with pytest.raises(InvalidSpec, match="scaler.scheduler: is only used with"):
        validate(spec(policy="nitro", scheduler="x.npz"))
    path = m.save_checkpoint(tmp_path / "ok.npz", random_state(8), 8)
    assert validate(spec(policy="minions", scheduler=path, i_min=1, i_max=8)).scaler.scheduler == path


@pytest.mark.parametrize("argv, message", [
    (["--episodes", "0"], "episodes: must be an integer in [1, 100000], got 0"),
    (["--episodes-per-update", "0"], "episodes_per_update: must be an integer in [1, 100000]"),
    (["--eval-episodes", "0"], "the scheduler's reward needs the evaluation return"),
    (["--return-scale", "-2"], "return_scale: must be a finite number >= 0"),
    (["--holdout-jobs", "-1"], "holdout_jobs: must be an integer in [0, 1000]"),
    (["--budget", "0"], "budget: must be a finite number > 0"),
    (["--budget", "0.01", "--budget-min", "0.02"], "budget_min: must be a number in [0, budget = 0.01]"),
    (["--env", "Hoper-v5"], "env: unknown environment id 'Hoper-v5'; did you mean"),
    (["--preset", "turbo"], "unknown PPO preset 'turbo'"),
    (["--target", "127.0.0.1:1"], "--target is only used with --via system"),
    (["--work-dir", "/tmp"], "--work-dir is only used with --via system"),
    (["--via", "system", "--target", "127.0.0.1:1", "--redis-url", ""], "--target needs --redis-url"),
])
def test_pretrain_cli_rejects_bad_settings_before_starting_anything(capsys, tmp_path, monkeypatch, argv, message):
    from nitro.client.cli import main

    monkeypatch.delenv("NITRO_TARGET", raising=False)
    assert main(["pretrain-minions", "--episodes", "1", *argv, "--state-dir", str(tmp_path),
                 "--out", str(tmp_path / "s.npz")]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "s.npz").exists()


def test_pretrain_cli_prints_cost_and_decisions(capsys, tmp_path):
    from nitro.client.cli import main

    out = tmp_path / "cli.npz"
    assert main(["pretrain-minions", "--env", "CartPole-v1", "--episodes", "2", "--episodes-per-update", "2",
                 "--rounds-per-episode", "2", "--i-max", "3", "--steps-per-actor", "16", "--preset", "fast",
                 "--eval-episodes", "1", "--holdout-jobs", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"scheduler checkpoint  {out}" in text and "CPU time" in text and "cost        $" in text
    assert "in 1 held-out jobs" in text and "on the inputs of the last update's jobs" in text
    assert "   3 actors" in text and m.pretraining_info(out)["cpu_seconds"] > 0


# --- through the real system --------------------------------------------------------------------------

I_MAX = 4
JOB = {"env_id": "CartPole-v1", "preset": "fast", "rounds": 3, "steps_per_actor": 64, "eval_episodes": 1,
       "budget_usd": 0.5}


system = shared_system()



@pytest.fixture(scope="module")
def pretrained(system, client, tmp_path_factory):
    from nitro.data.redis_client import connect
    from nitro.training.minions_pretrain import PretrainSettings, pretrain

    out = tmp_path_factory.mktemp("minions") / "scheduler.npz"
    settings = PretrainSettings("CartPole-v1", episodes=2, rounds_per_episode=3, i_max=I_MAX, steps_per_actor=64,
                                budget_usd=0.05, budget_min_usd=0.0, eval_episodes=1, seed=1, preset="fast",
                                out=str(out))
    lines = []
    result = pretrain(settings, client, connect(system.redis_url), log=lines.append)
    return result, lines


@pytest.mark.timeout(240)
def test_pretraining_through_the_system_writes_a_loadable_checkpoint(pretrained):
    result, lines = pretrained
    assert result.via == "system" and len(result.episodes) == 2
    assert [line.split(":")[0] for line in lines] == ["episode 1/2", "episode 2/2", "update after episode 2"]
    for ep in result.episodes:
        assert ep.state == "SUCCEEDED", ep.message
        assert ep.trained and ep.rounds == 3 and len(ep.rewards) == 3 and not ep.reached_target
        assert all(1 <= a <= I_MAX for a in ep.actors) and ep.cost_usd > 0
    assert result.jobs_cost_usd == pytest.approx(sum(ep.cost_usd for ep in result.episodes))
    assert result.cost_usd == pytest.approx(result.jobs_cost_usd + result.cpu_cost_usd)
    assert result.cpu_seconds > 0 and set(result.decisions) == {"last_episodes"}
    assert sum(result.decisions["last_episodes"].values()) == sum(ep.rounds for ep in result.episodes)
    assert result.wall_seconds > 0 and result.round_seconds_ref > 0
    sched = m.load_scheduler(result.path)
    assert sched.mode == "serve" and sched.i_max == I_MAX
    info = m.pretraining_info(result.path)
    assert info["cost_usd"] == pytest.approx(result.cost_usd) and info["wall_seconds"] == result.wall_seconds
    assert info["jobs"] == [ep.job_id for ep in result.episodes] and info["episodes_trained"] == 2
    # PPO really updated it: the weights moved away from the initialisation of the same seed.
    from nitro.algos.ppo import PPOLearner
    from nitro.training.minions_pretrain import PretrainSettings, scheduler_model_spec, scheduler_ppo_config

    init = PPOLearner(scheduler_model_spec(I_MAX), scheduler_ppo_config(PretrainSettings("CartPole-v1", 1)), seed=1)
    moved = np.abs(init.policy.numpy_state()["actor.layers.0.weight"] - m.read_checkpoint(result.path)[1][
        "actor.layers.0.weight"]).max()
    assert moved > 1e-6
    policy = make_policy("minions", {"scheduler": result.path})
    rng = np.random.default_rng(0)
    for k in range(20):
        inp = inputs(round_index=k % 3, rounds=3, i_max=I_MAX, learner_loss=float(rng.normal(0, 20)),
                     eval_return=float(rng.uniform(0, 40)), round_seconds=float(rng.uniform(0.5, 5)))
        assert 1 <= policy.decide({}, inp)[0] <= I_MAX


@pytest.mark.timeout(180)
def test_minions_end_to_end_for_three_rounds(system, client, pretrained):
    from nitro.rpc.metrics import sample_value, scrape

    path = pretrained[0].path
    status = client.start_training({**JOB, "seed": 5, "scaler": {"policy": "minions", "scheduler": path,
                                                                 "i_min": 1, "i_max": I_MAX}})
    reports = list(client.watch(status.job_id))
    final = client.get(status.job_id)
    assert final.state_name == "SUCCEEDED", final.message
    assert [r.round for r in reports] == [0, 1, 2]
    for r in reports:
        assert 1 <= r.actors_launched <= I_MAX and r.actors_completed == r.actors_launched
        assert 1 <= r.next_actors <= I_MAX
        reason = r.scaler_reason
        assert reason.startswith(f"minions: k={r.round + 1}/3 loss=") and "(argmax" in reason, reason
        assert f"of 1..{I_MAX} actors" in reason and "budget_left=$" in reason
    scaler = scrape(system.components["scaler"].metrics_port)
    assert 1 <= sample_value(scaler["nitro_scheduler_actors"], "nitro_scheduler_actors", job_id=status.job_id) <= I_MAX
    inputs_seen = {s.labels["input"] for s in scaler["nitro_scheduler_input"] if s.labels["job_id"] == status.job_id}
    assert inputs_seen == set(m.OBS_NAMES)


@pytest.mark.timeout(120)
def test_bad_scheduler_checkpoints_are_clear_statuses(system, client, pretrained, tmp_path):
    from nitro.client.sdk import FailedPreconditionError, InvalidArgumentError
    from nitro.rpc.grpc_util import make_channel
    from nitro.v1 import common_pb2, scaler_pb2, scaler_pb2_grpc

    def start(path, i_max=I_MAX):
        return client.start_training({**JOB, "scaler": {"policy": "minions", "scheduler": str(path), "i_min": 1,
                                                        "i_max": i_max}})

    with pytest.raises(InvalidArgumentError, match="scaler.scheduler: no scheduler checkpoint"):
        start(tmp_path / "missing.npz")
    with pytest.raises(InvalidArgumentError, match="scaler.scheduler: is required"):
        start("")
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"\x00" * 64)
    with pytest.raises(InvalidArgumentError, match="scaler.scheduler: .*not a readable scheduler checkpoint"):
        start(garbage)
    # Trained for I_max 4, used with 6: refused up front, before any actor runs.
    with pytest.raises(FailedPreconditionError, match="scaler.scheduler: .*i_max=4"):
        start(pretrained[0].path, i_max=6)

    stub = scaler_pb2_grpc.ActorScalerStub(make_channel(system.components["scaler"].address, token=system.token))

    def plan(path, i_max):
        return stub.Plan(scaler_pb2.PlanRequest(
            job_id="minions-direct", round=0, budget_usd=1.0, steps_per_actor=64,
            scaler=common_pb2.ScalerSpec(policy="minions", scheduler=str(path), i_min=1, i_max=i_max)), timeout=10)

    for path, i_max, code in ((pretrained[0].path, 6, grpc.StatusCode.FAILED_PRECONDITION),
                              (tmp_path / "missing.npz", I_MAX, grpc.StatusCode.INVALID_ARGUMENT),
                              (garbage, I_MAX, grpc.StatusCode.INVALID_ARGUMENT)):
        with pytest.raises(grpc.RpcError) as err:
            plan(path, i_max)
        assert err.value.code() == code and err.value.details().startswith("scaler.scheduler: ")
    assert 1 <= plan(pretrained[0].path, I_MAX).actors <= I_MAX
