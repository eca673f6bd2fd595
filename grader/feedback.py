"""Per-submission feedback: what scored, what did not and why, and the graded code.

Feedback shows the student's own exercise code and the judge's messages. It never shows
hidden-test source, reference code, or anything the student's process printed.
"""
from __future__ import annotations

import html
import os
from pathlib import Path

UNISOLATED = ("graded without the isolated sandbox (--unisolated): a submission could have changed its "
              "own grade or another's; regrade on an isolated machine before these grades count")

_CSS = """
body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;width:100%}th,td{border:1px solid #ccc;padding:.4rem .6rem;text-align:left}
.pass{color:#176f2c;font-weight:600}.fail{color:#a3141b;font-weight:600}
pre{background:#f6f8fa;padding:.8rem;overflow-x:auto;border-radius:4px}
.reason{white-space:pre-wrap;background:#fff5f5;border-left:4px solid #a3141b;padding:.5rem .8rem}
.note{color:#555;font-size:.9rem}
"""


def render(result) -> str:
    e = html.escape
    rows, details = [], []
    for gid, points in result.layout.tests:
        o = result.outcomes[gid]
        status = '<span class="pass">passed</span>' if o.passed else '<span class="fail">failed</span>'
        rows.append(f"<tr><td><code>{e(gid)}</code></td><td>{status}</td>"
                    f"<td>{result.points(gid, points):g} / {points:g}</td></tr>")
        if not o.passed:
            details.append(f"<h3><code>{e(gid)}</code></h3><div class='reason'>{e(o.reason)}</div>")
    code = [f"<h3><code>{e(ex)}</code></h3><pre>{e(src) if src is not None else '(cell not found)'}</pre>"
            for ex, src in result.sources.items()]
    note = f"<p class='reason'>{e(result.note)}</p>" if result.note else ""
    if result.unisolated:
        note = f"<p class='reason'><b>Provisional:</b> {e(UNISOLATED)}.</p>" + note
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(result.chapter)}: feedback for {e(result.student)}</title>
<style>{_CSS}</style></head><body>
<h1>{e(result.chapter)}</h1>
<p>Student <b>{e(result.student)}</b>: <b>{result.score:g} / {result.max_score:g}</b> points.</p>{note}
<table><tr><th>Test cell</th><th>Result</th><th>Score</th></tr>{''.join(rows)}</table>
{'<h2>Why points were lost</h2>' + ''.join(details) if details else ''}
<h2>Your graded code</h2>{''.join(code) or '<p>(no exercise code found)</p>'}
<p class="note">Only the exercise cells are graded. They run in an isolated process with the chapter's
provided setup cells; the hidden tests compare what your code computes with reference results.</p>
</body></html>
"""


def write_feedback(path: Path, result) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(render(result), encoding="utf-8", errors="replace")
    os.replace(tmp, path)
