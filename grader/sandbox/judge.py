"""Run hidden tests against a submission without trusting the submission's process.

In plain nbgrader, student code and test cells share one kernel, so a wrong answer can score
full marks by changing how the tests run. Here the two never share a process:

* the **judge** (this module, inside the autograder's process) runs the hidden check
  functions, computes every reference and makes every comparison. It never executes student
  code and never unpickles anything the student's process sends;
* a **worker** (``worker.py``), forked for each (submission, problem) from a server that has
  imported torch but never run student code, executes the *program* (the release's setup
  cells, then the student's exercise cells) and then answers the judge's requests
  (``rpc.py``): a global, an attribute, a call, a judge value put in, a value fetched as plain
  data (:mod:`grader.sandbox.codec`), a function of :mod:`grader.probes` applied there.
  Objects stay in the worker; the check holds :class:`Handle` objects that name them.

Threat → defence (a determined student controls everything inside the worker):

1. *Monkeypatching* torch, numpy, math, builtins or coursekit changes only the worker. The
   judge's modules are untouched and all comparisons happen there, on data decoded from JSON.
   Probes that measure inside the worker (parameter tables, saved bytes) run only after an
   integrity check: every function, class and descriptor bound in ``torch``, ``torch._tensor``,
   ``torch.nn.modules.module``, ``torch.autograd.*``, ``torch._C.*``, the flop counter and
   dispatch modules, ``coursekit.*``, ``grader.*``, ``builtins``, ``json`` and a few other
   stdlib modules, and in the classes they define, must still be the object the fork server
   saw before any student code ran (``policy.integrity_check``); otherwise the problem fails with
   "your code tried to replace ...".
2. *Changing how later cells run* (IPython hooks, input transformers, custom exception
   handlers, ``sys.settrace``, redefined names): there are no later cells. Hidden checks run in
   the judge; ``get_ipython()`` in the worker is an inert object; tracing and profiling hooks
   are refused and reported, frame and traceback internals refused, by the audit hook.
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
   runs as a uid of its own (``worker.UID_BASE`` + its pid) that owns nothing but its
   directory on a ``noexec`` tmpfs; everything else it sees is read-only; it has a network
   namespace of its own with no interface up. The audit hook refuses and reports writes
   outside its directory, sockets, ctypes calls it can see, subprocesses, signals and sqlite.
6. *Resource abuse*: ``RLIMIT_AS`` (memory), ``RLIMIT_CPU``, ``RLIMIT_NPROC`` (processes and
   threads of that uid: fork and thread bombs), ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``, no core
   dumps; Python threads and ``fork`` are refused outright. The judge enforces the wall-clock
   limit with ``poll`` deadlines on every read and write, caps replies at 64 MiB, and on every
   exit path (``KeyboardInterrupt`` included) kills the worker's process group and every
   process of its uid, has the server reap it, and removes its directory.

Isolation modes, strongest first (``isolation_modes()``): ``chroot`` needs root and
``unshare``/``mount``. ``userns`` (unprivileged user, mount and network namespaces: no
network, worker directories on a private tmpfs) and ``plain`` (no namespaces; a uid of its own
only when root; no bound on total disk use) keep the judge/worker split, the audit hook and the
rlimits, but not the private file-system view, so C-level file I/O inside torch
(``torch.load``, ``torch.from_file``, ``torch.save``) could reach whatever the worker's uid
can. ``run_checks`` uses the strongest mode that starts and warns when it falls back.

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
  The integrity check stops monkeypatching, the common case, but not in-place edits, frame
  walking through standard-library helpers (``inspect`` may call ``sys._getframe``), tensors
  stashed on ``ctx`` or module attributes where ``saved_tensors_hooks`` never sees them, or
  native code. Checks should treat probe results as claims: recompute in the judge whatever
  can be recomputed from fetched tensors (outputs, gradients, parameter values) and use
  in-process measurements only for what cannot be observed otherwise.
* Whatever a check sends into the worker (``nb.put``, call arguments) is the student's to
  read and may come back in an exception message: never send reference values. Objects from
  ``grader.hidden`` modules are refused by the judge's pickler.
* Memory beyond the address space: the workers' tmpfs (512 MiB per server) and anonymous
  files count against the machine, not ``RLIMIT_AS``; run the autograder under a memory
  cgroup (``docker --memory``) for a hard bound.
* Student-chosen exception messages (500 characters, printable only) are shown back to that
  student; they cannot contain what the worker cannot read.
"""
from __future__ import annotations

import atexit
import math
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from grader.api import checks_for
from grader.sandbox.codec import NotTransferable
from grader.sandbox.rpc import (  # noqa: F401 - StudentError, Handle, RemoteNamespace: public here
    Connection, Handle, MissingName, RemoteNamespace, Stop, StudentError)
from grader.sandbox.worker import recv_msg, send_msg

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_SUBMISSION_BYTES = 64 * 1024**2  # files copied into the worker's directory, in total
MAX_SUBMISSION_FILES = 500
SERVER_START_SECONDS = 180.0
CONTROL_SECONDS = 60.0  # the fork server answers spawn/reap well within this


