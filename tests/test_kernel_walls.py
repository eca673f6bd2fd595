"""The sandbox's walls stand in the kernel: with the audit hook switched off, they still hold.

The audit hook and the source policy are defence in depth. These tests run workers of a fork server
started without the audit hook (``fork_server(audit=False)``) and give them code that calls the C
library directly (ctypes, ``_posixsubprocess``, raw system calls): whatever runs inside a worker,
the kernel refuses new processes, IPC, sockets and pipe resizing (seccomp), a worker sees only
itself (PID, mount, IPC, network and UTS namespaces of its own), everything it holds is charged to a
cgroup of its own that the judge reads from outside, its CPU is one core, and killing it frees all
it made. They need root (the isolated mode); CI runs as root and sets REQUIRE_ISOLATION=1, which
turns the skip into a failure.
"""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from grader.api import fetch
from grader.sandbox import cgroups, syscalls
from grader.sandbox.handles import RemoteNamespace
from grader.sandbox.judge import Limits
from grader.sandbox.supervisor import fork_server, hierarchy, isolation_modes

MiB = 1024**2
LIMITS = Limits(cpu_seconds=30.0, memory_bytes=3 * 1024**3, output_bytes=64 * 1024)


def _isolated() -> str | None:
    """Why this machine cannot run the isolated mode, or None."""
    if "chroot" not in isolation_modes():
        return "needs root, unshare and mount (the isolated chroot mode)"
    try:
        syscalls.build()
        hierarchy()
    except (syscalls.Unavailable, cgroups.Unavailable) as e:
        return str(e)
    return None


WHY = _isolated()
if WHY and os.environ.get("REQUIRE_ISOLATION"):
    raise RuntimeError(f"REQUIRE_ISOLATION is set but the isolated sandbox cannot run here: {WHY}")
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")

ATTACKS = r'''
import ctypes, errno, fcntl, mmap, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SYS = {"fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "execve": 59, "shmget": 29, "msgget": 68,
       "semget": 64, "socket": 41, "socketpair": 53, "ptrace": 101, "unshare": 272, "setns": 308,
       "mount": 165, "memfd_create": 319, "io_uring_setup": 425, "bpf": 321, "userfaultfd": 323,
       "perf_event_open": 298, "process_vm_readv": 310, "pidfd_open": 434, "keyctl": 250}
SIGCHLD = 17

def raw(name, *args):
    """Result and errno of a raw system call (no C-library wrapper, no audit event)."""
    ctypes.set_errno(0)
    result = libc.syscall(SYS[name], *[ctypes.c_long(a) for a in args])
    return result, ctypes.get_errno()

def attempt(fn):
    try:
        value = fn()
    except OSError as e:
        return "refused " + errno.errorcode.get(e.errno, str(e.errno))
    except Exception as e:
        return "failed " + type(e).__name__
    if isinstance(value, int) and value == 0:
        os._exit(0)  # a child that came into being: it must never get here
    return "ran"

def new_processes():
    """Every route to a new process: each must be refused."""
    import _posixsubprocess, subprocess, pty, multiprocessing
    found = {}
    found["os.fork"] = attempt(os.fork)
    found["os.posix_spawn"] = attempt(lambda: os.posix_spawn("/bin/true", ["true"], {}))
    found["os.system"] = "refused" if os.system("true") != 0 else "ran"
    found["subprocess"] = attempt(lambda: subprocess.Popen(["/bin/true"]).wait())
    found["pty.fork"] = attempt(pty.fork)
    found["multiprocessing"] = attempt(lambda: multiprocessing.get_context("fork").Process(target=print).start())
    found["fork_exec"] = attempt(lambda: _posixsubprocess.fork_exec(
        ["/bin/true"], [b"/bin/true"], True, (), None, None, -1, -1, -1, -1, -1, -1, *os.pipe(),
        False, True, -1, None, None, -1, -1, None, False))
    found["libc.fork"] = "refused" if libc.fork() < 0 else "ran"
    for name, args in (("fork", ()), ("vfork", ()), ("clone", (SIGCHLD, 0, 0, 0, 0)),
                       ("clone3", (0, 0)), ("execve", (0, 0, 0))):
        result, err = raw(name, *args)
        if result == 0:
            os._exit(0)
        found["raw " + name] = f"refused {errno.errorcode.get(err, err)}" if result < 0 else "ran"
    found["os.execv"] = attempt(lambda: os.execv("/bin/true", ["true"]))
    return found

def kernel_facilities():
    found = {}
    for name, args in (("shmget", (0, 1 << 26, 0o1000 | 0o600)), ("msgget", (0, 0o1000 | 0o600)),
                       ("semget", (0, 1, 0o1000 | 0o600)), ("socket", (1, 1, 0)),
                       ("socketpair", (1, 1, 0, 0)), ("ptrace", (16, 1, 0, 0)), ("unshare", (0x08000000,)),
                       ("setns", (0, 0)), ("mount", (0, 0, 0, 0, 0)), ("memfd_create", (0, 0)),
                       ("io_uring_setup", (8, 0)), ("bpf", (0, 0, 0)), ("userfaultfd", (0,)),
                       ("perf_event_open", (0, 0, -1, -1, 0)), ("process_vm_readv", (1, 0, 0, 0, 0, 0)),
                       ("pidfd_open", (1, 0)), ("keyctl", (0, 0))):
        result, err = raw(name, *args)
        found[name] = f"refused {errno.errorcode.get(err, err)}" if result < 0 else "ran"
    import socket
    found["socket module"] = attempt(lambda: socket.socket(socket.AF_UNIX).close())
    r, w = os.pipe()
    found["pipe resize"] = attempt(lambda: fcntl.fcntl(w, 1031, 1 << 20))
    return found

kept = []

def hoard_pipes(n):
    """Fill ``n`` pipes (64 KiB of kernel buffer each) and keep them open."""
    for _ in range(n):
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            while True:
                os.write(w, b"x" * 4096)
        except BlockingIOError:
            pass
        kept.append((r, w))
    return len(kept)

def hoard_shared(n):
    """Shared anonymous memory, which no process's private resident set shows."""
    m = mmap.mmap(-1, n, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    m.write(b"x" * n)
    kept.append(m)

def hoard_files(n):
    with open("hoard.bin", "wb") as f:
        f.write(b"x" * n)

def threads_busy(seconds, count):
    """``count`` native threads (torch's intra-op pool) busy for ``seconds`` of wall time."""
    import torch
    torch.set_num_threads(count)
    a = torch.randn(256, 256)
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        a @ a
    return torch.get_num_threads()

def view():
    import socket
    return {"pid": os.getpid(), "processes": sorted(p for p in os.listdir("/proc") if p.isdigit()),
            "hostname": socket.gethostname(), "interfaces": sorted(os.listdir("/sys/class/net"))
            if os.path.isdir("/sys/class/net") else []}

def wrong_architecture():
    return libc.syscall(0x40000000 + 39)  # x32 getpid: a 64-bit filter must not be sidestepped
'''


