"""Second correct answers for ch06_sparse_backprop, written from the released notebook alone: a boolean keep-mask with torch.where for per-example top-k, index_select/index_copy for the unified products, and a dotted-name walk with set_submodule."""

SECOND = {
    ("ch06_sparse_backprop", "meprop_linear"): '''
import torch
import torch.nn.functional as F


def meprop_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, k: int,
                  unified: bool = False) -> torch.Tensor:
    """y = x W^T + b; backward back-propagates only the top-k of the output gradient."""
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (B, n_in), got shape {tuple(x.shape)}")

    class _SparseGradLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp, w, b):
            want_dx, want_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            # dx needs only W, dW needs only x: keep what will be read, nothing more
            ctx.save_for_backward(w if want_dx else None, inp if want_dw else None)
            ctx.n_out = w.shape[0]
            return F.linear(inp, w, b)

        @staticmethod
        def backward(ctx, grad_out):
            w, inp = ctx.saved_tensors
            want_dx, want_dw, want_db = ctx.needs_input_grad
            n_out = ctx.n_out
            grad_x = grad_w = grad_b = None
            if want_db:
                grad_b = grad_out.sum(dim=0)  # always the full gradient
            if not (want_dx or want_dw):
                return grad_x, grad_w, grad_b

            if k <= 0 or k >= n_out:  # dense backward
                if want_dx:
                    grad_x = grad_out.mm(w)
                if want_dw:
                    grad_w = grad_out.t().mm(inp)
            elif unified:
                chosen = grad_out.abs().sum(dim=0).topk(k).indices  # (k,) one index set for the batch
                g_small = grad_out.index_select(1, chosen)  # (B, k)
                if want_dx:
                    grad_x = g_small.mm(w.index_select(0, chosen))
                if want_dw:
                    rows = g_small.t().mm(inp)  # (k, n_in)
                    grad_w = rows.new_zeros((n_out, rows.shape[1])).index_copy(0, chosen, rows)
            else:
                top = grad_out.abs().topk(k, dim=1).indices  # (B, k) per row
                keep = torch.zeros(grad_out.shape, dtype=torch.bool, device=grad_out.device)
                keep.scatter_(1, top, True)
                g_sparse = torch.where(keep, grad_out, torch.zeros_like(grad_out))
                if want_dx:
                    grad_x = g_sparse.mm(w)
                if want_dw:
                    grad_w = g_sparse.t().mm(inp)
            return grad_x, grad_w, grad_b

    return _SparseGradLinear.apply(x, weight, bias)
''',
    ("ch06_sparse_backprop", "apply_meprop"): '''
from torch import nn


def apply_meprop(model: nn.Module, k: int, unified: bool = False) -> nn.Module:
    """Replace every nn.Linear but the last (in modules() order) by a MePropLinear, in place."""
    found = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if not found:
        raise ValueError("the model holds no nn.Linear layer")
    *hidden, _output = found
    for name, layer in hidden:
        model.set_submodule(name, MePropLinear(layer, k, unified))
    return model
''',
}
