"""Hidden tests of chapter 14 (DropBP), one graded cell per property.

DropBP (``test_DropBP``): the judge builds sublayers of torch modules (LayerNorm, Linear, GELU; the notebook's own
TinyGPT attention and MLP behind their LayerNorms), sends them into the worker, wraps them with the student's
``DropBP(sublayer, p, generator)`` and runs sequences of forwards and backwards (``probes.ch14_run``) in training
and eval mode, with ``force`` None, True and False in both modes, ``p`` changed between two forwards, shapes and
widths drawn at grading time (one input of 2^20 to 2^21 elements kept, then dropped) and calls with generator None
right after ``torch.manual_seed``. The judge replays every decision from the generator's seed (one ``torch.rand(())``
per training forward with force None, at every p, none otherwise), compares the generator's state after every call
with the replay's, and compares, in float64: the ``dropped`` attribute, the output
(x + sublayer(x) always), the input gradient (g when dropped, full backprop when kept) and the sublayer's
parameter gradients (None when dropped, backprop's when kept). Dropping the residual, rescaling by 1/(1-p), the
skip under no_grad, zeroed gradients, drops in eval mode and an extra or a missing draw each fail here, each with
its own hint.

``test_DropBP_memory`` reads the worker from outside (``grader.resources.Meter``, one per measured call): a dropped
training-mode forward (a drawn p whose draw drops; a drawn p with force True) of a chain of Linear(d, d) + GELU pairs (3 or 4, d 128 to
256) on x of 4 × 2^20 to 6 × 2^20 elements made for the call: the peak may exceed what the process held before by
at most 3 x + 3 MiB (a graph built and freed afterwards holds 2 × depth copies of x at the peak: decided after the
forward, the authors' detach form), and what stays once the call returned at most the output + 3 MiB (a graph kept
with zeroed gradients). The output's rows at drawn indices, the sum of x's gradient and the chain's gradients
(None) of that very call are checked, with ``dropped`` and the generator's state (one draw, or none when forced).
A last, restrict-only part runs a dropped forward (random, then forced) on a small input under a saved-tensors hook
in the worker: any tensor packed for backward takes the point away (a graph built and detached in row chunks keeps
the peak low but saves tensors).

choose_dropped, sensitivity and allocate_drop_rates are pure: replayed by the judge (the same seeds, two calls in a
row on one generator), recomputed in float64 on the same weights and batch (S_i, relative tolerance 2e-3), and
compared exactly (rates to 1e-6) on tables drawn at grading time and on special cases. choose_dropped with generator
None is replayed from the global seed; sensitivity meets DropBP modules nested in blocks and an MSE loss; the
allocation's penalty S_i (1 + k_i) is compared exactly, and an answer that breaks exact ties by floating point
(S_i * (0.1 + p_i) or S_i * (1 + k_i) in floats) is accepted as well.
"""
from __future__ import annotations

import copy
import math
from fractions import Fraction

import torch
import torch.nn.functional as F
from torch import nn

from coursekit.checks import check_close, same_close, same_values
from coursekit.transformer import MLP, CausalSelfAttention, GPTConfig
from grader import probes
from grader.api import fetch, hidden_test
from grader.resources import Meter, MiB, draw, mib, new_seed, seeded
from grader.source_policy import Shortcut, SourcePolicy

SOURCE_POLICY = SourcePolicy(shortcuts=(
    Shortcut(paths=("coursekit.capstone",),
             instead="write it yourself; coursekit.capstone (chapter 16's reference fine-tune) holds "
                     "the course's own dropped sublayers"),
))

TOL = dict(atol=1e-4, rtol=1e-4)

FORWARD_HINT = ("the forward value is x + sublayer(x) whether the sublayer is dropped or not: keep the residual "
                "path and add the sublayer's output as it is (no 1/(1-p) rescaling)")
DECISION_HINT = ("in training mode decide once per forward, before the sublayer runs: with force None exactly one "
                 "draw torch.rand((), generator=self.generator) < self.p; with force True or False no draw; in eval "
                 "mode no draw and no drop; record the decision in self.dropped")
EVAL_HINT = "in eval mode DropBP never drops and never draws: x + sublayer(x) with ordinary autograd"
DX_DROPPED_HINT = ("a dropped sublayer passes the gradient to x through the residual path only (dL/dx = dL/dy): run "
                   "the sublayer under torch.no_grad(), not the skip connection (zeroing the sublayer's gradients "
                   "afterwards still sends g through it)")
DX_KEPT_HINT = "a kept sublayer is ordinary backprop: dL/dx = g + J_f(x)ᵀ g"
NONE_HINT = ("a dropped sublayer's parameters get no gradient this step: .grad stays None (run the sublayer under "
             "torch.no_grad(); zeroing gradients after a backward still builds and runs the graph)")
