"""The gradebook in PostgreSQL (`autograde --db postgresql://...`), against a real server this file starts.

initdb into a temporary folder (as the ``postgres`` user, or ``nobody``, when run as root: initdb refuses root),
a server on a Unix socket only, a new database; stopped and removed afterwards. ch00's reference, blank and second
answers (the once-per-run batch's students) are graded into it by two processes at once, then compared with what
that batch wrote to SQLite; a re-grade must replace rows, not add them. Skipped with the reason where no PostgreSQL
binaries are found (Debian: `apt-get install postgresql`), unless REQUIRE_POSTGRES=1 (`.ci/run`): then it fails.
"""
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import ROOT, AUTOGRADE, UNISOLATED
import graded_once
import profiling
import second_submissions
from grader import gradebook, report
from grader.autograde import autograde
from grader.sandbox.handles import POISON_ENV
from submissions import blank, reference, with_outputs, write

pytestmark = pytest.mark.xdist_group("postgres")  # one server, one worker; the re-grade follows the batch
CHAPTER = "ch00_memory"
EXERCISE = "predict_training_memory"


def _bin_dir() -> Path | None:
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path).resolve().parent  # /usr/local/bin/pg_ctl may link to the version's own folder
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


@pytest.fixture(scope="module")
def server():
    """A URL of a new, empty database on a server started here (Unix socket only)."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        reason = "no PostgreSQL server binaries (pg_ctl, initdb) on PATH or in /usr/lib/postgresql/*/bin: " \
                 "`apt-get install postgresql` to run these tests"
        if os.environ.get("REQUIRE_POSTGRES") == "1":
            pytest.fail(f"REQUIRE_POSTGRES=1 but {reason}")
        pytest.skip(reason)
    as_user = {}
    home = Path(tempfile.mkdtemp(prefix="course-pg-"))
    if os.geteuid() == 0:  # initdb refuses root: the cluster belongs to an unprivileged user
        user = next((u for u in ("postgres", "nobody") if _exists(u)))
        entry = pwd.getpwnam(user)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        as_user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    with socket.socket() as s:  # the port only names the socket file; the server listens on no TCP address
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def run(*argv):
        return subprocess.run([str(bin_dir / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=120,
                              cwd=home, check=True, **as_user)

    with profiling.cost("postgres server", "initdb and start"):
        run("initdb", "-D", str(home / "data"), "--auth=trust", "--username=grader", "-E", "UTF8", "--no-sync")
        run("pg_ctl", "start", "-w", "-D", str(home / "data"), "-l", str(home / "log"),
            "-o", f"-k {home} -p {port} -c listen_addresses='' -c fsync=off")
        run("createdb", "-h", str(home), "-p", str(port), "-U", "grader", "gradebook")
    try:
        yield f"postgresql://grader@/gradebook?host={home}&port={port}"
    finally:
        subprocess.run([str(bin_dir / "pg_ctl"), "stop", "-m", "immediate", "-D", str(home / "data")],
                       capture_output=True, timeout=120, cwd=home, **as_user)
        shutil.rmtree(home, ignore_errors=True)


def _exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


def _autograde(sub, out, url):
    # As the once-per-run batch grades (its SQLite gradebook is the one compared with).
    return subprocess.Popen([*AUTOGRADE, str(sub), "--out", str(out), "--db", url], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, POISON_ENV: "1"})


def _finish(proc):
    stdout, stderr = proc.communicate(timeout=1500)
    assert proc.returncode == 0, stderr[-3000:]
    assert "could not be written" not in stderr, stderr[-3000:]
    return stdout


def _ours(contents: gradebook.Contents, students) -> dict:
    return {(s.student, s.chapter): (s.scores, s.flagged) for s in contents.submissions
            if s.chapter == CHAPTER and s.student in students}


@pytest.fixture(scope="module")
def graded(server, tmp_path_factory):
    """ch00's batch graded into the new database by two autograde processes at once (each its own OUT)."""
    sub_a, sub_b = tmp_path_factory.mktemp("submitted-a"), tmp_path_factory.mktemp("submitted-b")
    write(sub_a, "reference", CHAPTER, reference(CHAPTER))
    write(sub_a, "blank", CHAPTER, blank(CHAPTER))
    write(sub_b, "second", CHAPTER, with_outputs(second_submissions.notebook(CHAPTER)))
    outs = tmp_path_factory.mktemp("out-a"), tmp_path_factory.mktemp("out-b")
    with profiling.cost("graded batch", "ch00 into PostgreSQL, two processes at once"):
        procs = [_autograde(sub_a, outs[0], server), _autograde(sub_b, outs[1], server)]
        for proc in procs:
            _finish(proc)
    return server, tmp_path_factory, outs


