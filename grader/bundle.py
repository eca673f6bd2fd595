"""``python -m grader bundle OUT``: what students receive, as one folder to publish.

OUT/
  README.md        how to start, and the README's "Guide for students" (copied from README.md)
  Makefile         `make lab`: a .venv with pip (Python 3.11), the packages below, JupyterLab on course/
  pyproject.toml   the packages students need, pinned as in the course's own pyproject.toml
  LICENSE, .gitignore
  course/          the released notebooks (course/*.ipynb: no solutions, no hidden tests)
  coursekit/, kernels/  the packages the notebooks import (their .py files)
  data/            what the notebooks load (data/checkpoints/*.pt)

Nothing of grader/, solutions/, tests/ or config/ is copied. The bundle is built in a temporary folder
beside OUT and moved into place at the end, so a failure leaves OUT as it was. An OUT that holds an
earlier bundle (its ``.course-bundle`` marker) is replaced, keeping its ``.git``; any other non-empty
OUT is refused.
"""
from __future__ import annotations

import json
import re
import shutil
import tempfile
import tomllib
import zipfile
from pathlib import Path

from grader.notebooks import COURSE, ROOT, chapters

MARKER = ".course-bundle"
PACKAGES = ("coursekit", "kernels")
# Distributions the notebooks, coursekit and kernels import (the tests check the list against their imports);
# pins come from the course's pyproject.toml. nbgrader, jupytext, voila, SQLAlchemy and the sandbox's
# packages are the instructor's and stay out.
STUDENT_DEPENDENCIES = ("torch", "triton", "numpy", "matplotlib", "scikit-learn", "tqdm", "ipywidgets",
                        "jupyterlab", "ipykernel")
KEEP = (".git", ".venv")  # what an earlier bundle in OUT keeps when it is replaced (history, an installed venv)

MAKEFILE = """\
# `make lab` creates .venv with pip (Python 3.11) on first use, installs the pinned packages of
# pyproject.toml (reinstalled when it changes) and opens the course in JupyterLab (headless: it prints the URL).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PORT ?= 8888
export PATH := $(abspath $(BIN)):$(PATH)
# Jupyter refuses to run as root (containers) unless told it may.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: lab clean help

help:
\t@echo "make lab    open the course in JupyterLab (prints the URL; PORT=... to change the port)"
\t@echo "make clean  remove .venv"

$(STAMP): pyproject.toml
\t@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
\t$(BIN)/python -m pip install --quiet --upgrade pip
\t$(BIN)/python -m pip install --quiet -e .
\t@touch $(STAMP)

# Kernels on Unix sockets: no TCP port race between kernels started at the same time.
lab: $(STAMP)
\t$(BIN)/python -m jupyterlab --no-browser --ip=127.0.0.1 --port=$(PORT) $(ALLOW_ROOT) --ServerApp.root_dir=$(CURDIR) \\
\t\t--KernelManager.transport=ipc --LabApp.default_url=/lab/tree/course

clean:
\trm -rf $(VENV)
"""

GITIGNORE = """\
.venv/
__pycache__/
*.pyc
.ipynb_checkpoints/
*.egg-info/
"""


