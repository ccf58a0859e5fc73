"""Every algorithm hyperparameter in one typed, documented place, plus named presets.

A preset is a starting point; any field can be overridden by name
(`ppo_config("tuned", lr=1e-4)`, `impact_config("paper", clip=0.3)`, or per
algorithm name `make_config("impact", "fast")`). Unknown names and out-of-range
values fail with a `ConfigError` naming the field and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Self

from nitro.errors import ConfigError


class _Overridable:
    """`replace(**overrides)` by field name (unknown names are a ConfigError) and `to_dict()`."""

    def replace(self, **overrides) -> Self:
        return dataclasses.replace(self, **_known_fields(type(self), overrides))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PPOConfig(_Overridable):
    """Hyperparameters of PPO with a clipped surrogate and an adaptive KL penalty."""

    # Optimisation.
    lr: float = 3e-4
    """Adam learning rate."""
    adam_eps: float = 1e-5
    """Adam epsilon."""
    epochs: int = 10
    """Passes over the round's batch per update (RLlib: num_sgd_iter)."""
    minibatch_size: int = 256
    """Samples per gradient step; 0 means the whole batch (one step per epoch)."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip; 0 disables clipping."""

    # Returns and advantages.
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda: 1.0 gives Monte-Carlo advantages, 0.0 one-step TD."""
    normalize_advantages: bool = True
    """Standardise advantages per minibatch: (A - mean) / (std + 1e-8) over the minibatch's samples
    (the Stable-Baselines3 convention). The detector repeats it on its sample subset."""
    normalize_batch_advantages: bool = False
    """Standardise advantages once per update over the whole train batch, before the SGD epochs:
    (A - mean) / max(std, 1e-4) with the population std, as RLlib's PPO does. The detector's
    samples carry the standardised advantages. Applied before `normalize_advantages` if both are set."""
    reward_clip: float = 0.0
    """Clip each training reward to [-reward_clip, reward_clip] before advantages are computed
    (the Atari convention: with ALE's integer rewards, 1.0 is the reward's sign); 0 disables.
    Reported train and eval returns stay the environment's unclipped returns."""

    # Loss terms.
    clip: float = 0.2
    """Surrogate clip range epsilon: ratios are clipped to [1-clip, 1+clip]."""
    kl_coeff: float = 0.0
    """Initial coefficient of the KL(old || new) penalty; 0 disables the penalty."""
    kl_target: float = 0.01
    """Target KL per update; the coefficient is adapted towards it after each update."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus."""
    value_coeff: float = 0.5
    """Weight of the value-function loss."""
    value_clip: float = 0.0
    """Value-loss clip parameter, applied as `value_clip_mode` says; 0 disables clipping."""
    value_clip_mode: str = "ppo2"
    """How `value_clip` acts on the value loss L_V (weighted by value_coeff). "ppo2": L_V =
    0.5 * mean(max((V - R)^2, (V_clip - R)^2)) with V_clip = V_old + clip(V - V_old, -value_clip,
    value_clip), the pessimistic PPO2 form around the behaviour value. "rllib": L_V = mean(min((V -
    R)^2, value_clip)), RLlib's vf_clip_param, which caps the squared error itself (and, as RLlib,
    has no 0.5 factor). Set by preset or in Python: the wire's numeric hyperparameters cannot carry it."""

    # Batches.
    batch_size: int = 4096
    """Nominal environment steps per round (actors x steps per actor)."""

    # Model.
    hidden_sizes: tuple[int, ...] = (256, 256)
    """Hidden layer widths of both the actor and the critic MLP."""
    activation: str = "tanh"
    """Hidden activation: tanh or relu."""
    obs_norm: bool = False
    """Normalise observations with running statistics that travel with each policy version."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy (Box actions)."""

    def __post_init__(self) -> None:
        _check_shared(self)
        _check(0.0 <= self.gae_lambda <= 1.0, "gae_lambda", "a number in [0, 1]")
        _check(self.value_clip >= 0, "value_clip", ">= 0")
        _check(self.value_clip_mode in VALUE_CLIP_MODES, "value_clip_mode", f"one of {sorted(VALUE_CLIP_MODES)}")


ACTIVATIONS = {"tanh", "relu"}
VALUE_CLIP_MODES = {"ppo2", "rllib"}
VTRACE_CRITICS = ("online", "target")  # IMPACTConfig.vtrace_critic; the first is the default
# Stellaris's aggregation (the spec's `stellaris` settings validate against these, nitro.spec): the staleness
# weight w(s) (nitro.algos.stellaris.staleness_weight) and the staleness bound's schedule (staleness_bound).
STALENESS_WEIGHTS = ("inverse", "exp", "none")
BOUND_SCHEDULES = ("linear", "geometric", "constant")


