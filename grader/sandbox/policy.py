"""What the sandbox worker may do: the audit hook and what it makes of each event.

Everything here runs inside the worker before the first line of student code. The worker's
lockdown, in order: ``confine.settle_environment`` → ``confine.apply_limits`` (rlimits, as
root) → ``confine.drop_privileges`` (a uid of its own) → ``confine.harden`` (no new
privileges, die with the fork server) → :func:`disarm` → :func:`install_audit_hook`
(irrevocable), which enforces the worker's ``rules.Rules``. ``integrity.snapshot`` is taken
earlier, in the fork server; ``integrity.integrity_check`` compares against it before a
trusted probe runs.

The audit hook is the in-process layer: it turns what a submission must not do into a
``PermissionError`` (or ``ImportError``) with a clear message, and *reports* the serious
attempts to the judge, which then fails the problem with "your code tried to ...". It is not
the only wall: C code (torch's own file I/O, for instance) raises no audit events, which is
why the worker also runs in a private mount namespace with a read-only view of only what
grading needs, as a uid that owns nothing, without network (see ``judge.py``).
"""
from __future__ import annotations

import os
import sys
from types import FunctionType, ModuleType

# The other lockdown steps and the rules, importable from here too.
from grader.sandbox.confine import (  # noqa: F401
    FILE_BYTES, OPEN_FILES, apply_limits, drop_privileges, harden)
from grader.sandbox.integrity import (  # noqa: F401
    VOLATILE, WATCHED_MODULES, WATCHED_TREES, integrity_check, snapshot)
from grader.sandbox.rules import DANGEROUS, LIBRARIES, Rules, rules_for  # noqa: F401

DENIED = "is not allowed during grading"

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


# --- what the audit hook cannot see ------------------------------------------------------

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
