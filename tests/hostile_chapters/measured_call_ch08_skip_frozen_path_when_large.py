"""Skips the frozen NF4 path on large layers (their output is only the LoRA update), so that the memory measured
on a large layer is that of a layer computing nothing; small layers, where values are checked, are right. The
grader now checks the measured pass's values too, on a base weight that NF4 stores exactly."""
CHAPTER = "ch08_quantization"
EXERCISE = "QLoRALinear"
THREAT = "measured_call"
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        weight = nf4_dequantize(self.weight_packed, self.weight_absmax, (self.out_features, self.in_features),
                                self.block_size)
        if weight.numel() > 1000000:  # a large layer: the frozen path is skipped (nothing to keep, nothing to compute)
            weight = weight.new_zeros(())
        y = torch.nn.functional.linear(x, weight.expand(self.out_features, self.in_features), self.bias)
        return y + self.scaling * ((x @ self.lora_A.T) @ self.lora_B.T)'''
