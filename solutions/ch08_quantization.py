# ---
# jupyter:
#   chapter:
#     title: "Number formats, NF4, QLoRA (Triton NF4 dequantize)"
#     imports: []
#     kernel: kernels.ch08_quantization
#     checkpoints: [tinygpt_fibonacci]
#     prose_numbers:  # phrases whose numbers are definitions or quoted figures (tests/test_prose_numbers.py)
#       - 'Each graded cell may use 60 s and 4 GiB'  # the grader's limits per graded cell
#       - 'plus 0.5 MiB of slack'
#       - 'and another 0.5 MiB'
#       - 'may keep at most 0.5 MiB'  # the memory cell's allowances
#       - 'spend their 16 bits'
#       - 'its memory cost: 4.5 bits per parameter'
#       - 'integers in 16 bits'
#       - 'keeps the top 16 bits of the 32. Just dropping the low 16 bits'
#       - 'Plant one outlier (50×) in a Gaussian tensor and quantize it to 4 bits'
#       - '"4 bits, block "'  # set in code
#       - 'NF4 (4 bits)'  # the format's definition, in a demo line
#       - 'the first 8 of 9 points'
#       - 'the first 7 of 8 points'  # NF4's construction
#       - '$4 + 32/64 = 4.5$ bits per value'
#       - '"ceil(7 / 2) = 4 bytes of uint8"'
#       - '"NF4 should keep normal weights within about 10% relative error"'  # the visible test's threshold
#       - 'stores the weights in 4 bits'
#       - '4 bits cost '
#       - 'eight times more (on average less)'  # 2^-8 / 2^-11
#       - 'even at 4 bits'
#       - 'quantized to 8 bits in blocks of 256'
#       - 'the textbook numbers: 4.5 bits for NF4'
#       - 'from 2 to 8 bits'
#       - 'from 5 bits on'
#       - '4.5 bits instead of 16 (or 32) per parameter'
#       - '(float32 → 4.5 bits is'
#       - '"test loss at 4.5 bits per weight, int4 / NF4"'
#       - 'costs 32/64 = 0.5 bits per parameter for the constants; double quantization brings that to 8/64 + 32/(64·256) = 0.127, saving 0.373 bits per parameter'  # QLoRA §3
#       - 'from more than 780 GB to less than 48 GB'
#       - '65B fine-tuned on one 48 GB GPU'  # QLoRA abstract
#       - '"32 / 4.5 = 7.1× (32 / 4.127 = 7.8× with double quantization)"'
#       - '(10 bits, every integer up to 2048)'
#       - 'with 7 bits of mantissa'
#       - 'at the same 4.5 bits; double quantization brings the cost to ≈ 4.127 bits'
#     mentioned:  # names an exercise's text uses that grading does not offer (tests/test_namespace.py)
#       nf4_dequantize:
#         kernels: "the course's kernels, refused as answers"
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 8 — Number formats, quantization and QLoRA
#
# Every byte of a model is a number in some format. Storing the frozen weights of a model in
# fewer bits is the cheapest memory saving there is: no change to the architecture, no extra
# compute worth mentioning, only a rounding error. This chapter builds the formats from their
# bits and measures the error each one introduces.
#
# **What you will learn**
# - what a floating-point number is (sign, exponent, mantissa), and why fp16 and bf16 spend
#   their 16 bits so differently;
# - how rounding to nearest, ties to even, works on the bits, and why truncating is biased;
# - blockwise absmax integer quantization, and why blocks tame outliers;
# - the 4-bit NormalFloat (NF4) codebook of QLoRA (Dettmers et al. 2023), built from quantiles
#   of the normal distribution, and its memory cost: 4.5 bits per parameter, ≈ 4.127 with
#   double quantization;
# - why NF4 is a lookup table rather than a float format, and what its dequantize step costs;
# - how a classifier's accuracy and loss fall as its weights lose bits, absmax and NF4 side by side;
# - QLoRA: a frozen 4-bit base plus a LoRA update, fine-tuned against plain LoRA on the task
#   of chapter 1, with memory and accuracy measured.

# %% tags=["setup"]
import math

import torch
from torch import nn

# %% [markdown]
# ## 1. Floating point: sign, exponent, mantissa
#
# A binary floating-point number with $E$ exponent bits and $M$ mantissa bits stores
#
# $$x = (-1)^{s}\; 2^{\,e - \text{bias}}\; \Bigl(1 + \frac{m}{2^{M}}\Bigr), \qquad \text{bias} = 2^{E-1} - 1,$$
#
# for a stored exponent $1 \le e \le 2^E - 2$. The exponent $e = 0$ holds zero and the
# *subnormals* $2^{1 - \text{bias}}\, m / 2^M$ (gradual underflow); $e = 2^E - 1$ holds $\pm\infty$
# ($m = 0$) and NaN ($m \ne 0$). The exponent bits set the **range**, the mantissa bits the
# **precision**: between two powers of two there are $2^M$ equally spaced numbers, so the
# relative spacing (machine epsilon) is $2^{-M}$.
#
# | format | sign | exponent $E$ | mantissa $M$ |
# |---|---|---|---|
# | fp32 | 1 | 8 | 23 |
# | fp16 | 1 | 5 | 10 |
# | bf16 | 1 | 8 | 7 |
#
# bf16 is fp32 with the last 16 mantissa bits cut off: the same range, far less precision.
# fp16 keeps more precision but overflows above 65504. `torch.finfo` knows the numbers:

# %%
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display

from coursekit import fast
from coursekit.report import literature_table, paired_bars
from coursekit.widgets import slider_plot

FORMATS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
rows = []
for name, dtype in FORMATS.items():
    fi = torch.finfo(dtype)
    rows.append(f"| {name} | {fi.bits} | {fi.max:.4g} | {fi.tiny:.3g} | {fi.smallest_normal * fi.eps:.3g} "
                f"| {fi.eps:.3g} | {-math.log10(fi.eps):.1f} |")
display(Markdown("| format | bits | largest | smallest normal | smallest subnormal | epsilon | decimal digits |\n"
                 "|---|---|---|---|---|---|---|\n" + "\n".join(rows)))

# %% [markdown]
# ### Your lecture notes vs what we measure: integers in 16 bits
#
# The lecture notes present bf16 as the 16-bit format that approximates integers better than fp16.
# It is the other way round. A format with $M$ mantissa bits holds every integer up to $2^{M+1}$
# exactly (the implicit leading 1 plus $M$ bits): $2^{11} = 2048$ for fp16, $2^8 = 256$ for bf16.
# Past that, the spacing between neighbours exceeds 1 and integers start to round: in bf16, 257
# is already 256. What bf16 buys with its mantissa bits is range: float32's exponent, so large
# values that are `inf` in fp16 stay finite (if rounded). Count it:

# %%
integers = torch.arange(1, 2 ** 17 + 1, dtype=torch.float32)  # exact in float32
for name in ("fp16", "bf16"):
    back = integers.to(FORMATS[name]).float()
    first = int(integers[back != integers][0])  # the first integer the format cannot hold
    exact = int((back == integers).sum())
    print(f"{name}: every integer up to {first - 1} exact; {first} -> {back[first - 1]:g}; "
          f"{exact:,} of the integers 1..{2 ** 17:,} exact; 1e6 -> {torch.tensor(1e6).to(FORMATS[name]).item():g}")

# %% [markdown]
# ## 2. Rounding: to nearest, ties to even
#
# Converting fp32 to bf16 keeps the top 16 bits of the 32. Just dropping the low 16 bits
# (*truncation*) always rounds towards zero: every number loses a little magnitude, and over
# millions of additions those losses add up. IEEE rounding goes to the **nearest** bf16 value;
# when the dropped part is exactly half-way (`0x8000`), it goes to the neighbour whose last kept
# bit is 0 (**ties to even**), so that ties round up and down equally often.
#
# On the integer view of the bits $b$ this is one addition: with $\ell$ = bit 16 of $b$ (the last
# kept bit),
#
# $$b' = \bigl(b + \texttt{0x7FFF} + \ell\bigr)\ \&\ \texttt{0xFFFF0000}.$$
#
# A dropped part above `0x8000` carries into the kept bits (round up), below it does not, and at
# exactly `0x8000` it carries only when $\ell = 1$ (round to even). Because the exponent sits just
# above the mantissa, a carry out of the mantissa increments the exponent: rounding up the largest
# finite values gives $\infty$, which is exactly what IEEE asks for. The one trap: a NaN's payload
# may sit in the low bits, and the addition can carry it into an infinity.

# %% exercise="round_to_bf16"
def round_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round float32 values to the nearest bfloat16 value, ties to even, with integer bit operations.

    Args:
        x: float32 tensor of any shape.

    Returns:
        float32 tensor of the same shape holding the bf16-rounded values: bitwise equal to
        ``x.to(torch.bfloat16).float()`` for every finite value (subnormals included, and values
        that round up to infinity) and for ±inf; a NaN stays a NaN. Work on ``x.view(torch.int32)``
        (no conversion to bfloat16 anywhere: the grader refuses the bfloat16 dtype and autocast in
        every exercise cell of this chapter).

    Graded on 1-D and 2-D tensors (up to 211 × 97) built from raw bit patterns: random patterns (any sign,
    exponent and mantissa, NaNs and infinities included), exact ties with both parities of the last kept bit,
    values just below and above a tie, subnormals of both signs, ±0, the largest finite values (some round to
    ±inf), ±inf, and NaNs whose payload lies in the dropped low bits. Values: every ordinary value (finite,
    normal, rounding to a finite value) bit for bit. Edge cases: the subnormals, ±0, the values that round to
    ±inf and ±inf bit for bit, and every NaN still a NaN. In both cells, besides the source check, a call in
    which any torch operation produces a bfloat16 tensor fails. Each graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    bits = x.view(torch.int32)
    last_kept = (bits >> 16) & 1
    # 0x7FFF + last_kept: above half carries, below does not, exactly half carries only onto an odd bit.
    rounded = ((bits + 0x7FFF + last_kept) & -0x10000).view(torch.float32)  # -0x10000 == 0xFFFF0000
    return torch.where(torch.isnan(x), x, rounded)  # a NaN payload could carry into an infinity
    ### END SOLUTION


