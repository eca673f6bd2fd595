"""Hidden tests of ch11_data_parallel: ddp_step, shard_bounds, ShardedAdam, zero_memory, comm_volume.

Every reference is computed here: one process training on all ranks' batches together (ddp_step), torch.optim.Adam
on the averaged gradients or a sharded reference on the same kind of world (ShardedAdam), the formulas (the rest).
The worlds the student's code gets are made in its process by a probe; a PartialWorld, whose other ranks hold a
constant, tells code that reaches the other ranks through the collectives from code that averages what it was
given. ShardedAdam's memory is read from outside the student's process (its cgroup) after a step on a model of 2 to
3 million float32 parameters over 3 or 4 ranks, sizes drawn at grading time, with the parameters of that step
checked against the reference.
"""
from __future__ import annotations

import copy
import math
from fractions import Fraction

import torch
from torch import nn

from coursekit.checks import check_close, same_close
from coursekit.distributed import PartialWorld, SimWorld
from grader import probes
from grader.api import fetch, hidden_test
from grader.resources import MiB, Meter, draw, mib, new_seed

TOL = dict(atol=1e-10, rtol=1e-8)  # float64


def _made(nb, probe, *args):
    """``probe(*args)`` run in the student's process, its result left there: a handle (``nb.apply`` fetches)."""
    return nb.put(probe)(*args)


def _world(nb, size, ranks=None, seed=None):
    """A SimWorld, or a PartialWorld playing ``ranks`` whose other ranks' tensors are drawn from ``seed`` (drawn at
    grading time: the student's code cannot predict them), sent into the student's process."""
    return nb.put(SimWorld(size) if ranks is None else PartialWorld(size, ranks, seed=seed))


def _raises_value_error(nb, fn, *args, **kwargs) -> bool:
    names = fetch(nb.apply(probes.raised, fn, *args, **kwargs))
    return names is not None and "ValueError" in names


# --- ddp_step ------------------------------------------------------------------------------------------------------
def _mlp(sizes, seed: int, frozen: bool = False) -> nn.Sequential:
    g = torch.Generator().manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        lin = nn.Linear(a, b).double()
        with torch.no_grad():
            lin.weight.copy_(torch.randn(b, a, generator=g, dtype=torch.float64) / math.sqrt(a))
            lin.bias.copy_(torch.randn(b, generator=g, dtype=torch.float64) * 0.1)
        layers.append(lin)
        if i < len(sizes) - 2:
            layers.append(nn.Tanh())
    model = nn.Sequential(*layers)
    if frozen:
        model[0].bias.requires_grad_(False)
    return model


def _optimizer(kind: str, params, lr: float):
    return {"sgd": lambda: torch.optim.SGD(params, lr=lr, momentum=0.9),
            "adam": lambda: torch.optim.Adam(params, lr=lr)}[kind]()


def _batches(n_steps: int, n_ranks: int, B: int, d_in: int, d_out: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(B, d_in, generator=g, dtype=torch.float64), torch.randn(B, d_out, generator=g,
                                                                                     dtype=torch.float64))
             for _ in range(n_ranks)] for _ in range(n_steps)]


