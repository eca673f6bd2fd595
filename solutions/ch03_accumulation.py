# ---
# jupyter:
#   chapter:
#     title: "Gradient accumulation"
#     imports: []
#     prose_numbers:  # phrases whose numbers are definitions or quoted figures (tests/test_prose_numbers.py)
#       - 'Each graded cell may use 60 s and 4 GiB'  # the grader's limits per graded cell
#       - '$256/32 = 8$ times the variance, so $\sqrt 8 \approx 2.8$ times the noise in standard deviation, not 8 times'
#       - '8 times the variance is less than 3 times the noise'
#     mentioned:  # names an exercise's text uses that grading does not offer (tests/test_namespace.py)
#       train_accumulated:
#         DataLoader: "an example of an accepted iterable"
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
# # Chapter 3 — Gradient accumulation
#
# The batch size is an optimisation choice: it sets how noisy each gradient is, and with it
# the learning rate that works. But it is also a memory choice, because every sample in the
# batch leaves its activations behind for the backward pass. When the batch you want does not
# fit, gradient accumulation splits it into micro-batches, runs forward and backward on one at a
# time, lets the gradients add up, and updates once. The optimiser sees the batch you chose;
# memory sees only a micro-batch.
#
# **What you will learn**
# - why activation memory grows linearly with the batch size, measured;
# - why simply shrinking the batch is not free: it changes the optimisation;
# - how to split a batch of $B$ samples into micro-batches whose weighted gradients add up to the
#   full-batch gradient *exactly*, also when $B$ is not a multiple of the micro-batch size;
# - what it costs: activation memory $\propto$ the micro-batch, more and smaller forward passes;
# - why BatchNorm breaks the equivalence (its statistics are per micro-batch).

# %% tags=["setup"]
import math

import torch
from torch import nn

# %% [markdown]
# ## 1. Activation memory grows with the batch
#
# To compute $\partial W = g^\top x$, a linear layer must keep its input $x$ (one row per sample)
# until backward; a ReLU keeps its output, a LayerNorm its input and statistics. Every one of
# these tensors has the batch as its first dimension, so the bytes saved for backward are
# proportional to the batch size. Here is the model used throughout the chapter: a three-layer MLP
# with LayerNorm on a synthetic 10-class task (labels from a fixed random "teacher" network).

# %%
import copy

import matplotlib.pyplot as plt
import numpy as np
from tqdm.auto import tqdm

from coursekit import fast, measure
from coursekit.measure import flop_counter
from coursekit.report import literature_table
from coursekit.timing import Timing, compare, time_it
from coursekit.widgets import slider_plot

D_IN, HIDDEN, CLASSES = 32, 256, 10
BATCH = 256  # the batch the optimiser should see
STEPS = fast(30, 6)  # training steps in the comparisons of section 5


def make_model(norm: str = "layer", seed: int = 0) -> nn.Sequential:
    """(N, D_IN) -> (N, CLASSES) logits; ``norm`` is "layer" (LayerNorm) or "batch" (BatchNorm1d)."""
    Norm = {"layer": nn.LayerNorm, "batch": nn.BatchNorm1d}[norm]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(D_IN, HIDDEN), Norm(HIDDEN), nn.ReLU(),
                             nn.Linear(HIDDEN, HIDDEN), Norm(HIDDEN), nn.ReLU(),
                             nn.Linear(HIDDEN, CLASSES))


def make_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n samples (n, D_IN) with labels (n,) from a fixed random teacher network."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(D_IN, CLASSES, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(n, D_IN, generator=g)
    return x, (torch.tanh(x) @ teacher).argmax(dim=1)