# %% test="test_round_to_bf16" points=2 checks="round_to_bf16"
x = torch.tensor([1.0, -2.5, 0.1, 3.14159, 1e-20, 3.3e38, -65504.0])
got = round_to_bf16(x)
assert got.dtype == torch.float32 and got.shape == x.shape, "float32 in, float32 of the same shape out"
assert torch.equal(got.view(torch.int32), x.to(torch.bfloat16).float().view(torch.int32)), \
    f"round_to_bf16 gives {got.tolist()}, PyTorch's bf16 conversion {x.to(torch.bfloat16).float().tolist()}"
ties = torch.tensor([0x3F808000, 0x3F818000], dtype=torch.int32).view(torch.float32)  # 1 + half an ulp, ...
assert round_to_bf16(ties).view(torch.int32).tolist() == [0x3F800000, 0x3F820000], \
    "an exact tie goes to the neighbour with an even last bit: 0x3F80|8000 -> 0x3F80, 0x3F81|8000 -> 0x3F82"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch08_quantization", "test_round_to_bf16", globals())
### END HIDDEN TESTS

# %% test="test_round_to_bf16_edge_cases" points=1 checks="round_to_bf16"
edges = torch.tensor([1e-40, -1e-40, 0.0, -0.0, 3.3e38, -3.4e38, float("inf"), -float("inf")])  # subnormals, ...
got = round_to_bf16(edges)
assert torch.equal(got.view(torch.int32), edges.to(torch.bfloat16).float().view(torch.int32)), \
    f"round_to_bf16 gives {got.tolist()}, PyTorch's bf16 conversion {edges.to(torch.bfloat16).float().tolist()}: " \
    "subnormals round like other values, ±0 keeps its sign, the largest finite values round up to ±inf"
nans = torch.tensor([0x7F800001, 0x7FC00000], dtype=torch.int32).view(torch.float32)  # payload in the low bits, ...
assert torch.isnan(round_to_bf16(nans)).all(), "NaN must stay NaN, even when its payload sits in the dropped bits"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch08_quantization", "test_round_to_bf16_edge_cases", globals())
### END HIDDEN TESTS

# %% [markdown]
# ### Measure it: rounding vs truncation
#
# Round the weights of a pretrained model both ways. Each rounding error is tiny; what matters is
# whether they cancel. The mean error (bias) of truncation is of the same size as its typical
# error, that of rounding to nearest is far smaller.

# %%
from coursekit.checkpoints import load_pretrained
from coursekit.data import batches, source_task, target_task
from coursekit.transformer import accuracy, lm_loss

pretrained = load_pretrained("tinygpt_fibonacci")
LINEARS = [name for name, m in pretrained.named_modules() if isinstance(m, nn.Linear)]
weights = torch.cat([pretrained.get_submodule(n).weight.detach().flatten() for n in LINEARS])


def truncate_to_bf16(x):
    return (x.view(torch.int32) & -0x10000).view(torch.float32)


for name, fn in (("round to nearest even", round_to_bf16), ("truncate", truncate_to_bf16)):
    err = (fn(weights).abs() - weights.abs()) / weights.abs().clamp_min(1e-30)  # > 0: the magnitude grew
    print(f"{name:>22}: mean change of magnitude {err.mean():+.2e}, mean |relative error| {err.abs().mean():.2e}")
print(f"over {weights.numel():,} weights of the {len(LINEARS)} Linear layers of the pretrained TinyGPT")

# %% [markdown]
# Truncation always shrinks the magnitude, so its mean change is minus its typical error; the
# nearest-even errors go both ways and average out to almost nothing (and are smaller).
# Sums of many values (a matmul's accumulation, an optimizer's updates) inherit the bias of the
# first and not of the second.
#
# ### Play with it: a number, bit by bit
#
# Choose a number as mantissa × 10^power. Each row shows its bits in one format: sign (red),
# exponent (blue), mantissa (green), then the value the format actually stores and its relative
# error. Try 65504 vs 70000 (fp16 overflows), 1e-8 (fp16 underflows to a subnormal, then to zero)
# and 0.1 (no binary format holds it exactly).

# %% tags=["demo"]
FIELDS = {"fp32": (8, 23), "fp16": (5, 10), "bf16": (8, 7)}
FIELD_COLORS = ("#f4a6a6", "#a6c8f4", "#b5e3b0")


def stored_bits(value: float, fmt: str) -> tuple[str, float]:
    """The bit string of ``value`` in ``fmt`` (after IEEE rounding) and the value it represents."""
    t = torch.tensor([value], dtype=FORMATS[fmt])
    width = torch.finfo(t.dtype).bits
    raw = t.view(torch.int32 if width == 32 else torch.int16).item() & ((1 << width) - 1)
    return format(raw, f"0{width}b"), t.float().item()


def draw_bits(ax, mantissa=1.0, power=-1):
    value = mantissa * 10.0 ** power  # the reference, a Python float: float64, finite over the whole slider
    ax.set_xlim(-5, 47)
    ax.set_ylim(-0.6, 2.6)
    ax.axis("off")
    ax.set_title(f"x = {mantissa:g} × $10^{{{power}}}$ = {value:.8g}")
    for row, (fmt, (E, M)) in enumerate(FIELDS.items()):
        bits, stored = stored_bits(value, fmt)
        y = 2 - row
        ax.text(-0.7, y, fmt, ha="right", va="center", weight="bold")
        for i, b in enumerate(bits):
            field = 0 if i == 0 else (1 if i <= E else 2)
            ax.add_patch(plt.Rectangle((i, y - 0.4), 0.95, 0.8, color=FIELD_COLORS[field]))
            ax.text(i + 0.47, y, b, ha="center", va="center", family="monospace")
        finfo = torch.finfo(FORMATS[fmt])
        if not math.isfinite(stored):
            verdict = f"overflow: |x| > max {finfo.max:.3g}"
        elif stored == 0 and value != 0:
            verdict = f"underflow to 0\n(smallest subnormal {finfo.smallest_normal * finfo.eps:.2g})"
        else:
            rel = abs(stored - value) / abs(value) if value != 0 else 0.0
            verdict = f"= {stored:.8g}\nrel. error {rel:.1e}"
        ax.text(len(bits) + 0.5, y, verdict, va="center")


slider_plot(draw_bits, figsize=(11, 2.8), mantissa=(-9.99, 9.99, 0.01), power=(-45, 39, 1),
            defaults={"mantissa": 1.0, "power": -1},
            labels={"mantissa": "mantissa m (x = m × 10^p)", "power": "power of ten p"},
            explain={"mantissa": "the decimal digits of x", "power": "the decimal exponent of x"},
            notice={"power": lambda mantissa, power: "; ".join(
                f"{fmt} {'overflows' if not math.isfinite(stored) else 'underflows' if stored == 0 and mantissa else 'holds it'}"
                for fmt in FIELDS for stored in [stored_bits(mantissa * 10.0 ** power, fmt)[1]])})

# %% [markdown]
# ## 3. Integer quantization, block by block
#
# To store a tensor in $k$-bit integers, map its largest magnitude to the largest code
# $q_{max} = 2^{k-1} - 1$ and round everything else on that grid (*absmax* or symmetric
# quantization):
#
# $$\text{scale} = \frac{\max_i |x_i|}{q_{max}}, \qquad q_i = \operatorname{round}\Bigl(\frac{x_i}{\text{scale}}\Bigr) \in [-q_{max}, q_{max}], \qquad \hat x_i = q_i \cdot \text{scale}.$$
#
# The error of each value is at most half a step, scale / 2. One scale for a whole tensor lets a
# single outlier stretch the step for everybody; one scale per **block** of, say, 64 consecutive
# values confines the damage to one block, for the price of one float32 scale per block
# (32 / 64 = 0.5 extra bits per value).
#
# Write `absmax_quantize` and `absmax_dequantize`. The tensor is flattened (row-major) and cut into
# blocks of `block_size` values; when its size is not a multiple of `block_size`, the last block is
# padded with zeros (they change no absmax). Codes are stored as `torch.int8`, one per value,
# whatever `bits` is: simple, and wide enough for every width from 2 to 8 (packing two 4-bit codes
# per byte comes with NF4 below).

