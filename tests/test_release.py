"""course/ is generated from solutions/, fresh, and free of solutions and hidden tests."""
import json
import re
import zipfile
import subprocess
import sys

import nbformat
import pytest

from conftest import ROOT
from grader.api import checks_for, gates
from grader.notebooks import chapters, defines, gate_line, grade_id, graded_check_line, layout, read_source
from grader.release import release, with_graded_checks

SOLUTION_RE = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)
HIDDEN_RE = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)


def test_chapters_exist():
    assert {"ch00_memory", "ch01_lora"} <= set(chapters())


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    out = tmp_path_factory.mktemp("course")
    release(dest=out)
    return out


@pytest.mark.parametrize("chapter", chapters())
def test_course_is_fresh(chapter, fresh):
    committed = nbformat.read(ROOT / "course" / f"{chapter}.ipynb", as_version=4)
    regenerated = nbformat.read(fresh / f"{chapter}.ipynb", as_version=4)
    assert committed == regenerated, f"course/{chapter}.ipynb is stale: run `python -m grader release`"


@pytest.mark.parametrize("chapter", chapters())
def test_graded_test_cells_first_run_their_exercise_as_graded(chapter, fresh):
    """Each graded test cell starts by running its exercise the grader's way (coursekit.graded)."""
    nb = nbformat.read(fresh / f"{chapter}.ipynb", as_version=4)
    lay = layout(nb, chapter)
    owner = {gid: ex for ex in lay.exercises for gid in lay.tests_of(ex)}
    graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert owner, f"{chapter} has no graded cell after an exercise"
    for cell in graded:
        first, *rest = cell.source.splitlines()
        exercise = owner.get(grade_id(cell))
        if exercise is None:  # before any exercise: nothing of the student's to run
            assert "check_as_graded" not in cell.source
            continue
        assert first == graded_check_line(chapter, exercise), f"{grade_id(cell)} does not start with its check"
        assert first.startswith(f'from coursekit.graded import check_as_graded; '
                                f'check_as_graded("{chapter}", "{exercise}")  # ')
        assert rest and "check_as_graded" not in "\n".join(rest), "one check per cell, then the visible asserts"
        needs = gates(chapter, lay).get(grade_id(cell))
        if needs:  # the student reads which cells this one's points wait on
            assert rest[0] == gate_line(needs), f"{grade_id(cell)} does not say that it counts once {needs} pass"
        else:
            assert not rest[0].startswith("# This cell's points count once")


@pytest.mark.parametrize("chapter", chapters())
def test_the_check_line_is_added_by_the_release_only(chapter):
    nb = read_source(chapter)
    assert not any("check_as_graded" in c.source for c in nb.cells), "the instructor notebook stays as its source"
    checked = with_graded_checks(read_source(chapter), chapter)
    twice = with_graded_checks(nbformat.from_dict(checked), chapter)
    assert twice == checked and twice is not checked, "adding the checks twice adds them once"
    for before, after in zip(nb.cells, checked.cells):
        if before.metadata.get("nbgrader", {}).get("grade"):
            added = 2 if grade_id(before) in gates(chapter, layout(nb, chapter)) else 1
            assert after.source.endswith(before.source) and after.source.count("\n") == before.source.count("\n") + added
            assert HIDDEN_RE.search(after.source).group(0) == HIDDEN_RE.search(before.source).group(0)
        else:
            assert after.source == before.source


@pytest.mark.parametrize("chapter", chapters())
def test_every_test_cell_has_a_hidden_test(chapter):
    nb = read_source(chapter)
    tests = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert tests, f"{chapter} has no graded cell"
    assert set(tests) == set(checks_for(chapter)), "test cells and registered hidden tests differ"
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade"):
            assert HIDDEN_RE.search(c.source), f"{c.id} has no hidden-test region"


@pytest.mark.parametrize("chapter", chapters())
def test_each_exercise_cell_defines_exactly_its_name(chapter):
    import ast

    nb = read_source(chapter)
    exercises = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert exercises
    for c in exercises:
        name = c.metadata["nbgrader"]["grade_id"]
        tree = ast.parse(c.source)
        top = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        assert top == [name], f"exercise cell {name} defines {top}, expected exactly [{name!r}]"
        assert defines(c.source, name)
        assert SOLUTION_RE.search(c.source), f"{name} has no solution region"


def _bundle_texts(tmp_path):
    """Everything a student receives: course/ notebooks plus the installed packages' files."""
    texts = {p.name: p.read_text() for p in (ROOT / "course").glob("*.ipynb")}
    wheel_dir = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheel_dir), str(ROOT)], check=True, capture_output=True)
    (wheel,) = wheel_dir.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        for n in names:
            if n.endswith((".py", ".txt", ".json", ".md")):
                texts[n] = z.read(n).decode("utf-8", "replace")
    return texts, names


def _secret_lines(source: str) -> list[str]:
    """Lines that appear only inside solution or hidden-test regions of a chapter source."""
    regions = SOLUTION_RE.findall(source) + HIDDEN_RE.findall(source)
    public = SOLUTION_RE.sub("", HIDDEN_RE.sub("", source))
    public_lines = {ln.strip() for ln in public.splitlines()}
    return [ln.strip() for r in regions for ln in r.splitlines()
            if len(ln.strip()) > 8 and not ln.strip().startswith("#") and ln.strip() not in public_lines]


def test_student_bundle_has_no_solutions_or_hidden_tests(tmp_path):
    texts, names = _bundle_texts(tmp_path)
    assert not any(n.startswith(("grader/", "solutions/")) for n in names), "the grader must not be installed"
    notebooks = {n: t for n, t in texts.items() if n.endswith(".ipynb")}
    notebook_lines = {n: [ln.strip() for c in json.loads(t)["cells"] for ln in "".join(c["source"]).splitlines()]
                      for n, t in notebooks.items()}
    package = {n: t for n, t in texts.items() if not n.endswith(".ipynb")}
    for chapter in chapters():
        secret = _secret_lines((ROOT / "solutions" / f"{chapter}.py").read_text())
        assert secret, f"{chapter} has no solution text to look for"
        # The chapter's own release holds no line of its answers; another chapter's release may
        # share a single idiom (``with torch.no_grad():``) but not two answer lines in a row.
        own = set(notebook_lines[f"{chapter}.ipynb"])
        for line in secret:
            assert line not in own, f"solution/hidden line {line!r} of {chapter} leaks into its release"
        pairs = set(zip(secret, secret[1:]))
        for name, lines in notebook_lines.items():
            for pair in zip(lines, lines[1:]):
                assert pair not in pairs, f"solution/hidden lines {pair} of {chapter} leak into {name}"
        # Package files may share single idioms with a solution; three lines in a row may not.
        for a, b, c in zip(secret, secret[1:], secret[2:]):
            for name, text in package.items():
                flat = [ln.strip() for ln in text.splitlines()]
                for i in range(len(flat) - 2):
                    assert flat[i:i + 3] != [a, b, c], f"solution lines of {chapter} appear in {name}"
        hidden = (ROOT / "grader" / "hidden" / f"{chapter}.py").read_text()
        for text in texts.values():
            assert hidden not in text
        assert not any("run_hidden" in t for t in notebooks.values())


@pytest.mark.parametrize("chapter", chapters())
def test_leak_check_would_catch_an_unstripped_notebook(chapter):
    secret = _secret_lines((ROOT / "solutions" / f"{chapter}.py").read_text())
    reference_lines = {ln.strip() for c in read_source(chapter).cells for ln in c.source.splitlines()}
    assert secret and all(line in reference_lines for line in secret)
