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


def _serve(target, tmp_path_factory, extra_env=None):
    port, token = _free_port(), "course-test-token"
    env = {**os.environ, "JUPYTER_TOKEN": token, "JUPYTER_RUNTIME_DIR": tempfile.mkdtemp(prefix="rt-"),
           **(extra_env or {})}
    log = (tmp_path_factory.mktemp(target) / "lab.log").open("w+")
    proc = subprocess.Popen(["make", "--no-print-directory", target, f"PORT={port}"], cwd=ROOT, env=env,
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
            pytest.fail(f"make {target} did not start within 120 s")
        log.seek(0)
        assert proc.poll() is None, f"make {target} exited:\n{log.read()[-3000:]}"
        yield base, token, log
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from _serve("lab", tmp_path_factory)


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


def test_instructor_lab_serves_chapter_sources_read_only(tmp_path_factory):
    """`make lab-instructor` reports solutions/*.py as not writable (JupyterLab then never autosaves
    them) and refuses a save that reaches the server anyway, naming the way to edit them; the
    file's bytes stay the same."""
    source = ROOT / "solutions" / "ch00_memory.py"
    before = source.read_bytes()
    server = _serve("lab-instructor", tmp_path_factory, {"EDIT": ""})
    base, token, _ = next(server)
    try:
        url, params = f"{base}/api/contents/solutions/ch00_memory.py", {"token": token}
        model = requests.get(url, params=params, timeout=60).json()
        assert model["type"] == "notebook" and model["writable"] is False, {k: model.get(k) for k in ("type", "writable")}
        assert requests.get(f"{base}/api/contents/course/ch00_memory.ipynb", params={**params, "content": 0},
                            timeout=60).json()["writable"] is True
        r = requests.put(url, params=params, json={"type": "notebook", "format": "json", "content": model["content"]},
                         timeout=60)
        assert r.status_code == 403, r.text[:300]
        assert "chapter's only source" in r.json()["message"] and "EDIT=1" in r.json()["message"]
    finally:
        next(server, None)
    assert source.read_bytes() == before, "the instructor lab wrote solutions/ch00_memory.py"
