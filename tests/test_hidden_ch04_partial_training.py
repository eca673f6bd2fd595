"""The hidden tests of chapter 4 accept correct implementations and reject plausible wrong ones.

The implementations here are written independently of solutions/ch04_partial_training.py, so that
a bug shared by the solution and its hidden tests cannot hide. Each graded cell checks one property:
every wrong variant below fails the cell of its mistake, and the ``*_only`` tests show a variant
failing exactly that cell while the exercise's other cells pass. The last tests run the same checks
through the sandbox (``grader.sandbox.judge.run_checks``), as the autograder does.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from grader.api import LocalNamespace, checks_for

from wrong_submissions_ch04_partial_training import WRONG
from sandbox_checks import sandbox_tests

CHAPTER = "ch04_partial_training"
CHECKS = checks_for(CHAPTER)
SET_TRAINABLE_IDS = ["test_set_trainable", "test_set_trainable_errors"]
PACK_IDS = ["test_pack_bits", "test_pack_bits_errors"]
RELU_IDS = ["test_relu_1bit", "test_relu_1bit_memory"]
GRADE_IDS = SET_TRAINABLE_IDS + PACK_IDS + ["test_unpack_bits"] + RELU_IDS
VALID = ("full", "last", "bn+last", "bias+last")


# --- set_trainable: correct with the defaults, each flag one plausible mistake ---------------------
def make_set_trainable(bn_takes_conv_bias=False, bn_by_name=False, remembered_count=None, count_all=False,
                       never_freeze=False, bias_of_conv_only=False, accept_unknown=False, terse_error=False,
                       last_weight_only=False, count_tensors=False, bias_takes_bn_weight=False,
                       type_error=False, bn2d_only=False):
    norms = nn.BatchNorm2d if bn2d_only else (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)

    def set_trainable(model, mode):
        if mode not in VALID and not accept_unknown:
            if type_error:
                raise TypeError(f"mode must be one of {', '.join(VALID)}")
            raise ValueError("unknown mode" if terse_error else f"mode must be one of {', '.join(VALID)}")
        wanted = []
        for module in model.modules():
            own = dict(module.named_parameters(recurse=False))
            is_bn = isinstance(module, norms) and not bn_by_name
            if mode == "bn+last" and is_bn:
                wanted += own.values()
            if mode == "bias+last" and "bias" in own and (not bias_of_conv_only or isinstance(module, nn.Conv2d)):
                wanted.append(own["bias"])
            if mode == "bias+last" and bias_takes_bn_weight and isinstance(module, nn.BatchNorm2d):
                wanted.append(own["weight"])
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
        if count_tensors:
            return sum(1 for p in model.parameters() if p.requires_grad)
        return sum(p.numel() for p in model.parameters() if p.requires_grad or count_all)

    return set_trainable


def set_trainable_other(model, mode):
    """Also correct, written differently: by parameter name and the owning module's class, via a table."""
    rules = {"full": lambda module, name: True,
             "last": lambda module, name: False,
             "bn+last": lambda module, name: isinstance(module, nn.modules.batchnorm._BatchNorm),
             "bias+last": lambda module, name: name == "bias"}
    if mode not in rules:
        raise ValueError(f"{mode!r} is not a mode; use 'full', 'last', 'bn+last' or 'bias+last'")
    head = {id(p) for p in model.classifier.parameters()}
    total = 0
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            p.requires_grad_(id(p) in head or rules[mode](module, name))
            total += p.numel() if p.requires_grad else 0
    return total


# --- pack_bits / unpack_bits -------------------------------------------------------------------------
def make_pack_bits(msb_first=False, drop_tail=False, check_dtype=True, out_dtype=torch.uint8, pad_value=0,
                   reverse_bytes=False, pad_front=False, strided=False, column_major=False, one_per_byte=False):
    def pack_bits(mask):
        if check_dtype and mask.dtype != torch.bool:
            raise ValueError(f"expected a bool mask, got {mask.dtype}")
        if column_major:
            mask = mask.permute(*reversed(range(mask.dim())))
        flat = mask.flatten().to(torch.uint8)
        n = flat.numel()
        if one_per_byte:
            return flat
        if drop_tail:
            flat = flat[: n - n % 8]
        else:
            pad = (8 - n % 8) % 8
            flat = F.pad(flat, (pad, 0) if pad_front else (0, pad), value=pad_value)
        shifts = torch.arange(8, dtype=torch.uint8)
        if msb_first:
            shifts = shifts.flip(0)
        if strided:
            out = (flat.view(8, -1) << shifts.view(8, 1)).sum(dim=0)
        else:
            out = (flat.view(-1, 8) << shifts).sum(dim=1)
        out = out.to(out_dtype)
        return out.flip(0) if reverse_bytes else out

    return pack_bits