def _mse(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def _one_process(model, kind, lr, steps):
    """One process on all ranks' batches of each step, concatenated: the reference of a full world."""
    model = copy.deepcopy(model)
    opt = _optimizer(kind, [p for p in model.parameters() if p.requires_grad], lr)
    losses = []
    for batches in steps:
        opt.zero_grad()
        x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        losses.append([_mse(model, b).item() for b in batches])
        _mse(model, (x, y)).backward()
        opt.step()
    return model, losses


def _partial_reference(model, kind, lr, steps, world: PartialWorld):
    """The method on a PartialWorld, computed here: every local replica's gradients all-reduced (mean) through the
    judge's copy of the world (the other ranks' tensors drawn from the same seed)."""
    reps = [copy.deepcopy(model) for _ in world.ranks]
    opts = [_optimizer(kind, [p for p in r.parameters() if p.requires_grad], lr) for r in reps]
    for batches in steps:
        for r, o, b in zip(reps, opts, batches):
            o.zero_grad()
            _mse(r, b).backward()
        for params in zip(*(list(r.parameters()) for r in reps)):
            if params[0].requires_grad:
                world.all_reduce([p.grad for p in params], op="mean")
        for o in opts:
            o.step()
    return reps


def _run_ddp(nb, model, kind, lr, steps, world_args):
    """The student's ddp_step on the ranks the world plays, one call per step; the replicas' flat parameters and
    the returned values."""
    world = _world(nb, *world_args)
    n_local = len(world_args[1]) if len(world_args) > 1 and world_args[1] is not None else world_args[0]
    reps = [copy.deepcopy(model) for _ in range(n_local)]
    opts = [_optimizer(kind, list(r.parameters()), lr) for r in reps]  # frozen ones included, as the notebook does
    state = nb.put((reps, opts, probes.ch11_MSELoss()))
    returned = []
    for batches in steps:
        returned.append(fetch(nb.apply(probes.ch07_describe, nb.ddp_step(state[0], state[1], batches[:n_local],
                                                                      state[2], world))))
    frozen = fetch(nb.apply(probes.ch11_param_flags, state[0]))
    return fetch(nb.apply(probes.ch11_flat_params, state[0])), returned, frozen


def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


DDP_CASES = (  # (sizes, optimizer, lr, ranks, steps, batch, seed, frozen); steps None: 3 to 6 drawn at grading time
    ([7, 11, 3], "sgd", 0.1, 2, 2, 5, 1, False),
    ([9, 13, 6, 4], "adam", 0.02, 3, None, 4, 2, False),
    ([5, 8, 2], "sgd", 0.3, 4, None, 6, 3, True),
)
SUM_HINT = ("the replicas equal one process trained with the learning rate multiplied by the number of ranks: average "
            "the gradients (world.all_reduce(..., op='mean')), do not sum them")


def _ddp_hint(model, kind, lr, steps, got) -> str:
    n = len(steps[0])
    # SGD (with momentum) on N times the mean gradient is SGD on the mean with N times the learning rate, every step
    summed, _ = _one_process(model, kind, lr * n, steps) if kind == "sgd" else (None, None)
    if summed is not None and same_close(got[0][:_flat(summed).numel()], _flat(summed), **TOL):
        return SUM_HINT
    if len(steps) > 1:
        return ("every replica must equal one process trained on all ranks' batches together: clear each replica's "
                "gradients before its backward (those of an earlier call must not add in), average every gradient "
                "over the ranks with one all-reduce (op='mean'), then step every optimizer")
    return "average every parameter's gradient over all ranks (op='mean') before stepping every optimizer"


@hidden_test("test_ddp_step_values")
def check_ddp_step_values(nb):
    for sizes, kind, lr, n, n_steps, B, seed, frozen in DDP_CASES:
        n_steps = n_steps or draw(3, 6)
        model = _mlp(sizes, seed, frozen)
        steps = _batches(n_steps, n, B, sizes[0], sizes[-1], new_seed())  # data drawn at grading time
        what = (f"ddp_step on {n} ranks of an MLP {sizes}" + (" with a frozen bias" if frozen else "")
                + f", {kind} lr {lr}, {n_steps} steps, {B} examples per rank")
        flats, _, states = _run_ddp(nb, model, kind, lr, steps, (n,))
        trainable = [p.requires_grad for p in model.parameters()] * n
        moved = [i for i, (st, t) in enumerate(zip(states, trainable))
                 if not t and (st["requires_grad"] or st["has_grad"])]
        if moved:
            raise AssertionError(f"{what}: a parameter with requires_grad=False came back with requires_grad set or a "
                                 "gradient: leave frozen parameters alone (no gradient, no all-reduce, no change)")
        ref, _ = _one_process(model, kind, lr, steps)
        want = _flat(ref)
        for r, got in enumerate(flats):
            if got.shape != want.shape or not same_close(got, want, **TOL):
                hint = _ddp_hint(model, kind, lr, steps, flats)
                check_close(got, want, f"{what}: rank {r}'s parameters", hint, **TOL)


@hidden_test("test_ddp_step_world")
def check_ddp_step_world(nb):
    for size, ranks, kind, lr, seed in ((4, [0, 2], "sgd", 0.1, 7), (3, [1], "adam", 0.05, 8)):
        sizes = [6, 9, 3]
        model = _mlp(sizes, seed)
        steps = _batches(2, len(ranks), 5, sizes[0], sizes[-1], new_seed())
        world_seed = new_seed()
        what = (f"ddp_step on a PartialWorld of {size} ranks playing ranks {ranks} (the other ranks' gradients drawn "
                f"at grading time), {kind}, 2 steps")
        flats, _, _ = _run_ddp(nb, model, kind, lr, steps, (size, ranks, world_seed))
        world = PartialWorld(size, ranks, seed=world_seed)
        want = [_flat(r) for r in _partial_reference(model, kind, lr, steps, world)]
        for i, (got, ref) in enumerate(zip(flats, want)):
            if got.shape != ref.shape or not same_close(got, ref, **TOL):
                alone = _one_process(model, kind, lr, steps)[0]
                hint = ("average the gradients through world.all_reduce(..., op='mean'): the ranks played elsewhere "
                        "contribute theirs only there")
                if same_close(got, _flat(alone), **TOL):
                    hint = ("the replicas were averaged among themselves, without the ranks played elsewhere: "
                            "average every gradient with world.all_reduce(..., op='mean')")
                check_close(got, ref, f"{what}: rank {ranks[i]}'s parameters", hint, **TOL)


@hidden_test("test_ddp_step_returns")
def check_ddp_step_returns(nb):
    sizes = [6, 9, 3]
    model = _mlp(sizes, 11)
    steps = _batches(2, 3, 5, sizes[0], sizes[-1], 311)
    _, returned, _ = _run_ddp(nb, model, "sgd", 0.1, steps, (3,))
    _, ref_losses = _one_process(model, "sgd", 0.1, steps)
    for step, (desc, want) in enumerate(zip(returned, ref_losses)):
        if desc["type"] != "list" or desc["items"] is None or len(desc["items"]) != 3:
            raise AssertionError(f"step {step + 1}: ddp_step returned a {desc['type']}, expected a list of the 3 "
                                 "ranks' losses as Python floats")
        kinds = sorted({item["type"] for item in desc["items"]})
        if kinds != ["float"]:
            raise AssertionError(f"step {step + 1}: the losses are {kinds}, expected Python floats (loss.item())")
        check_close(torch.tensor([item["value"] for item in desc["items"]], dtype=torch.float64),
                    torch.tensor(want, dtype=torch.float64), f"step {step + 1}: the returned losses",
                    "each rank's loss on its own batch, computed before the step", **TOL)
    reps = [copy.deepcopy(model) for _ in range(3)]
    opts = [_optimizer("sgd", r.parameters(), 0.1) for r in reps]
    state = nb.put((reps, opts, probes.ch11_MSELoss()))
    world = _world(nb, 3)
    for args, what in (((state[0], state[1][:2], steps[0], state[2], world), "3 replicas and 2 optimizers"),
                       ((state[0], state[1], steps[0][:2], state[2], world), "3 replicas and 2 batches"),
                       ((state[0][:2], state[1][:2], steps[0][:2], state[2], world), "2 replicas on a world of 3")):
        if not _raises_value_error(nb, nb.ddp_step, *args):
            raise AssertionError(f"ddp_step with {what} should raise ValueError")


# --- shard_bounds --------------------------------------------------------------------------------------------------
def _bounds(numel: int, n: int) -> list[tuple[int, int]]:
    length = -(-numel // n)
    return [(r * length, (r + 1) * length) for r in range(n)]


@hidden_test("test_shard_bounds_values")
def check_shard_bounds_values(nb):
    drawn = [(draw(1, 10**7), draw(1, 64)) for _ in range(4)] + [(draw(1, 15), draw(16, 64))]  # at grading time
    for numel, n in ((37 * 53 + 53, 3), (37 * 53 + 53, 4), (12, 4), (13, 4), (3, 5), (1, 1), (1000, 7), (7, 7),
                     (8, 7), (2**20 + 1, 8), *drawn):
        desc = fetch(nb.apply(probes.ch11_bounds, nb.shard_bounds(numel, n)))
        want = _bounds(numel, n)
        items = desc["items"]
        pairs = ([tuple(e["value"] for e in it["entries"]) for it in items]
                 if items is not None and all(it["entries"] is not None for it in items) else None)
        if pairs is not None and any(v is None for b in pairs for v in b):
            kinds = sorted({e["type"] for it in items for e in it["entries"]})
            raise AssertionError(f"shard_bounds({numel}, {n}) returned pairs of {', '.join(kinds)}: return a list of "
                                 "(start, stop) pairs of Python ints")
        if pairs != want:
            hint = "rank r's shard is [r * L, (r + 1) * L) with L = ceil(numel / world_size), padding at the end"
            if pairs is not None and len(pairs) == n and all(len(b) == 2 for b in pairs):
                floor = numel // n
                if pairs == [(r * floor, (r + 1) * floor) for r in range(n)]:
                    hint = "the shards use floor(numel / N): the last elements belong to no rank; use the ceiling"
                elif pairs[:-1] == want[:-1] and pairs[-1][1] == numel:
                    hint = ("the last shard stops at numel, so it is shorter than the others: pad it to the common "
                            "length L (the padding is part of the last shards)")
            shown = pairs if pairs is not None else f"a {desc['type']}"
            raise AssertionError(f"shard_bounds({numel}, {n}) returned {shown!s:.200}, expected {want!r:.200}: {hint}")
        kinds = sorted({e["type"] for it in items for e in it["entries"]} - {"int"})
        if desc["type"] not in ("list", "tuple") or kinds:
            what = f"a {desc['type']}" if desc["type"] not in ("list", "tuple") else ", ".join(kinds)
            raise AssertionError(f"shard_bounds({numel}, {n}) returned the right bounds as {what}: return a list of "
                                 "(start, stop) pairs of Python ints")


@hidden_test("test_shard_bounds_errors")
def check_shard_bounds_errors(nb):
    for args in ((0, 3), (-4, 2), (10, 0), (10, -1), (10.0, 2), (10, 2.0), (True, 2), (10, True), ("10", 2)):
        if not _raises_value_error(nb, nb.shard_bounds, *args):
            raise AssertionError(f"shard_bounds{args} should raise ValueError")


# --- ShardedAdam ---------------------------------------------------------------------------------------------------
def _make_params(shapes, n, seed, dtype=torch.float64, tie=()):
    return probes.ch11_make_params(shapes, n, seed, dtype, tie)


def _distinct(ps):
    return probes._ch11_distinct(ps)


def _set_grads(params, entry) -> None:
    """The gradients of one step, as the student's process got them (``entry``: a seed, or ``(seed, skip)`` where the
    distinct parameter at position ``skip`` has no ``.grad``), with the missing one as zeros: the text's rule."""
    seed, skip = entry if isinstance(entry, tuple) else (entry, None)
    probes.ch11_set_grads(params, seed, skip)
    for ps in params:
        for p in _distinct(ps):
            if p.grad is None:
                p.grad = torch.zeros_like(p)


def _reference_sharded(params, world, grad_seeds, lr, betas, eps):
    """The method on ``world`` (full or partial), computed here on copies: reduce-scatter (mean) of the padded flat
    gradients, Adam on each played rank's shard, all-gather. Returns the flat parameters per played rank and the
    moments per played rank."""
    params = copy.deepcopy(params)
    distinct = [_distinct(ps) for ps in params]
    numel = sum(p.numel() for p in distinct[0])
    bounds = _bounds(numel, world.size)
    length = bounds[0][1] - bounds[0][0]
    padded = length * world.size
    dtype = distinct[0][0].dtype
    m = {r: torch.zeros(length, dtype=dtype) for r in world.ranks}
    v = {r: torch.zeros(length, dtype=dtype) for r in world.ranks}
    flats = [torch.cat([p.detach().reshape(-1) for p in ps] + [torch.zeros(padded - numel, dtype=dtype)])
             for ps in distinct]
    for t, seed in enumerate(grad_seeds, start=1):
        _set_grads(params, seed)
        grads = [torch.cat([p.grad.reshape(-1) for p in ps] + [torch.zeros(padded - numel, dtype=dtype)])
                 for ps in distinct]
        shards = world.reduce_scatter(grads, op="mean")
        new = []
        for i, (r, g) in enumerate(zip(world.ranks, shards)):
            m[r] = betas[0] * m[r] + (1 - betas[0]) * g
            v[r] = betas[1] * v[r] + (1 - betas[1]) * g * g
            start, stop = bounds[r]
            p = flats[i][start:stop]
            new.append(p - lr * (m[r] / (1 - betas[0] ** t)) / ((v[r] / (1 - betas[1] ** t)).sqrt() + eps))
        flats = world.all_gather(new)
        for ps, flat in zip(distinct, flats):
            with torch.no_grad():
                offset = 0
                for p in ps:
                    p.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
    return [f[:numel] for f in flats], m, v, bounds


def _plain_adam(params, grad_seeds, n, lr, betas, eps):
    """torch.optim.Adam on the average of the ranks' gradients: the reference of a full world."""
    params = copy.deepcopy(params)
    distinct = [_distinct(ps) for ps in params]
    opt = torch.optim.Adam(distinct[0], lr=lr, betas=betas, eps=eps)
    for seed in grad_seeds:
        _set_grads(params, seed)
        for i, p in enumerate(distinct[0]):
            p.grad = sum(distinct[r][i].grad for r in range(n)) / n
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in distinct[0]])


