"""NF4 dequantization (chapter 8): 4-bit codes, two per byte, back to float32.

Computes ``out[i] = codebook[code(i)] * absmax[i // block_size]`` where ``code(i)`` is the high
nibble of ``packed[i // 2]`` for even ``i`` and the low nibble for odd ``i`` (QLoRA's layout).
What it teaches: dequantization is a gather from a 16-entry table plus a multiply, so it is bound
by memory traffic, not arithmetic: per value it reads half a byte of codes and 4 / block_size bytes
of absmax, and writes 4 bytes. A fused kernel reads each input once and writes each output once;
the PyTorch reference materializes several full-size temporaries on the way.

The kernel works for any 4-bit codebook (NF4, FP4, a uniform int4 grid): it is an argument.
Run ``python -m kernels.ch08_quantization`` for the GPU bandwidth benchmark.
"""
from __future__ import annotations

import math

import torch

from kernels import INTERPRETED  # importing the package switches on the interpreter without CUDA

import triton
import triton.language as tl


# --- reference ---------------------------------------------------------------------------------
def nf4_decode_torch(packed: torch.Tensor, absmax: torch.Tensor, codebook: torch.Tensor, shape,
                             block_size: int = 64) -> torch.Tensor:
    """Plain PyTorch. packed: (ceil(n / 2),) uint8, absmax: (ceil(n / block_size),) float32,
    codebook: (16,) float32 -> float32 tensor of ``shape`` (n elements).

    Bytes moved: reads n / 2 (codes) + 4 n / block_size (absmax); writes 4 n. Unfused, it also
    writes and reads back the unpacked codes (int64, 8 n each way), the gathered levels and the
    broadcast absmax (4 n each way).
    """
    n = math.prod(shape)
    codes = torch.stack([packed >> 4, packed & 15], dim=1).flatten()[:n].long()  # high nibble first
    scale = absmax.repeat_interleave(block_size)[:n]
    return (codebook[codes] * scale).reshape(shape)


# --- kernel ------------------------------------------------------------------------------------
@triton.jit
def _nf4_dequantize_kernel(packed_ptr, absmax_ptr, codebook_ptr, out_ptr, n_elements,
                           QUANT_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)  # output elements of this program
    mask = offsets < n_elements  # the last program may run past the end
    byte = tl.load(packed_ptr + offsets // 2, mask=mask, other=0).to(tl.int32)
    code = tl.where(offsets % 2 == 0, byte >> 4, byte & 15)  # even element: high nibble
    level = tl.load(codebook_ptr + code, mask=mask, other=0.0)  # 16 entries: stays in cache
    scale = tl.load(absmax_ptr + offsets // QUANT_BLOCK, mask=mask, other=0.0)
    tl.store(out_ptr + offsets, level * scale, mask=mask)


# --- launcher ----------------------------------------------------------------------------------
def nf4_decode_triton(packed: torch.Tensor, absmax: torch.Tensor, codebook: torch.Tensor, shape,
                   block_size: int = 64, BLOCK: int = 1024) -> torch.Tensor:
    """Triton version of :func:`nf4_decode_torch` (same arguments, same result)."""
    n = math.prod(shape)
    if packed.numel() != (n + 1) // 2:
        raise ValueError(f"{n} values need {(n + 1) // 2} packed bytes, got {packed.numel()}")
    if absmax.numel() != -(-n // block_size):
        raise ValueError(f"{n} values in blocks of {block_size} need {-(-n // block_size)} absmax values, "
                         f"got {absmax.numel()}")
    if codebook.numel() != 16:
        raise ValueError(f"a 4-bit codebook has 16 entries, got {codebook.numel()}")
    out = torch.empty(n, dtype=torch.float32, device=packed.device)
    grid = (triton.cdiv(n, BLOCK),)
    _nf4_dequantize_kernel[grid](packed.contiguous(), absmax.float().contiguous(),
                                 codebook.float().contiguous(), out, n, QUANT_BLOCK=block_size, BLOCK=BLOCK)
    return out.reshape(shape)


# --- test helpers ------------------------------------------------------------------------------
def random_inputs(n: int, block_size: int = 64, seed: int = 0, device: str = "cpu"):
    """Random packed codes, positive absmax values and a sorted random codebook for ``n`` values."""
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, ((n + 1) // 2,), generator=g, dtype=torch.uint8)
    absmax = torch.rand(-(-n // block_size), generator=g) + 0.1
    codebook = torch.randn(16, generator=g).sort().values
    return packed.to(device), absmax.to(device), codebook.to(device)


def max_error(shape, block_size: int = 64, BLOCK: int = 1024, seed: int = 0, device: str = "cpu") -> float:
    """Largest |kernel - reference| on random inputs of ``shape`` (0.0 when they agree exactly)."""
    packed, absmax, codebook = random_inputs(math.prod(shape), block_size, seed, device)
    got = nf4_decode_triton(packed, absmax, codebook, shape, block_size, BLOCK)
    ref = nf4_decode_torch(packed, absmax, codebook, shape, block_size)
    return (got - ref).abs().max().item()


# --- benchmark ---------------------------------------------------------------------------------
def benchmark(n: int = 1 << 26, block_size: int = 64) -> dict[str, float]:
    """GB/s (bytes of packed codes + absmax read and float32 written, per second) of the Triton kernel
    and of the PyTorch reference on CUDA, for ``n`` values. Raises RuntimeError without CUDA."""
    if not torch.cuda.is_available():
        raise RuntimeError("the bandwidth benchmark needs CUDA")
    packed, absmax, codebook = random_inputs(n, block_size, device="cuda")
    moved = packed.nbytes + absmax.nbytes + 4 * n  # the minimum traffic: read the inputs once, write once
    results = {}
    for name, fn in (("triton", nf4_decode_triton), ("pytorch", nf4_decode_torch)):
        ms = triton.testing.do_bench(lambda fn=fn: fn(packed, absmax, codebook, (n,), block_size))
        results[name] = moved / (ms * 1e-3) / 1e9
    return results


def main() -> None:
    if not torch.cuda.is_available():
        print("CUDA not available: skipped (the kernel still runs on CPU in Triton's interpreter, "
              "see tests/test_kernels_ch08_quantization.py)")
        return
    for n in (1 << 20, 1 << 24, 1 << 26):
        gbs = benchmark(n)
        print(f"NF4 dequantize, {n:>11,} values: Triton {gbs['triton']:7.1f} GB/s, "
              f"PyTorch {gbs['pytorch']:7.1f} GB/s ({torch.cuda.get_device_name()})")


if __name__ == "__main__":
    main()