def make_unpack_bits(msb_first=False, keep_tail=False, out_dtype=torch.bool, reverse_bytes=False, strided=False,
                     from_end=False, check_dtype=True, check_size=True):
    def unpack_bits(packed, numel):
        if check_dtype and packed.dtype != torch.uint8:
            raise ValueError(f"packed must be uint8, got {packed.dtype}")
        if check_size and numel > 8 * packed.numel():
            raise ValueError(f"{packed.numel()} bytes hold fewer than {numel} bits")
        if reverse_bytes:
            packed = packed.flip(0)
        order = range(7, -1, -1) if msb_first else range(8)
        bits = torch.stack([torch.div(packed, 2 ** j, rounding_mode="floor") % 2 for j in order], dim=1)
        flat = bits.t().flatten() if strided else bits.flatten()
        if keep_tail:
            return flat.to(out_dtype)
        return (flat[-numel:] if from_end else flat[:numel]).to(out_dtype)

    return unpack_bits


def unpack_other(packed, numel):
    """Also correct, written differently: a lookup of bit masks and a comparison, no shifts."""
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise ValueError("packed must be a torch.uint8 tensor")
    if numel > packed.numel() * 8:
        raise ValueError("not enough bits")
    masks = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)
    return (packed.unsqueeze(1).bitwise_and(masks) != 0).reshape(-1)[:numel]


def pack_other(mask):
    """Also correct, written differently: numpy's packbits, little bit order."""
    if mask.dtype != torch.bool:
        raise ValueError("not a bool mask")
    return torch.from_numpy(np.packbits(mask.reshape(-1).numpy(), bitorder="little").copy())


pack_ok, unpack_ok = make_pack_bits(), make_unpack_bits()


# --- relu_1bit ------------------------------------------------------------------------------------------
def relu_through(pack, unpack):
    """Correct: one mask packed by ``pack`` saved; its bits, read back by ``unpack``, decide the gradient (a
    student's relu_1bit calls their own pack and unpack)."""
    class MaskReLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.numel, ctx.shape = x.numel(), x.shape
            ctx.save_for_backward(pack(x > 0))
            return x.clamp(min=0)

        @staticmethod
        def backward(ctx, g):
            (packed,) = ctx.saved_tensors
            keep = unpack(packed, ctx.numel).view(ctx.shape)
            return torch.where(keep, g, torch.zeros((), dtype=g.dtype))

    return MaskReLU.apply


_mask_relu = relu_through(pack_ok, unpack_ok)


def relu_ok(x):
    return _mask_relu(x)


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


@pytest.mark.parametrize("grade_id", GRADE_IDS)
def test_other_correct_implementations_pass(grade_id):
    CHECKS[grade_id](namespace(set_trainable=set_trainable_other, pack_bits=pack_other, unpack_bits=unpack_other,
                               relu_1bit=make_relu()))


def _fails_only(ns, grade_id: str, ids: list[str], message: str | None = None):
    """``grade_id`` fails (with ``message`` when given) and every other cell of the exercise passes."""
    with pytest.raises(AssertionError, match=message):
        CHECKS[grade_id](ns)
    for other in ids:
        if other != grade_id:
            CHECKS[other](ns)


COUNTS_OF_THE_COURSE_CNN = {"full": 130_821, "last": 645, "bn+last": 1_221, "bias+last": 1_221}


