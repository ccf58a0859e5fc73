"""A policy after training: load it from a learner checkpoint or an export, act with it, export it.

`load_policy(path)` reads either
  - a learner checkpoint, `checkpoint.pt` or `best.pt` (learner_svc.durability.JobFiles.write_checkpoint): a
    torch file with the model spec and the learner's state, read with torch's weights-only loader so
    that a checkpoint from elsewhere cannot run code while it loads; or
  - a directory written by `export_policy` (`nitro export`): policy.json (format, model spec,
    observation normalisation, where the policy came from) beside the weights, as safetensors when
    that package is installed and as numpy .npz otherwise. Reading an export needs no nitro service,
    and no torch for MLP policies.

`pip install nitro-rl` alone (no torch) reads exports of MLP policies and of CNN policies without observation
normalisation; a checkpoint, `module` and a normalised CNN need torch, the training system's extra (each says so).

A TrainedPolicy acts through the actors' own inference (nitro.policy.inference.PolicyRunner), the code the
learner evaluates with, so observation normalisation and action clipping are the training system's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import gymnasium as gym
import numpy as np
from numpy.typing import ArrayLike

from nitro.errors import ConfigError, PolicyError
from nitro.policy.inference import PolicyRunner
from nitro.policy.model_spec import LOG_STD_MAX, LOG_STD_MIN, OBS_CLIP, ModelSpec, spec_for_spaces

EXPORT_FORMAT = "nitro-policy"
EXPORT_VERSION = 1
EXPORT_FILE = "policy.json"
OBS_VAR_EPS = 1e-8  # what nitro.policy.inference.PolicyRunner and nitro.policy.models.Policy add to the variance
SPEC_CHOICES = {"arch": ("mlp", "cnn"), "action_kind": ("box", "discrete"), "activation": ("tanh", "relu")}


class TrainedPolicy:
    """A trained policy: `predict` as in Stable-Baselines3, `module` for the torch model.

    `spec` (nitro.policy.model_spec.ModelSpec), `state` (weights and observation statistics as numpy
    arrays) and `info` (env_id, algo, job_id, round, version, env_steps, where known) describe it.
    """

    def __init__(self, spec: ModelSpec, state: dict[str, np.ndarray], info: dict | None = None,
                 seed: int | None = None):
        self.spec, self.state, self.info = spec, state, dict(info or {})
        self.runner = PolicyRunner(spec, state, int(self.info.get("version") or 0))
        self.rng = np.random.default_rng(seed)  # only stochastic predictions draw from it
        self._module: Any = None

    @property
    def env_id(self) -> str:
        """The environment the policy was trained on ("" when its source does not say)."""
        return self.info.get("env_id") or ""

    @property
    def observation_space(self) -> gym.spaces.Box:
        """The observations the policy takes, as a gymnasium space: uint8 frames in [0, 255] for a CNN
        policy, else float32 of the policy's shape (unbounded: the environment's bounds are not recorded)."""
        shape = tuple(self.spec.obs_shape)
        if self.spec.arch == "cnn":
            return gym.spaces.Box(0, 255, shape, np.uint8)
        return gym.spaces.Box(-np.inf, np.inf, shape, np.float32)

    @property
    def action_space(self) -> gym.spaces.Box | gym.spaces.Discrete:
        """The actions it returns: Discrete(n), or Box with the action bounds it was trained with (float32)."""
        spec = self.spec
        if spec.action_kind == "discrete":
            return gym.spaces.Discrete(spec.action_dim)
        low = np.asarray(spec.action_low if spec.action_low is not None else [-np.inf] * spec.action_dim, np.float32)
        high = np.asarray(spec.action_high if spec.action_high is not None else [np.inf] * spec.action_dim,
                          np.float32)
        return gym.spaces.Box(low, high, (spec.action_dim,), np.float32)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the policy as `nitro export` does: policy.json and the weights in directory `path`, which
        `load_policy(path)` reads back (no nitro service needed). Returns the path of policy.json."""
        return export_policy(self, path)

    @property
    def module(self) -> Any:
        """The torch model (nitro.policy.models.Policy: actor, critic, observation statistics), built on first use."""
        if self._module is None:
            try:
                from nitro.policy.models import Policy
            except ModuleNotFoundError as exc:
                _raise_needs_torch("TrainedPolicy.module (the torch model)", exc)
            module = Policy(self.spec)
            module.load_numpy_state(self.state)
            self._module = module.eval()
        return self._module

    def predict(self, observation: ArrayLike, state: object = None, episode_start: object = None,
                deterministic: bool = False) -> tuple[np.ndarray, None]:
        """(actions, None) for one observation or a batch of them, as Stable-Baselines3's `predict`.

        `observation` is raw, as the environment returns it: this policy normalises it itself. One
        observation gives one action (an int64 scalar array for Discrete, float32 (action_dim,) for
        Box); a batch (n, *obs_shape) gives n of them. deterministic=True takes the argmax or the mean,
        as nitro's evaluation does; False samples. Box actions are clipped to the action bounds.
        `state` and `episode_start` exist for SB3's signature; the policy has no recurrent state.
        """
        obs = np.asarray(observation)
        shape = self.spec.obs_shape
        if obs.shape == shape:
            return self._act(obs, deterministic), None
        if obs.ndim == len(shape) + 1 and obs.shape[1:] == shape:
            if not len(obs):
                box = self.spec.action_kind == "box"
                return np.empty((0, self.spec.action_dim) if box else (0,), np.float32 if box else np.int64), None
            return np.stack([self._act(o, deterministic) for o in obs]), None
        raise PolicyError(f"observation: expected shape {shape} or (n, {', '.join(map(str, shape))}), "
                          f"got {obs.shape}")

    def _act(self, obs: np.ndarray, deterministic: bool) -> np.ndarray:
        action, _, _ = self.runner.act(obs, self.rng, deterministic=deterministic, with_value=False)
        action = self.runner.env_action(action)
        return np.asarray(action, dtype=np.float32 if self.spec.action_kind == "box" else np.int64)

    def check_spaces(self, observation_space: gym.Space[Any], action_space: gym.Space[Any],
                     env_id: str = "the environment") -> None:
        """Raise PolicyError unless the spaces are the ones the policy was trained on."""
        try:
            theirs = spec_for_spaces(observation_space, action_space)
        except ConfigError as exc:
            raise PolicyError(f"{env_id} does not fit the policy: {exc}") from None
        for field in ("obs_shape", "action_kind", "action_dim", "action_low", "action_high"):
            env_value, policy_value = getattr(theirs, field), getattr(self.spec, field)
            if env_value != policy_value:
                raise PolicyError(f"{env_id} does not fit the policy: {field} is {env_value} in the environment, "
                                  f"{policy_value} in the policy (trained on {self.env_id or 'an unknown env'})")


