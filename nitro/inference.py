"""Fast single-observation inference for actors.

At batch size 1 PyTorch's per-op dispatch costs more than the maths of a 2x256
MLP, so MLP policies run in plain numpy here (same weights, same normalisation,
float32). CNN policies use the torch model. Both expose the same `act`/`value`.
"""

from __future__ import annotations

import math

import numpy as np

from nitro.models import LOG_STD_MAX, LOG_STD_MIN, OBS_CLIP, ModelSpec

_LOG_2PI = math.log(2.0 * math.pi)


class NumpyMLP:
    def __init__(self, state: dict[str, np.ndarray], prefix: str, activation: str):
        self.weights = []
        i = 0
        while f"{prefix}.layers.{i}.weight" in state:
            self.weights.append((np.ascontiguousarray(state[f"{prefix}.layers.{i}.weight"].T, dtype=np.float32),
                                 state[f"{prefix}.layers.{i}.bias"].astype(np.float32)))
            i += 1
        self.out_w = np.ascontiguousarray(state[f"{prefix}.out.weight"].T, dtype=np.float32)
        self.out_b = state[f"{prefix}.out.bias"].astype(np.float32)
        self.act = np.tanh if activation == "tanh" else (lambda x: np.maximum(x, 0.0, out=x))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        for w, b in self.weights:
            x = self.act(x @ w + b)
        return x @ self.out_w + self.out_b


class PolicyRunner:
    """Acts with one policy version: `act(obs, rng)` -> (action, log_prob, value)."""

    def __init__(self, spec: ModelSpec, state: dict[str, np.ndarray], version: int):
        self.spec = spec
        self.version = version
        self._torch_policy = None
        if spec.arch == "mlp":
            self.actor = NumpyMLP(state, "actor", spec.activation)
            self.critic = NumpyMLP(state, "critic", spec.activation)
        else:
            import torch

            from nitro.models import Policy

            torch.set_num_threads(1)
            self._torch_policy = Policy(spec)
            self._torch_policy.load_numpy_state(state)
            self._torch_policy.eval()
        self.obs_norm = spec.obs_norm
        if spec.obs_norm:
            self.mean = state["obs_mean"].astype(np.float64)
            self.inv_std = (1.0 / np.sqrt(state["obs_var"] + 1e-8)).astype(np.float64)
        if spec.action_kind == "box":
            log_std = np.clip(state["log_std"].astype(np.float32), LOG_STD_MIN, LOG_STD_MAX)
            self.std = np.exp(log_std)
            self.logp_const = float(-log_std.sum() - 0.5 * _LOG_2PI * spec.action_dim)
            self.low = np.asarray(spec.action_low, dtype=np.float32)
            self.high = np.asarray(spec.action_high, dtype=np.float32)

    @classmethod
    def from_doc(cls, doc: dict) -> "PolicyRunner":
        return cls(doc["spec"], doc["state"], doc["version"])

    def _normalize(self, obs: np.ndarray) -> np.ndarray:
        if not self.obs_norm:
            return np.asarray(obs, dtype=np.float32)
        z = (np.asarray(obs, dtype=np.float64) - self.mean) * self.inv_std
        return np.clip(z, -OBS_CLIP, OBS_CLIP).astype(np.float32)

    def _heads(self, obs: np.ndarray) -> tuple[np.ndarray, float]:
        if self._torch_policy is not None:
            import torch

            with torch.no_grad():
                t = torch.as_tensor(np.asarray(obs)[None])
                out = self._torch_policy.actor(self._torch_policy.normalize(t))[0].numpy()
                value = float(self._torch_policy.value(t)[0])
            return out, value
        x = self._normalize(obs).reshape(-1)
        return self.actor(x), float(self.critic(x)[0])

    def act(self, obs: np.ndarray, rng: np.random.Generator, deterministic: bool = False):
        """Sample an action; returns (action for the batch, log-prob, value estimate)."""
        out, value = self._heads(obs)
        if self.spec.action_kind == "box":
            if deterministic:
                return out.astype(np.float32), 0.0, value
            noise = rng.standard_normal(out.shape[0]).astype(np.float32)
            action = out + self.std * noise
            logp = self.logp_const - 0.5 * float(noise @ noise)
            return action, logp, value
        logits = out.astype(np.float64)
        if deterministic:
            return int(np.argmax(logits)), 0.0, value
        logits = logits - logits.max()
        logz = math.log(np.exp(logits).sum())
        # Gumbel-max: one draw, no cumulative sum.
        a = int(np.argmax(logits - np.log(-np.log(rng.random(logits.shape[0])))))
        return a, float(logits[a] - logz), value

    def env_action(self, action):
        """Map a sampled action to what the environment accepts (Box actions are clipped)."""
        if self.spec.action_kind == "box":
            return np.clip(action, self.low, self.high)
        return action

    def value(self, obs: np.ndarray) -> float:
        return self._heads(obs)[1]
