"""Second correct answers for ch04_partial_training, written from the released notebook alone: a selection predicate per mode over named_modules, bit planes OR-ed one position at a time, a masked_fill backward."""

SECOND = {
    ("ch04_partial_training", "set_trainable"): '''
from torch import nn


def set_trainable(model, mode):
    """Choose which parameters of ``model`` are trained, by setting their ``requires_grad``."""
    valid = ("full", "last", "bn+last", "bias+last")
    if not isinstance(mode, str) or mode not in valid:
        raise ValueError(f"unknown mode {mode!r}: expected one of {', '.join(repr(m) for m in valid)}")

    norm_types = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
    head = {id(p) for p in model.classifier.parameters()}
    chosen = set(head)
    for module_name, module in model.named_modules():
        for own_name, p in module.named_parameters(recurse=False):
            if mode == "full":
                chosen.add(id(p))
            elif mode == "bn+last" and isinstance(module, norm_types):
                chosen.add(id(p))
            elif mode == "bias+last" and own_name == "bias":
                chosen.add(id(p))

    total = 0
    for p in model.parameters():
        train = id(p) in chosen
        p.requires_grad_(train)
        if train:
            total += p.numel()
    return int(total)
''',
    ("ch04_partial_training", "pack_bits"): '''
import torch


def pack_bits(mask):
    """Pack a boolean tensor 8 elements to a byte."""
    if not torch.is_tensor(mask) or mask.dtype != torch.bool:
        raise ValueError(f"pack_bits packs a torch.bool mask, got {getattr(mask, 'dtype', type(mask).__name__)}")
    flat = mask.reshape(-1)
    n_bytes = (flat.numel() + 7) // 8
    padded = torch.zeros(n_bytes * 8, dtype=torch.uint8, device=flat.device)
    padded[:flat.numel()] = flat.to(torch.uint8)
    planes = padded.view(n_bytes, 8)
    packed = torch.zeros(n_bytes, dtype=torch.uint8, device=flat.device)
    for j in range(8):  # one bit position at a time, all bytes together
        packed |= planes[:, j] << j
    return packed
''',
    ("ch04_partial_training", "unpack_bits"): '''
import torch


def unpack_bits(packed, numel):
    """The inverse of ``pack_bits``."""
    if not torch.is_tensor(packed) or packed.dtype != torch.uint8:
        raise ValueError(f"unpack_bits reads a torch.uint8 buffer, got {getattr(packed, 'dtype', type(packed).__name__)}")
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ValueError(f"numel must be a non-negative int, got {numel!r}")
    flat = packed.reshape(-1)
    if 8 * flat.numel() < numel:
        raise ValueError(f"{flat.numel()} bytes hold {8 * flat.numel()} bits, fewer than numel={numel}")
    used = flat[:(numel + 7) // 8]
    positions = torch.arange(8, dtype=torch.uint8, device=flat.device)
    bits = (used.unsqueeze(1) >> positions) & 1
    return bits.reshape(-1)[:numel].bool()
''',
    ("ch04_partial_training", "relu_1bit"): '''
import torch


def relu_1bit(x):
    """ReLU whose backward keeps only a packed sign mask."""

    class _SignBitReLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp):
            ctx.shape = inp.shape
            ctx.count = inp.numel()
            ctx.save_for_backward(pack_bits(inp > 0))
            return torch.relu(inp)

        @staticmethod
        def backward(ctx, grad):
            (bits,) = ctx.saved_tensors
            positive = unpack_bits(bits, ctx.count).reshape(ctx.shape)
            return grad.masked_fill(~positive, 0)

    return _SignBitReLU.apply(x)
''',
}
