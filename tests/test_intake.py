"""Intake: what students hand in is read without trusting it (grader/intake.py), and a machine that
cannot isolate submissions grades only when told to, flagging every grade.

The same cases go through ``python -m grader autograde`` in ``tests/test_autograde.py``'s batch.
"""
from __future__ import annotations

import json
import os

import nbformat
import pytest

from grader import autograde, intake
from grader.autograde import release_layout
from grader.notebooks import exercise_sources
from submissions import reference, write

CHAPTER = "ch00_memory"


def _notebook_bytes(cells: int = 3) -> bytes:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"x{i} = {i}") for i in range(cells)])
    return nbformat.writes(nb).encode()


def test_a_notebook_is_read_into_code_cells(tmp_path):
    path = write(tmp_path, "s", CHAPTER, reference(CHAPTER))
    cells = intake.parse_notebook(intake.read_bytes(path))
    sources = exercise_sources(cells, release_layout(CHAPTER).exercises)
    assert "def predict_training_memory" in sources["predict_training_memory"]
    assert all(set(c) == {"source", "grade_id"} for c in cells)


@pytest.mark.parametrize("make,message", [
    (lambda p, other: p.symlink_to(other), "symbolic link"),
    (lambda p, other: os.link(other, p), "more than one name"),
    (lambda p, other: os.mkfifo(p), "not a regular file"),
    (lambda p, other: p.mkdir(), "not a regular file"),
], ids=["symlink", "hard-link", "fifo", "folder"])
def test_links_devices_and_folders_are_refused(tmp_path, make, message):
    other = tmp_path / "elsewhere.ipynb"
    other.write_bytes(_notebook_bytes())
    path = tmp_path / f"{CHAPTER}.ipynb"
    make(path, other)
    with pytest.raises(intake.Refused, match=message):
        intake.read_bytes(path)


