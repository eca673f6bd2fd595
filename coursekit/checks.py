"""Gradient and value checks whose failure messages teach.

    check_close(actual, expected, "dA", hint="is the LoRA update scaled by alpha / rank?")
    AssertionError: dA differs from the reference (max abs error 3.1e-02 at index (2, 5), tolerance 1e-05):
    is the LoRA update scaled by alpha / rank?
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

# Default tolerances per dtype (absolute, relative).
TOLERANCES = {
    torch.float64: (1e-10, 1e-8),
    torch.float32: (1e-5, 1.3e-5),
    torch.bfloat16: (1e-2, 1.6e-2),
    torch.float16: (1e-3, 1e-3),
}


def check_close(actual, expected, name: str, hint: str = "", atol: float | None = None,
                rtol: float | None = None) -> None:
    """Assert two tensors match; on failure say where, by how much, and what to look at."""
    if not isinstance(actual, torch.Tensor):
        raise AssertionError(f"{name} should be a tensor, got {type(actual).__name__}. {hint}".strip())
    expected = torch.as_tensor(expected)
    if tuple(actual.shape) != tuple(expected.shape):
        raise AssertionError(
            f"{name} has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}. {hint}".strip())
    if actual.dtype != expected.dtype:
        raise AssertionError(f"{name} has dtype {actual.dtype}, expected {expected.dtype}. {hint}".strip())
    d_atol, d_rtol = TOLERANCES.get(expected.dtype, (0.0, 0.0))
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    if a.numel() == 0:
        return
    nan_mismatch = torch.isnan(a) != torch.isnan(e)
    bad = nan_mismatch | (~torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True))
    if bad.any():
        err = (a - e).abs().nan_to_num(nan=float("inf"))
        idx = tuple(int(i) for i in torch.nonzero(bad)[0])
        raise AssertionError(
            f"{name} differs from the reference (max abs error {err.max().item():.3g}, first at index "
            f"{idx}: got {a[idx].item():.6g}, expected {e[idx].item():.6g}; tolerance atol={atol:g}, "
            f"rtol={rtol:g}). {hint}".strip())


def same_close(actual, expected, atol: float = 1e-8, rtol: float = 1e-5, equal_nan: bool = False) -> bool:
    """``torch.allclose`` that never broadcasts: False unless both are tensors of the same shape.

    A value fetched from a student's process may have any shape; broadcasting a (K, 1, 1) tensor
    against an (N, M) reference would build a K × N × M tensor before any comparison.
    """
    if not (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)):
        return False
    if actual.shape != expected.shape:
        return False
    return bool(torch.allclose(actual.double(), expected.double(), atol=atol, rtol=rtol, equal_nan=equal_nan))


def same_values(actual, expected) -> bool:
    """``torch.equal`` for values fetched from a student's process: same shape and values, no broadcasting."""
    return (isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor)
            and actual.shape == expected.shape and bool(torch.equal(actual, expected)))


def check_equal(actual, expected, name: str, hint: str = "") -> None:
    """Assert exact equality of plain values (ints, dicts of ints, strings)."""
    if actual != expected:
        raise AssertionError(f"{name} is {actual!r}, expected {expected!r}. {hint}".strip())


def check_gradients(fn: Callable[..., torch.Tensor], reference: Callable[..., torch.Tensor],
                    inputs: Sequence[torch.Tensor], names: Sequence[str] | None = None,
                    hint: str = "", seed: int = 0) -> None:
    """Compare outputs and input gradients of ``fn`` against ``reference`` (plain autograd).

    Each input that requires grad gets its gradient compared, under a random output gradient.
    """
    names = list(names) if names is not None else [f"input {i}" for i in range(len(inputs))]
    xs1 = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    xs2 = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    y1, y2 = fn(*xs1), reference(*xs2)
    check_close(y1, y2.detach(), "the output", hint)
    g = torch.randn(y2.shape, generator=torch.Generator().manual_seed(seed), dtype=y2.dtype)
    y1.backward(g)
    y2.backward(g)
    for name, a, b in zip(names, xs1, xs2):
        if b.requires_grad:
            if a.grad is None:
                raise AssertionError(f"no gradient reached {name}: is it still connected to the graph? {hint}".strip())
            check_close(a.grad, b.grad, f"the gradient of {name}", hint)
