"""The source policy on exercise cells (coursekit/source_policy.py, grader/source_policy.py): honest code passes, escapes do not.

Every reference exercise cell of every chapter (chapters added later included), every plausible
wrong submission of ``tests/wrong_submissions_*.py`` and the correct variants written in
``tests/test_hidden_*.py`` must pass: the policy refuses constructs, never ordinary solutions.
Each attack below must be refused with the construct named; ``grade_one`` must score a refused
exercise's test cells 0 without running the cell, and grade the other exercises as usual.
"""
from __future__ import annotations

import ast
import runpy
import textwrap
import time
from pathlib import Path

import pytest

from grader import autograde
from grader.notebooks import chapters, exercise_sources, layout, read_source
from grader.sandbox.judge import Outcome
from grader.source_policy import DEFAULT_POLICY, SourcePolicy, check_source, policy_for
from submissions import reference, with_exercise, write

TESTS = Path(__file__).parent


def _chapter(chapter: str):
    nb = read_source(chapter)
    lay = layout(nb, chapter)
    return lay, exercise_sources(nb, lay.exercises)


def breaches(source: str, chapter: str = "ch00_memory") -> list:
    lay, _ = _chapter(chapter)
    return check_source(textwrap.dedent(source), policy_for(chapter), lay.setup)


# --- honest code passes ---------------------------------------------------------------------------

@pytest.mark.parametrize("chapter", chapters())
def test_every_reference_exercise_cell_passes(chapter):
    lay, sources = _chapter(chapter)
    policy = policy_for(chapter)
    assert isinstance(policy, SourcePolicy)
    for exercise, source in sources.items():
        assert source is not None, f"{chapter}: no cell for {exercise}"
        assert check_source(source, policy, lay.setup) == [], f"{chapter}.{exercise}"


def _wrong_submissions() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted(TESTS.glob("wrong_submissions_*.py")):
        # WRONG, and the answers wrong in one property only (MEMORY_WRONG, COMPUTE_WRONG, ...).
        for name, answers in runpy.run_path(str(path)).items():
            if name.endswith("WRONG") and isinstance(answers, dict):
                found.extend((chapter, exercise, source) for (chapter, exercise), source in answers.items())
    return found


@pytest.mark.parametrize("chapter,exercise,source", _wrong_submissions(), ids=lambda v: str(v)[:40])
def test_plausible_wrong_submissions_pass_the_policy(chapter, exercise, source):
    """They must lose points on what they compute, not on the policy."""
    assert breaches(source, chapter) == []


def _second_answers() -> list[tuple[str, str, str]]:
    import importlib

    return [(c, ex, src) for ch in chapters()
            for (c, ex), src in sorted(importlib.import_module(f"second_submissions_{ch}").SECOND.items())]


@pytest.mark.parametrize("chapter,exercise,source", _second_answers(), ids=lambda v: str(v)[:40])
def test_second_correct_answers_pass_the_policy(chapter, exercise, source):
    """Written from the released notebook alone (tests/second_submissions_*.py): a correct answer in another style
    than the reference is never refused (a ch00 answer delegating to its own recursive generator with
    ``yield from`` once was)."""
    assert breaches(source, chapter) == []


def _correct_variants() -> list[tuple[str, str, str]]:
    """Top-level functions and classes of tests/test_hidden_*.py: the correct (and wrong) variants."""
    found = []
    known = chapters()
    for path in sorted(TESTS.glob("test_hidden_*.py")):
        suffix = path.stem.removeprefix("test_hidden_")
        chapter = next((c for c in known if c == suffix or c.startswith(suffix + "_")), None)
        if chapter is None:
            continue
        source = path.read_text()
        for node in ast.parse(source).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith(("test_", "_")) \
                    and not any(isinstance(d, (ast.Attribute, ast.Call)) for d in node.decorator_list):
                found.append((chapter, node.name, ast.get_source_segment(source, node)))
    return found


