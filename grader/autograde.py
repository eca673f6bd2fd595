"""``python -m grader autograde SUBMISSIONS --out OUT``: grade every submission, lose nothing.

Layout in:  SUBMISSIONS/<student_id>/<chapter_id>/<chapter_id>.ipynb  (nbgrader's submitted/)
Out:        OUT/grades.csv  (student_id,chapter,problem,score,max_score; one row per graded cell)
            OUT/feedback/<student_id>/<chapter_id>.html
            OUT/timing.csv  (student_id,chapter,seconds; the wall time each submission of this run took)
            OUT/profile.csv (phase,seconds,count; where this run's time went: sandbox start, gradebook,
                             and per graded cell the worker's start, setup cells, exercise cells, hidden
                             checks and worker's stop, summed over parallel workers)
            the nbgrader gradebook (default sqlite:///OUT/gradebook.db; --db for PostgreSQL)

What runs where (see grader/sandbox/judge.py for the threat model):
  * This process never executes student code. From each submission it takes only the
    source of the exercise cells, and from the trusted release (course/) the setup cells and
    the list of graded cells with their points.
  * Each exercise cell's source is first read against its chapter's source policy
    (``grader.source_policy``): a cell that breaches it is left out of the program and every
    graded test cell of that exercise (the ones after it in the release) scores 0, with the
    construct, its line and what to use instead as the reason.
  * Each graded cell's hidden test runs here, against a sandboxed worker process that holds
    the student's definitions (``grader.sandbox.judge.run_checks``).
  * Exercises are graded in order, each on its own: once an exercise has failed any of its
    tests, the checks of later exercises run with the course's reference of it added after the
    student's cell, so one mistake costs its own points once (the feedback says so).
  * An exercise's further test cells (memory, edge cases, errors...) count once its first
    cell passes (``grader.api.gates``); the release says so in each such cell.
  * A submission that is missing, refused at intake (a link, a device, over a size cap, not
    notebook JSON: ``grader.intake``), raises, hangs or blows a limit gets zeros for what could
    not run and the reason in its feedback; every other result is still written. Every other
    entry under SUBMISSIONS is listed with the reason it was not graded (the summary and
    OUT/not_graded.csv). grades.csv is rewritten atomically after each submission, keeping the
    rows of submissions that this run did not grade.
  * With ``grader.cluster`` (``--scheduler``) the same grading runs on the workers of a Dask cluster;
    this process still reads every submission and writes every result.
  * Grading needs the isolated sandbox (root, cgroups, seccomp: ``grader/sandbox/judge.py``);
    without it autograde refuses unless told ``unisolated=True`` (``--unisolated``), and then
    flags every grade it writes (gradebook, feedback, summary).
"""
from __future__ import annotations

import csv
import os
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

# nbformat validates notebooks with jsonschema, whose optional checker of the "iri" format
# (rfc3987_syntax) builds a parser from its grammar when imported: seconds of every autograde
# process's start, for a format that no notebook schema uses. Without it jsonschema skips that format.
sys.modules.setdefault("rfc3987_syntax", None)
import nbformat  # noqa: E402 - after the line above

from grader import intake
from grader.api import checks_for, gates
from grader.feedback import UNISOLATED, write_feedback
from grader.notebooks import COURSE, Layout, chapters, exercise_sources, layout, read_source
from grader.sandbox import judge
from grader.sandbox.judge import Limits, Outcome, run_checks
from grader.sandbox.limits import WALL_FACTOR
from grader.source_policy import refusals

CSV_COLUMNS = ["student_id", "chapter", "problem", "score", "max_score"]


