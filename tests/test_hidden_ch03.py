"""The hidden tests of chapter 3 accept correct implementations and reject plausible wrong ones.

The implementations here are written independently of solutions/ch03_accumulation.py, so that a
bug shared by the solution and its hidden tests cannot hide. The last tests run the same checks
through the sandbox (``grader.sandbox.judge.run_checks``), as the autograder does.
"""
from __future__ import annotations

import pytest
import torch

from grader.api import LocalNamespace, checks_for

from wrong_submissions_ch03 import WRONG
from sandbox_checks import sandbox_tests

CHAPTER = "ch03_accumulation"
CHECKS = checks_for(CHAPTER)
GRADE_IDS = ["test_accumulate_gradients", "test_train_accumulated"]


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
    if micro_batch_size < 1:
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


def make_train(accumulate=None, zero=True, cycle=True, as_float=True, zero_after=False):
    def train_accumulated(model, optimizer, loss_fn, loader, micro_batch_size, steps):
        acc = accumulate or NS["accumulate_gradients"]

        def batches():
            while True:
                empty = True
                for batch in loader:
                    empty = False
                    yield batch
                if empty or not cycle:
                    return

        losses = []
        for _, (x, y) in zip(range(steps), batches()):
            if zero:
                optimizer.zero_grad()
            loss = acc(model, loss_fn, x, y, micro_batch_size)
            if zero_after:
                optimizer.zero_grad()
            optimizer.step()
            losses.append(loss.item() if as_float else loss)
        return losses
    return train_accumulated


NS: dict = {}


def namespace(**overrides) -> LocalNamespace:
    NS.clear()
    NS.update(accumulate_gradients=accumulate_gradients, train_accumulated=make_train())
    NS.update(overrides)
    return LocalNamespace(NS)


def test_every_grade_id_has_a_check():
    assert sorted(CHECKS) == GRADE_IDS


def test_correct_implementation_passes():
    ns = namespace()
    for grade_id in GRADE_IDS:
        CHECKS[grade_id](ns)


def test_other_correct_implementations_pass():
    ns = namespace(accumulate_gradients=accumulate_then_rescale)
    for grade_id in GRADE_IDS:
        CHECKS[grade_id](ns)


# --- wrong accumulate_gradients ------------------------------------------------------------------
def make_accumulate(weight="size", zero_inside=False, whole_batch=False, detach=True, scale_loss=1.0,
                    drop_remainder=False, grads_for_all=False, validate=True, as_float=False):
    def acc(model, loss_fn, inputs, targets, micro_batch_size):
        if validate and micro_batch_size < 1:
            raise ValueError("micro_batch_size must be a positive integer")
        m = max(1, micro_batch_size)
        n = len(inputs)
        if grads_for_all:
            for p in model.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        starts = list(range(0, n - n % m if drop_remainder else n, m))
        out = model(inputs) if whole_batch else None
        total = 0.0
        for a in starts:
            if zero_inside:
                model.zero_grad()
            y = targets[a:a + m]
            pred = out[a:a + m] if whole_batch else model(inputs[a:a + m])
            w = {"size": len(y) / n, "equal": 1 / len(starts), "one": 1.0}[weight]
            loss = loss_fn(pred, y) * w
            loss.backward(retain_graph=whole_batch)
            total = total + (loss.detach() if detach else loss)
        total = total * scale_loss
        return total.item() if as_float else total
    return acc


@pytest.mark.parametrize("wrong, message", [
    (make_accumulate(weight="equal"), "averaged with equal weights"),
    (make_accumulate(weight="one"), "k times too large"),
    (make_accumulate(zero_inside=True), "only the last micro-batch"),
    (make_accumulate(whole_batch=True), "called on 37 samples at once"),
    (make_accumulate(drop_remainder=True), "last micro-batch .* is missing"),
    (make_accumulate(grads_for_all=True), "frozen parameter"),
    (make_accumulate(detach=False), "still attached"),
    (make_accumulate(scale_loss=37.0), "the returned loss differs"),
    (make_accumulate(as_float=True), "expected a scalar tensor"),
    (make_accumulate(validate=False), "ValueError"),
])
def test_accumulate_gradients_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_accumulate_gradients"](namespace(accumulate_gradients=wrong))


def test_accumulate_gradients_rejects_stepping_inside():
    def acc(model, loss_fn, inputs, targets, micro_batch_size):
        loss = accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size)
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= 0.1 * p.grad
        return loss

    with pytest.raises(AssertionError, match="optimizer step belongs to the training loop"):
        CHECKS["test_accumulate_gradients"](namespace(accumulate_gradients=acc))


# --- wrong train_accumulated ---------------------------------------------------------------------
def train_stepping_per_micro_batch(model, optimizer, loss_fn, loader, micro_batch_size, steps):
    losses, batches = [], list(loader)
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


def train_full_batch(model, optimizer, loss_fn, loader, micro_batch_size, steps):
    return make_train(accumulate=lambda m, f, x, y, _: accumulate_gradients(m, f, x, y, len(x)))(
        model, optimizer, loss_fn, loader, micro_batch_size, steps)


@pytest.mark.parametrize("wrong, message", [
    (make_train(zero=False), "later steps are not"),
    (make_train(zero_after=True), "later steps are not"),
    (make_train(cycle=False), "losses for steps=5"),
    (make_train(as_float=False), "expected Python floats"),
    (train_stepping_per_micro_batch, "the loss of step 1"),
    (train_full_batch, "called on 37 samples at once"),
])
def test_train_accumulated_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_train_accumulated"](namespace(train_accumulated=wrong))


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(CHAPTER, WRONG)
