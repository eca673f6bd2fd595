# ---
# jupyter:
#   chapter:
#     title: "ALAM: averaged low-precision activations"
#     imports: [kernels, triton]
#     kernel: kernels.ch13_alam
#     checkpoints: [tinygpt_fibonacci]
#     prose_numbers:  # definitions (precisions, group sizes), arithmetic on them, quoted figures, grading limits
#       - 'stores them in **1 to 8 bits'
#       - 'neighbouring values at 2 bits, 0.5 bit'
#       - 'at an average of 1 to 2 bits'
#       - 'of G * group_size / 4 bytes'
#       - 'two float32 numbers, 64 bits per group: at 2 bits'
#       - '128 cost $2 + 64/128 = 2.5$ bits'
#       - 'group_size * bits / 8 bytes'
#       - 'graded cell may use 60 s and 4 GiB'
#       - 'normal values, quantized 200 times'
#       - 'stores those means at 2 bits'
#       - '(groups of 128 means): 0.5 bit per element, plus 64 bits'
#       - 'Dequantizing repeats each mean 4 times'
#       - 'elements, quantized at 2 bits'
#       - '(the padded codes and 64 bits'
#       - 'of the $M$ means and 64 bits'
#       - 'Returns: An int: 32 * n at 32 bits'
#       - 'at 0.5, the same at 2 bits'
#       - 'Measure it: AQ against 1 bit'
#       - 'the mean of many, at 1 bit, at 2 bits'
#       - 'AQ''s single copy beats 1 bit'
#       - 'the mean of 100 packs at 2 bits'
#       - 'runs under the hooks at 8 bits within 5%'
#       - 'Memory, at 2 bits and at'
#       - 'elements at 2 bits and 12'
#       - 'compressed bytes plus 1 MiB'
#       - '" at 8 bits'
#       - '"a precision of 3 bits'
#       - 'they are, which is why 8 bits saves less than 4 times'
#       - 'the variance, and at 1 bit'
#       - 'itself. AQ, at half of 1 bit'
#       - 'far more accurate than 1 bit'
#       - 'the other tensors at 4 bits'
#       - '$s+1$ ($g_1$) and at 8 bits'
#       - 'at AQ, seed s + 1; at 8 bits'
#       - 'elements, AQ counted as 0.5 bit'
#       - 'with every tensor at 32 bits'
#       - '$b_l$; 2 → AQ saves 1.5 bits'
#       - 'with budgets of 0.4 to 4 bits'
#       - 'average of 2, 1.5 and 1 bits'
#       - 'sensitivity and keep 4 bits'
#       - 'float32, every tensor at 2 bits'
#       - 'allocations at 2 and 1.5 bits'
#       - 'the same average of 2 bits'
#       - 'giving every tensor 2 bits'
#       - 'the activation once, 4 bytes'
#       - 'element, and writes about 0.6 bits'
#       - 'table), and so does 2 bits'
#       - '"allocated, 2 bits'
#       - '""up to 10×'
#       - '""12.5×'
#       - '"x at 2 bits'
#       - 'activations in 1 to 8 bits'
#       - 'the min and scale cost 64 bits'
#       - 'contiguous elements at 2 bits: 0.5 bit'
#       - 'variance, far better than 1 bit'
#       - 'paper reports up to 10×'
#     mentioned:  # names an exercise's text uses that grading does not offer (tests/test_namespace.py)
#       compress_hooks:
#         weight: "weight.t(), an example of a view of a parameter"
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
# # Chapter 13 — ALAM: averaged low-precision activations
#
# Training keeps every activation that the backward pass needs, and for a transformer those saved
# activations, not the weights, fill the memory. Nothing forces us to keep them in 32-bit floats: the
# backward pass only needs them approximately. ALAM (Woo, Lee and Jeon, ICLR 2024) stores them in
# **1 to 8 bits**, and goes below one bit per element with **average quantization (AQ)**: it keeps the
# mean of every 4 neighbouring values at 2 bits, 0.5 bit per element. How many bits each saved tensor
# gets is decided by measuring how much each one's compression disturbs the gradient (**GradNormVar**)
# and spending a bit budget greedily where it hurts most.
#
# **What you will learn**
# - group-wise quantization with per-group minimum and scale, stochastic rounding (why it is
#   unbiased), and how codes are packed several to a byte;
# - average quantization, and why keeping the mean of a group beats 1-bit codes at half the bits;
# - compressing what autograd saves, with a pair of `saved_tensors_hooks` (and leaving the parameters
#   alone);
# - the bias and variance that each precision puts into the gradient, measured on TinyGPT;
# - GradNormVar sensitivity and the greedy bit allocation, and what they buy in a real fine-tuning
#   at an average of 1 to 2 bits;
# - the AQ compression as a Triton kernel.

# %% tags=["setup"]
import math

import torch
import torch.nn.functional as F
from torch import nn

import kernels  # noqa: F401 - before triton: switches on Triton's CPU interpreter when there is no GPU
import triton
import triton.language as tl


def is_parameter(t: torch.Tensor) -> bool:
    """Whether a tensor that autograd saves is a parameter: an ``nn.Parameter`` itself, or a view of one
    (``nn.Linear`` saves ``weight.t()``, a view whose base is the parameter)."""
    return isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter)


