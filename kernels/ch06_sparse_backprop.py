"""Gather-GEMM in Triton: a matrix product over selected rows, inner indices and columns.

``gather_matmul(a, b, rows, inner, cols)`` computes

    C = a[rows][:, inner] @ b[inner][:, cols]        (each index optional: None keeps everything)

without materialising the gathered operands: every program loads the index vectors of its tile and
reads the selected rows and columns straight from ``a`` and ``b`` (plain pointer arithmetic with the
tensors' strides, so transposed views work as they are). The product costs 2·M·N·K FLOPs for
M = len(rows), N = len(cols), K = len(inner): the selection shrinks the work, not only the result.

Two uses in the course: a sparse backward through a Linear ``y = x Wᵀ``, where one index set ``I``
of output units is kept for the whole batch (``g`` the output gradient)::

    dx   = gather_matmul(g, W, inner=I)          # g[:, I] @ W[I, :]     (B, in)
    dW_I = gather_matmul(g.t(), x, rows=I)       # g[:, I]ᵀ @ x          (k, in): rows I of dW

and a weight gradient over selected input columns only (``gather_matmul(g.t(), x, cols=idx)``).

One program per (BLOCK_M × BLOCK_N) tile of C, looping over the inner dimension in BLOCK_K steps;
masks handle every tail (M, N, K need not be multiples of the blocks), and masked lanes load index
0 and value 0. Accumulation is in float32, the result has ``a``'s dtype. On the CPU the kernel runs
in Triton's interpreter (``import kernels`` switches it on). Interpreter hazards (triton 3.9):
``tl.dot`` on 16-bit inputs is wrong there, so tiles are cast to float32 first; on a GPU, float32
``tl.dot`` defaults to TF32, so float32 inputs ask for IEEE precision.

``python -m kernels.ch06_sparse_backprop`` runs the GPU benchmark (skipped without CUDA).
"""
from __future__ import annotations

import torch

import kernels  # noqa: F401 - switches the Triton interpreter on when there is no GPU
import triton
import triton.language as tl

# --- reference -----------------------------------------------------------------------------------


def gather_matmul_reference(a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor | None = None,
                            inner: torch.Tensor | None = None, cols: torch.Tensor | None = None) -> torch.Tensor:
    """(M0, K0) × (K0, N0) -> (M, N) = a[rows][:, inner] @ b[inner][:, cols], in PyTorch.

    Bytes moved: ``index_select`` first writes the gathered copies of both operands (M·K + K·N
    elements) and the product reads them back; the kernel reads the selected elements once.
    """
    _check(a, b, rows, inner, cols)
    if rows is not None:
        a = a.index_select(0, rows)
    if inner is not None:
        a, b = a.index_select(1, inner), b.index_select(0, inner)
    if cols is not None:
        b = b.index_select(1, cols)
    return a @ b


def _check(a, b, rows, inner, cols) -> None:
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"a and b must be matrices, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise ValueError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    for name, index, size in (("rows", rows, a.shape[0]), ("inner", inner, a.shape[1]), ("cols", cols, b.shape[1])):
        if index is None:
            continue
        if index.dim() != 1 or index.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be a 1-D integer tensor, got {index.dtype} of shape {tuple(index.shape)}")
        if index.numel() and not (0 <= int(index.min()) and int(index.max()) < size):
            raise ValueError(f"{name} holds indices outside [0, {size})")


# --- kernel --------------------------------------------------------------------------------------


@triton.jit
def _gather_matmul_kernel(a_ptr, b_ptr, c_ptr, rows_ptr, inner_ptr, cols_ptr, M, N, K,
                          stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                          HAS_ROWS: tl.constexpr, HAS_INNER: tl.constexpr, HAS_COLS: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # rows of C
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # columns of C
    in_m, in_n = offs_m < M, offs_n < N
    if HAS_ROWS:  # row m of C is row rows[m] of a
        a_rows = tl.load(rows_ptr + offs_m, mask=in_m, other=0)
    else:
        a_rows = offs_m
    if HAS_COLS:  # column n of C is column cols[n] of b
        b_cols = tl.load(cols_ptr + offs_n, mask=in_n, other=0)
    else:
        b_cols = offs_n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        in_k = offs_k < K
        if HAS_INNER:  # step t of the sum runs over column inner[t] of a and row inner[t] of b
            kk = tl.load(inner_ptr + offs_k, mask=in_k, other=0)
        else:
            kk = offs_k
        a = tl.load(a_ptr + a_rows[:, None] * stride_am + kk[None, :] * stride_ak,
                    mask=in_m[:, None] & in_k[None, :], other=0.0)
        b = tl.load(b_ptr + kk[:, None] * stride_bk + b_cols[None, :] * stride_bn,
                    mask=in_k[:, None] & in_n[None, :], other=0.0)
        if UPCAST:  # the interpreter's tl.dot is wrong on 16-bit inputs
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc += tl.dot(a, b, input_precision=PRECISION)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=in_m[:, None] & in_n[None, :])


# --- launcher ------------------------------------------------------------------------------------


