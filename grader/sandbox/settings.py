"""What the sandbox takes from the grader that uses it; it imports nothing of that grader itself.

No module of ``grader.sandbox`` imports from ``grader`` outside ``grader.sandbox``
(``tests/test_import_graph.py``). What it needs of the course's grader, its caller hands it:

* the hidden checks to run: ``judge.run_checks(..., checks={grade_id: check})``, or, for a call
  that gives none, :attr:`Settings.checks` (a function from a chapter id to its checks);
* the package of trusted probes, :attr:`Settings.probes` (a package name): each fork server
  imports every module of it before it forks a worker, the worker runs only their public
  functions and classes, and ``nb.apply`` accepts nothing else (``trusted.py``);
* the top-level modules a submission may import beyond the base set (``rules.LIBRARIES``),
  :attr:`Settings.modules` (a set, or a function returning one, called when a fork server starts);
* the bounds of each problem, per call (``limits.Limits``).

``grader.api`` installs the course's own settings when it is imported (its registry of hidden
tests and ``grader.probes``); :func:`configure` replaces any of them.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Callable, Mapping

Checks = Mapping[str, Callable]  # grade_id -> check(nb)


@dataclass(frozen=True)
class Settings:
    checks: Callable[[str], Checks] | None = None  # chapter id -> its hidden checks
    probes: str | None = None  # the package of trusted probes, e.g. "grader.probes"
    modules: frozenset[str] | Callable[[], frozenset[str]] = frozenset()  # importable beyond the base set


_CURRENT = [Settings()]
_LOCK = threading.Lock()


def configure(**changes) -> Settings:
    """Replace the named settings (``checks=``, ``probes=``, ``modules=``); return the settings now in force."""
    with _LOCK:
        _CURRENT[0] = replace(_CURRENT[0], **changes)
        return _CURRENT[0]


def current() -> Settings:
    return _CURRENT[0]


def extra_modules() -> frozenset[str]:
    """The modules the caller allows beyond the base set (evaluated now if given as a function)."""
    modules = current().modules
    return frozenset(modules() if callable(modules) else modules)


def checks_of(chapter: str) -> Checks:
    """The hidden checks of ``chapter``, from the resolver the caller installed."""
    resolve = current().checks
    if resolve is None:
        raise RuntimeError("the sandbox was given no hidden checks: pass run_checks(..., checks=...) "
                           "or install a resolver with grader.sandbox.settings.configure(checks=...)")
    return resolve(chapter)
