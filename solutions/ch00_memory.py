# ---
# jupyter:
#   chapter:
#     title: "Where training memory goes"
#     imports: []
#     prose_numbers:  # phrases whose numbers are definitions or quoted figures (tests/test_prose_numbers.py)
#       - 'Each graded cell may use 60 s and 4 GiB'  # the grader's limits per graded cell
#       - 'values × 4 bytes'  # fp32
#       - '= 352$ bytes for $B = 4$'  # the sum of the saved widths, derived above the line
#       - 'MobileNetV2-1.4 has 4.3× fewer parameters than ResNet-50, but its training activations are only 1.1× smaller'
#       - 'about 6.9× its parameter size'  # TinyTL Figure 1
#       - '784 times fewer pixels'  # (224 / 8)²
#       - '4.3× (ResNet-50 / MobileNetV2-1.4)'
#       - '"1.1×"'
#       - '≈ 6.9× (224×224 images)'  # the paper column
#       - 'reach 6.9× its parameter bytes, the ResNet-50 ratio'
#     mentioned:  # names an exercise's text uses that grading does not offer (tests/test_namespace.py)
#       predict_training_memory:
#         AddmmBackward0: "a grad_fn shown in the text"
#         ReluBackward0: "a grad_fn shown in the text"
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
# # Chapter 0 — Where training memory goes
#
# Inference needs the weights and little else. Training one step needs four things at once:
# the **parameters**, their **gradients**, the **optimizer state** and the **activations** that
# autograd keeps from the forward pass for the backward pass. Every later chapter attacks one of
# these four, so first we learn to count them, exactly, in bytes.
#
# **What you will learn**
# - the formula for each of the four parts, and which one grows with the batch size;
# - what autograd actually saves for backward, tensor by tensor, and why some tensors are
#   shared, some skipped, and some not activations at all;
# - to predict a training step's memory to the byte before running it;
# - why a network with several times fewer parameters can need just as much activation memory
#   (the observation behind TinyTL, Cai et al. 2020).

# %% tags=["setup"]
import torch
import torch.nn.functional as F
from torch import nn

from coursekit import fast, measure, model_state_bytes
from coursekit.models import mlp
from coursekit.steps import measure_training_step

# %% [markdown]
# ## 1. The idea: four parts, one formula each
#
# Take a model with $P$ parameter values, $P_{\text{train}}$ of them trainable, $b$ bytes per
# value ($b = 4$ in fp32):
#
# | part | bytes | grows with batch size? |
# |---|---|---|
# | parameters | $P \cdot b$ | no |
# | gradients | $P_{\text{train}} \cdot b$ | no |
# | optimizer state | $k \cdot P_{\text{train}} \cdot b$, with $k = 0$ for SGD, $1$ for SGD with momentum (a velocity), $2$ for Adam (moments $m$ and $v$) | no |
# | activations | $\sum$ bytes of every tensor autograd saves for backward, each storage once | **yes, linearly** |
#
# The first three are *model state*: they follow from the parameter list alone, which is what
# `coursekit.model_state_bytes` computes. The activations depend on what the backward pass
# needs. For a Linear layer $y = x W^\top + b$ with output gradient $g = \partial L / \partial y$:
#
# $$\frac{\partial L}{\partial W} = g^\top x, \qquad \frac{\partial L}{\partial x} = g\,W, \qquad \frac{\partial L}{\partial b} = \textstyle\sum_{\text{batch}} g .$$
#
# The weight gradient needs the **input** $x$, so $x$ must be kept from the forward pass until
# backward reaches this layer: one row per example, hence linear growth with the batch size.
# The input gradient needs $W$, which is in memory anyway; the bias gradient needs nothing.

# %%
model = mlp([64, 256, 256, 10])
for optimizer in ("sgd", "momentum", "adam"):
    print(f"{optimizer:>8}: {model_state_bytes(model, optimizer)}")
print(f"parameters: {sum(p.numel() for p in model.parameters()):,} values × 4 bytes")

