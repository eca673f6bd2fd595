"""Lecture dashboards (`make demo`): generated from solutions/, demo cells tagged, slices that run
what the demos need, an index page, and a template that needs no network."""
import ast
import re

import pytest

from conftest import ROOT
from grader import demo
from grader.notebooks import chapters, is_demo, read_source

WIDGET_CALL = re.compile(r"^(slider_plot|interact|display\(widgets)", re.M)


@pytest.mark.parametrize("chapter", chapters())
def test_every_widget_cell_is_tagged_demo(chapter):
    nb = read_source(chapter, demo_tags=True)
    for cell in nb.cells:
        if cell.cell_type == "code" and WIDGET_CALL.search(cell.source):
            assert is_demo(cell), (f"{chapter}: a cell shows widgets but is not tagged demo; mark it "
                                   f'`# %% tags=["demo"]`:\n{cell.source[:300]}')


def test_demo_tag_stays_out_of_the_release():
    nb = read_source("ch00_memory")
    assert not any(is_demo(c) for c in nb.cells)
    assert any(is_demo(c) for c in read_source("ch00_memory", demo_tags=True).cells)


def _runs(sources, keep):
    return [r is True for r in demo.needed_cells(sources, keep)]


def test_slice_keeps_definitions_and_changes_a_demo_reads():
    sources = [
        "import math\nx = 1",           # binds x, read by the demo
        "y = 2\nprint(y)",              # y unused: skipped
        "results = {}",                 # bound ...
        "def train(v):\n    return v",  # (read by the next cell, which runs)
        "results['a'] = train(x)",      # ... and changed: all three run
        "log = []\ndef note(v):\n    log.append(v)",
        "note(3)",                      # changes log through a notebook function
        "model = object()",
        "model.fit()",                  # a method call may change model
        "import statistics\nslow = statistics.mean(range(10**6))",
        "print(math.pi)\nimport itertools",
        "def draw(ax, k=1):\n    ax.plot(k)\n    return results, log, model, math, itertools",  # the demo
    ]
    keep = [False] * (len(sources) - 1) + [True]
    runs = _runs(sources, keep)
    assert runs == [True, False, True, True, True, True, True, True, True, False, False, True]
    sliced = demo.needed_cells(sources, keep)
    assert sliced[9] == "import statistics" and sliced[10] == "import itertools" and sliced[1] == ""


def test_slice_ignores_names_local_to_functions_and_comprehensions():
    sources = ["ax = 'global ax'\nk = 3",  # the demo's ax and k are its own parameters
               "rows = [k for k in range(3)]",
               "def draw(ax, k=1):\n    return [ax for _ in range(k)], rows"]
    assert _runs(sources, [False, False, True]) == [False, True, True]


def test_unparsable_cells_run():
    assert _runs(["%matplotlib inline", "x = 1", "x"], [False, False, True]) == [True, True, True]


def test_unbound_names_are_what_no_cell_binds():
    sources = ["import torch\nfrom math import pi as PI\nx = 1",
               "def f(a):\n    return a + x + later + missing_in_body",
               "class C:\n    k = 2\n    def m(self):\n        return self.k + C.k",
               "later = [v for v in range(3)]\ndisplay(len(later), PI, torch)",
               "print(measure(f(1)))"]
    assert demo.unbound_names(sources) == {"missing_in_body", "measure"}


def test_a_dashboard_that_reads_a_name_bound_only_in_a_graded_cell_is_refused(monkeypatch):
    """A name imported only in a graded test cell (which dashboards never run) failed in Voila,
    where the page waited for a plot that never came; the build now names it instead."""
    import nbformat

    v4 = nbformat.v4
    nb = v4.new_notebook(cells=[
        v4.new_markdown_cell("# Chapter 99 — Something\n\nOne line."),
        v4.new_code_cell("import torch", metadata={"tags": ["setup"]}),
        v4.new_code_cell("from coursekit import measure\nassert measure", metadata={"nbgrader": {"grade": True}}),
        v4.new_code_cell("m = measure(lambda: torch.ones(2))"),
        v4.new_code_cell("slider_plot(lambda ax, k=1: ax.plot([m]))", metadata={"tags": ["demo"]})],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}, "language_info": {"name": "python"}})
    monkeypatch.setattr(demo, "read_source", lambda chapter, demo_tags=False: nb)
    with pytest.raises(ValueError, match=r"ch99_x: the dashboard reads measure, slider_plot"):
        demo.dashboard("ch99_x")


