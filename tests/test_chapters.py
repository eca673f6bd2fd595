"""Every chapter is complete: everything its declaration (``grader.chapters``) promises exists.

A chapter is its source ``solutions/<id>.py`` (declaration in the header, exercises and graded test
cells in the cell markers) plus, named after its id:
- ``grader/hidden/<id>.py`` with one ``@hidden_test`` check per graded test cell, no other;
- ``grader/probes/<id>.py`` if its hidden tests use probes of their own (``probes.chNN_...``);
- ``tests/test_hidden_<id>.py`` (its checks against correct and wrong implementations), with its contract
  table (``CONTRACT``, see ``tests/contract_tables.py``);
- ``tests/wrong_submissions_<id>.py``: a plausible wrong answer (source text) per exercise;
- ``tests/second_submissions_<id>.py``: a second correct answer per exercise, written from the
  released notebook alone;
- its declared kernel ``kernels/<id>.py`` with a ``main()`` benchmark and ``tests/test_kernels_<id>.py``;
- its declared checkpoints in ``data/checkpoints/``;
- a row in the README's chapter table with its title and exercises (``python -m grader release``
  writes the table; ``test_the_readme_table_is_written_from_the_declarations`` checks it is fresh);
- imports in its setup and exercise cells that the sandbox allows (the base set or its declaration).

Everything is read from files (ast, text), so :func:`missing_pieces` also judges a chapter
outside the repository: the toy chapter below shows what a forgotten piece looks like.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from grader.chapters import Chapter, every_chapter, read_declaration, readme_table, with_readme_table
from grader.notebooks import python_source, read_source
from grader.sandbox.rules import DANGEROUS, LIBRARIES

CHAPTERS = every_chapter()


def _module(path: Path) -> ast.Module | None:
    return ast.parse(path.read_text(), filename=str(path)) if path.is_file() else None


def _hidden_test_ids(tree: ast.Module) -> list[str]:
    """The first argument of every ``hidden_test("...")`` call (the decorators)."""
    return [node.args[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "hidden_test"
            and node.args and isinstance(node.args[0], ast.Constant)]


def _dict_keys(tree: ast.Module, name: str) -> list[tuple] | None:
    """The constant tuple keys of the module-level dict assigned to ``name``."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(getattr(t, "id", None) == name for t in targets) and isinstance(node.value, ast.Dict):
            return [ast.literal_eval(k) for k in node.value.keys if k is not None]
    return None


def _assigns(tree: ast.Module, name: str) -> bool:
    """Whether the module assigns ``name`` at top level."""
    return any(getattr(t, "id", None) == name for node in tree.body
               for t in (node.targets if isinstance(node, ast.Assign) else
                         [node.target] if isinstance(node, ast.AnnAssign) else []))


def _defines(tree: ast.Module, name: str) -> bool:
    return any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name for n in tree.body)


def _imported_modules(sources: list[str]) -> set[str]:
    found = set()
    for source in sources:
        for node in ast.walk(ast.parse(python_source(source))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


def _probe_names(tree: ast.Module) -> set[str]:
    """``probes.NAME`` attributes used by a hidden-test module."""
    return {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "probes"}


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.Assign):
            names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return names


