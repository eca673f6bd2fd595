"""``python -m grader demo``: lecture dashboards, one per chapter, served by Voila.

A chapter's dashboard is generated from its only source, ``solutions/<chapter_id>.py``, each
time the server starts, so it never drifts from the chapter:

- the demo cells run, with what they need: the setup cells, the exercise cells (the reference
  implementations) and every earlier code cell that binds or may change a name a kept cell
  reads (``needed_cells``: a conservative slice, so that skipping a cell never changes what a
  demo shows, only how soon it appears); graded test cells never run;
- only the demo cells are shown (their output: Voila strips all code), each under the
  markdown cell just before it, or under the nearest heading above it;
- the other cells run hidden (tag ``hide``); an error in one is still shown, never swallowed;
- what the demo cells read is saved after the first full run (``coursekit.lecture_cache``, in
  ``build/demo/cache/``, under a key of the chapter's source, the course's packages and their
  versions, and fast mode): a later open loads it and skips the hidden cells, so that it is
  interactive in seconds. ``python -m grader demo --warm`` (``make demo-warm``) fills the cache
  before class (``grader.demo_warm``).

Dashboards are written to ``build/demo/`` (ignored) with a Voila template, ``course-demo``:
large type for a projector, no code, no CDN (widget JavaScript comes from the installed
extensions, so it works offline), and an index page that lists the chapters.
"""
from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import html
import os
import platform
import re
import shutil
import sys
from pathlib import Path

import nbformat

from coursekit.lecture_cache import SKIP_MARK
from grader.notebooks import ROOT, chapters, check_chapter_id, is_demo, read_source

BUILD = ROOT / "build" / "demo"
TEMPLATE = "course-demo"
TEMPLATE_SOURCE = Path(__file__).resolve().parent / "demo_template"
VOILA_CONFIG = ROOT / "config" / "voila"
HIDE_TAG = "hide"
# First cell of every dashboard: projector-sized figures, no progress bars among the demos.
LECTURE_SETUP = """\
import os
os.environ["TQDM_DISABLE"] = "1"
from coursekit.widgets import lecture_mode
lecture_mode()"""

CACHE_DIR = "cache"  # under the dashboards' folder, where their kernels run
# What a saved measurement depends on besides its chapter: the course's packages and data, and
# the versions of what computes and pickles it.
KEY_SOURCES = ("coursekit", "kernels", "data")
KEY_PACKAGES = ("torch", "numpy", "matplotlib", "scikit-learn", "cloudpickle", "ipywidgets")
# Loads the saved measurements, if any (then the cells marked SKIP_MARK do not run).
CACHE_LOAD = """\
from coursekit import lecture_cache
_lecture_cache_loaded = lecture_cache.load({path!r}, globals())"""
# After a full run: save what the demo cells read; the names that could not be saved are printed.
CACHE_SAVE = """\
if not _lecture_cache_loaded:
    print({marker!r}, lecture_cache.save({path!r}, {names!r}, globals()))"""
SAVE_MARKER = "lecture-cache not saved:"

_TITLE_RE = re.compile(r"^#\s+(?:Chapter\s+\d+\s+[—-]\s+)?(.+)$")
_HEADING_RE = re.compile(r"^#{1,3}\s+\S")


def _is_graded_test(cell) -> bool:
    return bool(cell.get("metadata", {}).get("nbgrader", {}).get("grade"))


def title_and_summary(nb: nbformat.NotebookNode) -> tuple[str, str]:
    """The chapter's title (its ``# Chapter N — Title`` heading) and the first sentence after it."""
    first = next(c for c in nb.cells if c.cell_type == "markdown")
    lines = first.source.splitlines()
    match = _TITLE_RE.match(lines[0]) if lines else None
    if not match:
        raise ValueError(f"{nb.metadata['course']['chapter']}: the first cell must start with '# Chapter N — Title'")
    paragraph = []
    for line in lines[1:]:
        if line.strip():
            paragraph.append(line.strip())
        elif paragraph:
            break
    text = re.sub(r"\\times\b", "×", " ".join(paragraph))  # the one-liner is plain text: no LaTeX
    text = re.sub(r"\s+", " ", re.sub(r"\\[a-zA-Z]+|[*_`${}]", "", text))
    sentence = re.match(r"(.+?[.!?])(\s|$)", text)
    return match.group(1).strip(), (sentence.group(1) if sentence else text)


