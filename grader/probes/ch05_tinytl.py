"""Probes of chapter 5 (TinyTL): lite-residual runs, what TinyTL's conversion returns, saved storages
split by module, and short trainings."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from coursekit.measure import saved_tensors


def ch05_lite_run(module: nn.Module, x: torch.Tensor, grad_out: torch.Tensor, values: dict | None = None) -> dict:
    """One training-mode forward + backward of ``module`` on a leaf copy of ``x``.

    Reports the parameters as found ("params": name, shape, requires_grad, value), then, after
    overwriting the parameters named in ``values`` (in place, no grad), the output, the input and
    parameter gradients and the activation bytes saved for backward; finally the eval-mode output.
    """
    params = [{"name": n, "shape": list(p.shape), "requires_grad": bool(p.requires_grad), "value": p.detach().clone()}
              for n, p in module.named_parameters()]
    named = dict(module.named_parameters())
    with torch.no_grad():
        for name, value in (values or {}).items():
            named[name].copy_(value)
    module.zero_grad(set_to_none=True)
    module.train()
    x = x.detach().clone().requires_grad_(True)
    with saved_tensors(module) as rec:
        y = module(x)
    y.backward(grad_out)
    module.eval()
    with torch.no_grad():
        y_eval = module(x)
    return {"params": params, "y": y.detach().clone(), "y_eval": y_eval.clone(),
            "dx": None if x.grad is None else x.grad.clone(),
            "grads": {n: None if p.grad is None else p.grad.detach().clone() for n, p in module.named_parameters()},
            "activation_bytes": rec.activation_bytes}


def _ch05_named(model: nn.Module, class_name: str) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__ == class_name]


def ch05_tinytl_describe(apply_fn: Callable, model: nn.Module, x: torch.Tensor,
                         class_name: str = "LiteResidual") -> dict:
    """Call ``apply_fn(model)``; report what came back: each parameter (name, name before the call or
    None if new, requires_grad, numel, inside a module whose class is named ``class_name``), the
    (input shape, output shape) of every call of such modules during one eval-mode forward of ``x``,
    and the outputs of the returned model on ``x`` in eval mode and in train mode (no grad)."""
    before = {id(p): n for n, p in model.named_parameters()}
    out = apply_fn(model)
    if not isinstance(out, nn.Module):
        return {"returned": type(out).__name__}
    side = _ch05_named(out, class_name)
    inside = {id(p) for m in side for p in m.parameters()}
    params = [{"name": n, "original": before.get(id(p)), "requires_grad": bool(p.requires_grad),
               "numel": p.numel(), "inside": id(p) in inside} for n, p in out.named_parameters()]
    calls: list = []
    hooks = [m.register_forward_hook(lambda _m, i, o: calls.append([list(i[0].shape), list(o.shape)])) for m in side]
    try:
        with torch.no_grad():
            y_eval = out.eval()(x)
            n_calls = len(calls)
            y_train = out.train()(x)
    finally:
        for h in hooks:
            h.remove()
    out.eval()
    return {"returned": "the same model" if out is model else type(out).__name__, "params": params,
            "calls": calls[:n_calls], "y_eval": y_eval.clone(), "y_train": y_train.clone()}


def ch05_saved_split(model: nn.Module, x: torch.Tensor, y: torch.Tensor, class_name: str = "LiteResidual") -> dict:
    """Storages saved for backward by one train-mode cross-entropy step of ``model`` (parameters and
    buffers excluded), split by where they were first saved: inside a module whose class is named
    ``class_name`` or outside. Each side: total bytes and [shape, dtype, bytes] per storage."""
    depth = [0]

    def enter(*_):
        depth[0] += 1

    def leave(*_):
        depth[0] -= 1

    hooks = [h for m in _ch05_named(model, class_name)
             for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    model.train()
    try:
        with saved_tensors(model, label=lambda: "inside" if depth[0] else "outside") as rec:
            loss = nn.functional.cross_entropy(model(x), y)
    finally:
        for h in hooks:
            h.remove()
    loss.backward()
    out = {side: {"bytes": 0, "tensors": []} for side in ("inside", "outside")}
    for t in rec.tensors:
        if not t.is_state:
            out[t.label]["bytes"] += t.nbytes
            out[t.label]["tensors"].append([list(t.shape), str(t.dtype), t.nbytes])
    return out


def ch05_train_steps(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 6, lr: float = 1e-2) -> dict:
    """``steps`` Adam steps on the parameters of ``model`` that require grad (cross-entropy on one
    batch, train mode); the loss before each step and, per parameter name, whether it changed."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if not params:
        return {"losses": [], "changed": {}}
    start = {n: p.detach().clone() for n, p in params.items()}
    opt = torch.optim.Adam(params.values(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "changed": {n: bool((p.detach() != start[n]).any()) for n, p in params.items()}}