def missing_pieces(root: Path, ch: Chapter) -> list[str]:
    """What the chapter ``ch`` promises and ``root`` lacks, one line each (empty: complete)."""
    missing: list[str] = []
    cid = ch.id
    if not ch.exercises:
        missing.append(f"solutions/{cid}.py declares no exercise (# %% exercise=\"NAME\")")
    for ex in ch.exercises:
        if not ch.tests_of(ex):
            missing.append(f"exercise {ex} has no graded test cell (# %% test=\"test_...\" points=N checks=\"{ex}\")")

    hidden = _module(root / "grader" / "hidden" / f"{cid}.py")
    cells = [t for t, _ in ch.tests]
    if hidden is None:
        missing.append(f"grader/hidden/{cid}.py is missing: one @hidden_test check per graded test cell "
                       f"({', '.join(cells)})")
    else:
        checks = _hidden_test_ids(hidden)
        for t in cells:
            if t not in checks:
                missing.append(f"grader/hidden/{cid}.py has no @hidden_test({t!r}) (a graded test cell of the source)")
        for t in checks:
            if t not in cells:
                missing.append(f"grader/hidden/{cid}.py checks {t!r}, which is no graded test cell of the source")
        prefix = cid.split("_")[0] + "_"
        own = {n for n in _probe_names(hidden) if n.startswith(prefix)}
        probes = _module(root / "grader" / "probes" / f"{cid}.py")
        if own and (probes is None or own - _top_level_names(probes)):
            lacking = sorted(own - (_top_level_names(probes) if probes else set()))
            missing.append(f"grader/probes/{cid}.py must define the probes its hidden tests use: {', '.join(lacking)}")

    tests = root / "tests"
    hidden_tests = _module(tests / f"test_hidden_{cid}.py")
    if hidden_tests is None:
        missing.append(f"tests/test_hidden_{cid}.py is missing (its checks against correct and wrong implementations)")
    elif not _assigns(hidden_tests, "CONTRACT") or "contract_tests(" not in ast.unparse(hidden_tests):
        missing.append(f"tests/test_hidden_{cid}.py has no contract table: CONTRACT = [Clause(...), ...] and the "
                       "tests of contract_tests(...) (tests/contract_tables.py)")
    for kind, name in (("wrong", "WRONG"), ("second", "SECOND")):
        path = tests / f"{kind}_submissions_{cid}.py"
        tree = _module(path)
        keys = _dict_keys(tree, name) if tree else None
        what = "a plausible wrong answer" if kind == "wrong" else "a second correct answer, written from the notebook"
        if keys is None:
            missing.append(f"tests/{path.name} is missing: {name} = {{({cid!r}, exercise): source}}, one per "
                           f"exercise ({what})")
            continue
        for ex in ch.exercises:
            if (cid, ex) not in keys:
                missing.append(f"tests/{path.name} has no {name}[({cid!r}, {ex!r})]: {what}")
        for key in keys:
            if key[0] != cid or key[1] not in ch.exercises:
                missing.append(f"tests/{path.name}: {key!r} is no exercise of {cid}")

    kernel_files = sorted(p.stem for p in (root / "kernels").glob(f"{cid}*.py"))
    if ch.kernel:
        module = ch.kernel.split(".", 1)[1]
        tree = _module(root / "kernels" / f"{module.replace('.', '/')}.py")
        if tree is None:
            missing.append(f"kernels/{module}.py is missing (declared kernel {ch.kernel})")
        elif not _defines(tree, "main"):
            missing.append(f"kernels/{module}.py has no main() benchmark (make bench runs it)")
        if not (tests / f"test_kernels_{cid}.py").is_file():
            missing.append(f"tests/test_kernels_{cid}.py is missing (tests of the declared kernel {ch.kernel})")
    elif kernel_files:
        missing.append(f"kernels/{kernel_files[0]}.py exists but solutions/{cid}.py declares no kernel "
                       f"(chapter: kernel: kernels.{kernel_files[0]})")
    for name in ch.checkpoints:
        if not (root / "data" / "checkpoints" / f"{name}.pt").is_file():
            missing.append(f"data/checkpoints/{name}.pt is missing (declared checkpoint; make checkpoints makes it)")

    readme = (root / "README.md").read_text() if (root / "README.md").is_file() else ""
    want = readme_table([ch])[-1]
    if want not in readme.splitlines():
        missing.append(f"README.md's chapter table lacks the row {want} (python -m grader release writes it)")

    nb = read_source(cid, path=root / "solutions" / f"{cid}.py")
    sources = [c.source for c in nb.cells if c.cell_type == "code" and (
        "setup" in c.metadata.get("tags", []) or c.metadata.get("nbgrader", {}).get("solution"))]
    allowed = (set(sys.stdlib_module_names) | LIBRARIES | set(ch.imports)) - DANGEROUS
    for module in sorted(_imported_modules(sources) - allowed):
        missing.append(f"solutions/{cid}.py imports {module} in a setup or exercise cell: declare it "
                       f"(chapter: imports: [{module}]) so that the grader's sandbox allows it")
    return missing


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.id for c in CHAPTERS])
def test_chapter_is_complete(chapter):
    missing = missing_pieces(ROOT, chapter)
    assert not missing, f"{chapter.id} is incomplete:\n- " + "\n- ".join(missing)


TOY = '''\
# ---
# jupyter:
#   chapter:
#     title: "A toy chapter"
#     imports: []
#     kernel: kernels.ch98_toy
#     checkpoints: [toy_weights]
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 98 — a toy

# %% tags=["setup"]
import torch
import einops_like_nothing

# %% exercise="double"
def double(x):
    return 2 * x

# %% test="test_double" points=1 checks="double"
assert double(1) == 2

# %% test="test_double_edge_cases" points=1 checks="double"
assert double(0) == 0

# %% exercise="halve"
def halve(x):
    return x / 2
'''


