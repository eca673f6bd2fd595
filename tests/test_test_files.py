"""The per-chapter files of tests/ follow one naming scheme, and a wrong answer has one form.

Naming: ``test_hidden_<chapter>.py``, ``test_kernels_<chapter>.py``, ``wrong_submissions_<chapter>.py`` and
``second_submissions_<chapter>.py`` end in a full chapter id of solutions/ (``ch02_checkpointing``, never
``ch02``), and every chapter has its ``test_hidden_<chapter>.py`` and ``wrong_submissions_<chapter>.py``.

Form: ``WRONG`` always maps ``(chapter, exercise)`` to the source text of a wrong exercise cell, defined in
``wrong_submissions_<chapter>.py`` (``wrong_submissions.py`` only gathers them). A test_hidden file that
needs ``WRONG`` imports it from its chapter's file; the wrong implementations it writes in place, as
callables or flags, live under names ending in ``_VARIANTS``.

The fixtures in tests/toy_chapter/ and tests/hostile*/ are not chapter files and are not checked.
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from grader.notebooks import chapters, layout, read_source

TESTS = Path(__file__).parent
CHAPTERS = chapters()
PREFIXES = ("test_hidden_", "test_kernels_", "wrong_submissions_", "second_submissions_")
REQUIRED = ("test_hidden_", "wrong_submissions_")


def _per_chapter_files() -> list[Path]:
    return sorted(p for prefix in PREFIXES for p in TESTS.glob(f"{prefix}*.py"))


def _prefix(path: Path) -> str:
    return next(p for p in PREFIXES if path.name.startswith(p))


def _expected_name(path: Path) -> str:
    """The name the file should have: its prefix and the full id of the chapter its name points at."""
    prefix = _prefix(path)
    suffix = path.stem.removeprefix(prefix)
    matches = [c for c in CHAPTERS if c.split("_", 1)[0] == suffix.split("_", 1)[0]]  # same chNN
    if len(matches) == 1:
        return f"{prefix}{matches[0]}.py"
    return f"{prefix}<chapter>.py with <chapter> one of {', '.join(CHAPTERS)}"


def _chapter_of(path: Path) -> str:
    return path.stem.removeprefix(_prefix(path))


def test_chapters_are_found():
    assert CHAPTERS, "no chapter in solutions/"
    assert _per_chapter_files(), "no per-chapter test file in tests/"


@pytest.mark.parametrize("path", _per_chapter_files(), ids=lambda p: p.name)
def test_file_name_ends_in_a_full_chapter_id(path):
    assert _chapter_of(path) in CHAPTERS, (
        f"tests/{path.name} does not end in a chapter id of solutions/: rename it to "
        f"tests/{_expected_name(path)}")


@pytest.mark.parametrize("chapter", CHAPTERS)
@pytest.mark.parametrize("prefix", REQUIRED)
def test_every_chapter_has_its_test_files(chapter, prefix):
    expected = TESTS / f"{prefix}{chapter}.py"
    assert expected.is_file(), f"solutions/{chapter}.py has no tests/{expected.name}"


def _wrong_files() -> list[Path]:
    return sorted(TESTS.glob("wrong_submissions_*.py"))


@pytest.mark.parametrize("path", _wrong_files(), ids=lambda p: p.name)
def test_wrong_maps_an_exercise_of_its_chapter_to_source_text(path):
    chapter = _chapter_of(path)
    assert chapter in CHAPTERS, f"tests/{path.name}: rename it to tests/{_expected_name(path)}"
    module = importlib.import_module(path.stem)
    assert ast.get_docstring(ast.parse(path.read_text())), (
        f"tests/{path.name} needs a module docstring saying what each wrong answer gets wrong")
    wrong = getattr(module, "WRONG", None)
    assert isinstance(wrong, dict) and wrong, f"tests/{path.name} defines no WRONG = {{(chapter, exercise): source}}"
    exercises = layout(read_source(chapter), chapter).exercises
    for key, source in wrong.items():
        assert isinstance(key, tuple) and len(key) == 2, f"tests/{path.name}: key {key!r} is not (chapter, exercise)"
        assert key[0] == chapter, (f"tests/{path.name} holds a wrong answer of {key[0]}: it belongs in "
                                   f"tests/wrong_submissions_{key[0]}.py")
        assert key[1] in exercises, (f"tests/{path.name}: {key[1]!r} is not an exercise of {chapter} "
                                     f"(its exercises: {', '.join(exercises)})")
        assert isinstance(source, str) and source.strip(), (
            f"tests/{path.name}: WRONG[{key!r}] is a {type(source).__name__}, expected the cell's source text")


def test_wrong_submissions_only_gathers_the_chapter_files():
    from wrong_submissions import WRONG

    gathered = {}
    for path in _wrong_files():
        gathered.update(importlib.import_module(path.stem).WRONG)
    assert WRONG == gathered, "tests/wrong_submissions.py holds wrong answers of its own: move them to " \
                              "tests/wrong_submissions_<chapter>.py"
    tree = ast.parse((TESTS / "wrong_submissions.py").read_text())
    literals = [n for n in ast.walk(tree) if isinstance(n, ast.Dict) and n.keys]
    assert not literals, "tests/wrong_submissions.py writes wrong answers inline: move them to " \
                         "tests/wrong_submissions_<chapter>.py"


def _bound_names(tree: ast.Module) -> list[tuple[str, ast.stmt]]:
    """Module-level names an assignment binds, with the statement."""
    found = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    found.append((name.id, node))
    return found


@pytest.mark.parametrize("path", sorted(TESTS.glob("test_hidden_*.py")), ids=lambda p: p.name)
def test_hidden_tests_keep_wrong_for_source_text(path):
    tree = ast.parse(path.read_text())
    chapter = _chapter_of(path)
    for name, node in _bound_names(tree):
        assert name != "WRONG", (
            f"tests/{path.name}:{node.lineno} assigns WRONG: WRONG means {{(chapter, exercise): source text}} "
            f"and is imported from tests/wrong_submissions_{chapter}.py; call in-file wrong implementations "
            f"WRONG_VARIANTS (or <NAME>_VARIANTS)")
        if "WRONG" in name:
            assert name.endswith("_VARIANTS"), (
                f"tests/{path.name}:{node.lineno} names wrong implementations {name}: only WRONG may mean "
                f"wrong answers without the _VARIANTS suffix (e.g. WRONG_VARIANTS, WRONG_<EXERCISE>_VARIANTS)")
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(a.name == "WRONG" for a in node.names):
            assert node.module == f"wrong_submissions_{chapter}", (
                f"tests/{path.name}:{node.lineno} imports WRONG from {node.module}: expected "
                f"from wrong_submissions_{chapter} import WRONG")