def gather_matmul(a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor | None = None,
                  inner: torch.Tensor | None = None, cols: torch.Tensor | None = None,
                  block_m: int = 32, block_n: int = 32, block_k: int = 32) -> torch.Tensor:
    """Triton: (M0, K0) × (K0, N0) -> (M, N) = a[rows][:, inner] @ b[inner][:, cols].

    Args:
        a, b: matrices of one dtype (float32, float16 or bfloat16), any strides (``g.t()`` is fine).
        rows, inner, cols: 1-D int32/int64 index vectors (None: all), repeats allowed. ``inner``
            selects the columns of ``a`` and the rows of ``b`` together.
        block_m, block_n, block_k: tile sizes, powers of two, at least 16 (``tl.dot``'s minimum).

    Returns:
        A new contiguous (M, N) tensor of ``a``'s dtype, accumulated in float32. Zeros when K = 0.
    """
    _check(a, b, rows, inner, cols)
    for name, block in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        if block < 16 or block & (block - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {block}")
    M = a.shape[0] if rows is None else rows.numel()
    K = a.shape[1] if inner is None else inner.numel()
    N = b.shape[1] if cols is None else cols.numel()
    c = torch.empty(M, N, dtype=a.dtype, device=a.device)
    if M == 0 or N == 0:
        return c
    if K == 0:
        return c.zero_()
    dummy = torch.zeros(1, dtype=torch.int64, device=a.device)  # never read when the flag is off
    index = [dummy if t is None else t.contiguous() for t in (rows, inner, cols)]
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    _gather_matmul_kernel[grid](
        a, b, c, *index, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        HAS_ROWS=rows is not None, HAS_INNER=inner is not None, HAS_COLS=cols is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        UPCAST=kernels.INTERPRETED and a.dtype != torch.float32,
        PRECISION="ieee" if a.dtype == torch.float32 else "tf32")
    return c


# --- test helpers --------------------------------------------------------------------------------


def random_case(M0: int, K0: int, N0: int, m: int | None, k: int | None, n: int | None, seed: int = 0,
                dtype: torch.dtype = torch.float32, device: str = "cpu", transpose_a: bool = False) -> dict:
    """Random operands (a: (M0, K0), b: (K0, N0)) and random index vectors of lengths m, k, n
    (None: no index). With ``transpose_a``, ``a`` is the transposed view of a (K0, M0) tensor."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(K0, M0, generator=g).t() if transpose_a else torch.randn(M0, K0, generator=g)
    b = torch.randn(K0, N0, generator=g)

    def pick(size, count):
        return None if count is None else torch.randperm(size, generator=g)[:count].to(device)

    return {"a": a.to(device, dtype), "b": b.to(device, dtype), "rows": pick(M0, m), "inner": pick(K0, k),
            "cols": pick(N0, n)}


def max_error(case: dict, **blocks) -> float:
    """Largest |Triton − reference| on a case of :func:`random_case` (reference in float64)."""
    exact = gather_matmul_reference(case["a"].double(), case["b"].double(), case["rows"], case["inner"], case["cols"])
    got = gather_matmul(**case, **blocks)
    return (got.double() - exact).abs().max().item() if got.numel() else 0.0


# --- benchmark -----------------------------------------------------------------------------------


def main() -> None:
    if not torch.cuda.is_available():
        print("CUDA not available: skipped")
        return
    B, n_in, n_out = 4096, 4096, 4096
    print(f"sparse Linear backward, batch {B}, {n_in} -> {n_out}, bf16; ms per call (triton.testing.do_bench)")
    print(f"{'k':>6} | {'dense dx+dW':>11} | {'gather+mm':>9} | {'Triton':>7} | {'TFLOP/s Triton':>14}")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(B, n_in, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n_out, n_in, device="cuda", dtype=torch.bfloat16, generator=g)
    grad = torch.randn(B, n_out, device="cuda", dtype=torch.bfloat16, generator=g)
    dense = triton.testing.do_bench(lambda: (grad @ w, grad.t() @ x))
    for k in (41, 128, 410, 1024, 2048):
        idx = grad.float().abs().sum(0).topk(k).indices
        dx = gather_matmul(grad, w, inner=idx, block_m=64, block_n=64, block_k=32)
        dw = gather_matmul(grad.t(), x, rows=idx, block_m=64, block_n=64, block_k=32)
        torch.testing.assert_close(dx, gather_matmul_reference(grad, w, inner=idx), atol=0.5, rtol=2e-2)
        torch.testing.assert_close(dw, gather_matmul_reference(grad.t(), x, rows=idx), atol=0.5, rtol=2e-2)
        torch_ms = triton.testing.do_bench(lambda: (gather_matmul_reference(grad, w, inner=idx),
                                                    gather_matmul_reference(grad.t(), x, rows=idx)))
        triton_ms = triton.testing.do_bench(lambda: (
            gather_matmul(grad, w, inner=idx, block_m=64, block_n=64, block_k=32),
            gather_matmul(grad.t(), x, rows=idx, block_m=64, block_n=64, block_k=32)))
        tflops = 2 * (2 * B * k * n_in) / (triton_ms * 1e-3) / 1e12
        print(f"{k:>6} | {dense:>11.3f} | {torch_ms:>9.3f} | {triton_ms:>7.3f} | {tflops:>14.1f}")


if __name__ == "__main__":
    main()
