# ---
# jupyter:
#   chapter:
#     title: "Last layer, BatchNorm, bias-only with 1-bit ReLU masks"
#     imports: []
#     checkpoints: [transfer_cnn_digits]
#     prose_numbers:  # phrases whose numbers are definitions or quoted figures (tests/test_prose_numbers.py)
#       - 'Each graded cell may use 60 s and 4 GiB'  # the grader's limits per graded cell
#       - 'with 1 MiB of slack'  # a memory check's allowance (grader/hidden)
#       - 'keeps nothing else (32× smaller)'
#       - '32 bits per element'
#       - 'packed 8 to a byte, 32× smaller'  # fp32 vs 1 bit
#       - '"15 ones: 8 + 7 bits"'
#       - '"9 bits need 2 uint8 bytes, got "'  # the visible test's own data
#       - 'BN + last layer trains about 12× fewer parameters than full fine-tuning but needs only about 1.8× less memory; bias + last layer needs 12× less memory but is 16.3 points less accurate'  # TinyTL, lecture figures
#       - '"≈ 12×"'
#       - '"≈ 1.8×"'
#       - '"12×"'
#       - '"16.3 points"'
#       - 'the paper''s 12×'
#     mentioned:  # names an exercise's text uses that grading does not offer (tests/test_namespace.py)
#       pack_bits:
#         kernels: "the course's kernels, refused as answers"
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 4 — Partial training: train fewer things, store fewer activations
#
# A model pretrained on one task is fine-tuned on a device for another, with little data and
# little memory. The obvious saving is to train fewer parameters: freeze most of the network and
# update only a small part. This chapter measures what that buys, and finds the catch: training
# memory is dominated by the *activations* kept for backward, and freezing parameters does not
# remove them unless the layers are written to exploit it.
#
# **What you will learn**
# - four recipes: full fine-tuning, last layer only, BatchNorm $\gamma/\beta$ + last layer, biases +
#   last layer; what each trains, costs and reaches on a shifted task;
# - why a bias gradient needs no stored input while a weight gradient does
#   ($\partial W = g^\top x$, $\partial b = \sum g$), and which PyTorch layers exploit it (measured);
# - that once weights are frozen, what remains is the ReLU's full-precision output, although its
#   backward needs only one bit per element; you will pack those bits 8 to a byte and write a ReLU
#   that keeps nothing else (32× smaller);
# - the paper's numbers (TinyTL, Cai et al. 2020) beside ours, and why they differ at this scale.

# %% tags=["setup"]
import math

import torch
from torch import nn

from coursekit.transfer import LeanBatchNorm2d, TransferCNN

# %% [markdown]
# ## 1. The setting: a new task for a pretrained CNN
#
# `coursekit.transfer` provides the lab: a small CNN (`TransferCNN`: four blocks
# `conv 3×3 (with bias) → BatchNorm → ReLU`, a global average pool, then `model.classifier`, a
# Linear layer) pretrained on the *source* task, scikit-learn's 8×8 digits 0–4. The *target* task
# has new classes and shifted statistics: the digits 5–9, drawn in negative and rotated by 90°,
# with only 300 labelled training images.

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch.nn.functional as F
from IPython.display import Markdown, display
from tqdm.auto import tqdm

from coursekit import fast, measure
from coursekit.memory import count_parameters, model_state_bytes
from coursekit.report import literature_table, paired_bars
from coursekit.transfer import FineTuneConfig, LeanConv2d, digits_tasks, evaluate, fine_tune, load_pretrained_cnn
from coursekit.widgets import slider_plot

KIB = 1024
source, target = digits_tasks(target_train=300)
BATCH = 32  # the fine-tuning batch size, also used for every memory measurement

fig, axes = plt.subplots(2, 8, figsize=(8, 2.3))
for row, task in zip(axes, (source, target)):
    for ax, i in zip(row, range(8)):
        ax.imshow(task.train.x[i, 0], cmap="gray_r", vmin=0, vmax=1)
        ax.set_xticks([]), ax.set_yticks([])
        ax.set_title(f"{int(task.train.y[i]) + (0 if task is source else 5)}", fontsize=8)
    row[0].set_ylabel("source" if task is source else "target", fontsize=8)
fig.tight_layout()
plt.show()

pretrained = load_pretrained_cnn(num_classes=target.num_classes)
print(pretrained)
print(f"{count_parameters(pretrained):,} parameters; {len(target.train)} target training images, "
      f"{len(target.test)} test images")

# %% [markdown]
# ## 2. Four ways to fine-tune, and what backward needs for each
#
# | recipe | trains | known for |
# |---|---|---|
# | **full** | every parameter | expressive; expensive (gradients and Adam state for every weight, every activation stored); needs data |
# | **last** | only the classifier | cheap; weak when the tasks differ (the features stay those of the source task) |
# | **bn+last** | BatchNorm $\gamma, \beta$ + classifier | few parameters, re-normalises the features |
# | **bias+last** | every bias + classifier | few parameters, shifts every feature |
#
# Where does the memory go? Take one layer $y = xW^\top + b$ with a batch of inputs $x$ ($B \times d_{in}$)
# and the incoming gradient $g = \partial L / \partial y$ ($B \times d_{out}$). Backward computes
#
# $$\frac{\partial L}{\partial W} = g^\top x, \qquad \frac{\partial L}{\partial b} = \sum_{\text{batch}} g, \qquad \frac{\partial L}{\partial x} = g\,W.$$
#
# Only $\partial W$ needs the input $x$. A layer whose **weight is frozen** needs nothing from the
# forward pass: its bias gradient and the gradient passed further down use only $g$ and $W$. The same
# holds for a convolution (a sum of such products over positions) and for BatchNorm in its frozen,
# eval-mode form $y = x \cdot s + t$ ($s$ a per-channel constant; $\partial\beta = \sum g$). A trained
# BatchNorm $\gamma$ needs the normalised input: $\partial\gamma = \sum g \odot \hat x$.
#
# The ReLU has no parameters but still needs something: $\partial L / \partial x = g \odot \mathbb 1[x > 0]$,
# a **sign bit** per element. PyTorch keeps its fp32 output instead, 32 bits per element.
#
# ## 3. Exercise: choose what trains
#
# Write `set_trainable(model, mode)`. Pick the parameters by the *type* of their layer (any BatchNorm)
# or by their *name* (`bias`), never by position or count: it must work on any `TransferCNN`, of any
# width or depth, and on a model built from PyTorch's plain `nn.Conv2d` and `nn.BatchNorm2d`.

