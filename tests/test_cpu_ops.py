"""nitro.policy.cpu_ops: oneDNN linear and numpy tanh equal torch's ops in value, gradient and second
derivative, take the fast kernel where they should, and fall back to torch's op elsewhere."""

import os
import subprocess
import sys

import pytest
import torch
from torch.nn import functional as F

from nitro.policy import cpu_ops
from nitro.policy.models import ModelSpec, Policy

needs_onednn = pytest.mark.skipif(not cpu_ops._ONEDNN, reason="torch built without oneDNN")


@pytest.fixture(autouse=True)
def _enabled(monkeypatch):
    """The kernels on, whatever NITRO_CPU_OPS the test run has (a test turns them off itself)."""
    monkeypatch.setattr(cpu_ops, "ENABLED", True)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _two_layers(lin, act, x, w1, b1, w2):
    return (act(lin(act(lin(x, w1, b1)), w2, None)) ** 2).sum()


@needs_onednn
@pytest.mark.parametrize("transposed_input", [False, True])
def test_gradients_and_hessian_vector_products_match_torch(transposed_input):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 300, generator=g).t() if transposed_input else torch.randn(300, 128, generator=g)
    x.requires_grad_()
    params = [torch.randn(96, 128, generator=g), torch.randn(96, generator=g), torch.randn(80, 96, generator=g)]
    params = [p.mul_(0.1).requires_grad_() for p in params]
    leaves = (x, *params)
    assert type(cpu_ops.linear(x, params[0], params[1]).grad_fn).__name__ == "_OneDNNLinearBackward"
    v = [torch.randn(t.shape, generator=g) for t in leaves]
    out = {}
    for name, lin, act in (("fast", cpu_ops.linear, cpu_ops.tanh), ("torch", F.linear, torch.tanh)):
        loss = _two_layers(lin, act, x, *params)
        grads = torch.autograd.grad(loss, leaves, create_graph=True)
        hvp = torch.autograd.grad(sum((a * b).sum() for a, b in zip(grads, v)), leaves)
        out[name] = (loss.detach(), [t.detach() for t in grads], hvp)
    (loss, grads, hvp), (ref_loss, ref_grads, ref_hvp) = out["fast"], out["torch"]
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    for a, b in zip(grads, ref_grads):
        assert _rel(a, b) < 1e-5
    for a, b in zip(hvp, ref_hvp):  # the detector's second derivative goes through both backward passes
        assert _rel(a, b) < 1e-5


