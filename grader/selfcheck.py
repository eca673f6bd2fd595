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
        results = autograde(subs, out, workers=workers, progress=False, log=log)
    ok = True
    log(f"{'chapter':<24}{'reference':>12}{'blank':>10}  verdict")
    by_key = {(r.student, r.chapter): r for r in results}
    for ch in chapter_ids:
        ref, blank = by_key[("reference", ch)], by_key[("blank", ch)]
        maximum, ref_score, blank_score = ref.max_score, ref.score, blank.score
        good = ref_score == maximum and blank_score == 0 and maximum > 0
        ok &= good
        log(f"{ch:<24}{ref_score:>6g}/{maximum:<5g}{blank_score:>6g}/{maximum:<3g}  {'ok' if good else 'FAILED'}")
        for who, r in (("reference", ref), ("blank", blank)):
            for gid, o in r.outcomes.items():
                if o.passed == (who == "blank"):
                    log(f"    {who} {gid}: {'passed (should fail)' if o.passed else o.reason}")
    return ok
