"""ALAM's average quantization (chapter 13): means of 4 activations, 2 bits each, packed four to a byte.

:func:`aq_pack_triton` compresses a saved activation ``x`` (any shape, ``n`` elements, flattened row-major)
into what ALAM's AQ keeps for backward, in the layout of chapter 13's exercises ``group_quantize`` and
``average_quantize`` (the same bytes, up to float32 rounding of a scale; see "Divisions" below):

- **means**: ``M = ceil(n / average)`` float32 means of runs of ``average`` contiguous elements; when ``n``
  is not a multiple of ``average``, the last mean is over the ``n % average`` remaining elements. Each mean
  is ``sum / count`` in float32, the sum taken **left to right** (``((x0 + x1) + x2) + x3``): float addition
  is not associative, and a fixed order is what lets the kernel and the reference agree bit for bit.
- **groups** of ``group_size`` consecutive means (the last may be partial), ``G = ceil(M / group_size)``:
  ``mins[g]`` and ``mx`` over the group's real means, ``scales[g] = 3 / (mx - mins[g] + 2e-6)`` (float32;
  the 2e-6 keeps a constant group finite).
- **codes** ``q = floor((mean - mins[g]) * scales[g] + u)`` clamped to [0, 3], ``u`` in [0, 1) one per
  mean taken from the ``noise`` argument (stochastic rounding with the randomness made explicit, so that
  results are exact and testable). Four codes per byte, neighbours together, least significant bits first:
  byte ``j`` holds means ``4j .. 4j + 3``, mean ``4j + i`` in bits ``[2i, 2i + 2)``; the padding of the last
  group (means ``M .. G * group_size - 1``) holds code 0. ``codes`` is uint8 of ``G * group_size / 4`` bytes.

:func:`aq_unpack_triton` reverses it: ``q / scales[g] + mins[g]`` per mean, each mean repeated ``average``
times, the first ``n`` values reshaped to ``shape`` (float32).

What it teaches: AQ keeps 0.5 bit per element plus two float32 numbers per ``average * group_size``
elements, and one fused pass computes all of it. Per element, pack reads 4 bytes of ``x`` and
``4 / average`` of noise and writes ``2 / 8 / average`` bytes of codes plus 8 bytes per group of
``group_size`` means: it is bound by memory bandwidth, and a fused kernel reads each input once, where the
PyTorch reference writes and reads back several full-size temporaries.

Kernels (one program per group of ``group_size`` means for pack, per ``BLOCK`` outputs for unpack; plain
pointer arithmetic, masks for every tail):

- ``_aq_pack_kernel`` loads its ``(group_size, average)`` tile of ``x`` in one coalesced load (padded to
  powers of two, masked lanes read 0.0), takes column ``j`` out of it with ``tl.sum`` over a one-hot mask
  (one value plus zeros: exact in any order) and adds the columns left to right. ``tl.sum`` over the whole
  row would have no fixed order: the interpreter's NumPy sums rows of up to 7 left to right but rows of 8 or
  more pairwise, and on a GPU the order depends on how the layout spreads a row over threads.
  Then masked ``tl.min`` / ``tl.max`` over the live means, the codes from the noise, and the packing:
  ``tl.reshape(q, (group_size / 4, 4))``, column ``i`` shifted left by ``2i``, rows summed (disjoint bits:
  the sum is an OR).
- ``_aq_unpack_kernel`` gathers, for each output element ``i``, the byte of mean ``i // average``, its two
  bits, and its group's min and scale.

Divisions use ``tl.math.div_rn`` (IEEE rounding, as PyTorch's tensor ``/`` tensor; a plain ``/`` may compile
to an approximate division on a GPU; and PyTorch's ``3 / t`` with a Python number is ``t.reciprocal() * 3``,
one ulp off the division for about a quarter of the groups, so the reference divides two tensors), and CUDA launches pass ``enable_fp_fusion=False`` so that
``(mean - min) * scale + u`` is not contracted into one fused multiply-add, which rounds once instead of
twice. Without a GPU both kernels run in Triton's interpreter (``import kernels`` switches it on). Hazards:
the interpreter's ``tl.min`` / ``tl.max`` skip NaNs (NumPy's ``nanmin``), a GPU's do not, so inputs with NaN
give different results (neither is meaningful); ``tl.sum``, ``tl.min`` and ``tl.max`` run in the interpreter only
if it was switched on before Triton was imported (import ``kernels`` first; the pack launcher says so
otherwise). Indices are int64, so sizes past 2**31 elements work.

``python -m kernels.ch13_alam`` runs the GPU bandwidth benchmark (skipped without CUDA).
"""
from __future__ import annotations

