"""Hessian-vector products of a surrogate for a Gaussian MLP policy, written out (Pearlmutter's R-operator).

`make_hvp` differentiates autograd's recorded gradient again for every product: each step of that double
backward is a small op on (samples x width) tensors, about 40% of a product's time next to its matrix
products for the 2x256 Hopper actor. This module computes the same H v with the matrix products alone plus
a handful of fused elementwise ops, from quantities computed once per detection.

Setting. The objective is L = sum_t phi_t(l_t): a separable function of each sample's log-probability
l_t = sum_j [-(a_tj - mu_tj)^2 / (2 sigma_j^2) - log sigma_j] - m/2 log(2 pi), with mu = MLP(x_t) (tanh or
ReLU hidden layers, a linear head) and sigma = exp(clamp(s)) for the state-independent log std s. The
surrogates of PPO and IMPACT are means of per-sample terms of l_t, so phi_t' and phi_t'' come from autograd
on the l vector alone (`c1`, `c2`: the gradient of L in l, and its diagonal Hessian). Then

    H v = R{grad L} = sum_t [ c2_t R{l_t} grad l_t + c1_t R{grad l_t} ]

where R{.} is the directional derivative along v: a forward pass of R{z}, R{x} through the layers, then the
backward pass of the gradient and of its R in step, as in the first-order backward. A log std outside the
clamp's range has zero derivative, as through torch's clamp.

`gaussian_mlp_hvp` returns None for anything else (a CNN, a discrete action, another activation, frozen
parameters); the detector then uses `make_hvp`. Its products agree with make_hvp's to float32 rounding
(tests/test_detector_mlp_hvp.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nitro.policy import cpu_ops
from nitro.policy.model_spec import LOG_STD_MAX, LOG_STD_MIN
from nitro.policy.models import Policy

ACTIVATIONS = ("tanh", "relu")


def gaussian_mlp_hvp(policy, obs: torch.Tensor, actions: torch.Tensor,
                     surrogate: Callable[[torch.Tensor], torch.Tensor]
                     ) -> tuple[Callable[[torch.Tensor], torch.Tensor], int] | None:
    """(hvp, dim) over policy.policy_parameters() for L = surrogate(log pi(actions | obs)), or None when the
    policy is not a Gaussian MLP this module covers or `surrogate` is not a sum of per-sample terms (checked:
    its Hessian in the log-probabilities must be diagonal). The products use a snapshot of the weights."""
    if not isinstance(policy, Policy):  # another module with the objective's interface (tests' float64 ones)
        return None
    spec = policy.spec
    params = list(policy.policy_parameters())
    if spec.arch != "mlp" or spec.action_kind != "box" or spec.activation not in ACTIVATIONS \
            or not all(p.requires_grad for p in params):
        return None
    actor = policy.actor
    weights = [layer.weight.detach().clone() for layer in actor.layers] + [actor.out.weight.detach().clone()]
    biases = [layer.bias.detach().clone() for layer in actor.layers] + [actor.out.bias.detach().clone()]
    if any(w.dtype != torch.float32 for w in weights):
        return None
    tanh = spec.activation == "tanh"
    with torch.no_grad():
        # Forward: each hidden layer's output x_l and its activation's derivative D_l.
        xs = [policy.normalize(obs).reshape(len(obs), -1)]
        for w, b in zip(weights[:-1], biases[:-1]):
            z = cpu_ops.matmul_t(xs[-1], w, b)
            xs.append(cpu_ops.tanh(z) if tanh else z.clamp_min(0.0))
        # The mean and log-probabilities exactly as the autograd objective computes them, so that a sample next
        # to the clip range is clipped (or not) on both paths alike.
        dist = policy.distribution(obs)
        mu, logp = dist.mean, policy.log_prob(dist, actions)
        derivs = [1.0 - x * x if tanh else (x > 0).to(x.dtype) for x in xs[1:]]
        s = policy.log_std.detach()
        free = ((s >= LOG_STD_MIN) & (s <= LOG_STD_MAX)).to(mu.dtype)  # clamp passes derivatives here only
        s_c = s.clamp(LOG_STD_MIN, LOG_STD_MAX)
        inv_var = torch.exp(-2.0 * s_c)
        diff = actions.to(mu.dtype) - mu
        d = diff * inv_var  # dl/dmu
        u2m1 = diff * diff * inv_var - 1.0  # dl/ds (before the clamp's factor)
    with torch.enable_grad():
        leaf = logp.detach().requires_grad_(True)
        (c1,) = torch.autograd.grad(surrogate(leaf), leaf, create_graph=True)
        if c1.requires_grad:
            (c2,) = torch.autograd.grad(c1.sum(), leaf, retain_graph=True, allow_unused=True)
            # grad(c1.sum()) sums the rows of the Hessian in l: the diagonal only for a separable surrogate.
            probe = torch.randn(len(leaf), generator=torch.Generator().manual_seed(0), dtype=leaf.dtype)
            # (c1 . probe) as a scalar: an explicit grad_outputs would import sympy (~0.4 s) on first use
            (h_probe,) = torch.autograd.grad((c1 * probe).sum(), leaf, allow_unused=True)
            c2 = torch.zeros_like(c1) if c2 is None else c2
            h_probe = torch.zeros_like(c1) if h_probe is None else h_probe
            if not (torch.isfinite(c2).all() and torch.isfinite(h_probe).all()):
                return None  # non-finite samples: autograd's products carry the NaN to the solver as before
            if not torch.allclose(h_probe, c2 * probe, rtol=1e-4, atol=1e-6 * float(c2.abs().max()) + 1e-30):
                return None
        else:  # linear in l
            c2 = torch.zeros_like(c1)
    c1, c2 = c1.detach().to(mu.dtype), c2.detach().to(mu.dtype)
    with torch.no_grad():
        # The first-order backward: delta_l (the gradient at layer l's pre-activation) and, for the R pass,
        # e_l * dD_l/dx_l (tanh: -2 e_l x_l; ReLU: 0), e_l being the gradient at x_l.
        g_mu = c1[:, None] * d
        deltas, curvs = [None] * len(derivs), [None] * len(derivs)
        delta = g_mu
        for i in range(len(derivs) - 1, -1, -1):
            e = cpu_ops.matmul_t(delta, weights[i + 1].t())
            curvs[i] = -2.0 * e * xs[i + 1] if tanh else None
            delta = e * derivs[i]
            deltas[i] = delta
    sizes = [p.numel() for p in params]
    dim = sum(sizes)
    layers = len(weights)

    def hvp(v: torch.Tensor) -> torch.Tensor:
        if v.shape != (dim,):
            raise ValueError(f"hvp expects a vector of shape ({dim},), got {tuple(v.shape)}")
        with torch.no_grad():
            parts = v.to(torch.float32).split(sizes)
            vw = [parts[2 * i].view_as(weights[i]) for i in range(layers)]
            vb = [parts[2 * i + 1] for i in range(layers)]
            vs = parts[-1] * free
            # R forward: R{x_0} = 0, R{z_l} = x_{l-1} V_l^T + b'_l + R{x_{l-1}} W_l^T, R{x_l} = D_l R{z_l}.
            r_xs, r_x = [None], None
            for i in range(layers - 1):
                r_z = cpu_ops.matmul_t(xs[i], vw[i], vb[i])
                if r_x is not None:
                    r_z += cpu_ops.matmul_t(r_x, weights[i])
                r_x = r_z.mul_(derivs[i])
                r_xs.append(r_x)
            r_mu = cpu_ops.matmul_t(xs[-1], vw[-1], vb[-1])
            if r_x is not None:
                r_mu += cpu_ops.matmul_t(r_x, weights[-1])
            # R of the head: l, its gradient in mu (c1 d) and in s (c1 (u^2 - 1) on the clamp's free range).
            r_l = (d * r_mu).sum(1) + u2m1 @ vs
            r_d = -r_mu * inv_var - 2.0 * d * vs
            c2_rl = c2 * r_l
            r_g_mu = c2_rl[:, None] * d + c1[:, None] * r_d
            r_u2 = -2.0 * (d * r_mu) - 2.0 * (u2m1 + 1.0) * vs
            r_g_s = free * (c2_rl @ u2m1 + c1 @ r_u2)
            # R backward, layer by layer: R{grad W_l} = R{delta_l}^T x_{l-1} + delta_l^T R{x_{l-1}}.
            out: list[torch.Tensor] = [r_g_s] * (2 * layers + 1)
            r_delta, delta = r_g_mu, g_mu
            for i in range(layers - 1, -1, -1):
                gw = cpu_ops.matmul_t(r_delta.t(), xs[i].t())
                if r_xs[i] is not None:
                    gw += cpu_ops.matmul_t(delta.t(), r_xs[i].t())
                out[2 * i], out[2 * i + 1] = gw, r_delta.sum(0)
                if i == 0:
                    break
                r_e = cpu_ops.matmul_t(r_delta, weights[i].t()) + cpu_ops.matmul_t(delta, vw[i].t())
                r_delta = r_e.mul_(derivs[i - 1])
                if curvs[i - 1] is not None:
                    r_delta.addcmul_(curvs[i - 1], r_xs[i])
                delta = deltas[i - 1]
            return torch.cat([o.reshape(-1) for o in out]).to(params[0].dtype)

    return hvp, dim
