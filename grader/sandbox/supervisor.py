"""The judge's hold on the sandbox's processes: fork servers and the workers they fork.

One fork server runs per isolation mode (``forkserver.py``), started on demand by
:func:`fork_server` (the strongest mode that starts, by default) and stopped by
:func:`shutdown` at exit. For each problem the judge has it fork a worker and holds it as a
``_Worker``: the judge's end of its pipes (``rpc.Connection``), why it died, and a ``close``
that, on every exit path, kills its process group and every process of its uid, has the
server reap it, and removes its directory.
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

from grader.sandbox import meter, settings
from grader.sandbox.forkserver import recv_msg, send_msg
from grader.sandbox.limits import Limits
from grader.sandbox.rpc import Connection, Stop

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVER_START_SECONDS = 180.0
CONTROL_SECONDS = 60.0  # the fork server answers spawn/reap well within this


class _Worker(Connection):
    """One problem's worker process, as the judge sees it."""

    def __init__(self, server: "_Server", pid: int, uid: int, req_fd: int, rep_fd: int,
                 deadline: float, limits: Limits, workdir: str):
        super().__init__(req_fd, rep_fd, deadline, limits.wall_seconds, probes=server.probes)
        self.server, self.pid, self.uid, self.limits = server, pid, uid, limits
        self.workdir = workdir  # as the worker sees it
        self.status = None

    def memory(self, reset_peak: bool = False) -> meter.Memory:
        """Memory the worker holds, read from /proc between two requests (the worker is idle).

        Resident memory of every process of the worker's uid (its own pid only when it shares the
        judge's uid), plus the bytes on its own work file system; ``peak`` is the worker's resident
        high-water mark since the last ``reset_peak=True`` reading. Handles the judge let go of are
        dropped (and garbage collected) in the worker first.
        """
        self.settle()
        try:
            reading = meter.read(self.pid, self.workdir)
            others = sum(meter.read(p).resident for p in _uid_processes(self.uid) if p != self.pid) \
                if self.server.info.get("own_uid") else 0
            if reset_peak:
                meter.reset_peak(self.pid)
                reading = meter.read(self.pid, self.workdir)
        except OSError:
            raise Stop(self.death_reason()) from None
        return meter.Memory(reading.resident + others, reading.peak + others, reading.files)

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
                        f"{format_seconds(self.limits.wall_seconds)} allows")
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            return (f"your code's process was stopped by signal {name} (it may have exceeded the "
                    f"memory limit of {format_size(self.limits.memory_bytes)})")
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

    def __init__(self, mode: str, probes: str | None = None, modules: frozenset[str] = frozenset()):
        self.mode = mode
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
               "--modules", ",".join(sorted(self.modules))]
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
        _, pid, uid, workdir = answer
        os.set_blocking(req_w, False)
        return _Worker(self, pid, uid, req_w, rep_r, deadline, limits, workdir)

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


def fork_server(mode: str | None = None, probes: str | None = None) -> _Server:
    """The running server for ``mode`` (default: the strongest that starts), started on demand.

    It loads the package of trusted probes ``probes`` (default: the one the caller installed,
    ``settings.current().probes``)."""
    probes = probes or settings.current().probes
    modules = settings.extra_modules()
    with _SERVERS_LOCK:
        modes = [mode] if mode else (_DEFAULT_MODE or isolation_modes())
        errors = []
        for m in modes:
            key = (m, os.environ.get("COURSE_FAST", ""), probes, modules)
            server = _SERVERS.get(key)
            if server is None or not server.alive():
                try:
                    server = _SERVERS[key] = _Server(m, probes, modules)
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
