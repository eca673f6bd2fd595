"""Hidden tests of chapter 4 (partial training), one graded cell per property.

``set_trainable`` (``test_set_trainable``) runs on TransferCNN variants of other widths, depths and
strides (one of them drawn at grading time), and on a model whose blocks are anonymous
``nn.Sequential(nn.Conv2d, nn.BatchNorm2d, nn.ReLU)`` (BatchNorm found by type, not by attribute
name), through a sequence of modes on the same model (each call must also freeze what the previous
one trained); the returned count must be the real one. What trains is read off the judge's own
parameter tensors (sent with the model in one message), and one backward pass driven by the judge
(``probes.ch01_sgd_steps``, learning rate 0) must reach exactly those tensors: a shadowed
``named_parameters`` or swapped-in parameters change nothing. ``test_set_trainable_errors``: the
ValueError for unknown modes (near misses included), whose message lists the four modes (the docstring
says so).

``pack_bits`` / ``unpack_bits`` are compared with ``numpy.packbits(..., bitorder="little")``, on fixed
masks, one whose shape (up to 64 × 64), density and values are drawn at grading time, and a 2-D one of 2^20
to 15 × 2^20 elements (the sizes ``relu_1bit`` is measured on, and below) whose shape, density and values are
drawn at grading time: made in the worker from a seed (``x < threshold``), its result compared at the first
and last 8 bytes and 256 bytes drawn at grading time (``probes.ch04_entries`` fetches only those), so code
right only on small masks fails where it is wrong; a wrong layout is matched
against the plausible ones (most significant bit first, bytes reversed, padding before the elements,
the 8 elements of a byte taken with a stride, a mask flattened in another order) to name the one
that was made. The buffers given to ``unpack_bits`` carry garbage in their unused tail bits; it must
refuse a buffer that is not uint8 or holds too few bits (ValueError). ``test_pack_bits_errors``: the
ValueError for masks that are not bool.

``relu_1bit`` (``test_relu_1bit``) is compared with plain ``torch.relu`` autograd (exact zeros of both
signs included). ``test_relu_1bit_memory`` is decided from outside the student's process
(``grader.resources.Meter``): one call on a 2-D float32 input of 12 × 2^20 to 15 × 2^20 elements whose
shape (last dimension 1024 to 4096) and values are drawn at grading time (48 to 60 MiB, made in the
worker from a seed and booked at its size), input and output released, may keep the packed mask plus
1 MiB (and the few KiB it returns); a bool mask keeps 8 times the mask and fp32 copies 32 times, at
least 9 MiB over the bound across the range, more than ballast can hide (5 MiB). That very call's
values are the judge's own on the same seeded input: the output at 64 entries drawn now and its rows
summed with positive per-column weights drawn now; the gradient through a per-row leaf the judge adds
to the input (its ``.grad`` is the input gradient summed per row), once back from the drawn entries
and once from the weighted row sums (a single wrong mask bit moves its row's sum). The values cell's
known mistake (mask x >= 0: a float32 normal sample of this size may hold an exact 0) is accepted
here. So code that is honest only at one size, or skips the work when measured, fails where it does.
Only then, on the small inputs of the values cell: the gradient does not change when the input and
output are overwritten between forward and backward (backward uses only what it kept; values compared
in the judge). When the outside reading fails, the saved-bytes probe (``probes.ch04_saved_run``, a
claim measured in the process) on a small input explains what was kept; it decides nothing.
"""
from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import nn

from coursekit.checks import check_close, check_equal, same_close, same_values
from coursekit.transfer import TransferCNN
from grader import probes
from grader.api import fetch, hidden_test
from grader.resources import MiB, Meter, draw, fresh_tensor, mib, new_seed, seeded
from grader.source_policy import Shortcut, SourcePolicy

# The course's TinyTL kernels (kernels.ch05_tinytl) compute what pack_bits, unpack_bits and relu_1bit do
# (pack_mask_*, unpack_mask_*, relu_packed).
SOURCE_POLICY = SourcePolicy(shortcuts=(
    Shortcut(paths=("kernels.ch05_tinytl",),
             instead="write pack_bits, unpack_bits and relu_1bit with torch operations; kernels.ch05_tinytl "
                     "is the course's own answer"),
))

MODES = ("full", "last", "bn+last", "bias+last")
RULES = {
    "full": "every parameter",
    "last": "every parameter of model.classifier and nothing else",
    "bn+last": ("the weight and bias of every BatchNorm layer plus every parameter of model.classifier; "
                "convolution biases stay frozen"),
    "bias+last": ("every parameter named 'bias' (convolution and BatchNorm) plus every parameter of "
                  "model.classifier; BatchNorm weights stay frozen"),
}
LAYOUT_HINT = "element 8k + j of the flattened mask is bit j (value 2**j) of byte k"
TAIL_HINT = "n elements need ceil(n / 8) bytes: the last, partly used byte must be kept"
BYTES_HINT = ("save exactly one thing for backward, pack_bits(x > 0), with ctx.save_for_backward; "
              "a bool mask costs a byte per element, the fp32 input or output 4 bytes")


