# ---
# jupyter:
#   chapter:
#     title: "AAL: weight gradients from auxiliary activations (1-bit ASA, ARA)"
#     imports: [kernels]
#     prose_numbers:  # phrases whose numbers are definitions or quoted figures (tests/test_prose_numbers.py)
#       - 'Each graded cell runs within 60 s and 4 GiB'  # the grader's limits per graded cell
#       - 'output y and 2 MiB'  # the memory checks' slack
#       - 'plus 4 MiB'
#       - 'from 32 bits to 1 bit'  # fp32 vs a packed sign
#       - 'ResNet-152 on ImageNet with ARA(2,2,2,2): 77.14% top-1 against 77.38% for backprop with 28.5% of the activation memory saved; a Transformer on IWSLT with ASA2: BLEU 35.12 against 35.14 with 21.3% saved'  # AAL paper (unverified)
#       - '77.14% vs 77.38%'  # the paper's figures, quoted in the table
#       - '28.5% (ARA), 21.3% (ASA2)'
#       - 'packed at 1 bit per element'  # the definition of ASA's storage
#       - '(64 × in_features, in_features 1024 to 2048)'  # the grader's measured layer
#       - 'the packed s of 64 × 256 elements'  # the visible test's layer
#       - '(1,400 training and 397 test images, batch 50)'  # the split defined in code
#       - '(12 to 16 MiB;'  # the grader's measured input
#       - '(4 bytes × rows × h per block)'  # fp32
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
# # Chapter 12 — AAL: learning with auxiliary activations
#
# A linear layer $y = xW^\top + b$ keeps its input $x$ for backward, only to compute the weight
# gradient $\partial W = g^\top x$. Woo and Jeon (*Learning with Auxiliary Activation for
# Memory-Efficient Training*, ICLR 2023) ask: what if the layer computed its output from a slightly
# changed input $\tilde x = x + a$, and its weight gradient from the **auxiliary activation** $a$
# alone, something far cheaper to keep than $x$?
#
# **What you will learn**
# - why $\partial x = gW$ needs no activation at all and $\partial W = g^\top x$ does;
# - **ASA** (auxiliary sign activation): $a = \epsilon\,\mathrm{sign}(x)$, kept as one bit per
#   element, with a learning-rate expansion $\lambda$ that undoes the small $\epsilon$;
# - **ARA** (auxiliary residual activation): in a residual network, the stream at the start of a
#   group of blocks is already $\approx$ the input of every block in the group; keep it once;
# - the **learning indicator**, which says whether a step along the auxiliary gradient still
#   descends, and how it decays with the distance from the group start;
# - what it costs in accuracy on our digits MLP and a residual MLP, measured.

# %% tags=["setup"]
import torch
import torch.nn.functional as F
from torch import nn

from kernels.ch05_tinytl import pack_mask_torch, unpack_mask_torch


