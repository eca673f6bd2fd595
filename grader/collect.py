"""``python -m grader collect SRC OUT``: a folder of downloaded notebooks into nbgrader's ``submitted/`` layout.

Every file under SRC is either copied to ``OUT/<student_id>/<chapter_id>/<chapter_id>.ipynb`` (what
``python -m grader autograde OUT`` reads) or listed with the reason it was not; nothing in SRC is moved or
changed. Names understood (``<chapter>`` is a chapter id, ``ch01_lora``, or its short form, ``ch01``):

* ``<student>/<chapter>.ipynb``, ``<student>/<chapter>/<chapter>.ipynb`` (a folder per student, any depth below it);
* ``<student>_<chapter>.ipynb`` or ``<student>-<chapter>.ipynb`` (one flat folder);
* Canvas's "Download submissions": ``<student>[_LATE]_<user number>_<file number>_<chapter>.ipynb``;
* a browser's or an LMS's copy suffix after the chapter: ``ch01_lora (1).ipynb``, ``ch01_lora-2.ipynb``.

Student ids are those autograde accepts (letters, digits and ``. _ @ + -``). Two files for the same student and
chapter: the newer (modification time) is collected and the other listed as an older copy; two of the same
time are both refused, to be settled by hand. A file already collected in OUT with other content is kept
unless ``replace`` is given. A ``.ipynb`` that is not valid notebook JSON is still collected (autograde
gives it zeros with that reason, so the student sees why) and flagged. Every entry, collected or not, is
listed in ``OUT.collected.csv``, beside OUT.
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from grader.intake import STUDENT_ID_RE, _printable
from grader.notebooks import chapters

COPY_SUFFIX = re.compile(r"(?: \(\d+\)|-\d+)$")  # "ch01_lora (1)", "ch01_lora-2"
CANVAS = re.compile(r"^(?P<student>.+?)(?:_LATE)?_\d+_\d+$")
SHORT_ID = re.compile(r"ch\d\d(?:_[a-z0-9]+)*")


def log_path(out: Path) -> Path:
    """Where the list of what was collected goes: beside OUT, so that autograde finds only student folders in it."""
    return out.parent / f"{out.name}.collected.csv"


@dataclass
class Entry:
    path: str  # relative to SRC
    student: str = ""
    chapter: str = ""
    status: str = ""  # collected, unchanged, replaced, skipped
    reason: str = ""
    mtime: float = 0.0
    source: Path | None = None


def chapter_of(stem: str, known: list[str]) -> tuple[str, str] | str:
    """``(chapter, what comes before it)`` for a file name's stem, or the reason it names no known chapter."""
    stem = COPY_SUFFIX.sub("", stem)
    names = {ch: ch for ch in known} | {ch.split("_")[0]: ch for ch in known}
    for name in sorted(names, key=len, reverse=True):
        if stem == name or stem.endswith(("_" + name, "-" + name)):
            return names[name], stem[:-len(name)].rstrip("_-")
    found = SHORT_ID.findall(stem)
    if found:
        return f"unknown chapter {found[-1]!r} (known: {', '.join(known)})"
    return "no chapter id in the name (expected <student>_<chapter>.ipynb, e.g. alice_ch01_lora.ipynb)"


def _student(prefix: str) -> str:
    canvas = CANVAS.match(prefix)
    return canvas.group("student") if canvas else prefix


