"""`python -m grader report OUT`: the instructor's class report, on a batch mixing correct, blank, wrong, hostile,
broken, incomplete and missing submissions.

The once-per-run batch (students reference, blank and second, graded into SQLite) is copied, and a small ch00 batch
of the other kinds is graded into the copy: one more autograde run, not a second grading of the references.
"""
import csv
from collections import defaultdict
import html
import re
import runpy
import shutil

import nbformat
import pytest

from conftest import ROOT, UNISOLATED
import graded_once
import profiling
from grader import gradebook, report
from grader.__main__ import main
from grader.autograde import Result, autograde, release_layout
from grader.feedback import UNISOLATED, render
from grader.notebooks import grade_id
from grader.sandbox.judge import Outcome
from submissions import blank, reference, with_exercise, write
from wrong_submissions import WRONG

pytestmark = pytest.mark.xdist_group("instructor_report")
CH = "ch00_memory"
EXERCISE = "predict_training_memory"
HOSTILE = ("process_start_ch00_posix_spawn", "materialise_meta_ch00_assign_state_dict")
MIXED = ("wrong", "breach", "meta", "broken", "late", "incomplete")


def _read(path):
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    out = tmp_path_factory.mktemp("term") / "out"
    once = graded_once.batch()
    out.mkdir()
    for name in ("gradebook.db", "grades.csv"):
        shutil.copy2(once / name, out / name)
    shutil.copytree(once / "feedback", out / "feedback")
    sub = tmp_path_factory.mktemp("ch00-mixed")
    write(sub, "wrong", CH, with_exercise(CH, EXERCISE, WRONG[CH, EXERCISE]))
    for student, case in zip(("breach", "meta"), HOSTILE):
        attack = runpy.run_path(str(ROOT / "tests" / "hostile_chapters" / f"{case}.py"))
        write(sub, student, CH, with_exercise(CH, attack["EXERCISE"], attack["SOURCE"], base=blank(CH)))
    write(sub, "broken", CH, "{ this is not a notebook")
    (sub / "late" / CH).mkdir(parents=True)
    nb = reference(CH)
    nb.cells = [c for c in nb.cells if grade_id(c) != EXERCISE]
    write(sub, "incomplete", CH, nb)
    (sub / "notes.txt").write_text("not a submission")
    with profiling.cost("graded batch", "ch00 mixed batch for the report, in this process"):
        results = autograde(sub, out, workers=2, progress=False, log=lambda *args, **kwargs: None,
                            unisolated=bool(UNISOLATED))
    assert sorted(r.student for r in results) == sorted(MIXED)
    roster = out.parent / "roster.csv"
    roster.write_text("student_id,name\n" + "".join(f"{s},{s.title()}\n" for s in
                                                    (*graded_once.STUDENTS, *MIXED, "absent")))
    return out, roster


@pytest.fixture(scope="module")
def made(graded):
    out, roster = graded
    with profiling.cost("instructor report", "report on the mixed batch"):
        assert main(["report", str(out), "--roster", str(roster)]) == 0
    dest = out / "report"
    return out, {p.stem: _read(p) for p in dest.glob("*.csv")}, (dest / "index.html").read_text(encoding="utf-8")


def test_ch00_lms_csv_has_a_row_per_student_and_a_column_per_chapter(made):
    out, tables, _ = made
    with (out / "report" / "lms.csv").open(newline="") as f:
        header, possible, *rows = list(csv.reader(f))
    chapters = header[1:-1]
    assert header[0] == "student_id" and header[-1] == "total" and CH in chapters
    maxima = [sum(p for _, p in release_layout(ch).tests) for ch in chapters]
    assert possible == ["Points Possible", *(f"{m:g}" for m in maxima), f"{sum(maxima):g}"]
    by_student = {r[0]: dict(zip(header[1:], r[1:])) for r in rows}
    assert set(by_student) == {*graded_once.STUDENTS, *MIXED, "absent"}
    graded = defaultdict(float)
    for r in _read(out / "grades.csv"):
        graded[r["student_id"], r["chapter"]] += float(r["score"])
    for student in graded_once.STUDENTS:
        assert all(float(by_student[student][ch]) == graded[student, ch] for ch in chapters)
    assert set(by_student["absent"].values()) == {"", "0"} and by_student["absent"]["total"] == "0"
    assert by_student["late"][CH] == "" and by_student["broken"][CH] == "0"
    assert by_student["incomplete"][CH] == "0", "its one exercise cell is missing: every cell of it fails"
    for student in ("wrong", "breach", "meta"):
        assert float(by_student[student][CH]) < maxima[chapters.index(CH)], f"{student} scored full marks"
        assert all(by_student[student][ch] == "" for ch in chapters if ch != CH), "other chapters: nothing handed in"
    for student, row in by_student.items():
        assert float(row["total"]) == sum(float(row[ch] or 0) for ch in chapters)


