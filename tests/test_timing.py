"""`python -m grader time`: solved chapters run as a student runs them, hidden tests left out."""
import subprocess
import sys

import nbformat
import pytest

from conftest import ROOT
from grader.timing import HIDDEN, time_chapter


def test_hidden_test_regions_are_cut_like_the_release_cuts_them():
    source = ("check(x)\n### BEGIN HIDDEN TESTS\nfrom grader.api import run_hidden; run_hidden('c', 't', "
              "globals())\n### END HIDDEN TESTS\nprint('after')\n")
    assert HIDDEN.sub("", source) == "check(x)\nprint('after')\n"


def test_unknown_chapters_are_refused_with_the_known_ones():
    proc = subprocess.run([sys.executable, "-m", "grader", "time", "ch99_nope"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "ch99_nope" in proc.stderr and "ch00_memory" in proc.stderr


@pytest.mark.slow
def test_a_chapter_is_timed_and_saved_without_hidden_tests(tmp_path):
    t = time_chapter("ch00_memory", fast=True, save=tmp_path)
    assert not t.error and t.seconds > 0
    assert t.cells and all(s >= 0 for s, _ in t.cells) and sum(s for s, _ in t.cells) <= t.seconds
    nb = nbformat.read(tmp_path / "ch00_memory.ipynb", as_version=4)
    assert any(c.get("outputs") for c in nb.cells if c.cell_type == "code")
    assert not any("run_hidden" in c.source for c in nb.cells)
