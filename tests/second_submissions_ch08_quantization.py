"""Second correct answers for ch08_quantization, written from the released notebook alone: explicit round-up decisions on split bits, float64 code arithmetic, bucketize against level midpoints, pair-wise nibble packing."""

SECOND = {
    ("ch08_quantization", "round_to_bf16"): '''
import torch


def round_to_bf16(x: torch.Tensor) -> torch.Tensor:
    bits = x.view(torch.int32)
    low = bits & 0xFFFF                      # the 16 bits that get dropped
    kept = bits & -0x10000                   # truncation: sign, exponent and the top 7 mantissa bits
    odd = (kept & 0x10000) != 0              # last kept bit
    above_half = low > 0x8000
    exact_tie = low == 0x8000
    carry = (above_half | (exact_tie & odd)).to(torch.int32) * 0x10000
    # adding one unit of the last kept place moves the magnitude up (a carry may reach the
    # exponent, which turns the largest finite values into infinities, as IEEE asks)
    rounded = kept + carry
    # a NaN keeps its own bits: its payload must not be carried into the exponent
    rounded = torch.where(torch.isnan(x), bits, rounded)
    return rounded.view(torch.float32)
''',
    ("ch08_quantization", "absmax_quantize"): '''
import math

import torch


def absmax_quantize(x: torch.Tensor, bits: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an int in 2..8, got {bits!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
    q_max = (1 << (bits - 1)) - 1
    values = x.detach().reshape(-1).to(torch.float64)
    n = values.numel()
    n_blocks = math.ceil(n / block_size)
    padded = torch.zeros(n_blocks * block_size, dtype=torch.float64, device=values.device)
    padded[:n] = values
    blocks = padded.view(n_blocks, block_size)
    scales = (blocks.abs().amax(dim=1) / q_max).to(torch.float32) if n_blocks else \\
        torch.zeros(0, dtype=torch.float32, device=values.device)
    divisor = scales.to(torch.float64).unsqueeze(1)
    safe = torch.where(divisor > 0, divisor, torch.ones_like(divisor))
    ratio = torch.where(divisor > 0, blocks / safe, torch.zeros_like(blocks))
    codes = torch.round(ratio).clamp(-q_max, q_max).to(torch.int8)
    return codes, scales
''',
    ("ch08_quantization", "absmax_dequantize"): '''
import torch


def absmax_dequantize(codes: torch.Tensor, scales: torch.Tensor, block_size: int, shape) -> torch.Tensor:
    shape = torch.Size(shape)
    values = codes.to(torch.float32) * scales.to(torch.float32).reshape(-1, 1)
    return values.reshape(-1)[: shape.numel()].reshape(shape)
''',
    ("ch08_quantization", "nf4_codebook"): '''
import statistics

import torch


def nf4_codebook() -> torch.Tensor:
    phi_inv = statistics.NormalDist().inv_cdf
    delta = 1 - 0.5 * (1 / 32 + 1 / 30)

    def points(count):
        # count + 1 evenly spaced points from delta down to 1/2, the last one (1/2) left out
        step = (delta - 0.5) / count
        return [delta - i * step for i in range(count)]

    positive = [phi_inv(p) for p in points(8)]
    negative = [-phi_inv(p) for p in points(7)]
    levels = sorted(negative + [0.0] + positive)
    top = max(abs(v) for v in levels)
    return torch.tensor([v / top for v in levels], dtype=torch.float64).to(torch.float32)
''',
    ("ch08_quantization", "nf4_quantize"): '''
import math

import torch


def nf4_quantize(x: torch.Tensor, block_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    flat = x.detach().reshape(-1)
    n = flat.numel()
    n_blocks = math.ceil(n / block_size)
    padded = flat.new_zeros(n_blocks * block_size, dtype=torch.float32)
    padded[:n] = flat
    blocks = padded.view(n_blocks, block_size)
    absmax = blocks.abs().amax(dim=1) if n_blocks else padded.new_zeros(0)

    levels = nf4_codebook().to(torch.float64)
    midpoints = (levels[1:] + levels[:-1]) / 2       # decision boundaries between neighbours
    denom = absmax.to(torch.float64).unsqueeze(1)
    denom = torch.where(denom > 0, denom, torch.ones_like(denom))  # all-zero block: 0 / 1 = 0 -> code 7
    normalized = blocks.to(torch.float64) / denom
    # index of the first boundary >= value = nearest level (an exact tie goes to the lower level)
    codes = torch.bucketize(normalized, midpoints).reshape(-1)[:n].to(torch.uint8)
    del normalized

    if n % 2:
        codes = torch.cat([codes, codes.new_zeros(1)])
    pairs = codes.view(-1, 2)
    packed = pairs[:, 0] * 16 + pairs[:, 1]
    return packed.to(torch.uint8), absmax.to(torch.float32)
''',
    ("ch08_quantization", "nf4_dequantize"): '''
import math

import torch


def nf4_dequantize(packed: torch.Tensor, absmax: torch.Tensor, shape, block_size: int = 64) -> torch.Tensor:
    shape = torch.Size(shape)
    n = shape.numel()
    high = torch.div(packed, 16, rounding_mode="floor")
    low = packed - high * 16
    codes = torch.stack((high, low), dim=-1).reshape(-1)[:n].to(torch.int64)
    levels = nf4_codebook().to(packed.device)
    values = torch.take(levels, codes)
    n_blocks = math.ceil(n / block_size)
    block_of = torch.arange(n, device=packed.device) // block_size
    scale = absmax.to(torch.float32)[:n_blocks].index_select(0, block_of)
    return (values * scale).reshape(shape)
''',
    ("ch08_quantization", "QLoRALinear"): '''
import math

import torch
from torch import nn


class QLoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float, block_size: int = 64):
        super().__init__()
        if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")
        self.in_features = base.in_features
        self.out_features = base.out_features
        self.rank = rank
        self.block_size = block_size
        self.scaling = float(alpha) / rank

        with torch.no_grad():
            packed, absmax = nf4_quantize(base.weight.detach(), block_size)
        self.register_buffer("weight_packed", packed)
        self.register_buffer("weight_absmax", absmax)
        if base.bias is None:
            self.bias = None
        else:
            self.bias = nn.Parameter(base.bias.detach().clone(), requires_grad=False)

        a = torch.empty(rank, self.in_features)
        nn.init.kaiming_uniform_(a, a=math.sqrt(5))
        self.lora_A = nn.Parameter(a)
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = nf4_dequantize(self.weight_packed, self.weight_absmax,
                                (self.out_features, self.in_features), self.block_size)
        frozen = torch.nn.functional.linear(x, weight, self.bias)
        down = torch.nn.functional.linear(x, self.lora_A)
        return frozen + self.scaling * torch.nn.functional.linear(down, self.lora_B)
''',
}
