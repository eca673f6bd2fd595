"""The judge's hold on the sandbox's processes: fork servers and the workers they fork.

One fork server runs per isolation mode (``forkserver.py``), started on demand by
:func:`fork_server` (the strongest mode that starts, by default) and stopped by
:func:`shutdown` at exit. For each problem the judge has it fork a worker, puts the worker in a
cgroup of its own (``cgroups.py``; as root) before any student code runs, and holds it as a
``_Worker``: the judge's end of its pipes (``rpc.Connection``), its group (memory and CPU time
read from outside), why it died, and a ``close`` that, on every exit path, kills its PID
namespace, its group and every process of its uid, has the server reap it, and removes its
directory and its group.
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
from pathlib import Path

from grader.sandbox import cgroups, meter, settings
from grader.sandbox.forkserver import recv_msg, send_msg
from grader.sandbox.limits import Limits
from grader.sandbox.rpc import Connection, Stop

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVER_START_SECONDS = 180.0
CONTROL_SECONDS = 60.0  # the fork server answers spawn/reap well within this


class _Worker(Connection):
    """One problem's worker process, as the judge sees it."""

    def __init__(self, server: "_Server", pid: int, uid: int, req_fd: int, rep_fd: int,
                 deadline: float, limits: Limits, workdir: str, group: cgroups.Group | None = None):
        super().__init__(req_fd, rep_fd, deadline, limits.wall, probes=server.probes,
                         cpu_seconds=float(limits.cpu_seconds))
        self.server, self.pid, self.uid, self.limits = server, pid, uid, limits
        self.workdir = workdir  # as the worker sees it
        self.group = group
        self.status = None

    def memory(self, reset_peak: bool = False) -> meter.Memory:
        """Memory the worker holds, read from outside it between two requests (the worker is idle).

        With a cgroup (as root): everything the kernel charges the worker's group, file-backed page
        cache excepted (its tmpfs, shared memory and kernel buffers count), and ``peak``, the most
        charged since the last ``reset_peak=True`` reading. Without one: resident memory of every
        process of the worker's uid plus the bytes on its work file system, and the resident
        high-water mark of the worker's process. Handles the judge let go of are dropped (and
        garbage collected) in the worker first.
        """
        self.settle()
        try:
            if self.group is not None:
                if reset_peak:
                    self.group.reset_peak()
                reading = self.group.read()
                return meter.Memory(reading.resident, reading.peak, 0)
            reading = meter.read(self.pid, self.workdir)
            others = sum(meter.read(p).resident for p in _uid_processes(self.uid) if p != self.pid) \
                if self.server.info.get("own_uid") else 0
            if reset_peak:
                meter.reset_peak(self.pid)
                reading = meter.read(self.pid, self.workdir)
        except OSError:
            raise Stop(self.death_reason()) from None
        return meter.Memory(reading.resident + others, reading.peak + others, reading.files)

    def cpu_used(self) -> float | None:
        try:
            if self.group is not None:
                return self.group.cpu_seconds()
            return meter.cpu_seconds(self.pid)
        except (OSError, ValueError):
            return None  # gone: the next read of its pipe says why

    def death_reason(self) -> str:
        # A process that is exiting closes its files a moment before it becomes a zombie.
        for _ in range(20):
            if self.closed or not _running(self.pid):
                break
            time.sleep(0.01)
        else:
            self.close()
            return "your code's process stopped answering the grader (it closed its pipes)"
        oom = self.group is not None and self.group.oom_killed()
        self.close()
        status = self.status
        if oom:
            return f"your code exceeded the memory limit of {format_size(self.limits.memory_bytes)}"
        if status is None:
            return "your code's process stopped unexpectedly"
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig == signal.SIGXCPU:
                return (f"your code used more CPU time than the time limit of "
                        f"{format_seconds(self.limits.cpu_seconds)} allows")
            if sig == signal.SIGSYS:
                return "your code's process was stopped for a system call of another architecture"
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            return (f"your code's process was stopped by signal {name} (it may have exceeded the "
                    f"memory limit of {format_size(self.limits.memory_bytes)})")
        return f"your code's process exited early (status {os.WEXITSTATUS(status)})"

    def close(self) -> None:
        """Kill the worker (its PID namespace dies with it), its process group, its cgroup and every
        process of its uid; reap; remove its directory and its cgroup."""
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
        if self.group is not None:
            self.group.remove()


def format_seconds(s: float) -> str:
    return f"{s:g} s"


