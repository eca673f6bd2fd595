"""Build nbgrader-style submission folders for tests: SUB/<student>/<chapter>/<chapter>.ipynb."""
from pathlib import Path

import nbformat

from conftest import ROOT
from grader.notebooks import grade_id, read_source


def reference(chapter: str) -> nbformat.NotebookNode:
    return read_source(chapter)


def blank(chapter: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "course" / f"{chapter}.ipynb", as_version=4)


def with_exercise(chapter: str, exercise: str, source: str, base=None) -> nbformat.NotebookNode:
    """The reference notebook with one exercise cell's source replaced."""
    nb = base if base is not None else reference(chapter)
    cells = [c for c in nb.cells if grade_id(c) == exercise]
    assert cells, f"{chapter} has no exercise {exercise}"
    cells[0].source = source
    return nb


def write(sub: Path, student: str, chapter: str, nb) -> Path:
    d = sub / student / chapter
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{chapter}.ipynb"
    if isinstance(nb, str):
        path.write_text(nb)
    else:
        nbformat.write(nb, path)
    return path