# --- set_trainable --------------------------------------------------------------------------------
def _plain_model(seed: int) -> TransferCNN:
    """A TransferCNN whose blocks are nn.Sequential(nn.Conv2d, nn.BatchNorm2d, nn.ReLU): PyTorch's
    own layers, named "0", "1", "2"; the second convolution has no bias."""
    model = TransferCNN(widths=(5, 9, 11), strides=(1, 2, 1), num_classes=4, seed=seed)
    torch.manual_seed(seed)
    blocks, c_in = [], 1
    for c_out, stride, bias in ((5, 1, True), (9, 2, False), (11, 1, True)):
        blocks.append(nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=bias),
                                    nn.BatchNorm2d(c_out), nn.ReLU()))
        c_in = c_out
    model.blocks = nn.ModuleList(blocks)
    return model


NORMS_MODEL = "a TransferCNN with an nn.BatchNorm1d block and an nn.BatchNorm3d block after its convolutions"


def _norms_model(seed: int) -> TransferCNN:
    """A TransferCNN(widths=(6, 8), strides=(1, 2)) followed, on its (B, 8, 6, 6) maps of a 12 x 12 input, by a
    block that normalises them with an ``nn.BatchNorm1d`` (as (B, 8, 36)) and one with an ``nn.BatchNorm3d``
    (as (B, 8, 1, 6, 6)): "any BatchNorm" means every dimensionality."""
    model = TransferCNN(widths=(6, 8), strides=(1, 2), num_classes=3, seed=seed)
    torch.manual_seed(seed)
    model.blocks.append(nn.Sequential(nn.Flatten(2), nn.BatchNorm1d(8), nn.Unflatten(2, (6, 6))))
    model.blocks.append(nn.Sequential(nn.Unflatten(2, (1, 6)), nn.BatchNorm3d(8), nn.Flatten(2, 3)))
    for block in list(model.blocks)[-2:]:
        with torch.no_grad():  # away from the identity, so that a wrong flag shows in the backward pass too
            block[1].weight.uniform_(0.5, 1.5)
            block[1].bias.uniform_(-0.5, 0.5)
    return model


def _drawn_model() -> tuple[str, nn.Module]:
    """A TransferCNN whose depth, widths, strides and class count are drawn at grading time."""
    depth = draw(2, 5)
    widths = tuple(draw(3, 24) for _ in range(depth))
    strides = tuple(draw(1, 2) for _ in range(depth))
    classes = draw(2, 9)
    return (f"TransferCNN(widths={widths}, strides={strides}, num_classes={classes}) (drawn at grading time)",
            TransferCNN(widths=widths, strides=strides, num_classes=classes, seed=new_seed()))


def _models() -> dict[str, nn.Module]:
    drawn_name, drawn = _drawn_model()
    return {
        "TransferCNN()": TransferCNN(seed=3),
        "TransferCNN(widths=(8, 12, 20), strides=(2, 1, 1), num_classes=3)":
            TransferCNN(widths=(8, 12, 20), strides=(2, 1, 1), num_classes=3, seed=1),
        "TransferCNN(widths=(6, 10, 14, 18, 22), strides=(1, 2, 1, 2, 1), num_classes=7)":
            TransferCNN(widths=(6, 10, 14, 18, 22), strides=(1, 2, 1, 2, 1), num_classes=7, seed=2),
        "a TransferCNN built from plain nn.Conv2d / nn.BatchNorm2d in nn.Sequential blocks": _plain_model(4),
        NORMS_MODEL: _norms_model(5),
        drawn_name: drawn,
    }


def _expected_flags(model: nn.Module, mode: str) -> dict[str, bool]:
    """Module by module: which of its own parameters ``mode`` trains."""
    flags = {}
    for path, module in model.named_modules():
        in_classifier = path == "classifier" or path.startswith("classifier.")
        is_bn = isinstance(module, nn.modules.batchnorm._BatchNorm)
        for pname, _ in module.named_parameters(recurse=False):
            flags[f"{path}.{pname}" if path else pname] = (
                mode == "full" or in_classifier or (mode == "bn+last" and is_bn)
                or (mode == "bias+last" and pname == "bias"))
    return flags


def _diff_message(model_name: str, mode: str, history: list[str], got: dict, want: dict, before: dict) -> str:
    """What the call got wrong, and the cause: ``before`` holds the flags the parameters had before it."""
    wrongly_on = sorted(n for n in want if got[n][1] and not want[n])
    wrongly_off = sorted(n for n in want if want[n] and not got[n][1])
    parts = [f"set_trainable(model, {mode!r}) on {model_name}"
             + (f" (after the modes {history})" if history else "")]
    if wrongly_on:
        parts.append(f"leaves trainable {', '.join(wrongly_on[:6])}{' ...' if len(wrongly_on) > 6 else ''}")
    if wrongly_off:
        parts.append(f"freezes {', '.join(wrongly_off[:6])}{' ...' if len(wrongly_off) > 6 else ''}")
    hint = f"{mode} trains {RULES[mode]}."
    stale = sorted(n for n in want if before[n] and not want[n])  # what this call had to freeze
    if wrongly_on and wrongly_on == stale:
        hint += (" Nothing that was trainable before the call was frozen: every other parameter must get "
                 "requires_grad=False, whatever it was before the call.")
    elif mode == "bn+last" and wrongly_on and all(n.endswith(".bias") for n in wrongly_on):
        hint += " A convolution bias is not a BatchNorm parameter."
    elif mode == "bias+last" and wrongly_on and all(n.endswith(".weight") for n in wrongly_on):
        hint += " Only parameters whose own name is 'bias' train: a BatchNorm weight (γ) stays frozen."
    elif wrongly_on:
        hint += " Every parameter the rule does not name must get requires_grad=False."
    if any(n.startswith("classifier.") for n in wrongly_off):
        hint += " model.classifier trains whole, in every mode: its weight and its bias."
    if mode == "bn+last" and wrongly_off and model_name == NORMS_MODEL:
        hint += (" Every BatchNorm trains, whatever its dimensionality: nn.BatchNorm1d, nn.BatchNorm2d and "
                 "nn.BatchNorm3d (isinstance of each, or of their common base nn.modules.batchnorm._BatchNorm).")
    elif mode == "bn+last" and wrongly_off and "plain" in model_name:
        hint += " Find BatchNorm layers by type (isinstance), not by attribute name."
    elif mode == "bias+last" and wrongly_off and all(n.endswith(".bias") for n in wrongly_off):
        hint += " Every bias trains, BatchNorm biases (β) and convolution biases alike: select by the name 'bias'."
    return "; ".join(parts) + ". " + hint


