"""Hidden tests of ``ch99_toy``, a two-exercise chapter that exists only for the sandbox tests.

It is registered as ``grader.hidden.ch99_toy`` by ``tests/toy_chapter/__init__.py``; nothing
under ``grader/hidden/`` refers to it. The canary below stands for any hidden-test source: the
hostile tests assert that it never reaches a feedback message.
"""
import torch

from coursekit.checks import check_close, check_equal
from grader import probes
from grader.api import fetch, hidden_test

CANARY = "CANARY-hidden-test-source-8d3f2c71"  # never sent to a worker, never in a reason


def _scaled_sum(x: torch.Tensor, alpha: float) -> torch.Tensor:  # (..., n) -> (...)
    return alpha * x.sum(dim=-1)


@hidden_test("test_scaled_sum")
def check_scaled_sum(nb):
    gen = torch.Generator().manual_seed(0)
    for shape, alpha in (((37, 53), 0.5), ((2, 3, 17), -2.0)):
        x = torch.randn(*shape, generator=gen, dtype=torch.float64)
        x_remote = nb.put(x.clone().requires_grad_(True))
        y = nb.scaled_sum(x_remote, alpha)
        x_ref = x.clone().requires_grad_(True)
        y_ref = _scaled_sum(x_ref, alpha)
        check_close(fetch(y), y_ref.detach(), "scaled_sum(x, alpha)",
                    hint="sum over the last dimension, then multiply by alpha")
        grad_out = torch.randn(y_ref.shape, generator=gen, dtype=torch.float64)
        y.backward(grad_out)
        y_ref.backward(grad_out)
        check_close(fetch(x_remote.grad), x_ref.grad, "the gradient of x",
                    hint="is the result still connected to x in the autograd graph?")


@hidden_test("test_linear_no_bias")
def check_linear_no_bias(nb):
    gen = torch.Generator().manual_seed(1)
    layer = nb.LinearNoBias(53, 29)
    table = nb.apply(probes.param_table, layer)
    check_equal(sorted(table), ["weight"], "the parameter names",
                hint="one parameter called weight, and no bias")
    check_equal(table["weight"]["shape"], [29, 53], "the shape of weight",
                hint="(out_features, in_features), like nn.Linear")
    check_equal(table["weight"]["requires_grad"], True, "weight.requires_grad")
    x = torch.randn(4, 7, 53, generator=gen)
    grad_out = torch.randn(4, 7, 29, generator=gen)
    got = nb.apply(probes.forward_backward, layer, x, grad_out)
    w_ref = table["weight"]["value"].clone().requires_grad_(True)
    x_ref = x.clone().requires_grad_(True)
    y_ref = x_ref @ w_ref.T
    y_ref.backward(grad_out)
    check_close(got["y"], y_ref.detach(), "the output", hint="y = x Wᵀ")
    check_close(got["dx"], x_ref.grad, "the gradient of x", hint="dx = g W")
    check_close(got["grads"]["weight"], w_ref.grad, "the gradient of weight", hint="dW = gᵀ x")
