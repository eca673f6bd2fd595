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
                    detach=False, validate=True):
    def sim(h):
        if validate and h.dim() < 2:
            raise ValueError("need a batch")
        if h.dim() < 2:
            h = h.reshape(1, -1)
        spatial = {"hw": h.dim() == 4 and h.shape[2] * h.shape[3] > 1,
                   "h": h.dim() == 4 and h.shape[2] > 1}[hw_rule]
        if std and h.dim() == 4 and h.shape[1] > 3 and spatial:
            z = h.flatten(2).std(dim=2, correction=0 if biased else 1)
        else:
            z = h.flatten(1)
        if detach:
            z = z.detach()
        if centre:
            z = z - z.mean(1, keepdim=True)
        if normalise:
            z = z / (eps + z.norm(dim=1, keepdim=True))
        s = (z @ z.T).clamp(-1, 1)
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
def make_predsim(swap=False, sim_on_h=False, mse="mean", validate=True, default_beta=0.99, flatten=True):
    def loss_fn(h, y, sim_head, pred_head, num_classes, beta=default_beta):
        if validate and not 0 <= beta <= 1:
            raise ValueError("beta")
        if validate and (y.dim() != 1 or len(y) != len(h)):
            raise ValueError("y")
        S = NS["similarity_matrix"]
        diff = S(h if sim_on_h else sim_head(h)) - S(F.one_hot(y, num_classes).to(h.dtype))
        sim = (diff ** 2).mean() if mse == "mean" else (diff ** 2).sum()
        pred = F.cross_entropy(pred_head(h.flatten(1) if flatten else h), y)
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


def test_summed_backward_has_the_right_values_and_fails_only_on_memory():
    """Detached between blocks, every block's graph kept for one backward of the summed losses at the end: the
    same updates and losses as local learning, backprop's peak memory."""
    wrong = make_local(detach="sum_detached")
    run("local_training_step", wrong, [g for g in GRADE_IDS["local_training_step"]
                                       if g != "test_local_training_step_memory"])
    with pytest.raises(AssertionError, match="graphs of several blocks"):
        CHECKS["test_local_training_step_memory"](namespace(local_training_step=wrong))


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


def test_memory_cell_passes_a_step_that_frees_gradients_after_each_update():
    """The second implementation zeroes (frees) each block's gradients after its step; the family's default keeps
    them, and the loss tensors, until the end: both hold one block's graph at a time."""
    CHECKS["test_local_training_step_memory"](namespace(local_training_step=make_local()))


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
