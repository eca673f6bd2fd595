"""Reading what students hand in, without trusting it: folders, links, sizes, notebook JSON.

``SUBMISSIONS/<student_id>/<chapter_id>/<chapter_id>.ipynb`` is nbgrader's ``submitted/`` layout.
Every entry under ``SUBMISSIONS`` is either graded or listed as not graded with its reason
(:func:`find_submissions`); nothing is skipped without a word. A notebook is read by
:func:`read_notebook`, which refuses, with a message that never quotes the file:

* a path that is a symbolic link, or leaves the submission's folder through one (a link to another
  student's notebook would be graded on the victim's work and show their code in the feedback);
* a file with more than one hard link (its other name may lie outside the submission), a device, a
  FIFO or anything else that is not a regular file;
* more than :data:`MAX_NOTEBOOK_BYTES`, more than :data:`MAX_JSON_VALUES` JSON values or more than
  :data:`MAX_CELLS` cells, all checked before anything is parsed: parsing stays bounded in time
  and memory whatever the file holds.

The caps sit far above what an executed chapter notebook with its plots weighs (the largest
reference notebook, executed with every output: under 2 MB, 150 cells).
"""
from __future__ import annotations

import errno
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

MAX_NOTEBOOK_BYTES = 64 * 1024**2
MAX_JSON_VALUES = 2_000_000
MAX_CELLS = 5_000
STUDENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,127}$")


class Refused(ValueError):
    """A submission the grader will not read; the message is safe to show the student."""


@dataclass(frozen=True)
class Found:
    """What :func:`find_submissions` saw under SUBMISSIONS."""

    submissions: list[tuple[str, str, Path]]  # (student, chapter, notebook path), in order
    not_graded: list[tuple[str, str]]  # (path relative to SUBMISSIONS, why), in order


def _entries(directory: Path) -> list[os.DirEntry]:
    with os.scandir(directory) as it:
        return sorted(it, key=lambda e: e.name)


def find_submissions(root: Path, known: list[str]) -> Found:
    """Every submission under ``root``, and every other entry with the reason it is not graded."""
    if not root.is_dir():
        raise FileNotFoundError(f"submissions directory {root} does not exist")
    found, skipped = [], []
    for sdir in _entries(root):
        name = sdir.name
        if sdir.is_symlink():
            skipped.append((name, "a symbolic link, not a student's folder"))
        elif not sdir.is_dir(follow_symlinks=False):
            skipped.append((name, "not a folder (expected SUBMISSIONS/<student_id>/<chapter_id>/<chapter_id>.ipynb)"))
        elif not STUDENT_ID_RE.fullmatch(name):
            skipped.append((_printable(name), "not a valid student id (letters, digits and . _ @ + -, starting "
                                              "with a letter or digit, at most 128 characters)"))
        else:
            for cdir in _entries(Path(sdir.path)):
                rel = f"{name}/{_printable(cdir.name)}"
                if cdir.is_symlink():
                    skipped.append((rel, "a symbolic link, not a chapter folder"))
                elif not cdir.is_dir(follow_symlinks=False):
                    skipped.append((rel, "not a chapter folder (expected <student_id>/<chapter_id>/<chapter_id>.ipynb)"))
                elif cdir.name not in known:
                    skipped.append((rel, f"unknown chapter (known: {', '.join(known)})"))
                else:
                    found.append((name, cdir.name, Path(cdir.path) / f"{cdir.name}.ipynb"))
    return Found(found, skipped)


def _printable(name: str) -> str:
    text = "".join(c if c.isprintable() else "?" for c in name)
    return text if len(text) <= 80 else text[:77] + "..."


def read_bytes(path: Path) -> bytes:
    """The bytes of a submitted notebook: a regular file with one link, read through no symbolic link
    (:func:`find_submissions` refused linked folders above it).

    Raises FileNotFoundError when there is none, :class:`Refused` for anything the grader will not
    read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refused("the notebook is a symbolic link; submit the notebook file itself") from None
        raise Refused(f"the notebook could not be opened ({e.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused("the notebook is not a regular file (a device, a pipe or a folder)")
        if info.st_nlink != 1:
            raise Refused("the notebook has more than one name (a hard link); submit a copy of the file itself")
        if info.st_size > MAX_NOTEBOOK_BYTES:
            raise Refused(f"the notebook is {info.st_size / 1024**2:,.0f} MiB, over the grader's limit of "
                          f"{MAX_NOTEBOOK_BYTES // 1024**2} MiB: clear very large outputs and submit again")
        chunks, left = [], MAX_NOTEBOOK_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > MAX_NOTEBOOK_BYTES:  # it grew while being read
            raise Refused(f"the notebook is over the grader's limit of {MAX_NOTEBOOK_BYTES // 1024**2} MiB")
        return data
    finally:
        os.close(fd)


def parse_notebook(data: bytes) -> list[dict]:
    """The code cells of a notebook's JSON, each as ``{"source": str, "grade_id": str | None}``.

    Bounded before parsing (values, then cells); every field is type-checked, so an odd notebook is
    refused with a reason, never an exception from deep inside. Error messages never quote the file.
    """
    if sum(data.count(mark) for mark in (b",", b"[", b"{")) > 2 * MAX_JSON_VALUES:
        raise Refused(f"the notebook holds more than {MAX_JSON_VALUES:,} JSON values, over the grader's limit")
    try:
        nb = json.loads(data.decode("utf-8", errors="replace"))
    except RecursionError:
        raise Refused("the submitted file is not a valid notebook (JSON nested too deeply)") from None
    except ValueError as e:
        where = f"line {e.lineno}, column {e.colno}" if isinstance(e, json.JSONDecodeError) else "?"
        raise Refused(f"the submitted file is not a valid notebook (not JSON: {where})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise Refused("the submitted file is not a valid notebook (no list of cells)")
    if len(nb["cells"]) > MAX_CELLS:
        raise Refused(f"the notebook has {len(nb['cells']):,} cells, over the grader's limit of {MAX_CELLS:,}")
    cells = []
    for cell in nb["cells"]:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list) and all(isinstance(line, str) for line in source):
            source = "".join(source)
        if not isinstance(source, str):
            source = ""
        meta = cell.get("metadata")
        nbgrader = meta.get("nbgrader") if isinstance(meta, dict) else None
        gid = nbgrader.get("grade_id") if isinstance(nbgrader, dict) else None
        cells.append({"source": _utf8(source), "grade_id": _utf8(gid) if isinstance(gid, str) else None})
    return cells


def _utf8(text: str) -> str:
    """``text`` as UTF-8 can hold it: JSON may spell a lone surrogate (``"\\ud800"``), which no file, page or
    database the grader writes could store; each becomes U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text)
