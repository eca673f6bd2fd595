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

CHAPTER = "ch08_quantization"
CHECKS = checks_for(CHAPTER)
GRADE_IDS = ["test_round_to_bf16", "test_absmax_quantize", "test_absmax_dequantize", "test_nf4_codebook",
             "test_nf4_quantize", "test_nf4_dequantize", "test_qlora_linear"]
EXERCISES = {"test_round_to_bf16": "round_to_bf16", "test_absmax_quantize": "absmax_quantize",
             "test_absmax_dequantize": "absmax_dequantize", "test_nf4_codebook": "nf4_codebook",
             "test_nf4_quantize": "nf4_quantize", "test_nf4_dequantize": "nf4_dequantize",
             "test_qlora_linear": "QLoRALinear"}


# --- correct implementations ---------------------------------------------------------------------
def make_round(mode="even", keep_nan=True):
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
        out = torch.where(v >= 1 << 31, v - (1 << 32), v).to(torch.int32).view(torch.float32)
        return torch.where(torch.isnan(x), x, out) if keep_nan else out

    return round_to_bf16


def round_via_bf16(x):
    return x.to(torch.bfloat16).float()


def make_absmax_quantize(range_mode="symmetric", drop_last=False, check=True, flat_codes=False, rounding="round"):
    def absmax_quantize(x, bits, block_size):
        if check and (type(bits) is not int or bits < 2 or bits > 8 or type(block_size) is not int or block_size < 1):
            raise ValueError(f"bad bits={bits} or block_size={block_size}")
        q_max = 2 ** (bits - 1) - 1 if range_mode == "symmetric" else 2 ** (bits - 1)
        flat = x.reshape(-1).double()
        n_blocks = flat.numel() // block_size if drop_last else math.ceil(flat.numel() / block_size)
        padded = torch.nn.functional.pad(flat, (0, n_blocks * block_size - flat.numel()))
        blocks = padded[:n_blocks * block_size].reshape(n_blocks, block_size)
        amax = blocks.abs().max(dim=1).values.float().double()
        scales = (amax / q_max).float()
        v = blocks * (q_max / torch.where(amax > 0, amax, torch.ones_like(amax)))[:, None]
        v = v.round() if rounding == "round" else v.trunc()
        codes = v.clamp(-q_max, q_max - (range_mode != "symmetric")).to(torch.int8)  # asymmetric: [-2^(b-1), 2^(b-1)-1]
        return (codes.flatten() if flat_codes else codes), scales

    return absmax_quantize


def make_absmax_dequantize(tile=False):
    def absmax_dequantize(codes, scales, block_size, shape):
        n = math.prod(shape)
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


def make_nf4_quantize(codebook, low_first=False, whole_tensor=False, drop_last=False):
    def nf4_quantize(x, block_size=64):
        flat = x.reshape(-1).float()
        n = flat.numel()
        n_blocks = n // block_size if drop_last else -(-n // block_size)
        absmax = torch.stack([flat[i * block_size:(i + 1) * block_size].abs().max() for i in range(n_blocks)])
        if whole_tensor:
            absmax = absmax.max().expand(n_blocks).clone()
        scale = absmax.repeat_interleave(block_size)[:n]
        scale = torch.cat([scale, scale.new_ones(n - scale.numel())])
        scaled = flat / torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = (scaled[:, None] - codebook()[None, :]).abs().argmin(dim=1)
        if n % 2:
            codes = torch.cat([codes, codes.new_zeros(1)])
        pairs = codes.view(-1, 2)
        first, second = (pairs[:, 1], pairs[:, 0]) if low_first else (pairs[:, 0], pairs[:, 1])
        return (first * 16 + second).to(torch.uint8), absmax

    return nf4_quantize


def make_nf4_dequantize(codebook, low_first=False, block_of=None):
    def nf4_dequantize(packed, absmax, shape, block_size=64):
        n = math.prod(shape)
        hi, lo = packed.long() // 16, packed.long() % 16
        codes = torch.stack([lo, hi] if low_first else [hi, lo], dim=-1).reshape(-1)[:n]
        idx = torch.arange(n) // block_size if block_of is None else block_of(n, block_size)
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
               unpacked=False, custom_backward=False):
    class QLoRALinear(nn.Module):
        def __init__(self, base, rank, alpha, block_size=64):
            super().__init__()
            if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
                raise ValueError(f"rank must be a positive integer, got {rank}")
            self.shape, self.block_size = tuple(base.weight.shape), block_size
            packed, absmax = quantize(base.weight.detach(), block_size)
            if unpacked:  # one byte per code
                packed = torch.stack([packed >> 4, packed & 15], dim=1).flatten()
            self.register_buffer("q_codes", packed, persistent=False)
            self.register_buffer("q_absmax", absmax, persistent=False)
            if keep == "base":
                self.base = base
            elif keep == "fp16 buffer":
                self.register_buffer("w16", base.weight.detach().half())
            elif keep == "attribute":
                self.original = {"weight": base.weight.detach().clone()}
            if base.bias is not None:
                self.bias = nn.Parameter(base.bias.detach().clone(), requires_grad=bias_trainable)
            else:
                self.bias = None
            self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
            self.scaling = alpha / rank if scaling == "alpha/rank" else float(alpha)
            self.use_original = keep == "base"

        def _codes(self):
            if unpacked:
                pairs = self.q_codes.view(-1, 2)
                return pairs[:, 0] * 16 + pairs[:, 1]
            return self.q_codes

        def forward(self, x):
            if self.use_original:
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
    CHECKS["test_qlora_linear"](namespace(QLoRALinear=make_qlora(NF4_QUANTIZE, NF4_DEQUANTIZE, custom_backward=True)))


