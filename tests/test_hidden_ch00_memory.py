"""The hidden tests of ch00_memory accept a correct predictor and reject plausible wrong ones, each in the
cell of the property it gets wrong while the other cells still pass (partial credit)."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from contract_tables import Clause, contract_tests
from grader.api import LocalNamespace, checks_for

COPIES = {"sgd": 0, "momentum": 1, "adam": 2}


def _state(model, optimizer, copies=COPIES):
    if optimizer not in copies:
        raise ValueError(f"unknown optimizer {optimizer!r}: expected one of {', '.join(map(repr, copies))}")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"params": params, "grads": params, "optimizer_state": copies[optimizer] * params}


def _saved_values(model, *, linear_outputs_into_relu=False, loss=True, shared_twice=False,
                  leading_relu_counts_x=False, relu_runs_once=False, first_input=True):
    """Fp32 values autograd saves per example; the keywords switch on one misconception each."""
    layers = list(model)
    linears = [m for m in layers if isinstance(m, nn.Linear)]
    first = layers.index(linears[0])
    values = linears[0].in_features if first_input else 0
    if leading_relu_counts_x and first > 0:
        values += linears[0].in_features  # counts x and the ReLU output
    if loss:
        values += linears[-1].out_features  # the target
    width = linears[0].in_features
    for i in range(first, len(layers)):
        layer, nxt = layers[i], layers[i + 1] if i + 1 < len(layers) else None
        prev = layers[i - 1] if i > first else None
        if isinstance(layer, nn.Linear):
            width = layer.out_features
            feeds_relu = isinstance(nxt, nn.ReLU)
            if not feeds_relu and (loss or nxt is not None):
                values += width  # saved by the next Linear, or as the MSE prediction
            elif feeds_relu and linear_outputs_into_relu:
                values += width
        else:
            if relu_runs_once and isinstance(prev, nn.ReLU):
                continue
            values += width  # ReLU saves its own output
            if shared_twice and (nxt is None or isinstance(nxt, nn.Linear)):
                values += width  # the same storage again, as the next consumer's input
    return values


def correct(model, batch_size, optimizer):
    return {**_state(model, optimizer), "activations": 4 * batch_size * _saved_values(model)}


def counts_linear_outputs_too(model, batch_size, optimizer):
    return {**_state(model, optimizer),
            "activations": 4 * batch_size * _saved_values(model, linear_outputs_into_relu=True)}


def forgets_the_loss(model, batch_size, optimizer):
    return {**_state(model, optimizer), "activations": 4 * batch_size * _saved_values(model, loss=False)}


def counts_shared_storage_twice(model, batch_size, optimizer):
    return {**_state(model, optimizer), "activations": 4 * batch_size * _saved_values(model, shared_twice=True)}


def forgets_first_input(model, batch_size, optimizer):
    return {**_state(model, optimizer), "activations": 4 * batch_size * _saved_values(model, first_input=False)}


def leading_relu_saves_x(model, batch_size, optimizer):
    return {**_state(model, optimizer),
            "activations": 4 * batch_size * _saved_values(model, leading_relu_counts_x=True)}


def relu_runs_counted_once(model, batch_size, optimizer):
    return {**_state(model, optimizer), "activations": 4 * batch_size * _saved_values(model, relu_runs_once=True)}


def counts_elements_not_bytes(model, batch_size, optimizer):
    return {**_state(model, optimizer), "activations": batch_size * _saved_values(model)}


def adam_one_copy(model, batch_size, optimizer):
    return {**_state(model, optimizer, {"sgd": 0, "momentum": 1, "adam": 1}),
            "activations": 4 * batch_size * _saved_values(model)}


def momentum_without_state(model, batch_size, optimizer):
    return {**_state(model, optimizer, {"sgd": 0, "momentum": 0, "adam": 2}),
            "activations": 4 * batch_size * _saved_values(model)}


def params_without_biases(model, batch_size, optimizer):
    result = correct(model, batch_size, optimizer)
    weights = sum(m.weight.numel() * 4 for m in model if isinstance(m, nn.Linear))
    return {**result, "params": weights}


def no_value_error(model, batch_size, optimizer):
    params = sum(p.numel() * 4 for p in model.parameters())
    return {"params": params, "grads": params, "optimizer_state": COPIES.get(optimizer, 0) * params,
            "activations": 4 * batch_size * _saved_values(model)}


def returns_a_tuple(model, batch_size, optimizer):
    return tuple(correct(model, batch_size, optimizer).values())


def misses_a_key(model, batch_size, optimizer):
    result = correct(model, batch_size, optimizer)
    result["optimizer"] = result.pop("optimizer_state")
    return result


def returns_a_module(model, batch_size, optimizer):
    return model


def runs_the_step_instead(model, batch_size, optimizer):
    """Measures instead of predicting: right on real models, wrong on the grader's meta copies."""
    from coursekit.steps import measure_training_step

    return {**_state(model, optimizer), "activations": measure_training_step(model, batch_size).activation_bytes}