class ResidualMLPBlock(nn.Module):
    """A residual MLP block: x + fc2(relu(fc1(x))), with fc1: Linear(d, h) and fc2: Linear(h, d)."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., d) -> (..., d)
        return x + self.fc2(F.relu(self.fc1(x)))


# %% [markdown]
# ## 1. The idea
#
# For $y = xW^\top + b$ over a batch (every leading dimension of $x$ flattened into rows) and the
# output gradient $g = \partial L/\partial y$:
#
# $$\partial x = g\,W, \qquad \partial W = g^\top x, \qquad \partial b = \textstyle\sum_i g_i .$$
#
# Only $\partial W$ reads $x$. AAL runs the forward pass on $\tilde x = x + a$ and takes
#
# $$y = \tilde x W^\top + b, \qquad \partial x = g\,W \ (\text{exact}), \qquad
#   \partial W = \lambda\, g^\top a, \qquad \partial b = \textstyle\sum_i g_i ,$$
#
# so backward needs $a$ (and $W$), never $x$. The network really computes with $\tilde x$: the
# weight gradient $g^\top a$ is the gradient a layer whose input were $a$ would get. It is a
# different direction from $g^\top \tilde x$, and whether it still lowers the loss is what the
# learning indicator of section 5 measures.
#
# **ASA.** $a = \epsilon\, s$ with $s = +1$ where $x > 0$ and $s = -1$ elsewhere ($x = 0$ gives
# $-1$: this is *not* `torch.sign`, which maps 0 to 0). After a ReLU every input is $\ge 0$, and
# the authors' `relu=True` uses $s \in \{1, 0\}$ ($1$ where $x > 0$). Either way $s$ takes two
# values: one bit per element, against 32 for the fp32 input. The small $\epsilon$ (the authors'
# default 0.01) keeps $\tilde x$ close to $x$; the gradient $\epsilon\, g^\top s$ is then tiny, and
# the learning-rate expansion $\lambda$ (default 100, so $\lambda\epsilon = 1$) scales it back.
#
# ## 2. Exercise: `asa_linear`
#
# Write it as a `torch.autograd.Function` defined inside the function. Keep $s$ packed with the
# course's 1-bit packing from chapter 5, imported in the setup cell:
# `pack_mask_torch(mask)` turns a bool tensor of $n$ elements into $\lceil n/8 \rceil$ uint8 bytes,
# `unpack_mask_torch(packed, n)` gives back the flat bool tensor. In `backward`,
# `ctx.needs_input_grad` says which gradients autograd needs: return `None` for the others and do
# not compute them.

# %% exercise="asa_linear"
def asa_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, epsilon: float = 0.01,
               lam: float = 100.0, relu: bool = False) -> torch.Tensor:
    """A Linear layer trained with an auxiliary sign activation (ASA).

    Args:
        x: (..., in_features) float32 tensor, any number of leading (batch) dimensions, 1-D included.
        weight: (out_features, in_features).
        bias: (out_features,) or None (no bias term, no bias gradient).
        epsilon: the auxiliary activation's size, > 0.
        lam: the learning-rate expansion λ of the weight gradient.
        relu: False: s = +1 where x > 0 and -1 elsewhere (x == 0 gives -1, unlike torch.sign);
            True: s = 1 where x > 0 and 0 elsewhere (for inputs that come out of a ReLU).

    Returns:
        y: (..., out_features) = F.linear(x + epsilon * s, weight, bias), attached to the autograd graph.
        Its backward, for an output gradient g (leading dimensions flattened into rows):
          dx = g W exactly (x's shape; s plays no part in it);
          dW = lam * epsilon * gᵀ s;
          db = Σ g over every row.
        A gradient whose input does not require grad is None and not computed: with x not requiring grad,
        dx is not computed (checked by freeing the weight's storage between forward and backward: only dx
        reads it).
        The forward keeps for backward only s, packed at 1 bit per element (pack_mask_torch of the bool
        tensor x > 0: ceil(n / 8) bytes for n elements of x), plus the weight itself: nothing of x, no
        bool or float copy of s.

    Raises:
        ValueError: if x.shape[-1] differs from weight.shape[1], or epsilon <= 0.

    test_asa_linear grades y, dx, dW and db; test_asa_linear_memory what the forward keeps;
    test_asa_linear_edge_cases no bias, a 1-D x, x or the weight not requiring grad, and the errors.
    Graded on float32 tensors, the weight and bias as nn.Parameters (as in an nn.Module) in some calls and
    plain tensors in others, with and without bias, x 1-D, 2-D and 3-D, with and without grad, inputs with
    exact zeros, relu False and True, the defaults and other epsilon and lam (so that lam * epsilon is not 1):
    fixed layers (37 × 53 → 29, x of shape (2, 5, 53), smaller ones, and the notebook's 50 × 256 → 256 and
    → 10), layers drawn at grading time (rows 2 to 64, in_features 2 to 96, out_features 2 to 64) and one
    whose x has 10^4 to 10^6 elements, drawn log-uniformly (in_features 32 to 512, out_features 8 to 128).
    test_asa_linear_memory reads from outside your process what one forward keeps until backward, in two
    calls, shapes and values drawn at grading time, x made for the call and released after it, the weight
    (64 × in_features, in_features 1024 to 2048) held by the grader: (a) an nn.Parameter weight and bias,
    x 3-D (2 to 8, rows, in_features) of 12 × 2^20 to 15 × 2^20 elements requiring grad; (b) a plain weight,
    no bias, x 2-D of 8 × 2^20 to 12 × 2^20 elements not requiring grad. Kept: at most the packed s, the
    output y and 2 MiB. The output gradient is drawn and sent only after the forward; y, the whole dW, db,
    and dx (rows of it) of that very call are checked. Each graded cell runs within 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    if x.shape[-1:] != weight.shape[1:]:
        raise ValueError(f"x has {tuple(x.shape)[-1:]} input features, the weight expects {weight.shape[1]}")
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")

    class ASALinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            positive = x > 0
            s = positive.to(x.dtype) if relu else torch.where(positive, 1.0, -1.0).to(x.dtype)
            y = F.linear(x + epsilon * s, weight, bias)
            ctx.save_for_backward(pack_mask_torch(positive), weight)  # 1 bit per element of x, and W itself
            ctx.x_shape = x.shape
            return y

        @staticmethod
        def backward(ctx, g):  # g: (..., out_features)
            packed, weight = ctx.saved_tensors
            need_x, need_w, need_b = ctx.needs_input_grad
            rows = g.reshape(-1, g.shape[-1])  # (N, out)
            dx = dw = db = None
            if need_x:
                dx = (rows @ weight).reshape(ctx.x_shape)  # exact: s plays no part
            if need_w:
                n_in = ctx.x_shape[-1]
                positive = unpack_mask_torch(packed, rows.shape[0] * n_in).view(-1, n_in)
                s = positive.to(g.dtype) if relu else torch.where(positive, 1.0, -1.0).to(g.dtype)
                dw = (lam * epsilon) * (rows.t() @ s)  # (out, in)
            if need_b:
                db = rows.sum(0)
            return dx, dw, db

    return ASALinear.apply(x, weight, bias)
    ### END SOLUTION


# %% test="test_asa_linear" points=3 checks="asa_linear"
x_t = torch.tensor([[1.0, 0.0, -2.0], [-0.5, 3.0, 0.0]], requires_grad=True)  # exact zeros: s = -1 there
w_t = torch.arange(6.0).reshape(2, 3).div(10).requires_grad_()
b_t = torch.tensor([0.5, -0.5], requires_grad=True)
s_t = torch.tensor([[1.0, -1.0, -1.0], [-1.0, 1.0, -1.0]])
y_t = asa_linear(x_t, w_t, b_t, epsilon=0.1, lam=2.0)
assert torch.allclose(y_t, (x_t + 0.1 * s_t) @ w_t.T + b_t), "y = W (x + ε s) + b, s = +1 where x > 0, -1 elsewhere"
g_t = torch.tensor([[1.0, -2.0], [0.5, 1.0]])
y_t.backward(g_t)
assert torch.allclose(x_t.grad, g_t @ w_t.detach()), "dx = g W exactly"
assert torch.allclose(w_t.grad, 2.0 * 0.1 * g_t.T @ s_t), "dW = λ ε gᵀ s"
assert torch.allclose(b_t.grad, g_t.sum(0)), "db = Σ g"
y_r = asa_linear(x_t.detach(), w_t.detach(), None, relu=True)
assert torch.allclose(y_r, (x_t.detach() + 0.01 * (x_t.detach() > 0).float()) @ w_t.detach().T), \
    "relu=True: s = 1 where x > 0, 0 elsewhere"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch12_aal", "test_asa_linear", globals())
### END HIDDEN TESTS

# %% test="test_asa_linear_memory" points=2 checks="asa_linear"
from coursekit import measure

x_t = torch.randn(64, 256)
w_t = torch.randn(32, 256, requires_grad=True)
m_t = measure(lambda: asa_linear(x_t, w_t, None), w_t, grad=torch.randn(64, 32))
# At most: measure sees what save_for_backward keeps; a packed s kept as a ctx attribute shows 0 bytes here
# (the graded cell reads your whole process from outside, and sees it there).
assert m_t.activation_bytes <= 64 * 256 // 8, \
    f"asa_linear kept {m_t.activation_bytes:,} bytes of activations; the packed s of 64 × 256 elements is " \
    f"{64 * 256 // 8:,} bytes"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch12_aal", "test_asa_linear_memory", globals())
### END HIDDEN TESTS

# %% test="test_asa_linear_edge_cases" points=1 checks="asa_linear"
x_t = torch.randn(4, 6)  # needs no grad: dx is not computed
w_t = torch.randn(3, 6, requires_grad=True)
y_t = asa_linear(x_t, w_t, None)
y_t.backward(torch.ones(4, 3))
assert w_t.grad.shape == (3, 6), "without bias and without dx, dW still arrives"
y_1 = asa_linear(torch.randn(6), w_t, None)
assert y_1.shape == (3,), "a 1-D x gives a 1-D y"
for bad in (dict(x=torch.randn(4, 5)), dict(x=x_t, epsilon=0.0)):
    try:
        asa_linear(bad["x"], w_t, None, epsilon=bad.get("epsilon", 0.01))
    except ValueError:
        pass
    else:
        raise AssertionError(f"asa_linear should raise ValueError for {bad}")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch12_aal", "test_asa_linear_edge_cases", globals())
### END HIDDEN TESTS

# %% [markdown]
# ## 3. What ASA keeps, measured
#
# Our network for the chapter: an MLP 64–256–256–10 on scikit-learn's 8×8 digits (1,400 training and
# 397 test images, batch 50). As in the authors' setup the first layer stays a plain Linear (its
# input is the data, which is kept anyway) and the second and third take ASA. `ASALayer` wraps an
# `nn.Linear`'s parameters and calls your `asa_linear`; `use_asa=False` turns it back into plain
# backprop with the same parameters, which is how we compare gradients below.
#
# First the bytes each layer keeps for backward (`coursekit.measure`, one layer at a time, the
# parameters not counted), then the whole network's. A Linear's saved input goes from 32 bits to 1 bit
# per element; but the ReLU in front of it keeps its own output for its own backward, so the whole
# network saves something only once the ReLU keeps a 1-bit mask too (chapter 4's `relu_1bit`, here
# the course's `kernels.ch05_tinytl.relu_packed`).

# %%
import time

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import Markdown, display
from sklearn.datasets import load_digits
from tqdm.auto import tqdm

from coursekit import fast, measure
from coursekit.report import literature_table, paired_bars
from coursekit.timing import compare, time_it
from coursekit.widgets import slider_plot
from kernels.ch05_tinytl import relu_packed

KIB = 1024
BATCH = 50
digits = load_digits()
images = torch.tensor(digits.data, dtype=torch.float32) / 16.0  # (1797, 64) in [0, 1]
labels = torch.tensor(digits.target)
order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
x_train, y_train = images[order[:1400]], labels[order[:1400]]
x_test, y_test = images[order[1400:]], labels[order[1400:]]


class ASALayer(nn.Module):
    """A Linear whose weight gradient comes from ASA (``use_asa=False``: plain backprop, same parameters)."""

    def __init__(self, linear: nn.Linear, relu: bool = False, epsilon: float = 0.01, lam: float = 100.0):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.relu, self.epsilon, self.lam, self.use_asa = relu, epsilon, lam, True

    def forward(self, x):
        if not self.use_asa:
            return F.linear(x, self.weight, self.bias)
        return asa_linear(x, self.weight, self.bias, self.epsilon, self.lam, self.relu)


class PackedReLU(nn.Module):
    def forward(self, x):
        return relu_packed(x)


def make_mlp(seed=0, asa=(), relu_sign=False, packed_relu=False):
    """MLP 64-256-256-10; ``asa``: which Linears (1, 2, 3) take ASA; ``relu_sign``: s in {1, 0}."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        linears = [nn.Linear(64, 256), nn.Linear(256, 256), nn.Linear(256, 10)]
    layers = []
    for i, lin in enumerate(linears, start=1):
        if i > 1:
            layers.append(PackedReLU() if packed_relu else nn.ReLU())
        layers.append(ASALayer(lin, relu=relu_sign and i > 1) if i in asa else lin)
    return nn.Sequential(*layers)


x_batch, y_batch = x_train[:BATCH], y_train[:BATCH]
h_in = torch.relu(torch.randn(BATCH, 256))
rows = ["| layer | backprop: bytes kept | ASA: bytes kept |", "|---|---|---|"]
for name, (n_in, n_out) in (("Linear 256 → 256", (256, 256)), ("Linear 256 → 10", (256, 10))):
    lin = nn.Linear(n_in, n_out)
    bp = measure(lambda: lin(h_in), lin, grad=torch.ones(BATCH, n_out))
    asa = measure(lambda: ASALayer(lin)(h_in), lin, grad=torch.ones(BATCH, n_out))
    rows.append(f"| {name} | {bp.activation_bytes:,} | {asa.activation_bytes:,} "
                f"({bp.activation_bytes / asa.activation_bytes:.0f}× less) |")
display(Markdown("\n".join(rows)))

whole = {}
for name, kw in (("backprop", {}), ("ASA on layers 2-3", dict(asa=(2, 3))),
                 ("ASA on layers 2-3 + 1-bit ReLUs", dict(asa=(2, 3), packed_relu=True)),
                 ("backprop + 1-bit ReLUs", dict(packed_relu=True))):
    model = make_mlp(**kw)
    whole[name] = measure(lambda: F.cross_entropy(model(x_batch), y_batch), model).activation_bytes
for name, b in whole.items():
    print(f"{name:34} {b:>8,} bytes kept for backward ({b / whole['backprop']:.0%} of backprop)")

# %% [markdown]
# The per-layer table is the promise: the saved input shrinks by the ratio of an fp32 value to a bit.
# The lines under it are the catch: with torch's ReLU in front, the network keeps what it kept before
# *plus* the packed signs, because the ReLU's output, which the plain Linear kept, is still kept by the
# ReLU itself (one storage, counted once). A 1-bit ReLU alone does not help either: the plain Linear after
# it still keeps the fp32 output. Only both together drop the fp32 tensor. ASA pays off where a Linear's
# input is kept by nothing else.
#
# Next, is the exact input gradient really exact, and how close is the ASA weight gradient to the
# true one? On one batch, at initialisation, for the second Linear:

# %%
def layer_grads(model, x, y, use_asa):
    for m in model.modules():
        if isinstance(m, ASALayer):
            m.use_asa = use_asa
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    F.cross_entropy(model(x), y).backward()
    return x.grad, model[2].weight.grad.clone()


probe = make_mlp(asa=(2, 3))
dx_bp, dw_bp = layer_grads(probe, x_batch, y_batch, False)
dx_asa, dw_asa = layer_grads(probe, x_batch, y_batch, True)
print(f"input gradient, ASA vs backprop: max difference {(dx_asa - dx_bp).abs().max():.2e} "
      f"(the network computes on x + εs, so g differs slightly)")
print(f"weight gradient of layer 2, cosine(ASA, backprop) = {F.cosine_similarity(dw_asa.flatten(), dw_bp.flatten(), dim=0):.3f}")

# %% [markdown]
# ## 4. Training with ASA
#
# Adam, learning rate 1e-3, batch 50, the same seeds for every method. Every twentieth step we also
# compute the backprop gradient of the second Linear with the same weights on the same batch and
# record its cosine with the ASA gradient the optimizer actually uses.

# %%
EPOCHS = fast(20, 1)
SEEDS = fast((0, 1), (0,))


def accuracy(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def train(make, seed=0, epochs=EPOCHS, cosine_every=20):
    """Train make(seed) with Adam 1e-3; test accuracy and the cosines between ASA and backprop gradients of the
    second Linear (model[2]) taken every ``cosine_every`` steps (none when it is plain)."""
    model = make(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    has_asa = isinstance(model[2], ASALayer) if isinstance(model, nn.Sequential) else False
    cosines, step = [], 0
    for _ in range(epochs):
        perm = torch.randperm(len(y_train), generator=gen)
        for start in range(0, len(perm), BATCH):
            idx = perm[start:start + BATCH]
            if has_asa and step % cosine_every == 0:
                _, exact = layer_grads(model, x_train[idx], y_train[idx], False)
                _, approx = layer_grads(model, x_train[idx], y_train[idx], True)
                cosines.append(F.cosine_similarity(exact.flatten(), approx.flatten(), dim=0).item())
            else:
                model.zero_grad(set_to_none=True)
                F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
            opt.step()
            step += 1
    return {"acc": accuracy(model, x_test, y_test), "cosines": cosines, "model": model}


MLP_RUNS = {"backprop": dict(), "ASA ±1 (layers 2-3)": dict(asa=(2, 3)),
            "ASA {1,0} (layers 2-3)": dict(asa=(2, 3), relu_sign=True)}
start = time.perf_counter()
mlp_runs = {(name, seed): train(lambda s, kw=kw: make_mlp(s, **kw), seed)
            for name, kw in tqdm(MLP_RUNS.items(), desc="MLP runs") for seed in SEEDS}
print(f"{len(mlp_runs)} runs of {EPOCHS} epochs in {time.perf_counter() - start:.1f} s")
lines = ["| method | " + " | ".join(f"seed {s}" for s in SEEDS) + " |", "|---|" + "---|" * len(SEEDS)]
for name in MLP_RUNS:
    lines.append(f"| {name} | " + " | ".join(f"{mlp_runs[name, s]['acc']:.1%}" for s in SEEDS) + " |")
display(Markdown("Test accuracy after the last epoch:\n\n" + "\n".join(lines)))

# %%
fig, ax = plt.subplots(figsize=(7, 3.2))
for name in list(MLP_RUNS)[1:]:
    c = mlp_runs[name, 0]["cosines"]
    ax.plot(np.arange(len(c)) * 20, c, label=name, lw=1)
ax.set_xlabel("training step")
ax.set_ylabel("cosine(ASA ∂W₂, backprop ∂W₂)")
ax.set_ylim(0, 1)
ax.legend(fontsize=8, frameon=False)
fig.tight_layout()
plt.show()
c0 = mlp_runs["ASA ±1 (layers 2-3)", 0]["cosines"]
print(f"ASA ±1: cosine {c0[0]:.2f} at the start, {np.mean(c0[-10:]):.2f} over the last ten readings")

# %% [markdown]
# ## 5. ARA: the residual stream as the auxiliary activation
#
# In a residual network the stream changes little from one block to the next:
# $x_{i+1} = x_i + f_i(x_i)$. ARA takes a **group** of $k$ consecutive blocks and lets the first
# layer of every block in it take its weight gradient from the group's input $x_0$ instead of its own
# input $x_i$. In AAL's terms the layer computes on $\tilde x = x_i$ with the auxiliary activation
# $a = x_0$ (the difference $x_i - x_0$ is the sum of the earlier blocks' branches). Only one tensor,
# $x_0$, is kept for all those weight gradients, instead of one input per block; the group's first
# block gets $x_0$ itself, so its gradient is exact backprop. ARA has no learning-rate expansion:
# $a$ is as large as $x_i$.
#
# The blocks here are the setup cell's `ResidualMLPBlock`: $x_{i+1} = x_i + \mathrm{fc2}(\mathrm{relu}(
# \mathrm{fc1}(x_i)))$. In each block only `fc1` changes its backward:
#
# $$z_i = x_i W_1^\top + b_1 \ (\text{forward from the real input}), \qquad
#   \partial x_i = g_i W_1 \ (\text{exact}), \qquad \partial W_1 = g_i^\top x_0, \qquad
#   \partial b_1 = \textstyle\sum g_i ,$$
#
# with $g_i = \partial L/\partial z_i$; the ReLU and `fc2` are ordinary backprop (they keep the
# ReLU's output, as always).

# %% exercise="ara_group"
def ara_group(blocks, x: torch.Tensor) -> torch.Tensor:
    """Run a group of ResidualMLPBlocks with auxiliary residual activation (ARA).

    Args:
        blocks: a non-empty sequence of ResidualMLPBlock (a list, tuple or nn.ModuleList), run in order.
        x: (..., d) float32, the residual stream entering the group: x_0; any leading (batch) dimensions.

    Returns:
        The stream after the last block, (..., d): block i maps x_i to
        x_{i+1} = x_i + fc2(relu(fc1(x_i))), every value computed from the real x_i (the output equals
        running the blocks one after the other). Its backward is backprop's except for each block's fc1:
        with g_i the gradient at fc1's output (before the ReLU), leading dimensions flattened into rows,
          fc1.weight's gradient is g_iᵀ x_0: the group's input for every block, not the block's own x_i
          (no λ: ARA takes the residual stream as it is);
          fc1.bias's gradient is Σ g_i;
          the gradient flowing back through fc1 to x_i is exact: g_i fc1.weight;
        fc2, the ReLU and the residual additions are ordinary autograd, so the gradient with respect to x
        is exactly backprop's, and so are fc2's parameter gradients. The first block's fc1 gradient is
        therefore exact backprop too.
        Memory: for all the fc1 weight gradients of the group, one tensor is kept, x_0 itself (no copy and
        no block's own x_i); besides it, what the ReLUs and fc2 keep (F.relu keeps its output, which fc2
        shares as its input) and the weights.

    Raises:
        ValueError: if blocks is empty.

    test_ara_group grades the output and every gradient; test_ara_group_memory what the forward keeps;
    test_ara_group_edge_cases one block, a tuple and an nn.ModuleList, x without grad, and the error.
    Graded on float32 tensors with groups of 1 to 4 of the setup cell's ResidualMLPBlocks (d and h from 5 to
    48, the notebook's d = 128 with h = 64 on 50 rows, and one group whose x has 10^4 to 10^6 elements,
    drawn log-uniformly: d 32 to 256, h 8 to 64), x 2-D and 3-D, with and without grad; the blocks' weights
    and x are drawn so that x_i differs from x_0, and the output gradient is zero on the rows where an fc1
    pre-activation lies within 1e-3 of 0 (float32 and float64 could take different ReLU decisions there).
    test_ara_group_memory reads from outside your process what one forward keeps until backward, in two
    calls, sizes and values drawn at grading time: 3 or 4 blocks in an nn.ModuleList with d from 768 to 1024
    and h = 64, x of 4096 rows (12 to 16 MiB; (a) 3-D, (2, 4, 8 or 16, 4096 / that, d), (b) 2-D) made for the
    call and released after it, the blocks held by the grader: at most x_0 plus the ReLU outputs (4 bytes ×
    rows × h per block) plus 4 MiB. The output gradient is drawn and sent only after the forward; the
    output, every block's fc1 weight and bias gradients and dx (rows of it) of that very call are checked.
    Each graded cell runs within 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    blocks = list(blocks)
    if not blocks:
        raise ValueError("ara_group needs at least one block")

    class ARALinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h, x0, weight, bias):
            ctx.save_for_backward(x0, weight)  # the group's input: the same tensor for every block
            return F.linear(h, weight, bias)

        @staticmethod
        def backward(ctx, g):  # g: (..., h)
            x0, weight = ctx.saved_tensors
            need_h, _, need_w, need_b = ctx.needs_input_grad
            rows = g.reshape(-1, g.shape[-1])
            dh = g @ weight if need_h else None  # exact
            dw = rows.t() @ x0.reshape(-1, x0.shape[-1]) if need_w else None  # from x_0, not x_i
            db = rows.sum(0) if need_b else None
            return dh, None, dw, db

    x0 = x.detach()  # shares x's storage: keeping it keeps no copy
    h = x
    for block in blocks:
        z = ARALinear.apply(h, x0, block.fc1.weight, block.fc1.bias)
        h = h + block.fc2(F.relu(z))
    return h
    ### END SOLUTION


