"""``autograde --scheduler``: grading spread over a Dask cluster (``grader/cluster.py``).

A local cluster of 2 worker processes (one thread each) grades one batch of ch00_memory: the reference,
the blank release, the second correct answers, a wrong answer, hostile cases of ``tests/hostile/`` and a
notebook that intake refuses (a link).
While the batch runs, a worker that holds one of its submissions is killed: Dask runs its tasks again
elsewhere and no submission is lost. Grades must equal the single-machine batch's (``graded_once``).
"""
from __future__ import annotations

import csv
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, UNISOLATED
import graded_once
import second_submissions
from submissions import blank, reference, with_exercise, write
from wrong_submissions import WRONG

distributed = pytest.importorskip("distributed", reason="Dask's distributed package is not installed (make test installs it)")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cluster")]
CHAPTER = "ch00_memory"
HOSTILE = ("monkeypatch_checks_builtins", "modules_forge_reply")
KILL_DEADLINE_S = 600  # generous: a busy 2-core machine starts two fork servers at once


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster")
    sub, out = tmp / "submitted", tmp / "out"
    write(sub, "reference", CHAPTER, reference(CHAPTER))
    write(sub, "blank", CHAPTER, blank(CHAPTER))
    write(sub, "second", CHAPTER, second_submissions.notebook(CHAPTER))
    wrong = WRONG[(CHAPTER, "predict_training_memory")]
    write(sub, "wrong", CHAPTER, with_exercise(CHAPTER, "predict_training_memory", wrong))
    for name in HOSTILE:
        trick = runpy.run_path(str(ROOT / "tests" / "hostile" / f"{name}.py"))["TRICK"]
        write(sub, name.replace("_", "-"), CHAPTER, with_exercise(CHAPTER, "predict_training_memory",
                                                                 wrong + "\n\n" + trick))
    # Refused at intake by the caller (a link to another student's notebook): never sent to the cluster.
    linked = sub / "linked" / CHAPTER
    linked.mkdir(parents=True)
    (linked / f"{CHAPTER}.ipynb").symlink_to(sub / "reference" / CHAPTER / f"{CHAPTER}.ipynb")
    from grader.cluster import autograde_on

    os.environ.setdefault("COURSE_FAST", "1")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    client = distributed.Client(cluster)
    pids = client.run(os.getpid)
    done: dict = {}
    logged: list[str] = []

    def grade():
        started = time.perf_counter()
        try:
            done["results"] = autograde_on(cluster.scheduler_address, sub, out, progress=False,
                                           log=logged.append, unisolated=bool(UNISOLATED))
        except BaseException as e:  # noqa: BLE001 - re-raised by the test that reads it
            done["error"] = e
        done["seconds"] = time.perf_counter() - started

    runner = threading.Thread(target=grade)
    runner.start()
    killed = None
    deadline = time.monotonic() + KILL_DEADLINE_S
    while runner.is_alive() and killed is None and time.monotonic() < deadline:
        busy = {w: keys for w, keys in client.processing().items() if any(str(k).startswith("grade-") for k in keys)}
        if busy:
            worker = sorted(busy)[0]
            killed = (worker, [k for k in busy[worker] if str(k).startswith("grade-")])
            os.kill(pids[worker], signal.SIGKILL)
        time.sleep(0.05)
    runner.join(KILL_DEADLINE_S)
    client.close()
    cluster.close()
    print(f"cluster batch: {done.get('seconds', float('nan')):.1f} s for {len(list(sub.iterdir()))} submissions")
    with (out / "grades.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    return {"done": done, "killed": killed, "rows": rows, "out": out, "log": logged,
            "students": {p.name for p in sub.iterdir()}}


def _by_problem(rows, student):
    return {r["problem"]: (r["score"], r["max_score"]) for r in rows if r["student_id"] == student}


def test_cluster_ch00_grades_every_submission_though_a_worker_is_killed(batch):
    assert "error" not in batch["done"], batch["done"].get("error")
    assert batch["killed"], "no worker was grading a submission while the batch ran: nothing was killed"
    assert {r["student_id"] for r in batch["rows"]} == batch["students"]
    notes = [r.note for r in batch["done"]["results"]]
    assert not any("internal grading error" in n for n in notes), notes


def test_cluster_ch00_a_notebook_refused_at_intake_gets_zeros_and_the_reason(batch):
    linked = next(r for r in batch["done"]["results"] if r.student == "linked")
    assert linked.score == 0 and "symbolic link" in linked.note


def test_cluster_ch00_grades_equal_the_single_machine_run(batch):
    for student in ("reference", "blank", "second"):
        here = _by_problem(graded_once.rows(student, CHAPTER), student)
        assert here, f"the single-machine batch has no {student}"
        assert _by_problem(batch["rows"], student) == here, student


@pytest.mark.parametrize("student", ["wrong"] + [n.replace("_", "-") for n in HOSTILE])
def test_cluster_ch00_wrong_and_hostile_score_below_full_marks(batch, student):
    rows = [r for r in batch["rows"] if r["student_id"] == student]
    assert rows
    assert sum(float(r["score"]) for r in rows) < sum(float(r["max_score"]) for r in rows), f"{student}: full marks"


def test_cluster_ch00_results_are_written_once_by_the_caller(batch):
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{batch['out'] / 'gradebook.db'}") as gb:
        assert sorted(s.id for s in gb.students) == sorted(batch["students"])
        for r in batch["rows"]:
            assert gb.find_grade(r["problem"], CHAPTER, CHAPTER, r["student_id"]).score == float(r["score"])
    timing = (batch["out"] / "timing.csv").read_text().splitlines()
    assert len(timing) == 1 + len(batch["students"])


# "ch00" in every test's name: run alone, this file has the shared single-machine batch grade ch00 only.
def test_without_scheduler_ch00_batch_imports_no_dask():
    code = ("import sys, grader.__main__, grader.autograde; "
            "sys.exit(1 if any(m == 'distributed' or m.startswith('distributed.') for m in sys.modules) else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, "grading without --scheduler imported Dask" + proc.stderr[-2000:]


def test_an_unreachable_scheduler_is_one_clear_error_ch00_batch(monkeypatch):
    from grader import cluster

    monkeypatch.setattr(cluster, "CONNECT_SECONDS", 1)
    with pytest.raises(RuntimeError, match="could not reach the Dask scheduler at tcp://127.0.0.1:9"):
        cluster.Cluster("tcp://127.0.0.1:9")