@pytest.fixture(scope="module")
def server():
    return fork_server(audit=False)


@pytest.fixture
def worker(server):
    w = server.spawn(LIMITS)
    try:
        w.run_program([ATTACKS])
        assert not w.cell_errors, w.cell_errors
        yield w
    finally:
        w.close()


def test_the_server_runs_isolated_without_the_audit_hook(server):
    assert server.isolated and server.info["seccomp"] and not server.info["audit"]


def test_no_route_to_a_new_process(worker):
    found = fetch(RemoteNamespace(worker).new_processes())
    assert all(v.startswith(("refused", "failed")) for v in found.values()), found
    assert found["raw fork"] == found["raw clone"] == found["raw execve"] == "refused EPERM", found
    assert found["raw clone3"] == "refused ENOSYS", found  # the C library then falls back to clone
    assert worker.group.pids() == [worker.pid]


def test_ipc_sockets_and_kernel_facilities_are_refused(worker):
    found = fetch(RemoteNamespace(worker).kernel_facilities())
    assert found == {name: "refused EPERM" for name in found}, found


def test_threads_stay_possible_and_share_one_core(worker):
    nb = RemoteNamespace(worker)
    before = worker.cpu_used()
    start = time.monotonic()
    assert fetch(nb.threads_busy(2.0, 8)) == 8
    wall = time.monotonic() - start
    # One core at most, whatever the machine's load (a busy machine only lowers the ratio).
    assert worker.cpu_used() - before <= 1.15 * wall + 0.1, (worker.cpu_used() - before, wall)


def test_a_worker_sees_only_itself(worker, server):
    seen = fetch(RemoteNamespace(worker).view())
    assert seen["pid"] == 1 and seen["processes"] == ["1"], seen
    assert seen["hostname"] == "grader"
    assert seen["interfaces"] in ([], ["lo"]), seen
    other = server.spawn(LIMITS)
    try:
        for ns in ("pid_for_children", "ipc", "net", "uts", "mnt"):
            mine, theirs = (os.readlink(f"/proc/{p}/ns/{ns}") for p in (worker.pid, other.pid))
            assert mine != theirs and mine != os.readlink(f"/proc/self/ns/{ns}"), ns
        with open(f"/proc/{worker.pid}/status") as f:
            assert "Seccomp:\t2" in f.read()
    finally:
        other.close()


def test_what_the_kernel_holds_for_a_worker_is_charged_to_it(worker):
    nb = RemoteNamespace(worker)
    base = nb.memory()
    assert fetch(nb.hoard_pipes(100)) == 100  # 100 x 64 KiB in pipe buffers: no process's memory
    pipes = nb.memory()
    assert pipes.held - base.held >= 6 * MiB, (pipes, base)
    nb.hoard_shared(64 * MiB)
    shared = nb.memory()
    assert shared.held - pipes.held >= 63 * MiB, (shared, pipes)
    nb.hoard_files(32 * MiB)
    assert nb.memory().held - shared.held >= 31 * MiB