# %% test="test_ara_group" points=3 checks="ara_group"
torch.manual_seed(0)
blocks_t = [ResidualMLPBlock(6, 5) for _ in range(2)]
x_t = torch.randn(4, 6, requires_grad=True)
out_t = ara_group(blocks_t, x_t)
x1_t = blocks_t[0](x_t)
assert torch.allclose(out_t, blocks_t[1](x1_t)), "the output is the blocks run one after the other"
g_t = torch.randn(4, 6)
out_t.backward(g_t)
ref_x = x_t.detach().clone().requires_grad_()
blocks_r = [ResidualMLPBlock(6, 5) for _ in range(2)]
for b_r, b_t in zip(blocks_r, blocks_t):
    b_r.load_state_dict(b_t.state_dict())
blocks_r[1](blocks_r[0](ref_x)).backward(g_t)
assert torch.allclose(x_t.grad, ref_x.grad, atol=1e-6), "the input gradient is exactly backprop's"
assert torch.allclose(blocks_t[0].fc1.weight.grad, blocks_r[0].fc1.weight.grad, atol=1e-6), \
    "the first block's fc1 gradient is exact backprop (x_1 = x_0)"
assert not torch.allclose(blocks_t[1].fc1.weight.grad, blocks_r[1].fc1.weight.grad), \
    "the second block's fc1 gradient comes from x_0, not from its own input x_1"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch12_aal", "test_ara_group", globals())
