"""Hidden tests of chapter 5 (TinyTL): independent correct implementations pass, plausible wrong ones fail.

In-kernel through LocalNamespace; a few checks through the sandbox
(``grader.sandbox.judge.run_checks``), as the autograder does.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from grader.api import LocalNamespace, checks_for
from kernels.ch05_tinytl import ReLU1bit, relu_packed
from wrong_submissions_ch05_tinytl import WRONG
from sandbox_checks import sandbox_tests

CHAPTER = "ch05_tinytl"
CHECKS = checks_for(CHAPTER)
LITE_IDS = ("test_LiteResidual", "test_LiteResidual_memory", "test_LiteResidual_edge_cases")
APPLY_IDS = ("test_apply_tinytl", "test_apply_tinytl_memory", "test_apply_tinytl_trains")
GRADE_IDS = LITE_IDS + APPLY_IDS


# --- the setup cell's helpers, written another way -----------------------------------------------------
def avg_pool_lean(x, factor):
    """Same values as F.avg_pool2d(x, factor, ceil_mode=True), nothing kept: a custom Function."""
    if factor == 1:
        return x

    class Pool(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            ctx.shape = t.shape
            return F.avg_pool2d(t, factor, ceil_mode=True)

        @staticmethod
        def backward(ctx, g):
            with torch.enable_grad():
                z = torch.zeros(ctx.shape, dtype=g.dtype, requires_grad=True)
                return torch.autograd.grad(F.avg_pool2d(z, factor, ceil_mode=True), z, g)[0]

    return Pool.apply(x)


class Beside(nn.Module):
    def __init__(self, main, side):
        super().__init__()
        self.main, self.side = main, side

    def forward(self, x):
        return self.main(x) + self.side(x)


# --- LiteResidual: a family, correct with the defaults ------------------------------------------------
def make_lite(gamma=0.0, pool="lean", up="bilinear", stride_in_conv=False, check=True, norm="batch"):
    class LiteResidual(nn.Module):
        def __init__(self, in_channels, out_channels, stride=1, downsample=2, groups=2, kernel_size=5):
            super().__init__()
            # check=True: every condition of the docstring; "old": what the grader once tested (no channel count,
            # no kernel_size below 1; torch's Conv2d then raises for groups); False: none.
            lowest = (min(in_channels, out_channels, stride, downsample, groups, kernel_size) if check is True
                      else min(stride, downsample) if check == "old" else 1)
            if check and (lowest < 1 or kernel_size % 2 == 0):
                raise ValueError("bad LiteResidual arguments")
            if check is True and (in_channels % groups or out_channels % groups):
                raise ValueError("groups must divide both channel counts")
            self.stride, self.downsample = stride, downsample
            s = stride if stride_in_conv else 1
            self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, s, kernel_size // 2, groups=groups, bias=False)
            Norm = nn.BatchNorm2d if norm == "batch" else (lambda c: nn.GroupNorm(1, c))
            self.norm = Norm(out_channels)
            self.pointwise = nn.Conv2d(out_channels, out_channels, 1, bias=False)
            self.final_norm = Norm(out_channels)
            with torch.no_grad():
                self.final_norm.weight.fill_(gamma)

        def forward(self, x):
            H, W = x.shape[-2:]
            if pool == "lean":
                r = avg_pool_lean(x, self.downsample)
            elif pool == "torch":
                r = F.avg_pool2d(x, self.downsample, ceil_mode=True)
            else:  # floor: drops the last partial window
                r = F.avg_pool2d(x, self.downsample)
            r = self.final_norm(self.pointwise(torch.relu(self.norm(self.conv(r)))))
            size = (H, W) if up == "input" else (math.ceil(H / self.stride), math.ceil(W / self.stride))
            if up == "bilinear" or up == "input":
                return F.interpolate(r, size=size, mode="bilinear", align_corners=False)
            return F.interpolate(r, size=size, mode="nearest")

    return LiteResidual


class LiteResidual(nn.Module):
    """Also correct: written differently ('same' padding, in-place ReLU, default bilinear options)."""

    def __init__(self, in_channels, out_channels, stride=1, downsample=2, groups=2, kernel_size=5):
        super().__init__()
        if in_channels <= 0 or out_channels <= 0 or downsample < 1 or stride < 1 or kernel_size < 1 \
                or kernel_size % 2 == 0 or groups < 1 or in_channels % groups or out_channels % groups:
            raise ValueError(f"bad arguments {in_channels, out_channels, stride, downsample, groups, kernel_size}")
        self.stride, self.downsample = stride, downsample
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding="same", groups=groups, bias=False)
        self.norm = nn.BatchNorm2d(out_channels)
        self.pointwise = nn.Conv2d(out_channels, out_channels, 1, bias=False)
        self.final_norm = nn.BatchNorm2d(out_channels)
        nn.init.constant_(self.final_norm.weight, 0.0)

    def forward(self, x):
        out = (-(-x.shape[2] // self.stride), -(-x.shape[3] // self.stride))
        h = avg_pool_lean(x, self.downsample)
        h = nn.functional.relu(self.norm(self.conv(h)), inplace=True)
        return F.interpolate(self.final_norm(self.pointwise(h)), out, mode="bilinear")


# --- apply_tinytl ------------------------------------------------------------------------------------
def make_apply(lite_cls=None, freeze_weights=True, train_bias=True, one_bit=True, on_output=False, blocks=None,
               detach=False, groups=None, kernel_size=5):
    def apply_tinytl(model):
        Lite = lite_cls or make_lite()
        for name, p in model.named_parameters():
            keep = name.startswith("classifier.") or (train_bias and name.endswith(".bias"))
            frozen = freeze_weights is True or (freeze_weights == "bn-only" and ".bn." in name)
            p.requires_grad_(keep or not frozen)
        for i, block in enumerate(model.blocks):
            if blocks is not None and i not in blocks:
                continue
            c = block.conv
            g = 2 if c.in_channels % 2 == 0 and c.out_channels % 2 == 0 else 1
            g = g if groups is None else groups
            if one_bit:
                block.act = ReLU1bit()
            if on_output:
                lite = Lite(c.out_channels, c.out_channels, groups=g if c.out_channels % 2 == 0 else 1)
                model.blocks[i] = nn.Sequential(block, Beside(nn.Identity(), lite))
            else:
                lite = Lite(c.in_channels, c.out_channels, stride=c.stride[0], groups=g, kernel_size=kernel_size)
                if detach:
                    lite.forward = (lambda f: lambda t: f(t).detach())(lite.forward)
                model.blocks[i] = Beside(block, lite)
        model.train(model.training)
        return model

    return apply_tinytl


class ReLU1bitByHook(nn.Module):
    """Also correct: relu_packed called through a module written here."""

    def forward(self, x):
        return relu_packed(x)


def apply_tinytl_other(model):
    """Also correct, written differently: freezes by module type, wraps each block's forward."""
    for m in model.modules():
        for pname, p in m.named_parameters(recurse=False):
            p.requires_grad_(pname == "bias")
    for p in model.classifier.parameters():
        p.requires_grad_(True)
    new = []
    for block in model.blocks:
        conv = block.conv
        block.act = ReLU1bitByHook()
        g = 1 if conv.in_channels % 2 else 2
        new.append(Beside(block, LiteResidual(conv.in_channels, conv.out_channels, conv.stride[0], groups=g)))
    model.blocks = nn.ModuleList(new)
    model.train(model.training)
    return model


