"""A static policy on exercise-cell source, checked in the judge before anything runs, and in each visible test.

The rules live here, in what students install, so that a visible test cell reads the exercise cell against
the very rules the grader applies (``coursekit.graded.check_as_graded``, with the chapter's policy that the
release writes into the notebook's metadata); the grader side (each chapter's ``SOURCE_POLICY`` in
``grader/hidden/<chapter>.py``, the refusals of a submission) is ``grader/source_policy.py``.

The sandbox (``grader/sandbox``) keeps a submission from harming anything outside its worker,
but inside the worker the student's code shares a process with the trusted probes that measure
it, and in Python everything in a process can reach everything else. So what an exercise cell
may *say* is limited too, by reading its syntax tree (nothing of it runs here):

* **Imports**: only the modules a chapter's exercises may use (``DEFAULT_MODULES`` plus the
  chapter's ``SourcePolicy.modules``; a module allows its public submodules), never private
  modules (``torch._C``, ``torch.utils._python_dispatch``), never the machinery in ``DENIED``
  (``torch.jit``, ``torch.overrides``, ``numpy.ctypeslib``, ``triton.runtime`` ...), never the
  course packages (``kernels``, ``coursekit``): what a chapter provides, its setup cells import.
* **Every use of a module is a static dotted name.** A name bound to a module (``torch``, ``F``,
  ``np``, whether the setup cells or the cell bound it) may only be followed by an attribute:
  it cannot be passed, stored, returned or aliased. So every module attribute the code reaches
  is spelled out in the source and resolved here against the real module (``torch.sys`` is the
  module ``sys``; ``torch.utils.flop_counter.TorchDispatchMode`` is the private dispatch class;
  ``numpy.load`` and ``torch.load``, which unpickle, are refused however they are reached).
* **No dynamic attribute names.** ``getattr``/``hasattr``/``setattr``/``delattr`` only with a
  literal name (checked like ``obj.name``); ``eval``, ``exec``, ``compile``, ``__import__``,
  ``globals``, ``locals``, ``vars``, ``open``, ``breakpoint``, three-argument ``type`` and
  metaclasses are refused. Every attribute the code touches is therefore in the source, and
  attribute *names* can be refused on any object: frame, traceback, generator and code
  internals (``f_back``, ``tb_frame``, ``gi_frame``), raw memory and storage (``data_ptr``,
  ``untyped_storage``, ``ctypes``, ``from_file``, ``frombuffer``, ``as_strided``), hooks that
  hide work from the probes (``saved_tensors_hooks``, the global ``register_module_*_hook``),
  helpers that evaluate strings or set attributes named by strings (``typing.get_type_hints``,
  ``functools.update_wrapper``), a Triton kernel's namespace and source, and dunders beyond
  ``DUNDERS`` (``__class__``, ``__dict__``, ``__globals__``, ``__subclasses__``,
  ``__array_interface__`` ...), whether read, written, defined in a class body or written as a
  string key (``scope["__builtins__"]``). Library attributes cannot be assigned or deleted.
* **Private attributes** (``_x``) are refused on module chains (``torch._C``; a private base
  class such as ``nn.modules.batchnorm._BatchNorm`` excepted) and on any object unless the cell
  itself sets that name somewhere (``self._scale = ...``, ``ctx._shape = ...``) and it does not
  name torch's hook tables, raw pointers or a kernel's source.
* **No code the garbage collector would run.** The grader collects garbage before each reading, so code run
  at a collection could tell a measured call from the others, or run while the grader times its own work. ``__del__``
  is a refused dunder, ``weakref`` and ``gc`` refused modules; a generator may not hold ``try`` or ``with`` (closing a
  suspended generator runs them), ``async def`` is refused, as are the weak references of hook handles
  (``hooks_dict_ref``) and ``torch.utils.data.datapipes``, whose finalizers call methods a subclass can replace.
* **A chapter's shortcuts** (``SourcePolicy.shortcuts``): what its text forbids, refused in
  every spelling (an import, a dotted name, an alias the module itself re-exports, an attribute
  name on any object): ``torch.utils.checkpoint`` in chapter 2, the course's own kernels, and
  so on.

A breach scores 0 on every graded test cell of that exercise (``Layout.tests_of``), with a
message naming the construct, its line and what to use instead; the cell is left out of the
program. The rules are stated for students in README.md and STYLE.md.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
import types
from dataclasses import dataclass
from functools import lru_cache

# Modules (with their public submodules) every chapter's exercises may import.
DEFAULT_MODULES = ("torch", "math", "numpy", "typing", "dataclasses", "itertools", "functools", "collections",
                   "statistics", "copy", "contextlib", "warnings", "heapq", "bisect", "numbers", "abc",
                   "operator", "re", "string", "random", "fractions", "decimal")
# Not offered, on purpose: enum (its functional API defines a class's attributes, dunders included, from strings).
# Submodules refused although their package is allowed: what they offer is an escape, not an answer.
DENIED = {
    "torch.utils": "torch.utils holds tools, not exercise material (torch.utils.data and hooks stay allowed)",
    "torch.jit": "it compiles code behind the grader's back",
    "torch.fx": "it generates and runs code",
    "torch.compiler": "it compiles code behind the grader's back",
    "torch.export": "it compiles code behind the grader's back",
    "torch.package": "it loads and runs code",
    "torch.hub": "it downloads and runs code",
    "torch.library": "it replaces torch's own operators",
    "torch.overrides": "it intercepts torch functions",
    "torch.multiprocessing": "it starts processes",
    "torch.distributed": "it starts processes and opens sockets",
    "torch.onnx": "it exports models, not exercise material",
    "torch.ops": "it reaches raw operator overloads",
    "torch.classes": "it reaches raw operator overloads",
    "torch.serialization": "it unpickles data, which runs code",
    "torch.storage": "it exposes raw storage",
    "torch.profiler": "it hooks into the dispatcher",
    "torch.utils.data.datapipes": "its finalizers call methods a subclass can replace, code the garbage collector "
                                  "would run during the grader's own work",
    "torch.autograd.profiler": "it hooks into the dispatcher",
    "torch.monitor": "it is not exercise material",
    "numpy.ctypeslib": "it reads and writes raw process memory",
    "numpy.lib.stride_tricks": "as_strided reads and writes outside an array",
    "numpy.lib.format": "it opens files and unpickles",
    "numpy.lib.npyio": "it opens files and unpickles",
    "numpy.f2py": "it compiles native code",
    "numpy.distutils": "it compiles native code",
    "numpy.testing": "it runs processes",
    "triton.runtime": "it builds and loads native code",
    "triton.compiler": "it builds and loads native code",
    "triton.backends": "it builds and loads native code",
    "triton.tools": "it builds and loads native code",
    "triton.testing": "it runs processes",
    "triton.knobs": "it changes how Triton compiles",
    "triton.profiler": "it hooks into the runtime",
    "triton.experimental": "it is not exercise material",
}
# Modules whose members are refused wherever a public module re-exports them
# (torch.utils.flop_counter.TorchDispatchMode, torch.load, numpy.load).
ORIGINS_REFUSED = {
    **dict.fromkeys(("torch.utils._python_dispatch", "torch._dynamo", "torch._ops", "torch._library",
                     "torch._subclasses", "torch._higher_order_ops", "torch._prims", "torch._C._functorch",
                     "torch._C._dispatch", "torch.overrides", "torch.fx", "torch.jit", "torch.library"),
                    "it switches off or goes around the grader's operator tracing"),
    "torch.utils.data.datapipes": "its finalizers call methods a subclass can replace, code the garbage collector "
                                  "would run during the grader's own work",
    **dict.fromkeys(("torch.serialization", "numpy.lib.npyio", "numpy.lib._npyio_impl", "numpy.lib.format",
                     "numpy.lib._format_impl"), "it reads or writes files or pickles, which can run code"),
    **dict.fromkeys(("numpy.lib.stride_tricks", "numpy.lib._stride_tricks_impl", "numpy.ctypeslib",
                     "torch.utils.dlpack"), "it reads or writes raw memory"),
}
# Members refused by name and by identity (numpy.load says its module is "numpy").
MEMBERS_REFUSED = {
    **dict.fromkeys(("torch.load", "torch.save", "numpy.load", "numpy.save", "numpy.fromfile", "numpy.memmap",
                     "numpy.fromregex"), "it reads or writes files or pickles, which can run code"),
    **dict.fromkeys(("numpy.from_dlpack", "torch.from_dlpack", "torch.frombuffer", "numpy.frombuffer"),
                    "it reads or writes raw memory"),
    **dict.fromkeys(("operator.attrgetter", "operator.methodcaller", "string.Formatter"),
                    "it reads attributes by a run-time name, as getattr with a computed name does"),
}
# Members whose name is refused as an attribute elsewhere, allowed where they are (a regular expression compiles
# no code: ``re.compile``).
MEMBERS_ALLOWED = frozenset({"re.compile"})
ALLOWED_INSIDE_DENIED = ("torch.utils.data", "torch.utils.hooks", "torch.utils.checkpoint")
COURSE_PACKAGES = ("kernels", "coursekit", "grader", "solutions", "tests")

# Dunders an exercise may read, call or define; every other one is refused.
DUNDERS = frozenset({"__init__", "__call__", "__name__", "__qualname__", "__doc__", "__repr__", "__str__",
                     "__len__", "__iter__", "__next__", "__getitem__", "__setitem__", "__contains__",
                     "__enter__", "__exit__", "__post_init__", "__slots__", "__version__", "__debug__"})
# Builtins refused outright, and those allowed only as a direct call in a checkable form.
BUILTINS_REFUSED = {
    "eval": "it runs code built at run time", "exec": "it runs code built at run time",
    "compile": "it compiles code built at run time", "__import__": "it imports modules by run-time name",
    "globals": "it exposes the namespace by run-time name", "locals": "it exposes frames",
    "vars": "it exposes namespaces by run-time name", "open": "exercises read and write no files",
    "breakpoint": "it starts a debugger", "input": "exercises read no input", "help": "it starts a pager",
    "get_ipython": "it reaches the notebook's shell, whose magics run code from strings",
}
ATTRIBUTE_BUILTINS = ("getattr", "hasattr", "setattr", "delattr")
MAX_SOURCE_CHARS = 256 * 1024  # an exercise cell is one function or class: larger cells are refused unread


def _internals() -> dict[str, str]:
    """Attribute names of frames, tracebacks, generators, coroutines and code objects."""
    def gen():
        yield 1

    async def coro():
        pass

    async def agen():
        yield 1

    try:
        raise ValueError
    except ValueError as e:
        tb = e.__traceback__
    c = coro()
    c.close()
    objects = {"f_": sys._getframe(), "tb_": tb, "gi_": gen(), "cr_": c, "ag_": agen(), "co_": gen.__code__}
    names = {name: "it reaches interpreter internals (frames, tracebacks, code objects)"
             for prefix, obj in objects.items() for name in dir(obj) if name.startswith(prefix)}
    return names


ATTRIBUTES_REFUSED = {
    **_internals(),
    **dict.fromkeys(("data_ptr", "untyped_storage", "storage", "from_file", "from_buffer", "frombuffer",
                     "from_dlpack", "ctypes", "ctypeslib", "as_strided", "as_strided_", "set_", "share_memory_", "fromfile",
                     "tofile", "memmap", "UntypedStorage", "TypedStorage"),
                    "it reads or writes raw memory or files; work with tensor operations"),
    **dict.fromkeys(("savez", "savez_compressed", "savetxt", "loadtxt", "genfromtxt", "dump", "dumps"),
                    "it reads or writes files or pickles, which can run code"),
    "compile": "it compiles code behind the grader's back",
    **dict.fromkeys(("get_type_hints", "ForwardRef", "singledispatch", "singledispatchmethod"),
                    "it evaluates strings as code"),
    **dict.fromkeys(("update_wrapper", "make_dataclass", "DataSource"),
                    "it reads or sets attributes named by run-time strings"),
    **dict.fromkeys(("get_capture_scope", "used_global_vals", "src", "parse", "rewrite", "rewritten_fn",
                     "_unsafe_update_src", "_set_src", "_get_src", "_do_compile"),
                    "it reaches a kernel's namespace or replaces its source"),
    **dict.fromkeys(("hooks_dict_ref", "extra_dict_ref"),
                    "it is a weak reference: it tells when the garbage collector ran, which the grader does before "
                    "it measures"),
    **dict.fromkeys(("saved_tensors_hooks", "save_on_cpu", "disable_saved_tensors_hooks"),
                    "it hides what autograd saves from the grader's measurements; save with ctx.save_for_backward"),
    **dict.fromkeys(("sys", "os", "gc", "inspect", "importlib", "builtins", "pickle", "marshal", "types",
                     "subprocess", "multiprocessing", "socket", "ctypes", "threading", "shutil", "pathlib",
                     "weakref", "posix", "runpy", "_posixsubprocess"),
                    "it reaches a module that exercises may not use"),
}
FINALIZER_WHY = ("the garbage collector would run it when it finalizes the object, so it could run during the "
                 "grader's own work (which collects garbage before it measures)")


def _own_nodes(fn) -> list[ast.AST]:
    """The nodes of a function's body, nested functions, lambdas and classes left out (their yields are theirs)."""
    found, todo = [], list(ast.iter_child_nodes(fn))
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        found.append(n)
        todo.extend(ast.iter_child_nodes(n))
    return found


