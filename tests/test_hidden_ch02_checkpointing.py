"""The hidden tests of chapter 2 accept correct implementations and reject plausible wrong ones.

The implementations here are written independently of solutions/ch02_checkpointing.py, so that a
bug shared by the solution and its hidden tests cannot hide. Each exercise is graded by property,
one test cell each: a wrong implementation must fail the cell of the property it gets wrong and
pass the others (partial credit). The last tests run the same checks through the sandbox
(``grader.sandbox.judge.run_checks``), as the autograder does.
"""
from __future__ import annotations

import itertools
import re

import pytest
import torch
from torch import nn

from contract_tables import Clause, contract_tests
from grader.api import LocalNamespace, checks_for
from grader.sandbox import judge
from sandbox_checks import LIMITS, program, sandbox_tests
from wrong_submissions_ch02_checkpointing import MEMORY_WRONG, WRONG

CHAPTER = "ch02_checkpointing"
CHECKS = checks_for(CHAPTER)
CELLS = {
    "checkpoint": ("test_checkpoint", "test_checkpoint_rng", "test_checkpoint_edge_cases", "test_checkpoint_memory"),
    "checkpoint_uniform": ("test_checkpoint_uniform", "test_checkpoint_uniform_memory",
                           "test_checkpoint_uniform_edge_cases"),
    "checkpoint_blocks": ("test_checkpoint_blocks", "test_checkpoint_blocks_memory",
                          "test_checkpoint_blocks_edge_cases"),
    "plan_checkpoints": ("test_plan_checkpoints", "test_plan_checkpoints_edge_cases",
                         "test_plan_checkpoints_long_chain"),
}
GRADE_IDS = tuple(gid for ids in CELLS.values() for gid in ids)


# --- checkpoint: a family of implementations, correct with the defaults ----------------------------
def make_checkpoint(replay_rng=True, pass_params=True, keep_graph=False, rng_after=False, recompute_twice=False,
                    modules_only=False, tensors_only=False):
    """autograd.grad-based checkpoint; each flag switches one ingredient off (or a pitfall on). ``modules_only``:
    asks every function for its parameters (a plain function has no parameters()); ``tensors_only``: saves every
    argument with save_for_backward (which refuses a float)."""

    def checkpoint(function, *args):
        if keep_graph:  # "checkpoint" that stores every activation anyway
            return function(*args)
        owns = modules_only or isinstance(function, nn.Module)
        params = [p for p in function.parameters() if p.requires_grad] if pass_params and owns else []
        n = len(args)

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                ctx.state = torch.get_rng_state()
                is_t = [tensors_only or isinstance(a, torch.Tensor) for a in inputs[:n]]
                ctx.plain = [None if t else a for t, a in zip(is_t, inputs[:n])]
                ctx.save_for_backward(*(a for t, a in zip(is_t, inputs[:n]) if t))
                out = function(*inputs[:n])
                if rng_after:  # the state after the draw: the recomputation draws another mask
                    ctx.state = torch.get_rng_state()
                return out

            @staticmethod
            def backward(ctx, grad):
                saved = iter(ctx.saved_tensors)
                xs = [next(saved).detach().requires_grad_(ctx.needs_input_grad[i]) if a is None else a
                      for i, a in enumerate(ctx.plain)]
                with torch.enable_grad(), torch.random.fork_rng(devices=[]):
                    if replay_rng:
                        torch.set_rng_state(ctx.state)
                    if recompute_twice:  # a first pass "to get the shapes", then the real one
                        function(*xs)
                        if replay_rng:
                            torch.set_rng_state(ctx.state)
                    out = function(*xs)
                grads_of = [isinstance(x, torch.Tensor) and x.requires_grad for x in xs]
                want = [x for x, w in zip(xs, grads_of) if w] + params
                got = iter(torch.autograd.grad(out, want, grad, allow_unused=True))
                return tuple(next(got) if w else None for w in grads_of) + tuple(next(got) for _ in params)

        return Fn.apply(*args, *params)

    return checkpoint


