# ---
# jupyter:
#   chapter:
#     title: "Mixed precision and loss scaling"
#     imports: []
#     checkpoints: [tinygpt_fibonacci]
#     prose_numbers:  # phrases whose numbers are definitions or quoted figures (tests/test_prose_numbers.py)
#       - 'Each graded cell may use 60 s and 4 GiB'  # the grader's limits per graded cell
#       - 'Training entirely in 16 bits'
#       - 'runs the rest in 16 bits'
#       - 'profit from 16 bits'
#       - '8 bits instead of 11'  # bf16 and fp16 significands
#       - 'Paper: about 5% of the weight gradients'
#       - 'memory "nearly 2×" smaller'  # Micikevicius et al.
#       - '"≈ 5% (speech model)"'
#       - '"nearly 2×"'
#       - 'the paper''s 2×'
#       - 'by less than 2× when'
#     mentioned:  # names an exercise's text uses that grading does not offer (tests/test_namespace.py)
#       GradScaler:
#         NaN: "a floating-point value"
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
# # Chapter 9 — Mixed precision and loss scaling
#
# Half-precision numbers take half the bytes of float32 and, on a GPU, run matmuls many times
# faster. Training entirely in 16 bits does not work, though: weight updates vanish when they are
# added to the weights, and small gradients vanish in the backward pass. *Mixed precision*
# (Micikevicius et al. 2018) keeps what must be exact in float32 and runs the rest in 16 bits.
#
# **What you will learn**
# - what fp16 and bf16 can represent, and why a gradient at or below $2^{-25}$ (half of fp16's smallest
#   number, $2^{-24}$) becomes exactly 0 in fp16, while one just above $2^{-25}$ still rounds up to $2^{-24}$;
# - the recipe: float32 *master weights*, a half-precision forward and backward under `torch.autocast`,
#   and what autocast actually does to each op (measured, on this CPU);
# - *dynamic loss scaling*: multiply the loss by $S$, divide the gradients by $S$, skip the step and
#   halve $S$ on overflow, double it after a run of clean steps; you will write a `GradScaler` that
#   follows `torch.amp.GradScaler` step for step;
# - why bfloat16 needs no scaler;
# - what it buys and costs on the tiny transformer: gradients lost to underflow, bytes saved for
#   backward, and training curves in fp32, bf16 and fp16.

# %% tags=["setup"]
import math

import torch
from torch import nn

FP16_MAX = torch.finfo(torch.float16).max  # 65504 = (2 - 2^-10) * 2^15
FP16_MIN_NORMAL = torch.finfo(torch.float16).tiny  # 2^-14
FP16_MIN_SUBNORMAL = 2.0 ** -24  # the smallest positive fp16 number: 2^-14 * 2^-10

# %% [markdown]
# ## 1. What a 16-bit number can hold
#
# A floating-point number is $(-1)^s \cdot 1.m \cdot 2^{e}$. fp16 has 5 exponent bits and 10 mantissa
# bits, bf16 8 exponent bits (float32's) and 7 mantissa bits:
#
# | format | bits (sign/exp/mantissa) | largest | smallest normal | smallest subnormal | relative step |
# |---|---|---|---|---|---|
# | float32 | 1/8/23 | $3.4 \cdot 10^{38}$ | $2^{-126}$ | $2^{-149}$ | $2^{-23}$ |
# | fp16 | 1/5/10 | 65504 | $2^{-14}$ | $2^{-24} \approx 6 \cdot 10^{-8}$ | $2^{-10}$ |
# | bf16 | 1/8/7 | $3.4 \cdot 10^{38}$ | $2^{-126}$ | $2^{-133}$ | $2^{-7}$ |
#
# Below $2^{-14}$, fp16 switches to *subnormal* numbers $0.m \cdot 2^{-14}$: evenly spaced by
# $2^{-24}$, they lose one bit of precision per halving. Rounding to nearest decides what happens
# below the smallest one: a value above $2^{-25}$ (half of $2^{-24}$) still rounds up to $2^{-24}$,
# $2^{-25}$ itself is a tie that goes to the even neighbour, 0, and anything below rounds to 0.
# Above 65504 everything is `inf`. Let us check on actual casts.

# %%
from IPython.display import Markdown, display

values = [70000.0, 65504.0, 1.0, 2.0 ** -14, 1e-5, 2.0 ** -24, 2.0 ** -25 * 1.01, 2.0 ** -25, 1e-8]
names = ["70000", "65504", "1", "2^-14", "1e-5", "2^-24", "1.01 * 2^-25", "2^-25", "1e-8"]
rows = []
for name, v in zip(names, values):
    h = torch.tensor(v).half().item()
    b = torch.tensor(v).bfloat16().item()
    rows.append(f"| {name} | {v:.6g} | {h:.6g} | {b:.6g} |")
display(Markdown("| value | float32 | fp16 | bf16 |\n|---|---|---|---|\n" + "\n".join(rows)))
for v in (2.0 ** -24, 1.5 * 2.0 ** -25, 1.01 * 2.0 ** -25, 2.0 ** -25, 0.99 * 2.0 ** -25):
    h = torch.tensor(v).half().item()
    print(f"{v / 2.0 ** -25:.2f} × 2^-25 in fp16: {h:.6g}"
          + (" = 2^-24, the smallest subnormal" if h == 2.0 ** -24 else " (flushed to 0)" if h == 0 else ""))
print("finfo fp16:", torch.finfo(torch.float16))
print("finfo bf16:", torch.finfo(torch.bfloat16))

# %% [markdown]
# The other failure is precision. An update $\Delta w$ is lost when it is smaller than half the gap
# between $w$ and its neighbour: for fp16 that is $|\Delta w| < 2^{-11} |w|$. With a learning rate of
# $10^{-3}$ and a gradient of $10^{-1}$ the update is already too small for a weight of 1.
# Hence **float32 master weights**: the optimizer adds updates to float32 copies; the 16-bit weights
# are only casts, made for the forward pass.

# %%
w16, w32 = torch.tensor(1.0, dtype=torch.float16), torch.tensor(1.0)
for _ in range(100):
    w16 += 1e-4
    w32 += 1e-4
print(f"100 updates of 1e-4 to w = 1: fp16 weight {w16.item():.6f}, float32 weight {w32.item():.6f}")

# %% [markdown]
# ## 2. The recipe: autocast with float32 master weights
#
# `torch.autocast(device_type, dtype)` changes no tensor you own. Inside it, each op looks up a list:
# ops that are safe and profit from 16 bits (matmuls, linear layers) cast their inputs to `dtype`;
# ops that need range or accumulation (losses) run in float32; the others run in the dtype of their
# inputs. The parameters stay float32 (the master weights) and their gradients come back in float32,
# because the backward of the cast converts them. What does it do on this CPU? Measured:

