"""``python -m grader report OUT``: where the class stands and struggles, from what ``autograde`` wrote to OUT.

It reads:
  * the gradebook (``--db``, default ``sqlite:///OUT/gradebook.db``): chapters, graded cells and their points,
    students, every submission's scores, its grader notes and its unisolated flag;
  * ``OUT/feedback/<student>/<chapter>.html``: why each failed cell failed;
  * ``OUT/timing.csv``: the seconds each submission of the last autograde run into OUT took;
  * ``OUT/not_graded.csv``: what that run found under SUBMISSIONS and did not grade;
  * with ``roster``, a file of the class's student ids (one per line, or a CSV whose first column holds them
    under a ``student_id`` header): students who handed in nothing are then listed too.

It writes to ``OUT/report/`` (or ``dest``): ``index.html`` (one self-contained page: plots embedded as PNG),
``chapters.csv``, ``problems.csv``, ``failures.csv``, ``issues.csv`` (missing, broken, incomplete and flagged
submissions) and ``lms.csv``: one row per student, one column per chapter total and the total, after a
``Points Possible`` row with each column's maximum (Canvas's gradebook import reads it; other LMSs skip or map
it); a chapter a student handed nothing in for is left empty.
"""
from __future__ import annotations

import base64
import csv
import html
import io
import os
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from grader import gradebook
from grader.feedback import UNISOLATED

MISSING_NOTE = "missing notebook"  # autograde's note for a chapter folder without its notebook
CELLS_MISSING = "exercise cell(s) not found"
STOOD_IN = "the tests of later exercises ran with"  # informative: not a problem of the submission
INTERNAL = "internal grading error"
TOP_REASONS = 3  # failure reasons shown per problem in the page (failures.csv has them all)
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


@dataclass
class Issue:
    student: str
    chapter: str
    kind: str  # missing, broken, incomplete, grader error, flagged
    reason: str


@dataclass
class Report:
    contents: gradebook.Contents
    students: list[str]
    issues: list[Issue] = field(default_factory=list)
    failures: dict[tuple[str, str], Counter] = field(default_factory=dict)  # (chapter, problem) -> key -> count
    examples: dict[tuple[str, str, str], str] = field(default_factory=dict)  # (chapter, problem, key) -> a reason
    timing: list[tuple[str, str, float]] = field(default_factory=list)
    not_graded: list[tuple[str, str]] = field(default_factory=list)


def read_reasons(page: Path) -> dict[str, str]:
    """grade_id -> why that cell failed, from a feedback page (``grader.feedback.render``'s format)."""
    text = page.read_text(encoding="utf-8", errors="replace")
    found = re.findall(r"<h3><code>([^<]*)</code></h3><div class='reason'>(.*?)</div>", text, re.S)
    return {html.unescape(gid): html.unescape(reason) for gid, reason in found}


def group_key(reason: str) -> str:
    """A failure reason with its numbers (sizes, errors, seeds drawn at grading time) left out, to group by."""
    return " ".join(NUMBER.sub("#", reason).split())[:400]


def _notes(sub: gradebook.Submission) -> list[str]:
    parts = []
    for comment in sub.comments:  # "<UNISOLATED>; <note>": the flag's own text holds a "; " too
        parts += [p for p in comment.replace(UNISOLATED, "").split("; ") if p]
    return list(dict.fromkeys(parts))


def _issue(sub: gradebook.Submission) -> Issue | None:
    notes = [n for n in _notes(sub) if not n.startswith(STOOD_IN)]
    if not notes:
        return None
    note = "; ".join(notes)
    if note == MISSING_NOTE:
        return Issue(sub.student, sub.chapter, "missing", "a chapter folder without its notebook")
    if note.startswith(INTERNAL):
        return Issue(sub.student, sub.chapter, "grader error", note)
    if note.startswith(CELLS_MISSING):
        return Issue(sub.student, sub.chapter, "incomplete", note)
    return Issue(sub.student, sub.chapter, "broken", note)


