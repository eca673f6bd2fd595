"""Run an exercise the way the grader will, from its visible test cell.

The autograder runs a chapter's setup cells (``tags=["setup"]``) and then the student's exercise
cells, in order, in a fresh namespace: nothing else of the notebook. A visible test cell runs in
the student's own kernel, where every cell ran, so an exercise that reads a name imported only in
an experiment cell passes it and then fails grading with a NameError. Each visible test cell of a
chapter therefore starts with

    from coursekit.graded import check_as_graded; check_as_graded("ch04_partial_training", "pack_bits")

which first reads the exercise cell as typed against the grader's source policy (raising
RefusedByTheGrader with the feedback's own reason when the grader would not run it), then runs the
setup cells and the exercise cells up to ``pack_bits`` (as the kernel last ran
them) in a fresh namespace, and raises a NameError that names every global name those cells
read and the grader would not have, with the import line the student's kernel used. It is silent
when all is well, restores the random number generators it may have moved, and does nothing
outside IPython.

The static analysis (:func:`global_reads`, :func:`module_bindings`, :func:`defines`) is shared
with the course's own tests and tools.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import hashlib
import importlib
import io
import json
import random
import re
import symtable
import sys
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

from coursekit.source_policy import DEFAULT_POLICY, POLICY_KEY, SourcePolicy, policy_from_dict, refusals_under

__all__ = ["check_as_graded", "RefusedByTheGrader", "defines", "global_reads", "module_bindings", "BUILTINS"]

CHAPTER_RE = re.compile(r"^ch\d\d_[a-z0-9_]+$")
# What the grader's namespace holds beside the builtins (an inert get_ipython, and display).
PROVIDED = frozenset({"get_ipython", "display"})
BUILTINS = frozenset(dir(builtins)) | PROVIDED
# The course's own packages hold answers: an exercise cell may not import them.
COURSE_PACKAGES = ("coursekit", "kernels")


# --- static analysis ---------------------------------------------------------------------------

def defines(source: str, name: str) -> bool:
    """Whether ``source`` defines ``name`` at top level (function, class or assignment)."""
    return name in top_level_names(source)


def top_level_names(source: str) -> frozenset:
    """The names ``source`` defines at top level (functions, classes, assignments); parsed once."""
    defs, assigned = _top_level(source) if len(source) <= _CACHED_CHARS else _scan(source)
    return defs | assigned


_CACHED_CHARS = 64 * 1024  # longer sources are parsed each time, never kept in the cache


@functools.lru_cache(maxsize=4096)
def _top_level(source: str) -> tuple[frozenset, frozenset]:
    """(names a top-level def/class defines, names a top-level assignment binds)."""
    return _scan(source)


def _scan(source: str) -> tuple[frozenset, frozenset]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return frozenset(), frozenset()
    defs, assigned = set(), set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs.add(node.name)
        elif isinstance(node, ast.Assign):
            assigned |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return frozenset(defs), frozenset(assigned)


@functools.lru_cache(maxsize=1024)
def _symtable(source: str) -> symtable.SymbolTable | None:
    try:
        return symtable.symtable(source, "<cell>", "exec")
    except (SyntaxError, ValueError):
        return None


def _tables(table: symtable.SymbolTable):
    yield table
    for child in table.get_children():
        yield from _tables(child)


@functools.lru_cache(maxsize=1024)
def global_reads(source: str) -> frozenset[str]:
    """Every name ``source`` reads from the module's globals (or the builtins), at any depth.

    Python's own scoping decides: a name read inside a function, class body, lambda or
    comprehension counts only when it is not bound there nor in an enclosing function (a
    ``global`` declaration makes it global). Names the cell binds itself are included when it
    also reads them; subtract :func:`module_bindings` (or look them up in the namespace the cell
    ran in) to get what it needs from elsewhere. A cell that does not parse reads nothing.
    """
    # The grader compiles cells under ``from __future__ import annotations``: annotations are
    # never evaluated there, so names used only in them are not needed.
    top = _symtable("from __future__ import annotations\n" + source) or _symtable(source)
    if top is None:
        return frozenset()
    names = set()
    for table in _tables(top):
        for sym in table.get_symbols():
            if sym.is_referenced() and (table is top or sym.is_global()) and not sym.get_name().startswith("."):
                names.add(sym.get_name())
    return frozenset(names)


def module_bindings(source: str) -> frozenset[str]:
    """Names ``source`` binds in the module's namespace: top-level definitions, imports and
    assignments (``del`` too), and names a function declares ``global`` and assigns. A star
    import binds the public names of its module when that module can be imported."""
    top = _symtable(source)
    if top is None:
        return frozenset()
    names = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    for table in _tables(top):
        if table is not top:
            names |= {s.get_name() for s in table.get_symbols() if s.is_declared_global() and s.is_assigned()}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names) and node.module:
            try:
                module = importlib.import_module(node.module)
            except Exception:  # noqa: BLE001 - an unknown module binds nothing we can name
                continue
            names |= set(getattr(module, "__all__", [n for n in dir(module) if not n.startswith("_")]))
    return frozenset(names)


@functools.lru_cache(maxsize=1024)
def _python(source: str) -> str:
    """A cell's source as the grader runs it: IPython's magics turned into Python."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # pragma: no cover - IPython comes with the kernel
        return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())
    try:
        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 - let compile() report what is wrong with the cell
        return source


