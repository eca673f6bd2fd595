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

**The walls are the kernel's.** A determined student controls everything inside the worker, native
code included (ctypes, a C extension, raw system calls), so isolation and resource accounting rest on
what the kernel enforces around that process, set up by trusted code before the first line of
student code runs. In the isolated mode (``chroot``, as root; ``Server.isolated``):

* **namespaces of its own** (``forkserver.Server.spawn``, ``confine.own_namespaces``): a PID
  namespace whose first and only process is the worker (it sees no other process; when it dies, the
  kernel kills anything left in it), and mount, IPC, network and UTS namespaces (System V and POSIX
  IPC objects vanish with it; no network interface; a host name of its own), inside the fork server's
  read-only file-system view that holds only what grading needs (item 4);
* **a cgroup of its own** (``cgroups.py``, made and read by the judge): a memory limit on everything
  the kernel charges the worker (anonymous memory, tmpfs and shared memory, pipe and other kernel
  buffers, page tables), one core of CPU (a CFS quota), a cap on its tasks (threads); the judge reads
  its memory (now and peak) and CPU time from outside, and removes it with everything in it;
* **a seccomp filter** (``syscalls.py``, libseccomp), loaded after the worker's imports and before
  student code, irrevocable: no new process (``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD``,
  ``execve``), no System V or POSIX IPC, no ``ptrace``/``process_vm_*``, no ``mount``/``unshare``/
  ``setns``, no new sockets, no pipe resizing, no io_uring, bpf, perf or keyrings; a system call of
  another architecture kills the process;
* **a uid of its own**, no new privileges, rlimits (address space, file size, open files, no core).

Threat → defence:

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
   handlers, ``sys.settrace``, redefined names): there are no later cells. Cells are compiled as
   plain Python with ``compile()`` alone, never through IPython's transformers, and an exercise cell
   that is not plain Python (a magic, a shell escape, help syntax) is refused before it runs (item
   7). Hidden checks run in the judge; ``get_ipython()`` in the worker is an inert object; tracing
   and profiling hooks are refused and reported, frame and traceback internals refused, by the
   audit hook (``policy.py``).
3. *Replacing the grader's modules* (``sys.meta_path``, ``sys.modules['grader.api']``): the
   grader that decides lives in the judge. In the worker, importing ``grader.*`` is refused and
   reported, and the files are not there (see 4). Replies are validated field by field, so a
   replaced encoder or a forged frame on the reply pipe ends the problem as malformed.
4. *Reading hidden tests, solutions, other submissions*: the fork server lives in a private mount
   namespace whose root holds, read-only, only the Python installation, the virtual environment,
   ``coursekit/``, ``kernels/``, ``data/``, the few grader modules it imported (``probes``,
   ``codec``, the sandbox) and system libraries; each worker adds a mount namespace of its own with
   a fresh ``/proc`` of its PID namespace. Nothing else exists there, which also stops C-level reads
   that raise no audit event (``torch.from_file``). The worker's memory holds no secret either: the
   server never imported a hidden test, its environment is rebuilt from a short allow-list, and
   nothing of the submission's folder reaches a worker (only its exercise cells' source, straight
   from the judge, never through the server that later workers are forked from). Student output
   goes to a capped file that is never shown; a reason quotes only the check's own message or the
   student's exception message.
5. *Writing where it must not* (gradebook, course, other submissions, network): the worker
   runs as a uid of its own (``forkserver.UID_BASE`` + its pid) that owns nothing but its
   directory on a ``noexec`` tmpfs; everything else it sees is read-only; its network namespace
   has no interface and the seccomp filter refuses new sockets. The audit hook also refuses and
   reports writes outside its directory, sockets, ctypes calls it can see, subprocesses, signals
   and sqlite.
