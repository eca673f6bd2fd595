"""Measured numbers come from the run: none is typed into a chapter's prose.

A measured figure typed into markdown goes stale as soon as the code, a seed or a size changes,
and nothing notices. So in every chapter source (``solutions/*.py``) a number that reads like a
measurement, i.e. one with a unit (bytes, KB/KiB/MB/GB, %, ×, x, "times", ms, s, bits, FLOPs,
points) or with thousands separators, may stand only

- in code output: printed or formatted from variables by the run, so it is not in the source;
- in a phrase its chapter declares literal (``prose_numbers:`` in the header of its source): a
  definition ("4 bytes" per fp32 value), arithmetic on definitions, or a figure quoted from a paper (the phrase names the paper or says
  "paper"). Only the numbers inside a listed phrase are exempt, and a listed phrase that no
  longer occurs fails too, so the list cannot silently grow stale or cover a new number.

Both markdown cells and the string literals of code cells are read: a sentence printed with
the number typed into it is still typed. Format specifications (``{x:.1%}``) are not literals.
Nothing is executed, so the test is cheap.

Chapters listed in ``PENDING`` are being rewritten and still type numbers into prose: the test
xfails for them and lists every number it finds (``pytest -rx``). Each is either moved into
code output or, if it is a definition or a quoted figure, listed with its phrase under
``prose_numbers:``; a pending chapter with nothing left to list fails until it leaves ``PENDING``.
"""
from __future__ import annotations

import ast
import re

import jupytext
import pytest

from conftest import ROOT
from grader.chapters import declared
from grader.notebooks import chapters, python_source

_UNIT = (r"(?:[KMGT]i?B\b|kB\b|(?:kilo|mega|giga|tera|kibi|mebi|gibi)?bytes?\b|bits?\b|\\?%|(?:per ?cent)\b"
         r"|×(?!\s?\d)|x\b|times\b|ms\b|s\b|(?:milli)?seconds?\b|minutes?\b|[KMGT]?FLOPs?\b|points?\b)")
_NUMBER = r"(?<![\w.^])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_WORDS = r"(?i:\b(?:two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|forty|fifty|hundred|thousand)"
MEASURED = re.compile(rf"{_NUMBER}\$?\s?{_UNIT}"  # a number with a unit
                      r"|(?<![\w.^])\d{1,3}(?:,\d{3})+(?:\.\d+)?"  # or with thousands separators
                      rf"|{_WORDS}(?:[- ]fold|\s+times)\b)")  # or in words


# Chapters being rewritten that still type numbers into prose, with what a first reading found
# measured (to print from the run); the rest of what the test lists looks literal (to list above).
PENDING: dict[str, str] = {}


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _string_literals(source: str) -> list[str]:
    """The string constants of a code cell, f-strings' literal parts included, format specs excluded."""
    try:
        tree = ast.parse(python_source(source))
    except SyntaxError:
        return [source]  # not Python: read it all
    specs = {id(part) for node in ast.walk(tree) if isinstance(node, ast.FormattedValue) and node.format_spec
             for part in ast.walk(node.format_spec)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in specs]


def texts(chapter: str) -> list[str]:
    """Markdown cells and quoted code-cell string literals of a chapter source, whitespace folded."""
    out = []
    for cell in jupytext.read(ROOT / "solutions" / f"{chapter}.py").cells:
        if cell.cell_type == "markdown":
            out.append(_normalise(cell.source))
        elif cell.cell_type == "code":
            out += [_normalise(f'"{s}"') for s in _string_literals(cell.source)]
    return out


def typed_numbers(text: str, literal: list[str] = ()) -> list[str]:
    """Measured-looking numbers in ``text`` outside the ``literal`` phrases."""
    masked = text
    for phrase in literal:
        phrase = _normalise(phrase)
        masked = masked.replace(phrase, " " * len(phrase))
    return [m.group(0) for m in MEASURED.finditer(masked)]


def literal(chapter: str) -> tuple[str, ...]:
    """The phrases the chapter declares literal (``prose_numbers:`` in its header, grader.chapters)."""
    return declared(chapter).prose_numbers


def offenders(chapter: str) -> list[str]:
    return [n for t in texts(chapter) for n in typed_numbers(t, literal(chapter))]


def test_detector_sees_typed_measurements():
    found = typed_numbers("about 10 MB, 12.5% less, 3× more, 2.8x slower, 9,850 KB, 1,234 rows, "
                          "7.3 ms, 0.5 bits, seven times fewer, 352$ bytes, 10 megabytes, 12 percent")
    assert found == ["10 MB", "12.5%", "3×", "2.8x", "9,850 KB", "1,234", "7.3 ms", "0.5 bits",
                     "seven times", "352$ bytes", "10 megabytes", "12 percent"], found
    assert typed_numbers("$k = \\sqrt{16} = 4$, 8×8 images, 224×224, $2^{n-1}$ plans, f(x) at x=3, rank 4") == []
    assert typed_numbers("from 48 GB to 7 GB, then 5 MB", ["from 48 GB to 7 GB"]) == ["5 MB"]


@pytest.mark.parametrize("chapter", chapters())
def test_literal_phrases_still_occur(chapter):
    body = " ".join(texts(chapter))
    stale = [p for p in literal(chapter) if _normalise(p) not in body]
    assert not stale, f"{chapter}: its prose_numbers list phrases the chapter no longer holds: {stale}"


@pytest.mark.parametrize("chapter", chapters())
def test_measured_numbers_come_from_the_run(chapter):
    found = offenders(chapter)
    if chapter not in PENDING:
        assert not found, (f"{chapter} types measured-looking numbers into prose: {found}. Print them from the "
                           "run, or, if a definition or a quoted figure, list its phrase under prose_numbers: in the "
                           "chapter's declaration (the header of solutions/<chapter>.py)")
        return
    assert found, f"{chapter} types no measured-looking number into prose any more: remove it from PENDING"
    pytest.xfail(f"{chapter} types {len(found)} measured-looking numbers into prose ({PENDING[chapter]}): "
                 f"{found}")