### END HIDDEN TESTS

# %% test="test_ara_group_memory" points=2 checks="ara_group"
blocks_t = nn.ModuleList(ResidualMLPBlock(128, 16) for _ in range(4))
x_t = torch.randn(64, 128)
m_t = measure(lambda: ara_group(blocks_t, x_t).sum(), blocks_t)
relu_bytes = 4 * 64 * 16 * 4
assert m_t.activation_bytes <= 4 * 64 * 128 + relu_bytes, \
    f"ara_group kept {m_t.activation_bytes:,} bytes; x_0 ({4 * 64 * 128:,}) and four ReLU outputs " \
    f"({relu_bytes:,}) are enough"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch12_aal", "test_ara_group_memory", globals())
### END HIDDEN TESTS

# %% test="test_ara_group_edge_cases" points=1 checks="ara_group"
block_t = ResidualMLPBlock(5, 3)
x_t = torch.randn(2, 3, 5)
assert torch.allclose(ara_group(nn.ModuleList([block_t]), x_t), block_t(x_t)), "3-D x, one block"
try:
    ara_group([], x_t)
except ValueError:
    pass
else:
    raise AssertionError("an empty group should raise ValueError")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch12_aal", "test_ara_group_edge_cases", globals())
### END HIDDEN TESTS

