"""Hidden tests of ch09_mixed_precision: ``GradScaler`` and ``mixed_precision_step``, one cell per property.

GradScaler: one trusted driver (``probes.ch09_drive_scaler``) runs the same training steps, with
overflows injected as inf/-inf/NaN written into a gradient, once in the student's process with the
student's scaler and once here with ``torch.amp.GradScaler("cpu")``, the reference. Besides fixed
scenarios on a small model, each of the two cells draws a wide one at grading time (``_wide_scenario``):
weights of 1024 to 9216 entries, an unused parameter of 1024 to 4096, seed, scale, growth_interval and
optimizer drawn, and the overflows written at flat indices over the whole gradient (the first exactly in its
last entry, the second exactly in its first, the others drawn anywhere), so an overflow check that reads only
part of a gradient (skips its first or last entry, a prefix, a strided sample) misses one. The driver reads the
parameters the judge sent with the optimizer (one message), not ``optimizer.param_groups``, and ends with
one more ``scale(loss).backward()`` so that the scale the last ``update()`` left is seen in gradient values.
- values (test_GradScaler): ``scale()`` on float32/float16/bfloat16 losses; then, step by step, the
  scaled gradients, the gradients after ``unscale_`` and after ``step``, parameters and optimizer state
  (momentum buffers, Adam step counts), against torch's scaler made to follow the student's own scales
  (``update(new_scale)``), and what ``step`` returns: a wrong growth/backoff schedule costs this cell nothing.
- update: the scale before ``step``, between ``step`` and ``update`` and after ``update``, against torch's
  scaler on its own; the injected overflows go into the gradient of a parameter the loss never reaches, so
  a step that is not skipped leaves the model finite and costs this cell nothing; a real overflow from a
  huge scale (compared while the model stays finite), and growth that would reach inf in float32.
- interface: the ValueErrors of ``__init__``, the RuntimeErrors of misuse (``probes.ch09_scaler_calls``),
  a valid use without error, ``step``'s extra arguments and return value, ``get_scale()`` a Python float.

mixed_precision_step: the reference is computed here with the same autocast, the same float32 model and
``torch.amp.GradScaler``. Recorders (autocast state and dtypes during forward, calls on the scaler, on
the loss) name the mistake; what decides is in values the judge compares: the model and the loss carry
canary terms whose values depend on the precision they ran in (float32, float16 or bfloat16 autocast),
so a forward or a loss outside autocast, or in the wrong dtype, changes the loss and every update;
parameters and optimizer state are read from the tensors the judge sent, the scale with torch's own
``GradScaler.get_scale`` on the scaler the judge sent.
- values (test_mixed_precision_step): the update of every parameter and the optimizer state (float16 with a
  scaler, bfloat16 with one and without), autocast and float32 master weights.
- scaler: ``scale``, ``step``, ``update`` once each and in order, the scale after the step, and a float16
  step whose loss is inf skipped (nothing moves).
- returns: the returned loss, a Python float before scaling (inf for the overflow step), on the same cases
  without canary terms, so that it is graded apart from where autocast ran.
"""
from __future__ import annotations

import math
import random

import torch
from torch import nn

from coursekit.checks import check_close, check_equal, same_close
from grader import probes
from grader.api import fetch, hidden_test
from grader.resources import draw, new_seed
from grader.source_policy import Shortcut, SourcePolicy

# The GradScaler exercise is compared with torch.amp.GradScaler: wrapping or calling it is not an answer.
SOURCE_POLICY = SourcePolicy(shortcuts=(
    Shortcut(paths=("coursekit.capstone",),
             instead="write it yourself; coursekit.capstone (chapter 16's reference fine-tune) holds "
                     "the course's own autocast training step"),
    Shortcut(paths=("torch.amp.GradScaler", "torch.amp.grad_scaler", "torch.cuda.amp.GradScaler",
                    "torch.cuda.amp.grad_scaler", "torch.cpu.amp.GradScaler", "torch.cpu.amp.grad_scaler"),
             instead="keep the scale, the count of clean steps and the per-optimizer state yourself; "
                     "torch.amp.GradScaler is the reference you are compared with"),
))

TOL = dict(atol=1e-6, rtol=1e-5)  # same ops on both sides; only float32 rounding may differ
# Half-precision matmuls sum in a different order with another thread count (the sandbox runs one
# thread): a few fp16 ulps. The mistakes looked for move parameters by a whole update or more.
STEP_TOL = dict(atol=2e-5, rtol=1e-3)
SKIP_HINT = ("a step whose gradients hold an inf or a NaN must be skipped entirely (inf, -inf and NaN all "
             "count as overflow, in any entry of any gradient, the first and the last included: check whole "
             "tensors): do not call optimizer.step() at all (zeroing the gradients and stepping still moves "
             "momentum and Adam state)")