# %%
import torch.nn.functional as F

x_ops = torch.randn(4, 8)
lin, ln, emb = nn.Linear(8, 8), nn.LayerNorm(8), nn.Embedding(8, 8)
ops = {  # op -> (what it is called on under autocast)
    "linear": lambda h: lin(h), "matmul @": lambda h: h @ h.T, "bmm": lambda h: torch.bmm(h[None], h.T[None]),
    "layer_norm (float32 input)": lambda h: ln(x_ops), "layer_norm (half input)": lambda h: ln(h),
    "gelu": F.gelu, "softmax": lambda h: h.softmax(-1), "log_softmax": lambda h: h.log_softmax(-1),
    "exp": torch.exp, "add": lambda h: h + 1, "sum": torch.sum,
    "embedding": lambda h: emb(torch.tensor([1, 2])),
    "cross_entropy": lambda h: F.cross_entropy(h, torch.tensor([0, 1, 2, 3])),
    "mse_loss": lambda h: F.mse_loss(h, torch.zeros(4, 8)),
}
table = []
for name, op in ops.items():
    out = []
    for dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cpu", dtype=dtype):
            h = lin(x_ops)  # a half-precision activation, as in a real forward pass
            out.append(str(op(h).dtype).replace("torch.", ""))
    table.append(f"| {name} | {out[0]} | {out[1]} |")
display(Markdown("| op under autocast (CPU) | dtype=bfloat16 | dtype=float16 |\n|---|---|---|\n" + "\n".join(table)))

# %% [markdown]
# On the CPU, linear layers and matmuls run in half precision; the losses run in float32; the
# rest (GELU, softmax, LayerNorm on a half input, sums) simply follow their input. The CUDA lists
# are more careful: there softmax, log_softmax, layer_norm, exp and sum are among the ops that run in
# float32. Note that the embedding output stays float32: autocast casts inputs of listed ops only.
#
# ## 3. Why small gradients flush to zero
#
# The backward pass multiplies gradients by weights and derivatives, layer after layer. A mean loss
# over $B \cdot T$ tokens starts it with entries of order $1/(BT)$, and a model that fits its data well
# produces smaller ones still. Let us collect every gradient of the pretrained tiny transformer in
# float32, the weight gradients and the gradients flowing between layers (the outputs of every linear
# layer), on two batches: the task it was pretrained on (loss near 0, tiny gradients) and a new task
# (large loss, large gradients). Then we cast them to fp16, as a half-precision backward would.

# %%
import matplotlib.pyplot as plt
import numpy as np

from coursekit import fast, measure
from coursekit.checkpoints import load_pretrained
from coursekit.data import batches, source_task, target_task
from coursekit.transformer import lm_loss
from coursekit.report import literature_table, paired_bars
from coursekit.widgets import slider_plot

BATCH = fast(64, 16)
source_test, target_train = source_task(256, seed=5), target_task(fast(4000, 512), seed=101)


def float32_gradients(task):
    """Weight gradients and activation gradients (linear-layer outputs) of one fp32 backward."""
    model = load_pretrained()
    acts = []

    def keep_output_grad(_module, _inputs, out):  # returns None: the output is left unchanged
        out.register_hook(lambda g: acts.append(g.flatten()))

    hooks = [m.register_forward_hook(keep_output_grad) for m in model.modules() if isinstance(m, nn.Linear)]
    loss = lm_loss(model(task.x[:BATCH]), task.y[:BATCH])
    loss.backward()
    for h in hooks:
        h.remove()
    weights = torch.cat([p.grad.flatten() for p in model.parameters()])
    acts = torch.cat(acts)
    return loss.item(), {"weight": weights[weights != 0], "activation": acts[acts != 0]}


def fp16_fate(g, scale=1.0):
    """Fractions of the nonzero gradients g that become 0, subnormal, or inf once g * scale is cast to fp16."""
    h = (g * scale).half()
    zero, inf = (h == 0), h.isinf()
    return {"zero": zero.float().mean().item(), "inf": inf.float().mean().item(),
            "subnormal": ((h.abs() < FP16_MIN_NORMAL) & ~zero).float().mean().item()}


grads = {}
for task_name, task in (("pretrained task", source_test), ("new task", target_train)):
    loss, grads[task_name] = float32_gradients(task)
    print(f"{task_name}: loss {loss:.3g}")
underflow_rows = []
for task_name, kinds in grads.items():
    for kind, g in kinds.items():
        fates = {s: fp16_fate(g, 2.0 ** s) for s in (0, 3, 10, 16)}
        underflow_rows.append((task_name, kind, g.abs().log2().median().item(), fates))
display(Markdown(
    "| batch | gradients | median log2 abs | zero in fp16, S=1 | S=2^3 | S=2^10 | S=2^16 | inf at S=2^16 |\n"
    "|---|---|---|---|---|---|---|---|\n" + "\n".join(
        f"| {t} | {k} | {med:.1f} | {f[0]['zero']:.1%} | {f[3]['zero']:.1%} | {f[10]['zero']:.1%} | "
        f"{f[16]['zero']:.2%} | {f[16]['inf']:.2%} |" for t, k, med, f in underflow_rows)))
pre_med, pre_fate = next((med, f) for t, k, med, f in underflow_rows if t == "pretrained task" and k == "activation")
display(Markdown(f"On the task the model already solves, the median activation gradient is $2^{{{pre_med:.0f}}}$, "
                 f"{'at or below' if pre_med <= -25 else 'above'} $2^{{-25}}$, where fp16 rounds to 0: unscaled, "
                 f"{pre_fate[0]['zero']:.0%} of "
                 "them would be 0 in an fp16 backward, and the weight gradients computed from them would be lost too."))

