"""What a hidden check holds: handles on objects in the student's process, and their namespace.

A check receives a :class:`RemoteNamespace`; every name, attribute, item and call it asks for
comes back as a :class:`Handle` that names an object the worker keeps. Each request goes
through the judge's end of the worker's pipes (``rpc.Connection``); values come back only when
fetched, as plain data.
"""
from __future__ import annotations

import os
from typing import Protocol

from grader.sandbox import trusted

# Set to 1 (tests only) to replace what probes measure inside the student's process with claims that fail
# the cell the moment a check consults them: graded that way, a correct answer must keep full marks.
POISON_ENV = "GRADER_POISON_IN_PROCESS"

_COMPARE_HINT = "compare fetched values, not handles: use grader.api.fetch(...) first"


class WorkerLink(Protocol):
    """What handles need of the judge's end of a worker's pipes (``rpc.Connection`` provides it)."""

    probes: str | None  # the package of trusted probes the worker's fork server loaded

    def handle(self, message, label: str | None, blame: str | None = None) -> "Handle": ...

    def request(self, message) -> dict: ...

    def value(self, reply: dict, blame: str): ...

    def fetch(self, handle: "Handle"): ...

    def release_later(self, hid: int) -> None: ...

    def memory(self, reset_peak: bool = False): ...

    def settle(self) -> None: ...

    def cpu_used(self) -> float | None: ...

    cells_held: int | None  # what the exercise cells hold once run (None: not read)
    setup_held: int | None  # what the worker held once the setup cells ran (None: not read)

    def baseline_held(self) -> int | None: ...


class Handle:
    """An object that lives in the student's process; see ``grader.api`` for how to use one."""

    __slots__ = ("_worker", "_id", "_label", "__weakref__")

    def __init__(self, worker: "WorkerLink", hid: int, label: str):
        object.__setattr__(self, "_worker", worker)
        object.__setattr__(self, "_id", hid)
        object.__setattr__(self, "_label", label)

    def __getattr__(self, name: str) -> "Handle":
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._worker.handle(("getattr", self._id, name), f"{self._label}.{name}",
                                   blame=self._label)

    def __setattr__(self, name, value):
        raise TypeError("handles are read-only; call a method of the remote object instead")

    def __call__(self, *args, **kwargs) -> "Handle":
        return self._worker.handle(("call", self._id, args, kwargs), None, blame=self._label)

    def __getitem__(self, key) -> "Handle":
        return self._worker.handle(("getitem", self._id, key), f"{self._label}[...]",
                                   blame=self._label)

    def _fetch_remote(self):
        return self._worker.fetch(self)

    def __repr__(self) -> str:
        return f"<remote {self._label}>"

    def __bool__(self):
        raise TypeError(_COMPARE_HINT)

    def __eq__(self, other):
        raise TypeError(_COMPARE_HINT)

    __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__
    __hash__ = object.__hash__

    def __iter__(self):
        raise TypeError("fetch the value before iterating over it")

    def __reduce__(self):
        raise TypeError("a handle can only be sent back to the process it came from")

    def __del__(self):
        worker = self._worker
        if worker is not None:
            worker.release_later(self._id)


class RemoteNamespace:
    """The student's definitions in the worker; same interface as ``grader.api.LocalNamespace``."""

    def __init__(self, worker: "WorkerLink"):
        self._worker = worker

    def __getattr__(self, name: str) -> Handle:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str) -> Handle:
        return self._worker.handle(("global", str(name)), str(name), blame=str(name))

    def put(self, value) -> Handle:
        """Copy a judge value (tensor, module) into the student's process; return its handle."""
        return self._worker.handle(("put", value), type(value).__name__)

    def memory(self, reset_peak: bool = False):
        """What the student's process holds now, read by the judge from outside it (``meter.Memory``).

        ``reset_peak=True`` restarts the high-water mark that later readings report as ``peak``.
        """
        return self._worker.memory(reset_peak)

    def cpu_time(self) -> float | None:
        """CPU seconds the student's process has used so far, all its threads together, read by the judge
        from outside it (its cgroup; None: unknown). Handles the judge let go of are dropped first."""
        self._worker.settle()
        return self._worker.cpu_used()

    def setup_cells_held(self) -> int | None:
        """Bytes the student's process held once the release's setup cells had run, before any student code:
        the floor every later reading of the check is bounded against (None: not read)."""
        return self._worker.setup_held

    def exercise_cells_held(self) -> int | None:
        """Bytes the student's exercise cells hold once run: read from outside the process after the
        release's setup cells ran and again after the exercise cells (None: not read)."""
        return self._worker.cells_held

    def baseline_held(self) -> int | None:
        """Bytes the course's own exercise cells hold once run after the same setup cells (None: not known).

        Measured once per chapter in a worker of its own; beside :meth:`exercise_cells_held`, it says what
        the student's exercise cells hold beyond what the course's own do.
        """
        return self._worker.baseline_held()

    def apply(self, fn, *args, **kwargs):
        """Run the trusted probe ``fn`` in the student's process; return its result as plain data.

        ``fn`` must be a probe of the package the worker's fork server loaded (``grader.probes``;
        see ``trusted.probe_name``); only its name travels."""
        package = self._worker.probes
        name = trusted.probe_name(fn, package)
        if name is None:
            raise ValueError(f"nb.apply only runs functions of {package or 'the probe package'}, not {fn!r}")
        reply = self._worker.request(("apply", name, args, kwargs))
        result = self._worker.value(reply, blame=f"probes.{name}")
        explains = getattr(fn, "in_process_explains", ())
        if explains and os.environ.get(POISON_ENV) == "1":
            return Fetched(poisoned(_plain(result), explains, f"probes.{name}"))
        return result


class InProcessClaimUsed(AssertionError):
    """A hidden check consulted, on its way to a verdict, a value a probe measured inside the student's process."""


class InProcessClaim:
    """Stands for a value measured inside the student's process (``POISON_ENV``): every use but ``repr`` raises
    :class:`InProcessClaimUsed`, so a check that lets such a value decide a point fails where it does."""

    __slots__ = ("_what",)

    def __init__(self, what: str):
        self._what = what

    def _used(self, *_args, **_kwargs):
        raise InProcessClaimUsed(f"this check consulted {self._what}, measured inside the student's process: "
                                 "such a value may only explain a verdict an outside reading reached")

    __bool__ = __len__ = __iter__ = __getitem__ = __contains__ = __format__ = __str__ = _used
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = _used
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _used
    __floordiv__ = __rfloordiv__ = __mod__ = __neg__ = __abs__ = __int__ = __float__ = __index__ = _used

    def __repr__(self) -> str:
        return f"<in-process claim: {self._what}>"


class Fetched:
    """Data already fetched, standing where a handle was: ``fetch`` returns it, items give their parts."""

    __slots__ = ("_value",)

    def __init__(self, value):
        self._value = value

    def _fetch_remote(self):
        return self._value

    def __getitem__(self, key) -> "Fetched":
        return Fetched(self._value[key])


def _plain(value):
    fetcher = getattr(type(value), "_fetch_remote", None)
    return fetcher(value) if fetcher is not None else value


def poisoned(data, explains: tuple[str, ...], probe: str):
    """``data`` with the keys a probe marked as explaining (``"*"``: the whole result) replaced by claims."""
    if "*" in explains:
        return InProcessClaim(f"what {probe} reported")
    if not isinstance(data, dict):
        return data
    return {k: InProcessClaim(f'{probe}(...)["{k}"]') if k in explains else v for k, v in data.items()}
