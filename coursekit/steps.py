"""The canonical "one training step" of the course: a seeded regression step.

    step = regression_step(model, batch_size=32)   # builds x and target once
    loss = step()                                  # F.mse_loss(model(x), target)
    measure_training_step(model, 32).activation_bytes

Inputs and targets are drawn once from a seeded ``torch.Generator``, so every call with the
same arguments measures exactly the same step (bytes and FLOPs are deterministic).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from coursekit.measure import Measurement, measure


def _linear_layers(model: nn.Module) -> list[nn.Linear]:
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(
            f"{type(model).__name__} has no nn.Linear layer: the regression step takes its input "
            "size from the first Linear and its output size from the last one")
    return linears


def regression_step(model: nn.Module, batch_size: int, seed: int = 0) -> Callable[[], torch.Tensor]:
    """A closure running one forward pass of ``model`` on random data and returning the loss.

    Args:
        model: a module containing at least one ``nn.Linear``; the input has the first
            Linear's ``in_features``, the target the last Linear's ``out_features``.
        batch_size: rows of the batch (a positive integer).
        seed: seed of the generator drawing x ~ N(0, 1) and then target ~ N(0, 1).

    Returns:
        ``step()`` → scalar ``F.mse_loss(model(x), target)``, with x: (batch_size, in_features)
        and target: (batch_size, out_features), dtype and device of the first Linear's weight.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    linears = _linear_layers(model)
    first, last = linears[0], linears[-1]
    gen = torch.Generator().manual_seed(seed)
    # Drawn on the CPU generator, then moved: the same seed gives the same data on any device.
    x = torch.randn(batch_size, first.in_features, generator=gen)  # (B, in_features)
    target = torch.randn(batch_size, last.out_features, generator=gen)  # (B, out_features)
    x = x.to(device=first.weight.device, dtype=first.weight.dtype)
    target = target.to(device=first.weight.device, dtype=first.weight.dtype)

    def step() -> torch.Tensor:
        return F.mse_loss(model(x), target)

    return step


def measure_training_step(model: nn.Module, batch_size: int, seed: int = 0) -> Measurement:
    """:func:`coursekit.measure.measure` of :func:`regression_step` (the model's parameters
    and buffers count as state, not activations)."""
    return measure(regression_step(model, batch_size, seed), model)
