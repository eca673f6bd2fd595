"""Wall-clock timings that survive a busy machine: repeats, the minimum, and how far apart they are.

One timing of a training step says little on a shared machine: another process can double it. The
minimum of several repeats is what the code costs when nothing interferes, and the spread of the
repeats says how far a comparison can be trusted::

    from coursekit.timing import time_it, compare
    full = time_it(step_full, repeats=7)
    lora = time_it(step_lora, repeats=7)
    print(full, lora)                  # "12.4 ms (min of 7; median 13.1 ms)"
    print(compare(lora, full))         # "0.62x (lora / full), beyond the repeats' spread" or "... within noise"

Conclusions drawn from timings go through :func:`compare`: a ratio whose intervals (min to median
of each side) overlap is reported as within noise, never as faster or slower.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """Seconds of each repeat (warm-up calls excluded)."""

    times: tuple[float, ...]

    def __post_init__(self):
        if not self.times:
            raise ValueError("a Timing needs at least one repeat")

    @property
    def best(self) -> float:
        """The minimum: the cost with the least interference."""
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def spread(self) -> float:
        """(median - min) / min: how much the machine's load moved the repeats."""
        return (self.median - self.best) / self.best if self.best > 0 else 0.0

    def __str__(self) -> str:
        return f"{_human(self.best)} (min of {len(self.times)}; median {_human(self.median)})"


def _human(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def time_it(fn: Callable[[], object], repeats: int = 7, warmup: int = 1,
            clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Call ``fn()`` ``warmup`` times untimed, then ``repeats`` times, each timed on its own."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return Timing(tuple(times))


def distinct(a: Timing, b: Timing) -> bool:
    """Whether ``a`` and ``b`` differ beyond their repeats' spread: the [min, median] intervals do not overlap."""
    return a.median < b.best or b.median < a.best


def compare(a: Timing, b: Timing, names: tuple[str, str] = ("a", "b")) -> str:
    """``a``'s best time over ``b``'s, and whether the repeats can carry the difference."""
    ratio = a.best / b.best if b.best > 0 else float("inf")
    verdict = "beyond the repeats' spread" if distinct(a, b) else "within noise: no conclusion"
    return f"{ratio:.2f}x ({names[0]} / {names[1]}), {verdict}"