def test_killing_a_worker_frees_all_it_made(server):
    w = server.spawn(LIMITS)
    group_dirs = list(w.group.dirs.values())
    w.run_program([ATTACKS])
    nb = RemoteNamespace(w)
    nb.hoard_pipes(50)
    nb.hoard_shared(64 * MiB)
    nb.threads_busy(0.2, 4)
    before = subprocess.run(["ipcs", "-m"], capture_output=True, text=True).stdout
    w.close()
    with pytest.raises(ProcessLookupError):
        os.kill(w.pid, 0)
    assert not any(os.path.exists(d) for d in group_dirs)
    assert not os.path.exists(f"/proc/{w.pid}")
    assert subprocess.run(["ipcs", "-m"], capture_output=True, text=True).stdout == before


def test_a_syscall_of_another_architecture_kills_the_worker(worker):
    with pytest.raises(BaseException) as stopped:
        fetch(RemoteNamespace(worker).wrong_architecture())
    assert "system call of another architecture" in str(stopped.value)


def test_the_cgroup_memory_limit_binds_what_the_address_space_limit_does_not(worker):
    """tmpfs pages and kernel buffers lie outside RLIMIT_AS: the group's limit stops them (lowered here to
    64 MiB above what the worker holds, so that files alone cross it)."""
    nb = RemoteNamespace(worker)
    worker.group.limit_memory(nb.memory().held + 64 * MiB)
    with pytest.raises(BaseException) as stopped:
        nb.hoard_files(120 * MiB)
        nb.hoard_pipes(100)
        nb.hoard_shared(64 * MiB)
    assert "memory limit" in str(stopped.value) or "OSError" in str(stopped.value), stopped.value


OUTLIVE = r'''
import ctypes, os, signal, threading
libc = ctypes.CDLL(None, use_errno=True)

def dig_in():
    """Everything a process might try to survive its kill: each either fails or dies with it."""
    tried = {}
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    tried["setsid"] = libc.setsid()
    tried["daemon"] = libc.daemon(0, 0)  # forks: refused
    tried["no death signal"] = libc.prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG 0
    os.makedirs("cg", exist_ok=True)
    tried["mount cgroup"] = libc.mount(b"cgroup", b"cg", b"cgroup", 0, b"memory")
    tried["own cgroup view"] = os.path.exists("/sys/fs/cgroup/memory")
    import torch
    torch.set_num_threads(4)
    a = torch.randn(64, 64)
    for _ in range(200):
        a = torch.tanh(a @ a)  # native threads of torch's pool, alive until the process ends
    return tried
'''


def test_a_worker_cannot_outlive_its_kill(server):
    w = server.spawn(LIMITS)
    w.run_program([OUTLIVE])
    assert not w.cell_errors, w.cell_errors
    tried = fetch(RemoteNamespace(w).dig_in())
    assert tried["daemon"] == -1 and tried["mount cgroup"] == -1 and not tried["own cgroup view"], tried
    tasks = os.listdir(f"/proc/{w.pid}/task")
    assert len(tasks) > 1  # torch's threads
    group_dirs = list(w.group.dirs.values())
    w.close()
    assert not os.path.exists(f"/proc/{w.pid}")
    assert not any(os.path.exists(f"/proc/{t}") for t in tasks)
    assert not any(os.path.exists(d) for d in group_dirs)


HOG = '''def predict_training_memory(model, batch_size, optimizer):
    """Spins every core it can get, on as many threads as torch will start."""
    torch.set_num_threads(32)
    a = torch.randn(512, 512)
    while True:
        a = torch.tanh(a @ a)
'''


def test_a_cpu_hog_graded_beside_an_honest_student_changes_nothing(tmp_path):
    """Two submissions graded at once: the hog's threads share one core and its time runs out in CPU
    seconds; the honest student's cells, timed in their own CPU seconds, score exactly as alone."""
    from grader import autograde
    from submissions import reference, with_exercise, write

    sub, out = tmp_path / "submitted", tmp_path / "out"
    write(sub, "a-hog", "ch00_memory", with_exercise("ch00_memory", "predict_training_memory", HOG))
    write(sub, "b-honest", "ch00_memory", reference("ch00_memory"))
    results = {r.student: r for r in autograde.autograde(sub, out, workers=2, timeout=8, progress=False,
                                                         log=lambda *a: None)}
    assert results["b-honest"].score == results["b-honest"].max_score > 0, results["b-honest"].outcomes
    assert results["a-hog"].score == 0
    first = results["a-hog"].outcomes["test_predict_training_memory"].reason
    assert first == "your code used more CPU time than the time limit of 8 s allows", first
