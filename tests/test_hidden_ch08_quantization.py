"""The hidden tests of chapter 8 accept correct implementations and reject plausible wrong ones.

The implementations here are written independently of solutions/ch08_quantization.py (other
arithmetic, other storage layouts), so that a bug shared by the solution and its hidden tests
cannot hide. The last tests run the same checks through the sandbox, as the autograder does.
"""
from __future__ import annotations

import math
import statistics

import pytest
import torch
from torch import nn

from grader.api import LocalNamespace, checks_for

from wrong_submissions_ch08_quantization import WRONG
from sandbox_checks import sandbox_tests
from contract_tables import Clause, contract_tests

CHAPTER = "ch08_quantization"
CHECKS = checks_for(CHAPTER)
CELLS = {"round_to_bf16": ["test_round_to_bf16", "test_round_to_bf16_edge_cases"],
         "absmax_quantize": ["test_absmax_quantize", "test_absmax_quantize_edge_cases"],
         "absmax_dequantize": ["test_absmax_dequantize", "test_absmax_dequantize_edge_cases"],
         "nf4_codebook": ["test_nf4_codebook"],
         "nf4_quantize": ["test_nf4_quantize", "test_nf4_quantize_edge_cases"],
         "nf4_dequantize": ["test_nf4_dequantize", "test_nf4_dequantize_edge_cases"],
         "QLoRALinear": ["test_qlora_linear", "test_qlora_linear_memory", "test_qlora_linear_errors"]}
GRADE_IDS = [grade_id for cells in CELLS.values() for grade_id in cells]
# The cell each plausible wrong submission of wrong_submissions_ch08_quantization.py fails in the sandbox.
SANDBOX_CELL = {"round_to_bf16": "test_round_to_bf16", "absmax_quantize": "test_absmax_quantize_edge_cases",
                "absmax_dequantize": "test_absmax_dequantize", "nf4_codebook": "test_nf4_codebook",
                "nf4_quantize": "test_nf4_quantize", "nf4_dequantize": "test_nf4_dequantize",
                "QLoRALinear": "test_qlora_linear_memory"}


# --- correct implementations ---------------------------------------------------------------------
def make_round(mode="even", keep_nan=True, overflow="inf", subnormals="round", zeros="signed"):
    """Rounding by explicit comparison of the dropped half-word, in int64 (unsigned view)."""

    def round_to_bf16(x):
        u = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        low, kept = u & 0xFFFF, u >> 16
        if mode == "even":
            up = (low > 0x8000) | ((low == 0x8000) & (kept & 1 == 1))
        elif mode == "away":
            up = low >= 0x8000
        else:  # truncate
            up = torch.zeros_like(low, dtype=torch.bool)
        v = (kept + up.long()) << 16
        exponent, sign = (u >> 23) & 0xFF, u & 0x80000000
        if overflow == "saturate":  # wrong: clamps to the largest finite bf16 value instead of rounding to inf
            v = torch.where((exponent != 0xFF) & ((v & 0x7F800000) == 0x7F800000), sign | 0x7F7F0000, v)
        if subnormals == "flush":  # wrong: subnormals become (signed) zeros
            v = torch.where(exponent == 0, sign, v)
        out = torch.where(v >= 1 << 31, v - (1 << 32), v).to(torch.int32).view(torch.float32)
        if zeros == "positive":  # wrong: -0 loses its sign
            out = torch.where(x == 0, torch.zeros_like(out), out)
        return torch.where(torch.isnan(x), x, out) if keep_nan else out

    return round_to_bf16


def round_via_bf16(x):
    return x.to(torch.bfloat16).float()