# %% exercise="set_trainable"
def set_trainable(model, mode):
    """Choose which parameters of ``model`` are trained, by setting their ``requires_grad``.

    Args:
        model: an ``nn.Module`` with a ``classifier`` submodule (the final layer), e.g. a
            ``TransferCNN``.
        mode: one of
            - ``"full"``: every parameter;
            - ``"last"``: every parameter of ``model.classifier``, nothing else;
            - ``"bn+last"``: the weight (γ) and bias (β) of every BatchNorm layer (any instance of
              ``nn.BatchNorm1d/2d/3d``, ``LeanBatchNorm2d`` included, whatever its attribute
              name), plus every parameter of ``model.classifier``. Convolution biases stay frozen;
            - ``"bias+last"``: every parameter whose own name is ``bias`` (the last part of its
              ``named_parameters()`` name: convolution and BatchNorm biases alike; BatchNorm
              weights stay frozen), plus every parameter of ``model.classifier``.
            Every other parameter gets ``requires_grad = False``, so calling ``set_trainable`` again
            with another mode switches cleanly.

    Returns:
        The number of trainable parameters (elements, an ``int``) in ``model`` after the call.

    Raises:
        ValueError: for any other mode; the message lists the four valid modes.

    Graded on, one cell per property. The modes: six models (the default ``TransferCNN``, two others of 3
    and 5 blocks with other widths, strides and class counts, one whose blocks are anonymous
    ``nn.Sequential(nn.Conv2d, nn.BatchNorm2d, nn.ReLU)``, one convolution without bias, one with an
    ``nn.BatchNorm1d`` and an ``nn.BatchNorm3d`` block after its convolutions, and a ``TransferCNN``
    whose depth (2 to 5 blocks), widths (3 to 24), strides (1 or 2) and class count (2 to 9) are drawn at
    grading time), each through seven
    calls in a row that cycle through the modes. What trains is read off the model's own parameter tensors
    and confirmed by one backward pass the grader drives: change only ``requires_grad`` (adding, replacing
    or removing a parameter fails). Also the returned ``int``. The errors: the ValueError and its message
    for unknown modes, near misses such as ``"bias"`` included. Each graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    modes = ("full", "last", "bn+last", "bias+last")
    if mode not in modes:
        raise ValueError(f"unknown mode {mode!r}: expected one of {', '.join(repr(m) for m in modes)}")
    train = set()
    if mode == "full":
        train.update(model.parameters())
    elif mode == "bn+last":
        for layer in model.modules():
            if isinstance(layer, nn.modules.batchnorm._BatchNorm):
                train.update(layer.parameters(recurse=False))
    elif mode == "bias+last":
        train.update(p for name, p in model.named_parameters() if name.rsplit(".", 1)[-1] == "bias")
    train.update(model.classifier.parameters())
    for p in model.parameters():
        p.requires_grad_(p in train)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
    ### END SOLUTION


# %% test="test_set_trainable" points=1 checks="set_trainable"
model = load_pretrained_cnn()
counts = {mode: set_trainable(model, mode) for mode in ("full", "last", "bn+last", "bias+last")}
assert counts["full"] == count_parameters(model), "full: every parameter is trainable"
assert counts["last"] == model.classifier.weight.numel() + model.classifier.bias.numel(), \
    "last: only the classifier's weight and bias"
set_trainable(model, "bn+last")
assert model.blocks[0].bn.weight.requires_grad and model.blocks[0].bn.bias.requires_grad
assert not model.blocks[0].conv.bias.requires_grad, "bn+last trains BatchNorm γ and β, not convolution biases"
assert not model.blocks[0].conv.weight.requires_grad and model.classifier.weight.requires_grad
set_trainable(model, "bias+last")
assert model.blocks[2].conv.bias.requires_grad and model.blocks[2].bn.bias.requires_grad
assert not model.blocks[2].bn.weight.requires_grad, "bias+last trains biases only (BatchNorm γ stays frozen)"
assert counts["bias+last"] == count_parameters(model, trainable_only=True), "return the real trainable count"
print(counts)
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch04_partial_training", "test_set_trainable", globals())
### END HIDDEN TESTS

# %% test="test_set_trainable_errors" points=1 checks="set_trainable"
for bad_mode in ("lora", "bias"):
    try:
        set_trainable(model, bad_mode)
    except ValueError as e:
        assert all(m in str(e) for m in ("full", "last", "bn+last", "bias+last")), \
            f"list the valid modes in the message: {e}"
    else:
        raise AssertionError(f"an unknown mode ({bad_mode!r}) must raise ValueError")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch04_partial_training", "test_set_trainable_errors", globals())
### END HIDDEN TESTS

# %% [markdown]
# ### Measure it: what does each layer keep for backward?
#
# The formula says a frozen layer needs nothing. Does PyTorch agree? For each layer type we feed an
# input that requires a gradient (as in the middle of a network) and count, with
# `coursekit.measure`, the bytes saved for backward, with the layer's weight trainable and frozen
# (a frozen BatchNorm runs in eval mode, on its running statistics, as `TransferCNN.train()` does).

# %%
def kept_bytes(layer, x, frozen):
    """Activation bytes ``layer`` saves for backward on input ``x`` (which requires grad)."""
    if hasattr(layer, "weight"):
        layer.weight.requires_grad_(not frozen)
    layer.train(not frozen)
    x = x.clone().requires_grad_(True)
    return measure(lambda: layer(x).sum(), layer).activation_bytes


torch.manual_seed(0)
x_vec, x_map = torch.randn(BATCH, 64), torch.randn(BATCH, 16, 8, 8)
layers = {"nn.Linear(64, 64)": (nn.Linear(64, 64), x_vec),
          "nn.Conv2d(16, 16, 3)": (nn.Conv2d(16, 16, 3, padding=1), x_map),
          "LeanConv2d(16, 16, 3)": (LeanConv2d(16, 16, 3, padding=1), x_map),
          "nn.BatchNorm2d(16)": (nn.BatchNorm2d(16), x_map),
          "LeanBatchNorm2d(16)": (LeanBatchNorm2d(16), x_map),
          "nn.ReLU() (no weight)": (nn.ReLU(), x_map)}
rows = []
for name, (layer, x) in layers.items():
    rows.append(f"| {name} | {x.nelement() * 4 / KIB:.0f} KiB | {kept_bytes(layer, x, False) / KIB:.2f} KiB "
                f"| {kept_bytes(layer, x, True) / KIB:.2f} KiB |")
display(Markdown("| layer | its input (fp32) | kept, weight trainable | kept, weight frozen |\n|---|---|---|---|\n"
                 + "\n".join(rows)))

# %% [markdown]
# `nn.Linear` already exploits the formula: with a frozen weight it keeps nothing. `nn.Conv2d` and
# `nn.BatchNorm2d` do **not**: their backward is one fused kernel that computes all gradients from
# the input, so PyTorch keeps the input whatever is frozen. That is why the course CNN is built from
# `LeanConv2d` and `LeanBatchNorm2d` (`coursekit.transfer`): drop-in subclasses whose frozen form
# keeps nothing but a per-channel scale. Without them no recipe of this chapter could save any
# activation memory in a CNN. The ReLU keeps its fp32 output in every case.
#
# Now the whole network, one training step per recipe (batch of 32): activation bytes, and the
# model state of Adam training (weights, gradients and two moments per *trainable* weight).

# %%
MODES = ("full", "last", "bn+last", "bias+last")
xb, yb = target.train.x[:BATCH], target.train.y[:BATCH]


class ReLU1bit(nn.Module):
    """Drop-in for ``nn.ReLU`` that keeps a 1-bit mask for backward (uses ``relu_1bit``, section 5)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu_1bit(x)