@pytest.mark.parametrize("chapter", chapters())
def test_every_dashboard_binds_every_name_it_reads(chapter):
    nb = demo.dashboard(chapter)  # raises ValueError naming what is missing
    if nb is not None:
        assert not demo.unbound_names([c.source for c in nb.cells if c.cell_type == "code"])


def test_saved_names_are_what_demos_read_from_hidden_cells():
    sources = ["import torch\nresults = {}\nscale = 2",
               "def f(v):\n    return v * scale",
               "log = []",
               "grid = [f(k) for k in range(3)]\nlocal_only = 1",
               "def draw(ax, k=1):\n    return grid[k], results, torch, log.append(k)\nlabel = 'k'\nprint(label)"]
    assert demo.saved_names(sources, [False, False, False, False, True]) == ["grid", "log", "results", "torch"]


def test_lecture_cache_round_trip_keeps_notebook_functions_on_the_notebook_namespace(tmp_path):
    """Functions saved by value read and rebind the namespace they are loaded into, as if
    their cells had run there; a value that does not pickle is named and nothing is written."""
    from coursekit import lecture_cache

    saved = {"__name__": "__main__"}
    exec("import math\nCOUNT = [0]\nscale = 3\n"
         "def bump():\n    COUNT[0] += 1\n    return COUNT[0] * scale * math.pi / math.pi\n"
         "class Box:\n    def __init__(self, v):\n        self.v = v\n    def twice(self):\n        return bump() + self.v\n"
         "box = Box(10)", saved)
    path = tmp_path / "cache" / "toy.pkl"
    assert lecture_cache.save(path, ["bump", "box", "COUNT", "missing_name"], saved) == []
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    loaded = {"__name__": "__main__"}
    assert lecture_cache.load(path, loaded)
    assert loaded["bump"]() == 3 and loaded["box"].twice() == 16  # scale came with bump
    loaded["scale"] = 100  # a rebinding in the notebook reaches the loaded function
    assert loaded["bump"]() == 300 and loaded["COUNT"] == [3]
    assert saved["COUNT"] == [0], "the saved namespace is untouched"

    saved["bar"] = (i for i in range(3))  # a generator cannot be pickled
    problems = lecture_cache.save(tmp_path / "cache" / "other.pkl", ["bump", "bar"], saved)
    assert len(problems) == 1 and problems[0].startswith("bar: TypeError")
    assert not (tmp_path / "cache" / "other.pkl").exists()
    assert not lecture_cache.load(tmp_path / "none.pkl", loaded)
    (tmp_path / "bad.pkl").write_bytes(b"not a pickle")
    assert not lecture_cache.load(tmp_path / "bad.pkl", loaded)


def test_cache_key_follows_the_chapter_source_and_fast_mode(monkeypatch):
    monkeypatch.setenv("COURSE_FAST", "1")
    fast_key = demo.cache_key("ch00_memory")
    assert demo.cache_file("ch00_memory").startswith("cache/ch00_memory-fast-")
    assert demo.cache_key("ch02_checkpointing") != fast_key
    monkeypatch.setenv("COURSE_FAST", "0")
    assert demo.cache_key("ch00_memory") != fast_key and "-full-" in demo.cache_file("ch00_memory")
    monkeypatch.setattr(demo, "_course_digest", lambda: "another torch")
    monkeypatch.setenv("COURSE_FAST", "1")
    assert demo.cache_key("ch00_memory") != fast_key


def _toy_dashboard(monkeypatch, counter):
    import nbformat

    v4 = nbformat.v4
    nb = v4.new_notebook(cells=[
        v4.new_markdown_cell("# Chapter 99 — Toy\n\nOne line."),
        v4.new_code_cell("import math", metadata={"tags": ["setup"]}),
        v4.new_markdown_cell("## 1. Measure it"),
        v4.new_code_cell("factor = 2"),
        v4.new_code_cell(f"with open({str(counter)!r}, 'a') as f:\n    f.write('ran ')\n"
                         "table = {k: math.sqrt(k) for k in range(4)}\n"
                         "def lookup(k):\n    return table[k] * factor"),
        v4.new_markdown_cell("## 2. Play with it"),
        v4.new_code_cell("print('demo', lookup(3))", metadata={"tags": ["demo"]})],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}, "language_info": {"name": "python"}})
    monkeypatch.setattr(demo, "read_source", lambda chapter, demo_tags=False: nb)
    monkeypatch.setattr(demo, "cache_key", lambda chapter, src=None: "k1")
    return demo.dashboard("ch99_toy")


