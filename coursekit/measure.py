"""Measure what one training step costs: bytes saved for backward and FLOPs.

Saved bytes are counted with ``torch.autograd.graph.saved_tensors_hooks``: every tensor
autograd stores for the backward pass goes through the pack hook, and we count each
underlying storage once (a ReLU output that the next Linear also saves is one buffer).
Parameters and buffers are model state, not activations, so they are reported apart.

Three numbers, because a graph can be freed before the step ends (local losses and DGL call
``backward()`` inside the forward loop; DropBP detaches a sublayer's output):

- ``activation_bytes``: every storage ever packed, counted once and never subtracted;
- ``resident_activation_bytes``: what autograd still holds when the forward ends;
- ``peak_activation_bytes``: the most it held at any moment of the step (forward and backward).

The last two follow autograd's own bookkeeping: the pack hook returns a small holder object
that only the graph references, and ``weakref.finalize`` on it subtracts the bytes when the
graph lets it go (after its backward, or when nothing reaches the graph any more). The holder
keeps ``t.detach()``, not ``t``: ``t -> grad_fn -> saved -> t`` would be a reference cycle that
keeps freed graphs alive until the garbage collector runs.

Nested ``saved_tensors_hooks`` do not compose (only the innermost pair runs), so a caller's own
compression hooks are passed in (``pack=``, ``unpack=``) and run inside ours; we then count the
bytes of what ``pack`` returned.
FLOPs come from ``torch.utils.flop_counter.FlopCounterMode`` (matmuls and convolutions;
elementwise ops count 0, as in the papers' FLOP tables).
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable

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
    resident_activation_bytes: int = 0  # activation storages autograd still holds when the forward ends
    peak_activation_bytes: int = 0  # the most activation bytes held at once during forward + backward

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


class _Holder:
    """What the pack hook hands to autograd: only the graph references it, so its finalizer
    runs when the graph releases the saved tensor."""

    __slots__ = ("packed", "__weakref__")

    def __init__(self, packed):
        self.packed = packed


def _walk(obj, found: dict) -> None:
    """Collect the tensors inside ``obj`` (a tensor, or tuples/lists/dicts of them) by storage."""
    if isinstance(obj, torch.Tensor):
        found.setdefault(_storage_key(obj), obj)
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            _walk(item, found)
    elif isinstance(obj, dict):
        for item in obj.values():
            _walk(item, found)


def _detached(obj):
    """``obj`` with every tensor inside tuples/lists/dicts detached (same storages, no graph)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, tuple):
        items = [_detached(item) for item in obj]
        return type(obj)._make(items) if hasattr(type(obj), "_make") else type(obj)(items)
    if isinstance(obj, list):
        return [_detached(item) for item in obj]
    if isinstance(obj, dict):
        return {k: _detached(v) for k, v in obj.items()}
    return obj


