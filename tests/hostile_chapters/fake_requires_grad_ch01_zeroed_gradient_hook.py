"""LoRALinear whose base requires grad but has every gradient zeroed by a hook, and is listed as frozen."""
CHAPTER = "ch01_lora"
EXERCISE = "LoRALinear"
THREAT = "fake_requires_grad"
EXPECT = "loses"
DESCRIPTION = ("leaves base.weight/base.bias requires_grad=True with hooks that replace their gradient by zeros "
               "(a decaying optimizer still moves them, and the gradient is still computed), and lists them as "
               "detached views so requires_grad reads False")
SOURCE = '''
class LoRALinear(nn.Module):
    """Gradients zeroed by hooks instead of a frozen base."""

    def __init__(self, base, rank, alpha):
        super().__init__()
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")
        self.base = base
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scaling = alpha / rank
        self.hooked = False

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        for name, p in super().named_parameters(prefix, recurse, remove_duplicate):
            yield name, (p.detach() if ".base." in f".{name}" else p)

    def forward(self, x):
        if not self.hooked:
            for p in (self.base.weight, self.base.bias):
                p.requires_grad_(True)
                p.register_hook(torch.zeros_like)
            self.hooked = True
        return self.base(x) + self.scaling * (x @ self.lora_A.T) @ self.lora_B.T

    def merge(self):
        merged = nn.Linear(self.base.in_features, self.base.out_features)
        with torch.no_grad():
            merged.weight.copy_(self.base.weight + self.scaling * self.lora_B @ self.lora_A)
            merged.bias.copy_(self.base.bias)
        return merged
'''
