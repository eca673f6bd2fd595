"""FlashAttention that keeps the N x N probabilities on ctx (invisible to saved-tensor hooks), with ballast timed by
the garbage collector: a suspended generator in a reference cycle runs its finally block at each collection the
grader triggers before a reading; the first one only re-arms it, the second (the memory check's first reading)
allocates 96 MiB, and forward frees as much as it keeps. What the process may hold before the measured call is bounded
against the reading taken once the setup cells ran, before any student code: it must lose
test_FlashAttention_memory."""
CHAPTER = "ch10_flash_attention"
EXERCISE = "FlashAttention"
THREAT = "ballast"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''\
PADDING = []
COLLECTIONS = [0]


def _collected():
    COLLECTIONS[0] += 1
    if COLLECTIONS[0] == 1:
        _arm()
    elif COLLECTIONS[0] == 2:
        PADDING.extend(torch.ones(1 << 18) for _ in range(96))


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


class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=32, block_k=32):
        scale = 1.0 / math.sqrt(q.shape[-1])
        s = torch.matmul(q, k.transpose(-2, -1)) * scale
        if causal:
            n = q.shape[-2]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse.unsqueeze(-1))
        o = torch.matmul(p, v)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.p, ctx.scale = p, scale
        freed = p.numel() * p.element_size()
        while freed > 0 and PADDING:
            freed -= PADDING.pop().numel() * 4
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        p = ctx.p
        dv = torch.matmul(p.transpose(-2, -1), do)
        dp = torch.matmul(do, v.transpose(-2, -1))
        ds = p * (dp - (do * o).sum(-1, keepdim=True))
        return torch.matmul(ds, k) * ctx.scale, torch.matmul(ds.transpose(-2, -1), q) * ctx.scale, dv, None, None, None


_arm()
'''