# Variants there that do what their chapter forbids: the policy refuses them as well.
FORBIDDEN_VARIANTS = {("ch00_memory", "runs_the_step_instead"): "coursekit",
                      ("ch00_memory", "materialises_with_to_empty"): "coursekit",
                      ("ch00_memory", "swaps_in_real_weights"): "coursekit",
                      ("ch00_memory", "assigns_a_state_dict"): "coursekit",
                      ("ch08_quantization", "round_via_bf16"): "bfloat16",
                      ("ch10_flash_attention", "forward_sdpa"): "scaled_dot_product_attention"}


@pytest.mark.parametrize("chapter,name,source", _correct_variants(), ids=lambda v: str(v)[:40])
def test_implementations_written_in_the_hidden_test_suites_pass(chapter, name, source):
    found = breaches(source, chapter)
    if (chapter, name) in FORBIDDEN_VARIANTS:
        assert any(FORBIDDEN_VARIANTS[chapter, name] in b.construct for b in found), found
    else:
        assert found == [], f"{chapter}: {name}: {found}"


ALLOWED = [
    # (chapter, source): ordinary code that must pass
    ("ch00_memory", "def f(model):\n    return sum(p.numel() for p in model.parameters())"),
    ("ch01_lora", "def f(model, name, new):\n    model.set_submodule(name, new)\n    return model.get_submodule(name)"),
    ("ch01_lora", "def f(x):\n    return getattr(x, 'dtype', None), hasattr(x, 'grad'), type(x).__name__"),
    ("ch09_mixed_precision", "class S:\n    def __init__(self):\n        self._scale = 1.0\n"
                             "    def get(self):\n        return self._scale"),
    # class constants bound by unpacking, a nested class, attributes set by unpacking
    ("ch09_mixed_precision", "class S:\n    _READY, (_UNSCALED, *_REST) = 'ready', ('u', 's')\n    class _State:\n"
                             "        pass\n    def f(self):\n        self._a, self._b = 1, 2\n"
                             "        return self._READY, self._UNSCALED, self._REST, self._State, self._a + self._b"),
    ("ch04_partial_training", "class R(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x):\n"
                              "        ctx._n = x.numel()\n        ctx.save_for_backward(x > 0)\n        return x.relu()"),
    ("ch04_partial_training", "def f(m):\n    return isinstance(m, nn.modules.batchnorm._BatchNorm)"),
    ("ch00_memory", "import torch.nn.functional as G\nfrom torch import nn as N\nimport math, itertools, functools\n"
                    "def f(x):\n    return G.relu(x) + N.functional.gelu(x) * math.pi"),
    ("ch00_memory", "from dataclasses import dataclass, field\nfrom typing import Optional\n@dataclass\nclass C:\n"
                    "    x: Optional[int] = None\n    y: list = field(default_factory=list)"),
    ("ch10_flash_attention", "@triton.jit\ndef k(p, N, B: tl.constexpr):\n    i = tl.arange(0, B)\n"
                             "    tl.store(p + i, tl.load(p + i, mask=i < N) * 2, mask=i < N)"),
    ("ch02_checkpointing", "def f(fn, x):\n    with torch.random.fork_rng(devices=[]), torch.enable_grad():\n"
                           "        return torch.autograd.grad(fn(x).sum(), x)"),
    ("ch08_quantization", "def f(x):\n    bits = x.view(torch.int32)\n    return (bits + 0x7FFF).view(torch.float32)"),
    ("ch00_memory", "def f(x):\n    match x:\n        case torch.Tensor(shape=s):\n            return s"),
    ("ch00_memory", "import functools\ndef f(g):\n    @functools.wraps(g)\n    def h(*a):\n        return g(*a)\n"
                    "    return h"),
    # generators without cleanup code, and cleanup code outside generators
    ("ch03_accumulation", "def chunks(x, n):\n    for i in range(0, len(x), n):\n        yield x[i:i + n]\n"
                          "def f(x):\n    try:\n        return sum(c.sum() for c in chunks(x, 3))\n    finally:\n"
                          "        pass"),
    ("ch03_accumulation", "def gen(xs):\n    def helper(x):\n        with torch.no_grad():\n            return x * 2\n"
                          "    for x in xs:\n        yield helper(x)"),
    # the standard modules plain Python code uses
    ("ch03_accumulation", "import operator\ndef f(xs):\n    return functools.reduce(operator.add, xs)"),
    ("ch07_local_loss", "import re, string, random, fractions, decimal\n"
                        "def f(s):\n    return re.sub('[0-9]', '', s) in string.ascii_letters, random.Random(0).random(),"
                        " fractions.Fraction(1, 3), decimal.Decimal(2)"),
    ("ch02_checkpointing", "from operator import itemgetter\ndef f(pairs):\n    return sorted(pairs, key=itemgetter(1))"),
    ("ch00_memory", "import re\nDIGITS = re.compile('[0-9]+')\ndef f(s):\n    return DIGITS.findall(s)"),
    ("ch00_memory", "def f(x, y):\n    return type(x) is type(y), type(x) == torch.Tensor, type(x).__name__, "
                    "isinstance(y, type(x)), type(x).__qualname__ != 'A'"),
    ("ch00_memory", "def f(x):\n    return '{0.shape} {0.dtype!r} {1:>8}'.format(x, 'x') + f'{x.numel()}'"),
    ("ch00_memory", "def flatten(m):\n    for c in m.children():\n        yield c\n        yield from flatten(c)"),
    ("ch00_memory", "def f(model):\n    def flatten(m):\n        for c in m.children():\n            yield from "
                    "flatten(c)\n            yield c\n    return list(flatten(model))"),
]