def _run_sharded(nb, shapes, n, seed, world_args, kwargs, grad_seeds, dtype=torch.float64, tie=(),
                 generators=False):
    """The student's ShardedAdam built on parameters made in its process (handed over as one-pass iterators, as
    ``model.parameters()`` gives them, with ``generators``) and stepped once per grad seed (a ``(seed, skip)`` entry
    leaves one parameter without ``.grad``); the flat parameters per played rank, the gradients left after each step
    and the state."""
    n_local = len(world_args[1]) if len(world_args) > 1 else n
    params = _made(nb, probes.ch11_make_params, shapes, n_local, seed, dtype, tie)
    world = _world(nb, *world_args)
    opt = nb.ShardedAdam(_made(nb, probes.ch11_generators, params) if generators else params, world, **kwargs)
    left = []
    for s in grad_seeds:
        entry = s if isinstance(s, tuple) else (s, None)
        nb.apply(probes.ch11_set_grads, params, *entry)
        opt.step()
        left.append(fetch(nb.apply(probes.ch11_grads_left, params)))
    flats = fetch(nb.apply(probes.ch11_flat, params))
    ranks = list(world_args[1]) if len(world_args) > 1 else list(range(n))
    state = fetch(nb.apply(probes.ch11_state, opt, ranks))
    return flats, left, state


