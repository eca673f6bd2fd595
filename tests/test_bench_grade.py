"""``make bench-grade`` (``python -m grader.bench_grade``) at a tiny N on one cheap chapter.

It never asserts a time: it checks what the bench prints and writes, and that the grades it produces are
those of the normal path (the run's single-machine batch, ``graded_once``) and of plain nbgrader."""
from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from conftest import ROOT, UNISOLATED
import graded_once

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("bench-grade")]
CHAPTER = "ch00_memory"
N = 1  # one correct submission: plain nbgrader runs the whole notebook for each, the cost of this test


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    if UNISOLATED:
        pytest.skip("the bench grades with the isolated sandbox: it needs root")
    out = tmp_path_factory.mktemp("bench-grade")
    proc = subprocess.run([sys.executable, "-m", "grader.bench_grade", CHAPTER, "-n", str(N), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    print(proc.stdout[-4000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"out": out, "stdout": proc.stdout}


def test_bench_ch00_prints_both_graders_and_the_profile(bench):
    lines = bench["stdout"].splitlines()
    row = next(ln for ln in lines if ln.startswith(f"| {CHAPTER} |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == str(N)
    course, plain = float(cells[2]), float(cells[3])
    assert course > 0 and plain > 0
    assert cells[4].endswith("x") and cells[5] == f"{N}/{N}"
    for phase in ("start-up", "sandbox start", "worker start", "setup cells", "hidden checks", "worker stop",
                  "gradebook writes", "feedback pages"):
        assert any(ln.startswith(f"| {phase} |") for ln in lines), phase
    with (bench["out"] / "bench.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["chapter"] for r in rows] == [CHAPTER]
    assert rows[0]["kinds"] == "correct"
    assert (bench["out"] / "profile.md").read_text().strip() in bench["stdout"]


def test_bench_ch00_grades_equal_the_normal_path(bench):
    with (bench["out"] / CHAPTER / "course-grader" / "grades.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    for student, normal in (("bench000-correct", "reference"),):
        got = {r["problem"]: (r["score"], r["max_score"]) for r in rows if r["student_id"] == student}
        want = {r["problem"]: (r["score"], r["max_score"]) for r in graded_once.rows(normal, CHAPTER)}
        assert got == want, student
