"""Fast mode: tests and the autograder set COURSE_FAST=1 so that experiments shrink.

Chapters write sizes as ``fast(full, small)``: students see the full experiment, the
test suite runs the small one. Results that are asserted never depend on the mode.
"""
import os

FAST: bool = os.environ.get("COURSE_FAST", "") not in ("", "0", "false", "False")


def fast(full, small):
    """Return ``small`` in fast mode (COURSE_FAST=1), else ``full``."""
    return small if FAST else full
