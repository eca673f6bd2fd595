"""Integrity of what trusted probes rely on: a snapshot before student code, a check after.

The fork server takes :func:`snapshot` after importing everything grading needs and before
any worker is forked, so it holds the objects as the libraries defined them. In the worker,
:func:`integrity_check` builds, before the first line of student code, the function that
compares against it; the worker runs that function before every ``nb.apply(probes.fn, ...)``
and fails the problem with "your code tried to replace ..." when anything watched changed.
"""
from __future__ import annotations

import sys
from types import ModuleType

# What the probes and the codec run on: these modules, and the mutable classes they define.
WATCHED_TREES = ("torch.autograd", "torch._C", "coursekit", "grader", "json", "collections")
WATCHED_MODULES = frozenset({
    "torch", "torch._tensor", "torch.nn.modules.module", "torch.nn.parameter", "torch.functional",
    "torch.utils.hooks", "torch.utils.flop_counter", "torch.utils._python_dispatch",
    "torch.overrides", "torch.cuda", "builtins", "math", "base64", "operator", "functools",
    "contextlib", "copyreg", "pickle", "io", "types",
})
# Names that honest code legitimately rebinds (caches, counters, configuration).
VOLATILE = frozenset({
    "__warningregistry__", "_filters_version", "__slotnames__", "_abc_impl", "_is_protocol",
    "__abstractmethods__", "__parameters__", "_lazy_modules", "__annotations__",
})
_HEAPTYPE = 1 << 9
_IMMUTABLE = 1 << 8


def _behaviour(value) -> bool:
    """Functions, classes, descriptors: what changes behaviour when rebound (data does not)."""
    kind = type(value)
    if kind in (int, float, complex, str, bytes, bool, type(None), tuple, frozenset, ModuleType):
        return False
    return callable(value) or hasattr(kind, "__get__")


def _is_watched(modname) -> bool:
    return isinstance(modname, str) and (modname in WATCHED_MODULES or any(
        modname == tree or modname.startswith(tree + ".") for tree in WATCHED_TREES))


def snapshot() -> dict:
    """What trusted probes rely on, taken in the fork server before any student code runs.

    For each watched module and each mutable class it defines: the objects bound to its names
    that carry behaviour (functions, classes, descriptors), and the set of its names.
    """
    owners: dict[int, tuple[object, str, dict, frozenset]] = {}
    for modname, mod in list(sys.modules.items()):
        if not isinstance(mod, ModuleType) or not _is_watched(modname):
            continue
        try:
            namespace = dict(vars(mod))
        except TypeError:
            continue
        _watch(owners, mod, modname, namespace)
        for value in namespace.values():
            # Only exact checks here: some module attributes warn or import when touched.
            if not issubclass(type(value), type) or id(value) in owners:
                continue
            flags = type.__dict__["__flags__"].__get__(value)
            module = type.__dict__["__module__"].__get__(value)
            if flags & _HEAPTYPE and not flags & _IMMUTABLE and _is_watched(module):
                label = f"{module}.{type.__dict__['__qualname__'].__get__(value)}"
                _watch(owners, value, label, dict(type.__dict__["__dict__"].__get__(value)))
    modules = {n: m for n, m in sys.modules.items() if _is_watched(n)}
    return {"owners": owners, "modules": modules}


def _watch(owners: dict, owner, label: str, namespace: dict) -> None:
    watched = {k: v for k, v in namespace.items() if k not in VOLATILE and _behaviour(v)}
    owners[id(owner)] = (owner, label, watched, frozenset(namespace))


def integrity_check(snap: dict):
    """A function returning the first watched name that was replaced, removed or added (or None).

    It is built before any student code runs and keeps what it uses in its closure, so that
    rebinding this module's globals or the builtins does not change what it checks.
    """
    modules, owners = dict(snap["modules"]), list(snap["owners"].values())
    registry = sys.modules  # the interpreter's own dict, even if sys.modules is rebound
    vars_, len_, list_, behaviour, volatile, missing = vars, len, list, _behaviour, VOLATILE, _MISSING

    def check() -> str | None:
        for name, mod in modules.items():
            if registry.get(name) is not mod:
                return f"sys.modules[{name!r}]"
        for owner, label, watched, names in owners:
            namespace = vars_(owner)
            for attr, value in watched.items():
                if namespace.get(attr, missing) is not value:
                    return f"{label}.{attr}"
            if len_(namespace) != len_(names):
                for attr, value in list_(namespace.items()):
                    if attr not in names and attr not in volatile and behaviour(value):
                        return f"{label}.{attr}"
        return None

    return check


_MISSING = object()