# %% [markdown]
# ## 6. The learning indicator
#
# Does a step along the auxiliary gradient still go downhill? For one layer and one example, the
# backprop weight gradient is $g\,\tilde x^\top$ and the auxiliary one $g\,a^\top$ (an outer product
# each); their inner product is $\|g\|^2\, \tilde x \cdot a$. The authors normalise a closely related
# quantity per example (per token for a Transformer), comparing how far $a$ is from $\tilde x$ with
# the size of $\tilde x$:
#
# $$\mathrm{LI} = 1 - \frac{\|\tilde x - a\|^2}{\|\tilde x\|^2}
#   = \frac{\sum_j a_j (2\tilde x_j - a_j)}{\sum_j \tilde x_j^2} .$$
#
# $\mathrm{LI} = 1$ when $a = \tilde x$ (backprop); it falls as $a$ drifts away, and turns negative
# once $a$ is further from $\tilde x$ than $0$ is. For ASA, $a_j(2\tilde x_j - a_j) = 2\epsilon|x_j| +
# \epsilon^2 > 0$ with $\pm 1$ signs: LI is positive but small. For ARA it decays with the distance
# from the group start.
#
# Compute it with a small constant in the denominator, as the authors do:
# $\mathrm{LI} = 1 - \|\tilde x - a\|^2 / (\|\tilde x\|^2 + 10^{-6})$ over the last dimension (the
# form $\sum a(2\tilde x - a) / (\sum \tilde x^2 + 10^{-6})$ differs from it by
# $10^{-6}/(\|\tilde x\|^2 + 10^{-6})$, and is accepted too).

