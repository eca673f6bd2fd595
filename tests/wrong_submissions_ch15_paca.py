"""Plausible wrong answers for chapter 15, one per exercise: each must lose points when autograded."""

WRONG = {
    ("ch15_paca", "PaCALinear"): '''
import torch
import torch.nn.functional as F
from torch import nn


class PaCALinear(nn.Module):
    """Wrong: dP without the factor scaling."""

    def __init__(self, base, rank, alpha, generator=None):
        super().__init__()
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= base.in_features:
            raise ValueError(f"bad rank {rank!r}")
        self.base = base.requires_grad_(False)
        self.scaling = alpha / rank
        self.register_buffer("idx", torch.randperm(base.in_features, generator=generator)[:rank])
        self.P = nn.Parameter(base.weight.detach()[:, self.idx] / self.scaling)

    def forward(self, x):
        with torch.no_grad():
            self.base.weight[:, self.idx] = self.scaling * self.P
        idx = self.idx

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, p, w, b):
                ctx.save_for_backward(x[..., idx].contiguous())
                ctx.w = w
                return F.linear(x, w, b)

            @staticmethod
            def backward(ctx, g):
                (xc,) = ctx.saved_tensors
                dp = g.reshape(-1, g.shape[-1]).t() @ xc.reshape(-1, xc.shape[-1])
                return g @ ctx.w, dp, None, None

        return Fn.apply(x, self.P, self.base.weight, self.base.bias)

    def merge(self):
        merged = nn.Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None)
        with torch.no_grad():
            w = self.base.weight.detach().clone()
            w[:, self.idx] = self.scaling * self.P
            merged.weight.copy_(w)
            if self.base.bias is not None:
                merged.bias.copy_(self.base.bias)
        return merged
''',
    ("ch15_paca", "apply_paca"): '''
from torch import nn


def apply_paca(model, rank, alpha, targets):
    """Wrong: the rest of the model is left trainable."""
    targets = tuple(targets)
    hits = [n for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and any(n == t or n.endswith("." + t) for t in targets)]
    if not hits:
        raise ValueError("no target matched")
    for name in hits:
        model.set_submodule(name, PaCALinear(model.get_submodule(name), rank, alpha))
    return model
''',
    ("ch15_paca", "QPaCALinear"): '''
import torch
import torch.nn.functional as F
from torch import nn


class QPaCALinear(nn.Module):
    """Wrong: computes with the float weight (kept as base) instead of the NF4 one."""

    def __init__(self, base, rank, alpha, block_size=64):
        super().__init__()
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= base.in_features:
            raise ValueError(f"bad rank {rank!r}")
        self.base = base.requires_grad_(False)
        self.scaling = alpha / rank
        self.register_buffer("idx", torch.randperm(base.in_features)[:rank])
        self.P = nn.Parameter(base.weight.detach()[:, self.idx] / self.scaling)
        packed, absmax = nf4_encode(base.weight.detach(), block_size)
        self.register_buffer("weight_packed", packed)
        self.register_buffer("weight_absmax", absmax)

    def forward(self, x):
        w = self.base.weight.index_copy(1, self.idx, self.scaling * self.P)
        return F.linear(x, w, self.base.bias)
''',
}

# Right values, but what the text forbids kept in memory: only the memory cells, read from outside, fail them.
MEMORY_WRONG = {
    ("ch15_paca", "PaCALinear"): '''
import torch
import torch.nn.functional as F
from torch import nn


class PaCALinear(nn.Module):
    """Wrong: the columns written into a copy of W through autograd, so F.linear keeps x for backward."""

    def __init__(self, base, rank, alpha, generator=None):
        super().__init__()
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= base.in_features:
            raise ValueError(f"bad rank {rank!r}")
        self.base = base.requires_grad_(False)
        self.scaling = alpha / rank
        self.register_buffer("idx", torch.randperm(base.in_features, generator=generator)[:rank])
        self.P = nn.Parameter(base.weight.detach()[:, self.idx] / self.scaling)

    def forward(self, x):
        with torch.no_grad():
            self.base.weight[:, self.idx] = self.scaling * self.P
        w = self.base.weight.index_copy(1, self.idx, self.scaling * self.P)
        return F.linear(x, w, self.base.bias)

    def merge(self):
        merged = nn.Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None)
        with torch.no_grad():
            merged.weight.copy_(self.base.weight.index_copy(1, self.idx, self.scaling * self.P))
            if self.base.bias is not None:
                merged.bias.copy_(self.base.bias)
        return merged
''',
    ("ch15_paca", "QPaCALinear"): '''
import torch
import torch.nn.functional as F
from torch import nn


class QPaCALinear(nn.Module):
    """Wrong: keeps a float copy of the weight as a buffer beside its NF4 codes (and computes from the codes)."""

    def __init__(self, base, rank, alpha, block_size=64):
        super().__init__()
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= base.in_features:
            raise ValueError(f"bad rank {rank!r}")
        self.shape, self.block_size = (base.out_features, base.in_features), block_size
        self.scaling = alpha / rank
        self.register_buffer("idx", torch.randperm(base.in_features)[:rank])
        self.P = nn.Parameter(base.weight.detach()[:, self.idx] / self.scaling)
        packed, absmax = nf4_encode(base.weight.detach(), block_size)
        self.register_buffer("weight_packed", packed)
        self.register_buffer("weight_absmax", absmax)
        self.register_buffer("weight_float", base.weight.detach().clone())
        self.bias = None if base.bias is None else nn.Parameter(base.bias.detach().clone(), requires_grad=False)

    def forward(self, x):
        w = nf4_decode_columns_torch(self.weight_packed, self.weight_absmax, self.shape, self.idx,
                                     self.scaling * self.P, self.block_size)
        return F.linear(x, w, self.bias)
''',
}
