"""The bounds of one problem's worker, which the judge's caller chooses (``judge.run_checks``)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Limits:
    wall_seconds: float = 60.0  # whole life of one problem's worker
    memory_bytes: int = 4 * 1024**3  # address-space limit of the worker (raise if torch needs more)
    output_bytes: int = 1024**2  # student stdout/stderr kept on disk (never shown)
    max_processes: int = 64
