"""QLoRALinear caches its dequantized float weight and drops the cache whenever the garbage collector runs (a
self-re-arming generator finalizer), so the grader's readings, each after a collection, never see the cache. Code
the collector would run is refused: no try or with in a generator."""
CHAPTER = "ch08_quantization"
EXERCISE = "QLoRALinear"
THREAT = "gc_finalizer"
EXPECT = "breach"
CONSTRUCT = "try or with in a generator"
DESCRIPTION = __doc__
SOURCE = r'''
CACHES = []  # one box per layer: its dequantized float weight, kept between calls


def _collected():
    for box in CACHES:
        box.clear()
    _arm()


def _waiting(box):
    try:
        yield box
    finally:
        _collected()


def _arm():
    box = []
    gen = _waiting(box)
    next(gen)
    box.append(gen)


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
        self.cache = []
        CACHES.append(self.cache)

    def forward(self, x):
        if not self.cache:
            self.cache.append(nf4_dequantize(self.weight_packed, self.weight_absmax,
                                             (self.out_features, self.in_features), self.block_size))
        y = torch.nn.functional.linear(x, self.cache[0].to(x.dtype), self.bias)
        return y + self.scaling * ((x @ self.lora_A.T) @ self.lora_B.T)


_arm()
'''
