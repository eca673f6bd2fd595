"""The fork server: imports what grading needs once, never runs student code, forks workers.

The judge starts one server per isolation mode (``supervisor.py``) as
``python -m grader.sandbox.worker``. The server imports everything grading needs (torch,
numpy, coursekit, the codec, and every module of the package of trusted probes the judge names,
``--probes``; see ``trusted.py``), takes the integrity snapshot (``integrity.py``),
and, in ``chroot`` mode, builds the worker's view of the file system and enters it. It then
waits on its control socket; for each problem it forks a child, which runs the worker's side
(``worker.py``), and reaps it when the judge says so. The server itself runs no student code
and starts no thread (torch's thread pools stay unstarted), so forking it is safe and cheap.
"""
from __future__ import annotations

import gc
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

# Heavy imports happen in preload(), after the environment is settled.
from grader.sandbox import integrity, syscalls, trusted

# The sandbox's own modules are imported by worker.py before the server starts; grader_files()
# exposes every grader module imported by then, preload() included, to the workers.
PRELOAD = (
    "torch", "torch.utils.checkpoint", "torch._dynamo", "numpy", "coursekit", "coursekit.checks",
    "coursekit.measure", "coursekit.memory", "coursekit.graded", "grader.sandbox.codec", "matplotlib", "matplotlib.pyplot", "tqdm", "tqdm.auto",
)
UID_BASE = 1_000_000_000  # worker uid = UID_BASE + its pid: unique while it lives
WORK_BYTES = 512 * 1024**2  # tmpfs holding the workers' directories (chroot mode)
WORK_INODES = 8192
_CONTROL_CHUNK = 1 << 20


# --- control channel (judge <-> server; both trusted, so pickle) ----------------------------

def send_msg(sock: socket.socket, obj, fds=()) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    data = len(data).to_bytes(8, "big") + data
    sent = socket.send_fds(sock, [data[:_CONTROL_CHUNK]], list(fds)) if fds else sock.send(
        data[:_CONTROL_CHUNK])
    if sent < len(data):
        sock.sendall(data[sent:])


def recv_msg(sock: socket.socket):
    """(message, fds) or (None, []) at end of stream."""
    data, fds, _, _ = socket.recv_fds(sock, _CONTROL_CHUNK, 4)
    if not data:
        return None, fds
    while len(data) < 8:
        more = sock.recv(_CONTROL_CHUNK)
        if not more:
            return None, fds
        data += more
    size = int.from_bytes(data[:8], "big")
    chunks, have = [data[8:]], len(data) - 8
    while have < size:
        more = sock.recv(min(_CONTROL_CHUNK, size - have))
        if not more:
            return None, fds
        chunks.append(more)
        have += len(more)
    return pickle.loads(b"".join(chunks)), fds


# --- the server ---------------------------------------------------------------------------

def preload() -> None:
    import importlib

    import matplotlib

    matplotlib.use("Agg")
    for name in PRELOAD:
        importlib.import_module(name)


def grader_files(repo: str) -> tuple[str, ...]:
    """Source files of the grader modules the worker has imported (readable for tracebacks)."""
    names = [n for n in sys.modules if n == "grader" or n.startswith("grader.")]
    files = {os.path.realpath(sys.modules[n].__file__) for n in names
             if getattr(sys.modules[n], "__file__", None)}
    return tuple(sorted(f for f in files if f.startswith(repo + os.sep)))


CHROOT_WORK = "/.grader-work"  # the workers' tmpfs inside the chroot


