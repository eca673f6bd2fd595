"""The sandbox worker: a forked child that locks itself down and serves the judge's requests.

    python -m grader.sandbox.worker --control FD --repo ROOT --mode {chroot,userns,plain} [--probes PACKAGE]

This command runs the fork server (``forkserver.py``; the judge starts it, ``supervisor.py``).
For each problem the server forks a child that runs :func:`_child`: it isolates itself
(``confine.py``, ``policy.py``), runs the program (setup cells, then the student's cells) and
serves the judge's requests (:class:`Session`) on two dedicated pipes until the judge kills it.

This file runs as ``__main__``, not as a ``grader`` module, so the audit hook does not count
its frames as library code: what student code gets the session to call directly (a builtin
bound to a global, a C-level ``__getattr__``) is judged as the student's own act. The session,
and everything through which it calls student code, belongs here, not in an imported module.
"""
from __future__ import annotations

import argparse
import gc
import io
import json
import os
import pickle
import signal
import socket
import sys

from grader.sandbox import confine, integrity, policy, rpc, syscalls
from grader.sandbox.forkserver import (  # noqa: F401 - the rest: importable from here too
    PRELOAD, UID_BASE, WORK_BYTES, WORK_INODES, Server, build_root, grader_files, preload,
    recv_msg, send_msg)


# --- the child: isolate, run the program, serve requests ------------------------------------

def _child(server: Server, spec: dict, req_fd: int, rep_fd: int) -> None:
    os.setsid()
    for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    keep = sorted({req_fd, rep_fd})
    os.closerange(3, keep[0])
    os.closerange(keep[0] + 1, keep[1])
    os.closerange(keep[1] + 1, 65536)
    # The pid the judge knows (in a PID namespace of its own, getpid() is 1): read before this
    # process mounts a /proc of that namespace.
    pid = int(os.readlink("/proc/self"))
    uid = UID_BASE + pid if server.own_uid else os.getuid()
    workdir = os.path.join(server.work_base, f"w{pid}")
    os.mkdir(workdir, 0o700)
    if os.geteuid() == 0:  # root, or root mapped in the server's user namespace
        confine.own_namespaces(workdir, server.work_base, uid, shared_root=server.mode == "plain",
                               strict=server.isolated)
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
    confine.settle_environment(workdir, server.repo)
    limits = spec["limits"]
    confine.apply_limits(memory_bytes=limits["memory_bytes"], cpu_seconds=limits["cpu_seconds"],
                         max_processes=limits["max_processes"])
    if server.own_uid:
        confine.drop_privileges(uid)
    confine.harden()
    if os.getppid() not in (server.pid, 0):  # the server died before the death signal was armed
        return  # (0: the parent is outside this process's own PID namespace)
    os.chdir(workdir)
    import torch

    torch.set_num_threads(1)
    if server.audit:
        policy.disarm()
    report = _reporter(rep_fd)
    rules = policy.rules_for(workdir, server.repo, server.files, server.modules)
    session = Session(req_fd, rep_fd, report, server.snapshot, server.probes)
    # The last step before student code: from here on the kernel refuses new processes, IPC,
    # sockets and the rest of syscalls.DENIED, whatever the process runs.
    if server.syscall_filter is not None:
        syscalls.load(server.syscall_filter)
    if server.audit:
        policy.install_audit_hook(rules, report)
    session.serve()


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


def _display(*objs, **kwargs):
    for obj in objs:
        print(repr(obj))


