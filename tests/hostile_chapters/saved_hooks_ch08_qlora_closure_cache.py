"""Stores only NF4 codes at construction, but caches the dequantized weight (float64) in a closure on the first forward, where no tensor inventory looks."""
CHAPTER = 'ch08_quantization'
EXERCISE = 'QLoRALinear'
THREAT = "saved_hooks"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = """\
class QLoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float, block_size: int = 64):
        super().__init__()
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")
        self.in_features, self.out_features, self.block_size = base.in_features, base.out_features, block_size
        packed, absmax = nf4_quantize(base.weight, block_size)
        self.register_buffer("weight_packed", packed)
        self.register_buffer("weight_absmax", absmax)
        self.bias = None if base.bias is None else nn.Parameter(base.bias.detach().clone(), requires_grad=False)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scaling = alpha / rank
        box = []
        self.fetch_cache = lambda: box

    def forward(self, x):
        if not self.fetch_cache():
            w = nf4_dequantize(self.weight_packed, self.weight_absmax, (self.out_features, self.in_features), self.block_size)
            self.fetch_cache().append(w.to(torch.float64))
        w = self.fetch_cache()[0].to(x.dtype)
        y = torch.nn.functional.linear(x, w, self.bias)
        return y + self.scaling * (x @ self.lora_A.T) @ self.lora_B.T
"""