# Builtins that never change their arguments (print(x) does not make a cell a writer of x).
_PURE_BUILTINS = {"print", "len", "repr", "str", "int", "float", "bool", "abs", "round", "min", "max",
                  "sum", "sorted", "isinstance", "range", "enumerate", "zip", "list", "tuple", "dict",
                  "set", "format", "type", "any", "all", "hash", "id"}


class _Effects(ast.NodeVisitor):
    """What running code does to the notebook's names.

    ``reads``: global names it reads (function bodies included: they run later, when called);
    ``writes``: global names it binds or may change now; ``changed``: names whose object it may
    change (for a function body: what a call may change). Imported names (modules, functions)
    are taken as never changed by method calls, so ``plt.show()`` keeps no cell alive.
    """

    def __init__(self, functions: dict[str, set[str]], imported: set[str], local: bool = False):
        self.functions, self.imported, self.local = functions, imported, local
        self.reads, self.writes, self.bound, self.changed, self.globals = set(), set(), set(), set(), set()
        self.defined: dict[str, set[str]] = {}  # functions defined here -> globals a call may change

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            self.reads.add(node.id)
        else:
            self.bound.add(node.id)
            if not self.local:
                self.writes.add(node.id)

    def _scope(self, node, params: set[str], body) -> tuple[set[str], set[str]]:
        """Visit a nested scope; return (names it reads, names it changes) outside itself."""
        inner = _Effects(self.functions, self.imported, local=True)
        for child in body:
            inner.visit(child)
        local = (params | inner.bound) - inner.globals
        self.reads |= inner.reads - local
        return inner.reads - local, (inner.changed - local) | (inner.globals & inner.bound)

    @staticmethod
    def _params(args: ast.arguments) -> set[str]:
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        return {a.arg for a in every if a is not None}

    def visit_FunctionDef(self, node):
        for d in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
            if d is not None:
                self.visit(d)
        _, changes = self._scope(node, self._params(node.args), node.body)
        self._bind(node.name)
        self.defined[node.name] = changes
        if self.local:
            self.changed |= changes  # conservative: a nested function may be called here

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self._scope(node, self._params(node.args), [node.body])

    def visit_ClassDef(self, node):
        for d in [*node.bases, *node.decorator_list]:
            self.visit(d)
        _, changes = self._scope(node, set(), node.body)
        self._bind(node.name)
        self.defined[node.name] = changes

    def _comprehension(self, node):
        targets = set()
        for gen in node.generators:
            targets |= {n.id for n in ast.walk(gen.target) if isinstance(n, ast.Name)}
        parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        parts += [x for gen in node.generators for x in (gen.iter, *gen.ifs)]
        _, changes = self._scope(node, targets, parts)
        self._change_names(changes)  # runs now

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Global(self, node):
        self.globals.update(node.names)

    def visit_Import(self, node):
        for a in node.names:
            name = (a.asname or a.name).split(".")[0] if isinstance(node, ast.Import) else (a.asname or a.name)
            self.imported.add(name)
            self._bind(name)

    visit_ImportFrom = visit_Import

    def _bind(self, name):
        self.bound.add(name)
        if not self.local:
            self.writes.add(name)

    def visit_Attribute(self, node):
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self._change(node)
        self.generic_visit(node)

    visit_Subscript = visit_Attribute

    def visit_AugAssign(self, node):
        if isinstance(node.target, ast.Name):
            self.reads.add(node.target.id)
        self.generic_visit(node)

    def visit_Call(self, node):
        if isinstance(node.func, ast.Attribute):
            self._change(node.func.value)  # x.update(...), model.train(), opt.step()
        elif isinstance(node.func, ast.Name) and node.func.id in self.functions:
            self._change_names(self.functions[node.func.id])
        if not (isinstance(node.func, ast.Name) and node.func.id in _PURE_BUILTINS):
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                self._change(arg)  # train(model, ...) may change model
        self.generic_visit(node)

    def _change(self, node):
        while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
            node = node.value
        if isinstance(node, ast.Name) and node.id not in self.imported:
            self._change_names({node.id})

    def _change_names(self, names):
        self.changed |= names
        if not self.local:
            self.writes |= names


def _cell_effects(sources: list[str]):
    """(source, parsed tree, _Effects) per cell, in order, with the notebook's functions carried from
    cell to cell; tree and effects are None for a cell that does not parse."""
    functions: dict[str, set[str]] = {}
    imported: set[str] = set()
    for src in sources:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            yield src, None, None
            continue
        e = _Effects(functions, imported)
        for stmt in tree.body:
            e.visit(stmt)
        functions.update(e.defined)
        yield src, tree, e


