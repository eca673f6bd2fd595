"""The three experiences in a real browser (Chromium through Playwright), in fast mode.

- Student: `make lab` opens a solved chapter notebook; run all cells: no error, a widget
  renders, moving a slider redraws the plot, and none of nbgrader's instructor tools is there.
- Instructor: `make lab-instructor` keeps those tools and opens solutions/*.py as notebooks; a
  feedback page written by `python -m grader autograde` shows scores and reasons.
- Lecturer: `make demo` lists every chapter; in each dashboard every control is moved and its
  plot changes, no error shows, and nothing is fetched from the network (it works offline).

Skipped, with the reason, when Playwright or Chromium is missing, unless REQUIRE_BROWSER=1
(set by .ci/run): then they fail. Screenshots and the measured redraw times go to
BROWSER_ARTIFACTS (default build/artifacts/).
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import nbformat
import pytest
import requests

import graded_once
from conftest import ROOT, AUTOGRADE
import profiling
from grader import demo
from grader.notebooks import chapters, grade_id, is_demo, read_source
from submissions import with_exercise, write
from test_lab import _free_port, _stop
from wrong_submissions import WRONG

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("BROWSER_ARTIFACTS") or ROOT / "build" / "artifacts")
TOKEN = "course-browser-token"
STUDENT_CHAPTER = "ch00_memory"
# Servers start and dashboards run their chapter's code in seconds on an idle 2-core machine;
# a shared one can be ten times slower.
START_S = 900
# A dashboard opens in under a minute on a loaded 2-core machine; one that stalls gets a second try.
DASHBOARD_S = 240
ERROR_TEXT = re.compile(r"Traceback|\w+Error\b|There was an error when executing", re.S)


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install -e '.[test]')"
    if not Path(CHROMIUM).exists():
        return f"Chromium not found at {CHROMIUM} (apt-get install chromium, or set CHROMIUM=path)"
    return None


@pytest.fixture(scope="module")
def browser():
    reason = _missing()
    if reason:
        if os.environ.get("REQUIRE_BROWSER") == "1":
            pytest.fail(f"REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        # Chromium's sandbox needs user namespaces that containers running as root rarely have.
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"] if os.geteuid() == 0 else [])
        yield b
        b.close()


def _page(browser, width=1400, height=900):
    """A page that may only reach this machine, and records whatever else it tried."""
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.external = []
    page.console_errors = []  # what the browser's console reports as an error, and uncaught exceptions
    page.on("console", lambda m: page.console_errors.append(m.text[:300]) if m.type == "error" else None)
    page.on("pageerror", lambda e: page.console_errors.append(f"uncaught: {str(e)[:300]}"))

    def route(r):
        host = urlparse(r.request.url).hostname
        if r.request.url.startswith(("data:", "blob:", "file:")) or host in ("127.0.0.1", "localhost"):
            r.continue_()
        else:
            page.external.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    return page


def _serve(target: str, tmp_path_factory, extra_env=None):
    """Run `make TARGET PORT=...` headless; yield (base URL, process, log) once it answers."""
    port = _free_port()
    tmp = tmp_path_factory.mktemp(target)
    # Kernels listen on Unix sockets in the runtime directory, whose paths must stay short (108 bytes).
    runtime = tempfile.mkdtemp(prefix="rt-")
    env = {**os.environ, "COURSE_FAST": "1", "JUPYTER_TOKEN": TOKEN, "JUPYTER_RUNTIME_DIR": runtime,
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "ws"), **(extra_env or {})}
    log = (tmp / "server.log").open("w+")
    proc = subprocess.Popen(["make", "--no-print-directory", target, f"PORT={port}"], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            requests.get(base, params={"token": TOKEN}, timeout=5)
            break
        except requests.ConnectionError:
            time.sleep(0.5)
    log.seek(0)
    if proc.poll() is not None or time.monotonic() >= deadline:
        _stop(proc)
        pytest.fail(f"make {target} did not start:\n{log.read()[-3000:]}")
    return base, proc, log


def _lab_settings(tmp_path_factory, autosave_s: int | None = None) -> str:
    """JupyterLab user settings for tests: every cell in the DOM (no windowing), so that the
    test sees all outputs; no autosave (or every ``autosave_s`` seconds); no news prompt."""
    d = tmp_path_factory.mktemp("lab-settings")
    save = {"autosave": True, "autosaveInterval": autosave_s} if autosave_s else {"autosave": False}
    for plugin, settings in (("notebook-extension/tracker", {"windowingMode": "none"}),
                             ("docmanager-extension/plugin", save),
                             ("apputils-extension/notification", {"fetchNews": "false"})):
        path = d / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings))
    return str(d)


def _shot(page, name):
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def _plot_src(locator) -> str:
    return locator.locator("img").first.get_attribute("src") or ""


def _move(page, control) -> None:
    """Change one control by one step: a slider's handle with the arrow key (back at its
    maximum), a dropdown to its next option."""
    select = control.locator("select")
    if select.count():
        options = select.locator("option").all_inner_texts()
        current = select.evaluate("s => s.selectedIndex")
        select.select_option(index=(current + 1) % len(options))
        return
    handle = control.locator(".noUi-handle").first
    handle.focus()
    at_max = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
    page.keyboard.press("ArrowLeft" if at_max else "ArrowRight")


def _redraw_seconds(page, control, output) -> float:
    """Move ``control``; wait until the plot in ``output`` is a different image."""
    before = _plot_src(output)
    start = time.perf_counter()
    _move(page, control)
    page.wait_for_function(
        "([el, before]) => { const img = el.querySelector('img'); return img && img.src && img.src !== before; }",
        arg=[output.element_handle(), before], timeout=120_000, polling=20)
    return time.perf_counter() - start


def _error_texts(page) -> list[str]:
    texts = page.locator("[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts()
    return [t for t in texts if ERROR_TEXT.search(t)]


# --- student -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir():
    """A folder under the servers' root (the repository) for the files the tests open."""
    folder = ROOT / "build" / f"browser-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def student_lab(tmp_path_factory, workdir):
    # A student's notebook with every exercise solved (the reference answers in the release).
    nb = nbformat.read(ROOT / "course" / f"{STUDENT_CHAPTER}.ipynb", as_version=4)
    for cell in read_source(STUDENT_CHAPTER).cells:
        if grade_id(cell) and cell.metadata["nbgrader"].get("solution"):
            nb = with_exercise(STUDENT_CHAPTER, grade_id(cell), cell.source, base=nb)
    nbformat.write(nb, workdir / f"{STUDENT_CHAPTER}.ipynb")
    base, proc, log = _serve("lab", tmp_path_factory, {"JUPYTERLAB_SETTINGS_DIR": _lab_settings(tmp_path_factory)})
    try:
        yield base, workdir.relative_to(ROOT).as_posix(), log
    finally:
        _stop(proc)