# %% [markdown]
# Multiplying the loss by $S$ multiplies every
# gradient by $S$ (backward is linear in the loss) and moves the whole histogram up by $\log_2 S$;
# nothing overflows until the largest gradient passes 65504. Where the loss is large (the new task),
# few gradients are in danger, and a large $S$ starts overflowing the largest ones.
#
# ## 4. Dynamic loss scaling
#
# Choose $S$ as large as possible without overflow, and let the training find it:
#
# 1. backward on $S \cdot L$ (the gradients are $S \, \nabla L$);
# 2. *unscale*: divide every gradient by $S$, in float32, and note whether any is `inf` or `NaN`;
# 3. if one is, **skip** the optimizer step (parameters *and* optimizer state untouched) and set
#    $S \leftarrow S \cdot \text{backoff}$ (0.5); else step, and after `growth_interval` clean steps in a
#    row set $S \leftarrow S \cdot \text{growth}$ (2). An overflow resets the count of clean steps.
#
# A skipped step costs one batch; because $S$ halves at each overflow, a too-large initial scale
# ($2^{16}$ by default) is corrected within a few steps, and the doubling every 2000 steps keeps
# probing upwards. bf16 has float32's exponent range: its gradients do not underflow before
# float32's would, so it needs no scaler (its cost is precision, 8 bits instead of 11).
#
# ### Exercise: `GradScaler`
#
# Write it with the interface and the behaviour of `torch.amp.GradScaler`:
# - `scale(loss)` returns `loss * S`, a tensor of `loss`'s dtype, still attached to the graph;
# - `unscale_(optimizer)` divides the `.grad` of every parameter of the optimizer's param groups
#   in place by $S$ (parameters whose `.grad` is None are skipped) and records whether any entry of
#   any gradient held an `inf` or a `NaN`. It may be called once between two `update()` calls, before
#   `step` (to clip gradients, for instance): a second call raises `RuntimeError`, like torch's;
# - `step(optimizer)` unscales if `unscale_` was not called yet for this optimizer (never twice!),
#   then calls `optimizer.step()` only if no gradient was `inf`/`NaN`; it returns what
#   `optimizer.step()` returned (None when skipped);
# - `update()` changes $S$ once per iteration: backoff if the step overflowed (and reset the count of
#   clean steps), else count one more clean step and grow when the count reaches `growth_interval`
#   (then reset it). torch keeps $S$ as a float32 tensor and the count in `_growth_tracker`; read
#   `torch/amp/grad_scaler.py` if you want the details.
# - `get_scale()` returns $S$ as a Python float.
#
# Divide in float32 by multiplying with $1/S$ (torch computes the reciprocal in float64, then
# rounds it to float32).

# %% exercise="GradScaler"
class GradScaler:
    """Dynamic loss scaling (the same scale trajectory as ``torch.amp.GradScaler``).

    Args:
        init_scale: the first scale S (a positive float).
        growth_factor: S is multiplied by it after ``growth_interval`` clean steps in a row (> 1).
        backoff_factor: S is multiplied by it after a step with an inf/NaN gradient (in (0, 1)).
        growth_interval: number of consecutive clean steps before S grows (a positive int).

    Use per iteration: ``scale(loss).backward()``, optionally ``unscale_(optimizer)``, then
    ``step(optimizer)`` and ``update()``. Keep the state yourself: ``torch.amp.GradScaler`` is the
    reference you are compared with, and wrapping or calling it (or ``torch.cuda.amp.GradScaler``)
    is refused by the grader.

    Graded on: step by step against ``torch.amp.GradScaler("cpu")`` with the same arguments, over a
    hand-written sequence and other sequences of up to 30 steps (SGD with momentum and Adam; growth_interval 1
    to 3, growth_factor 2 and 4, backoff_factor 0.5 and 0.25, init_scale from 512 to 2^127, where the scaled
    loss itself overflows, and 2^126, whose growth would pass float32's largest number), with inf, -inf or
    NaN written into one gradient after the backward, ``unscale_`` called before ``step`` at random, a
    parameter whose .grad stays None and a frozen one in the optimizer. Besides a small model, a wide one whose
    sizes are drawn at grading time: Linear(d, h), Tanh, Linear(h, o) with d and h from 32 to 96 and o from 32
    to 64 (weights of 1024 to 9216 entries) and an unused parameter of 1024 to 4096 entries, with four
    overflows: one written in the last entry of a gradient, one in the first entry of a gradient, the others at
    flat indices drawn over the whole gradient. The check must cover every entry, the first and last included.
    Values (torch's scaler then follows your scales): the gradients after the backward, after ``unscale_`` and
    after ``step``; what ``step`` returns (None when skipped); the parameters and the optimizer state after
    each step; the gradients of one more ``scale(loss).backward()`` after the last ``update``; and ``scale``
    given float32, float16 and bfloat16 tensors of shape (2, 3) that require grad (backward through the
    result must give them S).
    Schedule: the scale before ``step``, between ``step`` and ``update`` and after ``update``. Interface: the
    ValueErrors of ``__init__``, the RuntimeErrors the methods' docstrings state, no error in a valid use
    (``update()`` after ``unscale_`` alone included), ``step(optimizer, closure)`` returning what
    ``optimizer.step(closure)`` returned, ``get_scale()`` a Python float. The ``grad_scaler`` modules and
    ``torch.cpu.amp.GradScaler`` are refused too. Each graded cell may use 60 s and 4 GiB.
    """

    def __init__(self, init_scale: float = 65536.0, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        """The defaults are ``torch.amp.GradScaler``'s. Raises ValueError for an argument out of the
        ranges above (growth_interval must be an int)."""
        ### BEGIN SOLUTION
        if not init_scale > 0:
            raise ValueError(f"init_scale must be positive, got {init_scale}")
        if not growth_factor > 1.0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor}")
        if not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"growth_interval must be a positive integer, got {growth_interval!r}")
        self._scale = torch.tensor(float(init_scale), dtype=torch.float32)  # float32, as torch keeps it
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._growth_tracker = 0  # consecutive clean steps since the last growth or overflow
        self._stage = {}  # id(optimizer) -> "unscaled" | "stepped" during this iteration
        self._found_inf = {}  # id(optimizer) -> True if one of its gradients was inf/NaN
        ### END SOLUTION

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * S``, with loss's dtype and device."""
        ### BEGIN SOLUTION
        return loss * self._scale.to(loss.device)  # a 0-dim float32 tensor keeps loss's dtype
        ### END SOLUTION

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide every gradient of ``optimizer``'s parameters by S in place and note whether one held
        an inf or NaN. RuntimeError if called twice for this optimizer before ``update()``, or after
        its ``step()``."""
        ### BEGIN SOLUTION
        stage = self._stage.get(id(optimizer))
        if stage == "unscaled":
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update()")
        if stage == "stepped":
            raise RuntimeError("unscale_() is being called after step()")
        inv_scale = self._scale.double().reciprocal().float()
        found_inf = False
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    found_inf |= not bool(torch.isfinite(p.grad).all())  # catches inf, -inf and NaN
                    p.grad.mul_(inv_scale.to(p.grad.device))
        self._found_inf[id(optimizer)] = found_inf
        self._stage[id(optimizer)] = "unscaled"
        ### END SOLUTION

    def step(self, optimizer: torch.optim.Optimizer, *args, **kwargs):
        """Unscale first if ``unscale_`` was not called; then ``optimizer.step(*args, **kwargs)`` (its
        return value) unless a gradient held an inf or NaN (then None, and the step is skipped).
        RuntimeError if called twice for this optimizer before ``update()``."""
        ### BEGIN SOLUTION
        if self._stage.get(id(optimizer)) == "stepped":
            raise RuntimeError("step() has already been called since the last update()")
        if self._stage.get(id(optimizer)) is None:
            self.unscale_(optimizer)
        retval = None
        if not self._found_inf[id(optimizer)]:
            retval = optimizer.step(*args, **kwargs)
        self._stage[id(optimizer)] = "stepped"
        return retval
        ### END SOLUTION

    def update(self) -> None:
        """End the iteration: S times backoff_factor if any gradient held an inf or NaN, S times
        growth_factor after growth_interval clean steps in a row (never to inf). RuntimeError if no
        ``step()`` or ``unscale_()`` came since the last update."""
        ### BEGIN SOLUTION
        if not self._found_inf:
            raise RuntimeError("update() needs a step() (or unscale_()) on at least one optimizer first")
        if any(self._found_inf.values()):
            self._scale = self._scale * self.backoff_factor
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                grown = self._scale * self.growth_factor
                if torch.isfinite(grown):  # torch never grows the scale to inf
                    self._scale = grown
                self._growth_tracker = 0
        self._stage, self._found_inf = {}, {}
        ### END SOLUTION

    def get_scale(self) -> float:
        """The current scale S, as a Python float."""
        ### BEGIN SOLUTION
        return float(self._scale)
        ### END SOLUTION


# %% test="test_GradScaler" points=3 checks="GradScaler"
def replay(scaler, overflows, unscale_first=()):
    """Steps of SGD with momentum on a tiny regression; an overflow is an inf written into a gradient."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(5, 3), torch.randn(5, 2)
    scales, weights = [], []
    for i, overflow in enumerate(overflows):
        opt.zero_grad()
        scaler.scale(F.mse_loss(model(x), y)).backward()
        if overflow:
            model.weight.grad[0, 1] = float("inf")
        if i in unscale_first:
            scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        weights.append(model.weight.detach().clone())
    return scales, weights