def build(mode, one_bit=False, seed=0):
    """The pretrained CNN with ``mode`` trainable; ``one_bit`` swaps every block's ReLU for ReLU1bit."""
    model = load_pretrained_cnn(num_classes=target.num_classes, seed=seed)
    set_trainable(model, mode)
    if one_bit:
        for block in model.blocks:
            block.act = ReLU1bit()
    return model


def step_memory(model, batch=BATCH):
    """Measured activation bytes of one training step + model state (Adam): a dict of bytes."""
    model.train()
    x, y = target.train.x[:batch], target.train.y[:batch]
    m = measure(lambda: F.cross_entropy(model(x), y), model)
    state = model_state_bytes(model, "adam")
    return {"activations": m.activation_bytes, **state, "total": m.activation_bytes + sum(state.values())}


def relu_output_numels(model, x):
    """Elements of each block's ReLU output for input ``x``."""
    numels = []
    hooks = [b.act.register_forward_hook(lambda _m, _i, out: numels.append(out.numel())) for b in model.blocks]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return numels


relu_numels = relu_output_numels(pretrained, xb)
relu_fp32 = 4 * sum(relu_numels)
plain = {mode: step_memory(build(mode)) for mode in MODES}
trainable = {mode: set_trainable(build(mode), mode) for mode in MODES}
lines = [f"| {mode} | {trainable[mode]:,} | {m['activations'] / KIB:,.0f} KiB | "
         f"{(m['params'] + m['grads'] + m['optimizer_state']) / KIB:,.0f} KiB | {m['total'] / KIB:,.0f} KiB |"
         for mode, m in plain.items()]
display(Markdown("| mode | trainable params | activations | weights + grads + Adam | training memory |\n"
                 "|---|---|---|---|---|\n" + "\n".join(lines)))
print(f"the four ReLU outputs alone: {relu_fp32 / KIB:,.0f} KiB of fp32 "
      f"({relu_fp32 / plain['bias+last']['activations']:.0%} of what bias+last keeps)")

# %% [markdown]
# Freezing cuts the parameter side: gradients and Adam moments exist only for trainable weights
# (`bn+last` trains about a hundredth of the parameters). The activations barely move for `bn+last`:
# a trained $\gamma$ needs its BatchNorm's input, and every ReLU still keeps its output. `bias+last`
# halves them, and almost everything it still keeps is the ReLU outputs: fp32 tensors whose
# backward would be satisfied by their sign. `last` keeps almost nothing, because nothing before the
# classifier needs a gradient, so no graph is recorded there at all.
#
# ### Your lecture notes vs what we measure
#
# The lecture notes count what partial training saves in trainable parameters: freeze most of the
# network, or train only the biases, and fine-tuning becomes cheap, because a frozen weight needs
# no gradient and a bias gradient needs no stored activation. Two things that count hides:
#
# - freezing removes a weight's gradient and its two Adam moments, never the weight itself: the
#   frozen weights stay in memory, so the parameter ratio is not a memory ratio;
# - the activation saving of bias-only training exists only in layers written to exploit it
#   (section 2's formula). PyTorch's own `nn.Conv2d` and `nn.BatchNorm2d` keep their input
#   whatever is frozen (the per-layer table above), so the same recipe on the same weights saves
#   no activations with them.
#
# The cell splits each recipe's saving against `full` into its parts, then measures `full` and
# `bias+last` again with the lean layers replaced by PyTorch's own (same weights).