# --- the chapter's notebook --------------------------------------------------------------------

@dataclass(frozen=True)
class Release:
    """What grading takes from a chapter's notebook: setup sources and exercise cells, in order."""

    path: Path
    setup: tuple[str, ...]
    exercises: tuple[str, ...]
    sources: tuple[str, ...]  # each exercise cell's source in that file
    policy: SourcePolicy = DEFAULT_POLICY  # the chapter's source policy, as the release wrote it


def find_notebook(chapter: str) -> Path | None:
    """``<chapter>.ipynb`` in the working directory, else ``course/<chapter>.ipynb`` of the
    repository that holds this package (the first folder above it with one); None if neither."""
    here = Path.cwd() / f"{chapter}.ipynb"
    if here.is_file():
        return here
    for root in Path(__file__).resolve().parents[1:]:
        path = root / "course" / f"{chapter}.ipynb"
        if path.is_file():
            return path
    return None


def read_release(path: Path) -> Release:
    stat = path.stat()
    return _read_release(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=32)
def _read_release(path: Path, mtime_ns: int, size: int) -> Release:
    nb = json.loads(path.read_text(encoding="utf-8"))
    setup, exercises, sources = [], [], []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata", {})
        grading = meta.get("nbgrader", {})
        source = "".join(cell.get("source", ""))
        # The same roles as the grader's layout(): an answer cell, a graded cell, a setup cell.
        if grading.get("solution"):
            exercises.append(str(grading.get("grade_id")))
            sources.append(source)
        elif grading.get("grade"):
            continue
        elif "setup" in meta.get("tags", []):
            setup.append(source)
    policy = policy_from_dict(nb.get("metadata", {}).get(POLICY_KEY))
    return Release(path, tuple(setup), tuple(exercises), tuple(sources), policy)


# --- running the program the grader runs -------------------------------------------------------

class InertShell:
    """What ``get_ipython()`` returns where cells run outside a kernel (here, and in the grader's
    worker, which uses this class): hooks, transformers, handlers and magics do nothing.

    ``%time``/``%timeit`` lines and ``%%time``/``%%timeit``/``%%capture`` cells still run
    their statement once, as they would in a notebook (without the timing).
    """

    def __init__(self, run_body):
        object.__setattr__(self, "_run_body", run_body)

    def __getattr__(self, name):
        return self

    def __setattr__(self, name, value):
        pass

    def __call__(self, *args, **kwargs):
        return None

    def __getitem__(self, key):
        return self

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    def run_cell_magic(self, name, line="", cell=""):
        if name in ("time", "capture", "timeit") and isinstance(cell, str):
            self._run_body(cell)
        return None

    def run_line_magic(self, name, line="", *args, **kwargs):
        if name in ("time", "timeit") and isinstance(line, str):
            self._run_body(line)
        return None


def _run(source: str, namespace: dict, label: str) -> None:
    exec(compile(_python(source), label, "exec"), namespace)  # noqa: S102 - the student's own cells


def _with_shell(namespace: dict) -> dict:
    shell = InertShell(lambda body: _run(body, namespace, "<magic>"))
    namespace["get_ipython"] = lambda: shell
    namespace["display"] = lambda *objs, **kwargs: None
    return namespace


def _fresh_namespace() -> dict:
    return _with_shell({"__name__": "__main__", "__doc__": None, "__package__": None,
                        "__loader__": None, "__spec__": None, "__builtins__": builtins})


