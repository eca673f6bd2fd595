"""The hidden tests of chapter 9 accept correct implementations and reject plausible wrong ones.

The implementations here are written independently of solutions/ch09_mixed_precision.py (a Python-float
scale, division instead of a reciprocal, flags instead of stages), so that a bug shared by the solution
and its hidden tests cannot hide. The last tests run the same checks through the sandbox.
"""
from __future__ import annotations

import pytest
import torch

from grader.api import LocalNamespace, checks_for

from wrong_submissions_ch09_mixed_precision import WRONG
from sandbox_checks import sandbox_tests

CHAPTER = "ch09_mixed_precision"
CHECKS = checks_for(CHAPTER)
GRADE_IDS = ["test_GradScaler", "test_mixed_precision_step"]


# --- GradScaler: one family, correct with the defaults; each flag is one plausible mistake -----------
def make_scaler(no_skip=False, zero_instead=False, grow_late=False, grow_early=False, keep_count_on_overflow=False,
                keep_count_after_growth=False, unscale_in_step_always=False, second_unscale_ok=False,
                inf_only=False, update_in_step=False, scale_to_float32=False, scale_detached=False,
                crash_on_missing_grad=False):
    class Scaler:
        def __init__(self, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
            self.s, self.up, self.down, self.every = float(init_scale), growth_factor, backoff_factor, growth_interval
            self.clean = 1 if grow_early else 0
            self.unscaled, self.stepped, self.bad = set(), set(), None

        def scale(self, loss):
            if scale_detached:
                return (loss * self.s).detach()
            return loss.float() * self.s if scale_to_float32 else loss * self.s

        def unscale_(self, opt):
            if id(opt) in self.unscaled and not second_unscale_ok:
                raise RuntimeError("unscale_ called twice before update")
            grads = [p.grad for g in opt.param_groups for p in g["params"]
                     if p.grad is not None or crash_on_missing_grad]
            if crash_on_missing_grad:
                flat = torch.cat([g.flatten() for g in grads])
            else:
                flat = torch.cat([g.flatten() for g in grads]) if grads else torch.zeros(0)
            bad = bool(torch.isinf(flat).any()) if inf_only else bool((~torch.isfinite(flat)).any())
            self.bad = bool(self.bad) or bad
            with torch.no_grad():
                for g in grads:
                    g.div_(self.s)
            self.unscaled.add(id(opt))

        def step(self, opt):
            if id(opt) not in self.unscaled or unscale_in_step_always:
                self.unscaled.discard(id(opt))
                self.unscale_(opt)
            self.stepped.add(id(opt))
            if self.bad and zero_instead:
                opt.zero_grad(set_to_none=False)
                out = opt.step()
            elif self.bad and not no_skip:
                out = None
            else:
                out = opt.step()
            if update_in_step:
                self._update()
            return out

        def _update(self):
            if self.bad:
                self.s *= self.down
                if not keep_count_on_overflow:
                    self.clean = 0
            else:
                self.clean += 1
                if (self.clean > self.every) if grow_late else (self.clean >= self.every):
                    self.s *= self.up
                    if not keep_count_after_growth:
                        self.clean = 0

        def update(self):
            if not update_in_step:
                self._update()
            self.unscaled, self.stepped, self.bad = set(), set(), None

        def get_scale(self):
            return self.s

    return Scaler


# --- mixed_precision_step: the same way ------------------------------------------------------------
def make_step(no_autocast=False, half_model=False, return_tensor=False, return_scaled=False, no_zero_grad=False,
              bypass_scaler_step=False, update_twice=False, no_update=False, backward_unscaled=False,
              always_bf16=False, loss_outside=False):
    def mixed_precision_step(model, optimizer, scaler, inputs, targets, loss_fn, dtype):
        if not no_zero_grad:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None
        if half_model:
            model.to(torch.bfloat16)  # bf16 so that torch's scaler accepts the gradients
        ctx = torch.autocast(inputs.device.type, dtype=torch.bfloat16 if always_bf16 else dtype,
                             enabled=not no_autocast)
        with ctx:
            out = model(inputs)
            if not loss_outside:
                loss = loss_fn(out, targets)
        if loss_outside:
            loss = loss_fn(out, targets)
        if scaler is None:
            loss.backward()
            optimizer.step()
            scaled = loss
        else:
            scaled = scaler.scale(loss)
            (loss if backward_unscaled else scaled).backward()
            if bypass_scaler_step:
                scaler.unscale_(optimizer)
                optimizer.step()
            else:
                scaler.step(optimizer)
            for _ in range(0 if no_update else 2 if update_twice else 1):
                scaler.update()
        result = scaled if return_scaled else loss
        return result.detach() if return_tensor else float(result.detach())

    return mixed_precision_step


def namespace(**overrides) -> LocalNamespace:
    ns = {"GradScaler": make_scaler(), "mixed_precision_step": make_step()}
    ns.update(overrides)
    return LocalNamespace(ns)


# --- tests -----------------------------------------------------------------------------------------
def test_every_grade_id_has_a_check():
    assert sorted(CHECKS) == sorted(GRADE_IDS)


def test_correct_implementation_passes():
    ns = namespace()
    for grade_id in GRADE_IDS:
        CHECKS[grade_id](ns)


def test_torch_grad_scaler_passes():
    """torch.amp.GradScaler itself (on the CPU) is a correct GradScaler."""
    def torch_scaler(**kwargs):
        return torch.amp.GradScaler("cpu", **kwargs)
    CHECKS["test_GradScaler"](namespace(GradScaler=torch_scaler))


@pytest.mark.parametrize("flags, message", [
    (dict(no_skip=True), "must be skipped"),
    (dict(zero_instead=True), "must be skipped"),
    (dict(grow_late=True), "reaches growth_interval"),
    (dict(grow_early=True), "reaches growth_interval"),
    (dict(keep_count_on_overflow=True), "reset the count"),
    (dict(keep_count_after_growth=True), "reaches growth_interval"),
    (dict(unscale_in_step_always=True), "must not unscale again"),
    (dict(second_unscale_ok=True), "raise RuntimeError"),
    (dict(inf_only=True), "NaN all count"),
    (dict(update_in_step=True), "step\\(\\) does not change the scale"),
    (dict(scale_to_float32=True), "keep the dtype of the loss"),
    (dict(scale_detached=True), "attached to the autograd graph"),
])
def test_grad_scaler_rejects(flags, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_GradScaler"](namespace(GradScaler=make_scaler(**flags)))


def test_grad_scaler_rejects_crash_on_missing_grad():
    with pytest.raises(Exception):  # the student's own error (a None gradient), reported as such at autograde
        CHECKS["test_GradScaler"](namespace(GradScaler=make_scaler(crash_on_missing_grad=True)))


@pytest.mark.parametrize("flags, message", [
    (dict(no_autocast=True), "without autocast"),
    (dict(always_bf16=True), "autocast ran with dtype"),
    (dict(return_tensor=True), "Python float"),
    (dict(return_scaled=True), "before scaling"),
    (dict(no_zero_grad=True), "zero the gradients"),
    (dict(bypass_scaler_step=True), "calls on the scaler"),
    (dict(update_twice=True), "calls on the scaler|No inf checks"),
    (dict(no_update=True), "calls on the scaler"),
    (dict(backward_unscaled=True), "scaler.scale\\(loss\\)"),
    (dict(loss_outside=True), "outside autocast"),
])
def test_mixed_precision_step_rejects(flags, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_mixed_precision_step"](namespace(mixed_precision_step=make_step(**flags)))


def test_mixed_precision_step_rejects_half_model():
    """model.to(bfloat16): no float32 master weights (LayerNorm then refuses mixed dtypes under autocast)."""
    with pytest.raises(Exception):
        CHECKS["test_mixed_precision_step"](namespace(mixed_precision_step=make_step(half_model=True)))


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(CHAPTER, WRONG)
