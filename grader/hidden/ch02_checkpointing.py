"""Hidden tests of chapter 2 (activation checkpointing).

Gradients are compared with plain autograd on a copy of the same module, run judge-side by the
same trusted probe (``probes.ch02_run_and_trace``) with ``module(x)`` as the function. Memory is
read from outside the student's process for ``checkpoint`` on a 6-layer MLP with 1.5 MiB
activations (``grader.resources``); the saved bytes the probe measures in the student's process
(an upper bound on small cases) explain failures and bound the chunked methods; what the
segments are is read from *which layers run again during backward*, and in what order: each
checkpointed chunk is recomputed as one run of consecutive layers, the last chunk first.
"""
from __future__ import annotations

import copy
import itertools
import random

import torch
from torch import nn

from coursekit.checks import check_close
from grader import probes
from grader.api import fetch, hidden_test
from grader.resources import Meter, fresh_tensor, mib
from grader.source_policy import Shortcut, SourcePolicy

# Exercise cells may not use torch.utils.checkpoint (the text says so: section 7 compares with it).
SOURCE_POLICY = SourcePolicy(shortcuts=(
    Shortcut(paths=("torch.utils.checkpoint",),
             instead="write checkpoint with your own torch.autograd.Function; section 7 compares it with "
                     "torch.utils.checkpoint"),
))

TOL = dict(atol=1e-6, rtol=1e-6)  # recomputation runs the same kernels: gradients match to the bit
RNG_HINT = ("with dropout the recomputed forward must draw the same mask as the first one: save "
            "torch.get_rng_state() before calling function and restore it before recomputing")
PARAM_HINT = ("when no input requires a gradient, the parameters of function still do: pass them to "
              "your autograd.Function's apply() so that the output is attached to the graph, and give "
              "them their gradients")
MEMORY_HINT = ("a checkpoint keeps only its inputs: run function without recording a graph "
               "(inside autograd.Function.forward, or under torch.no_grad()) and recompute it in backward")
SPLIT_HINT = ("n layers in k chunks: the first n % k chunks have n // k + 1 layers, the others n // k "
              "(10 layers in 4 chunks: 3, 3, 2, 2), and every chunk runs under checkpoint")
BLOCK_HINT = ("chunks are layers [0, b), [b, 2b), ...; the last one may be shorter, and every chunk runs "
              "under checkpoint")


# --- helpers ------------------------------------------------------------------------------------
def _randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _seeded(seed: int, build):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def _plain(module, x, *extra):
    return module(x, *extra)


def _run_plain_chain(module, x, *_):
    return module(x)


def _reference(module, x, g, *extra, seed=0, x_requires_grad=True, fn=_plain) -> dict:
    return probes.ch02_run_and_trace(fn, copy.deepcopy(module), x, g, *extra, seed=seed,
                                     x_requires_grad=x_requires_grad)


def _student(nb, fn_name: str, module, x, g, *extra, seed=0, x_requires_grad=True) -> dict:
    return fetch(nb.apply(probes.ch02_run_and_trace, nb[fn_name], module, x, g, *extra, seed=seed,
                          x_requires_grad=x_requires_grad))


def _nbytes(t: torch.Tensor) -> int:
    return t.nelement() * t.element_size()


def _compare(got: dict, ref: dict, where: str, hint: str) -> None:
    if not got["attached"]:
        raise AssertionError(f"{where}: the output is not attached to the autograd graph, so nothing can "
                             f"receive a gradient. {PARAM_HINT}")
    check_close(got["y"], ref["y"], f"the output {where}", "the output must be exactly function(*args)", **TOL)
    if ref["dx"] is None and got["dx"] is not None:
        raise AssertionError(f"{where}: the input does not require grad, yet it received a gradient")
    if ref["dx"] is not None:
        if got["dx"] is None:
            raise AssertionError(f"{where}: no gradient reached the input; return the gradients of the "
                                 "inputs from your backward")
        check_close(got["dx"], ref["dx"], f"the input gradient {where}", hint, **TOL)
    for i, (a, b) in enumerate(zip(got["extra_grads"], ref["extra_grads"])):
        if b is not None:
            if a is None:
                raise AssertionError(f"{where}: no gradient reached argument {i + 2} of function")
            check_close(a, b, f"the gradient of argument {i + 2} {where}", hint, **TOL)
    for name, b in ref["grads"].items():
        a = got["grads"].get(name)
        if b is not None and a is None:
            raise AssertionError(f"{where}: the parameter {name} received no gradient. {PARAM_HINT}")
        if b is not None:
            check_close(a, b, f"the gradient of parameter {name} {where}", hint, **TOL)


