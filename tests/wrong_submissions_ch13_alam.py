"""Plausible wrong answers for ch13_alam, one per exercise: each must lose points when autograded.

``WRONG``: group_quantize rounds to nearest (noise ignored, 0.5 added); group_dequantize reads the codes most significant bits first; average_quantize averages across the first dimension (tokens) instead of contiguous elements; average_dequantize tiles the means instead of repeating each one; compressed_bits leaves the per-group min and scale out; compress_hooks compresses parameters too; gradnormvar uses one pair only; allocate_bits does not divide the priority by the elements; average_quantize_triton launches the kernel but returns average_quantize's torch result.
``CACHE_WRONG``: compress_hooks whose values are right but that keep every packed tensor (its memory cell
fails, read from outside the process)."""

WRONG = {
    ("ch13_alam", "group_quantize"): '''
import torch


def group_quantize(x, bits, noise, group_size=128):
    """Per-group min/scale, stochastic codes, packed least significant bits first."""
    if type(bits) is not int or bits not in (1, 2, 4, 8):
        raise ValueError("bits must be one of 1, 2, 4, 8")
    k = 8 // bits
    if type(group_size) is not int or group_size < 1 or group_size % k != 0:
        raise ValueError("group_size must be a positive multiple of 8 / bits")
    if noise.shape != x.shape:
        raise ValueError("noise must have the shape of x")
    if x.numel() == 0:
        raise ValueError("empty input")
    n = x.numel()
    G = (n + group_size - 1) // group_size
    v = torch.zeros(G * group_size, dtype=torch.float32)
    v[:n] = x.detach().flatten().float()
    r = torch.zeros(G * group_size, dtype=torch.float32)
    r[:n] = noise.detach().flatten().float()
    real = torch.arange(G * group_size) < n
    lo = torch.where(real, v, torch.tensor(float("inf"))).view(G, group_size).min(dim=1).values
    hi = torch.where(real, v, torch.tensor(float("-inf"))).view(G, group_size).max(dim=1).values
    levels = 2 ** bits - 1
    scale = levels / (hi - lo + 2e-6)
    grid = torch.floor((v.view(G, group_size) - lo.unsqueeze(1)) * scale.unsqueeze(1) + 0.5)
    q = torch.clamp(grid, 0, levels).flatten().long()
    q = torch.where(real, q, torch.zeros_like(q))
    weights = torch.tensor([2 ** (i * bits) for i in range(k)], dtype=torch.long)
    codes = (q.view(-1, k) * weights).sum(dim=1).to(torch.uint8)
    return codes, lo.float(), scale.float()
''',
    ("ch13_alam", "group_dequantize"): '''
import torch


def group_dequantize(codes, mins, scales, bits, shape, group_size=128):
    """q / scale + min, position by position."""
    k = 8 // bits
    n = 1
    for s in shape:
        n *= int(s)
    pos = torch.arange(n)
    byte = codes.long()[pos // k]
    q = (byte // (2 ** ((k - 1 - pos % k) * bits))) % (2 ** bits)
    g = pos // group_size
    return (q.float() / scales[g] + mins[g]).reshape(tuple(shape))
''',
    ("ch13_alam", "average_quantize"): '''
import torch


def average_quantize(x, noise, average=4, group_size=128):
    """Means of contiguous runs (remainder: its own mean), then 2-bit group_quantize."""
    if type(average) is not int or average < 1:
        raise ValueError("average must be a positive int")
    v = x.detach().transpose(0, -1).flatten().float()
    n = v.numel()
    M = (n + average - 1) // average
    if tuple(noise.shape) != (M,):
        raise ValueError(f"noise must have shape ({M},)")
    padded = torch.zeros(M * average, dtype=torch.float32)
    padded[:n] = v
    counts = torch.full((M,), float(average))
    counts[-1] = n - (M - 1) * average
    means = padded.view(M, average).sum(dim=1) / counts
    return group_quantize(means, 2, noise, group_size)
''',
    ("ch13_alam", "average_dequantize"): '''
import torch


def average_dequantize(codes, mins, scales, shape, average=4, group_size=128):
    """Each element takes its run's dequantized mean."""
    n = 1
    for s in shape:
        n *= int(s)
    M = (n + average - 1) // average
    means = group_dequantize(codes, mins, scales, 2, (M,), group_size)
    return means[torch.arange(n) % M].reshape(tuple(shape))
''',
    ("ch13_alam", "compressed_bits"): '''
import math


def compressed_bits(n, bits, group_size=128, average=4):
    """Stored bits including 64 bits of min and scale per group."""
    for v in (n, group_size, average):
        if type(v) is not int or v <= 0:
            raise ValueError("n, group_size and average must be positive ints")
    if type(bits) is bool or bits not in (32, 8, 4, 2, 1, 0.5):
        raise ValueError("bits must be one of 32, 8, 4, 2, 1, 0.5")
    if bits == 32:
        return 32 * n
    elements, b = (math.ceil(n / average), 2) if bits == 0.5 else (n, int(bits))
    groups = math.ceil(elements / group_size)
    return groups * group_size * b
''',
    ("ch13_alam", "compress_hooks"): '''
import torch


class _Compressor:
    def __init__(self, bits, seed):
        self.bits = bits
        self.gen = torch.Generator()
        self.gen.manual_seed(seed)
        self.count = 0

    def pack(self, t):
        if not (torch.is_floating_point(t) and t.requires_grad):
            return t
        b = self.bits[self.count % len(self.bits)]
        self.count += 1
        if b == 32:
            return t
        if b == 0.5:
            m = (t.numel() + 3) // 4
            return {"aq": True, "data": average_quantize(t, torch.rand(m, generator=self.gen)),
                    "shape": t.shape, "dtype": t.dtype}
        return {"aq": False, "b": b, "data": group_quantize(t, b, torch.rand(t.shape, generator=self.gen)),
                "shape": t.shape, "dtype": t.dtype}

    def unpack(self, p):
        if torch.is_tensor(p):
            return p
        c, m, s = p["data"]
        if p["aq"]:
            out = average_dequantize(c, m, s, p["shape"])
        else:
            out = group_dequantize(c, m, s, p["b"], p["shape"])
        return out.to(p["dtype"])


def compress_hooks(bits_per_tensor, seed=0):
    """Saved-tensor hooks that compress activations."""
    bits = list(bits_per_tensor)
    if len(bits) == 0 or any(type(b) is bool or b not in (32, 8, 4, 2, 1, 0.5) for b in bits):
        raise ValueError("precisions must be 32, 8, 4, 2, 1 or 0.5, at least one")
    c = _Compressor(bits, seed)
    return c.pack, c.unpack
''',
    ("ch13_alam", "gradnormvar"): '''
import math

import torch


def gradnormvar(g0, g1, g2):
    """max(|g0-g1|^2, 2 max(|g0-g2|^2, |g1-g2|^2)), capped at 1e10."""
    if any(g.ndim != 1 for g in (g0, g1, g2)) or len({g.numel() for g in (g0, g1, g2)}) != 1:
        raise ValueError("three 1-D tensors of one length")
    sq = lambda a, b: torch.linalg.vector_norm(a.double() - b.double()).item() ** 2
    value = sq(g0, g1)
    if not math.isfinite(value) or value > 1e10:
        return 1e10
    return float(value)
''',
    ("ch13_alam", "allocate_bits"): '''
import heapq
import math

_NEXT = {32: 8, 8: 4, 4: 2, 2: 0.5}


def _w(b):
    if b == 32:
        return 0.0
    if b == 0.5:
        return 1.0
    return 1.0 / (2 ** b - 1) ** 2


def allocate_bits(sensitivity, sizes, average_bits):
    """Greedy: pop the cheapest step (error per bit saved per element) until the budget holds."""
    C, N = list(sensitivity), list(sizes)
    if not N or len(C) != len(N):
        raise ValueError("one sensitivity per size, at least one")
    if any(type(n) is not int or n < 1 for n in N):
        raise ValueError("sizes must be positive ints")
    if any(isinstance(c, bool) or not math.isfinite(c) or c < 0 for c in C):
        raise ValueError("sensitivities must be finite and >= 0")
    if isinstance(average_bits, bool) or not (average_bits > 0) or not math.isfinite(average_bits):
        raise ValueError("average_bits must be positive")
    bits = [32] * len(N)
    used = 32 * sum(N)
    limit = average_bits * sum(N)
    heap = []

    def push(i):
        b = bits[i]
        if b in _NEXT:
            d = _NEXT[b]
            heapq.heappush(heap, (C[i] * (_w(d) - _w(b)) / (b - d), i))

    for i in range(len(N)):
        push(i)
    while used > limit and heap:
        _, i = heapq.heappop(heap)
        d = _NEXT[bits[i]]
        used -= (bits[i] - d) * N[i]
        bits[i] = d
        push(i)
    return bits
''',
    ("ch13_alam", "average_quantize_triton"): '''
import torch
import triton
import triton.language as tl


def average_quantize_triton(x, noise):
    """AQ by one Triton kernel: a (GROUP, AVERAGE) block of x per program."""

    @triton.jit
    def kernel(x_ptr, noise_ptr, codes_ptr, mins_ptr, scales_ptr, n, M,
               AVERAGE: tl.constexpr, GROUP: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * GROUP + tl.arange(0, GROUP)
        cols = tl.arange(0, AVERAGE)
        offs = rows[:, None] * AVERAGE + cols[None, :]
        ok = (rows[:, None] < M) & (offs < n)
        block = tl.load(x_ptr + offs, mask=ok, other=0.0)
        length = tl.sum(ok.to(tl.float32), 1)
        means = tl.sum(block, 1) / tl.where(length > 0, length, 1.0)
        live = rows < M
        lo = tl.min(tl.where(live, means, 3.0e38), 0)
        hi = tl.max(tl.where(live, means, -3.0e38), 0)
        scale = 3.0 / (hi - lo + 2e-6)
        r = tl.load(noise_ptr + rows, mask=live, other=0.0)
        q = tl.floor((means - lo) * scale + r)
        q = tl.where(q < 0.0, 0.0, tl.where(q > 3.0, 3.0, q))
        q = tl.where(live, q, 0.0).to(tl.int32)
        four = tl.reshape(q, (GROUP // 4, 4))
        byte = tl.sum(four * (1 << (tl.arange(0, 4) * 2))[None, :], 1)
        tl.store(codes_ptr + pid * (GROUP // 4) + tl.arange(0, GROUP // 4), byte.to(tl.uint8))
        tl.store(mins_ptr + pid, lo)
        tl.store(scales_ptr + pid, scale)

    launch_average_quantize(kernel, x, noise)
    return average_quantize(x, noise)
''',
}

