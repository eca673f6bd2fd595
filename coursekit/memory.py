"""Analytic model-state memory: parameters, gradients and optimizer state.

These do not need measuring: they follow from the parameter list. Activations do need
measuring (see :mod:`coursekit.measure`).
"""
from __future__ import annotations

from torch import nn

# Optimizer state per trainable parameter, in copies of the parameter:
# SGD keeps nothing, SGD with momentum one velocity, Adam two moments (m and v).
OPTIMIZER_STATE_COPIES = {"sgd": 0, "momentum": 1, "adam": 2}


def optimizer_state_copies(optimizer: str) -> int:
    try:
        return OPTIMIZER_STATE_COPIES[optimizer]
    except (KeyError, TypeError):
        known = ", ".join(repr(k) for k in OPTIMIZER_STATE_COPIES)
        raise ValueError(f"unknown optimizer {optimizer!r}: expected one of {known}") from None


def model_state_bytes(model: nn.Module, optimizer: str = "adam") -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state for ``model``.

    Gradients and optimizer state exist only for parameters with ``requires_grad``
    (frozen parameters cost their storage and nothing else).

    Returns:
        dict with keys "params", "grads", "optimizer_state".
    """
    copies = optimizer_state_copies(optimizer)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return {"params": params, "grads": trainable, "optimizer_state": copies * trainable}


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