# --- checkpoint -----------------------------------------------------------------------------------
def _mlp(seed: int, dropout: float | None = None) -> nn.Sequential:
    def build():
        mods = [nn.Linear(37, 53), nn.ReLU(), nn.Linear(53, 29), nn.Tanh()]
        if dropout is not None:
            mods.append(nn.Dropout(dropout))
        return nn.Sequential(*mods, nn.Linear(29, 11))
    return _seeded(seed, build)


def _check_segment(nb, module, x, g, *extra, seed=0, x_requires_grad=True, hint="", where="") -> dict:
    ref = _reference(module, x, g, *extra, seed=seed, x_requires_grad=x_requires_grad)
    got = _student(nb, "checkpoint", module, x, g, *extra, seed=seed, x_requires_grad=x_requires_grad)
    _compare(got, ref, where, hint)
    bound = _nbytes(x) + sum(_nbytes(e) for e in extra if isinstance(e, torch.Tensor))
    if got["activation_bytes"] > bound:
        raise AssertionError(
            f"{where}: {got['activation_bytes']:,} bytes of activations were saved for backward, but a checkpoint "
            f"keeps only its inputs ({bound:,} bytes); plain autograd saves {ref['activation_bytes']:,}. {MEMORY_HINT}")
    if got["forward_flops"] != ref["forward_flops"]:
        raise AssertionError(
            f"{where}: the forward call cost {got['forward_flops']:,} FLOPs, plain function(*args) "
            f"{ref['forward_flops']:,}: run function exactly once in the forward pass")
    if got["backward_calls"] != ref["forward_calls"]:
        raise AssertionError(
            f"{where}: during backward the layers {got['backward_calls']} ran, expected one recomputation of the "
            f"whole function ({ref['forward_calls']}): recompute function(*args) once in backward")


@hidden_test("test_checkpoint")
def check_checkpoint(nb):
    meter = Meter(nb)  # first: nothing the student's code holds goes unaccounted
    # Plain MLP, input requiring grad, awkward sizes.
    _check_segment(nb, _mlp(1), _randn(7, 37, seed=2), _randn(7, 11, seed=3),
                   where="for an MLP 37 → 53 → 29 → 11 on a batch of 7")
    # Leading batch dimensions.
    _check_segment(nb, _mlp(4), _randn(2, 5, 37, seed=5), _randn(2, 5, 11, seed=6),
                   where="for an input of shape (2, 5, 37)")
    # Dropout in training mode: the recomputation must replay the RNG.
    for seed in (11, 12):
        _check_segment(nb, _mlp(seed, dropout=0.5), _randn(9, 37, seed=seed + 20), _randn(9, 11, seed=seed + 40),
                       seed=seed, hint=RNG_HINT, where="with dropout (p=0.5) in training mode")
    # The input needs no gradient (a data batch); the parameters do.
    _check_segment(nb, _mlp(7), _randn(6, 37, seed=8), _randn(6, 11, seed=9), x_requires_grad=False,
                         hint=PARAM_HINT, where="when the input does not require grad")
    # Two tensor arguments, only the second requiring grad.
    bil = _seeded(13, lambda: nn.Bilinear(13, 17, 5))
    x2 = _randn(4, 17, seed=14).requires_grad_(True)
    _check_segment(nb, bil, _randn(4, 13, seed=15), _randn(4, 5, seed=16), x2, x_requires_grad=False,
                   where="for nn.Bilinear with two inputs (checkpoint(bilinear, x1, x2), only x2 requiring grad)")
    _check_held_memory(nb, meter)


