"""Helpers any chapter's hidden tests apply: class names, raised exceptions, parameter and tensor
tables, one forward + backward and its measurements."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from coursekit.measure import measure
from grader.sandbox.trusted import in_process


def _true_named_modules(module: nn.Module, prefix: str = "", seen: set | None = None):
    """(name, module) for ``module`` and every submodule, read from the ``_modules`` tables that calling the model
    uses, never through methods an instance can shadow (``model.named_modules = ...``)."""
    seen = set() if seen is None else seen
    if id(module) in seen:
        return
    seen.add(id(module))
    yield prefix, module
    table = object.__getattribute__(module, "__dict__").get("_modules", {})
    for name, child in dict.items(table):
        if isinstance(child, nn.Module):
            yield from _true_named_modules(child, f"{prefix}.{name}" if prefix else name, seen)


def _true_named_parameters(module: nn.Module):
    """(name, parameter) of ``module`` and its submodules, each once, read from the ``_parameters`` tables."""
    seen = set()
    for prefix, m in _true_named_modules(module):
        table = object.__getattribute__(m, "__dict__").get("_parameters", {})
        for name, p in dict.items(table):
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                yield (f"{prefix}.{name}" if prefix else name), p


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


def tensor_states(tensors: list) -> list[dict]:
    """{"shape", "dtype", "requires_grad", "value", "grad"} of each given tensor object, in order.

    Checks pass tensors they sent themselves (``nb.put((model, list(model.parameters())))``, one
    message), so what is read is the judge's own tensor, not what a module's methods report."""
    return [{"shape": list(t.shape), "dtype": str(t.dtype), "requires_grad": bool(t.requires_grad),
             "value": t.detach().clone(), "grad": None if t.grad is None else t.grad.detach().clone()}
            for t in tensors]


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


@in_process(explains=("*",))
def measure_forward_backward(module: nn.Module, x: torch.Tensor, grad_out: torch.Tensor) -> dict:
    """Saved bytes and FLOPs of one forward + backward of ``module`` on ``x``."""
    m = measure(lambda: module(x), module, grad=grad_out)
    return {"activation_bytes": m.activation_bytes, "saved_bytes": m.saved_bytes,
            "forward_flops": m.forward_flops, "backward_flops": m.backward_flops}



def raised_message(fn: Callable, *args, **kwargs) -> dict | None:
    """Call ``fn``; None if it returned, else the exception's class names (MRO) and message."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - reporting what was raised is the point
        return {"types": [c.__name__ for c in type(e).__mro__], "message": str(e)[:500]}
    return None