_SETUP_CACHE: dict[str, dict] = {}  # hash of the setup sources -> the namespace they left


def _setup_namespace(setup: tuple[str, ...], cached: bool = True) -> dict:
    """A copy of the namespace the setup cells leave (run once per kernel and setup)."""
    key = hashlib.sha256("\0".join(setup).encode()).hexdigest()
    base = _SETUP_CACHE.get(key) if cached else None
    if base is None:
        base = _fresh_namespace()
        for i, source in enumerate(setup):
            try:
                _run(source, base, f"<setup cell {i}>")
            except (Exception, SystemExit):  # noqa: BLE001 - the grader records it and goes on, and so do we
                pass
        if cached:
            if len(_SETUP_CACHE) >= 8:
                _SETUP_CACHE.clear()
            _SETUP_CACHE[key] = base
    return _with_shell(dict(base))


def _rng_state() -> list:
    state = [("random", random.getstate())]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state.append(("numpy", numpy.random.get_state()))
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "random"):
        state.append(("torch", (torch.random.get_rng_state(), torch.is_grad_enabled(),
                                torch.get_default_dtype())))
        # Only a CUDA that is already running: asking for its state would start it.
        if torch.cuda.is_initialized():
            state.append(("cuda", torch.cuda.get_rng_state_all()))
    return state


def _restore(state: list) -> None:
    for kind, value in state:
        if kind == "random":
            random.setstate(value)
        elif kind == "numpy":
            sys.modules["numpy"].random.set_state(value)
        elif kind == "torch":
            torch = sys.modules["torch"]
            torch.random.set_rng_state(value[0])
            torch.set_grad_enabled(value[1])
            torch.set_default_dtype(value[2])
        elif kind == "cuda":
            sys.modules["torch"].cuda.set_rng_state_all(value)


@contextlib.contextmanager
def _quiet_and_restored():
    """Nothing printed, no warning shown, and the global RNGs (and torch's grad mode and default
    dtype) as they were: the student's next cells see the kernel this check found."""
    state = _rng_state()
    sink = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            yield
    finally:
        _restore(state)


def graded_namespace(setup: tuple[str, ...], cells: dict[str, str], cached: bool = True
                     ) -> tuple[dict, dict[str, BaseException]]:
    """Run the setup sources, then ``cells`` (exercise -> source, in order), in a fresh namespace,
    as the grader does; returns the namespace and each cell's exception (a cell that raises does
    not stop the next ones)."""
    errors: dict[str, BaseException] = {}
    with _quiet_and_restored():
        namespace = _setup_namespace(setup, cached)
        for exercise, source in cells.items():
            try:
                _run(source, namespace, f"<exercise cell {exercise}>")
            except (Exception, SystemExit) as e:  # noqa: BLE001 - reported to the student below
                errors[exercise] = e
    return namespace, errors


# --- what the student reads --------------------------------------------------------------------

@dataclass
class Problem:
    exercise: str
    missing: list[str]  # names the cell reads that the grader will not have
    error: BaseException | None = None  # what the cell raised when run the grader's way


def find_problems(exercises: tuple[str, ...], exercise: str, cells: dict[str, str], namespace: dict,
                  errors: dict[str, BaseException]) -> list[Problem]:
    """The problems of ``exercise``'s cell and of the earlier exercise cells it reads (directly or
    through one another): names absent from the graded namespace, and exceptions."""
    index = exercises.index(exercise)
    later = set(exercises[index + 1:])  # the grader runs them too, after this one
    needed, todo = set(), [exercise]
    while todo:
        ex = todo.pop()
        if ex in needed or ex not in cells:
            continue
        needed.add(ex)
        todo += [n for n in global_reads(_python(cells[ex])) if n in cells]
    problems = []
    for ex in cells:
        if ex not in needed:
            continue
        error = errors.get(ex)
        reads = set(global_reads(_python(cells[ex])))
        if isinstance(error, NameError) and getattr(error, "name", None):
            reads.add(error.name)
            error = None  # the missing name says it
        broken = {e for e in needed if e in errors}  # their own problem explains their absence
        missing = sorted(n for n in reads if n not in namespace and n not in BUILTINS
                         and n not in later and n not in broken)
        if missing or error is not None:
            problems.append(Problem(ex, missing, error))
    return problems


