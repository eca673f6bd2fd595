"""LoRALinear that registers frozen copies of the base layer while computing with its trainable originals."""
CHAPTER = "ch01_lora"
EXERCISE = "LoRALinear"
THREAT = "lying_object"
EXPECT = "loses"
DESCRIPTION = ("self.base is a new nn.Linear holding frozen copies of the given weights (what any parameter "
               "listing shows), while forward uses the given tensors, left trainable, kept in a plain list")
SOURCE = '''
class LoRALinear(nn.Module):
    """Frozen copies on show, trainable originals in use."""

    def __init__(self, base, rank, alpha):
        super().__init__()
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")
        self.live = [base.weight, base.bias]
        for p in self.live:
            p.requires_grad_(True)
        self.base = nn.Linear(base.in_features, base.out_features)
        with torch.no_grad():
            self.base.weight.copy_(base.weight)
            self.base.bias.copy_(base.bias)
        self.base.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scaling = alpha / rank

    def forward(self, x):
        weight, bias = self.live
        return F.linear(x, weight, bias) + self.scaling * (x @ self.lora_A.T) @ self.lora_B.T

    def merge(self):
        merged = nn.Linear(self.base.in_features, self.base.out_features)
        with torch.no_grad():
            merged.weight.copy_(self.live[0] + self.scaling * self.lora_B @ self.lora_A)
            merged.bias.copy_(self.live[1])
        return merged
'''
