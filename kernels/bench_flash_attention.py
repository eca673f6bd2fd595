"""GPU benchmark of chapter 10: FlashAttention (Triton) vs PyTorch's fused attention vs naive attention.

    python -m kernels.bench_flash_attention        (or: python -m kernels.ch10_flash_attention)

For N = 512 .. 16K (batch B = 16K / N, 16 heads, d = 64, bfloat16, causal
and not): forward and forward+backward throughput in TFLOP/s (FLOPs of the non-causal algorithm,
halved for causal: 4·B·H·N²·d forward, 2.5× that for backward) and peak allocated memory. Naive
attention is skipped where its N×N matrices would not fit. Without CUDA it prints a line and exits 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.ch10_flash_attention import attention_reference, flash_attention

SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
TOKENS, HEADS, HEAD_DIM = 16384, 16, 64


def _flops(B, H, N, d, causal, backward):
    fwd = 4 * B * H * N * N * d / (2 if causal else 1)
    return fwd * (3.5 if backward else 1.0)


def _measure(fn, q, k, v, do, backward):
    """(median ms, peak MiB) of fn(q, k, v) [+ backward]."""
    import triton.testing

    def step():
        o = fn(q, k, v)
        if backward:
            o.backward(do)

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    ms = triton.testing.do_bench(step, warmup=10, rep=50)
    return ms, peak


def main() -> None:
    if not torch.cuda.is_available():
        print("CUDA not available: skipped")
        return
    impls = {
        "flash (Triton)": lambda causal: lambda q, k, v: flash_attention(q, k, v, causal, 64, 64),
        "torch SDPA": lambda causal: lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "naive": lambda causal: lambda q, k, v: attention_reference(q, k, v, causal)[0],
    }
    print(f"{'causal':>6} {'N':>6} {'impl':>15} {'fwd TFLOP/s':>12} {'fwd+bwd TFLOP/s':>16} {'peak MiB':>9}")
    free = torch.cuda.mem_get_info()[0]
    for causal in (False, True):
        for N in SEQ_LENS:
            B = max(1, TOKENS // N)  # batch × sequence = 16K tokens, as in the FlashAttention-2 paper
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, do = (torch.randn(B, HEADS, N, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=g)
                           for _ in range(4))
            for t in (q, k, v):
                t.requires_grad_()
            for name, make in impls.items():
                if name == "naive" and 3 * B * HEADS * N * N * 4 > free // 2:
                    print(f"{causal!s:>6} {N:>6} {name:>15} {'(N×N does not fit)':>30}")
                    continue
                fn = make(causal)
                ms_f, _ = _measure(fn, q, k, v, do, backward=False)
                ms_b, peak = _measure(fn, q, k, v, do, backward=True)
                for t in (q, k, v):
                    t.grad = None
                tf = _flops(B, HEADS, N, HEAD_DIM, causal, False) / ms_f / 1e9
                tb = _flops(B, HEADS, N, HEAD_DIM, causal, True) / ms_b / 1e9
                print(f"{causal!s:>6} {N:>6} {name:>15} {tf:12.1f} {tb:16.1f} {peak:9.0f}")
    print(f"head dim {HEAD_DIM}, {HEADS} heads, batch × N = {TOKENS} tokens, bfloat16; "
          f"peak = extra allocated memory of one forward+backward")


if __name__ == "__main__":
    main()