def test_ch00_missing_broken_and_incomplete_submissions_are_listed_with_their_reason(made):
    _, tables, page = made
    issues = {(i["student_id"], i["chapter"]): i for i in tables["issues"]}
    assert issues["broken", CH]["kind"] == "broken" and "not a valid notebook" in issues["broken", CH]["reason"]
    assert issues["late", CH]["kind"] == "missing"
    assert issues["incomplete", CH]["kind"] == "incomplete" and EXERCISE in issues["incomplete", CH]["reason"]
    chapters = {r["chapter"] for r in tables["chapters"]}
    assert {ch for (s, ch), i in issues.items() if s == "absent" and i["kind"] == "missing"} == chapters
    for student in ("reference", "second", "blank", "wrong", "breach", "meta"):
        assert (student, CH) not in issues, f"{student}'s graded submission is no issue"
    for row in tables["issues"]:
        assert html.escape(row["reason"]) in page


def test_ch00_failure_reasons_are_grouped_and_counted(made):
    out, tables, page = made
    grades = [r for r in _read(out / "grades.csv") if r["chapter"] == CH and r["problem"] == f"test_{EXERCISE}"]
    failed = {r["student_id"] for r in grades if float(r["score"]) < float(r["max_score"])}
    listed = {r["student_id"] for r in tables["issues"] if r["chapter"] == CH and r["kind"] != "incomplete"}
    rows = [r for r in tables["failures"] if r["chapter"] == CH and r["problem"] == f"test_{EXERCISE}"]
    assert sum(int(r["count"]) for r in rows) == len(failed - listed) > 0
    reasons = " ".join(r["reason"] for r in rows)
    assert "torch.os" in reasons, "the hostile cell's refusal is among the reasons"
    assert "NotImplementedError" in reasons, "the blank release's reason is among them"
    assert [int(r["count"]) for r in rows] == sorted((int(r["count"]) for r in rows), reverse=True)
    assert html.escape(rows[0]["reason"]) in page


def test_ch00_score_distribution_and_grading_time_per_chapter(made):
    out, tables, page = made
    problems = {r["problem"]: r for r in tables["problems"] if r["chapter"] == CH}
    assert set(problems) == {gid for gid, _ in release_layout(CH).tests}
    core = problems[f"test_{EXERCISE}"]
    handed = {"reference", "second", "blank", "wrong", "breach", "meta", "broken", "incomplete"}
    assert int(core["graded"]) == len(handed) and int(core["full_marks"]) == 2  # the reference and the second
    chapter = next(r for r in tables["chapters"] if r["chapter"] == CH)
    timed = [r for r in _read(out / "timing.csv") if r["chapter"] == CH]
    assert int(chapter["graded_last_run"]) == len(timed) == len(MIXED)
    assert int(chapter["missing"]) == 2 and int(chapter["broken"]) == 1 and int(chapter["handed_in"]) == len(handed)
    images = re.findall(r"<img alt='score distribution of ([^']+)' src='data:image/png;base64,", page)
    assert images == [r["chapter"] for r in tables["chapters"]]
    assert "Grading time" in page and "notes.txt" in page, "the last run's timing and what it did not grade"


def test_ch00_report_units_reasons_round_trip_groups_and_rosters(tmp_path):
    lay = release_layout(CH)
    outcomes = {gid: Outcome(gid, i == 0, "" if i == 0 else f"off by {i}.5e-3 on (37, {i})")
                for i, (gid, _) in enumerate(lay.tests)}
    page = tmp_path / "feedback.html"
    page.write_text(render(Result("alice", CH, lay, outcomes, {EXERCISE: "x = 1"})))
    assert report.read_reasons(page) == {gid: o.reason for gid, o in outcomes.items() if not o.passed}
    assert report.group_key("off by 1.5e-3 on (37, 53)") == report.group_key("off by 2e-2 on (5, 7)")
    roster = tmp_path / "roster.txt"
    roster.write_text("alice\n\nbob\n")
    assert report.read_roster(roster) == ["alice", "bob"]
    roster.write_text("student_id\n")
    with pytest.raises(ValueError, match="holds no student id"):
        report.read_roster(roster)
    with pytest.raises(FileNotFoundError, match="no gradebook at .*run `python -m grader autograde"):
        report.report(tmp_path)
    # A flagged (unisolated) grade's comment starts with the flag's text, which holds a "; " of its own.
    flagged = gradebook.Submission("alice", CH, comments=[f"{UNISOLATED}; missing notebook"], flagged=True)
    assert report._issue(flagged).kind == "missing"
    assert report._issue(gradebook.Submission("bob", CH, comments=[UNISOLATED], flagged=True)) is None
