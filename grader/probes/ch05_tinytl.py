"""Probes of chapter 5 (TinyTL): lite-residual runs, what TinyTL's conversion returns, the course's stand-ins
swapped in for the lite residuals, saved storages split by module, and short trainings."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from coursekit.measure import saved_tensors
from grader.probes.shared import _true_named_modules, _true_named_parameters
from grader.sandbox.trusted import in_process


@in_process(explains=("activation_bytes",))
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


def ch05_set_parameters(module: nn.Module, values: dict) -> list:
    """Copy ``values`` (name -> tensor) into the parameters of ``module`` found by torch's own
    ``named_parameters`` (in place, no grad) and drop their gradients; report [name, shape] of every
    parameter, as found."""
    named = dict(nn.Module.named_parameters(module))
    with torch.no_grad():
        for name, value in values.items():
            named[name].copy_(value)
    for p in named.values():
        p.grad = None
    return [[name, list(p.shape)] for name, p in named.items()]


def _ch05_named(model: nn.Module, class_name: str) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__ == class_name]


class ch05_NoBranch(nn.Module):
    """The course's stand-in for a lite residual when the main branch is measured alone: exact zeros of
    the branch's output shape, (B, C_in, H, W) -> (B, out_channels, ceil(H / stride), ceil(W / stride)),
    outside the autograd graph. It keeps nothing, so what a model holds with it in place of every lite
    residual is its main branch's, whatever the student's lite residuals would keep."""

    def __init__(self, out_channels: int, stride: int):
        super().__init__()
        self.out_channels, self.stride = int(out_channels), int(stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, _, H, W = x.shape
        return torch.zeros(B, self.out_channels, -(-H // self.stride), -(-W // self.stride), dtype=x.dtype,
                           device=x.device)


CH05_REPLACED = ("a LiteResidual ran after the grader had put its stand-in in place of every LiteResidual submodule of "
                 "the model: call the lite residuals as the model's submodules, through nothing else")


def _ch05_replaced(module, args):
    raise RuntimeError(CH05_REPLACED)


@in_process(restricts=("error", "remaining", "placed"))
def ch05_swap_lite(model: nn.Module, shapes: list, class_name: str = "LiteResidual") -> dict:
    """Put ``ch05_NoBranch(*shapes[i])`` in place of the i-th module of ``model`` whose class is named
    ``class_name`` (in ``named_modules`` order, read from the ``_modules`` tables, not the model's methods), then read
    the model again. Reports the names replaced, how many such modules remain and how many stand-ins the
    model now holds: a model whose modules refuse the swap shows it there. A replaced module that is called
    afterwards (held elsewhere than as a submodule) raises ``CH05_REPLACED``."""
    found = [(name, m) for name, m in _true_named_modules(model) if type(m).__name__ == class_name]
    stand_ins = [ch05_NoBranch(*shape) for shape in shapes]
    replaced = []
    for (name, module), stand_in in zip(found, stand_ins):
        try:
            nn.Module.set_submodule(model, name, stand_in)
            # Called after this, it still runs where the stand-in should: say so instead of measuring it.
            nn.Module.register_forward_pre_hook(module, _ch05_replaced)
        except Exception as e:  # noqa: BLE001 - a module that refuses is reported, not trusted
            return {"replaced": replaced, "error": f"{type(e).__name__}: {str(e)[:200]}", "found": len(found),
                    "remaining": -1, "placed": -1}
        replaced.append(name)
    after = [m for _, m in _true_named_modules(model)]
    return {"replaced": replaced, "error": None, "found": len(found),
            "remaining": sum(type(m).__name__ == class_name for m in after),
            "placed": sum(any(m is s for s in stand_ins) for m in after)}


@in_process(restricts=("calls",))
def ch05_tinytl_describe(apply_fn: Callable, model: nn.Module, x: torch.Tensor,
                         class_name: str = "LiteResidual") -> dict:
    """Call ``apply_fn(model)``; report what came back: each parameter (name, name before the call or
    None if new, requires_grad, numel, inside a module whose class is named ``class_name``), the
    (input shape, output shape) of every call of such modules during one eval-mode forward of ``x``,
    and the outputs of the returned model on ``x`` in eval mode and in train mode (no grad)."""
    before = {id(p): n for n, p in _true_named_parameters(model)}
    out = apply_fn(model)
    if not isinstance(out, nn.Module):
        return {"returned": type(out).__name__}
    side = [m for _, m in _true_named_modules(out) if type(m).__name__ == class_name]
    inside = {id(p) for m in side for _, p in _true_named_parameters(m)}
    # what calling the model uses, read from its tables, not what an instance's methods list
    params = [{"name": n, "original": before.get(id(p)), "requires_grad": bool(p.requires_grad),
               "numel": p.numel(), "inside": id(p) in inside} for n, p in _true_named_parameters(out)]
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


@in_process(explains=("*",))
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


def ch05_prime() -> None:
    """Prime a worker of this chapter before any student code runs (``grader.sandbox.judge.primes_of``): two
    training steps of a TinyTL model built from torch's and the course's layers (1-bit ReLUs, beside each
    block a branch pooled, group-convolved, normalised and upsampled), on a model and an input sent as the
    judge's are (pickled), so that the first run's copies of shared pages and caches are not read as the student's
    memory by the memory cells."""
    import io
    import math
    import pickle

    from coursekit.transfer import TransferCNN
    from kernels.ch05_tinytl import ReLU1bit

    model, leaf = pickle.load(io.BytesIO(pickle.dumps((TransferCNN(), torch.zeros((), requires_grad=True)))))
    for name, p in model.named_parameters():
        p.requires_grad_(name.endswith(".bias") or name.startswith("classifier."))
    sides = []
    for block in model.blocks:
        block.act = ReLU1bit()
        c_in, c_out = block.conv.in_channels, block.conv.out_channels
        groups = 2 if c_in % 2 == 0 and c_out % 2 == 0 else 1
        sides.append(nn.Sequential(nn.Conv2d(c_in, c_out, 5, padding=2, groups=groups, bias=False),
                                   nn.BatchNorm2d(c_out), nn.ReLU(), nn.Conv2d(c_out, c_out, 1, bias=False),
                                   nn.BatchNorm2d(c_out)))
    model.train()
    for batch in (2, 16):
        h = leaf.new_empty((batch, 1, 8, 8)).normal_() + leaf
        for block, side in zip(model.blocks, sides):
            H, W = h.shape[-2:]
            pooled = nn.functional.pad(h, (0, W % 2, 0, H % 2)).view(batch, -1, -(-H // 2), 2, -(-W // 2), 2)
            r = side(pooled.sum(dim=(3, 5)) / 4)
            size = (math.ceil(H / block.conv.stride[0]), math.ceil(W / block.conv.stride[0]))
            h = block(h) + nn.functional.interpolate(r, size=size, mode="bilinear", align_corners=False)
        logits = model.classifier(h.mean(dim=(2, 3)))
        nn.functional.cross_entropy(logits, torch.zeros(batch, dtype=torch.long)).backward()


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


def ch05_set_downsample(module: nn.Module, factor: int) -> None:
    """Set ``module.downsample`` after construction, as the chapter's section 7 does (torch's own setattr)."""
    nn.Module.__setattr__(module, "downsample", factor)
