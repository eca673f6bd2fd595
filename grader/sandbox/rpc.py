"""The protocol between the judge and a sandbox worker, and the judge's end of it.

Every message is one frame: a 4-byte big-endian length, then the body.

Requests (judge → worker) are pickled tuples; the judge is trusted, and objects a check passes
as arguments (tensors, an ``nn.Module`` it built) travel inside them. A :class:`Handle` inside
an argument travels as the persistent id ``("handle", id)``::

    ("program", cells, primes)       prime the worker (trusted probes), then run the cells in order
    ("cells", cells)                 run more cells after them
    ("global", name)                 a name the program defined          → handle
    ("getattr", id, name)            an attribute                        → handle
    ("getitem", id, key)             an item                             → handle
    ("call", id, args, kwargs)       a call                              → handle
    ("put", value)                   store a judge value                 → handle
    ("fetch", id)                    the object as plain data            → value
    ("apply", probe, args, kwargs)   run the trusted probe of that name  → value
    ("release", ids)                 forget handles                      → ok
    ("release", ids, "collect")      ... and run the garbage collector   → ok

Replies (worker → judge) are small JSON objects that :class:`Connection` validates field by
field; values inside them are :mod:`grader.sandbox.codec` text. Nothing the worker sends is
ever unpickled, and anything off-shape ends the problem as a malformed reply::

    {"t": "handle", "id": 7, "type": "LinearNoBias"}
    {"t": "value", "value": "<codec text>"}
    {"t": "error", "where": "student" | "missing" | "transfer" | "request",
     "types": ["ValueError", "Exception", ...], "message": "..."}
    {"t": "done", "errors": [{"cell": 3, "error": "SyntaxError: ..."}]}
    {"t": "ok"}

Before any reply the worker may send out-of-band notices, which the judge records::

    {"t": "violation", "what": "read grader/hidden/ch01_lora.py"}   a refused action
    {"t": "limit", "kind": "memory"}                                  the memory limit was hit
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import select
import threading
import time
from contextlib import contextmanager

from grader.sandbox import trusted
from grader.sandbox.codec import NotTransferable, decode, too_many_values
from grader.sandbox.handles import Handle, RemoteNamespace  # noqa: F401 - public here

HEADER_BYTES = 4
MAX_REPLY = 64 * 1024**2  # bytes; a larger reply is malformed
MAX_MESSAGE_CHARS = 500  # exception messages are cut to this length
MAX_NOTICES = 64  # out-of-band notices per problem; more is malformed

# --- one check's judge-side code at a time ------------------------------------------------------
# ``autograde --workers N`` grades in N threads of one judge process, and their hidden checks
# share process-wide state: above all torch's global RNG, which a check seeds right before a
# reference that draws from it (dropout). A check runs holding this lock, and lets go only while
# it waits for its worker, so the judge-side code of two checks never interleaves while the
# workers still run in parallel.
_JUDGE_LOCK = threading.Lock()
_held = threading.local()


@contextmanager
def judging():
    """Hold the judge lock for one check (released while waiting for the worker)."""
    _JUDGE_LOCK.acquire()
    _held.value = True
    try:
        yield
    finally:
        _held.value = False
        _JUDGE_LOCK.release()


@contextmanager
def waiting_for_worker():
    if not getattr(_held, "value", False):
        yield
        return
    _held.value = False
    _JUDGE_LOCK.release()
    try:
        yield
    finally:
        _JUDGE_LOCK.acquire()
        _held.value = True



def frame(body: bytes) -> bytes:
    return len(body).to_bytes(HEADER_BYTES, "big") + body


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_exact(fd: int, n: int) -> bytes | None:
    """Blocking read of exactly ``n`` bytes; None on end of file (worker side)."""
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> bytes | None:
    head = read_exact(fd, HEADER_BYTES)
    if head is None:
        return None
    body = read_exact(fd, int.from_bytes(head, "big"))
    return body


class Deadline(Exception):
    """The worker did not answer before the problem's wall-clock deadline."""


class CpuLimit(Exception):
    """The worker used up the CPU time the problem allows."""


class Closed(Exception):
    """The worker closed its end (it exited or was killed)."""


