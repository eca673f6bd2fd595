"""Every chapter's reference solution and blank release, autograded once per test run.

Several tests need the sandboxed grade of the references (the autograde contract, selfcheck's
verdict, each chapter's sandbox test, the feedback page in the browser): grading them costs
minutes on 2 cores, so the first test that asks runs one ``python -m grader autograde`` batch
(students ``reference``, ``blank`` and ``second``, the second correct answers of
``second_submissions`` in notebooks carrying 8 MiB of outputs, every chapter) and the others, in any pytest-xdist
worker, wait for it and read its output. The batch lives in ``build/test-runs/<run id>/``; the
run id is pytest-xdist's, shared by every worker of one run.

The batch is graded with every value a probe measures inside the student's process (saved bytes, FLOPs;
``grader.sandbox.trusted.in_process`` ``explains``) replaced by a claim that fails the cell of any check consulting it:
so the references' and second answers' full marks show that no point rests on such a measurement.
"""
from __future__ import annotations

import csv
import fcntl
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from conftest import ROOT, AUTOGRADE
import profiling
from grader.notebooks import chapters
from grader.sandbox.handles import POISON_ENV
import second_submissions
from submissions import blank, reference, with_outputs, write

RUNS = ROOT / "build" / "test-runs"
STUDENTS = ("reference", "blank", "second")
OLD_S = 24 * 3600  # batches of earlier runs are removed after a day


def _run_dir() -> Path:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"solo-{os.getpid()}"
    return RUNS / run


def _clean_old(keep: Path) -> None:
    for d in RUNS.glob("*"):
        if d != keep and d.is_dir() and time.time() - d.stat().st_mtime > OLD_S:
            shutil.rmtree(d, ignore_errors=True)


# The chapters this run's selected tests name (``make check CHAPTER=...``, ``-k ch04``); None: every chapter,
# as soon as one selected test names none. Set by ``conftest.pytest_collection_finish`` in each process.
SELECTED: set[str] | None = None


def graded_chapters() -> list[str]:
    return [ch for ch in chapters() if SELECTED is None or ch in SELECTED]


def select(nodeids: list[str]) -> None:
    """Grade only the chapters that ``nodeids`` name when every one of them names one (``ch04`` or its full id)."""
    global SELECTED
    short = {ch.split("_")[0]: ch for ch in chapters()}
    named: set[str] = set()
    for nodeid in nodeids:
        found = {short[m] for m in re.findall(r"(?<![a-z0-9])(ch\d\d)", nodeid) if m in short}
        if not found:
            SELECTED = None
            return
        named |= found
    SELECTED = named or None


def batch() -> Path:
    """OUT of the run's reference/blank batch (grades.csv, feedback/); graded on first use."""
    root = _run_dir()
    root.mkdir(parents=True, exist_ok=True)
    out = root / "out"
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other workers wait here while one grades
        if not (root / "done").exists():
            _clean_old(root)
            sub = root / "submitted"
            shutil.rmtree(sub, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
            for ch in graded_chapters():
                write(sub, "reference", ch, reference(ch))
                write(sub, "blank", ch, blank(ch))
                # Handed in as run, with 8 MiB of plots: outputs never count against the exercises.
                write(sub, "second", ch, with_outputs(second_submissions.notebook(ch)))
            # What probes measure inside the student's process is replaced by claims that fail any check that
            # consults them (grader.sandbox.handles.POISON_ENV): full marks must rest on outside readings and values.
            env = {**os.environ, POISON_ENV: "1"}
            proc = profiling.graded_batch(subprocess.run, [*AUTOGRADE, str(sub), "--out", str(out), "--workers", "2",
                                                            "--timeout", "180"], out, cwd=ROOT,
                                          capture_output=True, text=True, timeout=3000, env=env)
            (root / "log.txt").write_text(proc.stdout + proc.stderr)
            if proc.returncode != 0:
                raise RuntimeError(f"autograding the references failed:\n{proc.stderr[-3000:]}")
            (root / "done").touch()
    return out


def rows(student: str | None = None, chapter: str | None = None) -> list[dict]:
    with (batch() / "grades.csv").open(newline="") as f:
        found = list(csv.DictReader(f))
    return [r for r in found if (student is None or r["student_id"] == student)
            and (chapter is None or r["chapter"] == chapter)]


def feedback(student: str, chapter: str) -> Path:
    return batch() / "feedback" / student / f"{chapter}.html"