@needs_onednn
@pytest.mark.parametrize("case", ["all", "bias", "weights only, transposed input"])
def test_third_derivatives_through_the_backward_functions_match_torch(case):
    """The backward of a recorded backward (`_InputGrad`, `_WeightGrad`) is itself differentiable."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(128, 160, generator=g).t() if "transposed" in case else torch.randn(160, 128, generator=g)
    inputs = [x, torch.randn(112, 128, generator=g) * 0.1] + ([torch.randn(112, generator=g)] if case == "bias" else [])
    leaves = [t.requires_grad_() for t in inputs[1 if "only" in case else 0:]]
    u, v = ([torch.randn(t.shape, generator=g) for t in leaves] for _ in range(2))
    out = {}
    for name, lin in (("fast", cpu_ops.linear), ("torch", F.linear)):
        loss = (torch.tanh(lin(*inputs)) ** 2).sum()
        grads = torch.autograd.grad(loss, leaves, create_graph=True)
        hvp = torch.autograd.grad(sum((a * b).sum() for a, b in zip(grads, u)), leaves, create_graph=True)
        out[name] = torch.autograd.grad(sum((a * b).sum() for a, b in zip(hvp, v)), leaves)
    for a, b in zip(out["fast"], out["torch"]):
        assert _rel(a, b) < 1e-4


@needs_onednn
def test_a_hessian_vector_product_never_mixes_row_and_column_major_operands():
    """A backward recorded as products of transposed views hands column-major gradients to the next backward,
    whose elementwise ops then run on mixed layouts (3-10x slower on this project's CPUs): cpu_ops' does not
    (it did before its second-order Functions: 8 such ops in this HVP)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Layouts(TorchDispatchMode):
        mixed: list = []
        elementwise = {"add", "add_", "mul", "mul_", "sub", "div", "tanh_backward", "where"}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            mats = [a for a in args if isinstance(a, torch.Tensor) and a.dim() == 2 and min(a.shape) > 1]
            if func.overloadpacket.__name__ in self.elementwise and any(m.t().is_contiguous() for m in mats) \
                    and any(m.is_contiguous() for m in mats):
                self.mixed.append(str(func))
            return func(*args, **(kwargs or {}))

    policy = Policy(ModelSpec((11,), "box", 3, (-1.0,) * 3, (1.0,) * 3))
    obs, actions = torch.randn(512, 11), torch.randn(512, 3)
    params = list(policy.actor.parameters())
    loss = policy.log_prob(policy.distribution(obs), actions).mean()
    grads = torch.autograd.grad(loss, params, create_graph=True)
    dot = sum((gr * torch.randn_like(gr)).sum() for gr in grads)
    with Layouts() as seen:
        torch.autograd.grad(dot, params)
    assert seen.mixed == []


@needs_onednn
def test_a_2x256_mlp_minibatch_takes_the_fast_kernels_and_small_or_float64_calls_do_not():
    policy = Policy(ModelSpec((11,), "box", 3, (-1.0,) * 3, (1.0,) * 3))
    h = policy.actor.layers[0](torch.zeros(256, 11))
    wide = policy.actor.layers[1]
    assert type(cpu_ops.linear(h.detach().requires_grad_(), wide.weight, wide.bias).grad_fn).__name__ \
        == "_OneDNNLinearBackward"
    assert type(cpu_ops.tanh(h).grad_fn).__name__ == "_NumpyTanhBackward"
    # too few multiply-adds for oneDNN to pay (11 -> 256 on 256 rows; 256 -> 256 on 16), float64, one
    # observation of 256 features: torch's own ops
    first = policy.actor.layers[0]
    assert type(cpu_ops.linear(torch.zeros(256, 11), first.weight, first.bias).grad_fn).__name__ == "AddmmBackward0"
    assert type(cpu_ops.linear(h[:16], wide.weight, wide.bias).grad_fn).__name__ == "AddmmBackward0"
    w64 = wide.weight.detach().double().requires_grad_()
    assert type(cpu_ops.linear(torch.zeros(4, 256, dtype=torch.float64), w64).grad_fn).__name__ == "MmBackward0"
    assert type(cpu_ops.tanh(torch.zeros(256, requires_grad=True)).grad_fn).__name__ == "TanhBackward0"


@pytest.mark.parametrize("shape", [(1, 256), (7, 256), (256, 256), (3, 5, 256)])
def test_values_match_torch_for_any_batch_shape(shape):
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(shape, generator=g), torch.randn(128, 256, generator=g) / 16, torch.randn(128, generator=g)
    assert torch.allclose(cpu_ops.linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert torch.allclose(cpu_ops.linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
    assert torch.allclose(cpu_ops.tanh(x), torch.tanh(x), atol=1e-6)
    with torch.inference_mode():  # actors' and evaluations' forward passes
        assert torch.allclose(cpu_ops.linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
        assert torch.allclose(cpu_ops.tanh(x), torch.tanh(x), atol=1e-6)


def test_tanh_of_float64_keeps_its_precision_and_gradient():
    x = torch.linspace(-4, 4, 4096, dtype=torch.float64, requires_grad=True)
    y = cpu_ops.tanh(x)
    assert y.dtype == torch.float64 and torch.allclose(y, torch.tanh(x), rtol=0, atol=1e-15)
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert torch.allclose(grad, 1 - torch.tanh(x.detach()) ** 2, rtol=0, atol=1e-15)
    small = x[::97].detach().clone().requires_grad_()  # the numpy Function itself, below its size threshold
    assert torch.autograd.gradcheck(cpu_ops._NumpyTanh.apply, (small,))
    assert torch.autograd.gradgradcheck(cpu_ops._NumpyTanh.apply, (small,))


def test_disabled_keeps_torchs_own_ops(monkeypatch):
    monkeypatch.setattr(cpu_ops, "ENABLED", False)
    x, w = torch.randn(256, 256, requires_grad=True), torch.randn(256, 256)
    assert type(cpu_ops.linear(x, w).grad_fn).__name__ == "MmBackward0"
    assert type(cpu_ops.tanh(x).grad_fn).__name__ == "TanhBackward0"


@pytest.mark.slow
def test_the_environment_variable_turns_them_off():
    code = "from nitro.policy import cpu_ops; print(cpu_ops.ENABLED)"
    for value, expected in (("0", "False"), ("1", "True")):
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "NITRO_CPU_OPS": value},
                             capture_output=True, text=True, check=True).stdout.strip()
        assert out == expected


@pytest.mark.parametrize("bias", ["strided", "expanded", "scalar", "one"])
def test_a_bias_oneDNN_cannot_read_as_a_dense_vector_goes_to_torch(bias):
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(256, 256, generator=g), torch.randn(256, 256, generator=g)
    b = {"strided": torch.randn(512, generator=g)[::2], "expanded": torch.tensor([0.5]).expand(256),
         "scalar": torch.tensor(0.5), "one": torch.tensor([0.5])}[bias]
    assert torch.allclose(cpu_ops.linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-4)


def test_a_shape_mismatch_gets_torchs_error():
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        cpu_ops.linear(torch.zeros(256, 300), torch.zeros(256, 256))


_HVP_ON_A_NEW_THREAD = """(lambda xs, ws: (lambda dot: lambda x, w: torch.autograd.grad(dot, [ws], retain_graph=True))(
    (torch.autograd.grad((torch.tanh(cpu_ops.linear(xs, ws)) ** 2).sum(), [ws], create_graph=True)[0] ** 2).sum()
))(torch.randn(4096, 11), (torch.randn(64, 11) * 0.3).requires_grad_())"""

_THREADS_PROBE = """
import os, threading, torch
from nitro.policy import cpu_ops
torch.set_num_threads(1)
x, w = torch.randn(512, 1024), torch.randn(1024, 1024)
call = {call}
counts = []
def run():  # an OpenMP team lives while its thread does: count inside it
    counts.append(len(os.listdir("/proc/self/task")))
    for _ in range(3):
        call(x, w)
    counts.append(len(os.listdir("/proc/self/task")))
t = threading.Thread(target=run)
t.start(); t.join()
print(counts[1] - counts[0])
"""


@pytest.mark.slow
@needs_onednn
@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or len(os.sched_getaffinity(0)) < 2,
                    reason="counts OS threads in /proc; needs 2 CPUs for an OpenMP team")
def test_a_new_thread_runs_onednn_on_torchs_one_thread():
    """oneDNN reads the calling thread's OpenMP setting, which torch sets on a new thread only lazily: the
    raw call on a fresh thread starts an OpenMP team (the control), cpu_ops.linear does not."""
    def extra_threads(call: str) -> int:
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_THREAD_LIMIT")}
        env["NITRO_CPU_OPS"] = "1"  # OpenMP's default (one thread per CPU) and the kernels on
        out = subprocess.run([sys.executable, "-c", _THREADS_PROBE.format(call=call)], capture_output=True,
                             text=True, check=True, env=env).stdout
        return int(out.strip())
    assert extra_threads("lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, 'none', [], '')") > 0
    assert extra_threads("cpu_ops.linear") == 0
    # an HVP's backward on a fresh thread, its graph recorded on the main thread (a narrow layer: no large
    # elementwise op has torch apply the thread's count before the first oneDNN product)
    assert extra_threads(_HVP_ON_A_NEW_THREAD) == 0


def test_tensors_off_the_cpu_take_torchs_ops():
    """A CUDA learner's tensors never reach oneDNN or numpy (the meta device stands in for one here)."""
    x, w = torch.empty(512, 256, device="meta"), torch.empty(256, 256, device="meta", requires_grad=True)
    y = cpu_ops.tanh(cpu_ops.linear(x, w))
    assert y.device.type == "meta" and y.shape == (512, 256)
    assert type(y.grad_fn).__name__ == "TanhBackward0"
    assert type(y.grad_fn.next_functions[0][0]).__name__ == "MmBackward0"
