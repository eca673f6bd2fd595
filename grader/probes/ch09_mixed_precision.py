"""Probes of chapter 9 (mixed precision): an optimizer's state, a gradient scaler driven step by step,
and recorders of autocast and of the scaler's calls."""
from __future__ import annotations

import torch
from torch import nn

from grader.probes.shared import raised


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
    """A ``torch.amp.GradScaler("cpu", **kwargs)`` that records the names of the methods called on it.

    An ``update()`` with no ``step()`` or ``unscale_()`` since the last one is recorded and not passed on (torch
    would raise an AssertionError): calling the scaler in the wrong number or order costs the scaler cell, which
    reads the recorded calls, and not the values and returns cells."""

    def __init__(self, **kwargs):
        self.scaler = torch.amp.GradScaler("cpu", **kwargs)
        self.calls: list[str] = []
        self.pending = False  # a step() or unscale_() since the last update()

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("scaler", "calls", "pending"):
            raise AttributeError(name)
        self.calls.append(name)
        return getattr(self.scaler, name)

    def scale(self, outputs):
        self.calls.append("scale")
        return self.scaler.scale(outputs)

    def unscale_(self, optimizer) -> None:
        self.calls.append("unscale_")
        self.scaler.unscale_(optimizer)
        self.pending = True

    def step(self, optimizer, *args, **kwargs):
        self.calls.append("step")
        out = self.scaler.step(optimizer, *args, **kwargs)
        self.pending = True
        return out

    def update(self, new_scale=None) -> None:
        self.calls.append("update")
        if self.pending:
            self.scaler.update(new_scale)
            self.pending = False

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
