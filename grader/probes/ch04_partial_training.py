"""Probes of chapter 4 (partial training): what autograd saves during a call, and sampled entries of a large
result."""
from __future__ import annotations

from typing import Callable

import torch

from coursekit.measure import saved_tensors
from grader.sandbox.trusted import in_process


@in_process(explains=("activation_bytes", "saved"))
def ch04_saved_run(fn: Callable, x: torch.Tensor, grad_out: torch.Tensor, overwrite: bool = False) -> dict:
    """Run ``y = fn(x)`` on a leaf copy of ``x`` that requires grad, recording every storage autograd
    saves; then back-propagate ``grad_out``. With ``overwrite``, the values of ``x`` and ``y`` are
    overwritten in place (``x`` negated, ``y`` zeroed, through ``.data`` so autograd does not notice)
    between forward and backward: only what was saved for backward can still inform the gradient.

    Reports the output (before any overwrite), whether it is attached to the graph, the input
    gradient, the activation bytes and, for each saved storage, its shape, dtype and bytes."""
    x = x.detach().clone().requires_grad_(True)
    with saved_tensors() as rec:
        y = fn(x)
    if not isinstance(y, torch.Tensor):
        return {"attached": False, "y": None}
    out = {"attached": y.grad_fn is not None, "y": y.detach().clone(), "dtype": str(y.dtype),
           "activation_bytes": rec.activation_bytes,
           "saved": [{"shape": list(s.shape), "dtype": str(s.dtype), "nbytes": s.nbytes,
                      "floating": s.dtype.is_floating_point}
                     for s in rec.tensors]}
    if not out["attached"]:
        return out
    if overwrite:
        x.data.neg_()
        y.data.zero_()
    y.backward(grad_out)
    out["dx"] = None if x.grad is None else x.grad.detach().clone()
    return out


def ch04_entries(t, picks: torch.Tensor) -> dict:
    """The type, dtype and shape of what the student's code returned and, when it is a tensor, its entries at
    the flat positions ``picks`` that it has (values only: the judge compares them with its own). Keeps the
    data sent back small when the tensor is large."""
    if not isinstance(t, torch.Tensor):
        return {"type": type(t).__name__, "dtype": None, "shape": None, "values": None}
    flat = torch.Tensor.reshape(torch.Tensor.detach(t), (-1,))
    inside = picks[picks < flat.numel()]
    return {"type": "Tensor", "dtype": str(t.dtype), "shape": list(t.shape), "values": flat[inside].clone()}