def namespace(**overrides) -> LocalNamespace:
    lite = make_lite()
    ns = {"LiteResidual": lite, "apply_tinytl": make_apply(lite), "avg_pool_lean": avg_pool_lean}
    ns.update(overrides)
    return LocalNamespace(ns)


# --- tests -------------------------------------------------------------------------------------------
def test_every_grade_id_has_a_check():
    assert sorted(CHECKS) == sorted(GRADE_IDS)


def test_correct_implementation_passes():
    ns = namespace()
    for grade_id in GRADE_IDS:
        CHECKS[grade_id](ns)


def test_other_correct_implementations_pass():
    ns = namespace(LiteResidual=LiteResidual, apply_tinytl=apply_tinytl_other)
    for grade_id in GRADE_IDS:
        CHECKS[grade_id](ns)


def zero_scale_as_buffer():
    """A branch multiplied by a zero *buffer*: zero at init but γ can never learn."""
    base = make_lite(gamma=1.0)

    class LiteResidual(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.register_buffer("scale", torch.zeros(()))

        def forward(self, x):
            return super().forward(x) * self.scale

    return LiteResidual


def zeros_when_large(at_init_only=True):
    """Right on small inputs; on large ones, zeros without computing anything (``at_init_only``: while γ is 0, as
    at init, and the full-resolution F.avg_pool2d once γ moved): behaves differently where memory is measured."""
    base, torch_pool = make_lite(), make_lite(pool="torch")

    class LiteResidual(base):
        def forward(self, x):
            if x.numel() <= 1_000_000:
                return super().forward(x)
            if not at_init_only or not self.final_norm.weight.detach().any():
                size = (-(-x.shape[2] // self.stride), -(-x.shape[3] // self.stride))
                return x.new_zeros(x.shape[0], self.final_norm.num_features, *size)
            return torch_pool.forward(self, x)

    return LiteResidual


# (wrong LiteResidual, the cell it fails, what its message says). The other wrong LiteResidual answers (γ = 1, the
# input's size, nearest upsampling, a floor pooling, GroupNorm, γ as a buffer, full resolution kept, zeros on large
# inputs, no or old checks) are clauses of CONTRACT below: same cell, same message, every other cell that does not
# wait on it run too.
WRONG_LITE_VARIANTS = [
    (make_lite(stride_in_conv=True, up="nearest"), "test_LiteResidual", "differs from the reference"),
]


@pytest.mark.parametrize("wrong, grade_id, message", WRONG_LITE_VARIANTS)
def test_lite_residual_rejects(wrong, grade_id, message):
    with pytest.raises((AssertionError, RuntimeError), match=message):  # RuntimeError: the submission's own crash
        CHECKS[grade_id](namespace(LiteResidual=wrong))


@pytest.mark.parametrize("wrong, grade_id", [  # a further cell's mistakes: in CONTRACT, which runs the others
    (make_lite(gamma=1.0), "test_LiteResidual"),
])
def test_lite_residual_loses_only_its_property(wrong, grade_id):
    """One mistake costs the points of its own cell: the other cells of the exercise pass."""
    ns = namespace(LiteResidual=wrong)
    for other in LITE_IDS:
        if other != grade_id:
            CHECKS[other](ns)


def inflated_alone():
    """fp32 ReLU outputs in the first block, with lite residuals that keep two copies of their input when measured
    alone on a large batch: a grader subtracting what the student's own LiteResidual keeps alone saw a lean main
    branch."""
    base = make_lite()

    class LiteResidual(base):
        def forward(self, x):
            y = super().forward(x)
            if not getattr(self, "inside", False) and x.shape[0] >= 256:
                return y + torch.cat([x, x], 1).pow(2).sum() * 0
            return y

    def apply_tinytl(model):
        make_apply(LiteResidual)(model)
        model.blocks[0].main.act = nn.ReLU()
        for m in model.modules():
            m.inside = True
        return model

    return apply_tinytl


def lite_outside_the_model():
    """The lite residuals called through a list the model does not register, the same modules registered beside:
    the grader's stand-in cannot take their place in the forward, and says so."""
    Lite = make_lite()

    class Beside2(nn.Module):
        def __init__(self, main, side):
            super().__init__()
            self.main, self.decoy, self.hidden = main, side, [side]

        def forward(self, x):
            return self.main(x) + self.hidden[0](x)

    def apply_tinytl(model):
        make_apply(Lite)(model)
        for i, block in enumerate(model.blocks):
            model.blocks[i] = Beside2(block.main, block.side)
        return model

    return apply_tinytl


# (wrong apply_tinytl, the cell it fails, what its message says). The other wrong apply_tinytl answers (weights not
# frozen or only BatchNorm's, biases frozen, γ = 1, residuals on the output or on two blocks, the groups rule broken,
# fp32 ReLUs, lean only when measured alone, residuals outside the model, a detached branch) are clauses of CONTRACT
# below: same cell, same message, every other cell that does not wait on it run too.
WRONG_APPLY_VARIANTS = [
    (make_apply(freeze_weights=False), "test_apply_tinytl_memory", "keep every original weight frozen"),
]


@pytest.mark.parametrize("wrong, grade_id, message", WRONG_APPLY_VARIANTS)
def test_apply_tinytl_rejects(wrong, grade_id, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS[grade_id](namespace(apply_tinytl=wrong))


@pytest.mark.parametrize("wrong, grade_id", [  # a further cell's mistakes: in CONTRACT, which runs the others
    (make_apply(make_lite(gamma=1.0)), "test_apply_tinytl"),
])
def test_apply_tinytl_loses_only_its_property(wrong, grade_id):
    """One mistake costs the points of its own cell: the other cells of the exercise pass."""
    ns = namespace(apply_tinytl=wrong)
    for other in APPLY_IDS:
        if other != grade_id:
            CHECKS[other](ns)


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(
    CHAPTER, WRONG, {"LiteResidual": "test_LiteResidual", "apply_tinytl": "test_apply_tinytl"})


# --- the contract table: each property the text states, the cell that grades it, a wrong answer that breaks it --
from contract_tables import Clause, contract_tests  # noqa: E402


def downsample_fixed_at_init():
    """Right, but the pooling factor is copied at construction: setting .downsample afterwards changes nothing."""
    base = make_lite()

    class LiteResidual(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._factor = self.downsample

        def forward(self, x):
            saved, self.downsample = self.downsample, self._factor
            try:
                return super().forward(x)
            finally:
                self.downsample = saved

    return LiteResidual


def returns_a_copy(model):
    """TinyTL on a copy: the model passed in is left as it was."""
    import copy
    return make_apply()(copy.deepcopy(model))


_LR, _AT = "LiteResidual", "apply_tinytl"
_LV, _LM, _LE = LITE_IDS
_AV, _AM, _AX = APPLY_IDS
CONTRACT = [
    Clause(_LR, "with its weight γ initialised to 0 (bias 0): the branch outputs exactly zeros at init", (_LV,),
           {_LR: make_lite(gamma=1.0)}, "not exactly zero"),
    Clause(_LR, "The output size is the block's", (_LV,), {_LR: make_lite(up="input")}, "returned shape"),
    Clause(_LR, 'mode="bilinear"', (_LV,), {_LR: make_lite(up="nearest")}, "differs from the reference"),
    Clause(_LR, "Build the branch exactly in the order of the docstring", (_LV,),
           {_LR: make_lite(stride_in_conv=True)}, "differs from the reference|returned shape"),
    Clause(_LR, "downsample 1, 2, 4 and 8 (a window wider than a side of the map)", (_LV,),
           {_LR: make_lite(pool="floor")}, "Output size is too small", raises="RuntimeError"),  # torch's own error
    Clause(_LR, "self.norm = nn.BatchNorm2d(out_channels)", (_LV,), {_LR: make_lite(norm="group")},
           "differs from the reference"),
    Clause(_LR, "a nonzero gradient of the final γ at init", (_LV,), {_LR: zero_scale_as_buffer()},
           "received no gradient"),
    Clause(_LR, "self.stride and self.downsample hold the arguments (section 7 varies downsample)", (_LV,),
           {_LR: downsample_fixed_at_init()}, "whose .downsample was then set to 4"),
    Clause(_LR, "no tensor at the input's full resolution may be kept", (_LM,), {_LR: make_lite(pool="torch")},
           "full resolution"),
    Clause(_LR, "your process may hold at most six tensors of the pooled size", (_LM,), {_LR: zeros_when_large()},
           "full resolution"),
    Clause(_LR, "that same call's weighted sum, a sample of the output and the sum of the input gradient are compared "
                "with the reference", (_LM,), {_LR: zeros_when_large(at_init_only=False)}, "on the call measured"),
    Clause(_LR, "ValueError: a channel count, stride, downsample or kernel_size below 1", (_LE,),
           {_LR: make_lite(check=False)}, "should raise ValueError"),
    Clause(_LR, "ValueError: a channel count, stride, downsample or kernel_size below 1", (_LE,),
           {_LR: make_lite(check="old")}, r"in_channels=0 \(a channel count below 1\)", label="channel-count"),
    Clause(_AT, "every other original weight is frozen", (_AV,), {_AT: make_apply(freeze_weights=False)},
           r"output at init \(train mode\)"),
    Clause(_AT, "every other original weight is frozen", (_AV,), {_AT: make_apply(freeze_weights="bn-only")},
           "every original weight", label="conv-weights-frozen"),
    Clause(_AT, "the original biases, all lite-residual parameters, the classifier's weight and bias", (_AV,),
           {_AT: make_apply(train_bias=False)}, "every bias trains"),
    Clause(_AT, "Its outputs at init equal those of the model passed in (eval mode), in eval and in train mode",
           (_AV,), {_AT: make_apply(make_lite(gamma=1.0))}, "output at init"),
    Clause(_AT, "the same model returned", (_AV,), {_AT: returns_a_copy}, "changes the model in place"),
    Clause(_AT, "exactly one LiteResidual call per block in a forward, on the block's input", (_AV,),
           {_AT: make_apply(on_output=True)}, "fed with the block's input"),
    Clause(_AT, "beside every block model.blocks[i]", (_AV,), {_AT: make_apply(blocks={0, 1})}, "one per block"),
    Clause(_AT, "**Groups rule:** groups = 2 when 2 divides both channel counts, else 1", (_AV,),
           {_AT: make_apply(groups=1)}, "groups rule"),
    Clause(_AT, "the default kernel size", (_AV,), {_AT: make_apply(kernel_size=3)}, "groups rule"),
    Clause(_AT, "replace each block's ReLU (block.act) by the 1-bit one", (_AM,), {_AT: make_apply(one_bit=False)},
           r"ReLU1bit\(\) \(relu_packed as a module\)"),
    Clause(_AT, "may leave your process holding only the 1-bit ReLU masks, the classifier's fp32 input and the output",
           (_AM,), {_AT: inflated_alone()}, r"ReLU1bit\(\) \(relu_packed as a module\)"),
    Clause(_AT, "with the grader's own stand-in (exact zeros, nothing kept) in place of each of your LiteResidual "
                "modules", (_AM,), {_AT: lite_outside_the_model()},
           "a LiteResidual ran after the grader had put its stand-in"),
    Clause(_AT, "must lower the loss by more than 0.05 and change every trainable parameter", (_AX,),
           {_AT: make_apply(detach=True)}, "never changed"),
]

test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
    test_contract_covers_every_graded_cell = contract_tests(CHAPTER, CONTRACT, namespace, CHECKS, globals())
