"""Probes of chapter 13 (ALAM): they call the student's saved-tensor hooks and report what came back."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from grader.sandbox.trusted import in_process


def _ch13_tensors(obj, found: dict) -> None:
    """The tensors inside ``obj`` (tuples, lists, dicts), one per storage."""
    if isinstance(obj, torch.Tensor):
        found.setdefault((obj.untyped_storage().data_ptr(), obj.untyped_storage().nbytes()), obj)
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            _ch13_tensors(item, found)
    elif isinstance(obj, dict):
        for item in obj.values():
            _ch13_tensors(item, found)


def _ch13_make(value: torch.Tensor, kind: str, keep: list):
    """The tensor handed to pack: an activation that requires grad, a parameter, a view of one, or as is."""
    if kind == "act":
        return value.detach().clone().requires_grad_(True).mul(1)  # a non-leaf that requires grad
    if kind == "param":
        keep.append(nn.Parameter(value.detach().clone()))
        return keep[-1]
    if kind == "param_t":
        keep.append(nn.Parameter(value.detach().clone()))
        return keep[-1].t()
    return value


def ch13_pack_run(pack: Callable, unpack: Callable, values: list, kinds: list) -> list:
    """Make a tensor of each kind ("act", "param", "param_t", "plain") from ``values`` (the same object for
    repeated indices of one value: ``kinds`` may be longer than ``values``, index i uses values[i % len]),
    call ``pack`` on them in order and ``unpack`` on each result. Per call: "same" (pack returned the very
    object), "tensors" (copies of the tensors inside what it returned, one per storage), "restored" (a copy
    of what unpack gave back) and "error" (the exception's text, if pack or unpack raised)."""
    keep: list = []
    made = [_ch13_make(v, k, keep) for v, k in zip(values, kinds[:len(values)])]
    report = []
    for i in range(len(kinds)):
        t = made[i % len(made)]
        entry = {"same": False, "tensors": [], "restored": None, "error": None}
        try:
            packed = pack(t)
            entry["same"] = packed is t
            found: dict = {}
            _ch13_tensors(packed, found)
            entry["tensors"] = [v.detach().clone() for v in found.values()]
            restored = unpack(packed)
            entry["restored"] = restored.detach().clone() if isinstance(restored, torch.Tensor) else None
        except Exception as e:  # noqa: BLE001 - reported, the judge decides
            entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        report.append(entry)
    return report


def ch13_mean_of_packs(pack: Callable, unpack: Callable, value: torch.Tensor, count: int):
    """The mean of ``unpack(pack(t))`` over ``count`` packs of one activation t (that requires grad)."""
    t = value.detach().clone().requires_grad_(True).mul(1)
    total = torch.zeros(t.shape, dtype=torch.float64)
    for _ in range(int(count)):
        out = unpack(pack(t))
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(t.shape):
            return None
        total += out.detach().double()
    return total / int(count)


def ch13_hooked_grads(model: nn.Module, x: torch.Tensor, pack: Callable, unpack: Callable) -> list:
    """Gradients of mean(model(x) ** 2) with the forward run under ``saved_tensors_hooks(pack, unpack)``."""
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = model(x).pow(2).mean()
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return [g.detach().clone() for g in grads]


@in_process(explains=("bytes",))
def ch13_packed_bytes(packed) -> dict:
    """Bytes of the storages of the tensors inside ``packed`` (a claim measured in the process)."""
    found: dict = {}
    _ch13_tensors(packed, found)
    return {"bytes": sum(key[1] for key in found)}


def ch13_unpack_at(unpack: Callable, packed, picks: torch.Tensor):
    """``unpack(packed)`` flattened, at the positions ``picks``."""
    out = unpack(packed)
    if not isinstance(out, torch.Tensor):
        return None
    return out.detach().reshape(-1)[picks].clone()
