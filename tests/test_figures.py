"""Legible demo figures: one style (coursekit.style), no hard-coded font sizes, every control
labelled in words and explained, and a figure check that catches what made plots illegible.

Every demo figure is drawn at its default values, in both looks (notebook and lecture), and
checked by ``coursekit.style.check_figure`` whenever a chapter runs in fast mode: the notebook
tests (tests/test_notebooks.py) run every chapter, so an illegible demo fails there. This file
reads the demo cells' source, tests the check itself on figures made to fail it, and shows that
a notebook run in fast mode fails on an illegible demo.
"""
import ast
import functools
import struct

import matplotlib
import nbclient
import nbformat
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from conftest import ROOT  # noqa: E402
from coursekit import style  # noqa: E402
from coursekit.widgets import render_figure  # noqa: E402
from grader.notebooks import chapters, is_demo, read_source  # noqa: E402
from grader.timing import KERNEL_OPTIONS  # noqa: E402

# Keywords that set a size of text, and calls that change the style behind its back.
SIZE_KEYWORDS = {"fontsize", "labelsize", "titlesize", "size", "fontdict", "prop", "title_fontsize"}
STYLE_CALLS = {"rc", "rcParams", "rc_context", "style", "set_size_inches", "set_dpi"}
SLIDER_OPTIONS = {"ncols", "figsize", "defaults", "labels", "explain", "notice"}


@functools.lru_cache(maxsize=None)
def _code_cells(chapter: str) -> tuple[tuple[str, bool], ...]:
    """(source, is a demo cell) of every code cell, read once per chapter."""
    return tuple((c.source, is_demo(c)) for c in read_source(chapter, demo_tags=True).cells if c.cell_type == "code")


def _demo_sources(chapter: str) -> list[str]:
    return [src for src, demo in _code_cells(chapter) if demo]


