"""GradScaler whose overflow check skips the last entry of every gradient, an off-by-one (red team, rt3 07)."""
CHAPTER = "ch09_mixed_precision"
EXERCISE = "GradScaler"
THREAT = "spec_gap"
EXPECT = "loses"
DESCRIPTION = "unscale_ tests p.grad.reshape(-1)[:-1] for inf/NaN, so an overflow in a gradient's last entry is missed: the hand-written sequence writes one in the last entry of a bias, and the wide scenario one exactly in the last entry of a weight (and of the unused parameter for the schedule): the step is taken and the scale does not back off; test_GradScaler (3) is lost, and the cells gated on it"
SOURCE = '''
class GradScaler:
    """Dynamic loss scaling (the same scale trajectory as ``torch.amp.GradScaler``).

    Args:
        init_scale: the first scale S (a positive float).
        growth_factor: S is multiplied by it after ``growth_interval`` clean steps in a row (> 1).
        backoff_factor: S is multiplied by it after a step with an inf/NaN gradient (in (0, 1)).
        growth_interval: number of consecutive clean steps before S grows (a positive int).

    Use per iteration: ``scale(loss).backward()``, optionally ``unscale_(optimizer)``, then
    ``step(optimizer)`` and ``update()``. Keep the state yourself: ``torch.amp.GradScaler`` is the
    reference you are compared with, and wrapping or calling it (or ``torch.cuda.amp.GradScaler``)
    is refused by the grader.

    Graded on: step by step against ``torch.amp.GradScaler("cpu")`` with the same arguments, over a
    hand-written sequence and other sequences of up to 30 steps (SGD with momentum and Adam; growth_interval 1
    to 3, growth_factor 2 and 4, backoff_factor 0.5 and 0.25, init_scale from 512 to 2^127, where the scaled
    loss itself overflows, and 2^126, whose growth would pass float32's largest number), with inf, -inf or
    NaN written into one gradient after the backward, ``unscale_`` called before ``step`` at random, a
    parameter whose .grad stays None and a frozen one in the optimizer. Besides a small model, a wide one whose
    sizes are drawn at grading time: Linear(d, h), Tanh, Linear(h, o) with d and h from 32 to 96 and o from 32
    to 64 (weights of 1024 to 9216 entries) and an unused parameter of 1024 to 4096 entries, with four
    overflows: one written in the last entry of a gradient, one in the first entry of a gradient, the others at
    flat indices drawn over the whole gradient. The check must cover every entry, the first and last included.
    Values (torch's scaler then follows your scales): the gradients after the backward, after ``unscale_`` and
    after ``step``; what ``step`` returns (None when skipped); the parameters and the optimizer state after
    each step; the gradients of one more ``scale(loss).backward()`` after the last ``update``; and ``scale``
    given float32, float16 and bfloat16 tensors of shape (2, 3) that require grad (backward through the
    result must give them S).
    Schedule: the scale before ``step``, between ``step`` and ``update`` and after ``update``. Interface: the
    ValueErrors of ``__init__``, the RuntimeErrors the methods' docstrings state, no error in a valid use
    (``update()`` after ``unscale_`` alone included), ``step(optimizer, closure)`` returning what
    ``optimizer.step(closure)`` returned, ``get_scale()`` a Python float. The ``grad_scaler`` modules and
    ``torch.cpu.amp.GradScaler`` are refused too. Each graded cell may use 60 s and 4 GiB.
    """

    def __init__(self, init_scale: float = 65536.0, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        """The defaults are ``torch.amp.GradScaler``'s. Raises ValueError for an argument out of the
        ranges above (growth_interval must be an int)."""
        ### BEGIN SOLUTION
        if not init_scale > 0:
            raise ValueError(f"init_scale must be positive, got {init_scale}")
        if not growth_factor > 1.0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor}")
        if not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"growth_interval must be a positive integer, got {growth_interval!r}")
        self._scale = torch.tensor(float(init_scale), dtype=torch.float32)  # float32, as torch keeps it
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._growth_tracker = 0  # consecutive clean steps since the last growth or overflow
        self._stage = {}  # id(optimizer) -> "unscaled" | "stepped" during this iteration
        self._found_inf = {}  # id(optimizer) -> True if one of its gradients was inf/NaN
        ### END SOLUTION

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * S``, with loss's dtype and device."""
        ### BEGIN SOLUTION
        return loss * self._scale.to(loss.device)  # a 0-dim float32 tensor keeps loss's dtype
        ### END SOLUTION

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide every gradient of ``optimizer``'s parameters by S in place and note whether one held
        an inf or NaN. RuntimeError if called twice for this optimizer before ``update()``, or after
        its ``step()``."""
        ### BEGIN SOLUTION
        stage = self._stage.get(id(optimizer))
        if stage == "unscaled":
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update()")
        if stage == "stepped":
            raise RuntimeError("unscale_() is being called after step()")
        inv_scale = self._scale.double().reciprocal().float()
        found_inf = False
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    found_inf |= not bool(torch.isfinite(p.grad.reshape(-1)[:-1]).all())  # catches inf, -inf and NaN
                    p.grad.mul_(inv_scale.to(p.grad.device))
        self._found_inf[id(optimizer)] = found_inf
        self._stage[id(optimizer)] = "unscaled"
        ### END SOLUTION

    def step(self, optimizer: torch.optim.Optimizer, *args, **kwargs):
        """Unscale first if ``unscale_`` was not called; then ``optimizer.step(*args, **kwargs)`` (its
        return value) unless a gradient held an inf or NaN (then None, and the step is skipped).
        RuntimeError if called twice for this optimizer before ``update()``."""
        ### BEGIN SOLUTION
        if self._stage.get(id(optimizer)) == "stepped":
            raise RuntimeError("step() has already been called since the last update()")
        if self._stage.get(id(optimizer)) is None:
            self.unscale_(optimizer)
        retval = None
        if not self._found_inf[id(optimizer)]:
            retval = optimizer.step(*args, **kwargs)
        self._stage[id(optimizer)] = "stepped"
        return retval
        ### END SOLUTION

    def update(self) -> None:
        """End the iteration: S times backoff_factor if any gradient held an inf or NaN, S times
        growth_factor after growth_interval clean steps in a row (never to inf). RuntimeError if no
        ``step()`` or ``unscale_()`` came since the last update."""
        ### BEGIN SOLUTION
        if not self._found_inf:
            raise RuntimeError("update() needs a step() (or unscale_()) on at least one optimizer first")
        if any(self._found_inf.values()):
            self._scale = self._scale * self.backoff_factor
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                grown = self._scale * self.growth_factor
                if torch.isfinite(grown):  # torch never grows the scale to inf
                    self._scale = grown
                self._growth_tracker = 0
        self._stage, self._found_inf = {}, {}
        ### END SOLUTION

    def get_scale(self) -> float:
        """The current scale S, as a Python float."""
        ### BEGIN SOLUTION
        return float(self._scale)
        ### END SOLUTION
'''
