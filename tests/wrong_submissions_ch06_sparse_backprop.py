"""Plausible wrong answers for chapter 6, one per exercise: each must lose points when autograded."""

WRONG = {
    ("ch06_sparse_backprop", "meprop_linear"): '''
import torch
import torch.nn.functional as F

def meprop_linear(x, weight, bias, k, unified=False):
    """Wrong: right values, but the unified backward multiplies a dense g with zeroed columns (no saving)."""
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
            if 0 < k < g.shape[1]:
                if unified:
                    mask = torch.zeros_like(g)
                    mask[:, g.abs().sum(0).topk(k).indices] = 1.0
                else:
                    mask = torch.zeros_like(g).scatter_(1, g.abs().topk(k, dim=1).indices, 1.0)
                g_sparse = g * mask
            else:
                g_sparse = g
            dx = g_sparse @ weight if ctx.needs_input_grad[0] else None
            db = g.sum(0) if ctx.needs_input_grad[2] else None
            return dx, g_sparse.t() @ x, db

    return MeProp.apply(x, weight, bias)
''',
    ("ch06_sparse_backprop", "apply_meprop"): '''
from torch import nn

def apply_meprop(model, k, unified=False):
    """Wrong: also replaces the output layer, whose gradient meProp leaves dense."""
    names = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise ValueError("no Linear")
    for name in names:
        model.set_submodule(name, MePropLinear(model.get_submodule(name), k, unified))
    return model
''',
}
