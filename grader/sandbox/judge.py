"""Run hidden tests against a submission without trusting the submission's process.

In plain nbgrader, student code and test cells share one kernel, so a wrong answer can score
full marks by changing how the tests run. Here the two never share a process:

* the **judge** (this module, inside the autograder's process) runs the hidden check
  functions, computes every reference and makes every comparison. It never executes student
  code and never unpickles anything the student's process sends;
* a **worker** (``worker.py``), forked for each (submission, problem) from a server
  (``forkserver.py``, held by the judge through ``supervisor.py``) that has imported torch but
  never run student code, executes the *program* (the release's setup cells, then the
  student's exercise cells) and then answers the judge's requests (``rpc.py``): a global, an
  attribute, a call, a judge value put in, a value fetched as plain data
  (:mod:`grader.sandbox.codec`), a trusted probe applied there (a function of the probe package
  the caller names, :mod:`grader.probes`; ``trusted.py``). Objects stay in the worker; the check
  holds :class:`Handle` objects that name them (``handles.py``).

The sandbox imports nothing of the grader that uses it (``settings.py``): the caller hands it
the hidden checks to run, the package of trusted probes and the limits of each problem.

Threat → defence (a determined student controls everything inside the worker):

1. *Monkeypatching* torch, numpy, math, builtins or coursekit changes only the worker. The
   judge's modules are untouched and all comparisons happen there, on data decoded from JSON.
   Probes that measure inside the worker (parameter tables, saved bytes) run only after an
   integrity check: every function, class and descriptor bound in ``torch``, ``torch._tensor``,
   ``torch.nn.modules.module``, ``torch.autograd.*``, ``torch._C.*``, the flop counter and
   dispatch modules, ``coursekit.*``, ``grader.*``, ``builtins``, ``json`` and a few other
   stdlib modules, and in the classes they define, must still be the object the fork server
   saw before any student code ran (``integrity.integrity_check``); otherwise the problem fails
   with "your code tried to replace ...".
2. *Changing how later cells run* (IPython hooks, input transformers, custom exception
   handlers, ``sys.settrace``, redefined names): there are no later cells. Hidden checks run in
   the judge; ``get_ipython()`` in the worker is an inert object; tracing and profiling hooks
   are refused and reported, frame and traceback internals refused, by the audit hook
   (``policy.py``).
3. *Replacing the grader's modules* (``sys.meta_path``, ``sys.modules['grader.api']``): the
   grader that decides lives in the judge. In the worker, importing ``grader.*`` is refused and
   reported, and the files are not there (see 4). Replies are validated field by field, so a
   replaced encoder or a forged frame on the reply pipe ends the problem as malformed.
4. *Reading hidden tests, solutions, other submissions*: in ``chroot`` mode (the judge runs as
   root, the normal case in the grading container) the worker lives in a private mount
   namespace whose root holds, read-only, only the Python installation, the virtual
   environment, ``coursekit/``, ``kernels/``, ``data/``, the few grader modules it imported
   (``probes``, ``codec``, the sandbox) and system libraries. Nothing else exists there, which
   also stops C-level reads that raise no audit event (``torch.from_file``). The audit hook
   refuses and reports reads outside an allow-list. The worker's memory holds no secret
   either: the server never imported a hidden test, its environment is rebuilt from a short
   allow-list, and submission files go straight to the worker, never through the server that
   later workers are forked from. Student output goes to a capped file that is never shown;
   a reason quotes only the check's own message or the student's exception message.
5. *Writing where it must not* (gradebook, course, other submissions, network): the worker
   runs as a uid of its own (``forkserver.UID_BASE`` + its pid) that owns nothing but its
   directory on a ``noexec`` tmpfs; everything else it sees is read-only; it has a network
   namespace of its own with no interface up. The audit hook refuses and reports writes
   outside its directory, sockets, ctypes calls it can see, subprocesses, signals and sqlite.
6. *Resource abuse*: ``RLIMIT_AS`` (memory), ``RLIMIT_CPU``, ``RLIMIT_NPROC`` (processes and
   threads of that uid: fork and thread bombs), ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``, no core
   dumps (``confine.py``); Python threads and ``fork`` are refused outright. The judge
   enforces the wall-clock limit with ``poll`` deadlines on every read and write, caps replies
   at 64 MiB, and on every exit path (``KeyboardInterrupt`` included) kills the worker's
   process group and every process of its uid, has the server reap it, and removes its
   directory (``supervisor.py``).
7. *Code that defeats in-process measurement or the chapter's text* (operators hidden from the
   dispatch-mode probes with ``_disable_current_modes``, frames walked to the worker's own
   machinery, numpy's raw-memory interfaces, ``_posixsubprocess``, forwarding to the reference
   ``torch.amp.GradScaler``): before anything runs, the judge reads each exercise cell's syntax
   tree against its chapter's source policy (``grader/source_policy.py``, called by
   ``autograde.grade_one``). The principle: what a cell can reach must be decidable from its text.
   So every module attribute it uses is a dotted name spelled out in the source (modules cannot be
   passed, stored or aliased; ``getattr``-style calls take only literal names; no ``eval``,
   ``exec``, ``__import__``, ``globals``, ``vars``, ``type(name, bases, dict)``, metaclasses), and
   an allow-list of modules (per chapter) plus refused names decides the rest: frames, tracebacks
   and generators' internals, raw memory and storage, pickles and files, private modules and
   library attributes, dunders beyond a short list, torch's hook tables, and each chapter's
   forbidden shortcuts (``SOURCE_POLICY`` in its hidden module), whatever the spelling. A
   breaching cell is left out of the program and every graded test cell of its exercise scores
   0, with the construct, its line and what to use instead. The cost is a parse and a walk of
   the tree, about 10 ms per exercise cell.
8. *Claims measured inside the student's process* (bytes saved for backward, tensor inventories,
   op traces, recorders, parameter tables: all of them the student's code can hide from or
   edit). **The principle: whatever decides a point is computed outside the student's process,
   or recomputed by the judge from plain returned data.** Resource bounds are read by the judge
   from the kernel (``meter.py``, ``grader/resources.py``): between two requests, while the
   worker is idle, ``nb.memory()`` reads the resident anonymous memory of every process of the
   worker's uid and the bytes on its own file system, and the resident high-water mark since a
   reset (``/proc/<pid>/clear_refs``). Checks make large inputs inside the worker that only
   their handle holds, call the student's code, drop the handles and read again, on sizes where
   a correct and a wrong implementation differ by tens of megabytes (checkpointing, 1-bit ReLU,
   the lite residual and TinyTL's main branch, QLoRA after construction and after a step,
   FlashAttention's peak). The fork server pins glibc's mmap threshold at 64 KiB so that freed
   tensors leave the resident set. Memory held before a measured call and freed during it
   ("ballast") would hide what the call keeps, so a check's ``grader.resources.Meter`` takes its
   first reading before any student call, the exercise cells may hold at most 2 MiB once run
   (against a worker that ran only the setup cells, ``nb.setup_held()``), what the student's code
   keeps before the measured call is capped, and the call may not free what it held before.
   Facts that cannot be read from outside are checked behaviourally (values the judge
   recomputes, weights compared before and after steps the judge drives) or, where they stay
   in-process (FLOP counts, recomputation order, op traces), they only add to what the outside
   checks already require, behind the source policy.
9. *Harm to other students*: each worker's directory is a tmpfs of its own (128 MiB, 1,024
   inodes) in a mount namespace of its own, where the shared directory above it is read-only
   (``confine.private_workdir``), so one worker's full disk never stops another from starting.
   On the judge's side, fetched values are compared only after their shapes match
   (``coursekit.checks.same_close``/``same_values``/``check_close``; a test refuses raw
   ``torch.allclose``/``torch.equal`` in hidden tests), and a reply cannot make the judge build
   more than a million Python objects (``codec.MAX_ITEMS``, checked before parsing).

Isolation modes, strongest first (``isolation_modes()``): ``chroot`` needs root and
``unshare``/``mount``. ``userns`` (unprivileged user, mount and network namespaces: no
network, worker directories on a private tmpfs) and ``plain`` (no namespaces; a uid of its own
only when root; no bound on total disk use) keep the judge/worker split, the audit hook and the
rlimits, but not the private file-system view, so C-level file I/O inside torch
(``torch.load``, ``torch.from_file``, ``torch.save``) could reach whatever the worker's uid
can. As root the order is ``chroot``, ``plain`` (each worker keeps a uid of its own, so
C-level writes still meet file permissions), then ``userns`` (which maps the worker to root
itself); without root, ``userns`` then ``plain``. ``run_checks`` uses the strongest mode that
starts and warns when it falls back; ``tests/test_sandbox.py`` fails when the strongest mode
this machine supports does not start.

Overhead, measured on the 2-core development machine: the server starts once per judge
process (about 2 s, mostly importing torch); each problem then costs about 10 ms of
isolation (fork, limits, privilege drop, audit hook, kill, reap, clean-up) on top of running
the program and the check.

Residual risks, stated plainly:

* The worker is the student's. Native code there is reachable without any audit event
  (torch imports ctypes, and ctypes function pointers made from addresses raise none), so a
  determined student can rewrite that process at will: take over the reply pipe, undo the
  audit hook, fake a probe's answer. The hook is defence in depth; the walls are the process
  boundary, the mount namespace, the uid, the network namespace and the rlimits.
* In-process measurements. ``nb.apply(probes.fn, ...)`` runs trusted code in that process.
  The integrity check stops monkeypatching, the common case, but not in-place edits, tensors
  stashed on ``ctx`` or module attributes where ``saved_tensors_hooks`` never sees them, or
  native code. Probe results are claims: points come from values the judge recomputes and from
  memory read outside the process (item 8); what remains in-process (FLOP counts, the order in
  which layers are recomputed, op traces) is trusted only as far as the source policy keeps a
  cell from reaching the probe's machinery.
* Memory read from outside is resident memory. A process could page memory out only with
  swap (the grading machine should have none) and could keep data in places the meter does not
  read (kernel pipe buffers, 64 KiB each, a few per worker). Inputs are sized so that such
  slack is far below the difference a check looks for.
* Whatever a check sends into the worker (``nb.put``, call arguments) is the student's to
  read and may come back in an exception message: never send reference values. Objects from
  ``grader.hidden`` modules are refused by the judge's pickler.
* Memory beyond the address space: each worker's tmpfs (128 MiB) and anonymous files count
  against the machine, not ``RLIMIT_AS``; run the autograder under a memory cgroup
  (``docker --memory``) for a hard bound. Without root (``plain`` mode without a uid of its
  own) a worker's directory is no mount of its own and workers share the judge's uid.
* The source policy is static. It cannot see what trusted objects hand to the student's code
  (a probe's wrapper passed as an argument stays the student's to call), ``str.format`` reads
  attributes into text, and a Triton kernel's pointers are raw addresses under the interpreter.
  Hidden checks still treat in-process measurements as claims.
* Student-chosen exception messages (500 characters, printable only) are shown back to that
  student; they cannot contain what the worker cannot read.
* Once an exercise has failed one of its tests, the programs of later exercises' checks carry
  the course's reference cell of it (``grader.autograde``), so that one mistake costs its
  points once. That student's later code can read that reference and could echo parts of it
  in an exception message: a student who failed an exercise can learn its answer from the
  feedback. A student who passed it never receives it.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from grader.sandbox import settings
from grader.sandbox.codec import NotTransferable
from grader.sandbox.limits import Limits
from grader.sandbox.rpc import (  # noqa: F401 - StudentError, Handle, RemoteNamespace: public here
    Handle, MissingName, RemoteNamespace, Stop, StudentError, waiting_for_worker, judging)
from grader.sandbox.supervisor import (  # noqa: F401 - all but format_size: public here
    CONTROL_SECONDS, REPO_ROOT, SERVER_START_SECONDS, format_size, isolation_modes, shutdown)
# _run_one looks the server up in this module, where a caller may substitute another mode.
from grader.sandbox.supervisor import fork_server as _server

MAX_SUBMISSION_BYTES = 64 * 1024**2  # files copied into the worker's directory, in total
MAX_SUBMISSION_FILES = 500


@dataclass
class Outcome:
    grade_id: str
    passed: bool
    reason: str  # "" when passed; otherwise a message safe to show the student


# --- public entry point -------------------------------------------------------------------------

def _read_submission(submission_dir: Path | None) -> dict[str, bytes]:
    """Regular files of the submission (symlinks skipped), capped in number and size."""
    files: dict[str, bytes] = {}
    if submission_dir is None:
        return files
    root = Path(submission_dir)
    total = 0
    for base, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(base, d)))
        for name in sorted(filenames):
            path = Path(base, name)
            if path.is_symlink() or not path.is_file():
                continue
            size = path.stat().st_size
            if len(files) >= MAX_SUBMISSION_FILES or total + size > MAX_SUBMISSION_BYTES:
                return files
            files[path.relative_to(root).as_posix()] = path.read_bytes()
            total += size
    return files


def run_checks(chapter: str, program: list[str], grade_ids: list[str], limits: Limits = Limits(),
               submission_dir: Path | None = None, setup: int | None = None,
               checks: Mapping[str, Callable] | None = None) -> dict[str, Outcome]:
    """Run each hidden test ``grade_ids`` of ``chapter`` against ``program`` in a fresh worker.

    ``program`` is the list of cell sources to execute in order: the release's setup cells,
    then the student's exercise cells; ``setup`` says how many of them are the release's setup
    cells (it lets memory checks see what the exercise cells themselves hold once they ran).
    ``checks`` maps each grade_id of the chapter to its hidden test ``check(nb)``; without it they
    come from the resolver the caller installed (``settings.checks_of``).
    Returns one :class:`Outcome` per grade_id; never raises because of anything the submission
    does.
    """
    checks = settings.checks_of(chapter) if checks is None else checks
    files = _read_submission(submission_dir)
    outcomes = {}
    for grade_id in grade_ids:
        check = checks.get(grade_id)
        if check is None:
            outcomes[grade_id] = Outcome(grade_id, False, "the grader has no hidden test for this cell")
            continue
        outcomes[grade_id] = _run_one(grade_id, check, program, files, limits, setup)
    return outcomes


_SETUP_HELD: dict[tuple, int] = {}
_SETUP_LOCK = threading.Lock()


def _setup_held(setup: tuple[str, ...], limits: Limits) -> int:
    """Bytes a worker holds after running only the release's setup cells (once per judge process).

    Called by a check, which holds the judge lock; it is let go first, for the whole wait, so
    that two checks never hold one lock each while waiting for the other's (a deadlock that
    stopped a batch for good: one check waited here for ``_SETUP_LOCK`` holding the judge lock,
    while the one that held ``_SETUP_LOCK`` waited to take the judge lock back).
    """
    with waiting_for_worker(), _SETUP_LOCK:
        if setup not in _SETUP_HELD:
            worker = _server().spawn(limits)
            try:
                worker.run_program(list(setup), {})
                _SETUP_HELD[setup] = worker.memory().held
            finally:
                worker.close()
        return _SETUP_HELD[setup]


def _run_one(grade_id: str, check, program: list[str], files: dict, limits: Limits,
             setup: int | None = None) -> Outcome:
    worker = _server().spawn(limits)
    try:
        passed, reason = False, ""
        try:
            worker.run_program(program, files)
            if setup is not None:  # read only by checks that measure memory (grader.resources.Meter)
                worker.setup_held = lambda: _setup_held(tuple(program[:setup]), limits)
            with judging():
                check(RemoteNamespace(worker))
            passed = True
        except Stop as e:
            reason = e.reason
        except AssertionError as e:
            reason = str(e).strip() or "a hidden test failed"
        except StudentError as e:
            reason = f"your code raised {e.type_name}" + (f": {e.message}" if e.message else "")
            reason += f" (calling {e.label})" if e.label else ""
        except MissingName as e:
            reason = str(e)
        except NotTransferable as e:
            reason = f"the grader could not read back a value from your code: {e}"
        except Exception as e:  # noqa: BLE001 - never show the hidden test's own traceback
            reason = f"the hidden test could not be completed on your code ({type(e).__name__})"
        if worker.violations:
            passed = False
            reason = f"your code tried to {worker.violations[0]}, which is not allowed during grading"
        elif worker.memory_hit and not passed:
            reason = f"your code exceeded the memory limit of {format_size(limits.memory_bytes)}"
        return Outcome(grade_id, passed, "" if passed else _printable(reason))
    finally:
        worker.close()


def _printable(text: str) -> str:
    """Reasons quote student-chosen text: keep it to printable characters and newlines."""
    return "".join(c if c.isprintable() or c in "\n\t" else "?" for c in text)