ATTRIBUTE_PATTERNS = (
    (re.compile(r"^register_module_\w*hook$"), "it installs a hook on every module, the grader's own included"),
    (re.compile(r"Storage$"), "it exposes raw storage"),
    (re.compile(r"^_\w*(hook|cdata|storage|dispatch)", re.I), "it reaches torch's private hook tables or raw memory"),
)


@dataclass(frozen=True)
class Shortcut:
    """Something a chapter's text forbids, refused in every exercise cell of the chapter.

    ``paths``: dotted names of modules or members (a module refuses everything inside it),
    matched by name and, for members, by identity (so a re-export is refused too).
    ``pattern``: a regular expression refused in attribute names, imported names and string
    arguments of calls (for a dtype, say, whatever object it is reached from).
    """

    paths: tuple[str, ...] = ()
    pattern: str = ""
    instead: str = ""  # what to do instead, shown to the student


@dataclass(frozen=True)
class SourcePolicy:
    """What one chapter's exercise cells may use, declared as ``SOURCE_POLICY`` in its hidden module."""

    modules: tuple[str, ...] = ()  # importable on top of DEFAULT_MODULES (public submodules included)
    refused: tuple[str, ...] = ()  # default modules (or submodules) this chapter refuses
    shortcuts: tuple[Shortcut, ...] = ()