def read_roster(path: Path) -> list[str]:
    lines = [ln.strip() for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
    ids = [next(csv.reader([ln]))[0].strip() for ln in lines]
    if ids and ids[0] == "student_id":
        ids = ids[1:]
    if not ids:
        raise ValueError(f"roster {path} holds no student id")
    return ids


def gather(out: Path, db_url: str | None = None, roster: Path | None = None, progress: bool = True) -> Report:
    """Everything the report shows, read from ``out`` and its gradebook (see the module's docstring)."""
    out = Path(out)
    db_url = db_url or f"sqlite:///{(out / 'gradebook.db').resolve()}"
    if db_url.startswith("sqlite:///") and not Path(db_url[len("sqlite:///"):]).exists():
        raise FileNotFoundError(f"no gradebook at {db_url[len('sqlite:///'):]}: run `python -m grader autograde "
                                f"SUBMISSIONS --out {out}` first, or name the gradebook with --db")
    contents = gradebook.read(db_url)
    for ch, cells in contents.chapters.items():  # the release's cell order where the chapter is released
        order = _release_order(ch)
        contents.chapters[ch] = dict(sorted(cells.items(), key=lambda kv: order.get(kv[0], len(order))))
    students = sorted(set(contents.students) | set(read_roster(roster) if roster else []))
    rep = Report(contents, students)
    submitted = {(s.student, s.chapter) for s in contents.submissions}
    for ch in contents.chapters:
        rep.issues += [Issue(st, ch, "missing", "nothing handed in") for st in students if (st, ch) not in submitted]
    subs = contents.submissions
    if progress:
        from tqdm.auto import tqdm

        subs = tqdm(subs, desc="report", unit="submission")
    for sub in subs:
        issue = _issue(sub)
        if issue is not None:
            rep.issues.append(issue)
        if sub.flagged:
            rep.issues.append(Issue(sub.student, sub.chapter, "flagged", UNISOLATED))
        if issue is not None and issue.kind != "incomplete":
            continue  # its every cell failed for that one reason, listed with the issues
        page = out / "feedback" / sub.student / f"{sub.chapter}.html"
        reasons = read_reasons(page) if page.exists() else {}
        for problem, (score, max_score) in sub.scores.items():
            if score < max_score:
                reason = reasons.get(problem, "(no feedback page: grade it again to see why)")
                key = group_key(reason)
                rep.failures.setdefault((sub.chapter, problem), Counter())[key] += 1
                rep.examples.setdefault((sub.chapter, problem, key), reason)
    rep.issues.sort(key=lambda i: (i.student, i.chapter, i.kind))
    rep.timing = _read_csv(out / "timing.csv", lambda r: (r["student_id"], r["chapter"], float(r["seconds"])))
    rep.not_graded = _read_csv(out / "not_graded.csv", lambda r: (r["path"], r["reason"]))
    return rep


def _release_order(chapter: str) -> dict[str, int]:
    from grader.autograde import release_layout

    try:
        return {gid: i for i, (gid, _) in enumerate(release_layout(chapter).tests)}
    except (OSError, ValueError):  # a chapter no longer in course/: its cells by name
        return {}


def _read_csv(path: Path, row) -> list:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return [row(r) for r in csv.DictReader(f)]


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}".rstrip("0").rstrip(".")