def build_root(repo: str, files: tuple[str, ...], stage: str) -> str:
    """Mount the worker's view of the file system; return the new root (chroot mode only).

    Runs in the server's private mount namespace, as root, before any fork. The view holds,
    read-only: the Python installation, the virtual environment, ``coursekit/``, ``kernels/``,
    ``data/``, the grader's own pre-imported modules, system libraries; a private /proc showing
    only the caller's processes; four device nodes; and an empty ``noexec`` tmpfs for the
    workers' directories. Hidden tests, solutions, the course, submissions, gradebooks and
    everything else on the machine are simply absent.
    """
    def mount(*args):
        subprocess.run(["mount", *args], check=True, capture_output=True)

    if not stage or not os.path.isdir(stage) or os.listdir(stage):
        raise RuntimeError(f"the chroot needs an empty staging directory, got {stage!r}")
    mount("-t", "tmpfs", "-o", "size=8m,nr_inodes=4096,mode=0755", "grader-root", stage)
    root = os.path.join(stage, "root")
    os.mkdir(root)
    dirs = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix)}
    dirs |= {os.path.join(repo, d) for d in ("coursekit", "kernels", "data")}
    dirs |= {"/sys/devices/system/cpu"}
    for top in ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin"):
        if os.path.islink(top):
            os.symlink(os.readlink(top), root + top)
        elif os.path.isdir(top):
            dirs.add(top)
    def bind_read_only(src):
        mount("--bind", src, root + src)
        mount("-o", "remount,bind,ro,nosuid,nodev", root + src)

    for src in sorted(d for d in dirs if os.path.isdir(d)):  # parents before children
        os.makedirs(root + src, exist_ok=True)
        bind_read_only(src)
    for src in list(files) + ["/etc/ld.so.cache", "/etc/localtime"]:
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(root + src), exist_ok=True)
            open(root + src, "w").close()
            bind_read_only(src)
    os.makedirs(root + "/dev")
    for dev in ("null", "zero", "urandom", "random"):
        open(root + "/dev/" + dev, "w").close()
        mount("--bind", "-o", "nosuid,noexec", "/dev/" + dev, root + "/dev/" + dev)
    os.makedirs(root + "/proc")
    mount("-t", "proc", "-o", "hidepid=2,nosuid,nodev,noexec", "proc", root + "/proc")
    # Not /tmp: a checkout under /tmp is bound inside the view and must stay visible.
    os.makedirs(root + CHROOT_WORK)
    mount("-t", "tmpfs", "-o", f"size={WORK_BYTES},nr_inodes={WORK_INODES},mode=0711,nosuid,nodev,noexec",
          "grader-work", root + CHROOT_WORK)
    return root