def load_policy(path: str | os.PathLike, seed: int | None = None) -> TrainedPolicy:
    """Load a learner checkpoint (checkpoint.pt, best.pt) or an export directory; `seed` seeds sampling."""
    p = Path(path)
    if not p.exists():
        raise PolicyError(f"{path}: no such file or directory; expected a learner checkpoint (results/<job>/"
                          f"checkpoint.pt or best.pt) or a directory written by `nitro export`")
    spec, state, info = _read_export(p) if p.is_dir() or p.suffix == ".json" else _read_checkpoint(p)
    try:
        policy = TrainedPolicy(spec, state, info, seed=seed)
        # One forward pass: weights that do not fit the spec fail here, not at the first real step.
        policy.predict(np.zeros(spec.obs_shape, np.uint8 if spec.arch == "cnn" else np.float32), deterministic=True)
    except ModuleNotFoundError as exc:  # a CNN with observation normalisation acts through the torch model
        _raise_needs_torch(f"{path}: a CNN policy with observation normalisation", exc)
    except KeyError as exc:
        raise PolicyError(f"{path}: the weights lack {exc} that the model spec needs") from None
    except ValueError as exc:
        raise PolicyError(f"{path}: the weights do not fit the model spec: {exc}") from None
    return policy


def _raise_needs_torch(what: str, exc: ModuleNotFoundError, note: str = "") -> NoReturn:
    """Re-raise `exc` (torch or another module of the training system missing) as the error naming the extra."""
    import nitro

    error = nitro._needs_system(what, exc, note)
    if error is None:
        raise exc
    raise error from None


def _read_checkpoint(path: Path) -> tuple[ModelSpec, dict, dict]:
    import pickle

    try:
        import torch
    except ModuleNotFoundError as exc:
        _raise_needs_torch(f"{path}: reading a learner checkpoint", exc,
                           note="; an export directory (`nitro export` writes one) loads without it")
    if not zipfile.is_zipfile(path):
        raise PolicyError(f"{path}: not a checkpoint: expected the zip archive torch.save writes")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise PolicyError(f"{path}: holds objects other than tensors and plain data; checkpoints are read with "
                          f"torch's weights-only loader, which runs no code from the file") from None
    except Exception as exc:  # a truncated or damaged archive: torch raises several kinds
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise PolicyError(f"{path}: not a readable checkpoint ({type(exc).__name__}: {first})") from None
    learner = ck.get("learner") if isinstance(ck, dict) else None
    if not isinstance(learner, dict) or "model_spec" not in ck or "policy" not in learner:
        raise PolicyError(f"{path}: not a nitro learner checkpoint: it needs 'model_spec' and 'learner' -> 'policy' "
                          f"(what the learner writes as checkpoint.pt and best.pt)")
    train = ck.get("spec") or {}
    info = {"env_id": train.get("env_id", ""), "algo": train.get("algo", ""), "job_id": train.get("job_id", ""),
            "round": ck.get("round"), "version": ck.get("version"), "env_steps": ck.get("env_steps")}
    if train.get("env_kwargs"):  # the training environment's keyword arguments (TrainingSpec.env_kwargs)
        info["env_kwargs"] = dict(train["env_kwargs"])
    state = {k: v.detach().cpu().numpy() for k, v in learner["policy"].items()}
    return _model_spec(ck["model_spec"], path), state, info


