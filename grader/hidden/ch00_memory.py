"""Hidden tests of ch00_memory: ``predict_training_memory``, by property, one graded cell each.

- activations (``test_predict_training_memory``): the "activations" entry against what autograd really
  saved in the step, measured here; failures that are the right count in elements (not bytes) or for
  one example (not the batch) are named as such.
- model state: "params", "grads" and "optimizer_state" against ``coursekit.memory.model_state_bytes``,
  every optimizer on every hand-made stack.
- errors: the three optimizer names are not refused; "rmsprop" raises a ValueError whose message names
  it and the allowed ones. The other cells grade what the function returns for the names it accepts: a
  valid name refused with ValueError is this cell's failure, not theirs.

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
    if isinstance(value, bool) or not isinstance(value, int):
        raise AssertionError(f"{name} should be a number of bytes (an int, as the docstring says), got "
                             f"{type(value).__name__} {value!r} {where}.")
    return value


class _RefusedValidName(Exception):
    """The student's function raised ValueError for one of the three valid optimizer names: the errors cell
    grades that (its message says so); the other cells grade what the function returns for the names it takes."""


def _value_error(e: BaseException) -> bool:
    return isinstance(e, ValueError) or (isinstance(e, StudentError) and "ValueError" in e.types)


def _call(nb, model: nn.Sequential, batch_size: int, optimizer: str, keys: tuple = KEYS) -> dict:
    """The student's prediction on an unrunnable copy of ``model``: the entries ``keys`` as numbers.

    Raises ``_RefusedValidName`` when the function raises ValueError for ``optimizer`` (a valid name)."""
    where = f"for {_describe(model)}, batch size {batch_size}, optimizer {optimizer!r}"
    try:
        # Shapes without data, refusing to run or materialise: the student must predict, not run the step.
        result = fetch(nb.predict_training_memory(_unrunnable(model), batch_size, optimizer))
    except (RuntimeError, StudentError, ValueError) as e:  # the model's refusal, locally or as a StudentError
        if _value_error(e) and optimizer in OPTIMIZERS:
            raise _RefusedValidName(e.message if isinstance(e, StudentError) else str(e)) from None
        if isinstance(e, ValueError):
            raise
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
    missing = [k for k in keys if k not in result]
    if missing:
        raise AssertionError(
            f"the dict returned {where} lacks the key(s) {missing}: it needs all of {list(KEYS)} "
            f"(got {sorted(result)}).")
    return {k: _as_number(result[k], f'result["{k}"]', where) for k in keys}


def _where(model: nn.Sequential, batch_size: int, optimizer: str) -> str:
    return f"for {_describe(model)} at batch size {batch_size} with {optimizer!r}"


def _check_activations(nb, model: nn.Sequential, batch_size: int, optimizer: str, act_hint: str) -> None:
    # The truth is measured before the student's function sees (a copy of) the model.
    measured = measure_training_step(model, batch_size)
    truth = measured.activation_bytes
    # The activations do not depend on the optimizer: a valid name the function refuses (the errors cell's
    # property) is replaced by another valid one; only a function that refuses all three fails here.
    for name in (optimizer, *(o for o in OPTIMIZERS if o != optimizer)):
        try:
            got = _call(nb, model, batch_size, name, ("activations",))["activations"]
            break
        except _RefusedValidName as refused:
            why = str(refused)
    else:
        raise AssertionError(
            f"predict_training_memory raised ValueError ({why}) for every valid optimizer "
            f"({', '.join(map(repr, OPTIMIZERS))}) {_where(model, batch_size, optimizer)}: only an unknown optimizer "
            f"raises; return the four parts for these.")
    optimizer = name
    if got == truth:
        return
    diff = got - truth
    saved = ", ".join(str(tuple(s.shape)) for s in measured.saved if not s.is_state)
    detail = (f"You are off by {diff:+,} bytes = {diff / 4 / batch_size:+g} fp32 values per example. "
              f"Autograd saved these activation storages: {saved}.")
    if got * 4 == truth:  # the right count of values, not of bytes
        act_hint = "Bytes, not elements: an fp32 value takes 4 bytes."
    elif batch_size > 1 and got * batch_size == truth:  # one example's worth
        act_hint = ("Activations grow with the batch: every saved tensor has one row per example, so "
                    "multiply by batch_size.")
    check_equal(got, truth, f'result["activations"] {_where(model, batch_size, optimizer)}', f"{act_hint} {detail}")


def _check_state(nb, model: nn.Sequential, batch_size: int, optimizer: str) -> None:
    truth = model_state_bytes(model, optimizer)  # before the student's function sees (a copy of) the model
    try:
        got = _call(nb, model, batch_size, optimizer, KEYS[:3])
    except _RefusedValidName:
        return False  # no state returned for this name to be wrong: the errors cell grades the refusal
    where = _where(model, batch_size, optimizer)
    for key in ("params", "grads"):
        check_equal(got[key], truth[key], f'result["{key}"] {where}', STATE_HINTS[key])
    check_equal(got["optimizer_state"], truth["optimizer_state"], f'result["optimizer_state"] {where}',
                OPTIMIZER_HINTS[optimizer])
    return True


def _random_cases() -> list[tuple[nn.Sequential, int, str]]:
    """Random stacks, fixed seed: (model, batch size, optimizer)."""
    rng = random.Random(2020)
    cases = []
    for i in range(12):
        in_features, layers = _random_layers(rng)
        model = _build(in_features, layers, seed=200 + i)
        cases.append((model, rng.choice((1, 2, 9, 24)), rng.choice(OPTIMIZERS)))
    return cases


@hidden_test("test_predict_training_memory")
def check_predict_training_memory(nb):
    """The "activations" entry: exactly what autograd saves in the step."""
    # Hand-picked cases, one concept each, every optimizer and a batch of 1 among them.
    for i, (hint, in_features, layers) in enumerate(CASES):
        model = _build(in_features, layers, seed=100 + i)
        _check_activations(nb, model, BATCHES[i % len(BATCHES)], OPTIMIZERS[i % len(OPTIMIZERS)], hint)
    for model, batch_size, optimizer in _random_cases():
        _check_activations(nb, model, batch_size, optimizer, GENERIC_ACT_HINT)


@hidden_test("test_predict_training_memory_model_state")
def check_model_state(nb):
    """"params", "grads" and "optimizer_state" for every optimizer."""
    graded = 0
    for i, (_hint, in_features, layers) in enumerate(CASES):
        model = _build(in_features, layers, seed=100 + i)
        for optimizer in OPTIMIZERS:
            graded += _check_state(nb, model, BATCHES[i % len(BATCHES)], optimizer)
    # One model, every optimizer: only the optimizer state may change.
    model = _build(37, [("L", 53, True), ("R",), ("L", 11, False)], seed=7)
    for optimizer in OPTIMIZERS:
        graded += _check_state(nb, model, 5, optimizer)
    for model, batch_size, optimizer in _random_cases():
        graded += _check_state(nb, model, batch_size, optimizer)
    if not graded:
        raise AssertionError(
            "predict_training_memory raised ValueError for every valid optimizer ('sgd', 'momentum', 'adam'): "
            "only an unknown optimizer raises; return the four parts for these.")


@hidden_test("test_predict_training_memory_errors")
def check_errors(nb):
    """The three optimizer names are accepted; any other raises a ValueError naming it and the allowed ones."""
    model = _build(37, [("L", 11, True)], seed=0)
    allowed = ", ".join(repr(o) for o in OPTIMIZERS)
    for optimizer in OPTIMIZERS:  # refusing a valid name is as wrong as accepting an unknown one
        error = fetch(nb.apply(probes.raised_message, nb.predict_training_memory, _unrunnable(model), 8, optimizer))
        if error is not None and "ValueError" in error["types"]:
            raise AssertionError(
                f"predict_training_memory(model, 8, {optimizer!r}) raised ValueError ({error['message']}): "
                f"{allowed} are the valid optimizers; only other names raise.")
    error = fetch(nb.apply(probes.raised_message, nb.predict_training_memory, _unrunnable(model), 8, "rmsprop"))
    if error is None:
        raise AssertionError(
            f"predict_training_memory(model, 8, 'rmsprop') returned a result: an unknown optimizer should "
            f"raise ValueError naming the bad value and the allowed ones ({allowed}).")
    if "ValueError" not in error["types"]:
        lookup = (" Check the optimizer before using it: a dict lookup of an unknown key raises KeyError."
                  if "KeyError" in error["types"] else "")
        raise AssertionError(
            f"predict_training_memory(model, 8, 'rmsprop') raised {error['types'][0]} ({error['message']}), "
            f"expected a ValueError naming the bad value and the allowed ones ({allowed}).{lookup}")
    unnamed = [name for name in ("rmsprop", *OPTIMIZERS) if name not in error["message"]]
    if unnamed:
        raise AssertionError(
            f"predict_training_memory(model, 8, 'rmsprop') raised ValueError({error['message']!r}), which does "
            f"not name {', '.join(repr(n) for n in unnamed)}: the message names the bad value and the allowed "
            f"ones ({allowed}), so that the caller sees what to pass instead.")
