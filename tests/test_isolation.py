"""What a worker holds is read from outside it, and no worker can starve another.

The judge reads what a worker holds between two requests: everything the kernel charges the
worker's cgroup (as root; ``grader.sandbox.cgroups``), else its resident memory and its files from
/proc (``grader.sandbox.meter``); each worker writes only to a tmpfs of its own, mounted in a mount
namespace of its own, with its own byte and inode limits.
"""
from __future__ import annotations

import os

import pytest

from grader.sandbox import confine, judge
from grader.sandbox.handles import RemoteNamespace
from grader.sandbox.supervisor import fork_server, isolation_modes
from grader.api import fetch

LIMITS = judge.Limits(wall_seconds=60.0, memory_bytes=3 * 1024**3, output_bytes=64 * 1024)
MiB = 1024**2

PROGRAM = '''
import os, torch
kept = []
def allocate(n):
    kept.append(torch.ones(n))
def drop():
    kept.clear()
def transient(n):
    return float(torch.ones(n).sum())
def write(name, n):
    with open(name, "wb") as f:
        f.write(b"x" * n)
def fill():
    """Write until the file system refuses, then try the shared directory above this one."""
    total, files = 0, 0
    try:
        while True:
            with open(f"f{files}", "wb") as f:
                f.write(b"x" * (1 << 20))
            total, files = total + (1 << 20), files + 1
    except OSError as e:
        full = e.strerror
    try:
        open(os.path.join(os.path.dirname(os.getcwd()), "intruder"), "w").close()
        shared = "written"
    except OSError as e:
        shared = e.strerror
    return {"bytes": total, "full": full, "shared": shared}
'''


@pytest.fixture
def worker():
    w = fork_server().spawn(LIMITS)
    try:
        w.run_program([PROGRAM])
        assert not w.cell_errors
        yield w
    finally:
        w.close()


def test_resident_memory_is_read_from_outside_the_worker(worker):
    nb = RemoteNamespace(worker)
    nb.allocate(16)  # first call: lazily loaded code
    nb.drop()
    before = nb.memory(reset_peak=True)
    nb.allocate(16 * MiB)  # 64 MiB of float32
    kept = nb.memory()
    assert 63 * MiB <= kept.held - before.held <= 66 * MiB
    nb.drop()
    assert abs(nb.memory().held - before.held) < 2 * MiB  # freed memory goes back to the kernel
    nb.transient(8 * MiB)
    after = nb.memory()
    assert abs(after.held - before.held) < 2 * MiB
    assert after.peak - before.peak >= 63 * MiB  # the 64 MiB of the first allocation, and 32 MiB transient


def test_files_count_as_held(worker):
    nb = RemoteNamespace(worker)
    before = nb.memory()
    nb.write("data.bin", 10 * MiB)
    # charges reach the cgroup's counter in batches of 64 pages per CPU: 0.25 MiB of slack each
    assert nb.memory().held - before.held >= 9.5 * MiB


@pytest.mark.skipif("chroot" not in isolation_modes(), reason="needs root (chroot mode)")
def test_a_full_work_file_system_is_the_worker_own_problem():
    server = fork_server()
    greedy = server.spawn(LIMITS)
    try:
        greedy.run_program([PROGRAM])
        filled = fetch(RemoteNamespace(greedy).fill())
        assert filled["bytes"] <= confine.WORKDIR_BYTES
        assert filled["full"] == "No space left on device"
        assert filled["shared"] != "written"
        # While the greedy worker still holds its full disk, another one starts and writes.
        honest = server.spawn(LIMITS)
        try:
            honest.run_program([PROGRAM])
            assert not honest.cell_errors
            nb = RemoteNamespace(honest)
            before = nb.memory()
            nb.write("ok.bin", 8 * MiB)
            # charges reach the cgroup's counter in batches of 64 pages per CPU: 0.25 MiB of slack each
            assert nb.memory().held - before.held >= 7.5 * MiB
        finally:
            honest.close()
    finally:
        greedy.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_a_worker_directory_is_a_mount_of_its_own(worker):
    with open(f"/proc/{worker.pid}/mountinfo") as f:
        mounts = [line.split()[4] for line in f]
    assert worker.workdir in mounts
