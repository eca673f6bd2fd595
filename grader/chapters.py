"""Each chapter's declaration, read from its one source, ``solutions/<chapter_id>.py``.

A chapter declares itself in two parts of that file. Its jupytext header carries a ``chapter``
block::

    # ---
    # jupyter:
    #   chapter:
    #     title: "FlashAttention in PyTorch and Triton"     # the README's chapter table shows it
    #     imports: [kernels, triton]     # top-level modules its setup and exercise cells import
    #                                    # beyond the course's base set (grader.sandbox.rules)
    #     kernel: kernels.ch10_flash_attention   # optional: its Triton kernel module (make bench)
    #     checkpoints: [tinygpt_fibonacci]       # optional: pretrained weights in data/checkpoints/
    #     prose_numbers:                 # optional: phrases whose numbers are definitions or quoted
    #       - 'the paper''s 20×'         # figures, not measurements (tests/test_prose_numbers.py)
    #     mentioned:                     # optional: names an exercise's text uses that grading does
    #       flash_attention_triton:      # not offer, each with why (tests/test_namespace.py)
    #         K: a matrix of the maths
    #   jupytext: ...

and its cell markers declare the exercises and the graded test cells, each test cell naming the
exercise it grades: ``# %% exercise="NAME"`` and ``# %% test="test_NAME" points=N checks="NAME"``.

Release, grading (through the released notebook), the sandbox's import allow-list, ``make bench``
and the test suite read the declaration, and ``python -m grader release`` writes the README's
chapter table from it; nothing else lists the chapters. ``tests/test_chapters.py`` checks that everything a declaration promises exists.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from grader.notebooks import ROOT, SOLUTIONS, chapters, layout, read_source

_KEYS = {"title", "imports", "kernel", "checkpoints", "prose_numbers", "mentioned"}
README = ROOT / "README.md"
TABLE_BEGIN = "<!-- The table is written by `python -m grader release` from the chapters' declarations. -->"
TABLE_END = "<!-- end of the chapter table -->"


@dataclass(frozen=True)
class Chapter:
    id: str
    title: str
    exercises: tuple[str, ...]  # in notebook order
    tests: tuple[tuple[str, float], ...]  # (graded test cell, points), in notebook order
    exercise_tests: tuple[tuple[str, tuple[str, ...]], ...]  # (exercise, the test cells that grade it)
    imports: tuple[str, ...]  # top-level modules beyond the base set that its cells may import
    kernel: str | None = None  # a module of the kernels package, e.g. "kernels.ch05_tinytl"
    checkpoints: tuple[str, ...] = ()  # names of data/checkpoints/<name>.pt
    prose_numbers: tuple[str, ...] = ()  # phrases of its text whose numbers are not measured
    # exercise -> {name its text uses that grading does not offer: why it is named}
    mentioned: dict[str, dict[str, str]] = field(default_factory=dict, hash=False)

    def tests_of(self, exercise: str) -> tuple[str, ...]:
        return dict(self.exercise_tests).get(exercise, ())


def _names(value, key: str, chapter: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{chapter}: chapter.{key} must be a list of names, got {value!r}")
    return tuple(value)


def _mentioned(value, exercises: tuple[str, ...], chapter: str) -> dict[str, dict[str, str]]:
    if value is None:
        return {}
    shape = "a mapping exercise -> {name: why it is named}"
    if not isinstance(value, dict):
        raise ValueError(f"{chapter}: chapter.mentioned must be {shape}, got {value!r}")
    for exercise, names in value.items():
        if exercise not in exercises:
            raise ValueError(f"{chapter}: chapter.mentioned names {exercise!r}, not an exercise of the chapter")
        if not isinstance(names, dict) or not names or not all(
                isinstance(k, str) and k and isinstance(v, str) and v.strip() for k, v in names.items()):
            raise ValueError(f"{chapter}: chapter.mentioned.{exercise} must be {{name: why}}, got {names!r}")
    return {exercise: dict(names) for exercise, names in value.items()}


def read_declaration(source: Path) -> Chapter:
    """The declaration in the chapter source ``source`` (``<root>/solutions/<chapter_id>.py``)."""
    chapter = source.stem
    nb = read_source(chapter, keep_declaration=True, path=source)
    meta = nb.metadata.get("chapter")
    where = f"solutions/{chapter}.py"
    if not isinstance(meta, dict):
        raise ValueError(f"{where} declares no chapter: its jupytext header needs a `chapter:` block "
                         "(title, imports; kernel and checkpoints if any), see grader/chapters.py")
    unknown = set(meta) - _KEYS
    if unknown:
        raise ValueError(f"{where}: unknown chapter keys {sorted(unknown)} (known: {sorted(_KEYS)})")
    title = meta.get("title")
    if not isinstance(title, str) or not title.strip():
        raise ValueError(f"{where}: chapter.title must be a non-empty string")
    kernel = meta.get("kernel")
    if kernel is not None and (not isinstance(kernel, str) or not kernel.startswith(f"kernels.{chapter}")):
        raise ValueError(f"{where}: chapter.kernel must name kernels.{chapter} (or a module under it), "
                         f"got {kernel!r}")
    lay = layout(nb, chapter)
    return Chapter(chapter, title.strip(), lay.exercises, lay.tests, lay.exercise_tests,
                   _names(meta.get("imports"), "imports", chapter), kernel,
                   _names(meta.get("checkpoints"), "checkpoints", chapter),
                   _names(meta.get("prose_numbers"), "prose_numbers", chapter),
                   _mentioned(meta.get("mentioned"), lay.exercises, chapter))


@functools.lru_cache(maxsize=None)
def _declared(chapter: str, mtime_ns: int) -> Chapter:
    return read_declaration(SOLUTIONS / f"{chapter}.py")


def declared(chapter: str) -> Chapter:
    """The declaration of ``chapter`` (re-read when its source changes)."""
    return _declared(chapter, (SOLUTIONS / f"{chapter}.py").stat().st_mtime_ns)


def every_chapter() -> list[Chapter]:
    return [declared(c) for c in chapters()]


def declared_imports() -> frozenset[str]:
    """Every chapter's declared imports: added to the sandbox's base set of importable modules."""
    return frozenset(m for c in every_chapter() for m in c.imports)


def kernel_modules() -> list[str]:
    """The chapters' kernel modules, in chapter order (``make bench`` runs each one's ``main()``)."""
    return [c.kernel for c in every_chapter() if c.kernel]


def readme_table(found: list[Chapter] | None = None) -> list[str]:
    """The README's chapter table, one row per declared chapter."""
    rows = ["| id | chapter | you implement |", "|---|---|---|"]
    for ch in found if found is not None else every_chapter():
        rows.append(f"| `{ch.id}` | {ch.title} | {', '.join(f'`{e}`' for e in ch.exercises)} |")
    return rows


def with_readme_table(text: str) -> str:
    """``text`` (the README) with the lines between its table markers replaced by :func:`readme_table`."""
    lines = text.splitlines()
    if TABLE_BEGIN not in lines or TABLE_END not in lines:
        raise ValueError(f"README.md needs the lines {TABLE_BEGIN!r} and {TABLE_END!r} around its chapter table")
    begin, end = lines.index(TABLE_BEGIN), lines.index(TABLE_END)
    return "\n".join(lines[:begin + 1] + readme_table() + lines[end:]) + ("\n" if text.endswith("\n") else "")


def write_readme_table(path: Path = README) -> bool:
    """Rewrite the README's chapter table from the declarations; True if it changed."""
    text = path.read_text(encoding="utf-8")
    new = with_readme_table(text)
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text