pattern = [0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0]
ours, ours_w = replay(GradScaler(init_scale=1024.0, growth_interval=3), pattern, unscale_first={1, 4})
ref, ref_w = replay(torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3), pattern, unscale_first={1, 4})
for i, (a, b) in enumerate(zip(ours_w, ref_w)):
    torch.testing.assert_close(a, b, msg=f"the weights differ from torch's after step {i + 1} "
                                         "(a step with an inf gradient must be skipped; unscale only once)")

torch.manual_seed(1)
model = nn.Linear(3, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = GradScaler(init_scale=64.0)
scaler.scale(model(torch.randn(4, 3)).sum()).backward()
g = model.weight.grad.clone()
scaler.unscale_(opt)
torch.testing.assert_close(model.weight.grad, g / 64, msg="unscale_ divides every gradient by the scale")
half = torch.ones(2, 3, dtype=torch.float16, requires_grad=True)
scaled = scaler.scale(half)
assert scaled.dtype == torch.float16, "scale(loss) keeps the loss's dtype"
scaled.sum().backward()
assert torch.equal(half.grad, torch.full((2, 3), 64.0, dtype=torch.float16)), "backward through scale(t) gives S"
torch.manual_seed(2)
wide = nn.Linear(64, 64)  # an overflow in the last entry of a wide weight counts too
wide_opt = torch.optim.SGD(wide.parameters(), lr=0.1)
wide_scaler = GradScaler(init_scale=1024.0)
wide_scaler.scale(wide(torch.randn(8, 64)).pow(2).mean()).backward()
wide.weight.grad.view(-1)[-1] = float("nan")
wide_scaler.step(wide_opt)
wide_scaler.update()
assert torch.isfinite(wide.weight).all() and wide_scaler.get_scale() == 512.0, (
    "an inf or NaN in any entry of any gradient (here the last one) is an overflow: skip the step and back off")
wide_opt.zero_grad()
wide_scaler.scale(wide(torch.randn(8, 64)).pow(2).mean()).backward()
wide.weight.grad.view(-1)[0] = float("inf")  # and in the first entry
wide_scaler.step(wide_opt)
wide_scaler.update()
assert torch.isfinite(wide.weight).all() and wide_scaler.get_scale() == 256.0, (
    "an inf or NaN in any entry of any gradient (here the first one) is an overflow: skip the step and back off")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch09_mixed_precision", "test_GradScaler", globals())
### END HIDDEN TESTS

# %% test="test_GradScaler_update" points=2 checks="GradScaler"
assert ours == ref, f"scale after each update:\n  yours {ours}\n  torch {ref}"
kwargs = dict(init_scale=512.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=2)
pattern = [0, 0, 1, 0, 1, 0, 0, 0, 0, 0]
ours, _ = replay(GradScaler(**kwargs), pattern)
ref, _ = replay(torch.amp.GradScaler("cpu", **kwargs), pattern)
assert ours == ref, f"growth_factor=4, backoff_factor=0.25: scale after each update\n  yours {ours}\n  torch {ref}"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch09_mixed_precision", "test_GradScaler_update", globals())
### END HIDDEN TESTS

# %% test="test_GradScaler_interface" points=1 checks="GradScaler"
assert isinstance(GradScaler().get_scale(), float), "get_scale() returns a Python float"
for bad in (dict(init_scale=0.0), dict(growth_factor=1.0), dict(backoff_factor=1.0), dict(growth_interval=0)):
    try:
        GradScaler(**bad)
    except ValueError:
        pass
    else:
        raise AssertionError(f"GradScaler({bad}) should raise ValueError")
torch.manual_seed(1)
model = nn.Linear(3, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = GradScaler(init_scale=64.0)
scaler.scale(model(torch.randn(4, 3)).sum()).backward()
scaler.unscale_(opt)
try:
    scaler.unscale_(opt)
except RuntimeError:
    pass
else:
    raise AssertionError("a second unscale_ before update() must raise RuntimeError")
assert scaler.step(opt, lambda: 0.25) == 0.25, "step(optimizer, closure) returns what optimizer.step(closure) returns"
scaler.update()
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch09_mixed_precision", "test_GradScaler_interface", globals())
### END HIDDEN TESTS

# %% [markdown]
# ### Exercise: `mixed_precision_step`
#
# One training step, AMP style. Zero the gradients; run the forward pass **and the loss** under
# `torch.autocast(device_type=<the inputs' device type>, dtype=dtype)`, leaving the parameters in
# float32 (never call `model.half()`: the master weights must stay float32); then, outside
# autocast, back-propagate the scaled loss and let the scaler step and update, once each. With
# `scaler=None` (fine for bf16, whose range is float32's; risky for fp16, as section 3 showed)
# back-propagate the loss itself and call `optimizer.step()`. Return the loss, unscaled, as a
# Python float.

# %% exercise="mixed_precision_step"
def mixed_precision_step(model, optimizer, scaler, inputs, targets, loss_fn, dtype):
    """One mixed-precision training step.

    Args:
        model: an ``nn.Module`` with float32 parameters (they stay float32).
        optimizer: a ``torch.optim`` optimizer over the model's parameters.
        scaler: a ``GradScaler`` (yours or ``torch.amp.GradScaler``), or None for no loss scaling
            (fine with ``torch.bfloat16``).
        inputs, targets: a batch; ``inputs.device.type`` is the autocast device type.
        loss_fn: ``loss_fn(model(inputs), targets)`` is a scalar loss.
        dtype: ``torch.float16`` or ``torch.bfloat16``, the autocast dtype.

    Returns:
        The loss of this batch (before scaling) as a Python float.

    Graded on: a float32 Linear-GELU-LayerNorm-Linear model (a batch of 37, 13 features in, 7 out) with
    cross-entropy and MSE losses, SGD with momentum and Adam already holding state and stale gradients;
    float16 with a ``torch.amp.GradScaler``, bfloat16 with one and without, and a float16 step whose loss is
    inf (the scaler skips the step; return inf): the returned loss, the update of every parameter, the
    optimizer state and the scale after the step, against a reference step. The model and ``loss_fn`` must be
    called once each, under autocast for the inputs' device with ``dtype`` and float32 parameters, and the
    scaler gets ``scale``, ``step`` and ``update`` once each, in that order. ``torch.amp.GradScaler`` is
    refused in this cell too (use the scaler you are given). Each graded cell may use 60 s and 4 GiB.
    """
    ### BEGIN SOLUTION
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)  # matmuls in dtype, the loss in float32
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)  # unscales, and skips the step on inf/NaN
        scaler.update()
    return loss.item()
    ### END SOLUTION


