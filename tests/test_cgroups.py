"""The cgroup layer of the sandbox (grader/sandbox/cgroups.py), both versions, on trees of files.

The isolated sandbox runs on cgroup v1 on the course's machines (tests/test_kernel_walls.py uses the
real thing); cgroup v2 hosts are common elsewhere. Here both versions' files are plain files in a
temporary folder laid out as the kernel lays them out, so the judge's writes (limits, quota, task cap,
peak resets) and its readings (memory without page cache, peak, CPU time, OOM kills) are checked for
both.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from grader.sandbox import cgroups

MiB = 1024**2


def _files(d: Path, **values) -> None:
    for name, value in values.items():
        (d / name.replace("__", ".")).write_text(str(value))


def _v1(tmp_path: Path) -> cgroups.Hierarchy:
    mounts = {c: str(tmp_path / c) for c in ("memory", "cpu", "cpuacct", "pids")}
    for point in mounts.values():
        os.makedirs(Path(point) / "course", exist_ok=True)
    return cgroups.Hierarchy(mounts, {c: "/course" for c in mounts})


def _v2(tmp_path: Path, controllers: str = "cpuset cpu io memory pids") -> cgroups.Hierarchy:
    root = tmp_path / "unified"
    (root / "user" / "grader").mkdir(parents=True)
    (root / "user" / "grader" / "cgroup.controllers").write_text(controllers + "\n")
    return cgroups.Hierarchy({"unified": str(root)}, {"": "/user/grader"})


def test_v1_groups_get_their_limits_and_are_read(tmp_path):
    h = _v1(tmp_path)
    assert h.version == 1
    g = h.new_group(3 * 1024**3, 64)
    mem, cpu, acct, pids = (Path(g.dirs[c]) for c in ("memory", "cpu", "cpuacct", "pids"))
    assert mem.parent.parent == tmp_path / "memory" / "course" and len({mem, cpu, acct, pids}) == 4
    assert (mem / "memory.limit_in_bytes").read_text() == str(3 * 1024**3)
    assert (cpu / "cpu.cfs_quota_us").read_text() == (cpu / "cpu.cfs_period_us").read_text() == "100000"
    assert (pids / "pids.max").read_text() == "64"
    _files(mem, memory__usage_in_bytes=100 * MiB, memory__max_usage_in_bytes=150 * MiB,
           memory__stat="cache 30\nrss 5\ntotal_active_file 10485760\ntotal_inactive_file 10485760\n",
           memory__oom_control="oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    _files(acct, cpuacct__usage=2_500_000_000)
    reading = g.read()
    assert (reading.resident, reading.peak, reading.cpu_seconds) == (80 * MiB, 150 * MiB, 2.5)
    assert not g.oom_killed()
    g.reset_peak()
    assert (mem / "memory.max_usage_in_bytes").read_text() == "0"  # the kernel restarts it from usage
    _files(mem, memory__oom_control="oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert g.oom_killed()
    g.add(12345)
    assert all((Path(d) / "cgroup.procs").read_text() == "12345" for d in g.dirs.values())


def test_v1_with_cpu_and_cpuacct_mounted_together(tmp_path):
    both = tmp_path / "cpu,cpuacct"
    (both / "course").mkdir(parents=True)
    mounts = {"memory": str(tmp_path / "memory"), "pids": str(tmp_path / "pids"), "cpu": str(both),
              "cpuacct": str(both)}
    for c in ("memory", "pids"):
        (tmp_path / c / "course").mkdir(parents=True)
    g = cgroups.Hierarchy(mounts, {c: "/course" for c in mounts}).new_group(MiB, 8)
    assert g.dirs["cpu"] == g.dirs["cpuacct"]
    g.add(7)
    assert (Path(g.dirs["cpu"]) / "cgroup.procs").read_text() == "7"


def test_v2_groups_get_their_limits_and_are_read(tmp_path):
    h = _v2(tmp_path)
    assert h.version == 2
    parent = tmp_path / "unified" / "user" / "grader"
    assert (parent / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    g = h.new_group(2 * 1024**3, 32)
    d = Path(g.dirs["memory"])
    assert set(g.dirs.values()) == {str(d)} and d.parent.parent == parent
    assert (d / "memory.max").read_text() == str(2 * 1024**3)
    assert (d / "memory.swap.max").read_text() == "0"
    assert (d / "cpu.max").read_text() == "100000 100000"
    assert (d / "pids.max").read_text() == "32"
    _files(d, memory__current=64 * MiB, memory__peak=96 * MiB, memory__stat="anon 1\nfile 9\nactive_file 4194304\n"
           "inactive_file 0\nshmem 5\n", cpu__stat="usage_usec 1500000\nuser_usec 1\n",
           memory__events="low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n")
    reading = g.read()
    assert (reading.resident, reading.peak, reading.cpu_seconds) == (60 * MiB, 96 * MiB, 1.5)
    assert not g.oom_killed()
    g.reset_peak()  # held open, "reset" written to it: later reads through it restart there
    assert (d / "memory.peak").read_text().startswith("reset")
    os.close(g._peak_fd)
    g._peak_fd = None


@pytest.mark.parametrize("controllers,why", [("cpu io memory", "not memory, cpu and pids")])
def test_v2_without_the_controllers_is_unavailable(tmp_path, controllers, why):
    with pytest.raises(cgroups.Unavailable, match=why):
        _v2(tmp_path, controllers)


def test_nothing_mounted_is_unavailable(tmp_path):
    with pytest.raises(cgroups.Unavailable, match="no cgroup hierarchy"):
        cgroups.Hierarchy({}, {})