6. *Resource abuse*: the worker's cgroup bounds its memory (all of it: a hoard in pipe buffers,
   tmpfs or shared memory counts), its CPU (one core, whatever threads it starts) and its tasks;
   the seccomp filter refuses every route to a new process (fork bombs, ``_posixsubprocess``,
   ``posix_spawn``, ``execve``). Time is CPU time read from the cgroup: a problem may use
   ``Limits.cpu_seconds`` of it, so a busy machine or a hostile neighbour cannot make an honest cell
   time out; a wall-clock backstop (``Limits.wall``, 5 times longer) stops code that waits instead
   of computing. The judge enforces both with ``poll`` deadlines on every read and write, caps
   replies at 64 MiB, and on every exit path (``KeyboardInterrupt`` included) kills the worker
   (its PID namespace dies with it), its cgroup and every process of its uid, has the server reap
   it, and removes its directory and cgroup. Rlimits remain as a second line (address space,
   file size, open files, no core dumps; ``confine.py``).
7. *Code that defeats in-process measurement or the chapter's text* (operators hidden from the
   dispatch-mode probes with ``_disable_current_modes``, frames walked to the worker's own
   machinery, numpy's raw-memory interfaces, ``_posixsubprocess``, forwarding to the reference
   ``torch.amp.GradScaler``): before anything runs, the judge reads each exercise cell's syntax
   tree against its chapter's source policy (``coursekit/source_policy.py`` via ``grader/source_policy.py``, called by
   ``autograde.grade_one``). The principle: what a cell can reach must be decidable from its text.
   So every module attribute it uses is a dotted name spelled out in the source (modules cannot be
   passed, stored or aliased; ``getattr``-style calls take only literal names; no ``eval``,
   ``exec``, ``__import__``, ``globals``, ``vars``, ``type(name, bases, dict)``, metaclasses), and
   an allow-list of modules (per chapter) plus refused names decides the rest: frames, tracebacks
   and generators' internals, raw memory and storage, pickles and files, private modules and
   library attributes, dunders beyond a short list, torch's hook tables, and each chapter's
   forbidden shortcuts (``SOURCE_POLICY`` in its hidden module), whatever the spelling. It fails
   closed: a cell that is not plain Python, that is larger than the policy reads, or on which the
   policy itself fails is refused, with its line named. A breaching cell is left out of the program
   and every graded test cell of its exercise scores 0, with the construct, its line and what to
   use instead. The cost is a parse and a walk of the tree, about 10 ms per exercise cell. The
   policy and the audit hook are defence in depth: the walls above hold without them
   (``tests/test_kernel_walls.py`` runs workers without the audit hook).
