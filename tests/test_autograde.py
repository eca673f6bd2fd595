"""The grading contract end to end: `python -m grader autograde SUBMISSIONS --out OUT`."""
import csv
import subprocess

import nbformat
import pytest

from conftest import ROOT, AUTOGRADE
import profiling
from grader.autograde import release_layout
from grader.notebooks import chapters
import graded_once
from grader.selfcheck import verdict
from submissions import blank, reasons, reference, with_exercise, write
from degenerate_submissions import DEGENERATE, FIRST_CELL_EARNED
from wrong_submissions import WRONG

pytestmark = pytest.mark.xdist_group("autograde")
CHAPTERS = chapters()
HANG = "def predict_training_memory(model, batch_size, optimizer):\n    while True:\n        pass\n"
HANG_S = 5  # CPU seconds per graded cell of the hanging submission's own batch
VICTIM = "def predict_training_memory(model, batch_size, optimizer):\n    return {'VICTIM-OWN-WORK': 1}\n"


def autograde(sub, out, *extra):
    return profiling.graded_batch(subprocess.run, [*AUTOGRADE, str(sub), "--out", str(out), *extra], out,
                                  cwd=ROOT, capture_output=True, text=True, timeout=1500)


def read_grades(out):
    with (out / "grades.csv").open(newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == ["student_id", "chapter", "problem", "score", "max_score"]
        return list(reader)


def totals(rows):
    t = {}
    for r in rows:
        got, mx = t.get((r["student_id"], r["chapter"]), (0.0, 0.0))
        t[(r["student_id"], r["chapter"])] = (got + float(r["score"]), mx + float(r["max_score"]))
    return t


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    sub = tmp_path_factory.mktemp("submitted")
    out = tmp_path_factory.mktemp("out")
    # The references and blank releases are graded once per run by graded_once, not here. Only the chapters the
    # run's tests name are graded (all in a whole run; `make check CHAPTER=...` grades one).
    wanted = set(graded_once.graded_chapters())
    for (ch, ex), source in WRONG.items():
        if ch in wanted:
            write(sub, f"wrong-{ex}", ch, with_exercise(ch, ex, source))
    for (ch, ex, name), source in DEGENERATE.items():
        if ch in wanted:  # only its own exercise's cells are read: the others stay blank (they fail at once)
            write(sub, f"degenerate-{name}", ch, with_exercise(ch, ex, source, base=blank(ch)))
    if "ch00_memory" in wanted:  # the intake cases: ch00 submissions
        write(sub, "broken", "ch00_memory", "{ this is not a notebook")
        # A lone surrogate ("\\ud800", valid JSON) in an exercise cell: no page, CSV or database can store it.
        lone = nbformat.writes(reference("ch00_memory")).replace("def predict_training_memory(",
                                                                  "# \\ud800\\ndef predict_training_memory(", 1)
        assert "\\ud800" in lone
        write(sub, "surrogate", "ch00_memory", lone)
        (sub / "missing" / "ch00_memory").mkdir(parents=True)
        # Intake: a link to another student's notebook or to a hidden test, an oversized notebook, a folder
        # name with a '+', and entries that are no submission at all.
        victim = write(sub, "victim+1", "ch00_memory", with_exercise("ch00_memory", "predict_training_memory", VICTIM))
        for thief, target in (("thief", victim), ("peeker", ROOT / "grader" / "hidden" / "ch00_memory.py")):
            (sub / thief / "ch00_memory").mkdir(parents=True)
            (sub / thief / "ch00_memory" / "ch00_memory.ipynb").symlink_to(target)
        many = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1") for _ in range(20_000)])
        write(sub, "many-cells", "ch00_memory", many)
        (sub / "not a student").mkdir()
        (sub / "victim+1" / "ch42_nothing").mkdir()
        # The hanging submission alone first, into the same OUT (the batch below keeps its rows, feedback and
        # gradebook entry), under a short limit: it spends the whole limit of its cell.
        hangs = tmp_path_factory.mktemp("hangs")
        write(hangs, "hangs", "ch00_memory", with_exercise("ch00_memory", "predict_training_memory", HANG))
        proc = autograde(hangs, out, "--workers", "1", "--timeout", str(HANG_S))
        assert proc.returncode == 0, proc.stderr[-3000:]
    proc = autograde(sub, out, "--workers", "2", "--timeout", "60")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sub, out, read_grades(out), proc.stdout


def test_one_row_per_graded_cell(batch):
    _, _, rows, _ = batch
    keys = [(r["student_id"], r["chapter"], r["problem"]) for r in rows]
    assert len(keys) == len(set(keys))
    assert {r["student_id"] for r in rows} >= {"broken", "missing", "hangs"}


def test_reference_full_marks_blank_zero():
    t = totals(graded_once.rows())
    for ch in CHAPTERS:
        got, mx = t[("reference", ch)]
        assert got == mx > 0, f"reference {ch}: {got}/{mx}"
        assert t[("blank", ch)][0] == 0


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_second_correct_answers_get_full_marks(chapter):
    """Answers written from the released notebook alone (tests/second_submissions_<chapter>.py), in
    another style than the reference, score every point: the grader holds them to the notebook's text."""
    rows = graded_once.rows("second", chapter)
    lost = [f"{r['problem']} {r['score']}/{r['max_score']}" for r in rows if float(r["score"]) < float(r["max_score"])]
    assert rows and not lost, f"second answers of {chapter} lost points: {lost} (feedback: " \
                              f"{graded_once.feedback('second', chapter)})"


def test_notebooks_handed_in_with_their_outputs_are_graded_on_their_exercises_alone():
    """The second answers are handed in as run, with 8 MiB of plots and printed tables each; they score
    full marks (test_second_correct_answers_get_full_marks): outputs never reach the worker."""
    for ch in CHAPTERS:
        path = graded_once.batch().parent / "submitted" / "second" / ch / f"{ch}.ipynb"
        assert path.stat().st_size >= 8 * 1024**2, (ch, path.stat().st_size)


@pytest.mark.parametrize("chapter,exercise", sorted(WRONG))
def test_wrong_submission_loses_points(batch, chapter, exercise):
    _, out, rows, _ = batch
    got, mx = totals(rows)[(f"wrong-{exercise}", chapter)]
    assert got < mx, f"a wrong {exercise} scored full marks"
    assert "failed" in (out / "feedback" / f"wrong-{exercise}" / f"{chapter}.html").read_text()


@pytest.mark.parametrize("chapter,exercise", sorted(WRONG))
def test_a_wrong_exercise_costs_only_its_own_points(batch, chapter, exercise):
    """Later exercises that call a failed one are graded with the course's reference of it."""
    _, out, rows, _ = batch
    lay = release_layout(chapter)
    own = set(lay.tests_of(exercise))
    lost = {r["problem"] for r in rows if r["student_id"] == f"wrong-{exercise}" and r["chapter"] == chapter
            and float(r["score"]) < float(r["max_score"])}
    if lost & own:
        assert lost <= own, f"a wrong {exercise} also lost {sorted(lost - own)}"
        later = lay.exercises[lay.exercises.index(exercise) + 1:]
        if any(lay.tests_of(e) for e in later):
            page = (out / "feedback" / f"wrong-{exercise}" / f"{chapter}.html").read_text()
            assert f"course&#x27;s own {exercise}" in page or f"course's own {exercise}" in page


@pytest.mark.parametrize("chapter,exercise,name", sorted(DEGENERATE))
def test_degenerate_code_collects_no_points(batch, chapter, exercise, name):
    """Code that computes nothing useful earns nothing: an exercise's further cells wait on its first."""
    _, out, rows, _ = batch
    cells = release_layout(chapter).tests_of(exercise)
    earned = {r["problem"]: float(r["score"]) for r in rows
              if r["student_id"] == f"degenerate-{name}" and r["problem"] in cells and float(r["score"]) > 0}
    allowed = {cells[0]} if name in FIRST_CELL_EARNED else set()
    assert set(earned) <= allowed, f"{name} earned {earned}"
    if not allowed:  # the other exercises are blank: the reasons of this exercise's own cells are read
        why = reasons(out / "feedback" / f"degenerate-{name}" / f"{chapter}.html")
        assert any("counts once" in why.get(gid, "") for gid in cells[1:]) or len(cells) == 1, why


def test_broken_missing_and_hanging_submissions_get_zeros_with_reasons(batch):
    _, out, rows, _ = batch
    t = totals(rows)
    for student in ("broken", "missing", "hangs"):
        assert t[(student, "ch00_memory")][0] == 0
    assert "not a valid notebook" in (out / "feedback" / "broken" / "ch00_memory.html").read_text()
    assert "no notebook found" in (out / "feedback" / "missing" / "ch00_memory.html").read_text()
    assert "time limit" in (out / "feedback" / "hangs" / "ch00_memory.html").read_text()


def test_a_lone_surrogate_in_a_cell_is_graded_and_harms_no_one(batch):
    """JSON may spell a character UTF-8 cannot hold; the cell is graded with U+FFFD in its place, its feedback
    written, and the batch goes on for everyone."""
    _, out, rows, _ = batch
    got, most = totals(rows)[("surrogate", "ch00_memory")]
    assert got == most > 0
    assert "\ufffd" in (out / "feedback" / "surrogate" / "ch00_memory.html").read_text(encoding="utf-8")


def test_links_and_oversized_notebooks_are_refused_at_intake(batch):
    _, out, rows, stdout = batch
    t = totals(rows)
    for student, why in (("thief", "symbolic link"), ("peeker", "symbolic link"), ("many-cells", "20,000 cells")):
        assert t[(student, "ch00_memory")][0] == 0
        page = (out / "feedback" / student / "ch00_memory.html").read_text()
        assert why in page, page[:2000]
        assert "VICTIM-OWN-WORK" not in page
    hidden_first = (ROOT / "grader" / "hidden" / "ch00_memory.py").read_text().splitlines()[0]
    assert hidden_first not in (out / "feedback" / "peeker" / "ch00_memory.html").read_text()
    # The victim is graded on their own (wrong) work, as ever; a '+' in a student id is fine.
    assert ("victim+1", "ch00_memory") in t
    assert "VICTIM-OWN-WORK" in (out / "feedback" / "victim+1" / "ch00_memory.html").read_text()


def test_what_is_not_graded_is_listed_with_its_reason(batch):
    _, out, _, stdout = batch
    with (out / "not_graded.csv").open(newline="") as f:
        listed = {row["path"]: row["reason"] for row in csv.DictReader(f)}
    assert set(listed) == {"not a student", "victim+1/ch42_nothing"}
    assert "not a valid student id" in listed["not a student"] and "unknown chapter" in listed["victim+1/ch42_nothing"]
    assert "not graded: not a student: not a valid student id" in stdout
    assert "2 entries not graded" in stdout


def test_feedback_never_shows_hidden_tests(batch):
    _, out, _, _ = batch
    for ch in CHAPTERS:
        hidden = (ROOT / "grader" / "hidden" / f"{ch}.py").read_text()
        secret = [ln.strip() for ln in hidden.splitlines() if len(ln.strip()) > 25 and not ln.strip().startswith(("#", '"""'))]
        for html in (out / "feedback").rglob(f"{ch}.html"):
            # The student's own code is shown back to them; everything before it must not quote hidden tests.
            text = html.read_text().split("<h2>Your graded code</h2>")[0]
            assert not any(line in text for line in secret), f"{html} reveals hidden-test source"


def test_gradebook_holds_the_scores(batch):
    from nbgrader.api import Gradebook

    _, out, rows, _ = batch
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        for r in rows:
            grade = gb.find_grade(r["problem"], r["chapter"], r["chapter"], r["student_id"])
            assert grade.score == float(r["score"])
            assert grade.max_score == float(r["max_score"])


def test_regrading_one_student_keeps_the_others(batch, tmp_path):
    _, out, rows, _ = batch
    sub = tmp_path / "late"
    wrong = next(ex for ch, ex in WRONG if ch == "ch00_memory")
    write(sub, "late", "ch00_memory", with_exercise("ch00_memory", wrong, WRONG["ch00_memory", wrong]))
    proc = autograde(sub, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = read_grades(out)
    assert len(after) == len(rows) + len(release_layout("ch00_memory").tests)
    assert {(r["student_id"], r["problem"]) for r in rows} <= {(r["student_id"], r["problem"]) for r in after}


def test_bad_arguments_are_reported(tmp_path):
    proc = autograde(tmp_path / "nope", tmp_path / "out")
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    proc = subprocess.run([*AUTOGRADE, str(tmp_path), "--out", str(tmp_path),
                           "--workers", "0"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode != 0 and "--workers" in proc.stderr


def test_selfcheck_passes():
    """selfcheck's verdict on the run's one grading of every reference and blank release."""
    lines = []
    assert verdict(graded_once.rows(), CHAPTERS, log=lines.append), "\n".join(lines)
    for ch in CHAPTERS:
        assert any(line.startswith(ch) and line.endswith("ok") for line in lines), lines


def test_selfcheck_verdict_fails_a_reference_that_lost_points():
    rows = [dict(r) for r in graded_once.rows(chapter="ch00_memory")]
    next(r for r in rows if r["student_id"] == "reference")["score"] = "0"
    lines = []
    assert not verdict(rows, ["ch00_memory"], log=lines.append)
    assert "FAILED" in lines[-1] or any("FAILED" in line for line in lines)


def test_selfcheck_command_grades_reference_and_blank(monkeypatch):
    """The command's wiring (the grading itself is the run's one batch above)."""
    from grader import selfcheck as sc
    from grader.autograde import Result
    from grader.sandbox.judge import Outcome

    lay = release_layout("ch00_memory")
    seen = {}

    def fake_autograde(subs, out, **kw):
        seen["students"] = sorted(p.name for p in subs.iterdir())
        return [Result("reference", "ch00_memory", lay, {g: Outcome(g, True, "") for g, _ in lay.tests}),
                Result("blank", "ch00_memory", lay, {g: Outcome(g, False, "NotImplementedError") for g, _ in lay.tests})]

    monkeypatch.setattr(sc, "autograde", fake_autograde)
    lines = []
    assert sc.selfcheck(["ch00_memory"], log=lines.append)
    assert seen["students"] == ["blank", "reference"]
    monkeypatch.setattr(sc, "autograde", lambda subs, out, **kw: [
        Result(who, "ch00_memory", lay, {g: Outcome(g, False, "broken") for g, _ in lay.tests})
        for who in ("reference", "blank")])
    lines = []
    assert not sc.selfcheck(["ch00_memory"], log=lines.append)
    assert any("reference test_" in line and "broken" in line for line in lines), lines
