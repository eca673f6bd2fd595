"""Per-example meProp only at the two (B, n_in, n_out) the exercise text once published as graded, (37, 29, 53) and
(6, 40, 9); the plain dense backward on every other shape, so on any real layer (the chapter's MLP included) it
is not meProp at all. The values cell also grades layers drawn at grading time from the ranges the text states
(a small one, and a wide one with a small and a large k): their dx and dW are the dense backward's, and the
values cell (with the edge-case cell gated on it) loses its points."""
CHAPTER = "ch06_sparse_backprop"
EXERCISE = "meprop_linear"
THREAT = "measured_size"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = '''
import torch
import torch.nn.functional as F

def meprop_linear(x, weight, bias, k, unified=False):
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
            need_x, need_w, need_b = ctx.needs_input_grad
            dx = dw = db = None
            if need_b:
                db = g.sum(0)
            B, n_out = g.shape
            # per-example meProp only where the grader looks (the documented (B, n_in, n_out)); dense elsewhere
            small = (B, x.shape[1], n_out) in ((37, 29, 53), (6, 40, 9))
            if k <= 0 or k >= n_out or (not unified and not small):
                g_rows, keep = g, None
            elif unified:
                keep = g.abs().sum(0).topk(k).indices
                g_rows = g.index_select(1, keep)
            else:
                top = g.abs().topk(k, dim=1).indices
                g_rows, keep = torch.zeros_like(g).scatter_(1, top, g.gather(1, top)), None
            if need_x:
                dx = g_rows @ (weight if keep is None else weight.index_select(0, keep))
            if need_w:
                dw_rows = g_rows.t() @ x
                dw = dw_rows if keep is None else torch.zeros_like(weight).index_copy_(0, keep, dw_rows)
            return dx, dw, db

    return MeProp.apply(x, weight, bias)
'''