def needed_cells(sources: list[str], keep: list[bool]) -> list[bool | str]:
    """Which code cells to run so that the cells marked in ``keep`` see what they would see
    after running every cell: True (run it), or the source of its top-level imports (run
    only those), or "" (skip it).

    A cell runs when it binds, or may change, a name that a later running cell reads (anywhere,
    function bodies included). "May change" is generous: storing into ``x.a`` or ``x[i]``,
    calling a method of ``x``, passing ``x`` to a call (builtins such as ``print`` excepted),
    or calling a notebook function whose body does one of these to a global. Imports are cheap
    and always kept. A cell that does not parse runs.
    """
    effects = []
    for src, tree, e in _cell_effects(sources):
        if e is None:
            effects.append(None)
            continue
        imports = [stmt for stmt in tree.body if isinstance(stmt, (ast.Import, ast.ImportFrom))]
        for stmt in imports:  # kept in any case, so they need no cell
            e.writes -= {(a.asname or a.name).split(".")[0] for a in stmt.names}
        effects.append((e, "\n".join(ast.get_source_segment(src, stmt) for stmt in imports)))
    needed, result = set(), [""] * len(sources)
    for i in range(len(sources) - 1, -1, -1):
        if effects[i] is None:
            result[i] = True
            continue
        e, imports = effects[i]
        if keep[i] or e.writes & needed:
            result[i] = True
            needed |= e.reads
        else:
            result[i] = imports
    return result


# Names a notebook's code may read without binding them: builtins and what IPython provides.
_PROVIDED = set(dir(builtins)) | {"display", "get_ipython", "In", "Out", "exit", "quit"}


def unbound_names(sources: list[str]) -> set[str]:
    """Global names the cells read (function bodies included) that none of them binds.

    A dashboard runs a slice of its chapter; a name bound only in a cell it leaves out (a
    graded test cell, say) would fail there with a NameError, so ``dashboard`` refuses it."""
    reads, bound = set(), set()
    for _, _, e in _cell_effects(sources):
        if e is None:
            continue
        reads |= e.reads
        bound |= e.bound | e.writes | e.imported | e.globals
    return reads - bound - _PROVIDED


def cache_key(chapter: str, src: nbformat.NotebookNode | None = None) -> str:
    """What a chapter's saved measurements depend on, hashed: its cells (``src``, else read from
    its source), every file of the course's packages and data, the versions of Python and the
    packages that compute and pickle them, and fast mode (``COURSE_FAST``, which the dashboards'
    kernels inherit)."""
    src = src if src is not None else read_source(chapter, demo_tags=True)
    h = hashlib.sha256()
    for cell in src.cells:
        h.update(f"{cell.cell_type}\0{cell.source}\0{sorted(cell.metadata.get('tags', []))}\0".encode())
    h.update(_course_digest().encode())
    h.update(cache_mode().encode())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _course_digest() -> str:
    """The course's packages and data and the versions that compute and pickle measurements
    (computed once per build: ``build`` clears it)."""
    from importlib import metadata

    h = hashlib.sha256()
    for top in KEY_SOURCES:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    versions = [platform.python_version()]
    for package in KEY_PACKAGES:
        try:
            versions.append(f"{package}=={metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} missing")
    h.update(" ".join(versions).encode())
    return h.hexdigest()


def cache_mode() -> str:
    """"fast" or "full": the dashboards' kernels inherit COURSE_FAST from the server."""
    return "fast" if os.environ.get("COURSE_FAST", "") not in ("", "0", "false", "False") else "full"


def cache_file(chapter: str, src: nbformat.NotebookNode | None = None) -> str:
    """The saved measurements' path, relative to the dashboards' folder."""
    return f"{CACHE_DIR}/{chapter}-{cache_mode()}-{cache_key(chapter, src)}.pkl"


def saved_names(sources: list[str], demo: list[bool]) -> list[str]:
    """The names the demo cells read (function bodies included) that a hidden cell binds: what a
    dashboard must load to run its demo cells alone."""
    reads, bound_by_demos, bound_by_hidden = set(), set(), set()
    for (_, _, e), is_demo_cell in zip(_cell_effects(sources), demo):
        if e is None:
            continue
        if is_demo_cell:
            reads |= e.reads
            bound_by_demos |= e.bound  # not e.writes: a name it may only change must be loaded
        else:
            bound_by_hidden |= e.bound | e.writes | e.imported
    return sorted((reads & bound_by_hidden) - bound_by_demos - _PROVIDED)


