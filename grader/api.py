"""How hidden tests are written, and how they run in both of their homes.

A hidden test is a function ``check(nb)`` in ``grader/hidden/<chapter_id>.py``, registered
under the grade_id of the notebook's test cell::

    @hidden_test("test_lora_linear")
    def check_lora_linear(nb):
        layer = nb.LoRALinear(base, 4, 8.0)     # the student's class, called with our inputs
        A = fetch(layer.lora_A)                  # bring a value back, then compare here
        assert_close(...)

``nb`` is the student's namespace. It comes in two kinds with the same interface:

* :class:`LocalNamespace` when a notebook runs its own hidden-test cell in-kernel
  (instructors executing ``solutions/``): objects are the real objects.
* ``grader.sandbox.judge.RemoteNamespace`` at autograde: the student's code lives in a
  sandboxed worker process; every name, attribute, call and method call returns a handle
  to an object that stays there, and only :func:`fetch` brings plain data back (tensors,
  numbers, strings, lists/tuples/dicts). All comparisons run in the judge, a process that
  never ran student code, so nothing a submission does to torch, builtins or the grader
  inside its own process can change a verdict.

Rules that keep a check valid in both kinds:
  - compare only fetched values, never handles (``fetch(y)``, not ``y``);
  - send data into the student's process with ``nb.put(tensor_or_module)`` when you need its
    ``.grad`` afterwards (objects passed as arguments are copied in);
  - arithmetic on the student's objects happens through method calls (``y.mul(g).sum()``),
    or run a trusted probe there with ``nb.apply(probes.fn, *args)`` (``grader.probes``, whose
    ``__init__`` states the rules a probe follows);
  - expected exceptions: ``nb.apply(probes.raised, fn, *args)`` returns the exception's class
    names (or None);
  - resource bounds come from outside the student's process: ``nb.memory(reset_peak=True)``, then
    the student's call, then ``nb.memory()``; the difference of ``held`` (resident + files) or of
    ``peak`` is what the process really holds (``grader.sandbox.meter``). Release the handles you
    no longer need (``del``) before reading: the worker drops them first. Probe measurements
    (saved bytes, FLOPs, op traces) are claims the student's code controls: teaching feedback,
    never the only ground for a point.
"""
from __future__ import annotations

import importlib
from typing import Callable

from grader.sandbox import settings as _sandbox
from grader.sandbox.codec import decode, encode

PROBES = "grader.probes"  # the package of trusted probes that nb.apply runs in the student's process

_REGISTRY: dict[str, dict[str, Callable]] = {}
_REQUIRES: dict[str, dict[str, tuple[str, ...]]] = {}


def hidden_test(grade_id: str, requires: tuple[str, ...] = ()):
    """Register ``check(nb)`` as the hidden test of the test cell ``grade_id``.

    ``requires`` names test cells whose passing this cell's points depend on, besides the
    exercise's first cell (see :func:`gates`)."""

    def deco(fn: Callable) -> Callable:
        chapter = fn.__module__.rsplit(".", 1)[-1]
        table = _REGISTRY.setdefault(chapter, {})
        if grade_id in table:
            raise ValueError(f"{chapter}: two hidden tests for {grade_id!r}")
        table[grade_id] = fn
        if requires:
            _REQUIRES.setdefault(chapter, {})[grade_id] = tuple(requires)
        return fn

    return deco


def checks_for(chapter: str) -> dict[str, Callable]:
    """All hidden tests of a chapter, keyed by test-cell grade_id."""
    importlib.import_module(f"grader.hidden.{chapter}")
    return dict(_REGISTRY.get(chapter, {}))


def _declared_imports() -> frozenset[str]:
    from grader.chapters import declared_imports  # reads the chapter sources: when a fork server starts

    return declared_imports()


# The sandbox imports nothing of the grader: it runs these hidden tests, loads these probes and lets
# submissions import what the chapters declare.
_sandbox.configure(checks=checks_for, probes=PROBES, modules=_declared_imports)


def gates(chapter: str, lay) -> dict[str, tuple[str, ...]]:
    """test cell -> the test cells that must pass for its points to count.

    An exercise's first test cell grades its core (values and gradients); its other cells grade
    further properties (memory, FLOPs, edge cases, errors) of an implementation that computes
    the right thing, so they count once the first one passes: code that does nothing, or
    always raises, collects no points on them. A hidden test may add cells with ``requires``.
    """
    checks_for(chapter)
    extra = _REQUIRES.get(chapter, {})
    found: dict[str, tuple[str, ...]] = {}
    for exercise in lay.exercises:
        cells = lay.tests_of(exercise)
        for gid in cells:
            needs = ([cells[0]] if gid != cells[0] else []) + [g for g in extra.get(gid, ()) if g != gid]
            if needs:
                found[gid] = tuple(dict.fromkeys(needs))
    return found


def fetch(value):
    """Bring a value back as plain data (tensors detached and copied).

    Works identically on local objects and on remote handles; anything that is not plain
    data (a module, a function) raises ``grader.sandbox.codec.NotTransferable``.
    """
    fetcher = getattr(type(value), "_fetch_remote", None)
    if fetcher is not None:
        return fetcher(value)
    return decode(encode(value))


class LocalNamespace:
    """The student's definitions when the check runs inside the notebook's own kernel."""

    _pinned = False  # glibc's mmap threshold, pinned once per process (see grader.sandbox.meter)

    def __init__(self, namespace: dict):
        self._ns = namespace

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str):
        try:
            return self._ns[name]
        except KeyError:
            raise NameError(f"the notebook does not define {name!r}: did you run its exercise cell?") from None

    def put(self, value):
        return value

    def apply(self, fn: Callable, *args, **kwargs):
        return fn(*args, **kwargs)

    def baseline_held(self):
        """Not known in-kernel (see ``RemoteNamespace.baseline_held``)."""
        return None

    def exercise_cells_held(self):
        """Not known in-kernel (see ``RemoteNamespace.exercise_cells_held``)."""
        return None

    def setup_cells_held(self):
        """Not known in-kernel (see ``RemoteNamespace.setup_cells_held``)."""
        return None

    def memory(self, reset_peak: bool = False):
        """What this process holds now (see ``RemoteNamespace.memory``)."""
        import gc

        from grader.sandbox import meter

        if not LocalNamespace._pinned:
            meter.pin_mmap_threshold()
            LocalNamespace._pinned = True
        gc.collect()
        if reset_peak:
            meter.reset_peak()
        return meter.read()

    def cpu_time(self) -> float:
        """CPU seconds this process has used, all its threads (see ``RemoteNamespace.cpu_time``)."""
        import time

        return time.process_time()


def run_hidden(chapter: str, grade_id: str, namespace: dict) -> None:
    """Run one hidden test in-kernel (used by the hidden-test region of solution notebooks)."""
    checks = checks_for(chapter)
    if grade_id not in checks:
        raise KeyError(f"{chapter} has no hidden test {grade_id!r}")
    checks[grade_id](LocalNamespace(namespace))
