"""FlashAttention in Triton: exact attention, computed tile by tile, without the N×N matrix.

Forward (Dao et al. 2022, in the loop order of FlashAttention-2): each program owns BLOCK_M query
rows, keeps them on chip, streams the key/value blocks past them with an online softmax (running
max ``m``, running sum ``l``, unnormalised output ``acc``) and writes ``O`` and the log-sum-exp
``L = m + log l``. Backward recomputes ``P = exp(τ Q Kᵀ − L)`` block by block, with
``D = rowsum(dO ∘ O)``: one kernel for D, one for dK and dV (a program per key block), one for dQ
(a program per query block), so that no two programs write the same rows and no atomics are needed.

Inputs are contiguous ``(B, H, N, d)`` tensors with ``d`` a power of two (16..128). Plain pointer
arithmetic: row ``n`` of head ``bh`` starts at ``bh * N * d + n * d``. On the CPU the kernels run in
Triton's interpreter (``import kernels`` switches it on); there ``tl.dot`` on 16-bit inputs is wrong,
so tiles are cast to float32 first, and float32 products use IEEE precision (no TF32) everywhere.

``python -m kernels.ch10_flash_attention`` runs the GPU benchmark (skipped without CUDA).
"""
from __future__ import annotations

import math

import torch

import kernels  # noqa: F401 - switches the Triton interpreter on when there is no GPU
import triton
import triton.language as tl

