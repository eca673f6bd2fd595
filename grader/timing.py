"""``python -m grader time``: how long each chapter takes a student who solved it, top to bottom.

Each reference solution (``solutions/<chapter>.py``) runs in a fresh kernel the way a student's
finished notebook does: the hidden-test regions that ``release`` deletes are deleted here too, and
fast mode (``COURSE_FAST``) is off unless ``--fast`` asks for it; ``--save DIR`` keeps the
executed notebooks (their outputs hold the chapter's measured numbers). Prints the wall time of each
notebook and its slowest cells; the course's promise is well under a minute per chapter on a
2-core machine in full mode. Timing only: the numbers depend on the machine and what else runs.
"""
from __future__ import annotations

import os
import re
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from jupyter_client import AsyncKernelManager
from jupyter_core.paths import jupyter_runtime_dir
from traitlets import default

from grader.notebooks import ROOT, chapters


SOCKET_PATH_MAX = 107  # bytes in a Unix socket's path (sun_path, less its final NUL)


class IpcKernelManager(AsyncKernelManager):
    """nbclient's kernel manager, on Unix sockets with paths of its own.

    TCP ports are picked, released, then bound by the kernel, so two kernels started at once can
    pick the same one. Unix sockets avoid that only if each kernel has its own paths: without a
    connection file chosen up front, jupyter_client names every kernel's sockets ``kernel-ipc-N``
    in the working directory, and two kernels started there at once (two test workers) can bind
    the same ones ("Kernel didn't respond", "Invalid Signature"). Each kernel gets a connection
    file of its own in Jupyter's runtime directory, and its sockets are named after it."""

    @default("transport")
    def _transport_default(self) -> str:
        return "ipc"

    @default("connection_file")
    def _connection_file_default(self) -> str:
        name = f"nbclient-{uuid.uuid4().hex[:12]}"
        folder = jupyter_runtime_dir()
        if len(os.path.join(folder, f"{name}-ipc-99")) > SOCKET_PATH_MAX:
            folder = tempfile.gettempdir()  # a runtime directory too deep for socket paths
        os.makedirs(folder, mode=0o700, exist_ok=True)
        return os.path.join(folder, f"{name}.json")


# What every nbclient.NotebookClient of the course is given.
KERNEL_OPTIONS = {"kernel_name": "python3", "kernel_manager_class": IpcKernelManager}
HIDDEN = re.compile(r"^### BEGIN HIDDEN TESTS$.*?^### END HIDDEN TESTS$\n?", re.M | re.S)


@dataclass
class Timing:
    chapter: str
    seconds: float
    cells: list[tuple[float, str]] = field(default_factory=list)  # (seconds, first source line)
    error: str = ""


def _cell_seconds(cell) -> float:
    t = cell.get("metadata", {}).get("execution", {})
    try:
        start = datetime.fromisoformat(t["iopub.execute_input"].replace("Z", "+00:00"))
        end = datetime.fromisoformat(t["shell.execute_reply"].replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return 0.0
    return (end - start).total_seconds()


def time_chapter(chapter: str, fast: bool = False, timeout: float = 300, save: Path | None = None) -> Timing:
    """Run one solved chapter in a fresh kernel; ``save``: a directory for the executed notebook."""
    import jupytext
    import nbclient
    import nbformat

    nb = jupytext.read(ROOT / "solutions" / f"{chapter}.py")
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = HIDDEN.sub("", cell.source)
    saved = os.environ.get("COURSE_FAST")
    if fast:
        os.environ["COURSE_FAST"] = "1"
    else:
        os.environ.pop("COURSE_FAST", None)
    client = nbclient.NotebookClient(nb, timeout=timeout, record_timing=True,
                                     resources={"metadata": {"path": str(ROOT)}}, **KERNEL_OPTIONS)
    error = ""
    start = time.perf_counter()
    try:
        client.execute()
    except Exception as e:  # noqa: BLE001 - reported with the timing, the other chapters go on
        error = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
    finally:
        if saved is None:
            os.environ.pop("COURSE_FAST", None)
        else:
            os.environ["COURSE_FAST"] = saved
    seconds = time.perf_counter() - start
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, save / f"{chapter}.ipynb")
    cells = [(_cell_seconds(c), (c.source.strip().splitlines() or [""])[0][:70])
             for c in nb.cells if c.cell_type == "code"]
    return Timing(chapter, seconds, sorted(cells, reverse=True), error)


def main(chapter_ids: list[str] | None = None, fast: bool = False, top: int = 3,
         save: Path | None = None) -> list[Timing]:
    from tqdm.auto import tqdm

    ids = chapter_ids or chapters()
    unknown = sorted(set(ids) - set(chapters()))
    if unknown:
        raise ValueError(f"unknown chapter(s) {', '.join(unknown)}; known: {', '.join(chapters())}")
    mode = "fast" if fast else "full"
    print(f"{mode} mode, {os.cpu_count()} CPU(s), OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    results = []
    for ch in tqdm(ids, desc=f"time ({mode} mode)", unit="chapter"):
        t = time_chapter(ch, fast=fast, save=save)
        results.append(t)
        slow = "; ".join(f"{s:.1f} s {line!r}" for s, line in t.cells[:top])
        tqdm.write(f"{ch:<24} {t.seconds:6.1f} s   slowest: {slow}" + (f"   FAILED {t.error}" if t.error else ""))
    return results
