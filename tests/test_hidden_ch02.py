"""The hidden tests of chapter 2 accept correct implementations and reject plausible wrong ones.

The implementations here are written independently of solutions/ch02_checkpointing.py, so that a
bug shared by the solution and its hidden tests cannot hide.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from grader.api import LocalNamespace, checks_for

CHECKS = checks_for("ch02_checkpointing")
GRADE_IDS = ("test_checkpoint", "test_checkpoint_uniform", "test_checkpoint_blocks", "test_plan_checkpoints")


# --- checkpoint: a family of implementations, correct with the defaults ----------------------------
def make_checkpoint(replay_rng=True, pass_params=True, keep_graph=False, recompute=True):
    """autograd.grad-based checkpoint; each flag switches one ingredient off (or a pitfall on)."""

    def checkpoint(function, *args):
        if keep_graph:  # "checkpoint" that stores every activation anyway
            return function(*args)
        params = [p for p in function.parameters() if p.requires_grad] if pass_params else []
        n = len(args)

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                ctx.state = torch.get_rng_state()
                ctx.save_for_backward(*inputs[:n])
                out = function(*inputs[:n])
                ctx.out = out if not recompute else None
                return out

            @staticmethod
            def backward(ctx, grad):
                xs = [t.detach().requires_grad_(ctx.needs_input_grad[i]) for i, t in enumerate(ctx.saved_tensors)]
                with torch.enable_grad(), torch.random.fork_rng(devices=[]):
                    if replay_rng:
                        torch.set_rng_state(ctx.state)
                    out = function(*xs)
                want = [x for x in xs if x.requires_grad] + params
                got = iter(torch.autograd.grad(out, want, grad, allow_unused=True))
                return tuple(next(got) if x.requires_grad else None for x in xs) + tuple(next(got) for _ in params)

        return Fn.apply(*args, *params)

    return checkpoint


def checkpoint_accumulating(function, *args):
    """Also correct: the reentrant design (autograd.backward accumulates into the parameters), with a
    dummy input that requires grad so the output is always attached."""
    dummy = torch.ones(1, requires_grad=True)

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, _dummy, *xs):
            ctx.rng = torch.get_rng_state()
            ctx.save_for_backward(*xs)
            return function(*xs)

        @staticmethod
        def backward(ctx, grad):
            xs = [x.detach().requires_grad_(x.requires_grad or ctx.needs_input_grad[i + 1])
                  for i, x in enumerate(ctx.saved_tensors)]
            state = torch.get_rng_state()
            torch.set_rng_state(ctx.rng)
            with torch.enable_grad():
                out = function(*xs)
            torch.set_rng_state(state)
            torch.autograd.backward(out, grad)
            return (None, *(x.grad if ctx.needs_input_grad[i + 1] else None for i, x in enumerate(xs)))

    return Fn.apply(dummy, *args)


def make_chunked(split, checkpoint_last=True, ckpt=None):
    """A chunked runner from ``split(n, arg) -> list of (start, stop)``."""

    def run(layers, x, arg):
        layers = list(layers)
        chunks = split(len(layers), arg)
        for i, (a, b) in enumerate(chunks):
            seq = nn.Sequential(*layers[a:b])
            last = i == len(chunks) - 1
            x = seq(x) if (last and not checkpoint_last) else (ckpt or make_checkpoint())(seq, x)
        return x

    return run


def split_uniform(n, k):
    if not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"segments must be in 1..{n}, got {k}")
    sizes = [n // k + (i < n % k) for i in range(k)]
    bounds = list(itertools.accumulate([0] + sizes))
    return list(zip(bounds[:-1], bounds[1:]))


def split_blocks(n, b):
    if not isinstance(b, int) or b < 1:
        raise ValueError(f"block_size must be positive, got {b}")
    return [(s, min(s + b, n)) for s in range(0, n, b)]


def split_uniform_ceil(n, k):  # chunks of ceil(n / k): 10 in 4 -> 3, 3, 3, 1
    if not 1 <= k <= n:
        raise ValueError("bad k")
    size = -(-n // k)
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def split_uniform_rest_last(n, k):  # 10 in 4 -> 2, 2, 2, 4
    if not 1 <= k <= n:
        raise ValueError("bad k")
    size = n // k
    return [(i * size, (i + 1) * size if i < k - 1 else n) for i in range(k)]


def split_uniform_short_first(n, k):  # 10 in 4 -> 2, 2, 3, 3
    if not 1 <= k <= n:
        raise ValueError("bad k")
    sizes = [n // k + (i >= k - n % k) for i in range(k)]
    bounds = list(itertools.accumulate([0] + sizes))
    return list(zip(bounds[:-1], bounds[1:]))


def split_uniform_no_check(n, k):  # clamps k into 1..n instead of refusing it
    return split_uniform(n, min(max(k, 1), n))


def split_blocks_off_by_one(n, b):  # a checkpoint every b - 1 layers (b = 1 behaves)
    step = max(b - 1, 1)
    return [(s, min(s + step, n)) for s in range(0, n, step)]


def split_blocks_as_count(n, b):  # reads block_size as a number of chunks
    return split_uniform(n, min(b, n))


def plain_chunks(layers, x, arg):
    for layer in layers:
        x = layer(x)
    return x


# --- the planner -----------------------------------------------------------------------------------
def memory(plan, act):
    starts = list(plan) + [len(act)]
    return sum(act[c] for c in plan) + max(sum(act[a + 1:b]) for a, b in zip(starts[:-1], starts[1:]))


def recompute(plan, fwd):
    starts = list(plan) + [len(fwd)]
    return sum(sum(fwd[a:b]) for a, b in zip(starts[:-1], starts[1:]) if b - a > 1)


def plan_exhaustive_dp(act, fwd, budget, last_layer_free=False):
    """Correct: for each peak, a forward DP over "the next segment starts at i", keeping for every
    stored-bytes total only the cheapest prefix plan, then dropping dominated totals.
    ``last_layer_free`` charges a segment all its layers but the last (a wrong cost model)."""
    n = len(act)
    best = None
    for peak in sorted({sum(act[i + 1:j + 1]) for i in range(n) for j in range(i, n)}):
        if peak > budget:
            break
        reach = [dict() for _ in range(n + 1)]  # reach[i]: {stored: (recompute, plan)} of plans covering 0..i-1
        reach[0] = {0: (0, [])}
        for i in range(n):
            front, low = {}, None
            for stored in sorted(reach[i]):
                if low is None or reach[i][stored][0] < low:
                    front[stored], low = reach[i][stored], reach[i][stored][0]
            for stored, (cost, plan) in front.items():
                inner = 0
                for j in range(i, n):  # segment i..j
                    inner += act[j] if j > i else 0
                    if inner > peak:
                        break
                    seg = sum(fwd[i:j]) if last_layer_free else (sum(fwd[i:j + 1]) if j > i else 0)
                    s, c = stored + act[i], cost + seg
                    if s + peak <= budget and (s not in reach[j + 1] or c < reach[j + 1][s][0]):
                        reach[j + 1][s] = (c, plan + [i])
        for cost, plan in reach[n].values():
            if best is None or cost < best[0]:
                best = (cost, plan)
    if best is None:
        raise ValueError("nothing fits")
    return best[1]


def plan_last_layer_free(act, fwd, budget):
    """Optimal for another cost model: a segment's last layer never recomputed (torch's non-reentrant
    early stop), not the whole segment as ``checkpoint`` reruns it."""
    return plan_exhaustive_dp(act, fwd, budget, last_layer_free=True)


def plan_greedy(act, fwd, budget):
    """Start from every input stored; drop the checkpoint that adds the least recompute until it fits."""
    plan = list(range(len(act)))
    while memory(plan, act) > budget:
        if len(plan) == 1:
            raise ValueError("nothing fits")
        options = [[c for c in plan if c != d] for d in plan[1:]]
        plan = min(options, key=lambda p: (recompute(p, fwd), memory(p, act)))
    return plan


def plan_best_uniform(act, fwd, budget):
    """Only tries uniform plans."""
    n = len(act)
    fits = [[a for a, _ in split_uniform(n, k)] for k in range(1, n + 1)]
    fits = [p for p in fits if memory(p, act) <= budget]
    if not fits:
        raise ValueError("nothing fits")
    return min(fits, key=lambda p: recompute(p, fwd))


def plan_ignores_budget(act, fwd, budget):
    return list(range(len(act)))


def plan_never_raises(act, fwd, budget):
    try:
        return plan_exhaustive_dp(act, fwd, budget)
    except ValueError:
        return [0]


def plan_without_peak(act, fwd, budget):
    """Counts only the stored inputs, forgetting the recomputed segment."""
    n = len(act)
    plans = [[0, *r] for k in range(n) for r in itertools.combinations(range(1, n), k)] if n <= 12 else [list(range(n))]
    fits = [p for p in plans if sum(act[c] for c in p) <= budget]
    if not fits:
        raise ValueError("nothing fits")
    return min(fits, key=lambda p: recompute(p, fwd))


def namespace(**overrides) -> LocalNamespace:
    ns = {"checkpoint": make_checkpoint(), "checkpoint_uniform": make_chunked(split_uniform),
          "checkpoint_blocks": make_chunked(split_blocks), "plan_checkpoints": plan_exhaustive_dp}
    ns.update(overrides)
    return LocalNamespace(ns)


# --- tests -----------------------------------------------------------------------------------------
def test_every_grade_id_has_a_check():
    assert sorted(CHECKS) == sorted(GRADE_IDS)


def test_correct_implementation_passes():
    ns = namespace()
    for grade_id in GRADE_IDS:
        CHECKS[grade_id](ns)


def test_other_correct_implementations_pass():
    ns = namespace(checkpoint=checkpoint_accumulating,
                   checkpoint_uniform=make_chunked(split_uniform, ckpt=checkpoint_accumulating),
                   checkpoint_blocks=make_chunked(split_blocks, ckpt=checkpoint_accumulating))
    for grade_id in GRADE_IDS[:3]:
        CHECKS[grade_id](ns)


@pytest.mark.parametrize("wrong, message", [
    (make_checkpoint(replay_rng=False), "torch.get_rng_state"),
    (make_checkpoint(keep_graph=True), "keeps only its inputs"),
    (make_checkpoint(pass_params=False), "parameters of function still do"),
])
def test_checkpoint_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_checkpoint"](namespace(checkpoint=wrong))


@pytest.mark.parametrize("wrong, message", [
    (make_chunked(split_uniform_ceil), "first n % k chunks"),
    (make_chunked(split_uniform_rest_last), "first n % k chunks"),
    (make_chunked(split_uniform_short_first), "first n % k chunks"),
    (make_chunked(split_uniform, checkpoint_last=False), "every chunk runs under checkpoint"),
    (make_chunked(split_uniform_no_check), "ValueError"),
    (plain_chunks, "chunks recomputed during backward were none"),
    (make_chunked(split_uniform, ckpt=make_checkpoint(keep_graph=True)), "recomputed during backward were none"),
])
def test_checkpoint_uniform_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_checkpoint_uniform"](namespace(checkpoint_uniform=wrong))


@pytest.mark.parametrize("wrong, message", [
    (make_chunked(split_blocks_off_by_one), r"\[0, b\), \[b, 2b\)"),
    (make_chunked(split_blocks_as_count), r"\[0, b\), \[b, 2b\)"),
    (make_chunked(split_blocks, checkpoint_last=False), "every chunk runs under checkpoint"),
    (make_chunked(split_blocks, ckpt=make_checkpoint(pass_params=False)), "parameters of function still do"),
])
def test_checkpoint_blocks_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_checkpoint_blocks"](namespace(checkpoint_blocks=wrong))


@pytest.mark.parametrize("wrong, message", [
    (plan_greedy, "greedy choice is not enough"),
    (plan_last_layer_free, "greedy choice is not enough"),
    (plan_best_uniform, "greedy choice is not enough"),
    (plan_ignores_budget, "more than the budget"),
    (plan_never_raises, "raise ValueError"),
    (plan_without_peak, "more than the budget"),
])
def test_plan_checkpoints_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_plan_checkpoints"](namespace(plan_checkpoints=wrong))


def test_pareto_reference_matches_brute_force():
    """The hidden module's long-chain optimum agrees with exhaustive search where both run."""
    import random

    from grader.hidden.ch02_checkpointing import _brute_force, _pareto_optimum

    rng = random.Random(7)
    for _ in range(60):
        n = rng.randint(1, 12)
        act = [rng.randint(1, 30) for _ in range(n)]
        fwd = [rng.randint(0, 9) for _ in range(n)]
        budget = rng.randint(max(act) - 3, sum(act) + 2)
        assert _pareto_optimum(act, fwd, budget) == _brute_force(act, fwd, budget), (act, fwd, budget)