# %% test="test_mixed_precision_step" points=2 checks="mixed_precision_step"
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))
ref_net = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))
ref_net.load_state_dict(net.state_dict())
xb, yb = torch.randn(9, 6), torch.randint(0, 3, (9,))
opt, ref_opt = torch.optim.SGD(net.parameters(), lr=0.5), torch.optim.SGD(ref_net.parameters(), lr=0.5)
scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=1)
loss = mixed_precision_step(net, opt, scaler, xb, yb, nn.CrossEntropyLoss(), torch.float16)
assert all(p.dtype == torch.float32 for p in net.parameters()), "the master weights must stay float32"
with torch.autocast("cpu", dtype=torch.float16):
    ref_loss = nn.CrossEntropyLoss()(ref_net(xb), yb)
(ref_loss * 256.0).backward()
for p in ref_net.parameters():
    p.grad /= 256.0
ref_opt.step()
for p, q in zip(net.parameters(), ref_net.parameters()):
    torch.testing.assert_close(p, q, msg="the parameters after one step differ from an autocast reference")
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch09_mixed_precision", "test_mixed_precision_step", globals())
### END HIDDEN TESTS

# %% test="test_mixed_precision_step_scaler" points=1 checks="mixed_precision_step"
assert scaler.get_scale() == 512.0, "call scaler.update() once per step (growth_interval=1 doubles the scale)"
before = [p.detach().clone() for p in net.parameters()]
mixed_precision_step(net, opt, scaler, xb, yb, lambda out, y: nn.functional.cross_entropy(out, y) * float("inf"),
                     torch.float16)
assert all(torch.equal(p, q) for p, q in zip(net.parameters(), before)), \
    "an inf loss gives inf gradients: scaler.step(optimizer) must skip the step"
assert scaler.get_scale() == 256.0, "after the skipped step, scaler.update() halves the scale"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch09_mixed_precision", "test_mixed_precision_step_scaler", globals())
### END HIDDEN TESTS

# %% test="test_mixed_precision_step_returns" points=1 checks="mixed_precision_step"
assert isinstance(loss, float), f"return the loss as a Python float, got {type(loss).__name__}"
assert abs(loss - ref_loss.item()) < 1e-6, f"loss {loss}, expected {ref_loss.item()} (before scaling, under autocast)"
loss = mixed_precision_step(net, opt, None, xb, yb, nn.CrossEntropyLoss(), torch.bfloat16)
assert isinstance(loss, float), "with scaler=None (bf16), return the loss as a float too"
print("visible checks passed")
### BEGIN HIDDEN TESTS
from grader.api import run_hidden; run_hidden("ch09_mixed_precision", "test_mixed_precision_step_returns", globals())
### END HIDDEN TESTS

# %% [markdown]
# ### Your lecture notes vs what we measure: where the scale goes
#
# The lecture notes sum AMP up as scaling the loss and then stepping, which leaves open what the
# optimizer sees. Precisely: the **loss** is multiplied by $S$, so backward produces $S\,\nabla L$; the
# **gradients** are divided by $S$ (unscaled) before the optimizer reads them; the **update** is
# therefore the float32 update, never $S$ times it. (An optimizer fed the scaled gradients would
# step $S$ times too far with SGD; Adam would hide it, except in its $\epsilon$ and in gradient
# clipping thresholds.) Check each stage against a float32 step, with your `GradScaler`:

# %%
import copy

torch.manual_seed(0)
net_box = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))
x_box, y_box = torch.randn(32, 6), torch.randint(0, 3, (32,))
S_BOX = 1024.0


def sgd_step(amp, unscale=True):
    """One SGD step of a copy of net_box; returns (loss used for backward, grads the optimizer saw, update)."""
    net = copy.deepcopy(net_box)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    before = [p.detach().clone() for p in net.parameters()]
    scaler = GradScaler(init_scale=S_BOX)
    with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
        loss = F.cross_entropy(net(x_box), y_box)
    backward_loss = scaler.scale(loss) if amp else loss
    backward_loss.backward()
    grads_after_backward = torch.cat([p.grad.flatten() for p in net.parameters()])
    if amp and unscale:
        scaler.unscale_(opt)
    seen = torch.cat([p.grad.flatten() for p in net.parameters()])
    if amp and unscale:
        scaler.step(opt)  # the optimizer steps on the unscaled gradients
    else:
        opt.step()
    update = torch.cat([(p.detach() - b).flatten() for p, b in zip(net.parameters(), before)])
    return backward_loss.item(), grads_after_backward, seen, update