GROWTH_HINT = ("update(): on overflow multiply the scale by backoff_factor and reset the count of clean steps; "
               "otherwise add one clean step and, when the count reaches growth_interval, multiply by "
               "growth_factor and reset the count")
UNSCALE_HINT = "unscale_ multiplies every .grad by 1/S, once per iteration: step() must not unscale again"


# (parameter index, numel) of the parameters that get a gradient: 0 is unused, 2 is frozen.
WITH_GRAD = [(1, 77), (3, 55), (4, 5)]
UNUSED = 0
SMALL = (7, 11, 5, 3)  # in, hidden and out features, entries of the unused parameter


def _model(seed: int, sizes: tuple[int, int, int, int] = SMALL) -> nn.Module:
    """Two layers, an unused parameter (its .grad stays None) and a frozen one in the optimizer."""
    d, h, o, n_unused = sizes
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(d, h), nn.Tanh(), nn.Linear(h, o))
        model.register_parameter("unused", nn.Parameter(torch.randn(n_unused)))
        model[0].bias.requires_grad_(False)
    return model


def _optimizer(kind: str, model: nn.Module):
    params = list(model.parameters())
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.Adam(params, lr=1e-2)


def _plan(seed: int, steps: int, p_overflow: float, n_params_with_grad: list[tuple[int, int]]) -> list[dict]:
    rng = random.Random(seed)
    values = [float("inf"), float("-inf"), float("nan")]
    plan = []
    for i in range(steps):
        item = {"poison": None, "unscale": rng.random() < 0.3, "twice": False}
        if rng.random() < p_overflow:
            index, numel = rng.choice(n_params_with_grad)
            item["poison"] = [index, rng.randrange(numel), values[i % 3]]
        plan.append(item)
    return plan


def _fmt_plan(plan) -> str:
    return "".join("X" if p["poison"] is not None else "." for p in plan)


def _run(nb, scenario: dict, follow: bool = False):
    """(student records, reference records). With ``follow``, the reference takes the student's scales:
    its first scale is the one the student's scaler used, and each of its ``update()`` calls sets the
    scale the student's ``update()`` left (``update(new_scale)``). What the two runs are compared on
    then does not depend on the growth/backoff schedule, which a cell of its own grades."""
    sizes = scenario.get("sizes", SMALL)
    g = torch.Generator().manual_seed(scenario["seed"])
    x = torch.randn(13, sizes[0], generator=g)
    y = torch.randn(13, sizes[2], generator=g) * scenario.get("target_scale", 1.0)
    kwargs = dict(init_scale=scenario["init_scale"], growth_factor=scenario.get("growth_factor", 2.0),
                  backoff_factor=scenario.get("backoff_factor", 0.5), growth_interval=scenario["growth_interval"])
    model = _model(scenario["seed"], sizes)
    pair = nb.put((model, _optimizer(scenario["opt"], model), list(model.parameters())))  # one message
    got = fetch(nb.apply(probes.ch09_drive_scaler, nb.GradScaler(**kwargs), pair[0], pair[1], x, y,
                         scenario["plan"], pair[2]))
    plan = scenario["plan"]
    if follow:
        kwargs = dict(kwargs, init_scale=got[0]["scale_used"])
        plan = [dict(item, new_scale=rec["scale"]) for item, rec in zip(plan, got)]
    ref_model = _model(scenario["seed"], sizes)  # a fresh copy: local runs share objects
    ref = probes.ch09_drive_scaler(torch.amp.GradScaler("cpu", **kwargs), ref_model,
                                   _optimizer(scenario["opt"], ref_model), x, y, plan)
    return got, ref


def _what(scenario: dict) -> str:
    args = f"{scenario['init_scale']:g}, growth_interval={scenario['growth_interval']}"
    for key, default in (("growth_factor", 2.0), ("backoff_factor", 0.5)):
        if scenario.get(key, default) != default:
            args += f", {key}={scenario[key]:g}"
    where = ""
    if "sizes" in scenario:
        d, h, o, n_unused = scenario["sizes"]
        spots = [f"parameter {p[0]}[{p[1]}] of {_numel(scenario['sizes'], p[0])}" for p in
                 (item["poison"] for item in scenario["plan"]) if p is not None]
        where = (f"; model Linear({d}, {h}), Tanh, Linear({h}, {o}), an unused parameter of {n_unused} entries; "
                 f"overflows written at {', '.join(spots)} (flat index of numel)")
    return (f"{scenario['name']} (GradScaler({args}), {scenario['opt']}; steps {_fmt_plan(scenario['plan'])}, "
            f"X = overflow{where})")


def _overflowed(record: dict) -> bool:
    return any(g is not None and not torch.isfinite(g).all() for g in record["raw_grads"])