def activation_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Bytes saved for backward by one forward/backward of ``model`` on (x, y)."""
    # Clones: a slice shares its whole parent's storage, and measure counts storages.
    x, y = x.clone(), y.clone()
    return measure(lambda: loss_fn(model(x), y), model).activation_bytes


loss_fn = nn.CrossEntropyLoss()
x_all, y_all = make_data(BATCH * STEPS, seed=0)
model = make_model()
KB = 1024
acts = {b: activation_bytes(model, x_all[:b], y_all[:b]) for b in (16, 32, 64, 128, 256)}
PER_SAMPLE = (acts[256] - acts[16]) // (256 - 16)  # bytes per sample: the slope
FIXED = acts[16] - 16 * PER_SAMPLE  # what does not depend on the batch
for b, a in acts.items():
    print(f"batch {b:4}: {a / KB:8,.1f} KB saved for backward = {PER_SAMPLE:,} bytes × {b} + {a - PER_SAMPLE * b} bytes")
    assert a == PER_SAMPLE * b + FIXED  # exactly linear
print(f"batch-independent part: {FIXED} bytes = {FIXED // 4} fp32 value(s)")

# %% [markdown]
# Activation memory is exactly (bytes per sample) × (samples in one forward pass), plus one
# fp32 scalar that does not grow with the batch: the number of targets, by which
# `CrossEntropyLoss` divides. Parameters, gradients and optimiser state do not depend on the
# batch at all.
#
# ## 2. Why not just use a smaller batch?
#
# Because it is a different optimisation. A mini-batch gradient is an average over $B$ independent
# samples: its variance shrinks like $1/B$, its standard deviation (the size of the noise) like
# $1/\sqrt{B}$. A batch of 32 instead of 256 has $256/32 = 8$ times the variance, so
# $\sqrt 8 \approx 2.8$ times the noise in standard deviation, not 8 times. Either way, the learning
# rate, warm-up and number of steps tuned for 256 no longer fit (Goyal et al. 2017 scale the
# learning rate linearly with the batch for exactly this reason). The next cell measures the
# noise; section 6.2 shows the two training curves side by side.
#
# %%
def gradient_noise(batch: int, draws: int, seed: int) -> float:
    """Total variance (summed over parameters) of the mini-batch gradient at initialisation."""
    model = make_model()
    x, y = make_data(batch * draws, seed)
    grads = []
    for i in range(draws):
        model.zero_grad()
        loss_fn(model(x[i * batch:(i + 1) * batch]), y[i * batch:(i + 1) * batch]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return torch.stack(grads).var(dim=0).sum().item()


DRAWS = fast(64, 16)  # independent batches per size
var_small, var_big = gradient_noise(32, DRAWS, seed=10), gradient_noise(BATCH, DRAWS, seed=11)
print(f"gradient variance, batch 32 / batch {BATCH}: {var_small / var_big:.1f}× (1/B predicts {BATCH / 32:.0f}×)")
print(f"gradient noise (standard deviation), batch 32 / batch {BATCH}: {math.sqrt(var_small / var_big):.2f}× "
      f"(1/√B predicts {math.sqrt(BATCH / 32):.2f}×)")

# %% [markdown]
# The estimates come from a few dozen batches, so they scatter around the prediction by some
# percent; the scaling is the point: 8 times the variance is less than 3 times the noise. What we
# want is the gradient of the *big* batch, computed with the memory of a *small* one.
#
# ## 3. The idea
#
# Split the batch of $B$ samples into $k$ micro-batches of sizes $n_1, \dots, n_k$ (all equal to
# the micro-batch size $m$ except perhaps the last, $\sum_i n_i = B$). With a mean-reduction loss,
# $L_i$ the mean loss over micro-batch $i$,
#
# $$L = \frac{1}{B}\sum_{j=1}^{B} \ell_j = \sum_{i=1}^{k} \frac{n_i}{B}\, L_i
# \qquad\Longrightarrow\qquad \nabla L = \sum_{i=1}^{k} \frac{n_i}{B}\, \nabla L_i .$$
#
# The gradient is linear, so the full-batch gradient is a weighted *sum* of micro-batch gradients,
# and PyTorch already sums for us: `backward()` **adds** into `.grad`, it does not overwrite. So:
# for each micro-batch, forward, scale its mean loss by $n_i / B$, call `backward()`; after the
# last one `.grad` holds $\nabla L$; step once.
#
# Three details decide whether this is right and whether it saves anything:
#
# - **The weights are $n_i / B$, not $1/k$.** With $B = 37$ and $m = 8$ the micro-batches hold
#   8, 8, 8, 8 and 5 samples; averaging their losses with weight $1/5$ each over-weights the last
#   five samples.
# - **Call `backward()` per micro-batch.** Summing the $k$ losses first and calling `backward()`
#   once gives the right gradient but keeps all $k$ graphs, with all their activations, alive at
#   the same time: no memory saved (measured in section 6.1).
# - **Keep only a detached number for logging.** Add up `loss.detach()` values: a loss that keeps
#   its graph is not a number to log, and adding up the losses *with* their graphs before calling
#   `backward()` is the shortcut of the previous point.
#
# ## 4. Exercise: accumulate the gradient of one batch

# %% exercise="accumulate_gradients"
def accumulate_gradients(model: nn.Module, loss_fn: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                         micro_batch_size: int) -> torch.Tensor:
    """Put the full-batch gradient in ``.grad`` while forwarding one micro-batch at a time.

    Args:
        model: maps inputs (n, ...) to outputs for n samples; called on slices of at most
            ``micro_batch_size`` samples, never on the whole batch (unless it is that small).
        loss_fn: a mean-reduction loss, ``loss_fn(outputs, targets)`` (e.g. ``nn.MSELoss()``,
            ``nn.CrossEntropyLoss()``).
        inputs: (B, ...) the whole batch; targets: (B, ...) its targets.
        micro_batch_size: a positive int m; anything else raises
            ``ValueError("micro_batch_size must be a positive integer, got ...")``. The micro-batches
            are ``inputs[0:m], inputs[m:2m], ...``; the last one may be smaller; m >= B means one
            forward of the whole batch.

    On entry every trainable parameter's ``.grad`` is None or zero. On return it holds the
    gradient of the full-batch mean loss; frozen parameters (``requires_grad=False``) get no
    gradient, and no parameter changes (stepping is the training loop's job).

    Returns:
        The full-batch mean loss, a detached 0-dim tensor.

    Graded on, one cell per property. Gradients: B = 37 float32 inputs (37, 13); a Linear-Tanh-Linear MLP
    and a model whose first Linear is frozen (then ReLU, LayerNorm, Linear), 7 outputs; ``nn.MSELoss()``
    and ``nn.CrossEntropyLoss()``; micro_batch_size 5, 8 and 36, so the last micro-batch is smaller;
    and two cases whose sizes and seeds are drawn at grading time, B never a multiple of micro_batch_size
    and the targets of the last (smaller) micro-batch offset by 3: the frozen model with ``nn.MSELoss()`` on
    100 to 1000 samples with micro_batch_size 5 to 64, and a Linear(16, 64)-Tanh-Linear(64, 1) MLP with
    ``nn.MSELoss()`` on 768 to 1000 samples with micro_batch_size 8 to 24 (the sizes of the memory cell's
    measured call). Compared with a float64 reference to float32 rounding; parameters must stay exactly as
    they were, frozen ones still frozen and without ``.grad``. Memory: the model given raises if called on more
    samples than micro_batch_size, and its output for a sample depends on the sample's place in the call,
    so the micro-batches must be exactly the slices above; and while one call on a Linear(16, 16384)-Tanh-
    Linear(16384, 1) MLP with ``nn.MSELoss()`` runs, on 768 to 1000 samples with micro_batch_size 8 to 24
    (sizes and values drawn at grading time), what your process holds, read from outside it, must stay
    under a quarter of the whole batch's activations (summing the losses before one ``backward()`` keeps
    all of them), and that very call must leave the full-batch gradient in ``.grad``. The returned loss:
    a detached 0-dim tensor, the full-batch mean (B = 37 with micro_batch_size 8, 5 and 36, and two more
    cases drawn as those of the gradients). Edge cases: micro_batch_size 37 and 64 (m >= B);
    micro_batch_size 0, -3 and 2.5 must raise ``ValueError``. Each graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size!r}")
    batch = inputs.shape[0]
    if batch == 0 or targets.shape[0] != batch:
        raise ValueError(f"inputs and targets must hold the same non-zero number of samples, "
                         f"got {batch} and {targets.shape[0]}")
    total = 0.0
    for start in range(0, batch, micro_batch_size):
        x = inputs[start:start + micro_batch_size]
        y = targets[start:start + micro_batch_size]
        weight = x.shape[0] / batch  # n_i / B: the last micro-batch may be smaller
        loss = loss_fn(model(x), y) * weight
        loss.backward()  # adds into .grad and frees this micro-batch's activations
        total = total + loss.detach()
    return total
    ### END SOLUTION


