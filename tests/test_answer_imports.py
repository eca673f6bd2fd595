"""The course's own packages never hand out an exercise's answer.

Students have ``coursekit`` and ``kernels`` installed, and some of their functions compute what
an exercise asks for (``kernels.ch05_tinytl.pack_mask_triton`` is chapter 4's ``pack_bits`` on a
GPU; ``kernels.ch10_flash_attention`` holds the attention passes of chapter 10). Three rules:

- no public callable of either package carries an exercise's name, or that name with a suffix
  (``pack_bits_reference``), so that nothing there reads as an answer to copy;
- every duplicate, pinned in ``DUPLICATES``, is shown to compute what the exercise's reference
  computes on the same inputs (so the list names real answers, not look-alikes);
- every way of reaching each duplicate from an exercise cell is refused by the chapter's source
  policy before anything runs: an import, a dotted name, ``getattr``, ``importlib``, a copied
  function object, and a name or module the chapter's setup cells bind.
"""
from __future__ import annotations

import ast
import functools
import importlib
import pkgutil

import pytest
import torch

import coursekit
import kernels
from grader.notebooks import chapters, layout, read_source
from grader.source_policy import refusals

# (chapter, exercise) -> the course-package callables that compute (part of) its answer.
DUPLICATES = {
    ("ch04_partial_training", "pack_bits"): {"kernels.ch05_tinytl.pack_mask_triton",
                                             "kernels.ch05_tinytl.pack_mask_torch"},
    ("ch04_partial_training", "unpack_bits"): {"kernels.ch05_tinytl.unpack_mask_triton",
                                               "kernels.ch05_tinytl.unpack_mask_torch"},
    ("ch04_partial_training", "relu_1bit"): {"kernels.ch05_tinytl.relu_packed"},
    ("ch08_quantization", "nf4_codebook"): {"kernels.ch15_paca.nf4_levels"},
    ("ch08_quantization", "nf4_quantize"): {"kernels.ch15_paca.nf4_encode"},
    ("ch08_quantization", "nf4_dequantize"): {"kernels.ch08_quantization.nf4_decode_triton",
                                              "kernels.ch08_quantization.nf4_decode_torch",
                                              "kernels.ch15_paca.nf4_decode_columns_torch",  # with no column
                                              "kernels.ch15_paca.nf4_decode_columns_triton"},
    ("ch10_flash_attention", "flash_attention_forward"): {"kernels.ch10_flash_attention.fused_attention_fwd"},
    ("ch10_flash_attention", "flash_attention_backward"): {"kernels.ch10_flash_attention.fused_attention_bwd"},
    ("ch10_flash_attention", "FlashAttention"): {"kernels.ch10_flash_attention.FusedAttentionFunction"},
    ("ch10_flash_attention", "flash_attention_triton"): {"kernels.ch10_flash_attention.flash_attention"},
    ("ch13_alam", "average_quantize"): {"kernels.ch13_alam.aq_pack_torch", "kernels.ch13_alam.aq_pack_triton"},
    ("ch13_alam", "average_quantize_triton"): {"kernels.ch13_alam.aq_pack_triton"},
    ("ch13_alam", "average_dequantize"): {"kernels.ch13_alam.aq_unpack_torch", "kernels.ch13_alam.aq_unpack_triton"},
    ("ch15_paca", "PaCALinear"): {"kernels.ch15_paca.paca_grad_p", "kernels.ch15_paca.paca_grad_p_torch"},  # its dP
    ("ch16_capstone", "build"): {"coursekit.capstone.training_step"},
}

# Named like an exercise but computing something else: (chapter, exercise) -> {callable: what it is}.
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


def _resolve(path: str):
    module, attr = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), attr)


def test_no_course_function_is_named_like_an_exercise():
    found = {}
    modules = _modules()
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
                            found.setdefault(f"{chapter}.{exercise}", []).append(path)
    assert not found, f"course functions named like an exercise (rename them, and pin real duplicates): {found}"


@functools.lru_cache(maxsize=None)
def _reference(chapter: str) -> dict:
    """The chapter's setup and reference exercise cells, run in one namespace (once per chapter)."""
    nb = read_source(chapter)
    lay = layout(nb, chapter)
    ns: dict = {"__name__": f"reference_{chapter}"}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and (cell.source in lay.setup or meta.get("solution")):
            exec(compile(cell.source, f"<{chapter}>", "exec"), ns)
    return ns