def _sections(cells) -> list[str]:
    """For each cell of a chapter, the heading it stands under (its numbered section)."""
    current, out = "", []
    for cell in cells:
        if cell.cell_type == "markdown":
            heads = [line for line in cell.source.splitlines() if _HEADING_RE.match(line)]
            if heads:
                current = re.sub(r"^#+\s*", "", heads[-1]).strip()
                current = re.sub(r"^Chapter\s+\d+\s+[—-]\s+", "", current).replace("$", "")
        out.append(current)
    return out


def dashboard(chapter: str) -> nbformat.NotebookNode | None:
    """The dashboard notebook of ``chapter``, or None if it has no demo cell."""
    src = read_source(chapter, demo_tags=True)
    demos = [i for i, c in enumerate(src.cells) if c.cell_type == "code" and is_demo(c)]
    if not demos:
        return None
    title, summary = title_and_summary(src)
    sections = _sections(src.cells)
    path = cache_file(chapter, src)
    v4 = nbformat.v4
    cells = [v4.new_code_cell(LECTURE_SETUP, metadata={"tags": [HIDE_TAG]}),
             v4.new_code_cell(CACHE_LOAD.format(path=path), metadata={"tags": [HIDE_TAG]}),
             v4.new_markdown_cell(f"# {title}\n\n{summary}\n\n[← all chapters](../../)",
                                  metadata={"tags": ["title"]})]
    where = ["starting the kernel", "loading saved measurements", title]
    code = [(i, c) for i, c in enumerate(src.cells[:demos[-1] + 1])
            if c.cell_type == "code" and not _is_graded_test(c)]
    run = needed_cells([c.source for _, c in code],
                       [is_demo(c) or "setup" in c.metadata.get("tags", []) or "nbgrader" in c.metadata
                        for _, c in code])
    shown_markdown = set()
    for (i, cell), needed in zip(code, run):
        if needed is not True:
            if needed:
                cells.append(v4.new_code_cell(_skippable(needed), metadata={"tags": [HIDE_TAG]}))
                where.append(sections[i])
            continue
        if not is_demo(cell):
            cells.append(v4.new_code_cell(_skippable(cell.source), metadata={"tags": [HIDE_TAG]}))
            where.append(sections[i])
            continue
        intro = _intro(src.cells, i, shown_markdown)
        if intro is not None:
            cells.append(v4.new_markdown_cell(intro))
            where.append(sections[i])
        cells.append(v4.new_code_cell(cell.source, metadata={"tags": ["demo"]}))
        where.append(sections[i])
    code = [c for c in cells if c.cell_type == "code"]
    names = saved_names([c.source for c in code], [is_demo(c) for c in code])
    cells.append(v4.new_code_cell(CACHE_SAVE.format(marker=SAVE_MARKER, path=path, names=names),
                                  metadata={"tags": [HIDE_TAG]}))
    where.append("saving the measurements for the next open")
    missing = unbound_names([c.source for c in cells if c.cell_type == "code"])
    if missing:
        raise ValueError(
            f"{chapter}: the dashboard reads {', '.join(sorted(missing))}, bound only in cells it does not run "
            "(graded test cells never run in a dashboard): bind it in a cell before the demo")
    nb = v4.new_notebook(cells=cells, metadata={
        "kernelspec": src.metadata["kernelspec"], "language_info": src.metadata["language_info"],
        "course": {"chapter": chapter, "title": title, "summary": summary, "cache": path, "sections": where,
                   "generated_from": f"solutions/{chapter}.py",
                   "note": "Generated by `python -m grader demo`; edit the source, not this file."}})
    nbformat.validate(nb)
    return nb


def _skippable(source: str) -> str:
    """A hidden cell that the saved measurements replace: marked, unless it is not plain Python
    (an IPython magic, which the cache's input transformer would not see parsed)."""
    try:
        ast.parse(source)
    except SyntaxError:
        return source
    return f"{SKIP_MARK}\n{source}"