def _check_held_memory(nb, meter: Meter, width: int = 768, depth: int = 6, batch: int = 512) -> None:
    """What the process holds between forward and backward, read from outside it: the input only."""
    def build():
        linear, relu = nb.put(nn.Linear), nb.put(nn.ReLU)
        return nb.put(nn.Sequential)(*[layer for _ in range(depth) for layer in (linear(width, width), relu())])

    mlp = meter.judge(build)
    nb.checkpoint(mlp, fresh_tensor(nb, (2, width))).sum()  # first call (no backward: no gradients yet)
    held, loss = meter.held_by(lambda: nb.checkpoint(mlp, fresh_tensor(nb, (batch, width))).sum())
    x_bytes = batch * width * 4
    if held.kept > 2 * x_bytes:  # the input, and less than one more activation
        raise AssertionError(
            f"checkpoint(mlp, x) for {depth} Linear({width}, {width}) + ReLU layers on a ({batch}, {width}) input: "
            f"between forward and backward, with x and the output released, your process still held "
            f"{mib(held.kept)} more than before (read from outside your process); the input is {mib(x_bytes)}, "
            f"plain autograd keeps about {mib(2 * depth * x_bytes)}. {MEMORY_HINT}")
    loss.backward()


# --- uniform and block methods ------------------------------------------------------------------
def _chain(seed: int) -> nn.Sequential:
    """Ten layers of distinct widths, ReLU/Tanh among them (chunks with and without parameters)."""
    return _seeded(seed, lambda: nn.Sequential(
        nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 11), nn.Tanh(), nn.Linear(11, 13), nn.Linear(13, 17),
        nn.ReLU(), nn.Linear(17, 19), nn.Linear(19, 23), nn.Linear(23, 3)))


def _recomputed_chunks(calls: list[str]) -> list[tuple[int, int]]:
    """Runs of consecutive layer indices in the backward calls, in forward order, as (first, last)."""
    runs: list[list[int]] = []
    for i in (int(c) for c in calls):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return [(r[0], r[-1]) for r in reversed(runs)]


def _fmt(chunks) -> str:
    return ", ".join(f"[{a}–{b}]" if a != b else f"[{a}]" for a, b in chunks) or "none"


def _check_chunked(nb, fn_name: str, arg: int, chunks: list[tuple[int, int]], hint: str, seed: int,
                   x_requires_grad: bool = True) -> None:
    chain = _chain(seed)
    x, g = _randn(6, 5, seed=seed + 1), _randn(6, 3, seed=seed + 2)
    where = f"{fn_name}(10 layers, x, {arg})"
    ref = _reference(chain, x, g, arg, seed=seed, x_requires_grad=x_requires_grad, fn=_run_plain_chain)
    got = _student(nb, fn_name, chain, x, g, arg, seed=seed, x_requires_grad=x_requires_grad)
    _compare(got, ref, f"for {where}", "the chunks must run the layers in order, each exactly once per pass")
    if got["forward_calls"] != ref["forward_calls"]:
        raise AssertionError(f"for {where} the forward pass called the layers {got['forward_calls']}, expected "
                             f"each once, in order")
    found = _recomputed_chunks(got["backward_calls"])
    # A checkpoint may skip recomputing a chunk's last layer (its output is not needed for backward).
    full = [str(i) for a, b in reversed(chunks) for i in range(a, b + 1)]
    short = [str(i) for a, b in reversed(chunks) for i in range(a, b)]
    if got["backward_calls"] not in (full, short):
        raise AssertionError(
            f"for {where} the chunks recomputed during backward were {_fmt(found)}, expected {_fmt(chunks)}. {hint}")
    # Layer inputs, in order: x, then each layer's output (widths from the chain above).
    widths = [5, 7, 7, 11, 11, 13, 17, 17, 19, 23]
    bound = sum(6 * widths[a] * 4 for a, _ in chunks)
    if got["activation_bytes"] > bound:
        raise AssertionError(
            f"for {where}, {got['activation_bytes']:,} bytes were saved during the forward pass, more than the "
            f"inputs of the chunks {_fmt(chunks)} ({bound:,} bytes): only the chunk inputs may be kept. {MEMORY_HINT}")


def _expect_value_error(nb, fn_name: str, arg, what: str) -> None:
    chain = _chain(0)
    names = fetch(nb.apply(probes.raised, nb[fn_name], chain, _randn(2, 5, seed=0), arg))
    if names is None or "ValueError" not in names:
        got = "returned a result" if names is None else f"raised {names[0]}"
        raise AssertionError(f"{fn_name}(10 layers, x, {arg!r}) {got}: {what} should raise ValueError")