def _count_hint(count: int, real: int, model: nn.Module, mode: str, flags: dict[str, bool]) -> str:
    """Why the returned count is wrong, when it is a known wrong number."""
    params = dict(model.named_parameters())
    course = TransferCNN(seed=0)
    if count == sum(p.numel() for p in params.values()):
        return ("that is every parameter of the model: count only the elements of the parameters that require "
                "grad after the call")
    if count == sum(1 for n in flags if flags[n]):
        return "that is the number of trainable parameter tensors: count their elements (p.numel()), summed"
    if count == sum(course.get_parameter(n).numel() for n, on in _expected_flags(course, mode).items() if on):
        return ("that is the count of the course's default TransferCNN: count on the model you are given, not a "
                "number remembered for one architecture")
    return ("return the number of elements of the parameters that now require grad, counted on the model, not a "
            "number remembered for one architecture")


@hidden_test("test_set_trainable")
def check_set_trainable(nb):
    sequence = ["bias+last", "full", "bn+last", "last", "bias+last", "full", "bn+last"]
    for model_name, model in _models().items():
        names = [n for n, _ in model.named_parameters()]
        numel = {n: p.numel() for n, p in model.named_parameters()}
        x = torch.randn(2, 1, 12, 12, generator=torch.Generator().manual_seed(len(names)))
        with torch.no_grad():
            g = torch.randn(copy.deepcopy(model)(x).shape, generator=torch.Generator().manual_seed(1))
        sent = nb.put((model, list(model.parameters())))  # one message: the tensors are the model's own
        handle = sent[0]
        named = {n: sent[1][i] for i, n in enumerate(names)}  # handles: indexed, not iterated
        before = {n: row["requires_grad"] for n, row in zip(names, fetch(nb.apply(probes.tensor_states, sent[1])))}
        for i, mode in enumerate(sequence):
            count = fetch(nb.set_trainable(handle, mode))
            rows = fetch(nb.apply(probes.tensor_states, sent[1]))
            got = {n: [numel[n], row["requires_grad"]] for n, row in zip(names, rows)}
            want = _expected_flags(model, mode)
            run = fetch(nb.apply(probes.ch01_sgd_steps, handle, named, x, g, steps=1, lr=0.0, weight_decay=0.0))
            if any(got[n][1] != want[n] for n in want):
                if "error" not in run and "?" in run["updated"][0]:  # the flags were set on tensors not the model's
                    raise AssertionError(
                        f"after set_trainable(model, {mode!r}) on {model_name} (after the modes {sequence[:i]}), "
                        "one backward pass trains tensors the model did not have when it was passed in: "
                        "set_trainable only changes requires_grad of the model's own parameters; it must not add, "
                        "replace or remove any")
                raise AssertionError(_diff_message(model_name, mode, sequence[:i], got, want, before))
            before = {n: got[n][1] for n in names}
            if "error" in run:
                raise AssertionError(f"after set_trainable(model, {mode!r}) on {model_name}: {run['error']}")
            check_equal(run["updated"][0], sorted(n for n in want if want[n]),
                        f"the parameters one backward pass trains after set_trainable(model, {mode!r}) on "
                        f"{model_name}", "set_trainable only changes requires_grad of the model's own parameters; "
                        "it must not add, replace or remove any ('?' is a tensor the model did not have)")
            real = sum(numel[n] for n in want if want[n])
            if not isinstance(count, int) or isinstance(count, bool):
                raise AssertionError(f"set_trainable(model, {mode!r}) returned a {type(count).__name__}; return "
                                     f"the number of trainable parameters as an int ({real:,} here)")
            if count != real:
                check_equal(count, real, f"the count returned by set_trainable(model, {mode!r}) on {model_name}",
                            _count_hint(count, real, model, mode, want))


@hidden_test("test_set_trainable_errors")
def check_set_trainable_errors(nb):
    for bad in ("lora", "bias", "last+bn"):
        err = fetch(nb.apply(probes.raised_message, nb.set_trainable, TransferCNN(widths=(4,), strides=(1,)), bad))
        if err is None or "ValueError" not in err["types"]:
            what = "returned normally" if err is None else f"raised {err['types'][0]}"
            raise AssertionError(f"set_trainable(model, {bad!r}) {what}: an unknown mode must raise ValueError "
                                 "(check the mode before changing anything)")
        missing = [m for m in MODES if m not in err["message"]]
        if missing:
            raise AssertionError(f"the ValueError for mode {bad!r} says {err['message']!r}: the docstring asks the "
                                 f"message to list the four valid modes ({', '.join(MODES)}); missing "
                                 f"{', '.join(missing)}")


