"""A visible test cell first runs its exercise the way the grader will (``coursekit.graded``).

Grading runs only the setup cells and the exercise cells, in a fresh namespace, so an exercise
that reads a name imported in an experiment cell passes its visible test in the student's kernel
and fails grading with a NameError. The release starts every graded test cell with
``check_as_graded(chapter, exercise)``, which shows the student that NameError in the notebook.
Here: the free-name analysis, the helper on a small chapter of its own, and released notebooks
executed in a kernel.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import types

import nbformat
import numpy as np
import pytest
import torch

from conftest import ROOT
from coursekit import graded
from coursekit.graded import BUILTINS, check, global_reads, module_bindings
from submissions import reference, with_exercise

CHAPTER = "ch99_visible"


def _free(source: str) -> set[str]:
    """What a cell needs from elsewhere, statically: its global reads less its own bindings and builtins."""
    source = textwrap.dedent(source)
    return set(global_reads(source) - module_bindings(source) - BUILTINS)


# --- the analysis ------------------------------------------------------------------------------

def test_nested_functions_read_globals_not_enclosing_locals():
    assert _free("""
        def outer(scale):
            offset = 1
            def inner(x):
                return np.sum(x) * scale + offset
            return inner
        """) == {"np"}


def test_class_bodies_do_not_enclose_their_methods():
    # A method does not see its class's names: `size` there is a global (and undefined).
    assert _free("""
        class Box(nn.Module):
            size = math.pi
            def area(self):
                return size * self.size
        """) == {"nn", "math", "size"}


def test_comprehensions_lambdas_and_parameters():
    assert _free("""
        def f(k, np=None):
            squares = [i * k for i in range(n) if i not in skip]
            pick = lambda t: t + offset
            return {j: pick(j) for j in squares}, np
        """) == {"n", "skip", "offset"}


def test_global_declarations_bind_the_module_name():
    source = textwrap.dedent("""
        def bump():
            global counter, total
            counter += 1
            total = 0
            return limit
        """)
    assert {"counter", "total", "bump"} <= module_bindings(source)
    assert _free(source) == {"limit"}


def test_names_bound_later_in_the_cell_and_builtins_are_not_missing():
    assert _free("""
        def f(x):
            return helper(len(x)) + abs(min(x)) + CONSTANT
        def helper(n):
            return n * 2
        CONSTANT = 3
        """) == set()


def test_imports_inside_the_function_count():
    assert _free("""
        def f(x):
            import numpy as np
            from math import prod
            return np.asarray(x).sum() + prod(x)
        """) == set()


def test_names_only_in_annotations_are_not_needed():
    # The grader compiles cells with ``from __future__ import annotations``: never evaluated.
    src = "def f(x: np.ndarray) -> Tensor:\n    y: Bar = 1\n    return torch.relu(x)\n"
    assert global_reads(src) == {"torch"}


def test_a_cell_that_does_not_parse_reads_nothing():
    assert global_reads("def f(:\n") == frozenset()


def test_defines_is_the_graders_rule():
    from grader.notebooks import defines as graders_defines

    for source, name, expected in [("def f():\n    pass", "f", True), ("class C:\n    pass", "C", True),
                                   ("f = lambda: 1", "f", True), ("def g():\n    f = 1", "f", False),
                                   ("import f", "f", False), ("def f(:", "f", False)]:
        assert graded.defines(source, name) is expected
        assert graders_defines(source, name) is expected


# --- the helper on a chapter of its own ----------------------------------------------------------

def _chapter(folder, setup="import math\n", exercises=("area", "scaled")):
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell("# A small chapter"))
    cell = nbformat.v4.new_code_cell(setup)
    cell.metadata["tags"] = ["setup"]
    nb.cells.append(cell)
    nb.cells.append(nbformat.v4.new_code_cell("import numpy as np  # an experiment cell"))
    for name in exercises:
        cell = nbformat.v4.new_code_cell(f"def {name}(r):\n    # YOUR CODE HERE\n    raise NotImplementedError()")
        cell.metadata["nbgrader"] = {"grade": False, "grade_id": name, "locked": False, "schema_version": 3,
                                     "solution": True, "task": False}
        nb.cells.append(cell)
        cell = nbformat.v4.new_code_cell(f'check_as_graded("{CHAPTER}", "{name}")\nassert {name}(1) > 0')
        cell.metadata["nbgrader"] = {"grade": True, "grade_id": f"test_{name}", "locked": True, "points": 1,
                                     "schema_version": 3, "solution": False, "task": False}
        nb.cells.append(cell)
    nbformat.write(nb, folder / f"{CHAPTER}.ipynb")


@pytest.fixture
def chapter_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _chapter(tmp_path)
    return tmp_path


def _check(exercise, *cells, user_ns=None):
    return check(CHAPTER, exercise, ["", *cells], user_ns or {})


AREA = "def area(r):\n    return math.pi * r ** 2\n"


def test_a_name_imported_only_in_an_experiment_cell_is_named_with_its_import(chapter_dir):
    problem = _check("area", "import numpy as np", "def area(r):\n    return np.pi * r ** 2\n")
    assert problem == ("`area` uses `np`, which the grader will not have: grading runs only the setup cells and "
                       "the exercise cells. Import it inside the exercise cell (`import numpy as np`) or use what "
                       "the setup cells provide.")


def test_every_missing_name_is_named(chapter_dir):
    problem = _check("area", "import numpy as np\nfrom statistics import mean as avg",
                     "def area(r):\n    return np.pi * avg([r]) ** 2 + helper(r) + typo\n",
                     "def helper(r):\n    return 0\n", user_ns={"helper": len})
    assert problem.startswith("`area` uses `avg`, `helper`, `np` and `typo`, which the grader will not have")
    assert "Import them inside the exercise cell (`from statistics import mean as avg`, `import numpy as np`)" in problem
    assert "`helper` is defined in another cell of yours: define it inside the exercise cell instead." in problem
    assert "`typo` is not defined in this kernel either." in problem


def test_the_import_comes_from_the_kernel_when_the_history_lacks_it(chapter_dir):
    problem = _check("area", "def area(r):\n    return F.relu(r)\n", user_ns={"F": torch.nn.functional})
    assert "(`import torch.nn.functional as F`)" in problem
    problem = _check("area", "def area(r):\n    return prod([r])\n", user_ns={"prod": __import__("math").prod})
    assert "(`from math import prod`)" in problem


def test_course_packages_are_not_suggested_as_answers(chapter_dir):
    problem = _check("area", "from coursekit import fast", "def area(r):\n    return fast(r, 1)\n")
    assert "Import it" not in problem
    assert "`fast` comes from `from coursekit import fast`, which an exercise cell may not import" in problem


def test_a_correct_cell_is_silent(chapter_dir, capsys):
    assert _check("area", "import numpy as np", AREA) is None
    assert _check("area", "def area(r):\n    import numpy as np\n    return np.pi * r * r\n") is None
    assert capsys.readouterr() == ("", "")


def test_the_latest_definition_is_checked(chapter_dir):
    broken = "def area(r):\n    return np.pi * r ** 2\n"
    assert _check("area", "import numpy as np", broken, AREA) is None
    assert "`np`" in _check("area", "import numpy as np", AREA, broken)
    # An assignment elsewhere (a wrapper in an experiment cell) does not hide the exercise cell.
    assert _check("area", AREA, "area = area") is None


def test_a_cell_that_raises_when_run_fresh_is_reported(chapter_dir):
    problem = _check("area", "HALF = 1 / 0\n" + AREA)
    assert problem.startswith("`area`'s cell raises ZeroDivisionError (division by zero) when it runs the way the "
                              "grader runs it")
    # A module the grader does not offer is refused before anything runs, with the grader's reason.
    problem = _check("area", "import not_a_module_of_this_course\n" + AREA)
    assert problem.startswith("the grader did not run your area cell") and "import not_a_module_of_this_course" in problem
    # A NameError at the top of a cell (a decorator) names the missing name.
    problem = _check("area", "import functools", "@functools.cache\n" + AREA)
    assert "`area` uses `functools`" in problem and "(`import functools`)" in problem


def test_earlier_exercises_count_only_when_this_one_needs_them(chapter_dir):
    broken_area = "def area(r):\n    return np.pi * r ** 2\n"
    assert _check("scaled", "import numpy as np", broken_area, "def scaled(r):\n    return 2 * r\n") is None
    problem = _check("scaled", "import numpy as np", broken_area, "def scaled(r):\n    return 2 * area(r)\n")
    assert "`area` uses `np`" in problem
    # An earlier exercise never run in this kernel is taken as saved in the notebook, as the grader does.
    assert _check("scaled", "def scaled(r):\n    return 2 * area(r)\n") is None
    # A later exercise's name is defined by the time the grader calls anything.
    assert _check("area", "def area(r):\n    return scaled(r) / 2\n") is None


def test_del_runs_as_the_grader_runs_it(chapter_dir):
    problem = _check("area", "import math as m\ndef area(r):\n    return m.pi * r * r\ndel m\n")
    assert "`area` uses `m`" in problem and "(`import math as m`)" in problem


@pytest.mark.parametrize("cell, construct", [
    ("import os\n" + AREA, "import os"),
    ("%time x = 1\n" + AREA, "a line magic"),
    ("def area(r):\n    return math.pi * r * r\nget_ipython().run_line_magic('time', 'x = area(1)')\n", "get_ipython"),
    ("import operator\ndef area(r):\n    return operator.attrgetter('pi')(math) * r * r\n", "operator.attrgetter"),
])
def test_a_cell_the_grader_refuses_is_refused_by_the_visible_check_with_the_same_reason(chapter_dir, cell, construct):
    """The visible check reads the cell as typed against the grader's source policy: a correct answer the grader
    would not run fails its visible test with the very reason its feedback would give."""
    from grader.source_policy import refusals

    problem = _check("area", cell)
    assert problem == refusals(CHAPTER, ("import math\n",), {"area": cell})["area"]
    assert problem.startswith("the grader did not run your area cell, so its test cells score 0") and construct in problem


def test_the_chapters_own_prohibitions_reach_the_visible_check(tmp_path, monkeypatch):
    """The release writes each chapter's policy into its notebook: ch02's text forbids torch.utils.checkpoint,
    and the visible check of the released chapter refuses it with the grader's reason."""
    from grader.notebooks import layout, read_source
    from grader.source_policy import refusals

    monkeypatch.chdir(tmp_path)
    cell = ("def checkpoint(fn, *args):\n    import torch.utils.checkpoint\n"
            "    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)\n")
    problem = check("ch02_checkpointing", "checkpoint", ["", cell], {})
    setup = layout(read_source("ch02_checkpointing"), "ch02_checkpointing").setup
    assert problem == refusals("ch02_checkpointing", setup, {"checkpoint": cell})["checkpoint"]
    assert "the chapter's text forbids it" in problem