class Session:
    """The worker side of the RPC: a handle table and the operations the judge may ask for."""

    def __init__(self, req_fd: int, rep_fd: int, report, snapshot: dict, probes: dict):
        import types

        from coursekit.graded import InertShell  # the one coursekit.graded runs cells with, too
        from grader.sandbox import codec

        self.req_fd, self.rep_fd, self.report = req_fd, rep_fd, report
        self.integrity = integrity.integrity_check(snapshot)
        self.probes, self.codec = dict(probes), codec
        self.table: dict[int, object] = {}
        self.next_id = 1
        self.module = types.ModuleType("__main__")
        self.namespace = namespace = self.module.__dict__
        def run_source(source: str, index: int = -1) -> None:
            # Plain Python only, never through IPython's transformers: the cells the judge's source
            # policy read are exactly the code that runs (it refuses magics, shell escapes and help
            # syntax, which are not Python).
            exec(compile(source, f"<cell {index}>", "exec"), namespace)

        # Student code can reach get_ipython and display: they hold nothing of the session, and the shell's
        # magics run nothing (a magic's body is a string the source policy never read).
        self._run_source = run_source
        shell = InertShell(lambda body: None)
        namespace["get_ipython"] = lambda: shell
        namespace["display"] = _display
        sys.modules["__main__"] = self.module
        self.cell_errors: list[dict] = []
        self.memory_noticed = False
        self.ran = False
        self.cells_run = 0

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
        if op == "cells":
            if not self.ran:
                raise _Failure("request", "no program ran yet")
            return self.run_cells(request[1])
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
            if request[2:] == ("collect",):  # the judge is about to read the memory held
                gc.collect()
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
    def run_program(self, cells, primes=()) -> dict:
        """Run the cells like a notebook would: each in turn, an error recorded and the next run.

        First, before any student code, prime the worker with grading's own machinery and the trusted
        probes named in ``primes`` (:meth:`prime`)."""
        if self.ran:
            raise _Failure("request", "the program already ran")
        self.ran = True
        self.prime(primes)
        return self.run_cells(cells)

    def run_cells(self, cells) -> dict:
        for source in cells:
            index, self.cells_run = self.cells_run, self.cells_run + 1
            try:
                self._run_source(source, index)
            except BaseException as e:  # noqa: BLE001 - like a notebook: record, continue
                self._notice_limits(e)
                described = rpc.describe_exception(e)
                self.cell_errors.append({"cell": index, "error": f"{described['types'][0]}: "
                                                                 f"{described['message']}"[:300]})
        return {"t": "done", "errors": self.cell_errors[:100]}

    def prime(self, primes) -> None:
        """Run what grading runs in every worker, once, before any student code: autograd with
        saved-tensor hooks and the FLOP counter, the integrity check, the codec, the garbage collector;
        then each trusted probe named in ``primes`` (a chapter's own machinery: ``ch10_prime`` runs
        Triton's interpreter), with no argument.

        A worker shares its memory with the fork server until it writes to a page; the first write copies
        the page and charges it to the worker's cgroup. Grading's machinery writes to thousands of such
        pages the first time it runs (reference counts, caches): about 9 MiB that would otherwise appear
        between the judge's readings of what the student's code holds. Touched here, they are part of
        every reading, the baselines included.
        """
        import torch

        from coursekit.measure import measure

        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        x = torch.randn(4, 8, requires_grad=True)
        measure(lambda: model(x).square().sum(), model)
        self.integrity()  # it reads every watched module and class: the largest share
        self.codec.encode({"t": [x.detach(), model[0].weight.grad], "n": (1, 2.5, "s", None, True),
                           "d": torch.float32, "s": torch.Size([2])})
        for name in primes:
            fn = self.probes.get(name)
            if fn is None:
                raise _Failure("request", f"{name!r} is not a probe")
            fn()
        gc.collect()

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
    parser.add_argument("--stage", default="", help="empty directory to build the chroot on")
    parser.add_argument("--probes", default="", help="the package of trusted probes (every module of it)")
    parser.add_argument("--modules", default="", help="comma-separated top-level modules a submission may "
                        "import beyond the base set (the chapters' declared imports)")
    parser.add_argument("--no-audit-hook", action="store_true",
                        help="workers run without the audit hook (tests of the kernel's walls alone)")
    args = parser.parse_args(argv)
    control = socket.socket(fileno=args.control)
    Server(control, os.path.realpath(args.repo), args.mode, child=_child, stage=args.stage,
           probe_package=args.probes, modules=frozenset(filter(None, args.modules.split(","))),
           audit=not args.no_audit_hook).serve()


if __name__ == "__main__":
    main()
