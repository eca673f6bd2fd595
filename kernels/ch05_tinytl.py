"""Bit packing in Triton: the 1-bit masks behind a ReLU that keeps 32× less for backward.

ReLU's backward is ``dx = dy · [x > 0]``: it needs one bit per element, not the fp32 output that
``nn.ReLU`` keeps. :func:`relu_packed` keeps only the mask, packed eight elements to a byte:
element ``8k + j`` of the flattened mask is bit ``j`` (least significant first) of byte ``k``, so
``n`` elements take ``ceil(n / 8)`` bytes and the last byte's high bits are zero when ``n`` is not a
multiple of 8.

Two kernels, one program per ``BLOCK`` bytes, plain pointer arithmetic and masks for the tail:
``_pack_bits_kernel`` ORs bit ``j`` of each of its bytes from mask element ``8 · byte + j`` (eight
unrolled loads of stride 8, which the caches merge); ``_unpack_bits_kernel`` does the reverse. Only core
operations are used (no ``tl.sum``): they behave the same whether or not Triton was imported before
the interpreter was switched on. Both are pure bandwidth: pack reads n bytes and writes
n / 8, unpack the other way round. On the CPU they run in Triton's interpreter (``import kernels``
switches it on); :func:`relu_packed` uses them on CUDA tensors and the PyTorch reference elsewhere.

``python -m kernels.ch05_tinytl`` runs the GPU benchmark (skipped without CUDA).
"""
from __future__ import annotations

import torch
from torch import nn

import kernels  # noqa: F401 - switches the Triton interpreter on when there is no GPU
import triton
import triton.language as tl

# --- reference -----------------------------------------------------------------------------------
_BIT_WEIGHTS = (1, 2, 4, 8, 16, 32, 64, 128)


def pack_mask_torch(mask: torch.Tensor) -> torch.Tensor:
    """bool (any shape, n elements) -> flat uint8 (ceil(n / 8),); element 8k+j is bit j of byte k.

    Bytes moved: reads n bytes, writes n / 8, but through a padded copy and an (n/8, 8) product.
    """
    flat = mask.reshape(-1).to(torch.uint8)
    flat = nn.functional.pad(flat, (0, -flat.numel() % 8)).view(-1, 8)
    weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=mask.device)
    return (flat * weights).sum(dim=1, dtype=torch.uint8)  # at most 255: no overflow


def unpack_mask_torch(packed: torch.Tensor, numel: int) -> torch.Tensor:
    """flat uint8 (ceil(numel / 8),) -> flat bool (numel,): the inverse of :func:`pack_mask_torch`."""
    _check_packed(packed, numel)
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed.reshape(-1, 1) >> shifts) & 1  # (bytes, 8)
    return bits.reshape(-1)[:numel].bool()


def _check_packed(packed: torch.Tensor, numel: int) -> None:
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed must be a uint8 tensor, got {packed.dtype}")
    if numel < 0 or packed.numel() != -(-numel // 8):
        raise ValueError(f"{numel} elements take {-(-max(numel, 0) // 8)} bytes, got {packed.numel()}")


# --- kernels -------------------------------------------------------------------------------------


@triton.jit
def _pack_bits_kernel(mask_ptr, packed_ptr, n, n_bytes, BLOCK: tl.constexpr):
    byte = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,) output bytes of this program
    packed = tl.full([BLOCK], 0, tl.int32)
    for j in tl.static_range(8):  # unrolled: bit j of every byte comes from element 8 * byte + j
        idx = byte * 8 + j
        m = tl.load(mask_ptr + idx, mask=idx < n, other=0).to(tl.int32)  # the tail reads as zeros
        packed = packed | (m << j)
    tl.store(packed_ptr + byte, packed.to(tl.uint8), mask=byte < n_bytes)


@triton.jit
def _unpack_bits_kernel(packed_ptr, mask_ptr, n, n_bytes, BLOCK: tl.constexpr):
    byte = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    p = tl.load(packed_ptr + byte, mask=byte < n_bytes, other=0).to(tl.int32)
    for j in tl.static_range(8):
        idx = byte * 8 + j
        tl.store(mask_ptr + idx, ((p >> j) & 1).to(tl.uint8), mask=idx < n)  # bits past n are never written


# --- launchers -----------------------------------------------------------------------------------


