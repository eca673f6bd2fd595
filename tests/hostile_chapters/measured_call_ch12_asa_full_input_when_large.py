"""asa_linear that keeps the full input for backward on large inputs only."""
CHAPTER = "ch12_aal"
EXERCISE = "asa_linear"
THREAT = "measured_call"
EXPECT = "loses"
DESCRIPTION = ("packs s at 1 bit per element on small inputs, where every value is checked; on inputs of a million "
               "elements or more it keeps x itself (faster to rebuild s from), 32 bits per element: the outside "
               "reading of the memory cell sees it whatever the values say")
SOURCE = '''
def asa_linear(x, weight, bias, epsilon=0.01, lam=100.0, relu=False):
    """ASA, with a shortcut on large inputs."""
    if x.shape[-1] != weight.shape[1] or not epsilon > 0:
        raise ValueError("bad arguments")
    low = 0.0 if relu else -1.0
    large = x.numel() >= 1_000_000

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            ctx.shape = x.shape
            ctx.save_for_backward(x if large else pack_mask_torch(x > 0), w)
            return F.linear(x + epsilon * torch.where(x > 0, 1.0, low), w, b)

        @staticmethod
        def backward(ctx, g):
            kept, w = ctx.saved_tensors
            n_in = ctx.shape[-1]
            rows = g.reshape(-1, g.shape[-1])
            positive = (kept > 0) if large else unpack_mask_torch(kept, rows.shape[0] * n_in)
            s = torch.where(positive.reshape(-1, n_in), 1.0, low)
            dx = (g @ w) if ctx.needs_input_grad[0] else None
            return dx, lam * epsilon * rows.t() @ s, rows.sum(0) if ctx.needs_input_grad[2] else None

    return Fn.apply(x, weight, bias)
'''