@dataclass
class Limits:
    wall_seconds: float = 60.0  # whole life of one problem's worker
    memory_bytes: int = 4 * 1024**3  # address-space limit of the worker (raise if torch needs more)
    output_bytes: int = 1024**2  # student stdout/stderr kept on disk (never shown)
    max_processes: int = 64


@dataclass
class Outcome:
    grade_id: str
    passed: bool
    reason: str  # "" when passed; otherwise a message safe to show the student


class _Worker(Connection):
    """One problem's worker process, as the judge sees it."""

    def __init__(self, server: "_Server", pid: int, uid: int, req_fd: int, rep_fd: int,
                 deadline: float, limits: Limits):
        super().__init__(req_fd, rep_fd, deadline, limits.wall_seconds)
        self.server, self.pid, self.uid, self.limits = server, pid, uid, limits
        self.status = None

    def death_reason(self) -> str:
        # A process that is exiting closes its files a moment before it becomes a zombie.
        for _ in range(20):
            if self.closed or not _running(self.pid):
                break
            time.sleep(0.01)
        else:
            self.close()
            return "your code's process stopped answering the grader (it closed its pipes)"
        self.close()
        status = self.status
        if status is None:
            return "your code's process stopped unexpectedly"
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig == signal.SIGXCPU:
                return (f"your code used more CPU time than the time limit of "
                        f"{_seconds(self.limits.wall_seconds)} allows")
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            return (f"your code's process was stopped by signal {name} (it may have exceeded the "
                    f"memory limit of {_size(self.limits.memory_bytes)})")
        return f"your code's process exited early (status {os.WEXITSTATUS(status)})"

    def close(self) -> None:
        """Kill the worker's process group and every process of its uid; reap; remove its dir."""
        if self.closed:
            return
        self.closed = True
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for fd in (self.req_fd, self.rep_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.status = self.server.reap(self.pid)
        if self.server.info.get("own_uid"):
            _kill_uid(self.uid)  # anything that left the process group (setsid) goes too



def _seconds(s: float) -> str:
    return f"{s:g} s"


def _size(n: int) -> str:
    return f"{n / 1024**3:.3g} GiB" if n >= 1024**3 else f"{n / 1024**2:.3g} MiB"


def _running(pid: int) -> bool:
    """Whether ``pid`` is alive and not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _kill_uid(uid: int) -> None:
    """SIGKILL every live process owned by ``uid`` (a worker's uid is its alone)."""
    for _ in range(10):
        killed = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            zombie = fields.get("State", "").strip().startswith("Z")
            if zombie or int(fields.get("Uid", "-1 ").split()[0]) != uid:
                continue
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed = True
            except ProcessLookupError:
                pass
        if not killed:
            return
        time.sleep(0.01)


# --- the fork server ----------------------------------------------------------------------------

class _Server:
    """One long-lived fork server; see ``worker.py``."""

    def __init__(self, mode: str):
        self.mode = mode
        self.lock = threading.Lock()
        self.broken = False
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock = parent
        self.log = tempfile.TemporaryFile()
        cmd = [sys.executable, "-m", "grader.sandbox.worker", "--control", str(child.fileno()),
               "--repo", str(REPO_ROOT), "--mode", mode]
        unshare = shutil.which("unshare") or "unshare"
        if mode == "chroot":
            cmd = [unshare, "--mount", "--net", "--ipc", "--uts", "--propagation", "private",
                   "--"] + cmd
        elif mode == "userns":
            cmd = [unshare, "--user", "--map-root-user", "--mount", "--net", "--ipc",
                   "--propagation", "private", "--"] + cmd
        self.proc = subprocess.Popen(cmd, pass_fds=[child.fileno()], cwd=REPO_ROOT,
                                     env=_server_env(), stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=self.log, start_new_session=True)
        child.close()
        self.sock.settimeout(SERVER_START_SECONDS)
        try:
            msg, _ = recv_msg(self.sock)
        except (OSError, EOFError, pickle.UnpicklingError):
            msg = None
        if not msg or msg[0] != "ready":
            self.close()
            self.log.seek(0)
            tail = self.log.read()[-2000:].decode("utf-8", "replace")
            raise RuntimeError(f"the sandbox server ({mode} mode) did not start:\n{tail}")
        self.sock.settimeout(CONTROL_SECONDS)
        self.info = msg[1]

    def alive(self) -> bool:
        return not self.broken and self.proc.poll() is None

    def _exchange(self, message, fds=()):
        """One request/answer on the control socket; any failure retires this server."""
        with self.lock:
            try:
                send_msg(self.sock, message, fds=fds)
                answer, _ = recv_msg(self.sock)
            except BaseException:
                self.broken = True  # the conversation is out of step: never reuse it
                self.proc.kill()
                raise
        if answer is None:
            self.broken = True
            raise RuntimeError("the sandbox server stopped")
        return answer

    def spawn(self, limits: Limits) -> _Worker:
        floor = self.info["vm_bytes"] + 256 * 1024**2
        if limits.memory_bytes < floor:
            raise ValueError(f"Limits.memory_bytes must be at least {floor} here: the worker "
                             f"starts with {self.info['vm_bytes']} bytes of address space mapped")
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        spec = {"output_bytes": int(limits.output_bytes),
                "limits": {"memory_bytes": int(limits.memory_bytes),
                           "cpu_seconds": int(math.ceil(limits.wall_seconds)) + 1,
                           "max_processes": int(limits.max_processes)}}
        deadline = time.monotonic() + limits.wall_seconds
        try:
            answer = self._exchange(("spawn", spec), fds=[req_r, rep_w])
        except BaseException:
            os.close(req_w)
            os.close(rep_r)
            raise
        finally:
            os.close(req_r)
            os.close(rep_w)
        _, pid, uid, _workdir = answer
        os.set_blocking(req_w, False)
        return _Worker(self, pid, uid, req_w, rep_r, deadline, limits)

    def reap(self, pid: int):
        """Have the server kill, wait for and clean up a worker; its wait status, or None."""
        if not self.alive():
            return None
        answer = self._exchange(("reap", pid))
        return answer[1] if answer[0] == "reaped" else None

    def close(self) -> None:
        try:
            send_msg(self.sock, ("exit",))
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()
        work_base = getattr(self, "info", {}).get("work_base", "")
        if self.mode != "chroot" and work_base.startswith(tempfile.gettempdir()):
            shutil.rmtree(work_base, ignore_errors=True)


def _server_env() -> dict:
    env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg"}
    for key in ("HOME", "COURSE_FAST", "TRITON_INTERPRET", "PYTHONHASHSEED"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def isolation_modes() -> list[str]:
    """The isolation modes this machine supports, strongest first."""
    modes = []
    unshare = shutil.which("unshare")
    if unshare and os.geteuid() == 0 and shutil.which("mount"):
        modes.append("chroot")
    if unshare and subprocess.run([unshare, "--user", "--map-root-user", "--mount", "--net", "true"],
                                  capture_output=True).returncode == 0:
        modes.append("userns")
    return modes + ["plain"]


_SERVERS: dict[tuple, _Server] = {}
_SERVERS_LOCK = threading.Lock()
_DEFAULT_MODE: list[str] = []


def _server(mode: str | None = None) -> _Server:
    """The running server for ``mode`` (default: the strongest that starts), started on demand."""
    with _SERVERS_LOCK:
        modes = [mode] if mode else (_DEFAULT_MODE or isolation_modes())
        errors = []
        for m in modes:
            key = (m, os.environ.get("COURSE_FAST", ""))
            server = _SERVERS.get(key)
            if server is None or not server.alive():
                try:
                    server = _SERVERS[key] = _Server(m)
                except RuntimeError as e:
                    errors.append(str(e))
                    continue
            if mode is None and not _DEFAULT_MODE:
                _DEFAULT_MODE.append(m)
                if errors:
                    warnings.warn(f"grading sandbox running in {m!r} mode, weaker than "
                                  f"{modes[0]!r}: {errors[0][:300]}", RuntimeWarning, stacklevel=3)
            return server
        raise RuntimeError("no sandbox could be started:\n" + "\n".join(errors))


@atexit.register
def shutdown() -> None:
    """Stop every fork server (their workers die with them)."""
    with _SERVERS_LOCK:
        for server in _SERVERS.values():
            server.close()
        _SERVERS.clear()


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
               submission_dir: Path | None = None) -> dict[str, Outcome]:
    """Run each hidden test ``grade_ids`` of ``chapter`` against ``program`` in a fresh worker.

    ``program`` is the list of cell sources to execute in order: the release's setup cells,
    then the student's exercise cells. Returns one :class:`Outcome` per grade_id; never
    raises because of anything the submission does.
    """
    checks = checks_for(chapter)
    files = _read_submission(submission_dir)
    outcomes = {}
    for grade_id in grade_ids:
        check = checks.get(grade_id)
        if check is None:
            outcomes[grade_id] = Outcome(grade_id, False, "the grader has no hidden test for this cell")
            continue
        outcomes[grade_id] = _run_one(grade_id, check, program, files, limits)
    return outcomes


def _run_one(grade_id: str, check, program: list[str], files: dict, limits: Limits) -> Outcome:
    worker = _server().spawn(limits)
    try:
        passed, reason = False, ""
        try:
            worker.run_program(program, files)
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
            reason = f"your code exceeded the memory limit of {_size(limits.memory_bytes)}"
        return Outcome(grade_id, passed, "" if passed else _printable(reason))
    finally:
        worker.close()


def _printable(text: str) -> str:
    """Reasons quote student-chosen text: keep it to printable characters and newlines."""
    return "".join(c if c.isprintable() or c in "\n\t" else "?" for c in text)