def _plotting_sources(chapter: str) -> dict[str, ast.AST]:
    """The demo cells, and the functions of other cells that the demo cells call (the plotting code
    they draw with), as parsed trees keyed by where they come from."""
    cells = [src for src, _ in _code_cells(chapter)]
    demos = _demo_sources(chapter)
    called = {n.func.id for src in demos for n in ast.walk(ast.parse(src))
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    trees = {f"demo cell {i}": ast.parse(src) for i, src in enumerate(demos)}
    for src in cells:
        if src in demos:
            continue
        try:
            tree = ast.parse(src)
        except SyntaxError:  # a cell with IPython syntax defines no plotting function
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in called:
                trees[f"function {node.name}"] = node
    return trees


@pytest.mark.parametrize("chapter", chapters())
def test_demo_plots_hard_code_no_font_size_or_style(chapter):
    """Fonts come from coursekit.style only (they scale with lecture_mode): no fontsize=,
    labelsize=, rcParams or figure-size changes in a demo cell or the plotting code it calls."""
    found = []
    for where, tree in _plotting_sources(chapter).items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                found += [f"{where}, line {node.lineno}: {kw.arg}=" for kw in node.keywords if kw.arg in SIZE_KEYWORDS]
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in STYLE_CALLS:
                    found.append(f"{where}, line {node.lineno}: {name}(...)")
            elif isinstance(node, ast.Attribute) and node.attr == "rcParams":
                found.append(f"{where}, line {node.lineno}: rcParams")
    assert not found, (f"{chapter}: demo plots set sizes themselves ({'; '.join(found)}); drop them, the style "
                       "(coursekit.style) sizes every text and scales it with lecture_mode")


def _slider_calls(chapter: str):
    for src in _demo_sources(chapter):
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "slider_plot":
                yield node


def _dict_keys(call, name) -> set[str]:
    kw = next((k for k in call.keywords if k.arg == name), None)
    if kw is None:
        return set()
    assert isinstance(kw.value, ast.Dict), f"slider_plot's {name}= must be a literal dict (line {call.lineno})"
    return {k.value for k in kw.value.keys if isinstance(k, ast.Constant)}


@pytest.mark.parametrize("chapter", chapters())
def test_every_control_is_labelled_explained_and_noticed(chapter):
    """Slider labels are words with units (``labels=``), not code identifiers such as
    ``log2_micro``; each control has a one-line explanation (``explain=``); each demo says what
    to notice (``notice=``) as its controls move."""
    calls = list(_slider_calls(chapter))
    assert calls, f"{chapter}: no slider_plot in its demo cells"
    for call in calls:
        controls = {k.arg for k in call.keywords if k.arg not in SLIDER_OPTIONS}
        where = f"{chapter}, slider_plot at line {call.lineno} of its demo cell"
        assert controls <= _dict_keys(call, "labels"), f"{where}: no label for {sorted(controls - _dict_keys(call, 'labels'))}"
        assert controls <= _dict_keys(call, "explain"), f"{where}: no explain line for {sorted(controls - _dict_keys(call, 'explain'))}"
        assert _dict_keys(call, "notice"), f"{where}: no notice= line (what to notice as a control moves)"


# --- the check itself -------------------------------------------------------------------------

def _problems(draw, ncols=1, lecture=False):
    with plt.rc_context(style.rc(lecture)):
        fig, axes = plt.subplots(1, ncols, figsize=style.display_size((10, 4), lecture), squeeze=False)
        try:
            draw(*axes[0])
            fig.canvas.draw()
            return style.check_figure(fig, "test", lecture)
        finally:
            plt.close(fig)


def _good(ax):
    ax.plot([1, 2, 3], [3, 1, 2], "o-", label="measured")
    ax.set(xlabel="batch (examples)", ylabel="memory (KB)", title="a legible figure")
    ax.legend(loc="upper right")


@pytest.mark.parametrize("lecture", [False, True], ids=["notebook", "lecture"])
def test_a_legible_figure_passes_the_check(lecture):
    assert _problems(_good, lecture=lecture) == []


DEFECTS = [
    ("hard-coded font size", lambda ax: (_good(ax), ax.set_title("small", fontsize=7)), "a hard-coded fontsize"),
    ("no y label", lambda ax: (_good(ax), ax.set_ylabel("")), "no y label"),
    ("no x label", lambda ax: (_good(ax), ax.set_xlabel("")), "no x label"),
    ("legend over the markers", lambda ax: (_good(ax), ax.plot(range(30), range(30), "s", label="many"),
                                            ax.legend(loc="center")), "legend covers"),
    ("legend over a text", lambda ax: (_good(ax), ax.text(0.97, 0.97, "a note here", ha="right", va="top",
                                                          transform=ax.transAxes)), "legend lies over"),
    ("text outside", lambda ax: (_good(ax), ax.figure.text(1.01, 0.5, "far away")), "outside the figure"),
    ("tall y label", lambda ax: (_good(ax), ax.set_ylabel("a y label that goes on and on " * 3)), "taller than its plot"),
    ("tick labels overlap", lambda ax: (_good(ax), ax.set_xticks([1, 1.05], ["a long category", "another one"])),
     "overlap"),
]


@pytest.mark.parametrize("defect, draw, message", DEFECTS, ids=[d[0] for d in DEFECTS])
def test_the_check_names_each_defect(defect, draw, message):
    problems = _problems(draw)
    assert any(message in p for p in problems), f"{defect}: {problems}"


def test_category_axes_and_hidden_axes_need_no_label():
    def bars(ax):
        ax.bar(["full", "LoRA"], [3, 1])
        ax.set_ylabel("memory (KB)")

    assert _problems(bars) == []
    assert _problems(lambda ax: (ax.axis("off"), ax.text(0.5, 0.5, "bits", ha="center"))) == []


@pytest.mark.parametrize("lecture", [False, True], ids=["notebook", "lecture"])
def test_figures_are_drawn_at_display_size_and_twice_the_pixel_density(lecture):
    png, size = render_figure(_good, 1, (10, 4), {}, check=True, lecture_look=lecture)
    width, height = struct.unpack(">II", png[16:24])  # the PNG header's IHDR
    look = style.LECTURE if lecture else style.NOTEBOOK
    assert abs(size["width"] - look.width * style.DPI) <= 1 and abs(size["height"] - look.width * 0.4 * style.DPI) <= 1
    assert (width // 2, height // 2) == (size["width"], size["height"])


def test_lecture_type_is_larger_than_the_notebook_type():
    assert style.rc(True)["axes.labelsize"] > style.rc(False)["axes.labelsize"]
    assert style.LECTURE.font / style.LECTURE.width >= style.NOTEBOOK.font / style.NOTEBOOK.width


def test_a_fast_mode_notebook_fails_on_an_illegible_demo(monkeypatch):
    """What makes the notebook tests fail on an illegible demo: a demo cell's draw function,
    run in fast mode, raises with the check's message; COURSE_CHECK_FIGURES=0 turns it off."""
    monkeypatch.setenv("COURSE_FAST", "1")
    monkeypatch.delenv("COURSE_CHECK_FIGURES", raising=False)
    cell = ("from coursekit.widgets import slider_plot\n"
            "def draw(ax, k=1):\n"
            "    ax.plot([0, k], [0, k], 'o-')\n"
            "    ax.set_title(f'k = {k}', fontsize=6)\n"
            "slider_plot(draw, k=(1, 4, 1))")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    client = nbclient.NotebookClient(nb, timeout=120, allow_errors=True, **KERNEL_OPTIONS,
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    errors = [o for o in nb.cells[0].outputs if o.output_type == "error"]
    assert errors and "illegible figure" in errors[0].evalue, nb.cells[0].outputs
    assert "no x label" in errors[0].evalue and "hard-coded fontsize" in errors[0].evalue
