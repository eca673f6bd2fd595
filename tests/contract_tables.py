"""Contract-to-check tables: every property an exercise's text states is graded, and only by its cell.

Each chapter's ``tests/test_hidden_<chapter>.py`` declares ``CONTRACT``, a list of :class:`Clause`: a phrase quoted
from the exercise's docstring or the text above its cell (what the student is told), the graded cell(s) that check
it, and a wrong answer that breaks that property alone. :func:`contract_tests` turns the table into three tests:

- every quoted phrase is in the released notebook, in the exercise's cell or the Markdown right above it (a
  contract that was reworded must be re-read, not silently kept);
- every wrong answer fails exactly the cells its clause names, with the clause's message (raised as an
  AssertionError, the check's own verdict, unless the clause names another exception); the other cells of its
  exercise pass, or wait on one of those (``grader.api.gates``: the autograder does not run them, and neither
  does this test), so that no cell blames a property the answer got right (the property is graded where the
  notebook says, and its failure is explained there only);
- every graded cell of the chapter is named by some clause (no check grades something the text does not say).

A property that only the sandbox can grade (memory or CPU time read from the worker's cgroup) names the test of
the module that grades a wrong answer through the sandbox (``shown_by``) instead of a wrong answer; the table test
checks that the test exists, and the suite runs it.

``tests/test_chapters.py`` checks that every chapter has a table.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

from grader.api import gates
from grader.chapters import declared
from grader.notebooks import grade_id

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Clause:
    exercise: str
    says: str  # quoted from the exercise's docstring or the Markdown above it (whitespace and case do not matter)
    cells: tuple[str, ...]  # the graded cells that a wrong answer breaking only this clause fails
    wrong: dict = field(default_factory=dict, hash=False)  # namespace overrides: {exercise name: wrong answer}
    message: str | None = None  # a regex the failures must match
    shown_by: str | None = None  # a test of the module that grades this clause through the sandbox
    label: str = ""  # a short id for the test report; the first words of `says` otherwise
    raises: str = "AssertionError"  # what each of `cells` raises on the wrong answer (a check's verdict, unless the
    # student's own error is what the cell reports)

    @property
    def id(self) -> str:
        return self.label or re.sub(r"\W+", "-", self.says.lower())[:40].strip("-")


def _normal(text: str) -> str:
    return " ".join(text.replace("`", "").split()).lower()


def exercise_text(chapter: str, exercise: str) -> str:
    """The released exercise cell (docstring included) and the Markdown cells right above it."""
    nb = nbformat.read(ROOT / "course" / f"{chapter}.ipynb", as_version=4)
    for i, cell in enumerate(nb.cells):
        if grade_id(cell) == exercise and cell.metadata["nbgrader"].get("solution"):
            parts = [cell.source]
            j = i - 1
            while j >= 0 and nb.cells[j].cell_type == "markdown":
                parts.insert(0, nb.cells[j].source)
                j -= 1
            return "\n".join(parts)
    raise AssertionError(f"{chapter} has no exercise {exercise!r}")


def _failure(check: Callable, ns) -> str | None:
    try:
        check(ns)
    except (AssertionError, RuntimeError, NotImplementedError, TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def contract_tests(chapter: str, clauses: list[Clause], namespace: Callable, checks: dict, module: dict):
    """The three tests of a chapter's table; ``namespace(**overrides)`` builds a correct answer's namespace with
    ``overrides`` swapped in, ``checks`` maps graded cell -> check, ``module`` is the test module's ``globals()``."""
    decl = declared(chapter)
    waits = gates(chapter, decl)
    ids = [c.id for c in clauses]

    @pytest.mark.parametrize("clause", clauses, ids=ids)
    def test_contract_quotes_the_notebook(clause):
        text = _normal(exercise_text(chapter, clause.exercise))
        assert _normal(clause.says) in text, \
            f"{chapter}.{clause.exercise}: the contract quotes {clause.says!r}, which its text no longer says"

    @pytest.mark.parametrize("clause", clauses, ids=ids)
    def test_contract_wrong_answer_loses_only_its_cells(clause):
        own = decl.tests_of(clause.exercise)
        assert clause.cells and set(clause.cells) <= set(own), \
            f"{clause.cells} are not all graded cells of {clause.exercise} ({own})"
        if clause.shown_by is not None:
            assert callable(module.get(clause.shown_by)), f"no test {clause.shown_by} in the module"
            assert not clause.wrong, "a clause is shown either by a wrong answer or by a sandbox test, not both"
            return
        assert clause.wrong, "a clause needs a wrong answer (or shown_by)"
        ns = namespace(**clause.wrong)
        outcome, failed, waiting = {}, set(), set()
        for cell in own:  # in notebook order, as the autograder runs them: a cell waiting on a lost one is not run
            if set(waits.get(cell, ())) & (failed | waiting):
                waiting.add(cell)
                continue
            outcome[cell] = _failure(checks[cell], ns)
            if outcome[cell] is not None:
                failed.add(cell)
        assert failed == set(clause.cells), \
            f"breaking {clause.says!r} should fail exactly {sorted(clause.cells)} (and cells waiting on them); " \
            f"it failed {outcome}"
        for cell in clause.cells:
            assert outcome[cell].startswith(f"{clause.raises}: "), \
                f"{cell} failed with another exception than {clause.raises}: {outcome[cell]}"
            if clause.message:  # searched in the exception's text, as pytest.raises(..., match=) does
                assert re.search(clause.message, outcome[cell][len(clause.raises) + 2:]), \
                    f"{cell} failed for another reason than {clause.message!r}: {outcome[cell]}"

    def test_contract_covers_every_graded_cell():
        named = {cell for c in clauses for cell in c.cells}
        missing = [gid for gid, _ in decl.tests if gid not in named]
        assert not missing, f"{chapter}: graded cells that no clause of CONTRACT names: {missing}"

    return test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
        test_contract_covers_every_graded_cell
