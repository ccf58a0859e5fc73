"""Named environment presets: the paper's six environments x {PPO, IMPACT}, selectable by name.

An environment preset bundles what a job on that environment needs besides the
algorithm's hyperparameters: the env id, the algorithm and its preset (plus
overrides), the steps each actor samples per round and the actor range. Name
one as the training spec's `preset` ("hopper-ppo", "qbert-impact", ...; CLI
`--preset`, SDK `{"preset": ...}`); `nitro.spec` expands it and anything the
spec sets explicitly wins (a conflicting env_id or algo is an error).

Batch sizes follow the paper (Table 1): 4096 steps per round for MuJoCo, 256 for
Atari, reached at I_min = 8 actors (paper 8.1: I_min = 8, I_max = 64), so
steps_per_actor is 512 and 32; boosting to 64 actors gives 8x that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

from nitro.errors import ConfigError


@dataclass(frozen=True)
class EnvPreset:
    name: str
    env_id: str
    algo: str
    algo_preset: str
    steps_per_actor: int
    i_min: int = 8
    i_max: int = 64
    eval_episodes: int = 5
    hyperparameters: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    description: str = ""


def _mujoco(short: str, env_id: str) -> list[EnvPreset]:
    # "tuned" rather than "paper": Table 1's PPO learning rate (5e-5) barely moves in a short run.
    return [EnvPreset(f"{short}-{algo}", env_id, algo, "tuned", steps_per_actor=512,
                      description=f"{env_id}, {algo.upper()} tuned preset, 8 x 512 = 4096 steps at I_min")
            for algo in ("ppo", "impact")]


def _atari(short: str, env_id: str) -> list[EnvPreset]:
    # Atari episodes are thousands of steps; one deterministic evaluation episode per round keeps rounds short.
    return [EnvPreset(f"{short}-{algo}", env_id, algo, "paper-atari", steps_per_actor=32, eval_episodes=1,
                      description=f"{env_id}, {algo.upper()} paper-atari preset (Table 1), 8 x 32 = 256 steps at I_min")
            for algo in ("ppo", "impact")]


ENV_PRESETS: dict[str, EnvPreset] = {p.name: p for p in [
    *_mujoco("hopper", "Hopper-v5"),
    *_mujoco("walker2d", "Walker2d-v5"),
    *_mujoco("humanoid", "Humanoid-v5"),
    *_atari("spaceinvaders", "ALE/SpaceInvaders-v5"),
    *_atari("qbert", "ALE/Qbert-v5"),
    *_atari("gravitar", "ALE/Gravitar-v5"),
]}


def is_env_preset(name) -> bool:
    return isinstance(name, str) and name in ENV_PRESETS  # any value: SDK dicts are checked with it before typing


def env_preset_names() -> list[str]:
    return sorted(ENV_PRESETS)


def resolve_preset(name: str) -> EnvPreset:
    """The environment preset called `name`; ConfigError listing the names otherwise."""
    try:
        return ENV_PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown environment preset {name!r}; allowed: {env_preset_names()}") from None
