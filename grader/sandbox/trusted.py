"""Which objects are trusted probes, and which objects may travel into the student's process.

The caller names one package of probes (``grader.probes``; see ``settings.py``). The sandbox
imports it by that name only, in the fork server, and trusts nothing else of its caller:

* a probe is a public function or class (its name does not start with ``_``) bound under its own
  name at the top level of the module of that package that defines it. The worker's table maps
  each such name to its object (:func:`probe_table`, built before any student code runs), and
  ``nb.apply`` sends only a name that :func:`probe_name` gave, so no other function can be run as
  trusted code, whatever the student's process or a check passes;
* of the modules that share the sandbox's top-level package (``grader``: the hidden tests and the
  rest of the grader), only the probe package's objects are pickled into a worker
  (:func:`may_travel`): the others hold what a student must never receive (reference
  implementations), and the worker could not import them anyway. Objects of ``__main__`` never
  travel either.
"""
from __future__ import annotations

import importlib
import pkgutil
import sys
from types import ModuleType

SANDBOX = __name__.rpartition(".")[0]  # this package: "grader.sandbox"
OWNER = SANDBOX.rpartition(".")[0]  # the package it belongs to: "grader"


def in_package(module, package: str | None) -> bool:
    """Whether the module named ``module`` is ``package`` or inside it."""
    return (isinstance(module, str) and bool(package)
            and (module == package or module.startswith(f"{package}.")))


def in_process(explains: tuple[str, ...] = (), restricts: tuple[str, ...] = ()):
    """Mark the keys of a probe's result that it measured inside the student's process (``grader/probes``, rule 7):
    ``explains`` may only explain a verdict (``handles.POISON_ENV`` replaces them in tests), ``restricts`` may take a
    point away, never award one; ``"*"`` stands for the whole result. Not itself a probe: the sandbox reads the marks."""
    def mark(fn):
        fn.in_process_explains = tuple(explains)
        fn.in_process_restricts = tuple(restricts)
        return fn
    return mark


def probe_modules(package: str) -> list[ModuleType]:
    """Import ``package`` and every module inside it (sub-packages included), in name order."""
    root = importlib.import_module(package)
    modules = [root]
    path = getattr(root, "__path__", None)
    if path is not None:
        for info in pkgutil.walk_packages(path, f"{package}."):
            modules.append(importlib.import_module(info.name))
    return modules


def probe_table(package: str) -> dict[str, object]:
    """{name: probe} over every module of ``package``: the public callables each module defines itself."""
    table: dict[str, object] = {}
    for module in probe_modules(package):
        for name, value in vars(module).items():
            if (callable(value) and getattr(value, "__module__", None) == module.__name__
                    and not name.startswith("_")):
                if table.get(name, value) is not value:
                    raise ImportError(f"two probes named {name!r} in {package}")
                table[name] = value
    return table


def probe_name(obj, package: str | None) -> str | None:
    """The name the worker's table knows ``obj`` by, or None when ``obj`` is no probe of ``package``."""
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__name__", None)
    if not in_package(module, package) or not isinstance(name, str) or name.startswith("_"):
        return None
    owner = sys.modules.get(module)
    if owner is None or vars(owner).get(name) is not obj or not callable(obj):
        return None
    return name


def may_travel(module: str, package: str | None) -> bool:
    """Whether an object defined in the module named ``module`` may be pickled into a worker."""
    if module.startswith("__main__"):
        return False
    return not in_package(module, OWNER) or in_package(module, SANDBOX) or in_package(module, package)
