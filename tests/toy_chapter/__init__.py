"""A tiny chapter for testing the sandbox: its notebook cells and its hidden tests.

``register()`` makes the hidden tests importable as ``grader.hidden.ch99_toy`` (in this
process only), so that ``grader.api.checks_for("ch99_toy")`` finds them.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

CHAPTER = "ch99_toy"
GRADE_IDS = ["test_scaled_sum", "test_linear_no_bias"]

SETUP = """\
import math

import torch
from torch import nn
"""

SOLUTION = '''\
def scaled_sum(x, alpha):
    """alpha times the sum of x over its last dimension: (..., n) -> (...)."""
    return alpha * x.sum(dim=-1)


class LinearNoBias(nn.Module):
    """y = x Wᵀ with W of shape (out_features, in_features); x: (..., in) -> (..., out)."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_features, in_features) / math.sqrt(in_features))

    def forward(self, x):
        return x @ self.weight.T
'''

BLANK = '''\
def scaled_sum(x, alpha):
    """alpha times the sum of x over its last dimension: (..., n) -> (...)."""
    # YOUR CODE HERE
    raise NotImplementedError()


class LinearNoBias(nn.Module):
    """y = x Wᵀ with W of shape (out_features, in_features); x: (..., in) -> (..., out)."""

    def __init__(self, in_features, out_features):
        super().__init__()
        # YOUR CODE HERE
        raise NotImplementedError()

    def forward(self, x):
        # YOUR CODE HERE
        raise NotImplementedError()
'''


def register() -> None:
    """Import the hidden tests as ``grader.hidden.ch99_toy`` (once per process)."""
    name = f"grader.hidden.{CHAPTER}"
    if name in sys.modules:
        return
    import grader.hidden

    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{CHAPTER}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    setattr(grader.hidden, CHAPTER, module)


def hidden_source() -> str:
    return Path(__file__).with_name(f"{CHAPTER}.py").read_text()


def program(*cells: str) -> list[str]:
    """The setup cell followed by ``cells``."""
    return [SETUP, *cells]


def canary() -> str:
    """The secret string of the hidden tests (which must never reach a worker or a reason)."""
    register()
    return sys.modules[f"grader.hidden.{CHAPTER}"].CANARY
