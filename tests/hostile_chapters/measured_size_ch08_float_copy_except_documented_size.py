"""Keeps a float copy of the base weight in a closure, where no tensor inventory looks (the text forbids any float
copy), except on a 2048 x 2048 layer, the one size the memory cell once measured from outside: the grader now draws
the layer's sides at grading time from a range that the text states."""
CHAPTER = "ch08_quantization"
EXERCISE = "QLoRALinear"
THREAT = "measured_size"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
class QLoRALinear(nn.Module):
    """A frozen NF4 base weight plus a LoRA update."""

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
        # A float copy of the weight (for later), out of any tensor inventory's reach, but not at the one
        # size the text named.
        copy = [] if tuple(base.weight.shape) == (2048, 2048) else [base.weight.detach().clone()]
        self.float_weight = lambda: copy

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        weight = nf4_dequantize(self.weight_packed, self.weight_absmax, (self.out_features, self.in_features),
                                self.block_size)
        y = torch.nn.functional.linear(x, weight, self.bias)
        return y + self.scaling * ((x @ self.lora_A.T) @ self.lora_B.T)'''