# %% [markdown]
# ## 2. What autograd saves, tensor by tensor
#
# `coursekit.measure` runs one forward and backward and records every tensor that goes through
# autograd's *saved-tensor hook*, counting each underlying storage once. Its `.saved` field lists
# them. Here is a tiny MLP, `Linear(6, 10) → ReLU → Linear(10, 3)`, on a batch of 4 with an MSE
# loss against a random target (that is the step `coursekit.steps.regression_step` builds).

# %%
tiny = mlp([6, 10, 3])
batch = 4
step_measurement = measure_training_step(tiny, batch)
print(f"{'shape':>10} {'bytes':>6}  kind")
for s in step_measurement.saved:
    print(f"{str(s.shape):>10} {s.nbytes:>6}  {'parameter (model state)' if s.is_state else 'activation'}")
print(f"activation bytes: {step_measurement.activation_bytes}, everything saved: {step_measurement.saved_bytes}")

# %% [markdown]
# Five storages. To see *who* saved each one, walk the autograd graph: every node keeps its saved
# tensors in attributes named `_saved_*` (private attributes: fine for a look, not for code you
# depend on). We label each storage with a letter, so a tensor kept by two nodes shows up with
# the same letter twice.

# %%
def saved_by(loss: torch.Tensor) -> list[tuple[str, str, torch.Tensor]]:
    """(node, slot, tensor) for every tensor the graph of ``loss`` keeps, from the loss backwards."""
    rows, seen, queue = [], set(), [loss.grad_fn]
    while queue:
        node = queue.pop(0)
        if node is None or node in seen:
            continue
        seen.add(node)
        for name in dir(node):
            if name.startswith("_saved_") and isinstance(getattr(node, name), torch.Tensor):
                rows.append((type(node).__name__, name.removeprefix("_saved_"), getattr(node, name)))
        queue.extend(fn for fn, _ in node.next_functions)
    return rows


gen = torch.Generator().manual_seed(0)
x, target = torch.randn(batch, 6, generator=gen), torch.randn(batch, 3, generator=gen)  # (4, 6), (4, 3)
loss = F.mse_loss(tiny(x), target)
param_storages = {p.untyped_storage().data_ptr() for p in tiny.parameters()}
storage_labels: dict[int, str] = {}
print(f"{'node':>16} {'slot':>7} {'shape':>8} {'bytes':>6} storage kind")
for node, slot, t in saved_by(loss):
    ptr = t.untyped_storage().data_ptr()
    label = storage_labels.setdefault(ptr, "ABCDEFGH"[len(storage_labels)])
    kind = "parameter" if ptr in param_storages else "activation"
    print(f"{node:>16} {slot:>7} {str(tuple(t.shape)):>8} {t.untyped_storage().nbytes():>6} {label:>7} {kind}")

# %% [markdown]
# Read it from the bottom (the first layer) up:
#
# - **The first Linear saves its input `x`** (slot `mat1`) to compute $\partial L/\partial W_1 = g^\top x$,
#   even though `x` itself needs no gradient. It does *not* save $W_1$ (`mat2` is empty): nothing
#   before it needs $\partial L/\partial x$: the input is frozen, so the first layer's weight
#   never has to be kept for backward.
# - **The first Linear's output is saved by nobody.** The ReLU's backward, $g \odot 1[y > 0]$,
#   needs only its own *output* $y$ (slot `result`), and the Linear's backward never needs its own
#   output.
# - **The ReLU output is saved twice but stored once**: by `ReluBackward0` and, as the input of
#   the second Linear, by `AddmmBackward0`. Same storage letter, counted once.
# - **$W_2^\top$ is saved** (for $\partial L/\partial h = g W_2$) but it is a view of a parameter:
#   model state, already counted under "parameters", not an activation.
# - **The MSE loss saves the prediction and the target**, for $\partial L/\partial \hat y = 2(\hat y - t)/N$.
#
# So: activations $= 4 \cdot B \cdot (6 + 10 + 3 + 3) = 352$ bytes for $B = 4$, exactly what
# `measure` reported. Nothing here was a parameter count: double the batch and the activations
# double, while the model state stays put.