ref_loss, ref_grad, _, ref_update = sgd_step(amp=False)
amp_loss, amp_raw, amp_seen, amp_update = sgd_step(amp=True)
_, _, _, bad_update = sgd_step(amp=True, unscale=False)


def norm_ratio(a, b):
    return (a.norm() / b.norm()).item()


display(Markdown(
    f"Loss scale $S$ = {S_BOX:g}, fp16 autocast, one SGD step:\n\n| stage | AMP / float32 |\n|---|---|\n"
    f"| loss that backward starts from | {amp_loss / ref_loss:,.1f} |\n"
    f"| gradients after backward | {norm_ratio(amp_raw, ref_grad):,.1f} |\n"
    f"| gradients after `unscale_` (what the optimizer sees) | {norm_ratio(amp_seen, ref_grad):.4f} |\n"
    f"| parameter update | {norm_ratio(amp_update, ref_update):.4f} |\n"
    f"| parameter update if `unscale_` is forgotten | {norm_ratio(bad_update, ref_update):,.1f} |"))

# %% [markdown]
# ## 5. Measure it: what autocast saves for backward
#
# Autocast halves the bytes of what the matmuls save (their half-precision inputs), but not of
# everything: ops that run in float32 save float32 tensors, and each linear layer also saves the
# half-precision *copy of its weight* made by the cast, a new tensor that lives as long as the graph.
# `coursekit.measure` counts every storage saved for backward; we split them by dtype.

# %%
from coursekit.transformer import GPTConfig, TinyGPT

KB = 1024
xb_lm, yb_lm = target_train.x[:BATCH], target_train.y[:BATCH]


def saved_by_dtype(model, dtype=None):
    def step():
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            return lm_loss(model(xb_lm), yb_lm)
    m = measure(step, model)
    weight_shapes = {tuple(p.shape) for p in model.parameters()} | {tuple(p.shape[::-1]) for p in model.parameters()}
    split = {}
    for s in m.saved:
        if s.is_state:
            continue
        half = s.dtype in (torch.float16, torch.bfloat16)
        kind = "weight copies" if half and s.shape in weight_shapes else str(s.dtype)[6:]
        split[kind] = split.get(kind, 0) + s.nbytes
    return m.activation_bytes, split


model_lm = load_pretrained()
bytes_rows, act_bytes = [], {}
for label, dtype in (("float32", None), ("autocast bf16", torch.bfloat16), ("autocast fp16", torch.float16)):
    total, split = saved_by_dtype(model_lm, dtype)
    act_bytes[label] = total
    parts = ", ".join(f"{k} {v / KB:,.0f} KB" for k, v in sorted(split.items()))
    bytes_rows.append(f"| {label} | {total / KB:,.0f} KB | {total / act_bytes['float32']:.2f} | {parts} |")
display(Markdown(f"TinyGPT (d=64, 2 layers), batch {BATCH} × 32 tokens\n\n"
                 "| forward | saved for backward | vs float32 | by dtype |\n|---|---|---|---|\n" + "\n".join(bytes_rows)))

# %% [markdown]
# Not half. The attention scores and probabilities come out of half-precision matmuls, so they are
# half; but the LayerNorms run on the float32 residual stream and save float32 inputs, and the loss's
# log-softmax saves float32 logits. At our width (64) the weight copies are small; on a large model
# with a small batch they are not, which is one reason frameworks cache the casts per iteration.
#
# ## 6. Training curves: float32, bf16, fp16 with and without a scaler
#
# Fine-tune the pretrained model on the new task with Adam, the same batches for each variant, using
# your `mixed_precision_step` and your `GradScaler`. CPU autocast runs real fp16 and bf16 matmuls
# here (no simulation).
#
# **Where underflow bites.** One small batch with a plain mean loss gives gradients far above
# $2^{-24}$ (section 3's new task), and Adam divides every update by the gradient's own running
# magnitude, so fp16 would look harmless. Real training runs are different: a language model's
# batch holds millions of tokens (paper: GPT-3 used 3.2M per step, Brown et al. 2020), split into
# micro-batches whose gradients are accumulated (chapter 3). Each micro-batch's loss is then
# weighted by its share of the batch, `tokens_in_micro_batch / GLOBAL_TOKENS`, and its whole
# backward pass, in fp16, runs on gradients that many times smaller. We reproduce exactly that
# backward: each step runs one micro-batch of a $2^{21}$-token batch (the other micro-batches
# would add gradients of the same size; float32 Adam divides the constant factor out, up to its
# $\epsilon$).
# Left: the training loss (unweighted). Right: the fraction of gradient entries that are exactly 0
# after each backward, the signature of underflow. Set `GLOBAL_TOKENS = TOKENS` to see the
# plain small-batch case.

# %%
from tqdm.auto import tqdm

STEPS, LR, MICRO_BATCH = fast(80, 12), 3e-3, 8
TOKENS = MICRO_BATCH * target_train.x.shape[1]  # tokens in one micro-batch
GLOBAL_TOKENS = 2 ** 21  # tokens per optimizer step in the run this micro-batch belongs to
LOSS_WEIGHT = TOKENS / GLOBAL_TOKENS
VARIANTS = {"float32": (None, False), "bf16": (torch.bfloat16, False), "fp16 + GradScaler": (torch.float16, True),
            "fp16, no scaler": (torch.float16, False)}


def weighted_lm_loss(logits, targets):
    """The micro-batch's share of the batch's mean loss."""
    return lm_loss(logits, targets) * LOSS_WEIGHT


def train(dtype, use_scaler, steps=STEPS, task=target_train):
    torch.manual_seed(0)
    model = load_pretrained()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    scaler = GradScaler() if use_scaler else None
    hist = {"loss": [], "zero": [], "scale": []}
    for x, y in batches(task, MICRO_BATCH, steps, seed=0):
        if dtype is None:  # the float32 baseline
            opt.zero_grad(set_to_none=True)
            loss = weighted_lm_loss(model(x), y)
            loss.backward()
            opt.step()
            loss = loss.item()
        else:
            loss = mixed_precision_step(model, opt, scaler, x, y, weighted_lm_loss, dtype)
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        hist["loss"].append(loss / LOSS_WEIGHT)
        hist["zero"].append((grads == 0).float().mean().item())
        hist["scale"].append(scaler.get_scale() if scaler else None)
    return hist


curves = {name: train(*spec) for name, spec in tqdm(VARIANTS.items(), desc="variants")}
fig, (ax_l, ax_z) = plt.subplots(1, 2, figsize=(11, 3.6))
for name, h in curves.items():
    ax_l.plot(h["loss"], label=name, lw=1)
    ax_z.plot(h["zero"], label=name, lw=1)
