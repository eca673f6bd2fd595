"""Retake the README's screenshots (docs/*.png) in full mode, as students, instructors and
lecturers see the course: ``make screenshots`` or, from the repository, ``python -m scripts.screenshots
[--only NAME ...]``.

Each one starts the server it shows (`make lab`, `make lab-instructor`, `make demo`) on a free
port, drives Debian's Chromium through Playwright (never ``playwright install``), and writes
``docs/<name>.png``. Full mode: COURSE_FAST is removed from the environment, so the dashboards
show the real experiments (a dashboard that was not warmed with ``make demo-warm`` measures on
its first open: minutes on a 2-core machine). Nothing the pictures show comes from a test
folder: the student opens ``course/``, the instructor ``solutions/``, and the feedback page is
graded in a temporary folder. A screenshot that fails leaves the committed one in place.

    demo-index           the index of `make demo`
    demo-dashboard       one chapter's dashboard (--chapter, default ch01_lora)
    student-lab          course/ch00_memory.ipynb in `make lab` (no nbgrader menus)
    instructor-lab       solutions/ch01_lora.py opened as a notebook in `make lab-instructor`
    instructor-feedback  the feedback page of a submission with one exercise left blank
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import requests

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
TOKEN = "course-screenshots"
SHOTS = ("demo-index", "demo-dashboard", "student-lab", "instructor-lab", "instructor-feedback")
SCREEN = {"width": 1600, "height": 1000}  # a lecture hall's projector
START_S = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _full_mode_env(**extra) -> dict:
    """Full mode, and a fresh runtime and workspace: no tab a previous session left open."""
    env = {k: v for k, v in os.environ.items() if k not in ("COURSE_FAST", "COURSE_CHECK_FIGURES")}
    return {**env, "JUPYTER_TOKEN": TOKEN, "JUPYTER_RUNTIME_DIR": tempfile.mkdtemp(prefix="rt-"),
            "JUPYTERLAB_WORKSPACES_DIR": tempfile.mkdtemp(prefix="ws-"), **extra}


class Server:
    """`make TARGET` (or ``command`` with ``{port}`` in it) on a free port, headless, stopped (its
    whole process group) on exit."""

    def __init__(self, target: str, command: list[str] | None = None, **env):
        self.target, self.port = target, _free_port()
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"{target}-", suffix=".log", delete=False)
        argv = ([a.format(port=self.port) for a in command] if command
                else ["make", "--no-print-directory", target, f"PORT={self.port}"])
        self.proc = subprocess.Popen(argv, cwd=ROOT,
                                     env=_full_mode_env(**env), stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.base = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                requests.get(self.base, params={"token": TOKEN}, timeout=5)
                return self
            except requests.ConnectionError:
                time.sleep(0.5)
        self.__exit__()
        self.log.seek(0)
        raise RuntimeError(f"make {self.target} did not start (log {self.log.name}):\n{self.log.read()[-2000:]}")

    def __exit__(self, *exc):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)


def _save(page, name: str) -> None:
    """Write docs/NAME.png through a temporary file: a failed shot never leaves half a picture."""
    tmp = DOCS / f".{name}.tmp.png"
    page.screenshot(path=str(tmp), type="png")
    tmp.replace(DOCS / f"{name}.png")
    print(f"wrote docs/{name}.png", flush=True)


def _lab_settings() -> str:
    """No autosave, no news prompt: the lab shows the file as it is and writes nothing."""
    d = Path(tempfile.mkdtemp(prefix="lab-settings-"))
    for plugin, settings in (("docmanager-extension/plugin", {"autosave": False}),
                             ("apputils-extension/notification", {"fetchNews": "false"})):
        path = d / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings))
    return str(d)


def shoot_demo(browser, names: list[str], chapter: str, timeout_s: int, listed: list[str]) -> None:
    # `make demo` itself, or the same command for the chapters named with --chapters.
    command = [sys.executable, "-m", "grader", "demo", "--port={port}", *listed] if listed else None
    with Server("demo", command) as server:
        page = browser.new_page(viewport=SCREEN)
        if "demo-index" in names:
            page.goto(f"{server.base}/?token={TOKEN}", timeout=START_S * 1000)
            page.wait_for_selector("a", timeout=60_000)
            _save(page, "demo-index")
        if "demo-dashboard" in names:
            print(f"opening the {chapter} dashboard in full mode (minutes unless warmed with make demo-warm)",
                  flush=True)
            page.goto(f"{server.base}/voila/render/{chapter}.ipynb?token={TOKEN}", timeout=timeout_s * 1000)
            # Every demo's plot is there once the page is done: one image per slider_plot.
            page.wait_for_function(
                "() => { const d = document.querySelectorAll('.course-demo');"
                " return d.length > 0 && [...d].every(x => x.querySelector('.widget-output img')); }",
                timeout=timeout_s * 1000, polling=1000)
            page.wait_for_timeout(1000)
            first = page.locator(".celltag_demo").first
            first.scroll_into_view_if_needed()
            _save(page, "demo-dashboard")


def shoot_student(browser) -> None:
    with Server("lab", JUPYTERLAB_SETTINGS_DIR=_lab_settings()) as server:
        page = browser.new_page(viewport=SCREEN)
        page.goto(f"{server.base}/lab/tree/course/ch00_memory.ipynb?token={TOKEN}", timeout=START_S * 1000)
        page.wait_for_selector(".jp-Notebook .jp-RenderedMarkdown", timeout=START_S * 1000)
        page.wait_for_selector(".jp-DirListing-item", timeout=START_S * 1000)
        page.wait_for_timeout(3000)
        _save(page, "student-lab")


def shoot_instructor(browser) -> None:
    source = ROOT / "solutions" / "ch01_lora.py"
    before = source.read_bytes()
    try:
        with Server("lab-instructor", JUPYTERLAB_SETTINGS_DIR=_lab_settings()) as server:
            page = browser.new_page(viewport=SCREEN)
            page.goto(f"{server.base}/lab/tree/solutions/ch01_lora.py?token={TOKEN}", timeout=START_S * 1000)
            page.wait_for_selector(".jp-Notebook .jp-RenderedMarkdown", timeout=START_S * 1000)
            page.wait_for_selector(".jp-DirListing-item", timeout=START_S * 1000)
            page.get_by_text("Nbgrader", exact=True).first.wait_for(timeout=60_000)
            page.wait_for_timeout(3000)
            _save(page, "instructor-lab")
    finally:
        if source.read_bytes() != before:  # the chapter's only source: never let a screenshot change it
            source.write_bytes(before)
            print("warning: the instructor lab rewrote solutions/ch01_lora.py; restored", file=sys.stderr)


def shoot_feedback(browser, timeout_s: int) -> None:
    """Grade one submission (chapter 1, every exercise solved but Adapter, left as released) and
    show its feedback page."""
    from grader.notebooks import grade_id, read_source

    chapter = "ch01_lora"
    nb = nbformat.read(ROOT / "course" / f"{chapter}.ipynb", as_version=4)
    answers = {grade_id(c): c.source for c in read_source(chapter).cells
               if grade_id(c) and c.metadata.get("nbgrader", {}).get("solution")}
    for cell in nb.cells:
        gid = grade_id(cell)
        if gid in answers and gid != "Adapter":
            cell.source = answers[gid]
    with tempfile.TemporaryDirectory(prefix="feedback-") as tmp:
        sub = Path(tmp) / "submitted" / "student01" / chapter
        sub.mkdir(parents=True)
        nbformat.write(nb, sub / f"{chapter}.ipynb")
        out = Path(tmp) / "graded"
        isolation = [] if os.geteuid() == 0 else ["--unisolated"]
        subprocess.run([sys.executable, "-m", "grader", "autograde", str(Path(tmp) / "submitted"), "--out", str(out),
                        *isolation], cwd=ROOT, env=_full_mode_env(), check=True, timeout=timeout_s)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto((out / "feedback" / "student01" / f"{chapter}.html").as_uri())
        page.wait_for_timeout(1000)
        _save(page, "instructor-feedback")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=SHOTS, default=list(SHOTS), help="the screenshots to retake")
    p.add_argument("--chapter", default="ch01_lora", help="the dashboard of demo-dashboard (default ch01_lora)")
    p.add_argument("--chapters", nargs="+", default=[], help="the chapters the demo index lists (default: all)")
    p.add_argument("--timeout", type=int, default=1200, help="seconds a dashboard or the grading may take")
    args = p.parse_args(argv)
    if not Path(CHROMIUM).exists():
        p.error(f"Chromium not found at {CHROMIUM} (apt-get install chromium, or set CHROMIUM=path)")
    if not shutil.which("make"):
        p.error("make is not installed")
    from playwright.sync_api import sync_playwright

    failed = []
    with sync_playwright() as pw:
        # Chromium's sandbox needs user namespaces that containers running as root rarely have.
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"] if os.geteuid() == 0 else [])
        steps = [(("demo-index", "demo-dashboard"), lambda: shoot_demo(
                     browser, [n for n in args.only if n.startswith("demo-")], args.chapter, args.timeout,
                     args.chapters)),
                 (("student-lab",), lambda: shoot_student(browser)),
                 (("instructor-lab",), lambda: shoot_instructor(browser)),
                 (("instructor-feedback",), lambda: shoot_feedback(browser, args.timeout))]
        for names, step in steps:
            if not set(names) & set(args.only):
                continue
            try:
                step()
            except Exception as e:  # noqa: BLE001 - one failed screenshot must not cost the others
                failed.append(f"{', '.join(n for n in names if n in args.only)}: {type(e).__name__}: {e}")
        browser.close()
    for line in failed:
        print(f"not retaken: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
