"""Probes of chapter 14 (DropBP): one forward and backward of a DropBP module on a leaf copy of x (training or eval
mode, the decision read back), attributes set on the student's module, the gradients a module's parameters hold,
rows of a large output, and the state a model is left in."""
from __future__ import annotations

import torch
from torch import nn

from grader.probes.shared import _true_named_parameters
from grader.sandbox.trusted import in_process


def _ch14_error(e: BaseException) -> dict:
    return {"types": [c.__name__ for c in type(e).__mro__], "message": str(e)[:300]}


def _ch14_grad(t):
    return None if t is None or t.grad is None else t.grad.detach().clone()


def ch14_grads(module: nn.Module) -> dict:
    """{name: the gradient its parameter holds, or None} for every parameter of ``module``."""
    return {name: _ch14_grad(p) for name, p in _true_named_parameters(module)}


def ch14_set(obj, name: str, value) -> None:
    """``setattr(obj, name, value)`` (the force attribute of a DropBP module, for example)."""
    setattr(obj, name, value)


def _ch14_state(gen) -> torch.Tensor:
    return (gen.get_state() if isinstance(gen, torch.Generator) else torch.get_rng_state()).clone()


@in_process(restricts=("packed",))
def ch14_run(module: nn.Module, sublayer: nn.Module, x: torch.Tensor, grad_out: torch.Tensor, training: bool,
             global_seed: int | None = None, gen: torch.Generator | None = None) -> dict:
    """Put ``module`` in training or eval mode (nn.Module.train), zero the sublayer's gradients (None), run
    ``y = module(x_leaf)`` on a leaf copy of x requiring grad (with ``global_seed``, torch.manual_seed(global_seed)
    right before the call) under a saved-tensors hook that counts the tensors packed for backward, then
    ``y.backward(grad_out)``. Reports "type", "y", "dropped" (the module's attribute, if a bool), "packed",
    "attached", "error", "dx", "grads" of the sublayer's parameters and "state", the state of ``gen`` (torch's
    global generator when ``gen`` is None) after the call."""
    nn.Module.train(module, training)
    for _, p in _true_named_parameters(sublayer):
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    if global_seed is not None:
        torch.manual_seed(int(global_seed))
    packed = [0]

    def pack(t):
        packed[0] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = module(x)
    dropped = getattr(module, "dropped", None)
    out = {"dropped": dropped if isinstance(dropped, bool) else repr(dropped)[:50], "packed": packed[0],
           "state": _ch14_state(gen)}
    if not isinstance(y, torch.Tensor):
        out.update(type=type(y).__name__, y=None)
        return out
    out.update(type="Tensor", y=y.detach().clone(), attached=y.grad_fn is not None, error=None)
    if out["attached"]:
        try:
            y.backward(grad_out)
        except Exception as e:  # noqa: BLE001 - reporting what was raised is the point
            out["error"] = _ch14_error(e)
            return out
    out.update(dx=_ch14_grad(x), grads={name: _ch14_grad(p) for name, p in _true_named_parameters(sublayer)})
    return out


def ch14_after(module: nn.Module, gen: torch.Generator | None) -> dict:
    """The module's ``dropped`` attribute (if a bool) and the state of ``gen`` (torch's global generator if None)."""
    dropped = getattr(module, "dropped", None)
    return {"dropped": dropped if isinstance(dropped, bool) else repr(dropped)[:50], "state": _ch14_state(gen)}


def ch14_seeded(fn, seed: int, *args):
    """``torch.manual_seed(seed)``, then ``fn(*args)``."""
    torch.manual_seed(int(seed))
    return fn(*args)


def ch14_rows(y: torch.Tensor, rows: torch.Tensor) -> dict:
    """Those rows of ``y`` (leading dimensions flattened), whether it is attached to a graph, and its shape."""
    if not isinstance(y, torch.Tensor):
        return {"type": type(y).__name__}
    flat = y.detach().reshape(-1, y.shape[-1])
    return {"type": "Tensor", "shape": tuple(y.shape), "attached": y.grad_fn is not None,
            "rows": flat[rows].clone()}


def ch14_state(model: nn.Module, kind: type) -> dict:
    """The state a model is in: its training flag, the force of every ``kind`` module in modules() order, and
    whether every parameter's .grad is None."""
    forces = []
    for m in model.modules():
        if isinstance(m, kind):
            f = getattr(m, "force", "missing")
            forces.append(f if f is None or isinstance(f, bool) else repr(f)[:30])
    return {"training": bool(model.training), "forces": forces,
            "grads_none": all(p.grad is None for _, p in _true_named_parameters(model))}


def ch14_train(module: nn.Module, mode: bool) -> None:
    """``nn.Module.train(module, mode)``."""
    nn.Module.train(module, mode)


def ch14_set_forces(model: nn.Module, kind: type, forces: dict) -> None:
    """Sets ``force`` of the i-th ``kind`` module of ``model`` (modules() order) to ``forces[i]``."""
    found = [m for m in model.modules() if isinstance(m, kind)]
    for i, value in forces.items():
        setattr(found[i], "force", value)
