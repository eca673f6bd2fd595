"""The worker's seccomp filter: system calls a submission's process may not make, whatever runs there.

The audit hook (``policy.py``) sees what Python code asks for; native code (ctypes, a C extension,
``_posixsubprocess``) goes around it. This filter sits in the kernel: once loaded it holds for the
life of the process and every thread it starts, and nothing in the process can lift it. The fork
server builds it once (:func:`build`, with libseccomp through ``pyseccomp``) before it forks any
worker; each worker loads it (:func:`load`) after its own set-up and imports, before the first line
of student code.

Denied, with ``EPERM`` (``ENOSYS`` for ``clone3``, so that the C library falls back to ``clone``,
which the filter can read), each for the reason given in :data:`DENIED`; a system call of another
architecture (32-bit or x32 entry points) kills the process. Threads stay possible (``clone`` with
``CLONE_THREAD``): torch's own thread pools use them, and the worker's cgroup bounds their number and
CPU time.
"""
from __future__ import annotations

import errno

CLONE_THREAD = 0x00010000
F_SETPIPE_SZ = 1031

# System call -> why a submission's process may not make it.
DENIED = {
    **dict.fromkeys(("fork", "vfork", "execve", "execveat"), "it starts a process"),
    **dict.fromkeys(("shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl",
                     "msgget", "msgsnd", "msgrcv", "msgctl"), "System V IPC outlives the process"),
    **dict.fromkeys(("mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
                     "mq_getsetattr", "memfd_create", "memfd_secret"),
                    "POSIX IPC and anonymous files hold memory outside the address-space limit"),
    **dict.fromkeys(("ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "kcmp",
                     "pidfd_open", "pidfd_getfd", "pidfd_send_signal"), "it reaches into other processes"),
    **dict.fromkeys(("mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "fsopen", "fsconfig",
                     "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr"),
                    "it changes the process's view of the system"),
    **dict.fromkeys(("socket", "socketpair"), "grading opens no sockets"),
    **dict.fromkeys(("io_uring_setup", "io_uring_enter", "io_uring_register"),
                    "io_uring performs operations this filter would not see"),
    **dict.fromkeys(("bpf", "perf_event_open", "userfaultfd", "add_key", "keyctl", "request_key",
                     "name_to_handle_at", "open_by_handle_at", "kexec_load", "kexec_file_load", "init_module",
                     "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct", "quotactl",
                     "syslog", "vhangup", "iopl", "ioperm", "sethostname", "setdomainname"),
                    "kernel facilities no exercise needs"),
}


class Unavailable(RuntimeError):
    """libseccomp, or its Python binding, is not installed."""


def build():
    """The filter, built in the fork server (``pyseccomp.SyscallFilter``; nothing is loaded yet).

    Raises :class:`Unavailable` without libseccomp."""
    try:
        import pyseccomp as seccomp
    except (ImportError, RuntimeError, OSError) as e:  # RuntimeError: "Unable to find libseccomp"
        raise Unavailable(f"seccomp is unavailable ({e}): install Debian's libseccomp2 and the "
                          "project's Python dependencies (pyseccomp)") from None
    rules = seccomp.SyscallFilter(seccomp.ALLOW)  # other architectures: the default bad-arch action, kill
    eperm = seccomp.ERRNO(errno.EPERM)
    for name in DENIED:
        try:
            rules.add_rule(eperm, name)
        except (OSError, RuntimeError, ValueError):
            pass  # not a system call on this architecture (iopl on aarch64, ...)
    rules.add_rule(eperm, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_THREAD, 0))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")  # its flags sit in memory the filter cannot read
    rules.add_rule(eperm, "fcntl", seccomp.Arg(1, seccomp.EQ, F_SETPIPE_SZ))
    return rules


def load(rules) -> None:
    """Load ``rules`` into this process (and every thread it starts later); irrevocable.

    Needs no privilege: the worker has set ``PR_SET_NO_NEW_PRIVS`` first (``confine.harden``)."""
    rules.load()
