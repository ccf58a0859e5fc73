"""Faster CPU kernels for the MLPs' two hot operations, each a drop-in for the torch op with torch's autograd.

On this project's CPUs (AMD EPYC, AVX-512) two of torch's CPU kernels run far below the machine:
- `F.linear` goes to MKL's sgemm, which takes its AVX2 path on a non-Intel CPU: a 256x256x256 product takes
  ~330 us, oneDNN's `mkldnn._linear_pointwise` on the same dense tensors ~160 us;
- `torch.tanh` takes ~150 us for a 256x256 block, numpy's SIMD tanh ~11 us.
A 2x256 MLP's forward and backward is almost all of these (bench/learner_update.py). `linear` and `tanh` use
the faster kernel where it applies (CPU; float32 for oneDNN, float32 or float64 for numpy; large enough to
pay) and torch's op otherwise, so CUDA, float64 products and small (batch-1) calls are unchanged. Both
backward passes are written with differentiable ops (oneDNN products as Functions, torch's `tanh_backward`),
so second derivatives (the detector's Hessian-vector products) flow through them, on row-major tensors.
Values agree with the torch ops to float32 rounding, not bit for bit (so the same rows can round differently
on either side of the size threshold).
NITRO_CPU_OPS=0 in a process's environment (or `ENABLED = False`) keeps torch's own ops throughout.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import torch
from torch.nn import functional as F

ENABLED = os.environ.get("NITRO_CPU_OPS", "1") != "0"
# oneDNN's call costs ~10 us more than MKL's; it pays from about this many multiply-adds (rows x in x out): a
# 256->256 layer from 32 rows, the Atari CNN's 3872->256 layer from 3 (figures in docs/algorithms.md).
ONEDNN_MIN_MACS = 1 << 21
# Below this many elements torch's own tanh costs less than the numpy round trip (a batch-1 forward).
NUMPY_TANH_MIN_NUMEL = 2048


def _onednn_ok() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


_ONEDNN = _onednn_ok()


def _onednn_packed_ok() -> bool:
    """oneDNN's weight prepacking and its convolution with a fused activation (the Atari CNN's inference)."""
    ops = ("_reorder_linear_weight", "_reorder_convolution_weight", "_convolution_pointwise")
    try:
        return _ONEDNN and all(hasattr(torch.ops.mkldnn, name) for name in ops)
    except (AttributeError, RuntimeError):
        return False


ONEDNN_PACKED = _onednn_packed_ok()


def _plain_cpu(t: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> bool:
    """A dense CPU tensor (or parameter) of one of `dtypes`; no subclass whose ops someone intercepts."""
    return t.device.type == "cpu" and t.dtype in dtypes and type(t) in (torch.Tensor, torch.nn.Parameter) \
        and t.layout == torch.strided


_thread = threading.local()


def _own_thread_count() -> None:
    """oneDNN sizes its OpenMP team from the calling thread's own setting, which torch applies to a new thread
    lazily (in its first parallel loop or `torch.get_num_threads` call): ask for it on a thread's first oneDNN
    call (the PPO critic's thread, a job's thread, a backward run on another thread than its forward), so a
    one-thread learner never runs oneDNN on two. Reading, not setting: a thread's stale count must not
    overwrite the process's."""
    if not getattr(_thread, "counted", False):
        torch.get_num_threads()
        _thread.counted = True


def _dense(t: torch.Tensor) -> torch.Tensor:
    """`t` if row- or column-major (oneDNN reads a transpose in place, faster than copying it), else a copy."""
    return t if t.is_contiguous() or t.t().is_contiguous() else t.contiguous()


