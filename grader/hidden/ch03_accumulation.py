"""Hidden tests of ch03_accumulation: ``accumulate_gradients`` and ``train_accumulated``, one graded
cell per property.

The references are plain autograd in float64, computed here from copies of the models sent to the
student's process. Gradients and values are read from the parameter tensors the judge sent
(``probes.tensor_states``), not through the model's methods, so a replaced attribute or a shadowed
``named_parameters`` changes nothing. Batch sizes are awkward on purpose (B = 37 with micro-batches
of 8: the last one holds 5 samples), and the values cells also draw larger ones at grading time.

accumulate_gradients:
- values (``test_accumulate_gradients``): the gradient of the full-batch mean loss on plain models
  (an MLP, and one whose first Linear is frozen), MSE and cross-entropy, micro-batches of 5, 8 and 36;
  frozen parameters get no ``.grad`` and no parameter changes. A wrong gradient is matched against the
  known wrong recipes (equal weights 1/k, unweighted sums, weights n_i instead of n_i / B, only the last
  micro-batch, the last micro-batch dropped) to name the one that was made. Two more cases are drawn at
  grading time (sizes and seeds), B never a multiple of m and the last micro-batch's targets offset by
  ``LAST_OFFSET`` (every weighting mistake then differs from the reference by 40 times the tolerance or
  more): the frozen model, MSE, B 100-1000 with m 5-64, and a Linear(16, 64)-Tanh-Linear(64, 1) MLP, MSE,
  at the memory cell's measured sizes (B 768-1000, m 8-24). The memory cell accepts weighting mistakes,
  so a mistake made only on large batches must cost this cell, whatever size it switches at.
- memory: every model sent is a ``probes.ch03_MicroBatchModel``, which adds ``pos[i]`` to the i-th
  sample of each forward call and refuses calls on more than ``micro_batch_size`` samples. Forwarding
  the whole batch therefore raises, and the gradient of ``pos`` (rows summed over the micro-batches
  ``inputs[0:m]``, ``inputs[m:2m]``, ...) must be that of exactly those slices: it is compared with the
  judge's own, computed with the right weights and with each known wrong weighting (a weighting
  mistake costs the values cell, not this one). Then the point is decided from outside the student's
  process (``grader.resources.Meter``): one call on a Linear(16, 16384)-Tanh-Linear(16384, 1) MLP, the
  batch (768 to 1000 samples), the micro-batch size (8 to 24) and every seed drawn at grading time, the
  model and the batch the judge's own (booked at their known size). What the process reaches during the
  call must stay under a quarter of the whole batch's activations (one micro-batch's are 1/32 to 1/125
  of them; summing the micro-batch losses before one ``backward()`` keeps them all, about 4 times the
  allowance, and no ballast can hide more than 5 MiB of it), and the gradients that very call leaves in
  the judge's model must be the judge's float64 full-batch gradient on the same seeded batch (or that of
  a known weighting mistake, which the values cell grades), so code that behaves differently when it is
  measured fails where it does. The wide model uses Tanh, whose gradient has no jump: float32 and
  float64 agree on every sample.
- loss: a 0-dim tensor, detached, equal to the full-batch mean loss (sums, plain averages and B times
  the mean are named), on B = 37 and on the values cell's two drawn cases (drawn anew).
- edge cases: micro_batch_size >= B (one forward of the whole batch), and ``ValueError`` for 0, -3 and
  2.5.

train_accumulated:
- values (``test_train_accumulated``): losses and parameters after a few steps equal the same number of
  full-batch SGD steps (with and without momentum) computed here in float64, on plain models, with no
  more steps than batches; frozen parameters unchanged. A mismatch is matched against simulated
  mistakes (never zeroing, zeroing per micro-batch, stepping per micro-batch, no effective step) to
  name the one that was made. Two more cases are drawn at grading time, as for ``accumulate_gradients``
  (the memory cell accepts known wrong loops): two steps (lr 0.1, momentum 0.9) of the frozen model on
  two batches of 100-1000 samples, m 5-64, and one step (lr 0.1) of the narrow MLP at the memory cell's
  sizes; every known wrong loop but never zeroing (the same as the right one for one step from zero
  gradients) differs from the reference by 100 times the tolerance or more.
- memory: one step on a ``probes.ch03_MicroBatchModel``: the batch must go through micro-batches of
  ``micro_batch_size`` (exactly the slices: the updated ``pos`` shows it). Then, decided from outside the
  process as for ``accumulate_gradients``: one step (``torch.optim.SGD``, lr 0.02, no momentum) on the
  wide MLP with its first layer scaled down (so that every known wrong loop stays stable and
  distinguishable), batch, micro-batch size and seeds drawn at grading time; the process must stay under
  a quarter of the whole batch's activations during the call, and each parameter's update by that very
  step must be the judge's (or that of a known wrong loop on the right micro-batches, which the values
  cell grades) to a thousandth of its largest entry plus float32 rounding. ``probes.ch03_prime`` runs the
  optimizer once before any student code, so that its lazily loaded code is not read as the student's.
- edge cases: a loader that runs out starts again (a list, and ``probes.ch03_Batches``, a re-iterable
  without ``len`` or indexing, like a ``DataLoader``); the losses are Python floats; ``steps=0`` returns
  ``[]`` and changes nothing; an empty loader raises ``ValueError``.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from coursekit.checks import check_close, same_close, same_values
from grader import probes
from grader.api import fetch, hidden_test
from grader.resources import Meter, draw, fresh_tensor, mib, new_seed, seeded
from grader.sandbox.rpc import StudentError
from grader.source_policy import Shortcut, SourcePolicy

SOURCE_POLICY = SourcePolicy(shortcuts=(
    Shortcut(paths=("coursekit.capstone",),
             instead="write it yourself; coursekit.capstone (chapter 16's reference fine-tune) holds "
                     "the course's own accumulating training step"),
))

B, D_IN, D_OUT = 37, 13, 7
# float32 accumulation over micro-batches vs a float64 full-batch reference: rounding is ~1e-7;
# every mistake we look for (a weight of 1/k instead of size/B, one micro-batch lost) is ~1e-2.
TOL = dict(atol=1e-5, rtol=1e-4)
WEIGHT_HINT = ("weight each micro-batch's mean loss by its size / B before backward: the full-batch mean is "
               "sum_i (n_i / B) * mean_i, and the last micro-batch may be smaller")
SPLIT_HINT = ("forward at most micro_batch_size samples at a time, exactly the slices inputs[0:m], inputs[m:2m], "
              "... (the last one may be smaller), and forward every sample exactly once")
BACKWARD_HINT = ("call backward() on each micro-batch's weighted loss right after its forward: summing the "
                 "micro-batch losses (with their graphs) and calling backward() once keeps every micro-batch's "
                 "activations alive at the same time, as much as one forward of the whole batch")
LOSS_HINT = "return the full-batch mean loss, sum_i (n_i / B) * mean_i, as a detached 0-dim tensor"
ZERO_HINT = ("the gradients were never zeroed: .grad kept adding up across batches, so each step used the sum of "
             "every gradient so far. Call optimizer.zero_grad() once per batch, before accumulate_gradients")
ZERO_MICRO_HINT = ("only the last micro-batch of each batch moved the weights: the gradients were zeroed per "
                   "micro-batch. Zero them once per batch, before its first micro-batch, not per micro-batch: "
                   "backward() must add every micro-batch's gradient into .grad")
STEP_MICRO_HINT = ("the weights moved once per micro-batch: call optimizer.step() once per batch, after all of its "
                   "micro-batches have added their gradients (accumulate_gradients, then step)")
NO_STEP_HINT = ("the parameters did not change: call optimizer.step() once per batch, after accumulate_gradients, "
                "and do not zero the gradients between accumulate_gradients and the step")
TRAIN_HINT = ("N steps with accumulation must equal N full-batch SGD steps: per batch, zero the gradients once, "
              "accumulate_gradients over its micro-batches, then call optimizer.step() once")
CYCLE_HINT = ("one batch per step, in the loader's order; when the loader runs out, start it again from its first "
              "batch (iter(loader) anew, a new epoch), so the batches taken are 0, 1, 2, 0, 1, ...")


# --- models and data ---------------------------------------------------------------------------------
def _plain(kind: str, seed: int) -> nn.Sequential:
    """An MLP, or one whose first Linear is frozen (then ReLU, LayerNorm, Linear): any call size."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if kind == "mlp":
            return nn.Sequential(nn.Linear(D_IN, 19), nn.Tanh(), nn.Linear(19, D_OUT))
        model = nn.Sequential(nn.Linear(D_IN, 17), nn.ReLU(), nn.LayerNorm(17), nn.Linear(17, D_OUT))
        model[0].requires_grad_(False)  # a frozen first layer: it must get no gradient
        return model