ax_l.set(yscale="log", xlabel="step", ylabel="training loss", title="fine-tuning on the new task")
ax_z.set(xlabel="step", ylabel="fraction of gradients == 0", title="gradient entries lost to underflow")
ax_l.legend(fontsize=8, frameon=False)
fig.tight_layout()
plt.show()
tail = max(1, STEPS // 10)
final = {n: np.mean(h["loss"][-tail:]) for n, h in curves.items()}
zeros = {n: np.mean(h["zero"][-tail:]) for n, h in curves.items()}
display(Markdown(f"Micro-batch of {TOKENS} tokens in a batch of {GLOBAL_TOKENS:,}: loss weight 2^{math.log2(LOSS_WEIGHT):.0f}."
                 "\n\n| variant | final loss (mean of last steps) | zero gradient entries (last steps) |\n|---|---|---|\n"
                 + "\n".join(f"| {n} | {final[n]:.4f} | {zeros[n]:.2%} |" for n in curves)))
scales = curves["fp16 + GradScaler"]["scale"]
display(Markdown(
    f"Without a scaler, fp16 ends at a loss of {final['fp16, no scaler']:.3f} against {final['float32']:.3f} "
    f"in float32 ({final['fp16, no scaler'] / final['float32']:.1f}×), with {zeros['fp16, no scaler']:.0%} of the "
    f"gradient entries exactly 0 at the end. With your `GradScaler` fp16 ends at {final['fp16 + GradScaler']:.3f} "
    f"and bf16, unscaled, at {final['bf16']:.3f}. " + (
        f"The scale stayed at its initial {scales[-1]:g}: with gradients this small nothing overflowed."
        if min(scales) == max(scales) == GradScaler().get_scale() else
        f"The scale went from {GradScaler().get_scale():g} to {scales[-1]:g} "
        f"({sum(b < a for a, b in zip([GradScaler().get_scale()] + scales, scales))} overflow steps skipped).")))

# %% [markdown]
# Underflow is not all or nothing. The gradients of the logits come from the float32 loss and stay
# representable; each layer further down multiplies them by weights well below 1 and by the softmax and
# GELU derivatives, so the gradients reaching the lower layers and the embeddings are smaller, and
# those are the entries that become exactly 0. Their parameters stop learning, and the loss falls
# more slowly and stalls higher; the fraction of lost entries grows as the loss falls, because
# smaller losses have smaller gradients (section 3). The loss scale lifts everything by $\log_2 S$;
# bf16 has float32's exponent range and loses nothing. The cost of the failure depends on the
# magnitudes, not on the precision: the same fp16 run with `GLOBAL_TOKENS = TOKENS` keeps up with
# float32.
#
# ### When the scale is too large: back-off and skipped steps
#
# The run above may never overflow (the line under the table says whether its scale moved), so the
# other half of dynamic scaling, backing off, has not been seen yet. Start instead from a scale far
# too large: the plain mean loss of each micro-batch (no share of a large batch, so gradients of the
# size of section 3's new task), $S = 2^{24}$, and `growth_interval = 4` so that growth shows within a
# short run. A step whose scaled gradients overflow fp16 becomes `inf` in the backward pass; your
# `GradScaler` skips it (weights and Adam state untouched: Adam's step count does not move) and halves
# $S$; after `growth_interval` clean steps in a row it doubles $S$ again, probing upwards, and backs off
# once more if that overflows.

# %%
BACKOFF_STEPS, BACKOFF_INIT, BACKOFF_INTERVAL = fast(24, 16), 2.0 ** 24, 4


def scale_history(steps=BACKOFF_STEPS, init_scale=BACKOFF_INIT, growth_interval=BACKOFF_INTERVAL):
    """fp16 + GradScaler on plain mean losses; per step: the scale before and after, and whether Adam stepped."""
    torch.manual_seed(0)
    model = load_pretrained()
    first = next(model.parameters())
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    scaler = GradScaler(init_scale=init_scale, growth_interval=growth_interval)
    rows = []
    for x, y in batches(target_train, MICRO_BATCH, steps, seed=0):
        before, taken = scaler.get_scale(), int(opt.state[first]["step"]) if opt.state else 0
        loss = mixed_precision_step(model, opt, scaler, x, y, lm_loss, torch.float16)
        stepped = (int(opt.state[first]["step"]) if opt.state else 0) > taken
        rows.append({"before": before, "after": scaler.get_scale(), "skipped": not stepped, "loss": loss})
    return rows


history = scale_history()
print(" step  scale before  scale after  Adam step  loss")
for i, r in enumerate(history):
    print(f"{i:5d}  {r['before']:12,.0f}  {r['after']:11,.0f}  {'skipped' if r['skipped'] else 'taken':>9}  "
          f"{r['loss']:.3f}")
skipped = [i for i, r in enumerate(history) if r["skipped"]]
grown = [i for i, r in enumerate(history) if r["after"] > r["before"]]
backed_off = [i for i, r in enumerate(history) if r["after"] < r["before"]]
display(Markdown(
    f"From $S = 2^{{{math.log2(BACKOFF_INIT):.0f}}}$: {len(skipped)} of {len(history)} steps skipped "
    f"(steps {', '.join(map(str, skipped)) or 'none'}), and the scale backed off at exactly those steps "
    f"({'yes' if skipped == backed_off else 'no'}). The first step taken ran at "
    + (f"$S = 2^{{{math.log2(history[min(set(range(len(history))) - set(skipped))]['before']):.0f}}}$"
       if len(skipped) < len(history) else "no scale in this run")
    + f"; the scale grew at steps {', '.join(map(str, grown)) or 'none'} and ended at "
    f"$2^{{{math.log2(history[-1]['after']):.0f}}}$."))

# %% [markdown]
# Each skipped step costs a batch and nothing else: the weights and Adam's moments are untouched, so a
# too-large initial scale only delays training by a few steps, one halving each. Gradients also
# change as training goes, so a later step can overflow at a scale that was fine before: it is
# skipped and halves the scale again. After `growth_interval` clean steps in a row the scale
# doubles, probing upwards, and a doubling that overflows is undone by the next skipped step (the
# table shows when this run's scale grew and which steps it skipped). With torch's default
# `growth_interval` of 2000 a probe comes only once every 2000 clean steps, so once the scale has
# settled, skipped steps are rare.
#
# ## 7. Play with it: choose the loss scale
#
# The histogram of $\log_2 |g|$ for the activation gradients of the pretrained task (blue) and of
# the new task (orange), moved by $\log_2 S$. Grey: fp16's subnormal range; red lines: $2^{-24}$
# (smallest subnormal), $2^{-14}$ (smallest normal), 65504 (largest). Everything left of $2^{-25}$
# becomes 0, everything right of 65504 becomes inf.

# %% tags=["demo"]
log_g = {t: kinds["activation"].abs().log2().numpy() for t, kinds in grads.items()}
bins = np.arange(-70, 40, 1.0)


def draw(ax, log2_scale=0):
    for (t, lg), color in zip(log_g.items(), ("#4c72b0", "#dd8452")):
        fate = fp16_fate(grads[t]["activation"], 2.0 ** log2_scale)
        ax.hist(lg + log2_scale, bins=bins, alpha=0.55, color=color,
                label=f"{t}: {fate['zero']:.1%} → 0, {fate['subnormal']:.1%} subnormal, {fate['inf']:.2%} → inf")
    ax.axvspan(-24, -14, color="#dddddd", zorder=0)
    for v in (-24, -14, math.log2(FP16_MAX)):
        ax.axvline(v, color="#c44e52", lw=1)
    ax.set(xlabel="log2 |g × S| (binary exponent of the scaled gradient)", ylabel="gradient entries (count)",
           title=f"S = $2^{{{log2_scale}}}$ (shaded: fp16 subnormals; red lines: subnormal, normal, max)")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.35)  # room for the legend above the histograms
    ax.legend(loc="upper left")


