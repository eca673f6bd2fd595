"""Probes of chapter 3 (gradient accumulation): a model that shows which samples went in together,
a batch iterable without ``len``, and a description of a returned value."""
from __future__ import annotations

import torch
from torch import nn


class ch03_MicroBatchModel(nn.Module):
    """Wraps a model and adds ``pos[i]`` to the i-th sample of every forward call: a call on more than
    ``len(pos)`` samples raises, and the gradient of ``pos`` shows which samples went in together."""

    def __init__(self, model: nn.Module, rows: int, features: int, seed: int):
        super().__init__()
        self.model = model
        g = torch.Generator().manual_seed(seed)
        self.pos = nn.Parameter(0.5 * torch.randn(rows, features, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, rows = x.shape[0], self.pos.shape[0]
        if n > rows:
            raise ValueError(f"the model was called on {n} samples at once; it takes at most {rows} per call")
        return self.model(x + self.pos[:n])


def ch03_describe(value) -> dict:
    """What a function returned: its type and, for a tensor, shape, dtype and autograd flags."""
    if isinstance(value, torch.Tensor):
        return {"type": "Tensor", "shape": list(value.shape), "dtype": str(value.dtype),
                "requires_grad": bool(value.requires_grad), "has_grad_fn": value.grad_fn is not None,
                "value": value.detach().clone()}
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return {"type": type(value).__name__, "shape": None, "dtype": None, "requires_grad": None,
            "has_grad_fn": None, "value": number}


class ch03_Batches:
    """A re-iterable of batches with neither ``len`` nor indexing, like a ``DataLoader``: every ``iter()``
    starts a new epoch from the first batch."""

    def __init__(self, batches: list):
        self.batches = list(batches)

    def __iter__(self):
        return iter(list(self.batches))