# %% exercise="learning_indicator"
def learning_indicator(x_tilde: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """The learning indicator of every example (row of the last dimension).

    Args:
        x_tilde: (..., d) the input the layer computed with.
        a: (..., d) the auxiliary activation its weight gradient used; the same shape as x_tilde.

    Returns:
        (...) one value per row: 1 - Σ_j (x_tilde - a)_j² / (Σ_j x_tilde_j² + 1e-6), the sums over the last
        dimension only (never averaged over the batch). A 1-D pair gives a 0-d tensor.

    Raises:
        ValueError: if the shapes differ or x_tilde is 0-d.

    test_learning_indicator grades the values and their shape, test_learning_indicator_errors the errors.
    Graded on float32 and float64 tensors of 1 to 3 dimensions, d from 1 to 512 (the notebook's 128 and 256
    among them), rows whose squared norm is at least 0.1.
    Each graded cell runs within 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    if x_tilde.shape != a.shape:
        raise ValueError(f"x_tilde {tuple(x_tilde.shape)} and a {tuple(a.shape)} must have the same shape")
    if x_tilde.dim() == 0:
        raise ValueError("x_tilde must have at least one dimension (the features)")
    return 1 - (x_tilde - a).pow(2).sum(-1) / (x_tilde.pow(2).sum(-1) + 1e-6)
    ### END SOLUTION


# %% test="test_learning_indicator" points=2 checks="learning_indicator"
x_t = torch.tensor([[1.0, 2.0, 2.0], [3.0, 0.0, 4.0]])
a_t = torch.tensor([[1.0, 2.0, 2.0], [0.0, 0.0, 0.0]])
li_t = learning_indicator(x_t, a_t)
assert li_t.shape == (2,), "one value per row"
assert torch.allclose(li_t, torch.tensor([1.0, 0.0]), atol=1e-6), "a = x̃ gives 1, a = 0 gives 0"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch12_aal", "test_learning_indicator", globals())
### END HIDDEN TESTS

# %% test="test_learning_indicator_errors" points=1 checks="learning_indicator"
try:
    learning_indicator(torch.ones(2, 3), torch.ones(3, 2))
except ValueError:
    pass
else:
    raise AssertionError("shapes that differ should raise ValueError")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch12_aal", "test_learning_indicator_errors", globals())
### END HIDDEN TESTS

# %% [markdown]
# ## 7. ARA on a residual MLP
#
# A residual MLP for the digits: a stem `Linear(64, 128)` + ReLU, four `ResidualMLPBlock(128, 64)`,
# a head `Linear(128, 10)`. Group size $k$ = 1 is plain backprop (every block is its own group's
# first); $k$ = 2 and 4 keep one input per group for the fc1 gradients. We train each the same way
# as the MLP (one seed) and measure the bytes kept for backward by one step, and the learning indicator
# of every fc1 against the distance of its block from the group start.

# %%
RES_D, RES_H, RES_BLOCKS = 128, 64, 4
GROUP_SIZES = (1, 2, 4)
RES_SEEDS = (0,)


class ResidualMLP(nn.Module):
    def __init__(self, group: int, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.stem = nn.Linear(64, RES_D)
            self.blocks = nn.ModuleList(ResidualMLPBlock(RES_D, RES_H) for _ in range(RES_BLOCKS))
            self.head = nn.Linear(RES_D, 10)
        self.group = group

    def forward(self, x):
        h = torch.relu(self.stem(x))
        for start in range(0, RES_BLOCKS, self.group):
            h = ara_group(self.blocks[start:start + self.group], h)
        return self.head(h)

    def indicators(self, x):
        """LI of every block's fc1 (its real input against the group input), per example, with distances."""
        found = []
        with torch.no_grad():
            h = torch.relu(self.stem(x))
            for i, block in enumerate(self.blocks):
                if i % self.group == 0:
                    x0 = h
                found.append((i % self.group, learning_indicator(h, x0)))
                h = block(h)
        return found


res_runs = {}
for k in tqdm(GROUP_SIZES, desc="ARA group sizes"):
    for seed in RES_SEEDS:
        res_runs[k, seed] = train(lambda s, k=k: ResidualMLP(k, s), seed, cosine_every=10**9)
res_bytes = {}
for k in GROUP_SIZES:
    model = ResidualMLP(k)
    res_bytes[k] = measure(lambda: F.cross_entropy(model(x_batch), y_batch), model).activation_bytes
lines = ["| group size k | test accuracy (seed " + ", ".join(map(str, RES_SEEDS)) + ") | bytes kept for backward | vs backprop |",
         "|---|---|---|---|"]
for k in GROUP_SIZES:
    accs = ", ".join(f"{res_runs[k, s]['acc']:.1%}" for s in RES_SEEDS)
    lines.append(f"| {k}{' (backprop)' if k == 1 else ''} | {accs} | {res_bytes[k]:,} | {res_bytes[k] / res_bytes[1]:.0%} |")
display(Markdown("\n".join(lines)))

# %%
trained = res_runs[GROUP_SIZES[-1], 0]["model"]
by_distance = {}
for distance, li in trained.indicators(x_test):
    by_distance.setdefault(distance, []).append(li)
fig, ax = plt.subplots(figsize=(7, 3.2))
for distance in sorted(by_distance)[1:]:
    values = torch.cat(by_distance[distance]).numpy()
    ax.hist(values, bins=40, alpha=0.5, label=f"{distance} block{'s' if distance > 1 else ''} from the start")
ax.set_xlabel("learning indicator of fc1 (per test image)")
ax.set_ylabel("count")
ax.legend(fontsize=7, frameon=False)
fig.tight_layout()
plt.show()
li_mean = {d: torch.cat(v).mean().item() for d, v in sorted(by_distance.items())}
print(f"mean LI by distance from the group start (k = {GROUP_SIZES[-1]}, trained):",
      ", ".join(f"{d}: {m:.3f}" for d, m in li_mean.items()))
asa_model = mlp_runs["ASA ±1 (layers 2-3)", 0]["model"]
with torch.no_grad():
    h2 = torch.relu(asa_model[0](x_test))
    s2 = torch.where(h2 > 0, 1.0, -1.0)
    li_asa = learning_indicator(h2 + 0.01 * s2, 0.01 * s2)
print(f"ASA on layer 2 (trained, ε = 0.01): LI from {li_asa.min():.4f} to {li_asa.max():.4f}, "
      f"all positive: {bool((li_asa > 0).all())}")

# %% [markdown]
# The first block of a group has LI = 1 (it is backprop); the further a block sits from the group
# start, the more the stream has moved and the lower its LI. ASA's LI is tiny but positive for every
# example: its gradient points the right way only weakly, which $\lambda$ makes up in size.
#
# ## 8. Play with it
#
# Which Linears of the MLP take ASA? Every choice is trained once (seed 0) beforehand; the slider only
# redraws: test accuracy, and the bytes each Linear keeps for its weight gradient.

# %%
CHOICES = {"none": (), "layer 2": (2,), "layer 3": (3,), "layers 2-3": (2, 3), "layers 1-3": (1, 2, 3)}
choice_acc, choice_bytes = {}, {}
for label, asa in tqdm(CHOICES.items(), desc="ASA choices"):
    if asa == ():
        choice_acc[label] = mlp_runs["backprop", 0]["acc"]
    elif asa == (2, 3):
        choice_acc[label] = mlp_runs["ASA ±1 (layers 2-3)", 0]["acc"]
    else:
        choice_acc[label] = train(lambda s, asa=asa: make_mlp(s, asa=asa), 0, cosine_every=10**9)["acc"]
    choice_bytes[label] = [BATCH * n_in // 8 if i in asa else 4 * BATCH * n_in
                           for i, n_in in ((1, 64), (2, 256), (3, 256))]

# %% tags=["demo"]
def draw_choice(axes, layers="layers 2-3"):
    ax_acc, ax_bytes = axes
    names = list(CHOICES)
    ax_acc.bar(names, [choice_acc[n] for n in names], color=["#dd8452" if n == layers else "#4c72b0" for n in names])
    ax_acc.set_ylim(min(choice_acc.values()) - 0.05, 1.0)
    ax_acc.set_ylabel("test accuracy")
    ax_acc.set_xticks(range(len(names)), [n.replace(" ", "\n", 1) for n in names])
    ax_acc.set_xlabel("layers trained with auxiliary activations")
    ax_bytes.bar(["Linear 1", "Linear 2", "Linear 3"], choice_bytes[layers])
    ax_bytes.set_yscale("log")
    ax_bytes.set_ylabel("kept for ∂W (bytes, batch 50)")
    ax_bytes.set_title(f"{layers}: {choice_acc[layers]:.1%}, {sum(choice_bytes[layers]):,} bytes")


slider_plot(draw_choice, ncols=2, figsize=(11, 4.4), layers=list(CHOICES), defaults={"layers": "layers 2-3"},
            labels={"layers": "layers with auxiliary activations"},
            explain={"layers": "which Linear layers compute ∂W from 1-bit auxiliary activations"},
            notice={"layers": lambda layers: f"{layers}: accuracy {choice_acc[layers]:.1%}, "
                                             f"{sum(choice_bytes[layers]):,} bytes kept for ∂W"})

# %% [markdown]
# ## 9. What the paper reports vs what we measured
#
# The abstract promises less activation memory "without training speed reduction", with accuracy
# close to backprop on ResNet, Transformer, BERT, ViT and MLP-Mixer. Two figures from the paper's
# tables (not checked against the released logs): ResNet-152 on ImageNet with ARA(2,2,2,2): 77.14%
# top-1 against 77.38% for backprop with 28.5% of the activation memory saved; a Transformer on IWSLT with
# ASA2: BLEU 35.12 against 35.14 with 21.3% saved. We cannot train either here; what our scale can
# say is in the right column. "No slowdown" we time on our MLP (one training step, backprop vs ASA
# on layers 2-3).

# %%
def one_step(model):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x_batch), y_batch).backward()
        opt.step()
    return step


