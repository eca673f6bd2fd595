"""``make bench-grade``: seconds per submission, the course's grader beside plain nbgrader, on the same submissions.

    python -m grader.bench_grade [CHAPTER ...] [-n N] [--workers W] [--no-nbgrader] [--out DIR]

For each chapter (default ``ch00_memory ch01_lora``) it writes N synthetic submissions (the released
notebook with its exercise cells filled in, in turn: the course's reference answers, the second correct
answers of ``tests/second_submissions_<chapter>.py``, and one wrong answer of
``tests/wrong_submissions_<chapter>.py``, a different exercise each time) and grades them twice, in fast
mode (``COURSE_FAST=1``) and one thread per process:

* the course's grader, as an instructor runs it: ``python -m grader autograde SUB --out OUT --workers W``
  (W defaults to the machine's cores), isolated sandbox and all. Its OUT/profile.csv says where the time
  went: the command's start (Python, imports), the sandbox's start, the gradebook, and per graded cell the
  worker's start, the setup cells, the student's cells, the hidden checks and the worker's stop;
* plain nbgrader on the same notebooks: a course directory whose source is the chapter's instructor
  notebook, ``nbgrader generate_assignment``, the submissions in ``submitted/``, ``nbgrader autograde``: the
  whole notebook runs in the student's kernel, hidden tests included.

Seconds per submission are each command's wall time over N, start-up included. The totals each gives
every submission are compared (they differ where a wrong answer costs a cell that the course's grader
holds back behind a gate, or where one exercise's mistake makes nbgrader's later cells fail too).
Everything is written under ``--out`` (default ``build/bench-grade``): the submissions, both outputs,
``bench.csv`` (one line per chapter) and ``profile.md`` (the tables printed).

Wall-clock times depend on the machine and on what else runs on it: run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from grader.notebooks import COURSE, ROOT, check_chapter_id, exercise_sources, grade_id, layout, read_source

DEFAULT_CHAPTERS = ("ch00_memory", "ch01_lora")
OUT = ROOT / "build" / "bench-grade"
KINDS = ("correct", "second", "wrong")
NBGRADER_CELL_SECONDS = 600  # a cell of the whole notebook, run by nbgrader's kernel
# What the course grader's OUT/profile.csv phases are called in the printed table, in order.
PROFILE_ROWS = (
    ("start-up", "Python start, imports (the command's wall time before grading begins)"),
    ("sandbox start", "fork server: torch and the probes imported once, then the integrity snapshot"),
    ("gradebook imports", "nbgrader and alembic loaded while the sandbox starts (overlaps it)"),
    ("gradebook open", "nbgrader's gradebook: schema, assignment and cells"),
    ("worker start", "per graded cell: fork, namespaces, cgroup, limits, seccomp"),
    ("setup cells", "per graded cell: priming and the release's setup cells"),
    ("exercise cells", "per graded cell: the student's exercise cells"),
    ("hidden checks", "per graded cell: the hidden test against the worker"),
    ("worker stop", "per graded cell: kill, reap, clean-up"),
    ("gradebook writes", "per submission: its grades and comments"),
    ("feedback pages", "per submission: the HTML feedback"),
    ("grades.csv", "per submission: grades.csv rewritten"),
)


@dataclass
class Run:
    """One grader's run over one chapter's submissions."""
    wall: float
    scores: dict[str, float]  # student -> total points
    phases: dict[str, tuple[float, int]] = field(default_factory=dict)  # OUT/profile.csv
    error: str = ""


def _answers(chapter: str, kind: str) -> dict[tuple[str, str], str]:
    """``SECOND`` or ``WRONG`` of the chapter's ``tests/{kind}_submissions_<chapter>.py`` (empty without one)."""
    path = ROOT / "tests" / f"{kind}_submissions_{chapter}.py"
    if not path.exists():
        return {}
    spec = importlib.util.spec_from_file_location(f"bench_{kind}_{chapter}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = getattr(module, "SECOND" if kind == "second" else "WRONG")
    return {key: src for key, src in found.items() if key[0] == chapter}


def submissions(chapter: str, n: int) -> list[tuple[str, str, nbformat.NotebookNode]]:
    """N (student id, kind, notebook): the release with its exercise cells filled in, kinds in turn."""
    release = COURSE / f"{chapter}.ipynb"
    if not release.exists():
        raise FileNotFoundError(f"{release} is missing: run `python -m grader release {chapter}`")
    blank = nbformat.read(release, as_version=4)
    exercises = layout(blank, chapter).exercises
    reference = {ex: src for ex, src in exercise_sources(read_source(chapter), exercises).items() if src}
    second = {ex: src for (_, ex), src in _answers(chapter, "second").items()}
    wrong = sorted(_answers(chapter, "wrong").items())
    kinds = [k for k in KINDS if k == "correct" or (k == "second" and second) or (k == "wrong" and wrong)]
    made = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        answers = dict(reference)
        if kind == "second":
            answers.update(second)
        elif kind == "wrong":
            (_, ex), src = wrong[(i // len(kinds)) % len(wrong)]
            answers[ex] = src
        nb = nbformat.from_dict(blank)
        for cell in nb.cells:
            if grade_id(cell) in answers:
                cell.source = answers[grade_id(cell)]
        made.append((f"bench{i:03d}-{kind}", kind, nb))
    return made


def _env() -> dict:
    return {**os.environ, "COURSE_FAST": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}


def run_course_grader(sub: Path, out: Path, workers: int, extra: list[str] | None = None) -> Run:
    """``python -m grader autograde`` on ``sub``, timed from the outside."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "grader", "autograde", str(sub), "--out", str(out), "--workers", str(workers),
           *(extra or [])]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return Run(wall, {}, error=f"autograde exited with {proc.returncode}: {proc.stderr.strip()[-1500:]}")
    scores: dict[str, float] = {}
    with (out / "grades.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            scores[row["student_id"]] = scores.get(row["student_id"], 0.0) + float(row["score"])
    phases = {}
    with (out / "profile.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            phases[row["phase"]] = (float(row["seconds"]), int(row["count"]))
    inside = phases.get("autograde (wall)", (0.0, 0))[0]
    phases["start-up"] = (max(0.0, wall - inside), 1)
    return Run(wall, scores, phases)


def run_nbgrader(chapter: str, made: list[tuple[str, str, nbformat.NotebookNode]], root: Path) -> Run:
    """Plain ``nbgrader autograde`` of the same notebooks: each runs whole in its own kernel."""
    from grader.release import generate

    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    db_url = f"sqlite:///{root / 'gradebook.db'}"
    generate([chapter], root, db_url)  # source/ (the instructor notebook) and release/, as `grader release` makes
    for student, _, nb in made:
        d = root / "submitted" / student / chapter
        d.mkdir(parents=True)
        nbformat.write(nb, d / f"{chapter}.ipynb")
    cmd = [sys.executable, "-m", "nbgrader", "autograde", chapter, "--force",
           f"--CourseDirectory.root={root}", f"--CourseDirectory.db_url={db_url}",
           "--CourseDirectory.course_id=efficient-training",
           f"--ExecutePreprocessor.timeout={NBGRADER_CELL_SECONDS}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, env=_env(), capture_output=True, text=True)
    wall = time.perf_counter() - start
    (root / "autograde.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return Run(wall, {}, error=f"nbgrader autograde exited with {proc.returncode} (log: {root / 'autograde.log'})")
    from nbgrader.api import Gradebook

    with Gradebook(db_url, course_id="efficient-training") as gb:
        scores = {student: float(gb.find_submission(chapter, student).score) for student, _, _ in made}
    return Run(wall, scores)


def bench_chapter(chapter: str, n: int, workers: int, out: Path, nbgrader: bool = True, log=print) -> dict:
    """Grade N submissions of ``chapter`` with both graders; one row of bench.csv."""
    made = submissions(chapter, n)
    sub = out / chapter / "submitted"
    shutil.rmtree(sub, ignore_errors=True)
    for student, _, nb in made:
        d = sub / student / chapter
        d.mkdir(parents=True)
        nbformat.write(nb, d / f"{chapter}.ipynb")
    log(f"{chapter}: the course's grader on {n} submission(s) ({workers} worker(s))...")
    course = run_course_grader(sub, out / chapter / "course-grader", workers)
    if course.error:
        raise RuntimeError(f"{chapter}: {course.error}")
    plain = None
    if nbgrader:
        log(f"{chapter}: plain nbgrader autograde on the same {n} submission(s)...")
        plain = run_nbgrader(chapter, made, out / chapter / "nbgrader")
        if plain.error:
            raise RuntimeError(f"{chapter}: {plain.error}")
    row = {"chapter": chapter, "submissions": n, "workers": workers,
           "course_s_per_submission": round(course.wall / n, 3),
           "nbgrader_s_per_submission": round(plain.wall / n, 3) if plain else "",
           "speedup": round(plain.wall / course.wall, 2) if plain else "",
           "same_totals": (sum(abs(course.scores.get(s, -1) - plain.scores.get(s, -2)) < 1e-9 for s, _, _ in made)
                           if plain else ""),
           "kinds": " ".join(kind for _, kind, _ in made)}
    row["_course"], row["_plain"], row["_made"] = course, plain, made
    return row


def profile_table(run: Run, n: int) -> list[str]:
    """Markdown table of where the course grader's time went (seconds in all, and per submission)."""
    lines = ["| phase | what | count | seconds | per submission |", "|---|---|---|---|---|"]
    for name, what in PROFILE_ROWS:
        seconds, count = run.phases.get(name, (0.0, 0))
        lines.append(f"| {name} | {what} | {count} | {seconds:.2f} | {seconds / n:.3f} |")
    lines.append(f"| **command** | wall time of `python -m grader autograde` | 1 | {run.wall:.2f} | {run.wall / n:.3f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.bench_grade", description=__doc__.split("\n\n")[0])
    p.add_argument("chapters", nargs="*", help=f"chapter ids (default: {' '.join(DEFAULT_CHAPTERS)})")
    p.add_argument("-n", "--submissions", type=int, default=6, help="submissions per chapter (default 6)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="the course grader's --workers (default: the machine's cores)")
    p.add_argument("--no-nbgrader", action="store_true", help="time the course's grader alone")
    p.add_argument("--out", type=Path, default=OUT, help=f"where everything is written (default {OUT})")
    args = p.parse_args(argv)
    if args.submissions < 1:
        p.error(f"-n must be at least 1, got {args.submissions}")
    if args.workers < 1:
        p.error(f"--workers must be at least 1, got {args.workers}")
    try:
        chapter_ids = [check_chapter_id(c) for c in (args.chapters or DEFAULT_CHAPTERS)]
        args.out.mkdir(parents=True, exist_ok=True)
        rows = [bench_chapter(ch, args.submissions, args.workers, args.out, not args.no_nbgrader)
                for ch in chapter_ids]
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report = ["| chapter | N | course grader s/submission | nbgrader s/submission | speed-up | same totals |",
              "|---|---|---|---|---|---|"]
    for r in rows:
        report.append(f"| {r['chapter']} | {r['submissions']} | {r['course_s_per_submission']:.2f} | "
                      + (f"{r['nbgrader_s_per_submission']:.2f} | {r['speedup']:.1f}x | {r['same_totals']}/{r['submissions']} |"
                         if r["_plain"] else "- | - | - |"))
    for r in rows:
        report += ["", f"Where the course grader's time went, {r['chapter']} ({r['submissions']} submissions, "
                       f"{r['workers']} worker(s); per-cell phases are summed over the workers):", ""]
        report += profile_table(r["_course"], r["submissions"])
    text = "\n".join(report)
    print(text)
    (args.out / "profile.md").write_text(text + "\n")
    with (args.out / "bench.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[k for k in rows[0] if not k.startswith("_")])
        w.writeheader()
        w.writerows({k: v for k, v in r.items() if not k.startswith("_")} for r in rows)
    print(f"wrote {args.out / 'bench.csv'} and {args.out / 'profile.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