@dataclass
class Result:
    student: str
    chapter: str
    layout: Layout
    outcomes: dict[str, Outcome]
    sources: dict[str, str | None] = field(default_factory=dict)
    note: str = ""  # a reason that concerns the whole submission
    unisolated: bool = False  # graded without the isolated sandbox: flagged wherever it is written
    seconds: float = 0.0  # wall time this submission took to grade (OUT/timing.csv)

    def points(self, grade_id: str, max_points: float) -> float:
        return max_points if self.outcomes[grade_id].passed else 0.0

    @property
    def score(self) -> float:
        return sum(self.points(gid, pts) for gid, pts in self.layout.tests)

    @property
    def max_score(self) -> float:
        return sum(pts for _, pts in self.layout.tests)

    def rows(self) -> list[dict]:
        return [
            {"student_id": self.student, "chapter": self.chapter, "problem": gid,
             "score": _fmt(self.points(gid, points)), "max_score": _fmt(points)}
            for gid, points in self.layout.tests
        ]


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def release_layout(chapter: str, course_dir: Path = COURSE) -> Layout:
    path = course_dir / f"{chapter}.ipynb"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python -m grader release`")
    return layout(nbformat.read(path, as_version=4), chapter)


def _failed(lay: Layout, reason: str) -> dict[str, Outcome]:
    return {gid: Outcome(gid, False, reason) for gid, _ in lay.tests}


def grade_one(student: str, chapter: str, path: Path, lay: Layout, limits: Limits) -> Result:
    """Grade one submission. Never raises: every failure becomes zeros with a reason."""
    start = time.monotonic()
    found = read_submission(student, chapter, path, lay)
    result = found if isinstance(found, Result) else grade_notebook(student, chapter, found, lay, limits)
    result.seconds = time.monotonic() - start
    return result


def read_submission(student: str, chapter: str, path: Path, lay: Layout) -> bytes | Result:
    """The submitted notebook's bytes (``grader.intake``), or the zeros of one that cannot be read."""
    try:
        return intake.read_bytes(path)
    except FileNotFoundError:
        return Result(student, chapter, lay, _failed(lay, f"no notebook found at {chapter}/{chapter}.ipynb"),
                      note="missing notebook")
    except intake.Refused as e:
        return Result(student, chapter, lay, _failed(lay, str(e)), note=str(e))
    except Exception as e:  # noqa: BLE001 - one unreadable submission must not stop the batch
        reason = f"internal grading error ({type(e).__name__}); please contact the instructor"
        return Result(student, chapter, lay, _failed(lay, reason), note=reason)


def grade_notebook(student: str, chapter: str, data: bytes, lay: Layout, limits: Limits) -> Result:
    """Grade one submission from its notebook's bytes, as read by :func:`read_submission` (a cluster's
    worker gets them over the network: ``grader.cluster``). Never raises, and changes nothing outside the
    sandbox's own processes: grading a submission again (a lost worker's retried task) writes nothing twice,
    since only the caller writes grades, once per submission."""
    start = time.monotonic()
    result = _grade_notebook(student, chapter, data, lay, limits)
    result.seconds = time.monotonic() - start
    return result


def _grade_notebook(student: str, chapter: str, data: bytes, lay: Layout, limits: Limits) -> Result:
    try:
        try:
            cells = intake.parse_notebook(data)
        except intake.Refused as e:
            return Result(student, chapter, lay, _failed(lay, str(e)), note=str(e))
        sources = exercise_sources(cells, lay.exercises)
        # A cell that breaches the chapter's source policy is not run: its test cells score 0.
        refused = refusals(chapter, lay.setup, sources)
        missing = [ex for ex, src in sources.items() if src is None]
        zeros = {gid: Outcome(gid, False, reason) for ex, reason in refused.items()
                 for gid in lay.tests_of(ex)}
        outcomes, stood_in = _grade_in_order(chapter, lay, sources, refused, zeros, limits)
        notes = [f"exercise cell(s) not found: {', '.join(missing)}"] if missing else []
        if stood_in:
            notes.append(f"the tests of later exercises ran with the course's own {', '.join(stood_in)} in place "
                         "of yours, which did not pass all of its tests: each mistake costs its own points once")
        return Result(student, chapter, lay, outcomes, sources, "; ".join(notes))
    except Exception as e:  # noqa: BLE001 - one broken submission must not stop the batch
        reason = f"internal grading error ({type(e).__name__}); please contact the instructor"
        return Result(student, chapter, lay, _failed(lay, reason), note=reason)


def _grade_in_order(chapter: str, lay: Layout, sources: dict[str, str | None], refused: dict[str, str],
                    zeros: dict[str, Outcome], limits: Limits) -> tuple[dict[str, Outcome], list[str]]:
    """Run each exercise's checks, in the release's order, on its own merits.

    Later exercises call earlier ones (ch02's checkpoint_uniform calls checkpoint). An earlier
    exercise that did not pass all of its tests (or was refused, or is missing) is followed, in
    the program of every later exercise's checks, by the course's reference cell, which rebinds
    its name; the student's own cell still runs first, so helpers it defines stay available.
    Returns the outcomes and the exercises that were stood in for while a later one was graded.
    """
    references = _references(chapter, lay)
    # What the course's own exercise cells hold once run: what the student's are compared with.
    baseline = [references[e] for e in lay.exercises if e in references]
    needs = gates(chapter, lay)
    checks = checks_for(chapter)
    owned = {gid for ex in lay.exercises for gid in lay.tests_of(ex)}
    groups = [(None, [gid for gid, _ in lay.tests if gid not in owned])]
    groups += [(ex, list(lay.tests_of(ex))) for ex in lay.exercises]
    outcomes: dict[str, Outcome] = dict(zeros)
    failed: list[str] = []
    stood_in: list[str] = []
    for ex, gids in groups:
        program = list(lay.setup)
        for e in lay.exercises:
            if sources.get(e) is not None and e not in refused:
                program.append(sources[e])
            if e in failed and e in references:
                program.append(references[e])
                if e not in stood_in:
                    stood_in.append(e)
        pending = [gid for gid in gids if gid not in outcomes]
        while pending:
            # a cell whose gates are decided: it runs if they passed, else it scores 0 unrun
            decided = [g for g in pending if all(n in outcomes or n not in gids for n in needs.get(g, ()))]
            if not decided:  # gates that wait on each other: none of them can count
                decided = pending
            ready = []
            for g in decided:
                unmet = [n for n in needs.get(g, ()) if not (n in outcomes and outcomes[n].passed)]
                if unmet:
                    verb = "passes" if len(unmet) == 1 else "pass"
                    outcomes[g] = Outcome(g, False, f"this cell counts once {' and '.join(unmet)} {verb}: it "
                                                    "grades a further property of an implementation that "
                                                    "computes the right thing (fix that cell first)")
                else:
                    ready.append(g)
            if ready:
                outcomes.update(run_checks(chapter, program, ready, limits, setup=len(lay.setup),
                                           baseline=baseline, checks=checks))
            pending = [g for g in pending if g not in outcomes]
        if ex is not None and not all(outcomes[gid].passed for gid in gids if gid in outcomes):
            failed.append(ex)
    return outcomes, stood_in


_REFERENCES: dict[str, dict[str, str]] = {}


def _references(chapter: str, lay: Layout) -> dict[str, str]:
    """The reference cell of each exercise, from the chapter's source (judge-side only)."""
    if chapter not in _REFERENCES:
        try:
            found = exercise_sources(read_source(chapter), lay.exercises)
        except (OSError, ValueError):  # a chapter without a solutions source (a test's toy chapter)
            found = {}
        _REFERENCES[chapter] = {ex: src for ex, src in found.items() if src is not None}
    return _REFERENCES[chapter]


class CsvWriter:
    """grades.csv, rewritten atomically; rows of submissions not graded in this run are kept."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: dict[tuple[str, str], list[dict]] = {}
        if path.exists():
            with path.open(newline="") as f:
                for row in csv.DictReader(f):
                    self.rows.setdefault((row["student_id"], row["chapter"]), []).append(row)

    def add(self, result: Result) -> None:
        self.rows[(result.student, result.chapter)] = result.rows()
        tmp = self.path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            w.writeheader()
            for key in sorted(self.rows):
                w.writerows(self.rows[key])
        os.replace(tmp, self.path)


class GradebookWriter:
    """Scores into nbgrader's gradebook (SQLite by default, any SQLAlchemy URL works)."""

    def __init__(self, db_url: str, layouts: dict[str, Layout]):
        from grader.gradebook import SharedGradebook
        from grader.release import nbgrader_env

        nbgrader_env()
        _alembic_in_process()
        self.gb = SharedGradebook(db_url)  # other graders may write the same database at the same time
        for ch, lay in layouts.items():
            self.gb.update_or_create_assignment(ch)
            self.gb.update_or_create_notebook(ch, ch)
            for gid, points in lay.tests:
                self.gb.update_or_create_grade_cell(gid, ch, ch, max_score=points, cell_type="code")
            for ex in lay.exercises:
                self.gb.update_or_create_solution_cell(ex, ch, ch)

    def add(self, result: Result) -> None:
        with warnings.catch_warnings():
            # nbgrader 0.9 with SQLAlchemy 2 warns "not in session" while adding a
            # submission; the rows are written correctly (tests read them back).
            warnings.filterwarnings("ignore", message=".*not in session.*")
            self.gb.update_or_create_student(result.student)
            self.gb.update_or_create_submission(result.chapter, result.student)
        # The submission's grades and comments in one query each, not one per cell.
        notebook = self.gb.find_submission_notebook(result.chapter, result.chapter, result.student)
        points = dict(result.layout.tests)
        for grade in notebook.grades:
            if grade.name in points:
                grade.auto_score = result.points(grade.name, points[grade.name])
        notebook.flagged = result.unisolated  # formgrader lists flagged submissions for review
        comment = "; ".join(filter(None, [UNISOLATED if result.unisolated else "", result.note])) or None
        exercises = set(result.layout.exercises)
        for found in notebook.comments:
            if found.name in exercises:
                found.auto_comment = comment
        self.gb.db.commit()

    def close(self) -> None:
        self.gb.close()


def autograde(submissions: Path, out: Path, workers: int = 1, timeout: float | None = None,
              db_url: str | None = None, course_dir: Path = COURSE, progress: bool = True,
              log=print, unisolated: bool = False, cluster=None) -> list[Result]:
    """Grade every submission under ``submissions`` into ``out``; see the module's docstring.

    ``timeout``: CPU seconds per graded cell (the wall-clock backstop is ``WALL_FACTOR`` times more).
    ``cluster``: a started ``grader.cluster.Cluster`` whose workers grade the submissions (its caller
    closes it); this process still reads the notebooks and writes every result.
    Raises RuntimeError, before anything is written, when the sandbox cannot start, or cannot isolate
    workers and ``unisolated`` is false."""
    started = time.perf_counter()
    judge.phase_times(reset=True)
    known = chapters()
    found = intake.find_submissions(submissions, known)
    todo = found.submissions
    out.mkdir(parents=True, exist_ok=True)
    _write_not_graded(out / "not_graded.csv", found.not_graded)
    for rel, why in found.not_graded:
        log(f"not graded: {rel}: {why}")
    layouts = {ch: release_layout(ch, course_dir) for ch in sorted({c for _, c, _ in todo})}
    limits = Limits() if timeout is None else Limits(cpu_seconds=float(timeout), wall_seconds=WALL_FACTOR * float(timeout))
    flagged = False
    if cluster is not None:
        flagged = cluster.flagged
        judge.add_phase_times({"sandbox start": (cluster.start_seconds, 1)})
    elif todo:
        # Start the sandbox before any grade is written: a machine that cannot run it must
        # stop the batch with a reason, not give every student "internal error" zeros. Its server
        # starts in a process of its own (seconds of imports): the gradebook's libraries load meanwhile.
        with ThreadPoolExecutor(max_workers=1) as starting:
            server = starting.submit(_start_sandbox)
            with judge.timed("gradebook imports"):
                _alembic_in_process()
            flagged = _isolated_or_flagged(server.result(), unisolated, log)
    csv_writer = CsvWriter(out / "grades.csv")
    with judge.timed("gradebook open"):
        gradebook = GradebookWriter(db_url or f"sqlite:///{(out / 'gradebook.db').resolve()}", layouts)
    results: list[Result] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="autograde", unit="submission")
    try:
        graded = cluster.grade(todo, layouts, limits) if cluster is not None else _grade_here(todo, layouts, limits, workers)
        for result in graded:
            result.unisolated = result.unisolated or flagged
            results.append(result)
            with judge.timed("grades.csv"):
                csv_writer.add(result)
            try:  # one submission's record must not stop the others'
                with judge.timed("gradebook writes"):
                    gradebook.add(result)
                with judge.timed("feedback pages"):
                    write_feedback(out / "feedback" / result.student / f"{result.chapter}.html", result)
            except Exception as e:  # noqa: BLE001 - reported, and the batch goes on
                print(f"{result.student}/{result.chapter}: its feedback or gradebook entry could not be "
                      f"written ({type(e).__name__}); its grades are in grades.csv", file=sys.stderr)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        gradebook.close()
        _write_timing(out / "timing.csv", results)
        _write_profile(out / "profile.csv", judge.phase_times(), time.perf_counter() - started, len(results))
    return sorted(results, key=lambda r: (r.student, r.chapter))


def _grade_here(todo: list[tuple[str, str, Path]], layouts: dict[str, Layout], limits: Limits, workers: int):
    """Results as they come, from ``workers`` threads of this process sharing its sandbox."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(grade_one, s, c, p, layouts[c], limits) for s, c, p in todo]
        for fut in as_completed(futures):
            yield fut.result()


def _start_sandbox():
    from grader.sandbox.judge import _server

    with judge.timed("sandbox start"):
        try:
            return _server()
        except Exception as e:  # noqa: BLE001 - reported to the instructor as one clear error
            raise RuntimeError(f"the grading sandbox could not start: {e}") from e


def _isolated_or_flagged(server, unisolated: bool, log, where: str = "this machine") -> bool:
    """Whether grades from ``server`` must be flagged; raises RuntimeError where they may not be written."""
    from grader.sandbox.supervisor import why_not_isolated

    return _flag(server.isolated, "" if server.isolated else why_not_isolated(server), unisolated, log, where)


def _flag(isolated: bool, why: str, unisolated: bool, log, where: str) -> bool:
    if isolated:
        return False
    if not unisolated:
        raise RuntimeError(f"the grading sandbox cannot isolate submissions on {where} ({why}). Grade "
                           "as root on Linux with cgroups (v1 or v2) and libseccomp, or pass --unisolated to "
                           "grade anyway: every grade is then flagged for regrading")
    log(f"warning: grading unisolated on {where} ({why}): every grade is flagged")
    return True


_ALEMBIC_HEAD: list[str] = []


def _alembic_in_process() -> None:
    """nbgrader stamps a new gradebook with its schema's version, which it learns by running the ``alembic``
    command (a Python process of its own: seconds). Read the same version from nbgrader's migration scripts
    here instead, once per process."""
    import nbgrader.api

    if not _ALEMBIC_HEAD:
        from alembic.config import Config
        from alembic.script import ScriptDirectory
        from nbgrader.dbutil import _temp_alembic_ini

        with _temp_alembic_ini("sqlite:///gradebook.db") as ini:
            _ALEMBIC_HEAD.append(ScriptDirectory.from_config(Config(ini)).get_current_head())
    nbgrader.api.get_alembic_version = lambda: _ALEMBIC_HEAD[0]


def _write_profile(path: Path, phases: dict[str, tuple[float, int]], wall: float, graded: int) -> None:
    """OUT/profile.csv: where this run's time went. Each phase's seconds are summed over the threads that
    ran it (workers run in parallel: the sum may exceed the wall time); ``count`` says how often it ran."""
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["phase", "seconds", "count"])
        w.writerow(["autograde (wall)", f"{wall:.3f}", graded])
        for name, (seconds, count) in phases.items():
            w.writerow([name, f"{seconds:.3f}", count])
    os.replace(tmp, path)


def _write_timing(path: Path, results: list[Result]) -> None:
    """OUT/timing.csv: how long each submission graded in this run took (wall seconds)."""
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student_id", "chapter", "seconds"])
        for r in sorted(results, key=lambda r: (r.student, r.chapter)):
            w.writerow([r.student, r.chapter, f"{r.seconds:.3f}"])
    os.replace(tmp, path)


def _write_not_graded(path: Path, entries: list[tuple[str, str]]) -> None:
    """OUT/not_graded.csv: each entry under SUBMISSIONS that was not graded, and why (this run's)."""
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "reason"])
        w.writerows(entries)
    os.replace(tmp, path)