def test_ch00_graded_by_two_processes_at_once_into_a_new_postgresql_gradebook_equals_sqlite(graded):
    url, _, outs = graded
    students = graded_once.STUDENTS
    in_postgres = gradebook.read(url)
    sqlite = gradebook.read(f"sqlite:///{graded_once.batch() / 'gradebook.db'}")
    assert set(_ours(in_postgres, students)) == {(s, CHAPTER) for s in students}, "a grader's writes were lost"
    assert _ours(in_postgres, students) == _ours(sqlite, students)
    assert in_postgres.chapters[CHAPTER] == sqlite.chapters[CHAPTER]
    scores = {s.student: (s.score, s.max_score) for s in in_postgres.submissions}
    assert scores["reference"][0] == scores["reference"][1] > 0 and scores["blank"][0] == 0
    # The class report reads the same gradebook (the feedback pages of the first grader's OUT).
    rep = report.gather(outs[0], db_url=url, progress=False)
    assert {(i.student, i.kind) for i in rep.issues} == set()
    assert sum(rep.failures[CHAPTER, f"test_{EXERCISE}"].values()) == 1  # blank's, read from its feedback


def test_a_ch00_regrade_replaces_its_rows_in_postgresql(graded):
    url, tmp_path_factory, _ = graded
    before = _row_counts(url)
    sub = tmp_path_factory.mktemp("regrade")
    write(sub, "blank", CHAPTER, reference(CHAPTER))  # blank hands in again, now with answers
    with profiling.cost("graded batch", "ch00 re-graded into PostgreSQL, in this process"):
        (result,) = autograde(sub, tmp_path_factory.mktemp("out-regrade"), db_url=url, progress=False,
                              log=lambda *args, **kwargs: None, unisolated=bool(UNISOLATED))
    assert result.score == result.max_score > 0
    assert _row_counts(url) == before, "a re-grade added rows instead of replacing them"
    after = {s.student: s for s in gradebook.read(url).submissions}
    assert after["blank"].score == after["blank"].max_score > 0
    assert after["second"].score == after["second"].max_score


def _row_counts(url) -> dict:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar()
                    for t in ("student", "submitted_assignment", "submitted_notebook", "grade", "comment")}
    finally:
        engine.dispose()


def test_a_grader_that_loses_the_race_for_a_ch00_row_finds_it_and_updates_it(tmp_path, monkeypatch):
    """Two graders add the same student at once: the one whose insert fails (nbgrader rolls back and raises
    InvalidEntry) retries, finds the row the other added, and goes on. Played on SQLite with two gradebooks."""
    from nbgrader.api import Gradebook, MissingEntry

    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    monkeypatch.setattr("nbgrader.api.get_alembic_version", lambda: "0")  # nbgrader runs `alembic heads` otherwise
    with gradebook.SharedGradebook(url) as first, gradebook.SharedGradebook(url) as second:
        real_find = Gradebook.find_student
        looked = []

        def find_student(self, student_id):
            if self is first and not looked:  # `first` looks before `second` inserts, and inserts after it
                looked.append(student_id)
                second.update_or_create_student(student_id)
                raise MissingEntry()
            return real_find(self, student_id)

        monkeypatch.setattr(Gradebook, "find_student", find_student)
        student = first.update_or_create_student("alice", first_name="Alice")
        assert looked == ["alice"] and student.first_name == "Alice"
        assert [s.id for s in second.students] == ["alice"]


def test_an_unreachable_ch00_gradebook_is_one_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match=r"the gradebook postgresql://grader:\*\*\*@/gradebook\?host=.* could not "
                                           r"be opened"):
        gradebook.SharedGradebook(f"postgresql://grader:secret@/gradebook?host={tmp_path}&port=1")