t_bp = time_it(one_step(make_mlp()), repeats=fast(15, 3))
t_asa = time_it(one_step(make_mlp(asa=(2, 3))), repeats=fast(15, 3))
print(f"one training step, ASA vs backprop: {compare(t_asa, t_bp, ('ASA', 'backprop'))}")
acc = {name: np.mean([mlp_runs[name, s]["acc"] for s in SEEDS]) for name in MLP_RUNS}
res_acc = {k: np.mean([res_runs[k, s]["acc"] for s in RES_SEEDS]) for k in GROUP_SIZES}
rows = [
    ("accuracy, AAL − backprop (points)", "−0.24 (ResNet-152 ARA, 77.14% vs 77.38%)",
     f"ASA {(acc['ASA ±1 (layers 2-3)'] - acc['backprop']) * 100:+.1f} (MLP); ARA k=2 "
     f"{(res_acc[2] - res_acc[1]) * 100:+.1f}, k=4 {(res_acc[4] - res_acc[1]) * 100:+.1f} (residual MLP)",
     -0.24, (acc["ASA ±1 (layers 2-3)"] - acc["backprop"]) * 100),
    ("activation memory saved (%)", "28.5% (ARA), 21.3% (ASA2)",
     f"ARA k=4: {1 - res_bytes[4] / res_bytes[1]:.0%}; ASA layers 2-3 with torch ReLUs "
     f"{1 - whole['ASA on layers 2-3'] / whole['backprop']:.0%}, with 1-bit ReLUs "
     f"{1 - whole['ASA on layers 2-3 + 1-bit ReLUs'] / whole['backprop']:.0%}",
     28.5, (1 - res_bytes[4] / res_bytes[1]) * 100),
    ("BLEU, ASA2 − backprop", "−0.02 (35.12 vs 35.14)", "not measured (no Transformer here)", -0.02, 0.0),
    ("training step time, AAL / backprop", "no slowdown", f"{t_asa.best / t_bp.best:.2f}× (MLP, ASA)",
     1.0, t_asa.best / t_bp.best),
]
literature_table(rows, source="paper (unverified)")
fig, ax = plt.subplots(figsize=(8, 3))
paired_bars(ax, ["accuracy Δ", "memory saved %", "BLEU Δ", "step time ratio"], [r[3] for r in rows],
            [r[4] for r in rows], source="paper", fmt="%.2f")
