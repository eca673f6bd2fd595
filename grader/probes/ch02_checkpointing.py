"""Probes of chapter 2 (checkpointing): a traced forward + backward that shows recomputation."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from coursekit.measure import flop_counter, saved_tensors
from grader.sandbox.trusted import in_process


@in_process(explains=("activation_bytes", "saved_shapes", "forward_flops", "backward_flops"), restricts=("forward_calls", "backward_calls"))
def ch02_run_and_trace(fn: Callable, module: nn.Module, x: torch.Tensor, grad_out: torch.Tensor, *extra,
                       seed: int = 0, x_requires_grad: bool = True) -> dict:
    """Run ``fn(module, x, *extra)`` and back-propagate ``grad_out``; report outputs, gradients,
    the activation bytes saved during the forward call, forward and backward FLOPs, and which direct
    children of ``module`` (or ``module`` itself if it has none) were called, in order, during the
    forward call and during backward (recomputation shows up there).

    The global RNG is seeded with ``seed`` just before the call. Tensors in ``extra`` keep their
    ``requires_grad``; their gradients come back under "extra_grads". "threads" is torch's intra-op
    thread count at the start (a reference run on as many threads splits its products the same way).
    """
    threads = torch.get_num_threads()
    x = x.detach().clone().requires_grad_(x_requires_grad)
    extra = tuple(e.detach().clone().requires_grad_(e.requires_grad) if isinstance(e, torch.Tensor) else e
                  for e in extra)
    module.zero_grad(set_to_none=True)
    watched = dict(module.named_children()) or {"": module}
    calls: dict[str, list[str]] = {"forward": [], "backward": []}
    phase = ["forward"]
    handles = [m.register_forward_hook(lambda _m, _i, _o, name=name: calls[phase[0]].append(name))
               for name, m in watched.items()]
    try:
        torch.manual_seed(seed)
        with saved_tensors(module) as rec, flop_counter() as fwd:
            y = fn(module, x, *extra)
        phase[0] = "backward"
        if not isinstance(y, torch.Tensor) or y.grad_fn is None:  # what the forward call did, nothing more
            return {"attached": False, "y": y.detach().clone() if isinstance(y, torch.Tensor) else None,
                    "activation_bytes": rec.activation_bytes, "forward_flops": fwd.get_total_flops(),
                    "forward_calls": calls["forward"], "threads": threads}
        with flop_counter() as bwd:
            y.backward(grad_out)
    finally:
        for h in handles:
            h.remove()
    return {
        "attached": True,
        "y": y.detach().clone(),
        "dx": None if x.grad is None else x.grad.clone(),
        "extra_grads": [e.grad.clone() if isinstance(e, torch.Tensor) and e.grad is not None else None
                        for e in extra],
        "grads": {n: None if p.grad is None else p.grad.detach().clone() for n, p in module.named_parameters()},
        "activation_bytes": rec.activation_bytes,
        "saved_shapes": [list(s.shape) for s in rec.tensors if not s.is_state],
        "forward_flops": fwd.get_total_flops(),
        "backward_flops": bwd.get_total_flops(),
        "forward_calls": calls["forward"],
        "backward_calls": calls["backward"],
        "threads": threads,
    }


def _ch02_tanh_scaled(x: torch.Tensor, scale: float) -> torch.Tensor:
    """A callable that is no nn.Module and has no parameters, called with a plain float."""
    return torch.tanh(x) * scale + x


def ch02_run_callable(fn: Callable, x: torch.Tensor, scale: float, grad_out: torch.Tensor) -> dict:
    """Run ``fn(f, x, scale)`` with ``f(x, scale) = tanh(x) * scale + x``, a plain function, and back-propagate
    ``grad_out``; report the output and x's gradient, or the exception raised (its type and message)."""
    x = x.detach().clone().requires_grad_(True)
    try:
        y = fn(_ch02_tanh_scaled, x, scale)
        if not isinstance(y, torch.Tensor) or y.grad_fn is None:
            return {"attached": False}
        y.backward(grad_out)
    except Exception as e:  # noqa: BLE001 - reporting what was raised is the point
        return {"error": f"{type(e).__name__}: {e}"}
    return {"attached": True, "y": y.detach().clone(), "dx": None if x.grad is None else x.grad.clone()}