DEFAULT_POLICY = SourcePolicy()


@dataclass(frozen=True)
class Breach:
    construct: str  # what the cell used, as written or resolved ("torch.utils.checkpoint")
    line: int
    why: str
    instead: str = ""
    not_python: bool = False  # the line is not Python at all (a magic, a syntax error)

    def describe(self) -> str:
        instead = f" Instead: {self.instead}." if self.instead else ""
        if self.not_python:
            return f"line {self.line} is {self.construct}, which is not Python ({self.why}).{instead}"
        return f"line {self.line} uses {self.construct}, which exercise cells may not use ({self.why}).{instead}"


def refusal(exercise: str, breaches: list[Breach]) -> str:
    """The reason shown for every test cell of a refused exercise."""
    more = f" Also: {' '.join(b.describe() for b in breaches[1:3])}" if len(breaches) > 1 else ""
    return (f"the grader did not run your {exercise} cell, so its test cells score 0: {breaches[0].describe()}"
            f"{more} Exercise cells import only the modules the chapter uses, spell every module attribute "
            f"out (no aliases of modules, no getattr/setattr with a computed name) and reach no interpreter "
            f"internals, raw memory or private names of libraries (see \"Rules for exercise cells\" in the "
            f"course README).")


# --- module rules -------------------------------------------------------------------------------

