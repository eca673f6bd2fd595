"""Confining the worker's process: its environment, resource limits, a uid, no new privileges.

These run in the forked child before any student code, in this order:
:func:`settle_environment` → :func:`apply_limits` (rlimits, as root) → :func:`drop_privileges`
(a uid of its own) → :func:`harden` (no new privileges, die with the fork server). The
in-process layer that follows them, the audit hook, is in ``policy.py``.
"""
from __future__ import annotations

import os
import resource
import signal
import sys
import tempfile

FILE_BYTES = 64 * 1024**2  # largest file the worker may write (its own directory only)
OPEN_FILES = 256


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