def _check_values(nb, scenario: dict) -> None:
    """scale(), unscale_() and step() step by step, against torch's scaler following the student's scales."""
    got, ref = _run(nb, scenario, follow=True)
    what = _what(scenario)
    for step, (a, b, item) in enumerate(zip(got, ref, scenario["plan"]), start=1):
        at = f"{what}, step {step} (at your scale {a['scale_used']:g})"
        for i, (ga, gb) in enumerate(zip(a["raw_grads"], b["raw_grads"])):
            if (ga is None) != (gb is None):
                raise AssertionError(f"{at}: parameter {i} has {'no' if ga is None else 'a'} gradient after "
                                     "scale(loss).backward(); scale() must return loss * S, still attached to the "
                                     "graph")
            if gb is not None and torch.isfinite(gb).all():
                check_close(ga, gb, f"{at}: the scaled gradient of parameter {i}",
                            "scale(loss) is loss * S, with S the scale get_scale() reports: backward then gives S "
                            "times the gradient", **TOL)
        if item["unscale"]:
            for i, (ga, gb) in enumerate(zip(a["unscaled_grads"], b["unscaled_grads"])):
                if gb is not None and torch.isfinite(gb).all():
                    check_close(ga, gb, f"{at}: parameter {i}'s gradient after unscale_",
                                "unscale_ multiplies every .grad of the optimizer's parameters by 1/S, in place", **TOL)
        overflow = _overflowed(b)
        if a["step_return"] != b["step_return"]:
            raise AssertionError(f"{at}: step(optimizer) returned {a['step_return']!r}, expected {b['step_return']!r}: "
                                 "it returns what optimizer.step() returned (None without a closure), and None when "
                                 "the step is skipped")
        if not overflow:
            for i, (ga, gb) in enumerate(zip(a["grads_after_step"], b["grads_after_step"])):
                if gb is not None:
                    check_close(ga, gb, f"{at}: parameter {i}'s gradient after step()",
                                UNSCALE_HINT + (" (unscale_ was called explicitly before step here)"
                                                if item["unscale"] else ""), **TOL)
        for i, (pa, pb) in enumerate(zip(a["params"], b["params"])):
            if not same_close(pa, pb, equal_nan=True, **TOL):
                hint = SKIP_HINT if overflow else UNSCALE_HINT
                check_close(pa, pb, f"{at}{' (an overflow step)' if overflow else ''}: parameter {i} after the step",
                            hint, **TOL)
        check_equal(sorted(a["state"]), sorted(b["state"]), f"{at}: the parameters with optimizer state",
                    SKIP_HINT if overflow else "")
        for p_name, st in b["state"].items():
            for key, vb in st.items():
                va = a["state"][p_name].get(key)
                if isinstance(vb, torch.Tensor):
                    check_close(va, vb, f"{at}{' (an overflow step)' if overflow else ''}: optimizer state "
                                f"{key!r} of parameter {p_name[1:]}", SKIP_HINT if overflow else UNSCALE_HINT, **TOL)
    for i, (ga, gb) in enumerate(zip(got[-1]["final_raw_grads"], ref[-1]["final_raw_grads"])):
        if gb is not None and torch.isfinite(gb).all():
            if ga is None:
                raise AssertionError(f"{what}, after the last step: parameter {i} has no gradient after "
                                     "scale(loss).backward()")
            check_close(ga, gb, f"{what}, after the last step: the gradient of scale(loss).backward() for "
                        f"parameter {i}", "scale() multiplies by the scale update() left, the one get_scale() "
                        "reports", **TOL)


def _float32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


def _schedule_hint(before: float, got: float, want: float, overflow: bool, growth: float, backoff: float) -> str:
    """The hint for a scale after update() that differs from torch's."""
    if overflow:
        return ("this step's gradients held an inf or a NaN (inf, -inf and NaN all count as overflow, in any entry "
                "of any gradient, the first and the last included: check whole tensors): update() multiplies the "
                "scale by backoff_factor and resets the count of clean steps")
    if want == before and got == before * growth:
        if not math.isfinite(_float32(before * growth)):
            return ("the scale never grows to inf: torch keeps S in float32, and when S × growth_factor would be "
                    "inf there, update() leaves S where it is (and resets the count of clean steps)")
        return ("the scale grew too early: it grows after growth_interval clean steps in a row, counted one per "
                "update() since the last overflow or the last growth (reset the count on overflow and after growing)")
    if want == before * growth and got == before:
        return ("the scale should have grown here: when the count of clean steps in a row (one per update(), since "
                "the last overflow or growth) reaches growth_interval, multiply the scale by growth_factor and "
                "reset the count")
    if got == before * backoff:
        return "the scale backed off after a clean step: only a step with an inf or NaN gradient backs off"
    return GROWTH_HINT