def _server_tail(log, chars: int = 4000) -> str:
    log.flush()
    log.seek(0)
    return log.read()[-chars:]


def _start_kernel(base: str, path: str, log, attempts: int = 3) -> dict:
    """Start the notebook's kernel through the server's REST API, as JupyterLab does when it
    opens a notebook; JupyterLab then connects to this session instead of starting its own
    (which, on a busy CI machine, left the page at a "Select Kernel" dialog with no kernel). A kernel that cannot start fails here with the server's answer and log, not as a
    Run All that never moves. (The server calls the kernel "starting" until a client talks to
    it; the page waits for idle.)"""
    headers = {"Authorization": f"token {TOKEN}"}
    body = {"path": path, "name": Path(path).name, "type": "notebook", "kernel": {"name": "python3"}}
    answers = []
    for attempt in range(attempts):
        try:
            r = requests.post(f"{base}/api/sessions", json=body, headers=headers, timeout=180)
        except requests.RequestException as e:
            answers.append(f"try {attempt + 1}: {e!r}")
            continue
        if r.ok:
            kernel = r.json()["kernel"]
            if kernel.get("execution_state") != "dead":
                return r.json()
            answers.append(f"try {attempt + 1}: kernel {kernel}")
        else:
            answers.append(f"try {attempt + 1}: HTTP {r.status_code} {r.text[:1000]}")
        time.sleep(5)
    raise AssertionError(f"the kernel for {path} did not start: {answers}\nserver log:\n{_server_tail(log)}")


def _menubar(page) -> list[str]:
    page.wait_for_selector(".lm-MenuBar-itemLabel", timeout=START_S * 1000)
    return [t.strip() for t in page.locator(".lm-MenuBar-itemLabel").all_inner_texts()]


