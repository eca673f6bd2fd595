"""Probes of chapter 6 (sparse back-propagation): a sparse linear layer's forward and backward, the backward
alone and the course's dense products (whose CPU time a hidden test reads from outside the process), and
what the replacement of a model's layers returns."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from coursekit.measure import flop_counter
from grader.probes.shared import _true_named_modules, _true_named_parameters
from grader.sandbox.trusted import in_process


@in_process(explains=("backward_flops",))
def ch06_linear_run(fn: Callable, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    grad_out: torch.Tensor, k: int, unified: bool = False, x_requires_grad: bool = True,
                    free_weight: bool = False, w_requires_grad: bool = True, free_input: bool = False) -> dict:
    """Run ``y = fn(x, weight, bias, k, unified=unified)`` on leaf copies (bias requires grad, x and the
    weight as asked), then back-propagate ``grad_out``. With ``free_weight`` (``free_input``) the weight's
    (x's) storage is released (resized to 0 bytes) between forward and backward, so a backward that reads
    it raises.

    Reports what came back ("type", "attached", "y"), which inputs the forward changed ("changed": names whose
    storage or values differ after it), what backward raised ("error": class names and
    message, or None), the gradients ("dx", "dW", "db"; None where none arrived) and the backward
    FLOPs (for feedback only)."""
    x = x.detach().clone().requires_grad_(x_requires_grad)
    w = weight.detach().clone().requires_grad_(w_requires_grad)
    b = None if bias is None else bias.detach().clone().requires_grad_(True)
    inputs = {"x": x, "weight": w, "bias": b}
    kept = {name: (t.data_ptr(), t.detach().clone()) for name, t in inputs.items() if t is not None}
    y = fn(x, w, b, k, unified=unified)
    # The inputs are left as they were: the same storage holding the same values (bit for bit, NaN included).
    changed = [name for name, (ptr, before) in kept.items()
               if inputs[name].data_ptr() != ptr or not torch.equal(_ch06_bits(inputs[name]), _ch06_bits(before))]
    if not isinstance(y, torch.Tensor):
        return {"type": type(y).__name__, "attached": False, "y": None, "changed": changed}
    out = {"type": "Tensor", "attached": y.grad_fn is not None, "y": y.detach().clone(), "changed": changed}
    if not out["attached"]:
        return out
    if free_weight:
        w.untyped_storage().resize_(0)
    if free_input:
        x.untyped_storage().resize_(0)
    try:
        with flop_counter() as bwd:
            y.backward(grad_out)
    except Exception as e:  # noqa: BLE001 - reporting what was raised is the point
        out["error"] = {"types": [c.__name__ for c in type(e).__mro__], "message": str(e)[:300]}
        return out
    grad = (lambda t: None if t is None or t.grad is None else t.grad.detach().clone())
    out.update(error=None, dx=grad(x), dW=grad(w), db=grad(b), backward_flops=bwd.get_total_flops())
    return out


def _ch06_bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, so that equal means bit for bit (NaN equal to the same NaN)."""
    return t.detach().contiguous().view(torch.uint8)


def _ch06_plain(value):
    return value if isinstance(value, (bool, int, float, str)) or value is None else repr(value)[:100]


def ch06_replace_describe(apply_fn: Callable, model: nn.Module, k: int, unified: bool | None = None) -> dict:
    """Call ``apply_fn(model, k)`` (``unified=`` only when given); describe what came back: every module
    (name, class name, the name it had before if it is an original module, the names before the call of
    the Parameters it holds as ``weight`` and ``bias``, its ``k`` and ``unified`` attributes when it
    has them, its training flag and settings (``extra_repr``)), and the parameters (name after, name before or
    None if new; values; requires_grad), in order."""
    names = {id(p): n for n, p in _true_named_parameters(model)}
    originals = {id(m): n for n, m in _true_named_modules(model)}
    out = apply_fn(model, k) if unified is None else apply_fn(model, k, unified=unified)
    if not isinstance(out, nn.Module):
        return {"returned": type(out).__name__}
    modules = []
    for name, m in _true_named_modules(out):  # what calling the model uses, not what it lists
        held = {}
        for attr in ("weight", "bias"):
            t = getattr(m, attr, None)
            held[attr] = names.get(id(t), "a new tensor") if isinstance(t, torch.Tensor) else None
        modules.append({"name": name, "class": type(m).__name__, "original": originals.get(id(m)), **held,
                        "k": _ch06_plain(getattr(m, "k", None)), "unified": _ch06_plain(getattr(m, "unified", None)),
                        "training": bool(m.training), "settings": str(type(m).extra_repr(m))[:300]})
    return {"returned": "the same model" if out is model else type(out).__name__, "modules": modules,
            "params": [[n, names.get(id(p))] for n, p in _true_named_parameters(out)],
            "values": {n: p.detach().clone() for n, p in _true_named_parameters(out)},
            "requires_grad": {n: bool(p.requires_grad) for n, p in _true_named_parameters(out)}}


def ch06_output_layer_run(apply_fn: Callable, model: nn.Module, k: int, unified: bool, h: torch.Tensor,
                          grad_out: torch.Tensor) -> dict:
    """Call ``apply_fn(model, k, unified=unified)``, find the module of the result that holds the original
    output layer's (the last ``nn.Linear``'s) weight as its ``weight``, run it alone on a leaf copy of ``h``
    and back-propagate ``grad_out``; report its class, output and the gradients of h, weight and bias."""
    last = [m for _, m in _true_named_modules(model) if isinstance(m, nn.Linear)][-1]
    weight, bias = last.weight, last.bias
    out = apply_fn(model, k, unified=unified)
    if not isinstance(out, nn.Module):
        return {"found": False, "returned": type(out).__name__}
    holders = [m for _, m in _true_named_modules(out) if getattr(m, "weight", None) is weight]
    if not holders:
        return {"found": False, "returned": "a module without the output layer's weight"}
    layer = holders[-1]
    nn.Module.zero_grad(out, set_to_none=True)
    h = h.detach().clone().requires_grad_(True)
    y = layer(h)
    y.backward(grad_out)
    grad = (lambda t: None if t is None or t.grad is None else t.grad.detach().clone())
    return {"found": True, "class": type(layer).__name__, "y": y.detach().clone(), "dh": grad(h),
            "dW": grad(weight), "db": grad(bias)}


def ch06_dense_backward(x: torch.Tensor, weight: torch.Tensor, grad_out: torch.Tensor) -> None:
    """The course's own dense backward of ``y = x Wᵀ + b`` for the output gradient ``grad_out``: the full
    products ``g W`` and ``gᵀ x`` and ``Σ g``, what ``nn.Linear``'s backward computes. A hidden test reads
    its CPU time from outside the process: the cost that meProp's compacted products must stay far below. It runs
    on one thread (the worker's setting), whatever the student's code set: more threads on the worker's one core
    would only add CPU time to the baseline."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = grad_out.detach()
        torch.mm(g, weight.detach())
        torch.mm(g.t(), x.detach())
        g.sum(0)
    finally:
        torch.set_num_threads(before)


def ch06_backward_rows(y, grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       x_rows: torch.Tensor, w_rows: torch.Tensor) -> dict:
    """Back-propagate ``grad_out`` from ``y`` (torch's own ``backward``), then report rows ``x_rows`` of
    ``x.grad``, rows ``w_rows`` of ``weight.grad`` and the whole ``bias.grad`` (None where no gradient
    arrived); "type" is what ``y`` is, "error" what backward raised. A hidden test reads the CPU time of
    this request from outside the process; the rows it gathers are the values it checks on the same call. Like
    :func:`ch06_dense_backward`, it starts on one thread (the worker's setting; an instructor's kernel may use
    more), so that the two are timed alike."""
    if not isinstance(y, torch.Tensor) or y.grad_fn is None:
        return {"type": type(y).__name__, "attached": isinstance(y, torch.Tensor)}
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.autograd.backward(y, grad_out)
    except Exception as e:  # noqa: BLE001 - reporting what was raised is the point
        return {"type": "Tensor", "attached": True, "error": {"types": [c.__name__ for c in type(e).__mro__],
                                                               "message": str(e)[:300]}}
    finally:
        torch.set_num_threads(before)
    rows = (lambda t, i: None if t is None or t.grad is None else t.grad.detach().index_select(0, i).clone())
    return {"type": "Tensor", "attached": True, "error": None, "dx": rows(x, x_rows), "dW": rows(weight, w_rows),
            "db": None if bias is None or bias.grad is None else bias.grad.detach().clone()}
