"""The hidden tests of chapter 7 accept correct implementations and reject plausible wrong ones.

The implementations here were written from the student notebook's text (docstrings and prose)
alone, in a different style from solutions/ch07_local_loss.py (einsum and eye instead of matmul
and one_hot, zeroing gradients after the step, a memoised recursion for the schedules), so that a
bug shared by the solution and its hidden tests cannot hide. The last tests run the same checks
through the sandbox, as the autograder does.
"""
from __future__ import annotations

import functools
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

from grader.api import LocalNamespace, checks_for
from grader.hidden import ch07_local_loss as ch07
from grader.notebooks import grade_id, read_source
from grader.resources import Meter
from grader.sandbox import judge

from wrong_submissions_ch07_local_loss import MEMORY_WRONG, SIZE_SWITCH_WRONG, WRONG
from contract_tables import Clause, contract_tests
from sandbox_checks import LIMITS, program, sandbox_tests

CHAPTER = "ch07_local_loss"
CHECKS = checks_for(CHAPTER)
GRADE_IDS = {
    "similarity_matrix": ["test_similarity_matrix_values", "test_similarity_matrix_conv",
                          "test_similarity_matrix_edge_cases"],
    "predsim_loss": ["test_predsim_loss_values", "test_predsim_loss_conv", "test_predsim_loss_edge_cases"],
    "local_training_step": ["test_local_training_step_values", "test_local_training_step_detach",
                            "test_local_training_step_dropout", "test_local_training_step_returns",
                            "test_local_training_step_memory"],
    "bp_schedule": ["test_bp_schedule_values", "test_bp_schedule_errors"],
    "dgl_schedule": ["test_dgl_schedule_values", "test_dgl_schedule_errors"],
}


# --- a second correct implementation of every exercise -----------------------------------------------
def similarity_matrix(h):
    if h.ndim < 2:
        raise ValueError("h must be a batch (B, ...)")
    n = h.shape[0]
    if h.ndim == 4 and h.shape[1] > 3 and h.shape[2] * h.shape[3] > 1:
        rows = torch.std(h.reshape(n, h.shape[1], -1), dim=-1)
    else:
        rows = h.reshape(n, -1)
    centred = rows - rows.mean(-1, keepdim=True)
    unit = centred / (torch.linalg.vector_norm(centred, dim=-1, keepdim=True) + 1e-8)
    return torch.einsum("id,jd->ij", unit, unit).clamp(min=-1, max=1)


def predsim_loss(h, y, sim_head, pred_head, num_classes, beta=0.99):
    if not (0 <= beta <= 1):
        raise ValueError("beta must be in [0, 1]")
    if tuple(y.shape) != (h.shape[0],):
        raise ValueError("one label per example")
    onehot = torch.eye(num_classes, dtype=h.dtype)[y]
    l_sim = ((NS["similarity_matrix"](sim_head(h)) - NS["similarity_matrix"](onehot)) ** 2).mean()
    l_pred = F.nll_loss(F.log_softmax(pred_head(h.reshape(len(h), -1)), dim=-1), y)
    return beta * l_sim + (1 - beta) * l_pred


def local_training_step(blocks, heads, optimizers, x, y):
    k = len(blocks)
    if k == 0 or len(heads) != k or len(optimizers) != k:
        raise ValueError("one head and one optimizer per block")
    values = []
    feed = x.detach()
    for j in range(k):
        h, out = blocks[j](feed)
        loss = heads[j](h, y)
        torch.autograd.backward(loss)
        optimizers[j].step()
        optimizers[j].zero_grad(set_to_none=True)  # after the step: the next call starts clean
        values.append(float(loss.detach()))
        feed = out.detach()
    return values


def _check_durations(fwd, bwd, n_batches):
    if type(n_batches) is not int or n_batches <= 0:
        raise ValueError("n_batches")
    if not fwd or len(fwd) != len(bwd) or any(d <= 0 for d in list(fwd) + list(bwd)):
        raise ValueError("durations")


def bp_schedule(fwd, bwd, n_batches):
    _check_durations(fwd, bwd, n_batches)
    K = len(fwd)

    @functools.lru_cache(maxsize=None)
    def f_start(k, t):
        waits = []
        if k:
            waits.append(f_start(k - 1, t) + fwd[k - 1])
        if t:
            waits.append(b_start(k, t - 1) + bwd[k])
        return max(waits, default=0)

    @functools.lru_cache(maxsize=None)
    def b_start(k, t):
        return f_start(k, t) + fwd[k] if k == K - 1 else b_start(k + 1, t) + bwd[k + 1]

    return ([[f_start(k, t) for t in range(n_batches)] for k in range(K)],
            [[b_start(k, t) for t in range(n_batches)] for k in range(K)])


def dgl_schedule(fwd, bwd, n_batches):
    _check_durations(fwd, bwd, n_batches)
    starts = [[] for _ in fwd]
    for t in range(n_batches):
        for k in range(len(fwd)):
            own = starts[k][-1] + fwd[k] + bwd[k] if t else 0
            upstream = starts[k - 1][t] + fwd[k - 1] if k else 0
            starts[k].append(max(own, upstream))
    return starts, [[s + fwd[k] for s in row] for k, row in enumerate(starts)]