# %%
def with_torch_layers(model):
    """``model`` with PyTorch's own ``nn.Conv2d`` / ``nn.BatchNorm2d`` in place of the lean layers (same weights)."""
    for block in model.blocks:
        conv, bn = block.conv, block.bn
        block.conv = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding)
        block.bn = nn.BatchNorm2d(bn.num_features)
        block.conv.load_state_dict(conv.state_dict())
        block.bn.load_state_dict(bn.state_dict())
    return model


full_mem = plain["full"]
rows = []
for mode in MODES[1:]:
    m = plain[mode]
    rows.append(f"| {mode} | {trainable['full'] / trainable[mode]:,.0f}× fewer "
                f"| {(full_mem['params'] - m['params']) / KIB:,.0f} KiB "
                f"| {(full_mem['grads'] + full_mem['optimizer_state'] - m['grads'] - m['optimizer_state']) / KIB:,.0f} KiB "
                f"| {(full_mem['activations'] - m['activations']) / KIB:,.0f} KiB "
                f"| {full_mem['total'] / m['total']:.1f}× |")
display(Markdown("| mode vs full | trainable parameters | weights saved | gradients + Adam saved | activations saved "
                 "| training memory |\n|---|---|---|---|---|---|\n" + "\n".join(rows)))
for mode in ("full", "bias+last"):
    torch_model = with_torch_layers(load_pretrained_cnn(num_classes=target.num_classes))
    set_trainable(torch_model, mode)
    ours = step_memory(torch_model)["activations"]
    print(f"{mode:9} with nn.Conv2d / nn.BatchNorm2d: {ours / KIB:,.0f} KiB of activations "
          f"(lean layers: {plain[mode]['activations'] / KIB:,.0f} KiB)")

# %% [markdown]
# The parameter ratio and the memory ratio are far apart: no frozen weight leaves memory (the
# "weights saved" column), every recipe saves the gradients and Adam moments of the frozen
# weights, and only the activation column tells the recipes apart. With PyTorch's own layers,
# `bias+last` keeps about as many activation bytes as full fine-tuning (the last two lines): the
# lean layers, not the choice of what trains, make that saving.
#
# ## 4. Exercise: pack bits
#
# A `bool` tensor spends a byte per element. Pack 8 of them into one `uint8`: element $8k + j$ of the
# flattened mask goes to **bit $j$** (value $2^j$) of byte $k$. The last byte may be partly used when
# $n$ is not a multiple of 8: its unused high bits are 0, and `unpack_bits` must ignore whatever
# they hold (that is why it takes `numel`).
#
# $$\text{byte}_k = \sum_{j=0}^{7} 2^j\, m_{8k+j}, \qquad m_i = \big(\text{byte}_{\lfloor i/8 \rfloor} \gg (i \bmod 8)\big)\ \&\ 1.$$
#
# Tensor operations only (no Python loop over elements): `reshape`, padding, shifts (`<<`, `>>`),
# `&`, and a sum or product over the bit dimension. Write them yourself: the course's
# `kernels.ch05_tinytl` (chapter 5's Triton version of this section) is refused by the grader.

# %% exercise="pack_bits"
def pack_bits(mask):
    """Pack a boolean tensor 8 elements to a byte.

    Args:
        mask: a ``torch.bool`` tensor of any shape, n elements (flattened in row-major order).

    Returns:
        A flat ``torch.uint8`` tensor of ``ceil(n / 8)`` bytes on ``mask``'s device: element
        ``8k + j`` of the flattened mask is bit ``j`` (value ``2**j``) of byte ``k``; the unused high
        bits of the last byte are 0.

    Raises:
        ValueError: if ``mask`` is not a bool tensor.

    Graded on, one cell per property: the exact bytes for random masks of 1, 7, 8, 9, 61 and 1000 elements
    and of shapes (3, 5, 7), (2, 1, 4, 4) and (37, 53), for 61 True values, for 9 elements with a single
    True (element 0, 7 or 8), for a random mask whose shape (up to 64 × 64) is drawn at grading time, and
    for a random 2-D mask of 2^20 to 15 × 2^20 elements whose shape (last dimension 1 to 4096), density and
    values are drawn at grading time (its bytes compared at the first and last 8 and at 256 positions drawn
    at grading time), with the dtype and the flat shape; the ValueError for float, uint8 and int64
    tensors. Each graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a torch.bool tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
    n = mask.numel()
    padded = torch.zeros(8 * math.ceil(n / 8), dtype=torch.uint8, device=mask.device)
    padded[:n] = mask.reshape(-1)
    place_values = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=mask.device)
    return (padded.view(-1, 8) * place_values).sum(dim=1, dtype=torch.uint8)  # distinct bits: no carry
    ### END SOLUTION


# %% test="test_pack_bits" points=1 checks="pack_bits"
m = torch.tensor([True, False, True, True, False, False, False, False, True])  # n = 9: two bytes
packed = pack_bits(m)
assert packed.dtype == torch.uint8 and packed.shape == (2,), \
    f"9 bits need 2 uint8 bytes, got {packed.dtype} {tuple(packed.shape)}"
assert packed.tolist() == [1 + 4 + 8, 1], f"element 8k+j is bit j of byte k: expected [13, 1], got {packed.tolist()}"
assert pack_bits(torch.ones(3, 5, dtype=torch.bool)).tolist() == [255, 127], "15 ones: 8 + 7 bits"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch04_partial_training", "test_pack_bits", globals())
### END HIDDEN TESTS

# %% test="test_pack_bits_errors" points=1 checks="pack_bits"
for not_a_mask in (torch.ones(8), torch.ones(8, dtype=torch.uint8)):
    try:
        pack_bits(not_a_mask)
    except ValueError:
        pass
    else:
        raise AssertionError(f"a {not_a_mask.dtype} tensor is not a mask: raise ValueError")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch04_partial_training", "test_pack_bits_errors", globals())
### END HIDDEN TESTS

# %% exercise="unpack_bits"
def unpack_bits(packed, numel):
    """The inverse of ``pack_bits``.

    Args:
        packed: a flat ``torch.uint8`` tensor of ``ceil(numel / 8)`` bytes; bits beyond ``numel`` in
            its last byte may hold anything and are ignored.
        numel: the number of elements packed, n.

    Returns:
        A flat ``torch.bool`` tensor of ``numel`` elements on ``packed``'s device: element ``8k + j``
        is bit ``j`` of byte ``k``. ``reshape`` it to the mask's shape.

    Raises:
        ValueError: if ``packed`` is not uint8 or holds fewer than ``numel`` bits.

    Graded on: the masks ``pack_bits`` is graded on (1 to 37 × 53 elements, one whose shape is drawn at
    grading time up to 64 × 64, and a 2-D one of 2^20 to 15 × 2^20 elements whose shape, density and values
    are drawn at grading time) and 61 False values, packed with every unused bit of the last byte set to 1;
    the dtype, the shape ``(numel,)`` and every element (of the large mask, those of the bytes its
    ``pack_bits`` case compares: the first and last 8 and 256 drawn at grading time); the
    ValueError for int64 and float buffers and for buffers holding fewer than numel bits (17 elements asked
    of two bytes, 1 of none). Each graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed must be a torch.uint8 tensor, got {packed.dtype}")
    if not 0 <= numel <= 8 * packed.numel():
        raise ValueError(f"{packed.numel()} bytes hold at most {8 * packed.numel()} bits, asked for {numel}")
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = packed.reshape(-1, 1).bitwise_right_shift(shifts).bitwise_and(1)  # (bytes, 8): bit j in column j
    return bits.reshape(-1)[:numel].bool()
    ### END SOLUTION


