"""``python -m grader release``: solutions/ -> course/*.ipynb through nbgrader generate_assignment.

Each graded test cell first gets one line that runs its exercise the way the grader will
(``with_graded_checks``, ``coursekit.graded``); the instructor notebook
(``read_source``) stays as its source is. nbgrader then replaces every ``### BEGIN SOLUTION``
region with a stub, deletes hidden-test regions, clears outputs and records checksums. The
result is written to ``course/<chapter_id>.ipynb``; it is generated, never edited by hand, and
``tests/test_release.py`` fails when it is stale. The README's chapter table is rewritten from
the chapters' declarations (``grader.chapters``).
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import nbformat

from coursekit.source_policy import POLICY_KEY
from grader.api import gates
from grader.source_policy import policy_for, policy_to_dict
from grader.notebooks import (COURSE, chapters, check_chapter_id, gate_line, grade_id,
                              graded_check_line, layout, read_source)


def nbgrader_env() -> None:
    # nbgrader migrates its gradebook by running the `alembic` script next to python.
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def nbgrader_api(root: Path, db_url: str):
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config

    nbgrader_env()
    c = Config()
    c.CourseDirectory.root = str(root)
    c.CourseDirectory.db_url = db_url
    c.CourseDirectory.course_id = "efficient-training"
    return NbGraderAPI(coursedir=CourseDirectory(config=c), config=c)


def with_graded_checks(nb: nbformat.NotebookNode, chapter: str) -> nbformat.NotebookNode:
    """``nb`` with :func:`graded_check_line` at the top of every graded test cell that follows an
    exercise (``Layout.tests_of``); the cell's hidden-test region is left as it is."""
    lay = layout(nb, chapter)
    owner = {gid: ex for ex in lay.exercises for gid in lay.tests_of(ex)}
    needs = gates(chapter, lay)
    for cell in nb.cells:
        gid = grade_id(cell)
        if cell.cell_type != "code" or gid not in owner or not cell.metadata["nbgrader"].get("grade"):
            continue
        lines = [graded_check_line(chapter, owner[gid])]
        if gid in needs:
            lines.append(gate_line(needs[gid]))
        if not cell.source.startswith(lines[0] + "\n"):
            cell.source = "\n".join(lines) + "\n" + cell.source
    return nb


def generate(chapter_ids: list[str], root: Path, db_url: str) -> dict[str, nbformat.NotebookNode]:
    """Run nbgrader generate_assignment for each chapter; return the student notebooks."""
    for ch in chapter_ids:
        src = root / "source" / ch
        src.mkdir(parents=True, exist_ok=True)
        nbformat.write(with_graded_checks(read_source(ch), ch), src / f"{ch}.ipynb")
    api = nbgrader_api(root, db_url)
    out = {}
    for ch in chapter_ids:
        result = api.generate_assignment(ch, force=True, create=True)
        if not result["success"]:
            raise RuntimeError(f"nbgrader generate_assignment failed for {ch}:\n{result.get('error') or result.get('log')}")
        out[ch] = nbformat.read(root / "release" / ch / f"{ch}.ipynb", as_version=4)
    return out


def release(chapter_ids: list[str] | None = None, dest: Path = COURSE) -> list[Path]:
    chapter_ids = [check_chapter_id(c) for c in chapter_ids] if chapter_ids else chapters()
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory(prefix="release-") as tmp:
        root = Path(tmp)
        for ch, nb in generate(chapter_ids, root, f"sqlite:///{root / 'gradebook.db'}").items():
            # The chapter's source policy, for the visible tests (coursekit.graded reads cells against it).
            nb.metadata[POLICY_KEY] = policy_to_dict(policy_for(ch))
            path = dest / f"{ch}.ipynb"
            tmp_path = path.with_suffix(".ipynb.tmp")
            nbformat.write(nb, tmp_path)
            os.replace(tmp_path, path)
            written.append(path)
    if dest == COURSE:
        from grader.chapters import README, write_readme_table

        if write_readme_table():
            written.append(README)
    return written

