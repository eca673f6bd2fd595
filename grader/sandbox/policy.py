"""What the sandbox worker may do: resource limits, privilege drop, audit hook, integrity check.

Everything here runs inside the worker before the first line of student code, in this order:
:func:`apply_limits` (rlimits, as root) → :func:`drop_privileges` (a uid of its own) →
:func:`harden` (no new privileges, die with the fork server) → :func:`disarm` →
:func:`install_audit_hook` (irrevocable). :func:`snapshot` is taken earlier, in the fork
server; :func:`integrity_check` compares against it before a trusted probe runs.

The audit hook is the in-process layer: it turns what a submission must not do into a
``PermissionError`` (or ``ImportError``) with a clear message, and *reports* the serious
attempts to the judge, which then fails the problem with "your code tried to ...". It is not
the only wall: C code (torch's own file I/O, for instance) raises no audit events, which is
why the worker also runs in a private mount namespace with a read-only view of only what
grading needs, as a uid that owns nothing, without network (see ``judge.py``).
"""
from __future__ import annotations

import os
import resource
import signal
import sys
import sysconfig
from dataclasses import dataclass
from types import FunctionType, ModuleType

DENIED = "is not allowed during grading"

# Top-level modules a submission may import (besides the standard library).
LIBRARIES = frozenset({
    "torch", "torchgen", "functorch", "numpy", "coursekit", "kernels", "triton",
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
_PROCESS = {"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
            "subprocess.Popen", "pty.spawn", "os.startfile"}
_SIGNALS = {"os.kill", "os.killpg", "signal.pthread_kill"}
_NETWORK_PREFIXES = ("socket.", "urllib.", "http.client.", "ftplib.", "smtplib.", "poplib.",
                     "imaplib.", "nntplib.", "telnetlib.", "webbrowser.", "syslog.")
_ALWAYS = {  # event → what it would have done; denied whoever calls it
    "sys.settrace": "install a tracing hook (sys.settrace)",
    "sys.setprofile": "install a profiling hook (sys.setprofile)",
    "sys._current_frames": "inspect other threads' frames",
    "sys._current_exceptions": "inspect other threads' exceptions",
    "sys.addaudithook": "install an audit hook",
    "sys.monitoring.register_callback": "install a monitoring hook",
    "gc.get_objects": "walk the garbage collector's objects",
    "gc.get_referrers": "walk the garbage collector's referrers",
    "gc.get_referents": "walk the garbage collector's referents",
    "cpython.PyInterpreterState_New": "start a sub-interpreter",
    "resource.setrlimit": "change resource limits",
    "resource.prlimit": "change resource limits",
    "os.link": "create a hard link",
    "os.symlink": "create a symbolic link",
    "os.mknod": "create a device node",
}
# Denied when the code asking is the submission's own (not the library or stdlib it calls).
_FROM_SUBMISSION = {
    "sys._getframe": "inspect stack frames (sys._getframe)",
    "object.__getattr__": "read interpreter internals (frames, tracebacks, code objects)",
    "code.__new__": "build code objects",
    "marshal.loads": "load marshalled code",
    "marshal.load": "load marshalled code",
}
_SETATTR = ("object.__setattr__", "object.__delattr__")
# Events that write to paths: event → ((path argument, its dir_fd argument or None), ...).
_WRITES = {
    "os.mkdir": ((0, 2),), "os.rmdir": ((0, 1),), "os.remove": ((0, 1),),
    "os.rename": ((0, 2), (1, 3)), "os.truncate": ((0, None),), "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),), "os.utime": ((0, 3),), "os.chflags": ((0, None),),
    "os.lchflags": ((0, None),), "os.setxattr": ((0, None),), "os.removexattr": ((0, None),),
    "shutil.rmtree": ((0, 1),), "shutil.copyfile": ((1, None),), "shutil.copymode": ((1, None),),
    "shutil.copystat": ((1, None),), "shutil.copytree": ((1, None),), "shutil.move": ((0, None), (1, None)),
    "shutil.chown": ((0, None),), "shutil.unpack_archive": ((1, None),),
    "shutil.make_archive": ((0, None),), "tempfile.mkstemp": ((0, None),),
    "tempfile.mkdtemp": ((0, None),), "sqlite3.connect": ((0, None),),
}
_READS = {"os.listdir": 0, "os.scandir": 0, "os.getxattr": 0, "os.listxattr": 0, "os.chdir": 0,
          "shutil.copyfile": 0, "shutil.copytree": 0}
_QUIET = {"builtins.input": "read from standard input", "builtins.breakpoint": "start a debugger"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_NOT_INTERESTING = frozenset({
    "exec", "builtins.id", "pickle.find_class", "function.__new__", "time.sleep", "os.putenv",
    "os.unsetenv", "array.__new__", "mmap.__new__", "sys.excepthook", "sys.unraisablehook",
    "os.walk", "fcntl.fcntl", "fcntl.ioctl", "fcntl.flock", "fcntl.lockf", "socket.gethostname",
    "cpython.run_command", "cpython.run_module", "cpython.run_file", "cpython.run_stdin",
    "cpython.run_interactivehook", "cpython.run_startup", "cpython._PySys_ClearAuditHooks",
    "open_code", "locale.setlocale",
})


class Denied(PermissionError):
    """An action the grading sandbox refuses."""


class DeniedImport(ModuleNotFoundError):
    """An import the grading sandbox refuses (a ModuleNotFoundError, so optional imports fall back)."""


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


def rules_for(workdir: str, repo_root: str, grader_files: tuple[str, ...]) -> Rules:
    """The rules for a worker whose own directory is ``workdir``."""
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
        modules=(stdlib | LIBRARIES) - DANGEROUS,
    )


# --- limits and privileges ----------------------------------------------------------------

FILE_BYTES = 64 * 1024**2  # largest file the worker may write (its own directory only)
OPEN_FILES = 256


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


def _no_threads(*args, **kwargs):
    raise Denied(f"starting a thread {DENIED}")


def disarm() -> None:
    """Remove two facilities that raise no audit event.

    Python threads would run beside the grader's requests (``_thread.start_new_thread`` has no
    audit event before Python 3.13); anonymous memory files escape the address-space limit.
    """
    import _thread
    import threading

    _thread.start_new_thread = _thread.start_new = _no_threads
    threading._start_new_thread = _no_threads
    for name in ("memfd_create",):  # anonymous files escape the address-space limit
        for mod in (os, sys.modules.get("posix")):
            if mod is not None and hasattr(mod, name):
                delattr(mod, name)


# --- the audit hook -----------------------------------------------------------------------

def install_audit_hook(rules: Rules, report) -> None:
    """Install the policy; ``report(what)`` tells the judge about a serious attempt.

    The hook keeps everything it needs in its closure, captured now: a submission can rebind
    ``os.getcwd`` or ``sys._getframe`` afterwards without changing what the hook calls. It never
    runs code a submission could have replaced or subclassed: types are tested with ``type()``
    and ``issubclass`` on built-in classes, paths are copied to exact ``str`` before use, and
    path-like objects it cannot read safely are left to the lower-level events they lead to.
    """
    # Everything the hook uses is bound here, once. Module globals (this module's tables
    # included) and builtins can be rebound by the submission later; these cannot.
    type_, issubclass_, len_, slice_, bool_, any_ = type, issubclass, len, slice, bool, any
    str_, bytes_, int_, os_error = str, bytes, int, OSError
    writes_table, reads_table, always = dict(_WRITES), dict(_READS), dict(_ALWAYS)
    from_submission, quiet = dict(_FROM_SUBMISSION), dict(_QUIET)
    process, signals, setattr_events = frozenset(_PROCESS), frozenset(_SIGNALS), frozenset(_SETATTR)
    not_interesting, network_prefixes = _NOT_INTERESTING, _NETWORK_PREFIXES
    write_flags, dangerous, denied = _WRITE_FLAGS, DANGEROUS, DENIED
    denied_error, denied_import = Denied, DeniedImport
    function_type, module_type = FunctionType, ModuleType
    getframe = sys._getframe
    getcwd = os.getcwd
    readlink = os.readlink
    as_str = str.__str__
    bytes_slice = bytes.__getitem__
    code_of = FunctionType.__code__.__get__
    module_of = type.__dict__["__module__"].__get__
    own_proc = "/proc/%d" % os.getpid()
    machinery = ("<frozen importlib", os.path.dirname(os.__file__) + "/importlib/__init__.py")
    stdlib_any = frozenset(m for m in sys.stdlib_module_names
                           if not m.startswith(("_test", "_xx")))
    busy = [False]
    library_file: dict[str, bool] = {}

    def within(path: str, roots) -> bool:
        for root in roots:
            if path == root or path.startswith(root + "/"):
                return True
        return False

    def text(path):
        """Exact str for a str/bytes argument, else None (an fd, None, or an object)."""
        kind = type_(path)
        if kind is str_ or issubclass_(kind, str_):
            return as_str(path)
        if kind is bytes_ or issubclass_(kind, bytes_):
            return bytes_slice(path, slice_(None)).decode("utf-8", "surrogateescape")
        return None

    def norm(path: str, dir_fd=None) -> str:
        if not path.startswith("/"):
            base = getcwd()
            if type_(dir_fd) is int_ and dir_fd >= 0:
                try:
                    base = readlink("/proc/self/fd/%d" % dir_fd)
                except os_error:
                    base = "/nonexistent-directory-descriptor"
            path = base + "/" + path
        parts: list[str] = []
        for part in path.split("/"):
            if part == "" or part == ".":
                continue
            if part == "..":
                if parts:
                    parts.pop()
                continue
            parts.append(part)
        path = "/" + "/".join(parts)
        if path == own_proc or path.startswith(own_proc + "/"):
            path = "/proc/self" + path[len_(own_proc):]
        return path

    def shown(path: str) -> str:
        if path.startswith(rules.repo_root + "/"):
            path = path[len_(rules.repo_root) + 1:]
        return path if len_(path) <= 120 else path[:117] + "..."

    def is_library(filename) -> bool:
        filename = text(filename)
        if filename is None:
            return False
        known = library_file.get(filename)
        if known is None:
            known = (filename.startswith("<frozen ") or filename in rules.code_files
                     or within(filename, rules.code_roots))
            if len_(library_file) < 10000:
                library_file[filename] = known
        return known

    def importer(frame):
        while frame is not None and text(frame.f_code.co_filename).startswith(machinery):
            frame = frame.f_back
        return frame

    def submission_on_stack(frame) -> bool:
        while frame is not None:
            if not is_library(frame.f_code.co_filename):
                return True
            frame = frame.f_back
        return False

    def read_verdict(arg, dir_fd=None):
        path = text(arg)
        if path is None:
            return None
        p = norm(path, dir_fd)
        if p in rules.read_files or within(p, rules.read_roots):
            return None
        return (not within(p, rules.quiet_roots), "read " + shown(p))

    def write_verdict(arg, dir_fd=None, event=""):
        path = text(arg)
        if type_(arg) is int_ and arg >= 0 and event != "open":
            try:  # chmod/chown/utime on a descriptor: judge the file it names
                path = readlink("/proc/self/fd/%d" % arg)
            except os_error:
                return None
            if not path.startswith("/"):
                return None  # a pipe, socket or anonymous file
        if path is None:
            # A path-like object: its open/unlink/rename events come next and are checked
            # there. sqlite3 opens files in C, so it gets no second chance.
            return (True, "open a database") if event == "sqlite3.connect" else None
        if event == "sqlite3.connect" and path in (":memory:", ""):
            return None
        p = norm(path, dir_fd)
        if p == "/dev/null" or within(p, (rules.workdir,)):
            return None
        return (True, "write " + shown(p))

    def library_target(obj) -> bool:
        kind = type_(obj)
        if kind is function_type:
            return is_library(code_of(obj).co_filename)
        if issubclass_(kind, type_):
            module = text(module_of(obj, type_))
            return module is None or module.split(".")[0] != "__main__"
        return kind is module_type

    def verdict(event: str, args: tuple):
        """None to allow, else (report it?, what was attempted)."""
        if event == "open":
            path, mode, flags = args
            mode = text(mode) or ""
            writes = bool_(flags & write_flags) or any_(c in mode for c in "wax+")
            return write_verdict(path, None, "open") if writes else read_verdict(path)
        if event == "import":
            name = text(args[0]) or ""
            top = name.split(".")[0]
            if top == "grader":
                return (True, "import " + name[:80])
            frame = getframe(2)
            if top in rules.modules or not submission_on_stack(frame):
                return None
            frame = importer(frame)
            if frame is not None and is_library(frame.f_code.co_filename):
                return None if top in stdlib_any else (False, "import " + name[:80])
            return (top in dangerous, "import " + name[:80])
        if event in writes_table:
            for path_at, fd_at in writes_table[event]:
                if path_at < len_(args):
                    dir_fd = args[fd_at] if fd_at is not None and fd_at < len_(args) else None
                    found = write_verdict(args[path_at], dir_fd, event)
                    if found is not None:
                        return found
        if event in reads_table:
            at = reads_table[event]
            arg = args[at] if at < len_(args) else None
            return read_verdict("." if arg is None else arg)
        if event in writes_table:
            return None
        if event in always:
            return (True, always[event])
        if event in process:
            return (True, "start a process (" + event + ")")
        if event in signals:
            return (True, "send a signal (" + event + ")")
        if event.startswith("ctypes."):
            return (True, "use ctypes (" + event + ")")
        if event.startswith(network_prefixes):
            return (True, "use the network (" + event + ")")
        if event in from_submission:
            frame = getframe(2)
            return None if frame is None or is_library(frame.f_code.co_filename) else (
                False, from_submission[event])
        if event in setattr_events:
            frame = getframe(2)
            if frame is None or is_library(frame.f_code.co_filename) or not library_target(args[0]):
                return None
            return (True, "change %s of a library object" % (text(args[1]) or "?")[:40])
        if event == "compile":
            frame = getframe(2)
            if is_library(args[1]) and frame is not None and not is_library(frame.f_code.co_filename):
                return (True, "compile code that claims to be library code")
            return None
        if event in quiet:
            return (False, quiet[event])
        return None

    def hook(event: str, args: tuple) -> None:
        if busy[0] or event in not_interesting:
            return
        busy[0] = True
        try:
            found = verdict(event, args)
        finally:
            busy[0] = False
        if found is None:
            return
        serious, what = found
        if serious:
            report(what)
        if event == "import":
            raise denied_import(f"the sandbox refused to {what}: this import {denied}")
        raise denied_error(f"the sandbox refused to {what}: this {denied}")

    sys.addaudithook(hook)


# --- integrity of what trusted probes rely on -----------------------------------------------

# What the probes and the codec run on: these modules, and the mutable classes they define.
WATCHED_TREES = ("torch.autograd", "torch._C", "coursekit", "grader", "json", "collections")
WATCHED_MODULES = frozenset({
    "torch", "torch._tensor", "torch.nn.modules.module", "torch.nn.parameter", "torch.functional",
    "torch.utils.hooks", "torch.utils.flop_counter", "torch.utils._python_dispatch",
    "torch.overrides", "torch.cuda", "builtins", "math", "base64", "operator", "functools",
    "contextlib", "copyreg", "pickle", "io", "types",
})
# Names that honest code legitimately rebinds (caches, counters, configuration).
VOLATILE = frozenset({
    "__warningregistry__", "_filters_version", "__slotnames__", "_abc_impl", "_is_protocol",
    "__abstractmethods__", "__parameters__", "_lazy_modules", "__annotations__",
})
_HEAPTYPE = 1 << 9
_IMMUTABLE = 1 << 8


def _behaviour(value) -> bool:
    """Functions, classes, descriptors: what changes behaviour when rebound (data does not)."""
    kind = type(value)
    if kind in (int, float, complex, str, bytes, bool, type(None), tuple, frozenset, ModuleType):
        return False
    return callable(value) or hasattr(kind, "__get__")


def _is_watched(modname) -> bool:
    return isinstance(modname, str) and (modname in WATCHED_MODULES or any(
        modname == tree or modname.startswith(tree + ".") for tree in WATCHED_TREES))


def snapshot() -> dict:
    """What trusted probes rely on, taken in the fork server before any student code runs.

    For each watched module and each mutable class it defines: the objects bound to its names
    that carry behaviour (functions, classes, descriptors), and the set of its names.
    """
    owners: dict[int, tuple[object, str, dict, frozenset]] = {}
    for modname, mod in list(sys.modules.items()):
        if not isinstance(mod, ModuleType) or not _is_watched(modname):
            continue
        try:
            namespace = dict(vars(mod))
        except TypeError:
            continue
        _watch(owners, mod, modname, namespace)
        for value in namespace.values():
            # Only exact checks here: some module attributes warn or import when touched.
            if not issubclass(type(value), type) or id(value) in owners:
                continue
            flags = type.__dict__["__flags__"].__get__(value)
            module = type.__dict__["__module__"].__get__(value)
            if flags & _HEAPTYPE and not flags & _IMMUTABLE and _is_watched(module):
                label = f"{module}.{type.__dict__['__qualname__'].__get__(value)}"
                _watch(owners, value, label, dict(type.__dict__["__dict__"].__get__(value)))
    modules = {n: m for n, m in sys.modules.items() if _is_watched(n)}
    return {"owners": owners, "modules": modules}


def _watch(owners: dict, owner, label: str, namespace: dict) -> None:
    watched = {k: v for k, v in namespace.items() if k not in VOLATILE and _behaviour(v)}
    owners[id(owner)] = (owner, label, watched, frozenset(namespace))


def integrity_check(snap: dict):
    """A function returning the first watched name that was replaced, removed or added (or None).

    It is built before any student code runs and keeps what it uses in its closure, so that
    rebinding this module's globals or the builtins does not change what it checks.
    """
    modules, owners = dict(snap["modules"]), list(snap["owners"].values())
    registry = sys.modules  # the interpreter's own dict, even if sys.modules is rebound
    vars_, len_, list_, behaviour, volatile, missing = vars, len, list, _behaviour, VOLATILE, _MISSING

    def check() -> str | None:
        for name, mod in modules.items():
            if registry.get(name) is not mod:
                return f"sys.modules[{name!r}]"
        for owner, label, watched, names in owners:
            namespace = vars_(owner)
            for attr, value in watched.items():
                if namespace.get(attr, missing) is not value:
                    return f"{label}.{attr}"
            if len_(namespace) != len_(names):
                for attr, value in list_(namespace.items()):
                    if attr not in names and attr not in volatile and behaviour(value):
                        return f"{label}.{attr}"
        return None

    return check


_MISSING = object()
