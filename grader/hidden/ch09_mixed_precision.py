"""Hidden tests of ch09_mixed_precision: ``GradScaler`` and ``mixed_precision_step``.

GradScaler: one trusted driver (``probes.ch09_drive_scaler``) runs the same training steps, with
overflows injected as inf/-inf/NaN written into a gradient, once in the student's process with the
student's scaler and once here with ``torch.amp.GradScaler("cpu")``, the reference. Scales after every
``step`` and ``update``, gradients after unscaling, parameters and optimizer state (momentum buffers,
Adam step counts) are compared step by step.

The driver reads the parameters the judge sent with the optimizer (one message), not
``optimizer.param_groups``, and ends with one more ``scale(loss).backward()`` so that the scale the
last ``update()`` left is seen in gradient values, not only through ``get_scale()``.

mixed_precision_step: the reference is computed here with the same autocast, the same float32 model and
``torch.amp.GradScaler``. Recorders (autocast state and dtypes during forward, calls on the scaler, on
the loss) give feedback; what decides is in values the judge compares: the model and the loss carry
canary terms whose values depend on the precision they ran in (float32, float16 or bfloat16 autocast),
so a forward or a loss outside autocast, or in the wrong dtype, changes the loss and every update;
parameters and optimizer state are read from the tensors the judge sent, the scale with torch's own
``GradScaler.get_scale`` on the scaler the judge sent.
"""
from __future__ import annotations

import copy
import math
import random

import torch
from torch import nn

from coursekit.checks import check_close, check_equal, same_close
from grader import probes
from grader.api import fetch, hidden_test
from grader.source_policy import Shortcut, SourcePolicy