def launch_average_quantize(kernel, x: torch.Tensor, noise: torch.Tensor, average: int = 4, group_size: int = 128):
    """Run the AQ ``kernel`` of section 7 on ``x`` (any shape, n elements) with ``noise`` (M = ceil(n / average)
    values in [0, 1)); returns (codes uint8 of G * group_size / 4 bytes, mins float32 (G,), scales float32 (G,)),
    G = ceil(M / group_size).

    One program per group of ``group_size`` means. The kernel gets the flattened float32 input and noise, the
    three outputs to fill, n and M, and AVERAGE and GROUP as compile-time constants."""
    flat = x.detach().reshape(-1).to(torch.float32).contiguous()
    n = flat.numel()
    if n == 0:
        raise ValueError("x is empty")
    m = -(-n // average)
    if noise.numel() != m:
        raise ValueError(f"noise must hold ceil(n / {average}) = {m} values, got {noise.numel()}")
    u = noise.detach().reshape(-1).to(torch.float32).contiguous()
    groups = -(-m // group_size)
    codes = torch.empty(groups * group_size // 4, dtype=torch.uint8)
    mins = torch.empty(groups, dtype=torch.float32)
    scales = torch.empty(groups, dtype=torch.float32)
    kernel[(groups,)](flat, u, codes, mins, scales, n, m, AVERAGE=average, GROUP=group_size)
    return codes, mins, scales


# %% [markdown]
# ## 1. Saved activations in few bits
#
# Flatten a saved tensor to $n$ numbers and cut it into **groups** of $G_s$ consecutive elements
# (ALAM uses groups of 128; the last group may be partial). In group $g$, with its minimum $m_g$ and
# maximum $M_g$, a $b$-bit code is
#
# $$s_g = \frac{2^b - 1}{M_g - m_g + 2\cdot10^{-6}}, \qquad q = \big\lfloor (x - m_g)\, s_g + u \big\rfloor \in \{0, \dots, 2^b-1\},
# \qquad \hat x = q / s_g + m_g,$$
#
# with $u$ uniform in $[0, 1)$, a fresh draw for every element: **stochastic rounding**. A value that
# lies a fraction $f$ of the way between two levels is rounded up with probability $f$, so
# $\mathbb{E}[\hat x] = x$: the error is pure noise, no bias, and noise averages out over the many
# steps of training. Rounding to the nearest level instead ($u = 0.5$ always) is biased: the same
# value is pushed the same way at every step. The 2e-6 keeps the scale finite when a group is constant.
# The authors write the same rule as $\mathrm{round}(\max((x - m_g) s_g + u - 0.5, 0))$; we take the
# noise $u$ as an argument, so that the results are exact and testable.
#
# A code of $b$ bits does not fill a byte: we **pack** $8/b$ codes per byte, neighbours together,
# the first in the least significant bits. Each group also stores $m_g$ and $s_g$, two float32 numbers,
# 64 bits per group: at 2 bits, groups of 128 cost $2 + 64/128 = 2.5$ bits per element. Every byte
# count in this chapter includes them.

# %% [markdown]
# ### Exercise: `group_quantize` and `group_dequantize`
#
# The layout is fixed, so that your codes can be checked byte for byte (and so that the course's
# kernel, `kernels.ch13_alam`, produces the same): flatten `x` row-major to $n$ elements, work in
# float32, $G = \lceil n / G_s \rceil$ groups; positions $n$ to $G \cdot G_s - 1$ (the padding of the last
# group) hold code 0 and do not count in its minimum and maximum. With $k = 8 / b$ codes per byte, byte
# $j$ holds the codes of positions $jk, \dots, jk + k - 1$, position $jk + i$ in bits
# $[ib, (i+1)b)$. Codes are compared exactly except where $(x - m_g)s_g + u$ lies within 1e-3 of an
# integer, where float rounding may move it by one either way.

# %% exercise="group_quantize"
def group_quantize(x, bits, noise, group_size=128):
    """Quantize ``x`` to ``bits``-bit codes per group, with stochastic rounding driven by ``noise``.

    Args:
        x: a floating-point tensor of any shape, n >= 1 elements (flattened row-major, converted to float32).
        bits: 1, 2, 4 or 8.
        noise: a tensor of x's shape, values in [0, 1): u of each element.
        group_size: elements per group, a positive multiple of 8 / bits (so that groups fill whole bytes).

    Returns:
        (codes, mins, scales): ``codes`` a flat torch.uint8 tensor of G * group_size * bits / 8 bytes,
        G = ceil(n / group_size), packed 8 / bits codes per byte, adjacent positions, least significant bits
        first (byte j holds positions j*k .. j*k + k - 1, k = 8 / bits, position j*k + i in bits
        [i*bits, (i+1)*bits)); the padding positions n .. G*group_size - 1 hold code 0. ``mins`` and ``scales``
        float32 of shape (G,): the minimum over the group's real elements and
        scale = (2**bits - 1) / (max - min + 2e-6), in float32. The code of an element is
        floor((x - min) * scale + u), clamped to [0, 2**bits - 1].

    Raises:
        ValueError: bits not in {1, 2, 4, 8}; group_size not a positive multiple of 8 / bits; noise of another
        shape than x; an empty x.

    Graded on, one cell per property: values: every bits at group sizes 128, 32 and the smallest, 8 / bits, on
    shapes (37, 53), (3, 5, 7), (256,), (2, 1, 130), a float64 and a bfloat16 input, one shape (2-D, up to
    64 × 64) with values drawn at grading time, one flat tensor of 2^20 to 2^21 elements (size and bits drawn
    at grading time), constant groups (finite, no NaN), a single element and one partial group, against the layout above (codes exactly, except within 1e-3 of an integer; mins and scales
    to float32 rounding; dtypes and shapes); errors: the ValueErrors above. Each graded cell may use 60 s and
    4 GiB.
    """
    ### BEGIN SOLUTION
    if bits not in (1, 2, 4, 8) or isinstance(bits, bool):
        raise ValueError(f"bits must be 1, 2, 4 or 8, got {bits!r}")
    per_byte = 8 // bits
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0 \
            or group_size % per_byte:
        raise ValueError(f"group_size must be a positive multiple of {per_byte} at {bits} bits, got {group_size!r}")
    if tuple(noise.shape) != tuple(x.shape):
        raise ValueError(f"noise must have x's shape {tuple(x.shape)}, got {tuple(noise.shape)}")
    n = x.numel()
    if n == 0:
        raise ValueError("x is empty: nothing to quantize")
    flat = x.detach().reshape(-1).to(torch.float32)
    u = noise.detach().reshape(-1).to(torch.float32)
    groups = -(-n // group_size)
    pad = groups * group_size - n
    if pad:  # repeat the last element: the padding changes no group's min or max
        flat = torch.cat([flat, flat[-1:].expand(pad)])
        u = F.pad(u, (0, pad))
    table = flat.view(groups, group_size)
    mins, maxs = table.aminmax(dim=1)
    scales = (2 ** bits - 1) / (maxs - mins + 2e-6)
    q = torch.floor((table - mins[:, None]) * scales[:, None] + u.view(groups, group_size))
    q = q.clamp(0, 2 ** bits - 1).to(torch.uint8).reshape(-1)
    q[n:] = 0
    q = q.view(-1, per_byte)
    codes = q[:, 0].clone()
    for i in range(1, per_byte):  # position j*k + i goes to bits [i*bits, (i+1)*bits)
        codes |= q[:, i] << (i * bits)
    return codes, mins, scales
    ### END SOLUTION


# %% test="test_group_quantize" points=2 checks="group_quantize"
x = torch.tensor([0.0, 1.0, 2.0, 3.0, 0.5, 2.5])
codes, mins, scales = group_quantize(x, 2, torch.zeros(6), group_size=4)
assert codes.dtype == torch.uint8 and codes.shape == (2,), "6 elements, groups of 4: 8 positions, 4 codes per byte"
assert torch.equal(mins, torch.tensor([0.0, 0.5])), "each group's own minimum"
# group 0: codes 0, 0, 1, 2 (floor of 0, 0.99..., 1.99..., 2.99...) -> 0 | 0 << 2 | 1 << 4 | 2 << 6
assert codes[0] == 0 + (0 << 2) + (1 << 4) + (2 << 6), f"byte 0 is {codes[0]}: least significant bits first"
assert codes[1] == 0 + (2 << 2), "group 1: codes 0 and 2, then two padding positions holding 0"
codes, mins, scales = group_quantize(torch.full((5, 3), 2.0), 4, torch.rand(5, 3), group_size=8)
assert torch.isfinite(scales).all() and torch.equal(mins, torch.full((2,), 2.0)), "a constant group: finite scale"
assert codes.eq(0).all(), "a constant group codes every element as 0 (x - min = 0, noise < 1)"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch13_alam", "test_group_quantize", globals())
### END HIDDEN TESTS

# %% test="test_group_quantize_errors" points=1 checks="group_quantize"
for bad in (3, 16):
    try:
        group_quantize(torch.randn(8), bad, torch.rand(8))
    except ValueError:
        pass
    else:
        raise AssertionError(f"bits={bad} should raise ValueError")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch13_alam", "test_group_quantize_errors", globals())
### END HIDDEN TESTS


# %% exercise="group_dequantize"
def group_dequantize(codes, mins, scales, bits, shape, group_size=128):
    """Undo ``group_quantize``'s packing: x_hat = q / scale + min for every real position.

    Args:
        codes, mins, scales: what ``group_quantize(x, bits, noise, group_size)`` returned for an x of ``shape``.
        bits: 1, 2, 4 or 8; shape: x's shape (a tuple or torch.Size); group_size: as given to group_quantize.

    Returns:
        A float32 tensor of ``shape``: element p (row-major) is q_p / scales[g] + mins[g], g = p // group_size,
        q_p the code at position p of the layout.

    Graded on: the codes, mins and scales of the layout (made by the grader) for every bits, group sizes 128,
    32 and 8 / bits, the shapes group_quantize is graded on, compared with q / scale + min to float32 rounding
    (dtype float32, the shape). Each graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    per_byte = 8 // bits
    n = math.prod(shape)
    q = torch.stack([(codes >> (i * bits)) & (2 ** bits - 1) for i in range(per_byte)], dim=1)
    q = q.reshape(-1, group_size).to(torch.float32)
    return (q / scales[:, None] + mins[:, None]).reshape(-1)[:n].reshape(tuple(shape))
    ### END SOLUTION


# %% test="test_group_dequantize" points=1 checks="group_dequantize"
x = torch.randn(37, 53)
codes, mins, scales = group_quantize(x, 8, torch.rand(37, 53))
x_hat = group_dequantize(codes, mins, scales, 8, x.shape)
assert x_hat.shape == x.shape and x_hat.dtype == torch.float32
step = (1 / scales).repeat_interleave(128)[:x.numel()].view(37, 53)
assert ((x_hat - x).abs() <= step + 1e-6).all(), "every element within one step (1 / scale) of x"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch13_alam", "test_group_dequantize", globals())
### END HIDDEN TESTS

# %% [markdown]
# ### Measure it: error and bias of stochastic rounding
#
# One tensor of 64 × 256 normal values, quantized 200 times with fresh noise at each precision: the
# error of one quantization (root mean square, relative to the tensor's) and the error of the
# **average** of the 200 dequantized copies. Stochastic rounding's average converges to $x$; rounding
# to nearest (noise fixed at 0.5) does not move from one run to the next, so its average keeps the
# whole error. The table also gives the bits per element, overhead included.

# %%
import time

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display
from tqdm.auto import tqdm

from coursekit import fast, measure
from coursekit.checkpoints import load_pretrained
from coursekit.data import batches, target_task
from coursekit.report import literature_table, paired_bars
from coursekit.transformer import accuracy, lm_loss
from coursekit.widgets import slider_plot

torch.manual_seed(0)
sample = torch.randn(64, 256)
REPEATS = fast(200, 20)


def rms(t):
    return float(t.pow(2).mean().sqrt())


rows = ["| bits | bits/element (overhead included) | error of one copy | error of the mean of copies, stochastic | same, round to nearest |",
        "|---|---|---|---|---|"]
for b in (8, 4, 2, 1):
    copies = [group_dequantize(*group_quantize(sample, b, torch.rand(sample.shape)), b, sample.shape)
              for _ in range(REPEATS)]
    nearest = group_dequantize(*group_quantize(sample, b, torch.full(sample.shape, 0.5)), b, sample.shape)
    mean = torch.stack(copies).mean(0)
    rows.append(f"| {b} | {b + 64 / 128:.2f} | {rms(copies[0] - sample) / rms(sample):.3f} | "
                f"{rms(mean - sample) / rms(sample):.4f} | {rms(nearest - sample) / rms(sample):.3f} |")
display(Markdown("\n".join(rows)))

# %% [markdown]
# Each bit removed doubles the step, so the error of one copy roughly doubles per bit. Averaging many
# stochastic copies drives the error towards zero (it falls like one over the square root of the
# number of copies); the rounded-to-nearest copy keeps its error forever. Training averages gradients
# over many steps, which is why stochastic rounding is the one to use.
#
# ## 2. Average quantization: below one bit
#
# One bit per element is a coarse answer: each group keeps only "above or below the middle". ALAM's
# observation is that the backward pass mostly needs the **local average** of an activation, not its
# detail. AQ replaces every run of 4 contiguous flattened elements by their mean (a remainder of
# $n \bmod 4$ elements gives one more mean, over those elements), so $M = \lceil n / 4\rceil$ means, and
# stores those means at 2 bits with `group_quantize` (groups of 128 means): 0.5 bit per element, plus
# 64 bits per group of 128 means. Dequantizing repeats each mean 4 times. Among all approximations that
# are constant on each run, the mean is the one with the least squared error, and its stochastic
# 2-bit code is unbiased for the mean: what AQ loses is the detail inside the run, a **bias** that no
# averaging over steps removes, but small.
#
# The runs are *contiguous in memory*: the last dimension of an activation (features) is averaged,
# never across tokens or examples.

# %% exercise="average_quantize"
def average_quantize(x, noise, average=4, group_size=128):
    """Average quantization: means of runs of ``average`` contiguous elements, quantized at 2 bits.

    Args:
        x: a floating-point tensor of any shape, n >= 1 elements, flattened row-major (float32).
        noise: a tensor of shape (M,), M = ceil(n / average), values in [0, 1): u of each mean.
        average: a positive int, the run length; group_size: as in group_quantize (a positive multiple of 4).

    Returns:
        (codes, mins, scales) = group_quantize(means, 2, noise, group_size), where means (float32, shape (M,))
        holds the mean of elements [i*average, (i+1)*average) for i < n // average and, when n is not a multiple
        of average, one last mean over the n % average remaining elements.

    Raises:
        ValueError: noise not of shape (M,); average not a positive int (and group_quantize's own errors).

    Graded on, one cell per property: values on shapes (37, 53), (3, 5, 7), (2, 6), (4, 128), a float64 input
    and one shape (2-D, up to 64 × 64) with values drawn at grading time, one flat tensor of 2^20 to 2^21
    elements with a remainder (n % 4 != 0, drawn at grading time), at average 4 and 3 and group sizes 128
    and 32, against the definition (codes exactly, except within 1e-3 of an integer; mins and scales to
    float32 rounding); errors: the ValueErrors above. Each graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    if isinstance(average, bool) or not isinstance(average, int) or average <= 0:
        raise ValueError(f"average must be a positive int, got {average!r}")
    flat = x.detach().reshape(-1).to(torch.float32)
    n = flat.numel()
    m = -(-n // average)
    if tuple(noise.shape) != (m,):
        raise ValueError(f"noise must have shape ({m},): one value per mean, got {tuple(noise.shape)}")
    whole = n // average
    means = flat[:whole * average].view(whole, average).mean(dim=1)
    if m > whole:  # the remainder's own mean
        means = torch.cat([means, flat[whole * average:].mean().view(1)])
    return group_quantize(means, 2, noise, group_size)
    ### END SOLUTION


# %% test="test_average_quantize" points=2 checks="average_quantize"
x = torch.tensor([1.0, 2.0, 3.0, 6.0, 10.0, 20.0])  # means 3 and 15 (the remainder of 2 elements)
codes, mins, scales = average_quantize(x, torch.zeros(2))
assert torch.equal(mins, torch.tensor([3.0])), "the minimum of the means: 3"
assert codes.shape == (32,) and codes[0] == 0 + (2 << 2), "means 3 and 15 -> codes 0 and 2 (floor(2.99...))"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch13_alam", "test_average_quantize", globals())
### END HIDDEN TESTS

# %% test="test_average_quantize_errors" points=1 checks="average_quantize"
try:
    average_quantize(torch.randn(10), torch.rand(10))
except ValueError:
    print("visible checks passed")
else:
    raise AssertionError("noise of shape (10,) for 10 elements (3 means) should raise ValueError")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch13_alam", "test_average_quantize_errors", globals())
### END HIDDEN TESTS


# %% exercise="average_dequantize"
def average_dequantize(codes, mins, scales, shape, average=4, group_size=128):
    """Undo ``average_quantize``: dequantize the M means, repeat each ``average`` times, keep the first n.

    Args:
        codes, mins, scales: what ``average_quantize(x, noise, average, group_size)`` returned for an x of
        ``shape``; average, group_size: as given to it.

    Returns:
        A float32 tensor of ``shape``: element p (row-major) is mean p // average, dequantized
        (q / scale + min of its group of means).

    Graded on: the grader's codes of the shapes average_quantize is graded on, at average 4 and 3, compared
    with the repeated dequantized means to float32 rounding (dtype float32, the shape). Each graded cell may
    use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    n = math.prod(shape)
    means = group_dequantize(codes, mins, scales, 2, (-(-n // average),), group_size)
    return means.repeat_interleave(average)[:n].reshape(tuple(shape))
    ### END SOLUTION


# %% test="test_average_dequantize" points=1 checks="average_dequantize"
x = torch.randn(3, 5, 7)
x_hat = average_dequantize(*average_quantize(x, torch.rand(27)), x.shape)
assert x_hat.shape == x.shape and x_hat.dtype == torch.float32
assert torch.equal(x_hat.reshape(-1)[:104].view(26, 4), x_hat.reshape(-1)[:104].view(26, 4)[:, :1].expand(26, 4)), \
    "each mean is repeated over its run of 4"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch13_alam", "test_average_dequantize", globals())
### END HIDDEN TESTS

# %% [markdown]
# ### Exercise: count the bits
#
# A memory budget is spent in bits, and the overhead is part of it. Write the number of bits stored for
# a tensor of $n$ elements at each precision: 32 (the float32 tensor as is), $b \in \{1, 2, 4, 8\}$ (the
# padded codes and 64 bits per group) and AQ, which this chapter writes as `0.5` (the padded 2-bit
# codes of the $M$ means and 64 bits per group of means).

# %% exercise="compressed_bits"
def compressed_bits(n, bits, group_size=128, average=4):
    """Bits stored for a tensor of ``n`` elements compressed at ``bits``, overhead included.

    Args:
        n: a positive int; bits: 32, 8, 4, 2, 1 or 0.5 (AQ); group_size, average: positive ints, as in
        group_quantize and average_quantize.

    Returns:
        An int: 32 * n at 32 bits; at b in {1, 2, 4, 8}, G * group_size * b + 64 * G with G = ceil(n / group_size)
        (the padded codes, and a float32 min and scale per group); at 0.5, the same at 2 bits for the
        M = ceil(n / average) means: ceil(M / group_size) * (group_size * 2 + 64).

    Raises:
        ValueError: n or group_size or average not a positive int; bits not one of the six.

    Graded on, one cell per property: values for n = 1, 127, 128, 129, 1000, 2053 and 10**6 at every bits,
    group sizes 128 and 64, average 4 and 3, and one n drawn at grading time; errors: the ValueErrors above.
    Each graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    for name, value in (("n", n), ("group_size", group_size), ("average", average)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if bits not in (32, 8, 4, 2, 1, 0.5) or isinstance(bits, bool):
        raise ValueError(f"bits must be 32, 8, 4, 2, 1 or 0.5 (AQ), got {bits!r}")
    if bits == 32:
        return 32 * n
    if bits == 0.5:
        n, bits = -(-n // average), 2
    groups = -(-n // group_size)
    return groups * (group_size * int(bits) + 64)
    ### END SOLUTION


# %% test="test_compressed_bits" points=1 checks="compressed_bits"
assert compressed_bits(1000, 32) == 32_000
assert compressed_bits(1000, 2) == 8 * (128 * 2 + 64), "8 groups: padded codes plus min and scale"
assert compressed_bits(1000, 0.5) == 2 * (128 * 2 + 64), "250 means: 2 groups"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch13_alam", "test_compressed_bits", globals())
### END HIDDEN TESTS

# %% test="test_compressed_bits_errors" points=1 checks="compressed_bits"
try:
    compressed_bits(1000, 3)
except ValueError:
    print("visible checks passed")
else:
    raise AssertionError("bits=3 should raise ValueError")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch13_alam", "test_compressed_bits_errors", globals())
### END HIDDEN TESTS

# %% [markdown]
# ### Measure it: AQ against 1 bit on the same tensor
#
# A smooth activation (a random walk along its last dimension, like a feature map) and an
# unstructured one (independent normal values): the relative error of one compressed copy and of the
# mean of many, at 1 bit, at 2 bits and with AQ, with the bits per element each costs.

# %%
walk = torch.randn(64, 256).cumsum(dim=1) / 16
noise_like = torch.randn(64, 256)
rows = ["| tensor | scheme | bits/element | error of one copy | error of the mean of copies |", "|---|---|---|---|---|"]
for label, t in (("smooth (random walk)", walk), ("unstructured (normal)", noise_like)):
    for name, b in (("1-bit", 1), ("2-bit", 2), ("AQ", 0.5)):
        if b == 0.5:
            copies = [average_dequantize(*average_quantize(t, torch.rand(t.numel() // 4)), t.shape)
                      for _ in range(REPEATS)]
        else:
            copies = [group_dequantize(*group_quantize(t, b, torch.rand(t.shape)), b, t.shape) for _ in range(REPEATS)]
        mean = torch.stack(copies).mean(0)
        rows.append(f"| {label} | {name} | {compressed_bits(t.numel(), b) / t.numel():.3f} | "
                    f"{rms(copies[0] - t) / rms(t):.3f} | {rms(mean - t) / rms(t):.3f} |")
display(Markdown("\n".join(rows)))

# %% [markdown]
# On the smooth tensor AQ's single copy beats 1 bit at half the bits, and its averaged copy keeps an
# error that does not shrink: the bias of losing the detail inside each run. On unstructured values the
# mean of 4 says little about each of them, and AQ's bias is large. Activations of a trained network
# sit in between; the gradient, measured in section 4, is what decides.
#
# ## 3. Compressing what autograd saves
#
# Autograd's saved-tensor hooks (the context manager saved_tensors_hooks of torch.autograd.graph, which
# the test cells and the measurements use; exercise cells may not) take a pair of functions: autograd runs
# pack(t) on every tensor it saves for backward, keeps whatever pack returns instead of t, and hands
# that to unpack when backward needs t. That is the whole mechanism of activation compression. ALAM compresses only floating-point
# tensors that require grad and are not parameters: the weights are kept (they are model state, in memory
# anyway), and so are integer tensors and tensors that do not require grad (a dropout mask, the input
# tokens, a LayerNorm's statistics).

# %% exercise="compress_hooks"
def compress_hooks(bits_per_tensor, seed=0):
    """A (pack, unpack) pair of saved-tensor hooks compressing activations at given precisions.

    Args:
        bits_per_tensor: a non-empty sequence (list or tuple) of precisions, each 32, 8, 4, 2, 1 or 0.5 (AQ).
        seed: an int; the noise of stochastic rounding comes from a torch.Generator owned by this pair,
            seeded with ``seed``: two pairs made with the same seed compress the same tensors identically.

    Returns:
        (pack, unpack), two functions for autograd's saved-tensor hooks (or for the pack= and unpack= of
        coursekit's measure).

        pack(t): a tensor t is *compressed* when it is floating point, requires grad and is not a parameter
        (``is_parameter(t)``, from the setup cell, is False); any other tensor is returned as it is (the very
        object) and is not counted. The l-th compressed tensor that pack sees (l = 0, 1, 2, ... in the order
        of the calls) gets b = bits_per_tensor[l % len(bits_per_tensor)], so one pair can serve step after
        step of a model that saves len(bits_per_tensor) such tensors per forward. At b = 32 pack returns t
        itself. At b in {1, 2, 4, 8} it calls group_quantize(t, b, noise, 128), at 0.5
        average_quantize(t, noise) (average 4, groups of 128), with noise = torch.rand(shape, generator=g)
        drawn from the pair's generator (shape t's, or (M,) for AQ; the pair draws nothing from torch's
        global generator), and returns a tuple of the three tensors codes, mins, scales and plain Python
        values (shape, dtype, b, ...): no other tensor. Tuples, lists and dicts may nest; the plain values
        are int, float, str, bool, None, torch.dtype and torch.Size; each tensor's storage is exactly its
        size (not a view into a larger storage). Any other object in the packed value fails the cell.
        unpack(packed): the tensor pack was given (as is) or the dequantized one, with t's shape and dtype.

    Raises:
        ValueError: an empty bits_per_tensor, or an entry that is not one of the six precisions.

    Graded on, one cell per property. Values: pack on sequences of tensors (shapes (37, 53), (3, 5, 7),
    (300,), float32 and float64, requiring grad, with parameters, views of parameters (``weight.t()``), int
    tensors and tensors that do not require grad among them) at bits_per_tensor (8, 4, 2, 1, 0.5, 32) and
    going round it twice: the bytes of the storages of the tensors each packed value holds (codes + mins +
    scales, exactly ``compressed_bits / 8``), parameters and the rest returned as the very object, unpack's
    dtype and shape, every element within one step (1 / scale) of the tensor (of its run's mean for AQ), the
    mean of 100 packs at 2 bits close to the tensor (shape (4, 64) and one flat size of 8192 to 32768
    elements drawn at grading time: stochastic rounding), two pairs with the same seed packing in turns and
    agreeing, torch's global generator unchanged by making pairs and packing; the gradients of a small
    model whose forward runs under the hooks at 8 bits within 5% of the exact ones. Memory, at 2 bits and at
    one precision drawn at grading time from 8, 4, 1 and 0.5: one float32 tensor that requires grad, of
    28 × 2^20 to 32 × 2^20 elements at 2 bits and 12 × 2^20 to 15 × 2^20 at the other, sizes drawn at
    grading time, packed as a pair's second compressed tensor
    (after one of shape (5, 300)): while the packed value lives (the tensor released), the process may hold
    at most its compressed bytes plus 1 MiB more than before (read from outside it), and unpack gives back,
    at 2048 entries drawn at grading time, the dequantized values of that pack with the pair's noise (q /
    scale + min to float32 rounding; a code may differ by one only within 1e-3 of a rounding boundary).
    Errors: the ValueErrors above. Each graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    if isinstance(bits_per_tensor, (str, bytes)) or len(bits_per_tensor) == 0:
        raise ValueError("bits_per_tensor must be a non-empty sequence of precisions")
    precisions = list(bits_per_tensor)
    for b in precisions:
        if isinstance(b, bool) or b not in (32, 8, 4, 2, 1, 0.5):
            raise ValueError(f"every precision must be 32, 8, 4, 2, 1 or 0.5 (AQ), got {b!r}")
    generator = torch.Generator().manual_seed(int(seed))
    seen = [0]  # compressed tensors packed so far

    def pack(t):
        if not t.is_floating_point() or not t.requires_grad or is_parameter(t):
            return t
        b = precisions[seen[0] % len(precisions)]
        seen[0] += 1
        if b == 32:
            return t
        if b == 0.5:
            noise = torch.rand(-(-t.numel() // 4), generator=generator)
            return ("aq", average_quantize(t, noise), tuple(t.shape), t.dtype)
        noise = torch.rand(tuple(t.shape), generator=generator)
        return (b, group_quantize(t, b, noise), tuple(t.shape), t.dtype)

    def unpack(packed):
        if isinstance(packed, torch.Tensor):
            return packed
        b, (codes, mins, scales), shape, dtype = packed
        if b == "aq":
            return average_dequantize(codes, mins, scales, shape).to(dtype)
        return group_dequantize(codes, mins, scales, b, shape).to(dtype)

    return pack, unpack
    ### END SOLUTION


# %% test="test_compress_hooks" points=2 checks="compress_hooks"
torch.manual_seed(0)
layer = nn.Linear(64, 32)
x = torch.randn(16, 64, requires_grad=True)
exact = torch.autograd.grad(layer(x).tanh().pow(2).sum(), (x, layer.weight))
pack, unpack = compress_hooks([8], seed=0)
with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
    y = layer(x).tanh().pow(2).sum()
approx = torch.autograd.grad(y, (x, layer.weight))
for name, a, e in zip(("x", "weight"), approx, exact):
    assert (a - e).norm() < 0.05 * e.norm(), f"the gradient of {name} at 8 bits is far from the exact one"
assert pack(layer.weight) is layer.weight, "a parameter is returned as it is"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch13_alam", "test_compress_hooks", globals())
### END HIDDEN TESTS

# %% test="test_compress_hooks_memory" points=1 checks="compress_hooks"
t = torch.randn(1000, 256, requires_grad=True).add(0)
packed = compress_hooks([2])[0](t)


def tensors_in(obj):
    if isinstance(obj, torch.Tensor):
        return [obj]
    return [v for item in obj for v in tensors_in(item)] if isinstance(obj, (tuple, list)) else []


stored = sum(v.numel() * v.element_size() for v in tensors_in(packed))
assert stored == compressed_bits(t.numel(), 2) // 8, f"pack holds {stored} bytes: codes, mins and scales only"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch13_alam", "test_compress_hooks_memory", globals())
### END HIDDEN TESTS

# %% test="test_compress_hooks_errors" points=1 checks="compress_hooks"
try:
    compress_hooks([8, 3])
except ValueError:
    print("visible checks passed")
else:
    raise AssertionError("a precision of 3 bits should raise ValueError")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch13_alam", "test_compress_hooks_errors", globals())
### END HIDDEN TESTS

# %% [markdown]
# ## 4. What each precision does to the gradient of TinyGPT
#
# TinyGPT (104k parameters, pretrained on the Fibonacci task, see chapter 1) on one batch of 32
# sequences of 32 tokens of the Pell task it will be fine-tuned on. First, what it saves: the cell
# lists the tensors the hooks would compress, and measures the activation bytes of one step with every
# one of them at one precision (`coursekit.measure` counts what `pack` returned).

# %%
CHECKPOINT = "tinygpt_fibonacci"
BATCH = fast(32, 8)
target_train = target_task(fast(2000, 256), seed=101)
target_test = target_task(fast(1000, 256), seed=102)
model = load_pretrained(CHECKPOINT)
xb, yb = next(iter(batches(target_train, BATCH, 1, seed=0)))

sizes = []  # elements of every tensor the hooks compress, in saving order


def spy(t):
    if t.is_floating_point() and t.requires_grad and not is_parameter(t):
        sizes.append(t.numel())
    return t


with torch.autograd.graph.saved_tensors_hooks(spy, lambda t: t):
    lm_loss(model(xb), yb)
L = len(sizes)
print(f"{L} tensors compressed per step, {sum(sizes):,} elements ({4 * sum(sizes) / 2**20:.2f} MiB in float32)")

plain = measure(lambda: lm_loss(model(xb), yb), model)
act_bytes = {32: plain.activation_bytes}
for b in (8, 4, 2, 1, 0.5):
    pack, unpack = compress_hooks([b] * L)
    act_bytes[b] = measure(lambda: lm_loss(model(xb), yb), model, pack=pack, unpack=unpack).activation_bytes
print("activation bytes of one step (measured):",
      ", ".join(f"{'AQ' if b == 0.5 else b}: {v:,} ({act_bytes[32] / v:.1f}x)" for b, v in act_bytes.items()))

# %% [markdown]
# Not all of it shrinks: the token indices, the LayerNorm statistics and the masks stay as they are,
# which is why 8 bits saves less than 4 times. Now the gradient: with every compressed tensor at one
# precision, 4 seeds each, against the exact gradient $g$ (all parameters, one vector): the relative
# error $\mathbb{E}\|\hat g - g\| / \|g\|$, the variance $\mathbb{E}\|\hat g - \bar g\|^2$ across seeds and the
# squared bias $\|\bar g - g\|^2$, $\bar g$ the mean over seeds.

# %%
SEEDS = fast(4, 2)


def flat_grad(mdl, pack=None, unpack=None, x=xb, y=yb):
    mdl.zero_grad(set_to_none=True)
    if pack is None:
        loss = lm_loss(mdl(x), y)
    else:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            loss = lm_loss(mdl(x), y)
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in mdl.parameters()])


g_exact = flat_grad(model)
error_rows = {}
for b in tqdm((8, 4, 2, 1, 0.5), desc="precisions"):
    gs = torch.stack([flat_grad(model, *compress_hooks([b] * L, seed=s)) for s in range(SEEDS)])
    g_mean = gs.mean(0)
    error_rows[b] = {"rel": float((gs - g_exact).norm(dim=1).mean() / g_exact.norm()),
                     "var": float((gs - g_mean).pow(2).sum(1).mean()),
                     "bias2": float((g_mean - g_exact).pow(2).sum())}
lines = ["| scheme | bits/element | relative error | variance | bias² |", "|---|---|---|---|---|"]
for b, r in error_rows.items():
    lines.append(f"| {'AQ' if b == 0.5 else f'{b}-bit'} | {b} | {r['rel']:.3g} | {r['var']:.3g} | {r['bias2']:.3g} |")
display(Markdown("\n".join(lines)))

# %% [markdown]
# The error grows fast as bits go: each bit fewer doubles the step and quadruples the variance, and at
# 1 bit it dwarfs the gradient itself. AQ, at half of 1 bit, is far more accurate than 1 bit, and almost
# all of its error is bias (the detail lost inside each run of 4); its variance is small because the
# mean of 4 values has a narrow range per group. Not every tensor matters equally, though: the next
# section measures which ones do.
#
# ## 5. Sensitivity and the bit budget
#
# **GradNormVar.** For saved tensor $l$, with the other tensors at 4 bits, run three forward and backward
# passes: $l$ at AQ with seed $s$ ($g_0$), at AQ with seed $s+1$ ($g_1$) and at 8 bits ($g_2$). Each $g$
# here is the vector of the **L2 norms of each parameter tensor's gradient** (one number per parameter
# tensor). Then
#
# $$C_l = \max\big(\|g_0 - g_1\|^2,\; 2\max(\|g_0 - g_2\|^2, \|g_1 - g_2\|^2)\big):$$
#
# the first term is AQ's variance, the others its distance from a nearly exact run. A value that is not
# finite or exceeds $10^{10}$ counts as $10^{10}$.

# %% exercise="gradnormvar"
def gradnormvar(g0, g1, g2):
    """ALAM's sensitivity C of one saved tensor from three vectors of per-parameter-tensor gradient norms.

    Args:
        g0, g1, g2: 1-D floating-point tensors of one length (the norms with the tensor at AQ, seed s; at AQ,
        seed s + 1; at 8 bits).

    Returns:
        A Python float: max(||g0 - g1||^2, 2 * max(||g0 - g2||^2, ||g1 - g2||^2)) (squared L2 norms), or 1e10
        when that is not finite or exceeds 1e10.

    Raises:
        ValueError: an argument that is not 1-D, or lengths that differ.

    Graded on, one cell per property: values on vectors of 1 to 40 norms (some drawn at grading time),
    where each of the three distances is the largest in turn, with infinite, NaN and huge entries
    (compared to a relative 1e-5); errors: the ValueErrors above. Each graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    for name, g in (("g0", g0), ("g1", g1), ("g2", g2)):
        if not isinstance(g, torch.Tensor) or g.dim() != 1:
            raise ValueError(f"{name} must be a 1-D tensor of per-parameter-tensor norms")
    if not g0.shape == g1.shape == g2.shape:
        raise ValueError(f"g0, g1, g2 must have one length, got {len(g0)}, {len(g1)}, {len(g2)}")
    g0, g1, g2 = (g.detach().double() for g in (g0, g1, g2))
    c = max(float((g0 - g1).pow(2).sum()), 2 * max(float((g0 - g2).pow(2).sum()), float((g1 - g2).pow(2).sum())))
    return c if math.isfinite(c) and c <= 1e10 else 1e10
    ### END SOLUTION


# %% test="test_gradnormvar" points=1 checks="gradnormvar"
assert gradnormvar(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]), torch.tensor([2.0, 2.0])) == 2.0
assert gradnormvar(torch.tensor([3.0]), torch.tensor([0.0]), torch.tensor([1.0])) == 9.0
assert gradnormvar(torch.tensor([float("inf")]), torch.tensor([0.0]), torch.tensor([0.0])) == 1e10
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch13_alam", "test_gradnormvar", globals())
### END HIDDEN TESTS

# %% test="test_gradnormvar_errors" points=1 checks="gradnormvar"
try:
    gradnormvar(torch.zeros(3), torch.zeros(3), torch.zeros(4))
except ValueError:
    print("visible checks passed")
else:
    raise AssertionError("lengths 3, 3, 4 should raise ValueError")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch13_alam", "test_gradnormvar_errors", globals())
### END HIDDEN TESTS

# %% [markdown]
# **Allocation.** The error model says tensor $l$ at $b_l$ bits adds $C_l\, w(b_l)$ to the gradient's
# variance, with $w(32) = 0$, $w(b) = 1/(2^b - 1)^2$ for $b = 8, 4, 2$ and $w(\mathrm{AQ}) = 1$ (ALAM
# models AQ like a 1-bit code). We want the least total error within a budget of bits,
# $\sum_l b_l n_l \le \bar b \sum_l n_l$ ($n_l$ elements, AQ counted as 0.5 bit; the overhead is not
# counted here). Greedily: start with every tensor at 32 bits; while over budget, move one tensor down
# one rung of the ladder 32 → 8 → 4 → 2 → AQ, the one whose step costs the least error per bit saved:
#
# $$\text{priority}_l = \frac{C_l\,\big(w(b') - w(b_l)\big)}{n_l\,(b_l - b')},$$
#
# $b'$ the next rung below $b_l$; 2 → AQ saves 1.5 bits per element, and we divide by 1.5 (the authors'
# code divides by 1 there). Ties go to the lower index.

# %% exercise="allocate_bits"
def allocate_bits(sensitivity, sizes, average_bits):
    """Greedy bit allocation down the ladder 32 -> 8 -> 4 -> 2 -> AQ (0.5) under an average-bits budget.

    Args:
        sensitivity: a sequence of L non-negative finite numbers C_l (gradnormvar's).
        sizes: a sequence of L positive ints n_l (elements of each saved tensor).
        average_bits: a positive number, the budget in bits per element (overhead not counted).

    Returns:
        A list of L precisions, each 32, 8, 4, 2 or 0.5. Start with all at 32. While
        sum(b_l * n_l) > average_bits * sum(n_l): among the tensors not yet at 0.5, take the one whose next
        step b -> b' (the next rung) has the least priority C_l * (w(b') - w(b)) / (n_l * (b - b')), with
        w(32) = 0, w(b) = 1 / (2**b - 1)**2 for b in {8, 4, 2} and w(0.5) = 1 (so 2 -> 0.5 divides by 1.5);
        on equal priorities the lowest index; move it to b'. Stop as soon as the budget holds (so at once
        when average_bits >= 32); when every tensor is at 0.5 and the budget still does not hold, return
        them all at 0.5.

    Raises:
        ValueError: sensitivity and sizes of different lengths or empty; a size that is not a positive int;
        a sensitivity that is negative or not finite; average_bits not a positive number.

    Graded on, one cell per property: values on tables of (C, n) made to tell apart a wrong ladder, priorities
    not divided by n_l or by the bits saved, the most sensitive tensor first, stopping before or after the
    budget, ties and unreachable budgets, and on tables of 5 to 40 tensors with budgets of 0.4 to 4 bits
    drawn at grading time (compared entry by entry); errors: the ValueErrors above. Each graded cell may use
    60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    ladder = (32, 8, 4, 2, 0.5)

    def w(b):
        return 0.0 if b == 32 else 1.0 if b == 0.5 else 1.0 / (2 ** b - 1) ** 2

    sensitivity, sizes = list(sensitivity), list(sizes)
    if len(sensitivity) != len(sizes) or not sizes:
        raise ValueError(f"need one sensitivity per size, got {len(sensitivity)} and {len(sizes)} (and at least one)")
    for n in sizes:
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"sizes must be positive ints, got {n!r}")
    for c in sensitivity:
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c < 0:
            raise ValueError(f"sensitivities must be finite non-negative numbers, got {c!r}")
    if isinstance(average_bits, bool) or not isinstance(average_bits, (int, float)) \
            or not math.isfinite(average_bits) or average_bits <= 0:
        raise ValueError(f"average_bits must be a positive number, got {average_bits!r}")
    bits = [32] * len(sizes)
    budget = average_bits * sum(sizes)
    while sum(b * n for b, n in zip(bits, sizes)) > budget:
        best = None  # (priority, index, next rung)
        for l, (c, n, b) in enumerate(zip(sensitivity, sizes, bits)):
            if b == 0.5:
                continue
            down = ladder[ladder.index(b) + 1]
            priority = c * (w(down) - w(b)) / (n * (b - down))
            if best is None or priority < best[0]:  # strict: the lower index wins a tie
                best = (priority, l, down)
        if best is None:  # all at AQ: the budget cannot be met
            break
        bits[best[1]] = best[2]
    return bits
    ### END SOLUTION


# %% test="test_allocate_bits" points=2 checks="allocate_bits"
assert allocate_bits([1.0, 1.0], [100, 100], 32) == [32, 32], "within budget at once"
assert allocate_bits([1.0, 1.0], [100, 100], 20) == [8, 32], "one step: the tie goes to the lower index"
assert allocate_bits([1.0, 100.0], [100, 100], 4) == [2, 4], "the less sensitive tensor goes further down"
assert allocate_bits([1.0, 1.0], [100, 100], 0.1) == [0.5, 0.5], "an unreachable budget: everything at AQ"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch13_alam", "test_allocate_bits", globals())
### END HIDDEN TESTS

# %% test="test_allocate_bits_errors" points=1 checks="allocate_bits"
try:
    allocate_bits([1.0, 2.0], [10], 2)
except ValueError:
    print("visible checks passed")
else:
    raise AssertionError("two sensitivities and one size should raise ValueError")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch13_alam", "test_allocate_bits_errors", globals())
### END HIDDEN TESTS

# %% [markdown]
# ### GradNormVar on TinyGPT
#
# Three forward and backward passes per saved tensor, on a batch of 8 (the cell prints its time). Then
# the allocations at an average of 2, 1.5 and 1 bits: which tensors keep more bits.

# %%
x_sens, y_sens = xb[:fast(8, 4)], yb[:fast(8, 4)]


def norm_vector(bits, seed):
    model.zero_grad(set_to_none=True)
    pack, unpack = compress_hooks(bits, seed=seed)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = lm_loss(model(x_sens), y_sens)
    loss.backward()
    return torch.stack([p.grad.norm() for p in model.parameters()])


start = time.perf_counter()
sensitivity = []
for l in tqdm(range(L), desc="GradNormVar"):
    others = [4] * L
    g0 = norm_vector(others[:l] + [0.5] + others[l + 1:], 2 * l)
    g1 = norm_vector(others[:l] + [0.5] + others[l + 1:], 2 * l + 1)
    g2 = norm_vector(others[:l] + [8] + others[l + 1:], 10_000 + l)
    sensitivity.append(gradnormvar(g0, g1, g2))
print(f"GradNormVar of {L} tensors ({3 * L} passes) in {time.perf_counter() - start:.1f} s")
BUDGETS = (2, 1.5, 1)
allocations = {avg: allocate_bits(sensitivity, sizes, avg) for avg in BUDGETS}
lines = ["| tensor | elements | C | " + " | ".join(f"{avg} bits avg" for avg in BUDGETS) + " |",
         "|---|---|---|" + "---|" * len(BUDGETS)]
for l in range(L):
    lines.append(f"| {l} | {sizes[l]:,} | {sensitivity[l]:.2g} | "
                 + " | ".join(str(allocations[avg][l]) for avg in BUDGETS) + " |")
display(Markdown("\n".join(lines)))

# %% [markdown]
# A few tensors carry most of the sensitivity and keep 4 bits; most go down to AQ. Now the real test:
# fine-tune the pretrained TinyGPT on the Pell task with the saved activations compressed (batches of
# 16 sequences, the same batches and Adam steps for every run, fresh noise at every step): float32,
# every tensor at 2 bits, and the allocations at 2 and 1.5 bits on average. The table compares the
# loss curves, the test accuracy and the activation bytes of one step of section 4's batch (measured,
# overhead included) with float32.

# %%
STEPS = fast(64, 6)
FT_BATCH = fast(16, 8)
LR = 3e-3
RUNS = {"float32": None, "uniform 2-bit": [2] * L,
        **{f"allocated, {avg} bits avg": allocations[avg] for avg in (2, 1.5)}}


def finetune(bits):
    mdl = load_pretrained(CHECKPOINT)
    opt = torch.optim.Adam(mdl.parameters(), lr=LR)
    losses = []
    for i, (x, y) in enumerate(batches(target_train, FT_BATCH, STEPS, seed=1)):
        if bits is None:
            loss = lm_loss(mdl(x), y)
        else:
            pack, unpack = compress_hooks(bits, seed=i)  # new noise every step
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                loss = lm_loss(mdl(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return mdl, losses


start = time.perf_counter()
results = {}
for name, bits in tqdm(RUNS.items(), desc="fine-tuning"):
    mdl, losses = finetune(bits)
    pack, unpack = (None, None) if bits is None else compress_hooks(bits)
    step_bytes = measure(lambda: lm_loss(mdl(xb), yb), mdl, pack=pack, unpack=unpack).activation_bytes
    results[name] = {"losses": losses, "accuracy": accuracy(mdl, target_test.x, target_test.y),
                     "bytes": step_bytes, "final": sum(losses[-10:]) / len(losses[-10:])}
print(f"{len(RUNS)} fine-tunings of {STEPS} steps in {time.perf_counter() - start:.0f} s")

fig, ax = plt.subplots(figsize=(7, 3.2))
for name, r in results.items():
    ax.plot(r["losses"], label=name, lw=1)
ax.set_yscale("log")
ax.set_xlabel("step")
ax.set_ylabel("training loss (log)")
ax.legend(frameon=False, fontsize=7)
fig.tight_layout()
plt.show()
lines = ["| run | loss (last 10 steps) | test accuracy | activation bytes / step | compression |", "|---|---|---|---|---|"]
for name, r in results.items():
    lines.append(f"| {name} | {r['final']:.3f} | {r['accuracy']:.1%} | {r['bytes']:,} | "
                 f"{results['float32']['bytes'] / r['bytes']:.1f}x |")
display(Markdown("\n".join(lines)))

# %% [markdown]
# Read the table from the bottom: the allocated runs keep far fewer bytes than float32 (the last
# column), and the line under the plot says how close their loss and accuracy come to it. At the same
# average of 2 bits, spending the bits where GradNormVar says they matter beats giving every tensor
# 2 bits. The overhead (min and scale per group) and the tensors that are never compressed are inside
# the measured bytes, which is why the ratio is below 32 divided by the average bits.
#
# ## 6. Play with it: the bit budget
#
# Move the budget: the allocation for TinyGPT's measured sensitivities, computed for every budget
# ahead, shows the precision of each saved tensor and the bits the budget buys, overhead included,
# against float32.

# %% tags=["demo"]
SLIDER_BUDGETS = [round(0.5 + 0.25 * i, 2) for i in range(31)]
slider_alloc = {avg: allocate_bits(sensitivity, sizes, avg) for avg in SLIDER_BUDGETS}
slider_bits = {avg: sum(compressed_bits(n, b) for n, b in zip(sizes, bits)) for avg, bits in slider_alloc.items()}
slider_error = {avg: sum(c * (0.0 if b == 32 else 1.0 if b == 0.5 else 1 / (2 ** b - 1) ** 2)
                         for c, b in zip(sensitivity, bits)) for avg, bits in slider_alloc.items()}


def draw(ax, budget_index=6):
    avg = SLIDER_BUDGETS[budget_index]
    bits = slider_alloc[avg]
    ax.bar(range(L), bits, color=["#4c72b0" if b >= 4 else "#dd8452" if b == 2 else "#c44e52" for b in bits])
    ax.set_yscale("log", base=2)
    ax.set_yticks([0.5, 2, 4, 8, 32], ["AQ", "2", "4", "8", "32"])
    ax.set_xlabel("saved tensor (in saving order)")
    ax.set_ylabel("bits per element")
    ax.set_title(f"budget {avg} bits/element: {slider_bits[avg] / sum(sizes):.2f} stored "
                 f"({32 * sum(sizes) / slider_bits[avg]:.1f}× less than float32),\nmodel error "
                 f"{slider_error[avg]:.3g}")


slider_plot(draw, figsize=(9, 4), budget_index=(0, len(SLIDER_BUDGETS) - 1),
            labels={"budget_index": lambda i: f"bit budget: {SLIDER_BUDGETS[i]:g} bits per element"},
            explain={"budget_index": "average bits per saved element that the allocation may spend"},
            notice={"budget_index": lambda budget_index: (
                lambda avg: f"{avg:g} bits/element: {32 * sum(sizes) / slider_bits[avg]:.1f}× smaller than float32, "
                            f"model error {slider_error[avg]:.3g}")(SLIDER_BUDGETS[budget_index])})

# %% [markdown]
# ## 7. Exercise: AQ as a Triton kernel
#
# AQ reads every activation once and writes a sixteenth of its bytes: a job for one fused kernel that
# computes the means, the group's minimum and maximum, the stochastic codes and the packed bytes
# without writing anything in between. Program $g$ owns the means $gG_s, \dots, gG_s + G_s - 1$
# (`idx`, masked where `idx >= M`). For each of the `AVERAGE` elements of a run load
# `x_ptr + idx * AVERAGE + a` (masked where past $n$), sum, and divide by the run's length
# ($\min(\text{AVERAGE}, n - \text{idx}\cdot\text{AVERAGE})$); `tl.min`/`tl.max` over the live means
# (`tl.where(live, means, inf)`), the scale $3/(\max - \min + 2\cdot10^{-6})$, the codes as in section 1
# (dead lanes 0); then `tl.reshape(q, (GROUP // 4, 4))`, shift column $i$ left by $2i$ and sum the rows
# to get the bytes, and store them with the group's min and scale. The launcher, `launch_average_quantize`
# (setup cell), is given.
#
# The result must equal `average_quantize(x, noise)` (codes exactly, except within 1e-3 of an integer;
# mins and scales to float32 rounding). The kernel does the work: the call launches it, its loads and
# stores stay inside the tensors passed to it, and around the launch PyTorch may only allocate, view or
# copy tensors; every element of codes, mins and scales is written by the kernel's stores.

# %% exercise="average_quantize_triton"
def average_quantize_triton(x, noise):
    """average_quantize(x, noise) (average 4, groups of 128) computed by a Triton kernel.

    Args:
        x: a float32 tensor of any shape, n >= 1 elements; noise: float32 of shape (M,), M = ceil(n / 4).

    Returns:
        (codes, mins, scales) as average_quantize returns them, from one launch of the kernel through
        launch_average_quantize.

    Graded on: (37, 53), (3, 5, 7), (2, 6) and one n between 300 and 1200 drawn at grading time, in Triton's
    interpreter: values against the definition; the call launches the kernel, every lane a load or store
    leaves on addresses an element of the tensor it belongs to, and PyTorch does nothing around the launch
    but allocate, view or copy tensors (empty, zeros, view, reshape, contiguous, clone, to, detach); every
    element of codes, mins and scales is written by the kernel's stores (into tensors passed to it).
    average_quantize and the other exercises, NumPy and the course's kernels are refused. Each graded cell
    may use 60 s and 4 GiB.
    """

    @triton.jit
    def aq_kernel(x_ptr, noise_ptr, codes_ptr, mins_ptr, scales_ptr, n, M,
                  AVERAGE: tl.constexpr, GROUP: tl.constexpr):
        g = tl.program_id(0)
        idx = g * GROUP + tl.arange(0, GROUP)  # the means this program owns
        live = idx < M
        ### BEGIN SOLUTION
        total = tl.zeros([GROUP], tl.float32)
        for a in tl.static_range(AVERAGE):
            pos = idx * AVERAGE + a
            total += tl.load(x_ptr + pos, mask=live & (pos < n), other=0.0)
        count = tl.maximum(tl.minimum(n - idx * AVERAGE, AVERAGE), 1).to(tl.float32)
        means = total / count
        mn = tl.min(tl.where(live, means, float("inf")), 0)
        mx = tl.max(tl.where(live, means, float("-inf")), 0)
        scale = 3.0 / (mx - mn + 2e-6)
        rand = tl.load(noise_ptr + idx, mask=live, other=0.0)
        level = tl.minimum(tl.maximum(tl.floor((means - mn) * scale + rand), 0.0), 3.0)
        level = tl.where(live, level, 0.0).to(tl.int32)  # padding means hold code 0
        pairs = tl.reshape(level, (GROUP // 4, 4))
        shifts = tl.arange(0, 4) * 2
        packed = tl.sum(pairs << shifts[None, :], 1)
        tl.store(codes_ptr + g * (GROUP // 4) + tl.arange(0, GROUP // 4), packed.to(tl.uint8))
        tl.store(mins_ptr + g, mn)
        tl.store(scales_ptr + g, scale)
        ### END SOLUTION

    return launch_average_quantize(aq_kernel, x, noise)


# %% test="test_average_quantize_triton" points=2 checks="average_quantize_triton"
x = torch.randn(37, 53)
u = torch.rand(491)
got, want = average_quantize_triton(x, u), average_quantize(x, u)
for name, a, b in zip(("codes", "mins", "scales"), got, want):
    assert a.dtype == b.dtype and a.shape == b.shape, f"{name}: {a.dtype} {tuple(a.shape)}, expected {b.dtype} {tuple(b.shape)}"
assert (got[0] != want[0]).sum() <= 2, "the packed codes differ from average_quantize's"
torch.testing.assert_close(got[1], want[1])
torch.testing.assert_close(got[2], want[2])
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch13_alam", "test_average_quantize_triton", globals())
### END HIDDEN TESTS

# %% [markdown]
# On a GPU this kernel reads the activation once, 4 bytes per element, and writes about 0.6 bits per
# element: its speed is set by memory bandwidth. `kernels/ch13_alam.py` holds the course's version with
# the unpacking kernel, and `make bench` measures its bandwidth on a GPU.
#
# ## 8. Your lecture notes vs what we measure
#
# Lecture notes often say that activations below one bit per element must wreck training. ALAM's
# answer, which our TinyGPT reproduces in its way, is that it depends on *which* activations: a uniform
# 1-bit or AQ compression does hurt (section 4's error table), and so does 2 bits everywhere, while the same
# average spent where GradNormVar points keeps the fine-tuning much closer to float32 (section 5's table;
# how close, the table says). The paper's numbers are for LLMs; ours for a
# 104k-parameter model on a toy task, where many saved tensors are small and the uncompressed ones
# (indices, LayerNorm statistics) weigh more.

# %%
best = results["allocated, 2 bits avg"]
ratio = results["float32"]["bytes"] / best["bytes"]
literature_table([
    ("activation compression at comparable accuracy", '"up to 10× (LLMs)"',
     f"{ratio:.1f}x at 2 bits avg (TinyGPT; loss {best['final']:.3f} vs {results['float32']['final']:.3f}, "
     f"accuracy {best['accuracy']:.1%} vs {results['float32']['accuracy']:.1%})"),
    ("LLaMA2-7B (repository README)", '"12.5× on LLaMA2-7B"', "not reproducible at our scale (no LLM here)"),
    ("AQ vs 1-bit gradient error", "AQ better at half the bits",
     f"relative error {error_rows[0.5]['rel']:.2f} (AQ) vs {error_rows[1]['rel']:.2f} (1-bit)"),
], source="ALAM (Woo, Lee, Jeon, ICLR 2024)")
fig, ax = plt.subplots(figsize=(5, 2.6))
paired_bars(ax, ["activation compression"], [10.0], [ratio], source="paper (up to)", fmt="%.1f×")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Summary
#
# - Group-wise quantization with a min and a scale per group of 128 and **stochastic rounding** stores
#   activations in 1 to 8 bits with no bias; the min and scale cost 64 bits per group, counted.
# - **AQ** keeps the mean of every 4 contiguous elements at 2 bits: 0.5 bit per element, a small bias
#   and a small variance, far better than 1 bit at half the bits.
# - A pair of `saved_tensors_hooks` is all it takes to compress what autograd saves; parameters, integer
#   tensors and tensors that do not require grad stay as they are.
# - **GradNormVar** measures which saved tensors the gradient is sensitive to, and the greedy allocation
#   spends a bit budget where it matters: at the same average bits, far better than uniform bits.
# - The paper reports up to 10× compression for LLMs; the measured ratio for TinyGPT is in the table
#   above, with the loss it reached.
