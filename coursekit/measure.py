"""Measure what one training step costs: bytes saved for backward and FLOPs.

Saved bytes are counted with ``torch.autograd.graph.saved_tensors_hooks``: every tensor
autograd stores for the backward pass goes through the pack hook, and we count each
underlying storage once (a ReLU output that the next Linear also saves is one buffer).
Parameters and buffers are model state, not activations, so they are reported apart.
FLOPs come from ``torch.utils.flop_counter.FlopCounterMode`` (matmuls and convolutions;
elementwise ops count 0, as in the papers' FLOP tables).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

_saved_tensors_hooks = torch.autograd.graph.saved_tensors_hooks


class _NoModuleTracker:
    """Stands in for FlopCounterMode's module tracker: we only need totals ("Global")."""

    parents = ("Global",)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def flop_counter() -> FlopCounterMode:
    """A FlopCounterMode that reports totals only (``get_total_flops()``)."""
    counter = FlopCounterMode(display=False)
    # The module tracker hooks every module's backward, and those hooks break
    # torch.autograd.grad called inside a custom backward (a checkpoint's recompute).
    counter.mod_tracker = _NoModuleTracker()
    return counter


@dataclass(frozen=True)
class SavedTensor:
    """One storage that autograd kept for backward."""

    shape: tuple[int, ...]  # shape of the first tensor seen on this storage
    dtype: torch.dtype
    nbytes: int  # bytes of the whole underlying storage
    is_state: bool  # a parameter or buffer (model state, not an activation)
    label: Hashable = None  # what ``saved_tensors(label=...)`` returned when the storage was first saved


@dataclass(frozen=True)
class Measurement:
    activation_bytes: int  # saved for backward, unique storages, parameters and buffers excluded
    saved_bytes: int  # everything saved for backward (activations + parameters/buffers)
    forward_flops: int
    backward_flops: int
    wall_time_s: float  # forward + backward, informative only: never assert on it
    peak_cuda_bytes: int | None  # None on CPU
    saved: tuple[SavedTensor, ...] = field(default=(), repr=False)

    @property
    def total_flops(self) -> int:
        return self.forward_flops + self.backward_flops


def _storage_key(t: torch.Tensor) -> tuple:
    s = t.untyped_storage()
    return (t.device.type, t.device.index, s.data_ptr(), s.nbytes())


def _state_keys(modules: Iterable[nn.Module | torch.Tensor]) -> set:
    keys = set()
    for m in modules:
        tensors = [m] if isinstance(m, torch.Tensor) else [*m.parameters(), *m.buffers()]
        keys.update(_storage_key(t) for t in tensors)
    return keys


class saved_tensors:
    """Context manager recording every storage saved for backward inside it.

    >>> with saved_tensors(model) as rec:
    ...     loss = model(x).sum()
    >>> rec.activation_bytes

    ``label``, if given, is called each time a new storage is saved; its result is kept as that
    storage's :attr:`SavedTensor.label` (e.g. which layer is running), to break the bytes down.
    """

    def __init__(self, *state: nn.Module | torch.Tensor, label: Callable[[], Hashable] | None = None):
        self._state = state
        self._label = label
        self._seen: dict[tuple, SavedTensor] = {}
        self._hooks = _saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in self._seen:
            # Linear saves W.t(), a view: its base is the Parameter.
            is_state = isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter) or key in self._state_keys
            label = None if self._label is None else self._label()
            self._seen[key] = SavedTensor(tuple(t.shape), t.dtype, key[3], is_state, label)
        return t

    def __enter__(self) -> "saved_tensors":
        self._state_keys = _state_keys(self._state)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    @property
    def tensors(self) -> tuple[SavedTensor, ...]:
        return tuple(self._seen.values())

    @property
    def activation_bytes(self) -> int:
        return sum(s.nbytes for s in self._seen.values() if not s.is_state)

    @property
    def saved_bytes(self) -> int:
        return sum(s.nbytes for s in self._seen.values())


def measure(
    step: Callable[[], torch.Tensor],
    *state: nn.Module | torch.Tensor,
    grad: torch.Tensor | None = None,
) -> Measurement:
    """Run one forward + backward and report what it saved and computed.

    Args:
        step: callable running the forward pass; returns the loss (a scalar) or an output
            tensor, in which case ``grad`` (same shape) is back-propagated.
        *state: modules (or tensors) whose parameters and buffers count as model state,
            not activations. Any ``nn.Parameter`` is recognised as state anyway.
        grad: output gradient for a non-scalar output.

    Returns:
        A :class:`Measurement`. Bytes and FLOPs are exact and deterministic on CPU.
    """
    if not callable(step):
        raise TypeError(f"step must be a callable returning the loss, got {type(step).__name__}")
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    with saved_tensors(*state) as rec, flop_counter() as fwd:
        out = step()
    if not isinstance(out, torch.Tensor) or out.grad_fn is None:
        raise ValueError(
            "step() must return a tensor attached to the autograd graph (did the model have "
            "no trainable parameters, or did step() run under torch.no_grad()?)"
        )
    if grad is None and out.numel() != 1:
        raise ValueError(f"step() returned shape {tuple(out.shape)}: pass grad= for a non-scalar output")
    with flop_counter() as bwd:
        out.backward(grad)
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    return Measurement(
        activation_bytes=rec.activation_bytes,
        saved_bytes=rec.saved_bytes,
        forward_flops=fwd.get_total_flops(),
        backward_flops=bwd.get_total_flops(),
        wall_time_s=wall,
        peak_cuda_bytes=torch.cuda.max_memory_allocated() if cuda else None,
        saved=rec.tensors,
    )