# The GradScaler exercise is compared with torch.amp.GradScaler: wrapping or calling it is not an answer.
SOURCE_POLICY = SourcePolicy(shortcuts=(
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
             "count as overflow): do not call "
             "optimizer.step() at all (zeroing the gradients and stepping still moves momentum and Adam state)")
GROWTH_HINT = ("update(): on overflow multiply the scale by backoff_factor and reset the count of clean steps; "
               "otherwise add one clean step and, when the count reaches growth_interval, multiply by "
               "growth_factor and reset the count")
UNSCALE_HINT = "unscale_ multiplies every .grad by 1/S, once per iteration: step() must not unscale again"


def _model(seed: int) -> nn.Module:
    """Two layers, an unused parameter (its .grad stays None) and a frozen one in the optimizer."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(7, 11), nn.Tanh(), nn.Linear(11, 5))
        model.register_parameter("unused", nn.Parameter(torch.randn(3)))
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


def _run(nb, scenario: dict):
    """(student records, reference records)."""
    g = torch.Generator().manual_seed(scenario["seed"])
    x = torch.randn(13, 7, generator=g)
    y = torch.randn(13, 5, generator=g) * scenario.get("target_scale", 1.0)
    kwargs = dict(init_scale=scenario["init_scale"], growth_factor=scenario.get("growth_factor", 2.0),
                  backoff_factor=scenario.get("backoff_factor", 0.5), growth_interval=scenario["growth_interval"])
    ref_model = _model(scenario["seed"])
    ref = probes.ch09_drive_scaler(torch.amp.GradScaler("cpu", **kwargs), ref_model,
                                   _optimizer(scenario["opt"], ref_model), x, y, scenario["plan"])
    model = _model(scenario["seed"])  # a fresh copy: local runs share objects
    pair = nb.put((model, _optimizer(scenario["opt"], model), list(model.parameters())))  # one message
    got = fetch(nb.apply(probes.ch09_drive_scaler, nb.GradScaler(**kwargs), pair[0], pair[1], x, y,
                         scenario["plan"], pair[2]))
    return got, ref


def _check_scenario(nb, scenario: dict) -> None:
    got, ref = _run(nb, scenario)
    plan = scenario["plan"]
    what = (f"{scenario['name']} (GradScaler({scenario['init_scale']:g}, growth_interval="
            f"{scenario['growth_interval']}), {scenario['opt']}; steps {_fmt_plan(plan)}, X = overflow)")
    if got[0]["scale_type"] != "float":
        raise AssertionError(f"get_scale() returned a {got[0]['scale_type']}, expected a Python float")
    for step, (a, b, item) in enumerate(zip(got, ref, plan), start=1):
        at = f"{what}, step {step}"
        check_close(torch.tensor(a["scale_used"]), torch.tensor(b["scale_used"]), f"{at}: the scale used by scale()",
                    GROWTH_HINT, atol=0, rtol=1e-6)
        for i, (ga, gb) in enumerate(zip(a["raw_grads"], b["raw_grads"])):
            if (ga is None) != (gb is None):
                raise AssertionError(f"{at}: parameter {i} has {'no' if ga is None else 'a'} gradient after "
                                     "scale(loss).backward(); scale() must return loss * S, still attached to the graph")
            if gb is not None and torch.isfinite(gb).all():
                check_close(ga, gb, f"{at}: the scaled gradient of parameter {i}",
                            "scale(loss) is loss * S: backward then gives S times the gradient", **TOL)
        if item["unscale"]:
            for i, (ga, gb) in enumerate(zip(a["unscaled_grads"], b["unscaled_grads"])):
                if gb is not None and torch.isfinite(gb).all():
                    check_close(ga, gb, f"{at}: parameter {i}'s gradient after unscale_", UNSCALE_HINT, **TOL)
            if item.get("twice"):
                names = a["second_unscale"]
                if names is None or "RuntimeError" not in names:
                    got_txt = "returned normally" if names is None else f"raised {names[0]}"
                    raise AssertionError(f"{at}: a second unscale_(optimizer) before update() {got_txt}; it must "
                                         "raise RuntimeError (torch does), or gradients get divided by S twice")
        overflow = any(gb is not None and not torch.isfinite(gb).all() for gb in b["raw_grads"])
        if not overflow:
            for i, (ga, gb) in enumerate(zip(a["grads_after_step"], b["grads_after_step"])):
                if gb is not None:
                    check_close(ga, gb, f"{at}: parameter {i}'s gradient after step()",
                                UNSCALE_HINT + (" (unscale_ was called explicitly before step here)"
                                                if item["unscale"] else ""), **TOL)
        check_close(torch.tensor(a["scale_after_step"]), torch.tensor(b["scale_after_step"]),
                    f"{at}: the scale between step() and update()",
                    "step() does not change the scale: update() does, once per iteration", atol=0, rtol=1e-6)
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
        check_close(torch.tensor(a["scale"]), torch.tensor(b["scale"]), f"{at}: the scale after update()",
                    GROWTH_HINT + " (an inf and a NaN both count as overflow)", atol=0, rtol=1e-6)
    for i, (ga, gb) in enumerate(zip(got[-1]["final_raw_grads"], ref[-1]["final_raw_grads"])):
        if gb is not None and torch.isfinite(gb).all():
            if ga is None:
                raise AssertionError(f"{what}, after the last step: parameter {i} has no gradient after "
                                     "scale(loss).backward()")
            check_close(ga, gb, f"{what}, after the last step: the gradient of scale(loss).backward() for "
                        f"parameter {i}", "scale() multiplies by the scale update() left: " + GROWTH_HINT, **TOL)


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


@hidden_test("test_GradScaler")
def check_grad_scaler(nb):
    _check_scale_dtypes(nb)
    # (parameter index, numel) of the parameters that get a gradient: 0 is unused, 2 is frozen.
    with_grad = [(1, 77), (3, 55), (4, 5)]
    hand = [{"poison": None, "unscale": False}] * 3 + [{"poison": [1, 3, float("nan")], "unscale": False}] + \
           [{"poison": None, "unscale": i == 1, "twice": i == 1} for i in range(2)] + \
           [{"poison": [3, 0, float("inf")], "unscale": True}] + [{"poison": None, "unscale": False}] * 7 + \
           [{"poison": [4, 4, float("-inf")], "unscale": False}, {"poison": [1, 0, float("nan")], "unscale": True}] + \
           [{"poison": None, "unscale": i % 2 == 0} for i in range(4)]
    scenarios = [
        dict(name="fixed sequence", seed=1, init_scale=1024.0, growth_interval=3, opt="sgd", plan=hand),
        dict(name="random sequence", seed=2, init_scale=65536.0, growth_interval=3, opt="adam",
             plan=_plan(2, 30, 0.3, with_grad)),
        dict(name="random sequence", seed=3, init_scale=512.0, growth_interval=2, growth_factor=4.0,
             backoff_factor=0.25, opt="sgd", plan=_plan(3, 24, 0.4, with_grad)),
        dict(name="real overflow from a huge scale", seed=4, init_scale=2.0 ** 127, growth_interval=2, opt="adam",
             target_scale=300.0, plan=[{"poison": None, "unscale": False}] * 16),
    ]
    for scenario in scenarios:
        _check_scenario(nb, scenario)


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


def _check_step(nb, case: dict) -> None:
    dtype = case["dtype"]
    what = (f"mixed_precision_step with dtype={dtype}, {case['opt']}, "
            + ("scaler=None" if case["init_scale"] is None else f"a GradScaler at scale {case['init_scale']:g}")
            + (f", a loss multiplied by {case['factor']}" if case.get("factor") is not None else ""))
    ref = _reference_step(case)
    bundle = _bundle(case)
    names = [f"model.{n}" for n, _ in bundle[0].model.named_parameters()]
    # One message: the optimizer keeps pointing at this model's parameters, and the judge keeps those
    # tensors and the torch GradScaler inside the recorder, whatever the student's code reassigns.
    b = nb.put((*bundle, list(bundle[0].model.parameters()), None if bundle[2] is None else bundle[2].scaler))
    out = fetch(nb.mixed_precision_step(b[0], b[1], b[2], b[3], b[4], b[5], dtype))
    calls = fetch(b[0].calls)
    loss_calls = fetch(b[5].calls)
    table = dict(zip(names, fetch(nb.apply(probes.tensor_states, b[6]))))
    state = fetch(nb.apply(probes.ch09_optimizer_state, b[1], b[6]))

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
    for name, row in table.items():
        if row["value"].dtype != torch.float32:
            raise AssertionError(f"{what}: parameter {name} is {row['value'].dtype} after the step; the master "
                                 "weights must stay float32")
    if not isinstance(out, float):
        raise AssertionError(f"{what}: returned a {type(out).__name__}, expected the loss as a Python float "
                             "(loss.item())")
    if math.isinf(ref["loss"]):
        if not math.isinf(out):
            raise AssertionError(f"{what}: returned {out}, but this batch's loss is {ref['loss']}")
    else:
        check_close(torch.tensor(out), torch.tensor(ref["loss"]), f"{what}: the returned loss",
                    "return the loss before scaling, computed under autocast (forward and loss_fn inside it)",
                    **STEP_TOL)
    if case["init_scale"] is not None:
        scaler_calls = fetch(b[2].calls)
        counted = {k: scaler_calls.count(k) for k in ("scale", "step", "update")}
        check_equal(counted, {"scale": 1, "step": 1, "update": 1}, f"{what}: calls on the scaler",
                    "per step: scaler.scale(loss).backward(), scaler.step(optimizer), scaler.update(), once each")
        order = [c for c in scaler_calls if c in ("scale", "step", "update")]
        check_equal(order, ["scale", "step", "update"], f"{what}: the order of the scaler calls")
        check_close(torch.tensor(fetch(nb.apply(probes.ch09_scale_of, b[7]))), torch.tensor(ref["scale"]),
                    f"{what}: the scale after "
                    "the step", "call scaler.update() exactly once per step", atol=0, rtol=0)
    skipped = case.get("factor") is not None
    hint = (SKIP_HINT.replace("must be skipped entirely", "must be skipped: let scaler.step(optimizer) decide")
            if skipped else "zero the gradients first (they hold stale values), run forward and loss under "
            "autocast, back-propagate scaler.scale(loss) and call scaler.step(optimizer)")
    for name, p in ref["params"].items():
        _close_scaled(table[f"model.{name}"]["value"] - ref["before"][name], p - ref["before"][name],
                      f"{what}: the update of parameter {name}", hint)
    check_equal(sorted(state), sorted(ref["state"]), f"{what}: the parameters with optimizer state")
    for p_name, st in ref["state"].items():
        for key, vb in st.items():
            if isinstance(vb, torch.Tensor):
                _close_scaled(state[p_name][key], vb, f"{what}: optimizer state {key!r} of parameter {p_name[1:]}",
                              hint)


@hidden_test("test_mixed_precision_step")
def check_mixed_precision_step(nb):
    cases = [
        dict(seed=1, dtype=torch.float16, init_scale=1024.0, opt="sgd", loss="ce"),
        dict(seed=2, dtype=torch.bfloat16, init_scale=None, opt="sgd", loss="mse"),
        dict(seed=3, dtype=torch.bfloat16, init_scale=65536.0, opt="adam", loss="ce"),
        dict(seed=4, dtype=torch.float16, init_scale=4096.0, opt="adam", loss="mse", factor=float("inf")),
    ]
    for case in cases:
        _check_step(nb, case)
