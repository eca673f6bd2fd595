"""Probes of chapter 0 (memory): layers on the meta device that refuse to run."""
from __future__ import annotations

import torch
from torch import nn


class _ch00_Unrunnable:
    """A module with shapes and no data that refuses to run, move, materialise or take new tensors."""

    def forward(self, *args, **kwargs):
        raise RuntimeError("this model cannot be run: predict from its layers' shapes")

    def _apply(self, fn, recurse=True):  # .to, .to_empty, .float, .cpu, ... all go through _apply
        raise RuntimeError("this model cannot be moved or materialised: predict from its layers' shapes")

    def __setattr__(self, name, value):
        if isinstance(value, torch.Tensor) and vars(self).get("_ch00_sealed"):
            raise RuntimeError(f"this model's {name} cannot be replaced: predict from its layers' shapes")
        super().__setattr__(name, value)

    def seal(self):
        object.__setattr__(self, "_ch00_sealed", True)
        return self


class ch00_meta:
    """Linear, ReLU and Sequential on the meta device that cannot be run (see ``_ch00_Unrunnable``);
    ``isinstance`` and the class names are those of ``torch.nn``."""

    class Linear(_ch00_Unrunnable, nn.Linear):
        def __init__(self, in_features: int, out_features: int, bias: bool = True):
            super().__init__(in_features, out_features, bias=bias, device="meta")
            self.seal()

    class ReLU(_ch00_Unrunnable, nn.ReLU):
        def __init__(self):
            super().__init__()
            self.seal()

    class Sequential(_ch00_Unrunnable, nn.Sequential):
        def __init__(self, *modules: nn.Module):
            super().__init__(*modules)
            self.seal()