@pytest.mark.parametrize("chapter,source", ALLOWED)
def test_ordinary_constructs_pass(chapter, source):
    assert breaches(source, chapter) == []


# --- escapes are refused, whatever the spelling ---------------------------------------------------

ATTACKS = [
    # (chapter, source, text the first breach's construct must contain)
    # modules an allowed module re-exports, imported by their path under it (red team 4)
    ("ch00_memory", "from fractions import sys\ndef f():\n    return sys.modules", "the module sys"),
    ("ch00_memory", "from re import enum\nE = enum.Enum('E', [('A', 1)])", "the module enum"),
    ("ch00_memory", "from torch import os", "the module os"),
    ("ch00_memory", "from dataclasses import builtins", "the module builtins"),
    ("ch00_memory", "from typing import types", "the module types"),
    # the metaclass reached from an object, code at collection, internals read by format strings
    ("ch00_memory", "def f():\n    T = type(type(0))\n    return T('A', (), {})", "type(obj) used as a value"),
    ("ch00_memory", "def f(x):\n    return type(x)(0)", "type(obj) used as a value"),
    ("ch00_memory", "def g(it):\n    yield from it", "yield from"),
    ("ch00_memory", "class S:\n    def close(self):\n        pass\ndef g():\n    yield from S()", "yield from"),
    ("ch00_memory", "class S:\n    def close(self):\n        pass\ndef f(flatten):\n    def g():\n        yield 1\n"
                    "        yield from flatten(S)\n    return g", "yield from"),
    ("ch00_memory", "def f(fn):\n    return '{0.__globals__[sys]}'.format(fn)", "__globals__"),
    ("ch00_memory", "def f(frame):\n    return '{0.f_back}'.format(frame)", "f_back"),
    # attributes by a run-time name through allowed modules
    ("ch00_memory", "import operator\ndef f(x, n):\n    return operator.attrgetter(n)(x)", "operator.attrgetter"),
    ("ch00_memory", "from operator import methodcaller\ndef f(x, n):\n    return methodcaller(n)(x)",
     "operator.methodcaller"),
    ("ch00_memory", "import string\ndef f(x):\n    return string.Formatter().get_field('0.__class__', (x,), {})",
     "string.Formatter"),
    # dispatch-mode hiding and operator interception
    ("ch10_flash_attention", "from torch.utils._python_dispatch import _disable_current_modes", "_python_dispatch"),
    ("ch10_flash_attention", "def f():\n    with torch.utils._python_dispatch._disable_current_modes():\n        pass",
     "torch.utils"),
    ("ch00_memory", "def f():\n    return torch.utils.flop_counter.TorchDispatchMode", "torch.utils"),
    ("ch00_memory", "import torch.overrides", "torch.overrides"),
    ("ch00_memory", "def f():\n    return torch._C._DisableTorchDispatch()", "torch._C"),
    ("ch00_memory", "def f():\n    return torch.ops.aten.mm", "torch.ops"),
    ("ch00_memory", "import torch.library", "torch.library"),
    ("ch00_memory", "def f(g):\n    return torch.compile(g)", "compile"),
    # frames, tracebacks, generators, worker internals
    ("ch00_memory", "import sys\ndef f():\n    return sys._getframe(1).f_back.f_locals", "sys"),
    ("ch00_memory", "def f():\n    try:\n        1 / 0\n    except Exception as e:\n        return e.__traceback__",
     "__traceback__"),
    ("ch00_memory", "def f(tb):\n    return tb.tb_frame.f_globals", "tb_frame"),
    ("ch00_memory", "def f():\n    g = (i for i in [1])\n    return g.gi_frame.f_back", "gi_frame"),
    ("ch00_memory", "import inspect", "inspect"),
    ("ch00_memory", "import gc\ndef f():\n    return gc.get_objects()", "gc"),
    ("ch00_memory", "def f():\n    return torch.sys.modules", "torch.sys"),
    ("ch00_memory", "def f():\n    return torch.nn.functional.torch.os", "os"),
    ("ch00_memory", "def f(x):\n    return x.__class__.__mro__[-1].__subclasses__()", "__class__"),
    ("ch00_memory", "def f(fn):\n    return fn.__globals__['probes']", "__globals__"),
    ("ch00_memory", "def f():\n    return __builtins__", "__builtins__"),
    ("ch00_memory", "def f(x):\n    return x.__dict__", "__dict__"),
    # dynamic names and code built at run time
    ("ch00_memory", "def f(x, n):\n    return getattr(x, n)", "getattr"),
    ("ch00_memory", "def f(x):\n    return getattr(x, '__cl' + 'ass__')", "getattr"),
    ("ch00_memory", "def f(x):\n    return getattr(x, '__class__')", "__class__"),
    ("ch00_memory", "def f(x, n, v):\n    setattr(x, n, v)", "setattr"),
    ("ch00_memory", "import functools\ndef f(x):\n    return functools.partial(getattr, x)('f_back')", "getattr"),
    ("ch00_memory", "import functools\ndef f(x):\n    return functools.reduce(getattr, ['a', 'b'], x)", "getattr"),
    ("ch00_memory", "g = getattr", "getattr"),
    ("ch00_memory", "def f():\n    return eval('1')", "eval"),
    ("ch00_memory", "def f():\n    exec('x = 1')", "exec"),
    ("ch00_memory", "def f():\n    return __import__('os')", "__import__"),
    ("ch00_memory", "def f():\n    return globals()['torch']", "globals"),
    ("ch00_memory", "def f():\n    return vars(torch)", "vars"),
    ("ch00_memory", "import importlib", "importlib"),
    ("ch00_memory", "def f():\n    return type('A', (), {'__array_interface__': {}})", "type("),
    ("ch00_memory", "class M(type):\n    pass\nclass A(metaclass=M):\n    pass", "metaclass"),
    ("ch00_memory", "import typing\ndef f(g):\n    return typing.get_type_hints(g)", "get_type_hints"),
    ("ch00_memory", "from torch import *", "import *"),
    ("ch00_memory", "from . import x", "relative"),
    # aliasing modules
    ("ch10_flash_attention", "import torch.nn.functional as F\nf = F\ndef g(q, k, v):\n"
                             "    return f.scaled_dot_product_attention(q, k, v)", "as a value"),
    ("ch00_memory", "def f(m=F):\n    return m", "as a value"),
    ("ch00_memory", "mods = {'f': F}", "as a value"),
    ("ch00_memory", "def f():\n    return torch.nn", "as a value"),
    ("ch00_memory", "from torch.nn import functional\nx = [functional]", "as a value"),
    ("ch00_memory", "f = lambda: F", "as a value"),
    # monkeypatching libraries
    ("ch00_memory", "torch.allclose = lambda *a, **k: True", "torch.allclose"),
    ("ch00_memory", "setattr(torch.Tensor, 'allclose', None)", "torch.Tensor.allclose"),
    ("ch00_memory", "del torch.nn.Module.named_parameters", "torch.nn.Module.named_parameters"),
    # raw memory and files
    ("ch00_memory", "import numpy as np\ndef f(a):\n    return np.ctypeslib.as_array(a.ctypes.data, (8,))", "ctypeslib"),
    ("ch00_memory", "import numpy\ndef f(a):\n    return numpy.lib.stride_tricks.as_strided(a, (10**9,))", "stride_tricks"),
    ("ch00_memory", "from numpy.lib.stride_tricks import as_strided", "stride_tricks"),
    ("ch00_memory", "def f(x):\n    return x.data_ptr()", "data_ptr"),
    ("ch00_memory", "def f(x):\n    return x.untyped_storage()", "untyped_storage"),
    ("ch00_memory", "def f():\n    return torch.from_file('/etc/passwd', size=10)", "from_file"),
    ("ch00_memory", "def f(b):\n    return torch.frombuffer(b, dtype=torch.uint8)", "frombuffer"),
    ("ch00_memory", "import numpy as np\ndef f(a):\n    return np.frombuffer(a)", "frombuffer"),
    ("ch00_memory", "def f(f):\n    return torch.load(f, weights_only=False)", "torch.load"),
    ("ch00_memory", "import numpy as np\ndef f(p):\n    return np.load(p, allow_pickle=True)", "numpy.load"),
    ("ch00_memory", "class A:\n    __array_interface__ = {'data': (0, False)}", "__array_interface__"),
    ("ch00_memory", "class A:\n    @property\n    def __array_interface__(self):\n        return {}",
     "__array_interface__"),
    ("ch00_memory", "def f(x):\n    return x._cdata", "_cdata"),
    ("ch00_memory", "import ctypes", "ctypes"),
    ("ch00_memory", "def f():\n    return open('/etc/passwd').read()", "open"),
    ("ch00_memory", "import pickle", "pickle"),
    # namespaces reached through library objects, attributes named by strings
    ("ch10_flash_attention", "def f(kernel):\n    return kernel.get_capture_scope()", "get_capture_scope"),
    ("ch10_flash_attention", "def f(kernel, text):\n    kernel.src = text", "src"),
    ("ch00_memory", "def f(scope):\n    return scope['__builtins__']", "'__builtins__'"),
    ("ch00_memory", "import functools\ndef f(a, b):\n    return functools.wraps(a, assigned=('f_back',))(b)", "wraps"),
    ("ch00_memory", "import dataclasses\nA = dataclasses.make_dataclass('A', [('x', int)])", "make_dataclass"),
    ("ch00_memory", "def f(x):\n    return x._version", "_version"),
    ("ch00_memory", "import enum", "enum"),
    # processes
    ("ch00_memory", "import _posixsubprocess", "_posixsubprocess"),
    ("ch00_memory", "import os\ndef f():\n    os.posix_spawn('/bin/sh', ['sh'], {})", "os"),
    ("ch00_memory", "import subprocess", "subprocess"),
    ("ch00_memory", "def f(m):\n    return m._posixsubprocess.fork_exec", "_posixsubprocess"),
    ("ch00_memory", "import torch.multiprocessing", "torch.multiprocessing"),
    # hiding work from the probes
    ("ch04_partial_training", "def f():\n    return torch.autograd.graph.saved_tensors_hooks(id, id)",
     "saved_tensors_hooks"),
    ("ch04_partial_training", "from torch.autograd.graph import save_on_cpu", "save_on_cpu"),
    ("ch00_memory", "def f(h):\n    return nn.modules.module.register_module_forward_hook(h)", "register_module_forward_hook"),
    ("ch00_memory", "def f(m):\n    m._forward_hooks.clear()", "_forward_hooks"),
    ("ch00_memory", "class A:\n    def __del__(self):\n        pass", "__del__"),
    ("ch00_memory", "class A:\n    def __eq__(self, other):\n        return True", "__eq__"),
    ("ch00_memory", "def f(x):\n    match x:\n        case object(__class__=c):\n            return c", "__class__"),
    # the course's own answers
    ("ch04_partial_training", "from kernels.ch05_tinytl import pack_mask_triton", "kernels.ch05_tinytl"),
    ("ch04_partial_training", "import kernels.ch05_tinytl as k", "kernels.ch05_tinytl"),
    ("ch04_partial_training", "import kernels", "kernels"),
    ("ch05_tinytl", "def f():\n    return relu_1bit.__globals__", "__globals__"),
    ("ch08_quantization", "from kernels.ch08_quantization import nf4_decode_triton", "kernels.ch08_quantization"),
    ("ch10_flash_attention", "def f(q, k, v):\n    return kernels.ch10_flash_attention.flash_attention(q, k, v)",
     "kernels"),
    ("ch10_flash_attention", "def f():\n    return getattr(kernels, 'ch10_flash_attention')", "kernels"),
    ("ch00_memory", "from coursekit.steps import measure_training_step", "coursekit"),
    # each chapter's shortcuts
    ("ch02_checkpointing", "import torch.utils.checkpoint as c", "torch.utils.checkpoint"),
    ("ch02_checkpointing", "from torch.utils import checkpoint", "torch.utils.checkpoint"),
    ("ch02_checkpointing", "def f(g, x):\n    return torch.utils.checkpoint.checkpoint(g, x, use_reentrant=False)",
     "torch.utils.checkpoint"),
    ("ch10_flash_attention", "def f(q, k, v):\n    return torch.nn.functional.scaled_dot_product_attention(q, k, v)",
     "scaled_dot_product_attention"),
    ("ch10_flash_attention", "from torch.nn.functional import scaled_dot_product_attention as s",
     "scaled_dot_product_attention"),
    ("ch10_flash_attention", "def f(x):\n    return getattr(x, 'scaled_dot_product_attention')",
     "scaled_dot_product_attention"),
    ("ch10_flash_attention", "def f(m, q):\n    return m.scaled_dot_product_attention(q, q, q)",
     "scaled_dot_product_attention"),
    ("ch10_flash_attention", "from torch.nn.attention import flex_attention", "torch.nn.attention"),
    ("ch10_flash_attention", "import numpy as np", "numpy"),
    ("ch10_flash_attention", "def f(q):\n    return q.numpy()", "numpy"),
    ("ch08_quantization", "def round_to_bf16(x):\n    return x.to(torch.bfloat16).float()", "bfloat16"),
    ("ch08_quantization", "def round_to_bf16(x):\n    return x.bfloat16().float()", "bfloat16"),
    ("ch08_quantization", "def round_to_bf16(x):\n    return x.type('torch.BFloat16Tensor').float()", "BFloat16"),
    ("ch08_quantization", "def round_to_bf16(x):\n    with torch.autocast('cpu'):\n        return (x @ torch.eye(1)).float()",
     "autocast"),
    ("ch09_mixed_precision", "class GradScaler(torch.amp.GradScaler):\n    pass", "torch.amp.GradScaler"),
    ("ch09_mixed_precision", "from torch.amp import GradScaler as G", "torch.amp.GradScaler"),
    ("ch09_mixed_precision", "def f():\n    return torch.cuda.amp.GradScaler()", "torch.cuda.amp.GradScaler"),
    ("ch09_mixed_precision", "def f():\n    return torch.amp.grad_scaler.GradScaler('cpu')", "torch.amp.grad_scaler"),
    # code the garbage collector would run during the grader's work: it tells a measured call from the others
    ("ch04_partial_training", "SEEN = [False]\ndef _waiting(box):\n    try:\n        yield box\n    finally:\n"
                              "        SEEN[0] = True", "try or with in a generator"),
    ("ch04_partial_training", "def g(ctx):\n    with ctx:\n        yield 1", "try or with in a generator"),
    ("ch04_partial_training", "def g():\n    try:\n        yield 1\n    except GeneratorExit:\n        pass",
     "try or with in a generator"),
    ("ch04_partial_training", "def g(xs):\n    try:\n        yield from xs\n    except BaseException:\n        raise",
     "try or with in a generator"),
    ("ch04_partial_training", "async def g():\n    return 1", "async def"),
    ("ch04_partial_training", "def f(model):\n    h = model.register_forward_hook(print)\n"
                              "    return h.hooks_dict_ref() is None", "hooks_dict_ref"),
    ("ch03_accumulation", "from torch.utils.data.datapipes.iter import IterableWrapper", "torch.utils.data.datapipes"),
    ("ch03_accumulation", "def f(x):\n    return torch.utils.data.IterDataPipe", "IterDataPipe"),
]