def _check_schedule(nb, scenario: dict) -> None:
    """The scale before step(), between step() and update() and after update(), against torch's scaler."""
    got, ref = _run(nb, scenario)
    what = _what(scenario)
    growth, backoff = scenario.get("growth_factor", 2.0), scenario.get("backoff_factor", 0.5)
    for step, (a, b) in enumerate(zip(got[:-1], ref[:-1]), start=1):  # the last record: one more backward
        at = f"{what}, step {step}"
        check_close(torch.tensor(a["scale_used"]), torch.tensor(b["scale_used"]), f"{at}: the scale used by scale()",
                    "the first scale is init_scale" if step == 1 else "update() sets the scale of the next step: "
                    + GROWTH_HINT, atol=0, rtol=1e-6)
        check_close(torch.tensor(a["scale_after_step"]), torch.tensor(b["scale_after_step"]),
                    f"{at}: the scale between step() and update()",
                    "step() does not change the scale: update() does, once per iteration", atol=0, rtol=1e-6)
        if not same_close(torch.tensor(a["scale"]), torch.tensor(b["scale"]), atol=0, rtol=1e-6):
            hint = _schedule_hint(b["scale_used"], a["scale"], b["scale"], _overflowed(b), growth, backoff)
            check_close(torch.tensor(a["scale"]), torch.tensor(b["scale"]), f"{at}: the scale after update()", hint,
                        atol=0, rtol=1e-6)
        if not all(torch.isfinite(p).all() for i, p in enumerate(a["params"]) if i != UNUSED):
            break  # a step with an inf gradient was taken: the values cell grades it; what follows is not a schedule


def _check_scale_dtypes(nb) -> None:
    """scale() keeps the loss's dtype and the graph, as torch's does, for fp32, fp16 and bf16 losses."""
    for dtype, init in ((torch.float32, 65536.0), (torch.float16, 1024.0), (torch.bfloat16, 65536.0)):
        base = torch.linspace(-0.7, 0.9, 6).reshape(2, 3).to(dtype)
        expected = torch.amp.GradScaler("cpu", init_scale=init).scale(base.clone())
        t = nb.put(base.clone().requires_grad_(True))
        scaled = nb.GradScaler(init_scale=init).scale(t)
        value = fetch(scaled)
        what = f"GradScaler(init_scale={init:g}).scale(a {str(dtype)[6:]} tensor)"
        if not isinstance(value, torch.Tensor):
            raise AssertionError(f"{what} returned a {type(value).__name__}, expected a tensor")
        if value.dtype != dtype:
            raise AssertionError(f"{what} returned dtype {value.dtype}: keep the dtype of the loss, as torch does "
                                 "(multiply by a 0-dim float32 tensor or a Python float)")
        check_close(value, expected, what, "scale(loss) returns loss * S")
        if not fetch(scaled.requires_grad):
            raise AssertionError(f"{what} returned a tensor that does not require grad: scale() must stay attached "
                                 "to the autograd graph (return loss * S, not a new tensor built from its value)")
        scaled.sum().backward()
        check_close(fetch(t.grad), torch.full((2, 3), init, dtype=dtype), f"{what}: the gradient reaching the input",
                    "scale() must stay attached to the autograd graph: backward of loss * S gives S")



HAND_PLAN = ([{"poison": None, "unscale": False}] * 3 + [{"poison": [1, 3, float("nan")], "unscale": False}]
             + [{"poison": None, "unscale": i == 1} for i in range(2)]
             + [{"poison": [3, 0, float("inf")], "unscale": True}]
             + [{"poison": None, "unscale": False}] * 7
             + [{"poison": [4, 4, float("-inf")], "unscale": False}, {"poison": [1, 0, float("nan")], "unscale": True}]
             + [{"poison": None, "unscale": i % 2 == 0} for i in range(4)])
SCENARIOS = [
    dict(name="fixed sequence", seed=1, init_scale=1024.0, growth_interval=3, opt="sgd", plan=HAND_PLAN),
    dict(name="random sequence", seed=2, init_scale=65536.0, growth_interval=3, opt="adam",
         plan=_plan(2, 30, 0.3, WITH_GRAD)),
    dict(name="random sequence", seed=3, init_scale=512.0, growth_interval=2, growth_factor=4.0,
         backoff_factor=0.25, opt="sgd", plan=_plan(3, 24, 0.4, WITH_GRAD)),
    dict(name="real overflow from a huge scale", seed=4, init_scale=2.0 ** 127, growth_interval=2, opt="adam",
         target_scale=300.0, plan=[{"poison": None, "unscale": False}] * 16),
]