def test_published_codebook_matches_the_construction():
    from grader.hidden.ch08_quantization import NF4

    assert (CODEBOOK().double() - NF4).abs().max() < 1e-6


def _rejects(grade_id: str, message: str, **overrides) -> None:
    with pytest.raises(AssertionError, match=message):
        CHECKS[grade_id](namespace(**overrides))


@pytest.mark.parametrize("wrong, message", [
    (make_round("truncate"), "ties to even"),
    (make_round("away"), "ties to even"),
    (make_round(keep_nan=False), "NaN"),
    (round_via_bf16, "integer operations"),
])
def test_round_to_bf16_rejects(wrong, message):
    _rejects("test_round_to_bf16", message, round_to_bf16=wrong)


@pytest.mark.parametrize("wrong, message", [
    (make_absmax_quantize(range_mode="asymmetric"), "q_max"),
    (make_absmax_quantize(drop_last=True), "pad the last"),
    (make_absmax_quantize(check=False), "ValueError"),
    (make_absmax_quantize(flat_codes=True), "n_blocks, block_size"),
    (make_absmax_quantize(rounding="trunc"), "differ from round"),
])
def test_absmax_quantize_rejects(wrong, message):
    _rejects("test_absmax_quantize", message, absmax_quantize=wrong)


def test_absmax_dequantize_rejects():
    _rejects("test_absmax_dequantize", "scale of its block", absmax_dequantize=make_absmax_dequantize(tile=True))


@pytest.mark.parametrize("wrong, message", [
    (make_nf4_codebook(typo=True), "computed, not typed in"),
    (make_nf4_codebook(offset=0.99), "0.9677083"),
    (make_nf4_codebook(offset=1 - 1 / 32), "0.9677083"),
    (lambda: torch.linspace(-1, 1, 16), "exact 0"),
])
def test_nf4_codebook_rejects(wrong, message):
    _rejects("test_nf4_codebook", message, nf4_codebook=wrong)


@pytest.mark.parametrize("wrong, message", [
    (make_nf4_quantize(CODEBOOK, low_first=True), "swapped"),
    (make_nf4_quantize(CODEBOOK, whole_tensor=True), "max \\|x\\| of each block"),
    (make_nf4_quantize(CODEBOOK, drop_last=True), "pad the last"),
    (make_nf4_quantize(lambda: torch.linspace(-1, 1, 16)), "nearest NF4 level"),
])
def test_nf4_quantize_rejects(wrong, message):
    _rejects("test_nf4_quantize", message, nf4_quantize=wrong)


@pytest.mark.parametrize("wrong, message", [
    (make_nf4_dequantize(CODEBOOK, low_first=True), "wrong order"),
    (make_nf4_dequantize(CODEBOOK, block_of=lambda n, b: torch.arange(n) // (2 * b)), "absmax of its block"),
    (make_nf4_dequantize(make_nf4_codebook(typo=True)), "nf4_codebook"),
])
def test_nf4_dequantize_rejects(wrong, message):
    _rejects("test_nf4_dequantize", message, nf4_dequantize=wrong)


@pytest.mark.parametrize("flags, message", [
    (dict(keep="base"), "full-precision copy"),
    (dict(keep="fp16 buffer"), "full-precision copy"),
    (dict(keep="attribute"), "full-precision copy"),
    (dict(cache=True), "after a forward and backward pass"),
    (dict(unpacked=True), "two codes per byte"),
    (dict(scaling="alpha"), "alpha / rank"),
    (dict(bias_trainable=True), "trainable parameters"),
])
def test_qlora_linear_rejects(flags, message):
    _rejects("test_qlora_linear", message, QLoRALinear=make_qlora(NF4_QUANTIZE, NF4_DEQUANTIZE, **flags))


def test_qlora_linear_rejects_a_fixed_block_size():
    def quantize_default_block(w, block_size):
        return NF4_QUANTIZE(w, 64)

    def dequantize_default_block(p, a, shape, block_size):
        return NF4_DEQUANTIZE(p, a, shape, 64)

    _rejects("test_qlora_linear", "block_size",
             QLoRALinear=make_qlora(quantize_default_block, dequantize_default_block))


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(
    CHAPTER, WRONG, {exercise: grade_id for grade_id, exercise in EXERCISES.items()})
