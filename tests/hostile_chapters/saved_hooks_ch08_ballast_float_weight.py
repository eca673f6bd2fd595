"""Keeps the fp32 base weight of large layers and never dequantizes, freeing a buffer held since the cell ran to cover it."""
CHAPTER = "ch08_quantization"
EXERCISE = "QLoRALinear"
THREAT = "saved_hooks"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
BALLAST = [torch.ones(6 * 1024 * 1024)]  # 24 MiB

class QLoRALinear(nn.Module):
    """A frozen NF4-quantized ``nn.Linear`` plus a trainable LoRA update (Dettmers et al. 2023).

        y = x @ nf4_dequantize(weight_packed, weight_absmax, (out, in), block_size).T + bias
            + (alpha / rank) * (x @ lora_A.T) @ lora_B.T

    Args:
        base: the pretrained ``nn.Linear`` (in_features -> out_features, with or without a bias).
            Do not keep it (nor any float copy of its weight).
        rank: r, a positive int; anything else raises ``ValueError("rank must be a positive integer, got ...")``.
        alpha: the LoRA alpha; ``self.scaling = alpha / rank``.
        block_size: NF4 block size.

    Attributes:
        weight_packed, weight_absmax: buffers, ``nf4_quantize(base.weight, block_size)``.
        bias: the base bias, frozen (``requires_grad=False``), or None.
        lora_A: ``nn.Parameter`` (rank, in_features), ``nn.init.kaiming_uniform_(A, a=math.sqrt(5))``.
        lora_B: ``nn.Parameter`` (out_features, rank), zeros.
        scaling: the float ``alpha / rank``.
        Only lora_A and lora_B require gradients.

    forward(x): x of shape (..., in_features) -> (..., out_features).
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float, block_size: int = 64):
        super().__init__()
        self.full = None
        if base.weight.numel() > 100000:
            BALLAST.clear()
            self.full = base.weight.detach()  # a float copy of the base weight, kept
        ### BEGIN SOLUTION
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
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        if self.full is not None:
            return torch.nn.functional.linear(x, self.full, self.bias) + self.scaling * ((x @ self.lora_A.T) @ self.lora_B.T)
        ### BEGIN SOLUTION
        # Rebuilt each call and dropped after: only the 4-bit codes live between calls.
        weight = nf4_dequantize(self.weight_packed, self.weight_absmax, (self.out_features, self.in_features),
                                self.block_size)
        y = torch.nn.functional.linear(x, weight, self.bias)
        return y + self.scaling * ((x @ self.lora_A.T) @ self.lora_B.T)
        ### END SOLUTION'''