# The wide scenario: every size drawn at grading time from these ranges (the exercise's text states them).
WIDE_IN, WIDE_HIDDEN, WIDE_OUT, WIDE_UNUSED = (32, 96), (32, 96), (32, 64), (1024, 4096)
WIDE_STEPS, WIDE_OVERFLOWS = 12, 4
# Where the overflows of a wide scenario land, in order: the gradient's last entry, its first entry, then
# anywhere (drawn over the whole tensor). The ends are fixed: an off-by-one check ([:-1], [1:]) misses one.
LAST, FIRST = "last", "first"
WIDE_SPOTS = (LAST, FIRST)


def _numel(sizes: tuple[int, int, int, int], index: int) -> int:
    d, h, o, n_unused = sizes
    return {UNUSED: n_unused, 1: h * d, 2: h, 3: o * h, 4: o}[index]


def _wide_scenario() -> dict:
    """A model whose parameters have thousands of entries, sizes, seed, optimizer and plan drawn now: the
    overflows go into the two weights, the first exactly at the gradient's last entry, the second exactly at
    its first (WIDE_SPOTS), the others at flat indices drawn over the whole gradient, so a check that reads
    only part of a gradient misses some. ``unused_at`` is where the same overflow goes in the unused
    parameter, placed the same way (for the schedule cell)."""
    sizes = (draw(*WIDE_IN), draw(*WIDE_HIDDEN), draw(*WIDE_OUT), draw(*WIDE_UNUSED))
    seed = new_seed()
    rng = random.Random(seed)
    values = [float("inf"), float("-inf"), float("nan")]
    rng.shuffle(values)
    overflow_steps = sorted(rng.sample(range(1, WIDE_STEPS), WIDE_OVERFLOWS))
    plan = []
    for step in range(WIDE_STEPS):
        item = {"poison": None, "unscale": rng.random() < 0.3, "twice": False}
        if step in overflow_steps:
            k = overflow_steps.index(step)
            index = rng.choice((1, 3))
            numel, n_unused = _numel(sizes, index), sizes[3]
            spot = WIDE_SPOTS[k] if k < len(WIDE_SPOTS) else None
            if spot == LAST:  # exactly the last entry of the tensor
                at, unused_at = numel - 1, n_unused - 1
            elif spot == FIRST:  # exactly the first entry
                at, unused_at = 0, 0
            else:
                at, unused_at = rng.randrange(numel), rng.randrange(n_unused)
            item["poison"] = [index, at, values[k % 3]]
            item["unused_at"] = unused_at
        plan.append(item)
    return dict(name="wide model", seed=seed, sizes=sizes, init_scale=2.0 ** draw(9, 16),
                growth_interval=draw(1, 3), opt=rng.choice(("sgd", "adam")), plan=plan)


def _poison_unused(plan: list[dict]) -> list[dict]:
    """The same overflows written into the gradient of the parameter the loss never reaches (index 0): a step
    that is not skipped then leaves the model finite, so the scale schedule is graded on its own."""
    return [dict(item, poison=None if item["poison"] is None else
                 [UNUSED, item.get("unused_at", item["poison"][1] % 3), item["poison"][2]])
            for item in plan]


@hidden_test("test_GradScaler")
def check_grad_scaler(nb):
    _check_scale_dtypes(nb)
    for scenario in SCENARIOS:
        _check_values(nb, scenario)
    _check_values(nb, _wide_scenario())


@hidden_test("test_GradScaler_update")
def check_grad_scaler_update(nb):
    for scenario in (*SCENARIOS[:3], _wide_scenario()):
        _check_schedule(nb, dict(scenario, plan=_poison_unused(scenario["plan"])))
    _check_schedule(nb, SCENARIOS[3])
    # Growth that would reach inf in float32 (2^127 × 2): torch leaves the scale where it is.
    _check_schedule(nb, dict(name="growth at float32's limit", seed=5, init_scale=2.0 ** 126, growth_interval=1,
                             opt="sgd", target_scale=0.0, plan=[{"poison": None, "unscale": False}] * 4))


# keyword arguments of GradScaler(...) that must raise ValueError, and what is wrong with them
BAD_SCALER_ARGS = (
    (dict(init_scale=0.0), "init_scale=0 (the scale must be positive)"),
    (dict(init_scale=-1024.0), "init_scale=-1024 (the scale must be positive)"),
    (dict(growth_factor=1.0), "growth_factor=1 (it must be > 1)"),
    (dict(growth_factor=0.5), "growth_factor=0.5 (it must be > 1)"),
    (dict(backoff_factor=0.0), "backoff_factor=0 (it must be in (0, 1))"),
    (dict(backoff_factor=1.0), "backoff_factor=1 (it must be in (0, 1))"),
    (dict(backoff_factor=1.5), "backoff_factor=1.5 (it must be in (0, 1))"),
    (dict(growth_interval=0), "growth_interval=0 (a positive int)"),
    (dict(growth_interval=-3), "growth_interval=-3 (a positive int)"),
    (dict(growth_interval=2.5), "growth_interval=2.5 (not an int)"),
)
# call sequences on a fresh scaler, the index of the call that must raise RuntimeError, and why
MISUSES = (
    (["backward", "unscale_", "unscale_"], 2,
     "a second unscale_(optimizer) before update(): it would divide the gradients by S twice"),
    (["backward", "step", "unscale_"], 2,
     "unscale_(optimizer) after step(optimizer): the step has already used the gradients"),
    (["backward", "step", "step"], 2, "a second step(optimizer) before update()"),
    (["update"], 0, "update() on a fresh scaler: no step() or unscale_() came before it"),
    (["backward", "step", "update", "update"], 3,
     "a second update() in a row: no step() or unscale_() came since the last update()"),
)
# a valid use: explicit unscale_, step with a closure (positional), plain step, an update after unscale_ only,
# and an overflow step
VALID_USE = ["backward", "unscale_", "step_closure", "update", "backward", "step", "update",
             "backward", "unscale_", "update", "backward", "poison", "step_closure", "update"]


