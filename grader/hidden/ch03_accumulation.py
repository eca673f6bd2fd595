"""Hidden tests of ch03_accumulation: ``accumulate_gradients`` and ``train_accumulated``.

The references are plain autograd in float64, computed here from copies of the models sent to the
student's process. Nothing the student's process reports decides: every model sent there is a
``probes.ch03_MicroBatchModel``, which adds ``pos[i]`` to the i-th sample of each forward call and
refuses calls on more than ``micro_batch_size`` samples. Forwarding the whole batch therefore
raises, and the gradient of ``pos`` (rows summed over the micro-batches ``inputs[0:m]``,
``inputs[m:2m]``, ...) is compared with the judge's own. Gradients and values are read from the
parameter tensors the judge sent (``probes.tensor_states``), not through the model's methods, so a
replaced attribute or a shadowed ``named_parameters`` changes nothing. Batch sizes are awkward on
purpose (B = 37 with micro-batches of 8: the last one holds 5 samples).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from coursekit.checks import check_close, same_close
from grader import probes
from grader.api import fetch, hidden_test
from grader.sandbox.rpc import StudentError

B, D_IN, D_OUT = 37, 13, 7
# float32 accumulation over micro-batches vs a float64 full-batch reference: rounding is ~1e-7;
# every mistake we look for (a weight of 1/k instead of size/B, one micro-batch lost) is ~1e-2.
TOL = dict(atol=1e-5, rtol=1e-4)
WEIGHT_HINT = ("weight each micro-batch's mean loss by its size / B before backward: the full-batch mean is "
               "sum_i (n_i / B) * mean_i, and the last micro-batch may be smaller")
SPLIT_HINT = ("forward at most micro_batch_size samples at a time (slices inputs[i:i + micro_batch_size]) and "
              "forward every sample exactly once")


def _model(kind: str, seed: int, micro_batch_size: int) -> probes.ch03_MicroBatchModel:
    """An MLP (or one with a frozen first layer) behind a per-position term that takes at most
    ``micro_batch_size`` samples per call."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if kind == "mlp":
            model = nn.Sequential(nn.Linear(D_IN, 19), nn.Tanh(), nn.Linear(19, D_OUT))
        else:
            model = nn.Sequential(nn.Linear(D_IN, 17), nn.ReLU(), nn.LayerNorm(17), nn.Linear(17, D_OUT))
            model[0].requires_grad_(False)  # a frozen first layer: it must get no gradient
    return probes.ch03_MicroBatchModel(model, micro_batch_size, D_IN, seed=1000 + seed)


def _send(nb, model: nn.Module):
    """(model, its parameter tensors) in the student's process, one message, so that the tensors are
    the model's own; a copy, since local runs share objects."""
    model = copy.deepcopy(model)
    return nb.put((model, list(model.parameters())))


def _read(nb, model: nn.Module, tensors) -> dict[str, dict]:
    """The judge's parameter tensors as they are now, by the names they had when sent."""
    names = [n for n, _ in model.named_parameters()]
    return dict(zip(names, fetch(nb.apply(probes.tensor_states, tensors))))