@pytest.mark.parametrize("wrong, grade_id, message", [
    (make_set_trainable(bn_takes_conv_bias=True), "test_set_trainable", "A convolution bias is not a BatchNorm"),
    (make_set_trainable(bn_by_name=True), "test_set_trainable", "by type"),
    (make_set_trainable(remembered_count=COUNTS_OF_THE_COURSE_CNN), "test_set_trainable",
     "count of the course's default TransferCNN"),
    (make_set_trainable(count_all=True), "test_set_trainable", "that is every parameter of the model"),
    (make_set_trainable(count_tensors=True), "test_set_trainable", "number of trainable parameter tensors"),
    (make_set_trainable(never_freeze=True), "test_set_trainable", "whatever it was before the call"),
    (make_set_trainable(bias_of_conv_only=True), "test_set_trainable", "BatchNorm biases .β. and convolution"),
    (make_set_trainable(bias_takes_bn_weight=True), "test_set_trainable", "a BatchNorm weight .γ. stays frozen"),
    (make_set_trainable(last_weight_only=True), "test_set_trainable", "trains whole, in every mode"),
    (make_set_trainable(accept_unknown=True), "test_set_trainable_errors", "must raise ValueError"),
    (make_set_trainable(type_error=True), "test_set_trainable_errors", "raised TypeError"),
    (make_set_trainable(terse_error=True), "test_set_trainable_errors", "list the four valid modes"),
])
def test_set_trainable_rejects(wrong, grade_id, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS[grade_id](namespace(set_trainable=wrong))


@pytest.mark.parametrize("wrong, grade_id, message", [  # unknown modes accepted, a terse error: in CONTRACT
    (make_set_trainable(bn_takes_conv_bias=True), "test_set_trainable", "A convolution bias is not a BatchNorm"),
    (make_set_trainable(never_freeze=True), "test_set_trainable", "whatever it was before the call"),
    (make_set_trainable(count_tensors=True), "test_set_trainable", "number of trainable parameter tensors"),
])
def test_set_trainable_mistake_fails_only_its_cell(wrong, grade_id, message):
    _fails_only(namespace(set_trainable=wrong), grade_id, SET_TRAINABLE_IDS, message)


@pytest.mark.parametrize("wrong, grade_id, message", [
    (make_pack_bits(msb_first=True), "test_pack_bits", "bit 7 - j .most significant bit first"),
    (make_pack_bits(reverse_bytes=True), "test_pack_bits", "bytes are in reverse order"),
    (make_pack_bits(pad_front=True), "test_pack_bits", "padding went before the elements"),
    (make_pack_bits(strided=True), "test_pack_bits", "not \\(8, -1\\)"),
    (make_pack_bits(column_major=True), "test_pack_bits", "flattened in another order"),
    (make_pack_bits(drop_tail=True), "test_pack_bits", "the last, partly used byte must be kept"),
    (make_pack_bits(one_per_byte=True), "test_pack_bits", "one byte per element"),
    (make_pack_bits(out_dtype=torch.int64), "test_pack_bits", "return a torch.uint8 tensor"),
    (make_pack_bits(pad_value=1), "test_pack_bits", "unused high bits of the last byte must be 0"),
    (make_pack_bits(check_dtype=False), "test_pack_bits_errors", "raise ValueError"),
])
def test_pack_bits_rejects(wrong, grade_id, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS[grade_id](namespace(pack_bits=wrong))


@pytest.mark.parametrize("wrong, grade_id, message", [  # no dtype check: in CONTRACT
    (make_pack_bits(msb_first=True), "test_pack_bits", "most significant bit first"),
    (make_pack_bits(reverse_bytes=True), "test_pack_bits", "bytes are in reverse order"),
])
def test_pack_bits_mistake_fails_only_its_cell(wrong, grade_id, message):
    _fails_only(namespace(pack_bits=wrong), grade_id, PACK_IDS, message)


def test_pack_bits_layout_hints_name_their_cause():
    """Each wrong layout gets its own cause, never the bit-order hint of another mistake."""
    causes = {"msb_first": "most significant bit first", "reverse_bytes": "reverse order",
              "pad_front": "padding went before", "strided": "(8, -1)", "column_major": "another order"}
    for flag, cause in causes.items():
        with pytest.raises(AssertionError) as info:
            CHECKS["test_pack_bits"](namespace(pack_bits=make_pack_bits(**{flag: True})))
        message = str(info.value)
        assert cause in message, (flag, message)
        assert all(other not in message for other in causes.values() if other != cause), (flag, message)


@pytest.mark.parametrize("wrong, message", [
    (make_unpack_bits(msb_first=True), "read from bit 7 - j"),
    (make_unpack_bits(reverse_bytes=True), "bytes were read in reverse order"),
    (make_unpack_bits(strided=True), "not its transpose"),
    (make_unpack_bits(from_end=True), "not the last numel"),
    (make_unpack_bits(keep_tail=True), "return exactly numel elements"),
    (make_unpack_bits(out_dtype=torch.uint8), "return a torch.bool tensor"),
    (make_unpack_bits(check_dtype=False), "int64 tensor returned normally"),
    (make_unpack_bits(check_size=False), "2 bytes .16 bits. with numel=17 returned normally"),
])
def test_unpack_bits_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_unpack_bits"](namespace(unpack_bits=wrong))


def by_size(large, small, above=64 * 64):
    """``large`` on masks (or ``numel``s) of more than ``above`` elements, ``small`` on the others: right on
    every small mask a fixed case uses and the drawn small mask (at most 64 x 64)."""
    def fn(*args):
        n = args[1] if len(args) == 2 else args[0].numel()
        return (large if n > above else small)(*args)
    return fn


@pytest.mark.parametrize("wrong, message", [
    (make_pack_bits(msb_first=True), "most significant bit first"),
    (make_pack_bits(reverse_bytes=True), "bytes are in reverse order"),
    (make_pack_bits(strided=True), "not \\(8, -1\\)"),
])
def test_pack_bits_wrong_only_above_the_small_masks_fails_only_its_cell(wrong, message):
    """Right up to 64 x 64 elements, a plausible mistake above: the large mask, drawn at grading time between
    2^20 and 15 x 2^20 elements, shows it (its bytes compared at positions drawn at grading time)."""
    ns = namespace(pack_bits=by_size(wrong, pack_ok))
    _fails_only(ns, "test_pack_bits", PACK_IDS, message)
    with pytest.raises(AssertionError, match="drawn at grading time"):
        CHECKS["test_pack_bits"](ns)


@pytest.mark.parametrize("wrong, message", [
    (make_unpack_bits(msb_first=True), "read from bit 7 - j"),
    (make_unpack_bits(reverse_bytes=True), "bytes were read in reverse order"),
    (make_unpack_bits(strided=True), "not its transpose"),
])
def test_unpack_bits_wrong_only_above_the_small_masks_fails_its_cell(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_unpack_bits"](namespace(unpack_bits=by_size(wrong, unpack_ok)))


def test_msb_first_above_the_small_masks_loses_pack_and_unpack_only():
    """The red-team attack: pack and unpack both most significant bit first above 64 x 64 elements, consistently,
    so a relu_1bit built on them is right; exactly the pack and unpack value cells fail."""
    pack = by_size(make_pack_bits(msb_first=True), pack_ok)
    unpack = by_size(make_unpack_bits(msb_first=True), unpack_ok)
    ns = namespace(pack_bits=pack, unpack_bits=unpack, relu_1bit=relu_through(pack, unpack))
    for grade_id, message in (("test_pack_bits", "most significant bit first"),
                              ("test_unpack_bits", "read from bit 7 - j")):
        with pytest.raises(AssertionError, match=message):
            CHECKS[grade_id](ns)
    for grade_id in ["test_pack_bits_errors"] + RELU_IDS:
        CHECKS[grade_id](ns)


# torch.relu, the output or a bool mask saved, x kept as an attribute, the mask x >= 0: clauses of CONTRACT below,
# which fail the same cell with the same message and run relu_1bit's other cell too.


def test_relu_1bit_packed_mask_on_ctx_passes():
    """Only the packed mask kept, as a ctx attribute rather than through ctx.save_for_backward: saved-tensor hooks
    in the process do not see it, but the memory is read from outside and the values are right, so it passes."""
    ns = namespace(relu_1bit=make_relu(save="nothing", attr="packed"))
    for grade_id in RELU_IDS:
        CHECKS[grade_id](ns)


@pytest.mark.parametrize("wrong, grade_id, message", [  # a bool mask, torch.relu: in CONTRACT
    (make_relu(mask_ge=True), "test_relu_1bit", "not x >= 0"),
])
def test_relu_1bit_mistake_fails_only_its_cell(wrong, grade_id, message):
    _fails_only(namespace(relu_1bit=wrong), grade_id, RELU_IDS, message)


def relu_by_size(large, small=relu_ok, at=100_000):
    """``large`` on inputs of at least ``at`` elements, ``small`` on the others."""
    def relu(x):
        return large(x) if x.numel() >= at else small(x)
    return relu


class _PassThrough(torch.autograd.Function):
    """Saves nothing and lets the gradient through unmasked: wrong values, nothing held."""

    @staticmethod
    def forward(ctx, x):
        return torch.relu(x)

    @staticmethod
    def backward(ctx, g):
        return g.clone()


class _FlippedBits(torch.autograd.Function):
    """The packed mask, but every 1000th bit read back flipped: a few wrong gradient entries."""

    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        ctx.save_for_backward(pack_ok(x > 0))
        return torch.relu(x)

    @staticmethod
    def backward(ctx, g):
        (packed,) = ctx.saved_tensors
        keep = unpack_ok(packed, g.numel()).clone()
        keep[::1000] = ~keep[::1000]
        return g * keep.view(ctx.shape)


@pytest.mark.parametrize("wrong, message", [
    # honest at the size the text once documented (2^24 elements), an fp32 copy as a ctx attribute elsewhere
    (relu_by_size(relu_ok, make_relu(attr="x"), at=1 << 24), "torch.relu keeps|not x or the output"),
    (relu_by_size(make_relu(attr="x")), "kept some other way"),
    # a bool mask and an unmasked gradient on large inputs: clauses of CONTRACT below
    # every 1000th bit flipped: one of the 64 sampled entries may hit one first (about 1 run in 16)
    (relu_by_size(_FlippedBits.apply), "(a single wrong mask bit shows|entries drawn at grading time).* differs"),
    (relu_by_size(lambda x: torch.relu(x).detach().requires_grad_()), "kept some other way|should be a tensor"),
])
def test_relu_1bit_measured_call_fails_only_memory(wrong, message):
    """The measured call's size is drawn at grading time from the stated range, and its values are checked."""
    _fails_only(namespace(relu_1bit=wrong), "test_relu_1bit_memory", RELU_IDS, message)


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
            bits = make_unpack_bits(keep_tail=True, check_size=False)(p, ctx.n)
            bits = F.pad(bits, (0, ctx.n - bits.numel()))
            return g * bits.view(ctx.shape)

    with pytest.raises(AssertionError):
        CHECKS["test_relu_1bit"](namespace(relu_1bit=Fn.apply))


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(
    CHAPTER, WRONG, {"relu_1bit": "test_relu_1bit_memory"})


# --- the contract table: each property the text states, the cell that grades it, a wrong answer that breaks it --
from contract_tables import Clause, contract_tests  # noqa: E402


def set_trainable_frozen_copies(model, mode):
    """The right flags, but every parameter that must freeze is replaced by a frozen copy (a new tensor)."""
    count = make_set_trainable()(model, mode)
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if not p.requires_grad:
                module.register_parameter(name, nn.Parameter(p.detach().clone(), requires_grad=False))
    return count


def set_trainable_float_count(model, mode):
    return float(make_set_trainable()(model, mode))


def relu_detached(x):
    return torch.relu(x).detach()


def relu_in_float32(x):
    return relu_ok(x.float())


_ST, _PB, _UB, _RB = "set_trainable", "pack_bits", "unpack_bits", "relu_1bit"
_LAYOUT = "element 8k + j of the flattened mask is bit j (value 2**j) of byte k"
_LARGE = "a random 2-D mask of 2^20 to 15 × 2^20 elements whose shape"
CONTRACT = [
    Clause(_ST, "Convolution biases stay frozen", ("test_set_trainable",),
           {_ST: make_set_trainable(bn_takes_conv_bias=True)}, "A convolution bias is not a BatchNorm"),
    Clause(_ST, "whatever its attribute name", ("test_set_trainable",), {_ST: make_set_trainable(bn_by_name=True)},
           "by type"),
    Clause(_ST, "any instance of nn.BatchNorm1d/2d/3d", ("test_set_trainable",),
           {_ST: make_set_trainable(bn2d_only=True)}, "whatever its dimensionality"),
    Clause(_ST, "so calling set_trainable again with another mode switches cleanly", ("test_set_trainable",),
           {_ST: make_set_trainable(never_freeze=True)}, "whatever it was before the call"),
    Clause(_ST, "convolution and BatchNorm biases alike", ("test_set_trainable",),
           {_ST: make_set_trainable(bias_of_conv_only=True)}, "BatchNorm biases .β. and convolution"),
    Clause(_ST, "BatchNorm weights stay frozen", ("test_set_trainable",),
           {_ST: make_set_trainable(bias_takes_bn_weight=True)}, "a BatchNorm weight .γ. stays frozen"),
    Clause(_ST, "plus every parameter of model.classifier", ("test_set_trainable",),
           {_ST: make_set_trainable(last_weight_only=True)}, "trains whole, in every mode"),
    Clause(_ST, "change only requires_grad (adding, replacing or removing a parameter fails)",
           ("test_set_trainable",), {_ST: set_trainable_frozen_copies}, "must not add, replace or remove"),
    Clause(_ST, "The number of trainable parameters (elements, an int) in model after the call",
           ("test_set_trainable",), {_ST: make_set_trainable(count_all=True)}, "every parameter of the model"),
    Clause(_ST, "The number of trainable parameters (elements, an int) in model after the call",
           ("test_set_trainable",), {_ST: make_set_trainable(count_tensors=True)},
           "number of trainable parameter tensors", label="count-of-tensors"),
    Clause(_ST, "The number of trainable parameters (elements, an int) in model after the call",
           ("test_set_trainable",), {_ST: set_trainable_float_count}, "returned a float", label="count-as-float"),
    Clause(_ST, "never by position or count: it must work on any TransferCNN, of any width or depth",
           ("test_set_trainable",), {_ST: make_set_trainable(remembered_count=COUNTS_OF_THE_COURSE_CNN)},
           "not a number remembered"),
    Clause(_ST, "ValueError: for any other mode", ("test_set_trainable_errors",),
           {_ST: make_set_trainable(accept_unknown=True)}, "must raise ValueError"),
    Clause(_ST, "ValueError: for any other mode", ("test_set_trainable_errors",),
           {_ST: make_set_trainable(type_error=True)}, "raised TypeError", label="type-error"),
    Clause(_ST, "the message lists the four valid modes", ("test_set_trainable_errors",),
           {_ST: make_set_trainable(terse_error=True)}, "list the four valid modes"),
    Clause(_PB, _LAYOUT, ("test_pack_bits",), {_PB: make_pack_bits(msb_first=True)}, "most significant bit first"),
    Clause(_PB, _LAYOUT, ("test_pack_bits",), {_PB: make_pack_bits(reverse_bytes=True)}, "bytes are in reverse order",
           label="reversed-bytes"),
    Clause(_PB, _LAYOUT, ("test_pack_bits",), {_PB: make_pack_bits(strided=True)}, "not \\(8, -1\\)",
           label="strided-bytes"),
    Clause(_PB, "flattened in row-major order", ("test_pack_bits",), {_PB: make_pack_bits(column_major=True)},
           "flattened in another order"),
    Clause(_PB, "the unused high bits of the last byte are 0", ("test_pack_bits",), {_PB: make_pack_bits(pad_value=1)},
           "unused high bits of the last byte must be 0"),
    Clause(_PB, "the unused high bits of the last byte are 0", ("test_pack_bits",),
           {_PB: make_pack_bits(pad_front=True)}, "padding went before the elements", label="padding-in-front"),
    Clause(_PB, "A flat torch.uint8 tensor of ceil(n / 8) bytes", ("test_pack_bits",),
           {_PB: make_pack_bits(drop_tail=True)}, "the last, partly used byte must be kept"),
    Clause(_PB, "Pack a boolean tensor 8 elements to a byte", ("test_pack_bits",),
           {_PB: make_pack_bits(one_per_byte=True)}, "one byte per element"),
    Clause(_PB, "A flat torch.uint8 tensor", ("test_pack_bits",), {_PB: make_pack_bits(out_dtype=torch.int64)},
           "return a torch.uint8 tensor", label="uint8"),
    Clause(_PB, _LARGE, ("test_pack_bits",), {_PB: by_size(make_pack_bits(msb_first=True), pack_ok)},
           "drawn at grading time.*most significant bit first", label="msb-first-on-large-masks"),
    Clause(_PB, "ValueError: if mask is not a bool tensor", ("test_pack_bits_errors",),
           {_PB: make_pack_bits(check_dtype=False)}, "raise ValueError"),
    Clause(_UB, "element 8k + j is bit j of byte k", ("test_unpack_bits",), {_UB: make_unpack_bits(msb_first=True)},
           "read from bit 7 - j"),
    Clause(_UB, "element 8k + j is bit j of byte k", ("test_unpack_bits",),
           {_UB: make_unpack_bits(reverse_bytes=True)}, "bytes were read in reverse order", label="unpack-reversed"),
    Clause(_UB, "element 8k + j is bit j of byte k", ("test_unpack_bits",), {_UB: make_unpack_bits(strided=True)},
           "not its transpose", label="unpack-strided"),
    Clause(_UB, "element 8k + j is bit j of byte k", ("test_unpack_bits",),
           {_UB: by_size(make_unpack_bits(msb_first=True), unpack_ok)}, "read from bit 7 - j",
           label="unpack-msb-first-on-large-masks"),
    Clause(_UB, "A flat torch.bool tensor of numel elements", ("test_unpack_bits",),
           {_UB: make_unpack_bits(from_end=True)}, "not the last numel"),
    Clause(_UB, "bits beyond numel in its last byte may hold anything and are ignored", ("test_unpack_bits",),
           {_UB: make_unpack_bits(keep_tail=True)}, "return exactly numel elements"),
    Clause(_UB, "A flat torch.bool tensor", ("test_unpack_bits",), {_UB: make_unpack_bits(out_dtype=torch.uint8)},
           "return a torch.bool tensor", label="unpack-bool"),
    Clause(_UB, "ValueError: if packed is not uint8", ("test_unpack_bits",), {_UB: make_unpack_bits(check_dtype=False)},
           "int64 tensor returned normally"),
    Clause(_UB, "or holds fewer than numel bits", ("test_unpack_bits",), {_UB: make_unpack_bits(check_size=False)},
           "with numel=17 returned normally"),
    Clause(_RB, "the gradient is that of torch.relu (grad * (x > 0), so 0 where x == 0)", ("test_relu_1bit",),
           {_RB: make_relu(mask_ge=True)}, "not x >= 0"),
    Clause(_RB, "the output must be attached to the graph", ("test_relu_1bit",), {_RB: relu_detached}, "attached|graph"),
    Clause(_RB, "torch.relu(x) (same shape and dtype)", ("test_relu_1bit",), {_RB: relu_in_float32}, "dtype"),
    Clause(_RB, "saves **only** pack_bits(x > 0)", ("test_relu_1bit_memory",), {_RB: torch.relu}, "torch.relu keeps"),
    Clause(_RB, "Saving the output, the input, or a bool mask (a byte per element) would all be correct and all miss "
                "the point", ("test_relu_1bit_memory",), {_RB: make_relu(save="output")}, "torch.relu keeps"),
    Clause(_RB, "exactly one tensor is saved with ctx.save_for_backward", ("test_relu_1bit_memory",),
           {_RB: make_relu(save="packed+output")}, "torch.relu keeps"),
    Clause(_RB, "the saved bytes must be exactly $\\lceil n/8 \\rceil$", ("test_relu_1bit_memory",),
           {_RB: make_relu(save="bool")}, "a byte per element"),
    Clause(_RB, "backward may use only the saved mask", ("test_relu_1bit_memory",), {_RB: make_relu(attr="x")},
           "not x or the output kept some other way"),
    Clause(_RB, "your process may hold at most the packed mask, with 1 MiB of slack", ("test_relu_1bit_memory",),
           {_RB: relu_by_size(make_relu(save="bool"))}, "a bool mask .* exactly the packed mask"),
    Clause(_RB, "and so must its gradient", ("test_relu_1bit_memory",), {_RB: relu_by_size(_PassThrough.apply)},
           "the gradient of relu_1bit .* differs"),
]

test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
    test_contract_covers_every_graded_cell = contract_tests(CHAPTER, CONTRACT, namespace, CHECKS, globals())
