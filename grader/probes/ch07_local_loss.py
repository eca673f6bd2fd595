"""Probes of chapter 7 (local losses): a traced call with gradients, a block and a head to train,
and returned values as plain or exact data."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn


def ch07_run(fn: Callable, tensors: list, *rest, grad_out: torch.Tensor | None = None, modules: tuple = ()) -> dict:
    """Call ``fn(*tensors, *rest)`` with fresh copies of ``tensors`` (floating ones requiring grad),
    back-propagate ``grad_out`` (ones if None) and return the output, the inputs' gradients and the
    gradients of ``modules``' parameters (zeroed before the call)."""
    xs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
    for m in modules:
        m.zero_grad(set_to_none=True)
    out = fn(*xs, *rest)
    if not isinstance(out, torch.Tensor):
        return {"type": type(out).__name__}
    attached = out.grad_fn is not None
    if attached:
        out.backward(torch.ones_like(out) if grad_out is None else grad_out)
    grad = (lambda t: None if t.grad is None else t.grad.detach().clone())
    return {"type": "Tensor", "value": out.detach().clone(), "dtype": str(out.dtype), "shape": list(out.shape),
            "attached": attached, "grads": [grad(x) for x in xs],
            "param_grads": [{n: grad(p) for n, p in m.named_parameters()} for m in modules]}


class ch07_Block(nn.Module):
    """Linear -> BatchNorm1d -> ReLU -> dropout(p); ``forward(x)`` returns ``(h, out)``. The dropout
    mask comes from a generator seeded with the block's seed and its call count, so that the same
    block called the same number of times draws the same masks anywhere."""

    def __init__(self, d_in: int, d_out: int, p: float = 0.0, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.linear = nn.Linear(d_in, d_out)
        self.norm = nn.BatchNorm1d(d_out)
        self.p, self.seed, self.calls = p, seed, 0

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.norm(self.linear(x)))
        self.calls += 1
        if self.p == 0:
            return h, h
        gen = torch.Generator().manual_seed(self.seed * 7919 + self.calls)
        keep = (torch.rand(h.shape, generator=gen) >= self.p).to(h.dtype)
        return h, h * keep / (1 - self.p)


class ch07_Head(nn.Module):
    """A stand-in local loss: ``scale`` × cross-entropy of a Linear(d, classes) on ``h``."""

    def __init__(self, d: int, classes: int, scale: float = 1.0, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.linear = nn.Linear(d, classes)
        self.scale = scale

    def forward(self, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.scale * nn.functional.cross_entropy(self.linear(h), y)


def ch07_describe(value) -> dict:
    """The type of ``value`` and, for a list or tuple, each item's type and its value if a plain number."""
    items = None
    if isinstance(value, (list, tuple)):
        items = [{"type": type(v).__name__,
                  "value": v if isinstance(v, (int, float)) and not isinstance(v, bool) else None} for v in value]
    return {"type": type(value).__name__, "items": items}


def ch07_exact(value, depth: int = 0):
    """Nested lists/tuples of numbers as plain data: containers as {"type", "items"}, numbers as
    exact "numerator/denominator" strings (``fractions.Fraction`` of the value), others as their type."""
    import math
    from fractions import Fraction

    if depth > 4:
        return {"type": "too deep"}
    if isinstance(value, (list, tuple)):
        return {"type": type(value).__name__, "items": [ch07_exact(v, depth + 1) for v in value]}
    if isinstance(value, (int, float, Fraction)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            return {"type": "float", "value": repr(value)}
        q = Fraction(value)
        return {"type": type(value).__name__, "value": f"{q.numerator}/{q.denominator}"}
    return {"type": type(value).__name__}


def ch07_block_step(block: nn.Module, head: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """The course's own local backward of one block: ``h, out = block(x)``, ``head(h, y).backward()``, no
    optimizer step. A hidden test reads its peak memory from outside the process: what holding one block's
    graph at a time costs, the baseline of a local training step's peak."""
    h, _out = block(x.detach())
    loss = head(h, y)
    loss.backward()
    return float(loss.detach())