SHARD_CASES = (  # (shapes, ranks, steps, lr, betas, eps, tie, seed)
    ([(37, 53), (53,)], 3, 3, 0.01, (0.9, 0.999), 1e-8, (), 21),
    ([(37, 53), (53,)], 4, 2, 0.05, (0.8, 0.95), 1e-6, (), 22),
    ([(16, 9), (9,), (5, 16)], 2, 3, 0.02, (0.9, 0.99), 1e-8, ((3, 0),), 23),  # the first weight listed again
    ([(7,), (3, 3)], 4, 1, 0.1, (0.9, 0.999), 1e-8, (), 24),  # 16 elements over 4: no padding
    ([(5,)], 4, 2, 0.05, (0.9, 0.999), 1e-8, (), 25),  # 5 over 4: shards of 2, the last rank's all padding
)
# Cases with a twist (shapes, ranks, steps, lr, seed, twist): the parameters handed over as one-pass iterators (as
# model.parameters() gives them); the second parameter without .grad at the second step (it counts as zeros); many
# steps (12 to 20, drawn), where bias corrections still matter.
TWIST_CASES = (
    ([(6, 5), (5,)], 3, 3, 0.02, 26, "generators"),
    ([(6, 5), (5,), (4,)], 2, 3, 0.02, 27, "missing grad"),
    ([(9, 4)], 3, None, 0.01, 28, "many steps"),
)
DRAWN_SHARD_CASES = 2  # more cases drawn at grading time: shapes, ranks, 4 to 6 steps, seeds
STEP_HINT = ("the step count t is one per step() call (the bias corrections use it), the same on every rank: keep it "
             "per rank's state, incremented once per step")


