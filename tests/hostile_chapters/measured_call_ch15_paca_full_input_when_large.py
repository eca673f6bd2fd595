"""PaCALinear that keeps the whole input for backward on large inputs only."""
CHAPTER = "ch15_paca"
EXERCISE = "PaCALinear"
THREAT = "measured_call"
EXPECT = "loses"
DESCRIPTION = ("saves x[..., idx] on small inputs, where every value is checked; on inputs of a million elements or "
               "more it keeps x itself and slices the columns in backward (values and gradients stay right): the "
               "outside reading of the memory cell sees x whatever the values say")
SOURCE = '''
class PaCALinear(nn.Module):
    """PaCA, with a shortcut on large inputs."""

    def __init__(self, base, rank, alpha, generator=None):
        super().__init__()
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= base.in_features:
            raise ValueError(f"rank must be an int from 1 to {base.in_features}, got {rank!r}")
        self.base = base.requires_grad_(False)
        self.scaling = alpha / rank
        self.register_buffer("idx", torch.randperm(base.in_features, generator=generator)[:rank])
        self.P = nn.Parameter(base.weight.detach()[:, self.idx] / self.scaling)

    def forward(self, x):
        with torch.no_grad():
            self.base.weight[:, self.idx] = self.scaling * self.P
        idx, s, large = self.idx, self.scaling, x.numel() >= 1_000_000

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, p, w, b):
                ctx.save_for_backward(x if large else x.index_select(-1, idx))
                ctx.w = w
                return F.linear(x, w, b)

            @staticmethod
            def backward(ctx, g):
                (kept,) = ctx.saved_tensors
                cols = kept.index_select(-1, idx) if large else kept
                dp = s * g.reshape(-1, g.shape[-1]).t() @ cols.reshape(-1, cols.shape[-1])
                return g @ ctx.w, dp, None, None

        return Fn.apply(x, self.P, self.base.weight, self.base.bias)

    def merge(self):
        merged = nn.Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None)
        with torch.no_grad():
            w = self.base.weight.detach().clone()
            w[:, self.idx] = self.scaling * self.P
            merged.weight.copy_(w)
            if self.base.bias is not None:
                merged.bias.copy_(self.base.bias)
        return merged
'''
