"""`python -m grader collect SRC OUT`: downloaded notebooks into the layout autograde reads, nothing lost."""
import csv
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from grader import intake
from grader.collect import chapter_of, collect, log_path
from grader.notebooks import chapters

NB = b'{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'


def _put(src, name, data=NB, mtime=1_700_000_000):
    path = src / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))
    return path


def _log(out):
    with log_path(out).open(newline="") as f:
        return {r["path"]: r for r in csv.DictReader(f)}


@pytest.mark.parametrize("stem, expected", [
    ("alice_ch01_lora", ("ch01_lora", "alice")),
    ("alice_ch01", ("ch01_lora", "alice")),
    ("a.b-c_ch00_memory (1)", ("ch00_memory", "a.b-c")),
    ("bob-ch02_checkpointing-3", ("ch02_checkpointing", "bob")),
    ("doejane_LATE_1234_5678_ch00_memory-1", ("ch00_memory", "doejane_LATE_1234_5678")),
    ("ch03_accumulation", ("ch03_accumulation", "")),
])
def test_names_give_the_chapter_and_the_student(stem, expected):
    assert chapter_of(stem, chapters()) == expected


def test_names_without_a_known_chapter_say_why():
    assert chapter_of("alice_ch42_fusion", chapters()).startswith("unknown chapter 'ch42_fusion'")
    assert chapter_of("alice_homework", chapters()).startswith("no chapter id in the name")
    assert chapter_of("alice_ch01_loraX", chapters()).startswith("unknown chapter")


def test_a_download_folder_becomes_the_submitted_layout_and_every_file_is_accounted_for(tmp_path):
    src, out = tmp_path / "downloads", tmp_path / "submitted"
    _put(src, "alice_ch00_memory.ipynb")
    _put(src, "alice_ch01 (1).ipynb")
    _put(src, "bob/ch01_lora.ipynb", b"{ not json")  # collected all the same: autograde says why it scores 0
    _put(src, "carol/ch02_checkpointing/ch02_checkpointing.ipynb")
    _put(src, "doejane_LATE_1234_5678_ch00_memory-1.ipynb")
    _put(src, "ed_ch03.ipynb", b'{"cells": [1]}', mtime=1_700_000_000)
    _put(src, "ed_ch03_accumulation.ipynb", b'{"cells": [2]}', mtime=1_700_000_100)  # newer: this one is graded
    _put(src, "dave_ch02.ipynb", b'{"cells": [1]}')
    _put(src, "dave-ch02_checkpointing.ipynb", b'{"cells": [2]}')  # same time as dave's other: both refused
    _put(src, "notes.pdf", b"%PDF")
    _put(src, "frank_ch42_fusion.ipynb")
    _put(src, "ch00_memory.ipynb")
    _put(src, "Jane Doe_123_assignsubmission_file_/ch00_memory.ipynb")
    (src / "eve_ch00_memory.ipynb").symlink_to(src / "alice_ch00_memory.ipynb")
    proc = subprocess.run([sys.executable, "-m", "grader", "collect", str(src), str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    log = _log(out)
    assert set(log) == {p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file() or p.is_symlink()}
    collected = {(r["student_id"], r["chapter"]) for r in log.values() if r["status"] == "collected"}
    assert collected == {("alice", "ch00_memory"), ("alice", "ch01_lora"), ("bob", "ch01_lora"),
                         ("carol", "ch02_checkpointing"), ("doejane", "ch00_memory"), ("ed", "ch03_accumulation")}
    assert (out / "ed" / "ch03_accumulation" / "ch03_accumulation.ipynb").read_bytes() == b'{"cells": [2]}'
    why = {path: r["reason"] for path, r in log.items()}
    assert why["ed_ch03.ipynb"] == "an older copy of ed_ch03_accumulation.ipynb, which is collected"
    assert "same time" in why["dave_ch02.ipynb"] and "same time" in why["dave-ch02_checkpointing.ipynb"]
    assert why["notes.pdf"] == "not a notebook (.ipynb)"
    assert why["frank_ch42_fusion.ipynb"].startswith("unknown chapter 'ch42_fusion'")
    assert why["ch00_memory.ipynb"].startswith("no student id")
    assert "not a valid student id" in why["Jane Doe_123_assignsubmission_file_/ch00_memory.ipynb"]
    assert why["eve_ch00_memory.ipynb"].startswith("a symbolic link")
    assert why["bob/ch01_lora.ipynb"].startswith("not valid notebook JSON")
    for path, reason in why.items():
        if log[path]["status"] == "skipped":
            assert f"skipped: {path}: {reason}" in proc.stdout
    assert "6 notebook(s)" in proc.stdout and "8 file(s) not collected" in proc.stdout
    # What autograde reads: every collected notebook, and nothing else under OUT.
    found = intake.find_submissions(out, chapters())
    assert {(s, c) for s, c, _ in found.submissions} == collected and not found.not_graded
    assert all(p.exists() for p in src.rglob("*")), "SRC is left as it was"


def test_collecting_again_keeps_what_was_collected_unless_told_to_replace(tmp_path):
    src, out = tmp_path / "downloads", tmp_path / "submitted"
    _put(src, "alice_ch00_memory.ipynb")
    assert [e.status for e in collect(src, out)] == ["collected"]
    assert [e.status for e in collect(src, out)] == ["unchanged"]
    _put(src, "alice_ch00_memory.ipynb", b'{"cells": [1]}')
    (entry,) = collect(src, out)
    assert entry.status == "skipped" and "--replace" in entry.reason
    assert (out / "alice" / "ch00_memory" / "ch00_memory.ipynb").read_bytes() == NB
    (entry,) = collect(src, out, replace=True)
    assert entry.status == "replaced"
    assert (out / "alice" / "ch00_memory" / "ch00_memory.ipynb").read_bytes() == b'{"cells": [1]}'


def test_bad_folders_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        collect(tmp_path / "nope", tmp_path / "out")
    _put(tmp_path, "alice_ch00_memory.ipynb")
    with pytest.raises(ValueError, match="must not lie inside SRC"):
        collect(tmp_path, tmp_path / "out")
    _put(tmp_path / "src", "alice_ch00_memory.ipynb")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ValueError, match="exists and is not a folder"):
        collect(tmp_path / "src", tmp_path / "a-file")
