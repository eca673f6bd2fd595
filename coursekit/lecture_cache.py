"""Saved measurements of a lecture dashboard, so that it opens in seconds (``make demo-warm``).

A dashboard (``python -m grader demo``) runs hidden cells (setup, reference implementations,
the measurements its sliders draw on) and then its demo cells. The first full run saves the
values that the demo cells read with :func:`save`; a later open of the same dashboard loads
them with :func:`load` and skips every cell marked :data:`SKIP_MARK`, so that only the demo
cells run. ``grader.demo`` names the file after a key of the chapter's source, the course's
packages and their versions, so a changed chapter is measured again instead of showing stale
numbers.

Functions and classes defined in the notebook are saved by value (cloudpickle), with the
notebook's global values they read; once loaded they read and write the notebook's own
namespace, as if their cells had run.
"""
from __future__ import annotations

import io
import os
import pickle
import sys
import tempfile
from pathlib import Path

import cloudpickle

# First line of a hidden cell whose effect the saved values replace.
SKIP_MARK = "# lecture-cache: skipped when the saved measurements are loaded"
_NAMESPACE = "notebook namespace"


class _Pickler(cloudpickle.Pickler):
    """cloudpickle that saves the notebook's namespace as a reference, not a copy: functions
    defined in the notebook get it back as their globals when loaded."""

    def __init__(self, file, namespace: dict):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._namespace = namespace

    def _function_getnewargs(self, func):
        code, base, name, defaults, closure = super()._function_getnewargs(func)
        if func.__globals__ is self._namespace:
            base = self._namespace
        return code, base, name, defaults, closure

    def persistent_id(self, obj):
        return _NAMESPACE if obj is self._namespace else None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, namespace: dict):
        super().__init__(file)
        self._namespace = namespace

    def persistent_load(self, pid):
        if pid != _NAMESPACE:
            raise pickle.UnpicklingError(f"unknown reference {pid!r}")
        return self._namespace


def _dumps(values: dict, namespace: dict) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, namespace).dump(values)
    return buffer.getvalue()


def save(path: str | os.PathLike, names: list[str], namespace: dict) -> list[str]:
    """Save ``namespace[name]`` for every name of ``names`` that is bound, atomically, to ``path``.

    Returns the names that could not be saved, each with the reason ("name: TypeError: ..."); then
    nothing is written, since a dashboard loading a partial set would fail later on a missing name.
    """
    values = {name: namespace[name] for name in names if name in namespace}
    try:
        data = _dumps(values, namespace)
    except Exception:  # noqa: BLE001 - find out which names, and say why
        problems = []
        for name, value in values.items():
            try:
                _dumps({name: value}, namespace)
            except Exception as e:  # noqa: BLE001
                problems.append(f"{name}: {type(e).__name__}: {str(e)[:200]}")
        return problems or ["(the values together): they pickle one by one but not together"]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from a server run by another user
    os.replace(tmp, path)  # a dashboard opened meanwhile reads the old file or the new one, never half
    return []


def load(path: str | os.PathLike, namespace: dict) -> bool:
    """Load the values saved at ``path`` into ``namespace`` and make the kernel skip the cells
    marked :data:`SKIP_MARK` from now on. False (and nothing changed) when there is no such file
    or it cannot be read; the dashboard then computes everything, as without a cache."""
    try:
        with open(path, "rb") as f:
            values = _Unpickler(f, namespace).load()
    except FileNotFoundError:
        return False
    except Exception as e:  # noqa: BLE001 - a damaged or foreign file costs time, never the dashboard
        print(f"saved measurements {path} not used ({type(e).__name__}: {e}); computing them", file=sys.stderr)
        return False
    namespace.update(values)
    _skip_marked_cells()
    return True


def _skip_marked_cells() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return

    def skip(lines: list[str]) -> list[str]:
        return ["pass\n"] if lines and lines[0].rstrip("\n") == SKIP_MARK else lines

    skip._lecture_cache = True
    transformers = shell.input_transformers_cleanup
    if not any(getattr(t, "_lecture_cache", False) for t in transformers):
        transformers.insert(0, skip)