def _model_spec(d: Any, where: Path) -> ModelSpec:
    allowed = [f.name for f in dataclasses.fields(ModelSpec)]
    try:
        spec = ModelSpec.from_dict(d)
    except (TypeError, ValueError, AttributeError) as exc:
        raise PolicyError(f"{where}: model_spec: {exc}; fields allowed: {allowed}") from None
    for field, choices in SPEC_CHOICES.items():
        if getattr(spec, field) not in choices:
            raise PolicyError(f"{where}: model_spec.{field}: expected one of {list(choices)}, "
                              f"got {getattr(spec, field)!r}")
    return spec


# -- export --------------------------------------------------------------------------------------


def export_policy(source: TrainedPolicy | str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write policy.json and the weights into `out_dir`; returns the path of policy.json."""
    policy = source if isinstance(source, TrainedPolicy) else load_policy(source)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise PolicyError(f"--out {out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    spec = policy.spec
    doc = {
        "format": EXPORT_FORMAT,
        "format_version": EXPORT_VERSION,
        "weights": _write_weights(out, policy.state),
        "model_spec": spec.to_dict(),
        # Enough to use the weights without nitro: how observations are normalised, how layers are named.
        "observation_normalization": {
            "enabled": spec.obs_norm, "mean": "obs_mean", "var": "obs_var", "epsilon": OBS_VAR_EPS, "clip": OBS_CLIP,
            "applies": "z = clip((obs - mean) / sqrt(var + epsilon), -clip, clip), on the flattened observation "
                       "in float64, then float32; when not enabled the network sees obs as float32",
        },
        "network": "actor and critic are separate: {actor,critic}.layers.{i}.{weight,bias} (torch Linear: out x in) "
                   "with the activation between them, then {actor,critic}.out; cnn: conv1-conv3 and out over uint8 "
                   "frames / 255 (nitro.policy.models.AtariCNN)",
        "actions": "discrete: argmax of the actor's logits (deterministic) or a sample of softmax(logits); box: the "
                   f"actor's output as the mean, plus exp(clip(log_std, {LOG_STD_MIN}, {LOG_STD_MAX})) * N(0, 1) "
                   "when sampling, clipped to [action_low, action_high]",
        "source": policy.info,
    }
    path = out / EXPORT_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def _write_weights(out: Path, state: dict[str, np.ndarray]) -> str:
    """Write the weights as safetensors when the package is installed, else as numpy .npz; returns the name."""
    save_file = _safetensors_writer()
    name = "weights.safetensors" if save_file else "weights.npz"
    tmp = out / (name + ".tmp")
    if save_file:
        # np.ascontiguousarray makes a scalar (obs_count) 1-d: reshape it back, so that the export keeps shapes.
        save_file({k: np.ascontiguousarray(v).reshape(np.shape(v)) for k, v in state.items()}, str(tmp))
    else:
        with open(tmp, "wb") as f:
            arrays: dict[str, Any] = dict(state)  # Any: numpy's stub would take a key for its allow_pickle flag
            np.savez(f, **arrays)
    os.replace(tmp, out / name)
    return name


def _safetensors_writer() -> Callable[[dict[str, np.ndarray], str], None] | None:
    """safetensors' numpy writer, or None without the package."""
    try:
        from safetensors.numpy import save_file
    except ImportError:
        return None
    return save_file


def _read_export(path: Path) -> tuple[ModelSpec, dict, dict]:
    doc_path = path / EXPORT_FILE if path.is_dir() else path
    if not doc_path.is_file():
        raise PolicyError(f"{path}: no {EXPORT_FILE}: not a directory written by `nitro export`")
    try:
        doc = json.loads(doc_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PolicyError(f"{doc_path}: not readable JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise PolicyError(f"{doc_path}: format: expected {EXPORT_FORMAT!r}, got {got!r}")
    if doc.get("format_version") != EXPORT_VERSION:
        raise PolicyError(f"{doc_path}: format_version: this nitro reads {EXPORT_VERSION}, "
                          f"got {doc.get('format_version')!r}")
    name = doc.get("weights")
    if not isinstance(name, str) or Path(name).name != name or Path(name).suffix not in (".npz", ".safetensors"):
        raise PolicyError(f"{doc_path}: weights: expected a .npz or .safetensors file name beside "
                          f"{EXPORT_FILE}, got {name!r}")
    spec = _model_spec(doc.get("model_spec"), doc_path)
    return spec, _read_weights(doc_path.parent / name), dict(doc.get("source") or {})


def _read_weights(path: Path) -> dict[str, np.ndarray]:
    if path.suffix == ".safetensors":
        try:
            from safetensors.numpy import load_file
        except ImportError:
            raise PolicyError(f"{path}: safetensors weights need the safetensors package "
                              f"(pip install safetensors)") from None
    try:
        if path.suffix == ".safetensors":
            return load_file(str(path))
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as exc:  # a missing, truncated or foreign file; numpy and safetensors raise various kinds
        raise PolicyError(f"{path}: weights not readable ({type(exc).__name__}: {exc})") from None