# --- pack_bits / unpack_bits -----------------------------------------------------------------------
SHAPES = [(1,), (7,), (8,), (9,), (61,), (1000,), (3, 5, 7), (2, 1, 4, 4), (37, 53)]


def _mask(shape, seed: int, p: float = 0.5) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < p


def _reference_pack(mask: torch.Tensor, bitorder: str = "little") -> torch.Tensor:
    return torch.from_numpy(np.packbits(mask.reshape(-1).numpy().astype(np.uint8), bitorder=bitorder).copy())


def _drawn_mask() -> tuple[tuple[int, int], torch.Tensor]:
    """A random mask whose shape (up to 64 × 64), density and values are drawn at grading time."""
    shape = (draw(1, 64), draw(1, 64))
    return shape, _mask(shape, seed=new_seed(), p=draw(1, 99) / 100)


LARGE_LOW, LARGE_HIGH = 1 << 20, 15 << 20  # elements of the large mask: drawn at grading time in this range
LARGE_COLS = (1, 4096)  # its last dimension, drawn too
LARGE_SAMPLES = 256  # bytes drawn at grading time where the large case is compared (besides the first and last 8)


def _large_case() -> dict:
    """A 2-D mask of 2^20 to 15 × 2^20 elements whose shape, density and values are drawn at grading time
    (``x < threshold`` for a standard-normal ``x`` made from a seed drawn now, so that the student's process can
    make the very same mask: no mask of megabytes travels), and the bytes where it is compared: the first and
    last 8 and ``LARGE_SAMPLES`` drawn now."""
    cols = draw(*LARGE_COLS)
    rows = draw(-(-LARGE_LOW // cols), LARGE_HIGH // cols)
    threshold = float(torch.special.ndtri(torch.tensor(draw(1, 99) / 100, dtype=torch.float64)))
    seed = new_seed()
    nbytes = math.ceil(rows * cols / 8)
    drawn = torch.randint(0, nbytes, (LARGE_SAMPLES,), generator=torch.Generator().manual_seed(new_seed()))
    return {"shape": (rows, cols), "seed": seed, "threshold": threshold,
            "mask": seeded((rows, cols), seed=seed) < threshold,
            "bytes": torch.cat([torch.arange(8), torch.arange(nbytes - 8, nbytes), drawn]).unique(),  # sorted
            "where": f"a random mask of shape ({rows}, {cols}) ({rows * cols} elements, drawn at grading time)"}


def _settle_allocator(nb) -> None:
    """Run in-kernel (``LocalNamespace``), the first memory reading pins glibc's mmap threshold; taken before the
    large mask's megabytes come and go, it keeps glibc from raising that threshold, so the memory cells' later
    readings in the same process stay exact. In the judge, one reading from outside, unused."""
    nb.memory()


def _large_remote(nb, case: dict):
    """The large case's mask, made in the student's process from its seed."""
    return fresh_tensor(nb, case["shape"], requires_grad=False, seed=case["seed"]).lt(case["threshold"])


def _pack_cases(nb):
    """(what, the mask, what is sent for it, the bytes compared: None for all)."""
    for i, shape in enumerate(SHAPES):
        mask = _mask(shape, seed=100 + i)
        yield f"a random mask of shape {shape}", mask, mask, None
    yield "61 True values", torch.ones(61, dtype=torch.bool), torch.ones(61, dtype=torch.bool), None
    for j in (0, 7, 8):
        one_hot = torch.zeros(9, dtype=torch.bool)
        one_hot[j] = True
        yield f"9 elements with only element {j} True", one_hot, one_hot, None
    shape, mask = _drawn_mask()
    yield f"a random mask of shape {shape} (drawn at grading time)", mask, mask, None
    _settle_allocator(nb)
    case = _large_case()
    yield (f"{case['where']}, compared at {case['bytes'].numel()} bytes (the first and last 8, the others drawn at "
           "grading time)", case["mask"], _large_remote(nb, case), case["bytes"])


def _bits(mask: torch.Tensor, order: str = "row") -> torch.Tensor:
    """The mask flattened (row-major, or with its dimensions reversed: column-major) as uint8 0/1."""
    if order == "column":
        mask = mask.permute(*reversed(range(mask.dim())))
    return mask.reshape(-1).to(torch.uint8)


def _pack_as(bits: torch.Tensor, lsb_first: bool = True, pad_at_end: bool = True, strided: bool = False):
    """Pack 0/1 values 8 to a byte the way a plausible implementation would."""
    flat = bits.numpy().astype(np.uint8)
    zeros = np.zeros(-flat.size % 8, dtype=np.uint8)
    padded = np.concatenate([flat, zeros] if pad_at_end else [zeros, flat])
    if strided:  # byte k holds elements k, k + nbytes, k + 2 nbytes, ...
        padded = padded.reshape(8, -1).T.reshape(-1)
    return torch.from_numpy(np.packbits(padded, bitorder="little" if lsb_first else "big"))


MSB_HINT = ("element 8k + j went to bit 7 - j (most significant bit first, numpy.packbits' default "
            "bitorder='big'); it goes to bit j, value 2**j, so that element 8k is the lowest bit")
BYTE_ORDER_HINT = ("the bytes are in reverse order: byte k holds elements 8k to 8k + 7, so the first byte holds the "
                   "first eight elements (do not flip)")
PAD_START_HINT = ("the padding went before the elements: pad the flattened mask at its end, so that the unused bits "
                  "are the high bits of the last byte")
STRIDED_HINT = ("byte k holds elements k, k + n_bytes, k + 2 n_bytes, ...: the eight elements of byte k are the "
                "consecutive 8k to 8k + 7, so reshape the padded mask to (-1, 8), not (8, -1)")
ORDER_HINT = ("the mask was flattened in another order (its last dimension was not the fastest): flatten it "
              "row-major, mask.reshape(-1), as a contiguous tensor is laid out")


def _layouts(mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Hint -> the bytes a plausible wrong layout gives for ``mask``."""
    bits = _bits(mask)
    layouts = {MSB_HINT: _pack_as(bits, lsb_first=False), BYTE_ORDER_HINT: _pack_as(bits).flip(0),
               PAD_START_HINT: _pack_as(bits, pad_at_end=False), STRIDED_HINT: _pack_as(bits, strided=True)}
    if mask.dim() > 1:
        layouts[ORDER_HINT] = _pack_as(_bits(mask, "column"))
    return layouts


def _byte_bits(byte: int) -> str:
    return f"{byte} (bits {byte:08b}, bit 7 first)"


@hidden_test("test_pack_bits")
def check_pack_bits(nb):
    wrong = []  # (what differs, the known mistakes that give exactly this output, the generic hint)
    for where, mask, sent, picks in _pack_cases(nb):
        n = mask.numel()
        nbytes = math.ceil(n / 8)
        picks = torch.arange(nbytes) if picks is None else picks
        got = fetch(nb.apply(probes.ch04_entries, nb.pack_bits(sent), picks))
        del sent
        if got["dtype"] != str(torch.uint8):
            raise AssertionError(f"pack_bits({where}) returned {got['dtype'] or got['type']}: return a torch.uint8 "
                                 "tensor")
        if tuple(got["shape"]) != (nbytes,):
            size = math.prod(got["shape"])
            if size == n // 8 and n % 8:
                hint = TAIL_HINT
            elif size == n and n > 1:
                hint = "that is one byte per element: pack eight elements into each byte"
            else:
                hint = "return a flat tensor of ceil(n / 8) bytes"
            raise AssertionError(f"pack_bits({where}) has shape {tuple(got['shape'])}, expected ({nbytes},). {hint}")
        want = _reference_pack(mask)
        values = got["values"]
        if not same_values(values, want[picks]):
            differ = picks[values != want[picks]]
            k = int(differ[0])
            used = (1 << (n % 8 or 8)) - 1  # the bits of the last byte that hold elements
            tail_only = differ.tolist() == [nbytes - 1] and int(values[-1]) & used == int(want[-1])
            causes = (["the unused high bits of the last byte must be 0"] if tail_only else
                      [cause for cause, wrong in _layouts(mask).items() if same_values(values, wrong[picks])])
            wrong.append((f"pack_bits({where}): byte {k} is {_byte_bits(int(values[picks == k][0]))}, expected "
                          f"{_byte_bits(int(want[k]))}.", causes,
                          f"{LAYOUT_HINT}: byte {k} holds elements {8 * k} to {min(8 * k + 7, n - 1)}, "
                          f"{_bits(mask)[8 * k:8 * k + 8].tolist()} (element {8 * k} first)"))
    _report(wrong)


def _report(wrong: list[tuple[str, list[str], str]]) -> None:
    """Fail on the first wrong case whose output one known mistake explains (several explain the small
    cases alike: one element in a byte), else on the first wrong case, with its generic hint."""
    if not wrong:
        return
    what, causes, generic = next((w for w in wrong if len(w[1]) == 1), wrong[0])
    hint = " Or: ".join(causes) if causes else generic
    raise AssertionError(f"{what} {hint}")


@hidden_test("test_pack_bits_errors")
def check_pack_bits_errors(nb):
    for bad, what in ((torch.ones(12), "a float tensor"), (torch.ones(12, dtype=torch.uint8), "a uint8 tensor"),
                      (torch.arange(12), "an int64 tensor")):
        err = fetch(nb.apply(probes.raised_message, nb.pack_bits, bad))
        if err is None or "ValueError" not in err["types"]:
            got = "returned normally" if err is None else f"raised {err['types'][0]}"
            raise AssertionError(f"pack_bits on {what} {got}: only torch.bool masks are accepted; check the dtype "
                                 "and raise ValueError")


def _with_garbage_tail(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Set every unused bit of the last byte to 1."""
    packed = packed.clone()
    if n % 8:
        packed[-1] |= 0xFF ^ ((1 << (n % 8)) - 1)
    return packed


def _unpack_as(packed: torch.Tensor, lsb_first: bool = True, strided: bool = False) -> torch.Tensor:
    """All 8 × n_bytes bits of ``packed`` in the order a plausible implementation reads them."""
    bits = np.unpackbits(packed.numpy(), bitorder="little" if lsb_first else "big").reshape(-1, 8)
    return torch.from_numpy((bits.T if strided else bits).reshape(-1).astype(bool))


def _readings(packed: torch.Tensor, n: int) -> dict[str, torch.Tensor]:
    """Hint -> what a plausible wrong reading of ``packed`` gives for ``n`` elements."""
    return {
        "element 8k + j was read from bit 7 - j (most significant bit first); it is bit j, value 2**j: "
        "(byte >> j) & 1": _unpack_as(packed, lsb_first=False)[:n],
        "the bytes were read in reverse order: elements 8k to 8k + 7 come from byte k, the first byte first":
            _unpack_as(packed.flip(0))[:n],
        STRIDED_HINT.replace("reshape the padded mask to (-1, 8), not (8, -1)",
                             "lay the bits out as (n_bytes, 8) and flatten that, not its transpose"):
            _unpack_as(packed, strided=True)[:n],
        "the elements are the first numel bits; the unused bits are the high bits of the last byte, at the end: "
        "keep bits[:numel], not the last numel": _unpack_as(packed)[-n:],
    }


def _refused(nb, packed: torch.Tensor, numel: int, why: str) -> None:
    err = fetch(nb.apply(probes.raised_message, nb.unpack_bits, packed, numel))
    if err is None or "ValueError" not in err["types"]:
        got = "returned normally" if err is None else f"raised {err['types'][0]}"
        raise AssertionError(f"unpack_bits on {why} {got}: the docstring asks for ValueError when packed is not "
                             "uint8 or holds fewer than numel bits (8 per byte); check before unpacking")


@hidden_test("test_unpack_bits")
def check_unpack_bits(nb):
    cases = [(f"a random mask of {math.prod(s)} elements", _mask(s, seed=200 + i), None)
             for i, s in enumerate(SHAPES)]
    cases.append(("61 False values", torch.zeros(61, dtype=torch.bool), None))
    shape, mask = _drawn_mask()
    cases.append((f"a random mask of shape {shape} (drawn at grading time)", mask, None))
    _settle_allocator(nb)
    case = _large_case()  # compared at the elements of whole bytes (of the last, those that exist)
    elements = (8 * case["bytes"][:, None] + torch.arange(8)).reshape(-1)
    elements = elements[elements < case["mask"].numel()]
    cases.append((f"{case['where']}, compared at {elements.numel()} elements (those of the first and last 8 bytes "
                  "and of bytes drawn at grading time)", case["mask"], elements))
    wrong = []  # (what differs, the known mistakes that give exactly this output, the generic hint)
    for where, mask, picks in cases:
        n = mask.numel()
        picks = torch.arange(n) if picks is None else picks
        packed = _with_garbage_tail(_reference_pack(mask), n)
        got = fetch(nb.apply(probes.ch04_entries, nb.unpack_bits(packed, n), picks))
        want = mask.reshape(-1)
        if got["dtype"] != str(torch.bool):
            raise AssertionError(f"unpack_bits for {where} returned {got['dtype'] or got['type']}: return a "
                                 "torch.bool tensor")
        if tuple(got["shape"]) != (n,):
            raise AssertionError(f"unpack_bits(packed, {n}) has shape {tuple(got['shape'])}, expected ({n},): return "
                                 "exactly numel elements (the tail bits of the last byte are not elements)")
        values = got["values"]
        if not same_values(values, want[picks]):
            j = int((values != want[picks]).nonzero()[0])
            i = int(picks[j])
            wrong.append((f"unpack_bits for {where} (unused tail bits set to 1): element {i} is {bool(values[j])}, "
                          f"expected {bool(want[i])}.",
                          [cause for cause, reading in _readings(packed, n).items()
                           if same_values(values, reading[picks])],
                          "read element 8k + j from bit j of byte k, (byte >> j) & 1, for every k"))
    _report(wrong)
    packed = _reference_pack(_mask((17,), seed=250))  # 3 bytes, 24 bits
    _refused(nb, packed.long(), 17, "an int64 tensor")
    _refused(nb, packed.float(), 17, "a float tensor")
    _refused(nb, packed[:2], 17, "2 bytes (16 bits) with numel=17")
    _refused(nb, packed[:0], 1, "0 bytes with numel=1")


# --- relu_1bit --------------------------------------------------------------------------------------
def _relu_input(shape, dtype, seed: int) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    flat = x.view(-1)
    flat[::5] = 0.0  # torch.relu's gradient at exactly 0 is 0
    flat[1::11] = -0.0
    return x


def _relu_reference(x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    y = torch.relu(x)
    y.backward(g)
    return y.detach(), x.grad


RELU_CASES = [((1,), torch.float32), ((7,), torch.float32), ((61,), torch.float64), ((1000,), torch.float32),
              ((37, 53), torch.float32), ((2, 3, 5, 7), torch.float64), ((4, 16, 8, 8), torch.float32)]


def _relu_case(i: int, shape, dtype):
    x = _relu_input(shape, dtype, seed=300 + i)
    g = torch.randn(shape, generator=torch.Generator().manual_seed(400 + i), dtype=dtype)
    return x, g, f"relu_1bit on a {dtype} input of shape {shape}"


def _relu_call(nb, x, g, where: str, overwrite: bool = False, y_ref: torch.Tensor | None = None) -> dict:
    """One forward and backward in the student's process; with ``y_ref``, the output must equal it."""
    got = fetch(nb.apply(probes.ch04_saved_run, nb.relu_1bit, x, g, overwrite=overwrite))
    if got["y"] is None:
        raise AssertionError(f"{where} did not return a tensor")
    if y_ref is not None:
        check_close(got["y"], y_ref, f"the output of {where}", "the forward value is torch.relu(x), in x's dtype",
                    atol=0, rtol=0)
    if not got["attached"]:
        raise AssertionError(f"{where}: the output is not attached to the autograd graph; return "
                             "YourFunction.apply(x)")
    if got["dx"] is None:
        raise AssertionError(f"{where}: no gradient reached x; backward must return the input gradient")
    return got


@hidden_test("test_relu_1bit")
def check_relu_1bit(nb):
    for i, (shape, dtype) in enumerate(RELU_CASES):
        x, g, where = _relu_case(i, shape, dtype)
        y_ref, dx_ref = _relu_reference(x, g)
        got = _relu_call(nb, x, g, where, y_ref=y_ref)
        dx = got["dx"]
        if isinstance(dx, torch.Tensor) and dx.shape == x.shape and not bool(((dx != dx_ref) & (x != 0)).any()):
            hint = "torch.relu's gradient is grad * (x > 0): 0 where x == 0, so the mask is x > 0, not x >= 0"
        else:
            hint = "the gradient is grad where x > 0 and 0 elsewhere"
        check_close(dx, dx_ref, f"the gradient of {where}", hint, atol=0, rtol=0)


RELU_LOW, RELU_HIGH = 12 << 20, 15 << 20  # elements of the measured call: drawn at grading time in this range
RELU_COLS = (1024, 4096)  # its last dimension, drawn too
RELU_SAMPLES = 64  # output and gradient entries compared one by one on the measured call
RELU_SLACK = MiB  # what the measured call may keep beyond the packed mask


def _saved_problem(got: dict, n: int, where: str, element_size: int) -> str | None:
    """What the saved-bytes probe says is wrong with what ``got`` saved for backward (None: the packed mask
    alone, through ctx.save_for_backward). A claim measured in the student's process."""
    floating = [s for s in got["saved"] if s["floating"]]
    if not floating and got["activation_bytes"] == math.ceil(n / 8):
        return None
    kept = ", ".join(f"{s['dtype']} {tuple(s['shape'])} ({s['nbytes']:,} B)" for s in got["saved"]) or "nothing"
    extra = (" Nothing was saved with ctx.save_for_backward: keeping the mask (or x) as a ctx attribute "
             "hides it from autograd's saved-tensor hooks, and from this measurement."
             if not got["saved"] else "")
    return (f"{where} saved {got['activation_bytes']:,} bytes for backward ({kept}); the packed mask of {n} "
            f"elements is exactly {math.ceil(n / 8)} bytes, torch.relu keeps {n * element_size:,}. "
            f"{BYTES_HINT}.{extra}")


def _overwrite_problem(nb, x, g, where: str, dx) -> str | None:
    """Whether the gradient changes when x and the output are overwritten between forward and backward
    (compared with the student's own gradient ``dx``, right or wrong: the values cell grades that)."""
    again = _relu_call(nb, x, g, where + " with x and the output overwritten between forward and backward",
                       overwrite=True)
    if same_values(again["dx"], dx):
        return None
    return (f"the gradient of {where} changes when x and the output are overwritten between forward and backward "
            "(compared with your gradient without the overwrite): backward must use only the packed mask saved "
            "for it, not x or the output kept some other way (a ctx attribute)")


@hidden_test("test_relu_1bit_memory")
def check_relu_1bit_memory(nb):
    meter = Meter(nb)  # first: nothing the student's code holds goes unaccounted
    # Decided from outside the process, on a call whose size is drawn now and whose values are checked.
    _check_relu_memory(nb, meter)
    # Backward uses only what forward kept for it: its gradient does not change when x and the output are
    # overwritten in between (values, compared in the judge).
    for i, (shape, dtype) in enumerate(RELU_CASES):
        x, g, where = _relu_case(i, shape, dtype)
        got = _relu_call(nb, x, g, where)
        problem = _overwrite_problem(nb, x, g, where, got["dx"])
        if problem:
            raise AssertionError(problem)


def _measured_case() -> dict:
    """The measured call's input, drawn now: its shape (2-D, 12 × 2^20 to 15 × 2^20 elements), seeds, the
    per-column weights of the output's row sums and the sampled entries."""
    cols = draw(*RELU_COLS)
    rows = draw(-(-RELU_LOW // cols), RELU_HIGH // cols)
    seeds = [new_seed() for _ in range(4)]
    weights = seeded((cols,), seed=seeds[1]).abs() + 0.5  # positive: every flipped mask bit moves its row's sum
    picks = torch.randint(0, rows * cols, (RELU_SAMPLES,), generator=torch.Generator().manual_seed(seeds[2]))
    upstream = seeded((RELU_SAMPLES,), seed=seeds[3])
    return {"shape": (rows, cols), "seed": seeds[0], "weights": weights, "picks": picks, "upstream": upstream}


def _measured_reference(case: dict, at_zero: bool = False) -> dict:
    """The judge's own values on the measured input: per row, the weighted sum of relu(x) and of its gradient
    mask (what back-propagating the row sums leaves in a per-row leaf added to x), and at the sampled entries
    the output and the gradient back from them (per row). ``at_zero``: the gradient of the values cell's known
    mistake, the mask x >= 0 (a float32 normal sample of this size may hold an exact 0)."""
    rows, cols = case["shape"]
    x = seeded(case["shape"], seed=case["seed"])
    w = case["weights"]

    def mask(t: torch.Tensor) -> torch.Tensor:
        return (t >= 0 if at_zero else t > 0).double()

    out_rows = torch.empty(rows, dtype=torch.float64)
    grad_rows = torch.empty(rows, dtype=torch.float64)
    for a in range(0, rows, 1024):  # float64 a block of rows at a time
        block = x[a:a + 1024].double()
        out_rows[a:a + 1024] = block.clamp_min(0) @ w.double()
        grad_rows[a:a + 1024] = mask(block) @ w.double()
    flat = x.reshape(-1)
    picked = flat[case["picks"]]
    grad_picks = torch.zeros(rows, dtype=torch.float64).index_add_(
        0, case["picks"] // cols, mask(picked) * case["upstream"].double())
    return {"samples": picked.clamp_min(0), "out_rows": out_rows, "grad_rows": grad_rows, "grad_picks": grad_picks}


def _relu_measured_call(x, row_leaf, weights, picks, relu):
    """The measured call: relu of x plus a per-row leaf (0, requires grad: its gradient is the row sums of the
    input gradient); returns the output's rows summed with per-column weights, and the output at the sampled
    entries (the output itself, and x plus the leaf, are released)."""
    y = relu(x.add(row_leaf))
    return y.mul(weights).sum(1), y.reshape(-1)[picks]


def _check_relu_memory(nb, meter: Meter) -> None:
    """What the process holds between forward and backward, read from outside it, on an input drawn now; the
    output and gradient of that very call are checked against the judge's own."""
    # First calls: lazily loaded code and caches, on the measured call's own path.
    rows_sum, samples = _relu_measured_call(fresh_tensor(nb, (3, 9), requires_grad=False),
                                            nb.put(torch.zeros(3, 1, requires_grad=True)), nb.put(torch.ones(9)),
                                            nb.put(torch.tensor([0, 5, 26])), nb.relu_1bit)
    samples.backward(nb.put(torch.ones(3)), retain_graph=True)
    rows_sum.sum().backward()
    del rows_sum, samples

    case = _measured_case()
    rows, cols = case["shape"]
    n = rows * cols
    row_leaf = meter.put(torch.zeros(rows, 1, requires_grad=True))  # the judge's: kept by it through the call
    held, (rows_sum, samples) = meter.held_by(
        lambda x, w, picks: _relu_measured_call(x, row_leaf, w, picks, nb.relu_1bit),
        inputs=lambda: [meter.tensor(case["shape"], requires_grad=False, seed=case["seed"]),
                        meter.put(case["weights"]), meter.put(case["picks"])])
    what = f"relu_1bit on a float32 input of shape ({rows}, {cols}) ({n} elements, a size drawn at grading time)"
    returned = 4 * (rows + RELU_SAMPLES)  # the row sums and the sampled entries the call returns
    limit = math.ceil(n / 8) + returned + RELU_SLACK
    if held.kept > limit:
        del rows_sum, samples
        raise AssertionError(
            f"{what}: between forward and backward, with the input and output released, your process still held "
            f"{mib(held.kept)} more than before (read from outside your process); the packed mask is "
            f"{mib(math.ceil(n / 8))}, a bool mask {mib(n)}, the input or output {mib(4 * n)}. "
            + _explain_kept(nb))
    # The values of that very call, against the judge's own on the same seeded input.
    ref = _measured_reference(case)
    output_hint = "the output is torch.relu(x), whatever the input's size"
    grad_hint = "the gradient is grad * (x > 0), from the packed mask, whatever the input's size"
    check_close(fetch(samples), ref["samples"], f"the output of {what} at {RELU_SAMPLES} entries drawn at grading "
                "time", output_hint, atol=0, rtol=0)
    got_rows = fetch(rows_sum)
    check_close(None if got_rows is None else got_rows.double(), ref["out_rows"],
                f"the output of {what}, each row summed with positive weights drawn at grading time", output_hint,
                atol=1e-6, rtol=1e-4)
    samples.backward(nb.put(case["upstream"]), retain_graph=True)
    grad_picks = fetch(row_leaf.grad)
    grad_picks = None if grad_picks is None else grad_picks.reshape(-1).double()
    checks = [(f"the gradient of {what} at {RELU_SAMPLES} entries drawn at grading time (summed per row)",
               "grad_picks", dict(atol=1e-5 * float(case["upstream"].abs().sum()), rtol=0))]
    if grad_picks is not None:
        rows_sum.sum().backward()
        grad_rows = fetch(row_leaf.grad).reshape(-1).double() - grad_picks
        checks.append((f"the gradient of {what}, each row summed with the weights of the output's row sums (a "
                       "single wrong mask bit shows)", "grad_rows", dict(atol=1e-6, rtol=1e-4)))
    got = {"grad_picks": grad_picks, "grad_rows": grad_rows if grad_picks is not None else None}
    # The right gradient, or the values cell's known mistake at exact zeros (that cell grades it).
    if grad_picks is not None and any(all(same_close(got[key], want[key], **tol) for _, key, tol in checks)
                                      for want in (ref if i == 0 else _measured_reference(case, at_zero=True)
                                                   for i in range(2))):
        return
    for name, key, tol in checks:
        check_close(got[key], ref[key], name, grad_hint, **tol)


def _explain_kept(nb) -> str:
    """Why the outside reading found too much held: what the saved-bytes probe and the overwrite test say on a
    small input (claims measured in the process, run after the reading)."""
    i = next(i for i, (shape, _) in enumerate(RELU_CASES) if shape == (1000,))
    x, g, where = _relu_case(i, *RELU_CASES[i])
    try:
        got = _relu_call(nb, x, g, where)
        problem = _saved_problem(got, x.numel(), "On a small input, " + where, x.element_size())
        problem = problem or _overwrite_problem(nb, x, g, where, got["dx"])
    except AssertionError as e:
        problem = str(e)
    if problem:
        return problem[0].upper() + problem[1:]
    return (f"{BYTES_HINT}. On a small input your relu_1bit saved exactly the packed mask with "
            "ctx.save_for_backward: what the process held beyond it was kept some other way (a ctx attribute, a "
            "cache, a global); hold nothing else between forward and backward")
