"""What the worker may touch: the modules it may import, the paths it may read and write.

:func:`rules_for` computes them for one worker, before its first line of student code, from
this installation's layout (standard library, site-packages, the course packages, the worker's
own directory); the audit hook (``policy.py``) enforces them.
"""
from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass

# Top-level modules a submission of any chapter may import (besides the standard library). The
# chapters add what their own cells import (``imports:`` in their declarations, which the caller
# hands the sandbox: ``settings.Settings.modules``), e.g. ``kernels`` and ``triton``.
LIBRARIES = frozenset({
    "torch", "torchgen", "functorch", "numpy", "coursekit",
    "matplotlib", "mpl_toolkits", "matplotlib_inline", "PIL", "contourpy", "cycler", "dateutil",
    "fontTools", "kiwisolver", "pyparsing", "packaging", "six", "tqdm", "sklearn", "scipy",
    "joblib", "threadpoolctl", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "filelock",
    "fsspec", "typing_extensions", "ipywidgets", "traitlets", "comm", "IPython", "pygments",
    "einops", "safetensors", "tzdata",
})
# Modules whose only use in a submission would be an attack: importing one is refused and
# reported. (Debuggers and profilers are importable; installing their hooks is what is refused.)
DANGEROUS = frozenset({
    "ctypes", "_ctypes", "cffi", "_cffi_backend", "subprocess", "_posixsubprocess",
    "multiprocessing", "_multiprocessing", "_posixshmem", "pty", "ptyprocess", "pexpect",
    "socket", "_socket", "ssl", "_ssl", "socketserver", "http", "urllib", "urllib3", "requests",
    "httpx", "ftplib", "smtplib", "poplib", "imaplib", "nntplib", "telnetlib", "xmlrpc",
    "webbrowser", "sqlite3", "_sqlite3", "dbm", "_dbm", "_gdbm", "_xxsubinterpreters",
    "_xxinterpchannels", "_testcapi", "_testinternalcapi", "_testbuffer", "_testmultiphase",
    "_testimportmultiple", "_testclinic", "_testsinglephase", "posix", "_thread", "psutil",
    "zmq", "tornado", "grader", "solutions", "tests",
})


@dataclass(frozen=True)
class Rules:
    """What the worker may touch. Paths are absolute and normalised, without trailing slash."""

    workdir: str  # the worker's own directory: the only place it may write
    repo_root: str  # shown as relative paths in messages
    read_roots: tuple[str, ...]  # directories that may be read and listed
    read_files: tuple[str, ...]  # single files that may be read
    code_roots: tuple[str, ...]  # code compiled from files here is library code
    code_files: tuple[str, ...]  # the grader's own pre-imported modules
    quiet_roots: tuple[str, ...]  # system directories: refused reads there are not reported
    modules: frozenset[str]  # top-level modules importable while submission code runs


def _normpath(path: str) -> str:
    return os.path.normpath(os.path.abspath(path))


def rules_for(workdir: str, repo_root: str, grader_files: tuple[str, ...],
              extra_modules: frozenset[str] = frozenset()) -> Rules:
    """The rules for a worker whose own directory is ``workdir``; ``extra_modules`` are the
    top-level modules the chapters declare beyond :data:`LIBRARIES`."""
    paths = sysconfig.get_paths()
    libs = {paths["stdlib"], paths["platstdlib"], paths["purelib"], paths["platlib"],
            os.path.join(sys.base_prefix, "lib", "python%d%d.zip" % sys.version_info[:2])}
    libs |= {os.path.realpath(p) for p in libs}
    repo = _normpath(repo_root)
    course = tuple(os.path.join(repo, d) for d in ("coursekit", "kernels", "data"))
    code_roots = tuple(sorted(_normpath(p) for p in libs)) + course[:2]
    prefixes = {_normpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    prefixes |= {os.path.realpath(p) for p in prefixes}
    read_roots = code_roots + course[2:] + tuple(sorted(prefixes)) + (
        _normpath(workdir), "/sys/devices/system/cpu",
        "/usr/share/zoneinfo", "/usr/share/fonts", "/usr/share/matplotlib")
    # /proc/self only file by file: its root, cwd and fd links lead anywhere.
    proc = ("/proc/self/" + f for f in ("maps", "status", "stat", "statm", "cmdline", "limits",
                                        "auxv", "smaps", "smaps_rollup", "cgroup", "mountinfo",
                                        "mounts", "comm", "io", "oom_score", "fd", "task"))
    read_files = tuple(grader_files) + tuple(proc) + (
        "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/etc/localtime",
        "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/etc/ld.so.cache")
    stdlib = frozenset(m for m in sys.stdlib_module_names if not m.startswith("_test"))
    return Rules(
        workdir=_normpath(workdir), repo_root=repo, read_roots=read_roots,
        read_files=read_files, code_roots=code_roots, code_files=tuple(grader_files),
        quiet_roots=("/etc", "/proc", "/sys", "/usr", "/lib", "/lib64", "/lib32", "/bin",
                     "/sbin", "/dev", "/run", "/var", "/opt", "/snap", "/nix"),
        modules=(stdlib | LIBRARIES | frozenset(extra_modules)) - DANGEROUS,
    )