def _calls(nb, calls: list[str], seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(13, 7, generator=g), torch.randn(13, 5, generator=g)
    model = _model(seed)
    pair = nb.put((model, _optimizer("sgd", model)))  # one message
    return fetch(nb.apply(probes.ch09_scaler_calls, nb.GradScaler(init_scale=1024.0, growth_interval=2), pair[0],
                          pair[1], x, y, calls))


def _said(call: dict) -> str:
    return "returned normally" if call["raised"] is None else f"raised {call['raised'][0]}"


@hidden_test("test_GradScaler_interface")
def check_grad_scaler_interface(nb):
    for kwargs, what in BAD_SCALER_ARGS:
        names = fetch(nb.apply(probes.raised, nb.GradScaler, **kwargs))
        if names is None or "ValueError" not in names:
            got = "returned a scaler" if names is None else f"raised {names[0]}"
            raise AssertionError(f"GradScaler({', '.join(f'{k}={v:g}' for k, v in kwargs.items())}) {got}: {what} "
                                 "should raise ValueError; check the arguments in __init__")
    for args in ((), (2.0 ** 127, 4.0, 0.25, 1)):
        names = fetch(nb.apply(probes.raised, nb.GradScaler, *args))
        if names is not None:
            raise AssertionError(f"GradScaler{args if args else '()'} raised {names[0]}: these arguments are valid")
    kind = fetch(nb.apply(probes.type_names, nb.GradScaler(init_scale=512.0).get_scale()))
    if kind[0] != "builtins.float":
        raise AssertionError(f"get_scale() returned a {kind[0]}, expected a Python float (float(...) of the scale)")
    for seed, (calls, bad, why) in enumerate(MISUSES, start=10):
        got = _calls(nb, calls, seed)
        for i, call in enumerate(got[:bad]):
            if call["raised"] is not None:
                raise AssertionError(f"the calls {calls}: {calls[i]} (call {i + 1}) raised {call['raised'][0]}; "
                                     "it is a valid call there")
        if got[bad]["raised"] is None or "RuntimeError" not in got[bad]["raised"]:
            raise AssertionError(f"the calls {calls}: {why}. The last call {_said(got[bad])}; it must raise "
                                 "RuntimeError (torch does): keep a stage per optimizer (unscaled, stepped), "
                                 "reset by update()")
    got = _calls(nb, VALID_USE, 20)
    for i, call in enumerate(got):
        if call["raised"] is not None:
            why = {"step_closure": "step(optimizer, *args, **kwargs) passes the extra arguments (here a closure) to "
                                   "optimizer.step",
                   "update": "update() ends the iteration after a step() or after unscale_() alone, and resets the "
                             "stage of every optimizer"}.get(VALID_USE[i], "update() starts a new iteration for every "
                                                                            "optimizer")
            raise AssertionError(f"the calls {VALID_USE[:i + 1]}: the last one raised {call['raised'][0]}, but this "
                                 f"is a valid use: {why}")
    if got[2]["returned"] != 0.25:  # (None when a step is skipped: the values cell compares what step() returns)
        raise AssertionError(
            f"the calls {VALID_USE[:3]}: step(optimizer, closure) returned {got[2]['returned']!r}, expected 0.25: "
            "step passes its extra arguments to optimizer.step(*args, **kwargs) and returns what it returned")


# --- mixed_precision_step ----------------------------------------------------------------------------
def _mp_model(seed: int) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(13, 29), nn.GELU(), nn.LayerNorm(29), nn.Linear(29, 7))