def write(rep: Report, dest: Path, progress: bool = True) -> list[Path]:
    """The report's files in ``dest``; returns them. ``progress``: a bar over the chapters' plots."""
    dest.mkdir(parents=True, exist_ok=True)
    c = rep.contents
    missing = {(i.student, i.chapter) for i in rep.issues if i.kind == "missing"}
    handed_in = defaultdict(list)  # what was handed in and graded, broken notebooks (scored 0) included
    for s in c.submissions:
        if (s.student, s.chapter) not in missing:
            handed_in[s.chapter].append(s)
    kinds = defaultdict(Counter)
    for i in rep.issues:
        kinds[i.chapter][i.kind] += 1
    seconds = defaultdict(list)
    for _, ch, sec in rep.timing:
        seconds[ch].append(sec)
    chapter_rows, problem_rows = [], []
    for ch, cells in c.chapters.items():
        handed = handed_in[ch]
        totals = [s.score for s in handed]
        sec = seconds.get(ch, [])
        chapter_rows.append({
            "chapter": ch, "max_score": _fmt(sum(cells.values())), "handed_in": len(handed),
            "missing": kinds[ch]["missing"], "broken": kinds[ch]["broken"] + kinds[ch]["grader error"],
            "incomplete": kinds[ch]["incomplete"], "flagged": kinds[ch]["flagged"],
            "full_marks": sum(t == sum(cells.values()) for t in totals),
            "mean": _fmt(statistics.mean(totals)) if totals else "", "median": _fmt(statistics.median(totals)) if totals else "",
            "graded_last_run": len(sec), "mean_seconds": f"{statistics.mean(sec):.2f}" if sec else "",
            "max_seconds": f"{max(sec):.2f}" if sec else ""})
        for problem, max_score in cells.items():
            scores = [s.scores[problem][0] for s in handed if problem in s.scores]
            problem_rows.append({
                "chapter": ch, "problem": problem, "max_score": _fmt(max_score), "graded": len(scores),
                "full_marks": sum(x >= max_score for x in scores),
                "pass_rate": f"{sum(x >= max_score for x in scores) / len(scores):.3f}" if scores else "",
                "mean": _fmt(statistics.mean(scores)) if scores else ""})
    failure_rows = [{"chapter": ch, "problem": p, "count": n, "reason": rep.examples[ch, p, key], "pattern": key}
                    for (ch, p), counter in sorted(rep.failures.items()) for key, n in counter.most_common()]
    files = [
        _csv(dest / "chapters.csv", chapter_rows),
        _csv(dest / "problems.csv", problem_rows),
        _csv(dest / "failures.csv", failure_rows, ["chapter", "problem", "count", "reason", "pattern"]),
        _csv(dest / "issues.csv", [{"student_id": i.student, "chapter": i.chapter, "kind": i.kind,
                                    "reason": i.reason} for i in rep.issues],
             ["student_id", "chapter", "kind", "reason"]),
        _lms(dest / "lms.csv", rep),
    ]
    page = _html(rep, chapter_rows, problem_rows, handed_in, progress)
    tmp = dest / "index.html.tmp"
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, dest / "index.html")
    return [dest / "index.html", *files]


def _csv(path: Path, rows: list[dict], columns: list[str] | None = None) -> Path:
    columns = columns or (list(rows[0]) if rows else [])
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)
    return path


def _lms(path: Path, rep: Report) -> Path:
    """One row per student, a column per chapter total (empty: nothing handed in) and the total."""
    chapters = list(rep.contents.chapters)
    totals = {(s.student, s.chapter): s.score for s in rep.contents.submissions}
    missing = {(i.student, i.chapter) for i in rep.issues if i.kind == "missing"}  # left empty
    maxima = [sum(rep.contents.chapters[ch].values()) for ch in chapters]
    rows = [["student_id", *chapters, "total"], ["Points Possible", *map(_fmt, maxima), _fmt(sum(maxima))]]
    for st in rep.students:
        got = [None if (st, ch) in missing else totals.get((st, ch)) for ch in chapters]
        rows.append([st, *("" if g is None else _fmt(g) for g in got), _fmt(sum(g or 0 for g in got))])
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    os.replace(tmp, path)
    return path


