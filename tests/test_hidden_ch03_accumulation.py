"""The hidden tests of chapter 3 accept correct implementations and reject plausible wrong ones.

The implementations here are written independently of solutions/ch03_accumulation.py, so that a
bug shared by the solution and its hidden tests cannot hide. Each graded cell checks one property:
every wrong variant below fails the cell of its mistake, and the ``*_only`` tests show a variant
failing exactly that cell while the exercise's other cells pass. The last tests run the same checks
through the sandbox (``grader.sandbox.judge.run_checks``), as the autograder does.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from grader.api import LocalNamespace, checks_for

from wrong_submissions_ch03_accumulation import WRONG
from sandbox_checks import sandbox_tests

CHAPTER = "ch03_accumulation"
CHECKS = checks_for(CHAPTER)
ACCUMULATE_IDS = ["test_accumulate_gradients", "test_accumulate_gradients_memory", "test_accumulate_gradients_loss",
                  "test_accumulate_gradients_edge_cases"]
TRAIN_IDS = ["test_train_accumulated", "test_train_accumulated_memory", "test_train_accumulated_edge_cases"]
GRADE_IDS = ACCUMULATE_IDS + TRAIN_IDS


# --- correct implementations ------------------------------------------------------------------
def accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size):
    if not isinstance(micro_batch_size, int) or micro_batch_size <= 0:
        raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size!r}")
    n = len(inputs)
    total = torch.zeros(())
    for x, y in zip(torch.split(inputs, micro_batch_size), torch.split(targets, micro_batch_size)):
        loss = loss_fn(model(x), y) * (len(x) / n)
        loss.backward()
        total += loss.detach()
    return total


def accumulate_then_rescale(model, loss_fn, inputs, targets, micro_batch_size):
    """Also correct: sums per-micro-batch losses × n_i and divides every .grad by B at the end."""
    if micro_batch_size < 1 or int(micro_batch_size) != micro_batch_size:
        raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size}")
    n, total = inputs.shape[0], 0.0
    for start in range(0, n, micro_batch_size):
        x, y = inputs[start:start + micro_batch_size], targets[start:start + micro_batch_size]
        loss = loss_fn(model(x), y) * x.shape[0]
        loss.backward()
        total += loss.item()
    for p in model.parameters():
        if p.grad is not None:
            p.grad /= n
    return torch.tensor(total / n)


def make_train(accumulate=None, zero=True, cycle=True, as_float=True, zero_after=False, empty_ok=False,
               indexing=False, at_least_one=False):
    def train_accumulated(model, optimizer, loss_fn, loader, micro_batch_size, steps):
        acc = accumulate or NS["accumulate_gradients"]

        def batches():
            if indexing:  # a list is indexable; a DataLoader-like iterable is not
                for i in range(max(steps, 1)):
                    yield loader[i % len(loader)]
                return
            while True:
                empty = True
                for batch in loader:
                    empty = False
                    yield batch
                if empty and not empty_ok:
                    raise ValueError("the loader yielded no batches")
                if empty or not cycle:
                    return

        losses = []
        for x, y in batches():
            if len(losses) >= steps and not (at_least_one and not losses):
                break
            if zero:
                optimizer.zero_grad()
            loss = acc(model, loss_fn, x, y, micro_batch_size)
            if zero_after:
                optimizer.zero_grad()
            optimizer.step()
            losses.append(loss.item() if as_float else loss)
        return losses
    return train_accumulated


def train_other(model, optimizer, loss_fn, loader, micro_batch_size, steps):
    """Also correct, written differently: itertools-free epochs with an explicit iterator, losses via item()."""
    out, it = [], None
    while len(out) < steps:
        batch = next(it, None) if it is not None else None
        if batch is None:
            it = iter(loader)
            batch = next(it, None)
            if batch is None:
                raise ValueError("empty loader")
        inputs, targets = batch
        optimizer.zero_grad(set_to_none=False)
        out.append(NS["accumulate_gradients"](model, loss_fn, inputs, targets, micro_batch_size).item())
        optimizer.step()
    return out


NS: dict = {}


def namespace(**overrides) -> LocalNamespace:
    NS.clear()
    NS.update(accumulate_gradients=accumulate_gradients, train_accumulated=make_train())
    NS.update(overrides)
    return LocalNamespace(NS)


def test_every_grade_id_has_a_check():
    assert sorted(CHECKS) == sorted(GRADE_IDS)


@pytest.mark.parametrize("grade_id", GRADE_IDS)
def test_correct_implementation_passes(grade_id):
    CHECKS[grade_id](namespace())


@pytest.mark.parametrize("grade_id", GRADE_IDS)
def test_other_correct_implementations_pass(grade_id):
    CHECKS[grade_id](namespace(accumulate_gradients=accumulate_then_rescale, train_accumulated=train_other))


def _fails_only(ns, grade_id: str, ids: list[str], message: str | None = None):
    """``grade_id`` fails (with ``message`` when given) and every other cell of the exercise passes."""
    _fails_exactly(ns, {grade_id: message}, ids)


def _fails_exactly(ns, failing: dict[str, str | None], ids: list[str]):
    """Each cell of ``failing`` fails (with its message when given) and every other cell of the exercise passes."""
    for grade_id, message in failing.items():
        with pytest.raises(AssertionError, match=message):
            CHECKS[grade_id](ns)
    for other in ids:
        if other not in failing:
            CHECKS[other](ns)


# --- wrong accumulate_gradients ------------------------------------------------------------------
def make_accumulate(weight="size", zero_inside=False, whole_batch=False, detach=True, scale_loss=1.0,
                    drop_remainder=False, grads_for_all=False, validate=True, as_float=False, sum_first=False,
                    even_split=False):
    def acc(model, loss_fn, inputs, targets, micro_batch_size):
        if validate == "lt1" and micro_batch_size < 1:  # forgets that 2.5 is not a size
            raise ValueError("micro_batch_size must be positive")
        if validate is True and (not isinstance(micro_batch_size, int) or micro_batch_size < 1):
            raise ValueError("micro_batch_size must be a positive integer")
        m = max(1, micro_batch_size)
        n = len(inputs)
        if grads_for_all:
            for p in model.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        if even_split:  # pieces of at most m samples, but not the slices [0:m], [m:2m], ...
            bounds = [(int(t[0]), int(t[-1]) + 1) for t in torch.arange(n).tensor_split(math.ceil(n / m))]
        else:
            bounds = [(a, min(a + m, n)) for a in range(0, n - n % m if drop_remainder and n > m else n, m)]
        out = model(inputs) if whole_batch else None
        total, pending = 0.0, []
        for a, b in bounds:
            if zero_inside:
                model.zero_grad()
            y = targets[a:b]
            pred = out[a:b] if whole_batch else model(inputs[a:b])
            w = {"size": len(y) / n, "equal": 1 / len(bounds), "one": 1.0}[weight]
            loss = loss_fn(pred, y) * w
            if sum_first:
                pending.append(loss)
            else:
                loss.backward(retain_graph=whole_batch)
            total = total + (loss.detach() if detach else loss)
        if sum_first:
            sum(pending).backward()
        total = total * scale_loss
        return total.item() if as_float else total
    return acc


@pytest.mark.parametrize("wrong, grade_id, message", [
    (make_accumulate(weight="equal"), "test_accumulate_gradients", "averaged with equal weights"),
    (make_accumulate(weight="one"), "test_accumulate_gradients", "k times too large"),
    (make_accumulate(zero_inside=True), "test_accumulate_gradients", "only the last micro-batch"),
    (make_accumulate(drop_remainder=True), "test_accumulate_gradients", "last micro-batch .* is missing"),
    (make_accumulate(grads_for_all=True), "test_accumulate_gradients", "frozen parameter"),
    (make_accumulate(whole_batch=True), "test_accumulate_gradients_memory", "called on 37 samples at once"),
    (make_accumulate(even_split=True), "test_accumulate_gradients_memory", "which samples went in together"),
    (make_accumulate(sum_first=True), "test_accumulate_gradients_memory", "summing the micro-batch losses"),
    (make_accumulate(detach=False), "test_accumulate_gradients_loss", "still attached"),
    (make_accumulate(scale_loss=37.0), "test_accumulate_gradients_loss", "B = 37 times the mean"),
    (make_accumulate(scale_loss=2.0), "test_accumulate_gradients_loss", "the returned loss differs"),
    (make_accumulate(weight="one"), "test_accumulate_gradients_loss", "the sum of the micro-batch mean losses"),
    (make_accumulate(as_float=True), "test_accumulate_gradients_loss", "is a float, expected a detached 0-dim"),
    (make_accumulate(validate=False), "test_accumulate_gradients_edge_cases", "should raise ValueError"),
    (make_accumulate(validate="lt1"), "test_accumulate_gradients_edge_cases", "micro_batch_size=2.5"),
])
def test_accumulate_gradients_rejects(wrong, grade_id, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS[grade_id](namespace(accumulate_gradients=wrong))


# A mistake that fails the memory, loss or edge-case cell alone (the whole batch at once, an even split, one
# backward of the summed losses, even on all but one documented size; a loss B times too large, attached or a float;
# a micro-batch size of 2.5 accepted; the plain average returned on large batches) is a clause of CONTRACT below,
# which runs every other cell of the exercise then and checks the same message.
@pytest.mark.parametrize("wrong, grade_id, message", [
    (make_accumulate(zero_inside=True), "test_accumulate_gradients", "only the last micro-batch"),
])
def test_accumulate_gradients_mistake_fails_only_its_cell(wrong, grade_id, message):
    _fails_only(namespace(accumulate_gradients=wrong), grade_id, ACCUMULATE_IDS, message)


def step_inside(model, loss_fn, inputs, targets, micro_batch_size):
    """Right gradients, then an SGD step on the parameters inside the function."""
    loss = accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size)
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.1 * p.grad
    return loss


def bypass_model(model, loss_fn, inputs, targets, micro_batch_size):
    """Forwards the whole batch through the wrapped model's inner module."""
    if not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size!r}")
    inner = getattr(model, "model", model)
    loss = loss_fn(inner(inputs), targets)
    loss.backward()
    return loss.detach()


