"""LoRALinear whose named_parameters lists detached views of a base that trains from its first forward."""
CHAPTER = "ch01_lora"
EXERCISE = "LoRALinear"
THREAT = "lying_object"
EXPECT = "loses"
DESCRIPTION = ("freezes the base at construction, switches requires_grad back on in forward, and overrides "
               "named_parameters to list base.weight/base.bias as detached views (requires_grad=False, no .grad)")
SOURCE = '''
class LoRALinear(nn.Module):
    """The base trains; its listing says it does not."""

    def __init__(self, base, rank, alpha):
        super().__init__()
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")
        self.base = base
        base.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scaling = alpha / rank

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        for name, p in super().named_parameters(prefix, recurse, remove_duplicate):
            yield name, (p.detach() if ".base." in f".{name}" else p)

    def forward(self, x):
        self.base.requires_grad_(True)
        return self.base(x) + self.scaling * (x @ self.lora_A.T) @ self.lora_B.T

    def merge(self):
        merged = nn.Linear(self.base.in_features, self.base.out_features)
        with torch.no_grad():
            merged.weight.copy_(self.base.weight + self.scaling * self.lora_B @ self.lora_A)
            merged.bias.copy_(self.base.bias)
        return merged
'''