def _accept_dialogs(page, notebook: str | None = None) -> list[str]:
    """Texts of the JupyterLab dialogs open now, each accepted with its default button so that
    the menus can be clicked again. A "Select Kernel" dialog (JupyterLab asks when it opened the
    notebook before the server listed its session or kernel specs) is answered with the kernel
    already running for `notebook` when it is offered, so that no second kernel is started and
    the first shut down mid-start; otherwise with the course's Python 3."""
    texts = []
    for _ in range(5):
        dialog = page.locator(".jp-Dialog")
        if dialog.count() == 0 or not dialog.first.is_visible():
            break
        texts.append(" ".join(dialog.first.inner_text().split())[:300])
        choice = dialog.first.locator("select")
        if choice.count():
            options = choice.first.locator("option")
            labels = [t.strip() for t in options.all_inner_texts()]
            running = [i for i, t in enumerate(labels) if notebook and t.startswith(f"{notebook} (")]
            python = [i for i, t in enumerate(labels) if t.startswith("Python 3")]
            if running or python:
                pick = options.nth((running or python)[0])
                choice.first.select_option(value=pick.get_attribute("value"))
        accept = dialog.first.locator(".jp-Dialog-button.jp-mod-accept")
        if accept.count():
            accept.first.click()
        else:
            page.keyboard.press("Escape")
        try:
            dialog.first.wait_for(state="detached", timeout=10_000)
        except Exception:  # noqa: BLE001 - a dialog that stays is reported by the next round
            pass
        page.wait_for_timeout(500)
    return texts