def _sharded_hint(flats, want, n, state, steps, start) -> str:
    """What the parameters ``flats`` (per rank, after ``steps`` steps from the flat ``start``) show went wrong."""
    differing = [r for r, f in enumerate(flats) if f.shape != want.shape or not same_close(f, want, **TOL)]
    if 0 < len(differing) < n:
        return (f"ranks {differing} differ from the others: every rank must end with all the updated shards, "
                "all-gathered")
    if all(f.shape == want.shape for f in flats):
        length = -(-want.numel() // n)
        own = [slice(r * length, min((r + 1) * length, want.numel())) for r in range(n)]
        if all(same_close(f[own[r]], want[own[r]], **TOL) for r, f in enumerate(flats)) and all(
                same_close(f[own[q]], start[own[q]], **TOL) for r, f in enumerate(flats) for q in range(n) if q != r):
            return ("each rank updated its own shard only and kept the others' as they were: all-gather the updated "
                    "shards, so that every rank gets the whole updated vector and copies it back into its parameters")
    rows = [state.get(str(r), {}) for r in range(n)] if "error" not in state else []
    counts = sorted({row.get("step") for row in rows if row.get("type") == "dict"}, key=str)
    if counts and counts != [steps]:
        return (f"after {steps} step() calls the ranks' step counts are {counts}: " + STEP_HINT)
    kinds = sorted({str(row[key].dtype) for row in rows if row.get("type") == "dict" for key in ("exp_avg", "exp_avg_sq")
                    if isinstance(row.get(key), torch.Tensor)} - {str(want.dtype)})
    if kinds:
        return (f"the moments are {', '.join(kinds)} while the parameters are {want.dtype}: keep them in the "
                "parameters' dtype")
    return ("every rank's parameters must equal torch.optim.Adam on the averaged gradients: reduce-scatter the padded "
            "flat gradients (op='mean'), Adam on your shard with your moments (bias corrections with this step's "
            "count), all-gather the shards and copy them back. " + STEP_HINT)


def _check_keys(what, state, ranks) -> None:
    """``state``'s keys (every key, as ``repr``) are the ranks this process plays, nothing else."""
    keys = state.get("keys")
    if keys is not None and sorted(keys) != sorted(repr(r) for r in ranks):
        raise AssertionError(f"{what}: state holds the keys {', '.join(sorted(keys))}, expected the ranks this process "
                             f"plays, {list(ranks)} (world.ranks): key state[r] by rank, and keep no state for ranks "
                             "played elsewhere")


def _check_state(what, state, ranks, m, v, steps, dtype, tied=False):
    if "error" in state:
        raise AssertionError(f"{what}: ShardedAdam's {state['error']}: keep state[r] for each rank r this process "
                             "plays")
    for r in ranks:
        row = state.get(str(r), {"type": "missing"})
        if row.get("type") != "dict":
            raise AssertionError(f"{what}: state[{r}] is {row.get('type')}, expected a dict with exp_avg, exp_avg_sq "
                                 "and step")
        for key, ref in (("exp_avg", m[r]), ("exp_avg_sq", v[r])):
            got = row[key]
            if not isinstance(got, torch.Tensor) or got.shape != ref.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else got
                hint = ("a tensor listed twice (tied weights) is one parameter: flatten every distinct tensor once, "
                        "so that Psi and the shards count it once" if tied and isinstance(got, torch.Tensor)
                        and got.numel() > ref.numel() else "each rank keeps the moments of its shard only")
                raise AssertionError(f"{what}: state[{r}]['{key}'] is {shape}, expected a flat tensor of the shard's "
                                     f"length {ref.numel()}: {hint}")
            check_close(got.to(dtype), ref, f"{what}: state[{r}]['{key}']",
                        "rank r's moments of its own shard (zeros at the padding)", **TOL)
        if row["step"] != steps:
            raise AssertionError(f"{what}: state[{r}]['step'] is {row['step']!r} after {steps} step() calls: "
                                 + STEP_HINT)


def _drawn_shard_cases() -> list[tuple]:
    """Cases drawn at grading time: 1 to 3 tensors of awkward shapes, 2 to 5 ranks, 4 to 6 steps, fresh seeds."""
    cases = []
    for _ in range(DRAWN_SHARD_CASES):
        shapes = [tuple(draw(1, 9) for _ in range(draw(1, 2))) for _ in range(draw(1, 3))]
        cases.append((shapes, draw(2, 5), draw(4, 6), 0.01 * draw(1, 5), (0.9, 0.999), 1e-8, (), new_seed() % 10**6))
    return cases


@hidden_test("test_sharded_adam_values")
def check_sharded_adam_values(nb):
    for shapes, n, n_steps, lr, betas, eps, tie, seed in (*SHARD_CASES, *_drawn_shard_cases()):
        grad_seeds = [1000 * seed + t for t in range(n_steps)]
        kwargs = dict(lr=lr, betas=betas, eps=eps)
        what = (f"ShardedAdam on {n} ranks, parameters {shapes}" + (" with a tied weight listed twice" if tie else "")
                + f", {n_steps} steps, lr {lr}, betas {betas}, eps {eps}")
        flats, left, state = _run_sharded(nb, shapes, n, seed, (n,), kwargs, grad_seeds, tie=tie)
        params = _make_params(shapes, n, seed, tie=tie)
        want = _plain_adam(params, grad_seeds, n, lr, betas, eps)
        for r, got in enumerate(flats):
            if got.shape != want.shape or not same_close(got, want, **TOL):
                start = torch.cat([p.detach().reshape(-1) for p in _distinct(params[0])])
                hint = _sharded_hint(flats, want, n, state, n_steps, start)
                if tie and got.shape == want.shape:
                    hint = ("a tensor listed twice (tied weights) is one parameter: shard and update it once. " + hint)
                check_close(got, want, f"{what}: rank {r}'s parameters", hint, **TOL)
        _, m, v, _ = _reference_sharded(params, SimWorld(n), grad_seeds, lr, betas, eps)
        _check_keys(what, state, list(range(n)))
        _check_state(what, state, range(n), m, v, n_steps, torch.float64, tied=bool(tie))
    for shapes, n, n_steps, lr, seed, twist in TWIST_CASES:
        n_steps = n_steps or draw(12, 20)
        grad_seeds = [1000 * seed + t for t in range(n_steps)]
        if twist == "missing grad":
            grad_seeds[1] = (grad_seeds[1], 1)
        what = f"ShardedAdam on {n} ranks, parameters {shapes}, {n_steps} steps, " + {
            "generators": "each rank's parameters handed over as an iterator (as model.parameters() gives them)",
            "missing grad": "the second parameter without .grad at the second step (it counts as zeros)",
            "many steps": "lr 0.01"}[twist]
        flats, _, _ = _run_sharded(nb, shapes, n, seed, (n,), dict(lr=lr), grad_seeds,
                                   generators=twist == "generators")
        want = _plain_adam(_make_params(shapes, n, seed), grad_seeds, n, lr, (0.9, 0.999), 1e-8)
        hint = {"generators": "read each rank's parameters once, in __init__ (an iterator can be read only once)",
                "missing grad": "a parameter whose .grad is None counts as a zero gradient in the flat vector",
                "many steps": "the bias corrections use this step's count t, every step: " + STEP_HINT}[twist]
        for r, got in enumerate(flats):
            check_close(got, want, f"{what}: rank {r}'s parameters", hint, **TOL)


@hidden_test("test_sharded_adam_world")
def check_sharded_adam_world(nb):
    for size, ranks, seed in ((4, [1, 3], 31), (3, [0], 32)):
        shapes = [(11, 7), (7,)]
        grad_seeds = [2000 * seed, 2000 * seed + 1]
        world_seed = new_seed()
        kwargs = dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8)
        what = (f"ShardedAdam on a PartialWorld of {size} ranks playing {ranks} (the other ranks' tensors drawn at "
                "grading time), 2 steps")
        flats, _, state = _run_sharded(nb, shapes, size, seed, (size, ranks, world_seed), kwargs, grad_seeds)
        params = _make_params(shapes, len(ranks), seed)
        want, m, v, _ = _reference_sharded(params, PartialWorld(size, ranks, seed=world_seed), grad_seeds, 0.01,
                                           (0.9, 0.999), 1e-8)
        for i, got in enumerate(flats):
            check_close(got, want[i], f"{what}: rank {ranks[i]}'s parameters",
                        "reach the other ranks only through world.reduce_scatter and world.all_gather, and index your "
                        "shards by world.ranks (params[i] is rank world.ranks[i]'s)", **TOL)
        _check_keys(what, state, ranks)
        _check_state(what, state, ranks, m, v, 2, torch.float64)