def _model(kind: str, seed: int, micro_batch_size: int) -> probes.ch03_MicroBatchModel:
    """The plain model behind a per-position term that takes at most ``micro_batch_size`` samples per call."""
    return probes.ch03_MicroBatchModel(_plain(kind, seed), micro_batch_size, D_IN, seed=1000 + seed)


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


def _chunks(n: int, m: int) -> list[tuple[int, int, float]]:
    """(start, stop, n_i / n) of the micro-batches inputs[0:m], inputs[m:2m], ..."""
    return [(a, min(a + m, n), (min(a + m, n) - a) / n) for a in range(0, n, m)]


def _data(loss_fn: nn.Module, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D_IN, generator=g)
    if isinstance(loss_fn, nn.CrossEntropyLoss):
        return x, torch.randint(0, D_OUT, (n,), generator=g)
    return x, torch.randn(n, D_OUT, generator=g)


def _what(kind: str, loss_fn: nn.Module, m: int, n: int = B) -> str:
    return f"{kind} model, {type(loss_fn).__name__}, B={n}, micro_batch_size={m}"


# --- accumulate_gradients: references and known mistakes ---------------------------------------------
def _weighted(model: nn.Module, loss_fn, x, y, chunks: list[tuple[int, int, float]]) -> tuple[dict, float]:
    """sum over (start, stop, weight) of weight * loss(x[start:stop]): its gradients (float32) and value,
    differentiated in float64."""
    m = copy.deepcopy(model).double()
    names = [n for n, p in m.named_parameters() if p.requires_grad]
    params = [p for p in m.parameters() if p.requires_grad]
    x = x.double()
    y = y if y.dtype == torch.long else y.double()
    grads, value = [torch.zeros_like(p) for p in params], 0.0
    for a, b, w in chunks:  # one graph at a time: the sum of the weighted losses' gradients
        loss = w * loss_fn(m(x[a:b]), y[a:b])
        for g, d in zip(grads, torch.autograd.grad(loss, params)):
            g.add_(d)
        value += float(loss.detach())
    return {n: g.float() for n, g in zip(names, grads)}, value


def _mistakes(n: int, m: int) -> dict[str, list[tuple[int, int, float]]]:
    """Hint -> the weighted micro-batches of a known wrong recipe (exact slices, wrong weights)."""
    chunks = _chunks(n, m)
    k, last = len(chunks), chunks[-1][1] - chunks[-1][0]
    wrong = {
        f"micro-batch losses were averaged with equal weights 1/k, but the last micro-batch holds only {last} "
        f"samples: {WEIGHT_HINT}": [(a, b, 1.0 / k) for a, b, _ in chunks],
        "the gradient is k times too large: micro-batch mean losses were summed without weights. "
        + WEIGHT_HINT: [(a, b, 1.0) for a, b, _ in chunks],
        f"the gradient is B = {n} times too large: each micro-batch's mean loss was weighted by its size n_i, "
        "not by n_i / B. " + WEIGHT_HINT: [(a, b, float(b - a)) for a, b, _ in chunks],
        "only the last micro-batch's gradient is left: .grad accumulates across backward() calls, so do not zero "
        "it (or overwrite it) between micro-batches": [chunks[-1]],
    }
    if k > 1 and n % m:
        wrong[f"the last micro-batch (samples {chunks[-1][0]} to {n - 1}) is missing from the gradient: "
              f"{SPLIT_HINT}"] = chunks[:-1]
    return wrong


