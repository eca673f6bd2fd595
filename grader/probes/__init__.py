"""Trusted probes: helpers a hidden test runs inside the student's process, ``nb.apply(probes.fn, ...)``.

One module per chapter that has probes, named like the chapter and its hidden tests
(``ch10_flash_attention.py`` beside ``grader/hidden/ch10_flash_attention.py``), and ``shared.py``
for the helpers every chapter uses. This package re-exports every name its modules define, so a
hidden test writes ``from grader import probes`` and ``probes.ch10_trace``. It finds its modules
itself: a new chapter only adds its module.

The rules a probe follows, and why:

1. **It only gathers data.** A probe reports shapes, flags, values, measurements and the names of
   exceptions; every comparison, threshold and verdict lives in the hidden test, in the judge.
   What a probe measures inside the student's process is a claim that code can hide from or edit:
   teaching feedback, never the only ground for a point (``grader/sandbox/judge.py``, items 1 and 8).
2. **It never holds a secret.** The student's process can read this package's files and memory:
   no reference solutions, expected values or hidden-test data here, and never an import of
   ``grader.hidden``, ``solutions`` or any module that holds them (``tests/test_import_graph.py``
   checks the imports). A hidden test likewise sends only inputs, never reference values.
3. **It is public and defined at the top level of a module of this package.** The judge sends a
   probe's name, not the function: ``nb.apply`` accepts only an object bound under its own
   ``__name__`` at the top level of the module of this package that defines it, with a name that
   does not start with ``_`` (``grader.sandbox.trusted``), and the worker runs only what its table
   of this package's public functions and classes maps that name to. Private helpers start with
   ``_`` and are never applied directly. Chapter probes and their helpers carry the chapter's
   prefix (``ch10_trace``, ``_ch10_trace``); every name is unique across the package, which
   refuses to import otherwise.
4. **It is loaded before any student code runs.** The fork server imports this package and every
   module in it before it forks a worker (``grader.sandbox.forkserver``); a worker can import no
   ``grader`` module itself. So classes a check sends into the worker (``ch03_MicroBatchModel``,
   ``ch00_meta.Linear``) are unpickled there by reference to a module already loaded, and
   module-level state (``ch10_flash_attention``'s snapshot of Triton's interpreter) is taken
   before the student's code could change anything. Imports inside a probe's body run in the
   worker, under its audit hook: only the standard library and the course's libraries (torch,
   numpy, triton), never ``grader``.
5. **It relies only on what the integrity check watches.** Before every ``nb.apply`` the worker
   compares torch, coursekit, grader, builtins and a few standard modules with the fork server's
   snapshot (``grader.sandbox.integrity``). A probe that relies on anything else checks it itself,
   as ``ch10_triton_run`` does for Triton's interpreter.
6. **It treats its arguments as the student's.** Objects a check passes may be the student's own
   (methods that lie, ``__getattr__`` that raises): call what torch defines on them where it
   matters (``torch.amp.GradScaler.get_scale(scaler)``, ``dict.get(optimizer.state, p)``),
   report exceptions rather than let them decide, and hand back plain data that
   ``grader.sandbox.codec`` encodes (tensors detached and cloned, numbers, strings, lists,
   tuples, dicts, None).
7. **It says what it measures inside the student's process.** A probe that reports bytes saved for backward,
   FLOPs, op traces or the calls it saw marks those keys with ``grader.sandbox.trusted.in_process``: ``explains`` for what may
   only explain a verdict an outside reading reached (the judge's tests replace them with values that fail
   any check that consults them, ``grader.sandbox.handles.POISON_ENV``), ``restricts`` for traces that may
   take a point away but never award one (a forbidden operator seen, a layer run out of order). The grading
   table in ``grader/README.md`` names every restriction and the outside reading beside it.
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def _defined_in(module: ModuleType) -> dict[str, object]:
    """The names ``module`` binds to what it defines itself (functions, classes, data), not to imports."""
    found = {}
    for name, value in vars(module).items():
        if name.startswith("__") or isinstance(value, ModuleType):
            continue
        if getattr(value, "__module__", module.__name__) == module.__name__:
            found[name] = value
    return found


def _export() -> tuple[str, ...]:
    """Import every module of this package and bind here each name it defines; return the modules."""
    names: dict[str, str] = {}
    modules = []
    for info in pkgutil.iter_modules(__path__, __name__ + "."):
        module = importlib.import_module(info.name)
        modules.append(info.name)
        for name, value in _defined_in(module).items():
            if name in names or name in globals():
                where = names.get(name, __name__)
                raise ImportError(f"{info.name} defines {name!r}, which {where} already binds: "
                                  f"every name in {__name__} is unique")
            names[name] = info.name
            globals()[name] = value
    return tuple(modules)


MODULES = _export()  # the modules of this package, in name order
