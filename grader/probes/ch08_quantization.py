"""Probes of chapter 8 (quantization): the dtypes an op trace produces, and every tensor a module holds."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from grader.sandbox.trusted import in_process


@in_process(restricts=("dtypes",))
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


@in_process(explains=("*",))
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


def ch08_prime() -> None:
    """Prime a worker of this chapter before any student code runs (``grader.sandbox.judge.primes_of``): an
    NF4 round trip and a LoRA training step written with torch's operations, on a layer and an input sent
    as the judge's are (pickled), so that the first run's copies of shared pages and caches are not read as the student's memory
    by the memory cell."""
    import io
    import math
    import pickle

    # A judge's module and tensors arrive pickled (torch's loader runs the first time here).
    base, x = pickle.load(io.BytesIO(pickle.dumps((nn.Linear(64, 8), torch.zeros((), requires_grad=True)))))
    levels = torch.linspace(-1.0, 1.0, 16)
    for block in (64, 32):
        flat = base.weight.detach().float().flatten()
        blocks = torch.cat([flat, flat.new_zeros(-flat.numel() % block)]).view(-1, block)
        absmax = blocks.abs().amax(dim=1)
        scaled = blocks / torch.where(absmax == 0, torch.ones_like(absmax), absmax)[:, None]
        codes = torch.bucketize(scaled.flatten(), (levels[1:] + levels[:-1]) / 2).to(torch.uint8)
        nearest = (scaled.flatten()[:, None] - levels[None, :]).abs().argmin(dim=1)
        packed = (codes[0::2] << 4) | codes[1::2]
        unpacked = torch.stack([packed >> 4, packed & 15], dim=1).flatten()[:flat.numel()].long()
        weight = (levels[unpacked] * absmax.repeat_interleave(block)[torch.arange(flat.numel())]).reshape(8, 64)
        weight = weight + 0 * levels[nearest].sum()
        lora_a = nn.Parameter(torch.empty(4, 64))
        nn.init.kaiming_uniform_(lora_a, a=math.sqrt(5))
        lora_b = nn.Parameter(torch.zeros(8, 4))
        h = x.new_empty((3, 64)).normal_() + x
        y = nn.functional.linear(h, weight, base.bias.detach()) + 2.0 * (h @ lora_a.T) @ lora_b.T
        y.mul(torch.randn(3, 8)).sum().backward()


def _ch08_grid_values(levels: torch.Tensor, shape, block: int, seed: int) -> torch.Tensor:
    """Random values on the grid of ``levels`` (ascending, from -1 to 1): per block of ``block`` values (the
    flattened tensor holds whole blocks), a level times the block's scale in [0.01, 0.11), the first value of
    each block at level -1 or 1, so that the block's largest magnitude is its scale exactly."""
    g = torch.Generator().manual_seed(int(seed))
    n = 1
    for s in shape:
        n *= int(s)
    codes = torch.randint(0, len(levels), (n // block, block), generator=g, dtype=torch.uint8)
    codes[:, 0] = torch.randint(0, 2, (n // block,), generator=g, dtype=torch.uint8) * (len(levels) - 1)
    scale = torch.rand(n // block, 1, generator=g) * 0.1 + 0.01
    return (levels.float()[codes.long()] * scale).view(*shape)


def ch08_grid_linear(weight: torch.Tensor, levels: torch.Tensor, block: int, seed: int) -> nn.Module:
    """A bias-free ``nn.Linear`` whose weight is ``weight`` (out, in), overwritten in place with
    ``_ch08_grid_values``: the judge's input made in the process, in the storage it booked."""
    with torch.no_grad():
        weight.copy_(_ch08_grid_values(levels, weight.shape, block, seed))
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    layer.weight = nn.Parameter(weight)
    return layer
