"""PaCA's two kernels (chapter 15): an NF4 weight decoded with some columns overridden, and dP by gather-GEMM.

PaCA (Woo et al., ICLR 2025) fine-tunes ``r`` input columns ``idx`` of a frozen ``W`` (out × in): the trainable
``P`` (out × r) is written over ``W[:, idx]`` (scaled by ``s = alpha / r``) before every product, and backward
needs ``dP = s · gᵀ x[:, idx]`` only, so only ``x[:, idx]`` is saved. QPaCA keeps ``W`` in NF4 (chapter 8's
layout: codes two per byte, high nibble first, one float32 absmax per block of ``block_size`` flattened
elements); each forward and backward decodes it and writes the ``r`` full-precision columns over it.

- :func:`nf4_encode` quantizes a float tensor in that layout (nearest NF4 level, :func:`nf4_levels`).
- :func:`nf4_decode_columns_triton` is ONE kernel: each program decodes ``BLOCK`` elements of ``W``
  (``levels[code] · absmax[block]``), and its epilogue looks the column ``j`` of each element up in a map
  ``slot[j]`` (int32, built on the host: ``slot[idx[t]] = t``, -1 elsewhere) and stores ``cols[i, slot[j]]``
  where the slot is not -1, the decoded value elsewhere. :func:`nf4_decode_columns_torch` is the reference:
  chapter 8's decode, then ``index_copy_`` of the columns. Both do the same float operations (one float32
  product per decoded element, a copy per overridden one), so they agree bit for bit.
- :func:`paca_grad_p` computes ``dP = scale · gᵀ x[:, idx]`` with chapter 6's gather-GEMM
  (``gather_matmul(g.t(), x, cols=idx)``): the kernel reads the selected columns of ``x`` where they lie,
  without writing the copy ``x[:, idx]`` first; :func:`paca_grad_p_torch` is the PyTorch reference.

Bytes moved by the decode, for ``n = out · in`` elements and ``r`` columns: it reads ``n / 2`` bytes of codes,
``4 n / block_size`` of absmax, ``4 · in`` of the slot map and ``4 · out · r`` of columns, and writes ``4 n``:
every element of ``W`` is written exactly once. Decoding first and overriding after writes the ``r`` columns
twice and adds a second launch whose stores are strided: each 4-byte store of a column lands in a different
row, so in a different 32-byte memory sector (up to 8× the bytes it means to write). The PyTorch reference
moves much more: chapter 8's decode materializes the unpacked int64 codes, the gathered levels and the
broadcast absmax (full-size temporaries) before the ``index_copy_``; and the out-of-place
``W.index_copy(1, idx, cols)`` one might write instead is a whole second pass over ``W`` (read 4 n, write 4 n).
The epilogue costs what the override needs and no pass over ``W`` of its own.

On the CPU both kernels run in Triton's interpreter (``import kernels`` switches it on; import this module,
or ``kernels``, before ``triton`` itself, or the gather-GEMM's ``tl.zeros`` cannot run there). The interpreter's
``tl.dot`` is wrong on 16-bit inputs, which ``gather_matmul`` handles by upcasting its tiles to float32.
Offsets are int32, or int64 for weights of 2**31 elements and more. ``python -m kernels.ch15_paca`` runs the
GPU benchmark (skipped without CUDA).
"""
from __future__ import annotations

import functools
import math

import torch

from kernels import INTERPRETED  # noqa: F401 - importing the package switches on the interpreter without CUDA
from kernels import ch06_sparse_backprop as _gemm
from kernels import ch08_quantization as _nf4

import triton
import triton.language as tl

_ENCODE_CHUNK = 1 << 20  # values quantized at once by nf4_encode (bounds its float64 temporaries)


# --- NF4 levels and encoder ----------------------------------------------------------------------------
# The 16 NF4 levels of QLoRA (Dettmers et al. 2023, Appendix E): normal quantiles scaled to [-1, 1], as float32.
# Chapter 8 derives them; this module takes them as the published constants (each literal is a float32 exactly).
_NF4_TABLE = (
    -1.0, -0.6961928009986877, -0.5250729322433472, -0.39491742849349976,
    -0.2844413220882416, -0.18477340042591095, -0.09104997664690018, 0.0,
    0.07958031445741653, 0.16093014180660248, 0.24611225724220276, 0.3379151225090027,
    0.4407097399234772, 0.5626168847084045, 0.722956657409668, 1.0,
)


@functools.lru_cache(maxsize=None)
def _levels(device: str = "cpu") -> torch.Tensor:
    """The levels on ``device``, built once (the decoders read them from there without a copy per call)."""
    return torch.tensor(_NF4_TABLE, dtype=torch.float32, device=device)