def _call(fn, *args, what: str):
    """Call the student's function; the model refusing a call of too many samples is a failed check."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - the model's refusal, locally or as a StudentError
        message = e.message if isinstance(e, StudentError) else str(e)
        if "samples at once" not in message:
            raise
        raise AssertionError(f"{what}: {message}. Activation memory grows with the samples in one forward: "
                             f"{SPLIT_HINT}") from None


def _chunks(n: int, m: int, drop_last: bool = False) -> list[tuple[int, int, float]]:
    """(start, stop, n_i / n) of the micro-batches inputs[0:m], inputs[m:2m], ..."""
    starts = list(range(0, n, m))
    starts = starts[:-1] if drop_last and len(starts) > 1 and n % m else starts
    return [(a, min(a + m, n), (min(a + m, n) - a) / n) for a in starts]


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


def _accumulated(model, loss_fn, x, y, m: int):
    """The full-batch mean loss and its gradient, as sum_i (n_i / B) * mean_i over the micro-batches
    (the model takes no more than m samples per call)."""
    return _weighted_grads(model, loss_fn, x, y, _chunks(len(x), m))


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
        "dropped": (_chunks(n, m, drop_last=True),
                    f"the last micro-batch (samples {starts[-1]} to {n - 1}) is missing from the gradient: "
                    f"{SPLIT_HINT}"),
    }
    for chunks, hint in wrong.values():
        ref, _ = _weighted_grads(model, loss_fn, x, y, chunks)
        if all(same_close(got[k].double(), ref[k].double(), **TOL) for k in ref if got.get(k) is not None):
            return hint
    return WEIGHT_HINT


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
        model = _model(kind, seed, m)
        x, y = _data(loss_fn, B, 10 + seed)
        what = f"{kind} model, {type(loss_fn).__name__}, B={B}, micro_batch_size={m}"
        sent = _send(nb, model)
        before = _read(nb, model, sent[1])
        out = _call(nb.accumulate_gradients, sent[0], loss_fn, x, y, m, what=what)
        desc = fetch(nb.apply(probes.ch03_describe, out))
        table = _read(nb, model, sent[1])
        ref, ref_loss = _accumulated(model, loss_fn, x, y, m)

        for name, p in model.named_parameters():
            row = table[name]
            check_close(row["value"], before[name]["value"], f"{what}: parameter {name}",
                        "accumulate_gradients only fills .grad: the optimizer step belongs to the training loop",
                        atol=0, rtol=0)
            if not p.requires_grad and (row["grad"] is not None or row["requires_grad"]):
                raise AssertionError(f"{what}: the frozen parameter {name} (requires_grad=False) received a .grad: "
                                     "only trainable parameters get gradients; let backward() fill them")
        got = {n: table[n]["grad"] for n in ref}
        for name, g in got.items():
            if g is None:
                raise AssertionError(f"{what}: the trainable parameter {name} has no .grad after "
                                     f"accumulate_gradients: call backward() on every micro-batch's weighted loss, "
                                     f"through the model you are given. {SPLIT_HINT}")
        hint = None
        for name in ref:
            if not same_close(got[name].double(), ref[name].double(), **TOL):
                hint = hint or _diagnose(model, loss_fn, x, y, m, got)
                check_close(got[name], ref[name], f"{what}: the gradient of {name}", hint, **TOL)
        _check_loss_value(desc, ref_loss, f"{what}: the returned loss")

    for bad in (0, -3):
        x, y = _data(nn.MSELoss(), B, 0)
        names = fetch(nb.apply(probes.raised, nb.accumulate_gradients, _model("mlp", 0, 8), nn.MSELoss(), x, y, bad))
        if names is None or "ValueError" not in names:
            raise AssertionError(f"accumulate_gradients(..., micro_batch_size={bad}) should raise ValueError "
                                 "(the docstring asks for a positive integer)")


def _reference_training(model, loss_fn, loader, steps: int, lr: float, momentum: float, micro: int):
    """``steps`` full-batch SGD steps (PyTorch's momentum rule), float64, cycling through ``loader``; the
    full-batch loss is sum_i (n_i / B) * mean_i, since the model takes at most ``micro`` samples per call."""
    m = copy.deepcopy(model).double()
    params = [p for p in m.parameters() if p.requires_grad]
    velocity = [torch.zeros_like(p) for p in params]
    losses = []
    for step in range(steps):
        x, y = loader[step % len(loader)]
        x, y = x.double(), (y if y.dtype == torch.long else y.double())
        loss = sum(w * loss_fn(m(x[a:b]), y[a:b]) for a, b, w in _chunks(len(x), micro))
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
        model = _model(kind, seed, m)
        loader = [_data(loss_fn, n, 20 + 7 * seed + i) for i, n in enumerate(batch_sizes)]
        what = (f"{kind} model, {type(loss_fn).__name__}, batches of {list(batch_sizes)}, micro_batch_size={m}, "
                f"steps={steps}, SGD(lr={lr}, momentum={momentum})")
        copied = copy.deepcopy(model)  # one message: the optimizer keeps pointing at this model's parameters
        opt = torch.optim.SGD([p for p in copied.parameters() if p.requires_grad], lr=lr, momentum=momentum)
        sent = nb.put((copied, opt, list(copied.parameters())))
        out = _call(nb.train_accumulated, sent[0], sent[1], loss_fn, loader, m, steps, what=what)
        losses = fetch(out)
        table = _read(nb, model, sent[2])
        ref_model, ref_losses = _reference_training(model, loss_fn, loader, steps, lr, momentum, m)

        if not isinstance(losses, list):
            raise AssertionError(f"{what}: train_accumulated returned a {type(losses).__name__}, expected a list "
                                 "of floats (one per step)")
        if len(losses) != steps:
            raise AssertionError(f"{what}: {len(losses)} losses for steps={steps}. Take one batch per step and "
                                 f"start the loader again when it runs out (this one has {len(loader)} batches)")
        if not all(isinstance(v, float) for v in losses):
            kinds = sorted({type(v).__name__ for v in losses})
            raise AssertionError(f"{what}: the losses are {kinds}, expected Python floats (loss.item() or float(loss))")
        check_close(torch.tensor(losses[:1]), torch.tensor(ref_losses[:1]), f"{what}: the loss of step 1",
                    "each step's loss is the full-batch mean loss returned by accumulate_gradients, before the "
                    "optimizer step", **TOL)
        check_close(torch.tensor(losses), torch.tensor(ref_losses), f"{what}: the losses",
                    "step 1 is right but later steps are not: zero the gradients before every batch (.grad keeps "
                    "adding up across batches otherwise) and call optimizer.step() once per batch", **TOL)
        ref_params = dict(ref_model.named_parameters())
        for name, p in model.named_parameters():
            got = table[name]["value"]
            if not p.requires_grad:
                check_close(got, p.detach(), f"{what}: the frozen parameter {name}",
                            "frozen parameters must not change", atol=0, rtol=0)
                continue
            check_close(got, ref_params[name].detach(), f"{what}: parameter {name} after {steps} steps",
                        "N steps with accumulation must equal N full-batch SGD steps: per batch, zero the "
                        "gradients, accumulate over its micro-batches, then call optimizer.step() once", **TOL)