def _matches(got: dict, ref: dict) -> bool:
    return all(got.get(k) is not None and same_close(got[k].double(), ref[k].double(), **TOL) for k in ref)


def _diagnose(model, loss_fn, x, y, m: int, got: dict) -> str:
    """Name the mistake when the gradients match a known wrong recipe."""
    for hint, chunks in _mistakes(len(x), m).items():
        if _matches(got, _weighted(model, loss_fn, x, y, chunks)[0]):
            return hint
    return WEIGHT_HINT


def _accumulate(nb, model: nn.Module, loss_fn, x, y, m: int, what: str):
    """Run the student's accumulate_gradients on a copy of ``model``: (parameters before, after, the
    description of what it returned)."""
    sent = _send(nb, model)
    before = _read(nb, model, sent[1])
    out = _call(nb.accumulate_gradients, sent[0], loss_fn, x, y, m, what=what)
    desc = fetch(nb.apply(probes.ch03_describe, out))
    return before, _read(nb, model, sent[1]), desc


def _check_gradients(nb, kind: str, loss_fn, m: int, seed: int) -> None:
    """The full-batch gradient on a plain model, frozen parameters untouched, no parameter changed."""
    x, y = _data(loss_fn, B, 10 + seed)
    _check_gradients_on(nb, _plain(kind, seed), loss_fn, x, y, m, _what(kind, loss_fn, m))


def _check_gradients_on(nb, model: nn.Module, loss_fn, x, y, m: int, what: str) -> None:
    """The full-batch gradient of ``model`` on (x, y), frozen parameters untouched, no parameter changed."""
    before, table, _ = _accumulate(nb, model, loss_fn, x, y, m, what)
    ref, _ = _weighted(model, loss_fn, x, y, _chunks(len(x), m))
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
            raise AssertionError(f"{what}: the trainable parameter {name} has no .grad after accumulate_gradients: "
                                 "call backward() on every micro-batch's weighted loss, through the model you are "
                                 "given")
    hint = None
    for name in ref:
        if not same_close(got[name].double(), ref[name].double(), **TOL):
            hint = hint or _diagnose(model, loss_fn, x, y, m, got)
            check_close(got[name], ref[name], f"{what}: the gradient of {name}", hint, **TOL)


# --- accumulate_gradients: the cells -------------------------------------------------------------------
# The values cells' drawn cases, sizes and seeds drawn at grading time, so that code right only on the fixed small
# batches fails: a batch of DRAWN_BATCH samples with micro-batches of DRAWN_MICRO on a plain model, and the memory
# cells' measured sizes (WIDE_BATCH, WIDE_MICRO, below) on a Linear(16, NARROW)-Tanh-Linear(NARROW, 1) MLP (cheap);
# B is never a multiple of m, so the last micro-batch is smaller, and its targets are offset by LAST_OFFSET, so that its
# loss and gradient differ from the others' and every known weighting mistake shows by a wide margin (MSELoss).
LAST_OFFSET = 3.0
DRAWN_BATCH, DRAWN_MICRO, NARROW = (100, 1000), (5, 64), 64
DRAWN_TRAIN_LR = 0.1  # the narrow MLP's step in train_accumulated's values cell


def _uneven(batch: tuple[int, int], micro: tuple[int, int]) -> tuple[int, int]:
    """(B, m) drawn now in these ranges, B not a multiple of m."""
    while True:
        n, m = draw(*batch), draw(*micro)
        if n % m:
            return n, m


def _offset_last(y: torch.Tensor, m: int) -> torch.Tensor:
    """The targets with those of the last (smaller) micro-batch offset by LAST_OFFSET."""
    y = y.clone()
    y[len(y) - len(y) % m:] += LAST_OFFSET
    return y


def _drawn_accumulate_cases() -> list[tuple]:
    """(model, loss_fn, x, y, m, what) of the drawn cases."""
    n, m = _uneven(DRAWN_BATCH, DRAWN_MICRO)
    x, y = _data(nn.MSELoss(), n, new_seed())
    cases = [(_plain("frozen", new_seed()), nn.MSELoss(), x, _offset_last(y, m), m,
              f"{_what('frozen', nn.MSELoss(), m, n)} (sizes and seeds drawn at grading time)")]
    n, m = _uneven(WIDE_BATCH, WIDE_MICRO)
    x, y = seeded((n, WIDE_IN), seed=new_seed()), _offset_last(seeded((n, 1), seed=new_seed()), m)
    cases.append((_wide_model(NARROW, new_seed()), nn.MSELoss(), x, y, m,
                  f"a Linear({WIDE_IN}, {NARROW})-Tanh-Linear({NARROW}, 1) MLP, MSELoss, B={n}, micro_batch_size={m} "
                  "(sizes and seeds drawn at grading time)"))
    return cases


@hidden_test("test_accumulate_gradients")
def check_accumulate_gradients(nb):
    # B = 37 is never a multiple of the micro-batch: the last one is smaller.
    for kind, loss_fn, m, seed in [("mlp", nn.MSELoss(), 8, 1), ("frozen", nn.CrossEntropyLoss(), 8, 2),
                                   ("mlp", nn.CrossEntropyLoss(), 5, 3), ("frozen", nn.MSELoss(), 36, 4)]:
        _check_gradients(nb, kind, loss_fn, m, seed)
    for model, loss_fn, x, y, m, what in _drawn_accumulate_cases():
        _check_gradients_on(nb, model, loss_fn, x, y, m, what)


# The memory cells' measured calls: a batch of WIDE_BATCH samples and micro-batches of WIDE_MICRO, both drawn at
# grading time in these ranges, through a Linear(16, 16384)-Tanh-Linear(16384, 1) MLP (64 KiB of Tanh output per
# sample: 48 to 62.5 MiB for the whole batch, 0.5 to 1.5 MiB for one micro-batch). Tanh, not ReLU: its gradient has
# no jump, so float32 and the judge's float64 agree to rounding on every sample.
WIDE_IN, WIDE, WIDE_BATCH, WIDE_MICRO = 16, 16384, (768, 1000), (8, 24)
# train_accumulated's measured step: plain SGD on the MLP with its first layer scaled down (small hidden values), so
# that even one step per micro-batch stays stable and every known wrong loop can be told from the others.
WIDE_LR, WIDE_TRAIN_SCALE = 0.02, 0.05
STEP_TOL = 1e-3  # a parameter's update may differ from the reference's by this fraction of its largest entry


