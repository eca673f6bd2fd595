"""Second correct answers for ch09_mixed_precision, written from the released notebook alone: the scale kept as a float32-rounded Python float with a per-optimizer phase record, and a step that branches once on the scaler."""

SECOND = {
    ("ch09_mixed_precision", "GradScaler"): '''
import math

import torch


class GradScaler:
    """Dynamic loss scaling, following torch.amp.GradScaler's scale trajectory."""

    _READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"

    @staticmethod
    def _as_float32(value: float) -> float:
        """``value`` rounded to the nearest float32 (inf when it is beyond float32's range)."""
        return torch.tensor(value, dtype=torch.float64).to(torch.float32).item()

    def __init__(self, init_scale: float = 65536.0, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        def number(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        if not number(init_scale) or init_scale <= 0:
            raise ValueError(f"init_scale must be a positive float, got {init_scale!r}")
        start = self._as_float32(float(init_scale))
        if not (math.isfinite(start) and start > 0):
            raise ValueError(f"init_scale {init_scale!r} is not a positive float32 number")
        if not number(growth_factor) or growth_factor <= 1:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
        if not number(backoff_factor) or not 0 < backoff_factor < 1:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor!r}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"growth_interval must be a positive int, got {growth_interval!r}")
        self._value = start  # S, always a float32 number
        self._growth = float(growth_factor)
        self._backoff = float(backoff_factor)
        self._interval = growth_interval
        self._clean_run = 0  # consecutive steps without inf/NaN
        self._phases = {}  # id(optimizer) -> {"phase": ..., "overflow": bool}

    def _scale_tensor(self, device) -> torch.Tensor:
        return torch.tensor(self._value, dtype=torch.float32, device=device)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * S``, with loss's dtype and device."""
        return loss * self._scale_tensor(loss.device)

    def _record(self, optimizer):
        return self._phases.setdefault(id(optimizer), {"phase": self._READY, "overflow": False})

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide every gradient by S in place (multiplying by float32(1/S)); note any inf/NaN."""
        record = self._record(optimizer)
        if record["phase"] == self._UNSCALED:
            raise RuntimeError("unscale_() was already called for this optimizer since the last update()")
        if record["phase"] == self._STEPPED:
            raise RuntimeError("unscale_() was called after step() for this optimizer")
        inverse = self._as_float32(1.0 / self._value)
        overflow = False
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    grad = param.grad
                    if grad is None:
                        continue
                    if not bool(torch.isfinite(grad).all()):  # judged before dividing
                        overflow = True
                    grad.mul_(torch.tensor(inverse, dtype=torch.float32, device=grad.device))
        record["overflow"] = overflow
        record["phase"] = self._UNSCALED

    def step(self, optimizer: torch.optim.Optimizer, *args, **kwargs):
        """Unscale if not done yet, then optimizer.step(...) unless a gradient was inf/NaN."""
        record = self._record(optimizer)
        if record["phase"] == self._STEPPED:
            raise RuntimeError("step() was already called for this optimizer since the last update()")
        if record["phase"] == self._READY:
            self.unscale_(optimizer)
        outcome = None
        if not record["overflow"]:
            outcome = optimizer.step(*args, **kwargs)
        record["phase"] = self._STEPPED
        return outcome

    def update(self) -> None:
        """Back off after an overflow, grow after growth_interval clean steps (never to inf)."""
        seen = [r for r in self._phases.values() if r["phase"] != self._READY]
        if not seen:
            raise RuntimeError("update() needs a step() or unscale_() since the last update()")
        if any(r["overflow"] for r in seen):
            self._value = self._as_float32(self._value * self._backoff)
            self._clean_run = 0
        else:
            self._clean_run += 1
            if self._clean_run == self._interval:
                grown = self._as_float32(self._value * self._growth)
                if math.isfinite(grown):
                    self._value = grown
                self._clean_run = 0
        self._phases = {}

    def get_scale(self) -> float:
        """The current scale S, as a Python float."""
        return float(self._value)
''',
    ("ch09_mixed_precision", "mixed_precision_step"): '''
import torch


def mixed_precision_step(model, optimizer, scaler, inputs, targets, loss_fn, dtype):
    """One AMP training step; returns the unscaled loss as a Python float."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    return float(loss.detach().float().item())
''',
}