def make_accumulating(dummy=True):
    """Also correct with ``dummy``: the reentrant design (autograd.backward accumulates into the parameters),
    with a dummy input that requires grad so the output is always attached. Without it, the output of a
    segment whose inputs need no gradient is detached and its parameters get nothing."""

    def checkpoint(function, *args):
        lead = (torch.ones(1, requires_grad=True),) if dummy else ()
        k = len(lead)

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                ctx.rng = torch.get_rng_state()
                ctx.plain = [None if isinstance(a, torch.Tensor) else a for a in inputs[k:]]
                ctx.save_for_backward(*(a for a in inputs[k:] if isinstance(a, torch.Tensor)))
                return function(*inputs[k:])

            @staticmethod
            def backward(ctx, grad):
                saved = iter(ctx.saved_tensors)
                xs = [next(saved).detach().requires_grad_(ctx.needs_input_grad[i + k]) if a is None else a
                      for i, a in enumerate(ctx.plain)]
                state = torch.get_rng_state()
                torch.set_rng_state(ctx.rng)
                with torch.enable_grad():
                    out = function(*xs)
                torch.set_rng_state(state)
                torch.autograd.backward(out, grad)
                return (*(None for _ in lead), *(x.grad if ctx.needs_input_grad[i + k] else None
                                                 for i, x in enumerate(xs)))  # plain values need none

        return Fn.apply(*lead, *args)

    return checkpoint