def test_sizes_are_capped_before_anything_is_parsed(tmp_path):
    huge = tmp_path / "huge.ipynb"
    with huge.open("wb") as f:
        f.truncate(intake.MAX_NOTEBOOK_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(intake.Refused, match="over the grader's limit of 64 MiB"):
        intake.read_bytes(huge)
    many_cells = _notebook_bytes(intake.MAX_CELLS + 1)
    with pytest.raises(intake.Refused, match="5,001 cells, over the grader's limit of 5,000"):
        intake.parse_notebook(many_cells)
    many_values = b'{"cells": [], "x": [' + b"0," * (2 * intake.MAX_JSON_VALUES) + b'0]}'
    with pytest.raises(intake.Refused, match="JSON values"):
        intake.parse_notebook(many_values)


@pytest.mark.parametrize("data", [
    b"{ this is not a notebook SECRET-LINE", b"[" * 100_000 + b"]" * 100_000, b'"just a string"',
    b'{"cells": {"not": "a list"}}', b"\xff\xfe SECRET-LINE",
])
def test_malformed_files_are_refused_without_quoting_them(data):
    with pytest.raises(intake.Refused) as refused:
        intake.parse_notebook(data)
    assert "SECRET" not in str(refused.value) and "not a valid notebook" in str(refused.value)


def test_odd_cells_are_read_defensively():
    nb = {"cells": [None, 3, {"cell_type": "code", "source": ["a = ", "1"], "metadata": []},
                    {"cell_type": "code", "source": 7, "metadata": {"nbgrader": {"grade_id": ["x"]}}},
                    {"cell_type": "code", "source": "b = 2", "metadata": {"nbgrader": {"grade_id": "g"}}}]}
    assert intake.parse_notebook(json.dumps(nb).encode()) == [
        {"source": "a = 1", "grade_id": None}, {"source": "", "grade_id": None}, {"source": "b = 2", "grade_id": "g"}]


def test_every_entry_is_graded_or_listed_with_its_reason(tmp_path):
    sub = tmp_path / "submitted"
    write(sub, "a+b@uni.edu", CHAPTER, reference(CHAPTER))
    write(sub, "plain", CHAPTER, reference(CHAPTER))
    (sub / "bad id!" / CHAPTER).mkdir(parents=True)
    (sub / "plain\n" / CHAPTER).mkdir(parents=True)  # not a second "plain"
    (sub / ".hidden").mkdir()
    (sub / "README.txt").write_text("notes")
    (sub / "alias").symlink_to(sub / "plain")
    (sub / "plain" / "ch77_unknown").mkdir()
    (sub / "plain" / "notes.txt").write_text("x")
    (sub / "plain" / "link").symlink_to(sub / "plain" / CHAPTER)
    found = intake.find_submissions(sub, [CHAPTER])
    assert [(s, c) for s, c, _ in found.submissions] == [("a+b@uni.edu", CHAPTER), ("plain", CHAPTER)]
    reasons = dict(found.not_graded)
    assert set(reasons) == {".hidden", "README.txt", "alias", "bad id!", "plain?", "plain/ch77_unknown", "plain/link",
                            "plain/notes.txt"}
    assert "not a valid student id" in reasons["bad id!"] and "symbolic link" in reasons["alias"]
    assert "unknown chapter" in reasons["plain/ch77_unknown"] and "symbolic link" in reasons["plain/link"]


# --- isolation: refused unless asked for, flagged when asked ------------------------------------------

class _Unisolated:
    isolated, mode, cgroups, info = False, "plain", None, {"seccomp": False}


def test_autograde_refuses_without_isolation_and_flags_unisolated_grades(tmp_path, monkeypatch):
    from grader.sandbox import judge, supervisor

    sub, out = tmp_path / "submitted", tmp_path / "out"
    write(sub, "s1", CHAPTER, "{ not a notebook")  # graded without running anything: zeros and a reason
    monkeypatch.setattr(judge, "_server", lambda mode=None: _Unisolated())
    monkeypatch.setattr(supervisor, "why_not_isolated", lambda server: "a test's reason")
    with pytest.raises(RuntimeError, match="a test's reason.*--unisolated"):
        autograde.autograde(sub, out, progress=False, log=lambda *a: None)
    assert not (out / "grades.csv").exists()
    logged = []
    results = autograde.autograde(sub, out, progress=False, log=logged.append, unisolated=True)
    assert [r.unisolated for r in results] == [True]
    assert any("grading unisolated" in line for line in logged)
    assert "Provisional" in (out / "feedback" / "s1" / f"{CHAPTER}.html").read_text()
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        assert gb.find_submission_notebook(CHAPTER, CHAPTER, "s1").flagged
        comment = gb.find_comment("predict_training_memory", CHAPTER, CHAPTER, "s1").auto_comment
        assert "without the isolated sandbox" in comment and "not a valid notebook" in comment


def test_the_search_for_cells_without_grade_ids_is_bounded(monkeypatch):
    """Cells that lost their grade_id are searched by name, but a notebook of 200 slow-to-parse cells that each
    start defining every exercise (deeply nested parentheses, no commas) gets a bounded number of parses."""
    from grader import notebooks

    parsed = []
    real = notebooks.top_level_names
    monkeypatch.setattr(notebooks, "top_level_names", lambda source: parsed.append(len(source)) or real(source))
    exercises = ("checkpoint", "checkpoint_uniform", "checkpoint_blocks", "plan_checkpoints")
    slow = "".join(f"def {ex}(x):\n    pass\n" for ex in exercises) + "x = " + "(" * 60_000 + ")" * 60_000 + "\n"
    cells = [{"source": slow, "grade_id": None} for _ in range(200)]
    cells.append({"source": "def checkpoint(f, *a):\n    return f(*a)\n", "grade_id": None})
    found = exercise_sources(cells, exercises)
    assert found["checkpoint"].startswith("def checkpoint(f, *a)")  # the last cell defining it
    assert sum(parsed) <= notebooks.FALLBACK_BUDGET + len(slow)