def _check(ok: bool, name: str, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"invalid value for {name}: must be {allowed}")


def _check_shared(cfg) -> None:
    """The fields PPOConfig and IMPACTConfig have in common, checked the same way."""
    _check(cfg.lr > 0 and math.isfinite(cfg.lr), "lr", "a finite number > 0")
    _check(cfg.adam_eps > 0, "adam_eps", "> 0")
    _check(cfg.epochs >= 1, "epochs", "an integer >= 1")
    _check(cfg.minibatch_size >= 0, "minibatch_size", "an integer >= 0 (0 = full batch)")
    _check(cfg.max_grad_norm >= 0, "max_grad_norm", ">= 0")
    _check(0.0 <= cfg.gamma <= 1.0, "gamma", "a number in [0, 1]")
    _check(cfg.reward_clip >= 0 and math.isfinite(cfg.reward_clip), "reward_clip", "a finite number >= 0 (0 = off)")
    _check(0.0 < cfg.clip < 1.0, "clip", "a number in (0, 1)")
    _check(cfg.kl_coeff >= 0, "kl_coeff", ">= 0")
    _check(cfg.kl_target > 0, "kl_target", "> 0")
    _check(cfg.entropy_coeff >= 0, "entropy_coeff", ">= 0")
    _check(cfg.value_coeff >= 0, "value_coeff", ">= 0")
    _check(cfg.batch_size >= 1, "batch_size", "an integer >= 1")
    _check(len(cfg.hidden_sizes) >= 1 and all(h >= 1 for h in cfg.hidden_sizes),
           "hidden_sizes", "one or more positive layer widths")
    _check(cfg.activation in ACTIVATIONS, "activation", f"one of {sorted(ACTIVATIONS)}")


