"""The hidden tests of chapter 4 accept correct implementations and reject plausible wrong ones.

The implementations here are written independently of solutions/ch04_partial_training.py, so that
a bug shared by the solution and its hidden tests cannot hide. The last tests run the same checks
through the sandbox (``grader.sandbox.judge.run_checks``), as the autograder does.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from grader.api import LocalNamespace, checks_for

from wrong_submissions_ch04_partial_training import WRONG
from sandbox_checks import sandbox_tests

CHAPTER = "ch04_partial_training"
CHECKS = checks_for(CHAPTER)
GRADE_IDS = ["test_set_trainable", "test_pack_bits", "test_unpack_bits", "test_relu_1bit"]
VALID = ("full", "last", "bn+last", "bias+last")


# --- set_trainable: correct with the defaults, each flag one plausible mistake ---------------------
def make_set_trainable(bn_takes_conv_bias=False, bn_by_name=False, remembered_count=None, count_all=False,
                       never_freeze=False, bias_of_conv_only=False, accept_unknown=False, terse_error=False,
                       last_weight_only=False):
    def set_trainable(model, mode):
        if mode not in VALID and not accept_unknown:
            raise ValueError("unknown mode" if terse_error else f"mode must be one of {', '.join(VALID)}")
        wanted = []
        for module in model.modules():
            own = dict(module.named_parameters(recurse=False))
            is_bn = isinstance(module, nn.BatchNorm2d) and not bn_by_name
            if mode == "bn+last" and is_bn:
                wanted += own.values()
            if mode == "bias+last" and "bias" in own and (not bias_of_conv_only or isinstance(module, nn.Conv2d)):
                wanted.append(own["bias"])
            if mode == "bn+last" and bn_takes_conv_bias and isinstance(module, nn.Conv2d) and "bias" in own:
                wanted.append(own["bias"])
        if mode == "bn+last" and bn_by_name:
            wanted += [p for name, p in model.named_parameters() if ".bn." in name]
        if mode == "full":
            wanted = list(model.parameters())
        wanted += [model.classifier.weight] if last_weight_only else list(model.classifier.parameters())
        ids = {id(p) for p in wanted}
        for p in model.parameters():
            if id(p) in ids:
                p.requires_grad = True
            elif not never_freeze:
                p.requires_grad = False
        if remembered_count is not None:
            return remembered_count[mode]
        return sum(p.numel() for p in model.parameters() if p.requires_grad or count_all)

    return set_trainable


# --- pack_bits / unpack_bits -------------------------------------------------------------------------
def make_pack_bits(msb_first=False, drop_tail=False, check_dtype=True, out_dtype=torch.uint8, pad_value=0):
    def pack_bits(mask):
        if check_dtype and mask.dtype != torch.bool:
            raise ValueError(f"expected a bool mask, got {mask.dtype}")
        flat = mask.flatten().to(torch.uint8)
        n = flat.numel()
        if drop_tail:
            flat = flat[: n - n % 8]
        else:
            flat = F.pad(flat, (0, (8 - n % 8) % 8), value=pad_value)
        shifts = torch.arange(8, dtype=torch.uint8)
        if msb_first:
            shifts = shifts.flip(0)
        return (flat.view(-1, 8) << shifts).sum(dim=1).to(out_dtype)

    return pack_bits


def make_unpack_bits(msb_first=False, keep_tail=False, out_dtype=torch.bool):
    def unpack_bits(packed, numel):
        order = range(7, -1, -1) if msb_first else range(8)
        bits = torch.stack([torch.div(packed, 2 ** j, rounding_mode="floor") % 2 for j in order], dim=1)
        flat = bits.flatten()
        return (flat if keep_tail else flat[:numel]).to(out_dtype)

    return unpack_bits


pack_ok, unpack_ok = make_pack_bits(), make_unpack_bits()


# --- relu_1bit ------------------------------------------------------------------------------------------
class _MaskReLU(torch.autograd.Function):
    """Correct: one packed mask saved; the mask's bits decide the gradient."""

    @staticmethod
    def forward(ctx, x):
        ctx.numel, ctx.shape = x.numel(), x.shape
        ctx.save_for_backward(pack_ok(x > 0))
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, g):
        (packed,) = ctx.saved_tensors
        keep = unpack_ok(packed, ctx.numel).view(ctx.shape)
        return torch.where(keep, g, torch.zeros((), dtype=g.dtype))


def relu_ok(x):
    return _MaskReLU.apply(x)


