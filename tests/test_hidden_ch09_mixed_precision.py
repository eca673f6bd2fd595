"""The hidden tests of chapter 9 accept correct implementations and reject plausible wrong ones.

The implementations here are written independently of solutions/ch09_mixed_precision.py (a Python-float
scale, division instead of a reciprocal, flags instead of stages), so that a bug shared by the solution
and its hidden tests cannot hide. The last tests run the same checks through the sandbox.
"""
from __future__ import annotations

import math

import pytest
import torch

from grader.api import LocalNamespace, checks_for

from wrong_submissions_ch09_mixed_precision import WRONG
from sandbox_checks import sandbox_tests
from contract_tables import Clause, contract_tests

CHAPTER = "ch09_mixed_precision"
CHECKS = checks_for(CHAPTER)
SCALER_IDS = ["test_GradScaler", "test_GradScaler_update", "test_GradScaler_interface"]
STEP_IDS = ["test_mixed_precision_step", "test_mixed_precision_step_scaler", "test_mixed_precision_step_returns"]
GRADE_IDS = SCALER_IDS + STEP_IDS


# --- GradScaler: one family, correct with the defaults; each flag is one plausible mistake -----------
def make_scaler(no_skip=False, zero_instead=False, grow_late=False, grow_early=False, keep_count_on_overflow=False,
                keep_count_after_growth=False, unscale_in_step_always=False, second_unscale_ok=False,
                inf_only=False, update_in_step=False, scale_to_float32=False, scale_detached=False,
                crash_on_missing_grad=False, scale_uses_init=False, grow_to_inf=False, no_value_checks=False,
                step_twice_ok=False, update_without_step_ok=False, no_step_return=False, no_step_args=False,
                scale_tensor=False, step_returns_flag=False, check_first=None, check_every=None, skip_end=None,
                skip_above=0, unscale_after_step_ok=False):
    class Scaler:
        def __init__(self, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
            if not no_value_checks:
                if init_scale <= 0 or growth_factor <= 1 or not 0 < backoff_factor < 1:
                    raise ValueError("bad scaling factors")
                if type(growth_interval) is not int or growth_interval <= 0:
                    raise ValueError("growth_interval must be a positive int")
            self.s, self.up, self.down, self.every = float(init_scale), growth_factor, backoff_factor, growth_interval
            self.init = float(init_scale)
            self.clean = 1 if grow_early else 0
            self.unscaled, self.stepped, self.bad = set(), set(), None

        def scale(self, loss):
            s = self.init if scale_uses_init else self.s
            if scale_detached:
                return (loss * s).detach()
            return loss.float() * s if scale_to_float32 else loss * s

        def unscale_(self, opt):
            if id(opt) in self.unscaled and not second_unscale_ok:
                raise RuntimeError("unscale_ called twice before update")
            grads = [p.grad for g in opt.param_groups for p in g["params"]
                     if p.grad is not None or crash_on_missing_grad]
            if crash_on_missing_grad:  # torch.isfinite(None): a TypeError on the parameter without a gradient
                [torch.isfinite(g) for g in grads]
            # a partial overflow check: the first entries of each gradient only, or a strided sample
            seen = [g.flatten()[:check_first] if check_first else g.flatten()[::check_every or 1] for g in grads]
            # an off-by-one: every entry but the last ([:-1]) or the first ([1:]), of gradients over skip_above entries
            ends = {"last": slice(None, -1), "first": slice(1, None)}
            seen = [t[ends[skip_end]] if skip_end and t.numel() > skip_above else t for t in seen]
            flat = torch.cat(seen) if grads else torch.zeros(0)
            bad = bool(torch.isinf(flat).any()) if inf_only else bool((~torch.isfinite(flat)).any())
            self.bad = bool(self.bad) or bad
            with torch.no_grad():
                for g in grads:
                    g.div_(self.s)
            self.unscaled.add(id(opt))

        def _step(self, opt, *args, **kwargs):
            if id(opt) in self.stepped and not step_twice_ok:
                raise RuntimeError("step() called twice before update()")
            if id(opt) not in self.unscaled or unscale_in_step_always:
                self.unscaled.discard(id(opt))
                self.unscale_(opt)
            self.stepped.add(id(opt))
            if self.bad and zero_instead:
                opt.zero_grad(set_to_none=False)
                out = opt.step(*args, **kwargs)
            elif self.bad and not no_skip:
                out = None
            else:
                out = opt.step(*args, **kwargs)
            if unscale_after_step_ok:  # wrong: forgets that this optimizer was unscaled, so unscale_ may follow step
                self.unscaled.discard(id(opt))
            if update_in_step:
                self._update()
            if step_returns_flag:  # "did it step?"
                return not self.bad
            return None if no_step_return else out

        if no_step_args:
            def step(self, opt):
                return self._step(opt)
        else:
            def step(self, opt, *args, **kwargs):
                return self._step(opt, *args, **kwargs)

        def _update(self):
            if self.bad:
                self.s *= self.down
                if not keep_count_on_overflow:
                    self.clean = 0
            else:
                self.clean += 1
                if (self.clean > self.every) if grow_late else (self.clean >= self.every):
                    grown = self.s * self.up
                    # torch keeps the scale in float32 and never grows it to inf there
                    if grow_to_inf or math.isfinite(float(torch.tensor(grown, dtype=torch.float32))):
                        self.s = grown
                    if not keep_count_after_growth:
                        self.clean = 0

        def update(self):
            if self.bad is None and not update_without_step_ok:
                raise RuntimeError("update() needs a step() or unscale_() first")
            if not update_in_step:
                self._update()
            self.unscaled, self.stepped, self.bad = set(), set(), None

        def get_scale(self):
            return torch.tensor(self.s) if scale_tensor else self.s

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


def test_torch_grad_scaler_passes_values_and_schedule():
    """torch.amp.GradScaler itself (on the CPU) has the values and the schedule; its __init__ asserts instead
    of raising ValueError, and its update() without a step() too, as the interface cell notices."""
    def torch_scaler(**kwargs):
        return torch.amp.GradScaler("cpu", **kwargs)
    ns = namespace(GradScaler=torch_scaler)
    for grade_id in ("test_GradScaler", "test_GradScaler_update"):
        CHECKS[grade_id](ns)
    with pytest.raises(AssertionError, match="should raise ValueError"):
        CHECKS["test_GradScaler_interface"](ns)


# (flags of a wrong GradScaler, the cell it fails, what its message says)
WRONG_SCALER_VARIANTS = [
    (dict(no_skip=True), "test_GradScaler", "must be skipped"),
    (dict(zero_instead=True), "test_GradScaler", "must be skipped"),
    (dict(unscale_in_step_always=True), "test_GradScaler", "must not unscale again"),
    (dict(scale_to_float32=True), "test_GradScaler", "keep the dtype of the loss"),
    (dict(scale_detached=True), "test_GradScaler", "attached to the autograd graph"),
    (dict(scale_uses_init=True), "test_GradScaler", "with S the scale get_scale\\(\\) reports"),
    (dict(step_returns_flag=True), "test_GradScaler", "None when the step is skipped"),
    (dict(grow_late=True), "test_GradScaler_update", "should have grown here"),
    (dict(grow_early=True), "test_GradScaler_update", "grew too early"),
    (dict(keep_count_on_overflow=True), "test_GradScaler_update", "reset the count on overflow"),
    (dict(keep_count_after_growth=True), "test_GradScaler_update", "after growing"),
    (dict(inf_only=True), "test_GradScaler_update", "inf, -inf and NaN all count"),
    (dict(update_in_step=True), "test_GradScaler_update", "step\\(\\) does not change the scale"),
    (dict(grow_to_inf=True), "test_GradScaler_update", "never grows to inf"),
    (dict(no_value_checks=True), "test_GradScaler_interface", "should raise ValueError"),
    (dict(second_unscale_ok=True), "test_GradScaler_interface", "a second unscale_"),
    (dict(step_twice_ok=True), "test_GradScaler_interface", "a second step"),
    (dict(update_without_step_ok=True), "test_GradScaler_interface", "update\\(\\) on a fresh scaler"),
    (dict(no_step_return=True), "test_GradScaler_interface", "returned None, expected 0.25"),
    (dict(no_step_args=True), "test_GradScaler_interface", "raised TypeError.*passes the extra arguments"),
    (dict(scale_tensor=True), "test_GradScaler_interface", "expected a Python float"),
]


@pytest.mark.parametrize("flags, grade_id, message", WRONG_SCALER_VARIANTS)
def test_grad_scaler_rejects(flags, grade_id, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS[grade_id](namespace(GradScaler=make_scaler(**flags)))


def test_grad_scaler_rejects_crash_on_missing_grad():
    with pytest.raises(Exception):  # the student's own error (a None gradient), reported as such at autograde
        CHECKS["test_GradScaler"](namespace(GradScaler=make_scaler(crash_on_missing_grad=True)))


@pytest.mark.parametrize("flags, where", [(dict(check_first=128), "wide model"), (dict(check_first=512), "wide model"),
                                          (dict(check_every=4), ""),
                                          (dict(skip_end="last"), "sequence"),
                                          (dict(skip_end="first"), "sequence"),
                                          (dict(skip_end="last", skip_above=128), "wide model"),
                                          (dict(skip_end="first", skip_above=128), "wide model")])
def test_grad_scaler_rejects_partial_overflow_check(flags, where):
    """An overflow check that reads only part of each gradient (its first entries, a strided sample, all but
    its last or its first entry) misses an overflow: the hand-written sequence poisons first and last entries
    of the small model, and the wide scenario puts one overflow exactly in a gradient's last entry, one exactly
    in its first, the others drawn over the whole gradient, so an off-by-one only on large gradients
    (skip_above: the small model's fit below it) and a prefix check are caught there. A step with an inf
    gradient is taken (values) and the scale does not back off (schedule); the interface cell passes."""
    ns = namespace(GradScaler=make_scaler(**flags))
    with pytest.raises(AssertionError, match=f"{where}.*must be skipped.*check whole tensors"):
        CHECKS["test_GradScaler"](ns)
    with pytest.raises(AssertionError, match=f"{where}.*the scale after update\\(\\).*check whole tensors"):
        CHECKS["test_GradScaler_update"](ns)
    CHECKS["test_GradScaler_interface"](ns)


def test_wide_scenario_draws_sizes_and_overflows_over_the_whole_gradient():
    """Sizes within the stated ranges, different from one grading to the next; overflows in the two weights,
    the first exactly in the last entry of its gradient, the second exactly in the first, the others drawn
    (somewhere else at least once in 20 gradings); the same in the unused parameter for the schedule cell."""
    from grader.hidden import ch09_mixed_precision as hidden
    drawn = [hidden._wide_scenario() for _ in range(20)]
    assert len({s["sizes"] for s in drawn}) > 1 and len({s["seed"] for s in drawn}) > 1
    elsewhere = 0
    for s in drawn:
        d, h, o, n_unused = s["sizes"]
        assert 32 <= d <= 96 and 32 <= h <= 96 and 32 <= o <= 64 and 1024 <= n_unused <= 4096
        poisons = [item["poison"] for item in s["plan"] if item["poison"] is not None]
        assert len(poisons) == hidden.WIDE_OVERFLOWS and all(p[0] in (1, 3) for p in poisons)
        assert all(0 <= p[1] < hidden._numel(s["sizes"], p[0]) for p in poisons)
        assert poisons[0][1] == hidden._numel(s["sizes"], poisons[0][0]) - 1 and poisons[1][1] == 0
        elsewhere += sum(0 < p[1] < hidden._numel(s["sizes"], p[0]) - 1 for p in poisons[2:])
        unused = [item["poison"] for item in hidden._poison_unused(s["plan"]) if item["poison"] is not None]
        assert all(p[0] == hidden.UNUSED and 0 <= p[1] < n_unused for p in unused)
        assert unused[0][1] == n_unused - 1 and unused[1][1] == 0
    assert elsewhere > 0


@pytest.mark.parametrize("flags, grade_id", [
    (dict(no_skip=True), "test_GradScaler"),
    (dict(unscale_in_step_always=True), "test_GradScaler"),
    (dict(grow_late=True), "test_GradScaler_update"),
    (dict(keep_count_on_overflow=True), "test_GradScaler_update"),
    (dict(step_twice_ok=True), "test_GradScaler_interface"),
    (dict(no_value_checks=True), "test_GradScaler_interface"),
])
def test_grad_scaler_loses_only_its_property(flags, grade_id):
    """One mistake costs the points of its own cell: the other cells of the exercise pass."""
    ns = namespace(GradScaler=make_scaler(**flags))
    for other in SCALER_IDS:
        if other != grade_id:
            CHECKS[other](ns)


# (flags of a wrong mixed_precision_step, the cell it fails, what its message says)
WRONG_STEP_VARIANTS = [
    (dict(no_autocast=True), "test_mixed_precision_step", "without autocast"),
    (dict(always_bf16=True), "test_mixed_precision_step", "autocast ran with dtype"),
    (dict(no_zero_grad=True), "test_mixed_precision_step", "zero the gradients"),
    (dict(backward_unscaled=True), "test_mixed_precision_step", "scaler.scale\\(loss\\)"),
    (dict(loss_outside=True), "test_mixed_precision_step", "outside autocast"),
    (dict(bypass_scaler_step=True), "test_mixed_precision_step_scaler", "calls on the scaler"),
    (dict(update_twice=True), "test_mixed_precision_step_scaler", "calls on the scaler"),
    (dict(no_update=True), "test_mixed_precision_step_scaler", "calls on the scaler"),
    (dict(return_tensor=True), "test_mixed_precision_step_returns", "Python float"),
    (dict(return_scaled=True), "test_mixed_precision_step_returns", "before scaling"),
]


@pytest.mark.parametrize("flags, grade_id, message", WRONG_STEP_VARIANTS)
def test_mixed_precision_step_rejects(flags, grade_id, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS[grade_id](namespace(mixed_precision_step=make_step(**flags)))


def test_mixed_precision_step_rejects_half_model():
    """model.to(bfloat16): no float32 master weights (LayerNorm then refuses mixed dtypes under autocast)."""
    with pytest.raises(Exception):
        CHECKS["test_mixed_precision_step"](namespace(mixed_precision_step=make_step(half_model=True)))


@pytest.mark.parametrize("flags, grade_id", [
    (dict(no_zero_grad=True), "test_mixed_precision_step"),
    (dict(no_autocast=True), "test_mixed_precision_step"),
    (dict(bypass_scaler_step=True), "test_mixed_precision_step_scaler"),
    (dict(return_scaled=True), "test_mixed_precision_step_returns"),
])
def test_mixed_precision_step_loses_only_its_property(flags, grade_id):
    """One mistake costs the points of its own cell: the other cells of the exercise pass."""
    ns = namespace(mixed_precision_step=make_step(**flags))
    for other in STEP_IDS:
        if other != grade_id:
            CHECKS[other](ns)


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(CHAPTER, WRONG)


# --- the contract, clause by clause (tests/contract_tables.py) -------------------------------------------
VALUES, SCHEDULE, INTERFACE = SCALER_IDS
STEP, STEP_SCALER, STEP_RETURNS = STEP_IDS


def _scaler(says, cells, message, label="", raises="AssertionError", **flags):
    return Clause("GradScaler", says, cells, {"GradScaler": make_scaler(**flags)}, message, label=label, raises=raises)


def _step(says, cells, message, label="", raises="AssertionError", **flags):
    return Clause("mixed_precision_step", says, cells, {"mixed_precision_step": make_step(**flags)}, message,
                  label=label, raises=raises)


CONTRACT = [
    _scaler("calls optimizer.step() only if no gradient was inf/NaN", (VALUES,), "must be skipped", no_skip=True),
    _scaler("optimizer state untouched)", (VALUES,), "must be skipped", zero_instead=True),
    _scaler("unscales if unscale_ was not called yet for this optimizer (never twice!)", (VALUES,),
            "must not unscale again", unscale_in_step_always=True),
    _scaler("a tensor of loss's dtype", (VALUES,), "keep the dtype of the loss", scale_to_float32=True),
    _scaler("still attached to the graph", (VALUES,), "attached to the autograd graph", scale_detached=True),
    _scaler("scale(loss) returns loss * S", (VALUES,), "with S the scale get_scale\\(\\) reports",
            scale_uses_init=True),
    _scaler("it returns what optimizer.step() returned (None when skipped)", (VALUES,), "None when the step is skipped",
            step_returns_flag=True),
    _scaler("(parameters whose .grad is None are skipped)", (VALUES,), "", crash_on_missing_grad=True,
            raises="TypeError"),  # the student's own crash on a missing gradient
    _scaler("The check must cover every entry, the first and last included.", (VALUES,),
            "wide model.*must be skipped.*check whole tensors", label="prefix-check", check_first=128),
    _scaler("The check must cover every entry, the first and last included.", (VALUES,),
            "must be skipped.*check whole tensors", label="strided-check", check_every=4),
    _scaler("The check must cover every entry, the first and last included.", (VALUES,),
            "wide model.*must be skipped.*check whole tensors", label="last-entry-skipped-on-wide",
            skip_end="last", skip_above=128),
    _scaler("The check must cover every entry, the first and last included.", (VALUES,),
            "wide model.*must be skipped.*check whole tensors", label="first-entry-skipped-on-wide",
            skip_end="first", skip_above=128),
    _scaler("growth_interval: number of consecutive clean steps before S grows", (SCHEDULE,),
            "should have grown here", label="grows-late", grow_late=True),
    _scaler("growth_interval: number of consecutive clean steps before S grows", (SCHEDULE,),
            "grew too early", label="grows-early", grow_early=True),
    _scaler("An overflow resets the count of clean steps.", (SCHEDULE,), "reset the count on overflow",
            keep_count_on_overflow=True),
    _scaler("grow when the count reaches growth_interval (then reset it)", (SCHEDULE,), "after growing",
            keep_count_after_growth=True),
    _scaler("records whether any entry of any gradient held an inf or a NaN", (VALUES,),
            "inf, -inf and NaN all count", inf_only=True),
    _scaler("update() changes $S$ once per iteration", (SCHEDULE,), "step\\(\\) does not change the scale",
            update_in_step=True),
    _scaler("(never to inf)", (SCHEDULE,), "never grows to inf", grow_to_inf=True),
    _scaler("Raises ValueError for an argument out of the ranges above", (INTERFACE,), "should raise ValueError",
            no_value_checks=True),
    _scaler("a second call raises RuntimeError, like torch's", (INTERFACE,), "a second unscale_",
            second_unscale_ok=True),
    _scaler("RuntimeError if called twice for this optimizer before ``update()``, or after its ``step()``",
            (INTERFACE,), "after step\\(optimizer\\)", unscale_after_step_ok=True),
    _scaler("RuntimeError if called twice for this optimizer before ``update()``", (INTERFACE,), "a second step",
            step_twice_ok=True),
    _scaler("RuntimeError if no ``step()`` or ``unscale_()`` came since the last update", (INTERFACE,),
            "update\\(\\) on a fresh scaler", update_without_step_ok=True),
    _scaler("``step(optimizer, closure)`` returning what ``optimizer.step(closure)`` returned", (INTERFACE,),
            "returned None, expected 0.25", label="step-returns-closure-value", no_step_return=True),
    _scaler("``step(optimizer, closure)`` returning what ``optimizer.step(closure)`` returned", (INTERFACE,),
            "raised TypeError.*passes the extra arguments", label="step-passes-arguments", no_step_args=True),
    _scaler("The current scale S, as a Python float.", (INTERFACE,), "expected a Python float", scale_tensor=True),
    _step("under autocast for the inputs' device with ``dtype``", (STEP,), "without autocast", no_autocast=True),
    _step("the autocast dtype", (STEP,), "autocast ran with dtype", always_bf16=True),
    _step("Zero the gradients", (STEP,), "zero the gradients", no_zero_grad=True),
    _step("back-propagate the scaled loss", (STEP,), "scaler.scale\\(loss\\)", backward_unscaled=True),
    _step("The model and ``loss_fn`` must be called once each, under autocast", (STEP,), "outside autocast",
          loss_outside=True),
    _step("never call model.half(): the master weights must stay float32", (STEP,), "", half_model=True,
          raises="RuntimeError"),  # torch's own error on the mixed dtypes
    _step("the scaler gets ``scale``, ``step`` and ``update`` once each, in that order", (STEP_SCALER,),
          "calls on the scaler", label="bypasses-scaler-step", bypass_scaler_step=True),
    _step("the scaler gets ``scale``, ``step`` and ``update`` once each, in that order", (STEP_SCALER,),
          "calls on the scaler", label="updates-twice", update_twice=True),
    _step("the scaler gets ``scale``, ``step`` and ``update`` once each, in that order", (STEP_SCALER,),
          "calls on the scaler", label="no-update", no_update=True),
    _step("The loss of this batch (before scaling) as a Python float.", (STEP_RETURNS,), "Python float",
          label="returns-tensor", return_tensor=True),
    _step("The loss of this batch (before scaling) as a Python float.", (STEP_RETURNS,), "before scaling",
          label="returns-scaled-loss", return_scaled=True),
]

test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
    test_contract_covers_every_graded_cell = contract_tests(CHAPTER, CONTRACT, namespace, CHECKS, globals())
