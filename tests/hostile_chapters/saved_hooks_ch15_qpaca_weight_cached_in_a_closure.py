"""QPaCALinear whose forward caches the dequantized float weight in a closure between calls."""
CHAPTER = "ch15_paca"
EXERCISE = "QPaCALinear"
THREAT = "saved_hooks"
EXPECT = "loses"
DESCRIPTION = ("stores only the NF4 codes as buffers, so a listing of its tensors shows no float copy; but its first "
               "forward decodes the weight once into a list held by a closure and reuses it for every later call, a "
               "float copy of W that the outside reading after construction and forward sees")
SOURCE = '''
class QPaCALinear(nn.Module):
    """QPaCA with a decoded weight cached in a closure."""

    def __init__(self, base, rank, alpha, block_size=64):
        super().__init__()
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= base.in_features:
            raise ValueError(f"rank must be an int from 1 to {base.in_features}, got {rank!r}")
        self.shape, self.block = (base.out_features, base.in_features), block_size
        self.scaling = alpha / rank
        self.register_buffer("idx", torch.randperm(base.in_features)[:rank])
        self.P = nn.Parameter(base.weight.detach()[:, self.idx] / self.scaling)
        packed, absmax = nf4_encode(base.weight.detach(), block_size)
        self.register_buffer("weight_packed", packed)
        self.register_buffer("weight_absmax", absmax)
        self.bias = None if base.bias is None else nn.Parameter(base.bias.detach().clone(), requires_grad=False)
        cache = []

        def decoded():
            if not cache:
                cache.append(nf4_decode_columns_torch(packed, absmax, self.shape, self.idx[:0],
                                                      torch.zeros(self.shape[0], 0), block_size))
            return cache[0]

        self.decoded = decoded

    def forward(self, x):
        w = self.decoded().index_copy(1, self.idx, self.scaling * self.P)
        return F.linear(x, w, self.bias)
'''
