"""Build nbgrader-style submission folders for tests: SUB/<student>/<chapter>/<chapter>.ipynb, and read back the
reasons of a graded one's feedback page."""
import html
import re
from pathlib import Path

import nbformat

from conftest import ROOT
from grader.notebooks import grade_id, read_source


def reference(chapter: str) -> nbformat.NotebookNode:
    return read_source(chapter)


def blank(chapter: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "course" / f"{chapter}.ipynb", as_version=4)


def with_exercise(chapter: str, exercise: str, source: str, base=None) -> nbformat.NotebookNode:
    """The reference notebook with one exercise cell's source replaced."""
    nb = base if base is not None else reference(chapter)
    cells = [c for c in nb.cells if grade_id(c) == exercise]
    assert cells, f"{chapter} has no exercise {exercise}"
    cells[0].source = source
    return nb


def with_outputs(nb: nbformat.NotebookNode, nbytes: int = 8 * 1024**2) -> nbformat.NotebookNode:
    """``nb`` as a student hands it in after running it: PNG outputs (``nbytes`` of base64 in all) on
    its code cells that are neither exercises nor graded tests, and a long printed table."""
    import base64
    import random

    cells = [c for c in nb.cells if c.cell_type == "code" and not c.get("metadata", {}).get("nbgrader")]
    rng = random.Random(0)
    per = nbytes // max(1, len(cells))
    for i, cell in enumerate(cells):
        png = base64.b64encode(rng.randbytes(per * 3 // 4)).decode()
        cell.outputs = [nbformat.v4.new_output("display_data", data={"image/png": png, "text/plain": "<Figure>"}),
                        nbformat.v4.new_output("stream", name="stdout", text="step, loss\n" + "".join(
                            f"{j}, {rng.random():.4f}\n" for j in range(200)))]
        cell.execution_count = i + 1
    return nb


def write(sub: Path, student: str, chapter: str, nb) -> Path:
    d = sub / student / chapter
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{chapter}.ipynb"
    if isinstance(nb, str):
        path.write_text(nb)
    else:
        nbformat.write(nb, path)
    return path


def reasons(feedback: Path) -> dict[str, str]:
    """grade_id -> reason, read back from a feedback page (``OUT/feedback/<student>/<chapter>.html``)."""
    text = feedback.read_text(encoding="utf-8")
    found = re.findall(r"<h3><code>([^<]*)</code></h3><div class='reason'>(.*?)</div>", text, re.S)
    return {html.unescape(gid): html.unescape(reason) for gid, reason in found}