def _wide_model(width: int, seed: int = 7, scale: float = 1.0) -> nn.Sequential:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(WIDE_IN, width), nn.Tanh(), nn.Linear(width, 1))
    with torch.no_grad():
        model[0].weight.mul_(scale)
        model[0].bias.mul_(scale)
    return model


def _wide_case() -> dict:
    """The measured call's sizes and seeds, drawn now."""
    return {"n": draw(*WIDE_BATCH), "m": draw(*WIDE_MICRO), "model_seed": new_seed(), "x_seed": new_seed(),
            "y_seed": new_seed()}


def _wide_inputs(meter: Meter, case: dict) -> list:
    """The measured call's batch, made in the student's process from the drawn seeds (booked)."""
    return [meter.tensor((case["n"], WIDE_IN), requires_grad=False, seed=case["x_seed"]),
            meter.tensor((case["n"], 1), requires_grad=False, seed=case["y_seed"])]


def _wide_data(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The same batch, made here."""
    return seeded((case["n"], WIDE_IN), seed=case["x_seed"]), seeded((case["n"], 1), seed=case["y_seed"])


def _wide_what(fn: str, case: dict) -> str:
    return (f"{fn} on {case['n']} samples of a Linear({WIDE_IN}, {WIDE})-Tanh-Linear({WIDE}, 1) MLP with "
            f"micro_batch_size={case['m']} (sizes drawn at grading time)")


def _check_peak_bound(held, case: dict, what: str, hint: str = BACKWARD_HINT) -> None:
    """The most the process held during the measured call, read from outside it: a quarter of the whole batch's
    activations at most."""
    n, m = case["n"], case["m"]
    full, micro = n * WIDE * 4, m * WIDE * 4  # the Tanh outputs kept for backward
    limit = full // 4
    if held.peak > limit:
        raise AssertionError(
            f"{what}: while it ran, your process grew by {mib(held.peak)} (read from outside your process); one "
            f"micro-batch's activations are {mib(micro)}, the whole batch's {mib(full)}, and at most {mib(limit)} "
            f"is allowed. {hint}")


def _check_peak(nb, meter: Meter) -> None:
    """One call on a batch whose activations are 48 to 62.5 MiB (one micro-batch's: 0.5 to 1.5 MiB), read from
    outside; the gradients it leaves in the judge's model are checked against the judge's own."""
    case = _wide_case()
    n, m = case["n"], case["m"]
    model = _wide_model(WIDE, case["model_seed"])
    sent = meter.put((model, list(model.parameters())))  # one message: the tensors are the model's own
    # Warm-up on every code path: the first call loads code pages.
    nb.accumulate_gradients(nb.put(_wide_model(64)), nn.MSELoss(), fresh_tensor(nb, (40, WIDE_IN), requires_grad=False),
                            fresh_tensor(nb, (40, 1), requires_grad=False), 8)
    held, _ = meter.held_by(lambda x, y: nb.accumulate_gradients(sent[0], nn.MSELoss(), x, y, m),
                            inputs=lambda: _wide_inputs(meter, case))
    what = _wide_what("accumulate_gradients", case)
    _check_peak_bound(held, case, what)
    # The values of that very call: the gradients of the judge's model, the right ones or those of a known
    # weighting mistake (the values cell grades the weights; this one, that the call did the work it measured).
    got = {name: row["grad"] for name, row in _read(nb, model, sent[1]).items()}
    x, y = _wide_data(case)
    ref, _ = _weighted(model, nn.MSELoss(), x, y, _chunks(n, m))
    if _matches(got, ref) or any(_matches(got, _weighted(model, nn.MSELoss(), x, y, chunks)[0])
                                 for chunks in _mistakes(n, m).values()):
        return
    for name in ref:
        if got.get(name) is None:
            raise AssertionError(f"{what}: the trainable parameter {name} has no .grad after that call: the call whose "
                                 "memory is measured must compute the full-batch gradient like any other; call "
                                 "backward() on every micro-batch's weighted loss, through the model you are given")
        check_close(got[name], ref[name], f"{what}: the gradient of {name} after that call",
                    "the call whose memory is measured must compute the full-batch gradient like any other: "
                    f"{SPLIT_HINT}, and call backward() on each one's weighted loss", **TOL)
    raise AssertionError(f"{what}: the gradients after that call are not those of the micro-batches. {SPLIT_HINT}")


@hidden_test("test_accumulate_gradients_memory")
def check_accumulate_gradients_memory(nb):
    meter = Meter(nb)  # first: nothing the student's code holds goes unaccounted
    for kind, loss_fn, m, seed in [("mlp", nn.MSELoss(), 8, 11), ("frozen", nn.CrossEntropyLoss(), 5, 12),
                                   ("mlp", nn.CrossEntropyLoss(), 36, 13)]:
        model = _model(kind, seed, m)
        x, y = _data(loss_fn, B, 10 + seed)
        what = (f"{_what(kind, loss_fn, m)}, a model that takes at most {m} samples per call and adds a learned "
                "term pos[i] to the i-th sample of each call")
        _, table, _ = _accumulate(nb, model, loss_fn, x, y, m, what)
        got = {n: row["grad"] for n, row in table.items()}
        if got["pos"] is None:
            raise AssertionError(f"{what}: pos received no gradient, so the model you were given was not called on "
                                 f"the micro-batches (a part of it was called directly). {SPLIT_HINT}")
        ref, _ = _weighted(model, loss_fn, x, y, _chunks(B, m))
        if _matches(got, ref):
            continue
        # Exact slices with a wrong weighting: the values cell says so, this one is about the slices.
        if any(_matches(got, _weighted(model, loss_fn, x, y, chunks)[0]) for chunks in _mistakes(B, m).values()):
            continue
        check_close(got["pos"], ref["pos"], f"{what}: the gradient of pos",
                    "pos[i] is added to the i-th sample of each call, so its gradient shows which samples went in "
                    f"together: {SPLIT_HINT}", **TOL)
        raise AssertionError(f"{what}: the gradients are not those of the micro-batches inputs[0:{m}], "
                             f"inputs[{m}:{2 * m}], ... with any weighting. {SPLIT_HINT}")
    _check_peak(nb, meter)


def _loss_candidates(model, loss_fn, x, y, m: int) -> dict[str, float]:
    chunks = _chunks(len(x), m)
    means = [_weighted(model, loss_fn, x, y, [(a, b, 1.0)])[1] for a, b, _ in chunks]
    sizes = [b - a for a, b, _ in chunks]
    return {
        "the sum of the micro-batch mean losses, not their weighted mean": sum(means),
        "the plain average of the micro-batch mean losses, but the last micro-batch is smaller: weight each by "
        "n_i / B": sum(means) / len(means),
        f"B = {len(x)} times the mean: each micro-batch's mean loss was weighted by n_i, not n_i / B":
            sum(n * v for n, v in zip(sizes, means)),
        "the last micro-batch's loss only: add up every micro-batch's weighted loss": means[-1] * sizes[-1] / len(x),
    }


@hidden_test("test_accumulate_gradients_loss")
def check_accumulate_gradients_loss(nb):
    for kind, loss_fn, m, seed in [("mlp", nn.MSELoss(), 8, 21), ("frozen", nn.CrossEntropyLoss(), 5, 22),
                                   ("mlp", nn.CrossEntropyLoss(), 36, 23)]:
        x, y = _data(loss_fn, B, 10 + seed)
        _check_loss(nb, _plain(kind, seed), loss_fn, x, y, m, f"{_what(kind, loss_fn, m)}: the returned loss")
    for model, loss_fn, x, y, m, what in _drawn_accumulate_cases():
        _check_loss(nb, model, loss_fn, x, y, m, f"{what}: the returned loss")


def _check_loss(nb, model: nn.Module, loss_fn, x, y, m: int, what: str) -> None:
    """What accumulate_gradients returns: a detached 0-dim tensor, the full-batch mean loss."""
    _, _, desc = _accumulate(nb, model, loss_fn, x, y, m, what)
    if desc["type"] != "Tensor":
        raise AssertionError(f"{what} is a {desc['type']}, expected a detached 0-dim tensor "
                             "(the weighted sum of loss.detach() values)")
    if desc["shape"] != []:
        raise AssertionError(f"{what} has shape {desc['shape']}, expected a scalar (0-dim) tensor")
    if desc["requires_grad"] or desc["has_grad_fn"]:
        raise AssertionError(f"{what} is still attached to the autograd graph: return the weighted sum of "
                             "loss.detach() values (a detached 0-dim tensor), a number to log, not a graph")
    value = desc["value"].double()
    expected = _weighted(model, loss_fn, x, y, _chunks(len(x), m))[1]
    if not same_close(value, torch.tensor(expected, dtype=torch.float64), **TOL):
        hint = LOSS_HINT
        for cause, wrong in _loss_candidates(model, loss_fn, x, y, m).items():
            if same_close(value, torch.tensor(wrong, dtype=torch.float64), **TOL):
                hint = f"it is {cause}. {LOSS_HINT}"
                break
        check_close(value, torch.tensor(expected, dtype=torch.float64), what, hint, **TOL)


@hidden_test("test_accumulate_gradients_edge_cases")
def check_accumulate_gradients_edge_cases(nb):
    # micro_batch_size >= B: one forward of the whole batch (B samples).
    for kind, loss_fn, m, seed in [("mlp", nn.MSELoss(), B, 31), ("frozen", nn.CrossEntropyLoss(), 64, 32)]:
        try:
            _check_gradients(nb, kind, loss_fn, m, seed)
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001 - the student's own error, locally or as a StudentError
            message = f"{e.type_name}: {e.message}" if isinstance(e, StudentError) else f"{type(e).__name__}: {e}"
            raise AssertionError(f"accumulate_gradients(..., micro_batch_size={m}) on a batch of B={B} raised "
                                 f"{message[:300]}: m >= B is allowed and means one forward of the whole batch "
                                 "(a single micro-batch, weight n_1 / B = 1)") from None
    x, y = _data(nn.MSELoss(), B, 0)
    for bad in (0, -3, 2.5):
        names = fetch(nb.apply(probes.raised, nb.accumulate_gradients, _plain("mlp", 0), nn.MSELoss(), x, y, bad))
        if names is None or "ValueError" not in names:
            got = "returned normally" if names is None else f"raised {names[0]}"
            raise AssertionError(f"accumulate_gradients(..., micro_batch_size={bad}) {got}: it should raise "
                                 "ValueError (micro_batch_size must be a positive int; check it before the loop)")


# --- train_accumulated: references and known mistakes ---------------------------------------------------
def _simulate(model, loss_fn, loader, steps: int, lr: float, momentum: float, micro: int, mistake: str | None = None):
    """``steps`` SGD steps (PyTorch's momentum rule) in float64, cycling through ``loader``: the full-batch
    loss is sum_i (n_i / B) * mean_i over the micro-batches. ``mistake`` simulates a wrong loop instead:
    "no_zero", "zero_per_micro" (only the last micro-batch's gradient; "_unweighted": its plain mean),
    "step_per_micro" (one step per micro-batch on its mean loss; "_weighted": on (n_i / B) * mean_i),
    "no_step". Returns the model (float32) and the losses before each step."""
    m = copy.deepcopy(model).double()
    params = [p for p in m.parameters() if p.requires_grad]
    velocity = [torch.zeros_like(p) for p in params]
    summed = [torch.zeros_like(p) for p in params]

    def step(grads):
        with torch.no_grad():
            for p, v, g in zip(params, velocity, grads):
                v.mul_(momentum).add_(g)
                p.sub_(lr * v)

    losses = []
    for i in range(steps):
        x, y = loader[i % len(loader)]
        x, y = x.double(), (y if y.dtype == torch.long else y.double())
        chunks = _chunks(len(x), micro)
        if mistake in ("step_per_micro", "step_per_micro_weighted"):
            for a, b, w in chunks:
                loss = loss_fn(m(x[a:b]), y[a:b]) * (w if mistake.endswith("weighted") else 1.0)
                step(torch.autograd.grad(loss, params))
            continue
        grads, loss = [torch.zeros_like(p) for p in params], 0.0
        for a, b, w in chunks:  # one graph at a time: the sum of the weighted losses' gradients
            mean = loss_fn(m(x[a:b]), y[a:b])
            for g, d in zip(grads, torch.autograd.grad(w * mean, params)):
                g.add_(d)
            loss += w * float(mean.detach())
        if mistake in ("zero_per_micro", "zero_per_micro_unweighted"):
            a, b, w = chunks[-1]
            last = loss_fn(m(x[a:b]), y[a:b]) * (1.0 if mistake.endswith("unweighted") else w)
            grads = torch.autograd.grad(last, params)
        if mistake == "no_zero":
            summed = [s + g for s, g in zip(summed, grads)]
            grads = summed
        if mistake != "no_step":
            step(grads)
        losses.append(loss)
    return m.float(), losses


TRAIN_MISTAKES = {"no_zero": ZERO_HINT, "zero_per_micro": ZERO_MICRO_HINT,
                  "zero_per_micro_unweighted": ZERO_MICRO_HINT, "step_per_micro": STEP_MICRO_HINT,
                  "step_per_micro_weighted": STEP_MICRO_HINT, "no_step": NO_STEP_HINT}


def _train(nb, model, loss_fn, loader, m: int, steps: int, lr: float, momentum: float, what: str, wrap=None):
    """Run the student's train_accumulated with a judge-made SGD over the trainable parameters: (the
    losses it returned, the parameter table after)."""
    copied = copy.deepcopy(model)  # one message: the optimizer keeps pointing at this model's parameters
    opt = torch.optim.SGD([p for p in copied.parameters() if p.requires_grad], lr=lr, momentum=momentum)
    sent = nb.put((copied, opt, list(copied.parameters())))
    out = _call(nb.train_accumulated, sent[0], sent[1], loss_fn, loader if wrap is None else wrap(loader), m, steps,
                what=what)
    return fetch(out), _read(nb, model, sent[2])


def _check_trained(table: dict, model, loss_fn, loader, m, steps, lr, momentum, what: str,
                   hint: str | None = None) -> None:
    """The parameters after training against the reference; a mismatch is matched against the mistakes."""
    ref_model, _ = _simulate(model, loss_fn, loader, steps, lr, momentum, m)
    ref = dict(ref_model.named_parameters())
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    for name, p in model.named_parameters():
        if not p.requires_grad:
            check_close(table[name]["value"], p.detach(), f"{what}: the frozen parameter {name}",
                        "frozen parameters must not change", atol=0, rtol=0)
    if all(same_close(table[n]["value"].double(), ref[n].detach().double(), **TOL) for n in trainable):
        return
    if hint is not None:  # a caller that knows the cause
        for name in trainable:
            check_close(table[name]["value"], ref[name].detach(), f"{what}: parameter {name} after {steps} steps",
                        hint, **TOL)
    hint = TRAIN_HINT
    for mistake, mistake_hint in TRAIN_MISTAKES.items():
        wrong = dict(_simulate(model, loss_fn, loader, steps, lr, momentum, m, mistake)[0].named_parameters())
        if all(same_close(table[n]["value"].double(), wrong[n].detach().double(), **TOL) for n in trainable):
            hint = mistake_hint
            break
    for name in trainable:
        check_close(table[name]["value"], ref[name].detach(), f"{what}: parameter {name} after {steps} steps", hint,
                    **TOL)


def _as_floats(losses, steps: int, what: str, loader_len: int) -> list[float]:
    if not isinstance(losses, list):
        raise AssertionError(f"{what}: train_accumulated returned a {type(losses).__name__}, expected a list of "
                             "floats (one per step)")
    if len(losses) != steps:
        raise AssertionError(f"{what}: {len(losses)} losses for steps={steps}. Take one batch per step and start "
                             f"the loader again when it runs out (this one has {loader_len} batches)")
    values = []
    for v in losses:
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = float(v.reshape(()))
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise AssertionError(f"{what}: a loss is a {type(v).__name__}, expected a Python float (float(loss))")
        values.append(float(v))
    return values


def _check_losses(losses: list[float], ref_losses: list[float], what: str, table_hint: str | None = None) -> None:
    check_close(torch.tensor(losses[:1], dtype=torch.float64), torch.tensor(ref_losses[:1], dtype=torch.float64),
                f"{what}: the loss of step 1", "each step's loss is the full-batch mean loss returned by "
                "accumulate_gradients, computed before that step's optimizer.step()", **TOL)
    check_close(torch.tensor(losses, dtype=torch.float64), torch.tensor(ref_losses, dtype=torch.float64),
                f"{what}: the losses", table_hint or TRAIN_HINT, **TOL)


# --- train_accumulated: the cells ------------------------------------------------------------------------
def _train_case(nb, kind, loss_fn, batch_sizes, m, steps, lr, momentum, seed, wrap=None, model=None):
    model = _plain(kind, seed) if model is None else model
    loader = [_data(loss_fn, n, 20 + 7 * seed + i) for i, n in enumerate(batch_sizes)]
    what = (f"{kind} model, {type(loss_fn).__name__}, batches of {list(batch_sizes)}, micro_batch_size={m}, "
            f"steps={steps}, SGD(lr={lr}, momentum={momentum})")
    losses, table = _train(nb, model, loss_fn, loader, m, steps, lr, momentum, what, wrap)
    return model, loader, what, losses, table


def _drawn_train_cases() -> list[tuple]:
    """(model, loss_fn, loader, m, steps, lr, momentum, what) of the values cell's drawn cases: two batches of
    DRAWN_BATCH samples with micro-batches of DRAWN_MICRO on a plain model, and one batch of the memory cell's
    measured sizes on the narrow MLP; no batch is a multiple of m."""
    n, m = _uneven(DRAWN_BATCH, DRAWN_MICRO)
    sizes = (n, next(k for k in iter(lambda: draw(*DRAWN_BATCH), None) if k % m))
    loader = [(x, _offset_last(y, m)) for x, y in (_data(nn.MSELoss(), k, new_seed()) for k in sizes)]
    cases = [(_plain("frozen", new_seed()), nn.MSELoss(), loader, m, 2, 0.1, 0.9,
              f"frozen model, MSELoss, batches of {list(sizes)}, micro_batch_size={m}, steps=2, "
              "SGD(lr=0.1, momentum=0.9) (sizes and seeds drawn at grading time)")]
    n, m = _uneven(WIDE_BATCH, WIDE_MICRO)
    loader = [(seeded((n, WIDE_IN), seed=new_seed()), _offset_last(seeded((n, 1), seed=new_seed()), m))]
    cases.append((_wide_model(NARROW, new_seed()), nn.MSELoss(), loader, m, 1, DRAWN_TRAIN_LR, 0.0,
                  f"a Linear({WIDE_IN}, {NARROW})-Tanh-Linear({NARROW}, 1) MLP, MSELoss, one batch of {n}, "
                  f"micro_batch_size={m}, one step of SGD(lr={DRAWN_TRAIN_LR}) (sizes and seeds drawn at grading "
                  "time)"))
    return cases


@hidden_test("test_train_accumulated")
def check_train_accumulated(nb):
    cases = []
    for kind, loss_fn, sizes, m, steps, lr, momentum, seed in [
            ("mlp", nn.MSELoss(), (B, B, 23), 8, 3, 0.1, 0.0, 1),
            ("frozen", nn.CrossEntropyLoss(), (B, 29, 33), 10, 3, 0.2, 0.9, 2)]:
        model = _plain(kind, seed)
        loader = [_data(loss_fn, n, 20 + 7 * seed + i) for i, n in enumerate(sizes)]
        cases.append((model, loss_fn, loader, m, steps, lr, momentum,
                      f"{kind} model, {type(loss_fn).__name__}, batches of {list(sizes)}, micro_batch_size={m}, "
                      f"steps={steps}, SGD(lr={lr}, momentum={momentum})"))
    for model, loss_fn, loader, m, steps, lr, momentum, what in cases + _drawn_train_cases():
        losses, table = _train(nb, model, loss_fn, loader, m, steps, lr, momentum, what)
        values = _as_floats(losses, steps, what, len(loader))
        _check_trained(table, model, loss_fn, loader, m, steps, lr, momentum, what)
        _check_losses(values, _simulate(model, loss_fn, loader, steps, lr, momentum, m)[1], what)


@hidden_test("test_train_accumulated_memory")
def check_train_accumulated_memory(nb):
    meter = Meter(nb)  # first: nothing the student's code holds goes unaccounted
    for kind, loss_fn, n, m, lr, momentum, seed in [("mlp", nn.MSELoss(), B, 8, 0.1, 0.0, 41),
                                                    ("frozen", nn.CrossEntropyLoss(), 29, 10, 0.2, 0.9, 42)]:
        model = _model(kind, seed, m)
        loader = [_data(loss_fn, n, 50 + seed)]
        what = (f"{kind} model that takes at most {m} samples per call and adds a learned term pos[i] to the i-th "
                f"sample of each call, {type(loss_fn).__name__}, one batch of {n}, micro_batch_size={m}, one step")
        _, table = _train(nb, model, loss_fn, loader, m, 1, lr, momentum, what)
        start = dict(model.named_parameters())
        trainable = [k for k, p in start.items() if p.requires_grad]

        def same(params) -> bool:
            return all(same_close(table[k]["value"].double(), params[k].detach().double(), **TOL) for k in trainable)

        if same(start):
            raise AssertionError(f"{what}: no parameter changed. {NO_STEP_HINT}")
        if same_close(table["pos"]["value"].double(), model.pos.detach().double(), atol=0, rtol=0):
            raise AssertionError(f"{what}: pos did not move although other parameters did, so the model you were "
                                 f"given was not called on the micro-batches (a part of it was called directly). "
                                 f"{SPLIT_HINT}")
        # The right loop, or a wrong one on the right micro-batches (the values cell grades the loop).
        if any(same(dict(_simulate(model, loss_fn, loader, 1, lr, momentum, m, mistake)[0].named_parameters()))
               for mistake in (None, *TRAIN_MISTAKES)):
            continue
        ref = dict(_simulate(model, loss_fn, loader, 1, lr, momentum, m)[0].named_parameters())
        check_close(table["pos"]["value"], ref["pos"].detach(), f"{what}: pos after the step",
                    "pos[i] is added to the i-th sample of each call, so its update shows which samples went in "
                    f"together: pass micro_batch_size on to accumulate_gradients; {SPLIT_HINT}", **TOL)
        raise AssertionError(f"{what}: the parameters after the step are not those of micro-batches inputs[0:{m}], "
                             f"inputs[{m}:{2 * m}], ... {SPLIT_HINT}")
    _check_train_peak(nb, meter)


def _check_train_peak(nb, meter: Meter) -> None:
    """One step on a batch whose activations are 48 to 62.5 MiB, read from outside; the parameters it leaves in the
    judge's model are checked against the judge's own step."""
    case = _wide_case()
    n, m = case["n"], case["m"]
    model = _wide_model(WIDE, case["model_seed"], WIDE_TRAIN_SCALE)
    copied = copy.deepcopy(model)
    opt = torch.optim.SGD(copied.parameters(), lr=WIDE_LR)
    sent = meter.put((copied, opt, list(copied.parameters())))  # one message: the optimizer's are the model's
    # Warm-up on every code path: the first call loads code pages.
    small = _wide_model(64)
    warm = nb.put((small, torch.optim.SGD(small.parameters(), lr=WIDE_LR)))
    nb.train_accumulated(warm[0], warm[1], nn.MSELoss(), [(fresh_tensor(nb, (40, WIDE_IN), requires_grad=False),
                                                           fresh_tensor(nb, (40, 1), requires_grad=False))], 8, 1)
    del warm
    held, _ = meter.held_by(lambda x, y: nb.train_accumulated(sent[0], sent[1], nn.MSELoss(), [(x, y)], m, 1),
                            inputs=lambda: _wide_inputs(meter, case))
    what = _wide_what(f"train_accumulated (one step, SGD(lr={WIDE_LR}))", case)
    _check_peak_bound(held, case, what, "each batch goes through micro-batches of micro_batch_size, one backward() "
                      "per micro-batch (accumulate_gradients), never through one forward of the whole batch")
    # The values of that very step: the parameters of the judge's model after it, those of the right loop or of
    # a known wrong one on the right micro-batches (the values cell grades the loop).
    table = _read(nb, model, sent[2])
    start = dict(model.named_parameters())
    if all(same_values(table[k]["value"], p.detach()) for k, p in start.items()):
        raise AssertionError(f"{what}: no parameter changed. {NO_STEP_HINT}")

    def update(params, k) -> torch.Tensor:
        return params[k].detach().double() - start[k].detach().double()

    def tol(params, k) -> float:  # a fraction of the largest update, and float32 rounding of the parameter
        return STEP_TOL * float(update(params, k).abs().max()) + 2e-7 * float(start[k].detach().abs().max())

    def same(params) -> bool:  # the same update as ``params``', up to float32 rounding
        return all(same_close(update(got, k), update(params, k), atol=tol(params, k), rtol=0) for k in start)

    got = {k: row["value"] for k, row in table.items()}
    loader = [_wide_data(case)]
    ref = dict(_simulate(model, nn.MSELoss(), loader, 1, WIDE_LR, 0.0, m)[0].named_parameters())
    if same(ref) or any(same(dict(_simulate(model, nn.MSELoss(), loader, 1, WIDE_LR, 0.0, m, mistake)[0]
                                  .named_parameters())) for mistake in TRAIN_MISTAKES if mistake != "no_step"):
        return
    for k in start:
        check_close(update(got, k), update(ref, k), f"{what}: the update of parameter {k} by the step",
                    "the step whose memory is measured must train like any other: per batch, zero the gradients "
                    "once, accumulate_gradients over its micro-batches, then optimizer.step()",
                    atol=tol(ref, k), rtol=0)
    raise AssertionError(f"{what}: the parameters after the step are not those of one SGD step on the micro-batches "
                         f"inputs[0:{m}], inputs[{m}:{2 * m}], ... {SPLIT_HINT}")


@hidden_test("test_train_accumulated_edge_cases")
def check_train_accumulated_edge_cases(nb):
    # The loader runs out and starts again: a list, then a re-iterable without len or indexing.
    for kind, loss_fn, sizes, m, steps, lr, momentum, seed, wrap in [
            ("mlp", nn.MSELoss(), (B, B, 23), 8, 5, 0.1, 0.0, 3, None),
            ("frozen", nn.CrossEntropyLoss(), (B, 29), 10, 4, 0.2, 0.9, 4, probes.ch03_Batches)]:
        try:
            model, loader, what, losses, table = _train_case(nb, kind, loss_fn, sizes, m, steps, lr, momentum, seed,
                                                             wrap)
        except Exception as e:  # noqa: BLE001 - the student's code failing on a loader without len or indexing
            if wrap is None or isinstance(e, AssertionError):
                raise
            message = f"{e.type_name}: {e.message}" if isinstance(e, StudentError) else f"{type(e).__name__}: {e}"
            raise AssertionError(
                f"train_accumulated on a loader that is an iterable without len() or indexing (like a DataLoader), "
                f"{steps} steps from {len(sizes)} batches, raised: {message[:300]}. The loader is any re-iterable: "
                "take batches with next() on iter(loader), and call iter(loader) again when it runs out") from None
        if wrap is not None:
            what += ", the loader an iterable without len() or indexing (like a DataLoader)"
        values = _as_floats(losses, steps, what, len(loader))
        if not all(type(v) is float for v in losses):
            kinds = sorted({type(v).__name__ for v in losses})
            raise AssertionError(f"{what}: the losses are {kinds}, expected Python floats (loss.item() or float(loss))")
        # Which batches were taken shows in the parameters: the right loop, or one of the known wrong ones
        # (the values cell grades those), on the batches 0, 1, 2, 0, 1, ...
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        if not any(all(same_close(table[n]["value"].double(), params[n].detach().double(), **TOL) for n in trainable)
                   for params in (dict(_simulate(model, loss_fn, loader, steps, lr, momentum, m, mistake)[0]
                                       .named_parameters()) for mistake in (None, *TRAIN_MISTAKES))):
            _check_losses(values, _simulate(model, loss_fn, loader, steps, lr, momentum, m)[1], what, CYCLE_HINT)
            _check_trained(table, model, loss_fn, loader, m, steps, lr, momentum, what, CYCLE_HINT)
    # steps=0: nothing happens.
    model = _plain("mlp", 5)
    loader = [_data(nn.MSELoss(), B, 60)]
    what = "train_accumulated(..., steps=0)"
    losses, table = _train(nb, model, nn.MSELoss(), loader, 8, 0, 0.1, 0.0, what)
    if not isinstance(losses, list) or losses:
        raise AssertionError(f"{what} returned {losses!r}: zero steps take no batch and return an empty list")
    for name, p in model.named_parameters():
        check_close(table[name]["value"], p.detach(), f"{what}: parameter {name}", "zero steps change nothing",
                    atol=0, rtol=0)
    # An empty loader.
    copied = _plain("mlp", 6)
    opt = torch.optim.SGD(copied.parameters(), lr=0.1)
    names = fetch(nb.apply(probes.raised, nb.train_accumulated, copied, opt, nn.MSELoss(), [], 8, 3))
    if names is None or "ValueError" not in names:
        got = "returned normally" if names is None else f"raised {names[0]}"
        raise AssertionError(f"train_accumulated on an empty loader (steps=3) {got}: a loader that yields no batch "
                             "raises ValueError")
