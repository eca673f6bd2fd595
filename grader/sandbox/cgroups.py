"""A control group per worker: its memory limit and readings, its CPU quota and time, its process cap.

The judge (root) makes one group per worker under a group of its own (:class:`Hierarchy`), moves the
worker in before any student code runs, reads it from outside while the worker is idle, and removes
it when the problem ends. The kernel charges a group with everything its processes make it hold:
anonymous memory, tmpfs and shared memory, kernel buffers (pipes, sockets), page tables. So what the
judge reads cannot be hidden by anything inside the process, and a hard memory limit and a CPU quota
bind the process and all its threads together.

Both cgroup versions are supported: v1 (separate ``memory``, ``cpu``, ``cpuacct`` and ``pids``
hierarchies, as on the course's grading machines) and v2 (one unified hierarchy whose ``memory``,
``cpu`` and ``pids`` controllers the judge's own group may enable for its children).
"""
from __future__ import annotations

import itertools
import os
import signal
import time
from dataclasses import dataclass

PERIOD_US = 100_000  # CFS period; the quota is one period per period: one core
_V1_CONTROLLERS = ("memory", "cpu", "cpuacct", "pids")
_COUNTER = itertools.count()


class Unavailable(RuntimeError):
    """This machine (or this user) gives the judge no cgroups to manage."""


@dataclass(frozen=True)
class Reading:
    """One reading of a worker's group, in bytes and seconds.

    ``resident``: memory charged to it now, file-backed page cache excepted (pages of files the
    code merely read: libraries, the course's data); tmpfs, shared memory and kernel buffers count.
    ``peak``: the most charged at any moment since the last reset, page cache included (the kernel
    keeps no peak without it): compare peaks with peaks only. Both move in steps of the kernel's
    charge batches (64 pages per CPU), far below what checks look for.
    """

    resident: int
    peak: int
    cpu_seconds: float


def _mounts() -> dict[str, str]:
    """Controller (or "unified") -> mount point, from this process's mount table."""
    found: dict[str, str] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, extra = left.split(), right.split()
            if len(fields) < 5 or len(extra) < 3:
                continue
            point, fstype, options = fields[4], extra[0], extra[2].split(",")
            if fstype == "cgroup2":
                found.setdefault("unified", point)
            elif fstype == "cgroup":
                for option in options:
                    if option in _V1_CONTROLLERS:
                        found.setdefault(option, point)
    return found


def _own_paths() -> dict[str, str]:
    """Controller (or "" for v2) -> this process's group path, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    return paths


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _stat(path: str) -> dict[str, int]:
    fields = {}
    for line in _read(path).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            fields[key] = int(value)
    return fields


class Group:
    """One worker's group (in each controller's hierarchy, for v1)."""

    def __init__(self, dirs: dict[str, str], version: int):
        self.dirs, self.version = dirs, version
        self._peak_fd: int | None = None  # v2: memory.peak held open, reset through this descriptor

    # -- membership
    def add(self, pid: int) -> None:
        for d in dict.fromkeys(self.dirs.values()):
            _write(os.path.join(d, "cgroup.procs"), str(pid))

    def pids(self) -> list[int]:
        d = self.dirs["pids"] if self.version == 1 else self.dirs["memory"]
        try:
            return [int(p) for p in _read(os.path.join(d, "cgroup.procs")).split()]
        except OSError:
            return []

    def kill(self) -> None:
        """SIGKILL every process in the group, until none is left (bounded)."""
        if self.version == 2:
            try:
                _write(os.path.join(self.dirs["memory"], "cgroup.kill"), "1")
            except OSError:
                pass
        for _ in range(200):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.005)

    def remove(self) -> None:
        if self._peak_fd is not None:
            os.close(self._peak_fd)
            self._peak_fd = None
        self.kill()
        for d in dict.fromkeys(self.dirs.values()):
            _rmdir(d)

    def limit_memory(self, n: int) -> None:
        """Charges beyond ``n`` bytes are reclaimed or refused; the kernel kills the group's process
        when neither frees enough (swap is not allowed)."""
        mem = self.dirs["memory"]
        if self.version == 1:
            _write(os.path.join(mem, "memory.limit_in_bytes"), str(n))
            try:
                _write(os.path.join(mem, "memory.memsw.limit_in_bytes"), str(n))
            except OSError:
                pass  # no swap accounting: the grading machine should have no swap
        else:
            _write(os.path.join(mem, "memory.max"), str(n))
            try:
                _write(os.path.join(mem, "memory.swap.max"), "0")
            except OSError:
                pass

    # -- readings
    def _file_cache(self) -> int:
        stat = _stat(os.path.join(self.dirs["memory"], "memory.stat"))
        if self.version == 1:
            return stat.get("total_active_file", 0) + stat.get("total_inactive_file", 0)
        return stat.get("active_file", 0) + stat.get("inactive_file", 0)

    def read(self) -> Reading:
        mem = self.dirs["memory"]
        if self.version == 1:
            usage = int(_read(os.path.join(mem, "memory.usage_in_bytes")))
            peak = int(_read(os.path.join(mem, "memory.max_usage_in_bytes")))
        else:
            usage = int(_read(os.path.join(mem, "memory.current")))
            peak = int(os.pread(self._peak_fd, 64, 0)) if self._peak_fd is not None else \
                int(_read(os.path.join(mem, "memory.peak")))
        return Reading(resident=max(0, usage - self._file_cache()), peak=peak, cpu_seconds=self.cpu_seconds())

    def reset_peak(self) -> None:
        """Restart the peak from the memory charged now."""
        if self.version == 1:
            _write(os.path.join(self.dirs["memory"], "memory.max_usage_in_bytes"), "0")
            return
        if self._peak_fd is None:
            self._peak_fd = os.open(os.path.join(self.dirs["memory"], "memory.peak"), os.O_RDWR)
        os.write(self._peak_fd, b"reset\n")  # Linux >= 6.12: later reads of this descriptor restart here

    def cpu_seconds(self) -> float:
        if self.version == 1:
            return int(_read(os.path.join(self.dirs["cpuacct"], "cpuacct.usage"))) / 1e9
        return _stat(os.path.join(self.dirs["memory"], "cpu.stat")).get("usage_usec", 0) / 1e6

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the group for exceeding its memory limit."""
        mem = self.dirs["memory"]
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            return _stat(os.path.join(mem, name)).get("oom_kill", 0) > 0
        except OSError:
            return False