def test_a_dashboard_saves_its_measurements_and_the_next_open_skips_them(monkeypatch, tmp_path):
    """The first run of a dashboard saves what its demo reads; the second loads it and runs no
    hidden cell (the counter file is written once), and shows the same demo output."""
    import copy

    import nbclient

    from grader.timing import KERNEL_OPTIONS

    counter = tmp_path / "ran.txt"
    nb = _toy_dashboard(monkeypatch, counter)
    assert len(nb.metadata.course.sections) == len(nb.cells)
    assert nb.metadata.course.sections[-2:] == ["2. Play with it", "saving the measurements for the next open"]
    hidden = [c for c in nb.cells if c.cell_type == "code" and not is_demo(c)]
    assert all(c.source.startswith(demo.SKIP_MARK) for c in hidden[2:-1])
    outputs = []
    for _ in range(2):
        run = copy.deepcopy(nb)
        nbclient.NotebookClient(run, timeout=300, **KERNEL_OPTIONS, resources={"metadata": {"path": str(tmp_path)}}).execute()
        outputs.append([o.get("text", "") for c in run.cells if c.cell_type == "code" for o in c.outputs])
    assert counter.read_text() == "ran ", "the second open ran the hidden cell again"
    assert (tmp_path / "cache" / "ch99_toy-fast-k1.pkl").exists() or (tmp_path / "cache" / "ch99_toy-full-k1.pkl").exists()
    assert "demo 3.4641016151377544\n" in outputs[0] and "demo 3.4641016151377544\n" in outputs[1]
    assert f"{demo.SAVE_MARKER} []\n" in outputs[0] and not any(demo.SAVE_MARKER in o for o in outputs[1])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    dest = tmp_path_factory.mktemp("demo")
    return dest, demo.build(dest)


def test_build_writes_a_dashboard_per_chapter_with_demos(built):
    dest, listed = built
    with_demos = [ch for ch in chapters() if any(c.cell_type == "code" and is_demo(c)
                                                 for c in read_source(ch, demo_tags=True).cells)]
    assert listed == with_demos and "ch00_memory" in listed
    assert sorted(p.stem for p in dest.glob("*.ipynb")) == sorted(listed)


@pytest.mark.parametrize("chapter", ["ch00_memory", "ch10_flash_attention"])
def test_dashboard_shows_demo_cells_and_hides_the_rest(chapter, built):
    import nbformat

    dest, _ = built
    nb = nbformat.read(dest / f"{chapter}.ipynb", as_version=4)
    src = read_source(chapter, demo_tags=True)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].source == demo.LECTURE_SETUP
    assert len(nb.metadata.course.sections) == len(nb.cells) and nb.metadata.course.chapters[0][0] == "ch00_memory"
    assert [c.source for c in code if is_demo(c)] == [c.source for c in src.cells if c.cell_type == "code" and is_demo(c)]
    assert all(is_demo(c) or c.metadata["tags"] == [demo.HIDE_TAG] for c in code)
    text = "\n".join(c.source for c in nb.cells)
    assert "run_hidden" not in text, "graded test cells never run in a dashboard"
    for c in code:
        ast.parse(c.source)
    assert code[1].source.startswith("from coursekit import lecture_cache") and demo.CACHE_DIR in code[1].source
    assert all(c.source.startswith(demo.SKIP_MARK) for c in code[2:-1] if not is_demo(c))
    title = next(c.source for c in nb.cells if "title" in c.metadata.get("tags", []))
    assert title.startswith("# ") and "Chapter" not in title.splitlines()[0]


def test_index_page_lists_chapters_with_links(built):
    dest, listed = built
    page = (dest / "share" / "voila" / "templates" / demo.TEMPLATE / "tree-lab.html").read_text()
    for ch in listed:
        title, summary = demo.title_and_summary(read_source(ch))
        assert f'voila/render/{ch}.ipynb"' in page and title in page
        assert summary and "\\" not in summary and "$" not in summary


def test_template_needs_no_network(built):
    dest, _ = built
    for path in (dest / "share").rglob("*"):
        if path.is_file():
            assert not re.search(r"https?://", path.read_text()), f"{path.name} loads something from the network"


def test_makefile_offers_demo_and_instructor_lab():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo: .*\n\t.*-m grader demo --port=\$\(PORT\)", makefile, re.M)
    assert re.search(r"^demo-warm: .*\n\t.*-m grader demo --warm \$\(CHAPTERS\)", makefile, re.M)
    assert re.search(r"^lab: .*\n\tJUPYTER_CONFIG_PATH=\$\(CURDIR\)/config/student ", makefile, re.M)
    assert re.search(r"^lab-instructor: ", makefile, re.M)