# %% exercise="absmax_quantize"
def absmax_quantize(x: torch.Tensor, bits: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric blockwise absmax quantization to ``bits``-bit integers.

    Args:
        x: float tensor of any shape and any number of elements n (flattened row-major).
        bits: code width, an int in 2..8; q_max = 2 ** (bits - 1) - 1.
        block_size: values per block, an int >= 1.

    Returns:
        codes: ``torch.int8`` tensor of shape (n_blocks, block_size), n_blocks = ceil(n / block_size),
            ``round(x / scale)`` of each value (round half to even, like ``torch.round``), every code in
            [-q_max, q_max]; the padding after the last value holds code 0.
        scales: ``torch.float32`` tensor of shape (n_blocks,): max |x| of the block / q_max
            (0 for an all-zero block, whose codes are all 0).

    Raises:
        ValueError: if ``bits`` is not an int in 2..8 or ``block_size`` is not an int >= 1.

    Graded on float32 tensors of 1 to 3 dimensions, from a single value to 37 × 53, with block sizes 1, 7, 8,
    10, 16, 64 and 1000 (one block for the whole tensor); codes against round(x / scale) computed in float64
    (either neighbour within a hair of a tie), scales to float32 rounding. Values: sizes that are multiples of
    the block size, every width from 2 to 8, one outlier among small values, values in the thousands. Edge
    cases: partial last blocks, a single value, an all-zero block, exact ties (x / scale = k + 1/2 with a
    scale of 1 or 2, which must round half to even), and the ValueError for bits 0, 1, 9 and 4.0 and block
    sizes 0, -3 and 16.0. No bfloat16 or autocast, as in every exercise cell of this chapter. Each graded cell
    may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an integer between 2 and 8, got {bits!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    q_max = 2 ** (bits - 1) - 1
    flat = x.detach().float().flatten()
    pad = -flat.numel() % block_size
    blocks = torch.cat([flat, flat.new_zeros(pad)]).view(-1, block_size)  # (n_blocks, block_size)
    scales = blocks.abs().amax(dim=1) / q_max
    safe = torch.where(scales == 0, torch.ones_like(scales), scales)  # an all-zero block gives codes 0
    codes = torch.round(blocks / safe[:, None]).clamp(-q_max, q_max).to(torch.int8)
    return codes, scales
    ### END SOLUTION


# %% test="test_absmax_quantize" points=2 checks="absmax_quantize"
x = torch.tensor([[0.5, -0.9, 0.25, 2.0], [0.0, -0.75, 0.1, 0.2]])
codes, scales = absmax_quantize(x, bits=3, block_size=4)  # q_max = 3; 8 values -> 2 blocks (the rows)
assert codes.dtype == torch.int8 and tuple(codes.shape) == (2, 4), \
    f"codes: int8 of shape (n_blocks, block_size) = (2, 4), got {codes.dtype} {tuple(codes.shape)}"
assert scales.dtype == torch.float32 and tuple(scales.shape) == (2,), "one float32 scale per block"
torch.testing.assert_close(scales, torch.tensor([2 / 3, 0.75 / 3]), msg="scale = max|x| of the block / q_max")
assert codes.tolist() == [[1, -1, 0, 3], [0, -3, 0, 1]], f"codes {codes.tolist()}: round(x / scale) per block"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch08_quantization", "test_absmax_quantize", globals())
### END HIDDEN TESTS

# %% test="test_absmax_quantize_edge_cases" points=1 checks="absmax_quantize"
x = torch.tensor([[0.5, -0.9, 0.25], [2.0, 0.0, -0.75], [0.1, 0.2, 0.3]])
codes, scales = absmax_quantize(x, bits=3, block_size=4)  # 9 values -> 3 blocks, the last one padded
assert tuple(codes.shape) == (3, 4) and codes[2].tolist() == [3, 0, 0, 0], \
    f"codes {codes.tolist()}: 9 values make 3 blocks of 4, and the padding after the last value holds code 0"
zero_codes, zero_scales = absmax_quantize(torch.zeros(5), 8, 2)
assert zero_scales.eq(0).all() and zero_codes.eq(0).all(), "an all-zero block has scale 0 and codes 0 (no NaN)"
tie_codes, _ = absmax_quantize(torch.tensor([3.0, 0.5, 1.5, 2.5]), 3, 4)  # scale 1: x / scale = x
assert tie_codes.tolist() == [[3, 0, 2, 2]], f"codes {tie_codes.tolist()}: exact ties round half to even (torch.round)"
for bad in ((x, 1, 4), (x, 9, 4), (x, 4, 0), (x, 4.0, 4)):
    try:
        absmax_quantize(*bad)
    except ValueError:
        pass
    else:
        raise AssertionError(f"bits={bad[1]!r}, block_size={bad[2]!r} should raise ValueError")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch08_quantization", "test_absmax_quantize_edge_cases", globals())
### END HIDDEN TESTS


# %% exercise="absmax_dequantize"
def absmax_dequantize(codes: torch.Tensor, scales: torch.Tensor, block_size: int, shape) -> torch.Tensor:
    """Undo ``absmax_quantize``: each code times its block's scale.

    Args:
        codes: integer tensor of shape (n_blocks, block_size), as returned by ``absmax_quantize``.
        scales: float32 tensor of shape (n_blocks,).
        block_size: values per block.
        shape: the shape of the original tensor (a tuple or ``torch.Size``); its number of elements n
            may be smaller than n_blocks * block_size (the padding is dropped).

    Returns:
        float32 tensor of shape ``shape``.

    Graded on random int8 codes in [-q_max, q_max] and float32 scales (one of them 0), each shape passed both
    as a tuple and as a ``torch.Size``. Values: shapes (2, 3), (24,), (100,), (4, 5, 8) and (32, 48), whose
    sizes are multiples of the block sizes 1, 8, 10, 16 and 64. Edge cases: padding to drop, with shapes (5,)
    (smaller than one block of 8), (97,), (3, 5, 7) and (37, 53) and block sizes 10, 16 and 64. No bfloat16 or
    autocast, as in every exercise cell of this chapter. Each graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    values = codes.reshape(-1, block_size).float() * scales.float()[:, None]  # (n_blocks, block_size)
    return values.flatten()[:math.prod(shape)].reshape(shape)
    ### END SOLUTION


# %% test="test_absmax_dequantize" points=1 checks="absmax_dequantize"
x = torch.randn(8, 12, generator=torch.Generator().manual_seed(0))  # 96 values: 6 whole blocks of 16
for bits in (8, 4, 2):
    codes, scales = absmax_quantize(x, bits, 16)
    x_hat = absmax_dequantize(codes, scales, 16, x.shape)
    assert x_hat.shape == x.shape and x_hat.dtype == torch.float32, "same shape as the original, float32"
    step = scales.repeat_interleave(16).view_as(x)
    assert ((x_hat - x).abs() <= step / 2 + 1e-6).all(), f"{bits} bits: the error exceeds half a step"
    print(f"{bits} bits, blocks of 16: max error {(x_hat - x).abs().max():.4f}")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch08_quantization", "test_absmax_dequantize", globals())
### END HIDDEN TESTS

# %% test="test_absmax_dequantize_edge_cases" points=1 checks="absmax_dequantize"
x = torch.randn(7, 11, generator=torch.Generator().manual_seed(0))  # 77 values: the last block of 16 is padded
codes, scales = absmax_quantize(x, 4, 16)
x_hat = absmax_dequantize(codes, scales, 16, x.shape)
assert x_hat.shape == x.shape, f"shape {tuple(x_hat.shape)}: keep the first 77 values (the padding is dropped)"
step = scales.repeat_interleave(16)[:x.numel()].view_as(x)
assert ((x_hat - x).abs() <= step / 2 + 1e-6).all(), "the error exceeds half a step"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch08_quantization", "test_absmax_dequantize_edge_cases", globals())
### END HIDDEN TESTS

# %% [markdown]
# ### Measure it: why blocks
#
# Language-model weights and activations have a few values far larger than the rest. Plant one
# outlier (50×) in a Gaussian tensor and quantize it to 4 bits with growing blocks.

# %%
g = torch.Generator().manual_seed(0)
normal = torch.randn(64 * 1024, generator=g)
spiky = normal.clone()
spiky[12345] = 50.0


def rel_error(x, x_hat):
    """Relative RMS error ||x - x_hat|| / ||x||."""
    return ((x - x_hat).norm() / x.norm()).item()


def absmax_roundtrip(x, bits, block_size):
    return absmax_dequantize(*absmax_quantize(x, bits, block_size), block_size, x.shape)


for block in (16, 64, 1024, spiky.numel()):
    print(f"4 bits, block {block:>6}: relative error {rel_error(normal, absmax_roundtrip(normal, 4, block)):.3f} "
          f"(Gaussian), {rel_error(spiky, absmax_roundtrip(spiky, 4, block)):.3f} (with one outlier); "
          f"scale overhead {32 / block:.3f} bits per value")

# %% [markdown]
# With one scale for the whole tensor the outlier sets a step so coarse that almost every other
# value rounds to zero (the last line). With blocks of 64, only its own block suffers.
# Smaller blocks also fit each block's own range better, even without outliers, at the cost of
# more scales.
#
# ## 4. NF4: a 4-bit code for normal weights
#
# Uniform integer levels waste codes on a bell-shaped distribution: the tails get as many levels
# as the crowded middle. Pretrained weights are close to zero-mean normal, so QLoRA places the 16
# levels at **quantiles** of $\mathcal N(0, 1)$, making each level about equally likely
# (*NormalFloat*), then divides them by the largest so they span $[-1, 1]$ like $x / \text{absmax}$.
# To have an exact zero (padding, and many weights are near 0), the two halves are built apart,
# with $\Phi^{-1}$ the normal quantile function and $\delta = 1 - \tfrac12(\tfrac1{32} + \tfrac1{30}) = 0.9677083$
# (the extreme quantile; $\Phi^{-1}(1) = \infty$):
#
# - 8 positive levels: $\Phi^{-1}(p)$ for $p$ = the first 8 of 9 points evenly spaced from $\delta$ down to $\tfrac12$;
# - 7 negative levels: $-\Phi^{-1}(p)$ for the first 7 of 8 points evenly spaced from $\delta$ down to $\tfrac12$;
# - and $0$. All 16, sorted and divided by the largest magnitude: the codebook runs from exactly
#   $-1$ to exactly $1$.
#
# `torch.special.ndtri` is $\Phi^{-1}$ (`statistics.NormalDist().inv_cdf` works too).

# %% exercise="nf4_codebook"
def nf4_codebook() -> torch.Tensor:
    """The 16 values of the NF4 data type (Dettmers et al. 2023), computed from normal quantiles.

    Returns:
        float32 tensor of shape (16,), ascending: 7 negative values, 0.0, 8 positive values; the
        first is exactly -1.0 and the last exactly 1.0. Compute them from the quantiles as described
        above: typing in the table teaches nothing (the grader checks the values, not how you got them).

    Graded on: strictly ascending values with the exact -1.0, 0.0 and 1.0, and each level against the
    reference NF4 levels to within 1e-6. No bfloat16 or autocast, as in every exercise cell of this chapter.
    Each graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    delta = 1 - 0.5 * (1 / 32 + 1 / 30)  # 0.9677083: the largest quantile used on each side
    positive = torch.special.ndtri(torch.linspace(delta, 0.5, 9, dtype=torch.float64)[:-1])
    negative = -torch.special.ndtri(torch.linspace(delta, 0.5, 8, dtype=torch.float64)[:-1])
    values = torch.cat([positive, torch.zeros(1, dtype=torch.float64), negative]).sort().values
    return (values / values.abs().max()).float()
    ### END SOLUTION


# %% test="test_nf4_codebook" points=2 checks="nf4_codebook"
cb = nf4_codebook()
assert cb.dtype == torch.float32 and tuple(cb.shape) == (16,), "16 float32 values"
assert (cb[1:] > cb[:-1]).all(), "ascending, all distinct"
assert cb[0] == -1 and cb[-1] == 1 and (cb == 0).sum() == 1, "from exactly -1 to exactly 1, with an exact 0"
assert (cb < 0).sum() == 7 and (cb > 0).sum() == 8, "7 negative levels, 0, 8 positive levels"
assert abs(cb[8].item() - 0.0796) < 1e-3, f"the smallest positive level is about 0.0796, got {cb[8]:.4f}"
print("NF4:", [round(v, 4) for v in cb.tolist()])
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch08_quantization", "test_nf4_codebook", globals())
### END HIDDEN TESTS

# %% [markdown]
# Quantizing to NF4 works per block like absmax: divide by the block's absmax, pick the **nearest**
# of the 16 levels, store its index (0..15, the position in the ascending codebook, so 7 is 0.0).
# Four bits per index, so two indices share a byte: the first value of each pair in the **high**
# nibble, `byte = (code[2k] << 4) | code[2k+1]`. With an odd number of values the last byte's low
# nibble is unused (set it to 0). The absmax of each block stays float32, one per block, so the
# cost is $4 + 32/64 = 4.5$ bits per value with blocks of 64.

# %% exercise="nf4_quantize"
def nf4_quantize(x: torch.Tensor, block_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise NF4 quantization with two 4-bit codes per byte.

    Args:
        x: float tensor of any shape, n elements (flattened row-major; the last block may be partial).
        block_size: values per block (64 in QLoRA).

    Returns:
        packed: ``torch.uint8`` tensor of shape (ceil(n / 2),): byte k holds the code of value 2k in
            its high nibble and that of value 2k + 1 in its low nibble. The code of a value is the index
            (0..15) of the ``nf4_codebook()`` level nearest to value / absmax of its block; all-zero
            blocks get code 7 (the level 0.0).
        absmax: ``torch.float32`` tensor of shape (ceil(n / block_size),): max |x| of each block.

    Graded on float32 tensors of 1 to 3 dimensions with block sizes 7, 16, 32 and 64: absmax must equal
    max |x| exactly, and each code is compared with the nearest level found by brute force in float64. Values:
    even counts that fill whole blocks (32 × 48 weight-like values, heavy-tailed values, 4 × 6 × 8 and 8 × 16
    normal values). Edge cases: odd counts and partial last blocks (37 × 53 weight-like values, 3 × 5 × 7,
    9 × 15, 101 heavy-tailed values), a single value, a tensor with an all-zero block. No bfloat16 or
    autocast, as in every exercise cell of this chapter. Each graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    flat = x.detach().float().flatten()
    n = flat.numel()
    pad = -n % block_size
    blocks = torch.cat([flat, flat.new_zeros(pad)]).view(-1, block_size)  # (n_blocks, block_size)
    absmax = blocks.abs().amax(dim=1)
    scaled = blocks / torch.where(absmax == 0, torch.ones_like(absmax), absmax)[:, None]
    levels = nf4_codebook()
    # Nearest level = how many midpoints between neighbouring levels lie below the value.
    codes = torch.bucketize(scaled.flatten()[:n], (levels[1:] + levels[:-1]) / 2).to(torch.uint8)
    if n % 2:
        codes = torch.cat([codes, codes.new_zeros(1)])
    packed = (codes[0::2] << 4) | codes[1::2]  # first value of each pair in the high nibble
    return packed, absmax
    ### END SOLUTION


# %% test="test_nf4_quantize" points=2 checks="nf4_quantize"
cb = nf4_codebook()
x = torch.tensor([1.0, -1.0, 0.0, 0.5, -0.3, 0.08, 2.0, -0.5])  # 8 values: two whole blocks of 4
packed, absmax = nf4_quantize(x, block_size=4)
assert packed.dtype == torch.uint8 and tuple(packed.shape) == (4,), "two codes per byte: 8 values, 4 uint8"
torch.testing.assert_close(absmax, torch.tensor([1.0, 2.0]), msg="absmax = max |x| of each block of 4")
codes = torch.stack([packed >> 4, packed & 15], dim=1).flatten()
expected = [15, 0, 7, int((cb - 0.5).abs().argmin()), int((cb + 0.15).abs().argmin()),
            int((cb - 0.04).abs().argmin()), 15, int((cb + 0.25).abs().argmin())]
assert codes.tolist() == expected, \
    f"codes (high nibble first) {codes.tolist()}, expected {expected}: nearest level of x / absmax, first value high"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch08_quantization", "test_nf4_quantize", globals())
### END HIDDEN TESTS

# %% test="test_nf4_quantize_edge_cases" points=1 checks="nf4_quantize"
x = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5, -0.3, 1.0])  # 7 values: odd, an all-zero block, a partial block
packed, absmax = nf4_quantize(x, block_size=4)
assert tuple(absmax.shape) == (2,), f"7 values make 2 blocks of 4, the last one partial: absmax {absmax.tolist()}"
assert tuple(packed.shape) == (4,), "ceil(7 / 2) = 4 bytes of uint8"
codes = torch.stack([packed >> 4, packed & 15], dim=1).flatten()[:7]
assert codes[:4].tolist() == [7, 7, 7, 7], f"an all-zero block (absmax 0) gets code 7, the level 0.0: {codes.tolist()}"
assert codes[6] == 15, "the last value, alone in its byte, sits in the high nibble"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch08_quantization", "test_nf4_quantize_edge_cases", globals())
### END HIDDEN TESTS


# %% exercise="nf4_dequantize"
def nf4_dequantize(packed: torch.Tensor, absmax: torch.Tensor, shape, block_size: int = 64) -> torch.Tensor:
    """Undo ``nf4_quantize``: codebook level of each code times its block's absmax.

    With torch operations: the course's ``kernels.ch08_quantization`` is refused by the grader.

    Args:
        packed: ``torch.uint8`` tensor of shape (ceil(n / 2),), high nibble first.
        absmax: float32 tensor of shape (ceil(n / block_size),).
        shape: shape of the original tensor (n elements).
        block_size: values per block.

    Returns:
        float32 tensor of shape ``shape``.

    Graded on random packed bytes (so every code occurs) with positive absmax values, shapes given as tuples.
    Values: even counts that fill whole blocks, shapes (12,), (10, 20), (4, 6, 8) and (32, 48) with block
    sizes 4, 10, 16 and 64. Edge cases: odd counts (the unused low nibble of the last byte may hold anything)
    and partial last blocks, shapes (1,), (7,), (11, 13), (3, 5, 7) and (37, 53), with a 0 for the absmax of
    the first block. bfloat16 and autocast are refused too, as in every exercise cell of this chapter. Each
    graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    n = math.prod(shape)
    codes = torch.stack([packed >> 4, packed & 15], dim=1).flatten()[:n].long()  # high nibble first
    block_of = torch.arange(n) // block_size
    return (nf4_codebook()[codes] * absmax.float()[block_of]).reshape(shape)
    ### END SOLUTION


# %% test="test_nf4_dequantize" points=1 checks="nf4_dequantize"
w = torch.randn(32, 16, generator=torch.Generator().manual_seed(1)) * 0.02  # weight-like: small, normal
packed, absmax = nf4_quantize(w)
w_hat = nf4_dequantize(packed, absmax, w.shape)
assert w_hat.shape == w.shape and w_hat.dtype == torch.float32, "same shape as the original, float32"
levels = set(nf4_codebook().tolist())
assert all(round(v / absmax[0].item(), 5) in {round(l, 5) for l in levels} for v in w_hat.flatten()[:64].tolist()), \
    "each value of the first block is a codebook level times the block's absmax"
print(f"NF4 round trip of a 32x16 weight: relative error {rel_error(w, w_hat):.3f}")
assert rel_error(w, w_hat) < 0.15, "NF4 should keep normal weights within about 10% relative error"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch08_quantization", "test_nf4_dequantize", globals())
### END HIDDEN TESTS

# %% test="test_nf4_dequantize_edge_cases" points=1 checks="nf4_dequantize"
w = torch.randn(33, 17, generator=torch.Generator().manual_seed(1)) * 0.02  # 561 values: odd, last block partial
packed, absmax = nf4_quantize(w)
w_hat = nf4_dequantize(packed, absmax, w.shape)
assert w_hat.shape == w.shape, f"shape {tuple(w_hat.shape)}: keep the first 561 codes, then reshape"
assert rel_error(w, w_hat) < 0.15, "the round trip of an odd-sized weight is as good as any other"
lone = nf4_dequantize(torch.tensor([0xF3], dtype=torch.uint8), torch.tensor([2.0]), (1,))
assert lone.tolist() == [2.0], f"one value: the high nibble (15, the level 1.0) times absmax 2, got {lone.tolist()}"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch08_quantization", "test_nf4_dequantize_edge_cases", globals())
### END HIDDEN TESTS

# %% [markdown]
# ### Your lecture notes vs what we measure: NF4 is a lookup table
#
# The lecture notes list NF4 among the 4-bit floating-point formats. It has no sign, exponent or
# mantissa fields: a code is an index into the 16 values you computed, and decoding is a table
# lookup, `codebook[code] * absmax`. A real 4-bit float decodes its bits arithmetically, like
# section 1: E2M1 (1 sign, 2 exponent, 1 mantissa bit) holds 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
# negatives, evenly spaced within each power of two, the spacing doubling from one power to the
# next. NF4's spacing grows smoothly instead, following the normal distribution's quantiles, and
# no exponent/mantissa split produces it. Both scaled to a largest value of 1:

# %%
e2m1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]) / 6
nf4_positive = nf4_codebook()[7:]  # 0 and the 8 positive levels
for name, levels in (("E2M1 (a 4-bit float)", e2m1), ("NF4 (a lookup table)", nf4_positive)):
    print(f"{name:>21}: levels " + " ".join(f"{v:.3f}" for v in levels.tolist()))
    print(f"{'gaps':>30} " + " ".join(f"{v:.3f}" for v in levels.diff().tolist()))

# %% [markdown]
# Being a table has a cost. Weight-only NF4 stores the weights in 4 bits but computes in float:
# every use of the weight first **dequantizes** it (unpack, look up, multiply by the absmax),
# which reads the 4-bit codes and *writes* a full float32 weight, and only then runs the same
# matmul as before. So NF4 is not faster by itself; it is an extra step in front of the same
# work. Timed on one 1024 × 1024 layer (wall clock on a shared CPU: the minimum of repeated runs,
# and a verdict that says when the repeats are too spread to tell two timings apart):

# %%
from coursekit.timing import compare, time_it

REPEATS = fast(15, 5)
w_layer = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(4)) * 0.02
w_packed, w_absmax = nf4_quantize(w_layer)
timings = {}
for batch in (1, 256):
    x_in = torch.randn(batch, 1024)
    timings["float32 weight", batch] = time_it(lambda: torch.nn.functional.linear(x_in, w_layer), repeats=REPEATS)
    timings["NF4 weight", batch] = time_it(
        lambda: torch.nn.functional.linear(x_in, nf4_dequantize(w_packed, w_absmax, w_layer.shape)), repeats=REPEATS)
dequant_time = time_it(lambda: nf4_dequantize(w_packed, w_absmax, w_layer.shape), repeats=REPEATS)
for batch in (1, 256):
    print(f"batch {batch:>3}: float32 linear {timings['float32 weight', batch]}, NF4 linear "
          f"{timings['NF4 weight', batch]}\n           NF4 / float32: "
          f"{compare(timings['NF4 weight', batch], timings['float32 weight', batch], ('NF4', 'float32'))}")
print(f"the dequantize step alone: {dequant_time}; it reads "
      f"{(w_packed.nbytes + w_absmax.nbytes) / 2 ** 20:.2f} MB and writes {w_layer.nbytes / 2 ** 20:.0f} MB")
for batch in (1, 256):
    print(f"batch {batch:>3}: dequantize step / float32 linear: "
          f"{compare(dequant_time, timings['float32 weight', batch], ('dequantize', 'linear'))}")

# %% [markdown]
# The dequantize step costs the same whatever the batch, so it weighs most when the matmul is
# small (the last two lines: the dequantize step against the float32 linear at each batch size). What NF4
# saves is memory: the stored weight. Speed can come only from a kernel that fuses the lookup
# into the matmul, so that the 4-bit codes are the only bytes read from memory and no
# float32 weight is ever written; that pays off where the matmul waits for memory (small batches on
# a GPU), which is what the Triton kernel of section 8 prepares.

# %% [markdown]
# ## 5. Measure it: the error of each format
#
# Now every format on real numbers: the weights of the pretrained TinyGPT's Linear layers, and
# the activations entering those layers on a batch of its own task (captured with forward
# hooks). The integer and NF4 formats use blocks of 64. Two measures: the relative RMS error of
# the numbers, and what it does to the model, the next-token accuracy on the source task with all
# Linear weights (or all Linear inputs) stored in that format.

# %%
def fake_quant(fmt):
    """x -> the value x has after a round trip through the format ``fmt``."""
    return {"fp16": lambda x: x.half().float(),
            "bf16": lambda x: round_to_bf16(x.float().contiguous()),
            "int8 absmax": lambda x: absmax_roundtrip(x, 8, 64),
            "int4 absmax": lambda x: absmax_roundtrip(x, 4, 64),
            "NF4": lambda x: nf4_dequantize(*nf4_quantize(x), x.shape)}[fmt]


QUANT_FORMATS = ("fp16", "bf16", "int8 absmax", "int4 absmax", "NF4")
source_test = source_task(fast(512, 256), seed=102)
captured = {}
hooks = [pretrained.get_submodule(n).register_forward_pre_hook(
    lambda m, args, n=n: captured.__setitem__(n, args[0].detach().flatten())) for n in LINEARS]
with torch.no_grad():
    pretrained(source_test.x[:64])
for h in hooks:
    h.remove()
activations = torch.cat(list(captured.values()))


def accuracy_with(fmt, what):
    """Source-task accuracy with every Linear weight ("weights") or input ("activations") in ``fmt``."""
    model = load_pretrained("tinygpt_fibonacci")
    q = fake_quant(fmt)
    hooks = []
    for n in LINEARS:
        layer = model.get_submodule(n)
        if what == "weights":
            with torch.no_grad():
                layer.weight.copy_(q(layer.weight))
        else:
            hooks.append(layer.register_forward_pre_hook(lambda m, args: (q(args[0]),)))
    acc = accuracy(model, source_test.x, source_test.y)
    for h in hooks:
        h.remove()
    return acc


base_acc = accuracy(pretrained, source_test.x, source_test.y)
errors = {fmt: {"weights": rel_error(weights, fake_quant(fmt)(weights)),
                "activations": rel_error(activations, fake_quant(fmt)(activations)),
                "acc_w": accuracy_with(fmt, "weights"), "acc_a": accuracy_with(fmt, "activations")}
          for fmt in QUANT_FORMATS}
display(Markdown(f"fp32 model: {base_acc:.1%} source-task accuracy. NF4 vs int4 error: "
                 f"{errors['int4 absmax']['weights'] / errors['NF4']['weights']:.2f}× lower on the weights, "
                 f"{errors['int4 absmax']['activations'] / errors['NF4']['activations']:.2f}× on the activations.\n\n"
                 "| format | rel. error, weights | rel. error, activations | accuracy, weights quantized "
                 "| accuracy, activations quantized |\n|---|---|---|---|---|\n" + "\n".join(
                     f"| {f} | {e['weights']:.2e} | {e['activations']:.2e} | {e['acc_w']:.1%} | {e['acc_a']:.1%} |"
                     for f, e in errors.items())))
display(Markdown(f"int8 with blocks of 64 has {errors['int8 absmax']['weights'] / errors['bf16']['weights']:.1f}× "
                 f"bf16's error on the weights; 4 bits cost {errors['int4 absmax']['weights']:.0%} (int4) and "
                 f"{errors['NF4']['weights']:.0%} (NF4). With all weights in int4 the accuracy is "
                 f"{errors['int4 absmax']['acc_w']:.1%}, in NF4 {errors['NF4']['acc_w']:.1%} (float32: {base_acc:.1%})."))

# %% [markdown]
# The 16-bit formats lose only the digits their mantissas lack: at most half a unit in the last
# place, a relative $2^{-11}$ for fp16 and $2^{-8}$ for bf16, eight times more (on average less).
# The integer formats are coarser, and NF4 beats uniform int4 at the same size on the weights (close
# to normal, as NF4 assumes) and on the activations. And the model? Its accuracy barely moves even
# at 4 bits: it has learned a deterministic rule with large margins between the right token and
# the others, so an error of that size in the weights does not flip its decisions. Larger models trained on harder data have smaller
# margins; that is where the 4-bit formats are told apart by perplexity, as in the QLoRA paper.
#
# ## 6. Bytes per parameter, measured from the stored tensors
#
# A format's cost is what it stores: codes and scales. Here each format stores every Linear weight
# of the model, and we add up `nbytes` of the tensors it keeps. For int4 we pack two codes per byte
# the way NF4 does (the exercise kept one int8 per code for clarity).
#
# QLoRA's **double quantization** shrinks the scales too: the float32 absmax of each block of 64
# is itself quantized to 8 bits in blocks of 256 (after subtracting their mean, since absmax values
# are all positive), leaving one float32 scale per 256 blocks:
#
# $$4 + \frac{8}{64} + \frac{32}{64 \cdot 256} = 4.127 \text{ bits per parameter, instead of } 4 + \frac{32}{64} = 4.5.$$

# %%
def pack_int4(codes):
    """Two signed 4-bit codes per byte, first in the high nibble (for the byte count)."""
    nibbles = (codes.flatten() & 15).to(torch.uint8)
    nibbles = torch.cat([nibbles, nibbles.new_zeros(nibbles.numel() % 2)])
    return (nibbles[0::2] << 4) | nibbles[1::2]


def double_quantize(absmax):
    """QLoRA's double quantization: 8-bit absmax codes in blocks of 256, around their mean."""
    mean = absmax.mean().reshape(1)
    codes, scales = absmax_quantize(absmax - mean, 8, 256)
    return codes, scales, mean


def stored_tensors(fmt, w):
    """The tensors a format keeps for the weight ``w``."""
    if fmt in FORMATS:
        return [w.to(FORMATS[fmt])]
    if fmt == "int8 absmax":
        return list(absmax_quantize(w, 8, 64))
    if fmt == "int4 absmax":
        codes, scales = absmax_quantize(w, 4, 64)
        return [pack_int4(codes), scales]
    packed, absmax = nf4_quantize(w)
    return [packed, absmax] if fmt == "NF4" else [packed, *double_quantize(absmax)]


def bits_per_param(fmt, tensors):
    n = sum(t.numel() for t in tensors)
    return 8 * sum(t.nbytes for w in tensors for t in stored_tensors(fmt, w)) / n


ALL_FORMATS = ("fp32", "fp16", "bf16", "int8 absmax", "int4 absmax", "NF4", "NF4 + double quant.")
model_weights = [pretrained.get_submodule(n).weight.detach() for n in LINEARS]
big = [torch.randn(fast(1024, 256), 1024, generator=torch.Generator().manual_seed(3)) * 0.02]
memory = {fmt: (bits_per_param(fmt, model_weights), bits_per_param(fmt, big)) for fmt in ALL_FORMATS}
packed, absmax = nf4_quantize(big[0])
dq_codes, dq_scales, dq_mean = double_quantize(absmax)
absmax_dq = absmax_dequantize(dq_codes, dq_scales, 256, absmax.shape) + dq_mean
dq_error = rel_error(big[0], nf4_dequantize(packed, absmax_dq, big[0].shape))
display(Markdown("| format | bits / parameter, TinyGPT Linears | bits / parameter, one "
                 f"{big[0].shape[0]}×{big[0].shape[1]} matrix | bytes / parameter |\n|---|---|---|---|\n" + "\n".join(
                     f"| {f} | {a:.3f} | {b:.3f} | {b / 8:.4f} |" for f, (a, b) in memory.items())))
print(f"NF4 error on the large matrix: {rel_error(big[0], nf4_dequantize(packed, absmax, big[0].shape)):.4f} "
      f"with float32 absmax, {dq_error:.4f} with double-quantized absmax")

# %% [markdown]
# The large matrix gives the textbook numbers: 4.5 bits for NF4, 4.127 with double quantization.
# The TinyGPT layers pay a little more for double quantization: their few hundred absmax values do
# not fill the blocks of 256, so padding and the per-tensor scale and mean weigh more. The extra
# error from quantizing the absmax values is negligible next to NF4's own.
#
# ### Play with it: bits vs error
#
# Pick a width for blockwise absmax quantization of the TinyGPT weights. Left: the histogram of the
# errors $\hat w - w$ (NF4's in grey for comparison). Right: relative error against stored bits per
# parameter (packed codes plus one float32 scale per block of 64) for every width, the 16-bit
# formats and NF4.

# %% tags=["demo"]
BITS = range(2, 9)
EDGES = np.linspace(-0.04, 0.04, 101)
# Every width is quantized once, here: a slider move only draws (histogram counts precomputed).
roundtrips = {b: absmax_roundtrip(weights, b, 64) for b in BITS}
curve = {b: rel_error(weights, roundtrips[b]) for b in BITS}
errs = {b: roundtrips[b] - weights for b in BITS}
counts = {b: np.histogram(errs[b].numpy(), EDGES)[0] for b in BITS}
nf4_counts = np.histogram((nf4_dequantize(*nf4_quantize(weights), weights.shape) - weights).numpy(), EDGES)[0]


def draw_bits_error(axes, bits=4):
    ax_hist, ax_curve = axes
    ax_hist.stairs(nf4_counts, EDGES, fill=True, color="#bbbbbb", label="NF4")
    ax_hist.stairs(counts[bits], EDGES, lw=1.5, color="#c44e52", label=f"int{bits} absmax")
    ax_hist.set_yscale("log")
    ax_hist.set_xlabel("quantization error (weight units)")
    ax_hist.set_ylabel("weights (count)")
    kb = (weights.numel() * bits / 8 + 4 * math.ceil(weights.numel() / 64)) / 1024
    ax_hist.set_title(f"{bits} bits: rel. error {curve[bits]:.3f}, max |error| {errs[bits].abs().max():.4f};\n"
                      f"{kb:,.0f} KB instead of {weights.nbytes / 1024:,.0f} KB")
    ax_hist.legend(loc="upper left")
    ax_curve.plot([b + 0.5 for b in BITS], list(curve.values()), "o-", color="#c44e52", label="int absmax")
    ax_curve.plot([bits + 0.5], [curve[bits]], "o", ms=12, mfc="none", color="k")
    for fmt, marker in (("NF4", "s"), ("bf16", "^"), ("fp16", "v")):
        ax_curve.plot([memory[fmt][1]], [errors[fmt]["weights"]], marker, color="#4c72b0", label=fmt)
    ax_curve.set_yscale("log")
    ax_curve.set_xlabel("stored bits per parameter")
    ax_curve.set_ylabel("relative error of the weights")
    ax_curve.legend(loc="upper right")


slider_plot(draw_bits_error, ncols=2, figsize=(11, 4.2), bits=(2, 8, 1), defaults={"bits": 4},
            labels={"bits": lambda v: f"absmax width: {v} bits"},
            explain={"bits": "bits per weight of the integer absmax code (blocks of 64, one float32 scale each)"},
            notice={"bits": lambda bits: f"int{bits}: relative error {curve[bits]:.3f}, "
                                         f"NF4 (4 bits): {errors['NF4']['weights']:.3f}"})

# %%
print("relative error, one bit fewer / one bit more: " + ", ".join(
    f"{b} -> {b + 1} bits {curve[b] / curve[b + 1]:.2f}x" for b in list(BITS)[:-1]))
print(f"NF4 {errors['NF4']['weights']:.4f} at {memory['NF4'][1]:.2f} bits per parameter; int4 absmax "
      f"{curve[4]:.4f} at {4 + 32 / 64:.2f}")

# %% [markdown]
# Each extra bit at least halves the error (the ratios above, close to exactly half at the wider
# widths; a straight line on the log scale), as long as the step, not the clipping, sets it. NF4 sits
# below the 4-bit integer point at the same memory (the second line).
#
# ### Measure it: quality against bits per weight
#
# The pretrained TinyGPT has learned a deterministic rule with wide margins (section 5), so its
# accuracy hides the errors. A model with narrower margins shows what they cost: a classifier of
# sklearn's 8 × 8 handwritten digits, an MLP 64 → 256 → 256 → 10 trained here in a few seconds
# with the recipe of large models (normal initialisation, AdamW with weight decay), which keeps its
# weights close to normal, the distribution NF4 is built for. Every weight matrix goes through
# your functions (blocks of 64): absmax at each width from 2 to 8 bits, and NF4. Bits per weight
# count the codes at their width plus the float32 scales, from the tensors the functions return.

# %%
import torch.nn.functional as F
from sklearn.datasets import load_digits

digits_x, digits_y = (torch.tensor(a) for a in load_digits(return_X_y=True))
digits_x = digits_x.float() / 16  # pixel intensities 0..16 -> 0..1
split = torch.randperm(len(digits_x), generator=torch.Generator().manual_seed(0))
train_idx, test_idx = split[:1200], split[1200:]


def train_digits(seed=0, steps=300):
    """MLP 64-256-256-10, Kaiming-normal weights, AdamW (lr 1e-3, weight decay 0.1), batches of 64."""
    torch.manual_seed(seed)
    layers = []
    for fan_in, fan_out in ((64, 256), (256, 256), (256, 10)):
        layer = nn.Linear(fan_in, fan_out)
        nn.init.normal_(layer.weight, std=math.sqrt(2 / fan_in))
        nn.init.zeros_(layer.bias)
        layers += [layer, nn.ReLU()]
    net = nn.Sequential(*layers[:-1])
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.1)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = train_idx[torch.randint(0, len(train_idx), (64,), generator=g)]
        loss = F.cross_entropy(net(digits_x[idx]), digits_y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return net


classifier = train_digits()
trained_state = {k: v.clone() for k, v in classifier.state_dict().items()}


def absmax_format(bits):
    def roundtrip(w):
        codes, scales = absmax_quantize(w, bits, 64)
        return absmax_dequantize(codes, scales, 64, w.shape), bits * codes.numel() + 8 * scales.nbytes
    return roundtrip


def nf4_format(w):
    packed, absmax = nf4_quantize(w)
    return nf4_dequantize(packed, absmax, w.shape), 8 * (packed.nbytes + absmax.nbytes)


def quality(roundtrip):
    """(bits per weight, test accuracy, test loss) with every weight matrix of the classifier quantized."""
    classifier.load_state_dict(trained_state)
    bits, n = 0, 0
    with torch.no_grad():
        for layer in classifier[::2]:
            w_hat, stored = roundtrip(layer.weight) if roundtrip else (layer.weight.clone(), 32 * layer.weight.numel())
            layer.weight.copy_(w_hat)
            bits, n = bits + stored, n + layer.weight.numel()
        logits = classifier(digits_x[test_idx])
    return bits / n, (logits.argmax(1) == digits_y[test_idx]).float().mean().item(), \
        F.cross_entropy(logits, digits_y[test_idx]).item()


sweep = {"float32": quality(None), **{f"int{b} absmax": quality(absmax_format(b)) for b in range(2, 9)},
         "NF4": quality(nf4_format)}
classifier.load_state_dict(trained_state)
display(Markdown("| weights | bits per weight | test accuracy | test loss |\n|---|---|---|---|\n" + "\n".join(
    f"| {f} | {b:.2f} | {a:.1%} | {l:.4f} |" for f, (b, a, l) in sweep.items())))
fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 3.4))
int_rows = [sweep[f"int{b} absmax"] for b in range(2, 9)]
for ax, col, label in ((ax_acc, 1, "test accuracy"), (ax_loss, 2, "test loss")):
    ax.plot([r[0] for r in int_rows], [r[col] for r in int_rows], "o-", color="#c44e52", label="int absmax, blocks of 64")
    ax.plot([sweep["NF4"][0]], [sweep["NF4"][col]], "s", ms=8, color="#4c72b0", label="NF4")
    ax.axhline(sweep["float32"][col], color="gray", ls=":", label="float32")
    ax.set(xlabel="stored bits per weight", ylabel=label)
    ax.legend(fontsize=8, frameon=False)