def test_accumulate_gradients_rejects_stepping_inside():
    with pytest.raises(AssertionError, match="optimizer step belongs to the training loop"):
        CHECKS["test_accumulate_gradients"](namespace(accumulate_gradients=step_inside))


def test_bypassing_the_model_fails_memory():
    """Forwarding the whole batch through the wrapped model's inner module: pos gets no gradient."""
    with pytest.raises(AssertionError, match="pos received no gradient"):
        CHECKS["test_accumulate_gradients_memory"](namespace(accumulate_gradients=bypass_model))


# --- honest only where it is not measured, or skipping the work where it is ----------------------
def sum_first_except(sizes):
    """Micro-batches with the right weights, all losses summed before one backward(), except on a batch of one of
    ``sizes`` samples (a size the text once documented as the measured one)."""
    def acc(model, loss_fn, inputs, targets, micro_batch_size):
        if not isinstance(micro_batch_size, int) or micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size!r}")
        if len(inputs) in sizes:
            return accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size)
        return make_accumulate(sum_first=True)(model, loss_fn, inputs, targets, micro_batch_size)
    return acc


def nothing_when_large(model, loss_fn, inputs, targets, micro_batch_size):
    """Correct on small batches; on a large one (where memory is read from outside) no gradient at all."""
    if len(inputs) >= 256:
        with torch.no_grad():
            return loss_fn(model(inputs[:micro_batch_size]), targets[:micro_batch_size])
    return accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size)