@pytest.mark.parametrize("chapter,source,construct", ATTACKS, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(ATTACKS)])
def test_escapes_and_shortcuts_are_refused(chapter, source, construct):
    found = breaches(source, chapter)
    assert found, f"not refused in {chapter}:\n{source}"
    assert any(construct in b.construct for b in found), [b.construct for b in found]
    assert all(b.line >= 1 and b.why for b in found)


def test_shortcuts_belong_to_their_chapter():
    assert breaches("import torch.utils.checkpoint", "ch00_memory") == []
    assert breaches("def f(x):\n    return x.to(torch.bfloat16)", "ch09_mixed_precision") == []
    assert breaches("import numpy as np", "ch08_quantization") == []
    assert policy_for("ch99_no_such_chapter") is DEFAULT_POLICY


# Every form of IPython-only syntax a cell can hold (IPython's own transformers accept each of them).
IPYTHON_SYNTAX = {
    "%time x = 1": "a line magic", "x = 1\n%timeit x + 1": "a line magic", "%%time\nx = 1": "a cell magic",
    "%%capture out\nx = 1": "a cell magic", "%matplotlib inline": "a line magic", "%load_ext autoreload": "a line magic",
    "%config InlineBackend.figure_format = 'svg'": "a line magic", "  %time x = 1": "a line magic",
    "!ls /": "a shell escape", "!!ls": "a shell escape", "files = !ls": "a shell escape", "x = 1\n  !true": "a shell escape",
    "x?": "IPython help syntax", "x??": "IPython help syntax", "?x": "IPython help syntax", "torch.nn?": "IPython help syntax",
    "%%bash\nls": "a cell magic", "x = %env HOME": "a line magic", ";print a b": "IPython's autocall",
    ",print a b": "IPython's autocall", "/print 1, 2": "IPython's autocall", "%time \\\n  x = 1": "a line magic",
}