def materialises_with_to_empty(model, batch_size, optimizer):
    """Makes a copy of the meta model real and measures it."""
    import copy

    from coursekit.steps import measure_training_step

    real = copy.deepcopy(model).to_empty(device="cpu")
    return {**_state(model, optimizer), "activations": measure_training_step(real, batch_size).activation_bytes}


def swaps_in_real_weights(model, batch_size, optimizer):
    """Assigns real parameters to the given model's Linears, then measures it."""
    from coursekit.steps import measure_training_step

    state = _state(model, optimizer)
    for layer in model:
        if isinstance(layer, nn.Linear):
            layer.weight = nn.Parameter(torch.randn(layer.out_features, layer.in_features))
    return {**state, "activations": measure_training_step(model, batch_size).activation_bytes}


def assigns_a_state_dict(model, batch_size, optimizer):
    """load_state_dict(..., assign=True) with real tensors, then measures."""
    from coursekit.steps import measure_training_step

    state = _state(model, optimizer)
    model.load_state_dict({n: torch.randn(p.shape) for n, p in model.named_parameters()}, assign=True)
    return {**state, "activations": measure_training_step(model, batch_size).activation_bytes}


def raises_key_error(model, batch_size, optimizer):
    """Looks the optimizer up without checking it: an unknown one raises KeyError."""
    copies = {"sgd": 0, "momentum": 1, "adam": 2}[optimizer]
    params = sum(p.numel() * 4 for p in model.parameters())
    return {"params": params, "grads": params, "optimizer_state": copies * params,
            "activations": 4 * batch_size * _saved_values(model)}


def error_without_names(model, batch_size, optimizer):
    """Raises a ValueError that names neither the bad value nor the allowed ones."""
    if optimizer not in COPIES:
        raise ValueError("unknown optimizer")
    return correct(model, batch_size, optimizer)


def always_raises_value_error(model, batch_size, optimizer):
    """Only the error path written: every call raises the right ValueError."""
    raise ValueError(f"unknown optimizer {optimizer!r}: expected one of 'sgd', 'momentum', 'adam'")


def activations_for_one_example(model, batch_size, optimizer):
    return {**_state(model, optimizer), "activations": 4 * _saved_values(model)}


def only_checks_the_optimizer(model, batch_size, optimizer):
    """The optimizer check is written, the rest is not yet."""
    if optimizer not in COPIES:
        raise ValueError(f"unknown optimizer {optimizer!r}: expected one of 'sgd', 'momentum', 'adam'")
    raise NotImplementedError


def refuses_momentum(model, batch_size, optimizer):
    """Refuses a valid name: "momentum" raises the unknown-optimizer ValueError."""
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"unknown optimizer {optimizer!r}: expected one of 'sgd', 'momentum', 'adam'")
    return correct(model, batch_size, optimizer)


def activations_as_float(model, batch_size, optimizer):
    """Right number of bytes, as a float (the docstring asks for ints)."""
    return {**_state(model, optimizer), "activations": 4.0 * batch_size * _saved_values(model)}