def _bundle(case: dict):
    """A recorded model, its optimizer (with stale gradients and some state), a scaler, data and loss."""
    model = probes.ch09_AutocastRecorder(_mp_model(case["seed"]))
    g = torch.Generator().manual_seed(case["seed"] + 100)
    x = torch.randn(37, 13, generator=g)
    if case["loss"] == "ce":
        y, loss_fn = torch.randint(0, 7, (37,), generator=g), nn.CrossEntropyLoss()
    else:
        y, loss_fn = torch.randn(37, 7, generator=g), nn.MSELoss()
    loss_fn = probes.ch09_LossRecorder(loss_fn, case.get("factor") or 1.0)
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if case["opt"] == "sgd"
           else torch.optim.Adam(model.parameters(), lr=1e-2))
    # One plain step first, so the optimizer has state; then stale gradients that must be cleared.
    nn.MSELoss()(model.model(x), torch.zeros(37, 7)).backward()
    opt.step()
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)
    model.calls.clear()
    if case.get("plain"):  # no canary terms: the values no longer depend on where autocast ran
        model.canary.zero_()
        loss_fn.canary.zero_()
    scaler = None if case["init_scale"] is None else probes.ch09_ScalerRecorder(
        init_scale=case["init_scale"], growth_interval=1)
    return model, opt, scaler, x, y, loss_fn


def _close_scaled(got, ref, name: str, hint: str) -> None:
    """Close up to 2% of the tensor's largest entry: a small gradient entry summed over the batch in fp16
    may differ by a few percent with another thread count; the mistakes differ by a whole update."""
    if isinstance(got, torch.Tensor) and got.dtype == ref.dtype and ref.is_floating_point():
        check_close(got, ref, name, hint, atol=2e-2 * float(ref.abs().max()) + 1e-7, rtol=0)
    else:
        check_close(got, ref, name, hint, atol=0, rtol=0)


def _reference_step(case: dict) -> dict:
    model, opt, scaler, x, y, loss_fn = _bundle(case)
    before = {n: p.detach().clone() for n, p in model.model.named_parameters()}
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=case["dtype"]):
        loss = loss_fn(model(x), y)
    if scaler is None:
        loss.backward()
        opt.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return {"before": before, "loss": float(loss.detach()), "params": {n: p.detach().clone() for n, p in model.model.named_parameters()},
            "state": probes.ch09_optimizer_state(opt), "scale": None if scaler is None else scaler.get_scale()}


def _what_step(case: dict) -> str:
    return (f"mixed_precision_step with dtype={case['dtype']}, {case['opt']}, "
            + ("scaler=None" if case["init_scale"] is None else f"a GradScaler at scale {case['init_scale']:g}")
            + (f", a loss multiplied by {case['factor']}" if case.get("factor") is not None else ""))


def _step_run(nb, case: dict) -> dict:
    """One call of the student's mixed_precision_step and the reference step on the same bundle; everything
    read back is the judge's own tensors (parameters, optimizer state, torch's GradScaler) or recorded calls."""
    ref = _reference_step(case)
    bundle = _bundle(case)
    names = [f"model.{n}" for n, _ in bundle[0].model.named_parameters()]
    # One message: the optimizer keeps pointing at this model's parameters, and the judge keeps those
    # tensors and the torch GradScaler inside the recorder, whatever the student's code reassigns.
    b = nb.put((*bundle, list(bundle[0].model.parameters()), None if bundle[2] is None else bundle[2].scaler))
    out = fetch(nb.mixed_precision_step(b[0], b[1], b[2], b[3], b[4], b[5], case["dtype"]))
    run = {"case": case, "what": _what_step(case), "ref": ref, "out": out, "calls": fetch(b[0].calls),
           "loss_calls": fetch(b[5].calls), "table": dict(zip(names, fetch(nb.apply(probes.tensor_states, b[6])))),
           "state": fetch(nb.apply(probes.ch09_optimizer_state, b[1], b[6]))}
    if case["init_scale"] is not None:
        run["scaler_calls"] = fetch(b[2].calls)
        run["scale"] = fetch(nb.apply(probes.ch09_scale_of, b[7]))
    return run


def _check_updates(run: dict, hint: str) -> None:
    what, ref, table, state = run["what"], run["ref"], run["table"], run["state"]
    for name, p in ref["params"].items():
        _close_scaled(table[f"model.{name}"]["value"] - ref["before"][name], p - ref["before"][name],
                      f"{what}: the update of parameter {name}", hint)
    check_equal(sorted(state), sorted(ref["state"]), f"{what}: the parameters with optimizer state", hint)
    for p_name, st in ref["state"].items():
        for key, vb in st.items():
            if isinstance(vb, torch.Tensor):
                _close_scaled(state[p_name][key], vb, f"{what}: optimizer state {key!r} of parameter {p_name[1:]}",
                              hint)


