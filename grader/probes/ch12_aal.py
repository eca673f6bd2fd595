"""Probes of chapter 12 (AAL): one forward and backward of an ASA layer or an ARA group on leaf copies (the weight
and bias as nn.Parameters or plain tensors), the setup cell's own ResidualMLPBlocks built in the worker with the
judge's parameters, rows of an input's gradient caught on their way back, an output gradient written after the
forward, and the gradients a module's parameters hold."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from grader.probes.shared import _true_named_parameters


def ch12_set_block(block: nn.Module, params: dict) -> None:
    """Sets a block's parameters (the notebook's own ResidualMLPBlock, made in the worker) to the judge's
    ``params``: {"fc1.weight": ..., "fc1.bias": ..., "fc2.weight": ..., "fc2.bias": ...}."""
    with torch.no_grad():
        for name, t in _true_named_parameters(block):
            t.copy_(params[name])


def ch12_grad_rows(x: torch.Tensor, rows: torch.Tensor, out: torch.Tensor) -> None:
    """Once backward runs through ``x`` (a non-leaf), ``out`` receives those rows of its gradient (leading
    dimensions flattened). The hook holds the indices and ``out``, never x."""

    def hook(grad):
        out.copy_(grad.detach().reshape(-1, grad.shape[-1])[rows])

    x.register_hook(hook)


def ch12_fill(target: torch.Tensor, seed: int, row_mask: torch.Tensor | None = None) -> None:
    """Writes standard-normal values drawn with ``seed`` into ``target`` (through .data: a tensor an autograd
    graph already holds, as the output gradient of a forward that has run), rows zeroed where ``row_mask`` is
    False."""
    generator = torch.Generator().manual_seed(int(seed))
    values = torch.randn(target.shape, generator=generator, dtype=target.dtype)
    if row_mask is not None:
        values = values * row_mask.reshape(*target.shape[:-1], 1).to(values.dtype)
    target.data.copy_(values)


def _ch12_error(e: BaseException) -> dict:
    return {"types": [c.__name__ for c in type(e).__mro__], "message": str(e)[:300]}


def _ch12_grad(t):
    return None if t is None or t.grad is None else t.grad.detach().clone()


def ch12_asa_run(fn: Callable, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 grad_out: torch.Tensor, kwargs: dict, x_requires_grad: bool = True, w_requires_grad: bool = True,
                 free_weight: bool = False, parameter: bool = False) -> dict:
    """``y = fn(x, weight, bias, **kwargs)`` on leaf copies (x and the weight requiring grad as asked, the bias
    always), then ``y.backward(grad_out)``; with ``free_weight`` the weight's storage is released (resized to 0
    bytes) between forward and backward, so a backward that reads it raises. With ``parameter`` the weight and the
    bias are nn.Parameters (as in an nn.Module), otherwise plain tensors. Reports "type", "attached", "y",
    "error" (what backward raised, or None) and the gradients "dx", "dW", "db" (None where none arrived)."""
    x = x.detach().clone().requires_grad_(x_requires_grad)
    if parameter:
        w = nn.Parameter(weight.detach().clone(), requires_grad=w_requires_grad)
        b = None if bias is None else nn.Parameter(bias.detach().clone())
    else:
        w = weight.detach().clone().requires_grad_(w_requires_grad)
        b = None if bias is None else bias.detach().clone().requires_grad_(True)
    y = fn(x, w, b, **kwargs)
    if not isinstance(y, torch.Tensor):
        return {"type": type(y).__name__, "attached": False, "y": None}
    out = {"type": "Tensor", "attached": y.grad_fn is not None, "y": y.detach().clone()}
    if not out["attached"]:
        return out
    if free_weight:
        w.untyped_storage().resize_(0)
    try:
        y.backward(grad_out)
    except Exception as e:  # noqa: BLE001 - reporting what was raised is the point
        out["error"] = _ch12_error(e)
        return out
    out.update(error=None, dx=_ch12_grad(x), dW=_ch12_grad(w), db=_ch12_grad(b))
    return out


def ch12_ara_run(fn: Callable, blocks: list, x: torch.Tensor, grad_out: torch.Tensor, x_requires_grad: bool = True,
                 container: str = "list") -> dict:
    """``y = fn(blocks, x)`` on a leaf copy of x, the blocks handed over as a list, a tuple or an nn.ModuleList
    (``container``), then ``y.backward(grad_out)``. Reports "type", "attached", "y", "error", "dx" and "grads":
    {"i.fc1.weight": gradient or None, ...} for every parameter of every block."""
    for block in blocks:
        for _, p in _true_named_parameters(block):
            p.grad = None
    x = x.detach().clone().requires_grad_(x_requires_grad)
    given = {"list": list(blocks), "tuple": tuple(blocks), "modulelist": nn.ModuleList(blocks)}[container]
    y = fn(given, x)
    if not isinstance(y, torch.Tensor):
        return {"type": type(y).__name__, "attached": False, "y": None}
    out = {"type": "Tensor", "attached": y.grad_fn is not None, "y": y.detach().clone()}
    if not out["attached"]:
        return out
    try:
        y.backward(grad_out)
    except Exception as e:  # noqa: BLE001 - reporting what was raised is the point
        out["error"] = _ch12_error(e)
        return out
    grads = {}
    for i, block in enumerate(blocks):
        for name, p in _true_named_parameters(block):
            grads[f"{i}.{name}"] = _ch12_grad(p)
    out.update(error=None, dx=_ch12_grad(x), grads=grads)
    return out


def ch12_grads(module: nn.Module) -> dict:
    """{name: the gradient its parameter holds, or None} for every parameter of ``module``."""
    return {name: _ch12_grad(p) for name, p in _true_named_parameters(module)}