ACTIVATIONS, STATE, ERRORS = ("test_predict_training_memory", "test_predict_training_memory_model_state",
                              "test_predict_training_memory_errors")
IDS = (ACTIVATIONS, STATE, ERRORS)
RAN = "without running anything"

# Wrong implementations run in-kernel (the autograded wrong answer is in wrong_submissions_ch00_memory.py).
# name: (implementation, {grade_id of each cell it must fail: a phrase its failure message contains});
# every other cell must pass.
WRONG_VARIANTS = {
    "runs_the_step_instead": (runs_the_step_instead, {ACTIVATIONS: RAN, STATE: RAN}),
    "materialises_with_to_empty": (materialises_with_to_empty, {ACTIVATIONS: RAN, STATE: RAN, ERRORS: "RuntimeError"}),
    "swaps_in_real_weights": (swaps_in_real_weights, {ACTIVATIONS: RAN, STATE: RAN}),
    "assigns_a_state_dict": (assigns_a_state_dict, {ACTIVATIONS: RAN, STATE: RAN}),
    "counts_linear_outputs_too": (counts_linear_outputs_too, {ACTIVATIONS: "ReLU"}),
    "forgets_the_loss": (forgets_the_loss, {ACTIVATIONS: "target"}),
    "counts_shared_storage_twice": (counts_shared_storage_twice, {ACTIVATIONS: "counted once"}),
    "forgets_first_input": (forgets_first_input, {ACTIVATIONS: "saves its input x"}),
    "leading_relu_saves_x": (leading_relu_saves_x, {ACTIVATIONS: "before the first Linear"}),
    "relu_runs_counted_once": (relu_runs_counted_once, {ACTIVATIONS: "two ReLUs in a row"}),
    "counts_elements_not_bytes": (counts_elements_not_bytes, {ACTIVATIONS: "Bytes, not elements"}),
    "activations_for_one_example": (activations_for_one_example, {ACTIVATIONS: "multiply by batch_size"}),
    "adam_one_copy": (adam_one_copy, {STATE: "Adam keeps two moments"}),
    "momentum_without_state": (momentum_without_state, {STATE: "velocity"}),
    "params_without_biases": (params_without_biases, {STATE: "biases"}),
    "no_value_error": (no_value_error, {ERRORS: "returned a result"}),
    "raises_key_error": (raises_key_error, {ERRORS: "raised KeyError"}),
    "error_without_names": (error_without_names, {ERRORS: "does not name 'rmsprop', 'sgd', 'momentum', 'adam'"}),
    "always_raises_value_error": (always_raises_value_error,
                                  {ACTIVATIONS: None, STATE: None, ERRORS: "are the valid optimizers"}),
    "only_checks_the_optimizer": (only_checks_the_optimizer, {ACTIVATIONS: None, STATE: None}),
    "returns_a_tuple": (returns_a_tuple, {ACTIVATIONS: "got a tuple", STATE: "got a tuple"}),
    "misses_a_key": (misses_a_key, {STATE: "optimizer_state"}),
    "refuses_momentum": (refuses_momentum, {ERRORS: "are the valid optimizers"}),
    "activations_as_float": (activations_as_float, {ACTIVATIONS: "an int"}),
    "returns_a_module": (returns_a_module, {ACTIVATIONS: "not plain data", STATE: "not plain data",
                                         ERRORS: "returned a result"}),
}


def _run(fn, grade_id):
    checks_for("ch00_memory")[grade_id](LocalNamespace({"predict_training_memory": fn}))


def test_every_grade_id_has_a_check():
    assert sorted(checks_for("ch00_memory")) == sorted(IDS)


@pytest.mark.parametrize("grade_id", IDS)
def test_correct_predictor_passes(grade_id):
    _run(correct, grade_id)


