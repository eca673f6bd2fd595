"""Probes of chapter 11 (data parallelism): a loss, parameters and gradients made in the student's
process, a sharded optimizer built and stepped, and what it reports as plain data."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from grader.sandbox.trusted import in_process


class ch11_MSELoss:
    """``loss_fn(model, (x, y))``: the mean squared error of ``model(x)`` against ``y``."""

    def __call__(self, model: nn.Module, batch) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(model(x), y)


def ch11_flat_params(models: list) -> list[torch.Tensor]:
    """Each model's parameters (as its ``parameters()`` lists them), flattened end to end, detached copies."""
    return [torch.cat([p.detach().reshape(-1).clone() for p in nn.Module.parameters(m)]) for m in models]


def ch11_param_flags(models: list) -> list[dict]:
    """Every parameter of every model, in order: whether it requires grad and whether it has a ``.grad``."""
    return [{"requires_grad": bool(torch.Tensor.requires_grad.__get__(p)),
             "has_grad": torch.Tensor.grad.__get__(p) is not None}
            for m in models for p in nn.Module.parameters(m)]


def ch11_number(value) -> dict:
    """A returned number as plain data: its type name and its value (exact string for a Fraction). NumPy's and other
    registered integers and reals come back as ``int`` and ``float`` (a number is graded by its value)."""
    import numbers
    from fractions import Fraction

    if isinstance(value, bool) or not isinstance(value, numbers.Real) or isinstance(value, torch.Tensor):
        return {"type": type(value).__name__, "value": None}
    if type(value) is Fraction:
        return {"type": "Fraction", "value": f"{value.numerator}/{value.denominator}"}
    if isinstance(value, numbers.Integral):
        return {"type": "int", "value": int(value)}
    return {"type": "float", "value": float(value)}


def ch11_make_params(shapes: list, n_ranks: int, seed: int, dtype: torch.dtype = torch.float32,
                     tie: tuple = ()) -> list[list[nn.Parameter]]:
    """``n_ranks`` equal replicas of parameters of these shapes (standard normal from ``seed``), as lists; ``tie``:
    positions of the list that repeat an earlier parameter, ``(position, earlier)`` pairs (tied weights)."""
    out = []
    for _ in range(n_ranks):
        generator = torch.Generator().manual_seed(int(seed))
        params = [nn.Parameter(torch.randn(tuple(s), generator=generator, dtype=dtype)) for s in shapes]
        for position, earlier in tie:
            params.insert(position, params[earlier])
        out.append(params)
    return out


def ch11_set_grads(params: list, seed: int, skip: int | None = None) -> int:
    """Give every parameter of every rank a gradient (standard normal, rank after rank, each distinct tensor once,
    from ``seed``); the distinct parameter at position ``skip`` gets none (``.grad`` None). Returns the bytes made."""
    generator = torch.Generator().manual_seed(int(seed))
    made = 0
    for ps in params:
        for i, p in enumerate(_ch11_distinct(ps)):
            grad = torch.randn(p.shape, generator=generator, dtype=p.dtype)
            p.grad = None if i == skip else grad
            made += 0 if i == skip else p.numel() * p.element_size()
    return made


def ch11_generators(params: list) -> list:
    """Each rank's parameters as a one-pass iterator, as ``model.parameters()`` gives them."""
    return [iter(list(ps)) for ps in params]


def ch11_zero_grad(optimizer, params: list) -> list[list[bool]]:
    """``optimizer.zero_grad()``, then which distinct parameters still have a ``.grad``."""
    optimizer.zero_grad()
    return ch11_grads_left(params)


def _ch11_distinct(params: list) -> list:
    """A rank's parameters, each distinct tensor once (a tied weight listed twice is one parameter)."""
    seen, out = set(), []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def ch11_grads_left(params: list) -> list[list[bool]]:
    """Per rank, per distinct parameter: whether its ``.grad`` is not None."""
    return [[torch.Tensor.grad.__get__(p) is not None for p in _ch11_distinct(ps)] for ps in params]


def ch11_clear_grads(params: list) -> None:
    for ps in params:
        for p in ps:
            p.grad = None