NS: dict = {}


def namespace(**overrides) -> LocalNamespace:
    NS.clear()
    NS.update(similarity_matrix=similarity_matrix, predsim_loss=predsim_loss,
              local_training_step=local_training_step, bp_schedule=bp_schedule, dgl_schedule=dgl_schedule)
    NS.update(overrides)
    return LocalNamespace(NS)


def run(exercise: str, wrong=None, grade_ids=None):
    ns = namespace(**({exercise: wrong} if wrong is not None else {}))
    for grade_id in grade_ids or GRADE_IDS[exercise]:
        CHECKS[grade_id](ns)


def test_every_grade_id_has_a_check():
    assert sorted(CHECKS) == sorted(g for ids in GRADE_IDS.values() for g in ids)


@pytest.mark.parametrize("exercise", sorted(GRADE_IDS))
def test_second_correct_implementation_passes(exercise):
    run(exercise)


def test_solution_and_second_implementation_agree_on_the_notebook_examples():
    assert bp_schedule([1, 2], [3, 4], 2) == ([[0, 10], [1, 11]], [[7, 17], [3, 13]])
    assert dgl_schedule([1, 2], [3, 4], 2) == ([[0, 4], [1, 7]], [[1, 5], [3, 9]])


# --- wrong similarity_matrix ---------------------------------------------------------------------------
def make_similarity(centre=True, normalise=True, std=True, hw_rule="hw", biased=False, eps=1e-8, dtype=None,
                    detach=False, validate=True, min_channels=4, three_d=False, clamp=True, detach_norm=False):
    """``three_d``: a 3-D (B, C, L) h with C > 3 is reduced to stds over L too; ``min_channels``: the smallest C
    reduced to stds (the text: C > 3)."""
    def sim(h):
        if validate and h.dim() < 2:
            raise ValueError("need a batch")
        if h.dim() < 2:
            h = h.reshape(1, -1)
        spatial = {"hw": h.dim() == 4 and h.shape[2] * h.shape[3] > 1,
                   "h": h.dim() == 4 and h.shape[2] > 1}[hw_rule]
        if three_d and h.dim() == 3 and h.shape[1] >= min_channels and h.shape[2] > 1:
            z = h.std(dim=2, correction=0 if biased else 1)
        elif std and h.dim() == 4 and h.shape[1] >= min_channels and spatial:
            z = h.flatten(2).std(dim=2, correction=0 if biased else 1)
        else:
            z = h.flatten(1)
        if detach:
            z = z.detach()
        if centre:
            z = z - z.mean(1, keepdim=True)
        if normalise:
            norm = z.norm(dim=1, keepdim=True)
            z = z / (eps + (norm.detach() if detach_norm else norm))
        s = (z @ z.T).clamp(-1, 1) if clamp else z @ z.T
        return s.to(dtype) if dtype is not None else s
    return sim


@pytest.mark.parametrize("wrong, grade_id, message", [
    (make_similarity(centre=False), "test_similarity_matrix_values", "not centred"),
    (make_similarity(normalise=False), "test_similarity_matrix_values", "not normalised"),
    (make_similarity(centre=False, normalise=False), "test_similarity_matrix_values", "neither centred"),
    (make_similarity(detach=True), "test_similarity_matrix_values", "no gradient reaches h"),
    (make_similarity(std=False), "test_similarity_matrix_conv", "flattened"),
    (make_similarity(biased=True), "test_similarity_matrix_conv", None),  # the std's scale cancels: also right
    (make_similarity(hw_rule="h"), "test_similarity_matrix_conv", "flattened"),
    (make_similarity(eps=0.0), "test_similarity_matrix_edge_cases", "non-finite"),
    (make_similarity(dtype=torch.float64), "test_similarity_matrix_edge_cases", "keep h's dtype"),
    (make_similarity(validate=False), "test_similarity_matrix_edge_cases", "should raise ValueError"),
])
def test_similarity_matrix_rejects(wrong, grade_id, message):
    if message is None:
        CHECKS[grade_id](namespace(similarity_matrix=wrong))
        return
    with pytest.raises(AssertionError, match=message):
        CHECKS[grade_id](namespace(similarity_matrix=wrong))


def test_conv_cell_also_needs_centring():
    """The conv cell's references centre the rows too: a similarity without centring fails there as well."""
    with pytest.raises(AssertionError):
        CHECKS["test_similarity_matrix_conv"](namespace(similarity_matrix=make_similarity(centre=False)))


# --- wrong predsim_loss ------------------------------------------------------------------------------
def corrcoef_similarity(h):
    """S from torch.corrcoef (no 1e-8 beside the norm), conv maps reduced to stds as the text says."""
    if h.dim() < 2:
        raise ValueError("need a batch")
    z = h.flatten(2).std(dim=2) if h.dim() == 4 and h.shape[1] > 3 and h.shape[2] * h.shape[3] > 1 else h.flatten(1)
    return torch.corrcoef(z).reshape(len(h), len(h)).clamp(-1, 1)