KEPT_GRAD_HINT = "a kept sublayer's parameters get backprop's gradients"
PEAK_HINT = ("decide before the sublayer runs and run a dropped sublayer under torch.no_grad(): running it with "
             "autograd (and detaching or discarding its graph afterwards) holds every tensor it saves at the peak")
KEEP_HINT = "a dropped sublayer keeps nothing for backward: no graph, no hook keeping its saved tensors"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def _mlp_sub(d: int, h: int, seed: int) -> nn.Module:
    """LayerNorm, Linear, GELU, Linear with weights large enough that the branch matters."""
    torch.manual_seed(seed)
    sub = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, h), nn.GELU(), nn.Linear(h, d))
    with torch.no_grad():
        g = _gen(seed)
        for p in sub.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() == 1 else 1 / p.shape[-1] ** 0.5))
    return sub


def _gpt_sub(kind: str, seed: int, d: int = 32, context: int = 16) -> nn.Module:
    """The notebook's TinyGPT sublayers behind their LayerNorm: Sequential(ln, attn) or Sequential(ln, mlp)."""
    torch.manual_seed(seed)
    cfg = GPTConfig(d_model=d, n_heads=4, context=context)
    body = CausalSelfAttention(cfg) if kind == "attn" else MLP(cfg)
    sub = nn.Sequential(nn.LayerNorm(d), body)
    with torch.no_grad():
        g = _gen(seed)
        for p in sub.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() == 1 else 1 / p.shape[-1] ** 0.5))
    return sub


def _reference(sub: nn.Module, x: torch.Tensor, g: torch.Tensor, dropped: bool) -> dict:
    """float64 y, dx and parameter gradients of x + sub(x) (dropped: no backward through sub)."""
    ref = copy.deepcopy(sub).double()
    ref.zero_grad(set_to_none=True)
    x64 = x.double().requires_grad_(True)
    out = ref(x64)
    y = x64 + (out.detach() if dropped else out)
    y.backward(g.double())
    return {"y": y.detach(), "dx": x64.grad, "grads": {n: p.grad for n, p in ref.named_parameters()}}


def _where(kind: str, shape, p, training: bool, force, call: int) -> str:
    mode = "training" if training else "eval"
    forced = "" if force is None else f", force={force}"
    return f"DropBP({kind} sublayer, p={p}) forward #{call} in {mode} mode{forced}, x {tuple(shape)}"


def _run_sequence(nb, sub: nn.Module, kind: str, p: float, shape, plan, seed: int, tol=TOL) -> None:
    """Run ``plan`` (a list of (training, force), or ("p", value): the module's p changed between forwards) on one
    DropBP module with a generator seeded ``seed``; replay, and compare the generator's state after every call."""
    gen = nb.put(torch.Generator)()
    gen.manual_seed(seed)
    sub_h = nb.put(copy.deepcopy(sub))
    module = nb.DropBP(sub_h, p, gen)
    replay = _gen(seed)
    data = _gen(seed + 7)
    call = 0
    for training, force in plan:
        if training == "p":
            p = force
            nb.apply(probes.ch14_set, module, "p", p)
            continue
        call += 1
        if training and force is None:
            expect = bool(torch.rand((), generator=replay) < p)
        else:
            expect = bool(force) if training else False
        nb.apply(probes.ch14_set, module, "force", force)
        x, g = torch.randn(shape, generator=data), torch.randn(shape, generator=data)
        got = fetch(nb.apply(probes.ch14_run, module, sub_h, x, g, training, gen=gen))
        where = _where(kind, shape, p, training, force, call)
        _check_call(got, sub, x, g, expect, where, training, tol)
        _check_state(got["state"], replay, where)
    nb.apply(probes.ch14_set, module, "force", None)


def _check_state(state, replay, where: str) -> None:
    if not same_values(state, replay.get_state()):
        raise AssertionError(f"{where}: the generator's state afterwards is not the one the replay reaches (one "
                             f"draw per training-mode forward with force None, at every p, 0 and 1 included; no "
                             f"draw otherwise). {DECISION_HINT}")


