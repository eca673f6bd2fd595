"""Hidden tests of chapter 8 (number formats, quantization, QLoRA).

References are the naive math in float64, written here: bf16 rounding is compared with PyTorch's
own conversion bit for bit; absmax and NF4 codes are recomputed by brute force (the nearest level
by distance to all 16, the integer code by rounding in float64). Where a value lies within a hair
of a rounding boundary, either neighbour is accepted, since float32 arithmetic may land on either
side; exact ties built on power-of-two scales, where float32 is exact, must round half to even.

One graded cell per property:
- round_to_bf16: values (every ordinary value: finite, normal, rounding to a finite value, among random
  bit patterns, exact ties and near ties) and edge cases (subnormals, ±0, finite values rounding to ±inf,
  ±inf, NaNs). Every call of both cells is traced and fails when an aten op produces bfloat16: a conversion
  gives the right values by construction, so a separate cell for the rule would pay the refused shortcut
  for its values.
- absmax_quantize: values on tensors cut into whole blocks; edge cases: partial last blocks (padding code
  0), a single value, an all-zero block, exact ties, and the ValueErrors (bits or block_size out of range
  or not an int).
- absmax_dequantize, nf4_quantize, nf4_dequantize: values on whole blocks (and even counts for NF4); edge
  cases: partial last blocks, odd counts, a single value, an all-zero block (a zero absmax).
- nf4_codebook: one cell. Its exact -1, 0 and 1, its order and its counts are implied by the levels to
  within 1e-6, so a cell of their own could only reward a table with wrong levels.
- QLoRALinear: values and gradients (with the construction: trainable set, init, scaling), the rank
  ValueError (a cell of its own); memory: what the process holds for a layer of 10.2M to 11.9M weights (its
  sides drawn at grading time), read from outside it after construction and after a training step
  (``grader.resources``), the base weight on the NF4 grid so that the same pass's loss and input-gradient
  sum are known exactly. Only a failure runs the tensor inventory (``probes.ch08_tensor_inventory``).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from coursekit.checks import check_close, check_equal, same_close
from grader import probes
from grader.api import fetch, hidden_test
from grader.resources import MiB, Meter, draw, fresh_tensor, mib, new_seed, seeded
from grader.sandbox.codec import NotTransferable
from grader.sandbox.rpc import MissingName, StudentError
from grader.source_policy import Shortcut, SourcePolicy

# round_to_bf16 works on integer bits: no bfloat16 dtype (nor autocast, whose CPU dtype is bfloat16) in
# any exercise cell, since cells share one namespace; the course's NF4 kernel is not an answer either.
SOURCE_POLICY = SourcePolicy(shortcuts=(
    Shortcut(paths=("coursekit.capstone",),
             instead="write it yourself; coursekit.capstone (chapter 16's reference fine-tune) holds "
                     "the course's own NF4 linears"),
    Shortcut(pattern=r"(?i)bfloat16|autocast",
             instead="round with integer operations on x.view(torch.int32), as round_to_bf16's docstring says"),
    Shortcut(paths=("kernels.ch08_quantization",),
             instead="write nf4_dequantize with torch operations; kernels.ch08_quantization is the course's own"),
    Shortcut(paths=("kernels.ch15_paca",),
             instead="write the NF4 levels, quantizer and dequantizer with torch operations; kernels.ch15_paca "
                     "(chapter 15's NF4 kernels) is the course's own"),
))

# The NF4 levels as published (QLoRA, Appendix E; bitsandbytes); the student's must be computed.
NF4 = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0], dtype=torch.float64)
TIE = 1e-4  # |value - boundary| below which both neighbouring codes are accepted (in units of a step)

RNE_HINT = ("round to nearest, ties to even: add 0x7FFF plus the last kept bit ((bits >> 16) & 1), then clear the "
            "low 16 bits; truncating (just clearing them) or adding 0x8000 (ties away from zero) is not the same")
BF16_RULE = ("round_to_bf16 converts to torch.bfloat16 somewhere: implement the rounding with integer operations on "
             "x.view(torch.int32)")
SUBNORMAL_HINT = ("a subnormal (exponent bits 0) rounds like any other value: the same integer addition on the bits "
                  "handles it; do not flush subnormals to zero or treat them apart")
ZERO_HINT = "±0 has nothing to round: it stays ±0, sign bit included"
OVERFLOW_HINT = ("the largest finite values round up to ±inf, as IEEE asks: the carry out of the mantissa runs into the "
                 "exponent; do not clamp to the largest finite bf16 value")
INF_HINT = "±inf (exponent bits all ones, mantissa 0) has no low bits to round: it stays ±inf"
NAN_CARRY_HINT = ("a NaN whose payload sits in the low 16 bits carries into an infinity when rounded like a number: "
                  "keep NaNs apart (torch.where(torch.isnan(x), x, rounded))")
NAN_HINT = "a NaN must stay a NaN: keep NaNs apart (torch.where(torch.isnan(x), x, rounded))"
RANGE_HINT = "with q_max = 2 ** (bits - 1) - 1, scale = max|x| / q_max and every code lies in [-q_max, q_max]"
BLOCK_HINT = ("n values make ceil(n / block_size) blocks: pad the last, partial block with zeros instead of "
              "dropping it")
ROUND_HINT = "code = round(x / scale), with the scale of the value's own block. " + RANGE_HINT
TRUNC_HINT = ("round to nearest (torch.round) before converting to int8: the conversion alone truncates toward zero. "
              + RANGE_HINT)
HALF_EVEN_HINT = ("x / scale lies exactly half-way between two codes here: round half to even, like torch.round "
                  "(0.5 -> 0, 1.5 -> 2, 2.5 -> 2), not half away from zero (floor(v + 0.5))")
PAD_HINT = "the padding after the last value holds code 0: pad the flattened tensor with zeros, then quantize"
ZERO_BLOCK_HINT = ("an all-zero block has scale 0: divide by 1 instead (torch.where(scale == 0, 1, scale)), so that "
                   "its codes are 0, never NaN")
DROP_PAD_HINT = ("n = prod(shape) may be smaller than n_blocks * block_size: flatten the values, keep the first n (the "
                 "padding is dropped), then reshape to shape")
NF4_HINT = ("8 positive levels ndtri(linspace(delta, 0.5, 9)[:-1]), 7 negative levels "
            "-ndtri(linspace(delta, 0.5, 8)[:-1]) and 0, with delta = 1 - (1/32 + 1/30) / 2 = 0.9677083, sorted and "
            "divided by the largest")
NIBBLE_HINT = "the first value of each pair goes in the HIGH nibble: byte = (code[2k] << 4) | code[2k + 1]"
NEAREST_HINT = "the code is the index of the nearest level of the ascending nf4_codebook() (7 is the level 0.0)"
NF4_ZERO_HINT = ("an all-zero block has absmax 0: divide by 1 instead (torch.where(absmax == 0, 1, absmax)), so that "
                 "its values get code 7 (the level 0.0), not the code of a NaN")
ODD_HINT = ("with an odd n, pad the codes with one 0 before pairing them: the last byte holds the last code in its high "
            "nibble, so there are ceil(n / 2) bytes")
NF4_DROP_HINT = ("n = prod(shape) may be odd (ignore the low nibble of the last byte) and the last block partial: keep "
                 "the first n codes and take the block of value i as i // block_size")
DEQUANT_HINT = "value = nf4_codebook()[code] x absmax of its block, codes read high nibble first"
COPY_HINT = ("store only nf4_quantize's packed codes and absmax (as buffers), not the base layer nor any float copy "
             "of its weight, and dequantize in forward without keeping the result")
RANK_HINT = ('rank must be a positive int: raise ValueError("rank must be a positive integer, got ...") for 0, '
             "negative numbers and non-integers, before building anything")


# --- helpers -----------------------------------------------------------------------------------
def _randn(*shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _raised(nb, fn_name: str, *args) -> str | None:
    """The name of the exception ``fn_name(*args)`` raised in the student's process, "" for none."""
    names = fetch(nb.apply(probes.raised, nb[fn_name], *args))
    if names is None:
        return ""
    return "ValueError" if "ValueError" in names else names[0]


