"""Trusted helpers that a hidden test may run inside the student's process.

They only gather data (shapes, flags, measurements, exception names); all judging
happens in the judge. Each must be a top-level function of this module: the sandbox
resolves ``nb.apply(fn, ...)`` by name here and nowhere else. Keep this module free of
reference solutions: the student's process can read it.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from coursekit.measure import flop_counter, measure


def type_names(obj) -> list[str]:
    """Qualified names of the object's class and its bases (for isinstance checks)."""
    return [f"{c.__module__}.{c.__qualname__}" for c in type(obj).__mro__]


def raised(fn: Callable, *args, **kwargs) -> list[str] | None:
    """Call ``fn``; return the class names of the exception it raised (MRO), or None."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - reporting what was raised is the point
        return [c.__name__ for c in type(e).__mro__]
    return None


def param_table(module: nn.Module) -> dict[str, dict]:
    """{qualified name: {"shape", "requires_grad", "value", "grad"}} for every parameter."""
    return {
        name: {"shape": list(p.shape), "requires_grad": bool(p.requires_grad),
               "value": p.detach().clone(), "grad": None if p.grad is None else p.grad.detach().clone()}
        for name, p in module.named_parameters()
    }


def module_table(module: nn.Module) -> dict[str, list[str]]:
    """{qualified name: class MRO names} for every submodule ("" is the module itself)."""
    return {name: type_names(m) for name, m in module.named_modules()}


def forward_backward(module: Callable, x: torch.Tensor, grad_out: torch.Tensor) -> dict:
    """Run ``module(x)`` and back-propagate ``grad_out``; return outputs and gradients."""
    x = x.detach().clone().requires_grad_(True)
    y = module(x)
    y.backward(grad_out)
    grads = {}
    if isinstance(module, nn.Module):
        grads = {n: None if p.grad is None else p.grad.detach().clone() for n, p in module.named_parameters()}
    return {"y": y.detach().clone(), "dx": None if x.grad is None else x.grad.clone(), "grads": grads}


def measure_forward_backward(module: nn.Module, x: torch.Tensor, grad_out: torch.Tensor) -> dict:
    """Saved bytes and FLOPs of one forward + backward of ``module`` on ``x``."""
    m = measure(lambda: module(x), module, grad=grad_out)
    return {"activation_bytes": m.activation_bytes, "saved_bytes": m.saved_bytes,
            "forward_flops": m.forward_flops, "backward_flops": m.backward_flops}


class ch03_BatchSizeRecorder(nn.Module):
    """Wraps a model and records the batch size of every forward call in ``self.sizes``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.sizes: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.sizes.append(int(x.shape[0]))
        return self.model(x)


def ch03_describe(value) -> dict:
    """What a function returned: its type and, for a tensor, shape, dtype and autograd flags."""
    if isinstance(value, torch.Tensor):
        return {"type": "Tensor", "shape": list(value.shape), "dtype": str(value.dtype),
                "requires_grad": bool(value.requires_grad), "has_grad_fn": value.grad_fn is not None,
                "value": value.detach().clone()}
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return {"type": type(value).__name__, "shape": None, "dtype": None, "requires_grad": None,
            "has_grad_fn": None, "value": number}


def ch02_run_and_trace(fn: Callable, module: nn.Module, x: torch.Tensor, grad_out: torch.Tensor, *extra,
                       seed: int = 0, x_requires_grad: bool = True) -> dict:
    """Run ``fn(module, x, *extra)`` and back-propagate ``grad_out``; report outputs, gradients,
    the activation bytes saved during the forward call, forward and backward FLOPs, and which direct
    children of ``module`` (or ``module`` itself if it has none) were called, in order, during the
    forward call and during backward (recomputation shows up there).

    The global RNG is seeded with ``seed`` just before the call. Tensors in ``extra`` keep their
    ``requires_grad``; their gradients come back under "extra_grads".
    """
    from coursekit.measure import saved_tensors

    x = x.detach().clone().requires_grad_(x_requires_grad)
    extra = tuple(e.detach().clone().requires_grad_(e.requires_grad) if isinstance(e, torch.Tensor) else e
                  for e in extra)
    module.zero_grad(set_to_none=True)
    watched = dict(module.named_children()) or {"": module}
    calls: dict[str, list[str]] = {"forward": [], "backward": []}
    phase = ["forward"]
    handles = [m.register_forward_hook(lambda _m, _i, _o, name=name: calls[phase[0]].append(name))
               for name, m in watched.items()]
    try:
        torch.manual_seed(seed)
        with saved_tensors(module) as rec, flop_counter() as fwd:
            y = fn(module, x, *extra)
        phase[0] = "backward"
        if not isinstance(y, torch.Tensor) or y.grad_fn is None:
            return {"attached": False, "y": y.detach().clone() if isinstance(y, torch.Tensor) else None}
        with flop_counter() as bwd:
            y.backward(grad_out)
    finally:
        for h in handles:
            h.remove()
    return {
        "attached": True,
        "y": y.detach().clone(),
        "dx": None if x.grad is None else x.grad.clone(),
        "extra_grads": [e.grad.clone() if isinstance(e, torch.Tensor) and e.grad is not None else None
                        for e in extra],
        "grads": {n: None if p.grad is None else p.grad.detach().clone() for n, p in module.named_parameters()},
        "activation_bytes": rec.activation_bytes,
        "saved_shapes": [list(s.shape) for s in rec.tensors if not s.is_state],
        "forward_flops": fwd.get_total_flops(),
        "backward_flops": bwd.get_total_flops(),
        "forward_calls": calls["forward"],
        "backward_calls": calls["backward"],
    }
