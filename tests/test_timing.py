"""`python -m grader time`: solved chapters run as a student runs them, hidden tests left out."""
import os
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


def test_each_notebook_kernel_has_socket_paths_of_its_own(tmp_path, monkeypatch):
    """Without a connection file chosen up front, jupyter_client names every ipc kernel's sockets
    kernel-ipc-N in the working directory, and two test workers starting kernels there at once
    bound the same ones ("Kernel didn't respond in 60 seconds", "Invalid Signature")."""
    import tempfile

    from grader.timing import KERNEL_OPTIONS, SOCKET_PATH_MAX

    manager = KERNEL_OPTIONS["kernel_manager_class"]
    monkeypatch.chdir(tmp_path)
    runtime = tempfile.mkdtemp(prefix="rt-")
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", runtime)
    a, b = (manager(kernel_name="python3") for _ in range(2))
    assert a.transport == b.transport == "ipc"
    assert a.ip != b.ip and os.path.dirname(a.ip) == os.path.dirname(b.ip) == runtime
    deep = tmp_path / ("d" * 60) / "runtime"  # socket paths there would not fit: the temp dir instead
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(deep))
    c = manager(kernel_name="python3")
    assert os.path.isabs(c.ip) and len(f"{c.ip}-5") <= SOCKET_PATH_MAX and not deep.exists()
    os.rmdir(runtime)