slider_plot(draw, figsize=(10, 4.6), log2_scale=(0, 32, 1),
            labels={"log2_scale": lambda v: f"loss scale S: 2^{v} = {2 ** v:,}"},
            explain={"log2_scale": "the loss is multiplied by S before backward, so every gradient is too"},
            notice={"log2_scale": lambda log2_scale: "; ".join(
                f"{t}: {fate['zero']:.1%} lost to 0, {fate['inf']:.2%} overflow"
                for t in grads for fate in [fp16_fate(grads[t]["activation"], 2.0 ** log2_scale)])})

# %% [markdown]
# ## 8. What the paper reports vs what we measured
#
# Micikevicius et al., *Mixed Precision Training* (ICLR 2018): float32 master weights, fp16
# forward and backward, loss scaling. Paper: about 5% of the weight gradients of a Mandarin speech
# model have exponents below $-24$ (zero in fp16); the Multibox SSD detector diverges without loss
# scaling and trains to float32 accuracy with a scale of 8; memory "nearly 2×" smaller.

# %%
pre_w = next(f for t, k, _, f in underflow_rows if t == "pretrained task" and k == "weight")
pre_a = next(f for t, k, _, f in underflow_rows if t == "pretrained task" and k == "activation")
final = {n: np.mean(h["loss"][-tail:]) for n, h in curves.items()}
ratio = act_bytes["float32"] / act_bytes["autocast fp16"]
table = [("weight gradients that are 0 in fp16 (unscaled)", "≈ 5% (speech model)",
          f"{pre_w[0]['zero']:.1%} (pretrained task), {fp16_fate(grads['new task']['weight'])['zero']:.1%} (new task)",
          5.0, 100 * pre_w[0]["zero"]),
         ("activation gradients that are 0 in fp16: S=1 → S=8", "SSD: S=8 suffices",
          f"{pre_a[0]['zero']:.1%} → {pre_a[3]['zero']:.1%} (S=2^16: {pre_a[16]['zero']:.1%})",
          float("nan"), 100 * pre_a[3]["zero"]),
         ("final loss, fp16 + scaling / float32", "matches float32",
          f"{final['fp16 + GradScaler']:.4f} / {final['float32']:.4f}", 1.0,
          final["fp16 + GradScaler"] / final["float32"]),
         ("fp16 without loss scaling", "SSD diverges",
          f"final loss {final['fp16, no scaler'] / final['float32']:.1f}× float32's, "
          f"{zeros['fp16, no scaler']:.0%} of gradient entries 0 (2^21-token batch)", None, None),
         ("memory saved for backward, float32 / fp16", "nearly 2×", f"{ratio:.2f}× (activations only)", 2.0, ratio)]
literature_table(table, source="Micikevicius et al. 2018")
fig, ax = plt.subplots(figsize=(7, 3))
paired_bars(ax, ["fp16 loss /\nfloat32 loss", "memory\nfloat32 / fp16"], [1.0, 2.0], [table[2][4], table[4][4]],
            source="paper")
ax.set_ylabel("ratio (×)")
fig.tight_layout()
plt.show()

# %%
display(Markdown(
    f"The mechanism reproduces: {pre_a[0]['zero']:.0%} of the activation gradients of a model that fits its data "
    "round to 0 in fp16, and a loss scale brings them back. The scale needed differs: the paper's SSD needed 8, while our converged model's "
    f"activation gradients sit so low (median $2^{{{pre_med:.0f}}}$) that $S = 8$ still loses {pre_a[3]['zero']:.0%} "
    f"of them ($2^{{10}}$: {pre_a[10]['zero']:.0%}, $2^{{16}}$: {pre_a[16]['zero']:.1%}), which is why dynamic "
    "scaling, starting high and backing off, is the default. Without scaling, training on small-magnitude losses "
    f"stalls ({final['fp16, no scaler'] / final['float32']:.1f}× float32's final loss here) rather than diverging "
    "as the paper's SSD did; with the scaler, fp16 matches float32 "
    f"({final['fp16 + GradScaler'] / final['float32']:.2f}×), and so does bf16 without one. The memory saving is "
    f"{ratio:.2f}×, not the paper's 2×: in a 64-wide model much of what is saved comes from float32 ops (LayerNorm, the loss), "
    "and the paper's 2× also counts weights and activations stored in fp16 throughout (we keep float32 master "
    "weights and let autocast decide per op)."))

# %% [markdown]
# ## 9. Summary
#
# - fp16 has 10 mantissa bits and a range of $2^{-24}$ … 65504; bf16 has 7 mantissa bits and
#   float32's range. Updates smaller than $2^{-11}$ of a weight vanish in fp16: keep float32 master
#   weights and let autocast make half-precision copies for the forward pass.
# - Autocast runs matmuls in half precision and losses in float32, per op; on the CPU the other ops
#   follow their inputs.
# - Small gradients flush to zero in an fp16 backward; multiplying the loss by $S$ shifts them up by
#   $\log_2 S$. Dynamic loss scaling finds $S$: skip the step and back off on inf/NaN, grow after a run
#   of clean steps, unscale exactly once. The update is never scaled: the optimizer sees unscaled
#   gradients.
# - Where gradients are small (a micro-batch's share of a large batch's loss), fp16 without a
#   scaler loses gradient entries to underflow and its training stalls; with the scaler it trains
#   like float32.
# - bf16 needs no scaler. Activation memory drops, but by less than 2× when float32 ops save their
#   inputs.
