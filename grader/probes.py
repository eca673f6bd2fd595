"""Trusted helpers that a hidden test may run inside the student's process.

They only gather data (shapes, flags, measurements, exception names); all judging
happens in the judge. Each must be a top-level function of this module: the sandbox
resolves ``nb.apply(fn, ...)`` by name here and nowhere else. Keep this module free of
reference solutions: the student's process can read it.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from coursekit.measure import flop_counter, measure, saved_tensors


def type_names(obj) -> list[str]:
    """Qualified names of the object's class and its bases (for isinstance checks)."""
    return [f"{c.__module__}.{c.__qualname__}" for c in type(obj).__mro__]


def raised(fn: Callable, *args, **kwargs) -> list[str] | None:
    """Call ``fn``; return the class names of the exception it raised (MRO), or None."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - reporting what was raised is the point
        return [c.__name__ for c in type(e).__mro__]
    return None


def param_table(module: nn.Module) -> dict[str, dict]:
    """{qualified name: {"shape", "requires_grad", "value", "grad"}} for every parameter."""
    return {
        name: {"shape": list(p.shape), "requires_grad": bool(p.requires_grad),
               "value": p.detach().clone(), "grad": None if p.grad is None else p.grad.detach().clone()}
        for name, p in module.named_parameters()
    }


def tensor_states(tensors: list) -> list[dict]:
    """{"shape", "dtype", "requires_grad", "value", "grad"} of each given tensor object, in order.

    Checks pass tensors they sent themselves (``nb.put((model, list(model.parameters())))``, one
    message), so what is read is the judge's own tensor, not what a module's methods report."""
    return [{"shape": list(t.shape), "dtype": str(t.dtype), "requires_grad": bool(t.requires_grad),
             "value": t.detach().clone(), "grad": None if t.grad is None else t.grad.detach().clone()}
            for t in tensors]


def module_table(module: nn.Module) -> dict[str, list[str]]:
    """{qualified name: class MRO names} for every submodule ("" is the module itself)."""
    return {name: type_names(m) for name, m in module.named_modules()}


def forward_backward(module: Callable, x: torch.Tensor, grad_out: torch.Tensor) -> dict:
    """Run ``module(x)`` and back-propagate ``grad_out``; return outputs and gradients."""
    x = x.detach().clone().requires_grad_(True)
    y = module(x)
    y.backward(grad_out)
    grads = {}
    if isinstance(module, nn.Module):
        grads = {n: None if p.grad is None else p.grad.detach().clone() for n, p in module.named_parameters()}
    return {"y": y.detach().clone(), "dx": None if x.grad is None else x.grad.clone(), "grads": grads}


def measure_forward_backward(module: nn.Module, x: torch.Tensor, grad_out: torch.Tensor) -> dict:
    """Saved bytes and FLOPs of one forward + backward of ``module`` on ``x``."""
    m = measure(lambda: module(x), module, grad=grad_out)
    return {"activation_bytes": m.activation_bytes, "saved_bytes": m.saved_bytes,
            "forward_flops": m.forward_flops, "backward_flops": m.backward_flops}


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


class _ch00_Unrunnable:
    """A module with shapes and no data that refuses to run, move, materialise or take new tensors."""

    def forward(self, *args, **kwargs):
        raise RuntimeError("this model cannot be run: predict from its layers' shapes")

    def _apply(self, fn, recurse=True):  # .to, .to_empty, .float, .cpu, ... all go through _apply
        raise RuntimeError("this model cannot be moved or materialised: predict from its layers' shapes")

    def __setattr__(self, name, value):
        if isinstance(value, torch.Tensor) and vars(self).get("_ch00_sealed"):
            raise RuntimeError(f"this model's {name} cannot be replaced: predict from its layers' shapes")
        super().__setattr__(name, value)

    def seal(self):
        object.__setattr__(self, "_ch00_sealed", True)
        return self


class ch00_meta:
    """Linear, ReLU and Sequential on the meta device that cannot be run (see ``_ch00_Unrunnable``);
    ``isinstance`` and the class names are those of ``torch.nn``."""

    class Linear(_ch00_Unrunnable, nn.Linear):
        def __init__(self, in_features: int, out_features: int, bias: bool = True):
            super().__init__(in_features, out_features, bias=bias, device="meta")
            self.seal()

    class ReLU(_ch00_Unrunnable, nn.ReLU):
        def __init__(self):
            super().__init__()
            self.seal()

    class Sequential(_ch00_Unrunnable, nn.Sequential):
        def __init__(self, *modules: nn.Module):
            super().__init__(*modules)
            self.seal()


def raised_message(fn: Callable, *args, **kwargs) -> dict | None:
    """Call ``fn``; None if it returned, else the exception's class names (MRO) and message (chapters 0, 1)."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - reporting what was raised is the point
        return {"types": [c.__name__ for c in type(e).__mro__], "message": str(e)[:500]}
    return None


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


