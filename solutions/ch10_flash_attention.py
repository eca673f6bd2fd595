# ---
# jupyter:
#   chapter:
#     title: "FlashAttention in PyTorch and Triton"
#     imports: [kernels, triton]
#     kernel: kernels.ch10_flash_attention
#     prose_numbers:  # phrases whose numbers are definitions or quoted figures (tests/test_prose_numbers.py)
#       - 'Each graded cell may use 60 s and 4 GiB'  # the grader's limits per graded cell
#       - 'one layer''s $P$ alone is 16 GB in fp32'  # 16K² × 16 heads × 4 bytes
#       - '(40–80 GB), delivers about 1.5–2 TB/s'
#       - 'holds only 192 KB, but all of it together delivers about 19 TB/s'
#       - 'computes 312 TFLOP/s in bf16: to keep up, an operation must do about 150 FLOPs'  # FlashAttention §2.1
#       - 'an A100''s 192 KB'
#       - '" 192 KB"'
#       - 'standard attention does 66.6 GFLOPs with 40.3 GB of HBM reads and writes in 41.7 ms; FlashAttention 75.2 GFLOPs, 4.4 GB, 7.3 ms'
#       - 'up to 20× below exact-attention baselines; 3× faster GPT-2 training'
#       - '50–73% of the A100''s peak'  # FlashAttention Fig. 2, abstract; FlashAttention-2
#       - '"75.2 / 66.6 = 1.13×"'
#       - '"40.3 / 4.4 GB = 9.2×"'
#       - '"up to 20× (Fig. 3, long N)"'
#       - '"41.7 → 7.3 ms (5.7×); 3× end to end"'
#       - '"50–73% of A100 peak"'
#       - 'the paper''s 20×'
#       - '(64 × N elements or more)'  # the visible memory tests' rule at blocks of 64
#       - '4 × 128 × N float32 numbers'  # a row of tiles in the memory cells: 4 heads, a block of 128 rows, N keys
#     mentioned:  # names an exercise's text uses that grading does not offer (tests/test_namespace.py)
#       flash_attention_forward:
#         nn: "torch's attention layers, refused"
#       flash_attention_triton:
#         K: "a matrix of the maths"
#         V: "a matrix of the maths"
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
# # Chapter 10 — FlashAttention
#
# Attention is the one layer of a transformer whose memory grows with the *square* of the sequence
# length: the $N \times N$ matrix of scores. FlashAttention (Dao et al. 2022) computes exactly the
# same output without ever storing that matrix, and runs faster for it, because on a GPU the time of
# attention is set by the bytes moved to and from memory, not by the FLOPs.
#
# **What you will learn**
# - standard attention, $S = \tau QK^\top$, $O = \mathrm{softmax}(S)V$, and its $N \times N$ memory,
#   measured;
# - the GPU memory hierarchy (small fast SRAM, large slow HBM) and why moving bytes, not FLOPs,
#   sets the time of attention;
# - tiling and the **online softmax** (running max, running sum, rescaling), which make attention
#   computable one block of keys at a time;
# - the forward pass and its saved log-sum-exp, the backward pass that recomputes attention block
#   by block with $D = \mathrm{rowsum}(dO \circ O)$, causal masking with block skipping;
# - the same forward pass as a **Triton kernel**, run here in Triton's CPU interpreter;
# - the IO analysis: $\Theta(N^2 d^2 / M)$ HBM accesses instead of $\Theta(Nd + N^2)$, and what the
#   papers report.

# %% tags=["setup"]
import math

import torch

import kernels  # noqa: F401 - before triton: switches on Triton's CPU interpreter when there is no GPU
import triton
import triton.language as tl


def launch_flash_forward(kernel, q, k, v, causal, block_m=32, block_n=32):
    """Run the Triton forward ``kernel`` of section 7 on (B, H, N, d) float32 tensors; returns o (B, H, N, d).

    One program per (block of ``block_m`` query rows, batch × head). The inputs are made contiguous,
    so row n of head bh starts at element ``bh * N * d + n * d`` of every tensor.
    """
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must share one (B, H, N, d) shape, got {[tuple(t.shape) for t in (q, k, v)]}")
    B, H, N, d = q.shape
    if d < 16 or d & (d - 1):
        raise ValueError(f"the head dimension must be a power of two >= 16 (tl.arange needs one), got {d}")
    if q.dtype != torch.float32:
        raise ValueError(f"this exercise kernel takes float32 inputs, got {q.dtype}")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = torch.empty_like(q)
    grid = (triton.cdiv(N, block_m), B * H)
    kernel[grid](q, k, v, o, N, 1.0 / math.sqrt(d), HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal)
    return o


# %% [markdown]
# ## 1. Standard attention and its $N \times N$ matrix
#
# For one head, with queries, keys and values $Q, K, V \in \mathbb{R}^{N \times d}$ and $\tau = 1/\sqrt d$:
#
# $$S = \tau\, Q K^\top \in \mathbb{R}^{N\times N}, \qquad P = \mathrm{softmax}_{\text{rows}}(S), \qquad O = P V \in \mathbb{R}^{N\times d}.$$
#
# With a **causal** mask (a language model), query $i$ may only look at keys $j \le i$: set
# $S_{ij} = -\infty$ for $j > i$ before the softmax. Written the obvious way, $S$ and $P$ are real
# tensors of $N^2$ numbers per head, and autograd keeps $P$ (and more) for the backward pass. All
# tensors below are $(B, H, N, d)$: batch, heads, sequence, head dimension. The cell below also
# defines `LargestTensor`, a dispatch mode that records the largest tensor any operator creates:
# the measurements and the visible tests use it.

# %%
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display
from torch.utils._python_dispatch import TorchDispatchMode

from coursekit import fast, measure, saved_tensors
from coursekit.measure import flop_counter
from coursekit.report import literature_table, paired_bars
from coursekit.widgets import slider_plot

KB, MB = 1024, 1024**2


def attention_naive(q, k, v, causal=False):
    """Standard attention, (B, H, N, d) ×3 -> (o (B, H, N, d), lse (B, H, N)): S and P are N × N."""
    n, d = q.shape[-2:]
    s = q @ k.transpose(-2, -1) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s.detach(), dim=-1)  # lse: for comparisons only


