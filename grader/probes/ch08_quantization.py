"""Probes of chapter 8 (quantization): the dtypes an op trace produces, and every tensor a module holds."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn


def ch08_traced_call(fn: Callable, *args) -> dict:
    """Call ``fn(*args)``; return its result and the dtypes of every tensor the aten ops inside produced."""
    from torch.utils._python_dispatch import TorchDispatchMode

    produced: set[str] = set()

    class _Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (list, tuple)) else (out,):
                if isinstance(t, torch.Tensor):
                    produced.add(str(t.dtype))
            return out

    with _Recorder():
        result = fn(*args)
    return {"result": result, "dtypes": sorted(produced)}


def ch08_tensor_inventory(module: nn.Module) -> list[dict]:
    """Every tensor a module holds, each storage once: parameters, buffers, and plain attributes of
    every submodule (also inside lists, tuples and dicts)."""
    found: list[dict] = []
    seen: set = set()

    def add(where: str, t: torch.Tensor) -> None:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel(), str(t.dtype))
        if key in seen:
            return
        seen.add(key)
        found.append({"where": where, "dtype": str(t.dtype), "numel": int(t.numel()),
                      "nbytes": int(t.numel() * t.element_size()), "floating": bool(t.is_floating_point()),
                      "requires_grad": bool(t.requires_grad)})

    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        add(name, t)
    for prefix, sub in module.named_modules():
        for attr, value in vars(sub).items():
            where = f"{prefix}.{attr}" if prefix else attr
            if isinstance(value, dict):
                items = [(f"{where}[{k!r}]", v) for k, v in value.items()]
            elif isinstance(value, (list, tuple)):
                items = [(f"{where}[{i}]", v) for i, v in enumerate(value)]
            else:
                items = [(where, value)]
            for label, item in items:
                if isinstance(item, torch.Tensor):
                    add(label, item)
    return found
