"""Resource bounds that hidden tests read from outside the student's process.

A check builds large inputs *in* the student's process (sending hundreds of megabytes through
the pipe would cost time and the judge's memory), lets the student's code run, and reads what
the process holds before and after with ``nb.memory()`` (``grader.sandbox.meter``): kernel
numbers, not probe claims. A check creates its :class:`Meter` first, right after the program
ran, so that nothing the student's code holds from earlier goes unaccounted. Inputs are sized so
that a correct and a wrong implementation differ by tens of megabytes, far above page-level
noise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from grader.api import LocalNamespace

MiB = 1024**2


def fresh_tensor(nb, shape: tuple[int, ...], dtype: torch.dtype = torch.float32, requires_grad: bool = True):
    """A random tensor made in the student's process that only the returned handle holds.

    With ``requires_grad`` it is a non-leaf (a large random tensor plus a 0-d leaf): the graph
    behind it keeps nothing large alive, so once the handle is dropped its memory stays held
    only if the student's code kept it (saved it for backward, cached it, ...).
    """
    seed = nb.put(torch.zeros((), dtype=dtype, requires_grad=requires_grad))
    big = seed.new_empty(tuple(int(s) for s in shape))
    big.normal_()
    return big.add(seed) if requires_grad else big


@dataclass(frozen=True)
class Held:
    """Bytes the student's process gained over a call: still held after it, and at its peak."""

    kept: int
    peak: int


FOOTPRINT = 2 * MiB  # what exercise cells may hold once run: they define functions and classes
GROWTH = 3 * MiB  # what the student's code may keep between the check's start and a measured call
DROP = 2 * MiB  # what a measured call may free of what was held before it


class Meter:
    """Outside readings for one check, taken from its very start (right after the program ran).

    A reading compares two moments, so memory held *before* the measured call and freed during
    it would hide what the call keeps ("ballast"). The meter closes that: the exercise cells may
    hold almost nothing once run beyond what the course's own do (the first reading against
    ``nb.baseline_held()``, a worker that ran the setup cells and the course's exercise cells); between the check's start and a measured call, the student's code may keep only
    ``GROWTH`` bytes (its own parameters, a warm-up's leftovers; what the judge builds there goes
    through :meth:`judge` and is not counted); and a call may not end holding less than it started
    with. Create the meter first thing in a check, before any call into the student's code.
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
        self.judged = 0
        # In-kernel (an instructor's own notebook, the tests of hidden tests) judge and student share one
        # trusted process: only the measured call's own growth is read there.
        self.strict = not isinstance(nb, LocalNamespace)

    def judge(self, build: Callable[[], object]):
        """Run ``build()``, which makes the judge's own inputs in the student's process (no student code):
        what it holds is not counted as growth."""
        before = self.nb.memory()
        made = build()
        self.judged += self.nb.memory().held - before.held
        return made

    def held_by(self, run: Callable[[], object], allowed_growth: int = GROWTH) -> tuple[Held, object]:
        """Run ``run()`` (calls into the student's process) between two outside readings.

        ``run`` returns the handles that must stay alive for the reading after it (for example a
        loss whose graph holds what was saved for backward); everything else it made is dropped.
        """
        before = self.nb.memory(reset_peak=True)
        grown = before.held - self.base.held - self.judged
        if self.strict and grown > allowed_growth:
            raise AssertionError(
                f"before the measured call your code already held {mib(grown)} more than "
                "at the start of this check (read from outside your process): memory kept from earlier calls "
                "(caches, buffers) is counted against the call that is measured; keep nothing between calls")
        keep = run()
        after = self.nb.memory()
        if self.strict and after.held < before.held - DROP:
            raise AssertionError(
                f"during the measured call your process let go of {mib(before.held - after.held)} it held before "
                "the call (read from outside your process): memory held before a call and freed during it would "
                "hide what the call keeps; keep nothing between calls")
        return Held(kept=after.held - before.held, peak=after.peak - before.peak), keep


def mib(n: int) -> str:
    return f"{n / MiB:,.1f} MiB"