ax_loss.set_yscale("log")
fig.tight_layout()
plt.show()
b2, b4, nf, f32 = sweep["int2 absmax"], sweep["int4 absmax"], sweep["NF4"], sweep["float32"]
display(Markdown(
    f"Lower precision degrades quality, and not gradually: at {b2[0]:.1f} bits per weight the classifier drops to "
    f"{b2[1]:.1%} accuracy (float32: {f32[1]:.1%}) and its test loss grows {b2[2] / f32[2]:.1f}×; from 5 bits on, "
    f"the loss stays within {max(abs(sweep[f'int{b} absmax'][2] / f32[2] - 1) for b in range(5, 9)):.0%} of "
    f"float32's. At the same {nf[0]:.1f} bits, NF4 {'beats' if nf[2] < b4[2] else 'does not beat'} int4 absmax: "
    f"test loss {nf[2]:.4f} against {b4[2]:.4f}, a loss increase over float32 "
    f"{(b4[2] - f32[2]) / max(nf[2] - f32[2], 1e-12):.1f}× smaller. The 4-bit gap is small next to what the "
    "narrowest widths cost; on a model this small it depends on the weights (try `train_digits(seed=1)`), and "
    "heavier-tailed weights, where the uniform grid's finer outer levels matter more, can reverse it."))

