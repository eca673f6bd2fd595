"""Hidden tests of ch00_memory: ``predict_training_memory``.

The truth is measured here, judge-side, with ``coursekit.steps.measure_training_step`` (what
autograd really saved) and ``coursekit.memory.model_state_bytes``; the student's function
only ever sees ``probes.ch00_meta`` copies of the models built below: Linear, ReLU and Sequential on
the meta device (shapes, no data) that refuse to run, to be moved or materialised (``to_empty``,
``to``, ``float``) and to take new tensors. A prediction has to come from the layers' shapes;
measuring a materialised copy is not possible.
"""
from __future__ import annotations

import random

import torch
from torch import nn

from coursekit.checks import check_equal
from coursekit.memory import OPTIMIZER_STATE_COPIES, model_state_bytes
from coursekit.steps import measure_training_step
from grader import probes
from grader.api import fetch, hidden_test
from grader.sandbox.codec import NotTransferable
from grader.sandbox.rpc import StudentError

KEYS = ("params", "grads", "optimizer_state", "activations")
OPTIMIZERS = tuple(OPTIMIZER_STATE_COPIES)  # ("sgd", "momentum", "adam")

STATE_HINTS = {
    "params": "Parameters cost numel × 4 bytes each in fp32, weights and biases alike "
              "(a Linear built with bias=False has no bias).",
    "grads": "Every trainable parameter gets a gradient of its own shape and dtype.",
}
OPTIMIZER_HINTS = {
    "sgd": "Plain SGD keeps no state at all: 0 bytes.",
    "momentum": "SGD with momentum keeps one velocity buffer per trainable parameter (1× its bytes).",
    "adam": "Adam keeps two moments (m and v) per trainable parameter (2× its bytes).",
}
GENERIC_ACT_HINT = ("Count what autograd saves: the first Linear's input, every ReLU output, every "
                    "Linear output that does not go straight into a ReLU, the MSE target; each storage once.")

# (hint naming the concept, in_features, layers). A layer is ("L", out_features, bias) or ("R",).
CASES = [
    ("A single Linear saves its input x (for dW = gᵀx); the MSE loss saves the prediction and the target.",
     37, [("L", 11, True)]),
    ("Without a bias the saved tensors are the same: the bias changes the parameters, not the activations.",
     53, [("L", 1, False)]),
    ("Is the ReLU output counted once although the next Linear saves it too? And is the first Linear's "
     "output left out (ReLU's backward needs only its own output)?",
     37, [("L", 53, True), ("R",), ("L", 11, True)]),
    ("A Linear output that feeds another Linear is saved once, as that Linear's input "
     "(no ReLU in between to save it).",
     29, [("L", 45, False), ("L", 13, True)]),
    ("A ReLU before the first Linear is not recorded (nothing before it needs a gradient); the first "
     "Linear saves the ReLU's output, which has the shape of x.",
     19, [("R",), ("L", 23, True), ("R",), ("L", 5, True)]),
    ("A trailing ReLU's output is also the prediction the MSE loss saves: one storage, counted once.",
     21, [("L", 17, True), ("R",)]),
    ("Each ReLU saves its own output, a new tensor: two ReLUs in a row save two tensors.",
     13, [("L", 31, True), ("R",), ("R",), ("L", 7, False)]),
    ("Depth does not change the rules: one saved tensor per ReLU output and per Linear output "
     "that does not feed a ReLU, plus the input and the target.",
     41, [("L", 67, True), ("R",), ("L", 33, False), ("L", 19, True), ("R",), ("L", 27, True),
          ("R",), ("L", 3, True)]),
]
BATCHES = (1, 7, 16, 3, 33)


def _build(in_features: int, layers: list[tuple], seed: int) -> nn.Sequential:
    modules: list[nn.Module] = []
    width = in_features
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for layer in layers:
            if layer[0] == "L":
                modules.append(nn.Linear(width, layer[1], bias=layer[2]))
                width = layer[1]
            else:
                modules.append(nn.ReLU())
    return nn.Sequential(*modules)


def _random_layers(rng: random.Random) -> tuple[int, list[tuple]]:
    """1–5 Linears with awkward widths, biases on and off, ReLUs anywhere (also leading,
    trailing and consecutive)."""
    n_linear = rng.randint(1, 5)
    layers: list[tuple] = []
    for i in range(n_linear):
        if i or rng.random() < 0.3:  # ReLUs before the first Linear only sometimes
            layers += [("R",)] * rng.choice([0, 0, 1, 1, 2])
        layers.append(("L", rng.choice([1, 3, 5, 9, 11, 17, 23, 31, 45, 53, 67]), rng.random() < 0.6))
    if rng.random() < 0.3:
        layers.append(("R",))
    return rng.choice([2, 7, 13, 37, 50]), layers


def _describe(model: nn.Sequential) -> str:
    parts = []
    for m in model:
        if isinstance(m, nn.Linear):
            parts.append(f"Linear({m.in_features}, {m.out_features}{'' if m.bias is not None else ', bias=False'})")
        else:
            parts.append(type(m).__name__)
    return " → ".join(parts)


