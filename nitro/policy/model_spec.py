"""What describes a policy without torch: its architecture spec and its signed weight blobs.

Actors import only this (and numpy inference, nitro.policy.inference), so a serverless
actor's cold start does not pay for importing torch; the torch modules that
build and train the networks are in nitro.policy.models.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import gymnasium as gym

from nitro.errors import ConfigError

OBS_CLIP = 10.0  # normalised observations are clipped to +-OBS_CLIP standard deviations
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild a policy's architecture (weights travel separately)."""

    obs_shape: tuple[int, ...]
    action_kind: str  # "box" or "discrete"
    action_dim: int  # Box: number of dimensions; Discrete: number of actions
    action_low: tuple[float, ...] | None = None
    action_high: tuple[float, ...] | None = None
    arch: str = "mlp"  # "mlp" or "cnn"
    hidden_sizes: tuple[int, ...] = (256, 256)
    activation: str = "tanh"
    obs_norm: bool = False
    init_log_std: float = 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelSpec":
        d = dict(d)
        for k in ("obs_shape", "hidden_sizes", "action_low", "action_high"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        return cls(**d)


def spec_for_spaces(observation_space: gym.Space, action_space: gym.Space, *, hidden_sizes=(256, 256),
                    activation="tanh", obs_norm=False, init_log_std=0.0, arch: str | None = None) -> ModelSpec:
    """Derive a ModelSpec from an environment's spaces."""
    if not isinstance(observation_space, gym.spaces.Box):
        raise ConfigError(f"unsupported observation space {observation_space}: only Box observations are supported")
    obs_shape = tuple(int(s) for s in observation_space.shape)
    if arch is None:
        arch = "cnn" if len(obs_shape) == 3 else "mlp"
    if arch == "cnn":
        obs_norm = False  # the CNN scales uint8 pixels by 1/255; per-pixel running statistics add nothing
    if isinstance(action_space, gym.spaces.Box):
        if len(action_space.shape) != 1:
            raise ConfigError(f"unsupported action space {action_space}: Box actions must be 1-D")
        return ModelSpec(obs_shape, "box", int(action_space.shape[0]),
                         tuple(float(x) for x in action_space.low), tuple(float(x) for x in action_space.high),
                         arch, tuple(hidden_sizes), activation, obs_norm, init_log_std)
    if isinstance(action_space, gym.spaces.Discrete):
        return ModelSpec(obs_shape, "discrete", int(action_space.n), None, None, arch, tuple(hidden_sizes),
                         activation, obs_norm, init_log_std)
    raise ConfigError(f"unsupported action space {action_space}: use Box or Discrete")


def same_pad(size: int, kernel: int, stride: int) -> tuple[int, int, int]:
    """(left, right, out): TensorFlow/RLlib "same" padding, so the output is ceil(size / stride)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2, out


def atari_geometry(obs_shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, int]]:
    """AtariCNN's F.pad arguments (left, right, top, bottom) of layers 1 and 2, and the map size layer 3 sees."""
    _, h, w = obs_shape
    lh1, rh1, h1 = same_pad(h, 8, 4)
    lw1, rw1, w1 = same_pad(w, 8, 4)
    lh2, rh2, h2 = same_pad(h1, 4, 2)
    lw2, rw2, w2 = same_pad(w1, 4, 2)
    return (lw1, rw1, lh1, rh1), (lw2, rw2, lh2, rh2), (h2, w2)


POLICY_FORMAT = 1


def blob_to_doc(blob: bytes, key: bytes) -> dict:
    """Verify and decode a policy blob into {'version', 'spec' (ModelSpec), 'state'}."""
    from nitro.data import codec

    doc = codec.decode(blob, key)
    if not isinstance(doc, dict) or doc.get("format") != POLICY_FORMAT:
        raise ConfigError(f"unsupported policy blob format {doc.get('format') if isinstance(doc, dict) else None!r}; "
                          f"expected {POLICY_FORMAT}")
    doc["spec"] = ModelSpec.from_dict(doc["spec"])
    return doc
