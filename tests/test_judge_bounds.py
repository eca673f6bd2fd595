"""The judge validates what comes back from a student's process before any arithmetic on it.

Values fetched from the worker may have any shape and any size the reply limit allows: the judge
never broadcasts them against a reference, and a reply cannot make the judge build more Python
objects than a fixed budget.
"""
import re
import resource

import pytest
import torch

from coursekit.checks import check_close, same_close, same_values
from conftest import ROOT
from grader.sandbox.codec import MAX_ITEMS, decode, encode
from grader.sandbox.rpc import Connection, MalformedReply

RAW_COMPARISONS = re.compile(r"torch\.(allclose|equal|isclose)\(")


@pytest.mark.parametrize("path", sorted((ROOT / "grader" / "hidden").glob("ch*.py")), ids=lambda p: p.stem)
def test_hidden_tests_never_broadcast_fetched_values(path):
    found = [f"{path.name}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1)
             if RAW_COMPARISONS.search(line)]
    assert not found, f"use coursekit.checks.same_close / same_values / check_close, which check shapes first: {found}"


def test_a_broadcastable_shape_is_refused_before_any_arithmetic():
    huge = torch.zeros(100_000, 1, 1)  # against (10_000, 10_000) this would broadcast to 4e13 bytes
    ref = torch.zeros(1, 1).expand(10_000, 10_000)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert not same_close(huge, ref)
    assert not same_values(huge, ref)
    with pytest.raises(AssertionError, match="shape"):
        check_close(huge, ref, "the weight")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50 * 1024  # KiB


def test_comparisons_still_compare():
    a = torch.arange(6.0).reshape(2, 3)
    assert same_close(a, a + 1e-9) and not same_close(a, a + 1)
    assert same_values(a.to(torch.int64), a.to(torch.int32)) and not same_values(a, a.T.contiguous().reshape(2, 3))
    assert not same_close(a, [[0, 1, 2], [3, 4, 5]])


def test_decode_refuses_replies_that_would_build_too_many_objects():
    assert decode(encode(list(range(1000)))) == list(range(1000))
    with pytest.raises(ValueError, match="values in one reply"):
        decode("[" + ",".join("0" for _ in range(MAX_ITEMS + 10)) + "]")
    with pytest.raises(ValueError, match="values in one reply"):
        decode("[" + "[]," * (2 * MAX_ITEMS) + "[]]")
    with pytest.raises(ValueError):
        decode('{"__tensor__": "torch.float32", "shape": [-1], "data": ""}')


def test_a_reply_frame_full_of_values_is_malformed_before_parsing():
    conn = Connection(-1, -1, deadline=0.0, wall_seconds=1.0)
    body = b'{"t": "ok", "junk": [' + b"0," * (2 * MAX_ITEMS + 100) + b"0]}"
    with pytest.raises(MalformedReply):
        conn._parse(body)