def _call(where: str, hint: str, fn, *args):
    """fetch(fn(*args)); a crash of the student's code becomes a failure that names the edge case and its hint."""
    try:
        return fetch(fn(*args))
    except (AssertionError, MissingName, NotTransferable):
        raise
    except Exception as e:  # noqa: BLE001 - the student's own error, locally or as a StudentError
        kind = e.type_name if isinstance(e, StudentError) else type(e).__name__
        message = e.message if isinstance(e, StudentError) else str(e)
        raise AssertionError(f"{where} raised {kind}: {message[:200]}. {hint}") from None


def _pair(got, what: str):
    if not isinstance(got, (list, tuple)) or len(got) != 2:
        raise AssertionError(f"{what} should return a pair of tensors, got {type(got).__name__}")
    return got


def _check_tensor(t, name: str, dtype: torch.dtype, shape, hint: str = "") -> None:
    if not isinstance(t, torch.Tensor):
        raise AssertionError(f"{name} should be a tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise AssertionError(f"{name} has dtype {t.dtype}, expected {dtype}")
    check_equal(tuple(t.shape), tuple(shape), f"the shape of {name}", hint)


def _edge_hint(x: torch.Tensor, block: int, zero_block_hint: str, odd_hint: str = "") -> str:
    """What is special about an edge-case input, and how to handle it (for a crash on it)."""
    n = x.numel()
    hints = [BLOCK_HINT] if n % block else []
    if odd_hint and n % 2:
        hints.append(odd_hint)
    if bool((_blocks(x, block).abs().amax(dim=1) == 0).any()):
        hints.append(zero_block_hint)
    return "; ".join(hints) or RANGE_HINT


def _blocks_hint(t, n: int, block: int, otherwise: str) -> str:
    """BLOCK_HINT when ``t`` has one row per whole block only (the partial last block dropped)."""
    if isinstance(t, torch.Tensor) and t.dim() >= 1 and n % block and t.shape[0] == n // block:
        return BLOCK_HINT
    return otherwise


# --- round_to_bf16 -----------------------------------------------------------------------------
def _bits(values) -> torch.Tensor:
    return torch.tensor([v - (1 << 32) if v >= 1 << 31 else v for v in values], dtype=torch.int32)


def _hex(t: torch.Tensor) -> str:
    return f"0x{t.view(torch.int32).item() & 0xFFFFFFFF:08X}"


def _bf16_inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(8)
    rand = torch.randint(-2**31, 2**31 - 1, (211, 97), generator=g, dtype=torch.int64).to(torch.int32)
    high = torch.randint(0, 1 << 16, (4000,), generator=g, dtype=torch.int64)
    ties = ((high << 16) | 0x8000).to(torch.int32)  # exactly half-way: both parities of the last kept bit
    near = ((high << 16) | torch.tensor([0x7FFF, 0x8001]).repeat(2000)).to(torch.int32)
    sub = torch.randint(0, 1 << 23, (2000,), generator=g, dtype=torch.int64)
    sub = (sub | torch.tensor([0, 1 << 31]).repeat(1000)).to(torch.int32)  # subnormals of both signs
    edges = _bits([0x7F7F8000, 0x7F7FFFFF, 0x7F7F7FFF, 0xFF7F8000, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0, 1 << 31,
                   0x00008000, 0x00018000, 0x80008000, 0x3F808000, 0x3F818000, 0x00807FFF])
    nans = _bits([0x7F800001, 0x7F808000, 0x7FFFFFFF, 0x7FC00000, 0xFF800001, 0xFFFFFFFF, 0x7FBFFFFF, 0xFFC00001])
    return {"random bit patterns (211 x 97)": rand.view(torch.float32),
            "exact ties (low 16 bits = 0x8000)": ties.view(torch.float32),
            "values just below and above a tie": near.view(torch.float32).view(40, 100),
            "subnormals": sub.view(torch.float32),
            "edge cases (largest finite values rounding to inf, ±inf, ±0, ties)": edges.view(torch.float32),
            "NaNs with payloads": nans.view(torch.float32)}


def _bf16_classes(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Masks of the special inputs; everything else is an ordinary value."""
    bits = x.view(torch.int32)
    subnormal = ((bits >> 23) & 0xFF == 0) & (bits & 0x7FFFFF != 0)
    return {"nan": torch.isnan(x), "inf": torch.isinf(x),
            "overflow": torch.isfinite(x) & torch.isinf(x.to(torch.bfloat16).float()),
            "zero": x == 0, "subnormal": subnormal}


def _bf16_results(nb):
    """(what, x, result) for every input set; a call that produces bfloat16 anywhere fails here."""
    for what, x in _bf16_inputs().items():
        out = fetch(nb.apply(probes.ch08_traced_call, nb.round_to_bf16, x))
        got = out["result"]
        _check_tensor(got, f"round_to_bf16 on {what}", torch.float32, x.shape, "float32 in, same shape out")
        if "torch.bfloat16" in out["dtypes"]:
            raise AssertionError(BF16_RULE)
        yield what, x, got


def _bf16_compare(x: torch.Tensor, got: torch.Tensor, mask: torch.Tensor, what: str, hint_at) -> None:
    ref = x.to(torch.bfloat16).float().view(torch.int32)
    wrong = (got.view(torch.int32) != ref) & mask
    if wrong.any():
        i = tuple(int(k) for k in torch.nonzero(wrong)[0])
        raise AssertionError(
            f"{what}: {int(wrong.sum())} of {int(mask.sum())} values differ from x.to(torch.bfloat16).float(); "
            f"first: input bits {_hex(x[i])} gave {_hex(got[i])}, expected {_hex(ref[i].view(torch.float32))}. "
            f"{hint_at(i)}")


@hidden_test("test_round_to_bf16")
def check_round_to_bf16(nb):
    for what, x, got in _bf16_results(nb):
        c = _bf16_classes(x)
        ordinary = ~(c["nan"] | c["inf"] | c["overflow"] | c["zero"] | c["subnormal"])
        _bf16_compare(x, got, ordinary, f"on the ordinary values (finite, normal, rounding to a finite value) of {what}",
                      lambda i: RNE_HINT)


@hidden_test("test_round_to_bf16_edge_cases")
def check_round_to_bf16_edge_cases(nb):
    for what, x, got in _bf16_results(nb):
        c = _bf16_classes(x)

        def hint_at(i, c=c, got=got):
            if c["subnormal"][i]:  # flushed to ±0, or rounded the wrong way like any other value
                return SUBNORMAL_HINT if got[i] == 0 else f"{RNE_HINT} (subnormals included)"
            for name, hint in (("zero", ZERO_HINT), ("overflow", OVERFLOW_HINT), ("inf", INF_HINT)):
                if c[name][i]:
                    return hint
            return RNE_HINT

        special = c["inf"] | c["overflow"] | c["zero"] | c["subnormal"]
        _bf16_compare(x, got, special, f"on the subnormals, zeros and infinities of {what}", hint_at)
        nan = c["nan"]
        lost = nan & ~torch.isnan(got)
        if lost.any():
            i = tuple(int(k) for k in torch.nonzero(lost)[0])
            became = got[i].item()
            hint = NAN_CARRY_HINT if math.isinf(became) else NAN_HINT
            raise AssertionError(f"on {what}: {int(lost.sum())} of {int(nan.sum())} NaNs did not stay NaN; first: "
                                 f"bits {_hex(x[i])} became {became}. {hint}")


# --- absmax quantization -------------------------------------------------------------------------
def _blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    flat = x.double().flatten()
    n_blocks = -(-flat.numel() // block_size)
    out = torch.zeros(n_blocks * block_size, dtype=torch.float64)
    out[:flat.numel()] = flat
    return out.view(n_blocks, block_size)


def _absmax_values_inputs():
    """Whole blocks only (n a multiple of block_size); every width from 2 to 8."""
    x_spiky = _randn(11, 21, seed=6, scale=0.02)
    x_spiky[3, 7] = 3.0  # one outlier among small values
    return [(_randn(32, 48, seed=1), 8, 64), (_randn(4, 5, 8, seed=2, scale=0.1), 4, 16), (_randn(8, 8, seed=10), 2, 16),
            (_randn(1000, seed=4), 3, 1000), (_randn(3, 64, seed=11), 5, 64), (_randn(6, 7, seed=7), 6, 1),
            (x_spiky, 4, 7), (_randn(100, seed=9, scale=1e3), 7, 10)]


def _absmax_edge_inputs():
    """Partial last blocks, a single value, an all-zero block."""
    x_zero = _randn(200, seed=5)
    x_zero[64:128] = 0.0  # an all-zero block
    return [(_randn(37, 53, seed=1), 8, 64), (_randn(3, 5, 7, seed=2, scale=0.1), 4, 16), (_randn(1, seed=3), 2, 64),
            (x_zero, 5, 64), (_randn(97, seed=9, scale=1e3), 7, 10)]


# x / scale exactly half-way between two codes: scales 1 and 2 (max|x| = q_max and 2 q_max) are exact in float32.
ABSMAX_TIES = (torch.tensor([[3.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 1.0],
                             [-6.0, 1.0, 3.0, 5.0, -1.0, -3.0, -5.0, 0.0]]), 3, 8)

ABSMAX_ERRORS = (((1, 64), "bits=1 is below 2"), ((9, 64), "bits=9 is above 8"), ((0, 64), "bits=0 is below 2"),
                 ((4.0, 64), "bits=4.0 is a float, not an int"), ((4, 0), "block_size=0 is below 1"),
                 ((4, -3), "block_size=-3 is below 1"), ((4, 16.0), "block_size=16.0 is a float, not an int"))


def _check_absmax_case(nb, x: torch.Tensor, bits: int, block: int, crash_hint: str = "",
                       exact_ties: bool = False) -> None:
    where = f"absmax_quantize(x of shape {tuple(x.shape)}, bits={bits}, block_size={block})"
    n = x.numel()
    q_max = 2 ** (bits - 1) - 1
    blocks = _blocks(x, block)
    got = _call(where, crash_hint, nb.absmax_quantize, x, bits, block) if crash_hint else \
        fetch(nb.absmax_quantize(x, bits, block))
    codes, scales = _pair(got, where)
    _check_tensor(scales, f"the scales of {where}", torch.float32, (blocks.shape[0],),
                  _blocks_hint(scales, n, block, "one float32 scale per block"))
    _check_tensor(codes, f"the codes of {where}", torch.int8, tuple(blocks.shape),
                  _blocks_hint(codes, n, block, "codes are int8 of shape (n_blocks, block_size): one row of "
                                                "block_size codes per block"))
    magnitude = codes.long().abs()
    has_values = bool((blocks.abs().amax(dim=1) > 0).any())
    if magnitude.max() > q_max or (has_values and magnitude.max() < q_max):
        raise AssertionError(f"{where}: codes span [{int(codes.min())}, {int(codes.max())}], expected the "
                             f"largest magnitude of each block at ±{q_max}. {RANGE_HINT}")
    ref_scales = blocks.abs().amax(dim=1) / q_max
    zero_scale_lost = bool(((ref_scales == 0) & (scales.double() != 0)).any())
    check_close(scales, ref_scales.float(), f"the scales of {where}", ZERO_BLOCK_HINT if zero_scale_lost else RANGE_HINT,
                atol=0, rtol=2e-7)
    value = blocks / torch.where(ref_scales == 0, 1.0, ref_scales)[:, None]
    lower, upper = value.floor(), value.ceil()
    near = torch.zeros_like(value, dtype=torch.bool) if exact_ties else ((value - lower) - 0.5).abs() < TIE
    got_codes = codes.double()
    ok = (got_codes == value.round()) | (near & ((got_codes == lower) | (got_codes == upper)))
    if not ok.all():
        i = tuple(int(k) for k in torch.nonzero(~ok)[0])
        if i[0] * block + i[1] >= n:
            hint = PAD_HINT
        elif ref_scales[i[0]] == 0:
            hint = ZERO_BLOCK_HINT
        elif value[i] - lower[i] == 0.5:
            hint = HALF_EVEN_HINT
        elif got_codes[i] == value[i].trunc():
            hint = TRUNC_HINT
        else:
            hint = ROUND_HINT
        raise AssertionError(f"{where}: {int((~ok).sum())} codes differ from round(x / scale); first in block "
                             f"{i[0]}, position {i[1]}: got {int(codes[i])}, expected {value[i].round().item():.0f} "
                             f"(x / scale = {value[i].item():.4f}). {hint}")


@hidden_test("test_absmax_quantize")
def check_absmax_quantize(nb):
    for x, bits, block in _absmax_values_inputs():
        _check_absmax_case(nb, x, bits, block)


@hidden_test("test_absmax_quantize_edge_cases")
def check_absmax_quantize_edge_cases(nb):
    for x, bits, block in _absmax_edge_inputs():
        _check_absmax_case(nb, x, bits, block, crash_hint=_edge_hint(x, block, ZERO_BLOCK_HINT))
    x, bits, block = ABSMAX_TIES
    _check_absmax_case(nb, x, bits, block, exact_ties=True)
    for args, why in ABSMAX_ERRORS:
        got = _raised(nb, "absmax_quantize", _randn(10, seed=0), *args)
        if got != "ValueError":
            did = "returned" if got == "" else f"raised {got}"
            raise AssertionError(f"absmax_quantize(x, {args[0]!r}, {args[1]!r}) {did}; it should raise ValueError "
                                 f"({why}): bits must be an int in 2..8 and block_size an int >= 1")


def _check_absmax_dequantize(nb, cases, seed: int, crash_hint: str = "") -> None:
    g = torch.Generator().manual_seed(seed)
    for shape, bits, block in cases:
        n = math.prod(shape)
        n_blocks = -(-n // block)
        q_max = 2 ** (bits - 1) - 1
        codes = torch.randint(-q_max, q_max + 1, (n_blocks, block), generator=g).to(torch.int8)
        scales = torch.rand(n_blocks, generator=g) * 0.1
        scales[n_blocks // 2] = 0.0
        for as_size in (False, True):
            size = torch.Size(shape) if as_size else tuple(shape)
            where = f"absmax_dequantize(codes {tuple(codes.shape)}, scales {tuple(scales.shape)}, {block}, {size})"
            got = _call(where, crash_hint, nb.absmax_dequantize, codes, scales, block, size) if crash_hint else \
                fetch(nb.absmax_dequantize(codes, scales, block, size))
            _check_tensor(got, where, torch.float32, shape, "the original shape, padding dropped")
            ref = (codes.double() * scales.double()[:, None]).flatten()[:n].reshape(shape)
            check_close(got, ref.float(), where, "value = code x the scale of its block (block i: elements "
                        "i * block_size .. (i + 1) * block_size - 1 of the flattened tensor)", atol=1e-7, rtol=1e-6)


@hidden_test("test_absmax_dequantize")
def check_absmax_dequantize(nb):
    _check_absmax_dequantize(nb, (((32, 48), 8, 64), ((4, 5, 8), 4, 16), ((24,), 3, 8), ((2, 3), 2, 1),
                                  ((100,), 8, 10)), seed=11)


@hidden_test("test_absmax_dequantize_edge_cases")
def check_absmax_dequantize_edge_cases(nb):
    _check_absmax_dequantize(nb, (((37, 53), 8, 64), ((3, 5, 7), 4, 16), ((5,), 3, 8), ((97,), 8, 10)), seed=12,
                             crash_hint=DROP_PAD_HINT)


# --- NF4 -----------------------------------------------------------------------------------------
@hidden_test("test_nf4_codebook")
def check_nf4_codebook(nb):
    got = fetch(nb.nf4_codebook())
    _check_tensor(got, "nf4_codebook()", torch.float32, (16,), "16 float32 levels")
    if not (got[1:] > got[:-1]).all():
        raise AssertionError(f"nf4_codebook() is not strictly ascending: {got.tolist()}. Sort the 16 levels; 0 "
                             "appears once")
    if got[0] != -1 or got[-1] != 1 or (got == 0).sum() != 1:
        raise AssertionError(f"nf4_codebook() should start at exactly -1, end at exactly 1 and contain an exact 0, got "
                             f"{got[0].item()}, {got[-1].item()} and {(got == 0).sum().item()} zeros: {NF4_HINT}")
    off = (got.double() - NF4).abs() > 1e-6
    if int(off.sum()) == 1:
        i = int(torch.nonzero(off)[0])
        raise AssertionError(f"nf4_codebook()[{i}] is {got[i].item():.9f}, expected {NF4[i].item():.9f}; the other "
                             f"levels are right. Compute the levels, do not type them in: {NF4_HINT}")
    check_close(got, NF4.float(), "nf4_codebook()", NF4_HINT, atol=1e-6, rtol=0)


def _nf4_reference_codes(x: torch.Tensor, block: int):
    """Brute force: the index of the nearest of the 16 levels to x / absmax, in float64."""
    blocks = _blocks(x, block)
    absmax = blocks.abs().amax(dim=1)
    scaled = (blocks / torch.where(absmax == 0, 1.0, absmax)[:, None]).flatten()[:x.numel()]
    dist = (scaled[:, None] - NF4[None, :]).abs()  # (n, 16)
    two = dist.topk(2, dim=1, largest=False)
    near = (two.values[:, 1] - two.values[:, 0]) < TIE * 1e-2
    return two.indices[:, 0], two.indices[:, 1], near, absmax


def _unpack(packed: torch.Tensor, n: int, high_first: bool = True) -> torch.Tensor:
    hi, lo = (packed >> 4).long(), (packed & 15).long()
    pairs = torch.stack([hi, lo] if high_first else [lo, hi], dim=1)
    return pairs.flatten()[:n]


def _nf4_values_inputs():
    """Even counts cut into whole blocks."""
    heavy = _randn(98, seed=24) / (_randn(98, seed=25).abs() + 0.3)  # heavy tails
    return [(_randn(32, 48, seed=21, scale=0.02), 64), (_randn(4, 6, 8, seed=22), 16), (heavy.view(1, 98), 7),
            (_randn(8, 16, seed=26, scale=3.0), 32)]


def _nf4_edge_inputs():
    """Odd counts, partial last blocks, a single value, an all-zero block."""
    x_zero = _randn(2, 65, seed=23, scale=0.02)
    x_zero[0, :64] = 0.0  # an all-zero block
    heavy = _randn(101, seed=24) / (_randn(101, seed=25).abs() + 0.3)  # heavy tails
    return [(_randn(37, 53, seed=21, scale=0.02), 64), (_randn(3, 5, 7, seed=22), 16), (torch.tensor([-0.7]), 64),
            (x_zero, 64), (heavy.view(1, 101), 7), (_randn(9, 15, seed=26, scale=3.0), 32)]


def _check_nf4_case(nb, x: torch.Tensor, block: int, crash_hint: str = "") -> None:
    n = x.numel()
    where = f"nf4_quantize(x of shape {tuple(x.shape)}, block_size={block})"
    got = _call(where, crash_hint, nb.nf4_quantize, x, block) if crash_hint else fetch(nb.nf4_quantize(x, block))
    packed, absmax = _pair(got, where)
    best, second, near, ref_absmax = _nf4_reference_codes(x, block)
    _check_tensor(absmax, f"the absmax of {where}", torch.float32, (ref_absmax.numel(),),
                  _blocks_hint(absmax, n, block, "one float32 absmax per block"))
    check_close(absmax, ref_absmax.float(), f"the absmax of {where}", "max |x| of each block", atol=0, rtol=0)
    odd = n % 2 and isinstance(packed, torch.Tensor) and tuple(packed.shape) == (n // 2,)
    _check_tensor(packed, f"the packed codes of {where}", torch.uint8, ((n + 1) // 2,),
                  ODD_HINT if odd else "two 4-bit codes per byte: ceil(n / 2) bytes")
    codes = _unpack(packed, n)
    ok = (codes == best) | (near & (codes == second))
    if not ok.all():
        swapped = _unpack(packed, n, high_first=False)
        if n > 1 and ((swapped == best) | (near & (swapped == second))).all():
            raise AssertionError(f"{where}: the two codes of each byte are swapped. {NIBBLE_HINT}")
        i = int(torch.nonzero(~ok)[0])
        hint = NF4_ZERO_HINT if ref_absmax[i // block] == 0 else NEAREST_HINT
        raise AssertionError(
            f"{where}: {int((~ok).sum())} of {n} codes differ from the nearest NF4 level; first at element {i}: "
            f"got code {int(codes[i])}, expected {int(best[i])} (level {NF4[best[i]].item():.4f} for x / absmax = "
            f"{(x.flatten()[i] / ref_absmax[i // block]).item():.4f}). {hint}")


@hidden_test("test_nf4_quantize")
def check_nf4_quantize(nb):
    for x, block in _nf4_values_inputs():
        _check_nf4_case(nb, x, block)


@hidden_test("test_nf4_quantize_edge_cases")
def check_nf4_quantize_edge_cases(nb):
    for x, block in _nf4_edge_inputs():
        _check_nf4_case(nb, x, block, crash_hint=_edge_hint(x, block, NF4_ZERO_HINT, ODD_HINT))


def _check_nf4_dequantize(nb, cases, seed: int, zero_block: bool, crash_hint: str = "") -> None:
    g = torch.Generator().manual_seed(seed)
    for shape, block in cases:
        n = math.prod(shape)
        packed = torch.randint(0, 256, ((n + 1) // 2,), generator=g).to(torch.uint8)
        absmax = torch.rand(-(-n // block), generator=g) + 0.05
        if zero_block:
            absmax[0] = 0.0
        where = f"nf4_dequantize(packed {tuple(packed.shape)}, absmax {tuple(absmax.shape)}, {shape}, {block})"
        got = _call(where, crash_hint, nb.nf4_dequantize, packed, absmax, shape, block) if crash_hint else \
            fetch(nb.nf4_dequantize(packed, absmax, shape, block))
        _check_tensor(got, where, torch.float32, shape, "the original shape")
        scale = absmax.double().repeat_interleave(block)[:n]
        ref = (NF4[_unpack(packed, n)] * scale).reshape(shape).float()
        swapped = (NF4[_unpack(packed, n, high_first=False)] * scale).reshape(shape).float()
        if n > 1 and same_close(got, swapped, atol=1e-6, rtol=1e-6) and not same_close(got, ref):
            raise AssertionError(f"{where}: the two codes of each byte are read in the wrong order. {NIBBLE_HINT}")
        check_close(got, ref, where, DEQUANT_HINT, atol=1e-6, rtol=1e-6)


@hidden_test("test_nf4_dequantize")
def check_nf4_dequantize(nb):
    _check_nf4_dequantize(nb, (((32, 48), 64), ((4, 6, 8), 16), ((12,), 4), ((10, 20), 10)), seed=31,
                          zero_block=False)


@hidden_test("test_nf4_dequantize_edge_cases")
def check_nf4_dequantize_edge_cases(nb):
    _check_nf4_dequantize(nb, (((37, 53), 64), ((3, 5, 7), 16), ((7,), 4), ((1,), 64), ((11, 13), 10)), seed=32,
                          zero_block=True, crash_hint=NF4_DROP_HINT)


# --- QLoRALinear -----------------------------------------------------------------------------------
QLORA_CASES = ((4, 8.0, 64, True, (2, 3), 1), (3, 1.5, 32, False, (5,), 2))  # rank, alpha, block, bias, lead, seed


def _nf4_roundtrip(w: torch.Tensor, block: int) -> torch.Tensor:
    best, _, _, absmax = _nf4_reference_codes(w, block)
    return (NF4[best] * absmax.repeat_interleave(block)[:w.numel()]).reshape(w.shape).float()


def _qlora_base(bias: bool, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    base = nn.Linear(37, 53, bias=bias)
    with torch.no_grad():
        base.weight.copy_(_randn(53, 37, seed=seed, scale=0.05))
    return base


def _storage_hint(nb, layer, n_weight: int, n_out: int, block: int, where: str) -> str:
    """What a layer holds, as its tensor inventory tells (a claim its code controls): only to explain a failure
    the outside reading decided."""
    inventory = fetch(nb.apply(probes.ch08_tensor_inventory, layer))
    copies = [t for t in inventory if t["floating"] and t["numel"] == n_weight]
    if copies:
        t = copies[0]
        return (f"{where} holds a full-precision copy of the base weight: {t['where']} ({t['dtype']}, {t['numel']} "
                f"values). {COPY_HINT}")
    frozen = [t for t in inventory if t["where"] not in ("lora_A", "lora_B") and t["numel"] != n_out]
    budget = (n_weight + 1) // 2 + 4 * -(-n_weight // block)
    held = sum(t["nbytes"] for t in frozen)
    if held > budget + 256:
        return (f"{where} keeps {held:,} bytes for the frozen weight "
                f"({', '.join(t['where'] + ' ' + t['dtype'] for t in frozen)}); NF4 needs {budget:,} (ceil(n / 2) "
                "bytes of packed codes + 4 bytes of absmax per block): store two codes per byte, as nf4_quantize "
                "returns them")
    return COPY_HINT


QLORA_SIDES = (3200, 3456)  # in and out features of the memory case's layer, drawn at grading time (multiples of 128)
QLORA_BLOCK = 64
QLORA_GROWTH = MiB // 2  # what the student's code may keep before the construction (the warm-up leaves 0.1 to 0.4
# MiB, and the floor already allows the exercise cells' FOOTPRINT): the ballast room, FOOTPRINT + this, 2.5 MiB, stays
# 1.5 MiB below what one code per byte keeps beyond the bound (n / 2 bytes less the slack) on the smallest layer


def _step(layer, x, g):
    """One forward and backward pass of ``layer`` on ``x`` with weights ``g``; the loss (its graph freed)."""
    loss = layer(x).mul(g).sum()
    loss.backward()
    return loss


def _check_held_memory(nb, meter: Meter, out_features: int, in_features: int, seed: int,
                       block: int = QLORA_BLOCK) -> None:
    """What the process holds for a large layer, read from outside it: after construction (the base Linear
    released) and again after a forward and backward pass (nothing cached in between); on that pass, the
    loss and the input gradient's sum against the judge's own, the base weight lying on the NF4 grid."""
    n = out_features * in_features
    where = f"QLoRALinear(Linear({in_features}, {out_features}, bias=False), 4, 8.0, block_size={block})"
    warm = nb.QLoRALinear(nb.put(nn.Linear)(64, 8, bias=False), 2, 4.0, block)
    warm(fresh_tensor(nb, (2, 64))).sum().backward()  # first call: lazily loaded code and caches
    del warm

    make = nb.put(probes.ch08_grid_linear)  # the course's function, called in the process: a handle comes back

    def base():
        """The base layer, made in the process (cheaper than sending tens of MiB) in a tensor the meter booked: a
        random weight on the NF4 grid, every value a level times its block's absmax, each block holding a ±1
        level, so that NF4 stores it without rounding and the judge knows the dequantized weight exactly."""
        weight = meter.tensor((out_features, in_features), requires_grad=False).tensor
        return make(weight, NF4.float(), block, seed)

    held, layer = meter.held_by(lambda b: nb.QLoRALinear(b, 4, 8.0, block), inputs=lambda: [base()],
                                allowed_growth=QLORA_GROWTH)
    nf4 = (n + 1) // 2 + 4 * -(-n // block)
    lora = 4 * 4 * (in_features + out_features)  # lora_A and lora_B, float32
    budget = nf4 + lora + MiB // 2
    if held.kept > budget:
        raise AssertionError(
            f"{where}: with the base layer released, your process still held {mib(held.kept)} more than before "
            f"(read from outside your process); the packed codes and absmax need {mib(nf4)}, lora_A and lora_B "
            f"{mib(lora)}, the float weight is {mib(4 * n)}. "
            + _storage_hint(nb, layer, n, out_features, block, where))
    g = seeded((3, out_features), seed=seed + 1)
    after, loss = meter.held_by(lambda x, g: _step(layer, x, g),
                                inputs=lambda: [meter.tensor((3, in_features), seed=seed + 2), meter.put(g)],
                                allowed_growth=QLORA_GROWTH + max(held.kept, 0))  # the layer itself is held by now
    # Now also the gradients of lora_A and lora_B, and 0.5 MiB more slack: a pass through a layer this size leaves
    # up to 0.7 MiB of the allocator's behind (measured), while a cached float weight would take 4 n bytes.
    if held.kept + after.kept > budget + lora + MiB // 2:
        raise AssertionError(
            f"{where}: after a forward and backward pass your process held {mib(held.kept + after.kept)} for "
            f"the layer (read from outside your process), {mib(after.kept)} more than after construction (the "
            f"gradients of lora_A and lora_B take {mib(lora)}): dequantize in every forward and keep nothing float "
            "between calls. " + _storage_hint(nb, layer, n, out_features, block, where))
    # The same call's values: lora_B = 0, so the output is x @ W.T with W the base weight, which NF4 stores exactly.
    W = probes._ch08_grid_values(NF4, (out_features, in_features), block, seed).double()
    x = seeded((3, in_features), seed=seed + 2).double()
    y = x @ W.T
    ref, terms = (y * g.double()).sum().item(), (y * g.double()).abs().sum().item()
    got = float(fetch(loss))
    if not abs(got - ref) <= 1e-5 * terms + 1e-6:
        raise AssertionError(
            f"{where}, with lora_B = 0, on the pass measured: the sum of its output weighted by the grader's random "
            f"weights is {got:.6g}, expected {ref:.6g} for x @ base.weight.T (off by {abs(got - ref) / terms:.1e} of "
            "the summed magnitudes of its terms, where the base weight lies on the NF4 grid, so that NF4 stores it "
            "without rounding and float32 stays within 1e-5): far more than NF4's rounding. The layer must compute "
            "with the weight it stores, "
            "nf4_dequantize(weight_packed, weight_absmax, (out, in), block_size)")
    dx, expected = float(fetch(after.leaves[0].grad)), (g.double() @ W).sum().item()
    if not abs(dx - expected) <= 1e-5 * (g.double() @ W).abs().sum().item() + 1e-6:
        raise AssertionError(f"{where}, with lora_B = 0, on the pass measured: the input gradient sums to {dx:.6g}, "
                             f"expected {expected:.6g} (g @ base.weight): autograd must reach x through the "
                             "dequantized weight")


@hidden_test("test_qlora_linear")
def check_qlora_linear(nb):
    for rank, alpha, block, bias, lead, seed in QLORA_CASES:
        base = _qlora_base(bias, seed)
        W0 = base.weight.detach().clone()
        b0 = None if not bias else base.bias.detach().clone()
        layer = nb.QLoRALinear(base, rank, alpha, block)
        where = f"QLoRALinear(Linear(37, 53, bias={bias}), {rank}, {alpha}, block_size={block})"

        table = fetch(nb.apply(probes.param_table, layer))
        trainable = sorted(n for n, row in table.items() if row["requires_grad"])
        check_equal(trainable, ["lora_A", "lora_B"], f"the trainable parameters of {where}",
                    "only lora_A and lora_B train; the NF4 weight and the bias are frozen")
        check_equal(table["lora_A"]["shape"], [rank, 37], "the shape of lora_A", "(rank, in_features) as in ch01")
        check_equal(table["lora_B"]["shape"], [53, rank], "the shape of lora_B", "(out_features, rank) as in ch01")
        A, B = table["lora_A"]["value"], table["lora_B"]["value"]
        if B.abs().max() != 0:
            raise AssertionError("lora_B is not zero at initialisation: the layer must start as the quantized base")
        if A.std() == 0 or A.abs().max() > 1 / math.sqrt(37) + 1e-6:
            raise AssertionError("lora_A should be initialised like nn.Linear's weight (random, within "
                                 "±1/sqrt(in_features)): nn.init.kaiming_uniform_(A, a=math.sqrt(5))")
        s = alpha / rank
        got_s = float(fetch(layer.scaling))
        if abs(got_s - s) > 1e-12:
            raise AssertionError(f"scaling is {got_s:g}, expected alpha / rank = {s:g}")

        Wq = _nf4_roundtrip(W0, block)
        fetch(layer.load_state_dict({"lora_B": _randn(53, rank, seed=seed + 10, scale=0.3)}, strict=False))
        B = fetch(layer.lora_B)
        x, g = _randn(*lead, 37, seed=seed + 20), _randn(*lead, 53, seed=seed + 30)
        out = fetch(nb.apply(probes.forward_backward, layer, x, g))
        xr = x.double().requires_grad_(True)
        Ar, Br = A.double().requires_grad_(True), B.double().requires_grad_(True)
        y = xr @ Wq.double().T + (0 if b0 is None else b0.double()) + s * (xr @ Ar.T) @ Br.T
        y.backward(g.double())
        tol = dict(atol=1e-5, rtol=1e-5)
        _check_tensor(out["y"], f"the output of {where}", torch.float32, y.shape, "(..., out_features), float32")
        dense = x.double() @ W0.double().T + (0 if b0 is None else b0.double())
        if same_close(out["y"].double() - s * (x.double() @ A.double().T) @ B.double().T, dense, atol=1e-5, rtol=0):
            raise AssertionError(f"{where} computes with the original float weight: the output must use the NF4 "
                                 f"weight, dequantized from the stored codes. {COPY_HINT}")
        check_close(out["y"], y.detach().float(), f"the output of {where}",
                    "y = x @ nf4_dequantize(codes, absmax).T + bias + (alpha / rank) (x A^T) B^T, with the layer's "
                    "block_size", **tol)
        check_close(out["dx"], xr.grad.float(), f"the input gradient of {where}",
                    "dx = g (W_nf4 + (alpha / rank) B A): autograd through both the dequantized weight and the LoRA "
                    "path", **tol)
        check_close(out["grads"]["lora_A"], Ar.grad.float(), f"the gradient of lora_A of {where}",
                    "dA = (alpha / rank) (g B)^T x, summed over the leading dimensions", **tol)
        check_close(out["grads"]["lora_B"], Br.grad.float(), f"the gradient of lora_B of {where}",
                    "dB = (alpha / rank) g^T (x A^T), summed over the leading dimensions", **tol)
        extra = sorted(n for n, v in out["grads"].items() if v is not None and n not in ("lora_A", "lora_B"))
        if extra:
            raise AssertionError(f"{extra} received gradients: the frozen base (weight and bias) gets none")


@hidden_test("test_qlora_linear_errors")
def check_qlora_linear_errors(nb):
    for good in (1, 4):
        got = _raised(nb, "QLoRALinear", nn.Linear(37, 53), good, 1.0)
        if got:
            raise AssertionError(f"QLoRALinear(base, rank={good}, alpha=1.0) raised {got}: rank {good} is valid")
    for bad in (0, -1, 2.5):
        got = _raised(nb, "QLoRALinear", nn.Linear(37, 53), bad, 1.0)
        if got != "ValueError":
            did = "returned a layer" if got == "" else f"raised {got}"
            raise AssertionError(f"QLoRALinear(base, rank={bad!r}, alpha=1.0) {did}; it should raise ValueError. "
                                 f"{RANK_HINT}")


@hidden_test("test_qlora_linear_memory")
def check_qlora_linear_memory(nb):
    meter = Meter(nb)  # first: nothing the student's code holds goes unaccounted
    _check_held_memory(nb, meter, draw(*QLORA_SIDES, multiple_of=128), draw(*QLORA_SIDES, multiple_of=128),
                       new_seed())