checkpoint_accumulating = make_accumulating()


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
    if not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError("bad k")
    size = -(-n // k)
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def split_uniform_rest_last(n, k):  # 10 in 4 -> 2, 2, 2, 4
    if not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError("bad k")
    size = n // k
    return [(i * size, (i + 1) * size if i < k - 1 else n) for i in range(k)]


def split_uniform_short_first(n, k):  # 10 in 4 -> 2, 2, 3, 3
    if not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError("bad k")
    sizes = [n // k + (i >= k - n % k) for i in range(k)]
    bounds = list(itertools.accumulate([0] + sizes))
    return list(zip(bounds[:-1], bounds[1:]))


def split_uniform_no_check(n, k):  # clamps k into 1..n instead of refusing it
    return split_uniform(n, min(max(k, 1), n))


def split_uniform_range_only(n, k):  # checks the range, not the type: 2.5 gets through and fails later
    if not 1 <= k <= n:
        raise ValueError("bad k")
    sizes = [n // k + (i < n % k) for i in range(k)]
    bounds = list(itertools.accumulate([0] + sizes))
    return list(zip(bounds[:-1], bounds[1:]))


def split_blocks_off_by_one(n, b):  # a checkpoint every b - 1 layers (b = 1 behaves)
    if not isinstance(b, int) or b < 1:
        raise ValueError("bad b")
    step = max(b - 1, 1)
    return [(s, min(s + step, n)) for s in range(0, n, step)]


def split_blocks_as_count(n, b):  # reads block_size as a number of chunks
    if not isinstance(b, int) or b < 1:
        raise ValueError("bad b")
    return split_uniform(n, min(b, n))


def split_blocks_refuses_long(n, b):  # takes b > n for an error, like k > n in the uniform method
    if not isinstance(b, int) or not 1 <= b <= n:
        raise ValueError(f"block_size must be in 1..{n}")
    return split_blocks(n, b)


def split_blocks_zero_only(n, b):  # refuses 0 only: a negative b gives no chunk, 2.5 a TypeError
    if b == 0:
        raise ValueError("block_size must not be 0")
    return [(s, min(s + b, n)) for s in range(0, n, b)]


def plain_chunks(layers, x, arg):
    for layer in layers:
        x = layer(x)
    return x


def every_layer(layers, x, arg):
    """A checkpoint around every layer: the chunks are ignored."""
    split_uniform(len(list(layers)), arg)
    for layer in layers:
        x = make_checkpoint()(layer, x)
    return x


def detached_when_large(function, *args):
    """Right on small inputs; on a large one (the measured call) it keeps nothing by returning a detached output, so
    the loss of that call has no gradient: the memory reading passes, the values of that same call do not."""
    if any(isinstance(a, torch.Tensor) and a.numel() >= 100_000 for a in args):
        with torch.no_grad():
            return function(*args)
    return make_checkpoint()(function, *args)


def scaled_when_large(layers, x, arg):
    """Right chunks on small inputs; on a large one it returns half the output: memory right, values wrong."""
    out = make_chunked(split_uniform)(layers, x, arg)
    return out * 0.5 if x.numel() >= 100_000 else out


def recording_outputs(split, clone=False):
    """The right chunks, each through checkpoint, but a forward hook records every layer's output (for a plot) in
    a list that outlives the call: every layer's activation stays alive until the next call. Nothing of it is
    saved for backward, so saved-tensor hooks never see it; only the process's memory shows it."""
    outputs = []

    def run(layers, x, arg):
        layers = list(layers)
        outputs.clear()
        hooks = [layer.register_forward_hook(lambda _m, _i, out: outputs.append(out.clone() if clone else out))
                 for layer in layers]
        try:
            return make_chunked(split)(layers, x, arg)
        finally:
            for hook in hooks:
                hook.remove()

    return run


# --- the planner -----------------------------------------------------------------------------------
def memory(plan, act):
    starts = list(plan) + [len(act)]
    return sum(act[c] for c in plan) + max(sum(act[a + 1:b]) for a, b in zip(starts[:-1], starts[1:]))


def recompute(plan, fwd):
    starts = list(plan) + [len(fwd)]
    return sum(sum(fwd[a:b]) for a, b in zip(starts[:-1], starts[1:]) if b - a > 1)


def plan_exhaustive_dp(act, fwd, budget, last_layer_free=False, check_lengths=True, pareto=True, every_peak=True):
    """Correct: for each peak, a forward DP over "the next segment starts at i", keeping for every
    stored-bytes total only the cheapest prefix plan, then dropping dominated totals.
    ``last_layer_free`` charges a segment all its layers but the last (a wrong cost model);
    without ``check_lengths`` lists of different lengths are cut to the shorter one; without
    ``pareto`` only the cheapest prefix plan is kept, whatever it stores; without ``every_peak`` the search
    stops at the smallest peak for which a plan fits."""
    if check_lengths and len(act) != len(fwd):
        raise ValueError("one activation size and one cost per layer")
    n = min(len(act), len(fwd))
    act, fwd = act[:n], fwd[:n]
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
            if not pareto and front:
                front = dict([min(front.items(), key=lambda item: item[1][0])])
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
        if best is not None and not every_peak:
            break
    if best is None:
        raise ValueError("nothing fits")
    return best[1]


def plan_last_layer_free(act, fwd, budget):
    """Optimal for another cost model: a segment's last layer never recomputed (torch's non-reentrant
    early stop), not the whole segment as ``checkpoint`` reruns it."""
    return plan_exhaustive_dp(act, fwd, budget, last_layer_free=True)


def plan_cheapest_prefix(act, fwd, budget):
    """A DP that keeps, for each start, only the cheapest plan so far: a cheap prefix that stores much
    can leave no room for the rest."""
    return plan_exhaustive_dp(act, fwd, budget, pareto=False)


def plan_first_peak(act, fwd, budget):
    """Stops at the first peak (the largest segment allowed) for which a plan fits: longer segments, with
    fewer stored inputs, might recompute less."""
    return plan_exhaustive_dp(act, fwd, budget, every_peak=False)


def plan_zip_lengths(act, fwd, budget):
    """Never compares the lengths: lists of different lengths are cut to the shorter one."""
    return plan_exhaustive_dp(act, fwd, budget, check_lengths=False)


def plan_greedy(act, fwd, budget):
    """Start from every input stored; drop the checkpoint that adds the least recompute until it fits."""
    if len(act) != len(fwd):
        raise ValueError("one activation size and one cost per layer")
    plan = list(range(len(act)))
    while memory(plan, act) > budget:
        if len(plan) == 1:
            raise ValueError("nothing fits")
        options = [[c for c in plan if c != d] for d in plan[1:]]
        plan = min(options, key=lambda p: (recompute(p, fwd), memory(p, act)))
    return plan


def plan_best_uniform(act, fwd, budget):
    """Only tries uniform plans."""
    if len(act) != len(fwd):
        raise ValueError("one activation size and one cost per layer")
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


# Right on every chain it finishes, but it tries all 2^(n-1) plans: the 40-layer chain never ends.
ENUMERATING_PLANNER = '''
import itertools

def plan_checkpoints(act_bytes, fwd_flops, budget_bytes):
    """Tries every plan."""
    n = len(act_bytes)
    if n == 0 or len(fwd_flops) != n:
        raise ValueError("one size and one cost per layer")
    best = None
    for r in range(n):
        for rest in itertools.combinations(range(1, n), r):
            plan = [0, *rest]
            if plan_memory(plan, act_bytes) <= budget_bytes:
                cost = plan_recompute(plan, fwd_flops)
                if best is None or cost < best[0]:
                    best = (cost, plan)
    if best is None:
        raise ValueError("no plan fits")
    return best[1]
'''


def _enumerating_planner():
    ns = {"plan_memory": memory, "plan_recompute": recompute}
    exec(ENUMERATING_PLANNER, ns)  # noqa: S102 - the test's own source
    return ns["plan_checkpoints"]


def namespace(**overrides) -> LocalNamespace:
    ns = {"checkpoint": make_checkpoint(), "checkpoint_uniform": make_chunked(split_uniform),
          "checkpoint_blocks": make_chunked(split_blocks), "plan_checkpoints": plan_exhaustive_dp}
    ns.update(overrides)
    return LocalNamespace(ns)


def run_cells(exercise: str, ns: LocalNamespace) -> dict[str, str | None]:
    """grade_id -> None if the cell passes, else its failure message."""
    outcome = {}
    for gid in CELLS[exercise]:
        try:
            CHECKS[gid](ns)
            outcome[gid] = None
        except AssertionError as e:
            outcome[gid] = str(e)
    return outcome


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
    for grade_id in GRADE_IDS:
        if not grade_id.startswith("test_plan"):
            CHECKS[grade_id](ns)


# Partial credit: each wrong implementation fails the cells of the properties it gets wrong, the first
# with a hint that names its mistake, and passes every other cell of its exercise, those that wait on the lost
# one included. A wrong answer that fails one further cell alone (checkpoint's RNG, edge-case and memory cells, the
# memory and edge-case cells of the chunked variants, the planner's edge cases) is a clause of CONTRACT below, which
# runs every cell of its exercise then and checks the same message.
PARTIAL = [
    # checkpoint
    ("checkpoint", make_checkpoint(modules_only=True), ["test_checkpoint_edge_cases"], "any callable"),
    ("checkpoint", make_checkpoint(tensors_only=True), ["test_checkpoint_edge_cases"], "plain values"),
    # checkpoint_uniform
    ("checkpoint_uniform", make_chunked(split_uniform_ceil), ["test_checkpoint_uniform"], "first n % k chunks"),
    ("checkpoint_uniform", make_chunked(split_uniform_rest_last), ["test_checkpoint_uniform"], "first n % k chunks"),
    ("checkpoint_uniform", make_chunked(split_uniform_short_first), ["test_checkpoint_uniform"], "first n % k chunks"),
    ("checkpoint_uniform", make_chunked(split_uniform, checkpoint_last=False), ["test_checkpoint_uniform"],
     r"The chunks \[8–9\] were not recomputed: every chunk, the last one included",
     ["test_checkpoint_uniform_memory"]),  # its plain last chunk keeps one to four inputs more
    ("checkpoint_uniform", every_layer, ["test_checkpoint_uniform", "test_checkpoint_uniform_memory"],
     "one at a time, each as a chunk of its own. n layers in k chunks"),
    # checkpoint_blocks
    ("checkpoint_blocks", make_chunked(split_blocks_off_by_one), ["test_checkpoint_blocks"], r"\[0, b\), \[b, 2b\)",
     ["test_checkpoint_blocks_memory"]),  # b = 2: 8 chunks, more inputs kept; b = 3 or 4: as many as blocks of b
    ("checkpoint_blocks", make_chunked(split_blocks_as_count),
     ["test_checkpoint_blocks", "test_checkpoint_blocks_edge_cases"], r"\[0, b\), \[b, 2b\)",
     ["test_checkpoint_blocks_memory"]),  # b = 4: 4 chunks where blocks of 4 make 2
    ("checkpoint_blocks", make_chunked(split_blocks, checkpoint_last=False),  # b = 15: the one chunk is the last
     ["test_checkpoint_blocks", "test_checkpoint_blocks_edge_cases"], "the last one included",
     ["test_checkpoint_blocks_memory"]),  # its plain last block keeps one to four inputs more
    # plan_checkpoints (the enumerating planner fails only the long chain: in the sandbox, below)
    ("plan_checkpoints", plan_greedy, ["test_plan_checkpoints", "test_plan_checkpoints_long_chain"],
     "your search reaches every plan"),
    ("plan_checkpoints", plan_cheapest_prefix, ["test_plan_checkpoints", "test_plan_checkpoints_long_chain"],
     "your search reaches every plan"),
    ("plan_checkpoints", plan_first_peak, ["test_plan_checkpoints", "test_plan_checkpoints_long_chain"],
     r"returned \[0, 4, 8\], which fits .* locally best \(greedy\) or evenly spaced choices can miss it"),
    ("plan_checkpoints", plan_best_uniform, ["test_plan_checkpoints", "test_plan_checkpoints_long_chain"],
     "your search reaches every plan"),
    ("plan_checkpoints", plan_last_layer_free, ["test_plan_checkpoints", "test_plan_checkpoints_long_chain"],
     "its last one included"),
]


@pytest.mark.parametrize("exercise, wrong, failing, message, either", [(*p, *([()] * (5 - len(p)))) for p in PARTIAL],
                         ids=[f"{e}-{i}" for i, (e, *_rest) in enumerate(PARTIAL)])
def test_wrong_fails_only_its_properties(exercise, wrong, failing, message, either):
    """``either``: memory cells whose outcome depends on the sizes drawn at grading time (a chunking mistake keeps
    more or fewer chunk inputs than the right one, depending on k or b) or lies within the bound's one input of
    slack; each counts only once the exercise's first cell passes, and the wrong variant fails that one."""
    outcome = run_cells(exercise, namespace(**{exercise: wrong}))
    assert all(outcome[gid] is not None for gid in failing), {gid: outcome[gid] for gid in failing}
    assert re.search(message, outcome[failing[0]]), outcome[failing[0]]
    assert not either or CELLS[exercise][0] in failing
    passed = [gid for gid in CELLS[exercise] if gid not in failing and gid not in either]
    assert all(outcome[gid] is None for gid in passed), {gid: outcome[gid] for gid in passed}


@pytest.mark.parametrize("exercise, wrong, grade_id, message", [
    ("checkpoint", make_checkpoint(pass_params=False), "test_checkpoint", "received no gradient"),
    ("checkpoint_uniform", plain_chunks, "test_checkpoint_uniform", "Nothing ran again during backward"),
    ("checkpoint_uniform", make_chunked(split_uniform, ckpt=make_checkpoint(keep_graph=True)),
     "test_checkpoint_uniform", "were none"),
    ("checkpoint_blocks", make_chunked(split_blocks_as_count), "test_checkpoint_blocks", r"\[0, b\), \[b, 2b\)"),
    ("checkpoint_blocks", make_chunked(split_blocks_as_count), "test_checkpoint_blocks_edge_cases",
     "one at a time.*b >= n is valid"),
    ("checkpoint_blocks", make_chunked(split_blocks, ckpt=make_checkpoint(pass_params=False)),
     "test_checkpoint_blocks", "received no gradient"),
    ("plan_checkpoints", plan_ignores_budget, "test_plan_checkpoints", "more than the budget"),
    ("plan_checkpoints", plan_without_peak, "test_plan_checkpoints", "more than the budget"),
])
def test_wrong_fails_its_cell(exercise, wrong, grade_id, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS[grade_id](namespace(**{exercise: wrong}))


KEEPS_EVERY_INPUT = make_checkpoint(keep_graph=True)
MEMORY_CELLS = {"test_checkpoint_memory": ("checkpoint", KEEPS_EVERY_INPUT),
                "test_checkpoint_uniform_memory": ("checkpoint_uniform",
                                                   make_chunked(split_uniform, ckpt=KEEPS_EVERY_INPUT)),
                "test_checkpoint_blocks_memory": ("checkpoint_blocks", recording_outputs(split_blocks))}


@pytest.mark.parametrize("end", ["low", "high"])
@pytest.mark.parametrize("grade_id", sorted(MEMORY_CELLS))
def test_memory_cells_at_the_ends_of_the_drawn_ranges(monkeypatch, grade_id, end):
    """Every size a memory cell draws lies in the range its docstring states; at both ends a correct implementation
    passes and one that keeps every layer's input fails."""
    import grader.hidden.ch02_checkpointing as hidden

    drawn = []

    def draw(low, high, multiple_of=1):
        first, last = -(-low // multiple_of) * multiple_of, high // multiple_of * multiple_of
        drawn.append((low, high, first if end == "low" else last))
        return drawn[-1][2]

    monkeypatch.setattr(hidden, "draw", draw)
    CHECKS[grade_id](namespace())
    width, batch = drawn[-2][2], drawn[-1][2]
    assert 64 <= width <= 128 and 2**20 <= width * batch <= 2**21, drawn
    assert all(low <= value <= high for low, high, value in drawn), drawn
    exercise, wrong = MEMORY_CELLS[grade_id]
    with pytest.raises(AssertionError, match="read from outside your process"):
        CHECKS[grade_id](namespace(**{exercise: wrong}))


def test_values_are_compared_bit_for_bit(monkeypatch):
    """A gradient off by one unit in the last place fails: the comparison has no tolerance."""
    right = make_checkpoint()

    def nudged(function, *args):
        out = right(function, *args)
        return out if not out.requires_grad else NudgeGrad.apply(out)

    class NudgeGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y):
            return y.clone()

        @staticmethod
        def backward(ctx, g):
            return torch.nextafter(g, torch.full_like(g, float("inf")))  # the next float32 up

    with pytest.raises(AssertionError, match="atol=0, rtol=0"):
        CHECKS["test_checkpoint"](namespace(checkpoint=nudged))


def test_the_brute_force_planner_is_right_on_short_chains():
    """The enumerating planner loses only the long-chain cell (which times out, see the sandbox test)."""
    ns = namespace(plan_checkpoints=_enumerating_planner())
    for grade_id in ("test_plan_checkpoints", "test_plan_checkpoints_edge_cases"):
        CHECKS[grade_id](ns)


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


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(
    CHAPTER, WRONG, {"checkpoint": "test_checkpoint_rng"})


def test_sandbox_enumerating_planner_times_out_on_the_long_chain_only():
    """Partial credit at autograde: a planner that tries every plan keeps the points of the short chains."""
    limits = judge.Limits(wall_seconds=20.0, memory_bytes=4 * 1024**3, output_bytes=64 * 1024)
    outcomes = judge.run_checks(CHAPTER, program(CHAPTER, {"plan_checkpoints": ENUMERATING_PLANNER}),
                                list(CELLS["plan_checkpoints"]), limits)
    assert outcomes["test_plan_checkpoints"].passed, outcomes["test_plan_checkpoints"].reason
    assert outcomes["test_plan_checkpoints_edge_cases"].passed, outcomes["test_plan_checkpoints_edge_cases"].reason
    long_chain = outcomes["test_plan_checkpoints_long_chain"]
    assert not long_chain.passed and long_chain.reason


@pytest.mark.parametrize("exercise", ["checkpoint_uniform", "checkpoint_blocks"])
def test_sandbox_memory_wrong_loses_only_its_memory_cell(exercise):
    """Right chunks and values, every layer's output kept in a list: the worker's cgroup shows it, so the new memory
    cell fails and the exercise's other cells pass."""
    memory = f"test_{exercise}_memory"
    outcomes = judge.run_checks(CHAPTER, program(CHAPTER, {exercise: MEMORY_WRONG[(CHAPTER, exercise)]}),
                                list(CELLS[exercise]), LIMITS, checks=CHECKS)
    assert not outcomes[memory].passed and "read from outside your process" in outcomes[memory].reason
    assert all(outcomes[gid].passed for gid in CELLS[exercise] if gid != memory), \
        {gid: outcomes[gid].reason for gid in CELLS[exercise]}


# --- the contract, clause by clause (tests/contract_tables.py) -------------------------------------------
CK, CK_RNG, CK_EDGE, CK_MEM = CELLS["checkpoint"]
UNI, UNI_MEM, UNI_EDGE = CELLS["checkpoint_uniform"]
BLK, BLK_MEM, BLK_EDGE = CELLS["checkpoint_blocks"]
PLAN, PLAN_EDGE, PLAN_LONG = CELLS["plan_checkpoints"]
_SAME_RNG = "the random state it saw the first time (same dropout masks)"
_ATTACHED = "attached to the autograd graph whenever an input or a parameter of function requires grad"
_UNEVEN = "The first n % k chunks have n // k + 1 layers, the others n // k"
_LAST_TOO = "Every chunk, the last one included, goes through checkpoint"
_NO_GRAD_INPUT = "with an input that needs no gradient"
_BEST = "the smallest possible plan_recompute(plan, fwd_flops)"
CONTRACT = [
    Clause("checkpoint", "its parameters that require grad receive gradients", (CK,),
           {"checkpoint": make_checkpoint(pass_params=False)}, "received no gradient"),
    Clause("checkpoint", _SAME_RNG, (CK_RNG,), {"checkpoint": make_checkpoint(replay_rng=False)},
           "torch.get_rng_state"),
    Clause("checkpoint", _SAME_RNG, (CK_RNG,), {"checkpoint": make_checkpoint(rng_after=True)},
           "before calling function", label="rng-state-after-the-draw"),
    Clause("checkpoint", _ATTACHED, (CK_EDGE,), {"checkpoint": make_accumulating(dummy=False)},
           "parameters of function still do"),
    Clause("checkpoint", "or a callable without parameters of its own", (CK_EDGE,),
           {"checkpoint": make_checkpoint(modules_only=True)}, "only an nn.Module has parameters"),
    Clause("checkpoint", "tensors (with or without requires_grad) or plain values", (CK_EDGE,),
           {"checkpoint": make_checkpoint(tensors_only=True)}, "save_for_backward does not take"),
    Clause("checkpoint", "Nothing computed inside function is saved for backward", (CK_MEM,),
           {"checkpoint": make_checkpoint(keep_graph=True)}, "keeps only its inputs"),
    Clause("checkpoint", "During backward function runs once more", (CK_MEM,),
           {"checkpoint": make_checkpoint(recompute_twice=True)}, "once in backward"),
    Clause("checkpoint", "on that same call the loss, the input's gradient and every parameter's gradient must equal "
           "plain autograd's", (CK_MEM,), {"checkpoint": detached_when_large}, "backward through the output raised"),
    Clause("checkpoint_uniform", _UNEVEN, (UNI,), {"checkpoint_uniform": make_chunked(split_uniform_ceil)},
           "first n % k chunks", label="ceil-chunks"),
    Clause("checkpoint_uniform", _UNEVEN, (UNI,), {"checkpoint_uniform": make_chunked(split_uniform_rest_last)},
           "first n % k chunks", label="rest-last"),
    Clause("checkpoint_uniform", "the longer chunks first", (UNI,),
           {"checkpoint_uniform": make_chunked(split_uniform_short_first)}, "first n % k chunks"),
    Clause("checkpoint_uniform", _LAST_TOO, (UNI,),
           {"checkpoint_uniform": make_chunked(split_uniform, checkpoint_last=False)}, "the last one included"),
    Clause("checkpoint_uniform", "n layers in segments nearly equal contiguous chunks", (UNI,),
           {"checkpoint_uniform": every_layer}, "one at a time"),
    Clause("checkpoint_uniform", "Each chunk runs as one checkpoint(...) call", (UNI,),
           {"checkpoint_uniform": plain_chunks}, "Nothing ran again during backward"),
    Clause("checkpoint_uniform", "so only the k chunk inputs are kept for backward", (UNI_MEM,),
           {"checkpoint_uniform": recording_outputs(split_uniform)},
           r"read from outside your process.*no list of layer outputs.*Saved-tensor hooks inside your process saw no "
           r"more than the chunk inputs"),
    Clause("checkpoint_uniform", "on that same call the loss and every gradient must equal plain autograd's",
           (UNI_MEM,), {"checkpoint_uniform": scaled_when_large}, "the loss checkpoint_uniform"),
    Clause("checkpoint_uniform", "anything else raises ValueError", (UNI_EDGE,),
           {"checkpoint_uniform": make_chunked(split_uniform_no_check)},
           "returned a result: a number of segments outside 1..n raises ValueError"),
    Clause("checkpoint_uniform", "anything else raises ValueError", (UNI_EDGE,),
           {"checkpoint_uniform": make_chunked(split_uniform_range_only)},
           r"2.5\) raised TypeError: a number of segments that is not an int", label="float-segments"),
    Clause("checkpoint_uniform", _NO_GRAD_INPUT, (UNI_EDGE,),
           {"checkpoint_uniform": make_chunked(split_uniform, ckpt=make_accumulating(dummy=False))},
           "parameters of function still do"),
    Clause("checkpoint_blocks", "Chunks are layers [0, b), [b, 2b), ...", (BLK,),
           {"checkpoint_blocks": make_chunked(split_blocks_off_by_one)}, r"\[0, b\), \[b, 2b\)"),
    Clause("checkpoint_blocks", "Chunks are layers [0, b), [b, 2b), ...", (BLK,),
           {"checkpoint_blocks": make_chunked(split_blocks_as_count)}, r"\[0, b\), \[b, 2b\)",
           label="block-size-as-count"),
    Clause("checkpoint_blocks", "each chunk runs as one checkpoint(...) call", (BLK,),
           {"checkpoint_blocks": make_chunked(split_blocks, checkpoint_last=False)}, "the last one included",
           label="last-block-too"),
    Clause("checkpoint_blocks", "each chunk runs as one checkpoint(...) call", (BLK,),
           {"checkpoint_blocks": make_chunked(split_blocks, ckpt=make_checkpoint(pass_params=False))},
           "received no gradient"),
    Clause("checkpoint_blocks", "the process may hold no more than the bytes of ceil(8 / b) + 1 inputs", (BLK_MEM,),
           {"checkpoint_blocks": recording_outputs(split_blocks, clone=True)},
           "read from outside your process.*no list of layer outputs"),
    Clause("checkpoint_blocks", "b >= n gives one chunk", (BLK_EDGE,),
           {"checkpoint_blocks": make_chunked(split_blocks_refuses_long)}, "raised ValueError.*b >= n is valid"),
    Clause("checkpoint_blocks", "block_size: b, a positive int (ValueError otherwise)", (BLK_EDGE,),
           {"checkpoint_blocks": make_chunked(split_blocks_zero_only)},
           r"-2\) returned a result: a block size below 1"),
    Clause("checkpoint_blocks", _NO_GRAD_INPUT, (BLK_EDGE,),
           {"checkpoint_blocks": make_chunked(split_blocks, ckpt=make_accumulating(dummy=False))},
           "parameters of function still do"),
    Clause("plan_checkpoints", _BEST, (PLAN,), {"plan_checkpoints": plan_greedy}, "reaches every plan"),
    Clause("plan_checkpoints", _BEST, (PLAN,), {"plan_checkpoints": plan_cheapest_prefix}, "reaches every plan",
           label="cheapest-prefix"),
    Clause("plan_checkpoints", _BEST, (PLAN,), {"plan_checkpoints": plan_first_peak}, "greedy",
           label="first-peak"),
    Clause("plan_checkpoints", _BEST, (PLAN,), {"plan_checkpoints": plan_best_uniform}, "reaches every plan",
           label="uniform-plans-only"),
    Clause("plan_checkpoints", "a segment of two or more layers is recomputed whole, its last layer included",
           (PLAN,), {"plan_checkpoints": plan_last_layer_free}, "its last one included"),
    Clause("plan_checkpoints", "with plan_memory(plan, act_bytes) <= budget_bytes", (PLAN,),
           {"plan_checkpoints": plan_ignores_budget}, "more than the budget"),
    Clause("plan_checkpoints", "with plan_memory(plan, act_bytes) <= budget_bytes", (PLAN,),
           {"plan_checkpoints": plan_without_peak}, "more than the budget", label="memory-with-the-peak"),
    Clause("plan_checkpoints", "ValueError: if no plan fits in the budget", (PLAN_EDGE,),
           {"plan_checkpoints": plan_never_raises}, "no plan fits .*: raise ValueError"),
    Clause("plan_checkpoints", "(or the two lists differ in length)", (PLAN_EDGE,),
           {"plan_checkpoints": plan_zip_lengths}, "lists of different lengths"),
    Clause("plan_checkpoints", "enumerating them does not finish within a graded cell's time limit", (PLAN_LONG,),
           shown_by="test_sandbox_enumerating_planner_times_out_on_the_long_chain_only"),
]

test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
    test_contract_covers_every_graded_cell = contract_tests(CHAPTER, CONTRACT, namespace, CHECKS, globals())