def _figure(chapter: str, cells: dict[str, float], subs: list, problems: list[dict]) -> str:
    """Totals' histogram and each problem's share of full marks, as an embedded PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, max(2.6, 0.32 * len(cells) + 1)),
                                      gridspec_kw={"width_ratios": [1, 1.3]})
    top = sum(cells.values())
    left.hist([s.score for s in subs], bins=[b - 0.5 for b in range(int(top) + 2)], color="#4c72b0", rwidth=0.85)
    left.set(title=f"{chapter}: total score", xlabel=f"points (of {_fmt(top)})", ylabel="submissions")
    left.yaxis.get_major_locator().set_params(integer=True)
    rates = [float(p["pass_rate"] or 0) for p in problems]
    right.barh([p["problem"] for p in problems], rates, color="#55a868")
    right.invert_yaxis()
    right.set(xlim=(0, 1), title="share with full marks, per graded cell")
    right.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


_CSS = """body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;margin:.5rem 0 1.5rem}th,td{border:1px solid #ccc;padding:.3rem .5rem;text-align:left;
vertical-align:top;font-size:.85rem}td.n{text-align:right}.reason{white-space:pre-wrap;font-size:.9rem}img{max-width:100%}"""


def _table(rows: list[dict], columns: list[str]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(
        f"<td class='{'n' if isinstance(r[c], (int, float)) else 'reason'}'>{e(str(r[c]))}</td>" for c in columns)
        + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _html(rep: Report, chapter_rows, problem_rows, handed_in, progress: bool = False) -> str:
    e = html.escape
    c = rep.contents
    n_issues = Counter(i.kind for i in rep.issues)
    parts = [f"<h1>Class report</h1><p>{len(rep.students)} students, {len(c.chapters)} chapters, "
             f"{len(c.submissions)} graded submissions; {n_issues['missing']} missing, "
             f"{n_issues['broken'] + n_issues['grader error']} broken, {n_issues['incomplete']} incomplete, "
             f"{n_issues['flagged']} flagged (graded unisolated). The numbers are in the CSV files beside this "
             "page: <a href='chapters.csv'>chapters.csv</a>, <a href='problems.csv'>problems.csv</a>, "
             "<a href='failures.csv'>failures.csv</a>, <a href='issues.csv'>issues.csv</a>, and "
             "<a href='lms.csv'>lms.csv</a> for the LMS gradebook.</p>",
             "<h2>Chapters</h2>", _table(chapter_rows, ["chapter", "max_score", "handed_in", "missing", "broken",
                                                         "incomplete", "flagged", "full_marks", "mean", "median",
                                                         "mean_seconds"])]
    if rep.timing:
        slow = sorted(rep.timing, key=lambda t: -t[2])[:5]
        parts.append(f"<h2>Grading time</h2><p>The last autograde run into this folder graded {len(rep.timing)} "
                     f"submission(s) in {sum(t[2] for t in rep.timing):.1f} s of grading (per chapter in the table "
                     "above). The slowest:</p>" + _table([{"student": s, "chapter": ch, "seconds": round(x, 2)}
                                                           for s, ch, x in slow], ["student", "chapter", "seconds"]))
    chapters = c.chapters.items()
    if progress:
        from tqdm.auto import tqdm

        chapters = tqdm(chapters, desc="plots", unit="chapter")
    for ch, cells in chapters:
        problems = [p for p in problem_rows if p["chapter"] == ch]
        handed = handed_in[ch]
        parts.append(f"<h2 id='{e(ch)}'>{e(ch)}</h2>")
        if handed:
            parts.append(f"<img alt='score distribution of {e(ch)}' src='data:image/png;base64,"
                         f"{_figure(ch, cells, handed, problems)}'>")
        rows = []
        for p in problems:
            counter = rep.failures.get((ch, p["problem"]), Counter())
            top = [f"{n}× {rep.examples[ch, p['problem'], key]}" for key, n in counter.most_common(TOP_REASONS)]
            rows.append({**p, "most common failure reasons": "\n".join(top)})
        parts.append(_table(rows, ["problem", "max_score", "graded", "full_marks", "pass_rate", "mean",
                                   "most common failure reasons"]))
    parts.append("<h2>Missing, broken, incomplete and flagged submissions</h2>")
    parts.append(_table([{"student": i.student, "chapter": i.chapter, "kind": i.kind, "reason": i.reason}
                         for i in rep.issues], ["student", "chapter", "kind", "reason"])
                 if rep.issues else "<p>None.</p>")
    if rep.not_graded:
        parts.append("<h2>Not graded by the last run</h2>" + _table(
            [{"entry": p, "reason": r} for p, r in rep.not_graded], ["entry", "reason"]))
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Class report</title>"
            f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>\n")


def report(out: Path, db_url: str | None = None, dest: Path | None = None, roster: Path | None = None,
           progress: bool = True) -> list[Path]:
    """Read ``out`` (and its gradebook) and write the report to ``dest`` (default ``out/report``)."""
    rep = gather(out, db_url, roster, progress=progress)
    return write(rep, Path(dest) if dest else Path(out) / "report", progress=progress)