@pytest.mark.parametrize("source,what", IPYTHON_SYNTAX.items(), ids=list(IPYTHON_SYNTAX))
def test_ipython_syntax_is_refused_with_its_line(source, what):
    from IPython.core.inputtransformer2 import TransformerManager

    assert TransformerManager().transform_cell(source)  # a notebook kernel would run it
    found = check_source(source, DEFAULT_POLICY)
    assert len(found) == 1 and found[0].not_python, found
    assert found[0].construct.startswith(what), found[0].describe()
    line = next(i for i, text in enumerate(source.splitlines(), 1) if text.strip() != "x = 1")
    assert found[0].describe().startswith(f"line {line} is "), found[0].describe()


def test_the_notebook_shell_is_refused():
    """get_ipython().run_line_magic("time", "...") would run a string the policy never read."""
    found = check_source('def f():\n    return 1\nget_ipython().run_line_magic("time", "import os")\n', DEFAULT_POLICY)
    assert [b.construct for b in found] == ["get_ipython()"], found


def test_a_cell_that_does_not_parse_is_refused():
    found = check_source("def f(:\n    return 1\n", DEFAULT_POLICY)
    assert [b.describe() for b in found] == [
        "line 1 is a syntax error, which is not Python (invalid syntax). Instead: fix the line: the grader "
        "runs the cell as written."]
    for unreadable in ("x = 1\0", "(" * 300 + ")" * 300, "[" * 10_000 + "]" * 10_000):
        assert check_source(unreadable, DEFAULT_POLICY), unreadable[:20]


