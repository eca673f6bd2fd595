"""``python -m grader selfcheck [CHAPTER ...]``: references score full marks, blank releases 0.

Both go through the real autograde path (sandboxed workers, gradebook, feedback), so a
pass here means the hidden tests accept the reference and reject the untouched stubs.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import nbformat

from grader.autograde import autograde
from grader.notebooks import COURSE, chapters, check_chapter_id, read_source


def selfcheck(chapter_ids: list[str] | None = None, workers: int = 2, log=print) -> bool:
    chapter_ids = [check_chapter_id(c) for c in chapter_ids] if chapter_ids else chapters()
    with tempfile.TemporaryDirectory(prefix="selfcheck-") as tmp:
        subs, out = Path(tmp) / "submitted", Path(tmp) / "out"
        for ch in chapter_ids:
            for student, nb in (("reference", read_source(ch)),
                                ("blank", nbformat.read(COURSE / f"{ch}.ipynb", as_version=4))):
                d = subs / student / ch
                d.mkdir(parents=True)
                nbformat.write(nb, d / f"{ch}.ipynb")
        # The course's own references and stubs: nothing to isolate from, so any sandbox mode will do.
        results = autograde(subs, out, workers=workers, progress=False, log=log, unisolated=True)
    reasons = {(r.student, r.chapter, gid): o.reason for r in results for gid, o in r.outcomes.items()}
    return verdict([row for r in results for row in r.rows()], chapter_ids, reasons, log)


def verdict(rows: list[dict], chapter_ids: list[str], reasons: dict | None = None, log=print) -> bool:
    """From grades.csv rows of students ``reference`` and ``blank``: every chapter's reference
    scores full marks and its blank release 0. Prints one line per chapter and each cell that
    disagrees (with its reason when ``reasons`` maps (student, chapter, cell) to one)."""
    reasons = reasons or {}
    ok = True
    log(f"{'chapter':<24}{'reference':>12}{'blank':>10}  verdict")
    for ch in chapter_ids:
        cells = {who: [r for r in rows if r["student_id"] == who and r["chapter"] == ch] for who in ("reference", "blank")}
        maximum = sum(float(r["max_score"]) for r in cells["reference"])
        ref_score = sum(float(r["score"]) for r in cells["reference"])
        blank_score = sum(float(r["score"]) for r in cells["blank"])
        good = bool(cells["blank"]) and ref_score == maximum > 0 and blank_score == 0
        ok &= good
        log(f"{ch:<24}{ref_score:>6g}/{maximum:<5g}{blank_score:>6g}/{maximum:<3g}  {'ok' if good else 'FAILED'}")
        for who, found in cells.items():
            for r in found:
                passed = float(r["score"]) == float(r["max_score"])
                if passed == (who == "blank"):
                    why = "passed (should fail)" if passed else reasons.get((who, ch, r["problem"]), "lost points")
                    log(f"    {who} {r['problem']}: {why}")
    return ok