# %% [markdown]
# ## 3. Exercise: predict a training step's memory
#
# Write `predict_training_memory(model, batch_size, optimizer)` for an `nn.Sequential` of
# `nn.Linear` and `nn.ReLU` layers (fp32, all parameters trainable), trained with the regression
# step above (MSE against a target of the last Linear's width). Return the four parts in bytes.
#
# The `"activations"` entry must equal **exactly** what autograd saves, i.e.
# `measure_training_step(model, batch_size).activation_bytes`, but computed from the layer list
# alone: do not run the model. Use the measurement as your oracle while you work out the rules.
# Cases worth trying: two Linears in a row, a Linear without bias, a ReLU *before* the first
# Linear, a ReLU at the very end, two ReLUs in a row, a single Linear.

# %% exercise="predict_training_memory"
def predict_training_memory(model, batch_size, optimizer):
    """Predict the memory of one training step of ``model`` without running it.

    Args:
        model: ``nn.Sequential`` of ``nn.Linear`` and ``nn.ReLU`` modules with at least one
            Linear; fp32, every parameter trainable. The step feeds x: (batch_size, in_features
            of the first Linear) and takes ``F.mse_loss`` against a target of shape
            (batch_size, out_features of the last Linear).
            The grader passes models on PyTorch's ``meta`` device (shapes, no data) that
            cannot be run, moved, materialised (``to_empty``) or given new tensors, so
            predict from the layers' shapes without running anything.
        batch_size: number of examples B (a positive int).
        optimizer: "sgd", "momentum" or "adam".

    Returns:
        dict of ints (bytes) with keys
          "params": all parameters,
          "grads": one gradient per trainable parameter,
          "optimizer_state": 0 / 1 / 2 copies of the trainable parameters,
          "activations": what autograd saves for backward, parameters excluded, each storage
            counted once (equal to ``measure_training_step(model, batch_size).activation_bytes``).

    Raises:
        ValueError: for any other optimizer, naming the bad value and the allowed ones.

    Graded on, in three cells: the "activations" entry (test_predict_training_memory), compared exactly
    with what autograd saves in the real step; the model state ("params", "grads", "optimizer_state"),
    compared exactly with the parameters' bytes for all three optimizers; and the optimizer argument: the
    three names accepted, an unknown one ("rmsprop") raising ValueError whose message names it and the
    allowed ones. The models: hand-made stacks (a single Linear, a Linear without bias down to one output,
    two Linears in a row, ReLUs leading, trailing and two in a row, a stack of five Linears) and random
    stacks of 1 to 5 Linears (widths 1 to 67, biases on and off, up to two ReLUs in a row anywhere), batch
    sizes 1 to 33. Each graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    copies = {"sgd": 0, "momentum": 1, "adam": 2}
    if not isinstance(optimizer, str) or optimizer not in copies:
        raise ValueError(f"unknown optimizer {optimizer!r}: expected one of 'sgd', 'momentum', 'adam'")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)

    layers = list(model)
    first = next(i for i, m in enumerate(layers) if isinstance(m, nn.Linear))
    linears = [m for m in layers if isinstance(m, nn.Linear)]
    # ReLUs before the first Linear are not recorded (nothing before them needs a gradient);
    # the first Linear saves its input, which has the width of x either way. Plus the target.
    values = linears[0].in_features + linears[-1].out_features
    width = linears[0].in_features
    for i in range(first, len(layers)):
        following = layers[i + 1] if i + 1 < len(layers) else None
        if isinstance(layers[i], nn.Linear):
            width = layers[i].out_features
            # Saved as the next Linear's input or as the MSE prediction, unless a ReLU follows:
            # ReLU's backward keeps its output instead.
            if not isinstance(following, nn.ReLU):
                values += width
        else:
            values += width  # a ReLU saves its output; later readers of it share the storage
    activations = batch_size * values * linears[0].weight.element_size()
    return {"params": params, "grads": trainable, "optimizer_state": copies[optimizer] * trainable,
            "activations": activations}
    ### END SOLUTION


# %% test="test_predict_training_memory" points=2 checks="predict_training_memory"
# Activations of mlp([6, 10, 3]) at batch 4: section 2 counted 352 bytes.
got = predict_training_memory(mlp([6, 10, 3]), 4, "adam")
assert isinstance(got, dict), f"return a dict, got {type(got).__name__}"
assert "activations" in got, f"missing key 'activations' in {sorted(got)}"
assert got["activations"] == 352, f"activations: {got['activations']} bytes, section 2 counted 352"

# Activations, checked against what autograd really saves.
cases = {
    "single Linear": nn.Sequential(nn.Linear(37, 11)),
    "no bias": nn.Sequential(nn.Linear(37, 53, bias=False), nn.ReLU(), nn.Linear(53, 11, bias=False)),
    "Linear → Linear": nn.Sequential(nn.Linear(29, 45), nn.Linear(45, 13)),
    "leading ReLU": nn.Sequential(nn.ReLU(), nn.Linear(19, 23), nn.ReLU(), nn.Linear(23, 5)),
    "trailing ReLU": nn.Sequential(nn.Linear(21, 17), nn.ReLU()),
    "ReLU → ReLU": nn.Sequential(nn.Linear(13, 31), nn.ReLU(), nn.ReLU(), nn.Linear(31, 7)),
}
for name, case in cases.items():
    for batch_size in (1, 5):
        want = measure_training_step(case, batch_size).activation_bytes
        have = predict_training_memory(case, batch_size, "sgd")["activations"]
        assert have == want, f"{name}, batch {batch_size}: predicted {have} bytes, autograd saved {want}"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch00_memory", "test_predict_training_memory", globals())
### END HIDDEN TESTS

# %% test="test_predict_training_memory_model_state" points=1 checks="predict_training_memory"
# Model state of mlp([6, 10, 3]): 6·10 + 10 + 10·3 + 3 = 103 values, 412 bytes.
got = predict_training_memory(mlp([6, 10, 3]), 4, "adam")
assert {"params", "grads", "optimizer_state"} <= set(got), f"missing keys in {sorted(got)}"
assert got["params"] == 412, f"params: {got['params']} bytes, expected 412 (103 fp32 values)"
assert got["grads"] == 412, f"grads: {got['grads']} bytes, expected 412 (one gradient per parameter)"
assert got["optimizer_state"] == 824, "Adam keeps two moments (m and v) per trainable parameter"
assert predict_training_memory(mlp([6, 10, 3]), 4, "sgd")["optimizer_state"] == 0, "plain SGD keeps no state"
assert predict_training_memory(mlp([6, 10, 3]), 4, "momentum")["optimizer_state"] == 412, "one velocity buffer"
no_bias = predict_training_memory(nn.Sequential(nn.Linear(6, 10, bias=False)), 4, "sgd")
assert no_bias["params"] == 240, f"params of Linear(6, 10, bias=False): {no_bias['params']} bytes, expected 6·10·4"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch00_memory", "test_predict_training_memory_model_state", globals())
### END HIDDEN TESTS

# %% test="test_predict_training_memory_errors" points=1 checks="predict_training_memory"
try:
    predict_training_memory(mlp([6, 10, 3]), 4, "rmsprop")
except ValueError as e:
    assert all(name in str(e) for name in ("rmsprop", "sgd", "momentum", "adam")), \
        f"name the bad value and the allowed ones: {e}"
else:
    raise AssertionError("an unknown optimizer should raise ValueError")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch00_memory", "test_predict_training_memory_errors", globals())
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Measure it
#
# ### 4.1 Model state is constant, activations grow linearly with the batch
#
# A wider MLP, many batch sizes. The model state comes from your prediction; the activations
# are measured, and compared with your prediction and with $B \times$ (activations at $B = 1$).

# %%
import matplotlib.pyplot as plt
import numpy as np
from tqdm.auto import tqdm

from coursekit.memory import count_parameters
from coursekit.models import SmallCNN, SmallDSCNN
from coursekit.report import literature_table, paired_bars
from coursekit.widgets import slider_plot

PARTS = ("params", "grads", "optimizer_state", "activations")
COLORS = {"params": "#4c72b0", "grads": "#55a868", "optimizer_state": "#c44e52", "activations": "#dd8452"}
MB = 2**20

width = fast(512, 64)
wide = mlp([64, width, width, width, 10])
batch_sizes = fast([1, 4, 16, 64, 256, 1024, 4096], [1, 4, 16, 64])
per_example = measure_training_step(wide, 1).activation_bytes
rows, mismatches = [], []
for b in tqdm(batch_sizes, desc="batch sizes"):
    predicted = predict_training_memory(wide, b, "adam")
    measured = measure_training_step(wide, b).activation_bytes
    assert measured == b * per_example  # exactly linear in the batch size
    if predicted["activations"] != measured:
        mismatches.append(b)
    rows.append({**predicted, "activations": measured})
print(f"measured activations = B × {per_example:,} bytes at every batch size; "
      f"model state = {sum(rows[0][k] for k in PARTS[:3]) / MB:.2f} MB at every batch size")
print("your prediction matches at every batch size" if not mismatches
      else f"your prediction differs at batch sizes {mismatches}: revisit section 3")
state_bytes = sum(rows[0][k] for k in PARTS[:3])
crossover = state_bytes / per_example  # the batch at which activations equal the model state
print(f"activations overtake the model state from a batch of about {crossover:,.0f} examples "
      f"({per_example:,} bytes each against {state_bytes:,} bytes of model state)")

fig, ax = plt.subplots(figsize=(7, 3.5))
positions = np.arange(len(batch_sizes))
bottom = np.zeros(len(batch_sizes))
for part in PARTS:
    heights = np.array([r[part] for r in rows]) / MB
    ax.bar(positions, heights, bottom=bottom, color=COLORS[part], label=part.replace("_", " "))
    bottom += heights
ax.set_xticks(positions, [str(b) for b in batch_sizes])
ax.set_xlabel("batch size")
ax.set_ylabel("MB")
ax.set_title(f"One Adam step of an MLP 64→{width}→{width}→{width}→10 ({count_parameters(wide):,} parameters)")
handles, names = ax.get_legend_handles_labels()
ax.legend(handles[::-1], names[::-1], frameon=False)  # same order as the stack
fig.tight_layout()
plt.show()

# %% [markdown]
# Below the crossover printed above the model state dominates this MLP; beyond it the
# activations do, and they keep growing. For an MLP on 64 features the crossover is late
# because each example carries only a few thousand values. Convolutional networks carry a feature map per
# channel per example, and the crossover comes much sooner.
#
# ### 4.2 Fewer parameters, not fewer activations
#
# `SmallCNN` (for the 8×8 scikit-learn digits) stacks Conv → BatchNorm → ReLU blocks.
# `SmallDSCNN` is the same network with *depthwise-separable* convolutions: a 3×3 filter per
# channel followed by a 1×1 mixing convolution, $9 c_{in} + c_{in} c_{out}$ weights instead of
# $9 c_{in} c_{out}$. MobileNets are built from them. What does that buy at training time?

# %%
batch = 16  # the batch size of the TinyTL comparison
# Saved bytes depend on shapes, not on pixel values: random 8×8 "digits" measure the same as real ones.
gen = torch.Generator().manual_seed(0)
images = torch.rand(batch, 1, 8, 8, generator=gen)  # (16, 1, 8, 8)
digit_labels = torch.randint(0, 10, (batch,), generator=gen)  # (16,)


def cnn_step_memory(net: nn.Module, b: int = batch) -> dict:
    """Parameters and measured activation bytes of one cross-entropy step on b digits."""
    # clone: a slice would keep (and be counted as) the whole repeated storage
    x = images.repeat((b + batch - 1) // batch, 1, 1, 1)[:b].clone()  # (b, 1, 8, 8)
    y = digit_labels.repeat((b + batch - 1) // batch)[:b].clone()  # (b,)
    m = measure(lambda: F.cross_entropy(net(x), y), net)
    return {"parameters": count_parameters(net), "param_bytes": model_state_bytes(net)["params"],
            "activations": m.activation_bytes}


cnn, dscnn = SmallCNN(), SmallDSCNN()
mem = {"SmallCNN": cnn_step_memory(cnn), "SmallDSCNN": cnn_step_memory(dscnn)}
for name, r in mem.items():
    print(f"{name:>10}: {r['parameters']:>7,} parameters ({r['param_bytes'] / 1024:6.1f} KB), "
          f"activations at batch {batch}: {r['activations'] / 1024:6.1f} KB")
param_ratio = mem["SmallCNN"]["parameters"] / mem["SmallDSCNN"]["parameters"]
act_ratio = mem["SmallCNN"]["activations"] / mem["SmallDSCNN"]["activations"]
print(f"SmallCNN / SmallDSCNN: parameters {param_ratio:.1f}×, activations {act_ratio:.2f}×")

# %% [markdown]
# Several times fewer parameters (the ratio printed above), and the activations did not shrink
# at all: they grew (the activation ratio printed above is below one), because the depthwise
# output is one more feature map that the 1×1 convolution must keep for its weight gradient. Where do parameters and activations live? Per block (the activations a
# block adds are what it saves beyond its own input, which the previous block already counted):

# %%
def per_block(net: nn.Module) -> tuple[list[int], list[int]]:
    """Parameter bytes and added activation bytes of each block of a SmallCNN-like network."""
    params, acts = [], []
    x = images
    for block in net.blocks:
        with torch.no_grad():
            y = block(x)
        m = measure(lambda: block(x), block, grad=torch.ones_like(y))
        params.append(model_state_bytes(block)["params"])
        acts.append(m.activation_bytes - x.nbytes)  # the block's input is the previous block's output
        x = y
    return params, acts


NET_COLORS = {"SmallCNN": "#4c72b0", "SmallDSCNN": "#8172b3"}
fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
for ax, key, title in ((axes[0], "param_bytes", "parameters"), (axes[1], "activations", f"activations, batch {batch}")):
    ax.bar(list(mem), [mem[n][key] / 1024 for n in mem], color=list(NET_COLORS.values()))
    ax.set_title(title)
    ax.set_ylabel("KB")
blocks = np.arange(len(cnn.blocks))
tallest = 0.0
for offset, (name, net) in zip((-0.2, 0.2), (("SmallCNN", cnn), ("SmallDSCNN", dscnn))):
    p, a = (np.array(v) / 1024 for v in per_block(net))
    axes[2].bar(blocks + offset, a, width=0.4, color=NET_COLORS[name], alpha=0.75, label=f"{name} activations")
    axes[2].scatter(blocks + offset, p, marker="D", color=NET_COLORS[name], edgecolor="k", zorder=3,
                    label=f"{name} parameters")
    tallest = max(tallest, a.max(), p.max())
axes[2].set_xticks(blocks, [f"block {i}" for i in blocks])
axes[2].set_ylim(0, 1.45 * tallest)
axes[2].set_ylabel("KB")
axes[2].set_title("per block")
axes[2].legend(frameon=False, fontsize=7, ncol=2, loc="upper center")
fig.tight_layout()
plt.show()

# %% [markdown]
# The early blocks work at full 8×8 resolution with few channels: most of the activations,
# few parameters. The late blocks have many channels at 2×2: most of the parameters, few
# activations. Depthwise-separable convolutions shrink the late blocks' weights and leave the
# early blocks' feature maps alone, and those feature maps are what training must keep.
#
# > **Your lecture notes vs what we measure: are a MobileNet's activations almost equal to its big
# > sibling's?**
# > The lecture notes put it as: the efficient, depthwise-separable model needs almost the same
# > activation memory as the big one. For MobileNetV2 against ResNet-50, networks that also differ
# > in depth and width, TinyTL's figure supports that (section 6). For the same network with only
# > its convolutions made separable, "almost equal" undersells it: every separable block keeps its
# > depthwise output on top of everything the plain block keeps, so the efficient network needs
# > *more*. The cell below measures how much more, block by block, and checks that the excess is
# > exactly those depthwise outputs.

# %%
_, acts_cnn = per_block(cnn)
_, acts_ds = per_block(dscnn)
x_block, depthwise_bytes = images, []
with torch.no_grad():
    for block in dscnn.blocks:
        separable = block[0].groups > 1  # the stem is a full convolution in both networks
        depthwise_bytes.append(block[0](x_block).nbytes if separable else 0)
        x_block = block(x_block)
for i, (a, b, d) in enumerate(zip(acts_cnn, acts_ds, depthwise_bytes)):
    print(f"block {i}: SmallCNN {a / 1024:6.1f} KB, SmallDSCNN {b / 1024:6.1f} KB; "
          f"difference {(b - a) / 1024:+6.1f} KB, its depthwise output {d / 1024:5.1f} KB")
assert [b - a for a, b in zip(acts_cnn, acts_ds)] == depthwise_bytes
more = mem["SmallDSCNN"]["activations"] / mem["SmallCNN"]["activations"] - 1
print(f"SmallDSCNN keeps {more:+.0%} activations relative to SmallCNN (SmallCNN / SmallDSCNN = {act_ratio:.2f}×), "
      f"with {param_ratio:.1f}× fewer parameters; the excess is exactly the depthwise outputs")

# %% [markdown]
# ## 5. Play with it
#
# An MLP with 64 inputs, `depth` hidden layers of `width` units and 10 outputs. Left bar: your
# prediction. Right bar: the same model state with the activations *measured*. Move the batch
# size and watch which part takes over.

# %% tags=["demo"]
from functools import lru_cache


@lru_cache(maxsize=64)
def measured_mlp(depth, width):
    """The MLP and its activations measured at batch 1 and 2. Section 4.1 showed them linear
    in the batch, so these two measurements give every batch size exactly, and moving the
    batch slider measures nothing again (a 2048-example step of the widest MLP takes seconds)."""
    net = mlp([64] + [width] * depth + [10])
    at_1, at_2 = (measure_training_step(net, b).activation_bytes for b in (1, 2))
    return net, at_1, at_2 - at_1


def draw(ax, batch_size=64, depth=3, width=256, optimizer="adam"):
    net, at_1, per_example = measured_mlp(depth, width)
    predicted = predict_training_memory(net, batch_size, optimizer)
    measured = {**model_state_bytes(net, optimizer), "activations": at_1 + (batch_size - 1) * per_example}
    totals = []
    for i, parts in enumerate((predicted, measured)):
        bottom = 0.0
        for part in PARTS:
            ax.bar(i, parts[part] / MB, bottom=bottom, color=COLORS[part],
                   label=part.replace("_", " ") if i == 0 else None)
            bottom += parts[part] / MB
        ax.text(i, bottom, f"{bottom:.2f} MB", ha="center", va="bottom")
        totals.append(bottom)
    ax.set_xticks([0, 1], ["predicted", "measured activations"])
    ax.set_ylabel("training memory (MB)")
    ax.set_xlim(-0.8, 2.6)
    ax.set_ylim(0, 1.15 * max(totals))
    ax.set_title(f"{count_parameters(net):,} parameters, batch {batch_size}, {optimizer}")
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], frameon=False, loc="upper right")  # same order as the stack


def activation_share(batch_size, depth, width, optimizer):
    net, at_1, per_example = measured_mlp(depth, width)
    acts, state = at_1 + (batch_size - 1) * per_example, sum(model_state_bytes(net, optimizer).values())
    return f"batch {batch_size}: activations are {acts / (acts + state):.0%} of the step's {(acts + state) / MB:.2f} MB"


slider_plot(draw, figsize=(10, 4.4), batch_size=(1, fast(2048, 64), 1), depth=(1, 8, 1),
            width=(16, fast(1024, 128), 16), optimizer=["adam", "momentum", "sgd"],
            defaults={"batch_size": 64, "depth": 3, "width": fast(256, 64)},
            labels={"batch_size": "batch size (examples)", "depth": "hidden layers",
                    "width": "hidden width (units)", "optimizer": "optimizer"},
            explain={"batch_size": "examples per step: only the activations grow with it",
                     "depth": "hidden Linear + ReLU layers of the MLP",
                     "width": "units per hidden layer: the parameters grow with its square",
                     "optimizer": "what the optimizer keeps per parameter (Adam: two moments)"},
            notice={"batch_size": activation_share})

# %% [markdown]
# ## 6. What the literature reports vs what we measured
#
# TinyTL (Cai et al., *TinyTL: Reduce Memory, Not Parameters for Efficient On-Device Learning*,
# NeurIPS 2020) opens with this comparison (Figure 1, right, batch size 16): MobileNetV2-1.4 has
# 4.3× fewer parameters than ResNet-50, but its training activations are only 1.1× smaller.
# Read off the same figure, ResNet-50's activations are about 6.9× its parameter size (as
# quoted in the MIT 6.5940 lecture on on-device training). Their Table 1 adds that a ReLU's
# backward needs only one bit per element, the sign mask. We measure the same quantities on our
# small pair, at the same batch size; the ReLU row measures what PyTorch actually keeps.

# %%
relu_in = torch.randn(1000, requires_grad=True)
relu_bits = 8 * measure(lambda: torch.relu(relu_in).sum()).activation_bytes / relu_in.numel()
cnn_act_per_param = mem["SmallCNN"]["activations"] / mem["SmallCNN"]["param_bytes"]
# BatchNorm's saved statistics do not depend on the batch: take the per-example slope
per_example_cnn = (cnn_step_memory(cnn, 2 * batch)["activations"] - mem["SmallCNN"]["activations"]) / batch
batch_for_paper_ratio = 6.9 * mem["SmallCNN"]["param_bytes"] / per_example_cnn

table = [
    ("parameters, big / efficient model", "4.3× (ResNet-50 / MobileNetV2-1.4)", f"{param_ratio:.1f}× (SmallCNN / SmallDSCNN)", 4.3, param_ratio),
    ("activations, big / efficient model", "1.1×", f"{act_ratio:.2f}×", 1.1, act_ratio),
    ("activations / parameters, big model, batch 16", "≈ 6.9× (224×224 images)", f"{cnn_act_per_param:.1f}× (8×8 images)", 6.9, cnn_act_per_param),
    ("bits a ReLU keeps per element", "1 (a mask suffices)", f"{relu_bits:.0f} (PyTorch keeps the fp32 output)", 1, relu_bits),
]
literature_table(table, source="TinyTL (Cai et al. 2020)")

fig, ax = plt.subplots(figsize=(8, 3.3))
paired_bars(ax, ["parameters\nbig / efficient", "activations\nbig / efficient",
                 "activations / parameters\nbig model, batch 16", "bits a ReLU keeps\nper element"],
            [row[3] for row in table], [row[4] for row in table], source="TinyTL (paper)", fmt="%.3g")
ax.axhline(1, color="k", lw=0.6)
ax.set_yscale("log")
ax.set_ylim(0.3, 100)
ax.set_ylabel("× (bits in the last group)")
fig.tight_layout()
plt.show()
print(f"One 8×8 image costs SmallCNN {per_example_cnn / 1024:.1f} KB of activations: at a batch of about "
      f"{batch_for_paper_ratio:.0f}, its activations reach 6.9× its parameter bytes, the ResNet-50 ratio.")
RESNET50_PARAMETERS = 25_557_032  # torchvision's resnet50
print(f"SmallCNN has {mem['SmallCNN']['parameters']:,} parameters, "
      f"{RESNET50_PARAMETERS / mem['SmallCNN']['parameters']:,.0f}× fewer than ResNet-50")

# %% [markdown]
# The shape of the result carries over to a model far smaller than ResNet-50 (the line under the
# plot): cutting parameters with depthwise-separable convolutions does not cut activations
# (ours even grow; a same-width comparison is harsher than ResNet-50 vs MobileNetV2, which also
# differ in depth and width). Our activation-to-parameter ratio at
# batch 16 is far below ResNet-50's because an 8×8 image has 784 times fewer pixels than a
# 224×224 one; a larger batch closes the gap, since activations grow with it and parameters
# do not. And PyTorch's ReLU keeps a whole fp32 value per element where one bit would do
# (the last row): chapter material for later.
#
# ## 7. Summary
#
# - Training memory = parameters + gradients + optimizer state (0, 1 or 2 extra copies for SGD,
#   momentum, Adam) + activations. Only the last grows with the batch size, linearly.
# - Activations are exactly the tensors autograd saves: a Linear keeps its input (for
#   $\partial L/\partial W = g^\top x$), a ReLU its output, the MSE loss its prediction and target.
#   Tensors kept by two nodes are one storage; weights saved for $\partial L/\partial x$ are
#   model state; the first layer never needs $W_1$ because nothing needs $\partial L/\partial x$.
# - `coursekit.measure` counts them to the byte, so every technique in this course can be
#   checked as a resource claim, not a feeling.
# - Fewer parameters is not less training memory: the activations are the bottleneck, and they
#   live in the early, high-resolution layers. The next chapters attack them directly.
