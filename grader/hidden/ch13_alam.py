"""Hidden tests of chapter 13 (ALAM), one graded cell per property.

``group_quantize`` (``test_group_quantize``) is compared with the judge's own float32 implementation of the
layout the docstring fixes, on fixed shapes, one flat tensor of 2^20 to 2^21 elements drawn at grading time, all four precisions, group sizes 128, 32 and 8 / bits, float64
and bfloat16 inputs and one 2-D shape (up to 64 × 64) drawn at grading time: codes position by position
(exactly, except where the judge's (x - min) * scale + u lies within 1e-3 of an integer, where a float
rounding may move it by one), padding codes 0, mins and scales to float32 rounding, dtypes and shapes. A
wrong answer is matched against the plausible ones (most significant bits first, one code per byte, rounding
to nearest, a minimum over the whole tensor) to name its mistake; constant groups (finite scale, codes 0), a
single element and one partial group are among the cases. ``_errors``: the ValueErrors the docstring lists.
``group_dequantize`` gets the judge's codes and is compared with q / scale + min.

``average_quantize`` is compared with the judge's means (a remainder's own mean) quantized by the judge's
layout, with the same allowance, on fixed shapes and a drawn one of 2^20 to 2^21 elements with a remainder; averaging across the wrong axis (columns) or dropping the remainder is
named. ``average_dequantize`` gets the judge's codes. ``compressed_bits`` is exact integer arithmetic.

``compress_hooks`` (``test_compress_hooks``): the judge drives the student's pack and unpack in the worker
with ``probes.ch13_pack_run`` (which only calls them and reports what came back: whether pack returned the
very object, the tensors inside what it returned with the real sizes of their storages, the first object in
it that is neither a tuple, list or dict, a plain tensor nor a plain value, unpack's result); the judge
refuses any such object, counts the storages' bytes (they must be exactly ``compressed_bits / 8``), checks
every dequantized element within one step of the tensor (the mean of its run for AQ), the mean of 100 packs at
2 bits on (4, 64) and on a drawn size (stochastic rounding), two pairs of one seed packing in turns and
agreeing with torch's global generator untouched (``probes.ch13_same_seed``), and the gradients of a small
model run under the hooks at 8 bits (``probes.ch13_hooked_grads``) within 5% of its own.
``test_compress_hooks_memory`` is decided from outside the process (``grader.resources.Meter``, one per
measured call): a pack at 2 bits of a float32 tensor of 28 × 2^20 to 32 × 2^20 elements and one at a precision
drawn from 8, 4, 1, AQ of 12 × 2^20 to 15 × 2^20, sizes drawn at grading time, the tensor released: the
process may keep the compressed bytes plus 1 MiB (4-bit codes posing as 2-bit keep n / 4 = 7 MiB or more, past
the 1 MiB slack plus the 5 MiB ballast could hide). Unpack of that very value is compared at 2048 entries
drawn at grading time with the judge's quantization under the pair's noise.

``gradnormvar`` and ``allocate_bits`` are pure: exact comparisons with the judge's own, on tables made to
tell the wrong answers apart and on tables drawn at grading time (without near-ties).

``average_quantize_triton`` runs under ``probes.ch10_triton_run`` (every access of Triton's interpreter
checked, the operators around the launch traced): values as ``average_quantize``'s, at least one launch,
no lane outside its tensor, only allocation, view and copy operators besides the launch, and every element of
codes, mins and scales (one of them per call, ``probes.ch13_triton_part``) written by the kernel's stores.
"""
from __future__ import annotations

import math
import random

import torch
from torch import nn

from coursekit.checks import check_close, same_close, same_values
from grader import probes
from grader.api import fetch, hidden_test
from grader.resources import MiB, Meter, draw, mib, new_seed, seeded
from grader.source_policy import Shortcut, SourcePolicy

# The course's kernel module computes average_quantize's answer (aq_pack_torch, aq_pack_triton, ...).
SOURCE_POLICY = SourcePolicy(modules=("triton",), refused=("numpy",), shortcuts=(
    Shortcut(paths=("coursekit.capstone",),
             instead="write it yourself; coursekit.capstone (chapter 16's reference fine-tune) holds "
                     "the course's own activation compression hooks"),
    Shortcut(paths=("kernels.ch13_alam",),
             instead="write the quantization yourself; kernels.ch13_alam is the course's own answer"),
    Shortcut(pattern=r"^numpy$", instead="compute with torch (or Triton) operations"),
))

BITS = (1, 2, 4, 8)
SHAPES = ((37, 53), (3, 5, 7), (256,), (2, 1, 130))
NEAR = 1e-3  # codes within this of a rounding boundary may move by one
LAYOUT_HINT = ("the layout: groups of group_size consecutive flattened elements, per-group min and "
               "scale = (2**bits - 1) / (max - min + 2e-6), code floor((x - min) * scale + u) clamped, "
               "8 / bits codes per byte, least significant bits first")
PACK_HINT = "position j*k + i goes to bits [i*bits, (i+1)*bits) of byte j: least significant bits first"
BYTES_HINT = "pack 8 / bits codes per byte, padding included: G * group_size * bits / 8 bytes"
ROUND_HINT = "stochastic rounding: floor((x - min) * scale + u) with the noise given, not rounding to nearest"
GROUP_HINT = "min and max per group of group_size elements, not over the whole tensor"
MEAN_HINT = ("means of runs of `average` contiguous flattened elements (row-major, along the last dimension), "
             "a remainder giving one last mean over its own elements")
PACKED_HINT = ("pack returns \"a tuple of the three tensors codes, mins, scales and plain Python values: no other "
               "tensor\" (tuples, lists or dicts of those; plain values: int, float, str, bool, None, torch.dtype, "
               "torch.Size), each tensor's storage exactly its size (not a view into a larger one)")
