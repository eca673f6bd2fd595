"""Confining the worker's process: its environment, resource limits, a uid, no new privileges.

These run in the forked child before any student code, in this order: :func:`own_namespaces`
(as root) → :func:`settle_environment` → :func:`apply_limits` (rlimits) → :func:`drop_privileges`
(a uid of its own) → :func:`harden` (no new privileges, die with the fork server); then, once the
worker's imports are done, the seccomp filter (``syscalls.py``). The in-process layer that follows
them, the audit hook, is in ``policy.py``. The judge puts the worker in a cgroup of its own
(``cgroups.py``) before it sends the first cell.
"""
from __future__ import annotations

import os
import resource
import signal
import sys
import tempfile

FILE_BYTES = 64 * 1024**2  # largest file the worker may write (its own directory only)
OPEN_FILES = 256
WORKDIR_BYTES = 128 * 1024**2  # the worker's own tmpfs: all its files together
WORKDIR_INODES = 1024

_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWNET, _CLONE_NEWUTS = 0x00020000, 0x08000000, 0x40000000, 0x04000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18


def settle_environment(workdir: str, repo: str) -> None:
    """Caches and temporary files go to the worker's directory; the repository leaves sys.path."""
    for key in list(os.environ):
        if key not in ("PATH", "LANG", "LC_ALL", "COURSE_FAST", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                       "OPENBLAS_NUM_THREADS", "MPLBACKEND", "PYTHONHASHSEED", "TRITON_INTERPRET"):
            del os.environ[key]
    for key in ("HOME", "TMPDIR", "MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME",
                "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_HOME"):
        os.environ[key] = workdir
    os.environ["USER"] = os.environ["LOGNAME"] = "student"
    tempfile.tempdir = workdir
    sys.path[:] = [p for p in sys.path if p not in ("", ".", repo)]


def own_namespaces(workdir: str, work_base: str, uid: int, shared_root: bool, strict: bool) -> bool:
    """Give the worker namespaces of its own and a file system of its own.

    New mount, IPC, network and UTS namespaces (the PID namespace was made by the fork server, which
    forked this process into a new one as its first process): System V and POSIX IPC objects, any
    network interface and the host name are the worker's alone and vanish with it. In the new mount
    namespace a tmpfs on ``workdir`` has its own byte and inode limits, the shared directory that
    holds every worker's directory is read-only, and a fresh ``/proc`` shows only the worker's own
    PID namespace. Needs CAP_SYS_ADMIN (root, or root mapped in a user namespace); returns False, and
    changes nothing, without it unless ``strict`` (then it raises: a worker that cannot isolate
    itself must not run). ``shared_root``: the server runs in the machine's own mount namespace (plain
    mode), whose mounts may propagate. Uses ctypes: this runs before the audit hook, in trusted code.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)

    def mount(source, target, fstype, flags, data=None) -> None:
        enc = (lambda v: None if v is None else v.encode())
        if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {target}: {os.strerror(err)}")

    if libc.unshare(_CLONE_NEWNS | _CLONE_NEWIPC | _CLONE_NEWNET | _CLONE_NEWUTS) != 0:
        err = ctypes.get_errno()
        if strict:
            raise OSError(err, f"unshare: {os.strerror(err)}")
        if libc.unshare(_CLONE_NEWNS) != 0:
            return False
    else:
        name = b"grader"
        libc.sethostname(name, len(name))
    if shared_root:  # no private namespace around the server: keep our mounts from propagating out
        mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    if os.path.ismount(work_base):
        mount(None, work_base, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    mount("grader-worker", workdir, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
          f"size={WORKDIR_BYTES},nr_inodes={WORKDIR_INODES},mode=0700,uid={uid},gid={uid}")
    if os.getpid() == 1:  # the first process of a PID namespace of its own: a /proc of that namespace
        mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    return True


def apply_limits(memory_bytes: int, cpu_seconds: int, max_processes: int,
                 file_bytes: int = FILE_BYTES, open_files: int = OPEN_FILES) -> None:
    """Set soft and hard limits together, so that the worker cannot raise them again."""
    for which, value in (
        (resource.RLIMIT_AS, memory_bytes),
        (resource.RLIMIT_NPROC, max_processes),  # threads count too: a fork/thread bomb stops here
        (resource.RLIMIT_FSIZE, file_bytes),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NOFILE, open_files),
        (resource.RLIMIT_MSGQUEUE, 0),
        (resource.RLIMIT_MEMLOCK, 64 * 1024),
    ):
        soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))
    # CPU: SIGXCPU at the limit (a clear message), SIGKILL a second later if it is ignored.
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    hard = cpu_seconds + 1 if hard == resource.RLIM_INFINITY else min(hard, cpu_seconds + 1)
    resource.setrlimit(resource.RLIMIT_CPU, (min(cpu_seconds, hard), hard))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails instead of killing


def drop_privileges(uid: int) -> None:
    """Become ``uid`` (and gid ``uid``) for good; a no-op when not running as root."""
    if os.geteuid() != 0:
        return
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid):
        raise RuntimeError("could not drop privileges")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise RuntimeError("privileges were not dropped: setuid(0) succeeded")


def harden() -> None:
    """No new privileges through exec, die with the fork server, keep /proc/self readable.

    Uses ctypes, which is fine here: this runs before the audit hook, in trusted code.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig, pr_set_dumpable, pr_set_no_new_privs = 1, 4, 38
    for option, value in (
        (pr_set_no_new_privs, 1),
        (pr_set_pdeathsig, int(signal.SIGKILL)),
        # Changing uid made the process non-dumpable, which makes /proc/self root-owned; the
        # uid is the worker's alone and RLIMIT_CORE is 0, so being dumpable exposes nothing.
        (pr_set_dumpable, 1),
    ):
        if libc.prctl(option, value, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")