def make_absmax_quantize(range_mode="symmetric", drop_last=False, check="type and range", flat_codes=False,
                         rounding="round", zero_guard=True, pad="zeros"):
    def absmax_quantize(x, bits, block_size):
        if check == "type and range" and (type(bits) is not int or bits < 2 or bits > 8 or type(block_size) is not int
                                          or block_size < 1):
            raise ValueError(f"bad bits={bits} or block_size={block_size}")
        if check == "range" and (bits < 2 or bits > 8 or block_size < 1):  # wrong: 4.0 passes as bits
            raise ValueError(f"bad bits={bits} or block_size={block_size}")
        q_max = 2 ** (bits - 1) - 1 if range_mode == "symmetric" else 2 ** (bits - 1)
        flat = x.reshape(-1).double()
        n_blocks = flat.numel() // block_size if drop_last else math.ceil(flat.numel() / block_size)
        padded = torch.nn.functional.pad(flat, (0, n_blocks * block_size - flat.numel()))
        if pad == "last value" and flat.numel() < padded.numel():  # wrong: the padding repeats the last value
            padded[flat.numel():] = flat[-1]
        blocks = padded[:n_blocks * block_size].reshape(n_blocks, block_size)
        amax = blocks.abs().max(dim=1).values.float().double()
        if not zero_guard:  # wrong: a floor on the scale, so that an all-zero block's scale is not 0
            amax = amax.clamp_min(torch.finfo(torch.float32).tiny)
        scales = (amax / q_max).float()
        v = blocks * (q_max / torch.where(amax > 0, amax, torch.ones_like(amax)))[:, None]
        if rounding == "round":
            v = v.round()
        elif rounding == "half away":  # wrong on exact ties: 2.5 -> 3
            v = torch.sign(v) * torch.floor(v.abs() + 0.5)
        else:
            v = v.trunc()
        codes = v.clamp(-q_max, q_max - (range_mode != "symmetric")).to(torch.int8)  # asymmetric: [-2^(b-1), 2^(b-1)-1]
        return (codes.flatten() if flat_codes else codes), scales

    return absmax_quantize


def make_absmax_dequantize(tile=False, drop_padding=True):
    def absmax_dequantize(codes, scales, block_size, shape):
        n = math.prod(shape) if drop_padding else codes.numel()
        s = scales.repeat(block_size) if tile else scales.repeat_interleave(block_size)
        return (codes.reshape(-1).to(torch.float64) * s.double())[:n].float().view(*shape)

    return absmax_dequantize


def make_nf4_codebook(offset=None, typo=False):
    def nf4_codebook():
        nd = statistics.NormalDist()
        d = offset if offset is not None else 1 - (1 / 32 + 1 / 30) / 2
        pos = [nd.inv_cdf(d + (0.5 - d) * i / 8) for i in range(8)]
        neg = [-nd.inv_cdf(d + (0.5 - d) * i / 7) for i in range(7)]
        top = max(pos + [-v for v in neg])
        values = sorted(v / top for v in pos + neg + [0.0])
        if typo:
            values[9] += 2e-4
        return torch.tensor(values, dtype=torch.float32)

    return nf4_codebook