def _check_step_values(run: dict) -> None:
    """How the step ran (recorded, for the message) and what it did to the judge's tensors (decides)."""
    what, calls, loss_calls, dtype = run["what"], run["calls"], run["loss_calls"], run["case"]["dtype"]
    if not calls:
        raise AssertionError(f"{what}: the model was never called")
    if len(calls) > 1:
        raise AssertionError(f"{what}: the model was called {len(calls)} times; one forward pass per step")
    call = calls[0]
    if "torch.float32" not in call["params"] or len(call["params"]) != 1:
        raise AssertionError(f"{what}: during forward the parameters were {call['params']}: keep float32 master "
                             "weights and let autocast cast them per op (never model.half() / model.to(dtype))")
    if not call["autocast"]:
        raise AssertionError(f"{what}: the forward pass ran without autocast for device type 'cpu': wrap it in "
                             "torch.autocast(device_type=inputs.device.type, dtype=dtype)")
    if call["dtype"] != str(dtype):
        raise AssertionError(f"{what}: autocast ran with dtype {call['dtype']}, expected {dtype}")
    if len(loss_calls) != 1 or not loss_calls[0]["autocast"]:
        raise AssertionError(f"{what}: loss_fn was called {len(loss_calls)} time(s)"
                             + (", outside autocast" if loss_calls and not loss_calls[0]["autocast"] else "")
                             + ": compute the loss once, under autocast too (losses autocast to float32)")
    for name, row in run["table"].items():
        if row["value"].dtype != torch.float32:
            raise AssertionError(f"{what}: parameter {name} is {row['value'].dtype} after the step; the master "
                                 "weights must stay float32")
    _check_updates(run, "zero the gradients first (they hold stale values), run the forward pass and loss_fn under "
                        "autocast with dtype, back-propagate scaler.scale(loss) (the loss itself without a scaler) "
                        "and call scaler.step(optimizer)")


def _check_step_scaler(run: dict) -> None:
    what, ref = run["what"], run["ref"]
    counted = {k: run["scaler_calls"].count(k) for k in ("scale", "step", "update")}
    check_equal(counted, {"scale": 1, "step": 1, "update": 1}, f"{what}: calls on the scaler",
                "per step: scaler.scale(loss).backward(), scaler.step(optimizer), scaler.update(), once each; "
                "scaler.step(optimizer) unscales and steps (never optimizer.step() yourself)")
    order = [c for c in run["scaler_calls"] if c in ("scale", "step", "update")]
    check_equal(order, ["scale", "step", "update"], f"{what}: the order of the scaler calls",
                "scale(loss) before backward, then step(optimizer), then update()")
    check_close(torch.tensor(run["scale"]), torch.tensor(ref["scale"]), f"{what}: the scale after the step",
                "call scaler.update() exactly once per step", atol=0, rtol=0)
    if run["case"].get("factor") is not None:  # the overflow step: nothing moves
        _check_updates(run, SKIP_HINT.replace("must be skipped entirely", "must be skipped: let "
                                              "scaler.step(optimizer) decide, never call optimizer.step() yourself"))


def _check_step_returns(run: dict) -> None:
    what, out, ref = run["what"], run["out"], run["ref"]
    if not isinstance(out, float):
        raise AssertionError(f"{what}: returned a {type(out).__name__}, expected the loss as a Python float "
                             "(loss.item())")
    if math.isinf(ref["loss"]):
        if not math.isinf(out):
            raise AssertionError(f"{what}: returned {out}, but this batch's loss is {ref['loss']}: return the loss "
                                 "as it is, even when the scaler skips the step")
    else:
        check_close(torch.tensor(out), torch.tensor(ref["loss"]), f"{what}: the returned loss",
                    "return the loss of this batch before scaling (loss.item(), not scaler.scale(loss)), computed "
                    "once, before the optimizer step", **STEP_TOL)


STEP_CASES = [
    dict(seed=1, dtype=torch.float16, init_scale=1024.0, opt="sgd", loss="ce"),
    dict(seed=2, dtype=torch.bfloat16, init_scale=None, opt="sgd", loss="mse"),
    dict(seed=3, dtype=torch.bfloat16, init_scale=65536.0, opt="adam", loss="ce"),
    dict(seed=4, dtype=torch.float16, init_scale=4096.0, opt="adam", loss="mse", factor=float("inf")),
]


@hidden_test("test_mixed_precision_step")
def check_mixed_precision_step(nb):
    for case in STEP_CASES[:3]:
        _check_step_values(_step_run(nb, case))


@hidden_test("test_mixed_precision_step_scaler")
def check_mixed_precision_step_scaler(nb):
    for case in STEP_CASES:
        if case["init_scale"] is not None:
            _check_step_scaler(_step_run(nb, case))


@hidden_test("test_mixed_precision_step_returns")
def check_mixed_precision_step_returns(nb):
    # Without the canary terms: the returned value is graded on its own, wherever autocast ran.
    for case in STEP_CASES:
        _check_step_returns(_step_run(nb, dict(case, plain=True)))
