"""The bounds of one problem's worker, which the judge's caller chooses (``judge.run_checks``)."""
from __future__ import annotations

from dataclasses import dataclass

WALL_FACTOR = 5  # the wall-clock backstop, in multiples of the CPU-time limit


@dataclass
class Limits:
    # CPU time of one problem's worker, all its threads together, read from outside it (its cgroup):
    # a busy machine or a hostile neighbour slows a worker down but does not use up its time.
    cpu_seconds: float = 60.0
    # Wall-clock backstop against code that waits instead of computing (sleeps, blocks);
    # None: WALL_FACTOR x cpu_seconds.
    wall_seconds: float | None = None
    memory_bytes: int = 4 * 1024**3  # the worker's memory (its cgroup) and address space (raise if torch needs more)
    output_bytes: int = 1024**2  # student stdout/stderr kept on disk (never shown)
    max_processes: int = 64  # tasks in the worker's cgroup: its threads (it may start no process)

    @property
    def wall(self) -> float:
        return float(self.wall_seconds) if self.wall_seconds is not None else WALL_FACTOR * float(self.cpu_seconds)
