"""``python -m grader autograde SUBMISSIONS --out OUT --scheduler ADDRESS``: grading spread over a Dask cluster.

The caller (this process) does what it does without a cluster, except grade: it finds and reads every
submission (``grader.intake``: links, devices and oversized files are refused here, unread), sends each
notebook's bytes to the cluster as one task, and writes every result itself (grades.csv, the gradebook,
feedback, timing): it stays the single writer, so SQLite works and nothing is written twice. Each Dask
worker process grades with a judge and a fork server of its own, started inside it on its first task
(``grader.autograde.grade_notebook``; the sandbox's isolation is that of a local run: root, namespaces,
cgroups, seccomp). Grading a submission writes nothing outside the sandbox's own processes, so when a
worker dies mid-task Dask runs the task again on another worker and the caller still receives one result.

Setting up several machines (each grading machine needs the repository at the caller's commit, its
virtual environment (``make lab`` or ``make test`` creates ``.venv``), Linux, root, cgroups and libseccomp;
the scheduler needs only the virtual environment)::

    scheduler$  .venv/bin/dask scheduler --port 8786
    grader1$    cd course-repo && sudo env PYTHONPATH=$PWD .venv/bin/dask worker \\
                    tcp://scheduler:8786 --nworkers 4 --nthreads 1 --memory-limit 0
    caller$     .venv/bin/python -m grader autograde submitted --out graded --scheduler tcp://scheduler:8786

One worker process per core (``--nworkers``, one thread each) grades one submission at a time. The
sandbox bounds each graded cell's memory and CPU itself (a cgroup per cell), so Dask's own memory limit,
sized for data, is switched off (``--memory-limit 0``). ``COURSE_FAST`` is the caller's: each task
carries it, and a worker's fork server is started with the value it was given.
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from grader.autograde import Result, _failed, _flag, autograde, grade_notebook, read_submission
from grader.notebooks import Layout
from grader.sandbox import judge
from grader.sandbox.limits import Limits

WINDOW_PER_THREAD = 2  # tasks in flight per worker thread: the others wait in this process, not in memory there
CONNECT_SECONDS = 20


def autograde_on(scheduler: str, submissions: Path, out: Path, unisolated: bool = False, log=print,
                 **options) -> list[Result]:
    """``grader.autograde.autograde`` with every submission graded on the workers of the Dask scheduler at
    ``scheduler`` (``options``: autograde's own). Raises RuntimeError, before anything is written, when the
    scheduler cannot be reached, has no workers, or a worker cannot isolate and ``unisolated`` is false."""
    cluster = Cluster(scheduler, unisolated=unisolated, log=log)
    try:
        return autograde(submissions, out, unisolated=unisolated, log=log, cluster=cluster, **options)
    finally:
        cluster.close()


class Cluster:
    """A Dask client whose every worker has started its sandbox (``unisolated``: or says why it cannot)."""

    def __init__(self, address: str, unisolated: bool = False, log=print):
        try:
            from distributed import Client
        except ImportError:
            raise RuntimeError("--scheduler needs Dask's distributed package: install the course's environment "
                               "(make test, or pip install -e .)") from None
        try:
            self.client = Client(address, timeout=CONNECT_SECONDS)
        except (OSError, TimeoutError, ValueError) as e:
            raise RuntimeError(f"could not reach the Dask scheduler at {address}: {e}") from None
        self.address, self.log, self.unisolated = address, log, unisolated
        started = time.perf_counter()
        try:
            self.flagged = self._start_workers()
            self.start_seconds = time.perf_counter() - started
        except BaseException:
            self.client.close()
            raise

    def _start_workers(self) -> bool:
        """Start the sandbox in every worker (one task each, on a worker thread: seconds of imports); True
        when grades must be flagged. Raises RuntimeError naming a worker that cannot grade."""
        workers = sorted(self.client.scheduler_info()["workers"])
        if not workers:
            raise RuntimeError(f"the Dask scheduler at {self.address} has no workers: start some with "
                               f"`dask worker {self.address}` (see grader/cluster.py)")
        fast = os.environ.get("COURSE_FAST")
        futures = {w: self.client.submit(start_sandbox, fast, key=f"grader-start-{w}-{uuid.uuid4().hex}",
                                         workers=[w], allow_other_workers=False, pure=False) for w in workers}
        flagged = False
        for w, fut in futures.items():
            try:
                isolated, why = fut.result()
            except Exception as e:  # noqa: BLE001 - one worker's failure named for the instructor
                raise RuntimeError(f"the grading sandbox could not start on Dask worker {w}: {e}") from None
            flagged |= _flag(isolated, why, self.unisolated, self.log, where=f"Dask worker {w}")
        self.log(f"grading on {len(workers)} Dask worker(s) of {self.address}")
        return flagged

    def grade(self, todo: list[tuple[str, str, Path]], layouts: dict[str, Layout], limits: Limits):
        """Results as they come back (in any order); a lost worker's tasks are run again by Dask."""
        from distributed import as_completed

        threads = sum(self.client.nthreads().values()) or 1
        window = max(4, WINDOW_PER_THREAD * threads)
        fast = os.environ.get("COURSE_FAST")
        pending = iter(todo)
        running = as_completed()
        owner = {}

        def submit_next() -> None:
            """Send the next readable submission; those missing or refused here go to ``ready`` on the way."""
            for student, chapter, path in pending:
                found = read_submission(student, chapter, path, layouts[chapter])
                if isinstance(found, Result):  # nothing to send
                    ready.append(found)
                    continue
                fut = self.client.submit(grade_task, student, chapter, found, layouts[chapter], limits, fast,
                                         self.unisolated, key=f"grade-{student}-{chapter}-{uuid.uuid4().hex}",
                                         pure=False)
                owner[fut.key] = (student, chapter, layouts[chapter])
                running.add(fut)
                return

        ready: list[Result] = []
        for _ in range(window):
            submit_next()
        while ready or not running.is_empty():
            while ready:
                yield ready.pop()
            if running.is_empty():  # and so nothing is left to send
                break
            fut = next(running)
            student, chapter, lay = owner.pop(fut.key)
            try:
                result, phases = fut.result()
            except Exception as e:  # noqa: BLE001 - this submission's zeros say why; the batch goes on
                reason = (f"internal grading error ({type(e).__name__}: the grading machines could not grade it); "
                          "please contact the instructor")
                self.log(f"{student}/{chapter}: {type(e).__name__}: {str(e)[:300]}")
                result, phases = Result(student, chapter, lay, _failed(lay, reason), note=reason), {}
            judge.add_phase_times(phases)
            fut.release()
            submit_next()
            yield result

    def close(self) -> None:
        """Stop the workers' sandboxes (their fork servers and cgroups; the workers stay up), then disconnect."""
        try:
            self.client.run(stop_sandbox, on_error="ignore")
        finally:
            self.client.close()


# --- what runs in each Dask worker ----------------------------------------------------------------

def start_sandbox(fast: str | None) -> tuple[bool, str]:
    """Start this worker process's fork server (in fast mode when the caller is); (isolated, why not)."""
    from grader.sandbox.supervisor import why_not_isolated

    _set_fast(fast)
    server = judge._server()
    return bool(server.isolated), "" if server.isolated else why_not_isolated(server)


def stop_sandbox() -> None:
    from grader.sandbox.supervisor import shutdown

    shutdown()


def grade_task(student: str, chapter: str, data: bytes, lay: Layout, limits: Limits, fast: str | None,
               unisolated: bool) -> tuple[Result, dict]:
    """Grade one submission here; the result and this task's share of the judge's phase times."""
    isolated, why = start_sandbox(fast)
    if not isolated and not unisolated:  # a worker that joined after the batch began
        raise RuntimeError(f"this worker cannot isolate submissions ({why})")
    before = judge.phase_times()
    result = grade_notebook(student, chapter, data, lay, limits)
    result.unisolated = not isolated
    after = judge.phase_times()
    spent = {k: (s - before.get(k, (0.0, 0))[0], c - before.get(k, (0.0, 0))[1]) for k, (s, c) in after.items()}
    return result, {k: v for k, v in spent.items() if v[1]}


def _set_fast(fast: str | None) -> None:
    if fast is None:
        os.environ.pop("COURSE_FAST", None)
    else:
        os.environ["COURSE_FAST"] = fast