def format_size(n: int) -> str:
    return f"{n / 1024**3:.3g} GiB" if n >= 1024**3 else f"{n / 1024**2:.3g} MiB"


def _running(pid: int) -> bool:
    """Whether ``pid`` is alive and not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _uid_processes(uid: int) -> list[int]:
    """Pids of the live (not zombie) processes owned by ``uid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        zombie = fields.get("State", "").strip().startswith("Z")
        if not zombie and int(fields.get("Uid", "-1 ").split()[0]) == uid:
            pids.append(int(entry))
    return pids


def _kill_uid(uid: int) -> None:
    """SIGKILL every live process owned by ``uid`` (a worker's uid is its alone)."""
    for _ in range(10):
        killed = False
        for pid in _uid_processes(uid):
            try:
                os.kill(pid, signal.SIGKILL)
                killed = True
            except ProcessLookupError:
                pass
        if not killed:
            return
        time.sleep(0.01)


# --- the fork server ----------------------------------------------------------------------------

class _Server:
    """One long-lived fork server, as the judge sees it; see ``forkserver.py``.

    ``probes`` names the package of trusted probes the server loads (``trusted.py``; None: none).
    """

    def __init__(self, mode: str, probes: str | None = None, modules: frozenset[str] = frozenset(),
                 audit: bool = True):
        self.mode = mode
        self.audit = audit
        self.probes = probes
        self.modules = frozenset(modules)
        self.lock = threading.Lock()
        self.broken = False
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock = parent
        self.log = tempfile.TemporaryFile()
        # An empty directory of its own on which the server mounts the worker's root: mounting
        # on /tmp itself would hide a repository or virtual environment that lives under /tmp.
        self.stage = tempfile.mkdtemp(prefix="grader-root-") if mode == "chroot" else ""
        cmd = [sys.executable, "-m", "grader.sandbox.worker", "--control", str(child.fileno()),
               "--repo", str(REPO_ROOT), "--mode", mode, "--stage", self.stage, "--probes", probes or "",
               "--modules", ",".join(sorted(self.modules))] + ([] if audit else ["--no-audit-hook"])
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
        self.cgroups: cgroups.Hierarchy | None = None
        try:
            self.cgroups = hierarchy()
        except cgroups.Unavailable as e:
            if self.info.get("isolated"):
                self.close()
                raise RuntimeError(f"the sandbox server ({mode} mode) cannot give workers cgroups: {e}") from None
        self.isolated = bool(self.info.get("isolated") and self.info.get("seccomp") and self.cgroups is not None)

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
                           # a per-process backstop; the judge stops the worker at cpu_seconds first
                           "cpu_seconds": int(math.ceil(limits.cpu_seconds)) + 5,
                           "max_processes": int(limits.max_processes)}}
        try:
            answer = self._exchange(("spawn", spec), fds=[req_r, rep_w])
        except BaseException:
            os.close(req_w)
            os.close(rep_r)
            raise
        finally:
            os.close(req_r)
            os.close(rep_w)
        _, pid, uid, workdir = answer
        group = None
        try:
            # Before the judge sends the first cell: everything student code will make is charged here.
            if self.cgroups is not None:
                group = self.cgroups.new_group(int(limits.memory_bytes), int(limits.max_processes))
                group.add(pid)
        except BaseException:
            self._abandon(pid, req_w, rep_r, group)
            raise
        os.set_blocking(req_w, False)
        deadline = time.monotonic() + limits.wall
        return _Worker(self, pid, uid, req_w, rep_r, deadline, limits, workdir, group)

    def _abandon(self, pid: int, req_w: int, rep_r: int, group) -> None:
        """A worker that could not be confined: it never runs anything."""
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for fd in (req_w, rep_r):
            os.close(fd)
        self.reap(pid)
        if group is not None:
            group.remove()

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
        if self.stage:
            try:  # empty here: the mounts on it lived in the server's namespace only
                os.rmdir(self.stage)
            except OSError:
                pass


def _server_env() -> dict:
    env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg",
           # Every allocation of 64 KiB or more is a mapping of its own, returned when freed, so
           # that the resident memory the judge reads (meter.py) tracks live tensors.
           "MALLOC_MMAP_THRESHOLD_": str(meter.MMAP_THRESHOLD)}
    for key in ("HOME", "COURSE_FAST", "PYTHONHASHSEED"):
        if key in os.environ:
            env[key] = os.environ[key]
    # Workers grade on the CPU: Triton kernels run in its interpreter, which must be on before
    # the fork server's preload imports triton (torch._dynamo does), or interpreted kernels
    # cannot call triton's own jit helpers (tl.zeros, tl.max, tl.sum).
    env["TRITON_INTERPRET"] = "1"
    return env


