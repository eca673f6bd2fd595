"""Masked dense products (every value right, the poison scrubbed with torch.where) plus an attack on the yardstick:
the exercise cell sets torch's thread count to 16, so that a baseline measured on the worker's single core would
spend CPU time on threads waiting for each other, while its own backward runs on one thread. The course's dense
products run on one thread whatever the student set, so the dense backward still uses about what they take and the
compute cell's CPU time, read from the worker's cgroup, stops it."""
CHAPTER = "ch06_sparse_backprop"
EXERCISE = "meprop_linear"
THREAT = "resource"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''
import torch
import torch.nn.functional as F

torch.set_num_threads(16)  # every later product, the grader's too, on 16 threads sharing one core


def meprop_linear(x, weight, bias, k, unified=False):
    """Dense products, poison scrubbed with torch.where, timed on one thread."""
    if x.dim() != 2:
        raise ValueError("x must be 2-D")

    class MeProp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            ctx.save_for_backward(x, weight)
            return F.linear(x, weight, bias)

        @staticmethod
        def backward(ctx, g):
            torch.set_num_threads(1)
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
            torch.set_num_threads(16)
            return dx, dw, db

    return MeProp.apply(x, weight, bias)
'''