ax.set_yscale("symlog")
fig.tight_layout()
plt.show()

# %%
display(Markdown(
    f"**What reproduces.** The input gradient stays exact, and the weight gradient's direction is close enough "
    f"to train: ASA on layers 2-3 reaches {acc['ASA ±1 (layers 2-3)']:.1%} against {acc['backprop']:.1%} for "
    f"backprop (mean of {len(SEEDS)} seeds), ARA with groups of 2 and 4 reaches {res_acc[2]:.1%} and "
    f"{res_acc[4]:.1%} against {res_acc[1]:.1%}. A Linear's saved input shrinks from an fp32 value to one bit per "
    f"element, and ARA keeps one stream per group ({1 - res_bytes[4] / res_bytes[1]:.0%} less than backprop at "
    f"k = 4 on our residual MLP).\n\n"
    f"**What does not, or not here.** ASA's accuracy gap on the digits MLP is wider than the paper's gaps on its "
    f"large models; the ImageNet and IWSLT figures are out of our reach. The whole-network saving depends on "
    f"what else keeps the same tensor: next to torch's ReLU, ASA saves nothing "
    f"({whole['ASA on layers 2-3']:,} vs {whole['backprop']:,} bytes); only with 1-bit ReLUs does it show "
    f"({whole['ASA on layers 2-3 + 1-bit ReLUs']:,} bytes). And "
    f"on a CPU with layers this small the custom Function and the packing cost time of their own: a step takes "
    f"{t_asa.best / t_bp.best:.2f} times as long (the verdict above says whether that is beyond the repeats' "
    f"spread). The paper's 'no slowdown' concerns its GPU implementation, where packing is a small fused "
    f"kernel beside large products; our timing does not test that setting."))

# %% [markdown]
# ## 10. Summary
#
# - A Linear keeps its input only for $\partial W = g^\top x$; $\partial x = gW$ needs none.
# - AAL computes with $\tilde x = x + a$ and takes $\partial W$ from $a$ alone: with ASA,
#   $a = \epsilon s$ (one bit per element, $\lambda\epsilon = 1$ by default); with ARA, $a$ is the
#   residual stream at the start of a group, kept once for the whole group.
# - The learning indicator $1 - \|\tilde x - a\|^2/\|\tilde x\|^2$ says how well the auxiliary
#   gradient still descends: small but positive for ASA, decaying with the distance from the group start
#   for ARA.
# - What a network saves depends on what else keeps the same tensor: a ReLU in front keeps its output
#   anyway, unless it keeps a 1-bit mask itself.