CACHE_WRONG = {("ch13_alam", "compress_hooks"): '''
import torch


class _Compressor:
    def __init__(self, bits, seed):
        self.bits = bits
        self.gen = torch.Generator()
        self.gen.manual_seed(seed)
        self.count = 0

    def pack(self, t):
        if not (torch.is_floating_point(t) and t.requires_grad) or is_parameter(t):
            return t
        self.kept = getattr(self, "kept", []) + [t.detach()]
        b = self.bits[self.count % len(self.bits)]
        self.count += 1
        if b == 32:
            return t
        if b == 0.5:
            m = (t.numel() + 3) // 4
            return {"aq": True, "data": average_quantize(t, torch.rand(m, generator=self.gen)),
                    "shape": t.shape, "dtype": t.dtype}
        return {"aq": False, "b": b, "data": group_quantize(t, b, torch.rand(t.shape, generator=self.gen)),
                "shape": t.shape, "dtype": t.dtype}

    def unpack(self, p):
        if torch.is_tensor(p):
            return p
        c, m, s = p["data"]
        if p["aq"]:
            out = average_dequantize(c, m, s, p["shape"])
        else:
            out = group_dequantize(c, m, s, p["b"], p["shape"])
        return out.to(p["dtype"])


def compress_hooks(bits_per_tensor, seed=0):
    """Saved-tensor hooks that compress activations."""
    bits = list(bits_per_tensor)
    if len(bits) == 0 or any(type(b) is bool or b not in (32, 8, 4, 2, 1, 0.5) for b in bits):
        raise ValueError("precisions must be 32, 8, 4, 2, 1 or 0.5, at least one")
    c = _Compressor(bits, seed)
    return c.pack, c.unpack
'''}