class Server:
    """The server's state and its control loop.

    ``child(server, spec, req_fd, rep_fd)`` is what each forked child runs (the worker's side,
    ``worker.py``); the child exits when it returns. ``probe_package`` names the package of trusted
    probes: every module of it is imported before any fork, and ``probes`` maps the name of each of
    their public functions and classes to it (``trusted.probe_table``; empty without a package).
    """

    def __init__(self, control: socket.socket, repo: str, mode: str, child, stage: str = "",
                 probe_package: str = "", modules: frozenset[str] = frozenset(), audit: bool = True):
        self.control = control
        self.child = child
        self.repo = repo
        self.mode = mode
        self.stage = stage  # empty directory the chroot is built on (chroot mode)
        self.children: dict[int, str] = {}  # pid -> its directory
        self.work_base = ""
        self.snapshot: dict = {}
        self.probe_package = probe_package
        self.modules = frozenset(modules)  # importable by submissions beyond rules.LIBRARIES
        self.probes: dict = {}
        self.files: tuple[str, ...] = ()
        self.pid = os.getpid()
        # Real root (not the mapped root of a user namespace) gives each worker a uid of its own.
        self.own_uid = mode != "userns" and os.geteuid() == 0
        # chroot mode is the isolated one: every kernel wall must stand, or no worker runs.
        self.isolated = mode == "chroot"
        self.audit = audit  # the audit hook; only tests of the kernel's walls switch it off
        self.syscall_filter = None  # syscalls.build(), made in start()
        self.pid_ns_fd = -1  # this server's own PID namespace, to return to after forking into a new one

    def start(self) -> dict:
        started = time.monotonic()
        _become_subreaper()
        preload()
        self.probes = trusted.probe_table(self.probe_package) if self.probe_package else {}
        try:
            self.syscall_filter = syscalls.build()
        except syscalls.Unavailable:
            if self.isolated:
                raise
        if os.geteuid() == 0:
            self.pid_ns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY)
        self.files = grader_files(self.repo)
        self.snapshot = integrity.snapshot()
        # Everything imported so far lives as long as the server: keep it out of the collector's
        # way, so that a worker's gc.collect() (before the judge reads its memory) scans only
        # what the worker made, not the whole of torch.
        gc.collect()
        gc.freeze()
        if self.mode == "chroot":
            root = build_root(self.repo, self.files, self.stage)
            os.chroot(root)
            os.chdir("/")
            self.work_base = CHROOT_WORK
        else:
            self.work_base = tempfile.mkdtemp(prefix="grader-work-")
            if self.mode == "userns":  # a private mount namespace: bound the workers' disk use
                subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={WORK_BYTES},"
                                f"nr_inodes={WORK_INODES},mode=0711,nosuid,nodev,noexec",
                                "grader-work", self.work_base], check=True, capture_output=True)
            os.chmod(self.work_base, 0o711)  # workers reach their own directory, list nothing
        with open("/proc/self/status") as f:
            vm_kib = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
        return {"mode": self.mode, "work_base": self.work_base, "pid": os.getpid(),
                "own_uid": self.own_uid, "vm_bytes": vm_kib * 1024, "isolated": self.isolated,
                "seccomp": self.syscall_filter is not None, "audit": self.audit,
                "preload_s": time.monotonic() - started}

    def serve(self) -> None:
        send_msg(self.control, ("ready", self.start()))
        while True:
            msg, fds = recv_msg(self.control)
            if msg is None:
                break
            kind = msg[0]
            if kind == "spawn":
                send_msg(self.control, ("spawned",) + self.spawn(msg[1], fds))
            elif kind == "reap":
                send_msg(self.control, ("reaped", self.reap(msg[1])))
            elif kind == "exit":
                break
        self.shutdown()

    def spawn(self, spec: dict, fds) -> tuple:
        req_fd, rep_fd = fds
        if len(os.listdir(f"/proc/{self.pid}/task")) != 1:  # native threads count too
            raise RuntimeError("the fork server has started a thread; forking it is unsafe")
        new_pid_ns = self._enter_new_pid_namespace()
        try:
            pid = os.fork()
        finally:
            if new_pid_ns:
                _libc().setns(self.pid_ns_fd, _CLONE_NEWPID)  # later forks: a namespace of their own again
        if pid == 0:
            status = 1
            try:
                self.child(self, spec, req_fd, rep_fd)
                status = 0
            finally:
                os._exit(status)
        os.close(req_fd)
        os.close(rep_fd)
        uid = UID_BASE + pid if self.own_uid else os.getuid()
        workdir = os.path.join(self.work_base, f"w{pid}")
        self.children[pid] = workdir
        return pid, uid, workdir

    def _enter_new_pid_namespace(self) -> bool:
        """Make the next fork the first process of a new PID namespace (as root): it sees no other
        process, and when it dies the kernel kills everything left in that namespace."""
        if self.pid_ns_fd < 0:
            return False
        if _libc().unshare(_CLONE_NEWPID) == 0:
            return True
        if self.isolated:
            raise OSError("could not create a PID namespace for the worker")
        return False

    def reap(self, pid: int):
        """Kill (if needed) and wait for a child, remove its directory; return its wait status."""
        workdir = self.children.pop(pid, None)
        if workdir is None:
            return None
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            status = None
        self._reap_orphans()
        shutil.rmtree(workdir, ignore_errors=True)
        return status

    def _reap_orphans(self) -> None:
        """Kill whatever a worker left behind: orphans come to the server, a subreaper."""
        for _ in range(100):
            try:
                with open(f"/proc/{self.pid}/task/{self.pid}/children") as f:
                    orphans = {int(p) for p in f.read().split()} - set(self.children)
            except OSError:
                return
            if not orphans:
                return
            for pid in orphans:
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass

    def shutdown(self) -> None:
        for pid in list(self.children):
            self.reap(pid)
        if self.mode != "chroot":
            shutil.rmtree(self.work_base, ignore_errors=True)


_CLONE_NEWPID = 0x20000000


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _become_subreaper() -> None:
    """Processes a worker starts and abandons are re-parented to the server, which kills them."""
    pr_set_child_subreaper = 36
    _libc().prctl(pr_set_child_subreaper, 1, 0, 0, 0)