def test_the_readme_table_is_written_from_the_declarations():
    text = (ROOT / "README.md").read_text()
    assert with_readme_table(text) == text, "README.md's chapter table is stale: run python -m grader release"


def test_an_incomplete_chapter_is_told_what_it_lacks(tmp_path):
    """A toy chapter with only its source, a hidden module that checks one of its two cells and a
    wrong answer for one of its two exercises: every missing piece is named."""
    (tmp_path / "solutions").mkdir()
    source = tmp_path / "solutions" / "ch98_toy.py"
    source.write_text(TOY)
    (tmp_path / "grader" / "hidden").mkdir(parents=True)
    (tmp_path / "grader" / "hidden" / "ch98_toy.py").write_text(
        'from grader.api import hidden_test\nfrom grader import probes\n\n'
        '@hidden_test("test_double")\ndef check(nb):\n    probes.ch98_count(nb)\n')
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "wrong_submissions_ch98_toy.py").write_text(
        'WRONG = {("ch98_toy", "double"): "def double(x):\\n    return x\\n"}\n')
    (tmp_path / "README.md").write_text("| id | chapter | you implement | status |\n|---|---|---|---|\n")
    missing = missing_pieces(tmp_path, read_declaration(source))
    print("\n".join(missing))
    expected = [
        r"exercise halve has no graded test cell",
        r"grader/hidden/ch98_toy.py has no @hidden_test\('test_double_edge_cases'\)",
        r"grader/probes/ch98_toy.py must define the probes its hidden tests use: ch98_count",
        r"tests/test_hidden_ch98_toy.py is missing",
        r"tests/wrong_submissions_ch98_toy.py has no WRONG\[\('ch98_toy', 'halve'\)\]",
        r"tests/second_submissions_ch98_toy.py is missing",
        r"kernels/ch98_toy.py is missing \(declared kernel kernels.ch98_toy\)",
        r"tests/test_kernels_ch98_toy.py is missing",
        r"data/checkpoints/toy_weights.pt is missing",
        r"README.md's chapter table lacks the row \| `ch98_toy` \| A toy chapter \| `double`, `halve` \|",
        r"imports einops_like_nothing in a setup or exercise cell: declare it",
    ]
    for pattern in expected:
        assert any(re.search(pattern, m) for m in missing), f"not reported: {pattern}\n{missing}"
    assert len(missing) == len(expected), missing


def test_a_test_cell_must_name_its_exercise(tmp_path):
    (tmp_path / "ch98_toy.py").write_text(TOY.replace(' checks="double"', "", 1))
    with pytest.raises(ValueError, match='test cell .test_double. needs checks="EXERCISE"'):
        read_declaration(tmp_path / "ch98_toy.py")


def test_a_test_cell_must_follow_its_exercise(tmp_path):
    (tmp_path / "ch98_toy.py").write_text(TOY.replace('points=1 checks="double"', 'points=1 checks="halve"', 1))
    with pytest.raises(ValueError, match="checks 'halve', which is not an exercise before it"):
        read_declaration(tmp_path / "ch98_toy.py")


def test_a_chapter_without_declaration_is_refused(tmp_path):
    (tmp_path / "ch98_toy.py").write_text(re.sub(r"#   chapter:\n(#     .*\n)+", "", TOY))
    with pytest.raises(ValueError, match="declares no chapter"):
        read_declaration(tmp_path / "ch98_toy.py")


@pytest.mark.parametrize("block,error", [
    ("#     mentioned:\n#       double:\n#         K: a matrix of the maths\n", None),
    ("#     mentioned:\n#       triple:\n#         K: a matrix\n", "names 'triple', not an exercise of the chapter"),
    ("#     mentioned:\n#       double: [K]\n", r"chapter.mentioned.double must be \{name: why\}"),
    ("#     mentioned: [K]\n", "chapter.mentioned must be a mapping"),
    ("#     mentioned_names: {}\n", "unknown chapter keys"),
])
def test_mentioned_names_are_declared_per_exercise_with_a_reason(tmp_path, block, error):
    (tmp_path / "ch98_toy.py").write_text(TOY.replace("#   jupytext:\n", block + "#   jupytext:\n", 1))
    if error is None:
        assert read_declaration(tmp_path / "ch98_toy.py").mentioned == {"double": {"K": "a matrix of the maths"}}
    else:
        with pytest.raises(ValueError, match=error):
            read_declaration(tmp_path / "ch98_toy.py")