def suggest(name: str, history: list[str], user_ns: dict) -> str | None:
    """The import line that bound ``name`` in the student's kernel, or None when it was not imported."""
    for source in reversed(history):
        line = _import_line(source, name)
        if line:
            return line
    value = user_ns.get(name)
    if isinstance(value, types.ModuleType):
        module = value.__name__
        return f"import {module}" if module == name else f"import {module} as {name}"
    module = getattr(value, "__module__", None)
    if isinstance(module, str) and module != "__main__" and getattr(sys.modules.get(module), name, None) is value:
        return f"from {module} import {name}"
    return None


@functools.lru_cache(maxsize=4096)
def _imports(source: str) -> tuple[tuple[str, str], ...]:
    """(bound name, the import line that binds it) for every import of ``source``, in order."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(((alias.asname or alias.name).split(".")[0], ast.unparse(ast.Import(names=[alias]))))
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                line = ast.unparse(ast.ImportFrom(module=node.module, names=[alias], level=node.level))
                found.append((alias.asname or alias.name, line))
    return tuple(found)


def _import_line(source: str, name: str) -> str | None:
    lines = [line for bound, line in _imports(source) if bound == name]
    return lines[-1] if lines else None


def _names(names: list[str]) -> str:
    ticked = [f"`{n}`" for n in names]
    return ticked[0] if len(ticked) == 1 else ", ".join(ticked[:-1]) + " and " + ticked[-1]


def message(problems: list[Problem], history: list[str], user_ns: dict) -> str:
    """What the student reads: each missing name, where their kernel got it, and what to do."""
    parts = []
    uses = [f"`{p.exercise}` uses {_names(p.missing)}" for p in problems if p.missing]
    if uses:
        missing = sorted({n for p in problems for n in p.missing})
        lines = {n: suggest(n, history, user_ns) for n in missing}
        course = {n: line for n, line in lines.items() if line and _module(line) in COURSE_PACKAGES}
        imports = [f"`{line}`" for line in dict.fromkeys(line for n, line in lines.items() if line and n not in course)]
        cell = "exercise cell" if len(uses) == 1 else "exercise cells"
        parts.append(f"{'; '.join(uses)}, which the grader will not have: grading runs only the setup cells "
                     "and the exercise cells.")
        others = [n for n in missing if n not in course]
        if others:
            parts.append(f"Import {'it' if len(others) == 1 else 'them'} inside the {cell}"
                         + (f" ({', '.join(imports)})" if imports else "") + " or use what the setup cells provide.")
        for name, line in course.items():
            parts.append(f"`{name}` comes from `{line}`, which an exercise cell may not import (the course's "
                         f"own {' and '.join(COURSE_PACKAGES)} hold answers): use what the setup cells provide.")
        elsewhere = [n for n, line in lines.items() if line is None and n in user_ns]
        if elsewhere:
            parts.append(f"{_names(elsewhere)} {'is' if len(elsewhere) == 1 else 'are'} defined in another cell "
                         f"of yours: define {'it' if len(elsewhere) == 1 else 'them'} inside the {cell} instead.")
        nowhere = [n for n, line in lines.items() if line is None and n not in user_ns]
        if nowhere:
            parts.append(f"{_names(nowhere)} {'is' if len(nowhere) == 1 else 'are'} not defined in this kernel "
                         "either.")
    for p in problems:
        if p.error is not None:
            text = str(p.error).strip().splitlines()
            parts.append(f"`{p.exercise}`'s cell raises {type(p.error).__name__}"
                         + (f" ({text[0][:300]})" if text else "")
                         + " when it runs the way the grader runs it: the setup cells, then the exercise "
                           "cells, in a fresh namespace.")
    return " ".join(parts)


def _module(import_line: str) -> str:
    """The top-level package an import line reads from."""
    return import_line.split()[1].split(".")[0]


def latest_definition(history: list[str], name: str) -> str | None:
    """The most recently executed cell that defines ``name`` at top level: a def or class first
    (an exercise cell), else an assignment."""
    for kind in (0, 1):
        for source in reversed(history):
            if isinstance(source, str) and name in _top_level(source)[kind]:
                return source
    return None


class RefusedByTheGrader(Exception):
    """An exercise cell that the grader's source policy refuses: it would not run, and every test cell of
    its exercise would score 0 (the message is the one the feedback would show)."""


def refusal(chapter: str, exercise: str, history: list[str], notebook: Path | None = None) -> str | None:
    """The grader's reason for refusing ``exercise``'s cell as the kernel last ran it (``history``: the
    cells as typed), or None: the cell may run, was not run yet, or there is no policy to ask."""
    path = notebook or find_notebook(chapter)
    source = _typed_definition(history, exercise)
    if path is None or source is None:
        return None
    try:
        release = read_release(path)
    except (OSError, ValueError):  # the checks after this one say so
        return None
    if exercise not in release.exercises:
        return None
    return refusals_under(release.policy, release.setup, {exercise: source}).get(exercise)


def _typed_definition(history: list[str], name: str) -> str | None:
    """:func:`latest_definition` among cells as typed, where a cell that is not Python (a magic, a shell
    line) defines ``name`` when one of its lines starts its def or class."""
    pattern = re.compile(rf"^(?:async[ \t]+)?(?:def|class)[ \t]+{re.escape(name)}\b", re.M)
    for source in reversed(history):
        if not isinstance(source, str):
            continue
        if name in top_level_names(source) or (not _parses(source) and pattern.search(source)):
            return source
    return None


@functools.lru_cache(maxsize=1024)
def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def check(chapter: str, exercise: str, history: list[str], user_ns: dict, notebook: Path | None = None,
          policy: bool = True) -> str | None:
    """What :func:`check_as_graded` reports, with the kernel's history and namespace given: the
    grader's reason for refusing the cell (``policy``), else the message of its NameError, or None
    when all is well or the check had to be skipped (a note says why)."""
    if not CHAPTER_RE.match(chapter):
        raise ValueError(f"chapter must look like ch04_partial_training, got {chapter!r}")
    refused = refusal(chapter, exercise, history, notebook) if policy else None
    if refused:
        return refused
    path = notebook or find_notebook(chapter)
    skipped = f"Note: `{exercise}` was not run the way the grader runs it (the setup cells, then the exercise cells)"
    if path is None:
        print(f"{skipped}: neither {chapter}.ipynb in the working directory ({Path.cwd()}) nor the course's "
              f"course/{chapter}.ipynb was found. The visible tests still run.")
        return None
    try:
        release = read_release(path)
    except (OSError, ValueError) as e:
        print(f"{skipped}: {path} could not be read ({type(e).__name__}). The visible tests still run.")
        return None
    if exercise not in release.exercises:
        print(f"{skipped}: {path} has no exercise cell `{exercise}`. The visible tests still run.")
        return None
    upto = release.exercises[: release.exercises.index(exercise) + 1]
    cells = {}
    for ex, saved in zip(upto, release.sources):
        source = latest_definition(history, ex)
        if source is None:
            if ex == exercise:
                return None  # not run in this kernel: the test below says so itself
            source = saved  # the grader would take the cell as saved
        cells[ex] = source
    namespace, errors = graded_namespace(release.setup, cells)
    problems = find_problems(release.exercises, exercise, cells, namespace, errors)
    if problems and errors:
        # Setup functions of the cached namespace see the cached globals: confirm on a fresh run.
        namespace, errors = graded_namespace(release.setup, cells, cached=False)
        problems = find_problems(release.exercises, exercise, cells, namespace, errors)
    return message(problems, history, user_ns) if problems else None


def check_as_graded(chapter: str, exercise: str) -> None:
    """Run ``exercise`` the way the grader will: the setup cells of ``chapter``, then its exercise
    cells up to this one as this kernel last ran them, in a fresh namespace.

    Raises RefusedByTheGrader, with the reason the feedback would give, when the grader's source
    policy would not run the exercise cell as typed (then all of its test cells score 0); NameError
    naming each name those cells read that the grader would not have (with the import line this
    kernel used); or the exception a cell raises when run that way. Silent when all is well; does
    nothing outside IPython.
    """
    __tracebackhide__ = True  # noqa: F841 - IPython leaves this frame out of the traceback
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return
    manager = getattr(shell, "history_manager", None)
    history = getattr(manager, "input_hist_parsed", None)
    if history is None:
        history = shell.user_ns.get("In", [])
    if not CHAPTER_RE.match(chapter):
        raise ValueError(f"chapter must look like ch04_partial_training, got {chapter!r}")
    typed = getattr(manager, "input_hist_raw", None) or history  # the cells as saved, magics included
    refused = refusal(chapter, exercise, list(typed))
    if refused:
        raise RefusedByTheGrader(refused)
    problem = check(chapter, exercise, list(history), shell.user_ns, policy=False)
    if problem:
        raise NameError(problem)