import math

import torch

import kernels  # before triton: switches the Triton interpreter on when there is no GPU
import triton
import triton.language as tl

BITS = 2  # AQ codes its means at 2 bits: four codes per byte


# --- reference -----------------------------------------------------------------------------------


def _check_arguments(average, group_size) -> None:
    if isinstance(average, bool) or not isinstance(average, int) or average <= 0:
        raise ValueError(f"average must be a positive int, got {average!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0 or group_size % 4:
        raise ValueError(f"group_size must be a positive multiple of 4 (four 2-bit codes per byte), got {group_size!r}")


def _flat_inputs(x: torch.Tensor, noise: torch.Tensor, average: int, group_size: int):
    """x flattened to float32, noise flattened to float32, n, M and G, after checking them."""
    _check_arguments(average, group_size)
    if not (x.is_floating_point() and noise.is_floating_point()):
        raise ValueError(f"x and noise must be floating-point tensors, got {x.dtype} and {noise.dtype}")
    n = x.numel()
    if n == 0:
        raise ValueError("x is empty: nothing to quantize")
    m = -(-n // average)
    if noise.numel() != m:
        raise ValueError(f"noise must hold ceil(n / average) = {m} values (one per mean, any shape), "
                         f"got {noise.numel()}")
    if noise.device != x.device:
        raise ValueError(f"x and noise must be on the same device, got {x.device} and {noise.device}")
    flat = x.detach().reshape(-1).to(torch.float32).contiguous()
    u = noise.detach().reshape(-1).to(torch.float32).contiguous()
    return flat, u, n, m, -(-m // group_size)


def aq_pack_torch(x: torch.Tensor, noise: torch.Tensor, average: int = 4, group_size: int = 128):
    """Plain PyTorch. x: floating point, any shape, n >= 1 elements (converted to float32); noise: M =
    ceil(n / average) values in [0, 1), any shape (one per mean, in order) -> (codes uint8 (G * group_size / 4,),
    mins float32 (G,), scales float32 (G,)), G = ceil(M / group_size), in the layout of the module docstring.

    Bytes moved: reads 4 n (x) + 4 M (noise); writes M / 4 (codes) + 8 G. Unfused, it also writes and reads
    back a zero-padded copy of x (4 n), the running sums and the means (4 M each, ``average`` times for the
    sums), the unpacked codes and their shifted copies (several times M bytes).
    """
    flat, u, n, m, groups = _flat_inputs(x, noise, average, group_size)
    table = torch.nn.functional.pad(flat, (0, m * average - n)).view(m, average)  # the remainder's run padded with 0.0
    sums = table[:, 0].clone()
    for j in range(1, average):  # left to right, as the kernel adds its columns (adding 0.0 changes no sum)
        sums = sums + table[:, j]
    counts = torch.full((m,), float(average), device=flat.device)
    counts[-1] = n - (m - 1) * average
    means = sums / counts
    padded = torch.cat([means, means[-1:].expand(groups * group_size - m)])  # the last mean again: same min, max
    mins, maxs = padded.view(groups, group_size).aminmax(dim=1)
    # a tensor numerator: `3 / t` would be PyTorch's reciprocal-then-multiply, which can be 1 ulp off the division
    scales = torch.full_like(maxs, 2 ** BITS - 1) / (maxs - mins + 2e-6)
    lifted = (means - mins.repeat_interleave(group_size)[:m]) * scales.repeat_interleave(group_size)[:m]
    q = torch.floor(lifted + u).clamp(0, 2 ** BITS - 1).to(torch.uint8)
    q = torch.nn.functional.pad(q, (0, groups * group_size - m)).view(-1, 4)  # padding positions: code 0
    codes = q[:, 0] | (q[:, 1] << 2) | (q[:, 2] << 4) | (q[:, 3] << 6)  # mean 4j + i in bits [2i, 2i + 2)
    return codes, mins, scales


def _check_packed(codes: torch.Tensor, mins: torch.Tensor, scales: torch.Tensor, shape, average: int,
                  group_size: int) -> tuple[int, int, int]:
    """n, M and G of a packed tensor, after checking that codes, mins and scales fit ``shape``."""
    _check_arguments(average, group_size)
    n = math.prod(shape)
    if n <= 0:
        raise ValueError(f"shape must have at least one element, got {tuple(shape)}")
    m = -(-n // average)
    groups = -(-m // group_size)
    if codes.dtype != torch.uint8 or codes.dim() != 1 or codes.numel() != groups * group_size // 4:
        raise ValueError(f"{n} elements ({m} means, {groups} groups of {group_size}) need a flat uint8 codes tensor of "
                         f"{groups * group_size // 4} bytes, got {codes.dtype} of shape {tuple(codes.shape)}")
    if mins.numel() != groups or scales.numel() != groups:
        raise ValueError(f"{groups} groups need {groups} mins and scales, got {mins.numel()} and {scales.numel()}")
    if not (mins.device == scales.device == codes.device):
        raise ValueError(f"codes, mins and scales must be on one device, got {codes.device}, {mins.device}, "
                         f"{scales.device}")
    return n, m, groups


def aq_unpack_torch(codes: torch.Tensor, mins: torch.Tensor, scales: torch.Tensor, shape, average: int = 4,
                    group_size: int = 128) -> torch.Tensor:
    """Plain PyTorch: what :func:`aq_pack_torch` returned for an x of ``shape`` -> float32 of ``shape``,
    element p = q / scales[g] + mins[g] of mean i = p // average, g = i // group_size.

    Bytes moved: reads M / 4 (codes) + 8 G; writes 4 n. Unfused, it also materializes the unpacked codes,
    the per-mean scales and mins and the dequantized means before repeating them.
    """
    n, m, groups = _check_packed(codes, mins, scales, shape, average, group_size)
    shifts = torch.arange(0, 8, 2, dtype=torch.uint8, device=codes.device)
    q = ((codes.reshape(-1, 1) >> shifts) & 3).reshape(-1)[:m].to(torch.float32)
    per_mean_scale = scales.to(torch.float32).repeat_interleave(group_size)[:m]
    per_mean_min = mins.to(torch.float32).repeat_interleave(group_size)[:m]
    means = q / per_mean_scale + per_mean_min
    return means.repeat_interleave(average)[:n].reshape(tuple(shape))


# --- kernels -------------------------------------------------------------------------------------


@triton.jit
def _aq_pack_kernel(x_ptr, noise_ptr, codes_ptr, mins_ptr, scales_ptr, n, M,
                    AVERAGE: tl.constexpr, AVERAGE_P2: tl.constexpr, GROUP: tl.constexpr, GROUP_P2: tl.constexpr):
    g = tl.program_id(0).to(tl.int64)  # int64 indices: no overflow past 2**31 elements
    local = tl.arange(0, GROUP_P2)
    idx = g * GROUP + local  # the means this program owns
    live = (local < GROUP) & (idx < M)
    col = tl.arange(0, AVERAGE_P2)
    pos = idx[:, None] * AVERAGE + col[None, :]  # (GROUP_P2, AVERAGE_P2): element j of mean idx
    tile = tl.load(x_ptr + pos, mask=live[:, None] & (col[None, :] < AVERAGE) & (pos < n), other=0.0)
    total = tl.sum(tl.where(col[None, :] == 0, tile, 0.0), 1)  # column 0: one value plus zeros, exact
    for j in tl.static_range(1, AVERAGE):  # left to right, as the reference adds
        total = total + tl.sum(tl.where(col[None, :] == j, tile, 0.0), 1)
    count = tl.maximum(tl.minimum(n - idx * AVERAGE, AVERAGE), 1).to(tl.float32)  # the remainder's run is shorter
    means = tl.math.div_rn(total, count)
    mn = tl.min(tl.where(live, means, float("inf")), 0)
    mx = tl.max(tl.where(live, means, float("-inf")), 0)
    scale = tl.math.div_rn(3.0, mx - mn + 2e-6)
    u = tl.load(noise_ptr + idx, mask=live, other=0.0)
    q = tl.floor((means - mn) * scale + u)
    q = tl.minimum(tl.maximum(q, 0.0), 3.0)
    q = tl.where(live, q, 0.0).to(tl.int32)  # padding positions hold code 0
    quads = tl.reshape(q, (GROUP_P2 // 4, 4))  # row j: means 4j .. 4j + 3 of this group
    shifts = tl.arange(0, 4) * 2
    packed = tl.sum(quads << shifts[None, :], 1)  # disjoint bits: the sum is an OR
    byte = tl.arange(0, GROUP_P2 // 4)
    tl.store(codes_ptr + g * (GROUP // 4) + byte, packed.to(tl.uint8), mask=byte < GROUP // 4)
    tl.store(mins_ptr + g, mn)
    tl.store(scales_ptr + g, scale)


@triton.jit
def _aq_unpack_kernel(codes_ptr, mins_ptr, scales_ptr, out_ptr, n, AVERAGE: tl.constexpr, GROUP: tl.constexpr,
                      BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # output elements of this program
    mask = offsets < n
    mean = offsets // AVERAGE
    group = mean // GROUP
    byte = tl.load(codes_ptr + mean // 4, mask=mask, other=0).to(tl.int32)
    q = ((byte >> ((mean % 4) * 2).to(tl.int32)) & 3).to(tl.float32)
    scale = tl.load(scales_ptr + group, mask=mask, other=1.0)
    mn = tl.load(mins_ptr + group, mask=mask, other=0.0)
    tl.store(out_ptr + offsets, tl.math.div_rn(q, scale) + mn, mask=mask)


# --- launchers -----------------------------------------------------------------------------------


def _check_interpreter() -> None:
    """The interpreter runs ``tl.sum``, ``tl.min`` and ``tl.max`` only if it was on when Triton was imported."""
    if kernels.INTERPRETED and not isinstance(tl.sum, triton.runtime.interpreter.InterpretedFunction):
        raise RuntimeError("Triton was imported before the interpreter was switched on, so its tl.sum, tl.min and "
                           "tl.max cannot run in it: import kernels (or coursekit) before triton, or set "
                           "TRITON_INTERPRET=1 before starting Python")


def _launch_options(t: torch.Tensor) -> dict:
    # no fused multiply-add on a GPU: (mean - min) * scale + u rounds twice, as in PyTorch
    return {"enable_fp_fusion": False} if t.is_cuda else {}


def aq_pack_triton(x: torch.Tensor, noise: torch.Tensor, average: int = 4, group_size: int = 128):
    """Triton version of :func:`aq_pack_torch` (same arguments, same result bit for bit): one program per
    group of ``group_size`` means. Inputs other than float32 are converted to float32 before the launch."""
    flat, u, n, m, groups = _flat_inputs(x, noise, average, group_size)
    _check_interpreter()
    codes = torch.empty(groups * group_size // 4, dtype=torch.uint8, device=flat.device)
    mins = torch.empty(groups, dtype=torch.float32, device=flat.device)
    scales = torch.empty(groups, dtype=torch.float32, device=flat.device)
    _aq_pack_kernel[(groups,)](flat, u, codes, mins, scales, n, m, AVERAGE=average,
                               AVERAGE_P2=triton.next_power_of_2(average), GROUP=group_size,
                               GROUP_P2=triton.next_power_of_2(group_size), **_launch_options(flat))
    return codes, mins, scales


def aq_unpack_triton(codes: torch.Tensor, mins: torch.Tensor, scales: torch.Tensor, shape, average: int = 4,
                     group_size: int = 128, BLOCK: int = 1024) -> torch.Tensor:
    """Triton version of :func:`aq_unpack_torch` (same arguments, same result bit for bit): one program per
    ``BLOCK`` output elements."""
    n, _, _ = _check_packed(codes, mins, scales, shape, average, group_size)
    out = torch.empty(n, dtype=torch.float32, device=codes.device)
    _aq_unpack_kernel[(triton.cdiv(n, BLOCK),)](codes.contiguous(), mins.to(torch.float32).contiguous(),
                                                scales.to(torch.float32).contiguous(), out, n, AVERAGE=average,
                                                GROUP=group_size, BLOCK=BLOCK, **_launch_options(out))
    return out.reshape(tuple(shape))


# --- test helpers --------------------------------------------------------------------------------


def random_inputs(shape, average: int = 4, seed: int = 0, device: str = "cpu", dyadic: bool = False):
    """A reproducible x of ``shape`` and its noise (ceil(n / average) values in [0, 1)).

    ``dyadic=True`` draws x from multiples of 1/8 in [-8, 8): every sum of a run is then exact in float32, in
    any order, which makes a comparison independent of how a compiled ``tl.sum`` orders its additions.
    """
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    if dyadic:
        x = torch.randint(-64, 64, tuple(shape), generator=g).to(torch.float32) / 8
    else:
        x = torch.randn(tuple(shape), generator=g)
    noise = torch.rand(-(-n // average), generator=g)
    return x.to(device), noise.to(device)


def compare_with_reference(shape, average: int = 4, group_size: int = 128, seed: int = 0, device: str = "cpu",
                           BLOCK: int = 1024, dyadic: bool = False) -> dict[str, bool]:
    """Pack and unpack random inputs with Triton and with PyTorch: which results agree exactly."""
    x, noise = random_inputs(shape, average, seed, device, dyadic)
    got = aq_pack_triton(x, noise, average, group_size)
    want = aq_pack_torch(x, noise, average, group_size)
    out = {name: torch.equal(a, b) for name, a, b in zip(("codes", "mins", "scales"), got, want)}
    unpacked = aq_unpack_triton(*want, shape, average, group_size, BLOCK)
    out["unpack"] = unpacked.shape == tuple(shape) and torch.equal(unpacked, aq_unpack_torch(*want, shape, average,
                                                                                             group_size))
    return out


# --- benchmark -----------------------------------------------------------------------------------


def moved_bytes(n: int, average: int = 4, group_size: int = 128) -> dict[str, int]:
    """The least traffic of each direction for n elements: pack reads x and the noise and writes codes,
    mins and scales; unpack reads codes, mins and scales and writes x."""
    m = -(-n // average)
    groups = -(-m // group_size)
    packed = groups * group_size // 4 + 8 * groups
    return {"pack": 4 * n + 4 * m + packed, "unpack": packed + 4 * n}


def benchmark(n: int = 1 << 26, average: int = 4, group_size: int = 128) -> dict[str, float]:
    """GB/s (:func:`moved_bytes` per second) of pack and unpack, Triton and PyTorch, on CUDA, for n elements.
    Raises RuntimeError without CUDA."""
    if not torch.cuda.is_available():
        raise RuntimeError("the bandwidth benchmark needs CUDA")
    x, noise = random_inputs((n,), average, device="cuda")
    packed = aq_pack_triton(x, noise, average, group_size)
    moved = moved_bytes(n, average, group_size)
    runs = {
        "pack triton": (lambda: aq_pack_triton(x, noise, average, group_size), moved["pack"]),
        "pack pytorch": (lambda: aq_pack_torch(x, noise, average, group_size), moved["pack"]),
        "unpack triton": (lambda: aq_unpack_triton(*packed, (n,), average, group_size), moved["unpack"]),
        "unpack pytorch": (lambda: aq_unpack_torch(*packed, (n,), average, group_size), moved["unpack"]),
    }
    return {name: nbytes / (triton.testing.do_bench(fn) * 1e-3) / 1e9 for name, (fn, nbytes) in runs.items()}


def main() -> None:
    if not torch.cuda.is_available():
        print("CUDA not available: skipped (the kernels still run on CPU in Triton's interpreter, "
              "see tests/test_kernels_ch13_alam.py)")
        return
    heads = ("pack triton", "pack pytorch", "unpack triton", "unpack pytorch")
    print(f"AQ (average 4, groups of 128 means), GB/s of least traffic ({torch.cuda.get_device_name()})")
    print(f"{'elements':>13} | " + " | ".join(heads) + " | equal to PyTorch")
    for n in (1 << 20, 1 << 24, (1 << 27) + 3):
        same = all(compare_with_reference((n,), seed=1, device="cuda").values())
        gbs = benchmark(n)
        print(f"{n:>13,} | " + " | ".join(f"{gbs[h]:>{len(h)}.1f}" for h in heads) + f" | {'bit for bit' if same else 'NO'}")


if __name__ == "__main__":
    main()
