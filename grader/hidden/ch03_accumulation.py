"""Hidden tests of ch03_accumulation: ``accumulate_gradients`` and ``train_accumulated``.

The references are plain autograd on the *whole* batch, in float64, computed here from copies of
the models sent to the student's process. What the student's code forwards is observed with
``probes.ch03_BatchSizeRecorder``, a wrapper that records the batch size of every forward call.
Batch sizes are awkward on purpose (B = 37 with micro-batches of 8: the last one holds 5 samples).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from coursekit.checks import check_close, check_equal
from grader import probes
from grader.api import fetch, hidden_test

B, D_IN, D_OUT = 37, 13, 7
# float32 accumulation over micro-batches vs a float64 full-batch reference: rounding is ~1e-7;
# every mistake we look for (a weight of 1/k instead of size/B, one micro-batch lost) is ~1e-2.
TOL = dict(atol=1e-5, rtol=1e-4)
WEIGHT_HINT = ("weight each micro-batch's mean loss by its size / B before backward: the full-batch mean is "
               "sum_i (n_i / B) * mean_i, and the last micro-batch may be smaller")
SPLIT_HINT = ("forward at most micro_batch_size samples at a time (slices inputs[i:i + micro_batch_size]) and "
              "forward every sample exactly once")


def _model(kind: str, seed: int) -> nn.Sequential:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if kind == "mlp":
            return nn.Sequential(nn.Linear(D_IN, 19), nn.Tanh(), nn.Linear(19, D_OUT))
        model = nn.Sequential(nn.Linear(D_IN, 17), nn.ReLU(), nn.LayerNorm(17), nn.Linear(17, D_OUT))
        model[0].requires_grad_(False)  # a frozen first layer: it must get no gradient
        return model


def _data(loss_fn: nn.Module, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D_IN, generator=g)
    if isinstance(loss_fn, nn.CrossEntropyLoss):
        return x, torch.randint(0, D_OUT, (n,), generator=g)
    return x, torch.randn(n, D_OUT, generator=g)


def _weighted_grads(model: nn.Module, loss_fn, x, y, chunks: list[tuple[int, int, float]]) -> tuple[dict, float]:
    """sum over (start, stop, weight) of weight * loss(x[start:stop]), differentiated in float64."""
    m = copy.deepcopy(model).double()
    names = [n for n, p in m.named_parameters() if p.requires_grad]
    x = x.double()
    y = y if y.dtype == torch.long else y.double()
    loss = sum(w * loss_fn(m(x[a:b]), y[a:b]) for a, b, w in chunks)
    grads = torch.autograd.grad(loss, [p for p in m.parameters() if p.requires_grad])
    return {n: g.float() for n, g in zip(names, grads)}, float(loss.detach())


def _full_batch(model, loss_fn, x, y):
    return _weighted_grads(model, loss_fn, x, y, [(0, len(x), 1.0)])


def _diagnose(model, loss_fn, x, y, m: int, got: dict) -> str:
    """Name the mistake when the gradients match a known wrong recipe."""
    n = len(x)
    starts = list(range(0, n, m))
    wrong = {
        "equal": ([(a, min(a + m, n), 1.0 / len(starts)) for a in starts],
                  "micro-batch losses were averaged with equal weights 1/k, but the last micro-batch holds "
                  f"only {n - starts[-1]} samples: {WEIGHT_HINT}"),
        "sum": ([(a, min(a + m, n), 1.0) for a in starts],
                "the gradient is k times too large: micro-batch mean losses were summed without weights. "
                + WEIGHT_HINT),
        "last": ([(starts[-1], n, (n - starts[-1]) / n)],
                 "only the last micro-batch's gradient is left: .grad accumulates across backward() calls, so "
                 "do not zero it (or overwrite it) between micro-batches"),
    }
    for chunks, hint in wrong.values():
        ref, _ = _weighted_grads(model, loss_fn, x, y, chunks)
        if all(torch.allclose(got[k].double(), ref[k].double(), **TOL) for k in ref if got.get(k) is not None):
            return hint
    return WEIGHT_HINT


def _check_sizes(sizes, expected_total: int, m: int, what: str) -> None:
    if not sizes:
        raise AssertionError(f"{what}: the model was never called. {SPLIT_HINT}")
    if max(sizes) > m:
        raise AssertionError(f"{what}: the model was called on {max(sizes)} samples at once with "
                             f"micro_batch_size={m} (batch sizes seen: {sizes}). Activation memory grows with "
                             f"the samples in one forward: {SPLIT_HINT}")
    check_equal(sum(sizes), expected_total, f"{what}: the number of samples forwarded", SPLIT_HINT)


def _check_loss_value(desc: dict, expected: float, what: str) -> None:
    if desc["type"] != "Tensor":
        raise AssertionError(f"{what} is a {desc['type']}, expected a scalar tensor (0-dim), detached")
    if desc["shape"] != []:
        raise AssertionError(f"{what} has shape {desc['shape']}, expected a scalar (0-dim) tensor")
    if desc["requires_grad"] or desc["has_grad_fn"]:
        raise AssertionError(f"{what} is still attached to the autograd graph: return the weighted sum of "
                             "loss.detach() values, so that no graph (and none of its activations) is kept alive")
    check_close(desc["value"].double(), torch.tensor(expected, dtype=torch.float64), what,
                "return the full-batch mean loss, sum_i (n_i / B) * mean_i (not the sum of the micro-batch "
                "losses, nor their plain average)", **TOL)


@hidden_test("test_accumulate_gradients")
def check_accumulate_gradients(nb):
    cases = [  # (model, loss, micro_batch_size, seed): B = 37 is never a multiple of the micro-batch
        ("mlp", nn.MSELoss(), 8, 1),
        ("frozen", nn.CrossEntropyLoss(), 8, 2),
        ("mlp", nn.CrossEntropyLoss(), 5, 3),
        ("frozen", nn.MSELoss(), 36, 4),
        ("mlp", nn.MSELoss(), B, 5),  # micro_batch_size == B: one forward of the whole batch
        ("mlp", nn.CrossEntropyLoss(), 64, 6),  # micro_batch_size > B: one forward of B samples
    ]
    for kind, loss_fn, m, seed in cases:
        model = _model(kind, seed)
        x, y = _data(loss_fn, B, 10 + seed)
        what = f"{kind} model, {type(loss_fn).__name__}, B={B}, micro_batch_size={m}"
        rec = nb.put(probes.ch03_BatchSizeRecorder(copy.deepcopy(model)))  # a copy: local runs share objects
        out = nb.accumulate_gradients(rec, loss_fn, x, y, m)
        desc = fetch(nb.apply(probes.ch03_describe, out))
        sizes = fetch(rec.sizes)
        table = fetch(nb.apply(probes.param_table, rec))
        ref, ref_loss = _full_batch(model, loss_fn, x, y)

        _check_sizes(sizes, B, m, what)
        for name, p in model.named_parameters():
            row = table[f"model.{name}"]
            check_close(row["value"], p.detach(), f"{what}: parameter {name}",
                        "accumulate_gradients only fills .grad: the optimizer step belongs to the training loop",
                        atol=0, rtol=0)
            if not p.requires_grad and row["grad"] is not None:
                raise AssertionError(f"{what}: the frozen parameter {name} (requires_grad=False) received a .grad: "
                                     "only trainable parameters get gradients; let backward() fill them")
        got = {n: table[f"model.{n}"]["grad"] for n in ref}
        for name, g in got.items():
            if g is None:
                raise AssertionError(f"{what}: the trainable parameter {name} has no .grad after "
                                     "accumulate_gradients: call backward() on every micro-batch's weighted loss")
        hint = None
        for name in ref:
            if not torch.allclose(got[name].double(), ref[name].double(), **TOL):
                hint = hint or _diagnose(model, loss_fn, x, y, m, got)
                check_close(got[name], ref[name], f"{what}: the gradient of {name}", hint, **TOL)
        _check_loss_value(desc, ref_loss, f"{what}: the returned loss")

    for bad in (0, -3):
        x, y = _data(nn.MSELoss(), B, 0)
        names = fetch(nb.apply(probes.raised, nb.accumulate_gradients, _model("mlp", 0), nn.MSELoss(), x, y, bad))
        if names is None or "ValueError" not in names:
            raise AssertionError(f"accumulate_gradients(..., micro_batch_size={bad}) should raise ValueError "
                                 "(the docstring asks for a positive integer)")


def _reference_training(model, loss_fn, loader, steps: int, lr: float, momentum: float):
    """``steps`` full-batch SGD steps (PyTorch's momentum rule), float64, cycling through ``loader``."""
    m = copy.deepcopy(model).double()
    params = [p for p in m.parameters() if p.requires_grad]
    velocity = [torch.zeros_like(p) for p in params]
    losses = []
    for step in range(steps):
        x, y = loader[step % len(loader)]
        y = y if y.dtype == torch.long else y.double()
        loss = loss_fn(m(x.double()), y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, v, g in zip(params, velocity, grads):
                v.mul_(momentum).add_(g)
                p.sub_(lr * v)
        losses.append(float(loss.detach()))
    return m.float(), losses


@hidden_test("test_train_accumulated")
def check_train_accumulated(nb):
    cases = [  # (model, loss, batch sizes in the loader, micro_batch_size, steps, lr, momentum, seed)
        ("mlp", nn.MSELoss(), (B, B, 23), 8, 5, 0.1, 0.0, 1),  # 5 steps from 3 batches: cycle
        ("frozen", nn.CrossEntropyLoss(), (B, 29), 10, 4, 0.2, 0.9, 2),
    ]
    for kind, loss_fn, batch_sizes, m, steps, lr, momentum, seed in cases:
        model = _model(kind, seed)
        loader = [_data(loss_fn, n, 20 + 7 * seed + i) for i, n in enumerate(batch_sizes)]
        what = (f"{kind} model, {type(loss_fn).__name__}, batches of {list(batch_sizes)}, micro_batch_size={m}, "
                f"steps={steps}, SGD(lr={lr}, momentum={momentum})")
        rec = probes.ch03_BatchSizeRecorder(copy.deepcopy(model))  # a copy: local runs share objects
        opt = torch.optim.SGD([p for p in rec.parameters() if p.requires_grad], lr=lr, momentum=momentum)
        pair = nb.put((rec, opt))  # one message: the optimizer keeps pointing at this model's parameters
        out = nb.train_accumulated(pair[0], pair[1], loss_fn, loader, m, steps)
        losses = fetch(out)
        sizes = fetch(pair[0].sizes)
        table = fetch(nb.apply(probes.param_table, pair[0]))
        ref_model, ref_losses = _reference_training(model, loss_fn, loader, steps, lr, momentum)

        if not isinstance(losses, list):
            raise AssertionError(f"{what}: train_accumulated returned a {type(losses).__name__}, expected a list "
                                 "of floats (one per step)")
        if len(losses) != steps:
            raise AssertionError(f"{what}: {len(losses)} losses for steps={steps}. Take one batch per step and "
                                 f"start the loader again when it runs out (this one has {len(loader)} batches)")
        if not all(isinstance(v, float) for v in losses):
            kinds = sorted({type(v).__name__ for v in losses})
            raise AssertionError(f"{what}: the losses are {kinds}, expected Python floats (loss.item() or float(loss))")
        expected_total = sum(len(loader[s % len(loader)][0]) for s in range(steps))
        _check_sizes(sizes, expected_total, m, what)
        check_close(torch.tensor(losses[:1]), torch.tensor(ref_losses[:1]), f"{what}: the loss of step 1",
                    "each step's loss is the full-batch mean loss returned by accumulate_gradients, before the "
                    "optimizer step", **TOL)
        check_close(torch.tensor(losses), torch.tensor(ref_losses), f"{what}: the losses",
                    "step 1 is right but later steps are not: zero the gradients before every batch (.grad keeps "
                    "adding up across batches otherwise) and call optimizer.step() once per batch", **TOL)
        ref_params = dict(ref_model.named_parameters())
        for name, p in model.named_parameters():
            got = table[f"model.{name}"]["value"]
            if not p.requires_grad:
                check_close(got, p.detach(), f"{what}: the frozen parameter {name}",
                            "frozen parameters must not change", atol=0, rtol=0)
                continue
            check_close(got, ref_params[name].detach(), f"{what}: parameter {name} after {steps} steps",
                        "N steps with accumulation must equal N full-batch SGD steps: per batch, zero the "
                        "gradients, accumulate over its micro-batches, then call optimizer.step() once", **TOL)