def nf4_levels() -> torch.Tensor:
    """The 16 NF4 levels (QLoRA), float32, ascending from -1.0 to 1.0 with an exact 0.0 at index 7."""
    return _levels().clone()


def nf4_encode(w: torch.Tensor, block_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise NF4 quantization of ``w`` (any shape, n elements flattened row-major), chapter 8's layout.

    Returns:
        packed: uint8 (ceil(n / 2),): byte k holds the code of value 2k in its high nibble and that of value
            2k + 1 in its low nibble (0 when n is odd). A code is the index of the :func:`nf4_levels` level
            nearest to value / absmax of its block, found in float64 (a value exactly halfway takes the lower
            level); an all-zero block gets code 7 (the level 0.0).
        absmax: float32 (ceil(n / block_size),): max |w| of each block of ``block_size`` flattened values
            (the last block may be partial).

    Works in chunks of whole blocks, so its temporaries stay small beside a large ``w``.
    Raises ValueError for a non-float ``w``, values that are not finite, or ``block_size < 1``.
    """
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise ValueError(f"nf4_encode quantizes a floating-point tensor, got {getattr(w, 'dtype', type(w))}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    flat = w.detach().reshape(-1)
    n = flat.numel()
    if n and not bool(torch.isfinite(flat).all()):
        raise ValueError("nf4_encode cannot encode inf or NaN: every value of w must be finite")
    n_blocks = -(-n // block_size)
    levels = _levels(str(flat.device)).double()
    midpoints = (levels[1:] + levels[:-1]) / 2  # exact: float32 levels added in float64
    absmax = torch.empty(n_blocks, dtype=torch.float32, device=flat.device)
    codes = torch.empty(n + n % 2, dtype=torch.uint8, device=flat.device)
    codes[n:] = 0  # the unused low nibble of an odd count
    step = max(1, _ENCODE_CHUNK // block_size) * block_size  # whole blocks per chunk
    for start in range(0, n, step):
        part = flat[start:start + step].float()
        pad = -part.numel() % block_size
        blocks = torch.cat([part, part.new_zeros(pad)]).view(-1, block_size)
        peak = blocks.abs().amax(dim=1)  # float32: max |w| is exact in any precision
        absmax[start // block_size:start // block_size + peak.numel()] = peak
        scaled = blocks.double() / torch.where(peak == 0, torch.ones_like(peak), peak).double()[:, None]
        codes[start:start + part.numel()] = torch.bucketize(scaled.reshape(-1)[:part.numel()], midpoints).to(torch.uint8)
    packed = (codes[0::2] << 4) | codes[1::2]
    return packed, absmax


# --- reference -----------------------------------------------------------------------------------------
def _check_decode(packed, absmax, shape, idx, cols, block_size) -> tuple[int, int, int]:
    """(out, in, r) after checking the decode's arguments; ValueError on anything inconsistent."""
    if len(tuple(shape)) != 2 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
        raise ValueError(f"shape must be (out_features, in_features), two positive ints, got {tuple(shape)}")
    out_f, in_f = shape
    n = out_f * in_f
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if packed.dtype != torch.uint8 or packed.dim() != 1 or packed.numel() != (n + 1) // 2:
        raise ValueError(f"{n} values need a 1-D uint8 packed tensor of {(n + 1) // 2} bytes, "
                         f"got {packed.dtype} of shape {tuple(packed.shape)}")
    if not absmax.is_floating_point() or absmax.dim() != 1 or absmax.numel() != -(-n // block_size):
        raise ValueError(f"{n} values in blocks of {block_size} need a 1-D float absmax of {-(-n // block_size)} "
                         f"values, got {absmax.dtype} of shape {tuple(absmax.shape)}")
    if idx.dim() != 1 or idx.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"idx must be a 1-D int64 tensor of column indices, got {idx.dtype} of shape {tuple(idx.shape)}")
    r = idx.numel()
    if r and not (0 <= int(idx.min()) and int(idx.max()) < in_f):
        raise ValueError(f"idx holds columns outside [0, {in_f})")
    if torch.unique(idx).numel() != r:
        raise ValueError("idx must hold distinct columns: a column cannot be overridden twice")
    if not cols.is_floating_point() or tuple(cols.shape) != (out_f, r):
        raise ValueError(f"cols must be a float tensor of shape (out_features, r) = {(out_f, r)}, "
                         f"got {cols.dtype} of shape {tuple(cols.shape)}")
    devices = {t.device for t in (packed, absmax, idx, cols)}
    if len(devices) != 1:
        raise ValueError(f"packed, absmax, idx and cols must be on one device, got {sorted(map(str, devices))}")
    return out_f, in_f, r


def nf4_decode_columns_torch(packed: torch.Tensor, absmax: torch.Tensor, shape, idx: torch.Tensor,
                             cols: torch.Tensor, block_size: int = 64) -> torch.Tensor:
    """The NF4 weight of ``shape`` = (out, in), decoded, with its columns ``idx`` replaced by ``cols``. PyTorch.

    Args:
        packed, absmax: chapter 8's layout (:func:`nf4_encode`) of out · in values.
        idx: (r,) int64 (int32 accepted), distinct columns in [0, in); r = 0 gives the plain decode.
        cols: (out, r) float32 (another float dtype is converted to float32 by the copy).

    Returns:
        A new float32 (out, in) tensor: ``levels[code] * absmax[block]``, then ``out[:, idx[t]] = cols[:, t]``
        (an in-place ``index_copy_``, so autograd reaches ``cols`` if it requires grad).

    Bytes moved: chapter 8's unfused decode (n / 2 + 4 n / block_size read, 4 n written, plus its full-size
    temporaries), then the columns: 4 · out · r read and written again into ``W``, strided.
    """
    _check_decode(packed, absmax, shape, idx, cols, block_size)
    w = _nf4.nf4_decode_torch(packed, absmax.float(), _levels(str(packed.device)), tuple(shape), block_size)
    return w.index_copy_(1, idx.long(), cols.to(torch.float32))


# --- kernel --------------------------------------------------------------------------------------------
@triton.jit
def _nf4_decode_columns_kernel(packed_ptr, absmax_ptr, levels_ptr, slot_ptr, cols_ptr, out_ptr,
                               n_elements, in_features, rank,
                               QUANT_BLOCK: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    pid = tl.program_id(0)
    if WIDE:  # n_elements >= 2**31: 64-bit offsets
        pid = pid.to(tl.int64)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)  # flattened elements of W (row-major) of this program
    mask = offsets < n_elements  # the last program may run past the end
    row = offsets // in_features
    col = offsets % in_features
    slot = tl.load(slot_ptr + col, mask=mask, other=-1)  # in_features int32: stays in cache
    override = mask & (slot >= 0)
    decode = mask & (slot < 0)  # an overridden element needs no code nor absmax
    byte = tl.load(packed_ptr + offsets // 2, mask=decode, other=0).to(tl.int32)
    code = tl.where(offsets % 2 == 0, byte >> 4, byte & 15)  # even element: high nibble
    level = tl.load(levels_ptr + code, mask=decode, other=0.0)  # 16 entries: stays in cache
    scale = tl.load(absmax_ptr + offsets // QUANT_BLOCK, mask=decode, other=0.0)
    # Epilogue: the r trainable columns replace what was decoded, in the same store.
    kept = tl.load(cols_ptr + row * rank + slot, mask=override, other=0.0)
    tl.store(out_ptr + offsets, tl.where(override, kept, level * scale), mask=mask)


# --- launchers -----------------------------------------------------------------------------------------
def nf4_decode_columns_triton(packed: torch.Tensor, absmax: torch.Tensor, shape, idx: torch.Tensor,
                              cols: torch.Tensor, block_size: int = 64, BLOCK: int = 1024) -> torch.Tensor:
    """Triton version of :func:`nf4_decode_columns_torch` (same arguments, same result bit for bit), in one
    kernel launch; ``BLOCK`` (a power of two) elements per program. No autograd through ``cols``."""
    out_f, in_f, r = _check_decode(packed, absmax, shape, idx, cols, block_size)
    if isinstance(BLOCK, bool) or not isinstance(BLOCK, int) or BLOCK < 1 or BLOCK & (BLOCK - 1):
        raise ValueError(f"BLOCK must be a power of two, got {BLOCK!r}")
    return _decode_columns(packed, absmax, _slots(idx, in_f), cols, (out_f, in_f), block_size, BLOCK)


def _slots(idx: torch.Tensor, in_features: int) -> torch.Tensor:
    """The host-built map of the epilogue: int32 (in_features,), ``slot[idx[t]] = t``, -1 elsewhere."""
    slot = torch.full((in_features,), -1, dtype=torch.int32, device=idx.device)
    slot[idx.long()] = torch.arange(idx.numel(), dtype=torch.int32, device=idx.device)
    return slot


def _decode_columns(packed, absmax, slot, cols, shape, block_size: int, BLOCK: int) -> torch.Tensor:
    """The launch alone, on checked arguments (no check synchronizes with the GPU here: the benchmark times it)."""
    out_f, in_f = shape
    n = out_f * in_f
    device = packed.device
    kept = cols.detach().to(torch.float32).contiguous()
    if kept.numel() == 0:
        kept = torch.zeros(1, dtype=torch.float32, device=device)  # never read: every slot is -1
    out = torch.empty(out_f, in_f, dtype=torch.float32, device=device)
    grid = (triton.cdiv(n, BLOCK),)
    _nf4_decode_columns_kernel[grid](packed.contiguous(), absmax.float().contiguous(), _levels(str(device)),
                                     slot, kept, out, n, in_f, cols.shape[1],
                                     QUANT_BLOCK=block_size, BLOCK=BLOCK, WIDE=n + BLOCK >= 2**31)
    return out


def _check_grad_p(g, x, idx, scale) -> None:
    if g.dim() != 2 or x.dim() != 2 or g.shape[0] != x.shape[0]:
        raise ValueError(f"g must be (M, out) and x (M, in) with the same M, got {tuple(g.shape)} and {tuple(x.shape)} "
                         "(flatten the leading dimensions first)")
    if not g.is_floating_point() or g.dtype != x.dtype:
        raise ValueError(f"g and x must share one floating-point dtype, got {g.dtype} and {x.dtype}")
    if idx.dim() != 1 or idx.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"idx must be a 1-D int64 tensor of column indices, got {idx.dtype} of shape {tuple(idx.shape)}")
    if idx.numel() and not (0 <= int(idx.min()) and int(idx.max()) < x.shape[1]):
        raise ValueError(f"idx holds columns outside [0, {x.shape[1]})")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite Python number (alpha / r), got {scale!r}")


def paca_grad_p_torch(g: torch.Tensor, x: torch.Tensor, idx: torch.Tensor, scale: float) -> torch.Tensor:
    """dP = scale · gᵀ x[:, idx]: g (M, out), x (M, in), idx (r,) -> (out, r) in g's dtype. PyTorch.

    Bytes moved: the copy ``x[:, idx]`` is written (M · r) and read back by the product, which reads g once.
    """
    _check_grad_p(g, x, idx, scale)
    return scale * (g.t() @ x[:, idx])


def paca_grad_p(g: torch.Tensor, x: torch.Tensor, idx: torch.Tensor, scale: float) -> torch.Tensor:
    """Triton version of :func:`paca_grad_p_torch` (same arguments; float32 accumulation, then one
    multiplication by ``scale``): ``gather_matmul(g.t(), x, cols=idx)`` of chapter 6, which reads the
    columns ``idx`` of ``x`` in place. Zeros when M = 0. No autograd."""
    _check_grad_p(g, x, idx, scale)
    r = idx.numel()
    block_n = 16 if r <= 16 else 32 if r <= 32 else 64
    grad = _gemm.gather_matmul(g.detach().t(), x.detach(), cols=idx, block_m=64, block_n=block_n, block_k=32)
    return grad.mul_(scale)


# --- test helpers --------------------------------------------------------------------------------------
def random_inputs(out_features: int, in_features: int, rank: int, block_size: int = 64, tokens: int = 5,
                  seed: int = 0, device: str = "cpu") -> dict:
    """A random case for both kernels: ``packed`` (every code occurs), positive ``absmax``, ``shape``,
    ``idx`` (rank distinct columns, random order), ``cols`` (out, rank), and for dP ``g`` (tokens, out),
    ``x`` (tokens, in) and ``scale`` (2.0). float32 throughout."""
    gen = torch.Generator().manual_seed(seed)
    n = out_features * in_features
    case = {
        "packed": torch.randint(0, 256, ((n + 1) // 2,), generator=gen, dtype=torch.uint8),
        "absmax": torch.rand(-(-n // block_size), generator=gen) + 0.1,
        "idx": torch.randperm(in_features, generator=gen)[:rank],
        "cols": torch.randn(out_features, rank, generator=gen),
        "g": torch.randn(tokens, out_features, generator=gen),
        "x": torch.randn(tokens, in_features, generator=gen),
    }
    case = {k: v.to(device) for k, v in case.items()}
    return {**case, "shape": (out_features, in_features), "scale": 2.0}


def max_error(out_features: int, in_features: int, rank: int, block_size: int = 64, tokens: int = 5,
              seed: int = 0, device: str = "cpu", BLOCK: int = 1024) -> dict[str, float]:
    """Largest |Triton - reference| of each kernel on :func:`random_inputs`: ``decode`` against
    :func:`nf4_decode_columns_torch` (0.0 when they agree bit for bit) and ``grad_p`` against
    ``scale · gᵀ x[:, idx]`` in float64."""
    c = random_inputs(out_features, in_features, rank, block_size, tokens, seed, device)
    args = (c["packed"], c["absmax"], c["shape"], c["idx"], c["cols"], block_size)
    decode = (nf4_decode_columns_triton(*args, BLOCK=BLOCK) - nf4_decode_columns_torch(*args)).abs().max().item()
    exact = c["scale"] * (c["g"].double().t() @ c["x"].double()[:, c["idx"]])
    got = paca_grad_p(c["g"], c["x"], c["idx"], c["scale"]).double()
    return {"decode": decode, "grad_p": (got - exact).abs().max().item() if got.numel() else 0.0}


# --- benchmark -----------------------------------------------------------------------------------------
def benchmark(out_features: int = 8192, in_features: int = 8192, rank: int = 64, tokens: int = 8192,
              block_size: int = 64) -> dict[str, float]:
    """On CUDA, for an (out, in) NF4 weight with ``rank`` overridden columns and ``tokens`` rows of g and x:

    - ``decode triton`` / ``decode+copy`` / ``decode pytorch``: GB/s (the least traffic, ``n / 2 + 4 n /
      block_size + 4 in + 4 out r`` read and ``4 n`` written, per second) of the fused kernel, of chapter 8's
      Triton decode followed by ``index_copy_``, and of chapter 8's PyTorch decode followed by ``index_copy_``
      (the reference). Each times the work alone: the argument checks (which wait for the GPU) are left out,
      and the slot map of the epilogue is built once, as a layer whose idx never changes would keep it;
    - ``grad_p triton`` / ``grad_p pytorch``: milliseconds of :func:`paca_grad_p` (float32 inputs, its checks
      and gather_matmul's included) and of ``scale * (g.t() @ x[:, idx])``.

    Raises RuntimeError without CUDA."""
    if not torch.cuda.is_available():
        raise RuntimeError("the benchmark needs CUDA")
    c = random_inputs(out_features, in_features, rank, block_size, tokens, device="cuda")
    packed, absmax, shape, idx, cols = c["packed"], c["absmax"], c["shape"], c["idx"], c["cols"]
    n = out_features * in_features
    moved = packed.nbytes + absmax.nbytes + 4 * in_features + cols.nbytes + 4 * n
    levels, slot = _levels(str(packed.device)), _slots(idx, in_features)
    runs = {
        "decode triton": lambda: _decode_columns(packed, absmax, slot, cols, shape, block_size, 1024),
        "decode+copy": lambda: _nf4.nf4_decode_triton(packed, absmax, levels, shape, block_size).index_copy_(1, idx, cols),
        "decode pytorch": lambda: _nf4.nf4_decode_torch(packed, absmax, levels, shape, block_size).index_copy_(1, idx, cols),
    }
    results = {name: moved / (triton.testing.do_bench(fn) * 1e-3) / 1e9 for name, fn in runs.items()}
    g, x, scale = c["g"], c["x"], c["scale"]
    results["grad_p triton"] = triton.testing.do_bench(lambda: paca_grad_p(g, x, idx, scale))
    results["grad_p pytorch"] = triton.testing.do_bench(lambda: scale * (g.t() @ x[:, idx]))
    return results


def main() -> None:
    if not torch.cuda.is_available():
        print("CUDA not available: skipped (the kernels still run on CPU in Triton's interpreter, "
              "see tests/test_kernels_ch15_paca.py)")
        return
    print(f"QPaCA decode of an NF4 weight with r columns overridden, GB/s of least traffic; "
          f"dP = s g^T x[:, idx] for 8192 tokens, ms ({torch.cuda.get_device_name()})")
    heads = ("decode triton", "decode+copy", "decode pytorch", "grad_p triton", "grad_p pytorch")
    print(f"{'out x in':>12} | {'r':>4} | " + " | ".join(heads) + " | equal")
    for out_f, in_f in ((4096, 4096), (8192, 8192)):
        for r in (16, 64, 256):
            err = max_error(out_f, in_f, r, tokens=256, seed=1, device="cuda")
            res = benchmark(out_f, in_f, r)
            same = "bit for bit" if err["decode"] == 0.0 else f"NO ({err['decode']:.2e})"
            print(f"{f'{out_f}x{in_f}':>12} | {r:>4} | " + " | ".join(f"{res[h]:>{len(h)}.2f}" for h in heads)
                  + f" | {same}, dP err {err['grad_p']:.1e}")


if __name__ == "__main__":
    main()
