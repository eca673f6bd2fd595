"""``python -m grader demo --warm``: measure every dashboard once, before class.

Each chapter's dashboard (``grader.demo``) runs top to bottom in a fresh kernel, as Voila runs
it, and its last cell saves what the demo cells read (``coursekit.lecture_cache``) under the
chapter's cache key. A dashboard opened afterwards loads that instead of computing it. Chapters
whose saved measurements are still current are not run again. A progress bar follows the
chapters and, inside one, the section being computed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from grader import demo


@dataclass
class Warmed:
    chapter: str
    status: str  # "saved", "current" (already saved) or "failed"
    seconds: float = 0.0
    note: str = ""


def _saved_problems(nb: nbformat.NotebookNode) -> list[str] | None:
    """What the dashboard's last cell printed: the names it could not save ([] when it saved)."""
    import ast

    for output in nb.cells[-1].get("outputs", []):
        text = output.get("text", "")
        if output.get("name") == "stdout" and text.startswith(demo.SAVE_MARKER):
            return ast.literal_eval(text[len(demo.SAVE_MARKER):].strip())
    return None


def _error(nb: nbformat.NotebookNode) -> str | None:
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                return f"{output.get('ename')}: {output.get('evalue')}"
    return None


def warm(chapter_ids: list[str] | None = None, dest: Path = demo.BUILD, timeout: int = 1800,
         force: bool = False) -> list[Warmed]:
    """Build every dashboard under ``dest`` and run those of ``chapter_ids`` (default: all) whose
    saved measurements are missing or stale (all of them with ``force``); return what happened to
    each chapter, in order."""
    import nbclient
    from tqdm.auto import tqdm

    from grader.timing import KERNEL_OPTIONS

    from grader.notebooks import check_chapter_id

    wanted = [check_chapter_id(c) for c in chapter_ids or []]
    listed = demo.build(dest)  # all of them, as `make demo` serves them (a server may be running)
    without = [c for c in wanted if c not in listed]
    if without:
        raise ValueError(f"{', '.join(without)} has no demo cell, so no dashboard to warm")
    results = []
    bar = tqdm([c for c in listed if not wanted or c in wanted], desc="dashboards", unit="chapter")
    for chapter in bar:
        nb = nbformat.read(dest / f"{chapter}.ipynb", as_version=4)
        cache = dest / nb.metadata["course"]["cache"]
        if cache.exists() and not force:
            results.append(Warmed(chapter, "current", note=f"{cache.relative_to(dest)} is up to date"))
            continue
        cache.unlink(missing_ok=True)  # force: the dashboard must not load the old one
        sections = nb.metadata["course"]["sections"]
        start = time.perf_counter()

        def on_cell_start(cell, cell_index, **_):
            bar.set_postfix_str(f"{chapter}: {sections[cell_index][:50]}", refresh=True)

        client = nbclient.NotebookClient(nb, timeout=timeout, **KERNEL_OPTIONS, on_cell_start=on_cell_start,
                                         resources={"metadata": {"path": str(dest)}})
        try:
            client.execute()
        except Exception as e:  # noqa: BLE001 - one chapter's failure is reported, the others still run
            error = _error(nb) or f"{type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}"
            results.append(Warmed(chapter, "failed", time.perf_counter() - start, error[:500]))
            continue
        seconds = time.perf_counter() - start
        problems = _saved_problems(nb)
        if problems is None or problems or not cache.exists():
            why = "; ".join(problems) if problems else "the dashboard's last cell saved nothing"
            results.append(Warmed(chapter, "failed", seconds,
                                  f"not saved ({why}): this dashboard computes its measurements on every open"))
        else:
            size = cache.stat().st_size
            results.append(Warmed(chapter, "saved", seconds, f"{cache.relative_to(dest)}, {size / 2**20:.1f} MiB"))
    bar.close()
    _prune(dest, listed)
    return results


def _prune(dest: Path, chapters: list[str]) -> None:
    """Remove saved measurements that no dashboard of this mode can load any more (an older
    version of the chapter or the course), keeping those of the other mode (fast or full)."""
    current = {nbformat.read(dest / f"{ch}.ipynb", as_version=4).metadata["course"]["cache"] for ch in chapters}
    mode = demo.cache_mode()
    for path in (dest / demo.CACHE_DIR).glob("*.pkl"):
        ch, _, rest = path.stem.partition("-")
        if ch in chapters and rest.startswith(mode + "-") and f"{demo.CACHE_DIR}/{path.name}" not in current:
            path.unlink(missing_ok=True)