@hidden_test("test_sharded_adam_zero2")
def check_sharded_adam_zero2(nb):
    shapes, n, seed = [(13, 6), (6,), (4, 6)], 3, 41
    grad_seeds = [4100, 4101]
    kwargs = dict(lr=0.02, betas=(0.9, 0.999), eps=1e-8, shard_grads=True)
    what = f"ShardedAdam(..., shard_grads=True) on {n} ranks, 2 steps"
    flats, left, _ = _run_sharded(nb, shapes, n, seed, (n,), kwargs, grad_seeds)
    want = _plain_adam(_make_params(shapes, n, seed), grad_seeds, n, 0.02, (0.9, 0.999), 1e-8)
    for r, got in enumerate(flats):
        check_close(got, want, f"{what}: rank {r}'s parameters", "shard_grads changes what is kept, not the update",
                    **TOL)
    for step, flags in enumerate(left):
        kept = [r for r, fl in enumerate(flags) if any(fl)]
        if kept:
            raise AssertionError(f"{what}: after step {step + 1}, ranks {kept} still have full gradients (.grad): "
                                 "with shard_grads=True set every parameter's .grad to None once it is flattened")
    # zero_grad(): on a ZeRO-1 optimizer whose parameters all have gradients, every .grad set to None.
    params = _made(nb, probes.ch11_make_params, shapes, n, seed)
    opt = nb.ShardedAdam(params, _world(nb, n))
    nb.apply(probes.ch11_set_grads, params, 4102)
    left = fetch(nb.apply(probes.ch11_zero_grad, opt, params))
    kept = [r for r, flags in enumerate(left) if any(flags)]
    if kept:
        raise AssertionError(f"ShardedAdam.zero_grad() on {n} ranks: ranks {kept} still have a .grad afterwards: "
                             "zero_grad() sets every parameter's .grad to None")


MEM_CASES = (  # (ranks, parameters, ranks played here, shard_grads): sizes drawn at grading time from these ranges
    ((3, 4), (2_000_000, 3_000_000), "all", False),  # a SimWorld: every rank's replica in this process, ZeRO-1
    ((4, 6), (6_000_000, 8_000_000), "one", True),  # a PartialWorld playing one rank, as a real rank does, ZeRO-2
    ((8, 8), (250_000, 400_000), "all", False),  # a small model on many ranks: full state per rank is 8 times more
)
MEM_STEPS = (2, 4)  # steps inside the reading, drawn
MEM_LR = 0.05  # large enough that moments kept in a lower precision show in the parameters (MEM_TOL)
MEM_TOL = dict(atol=1e-6, rtol=1e-5)
MEM_SLACK = 2 * MiB
# Measured in sandboxed workers at the ends of the ranges (MiB kept after the steps, read from outside; bound = the
# played shards' moments + one length-L float32 tensor per played rank + 2 MiB):
#   case                          course's  bound | full state   one shared   flat gradient   ZeRO-2 keeps   full m, lazy v,
#                                                 | every rank   full state   kept per rank   flat grads     replicas aliased
#   SimWorld 3 ranks, 2.0M          15.9     24.9 |    46.0         15.5          38.5           15.8           46.2
#   SimWorld 4 ranks, 3.0M          23.4     36.3 |    92.3         23.5          69.4           23.5           92.1
#   1 of 4 ranks, 6.0M, ZeRO-2      11.7     19.2 |    46.2         46.2          34.6           34.8           46.2
#   1 of 6 ranks, 8.0M, ZeRO-2      10.6     17.3 |    61.7         61.6          40.9           40.9           61.5
#   SimWorld 8 ranks, 0.25M          1.9      4.9 |    15.9          2.1           9.5            1.9           15.7
#   SimWorld 8 ranks, 0.4M           3.2      6.6 |    25.1          3.2          15.4            3.1           24.7
# Each wrong answer exceeds the bound in at least one case of every draw by 15 MiB or more, far above what a call
# could hide (FOOTPRINT plus GROWTH, 5 MiB); the small case (11 MiB or more for full state per rank) is there for
# code that keeps full state only on small models. State kept for ranks played elsewhere: 150-316 MiB.


