"""Where the suite's time goes: a pytest plugin every run loads (``conftest.py``).

Every test's wall time (setup, call and teardown) is summed per test file and per chapter (a test belongs to
the chapter its id names, ``ch04`` or ``ch04_partial_training``; others are shared), and the fixed costs are
timed where they happen: fork-server starts, kernel starts, notebook executions, browser and server starts,
and graded batches (``python -m grader autograde`` runs, with the seconds each chapter's submissions took,
from the batch's ``timing.csv``). Each process appends what it timed to
``build/test-runs/<run id>/profile/``; at the end the controller writes ``build/test-profile.md`` and
prints its head. Timing only: nothing here decides whether a test passes.

A chapter's marginal cost is what adding it costs the suite's wall time: its own tests' seconds, less the
graded batches that ran inside them, plus its submissions' share of every graded batch, divided by the
number of test workers (``-n``) that share the work.
"""
from __future__ import annotations

import csv
import functools
import json
import os
import re
import time
import uuid
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "build" / "test-runs"
# Where the table goes (a test that runs pytest itself points it elsewhere), and every test's seconds beside it.
REPORT = Path(os.environ.get("COURSE_TEST_PROFILE") or ROOT / "build" / "test-profile.md")
CHAPTER_RE = re.compile(r"(?<![a-z0-9])(ch\d\d)(?:_[a-z0-9]+(?:_[a-z0-9]+)*)?")


def _run_dir() -> Path:
    return RUNS / (os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"solo-{os.getpid()}")


def chapter_of(text: str) -> str:
    """``ch04`` for a test id or label that names chapter 4; ``shared`` when none is named."""
    m = CHAPTER_RE.search(text or "")
    return m.group(1) if m else "shared"