@pytest.mark.parametrize("module", ["operator", "re", "string", "random", "fractions", "decimal"])
def test_standard_modules_plain_code_uses_pass_the_visible_check(chapter_dir, module):
    cell = f"import {module}\n" + AREA
    assert _check("area", cell) is None


def test_an_exercise_not_run_yet_is_left_to_the_test(chapter_dir):
    assert _check("area", "import numpy as np") is None


def test_a_missing_notebook_or_exercise_skips_with_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert _check("area", "def area(r):\n    return np.pi\n") is None
    out = capsys.readouterr().out
    assert out.startswith("Note: `area` was not run the way the grader runs it")
    assert f"neither {CHAPTER}.ipynb in the working directory ({tmp_path}) nor the course's" in out
    _chapter(tmp_path)
    assert _check("volume", "def volume(r):\n    return np.pi\n") is None
    assert "has no exercise cell `volume`" in capsys.readouterr().out
    (tmp_path / f"{CHAPTER}.ipynb").write_text("{ half a notebook")
    assert _check("area", "def area(r):\n    return np.pi\n") is None
    assert "could not be read (JSONDecodeError)" in capsys.readouterr().out


def test_the_repository_release_is_found_from_the_package(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert graded.find_notebook("ch00_memory") == ROOT / "course" / "ch00_memory.ipynb"
    _chapter(tmp_path)
    assert graded.find_notebook(CHAPTER) == tmp_path / f"{CHAPTER}.ipynb"
    assert graded.find_notebook("ch99_nowhere") is None


def test_the_rngs_and_the_output_are_left_as_they_were(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _chapter(tmp_path, setup="import math, random\nimport numpy, torch\nrandom.seed(1); numpy.random.seed(1)\n"
                             "torch.manual_seed(1)\nprint('setup says hello')\nimport warnings; warnings.warn('w')\n")
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    torch.rand(3)
    before = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    drawing = "def area(r):\n    return math.pi * r * r\nprint(torch.rand(2), random.random(), numpy.random.rand())\n"
    assert _check("area", drawing) is None
    after = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    assert after[0] == before[0]
    assert all(np.array_equal(a, b) for a, b in zip(after[1], before[1]))
    assert torch.equal(after[2], before[2])
    assert capsys.readouterr() == ("", "")


def test_the_setup_runs_once_per_kernel_and_setup(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(graded, "_SETUP_CACHE", {})
    probe = types.SimpleNamespace(runs=0)
    monkeypatch.setitem(sys.modules, "graded_probe", probe)
    _chapter(tmp_path, setup="import math\nimport graded_probe\ngraded_probe.runs += 1\n")
    for _ in range(3):
        assert _check("area", AREA) is None
    assert probe.runs == 1
    (cached,) = graded._SETUP_CACHE.values()
    assert "area" not in cached, "each check runs the exercise cells in a copy"
    _chapter(tmp_path, setup="import math\nimport graded_probe\ngraded_probe.runs += 1  # changed\n")
    assert _check("area", AREA) is None
    assert probe.runs == 2


def test_outside_ipython_it_does_nothing(monkeypatch, capsys):
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    assert graded.check_as_graded("ch99_nowhere", "area") is None
    assert capsys.readouterr() == ("", "")


def test_in_an_ipython_shell_the_kernel_history_is_read(tmp_path):
    """The real IPython: its ``In`` holds each cell as run (magics turned into calls)."""
    _chapter(tmp_path)
    script = textwrap.dedent(f"""
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config
        config = Config()
        config.HistoryManager.hist_file = ":memory:"
        shell = InteractiveShell.instance(config=config)
        def run(source):
            return shell.run_cell(source, store_history=True)
        run("import numpy as np")
        run("def area(r):\\n    return np.pi * r * r")
        first = run("from coursekit.graded import check_as_graded; check_as_graded('{CHAPTER}', 'area')")
        run("%time x = 1\\ndef area(r):\\n    import numpy as np\\n    return np.pi * r * r")
        second = run("check_as_graded('{CHAPTER}', 'area')")
        run("def area(r):\\n    import numpy as np\\n    return np.pi * r * r")
        third = run("check_as_graded('{CHAPTER}', 'area')")
        print("FIRST", type(first.error_in_exec).__name__, first.error_in_exec)
        print("SECOND", type(second.error_in_exec).__name__, second.error_in_exec)
        print("THIRD", third.error_in_exec)
        """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), "IPYTHONDIR": str(tmp_path / "ipython")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FIRST NameError `area` uses `np`" in proc.stdout and "(`import numpy as np`)" in proc.stdout
    # The cell as typed holds a magic: the grader would refuse it, and the visible check says so in its words.
    assert "SECOND RefusedByTheGrader the grader did not run your area cell" in proc.stdout
    assert "a line magic (%...)" in proc.stdout
    assert "THIRD None" in proc.stdout


# --- released notebooks in a kernel --------------------------------------------------------------

RELEASED = "ch04_partial_training"
NUMPY_PACK_BITS = '''def pack_bits(mask):
    """Pack a boolean tensor 8 elements to a byte (numpy's packbits)."""
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be torch.bool, got {mask.dtype}")
    return torch.from_numpy(np.packbits(mask.reshape(-1).numpy(), bitorder="little"))
'''


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    from grader.release import release

    out = tmp_path_factory.mktemp("released")
    release([RELEASED], dest=out)
    return nbformat.read(out / f"{RELEASED}.ipynb", as_version=4)


def _solved(released_nb) -> nbformat.NotebookNode:
    nb = nbformat.from_dict(released_nb)  # a copy
    for cell in reference(RELEASED).cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            nb = with_exercise(RELEASED, cell.metadata["nbgrader"]["grade_id"], cell.source, base=nb)
    return nb


def _execute(nb, folder):
    import nbclient

    from grader.timing import KERNEL_OPTIONS

    nbformat.write(nb, folder / f"{RELEASED}.ipynb")  # the student's notebook, where the kernel runs
    client = nbclient.NotebookClient(nb, timeout=600, **KERNEL_OPTIONS,
                                     allow_errors=True, resources={"metadata": {"path": str(folder)}})
    client.execute()
    return nb


def _errors(cell):
    return [o for o in cell.get("outputs", []) if o.output_type == "error"]


def _grade_id(cell):
    return cell.metadata.get("nbgrader", {}).get("grade_id")


@pytest.mark.slow
def test_a_visible_test_shows_the_name_the_grader_will_miss(released, tmp_path):
    nb = with_exercise(RELEASED, "pack_bits", NUMPY_PACK_BITS, base=_solved(released))
    at = next(i for i, c in enumerate(nb.cells) if _grade_id(c) == "pack_bits")
    nb.cells.insert(at, nbformat.v4.new_code_cell("import numpy as np  # only in the student's kernel"))
    end = next(i for i, c in enumerate(nb.cells) if _grade_id(c) == "test_pack_bits")
    nb.cells = nb.cells[:end + 1]
    nb = _execute(nb, tmp_path)
    *before, test_cell = [c for c in nb.cells if c.cell_type == "code"]
    assert not [e for c in before for e in _errors(c)], "every cell before the visible test runs"
    (error,) = _errors(test_cell)
    assert error.ename == "NameError"
    assert error.evalue.startswith("`pack_bits` uses `np`, which the grader will not have")
    assert "Import it inside the exercise cell (`import numpy as np`)" in error.evalue


@pytest.mark.slow
def test_a_solved_notebook_runs_clean_with_its_checks(released, tmp_path):
    nb = _execute(_solved(released), tmp_path)
    tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert tests and all("check_as_graded" in c.source for c in tests)
    assert not [(c.source[:80], e.evalue) for c in nb.cells for e in _errors(c)]
    notes = [o.get("text", "") for c in tests for o in c.outputs if o.output_type == "stream"]
    assert not any("Note:" in text for text in notes), "the check found the notebook and ran"
