"""Plausible wrong answers for ch01_lora, one per exercise: each must lose points when autograded.

LoRALinear scales the update by alpha instead of alpha / rank; apply_lora replaces the targeted
layers but leaves every other parameter trainable; Adapter forgets the residual connection."""

WRONG = {
    ("ch01_lora", "LoRALinear"): '''
import math
import torch
from torch import nn

class LoRALinear(nn.Module):
    """Wrong: scales the update by alpha instead of alpha / rank."""
    def __init__(self, base, rank, alpha):
        super().__init__()
        if rank < 1:
            raise ValueError("rank must be >= 1")
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scaling = alpha

    def forward(self, x):
        return self.base(x) + self.scaling * (x @ self.lora_A.T) @ self.lora_B.T

    def merge(self):
        merged = nn.Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None)
        with torch.no_grad():
            merged.weight.copy_(self.base.weight + self.scaling * self.lora_B @ self.lora_A)
            if self.base.bias is not None:
                merged.bias.copy_(self.base.bias)
        return merged
''',
    ("ch01_lora", "apply_lora"): '''
from torch import nn

def apply_lora(model, rank, alpha, targets):
    """Wrong: replaces the targeted layers but leaves every other parameter trainable."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and any(full.endswith(t) for t in targets):
                module.register_module(child_name, LoRALinear(child, rank, alpha))
    return model
''',
    ("ch01_lora", "Adapter"): '''
import torch
from torch import nn

class Adapter(nn.Module):
    """Wrong: forgets the residual connection."""
    def __init__(self, dim, bottleneck):
        super().__init__()
        self.down = nn.Linear(dim, bottleneck)
        self.up = nn.Linear(bottleneck, dim)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x):
        return self.up(torch.nn.functional.gelu(self.down(x)))
''',
}