# %% test="test_accumulate_gradients" points=2 checks="accumulate_gradients"
import copy


class CountingModel(nn.Module):
    """Records the batch size of every forward call."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.sizes = inner, []

    def forward(self, x):
        self.sizes.append(x.shape[0])
        return self.inner(x)


torch.manual_seed(0)
x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
net = CountingModel(nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)))
full = copy.deepcopy(net)
full_loss = nn.CrossEntropyLoss()(full(x), y)
full_loss.backward()

loss = accumulate_gradients(net, nn.CrossEntropyLoss(), x, y, micro_batch_size=4)
for (name, p), q in zip(net.named_parameters(), full.parameters()):
    torch.testing.assert_close(p.grad, q.grad, msg=f"{name}.grad is not the full-batch gradient: is each "
                               "micro-batch's mean loss weighted by its size / B (here 4/10, 4/10, 2/10)?")
for p, q in zip(net.parameters(), full.parameters()):
    assert torch.equal(p, q), "accumulate_gradients fills .grad only: the optimizer step belongs to the training loop"

frozen = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
frozen[0].requires_grad_(False)
accumulate_gradients(frozen, nn.CrossEntropyLoss(), x, y, micro_batch_size=3)
assert frozen[0].weight.grad is None, "a frozen parameter gets no gradient"
assert frozen[2].weight.grad is not None, "a trainable parameter gets its gradient"
# Larger batches too (graded on 100 to 1000 samples): 250 samples in micro-batches of 16, the last one of 10.
x_big, y_big = torch.randn(250, 6), torch.randint(0, 3, (250,))
big = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
big_full = copy.deepcopy(big)
nn.CrossEntropyLoss()(big_full(x_big), y_big).backward()
accumulate_gradients(big, nn.CrossEntropyLoss(), x_big, y_big, micro_batch_size=16)
for (name, p), q in zip(big.named_parameters(), big_full.parameters()):
    torch.testing.assert_close(p.grad, q.grad, msg=f"B = 250, micro_batch_size = 16: {name}.grad is not the "
                               "full-batch gradient (weights n_i / B at every batch size)")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch03_accumulation", "test_accumulate_gradients", globals())
### END HIDDEN TESTS

# %% test="test_accumulate_gradients_memory" points=1 checks="accumulate_gradients"
from coursekit import saved_tensors

net = CountingModel(nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)))
accumulate_gradients(net, nn.CrossEntropyLoss(), x, y, micro_batch_size=4)
assert net.sizes == [4, 4, 2], f"forwarded batches of {net.sizes}, expected micro-batches of 4, 4 and 2"
net.sizes.clear()
accumulate_gradients(net, nn.CrossEntropyLoss(), x, y, micro_batch_size=3)
assert net.sizes == [3, 3, 3, 1], f"forwarded batches of {net.sizes}, expected micro-batches of 3, 3, 3 and 1"
# What autograd holds at once: about one micro-batch's activations, not the whole batch's.
wide = nn.Sequential(nn.Linear(6, 512), nn.Tanh(), nn.Linear(512, 3))
x_wide, y_wide = torch.randn(64, 6), torch.randint(0, 3, (64,))
with saved_tensors(wide) as one_micro:
    nn.CrossEntropyLoss()(wide(x_wide[:8]), y_wide[:8]).backward()
with saved_tensors(wide) as accumulated:
    accumulate_gradients(wide, nn.CrossEntropyLoss(), x_wide, y_wide, micro_batch_size=8)
assert accumulated.peak_activation_bytes < 2 * one_micro.peak_activation_bytes, \
    f"autograd held {accumulated.peak_activation_bytes:,} bytes of activations at once, one micro-batch's are " \
    f"{one_micro.peak_activation_bytes:,}: call backward() on each micro-batch's loss right after its forward"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch03_accumulation", "test_accumulate_gradients_memory", globals())
### END HIDDEN TESTS

# %% test="test_accumulate_gradients_loss" points=1 checks="accumulate_gradients"
net = copy.deepcopy(full)
net.zero_grad()  # .grad is None on entry
loss = accumulate_gradients(net, nn.CrossEntropyLoss(), x, y, micro_batch_size=4)
assert isinstance(loss, torch.Tensor) and loss.dim() == 0, "return the loss as a 0-dim tensor"
assert not loss.requires_grad, "return a detached loss: the weighted sum of loss.detach() values"
torch.testing.assert_close(loss, full_loss.detach(), msg="return the full-batch mean loss, sum_i (n_i / B) * mean_i")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch03_accumulation", "test_accumulate_gradients_loss", globals())
### END HIDDEN TESTS

# %% test="test_accumulate_gradients_edge_cases" points=1 checks="accumulate_gradients"
for m in (10, 64):  # m >= B: one forward of the whole batch
    net = CountingModel(nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)))
    accumulate_gradients(net, nn.CrossEntropyLoss(), x, y, micro_batch_size=m)
    assert net.sizes == [10], f"micro_batch_size={m} >= B = 10: one forward of 10 samples, got {net.sizes}"
for bad in (0, -3, 2.5):
    try:
        accumulate_gradients(frozen, nn.CrossEntropyLoss(), x, y, micro_batch_size=bad)
    except ValueError as e:
        assert str(bad) in str(e), f"say which micro_batch_size was refused: {e}"
    else:
        raise AssertionError(f"micro_batch_size={bad} should raise ValueError")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch03_accumulation", "test_accumulate_gradients_edge_cases", globals())
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Exercise: the training loop
#
# A training step is now: zero the gradients, accumulate over the batch's micro-batches, step.
# Forgetting the first part is the classic bug: gradients then keep adding up *across* batches,
# and the step uses the sum of every gradient so far.

# %% exercise="train_accumulated"
def train_accumulated(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: nn.Module, loader,
                      micro_batch_size: int, steps: int) -> list[float]:
    """Train for ``steps`` optimizer steps, one batch per step, each accumulated over micro-batches.

    Args:
        model, loss_fn, micro_batch_size: as in ``accumulate_gradients``.
        optimizer: a ``torch.optim`` optimizer over (some of) the model's parameters.
        loader: a re-iterable of ``(inputs, targets)`` batches (a list, a ``DataLoader``). When it
            runs out before ``steps`` batches were taken it is started again, like a new epoch; an
            empty loader raises ``ValueError``.
        steps: the number of optimizer steps (batches), a non-negative int.

    Per step: zero the gradients, ``accumulate_gradients`` on the next batch, ``optimizer.step()``.

    Returns:
        The list of the ``steps`` full-batch mean losses, as Python floats (each computed before
        its step).

    Graded on, one cell per property, with the models, losses and float32 data of
    ``accumulate_gradients`` and ``torch.optim.SGD`` without momentum and with momentum 0.9, over the
    trainable parameters only. Values: loaders that are lists of batches of unequal sizes (37, 37, 23
    with micro-batches of 8; 37, 29, 33 with micro-batches of 10), as many steps as batches; and two
    cases whose sizes and seeds are drawn at grading time, no batch a multiple of micro_batch_size and
    the targets of its last micro-batch offset by 3: two steps (lr 0.1, momentum 0.9) of the frozen
    model with ``nn.MSELoss()`` on two batches of 100 to 1000 samples with micro_batch_size 5 to 64, and
    one step (lr 0.1, no momentum) of a Linear(16, 64)-Tanh-Linear(64, 1) MLP on one batch of 768 to
    1000 samples with micro_batch_size 8 to 24 (the memory cell's sizes); every step's
    loss and the final parameters are compared, to float32 rounding, with the same number of full-batch
    SGD steps computed in float64; frozen parameters must not change. Memory: one step on a model that
    refuses calls on more than micro_batch_size samples and whose output depends on a sample's place in
    the call (the micro-batches of ``accumulate_gradients``); and one step of ``torch.optim.SGD`` (lr 0.02,
    no momentum) on the wide MLP of ``accumulate_gradients``' memory cell, on 768 to 1000 samples with
    micro_batch_size 8 to 24 (sizes and values drawn at grading time): what your process holds while it
    runs, read from outside it, must stay under a quarter of the whole batch's activations, and each
    parameter's update by that very step must be that of one step on the micro-batches (to a thousandth
    of its largest entry). Edge cases: loaders that run out (5 steps from 3 batches; 4 steps from 2
    batches in an iterable without ``len`` or indexing, like a ``DataLoader``), the losses as Python
    floats, ``steps=0`` (an empty list, nothing changed) and the ``ValueError`` of an empty loader. Each
    graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    losses = []
    batches = iter(loader)
    for _ in range(steps):
        try:
            inputs, targets = next(batches)
        except StopIteration:
            batches = iter(loader)  # a new epoch
            try:
                inputs, targets = next(batches)
            except StopIteration:
                raise ValueError("the loader yielded no batches") from None
        optimizer.zero_grad()  # .grad accumulates across batches too
        loss = accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size)
        optimizer.step()
        losses.append(float(loss))
    return losses
    ### END SOLUTION


