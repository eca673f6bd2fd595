"""The hidden tests of chapter 11 accept correct implementations and reject plausible wrong ones.

The correct implementation is the second answer of ``tests/second_submissions_ch11_data_parallel.py``, written from
the released notebook's text alone in a different style from solutions/ch11_data_parallel.py (a sharded Adam that
walks the parameters overlapping each shard instead of flattening them whole, exact fractions for the
communication), so that a bug shared by the solution and its hidden tests cannot hide. The wrong ones below break
one stated property each (the contract table at the end names the cell that grades it); the last tests run the
same checks through the sandbox, as the autograder does, where the memory cell reads the worker from outside.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from grader.api import LocalNamespace, checks_for
from grader.sandbox import judge

from contract_tables import Clause, contract_tests
from sandbox_checks import LIMITS, program, sandbox_tests
from second_submissions_ch11_data_parallel import SECOND
from wrong_submissions_ch11_data_parallel import FLAT_GRAD_WRONG, FULL_STATE_WRONG, WRONG

CHAPTER = "ch11_data_parallel"
CHECKS = checks_for(CHAPTER)
GRADE_IDS = {
    "ddp_step": ["test_ddp_step_values", "test_ddp_step_world", "test_ddp_step_returns"],
    "shard_bounds": ["test_shard_bounds_values", "test_shard_bounds_errors"],
    "ShardedAdam": ["test_sharded_adam_values", "test_sharded_adam_world", "test_sharded_adam_zero2",
                    "test_sharded_adam_memory", "test_sharded_adam_errors"],
    "zero_memory": ["test_zero_memory_values", "test_zero_memory_errors"],
    "comm_volume": ["test_comm_volume_values", "test_comm_volume_errors"],
}


def _defined(source: str, name: str):
    scope: dict = {}
    exec(compile(source, f"<{name}>", "exec"), scope)
    return scope[name]


# --- a second correct implementation of every exercise (the second answers, run in this process) -----------------
CORRECT = {ex: _defined(SECOND[(CHAPTER, ex)], ex) for ex in GRADE_IDS}


def namespace(**overrides) -> LocalNamespace:
    return LocalNamespace({**CORRECT, **overrides})


def test_every_graded_cell_has_a_check():
    assert set(CHECKS) == {cell for cells in GRADE_IDS.values() for cell in cells}


@pytest.mark.parametrize("exercise", sorted(GRADE_IDS))
def test_second_correct_implementation_passes(exercise):
    ns = namespace()
    for cell in GRADE_IDS[exercise]:  # the memory cell too: in-kernel it reads this process's own growth
        CHECKS[cell](ns)


def test_second_implementation_matches_the_notebook_examples():
    bounds, zero, comm = CORRECT["shard_bounds"], CORRECT["zero_memory"], CORRECT["comm_volume"]
    assert bounds(10, 4) == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert zero(7_500_000_000, 64, 3, 2, 2, 12) == 16 * 117_187_500
    assert math.isclose(comm(3, 1000, 4), 2250) and comm(0, 1000, 1) == 0


# --- wrong answers, one property broken at a time --------------------------------------------------------------------
def make_ddp(op="mean", zero=True, through_world=True, returns="floats", validate=True, losses="before",
             unfreeze=False):
    """``through_world=False``: the replicas' gradients averaged among themselves; ``losses="after"``: the losses
    recomputed after the step; ``unfreeze``: every parameter set to require grad first."""
    def ddp_step(replicas, optimizers, batches, loss_fn, world):
        if unfreeze:
            for model in replicas:
                for q in model.parameters():
                    q.requires_grad_(True)
        if validate and not len(replicas) == len(optimizers) == len(batches) == len(world.ranks):
            raise ValueError("one replica, optimizer and batch per rank played")
        values = []
        for model, opt, batch in zip(replicas, optimizers, batches):
            if zero:
                opt.zero_grad()
                model.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            values.append(loss.item() if returns == "floats" else loss.detach())
        for params in zip(*(list(m.parameters()) for m in replicas)):
            if not params[0].requires_grad:
                continue
            grads = [p.grad for p in params]
            if through_world:
                world.all_reduce(grads, op=op)
            else:
                mean = sum(grads) / len(grads)
                for g in grads:
                    g.copy_(mean)
        for opt in optimizers:
            opt.step()
        if losses == "after":
            with torch.no_grad():
                values = [loss_fn(m, b).item() for m, b in zip(replicas, batches)]
        return values
    return ddp_step


def make_bounds(rule="ceil", validate="strict"):
    """``rule``: "floor" or "plus_one" shard lengths, "unpadded" (the last shard stops at numel), "inclusive" stops,
    "numpy" (numpy ints), "tensor" (0-d tensors); ``validate``: "strict", "int" (a bool passes), "none"."""
    def shard_bounds(numel, world_size):
        for v in (numel, world_size):
            if validate == "strict" and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError("positive ints only")
            if validate == "int" and (not isinstance(v, int) or v < 1):
                raise ValueError("positive ints only")
        length = {"floor": numel // world_size, "plus_one": numel // world_size + 1}.get(rule, -(-numel // world_size))
        if rule == "numpy":
            edges = np.arange(world_size + 1) * length
            return list(zip(edges[:-1], edges[1:]))
        if rule == "tensor":
            return [(torch.tensor(r * length), torch.tensor((r + 1) * length)) for r in range(world_size)]
        pairs = [(r * length, (r + 1) * length - (rule == "inclusive")) for r in range(world_size)]
        if rule == "unpadded":
            pairs[-1] = (pairs[-1][0], numel)
        return pairs
    return shard_bounds


def make_sharded(dedupe=True, gather=True, count="step", reduce="world", index="rank", keys="ranks", zero2=True,
                 validate=True, shapes=True, bias=True, dtype=None, keep=None, repoint=False, iterables="once",
                 missing="zeros", zero_grad=True):
    """A ZeRO-1/2 Adam with one property broken: ``dedupe=False`` (a tied weight counted twice), ``gather=False``
    (each rank writes back its own shard only), ``count="rank"`` (one step count for all ranks, incremented per rank),
    ``reduce="local"`` (the played ranks' gradients averaged among themselves), ``index="position"`` (shards indexed
    by the position in the lists, not the rank), ``keys="positions"`` (state keyed likewise), ``zero2=False``
    (shard_grads ignored), ``validate``/``shapes=False`` (no ValueError), ``bias=False`` (no bias correction),
    ``dtype`` (moments in that dtype), ``keep="grads"`` (each rank's full flat gradient kept between steps) or
    ``keep="moments"`` (moments of the whole flat vector on every rank, of which only its shard is used and shown in
    state[r]), ``repoint=True`` (parameters pointed at pieces of the gathered vector instead of updated in place)."""
    class ShardedAdam:
        def __init__(self, params, world, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, shard_grads=False):
            if validate and (lr < 0 or eps < 0 or not all(0 <= b < 1 for b in betas)):
                raise ValueError("lr, eps >= 0 and betas in [0, 1)")
            self.source = params  # iterables="again": the caller's iterables read again at every step
            self.params = []
            for ps in params:
                ps = list(ps)
                self.params.append([p for i, p in enumerate(ps) if all(p is not q for q in ps[:i])] if dedupe else ps)
            if validate and len(self.params) != len(world.ranks):
                raise ValueError("one parameter list per rank played")
            if shapes and len({tuple(tuple(p.shape) for p in ps) for ps in self.params}) != 1:
                raise ValueError("the ranks' shapes differ")
            self.world, self.lr, self.betas, self.eps, self.shard_grads = world, lr, betas, eps, shard_grads
            self.numel = sum(p.numel() for p in self.params[0])
            self.length = -(-self.numel // world.size)
            self.who = list(world.ranks) if index == "rank" else list(range(len(world.ranks)))
            names = list(world.ranks) if keys == "ranks" else list(range(len(world.ranks)))
            kind = dtype or self.params[0][0].dtype
            size = self.length * (world.size if keep == "moments" else 1)
            self.state = {}
            for name, who in zip(names, self.who):
                m, v = torch.zeros(size, dtype=kind), torch.zeros(size, dtype=kind)
                a = who * self.length if keep == "moments" else 0
                self.state[name] = {"step": 0, "exp_avg": m[a:a + self.length], "exp_avg_sq": v[a:a + self.length]}
            self.kept, self.t = None, 0

        def _flat(self, tensors):
            flat = torch.zeros(self.length * self.world.size, dtype=self.params[0][0].dtype)
            flat[:self.numel] = torch.cat([t.reshape(-1) for t in tensors])
            return flat

        @torch.no_grad()
        def step(self):
            if iterables == "again":
                self.params = [list(ps) for ps in self.source]
            if missing == "crash":  # torch.cat refuses the None of a parameter without .grad
                flats = [self._flat([torch.cat([p.grad.reshape(-1) if p.grad is not None else None for p in ps])])
                         for ps in self.params]
            else:
                flats = [self._flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in ps])
                         for ps in self.params]
            if self.shard_grads and zero2:
                for ps in self.params:
                    for p in ps:
                        p.grad = None
            if keep == "grads":
                self.kept = flats
            if reduce == "local":
                mean = sum(flats) / len(flats)
                grads = [mean[w * self.length:(w + 1) * self.length] for w in self.who]
            else:
                grads = self.world.reduce_scatter(flats, op="mean")
            b1, b2 = self.betas
            updated = []
            for i, (who, ps, g) in enumerate(zip(self.who, self.params, grads)):
                state = list(self.state.values())[i]
                self.t += 1
                state["step"] = self.t if count == "rank" else state["step"] + 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                flat = self._flat(list(ps))[who * self.length:(who + 1) * self.length]
                m.mul_(b1).add_(g.to(m.dtype), alpha=1 - b1)
                v.mul_(b2).addcmul_(g.to(v.dtype), g.to(v.dtype), value=1 - b2)
                c1, c2 = (1 - b1 ** t, 1 - b2 ** t) if bias else (1.0, 1.0)
                flat -= (self.lr * (m / c1) / ((v / c2).sqrt() + self.eps)).to(flat.dtype)
                updated.append(flat)
            if gather:
                full = self.world.all_gather(updated)
            else:
                full = []
                for ps, who, shard in zip(self.params, self.who, updated):
                    own = self._flat(list(ps))
                    own[who * self.length:(who + 1) * self.length] = shard
                    full.append(own)
            for ps, flat in zip(self.params, full):
                for p, piece in zip(ps, flat[:self.numel].split([p.numel() for p in ps])):
                    if repoint:  # the parameter pointed at a piece of the gathered vector, not updated in place
                        p.data = piece.view_as(p)
                    else:
                        p.copy_(piece.view_as(p))

        def zero_grad(self):
            for ps in self.params if zero_grad else ():
                for p in ps:
                    p.grad = None
    return ShardedAdam


def _table(psi, n, stage, p, g, k, sharded):
    shard = -(-psi // n)
    return sum(b * (shard if i in sharded[stage] else psi) for i, b in enumerate((p, g, k)))


STAGES = {0: (), 1: (2,), 2: (1, 2), 3: (0, 1, 2)}


def _bad_stage(stage, bools: bool) -> bool:
    """Whether a stage is refused: anything but 0 to 3, and a bool too where ``bools``."""
    return (bools and isinstance(stage, bool)) or stage not in (0, 1, 2, 3)


def make_zero_memory(sharded=None, ceil=True, validate=True, bytes_checked=True, bools=True):
    """``sharded``: which of (P, G, K) each stage shards; ``ceil=False``: shards of Psi / N exactly; ``bools=False``:
    a bool stage accepted as the 0 or 1 it equals."""
    table = {**STAGES, **(sharded or {})}

    def zero_memory(num_params, world_size, stage, bytes_param, bytes_grad, bytes_optim):
        if validate:
            if _bad_stage(stage, bools):
                raise ValueError("stage 0 to 3")
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in (num_params, world_size)):
                raise ValueError("positive ints")
            if bytes_checked and min(bytes_param, bytes_grad, bytes_optim) < 0:
                raise ValueError("negative bytes")
        if not ceil:
            costs = (bytes_param, bytes_grad, bytes_optim)
            return round(sum(b * (num_params / world_size if i in table[stage] else num_params)
                             for i, b in enumerate(costs)))
        return _table(num_params, world_size, stage, bytes_param, bytes_grad, bytes_optim, table)
    return zero_memory


def make_comm(passes=(2, 2, 2, 3), fraction=True, validate=True, bools=True):
    """``passes[stage]`` times (N-1)/N Psi; ``fraction=False``: the large-N limit, ``passes`` Psi; ``bools=False``: a
    bool stage accepted."""
    def comm_volume(stage, num_params, world_size):
        if validate and (_bad_stage(stage, bools) or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in (num_params, world_size))):
            raise ValueError("stage 0 to 3, positive ints")
        return passes[stage] * ((world_size - 1) / world_size if fraction else 1) * num_params
    return comm_volume


def test_the_configurable_answers_are_right_when_nothing_is_broken():
    ns = namespace(ddp_step=make_ddp(), shard_bounds=make_bounds(), ShardedAdam=make_sharded(),
                   zero_memory=make_zero_memory(), comm_volume=make_comm())
    for ex, cells in GRADE_IDS.items():
        for cell in cells:
            if cell != "test_sharded_adam_memory":
                CHECKS[cell](ns)


def test_a_stage_is_refused_as_the_text_says_only():
    """The text refuses a stage outside 0..3 (no word on bools, unlike shard_bounds' sizes): a check written as
    ``stage not in (0, 1, 2, 3)``, which lets True through as 1, keeps the errors cells' points."""
    ns = namespace(zero_memory=make_zero_memory(bools=False), comm_volume=make_comm(bools=False))
    for cell in ("test_zero_memory_errors", "test_comm_volume_errors"):
        CHECKS[cell](ns)


# --- the contract, clause by clause (tests/contract_tables.py) -------------------------------------------
def _breaking(exercise: str, factory):
    """A clause's wrong answer: ``{exercise: factory(**flags)}``, one property broken by the flags."""
    return lambda **flags: {exercise: factory(**flags)}


_ddp, _bounds, _adam, _zero, _comm = (_breaking(ex, f) for ex, f in (
    ("ddp_step", make_ddp), ("shard_bounds", make_bounds), ("ShardedAdam", make_sharded),
    ("zero_memory", make_zero_memory), ("comm_volume", make_comm)))


CONTRACT = [
    Clause("ddp_step", 'average every parameter\'s gradient over all ranks of the world with world.all_reduce(..., '
           'op="mean")', ("test_ddp_step_values",), _ddp(op="sum"), "do not sum them"),
    Clause("ddp_step", "Parameters with ``requires_grad=False`` are left alone", ("test_ddp_step_values",),
           _ddp(unfreeze=True), "leave frozen parameters alone", label="frozen-left-alone"),
    Clause("ddp_step", "clear the replica's gradients (those of an earlier call must not add in)",
           ("test_ddp_step_values",), _ddp(zero=False), "those of an earlier call must not add in"),
    Clause("ddp_step", "and step every optimizer", ("test_ddp_step_values",),
           {"ddp_step": lambda reps, opts, *rest: make_ddp()(reps, [opts[0]] + [torch.optim.SGD(
               [torch.zeros(1, requires_grad=True)], lr=0.0) for _ in opts[1:]], *rest)},
           "then step every optimizer", label="step-every-optimizer"),
    Clause("ddp_step", "never average the replicas' gradients yourself", ("test_ddp_step_world",),
           _ddp(through_world=False), "averaged among themselves"),
    Clause("ddp_step", "as Python floats", ("test_ddp_step_returns",), _ddp(returns="tensors"),
           "expected Python floats"),
    Clause("ddp_step", "(before the step)", ("test_ddp_step_returns",), _ddp(losses="after"), "before the step"),
    Clause("ddp_step", "Lists whose lengths differ from len(world.ranks) raise ValueError", ("test_ddp_step_returns",),
           _ddp(validate=False), "should raise ValueError"),
    Clause("shard_bounds", "L = ceil(numel / world_size)", ("test_shard_bounds_values",), _bounds(rule="floor"),
           "use the ceiling"),
    Clause("shard_bounds", "L = ceil(numel / world_size)", ("test_shard_bounds_values",), _bounds(rule="plus_one"),
           r"\[r \* L, \(r \+ 1\) \* L\)", label="ceil-not-floor-plus-one"),
    Clause("shard_bounds", "so every shard has the same length L", ("test_shard_bounds_values",),
           _bounds(rule="unpadded"), "pad it"),
    Clause("shard_bounds", "rank r's shard is flat positions [r * L, (r + 1) * L)", ("test_shard_bounds_values",),
           _bounds(rule="inclusive"), r"\[r \* L, \(r \+ 1\) \* L\)"),
    Clause("shard_bounds", "(start, stop) as Python ints", ("test_shard_bounds_values",), _bounds(rule="numpy"),
           "returned the right bounds as int64"),
    Clause("shard_bounds", "(start, stop) as Python ints", ("test_shard_bounds_values",), _bounds(rule="tensor"),
           "returned pairs of Tensor", label="python-ints-not-tensors"),
    Clause("shard_bounds", "(a bool is refused)", ("test_shard_bounds_errors",), _bounds(validate="int"),
           r"shard_bounds\(True, 2\) should raise ValueError"),
    Clause("shard_bounds", "numel or world_size not a positive int", ("test_shard_bounds_errors",),
           _bounds(validate="none"), "should raise ValueError"),
    Clause("ShardedAdam", "A tensor listed twice (tied weights) is one parameter: it is sharded and updated once.",
           ("test_sharded_adam_values",), _adam(dedupe=False), "flatten every distinct tensor once"),
    Clause("ShardedAdam", "all_gather the updated shards: every rank gets the whole updated vector",
           ("test_sharded_adam_values",), _adam(gather=False), "updated its own shard only"),
    Clause("ShardedAdam", "The step count is one per optimizer step, not one per rank.",
           ("test_sharded_adam_values",), _adam(count="rank"), r"step counts are \[.*\]: the step count t is one"),
    Clause("ShardedAdam", "Adam (as torch.optim.Adam, no weight decay): with step count $t$",
           ("test_sharded_adam_values",), _adam(bias=False), "bias corrections"),
    Clause("ShardedAdam", "(flat tensors of length L, the parameters' dtype: rank r's moments)",
           ("test_sharded_adam_values",), _adam(dtype=torch.float32), "the moments are torch.float32"),
    Clause("ShardedAdam", 'world.reduce_scatter(flats, op="mean")', ("test_sharded_adam_world",),
           _adam(reduce="local"), "only through world.reduce_scatter"),
    Clause("ShardedAdam", "params[i] are the parameters of rank world.ranks[i]'s replica",
           ("test_sharded_adam_world",), _adam(index="position"), r"index your shards by world.ranks"),
    Clause("ShardedAdam", "state[r] for each rank r this process plays", ("test_sharded_adam_world",),
           _adam(keys="positions"), r"state holds the keys 0, 1, expected the ranks this process plays"),
    Clause("ShardedAdam", "set its parameters' .grad to None", ("test_sharded_adam_zero2",), _adam(zero2=False),
           "still have full gradients"),
    Clause("ShardedAdam", "full moments per rank need N times the moments",
           ("test_sharded_adam_memory",), _adam(keep="moments"), "read from outside your process"),
    Clause("ShardedAdam", "nothing of the size of the whole model per rank", ("test_sharded_adam_memory",),
           _adam(keep="grads"), "read from outside your process"),
    Clause("ShardedAdam", "one iterable of parameters per rank this process plays", ("test_sharded_adam_values",),
           _adam(iterables="again"), None, label="iterables-read-once", raises="RuntimeError"),
    Clause("ShardedAdam", "a parameter without ``.grad`` counts as zeros", ("test_sharded_adam_values",),
           _adam(missing="crash"), None, label="missing-grad-as-zeros", raises="TypeError"),
    Clause("ShardedAdam", "``zero_grad()``: every parameter's ``.grad`` set to None", ("test_sharded_adam_zero2",),
           _adam(zero_grad=False), "zero_grad\\(\\) sets every parameter's .grad to None"),
    Clause("ShardedAdam", "The parameters are updated in place (copy_)", ("test_sharded_adam_memory",),
           _adam(repoint=True), r"re-pointed parameters at other tensors"),
    Clause("ShardedAdam", "lr < 0, eps < 0 or a beta outside [0, 1) raise ValueError", ("test_sharded_adam_errors",),
           _adam(validate=False), "should raise ValueError"),
    Clause("ShardedAdam", "or whose shapes differ between ranks", ("test_sharded_adam_errors",), _adam(shapes=False),
           "different shapes should raise ValueError"),
    Clause("zero_memory", "with shards of ceil(Psi / N) elements", ("test_zero_memory_values",), _zero(ceil=False),
           "use the ceiling"),
    Clause("zero_memory", "1 (optimizer state)", ("test_zero_memory_values",), _zero(sharded={1: (1,)}),
           r"stage 1 shards the optimizer state"),
    Clause("zero_memory", "2 (+ gradients)", ("test_zero_memory_values",), _zero(sharded={2: (2,)}),
           r"stage 2 shards the gradients and the optimizer state"),
    Clause("zero_memory", "3 (+ parameters)", ("test_zero_memory_values",), _zero(sharded={3: (1, 2)}),
           r"stage 3 shards all three"),
    Clause("zero_memory", "a stage outside 0..3, num_params or world_size not a positive int",
           ("test_zero_memory_errors",), _zero(validate=False), "should raise ValueError"),
    Clause("zero_memory", "a negative byte count", ("test_zero_memory_errors",), _zero(bytes_checked=False),
           r"zero_memory\(1000, 4, 1, -2, 2, 12\) should raise ValueError"),
    Clause("comm_volume", "stage 0 all-reduces the gradients, 2 (N-1)/N Psi", ("test_comm_volume_values",),
           _comm(passes=(1, 2, 2, 3)), "an all-reduce sends 2 \\(N-1\\)/N Psi"),
    Clause("comm_volume", "stages 1 and 2 reduce-scatter the gradients and all-gather the parameters, (N-1)/N Psi "
           "each", ("test_comm_volume_values",), _comm(passes=(2, 1, 1, 3)), "\\(N-1\\)/N Psi each"),
    Clause("comm_volume", "3 (N-1)/N Psi", ("test_comm_volume_values",), _comm(passes=(2, 2, 2, 2)),
           "3 \\(N-1\\)/N Psi"),
    Clause("comm_volume", "stage 0 all-reduces the gradients, 2 (N-1)/N Psi", ("test_comm_volume_values",),
           _comm(fraction=False), "returned int 2000, expected 1500", label="not-the-large-n-limit"),
    Clause("comm_volume", "a stage outside 0..3, num_params or world_size not a positive int",
           ("test_comm_volume_errors",), _comm(validate=False), "should raise ValueError"),
]

test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
    test_contract_covers_every_graded_cell = contract_tests(CHAPTER, CONTRACT, namespace, CHECKS, globals())


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(
    CHAPTER, WRONG, grade_ids={"ddp_step": "test_ddp_step_values", "shard_bounds": "test_shard_bounds_values",
                               "ShardedAdam": "test_sharded_adam_values", "zero_memory": "test_zero_memory_values",
                               "comm_volume": "test_comm_volume_values"})


@pytest.mark.parametrize("wrong", [FULL_STATE_WRONG, FLAT_GRAD_WRONG], ids=["full_state", "flat_grads"])
def test_sandbox_memory_wrong_loses_only_its_memory_cell(wrong):
    """Full-size moments on every rank, or a whole flat gradient kept per rank between steps: every value and the
    reported state right, more than the shards' moments kept. The worker's cgroup shows it, so the memory cell fails
    and the exercise's other cells pass."""
    program_ = program(CHAPTER, {"ShardedAdam": wrong[(CHAPTER, "ShardedAdam")]})
    outcomes = judge.run_checks(CHAPTER, program_, GRADE_IDS["ShardedAdam"], LIMITS, checks=CHECKS)
    lost = {gid: o.reason for gid, o in outcomes.items() if not o.passed}
    assert list(lost) == ["test_sharded_adam_memory"], lost
    assert "read from outside your process" in lost["test_sharded_adam_memory"]