def first_micro_batch_when_large(model, loss_fn, inputs, targets, micro_batch_size):
    """Correct on small batches; on a large one, the gradient of its first micro-batch only."""
    if len(inputs) >= 256:
        return accumulate_gradients(model, loss_fn, inputs[:micro_batch_size], targets[:micro_batch_size],
                                    micro_batch_size)
    return accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size)


@pytest.mark.parametrize("wrong, message", [
    (nothing_when_large, "has no .grad after that call"),
    (first_micro_batch_when_large, "the gradient of .* after that call differs"),
])
def test_accumulate_gradients_wrong_when_large_fails_memory_and_values(wrong, message):
    """The measured call's gradients are checked; the values and loss cells' drawn cases (B 100-1000 and 768-1000)
    see the same wrong gradient and loss."""
    _fails_exactly(namespace(accumulate_gradients=wrong), {
        "test_accumulate_gradients_memory": message,
        "test_accumulate_gradients": "sizes and seeds drawn at grading time",
        "test_accumulate_gradients_loss": "sizes and seeds drawn at grading time"}, ACCUMULATE_IDS)


# --- a known mistake only on batches larger than the fixed ones ------------------------------------
def when_large(wrong, threshold: int = 100, loss: str | None = None):
    """Correct below ``threshold`` samples, ``wrong`` on larger batches (whose gradient it leaves); with ``loss``,
    the loss returned on larger batches is that one instead: "right" (the full-batch mean), "average" (the plain
    average of the micro-batch means) or "double" (twice the mean)."""
    def acc(model, loss_fn, inputs, targets, micro_batch_size):
        if len(inputs) < threshold:
            return accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size)
        out = wrong(model, loss_fn, inputs, targets, micro_batch_size)
        if loss is not None:
            with torch.no_grad():
                means = [(loss_fn(model(x), y), len(x)) for x, y in zip(inputs.split(micro_batch_size),
                                                                         targets.split(micro_batch_size))]
            right = sum(v * k for v, k in means) / len(inputs)
            out = {"right": right, "average": sum(v for v, _ in means) / len(means), "double": 2 * right}[loss]
        return out
    return acc


