"""Hostile submissions: each pairs a wrong implementation with a trick; none may score full marks.

Every case in ``tests/hostile/`` runs through :func:`grader.sandbox.judge.run_checks` on the toy
chapter ``ch99_toy``. Besides the score, the tests check that files outside the worker (a
canary gradebook, another submission, a course file) are unchanged, that no connection reached
a socket the judge listens on, that no hidden-test source reaches a reason, and that nothing the
worker started outlives the problem. The Python-level cases run a second time in ``plain``
mode (no mount namespace) to show that the audit hook stops them on its own.
"""
from __future__ import annotations

import dataclasses
import os
import runpy
import socket
from pathlib import Path

import pytest
import toy_chapter as toy

from grader.api import checks_for
from grader.sandbox import judge

HOSTILE = Path(__file__).with_name("hostile")
CASES = sorted(p.stem for p in HOSTILE.glob("*.py") if p.stem != "wrong_impl")
WRONG = runpy.run_path(str(HOSTILE / "wrong_impl.py"))["WRONG"]
THREATS = {"monkeypatch", "later cells", "grader modules", "read secrets", "write", "resources"}
LIMITS = judge.Limits(wall_seconds=8.0, memory_bytes=3 * 1024**3, output_bytes=64 * 1024,
                      max_processes=32)


def load(name: str) -> dict:
    return runpy.run_path(str(HOSTILE / f"{name}.py"))


@pytest.fixture(scope="module", autouse=True)
def chapter():
    toy.register()


@pytest.fixture
def targets(tmp_path):
    """Canary files a hostile case may try to change, and a socket it may try to reach."""
    course = tmp_path / "course"
    other = tmp_path / "submitted" / "other_student" / "ch99_toy"
    mine = tmp_path / "submitted" / "student" / "ch99_toy"
    for d in (course, other, mine):
        d.mkdir(parents=True)
    files = {course / "gradebook.db": b"GRADEBOOK-CANARY", course / "ch99_toy.ipynb": b"COURSE-CANARY",
             other / "notebook.ipynb": b"OTHER-SUBMISSION-CANARY", mine / "notebook.ipynb": b"{}"}
    for path, data in files.items():
        path.write_bytes(data)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    yield {"@GRADEBOOK@": str(course / "gradebook.db"), "@COURSE_FILE@": str(course / "ch99_toy.ipynb"),
           "@OTHER_SUBMISSION@": str(other), "@PORT@": str(listener.getsockname()[1]),
           "submission": mine, "files": files, "listener": listener}
    listener.close()


def program_for(case: dict, targets: dict) -> list[str]:
    trick = case["TRICK"]
    for key, value in targets.items():
        if key.startswith("@"):
            trick = trick.replace(key, value)
    wrong = case.get("WRONG", WRONG)[toy.CHAPTER]
    return toy.program(wrong, trick)


def assert_nothing_escaped(targets: dict, outcomes: dict) -> None:
    for path, data in targets["files"].items():
        assert path.read_bytes() == data, f"{path} was changed"
    assert sorted(p.name for p in targets["files"]) == sorted(
        p.name for p in Path(targets["@GRADEBOOK@"]).parents[1].rglob("*") if p.is_file()), \
        "files were added or removed next to the canaries"
    with pytest.raises(BlockingIOError):
        targets["listener"].accept()
    reasons = "\n".join(o.reason for o in outcomes.values())
    assert toy.canary() not in reasons
    for line in toy.hidden_source().splitlines():
        if len(line.strip()) > 30:
            assert line.strip() not in reasons, "a reason quotes the hidden tests"
    assert not _leftover_processes(targets["@PORT@"]), "a worker's process outlived its problem"


def _leftover_processes(port: str) -> list[str]:
    """Processes this test's hostile case started (``sleep 1<port>``) that are still alive."""
    left = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes() if entry.isdigit() else b""
        except OSError:
            continue
        if cmdline == f"/usr/bin/sleep\0" "1{port}\0".encode():
            left.append(entry)
    return left


def run(program, targets, mode=None, monkeypatch=None, case=None):
    """``case``'s ``CPU_SECONDS``, when it sets them, replace the CPU-time limit of LIMITS."""
    if mode is not None:
        default = judge._server
        monkeypatch.setattr(judge, "_server", lambda m=None: default(mode))
    limits = LIMITS if case is None or "CPU_SECONDS" not in case else \
        dataclasses.replace(LIMITS, cpu_seconds=float(case["CPU_SECONDS"]))
    return judge.run_checks(toy.CHAPTER, program, toy.GRADE_IDS, limits, checks=checks_for(toy.CHAPTER))


def _params(plain: bool):
    params = []
    for name in CASES:
        case = load(name)
        if plain and "plain" not in case.get("MODES", ("chroot", "userns", "plain")):
            continue
        marks = [pytest.mark.slow] if case.get("SLOW") or plain else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.mark.parametrize("name", _params(plain=False))
def test_hostile_case_scores_below_full_marks(name, targets):
    case = load(name)
    mode = judge._server().mode
    if mode not in case.get("MODES", (mode,)):
        pytest.skip(f"{name} needs isolation mode {case['MODES']}, this machine runs {mode!r}")
    outcomes = run(program_for(case, targets), targets, case=case)
    assert set(outcomes) == set(toy.GRADE_IDS)
    assert not all(o.passed for o in outcomes.values()), outcomes
    assert_nothing_escaped(targets, outcomes)
    if "EXPECT" in case:
        assert any(case["EXPECT"] in o.reason for o in outcomes.values()), outcomes


@pytest.mark.parametrize("name", _params(plain=True))
def test_hostile_case_is_stopped_by_the_audit_hook_alone(name, targets, monkeypatch):
    case = load(name)
    outcomes = run(program_for(case, targets), targets, mode="plain", monkeypatch=monkeypatch, case=case)
    assert not all(o.passed for o in outcomes.values()), outcomes
    assert_nothing_escaped(targets, outcomes)
    if "EXPECT" in case:
        assert any(case["EXPECT"] in o.reason for o in outcomes.values()), outcomes


@pytest.mark.parametrize("mode", [None, pytest.param("plain", marks=pytest.mark.slow)])
def test_honest_submission_scores_full_marks(mode, targets, monkeypatch):
    outcomes = run(toy.program(toy.SOLUTION), targets, mode, monkeypatch)
    assert all(o.passed and o.reason == "" for o in outcomes.values()), outcomes
    assert_nothing_escaped(targets, outcomes)


@pytest.mark.parametrize("mode", [None, pytest.param("plain", marks=pytest.mark.slow)])
def test_blank_submission_scores_zero(mode, targets, monkeypatch):
    outcomes = run(toy.program(toy.BLANK), targets, mode, monkeypatch)
    assert not any(o.passed for o in outcomes.values()), outcomes
    assert all("NotImplementedError" in o.reason for o in outcomes.values()), outcomes


def test_every_threat_class_has_two_cases_and_a_readme_entry():
    readme = (HOSTILE / "README.md").read_text()
    by_threat: dict[str, list[str]] = {}
    for name in CASES:
        case = load(name)
        assert {"THREAT", "DEFENCE", "TRICK"} <= set(case), name
        assert case["THREAT"] in THREATS, name
        by_threat.setdefault(case["THREAT"], []).append(name)
        assert f"`{name}`" in readme, f"{name} is missing from tests/hostile/README.md"
    assert set(by_threat) == THREATS
    assert all(len(names) >= 2 for names in by_threat.values()), by_threat