# %% test="test_train_accumulated" points=2 checks="train_accumulated"
torch.manual_seed(0)
loader = [(torch.randn(10, 6), torch.randn(10, 2)) for _ in range(2)]
net_a, net_b = nn.Linear(6, 2), nn.Linear(6, 2)
net_b.load_state_dict(net_a.state_dict())
losses = train_accumulated(net_a, torch.optim.SGD(net_a.parameters(), lr=0.1), nn.MSELoss(), loader,
                           micro_batch_size=3, steps=2)
assert len(losses) == 2, f"one loss per step: expected 2, got {len(losses)}"
opt_b = torch.optim.SGD(net_b.parameters(), lr=0.1)
for step in range(2):  # the same two steps, full batch
    xb, yb = loader[step]
    opt_b.zero_grad()
    loss_b = nn.MSELoss()(net_b(xb), yb)
    loss_b.backward()
    opt_b.step()
    assert abs(float(losses[step]) - loss_b.item()) < 1e-5, \
        f"step {step}: loss {float(losses[step]):.6f}, expected {loss_b.item():.6f}"
torch.testing.assert_close(net_a.weight, net_b.weight, msg="two accumulated steps must equal two full-batch steps: "
                           "are the gradients zeroed once per batch (not per micro-batch, not never)?")
