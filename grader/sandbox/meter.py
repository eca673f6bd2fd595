"""Memory a worker really holds, read from outside its process.

Everything a probe measures inside the student's process (saved bytes, tensor inventories) is a
claim the student's code controls. What the kernel says about the process is not: the judge reads
``/proc/<pid>/status`` (resident set, and its high-water mark since the judge last reset it through
``/proc/<pid>/clear_refs``) and the bytes the worker keeps on its own work file system, between two
requests, while the worker sits idle waiting for the next one.

Resident memory tracks live tensors closely because the fork server starts with glibc's mmap
threshold pinned low (``MALLOC_MMAP_THRESHOLD_``, see ``supervisor._server_env``): every
allocation of 64 KiB or more is its own mapping and goes back to the kernel when freed, so a
temporary freed by correct code does not linger in the resident set. Checks compare differences
(after − before) on inputs sized so that a correct and a wrong implementation differ by tens of
megabytes, far above page-level noise.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

MMAP_THRESHOLD = 64 * 1024  # bytes; see the module docstring


@dataclass(frozen=True)
class Memory:
    """A reading, in bytes. ``peak`` is the resident high-water mark since the last reset."""

    resident: int
    peak: int
    files: int

    @property
    def held(self) -> int:
        """What the worker holds right now: its resident memory plus its files."""
        return self.resident + self.files


def _status(pid: int | str) -> dict[str, int]:
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("RssAnon", "RssShmem", "VmHWM"):
                fields[key] = int(rest.split()[0]) * 1024
    return fields


def _files_bytes(root: str) -> int:
    """Bytes stored below ``root``: its file system's usage when it is a mount of its own."""
    if not root or not os.path.isdir(root):
        return 0
    if os.path.ismount(root):
        st = os.statvfs(root)
        return (st.f_blocks - st.f_bfree) * st.f_frsize
    total = 0
    for base, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_blocks * 512
            except OSError:
                pass
    return total


def read(pid: int | str = "self", workdir: str = "") -> Memory:
    """The memory ``pid`` holds; ``workdir`` is its directory as seen by that process."""
    status = _status(pid)
    root = f"/proc/{pid}/root{workdir}" if workdir else ""
    # Anonymous and shared memory only: pages of libraries the call happens to touch first are
    # file-backed and say nothing about what the code keeps.
    return Memory(resident=status.get("RssAnon", 0) + status.get("RssShmem", 0), peak=status.get("VmHWM", 0),
                  files=_files_bytes(root))


def cpu_seconds(pid: int | str = "self") -> float:
    """CPU time ``pid`` has used, all its threads together (user + system)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reset_peak(pid: int | str = "self") -> None:
    """Restart the resident high-water mark from the current resident set (Linux >= 4.0)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def pin_mmap_threshold() -> None:
    """In a process that was started without ``MALLOC_MMAP_THRESHOLD_``: pin it now (glibc only)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        m_mmap_threshold = -3
        libc.mallopt(m_mmap_threshold, MMAP_THRESHOLD)
    except (OSError, AttributeError):
        pass
