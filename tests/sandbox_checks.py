"""A chapter's hidden tests through the sandbox, as at autograde.

Each ``tests/test_hidden_chNN_*.py`` first runs its checks in-kernel against many correct and
wrong implementations, then takes these two tests (the reference's is read from the run's one
grading of every reference, ``tests/graded_once.py``)::

    test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(CHAPTER, WRONG)

The reference must pass every hidden test in a sandboxed worker, and each wrong submission of
``WRONG`` (``tests/wrong_submissions_<chapter>.py``) must fail its own.
"""
from __future__ import annotations

import pytest

import graded_once
from grader.api import checks_for
from grader.notebooks import exercise_sources, layout, read_source
from grader.sandbox import judge

# Interpreted Triton kernels and small trainings run in one worker per problem: generous limits.
LIMITS = judge.Limits(wall_seconds=120.0, memory_bytes=4 * 1024**3, output_bytes=64 * 1024)


def program(chapter: str, replace: dict[str, str] | None = None) -> list[str]:
    """The release's setup cells, then the reference exercise cells with ``replace`` swapped in."""
    nb = read_source(chapter)
    lay = layout(nb, chapter)
    sources = exercise_sources(nb, lay.exercises)
    sources.update(replace or {})
    return list(lay.setup) + [src for src in sources.values() if src is not None]


def sandbox_tests(chapter: str, wrong: dict, grade_ids: dict[str, str] | None = None):
    """The two sandbox tests of ``chapter``; ``grade_ids`` maps an exercise to its test cell's
    grade_id when that is not ``test_<exercise>``."""
    grade_ids = grade_ids or {}
    exercises = sorted(ex for ch, ex in wrong if ch == chapter)

    def test_sandbox_reference_passes():
        # The run's one sandboxed grading of every reference (tests/graded_once.py).
        rows = graded_once.rows("reference", chapter)
        assert {r["problem"] for r in rows} == set(checks_for(chapter)), "every hidden test was graded"
        lost = [r["problem"] for r in rows if float(r["score"]) != float(r["max_score"])]
        assert not lost, (f"the reference lost {lost}; reasons in "
                          f"{graded_once.feedback('reference', chapter)}")

    @pytest.mark.parametrize("exercise", exercises)
    def test_sandbox_wrong_submission_fails(exercise):
        grade_id = grade_ids.get(exercise, f"test_{exercise}")
        outcomes = judge.run_checks(chapter, program(chapter, {exercise: wrong[(chapter, exercise)]}), [grade_id],
                                    LIMITS, checks=checks_for(chapter))
        assert not outcomes[grade_id].passed, f"the wrong {exercise} passed its hidden test"
        assert outcomes[grade_id].reason

    return test_sandbox_reference_passes, test_sandbox_wrong_submission_fails