def make_predsim(swap=False, sim_on_h=False, mse="mean", validate=True, default_beta=0.99, flatten=True,
                 validate_y=True, onehot="h", width=True, similarity=None, detach=None):
    """``onehot``: "h" (h's dtype) or "float32"; ``width=False``: F.one_hot(y) without num_classes; ``similarity``: S
    used instead of similarity_matrix; ``detach``: "sim" or "pred", h detached before that head."""
    def loss_fn(h, y, sim_head, pred_head, num_classes, beta=default_beta):
        if validate and not 0 <= beta <= 1:
            raise ValueError("beta")
        if validate and validate_y and (y.dim() != 1 or len(y) != len(h)):
            raise ValueError("y")
        S = similarity or NS["similarity_matrix"]
        labels = F.one_hot(y, num_classes) if width else F.one_hot(y)
        target = S(labels.float()).to(h.dtype) if onehot == "float32" else S(labels.to(h.dtype))
        h_sim = h.detach() if detach == "sim" else h
        diff = S(h_sim if sim_on_h else sim_head(h_sim)) - target
        sim = (diff ** 2).mean() if mse == "mean" else (diff ** 2).sum()
        h_pred = h.detach() if detach == "pred" else h
        pred = F.cross_entropy(pred_head(h_pred.flatten(1) if flatten else h_pred), y)
        return beta * pred + (1 - beta) * sim if swap else (1 - beta) * pred + beta * sim
    return loss_fn