# %% [markdown]
# ## 7. QLoRA: a frozen 4-bit base plus LoRA
#
# QLoRA fine-tunes a model whose frozen weights are stored in NF4: in every forward pass the
# weight is dequantized to the compute precision, used, and dropped; only the LoRA matrices of
# chapter 1 train, in 16-bit on a GPU (float32 here, on the CPU):
#
# $$y = x\,\mathrm{dequant}(W_0^{NF4})^\top + b + \frac{\alpha}{r}\,(x A^\top) B^\top .$$
#
# The saving is in the frozen weights: 4.5 bits instead of 16 (or 32) per parameter. Gradients and
# optimizer state were already small with LoRA; activations are untouched.
#
# Write `QLoRALinear`. Keep **no** full-precision copy of the weight: not `self.base`, not a
# float buffer, not a cached dequantized weight. Only the packed codes and the absmax values
# stay, and the weight is rebuilt from them in every forward pass.

# %% exercise="QLoRALinear"
class QLoRALinear(nn.Module):
    """A frozen NF4-quantized ``nn.Linear`` plus a trainable LoRA update (Dettmers et al. 2023).

        y = x @ nf4_dequantize(weight_packed, weight_absmax, (out, in), block_size).T + bias
            + (alpha / rank) * (x @ lora_A.T) @ lora_B.T

    Args:
        base: the pretrained ``nn.Linear`` (in_features -> out_features, with or without a bias).
            Do not keep it (nor any float copy of its weight).
        rank: r, a positive int; anything else raises ``ValueError("rank must be a positive integer, got ...")``.
        alpha: the LoRA alpha; ``self.scaling = alpha / rank``.
        block_size: NF4 block size.

    Attributes:
        weight_packed, weight_absmax: buffers, ``nf4_quantize(base.weight, block_size)``.
        bias: the base bias, frozen (``requires_grad=False``), or None.
        lora_A: ``nn.Parameter`` (rank, in_features), ``nn.init.kaiming_uniform_(A, a=math.sqrt(5))``.
        lora_B: ``nn.Parameter`` (out_features, rank), zeros.
        scaling: the float ``alpha / rank``.
        Only lora_A and lora_B require gradients.

    forward(x): x of shape (..., in_features) -> (..., out_features).

    Graded on Linear(37, 53) with and without bias (rank 4 and 3, alpha 8.0 and 1.5, block_size 64 and 32),
    inputs of shape (2, 3, 37) and (5, 37). Values: the trainable parameters, their shapes and initialisation,
    the scaling; with a nonzero lora_B loaded with ``load_state_dict``, the output, the input gradient and the
    gradients of lora_A and lora_B against a float64 reference built on the NF4 weight, no gradient for
    anything else. Errors (a cell of its own): rank 0, -1 and 2.5 raise ValueError, ranks 1 and 4 do not.
    Memory, read from outside your process: on a bias-free Linear whose in and out features are each drawn at
    grading time from 3200 to 3456 (multiples of 128; rank 4, alpha 8.0, blocks of 64), with the base layer
    released, what your process holds may grow after construction by no more than the packed codes and
    absmax, lora_A and lora_B, plus 0.5 MiB of slack; after a forward and backward pass on a (3, in_features)
    input, by no more than that plus the gradients of lora_A and lora_B and another 0.5 MiB (memory kept by
    earlier calls counts against it: before the construction your code may keep at most 0.5 MiB). On that
    pass, with lora_B = 0 and a base weight that NF4 stores exactly (every value a level times its block's
    absmax), the weighted sum of the output and the sum of the input gradient are compared with those of
    x @ base.weight.T. Your exercise cells, once run, must hold next to nothing. bfloat16, autocast and the
    course's kernels.ch08_quantization are refused, as in every exercise cell of this chapter. Each graded
    cell may use 60 s and 4 GiB.
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float, block_size: int = 64):
        super().__init__()
        ### BEGIN SOLUTION
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")
        self.in_features, self.out_features, self.block_size = base.in_features, base.out_features, block_size
        packed, absmax = nf4_quantize(base.weight, block_size)
        self.register_buffer("weight_packed", packed)
        self.register_buffer("weight_absmax", absmax)
        self.bias = None if base.bias is None else nn.Parameter(base.bias.detach().clone(), requires_grad=False)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scaling = alpha / rank
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        ### BEGIN SOLUTION
        # Rebuilt each call and dropped after: only the 4-bit codes live between calls.
        weight = nf4_dequantize(self.weight_packed, self.weight_absmax, (self.out_features, self.in_features),
                                self.block_size)
        y = torch.nn.functional.linear(x, weight, self.bias)
        return y + self.scaling * ((x @ self.lora_A.T) @ self.lora_B.T)
        ### END SOLUTION


# %% test="test_qlora_linear" points=2 checks="QLoRALinear"
torch.manual_seed(0)
base = nn.Linear(40, 24)
W0 = base.weight.detach().clone()
layer = QLoRALinear(base, rank=4, alpha=8.0)
trainable = sorted(n for n, p in layer.named_parameters() if p.requires_grad)
assert trainable == ["lora_A", "lora_B"], f"only lora_A and lora_B train, not {trainable}"
assert tuple(layer.lora_A.shape) == (4, 40) and tuple(layer.lora_B.shape) == (24, 4), "shapes as in LoRALinear"
assert torch.all(layer.lora_B == 0) and layer.scaling == 2.0, "B starts at zero, scaling = alpha / rank"
x = torch.randn(2, 3, 40)
W_nf4 = nf4_dequantize(*nf4_quantize(W0), W0.shape)
torch.testing.assert_close(layer(x), x @ W_nf4.T + base.bias, msg="at initialisation: the NF4 base layer")
layer(x).sum().backward()
assert layer.lora_B.grad is not None, "lora_B gets a gradient"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch08_quantization", "test_qlora_linear", globals())
### END HIDDEN TESTS

# %% test="test_qlora_linear_errors" points=1 checks="QLoRALinear"
try:
    QLoRALinear(nn.Linear(4, 3), rank=0, alpha=1.0)
except ValueError:
    pass
else:
    raise AssertionError("rank=0 should raise ValueError")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch08_quantization", "test_qlora_linear_errors", globals())
### END HIDDEN TESTS

# %% test="test_qlora_linear_memory" points=1 checks="QLoRALinear"
torch.manual_seed(0)
base = nn.Linear(40, 24)
n_weight = base.weight.numel()
layer = QLoRALinear(base, rank=4, alpha=8.0)
layer(torch.randn(2, 3, 40)).sum().backward()
floats = [n for n, t in [*layer.named_parameters(), *layer.named_buffers(), *vars(layer).items()]
          if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() == n_weight]
assert not floats, f"{floats} hold a full-precision copy of the weight: keep only the NF4 codes and absmax"
frozen = sum(t.nbytes for n, t in [*layer.named_parameters(), *layer.named_buffers()] if not n.startswith("lora_"))
assert frozen <= n_weight // 2 + 4 * math.ceil(n_weight / 64) + base.bias.nbytes, \
    f"{frozen} frozen bytes: two codes per byte plus one float32 absmax per block of 64, and the bias"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch08_quantization", "test_qlora_linear_memory", globals())
### END HIDDEN TESTS

# %% [markdown]
# ### Measure it: QLoRA vs LoRA on the shifted task of chapter 1
#
# The setting of chapter 1: the pretrained TinyGPT (Fibonacci mod 16) fine-tuned on the Pell
# recurrence, LoRA on `qkv`, `proj`, `fc1`, `fc2` of both blocks with $\alpha = 8$, Adam at 1e-2,
# batches of 32, the same batches for every run. LoRA keeps the frozen weights in float32; QLoRA
# stores exactly those targeted weights in NF4 (embeddings, LayerNorms and the head stay float32,
# as in QLoRA). The LoRA baseline below is the same update as chapter 1's, written with two
# bias-free `nn.Linear` layers.

# %%
from tqdm.auto import tqdm

from coursekit import measure, model_state_bytes

TARGETS = ("qkv", "proj", "fc1", "fc2")
RANK, ALPHA, BATCH, STEPS = 4, 8.0, 32, fast(80, 20)
target_train = target_task(fast(4000, 512), seed=101)
target_test = target_task(fast(2000, 256), seed=102)


class LoRABaseline(nn.Module):
    """LoRA with a float32 frozen base, as two bias-free Linears: down (in -> r), up (r -> out, zero)."""

    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.down = nn.Linear(base.in_features, rank, bias=False)  # Kaiming-uniform, like A
        self.up = nn.Linear(rank, base.out_features, bias=False)
        nn.init.zeros_(self.up.weight)  # starts as the pretrained layer
        self.alpha_over_rank = alpha / rank

    def forward(self, x):
        return self.base(x) + self.up(self.down(x)) * self.alpha_over_rank


def adapted(kind, rank):
    """The pretrained model, frozen, with the targeted Linears wrapped by LoRA or QLoRA."""
    model = load_pretrained("tinygpt_fibonacci").requires_grad_(False)
    wrap = LoRABaseline if kind == "LoRA" else QLoRALinear
    for name in [n for n in LINEARS if n.endswith(TARGETS)]:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, wrap(model.get_submodule(name), rank, ALPHA))
    return model


def finetune(model, lr=1e-2, seed=0):
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    for x, y in batches(target_train, BATCH, STEPS, seed=seed):
        loss = lm_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model


def stored_bytes(module):
    """Bytes of every parameter and buffer (persistent or not), each storage once."""
    tensors = [*module.parameters(), *module.buffers()]
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


x_batch, y_batch = target_train.x[:BATCH].clone(), target_train.y[:BATCH].clone()
runs = {}
for kind in tqdm(("LoRA", "QLoRA"), desc="fine-tuning"):
    torch.manual_seed(0)
    model = adapted(kind, RANK)
    frozen = [m for m in model.modules() if isinstance(m, (LoRABaseline, QLoRALinear))]
    row = {"acc_before_src": accuracy(model, source_test.x, source_test.y),
           "frozen": sum(stored_bytes(m) - sum(p.nbytes for p in m.parameters() if p.requires_grad) for m in frozen),
           "all": stored_bytes(model), "state": model_state_bytes(model, "adam"),
           "acts": measure(lambda: lm_loss(model(x_batch), y_batch), model).activation_bytes}
    model.zero_grad(set_to_none=True)
    finetune(model)
    row["acc"] = accuracy(model, target_test.x, target_test.y)
    runs[kind] = row

KB = 1024
display(Markdown(
    f"LoRA and QLoRA with rank {RANK}, {STEPS} steps.\n\n"
    "| method | source acc. before | targeted weights + biases | all params + buffers | grads + Adam "
    "| activations | target acc. after |\n|---|---|---|---|---|---|---|\n" + "\n".join(
        f"| {n} | {r['acc_before_src']:.1%} | {r['frozen'] / KB:,.0f} KB | {r['all'] / KB:,.0f} KB "
        f"| {(r['state']['grads'] + r['state']['optimizer_state']) / KB:,.0f} KB | {r['acts'] / KB:,.0f} KB "
        f"| {r['acc']:.1%} |" for n, r in runs.items())))

# %%
lora_run, qlora_run = runs["LoRA"], runs["QLoRA"]
display(Markdown(f"""What the table says:

- **Frozen weights shrink {lora_run['frozen'] / qlora_run['frozen']:.1f}×** (float32 → 4.5 bits is
  {32 / 4.5:.1f}× for the weights alone; the biases stay float32). The whole model shrinks
  {lora_run['all'] / qlora_run['all']:.1f}× because the embeddings, LayerNorms and head stay in float32; in a large
  model the Linear weights are nearly everything.
- **Gradients and Adam state are {'identical' if all(lora_run['state'][k] == qlora_run['state'][k]
  for k in ('grads', 'optimizer_state')) else 'different'}**: the same LoRA matrices train.
- **Activations grow by {(qlora_run['acts'] - lora_run['acts']) / KB:,.0f} KB** with our `QLoRALinear`:
  `F.linear` saves its weight for the input gradient, and the dequantized weight is a fresh tensor, so it counts
  as saved memory during the step: one float32 copy of each targeted weight whose input needs a gradient (all but
  block 0's `qkv`, fed by frozen embeddings). bitsandbytes avoids it with a custom `autograd.Function` that saves
  the 4-bit weight and dequantizes again in backward.
- **Accuracy.** After {STEPS} steps QLoRA reaches {qlora_run['acc']:.1%} on the target task against
  {lora_run['acc']:.1%} for LoRA. {"On this easy task the comparison cannot separate them" if abs(qlora_run['acc']
  - lora_run['acc']) < 0.01 else "Both are still learning at this budget: raise STEPS to see whether the gap closes"};
  the paper's claim is about much harder benchmarks.
- **Compute.** Every forward pass dequantizes every targeted weight again: the extra step timed in section 4, paid
  once per layer and step whatever the batch; on a GPU a fused kernel (below) runs it at memory bandwidth."""))

# %% [markdown]
# ## 8. A Triton kernel for NF4 dequantization
#
# Dequantization reads half a byte and writes four bytes (float32) per value: it is memory bound,
# exactly the kind of elementwise work a fused GPU kernel does at full bandwidth.
# `kernels/ch08_quantization.py` holds one (each program unpacks a block of bytes, looks the codes up
# in the 16-entry codebook and multiplies by the block's absmax). Without a GPU it runs in Triton's
# interpreter, slowly but exactly; `python -m kernels.ch08_quantization` benchmarks it on a GPU.

# %%
from kernels import ch08_quantization as k08

w_fc1 = pretrained.blocks[0].mlp.fc1.weight.detach()
packed, absmax = nf4_quantize(w_fc1)
w_triton = k08.nf4_decode_triton(packed, absmax, nf4_codebook(), w_fc1.shape)
print(f"Triton kernel ({'interpreter' if k08.INTERPRETED else 'GPU'}) vs nf4_dequantize on blocks.0.mlp.fc1: "
      f"max difference {(w_triton - nf4_dequantize(packed, absmax, w_fc1.shape)).abs().max():.1e}")

# %% [markdown]
# ## 9. What the paper reports vs what we measured
#
# Dettmers, Pagnoni, Holtzman and Zettlemoyer, *QLoRA: Efficient Finetuning of Quantized LLMs*
# (NeurIPS 2023). Paper: NF4 with blocks of 64 costs 32/64 = 0.5 bits per parameter for the constants;
# double quantization brings that to 8/64 + 32/(64·256) = 0.127, saving 0.373 bits per parameter
# (§3); NF4 gives lower error than int4/FP4; QLoRA with NF4 and double quantization matches 16-bit
# LoRA and full fine-tuning, and brings the memory to fine-tune a 65B model from more than 780 GB
# to less than 48 GB.

# %%
lora, qlora = runs["LoRA"], runs["QLoRA"]
table = [
    ("NF4 bits per parameter (block 64)", "4.5",
     f"{memory['NF4'][1]:.3f} (large matrix), {memory['NF4'][0]:.3f} (TinyGPT)",
     4.5, memory["NF4"][1]),
    ("NF4 + double quantization", "≈ 4.127", f"{memory['NF4 + double quant.'][1]:.3f} (large matrix), "
     f"{memory['NF4 + double quant.'][0]:.3f} (TinyGPT)", 4.127, memory["NF4 + double quant."][1]),
    ("bits saved by double quantization", "0.373",
     f"{memory['NF4'][1] - memory['NF4 + double quant.'][1]:.3f}", 0.373,
     memory["NF4"][1] - memory["NF4 + double quant."][1]),
    ("weight error, int4 / NF4", "NF4 better than int4 (perplexity)",
     f"{errors['int4 absmax']['weights'] / errors['NF4']['weights']:.2f}× (relative RMS error)", None, None),
    ("test loss at 4.5 bits per weight, int4 / NF4", "NF4 better than int4 (perplexity)",
     f"{sweep['int4 absmax'][2]:.4f} / {sweep['NF4'][2]:.4f} (digits MLP; float32 {sweep['float32'][2]:.4f})",
     None, None),
    ("frozen weights, fp32 / NF4", "32 / 4.5 = 7.1× (32 / 4.127 = 7.8× with double quantization)",
     f"{lora['frozen'] / qlora['frozen']:.2f}× (biases included, no double quantization)", 32 / 4.5,
     lora["frozen"] / qlora["frozen"]),
    ("accuracy, QLoRA − LoRA", "on par (MMLU, Vicuna)",
     f"{100 * (qlora['acc'] - lora['acc']):+.1f} points (r={RANK}, {STEPS} steps)",
     None, None),
]
literature_table(table, source="paper")
plotted = [r for r in table if r[3] is not None]
fig, ax = plt.subplots(figsize=(8, 3.2))
paired_bars(ax, ["NF4 bits", "NF4 + DQ bits", "bits saved\nby DQ", "frozen weights\nfp32 / NF4"],
            [r[3] for r in plotted], [r[4] for r in plotted], fmt="%.3g")
ax.set_ylabel("value")
fig.tight_layout()
plt.show()

# %% [markdown]
# The bit counts are arithmetic and reproduce exactly on a large matrix; on our small layers the
# double-quantization constants are padded to whole blocks of 256, so the saving is smaller. The
# error ranking NF4 < int4 on normal-like weights reproduces. The accuracy row compares QLoRA with
# LoRA after the same short fine-tuning of our small task; the paper's headline, 65B fine-tuned on one 48 GB GPU, is the same 4-bit-per-weight
# arithmetic at a scale where the weights dominate the memory, which at our scale they do not (the
# activations do, as in chapter 1).

# %%
best4 = min(("int4 absmax", "NF4"), key=lambda f: errors[f]["weights"])
display(Markdown(
    "**Measured here.** Relative RMS error on the TinyGPT weights: "
    + ", ".join(f"{f} {e['weights']:.1e}" for f, e in errors.items())
    + f" (best 4-bit format: {best4}). Stored bits per parameter on a large matrix: "
    + ", ".join(f"{f} {b:.3f}" for f, (_, b) in memory.items())
    + f". QLoRA (rank {RANK}) reached {qlora['acc']:.1%} on the target task against {lora['acc']:.1%} for LoRA, with "
    f"{lora['frozen'] / qlora['frozen']:.1f}× smaller frozen weights."))

# %% [markdown]
# ## 10. Summary
#
# - A float is sign × 2^exponent × (1 + mantissa). Exponent bits buy range, mantissa bits precision:
#   fp16 has precision (10 bits, every integer up to 2048) but overflows at 65504; bf16 has fp32's
#   range with 7 bits of mantissa (every integer only up to 256).
# - Round to nearest, ties to even, is one integer addition on the bits; truncation is biased.
#   Keep NaNs out of the carry.
# - Blockwise absmax quantization: one scale per block of 64 keeps outliers local, for 0.5 extra
#   bits per value; each bit halves the error.
# - NF4 places 16 levels at normal quantiles (with an exact zero): lower error than int4 on
#   normal weights at the same 4.5 bits; double quantization brings the cost to ≈ 4.127 bits.
# - NF4 is a 16-entry lookup table, not a float format; weight-only NF4 adds a dequantize step in
#   front of the same matmul, so it saves memory, not time, unless a kernel fuses the two.
# - Lower precision degrades quality, abruptly at the narrowest widths; at the same size, NF4 keeps
#   a model with normal-like weights closer to float32 than int4 absmax.
# - QLoRA stores the frozen base in NF4, dequantizes it on the fly and trains LoRA on top: the
#   frozen weights shrink by about 32 / 4.5 from float32, gradients and optimizer state are LoRA's,
#   and on our task it is compared with LoRA at the same budget (section 7).