8. *Claims measured inside the student's process* (bytes saved for backward, tensor inventories,
   op traces, recorders, parameter tables: all of them the student's code can hide from or
   edit). **The principle: whatever decides a point is computed outside the student's process,
   or recomputed by the judge from plain returned data.** Resource bounds are read by the judge
   from the worker's cgroup (``cgroups.py``, ``grader/resources.py``) between two requests, while
   the worker is idle: everything charged to it, page cache excepted, and the most charged since a
   reset. A worker shares the fork server's pages until it writes to them, and the first write
   charges the copy to the worker; so each worker first runs grading's own machinery once, before
   any student code (``worker.Session.prime``, and a chapter's ``*_prime`` probes), and what the
   student's exercise cells hold is read between the setup cells and the rest, against the same
   reading for the course's own cells. Checks make large inputs inside the worker that only their
   handle holds, call the student's code, drop the handles and read again, on sizes where a correct
   and a wrong implementation differ by tens of megabytes. Memory held before a measured call and
   freed during it ("ballast") would hide what the call keeps, so a check's
   ``grader.resources.Meter`` takes its first reading before any student call, the exercise cells
   may hold at most 2 MiB more than the course's own, what the student's code keeps before the
   measured call is capped, and the call may not free what it held before. Facts that cannot be
   read from outside are checked behaviourally (values the judge recomputes, weights compared
   before and after steps the judge drives) or, where they stay in-process (recomputation order, op
   traces), they only take points away from what the outside checks already grant, behind the source
   policy; saved bytes and FLOP counts only explain. Sizes and seeds of every measured call are
   drawn at grading time from ranges the exercise's text states, and the values of that very call
   are compared with the judge's own (``resources.draw``, ``new_seed``, ``seeded``): code that is
   honest only at one size, or only when it guesses it is measured, is wrong where it switches.
   Compute is read as the worker's CPU time against the course's own computation on the same inputs
   (``Meter.cpu_by``).
9. *Harm to other students*: each worker has its own namespaces, cgroup and tmpfs (128 MiB, 1,024
   inodes; ``confine.own_namespaces``), so one worker's hoard, full disk or busy threads never reach
   another's memory, disk or CPU time, and nothing it made survives it. On the judge's side, fetched
   values are compared only after their shapes match (``coursekit.checks.same_close``/
   ``same_values``/``check_close``; a test refuses raw ``torch.allclose``/``torch.equal`` in hidden
   tests), and a reply cannot make the judge build more than a million Python objects
   (``codec.MAX_ITEMS``, checked before parsing). What students hand in is read by
   ``grader/intake.py`` before any of this: links, devices and oversized notebooks are refused unread.

Isolation modes, strongest first (``isolation_modes()``): ``chroot`` needs root, ``unshare``,
``mount``, libseccomp and writable cgroups (v1 or v2); it is the only *isolated* mode, and
``python -m grader autograde`` refuses to grade without it unless given ``--unisolated`` (then every
grade is flagged). ``userns`` (unprivileged user, mount and network namespaces: no network, worker
directories on a private tmpfs) and ``plain`` (no namespaces; a uid of its own only when root; no
bound on total disk use) keep the judge/worker split, the audit hook, the rlimits and, where they can
be had, the seccomp filter and cgroups, but not the private file-system view, so C-level file I/O
inside torch (``torch.load``, ``torch.from_file``, ``torch.save``) could reach whatever the worker's
uid can. As root the order is ``chroot``, ``plain`` (each worker keeps a uid of its own, so C-level
writes still meet file permissions), then ``userns`` (which maps the worker to root itself); without
root, ``userns`` then ``plain``. ``run_checks`` uses the strongest mode that starts and warns when it
falls back; ``tests/test_sandbox.py`` fails when the strongest mode this machine supports does not
start, and ``tests/test_kernel_walls.py`` when the isolated mode does not hold where it must
(``REQUIRE_ISOLATION=1``).

Overhead, measured on the 2-core development machine: the server starts once per judge
process (about 2-3 s of preloading, mostly importing torch); each problem then costs about 45 ms
of isolation (fork into a new PID namespace, four more namespaces, a cgroup, limits, privilege drop,
seccomp, priming, kill, reap, clean-up) on top of running the program and the check.

Residual risks, stated plainly:

* The worker is the student's. Native code there can rewrite that process at will: take over
  the reply pipe, undo the audit hook, fake a probe's answer. That is why no point rests on what
  the process says about itself (item 8), and why its walls are the kernel's; what remains is the
  kernel itself: a kernel vulnerability reachable through the system calls the filter allows would
  reach the machine. The filter keeps that surface to what computing on tensors needs.
* In-process measurements. ``nb.apply(probes.fn, ...)`` runs trusted code in that process. The
  integrity check stops monkeypatching, the common case, but not in-place edits, tensors stashed on
  ``ctx`` or module attributes where ``saved_tensors_hooks`` never sees them, or native code. Probe
  results are claims: points come from values the judge recomputes and from readings of the cgroup.
  Probes mark what they count in the process (``grader.sandbox.trusted.in_process``): saved bytes and FLOPs
  only explain a failure (the test suite grades the references and second answers with them replaced
  by values that fail any check consulting them, ``tests/test_in_process_claims.py``); the traces that
  remain (the order in which layers are recomputed, op traces, dtypes produced, the Triton
  interpreter's accesses) can take a point away, never award one, and are trusted only as far as the
  source policy keeps a cell from reaching the probe's machinery. ``grader/README.md`` lists each
  exercise's properties, what decides them and which attacks they stop.
* Every reading follows a garbage collection, so a measured call always follows one. Code that sees
  collections could behave only then (keep its memory, or burn CPU inside the course's baseline); the
  policy refuses every route to that it knows (``__del__``, ``weakref``, ``gc``, cleanup code in
  generators, hook handles' weak references, library finalizers that call replaceable methods). A route
  it does not know would reopen it: measured calls preceded by a collection at random is the protocol
  that would close it for good.
* Readings of the cgroup move in steps of the kernel's charge batches (64 pages per CPU) and by
  the pages of shared memory a worker first writes to (priming absorbs most of them: measured at
  1-4 MiB within a check); inputs are sized so that right and wrong differ by tens of MiB.
* Whatever a check sends into the worker (``nb.put``, call arguments) is the student's to
  read and may come back in an exception message: never send reference values. Objects from
  ``grader.hidden`` modules are refused by the judge's pickler.
* A worker that sleeps holds its slot until the wall-clock backstop (5 times the CPU limit): it
  delays the batch, not another student's grade. Several workers at once share the machine's cores
  one each at most; a batch with more parallel workers than cores runs slower, never wrong.
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
* Without root (``--unisolated``): no cgroup, no namespaces of its own, no private view; memory is
  then read from ``/proc`` (resident memory and the work directory's files, which misses kernel
  buffers), time from the process's own CPU counters. Such grades are flagged.
"""
from __future__ import annotations

import functools
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Mapping

from grader.sandbox import settings, trusted
from grader.sandbox.codec import NotTransferable
from grader.sandbox.limits import Limits
from grader.sandbox.rpc import (  # noqa: F401 - StudentError, Handle, RemoteNamespace: public here
    Handle, MissingName, RemoteNamespace, Stop, StudentError, waiting_for_worker, judging)
from grader.sandbox.supervisor import (  # noqa: F401 - all but format_size: public here
    CONTROL_SECONDS, REPO_ROOT, SERVER_START_SECONDS, format_size, isolation_modes, shutdown)
# _run_one looks the server up in this module, where a caller may substitute another mode.
from grader.sandbox.supervisor import fork_server as _server


@dataclass
class Outcome:
    grade_id: str
    passed: bool
    reason: str  # "" when passed; otherwise a message safe to show the student


# --- public entry point -------------------------------------------------------------------------

def run_checks(chapter: str, program: list[str], grade_ids: list[str], limits: Limits = Limits(),
               setup: int | None = None, baseline: list[str] | None = None,
               checks: Mapping[str, Callable] | None = None) -> dict[str, Outcome]:
    """Run each hidden test ``grade_ids`` of ``chapter`` against ``program`` in a fresh worker.

    ``program`` is the list of cell sources to execute in order: the release's setup cells,
    then the student's exercise cells; ``setup`` says how many of them are the release's setup
    cells, and ``baseline`` lists the course's own exercise cells. With both, memory checks see what
    the student's exercise cells hold once run (read between the setup cells and the rest) beside
    what the course's own hold after the same setup cells (``nb.exercise_cells_held()``,
    ``nb.baseline_held()``). ``checks`` maps each grade_id of the chapter to its hidden test
    ``check(nb)``; without it they come from the resolver the caller installed
    (``settings.checks_of``). Every worker is first primed with the chapter's trusted ``*_prime``
    probes (:func:`primes_of`).
    Returns one :class:`Outcome` per grade_id; never raises because of anything the submission
    does.
    """
    checks = settings.checks_of(chapter) if checks is None else checks
    primes = primes_of(chapter)
    outcomes = {}
    for grade_id in grade_ids:
        check = checks.get(grade_id)
        if check is None:
            outcomes[grade_id] = Outcome(grade_id, False, "the grader has no hidden test for this cell")
            continue
        outcomes[grade_id] = _run_one(grade_id, check, program, limits, setup, baseline, primes)
    return outcomes


def primes_of(chapter: str, package: str | None = None) -> tuple[str, ...]:
    """The trusted probes that prime every worker of ``chapter`` before any student code runs: those of
    the probe package (default: the caller's, ``settings.current().probes``) named with the chapter's
    prefix and ``_prime`` (``ch10_prime`` for ``ch10_flash_attention``)."""
    package = package or settings.current().probes
    if not package:
        return ()
    prefix = chapter.split("_")[0] + "_"
    return tuple(n for n in _probe_names(package) if n.startswith(prefix) and n.endswith("_prime"))


@functools.lru_cache(maxsize=8)
def _probe_names(package: str) -> tuple[str, ...]:
    return tuple(sorted(trusted.probe_table(package)))


_BASELINE_HELD: dict[tuple, int] = {}
_BASELINE_LOCK = threading.Lock()


def _baseline_held(setup: tuple[str, ...], baseline: tuple[str, ...], primes: tuple[str, ...], limits: Limits) -> int:
    """Bytes the course's exercise cells ``baseline`` hold once run after ``setup`` in a worker of their own
    (once per judge process and program).

    Called by a check, which holds the judge lock; it is let go first, for the whole wait, so
    that two checks never hold one lock each while waiting for the other's (a deadlock that
    stopped a batch for good: one check waited here for the baseline's lock holding the judge lock,
    while the one that held the baseline's lock waited to take the judge lock back).
    """
    key = (setup, baseline, primes)
    with waiting_for_worker(), _BASELINE_LOCK:
        if key not in _BASELINE_HELD:
            worker = _server().spawn(limits)
            try:
                worker.run_program(list(setup) + list(baseline), primes, setup=len(setup))
                _BASELINE_HELD[key] = worker.cells_held
            finally:
                worker.close()
        return _BASELINE_HELD[key]


# --- where the judge's time goes ----------------------------------------------------------------
# Seconds and counts per phase of every problem this process judged, summed over its threads
# (``autograde`` writes them to OUT/profile.csv; ``make bench-grade`` prints them).
PHASES = ("worker start", "setup cells", "exercise cells", "hidden checks", "worker stop")
_TIMES: dict[str, list] = {}
_TIMES_LOCK = threading.Lock()


@contextmanager
def timed(phase: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        spent = time.perf_counter() - start
        with _TIMES_LOCK:
            entry = _TIMES.setdefault(phase, [0.0, 0])
            entry[0] += spent
            entry[1] += 1


def add_phase_times(phases: dict[str, tuple[float, int]]) -> None:
    """Add times judged elsewhere (a cluster's worker) to this process's."""
    with _TIMES_LOCK:
        for phase, (seconds, count) in phases.items():
            entry = _TIMES.setdefault(phase, [0.0, 0])
            entry[0] += seconds
            entry[1] += count


def phase_times(reset: bool = False) -> dict[str, tuple[float, int]]:
    """{phase: (seconds, count)} judged so far in this process (then emptied, with ``reset``)."""
    with _TIMES_LOCK:
        found = {k: (v[0], v[1]) for k, v in _TIMES.items()}
        if reset:
            _TIMES.clear()
    return found


def _run_one(grade_id: str, check, program: list[str], limits: Limits, setup: int | None = None,
             baseline: list[str] | None = None, primes: tuple[str, ...] = ()) -> Outcome:
    with timed("worker start"):
        worker = _server().spawn(limits)
    try:
        passed, reason = False, ""
        try:
            worker.run_program(program, primes, setup=setup, timed=timed)
            if setup is not None and baseline is not None:  # read only by memory checks (grader.resources.Meter)
                worker.baseline_held = lambda: _baseline_held(tuple(program[:setup]), tuple(baseline), primes, limits)
            with judging(), timed("hidden checks"):
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
        elif (worker.memory_hit or (worker.group is not None and worker.group.oom_killed())) and not passed:
            reason = f"your code exceeded the memory limit of {format_size(limits.memory_bytes)}"
        return Outcome(grade_id, passed, "" if passed else _printable(reason))
    finally:
        with timed("worker stop"):
            worker.close()


def _printable(text: str) -> str:
    """Reasons quote student-chosen text: keep it to printable characters and newlines."""
    return "".join(c if c.isprintable() or c in "\n\t" else "?" for c in text)