@pytest.mark.parametrize("name", sorted(WRONG_VARIANTS))
def test_wrong_predictor_fails_its_cells_only(name):
    fn, fails = WRONG_VARIANTS[name]
    for grade_id in IDS:
        if grade_id not in fails:
            _run(fn, grade_id)  # partial credit: the properties it gets right still score
            continue
        phrase = fails[grade_id]
        with pytest.raises(AssertionError if phrase else Exception) as info:
            _run(fn, grade_id)
        if phrase:
            assert re.search(phrase, str(info.value)), str(info.value)


def test_missing_function_is_reported():
    for grade_id in IDS:
        with pytest.raises(NameError, match="predict_training_memory"):
            checks_for("ch00_memory")[grade_id](LocalNamespace({}))


# --- the contract, clause by clause (tests/contract_tables.py) -------------------------------------------
CHAPTER = "ch00_memory"
EXERCISE = "predict_training_memory"


def namespace(**overrides) -> LocalNamespace:
    return LocalNamespace({EXERCISE: correct, **overrides})


def _wrong(fn):
    return {EXERCISE: fn}


CONTRACT = [
    Clause(EXERCISE, "The first Linear saves its input x", (ACTIVATIONS,), _wrong(forgets_first_input),
           "saves its input x"),
    Clause(EXERCISE, "The first Linear's output is saved by nobody", (ACTIVATIONS,),
           _wrong(counts_linear_outputs_too), "ReLU"),
    Clause(EXERCISE, "The MSE loss saves the prediction and the target", (ACTIVATIONS,), _wrong(forgets_the_loss),
           "target"),
    Clause(EXERCISE, "each storage counted once", (ACTIVATIONS,), _wrong(counts_shared_storage_twice),
           "counted once"),
    Clause(EXERCISE, "a ReLU *before* the first Linear", (ACTIVATIONS,), _wrong(leading_relu_saves_x),
           "before the first Linear"),
    Clause(EXERCISE, "two ReLUs in a row", (ACTIVATIONS,), _wrong(relu_runs_counted_once), "two ReLUs in a row"),
    Clause(EXERCISE, "Return the four parts in bytes", (ACTIVATIONS,), _wrong(counts_elements_not_bytes),
           "Bytes, not elements"),
    Clause(EXERCISE, "dict of ints (bytes)", (ACTIVATIONS,), _wrong(activations_as_float), "an int"),
    Clause(EXERCISE, "x: (batch_size, in_features of the first Linear)", (ACTIVATIONS,),
           _wrong(activations_for_one_example), "multiply by batch_size"),
    Clause(EXERCISE, "predict from the layers' shapes without running anything", (ACTIVATIONS,),
           _wrong(runs_the_step_instead), RAN),
    Clause(EXERCISE, '"optimizer_state": 0 / 1 / 2 copies of the trainable parameters', (STATE,),
           _wrong(adam_one_copy), "Adam keeps two moments", label="adam-two-moments"),
    Clause(EXERCISE, '"optimizer_state": 0 / 1 / 2 copies of the trainable parameters', (STATE,),
           _wrong(momentum_without_state), "velocity", label="momentum-one-velocity"),
    Clause(EXERCISE, '"params": all parameters', (STATE,), _wrong(params_without_biases), "biases"),
    Clause(EXERCISE, '"optimizer_state": 0 / 1 / 2 copies of the trainable parameters', (STATE,),
           _wrong(misses_a_key), "optimizer_state", label="optimizer-state-key"),
    Clause(EXERCISE, "ValueError: for any other optimizer", (ERRORS,), _wrong(raises_key_error), "KeyError"),
    Clause(EXERCISE, "ValueError: for any other optimizer", (ERRORS,), _wrong(no_value_error),
           "returned a result", label="unknown-optimizer-accepted"),
    Clause(EXERCISE, "naming the bad value and the allowed ones", (ERRORS,), _wrong(error_without_names),
           "does not name"),
    Clause(EXERCISE, "the three names accepted", (ERRORS,), _wrong(refuses_momentum), "are the valid optimizers"),
]

test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
    test_contract_covers_every_graded_cell = contract_tests(CHAPTER, CONTRACT, namespace, checks_for(CHAPTER),
                                                            globals())