# A larger batch (graded on batches of up to 1000 samples): still one step per batch.
big_batch = (torch.randn(250, 6), torch.randn(250, 2))
train_accumulated(net_a, torch.optim.SGD(net_a.parameters(), lr=0.1), nn.MSELoss(), [big_batch], micro_batch_size=16,
                  steps=1)
opt_b.zero_grad()
nn.MSELoss()(net_b(big_batch[0]), big_batch[1]).backward()
opt_b.step()
torch.testing.assert_close(net_a.weight, net_b.weight, msg="on 250 samples with micro_batch_size=16, one accumulated "
                           "step must equal one full-batch step: one optimizer.step() per batch, at every size")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch03_accumulation", "test_train_accumulated", globals())
### END HIDDEN TESTS

# %% test="test_train_accumulated_memory" points=1 checks="train_accumulated"
counted = CountingModel(nn.Linear(6, 2))
train_accumulated(counted, torch.optim.SGD(counted.parameters(), lr=0.1), nn.MSELoss(), loader,
                  micro_batch_size=3, steps=2)
assert counted.sizes == [3, 3, 3, 1] * 2, \
    f"forwarded batches of {counted.sizes}: each batch of 10 goes through micro-batches of 3, 3, 3 and 1"
# What autograd holds at once during a step: about one micro-batch's activations.
from coursekit import saved_tensors

wide = nn.Sequential(nn.Linear(6, 512), nn.Tanh(), nn.Linear(512, 2))
wide_loader = [(torch.randn(64, 6), torch.randn(64, 2))]
with saved_tensors(wide) as one_micro:
    nn.MSELoss()(wide(wide_loader[0][0][:8]), wide_loader[0][1][:8]).backward()
with saved_tensors(wide) as stepped:
    train_accumulated(wide, torch.optim.SGD(wide.parameters(), lr=0.01), nn.MSELoss(), wide_loader,
                      micro_batch_size=8, steps=1)
assert stepped.peak_activation_bytes < 2 * one_micro.peak_activation_bytes, \
    f"autograd held {stepped.peak_activation_bytes:,} bytes of activations at once, one micro-batch's are " \
    f"{one_micro.peak_activation_bytes:,}: each batch goes through accumulate_gradients' micro-batches"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch03_accumulation", "test_train_accumulated_memory", globals())
### END HIDDEN TESTS

# %% test="test_train_accumulated_edge_cases" points=1 checks="train_accumulated"
net_c = nn.Linear(6, 2)
losses = train_accumulated(net_c, torch.optim.SGD(net_c.parameters(), lr=0.1), nn.MSELoss(), loader,
                           micro_batch_size=3, steps=3)
assert isinstance(losses, list) and len(losses) == 3, "one loss per step; the 2-batch loader starts again"
assert all(isinstance(v, float) for v in losses), "return the losses as Python floats"
before = net_c.weight.detach().clone()
assert train_accumulated(net_c, torch.optim.SGD(net_c.parameters(), lr=0.1), nn.MSELoss(), loader, 3, 0) == [], \
    "steps=0: no step, an empty list"
assert torch.equal(net_c.weight, before), "steps=0 changes nothing"
try:
    train_accumulated(net_c, torch.optim.SGD(net_c.parameters(), lr=0.1), nn.MSELoss(), [], 3, 2)
except ValueError:
    pass
else:
    raise AssertionError("an empty loader should raise ValueError")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch03_accumulation", "test_train_accumulated_edge_cases", globals())
### END HIDDEN TESTS

# %% [markdown]
# ## 6. Measure it
#
# ### 6.1 Activation memory follows the micro-batch
#
# With accumulation only one micro-batch's graph exists at a time, so the bytes saved for
# backward are those of *one* micro-batch forward/backward. We measure that with
# `coursekit.measure`, for every micro-batch size that divides our batch of 256. The last line
# is the tempting shortcut of section 3: forward all micro-batches, sum their weighted losses,
# one `backward()`.

# %%
x_batch, y_batch = x_all[:BATCH], y_all[:BATCH]
MICRO_SIZES = [2 ** i for i in range(int(math.log2(BATCH)) + 1)]  # 1, 2, 4, ..., 256
model = make_model()
act_bytes = {m: activation_bytes(model, x_batch[:m], y_batch[:m]) for m in MICRO_SIZES}
for m in MICRO_SIZES:
    print(f"micro-batch {m:4} ({BATCH // m:3} forwards per step): {act_bytes[m] / KB:8,.1f} KB of activations "
          f"= {act_bytes[m] / act_bytes[BATCH]:6.2%} of the full batch (m / B = {m / BATCH:6.2%})")
    assert act_bytes[m] == PER_SAMPLE * m + FIXED  # per-sample bytes × micro-batch, plus the loss's scalar


micro_batches = [(x_batch[a:a + 32].clone(), y_batch[a:a + 32].clone()) for a in range(0, BATCH, 32)]


def summed_then_backward():
    """All micro-batch losses first, one backward: every graph is alive at once."""
    return sum(loss_fn(model(x), y) * len(x) / BATCH for x, y in micro_batches)


summed = measure(summed_then_backward, model).activation_bytes
print(f"\nsum the 8 micro-batch losses of 32, then one backward: {summed / KB:,.1f} KB "
      f"({summed / act_bytes[BATCH]:.0%} of the full batch)")