@pytest.mark.parametrize("threshold", [100, 768])
@pytest.mark.parametrize("wrong, message", [
    (make_accumulate(weight="equal"), "averaged with equal weights"),
    (make_accumulate(weight="one"), "k times too large"),
    (make_accumulate(drop_remainder=True), "last micro-batch .* is missing"),
    (make_accumulate(zero_inside=True), "only the last micro-batch"),
])
def test_weighting_mistake_on_large_batches_fails_values(wrong, message, threshold):
    """Right on the fixed batches of 37, a known weighting mistake from ``threshold`` samples on (the memory cell
    accepts weighting mistakes): the values cell's drawn cases fail it; the returned loss is the right one, so only
    the values cell fails."""
    ns = namespace(accumulate_gradients=when_large(wrong, threshold, loss="right"))
    _fails_only(ns, "test_accumulate_gradients", ACCUMULATE_IDS,
                f"sizes and seeds drawn at grading time.*{message}")


def test_equal_weights_on_large_batches_fails_values_and_loss():
    """The red-team submission: equal weights 1/k (and their plain-average loss) from 100 samples on."""
    _fails_exactly(namespace(accumulate_gradients=when_large(make_accumulate(weight="equal"))), {
        "test_accumulate_gradients": "drawn at grading time.*averaged with equal weights",
        "test_accumulate_gradients_loss": "drawn at grading time.*plain average"}, ACCUMULATE_IDS)


@pytest.mark.parametrize("loss, message", [("double", "the returned loss differs")])  # "average": in CONTRACT
def test_loss_mistake_on_large_batches_fails_only_loss(loss, message):
    """Right gradients everywhere; a wrong returned loss from 100 samples on."""
    ns = namespace(accumulate_gradients=when_large(accumulate_gradients, loss=loss))
    _fails_only(ns, "test_accumulate_gradients_loss", ACCUMULATE_IDS, f"drawn at grading time.*{message}")


# --- wrong train_accumulated ---------------------------------------------------------------------
def train_stepping_per_micro_batch(model, optimizer, loss_fn, loader, micro_batch_size, steps):
    losses, batches = [], list(loader)
    if not batches:
        raise ValueError("empty loader")
    for step in range(steps):
        x, y = batches[step % len(batches)]
        total = 0.0
        for a in range(0, len(x), micro_batch_size):
            optimizer.zero_grad()
            loss = loss_fn(model(x[a:a + micro_batch_size]), y[a:a + micro_batch_size])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(x[a:a + micro_batch_size]) / len(x)
        losses.append(total)
    return losses


def train_zeroing_per_micro_batch(model, optimizer, loss_fn, loader, micro_batch_size, steps):
    """Its own micro-batch loop, with zero_grad() inside it: only the last micro-batch's gradient is left."""
    losses, batches = [], list(loader)
    if not batches:
        raise ValueError("empty loader")
    for step in range(steps):
        x, y = batches[step % len(batches)]
        total = 0.0
        for a in range(0, len(x), micro_batch_size):
            optimizer.zero_grad()
            xb, yb = x[a:a + micro_batch_size], y[a:a + micro_batch_size]
            loss = loss_fn(model(xb), yb) * (len(xb) / len(x))
            loss.backward()
            total += loss.item()
        optimizer.step()
        losses.append(total)
    return losses


