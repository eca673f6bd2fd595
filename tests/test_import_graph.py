"""The import graph of ``grader/``, ``coursekit/`` and ``kernels/``, read from the source: nothing is imported.

Every ``import`` and ``from ... import`` statement of every module is read with ``ast``, wherever
it stands: at the top level, inside functions and classes, and under ``if TYPE_CHECKING:``.
TYPE_CHECKING-only imports count like any other: a cycle that only type checkers follow still
ties two modules together, and a ``Protocol`` or a small module of its own undoes it (as
``grader.sandbox.handles.WorkerLink`` and ``grader.sandbox.limits`` do). Relative imports are
resolved against the importing module's package (``from . import x`` in ``grader/sandbox/`` is
``grader.sandbox.x``), and ``from a import b`` points at the module ``a.b`` when there is one,
else at ``a``. Not counted: the parent packages that a dotted import runs first (a package's
``__init__`` that imports its own modules would otherwise always close a cycle), and imports by
run-time name (``importlib.import_module``, references inside pickles), which no parser sees.

What must hold:

(a) no cycle among the modules of ``grader``;
(b) ``grader.sandbox`` imports nothing of ``grader`` outside ``grader.sandbox``: its callers hand
    it the checks, the probe package and the limits (``grader/sandbox/settings.py``);
(c) ``coursekit`` and ``kernels``, which students install, import nothing of ``grader``,
    ``solutions`` or ``tests``;
(d) ``grader.probes`` imports nothing of ``grader.hidden`` or ``solutions``: the student's
    process can read the probes.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("grader", "coursekit", "kernels")


def modules_under(root: Path, packages=PACKAGES) -> dict[str, tuple[Path, bool]]:
    """{dotted module name: (file, whether it is a package's __init__)} of every module under ``packages``."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def imported(path: Path, name: str, is_package: bool, known) -> set[str]:
    """The dotted names a module's import statements name, relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if is_package else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                if node.level - 1 >= len(parts):
                    raise ValueError(f"{path}: a relative import reaches above the top-level package")
                base = ".".join(parts[:len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
            for alias in node.names:
                names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return names


def resolve(target: str, known) -> str | None:
    """The module of ``known`` an imported name lands in (its longest known prefix), or None."""
    parts = target.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return None


def import_graph(root: Path = ROOT, packages=PACKAGES) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> the modules of ``packages`` it imports, module -> every dotted name it imports)."""
    known = modules_under(root, packages)
    names = {mod: imported(path, mod, is_package, known) for mod, (path, is_package) in known.items()}
    graph = {mod: {r for r in (resolve(t, known) for t in targets) if r is not None and r != mod}
             for mod, targets in names.items()}
    return graph, names


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None (depth first, in name order)."""
    state = dict.fromkeys(graph, 0)  # 0: not seen, 1: on the current path, 2: done
    for start in sorted(graph):
        if state[start]:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            for child in stack[-1]:
                if child not in state or state[child] == 2:
                    continue
                if state[child] == 1:
                    return path[path.index(child):] + [child]
                state[child] = 1
                path.append(child)
                stack.append(iter(sorted(graph[child])))
                break
            else:
                state[path.pop()] = 2
                stack.pop()
    return None


def inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_the_graph_reads_every_kind_of_import(tmp_path):
    """Relative, function-level and TYPE_CHECKING-only imports are all edges; a cycle is reported."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "def f():\n    from . import b\n    return b\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.c import C\n",
        "sub/__init__.py": "",
        "sub/c.py": "import os\nfrom ..a import f\n",
        "d.py": "from . import sub\nfrom .sub import c as _c\nimport pkg.sub.c\n",
    }
    for rel, text in files.items():
        (pkg / rel).write_text(text)
    edges, names = import_graph(tmp_path, ("pkg",))
    assert edges["pkg.a"] == {"pkg.b"} and edges["pkg.b"] == {"pkg.sub.c"}
    assert edges["pkg.sub.c"] == {"pkg.a"} and "os" in names["pkg.sub.c"]
    assert edges["pkg.d"] == {"pkg.sub", "pkg.sub.c"} and edges["pkg"] == set()
    assert find_cycle(edges) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]
    (pkg / "a.py").write_text("")
    assert find_cycle(import_graph(tmp_path, ("pkg",))[0]) is None


def test_the_graph_covers_the_grader(graph):
    edges, _ = graph
    for module in ("grader.api", "grader.autograde", "grader.sandbox.judge", "grader.probes",
                   "grader.probes.shared", "grader.probes.ch10_flash_attention", "coursekit.measure"):
        assert module in edges, module
    assert "grader.sandbox.judge" in edges["grader.autograde"]
    assert "grader.probes.shared" in edges["grader.probes.ch09_mixed_precision"]
    assert "grader.sandbox.rpc" in edges["grader.sandbox.supervisor"]


def test_no_import_cycle_in_the_grader(graph):
    edges, _ = graph
    grader = {m: {t for t in targets if inside(t, "grader")} for m, targets in edges.items() if inside(m, "grader")}
    cycle = find_cycle(grader)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_sandbox_imports_nothing_of_the_grader_outside_it(graph):
    _, names = graph
    found = [f"{m} imports {t}" for m, targets in sorted(names.items()) if inside(m, "grader.sandbox")
             for t in sorted(targets) if inside(t, "grader") and not inside(t, "grader.sandbox")]
    assert not found, "grader.sandbox must receive these from its callers:\n" + "\n".join(found)


def test_what_students_install_imports_nothing_of_the_grader_solutions_or_tests(graph):
    _, names = graph
    found = [f"{m} imports {t}" for m, targets in sorted(names.items())
             if inside(m, "coursekit") or inside(m, "kernels")
             for t in sorted(targets) if t.split(".")[0] in ("grader", "solutions", "tests")]
    assert not found, "\n".join(found)


def test_the_probes_import_no_hidden_tests_or_solutions(graph):
    _, names = graph
    found = [f"{m} imports {t}" for m, targets in sorted(names.items()) if inside(m, "grader.probes")
             for t in sorted(targets) if inside(t, "grader.hidden") or inside(t, "solutions")]
    assert not found, "the student's process can read the probes:\n" + "\n".join(found)
