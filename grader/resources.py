"""Resource bounds that hidden tests read from outside the student's process.

A check builds large inputs *in* the student's process (sending hundreds of megabytes through
the pipe would cost time and the judge's memory), lets the student's code run, and reads what
the process holds before and after with ``nb.memory()`` (``grader.sandbox.meter``): kernel
numbers, not probe claims. Inputs are sized so that a correct and a wrong implementation differ
by tens of megabytes, far above page-level noise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

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


def held_by(nb, run: Callable[[], object]) -> tuple[Held, object]:
    """Run ``run()`` (calls into the student's process) between two outside readings.

    ``run`` returns the handles that must stay alive for the reading after it (for example a loss
    whose graph holds what was saved for backward); everything else it created is dropped first.
    """
    before = nb.memory(reset_peak=True)
    keep = run()
    after = nb.memory()
    return Held(kept=after.held - before.held, peak=after.peak - before.peak), keep


def mib(n: int) -> str:
    return f"{n / MiB:,.1f} MiB"
