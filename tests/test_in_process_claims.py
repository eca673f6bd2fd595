"""No point rests on what a probe measures inside the student's process.

Bytes saved for backward, FLOPs and op traces are counted in the process whose code is graded: that code can
hide from them or edit them. Probes mark such values (``grader.sandbox.trusted.in_process``); the once-per-run batch
(``graded_once``) grades the references and the second correct answers with every ``explains`` value replaced by
a claim that fails the cell of any check consulting it, and they must keep full marks. ``restricts`` values (a
forbidden operator seen, layers run out of order) may take a point away, never award one; each is named in the
grading table of ``grader/README.md``.
"""
from __future__ import annotations

import inspect
import re

import pytest

import graded_once
from grader import probes
from grader.api import fetch
from grader.notebooks import chapters
from grader.sandbox import handles
from grader.sandbox.handles import Fetched, InProcessClaim, InProcessClaimUsed, poisoned

# What only the student's process can count, and the probes that count it.
MEASURES = re.compile(r"saved_tensors\(|flop_counter\(|FlopCounterMode|TorchDispatchMode|register_forward_hook|"
                      r"register_forward_pre_hook|\bmeasure\(")


def _probes():
    return {name: fn for name, fn in vars(probes).items()
            if callable(fn) and not name.startswith("_") and getattr(fn, "__module__", "").startswith("grader.probes.")}


def _source(fn) -> str:
    """The probe's source with the private helpers of its module that it calls (ch10_trace runs _ch10_trace)."""
    text = inspect.getsource(fn)
    module = inspect.getmodule(fn)
    for helper in set(re.findall(r"\b(_ch\d\d_\w+)\(", text)):
        text += inspect.getsource(getattr(module, helper))
    return text


@pytest.mark.parametrize("name", sorted(_probes()))
def test_every_probe_that_measures_inside_says_so(name):
    fn = _probes()[name]
    if not MEASURES.search(_source(fn)):
        return
    marked = getattr(fn, "in_process_explains", ()) + getattr(fn, "in_process_restricts", ())
    assert marked, (f"probes.{name} measures inside the student's process (hooks, FLOP counter, dispatch trace) but "
                    "marks none of its result: decorate it with @in_process(explains=..., restricts=...)")
    source = inspect.getsource(fn) if "*" in marked else _source(fn)
    for key in marked:
        assert key == "*" or f'"{key}"' in source, f"probes.{name} marks {key!r}, which its result never holds"


def test_every_restriction_is_in_the_grading_table(root):
    table = (root / "grader" / "README.md").read_text()
    for name, fn in sorted(_probes().items()):
        for key in getattr(fn, "in_process_restricts", ()):
            assert f'{name}["{key}"]' in table, (f"probes.{name}[{key!r}] may take points away: the grading table "
                                                 "in grader/README.md must name it")


def test_a_claim_fails_any_use_but_its_repr():
    claim = InProcessClaim('probes.x(...)["activation_bytes"]')
    uses = [lambda c: c > 3, lambda c: c <= 3, lambda c: c == 3, lambda c: bool(c), lambda c: f"{c:,}",
            lambda c: str(c), lambda c: c + 1, lambda c: 2 * c, lambda c: int(c), lambda c: float(c),
            lambda c: sorted(c), lambda c: list(c), lambda c: len(c), lambda c: c[0], lambda c: 3 in c,
            lambda c: hash(c), lambda c: [1, 2][c], lambda c: -c]
    for use in uses:
        with pytest.raises(InProcessClaimUsed, match="measured inside the student's process"):
            use(claim)
    assert "activation_bytes" in repr(claim)


def test_poisoned_replaces_only_the_marked_keys():
    data = {"y": 1.5, "activation_bytes": 40, "grads": [1, 2]}
    got = poisoned(data, ("activation_bytes",), "probes.p")
    assert got["y"] == 1.5 and got["grads"] == [1, 2]
    assert isinstance(got["activation_bytes"], InProcessClaim)
    assert isinstance(poisoned([1, 2], ("*",), "probes.p"), InProcessClaim)
    assert poisoned([1, 2], ("k",), "probes.p") == [1, 2]  # no dict, no key: nothing to replace


class _Worker:
    """Stands for the judge's end of a worker: replies to one probe call with the data given."""

    probes = "grader.probes"

    def __init__(self, reply):
        self.reply = reply

    def request(self, message):
        return message

    def value(self, reply, blame):
        return Fetched(self.reply)


def test_the_judge_poisons_only_when_told(monkeypatch):
    fn = probes.ch04_saved_run
    reply = {"attached": True, "y": 0.0, "activation_bytes": 8, "saved": []}
    nb = handles.RemoteNamespace(_Worker(reply))
    monkeypatch.delenv(handles.POISON_ENV, raising=False)
    assert fetch(nb.apply(fn, None, None, None)) == reply
    monkeypatch.setenv(handles.POISON_ENV, "1")
    got = fetch(nb.apply(fn, None, None, None))
    assert got["attached"] is True and got["y"] == 0.0
    assert isinstance(got["activation_bytes"], InProcessClaim) and isinstance(got["saved"], InProcessClaim)
    assert fetch(nb.apply(fn, None, None, None)["attached"]) is True


@pytest.mark.parametrize("chapter", chapters())
def test_full_marks_rest_on_outside_readings_and_values(chapter):
    """Graded with in-process measurements poisoned (graded_once), the reference and the second correct answers
    keep every point."""
    for student in ("reference", "second"):
        rows = graded_once.rows(student, chapter)
        assert rows, (student, chapter)
        lost = [r["problem"] for r in rows if float(r["score"]) != float(r["max_score"])]
        assert not lost, (f"{student}'s {chapter} lost {lost} once values measured inside the process were "
                          f"replaced: a check consults them; see {graded_once.feedback(student, chapter)}")