def _await_kernel(page, notebook: str, timeout_s: float = START_S) -> list[str]:
    """Wait until the notebook's toolbar names a Python kernel and the kernel is idle for two
    polls in a row, answering any kernel dialog on the way; the dialogs seen are returned."""
    dialogs, ready_polls, state = [], 0, {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dialogs += _accept_dialogs(page, notebook)
        state = page.evaluate(
            """() => ({kernel: (document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Toolbar-kernelName')
                                || {textContent: ''}).textContent.trim(),
                       idle: document.querySelector('.jp-Notebook-ExecutionIndicator[data-status="idle"]') !== null})""")
        ready_polls = ready_polls + 1 if state["kernel"].startswith("Python") and state["idle"] else 0
        if ready_polls >= 2:
            return dialogs
        page.wait_for_timeout(1000)
    _shot(page, "student-lab-no-kernel")
    raise AssertionError(f"{notebook} was not connected to an idle Python kernel in {timeout_s} s: {state}; "
                         f"dialogs seen: {dialogs}")


# A run whose prompts have not changed for this long while the kernel says idle has stalled (a
# kernel that restarted, or cells queued before the kernel was ready); one that has not finished
# in RUN_S has stalled whatever the indicator says. ch00 runs in about 10 s in fast mode.
STALL_S = 90
RUN_S = 600


def _run_state(page) -> dict:
    return page.evaluate(
        """() => ({prompts: Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt'))
                              .map(p => p.textContent.trim()),
                   idle: document.querySelector('.jp-Notebook-ExecutionIndicator[data-status="idle"]') !== null})""")


def _wait_for_run(page) -> tuple[str, dict]:
    """Poll the prompts until every code cell shows an execution count and the kernel is idle
    ("done"), a cell shows an error ("error"), or the run stops moving ("stalled")."""
    start = last_change = time.monotonic()
    state, previous = {}, None
    while True:
        state = _run_state(page)
        now = time.monotonic()
        prompts = state["prompts"]
        if prompts and all(re.search(r"\[\d+\]", p) for p in prompts) and state["idle"]:
            return "done", state
        if _error_texts(page):
            return "error", state
        if prompts != previous:
            previous, last_change = prompts, now
        if (state["idle"] and now - last_change > STALL_S) or now - start > RUN_S:
            return "stalled", state
        page.wait_for_timeout(1000)


def _click_menu(page, menu: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{re.escape(menu)}$")).click(timeout=15_000)
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}…?$")).click(timeout=15_000)


def _run_all(page, log, notebook: str, attempts: int = 3) -> None:
    """Run All Cells and wait until every code cell shows an execution count. A busy machine's
    kernel may not be ready for the first click, or a run may stall: then accept any dialog and
    restart the kernel and run everything again. A cell that shows an error fails at once."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    dialogs, history = [], []
    for attempt in range(attempts):
        # First wait for the kernel: Run All clicked while JupyterLab still asks which kernel to use
        # queues every cell for a kernel that never comes (prompts stay "[ ]" with the kernel "idle").
        dialogs += _await_kernel(page, notebook) if attempt == 0 else _accept_dialogs(page, notebook)
        try:  # a dialog that opens in the meantime blocks the menu: accept it and try again
            if attempt == 0:
                _click_menu(page, "Run", "Run All Cells")
            else:
                _click_menu(page, "Kernel", "Restart Kernel and Run All Cells")
                page.wait_for_timeout(500)
                dialogs += _accept_dialogs(page, notebook)
        except PlaywrightTimeout:
            history.append(f"try {attempt + 1}: a menu could not be clicked")
            continue
        outcome, state = _wait_for_run(page)
        if outcome == "done":
            if history or dialogs:
                print(f"Run All Cells finished on try {attempt + 1}: {history}; dialogs seen: {dialogs}")
            return
        _shot(page, f"student-lab-{outcome}-{attempt + 1}")
        if outcome == "error":
            raise AssertionError(f"a cell failed: {_error_texts(page)[:2]}; prompts: {state['prompts']}")
        history.append(f"try {attempt + 1}: stalled with the kernel {'idle' if state['idle'] else 'busy'} "
                       f"and prompts {state['prompts']}")
    dialogs += _accept_dialogs(page, notebook)
    raise AssertionError(f"Run All Cells did not finish in {attempts} tries: {history}; dialogs seen: "
                         f"{dialogs}\nserver log:\n{_server_tail(log)}")


def test_student_runs_a_chapter_without_instructor_tools(browser, student_lab):
    base, folder, log = student_lab
    _start_kernel(base, f"{folder}/{STUDENT_CHAPTER}.ipynb", log)
    page = _page(browser)
    page.goto(f"{base}/lab/tree/{folder}/{STUDENT_CHAPTER}.ipynb?token={TOKEN}", timeout=START_S * 1000)
    menus = _menubar(page)
    assert "Run" in menus and "Nbgrader" not in menus, menus
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=START_S * 1000)
    _run_all(page, log, f"{STUDENT_CHAPTER}.ipynb")
    prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
    assert prompts and all(re.search(r"\[\d+\]", p) for p in prompts), f"not every cell ran: {prompts}"
    assert not _error_texts(page), _error_texts(page)[:3]

    slider = page.locator(".widget-slider").first
    slider.wait_for(timeout=60_000)
    demo_output = page.locator(".jp-OutputArea-output .widget-vbox").first
    output = demo_output.locator(".widget-output").first
    seconds = _redraw_seconds(page, slider, output)
    demo_output.scroll_into_view_if_needed()
    _shot(page, "student-lab")
    text = page.locator("body").inner_text()
    for tool in ("Nbgrader", "Create Assignment", "Formgrader", "Validate"):
        assert tool not in text, f"students see nbgrader's {tool!r}"
    assert not _error_texts(page)
    assert requests.get(f"{base}/formgrader", params={"token": TOKEN}, timeout=30).status_code == 404
    print(f"student lab: slider redraw {seconds:.2f} s")


# --- instructor ----------------------------------------------------------------------------

AUTOSAVE_S = 3  # the instructor test's autosave interval (JupyterLab's default is 120 s)


def test_instructor_lab_has_nbgrader_and_opens_sources_as_notebooks_without_writing_them(browser, tmp_path_factory):
    """The chapter's own source, opened as a notebook with autosave on: once its kernel has started
    (which changes the notebook's metadata) and several autosave intervals have passed, its bytes
    are unchanged (opening solutions/ch01_lora.py used to rewrite its header)."""
    source = ROOT / "solutions" / f"{STUDENT_CHAPTER}.py"
    before = source.read_bytes()
    base, proc, _ = _serve("lab-instructor", tmp_path_factory,
                           {"JUPYTERLAB_SETTINGS_DIR": _lab_settings(tmp_path_factory, autosave_s=AUTOSAVE_S)})
    try:
        page = _page(browser)
        page.goto(f"{base}/lab/tree/solutions/{STUDENT_CHAPTER}.py?token={TOKEN}", timeout=START_S * 1000)
        assert "Nbgrader" in _menubar(page)
        page.wait_for_selector(".jp-Notebook .jp-MarkdownCell", timeout=START_S * 1000)
        assert page.locator(".jp-FileEditor").count() == 0, "the source opened as plain text"
        dialogs = _await_kernel(page, f"{STUDENT_CHAPTER}.py")
        opened = time.monotonic()
        page.locator(".jp-Notebook .jp-Cell").first.click()  # focus, as an instructor reading it would
        page.wait_for_timeout(4 * AUTOSAVE_S * 1000)
        waited = time.monotonic() - opened
        page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").click()
        page.wait_for_timeout(500)
        _shot(page, "instructor-lab")
        assert source.read_bytes() == before, f"opening {source.name} in the instructor lab rewrote it"
        errors = [t for t in _accept_dialogs(page) if "Save" in t or "save" in t]
        assert not errors, f"the lab complained about saving: {errors}"
        print(f"instructor lab: {source.name} unchanged {waited:.0f} s after its kernel started "
              f"(autosave every {AUTOSAVE_S} s); dialogs seen: {dialogs}")
        assert requests.get(f"{base}/formgrader", params={"token": TOKEN}, timeout=30,
                            allow_redirects=False).status_code != 404
    finally:
        _stop(proc)
        assert source.read_bytes() == before, f"{source.name} changed while the instructor lab served it"


def test_feedback_page_shows_scores_and_reasons(browser, tmp_path):
    sub, out = tmp_path / "submitted", tmp_path / "out"
    wrong = next(ex for ch, ex in WRONG if ch == STUDENT_CHAPTER)
    write(sub, "wrong", STUDENT_CHAPTER, with_exercise(STUDENT_CHAPTER, wrong, WRONG[STUDENT_CHAPTER, wrong]))
    proc = profiling.graded_batch(subprocess.run, [*AUTOGRADE, str(sub), "--out", str(out)], out,
                                  cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    layout_points = sum(float(c.metadata["nbgrader"]["points"]) for c in read_source(STUDENT_CHAPTER).cells
                        if c.metadata.get("nbgrader", {}).get("grade"))
    page = _page(browser, height=1000)
    page.goto(graded_once.feedback("reference", STUDENT_CHAPTER).as_uri())  # the run's one grading of it
    text = page.locator("body").inner_text()
    assert f"{layout_points:g} / {layout_points:g} points" in text and "passed" in text
    assert "Why points were lost" not in text
    page.goto((out / "feedback" / "wrong" / f"{STUDENT_CHAPTER}.html").as_uri())
    text = page.locator("body").inner_text()
    assert f"0 / {layout_points:g} points" in text and "failed" in text
    reasons = page.locator(".reason").all_inner_texts()
    assert reasons and all(len(r.strip()) > 20 for r in reasons), reasons
    assert page.locator(".fail").first.is_visible()
    _shot(page, "instructor-feedback")
    assert not page.external


# --- lecturer ------------------------------------------------------------------------------

def _chapters_with_demos() -> list[str]:
    return [ch for ch in chapters()
            if any(c.cell_type == "code" and is_demo(c) for c in read_source(ch, demo_tags=True).cells)]


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    # Fast-mode measurements saved by an earlier run would make every first open a warm one.
    for saved in (demo.BUILD / demo.CACHE_DIR).glob("*-fast-*.pkl"):
        saved.unlink(missing_ok=True)
    # As lecturers see them: the figure checks of fast mode are tests/test_figures.py's, and a
    # dashboard that shows a check's error instead of its plot could not be driven here.
    base, proc, log = _serve("demo", tmp_path_factory, {"COURSE_CHECK_FIGURES": "0"})
    try:
        yield base, log
    finally:
        _stop(proc)


def test_demo_prints_its_url_and_lists_every_chapter(browser, demo_server):
    base, log = demo_server
    log.seek(0)
    assert base in log.read()
    page = _page(browser)
    page.goto(base + "/")
    links = page.locator("a.chapter")
    expected = _chapters_with_demos()
    assert [urlparse(h).path.rsplit("/", 1)[-1] for h in
            links.evaluate_all("links => links.map(a => a.href)")] == [f"{ch}.ipynb" for ch in expected]
    for ch, item in zip(expected, page.locator("li").all()):
        title, summary = demo.title_and_summary(read_source(ch))
        assert title in item.inner_text() and summary in item.inner_text()
    _shot(page, "demo-index")
    assert not page.external


TRIES = 2  # a dashboard that stalls gets one fresh page and kernel before the test fails


def test_every_dashboard_slider_redraws(browser, demo_server):
    """Each chapter's dashboard, one at a time: it renders offline and every control redraws.

    A dashboard used to stay at "Executing x of y" now and then (its last cell, the widget one,
    about one open in ten), waiting for an execute reply nbclient had missed while writing a
    captured output back to the kernel; slider_plot no longer gives it anything to write back
    (test_demo.py checks that). One that stalls anyway gets one fresh page and kernel, and every
    try's error is reported if none succeeds."""
    base, _ = demo_server
    times, loads, problems = {}, {}, []
    for ch in _chapters_with_demos():
        errors = []
        for attempt in range(1, TRIES + 1):
            page = _page(browser, width=1500, height=1000)
            start = time.perf_counter()
            page.goto(f"{base}/voila/render/{ch}.ipynb", wait_until="commit", timeout=START_S * 1000)
            try:
                times[ch], loads[ch] = _check_dashboard(page, ch, start)
                note = f" (try {attempt}, after {'; '.join(errors)})" if errors else ""
                print(f"{ch:<24} first open (measures, then saves) {loads[ch]:6.1f} s; "
                      f"redraw per control (s){note}: " + ", ".join(f"{k} {v:.2f}" for k, v in times[ch].items()))
                break
            except Exception as e:  # noqa: BLE001 - report every chapter, not only the first that fails
                errors.append(f"try {attempt}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                _shot(page, f"demo-{ch}-failed-{attempt}")
            finally:
                page.context.close()
        else:
            problems.append(f"{ch}: {'; '.join(errors)}")
        (ARTIFACTS / "redraw_seconds.json").write_text(json.dumps(times, indent=1))
    _record_loads("first open", loads)
    assert not problems, "\n".join(problems)


def _record_loads(kind: str, seconds: dict) -> None:
    """Seconds from opening a dashboard to its plots and controls, with the machine's load, in
    build/artifacts/load_seconds.json (not asserted: a busy machine is slower)."""
    path = ARTIFACTS / "load_seconds.json"
    loads = json.loads(path.read_text()) if path.exists() else {}
    loads[kind] = {"seconds": seconds, "load average (1, 5, 15 min)": os.getloadavg(), "cpus": os.cpu_count()}
    path.write_text(json.dumps(loads, indent=1))


PROGRESS_STALL_S = 90  # a dashboard's "Executing x of y" that has not moved for this long has stalled


def _wait_for_render(page) -> None:
    """Wait until Voila shows the rendered cells. Its progress line ("Executing x of y") moves
    within seconds in fast mode; one that stays the same for PROGRESS_STALL_S has stalled, and
    a page not rendered after DASHBOARD_S has too (TimeoutError either way)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    start = changed = time.monotonic()
    last = None
    while not page.locator("#rendered_cells").is_visible():
        progress = page.evaluate("() => document.body ? document.body.innerText : ''")
        now = time.monotonic()
        if progress != last:
            last, changed = progress, now
        if now - changed > PROGRESS_STALL_S or now - start > DASHBOARD_S:
            raise PlaywrightTimeout(f"Voila's page stayed at {' '.join(str(last).split())[:80]!r} for "
                                    f"{now - changed:.0f} s ({now - start:.0f} s since it opened)")
        page.wait_for_timeout(1000)


def _demo_count(chapter) -> int:
    return sum(1 for c in read_source(chapter, demo_tags=True).cells if c.cell_type == "code" and is_demo(c))


def _wait_for_plots(page, n_demos: int) -> None:
    """Every demo's plot and controls, or an error shown (a hidden cell's error is shown too): a
    dashboard that failed says so at once rather than after DASHBOARD_S."""
    page.wait_for_function(
        """([n, pattern]) => Array.from(document.querySelectorAll('.celltag_demo'))
               .filter(d => d.querySelector('.widget-output img') && d.querySelector('.course-control')).length >= n
             || Array.from(document.querySelectorAll("[data-mime-type='application/vnd.jupyter.stderr']"))
                  .some(o => new RegExp(pattern).test(o.innerText))""",
        arg=[n_demos, ERROR_TEXT.pattern], timeout=DASHBOARD_S * 1000, polling=100)


def _controls(cell):
    return cell.locator(".course-control > .widget-slider, .course-control > .widget-dropdown")


def _check_dashboard(page, chapter, start: float) -> tuple[dict[str, float], float]:
    _wait_for_render(page)
    n_demos = _demo_count(chapter)
    demos = page.locator(".celltag_demo")
    _wait_for_plots(page, n_demos)
    loaded = round(time.perf_counter() - start, 2)
    shown = _error_texts(page)
    assert not shown, f"the dashboard shows an error: {' '.join(shown[0].split())[:300]}"
    assert demos.count() == n_demos
    assert page.locator(".jp-Cell.celltag_hide").evaluate_all("cells => cells.every(c => c.offsetParent === null)"), \
        "hidden cells show"
    assert page.locator(".jp-CodeCell .jp-InputArea-editor, .jp-CodeCell .highlight").count() == 0, \
        "a dashboard shows code"
    assert page.locator("#course-bar #course-chapter").count() == 1, "the lecture bar is missing"
    times = {}
    for d in range(n_demos):
        cell = demos.nth(d)
        output = cell.locator(".widget-output").first
        controls = _controls(cell)
        assert controls.count() >= 1, "a demo without controls"
        for c in range(controls.count()):
            control = controls.nth(c)
            name = control.locator(".widget-label").first.inner_text().strip()
            times[f"{d + 1}:{name}" if n_demos > 1 else name] = round(_redraw_seconds(page, control, output), 3)
    errors = _error_texts(page) + [t for t in page.locator(".widget-output").all_inner_texts() if ERROR_TEXT.search(t)]
    assert not errors, errors[:3]
    demos.first.scroll_into_view_if_needed()
    _shot(page, f"demo-{chapter}")
    assert not page.external, f"fetched from the network: {page.external[:5]}"
    assert not page.console_errors, f"errors in the browser's console: {page.console_errors[:5]}"
    return times, loaded


# --- the lecture page ----------------------------------------------------------------------

# Warmed in the test: one demo with several controls, and a chapter with two demos.
LECTURE_CHAPTERS = ("ch00_memory", "ch08_quantization")


def _interactive_seconds(page, chapter, start: float) -> float:
    """From ``start`` until every demo of ``chapter`` shows its plot and controls."""
    _wait_for_render(page)
    _wait_for_plots(page, _demo_count(chapter))
    seconds = time.perf_counter() - start
    assert not _error_texts(page), _error_texts(page)[:2]
    return round(seconds, 2)


def _open(page, base, chapter) -> float:
    start = time.perf_counter()
    page.goto(f"{base}/voila/render/{chapter}.ipynb", wait_until="commit", timeout=START_S * 1000)
    return _interactive_seconds(page, chapter, start)


def _press_and_wait_for_redraw(page, key, output) -> float:
    before = _plot_src(output)
    start = time.perf_counter()
    page.keyboard.press(key)
    page.wait_for_function(
        "([el, before]) => { const img = el.querySelector('img'); return img && img.src && img.src !== before; }",
        arg=[output.element_handle(), before], timeout=DASHBOARD_S * 1000, polling=20)
    return time.perf_counter() - start


def _step_key(page) -> str:
    """The arrow that moves the selected control: back down from a slider at its maximum."""
    at_max = page.evaluate("""() => { const h = document.querySelector('.course-selected .noUi-handle');
        return !!h && h.getAttribute('aria-valuenow') === h.getAttribute('aria-valuemax'); }""")
    return "ArrowLeft" if at_max else "ArrowRight"


def _state(page) -> dict:
    return page.evaluate("""() => ({demo: document.body.dataset.courseDemo, control: document.body.dataset.courseControl,
        present: document.body.classList.contains('course-present'),
        selected: document.querySelectorAll('.course-selected').length,
        visibleDemos: Array.from(document.querySelectorAll('.celltag_demo')).filter(c => c.offsetParent !== null).length,
        visiblePrompts: Array.from(document.querySelectorAll('.jp-InputPrompt, .jp-OutputPrompt'))
                          .filter(p => p.offsetParent !== null).length})""")


def test_lecture_page_after_warm_up(browser, demo_server):
    """`grader demo --warm` on two chapters, then their lecture pages: open and reload times (in the
    log and build/artifacts/load_seconds.json, not asserted), the chapter selector, the keys (step,
    select a control, switch demos, reset) and the presentation view, with no error in the console."""
    import sys

    base, log = demo_server
    env = {**os.environ, "COURSE_FAST": "1", "OMP_NUM_THREADS": "1", "COURSE_CHECK_FIGURES": "0"}
    start = time.perf_counter()
    warm = subprocess.run([sys.executable, "-m", "grader", "demo", "--warm", *LECTURE_CHAPTERS], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=START_S)
    assert warm.returncode == 0, warm.stdout[-2000:] + warm.stderr[-2000:]
    print(f"warm-up of {', '.join(LECTURE_CHAPTERS)}: {time.perf_counter() - start:.1f} s\n{warm.stdout}")
    for ch in LECTURE_CHAPTERS:
        assert re.search(rf"^{ch}\s+(saved|current)\s", warm.stdout, re.M), warm.stdout

    page = _page(browser, width=1500, height=1000)
    first, other = LECTURE_CHAPTERS
    loads = {f"{first} open": _open(page, base, first)}
    # The chapter selector lists every dashboard and switches to the one picked.
    options = page.locator("#course-chapter option").evaluate_all("os => os.map(o => o.value)")
    assert options == _chapters_with_demos()
    assert page.locator("#course-chapter").input_value() == first
    start = time.perf_counter()
    page.locator("#course-chapter").select_option(other)
    page.wait_for_url(f"**/voila/render/{other}.ipynb", timeout=60_000)
    loads[f"{other} from the selector"] = _interactive_seconds(page, other, start)
    start = time.perf_counter()
    page.reload(wait_until="commit")
    loads[f"{other} reload"] = _interactive_seconds(page, other, start)

    # Switching demos: n selects the second demo, whose plot the arrows then redraw; p goes back.
    demos = page.locator(".celltag_demo")
    assert demos.count() >= 2
    page.mouse.click(5, 400)  # focus the page, not a control
    page.keyboard.press("n")
    assert _state(page)["demo"] == "1"
    first_plot = _plot_src(demos.nth(0).locator(".widget-output").first)
    redraws = {"n, then an arrow": _press_and_wait_for_redraw(page, _step_key(page), demos.nth(1).locator(".widget-output").first)}
    assert _plot_src(demos.nth(0).locator(".widget-output").first) == first_plot, "the key moved the other demo"
    page.keyboard.press("p")
    assert _state(page)["demo"] == "0"

    # "]" asks for the next chapter (refused here: its kernel would measure it, on a cold cache).
    listed = _chapters_with_demos()
    wanted = f"**/voila/render/{listed[listed.index(other) + 1]}.ipynb"
    page.route(wanted, lambda route: route.abort())
    with page.expect_request(wanted, timeout=60_000):
        page.keyboard.press("]")
    console_errors = page.console_errors
    page.context.close()  # on the browser's error page of the refused request
    page = _page(browser, width=1500, height=1000)

    # The first chapter again: an arrow steps the first control, Down selects the next, r puts every
    # control back (the first plot again), in and out of the presentation view.
    loads[f"{first} reopened"] = _open(page, base, first)
    output = page.locator(".celltag_demo").first.locator(".widget-output").first
    initial = _plot_src(output)
    page.wait_for_function("() => document.querySelectorAll('.course-selected').length === 1", timeout=30_000)
    page.mouse.click(5, 400)
    assert _state(page)["control"] == "0"
    redraws["an arrow"] = _press_and_wait_for_redraw(page, _step_key(page), output)
    page.keyboard.press("ArrowDown")
    assert _state(page)["control"] == "1"
    selected = page.locator(".course-selected")
    assert selected.count() == 1 and selected.first.evaluate(
        "(row, second) => row === second", _controls(page.locator(".celltag_demo").first).nth(1)
        .locator("xpath=..").element_handle())
    redraws["Down, then an arrow"] = _press_and_wait_for_redraw(page, _step_key(page), output)
    redraws["r (reset)"] = _press_and_wait_for_redraw(page, "r", output)
    assert _plot_src(output) == initial, "reset did not bring back the default plot"
    notices = page.locator(".course-notice, .course-explain").count()

    page.keyboard.press("f")
    state = _state(page)
    assert state["present"] and state["visibleDemos"] == 1 and state["visiblePrompts"] == 0, state
    _shot(page, "demo-presentation")
    page.keyboard.press("f")
    page.wait_for_function("() => !document.body.classList.contains('course-present')", timeout=10_000)
    assert _state(page)["visibleDemos"] == _demo_count(first)

    console_errors += page.console_errors
    assert not console_errors, f"errors in the browser's console: {console_errors[:5]}"
    assert not page.external, f"fetched from the network: {page.external[:5]}"
    page.context.close()
    # A page that goes away shuts its kernel down (Voila's unload signal used to be refused: 403, no _xsrf).
    refused = [line for line in _server_tail(log, 200_000).splitlines() if "403 POST /voila/api/shutdown" in line]
    assert not refused, f"Voila refused a page's kernel shutdown: {refused[:2]}"
    _record_loads("after warm-up", loads)
    print("after warm-up, seconds until interactive: " + ", ".join(f"{k} {v:.1f}" for k, v in loads.items()))
    print("key presses, seconds until the plot changed: " + ", ".join(f"{k} {v:.2f}" for k, v in redraws.items()))
    print(f"{notices} explanation / notice lines on {first}'s demo; load average {os.getloadavg()}")