def train_full_batch(model, optimizer, loss_fn, loader, micro_batch_size, steps):
    return make_train(accumulate=lambda m, f, x, y, _: accumulate_gradients(m, f, x, y, len(x)))(
        model, optimizer, loss_fn, loader, micro_batch_size, steps)


@pytest.mark.parametrize("wrong, grade_id, message", [
    (make_train(zero=False), "test_train_accumulated", "never zeroed"),
    (make_train(zero_after=True), "test_train_accumulated", "did not change"),
    (train_stepping_per_micro_batch, "test_train_accumulated", "once per micro-batch"),
    (train_zeroing_per_micro_batch, "test_train_accumulated", "once per batch, before its first micro-batch, not "
                                                              "per micro-batch"),
    (train_full_batch, "test_train_accumulated_memory", "called on 37 samples at once"),
    (make_train(zero_after=True), "test_train_accumulated_memory", "no parameter changed"),
    (make_train(cycle=False), "test_train_accumulated_edge_cases", "losses for steps=5"),
    (make_train(as_float=False), "test_train_accumulated_edge_cases", "expected Python floats"),
    (make_train(indexing=True), "test_train_accumulated_edge_cases", "without len\\(\\) or indexing"),
    (make_train(empty_ok=True), "test_train_accumulated_edge_cases", "empty loader"),
    (make_train(at_least_one=True), "test_train_accumulated_edge_cases", "zero steps"),
])
def test_train_accumulated_rejects(wrong, grade_id, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS[grade_id](namespace(train_accumulated=wrong))


# A loop that fails the memory or edge-case cell alone (the whole batch at once, even only on plain models; no new
# epoch, tensors for floats, indexing the loader, an empty loader or zero steps accepted) is a clause of CONTRACT
# below, which runs every other cell of the exercise then and checks the same message.
@pytest.mark.parametrize("wrong, grade_id, message", [
    (make_train(zero=False), "test_train_accumulated", "never zeroed"),
    (train_stepping_per_micro_batch, "test_train_accumulated", "once per micro-batch"),
    (train_zeroing_per_micro_batch, "test_train_accumulated", "not per micro-batch"),
])
def test_train_accumulated_mistake_fails_only_its_cell(wrong, grade_id, message):
    _fails_only(namespace(train_accumulated=wrong), grade_id, TRAIN_IDS, message)


def train_whole_batch_on_sequential(model, optimizer, loss_fn, loader, micro_batch_size, steps):
    """Micro-batches only on a model that is not an nn.Sequential (the grader's refusing wrapper); one forward of
    the whole batch on every plain model."""
    if isinstance(model, nn.Sequential):
        return train_full_batch(model, optimizer, loss_fn, loader, micro_batch_size, steps)
    return make_train()(model, optimizer, loss_fn, loader, micro_batch_size, steps)


def train_no_step_when_large(model, optimizer, loss_fn, loader, micro_batch_size, steps):
    """Correct on small batches; on a large one it accumulates the first micro-batch only, then steps."""
    def acc(m, f, x, y, micro):
        if len(x) >= 256:
            return accumulate_gradients(m, f, x[:micro], y[:micro], micro)
        return accumulate_gradients(m, f, x, y, micro)
    return make_train(accumulate=acc)(model, optimizer, loss_fn, loader, micro_batch_size, steps)


def test_train_wrong_when_large_fails_memory_and_values():
    """The measured step's parameters are checked; the values cell's drawn cases see the same wrong step."""
    _fails_exactly(namespace(train_accumulated=train_no_step_when_large), {
        "test_train_accumulated_memory": "the update of parameter .* by the step differs",
        "test_train_accumulated": "sizes and seeds drawn at grading time"}, TRAIN_IDS)


def train_when_large(wrong, threshold: int = 100):
    """The right loop on batches below ``threshold`` samples, ``wrong``'s on larger ones."""
    def train_accumulated(model, optimizer, loss_fn, loader, micro_batch_size, steps):
        right, losses = make_train(), []
        batches, it = [], iter(loader)
        while len(batches) < steps:
            try:
                batches.append(next(it))
            except StopIteration:
                it = iter(loader)
                if not batches:
                    raise ValueError("empty loader") from None
        for x, y in batches:
            loop = wrong if len(x) >= threshold else right
            losses += loop(model, optimizer, loss_fn, [(x, y)], micro_batch_size, 1)
        return losses
    return train_accumulated


@pytest.mark.parametrize("threshold", [100, 768])
@pytest.mark.parametrize("wrong, message", [
    (train_stepping_per_micro_batch, "once per micro-batch"),
    (train_zeroing_per_micro_batch, "not per micro-batch"),
])
def test_train_loop_mistake_on_large_batches_fails_only_values(wrong, message, threshold):
    """The right loop on the fixed batches (at most 37 samples), a known wrong loop from ``threshold`` samples on
    (the memory cell accepts known wrong loops on the right micro-batches): the values cell's drawn cases fail it."""
    # From 768 on, a drawn loader may mix batches of both kinds: no single known mistake is named then.
    _fails_only(namespace(train_accumulated=train_when_large(wrong, threshold)), "test_train_accumulated", TRAIN_IDS,
                "sizes and seeds drawn at grading time" + (f".*{message}" if threshold == 100 else ""))


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(CHAPTER, WRONG)


# --- the contract table: each property the text states, the cell that grades it, a wrong answer that breaks it --
from contract_tables import Clause, contract_tests  # noqa: E402


def refuse_large_micro_batches(model, loss_fn, inputs, targets, micro_batch_size):
    """Right for m < B; refuses a micro-batch size of the whole batch or more (the text says: one forward)."""
    if isinstance(micro_batch_size, int) and micro_batch_size >= len(inputs):
        raise ValueError(f"micro_batch_size must be smaller than the batch, got {micro_batch_size}")
    return accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size)