@hidden_test("test_checkpoint_uniform")
def check_checkpoint_uniform(nb):
    cases = [(4, [(0, 2), (3, 5), (6, 7), (8, 9)]), (3, [(0, 3), (4, 6), (7, 9)]),
             (6, [(0, 1), (2, 3), (4, 5), (6, 7), (8, 8), (9, 9)]), (1, [(0, 9)]),
             (10, [(i, i) for i in range(10)])]
    for i, (k, chunks) in enumerate(cases):
        _check_chunked(nb, "checkpoint_uniform", k, chunks, SPLIT_HINT, seed=30 + i)
    _check_chunked(nb, "checkpoint_uniform", 3, cases[1][1], SPLIT_HINT, seed=40, x_requires_grad=False)
    for bad in (0, 11):
        _expect_value_error(nb, "checkpoint_uniform", bad, "a number of segments outside 1..n")


@hidden_test("test_checkpoint_blocks")
def check_checkpoint_blocks(nb):
    cases = [(3, [(0, 2), (3, 5), (6, 8), (9, 9)]), (4, [(0, 3), (4, 7), (8, 9)]), (1, [(i, i) for i in range(10)]),
             (10, [(0, 9)]), (15, [(0, 9)]), (6, [(0, 5), (6, 9)])]
    for i, (b, chunks) in enumerate(cases):
        _check_chunked(nb, "checkpoint_blocks", b, chunks, BLOCK_HINT, seed=50 + i)
    _check_chunked(nb, "checkpoint_blocks", 4, cases[1][1], BLOCK_HINT, seed=60, x_requires_grad=False)
    _expect_value_error(nb, "checkpoint_blocks", 0, "a block size of 0")


# --- the planner -----------------------------------------------------------------------------------
def _memory(plan, act) -> int:
    starts = list(plan) + [len(act)]
    return sum(act[c] for c in plan) + max(sum(act[a + 1:b]) for a, b in zip(starts[:-1], starts[1:]))


def _recompute(plan, fwd) -> int:
    """As ``checkpoint`` does it: a segment of two or more layers reruns whole; a one-layer segment runs plainly."""
    starts = list(plan) + [len(fwd)]
    return sum(sum(fwd[a:b]) for a, b in zip(starts[:-1], starts[1:]) if b - a > 1)


def _brute_force(act, fwd, budget):
    best = None
    for r in range(len(act)):
        for rest in itertools.combinations(range(1, len(act)), r):
            plan = (0, *rest)
            if _memory(plan, act) <= budget:
                cost = _recompute(plan, fwd)
                best = cost if best is None or cost < best else best
    return best


def _pareto_optimum(act, fwd, budget):
    """Least recompute within budget, for long chains: for each peak, Pareto fronts of (stored, recompute)."""
    n = len(act)
    best = None
    peaks = sorted({sum(act[i + 1:j + 1]) for i in range(n) for j in range(i, n)})
    for peak in peaks:
        room = budget - peak
        if room < 0:
            break
        fronts: list[dict[int, int]] = [dict() for _ in range(n)] + [{0: 0}]
        for i in reversed(range(n)):
            inner = 0
            for j in range(i, n):
                if j > i:
                    inner += act[j]
                if inner > peak:
                    break
                for stored, cost in fronts[j + 1].items():
                    s, c = stored + act[i], cost + (sum(fwd[i:j + 1]) if j > i else 0)
                    if s <= room and c < fronts[i].get(s, float("inf")):
                        fronts[i][s] = c
            pruned, low = {}, float("inf")
            for s in sorted(fronts[i]):
                if fronts[i][s] < low:
                    pruned[s], low = fronts[i][s], fronts[i][s]
            fronts[i] = pruned
        if fronts[0]:
            cost = min(fronts[0].values())
            best = cost if best is None or cost < best else best
    return best