def scan(src: Path, known: list[str]) -> list[Entry]:
    """Every file and link under ``src``, each with its student and chapter or the reason it has none."""
    if not src.is_dir():
        raise FileNotFoundError(f"folder of downloaded notebooks {src} does not exist")
    entries = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        here = Path(dirpath)
        for name in sorted(filenames) + [d for d in dirnames if (here / d).is_symlink()]:
            path = here / name
            rel = path.relative_to(src)
            e = Entry(_printable(rel.as_posix()), source=path)
            entries.append(e)
            if path.is_symlink():
                e.status, e.reason = "skipped", "a symbolic link: copy the file itself into SRC"
                continue
            if not path.is_file():
                e.status, e.reason = "skipped", "not a regular file"
                continue
            if path.suffix != ".ipynb":
                e.status, e.reason = "skipped", "not a notebook (.ipynb)"
                continue
            found = chapter_of(path.stem, known)
            if isinstance(found, str):
                e.status, e.reason = "skipped", found
                continue
            e.chapter, prefix = found
            # A folder per student: its name is the student id; in one flat folder the name carries it.
            e.student = rel.parts[0] if len(rel.parts) > 1 else _student(prefix)
            if not e.student:
                e.status, e.reason = "skipped", "no student id (expected <student>_<chapter>.ipynb or <student>/<chapter>.ipynb)"
            elif not STUDENT_ID_RE.fullmatch(e.student):
                e.status, e.reason = "skipped", (f"{_printable(e.student)!r} is not a valid student id (letters, "
                                                 "digits and . _ @ + -, starting with a letter or digit)")
            else:
                e.mtime = path.stat().st_mtime
    return entries


def _pick(entries: list[Entry]) -> None:
    """One file per student and chapter: the newest; the others are listed as older copies, a tie as undecided."""
    groups: dict[tuple[str, str], list[Entry]] = {}
    for e in entries:
        if not e.status:
            groups.setdefault((e.student, e.chapter), []).append(e)
    for group in groups.values():
        group.sort(key=lambda e: e.mtime, reverse=True)
        newest, rest = group[0], group[1:]
        if rest and rest[0].mtime == newest.mtime:
            names = ", ".join(e.path for e in group if e.mtime == newest.mtime)
            for e in group:
                e.status = "skipped"
                e.reason = (f"{len(group)} files for {e.student}'s {e.chapter} ({names}) with the same time: keep the "
                            "one to grade in SRC (move the others out) and collect again")
            continue
        for e in rest:
            e.status, e.reason = "skipped", f"an older copy of {newest.path}, which is collected"


def _valid_notebook(data: bytes) -> bool:
    try:
        nb = json.loads(data)
    except ValueError:
        return False
    return isinstance(nb, dict) and isinstance(nb.get("cells"), list)


def collect(src: Path, out: Path, replace: bool = False) -> list[Entry]:
    """Copy every submission found under ``src`` into ``out``'s nbgrader layout; see the module's docstring."""
    src, out = Path(src), Path(out)
    known = chapters()
    entries = scan(src, known)
    _pick(entries)
    if out.resolve().is_relative_to(src.resolve()):
        raise ValueError(f"OUT ({out}) must not lie inside SRC ({src})")
    if out.exists() and not out.is_dir():
        raise ValueError(f"OUT ({out}) exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    for e in entries:
        if e.status:
            continue
        dest = out / e.student / e.chapter / f"{e.chapter}.ipynb"
        data = e.source.read_bytes()
        if dest.exists() and not dest.is_symlink() and dest.read_bytes() == data:
            e.status, e.reason = "unchanged", "already collected"
            continue
        if dest.exists() or dest.is_symlink():
            if not replace:
                e.status, e.reason = "skipped", (f"{dest.relative_to(out)} already holds another notebook: "
                                                 "collect with --replace to take this one")
                continue
            e.status = "replaced"
        else:
            e.status = "collected"
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".collect-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        shutil.copystat(e.source, tmp)
        os.replace(tmp, dest)
        if not _valid_notebook(data):
            e.reason = "not valid notebook JSON: autograde will give it zeros with that reason"
    _write_log(log_path(out), entries)
    return entries


def _write_log(path: Path, entries: list[Entry]) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "student_id", "chapter", "status", "reason"])
        w.writerows([e.path, e.student, e.chapter, e.status, e.reason] for e in entries)
    os.replace(tmp, path)
