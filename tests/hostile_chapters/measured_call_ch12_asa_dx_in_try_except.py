"""asa_linear that always computes dx, an unreadable weight swallowed by try/except."""
CHAPTER = "ch12_aal"
EXERCISE = "asa_linear"
THREAT = "measured_call"
EXPECT = "loses"
DESCRIPTION = ("ignores ctx.needs_input_grad: dx = g W is computed even when x does not require grad, and the error "
               "a freed weight raises is swallowed, so the freed-weight check sees nothing; the peak of backward, read "
               "from outside the worker with x not requiring grad, shows a dx as large as x")
SOURCE = '''
def asa_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, epsilon: float = 0.01,
               lam: float = 100.0, relu: bool = False) -> torch.Tensor:
    if x.shape[-1] != weight.shape[1]:
        raise ValueError("bad shape")
    if not epsilon > 0:
        raise ValueError("epsilon")

    class _ASA(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            pos = x > 0
            s = torch.where(pos, 1.0, 0.0 if relu else -1.0).to(x.dtype)
            y = F.linear(x + epsilon * s, weight, bias)
            ctx.in_shape, ctx.n, ctx.has_bias = x.shape, x.numel(), bias is not None
            ctx.save_for_backward(pack_mask_torch(pos.reshape(-1)), weight)
            return y

        @staticmethod
        def backward(ctx, g):
            packed, weight = ctx.saved_tensors
            g2 = g.reshape(-1, g.shape[-1])
            try:
                dx = (g2 @ weight).reshape(ctx.in_shape)
            except Exception:
                dx = None
            pos = unpack_mask_torch(packed, ctx.n).reshape(-1, ctx.in_shape[-1])
            s = pos.to(g.dtype) if relu else pos.to(g.dtype) * 2 - 1
            dw = lam * epsilon * (g2.t() @ s)
            db = g2.sum(0) if ctx.has_bias else None
            return dx, dw, db

    return _ASA.apply(x, weight, bias)
'''