# --- reference -----------------------------------------------------------------------------------


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False):
    """Standard attention: (B, H, N, d) ×3 -> (o (B, H, N, d), lse (B, H, N) float32 or float64).

    Bytes moved: S and P are (B, H, N, N) tensors written to and read back from memory, Θ(N²) per
    head on top of the Θ(N d) inputs and output; autograd also keeps P for backward.
    """
    acc = torch.promote_types(q.dtype, torch.float32)
    s = (q.to(acc) @ k.to(acc).transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.exp(s - lse[..., None]) @ v.to(acc)
    return o.to(q.dtype), lse


# --- kernels -------------------------------------------------------------------------------------


@triton.jit
def _load_tile(ptr, base, idx, dims, N, HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr):
    """Rows ``idx`` of one head, a (len(idx), HEAD_DIM) tile; rows past N read as 0."""
    tile = tl.load(ptr + base + idx[:, None] * HEAD_DIM + dims[None, :], mask=idx[:, None] < N, other=0.0)
    if UPCAST:  # the interpreter's tl.dot is wrong on 16-bit inputs
        tile = tile.to(tl.float32)
    return tile


@triton.jit
def _flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, N, scale,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      CAUSAL: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    base = bh * N * HEAD_DIM
    q = _load_tile(q_ptr, base, rows, dims, N, HEAD_DIM, UPCAST)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running row max
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp(s - m_i)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # running unnormalised output
    hi = N
    if CAUSAL:  # key blocks entirely right of the diagonal contribute nothing: skip them
        hi = tl.minimum(N, (pid_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(k_ptr, base, cols, dims, N, HEAD_DIM, UPCAST)
        v = _load_tile(v_ptr, base, cols, dims, N, HEAD_DIM, UPCAST)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        keep = cols[None, :] < N
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)  # rescales what was accumulated under the old max
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(o_ptr + base + rows[:, None] * HEAD_DIM + dims[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=rows[:, None] < N)
    tl.store(lse_ptr + bh * N + rows, m_i + tl.log(l_i), mask=rows < N)


@triton.jit
def _flash_bwd_preprocess(o_ptr, do_ptr, delta_ptr, N, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs = bh * N * HEAD_DIM + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    o = tl.load(o_ptr + offs, mask=rows[:, None] < N, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + offs, mask=rows[:, None] < N, other=0.0).to(tl.float32)
    tl.store(delta_ptr + bh * N + rows, tl.sum(o * do, 1), mask=rows < N)  # D = rowsum(dO ∘ O)


@triton.jit
def _recompute_p(q, k, lse, rows, cols, N, scale, CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    """P = exp(τ Q Kᵀ − L) for one tile, zero outside the valid (and causal) region."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    keep = (rows[:, None] < N) & (cols[None, :] < N)
    if CAUSAL:
        keep = keep & (cols[None, :] <= rows[:, None])
    return tl.where(keep, tl.exp(s - lse[:, None]), 0.0)


@triton.jit
def _flash_bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, N, scale,
                           HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           CAUSAL: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    pid_n, bh = tl.program_id(0), tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    base = bh * N * HEAD_DIM
    k = _load_tile(k_ptr, base, cols, dims, N, HEAD_DIM, UPCAST)
    v = _load_tile(v_ptr, base, cols, dims, N, HEAD_DIM, UPCAST)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lo = 0
    if CAUSAL:  # query blocks entirely above the diagonal never see these keys
        lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
    for start_m in range(lo, N, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        q = _load_tile(q_ptr, base, rows, dims, N, HEAD_DIM, UPCAST)
        do = _load_tile(do_ptr, base, rows, dims, N, HEAD_DIM, UPCAST)
        lse = tl.load(lse_ptr + bh * N + rows, mask=rows < N, other=0.0)
        delta = tl.load(delta_ptr + bh * N + rows, mask=rows < N, other=0.0)
        p = _recompute_p(q, k, lse, rows, cols, N, scale, CAUSAL, PRECISION)
        dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PRECISION)  # dV = Pᵀ dO
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])  # dS = P ∘ (dP − D)
        dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)
    kv_offs = base + cols[:, None] * HEAD_DIM + dims[None, :]
    tl.store(dk_ptr + kv_offs, (dk * scale).to(dk_ptr.dtype.element_ty), mask=cols[:, None] < N)
    tl.store(dv_ptr + kv_offs, dv.to(dv_ptr.dtype.element_ty), mask=cols[:, None] < N)


@triton.jit
def _flash_bwd_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, N, scale,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         CAUSAL: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    base = bh * N * HEAD_DIM
    q = _load_tile(q_ptr, base, rows, dims, N, HEAD_DIM, UPCAST)
    do = _load_tile(do_ptr, base, rows, dims, N, HEAD_DIM, UPCAST)
    lse = tl.load(lse_ptr + bh * N + rows, mask=rows < N, other=0.0)
    delta = tl.load(delta_ptr + bh * N + rows, mask=rows < N, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = N
    if CAUSAL:
        hi = tl.minimum(N, (pid_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(k_ptr, base, cols, dims, N, HEAD_DIM, UPCAST)
        v = _load_tile(v_ptr, base, cols, dims, N, HEAD_DIM, UPCAST)
        p = _recompute_p(q, k, lse, rows, cols, N, scale, CAUSAL, PRECISION)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)  # dQ = τ dS K
    tl.store(dq_ptr + base + rows[:, None] * HEAD_DIM + dims[None, :], (dq * scale).to(dq_ptr.dtype.element_ty), mask=rows[:, None] < N)


# --- launchers -----------------------------------------------------------------------------------


def _check_inputs(*tensors: torch.Tensor) -> None:
    q = tensors[0]
    if q.dim() != 4:
        raise ValueError(f"expected (B, H, N, d) tensors, got shape {tuple(q.shape)}")
    if any(t.shape != q.shape for t in tensors):
        raise ValueError(f"all inputs must share the shape {tuple(q.shape)}, got {[tuple(t.shape) for t in tensors]}")
    d = q.shape[-1]
    if d < 16 or d > 128 or d & (d - 1):
        raise ValueError(f"the head dimension must be a power of two between 16 and 128, got {d}")


def _options(q: torch.Tensor) -> dict:
    return dict(UPCAST=kernels.INTERPRETED and q.dtype != torch.float32,
                PRECISION="ieee" if q.dtype == torch.float32 else "tf32")


def fused_attention_fwd(q, k, v, causal: bool = False, block_m: int = 32, block_n: int = 32):
    """Triton forward: (B, H, N, d) ×3 -> (o (B, H, N, d), lse (B, H, N) float32)."""
    _check_inputs(q, k, v)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, H, N, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(N, block_m), B * H)
    _flash_fwd_kernel[grid](q, k, v, o, lse, N, 1.0 / math.sqrt(d), HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n,
                            CAUSAL=causal, **_options(q))
    return o, lse


def fused_attention_bwd(q, k, v, o, lse, do, causal: bool = False, block_m: int = 32, block_n: int = 32):
    """Triton backward: returns (dq, dk, dv), each (B, H, N, d)."""
    _check_inputs(q, k, v, o, do)
    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do))
    B, H, N, d = q.shape
    delta = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
    _flash_bwd_preprocess[(triton.cdiv(N, block_m), B * H)](o, do, delta, N, HEAD_DIM=d, BLOCK_M=block_m)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    common = dict(HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, **_options(q))
    scale = 1.0 / math.sqrt(d)
    _flash_bwd_dkdv_kernel[(triton.cdiv(N, block_n), B * H)](q, k, v, do, lse, delta, dk, dv, N, scale, **common)
    _flash_bwd_dq_kernel[(triton.cdiv(N, block_m), B * H)](q, k, v, do, lse, delta, dq, N, scale, **common)
    return dq, dk, dv


# --- autograd ------------------------------------------------------------------------------------


class FusedAttentionFunction(torch.autograd.Function):
    """Saves q, k, v, o and the log-sum-exp for backward: Θ(N d) bytes per head, never Θ(N²)."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_m=32, block_n=32):
        o, lse = fused_attention_fwd(q, k, v, causal, block_m, block_n)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.config = (causal, block_m, block_n)
        return o

    @staticmethod
    def backward(ctx, do):
        dq, dk, dv = fused_attention_bwd(*ctx.saved_tensors, do, *ctx.config)  # q, k, v, o, lse
        return dq, dk, dv, None, None, None


def flash_attention(q, k, v, causal: bool = False, block_m: int = 32, block_n: int = 32) -> torch.Tensor:
    """Differentiable FlashAttention: (B, H, N, d) ×3 -> (B, H, N, d)."""
    return FusedAttentionFunction.apply(q, k, v, causal, block_m, block_n)


# --- test ----------------------------------------------------------------------------------------


def compare_with_reference(B=1, H=2, N=100, d=16, causal=False, block_m=32, block_n=32, dtype=torch.float32,
                           device="cpu", seed=0) -> dict:
    """Max abs errors of the Triton forward (o, lse) and backward (dq, dk, dv) against float64 autograd."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(B, H, N, d, generator=g) for _ in range(4))
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    o_ref, lse_ref = attention_reference(*ref, causal=causal)
    o_ref.backward(do.double())
    ins = [t.to(device, dtype).requires_grad_() for t in (q, k, v)]
    o, lse = fused_attention_fwd(*(t.detach() for t in ins), causal=causal, block_m=block_m, block_n=block_n)
    flash_attention(*ins, causal=causal, block_m=block_m, block_n=block_n).backward(do.to(device, dtype))

    def err(a, b):
        return (a.detach().double().cpu() - b.detach()).abs().max().item()

    return {"o": err(o, o_ref), "lse": err(lse, lse_ref),
            **{name: err(t.grad, r.grad) for name, t, r in zip(("dq", "dk", "dv"), ins, ref)}}


# --- benchmark -----------------------------------------------------------------------------------


def main() -> None:
    """GPU benchmark; see kernels/bench_flash_attention.py."""
    from kernels.bench_flash_attention import main as bench

    bench()


if __name__ == "__main__":
    main()
