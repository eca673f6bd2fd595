"""Resource bounds that hidden tests read from outside the student's process.

A check builds large inputs *in* the student's process (sending hundreds of megabytes through
the pipe would cost time and the judge's memory), lets the student's code run, and reads what
the process holds before and after with ``nb.memory()``: what the kernel charges the worker's
cgroup (``grader.sandbox.cgroups``), not probe claims. Inputs are sized so that a correct and a
wrong implementation differ by tens of megabytes, far above the readings' noise.

The rules a resource check follows (``grader/sandbox/judge.py``, item 8), and how :class:`Meter`
keeps them:

1. **Read from outside.** Only :meth:`Meter.held_by`'s readings decide a point; what a probe
   measures inside the process (saved bytes, FLOPs, traces) only explains a failure.
2. **Nothing credited on trust.** The judge's own inputs are made *before* the window, through
   :meth:`Meter.tensor` and :meth:`Meter.put`, and booked at their known size (elements times bytes),
   never at what a reading shows while they were made (student code, a garbage-collection finalizer,
   could run then). A baseline is the course's own code measured by the judge, never a student object.
3. **No student code between a reading and its call.** The worker collects its garbage (student
   finalizers run) before each reading; inputs are made before the reading that opens the window.
4. **Ballast bounded.** Memory held before the measured call and freed during it would hide what the
   call keeps. The exercise cells may hold at most :data:`FOOTPRINT` more than the course's own once
   run; at the measured call, the process may hold at most ``allowed_growth`` (:data:`GROWTH`) beyond
   that, the judge's booked inputs aside, counted from the reading taken once the setup cells ran
   (before any student code: a finalizer run by a later garbage collection cannot pad the floor); the
   call may not end holding :data:`DROP` less than it started with. So a call can hide at most
   ``FOOTPRINT + allowed_growth`` of what it keeps: every bound a check tests must sit that far below
   what a wrong implementation keeps.
5. **Values on the same call.** A check compares what the measured call computed with the judge's own
   reference on the same inputs (:func:`seeded`: the judge makes the same values), so code that
   behaves differently when it is measured is wrong where it does.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import torch

from grader.api import LocalNamespace

MiB = 1024**2
FOOTPRINT = 2 * MiB  # what exercise cells may hold, once run, beyond the course's own
GROWTH = 3 * MiB  # what the student's code may keep between the check's start and a measured call
DROP = 2 * MiB  # what a measured call may free of what was held before it


_DRAW = random.SystemRandom()  # sizes and seeds of resource cases: unknown until grading time


def draw(low: int, high: int, multiple_of: int = 1) -> int:
    """A size drawn at grading time, uniformly among the multiples of ``multiple_of`` in [low, high]: the
    range a chapter's text states, never one documented size."""
    first, last = -(-low // multiple_of), high // multiple_of
    if first > last:
        raise ValueError(f"no multiple of {multiple_of} in [{low}, {high}]")
    return _DRAW.randint(first, last) * multiple_of


def new_seed() -> int:
    """A seed drawn at grading time (for :func:`seeded` and ``Meter.tensor(..., seed=)``)."""
    return _DRAW.randrange(1, 2**31)


def seeded(shape: Sequence[int], dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """The values :func:`fresh_tensor` makes with ``seed``, made in the judge (standard normal)."""
    generator = torch.Generator().manual_seed(int(seed))
    return torch.randn(tuple(int(s) for s in shape), generator=generator, dtype=dtype)


def fresh_tensor(nb, shape: Sequence[int], dtype: torch.dtype = torch.float32, requires_grad: bool = True,
                 seed: int | None = None):
    """A random tensor made in the student's process that only the returned handle holds.

    With ``seed``, its values are :func:`seeded`'s (the judge can compute the reference on them);
    without, any standard-normal values. With ``requires_grad`` it is a non-leaf (the random tensor
    plus a 0-d leaf): the graph behind it keeps nothing large alive, so once the handle is dropped
    its memory stays held only if the student's code kept it (saved it for backward, cached it, ...).
    """
    return _fresh(nb, shape, dtype, requires_grad, seed)[0]


def _fresh(nb, shape, dtype, requires_grad, seed):
    """:func:`fresh_tensor` and its 0-d leaf (None without ``requires_grad``): after a backward pass, the
    leaf's ``.grad`` is the sum of the gradient with respect to the tensor, a checksum the judge can
    recompute."""
    shape = tuple(int(s) for s in shape)
    leaf = nb.put(torch.zeros((), dtype=dtype, requires_grad=requires_grad))
    if seed is None:
        big = leaf.new_empty(shape)
        big.normal_()
    else:
        generator = nb.put(torch.Generator)()
        generator.manual_seed(int(seed))
        big = nb.put(torch.randn)(shape, generator=generator, dtype=dtype)
    return (big.add(leaf), leaf) if requires_grad else (big, None)


def tensor_bytes(obj) -> int:
    """Bytes of the tensors in ``obj`` (a tensor, a module's parameters and buffers, or a list, tuple or
    dict of them), each storage once."""
    seen: dict = {}

    def walk(o) -> None:
        if isinstance(o, torch.Tensor):
            storage = o.untyped_storage()
            seen[storage.data_ptr(), storage.nbytes()] = storage.nbytes()
        elif isinstance(o, torch.nn.Module):
            for t in (*o.parameters(), *o.buffers()):
                walk(t)
        elif isinstance(o, (list, tuple)):
            for item in o:
                walk(item)
        elif isinstance(o, dict):
            for item in o.values():
                walk(item)

    walk(obj)
    return sum(seen.values())


class Made(NamedTuple):
    """A judge input made in the student's process (:meth:`Meter.tensor`): the tensor's handle, and its 0-d
    leaf (None without ``requires_grad``)."""

    tensor: object
    leaf: object


@dataclass(frozen=True)
class Held:
    """Bytes the student's process gained over a call: still held after it, and at its peak."""

    kept: int
    peak: int
    leaves: tuple = ()  # the inputs' 0-d leaves (Meter.held_by)


class Meter:
    """Outside readings for one check, taken from its very start (right after the program ran).

    Create it first thing in a check, before any call into the student's code; make the judge's inputs
    with :meth:`tensor` and :meth:`put`; measure with :meth:`held_by`. See the module's rules.
    """

    def __init__(self, nb):
        self.nb = nb
        self.base = nb.memory()
        mine, course = nb.exercise_cells_held(), nb.baseline_held()
        if mine is not None and course is not None and mine - course > FOOTPRINT:
            raise AssertionError(
                f"once your exercise cells had run, before the grader called anything, they held "
                f"{mib(mine - course)} more than the course's own exercise cells (read from outside your "
                "process): exercise cells define functions and classes; allocate memory inside them, when they "
                "are called")
        # What the process may hold before a measured call, the judge's inputs aside: bounded against the reading
        # taken once the setup cells ran (before any student code) plus what the course's own exercise cells
        # hold, not against this first reading, which a finalizer of the student's could already have padded.
        setup = nb.setup_cells_held()
        self.floor = setup + course + FOOTPRINT if setup is not None and course is not None else self.base.held
        self.booked = 0  # bytes of the judge's inputs alive in the process now, at their known size
        # In-kernel (an instructor's own notebook, the tests of hidden tests) judge and student share one
        # trusted process: only the measured call's own growth is read there.
        self.strict = not isinstance(nb, LocalNamespace)

    # -- the judge's inputs, booked at their known size
    def tensor(self, shape: Sequence[int], dtype: torch.dtype = torch.float32, requires_grad: bool = True,
               seed: int | None = None):
        """:func:`fresh_tensor`, booked: a :class:`Made` (see :meth:`held_by` for what its leaf tells)."""
        made = Made(*_fresh(self.nb, shape, dtype, requires_grad, seed))
        numel = 1
        for s in shape:
            numel *= int(s)
        self.booked += numel * torch.empty((), dtype=dtype).element_size()
        return made

    def put(self, value):
        """``nb.put(value)`` (a module, a tensor), booked at the bytes of its tensors."""
        self.booked += tensor_bytes(value)
        return self.nb.put(value)

    def held_by(self, call: Callable[..., object], inputs: Callable[[], Sequence] | None = None,
                allowed_growth: int = GROWTH) -> tuple[Held, object]:
        """Run ``call(*inputs())`` between two outside readings.

        ``inputs`` makes the judge's inputs of the call before the window opens (through :meth:`tensor` and
        :meth:`put`; a :class:`Made` is passed to ``call`` as its tensor; plain values pass as they are); they are
        dropped when it returns. ``kept`` is then what the process holds beyond them once the call returned
        and everything else it made was dropped, except what ``call`` returns (the handles that must stay
        alive for the reading after it, for example a loss whose graph holds what was saved for
        backward); an input the student's code kept counts as kept. ``peak`` is the most the process held
        during the call beyond what it held before. ``Held.leaves`` are the inputs' 0-d leaves: after a
        backward pass through what ``call`` returned, each one's ``.grad`` is the sum of the gradient
        with respect to its input (see :func:`fresh_tensor`).
        """
        booked = self.booked
        made = list(inputs()) if inputs is not None else []
        input_bytes = self.booked - booked
        args = [m.tensor if isinstance(m, Made) else m for m in made]
        leaves = tuple(m.leaf for m in made if isinstance(m, Made) and m.leaf is not None)
        before = self.nb.memory(reset_peak=True)
        grown = before.held - self.floor - self.booked
        if self.strict and grown > allowed_growth:
            raise AssertionError(
                f"before the measured call your code already held {mib(grown)} more than "
                "its exercise cells may hold plus what it may keep in this check (read from outside your process): "
                "memory kept from earlier calls (caches, buffers) is counted against the call that is measured; "
                "keep nothing between calls")
        keep = call(*args)
        del made, args
        self.booked -= input_bytes  # dropped: gone from the process unless the student's code kept them
        after = self.nb.memory()
        if self.strict and after.held < before.held - input_bytes - DROP:
            raise AssertionError(
                f"during the measured call your process let go of {mib(before.held - input_bytes - after.held)} it "
                "held before the call (read from outside your process): memory held before a call and freed during "
                "it would hide what the call keeps; keep nothing between calls")
        return Held(kept=after.held - before.held + input_bytes, peak=after.peak - before.peak, leaves=leaves), keep


    def cpu_by(self, call: Callable[..., object], inputs: Callable[[], Sequence] | None = None
               ) -> tuple[float, object]:
        """CPU seconds the student's process used for ``call(*inputs())``, all its threads together, read from
        outside it (its cgroup), and what ``call`` returned. Inputs are made before the first reading, as in
        :meth:`held_by`. A compute property rests on this where a correct and a wasteful implementation
        differ by orders of magnitude: CPU time is the process's own, whatever else the machine runs."""
        made = list(inputs()) if inputs is not None else []
        args = [m.tensor if isinstance(m, Made) else m for m in made]
        start = self.nb.cpu_time()
        keep = call(*args)
        end = self.nb.cpu_time()
        if start is None or end is None:
            raise AssertionError("the grader could not read your process's CPU time")
        return end - start, keep


def mib(n: int) -> str:
    return f"{n / MiB:,.1f} MiB"
