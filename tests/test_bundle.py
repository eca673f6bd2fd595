"""The student bundle, `python -m grader bundle OUT`: what it holds, that it installs offline in a fresh venv with
its own Makefile, that `make lab` serves it and a notebook's setup runs on the bundle's own packages and data, and
that no solution or hidden-test line is in it."""
import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
import zipfile

import pytest
import requests

from conftest import ROOT
from grader import bundle as bundle_mod
from grader.notebooks import chapters
from test_lab import _free_port, _stop
from test_release import _secret_lines

pytestmark = pytest.mark.xdist_group("bundle")  # one worker builds the bundle once
TOP = {".course-bundle", ".gitignore", "LICENSE", "Makefile", "README.md", "pyproject.toml", "course", "coursekit",
       "data", "kernels"}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("published") / "course-student"
    proc = subprocess.run([sys.executable, "-m", "grader", "bundle", str(out), "--zip", str(out) + ".zip"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"to {out}" in proc.stdout
    return out


def test_the_bundle_holds_what_students_need_and_nothing_else(bundle):
    assert {p.name for p in bundle.iterdir()} - {".venv"} == TOP  # .venv: the install test's
    assert sorted(p.name for p in (bundle / "course").iterdir()) == [f"{ch}.ipynb" for ch in chapters()]
    for ch in chapters():
        assert (bundle / "course" / f"{ch}.ipynb").read_bytes() == (ROOT / "course" / f"{ch}.ipynb").read_bytes()
    for pkg in ("coursekit", "kernels"):
        shipped = {p.relative_to(bundle).as_posix() for p in (bundle / pkg).rglob("*") if p.is_file()}
        assert shipped == {p.relative_to(ROOT).as_posix() for p in (ROOT / pkg).rglob("*.py")}
    assert {p.name for p in (bundle / "data" / "checkpoints").iterdir()} == \
           {p.name for p in (ROOT / "data" / "checkpoints").iterdir()}
    assert "Guide for students" in (bundle / "README.md").read_text()
    with zipfile.ZipFile(f"{bundle}.zip") as z:
        zipped = {n.split("/", 1)[1] for n in z.namelist()}
    assert zipped == {p.relative_to(bundle).as_posix() for p in bundle.rglob("*")
                      if p.is_file() and ".venv" not in p.relative_to(bundle).parts}


def test_the_bundle_pins_what_the_course_pins_and_covers_every_import(bundle):
    main = {re.match(r"[\w.-]+", d).group(0).lower(): d
            for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    deps = tomllib.loads((bundle / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.match(r"[\w.-]+", d).group(0).lower(): d for d in deps}
    assert all(main[n] == d for n, d in names.items()), "a pin differs from the course's pyproject.toml"
    assert not {"nbgrader", "sqlalchemy", "jupytext", "voila", "pyseccomp"} & set(names)
    # Every module the notebooks, coursekit and kernels import is the standard library's, the bundle's own, or
    # comes with a pinned distribution (or with one of theirs: IPython comes with ipykernel).
    sources = [p.read_text() for pkg in ("coursekit", "kernels") for p in (bundle / pkg).rglob("*.py")]
    for nb in (bundle / "course").glob("*.ipynb"):
        sources += ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]
    imported = set()
    for src in sources:
        try:
            tree = ast.parse(src)
        except SyntaxError:  # a notebook cell with a magic
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    provided = set(names)
    for name in names:
        provided |= {re.match(r"[\w.-]+", r).group(0).lower() for r in importlib.metadata.requires(name) or []
                     if "extra ==" not in r}
    dists = importlib.metadata.packages_distributions()
    third_party = imported - set(sys.stdlib_module_names) - {"coursekit", "kernels", "__future__"}
    unpinned = {m: dists.get(m) for m in third_party if not {d.lower() for d in dists.get(m, [])} & provided}
    # cloudpickle: only coursekit.lecture_cache imports it, for the lecturers' dashboards (never a notebook).
    assert set(unpinned) <= {"cloudpickle"}, f"imported but not installed by the bundle: {unpinned}"


def _lines(name: str, text: str) -> list[str]:
    if name.endswith(".ipynb"):
        text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
    return [ln.strip() for ln in text.splitlines()]


def test_no_solution_or_hidden_test_line_is_in_the_bundle(bundle):
    texts = {p.relative_to(bundle).as_posix(): p.read_text(errors="replace") for p in bundle.rglob("*")
             if p.is_file() and p.suffix != ".pt" and ".venv" not in p.relative_to(bundle).parts}
    lines = {name: _lines(name, text) for name, text in texts.items()}
    assert not any("run_hidden" in t or "BEGIN SOLUTION" in t or "BEGIN HIDDEN" in t for t in texts.values())
    for chapter in chapters():
        secret = _secret_lines((ROOT / "solutions" / f"{chapter}.py").read_text())
        hidden = (ROOT / "grader" / "hidden" / f"{chapter}.py").read_text()
        assert secret and not set(secret) & set(lines[f"course/{chapter}.ipynb"]), f"{chapter}'s answers leak"
        # Elsewhere an idiom may be shared: two answer lines in a row may not (three in a package file).
        pairs, triples = set(zip(secret, secret[1:])), set(zip(secret, secret[1:], secret[2:]))
        for name, found in lines.items():
            if name.endswith(".ipynb"):
                assert not pairs & set(zip(found, found[1:])), f"{chapter}'s answers leak into {name}"
            else:
                assert not triples & set(zip(found, found[1:], found[2:])), f"{chapter}'s answers leak into {name}"
            assert hidden not in texts[name]


@pytest.mark.slow
def test_the_bundle_installs_offline_and_make_lab_serves_it(bundle):
    """A fresh venv in the bundle (the packages come from the course's venv, so nothing is downloaded), installed by
    the bundle's own Makefile; `make lab` serves a notebook; ch01's setup cells and its checkpoint load in a kernel
    of that venv, from the bundle's coursekit and data."""
    venv = bundle / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = sysconfig.get_paths()["purelib"]
    (venv / "lib" / "python3.11" / "site-packages" / "_course_packages.pth").write_text(purelib + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0", "PATH": os.defpath}
    start = time.monotonic()
    proc = subprocess.run(["make", "--no-print-directory", ".venv/.installed"], cwd=bundle, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    print(f"bundle install: {time.monotonic() - start:.1f} s")

    port, token = _free_port(), "bundle-test-token"
    lab_env = env | {"JUPYTER_TOKEN": token, "JUPYTER_RUNTIME_DIR": tempfile.mkdtemp(prefix="rt-")}
    with (bundle.parent / "lab.log").open("w+") as log:
        lab = subprocess.Popen(["make", "--no-print-directory", "lab", f"PORT={port}"], cwd=bundle, env=lab_env,
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(240):
                try:
                    r = requests.get(f"{base}/api/contents/course/ch01_lora.ipynb", params={"token": token},
                                     timeout=5)
                    break
                except requests.ConnectionError:
                    assert lab.poll() is None, f"make lab exited: {log.seek(0) or log.read()[-3000:]}"
                    time.sleep(0.5)
            else:
                pytest.fail("the bundle's JupyterLab did not start within 120 s")
            assert r.status_code == 200 and r.json()["type"] == "notebook"
        finally:
            _stop(lab)

    script = """
import sys, nbclient, nbformat
nb = nbformat.read("ch01_lora.ipynb", as_version=4)
check = ("import sys, coursekit, coursekit.checkpoints as ck\\n"
         "model = ck.load_pretrained('tinygpt_fibonacci')\\n"
         "print(sys.executable, coursekit.__file__, ck.checkpoint_path('tinygpt_fibonacci'), sep='\\\\n')")
nb.cells = [c for c in nb.cells if "setup" in c.metadata.get("tags", [])] + [nbformat.v4.new_code_cell(check)]
nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute()
print(nb.cells[-1].outputs[0]["text"])
"""
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", script], cwd=bundle / "course", env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    executable, package, checkpoint = proc.stdout.split()[-3:]
    assert executable.startswith(str(venv)), f"the kernel ran {executable}, not the bundle's venv"
    assert package == str(bundle / "coursekit" / "__init__.py")
    assert checkpoint == str(bundle / "data" / "checkpoints" / "tinygpt_fibonacci.pt")


def test_a_new_bundle_replaces_an_earlier_one_and_keeps_its_history(tmp_path):
    out = tmp_path / "published"
    (out / ".git").mkdir(parents=True)
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (out / "notes.txt").write_text("the instructor's own file")
    with pytest.raises(ValueError, match="not empty and holds no earlier bundle"):
        bundle_mod.build(out)
    assert (out / "notes.txt").exists(), "a refused bundle touches nothing"
    (out / "notes.txt").unlink()
    bundle_mod.build(out)
    (out / "course" / "stale.ipynb").write_text("{}")
    bundle_mod.build(out)
    assert not (out / "course" / "stale.ipynb").exists() and (out / ".git" / "HEAD").exists()
    assert (out / "Makefile").read_text() == bundle_mod.MAKEFILE
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temporary folder is left behind"
    with pytest.raises(ValueError, match="exists and is not a folder"):
        bundle_mod.build(out / "LICENSE")
