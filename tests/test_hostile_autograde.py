"""The hostile suite replayed end to end through `python -m grader autograde` on a real chapter.

One batch holds the honest reference submission and every hostile case of ``tests/hostile/``
on ``ch00_memory``: the case's trick is appended to a wrong ``predict_training_memory`` inside
the exercise cell (the only code the grader takes from a submission). The tricks aim at this
very batch: its gradebook, the honest student's submission, a course file, a local socket.
"""
from __future__ import annotations

import csv
import runpy
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, AUTOGRADE
import profiling
from submissions import reference, with_exercise, write
from wrong_submissions import WRONG

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hostile-autograde")]
HOSTILE = Path(__file__).with_name("hostile")
CASES = sorted(p.stem for p in HOSTILE.glob("*.py") if p.stem != "wrong_impl")
CHAPTER = "ch00_memory"


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    sub, out = tmp / "submitted", tmp / "out"
    out.mkdir()
    course_copy = tmp / "course" / f"{CHAPTER}.ipynb"
    course_copy.parent.mkdir()
    course_copy.write_bytes((ROOT / "course" / f"{CHAPTER}.ipynb").read_bytes())
    honest = write(sub, "honest", CHAPTER, reference(CHAPTER))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    places = {"@GRADEBOOK@": str(out / "gradebook.db"), "@COURSE_FILE@": str(course_copy),
              "@OTHER_SUBMISSION@": str(honest.parent), "@PORT@": str(listener.getsockname()[1])}
    wrong = WRONG[(CHAPTER, "predict_training_memory")]
    for name in CASES:
        trick = runpy.run_path(str(HOSTILE / f"{name}.py"))["TRICK"]
        for key, value in places.items():
            trick = trick.replace(key, value)
        source = wrong + "\n\n" + trick
        write(sub, name.replace("_", "-"), CHAPTER, with_exercise(CHAPTER, "predict_training_memory", source))
    before = {p: p.read_bytes() for p in (honest, course_copy)}
    proc = profiling.graded_batch(subprocess.run, [*AUTOGRADE, str(sub), "--out", str(out), "--workers", "2",
                                                    "--timeout", "20"], out,
                                  cwd=ROOT, capture_output=True, text=True, timeout=1200)
    try:
        listener.accept()
        reached = True
    except BlockingIOError:
        reached = False
    listener.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    with (out / "grades.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    return {"rows": rows, "out": out, "before": before, "reached": reached}


def test_the_batch_finishes_with_every_submission_graded(batch):
    students = {r["student_id"] for r in batch["rows"]}
    assert students == {"honest"} | {n.replace("_", "-") for n in CASES}


def _total(batch, student: str) -> tuple[float, float]:
    """(score, max score) of one student over the chapter's graded cells (one row each)."""
    rows = [r for r in batch["rows"] if r["student_id"] == student]
    assert rows, f"{student} was not graded"
    return sum(float(r["score"]) for r in rows), sum(float(r["max_score"]) for r in rows)


def test_honest_submission_scores_full_marks(batch):
    score, maximum = _total(batch, "honest")
    assert score == maximum > 0


@pytest.mark.parametrize("name", CASES)
def test_hostile_submission_scores_below_full_marks(batch, name):
    score, maximum = _total(batch, name.replace("_", "-"))
    assert score < maximum, f"{name} scored full marks"


def test_nothing_outside_the_workers_changed(batch):
    for path, data in batch["before"].items():
        assert path.read_bytes() == data, f"{path} was changed"
    assert not batch["reached"], "a submission connected to a socket on this machine"
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{batch['out'] / 'gradebook.db'}") as gb:
        for r in batch["rows"]:
            assert gb.find_grade(r["problem"], CHAPTER, CHAPTER, r["student_id"]).score == float(r["score"])


def test_feedback_reveals_no_hidden_test(batch):
    hidden = (ROOT / "grader" / "hidden" / f"{CHAPTER}.py").read_text()
    secret = [ln.strip() for ln in hidden.splitlines() if len(ln.strip()) > 30 and not ln.strip().startswith("#")]
    for html in (batch["out"] / "feedback").rglob("*.html"):
        # The student's own code is shown back to them; everything before it must not quote hidden tests.
        text = html.read_text().split("<h2>Your graded code</h2>")[0]
        assert not any(line in text for line in secret), f"{html} quotes the hidden tests"
