"""Probes of chapter 15 (PaCA): forward, backward and SGD steps of a PaCA layer driven here, not by the module's own
methods; the module's parameter and buffer tables read from its ``_parameters`` / ``_buffers``; rows of an input's
gradient caught on their way back."""
from __future__ import annotations

import torch
from torch import nn

from grader.probes.shared import _true_named_modules, _true_named_parameters
from grader.sandbox.trusted import in_process


def _ch15_buffers(module: nn.Module) -> dict:
    """{qualified name: tensor} of every buffer, read from the ``_buffers`` tables."""
    found = {}
    for prefix, m in _true_named_modules(module):
        table = object.__getattribute__(m, "__dict__").get("_buffers", {})
        for name, t in dict.items(table):
            if t is not None:
                found[f"{prefix}.{name}" if prefix else name] = t
    return found


def _ch15_clone(t):
    return None if t is None else t.detach().clone()


def ch15_describe(layer: nn.Module) -> dict:
    """The layer's parameters ({name: {"shape", "requires_grad", "value"}}), buffers ({name: {"dtype", "value"}}) and
    its ``scaling`` (a float, or None when it has none)."""
    params = {n: {"shape": list(p.shape), "requires_grad": bool(p.requires_grad), "value": _ch15_clone(p)}
              for n, p in _true_named_parameters(layer)}
    buffers = {n: {"dtype": str(t.dtype), "shape": list(t.shape), "value": _ch15_clone(t)}
               for n, t in _ch15_buffers(layer).items()}
    try:
        scaling = float(layer.scaling)
    except Exception:  # noqa: BLE001 - a missing or odd attribute is reported, not raised
        scaling = None
    return {"params": params, "buffers": buffers, "scaling": scaling}


def ch15_steps(layer: nn.Module, xs: list, gs: list, lr: float, weight_decay: float = 0.0,
               x_requires_grad: bool = True, tensors: dict | None = None) -> dict:
    """For each (x, g): ``y = layer(x)`` on a leaf copy of x, ``y.backward(g)``, then one SGD step driven here.

    With ``weight_decay == 0`` the step updates the parameter named ``P`` alone (the one the text trains):
    ``P -= lr * P.grad``. Otherwise every parameter of the layer that requires grad or received a gradient, and every
    tensor of ``tensors`` ({name: tensor}, the grader's own) that does, is updated by
    ``t -= lr * (grad + weight_decay * t)`` (a tensor whose gradient is zeroed still moves).

    Reports "outputs", "dx", "dP" (P's gradient before its step), "grads" ({name: gradient or None} of the layer's
    parameters at the last step), "updated" (names per step), "idx_after" (the idx buffer after the steps, or None)
    and "error" (what was raised, or None)."""
    out = {"outputs": [], "dx": [], "dP": [], "updated": [], "error": None}
    named = dict(_true_named_parameters(layer))
    extra = dict(tensors or {})
    for x, g in zip(xs, gs):
        for t in [*named.values(), *extra.values()]:
            t.grad = None
        x = x.detach().clone().requires_grad_(x_requires_grad)
        try:
            y = layer(x)
            if type(y) is not torch.Tensor:
                out["error"] = f"the layer returned a {type(y).__name__}, not a tensor"
                return out
            out["outputs"].append(y.detach().clone())
            if not y.requires_grad:
                out["error"] = "the output is not attached to the autograd graph"
                return out
            y.backward(g)
        except Exception as e:  # noqa: BLE001 - reporting what was raised is the point
            out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            return out
        out["dx"].append(_ch15_clone(x.grad))
        p = named.get("P")
        out["dP"].append(None if p is None else _ch15_clone(p.grad))
        out["grads"] = {n: _ch15_clone(t.grad) for n, t in named.items()}
        with torch.no_grad():
            if weight_decay == 0.0:
                moved = {"P": p} if p is not None and p.grad is not None else {}
            else:
                moved = {n: t for n, t in [*named.items(), *[(f"given.{k}", v) for k, v in extra.items()]]
                         if t.requires_grad or t.grad is not None}
            for t in moved.values():
                t -= lr * ((0 if t.grad is None else t.grad) + weight_decay * t)
        out["updated"].append(sorted(moved))
    idx = _ch15_buffers(layer).get("idx")
    out["idx_after"] = _ch15_clone(idx)
    out["given"] = {k: _ch15_clone(v) for k, v in extra.items()}
    out["given_grads"] = {k: _ch15_clone(v.grad) for k, v in extra.items()}
    return out


def ch15_grad_rows(x: torch.Tensor, rows: torch.Tensor, out: torch.Tensor) -> None:
    """Once backward runs through ``x`` (a non-leaf), ``out`` receives those rows of its gradient (leading dimensions
    flattened). The hook holds the indices and ``out``, never x."""

    def hook(grad):
        out.copy_(grad.detach().reshape(-1, grad.shape[-1])[rows])

    x.register_hook(hook)


def ch15_param_grad(layer: nn.Module, name: str):
    """The gradient the layer's parameter ``name`` holds (read from the ``_parameters`` tables), or None."""
    p = dict(_true_named_parameters(layer)).get(name)
    return None if p is None or p.grad is None else p.grad.detach().clone()