def record(kind: str, label: str, seconds: float, **extra) -> None:
    """Append one fixed cost (``kind``: what it is; ``label``: which one) of this process to the run's profile,
    with the test that paid it."""
    out = _run_dir() / "profile"
    out.mkdir(parents=True, exist_ok=True)
    entry = {"kind": kind, "label": label, "seconds": round(seconds, 3),
             "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0], **extra}
    with (out / f"costs-{os.getpid()}.jsonl").open("a") as f:
        f.write(json.dumps(entry) + "\n")


@contextmanager
def cost(kind: str, label: str = ""):
    """Time the body as one fixed cost."""
    start = time.monotonic()
    try:
        yield
    finally:
        record(kind, label, time.monotonic() - start)


def graded_batch(run, argv: list[str], out: Path | None, **kwargs):
    """``run(argv, **kwargs)`` (``subprocess.run`` or a stand-in) for a ``python -m grader autograde`` batch,
    timed, with the seconds each chapter's submissions took read from ``OUT/timing.csv``."""
    start = time.monotonic()
    try:
        return run(argv, **kwargs)
    finally:
        per_chapter: dict[str, float] = defaultdict(float)
        workers = int(argv[argv.index("--workers") + 1]) if "--workers" in argv else 1
        timing = Path(out) / "timing.csv" if out is not None else None
        graded = 0
        if timing is not None and timing.exists():
            with timing.open(newline="") as f:
                for row in csv.DictReader(f):
                    per_chapter[chapter_of(row["chapter"])] += float(row["seconds"])
                    graded += 1
        record("graded batch", f"{graded} submissions, {len(per_chapter)} chapters, {workers} worker(s)",
               time.monotonic() - start, workers=workers, chapters=dict(per_chapter))


def _timed(kind: str, label_of):
    def wrap(fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            with cost(kind, label_of(*args, **kwargs)):
                return fn(*args, **kwargs)
        return timed
    return wrap


def _timed_async(kind: str, label_of):
    def wrap(fn):
        @functools.wraps(fn)
        async def timed(*args, **kwargs):
            with cost(kind, label_of(*args, **kwargs)):
                return await fn(*args, **kwargs)
        return timed
    return wrap


def _notebook_name(client, *args, **kwargs) -> str:
    path = (getattr(client, "resources", None) or {}).get("metadata", {}).get("path", "")
    title = client.nb.get("metadata", {}).get("title", "") if getattr(client, "nb", None) else ""
    return str(title or path or "")


def _install_timers() -> None:
    """Time the fixed costs that happen inside libraries: fork-server starts, kernel starts, notebook runs,
    browser launches."""
    try:
        from grader.sandbox import supervisor
    except ImportError:  # pytest run outside the course (the plugin's own tests)
        supervisor = None
    if supervisor is not None and not getattr(supervisor._Server.__init__, "_profiled", False):
        init = supervisor._Server.__init__
        supervisor._Server.__init__ = _timed("fork server start", lambda self, mode, *a, **k: str(mode))(init)
        supervisor._Server.__init__._profiled = True
    try:
        import nbclient
        from nbclient.util import run_sync
    except ImportError:
        return
    client = nbclient.NotebookClient
    if not getattr(client.async_execute, "_profiled", False):
        client.async_start_new_kernel = _timed_async("kernel start", _notebook_name)(client.async_start_new_kernel)
        client.async_execute = _timed_async("notebook execution", _notebook_name)(client.async_execute)
        client.async_execute._profiled = True
        client.start_new_kernel = run_sync(client.async_start_new_kernel)
        client.execute = run_sync(client.async_execute)
    try:
        from playwright.sync_api import BrowserType
    except ImportError:
        return
    if not getattr(BrowserType.launch, "_profiled", False):
        BrowserType.launch = _timed("browser start", lambda self, *a, **k: "chromium")(BrowserType.launch)
        BrowserType.launch._profiled = True


class Profile:
    """The controller's half: every test's phases as the reports arrive, the table at the end."""

    def __init__(self, config):
        self.config = config
        self.tests: dict[str, float] = defaultdict(float)
        self.started = time.monotonic()

    def pytest_runtest_logreport(self, report):
        self.tests[report.nodeid] += report.duration

    def pytest_sessionfinish(self, session):
        if not self.tests:  # nothing ran (--collect-only, an error at collection): keep the last profile
            return
        costs: list[dict] = []
        try:
            costs = self.costs()
            text = self.table(time.monotonic() - self.started, costs)
        except Exception as e:  # noqa: BLE001 - a profile that cannot be written never fails the run
            text = f"# Test profile\n\nnot written: {type(e).__name__}: {e}\n"
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        REPORT.write_text(text)
        REPORT.with_suffix(".json").write_text(json.dumps({"tests": self.tests, "costs": costs}, indent=0))
        self.head = text

    def pytest_terminal_summary(self, terminalreporter):
        if getattr(self, "head", None):
            lines = self.head.splitlines()
            cut = next((i for i, line in enumerate(lines) if line.startswith("## Per test file")), len(lines))
            terminalreporter.write_sep("-", f"where the time went (all of it in {REPORT})")
            for line in lines[:cut]:
                terminalreporter.write_line(line)

    def costs(self) -> list[dict]:
        found = []
        for path in sorted((_run_dir() / "profile").glob("costs-*.jsonl")):
            for line in path.read_text().splitlines():
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue
        return found

    def table(self, wall: float, costs: list[dict]) -> str:
        workers = max(1, int(getattr(self.config.option, "numprocesses", 0) or 0))
        busy = sum(self.tests.values())
        per_file: dict[str, list] = defaultdict(lambda: [0, 0.0])
        per_chapter: dict[str, dict] = defaultdict(lambda: {"tests": 0, "own": 0.0, "batches_inside": 0.0,
                                                            "graded": 0.0})
        for nodeid, seconds in self.tests.items():
            f = per_file[nodeid.split("::")[0]]
            f[0] += 1
            f[1] += seconds
            ch = per_chapter[chapter_of(nodeid)]
            ch["tests"] += 1
            ch["own"] += seconds
        kinds: dict[str, list] = defaultdict(lambda: [0, 0.0])
        for c in costs:
            k = kinds[c["kind"]]
            k[0] += 1
            k[1] += c["seconds"]
            if c["kind"] == "graded batch":
                per_chapter[chapter_of(c["test"])]["batches_inside"] += c["seconds"]
                for ch, seconds in c.get("chapters", {}).items():
                    per_chapter[ch]["graded"] += seconds / max(1, c.get("workers", 1))
        out = [
            "# Test profile",
            "",
            f"Wall time {wall / 60:.1f} min; {len(self.tests)} tests; {busy / 60:.1f} min of test time over "
            f"{workers} worker(s). Written by `tests/profiling.py` at the end of every run.",
            "",
            "## Fixed costs",
            "",
            "| what | times | seconds | mean s |",
            "|---|---:|---:|---:|",
        ]
        for kind, (n, seconds) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
            out.append(f"| {kind} | {n} | {seconds:.0f} | {seconds / n:.1f} |")
        out += [
            "",
            "## Per chapter",
            "",
            "Own: the seconds of the tests that name the chapter, less the graded batches that ran inside them; "
            "graded: its submissions' share of the graded batches (seconds over the batch's workers); marginal: "
            f"(own + graded) / {workers} worker(s), what the chapter adds to the wall time.",
            "",
            "| chapter | tests | own s | graded s | marginal s |",
            "|---|---:|---:|---:|---:|",
        ]
        for ch, c in sorted(per_chapter.items(), key=lambda kv: (kv[0] == "shared", kv[0])):
            own = c["own"] - c["batches_inside"]
            marginal = "" if ch == "shared" else f"{(own + c['graded']) / workers:.0f}"
            out.append(f"| {ch} | {c['tests']} | {own:.0f} | {c['graded']:.0f} | {marginal} |")
        out += ["", "## Slowest fixed costs", "", "| kind | label | seconds | paid by |", "|---|---|---:|---|"]
        for c in sorted(costs, key=lambda c: -c["seconds"])[:25]:
            out.append(f"| {c['kind']} | {c['label']} | {c['seconds']:.1f} | `{c['test']}` |")
        out += ["", "## Per test file", "", "| file | tests | seconds | share |", "|---|---:|---:|---:|"]
        for name, (n, seconds) in sorted(per_file.items(), key=lambda kv: -kv[1][1]):
            out.append(f"| {name} | {n} | {seconds:.0f} | {100 * seconds / max(busy, 1e-9):.1f}% |")
        out += ["", "## Slowest tests", "", "| test | seconds |", "|---|---:|"]
        for nodeid, seconds in sorted(self.tests.items(), key=lambda kv: -kv[1])[:30]:
            out.append(f"| `{nodeid}` | {seconds:.1f} |")
        return "\n".join(out) + "\n"


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        # One run id for the controller and its workers (xdist gives it to the workers only), so that all
        # of them write into the same ``build/test-runs/<run id>/``.
        if getattr(config.option, "testrunuid", None) is None:
            config.option.testrunuid = uuid.uuid4().hex
        os.environ["PYTEST_XDIST_TESTRUNUID"] = config.option.testrunuid
    _install_timers()
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(Profile(config), "course-profile")
