"""Plausible wrong answers for chapter 4, one per exercise: each must lose points when autograded."""

WRONG = {
    ("ch04_partial_training", "set_trainable"): '''
from torch import nn

def set_trainable(model, mode):
    """Wrong: "bn+last" also trains the convolution biases (every bias next to a BatchNorm)."""
    if mode not in ("full", "last", "bn+last", "bias+last"):
        raise ValueError(f"mode must be one of full, last, bn+last, bias+last, got {mode!r}")
    for name, p in model.named_parameters():
        is_bias = name.endswith("bias")
        is_bn = isinstance(model.get_submodule(name.rsplit(".", 1)[0]), nn.BatchNorm2d) if "." in name else False
        p.requires_grad_(mode == "full" or name.startswith("classifier")
                         or (mode == "bn+last" and (is_bn or is_bias)) or (mode == "bias+last" and is_bias))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
''',
    ("ch04_partial_training", "pack_bits"): '''
import torch

def pack_bits(mask):
    """Wrong: drops the last n % 8 elements (n // 8 bytes)."""
    if mask.dtype != torch.bool:
        raise ValueError("mask must be a bool tensor")
    flat = mask.reshape(-1)
    whole = flat[: 8 * (flat.numel() // 8)].view(-1, 8).to(torch.uint8)
    return (whole << torch.arange(8, dtype=torch.uint8)).sum(dim=1).to(torch.uint8)
''',
    ("ch04_partial_training", "unpack_bits"): '''
import torch

def unpack_bits(packed, numel):
    """Wrong: reads bit 7 - j for element 8k + j (most significant bit first)."""
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8)
    return ((packed.reshape(-1, 1) >> shifts) & 1).reshape(-1)[:numel].bool()
''',
    ("ch04_partial_training", "relu_1bit"): '''
import torch

def relu_1bit(x):
    """Wrong: packs the mask, but also saves the fp32 output for backward."""
    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp):
            out = torch.relu(inp)
            ctx.save_for_backward(pack_bits(inp > 0), out)
            return out

        @staticmethod
        def backward(ctx, grad):
            _, out = ctx.saved_tensors
            return grad * (out > 0)

    return Fn.apply(x)
''',
}