class saved_tensors:
    """Context manager recording every storage saved for backward inside it.

    >>> with saved_tensors(model) as rec:
    ...     loss = model(x).sum()
    >>> rec.activation_bytes, rec.resident_activation_bytes, rec.peak_activation_bytes

    ``label``, if given, is called each time a new storage is saved; its result is kept as that
    storage's :attr:`SavedTensor.label` (e.g. which layer is running), to break the bytes down.

    ``pack`` and ``unpack``, if given, are the caller's own saved-tensor hooks (e.g. activation
    compression): ``pack(t)`` runs on every saved tensor and may return a tensor or tuples, lists
    and dicts holding tensors (and other values); ``unpack(packed)`` gets that back in backward.
    The bytes counted are those of the tensors inside what ``pack`` returned, one per storage.

    Resident bytes are tracked as long as the saved graphs live, also after the context exits
    (``measure`` keeps recording during backward, where a recomputing backward saves again;
    :meth:`stop_recording` keeps such late saves out of :attr:`tensors`).
    """

    def __init__(self, *state: nn.Module | torch.Tensor, label: Callable[[], Hashable] | None = None,
                 pack: Callable[[torch.Tensor], Any] | None = None, unpack: Callable[[Any], torch.Tensor] | None = None):
        if (pack is None) != (unpack is None):
            raise ValueError("pass pack= and unpack= together (or neither)")
        self._state = state
        self._label = label
        self._user_pack, self._user_unpack = pack, unpack
        self._seen: dict[tuple, tuple] = {}  # storage key -> (its SavedTensor, weakref to the storage)
        self._records: list[SavedTensor] = []  # every storage saved while recording, in order
        self._recording = True
        self._live: dict[tuple, list] = {}  # storage key -> [references held by graphs, nbytes, is_state]
        self._live_activation = 0
        self._peak_activation = 0
        self._hooks = _saved_tensors_hooks(self._pack, self._unpack)

    def _is_state(self, t: torch.Tensor, key: tuple) -> bool:
        # Linear saves W.t(), a view: its base is the Parameter.
        return isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter) or key in self._state_keys

    def _pack(self, t: torch.Tensor) -> _Holder:
        packed = t if self._user_pack is None else self._user_pack(t)
        # What pack made of a parameter (a compressed copy) still counts as model state.
        from_state = self._is_state(t, _storage_key(t))
        found: dict[tuple, torch.Tensor] = {}
        _walk(packed, found)
        keys = []
        for key, p in found.items():
            seen = self._seen.get(key)
            if seen is not None and seen[1]() is None:
                seen = None  # that storage was freed; this one reuses its address
            if seen is not None:
                is_state = seen[0].is_state
            else:
                is_state = from_state or self._is_state(p, key)
                if self._recording:
                    label = None if self._label is None else self._label()
                    record = SavedTensor(tuple(p.shape), p.dtype, key[3], is_state, label)
                    # A weak reference to the storage tells a later save at the same address apart.
                    self._seen[key] = (record, weakref.ref(p.untyped_storage()))
                    self._records.append(record)
            self._acquire(key, key[3], is_state)
            keys.append(key)
        holder = _Holder(_detached(packed))
        weakref.finalize(holder, self._release, tuple(keys))
        return holder

    def _unpack(self, holder: _Holder) -> torch.Tensor:
        return holder.packed if self._user_unpack is None else self._user_unpack(holder.packed)

    def _acquire(self, key: tuple, nbytes: int, is_state: bool) -> None:
        entry = self._live.get(key)
        if entry is not None:
            entry[0] += 1
            return
        self._live[key] = [1, nbytes, is_state]
        if not is_state:
            self._live_activation += nbytes
            self._peak_activation = max(self._peak_activation, self._live_activation)

    def _release(self, keys: tuple) -> None:
        for key in keys:
            entry = self._live[key]
            entry[0] -= 1
            if entry[0] == 0:
                del self._live[key]
                if not entry[2]:
                    self._live_activation -= entry[1]

    def __enter__(self) -> "saved_tensors":
        self._state_keys = _state_keys(self._state)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

    def stop_recording(self) -> None:
        """From now on new storages count towards resident and peak bytes only, not :attr:`tensors`."""
        self._recording = False

    @property
    def tensors(self) -> tuple[SavedTensor, ...]:
        return tuple(self._records)

    @property
    def activation_bytes(self) -> int:
        """Bytes of every activation storage ever saved (never subtracted)."""
        return sum(s.nbytes for s in self._records if not s.is_state)

    @property
    def saved_bytes(self) -> int:
        return sum(s.nbytes for s in self._records)

    @property
    def resident_activation_bytes(self) -> int:
        """Activation bytes the saved graphs hold right now."""
        return self._live_activation

    @property
    def peak_activation_bytes(self) -> int:
        """The most activation bytes held at once so far."""
        return self._peak_activation


def measure(
    step: Callable[[], torch.Tensor],
    *state: nn.Module | torch.Tensor,
    grad: torch.Tensor | None = None,
    pack: Callable[[torch.Tensor], Any] | None = None,
    unpack: Callable[[Any], torch.Tensor] | None = None,
) -> Measurement:
    """Run one forward + backward and report what it saved and computed.

    Args:
        step: callable running the forward pass; returns the loss (a scalar) or an output
            tensor, in which case ``grad`` (same shape) is back-propagated. It may call
            ``backward()`` itself on parts of the graph (local losses): their bytes leave the
            resident count when autograd frees them.
        *state: modules (or tensors) whose parameters and buffers count as model state,
            not activations. Any ``nn.Parameter`` is recognised as state anyway.
        grad: output gradient for a non-scalar output.
        pack, unpack: your own saved-tensor hooks (e.g. compression), applied to every tensor
            saved during the step (forward and backward); pass both or neither. Do not wrap
            ``measure`` in your own ``saved_tensors_hooks`` instead: nested hooks do not compose,
            only the innermost pair runs. Bytes are those of the tensors ``pack`` returned
            (inside tuples, lists and dicts), one per storage.

    Returns:
        A :class:`Measurement`. Bytes and FLOPs are exact and deterministic on CPU.
        ``activation_bytes`` counts every activation storage saved during the forward once;
        ``resident_activation_bytes`` those still held when ``step()`` returned;
        ``peak_activation_bytes`` the most held at any moment of forward + backward.
    """
    if not callable(step):
        raise TypeError(f"step must be a callable returning the loss, got {type(step).__name__}")
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    with saved_tensors(*state, pack=pack, unpack=unpack) as rec:
        with flop_counter() as fwd:
            out = step()
        resident = rec.resident_activation_bytes
        if not isinstance(out, torch.Tensor) or out.grad_fn is None:
            raise ValueError(
                "step() must return a tensor attached to the autograd graph (did the model have "
                "no trainable parameters, or did step() run under torch.no_grad()?)"
            )
        if grad is None and out.numel() != 1:
            raise ValueError(f"step() returned shape {tuple(out.shape)}: pass grad= for a non-scalar output")
        rec.stop_recording()  # a recomputing backward saves again: peak only, not activation_bytes
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
        resident_activation_bytes=resident,
        peak_activation_bytes=rec.peak_activation_bytes,
    )