def _known_fields(cls, overrides: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ConfigError(f"unknown hyperparameter(s) {unknown} for {cls.__name__}; allowed: {sorted(names)}")
    out = dict(overrides)
    if "hidden_sizes" in out:
        out["hidden_sizes"] = tuple(int(h) for h in out["hidden_sizes"])
    return out


# Paper, Table 1 (PPO column). What the table leaves open follows RLlib's PPO defaults and
# semantics, which the paper says it used: lambda 1.0, 30 SGD epochs, minibatch 128, no grad
# clip, advantages standardised once over the train batch (not per minibatch), the squared
# value error capped at vf_clip_param 10 (no 0.5 factor), and for Atari rewards clipped to their sign.
PPO_PRESETS: dict[str, PPOConfig] = {
    "paper": PPOConfig(
        lr=5e-5, gamma=0.99, gae_lambda=1.0, clip=0.3, kl_coeff=0.2, kl_target=0.01,
        entropy_coeff=0.0, value_coeff=1.0, batch_size=4096, epochs=30, minibatch_size=128,
        max_grad_norm=0.0, normalize_advantages=False, normalize_batch_advantages=True,
        value_clip=10.0, value_clip_mode="rllib",
    ),
    "paper-atari": PPOConfig(
        lr=5e-5, gamma=0.99, gae_lambda=1.0, clip=0.3, kl_coeff=0.2, kl_target=0.01,
        entropy_coeff=0.0, value_coeff=1.0, batch_size=256, epochs=30, minibatch_size=128,
        max_grad_norm=0.0, normalize_advantages=False, normalize_batch_advantages=True,
        value_clip=10.0, value_clip_mode="rllib", reward_clip=1.0,
    ),
    # Stable-Baselines3-like settings that visibly learn MuJoCo within a few hundred
    # thousand steps on a laptop-class CPU; the demo default.
    "tuned": PPOConfig(
        lr=3e-4, gamma=0.99, gae_lambda=0.95, clip=0.2, kl_coeff=0.0, kl_target=0.01,
        entropy_coeff=0.0, value_coeff=0.5, batch_size=4096, epochs=10, minibatch_size=256,
        max_grad_norm=0.5, normalize_advantages=True, obs_norm=True,
    ),
    # Small and quick: learns CartPole-v1 in well under 100k steps; used by tests.
    "fast": PPOConfig(
        lr=1e-3, gamma=0.99, gae_lambda=0.95, clip=0.2, kl_coeff=0.0, kl_target=0.01,
        entropy_coeff=0.0, value_coeff=0.5, batch_size=2048, epochs=10, minibatch_size=256,
        max_grad_norm=0.5, normalize_advantages=True,
    ),
}


@dataclass(frozen=True)
class IMPACTConfig(_Overridable):
    """Hyperparameters of IMPACT (Luo et al. 2020): V-trace, a clipped surrogate against a
    target network, truncated importance weights, and an adaptive KL(target || current) penalty."""

    # Optimisation.
    lr: float = 5e-4
    """Adam learning rate."""
    adam_eps: float = 1e-8
    """Adam epsilon."""
    epochs: int = 1
    """Passes over the update's batches (RLlib: num_sgd_iter)."""
    minibatch_size: int = 0
    """Samples per gradient step; 0 means the whole batch (one step per epoch)."""
    max_grad_norm: float = 40.0
    """Global gradient-norm clip; 0 disables clipping."""

    # V-trace.
    gamma: float = 0.99
    """Discount factor."""
    rho_bar: float = 1.0
    """V-trace truncation of the importance weight in the value targets (rho-bar)."""
    c_bar: float = 1.0
    """V-trace truncation of the trace-cutting coefficients (c-bar)."""
    pg_rho_bar: float = 1.0
    """Truncation of the importance weight pi_target / mu inside the policy-gradient advantages
    (the only place the policy gradient applies that weight)."""
    normalize_advantages: bool = False
    """Standardise advantages per minibatch."""
    reward_clip: float = 0.0
    """Clip each training reward to [-reward_clip, reward_clip] before advantages are computed
    (the Atari convention: with ALE's integer rewards, 1.0 is the reward's sign); 0 disables.
    Reported train and eval returns stay the environment's unclipped returns."""
    vtrace_critic: str = "online"
    """Whose critic gives V-trace its values V(x). "online" (RLlib APPO's semantics): the critic being
    trained, on the batch observations and on the bootstrap observations the actors ship (truncations'
    final observations, the observation after the batch's last step), recomputed before every minibatch
    step, so each step's targets and advantages come from the critic as the previous step left it.
    "target": the target network's critic on the batch observations, once per update, bootstrapped
    from the values the actor's critic computed (`final_values`, `bootstrap_value`): the behaviour
    before the online critic, kept for comparisons. The importance weights are the target network's
    either way. A string: set it with the spec's vtrace_critic field (or by preset, or in Python)."""

    # Loss terms.
    clip: float = 0.4
    """Surrogate clip range epsilon: the ratio pi_theta / pi_target (see is_ratio_clip) is clipped
    to [1-clip, 1+clip]."""
    is_ratio_clip: float = 2.0
    """Clamp on mu / pi_target inside the surrogate's ratio, as RLlib's APPO (fixed 2 there):
    r = min(is_ratio_clip, mu / pi_target) * pi_theta / mu = pi_theta / max(pi_target, mu / is_ratio_clip)."""
    kl_coeff: float = 1.0
    """Initial coefficient of the KL(target || current) penalty; 0 disables the penalty."""
    kl_target: float = 0.01
    """Target KL per update; the coefficient is adapted towards it after each update."""
    entropy_coeff: float = 0.01
    """Weight of the entropy bonus."""
    value_coeff: float = 1.0
    """Weight of the value-function loss 0.5 * (V - v_s)^2."""

    # Target network and replay.
    target_update_freq: int = 1
    """Learner updates between refreshes of the target network from the current policy."""
    replay_capacity: int = 16
    """Recent actor batches kept for replay when no fresh batch is waiting; 0 disables replay."""
    replay_max_reuse: int = 2
    """Times one stored batch may be replayed before it is dropped from the buffer."""

    # Batches.
    batch_size: int = 4096
    """Nominal environment steps per round (actors x steps per actor)."""

    # Model.
    hidden_sizes: tuple[int, ...] = (256, 256)
    """Hidden layer widths of both the actor and the critic MLP."""
    activation: str = "tanh"
    """Hidden activation: tanh or relu."""
    obs_norm: bool = False
    """Normalise observations with running statistics that travel with each policy version."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy (Box actions)."""

    def __post_init__(self) -> None:
        _check_shared(self)
        for name in ("rho_bar", "c_bar", "pg_rho_bar", "is_ratio_clip"):
            value = getattr(self, name)
            _check(value > 0 and math.isfinite(value), name, "a finite number > 0")
        _check(self.target_update_freq >= 1, "target_update_freq", "an integer >= 1")
        _check(self.replay_capacity >= 0, "replay_capacity", "an integer >= 0 (0 = no replay)")
        _check(self.replay_max_reuse >= 1, "replay_max_reuse", "an integer >= 1")
        _check(self.vtrace_critic in VTRACE_CRITICS, "vtrace_critic", f"one of {list(VTRACE_CRITICS)}")


# Paper, Table 1 (IMPACT column): lr 5e-4, gamma 0.99, clip 0.4, KL coeff 1.0, KL target 0.01,
# entropy 0.01, value coeff 1.0, batch 4096 (MuJoCo) / 256 (Atari), target update every update.
# What the table leaves open follows RLlib's APPO/IMPALA defaults, which the paper says it used:
# one SGD pass over the whole batch, grad clip 40, V-trace rho-bar = c-bar = pg-rho-bar = 1,
# the behaviour/target ratio inside the surrogate's ratio clamped at 2, no advantage
# normalisation, Adam eps 1e-8, and for Atari rewards clipped to their sign.
_IMPACT_PAPER = IMPACTConfig(
    lr=5e-4, gamma=0.99, clip=0.4, kl_coeff=1.0, kl_target=0.01, entropy_coeff=0.01, value_coeff=1.0,
    batch_size=4096, target_update_freq=1, rho_bar=1.0, c_bar=1.0,
    epochs=1, minibatch_size=0, max_grad_norm=40.0, pg_rho_bar=1.0, is_ratio_clip=2.0, normalize_advantages=False,
)
IMPACT_PRESETS: dict[str, IMPACTConfig] = {
    "paper": _IMPACT_PAPER,
    "paper-atari": _IMPACT_PAPER.replace(batch_size=256, reward_clip=1.0),
    # Settings that learn MuJoCo at the demo's scale: several minibatch epochs per batch (the
    # target network keeps each update proximal), observation normalisation, PPO-like clip.
    "tuned": IMPACTConfig(
        lr=3e-4, epochs=4, minibatch_size=256, max_grad_norm=0.5, clip=0.2, kl_coeff=0.2, kl_target=0.01,
        entropy_coeff=0.0, value_coeff=0.5, normalize_advantages=True, obs_norm=True, batch_size=4096,
    ),
    # Small and quick: learns CartPole-v1 well within 100k steps; used by tests.
    "fast": IMPACTConfig(
        lr=1e-3, epochs=4, minibatch_size=256, max_grad_norm=0.5, clip=0.2, kl_coeff=0.2, kl_target=0.01,
        entropy_coeff=0.0, value_coeff=0.5, normalize_advantages=True, batch_size=2048,
    ),
}


def ppo_config(preset: str = "tuned", **overrides) -> PPOConfig:
    """The named PPO preset with `overrides` applied."""
    if preset not in PPO_PRESETS:
        raise ConfigError(f"unknown PPO preset {preset!r}; allowed: {sorted(PPO_PRESETS)}")
    return PPO_PRESETS[preset].replace(**overrides)


def impact_config(preset: str = "tuned", **overrides) -> IMPACTConfig:
    """The named IMPACT preset with `overrides` applied."""
    if preset not in IMPACT_PRESETS:
        raise ConfigError(f"unknown IMPACT preset {preset!r}; allowed: {sorted(IMPACT_PRESETS)}")
    return IMPACT_PRESETS[preset].replace(**overrides)


CONFIG_CLASSES: dict[str, type] = {"ppo": PPOConfig, "impact": IMPACTConfig}
ALGO_PRESETS: dict[str, dict] = {"ppo": PPO_PRESETS, "impact": IMPACT_PRESETS}
# One line on each preset's purpose (`nitro presets` prints it beside the fields the preset changes).
ALGO_PRESET_NOTES: dict[str, dict[str, str]] = {
    "ppo": {"paper": "the paper's Table 1, RLlib semantics where it is silent",
            "paper-atari": "paper, with Atari's 256-step batch and rewards clipped to their sign",
            "tuned": "Stable-Baselines3-like, learns MuJoCo in a few hundred thousand steps (the default)",
            "fast": "small and quick, learns CartPole-v1 in well under 100k steps"},
    "impact": {"paper": "the paper's Table 1, RLlib APPO/IMPALA semantics where it is silent",
               "paper-atari": "paper, with Atari's 256-step batch and rewards clipped to their sign",
               "tuned": "learns MuJoCo at the demo's scale: minibatch epochs, observation normalisation (the default)",
               "fast": "small and quick, learns CartPole-v1 well within 100k steps"},
}


def make_config(algo: str, preset: str, **overrides) -> PPOConfig | IMPACTConfig:
    """The config of algorithm `algo` ("ppo" or "impact") from its named preset plus overrides."""
    if algo not in ALGO_PRESETS:
        raise ConfigError(f"unknown algorithm {algo!r}; allowed: {sorted(ALGO_PRESETS)}")
    return {"ppo": ppo_config, "impact": impact_config}[algo](preset, **overrides)


def preset_names(algo: str = "ppo") -> list[str]:
    return sorted(ALGO_PRESETS[algo])


def config_fields(cls=PPOConfig) -> list[dataclasses.Field]:
    return list(dataclasses.fields(cls))


__all__ = ["PPOConfig", "PPO_PRESETS", "ppo_config", "IMPACTConfig", "IMPACT_PRESETS", "impact_config",
           "CONFIG_CLASSES", "ALGO_PRESETS", "make_config", "preset_names", "config_fields"]
