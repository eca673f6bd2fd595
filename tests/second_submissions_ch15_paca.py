"""Second correct answers for ch15_paca, written from the released notebook alone: the columns written with
index_copy_, the weight kept through save_for_backward, gradients through einsum on flattened rows and advanced
indexing for the selected columns; apply_paca matching names part by part; QPaCA with the dequantized weight rebuilt by
one helper in forward and backward."""

SECOND = {
    ("ch15_paca", "PaCALinear"): '''
import torch
import torch.nn.functional as F
from torch import nn


class PaCALinear(nn.Module):
    """PaCA layer: r input columns of the frozen weight are trained through P."""

    def __init__(self, base, rank, alpha, generator=None):
        super().__init__()
        if type(rank) is not int or rank < 1 or rank > base.in_features:
            raise ValueError(f"rank {rank!r} is not an int in [1, {base.in_features}]")
        self.base = base
        for t in base.parameters():
            t.requires_grad = False
        self.scaling = float(alpha) / rank
        chosen = torch.randperm(base.in_features, generator=generator)[:rank]
        self.register_buffer("idx", chosen.to(torch.int64))
        init = torch.index_select(base.weight.detach(), 1, chosen).clone()
        self.P = nn.Parameter(init.div(self.scaling))

    def forward(self, x):
        with torch.no_grad():
            self.base.weight.index_copy_(1, self.idx, self.P.detach() * self.scaling)
        cols, s = self.idx, self.scaling

        class _Partial(torch.autograd.Function):
            @staticmethod
            def forward(ctx, inp, p, w, b):
                picked = inp[..., cols].contiguous()
                ctx.save_for_backward(picked, w)
                return F.linear(inp, w, b)

            @staticmethod
            def backward(ctx, gy):
                picked, w = ctx.saved_tensors
                g2 = gy.reshape(-1, gy.shape[-1])
                p2 = picked.reshape(-1, picked.shape[-1])
                gx = torch.einsum("...o,oi->...i", gy, w) if ctx.needs_input_grad[0] else None
                gp = s * torch.einsum("no,nr->or", g2, p2) if ctx.needs_input_grad[1] else None
                return gx, gp, None, None

        return _Partial.apply(x, self.P, self.base.weight, self.base.bias)

    def merge(self):
        out = nn.Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None)
        with torch.no_grad():
            w = self.base.weight.detach().clone()
            w.index_copy_(1, self.idx, self.P.detach() * self.scaling)
            out.weight.copy_(w)
            if self.base.bias is not None:
                out.bias.copy_(self.base.bias.detach())
        return out
''',
    ("ch15_paca", "apply_paca"): '''
from torch import nn


def apply_paca(model, rank, alpha, targets):
    """Swap the matching Linears for PaCALinear, freeze everything else."""
    wanted = [t.split(".") for t in targets]
    found = []
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or not name:
            continue
        parts = name.split(".")
        if any(parts[len(parts) - len(w):] == w for w in wanted if len(w) <= len(parts)):
            found.append(name)
    if len(found) == 0:
        raise ValueError(f"targets {list(targets)} match no nn.Linear")
    for p in model.parameters():
        p.requires_grad = False
    for name in found:
        model.set_submodule(name, PaCALinear(model.get_submodule(name), rank, alpha))
    return model
''',
    ("ch15_paca", "QPaCALinear"): '''
import torch
import torch.nn.functional as F
from torch import nn


class QPaCALinear(nn.Module):
    """PaCA with a 4-bit NF4 frozen weight."""

    def __init__(self, base, rank, alpha, block_size=64):
        super().__init__()
        if type(rank) is not int or not 0 < rank <= base.in_features:
            raise ValueError(f"rank {rank!r} is not an int in [1, {base.in_features}]")
        self.out_features, self.in_features = base.weight.shape
        self.block_size = block_size
        self.scaling = float(alpha) / rank
        self.register_buffer("idx", torch.randperm(self.in_features)[:rank])
        self.P = nn.Parameter(base.weight.detach()[:, self.idx].clone() / self.scaling)
        codes, scales = nf4_encode(base.weight.detach(), block_size)
        self.register_buffer("weight_packed", codes)
        self.register_buffer("weight_absmax", scales)
        if base.bias is None:
            self.bias = None
        else:
            self.bias = nn.Parameter(base.bias.detach().clone(), requires_grad=False)

    def _weight(self, p):
        return nf4_decode_columns_torch(self.weight_packed, self.weight_absmax, (self.out_features, self.in_features),
                                        self.idx, p * self.scaling, self.block_size)

    def forward(self, x):
        layer = self

        class _QPartial(torch.autograd.Function):
            @staticmethod
            def forward(ctx, inp, p):
                ctx.save_for_backward(inp[..., layer.idx].contiguous(), p)
                return F.linear(inp, layer._weight(p), layer.bias)

            @staticmethod
            def backward(ctx, gy):
                picked, p = ctx.saved_tensors
                gx = gp = None
                if ctx.needs_input_grad[0]:
                    gx = torch.einsum("...o,oi->...i", gy, layer._weight(p))
                if ctx.needs_input_grad[1]:
                    gp = layer.scaling * torch.einsum("no,nr->or", gy.reshape(-1, gy.shape[-1]),
                                                      picked.reshape(-1, picked.shape[-1]))
                return gx, gp

        return _QPartial.apply(x, self.P)
''',
}