def ch11_build_and_step(cls: Callable, params: list, world, kwargs: dict, grad_seeds: list[int]):
    """Build ``cls(params, world, **kwargs)``; for each seed, give every parameter a gradient from it
    (:func:`ch11_set_grads`) and call ``step()``, noting which gradients are left; then clear the gradients. Returns
    ``(optimizer, grads_left)``. The memory a hidden test reads around this call is what the optimizer keeps."""
    optimizer = cls(params, world, **kwargs)
    left = []
    for seed in grad_seeds:
        ch11_set_grads(params, seed)
        optimizer.step()
        left.append(ch11_grads_left(params))
    ch11_clear_grads(params)
    return optimizer, left


def ch11_views(params: list) -> list:
    """A view of every parameter's storage: held by the judge across a reading, so that the storage the judge made
    and booked stays allocated whatever the code under test does with the parameters' ``.data``."""
    return [[p.detach() for p in ps] for ps in params]


def ch11_flat(params: list, index: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Per rank, its distinct parameters flattened end to end (detached copies); only positions ``index`` if given."""
    out = []
    for ps in params:
        vector = torch.cat([p.detach().reshape(-1) for p in _ch11_distinct(ps)])
        out.append((vector if index is None else vector[index]).clone())
    return out


def ch11_state(optimizer, ranks: list) -> dict:
    """``optimizer.state[r]`` for each rank: ``exp_avg``/``exp_avg_sq`` as detached copies (or their type name),
    ``step`` as a plain number (or its type name), and whether the entry exists."""
    try:
        state = object.__getattribute__(optimizer, "state")
    except AttributeError:
        return {"error": "no attribute 'state'"}
    if not isinstance(state, dict):
        return {"error": f"state is a {type(state).__name__}, expected a dict"}
    out = {}
    for r in ranks:
        entry = dict.get(state, r)
        if not isinstance(entry, dict):
            out[str(r)] = {"type": type(entry).__name__}
            continue
        row = {"type": "dict"}
        for key in ("exp_avg", "exp_avg_sq"):
            value = dict.get(entry, key)
            row[key] = value.detach().clone() if isinstance(value, torch.Tensor) else type(value).__name__
        step = dict.get(entry, "step")
        row["step"] = step if isinstance(step, (int, float)) and not isinstance(step, bool) else (
            float(step) if isinstance(step, torch.Tensor) and step.numel() == 1 else type(step).__name__)
        out[str(r)] = row
    # Every key, a plain int or str by its repr, anything else by its type (nothing of the student's runs here).
    out["keys"] = [repr(k) if type(k) in (int, str) else f"<{type(k).__name__}>" for k in dict.keys(state)]
    return out


def ch11_swap_last(params: list, other: list) -> list:
    """``params`` with its last rank's parameters replaced by ``other``'s first rank's (shapes that differ)."""
    return [*params[:-1], other[0]]


def ch11_bounds(value) -> dict:
    """Returned shard bounds as plain data: the container's type and, per item, its type and (for a list or tuple)
    each entry's type name and value (an integral number as an int, another real number as a float, else None)."""
    import numbers

    def entry(v) -> dict:
        if isinstance(v, numbers.Integral) and not isinstance(v, bool):
            number = int(v)
        elif isinstance(v, numbers.Real) and not isinstance(v, bool):
            number = float(v)
        else:
            number = None
        return {"type": type(v).__name__, "value": number}

    items = None
    if isinstance(value, (list, tuple)):
        items = [{"type": type(b).__name__,
                  "entries": [entry(v) for v in b[:4]] if isinstance(b, (list, tuple)) else None}
                 for b in value[:4096]]
    return {"type": type(value).__name__, "items": items}


@in_process(explains=("repointed",))
def ch11_repointed(params: list, views: list) -> dict:
    """Per rank, whether any parameter no longer uses the storage of its view from :func:`ch11_views` (``.data``
    re-pointed at another tensor instead of updated in place): only to explain a failed memory reading."""
    return {"repointed": [any(p.untyped_storage().data_ptr() != v.untyped_storage().data_ptr() for p, v in zip(ps, vs))
                          for ps, vs in zip(params, views)]}
