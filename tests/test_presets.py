"""Environment presets: the paper's six environments x {PPO, IMPACT}, expanded by nitro.spec."""

import pytest

from nitro.config import IMPACTConfig, PPOConfig
from nitro.errors import ConfigError
from nitro.presets import ENV_PRESETS, env_preset_names, resolve_preset
from nitro.spec import InvalidSpec, ScalerSettings, TrainingSpec, algo_config, from_proto, to_proto, validate

ENVS = {"hopper": "Hopper-v5", "walker2d": "Walker2d-v5", "humanoid": "Humanoid-v5",
        "spaceinvaders": "ALE/SpaceInvaders-v5", "qbert": "ALE/Qbert-v5", "gravitar": "ALE/Gravitar-v5"}


def test_registry_covers_six_environments_and_both_algorithms():
    assert set(env_preset_names()) == {f"{e}-{a}" for e in ENVS for a in ("ppo", "impact")}
    for name, p in ENV_PRESETS.items():
        assert p.env_id == ENVS[name.rsplit("-", 1)[0]] and p.algo == name.rsplit("-", 1)[1]
        atari = p.env_id.startswith("ALE/")
        # Table 1 batch sizes at I_min: 4096 MuJoCo, 256 Atari.
        assert p.i_min * p.steps_per_actor == (256 if atari else 4096)
        assert (p.i_min, p.i_max) == (8, 64)
        assert algo_config(TrainingSpec(preset=name)).batch_size == (256 if atari else 4096)


def test_resolve_unknown_lists_names():
    assert resolve_preset("qbert-impact").env_id == "ALE/Qbert-v5"
    with pytest.raises(ConfigError, match="hopper-ppo"):
        resolve_preset("hopper")


@pytest.mark.parametrize("name", sorted(ENV_PRESETS))
def test_every_preset_validates(name):
    spec = validate(TrainingSpec(preset=name))
    p = ENV_PRESETS[name]
    assert (spec.env_id, spec.algo, spec.preset, spec.steps_per_actor) == (p.env_id, p.algo, p.algo_preset,
                                                                            p.steps_per_actor)
    assert isinstance(algo_config(spec), IMPACTConfig if p.algo == "impact" else PPOConfig)


def test_explicit_fields_win_and_hyperparameters_merge():
    spec = validate(TrainingSpec(preset="hopper-impact", steps_per_actor=100, hyperparameters={"lr": 1e-4},
                                 scaler=ScalerSettings(i_max=16)))
    assert spec.steps_per_actor == 100 and spec.scaler.i_max == 16 and spec.scaler.i_min == 8
    cfg = algo_config(spec)
    assert isinstance(cfg, IMPACTConfig) and cfg.lr == 1e-4


def test_contradicting_env_or_algo_is_an_error():
    with pytest.raises(InvalidSpec, match="env_id"):
        validate(TrainingSpec(env_id="CartPole-v1", preset="hopper-ppo"))
    assert validate(TrainingSpec(env_id="Hopper-v5", preset="hopper-ppo")).algo == "ppo"  # agreeing is fine


def test_wire_path_knows_what_was_set():
    from nitro.v1 import training_pb2

    msg = training_pb2.TrainingSpec(preset="qbert-impact", steps_per_actor=256)  # 256 is the dataclass default
    spec = from_proto(msg)
    assert (spec.env_id, spec.algo, spec.preset, spec.steps_per_actor, spec.eval_episodes) == (
        "ALE/Qbert-v5", "impact", "paper-atari", 256, 1)
    with pytest.raises(InvalidSpec, match="algo"):
        from_proto(training_pb2.TrainingSpec(preset="qbert-impact", algo="ppo"))
    assert from_proto(to_proto(validate(TrainingSpec(preset="walker2d-ppo")))).env_id == "Walker2d-v5"


def test_algorithm_presets_are_checked_per_algorithm():
    assert isinstance(algo_config(validate(TrainingSpec(env_id="CartPole-v1", algo="impact", preset="fast"))),
                      IMPACTConfig)
    with pytest.raises(InvalidSpec, match="preset"):
        validate(TrainingSpec(env_id="CartPole-v1", algo="impact", preset="nope"))
    with pytest.raises(InvalidSpec, match="hyperparameters"):
        validate(TrainingSpec(env_id="CartPole-v1", algo="impact", preset="fast", hyperparameters={"gae_lambda": 1}))
    spec = validate(TrainingSpec(env_id="CartPole-v1", algo="impact", preset="fast",
                                 hyperparameters={"target_update_freq": 4.0, "normalize_advantages": 0.0}))
    cfg = algo_config(spec)
    assert cfg.target_update_freq == 4 and isinstance(cfg.target_update_freq, int) and cfg.normalize_advantages is False
    with pytest.raises(InvalidSpec, match="algo"):
        validate(TrainingSpec(env_id="CartPole-v1", algo="sac"))


def test_atari_ppo_presets_use_rllib_semantics_and_mujoco_ones_stay_tuned():
    # paper-atari claims RLlib's PPO: advantages standardised over the batch, squared value error capped.
    for name, p in ENV_PRESETS.items():
        if p.algo != "ppo":
            continue
        cfg = algo_config(TrainingSpec(preset=name))
        rllib = p.algo_preset == "paper-atari"
        assert (cfg.normalize_batch_advantages, cfg.normalize_advantages, cfg.value_clip_mode) == (
            (True, False, "rllib") if rllib else (False, True, "ppo2")), name