def _memory_case(nb, n: int, psi: int, played: str, shard_grads: bool, report: dict | None = None) -> None:
    """Two steps of the student's ShardedAdam on a world of ``n`` ranks (all played here, or one) and about ``psi``
    float32 parameters, built and stepped inside one outside reading; the parameters of those steps against the
    reference. ``report`` (measurements only) gets the numbers instead of the verdict on the memory."""
    meter = Meter(nb)
    cols = 1024
    rows = psi // cols
    shapes = [(rows, cols), (psi - rows * cols + 7,)]
    numel = rows * cols + shapes[1][0]
    seed, world_seed = new_seed() % 100_000, new_seed()
    steps = draw(*MEM_STEPS)
    grad_seeds = [new_seed() % 100_000 for _ in range(steps)]
    length = -(-numel // n)
    ranks = list(range(n)) if played == "all" else [draw(0, n - 1)]
    what = (f"ShardedAdam(..., shard_grads={shard_grads}) on {'a SimWorld of ' if played == 'all' else 'rank '}"
            f"{n if played == 'all' else f'{ranks[0]} of a PartialWorld of {n}'} ranks, {numel:,} float32 parameters "
            f"(shards of {length:,} elements), {steps} steps")
    params = _made(nb, probes.ch11_make_params, shapes, len(ranks), seed, torch.float32)
    meter.booked += len(ranks) * numel * 4  # the replicas' parameters, made in the student's process before the reading
    hold = _made(nb, probes.ch11_views, params)  # their storage stays allocated whatever happens to the parameters
    world = _world(nb, n, None if played == "all" else ranks, world_seed)
    kwargs = dict(lr=MEM_LR, betas=(0.9, 0.999), eps=1e-8, shard_grads=shard_grads)
    # Inside the reading: the optimizer built, then per step gradients given to every parameter and step(); the
    # gradients dropped at the end (by the probe): what the process holds more afterwards is what the optimizer keeps.
    held, out = meter.held_by(lambda: _made(nb, probes.ch11_build_and_step, nb.ShardedAdam, params, world, kwargs,
                                            grad_seeds))
    # Values of those very steps: positions drawn across the vector, the first and last of every shard among them.
    picks = torch.randint(0, numel, (2048,), generator=torch.Generator().manual_seed(seed))
    edges = torch.tensor([b for r in range(n) for b in (r * length, min((r + 1) * length, numel) - 1)])
    index = torch.cat([picks, edges.clamp(max=numel - 1)])
    got = fetch(nb.apply(probes.ch11_flat, params, index))
    ref_params = probes.ch11_make_params(shapes, len(ranks), seed, torch.float32)
    if played == "all":
        want = [_plain_adam(ref_params, grad_seeds, n, MEM_LR, (0.9, 0.999), 1e-8)[index]] * n
    else:
        flats, _, _, _ = _reference_sharded(ref_params, PartialWorld(n, ranks, seed=world_seed), grad_seeds, MEM_LR,
                                            (0.9, 0.999), 1e-8)
        want = [f[index] for f in flats]
    for r, values, ref in zip(ranks, got, want):
        check_close(values, ref, f"{what}: rank {r}'s parameters after the steps",
                    "Adam on the averaged gradients, through the world's collectives, with moments in the parameters' "
                    "dtype", **MEM_TOL)
    moments = 2 * 4 * length * len(ranks)
    bound = moments + 4 * length * len(ranks) + MEM_SLACK
    repointed = fetch(nb.apply(probes.ch11_repointed, params, hold))["repointed"] if held.kept > bound else None
    del hold
    if report is not None:
        report.update(n=n, played=len(ranks), numel=numel, kept=held.kept, peak=held.peak, moments=moments,
                      bound=bound)
        return
    if held.kept > bound:
        raise AssertionError(
            f"{what}: afterwards the optimizer kept {mib(held.kept)} (read from outside your process), while the "
            f"moments of the {len(ranks)} shard{'s' if len(ranks) > 1 else ''} played here take {mib(moments)}; with "
            f"one more length-L float32 tensor per rank played and {mib(MEM_SLACK)} it may keep {mib(bound)}. Keep, "
            "per rank played, the two moments of its own shard only: full-size moments per rank take "
            f"{mib(2 * 4 * numel * len(ranks))}, and nothing of the whole model's size may stay per rank between steps"
            + (". Your step re-pointed parameters at other tensors (.data = ...) instead of updating them in place: the "
               "parameters' own storage stays held (by the model, the caller), so the new tensors come on top of it; "
               "copy the gathered values into the parameters (p.copy_(...))" if repointed and any(repointed) else ""))
    del out


@hidden_test("test_sharded_adam_memory", requires=("test_sharded_adam_values", "test_sharded_adam_world"))
def check_sharded_adam_memory(nb):
    for ranks_range, params_range, played, shard_grads in MEM_CASES:
        _memory_case(nb, draw(*ranks_range), draw(*params_range), played, shard_grads)


@hidden_test("test_sharded_adam_errors")
def check_sharded_adam_errors(nb):
    shapes = [(5, 3), (3,)]
    params = _made(nb, probes.ch11_make_params, shapes, 3, 5)
    world = _world(nb, 3)
    for kwargs in ({"lr": -0.1}, {"betas": (1.0, 0.999)}, {"betas": (0.9, 1.0)}, {"betas": (-0.1, 0.999)},
                   {"eps": -1e-8}):
        if not _raises_value_error(nb, nb.ShardedAdam, params, world, **kwargs):
            raise AssertionError(f"ShardedAdam(params, world, {kwargs}) should raise ValueError")
    two = _made(nb, probes.ch11_make_params, shapes, 2, 5)
    if not _raises_value_error(nb, nb.ShardedAdam, two, world):
        raise AssertionError("ShardedAdam with 2 parameter lists on a SimWorld of 3 ranks should raise ValueError")
    odd = _made(nb, probes.ch11_make_params, [(5, 4), (3,)], 1, 5)
    mixed = _made(nb, probes.ch11_swap_last, _made(nb, probes.ch11_make_params, shapes, 3, 5), odd)
    if not _raises_value_error(nb, nb.ShardedAdam, mixed, world):
        raise AssertionError("ShardedAdam whose ranks' parameters have different shapes should raise ValueError")


# --- zero_memory and comm_volume -----------------------------------------------------------------------------------
def _zero_memory(psi, n, stage, p, g, k):
    shard = -(-psi // n)
    sharded = {0: (), 1: (2,), 2: (1, 2), 3: (0, 1, 2)}[stage]
    return sum(b * (shard if i in sharded else psi) for i, b in enumerate((p, g, k)))


MEMORY_CASES = [(7_500_000_000, 64, s, 2, 2, 12) for s in range(4)] + [
    (1000, 4, s, 4, 4, 8) for s in range(4)] + [
    (1001, 4, s, 2, 2, 12) for s in range(4)] + [
    (37 * 53 + 53, 3, s, 2, 4, 16) for s in range(4)] + [
    (10, 16, s, 1, 3, 5) for s in range(4)] + [
    (123_457, 1, s, 2, 2, 12) for s in range(4)]


def _memory_hint(args, got) -> str:
    psi, n, stage, p, g, k = args
    if got == round(psi * ({0: p + g + k, 1: p + g + k / n, 2: p + (g + k) / n, 3: (p + g + k) / n}[stage])):
        return "shards hold ceil(Psi / N) elements (padding): use the ceiling, not Psi / N"
    return (f"stage {stage} shards " + {0: "nothing", 1: "the optimizer state (K)", 2: "the gradients and the "
            "optimizer state (G and K)", 3: "all three (P, G and K)"}[stage] + " over the N ranks")


def _drawn_memory_cases(count: int = 8) -> list[tuple]:
    """Cases drawn at grading time: any Psi up to 10^12, N up to 4096, every stage, byte counts 0 to 16."""
    return [(draw(1, 10**12), draw(1, 4096), stage, draw(0, 16), draw(0, 16), draw(0, 16))
            for stage in range(4) for _ in range(count // 4)]


@hidden_test("test_zero_memory_values")
def check_zero_memory_values(nb):
    for args in (*MEMORY_CASES, *_drawn_memory_cases()):
        res = fetch(nb.apply(probes.ch11_number, nb.zero_memory(*args)))
        want = _zero_memory(*args)
        value = res["value"]
        if res["type"] not in ("int", "float") or value is None or value != want:
            raise AssertionError(f"zero_memory{args} returned {res['type']} {value!r}, expected {want}: "
                                 + _memory_hint(args, value))


@hidden_test("test_zero_memory_errors")
def check_zero_memory_errors(nb):
    # A bool stage is not asked about: the text refuses a stage outside 0..3, and True == 1 lies inside.
    for args in ((1000, 4, 4, 2, 2, 12), (1000, 4, -1, 2, 2, 12), (0, 4, 1, 2, 2, 12),
                 (1000, 0, 1, 2, 2, 12), (1000.0, 4, 1, 2, 2, 12), (1000, 4, 1, -2, 2, 12), (1000, 4, 1, 2, -1, 12),
                 (1000, 4, 1, 2, 2, -12)):
        if not _raises_value_error(nb, nb.zero_memory, *args):
            raise AssertionError(f"zero_memory{args} should raise ValueError")


def _comm(stage, psi, n) -> Fraction:
    return Fraction(3 if stage == 3 else 2) * (n - 1) * psi / n


@hidden_test("test_comm_volume_values")
def check_comm_volume_values(nb):
    drawn = [(draw(1, 10**12), draw(1, 4096)) for _ in range(2)]  # drawn at grading time
    for stage in range(4):
        for psi, n in ((1000, 4), (7_500_000_000, 64), (37 * 53 + 53, 3), (10, 1), (999, 7), *drawn):
            res = fetch(nb.apply(probes.ch11_number, nb.comm_volume(stage, psi, n)))
            want = _comm(stage, psi, n)
            value = res["value"]
            if res["type"] == "Fraction" and value is not None:
                value = Fraction(value)
            ok = value is not None and abs(float(value) - float(want)) <= 1e-9 * max(1.0, float(want))
            if not ok:
                hint = {0: "an all-reduce sends 2 (N-1)/N Psi per rank", 1: "a reduce-scatter of the gradients and an "
                        "all-gather of the parameters: (N-1)/N Psi each", 2: "the same as stage 1: 2 (N-1)/N Psi",
                        3: "parameters gathered for the forward and again for the backward, plus a reduce-scatter of "
                        "the gradients: 3 (N-1)/N Psi"}[stage]
                raise AssertionError(f"comm_volume({stage}, {psi}, {n}) returned {res['type']} {res['value']!r}, "
                                     f"expected {float(want):.6g}: {hint}")


@hidden_test("test_comm_volume_errors")
def check_comm_volume_errors(nb):
    # As for zero_memory, a bool stage is not asked about.
    for args in ((4, 1000, 4), (-1, 1000, 4), (1, 0, 4), (1, 1000, 0), (1, 1000.0, 4), (1, 1000, 2.0)):
        if not _raises_value_error(nb, nb.comm_volume, *args):
            raise AssertionError(f"comm_volume{args} should raise ValueError")
