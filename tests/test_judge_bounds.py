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
from conftest import ROOT, UNISOLATED
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


FLOODS = {
    # A reply that json.loads would turn into 3 million Python objects: refused before parsing.
    "flood-values": '''def predict_training_memory(model, batch_size, optimizer):
    return {"params": [0] * 3_000_000}
''',
    # 60 MB, near the 64 MiB frame limit, that json.loads would turn into 15 million lists (over
    # 2 GiB in the judge, measured with the checks turned off): refused before parsing.
    "flood-lists": '''def predict_training_memory(model, batch_size, optimizer):
    return {"params": [[]] * 15_000_000}
''',
    # Many small containers inside the value budget (codec.MAX_ITEMS bounds them).
    "flood-containers": '''def predict_training_memory(model, batch_size, optimizer):
    return {"params": [[] for _ in range(400_000)]}
''',
    # A tensor whose shape broadcasts against anything.
    "broadcast": '''def predict_training_memory(model, batch_size, optimizer):
    return {"params": torch.zeros(200_000, 1, 1), "grads": torch.zeros(200_000, 1, 1)}
''',
}
# The judge grades an honest batch first (imports, the sandbox, the references: what any batch
# costs), then the hostile one; what the hostile replies add is their peak over the resident
# memory the judge had before them (Linux's VmHWM, reset by writing 5 to /proc/self/clear_refs).
JUDGE_PEAK = '''
import sys
from pathlib import Path
from grader.__main__ import main

def status(key):
    return next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith(key + ":"))

honest, hostile, out, *flags = sys.argv[1:]
assert main(["autograde", honest, "--out", out + "/warm", "--workers", "1", *flags]) == 0
Path("/proc/self/clear_refs").write_text("5")
before = status("VmRSS")
code = main(["autograde", hostile, "--out", out + "/hostile", "--workers", "1", *flags])
print("kib", before, status("VmHWM"))
sys.exit(code)
'''
HOSTILE_BUDGET_MIB = 400  # one reply: a 64 MiB frame and at most a million decoded values


@pytest.mark.slow
def test_the_judge_memory_stays_bounded_under_hostile_replies(tmp_path):
    import subprocess
    import sys

    from submissions import reference, with_exercise, write

    warm, sub = tmp_path / "warm", tmp_path / "submitted"
    for folder in (warm, sub):
        write(folder, "honest", "ch00_memory", reference("ch00_memory"))
    for student, source in FLOODS.items():
        write(sub, student, "ch00_memory", with_exercise("ch00_memory", "predict_training_memory", source))
    proc = subprocess.run([sys.executable, "-c", JUDGE_PEAK, str(warm), str(sub), str(tmp_path / "out"), *UNISOLATED],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    before_kib, peak_kib = map(int, proc.stdout.split("kib")[-1].split())
    rows = (tmp_path / "out" / "hostile" / "grades.csv").read_text().splitlines()[1:]
    scores = {}
    for row in rows:
        student, _, _, score, max_score = row.split(",")
        got, mx = scores.get(student, (0.0, 0.0))
        scores[student] = (got + float(score), mx + float(max_score))
    assert scores["honest"][0] == scores["honest"][1] > 0
    for student in FLOODS:
        assert scores[student][0] < scores[student][1], student
    added = (peak_kib - before_kib) / 1024
    print(f"judge resident memory: {before_kib / 1024:.0f} MiB after an honest batch, "
          f"peak {peak_kib / 1024:.0f} MiB grading hostile replies (+{added:.0f} MiB)")
    assert added < HOSTILE_BUDGET_MIB, f"hostile replies took the judge {added:.0f} MiB above its resident memory"