def make_nf4_quantize(codebook, low_first=False, whole_tensor=False, drop_last=False, zero_guard=True, pad_odd=True):
    def nf4_quantize(x, block_size=64):
        flat = x.reshape(-1).float()
        n = flat.numel()
        n_blocks = n // block_size if drop_last else -(-n // block_size)
        whole = min(n // block_size, n_blocks)  # whole blocks at once, the partial one apart (memory cells' large layers)
        maxima = [flat[:whole * block_size].view(whole, block_size).abs().amax(dim=1)] if whole else []
        absmax = torch.cat(maxima + [flat[i * block_size:(i + 1) * block_size].abs().max()[None]
                                     for i in range(whole, n_blocks)]) if n_blocks else torch.stack([])
        if whole_tensor:
            absmax = absmax.max().expand(n_blocks).clone()
        scale = absmax.repeat_interleave(block_size)[:n]
        scale = torch.cat([scale, scale.new_ones(n - scale.numel())])
        scaled = flat / (torch.where(scale > 0, scale, torch.ones_like(scale)) if zero_guard else scale)
        levels = codebook()
        codes = torch.cat([(part[:, None] - levels[None, :]).abs().argmin(dim=1)  # brute force, a million at a time
                           for part in scaled.split(1 << 20)]) if n else scaled.new_zeros(0, dtype=torch.long)
        if n % 2 and pad_odd:
            codes = torch.cat([codes, codes.new_zeros(1)])
        pairs = codes.view(-1, 2)
        first, second = (pairs[:, 1], pairs[:, 0]) if low_first else (pairs[:, 0], pairs[:, 1])
        return (first * 16 + second).to(torch.uint8), absmax

    return nf4_quantize


def make_nf4_dequantize(codebook, low_first=False, block_of=None, trim=True):
    def nf4_dequantize(packed, absmax, shape, block_size=64):
        n = math.prod(shape)
        hi, lo = packed.long() // 16, packed.long() % 16
        codes = torch.stack([lo, hi] if low_first else [hi, lo], dim=-1).reshape(-1)
        if trim:
            codes = codes[:n]
        idx = torch.arange(codes.numel()) // block_size if block_of is None else block_of(n, block_size)
        return (codebook()[codes] * absmax[idx]).reshape(shape)

    return nf4_dequantize


class _Dequantized(torch.autograd.Function):
    """Saves only the 4-bit state; dequantizes again in backward (the bitsandbytes design)."""

    @staticmethod
    def forward(ctx, x, packed, absmax, shape, block_size, dequantize):
        ctx.save_for_backward(packed, absmax)
        ctx.meta = (shape, block_size, dequantize)
        return x @ dequantize(packed, absmax, shape, block_size).T

    @staticmethod
    def backward(ctx, g):
        packed, absmax = ctx.saved_tensors
        shape, block_size, dequantize = ctx.meta
        return g @ dequantize(packed, absmax, shape, block_size), None, None, None, None, None


def make_qlora(quantize, dequantize, keep="nothing", scaling="alpha/rank", cache=False, bias_trainable=False,
               unpacked=False, custom_backward=False, rank_check="type and sign", base_path=True, init="kaiming"):
    class QLoRALinear(nn.Module):
        def __init__(self, base, rank, alpha, block_size=64):
            super().__init__()
            if rank_check == "type and sign" and (not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0):
                raise ValueError(f"rank must be a positive integer, got {rank}")
            if rank_check == "sign" and rank <= 0:  # wrong: 2.5 passes
                raise ValueError(f"rank must be a positive integer, got {rank}")
            self.shape, self.block_size = tuple(base.weight.shape), block_size
            packed, absmax = quantize(base.weight.detach(), block_size)
            if unpacked:  # one byte per code
                packed = torch.stack([packed >> 4, packed & 15], dim=1).flatten()
            self.register_buffer("q_codes", packed, persistent=False)
            self.register_buffer("q_absmax", absmax, persistent=False)
            if keep == "base":
                self.base = base
            elif keep == "frozen base":
                self.base = base.requires_grad_(False)
            elif keep == "fp16 buffer":
                self.register_buffer("w16", base.weight.detach().half())
            elif keep == "attribute":
                self.original = {"weight": base.weight.detach().clone()}
            if base.bias is not None:
                self.bias = nn.Parameter(base.bias.detach().clone(), requires_grad=bias_trainable)
            else:
                self.bias = None
            self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
            if init == "kaiming":
                nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            else:  # wrong: a standard normal A, far outside ±1/sqrt(in_features)
                nn.init.normal_(self.lora_A)
            self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
            self.scaling = alpha / rank if scaling == "alpha/rank" else float(alpha)
            self.use_original = keep in ("base", "frozen base")

        def _codes(self):
            if unpacked:
                pairs = self.q_codes.view(-1, 2)
                return pairs[:, 0] * 16 + pairs[:, 1]
            return self.q_codes

        def forward(self, x):
            if not base_path:  # wrong: the frozen weight is never used
                y = x.new_zeros(*x.shape[:-1], self.shape[0])
            elif self.use_original:
                y = x @ self.base.weight.T
            elif custom_backward:
                y = _Dequantized.apply(x, self._codes(), self.q_absmax, self.shape, self.block_size, dequantize)
            else:
                w = dequantize(self._codes(), self.q_absmax, self.shape, self.block_size)
                if cache:
                    self.cached_weight = w
                y = x @ w.T
            if self.bias is not None:
                y = y + self.bias
            return y + self.scaling * (x @ self.lora_A.T @ self.lora_B.T)

    return QLoRALinear


CODEBOOK = make_nf4_codebook()
NF4_QUANTIZE = make_nf4_quantize(CODEBOOK)
NF4_DEQUANTIZE = make_nf4_dequantize(CODEBOOK)


def namespace(**overrides) -> LocalNamespace:
    ns = {"round_to_bf16": make_round(), "absmax_quantize": make_absmax_quantize(),
          "absmax_dequantize": make_absmax_dequantize(), "nf4_codebook": CODEBOOK, "nf4_quantize": NF4_QUANTIZE,
          "nf4_dequantize": NF4_DEQUANTIZE, "QLoRALinear": make_qlora(NF4_QUANTIZE, NF4_DEQUANTIZE)}
    ns.update(overrides)
    return LocalNamespace(ns)


# --- tests -----------------------------------------------------------------------------------------
def test_every_grade_id_has_a_check():
    assert sorted(CHECKS) == sorted(GRADE_IDS)


def test_correct_implementations_pass():
    ns = namespace()
    for grade_id in GRADE_IDS:
        CHECKS[grade_id](ns)


def test_other_correct_qlora_passes():
    """Saving only the 4-bit state for backward and re-dequantizing there is just as right."""
    ns = namespace(QLoRALinear=make_qlora(NF4_QUANTIZE, NF4_DEQUANTIZE, custom_backward=True))
    for grade_id in CELLS["QLoRALinear"]:
        CHECKS[grade_id](ns)


def test_published_codebook_matches_the_construction():
    from grader.hidden.ch08_quantization import NF4

    assert (CODEBOOK().double() - NF4).abs().max() < 1e-6


def _grade(exercise: str, wrong, fails: dict[str, str]) -> None:
    """Every cell of ``exercise`` in ``fails`` rejects ``wrong`` (with a message matching its pattern, "" for
    any), and every other cell of the exercise passes it: points are lost only for the property that is wrong."""
    ns = namespace(**{exercise: wrong})
    assert set(fails) <= set(CELLS[exercise]), fails
    for grade_id in CELLS[exercise]:
        if grade_id in fails:
            with pytest.raises(AssertionError, match=fails[grade_id] or None):
                CHECKS[grade_id](ns)
        else:
            CHECKS[grade_id](ns)


VALUES, EDGE = "test_round_to_bf16", "test_round_to_bf16_edge_cases"


@pytest.mark.parametrize("wrong, fails", [
    (make_round("truncate"), {VALUES: "ties to even", EDGE: ""}),
    (make_round("away"), {VALUES: "ties to even", EDGE: ""}),
    (make_round(keep_nan=False), {EDGE: "NaNs did not stay NaN.*carries into an infinity"}),
    (make_round(overflow="saturate"), {EDGE: "do not clamp to the largest finite"}),
    (make_round(subnormals="flush"), {EDGE: "do not flush subnormals"}),
    (make_round(zeros="positive"), {EDGE: "sign bit included"}),
    (round_via_bf16, {VALUES: "integer operations", EDGE: "integer operations"}),  # the rule holds in every cell
], ids=["truncate", "away", "nan", "saturate", "flush", "zero_sign", "via_bf16"])
def test_round_to_bf16_rejects(wrong, fails):
    _grade("round_to_bf16", wrong, fails)


VALUES, EDGE = "test_absmax_quantize", "test_absmax_quantize_edge_cases"


@pytest.mark.parametrize("wrong, fails", [
    (make_absmax_quantize(range_mode="asymmetric"), {VALUES: "q_max", EDGE: "q_max"}),
    (make_absmax_quantize(flat_codes=True), {VALUES: "one row of block_size codes per block", EDGE: ""}),
    (make_absmax_quantize(rounding="trunc"), {VALUES: "truncates toward zero", EDGE: ""}),
    (make_absmax_quantize(drop_last=True), {EDGE: "pad the last"}),
    (make_absmax_quantize(rounding="half away"), {EDGE: "round half to even"}),
    (make_absmax_quantize(check="none"), {EDGE: "returned; it should raise ValueError \\(bits=1"}),
    (make_absmax_quantize(check="range"), {EDGE: "bits=4.0 is a float, not an int"}),
], ids=["asymmetric", "flat_codes", "trunc", "drop_last", "half_away", "no_check", "range_only"])
def test_absmax_quantize_rejects(wrong, fails):
    _grade("absmax_quantize", wrong, fails)


@pytest.mark.parametrize("wrong, fails", [
    (make_absmax_dequantize(tile=True), {"test_absmax_dequantize": "scale of its block",
                                         "test_absmax_dequantize_edge_cases": "scale of its block"}),
    (make_absmax_dequantize(drop_padding=False), {"test_absmax_dequantize_edge_cases": "the padding is dropped"}),
], ids=["tile", "keeps_padding"])
def test_absmax_dequantize_rejects(wrong, fails):
    _grade("absmax_dequantize", wrong, fails)


@pytest.mark.parametrize("wrong, message", [
    (make_nf4_codebook(typo=True), "the other levels are right. Compute the levels, do not type them in"),
    (make_nf4_codebook(offset=0.99), "0.9677083"),
    (make_nf4_codebook(offset=1 - 1 / 32), "0.9677083"),
    (lambda: torch.linspace(-1, 1, 16), "exact 0"),
], ids=["typo", "offset_0.99", "offset_1-1/32", "linspace"])
def test_nf4_codebook_rejects(wrong, message):
    _grade("nf4_codebook", wrong, {"test_nf4_codebook": message})


VALUES, EDGE = "test_nf4_quantize", "test_nf4_quantize_edge_cases"


@pytest.mark.parametrize("wrong, fails", [
    (make_nf4_quantize(CODEBOOK, low_first=True), {VALUES: "swapped", EDGE: "swapped"}),
    (make_nf4_quantize(CODEBOOK, whole_tensor=True), {VALUES: "max \\|x\\| of each block", EDGE: ""}),
    (make_nf4_quantize(lambda: torch.linspace(-1, 1, 16)), {VALUES: "nearest NF4 level", EDGE: ""}),
    (make_nf4_quantize(CODEBOOK, drop_last=True), {EDGE: "pad the last"}),
    (make_nf4_quantize(CODEBOOK, zero_guard=False), {EDGE: "all-zero block has absmax 0"}),
    (make_nf4_quantize(CODEBOOK, pad_odd=False), {EDGE: "raised RuntimeError.*with an odd n"}),
], ids=["low_first", "whole_tensor", "uniform_levels", "drop_last", "zero_block_nan", "odd_count"])
def test_nf4_quantize_rejects(wrong, fails):
    _grade("nf4_quantize", wrong, fails)


VALUES, EDGE = "test_nf4_dequantize", "test_nf4_dequantize_edge_cases"


@pytest.mark.parametrize("wrong, fails", [
    (make_nf4_dequantize(CODEBOOK, low_first=True), {VALUES: "wrong order", EDGE: "wrong order"}),
    (make_nf4_dequantize(CODEBOOK, block_of=lambda n, b: torch.arange(n) // (2 * b)),
     {VALUES: "absmax of its block", EDGE: "absmax of its block"}),
    (make_nf4_dequantize(make_nf4_codebook(typo=True)), {VALUES: "nf4_codebook", EDGE: "nf4_codebook"}),
    (make_nf4_dequantize(CODEBOOK, trim=False), {EDGE: "raised RuntimeError.*ignore the low nibble of the last byte"}),
], ids=["low_first", "wrong_block", "typo_codebook", "no_trim"])
def test_nf4_dequantize_rejects(wrong, fails):
    _grade("nf4_dequantize", wrong, fails)


def _fixed_block_qlora():
    def quantize_default_block(w, block_size):
        return NF4_QUANTIZE(w, 64)

    def dequantize_default_block(p, a, shape, block_size):
        return NF4_DEQUANTIZE(p, a, shape, 64)

    return make_qlora(quantize_default_block, dequantize_default_block)


VALUES, MEMORY, ERRORS = "test_qlora_linear", "test_qlora_linear_memory", "test_qlora_linear_errors"


def _copy_except_documented_size():
    """Keeps a float copy of the weight in a closure (no inventory sees it), except at the 2048 x 2048 the memory
    cell once measured: the sizes are drawn now."""
    base_cls = make_qlora(NF4_QUANTIZE, NF4_DEQUANTIZE)

    class QLoRALinear(base_cls):
        def __init__(self, base, rank, alpha, block_size=64):
            super().__init__(base, rank, alpha, block_size)
            copy = [] if tuple(base.weight.shape) == (2048, 2048) else [base.weight.detach().clone()]
            self.float_weight = lambda: copy

    return QLoRALinear


def _skip_frozen_when_large():
    """The frozen path skipped on large layers (only the LoRA update is computed there), right on small ones: the
    measured pass's values are checked now."""
    base_cls = make_qlora(NF4_QUANTIZE, NF4_DEQUANTIZE)

    class QLoRALinear(base_cls):
        def forward(self, x):
            if math.prod(self.shape) > 1_000_000:
                return self.scaling * (x @ self.lora_A.T @ self.lora_B.T)
            return super().forward(x)

    return QLoRALinear


# A float copy kept except at the documented size, and the frozen path skipped on large layers (the clauses
# "drawn-size" and "the weighted sum of the output ..." of CONTRACT), and the wrong answers that fail the memory or
# the errors cell alone (an fp16 buffer, a float attribute, a cached weight, unpacked codes, no rank check or a
# sign check only) are graded by CONTRACT below: same messages, every other cell of QLoRALinear run. Here: the
# wrong answers that fail the values cell, with the memory and errors cells run all the same.
@pytest.mark.parametrize("flags, fails", [
    (dict(keep="base"), {VALUES: "", MEMORY: "full-precision copy"}),
    (dict(keep="frozen base"), {VALUES: "computes with the original float weight", MEMORY: "full-precision copy"}),
    (dict(base_path=False), {VALUES: "", MEMORY: "far more than NF4's rounding"}),
    (dict(scaling="alpha"), {VALUES: "alpha / rank"}),
    (dict(bias_trainable=True), {VALUES: "trainable parameters"}),
], ids=["keeps_base", "uses_frozen_base", "no_base_path", "scaling_alpha", "bias_trainable"])
def test_qlora_linear_rejects(flags, fails):
    _grade("QLoRALinear", make_qlora(NF4_QUANTIZE, NF4_DEQUANTIZE, **flags), fails)


def test_qlora_linear_rejects_a_fixed_block_size():
    """A block size of 64 whatever the argument: wrong values, but only the 4-bit state is kept."""
    _grade("QLoRALinear", _fixed_block_qlora(), {VALUES: "block_size"})


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(CHAPTER, WRONG, SANDBOX_CELL)


# --- the contract, clause by clause (tests/contract_tables.py) -------------------------------------------
def _w(exercise, wrong):
    return {exercise: wrong}


R, AQ, AD, CB, NQ, ND, QL = ("round_to_bf16", "absmax_quantize", "absmax_dequantize", "nf4_codebook", "nf4_quantize",
                             "nf4_dequantize", "QLoRALinear")
R_VALUES, R_EDGE = "test_round_to_bf16", "test_round_to_bf16_edge_cases"
AQ_VALUES, AQ_EDGE = "test_absmax_quantize", "test_absmax_quantize_edge_cases"
AD_VALUES, AD_EDGE = "test_absmax_dequantize", "test_absmax_dequantize_edge_cases"
NQ_VALUES, NQ_EDGE = "test_nf4_quantize", "test_nf4_quantize_edge_cases"
ND_VALUES, ND_EDGE = "test_nf4_dequantize", "test_nf4_dequantize_edge_cases"
Q_VALUES, Q_MEMORY, Q_ERRORS = "test_qlora_linear", "test_qlora_linear_memory", "test_qlora_linear_errors"


def _qlora(**kw):
    return {QL: make_qlora(NF4_QUANTIZE, NF4_DEQUANTIZE, **kw)}


CONTRACT = [
    Clause(R, "Round float32 values to the nearest bfloat16 value", (R_VALUES,), _w(R, make_round("truncate")),
           "ties to even", label="nearest-not-truncated"),
    Clause(R, "ties to even", (R_VALUES,), _w(R, make_round("away")), "ties to even"),
    Clause(R, "a NaN stays a NaN", (R_EDGE,), _w(R, make_round(keep_nan=False)), "NaNs did not stay NaN"),
    Clause(R, "values that round up to infinity", (R_EDGE,), _w(R, make_round(overflow="saturate")),
           "do not clamp to the largest finite"),
    Clause(R, "subnormals included", (R_EDGE,), _w(R, make_round(subnormals="flush")), "do not flush subnormals"),
    Clause(R, "the subnormals, ±0, the values that round to ±inf and ±inf bit for bit", (R_EDGE,),
           _w(R, make_round(zeros="positive")), "sign bit included", label="signed-zero"),
    Clause(R, "no conversion to bfloat16 anywhere", (R_VALUES,), _w(R, round_via_bf16), "integer operations"),
    Clause(AQ, "q_max = 2 ** (bits - 1) - 1", (AQ_VALUES,), _w(AQ, make_absmax_quantize(range_mode="asymmetric")),
           "q_max"),
    Clause(AQ, "tensor of shape (n_blocks, block_size)", (AQ_VALUES,), _w(AQ, make_absmax_quantize(flat_codes=True)),
           "one row of block_size codes per block"),
    Clause(AQ, "``round(x / scale)`` of each value", (AQ_VALUES,), _w(AQ, make_absmax_quantize(rounding="trunc")),
           "truncates toward zero"),
    Clause(AQ, "n_blocks = ceil(n / block_size)", (AQ_EDGE,), _w(AQ, make_absmax_quantize(drop_last=True)),
           "pad the last"),
    Clause(AQ, "(round half to even, like ``torch.round``)", (AQ_EDGE,),
           _w(AQ, make_absmax_quantize(rounding="half away")), "round half to even"),
    Clause(AQ, "the padding after the last value holds code 0", (AQ_EDGE,),
           _w(AQ, make_absmax_quantize(pad="last value")), "padding after the last value holds code 0"),
    Clause(AQ, "(0 for an all-zero block, whose codes are all 0)", (AQ_EDGE,),
           _w(AQ, make_absmax_quantize(zero_guard=False)), "all-zero"),
    Clause(AQ, "ValueError: if ``bits`` is not an int in 2..8 or ``block_size`` is not an int >= 1", (AQ_EDGE,),
           _w(AQ, make_absmax_quantize(check="none")), "it should raise ValueError", label="no-check"),
    Clause(AQ, "ValueError: if ``bits`` is not an int in 2..8", (AQ_EDGE,), _w(AQ, make_absmax_quantize(check="range")),
           "bits=4.0 is a float, not an int", label="float-bits"),
    Clause(AD, "each code times its block's scale", (AD_VALUES,), _w(AD, make_absmax_dequantize(tile=True)),
           "scale of its block"),
    Clause(AD, "(the padding is dropped)", (AD_EDGE,), _w(AD, make_absmax_dequantize(drop_padding=False)),
           "the padding is dropped"),
    Clause(CB, "Compute them from the quantiles as described above", ("test_nf4_codebook",),
           _w(CB, make_nf4_codebook(typo=True)), "Compute the levels, do not type them in"),
    Clause(CB, "(the extreme quantile", ("test_nf4_codebook",), _w(CB, make_nf4_codebook(offset=0.99)), "0.9677083",
           label="offset-0.99"),
    Clause(CB, "(the extreme quantile", ("test_nf4_codebook",), _w(CB, make_nf4_codebook(offset=1 - 1 / 32)),
           "0.9677083", label="offset-1-1/32"),
    Clause(CB, "7 negative values, 0.0, 8 positive values", ("test_nf4_codebook",),
           _w(CB, lambda: torch.linspace(-1, 1, 16)), "exact 0"),
    Clause(NQ, "byte k holds the code of value 2k in its high nibble", (NQ_VALUES,),
           _w(NQ, make_nf4_quantize(CODEBOOK, low_first=True)), "swapped"),
    Clause(NQ, "max |x| of each block", (NQ_VALUES,), _w(NQ, make_nf4_quantize(CODEBOOK, whole_tensor=True)),
           "max \\|x\\| of each block"),
    Clause(NQ, "the index (0..15) of the ``nf4_codebook()`` level nearest to value / absmax of its block",
           (NQ_VALUES,), _w(NQ, make_nf4_quantize(lambda: torch.linspace(-1, 1, 16))), "nearest NF4 level"),
    Clause(NQ, "(ceil(n / block_size),)", (NQ_EDGE,), _w(NQ, make_nf4_quantize(CODEBOOK, drop_last=True)),
           "pad the last"),
    Clause(NQ, "all-zero blocks get code 7", (NQ_EDGE,), _w(NQ, make_nf4_quantize(CODEBOOK, zero_guard=False)),
           "all-zero block has absmax 0"),
    Clause(NQ, "(ceil(n / 2),)", (NQ_EDGE,), _w(NQ, make_nf4_quantize(CODEBOOK, pad_odd=False)), "with an odd n"),
    Clause(ND, "high nibble first", (ND_VALUES,), _w(ND, make_nf4_dequantize(CODEBOOK, low_first=True)),
           "wrong order"),
    Clause(ND, "times its block's absmax", (ND_VALUES,),
           _w(ND, make_nf4_dequantize(CODEBOOK, block_of=lambda n, b: torch.arange(n) // (2 * b))),
           "absmax of its block"),
    Clause(ND, "codebook level of each code", (ND_VALUES,), _w(ND, make_nf4_dequantize(make_nf4_codebook(typo=True))),
           "nf4_codebook"),
    Clause(ND, "the unused low nibble of the last byte may hold anything", (ND_EDGE,),
           _w(ND, make_nf4_dequantize(CODEBOOK, trim=False)), "ignore the low nibble of the last byte"),
    Clause(QL, "Only lora_A and lora_B require gradients", (Q_VALUES,), _qlora(keep="base"), "trainable",
           label="keeps-trainable-base"),
    Clause(QL, "y = x @ nf4_dequantize(weight_packed, weight_absmax, (out, in), block_size).T", (Q_VALUES,),
           _qlora(keep="frozen base"), "computes with the original float weight"),
    Clause(QL, "Do not keep it (nor any float copy of its weight)", (Q_MEMORY,), _qlora(keep="fp16 buffer"),
           "full-precision copy", label="fp16-buffer"),
    Clause(QL, "Do not keep it (nor any float copy of its weight)", (Q_MEMORY,), _qlora(keep="attribute"),
           "full-precision copy", label="float-attribute"),
    Clause(QL, "not a cached dequantized weight", (Q_MEMORY,), _qlora(cache=True), "after a forward and backward pass"),
    Clause(QL, "may grow after construction by no more than the packed codes and absmax", (Q_MEMORY,),
           _qlora(unpacked=True), "two codes per byte"),
    Clause(QL, "in and out features are each drawn at grading time from 3200 to 3456", (Q_MEMORY,),
           _w(QL, _copy_except_documented_size()), "the float weight is .* float copy of its weight",
           label="drawn-size"),
    Clause(QL, "the weighted sum of the output and the sum of the input gradient are compared with those of",
           (Q_MEMORY,), _w(QL, _skip_frozen_when_large()), "far more than NF4's rounding"),
    Clause(QL, "the output, the input gradient and the gradients of lora_A and lora_B against a float64 reference",
           (Q_VALUES,), _qlora(base_path=False), "", label="no-base-path"),
    Clause(QL, "``nn.init.kaiming_uniform_(A, a=math.sqrt(5))``", (Q_VALUES,), _qlora(init="normal"),
           "initialised like nn.Linear's weight"),
    Clause(QL, "``self.scaling = alpha / rank``", (Q_VALUES,), _qlora(scaling="alpha"), "alpha / rank"),
    Clause(QL, "the base bias, frozen (``requires_grad=False``)", (Q_VALUES,), _qlora(bias_trainable=True),
           "trainable parameters"),
    Clause(QL, "weight_packed, weight_absmax: buffers, ``nf4_quantize(base.weight, block_size)``", (Q_VALUES,),
           _w(QL, _fixed_block_qlora()), "block_size"),
    Clause(QL, "rank: r, a positive int", (Q_ERRORS,), _qlora(rank_check="sign"),
           "rank=2.5.*raised TypeError; it should raise ValueError"),
    Clause(QL, "anything else raises ``ValueError(", (Q_ERRORS,), _qlora(rank_check="none"),
           "rank=0.*it should raise ValueError"),
]

test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
    test_contract_covers_every_graded_cell = contract_tests(CHAPTER, CONTRACT, namespace, CHECKS, globals())
