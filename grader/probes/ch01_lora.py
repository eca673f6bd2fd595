"""Probes of chapter 1 (LoRA): SGD steps driven outside the module, on every tensor that would train."""
from __future__ import annotations

from typing import Callable

import torch


def _graph_leaves(t: torch.Tensor) -> list[torch.Tensor]:
    """The leaf tensors that require grad in ``t``'s autograd graph, each once."""
    leaves, seen, stack = {}, set(), [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)  # an AccumulateGrad node: a leaf
        if isinstance(variable, torch.Tensor):
            leaves[id(variable)] = variable
        stack.extend(f for f, _ in node.next_functions)
    return list(leaves.values())


def ch01_sgd_steps(module: Callable, named: dict, x: torch.Tensor, grad_out: torch.Tensor, steps: int,
                   lr: float, weight_decay: float, graph_leaves: bool = True) -> dict:
    """``steps`` SGD steps driven here, not by the module's own methods: ``y = module(x)``, back-propagate
    ``grad_out``, then update every tensor that would train: each leaf requiring grad in ``y``'s graph and
    each tensor of ``named`` ({name: tensor}) that requires grad or received a ``.grad``, by
    ``p -= lr * (grad + weight_decay * p)`` (so a tensor whose gradient is zeroed still moves).
    With ``graph_leaves=False`` only the tensors of ``named`` are updated (a run with a frozen rest).

    Reports the output of each step ("outputs") and, per step, the names of the tensors updated
    ("updated", sorted; "?" for a tensor not in ``named``), or "error" when the output is not a tensor."""
    names = {id(t): n for n, t in named.items()}
    outputs, updated = [], []
    for _ in range(steps):
        for t in named.values():
            t.grad = None
        y = module(x)
        if type(y) is not torch.Tensor:
            return {"error": f"the module returned a {type(y).__name__}, not a tensor"}
        leaves = {id(t): t for t in _graph_leaves(y)}
        for t in leaves.values():
            t.grad = None
        if y.requires_grad:
            y.backward(grad_out)
        if not graph_leaves:
            leaves = {}
        leaves.update({id(t): t for t in named.values() if t.requires_grad or t.grad is not None})
        with torch.no_grad():
            for t in leaves.values():
                t -= lr * ((0 if t.grad is None else t.grad) + weight_decay * t)
        outputs.append(y.detach().clone())
        updated.append(sorted(names.get(i, "?") for i in leaves))
    return {"outputs": outputs, "updated": updated}
