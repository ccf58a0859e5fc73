"""The shared minibatch loop: step counts, remainder handling, clipping, noise scale."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from nitro.algos.sgd import LossTerms, _backward_terms, epoch_loss_from, minibatch_sgd
from nitro.clock import critical_path_cpu_seconds


def quadratic_problem(n=10):
    w = torch.nn.Parameter(torch.zeros(3))
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    y = x @ torch.tensor([1.0, -2.0, 0.5])
    seen: list[int] = []

    def loss_fn(idx):
        seen.extend(idx.tolist())
        loss = (x[idx] @ w - y[idx]).pow(2).mean()
        return loss, {"value_loss": loss}

    return w, loss_fn, seen


def run(n, mb, epochs=2, clip=0.0, lr=0.1):
    w, loss_fn, seen = quadratic_problem(n)
    opt = torch.optim.SGD([w], lr=lr)
    res = minibatch_sgd([w], opt, torch.Generator().manual_seed(1), n, epochs=epochs, minibatch_size=mb,
                        max_grad_norm=clip, device=torch.device("cpu"), loss_fn=loss_fn)
    return res, seen, w


def test_steps_skip_the_short_remainder_and_each_sample_appears_at_most_once_per_epoch():
    res, seen, _ = run(10, 4)
    assert (res.steps, res.minibatch_size) == (4, 4)  # 2 full minibatches per epoch, 2 samples left out
    assert len(seen) == 16 and len(set(seen[:8])) == 8 and len(set(seen[8:])) == 8


def test_zero_minibatch_means_full_batch_and_no_noise_estimate():
    res, seen, _ = run(10, 0, epochs=3)
    assert (res.steps, res.minibatch_size, res.noise_scale) == (3, 10, 0.0)
    assert sorted(seen[:10]) == list(range(10))


def test_loss_decreases_and_means_are_reported():
    res_short, _, _ = run(64, 16, epochs=1)
    res_long, _, _ = run(64, 16, epochs=20)
    assert res_long.means["value_loss"] < res_short.means["value_loss"]
    assert set(res_long.means) >= {"value_loss", "grad_norm", "loss"}
    assert res_short.noise_scale != 0.0  # four first-epoch minibatches: defined


def test_gradient_clip_bounds_each_step():
    _, _, w_clipped = run(64, 64, epochs=1, clip=1e-3, lr=1.0)
    assert float(w_clipped.detach().norm()) <= 1e-3 + 1e-6
    _, _, w_free = run(64, 64, epochs=1, clip=0.0, lr=1.0)
    assert float(w_free.detach().norm()) > 1e-2


def test_epoch_loss_from_gives_each_step_the_samples_of_its_slice_of_the_permutation():
    """Same minibatches as indexing with perm[a:b], field by field, a tuple field staying a tuple;
    and the same weights as the per-minibatch loss_fn on the same generator."""
    w, loss_fn, _ = quadratic_problem(n=12)
    x = torch.randn(12, 3, generator=torch.Generator().manual_seed(0))  # quadratic_problem's x
    y = x @ torch.tensor([1.0, -2.0, 0.5])
    ids = torch.arange(12)
    perms: list[torch.Tensor] = []

    def minibatch_loss(mb):
        assert isinstance(mb.pair, tuple) and torch.equal(mb.pair[1], -mb.ids)
        perms.append(mb.ids)
        loss = (mb.x @ w2 - mb.y).pow(2).mean()
        return loss, {"value_loss": loss}

    w2 = torch.nn.Parameter(torch.zeros(3))
    fields = {"x": x, "y": y, "ids": ids, "pair": (ids, -ids)}
    for param, kwargs in ((w, {"loss_fn": loss_fn}), (w2, {"epoch_loss_fn": epoch_loss_from(fields, minibatch_loss)})):
        minibatch_sgd([param], torch.optim.SGD([param], lr=0.1), torch.Generator().manual_seed(1), 12, epochs=2,
                      minibatch_size=5, max_grad_norm=0.0, device=torch.device("cpu"), **kwargs)
    gen = torch.Generator().manual_seed(1)
    expected = [p[a:a + 5] for p in (torch.randperm(12, generator=gen) for _ in range(2)) for a in (0, 5)]
    assert all(torch.equal(got, want) for got, want in zip(perms, expected, strict=True))
    assert torch.equal(w, w2)


def test_loss_terms_on_a_pool_equal_the_joint_loss_and_a_failing_term_leaves_none_running():
    """LossTerms over disjoint parameters: the weights of the joint loss, terms run on a pool or not; when the
    calling thread's term fails, the pool's term has finished by the time the error arrives."""
    def run(split: bool, pool):
        torch.manual_seed(0)
        a, b = torch.nn.Linear(3, 4), torch.nn.Linear(3, 1)
        params = [*a.parameters(), *b.parameters()]
        x, y = torch.randn(32, 3), torch.randn(32)

        def epoch(perm):
            def step(i, j):
                rows = perm[i:j]

                def value_term():
                    loss = ((b(x[rows]).squeeze(-1) - y[rows]) ** 2).mean()
                    return loss, {"value_loss": loss.detach()}

                def other_term():
                    return (a(x[rows]) ** 2).mean(), {}
                if split:
                    return LossTerms((value_term, other_term))
                value, parts = value_term()
                return value + other_term()[0], parts
            return step
        minibatch_sgd(params, torch.optim.Adam(params, lr=0.1), torch.Generator().manual_seed(1), 32, epochs=2,
                      minibatch_size=8, max_grad_norm=0.5, device=torch.device("cpu"), epoch_loss_fn=epoch,
                      term_pool=pool)
        return torch.cat([p.detach().flatten() for p in params])

    with ThreadPoolExecutor(1) as pool:
        joint = run(False, None)
        assert torch.equal(run(True, None), joint) and torch.equal(run(True, pool), joint)
        finished = []

        def slow():
            time.sleep(0.2)
            finished.append(True)
            return torch.zeros((), requires_grad=True) * 1.0, {}

        def failing():
            raise RuntimeError("term failed")

        with pytest.raises(RuntimeError, match="term failed"):
            _backward_terms((slow, failing), pool)
        assert finished == [True]


def test_a_helper_term_that_outlasts_the_callers_counts_on_the_critical_path():
    """The caller waits for a longer term on the pool: the difference in CPU time joins its critical path."""
    def busy(seconds):
        def term():
            t0 = time.thread_time()
            while time.thread_time() - t0 < seconds:
                pass
            return torch.zeros((), requires_grad=True) * 1.0, {}
        return term

    with ThreadPoolExecutor(1) as pool:
        c0, t0 = critical_path_cpu_seconds(), time.thread_time()
        _backward_terms((busy(0.08), busy(0.01)), pool)
        own, path = time.thread_time() - t0, critical_path_cpu_seconds() - c0
    assert own < 0.05 and path >= 0.075  # the caller's own CPU, plus the pool term's 0.07 s beyond it
    c0 = critical_path_cpu_seconds()
    with ThreadPoolExecutor(1) as pool:
        _backward_terms((busy(0.01), busy(0.05)), pool)  # the caller's term is the longer: nothing added
    assert critical_path_cpu_seconds() - c0 < 0.08


@pytest.mark.slow
def test_preload_imports_what_the_first_optimizer_would():
    """sgd.preload (the learner service runs it before answering) takes torch._dynamo's import off a first job."""
    import subprocess
    import sys

    code = ("import sys, torch; before = 'torch._dynamo' in sys.modules; "
            "from nitro.algos.sgd import preload; preload(); print(before, 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]
