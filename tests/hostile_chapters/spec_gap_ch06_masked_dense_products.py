"""The unified backward multiplies all n_out columns of g and all rows of W: torch.where masks keep the columns
of I and scrub the poison the compute cell plants (NaN rows of W outside I, an inf in x), so every value is
right. It computes the dense products the exercise forbids; the compute cell's CPU time, read from the
worker's cgroup on a wide layer against the course's own dense products, stops it."""
CHAPTER = "ch06_sparse_backprop"
EXERCISE = "meprop_linear"
THREAT = "spec_gap"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''
import torch
import torch.nn.functional as F


def meprop_linear(x, weight, bias, k, unified=False):
    """Dense products, poison scrubbed with torch.where."""
    if x.dim() != 2:
        raise ValueError("x must be 2-D")

    class MeProp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            ctx.save_for_backward(x, weight)
            return F.linear(x, weight, bias)

        @staticmethod
        def backward(ctx, g):
            x, weight = ctx.saved_tensors
            n_out = g.shape[1]
            if 0 < k < n_out:
                if unified:
                    rows = torch.zeros(n_out, dtype=torch.bool, device=g.device)
                    rows[g.abs().sum(0).topk(k).indices] = True
                    keep = rows.expand_as(g)
                else:
                    keep = torch.zeros_like(g, dtype=torch.bool).scatter_(1, g.abs().topk(k, dim=1).indices, True)
                    rows = keep.any(0)
            else:
                keep = torch.ones_like(g, dtype=torch.bool)
                rows = keep.any(0)
            gs = torch.where(keep, g, torch.zeros_like(g))
            dx = dw = db = None
            if ctx.needs_input_grad[0]:
                dx = gs @ torch.where(rows[:, None], weight, torch.zeros_like(weight))
            if ctx.needs_input_grad[1]:
                dw = torch.where(rows[:, None], gs.t() @ x, torch.zeros_like(weight))
            if ctx.needs_input_grad[2]:
                db = g.sum(0)
            return dx, dw, db

    return MeProp.apply(x, weight, bias)
'''
