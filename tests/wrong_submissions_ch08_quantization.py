"""Plausible wrong answers for chapter 8, one per exercise: each must lose points when autograded.

Each fails the graded cell of the property it gets wrong (``SANDBOX_CELL`` in test_hidden_ch08_quantization.py):
the partial block dropped by absmax_quantize costs its edge-cases cell, the float base layer kept by
QLoRALinear its memory cell, the others their values cell."""

WRONG = {
    ("ch08_quantization", "round_to_bf16"): '''
import torch

def round_to_bf16(x):
    """Wrong: truncates (drops the low 16 bits) instead of rounding to nearest even."""
    return (x.view(torch.int32) & -0x10000).view(torch.float32)
''',
    ("ch08_quantization", "absmax_quantize"): '''
import torch

def absmax_quantize(x, bits, block_size):
    """Wrong: drops the last, partial block."""
    if not isinstance(bits, int) or not 2 <= bits <= 8 or not isinstance(block_size, int) or block_size < 1:
        raise ValueError("bad bits or block_size")
    q_max = 2 ** (bits - 1) - 1
    flat = x.float().flatten()
    blocks = flat[:flat.numel() // block_size * block_size].view(-1, block_size)
    scales = blocks.abs().amax(dim=1) / q_max
    codes = torch.round(blocks / scales.clamp_min(1e-30)[:, None]).to(torch.int8)
    return codes, scales
''',
    ("ch08_quantization", "absmax_dequantize"): '''
import math

def absmax_dequantize(codes, scales, block_size, shape):
    """Wrong: tiles the scales (scale i at positions i, i + n_blocks, ...) instead of one per block."""
    values = codes.flatten().float() * scales.repeat(block_size)
    return values[:math.prod(shape)].reshape(shape)
''',
    ("ch08_quantization", "nf4_codebook"): '''
import torch

def nf4_codebook():
    """Wrong: the table typed in from the paper, with one digit wrong."""
    return torch.tensor([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                         -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                         0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
                         0.44070982933044434, 0.5626170039176941, 0.7229568362236023 + 0.001, 1.0])
''',
    ("ch08_quantization", "nf4_quantize"): '''
import torch

def nf4_quantize(x, block_size=64):
    """Wrong: the first value of each pair goes in the LOW nibble."""
    flat = x.float().flatten()
    n = flat.numel()
    pad = -n % block_size
    blocks = torch.cat([flat, flat.new_zeros(pad)]).view(-1, block_size)
    absmax = blocks.abs().amax(dim=1)
    scaled = (blocks / torch.where(absmax == 0, torch.ones_like(absmax), absmax)[:, None]).flatten()[:n]
    codes = (scaled[:, None] - nf4_codebook()[None, :]).abs().argmin(dim=1).to(torch.uint8)
    codes = torch.cat([codes, codes.new_zeros(n % 2)])
    return codes[0::2] | (codes[1::2] << 4), absmax
''',
    ("ch08_quantization", "nf4_dequantize"): '''
import math
import torch

def nf4_dequantize(packed, absmax, shape, block_size=64):
    """Wrong: reads the low nibble first."""
    n = math.prod(shape)
    codes = torch.stack([packed & 15, packed >> 4], dim=1).flatten()[:n].long()
    return (nf4_codebook()[codes] * absmax.repeat_interleave(block_size)[:n]).reshape(shape)
''',
    ("ch08_quantization", "QLoRALinear"): '''
import math
import torch
from torch import nn

class QLoRALinear(nn.Module):
    """Wrong: quantizes, but also keeps the float32 base layer around."""

    def __init__(self, base, rank, alpha, block_size=64):
        super().__init__()
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")
        self.base = base.requires_grad_(False)
        packed, absmax = nf4_quantize(base.weight, block_size)
        self.register_buffer("weight_packed", packed)
        self.register_buffer("weight_absmax", absmax)
        self.block_size = block_size
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scaling = alpha / rank

    def forward(self, x):
        w = nf4_dequantize(self.weight_packed, self.weight_absmax, self.base.weight.shape, self.block_size)
        y = x @ w.T + (0 if self.base.bias is None else self.base.bias)
        return y + self.scaling * (x @ self.lora_A.T) @ self.lora_B.T
''',
}
