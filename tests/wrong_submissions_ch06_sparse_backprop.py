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

# A plausible wrong answer that loses only meprop_linear's compute cell on the CPU time read from outside the
# student's process: every value right, and the poison of the cell's small cases (NaN rows of W, an inf in x) scrubbed
# by torch.where, but the products are dense. Graded through the sandbox by tests/test_hidden_ch06_sparse_backprop.py.
COMPUTE_WRONG = {
    ("ch06_sparse_backprop", "meprop_linear"): '''
import torch
import torch.nn.functional as F


def meprop_linear(x, weight, bias, k, unified=False):
    """Wrong: right values, but the unified backward multiplies all n_out columns of g, the kept ones selected by
    masks (torch.where) that also scrub the grader's NaN/inf poison (test_meprop_linear_compute: CPU time)."""
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
''',
}