class TooLarge(Exception):
    """The worker announced a reply larger than :data:`MAX_REPLY`."""


def read_exact_until(fd: int, n: int, wait) -> bytes:
    """Read exactly ``n`` bytes, judge side. ``wait()`` says how long the next poll may block, or
    raises (:class:`Deadline`, :class:`CpuLimit`) once the worker's time is up."""
    chunks, left = [], n
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while left:
        if not poller.poll(wait() * 1000):
            continue  # the next wait() decides whether time is up
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise Closed()
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_reply_frame(fd: int, wait) -> bytes:
    size = int.from_bytes(read_exact_until(fd, HEADER_BYTES, wait), "big")
    if size > MAX_REPLY:
        raise TooLarge(size)
    return read_exact_until(fd, size, wait)


def describe_exception(exc: BaseException) -> dict:
    """Class names along the MRO and a truncated message, computed defensively.

    ``exc`` may come from student code: its ``__str__`` can raise or lie, and its class can
    be named anything. The judge treats all of it as text to quote, never as a verdict.
    """
    try:
        types = [str(c.__name__)[:100] for c in type(exc).__mro__][:16]
    except Exception:  # noqa: BLE001 - a hostile metaclass can break even this
        types = ["BaseException"]
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001
        message = "<the exception's message could not be read>"
    if not isinstance(message, str):
        message = "<the exception's message could not be read>"
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + " [...]"
    return {"types": types, "message": message}


# --- the judge's side: errors a check may see ------------------------------------------------

class StudentError(Exception):
    """The student's code raised while the judge used it (``LinearNoBias raised ValueError: ...``)."""

    def __init__(self, label: str, types: list[str], message: str):
        self.label, self.types, self.message = label, types, message
        self.type_name = types[0] if types else "Exception"
        super().__init__(f"{label} raised {self.type_name}: {message}")


class MissingName(NameError):
    """The notebook does not define a name the check asked for."""


class MalformedReply(Exception):
    """The worker sent something that is not a well-formed reply."""