def qkv(B=1, H=2, N=256, d=64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, d, generator=g).requires_grad_(requires_grad) for _ in range(3)]


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor (in elements) that any operator produces, and the operators that ran."""

    def __init__(self):
        super().__init__()
        self.elements, self.shape, self.ops = 0, None, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.add(func.overloadpacket.__name__)
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.nelement() > self.elements:
                self.elements, self.shape = t.nelement(), tuple(t.shape)
        return out


q, k, v = qkv(N=512, requires_grad=True)
with saved_tensors() as rec:
    o, _ = attention_naive(q, k, v, causal=True)
print(f"B=1, H=2, N=512, d=64: the inputs are {3 * q.nelement() * 4 / KB:,.0f} KB, autograd saved:")
for t in rec.tensors:
    print(f"  {str(list(t.shape)):>18} {str(t.dtype):>14} {t.nbytes / KB:8,.0f} KB")
n_by_n = [t for t in rec.tensors if list(t.shape[-2:]) == [512, 512]]
print(f"total {rec.activation_bytes / KB:,.0f} KB, of which N×N tensors "
      f"{sum(t.nbytes for t in n_by_n) / KB:,.0f} KB: "
      + ", ".join(f"{str(t.dtype)[6:]} {list(t.shape)}" for t in n_by_n))

# %% [markdown]
# The $N \times N$ tensors dwarf everything else: the softmax output $P$, one float32 number per
# score and head (kept by the softmax and by the last matmul, one storage), and the boolean causal
# mask, one byte per score, shared by the heads (kept by `masked_fill` for its backward). The scores
# $S$ themselves are not kept: the division by $\sqrt d$ needs only its constant, the mask only where
# it was applied, and the softmax's backward reads its output $P$. Double $N$ and the $N \times N$
# tensors quadruple. At $N = 16$K with 16 heads, one layer's $P$ alone is 16 GB in fp32.
#
# ### Your lecture notes vs what we measure: the $1/\sqrt d$ in the scores
#
# The lecture notes write the scores as $QK^\top$, without $\tau = 1/\sqrt d$. The scale is not
# cosmetic. With entries of $q$ and $k$ of unit variance (what LayerNorm and a good initialisation
# give), $q \cdot k$ is a sum of $d$ products of unit variance: its standard deviation is $\sqrt d$.
# Without $\tau$, the scores spread further apart as the heads get wider, the softmax of a row
# turns into a one-hot on its largest score, and its gradient, $dS = P \circ (dP - D)$, vanishes
# with the off-peak entries of $P$: the attention stops learning where to look. With $\tau$ the scores
# keep unit spread at every $d$. Measured on random unit-variance $q$, $k$ ($N = 256$ keys per row):

# %%
def softmax_stats(d, scaled, n=256, rows=256, seed=0):
    """Score std, mean max probability, mean entropy and mean |dS| per row for random unit-variance q, k."""
    g = torch.Generator().manual_seed(seed)
    q_, k_ = torch.randn(rows, d, generator=g), torch.randn(n, d, generator=g)
    s = (q_ @ k_.T) * (1 / math.sqrt(d) if scaled else 1.0)
    s.requires_grad_(True)
    p = torch.softmax(s, dim=-1)
    (p * torch.randn(rows, n, generator=g)).sum().backward()  # a random upstream gradient dP
    entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)
    return s.std().item(), p.max(-1).values.mean().item(), entropy.mean().item(), s.grad.abs().sum(-1).mean().item()


stat_rows, stats = [], {}
for d in (16, 64, 256, 1024):
    stats[d] = plain, scaled = softmax_stats(d, scaled=False), softmax_stats(d, scaled=True)
    stat_rows.append(f"| {d} | {plain[0]:.1f} / {scaled[0]:.2f} | {plain[1]:.3f} / {scaled[1]:.3f} "
                     f"| {plain[2]:.2f} / {scaled[2]:.2f} | {plain[3]:.3f} / {scaled[3]:.3f} |")
display(Markdown(f"Each cell: without τ / with τ. A uniform row has entropy log N = {math.log(256):.2f}.\n\n"
                 "| d | score std | mean max probability | mean entropy | mean Σ|dS| per row |\n|---|---|---|---|---|\n"
                 + "\n".join(stat_rows)))
(plain_lo, _), (plain_hi, scaled_hi) = stats[16], stats[1024]
display(Markdown(f"Without τ, going from d = 16 to d = 1024 multiplies the score spread by {plain_hi[0] / plain_lo[0]:.1f} "
                 f"(√64 = 8), lifts the largest probability of a row from {plain_lo[1]:.2f} to {plain_hi[1]:.2f}, and "
                 f"shrinks the gradient that reaches the scores {plain_lo[3] / plain_hi[3]:.1f}×; at d = 1024 it is "
                 f"{scaled_hi[3] / plain_hi[3]:.1f}× smaller than with τ."))

# %% [markdown]
# ## 2. Where the time goes: SRAM and HBM
#
# A GPU has two kinds of memory (paper: Dao et al. 2022, §2.1, for an A100). **HBM**, the big one
# (40–80 GB), delivers about 1.5–2 TB/s. **SRAM**, on each of the 108 streaming multiprocessors,
# holds only 192 KB, but all of it together delivers about 19 TB/s. An A100 computes 312 TFLOP/s in
# bf16: to keep up, an operation must do about 150 FLOPs per byte it reads from HBM. A matmul does
# (each loaded number is reused $d$ times); a softmax, a mask or a dropout does one or two FLOPs
# per number: they are **memory-bound**, their time is bytes / bandwidth.
#
# Standard attention runs as separate kernels, each reading its input from HBM and writing its
# output back: $S = QK^\top$ (write $N^2$), mask and softmax (read $N^2$, write $N^2$), $PV$ (read $N^2$).
# That is $\Theta(Nd + N^2)$ HBM accesses, dominated by $N^2$ when $N \gg d$.
#
# **Tiling** is the fix: load a block of $Q$ rows and a block of $K, V$ rows into SRAM, do
# *everything* for that pair of blocks there (scores, mask, softmax, product with $V$), and never
# write the scores out. FlashAttention needs $\Theta(N^2 d^2 / M)$ HBM accesses for an SRAM of $M$
# elements: with $d = 64$ and $M \approx 100$K, $d^2/M \approx 1/25$ of the $N^2$ term. The
# obstacle is the softmax: each row's normaliser $\sum_j e^{S_{ij}}$ needs *all* the keys of
# the row before the first output can be written.
#
# ## 3. The online softmax
#
# Process the keys of a row in blocks $S^{(1)}, S^{(2)}, \dots$ and keep three running quantities:
# the max $m$, the sum $\ell = \sum e^{S_{ij} - m}$ and the unnormalised output
# $\tilde O = \sum_j e^{S_{ij} - m} V_j$. For each new block:
#
# $$m' = \max\bigl(m, \mathrm{rowmax}\, S^{(b)}\bigr), \quad P^{(b)} = e^{S^{(b)} - m'}, \quad
# \ell' = e^{m - m'}\,\ell + \mathrm{rowsum}\, P^{(b)}, \quad \tilde O' = e^{m - m'}\,\tilde O + P^{(b)} V^{(b)}.$$
#
# The factor $e^{m - m'}$ **rescales** what was accumulated under the old max whenever the max grows.
# At the end $O = \tilde O / \ell$, exactly the softmax output, and $L = m + \log \ell$ is the
# log-sum-exp of the row, the one number per row that backward needs. Subtracting the max also keeps
# every exponent $\le 0$: nothing overflows, even in fp16. On one row, in blocks of 4:

# %%
torch.manual_seed(0)
row, values = torch.randn(13) * 3, torch.randn(13, 2)
m, l, acc = torch.tensor(float("-inf")), torch.tensor(0.0), torch.zeros(2)
for start in range(0, 13, 4):
    s_b, v_b = row[start:start + 4], values[start:start + 4]
    m_new = torch.maximum(m, s_b.max())
    p_b = torch.exp(s_b - m_new)
    l = torch.exp(m - m_new) * l + p_b.sum()
    acc = torch.exp(m - m_new) * acc + p_b @ v_b
    m = m_new
    print(f"keys {start:2}..{min(start + 4, 13) - 1:2}: running max {m.item():6.3f}, running sum {l.item():6.3f}")
print("online  :", (acc / l).numpy(), " log-sum-exp", (m + l.log()).item())
print("softmax :", (torch.softmax(row, 0) @ values).numpy(), " log-sum-exp", torch.logsumexp(row, 0).item())

# %% [markdown]
# ## 4. Exercise: the tiled forward pass
#
# Write `flash_attention_forward`. Split the queries into blocks of `block_q` rows; for each query
# block, loop over the key/value blocks of `block_k` rows with the online softmax of section 3, then
# write $O = \tilde O/\ell$ and $L = m + \log \ell$ for those rows. All batches and heads go at once
# (the blocks are slices along the sequence dimension).
#
# - **Causal mask.** Query $i$ sees keys $j \le i$. Build each tile's mask from the row and column
#   indices (`torch.arange`); a key block that starts after the query block's last row is entirely
#   masked: skip it, that halves the work.
# - **Masked rows.** A tile can mask a whole row (causal, `block_q > block_k`). Then $m' = -\infty$
#   if nothing was seen yet, and $e^{-\infty - (-\infty)}$ is NaN: subtract 0 instead of $-\infty$.
# - **Tails.** $N$ need not be a multiple of a block size: the last blocks are shorter.
# - **No $N \times N$.** Nothing of $N^2$ elements may exist, not even a boolean mask.
# - **By hand.** Fused attention (`scaled_dot_product_attention`, in any spelling, and
#   `torch.nn.attention`), torch's attention layers (`multi_head_attention_forward`,
#   `nn.MultiheadAttention`, the `nn.Transformer*` layers), NumPy and the course's own
#   `kernels.ch10_flash_attention` are refused by the grader in every exercise of this chapter: use
#   torch operations (and Triton in section 7).
# - Accumulate in float32 (float64 for float64 inputs): `torch.promote_types(q.dtype, torch.float32)`.
#   `o` comes back in the dtype of `q` (float16 in, float16 out), `lse` in the accumulation dtype.
#
# Three graded cells follow, one per property: the values (non-causal, $N$ a multiple of the
# blocks), the edge cases (ragged tails, causal, float64 and float16 inputs) and the memory rule.

# %% exercise="flash_attention_forward"
def flash_attention_forward(q, k, v, causal=False, block_q=32, block_k=32):
    """Exact attention computed tile by tile with the online softmax.

    Args:
        q, k, v: (B, H, N, d) tensors of one dtype.
        causal: if True, query i attends to keys 0..i only.
        block_q, block_k: rows of a query block and of a key/value block (positive ints).

    Returns:
        o: (B, H, N, d), dtype of q: softmax(q kᵀ / sqrt(d)) v.
        lse: (B, H, N), float32 (float64 for float64 inputs): log sum_j exp(q_i·k_j / sqrt(d)) over
            the keys row i attends to.
        No tensor of N × N elements is ever created.

    Graded in three cells, on float32 inputs with d = 16 unless said otherwise; o and lse are compared with
    float64 attention and must be finite. Each cell first calls the function at (B, H, N, d) = (1, 2, 128, 16),
    causal and not, with blocks of 32 and 16: there no torch operator may create a tensor of N² elements or
    more, whatever its shape (a view counts as the whole storage it views), and fused attention may not run;
    either fails all three cells. Their o and lse are compared too: the non-causal call's in every cell, the
    causal call's in the edge-case cell. The edge-case and memory cells count once the values cell passes.
      values: non-causal, N = 64 or 96, a multiple of both block sizes: one block covering everything, then
        several key blocks (blocks of 8 to 64, block_q above, equal to and below block_k), with inputs whose
        row maxima rise from key block to key block, so that a missing rescale shows.
      edge cases: N = 37, 70 or 100, causal and not (ragged last blocks, one block larger than N); causal
        also at N = 96, with block_q above, equal to and below block_k (whole rows of a tile masked); float64
        inputs (o and lse float64, to float64 precision) and float16 inputs (o float16, lse float32). Where
        there are several key blocks, each row's maximum lies in the first one it sees: the rescale is the
        values cell's.
      memory: at (1, 4, N, 16), N drawn at grading time between 3072 and 4096 (a multiple of 128), non-causal
        with blocks of 128: while the call runs, the process's memory (read from outside it) may rise by no
        more than o and lse plus one and a half rows of tiles, a row of tiles being one query block's scores
        against all N keys (4 × 128 × N float32 numbers). Scoring a query block against all keys at once, or
        anything N × N, takes more: loop over the key blocks inside each query block. That call's o and lse
        are compared on rows drawn at grading time. Defining the function allocates nothing, and a call keeps
        nothing for later calls (no caches).
    Fused attention, torch's attention layers, NumPy and the course's kernels are refused. Each graded cell
    may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must share one (B, H, N, d) shape, got {[tuple(t.shape) for t in (q, k, v)]}")
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be positive, got block_q={block_q}, block_k={block_k}")
    B, H, N, d = q.shape
    work = torch.promote_types(q.dtype, torch.float32)
    scale = 1.0 / math.sqrt(d)
    o = torch.empty(B, H, N, d, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, H, N, dtype=work, device=q.device)
    for i in range(0, N, block_q):
        q_blk = q[:, :, i:i + block_q].to(work) * scale
        rows = torch.arange(i, i + q_blk.shape[2], device=q.device)
        m = torch.full(q_blk.shape[:3], float("-inf"), dtype=work, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros_like(q_blk)
        last = min(N, i + block_q) if causal else N  # causal: keys after the block's last row are skipped
        for j in range(0, last, block_k):
            k_blk, v_blk = k[:, :, j:j + block_k].to(work), v[:, :, j:j + block_k].to(work)
            s = q_blk @ k_blk.transpose(-2, -1)
            if causal:
                cols = torch.arange(j, j + k_blk.shape[2], device=q.device)
                s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            shift = m_new.masked_fill(m_new == float("-inf"), 0.0)  # a row masked so far: no NaN
            p = torch.exp(s - shift[..., None])
            rescale = torch.exp(m - shift)
            l = rescale * l + p.sum(dim=-1)
            acc = rescale[..., None] * acc + p @ v_blk
            m = m_new
        o[:, :, i:i + block_q] = (acc / l[..., None]).to(q.dtype)
        lse[:, :, i:i + block_q] = m + torch.log(l)
    return o, lse
    ### END SOLUTION


# %% test="test_flash_attention_forward" points=1 checks="flash_attention_forward"
q, k, v = (t.double() for t in qkv(B=2, H=3, N=64, d=16, seed=1))
o_ref, lse_ref = attention_naive(q, k, v)
for bq, bk in ((64, 64), (32, 16), (16, 32)):  # one block, then several: N = 64 is a multiple of each
    o, lse = flash_attention_forward(q.float(), k.float(), v.float(), block_q=bq, block_k=bk)
    assert o.shape == (2, 3, 64, 16) and lse.shape == (2, 3, 64), "o is (B, H, N, d), lse is (B, H, N)"
    torch.testing.assert_close(o.double(), o_ref, atol=1e-5, rtol=1e-4,
                               msg=f"blocks {bq}/{bk}: o differs; is the running output rescaled by exp(m - m_new)?")
    torch.testing.assert_close(lse.double(), lse_ref, atol=1e-5, rtol=1e-4, msg="lse = m + log(l)")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch10_flash_attention", "test_flash_attention_forward", globals())
### END HIDDEN TESTS

# %% test="test_flash_attention_forward_edge_cases" points=1 checks="flash_attention_forward"
q, k, v = (t.double() for t in qkv(B=2, H=3, N=70, d=16, seed=1))  # N = 70: the last blocks are short
for causal in (False, True):
    o_ref, lse_ref = attention_naive(q, k, v, causal)
    o, lse = flash_attention_forward(q.float(), k.float(), v.float(), causal, block_q=32, block_k=16)
    assert torch.isfinite(o).all(), "NaN or inf in o: a fully masked row in a tile gives exp(-inf - (-inf))"
    torch.testing.assert_close(o.double(), o_ref, atol=1e-5, rtol=1e-4,
                               msg=f"causal={causal}: o differs; do the short last blocks stop at N?")
    torch.testing.assert_close(lse.double(), lse_ref, atol=1e-5, rtol=1e-4, msg="lse = m + log(l)")
o, _ = flash_attention_forward(q.float(), k.float(), v.float(), causal=True)
torch.testing.assert_close(o[:, :, 0], v[:, :, 0].float(), msg="causal: row 0 sees key 0 only, so o[0] = v[0]")
o, lse = flash_attention_forward(q, k, v, causal=True)
assert o.dtype == lse.dtype == torch.float64, "float64 inputs: o and lse in float64 (accumulate in float64)"
o, lse = flash_attention_forward(q.half(), k.half(), v.half())
assert o.dtype == torch.float16 and lse.dtype == torch.float32, "float16 inputs: o in float16, lse in float32"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch10_flash_attention", "test_flash_attention_forward_edge_cases", globals())
### END HIDDEN TESTS

# %% test="test_flash_attention_forward_memory" points=1 checks="flash_attention_forward"
q, k, v = qkv(B=1, H=1, N=1024, d=16, seed=2)
for causal in (False, True):
    with LargestTensor() as big:
        flash_attention_forward(q, k, v, causal, block_q=64, block_k=64)
    assert big.elements < 1024 * 1024, \
        f"causal={causal}: an operator created a tensor of shape {big.shape}; nothing of N × N elements may exist"
    assert big.elements < 64 * 1024, \
        f"causal={causal}: a tensor of shape {big.shape} is a whole row of tiles (64 × N elements or more): " \
        "inside each query block, loop over the key blocks"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch10_flash_attention", "test_flash_attention_forward_memory", globals())
### END HIDDEN TESTS

# %% [markdown]
# ### Measure it: the largest tensor, the FLOPs, fp16
#
# `LargestTensor` sees every tensor PyTorch creates. The largest one made by the tiled forward is
# a tile or an output; the naive one makes $N \times N$ tensors. FLOPs (matmuls only) are the same:
# the algorithm is exact, it only changes the order of the work, and causal skipping removes the
# tiles above the diagonal.

# %%
q, k, v = qkv(B=1, H=2, N=1024, d=64)
rows, tiled_flops = [], {}
for name, fn in (("naive", attention_naive), ("tiled, blocks 128", lambda *a: flash_attention_forward(*a, 128, 128))):
    for causal in (False, True):
        with LargestTensor() as big, flop_counter() as flops:
            fn(q, k, v, causal)
        rows.append(f"| {name} | {causal} | {big.shape} = {big.elements * 4 / KB:,.0f} KB | "
                    f"{flops.get_total_flops() / 1e6:,.1f} |")
        if name.startswith("tiled"):
            tiled_flops[causal] = flops.get_total_flops()
display(Markdown("B=1, H=2, N=1024, d=64\n\n| forward | causal | largest tensor created | MFLOP |\n|---|---|---|---|\n"
                 + "\n".join(rows)))
tiles = 1024 // 128
print(f"causal tiled forward: {tiled_flops[True] / tiled_flops[False]:.1%} of the non-causal FLOPs; "
      f"tiles visited (T² + T) / 2 = {(tiles ** 2 + tiles) // 2} of T² = {tiles ** 2}: {(tiles ** 2 + tiles) / 2 / tiles ** 2:.1%}")

# %% [markdown]
# Non-causal, the FLOPs are identical, $4 B H N^2 d$. Causal, the tiled version computes the
# diagonal tiles in full and skips the rest: $(T^2 + T)/2$ of the $T^2$ tiles for $T = N/128$
# blocks (the last line above); the naive version computes the masked half anyway.
#
# **Numerics.** With large scores (sharp attention, or fp16 activations), a softmax that
# exponentiates before normalising overflows: $e^{12} > 65504$, the largest fp16 number. The
# online softmax only ever exponentiates $S - m \le 0$.

# %%
q16, k16, v16 = (t[:, :, :128] for t in qkv(B=1, H=2, N=128, d=64, seed=2))
q16 = q16 * 4  # scores up to about ±40
ref, _ = attention_naive(q16.double(), k16.double(), v16.double())
s16 = (q16.half() @ k16.half().transpose(-2, -1)) / 8
naive16 = (torch.exp(s16) / torch.exp(s16).sum(-1, keepdim=True)) @ v16.half()
flash16, _ = flash_attention_forward(q16.half(), k16.half(), v16.half())
for name, out in (("exp, then normalise (fp16)", naive16), ("online softmax (fp16 inputs)", flash16)):
    bad = (~torch.isfinite(out)).any(-1).float().mean().item()
    err = (out.double() - ref).abs().nan_to_num(float("inf")).max().item()
    print(f"{name:>29}: rows with inf/NaN {bad:6.1%}, max error {err:.2g}")
print(f"largest score {s16.float().abs().max().item():.1f}, largest fp16 number {torch.finfo(torch.float16).max:,.0f}")

# %% [markdown]
# ## 5. The backward pass: recompute instead of store
#
# Given $dO$, standard backward uses the stored $P$:
# $dV = P^\top dO$, $dP = dO\, V^\top$, $dS_{ij} = P_{ij}(dP_{ij} - D_i)$ with $D_i = \sum_j P_{ij} dP_{ij}$,
# then $dQ = \tau\, dS\, K$ and $dK = \tau\, dS^\top Q$ (the $\tau$ comes from $S = \tau QK^\top$).
# FlashAttention stores only $Q, K, V, O$ and $L$, and per tile **recomputes**
# $P_{ij} = e^{\tau q_i^\top k_j - L_i}$, already normalised thanks to the log-sum-exp. One more
# identity removes the last row-wide sum: $D_i = \sum_j P_{ij}\, dO_i^\top v_j = dO_i^\top O_i$, so
#
# $$D = \mathrm{rowsum}(dO \circ O),$$
#
# computed once, before the loop, from the *normalised* output $O$. Then every tile is independent:
# loop over key blocks and query blocks, accumulate $dV_j$, $dK_j$ and $dQ_i$. Causal: the same
# tiles are skipped as in the forward pass, and the masked entries of $P$ are exactly 0. As for the
# forward pass, three graded cells: the gradients, the edge cases and the memory rule.

# %% exercise="flash_attention_backward"
def flash_attention_backward(q, k, v, o, lse, do, causal=False, block_q=32, block_k=32):
    """Gradients of attention, recomputing P tile by tile from the saved log-sum-exp.

    Args:
        q, k, v: (B, H, N, d) inputs of the forward pass.
        o: (B, H, N, d) its output; lse: (B, H, N) its log-sum-exp (as returned by
            ``flash_attention_forward``).
        do: (B, H, N, d) gradient of the loss with respect to o.
        causal, block_q, block_k: as in ``flash_attention_forward``.

    Returns:
        (dq, dk, dv), each (B, H, N, d) in the dtype of its input. No tensor of N × N elements is
        ever created.

    Graded in three cells, on float32 inputs with d = 16 unless said otherwise, o and lse those of exact
    attention and a random do; dq, dk and dv are compared with float64 autograd and must be finite. Each cell
    first calls the function at (B, H, N, d) = (1, 2, 128, 16), causal and not, with blocks of 32 and 16: there
    no torch operator may create a tensor of N² elements or more, whatever its shape (a view counts as the
    whole storage it views), and fused attention may not run; either fails all three cells. Their gradients
    are compared too: the non-causal call's in every cell, the causal call's in the edge-case cell. The
    edge-case and memory cells count once the gradients cell passes.
      gradients: non-causal, N = 64 or 96, a multiple of both block sizes: one tile covering everything, then
        block_q above, equal to and below block_k.
      edge cases: N = 37, 70, 77 or 100 (ragged last blocks, one block larger than N); causal at N = 70, 77,
        96 and 100 with block_q above, equal to and below block_k; float64 inputs (float64 gradients, to
        float64 precision).
      memory: at (1, 4, N, 16), N drawn at grading time between 3072 and 4096 (a multiple of 128), non-causal
        with blocks of 128: while the call runs, the process's memory (read from outside it) may rise by no
        more than dq, dk and dv plus one and a half rows of tiles (4 × 128 × N float32 numbers each). A key
        block against all N queries at once, a query block against all keys, or anything N × N takes more:
        work tile by tile. That call's dq (at query rows), dk and dv (at key rows) are compared on rows drawn
        at grading time. Defining the function allocates nothing, and a call keeps nothing for later calls
        (no caches).
    Fused attention, torch's attention layers, NumPy and the course's kernels are refused. Each graded cell
    may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    B, H, N, d = q.shape
    work = torch.promote_types(q.dtype, torch.float32)
    scale = 1.0 / math.sqrt(d)
    delta = (do.to(work) * o.to(work)).sum(dim=-1)  # D = rowsum(dO ∘ O), (B, H, N)
    dq = torch.zeros(B, H, N, d, dtype=work, device=q.device)
    dk, dv = torch.zeros_like(dq), torch.zeros_like(dq)
    for j in range(0, N, block_k):
        k_blk, v_blk = k[:, :, j:j + block_k].to(work), v[:, :, j:j + block_k].to(work)
        cols = torch.arange(j, j + k_blk.shape[2], device=q.device)
        first = (j // block_q) * block_q if causal else 0  # causal: earlier query blocks never see these keys
        for i in range(first, N, block_q):
            q_blk, do_blk = q[:, :, i:i + block_q].to(work), do[:, :, i:i + block_q].to(work)
            s = (q_blk @ k_blk.transpose(-2, -1)) * scale
            if causal:
                rows = torch.arange(i, i + q_blk.shape[2], device=q.device)
                s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
            p = torch.exp(s - lse[:, :, i:i + block_q, None].to(work))  # normalised: exp(S - L)
            dv[:, :, j:j + block_k] += p.transpose(-2, -1) @ do_blk
            ds = p * (do_blk @ v_blk.transpose(-2, -1) - delta[:, :, i:i + block_q, None])
            dq[:, :, i:i + block_q] += (ds @ k_blk) * scale
            dk[:, :, j:j + block_k] += (ds.transpose(-2, -1) @ q_blk) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
    ### END SOLUTION


# %% test="test_flash_attention_backward" points=1 checks="flash_attention_backward"
q, k, v = (t.double().requires_grad_() for t in qkv(B=2, H=2, N=64, d=16, seed=3))
do = torch.randn(2, 2, 64, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
o_ref, lse_ref = attention_naive(q, k, v)
grads_ref = torch.autograd.grad(o_ref, (q, k, v), do)
for bq, bk in ((64, 64), (32, 16), (16, 32)):  # one tile, then several: N = 64 is a multiple of each
    grads = flash_attention_backward(*(t.detach().float() for t in (q, k, v, o_ref, lse_ref, do)),
                                     block_q=bq, block_k=bk)
    for name, g, r in zip(("dq", "dk", "dv"), grads, grads_ref):
        assert g.shape == r.shape, f"{name} has shape {tuple(g.shape)}, expected {tuple(r.shape)}"
        torch.testing.assert_close(g.double(), r, atol=1e-4, rtol=1e-3,
                                   msg=f"{name} differs (blocks {bq}/{bk}): "
                                       "D = rowsum(dO ∘ O), P = exp(τ S − L), τ in dq and dk")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch10_flash_attention", "test_flash_attention_backward", globals())
### END HIDDEN TESTS

# %% test="test_flash_attention_backward_edge_cases" points=1 checks="flash_attention_backward"
q, k, v = (t.double().requires_grad_() for t in qkv(B=2, H=2, N=77, d=16, seed=3))  # N = 77: short last blocks
do = torch.randn(2, 2, 77, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
for causal, (bq, bk) in ((False, (32, 32)), (True, (32, 16)), (True, (16, 32))):
    o_ref, lse_ref = attention_naive(q, k, v, causal)
    grads_ref = torch.autograd.grad(o_ref, (q, k, v), do)
    grads = flash_attention_backward(*(t.detach().float() for t in (q, k, v, o_ref, lse_ref, do)),
                                     causal=causal, block_q=bq, block_k=bk)
    for name, g, r in zip(("dq", "dk", "dv"), grads, grads_ref):
        torch.testing.assert_close(g.double(), r, atol=1e-4, rtol=1e-3,
                                   msg=f"{name} differs (causal={causal}, blocks {bq}/{bk}): masked entries "
                                       "of P are exactly 0, and the short last blocks stop at N")
grads = flash_attention_backward(*(t.detach() for t in (q, k, v, o_ref, lse_ref, do)), causal=True)
assert all(g.dtype == torch.float64 for g in grads), "float64 inputs: float64 gradients (accumulate in float64)"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch10_flash_attention", "test_flash_attention_backward_edge_cases", globals())
### END HIDDEN TESTS

# %% test="test_flash_attention_backward_memory" points=1 checks="flash_attention_backward"
q, k, v = qkv(B=1, H=1, N=1024, d=16, seed=4)
o, lse = flash_attention_forward(q, k, v, causal=True, block_q=64, block_k=64)
with LargestTensor() as big:
    flash_attention_backward(q, k, v, o, lse, torch.randn_like(o), causal=True, block_q=64, block_k=64)
assert big.elements < 1024 * 1024, \
    f"an operator created a tensor of shape {big.shape}; backward recomputes P one tile at a time, never N × N"
assert big.elements < 64 * 1024, \
    f"a tensor of shape {big.shape} is a whole row or column of tiles (64 × N elements or more): work tile by tile"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch10_flash_attention", "test_flash_attention_backward_memory", globals())
### END HIDDEN TESTS

# %% [markdown]
# ### Measure it: the price of recomputation
#
# The forward pass runs two $N \times N \times d$ matmuls ($QK^\top$ and $PV$). Standard backward runs
# four ($dV$, $dP$, $dQ$, $dK$); FlashAttention adds a fifth, $S = QK^\top$ again. Forward + backward:
# 7 matmuls against 6, in exchange for never writing or reading $P$.

# %%
q, k, v = qkv(B=1, H=2, N=512, d=64, requires_grad=True)
do = torch.randn_like(q)
naive = measure(lambda: attention_naive(q, k, v)[0], grad=do)
with torch.no_grad(), flop_counter() as f_fwd:
    o, lse = flash_attention_forward(q, k, v, block_q=128, block_k=128)
with torch.no_grad(), flop_counter() as f_bwd:
    flash_attention_backward(q, k, v, o, lse, do, block_q=128, block_k=128)
flash_flops = (f_fwd.get_total_flops(), f_bwd.get_total_flops())
unit = 2 * 2 * 512 * 512 * 64  # one N×N×d matmul, 2 heads
print(f"naive : forward {naive.forward_flops / unit:.1f} + backward {naive.backward_flops / unit:.1f} matmul units")
print(f"tiled : forward {flash_flops[0] / unit:.1f} + backward {flash_flops[1] / unit:.1f} matmul units "
      f"({sum(flash_flops) / naive.total_flops - 1:+.0%} FLOPs)")

# %% [markdown]
# ## 6. Exercise: the autograd Function
#
# Wire the two into `FlashAttention`, a `torch.autograd.Function` called as
# `FlashAttention.apply(q, k, v, causal, block_q, block_k)` (the last three optional). Its forward
# saves exactly `q, k, v, o, lse` with `ctx.save_for_backward` (the block sizes and the causal
# flag go on `ctx` as plain attributes); its backward returns one gradient per input of `forward`
# (`None` for the non-tensors). Two graded cells: the values and gradients, and what is saved.

# %% exercise="FlashAttention"
class FlashAttention(torch.autograd.Function):
    """Differentiable tiled attention: ``FlashAttention.apply(q, k, v, causal=False, block_q=32, block_k=32)``.

    q, k, v are (B, H, N, d); returns o (B, H, N, d). Saves for backward only q, k, v, o and the
    log-sum-exp (B, H, N): Θ(N d) memory per head instead of the Θ(N²) of standard attention.

    Graded in two cells, on float32 inputs with N = 45, 70 or 77 and d = 16 or 32, through apply with causal
    and both block sizes given, with causal alone and with neither (the defaults); the output must be attached
    to the autograd graph. The memory cell counts once the values cell passes.
      values: the output and the gradients reaching q, k and v are compared with float64 attention and
        autograd.
      memory: once FlashAttention.apply(q, k, v, False, 128, 128) at (B, H, N, d) = (1, 1, N, 64), N drawn at
        grading time between 2048 and 3072 (a multiple of 128), has returned, the process (read from outside
        it, q, k and v held already) may hold no more than o, lse and a quarter of one N × N float32 tensor
        beyond what it held before; backward through that very o (the loss sum(o · w), w random) must then
        give the right gradients: o and the gradients are compared on rows drawn at grading time. What
        forward saves, counted inside your process, only explains a failed reading. Defining the class allocates nothing, and a call keeps nothing for later calls.
    Fused attention, torch's attention layers, NumPy and the course's kernels are refused. Each graded cell
    may use 60 s and 4 GiB.
    """

    ### BEGIN SOLUTION
    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=32, block_k=32):
        o, lse = flash_attention_forward(q, k, v, causal, block_q, block_k)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.block_q, ctx.block_k = causal, block_q, block_k
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, ctx.causal, ctx.block_q, ctx.block_k)
        return dq, dk, dv, None, None, None
    ### END SOLUTION


# %% test="test_FlashAttention" points=1 checks="FlashAttention"
q, k, v = qkv(B=1, H=2, N=45, d=16, seed=5, requires_grad=True)
do = torch.randn_like(q)
for causal in (False, True):
    o = FlashAttention.apply(q, k, v, causal, 16, 8)
    grads = torch.autograd.grad(o, (q, k, v), do)
    refs = torch.autograd.grad(attention_naive(q, k, v, causal)[0], (q, k, v), do)
    for name, g, r in zip(("dq", "dk", "dv"), grads, refs):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-4, msg=f"{name} differs from autograd (causal={causal})")
o = FlashAttention.apply(q, k, v)  # the defaults: causal=False, blocks of 32
torch.testing.assert_close(o, attention_naive(q, k, v)[0], atol=1e-5, rtol=1e-4, msg="defaults: causal=False")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch10_flash_attention", "test_FlashAttention", globals())
### END HIDDEN TESTS

# %% test="test_FlashAttention_memory" points=1 checks="FlashAttention"
q, k, v = qkv(B=1, H=2, N=45, d=16, seed=5, requires_grad=True)
with saved_tensors() as rec:
    FlashAttention.apply(q, k, v, True)
expected = 4 * (4 * q.nelement() + q.nelement() // 16)
assert rec.activation_bytes == expected, \
    f"{rec.activation_bytes} bytes saved for backward, expected {expected}: q, k, v, o and lse only"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch10_flash_attention", "test_FlashAttention_memory", globals())
### END HIDDEN TESTS

# %% [markdown]
# ### Measure it: saved bytes against $N$
#
# What autograd keeps for backward, naive against FlashAttention, for one layer of $H = 2$ heads
# with $d = 64$ in float32.

# %%
SEQ = fast([256, 512, 1024, 2048], [128, 256, 512])
saved_rows = []
for n in SEQ:
    q, k, v = qkv(B=1, H=2, N=n, d=64, requires_grad=True)
    with saved_tensors() as naive_rec:
        attention_naive(q, k, v, causal=True)
    with saved_tensors() as flash_rec:
        FlashAttention.apply(q, k, v, True, 128, 128)
    saved_rows.append((n, naive_rec.activation_bytes, flash_rec.activation_bytes))
display(Markdown("| N | naive | FlashAttention | ratio |\n|---|---|---|---|\n" + "\n".join(
    f"| {n:,} | {a / KB:,.0f} KB | {b / KB:,.0f} KB | {a / b:.1f}× |" for n, a, b in saved_rows)))
fig, ax = plt.subplots(figsize=(6, 3.3))
ns = [r[0] for r in saved_rows]
ax.loglog(ns, [r[1] / MB for r in saved_rows], "o-", color="#c44e52", label="naive (measured)")
ax.loglog(ns, [r[2] / MB for r in saved_rows], "s-", color="#4c72b0", label="FlashAttention (measured)")
ax.loglog(ns, [saved_rows[0][1] / MB * (n / ns[0]) ** 2 for n in ns], ":", color="gray", label="∝ N²")
ax.set_xlabel("sequence length N")
ax.set_ylabel("saved for backward (MB)")
ax.legend(frameon=False, fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# The naive curve follows $N^2$ (slope 2 on a log-log plot); FlashAttention saves
# $4 \cdot BHNd + BHN$ numbers, a straight line of slope 1: the ratio doubles with every doubling
# of $N$.
#
# ## 7. Exercise: the forward kernel in Triton
#
# In Triton a **program** computes one tile of the output; a launch runs a grid of programs. Here
# program $(i, bh)$ owns the query rows `rows` of block $i$ for head $bh$. Inside it, `tl.load` and
# `tl.store` move whole blocks between memory and registers/SRAM through *pointers*: `q_ptr + offsets`
# with an offset tensor, and a `mask` (with `other=0.0`) for rows past $N$. `tl.dot(a, b)` multiplies
# two blocks, `tl.trans` transposes, `tl.max`/`tl.sum(x, 1)` reduce a row, `tl.where(cond, x, y)`
# selects, `tl.exp`, `tl.maximum`, `tl.minimum` work elementwise, and `x[:, None]` broadcasts as in
# PyTorch. `if CAUSAL:` on a `tl.constexpr` is decided when the kernel is compiled. Block sizes
# must be powers of two, which is why the kernel masks instead of slicing.
#
# The launcher (`launch_flash_forward`, in the setup cell) and the kernel's beginning and end are
# given. Complete the loop over key blocks: load the `K` and `V` block, compute the scores
# (`tl.dot(q, tl.trans(k), input_precision="ieee")`, exact float32, times `scale`), mask columns
# $\ge N$ and, if `CAUSAL`, columns after the row, then update `m_i`, `l_i`, `acc` as in section 3.
# Skip the key blocks a causal program never needs. Rows in the kernel always see key 0 first, so
# the running max is finite after the first block.
#
# **Bounds.** Every load and store of the last, ragged block is masked. A `tl.load` without a mask
# reads all `BLOCK_N` rows of the block, past the end of the tensor for the last head: masking
# those scores with -inf afterwards gives the right numbers, but on a GPU the load itself touches
# memory that is not the tensor's (garbage in the best case, an illegal-address crash in the
# worst). Out-of-bounds accesses are graded: the grader checks the address of every lane of every
# load and store the interpreter runs against the tensor it belongs to.
#
# **The kernel does the work.** The grader also checks, in every call, that your kernel is launched
# once, that its loads read only $Q$, $K$ and $V$ and its stores write every element of the output
# (it records which elements the interpreter's stores wrote), and that PyTorch does nothing around
# the launch but allocate, view or copy tensors. Three graded cells: the values, the memory rule and
# the bounds.
#
# The kernel is defined *inside* `flash_attention_triton` so that this cell defines one name; on a
# GPU, Triton's cache compiles it once. Here it runs in Triton's interpreter, on NumPy, one program
# after another: slow, but exactly the code that compiles on a GPU.

# %% exercise="flash_attention_triton"
def flash_attention_triton(q, k, v, causal=False):
    """Attention forward by a Triton kernel: q, k, v (B, H, N, d) float32, d a power of two >= 16.

    Returns o (B, H, N, d) = softmax(q kᵀ / sqrt(d)) v, causal if asked. Runs compiled on a GPU and
    in Triton's interpreter on a CPU (blocks of 32 × 32).

    Graded in three cells, in the interpreter, on float32 inputs. In every call the kernel computes the
    attention: the call launches one kernel (launch_flash_forward does), whose loads read only q, k and v
    and whose stores write every element of the o returned, and nothing else; around the launch PyTorch may
    only allocate, view or copy tensors (empty, zeros, full and their _like and new_ forms, view, reshape,
    contiguous, clone, to). A kernel breaking these rules, any other torch operator (arithmetic, a matrix
    product, exp, a reduction, an in-place write) or one creating a tensor of N² elements or more fails the
    cell. The lanes of a load or store outside the tensor it belongs to are never read or written (a load
    gives 0 there). The memory and bounds cells count once the values cell passes.
      values: N = 70 or 100 (a ragged last key block) and d = 16 or 32, causal and not, including inputs whose
        row maxima rise from key block to key block; o is compared with float64 attention and must be finite.
      memory: at (B, H, N, d) = (1, 1, N, 16), causal, N drawn at grading time between 768 and 1024, the
        process's memory may rise by less than one N × N float32 tensor while the call runs (read from outside
        it), and that call's o is compared with float64 attention on rows drawn at grading time. The call is
        not traced: its launch, loads and stores are checked, its torch operators are not. Defining the
        function allocates nothing, and a call keeps nothing for later calls (no caches).
      bounds: at N = 70 and 100, d = 16 or 32, causal and not, every lane that the mask of a load, store or
        atomic leaves on must address an element inside the tensor it belongs to (one of the kernel's tensor
        arguments).
    Fused attention, torch's attention layers, NumPy and the course's kernels are refused. Each graded cell
    may use 60 s and 4 GiB.
    """

    @triton.jit
    def flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, N, scale, HEAD_DIM: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        pid_m, bh = tl.program_id(0), tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # this program's query rows
        dims = tl.arange(0, HEAD_DIM)
        head = bh * N * HEAD_DIM  # where head bh starts in every (B, H, N, d) tensor
        q = tl.load(q_ptr + head + rows[:, None] * HEAD_DIM + dims[None, :], mask=rows[:, None] < N, other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of each row
        l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp(s - m_i)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # running unnormalised output
        ### BEGIN SOLUTION
        end = N
        if CAUSAL:
            end = tl.minimum(N, pid_m * BLOCK_M + BLOCK_M)  # later key blocks are entirely masked
        for first in range(0, end, BLOCK_N):
            keys = first + tl.arange(0, BLOCK_N)
            k_blk = tl.load(k_ptr + head + keys[:, None] * HEAD_DIM + dims[None, :], mask=keys[:, None] < N, other=0.0)
            v_blk = tl.load(v_ptr + head + keys[:, None] * HEAD_DIM + dims[None, :], mask=keys[:, None] < N, other=0.0)
            scores = scale * tl.dot(q, tl.trans(k_blk), input_precision="ieee")
            visible = keys[None, :] < N
            if CAUSAL:
                visible = visible & (keys[None, :] <= rows[:, None])
            scores = tl.where(visible, scores, float("-inf"))
            new_max = tl.maximum(m_i, tl.max(scores, 1))
            weights = tl.exp(scores - new_max[:, None])
            correction = tl.exp(m_i - new_max)
            acc = acc * correction[:, None] + tl.dot(weights, v_blk, input_precision="ieee")
            l_i = l_i * correction + tl.sum(weights, 1)
            m_i = new_max
        ### END SOLUTION
        out = acc / l_i[:, None]
        tl.store(o_ptr + head + rows[:, None] * HEAD_DIM + dims[None, :], out, mask=rows[:, None] < N)

    return launch_flash_forward(flash_fwd_kernel, q, k, v, causal)


# %% test="test_flash_attention_triton" points=1 checks="flash_attention_triton"
q, k, v = qkv(B=1, H=2, N=100, d=16, seed=6)
for causal in (False, True):
    o = flash_attention_triton(q, k, v, causal)
    o_ref, _ = attention_naive(q.double(), k.double(), v.double(), causal)
    assert torch.isfinite(o).all(), "NaN or inf in the output: are masked scores set to -inf before the max?"
    torch.testing.assert_close(o.double(), o_ref, atol=2e-5, rtol=1e-4,
                               msg=f"causal={causal}: o differs from standard attention")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch10_flash_attention", "test_flash_attention_triton", globals())
### END HIDDEN TESTS

# %% test="test_flash_attention_triton_memory" points=1 checks="flash_attention_triton"
q, k, v = qkv(B=1, H=1, N=256, d=16, seed=7)
with LargestTensor() as big:
    o = flash_attention_triton(q, k, v, True)
assert big.elements < 256 * 256, \
    f"an operator created a tensor of shape {big.shape}: the kernel keeps its tiles on chip, nothing is N × N"
# Allocation, views and copies only (new_empty, set_ and copy_: the interpreter's own handling of the arguments).
computed = big.ops - {"empty", "empty_like", "new_empty", "set_", "copy_", "zeros", "zeros_like", "view", "clone"}
assert not computed, f"PyTorch ran {sorted(computed)} during the call: the attention is computed by your kernel"
torch.testing.assert_close(o.double(), attention_naive(q.double(), k.double(), v.double(), True)[0],
                           atol=2e-5, rtol=1e-4, msg="causal: o differs from standard attention")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch10_flash_attention", "test_flash_attention_triton_memory", globals())
### END HIDDEN TESTS

# %% test="test_flash_attention_triton_bounds" points=1 checks="flash_attention_triton"
# q, k, v live in one buffer, each followed by NaN: a load that runs past the end of v reads NaN into o.
size_t, guard_t = 2 * 70 * 16, 32 * 16
buffer_t = torch.full((3, size_t + guard_t), float("nan"))
q, k, v = (buffer_t[i, :size_t].view(1, 2, 70, 16) for i in range(3))
for guarded_t, t in zip((q, k, v), qkv(B=1, H=2, N=70, d=16, seed=8)):
    guarded_t.copy_(t)
for causal in (False, True):
    o = flash_attention_triton(q, k, v, causal)
    assert torch.isfinite(o).all(), \
        f"causal={causal}: NaN in o, read past the end of v: mask the K and V loads of the last, ragged block " \
        "(mask=keys[:, None] < N, other=0.0); the grader also checks every address of every load and store"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch10_flash_attention", "test_flash_attention_triton_bounds", globals())
### END HIDDEN TESTS

# %% [markdown]
# ### The full kernels: forward and backward in Triton
#
# `kernels/ch10_flash_attention.py` holds the complete version: the forward kernel (which also
# stores the log-sum-exp), a backward made of three kernels ($D$; $dK, dV$ with one program per key
# block; $dQ$ with one program per query block, so that no two programs write the same rows) and an
# `autograd.Function`. Against float64 autograd, in the interpreter:

# %%
from kernels.ch10_flash_attention import compare_with_reference

for causal in (False, True):
    errors = compare_with_reference(B=1, H=2, N=fast(100, 70), d=16, causal=causal)
    print(f"causal={causal!s:>5}: max abs error " + ", ".join(f"{n} {e:.1e}" for n, e in errors.items()))
print("interpreter" if kernels.INTERPRETED else "compiled on the GPU")

# %% [markdown]
# On a GPU, `python -m kernels.ch10_flash_attention` compares forward and forward + backward
# throughput (TFLOP/s) and peak memory with PyTorch's fused `scaled_dot_product_attention` and
# with naive attention for $N$ from 512 to 16K. The interpreter's timings say nothing about a GPU,
# so this notebook does not time kernels.
#
# ## 8. Play with it
#
# **Memory and HBM traffic.** Per head, in bf16: standard attention keeps $P$ ($N^2$ numbers) and
# moves $4Nd + 4N^2$ numbers through HBM (the accounting of the paper's Algorithm 0). The tiled
# forward keeps $O(N)$ (the log-sum-exp) beyond its inputs and outputs, reads $Q$ once, writes $O$
# once, and reads all of $K, V$ once per query block: $2Nd + 2Nd \lceil N / B \rceil$ numbers for
# blocks of $B$ rows. A bigger block means fewer passes over $K, V$, but a tile must fit in SRAM:
# $Q$, $K$, $V$ blocks, the accumulator and the $B \times B$ scores (shown against an A100's 192 KB).

# %% tags=["demo"]
def io_model(n, d, block):
    naive_mem, flash_mem = 2 * n * n, 4 * n  # bf16 P vs float32 log-sum-exp, bytes per head
    naive_io = 2 * (4 * n * d + 4 * n * n)
    flash_io = 2 * (2 * n * d + 2 * n * d * math.ceil(n / block))
    sram = 4 * (4 * block * d + block * block)
    return naive_mem, flash_mem, naive_io, flash_io, sram


def draw_io(axes, n=4096, block=64, d=64):
    ax_mem, ax_io = axes
    grid = np.unique(np.geomspace(256, 65536, 25).astype(int))
    curves = np.array([io_model(x, d, block)[:4] for x in grid], dtype=float)
    here = io_model(n, d, block)
    for ax, (a, b), title in ((ax_mem, (0, 1), "memory beyond inputs/outputs"), (ax_io, (2, 3), "HBM traffic (model)")):
        ax.loglog(grid, curves[:, a] / MB, color="#c44e52", label="standard")
        ax.loglog(grid, curves[:, b] / MB, color="#4c72b0", label=f"tiled, block {block}")
        ax.plot([n, n], [here[a] / MB, here[b] / MB], "ko", ms=4)
        ax.axvline(n, color="gray", lw=0.6)
        ax.set_xlabel("sequence length N (tokens)")
        ax.set_ylabel("MB per head")
        ax.set_title(f"{title}:\n{here[a] / here[b]:,.1f}× at N={n:,}")
        ax.legend(loc="upper left")
    fits = "fits in" if here[4] <= 192 * KB else "exceeds"
    ax_io.text(0.98, 0.02, f"tile needs {here[4] / KB:,.0f} KB of SRAM:\n{fits} 192 KB", transform=ax_io.transAxes,
               ha="right")


slider_plot(draw_io, ncols=2, figsize=(11, 4.4), n=(256, 65536, 256), block=(16, 256, 16), d=[64, 128],
            defaults={"n": 4096, "block": 64},
            labels={"n": lambda v: f"sequence length N: {v:,} tokens", "block": lambda v: f"tile: {v} rows",
                    "d": "head dimension d"},
            explain={"n": "tokens per sequence: the standard scores grow with N²",
                     "block": "rows of Q (and of K, V) per tile held in fast on-chip memory",
                     "d": "features per head"},
            notice={"n": lambda n, block, d: (lambda m: f"N = {n:,}: tiled attention keeps {m[0] / m[1]:,.0f}× less "
                                                         f"memory and moves {m[2] / m[3]:.1f}× fewer bytes")(
                io_model(n, d, block))})

# %% [markdown]
# **Which tiles are visited.** The forward pass in program order: each row of tiles is one query
# block (one Triton program, or one iteration of your outer loop), left to right over key blocks.
# With a causal mask the tiles above the diagonal are never touched; the tiles on it are computed
# in full and masked inside. Move `progress` to step through the schedule.

# %% tags=["demo"]
def draw_tiles(ax, n=512, block=64, causal=True, progress=60):
    t = math.ceil(n / block)
    order = [(i, j) for i in range(t) for j in range(t) if not causal or j * block <= min(n, (i + 1) * block) - 1]
    done = order[:round(len(order) * progress / 100)]
    state = np.full((t, t), 0.0)  # 0 skipped, 1 to do, 2 done, 3 current
    for i, j in order:
        state[i, j] = 1
    for i, j in done:
        state[i, j] = 2
    if done:
        state[done[-1]] = 3
    cmap = plt.matplotlib.colors.ListedColormap(["#eeeeee", "#c6dbef", "#4c72b0", "#dd8452"])
    ax.imshow(state, cmap=cmap, vmin=0, vmax=3)
    ax.set_xlabel("key block j")
    ax.set_ylabel("query block i")
    ax.set_title(f"{len(done)} of {len(order)} tiles visited;\n{t * t - len(order)} of {t * t} skipped "
                 f"({'causal' if causal else 'full'})")


slider_plot(draw_tiles, figsize=(5, 4.6), n=(64, 1024, 64), block=(16, 128, 16), causal=[True, False],
            progress=(0, 100, 5), defaults={"n": 512, "block": 64, "progress": 60},
            labels={"n": lambda v: f"sequence length N: {v} tokens", "block": lambda v: f"tile: {v} × {v}",
                    "causal": "causal mask", "progress": lambda v: f"progress: {v}%"},
            explain={"n": "tokens per sequence", "block": "query and key rows per tile",
                     "causal": "skip the tiles above the diagonal", "progress": "how far the outer loop has gone"},
            notice={"causal": lambda n, block, causal, progress: (
                f"{'causal' if causal else 'full'}: {math.ceil(n / block) ** 2} tiles of {block}×{block}, the "
                f"N×N scores never stored")})

# %% [markdown]
# ## 9. What the papers report vs what we measured
#
# Dao, Fu, Ermon, Rudra and Ré, *FlashAttention: Fast and Memory-Efficient Exact Attention with
# IO-Awareness* (NeurIPS 2022). Paper: for GPT-2 medium attention ($N = 1024$, $d = 64$, 16 heads, batch 64,
# A100) forward + backward, standard attention does 66.6 GFLOPs with 40.3 GB of HBM reads and
# writes in 41.7 ms; FlashAttention 75.2 GFLOPs, 4.4 GB, 7.3 ms (Fig. 2). Memory grows linearly
# with $N$, up to 20× below exact-attention baselines; 3× faster GPT-2 training at 1K tokens; first
# better-than-chance Path-X (16K) and Path-256 (64K) results. FlashAttention-2 (Dao 2023) reaches
# 50–73% of the A100's peak FLOP/s.

# %%
n_big, naive_big, flash_big = saved_rows[-1]
flop_ratio = sum(flash_flops) / naive.total_flops
io = io_model(1024, 64, 128)
table = [
    ("forward + backward FLOPs, flash / standard", "75.2 / 66.6 = 1.13×", f"{flop_ratio:.2f}× (matmuls, N=512)",
     75.2 / 66.6, flop_ratio),
    ("HBM traffic, standard / flash (N=1024, d=64)", "40.3 / 4.4 GB = 9.2×",
     f"{io[2] / io[3]:.1f}× forward, IO model with blocks of 128 (not measured)", 40.3 / 4.4, io[2] / io[3]),
    ("saved for backward, standard / flash", "up to 20× (Fig. 3, long N)",
     f"{naive_big / flash_big:.1f}× at N={n_big:,} (measured, grows ∝ N)", 20, naive_big / flash_big),
    ("speed: attention fwd + bwd, GPT-2 training", "41.7 → 7.3 ms (5.7×); 3× end to end",
     "not measured: no GPU here; run python -m kernels.ch10_flash_attention on one"),
    ("FlashAttention-2 utilisation", "50–73% of A100 peak", "not measured: no GPU here"),
    ("longest sequence", "64K (Path-256)", f"{SEQ[-1]:,} on this CPU; memory is linear, so no wall"),
]
literature_table(table, source="papers")
fig, ax = plt.subplots(figsize=(7.5, 3.2))
paired_bars(ax, ["FLOPs\nflash / standard", "HBM traffic\nstandard / flash", "saved memory\nstandard / flash"],
            [r[3] for r in table[:3]], [r[4] for r in table[:3]], source="papers")
ax.set_ylabel("ratio (×)")
fig.tight_layout()
plt.show()

# %%
from coursekit.timing import compare, distinct, time_it

N_TIME = fast(1024, 512)
q, k, v = qkv(B=1, H=2, N=N_TIME, d=64)
with torch.no_grad():
    cpu_naive = time_it(lambda: attention_naive(q, k, v), repeats=fast(7, 3))
    cpu_tiled = time_it(lambda: flash_attention_forward(q, k, v, block_q=128, block_k=128), repeats=fast(7, 3))
print(f"forward on this CPU, B=1, H=2, N={N_TIME:,}, d=64: naive {cpu_naive}, tiled (blocks of 128) {cpu_tiled}")
print("tiled / naive:", compare(cpu_tiled, cpu_naive, ("tiled", "naive")))
faster = "faster" if cpu_tiled.best < cpu_naive.best else "slower"
display(Markdown(f"On this CPU the tiled PyTorch forward is {faster} than the naive one, "
                 + ("beyond the spread of the repeats." if distinct(cpu_tiled, cpu_naive) else
                    "but within the spread of the repeats: no speed difference can be claimed either way.")))

# %% [markdown]
# The FLOP price of recomputation reproduces (our count is matmuls only; the paper's also counts
# the softmax and masking). The memory saving reproduces in kind: linear against quadratic, the ratio
# doubling with each doubling of $N$; its size depends on $N$ (the paper's 20× is at its longest
# sequences). The traffic ratio is a model here, not a measurement: bytes moved through HBM, and the
# speedups that follow from them, only exist on a GPU. On this CPU every "tile" is a few separate
# PyTorch calls, each writing its result to memory: whatever difference the timing above shows (its
# last line says whether the repeats can carry it) comes from the CPU's caches and from not
# allocating $N \times N$ tensors, not from keeping tiles in SRAM, and predicts nothing for a GPU.
# There the algorithm wins when the tile lives on chip, which is what the Triton kernel is for.
#
# ## 10. Summary
#
# - The scores are scaled by $\tau = 1/\sqrt d$: without it their spread grows as $\sqrt d$ and the
#   softmax saturates, with vanishing gradients.
# - Standard attention materialises $S$ and $P$: $\Theta(N^2)$ memory per head and $\Theta(Nd + N^2)$
#   HBM traffic, and on a GPU that traffic, not the FLOPs, sets the time.
# - The online softmax (running max, running sum, rescaling by $e^{m - m'}$) computes exact attention
#   one key block at a time; only $O$ and the log-sum-exp $L$ are written.
# - Backward recomputes $P = e^{\tau QK^\top - L}$ per tile, with $D = \mathrm{rowsum}(dO \circ O)$:
#   one matmul more (7 against 6), $O(N)$ extra memory instead of $O(N^2)$.
# - Causal masking skips the tiles above the diagonal; masked rows and ragged tails need care
#   (no $-\infty - (-\infty)$, masks for rows and columns past $N$).
# - The same algorithm is a short Triton kernel; with its tiles in SRAM it needs
#   $\Theta(N^2 d^2/M)$ HBM accesses, which is where the papers' speedups come from.