@pytest.mark.parametrize("wrong, grade_id, message", [
    (make_predsim(swap=True), "test_predsim_loss_values", "beta weighs the wrong term"),
    (make_predsim(sim_on_h=True), "test_predsim_loss_values", r"S\(sim_head\(h\)\), not S\(h\)"),
    (make_predsim(mse="sum"), "test_predsim_loss_values", "mean squared error"),
    (make_predsim(default_beta=0.5), "test_predsim_loss_conv", "beta defaults to 0.99"),
    (make_predsim(swap=True), "test_predsim_loss_edge_cases", "beta=0.0: the loss.*wrong term"),
    (make_predsim(validate=False), "test_predsim_loss_edge_cases", "should raise ValueError"),
])
def test_predsim_loss_rejects(wrong, grade_id, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS[grade_id](namespace(predsim_loss=wrong))


def test_predsim_loss_rejects_pred_head_on_unflattened_maps():
    with pytest.raises((AssertionError, RuntimeError)):
        CHECKS["test_predsim_loss_conv"](namespace(predsim_loss=make_predsim(flatten=False)))


# --- wrong local_training_step --------------------------------------------------------------------------
def make_local(detach="each", loss_on="h", optimizer="own", zero=True, returns="floats", validate=True,
               call_twice=False):
    def step(blocks, heads, optimizers, x, y):
        if validate and (not blocks or not len(blocks) == len(heads) == len(optimizers)):
            raise ValueError("lengths")
        feed = x if detach in ("none", "sum", "not_x") else x.detach()  # "sum_detached": detached, summed at the end
        losses, total = [], 0
        if detach == "none":  # deep supervision, one backward per loss: zero once, step at the end
            for o in optimizers:
                o.zero_grad()
        for j, (block, head) in enumerate(zip(blocks, heads)):
            h, out = block(feed)
            if call_twice:
                out = block(feed)[1]
            loss = head(out if loss_on == "out" else h, y)
            opt = optimizers[0] if optimizer == "first" else optimizers[j]
            if detach in ("sum", "sum_detached"):
                total = total + loss
            elif detach == "none":
                loss.backward(retain_graph=True)
            else:
                if zero:
                    opt.zero_grad()
                loss.backward()
                if optimizer == "all":
                    for o in optimizers:
                        o.step()
                else:
                    opt.step()
            losses.append(loss)
            feed = out if detach in ("none", "sum") else out.detach()
        if detach in ("sum", "sum_detached"):
            for o in optimizers:
                o.zero_grad()
            total.backward()
        if detach in ("none", "sum", "sum_detached"):
            for o in optimizers:
                o.step()
        if returns == "floats":
            return [v.item() for v in losses]
        if returns == "tensors":
            return [v.detach() for v in losses]
        return tuple(v.item() for v in losses)
    return step


@pytest.mark.parametrize("wrong, grade_id, message", [
    (make_local(detach="none"), "test_local_training_step_values", "deep supervision"),
    (make_local(detach="sum"), "test_local_training_step_values", "deep supervision"),
    (make_local(optimizer="first"), "test_local_training_step_values", "optimizers\\[j\\] alone"),
    (make_local(optimizer="all"), "test_local_training_step_values", "optimizers\\[j\\] alone"),
    (make_local(zero=False), "test_local_training_step_values", "gradients left by the previous call"),
    (make_local(detach="none"), "test_local_training_step_detach", "x.grad is set"),
    (make_local(detach="not_x"), "test_local_training_step_detach", "x.grad is set"),
    (make_local(loss_on="out"), "test_local_training_step_dropout", "dropped-out output"),
    (make_local(call_twice=True), "test_local_training_step_dropout", "exactly once"),
    (make_local(returns="tensors"), "test_local_training_step_returns", "expected Python floats"),
    (make_local(returns="tuple"), "test_local_training_step_returns", "expected a list"),
    (make_local(validate=False), "test_local_training_step_returns", "should raise ValueError"),
])
def test_local_training_step_rejects(wrong, grade_id, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS[grade_id](namespace(local_training_step=wrong))


def size_switching_step(blocks, heads, optimizers, x, y):
    """Wrong: the local loop only where the memory cell once drew its sizes (K >= 8 blocks and a batch >= 2048);
    everywhere else every block's graph stays alive for one backward of the summed local losses at the end."""
    if len(blocks) >= 8 and x.shape[0] >= 2048:
        return make_local()(blocks, heads, optimizers, x, y)
    return make_local(detach="sum_detached")(blocks, heads, optimizers, x, y)


def test_size_switching_step_has_the_right_values_and_fails_only_on_memory():
    """The memory cell grades two cases, one of 5 to 7 blocks: a step that frees each block's graph only on the sizes
    of one published range loses the cell on every draw, and only that cell."""
    run("local_training_step", size_switching_step, [g for g in GRADE_IDS["local_training_step"]
                                                     if g != "test_local_training_step_memory"])
    for _ in range(2):  # sizes are drawn anew each time
        with pytest.raises(AssertionError, match="graphs of several blocks"):
            CHECKS["test_local_training_step_memory"](namespace(local_training_step=size_switching_step))


@pytest.mark.parametrize("case", range(len(ch07.MEM_CASES)))
def test_memory_cases_separate_at_the_small_ends_of_their_ranges(case):
    """Where the summed backward's excess over the bound is smallest (fewest blocks, narrowest, smallest batch), it
    still fails and the correct step passes."""
    blocks_range, width_range, batch_range = ch07.MEM_CASES[case]
    K, width, B = blocks_range[0], width_range[0], batch_range[0]
    nb = namespace(local_training_step=make_local(detach="sum_detached"))
    with pytest.raises(AssertionError, match="graphs of several blocks"):
        ch07._memory_case(nb, Meter(nb), K, width, B)
    nb = namespace()
    ch07._memory_case(nb, Meter(nb), K, width, B)


def test_memory_ranges_are_stated_in_the_exercise_text():
    """Every range the memory cell draws from is stated in local_training_step's docstring."""
    nb = read_source(CHAPTER)
    text = " ".join(next(c.source for c in nb.cells if grade_id(c) == "local_training_step").split())
    for (k_lo, k_hi), (w_lo, w_hi, _), (b_lo, b_hi, _) in ch07.MEM_CASES:
        assert f"K = {k_lo} to {k_hi} blocks" in text
        assert f"batch of {b_lo} to {b_hi}" in text
        assert f"{w_lo} to {w_hi} units" in text
    assert "drawn at grading time" in text


def test_detach_cell_catches_deep_supervision_without_an_input_that_needs_grad():
    """Outputs not detached, x detached: the x.grad check passes, block 0's update must not."""
    def step(blocks, heads, optimizers, x, y):
        feed, total, losses = x.detach(), 0, []
        for block, head in zip(blocks, heads):
            h, out = block(feed)
            loss = head(h, y)
            total, feed = total + loss, out
            losses.append(loss.item())
        for o in optimizers:
            o.zero_grad()
        total.backward()
        for o in optimizers:
            o.step()
        return losses

    with pytest.raises(AssertionError, match="deep supervision"):
        CHECKS["test_local_training_step_detach"](namespace(local_training_step=step))


# --- wrong schedules -------------------------------------------------------------------------------
def bp_off_by_one(fwd, bwd, n_batches):
    """Block k's backward starts bwd[k] (its own duration) after block k + 1's instead of bwd[k + 1]."""
    K = len(fwd)
    F_, B_ = [[0] * n_batches for _ in fwd], [[0] * n_batches for _ in fwd]
    for t in range(n_batches):
        for k in range(K):
            F_[k][t] = max(F_[k - 1][t] + fwd[k - 1] if k else 0, B_[k][t - 1] + bwd[k] if t else 0)
        B_[K - 1][t] = F_[K - 1][t] + fwd[K - 1]
        for k in range(K - 2, -1, -1):
            B_[k][t] = B_[k + 1][t] + bwd[k]
    return F_, B_


def bp_as_floats(fwd, bwd, n_batches):
    F_, B_ = bp_schedule([float(f) for f in fwd], [float(b) for b in bwd], n_batches)
    return F_, B_


def dgl_waits_for_backward(fwd, bwd, n_batches):
    F_ = [[0] * n_batches for _ in fwd]
    for k in range(len(fwd)):
        for t in range(n_batches):
            F_[k][t] = max(F_[k][t - 1] + fwd[k] + bwd[k] if t else 0,
                           F_[k - 1][t] + fwd[k - 1] + bwd[k - 1] if k else 0)
    return F_, [[s + f for s in row] for row, f in zip(F_, fwd)]


def dgl_forgets_own_backward(fwd, bwd, n_batches):
    F_ = [[0] * n_batches for _ in fwd]
    for k in range(len(fwd)):
        for t in range(n_batches):
            F_[k][t] = max(F_[k][t - 1] + fwd[k] if t else 0, F_[k - 1][t] + fwd[k - 1] if k else 0)
    return F_, [[s + f for s in row] for row, f in zip(F_, fwd)]


def no_validation(schedule):
    def fn(fwd, bwd, n_batches):
        return schedule(list(fwd) or [1], list(bwd) or [1], max(int(n_batches), 1))
    return fn


@pytest.mark.parametrize("wrong, grade_id, message", [
    (bp_off_by_one, "test_bp_schedule_values", "off by one"),
    (bp_as_floats, "test_bp_schedule_values", "is a float"),
    (dgl_schedule, "test_bp_schedule_values", "DGL's start times"),
    (lambda f, b, T: list(bp_schedule(f, b, T)), "test_bp_schedule_values", "expected a tuple"),
    (no_validation(bp_schedule), "test_bp_schedule_errors", "should raise ValueError"),
    (lambda f, b, T: bp_schedule(f, b, int(T)), "test_bp_schedule_errors", "n_batches=True"),
])
def test_bp_schedule_rejects(wrong, grade_id, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS[grade_id](namespace(bp_schedule=wrong))


@pytest.mark.parametrize("wrong, grade_id, message", [
    (dgl_waits_for_backward, "test_dgl_schedule_values", "waited for block k - 1's local backward"),
    (dgl_forgets_own_backward, "test_dgl_schedule_values", "forward \\*and\\* local backward"),
    (bp_schedule, "test_dgl_schedule_values", "end-to-end backprop's start times"),
    (lambda f, b, T: tuple(zip(*dgl_schedule(f, b, T))), "test_dgl_schedule_values", "expected a tuple|list of K"),
    (no_validation(dgl_schedule), "test_dgl_schedule_errors", "should raise ValueError"),
])
def test_dgl_schedule_rejects(wrong, grade_id, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS[grade_id](namespace(dgl_schedule=wrong))


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(
    CHAPTER, WRONG, grade_ids={"similarity_matrix": "test_similarity_matrix_values",
                               "predsim_loss": "test_predsim_loss_values",
                               "local_training_step": "test_local_training_step_detach",
                               "bp_schedule": "test_bp_schedule_values",
                               "dgl_schedule": "test_dgl_schedule_values"})


@pytest.mark.parametrize("wrong", [MEMORY_WRONG, SIZE_SWITCH_WRONG], ids=["summed", "size_switch"])
def test_sandbox_memory_wrong_loses_only_its_memory_cell(wrong):
    """Detached between blocks, one summed backward at the end (always, or outside the range the memory cell once
    drew from): every value right, every block's graph alive at once. The worker's cgroup shows it, so the memory
    cell fails and the exercise's other cells pass."""
    cells = GRADE_IDS["local_training_step"]
    memory = "test_local_training_step_memory"
    source = wrong[(CHAPTER, "local_training_step")]
    outcomes = judge.run_checks(CHAPTER, program(CHAPTER, {"local_training_step": source}), list(cells), LIMITS,
                                checks=CHECKS)
    assert not outcomes[memory].passed and "read from outside your process" in outcomes[memory].reason
    assert all(outcomes[gid].passed for gid in cells if gid != memory), {gid: outcomes[gid].reason for gid in cells}


# --- every variant the text allows gets full marks, over several seeds ------------------------------------------
def _solution_similarity(h, correction=1, via_var=False):
    """The course's style: std over space with the given correction (biased = 0), matmul, clamp."""
    if h.dim() < 2:
        raise ValueError("need a batch")
    if h.dim() == 4 and h.shape[1] > 3 and h.shape[2] * h.shape[3] > 1:
        flat = h.flatten(2)
        z = flat.var(dim=2, correction=correction).sqrt() if via_var else flat.std(dim=2, correction=correction)
    else:
        z = h.flatten(1)
    z = z - z.mean(dim=1, keepdim=True)
    z = z / (1e-8 + z.norm(dim=1, keepdim=True))
    return (z @ z.t()).clamp(-1, 1)


ALLOWED_SIMILARITY = {  # "std; biased or unbiased gives the same S", written in several ways
    "unbiased std": functools.partial(_solution_similarity, correction=1),
    "biased std": functools.partial(_solution_similarity, correction=0),
    "biased var().sqrt()": functools.partial(_solution_similarity, correction=0, via_var=True),
    "unbiased, einsum and vector_norm": similarity_matrix,
    "biased, einsum and vector_norm": make_similarity(biased=True),
}
def predsim_skipping_zero_terms(h, y, sim_head, pred_head, num_classes, beta=0.99):
    """Correct too: a term whose weight is 0 is not computed (its head gets no gradient, the formula's is zero)."""
    if not 0 <= beta <= 1:
        raise ValueError("beta")
    if y.dim() != 1 or len(y) != len(h):
        raise ValueError("y")
    if beta == 0:
        return F.cross_entropy(pred_head(h.flatten(1)), y)
    sim = F.mse_loss(NS["similarity_matrix"](sim_head(h)),
                     NS["similarity_matrix"](F.one_hot(y, num_classes).to(h.dtype)))
    return sim if beta == 1 else (1 - beta) * F.cross_entropy(pred_head(h.flatten(1)), y) + beta * sim


ALLOWED_PREDSIM = {"one_hot and mse_loss": make_predsim(), "eye and mean of squares": predsim_loss,
                   "zero-weighted terms skipped": predsim_skipping_zero_terms}
VARIANT_SEEDS = (0, 1000, 2000, 3000, 4000, 5000)


@pytest.mark.parametrize("offset", VARIANT_SEEDS)
def test_every_allowed_variant_gets_full_marks(offset, monkeypatch):
    """The similarity and predsim cells accept each way of computing S the text allows (the std over space biased or
    unbiased), alone and under either correct predsim_loss, for every seed offset: their tolerances come from how far
    the allowed variants' references lie apart, so none loses a point to the 1e-8 beside the norm."""
    monkeypatch.setattr(ch07, "SEED_OFFSET", offset)
    failures = {}
    for s_name, sim in ALLOWED_SIMILARITY.items():
        for p_name, loss in ALLOWED_PREDSIM.items():
            ns = namespace(similarity_matrix=sim, predsim_loss=loss)
            cells = GRADE_IDS["predsim_loss"] + (GRADE_IDS["similarity_matrix"] if p_name == "one_hot and mse_loss"
                                                 else [])
            for cell in cells:
                try:
                    CHECKS[cell](ns)
                except AssertionError as e:
                    failures[(s_name, p_name, cell)] = str(e)[:300]
    assert not failures, failures


def test_the_allowed_variants_differ_where_the_checks_look():
    """The biased and unbiased std are not the same computation: their similarity gradients on the conv cell's maps
    differ by more than the untouched float64 tolerance (which is why the tolerance is widened by their spread)."""
    h = torch.randn(6, 5, 4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grads = []
    for correction in (0, 1):
        x = h.clone().requires_grad_(True)
        _solution_similarity(x, correction=correction).sum().backward()
        grads.append(x.grad)
    assert (grads[0] - grads[1]).abs().max() > ch07.TOL["atol"]


# --- each hint only where its diagnosis is observed ---------------------------------------------------------------
DETACH = "no detach inside the loss"


@pytest.mark.parametrize("wrong, cell, expected", [
    (make_predsim(onehot="float32"), "test_predsim_loss_values", "rounding S\\(onehot\\) to float32"),
    (make_predsim(onehot="float32"), "test_predsim_loss_conv", "rounding S\\(onehot\\) to float32"),
    (make_predsim(similarity=corrcoef_similarity), "test_predsim_loss_values", "without the 1e-8"),
    (make_predsim(similarity=corrcoef_similarity), "test_predsim_loss_conv", "without the 1e-8"),
], ids=["float32-onehot-values", "float32-onehot-conv", "corrcoef-values", "corrcoef-conv"])
def test_rounding_level_mistakes_are_not_called_a_detach(wrong, cell, expected):
    with pytest.raises(AssertionError, match=expected) as e:
        CHECKS[cell](namespace(predsim_loss=wrong))
    assert DETACH not in str(e.value)


@pytest.mark.parametrize("sim", [make_similarity(biased=True), corrcoef_similarity], ids=["biased", "corrcoef"])
def test_similarity_variants_are_not_called_non_differentiable(sim):
    ns = namespace(similarity_matrix=sim)
    for cell in GRADE_IDS["similarity_matrix"][:2]:
        try:
            CHECKS[cell](ns)
        except AssertionError as e:
            assert "differentiable" not in str(e) and "without the 1e-8" in str(e), str(e)


@pytest.mark.parametrize("part", ["sim", "pred"])
def test_a_detach_inside_the_loss_is_named(part):
    with pytest.raises(AssertionError, match=DETACH):
        CHECKS["test_predsim_loss_values"](namespace(predsim_loss=make_predsim(detach=part)))


def test_a_detached_norm_is_named():
    with pytest.raises(AssertionError, match="norm detached"):
        CHECKS["test_similarity_matrix_values"](namespace(similarity_matrix=make_similarity(detach_norm=True)))


# --- the contract, clause by clause (tests/contract_tables.py) -------------------------------------------
def make_bp(variant):
    """Wrong backprop schedules: "own_fwd" (block k's input ready fwd[k] after block k - 1's start), "no_update_wait"
    (the next forward waits only for the block's own forward), "last_at_start" (the last block's backward starts with
    its forward)."""
    def fn(fwd, bwd, n_batches):
        _check_durations(fwd, bwd, n_batches)
        K = len(fwd)
        F_, B_ = [[0] * n_batches for _ in fwd], [[0] * n_batches for _ in fwd]
        for t in range(n_batches):
            for k in range(K):
                own = (F_[k][t - 1] + fwd[k] if variant == "no_update_wait" else B_[k][t - 1] + bwd[k]) if t else 0
                upstream = F_[k - 1][t] + (fwd[k] if variant == "own_fwd" else fwd[k - 1]) if k else 0
                F_[k][t] = max(own, upstream)
            B_[K - 1][t] = F_[K - 1][t] + (0 if variant == "last_at_start" else fwd[K - 1])
            for k in range(K - 2, -1, -1):
                B_[k][t] = B_[k + 1][t] + bwd[k + 1]
        return F_, B_
    return fn


def dgl_backward_with_forward(fwd, bwd, n_batches):
    """Wrong: the local backward starts when the forward starts (B = F)."""
    F_, _ = dgl_schedule(fwd, bwd, n_batches)
    return F_, [list(row) for row in F_]


def dgl_as_floats(fwd, bwd, n_batches):
    return dgl_schedule([float(f) for f in fwd], [float(b) for b in bwd], n_batches)


def _sim(**kw):
    return {"similarity_matrix": make_similarity(**kw)}


def _loss(**kw):
    return {"predsim_loss": make_predsim(**kw)}


def _step(**kw):
    return {"local_training_step": make_local(**kw)}


CONTRACT = [
    Clause("similarity_matrix", "each row z_i is centred (its mean over features subtracted)",
           ("test_similarity_matrix_values",), _sim(centre=False), "not centred"),
    Clause("similarity_matrix", "divided by 1e-8 + its L2 norm", ("test_similarity_matrix_values",),
           _sim(normalise=False), "not normalised"),
    Clause("similarity_matrix", "divided by 1e-8 + its L2 norm (so a constant row becomes zeros, never NaN)",
           ("test_similarity_matrix_values",), {"similarity_matrix": corrcoef_similarity}, "without the 1e-8",
           label="eps-corrcoef"),
    Clause("similarity_matrix", "differentiable with respect to h", ("test_similarity_matrix_values",),
           _sim(detach=True), "no gradient reaches h"),
    Clause("similarity_matrix", "differentiable with respect to h", ("test_similarity_matrix_values",),
           _sim(detach_norm=True), "norm detached", label="differentiable-norm"),
    Clause("similarity_matrix", "Every other h (2-D, 3-D, or 4-D with C <= 3 or H * W == 1) is flattened",
           ("test_similarity_matrix_values",), _sim(three_d=True), "3-D h was reduced"),
    Clause("similarity_matrix", "each channel's standard deviation over its H * W positions",
           ("test_similarity_matrix_conv",), _sim(std=False), "flattened"),
    Clause("similarity_matrix", "A 4-D h of shape (B, C, H, W) with C > 3 and H * W > 1",
           ("test_similarity_matrix_conv",), _sim(hw_rule="h"), "flattened"),
    Clause("similarity_matrix", "4-D with C <= 3 or H * W == 1) is flattened to (B, -1)",
           ("test_similarity_matrix_conv",), _sim(min_channels=3), "C <= 3 channels"),
    Clause("similarity_matrix", "clamped to [-1, 1]", ("test_similarity_matrix_edge_cases",), _sim(clamp=False),
           r"\[-1, 1\]"),
    Clause("similarity_matrix", "(B, B) tensor, the dtype of h", ("test_similarity_matrix_edge_cases",),
           _sim(dtype=torch.float64), "keep h's dtype"),
    Clause("similarity_matrix", "at least 2 dimensions (fewer raise ValueError)", ("test_similarity_matrix_edge_cases",),
           _sim(validate=False), "should raise ValueError"),
    Clause("predsim_loss", "(1 - beta) * L_pred + beta * L_sim", ("test_predsim_loss_values",), _loss(swap=True),
           "beta weighs the wrong term"),
    Clause("predsim_loss", "L_sim = F.mse_loss(similarity_matrix(sim_head(h)), similarity_matrix(onehot))",
           ("test_predsim_loss_values",), _loss(sim_on_h=True), r"S\(sim_head\(h\)\), not S\(h\)"),
    Clause("predsim_loss", "L_sim = F.mse_loss(similarity_matrix(sim_head(h)), similarity_matrix(onehot))",
           ("test_predsim_loss_values",), _loss(similarity=corrcoef_similarity), "without the 1e-8",
           label="l-sim-uses-similarity-matrix"),
    Clause("predsim_loss", "(mean over the B x B entries)", ("test_predsim_loss_values",), _loss(mse="sum"),
           "mean squared error"),
    Clause("predsim_loss", "onehot = F.one_hot(y, num_classes) in h's dtype", ("test_predsim_loss_values",),
           _loss(onehot="float32"), "to float32"),
    Clause("predsim_loss", "differentiable with respect to h and both heads' parameters",
           ("test_predsim_loss_values",), _loss(detach="sim"), DETACH),
    Clause("predsim_loss", "differentiable with respect to h and both heads' parameters",
           ("test_predsim_loss_values",), _loss(detach="pred"), DETACH, label="differentiable-pred"),
    Clause("predsim_loss", "pred_head: maps h.flatten(1) (B, D) to (B, num_classes) logits",
           ("test_predsim_loss_conv",), _loss(flatten=False), raises="RuntimeError"),  # the student's matmul fails
    Clause("predsim_loss", "beta: float = 0.99", ("test_predsim_loss_conv",), _loss(default_beta=0.5),
           "beta defaults to 0.99"),
    Clause("predsim_loss", "num_classes: the number of classes (for the one-hot labels)",
           ("test_predsim_loss_edge_cases",), _loss(width=False), "num_classes columns"),
    Clause("predsim_loss", "a number in [0, 1]; anything else raises ValueError", ("test_predsim_loss_edge_cases",),
           _loss(validate=False), "should raise ValueError"),
    Clause("predsim_loss", "A y that is not 1-D with B entries raises ValueError", ("test_predsim_loss_edge_cases",),
           _loss(validate_y=False), "y is \\(B,\\)"),
    Clause("local_training_step", "detach: no gradient flows between blocks", ("test_local_training_step_values",),
           _step(detach="none"), "deep supervision"),
    Clause("local_training_step", "back-propagate it and step optimizers[j]", ("test_local_training_step_values",),
           _step(optimizer="first"), r"optimizers\[j\] alone"),
    Clause("local_training_step", "gradients left by an earlier call must not add in",
           ("test_local_training_step_values",), _step(zero=False), "gradients left by the previous call"),
    Clause("local_training_step", "even if it requires grad, x.grad stays None", ("test_local_training_step_detach",),
           _step(detach="not_x"), "x.grad is set"),
    Clause("local_training_step", "h is what the local loss uses (the activation before dropout)",
           ("test_local_training_step_dropout",), _step(loss_on="out"), "dropped-out output"),
    Clause("local_training_step", "call blocks[j] once", ("test_local_training_step_dropout",),
           _step(call_twice=True), "exactly once"),
    Clause("local_training_step", "The K local losses as a list of Python floats",
           ("test_local_training_step_returns",), _step(returns="tensors"), "expected Python floats"),
    Clause("local_training_step", "Lists of different lengths, or K = 0, raise ValueError",
           ("test_local_training_step_returns",), _step(validate=False), "should raise ValueError"),
    # Detached between blocks, one backward of the summed losses at the end: the method's updates and losses, every
    # block's graph alive at once. The clauses above show the family's correct-memory answers (which keep each block's
    # gradients and losses to the end) passing the memory cell.
    Clause("local_training_step", "one block's graph at a time whatever the sizes",
           ("test_local_training_step_memory",), _step(detach="sum_detached"), "graphs of several blocks"),
    Clause("bp_schedule", "waits for block k - 1's forward on batch t (its input",
           ("test_bp_schedule_values",), {"bp_schedule": make_bp("own_fwd")}, "input is ready"),
    Clause("bp_schedule", "for block k's own backward on batch t - 1", ("test_bp_schedule_values",),
           {"bp_schedule": make_bp("no_update_wait")}, "own backward"),
    Clause("bp_schedule", "the last block's backward on batch t starts as soon as its own forward on batch t ends",
           ("test_bp_schedule_values",), {"bp_schedule": make_bp("last_at_start")}, "rules one by one"),
    Clause("bp_schedule", "waits for block k + 1's backward on batch t", ("test_bp_schedule_values",),
           {"bp_schedule": bp_off_by_one}, "off by one"),
    Clause("bp_schedule", "Compute them with + and max only", ("test_bp_schedule_values",),
           {"bp_schedule": bp_as_floats}, "is a float"),
    Clause("bp_schedule", "(F, B), a tuple of two lists", ("test_bp_schedule_values",),
           {"bp_schedule": lambda f, b, T: list(bp_schedule(f, b, T))}, "expected a tuple"),
    Clause("bp_schedule", "a positive int (a bool is refused)", ("test_bp_schedule_errors",),
           {"bp_schedule": lambda f, b, T: bp_schedule(f, b, int(T))}, "n_batches=True"),
    Clause("bp_schedule", "fwd and bwd of different lengths, K = 0, a duration <= 0", ("test_bp_schedule_errors",),
           {"bp_schedule": no_validation(bp_schedule)}, "should raise ValueError"),
    Clause("dgl_schedule", "waits for block k - 1's *forward* on batch t", ("test_dgl_schedule_values",),
           {"dgl_schedule": dgl_waits_for_backward}, "waited for block k - 1's local backward"),
    Clause("dgl_schedule", "block k's own forward and local backward on batch t - 1", ("test_dgl_schedule_values",),
           {"dgl_schedule": dgl_forgets_own_backward}, r"forward \*and\* local backward"),
    Clause("dgl_schedule", "block k's local backward on batch t starts as soon as its own forward on batch t ends",
           ("test_dgl_schedule_values",), {"dgl_schedule": dgl_backward_with_forward}, "rules one by one"),
    Clause("dgl_schedule", "computed with + and max only", ("test_dgl_schedule_values",),
           {"dgl_schedule": dgl_as_floats}, "is a float"),
    Clause("dgl_schedule", "a positive int (a bool is refused)", ("test_dgl_schedule_errors",),
           {"dgl_schedule": lambda f, b, T: dgl_schedule(f, b, int(T))}, "n_batches=True"),
    Clause("dgl_schedule", "fwd and bwd of different lengths, K = 0, a duration <= 0", ("test_dgl_schedule_errors",),
           {"dgl_schedule": no_validation(dgl_schedule)}, "should raise ValueError"),
]

test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
    test_contract_covers_every_graded_cell = contract_tests(CHAPTER, CONTRACT, namespace, CHECKS, globals())