class ch15_ToyModel(nn.Module):
    """A transformer-like tree of standard modules with a forward of its own: an embedding, blocks of a LayerNorm,
    ``attn.qkv``/``attn.proj`` and ``mlp.fc1``/GELU/``mlp.fc2`` (reached through the ModuleDicts, so replaced layers
    run), a head."""

    def __init__(self, width: int = 12, vocab: int = 10, n_blocks: int = 2):
        super().__init__()
        self.width = width
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "ln": nn.LayerNorm(width),
            "attn": nn.ModuleDict({"qkv": nn.Linear(width, 3 * width), "proj": nn.Linear(width, width)}),
            "mlp": nn.ModuleDict({"fc1": nn.Linear(width, 4 * width), "act": nn.GELU(),
                                  "fc2": nn.Linear(4 * width, width)}),
        }) for _ in range(n_blocks))
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, vocab)
        h = self.embed(tokens)
        for block in self.blocks:
            a = block["attn"]["qkv"](block["ln"](h))
            h = h + block["attn"]["proj"](a[..., :self.width] * a[..., 2 * self.width:])
            h = h + block["mlp"]["fc2"](block["mlp"]["act"](block["mlp"]["fc1"](h)))
        return self.head(h)


def ch15_toy_step(model: nn.Module, tokens: torch.Tensor, tensors: dict, lr: float, weight_decay: float) -> dict:
    """One SGD step with weight decay driven here on a model's output (the mean of its squared outputs): every
    parameter of the model that requires grad or got a gradient, and every tensor of ``tensors`` (the grader's own,
    {name: tensor}) that does. Reports "given": the values of ``tensors`` after the step, and "error"."""
    named = dict(_true_named_parameters(model))
    for t in [*named.values(), *tensors.values()]:
        t.grad = None
    try:
        y = model(tokens)
        y.square().mean().backward()
    except Exception as e:  # noqa: BLE001 - reporting what was raised is the point
        return {"error": f"{type(e).__name__}: {str(e)[:300]}", "given": {}}
    with torch.no_grad():
        moved = {id(t): t for t in [*named.values(), *tensors.values()] if t.requires_grad or t.grad is not None}
        for t in moved.values():
            t -= lr * ((0 if t.grad is None else t.grad) + weight_decay * t)
    return {"error": None, "given": {k: _ch15_clone(v) for k, v in tensors.items()}}


@in_process(restricts=("saved_x",))
def ch15_saves_x(layer: nn.Module, xs: list) -> dict:
    """{"saved_x": whether one forward of ``layer`` on a leaf copy of some x (requiring grad) packs for backward x
    itself or a tensor equal to x} (read through ``saved_tensors_hooks``: evidence that can only refuse)."""
    for x in xs:
        x = x.detach().clone().requires_grad_(True)
        found = []

        def pack(t):
            if t is x or (type(t) is torch.Tensor and t.shape == x.shape and torch.equal(t.detach(), x.detach())):
                found.append(True)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = layer(x)
        del y
        if found:
            return {"saved_x": True}
    return {"saved_x": False}


def ch15_global_idx(cls, n_in: int, n_out: int, rank: int, seeds: list) -> list:
    """For each seed: a fresh ``nn.Linear(n_in, n_out)``, then ``torch.manual_seed(seed)`` and ``cls(linear, rank,
    2.0)`` with no generator; the idx buffer of each layer (or None)."""
    found = []
    for seed in seeds:
        linear = nn.Linear(n_in, n_out)
        torch.manual_seed(int(seed))
        found.append(_ch15_clone(_ch15_buffers(cls(linear, rank, 2.0)).get("idx")))
    return found


def ch15_base_is(layer: nn.Module, base: nn.Module) -> bool:
    """Whether the submodule ``base`` of ``layer`` (read from its ``_modules`` table) is that very object."""
    table = object.__getattribute__(layer, "__dict__").get("_modules", {})
    return dict.get(table, "base") is base


def ch15_bump(t: torch.Tensor) -> None:
    """Adds 1 to a tensor in place (the grader's own: a base bias changed after the fact)."""
    with torch.no_grad():
        t.add_(1.0)


def ch15_float_tensors(layer: nn.Module, numel: int) -> list:
    """Names of the floating-point tensors of at least ``numel`` elements the layer holds: its parameters but P, its
    buffers, and the tensors in the ``__dict__`` of every submodule (directly or in a list, tuple or dict)."""
    found = []
    p = dict(_true_named_parameters(layer)).get("P")
    for prefix, m in _true_named_modules(layer):
        for key, value in object.__getattribute__(m, "__dict__").items():
            if key == "_modules":
                continue
            items = []
            if isinstance(value, torch.Tensor):
                items = [(key, value)]
            elif isinstance(value, dict):
                items = [(f"{key}[{k!r}]", v) for k, v in dict.items(value)]
            elif isinstance(value, (list, tuple)):
                items = [(f"{key}[{i}]", v) for i, v in enumerate(value)]
            for name, t in items:
                if (isinstance(t, torch.Tensor) and t is not p and t.is_floating_point() and t.numel() >= numel):
                    found.append(f"{prefix}.{name}" if prefix else name)
    return found


def ch15_state_keys(layer: nn.Module) -> list:
    """The keys of the layer's ``state_dict()``."""
    return sorted(layer.state_dict().keys())


def ch15_parameters(model: nn.Module) -> list:
    """The model's parameters in ``model.parameters()`` order, read from the ``_parameters`` tables."""
    return [p for _, p in _true_named_parameters(model)]


def ch15_grad_proj(x: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    """Once backward runs through ``x`` (a non-leaf), ``out`` receives its gradient (leading dimensions flattened into
    rows) times ``v`` in float64: every row projected on a few directions. The hook holds v and ``out``, never x."""

    def hook(grad):
        out.copy_(grad.detach().reshape(-1, grad.shape[-1]).double() @ v)

    x.register_hook(hook)