def _check_call(got: dict, sub, x, g, expect: bool, where: str, training: bool, tol) -> None:
    if got.get("type") != "Tensor":
        raise AssertionError(f"{where} returned {got.get('type')}: it returns x + sublayer(x), a tensor")
    ref = _reference(sub, x, g, expect)
    check_close(got["y"], ref["y"].float(), f"the output of {where}", FORWARD_HINT, **tol)
    if got["dropped"] != expect:
        hint = EVAL_HINT if not training else DECISION_HINT
        raise AssertionError(f"{where}: dropped is {got['dropped']!r}, the decision replayed from the generator's "
                             f"seed is {expect}. {hint}")
    if not got.get("attached"):
        raise AssertionError(f"{where}: the output is not attached to the autograd graph, so no gradient reaches x. "
                             f"{DX_DROPPED_HINT}")
    if got.get("error"):
        raise AssertionError(f"{where}: backward raised {got['error']['types'][0]}: {got['error']['message']}")
    check_close(got["dx"], ref["dx"].float(), f"the gradient with respect to x for {where}",
                DX_DROPPED_HINT if expect else DX_KEPT_HINT, **tol)
    for name, want in ref["grads"].items():
        have = got["grads"].get(name)
        if expect:
            if have is not None:
                raise AssertionError(f"{where}: the dropped sublayer's parameter {name} has a gradient "
                                     f"(max |grad| {have.abs().max().item():.3g}). {NONE_HINT}")
        else:
            if have is None:
                hint = EVAL_HINT if not training else KEPT_GRAD_HINT
                raise AssertionError(f"{where}: the kept sublayer's parameter {name} got no gradient. {hint}")
            check_close(have, want.float(), f"the gradient of {name} for {where}", KEPT_GRAD_HINT, **tol)


def _plan(n_train: int, new_p: float | None = None):
    """Training forwards with force None, eval forwards (force None, True and False), force True and False in
    training mode among them, and (with ``new_p``) p changed between two forwards."""
    plan = [(True, None)] * 3 + [(False, None), (False, True)] + [(True, None)] * 2 + [(True, True), (True, False)] + \
        [(False, False)] + [(True, None)] * max(3, n_train - 5)
    if new_p is not None:
        plan += [("p", new_p)] + [(True, None)] * 3
    return plan


LARGE_NUMEL = (2**20, 2**20 + 2**18)