def test_the_policy_fails_closed(monkeypatch):
    from grader import source_policy

    def broken(self, tree):
        raise KeyError("a bug in the policy")

    monkeypatch.setattr(source_policy._Checker, "run", broken)
    found = check_source("def f(x):\n    return x\n", DEFAULT_POLICY)
    assert [b.construct for b in found] == ["code the grader cannot read"]
    assert "failed (KeyError)" in found[0].describe()


# --- grading ----------------------------------------------------------------------------------------

def test_a_refused_exercise_scores_zero_and_is_not_run(tmp_path, monkeypatch):
    chapter = "ch02_checkpointing"
    lay = autograde.release_layout(chapter)
    forbidden = "import torch.utils.checkpoint as ck\n\ndef checkpoint(function, *args):\n" \
                "    return ck.checkpoint(function, *args, use_reentrant=False)\n"
    path = write(tmp_path, "s", chapter, with_exercise(chapter, "checkpoint", forbidden))
    calls = []

    def fake_run_checks(chapter_, program, grade_ids, limits, setup=None, baseline=None, checks=None):
        calls.append((program, grade_ids))
        return {gid: Outcome(gid, True, "") for gid in grade_ids}

    monkeypatch.setattr(autograde, "run_checks", fake_run_checks)
    result = autograde.grade_one("s", chapter, path, lay, autograde.Limits())
    # (other exercises' docstrings name torch.utils.checkpoint as refused: look for the refused code itself)
    assert not any("import torch.utils.checkpoint as ck" in src for program, _ in calls for src in program), \
        "the refused cell ran"
    assert {gid for _, gids in calls for gid in gids} == {gid for gid, _ in lay.tests} - set(lay.tests_of("checkpoint"))
    # the later exercises, which call checkpoint, run with the course's reference of it
    stand_in = autograde._references(chapter, lay)["checkpoint"]
    assert calls and all(stand_in in program for program, _ in calls)
    assert "checkpoint" in result.note
    for gid in lay.tests_of("checkpoint"):
        o = result.outcomes[gid]
        assert not o.passed and "torch.utils.checkpoint" in o.reason and "line 1" in o.reason
        assert "Instead:" in o.reason
    others = [gid for gid, _ in lay.tests if gid not in lay.tests_of("checkpoint")]
    assert others and all(result.outcomes[gid].passed for gid in others)
    assert result.score == result.max_score - sum(p for gid, p in lay.tests if gid in lay.tests_of("checkpoint"))


