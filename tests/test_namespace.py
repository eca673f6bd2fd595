"""An exercise is graded in the namespace the release gives it: setup cells, then exercise cells.

The grader runs a chapter's setup cells and its exercise cells, nothing else, so a name that an
exercise uses or that its text suggests using must come from a setup cell, another exercise
cell, the exercise cell itself or the builtins. A name imported only in a later, ungraded cell
works in the student's kernel and fails at grading with a NameError. Two static checks, per
exercise of every chapter (nothing is executed):

- every free name of the reference exercise cell resolves (``coursekit.graded.global_reads``: the
  names it reads from the module's globals, by Python's scoping rules; students' visible test
  cells run the same analysis on their own cells, ``coursekit.graded.check_as_graded``);
- every module, class or dotted name the exercise's text puts in backticks (its docstring and
  comments, and the markdown just above the cell) resolves by its first part, unless the
  chapter's declaration lists it for that exercise (``chapter: mentioned:`` in the header of
  ``solutions/<id>.py``) with the reason it is named without being offered (a refused library,
  an attribute path, a symbol of the maths). A listed name that the text no longer holds fails
  too, so the list cannot grow stale.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import re

import pytest

from coursekit.graded import BUILTINS, global_reads, module_bindings
from grader.chapters import declared
from grader.notebooks import chapters, grade_id, layout, python_source, read_source

TICKED = re.compile(r"`{1,2}([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\([^`]*\))?`{1,2}")
MARKERS = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*$", re.M)


def _python(source: str) -> str:
    return MARKERS.sub("", python_source(source))


def _parse(source: str) -> ast.Module:
    return ast.parse(_python(source))


def _bound(tree: ast.AST) -> set[str]:
    """Every name a cell binds, at any depth (definitions, imports, targets, parameters): what the
    text of an exercise may name without it being offered (a parameter, a local)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    module = importlib.import_module(node.module)
                    names |= set(getattr(module, "__all__", [n for n in dir(module) if not n.startswith("_")]))
                else:
                    names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _exercises():
    for chapter in chapters():
        nb = read_source(chapter)
        lay = layout(nb, chapter)
        provided = set().union(*(module_bindings(_python(s)) for s in lay.setup))
        cells = {grade_id(c): (i, c) for i, c in enumerate(nb.cells) if grade_id(c) in lay.exercises}
        for exercise in lay.exercises:  # exercise cells run too: their top-level names are provided
            provided |= {n.name for n in _parse(cells[exercise][1].source).body
                         if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        for exercise in lay.exercises:
            i, cell = cells[exercise]
            text = [cell.source]
            j = i - 1
            while j >= 0 and nb.cells[j].cell_type == "markdown":
                text.append(nb.cells[j].source)
                j -= 1
            yield pytest.param(chapter, exercise, cell.source, "\n".join(text), provided, id=f"{chapter}-{exercise}")


EXERCISES = list(_exercises())


@pytest.mark.parametrize("chapter,exercise,source,text,provided", EXERCISES)
def test_reference_exercise_uses_only_what_grading_provides(chapter, exercise, source, text, provided):
    source = _python(source)
    missing = global_reads(source) - module_bindings(source) - BUILTINS - provided
    assert not missing, (f"{chapter}: the reference {exercise} uses {sorted(missing)}, which no setup cell, "
                         f"exercise cell or builtin provides: it would fail at grading with a NameError")


@pytest.mark.parametrize("chapter,exercise,source,text,provided", EXERCISES)
def test_names_the_exercise_text_suggests_are_provided(chapter, exercise, source, text, provided):
    bound_here = _bound(_parse(source))
    named = {m.split(".")[0] for m in TICKED.findall(text)
             if "." in m or m[:1].isupper() or _is_module(m)}
    unresolved = named - bound_here - BUILTINS - provided
    allowed = declared(chapter).mentioned.get(exercise, {})
    offered = sorted(unresolved - allowed.keys())
    assert not offered, (f"{chapter}: the text of {exercise} names {offered}, which grading does not provide: "
                         f"import it in a setup cell, or declare it in solutions/{chapter}.py's header "
                         f"(chapter: mentioned: {exercise}: NAME: why it is named)")
    stale = sorted(set(allowed) - named)
    assert not stale, f"{chapter}: chapter.mentioned lists {stale} for {exercise}, which its text no longer names"
