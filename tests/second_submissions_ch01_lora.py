"""Second correct answers for ch01_lora, written from the released notebook alone: F.linear for both low-rank factors, a bulk freeze before the swap, zeroing through nn.init."""

SECOND = {
    ('ch01_lora', 'LoRALinear'): '''
import math

import torch
import torch.nn.functional as F
from torch import nn


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")
        self.base = base
        self.base.requires_grad_(False)
        self.rank = rank
        self.scaling = alpha / rank
        w = base.weight
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, dtype=w.dtype, device=w.device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=w.dtype, device=w.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        frozen = self.base(x)  # (..., out)
        down = F.linear(x, self.lora_A)  # (..., rank)
        return frozen + self.scaling * F.linear(down, self.lora_B)

    def merge(self) -> nn.Linear:
        w = self.base.weight
        merged = nn.Linear(self.base.in_features, self.base.out_features,
                           bias=self.base.bias is not None, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            delta = torch.mm(self.lora_B, self.lora_A).mul_(self.scaling)  # (out, in)
            merged.weight.copy_(w + delta)
            if self.base.bias is not None:
                merged.bias.copy_(self.base.bias)
        return merged
''',
    ('ch01_lora', 'apply_lora'): '''
import torch
from torch import nn


def apply_lora(model: nn.Module, rank: int, alpha: float, targets) -> nn.Module:
    suffixes = (targets,) if isinstance(targets, str) else tuple(targets)

    def is_target(name: str) -> bool:
        return any(name == s or name.endswith("." + s) for s in suffixes)

    chosen = [(name, module) for name, module in model.named_modules()
              if isinstance(module, nn.Linear) and is_target(name)]
    for p in model.parameters():
        p.requires_grad_(False)
    for name, module in chosen:
        model.set_submodule(name, LoRALinear(module, rank, alpha))
    return model
''',
    ('ch01_lora', 'Adapter'): '''
import torch
import torch.nn.functional as F
from torch import nn


class Adapter(nn.Module):
    def __init__(self, dim: int, bottleneck: int):
        super().__init__()
        self.down = nn.Linear(dim, bottleneck)
        self.up = nn.Linear(bottleneck, dim)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., dim) -> (..., dim)
        hidden = F.gelu(self.down(x))  # (..., bottleneck), exact (erf) GELU
        return self.up(hidden) + x
''',
}
