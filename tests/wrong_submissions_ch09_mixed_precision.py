"""Plausible wrong answers for chapter 9, one per exercise: each must lose points when autograded."""

WRONG = {
    ("ch09_mixed_precision", "GradScaler"): '''
import torch

class GradScaler:
    """Wrong: step() always unscales, even after an explicit unscale_ (gradients divided by S twice)."""
    def __init__(self, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.s, self.up, self.down, self.every = float(init_scale), growth_factor, backoff_factor, growth_interval
        self.count, self.found, self.done = 0, False, False

    def scale(self, loss):
        return loss * self.s

    def unscale_(self, optimizer):
        if self.done:
            raise RuntimeError("unscale_ twice")
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self.found |= not bool(torch.isfinite(p.grad).all())
                    p.grad.div_(self.s)
        self.done = True

    def step(self, optimizer):
        self.done = False
        self.unscale_(optimizer)
        if not self.found:
            optimizer.step()

    def update(self):
        if self.found:
            self.s *= self.down
            self.count = 0
        else:
            self.count += 1
            if self.count == self.every:
                self.s *= self.up
                self.count = 0
        self.found, self.done = False, False

    def get_scale(self):
        return self.s
''',
    ("ch09_mixed_precision", "mixed_precision_step"): '''
import torch

def mixed_precision_step(model, optimizer, scaler, inputs, targets, loss_fn, dtype):
    """Wrong: converts the model to half precision instead of using autocast (no float32 master weights)."""
    optimizer.zero_grad()
    model.to(dtype)
    loss = loss_fn(model(inputs.to(dtype)).float(), targets)
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return loss.item()
''',
}