def train_loss_after_step(model, optimizer, loss_fn, loader, micro_batch_size, steps):
    """Steps right, but logs each batch's loss recomputed after its step."""
    losses, it = [], None
    for _ in range(steps):
        batch = next(it, None) if it is not None else None
        if batch is None:
            it = iter(loader)
            batch = next(it, None)
            if batch is None:
                raise ValueError("empty loader")
        x, y = batch
        optimizer.zero_grad()
        NS["accumulate_gradients"](model, loss_fn, x, y, micro_batch_size)
        optimizer.step()
        with torch.no_grad():
            losses.append(sum(loss_fn(model(a), b).item() * len(a) for a, b in
                              zip(x.split(micro_batch_size), y.split(micro_batch_size))) / len(x))
    return losses


_A, _T = "accumulate_gradients", "train_accumulated"
_VALUES, _MEM, _LOSS, _EDGE = ACCUMULATE_IDS
_TVALUES, _TMEM, _TEDGE = TRAIN_IDS
CONTRACT = [
    Clause(_A, "The weights are $n_i / B$, not $1/k$", (_VALUES,), {_A: make_accumulate(weight="equal")},
           "averaged with equal weights"),
    Clause(_A, "The weights are $n_i / B$, not $1/k$", (_VALUES,),
           {_A: when_large(make_accumulate(weight="equal"))}, "drawn at grading time.*equal weights",
           label="equal-weights-on-large-batches"),
    Clause(_A, "On return it holds the gradient of the full-batch mean loss", (_VALUES,),
           {_A: make_accumulate(weight="one")}, "k times too large"),
    Clause(_A, "backward() **adds** into .grad, it does not overwrite", (_VALUES,),
           {_A: make_accumulate(zero_inside=True)}, "only the last micro-batch"),
    Clause(_A, "the last one may be smaller", (_VALUES,), {_A: make_accumulate(drop_remainder=True)},
           "last micro-batch .* is missing"),
    Clause(_A, "frozen parameters (requires_grad=False) get no gradient", (_VALUES,),
           {_A: make_accumulate(grads_for_all=True)}, "frozen parameter"),
    Clause(_A, "no parameter changes (stepping is the training loop's job)", (_VALUES,), {_A: step_inside},
           "optimizer step belongs to the training loop"),
    Clause(_A, "never on the whole batch (unless it is that small)", (_MEM,), {_A: make_accumulate(whole_batch=True)},
           "called on 37 samples at once"),
    Clause(_A, "called on slices of at most micro_batch_size samples", (_MEM,), {_A: bypass_model},
           "pos received no gradient", label="bypassing-the-model"),
    Clause(_A, "The micro-batches are inputs[0:m], inputs[m:2m], ...", (_MEM,), {_A: make_accumulate(even_split=True)},
           "which samples went in together"),
    Clause(_A, "Call backward() per micro-batch", (_MEM,), {_A: make_accumulate(sum_first=True)},
           "summing the micro-batch losses"),
    Clause(_A, "what your process holds, read from outside it, must stay under a quarter of the whole batch's "
               "activations", (_MEM,), {_A: sum_first_except({1024})}, "summing the micro-batch losses"),
    Clause(_A, "Returns: The full-batch mean loss, a detached 0-dim tensor", (_LOSS,),
           {_A: make_accumulate(detach=False)}, "still attached"),
    Clause(_A, "Returns: The full-batch mean loss, a detached 0-dim tensor", (_LOSS,),
           {_A: make_accumulate(as_float=True)}, "is a float, expected a detached 0-dim tensor", label="loss-as-float"),
    Clause(_A, "The full-batch mean loss", (_LOSS,), {_A: make_accumulate(scale_loss=37.0)}, "B = 37 times the mean"),
    Clause(_A, "The full-batch mean loss", (_LOSS,), {_A: when_large(accumulate_gradients, loss="average")},
           "drawn at grading time.*plain average", label="plain-average-loss-on-large-batches"),
    Clause(_A, "m >= B means one forward of the whole batch", (_EDGE,), {_A: refuse_large_micro_batches},
           "m >= B is allowed"),
    Clause(_A, "a positive int m; anything else raises", (_EDGE,), {_A: make_accumulate(validate=False)},
           "should raise ValueError"),
    Clause(_A, "a positive int m; anything else raises", (_EDGE,), {_A: make_accumulate(validate="lt1")},
           "micro_batch_size=2.5", label="fractional-micro-batch"),
    Clause(_T, "Per step: zero the gradients", (_TVALUES,), {_T: make_train(zero=False)}, "never zeroed"),
    Clause(_T, "zero the gradients, accumulate_gradients on the next batch, optimizer.step()", (_TVALUES,),
           {_T: make_train(zero_after=True)}, "did not change"),
    Clause(_T, "Train for steps optimizer steps, one batch per step", (_TVALUES,),
           {_T: train_stepping_per_micro_batch}, "once per micro-batch"),
    Clause(_T, "each accumulated over micro-batches", (_TVALUES,), {_T: train_zeroing_per_micro_batch},
           "not per micro-batch"),
    Clause(_T, "(each computed before its step)", (_TVALUES,), {_T: train_loss_after_step}, "loss"),
    Clause(_T, "model, loss_fn, micro_batch_size: as in accumulate_gradients", (_TMEM,), {_T: train_full_batch},
           "called on 37 samples at once"),
    Clause(_T, "what your process holds while it runs, read from outside it, must stay under a quarter",
           (_TMEM,), {_T: train_whole_batch_on_sequential}, "while it ran, your process grew by"),
    Clause(_T, "it is started again, like a new epoch", (_TEDGE,), {_T: make_train(cycle=False)}, "losses for steps=5"),
    Clause(_T, "as Python floats", (_TEDGE,), {_T: make_train(as_float=False)}, "expected Python floats"),
    Clause(_T, "a re-iterable of (inputs, targets) batches (a list, a DataLoader)", (_TEDGE,),
           {_T: make_train(indexing=True)}, "without len\\(\\) or indexing"),
    Clause(_T, "an empty loader raises ValueError", (_TEDGE,), {_T: make_train(empty_ok=True)}, "empty loader"),
    Clause(_T, "The list of the steps full-batch mean losses", (_TEDGE,), {_T: make_train(at_least_one=True)},
           "zero steps"),
]

test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
    test_contract_covers_every_graded_cell = contract_tests(CHAPTER, CONTRACT, namespace, CHECKS, globals())