# %% [markdown]
# The ratio is $m / B$ up to the loss's one batch-independent scalar: every other saved tensor
# has the batch as its first dimension. And summing the losses before `backward()` saves nothing
# at all: the 8 graphs coexist.
#
# ### 6.2 Same training, less memory (unless there is BatchNorm)
#
# Train five copies of the same model for the same number of steps on the same data, SGD with
# learning rate 0.1: full batches of 256; accumulation with micro-batches of 32 (8 per step);
# plain small batches of 32 (one step per 32 samples, same number of steps); and the
# BatchNorm version of the model, full batch vs accumulated.

# %%
LR, MICRO = 0.1, 32


def train(norm: str, batch: int, micro: int):
    model = make_model(norm)
    loader = [(x_all[i * batch:(i + 1) * batch], y_all[i * batch:(i + 1) * batch]) for i in range(STEPS)]
    losses = train_accumulated(model, torch.optim.SGD(model.parameters(), lr=LR), loss_fn, loader, micro, STEPS)
    return model, losses


def max_weight_diff(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


runs = {}
for name, norm, batch, micro in tqdm([("LayerNorm, full batch 256", "layer", BATCH, BATCH),
                                      (f"LayerNorm, 256 as {BATCH // MICRO}×{MICRO} accumulated", "layer", BATCH, MICRO),
                                      (f"LayerNorm, small batches of {MICRO}", "layer", MICRO, MICRO),
                                      ("BatchNorm, full batch 256", "batch", BATCH, BATCH),
                                      (f"BatchNorm, 256 as {BATCH // MICRO}×{MICRO} accumulated", "batch", BATCH, MICRO)],
                                     desc="training", leave=False):
    runs[name] = train(norm, batch, micro)
names = list(runs)
ln_diff = max_weight_diff(runs[names[0]][0], runs[names[1]][0])
small_diff = max_weight_diff(runs[names[0]][0], runs[names[2]][0])
bn_diff = max_weight_diff(runs[names[3]][0], runs[names[4]][0])
print(f"after {STEPS} steps, max |weight difference| vs full-batch training:\n"
      f"  LayerNorm, accumulated:    {ln_diff:.1e}\n"
      f"  LayerNorm, small batches:  {small_diff:.1e}\n"
      f"  BatchNorm, accumulated:    {bn_diff:.1e}")
assert ln_diff < 1e-4, "accumulation must match full-batch training to float32 rounding"

fig, ax = plt.subplots(figsize=(8, 3.4))
styles = ["-", "--", ":", "-", "--"]
colors = ["#4c72b0", "#dd8452", "#8c8c8c", "#55a868", "#c44e52"]
for (name, (_, losses)), ls, c in zip(runs.items(), styles, colors):
    ax.plot(range(1, STEPS + 1), losses, ls, color=c, label=name, lw=2 if ls == "-" else 1.5)
ax.set_xlabel("optimizer step")
ax.set_ylabel("training loss (per batch)")
ax.legend(fontsize=7, frameon=False)
fig.tight_layout()
plt.show()

# %% [markdown]
# - **LayerNorm, accumulated:** the weights agree with full-batch training to float32 rounding
#   (summing eight partial gradients rounds differently from one big reduction; nothing else
#   differs), and the loss curves lie on top of each other.
# - **Small batches:** a different optimisation: noisier losses from different samples, and
#   weights that end up far from the full-batch ones.
# - **BatchNorm, accumulated:** visibly different. LayerNorm normalises each sample on its own;
#   BatchNorm normalises each feature with the mean and variance *of the batch it is given*, so
#   with accumulation every sample is normalised with its micro-batch's statistics, not the
#   batch's. The forward pass, the loss and the gradient all change (and the running statistics
#   get $k$ updates per step instead of one). The smaller the micro-batch, the noisier those
#   statistics. Remedies: LayerNorm or GroupNorm, which do not mix samples; or accept it:
#   Hoffer et al. (2017) normalise over small "ghost" batches on purpose.
#
# ### 6.3 What it costs in time
#
# Same FLOPs per step, but cut into more, smaller matrix products, plus Python overhead per
# forward. Wall-clock times are noisy and machine-dependent: informative, never asserted. Each
# time below is the minimum of several repeats (`coursekit.timing.time_it`), and each ratio to
# the full batch comes with `compare`'s verdict on whether the repeats can carry it.

# %%
def step_timing(micro: int) -> Timing:
    """One optimizer step on the batch of 256, accumulated over micro-batches of ``micro``: repeats and their minimum."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loader = [(x_batch, y_batch)]
    return time_it(lambda: train_accumulated(model, opt, loss_fn, loader, micro, 1), repeats=fast(7, 2))


def step_flops(micro: int) -> int:
    """Forward + backward FLOPs of one accumulated step (all micro-batches)."""
    with flop_counter() as counter:
        accumulate_gradients(make_model(), loss_fn, x_batch, y_batch, micro)
    return counter.get_total_flops()


step_times = {m: step_timing(m) for m in tqdm(MICRO_SIZES[::-1], desc="timing", leave=False)}
step_ms = {m: 1e3 * t.best for m, t in step_times.items()}  # the minimum of the repeats
flops = {m: step_flops(m) for m in MICRO_SIZES}
for m in MICRO_SIZES:
    print(f"micro-batch {m:4}: {flops[m]:,} FLOPs, {step_times[m]} per step; "
          f"{compare(step_times[m], step_times[BATCH], (f'm={m}', 'full batch'))}")
assert len(set(flops.values())) == 1  # the same arithmetic, cut differently

# %% [markdown]
# The FLOPs per step are identical at every micro-batch size, yet the time grows with the number
# of forward passes: our model is so small that one forward/backward costs mostly fixed per-call
# overhead (Python, operator dispatch, small allocations), not arithmetic. For a large
# model, where one micro-batch's matrix products take far longer than that overhead, the cost of
# splitting is much smaller; on a GPU, though, too small a micro-batch leaves most of the chip
# idle. Either way: choose the largest micro-batch that fits.
#
# ### Your lecture notes vs what we measure
#
# The lecture notes write the accumulated gradient as the plain mean of the $k$ micro-batch
# gradients, $\frac{1}{k}\sum_i \nabla L_i$, say that the result is exactly the full-batch one,
# and call the price a slight slowdown. Three things to check:
#
# - **The formula** assumes $k$ micro-batches of equal size. When the last one is smaller, the
#   weights must be $n_i / B$ (section 3); with equal weights the small last micro-batch counts
#   as much as a full one.
# - **"Exactly the same"** holds in exact arithmetic, not bit for bit in float32. Accumulation
#   computes another sum: each micro-batch reduces its own samples, then `backward()` adds the
#   partial gradients into `.grad` one by one, and float addition is not associative, so the
#   last bits differ. Both float32 results are compared below with the gradient computed in
#   float64 (errors relative to its largest entry).
# - **"Slight"** depends on the micro-batch. The timings above are the minimum of several
#   repeats (`coursekit.timing`); `compare` calls a ratio "within noise" when the repeats of
#   the two sides overlap, and only then.

# %%
def flat_grad(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def full_batch_grad(x: torch.Tensor, y: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    model = make_model().to(dtype)
    loss_fn(model(x.to(dtype)), y).backward()
    return flat_grad(model)


def accumulated_grad(x: torch.Tensor, y: torch.Tensor, micro: int, equal_weights: bool = False) -> torch.Tensor:
    model = make_model()
    if not equal_weights:
        accumulate_gradients(model, loss_fn, x, y, micro)
        return flat_grad(model)
    pieces = list(zip(x.split(micro), y.split(micro)))
    for xi, yi in pieces:  # the lecture's formula: every micro-batch weighted 1/k
        (loss_fn(model(xi), yi) / len(pieces)).backward()
    return flat_grad(model)


exact = full_batch_grad(x_batch, y_batch, torch.float64)
full32 = full_batch_grad(x_batch, y_batch)
scale = exact.abs().max().item()
print(f"gradient of the batch of {BATCH}, {exact.numel():,} entries; "
      f"full batch in float32 vs float64: max |error| {(full32.double() - exact).abs().max().item() / scale:.1e} "
      "(relative to the largest entry)")
for micro in (32, 1):
    acc = accumulated_grad(x_batch, y_batch, micro)
    same_bits = (acc == full32).float().mean().item()
    print(f"accumulated over micro-batches of {micro:2}: {same_bits:6.1%} of the entries bit-identical to the full "
          f"batch's float32 gradient; max |difference| {(acc - full32).abs().max().item() / scale:.1e}, "
          f"vs float64 {(acc.double() - exact).abs().max().item() / scale:.1e}")

B_ODD = BATCH - 6  # not a multiple of 32: the last micro-batch holds 26 samples
exact_odd = full_batch_grad(x_batch[:B_ODD], y_batch[:B_ODD], torch.float64)
for label, equal in (("weights n_i / B", False), ("equal weights 1/k", True)):
    g = accumulated_grad(x_batch[:B_ODD], y_batch[:B_ODD], 32, equal_weights=equal)
    print(f"batch of {B_ODD} in micro-batches of 32, {label:17}: max |error| vs float64 "
          f"{(g.double() - exact_odd).abs().max().item() / exact_odd.abs().max().item():.1e}")

again = step_timing(BATCH)  # the full batch once more: a difference the repeats cannot carry
for micro in (32, 1):
    print(f"micro-batch {micro:2} vs full batch: {compare(step_times[micro], step_times[BATCH], (str(micro), 'full'))}")
print(f"full batch, timed twice:    {compare(again, step_times[BATCH], ('second', 'first'))}")

# %% [markdown]
# The equal split is wrong as soon as the micro-batches differ in size: its error is orders of
# magnitude above rounding. With the right weights, accumulation and the full batch share only
# part of their bits, and both sit within a few float32 roundings of the float64 gradient (a
# little further with more micro-batches: more additions into `.grad`). The same gradient to
# float32 rounding, then, not the same bits. And the time is not a slight cost on this model:
# the ratios are beyond the repeats' spread and grow with the number of forward passes. The
# last line times the full batch a second time, where there is no real difference to find:
# `compare` says whether its repeats could tell one.
#
# ## 7. Play with it
#
# Slide the micro-batch size (a power of two, so that it divides the batch of 256): activation
# memory, forward passes per optimizer step, and measured step time.

# %% tags=["demo"]
def draw(axes, log2_micro=5):
    micro = 2 ** log2_micro
    ax_mem, ax_fwd, ax_time = axes
    sizes = np.array(MICRO_SIZES)
    panels = ((ax_mem, [act_bytes[m] / KB for m in MICRO_SIZES], "activations (KB)", "{:,.0f} KB"),
              (ax_fwd, [BATCH // m for m in MICRO_SIZES], "forward passes per step", "{:,.0f} passes"),
              (ax_time, [step_ms[m] for m in MICRO_SIZES], "step time (ms)", "{:,.1f} ms"))
    for ax, values, label, fmt in panels:
        ax.plot(sizes, values, "o-", color="#4c72b0")
        ax.plot([micro], [values[log2_micro]], "o", ms=14, mfc="none", color="#c44e52")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("micro-batch size (examples)")
        ax.set_ylabel(label)
        ax.set_title(fmt.format(values[log2_micro]))
    ax_mem.axhline(act_bytes[BATCH] / KB, color="k", ls="--", lw=1, label="full batch")
    ax_mem.legend(loc="lower right")


slider_plot(draw, ncols=3, figsize=(12, 3.8), log2_micro=(0, int(math.log2(BATCH)), 1),
            defaults={"log2_micro": 5}, labels={"log2_micro": lambda v: f"micro-batch size: {2 ** v}"},
            explain={"log2_micro": f"examples per forward and backward; gradients of {BATCH} are accumulated per update"},
            notice={"log2_micro": lambda log2_micro: f"micro-batch {2 ** log2_micro}: activations "
                                                    f"{act_bytes[2 ** log2_micro] / act_bytes[BATCH]:.0%} of the full "
                                                    f"batch's, {BATCH // 2 ** log2_micro} passes, the same update"})

# %% [markdown]
# ## 8. What practice reports vs what we measured
#
# Gradient accumulation has no single founding paper; it is standard practice (e.g. the
# `gradient_accumulation_steps` option of Hugging Face's `Trainer` and of nanoGPT), and its claims are:
# activation memory scales with the micro-batch, not the batch; with per-sample layers the result
# is the full-batch update up to rounding; BatchNorm breaks the equivalence (it is why Hoffer et
# al. 2017 could use "ghost" batches as a regulariser); and the price is time, not accuracy.

# %%
table = [
    (f"activation memory, micro-batch 32 / batch {BATCH}", f"m / B = {32 / BATCH:.1%}",
     f"{act_bytes[32] / act_bytes[BATCH]:.1%}"),
    (f"activation memory, micro-batch 1 / batch {BATCH}", f"m / B = {1 / BATCH:.2%}",
     f"{act_bytes[1] / act_bytes[BATCH]:.2%}"),
    ("sum losses, then one backward", "no saving", f"{summed / act_bytes[BATCH]:.0%} of the full batch"),
    (f"weights after {STEPS} steps, LayerNorm, accumulated vs full", "equal up to rounding", f"max diff {ln_diff:.1e}"),
    (f"weights after {STEPS} steps, BatchNorm, accumulated vs full", "not equal", f"max diff {bn_diff:.1e}"),
    (f"weights after {STEPS} steps, small batches vs full", "a different optimisation", f"max diff {small_diff:.1e}"),
    ("time per step, micro-batch 32 / full", "slower: same FLOPs, more and smaller passes",
     compare(step_times[32], step_times[BATCH], ("32", "full"))),
    ("time per step, micro-batch 1 / full", "much slower (avoid)", compare(step_times[1], step_times[BATCH], ("1", "full"))),
]
literature_table(table, source="practice")

fig, (ax_mem, ax_eq) = plt.subplots(1, 2, figsize=(10, 3.4))
ratios = [act_bytes[m] / act_bytes[BATCH] for m in MICRO_SIZES]
ax_mem.plot(MICRO_SIZES, [m / BATCH for m in MICRO_SIZES], "-", color="#8c8c8c", lw=4, alpha=0.5, label="m / B")
ax_mem.plot(MICRO_SIZES, ratios, "o", color="#dd8452", label="measured")
ax_mem.set_xscale("log", base=2)
ax_mem.set_yscale("log")
ax_mem.set_xlabel("micro-batch size m")
ax_mem.set_ylabel("activation memory / full batch")
ax_mem.legend(frameon=False)
diffs = {"LayerNorm\naccumulated": ln_diff, "BatchNorm\naccumulated": bn_diff, "LayerNorm\nsmall batches": small_diff}
bars = ax_eq.bar(range(len(diffs)), [max(d, 1e-9) for d in diffs.values()], color=["#4c72b0", "#c44e52", "#8c8c8c"])
ax_eq.bar_label(bars, labels=[f"{d:.1e}" for d in diffs.values()], fontsize=8)
ax_eq.axhline(1e-5, color="k", ls="--", lw=0.8, label="float32 tolerance")
ax_eq.set_yscale("log")
ax_eq.set_xticks(range(len(diffs)), list(diffs), fontsize=8)
ax_eq.set_ylabel(f"max |Δ weight| after {STEPS} steps")
ax_eq.legend(frameon=False, fontsize=8)
fig.tight_layout()
plt.show()
print(f"micro-batch 1: measured {act_bytes[1]:,} bytes; m / B × the full batch's {act_bytes[BATCH]:,} bytes "
      f"gives {act_bytes[BATCH] / BATCH:,.2f}: the {FIXED}-byte scalar is kept once per forward pass, not once per batch")

# %% [markdown]
# Both claims hold here. Memory is $m / B$ of the full batch up to the loss's one
# batch-independent scalar (section 1), which shows only at the smallest micro-batches (next
# cell). With LayerNorm, accumulation is the full-batch update to float32 rounding, while
# BatchNorm and a plain small batch are not.
# The time cost depends on the machine; on our small CPU model it is mostly Python and kernel
# overhead per forward, which is why tiny micro-batches hurt most.
#
# ## 9. Summary
#
# - Activation memory is (bytes per sample) × (samples per forward pass); shrinking the batch
#   saves memory but changes the optimisation.
# - Gradient accumulation forwards micro-batches, weights each mean loss by $n_i / B$, calls
#   `backward()` per micro-batch (`.grad` adds up) and steps once: the full-batch gradient with
#   the activation memory of one micro-batch. Zero the gradients once per batch, not per
#   micro-batch, and keep only detached losses.
# - It is exact for layers that treat samples independently (Linear, LayerNorm, attention
#   within a sequence); BatchNorm sees micro-batch statistics instead, so the update changes.
# - The price is time: more, smaller forward passes. Use the largest micro-batch that fits.
