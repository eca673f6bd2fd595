"""nbgrader's gradebook, shared by several graders and read back for the instructor's report.

Several ``autograde`` processes may write one gradebook on a database server (``--db postgresql://...``):
two graders that start on a new database would both create its tables (one of them failing), and two that
add the same student, chapter or cell at once would both insert it (nbgrader rolls one back and raises).
:class:`SharedGradebook` creates the tables under a PostgreSQL advisory lock, one process at a time, and
retries an ``update_or_create_*`` call that lost such a race, which then finds the row the other process
added and updates it. SQLite (the default, one file per OUT) needs neither.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass, field

from nbgrader.api import Gradebook, InvalidEntry

COURSE_ID = "efficient-training"
RETRIES = 5
_INIT_LOCK = 0x636F75727365  # any constant shared by every grader of this course: "course"


def safe_url(db_url: str) -> str:
    """``db_url`` without its password, for messages."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(db_url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL is reported as given, less anything after '@'
        return db_url.rsplit("@", 1)[-1]


@contextlib.contextmanager
def _creation_lock(db_url: str):
    """Held while a gradebook is opened (its tables created if new): one process at a time on PostgreSQL."""
    if not db_url.startswith("postgresql"):
        yield
        return
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _INIT_LOCK})
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _INIT_LOCK})
    finally:
        engine.dispose()


def _retried(name: str):
    base = getattr(Gradebook, name)

    @functools.wraps(base)
    def method(self, *args, **kwargs):
        quiet = logging.getLogger("tornado.application")  # nbgrader logs each rollback with a traceback
        for attempt in range(RETRIES):
            level = quiet.level
            quiet.setLevel(logging.CRITICAL if attempt < RETRIES - 1 else level)
            try:
                return base(self, *args, **kwargs)
            except InvalidEntry:  # another grader added the same row first (nbgrader rolled back): find it now
                if attempt == RETRIES - 1:
                    raise
            finally:
                quiet.setLevel(level)

    return method


class SharedGradebook(Gradebook):
    """A :class:`nbgrader.api.Gradebook` that other processes may write at the same time (see the module)."""

    def __init__(self, db_url: str, course_id: str = COURSE_ID):
        from sqlalchemy.exc import SQLAlchemyError

        try:
            with _creation_lock(db_url):
                super().__init__(db_url, course_id=course_id)
        except ModuleNotFoundError as e:
            raise RuntimeError(f"the gradebook {safe_url(db_url)} needs the Python module {e.name!r}, which is not "
                               "installed (PostgreSQL: psycopg, installed by `make`)") from None
        except SQLAlchemyError as e:
            why = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
            raise RuntimeError(f"the gradebook {safe_url(db_url)} could not be opened: {why}") from None

    update_or_create_student = _retried("update_or_create_student")
    update_or_create_assignment = _retried("update_or_create_assignment")
    update_or_create_notebook = _retried("update_or_create_notebook")
    update_or_create_grade_cell = _retried("update_or_create_grade_cell")
    update_or_create_solution_cell = _retried("update_or_create_solution_cell")
    update_or_create_submission = _retried("update_or_create_submission")


@dataclass
class Submission:
    """One graded submission as the gradebook holds it."""

    student: str
    chapter: str
    scores: dict[str, tuple[float, float]] = field(default_factory=dict)  # problem -> (score, max_score)
    flagged: bool = False  # graded unisolated
    comments: list[str] = field(default_factory=list)  # the grader's notes on the submission

    @property
    def score(self) -> float:
        return sum(s for s, _ in self.scores.values())

    @property
    def max_score(self) -> float:
        return sum(m for _, m in self.scores.values())


@dataclass
class Contents:
    """Everything :func:`read` takes from a gradebook."""

    chapters: dict[str, dict[str, float]]  # chapter -> problem -> max_score
    students: list[str]
    submissions: list[Submission]


def read(db_url: str) -> Contents:
    """Chapters with their graded cells, students, and every submission's scores, flag and notes."""
    with SharedGradebook(db_url) as gb:
        chapters = {}
        for assignment in sorted(gb.assignments, key=lambda a: a.name):
            cells = [c for nb in assignment.notebooks for c in nb.grade_cells]
            chapters[assignment.name] = {c.name: float(c.max_score) for c in sorted(cells, key=lambda c: c.name)}
        students = sorted(s.id for s in gb.students)
        submissions = []
        for assignment in gb.assignments:
            for sub in assignment.submissions:
                found = Submission(sub.student.id, assignment.name)
                for nb in sub.notebooks:
                    found.flagged |= bool(nb.flagged)
                    for grade in nb.grades:
                        found.scores[grade.name] = (float(grade.score or 0), float(grade.max_score or 0))
                    notes = {c.auto_comment for c in nb.comments if c.auto_comment}
                    found.comments += sorted(notes)
                submissions.append(found)
    submissions.sort(key=lambda s: (s.student, s.chapter))
    return Contents(chapters, students, submissions)