def student_dependencies(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The pinned requirements of :data:`STUDENT_DEPENDENCIES`, as the course's pyproject.toml writes them."""
    found = {}
    for req in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
        name = re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower()
        found[name] = req
    missing = [d for d in STUDENT_DEPENDENCIES if d not in found]
    if missing:
        raise ValueError(f"{pyproject} does not pin {', '.join(missing)}, which the student bundle needs")
    return [found[d] for d in STUDENT_DEPENDENCIES]


def pyproject_text() -> str:
    main = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = "".join(f"    {json.dumps(d)},\n" for d in student_dependencies())
    return f"""[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "efficient-training-course-student"
version = "{main["version"]}"
description = {json.dumps(main["description"] + " (student edition)")}
requires-python = "{main["requires-python"]}"
# Pinned so that every student gets exactly what the course was tested with
# (torch==2.13.0 resolves to the CPU wheel).
dependencies = [
{deps}]

[tool.setuptools]
packages = {json.dumps(list(PACKAGES))}
"""


def readme_text() -> str:
    """How to start, then the course README's student guide (and what needs a GPU), verbatim."""
    readme = (ROOT / "README.md").read_text()
    sections = {m.group(1): m.group(0) for m in re.finditer(r"^## (.+?)\n.*?(?=^## |\Z)", readme, re.M | re.S)}
    wanted = ["Chapters", "What needs a GPU", "Guide for students"]
    missing = [s for s in wanted if s not in sections]
    if missing:
        raise ValueError(f"README.md has no section {', '.join(missing)}: the bundle's README copies them")
    body = "".join(sections[s] for s in wanted)
    body = re.sub(r"^(!\[.*|<!--.*-->)\n\n?", "", body, flags=re.M)  # the screenshots stay in the course's repository
    body = re.sub(r" [^.]*`config/student/`[^.]*\.", "", body)  # the course's lab settings are not shipped
    title = readme.splitlines()[0]
    return f"""{title}

## Start

On Linux or macOS with Python 3.11 and `make`:

```
make lab     # creates .venv with pip, installs the pinned packages, opens the course in JupyterLab
```

`make lab` runs headless and prints the URL (with its token) to open in a browser; set `PORT=...` to change
the port. Open `course/ch00_memory.ipynb` first. Hand in each chapter's notebook as your instructor says.

{body.rstrip()}
"""


def _check_out(out: Path) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ValueError(f"{out} exists and is not a folder: choose another OUT")
    if out.is_dir() and any(p.name not in KEEP for p in out.iterdir()) and not (out / MARKER).exists():
        raise ValueError(f"{out} is not empty and holds no earlier bundle ({MARKER}): choose a new or empty "
                         "folder, so that nothing of yours is overwritten")


def build(out: Path, zip_path: Path | None = None) -> list[Path]:
    """Write the student bundle to ``out`` (see the module's docstring); returns the files written.

    With ``zip_path``, also writes that zip archive of the bundle (its entries under ``<out's name>/``)."""
    out = Path(out)
    _check_out(out)
    notebooks = [COURSE / f"{ch}.ipynb" for ch in chapters()]
    missing = [p.name for p in notebooks if not p.exists()]
    if missing:
        raise FileNotFoundError(f"released notebooks missing in {COURSE}: {', '.join(missing)} "
                                "(run `python -m grader release`)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / "course").mkdir()
        for nb in notebooks:
            shutil.copy2(nb, tmp / "course" / nb.name)
        for pkg in PACKAGES:
            for src in sorted((ROOT / pkg).rglob("*.py")):
                dest = tmp / src.relative_to(ROOT)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest)
        shutil.copytree(ROOT / "data", tmp / "data", ignore=shutil.ignore_patterns("__pycache__", ".*"))
        shutil.copy2(ROOT / "LICENSE", tmp / "LICENSE")
        (tmp / "Makefile").write_text(MAKEFILE)
        (tmp / "pyproject.toml").write_text(pyproject_text())
        (tmp / "README.md").write_text(readme_text())
        (tmp / ".gitignore").write_text(GITIGNORE)
        (tmp / MARKER).write_text("written by `python -m grader bundle`; replaced whole by the next one\n")
        if zip_path is not None:
            _zip(tmp, Path(zip_path), out.name)
        _replace(out, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(p for p in out.rglob("*") if p.is_file() and not p.relative_to(out).parts[0] in KEEP)


def _zip(tree: Path, zip_path: Path, top: str) -> None:
    zip_path.parent.mkdir(parents=True, exist_ok=True)
    part = zip_path.with_name(zip_path.name + ".part")
    with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(tree.rglob("*")):
            if p.is_file():
                z.write(p, f"{top}/{p.relative_to(tree)}")
    part.replace(zip_path)


def _replace(out: Path, new: Path) -> None:
    """Move the new bundle's entries into ``out``; the entries of an earlier bundle go first (``.git`` stays)."""
    out.mkdir(exist_ok=True)
    for old in out.iterdir():
        if old.name in KEEP:
            continue
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink()
    for entry in new.iterdir():
        entry.rename(out / entry.name)
