"""The hidden tests of chapter 13 accept correct implementations and reject plausible wrong ones.

The correct implementation is the second answer of ``tests/second_submissions_ch13_alam.py``, written from the
released notebook's text alone in a different style from solutions/ch13_alam.py (integer packing by powers of two,
infinities in the padding for the min and max, a heap for the allocation, a kernel loading 2-D blocks), so that a
bug shared by the solution and its hidden tests cannot hide. The configurable answers below break one stated
property each (the contract table at the end names the cell that grades it); the last tests run the same checks
through the sandbox, as the autograder does, where the memory cell reads the worker from outside.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from grader.api import LocalNamespace, checks_for
from grader.notebooks import layout, read_source
from grader.sandbox import judge

from contract_tables import Clause, contract_tests
from sandbox_checks import LIMITS, program, sandbox_tests
from second_submissions_ch13_alam import SECOND
from wrong_submissions_ch13_alam import CACHE_WRONG, WRONG

CHAPTER = "ch13_alam"
CHECKS = checks_for(CHAPTER)
GRADE_IDS = {
    "group_quantize": ["test_group_quantize", "test_group_quantize_errors"],
    "group_dequantize": ["test_group_dequantize"],
    "average_quantize": ["test_average_quantize", "test_average_quantize_errors"],
    "average_dequantize": ["test_average_dequantize"],
    "compressed_bits": ["test_compressed_bits", "test_compressed_bits_errors"],
    "compress_hooks": ["test_compress_hooks", "test_compress_hooks_memory", "test_compress_hooks_errors"],
    "gradnormvar": ["test_gradnormvar", "test_gradnormvar_errors"],
    "allocate_bits": ["test_allocate_bits", "test_allocate_bits_errors"],
    "average_quantize_triton": ["test_average_quantize_triton"],
}


def _setup() -> dict:
    scope: dict = {}
    for src in layout(read_source(CHAPTER), CHAPTER).setup:
        exec(compile(src, "<setup>", "exec"), scope)
    return scope


SETUP = _setup()
SCOPE: dict = dict(SETUP)  # the second answers see each other, as the notebook's cells do
for (_, _ex), _src in SECOND.items():
    exec(compile(_src, f"<{_ex}>", "exec"), SCOPE)
CORRECT = {ex: SCOPE[ex] for ex in GRADE_IDS}


def namespace(**overrides) -> LocalNamespace:
    return LocalNamespace({**SETUP, **CORRECT, **overrides})


def test_every_graded_cell_has_a_check():
    assert set(CHECKS) == {cell for cells in GRADE_IDS.values() for cell in cells}


@pytest.mark.parametrize("exercise", sorted(GRADE_IDS))
def test_second_correct_implementation_passes(exercise):
    ns = namespace()
    for cell in GRADE_IDS[exercise]:
        CHECKS[cell](ns)


# --- configurable answers, one property broken at a time ------------------------------------------------------------
def make_group_quantize(rounding="stochastic", extent="group", order="lsb", guard=True, validate=True):
    """``rounding="nearest"`` (noise 0.5; ``"nearest_large"``: only above 4096 elements); ``extent="tensor"`` (min and max of the whole tensor); ``order``
    "msb" or "byte" (one code per byte); ``guard=False`` (no 2e-6: constant groups divide by 0)."""
    def group_quantize(x, bits, noise, group_size=128):
        if validate:
            if bits not in (1, 2, 4, 8) or group_size <= 0 or group_size % (8 // bits) or noise.shape != x.shape \
                    or x.numel() == 0:
                raise ValueError("bad arguments")
        k = 8 // bits
        flat, u = x.detach().reshape(-1).float(), noise.detach().reshape(-1).float()
        if rounding == "nearest" or (rounding == "nearest_large" and flat.numel() > 4096):
            u = torch.full_like(u, 0.5)
        n = flat.numel()
        G = -(-n // group_size)
        pad = G * group_size - n
        table = torch.cat([flat, flat[-1:].expand(pad)]).view(G, group_size)
        mn, mx = table.amin(1), table.amax(1)
        if extent == "tensor":
            mn, mx = mn.min().expand(G).clone(), mx.max().expand(G).clone()
        scale = (2 ** bits - 1) / (mx - mn + (2e-6 if guard else 0.0))
        q = torch.floor((table - mn[:, None]) * scale[:, None] + F.pad(u, (0, pad)).view(G, group_size))
        q = q.nan_to_num(0).clamp(0, 2 ** bits - 1).long().reshape(-1)
        q[n:] = 0
        if order == "byte":
            return q.to(torch.uint8), mn, scale
        q = q.view(-1, k)
        codes = torch.zeros(q.shape[0], dtype=torch.long)
        for i in range(k):
            codes |= q[:, (k - 1 - i) if order == "msb" else i] << (i * bits)
        return codes.to(torch.uint8), mn, scale
    return group_quantize


def make_group_dequantize(order="lsb"):
    def group_dequantize(codes, mins, scales, bits, shape, group_size=128):
        k = 8 // bits
        n = math.prod(shape)
        c = codes.long()
        q = torch.stack([(c >> (((k - 1 - i) if order == "msb" else i) * bits)) & (2 ** bits - 1) for i in range(k)], 1)
        q = q.reshape(-1, group_size).float()
        return (q / scales[:, None] + mins[:, None]).reshape(-1)[:n].reshape(tuple(shape))
    return group_dequantize


def make_average_quantize(axis="flat", validate=True):
    """``axis="tokens"``: runs taken down the first dimension (across tokens); ``"drop"``: no remainder mean;
    ``"zero_large"``: the remainder's mean 0 above 4096 elements."""
    def average_quantize(x, noise, average=4, group_size=128):
        if validate and (not isinstance(average, int) or isinstance(average, bool) or average <= 0):
            raise ValueError("average must be a positive int")
        flat = (x.detach().reshape(x.shape[0], -1).t() if axis == "tokens" and x.dim() > 1 else x.detach())
        flat = flat.reshape(-1).float()
        n = flat.numel()
        M = -(-n // average)
        if validate and tuple(noise.shape) != (M,):
            raise ValueError("noise must have shape (M,)")
        whole = n // average
        means = flat[:whole * average].view(whole, average).mean(1)
        if M > whole:
            last = flat[whole * average:].mean().view(1) if axis != "drop" else flat[-1:] * 0 + means[-1:]
            if axis == "zero_large" and n > 4096:
                last = last * 0
            means = torch.cat([means, last])
        return CORRECT["group_quantize"](means, 2, noise.reshape(-1)[:M] if not validate else noise, group_size)
    return average_quantize


def make_average_dequantize(repeat="interleave"):
    def average_dequantize(codes, mins, scales, shape, average=4, group_size=128):
        n = math.prod(shape)
        M = -(-n // average)
        means = CORRECT["group_dequantize"](codes, mins, scales, 2, (M,), group_size)
        full = means.repeat_interleave(average) if repeat == "interleave" else means.repeat(average)
        return full[:n].reshape(tuple(shape))
    return average_dequantize


def make_compressed_bits(overhead=True, padded=True, aq_bits=2, validate=True):
    def compressed_bits(n, bits, group_size=128, average=4):
        if validate and (not isinstance(n, int) or isinstance(n, bool) or n <= 0 or group_size <= 0 or average <= 0
                         or not isinstance(group_size, int) or not isinstance(average, int)
                         or bits not in (32, 8, 4, 2, 1, 0.5)):
            raise ValueError("bad arguments")
        if bits == 32:
            return 32 * n
        elements, b = (-(-n // average), aq_bits) if bits == 0.5 else (n, int(bits))
        groups = -(-elements // group_size)
        codes = groups * group_size * b if padded else elements * b
        return int(codes + (64 * groups if overhead else 0))
    return compressed_bits


def make_compress_hooks(params="skip", rounding="stochastic", count="compressed", seed_from="pair", extra=None,
                        validate=True, cache=False):
    """``params="compress"``: parameters compressed too; ``rounding="nearest"``; ``count="all"``: every tensor
    counted; ``seed_from="global"``: noise from torch's global generator (``"global_seeded"``: seeded with
    ``seed`` when the pair is made); ``extra="float"``: the float tensor kept beside the codes (``"frozenset"``:
    inside a frozenset); ``rounding="nearest_large"``: nearest above 2^18 elements; ``cache``: every packed
    tensor kept in a list."""
    def compress_hooks(bits_per_tensor, seed=0):
        bits = list(bits_per_tensor)
        if validate and (not bits or any(isinstance(b, bool) or b not in (32, 8, 4, 2, 1, 0.5) for b in bits)):
            raise ValueError("bad precisions")
        gen = torch.Generator().manual_seed(seed)
        if seed_from == "global_seeded":
            torch.manual_seed(seed)
        state = {"i": 0, "kept": []}

        def noise(shape):
            if rounding == "nearest" or (rounding == "nearest_large" and math.prod(shape) > 2**18):
                return torch.full(shape, 0.5)
            return torch.rand(shape, generator=gen) if seed_from == "pair" else torch.rand(shape)

        def pack(t):
            eligible = t.is_floating_point() and t.requires_grad and (params == "compress" or not SETUP["is_parameter"](t))
            if count == "all":
                b = bits[state["i"] % len(bits)]
                state["i"] += 1
            if not eligible:
                return t
            if count != "all":
                b = bits[state["i"] % len(bits)]
                state["i"] += 1
            if cache:
                state["kept"].append(t.detach())
            if b == 32:
                return t
            if b == 0.5:
                packed = ("aq", CORRECT["average_quantize"](t, noise((-(-t.numel() // 4),))), t.shape, t.dtype)
            else:
                packed = (b, CORRECT["group_quantize"](t, b, noise(tuple(t.shape))), t.shape, t.dtype)
            return packed + ((t.detach(),) if extra == "float" else (frozenset([t.detach()]),)
                             if extra == "frozenset" else ())

        def unpack(p):
            if isinstance(p, torch.Tensor):
                return p
            b, (c, m, s), shape, dtype = p[:4]
            if b == "aq":
                return CORRECT["average_dequantize"](c, m, s, shape).to(dtype)
            return CORRECT["group_dequantize"](c, m, s, b, shape).to(dtype)

        return pack, unpack
    return compress_hooks


def make_gradnormvar(variant="right", validate=True):
    """``variant``: "one_pair" (||g0 - g1||^2 only), "no_factor" (no 2), "no_cap", "not_squared"."""
    def gradnormvar(g0, g1, g2):
        if validate and (g0.dim() != 1 or g1.dim() != 1 or g2.dim() != 1 or not g0.shape == g1.shape == g2.shape):
            raise ValueError("1-D, one length")
        power = 1 if variant == "not_squared" else 2
        d = lambda a, b: float((a.double() - b.double()).norm()) ** power
        factor = 1 if variant == "no_factor" else 2
        c = d(g0, g1) if variant == "one_pair" else max(d(g0, g1), factor * max(d(g0, g2), d(g1, g2)))
        if variant == "no_cap":
            return c
        return c if math.isfinite(c) and c <= 1e10 else 1e10
    return gradnormvar


def make_allocate_bits(ladder=(32, 8, 4, 2, 0.5), per_element=True, pick="least", stop="at_budget", aq_saves=1.5,
                       ties="lowest", validate=True):
    def w(b):
        return 0.0 if b == 32 else 1.0 if b == 0.5 else 1.0 / (2 ** b - 1) ** 2

    def allocate_bits(sensitivity, sizes, average_bits):
        c, n = list(sensitivity), list(sizes)
        if validate and (len(c) != len(n) or not n or any(not isinstance(m, int) or m <= 0 for m in n)
                         or any(not math.isfinite(x) or x < 0 for x in c) or not average_bits > 0):
            raise ValueError("bad arguments")
        bits = [32] * len(n)
        budget = average_bits * sum(n)
        while True:
            total = sum(b * m for b, m in zip(bits, n))
            if total <= budget or (stop == "early" and total <= budget + min(n) * 2):
                break
            options = []
            for l, b in enumerate(bits):
                if b == ladder[-1]:
                    continue
                down = ladder[ladder.index(b) + 1]
                saved = aq_saves if (b, down) == (2, 0.5) else b - down
                options.append((c[l] * (w(down) - w(b)) / ((n[l] if per_element else 1) * saved), l, down))
            if not options:
                break
            if pick == "most":
                chosen = max(options, key=lambda o: (o[0], -o[1]))
            elif ties == "highest":
                chosen = min(options, key=lambda o: (o[0], -o[1]))
            else:
                chosen = min(options, key=lambda o: (o[0], o[1]))
            bits[chosen[1]] = chosen[2]
        return bits
    return allocate_bits


def make_triton(where="kernel"):
    """``where="torch"``: the kernel launched, the answer computed again with torch and returned; ``"python"``:
    the kernel's outputs rebuilt from Python lists (no operator computes, no store writes what is returned)."""
    def average_quantize_triton(x, noise):
        launched = CORRECT["average_quantize_triton"](x, noise)
        if where == "python":
            return tuple(torch.tensor(t.tolist(), dtype=t.dtype) for t in launched)
        return CORRECT["average_quantize"](x, noise) if where == "torch" else launched
    return average_quantize_triton


def test_the_configurable_answers_are_right_when_nothing_is_broken():
    ns = namespace(group_quantize=make_group_quantize(), group_dequantize=make_group_dequantize(),
                   average_quantize=make_average_quantize(), average_dequantize=make_average_dequantize(),
                   compressed_bits=make_compressed_bits(), compress_hooks=make_compress_hooks(),
                   gradnormvar=make_gradnormvar(), allocate_bits=make_allocate_bits())
    for exercise, cells in GRADE_IDS.items():
        for cell in cells:
            if cell not in ("test_compress_hooks_memory", "test_average_quantize_triton"):
                CHECKS[cell](ns)


def test_second_implementation_matches_the_notebook_examples():
    gq, bits, alloc = CORRECT["group_quantize"], CORRECT["compressed_bits"], CORRECT["allocate_bits"]
    codes, mins, _ = gq(torch.tensor([0.0, 1.0, 2.0, 3.0, 0.5, 2.5]), 2, torch.zeros(6), group_size=4)
    assert codes.tolist() == [0 + (1 << 4) + (2 << 6), 2 << 2] and mins.tolist() == [0.0, 0.5]
    assert bits(1000, 2) == 8 * (128 * 2 + 64) and bits(1000, 0.5) == 2 * (128 * 2 + 64)
    assert alloc([1.0, 100.0], [100, 100], 4) == [2, 4] and alloc([1.0, 1.0], [100, 100], 20) == [8, 32]


# --- the contract, clause by clause (tests/contract_tables.py) -------------------------------------------
def _breaking(exercise: str, factory):
    return lambda **flags: {exercise: factory(**flags)}


_gq, _gd, _aq, _ad, _cb, _ch, _gnv, _ab, _tr = (_breaking(ex, f) for ex, f in (
    ("group_quantize", make_group_quantize), ("group_dequantize", make_group_dequantize),
    ("average_quantize", make_average_quantize), ("average_dequantize", make_average_dequantize),
    ("compressed_bits", make_compressed_bits), ("compress_hooks", make_compress_hooks),
    ("gradnormvar", make_gradnormvar), ("allocate_bits", make_allocate_bits),
    ("average_quantize_triton", make_triton)))


CONTRACT = [
    Clause("group_quantize", "floor((x - min) * scale + u)", ("test_group_quantize",), _gq(rounding="nearest"),
           "stochastic rounding"),
    Clause("group_quantize", "one flat tensor of 2^20 to 2^21 elements", ("test_group_quantize",),
           _gq(rounding="nearest_large"), "stochastic rounding"),
    Clause("group_quantize", "the minimum over the group's real elements", ("test_group_quantize",),
           _gq(extent="tensor"), "not over the whole tensor"),
    Clause("group_quantize", "least significant bits first", ("test_group_quantize",), _gq(order="msb"),
           "least significant bits first"),
    Clause("group_quantize", "packed 8 / bits codes per byte", ("test_group_quantize",), _gq(order="byte"),
           "one code per byte"),
    Clause("group_quantize", "scale = (2**bits - 1) / (max - min + 2e-6)", ("test_group_quantize",),
           _gq(guard=False), "not finite"),
    Clause("group_quantize", "bits not in {1, 2, 4, 8}; group_size not a positive multiple of 8 / bits",
           ("test_group_quantize_errors",), _gq(validate=False), "should raise ValueError"),
    Clause("group_dequantize", "q_p the code at position p of the layout", ("test_group_dequantize",),
           _gd(order="msb"), "least significant bits first"),
    Clause("average_quantize", "the mean of elements [i*average, (i+1)*average)", ("test_average_quantize",),
           _aq(axis="tokens"), "contiguous flattened elements"),
    Clause("average_quantize", "one last mean over the n % average remaining elements", ("test_average_quantize",),
           _aq(axis="drop"), "a remainder giving one last mean"),
    Clause("average_quantize", "elements with a remainder (n % 4 != 0, drawn at grading time)",
           ("test_average_quantize",), _aq(axis="zero_large"), "a remainder giving one last mean"),
    Clause("average_quantize", "noise not of shape (M,); average not a positive int",
           ("test_average_quantize_errors",), _aq(validate=False), "should raise ValueError"),
    Clause("average_dequantize", "repeat each ``average`` times", ("test_average_dequantize",),
           _ad(repeat="tile"), "repeat each `average` times"),
    Clause("compressed_bits", "a float32 min and scale per group", ("test_compressed_bits",),
           _cb(overhead=False), "64 bits \\(a float32 min and a float32 scale\\) per group"),
    Clause("compressed_bits", "G * group_size * b + 64 * G", ("test_compressed_bits",), _cb(padded=False),
           "the codes of the padded groups"),
    Clause("compressed_bits", "the same at 2 bits for the M = ceil(n / average) means", ("test_compressed_bits",),
           _cb(aq_bits=1), "expected the int"),
    Clause("compressed_bits", "bits not one of the six", ("test_compressed_bits_errors",), _cb(validate=False),
           "should raise ValueError"),
    Clause("compress_hooks", "requires grad and is not a parameter", ("test_compress_hooks",),
           _ch(params="compress"), "a parameter is never compressed"),
    Clause("compress_hooks", "The l-th compressed tensor that pack sees", ("test_compress_hooks",), _ch(count="all"),
           "hold \\d+ bytes, expected"),
    Clause("compress_hooks", "noise = torch.rand(shape, generator=g)", ("test_compress_hooks",),
           _ch(rounding="nearest"), "stochastic rounding"),
    Clause("compress_hooks", "two pairs made with the same seed compress the same tensors identically",
           ("test_compress_hooks",), _ch(seed_from="global"), "same seed"),
    Clause("compress_hooks", "the pair draws nothing from torch's global generator", ("test_compress_hooks",),
           _ch(seed_from="global_seeded"), "same seed"),
    Clause("compress_hooks", "Any other object in the packed value fails the cell", ("test_compress_hooks",),
           _ch(extra="frozenset"), "holds a frozenset"),
    Clause("compress_hooks", "the dequantized values of that pack with the pair's noise",
           ("test_compress_hooks_memory",), _ch(rounding="nearest_large"), "the pair's noise"),
    Clause("compress_hooks", "codes, mins, scales and plain Python values", ("test_compress_hooks",),
           _ch(extra="float"), "no other tensor"),
    Clause("compress_hooks", "the process may hold at most its compressed bytes plus 1 MiB",
           ("test_compress_hooks_memory",), _ch(cache=True), "read from outside your process"),
    Clause("compress_hooks", "an entry that is not one of the six precisions", ("test_compress_hooks_errors",),
           _ch(validate=False), "should raise ValueError"),
    Clause("gradnormvar", "max(||g0 - g1||^2, 2 * max(||g0 - g2||^2, ||g1 - g2||^2))", ("test_gradnormvar",),
           _gnv(variant="one_pair"), "expected"),
    Clause("gradnormvar", "max(||g0 - g1||^2, 2 * max(||g0 - g2||^2, ||g1 - g2||^2))", ("test_gradnormvar",),
           _gnv(variant="no_factor"), "expected", label="gradnormvar-factor-two"),
    Clause("gradnormvar", "(squared L2 norms)", ("test_gradnormvar",), _gnv(variant="not_squared"), "squared"),
    Clause("gradnormvar", "or 1e10 when that is not finite or exceeds 1e10", ("test_gradnormvar",),
           _gnv(variant="no_cap"), "1e10 when not finite"),
    Clause("gradnormvar", "an argument that is not 1-D, or lengths that differ", ("test_gradnormvar_errors",),
           _gnv(validate=False), "should raise ValueError"),
    Clause("allocate_bits", "the next rung", ("test_allocate_bits",), _ab(ladder=(32, 16, 8, 4, 2, 1, 0.5)),
           "one rung down 32 -> 8 -> 4 -> 2 -> 0.5"),
    Clause("allocate_bits", "C_l * (w(b') - w(b)) / (n_l * (b - b'))", ("test_allocate_bits",),
           _ab(per_element=False), "expected"),
    Clause("allocate_bits", "(so 2 -> 0.5 divides by 1.5)", ("test_allocate_bits",), _ab(aq_saves=1.0),
           "saves 1.5"),
    Clause("allocate_bits", "the least priority", ("test_allocate_bits",), _ab(pick="most"), "least"),
    Clause("allocate_bits", "on equal priorities the lowest index", ("test_allocate_bits",), _ab(ties="highest"),
           "ties to the lowest index"),
    Clause("allocate_bits", "While sum(b_l * n_l) > average_bits * sum(n_l)", ("test_allocate_bits",),
           _ab(stop="early"), "until sum"),
    Clause("allocate_bits", "a sensitivity that is negative or not finite", ("test_allocate_bits_errors",),
           _ab(validate=False), "should raise ValueError"),
    Clause("average_quantize_triton", "PyTorch does nothing around the launch", ("test_average_quantize_triton",),
           _tr(where="torch"), "PyTorch ran"),
    Clause("average_quantize_triton", "every element of codes, mins and scales is written by the kernel's stores",
           ("test_average_quantize_triton",), _tr(where="python"), "not written by the kernel's stores"),
]

test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
    test_contract_covers_every_graded_cell = contract_tests(CHAPTER, CONTRACT, namespace, CHECKS, globals())


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(CHAPTER, WRONG)


def test_sandbox_memory_wrong_loses_only_its_memory_cell():
    """Hooks that keep every packed tensor in a list: every value right, the float tensor kept. The worker's
    cgroup shows it, so the memory cell fails and the exercise's other cells pass."""
    program_ = program(CHAPTER, {"compress_hooks": CACHE_WRONG[(CHAPTER, "compress_hooks")]})
    outcomes = judge.run_checks(CHAPTER, program_, GRADE_IDS["compress_hooks"], LIMITS, checks=CHECKS)
    lost = {gid: o.reason for gid, o in outcomes.items() if not o.passed}
    assert list(lost) == ["test_compress_hooks_memory"], lost
    assert "read from outside your process" in lost["test_compress_hooks_memory"]