def _intro(cells, demo_index: int, shown: set[int]) -> str | None:
    """What a demo is shown under (each markdown cell at most once): the nearest markdown cell
    above it from its last heading on; a heading-less one only when it comes right before the
    demo; otherwise the nearest heading above."""
    j = demo_index - 1
    while j >= 0 and cells[j].cell_type != "markdown":
        j -= 1
    for k in range(j, -1, -1):
        if cells[k].cell_type != "markdown":
            continue
        lines = cells[k].source.splitlines()
        heads = [n for n, line in enumerate(lines) if _HEADING_RE.match(line)]
        if k == j and (heads or j == demo_index - 1):
            text = "\n".join(lines[heads[-1]:]) if heads else cells[k].source
        elif heads:
            text = lines[heads[-1]]
        else:
            continue
        if k in shown:
            return None
        shown.add(k)
        return text
    return None


def build(dest: Path = BUILD, chapter_ids: list[str] | None = None) -> list[str]:
    """Write the dashboards, the Voila template and the index page under ``dest``.

    Returns the chapters that have a dashboard, in order. Files of chapters that no longer
    have one are removed.
    """
    chapter_ids = [check_chapter_id(c) for c in chapter_ids] if chapter_ids else chapters()
    _course_digest.cache_clear()  # the course may have changed since the last build
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.ipynb"):
        old.unlink()
    notebooks = {}
    for ch in chapter_ids:
        nb = dashboard(ch)
        if nb is not None:
            notebooks[ch] = nb
    listed = [(ch, nb.metadata["course"]["title"], nb.metadata["course"]["summary"]) for ch, nb in notebooks.items()]
    for ch, nb in notebooks.items():
        nb.metadata["course"]["chapters"] = [[c, title] for c, title, _ in listed]  # the page's selector
        nbformat.write(nb, dest / f"{ch}.ipynb")
    template = dest / "share" / "voila" / "templates" / TEMPLATE
    if template.exists():
        shutil.rmtree(template)
    shutil.copytree(TEMPLATE_SOURCE, template)
    page = index_page(listed)
    for name in ("tree-lab.html", "tree.html"):  # Voila's index page, whichever tree it is set to
        (template / name).write_text(page, encoding="utf-8")
    return [ch for ch, _, _ in listed]


def index_page(listed: list[tuple[str, str, str]]) -> str:
    """The page Voila serves at ``/``: one row per chapter (title, one line, link)."""
    e = html.escape
    rows = "\n".join(
        f'<li><a class="chapter" href="{{{{ base_url }}}}voila/render/{e(ch)}.ipynb">'
        f'<span class="id">{e(ch)}</span> {e(title)}</a><p>{e(summary)}</p></li>'
        for ch, title, summary in listed)
    return (TEMPLATE_SOURCE / "index-page.html").read_text(encoding="utf-8").replace("{rows}", rows)


def serve(port: int, dest: Path = BUILD, chapter_ids: list[str] | None = None) -> None:
    """Build the dashboards, then replace this process with Voila serving them on 127.0.0.1."""
    listed = build(dest, chapter_ids)
    if not listed:
        raise RuntimeError("no chapter has a demo cell (# %% tags=[\"demo\"])")
    print(f"dashboards for {len(listed)} chapter(s) in {dest}", flush=True)
    cold = [ch for ch in listed
            if not (dest / nbformat.read(dest / f"{ch}.ipynb", as_version=4).metadata["course"]["cache"]).exists()]
    if cold:
        print(f"{len(listed) - len(cold)} of {len(listed)} dashboards open in seconds; the first open of "
              f"{', '.join(cold)} measures what its demos need and saves it for the next "
              "(`make demo-warm` does all of them before class)", flush=True)
    env = {**os.environ,
           "JUPYTER_PATH": os.pathsep.join(p for p in (str(dest / "share"), os.environ.get("JUPYTER_PATH", "")) if p),
           # config/voila/voila.json: only the widgets' lab extension, and idle kernels of closed tabs culled
           "JUPYTER_CONFIG_PATH": os.pathsep.join(
               p for p in (str(VOILA_CONFIG), os.environ.get("JUPYTER_CONFIG_PATH", "")) if p)}
    voila = Path(sys.executable).parent / "voila"
    args = [str(voila), str(dest), "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1",
            "--Voila.port_retries=0", f"--template={TEMPLATE}", "--theme=light",
            # Unix sockets, not TCP ports, between Voila and its kernels: a port picked and
            # released before the kernel binds it can be taken by a kernel started beside it.
            "--KernelManager.transport=ipc"]
    os.execve(str(voila), args, env)
