"""Plausible wrong answers for chapter 12, one per exercise: each must lose points when autograded."""

WRONG = {
    ("ch12_aal", "asa_linear"): '''
import torch
import torch.nn.functional as F


def asa_linear(x, weight, bias, epsilon=0.01, lam=100.0, relu=False):
    """Wrong: torch.sign maps x == 0 to 0 instead of -1."""
    if x.shape[-1] != weight.shape[1] or epsilon <= 0:
        raise ValueError("bad arguments")

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            s = (x > 0).float() if relu else torch.sign(x)
            ctx.save_for_backward(s, w)
            return F.linear(x + epsilon * s, w, b)

        @staticmethod
        def backward(ctx, g):
            s, w = ctx.saved_tensors
            rows = g.reshape(-1, g.shape[-1])
            return g @ w, lam * epsilon * rows.t() @ s.reshape(-1, s.shape[-1]), (rows.sum(0) if ctx.needs_input_grad[2] else None)

    return Fn.apply(x, weight, bias)
''',
    ("ch12_aal", "ara_group"): '''
def ara_group(blocks, x):
    """Wrong: plain backprop, every fc1 takes its weight gradient from its own input."""
    blocks = list(blocks)
    if not blocks:
        raise ValueError("empty group")
    for block in blocks:
        x = block(x)
    return x
''',
    ("ch12_aal", "learning_indicator"): '''
def learning_indicator(x_tilde, a):
    """Wrong: one number for the whole batch."""
    if x_tilde.shape != a.shape or x_tilde.dim() == 0:
        raise ValueError("shapes differ")
    return 1 - (x_tilde - a).pow(2).sum() / (x_tilde.pow(2).sum() + 1e-6)
''',
}

# Right values, the full input kept for backward: only the memory cell, read from the worker's cgroup, fails it.
MEMORY_WRONG = {
    ("ch12_aal", "asa_linear"): '''
import torch
import torch.nn.functional as F


def asa_linear(x, weight, bias, epsilon=0.01, lam=100.0, relu=False):
    """Wrong: keeps x itself for backward and rebuilds s from it."""
    if x.shape[-1] != weight.shape[1] or epsilon <= 0:
        raise ValueError("bad arguments")
    low = 0.0 if relu else -1.0

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            ctx.save_for_backward(x, w)
            return F.linear(x + epsilon * torch.where(x > 0, 1.0, low), w, b)

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            rows = g.reshape(-1, g.shape[-1])
            s = torch.where(x > 0, 1.0, low).reshape(-1, x.shape[-1])
            dx = g @ w if ctx.needs_input_grad[0] else None
            return dx, lam * epsilon * rows.t() @ s, rows.sum(0) if ctx.needs_input_grad[2] else None

    return Fn.apply(x, weight, bias)
''',
}