def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


def _longest(path: str, prefixes) -> str:
    return max((p for p in prefixes if _under(path, p)), key=len, default="")


def _is_module_path(path: str) -> bool:
    """Whether ``path`` names a module, found without running it (its parent must be loaded)."""
    if path in sys.modules:
        return isinstance(sys.modules[path], types.ModuleType)
    parent = path.rpartition(".")[0]
    return not (parent and parent not in sys.modules) and _has_spec(path)


@lru_cache(maxsize=None)
def _has_spec(path: str) -> bool:
    try:
        return importlib.util.find_spec(path) is not None
    except (ImportError, ValueError, AttributeError):
        return False


class _Rules:
    """One chapter's policy, compiled."""

    def __init__(self, policy: SourcePolicy):
        self.allowed = set(DEFAULT_MODULES) | set(policy.modules)
        self.refused = set(policy.refused)
        self.shortcuts = policy.shortcuts
        self.patterns = [(re.compile(s.pattern), s) for s in policy.shortcuts if s.pattern]
        self._objects = None
        self._members = None

    def shortcut_for_path(self, path: str) -> Shortcut | None:
        return next((s for s in self.shortcuts if any(_under(path, p) for p in s.paths)), None)

    def shortcut_for_object(self, obj) -> tuple[str, Shortcut] | None:
        if self._objects is None:  # the shortcuts' members, resolved once (only allowed modules are imported)
            self._objects = []
            for s in self.shortcuts:
                for p in s.paths:
                    found = _resolve_static(p, self)
                    if found is not None and not isinstance(found, types.ModuleType):
                        self._objects.append((found, p, s))
        for found, p, s in self._objects:
            if obj is found:
                return p, s
        module = getattr(obj, "__module__", None)
        if isinstance(module, str):
            s = self.shortcut_for_path(module)
            if s is not None:
                return module, s
        return None

    def refused_member(self, path: str, obj) -> str | None:
        if path in MEMBERS_REFUSED:
            return MEMBERS_REFUSED[path]
        if self._members is None:
            self._members = [(m, why) for p, why in MEMBERS_REFUSED.items()
                             if (m := _resolve_static(p, self)) is not None]
        return next((why for m, why in self._members if obj is m), None) if obj is not None else None

    def shortcut_for_name(self, name: str) -> Shortcut | None:
        return next((s for rx, s in self.patterns if rx.search(name)), None)

    def module_verdict(self, path: str) -> tuple[str, str] | None:
        """(why, instead) when ``path`` may not be used, else None."""
        if any(part.startswith("_") for part in path.split(".")):
            return "it is a private module", "use the public API"
        s = self.shortcut_for_path(path)
        if s is not None:
            return "the chapter's text forbids it", s.instead
        if path.split(".")[0] in COURSE_PACKAGES:
            return ("the course's own implementations are not answers; what the chapter provides, its setup "
                    "cells import", "")
        refused = _longest(path, self.refused)
        allowed = _longest(path, self.allowed)
        denied = _longest(path, DENIED)
        inside = _longest(path, ALLOWED_INSIDE_DENIED)
        if refused and len(refused) >= len(allowed):
            return "this chapter's exercises do not use it", ""
        if denied and len(denied) > len(inside):
            return DENIED[denied], ""
        if not allowed:
            return ("it is not among the modules this chapter's exercises may import: "
                    + ", ".join(sorted(self.allowed)), "")
        return None


def _resolve_static(path: str, rules: _Rules):
    """The object a dotted path names, importing only allowed modules; None when unknown."""
    parts = path.split(".")
    obj = None
    for i in range(len(parts), 0, -1):
        head = ".".join(parts[:i])
        if head in sys.modules:
            obj = sys.modules[head]
            break
        if i == 1 and rules.module_verdict(head) is None:
            try:
                obj = importlib.import_module(head)
            except ImportError:
                return None
            break
    if obj is None:
        return None
    for part in parts[i:]:
        if isinstance(obj, types.ModuleType):
            child = vars(obj).get(part)
            if child is None:
                sub = f"{obj.__name__}.{part}"
                if _is_module_path(sub) and rules.module_verdict(sub) is None:
                    try:
                        child = importlib.import_module(sub)
                    except ImportError:
                        return None
            obj = child
        else:
            obj = vars(type(obj)).get(part) if not isinstance(obj, type) else vars(obj).get(part)
        if obj is None:
            return None
    return obj


# --- the checker --------------------------------------------------------------------------------