def make_relu(save="packed", mask_ge=False, attr=None):
    """``save``: what goes through save_for_backward ("packed", "bool", "output", "packed+output",
    "nothing"); ``attr``: something kept as a ctx attribute instead ("x" or "packed")."""

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            mask = x >= 0 if mask_ge else x > 0
            y = torch.relu(x)
            ctx.shape = x.shape
            saved = {"packed": (pack_ok(mask),), "bool": (mask,), "output": (y,),
                     "packed+output": (pack_ok(mask), y), "nothing": ()}[save]
            ctx.save_for_backward(*saved)
            ctx.kept = {"x": x, "packed": pack_ok(mask), None: None}[attr]
            return y

        @staticmethod
        def backward(ctx, g):
            if attr == "x":
                mask = ctx.kept >= 0 if mask_ge else ctx.kept > 0
            elif attr == "packed":
                mask = unpack_ok(ctx.kept, g.numel()).view(ctx.shape)
            elif save in ("packed", "packed+output"):
                mask = unpack_ok(ctx.saved_tensors[0], g.numel()).view(ctx.shape)
            else:
                mask = ctx.saved_tensors[0] > 0 if save == "output" else ctx.saved_tensors[0]
            return g * mask

    return Fn.apply


def namespace(**overrides) -> LocalNamespace:
    ns = {"set_trainable": make_set_trainable(), "pack_bits": pack_ok, "unpack_bits": unpack_ok,
          "relu_1bit": relu_ok}
    ns.update(overrides)
    return LocalNamespace(ns)


# --- tests --------------------------------------------------------------------------------------------
def test_every_grade_id_has_a_check():
    assert sorted(CHECKS) == sorted(GRADE_IDS)


@pytest.mark.parametrize("grade_id", GRADE_IDS)
def test_correct_implementations_pass(grade_id):
    CHECKS[grade_id](namespace())


def test_other_correct_relu_passes():
    CHECKS["test_relu_1bit"](namespace(relu_1bit=make_relu()))


COUNTS_OF_THE_COURSE_CNN = {"full": 130_821, "last": 645, "bn+last": 1_221, "bias+last": 1_221}


@pytest.mark.parametrize("wrong, message", [
    (make_set_trainable(bn_takes_conv_bias=True), "A convolution bias is not a BatchNorm parameter"),
    (make_set_trainable(bn_by_name=True), "by type"),
    (make_set_trainable(remembered_count=COUNTS_OF_THE_COURSE_CNN), "not a number remembered"),
    (make_set_trainable(count_all=True), "number of elements of the parameters that now require grad"),
    (make_set_trainable(never_freeze=True), "whatever it was before the call"),
    (make_set_trainable(bias_of_conv_only=True), "convolution and BatchNorm"),
    (make_set_trainable(last_weight_only=True), "every parameter of model.classifier"),
    (make_set_trainable(accept_unknown=True), "must raise ValueError"),
    (make_set_trainable(terse_error=True), "list the valid modes"),
])
def test_set_trainable_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_set_trainable"](namespace(set_trainable=wrong))


@pytest.mark.parametrize("wrong, message", [
    (make_pack_bits(msb_first=True), "not bit 7 - j"),
    (make_pack_bits(drop_tail=True), "the last, partly used byte must be kept"),
    (make_pack_bits(check_dtype=False), "raise ValueError"),
    (make_pack_bits(out_dtype=torch.int64), "return a torch.uint8 tensor"),
    (make_pack_bits(pad_value=1), "unused high bits of the last byte must be 0"),
])
def test_pack_bits_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_pack_bits"](namespace(pack_bits=wrong))


@pytest.mark.parametrize("wrong, message", [
    (make_unpack_bits(msb_first=True), "not bit 7 - j"),
    (make_unpack_bits(keep_tail=True), "return exactly numel elements"),
    (make_unpack_bits(out_dtype=torch.uint8), "return a torch.bool tensor"),
])
def test_unpack_bits_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_unpack_bits"](namespace(unpack_bits=wrong))


@pytest.mark.parametrize("wrong, message", [
    (torch.relu, "torch.relu keeps"),
    (make_relu(save="output"), "torch.relu keeps"),
    (make_relu(save="packed+output"), "torch.relu keeps"),
    (make_relu(save="bool"), "a byte per element"),
    (make_relu(save="nothing", attr="packed"), "hides it from autograd's saved-tensor hooks"),
    (make_relu(attr="x"), "not x or the output kept some other way"),
    (make_relu(mask_ge=True), "not x >= 0"),
])
def test_relu_1bit_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_relu_1bit"](namespace(relu_1bit=wrong))


def test_wrong_unpack_breaks_an_otherwise_correct_relu():
    """relu_1bit builds on the student's own pack/unpack: a tail-dropping pack fails the ReLU test too."""
    drop = make_pack_bits(drop_tail=True)

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.n, ctx.shape = x.numel(), x.shape
            ctx.save_for_backward(drop(x > 0))
            return torch.relu(x)

        @staticmethod
        def backward(ctx, g):
            (p,) = ctx.saved_tensors
            bits = make_unpack_bits(keep_tail=True)(p, ctx.n)
            bits = F.pad(bits, (0, ctx.n - bits.numel()))
            return g * bits.view(ctx.shape)

    with pytest.raises(AssertionError):
        CHECKS["test_relu_1bit"](namespace(relu_1bit=Fn.apply))


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(CHAPTER, WRONG)