class ch03_MicroBatchModel(nn.Module):
    """Wraps a model and adds ``pos[i]`` to the i-th sample of every forward call: a call on more than
    ``len(pos)`` samples raises, and the gradient of ``pos`` shows which samples went in together."""

    def __init__(self, model: nn.Module, rows: int, features: int, seed: int):
        super().__init__()
        self.model = model
        g = torch.Generator().manual_seed(seed)
        self.pos = nn.Parameter(0.5 * torch.randn(rows, features, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, rows = x.shape[0], self.pos.shape[0]
        if n > rows:
            raise ValueError(f"the model was called on {n} samples at once; it takes at most {rows} per call")
        return self.model(x + self.pos[:n])


def ch03_describe(value) -> dict:
    """What a function returned: its type and, for a tensor, shape, dtype and autograd flags."""
    if isinstance(value, torch.Tensor):
        return {"type": "Tensor", "shape": list(value.shape), "dtype": str(value.dtype),
                "requires_grad": bool(value.requires_grad), "has_grad_fn": value.grad_fn is not None,
                "value": value.detach().clone()}
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return {"type": type(value).__name__, "shape": None, "dtype": None, "requires_grad": None,
            "has_grad_fn": None, "value": number}


class ch03_Batches:
    """A re-iterable of batches with neither ``len`` nor indexing, like a ``DataLoader``: every ``iter()``
    starts a new epoch from the first batch."""

    def __init__(self, batches: list):
        self.batches = list(batches)

    def __iter__(self):
        return iter(list(self.batches))


# --- ch04_partial_training -----------------------------------------------------------------------
def ch04_error(fn: Callable, *args, **kwargs) -> dict | None:
    """Call ``fn``; None if it returned, else the exception's class names (MRO) and message."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - reporting what was raised is the point
        return {"types": [c.__name__ for c in type(e).__mro__], "message": str(e)[:500]}
    return None


def ch04_saved_run(fn: Callable, x: torch.Tensor, grad_out: torch.Tensor, overwrite: bool = False) -> dict:
    """Run ``y = fn(x)`` on a leaf copy of ``x`` that requires grad, recording every storage autograd
    saves; then back-propagate ``grad_out``. With ``overwrite``, the values of ``x`` and ``y`` are
    overwritten in place (``x`` negated, ``y`` zeroed, through ``.data`` so autograd does not notice)
    between forward and backward: only what was saved for backward can still inform the gradient.

    Reports the output (before any overwrite), whether it is attached to the graph, the input
    gradient, the activation bytes and, for each saved storage, its shape, dtype and bytes."""
    x = x.detach().clone().requires_grad_(True)
    with saved_tensors() as rec:
        y = fn(x)
    if not isinstance(y, torch.Tensor):
        return {"attached": False, "y": None}
    out = {"attached": y.grad_fn is not None, "y": y.detach().clone(), "dtype": str(y.dtype),
           "activation_bytes": rec.activation_bytes,
           "saved": [{"shape": list(s.shape), "dtype": str(s.dtype), "nbytes": s.nbytes,
                      "floating": s.dtype.is_floating_point}
                     for s in rec.tensors]}
    if not out["attached"]:
        return out
    if overwrite:
        x.data.neg_()
        y.data.zero_()
    y.backward(grad_out)
    out["dx"] = None if x.grad is None else x.grad.detach().clone()
    return out


# --- ch05_tinytl ---------------------------------------------------------------------------------
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


def ch08_traced_call(fn: Callable, *args) -> dict:
    """Call ``fn(*args)``; return its result and the dtypes of every tensor the aten ops inside produced."""
    from torch.utils._python_dispatch import TorchDispatchMode

    produced: set[str] = set()

    class _Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (list, tuple)) else (out,):
                if isinstance(t, torch.Tensor):
                    produced.add(str(t.dtype))
            return out

    with _Recorder():
        result = fn(*args)
    return {"result": result, "dtypes": sorted(produced)}


def ch08_tensor_inventory(module: nn.Module) -> list[dict]:
    """Every tensor a module holds, each storage once: parameters, buffers, and plain attributes of
    every submodule (also inside lists, tuples and dicts)."""
    found: list[dict] = []
    seen: set = set()

    def add(where: str, t: torch.Tensor) -> None:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel(), str(t.dtype))
        if key in seen:
            return
        seen.add(key)
        found.append({"where": where, "dtype": str(t.dtype), "numel": int(t.numel()),
                      "nbytes": int(t.numel() * t.element_size()), "floating": bool(t.is_floating_point()),
                      "requires_grad": bool(t.requires_grad)})

    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        add(name, t)
    for prefix, sub in module.named_modules():
        for attr, value in vars(sub).items():
            where = f"{prefix}.{attr}" if prefix else attr
            if isinstance(value, dict):
                items = [(f"{where}[{k!r}]", v) for k, v in value.items()]
            elif isinstance(value, (list, tuple)):
                items = [(f"{where}[{i}]", v) for i, v in enumerate(value)]
            else:
                items = [(where, value)]
            for label, item in items:
                if isinstance(item, torch.Tensor):
                    add(label, item)
    return found


# --- ch09_mixed_precision -----------------------------------------------------------------------
def ch09_optimizer_state(optimizer, params: list | None = None) -> dict:
    """The optimizer's per-parameter state as plain data: {"p<i>": {key: value}} for every parameter
    that has state, ``i`` counting ``params`` (the tensors the check sent with the optimizer, so that a
    rewritten ``param_groups`` changes nothing) or else the parameters of all param groups in order."""
    if params is None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
    out = {}
    for i, p in enumerate(params):
        state = dict.get(optimizer.state, p, {})
        if state:
            out[f"p{i}"] = {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    return out


def ch09_scale_of(scaler) -> float:
    """The scale of a ``torch.amp.GradScaler``, read with torch's own method (not the instance's)."""
    return float(torch.amp.GradScaler.get_scale(scaler))


def _ch09_grads(params) -> list:
    return [None if p.grad is None else p.grad.detach().clone() for p in params]


def ch09_drive_scaler(scaler, model: nn.Module, optimizer, x: torch.Tensor, y: torch.Tensor, plan: list,
                      params: list | None = None) -> list:
    """Drive ``scaler`` through ``len(plan)`` training steps (MSE loss of ``model(x)`` against ``y``).

    Each plan item is a dict: "poison" (None, or [param index, flat index, value] written into that
    gradient after the scaled backward: an injected overflow; a parameter the loss does not reach first
    gets a zero gradient), "unscale" (call ``unscale_`` before ``step``), "twice" (then call ``unscale_``
    again and record what it raised), "new_scale" (call ``update(new_scale)``: a reference made to
    follow another scaler's scales). Returns one record
    per step: gradients before and after unscaling, the scale at each stage, parameters and
    optimizer state after the step. ``params`` are the tensors the check sent with the optimizer (read
    instead of ``optimizer.param_groups``). A last record, {"final_raw_grads"}, holds the gradients of
    one more ``scale(loss).backward()``: the scale the last ``update()`` left, seen in values.
    """
    if params is None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
    records = []
    for item in plan:
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if item.get("poison") is not None:
            i, j, value = item["poison"]
            with torch.no_grad():
                if params[i].grad is None:
                    params[i].grad = torch.zeros_like(params[i])
                params[i].grad.view(-1)[j] = value
        scale = scaler.get_scale()
        rec = {"raw_grads": _ch09_grads(params), "scale_type": type(scale).__name__, "scale_used": float(scale)}
        if item.get("unscale"):
            scaler.unscale_(optimizer)
            rec["unscaled_grads"] = _ch09_grads(params)
            if item.get("twice"):
                rec["second_unscale"] = raised(scaler.unscale_, optimizer)
        ret = scaler.step(optimizer)
        rec["step_return"] = ret if ret is None or isinstance(ret, (int, float)) else type(ret).__name__
        rec["grads_after_step"] = _ch09_grads(params)
        rec["scale_after_step"] = float(scaler.get_scale())
        if item.get("new_scale") is None:
            scaler.update()
        else:
            scaler.update(item["new_scale"])
        rec["scale"] = float(scaler.get_scale())
        rec["params"] = [p.detach().clone() for p in params]
        rec["state"] = ch09_optimizer_state(optimizer, params)
        records.append(rec)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
    records.append({"final_raw_grads": _ch09_grads(params)})
    return records


def ch09_scaler_calls(scaler, model: nn.Module, optimizer, x: torch.Tensor, y: torch.Tensor, calls: list) -> list:
    """Make ``calls`` on ``scaler`` in order, around one training setup (MSE loss of ``model(x)`` against
    ``y``); for each, {"raised": exception class names (MRO) or None, "returned": a number, None or the
    type name}. A call that raises does not stop the next ones. Calls: "backward" (zero the gradients,
    ``scale(loss).backward()``), "poison" (an inf written into the first gradient), "unscale_", "step",
    "step_closure" (``step(optimizer, closure)``, the closure returning 0.25), "update"."""
    def closure():
        return 0.25

    out = []
    for name in calls:
        returned = None
        try:
            if name == "backward":
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
            elif name == "poison":
                with torch.no_grad():
                    next(p for p in model.parameters() if p.grad is not None).grad.view(-1)[0] = float("inf")
            elif name == "unscale_":
                returned = scaler.unscale_(optimizer)
            elif name == "step":
                returned = scaler.step(optimizer)
            elif name == "step_closure":
                returned = scaler.step(optimizer, closure)
            else:
                returned = scaler.update()
        except Exception as e:  # noqa: BLE001 - reporting what was raised is the point
            out.append({"raised": [c.__name__ for c in type(e).__mro__], "returned": None})
            continue
        plain = returned is None or isinstance(returned, (bool, int, float))
        out.append({"raised": None, "returned": returned if plain else type(returned).__name__})
    return out


def _ch09_canary(z: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear`` of ``z`` repeated against weights K(1 + 2^-k), -K: under autocast the weights round to
    K first, so the result shows in values which precision the matmul ran in."""
    return nn.functional.linear(z.expand(*z.shape[:-1], weight.shape[1]), weight)


class ch09_AutocastRecorder(nn.Module):
    """Wraps a model; for every forward call records whether autocast was on for the input's device,
    its dtype, and the dtypes of the input, the output and the wrapped model's parameters (feedback).

    What decides is in the values: the output gets a canary term c·x[:, :1], c = 1.125 in float32,
    1 under float16 autocast and 0 under bfloat16 autocast (weights 512(1 + 2^-9) and 512(1 + 2^-12)
    round to 512 in bfloat16, the second also in float16)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.calls: list[dict] = []
        k = 512.0
        self.register_buffer("canary", torch.tensor([[k * (1 + 2**-9), -k, k * (1 + 2**-12), -k]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        enabled = bool(torch.is_autocast_enabled(device))
        out = self.model(x) + _ch09_canary(x[..., :1], self.canary)
        self.calls.append({"autocast": enabled, "dtype": str(torch.get_autocast_dtype(device)) if enabled else None,
                           "input": str(x.dtype), "output": str(out.dtype),
                           "params": sorted({str(p.dtype) for p in self.model.parameters()})})
        return out


class ch09_ScalerRecorder:
    """A ``torch.amp.GradScaler("cpu", **kwargs)`` that records the names of the methods called on it."""

    def __init__(self, **kwargs):
        self.scaler = torch.amp.GradScaler("cpu", **kwargs)
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("scaler", "calls"):
            raise AttributeError(name)
        self.calls.append(name)
        return getattr(self.scaler, name)

    def scale(self, outputs):
        self.calls.append("scale")
        return self.scaler.scale(outputs)

    def unscale_(self, optimizer) -> None:
        self.calls.append("unscale_")
        self.scaler.unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):
        self.calls.append("step")
        return self.scaler.step(optimizer, *args, **kwargs)

    def update(self, new_scale=None) -> None:
        self.calls.append("update")
        self.scaler.update(new_scale)

    def get_scale(self) -> float:
        return self.scaler.get_scale()


class ch09_LossRecorder(nn.Module):
    """``loss_fn(output, target) * factor``, recording for every call whether autocast was on for the
    output's device (feedback; a factor of inf injects an overflow).

    What decides is in the values: the loss gets s·mean(output), s = 1 in float32 and 0 under float16 or
    bfloat16 autocast (weights 4096(1 + 2^-12), -4096), so a loss computed outside autocast has another
    value and other gradients."""

    def __init__(self, loss_fn: nn.Module, factor: float = 1.0):
        super().__init__()
        self.loss_fn = loss_fn
        self.factor = factor
        self.calls: list[dict] = []
        self.register_buffer("canary", torch.tensor([[4096.0 * (1 + 2**-12), -4096.0]]))

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self.calls.append({"autocast": bool(torch.is_autocast_enabled(output.device.type))})
        s = _ch09_canary(torch.ones(1, 1, device=output.device), self.canary)[0, 0]
        loss = self.loss_fn(output, target) + s * output.float().mean()
        return loss * self.factor if self.factor != 1.0 else loss


def ch10_trace(fn: Callable, *args, **kwargs) -> dict:
    """Call ``fn(*args, **kwargs)`` under a dispatch mode; report what it returned ("result"), the
    names of the aten operators it ran ("ops", sorted) and the largest tensor any operator produced,
    measured by the elements of its storage (views of a smaller tensor count as that tensor):
    "max_elements" and "max_shape"."""
    return _ch10_trace(fn, args, kwargs)


def _ch10_trace(fn: Callable, args: tuple, kwargs: dict, ignore: frozenset = frozenset()) -> dict:
    """ch10_trace; tensors on a storage whose address is in ``ignore`` (the probe's own) are not counted."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    seen = {"ops": set(), "max_elements": 0, "max_shape": []}

    class _Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            seen["ops"].add(str(func.overloadpacket.__name__))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in ignore:
                    elements = t.untyped_storage().nbytes() // max(t.element_size(), 1)
                    if elements > seen["max_elements"]:
                        seen["max_elements"], seen["max_shape"] = elements, list(t.shape)
            return out

    with _Record():
        result = fn(*args, **kwargs)
    detach = (lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t)
    result = tuple(detach(r) for r in result) if isinstance(result, (tuple, list)) else detach(result)
    return {"result": result, "ops": sorted(seen["ops"]), "max_elements": seen["max_elements"],
            "max_shape": seen["max_shape"]}


def ch10_autograd_run(fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
                      *extra, backward: bool = True) -> dict:
    """Run ``o = fn(q, k, v, *extra)`` (e.g. ``FlashAttention.apply``) on leaf copies of q, k, v
    recording what autograd saves, then back-propagate ``grad_out`` (unless ``backward`` is False:
    "grads" is then None). Reports the output, the three input gradients, whether the output is
    attached, the activation bytes saved during the forward call and the shape, dtype and bytes of
    each saved storage."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    with saved_tensors() as rec:
        o = fn(q, k, v, *extra)
    if not isinstance(o, torch.Tensor) or o.grad_fn is None:
        return {"attached": False, "o": o.detach().clone() if isinstance(o, torch.Tensor) else None}
    if backward:
        o.backward(grad_out)
    return {"attached": True, "o": o.detach().clone(),
            "grads": [None if t.grad is None else t.grad.clone() for t in (q, k, v)] if backward else None,
            "activation_bytes": rec.activation_bytes,
            "saved": [{"shape": list(s.shape), "dtype": str(s.dtype), "nbytes": s.nbytes}
                      for s in rec.tensors if not s.is_state]}


# Triton's interpreter as this module first saw it: in the sandbox that is the fork server, before any
# student code ran (its preload imports triton with TRITON_INTERPRET=1). ch10_triton_run wraps the
# interpreter's memory accesses and relies on the rest of it; the integrity check of the sandbox does not
# watch triton, so the probe compares against this snapshot itself, before, during and after the call.
_CH10_INTERPRETER: dict = {}


def _ch10_interpreter_state() -> dict | None:
    """Triton's interpreter module, its C module of memory accesses, and every function, class and
    descriptor bound in them, in the classes the interpreter defines and on its builder instance."""
    import sys

    interp = sys.modules.get("triton.runtime.interpreter")
    if interp is None:
        return None
    namespace = vars(interp)
    owners = [("triton.runtime.interpreter", interp)]
    owners += [(f"triton.runtime.interpreter.{name}", value) for name, value in list(namespace.items())
               if isinstance(value, type) and getattr(value, "__module__", None) == interp.__name__]
    for name in ("interpreter_builder", "_interpreter"):
        if namespace.get(name) is not None:
            owners.append((f"triton.runtime.interpreter.{name}", namespace[name]))
    objects = {}
    for label, owner in owners:
        try:
            items = list(vars(owner).items())
        except TypeError:
            continue
        for attr, value in items:
            if callable(value) or hasattr(type(value), "__get__"):
                objects[(label, attr)] = value
    return {"interp": interp, "c": namespace.get("_interpreter"), "objects": objects}


def _ch10_changed(snap: dict) -> str | None:
    """The first watched name of Triton's interpreter that differs from ``snap`` (None if none)."""
    now = _ch10_interpreter_state()
    if now is None or now["interp"] is not snap["interp"]:
        return "sys.modules['triton.runtime.interpreter']"
    if now["c"] is not snap["c"]:
        return "triton.runtime.interpreter._interpreter"
    old, new = snap["objects"], now["objects"]
    for key, value in old.items():
        if new.get(key, _CH10_INTERPRETER) is not value:  # the dict itself: a sentinel no entry can be
            return f"{key[0]}.{key[1]}"
    for key in new.keys() - old.keys():
        return f"{key[0]}.{key[1]}"
    return None


_CH10_INTERPRETER.update(_ch10_interpreter_state() or {})


def ch10_triton_run(fn: Callable, *args, spaced: bool = False) -> dict:
    """``ch10_trace(fn, *args)`` with every memory access of Triton's interpreter checked.

    Each load, store and atomic a kernel makes through the interpreter is checked lane by lane: every
    lane its mask leaves on must address an element of the tensor argument of that launch it belongs to
    (the one its lowest lane addresses: a block starts inside its tensor). Lanes outside are recorded
    and switched off (a load gives ``other``, 0 when none, a store writes nothing), so the call stays
    safe and its result does not depend on whatever lies past a tensor. With ``spaced``, the tensors of
    ``args`` are first copied into one buffer with a gap before and after each, so that no access past
    the end of one lands inside the next. Adds to ch10_trace's report "bounds": "launches"
    (kernel launches), "accesses", "outside" (lanes outside, over all accesses), "violations" (the first
    few: op, kernel argument, lanes outside of lanes on, elements past the end or before the start,
    launch) and "tampered" (the first name of Triton's interpreter found replaced, or None; when it is
    found before the call, ``fn`` is not called and "result" is None).
    """
    import sys

    import numpy as np

    if not _CH10_INTERPRETER:
        _CH10_INTERPRETER.update(_ch10_interpreter_state() or {})
    snap = dict(_CH10_INTERPRETER)
    report = {"launches": 0, "accesses": 0, "outside": 0, "violations": [], "tampered": None}
    if not snap:  # no interpreter: a kernel can only run compiled, on a GPU
        traced = ch10_trace(fn, *args)
        traced["bounds"] = report
        return traced
    report["tampered"] = _ch10_changed(snap)
    if report["tampered"] is not None:  # nothing runs: the accesses could not be checked, nor kept in bounds
        return {"result": None, "ops": [], "max_elements": 0, "max_shape": [], "bounds": report}
    interp, c_mod, objects = snap["interp"], snap["c"], snap["objects"]
    executor, builder_class = objects[("triton.runtime.interpreter", "GridExecutor")], \
        objects[("triton.runtime.interpreter", "InterpreterBuilder")]
    init_args = objects[("triton.runtime.interpreter.GridExecutor", "_init_args_hst")]
    restore_args = objects[("triton.runtime.interpreter.GridExecutor", "_restore_args_dev")]
    original = {name: objects[("triton.runtime.interpreter._interpreter", name)]
                for name in ("load", "store", "atomic_rmw", "atomic_cas")}
    methods = {name: objects[("triton.runtime.interpreter.InterpreterBuilder", name)]
               for name in ("create_load", "create_store", "create_masked_load", "create_masked_store",
                            "create_atomic_rmw", "create_atomic_cas")}
    builder = vars(interp)["interpreter_builder"]
    spans: list = []  # (kernel argument, first byte, end byte) of every tensor passed to the launch running

    def collect(name, value):
        if isinstance(value, tuple):
            for i, item in enumerate(value):
                collect(f"{name}[{i}]", item)
            return
        value = value if isinstance(value, torch.Tensor) else getattr(value, "base", None)
        if isinstance(value, torch.Tensor):  # the bytes from its first element to its last
            last = sum((size - 1) * stride for size, stride in zip(value.shape, value.stride()))
            extent = 0 if value.numel() == 0 else (last + 1) * value.element_size()
            spans.append((name, value.data_ptr(), value.data_ptr() + extent))

    def init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        spans.clear()
        for name, value in zip(self.arg_names, args_hst):
            collect(name, value)
        for name, value in kwargs_hst.items():
            collect(name, value)
        report["launches"] += 1
        return args_hst, kwargs_hst

    def restore_args_dev(self, *rest):
        """The interpreter copies each argument's storage back onto itself after a launch (byte views of
        the whole storage): its own bookkeeping, kept out of the operator trace."""
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            return restore_args(self, *rest)

    wrappers: dict = {}

    def intact() -> bool:
        cls, c = vars(builder_class), vars(c_mod)
        return (all(cls.get(n) is m for n, m in methods.items()) and all(c.get(n) is wrappers[n] for n in wrappers)
                and not any(n in vars(builder) for n in methods)
                and vars(executor).get("_init_args_hst") is init_args_hst
                and vars(executor).get("_restore_args_dev") is restore_args_dev
                and vars(interp).get("_interpreter") is c_mod and sys.modules.get(interp.__name__) is interp)

    def check(op, ptrs, mask, itemsize):
        """The mask with the lanes outside every tensor argument switched off (``mask`` itself if none)."""
        report["accesses"] += 1
        if report["tampered"] is None and not intact():
            report["tampered"] = _ch10_changed(snap) or "the interpreter's memory accesses (during the call)"
        p = np.asarray(ptrs)
        on = np.ones(p.shape, dtype=bool) if mask is None else np.broadcast_to(np.asarray(mask, dtype=bool), p.shape)
        addresses = p[on].astype(np.uint64)
        if addresses.size == 0:
            return mask
        low, high = int(addresses.min()), int(addresses.max()) + itemsize
        if any(start <= low and high <= end for _, start, end in spans):
            return mask
        # The tensor the access belongs to: the one its lowest lane addresses (a block starts inside its
        # tensor and runs past the end), else the one its highest lane addresses.
        best = next((span for span in spans if span[1] <= low < span[2]), None) or next(
            (span for span in spans if span[1] < high <= span[2]), None)
        inside = np.zeros(p.shape, dtype=bool) if best is None else (p >= best[1]) & (p + itemsize <= best[2])
        outside = on & ~inside
        report["outside"] += int(outside.sum())
        if len(report["violations"]) < 8:
            report["violations"].append({
                "op": op, "argument": None if best is None else best[0], "lanes": int(outside.sum()),
                "of": int(on.sum()), "itemsize": itemsize,
                "past_end": 0 if best is None else max(0, high - best[2]) // itemsize,
                "before_start": 0 if best is None else max(0, best[1] - low) // itemsize,
                "launch": report["launches"]})
        return np.ascontiguousarray(on & inside)

    def load(ptrs, mask, other, dtype):
        return original["load"](ptrs, check("load", ptrs, mask, np.dtype(dtype).itemsize), other, dtype)

    def store(ptrs, values, mask):
        return original["store"](ptrs, values, check("store", ptrs, mask, np.asarray(values).itemsize))

    def atomic_rmw(op, ptrs, values, mask, sem):
        return original["atomic_rmw"](op, ptrs, values, check("atomic", ptrs, mask, np.asarray(values).itemsize),
                                      sem)

    def atomic_cas(ptrs, expected, values, sem):
        before = report["outside"]
        check("atomic", ptrs, None, np.asarray(values).itemsize)
        if report["outside"] != before:  # no mask to switch lanes off with: do not touch the memory
            raise RuntimeError("tl.atomic_cas outside the tensors passed to the kernel")
        return original["atomic_cas"](ptrs, expected, values, sem)

    wrappers.update(load=load, store=store, atomic_rmw=atomic_rmw, atomic_cas=atomic_cas)
    ignore = frozenset()
    if spaced:  # [gap | t0 | gap | t1 | ... | gap], each gap far longer than a block of rows
        gap, tensors = 8192, [a for a in args if isinstance(a, torch.Tensor) and a.dtype == torch.float32]
        buffer = torch.zeros(gap + sum(t.numel() + gap for t in tensors))
        placed, at = {}, gap
        for t in tensors:
            placed[id(t)] = buffer[at:at + t.numel()].view(t.shape).copy_(t)
            at += t.numel() + gap
        args = tuple(placed.get(id(a), a) for a in args)
        ignore = frozenset({buffer.untyped_storage().data_ptr()})  # the inputs' views: not the student's tensors
    try:
        for name, wrapper in wrappers.items():
            setattr(c_mod, name, wrapper)
        executor._init_args_hst, executor._restore_args_dev = init_args_hst, restore_args_dev
        traced = _ch10_trace(fn, args, {}, ignore)
    finally:
        executor._init_args_hst, executor._restore_args_dev = init_args, restore_args
        for name, function in original.items():
            setattr(c_mod, name, function)
    if report["tampered"] is None:
        report["tampered"] = _ch10_changed(snap)
    traced["bounds"] = report
    return traced


# --- ch06_sparse_backprop ----------------------------------------------------------------------
def ch06_linear_run(fn: Callable, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    grad_out: torch.Tensor, k: int, unified: bool = False, x_requires_grad: bool = True,
                    free_weight: bool = False) -> dict:
    """Run ``y = fn(x, weight, bias, k, unified=unified)`` on leaf copies (weight and bias require grad,
    x as asked), then back-propagate ``grad_out``. With ``free_weight`` the weight's storage is released
    (resized to 0 bytes) between forward and backward, so a backward that reads the weight raises.

    Reports what came back ("type", "attached", "y"), what backward raised ("error": class names and
    message, or None), the gradients ("dx", "dW", "db"; None where none arrived) and the backward
    FLOPs (for feedback only)."""
    x = x.detach().clone().requires_grad_(x_requires_grad)
    w = weight.detach().clone().requires_grad_(True)
    b = None if bias is None else bias.detach().clone().requires_grad_(True)
    y = fn(x, w, b, k, unified=unified)
    if not isinstance(y, torch.Tensor):
        return {"type": type(y).__name__, "attached": False, "y": None}
    out = {"type": "Tensor", "attached": y.grad_fn is not None, "y": y.detach().clone()}
    if not out["attached"]:
        return out
    if free_weight:
        w.untyped_storage().resize_(0)
    try:
        with flop_counter() as bwd:
            y.backward(grad_out)
    except Exception as e:  # noqa: BLE001 - reporting what was raised is the point
        out["error"] = {"types": [c.__name__ for c in type(e).__mro__], "message": str(e)[:300]}
        return out
    grad = (lambda t: None if t is None or t.grad is None else t.grad.detach().clone())
    out.update(error=None, dx=grad(x), dW=grad(w), db=grad(b), backward_flops=bwd.get_total_flops())
    return out


def _ch06_plain(value):
    return value if isinstance(value, (bool, int, float, str)) or value is None else repr(value)[:100]


def ch06_replace_describe(apply_fn: Callable, model: nn.Module, k: int, unified: bool | None = None) -> dict:
    """Call ``apply_fn(model, k)`` (``unified=`` only when given); describe what came back: every module
    (name, class name, the name it had before if it is an original module, the names before the call of
    the Parameters it holds as ``weight`` and ``bias``, and its ``k`` and ``unified`` attributes when it
    has them), and the parameters (name after, name before or None if new), in order."""
    names = {id(p): n for n, p in model.named_parameters()}
    originals = {id(m): n for n, m in model.named_modules()}
    out = apply_fn(model, k) if unified is None else apply_fn(model, k, unified=unified)
    if not isinstance(out, nn.Module):
        return {"returned": type(out).__name__}
    modules = []
    for name, m in out.named_modules():
        held = {}
        for attr in ("weight", "bias"):
            t = getattr(m, attr, None)
            held[attr] = names.get(id(t), "a new tensor") if isinstance(t, torch.Tensor) else None
        modules.append({"name": name, "class": type(m).__name__, "original": originals.get(id(m)), **held,
                        "k": _ch06_plain(getattr(m, "k", None)), "unified": _ch06_plain(getattr(m, "unified", None))})
    return {"returned": "the same model" if out is model else type(out).__name__, "modules": modules,
            "params": [[n, names.get(id(p))] for n, p in out.named_parameters()]}


def ch06_output_layer_run(apply_fn: Callable, model: nn.Module, k: int, unified: bool, h: torch.Tensor,
                          grad_out: torch.Tensor) -> dict:
    """Call ``apply_fn(model, k, unified=unified)``, find the module of the result that holds the original
    output layer's (the last ``nn.Linear``'s) weight as its ``weight``, run it alone on a leaf copy of ``h``
    and back-propagate ``grad_out``; report its class, output and the gradients of h, weight and bias."""
    last = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    weight, bias = last.weight, last.bias
    out = apply_fn(model, k, unified=unified)
    if not isinstance(out, nn.Module):
        return {"found": False, "returned": type(out).__name__}
    holders = [m for m in out.modules() if getattr(m, "weight", None) is weight]
    if not holders:
        return {"found": False, "returned": "a module without the output layer's weight"}
    layer = holders[-1]
    out.zero_grad(set_to_none=True)
    h = h.detach().clone().requires_grad_(True)
    y = layer(h)
    y.backward(grad_out)
    grad = (lambda t: None if t is None or t.grad is None else t.grad.detach().clone())
    return {"found": True, "class": type(layer).__name__, "y": y.detach().clone(), "dh": grad(h),
            "dW": grad(weight), "db": grad(bias)}


# --- ch07_local_loss -----------------------------------------------------------------------------
def ch07_run(fn: Callable, tensors: list, *rest, grad_out: torch.Tensor | None = None, modules: tuple = ()) -> dict:
    """Call ``fn(*tensors, *rest)`` with fresh copies of ``tensors`` (floating ones requiring grad),
    back-propagate ``grad_out`` (ones if None) and return the output, the inputs' gradients and the
    gradients of ``modules``' parameters (zeroed before the call)."""
    xs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
    for m in modules:
        m.zero_grad(set_to_none=True)
    out = fn(*xs, *rest)
    if not isinstance(out, torch.Tensor):
        return {"type": type(out).__name__}
    attached = out.grad_fn is not None
    if attached:
        out.backward(torch.ones_like(out) if grad_out is None else grad_out)
    grad = (lambda t: None if t.grad is None else t.grad.detach().clone())
    return {"type": "Tensor", "value": out.detach().clone(), "dtype": str(out.dtype), "shape": list(out.shape),
            "attached": attached, "grads": [grad(x) for x in xs],
            "param_grads": [{n: grad(p) for n, p in m.named_parameters()} for m in modules]}


class ch07_Block(nn.Module):
    """Linear -> BatchNorm1d -> ReLU -> dropout(p); ``forward(x)`` returns ``(h, out)``. The dropout
    mask comes from a generator seeded with the block's seed and its call count, so that the same
    block called the same number of times draws the same masks anywhere."""

    def __init__(self, d_in: int, d_out: int, p: float = 0.0, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.linear = nn.Linear(d_in, d_out)
        self.norm = nn.BatchNorm1d(d_out)
        self.p, self.seed, self.calls = p, seed, 0

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.norm(self.linear(x)))
        self.calls += 1
        if self.p == 0:
            return h, h
        gen = torch.Generator().manual_seed(self.seed * 7919 + self.calls)
        keep = (torch.rand(h.shape, generator=gen) >= self.p).to(h.dtype)
        return h, h * keep / (1 - self.p)


class ch07_Head(nn.Module):
    """A stand-in local loss: ``scale`` × cross-entropy of a Linear(d, classes) on ``h``."""

    def __init__(self, d: int, classes: int, scale: float = 1.0, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.linear = nn.Linear(d, classes)
        self.scale = scale

    def forward(self, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.scale * nn.functional.cross_entropy(self.linear(h), y)


def ch07_describe(value) -> dict:
    """The type of ``value`` and, for a list or tuple, each item's type and its value if a plain number."""
    items = None
    if isinstance(value, (list, tuple)):
        items = [{"type": type(v).__name__,
                  "value": v if isinstance(v, (int, float)) and not isinstance(v, bool) else None} for v in value]
    return {"type": type(value).__name__, "items": items}


def ch07_exact(value, depth: int = 0):
    """Nested lists/tuples of numbers as plain data: containers as {"type", "items"}, numbers as
    exact "numerator/denominator" strings (``fractions.Fraction`` of the value), others as their type."""
    import math
    from fractions import Fraction

    if depth > 4:
        return {"type": "too deep"}
    if isinstance(value, (list, tuple)):
        return {"type": type(value).__name__, "items": [ch07_exact(v, depth + 1) for v in value]}
    if isinstance(value, (int, float, Fraction)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            return {"type": "float", "value": repr(value)}
        q = Fraction(value)
        return {"type": type(value).__name__, "value": f"{q.numerator}/{q.denominator}"}
    return {"type": type(value).__name__}