def _bound_names(tree: ast.AST) -> set[str]:
    """Every name the cell binds other than by ``def``: assignments and loop targets, parameters, imports,
    classes, ``except ... as``, match captures, global and nonlocal declarations."""
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            names.add(n.id)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.ClassDef):
            names.add(n.name)
        elif isinstance(n, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and n.name:
            names.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            names.add(n.rest)
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            names.update(n.names)
    return names


class _Checker(ast.NodeVisitor):
    def __init__(self, rules: _Rules, module_names: dict[str, str]):
        self.rules = rules
        self.modules = dict(module_names)  # name -> module path, for names bound to modules
        self.breaches: list[Breach] = []
        self.parents: dict[ast.AST, ast.AST] = {}
        self.own_private: set[str] = set()  # _names the cell itself sets on objects or defines in classes

    # bookkeeping
    def refuse(self, node, construct: str, why: str, instead: str = "") -> None:
        self.breaches.append(Breach(construct, getattr(node, "lineno", 0), why, instead))

    def run(self, tree: ast.AST) -> list[Breach]:
        # the cell's own generator functions, nested ones included: a name bound once in the whole cell, by its def
        defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        bound = _bound_names(tree)
        self.own_generators = {d.name for d in defs if d.name not in bound
                               and [x.name for x in defs].count(d.name) == 1
                               and any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in _own_nodes(d))}
        for node in ast.walk(tree):  # bindings first: a module imported anywhere is a module everywhere
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
                if isinstance(node, ast.ClassDef) and isinstance(
                        child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    self.own_private.add(child.name)
                elif isinstance(node, ast.ClassDef) and isinstance(child, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                    targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                    # every name bound, unpacking included: `_A, _B = 1, 2` sets both on the class
                    self.own_private.update(n.id for t in targets for n in ast.walk(t)
                                            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
            if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
                self.own_private.add(node.attr)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.modules[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        self.modules[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if alias.name != "*" and self._names_module(full):
                        self.modules[alias.asname or alias.name] = self._bound_module(node.module, alias.name)
        self.visit(tree)
        return self.breaches

    def _names_module(self, path: str) -> bool:
        return _names_module(path, self.rules.module_verdict(path.rpartition(".")[0]) is None)

    def _bound_module(self, module: str, name: str) -> str:
        """The module ``from module import name`` really binds: ``fractions.sys`` is ``sys``, which an allowed
        module re-exports (its path is under the allowed one, the module is not)."""
        obj = _resolve_static(module, self.rules)
        child = vars(obj).get(name) if isinstance(obj, types.ModuleType) else None
        return child.__name__ if isinstance(child, types.ModuleType) else f"{module}.{name}"

    # names and attributes
    def check_attribute_name(self, node, name: str, on_module: bool) -> None:
        if name.startswith("__") and name.endswith("__"):
            if name not in DUNDERS:
                self.refuse(node, name, "it reaches the interpreter's internals of an object")
            return
        why = ATTRIBUTES_REFUSED.get(name)
        if why is None:
            why = next((w for rx, w in ATTRIBUTE_PATTERNS if rx.search(name)), None)
        if why is not None:
            self.refuse(node, name, why)
            return
        s = self.rules.shortcut_for_name(name)
        if s is not None:
            self.refuse(node, name, "the chapter's text forbids it", s.instead)
            return
        if name.startswith("_") and (on_module or name not in self.own_private):
            self.refuse(node, name, "it is a private name of a library (your own objects may use the _names "
                        "your cell sets on them)", "use the public API")

    def check_chain(self, node, path: str, parts: list[str], value_use: bool = False, store: bool = False,
                    alias: str = "") -> None:
        """``path.parts...`` where ``path`` names a module: resolve it step by step."""
        if store:
            self.refuse(node, ".".join([path] + parts), "it changes a library for everything in the process, "
                        "the grader's measurements included", "keep your changes on your own objects")
            return
        verdict = self.rules.module_verdict(path)
        if verdict is not None:
            self.refuse(node, path, *verdict)
            return
        obj = _resolve_static(path, self.rules)
        for i, part in enumerate(parts):
            shown = ".".join([path] + parts[: i + 1])
            # a private base class, for isinstance (nn.modules.batchnorm._BatchNorm), is fine
            private_class = isinstance(obj, types.ModuleType) and part.startswith("_") and \
                not part.startswith("__") and isinstance(vars(obj).get(part), type)
            if part.startswith("_") and part not in DUNDERS and not private_class:
                self.refuse(node, shown, "it is a private name of a library", "use the public API")
                return
            if not isinstance(obj, types.ModuleType):
                for rest in parts[i:]:
                    self.check_attribute_name(node, rest, on_module=True)
                return
            full = f"{obj.__name__}.{part}"
            child = vars(obj).get(part)
            if isinstance(child, types.ModuleType) or (child is None and _is_module_path(full)):
                sub = child.__name__ if child is not None else full
                verdict = self.rules.module_verdict(sub) or (
                    self.rules.module_verdict(full) if full != sub else None)
                deeper = f"{sub}.{parts[i + 1]}" if i + 1 < len(parts) else ""
                if verdict is not None and deeper and sub == full and _is_module_path(deeper) \
                        and not self.rules.shortcut_for_path(sub):
                    # a package refused as a whole may hold an allowed module: judge that one
                    self.check_chain(node, deeper, parts[i + 2:], value_use, alias=alias)
                    return
                if verdict is not None:
                    self.refuse(node, shown if sub == full else f"{shown} (the module {sub})", *verdict)
                    return
                obj = child if child is not None else _resolve_static(sub, self.rules)
                if obj is None:  # an allowed module that could not be loaded: judge the rest by name
                    for rest in parts[i + 1:]:
                        self.check_attribute_name(node, rest, on_module=True)
                    return
                continue
            if not private_class and full not in MEMBERS_ALLOWED:
                self.check_attribute_name(node, part, on_module=True)
            s = self.rules.shortcut_for_path(full)
            found = self.rules.shortcut_for_object(child) if child is not None else None
            if s is not None or found is not None:
                what = shown if s is not None else f"{shown} (that is {found[0]})"
                self.refuse(node, what, "the chapter's text forbids it", (s or found[1]).instead)
                return
            why = self.rules.refused_member(full, child)
            if why is not None:
                self.refuse(node, shown if shown == full else f"{shown} (that is {full})", why)
                return
            origin = getattr(child, "__module__", None) if child is not None else None
            if isinstance(origin, str) and _longest(origin, ORIGINS_REFUSED):
                self.refuse(node, f"{shown} (from {origin})", ORIGINS_REFUSED[_longest(origin, ORIGINS_REFUSED)])
                return
            for rest in parts[i + 1:]:
                self.check_attribute_name(node, rest, on_module=False)
            return
        if value_use:
            self.refuse(node, f"the module {'.'.join([path] + parts)} as a value",
                        "a module may only be used by spelling out its attributes (F.relu(x)), "
                        "not passed, stored or aliased", f"write {alias or path}.name where you need it")

    def _chain(self, node):
        """(root name, [attrs]) for a pure Name.a.b chain, else None."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            return node.id, parts[::-1]
        return None

    def _is_chain_base(self, node) -> bool:
        parent = self.parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return True
        return isinstance(parent, ast.Call) and self._literal_attribute_call(parent) is not None \
            and parent.args[0] is node

    def _literal_attribute_call(self, call: ast.Call) -> str | None:
        f = call.func
        if isinstance(f, ast.Name) and f.id in ATTRIBUTE_BUILTINS and len(call.args) >= 2 and \
                not call.keywords and not any(isinstance(a, ast.Starred) for a in call.args) and \
                isinstance(call.args[1], ast.Constant) and isinstance(call.args[1].value, str):
            return call.args[1].value
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if self._is_chain_base(node):  # the outermost attribute of the chain judges it
            self.generic_visit(node)
            return
        chain = self._chain(node)
        if chain is not None and chain[0] in self.modules:
            self.check_chain(node, self.modules[chain[0]], chain[1], value_use=True,
                             store=not isinstance(node.ctx, ast.Load), alias=chain[0])
        else:
            inner = node
            while isinstance(inner, ast.Attribute):
                self.check_attribute_name(inner, inner.attr, on_module=False)
                inner = inner.value
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        name = node.id
        if name.startswith("__") and name.endswith("__") and name not in DUNDERS:
            self.refuse(node, name, "it reaches the interpreter's internals")
        elif name in BUILTINS_REFUSED and isinstance(node.ctx, ast.Load):
            self.refuse(node, f"{name}()", BUILTINS_REFUSED[name])
        elif name in ATTRIBUTE_BUILTINS and isinstance(node.ctx, ast.Load):
            parent = self.parents.get(node)
            if not (isinstance(parent, ast.Call) and parent.func is node
                    and self._literal_attribute_call(parent) is not None):
                self.refuse(node, f"{name}()", "only a literal attribute name can be checked",
                            f"spell the attribute out (obj.name), or use {name}(obj, 'name') with a literal "
                            "name; to replace a submodule by its dotted name use model.set_submodule(name, new)")
        elif name == "type" and isinstance(node.ctx, ast.Load):
            parent = self.parents.get(node)
            if not (isinstance(parent, ast.Call) and parent.func is node and len(parent.args) == 1
                    and not parent.keywords):
                self.refuse(node, "type(...)", "only type(obj) is allowed: creating classes from run-time "
                            "dictionaries bypasses these rules", "write a class statement")
            elif not self._type_only_inspected(parent):
                self.refuse(parent, "type(obj) used as a value", "a class reached from an object can be its "
                            "metaclass (type(type(x)) is type), which builds classes from run-time dictionaries",
                            "compare it (type(x) is T, type(x) == T), test it (isinstance(y, type(x))) or read "
                            "type(x).__name__ / __qualname__")
        elif name in self.modules and isinstance(node.ctx, ast.Load) and not self._is_chain_base(node):
            self.check_chain(node, self.modules[name], [], value_use=True, alias=name)

    def _type_only_inspected(self, call: ast.Call) -> bool:
        """``type(x)`` is compared (``is``, ``==``, ``in`` ...), named (``.__name__``, ``.__qualname__``) or the
        class argument of ``isinstance``/``issubclass``: never called, stored or passed on."""
        parent = self.parents.get(call)
        if isinstance(parent, ast.Compare):
            return True
        if isinstance(parent, ast.Attribute) and parent.value is call and parent.attr in ("__name__", "__qualname__"):
            return True
        return (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name)
                and parent.func.id in ("isinstance", "issubclass") and call in parent.args[1:])

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if ((isinstance(f, ast.Attribute) and f.attr == "wraps") or (isinstance(f, ast.Name) and f.id == "wraps")) \
                and (len(node.args) != 1 or node.keywords):
            self.refuse(node, "wraps(..., assigned/updated)", "it reads and sets attributes named by strings",
                        "use functools.wraps(fn) alone")
        literal = self._literal_attribute_call(node)
        if literal is not None:
            chain = self._chain(node.args[0])
            if chain is not None and chain[0] in self.modules:
                self.check_chain(node, self.modules[chain[0]], chain[1] + [literal],
                                 store=node.func.id in ("setattr", "delattr"))
            else:
                self.check_attribute_name(node, literal, on_module=False)
        for arg in list(node.args) + [k.value for k in node.keywords]:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                s = self.rules.shortcut_for_name(arg.value)
                if s is not None:
                    self.refuse(arg, repr(arg.value), "the chapter's text forbids it", s.instead)
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            verdict = self.rules.module_verdict(alias.name)
            if verdict is not None:
                self.refuse(node, f"import {alias.name}", *verdict)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            self.refuse(node, "a relative import", "exercise cells are not part of a package")
            return
        verdict = self.rules.module_verdict(node.module)
        if verdict is not None and not all(
                self._names_module(f"{node.module}.{a.name}") for a in node.names if a.name != "*"):
            self.refuse(node, f"from {node.module} import ...", *verdict)
            return
        for alias in node.names:
            if alias.name == "*":
                self.refuse(node, f"from {node.module} import *", "every name must be visible in the cell",
                            "import the names you use")
                continue
            full = f"{node.module}.{alias.name}"
            if self._names_module(full):
                real = self._bound_module(node.module, alias.name)
                verdict = self.rules.module_verdict(full) or (self.rules.module_verdict(real) if real != full else None)
                if verdict is not None:
                    shown = full if real == full else f"{full} (the module {real})"
                    self.refuse(node, f"{shown} (from {node.module} import {alias.name})", *verdict)
                continue
            root, *rest = full.split(".")
            self.check_chain(node, root, rest)

    def _check_definition(self, node, name: str) -> None:
        if name.startswith("__") and name.endswith("__") and name not in DUNDERS:
            self.refuse(node, name, "defining it changes how the interpreter or a library treats your object")

    def visit_FunctionDef(self, node) -> None:
        self._check_definition(node, node.name)
        self._check_generator_cleanup(node)
        self.generic_visit(node)

    def visit_AsyncFunctionDef(self, node) -> None:
        self.refuse(node, "async def", FINALIZER_WHY, "exercises need no coroutines")
        self.visit_FunctionDef(node)

    def _check_generator_cleanup(self, node) -> None:
        """A generator that may be suspended inside try or with runs that code when the garbage collector
        finalizes it: code the grader's own collections would run, between its readings."""
        own = [n for n in _own_nodes(node) if isinstance(n, (ast.Yield, ast.YieldFrom))]
        if not own:
            return
        for inner in _own_nodes(node):
            if isinstance(inner, (ast.Try, ast.TryStar, ast.With, ast.AsyncWith)):
                self.refuse(inner, "try or with in a generator", FINALIZER_WHY,
                            "compute the values first and yield them outside try and with, or return a list")
            elif isinstance(inner, ast.YieldFrom) and not self._own_generator_call(inner.value):
                # finalizing the generator calls close() on what it delegates to: only the cell's own generators
                # (held to these same rules) may be delegated to
                self.refuse(inner, "yield from (not a generator of this cell)", FINALIZER_WHY,
                            "loop over the values and yield each one, or delegate to a generator function the "
                            "cell defines")

    def _own_generator_call(self, node) -> bool:
        """``node`` calls, by its name, a generator function this cell defines at top level."""
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in self.own_generators)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._check_definition(node, node.name)
        for k in node.keywords:
            if k.arg == "metaclass":
                self.refuse(node, "metaclass=", "a metaclass builds classes from run-time dictionaries")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        # "__builtins__" as a key of some namespace dict is as good as the name itself, and so is a format field
        # that reads it ("{0.__globals__[sys]}".format(f)): a dunder anywhere in a string is refused
        if not isinstance(node.value, str):
            return
        for dunder in re.findall(r"__\w+?__", node.value):
            if dunder not in DUNDERS:
                self.refuse(node, repr(node.value[:60]), f"it names the interpreter's internals ({dunder})")
                return
        for name in re.findall(r"\{[^{}]*?\.([A-Za-z_]\w*)", node.value):  # "{0.f_back}": attributes read by format
            self.check_attribute_name(node, name, on_module=False)

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        for name in node.kwd_attrs:  # class patterns read attributes by name
            self.check_attribute_name(node, name, on_module=False)
        self.generic_visit(node)


# --- entry points -------------------------------------------------------------------------------

def _names_module(path: str, importable: bool) -> bool:
    """Whether ``from X import y`` (``path`` = "X.y") binds a module; X is imported only if ``importable``."""
    parent, _, name = path.rpartition(".")
    if importable and parent not in sys.modules:
        try:
            importlib.import_module(parent)
        except ImportError:
            return False
    if parent in sys.modules:
        found = vars(sys.modules[parent]).get(name)
        if found is not None:
            return isinstance(found, types.ModuleType)
    return _is_module_path(path)


@lru_cache(maxsize=64)
def setup_modules(setup: tuple[str, ...]) -> dict[str, str]:
    """Names the (trusted) setup cells bind to modules: ``{"F": "torch.nn.functional", ...}``."""
    names: dict[str, str] = {}
    for source in setup:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    top = alias.name.split(".")[0]
                    names[alias.asname or top] = alias.name if alias.asname else top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if alias.name != "*" and _names_module(full, importable=True):
                        names[alias.asname or alias.name] = full
    return names


def check_source(source: str, policy: SourcePolicy = DEFAULT_POLICY, setup: tuple[str, ...] | list[str] = ()
                 ) -> list[Breach]:
    """The breaches of one exercise cell's ``source`` (empty: the cell may run).

    ``setup`` is the chapter's trusted setup cells: the names they bind to modules count as
    modules in the cell. Fails closed: a cell that is not plain Python (IPython's magics, shell
    escapes and help syntax included) is refused with its line named, and so is a cell on which
    the policy itself fails, for whatever reason.
    """
    if len(source) > MAX_SOURCE_CHARS:
        return [Breach(f"a cell of {len(source):,} characters", 1, f"over the grader's limit of {MAX_SOURCE_CHARS:,} "
                       "for one exercise cell, so it is not read", "keep the exercise cell to its function or class")]
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [_not_python(source, e)]
    except (ValueError, RecursionError, MemoryError) as e:  # null bytes, nesting too deep to read
        return [Breach("code the grader cannot read", 1, f"{type(e).__name__} while reading the cell")]
    try:
        return _Checker(_rules(policy), setup_modules(tuple(setup))).run(tree)
    except Exception as e:  # noqa: BLE001 - fail closed: what the policy cannot read does not run
        return [Breach("code the grader cannot read", 1,
                       f"the grader's check of the cell failed ({type(e).__name__}), so it does not run it")]


# What a line that is not Python most often is, in a notebook cell.
_IPYTHON_SYNTAX = (
    (re.compile(r"^\s*%%"), "a cell magic (%%...)"),
    (re.compile(r"^\s*%|=\s*%"), "a line magic (%...)"),
    (re.compile(r"^\s*!|=\s*!"), "a shell escape (!...)"),
    (re.compile(r"^\s*\?|\?\s*$"), "IPython help syntax (...?)"),
    (re.compile(r"^[;,/]"), "IPython's autocall syntax (/f x, ;f x, ,f x)"),
)


def _not_python(source: str, error: SyntaxError) -> Breach:
    """The breach for a cell that does not parse, at the line where parsing failed."""
    number = error.lineno or 1
    lines = source.splitlines()
    line = lines[number - 1] if 0 < number <= len(lines) else ""
    for pattern, what in _IPYTHON_SYNTAX:
        if pattern.search(line):
            return Breach(what, number, "the grader runs exercise cells as plain Python; magics, shell "
                          "escapes and help syntax work only in a notebook's kernel",
                          "remove the line, or move it to a cell of its own outside the exercise cell",
                          not_python=True)
    return Breach("a syntax error", number, error.msg, "fix the line: the grader runs the cell as written",
                  not_python=True)


@lru_cache(maxsize=64)
def _rules(policy: SourcePolicy) -> _Rules:
    return _Rules(policy)


POLICY_KEY = "course_source_policy"  # where a released notebook's metadata holds its chapter's policy


def policy_to_dict(policy: SourcePolicy) -> dict:
    """``policy`` as plain data, for a released notebook's metadata (``course_source_policy``)."""
    return {"modules": list(policy.modules), "refused": list(policy.refused),
            "shortcuts": [{"paths": list(s.paths), "pattern": s.pattern, "instead": s.instead}
                          for s in policy.shortcuts]}


def policy_from_dict(data) -> SourcePolicy:
    """The policy :func:`policy_to_dict` wrote; the default one for anything else."""
    if not isinstance(data, dict):
        return DEFAULT_POLICY
    try:
        return SourcePolicy(modules=tuple(str(m) for m in data.get("modules", ())),
                            refused=tuple(str(m) for m in data.get("refused", ())),
                            shortcuts=tuple(Shortcut(paths=tuple(str(p) for p in s.get("paths", ())),
                                                     pattern=str(s.get("pattern", "")),
                                                     instead=str(s.get("instead", "")))
                                            for s in data.get("shortcuts", ())))
    except (AttributeError, TypeError):
        return DEFAULT_POLICY


def refusals_under(policy: SourcePolicy, setup, sources: dict[str, str | None]) -> dict[str, str]:
    """Exercise -> reason, for each exercise cell in ``sources`` that breaches ``policy``."""
    found = {}
    for exercise, source in sources.items():
        breaches = check_source(source, policy, setup) if source is not None else []
        if breaches:
            found[exercise] = refusal(exercise, breaches)
    return found