def _onednn(a: torch.Tensor, b_t: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b_t.T (+ bias) by oneDNN, row-major."""
    _own_thread_count()
    return torch.ops.mkldnn._linear_pointwise(_dense(a), _dense(b_t), bias, "none", [], "")


# The backward of a oneDNN product is two more, written as the Functions below so that a recorded backward
# (create_graph: the detector's Hessian-vector products) is differentiable and row-major throughout. Recorded
# as products of transposed views instead, autograd's transposes hand column-major gradients to the next
# backward, whose elementwise ops then mix layouts (3-10x slower each): an HVP of the 2x256 Hopper actor took
# ~4.7 ms that way, ~3.2 ms this way (docs/algorithms.md). Every product here has the layer's multiply-adds.

class _OneDNNLinear(torch.autograd.Function):
    """x @ w.T + b: (B, K) @ (K, O)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return _onednn(x, w, b)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, w = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        if torch.is_grad_enabled():  # recorded for a second derivative
            gx = _InputGrad.apply(grad, w) if need_x else None
            gw = _WeightGrad.apply(grad, x) if need_w else None
        else:  # the same products, oneDNN reading the transposes in place
            gx = _onednn(grad, w.t()) if need_x else None
            gw = _onednn(grad.t(), x.t()) if need_w else None
        return gx, gw, grad.sum(0) if need_b else None


class _InputGrad(torch.autograd.Function):
    """g @ w: (B, O) @ (O, K), a layer's input gradient."""

    @staticmethod
    def forward(ctx, g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(g, w)
        return _onednn(g, w.t())

    @staticmethod
    def backward(ctx, h: torch.Tensor):
        g, w = ctx.saved_tensors
        dg = _OneDNNLinear.apply(h, w, None) if ctx.needs_input_grad[0] else None  # h @ w.T: (B, O)
        dw = _WeightGrad.apply(g, h) if ctx.needs_input_grad[1] else None  # g.T @ h: (O, K)
        return dg, dw


class _WeightGrad(torch.autograd.Function):
    """g.T @ x: (O, B) @ (B, K), a layer's weight gradient."""

    @staticmethod
    def forward(ctx, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(g, x)
        return _onednn(g.t(), x.t())

    @staticmethod
    def backward(ctx, m: torch.Tensor):
        g, x = ctx.saved_tensors
        dg = _OneDNNLinear.apply(x, m, None) if ctx.needs_input_grad[0] else None  # x @ m.T: (B, O)
        dx = _InputGrad.apply(g, m) if ctx.needs_input_grad[1] else None  # g @ m: (B, K)
        return dg, dx


def _use_onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether x @ weight.T (+ bias) goes to oneDNN: 2-D float32 CPU operands, at least ONEDNN_MIN_MACS."""
    return ENABLED and _ONEDNN and x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1] \
        and x.shape[0] * weight.numel() >= ONEDNN_MIN_MACS \
        and _plain_cpu(x, (torch.float32,)) and _plain_cpu(weight, (torch.float32,)) \
        and (bias is None or (_plain_cpu(bias, (torch.float32,)) and bias.shape == weight.shape[:1]
                              and bias.is_contiguous()))  # oneDNN reads the bias as a dense (out,) array


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias); through oneDNN for a 2-D float32 CPU input when the product has at least
    ONEDNN_MIN_MACS multiply-adds."""
    if _use_onednn(x, weight, bias):
        return _OneDNNLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)  # also what names a shape mismatch clearly


def matmul_t(a: torch.Tensor, b_t: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b_t.T (+ bias), not recorded by autograd; by oneDNN where `linear` would use it (a transposed
    operand is read in place). For hand-written derivatives (nitro.detector.mlp_hvp)."""
    if _use_onednn(a, b_t, bias):
        return _onednn(a, b_t, bias)
    return F.linear(a, b_t, bias)


class _NumpyTanh(torch.autograd.Function):
    """tanh by numpy; the output is saved as torch.tanh saves it and the backward is torch's `tanh_backward`."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = torch.from_numpy(np.tanh(x.detach().numpy()))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def tanh(x: torch.Tensor) -> torch.Tensor:
    """torch.tanh(x); through numpy for a float CPU tensor of at least NUMPY_TANH_MIN_NUMEL elements."""
    if ENABLED and x.numel() >= NUMPY_TANH_MIN_NUMEL and _plain_cpu(x, (torch.float32, torch.float64)):
        return _NumpyTanh.apply(x)
    return torch.tanh(x)
