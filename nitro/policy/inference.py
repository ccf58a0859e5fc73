"""Fast single-observation inference for actors.

At batch size 1 PyTorch's per-op dispatch costs more than the maths of a 2x256
MLP, so MLP policies run in plain numpy here (same weights, same normalisation,
float32). The Atari CNN's actor runs in numpy too (NumpyAtariCNN, ~1.5x faster
than torch's batch-1 forward on one core); a batch's values come from the torch
critic afterwards, batched (see bench/atari_sampling.py). Several observations at
once (`act_batch`, the lockstep VecSampler) run in torch, actor and critic fused
into one forward (nitro.policy.models.atari_cnn_pair_forward). A CNN with observation
normalisation uses the torch model throughout. All runners expose `act`/`value`.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from nitro.policy.model_spec import LOG_STD_MAX, LOG_STD_MIN, OBS_CLIP, ModelSpec, same_pad

log = logging.getLogger(__name__)
_LOG_2PI = math.log(2.0 * math.pi)
MLP_VALUE_CHUNK = 4096  # rows per batched numpy critic pass (value_batch)
FUSED_MIN_BATCH = 8  # from this many observations a step the fused CNN pass also gives the values (step_values)
_packed_failed = False  # a prepacked CNN failed on this CPU: this process takes the dense forward from then on


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
        self.act = (lambda x: np.tanh(x, out=x)) if activation == "tanh" else (lambda x: np.maximum(x, 0.0, out=x))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        for w, b in self.weights:
            h = x @ w
            h += b  # in place: the same sums as `x @ w + b`, one temporary less
            x = self.act(h)
        return x @ self.out_w + self.out_b


def _s2d_weight(w: np.ndarray, channels_first: bool = False) -> np.ndarray:
    """torch weight (out, in, 2s, 2s) of a stride-s conv -> (s*s*in, 4*out) for `_s2d_conv`.

    Rows follow the blocks' order, (u, v, in) or with channels_first (in, u, v);
    columns are (di, dj, out); kernel tap (kh, kw) = (s*di + u, s*dj + v).
    """
    o, c, k, _ = w.shape
    s = k // 2
    rows = (1, 3, 5) if channels_first else (3, 5, 1)  # axes of w6 = (out, in, di, u, dj, v)
    return np.ascontiguousarray(
        w.reshape(o, c, 2, s, 2, s).transpose(*rows, 2, 4, 0).reshape(s * s * c, 4 * o), dtype=np.float32)


def _s2d_conv(blocks: np.ndarray, w: np.ndarray, b: np.ndarray, grid: tuple[int, int],
              out_hw: tuple[int, int]) -> np.ndarray:
    """ReLU(conv) of a stride-s, 2s x 2s kernel conv given its input as s x s blocks.

    Space-to-depth turns it into a 2x2 stride-1 conv over the block grid: one matmul
    (each block times all four kernel quarters) and four shifted adds. Same
    arithmetic as im2col, but the copy is of the input (1x) instead of the patches
    (4x). blocks: (grid_h * grid_w, s*s*in); returns (oh, ow, out), channels last.
    """
    g = (blocks @ w).reshape(*grid, 2, 2, -1)
    oh, ow = out_hw
    y = g[:oh, :ow, 0, 0] + g[:oh, 1:ow + 1, 0, 1]
    y += g[1:oh + 1, :ow, 1, 0]
    y += g[1:oh + 1, 1:ow + 1, 1, 1]
    y += b
    return np.maximum(y, 0.0, out=y)


class NumpyAtariCNN:
    """Actor and critic AtariCNN (nitro.policy.models) in numpy for batch-1 acting.

    Net 0 is the actor and net 1 the critic. Layers 1-2 (kernel = 2 x stride) run as
    space-to-depth convolutions; when both nets run, layer 1 is one matmul for both.
    The 1/255 input scaling is folded into the first layer. The last conv (output
    1x1) is a matmul with ~1M weights per net, bound by memory bandwidth at batch 1;
    that is why the sampler leaves the critic out of the per-step call and evaluates
    it on the whole batch afterwards (PolicyRunner.values).
    """

    def __init__(self, state: dict[str, np.ndarray], obs_shape: tuple[int, ...]):
        c, h, w = obs_shape
        lh1, _, h1 = same_pad(h, 8, 4)
        lw1, _, w1 = same_pad(w, 8, 4)
        lh2, _, h2 = same_pad(h1, 4, 2)
        lw2, _, w2 = same_pad(w1, 4, 2)
        self.hw1, self.hw2 = (h1, w1), (h2, w2)
        self.grid1, self.grid2 = (h1 + 1, w1 + 1), (h2 + 1, w2 + 1)  # "same" padding fills exactly out+1 blocks
        # Preallocated zero-padded inputs of layers 1 (uint8 CHW) and 2 (HWC); only interiors are written.
        self._pad1 = np.zeros((c, 4 * (h1 + 1), 4 * (w1 + 1)), dtype=np.uint8)
        self._blocks1 = np.empty((h1 + 1, w1 + 1, c, 4, 4), dtype=np.float32)
        self._pad2 = np.zeros((2 * (h2 + 1), 2 * (w2 + 1), 16), dtype=np.float32)
        self.in_slice = (slice(None), slice(lh1, lh1 + h), slice(lw1, lw1 + w))
        self.mid_slice = (slice(lh2, lh2 + h1), slice(lw2, lw2 + w1))

        def get(name: str) -> np.ndarray:
            return np.asarray(state[name], dtype=np.float32)

        nets = ("actor", "critic")
        w1s = [get(f"{n}.conv1.weight") / np.float32(255.0) for n in nets]
        b1s = [get(f"{n}.conv1.bias") for n in nets]
        self.layer1 = {(0,): (_s2d_weight(w1s[0], True), b1s[0]), (1,): (_s2d_weight(w1s[1], True), b1s[1]),
                       (0, 1): (_s2d_weight(np.concatenate(w1s), True), np.concatenate(b1s))}
        self.layer2 = [(_s2d_weight(get(f"{n}.conv2.weight")), get(f"{n}.conv2.bias")) for n in nets]

        def full_map(wt: np.ndarray) -> np.ndarray:  # (out, in, h2, w2) -> (h2*w2*in, out): HWC flatten order
            return np.ascontiguousarray(wt.transpose(2, 3, 1, 0).reshape(-1, wt.shape[0]))

        self.layer3 = [(full_map(get(f"{n}.conv3.weight")), get(f"{n}.conv3.bias")) for n in nets]
        self.heads_w = [(np.ascontiguousarray(get(f"{n}.out.weight").T), get(f"{n}.out.bias")) for n in nets]

    def heads(self, obs: np.ndarray, nets: tuple[int, ...] = (0, 1)) -> list[np.ndarray]:
        """Outputs of the selected nets for one (C, H, W) uint8 observation: actor logits, critic (1,)."""
        pad1, pad2 = self._pad1, self._pad2
        pad1[self.in_slice] = obs
        c, gh, gw = pad1.shape[0], *self.grid1
        self._blocks1[...] = pad1.reshape(c, gh, 4, gw, 4).transpose(1, 3, 0, 2, 4)  # to float32 in the same pass
        x1 = _s2d_conv(self._blocks1.reshape(gh * gw, 16 * c), *self.layer1[nets], self.grid1, self.hw1)
        outs = []
        for j, net in enumerate(nets):
            pad2[self.mid_slice] = x1[:, :, 16 * j:16 * (j + 1)]
            gh, gw = self.grid2
            blocks = pad2.reshape(gh, 2, gw, 2, 16).transpose(0, 2, 1, 3, 4).reshape(gh * gw, 64)
            x = _s2d_conv(blocks, *self.layer2[net], self.grid2, self.hw2)  # (h2, w2, 32)
            w3, b3 = self.layer3[net]
            x = x.reshape(-1) @ w3 + b3  # the full-map conv: (256,)
            np.maximum(x, 0.0, out=x)
            wo, bo = self.heads_w[net]
            outs.append(x @ wo + bo)
        return outs


def _note_packed_failure(exc: Exception) -> None:
    global _packed_failed
    _packed_failed = True
    log.warning("oneDNN's prepacked Atari CNN is unavailable (%s); using the dense forward", exc)


class PolicyRunner:
    """Acts with one policy version: `act(obs, rng)` -> (action, log_prob, value)."""

    def __init__(self, spec: ModelSpec, state: dict[str, np.ndarray], version: int, behaviour_values: bool = True):
        """behaviour_values=False: the learner does not read V(obs_t) per step (IMPACT), so the samplers
        leave the batch's `values` out, evaluate the critic only for the bootstrap values and add the bootstrap
        observations (`final_obs`, `bootstrap_obs`: nitro.policy.rollout), which the learner values itself."""
        self.spec = spec
        self.version = version
        self.behaviour_values = bool(behaviour_values)
        self._torch_policy = None
        self._cnn = None
        if spec.arch == "mlp":
            self.actor = NumpyMLP(state, "actor", spec.activation)
            self.critic = NumpyMLP(state, "critic", spec.activation)
        elif not spec.obs_norm:
            self._cnn = NumpyAtariCNN(state, spec.obs_shape)
            self._state = state  # for the batched torch networks, built on first use
        else:
            import torch

            from nitro.policy.models import Policy

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
        """A runner for a policy document (nitro.policy.model_spec.blob_to_doc); one without `behaviour_values`
        (an older learner's) records them."""
        return cls(doc["spec"], doc["state"], doc["version"], doc.get("behaviour_values", True) is not False)

    def _normalize(self, obs: np.ndarray) -> np.ndarray:
        if not self.obs_norm:
            return np.asarray(obs, dtype=np.float32)
        z = (np.asarray(obs, dtype=np.float64).reshape(-1) - self.mean) * self.inv_std  # statistics are flat
        return np.clip(z, -OBS_CLIP, OBS_CLIP).astype(np.float32)

    @property
    def deferred_values(self) -> bool:
        """True when `value_batch` after the rollout is much cheaper per step than a value inside `act`: the
        numpy CNN, and the numpy MLPs, whose critic as one matmul over the rollout costs about 1.5 us a step
        against 6.8 us at batch 1 (Hopper 2x256, one thread)."""
        return self._torch_policy is None

    def step_values(self, batch: int) -> bool:
        """True when `act_batch` on `batch` observations should also return values (the CNN's fused
        actor-critic forward) rather than a batched sampler valuing the rollout with the critic alone afterwards.

        Measured on one thread, ms per observation, fused pass vs actor pass plus the critic afterwards in
        chunks of 64: 0.55 vs 0.50 at batch 4, 0.40 vs 0.42 at 8, 0.31 vs 0.42 at 16. False for the MLPs
        (their critic is cheapest as one big matmul afterwards) and the CNN with observation normalisation.
        """
        return self._cnn is not None and batch >= FUSED_MIN_BATCH

    def _heads(self, obs: np.ndarray, with_value: bool = True) -> tuple[np.ndarray, float]:
        if self._cnn is not None:
            outs = self._cnn.heads(obs, (0, 1) if with_value else (0,))
            return outs[0], float(outs[1][0]) if with_value else 0.0
        if self._torch_policy is not None:
            import torch

            with torch.no_grad():
                t = torch.as_tensor(np.asarray(obs)[None])
                out = self._torch_policy.actor(self._torch_policy.normalize(t))[0].numpy()
                value = float(self._torch_policy.value(t)[0]) if with_value else 0.0
            return out, value
        x = self._normalize(obs).reshape(-1)
        return self.actor(x), float(self.critic(x)[0]) if with_value else 0.0

    def act(self, obs: np.ndarray, rng: np.random.Generator, deterministic: bool = False, with_value: bool = True):
        """Sample an action; returns (action for the batch, log-prob, value estimate).

        with_value=False lets a runner skip the critic (the value is then 0.0); the
        sampler does so when `deferred_values` and fills values with `value_batch()`.
        """
        out, value = self._heads(obs, with_value)
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

    # -- batched (several environments per actor, nitro.rollout.VecSampler) ------------------
    def _normalize_batch(self, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs).reshape(len(obs), -1)
        if not self.obs_norm:
            return x.astype(np.float32, copy=False)
        z = x - self.mean  # float64, as `_normalize`
        z *= self.inv_std
        return np.clip(z, -OBS_CLIP, OBS_CLIP, out=z).astype(np.float32)

    def _torch_cnn(self, net: str):
        """Parameters and geometry of the "actor" or "critic" CNN for `atari_cnn_forward`, or of both ("pair")
        for `atari_cnn_pair_forward`; built on first use, once per runner (= policy version)."""
        import torch

        from nitro.policy.models import atari_geometry, fuse_atari_cnns

        cache = self.__dict__.setdefault("_cnn_params", {})
        if net not in cache:
            torch.set_num_threads(1)
            if net == "pair":  # functional: building a Policy would spend ~0.1 s on weight init
                params = fuse_atari_cnns(self._torch_cnn("actor")[0], self._torch_cnn("critic")[0])
            else:
                params = {k.removeprefix(f"{net}."): torch.from_numpy(np.asarray(v, dtype=np.float32))
                          for k, v in self._state.items() if k.startswith(f"{net}.")}
            cache[net] = (params, atari_geometry(self.spec.obs_shape))
        return cache[net]

    def _packed_cnn(self, nets: tuple[str, ...], batch: int):
        """OneDNNAtariCNNs of the named nets ("actor", "critic"), prepacked for `batch` rows on first use (once
        per runner = policy version), or None where oneDNN's prepacked ops are unavailable or refuse."""
        cache = self.__dict__.setdefault("_packed", {})
        if nets not in cache:
            from nitro.policy.models import OneDNNAtariCNNs

            cache[nets] = None
            if OneDNNAtariCNNs.available() and not _packed_failed:
                try:
                    cache[nets] = OneDNNAtariCNNs([self._torch_cnn(net)[0] for net in nets],
                                                  self._torch_cnn(nets[0])[1], batch)
                except RuntimeError as exc:  # an unsupported CPU or build: the dense-weight forward serves
                    _note_packed_failure(exc)
        return cache[nets]

    def _packed_forward(self, nets: tuple[str, ...], x):
        """The prepacked nets' outputs for the uint8 batch x, or None where they are unavailable or fail on this
        CPU (a kernel it lacks fails at the first call; the dense forward then serves this process)."""
        packed = self._packed_cnn(nets, len(x))
        if packed is None:
            return None
        try:
            return packed(x)
        except RuntimeError as exc:
            self._packed[nets] = None
            _note_packed_failure(exc)
            return None

    def _heads_batch(self, obs: np.ndarray, with_value: bool) -> tuple[np.ndarray, np.ndarray]:
        """Actor outputs (N, out) and values (N,) float32 for a batch of N observations."""
        n = len(obs)
        if self._cnn is not None:  # batched torch convolutions beat N numpy batch-1 passes
            import torch

            from nitro.policy.models import atari_cnn_forward, atari_cnn_pair_forward

            x = torch.from_numpy(np.ascontiguousarray(obs))
            with torch.inference_mode():
                outs = self._packed_forward(("actor", "critic") if with_value else ("actor",), x)
                if outs is not None:
                    return outs[0].numpy(), outs[1][:, 0].numpy() if with_value else np.zeros(n, dtype=np.float32)
                if not with_value:
                    return atari_cnn_forward(x, *self._torch_cnn("actor")).numpy(), np.zeros(n, dtype=np.float32)
                out, values = atari_cnn_pair_forward(x, *self._torch_cnn("pair"))  # ~0.7x the two nets' at 16-32
                return out.numpy(), values[:, 0].numpy()
        if self._torch_policy is not None:
            import torch

            with torch.inference_mode():
                t = torch.as_tensor(np.asarray(obs))
                out = self._torch_policy.actor(self._torch_policy.normalize(t)).numpy()
                values = self._torch_policy.value(t).numpy().astype(np.float32) if with_value else np.zeros(n, np.float32)
            return out, values
        x = self._normalize_batch(obs)
        values = self.critic(x)[:, 0].astype(np.float32) if with_value else np.zeros(n, dtype=np.float32)
        return self.actor(x), values

    def act_batch(self, obs: np.ndarray, rng: np.random.Generator, with_value: bool = True):
        """`act` for N observations (N, *obs_shape) in one inference: (actions (N, ...), log-probs (N,) float32,
        values (N,) float32). Same distribution as N calls of `act`; the noise is drawn as one (N, ...) block."""
        out, values = self._heads_batch(obs, with_value)
        if self.spec.action_kind == "box":
            noise = rng.standard_normal(out.shape).astype(np.float32)
            actions = out.astype(np.float32, copy=False) + self.std * noise
            logp = (self.logp_const - 0.5 * np.einsum("ij,ij->i", noise, noise)).astype(np.float32)
            return actions, logp, values
        logits = out.astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        logz = np.log(np.exp(logits).sum(axis=1))
        a = np.argmax(logits - np.log(-np.log(rng.random(logits.shape))), axis=1)
        logp = (logits[np.arange(len(a)), a] - logz).astype(np.float32)
        return a.astype(np.int64), logp, values

    def value_batch(self, obs: np.ndarray, chunk: int = 256) -> np.ndarray:
        """V(obs) for N observations, batched (the critic alone), float32 (N,). `chunk`: rows per torch pass;
        the numpy MLP takes MLP_VALUE_CHUNK rows a pass."""
        obs = np.asarray(obs)
        if self._cnn is not None or len(obs) == 0:
            return self.values(obs) if len(obs) else np.zeros(0, dtype=np.float32)
        if self._torch_policy is not None:
            import torch

            out = np.empty(len(obs), dtype=np.float32)
            with torch.inference_mode():
                for i in range(0, len(obs), chunk):
                    out[i:i + chunk] = self._torch_policy.value(torch.as_tensor(obs[i:i + chunk])).numpy()
            return out
        # Chunks bound the activations (a 2x256 layer: 4 MB) whatever steps_per_actor is.
        out = np.empty(len(obs), dtype=np.float32)
        for i in range(0, len(obs), MLP_VALUE_CHUNK):
            out[i:i + MLP_VALUE_CHUNK] = self.critic(self._normalize_batch(obs[i:i + MLP_VALUE_CHUNK]))[:, 0]
        return out

    def env_action(self, action):
        """Map a sampled action to what the environment accepts (Box actions are clipped)."""
        if self.spec.action_kind == "box":
            return np.clip(action, self.low, self.high)
        return action

    def value(self, obs: np.ndarray) -> float:
        if self._cnn is not None:
            return float(self._cnn.heads(obs, (1,))[0][0])
        return self._heads(obs)[1]

    def values(self, obs: np.ndarray, chunk: int = 64) -> np.ndarray:
        """V(obs_t) for a (T, *obs_shape) batch, float32.

        The CNN critic runs batched in torch, whose convolutions are ~2.5x cheaper per
        sample at batch 64 than numpy's at batch 1 (one thread either way). On dense weights: this pass runs
        once per batch, where prepacking a policy version's weights (~1 ms) costs more than it saves (32 rows,
        the Atari presets' batch: ~2 ms either way).
        """
        if self._cnn is None:
            return np.asarray([self.value(o) for o in obs], dtype=np.float32)
        import torch

        from nitro.policy.models import atari_cnn_forward

        critic = self._torch_cnn("critic")
        out = np.empty(len(obs), dtype=np.float32)
        with torch.inference_mode():
            for i in range(0, len(obs), chunk):
                out[i:i + chunk] = atari_cnn_forward(torch.from_numpy(obs[i:i + chunk]), *critic)[:, 0].numpy()
        return out