def isolation_modes() -> list[str]:
    """The isolation modes this machine supports, strongest first."""
    modes = []
    unshare = shutil.which("unshare")
    root = os.geteuid() == 0
    if unshare and root and shutil.which("mount"):
        modes.append("chroot")
    if root:
        # As root, plain mode still gives each worker a uid of its own, so C-level writes meet
        # file permissions; userns maps the worker to root itself, so it comes last.
        modes.append("plain")
    if unshare and subprocess.run([unshare, "--user", "--map-root-user", "--mount", "--net", "true"],
                                  capture_output=True).returncode == 0:
        modes.append("userns")
    return modes if root else modes + ["plain"]


_SERVERS: dict[tuple, _Server] = {}
_SERVERS_LOCK = threading.Lock()
_DEFAULT_MODE: list[str] = []
_FALLBACK_ERRORS: list[str] = []  # why the stronger modes did not start, when the default fell back
_HIERARCHY: list = []  # [cgroups.Hierarchy] or [cgroups.Unavailable], once per judge process
_HIERARCHY_LOCK = threading.Lock()


def hierarchy() -> cgroups.Hierarchy:
    """The judge's own cgroup, under which every worker gets one (made on first use; root only).

    Raises :class:`cgroups.Unavailable` with the reason where there is none to be had."""
    with _HIERARCHY_LOCK:
        if not _HIERARCHY:
            try:
                _HIERARCHY.append(cgroups.Hierarchy())
            except cgroups.Unavailable as e:
                _HIERARCHY.append(e)
    found = _HIERARCHY[0]
    if isinstance(found, cgroups.Unavailable):
        raise found
    return found


def fork_server(mode: str | None = None, probes: str | None = None, audit: bool = True) -> _Server:
    """The running server for ``mode`` (default: the strongest that starts), started on demand.

    It loads the package of trusted probes ``probes`` (default: the one the caller installed,
    ``settings.current().probes``). ``audit=False`` runs its workers without the audit hook: only
    tests that show the kernel's walls hold on their own use it."""
    probes = probes or settings.current().probes
    modules = settings.extra_modules()
    with _SERVERS_LOCK:
        modes = [mode] if mode else (_DEFAULT_MODE or isolation_modes())
        errors = []
        for m in modes:
            key = (m, os.environ.get("COURSE_FAST", ""), probes, modules, audit)
            server = _SERVERS.get(key)
            if server is None or not server.alive():
                try:
                    server = _SERVERS[key] = _Server(m, probes, modules, audit)
                except RuntimeError as e:
                    errors.append(str(e))
                    continue
            if mode is None and not _DEFAULT_MODE:
                _DEFAULT_MODE.append(m)
                _FALLBACK_ERRORS[:] = errors
                if errors:
                    warnings.warn(f"grading sandbox running in {m!r} mode, weaker than "
                                  f"{modes[0]!r}: {errors[0][:300]}", RuntimeWarning, stacklevel=3)
            return server
        raise RuntimeError("no sandbox could be started:\n" + "\n".join(errors))


def why_not_isolated(server: _Server) -> str:
    """Why ``server``'s workers are not isolated (empty when they are)."""
    reasons = []
    if os.geteuid() != 0:
        reasons.append("the grader is not running as root")
    if server.mode != "chroot":
        why = f": {_FALLBACK_ERRORS[0].strip().splitlines()[-1][:200]}" if _FALLBACK_ERRORS else ""
        reasons.append(f"the sandbox runs in {server.mode!r} mode, not 'chroot'{why}")
    if not server.info.get("seccomp"):
        reasons.append("no seccomp filter (install Debian's libseccomp2 and the Python package pyseccomp)")
    if server.cgroups is None:
        try:
            hierarchy()
        except cgroups.Unavailable as e:
            reasons.append(f"no cgroups: {e}")
    return "; ".join(reasons)


@atexit.register
def shutdown() -> None:
    """Stop every fork server (their workers die with them) and remove the judge's cgroups."""
    with _SERVERS_LOCK:
        for server in _SERVERS.values():
            server.close()
        _SERVERS.clear()
    with _HIERARCHY_LOCK:
        if _HIERARCHY and isinstance(_HIERARCHY[0], cgroups.Hierarchy):
            _HIERARCHY.pop().close()
