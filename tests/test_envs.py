"""Environment construction: registry ids, MuJoCo, ALE, user-registered, unknown ids."""

import gymnasium as gym
import numpy as np
import pytest

from nitro.errors import UnknownEnvironmentError
from nitro.policy.envs import make_env, resolve_env_id


def test_unknown_id_fails_at_once_naming_it():
    with pytest.raises(UnknownEnvironmentError, match="'Hoper-v5'") as err:
        make_env("Hoper-v5")
    assert "Hopper-v5" in err.value.suggestions


def test_module_prefix_that_does_not_import_is_unknown():
    with pytest.raises(UnknownEnvironmentError, match="no_such_module"):
        resolve_env_id("no_such_module:Foo-v0")


@pytest.mark.parametrize("env_id", ["Hopper-v4", "Hopper-v5", "Walker2d-v5", "CartPole-v1"])
def test_registry_and_mujoco_ids(env_id):
    env = make_env(env_id, seed=0)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs.astype(env.observation_space.dtype))
    env.close()


def test_ale_id_registers_ale_and_preprocesses():
    env = make_env("ALE/Qbert-v5", seed=0)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3, 84, 84) and obs.dtype == np.uint8
    env.step(0)
    env.close()


class _Corridor(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 1.0, True, False, {}


def test_user_registered_environment():
    gym.register("NitroTestCorridor-v0", entry_point=_Corridor)
    try:
        env = make_env("NitroTestCorridor-v0", seed=1)
        assert env.step(0)[1] == 1.0
    finally:
        gym.registry.pop("NitroTestCorridor-v0")


def test_module_ids_import_only_allow_listed_modules(monkeypatch, tmp_path):
    (tmp_path / "nitro_test_envmod.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('NitroModEnv-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("NITRO_ENV_MODULES", raising=False)
    with pytest.raises(UnknownEnvironmentError, match="NITRO_ENV_MODULES"):
        resolve_env_id("nitro_test_envmod:NitroModEnv-v0")
    import sys

    assert "nitro_test_envmod" not in sys.modules, "a module not allowed is never imported"
    monkeypatch.setenv("NITRO_ENV_MODULES", "nitro_test_envmod")
    try:
        assert resolve_env_id("nitro_test_envmod:NitroModEnv-v0") == "NitroModEnv-v0"
    finally:
        gym.registry.pop("NitroModEnv-v0", None)


@pytest.mark.parametrize("bad", [":CartPole-v1", ".x:Env-v0"])
def test_malformed_module_ids_are_unknown_not_crashes(monkeypatch, bad):
    monkeypatch.setenv("NITRO_ENV_MODULES", ".x,")
    with pytest.raises(UnknownEnvironmentError):
        resolve_env_id(bad)