class Hierarchy:
    """The judge's own group, under which each worker gets one (:meth:`new_group`)."""

    def __init__(self, mounts: dict[str, str] | None = None, own: dict[str, str] | None = None):
        """``mounts`` (controller -> mount point, "unified" for v2) and ``own`` (controller -> this process's
        group, "" for v2) default to this process's; tests pass a tree of their own."""
        if mounts is None and os.geteuid() != 0:
            raise Unavailable("cgroups need root")
        mounts = _mounts() if mounts is None else mounts
        own = _own_paths() if own is None else own
        self.version = 1 if all(c in mounts for c in _V1_CONTROLLERS) else 2
        name = f"grader-{os.getpid()}-{next(_COUNTER)}"
        if self.version == 1:
            self.base = {c: os.path.join(mounts[c], own.get(c, "/").lstrip("/"), name) for c in _V1_CONTROLLERS}
        else:
            if "unified" not in mounts:
                raise Unavailable("no cgroup hierarchy with the memory, cpu and pids controllers is mounted")
            root = os.path.join(mounts["unified"], own.get("", "/").lstrip("/"))
            have = _read(os.path.join(root, "cgroup.controllers")).split()
            if not {"memory", "cpu", "pids"} <= set(have):
                raise Unavailable(f"the grader's cgroup ({root}) offers the controllers {have}, "
                                  "not memory, cpu and pids")
            d = os.path.join(root, name)
            self.base = {c: d for c in ("memory", "cpu", "pids")}
        try:
            for d in dict.fromkeys(self.base.values()):
                os.makedirs(d, exist_ok=True)
            if self.version == 2:
                d = self.base["memory"]
                try:
                    _write(os.path.join(os.path.dirname(d), "cgroup.subtree_control"), "+memory +cpu +pids")
                    _write(os.path.join(d, "cgroup.subtree_control"), "+memory +cpu +pids")
                except OSError as e:
                    raise Unavailable(
                        f"cgroup v2: the grader's cgroup holds processes, so it cannot hand controllers to "
                        f"worker groups ({e.strerror}); start the grader in a delegated cgroup of its own "
                        "(systemd-run --scope -p Delegate=yes ...)") from None
        except OSError as e:
            self.close()
            raise Unavailable(f"cannot create the grader's cgroups ({e})") from None
        self.serial = itertools.count()

    def new_group(self, memory_bytes: int, max_processes: int) -> Group:
        """A group for one worker: a memory limit (no swap), one core of CPU, a process cap."""
        name = f"w{next(self.serial)}"
        dirs = {c: os.path.join(d, name) for c, d in self.base.items()}
        group = Group(dirs, self.version)
        try:
            for d in dict.fromkeys(dirs.values()):
                os.mkdir(d)
            group.limit_memory(memory_bytes)
            if self.version == 1:
                _write(os.path.join(dirs["cpu"], "cpu.cfs_period_us"), str(PERIOD_US))
                _write(os.path.join(dirs["cpu"], "cpu.cfs_quota_us"), str(PERIOD_US))
                _write(os.path.join(dirs["pids"], "pids.max"), str(max_processes))
            else:
                d = dirs["memory"]
                _write(os.path.join(d, "cpu.max"), f"{PERIOD_US} {PERIOD_US}")
                _write(os.path.join(d, "pids.max"), str(max_processes))
        except OSError:
            group.remove()
            raise
        return group

    def close(self) -> None:
        """Remove every worker group left (their processes killed) and the judge's own group."""
        for d in dict.fromkeys(getattr(self, "base", {}).values()):
            try:
                children = [os.path.join(d, c) for c in os.listdir(d) if os.path.isdir(os.path.join(d, c))]
            except OSError:
                children = []
            for child in children:
                _rmdir(child)
            _rmdir(d)


def _rmdir(d: str) -> None:
    """Kill what is left in group directory ``d``, then remove it (a process that was just killed
    may still be leaving the group: retried for about a second)."""
    for _ in range(200):
        try:
            for pid in _read(os.path.join(d, "cgroup.procs")).split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os.rmdir(d)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.005)
