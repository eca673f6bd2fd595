"""Helpers that every chapter notebook imports: measurement, model-state accounting,
tiny models and datasets, gradient checks, and slider widgets.

The measurement functions are exact and deterministic on CPU, so tests and the
autograder can assert on them.
"""
# First: without CUDA, Triton's interpreter must be on before anything imports triton
# (torch's FLOP counter does), or interpreted kernels cannot use triton's own helpers.
import kernels  # noqa: F401  (isort: skip)
from coursekit.config import FAST, fast
from coursekit.measure import Measurement, measure, saved_tensors
from coursekit.memory import model_state_bytes

__all__ = ["FAST", "fast", "Measurement", "measure", "saved_tensors", "model_state_bytes"]
