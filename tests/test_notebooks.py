"""Every solution notebook runs top to bottom (fast mode) and passes its own hidden tests in-kernel,
with the line the release puts at the top of each graded test cell: every reference exercise
also runs cleanly the way the grader runs it (setup cells and exercise cells alone)."""
import os
import time

import nbclient
import pytest

from conftest import ROOT
from grader.notebooks import chapters, read_source
from grader.release import with_graded_checks
from grader.timing import KERNEL_OPTIONS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("chapter", chapters())
def test_solution_notebook_executes(chapter, tmp_path):
    nb = with_graded_checks(read_source(chapter), chapter)
    env_fast = os.environ.get("COURSE_FAST")
    assert env_fast == "1", "tests execute notebooks in fast mode"
    client = nbclient.NotebookClient(nb, timeout=600, **KERNEL_OPTIONS,
                                     resources={"metadata": {"path": str(ROOT)}})
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    print(f"{chapter}: executed in {elapsed:.1f} s (fast mode)")
