"""`make lab` serves JupyterLab headless and every chapter notebook can be fetched over HTTP."""
import os
import signal
import socket
import subprocess
import tempfile
import time

import pytest
import requests

from conftest import ROOT
from grader.notebooks import chapters

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    port, token = _free_port(), "course-test-token"
    env = {**os.environ, "JUPYTER_TOKEN": token, "JUPYTER_RUNTIME_DIR": tempfile.mkdtemp(prefix="rt-")}
    log = (tmp_path_factory.mktemp("lab") / "lab.log").open("w+")
    proc = subprocess.Popen(["make", "--no-print-directory", "lab", f"PORT={port}"], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                if requests.get(f"{base}/api/status", params={"token": token}, timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            if proc.poll() is not None:
                break
            time.sleep(0.5)
        else:
            pytest.fail("JupyterLab did not start within 120 s")
        log.seek(0)
        assert proc.poll() is None, f"make lab exited:\n{log.read()[-3000:]}"
        yield base, token, log
    finally:
        _stop(proc)


def _stop(proc):
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def test_lab_prints_its_url(lab):
    base, token, log = lab
    log.seek(0)
    assert f"127.0.0.1:{base.rsplit(':', 1)[1]}" in log.read()


def test_lab_page_is_served(lab):
    base, token, _ = lab
    r = requests.get(f"{base}/lab", params={"token": token}, timeout=30)
    assert r.status_code == 200 and "JupyterLab" in r.text


@pytest.mark.parametrize("chapter", chapters())
def test_chapter_notebook_opens(lab, chapter):
    base, token, _ = lab
    r = requests.get(f"{base}/api/contents/course/{chapter}.ipynb", params={"token": token, "content": 1},
                     timeout=30)
    assert r.status_code == 200, r.text[:500]
    model = r.json()
    assert model["type"] == "notebook"
    assert any(c["cell_type"] == "code" for c in model["content"]["cells"])
