"""Policy models: a separate actor and critic, plus observation statistics.

The actor is a diagonal Gaussian for Box action spaces and a categorical for
Discrete ones; the critic is a separate network of the same shape (paper 8.1:
2x256 Tanh for MuJoCo). Observation normalisation statistics are buffers of the
model, so they are serialised with every policy version and actors and learner
always normalise identically.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Normal
from torch.nn import functional as F

from nitro.errors import ConfigError
from nitro.policy import cpu_ops

# Torch-free pieces live in nitro.policy.model_spec so actors can load policies without importing torch.
from nitro.policy.model_spec import (  # noqa: F401  (re-exported)
    LOG_STD_MAX,
    LOG_STD_MIN,
    OBS_CLIP,
    POLICY_FORMAT,
    ModelSpec,
    atari_geometry,
    blob_to_doc,
    same_pad,
    spec_for_spaces,
)


class Tanh(nn.Tanh):
    """nn.Tanh by `cpu_ops.tanh` (numpy's kernel on CPU); no parameters, so state dicts are unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_ops.tanh(x)


def _activation(name: str) -> type[nn.Module]:
    return {"tanh": Tanh, "relu": nn.ReLU}[name]


def _init(layer: nn.Module, gain: float) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class MLP(nn.Module):
    """Hidden layers then a linear head; layer names are stable so numpy actors can load them.

    Observations of `obs_ndim` dimensions other than 1 (a (4, 4) Box, a scalar) are flattened first,
    as the numpy actors flatten them."""

    def __init__(self, in_dim: int, hidden: tuple[int, ...], out_dim: int, activation: str, out_gain: float,
                 obs_ndim: int = 1):
        super().__init__()
        dims = (in_dim, *hidden)
        self.obs_ndim = obs_ndim
        self.layers = nn.ModuleList(_init(nn.Linear(a, b), math.sqrt(2)) for a, b in zip(dims[:-1], dims[1:]))
        self.act = _activation(activation)()
        self.out = _init(nn.Linear(dims[-1], out_dim), out_gain)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.obs_ndim != 1:
            x = x.reshape(*x.shape[:x.dim() - self.obs_ndim], -1)
        for layer in self.layers:
            x = self.act(cpu_ops.linear(x, layer.weight, layer.bias))  # oneDNN on CPU (see cpu_ops)
        return cpu_ops.linear(x, self.out.weight, self.out.bias)


def atari_cnn_forward(x: torch.Tensor, p: dict[str, torch.Tensor], geometry) -> torch.Tensor:
    """AtariCNN as a function of its parameters (names as in its state_dict), so actors can run it unbuilt."""
    pads = geometry[:2]
    x = F.relu(F.conv2d(F.pad(x.float() / 255.0, pads[0]), p["conv1.weight"], p["conv1.bias"], stride=4))
    x = F.relu(F.conv2d(F.pad(x, pads[1]), p["conv2.weight"], p["conv2.bias"], stride=2))
    # conv3's kernel covers the whole map, so it is one matmul; as a linear layer it skips
    # oneDNN's slow path for a 1x1-output convolution (same result, ~15x faster at batch 1).
    x = F.relu(cpu_ops.linear(x.flatten(1), p["conv3.weight"].flatten(1), p["conv3.bias"]))
    return cpu_ops.linear(x, p["out.weight"], p["out.bias"])


def fuse_atari_cnns(actor: dict[str, torch.Tensor], critic: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Parameters of an actor and a critic AtariCNN (state_dict names, no net prefix) for `atari_cnn_pair_forward`.

    Prepared once per policy load: conv1 of both nets as one conv with their output channels
    concatenated and the 1/255 input scaling folded into its weights; conv2 of both as one
    grouped conv (groups=2: the actor's channels see only the actor's, the critic's the critic's);
    conv3 as two matmuls. The learner's modules and the weight blobs are untouched.
    """
    cat = lambda name: torch.cat([actor[name], critic[name]]).contiguous()  # noqa: E731
    fused = {"conv1.weight": cat("conv1.weight") / 255.0, "conv1.bias": cat("conv1.bias"),
             "conv2.weight": cat("conv2.weight"), "conv2.bias": cat("conv2.bias")}
    for net, p in (("actor", actor), ("critic", critic)):
        fused[f"{net}.conv3.weight"] = p["conv3.weight"].flatten(1).contiguous()
        for name in ("conv3.bias", "out.weight", "out.bias"):
            fused[f"{net}.{name}"] = p[name]
    return fused


def atari_cnn_pair_forward(x: torch.Tensor, fused: dict[str, torch.Tensor],
                           geometry) -> tuple[torch.Tensor, torch.Tensor]:
    """The actor's and the critic's `atari_cnn_forward` on the same uint8 observations in one pass.

    `fused` from `fuse_atari_cnns`. Returns (actor outputs (N, out), critic outputs (N, 1)), equal to the
    two separate forwards up to float rounding (~1e-6). On one core the convolutions dominate, and the narrow
    16- and 32-channel layers run faster as one 32-channel conv and one grouped 64-channel conv than as four
    convs (~0.35 vs ~0.49 ms per observation at batch 16-32).
    """
    pads = geometry[:2]
    x = F.relu(F.conv2d(F.pad(x.float(), pads[0]), fused["conv1.weight"], fused["conv1.bias"], stride=4))
    x = F.relu(F.conv2d(F.pad(x, pads[1]), fused["conv2.weight"], fused["conv2.bias"], stride=2, groups=2))
    half = x.shape[1] // 2  # channels [0, half) are the actor's map, [half, 2 * half) the critic's
    outs = []
    for net, h in (("actor", x[:, :half]), ("critic", x[:, half:])):
        h = F.relu(cpu_ops.linear(h.reshape(len(h), -1), fused[f"{net}.conv3.weight"], fused[f"{net}.conv3.bias"]))
        outs.append(cpu_ops.linear(h, fused[f"{net}.out.weight"], fused[f"{net}.out.bias"]))
    return outs[0], outs[1]


class OneDNNAtariCNNs:
    """Inference-only forward of k AtariCNNs on the same uint8 observations (the actor, or actor and critic),
    with every weight reordered once into oneDNN's blocked layout and each ReLU fused into its layer.

    Built once per policy version, its weights laid out for batches of `batch` rows (other row counts work too,
    a little slower). Layer 1 of the k nets is one convolution (output channels concatenated, 1/255 folded into the
    weights), layer 2 one grouped convolution (groups=k), then each net's last layer and head. Against
    `atari_cnn_pair_forward` on dense weights it skips oneDNN's per-call weight reorders (the 3,872x256
    layer's 4 MB each), the separate ReLU passes and, where "same" padding is symmetric, the padded copy of
    the input: at batch 16 on one thread, 84 against 112 us an observation for the pair, 50 for the actor
    alone, with hot caches; in the sampling loop, where the envs' steps evict the weights between forwards,
    Qbert's ratio at 16 envs rose from 0.651 to 0.700 (bench/atari_sampling.py, medians of 3 alternating
    runs, 2026-11-27). Outputs equal the nets' own to float rounding (tests/test_atari.py).
    """

    @torch.no_grad()
    def __init__(self, nets: list[dict[str, torch.Tensor]], geometry, batch: int):
        mk, k = torch.ops.mkldnn, len(nets)
        (left, right, top, bottom), self.mid_pad = geometry[:2]
        # Symmetric padding goes into the convolution itself; asymmetric ("same" with an odd total) is a copy.
        symmetric = left == right and top == bottom
        self.in_pad, self.pad1 = (None, [top, left]) if symmetric else (geometry[0], [0, 0])
        cat = lambda name: torch.cat([p[name] for p in nets]).contiguous()  # noqa: E731
        self.conv1 = (mk._reorder_convolution_weight(cat("conv1.weight") / 255.0, self.pad1,
                                                     [4, 4], [1, 1], 1, None), cat("conv1.bias"))
        self.conv2 = (mk._reorder_convolution_weight(cat("conv2.weight"), [0, 0], [2, 2], [1, 1], k, None),
                      cat("conv2.bias"))
        self.k, self.half = k, self.conv2[1].shape[0] // k
        self.heads = [(mk._reorder_linear_weight(p["conv3.weight"].flatten(1).contiguous(), batch),
                       p["conv3.bias"].contiguous(), p["out.weight"], p["out.bias"]) for p in nets]

    @staticmethod
    def available() -> bool:
        """oneDNN's prepacking and fused ops are there and not switched off (NITRO_CPU_OPS=0)."""
        return cpu_ops.ENABLED and cpu_ops.ONEDNN_PACKED

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """One output per net, (N, out) each, for uint8 observations (N, C, H, W)."""
        mk = torch.ops.mkldnn
        x = x.float() if self.in_pad is None else F.pad(x.float(), self.in_pad)
        x = mk._convolution_pointwise(x, *self.conv1, self.pad1, [4, 4], [1, 1], 1, "relu", [], "")
        x = mk._convolution_pointwise(F.pad(x, self.mid_pad), *self.conv2, [0, 0], [2, 2], [1, 1], self.k,
                                      "relu", [], "")
        outs = []
        for i, (w3, b3, wo, bo) in enumerate(self.heads):
            h = x[:, i * self.half:(i + 1) * self.half].reshape(len(x), -1)
            outs.append(F.linear(mk._linear_pointwise(h, w3, b3, "relu", [], ""), wo, bo))
        return outs


class AtariCNN(nn.Module):
    """Paper 8.1: three conv layers (8x8, 4x4, 11x11 kernels, ReLU) over stacked 84x84 frames.

    Widths, strides and padding follow RLlib's default 84x84 filters, which the paper used:
    16 8x8/4 and 32 4x4/2 with "same" padding (84 -> 21 -> 11), then 256 11x11/1 "valid",
    which collapses the 11x11 map to a 256-vector. Without the padding the second map is
    9x9 and an 11x11 kernel does not fit. For other screen sizes the last kernel is the
    remaining map size, so it still ends at 1x1. Observations arrive as uint8 and are
    scaled to [0, 1] here.
    """

    def __init__(self, obs_shape: tuple[int, ...], out_dim: int, out_gain: float):
        super().__init__()
        c = obs_shape[0]
        self.geometry = atari_geometry(obs_shape)
        h2, w2 = self.geometry[2]
        self.conv1 = _init(nn.Conv2d(c, 16, 8, stride=4), math.sqrt(2))
        self.conv2 = _init(nn.Conv2d(16, 32, 4, stride=2), math.sqrt(2))
        self.conv3 = _init(nn.Conv2d(32, 256, (h2, w2)), math.sqrt(2))
        self.out = _init(nn.Linear(256, out_dim), out_gain)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return atari_cnn_forward(x, dict(self.named_parameters()), self.geometry)


def _body(spec: ModelSpec, out_dim: int, out_gain: float) -> nn.Module:
    if spec.arch == "cnn":
        return AtariCNN(spec.obs_shape, out_dim, out_gain)
    if spec.arch == "mlp":
        return MLP(int(np.prod(spec.obs_shape)), spec.hidden_sizes, out_dim, spec.activation, out_gain,
                   obs_ndim=len(spec.obs_shape))
    raise ConfigError(f"unknown model arch {spec.arch!r}; allowed: ['cnn', 'mlp']")


class Policy(nn.Module):
    """Actor + critic + observation statistics: the unit that is versioned and shipped."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.actor = _body(spec, spec.action_dim, 0.01)
        self.critic = _body(spec, 1, 1.0)
        if spec.action_kind == "box":
            self.log_std = nn.Parameter(torch.full((spec.action_dim,), float(spec.init_log_std)))
        flat = int(np.prod(spec.obs_shape))
        self.register_buffer("obs_mean", torch.zeros(flat, dtype=torch.float64))
        self.register_buffer("obs_var", torch.ones(flat, dtype=torch.float64))
        self.register_buffer("obs_count", torch.tensor(1e-4, dtype=torch.float64))

    # -- observation normalisation -------------------------------------------------
    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.spec.obs_norm:
            return obs if self.spec.arch == "cnn" else obs.float()
        shape = obs.shape
        flat = obs.reshape(shape[0], -1).double()
        z = (flat - self.obs_mean) / torch.sqrt(self.obs_var + 1e-8)
        return z.clamp(-OBS_CLIP, OBS_CLIP).float().reshape(shape)

    @torch.no_grad()
    def update_obs_stats(self, obs: np.ndarray) -> None:
        """Merge a batch of raw observations into the running mean/variance (parallel algorithm)."""
        if not self.spec.obs_norm or len(obs) == 0:
            return
        x = torch.as_tensor(np.asarray(obs, dtype=np.float64).reshape(len(obs), -1), device=self.obs_mean.device)
        b_mean, b_var, b_n = x.mean(0), x.var(0, unbiased=False), float(len(obs))
        n = float(self.obs_count)
        delta = b_mean - self.obs_mean
        tot = n + b_n
        self.obs_mean += delta * b_n / tot
        self.obs_var.copy_((self.obs_var * n + b_var * b_n + delta.pow(2) * n * b_n / tot) / tot)
        self.obs_count.fill_(tot)

    # -- distributions ---------------------------------------------------------------
    def distribution(self, obs: torch.Tensor) -> torch.distributions.Distribution:
        out = self.actor(self.normalize(obs))
        if self.spec.action_kind == "box":
            std = self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp().expand_as(out)
            return Normal(out, std)
        return Categorical(logits=out)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.normalize(obs)).squeeze(-1)

    def log_prob(self, dist: torch.distributions.Distribution, actions: torch.Tensor) -> torch.Tensor:
        lp = dist.log_prob(actions)
        return lp.sum(-1) if self.spec.action_kind == "box" else lp

    def entropy(self, dist: torch.distributions.Distribution) -> torch.Tensor:
        ent = dist.entropy()
        return ent.sum(-1) if self.spec.action_kind == "box" else ent

    # -- weights ---------------------------------------------------------------------
    def numpy_state(self) -> dict[str, np.ndarray]:
        return {k: v.detach().cpu().numpy().copy() for k, v in self.state_dict().items()}

    def load_numpy_state(self, state: dict[str, np.ndarray]) -> None:
        own = self.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or unexpected:
            raise ConfigError(f"policy weights do not match the model: missing {missing}, unexpected {unexpected}")
        self.load_state_dict({k: torch.as_tensor(np.asarray(v)).to(own[k].dtype) for k, v in state.items()})

    def policy_parameters(self) -> list[nn.Parameter]:
        """The parameters the boosting detector differentiates: the actor (and log std)."""
        params = list(self.actor.parameters())
        if self.spec.action_kind == "box":
            params.append(self.log_std)
        return params


def policy_to_blob(policy: Policy, version: int, key: bytes, behaviour_values: bool = True) -> bytes:
    """Serialise a policy version as a signed envelope of builtins and numpy arrays.

    behaviour_values: whether actors sampling with it record V(obs_t) at every step (nitro.spec.BEHAVIOUR_VALUE_ALGOS);
    a blob without the field (an older learner's) means they do."""
    from nitro.data import codec

    doc = {"format": POLICY_FORMAT, "version": int(version), "spec": policy.spec.to_dict(),
           "state": policy.numpy_state(), "behaviour_values": bool(behaviour_values)}
    return codec.encode(doc, key)


def policy_from_blob(blob: bytes, key: bytes) -> tuple[Policy, int]:
    doc = blob_to_doc(blob, key)
    policy = Policy(doc["spec"])
    policy.load_numpy_state(doc["state"])
    return policy, doc["version"]