def _same_behaviour(chapter: str, exercise: str, target: str) -> None:
    ns, dup = _reference(chapter), _resolve(target)
    ref = ns[exercise]
    gen = torch.Generator().manual_seed(0)
    if exercise == "pack_bits":
        mask = torch.rand(1003, generator=gen) > 0.5
        assert torch.equal(dup(mask), ref(mask))
    elif exercise == "unpack_bits":
        packed = torch.randint(0, 256, (126,), dtype=torch.uint8, generator=gen)
        assert torch.equal(dup(packed, 1003), ref(packed, 1003))
    elif exercise == "relu_1bit":
        x = torch.randn(3, 37, generator=gen)
        assert torch.equal(dup(x), ref(x))
    elif exercise == "nf4_codebook":
        assert torch.equal(dup(), ref())
    elif exercise == "nf4_quantize":  # whole blocks, then an odd count with a partial last block
        for w, block in ((torch.randn(4, 64, generator=gen), 64), (torch.randn(37, 53, generator=gen), 7)):
            assert all(torch.equal(a, b) for a, b in zip(dup(w, block), ref(w, block)))
    elif exercise == "nf4_dequantize":
        w = torch.randn(4, 64, generator=gen)
        packed, absmax = ns["nf4_quantize"](w)
        if target.startswith("kernels.ch15_paca."):  # the columns override with no column: the plain decode
            got = dup(packed, absmax, w.shape, torch.zeros(0, dtype=torch.int64), torch.zeros(4, 0))
        else:
            got = dup(packed, absmax, ns["nf4_codebook"](), w.shape)
        assert torch.allclose(got, ref(packed, absmax, w.shape))
    elif exercise in ("average_quantize", "average_quantize_triton", "average_dequantize"):  # chapter 13
        x = torch.randn(37, 53, generator=gen)
        noise = torch.rand(491, generator=gen)
        packed = ns["average_quantize"](x, noise)
        if exercise == "average_dequantize":
            assert torch.allclose(dup(*packed, x.shape), ref(*packed, x.shape), rtol=1e-6, atol=1e-6)
        else:  # the same layout; a scale may differ by float32 rounding, moving a code near a boundary
            got, want = dup(x, noise), ref(x, noise)
            assert got[0].shape == want[0].shape and (got[0] != want[0]).float().mean() < 0.01
            assert torch.allclose(got[1], want[1], rtol=0, atol=0) and torch.allclose(got[2], want[2], rtol=1e-6)
    elif exercise == "PaCALinear":  # backward's dP = s g^T x[..., idx], leading dimensions flattened
        layer = ref(torch.nn.Linear(37, 29), 5, 10.0, generator=gen)
        x = torch.randn(2, 3, 37, generator=gen)
        g = torch.randn(2, 3, 29, generator=gen)
        layer(x).backward(g)
        dp = dup(g.reshape(6, 29), x.reshape(6, 37), layer.idx, layer.scaling)
        assert torch.allclose(dp, layer.P.grad, rtol=1e-5, atol=1e-5)
    elif exercise == "build":  # chapter 16: one step of a configuration with drops, compression and checkpointing
        config = ns["Config"](16, True, "lora", False, 2, 0.25)
        task = importlib.import_module("coursekit.data").target_task(ns["GLOBAL_BATCH"], 1)
        assert torch.equal(dup(config, 2)((task.x, task.y)), ref(config, 2)((task.x, task.y)))
    else:  # chapter 10: (B, H, N, d) float32, a ragged last block
        q, k, v, do = (torch.randn(1, 2, 45, 16, generator=gen) for _ in range(4))
        if exercise == "flash_attention_forward":
            (o1, l1), (o2, l2) = dup(q, k, v, True), ref(q, k, v, True)
            assert torch.allclose(o1, o2, atol=1e-5) and torch.allclose(l1, l2, atol=1e-5)
        elif exercise == "flash_attention_backward":
            o, lse = ref.__globals__["flash_attention_forward"](q, k, v, True)
            for a, b in zip(dup(q, k, v, o, lse, do, True), ref(q, k, v, o, lse, do, True)):
                assert torch.allclose(a, b, atol=1e-4)
        elif exercise == "FlashAttention":
            assert torch.allclose(dup.apply(q, k, v, True), ref.apply(q, k, v, True), atol=1e-5)
        else:
            assert torch.allclose(dup(q, k, v, True), ref(q, k, v, True), atol=1e-5)


@pytest.mark.parametrize("chapter,exercise,target", [(ch, ex, t) for (ch, ex), ts in sorted(DUPLICATES.items())
                                                     for t in sorted(ts)])
def test_each_pinned_duplicate_computes_the_exercise(chapter, exercise, target):
    _same_behaviour(chapter, exercise, target)


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
         for (ch, ex), targets in sorted(DUPLICATES.items()) for target in sorted(targets)
         for spelling, source in _spellings(ch, ex, target).items()]


@pytest.mark.parametrize("chapter,exercise,target,spelling,source", CASES)
def test_reaching_a_duplicate_is_refused(chapter, exercise, target, spelling, source):
    setup = layout(read_source(chapter), chapter).setup
    found = refusals(chapter, setup, {exercise: source})
    assert exercise in found, f"{chapter}: {exercise} through {target} ({spelling}) is not refused:\n{source}"
    assert len(found[exercise]) > 40, found[exercise]  # a reason the student can act on