AQ_SLACK = 1 * MiB
MEAN_LOW, MEAN_HIGH = 8192, 32768  # the drawn size of the mean-of-packs check
MEM_OTHER = (8, 4, 1, 0.5)  # the memory cell's second precision is drawn from these
MEM_LOW, MEM_HIGH = 28 * 2**20, 32 * 2**20  # at 2 bits: 4-bit codes keep n / 4 more, beyond what ballast hides
OTHER_LOW, OTHER_HIGH = 12 * 2**20, 15 * 2**20  # the second precision (a float copy keeps 48 MiB or more)
LARGE_LOW, LARGE_HIGH = 2**20, 2**21  # the large value cases of group_quantize and average_quantize
TRITON_OPS = {"empty", "empty_like", "new_empty", "set_", "copy_", "zeros", "zeros_like", "view", "clone",
              "reshape", "_to_copy", "detach", "alias", "_unsafe_view", "contiguous", "lift_fresh"}


# --- the judge's references -------------------------------------------------------------------------------------
def _ref_quantize(x: torch.Tensor, bits: int, noise: torch.Tensor, group_size: int, nearest: bool = False,
                  whole: bool = False):
    """codes, mins, scales of the layout, and per padded position the code and (x - min) * scale + u in
    float64 (for the rounding allowance). ``nearest``/``whole``: the wrong answers' rounding or minimum."""
    flat = x.detach().reshape(-1).to(torch.float32)
    u = noise.detach().reshape(-1).to(torch.float32)
    if nearest:
        u = torch.full_like(u, 0.5)
    n = flat.numel()
    groups = -(-n // group_size)
    pad = groups * group_size - n
    real = torch.cat([torch.ones(n, dtype=torch.bool), torch.zeros(pad, dtype=torch.bool)]).view(groups, group_size)
    table = torch.cat([flat, flat.new_zeros(pad)]).view(groups, group_size)
    uu = torch.cat([u, u.new_zeros(pad)]).view(groups, group_size)
    mins = torch.where(real, table, torch.inf).amin(1)
    maxs = torch.where(real, table, -torch.inf).amax(1)
    if whole:
        mins, maxs = mins.min().expand(groups).clone(), maxs.max().expand(groups).clone()
    scales = (2 ** bits - 1) / (maxs - mins + 2e-6)
    pre32 = (table - mins[:, None]) * scales[:, None] + uu
    q = torch.floor(pre32).clamp(0, 2 ** bits - 1).to(torch.int64)
    q = torch.where(real, q, 0).reshape(-1)
    pre = ((table.double() - mins.double()[:, None]) * scales.double()[:, None] + uu.double()).reshape(-1)
    return _pack(q, bits), mins, scales, q, pre, real.reshape(-1)


def _pack(q: torch.Tensor, bits: int, msb: bool = False) -> torch.Tensor:
    k = 8 // bits
    q = q.view(-1, k)
    out = torch.zeros(q.shape[0], dtype=torch.int64)
    for i in range(k):
        out |= q[:, (k - 1 - i) if msb else i] << (i * bits)
    return out.to(torch.uint8)


def _unpack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    k = 8 // bits
    c = codes.to(torch.int64)
    return torch.stack([(c >> (i * bits)) & (2 ** bits - 1) for i in range(k)], 1).reshape(-1)


def _means(x: torch.Tensor, average: int, axis: str = "flat") -> torch.Tensor:
    flat = x.detach().reshape(-1).to(torch.float32)
    if axis == "drop":
        flat = flat[:flat.numel() // average * average]
    n = flat.numel()
    whole = n // average
    means = flat[:whole * average].view(whole, average).mean(1)
    if -(-n // average) > whole:
        means = torch.cat([means, flat[whole * average:].mean().view(1)])
    return means


def _got_triple(got, where: str):
    if not isinstance(got, (tuple, list)) or len(got) != 3 or not all(isinstance(t, torch.Tensor) for t in got):
        raise AssertionError(f"{where}: expected a tuple (codes, mins, scales) of three tensors, got "
                             f"{type(got).__name__}")
    return got


def _compare_codes(got, x, bits, noise, group_size, where, quantized=None, hint=LAYOUT_HINT,
                   alternatives=None) -> None:
    """The student's (codes, mins, scales) against the judge's layout, with the rounding allowance."""
    codes, mins, scales = _got_triple(got, where)
    ref_codes, ref_mins, ref_scales, q, pre, real = quantized or _ref_quantize(x, bits, noise, group_size)
    groups = ref_mins.numel()
    if codes.dtype != torch.uint8 or codes.dim() != 1:
        raise AssertionError(f"{where}: codes is {codes.dtype} of shape {tuple(codes.shape)}, expected a flat "
                             f"torch.uint8 tensor. {BYTES_HINT}")
    if codes.numel() != ref_codes.numel():
        extra = " (one code per byte?)" if codes.numel() == ref_codes.numel() * (8 // bits) else ""
        raise AssertionError(f"{where}: codes holds {codes.numel()} bytes, expected {ref_codes.numel()} for "
                             f"{groups} groups of {group_size}{extra}. {BYTES_HINT}")
    for name, a, e in (("mins", mins, ref_mins), ("scales", scales, ref_scales)):
        if a.dtype != torch.float32 or tuple(a.shape) != (groups,):
            raise AssertionError(f"{where}: {name} is {a.dtype} of shape {tuple(a.shape)}, expected torch.float32 "
                                 f"of shape ({groups},)")
    alternatives = alternatives or {}
    if not (torch.isfinite(mins).all() and torch.isfinite(scales).all()):
        raise AssertionError(f"{where}: mins or scales are not finite: a constant group (a single element, too) has "
                             "max - min = 0, and the 2e-6 in scale = (2**bits - 1) / (max - min + 2e-6) keeps it finite")
    if not same_close(mins.double(), ref_mins.double(), rtol=1e-6, atol=1e-6):
        whole = _ref_quantize(x, bits, noise, group_size, whole=True)[1]
        if groups > 1 and same_close(mins.double(), whole.double(), rtol=1e-6, atol=1e-6):
            hint = GROUP_HINT
        check_close(mins, ref_mins, f"{where}: mins", alternatives.get("mins", hint), atol=1e-6, rtol=1e-6)
    check_close(scales, ref_scales, f"{where}: scales", hint, atol=1e-6, rtol=1e-5)
    got_q = _unpack(codes, bits)
    diff = (got_q - q).abs()
    boundary = (pre - pre.round()).abs() < NEAR
    bad = (diff > 1) | ((diff == 1) & ~(boundary & real))
    if bad.any():
        if same_values(codes, _pack(q, bits, msb=True)) and bits < 8:
            hint = PACK_HINT
        elif same_values(codes, _ref_quantize(x, bits, noise, group_size, nearest=True)[0]):
            hint = ROUND_HINT
        elif bool(((got_q - q).abs() <= 1).all()) and bool(real.all()) is False and \
                bool((got_q[~real] != 0).any()):
            hint = "the padding positions n .. G*group_size - 1 hold code 0"
        i = int(torch.nonzero(bad)[0])
        raise AssertionError(f"{where}: {int(bad.sum())} of {q.numel()} codes differ from the layout's, first at "
                             f"position {i} (group {i // group_size}): got {int(got_q[i])}, expected {int(q[i])}. "
                             f"{hint}")


def _case(shape, seed, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * scale).to(dtype)
    u = torch.rand(shape, generator=g)
    return x, u


def _drawn_shape() -> tuple[int, int]:
    return (draw(1, 64), draw(2, 64))


# --- group_quantize -------------------------------------------------------------------------------------------------
@hidden_test("test_group_quantize")
def check_group_quantize(nb):
    cases = []
    for bits in BITS:
        for i, shape in enumerate(SHAPES):
            for gs in (128, 32, 8 // bits):
                cases.append((shape, bits, gs, 100 * bits + 10 * i + gs % 7, torch.float32))
    cases += [((37, 53), 4, 128, 7, torch.float64), ((9, 33), 2, 32, 8, torch.bfloat16)]
    seed = new_seed()
    cases += [(_drawn_shape(), bits, gs, seed + bits, torch.float32) for bits in BITS for gs in (128, 32)]
    cases.append(((draw(LARGE_LOW, LARGE_HIGH),), random.SystemRandom().choice(BITS), 128, seed + 9, torch.float32))
    for shape, bits, gs, s, dtype in cases:
        x, u = _case(shape, s, dtype, scale=3.0)
        where = f"group_quantize(x of shape {shape}, {dtype}, bits={bits}, group_size={gs})"
        _compare_codes(fetch(nb.group_quantize(x, bits, u, group_size=gs)), x, bits, u, gs, where)
    _edge_cases(nb)


def _edge_cases(nb):
    g = torch.Generator().manual_seed(5)
    constant = torch.full((6, 50), -1.25)
    constant[3:] = torch.randn(3, 50, generator=g)  # constant groups first, then varied ones
    cases = [("constant groups", constant, 4, 32), ("constant groups", torch.full((300,), 3.0), 2, 128),
             ("a single element", torch.tensor([0.7]), 8, 128), ("a single element", torch.tensor([[-2.0]]), 1, 8),
             ("one partial group", torch.randn(5, generator=g), 2, 128)]
    for what, x, bits, gs in cases:
        u = torch.rand(x.shape, generator=g)
        where = f"group_quantize on {what} (shape {tuple(x.shape)}, bits={bits}, group_size={gs})"
        _compare_codes(fetch(nb.group_quantize(x, bits, u, group_size=gs)), x, bits, u, gs, where)


def _raises(nb, fn, *args, **kwargs) -> bool:
    got = fetch(nb.apply(probes.raised, fn, *args, **kwargs))
    return got is not None and "ValueError" in got


@hidden_test("test_group_quantize_errors")
def check_group_quantize_errors(nb):
    x, u = torch.randn(4, 16), torch.rand(4, 16)
    for call, args, kwargs in (
            ("bits=3", (x, 3, u), {}), ("bits=16", (x, 16, u), {}), ("bits=0", (x, 0, u), {}),
            ("group_size=0", (x, 2, u), {"group_size": 0}), ("group_size=-128", (x, 2, u), {"group_size": -128}),
            ("group_size=6 at 2 bits (not a multiple of 4)", (x, 2, u), {"group_size": 6}),
            ("group_size=4 at 1 bit (not a multiple of 8)", (x, 1, u), {"group_size": 4}),
            ("noise of shape (64,) for x of shape (4, 16)", (x, 2, u.reshape(-1)), {}),
            ("an empty x", (torch.zeros(0), 2, torch.zeros(0)), {})):
        if not _raises(nb, nb.group_quantize, *args, **kwargs):
            raise AssertionError(f"group_quantize with {call} should raise ValueError")
    if _raises(nb, nb.group_quantize, x, 8, u, group_size=1):
        raise AssertionError("group_quantize with bits=8 and group_size=1 (a multiple of 8 / 8) is valid, "
                             "but it raised ValueError")


# --- group_dequantize -----------------------------------------------------------------------------------------------
@hidden_test("test_group_dequantize")
def check_group_dequantize(nb):
    seed = new_seed()
    for bits in BITS:
        for j, (shape, gs) in enumerate(((SHAPES[j % 4], gs) for j, gs in enumerate((128, 32, 8 // bits, 128)))):
            x, u = _case(shape, seed + 10 * bits + j, scale=2.0)
            codes, mins, scales, q, _, real = _ref_quantize(x, bits, u, gs)
            want = (q.view(-1, gs).float() / scales[:, None] + mins[:, None]).reshape(-1)[:x.numel()].view(shape)
            where = f"group_dequantize at bits={bits}, group_size={gs}, shape {shape}"
            got = fetch(nb.group_dequantize(codes, mins, scales, bits, shape, group_size=gs))
            check_close(got, want, where, "element p is q_p / scales[g] + mins[g], g = p // group_size, q_p the "
                        "code at position p (least significant bits first)", atol=1e-5, rtol=1e-5)


# --- average_quantize -----------------------------------------------------------------------------------------------
AQ_SHAPES = ((37, 53), (3, 5, 7), (2, 6), (4, 128))


def _aq_cases():
    seed = new_seed()
    cases = [(shape, avg, gs, 50 + i, torch.float32) for i, shape in enumerate(AQ_SHAPES)
             for avg, gs in ((4, 128), (3, 32))]
    cases.append(((37, 53), 4, 128, 61, torch.float64))
    cases.append((_drawn_shape(), 4, 128, seed, torch.float32))
    return cases


@hidden_test("test_average_quantize")
def check_average_quantize(nb):
    # A remainder (n % 4 != 0) whose mean is alone in the last group: its min is that mean.
    large = (512 * draw(LARGE_LOW // 512, LARGE_HIGH // 512) + draw(1, 3),)
    for shape, avg, gs, s, dtype in _aq_cases() + [(large, 4, 128, new_seed(), torch.float32)]:
        g = torch.Generator().manual_seed(s)
        x = (torch.randn(shape, generator=g) * 2).to(dtype)
        means = _means(x, avg)
        u = torch.rand(means.shape, generator=g)
        where = f"average_quantize(x of shape {shape}, {dtype}, average={avg}, group_size={gs})"
        got = fetch(nb.average_quantize(x, u, average=avg, group_size=gs))
        _compare_codes(got, means, 2, u, gs, where, hint=MEAN_HINT, alternatives={"mins": MEAN_HINT})


@hidden_test("test_average_quantize_errors")
def check_average_quantize_errors(nb):
    x = torch.randn(10)
    for call, args, kwargs in (("noise of shape (10,) for 10 elements (3 means)", (x, torch.rand(10)), {}),
                               ("noise of shape (3, 1)", (x, torch.rand(3, 1)), {}),
                               ("average=0", (x, torch.rand(3)), {"average": 0}),
                               ("average=-4", (x, torch.rand(3)), {"average": -4}),
                               ("average=2.5", (x, torch.rand(4)), {"average": 2.5})):
        if not _raises(nb, nb.average_quantize, *args, **kwargs):
            raise AssertionError(f"average_quantize with {call} should raise ValueError")


@hidden_test("test_average_dequantize")
def check_average_dequantize(nb):
    for shape, avg, gs, s, _ in _aq_cases():
        g = torch.Generator().manual_seed(s)
        x = torch.randn(shape, generator=g)
        means = _means(x, avg)
        u = torch.rand(means.shape, generator=g)
        codes, mins, scales, q, _, _ = _ref_quantize(means, 2, u, gs)
        hat = (q.view(-1, gs).float() / scales[:, None] + mins[:, None]).reshape(-1)[:means.numel()]
        want = hat.repeat_interleave(avg)[:x.numel()].view(shape)
        got = fetch(nb.average_dequantize(codes, mins, scales, shape, average=avg, group_size=gs))
        check_close(got, want, f"average_dequantize at shape {shape}, average={avg}, group_size={gs}",
                    "dequantize the M means (q / scale + min), repeat each `average` times, keep the first n",
                    atol=1e-5, rtol=1e-5)


# --- compressed_bits ------------------------------------------------------------------------------------------------
def _ref_bits(n, bits, gs=128, avg=4):
    if bits == 32:
        return 32 * n
    if bits == 0.5:
        n, bits = -(-n // avg), 2
    g = -(-n // gs)
    return g * (gs * bits + 64)


@hidden_test("test_compressed_bits")
def check_compressed_bits(nb):
    ns = (1, 127, 128, 129, 1000, 2053, 10**6, draw(1, 10**7))
    for n in ns:
        for bits in (32, 8, 4, 2, 1, 0.5):
            for gs, avg in ((128, 4), (64, 3)):
                got = fetch(nb.compressed_bits(n, bits, group_size=gs, average=avg))
                want = _ref_bits(n, bits, gs, avg)
                if isinstance(got, bool) or not isinstance(got, int) or got != want:
                    hint = ("the codes of the padded groups plus 64 bits (a float32 min and scale) per group"
                            if bits != 32 else "32 bits per element")
                    if isinstance(got, (int, float)) and bits not in (32,) and got == (
                            _ref_bits(n, bits, gs, avg) - 64 * -(-(n if bits != 0.5 else -(-n // avg)) // gs)):
                        hint = "the overhead is stored too: 64 bits (a float32 min and a float32 scale) per group"
                    raise AssertionError(f"compressed_bits({n}, {bits}, group_size={gs}, average={avg}) returned "
                                         f"{got!r}, expected the int {want}: {hint}")


@hidden_test("test_compressed_bits_errors")
def check_compressed_bits_errors(nb):
    for args, kwargs in (((0, 2), {}), ((-5, 2), {}), ((10.0, 2), {}), ((100, 3), {}), ((100, 16), {}),
                         ((100, 0.25), {}), ((100, 2), {"group_size": 0}), ((100, 0.5), {"average": 0})):
        if not _raises(nb, nb.compressed_bits, *args, **kwargs):
            call = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
            raise AssertionError(f"compressed_bits({call}) should raise ValueError")


# --- compress_hooks -------------------------------------------------------------------------------------------------
def _small_model() -> nn.Module:
    """Standard layers only (the judge sends it into the worker): Tanh, Sigmoid and Linear save activations that
    require grad, and Linear saves a view of its weight."""
    return nn.Sequential(nn.Linear(24, 64), nn.Tanh(), nn.Linear(64, 64), nn.Sigmoid(), nn.Linear(64, 10))


def _hook_tensors(seed: int):
    """(label, value, kind) in pack order: activations ("act", compressed) and the others: parameters, a view
    of one, an int tensor and a float tensor that does not require grad ("plain")."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, dtype=torch.float32):
        return torch.randn(shape, generator=g, dtype=dtype) * 2

    weight = rand(20, 30)
    return [("a float32 (37, 53) activation", rand(37, 53), "act"),
            ("a parameter", weight, "param"),
            ("a float64 (3, 5, 7) activation", rand(3, 5, 7, dtype=torch.float64), "act"),
            ("an int64 tensor", torch.arange(12), "plain"),
            ("a (300,) activation", rand(300), "act"),
            ("a float tensor that does not require grad", rand(40), "plain"),
            ("a (37, 53) activation", rand(37, 53), "act"),
            ("a view of a parameter (weight.t())", weight, "param_t"),
            ("a (3, 5, 7) activation", rand(3, 5, 7), "act"),
            ("a (300,) activation", rand(300), "act")]


HOOK_BITS = (8, 4, 2, 1, 0.5, 32)


def _pair(nb, bits, seed):
    """The student's (pack, unpack), as two handles."""
    hooks = nb.compress_hooks(bits, seed=seed)
    return hooks[0], hooks[1]


def _check_packed(entry, t, bits, where):
    if entry["error"]:
        raise AssertionError(f"{where}: {entry['error']}")
    restored = entry["restored"]
    if not isinstance(restored, torch.Tensor) or tuple(restored.shape) != tuple(t.shape) or restored.dtype != t.dtype:
        raise AssertionError(f"{where}: unpack gave {getattr(restored, 'dtype', type(restored).__name__)} "
                             f"{tuple(getattr(restored, 'shape', ()))}, expected {t.dtype} {tuple(t.shape)}: unpack "
                             "gives back t's shape and dtype")
    if bits == 32:
        if not entry["same"]:
            raise AssertionError(f"{where}: at 32 bits pack returns t itself")
        return
    if entry.get("refused"):
        raise AssertionError(f"{where}: what pack returned holds {entry['refused']}: {PACKED_HINT}")
    stored = entry.get("bytes", 0)
    want = _ref_bits(t.numel(), bits) // 8
    if stored != want:
        raise AssertionError(f"{where}: the storages of the tensors in what pack returned hold {stored} bytes, "
                             f"expected {want} (codes, mins and scales at {bits} bits, groups of 128: "
                             f"compressed_bits / 8): {PACKED_HINT}")
    x = t.detach().reshape(-1).float()
    if bits == 0.5:
        x = _means(t, 4).repeat_interleave(4)[:t.numel()]
        base = _means(t, 4)
        groups = -(-base.numel() // 128)
        span = torch.cat([base, base[-1:].expand(groups * 128 - base.numel())]).view(groups, 128)
        step = ((span.amax(1) - span.amin(1) + 2e-6) / 3).repeat_interleave(512)[:t.numel()]
    else:
        groups = -(-x.numel() // 128)
        span = torch.cat([x, x[-1:].expand(groups * 128 - x.numel())]).view(groups, 128)
        step = ((span.amax(1) - span.amin(1) + 2e-6) / (2 ** bits - 1)).repeat_interleave(128)[:t.numel()]
    err = (restored.detach().reshape(-1).double() - x.double()).abs()
    if (err > step.double() * 1.001 + 1e-6).any():
        raise AssertionError(f"{where}: unpack's values are more than one step (1 / scale) from "
                             f"{'the means of their runs' if bits == 0.5 else 'the tensor'} (max error "
                             f"{float(err.max()):.3g}): compress with group_quantize(t, b, noise, 128) or "
                             "average_quantize(t, noise) and dequantize what they return")


@hidden_test("test_compress_hooks")
def check_compress_hooks(nb):
    seed = new_seed() % 10_000
    listed = _hook_tensors(seed)
    pack, unpack = _pair(nb, list(HOOK_BITS), seed)
    # Twice through the list (the same objects again): the count of compressed tensors goes round bits_per_tensor.
    run = fetch(nb.apply(probes.ch13_pack_run, pack, unpack, [v for _, v, _ in listed],
                         [k for _, _, k in listed] * 2))
    counted = 0
    for i, entry in enumerate(run):
        label, t, kind = listed[i % len(listed)]
        if kind != "act":
            if entry["error"] or not entry["same"]:
                raise AssertionError(
                    f"pack changed {label}: only floating-point tensors that require grad and are not parameters "
                    "(is_parameter(t) False) are compressed; anything else is returned as the very object, and a "
                    f"parameter is never compressed{(' (' + entry['error'] + ')') if entry['error'] else ''}")
            continue
        bits = HOOK_BITS[counted % len(HOOK_BITS)]
        where = (f"compress_hooks({list(HOOK_BITS)}): the compressed tensor number {counted} ({label}), "
                 f"which gets bits_per_tensor[{counted} % {len(HOOK_BITS)}] = {bits}")
        counted += 1
        _check_packed(entry, t, bits, where)
    # Stochastic rounding: the mean of many packs at 2 bits approaches the tensor (small, and a drawn size).
    for shape in ((4, 64), (draw(MEAN_LOW, MEAN_HIGH),)):
        t = _case(shape, seed + 1)[0]
        pack, unpack = _pair(nb, [2], seed + 2)
        mean = fetch(nb.apply(probes.ch13_mean_of_packs, pack, unpack, t, 100))
        flat = t.detach().reshape(-1)
        span = torch.cat([flat, flat[-1:].expand(-(-flat.numel() // 128) * 128 - flat.numel())]).view(-1, 128)
        step = float(((span.amax(1) - span.amin(1)) / 3).mean())
        err = float((mean - t.detach()).abs().mean()) if isinstance(mean, torch.Tensor) else float("inf")
        if not err < 0.05 * step:
            raise AssertionError(f"compress_hooks([2]) on shape {shape}: the mean of 100 packs differs from the "
                                 f"tensor by {err:.3g} on average (a step is about {step:.3g}): draw fresh noise for "
                                 "every pack from the pair's generator (stochastic rounding), not a fixed rounding")
    # One seed, one result: two pairs of one seed packing in turns, torch's global generator untouched.
    same = fetch(nb.apply(probes.ch13_same_seed, nb.compress_hooks, [4, 0.5], seed + 3, t.detach().reshape(-1)[:300]))
    for i, (a, b) in enumerate(zip(same["first"], same["second"])):
        if not isinstance(a, torch.Tensor) or not same_values(a, b):
            raise AssertionError("two pairs made with the same seed, packing in turns, compress the same tensor "
                                 f"differently (pack number {i} of each): the noise comes from a torch.Generator "
                                 "owned by the pair, seeded with `seed`")
    if same["global_rng_changed"]:
        raise AssertionError("making two pairs and packing with them changed torch's global random generator: the "
                             "pair draws nothing from torch's global generator (its noise comes from its own "
                             "torch.Generator)")
    # Gradients of a model run under the hooks at 8 bits.
    torch.manual_seed(seed)
    model = _small_model()
    x = torch.randn(32, 24)
    loss = model(x).pow(2).mean()
    exact = torch.autograd.grad(loss, list(model.parameters()))
    grads = fetch(nb.apply(probes.ch13_hooked_grads, nb.put(model), x, *_pair(nb, [8], seed)))
    for (name, _), g, e in zip(model.named_parameters(), grads, exact):
        if not isinstance(g, torch.Tensor) or g.shape != e.shape or not (g - e).norm() <= 0.05 * e.norm():
            raise AssertionError(f"a model run under compress_hooks([8]): the gradient of {name} is more than 5% "
                                 "from the exact one: at 8 bits the dequantized activations are close to the saved "
                                 "ones (and parameters are not compressed)")


def _noise_after_warmup(seed: int, bits, n: int) -> torch.Tensor:
    """The noise of the pair's second compressed tensor (n elements) after the warm-up pack of (5, 300)."""
    g = torch.Generator().manual_seed(seed)
    if bits == 0.5:
        torch.rand(-(-1500 // 4), generator=g)
        return torch.rand(-(-n // 4), generator=g)
    torch.rand((5, 300), generator=g)
    return torch.rand(n, generator=g)


def _expected_at(x: torch.Tensor, u: torch.Tensor, bits, picks: torch.Tensor):
    """The dequantized values at ``picks`` of a pack of flat x (n a multiple of 1024) with noise u, recomputed on
    the picked groups only, and whether each lies within NEAR of a rounding boundary."""
    values = x.view(-1, 4).mean(1) if bits == 0.5 else x
    at = picks // 4 if bits == 0.5 else picks
    b = 2 if bits == 0.5 else bits
    groups = torch.unique(at // 128)
    rows, noise = values.view(-1, 128)[groups], u.view(-1, 128)[groups]
    _, mins, scales, q, pre, _ = _ref_quantize(rows.reshape(-1), b, noise.reshape(-1), 128)
    row = torch.searchsorted(groups, at // 128)
    flat = row * 128 + at % 128
    want = q[flat].float() / scales[row] + mins[row]
    near = (pre[flat] - pre[flat].round()).abs() < NEAR
    return want, near, (1 / scales[row]).double()


def _measure_pack(nb, bits, where_bits: str, low: int, high: int) -> None:
    meter = Meter(nb)
    pair_seed = new_seed()
    pack, unpack = _pair(nb, [bits], pair_seed)
    nb.apply(probes.ch13_pack_run, pack, unpack, [torch.randn(5, 300)], ["act"])  # first calls: lazy code
    n = draw(low, high, multiple_of=1024)
    cols = 1024
    shape = (n // cols, cols)
    seed = new_seed()
    held, packed = meter.held_by(lambda t: pack(t), inputs=lambda: [meter.tensor(shape, seed=seed)])
    compressed = _ref_bits(n, bits) // 8
    what = (f"pack at {where_bits} of a float32 tensor of shape {shape} ({n} elements, a size drawn at grading "
            "time)")
    if held.kept > compressed + AQ_SLACK:
        info = fetch(nb.apply(probes.ch13_packed_bytes, packed))["bytes"]
        raise AssertionError(
            f"{what}: with the tensor released and the packed value alive, your process still held "
            f"{mib(held.kept)} more than before (read from outside your process); the compressed tensor is "
            f"{mib(compressed)}, the float32 tensor {mib(4 * n)}. The tensors inside what pack returned hold "
            f"{mib(info)}: keep nothing else (no float copy, no cache, no codes of a higher precision)")
    # Values of that very call, at entries drawn now, against the judge's quantization with the pair's noise.
    x = seeded(shape, seed=seed).reshape(-1)
    picks = torch.tensor(sorted(random.SystemRandom().sample(range(n), 2048)))
    got = fetch(nb.apply(probes.ch13_unpack_at, unpack, packed, picks))
    want, near, step = _expected_at(x, _noise_after_warmup(pair_seed, bits, n), bits, picks)
    if not isinstance(got, torch.Tensor) or got.shape != picks.shape:
        raise AssertionError(f"{what}: unpack did not give back a tensor of the packed tensor's shape")
    diff = (got.double() - want.double()).abs()
    bad = (diff > 0.01 * step + 1e-6 * (1 + want.double().abs())) & ~(near & (diff <= step * 1.001 + 1e-6))
    if bad.any():
        i = int(torch.nonzero(bad)[0])
        raise AssertionError(
            f"{what}: unpack's values at {int(bad.sum())} of 2048 entries drawn at grading time differ from the "
            f"judge's quantization of that tensor with the pair's noise (first at element {int(picks[i])}: got "
            f"{float(got[i]):.6g}, expected {float(want[i]):.6g}): the l-th compressed tensor draws "
            "torch.rand(shape, generator=g) (or (M,) for AQ) from the pair's generator and is quantized exactly "
            "as group_quantize / average_quantize define, at any size")


@hidden_test("test_compress_hooks_memory")
def check_compress_hooks_memory(nb):
    other = random.SystemRandom().choice(MEM_OTHER)
    _measure_pack(nb, 2, "2 bits", MEM_LOW, MEM_HIGH)
    _measure_pack(nb, other, "AQ (0.5 bits)" if other == 0.5 else f"{other} bits", OTHER_LOW, OTHER_HIGH)


@hidden_test("test_compress_hooks_errors")
def check_compress_hooks_errors(nb):
    for arg in ([], (), [8, 3], [16], [0.25], [32, "aq"]):
        if not _raises(nb, nb.compress_hooks, arg):
            raise AssertionError(f"compress_hooks({arg!r}) should raise ValueError")
    if _raises(nb, nb.compress_hooks, (32, 8, 4, 2, 1, 0.5)):
        raise AssertionError("compress_hooks((32, 8, 4, 2, 1, 0.5)) is valid (a tuple of the six precisions), but "
                             "it raised ValueError")


# --- gradnormvar ----------------------------------------------------------------------------------------------------
def _ref_gnv(g0, g1, g2):
    g0, g1, g2 = (g.double() for g in (g0, g1, g2))
    c = max(float((g0 - g1).pow(2).sum()), 2 * max(float((g0 - g2).pow(2).sum()), float((g1 - g2).pow(2).sum())))
    return c if math.isfinite(c) and c <= 1e10 else 1e10


@hidden_test("test_gradnormvar")
def check_gradnormvar(nb):
    t = torch.tensor
    cases = [(t([1.0, 2.0, 3.0]), t([4.0, 2.0, 3.0]), t([1.5, 2.0, 3.0])),  # ||g0 - g1||^2 the largest
             (t([1.0, 2.0]), t([1.2, 2.0]), t([3.0, 2.0])),  # ||g0 - g2|| the largest
             (t([1.0, 2.0]), t([3.0, 2.0]), t([1.0, 0.5])),  # ||g1 - g2|| the largest
             (t([0.5]), t([0.5]), t([0.5])),
             (t([float("inf"), 1.0]), t([0.0, 1.0]), t([0.0, 1.0])),
             (t([float("nan")]), t([0.0]), t([0.0])),
             (t([1e6, 0.0]), t([0.0, 0.0]), t([0.0, 0.0])),  # 1e12 > 1e10
             (t([7e4]), t([0.0]), t([0.0]))]  # 4.9e9 below 1e10
    g = torch.Generator().manual_seed(new_seed())
    for k in (1, 17, 40):
        cases.append(tuple(torch.rand(k, generator=g) * 3 for _ in range(3)))
    cases.append(tuple(torch.rand(25, generator=g, dtype=torch.float64) for _ in range(3)))
    for g0, g1, g2 in cases:
        got = fetch(nb.gradnormvar(g0, g1, g2))
        want = _ref_gnv(g0, g1, g2)
        if isinstance(got, bool) or not isinstance(got, (float, int)) or not math.isclose(got, want, rel_tol=1e-5):
            raise AssertionError(f"gradnormvar({g0.tolist()}, {g1.tolist()}, {g2.tolist()}) returned {got!r}, expected "
                                 f"{want!r}: max(||g0 - g1||^2, 2 * max(||g0 - g2||^2, ||g1 - g2||^2)) (squared), "
                                 "1e10 when not finite or above 1e10, as a Python float")


@hidden_test("test_gradnormvar_errors")
def check_gradnormvar_errors(nb):
    z = torch.zeros
    for what, args in (("lengths 3, 3, 4", (z(3), z(3), z(4))), ("lengths 2, 3, 2", (z(2), z(3), z(2))),
                       ("a 2-D g0", (z(2, 2), z(2, 2), z(2, 2))), ("0-d tensors", (z(()), z(()), z(())))):
        if not _raises(nb, nb.gradnormvar, *args):
            raise AssertionError(f"gradnormvar with {what} should raise ValueError")


# --- allocate_bits --------------------------------------------------------------------------------------------------
LADDER = (32, 8, 4, 2, 0.5)


def _w(b):
    return 0.0 if b == 32 else 1.0 if b == 0.5 else 1.0 / (2 ** b - 1) ** 2


def _ref_allocate(c, n, avg):
    bits = [32] * len(n)
    budget = avg * sum(n)
    while sum(b * m for b, m in zip(bits, n)) > budget:
        best = None
        for l, (cl, nl, b) in enumerate(zip(c, n, bits)):
            if b == 0.5:
                continue
            down = LADDER[LADDER.index(b) + 1]
            p = cl * (_w(down) - _w(b)) / (nl * (b - down))
            if best is None or p < best[0]:
                best = (p, l, down)
        if best is None:
            break
        bits[best[1]] = best[2]
    return bits


def _near_tie(c, n, avg) -> bool:
    """Whether any step of the allocation chose between priorities within 1e-9 of each other (yet not equal)."""
    bits = [32] * len(n)
    budget = avg * sum(n)
    while sum(b * m for b, m in zip(bits, n)) > budget:
        pr = []
        for l, (cl, nl, b) in enumerate(zip(c, n, bits)):
            if b != 0.5:
                down = LADDER[LADDER.index(b) + 1]
                pr.append((cl * (_w(down) - _w(b)) / (nl * (b - down)), l, down))
        if not pr:
            break
        pr.sort()
        if len(pr) > 1 and pr[0][0] != pr[1][0] and abs(pr[1][0] - pr[0][0]) <= 1e-9 * max(abs(pr[0][0]), 1e-300):
            return True
        bits[pr[0][1]] = pr[0][2]
    return False


ALLOC_CASES = [  # (C, n, average bits, what it tells apart)
    ([1.0, 1.0], [100, 100], 32, "a budget that holds at once"),
    ([1.0, 1.0], [100, 100], 20, "a tie, broken by the lower index"),
    ([3.0, 1.0, 1.0, 3.0], [50, 50, 50, 50], 6, "ties among four"),
    ([1.0, 100.0], [100, 100], 2, "the least sensitive first"),
    ([5.0, 1.0, 20.0], [100, 100, 100], 4, "the least sensitive first"),
    ([1.0, 1.0], [100, 1000], 8, "priorities divided by the elements n_l"),
    ([2.0, 1.0, 4.0], [300, 10, 1000], 3, "priorities divided by the elements n_l"),
    ([100.0, 1.0], [10, 10], 1.25, "the step 2 -> AQ divided by the 1.5 bits it saves"),
    ([1.0, 13.0], [10, 10], 2.0, "the step 2 -> AQ divided by the 1.5 bits it saves"),
    ([1.0, 2.0, 3.0], [10, 10, 10], 1.5, "the ladder 32 -> 8 -> 4 -> 2 -> AQ"),
    ([1.0, 1.0, 1.0], [10, 20, 30], 7.9, "stopping as soon as the budget holds"),
    ([1.0, 2.0], [64, 64], 5.0, "stopping exactly at the budget (sum b n <= budget)"),
    ([1.0, 1.0], [100, 100], 0.1, "an unreachable budget"),
    ([0.0, 0.0, 1.0], [10, 10, 10], 1.0, "zero sensitivities"),
]


@hidden_test("test_allocate_bits")
def check_allocate_bits(nb):
    rng = random.Random(new_seed())
    cases = list(ALLOC_CASES)
    while len(cases) < len(ALLOC_CASES) + 4:
        k = rng.randint(5, 40)
        c = [10 ** rng.uniform(-3, 3) for _ in range(k)]
        n = [rng.choice((16384, 65536, 131072, 262144)) * rng.randint(1, 3) for _ in range(k)]
        avg = round(rng.uniform(0.4, 4.0), 2)
        if not _near_tie(c, n, avg):
            cases.append((c, n, avg, "a table drawn at grading time"))
    for c, n, avg, what in cases:
        got = fetch(nb.allocate_bits(c, n, avg))
        want = _ref_allocate(c, n, avg)
        if not isinstance(got, list) or len(got) != len(want) or any(
                isinstance(g, bool) or not isinstance(g, (int, float)) or g != w for g, w in zip(got, want)):
            short = len(c) <= 4
            shown = f"allocate_bits({c}, {n}, {avg})" if short else f"allocate_bits on {len(c)} tensors, {avg} bits avg"
            raise AssertionError(
                f"{shown} ({what}) returned {got!r}, expected {want}: start at 32, step the tensor with the least "
                "C_l * (w(b') - w(b)) / (n_l * (b - b')) one rung down 32 -> 8 -> 4 -> 2 -> 0.5 (2 -> 0.5 saves 1.5 "
                "bits), ties to the lowest index, until sum(b_l * n_l) <= average_bits * sum(n_l)")


@hidden_test("test_allocate_bits_errors")
def check_allocate_bits_errors(nb):
    for what, args in (("two sensitivities and one size", ([1.0, 2.0], [10], 2)), ("empty lists", ([], [], 2)),
                       ("a size 0", ([1.0], [0], 2)), ("a size 2.5", ([1.0], [2.5], 2)),
                       ("a negative sensitivity", ([-1.0], [10], 2)), ("a NaN sensitivity", ([float("nan")], [10], 2)),
                       ("average_bits 0", ([1.0], [10], 0)), ("average_bits -1", ([1.0], [10], -1))):
        if not _raises(nb, nb.allocate_bits, *args):
            raise AssertionError(f"allocate_bits with {what} should raise ValueError")


# --- average_quantize_triton ----------------------------------------------------------------------------------------
@hidden_test("test_average_quantize_triton")
def check_average_quantize_triton(nb):
    n = draw(300, 1200)
    parts = random.SystemRandom().sample(range(3), 3)
    parts.append(random.SystemRandom().choice(range(3)))  # every one of codes, mins, scales, on calls in turn
    for shape, part in zip(((37, 53), (3, 5, 7), (2, 6), (n,)), parts):
        x, _ = _case(shape, 90 + len(shape))
        means = _means(x, 4)
        u = torch.rand(means.shape, generator=torch.Generator().manual_seed(len(shape)))
        where = f"average_quantize_triton on shape {shape}"
        run = fetch(nb.apply(probes.ch13_triton_part, nb.average_quantize_triton, x, u, part))
        bounds = run["bounds"]
        if bounds["tampered"]:
            raise AssertionError(f"{where}: Triton's interpreter was changed ({bounds['tampered']})")
        if bounds["launches"] < 1:
            raise AssertionError(f"{where}: no Triton kernel was launched: the kernel computes the result "
                                 "(launch it through launch_average_quantize)")
        if bounds["outside"]:
            raise AssertionError(f"{where}: {bounds['outside']} lanes of the kernel's loads or stores fell outside "
                                 f"their tensor ({bounds['violations'][:2]}): mask every access of the last group")
        computed = set(run["ops"] or ()) - TRITON_OPS
        if computed:
            raise AssertionError(f"{where}: PyTorch ran {sorted(computed)} around the launch: the kernel computes "
                                 "the means, the codes and the packed bytes")
        _compare_codes(run["result"], means, 2, u, 128, where, hint=f"{MEAN_HINT}; {LAYOUT_HINT}")
        name = ("codes", "mins", "scales")[part]
        if not bounds.get("result_stored") or bounds.get("unwritten"):
            raise AssertionError(f"{where}: {bounds.get('unwritten') or 'all'} elements of the returned {name} were "
                                 "not written by the kernel's stores: every element of codes, mins and scales is "
                                 "written by the kernel's stores (tensors passed to it), not computed around it")