def _check_plan(nb, act, fwd, budget, optimum, label: str) -> None:
    where = f"plan_checkpoints({act}, {fwd}, {budget})" if len(act) <= 12 else f"plan_checkpoints for {label}"
    if optimum is None:
        names = fetch(nb.apply(probes.raised, nb.plan_checkpoints, act, fwd, budget))
        if names is None or "ValueError" not in names:
            least = min(_memory((0, *r), act) for k in range(len(act))
                        for r in itertools.combinations(range(1, len(act)), k)) if len(act) <= 12 else None
            got = "returned a plan" if names is None else f"raised {names[0]}"
            raise AssertionError(f"{where} {got}, but no plan fits in {budget} bytes"
                                 + (f" (the least memory any plan needs is {least})" if least is not None else "")
                                 + ": raise ValueError")
        return
    try:
        plan = fetch(nb.plan_checkpoints(act, fwd, budget))
    except NameError:
        raise
    except Exception as e:  # noqa: BLE001 - the student's function raised although a plan fits
        raised = getattr(e, "type_name", type(e).__name__)
        detail = getattr(e, "message", None) if hasattr(e, "type_name") else str(e)
        raised += f" ({detail})" if detail else ""
        hint = ("A greedy choice is not enough: compare every first segment [i, j] and keep, for each start, the "
                "plans no other plan beats on both stored bytes and recomputation") if "ValueError" in raised else ""
        raise AssertionError(f"{where} raised {raised}, but plans fit in the budget (the best recomputes "
                             f"{optimum}). {hint}".strip()) from None
    if not isinstance(plan, (list, tuple)) or not all(isinstance(c, int) and not isinstance(c, bool) for c in plan):
        raise AssertionError(f"{where} returned {plan!r}: a plan is a list of layer indices (ints)")
    plan = list(plan)
    if not plan or plan[0] != 0 or plan != sorted(set(plan)) or plan[-1] >= len(act):
        raise AssertionError(f"{where} returned {plan}: a plan is a sorted list of distinct layer indices in "
                             f"0..{len(act) - 1} that starts with 0 (layer 0's input is always stored)")
    memory = _memory(plan, act)
    if memory > budget:
        raise AssertionError(f"{where} returned {plan}, which needs {memory} bytes: more than the budget of "
                             f"{budget}. Memory = stored inputs + the largest segment's inner inputs")
    cost = _recompute(plan, fwd)
    if cost != optimum:
        raise AssertionError(
            f"{where} returned {plan}, which fits ({memory} bytes) but recomputes {cost}; the best plan within the "
            f"budget recomputes {optimum}. A greedy choice is not enough: compare every first segment [i, j] and "
            f"keep, for each start, the plans no other plan beats on both stored bytes and recomputation")


@hidden_test("test_plan_checkpoints")
def check_plan_checkpoints(nb):
    # Hand-made: big early inputs and cheap late ones, where evenly spaced or greedy plans lose.
    act, fwd = [9, 1, 1, 1, 9, 1, 1, 1, 1, 5], [1, 6, 1, 1, 1, 7, 1, 1, 1, 1]
    for budget in (20, 21, 22, 23, 24, 27, sum(act)):
        _check_plan(nb, act, fwd, budget, _brute_force(act, fwd, budget), "")
    # One layer; every budget below the least memory.
    _check_plan(nb, [7], [3], 7, 0, "")
    _check_plan(nb, [7], [3], 6, None, "")
    _check_plan(nb, act, fwd, 19, None, "")
    # Random chains, budgets spread between infeasible and roomy.
    rng = random.Random(2016)
    for _ in range(30):
        n = rng.randint(2, 10)
        act = [rng.randint(1, 40) for _ in range(n)]
        fwd = [rng.randint(0, 25) for _ in range(n)]
        budget = rng.randint(max(act) - 5, sum(act) + 3)
        _check_plan(nb, act, fwd, budget, _brute_force(act, fwd, budget), "")
    # A long chain (2^39 plans): only a dynamic program finishes.
    rng = random.Random(40)
    act = [rng.choice((4, 8, 12)) for _ in range(40)]
    fwd = [rng.choice((1, 2, 3)) for _ in range(40)]
    for budget in (90, 140):
        _check_plan(nb, act, fwd, budget, _pareto_optimum(act, fwd, budget),
                    f"a 40-layer chain with a budget of {budget}")