def test_the_policy_costs_little_per_cell():
    """Measured, not asserted (STYLE.md): printed for the record with -s."""
    cells = []
    for chapter in chapters():
        lay, sources = _chapter(chapter)
        cells += [(src, policy_for(chapter), lay.setup) for src in sources.values()]
    for src, policy, setup in cells:  # warm: modules resolved once per process
        check_source(src, policy, setup)
    start = time.perf_counter()
    for src, policy, setup in cells:
        check_source(src, policy, setup)
    per_cell = (time.perf_counter() - start) / len(cells)
    print(f"source policy: {per_cell * 1e3:.2f} ms per exercise cell over {len(cells)} cells")


def test_the_reference_submission_is_not_refused(tmp_path, monkeypatch):
    """Through grade_one, with the notebook read back from disk as at autograde."""
    chapter = "ch10_flash_attention"
    path = write(tmp_path, "s", chapter, reference(chapter))
    calls = []
    monkeypatch.setattr(autograde, "run_checks",
                        lambda ch, program, gids, limits, setup=None, baseline=None, checks=None:
                        calls.append(gids) or {g: Outcome(g, True, "") for g in gids})
    lay = autograde.release_layout(chapter)
    result = autograde.grade_one("s", chapter, path, lay, autograde.Limits())
    assert [gid for gids in calls for gid in gids] == [gid for gid, _ in lay.tests]
    assert result.score == result.max_score and not result.note