@hidden_test("test_DropBP")
def check_DropBP(nb):
    # In-kernel (the solution notebook's own run), the first memory reading pins glibc's mmap threshold: taken
    # before this cell's large input comes and goes, it keeps glibc from raising that threshold, so that the
    # memory cell's later readings in the same process stay exact (as chapter 4 does). In the judge, one
    # reading from outside, unused.
    nb.memory()
    mlp = "LayerNorm-Linear-GELU-Linear"
    d, h = draw(3, 20), draw(3, 40)
    _run_sequence(nb, _mlp_sub(d, h, 1), mlp, draw(2, 8) / 10, (draw(2, 48), d), _plan(6, draw(0, 10) / 10),
                  new_seed())
    d = draw(3, 12)
    _run_sequence(nb, _mlp_sub(d, draw(3, 24), 2), mlp, 0.5, (draw(1, 3), draw(1, 8), d), _plan(5), new_seed())
    d = 4 * draw(2, 10)
    _run_sequence(nb, _gpt_sub("attn", 3, d=d), "the notebook's LayerNorm + attention", 0.5,
                  (draw(1, 3), draw(1, 16), d), _plan(5, draw(0, 1) * 1.0), new_seed())
    d = 4 * draw(2, 10)
    _run_sequence(nb, _gpt_sub("mlp", 4, d=d), "the notebook's LayerNorm + MLP", draw(1, 9) / 10,
                  (draw(1, 4), draw(1, 16), d), _plan(5), new_seed())
    d = draw(3, 9)
    _run_sequence(nb, _mlp_sub(d, draw(3, 9), 5), mlp, 0.0, (draw(1, 6), d), [(True, None)] * 3, new_seed())
    d = draw(3, 9)
    _run_sequence(nb, _mlp_sub(d, draw(3, 9), 6), mlp, 1.0, (draw(1, 6), d),
                  [(True, None), (False, None), (True, None), (True, False), ("p", 0.0), (True, None)], new_seed())
    # a large input kept (p = 0, force None: one draw), then dropped (force True)
    d = draw(4, 16)
    rows = draw(-(-LARGE_NUMEL[0] // d), LARGE_NUMEL[1] // d)
    _run_sequence(nb, _mlp_sub(d, draw(3, 4), 8), mlp, 0.0, (rows, d), [(True, None), (True, True)], new_seed(),
                  tol=dict(atol=5e-2, rtol=1e-2))
    # generator None: torch's global generator, seeded right before the call inside the probe.
    sub = _mlp_sub(9, 7, 7)
    sub_h = nb.put(copy.deepcopy(sub))
    module = nb.DropBP(sub_h, 0.5)
    for _ in range(3):
        seed = new_seed()
        expect = bool(torch.rand((), generator=_gen(seed)) < 0.5)
        x, g = torch.randn(5, 9, generator=_gen(seed + 1)), torch.randn(5, 9, generator=_gen(seed + 2))
        got = fetch(nb.apply(probes.ch14_run, module, sub_h, x, g, True, global_seed=seed))
        where = "DropBP(sublayer, p=0.5) with generator None, after torch.manual_seed"
        _check_call(got, sub, x, g, expect, where, True, TOL)
        replay = _gen(seed)
        torch.rand((), generator=replay)
        _check_state(got["state"], replay, where + " (torch's global generator)")


MEM_NUMEL = (4 * 2**20, 6 * 2**20)
MEM_D = (128, 256, 32)
MEM_SLACK = 3 * MiB
MEM_ROWS = 16


def _chain(d: int, depth: int, seed: int) -> nn.Sequential:
    g = _gen(seed)
    layers = []
    for _ in range(depth):
        lin = nn.Linear(d, d)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(d, d, generator=g) / d ** 0.5)
            lin.bias.copy_(torch.randn(d, generator=g) * 0.1)
        layers += [lin, nn.GELU()]
    return nn.Sequential(*layers)


def _memory_case(nb, forced: bool) -> None:
    meter = Meter(nb)  # first: everything the student's code holds is read from outside
    d = draw(*MEM_D)
    rows = draw(-(-MEM_NUMEL[0] // d), MEM_NUMEL[1] // d)
    depth = draw(3, 4)
    p = draw(2, 8) / 10
    x_seed, chain_seed, gen_seed = new_seed(), new_seed(), new_seed()
    while not forced and not bool(torch.rand((), generator=_gen(gen_seed)) < p):
        gen_seed = new_seed()  # a generator whose first draw drops: the decision is a random one
    chain = _chain(d, depth, chain_seed)
    chain_h = meter.put(copy.deepcopy(chain))
    gen = nb.put(torch.Generator)()
    gen.manual_seed(gen_seed)
    module = nb.DropBP(chain_h, p, gen)
    if forced:
        nb.apply(probes.ch14_set, module, "force", True)
    # A first call on a small input of the same kind: lazily loaded code, on the measured path.
    small = nb.DropBP(nb.put(_chain(8, 2, 1)), 1.0)(nb.put(torch.randn(4, 8, requires_grad=True)))
    small.sum().backward()
    del small

    held, out = meter.held_by(lambda x: module(x), inputs=lambda: [meter.tensor((rows, d), seed=x_seed)])
    x_bytes = 4 * rows * d
    where = (f"DropBP(chain of {depth} Linear({d}, {d}) + GELU, p={p}{', force=True' if forced else ''}) in training "
             f"mode on x ({rows}, {d}) made for the call, sizes drawn at grading time")
    after = fetch(nb.apply(probes.ch14_after, module, gen))
    replay = _gen(gen_seed)
    if not forced:
        torch.rand((), generator=replay)
    if after["dropped"] is not True:
        del out
        raise AssertionError(f"{where}: dropped is {after['dropped']!r}, the decision replayed from the generator's "
                             f"seed is True. {DECISION_HINT}")
    _check_state(after["state"], replay, where)
    peak_bound = 3 * x_bytes + MEM_SLACK
    if held.peak > peak_bound:
        del out
        raise AssertionError(
            f"{where}: during the forward your process held {mib(held.peak)} more than before it (read from outside "
            f"your process); x is {mib(x_bytes)}: at most three times x plus 3 MiB, {mib(peak_bound)}, may be "
            f"reached. {PEAK_HINT}")
    kept_bound = x_bytes + MEM_SLACK
    if held.kept > kept_bound:
        del out
        raise AssertionError(
            f"{where}: once the forward returned, with x released, your process kept {mib(held.kept)} (read from "
            f"outside your process); the output is {mib(x_bytes)}: at most {mib(kept_bound)} may stay. {KEEP_HINT}")
    picked = torch.randperm(rows)[:MEM_ROWS].sort().values
    got = fetch(nb.apply(probes.ch14_rows, out, picked))
    if got.get("type") != "Tensor":
        raise AssertionError(f"{where} returned {got.get('type')}: it returns x + sublayer(x)")
    x_rows = seeded((rows, d), seed=x_seed)[picked].double()
    with torch.no_grad():
        want = x_rows + copy.deepcopy(chain).double()(x_rows)
    check_close(got["rows"], want.float(), f"rows {picked.tolist()[:5]}... of the output of {where}", FORWARD_HINT,
                atol=1e-3, rtol=1e-4)
    if not got["attached"]:
        raise AssertionError(f"{where}: the output is not attached to the autograd graph. {DX_DROPPED_HINT}")
    out.sum().backward()
    check_close(fetch(held.leaves[0].grad), torch.tensor(float(rows * d)),
                f"the sum of x's gradient for {where}, the loss being the output's sum", DX_DROPPED_HINT,
                atol=1.0, rtol=1e-5)
    grads = fetch(nb.apply(probes.ch14_grads, chain_h))
    having = [n for n, v in grads.items() if v is not None]
    if having:
        raise AssertionError(f"{where}: the dropped chain's parameters {having[:3]} have gradients. {NONE_HINT}")
    del out


PACK_HINT = ("a dropped sublayer runs under torch.no_grad(): no tensor is saved for backward during its forward "
             "(building a graph and detaching it, whole or in pieces, saves them)")


def _pack_case(nb) -> None:
    """Restrict-only: a saved-tensors hook in your process counts what a dropped forward packs (none may be)."""
    d, rows, p = draw(8, 32), draw(64, 2048), draw(2, 8) / 10
    sub = _chain(d, 2, new_seed())
    seed = new_seed()
    while not bool(torch.rand((), generator=_gen(seed)) < p):
        seed = new_seed()
    gen = nb.put(torch.Generator)()
    gen.manual_seed(seed)
    sub_h = nb.put(copy.deepcopy(sub))
    module = nb.DropBP(sub_h, p, gen)
    data = _gen(seed + 3)
    for force in (None, True):
        nb.apply(probes.ch14_set, module, "force", force)
        x, g = torch.randn(rows, d, generator=data), torch.randn(rows, d, generator=data)
        got = fetch(nb.apply(probes.ch14_run, module, sub_h, x, g, True))
        where = (f"DropBP(chain of 2 Linear({d}, {d}) + GELU, p={p}{', force=True' if force else ''}) in training "
                 f"mode on x ({rows}, {d}), a dropped forward")
        _check_call(got, sub, x, g, True, where, True, TOL)
        if got.get("packed"):
            raise AssertionError(f"{where}: {got['packed']} tensors were saved for backward during the forward "
                                 f"(counted by a saved-tensors hook in your process). {PACK_HINT}")


@hidden_test("test_DropBP_memory")
def check_DropBP_memory(nb):
    _memory_case(nb, forced=False)
    _memory_case(nb, forced=True)
    _pack_case(nb)


@hidden_test("test_DropBP_errors")
def check_DropBP_errors(nb):
    for p in (-0.1, 1.5, -1.0, 2.0, float("nan"), None):
        names = fetch(nb.apply(probes.raised, nb.DropBP, nb.put(nn.Identity()), p))
        if names is None or "ValueError" not in names:
            got = "returned" if names is None else f"raised {names[0]}"
            raise AssertionError(f"DropBP(sublayer, p={p!r}) {got}: it raises ValueError (p must be a number in "
                                 f"[0, 1]: NaN or None is not)")


# --- choose_dropped ------------------------------------------------------------------------------------------------
CHOOSE_HINT = ("one draw u = torch.rand(L, generator=generator), drop where u[i] < rates[i]; then, while fewer than "
               "math.ceil(average_rate * L - 1e-9) drop, force the highest-rate sublayer not dropped yet (ties: the "
               "lower index first)")


def _choose_ref(rates, average_rate, gen) -> list[bool]:
    n = len(rates)
    u = torch.rand(n, generator=gen)
    drop = [float(u[i]) < float(rates[i]) for i in range(n)]
    need = math.ceil(average_rate * n - 1e-9)
    for i in sorted(range(n), key=lambda j: (-float(rates[j]), j)):
        if sum(drop) >= need:
            break
        drop[i] = True
    return drop


def _as_bools(got):
    if isinstance(got, torch.Tensor):
        got = got.tolist()
    if isinstance(got, (list, tuple)) and all(isinstance(v, (bool, int)) and v in (0, 1) for v in got):
        return [bool(v) for v in got]
    return None


def _choose_case(nb, rates, average_rate, seed, as_tensor=False) -> None:
    gen = nb.put(torch.Generator)()
    gen.manual_seed(seed)
    replay = _gen(seed)
    sent = torch.tensor(rates) if as_tensor else list(rates)
    for call in (1, 2):  # two calls in a row on one generator: exactly one draw of L numbers per call
        want = _choose_ref(rates, average_rate, replay)
        got = _as_bools(fetch(nb.choose_dropped(sent, average_rate, gen)))
        shown = [round(r, 3) for r in rates]
        where = (f"choose_dropped(rates={shown}{' as a tensor' if as_tensor else ''}, average_rate={average_rate}), "
                 f"call {call} on a generator seeded {seed}")
        if got is None:
            raise AssertionError(f"{where}: returns a list of L bools (or a bool tensor)")
        if got != want:
            hint = CHOOSE_HINT
            if sum(got) < math.ceil(average_rate * len(rates) - 1e-9):
                hint = f"only {sum(got)} dropped: at least math.ceil(average_rate * L - 1e-9) must drop. " + hint
            raise AssertionError(f"{where} returned {got}, expected {want}. {hint}")


@hidden_test("test_choose_dropped")
def check_choose_dropped(nb):
    _choose_case(nb, [0.5] * 8, 0.5, 3)
    _choose_case(nb, [0.05] * 10, 0.1 + 0.2, 11)  # 0.30000000000000004 * 10 is 3.0000000000000004: 3 must drop
    _choose_case(nb, [0.1, 0.9, 0.3, 0.9, 0.3, 0.1], 0.75, 5)  # ties among the highest rates
    _choose_case(nb, [0.2, 0.2, 0.2, 0.2], 0.75, 6, as_tensor=True)
    _choose_case(nb, [0.0] * 5, 0.0, 7)
    _choose_case(nb, [0.0, 0.4, 1.0], 1.0, 8)
    _choose_case(nb, [0.3], 0.3, 9)
    for _ in range(6):
        n = draw(1, 16)
        rates = [draw(0, 10) / 10 for _ in range(n)]
        _choose_case(nb, rates, draw(0, 20) / 20, new_seed(), as_tensor=bool(draw(0, 1)))
    for _ in range(2):  # generator None: torch's global generator, seeded right before the call
        seed, n = new_seed(), draw(4, 16)
        rates = [draw(2, 8) / 10 for _ in range(n)]
        want = _choose_ref(rates, 0.0, _gen(seed))
        got = _as_bools(fetch(nb.apply(probes.ch14_seeded, nb.choose_dropped, seed, rates, 0.0, None)))
        if got != want:
            raise AssertionError(f"choose_dropped(rates={rates}, average_rate=0.0, generator=None) right after "
                                 f"torch.manual_seed({seed}) returned {got}, expected {want}: generator None means "
                                 f"torch's global generator (torch.rand(L, generator=None)). {CHOOSE_HINT}")


@hidden_test("test_choose_dropped_errors")
def check_choose_dropped_errors(nb):
    for args, why in ((([], 0.5), "no rates"), (([0.5, 1.2], 0.5), "a rate of 1.2"), (([-0.1], 0.5), "a rate of -0.1"),
                      (([0.5], -0.1), "average_rate -0.1"), (([0.5], 1.5), "average_rate 1.5")):
        names = fetch(nb.apply(probes.raised, nb.choose_dropped, *args, None))
        if names is None or "ValueError" not in names:
            got = "returned" if names is None else f"raised {names[0]}"
            raise AssertionError(f"choose_dropped with {why} {got}: it raises ValueError")


# --- sensitivity ---------------------------------------------------------------------------------------------------
SENS_HINT = ("S_i = Σ_k (o_k − n_{i,k})² with o_k the L2 norm (not squared) of parameter k's gradient with nothing "
             "dropped and n_{i,k} the same with only sublayer i dropped (force True for it, False for every other "
             "DropBP: no random drops), .grad None before each backward, a missing gradient counting 0, over the "
             "parameters with requires_grad")
TRAIN_HINT = "the model runs in training mode during the call (a DropBP module in eval mode never drops)"
STATE_HINT = ("on return every DropBP module's force is what it was before the call, the training mode is restored "
              "and every parameter's .grad is None")


def _sens_parts(n_layers: int, d_in: int, d: int, h: int, classes: int, seed: int):
    torch.manual_seed(seed)
    stem, head = nn.Linear(d_in, d), nn.Linear(d, classes)
    subs = [_mlp_sub(d, h, seed + 10 + i) for i in range(n_layers)]
    stem.weight.requires_grad_(False)  # a frozen parameter: not in the list
    return stem, subs, head


def _sens_ref(stem, subs, head, x, y, loss=F.cross_entropy) -> list[float]:
    stem, head = copy.deepcopy(stem).double(), copy.deepcopy(head).double()
    subs = [copy.deepcopy(s).double() for s in subs]
    params = [p for m in (stem, *subs, head) for p in m.parameters() if p.requires_grad]

    def norms(dropped):
        for p in params:
            p.grad = None
        hdn = stem(x.double())
        for i, s in enumerate(subs):
            out = s(hdn)
            hdn = hdn + (out.detach() if i == dropped else out)
        loss(head(hdn), y).backward()
        return torch.stack([p.grad.norm() if p.grad is not None else torch.zeros((), dtype=torch.float64)
                            for p in params])

    o = norms(None)
    return [float((o - norms(i)).pow(2).sum()) for i in range(len(subs))]


def _sens_model(nb, stem, subs, head, p: float = 0.5, nested: bool = False):
    gen = nb.put(torch.Generator)()
    gen.manual_seed(new_seed())
    layers = [nb.DropBP(nb.put(copy.deepcopy(s)), p, gen) for s in subs]
    if nested:  # blocks of one or two DropBP modules, the blocks in a Sequential: none is a child of the model
        seq = nb.put(nn.Sequential)
        blocks = [seq(*layers[i:i + 2]) for i in range(0, len(layers), 2)]
        layers = [seq(*blocks)]
    return nb.put(nn.Sequential)(nb.put(copy.deepcopy(stem)), *layers, nb.put(copy.deepcopy(head)))


def _sens_case(nb, n_layers, seed, n=12, d_in=5, d=8, h=16, classes=3, model_eval=False, preset=None, nested=False,
               mse=False):
    stem, subs, head = _sens_parts(n_layers, d_in, d, h, classes, seed)
    model = _sens_model(nb, stem, subs, head, nested=nested)
    if model_eval:
        nb.apply(probes.ch14_train, model, False)
    if preset is not None:
        nb.apply(probes.ch14_set_forces, model, nb.DropBP, preset)
    g = _gen(seed + 99)
    x, y = torch.randn(n, d_in, generator=g), torch.randint(0, classes, (n,), generator=g)
    if mse:
        y = torch.randn(n, classes, generator=g)
    got = fetch(nb.sensitivity(model, (x, y), nb.put(nn.MSELoss() if mse else nn.CrossEntropyLoss())))
    want = _sens_ref(stem, subs, head, x, y, F.mse_loss if mse else F.cross_entropy)
    where = (f"sensitivity on a model of {n_layers} DropBP sublayers (p = 0.5) between Linear({d_in}, {d}) (weight "
             f"frozen) and Linear({d}, {classes}), batch {n}" + (", the model in eval mode" if model_eval else "") +
             (f", force preset {preset}" if preset else "") +
             (", the DropBP modules nested in blocks (nn.Sequential) inside an nn.Sequential" if nested else "") +
             (", loss_fn nn.MSELoss() on float targets" if mse else ", loss_fn nn.CrossEntropyLoss()"))
    if isinstance(got, tuple):
        got = list(got)
    if isinstance(got, torch.Tensor):
        got = got.tolist()
    if not isinstance(got, list) or len(got) != n_layers or not all(isinstance(v, (int, float)) for v in got):
        raise AssertionError(f"{where} returned {str(got)[:80]}: a list of {n_layers} floats, one per DropBP module")
    scale = max(want)
    hint = TRAIN_HINT if model_eval and all(abs(v) < 1e-12 for v in got) else SENS_HINT
    check_close(torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64), where, hint,
                atol=1e-6 * scale, rtol=2e-3)
    return model


@hidden_test("test_sensitivity")
def check_sensitivity(nb):
    _sens_case(nb, 3, 1)
    _sens_case(nb, draw(3, 5), new_seed() % 10**6, n=7, d=6, h=10, nested=True)
    _sens_case(nb, draw(2, 6), new_seed() % 10**6, n=draw(4, 16), d=draw(4, 12), h=draw(4, 16), classes=draw(2, 5),
               mse=True)


@hidden_test("test_sensitivity_edge_cases")
def check_sensitivity_edge_cases(nb):
    model = _sens_case(nb, 3, 21, model_eval=True, preset={0: True, 2: False})
    state = fetch(nb.apply(probes.ch14_state, model, nb.DropBP))
    where = "after sensitivity on a model in eval mode whose DropBP forces were True, None, False"
    if state["training"]:
        raise AssertionError(f"{where}: the model is left in training mode. {STATE_HINT}")
    if state["forces"] != [True, None, False]:
        raise AssertionError(f"{where}: the forces are {state['forces']}. {STATE_HINT}")
    if not state["grads_none"]:
        raise AssertionError(f"{where}: some parameters still hold a .grad. {STATE_HINT}")
    _sens_case(nb, 1, 22)
    names = fetch(nb.apply(probes.raised, nb.sensitivity, nb.put(nn.Sequential(nn.Linear(3, 2))),
                           (torch.randn(4, 3), torch.tensor([0, 1, 0, 1])), nb.put(nn.CrossEntropyLoss())))
    if names is None or "ValueError" not in names:
        got = "returned" if names is None else f"raised {names[0]}"
        raise AssertionError(f"sensitivity on a model without DropBP modules {got}: it raises ValueError")


# --- allocate_drop_rates ------------------------------------------------------------------------------------------
ALLOC_HINT = ("start at 0; while Σ f_i (1 − p_i) > (1 − average_rate) Σ f_i + 1e-9 Σ f_i, raise by 0.1 the rate of the "
              "sublayer with the smallest S_i (1 + k_i), k_i = 10 p_i, among those below 0.9 (ties: the lower index "
              "first)")


def _alloc_ref(s, f, average_rate, penalty="exact") -> list[float]:
    """The greedy allocation on integer steps: kept FLOPs tracked as one running sum. The penalty S_i (1 + k_i)
    compared exactly ("exact", Fractions of the floats sent), or in floating point as S_i * (1 + k_i) ("int") or
    S_i * (0.1 + k_i / 10) ("float"): the three orders differ only where two penalties are equal exactly."""
    steps = [0] * len(s)
    kept, limit = float(sum(f)), (1 - average_rate) * sum(f) + 1e-9 * sum(f)
    cost = {"exact": lambda v, k: Fraction(v) * (1 + k), "int": lambda v, k: v * (1 + k),
            "float": lambda v, k: v * (0.1 + k / 10)}[penalty]
    while kept - limit > 0:
        open_ = [(cost(s[j], steps[j]), j) for j in range(len(s)) if steps[j] < 9]
        if not open_:
            break
        _, pick = min(open_)  # the smallest penalty, then the lower index
        steps[pick] += 1
        kept = sum(fi * (10 - ki) for fi, ki in zip(f, steps)) / 10
    return [v / 10 for v in steps]


def _alloc_case(nb, s, f, average_rate, as_tensor=False) -> None:
    wants = [_alloc_ref(s, f, average_rate, penalty) for penalty in ("exact", "int", "float")]
    want = wants[0]
    sent_s = torch.tensor(s, dtype=torch.float64) if as_tensor else list(s)
    got = fetch(nb.allocate_drop_rates(sent_s, list(f), average_rate))
    if isinstance(got, torch.Tensor):
        got = got.tolist()
    where = (f"allocate_drop_rates(sensitivity={[round(v, 4) for v in s]}, flops={list(f)}, "
             f"average_rate={average_rate})")
    if not isinstance(got, (list, tuple)) or len(got) != len(s) or not all(isinstance(v, (int, float)) for v in got):
        raise AssertionError(f"{where} returned {str(got)[:80]}: a list of {len(s)} floats")
    if not any(same_close(torch.tensor([float(v) for v in got], dtype=torch.float64),
                          torch.tensor(w, dtype=torch.float64), atol=1e-6, rtol=0) for w in wants):
        hint = ALLOC_HINT
        if any(v > 0.9 + 1e-6 for v in got):
            hint = "no rate goes above 0.9. " + hint
        elif any(abs(v * 10 - round(v * 10)) > 1e-6 for v in got):
            hint = "rates move in steps of 0.1. " + hint
        raise AssertionError(f"{where} returned {list(got)}, expected {want}. {hint}")


@hidden_test("test_allocate_drop_rates")
def check_allocate_drop_rates(nb):
    _alloc_case(nb, [1.0, 2.0, 4.0, 0.5], [3, 5, 3, 5], 0.5)
    _alloc_case(nb, [3.0, 3.0, 3.0, 3.0], [1, 1, 1, 1], 0.25)  # ties: the lower index first
    _alloc_case(nb, [0.0, 0.0, 2.0], [1, 1, 1], 0.6)  # zero sensitivities: the first goes to 0.9 before the second
    _alloc_case(nb, [0.5, 1.0, 1.5], [1, 100, 1], 0.5)  # one sublayer holds most of the FLOPs
    _alloc_case(nb, [0.7, 0.2, 0.9], [10, 10, 10], 0.0)
    _alloc_case(nb, [0.7, 0.2, 0.9], [10, 10, 10], 0.9)
    _alloc_case(nb, [0.01, 5.0, 0.02, 4.0, 0.03, 3.0], [4, 6, 4, 6, 4, 6], 0.75, as_tensor=True)
    _alloc_case(nb, [2.5], [7], 0.45)
    _alloc_case(nb, [2.0, 1.0], [1, 1], 0.4)  # 2·(1 + 2) = 1·(1 + 5): [0.3, 0.5] exactly, [0.2, 0.6] in floats
    for _ in range(8):
        n = draw(1, 12)
        s = [draw(1, 10**6) / 10**5 for _ in range(n)]
        f = [draw(1, 10**5) for _ in range(n)]
        _alloc_case(nb, s, f, draw(0, 18) / 20, as_tensor=bool(draw(0, 1)))


@hidden_test("test_allocate_drop_rates_errors")
def check_allocate_drop_rates_errors(nb):
    for args, why in ((([1.0], [1.0, 2.0], 0.5), "lengths 1 and 2"), (([], [], 0.5), "no sublayers"),
                      (([-1.0], [1.0], 0.5), "a negative sensitivity"), (([1.0], [-1.0], 0.5), "negative FLOPs"),
                      (([1.0, 1.0], [0.0, 0.0], 0.5), "FLOPs summing to 0"),
                      (([1.0], [1.0], 0.95), "average_rate 0.95"), (([1.0], [1.0], -0.1), "average_rate -0.1")):
        names = fetch(nb.apply(probes.raised, nb.allocate_drop_rates, *args))
        if names is None or "ValueError" not in names:
            got = "returned" if names is None else f"raised {names[0]}"
            raise AssertionError(f"allocate_drop_rates with {why} {got}: it raises ValueError")
