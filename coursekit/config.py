"""Fast mode and CPU threads, set once when ``coursekit`` is imported.

Fast mode: tests and the autograder set COURSE_FAST=1 so that experiments shrink. Chapters
write sizes as ``fast(full, small)``: students see the full experiment, the test suite runs
the small one. Results that are asserted never depend on the mode.

Threads: the course's models are tiny, so PyTorch's intra-op threads buy little, and on a
busy 2-core machine they spin against each other (a TinyGPT step measured 14 ms on one thread
and 800 ms on two while another process used the cores). Importing ``coursekit`` therefore
uses :data:`THREADS` threads: the value of COURSE_THREADS if set, else OMP_NUM_THREADS if
set, else 1.
"""
import os

import torch

FAST: bool = os.environ.get("COURSE_FAST", "") not in ("", "0", "false", "False")


def _threads() -> int:
    for key in ("COURSE_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(key, "")
        if value:
            try:
                n = int(value)
            except ValueError:
                raise ValueError(f"{key} must be a positive integer, got {value!r}") from None
            if n < 1:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
            return n
    return 1


THREADS: int = _threads()
torch.set_num_threads(THREADS)


def fast(full, small):
    """Return ``small`` in fast mode (COURSE_FAST=1), else ``full``."""
    return small if FAST else full
