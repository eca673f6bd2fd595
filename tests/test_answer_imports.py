"""The course's own packages never hand out an exercise's answer.

Students have ``coursekit`` and ``kernels`` installed, and some of their functions compute what
an exercise asks for (``kernels.ch05_tinytl.pack_bits`` is chapter 4's ``pack_bits`` on a GPU;
``kernels.ch10_flash_attention`` holds the attention passes of chapter 10). This test finds them
all, by walking both packages for public callables named like an exercise (the same name, or the
name with a suffix such as ``_reference`` or ``Triton``), and proves that every way of reaching
each one from an exercise cell is refused by the chapter's source policy before anything runs:
an import, a dotted name, ``getattr``, ``importlib``, a copied function object, and a name or
module the chapter's setup cells bind. The list found is pinned in ``EXPECTED`` so that a new
duplicate is seen and named.
"""
from __future__ import annotations

import ast
import importlib
import pkgutil

import pytest

import coursekit
import kernels
from grader.notebooks import chapters, layout, read_source
from grader.source_policy import refusals

# (chapter, exercise) -> the course-package callables that compute (part of) its answer.
EXPECTED = {
    ("ch04_partial_training", "pack_bits"): {"kernels.ch05_tinytl.pack_bits", "kernels.ch05_tinytl.pack_bits_reference"},
    ("ch04_partial_training", "unpack_bits"): {"kernels.ch05_tinytl.unpack_bits",
                                               "kernels.ch05_tinytl.unpack_bits_reference"},
    ("ch04_partial_training", "relu_1bit"): {"kernels.ch05_tinytl.relu_1bit"},
    ("ch08_quantization", "nf4_dequantize"): {"kernels.ch08_quantization.nf4_dequantize",
                                              "kernels.ch08_quantization.nf4_dequantize_reference"},
    ("ch10_flash_attention", "flash_attention_forward"): {"kernels.ch10_flash_attention.flash_attention_forward"},
    ("ch10_flash_attention", "flash_attention_backward"): {"kernels.ch10_flash_attention.flash_attention_backward"},
    ("ch10_flash_attention", "FlashAttention"): {"kernels.ch10_flash_attention.FlashAttentionTriton"},
}

# Found by the name rule but computing something else: (chapter, exercise) -> {callable: what it is}.
NOT_ANSWERS = {
    ("ch02_checkpointing", "checkpoint"): {"coursekit.checkpoints.checkpoint_path": "the path of a saved model file"},
}


def _modules():
    found = []
    for package in (coursekit, kernels):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not info.name.endswith("__main__"):
                found.append(importlib.import_module(info.name))
    return found


def _candidates() -> dict[tuple[str, str], set[str]]:
    modules = _modules()
    found: dict[tuple[str, str], set[str]] = {}
    for chapter in chapters():
        for exercise in layout(read_source(chapter), chapter).exercises:
            for module in modules:
                for attr in dir(module):
                    obj = getattr(module, attr)
                    if (attr.startswith("_") or not callable(obj) or isinstance(obj, type(importlib))
                            or getattr(obj, "__module__", None) != module.__name__):
                        continue  # private, not callable, or re-exported (counted where it is defined)
                    if attr == exercise or attr.startswith(exercise + "_") or (
                            exercise[:1].isupper() and attr.startswith(exercise)):
                        path = f"{module.__name__}.{attr}"
                        if path not in NOT_ANSWERS.get((chapter, exercise), {}):
                            found.setdefault((chapter, exercise), set()).add(path)
    return found


CANDIDATES = _candidates()


def test_every_course_function_that_duplicates_an_exercise_is_known():
    assert CANDIDATES == EXPECTED, ("the course packages' exercise duplicates changed: check that each new one "
                                    "is refused below, then update EXPECTED")


def _setup_bindings(chapter: str) -> dict[str, str]:
    """Names the setup cells bind to course-package modules or functions: name -> dotted path."""
    bound = {}
    for source in layout(read_source(chapter), chapter).setup:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("kernels", "coursekit"):
                for alias in node.names:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in ("kernels", "coursekit"):
                        bound[alias.asname or alias.name.split(".")[0]] = alias.asname and alias.name or alias.name.split(".")[0]
    return bound


def _spellings(chapter: str, exercise: str, target: str) -> dict[str, str]:
    module, attr = target.rsplit(".", 1)
    package, _, sub = module.partition(".")
    call = "(*args, **kwargs)"
    wrap = f"def {exercise}(*args, **kwargs):\n    return {{}}{call}\n"
    out = {
        "from-import": f"from {module} import {attr} as _answer\n\n" + wrap.format("_answer"),
        "dotted name": f"import {module}\n\n" + wrap.format(f"{module}.{attr}"),
        "package attribute": f"from {package} import {sub}\n\n" + wrap.format(f"{sub}.{attr}"),
        "getattr": f"import {module}\n\n" + wrap.format(f"getattr({module}, '{attr}')"),
        "importlib": "import importlib\n\n" + wrap.format(f"importlib.import_module('{module}').{attr}"),
        "copied object": f"import {module}\n\n{exercise} = {module}.{attr}\n",
    }
    for name, path in _setup_bindings(chapter).items():
        if path == target:
            out[f"setup name {name}"] = wrap.format(name)
        elif target.startswith(path + "."):
            out[f"setup module {name}"] = wrap.format(f"{name}.{target[len(path) + 1:]}")
    return out


CASES = [pytest.param(ch, ex, target, spelling, source, id=f"{ch}-{ex}-{target.rsplit('.', 1)[1]}-{spelling}")
         for (ch, ex), targets in sorted(EXPECTED.items()) for target in sorted(targets)
         for spelling, source in _spellings(ch, ex, target).items()]


@pytest.mark.parametrize("chapter,exercise,target,spelling,source", CASES)
def test_reaching_a_duplicate_is_refused(chapter, exercise, target, spelling, source):
    setup = layout(read_source(chapter), chapter).setup
    found = refusals(chapter, setup, {exercise: source})
    assert exercise in found, f"{chapter}: {exercise} through {target} ({spelling}) is not refused:\n{source}"
    assert len(found[exercise]) > 40, found[exercise]  # a reason the student can act on
