"""Chapter-level hostile submissions, graded end to end in one `python -m grader autograde` batch.

Each case of ``tests/hostile_chapters/`` (format in its README) replaces one exercise cell of a
chapter's reference submission with wrong or forbidden code dressed up to score. One batch
grades every case, one student each, next to the honest reference submission of every chapter
where a case tries to harm other students. A case expecting ``"breach"`` must score 0 on every graded test cell of its exercise
with a reason naming the construct; a case expecting ``"loses"`` must lose points on a graded test cell of its own
exercise. The honest submissions keep full marks.
"""
from __future__ import annotations

import csv
import re
import runpy
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, AUTOGRADE
import profiling
from grader.autograde import release_layout
from grader.notebooks import chapters
from submissions import blank, reasons, reference, with_exercise, write

HERE = Path(__file__).with_name("hostile_chapters")
CASES = sorted(p.stem for p in HERE.glob("*.py"))
# The usual threat classes; a case may name another one (a short snake_case word).
THREATS = {"dispatch", "frames", "raw_memory", "process_start", "spec_gap", "answer_import",
           "saved_hooks", "recorder", "lying_object", "harm_others"}
FIELDS = {"CHAPTER", "EXERCISE", "SOURCE", "THREAT", "EXPECT", "CONSTRUCT", "DESCRIPTION"}
HONEST = "honest"


def load(name: str) -> dict:
    values = runpy.run_path(str(HERE / f"{name}.py"))
    return {k: v for k, v in values.items() if k in FIELDS}


def student(name: str) -> str:
    return "case-" + name.replace("_", "-")


@pytest.mark.parametrize("name", CASES)
def test_case_is_well_formed(name):
    case = load(name)
    assert {"CHAPTER", "EXERCISE", "SOURCE", "THREAT", "EXPECT"} <= case.keys(), f"{name}: missing fields"
    assert case["CHAPTER"] in chapters(), f"{name}: unknown chapter {case['CHAPTER']}"
    assert case["EXERCISE"] in release_layout(case["CHAPTER"]).exercises, f"{name}: unknown exercise"
    assert re.fullmatch(r"[a-z][a-z_]*", str(case["THREAT"])), \
        f"{name}: THREAT is a snake_case class, such as one of {sorted(THREATS)}"
    assert case["EXPECT"] in ("breach", "loses"), f"{name}: EXPECT is 'breach' or 'loses'"
    if case["EXPECT"] == "breach":
        assert case.get("CONSTRUCT"), f"{name}: a 'breach' case names the construct (CONSTRUCT)"


def _selected(session) -> list[str]:
    """The cases this run asks about (``-k ch04`` grades the chapter's cases alone); all when none is named."""
    wanted = {item.callspec.params["name"] for item in session.items
              if getattr(item, "originalname", "") == "test_case_meets_its_expectation" and hasattr(item, "callspec")}
    return [name for name in CASES if name in wanted] or list(CASES)


@pytest.fixture(scope="module")
def batch(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("hostile-chapters")
    sub, out = tmp / "submitted", tmp / "out"
    cases = {}
    for name in _selected(request.session):  # one that does not load fails test_case_is_well_formed, not the batch
        try:
            cases[name] = load(name)
        except Exception:  # noqa: BLE001
            continue
    # Honest neighbours where a case tries to harm others (the references' own grade is checked once
    # per run, by tests/graded_once.py).
    for chapter in sorted({c["CHAPTER"] for c in cases.values() if c["THREAT"] == "harm_others"}):
        write(sub, HONEST, chapter, reference(chapter))
    for name, case in cases.items():
        # The other exercises stay blank (they fail at once, and the course's reference of an earlier one stands in
        # while this one is graded): a breach is decided before anything runs, and a case that must lose points
        # loses them on its own exercise's cells. One that harms others and runs keeps the reference for them, so that
        # it is graded as long as an honest submission, beside the honest neighbour.
        harms = case["THREAT"] == "harm_others" and case["EXPECT"] == "loses"
        base = None if harms else blank(case["CHAPTER"])
        nb = with_exercise(case["CHAPTER"], case["EXERCISE"], case["SOURCE"], base=base)
        write(sub, student(name), case["CHAPTER"], nb)
    # --timeout: chapter 10's interpreted Triton test alone takes over 60 s on a busy 2-core machine
    proc = profiling.graded_batch(subprocess.run, [*AUTOGRADE, str(sub), "--out", str(out), "--workers", "2",
                                                    "--timeout", "180"], out,
                                  cwd=ROOT, capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (out / "grades.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    return {"rows": rows, "out": out, "cases": cases}


@pytest.mark.slow
@pytest.mark.xdist_group("hostile-chapters")
class TestBatch:
    def test_honest_submissions_keep_full_marks(self, batch):
        honest = [r for r in batch["rows"] if r["student_id"] == HONEST]
        assert honest
        lost = [(r["chapter"], r["problem"]) for r in honest if float(r["score"]) != float(r["max_score"])]
        assert not lost, f"the honest reference lost points on {lost}"

    @pytest.mark.parametrize("name", CASES)
    def test_case_meets_its_expectation(self, batch, name):
        case = batch["cases"].get(name)
        assert case is not None, f"{name} does not load"
        chapter, exercise = case["CHAPTER"], case["EXERCISE"]
        rows = {r["problem"]: r for r in batch["rows"] if r["student_id"] == student(name)}
        assert rows, f"{name} was not graded"
        tests = release_layout(chapter).tests_of(exercise)
        assert tests, f"{chapter}: no graded test cell belongs to {exercise}"
        if case["EXPECT"] == "loses":
            lost = [gid for gid in tests if float(rows[gid]["score"]) < float(rows[gid]["max_score"])]
            assert lost, f"{name} scored full marks on {exercise}'s cells {tests}"
            return
        why = reasons(batch["out"] / "feedback" / student(name) / f"{chapter}.html")
        for gid in tests:
            assert float(rows[gid]["score"]) == 0, f"{name}: {gid} scored {rows[gid]['score']}"
            assert case["CONSTRUCT"] in why.get(gid, ""), f"{name}: {gid}'s reason {why.get(gid)!r}"