class Stop(BaseException):
    """Ends a problem (time limit, crash, malformed reply). A BaseException, so that a check's
    ``except Exception`` cannot swallow it."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# --- the judge's view of one worker ----------------------------------------------------------

class _Pickler(pickle.Pickler):
    """Pickles a request; handles travel as references to the worker's table.

    Objects defined in hidden-test modules, or anywhere in the grader outside the sandbox and the
    probe package, are refused (``trusted.may_travel``): the worker could not import them, and a
    reference implementation must never reach the student's process.
    """

    def __init__(self, file, worker):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._worker = worker

    def persistent_id(self, obj):
        if type(obj) is Handle:
            if obj._worker is not self._worker:
                raise ValueError("this handle belongs to another problem's process")
            return ("handle", obj._id)
        return None

    def reducer_override(self, obj):
        for candidate in (obj, type(obj)):
            module = getattr(candidate, "__module__", None)
            if isinstance(module, str) and not trusted.may_travel(module, self._worker.probes):
                raise TypeError(f"{module} objects cannot be sent to the student's process")
        return NotImplemented


class Connection:
    """The judge's end of one worker's pipes: requests out, validated replies in.

    Subclasses say why the worker went away (:meth:`death_reason`) and how much CPU time it has
    used (:meth:`cpu_used`, read from outside it). Time limits: ``deadline`` (``time.monotonic()``
    seconds) is a wall-clock backstop ``wall_seconds`` after the start, against code that waits
    instead of computing; ``cpu_seconds`` bounds the worker's CPU time, which a busy machine or a
    hostile neighbour cannot use up for it. ``probes`` names the package of trusted probes the
    worker's fork server loaded (``trusted.py``).
    """

    def __init__(self, req_fd: int, rep_fd: int, deadline: float, wall_seconds: float,
                 probes: str | None = None, cpu_seconds: float | None = None):
        self.req_fd, self.rep_fd = req_fd, rep_fd
        self.probes = probes
        self.deadline, self.wall_seconds, self.cpu_seconds = deadline, wall_seconds, cpu_seconds
        self.violations: list[str] = []
        self.memory_hit = False
        self.cell_errors: list[dict] = []
        self.notices = 0
        self.pending_release: list[int] = []
        self.closed = False
        self.cells_held: int | None = None  # what the exercise cells hold once run (run_program with setup=)
        self.setup_held: int | None = None  # what the worker held once the setup cells ran (run_program with setup=)
        self.baseline_held = lambda: None  # what the course's exercise cells hold once run (judge.py)

    def cpu_used(self) -> float | None:
        """CPU seconds the worker has used (all its threads), read from outside; None: unknown."""
        return None

    def _wait(self) -> float:
        """Seconds the judge may block waiting for the worker now; raises once its time is up."""
        wall_left = self.deadline - time.monotonic()
        if wall_left <= 0:
            raise Deadline()
        used = self.cpu_used() if self.cpu_seconds is not None else None
        if used is None:
            return wall_left
        cpu_left = self.cpu_seconds - used
        if cpu_left <= 0:
            raise CpuLimit()
        # One core at most (the worker's CPU quota): no CPU time runs out sooner than this.
        return min(wall_left, cpu_left + 0.05)

    # transport
    def request(self, message) -> dict:
        if self.closed:
            raise Stop("the submission's process has already stopped")
        if self.pending_release and message[0] != "release":
            ids, self.pending_release = self.pending_release, []
            self._roundtrip(("release", ids))
        return self._roundtrip(message)

    def death_reason(self) -> str:
        return "your code's process stopped unexpectedly"

    def deadline_reason(self) -> str:
        used = self.cpu_used() if self.cpu_seconds is not None else None
        waited = f" (it had used {used:.1f} s of CPU time: it waited, slept or was blocked)" if used is not None else ""
        return f"your code did not finish within the wall-clock time limit of {self.wall_seconds:g} s{waited}"

    def settle(self) -> None:
        """Have the worker drop every handle the judge let go of and collect its garbage."""
        ids, self.pending_release = self.pending_release, []
        reply = self.request(("release", ids, "collect"))
        if reply["t"] != "ok":
            raise Stop("the submission's process sent a malformed reply")

    def memory(self, reset_peak: bool = False):
        """The memory the worker holds now (``grader.sandbox.meter.Memory``), read from outside."""
        raise NotImplementedError("this connection cannot read its worker's memory")

    def _roundtrip(self, message) -> dict:
        buf = io.BytesIO()
        _Pickler(buf, self).dump(message)
        try:
            with waiting_for_worker():
                self._write(frame(buf.getvalue()))
                while True:
                    reply = self._parse(read_reply_frame(self.rep_fd, self._wait))
                    if reply is not None:
                        return reply
        except CpuLimit:
            raise Stop(f"your code used more CPU time than the time limit of {self.cpu_seconds:g} s "
                       "allows") from None
        except (Deadline, TimeoutError):
            raise Stop(self.deadline_reason()) from None
        except (Closed, BrokenPipeError):
            raise Stop(self.death_reason()) from None
        except (TooLarge, MalformedReply):
            raise Stop("the submission's process sent a malformed reply") from None

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        poller = select.poll()
        poller.register(self.req_fd, select.POLLOUT | select.POLLERR | select.POLLHUP)
        while view:
            if not poller.poll(self._wait() * 1000):
                continue
            try:
                n = os.write(self.req_fd, view[: 1 << 16])
            except BlockingIOError:
                continue
            view = view[n:]

    def _parse(self, body: bytes) -> dict | None:
        """A reply, or None after recording an out-of-band notice."""
        if too_many_values(body, slack=64):  # bound the judge's memory before parsing
            raise MalformedReply()
        try:
            msg = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise MalformedReply() from None
        if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
            raise MalformedReply()
        kind = msg["t"]
        if kind in ("violation", "limit"):
            self.notices += 1
            if self.notices > MAX_NOTICES:
                raise MalformedReply()
            if kind == "violation" and _is_text(msg.get("what"), 300) and len(msg) == 2:
                self.violations.append(msg["what"])
            elif kind == "limit" and msg.get("kind") == "memory" and len(msg) == 2:
                self.memory_hit = True
            else:
                raise MalformedReply()
            return None
        checks = {
            "handle": lambda: _is_int(msg.get("id")) and _is_text(msg.get("type"), 200) and len(msg) == 3,
            "value": lambda: _is_text(msg.get("value"), MAX_REPLY) and len(msg) == 2,
            "error": lambda: (msg.get("where") in ("student", "missing", "transfer", "request")
                              and isinstance(msg.get("types"), list) and 0 < len(msg["types"]) <= 16
                              and all(_is_text(t, 100) for t in msg["types"])
                              and _is_text(msg.get("message"), MAX_MESSAGE_CHARS + 10)
                              and len(msg) == 4),
            "done": lambda: (isinstance(msg.get("errors"), list) and len(msg["errors"]) <= 100
                             and all(isinstance(e, dict) and set(e) == {"cell", "error"}
                                     and _is_int(e["cell"], lo=0) and _is_text(e["error"], 300)
                                     for e in msg["errors"]) and len(msg) == 2),
            "ok": lambda: len(msg) == 1,
        }
        if kind not in checks or not checks[kind]():
            raise MalformedReply()
        return msg

    # operations
    def handle(self, message, label: str | None, blame: str | None = None) -> Handle:
        reply = self.request(message)
        if reply["t"] == "handle":
            return Handle(self, reply["id"], label or reply["type"])
        self.raise_error(reply, blame or label or "your code", message)
        raise Stop("the submission's process sent a malformed reply")

    def value(self, reply: dict, blame: str):
        if reply["t"] == "value":
            try:
                return decode(reply["value"])
            except Exception:  # noqa: BLE001 - whatever fails to decode is malformed
                raise Stop("the submission's process sent a malformed reply") from None
        self.raise_error(reply, blame, None)
        raise Stop("the submission's process sent a malformed reply")

    def fetch(self, handle: Handle):
        return self.value(self.request(("fetch", handle._id)), handle._label)

    def raise_error(self, reply: dict, blame: str, message) -> None:
        if reply["t"] != "error":
            return
        where = reply["where"]
        if where == "student":
            raise StudentError(blame, reply["types"], reply["message"])
        if where == "missing":
            name = message[1] if message and message[0] == "global" else blame
            text = f"the notebook does not define {name!r}: did you run its exercise cell?"
            if self.cell_errors:
                first = self.cell_errors[0]["error"]
                text += f" (one of your cells raised {first})"
            raise MissingName(text)
        if where == "transfer":
            raise NotTransferable(reply["message"])
        raise RuntimeError(f"the grader's request failed in the submission's process: "
                           f"{reply['message'][:200]}")

    def release_later(self, hid: int) -> None:
        if not self.closed:
            self.pending_release.append(hid)

    def run_program(self, program: list[str], primes: tuple[str, ...] = (), setup: int | None = None,
                    timed=None) -> None:
        """Prime the worker (``worker.Session.prime``: grading's machinery and the trusted probes named in
        ``primes``), then run the cells. With ``setup`` (the number of leading setup cells), the memory the
        worker holds is read once they ran and again after the rest: :attr:`cells_held` is what the
        exercise cells hold. The cells go straight to the worker, never through the fork server, so no
        student's work ever sits in the memory that later workers are forked from. ``timed(phase)``, a
        context manager, times the two parts ("setup cells", priming included, and "exercise cells")."""
        timed = timed or (lambda phase: contextlib.nullcontext())
        if setup is None:
            with timed("setup cells"):
                self._run(("program", list(program), tuple(primes)))
            return
        with timed("setup cells"):
            self._run(("program", list(program[:setup]), tuple(primes)))
            self.setup_held = self.memory().held
        with timed("exercise cells"):
            self._run(("cells", list(program[setup:])))
            self.cells_held = self.memory().held - self.setup_held

    def _run(self, message) -> None:
        reply = self.request(message)
        if reply["t"] != "done":
            raise Stop("the submission's process sent a malformed reply")
        self.cell_errors = reply["errors"]

def _is_text(v, limit: int) -> bool:
    return type(v) is str and len(v) <= limit


def _is_int(v, lo: int = 1) -> bool:
    return type(v) is int and lo <= v < 2**53
