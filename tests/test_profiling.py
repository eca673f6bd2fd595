"""The suite's own machinery: the profile every run writes (``tests/profiling.py``), the groups that keep a
module's expensive fixture on one worker (``tests/xdist_groups.py``), and the graded batch of one chapter."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import graded_once
import profiling
from conftest import ROOT

GROUPED = '''
import os, pytest
pytestmark = pytest.mark.xdist_group("expensive")

@pytest.fixture(scope="module")
def built():
    with open(os.environ["BUILT_LOG"], "a") as f:
        f.write(f"{os.getpid()}\\n")

@pytest.mark.parametrize("i", range(8))
def test_reads_it(built, i):
    pass
'''
LOOSE = '''
import pytest

@pytest.mark.parametrize("i", range(24))
def test_other(i):
    pass
'''


def _mini_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest on two workers over a module whose fixture is expensive, beside ungrouped tests."""
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_loose.py").write_text(LOOSE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]), BUILT_LOG=str(tmp_path / "built.log"),
               COURSE_TEST_PROFILE=str(tmp_path / "profile.md"))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                           "no:cacheprovider", "-p", "xdist_groups", "-p", "profiling", "--rootdir", str(tmp_path),
                           str(tmp_path), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_group_runs_on_one_worker_and_its_module_fixture_is_built_once(tmp_path):
    proc = _mini_run(tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    built = (tmp_path / "built.log").read_text().split()
    assert len(built) == 1, f"the module fixture was built {len(built)} times (once per worker: groups lost)"


def test_every_run_writes_where_its_time_went(tmp_path):
    proc = _mini_run(tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    table = (tmp_path / "profile.md").read_text()
    assert "32 tests" in table and "## Per test file" in table and "## Per chapter" in table
    assert "test_grouped.py" in table and "test_loose.py" in table
    every = json.loads((tmp_path / "profile.json").read_text())
    assert len(every["tests"]) == 32
    assert "where the time went" in proc.stdout


def test_chapters_are_read_from_test_ids():
    assert profiling.chapter_of("tests/test_hidden_ch04_partial_training.py::test_x[a]") == "ch04"
    assert profiling.chapter_of("tests/test_hostile_chapters.py::TestBatch::test_case[measured_size_ch03_sum]") == "ch03"
    assert profiling.chapter_of("tests/test_release.py::test_x[ch10_flash_attention]") == "ch10"
    assert profiling.chapter_of("tests/test_source_policy.py::test_each_chapter") == "shared"
    assert profiling.chapter_of("tests/test_x.py::test_mch04") == "shared"


def test_a_graded_batch_books_each_chapter_its_share(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", f"profiling-test-{os.getpid()}")
    out = tmp_path / "out"

    def fake_autograde(argv, **kwargs):
        out.mkdir()
        (out / "timing.csv").write_text("student_id,chapter,seconds\na,ch01_lora,3.0\nb,ch01_lora,1.0\n"
                                        "a,ch04_partial_training,2.5\n")
        return "done"

    try:
        assert profiling.graded_batch(fake_autograde, ["autograde", "--workers", "2"], out) == "done"
        (entry,) = [json.loads(line) for f in (profiling._run_dir() / "profile").glob("*.jsonl")
                    for line in f.read_text().splitlines()]
    finally:
        import shutil

        shutil.rmtree(profiling._run_dir(), ignore_errors=True)
    assert entry["kind"] == "graded batch" and entry["workers"] == 2
    assert entry["chapters"] == {"ch01": 4.0, "ch04": 2.5}
    assert entry["label"] == "3 submissions, 2 chapters, 2 worker(s)"


def test_the_graded_batch_grades_the_chapters_the_selected_tests_name(monkeypatch):
    monkeypatch.setattr(graded_once, "SELECTED", None)
    graded_once.select(["tests/test_hidden_ch04_partial_training.py::test_a",
                        "tests/test_release.py::test_b[ch04_partial_training]"])
    assert graded_once.graded_chapters() == ["ch04_partial_training"]
    graded_once.select(["tests/test_hidden_ch04_partial_training.py::test_a", "tests/test_lab.py::test_c"])
    assert len(graded_once.graded_chapters()) == len(graded_once.chapters())
    graded_once.select([])
    assert len(graded_once.graded_chapters()) == len(graded_once.chapters())