# %% test="test_unpack_bits" points=1 checks="unpack_bits"
assert unpack_bits(torch.tensor([13, 1], dtype=torch.uint8), 9).tolist() == [
    True, False, True, True, False, False, False, False, True]
garbage_tail = torch.tensor([255, 0b11111101], dtype=torch.uint8)  # only the lowest 2 bits of byte 1 count
assert unpack_bits(garbage_tail, 10).tolist() == [True] * 8 + [True, False], "ignore bits beyond numel"
torch.manual_seed(0)
mask = torch.rand(3, 7, 5) > 0.5
back = unpack_bits(pack_bits(mask), mask.numel())
assert back.dtype == torch.bool and torch.equal(back.reshape(mask.shape), mask), "round trip"
for bad_packed, bad_numel in ((torch.tensor([13, 1]), 9), (torch.tensor([13, 1], dtype=torch.uint8), 17)):
    try:
        unpack_bits(bad_packed, bad_numel)
    except ValueError:
        pass
    else:
        raise AssertionError(f"unpack_bits of {bad_packed.numel()} {bad_packed.dtype} values for numel={bad_numel} "
                             "should raise ValueError (not uint8, or fewer than numel bits)")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch04_partial_training", "test_unpack_bits", globals())
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Exercise: a ReLU that keeps one bit per element
#
# Write `relu_1bit(x)` with a custom `torch.autograd.Function` (define it inside your function, so
# the cell defines one name). Its `forward` computes `torch.relu(x)` and saves **only**
# `pack_bits(x > 0)`, with `ctx.save_for_backward` (so that autograd, and our measurements, see
# it; keep the shape as a plain attribute). Its `backward` unpacks the mask and returns
# $g \odot \mathbb 1[x > 0]$: the same gradient as `torch.relu`'s, including 0 where $x = 0$.
#
# Saving the output, the input, or a `bool` mask (a byte per element) would all be correct and
# all miss the point: the saved bytes must be exactly $\lceil n/8 \rceil$.