def pack_mask_triton(mask: torch.Tensor, block: int = 128) -> torch.Tensor:
    """Triton: bool (any shape, n elements) -> flat uint8 (ceil(n / 8),), bit j of byte k = element 8k+j."""
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")
    flat = mask.reshape(-1).contiguous().view(torch.uint8)  # same bytes, a pointer type Triton loads
    n = flat.numel()
    packed = torch.empty(-(-n // 8), dtype=torch.uint8, device=mask.device)
    if n:
        _pack_bits_kernel[(triton.cdiv(packed.numel(), block),)](flat, packed, n, packed.numel(), BLOCK=block)
    return packed


def unpack_mask_triton(packed: torch.Tensor, numel: int, block: int = 128) -> torch.Tensor:
    """Triton: flat uint8 (ceil(numel / 8),) -> flat bool (numel,), the inverse of :func:`pack_mask_triton`."""
    _check_packed(packed, numel)
    packed = packed.contiguous()
    out = torch.empty(numel, dtype=torch.uint8, device=packed.device)
    if numel:
        _unpack_bits_kernel[(triton.cdiv(packed.numel(), block),)](packed, out, numel, packed.numel(), BLOCK=block)
    return out.view(torch.bool)


# --- autograd ------------------------------------------------------------------------------------


def _use_triton(t: torch.Tensor) -> bool:
    return t.is_cuda  # the interpreter is exact but slow: CPU tensors take the PyTorch path


class ReLU1bitFunction(torch.autograd.Function):
    """relu(x) whose backward keeps only the packed mask [x > 0]: ceil(n / 8) bytes instead of 4n."""

    @staticmethod
    def forward(ctx, x):
        mask = x > 0  # the gradient of relu at 0 is 0, as in torch.relu
        packed = pack_mask_triton(mask) if _use_triton(x) else pack_mask_torch(mask)
        ctx.save_for_backward(packed)
        ctx.shape = x.shape
        return torch.relu(x)  # inside Function.forward nothing is recorded: only `packed` is kept

    @staticmethod
    def backward(ctx, grad):
        (packed,) = ctx.saved_tensors
        n = grad.numel()
        mask = unpack_mask_triton(packed, n) if _use_triton(grad) else unpack_mask_torch(packed, n)
        return grad.masked_fill(~mask.view(ctx.shape), 0)


def relu_packed(x: torch.Tensor) -> torch.Tensor:
    """ReLU with the values and gradients of ``torch.relu``; backward keeps ceil(x.numel() / 8) bytes."""
    return ReLU1bitFunction.apply(x)


class ReLU1bit(nn.Module):
    """``nn.ReLU`` replacement that keeps a 1-bit mask for backward (see :func:`relu_packed`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu_packed(x)


# --- test ----------------------------------------------------------------------------------------


def random_mask(n: int, seed: int = 0, device: str = "cpu", p: float = 0.5) -> torch.Tensor:
    """A reproducible bool mask of n elements, True with probability p."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=g) < p).to(device)


def compare_with_reference(n: int, seed: int = 0, device: str = "cpu", block: int = 128) -> dict:
    """Pack and unpack a random mask of n elements with Triton and with PyTorch: which results agree."""
    mask = random_mask(n, seed, device)
    packed, ref = pack_mask_triton(mask, block), pack_mask_torch(mask)
    return {"pack": torch.equal(packed, ref), "unpack": torch.equal(unpack_mask_triton(ref, n, block), mask),
            "bytes": packed.numel() == -(-n // 8)}


# --- benchmark -----------------------------------------------------------------------------------


def _gbps(fn, moved_bytes: int) -> float:
    ms = triton.testing.do_bench(fn)
    return moved_bytes / (ms * 1e-3) / 1e9


def main() -> None:
    if not torch.cuda.is_available():
        print("CUDA not available: skipped")
        return
    heads = ("pack Triton", "pack torch", "unpack Triton", "unpack torch")
    print("GB/s (mask bytes + packed bytes per second)")
    print(f"{'elements':>12} | " + " | ".join(heads))
    for n in (1 << 20, 1 << 24, (1 << 28) + 3):
        mask = random_mask(n, device="cuda")
        packed = pack_mask_triton(mask)
        assert torch.equal(packed, pack_mask_torch(mask))
        assert torch.equal(unpack_mask_triton(packed, n), mask)
        moved = n + packed.numel()  # GB/s counts what must move: n mask bytes and n/8 packed bytes
        rates = [_gbps(lambda: pack_mask_triton(mask), moved), _gbps(lambda: pack_mask_torch(mask), moved),
                 _gbps(lambda: unpack_mask_triton(packed, n), moved), _gbps(lambda: unpack_mask_torch(packed, n), moved)]
        print(f"{n:>12,} | " + " | ".join(f"{r:>{len(h)}.1f}" for r, h in zip(rates, heads)))


if __name__ == "__main__":
    main()
