"""Every piece of code a chapter shows the student passes the grader's source policy.

A correct answer written the way a hint, a docstring or the text suggests must not be refused at grading (a hint
once said to replace layers with ``setattr(parent, child_name, ...)``, which the policy refuses: a student who
followed it scored 0 on the exercise). The code is taken from each chapter's text and exercise cells (spans in
backquotes that are code: a call, an import, an assignment, a definition) and from the string constants of its
hidden tests and of ``coursekit`` (the messages of failed checks, not its docstrings: every call written in them),
and read against
the chapter's policy with its setup cells, as an exercise cell is. Only what the chapter's text forbids may be
named (its shortcuts: "no `torch.utils.checkpoint`"); a formula that reuses a setup name as a symbol
(``F[k][t]`` beside ``import torch.nn.functional as F``) is not code.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import ROOT
from grader.notebooks import chapters, layout, read_source
from grader.source_policy import DEFAULT_POLICY, check_source, policy_for

CODE_NODES = (ast.Call, ast.Import, ast.ImportFrom, ast.Assign, ast.AugAssign, ast.FunctionDef, ast.ClassDef,
              ast.With, ast.For, ast.Lambda)
SPAN = re.compile(r"``?([^`\n]+?)``?")
CALL_START = re.compile(r"[A-Za-z_][\w.]*\(")
FORBIDDEN_BY_THE_TEXT = "the chapter's text forbids it"


def _is_code(fragment: str) -> bool:
    try:
        tree = ast.parse(fragment)
    except (SyntaxError, ValueError):
        return False
    return any(isinstance(node, CODE_NODES) for node in ast.walk(tree))


def _calls(text: str):
    """Every balanced call expression written in ``text`` (``model.set_submodule(name, new)``)."""
    for m in CALL_START.finditer(text):
        depth = 0
        for j in range(m.end() - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            if depth == 0:
                yield text[m.start():j + 1]
                break


def _strings(path: Path, docstrings: bool = True):
    """The string constants of a module (its docstrings too unless told: they document the module's own code)."""
    tree = ast.parse(path.read_text())
    docs = set()
    if not docstrings:
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                    and isinstance(body[0].value, ast.Constant):
                docs.add(id(body[0].value))
    for node in ast.walk(tree):
        if id(node) in docs:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value
        elif isinstance(node, ast.JoinedStr):  # f-strings: their literal parts
            yield "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))


def fragments(chapter: str) -> list[tuple[str, str]]:
    """(where, code) for every code fragment the chapter shows: its text, exercise cells, hidden tests' messages."""
    found = []
    for cell in read_source(chapter).cells:
        if cell.cell_type == "markdown" or cell.metadata.get("nbgrader", {}).get("solution"):
            where = "text" if cell.cell_type == "markdown" else f"exercise {cell.metadata['nbgrader']['grade_id']}"
            found += [(where, span) for span in SPAN.findall(cell.source) if _is_code(span)]
    for text in _strings(ROOT / "grader" / "hidden" / f"{chapter}.py"):
        found += [("hidden-test message", call) for call in _calls(text) if _is_code(call)]
    return sorted(set(found))


def refused(code: str, policy, setup) -> list[str]:
    """What the policy refuses in ``code``, less what the chapter's text itself forbids."""
    breaches = [b for b in check_source(code, policy, setup) if FORBIDDEN_BY_THE_TEXT not in b.why]
    if breaches and all("as a value" in b.describe() for b in breaches) and not check_source(code, policy, ()):
        return []  # a formula whose symbols share a setup module's name
    return [b.describe() for b in breaches]


@pytest.mark.parametrize("chapter", chapters())
def test_every_code_fragment_a_chapter_shows_passes_the_source_policy(chapter):
    policy = policy_for(chapter)
    setup = layout(read_source(chapter), chapter).setup
    shown = fragments(chapter)
    assert len(shown) >= 3, f"{chapter}: the fragments were not found ({len(shown)})"
    bad = [f"{where}: {code!r}: {why[0]}" for where, code in shown if (why := refused(code, policy, setup))]
    assert not bad, "\n".join(bad)


def test_every_call_in_the_messages_of_coursekit_passes_the_source_policy():
    # (the policy's own messages name what it refuses)
    paths = [p for p in sorted((ROOT / "coursekit").glob("*.py")) if p.name != "source_policy.py"]
    calls = {call for path in paths for text in _strings(path, docstrings=False)
             for call in _calls(text) if _is_code(call)}
    assert "torch.no_grad()" in calls, "the calls in coursekit's messages were not found"
    bad = [f"{code!r}: {why[0]}" for code in sorted(calls) if (why := refused(code, DEFAULT_POLICY, ()))]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("hint, shown", [
    ("replace each Linear in its parent (setattr(parent, child_name, MePropLinear(layer, k, unified)))", False),
    ("replace each Linear (model.set_submodule(name, MePropLinear(layer, k, unified)))", True),
    ("keep a copy with ``getattr(module, name)``", False),
    ("read it with ``getattr(module, \"weight\")``", True),
])
def test_a_hint_the_grader_would_refuse_is_caught(hint, shown):
    codes = [c for c in _calls(hint) if _is_code(c)] + [s for s in SPAN.findall(hint) if _is_code(s)]
    assert codes
    assert all(not refused(code, DEFAULT_POLICY, ()) for code in codes) is shown
