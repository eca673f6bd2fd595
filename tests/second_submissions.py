"""Second correct answers, one per exercise, written from the released notebook alone.

Each chapter keeps its answers in ``second_submissions_<chapter>.py`` beside this file as
``SECOND = {(chapter, exercise): source text}``: code a student could write from the released
notebook's text (docstrings, prose, visible tests) without the reference, in a different style from
it. Every chapter's released notebook with all its exercise cells replaced by these answers must
score full marks through ``python -m grader autograde`` (``tests/test_autograde.py``).

To grade one chapter's answers by hand::

    python tests/second_submissions.py ch03_accumulation
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

SECOND: dict[tuple[str, str], str] = {}


def _collect() -> None:
    for path in sorted(Path(__file__).parent.glob("second_submissions_ch*.py")):
        SECOND.update(importlib.import_module(path.stem).SECOND)


def notebook(chapter: str):
    """The chapter's blank release with every exercise that has a second answer filled in."""
    from submissions import blank, with_exercise

    nb = blank(chapter)
    for (ch, exercise), source in SECOND.items():
        if ch == chapter:
            nb = with_exercise(chapter, exercise, source, base=nb)
    return nb


def _grade(chapters: list[str]) -> int:
    import csv
    import shutil
    import subprocess
    import tempfile

    from conftest import ROOT, AUTOGRADE
    import profiling
    from submissions import write

    with tempfile.TemporaryDirectory() as tmp:
        sub, out = Path(tmp) / "sub", Path(tmp) / "out"
        for ch in chapters:
            write(sub, "second", ch, notebook(ch))
        proc = profiling.graded_batch(subprocess.run, [*AUTOGRADE, str(sub), "--out", str(out), "--workers", "2"],
                                      out, cwd=ROOT, capture_output=True, text=True)
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        if not (out / "grades.csv").exists():
            return 2
        with (out / "grades.csv").open(newline="") as f:
            rows = list(csv.DictReader(f))
        lost = [r for r in rows if float(r["score"]) < float(r["max_score"])]
        for r in rows:
            print(f"{r['chapter']:<24} {r['problem']:<44} {r['score']}/{r['max_score']}")
        for ch in chapters:
            feedback = sorted((out / "feedback").rglob(f"*{ch}*.html"))
            if feedback and any(r["chapter"] == ch for r in lost):
                print(f"feedback: {feedback[0]}")
                keep = Path(tempfile.gettempdir()) / f"second-feedback-{ch}.html"
                shutil.copy(feedback[0], keep)
                print(f"kept a copy at {keep}")
        return 1 if lost else 0


if __name__ == "__main__":
    sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]
_collect()

if __name__ == "__main__":
    sys.exit(_grade(sys.argv[1:]))