# %% exercise="relu_1bit"
def relu_1bit(x):
    """ReLU whose backward keeps only a packed sign mask.

    Args:
        x: a floating-point tensor of any shape (n elements).

    Returns:
        ``torch.relu(x)`` (same shape and dtype). For backward, exactly one tensor is saved with
        ``ctx.save_for_backward``: ``pack_bits(x > 0)``, ``ceil(n / 8)`` bytes; the gradient is
        that of ``torch.relu`` (``grad * (x > 0)``, so 0 where ``x == 0``).

    Graded on, one cell per property. Values: float32 and float64 inputs of shapes (1,), (7,), (61,),
    (1000,), (37, 53), (2, 3, 5, 7) and (4, 16, 8, 8) holding exact zeros of both signs; the output (dtype
    included) and the gradient must equal ``torch.relu``'s exactly, and the output must be attached to the
    graph. Memory, decided from outside your process: one call on a 2-D float32 input of 12 × 2^20 to
    15 × 2^20 elements (the last dimension 1024 to 4096), its shape and values drawn at grading time;
    between forward and backward, with the input and output released, your process may hold at most the
    packed mask, with 1 MiB of slack; that very call's output (at entries drawn at grading time, and each
    row summed with weights drawn at grading time) must be ``torch.relu``'s, and so must its gradient (at
    those entries, and per row); hold nothing once the cell has run or between calls. Also in that cell,
    on the small inputs above: the gradient must not change when x and the output are overwritten in place
    between forward and backward (backward may use only the saved mask). What your process saves, counted
    inside it, only explains a failed reading. As in section 4, the course's
    kernels.ch05_tinytl is refused. Each graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    class ReLU1bitFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp):
            ctx.shape = inp.shape
            ctx.save_for_backward(pack_bits(inp > 0))
            return torch.relu(inp)

        @staticmethod
        def backward(ctx, grad_output):
            (packed,) = ctx.saved_tensors
            positive = unpack_bits(packed, grad_output.numel()).reshape(ctx.shape)
            return grad_output.masked_fill(~positive, 0)

    return ReLU1bitFunction.apply(x)
    ### END SOLUTION


# %% test="test_relu_1bit" points=1 checks="relu_1bit"
torch.manual_seed(0)
x = torch.randn(3, 5, 7)  # 105 elements: not a multiple of 8
x[0, 0, :3] = 0.0  # torch.relu's gradient at 0 is 0
x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
y1 = relu_1bit(x1)
y2 = torch.relu(x2)
torch.testing.assert_close(y1, y2, msg="the output must be torch.relu(x)")
g = torch.randn(3, 5, 7)
y1.backward(g)
y2.backward(g)
torch.testing.assert_close(x1.grad, x2.grad, msg="the gradient must be grad * (x > 0), 0 where x == 0")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch04_partial_training", "test_relu_1bit", globals())
### END HIDDEN TESTS

# %% test="test_relu_1bit_memory" points=2 checks="relu_1bit"
from coursekit import saved_tensors

x1 = x.clone().requires_grad_(True)
with saved_tensors() as rec:
    y1 = relu_1bit(x1)
assert rec.activation_bytes == math.ceil(x.numel() / 8), \
    f"saved {rec.activation_bytes} bytes for backward; the packed mask is {math.ceil(x.numel() / 8)} bytes " \
    f"(torch.relu keeps {4 * x.numel()})"
assert all(not s.dtype.is_floating_point for s in rec.tensors), "nothing in floating point may be saved"
x1.data.neg_()  # backward may use only the saved mask: overwriting x changes nothing
y1.data.zero_()
y1.backward(g)
torch.testing.assert_close(x1.grad, x2.grad, msg="backward must use only the packed mask saved for it")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch04_partial_training", "test_relu_1bit_memory", globals())
### END HIDDEN TESTS

# %% [markdown]
# ### Measure it: every recipe with 1-bit ReLUs
#
# Swap every block's `.act` for `ReLU1bit` (section 3's wrapper around your `relu_1bit`) and
# measure again. We can predict the drop exactly. A ReLU in the recorded graph now keeps
# $\lceil n/8 \rceil$ bytes instead of its $4n$-byte output, **unless another layer keeps that output
# anyway**: in `full` mode the next convolution has a trainable weight and stores its input, the
# very same tensor, so only the last block's output (which feeds the average pool, which keeps
# nothing) is freed. In `last` mode no ReLU is in the graph at all.

# %%
def predicted_drop(model, numels):
    """Bytes that 1-bit masks should free in ``model`` (set up for a mode, plain ReLUs)."""
    drop, in_graph = 0, False
    for i, (block, n) in enumerate(zip(model.blocks, numels)):
        in_graph |= any(p.requires_grad for p in block.parameters())  # the input itself needs no grad
        if not in_graph:
            continue
        nxt = model.blocks[i + 1].conv if i + 1 < len(model.blocks) else None
        kept_by_next = nxt is not None and nxt.weight.requires_grad
        drop += (0 if kept_by_next else 4 * n) - math.ceil(n / 8)
    return drop


one_bit = {mode: step_memory(build(mode, one_bit=True)) for mode in MODES}
lines = []
for mode in MODES:
    drop = plain[mode]["activations"] - one_bit[mode]["activations"]
    expected = predicted_drop(build(mode), relu_numels)
    assert drop == expected, f"{mode}: measured drop {drop} bytes, predicted {expected}"
    lines.append(f"| {mode} | {plain[mode]['activations'] / KIB:,.1f} KiB "
                 f"| {one_bit[mode]['activations'] / KIB:,.1f} KiB "
                 f"| {drop:,} B | {expected:,} B | {plain[mode]['activations'] / one_bit[mode]['activations']:.1f}× |")
display(Markdown("| mode | activations, nn.ReLU | activations, relu_1bit | drop (measured) | drop (predicted) "
                 "| ratio |\n|---|---|---|---|---|---|\n" + "\n".join(lines)))

# %% [markdown]
# The prediction holds to the byte. `bias+last` with 1-bit masks keeps a small fraction of what it
# keeps with `nn.ReLU` (the ratio column); `bn+last` only halves, because each trained BatchNorm
# still keeps its input (the convolution's output, as large as the ReLU's). In `full` mode the masks
# even cost a little extra for the ReLUs whose output the next convolution keeps anyway.
#
# ## 6. Fine-tune with each recipe
#
# Thirty epochs of Adam on the 300 target images for each recipe, with and without 1-bit ReLUs, and
# a network trained from scratch as a yardstick. Few trainable parameters want a larger step: we
# use lr = 3e-3 for full fine-tuning and from scratch, and 3e-2 for the three partial recipes (chosen
# over {3e-3, 1e-2, 3e-2}).

# %%
EPOCHS = fast(30, 2)
LR = {"full": 3e-3, "last": 3e-2, "bn+last": 3e-2, "bias+last": 3e-2}
runs = [(mode, bit) for mode in MODES for bit in (False, True)] + [("from scratch", False)]
accuracy = {}
for mode, bit in tqdm(runs, desc="fine-tuning"):
    if mode == "from scratch":
        model, lr = TransferCNN(num_classes=target.num_classes, seed=0), 3e-3
    else:
        model, lr = build(mode, one_bit=bit), LR[mode]
    fine_tune(model, target.train, FineTuneConfig(epochs=EPOCHS, lr=lr))
    accuracy[mode, bit] = evaluate(model, target.test)

header = ("| mode | trainable params | activations (nn.ReLU / 1-bit) | training memory (nn.ReLU / 1-bit) "
          "| target accuracy (nn.ReLU / 1-bit) |\n|---|---|---|---|---|\n")


def comparison_table():
    lines = [f"| {mode} | {trainable[mode]:,} | {plain[mode]['activations'] / KIB:,.0f} / "
             f"{one_bit[mode]['activations'] / KIB:,.0f} KiB | {plain[mode]['total'] / KIB:,.0f} / "
             f"{one_bit[mode]['total'] / KIB:,.0f} KiB | {accuracy[mode, False]:.3f} / {accuracy[mode, True]:.3f} |"
             for mode in MODES]
    lines.append(f"| from scratch (full, random init) | {trainable['full']:,} | as full | as full "
                 f"| {accuracy['from scratch', False]:.3f} |")
    display(Markdown(header + "\n".join(lines)))


comparison_table()

# %% [markdown]
# The 1-bit ReLU changes the memory, not the training: its gradients are those of `nn.ReLU`, so both
# columns of accuracy agree. Training memory adds up activations, the weights (all of them, frozen
# or not) and, for trainable weights only, gradients and two Adam moments.
#
# The target is learnable from 300 images: a network trained from scratch does as well as full
# fine-tuning, so here pretraining earns its keep only through the cheap recipes. A new classifier
# on frozen features (`last`) is weak, because the source features do not fit negative, rotated
# digits; re-normalising (`bn+last`) or shifting (`bias+last`) every feature recovers most of the gap.
#
# ### Accuracy against activation memory

# %%
COLORS = {"full": "#4c72b0", "last": "#8c8c8c", "bn+last": "#55a868", "bias+last": "#c44e52"}
fig, ax = plt.subplots(figsize=(7, 3.6))
for mode in MODES:
    xs = [plain[mode]["activations"] / KIB, one_bit[mode]["activations"] / KIB]
    ys = [accuracy[mode, False], accuracy[mode, True]]
    ax.plot(xs, ys, "-", color=COLORS[mode], lw=1)
    ax.plot(xs[0], ys[0], "o", color=COLORS[mode], ms=8, label=f"{mode} (nn.ReLU)")
    ax.plot(xs[1], ys[1], "*", color=COLORS[mode], ms=12, label=f"{mode} (1-bit ReLU)")
ax.axhline(accuracy["from scratch", False], color="k", lw=0.6, ls=":", label="from scratch")
ax.set_xscale("log")
ax.set_xlabel(f"activation memory of one step, batch {BATCH} (KiB, log scale)")
ax.set_ylabel("target test accuracy")
ax.legend(fontsize=7, frameon=False, ncol=2, loc="lower right")
fig.tight_layout()
plt.show()

# %% [markdown]
# Upper left is where we want to be. `bias+last` with 1-bit masks comes closest: a small fraction of
# full fine-tuning's activations, for the accuracy points the table above shows it losing. `bn+last`
# is more accurate but keeps half of full fine-tuning's activations or more; `last` is cheapest and
# weakest.
#
# ## 7. Play with it: the batch size
#
# Activations grow with the batch, model state does not. Move the slider: each bar is one training
# step's whole memory, measured at that batch size: weights + gradients + Adam state (grey) with
# the activations stacked on top (left bar `nn.ReLU`, right bar 1-bit masks). The number on a bar
# is its total, and under it the activations alone.

# %% tags=["demo"]
widget_models = {(mode, bit): build(mode, one_bit=bit) for mode in MODES for bit in (False, True)}
SLIDER_BATCHES = range(8, fast(256, 64) + 1, 8)


def activations_per_batch(model):
    """Measured activation bytes at every slider batch, measured ahead so that the slider only
    redraws. A step saves per-example tensors and batch-independent ones (BatchNorm's
    statistics), so the bytes grow by the same amount every 8 examples: two measurements give
    them all, checked against a third at the largest batch (else each batch is measured)."""
    first, second, last = SLIDER_BATCHES[0], SLIDER_BATCHES[1], SLIDER_BATCHES[-1]
    a_first, a_second = (step_memory(model, b)["activations"] for b in (first, second))
    acts = {b: a_first + (b - first) // (second - first) * (a_second - a_first) for b in SLIDER_BATCHES}
    if step_memory(model, last)["activations"] != acts[last]:
        acts = {b: step_memory(model, b)["activations"] for b in SLIDER_BATCHES}
    return acts


widget_state = {key: model_state_bytes(m, "adam") for key, m in widget_models.items()}
widget_acts = {key: activations_per_batch(m) for key, m in widget_models.items()}


def draw(ax, batch=BATCH):
    pos = np.arange(len(MODES))
    top = 1.45 * max(sum(widget_state[k].values()) + widget_acts[k][batch] for k in widget_state) / KIB
    for offset, bit, label in ((-0.2, False, "nn.ReLU"), (0.2, True, "1-bit ReLU")):
        state = [sum(widget_state[mode, bit].values()) / KIB for mode in MODES]
        acts = [widget_acts[mode, bit][batch] / KIB for mode in MODES]
        ax.bar(pos + offset, state, width=0.38, color="#cccccc", edgecolor="k", lw=0.4,
               label="weights + grads + Adam" if not bit else None)
        bars = ax.bar(pos + offset, acts, width=0.38, bottom=state, color=[COLORS[m] for m in MODES],
                      hatch="//" if bit else None, edgecolor="k", lw=0.4, label=f"activations, {label}")
        # Each label says what it counts: the whole bar (state + activations) above it, the
        # activations alone inside their coloured part.
        ax.bar_label(bars, labels=[f"{s + a:,.0f}" for s, a in zip(state, acts)])
        ax.bar_label(bars, labels=[f"{a:,.0f}" if a > 0.08 * top else "" for a in acts], label_type="center",
                     color="white", weight="bold")
    ax.set_xticks(pos, MODES)
    ax.set_xlabel("trained parameters (left bar: nn.ReLU, right bar: 1-bit ReLU)")
    ax.set_ylabel("training memory (KiB)")
    ax.set_title(f"batch {batch}: total KiB above each bar, activations inside (where they fit)")
    ax.set_ylim(0, top)
    ax.legend(loc="upper right", ncols=3)


slider_plot(draw, figsize=(10, 4.6), batch=(8, fast(256, 64), 8), defaults={"batch": BATCH},
            labels={"batch": "batch size (images)"},
            explain={"batch": "images per step: the activations grow with it, weights, grads and Adam do not"},
            notice={"batch": lambda batch: (
                lambda plain, packed: f"batch {batch}: the 1-bit ReLU saves {(plain - packed) / KIB:,.0f} KiB of "
                                      f"bias+last's activations ({1 - packed / plain:.0%})")(
                widget_acts["bias+last", False][batch], widget_acts["bias+last", True][batch])})

# %% [markdown]
# At small batches the frozen weights (the grey bars) dominate every partial recipe; at a
# batch of 256 the activations of `full`, `bn+last` and plain `bias+last` reach several MiB while
# `bias+last` with 1-bit masks stays below the weights.
#
# ## 8. What the paper reports vs what we measured
#
# TinyTL (Cai et al., *TinyTL: Reduce Memory, Not Parameters for Efficient On-Device Learning*,
# NeurIPS 2020), on ImageNet-pretrained mobile networks fine-tuned on small image datasets, as
# summarised in the lecture figures: BN + last layer trains about 12× fewer parameters than full
# fine-tuning but needs only about 1.8× less memory; bias + last layer needs 12× less memory but is
# 16.3 points less accurate. TinyTL's bias-only training keeps no activations for frozen weights and
# 1-bit masks for ReLUs, our `bias+last` with `relu_1bit`.

# %%
param_ratio = trainable["full"] / trainable["bn+last"]
bn_mem = plain["full"]["total"] / plain["bn+last"]["total"]
bias_mem = plain["full"]["total"] / one_bit["bias+last"]["total"]
bias_mem_plain = plain["full"]["total"] / plain["bias+last"]["total"]
BIG_BATCH = fast(256, 64)
bias_mem_256 = (step_memory(widget_models["full", False], BIG_BATCH)["total"]
                / step_memory(widget_models["bias+last", True], BIG_BATCH)["total"])
gap = 100 * (accuracy["full", False] - accuracy["bias+last", True])
table = [
    ("trainable params, full / bn+last", "≈ 12×", f"{param_ratio:.0f}×", 12, param_ratio),
    ("training memory, full / bn+last", "≈ 1.8×", f"{bn_mem:.1f}× (batch {BATCH})", 1.8, bn_mem),
    ("training memory, full / bias+last", "12×",
     f"{bias_mem:.1f}× with 1-bit ReLUs ({bias_mem_plain:.1f}× with nn.ReLU); "
     f"{bias_mem_256:.1f}× at batch {BIG_BATCH}",
     12, bias_mem),
    ("accuracy, full − bias+last", "16.3 points", f"{gap:.1f} points ({accuracy['full', False]:.3f} vs "
     f"{accuracy['bias+last', True]:.3f})", 16.3, gap),
]
literature_table(table, source="TinyTL (Cai et al. 2020), lecture figures")

fig, ax = plt.subplots(figsize=(8, 3.3))
paired_bars(ax, ["trainable params\nfull / bn+last", "memory\nfull / bn+last", "memory\nfull / bias+last (1-bit)",
                 "accuracy gap\nfull − bias+last (points)"],
            [r[3] for r in table], [r[4] for r in table], source="TinyTL (lecture)", fmt="%.3g")
ax.set_yscale("log")
ax.set_ylabel("× (points in the last group)")
fig.tight_layout()
plt.show()
frozen_weights = one_bit["bias+last"]["params"] / one_bit["bias+last"]["total"]
print(f"bias+last with 1-bit ReLUs: the frozen weights are {frozen_weights:.0%} of its training memory "
      f"at batch {BATCH}")

# %% [markdown]
# The shape reproduces, the sizes follow the model:
#
# - **Parameters.** Our ratio is far larger than the paper's 12× because our 3×3 convolutions with
#   64–128 channels hold almost all the weights and a BatchNorm has only $2C$ of them; mobile networks
#   have many more BatchNorm channels relative to their (depthwise) convolution weights.
# - **`bn+last` memory.** Close to the paper: the weight-side saving (gradients and Adam state) is
#   real, but the activations, which `bn+last` does not reduce, remain.
# - **`bias+last` memory.** Below the paper's 12× at batch 32 because of what cannot shrink: the
#   frozen weights themselves (printed above, most of what is left). Our 8×8 images make activations
#   small next to the weights; the paper's images have hundreds of times more pixels, so there activations dominate.
#   A larger batch plays the same role here: at batch 256 the ratio passes the paper's 12× (table
#   above, and the slider). Without 1-bit masks, the ReLU outputs cap the saving far lower (the
#   table's `nn.ReLU` figure).
# - **Accuracy.** A similar gap: biases alone cannot change what the features detect, only shift them.
#   TinyTL's answer is to add small trainable *lite residual* modules that learn a correction while
#   keeping the activations small: the next chapter.
#
# ## 9. Summary
#
# - Training fewer parameters cuts gradients and optimizer state, not activations:
#   `bn+last` trains a small fraction of the parameters and still keeps nearly all activations.
# - $\partial W = g^\top x$ needs the layer input, $\partial b = \sum g$ does not; a frozen layer needs no
#   stored input at all. `nn.Linear` exploits this, `nn.Conv2d` and `nn.BatchNorm2d` do not (hence
#   `LeanConv2d` and `LeanBatchNorm2d`).
# - What remains for bias-only training is the ReLU's output, yet its backward needs one bit per
#   element: packed 8 to a byte, 32× smaller, with exactly the same gradients.
# - Bias + last layer with 1-bit masks is the cheapest recipe that adapts the features: a fraction
#   of full fine-tuning's memory, some accuracy points below it (the next chapter's lite residuals
#   win them back); at this scale the frozen weights, not the activations, become the floor.
#
# The comparison, measured (batch 32; memory = activations + weights + gradients + Adam state):

# %%
comparison_table()
