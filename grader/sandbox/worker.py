"""The sandbox worker: a fork server that never runs student code, and the children it forks.

    python -m grader.sandbox.worker --control FD --repo ROOT --mode {chroot,userns,plain}

The judge starts one server (``judge.py``). The server imports everything grading needs
(torch, numpy, coursekit, the probes, the codec), takes the integrity snapshot, and, in
``chroot`` mode, builds the worker's view of the file system and enters it. It then waits on
its control socket; for each problem it forks a child that isolates itself (``policy.py``),
runs the program (setup cells, then the student's cells) and serves the judge's requests on
two dedicated pipes until the judge kills it. The server itself runs no student code and
starts no thread (torch's thread pools stay unstarted), so forking it is safe and cheap.
"""
from __future__ import annotations

import argparse
import io
import json
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
from grader.sandbox import policy, rpc

PRELOAD = (
    "torch", "torch.utils.checkpoint", "torch._dynamo", "numpy", "coursekit", "coursekit.checks",
    "coursekit.measure", "coursekit.memory", "grader.probes", "grader.sandbox.codec",
    "IPython.core.inputtransformer2", "matplotlib", "matplotlib.pyplot", "tqdm", "tqdm.auto",
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


def build_root(repo: str, files: tuple[str, ...]) -> str:
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

    mount("-t", "tmpfs", "-o", "size=8m,nr_inodes=4096,mode=0755", "grader-root", "/tmp")
    root = "/tmp/root"
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
    os.makedirs(root + "/tmp")
    mount("-t", "tmpfs", "-o", f"size={WORK_BYTES},nr_inodes={WORK_INODES},mode=0711,nosuid,nodev,noexec",
          "grader-work", root + "/tmp")
    return root


class Server:
    def __init__(self, control: socket.socket, repo: str, mode: str):
        self.control = control
        self.repo = repo
        self.mode = mode
        self.children: dict[int, str] = {}  # pid -> its directory
        self.work_base = ""
        self.snapshot: dict = {}
        self.probes: dict = {}
        self.files: tuple[str, ...] = ()
        self.pid = os.getpid()
        # Real root (not the mapped root of a user namespace) gives each worker a uid of its own.
        self.own_uid = mode != "userns" and os.geteuid() == 0

    def start(self) -> dict:
        started = time.monotonic()
        _become_subreaper()
        preload()
        import grader.probes as probes

        self.probes = {name: fn for name, fn in vars(probes).items()
                       if callable(fn) and getattr(fn, "__module__", None) == probes.__name__
                       and not name.startswith("_")}
        self.files = grader_files(self.repo)
        self.snapshot = policy.snapshot()
        if self.mode == "chroot":
            root = build_root(self.repo, self.files)
            os.chroot(root)
            os.chdir("/")
            self.work_base = "/tmp"
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
                "own_uid": self.own_uid, "vm_bytes": vm_kib * 1024,
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
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                _child(self, spec, req_fd, rep_fd)
                status = 0
            finally:
                os._exit(status)
        os.close(req_fd)
        os.close(rep_fd)
        uid = UID_BASE + pid if self.own_uid else os.getuid()
        workdir = os.path.join(self.work_base, f"w{pid}")
        self.children[pid] = workdir
        return pid, uid, workdir

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


def _become_subreaper() -> None:
    """Processes a worker starts and abandons are re-parented to the server, which kills them."""
    import ctypes

    pr_set_child_subreaper = 36
    ctypes.CDLL(None).prctl(pr_set_child_subreaper, 1, 0, 0, 0)


# --- the child: isolate, run the program, serve requests ------------------------------------

def _child(server: Server, spec: dict, req_fd: int, rep_fd: int) -> None:
    os.setsid()
    for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    keep = sorted({req_fd, rep_fd})
    os.closerange(3, keep[0])
    os.closerange(keep[0] + 1, keep[1])
    os.closerange(keep[1] + 1, 65536)
    pid = os.getpid()
    uid = UID_BASE + pid if server.own_uid else os.getuid()
    workdir = os.path.join(server.work_base, f"w{pid}")
    os.mkdir(workdir, 0o700)
    out = os.open(os.path.join(workdir, ".output"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)
    if server.own_uid:
        os.chown(workdir, uid, uid)
        os.chown(os.path.join(workdir, ".output"), uid, uid)
    budget = [int(spec["output_bytes"])]
    sys.stdout = _CappedStream(1, budget)
    sys.stderr = _CappedStream(2, budget)
    _settle_environment(workdir, server.repo)
    limits = spec["limits"]
    policy.apply_limits(memory_bytes=limits["memory_bytes"], cpu_seconds=limits["cpu_seconds"],
                        max_processes=limits["max_processes"])
    if server.own_uid:
        policy.drop_privileges(uid)
    policy.harden()
    if os.getppid() != server.pid:  # the server died before the death signal was armed
        return
    os.chdir(workdir)
    import torch

    torch.set_num_threads(1)
    policy.disarm()
    report = _reporter(rep_fd)
    rules = policy.rules_for(workdir, server.repo, server.files)
    session = Session(req_fd, rep_fd, report, server.snapshot, server.probes)
    policy.install_audit_hook(rules, report)
    session.serve()


def _settle_environment(workdir: str, repo: str) -> None:
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


class _CappedStream(io.TextIOBase):
    """stdout/stderr of the student's code: kept on the worker's disk up to a budget, never shown."""

    def __init__(self, fd: int, budget: list):
        self._fd = fd
        self._budget = budget

    def writable(self) -> bool:
        return True

    def write(self, s) -> int:
        s = str(s)
        if self._budget[0] > 0:
            data = s[: self._budget[0]].encode("utf-8", "replace")[: self._budget[0]]
            self._budget[0] -= len(data)
            try:
                os.write(self._fd, data)
            except OSError:
                self._budget[0] = 0
        return len(s)

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return False


def _reporter(rep_fd: int):
    """A function that sends a violation notice to the judge at once, or ends the process.

    It uses only built-in operations on exact strings and functions captured now, so that code
    running later in this process cannot change what it sends.
    """
    write, exit_now, as_str, len_ = os.write, os._exit, str.__str__, len
    sent = [0]

    def report(what: str) -> None:
        if sent[0] >= 8:
            return
        sent[0] += 1
        clean = "".join([c if " " <= c <= "~" and c not in '"\\' else "?" for c in as_str(what)])
        body = ('{"t": "violation", "what": "' + clean[:300] + '"}').encode("ascii")
        data = len_(body).to_bytes(4, "big") + body
        try:
            if write(rep_fd, data) != len(data):
                exit_now(71)
        except OSError:
            exit_now(71)

    return report


class _InertShell:
    """What ``get_ipython()`` returns: hooks, transformers, handlers and magics do nothing.

    ``%time``/``%timeit`` lines and ``%%time``/``%%timeit``/``%%capture`` cells still run
    their statement once, as they would in a notebook (without the timing).
    """

    def __init__(self, run_body):
        object.__setattr__(self, "_run_body", run_body)

    def __getattr__(self, name):
        return self

    def __setattr__(self, name, value):
        pass

    def __call__(self, *args, **kwargs):
        return None

    def __getitem__(self, key):
        return self

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    def run_cell_magic(self, name, line="", cell=""):
        if name in ("time", "capture", "timeit") and isinstance(cell, str):
            self._run_body(cell)
        return None

    def run_line_magic(self, name, line="", *args, **kwargs):
        if name in ("time", "timeit") and isinstance(line, str):
            self._run_body(line)
        return None


def _display(*objs, **kwargs):
    for obj in objs:
        print(repr(obj))


class Session:
    """The worker side of the RPC: a handle table and the operations the judge may ask for."""

    def __init__(self, req_fd: int, rep_fd: int, report, snapshot: dict, probes: dict):
        import types

        from IPython.core.inputtransformer2 import TransformerManager

        from grader.sandbox import codec

        self.req_fd, self.rep_fd, self.report = req_fd, rep_fd, report
        self.integrity = policy.integrity_check(snapshot)
        self.probes, self.codec = dict(probes), codec
        self.table: dict[int, object] = {}
        self.next_id = 1
        self.module = types.ModuleType("__main__")
        self.namespace = namespace = self.module.__dict__
        transformer = TransformerManager

        def run_source(source: str, index: int = -1) -> None:
            code = transformer().transform_cell(source)
            exec(compile(code, f"<cell {index}>", "exec"), namespace)

        # Student code can reach get_ipython and display: they hold nothing of the session.
        self._run_source = run_source
        shell = _InertShell(run_source)
        namespace["get_ipython"] = lambda: shell
        namespace["display"] = _display
        sys.modules["__main__"] = self.module
        self.cell_errors: list[dict] = []
        self.memory_noticed = False
        self.ran = False

    # -- transport
    def send(self, obj: dict) -> None:
        body = json.dumps(obj).encode("ascii")
        if len(body) > rpc.MAX_REPLY:
            body = json.dumps({"t": "error", "where": "transfer", "types": ["NotTransferable"],
                               "message": "the value is too large to fetch"}).encode("ascii")
        rpc.write_all(self.rep_fd, rpc.frame(body))

    def serve(self) -> None:
        while True:
            data = rpc.read_frame(self.req_fd)
            if data is None:
                return
            try:
                request = self._unpickle(data)
                reply = self.dispatch(request)
            except _StudentRaised as e:
                self._notice_limits(e.exc)
                reply = {"t": "error", "where": "student", **rpc.describe_exception(e.exc)}
            except _Failure as e:
                reply = {"t": "error", "where": e.where, "types": [e.where], "message": e.message}
            except BaseException as e:  # noqa: BLE001 - anything else is a bad request
                self._notice_limits(e)
                reply = {"t": "error", "where": "request", **rpc.describe_exception(e)}
            self.send(reply)

    def _unpickle(self, data: bytes):
        table = self.table

        class Unpickler(pickle.Unpickler):
            def persistent_load(self, pid):
                if not (isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "handle"):
                    raise pickle.UnpicklingError("unknown persistent id")
                if pid[1] not in table:
                    raise _Failure("request", f"unknown handle {pid[1]!r}")
                return table[pid[1]]

        return Unpickler(io.BytesIO(data)).load()

    # -- operations
    def dispatch(self, request):
        op = request[0]
        if op == "program":
            return self.run_program(request[1], request[2])
        if op == "global":
            name = request[1]
            if name not in self.namespace:
                raise _Failure("missing", name)
            return self.store(self.namespace[name])
        if op == "getattr":
            target, name = self.get(request[1]), request[2]
            return self.store(_student(getattr, target, name))
        if op == "getitem":
            target = self.get(request[1])
            return self.store(_student(lambda: target[request[2]]))
        if op == "call":
            target = self.get(request[1])
            return self.store(_student(target, *request[2], **request[3]))
        if op == "put":
            return self.store(request[1])
        if op == "fetch":
            target = self.get(request[1])
            return {"t": "value", "value": self.encode(target)}
        if op == "apply":
            fn = self.probes.get(request[1])
            if fn is None:
                raise _Failure("request", f"{request[1]!r} is not a probe")
            changed = self.integrity()
            if changed is not None:
                self.report(f"replace {changed} (the grader relies on it)")
                raise _Failure("request", "integrity check failed")
            return {"t": "value", "value": self.encode(_student(fn, *request[2], **request[3]))}
        if op == "release":
            for hid in request[1]:
                self.table.pop(hid, None)
            return {"t": "ok"}
        raise _Failure("request", f"unknown operation {op!r}")

    def get(self, hid):
        try:
            return self.table[hid]
        except (KeyError, TypeError):
            raise _Failure("request", f"unknown handle {hid!r}") from None

    def store(self, obj) -> dict:
        hid = self.next_id
        self.next_id += 1
        self.table[hid] = obj
        try:
            kind = type(obj).__name__
            kind = kind if isinstance(kind, str) else "object"
        except Exception:  # noqa: BLE001
            kind = "object"
        return {"t": "handle", "id": hid, "type": str(kind)[:100]}

    def encode(self, value) -> str:
        try:
            return self.codec.encode(value)
        except self.codec.NotTransferable as e:
            raise _Failure("transfer", str(e)[: rpc.MAX_MESSAGE_CHARS]) from None
        except Exception as e:  # noqa: BLE001 - a student object failed while being read
            raise _StudentRaised(e) from None

    # -- the program
    def run_program(self, cells, files: dict) -> dict:
        """Copy the submission's files in, then run the cells like a notebook would."""
        if self.ran:
            raise _Failure("request", "the program already ran")
        self.ran = True
        for rel, data in files.items():
            parts = [p for p in str(rel).split("/") if p not in ("", ".")]
            if not parts or ".." in parts:
                continue
            try:
                os.makedirs(os.path.join(".", *parts[:-1]), mode=0o700, exist_ok=True)
                with open(os.path.join(".", *parts), "wb") as f:
                    f.write(bytes(data))
            except OSError:
                continue  # an odd name or an oversized file: the student's code will notice
        for index, source in enumerate(cells):
            try:
                self._run_source(source, index)
            except BaseException as e:  # noqa: BLE001 - like a notebook: record, continue
                self._notice_limits(e)
                described = rpc.describe_exception(e)
                self.cell_errors.append({"cell": index, "error": f"{described['types'][0]}: "
                                                                 f"{described['message']}"[:300]})
        return {"t": "done", "errors": self.cell_errors[:100]}

    def _notice_limits(self, exc: BaseException) -> None:
        if self.memory_noticed:
            return
        if isinstance(exc, MemoryError) or (
                isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)[:1000]):
            self.memory_noticed = True
            rpc.write_all(self.rep_fd, rpc.frame(b'{"t": "limit", "kind": "memory"}'))


class _Failure(Exception):
    def __init__(self, where: str, message: str):
        super().__init__(message)
        self.where, self.message = where, message


class _StudentRaised(Exception):
    def __init__(self, exc: BaseException):
        super().__init__()
        self.exc = exc


def _student(fn, *args, **kwargs):
    """Run student code; whatever it raises is the student's, reported as such."""
    try:
        return fn(*args, **kwargs)
    except _Failure:
        raise
    except BaseException as e:  # noqa: BLE001 - SystemExit and friends are the student's too
        raise _StudentRaised(e) from None


# --- entry point -------------------------------------------------------------------------------

def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--control", type=int, required=True)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--mode", choices=("chroot", "userns", "plain"), required=True)
    args = parser.parse_args(argv)
    control = socket.socket(fileno=args.control)
    Server(control, os.path.realpath(args.repo), args.mode).serve()


if __name__ == "__main__":
    main()