def _unrunnable(model: nn.Sequential) -> probes.ch00_meta.Sequential:
    """The same layers as ``probes.ch00_meta`` modules: shapes only, nothing that can run."""
    layers = [probes.ch00_meta.Linear(m.in_features, m.out_features, bias=m.bias is not None)
              if isinstance(m, nn.Linear) else probes.ch00_meta.ReLU() for m in model]
    return probes.ch00_meta.Sequential(*layers)


def _as_number(value, name: str, where: str) -> int | float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AssertionError(f"{name} should be a number of bytes (an int), got {type(value).__name__} {where}.")
    return value


def _call(nb, model: nn.Sequential, batch_size: int, optimizer: str) -> dict:
    where = f"for {_describe(model)}, batch size {batch_size}, optimizer {optimizer!r}"
    try:
        # Shapes without data, refusing to run or materialise: the student must predict, not run the step.
        result = fetch(nb.predict_training_memory(_unrunnable(model), batch_size, optimizer))
    except (RuntimeError, StudentError) as e:  # the model's refusal, locally or as a StudentError
        message = e.message if isinstance(e, StudentError) else str(e)
        if "predict from its layers' shapes" not in message:
            raise
        raise AssertionError(
            f"predict_training_memory tried to run, move, materialise or change the model {where} ({message}). "
            f"The grader's models have shapes but no data: count the bytes from in_features, out_features, "
            f"the biases and the batch size, without running anything.") from None
    except NotTransferable as e:
        raise AssertionError(
            f"predict_training_memory should return a dict of ints {where}; got a value that is not plain "
            f"data ({e}).") from None
    if not isinstance(result, dict):
        raise AssertionError(
            f"predict_training_memory should return a dict with keys {list(KEYS)} {where}, "
            f"got a {type(result).__name__}.")
    missing = [k for k in KEYS if k not in result]
    if missing:
        raise AssertionError(
            f"the dict returned {where} lacks the key(s) {missing}: it needs all of {list(KEYS)} "
            f"(got {sorted(result)}).")
    return {k: _as_number(result[k], f'result["{k}"]', where) for k in KEYS}


def _check_one(nb, model: nn.Sequential, batch_size: int, optimizer: str, act_hint: str) -> None:
    # The truth is taken before the student's function sees (a copy of) the model.
    truth = dict(model_state_bytes(model, optimizer))
    measured = measure_training_step(model, batch_size)
    truth["activations"] = measured.activation_bytes
    got = _call(nb, model, batch_size, optimizer)
    where = f'for {_describe(model)} at batch size {batch_size} with {optimizer!r}'
    for key in ("params", "grads"):
        check_equal(got[key], truth[key], f'result["{key}"] {where}', STATE_HINTS[key])
    check_equal(got["optimizer_state"], truth["optimizer_state"], f'result["optimizer_state"] {where}',
                OPTIMIZER_HINTS[optimizer])
    if got["activations"] != truth["activations"]:
        diff = got["activations"] - truth["activations"]
        per_example = diff / 4 / batch_size
        saved = ", ".join(str(tuple(s.shape)) for s in measured.saved if not s.is_state)
        detail = (f"You are off by {diff:+,} bytes = {per_example:+g} fp32 values per example. "
                  f"Autograd saved these activation storages: {saved}.")
        if got["activations"] * 4 == truth["activations"]:
            detail += " Bytes, not elements: an fp32 value takes 4 bytes."
        check_equal(got["activations"], truth["activations"], f'result["activations"] {where}',
                    f"{act_hint} {detail}")


@hidden_test("test_predict_training_memory")
def check_predict_training_memory(nb):
    # Hand-picked cases, one concept each, every optimizer and a batch of 1 among them.
    for i, (hint, in_features, layers) in enumerate(CASES):
        model = _build(in_features, layers, seed=100 + i)
        _check_one(nb, model, BATCHES[i % len(BATCHES)], OPTIMIZERS[i % len(OPTIMIZERS)], hint)

    # One model, every optimizer: only the optimizer state may change.
    model = _build(37, [("L", 53, True), ("R",), ("L", 11, False)], seed=7)
    for optimizer in OPTIMIZERS:
        _check_one(nb, model, 5, optimizer, CASES[2][0])

    # Random stacks, fixed seed.
    rng = random.Random(2020)
    for i in range(12):
        in_features, layers = _random_layers(rng)
        model = _build(in_features, layers, seed=200 + i)
        _check_one(nb, model, rng.choice((1, 2, 9, 24)), rng.choice(OPTIMIZERS), GENERIC_ACT_HINT)

    # Unknown optimizers are rejected with a ValueError.
    model = _build(37, [("L", 11, True)], seed=0)
    raised = nb.apply(probes.raised, nb.predict_training_memory, _unrunnable(model), 8, "rmsprop")
    raised = fetch(raised)
    allowed = ", ".join(repr(o) for o in OPTIMIZERS)
    if raised is None:
        raise AssertionError(
            f"predict_training_memory(model, 8, 'rmsprop') returned a result: an unknown optimizer should "
            f"raise ValueError naming the bad value and the allowed ones ({allowed}).")
    if "ValueError" not in raised:
        raise AssertionError(
            f"predict_training_memory(model, 8, 'rmsprop') raised {raised[0]}, expected a ValueError "
            f"naming the bad value and the allowed ones ({allowed}).")