# --- slider_plot ----------------------------------------------------------------------------

@pytest.fixture
def shown(monkeypatch):
    """What slider_plot displays, with ``with output:`` capture made to fail: the figure must
    reach the output widget as a finished image."""
    import ipywidgets
    from coursekit import widgets as course_widgets

    def no_capture(self):
        raise AssertionError("slider_plot captured output with `with out:`")

    monkeypatch.setattr(ipywidgets.Output, "__enter__", no_capture)
    found = []
    monkeypatch.setattr(course_widgets, "display", found.append)
    return found


def _parts(box):
    """The controls of a slider_plot keyed by their keyword, and its output widget."""
    rows, _reset, out = box.children
    return {r.children[0]._course_name: r.children[0] for r in rows.children}, out


def test_slider_plot_draws_into_the_output_widget_and_redraws_on_change(shown):
    from coursekit.widgets import slider_plot

    calls = []

    def draw(ax, k=1, kind="a", scale=1.0):
        calls.append((k, kind, scale))
        ax.plot([0, k * scale])
        ax.set_title(kind)

    assert slider_plot(draw, k=(1, 8, 1), kind=["a", "b"], scale=2.0, defaults={"k": 3}) is None
    controls, out = _parts(shown[0])
    assert set(controls) == {"k", "kind"} and calls == [(3, "a", 2.0)]
    assert not controls["k"].continuous_update  # redraw on release, not on every pixel
    first = out.outputs
    assert [o["output_type"] for o in first] == ["display_data"] and "image/png" in first[0]["data"]
    assert out.msg_id == ""  # nothing was captured
    controls["k"].value = 5
    controls["kind"].value = "b"
    assert calls[1:] == [(5, "a", 2.0), (5, "b", 2.0)]
    assert len(out.outputs) == 1 and out.outputs[0]["data"]["image/png"] != first[0]["data"]["image/png"]


def test_slider_plot_shows_a_later_error_in_place_of_the_plot_and_raises_the_first(shown):
    from coursekit.widgets import slider_plot

    def draw(ax, k=1):
        if k == 2:
            raise ValueError("k=2 is not drawable")
        ax.plot([0, k])

    slider_plot(draw, k=(1, 4, 1))
    controls, out = _parts(shown[0])
    controls["k"].value = 2
    assert out.outputs[0]["output_type"] == "error" and out.outputs[0]["ename"] == "ValueError"
    controls["k"].value = 3
    assert out.outputs[0]["output_type"] == "display_data"
    with pytest.raises(ValueError, match="not drawable"):
        slider_plot(draw, k=(2, 4, 1))


def test_a_slider_cell_run_by_nbclient_sends_nothing_back_to_the_kernel(monkeypatch):
    """nbclient (which runs the lecture dashboards and the notebook tests) writes a captured
    output back to the kernel on the shell channel while it waits there for the cell's reply; a
    reply that arrived during such a write was missed, and the dashboard waited for it forever
    ("Executing x of y" with the kernel idle). slider_plot must give it nothing to write back."""
    import nbclient
    import nbformat
    from nbclient.output_widget import OutputWidget

    from grader.timing import KERNEL_OPTIONS

    sent = []
    monkeypatch.setattr(OutputWidget, "send", lambda self, *a, **k: sent.append(a))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from coursekit.widgets import slider_plot\n"
        "slider_plot(lambda ax, k=1: ax.plot([0, k]), k=(1, 4, 1))")])
    nbclient.NotebookClient(nb, timeout=120, **KERNEL_OPTIONS,
                            resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = nb.cells[0].outputs
    assert [o.output_type for o in outputs] == ["display_data"], outputs
    assert "application/vnd.jupyter.widget-view+json" in outputs[0].data
    assert sent == []


def test_lecture_mode_turns_off_notebook_progress_bars(monkeypatch):
    """A demo cell that trains shows no progress bar on the projector (tqdm's notebook bars
    ignore TQDM_DISABLE, and a bar's box came before the demo's controls)."""
    import matplotlib
    from tqdm import notebook

    from coursekit.widgets import lecture_mode

    monkeypatch.setattr(notebook.tqdm_notebook, "__init__", notebook.tqdm_notebook.__init__)
    assert not notebook.tqdm(range(2)).disable
    with matplotlib.rc_context():
        lecture_mode()
        lecture_mode()  # idempotent
    bar = notebook.tqdm(range(3), desc="training")
    assert bar.disable and list(bar) == [0, 1, 2]
