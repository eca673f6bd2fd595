"""Hidden tests of chapter 1 (LoRA and adapters).

Every reference below is the naive math written out with plain autograd, computed here from
values fetched from the student's objects (A is random, so it is read back, never assumed).
Non-zero LoRA B and adapter ``up`` weights are set with ``load_state_dict(..., strict=False)``,
an ordinary method call on the student's module.

What trains is decided by behaviour, never by what the module reports about itself: the judge sends
the pretrained layer together with its own weight and bias tensors, drives SGD steps with weight
decay on every tensor that would train (``probes.ch01_sgd_steps``: the leaves of the output's
autograd graph, plus the sent tensors and the contract's ``lora_A``/``lora_B`` when they require
grad or received a gradient), and compares each step's output, the final ``lora_A``/``lora_B`` and
the untouched base tensors with its own frozen-base reference. A ``named_parameters`` that hides a
trainable base, or a gradient zeroed by a hook, changes nothing there.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from coursekit.checks import check_close, check_equal
from grader import probes
from grader.api import fetch, hidden_test

SCALE_HINT = "is the low-rank update scaled by alpha / rank (not alpha)?"
FROZEN_HINT = ("the pretrained layer must stay frozen: set requires_grad=False on base.weight and base.bias, "
               "so that only lora_A and lora_B train")
# Loose enough for float32 reassociation (e.g. x (W0 + sBA)^T vs x W0^T + s (x A^T) B^T), far
# tighter than any of the mistakes we look for (a factor alpha or rank, a missing term).
TOL = dict(atol=1e-5, rtol=1e-4)


def _linear(n_in: int, n_out: int, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(n_in, n_out)


def _randn(*shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _lora_reference(x, W0, b0, A, B, s, g) -> dict:
    """y = x W0^T + b0 + s (x A^T) B^T with plain autograd; gradients for x, A, B under g."""
    x, A, B = (t.detach().double().requires_grad_(True) for t in (x, A, B))
    y = x @ W0.double().T + b0.double() + s * (x @ A.T) @ B.T
    y.backward(g.double())
    return {"y": y.detach().float(), "dx": x.grad.float(), "dA": A.grad.float(), "dB": B.grad.float()}


# Judge-driven training: enough steps for A to move once B is non-zero; weight decay moves any tensor
# that requires grad, even one whose gradient is zeroed.
TRAIN = dict(steps=3, lr=0.05, weight_decay=0.1)


def _sgd_reference(x, W0, b0, A, B, s, g) -> list[torch.Tensor]:
    """The outputs of TRAIN["steps"] SGD steps (with weight decay) on A and B only, base frozen; then A, B."""
    A, B = A.double().clone(), B.double().clone()
    outputs = []
    for _ in range(TRAIN["steps"]):
        A.requires_grad_(True)
        B.requires_grad_(True)
        y = x.double() @ W0.double().T + b0.double() + s * (x.double() @ A.T) @ B.T
        dA, dB = torch.autograd.grad(y, (A, B), g.double())
        with torch.no_grad():
            A = A - TRAIN["lr"] * (dA + TRAIN["weight_decay"] * A)
            B = B - TRAIN["lr"] * (dB + TRAIN["weight_decay"] * B)
        outputs.append(y.detach().float())
    return outputs + [A.float(), B.float()]


def _check_training(nb, rank: int, alpha: float, lead: tuple, seed: int) -> None:
    """A fresh LoRALinear trained by the judge: only lora_A and lora_B may move."""
    base = _linear(37, 53, seed)
    W0, b0 = base.weight.detach().clone(), base.bias.detach().clone()
    sent = nb.put((base, [base.weight, base.bias]))  # one message: the tensors are the layer's own
    layer = nb.LoRALinear(sent[0], rank, alpha)
    A, B = fetch(layer.lora_A), fetch(layer.lora_B)
    named = {"base.weight": sent[1][0], "base.bias": sent[1][1], "lora_A": layer.lora_A, "lora_B": layer.lora_B}
    x = _randn(*lead, 37, seed=70 + seed)
    g = _randn(*lead, 53, seed=80 + seed)
    run = fetch(nb.apply(probes.ch01_sgd_steps, layer, named, x, g, **TRAIN))
    what = f"LoRALinear(base, {rank}, {alpha:g}) trained by {TRAIN['steps']} SGD steps with weight decay"
    if "error" in run:
        raise AssertionError(f"{what}: {run['error']}")
    for step, names in enumerate(run["updated"], start=1):
        wrong = [n for n in names if n not in ("lora_A", "lora_B")]
        if wrong:
            raise AssertionError(f"{what}: at step {step} the tensors that train are {names}: "
                                 f"{', '.join(wrong)} should not ('?' is a tensor that is neither the given layer's "
                                 f"nor lora_A/lora_B). {FROZEN_HINT}")
    *outputs, A_ref, B_ref = _sgd_reference(x, W0, b0, A, B, alpha / rank, g)
    for step, (got, ref) in enumerate(zip(run["outputs"], outputs), start=1):
        check_close(got, ref, f"{what}: the output at step {step}",
                    f"only lora_A and lora_B may train, through base(x) + (alpha / rank) * (x @ A.T) @ B.T; "
                    f"{FROZEN_HINT}", **TOL)
    after = fetch(nb.apply(probes.tensor_states, sent[1]))
    for (name, value), row in zip((("base.weight", W0), ("base.bias", b0)), after):
        check_close(row["value"], value, f"{what}: the given layer's {name}", FROZEN_HINT, atol=0, rtol=0)
    check_close(fetch(layer.lora_A), A_ref, f"{what}: lora_A after the steps",
                "lora_A must be the registered parameter used in forward", **TOL)
    check_close(fetch(layer.lora_B), B_ref, f"{what}: lora_B after the steps",
                "lora_B must be the registered parameter used in forward", **TOL)


def _raises_value_error(nb, *args) -> bool:
    names = fetch(nb.apply(probes.raised, nb.LoRALinear, *args))
    return names is not None and "ValueError" in names


@hidden_test("test_lora_linear")
def check_lora_linear(nb):
    for rank, alpha, lead, seed in ((4, 8.0, (2, 3), 1), (3, 1.5, (5,), 2)):
        s = alpha / rank
        base = _linear(37, 53, seed)
        W0, b0 = base.weight.detach().clone(), base.bias.detach().clone()
        layer = nb.LoRALinear(base, rank, alpha)

        # --- parameters: names, shapes, what trains ----------------------------------------
        table = fetch(nb.apply(probes.param_table, layer))
        for name, shape in (("lora_A", [rank, 37]), ("lora_B", [53, rank]), ("base.weight", [53, 37]),
                            ("base.bias", [53])):
            if name not in table:
                raise AssertionError(f"LoRALinear has no parameter {name!r} (it has {sorted(table)}): "
                                     "keep the given layer as self.base and register lora_A, lora_B as nn.Parameter")
            check_equal(table[name]["shape"], shape, f"the shape of {name}",
                        "lora_A is (rank, in_features) and lora_B is (out_features, rank)")
        for name in ("base.weight", "base.bias"):
            if table[name]["requires_grad"]:
                raise AssertionError(f"{name} has requires_grad=True: {FROZEN_HINT}")
        trainable = sorted(n for n, row in table.items() if row["requires_grad"])
        check_equal(trainable, ["lora_A", "lora_B"], "the trainable parameters", FROZEN_HINT)
        check_close(table["base.weight"]["value"], W0, "base.weight",
                    "wrap the layer you are given (self.base = base), do not create a new one", atol=0, rtol=0)
        A, B = table["lora_A"]["value"], table["lora_B"]["value"]
        if B.abs().max() != 0:
            raise AssertionError("lora_B is not zero at initialisation: with B = 0 the adapted layer starts "
                                 "exactly equal to the pretrained one")
        if A.abs().max() == 0 or A.std() == 0:
            raise AssertionError("lora_A is constant at initialisation: if A and B both start at zero (or A "
                                 "has no randomness), no gradient ever reaches them; initialise A randomly "
                                 "(e.g. Kaiming-uniform)")
        got_s = float(fetch(layer.scaling))
        if abs(got_s - s) > 1e-12 * max(1.0, abs(s)):
            raise AssertionError(f"scaling is {got_s:g}, expected alpha / rank = {alpha:g} / {rank} = {s:g}. "
                                 f"{SCALE_HINT}")

        # --- at initialisation: the base layer's output; only B gets a gradient ---------------
        x = _randn(*lead, 37, seed=10 + seed)
        g = _randn(*lead, 53, seed=20 + seed)
        out = fetch(nb.apply(probes.forward_backward, layer, x, g))
        ref = _lora_reference(x, W0, b0, A, B, s, g)
        check_close(out["y"], ref["y"], "the output at initialisation",
                    "with lora_B = 0 the layer must return base(x) for any leading dimensions", **TOL)
        for name in ("base.weight", "base.bias"):
            if out["grads"].get(name) is not None:
                raise AssertionError(f"{name} received a gradient: {FROZEN_HINT}")
        check_close(out["grads"]["lora_B"], ref["dB"], "the gradient of lora_B at initialisation", SCALE_HINT, **TOL)
        check_close(out["grads"]["lora_A"], ref["dA"], "the gradient of lora_A at initialisation",
                    "with lora_B = 0, no gradient reaches lora_A in the first step", **TOL)
        fetch(layer.zero_grad())  # forward_backward accumulates into .grad

        # --- after training has moved B: output and every gradient --------------------------
        B1 = _randn(53, rank, seed=30 + seed, scale=0.5)
        fetch(layer.load_state_dict({"lora_B": B1}, strict=False))
        B = fetch(layer.lora_B)
        check_close(B, B1, "lora_B after load_state_dict", "lora_B must be the registered parameter used in forward",
                    atol=0, rtol=0)
        x = _randn(*lead, 37, seed=40 + seed)
        g = _randn(*lead, 53, seed=50 + seed)
        out = fetch(nb.apply(probes.forward_backward, layer, x, g))
        ref = _lora_reference(x, W0, b0, A, B, s, g)
        check_close(out["y"], ref["y"], "the output with a non-zero lora_B",
                    f"expected base(x) + (alpha / rank) * (x @ A.T) @ B.T; {SCALE_HINT}", **TOL)
        check_close(out["dx"], ref["dx"], "the gradient of the input", SCALE_HINT, **TOL)
        check_close(out["grads"]["lora_A"], ref["dA"], "the gradient of lora_A", SCALE_HINT, **TOL)
        check_close(out["grads"]["lora_B"], ref["dB"], "the gradient of lora_B", SCALE_HINT, **TOL)

        # --- merge: a new nn.Linear with W0 + s B A, same bias, base untouched ----------------
        merged = layer.merge()
        kinds = fetch(nb.apply(probes.type_names, merged))
        if "torch.nn.modules.linear.Linear" not in kinds:
            raise AssertionError(f"merge() returned a {kinds[0]}, expected an nn.Linear (a single layer, no extra "
                                 "latency at inference)")
        if "LoRALinear" in " ".join(kinds):
            raise AssertionError("merge() returned a LoRALinear: it should return a plain nn.Linear")
        check_close(fetch(layer.base.weight), W0, "base.weight after merge()",
                    "merge() must build a new layer and leave the frozen base weight unchanged", atol=0, rtol=0)
        check_close(fetch(layer.base.bias), b0, "base.bias after merge()",
                    "merge() must build a new layer and leave the frozen base bias unchanged", atol=0, rtol=0)
        W_expected = (W0.double() + s * B.double() @ A.double()).float()
        check_close(fetch(merged.weight), W_expected, "the merged weight",
                    "merged weight = W0 + (alpha / rank) * B @ A: did merge() forget the scaling?", **TOL)
        check_close(fetch(merged.bias), b0, "the merged bias", "the merged layer keeps the base layer's bias", **TOL)
        x = _randn(*lead, 37, seed=60 + seed)
        y_layer, y_merged = fetch(layer(x)), fetch(merged(x))
        check_close(y_merged, y_layer, "merged(x) vs the LoRA layer's output",
                    "merging must not change what the layer computes", **TOL)

        _check_training(nb, rank, alpha, lead, seed)

    # --- bad ranks are refused -------------------------------------------------------------
    for bad in (0, -2, 2.5):
        if not _raises_value_error(nb, _linear(37, 53, 0), bad, 1.0):
            raise AssertionError(f"LoRALinear(base, rank={bad!r}, alpha=1.0) should raise ValueError: "
                                 "the rank must be a positive integer")


def _toy_model() -> nn.ModuleDict:
    """A transformer-like tree of standard modules (so it can be copied into any process)."""
    torch.manual_seed(7)

    def block():
        return nn.ModuleDict({
            "ln": nn.LayerNorm(12),
            "attn": nn.ModuleDict({"qkv": nn.Linear(12, 36), "proj": nn.Linear(12, 12)}),
            "mlp": nn.ModuleDict({"fc1": nn.Linear(12, 48), "act": nn.GELU(), "fc2": nn.Linear(48, 12)}),
        })

    return nn.ModuleDict({
        "embed": nn.Embedding(10, 12),
        "blocks": nn.ModuleList([block(), block()]),
        "conv": nn.ModuleDict({"qkv": nn.Conv1d(12, 12, 1)}),  # named like a target, but not an nn.Linear
        "fc1": nn.Linear(12, 7),  # the whole qualified name is a target
        "head": nn.Linear(12, 10),
    })


@hidden_test("test_apply_lora")
def check_apply_lora(nb):
    rank, alpha, targets = 3, 6.0, ("qkv", "fc1")
    model = _toy_model()
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    wanted = sorted(n for n in linears if n == "fc1" or n.endswith((".qkv", ".fc1")))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    layers = {n: m for n, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))}

    sent = nb.put((model, list(model.parameters())))  # one message: the tensors are the model's own
    result = nb.apply_lora(sent[0], rank, alpha, targets)
    kinds = fetch(nb.apply(probes.module_table, result))

    def is_lora(name: str) -> bool:
        return any(k.endswith("LoRALinear") for k in kinds.get(name, []))

    replaced = sorted(n for n in kinds if is_lora(n))
    check_equal(replaced, wanted, "the layers replaced by LoRALinear",
                f"replace exactly the nn.Linear layers whose qualified name ends with one of {targets} "
                "(not the head, not other Linears, not modules of other types)")
    for name in wanted:
        if "torch.nn.modules.linear.Linear" not in kinds.get(f"{name}.base", []):
            raise AssertionError(f"{name}.base should be the original nn.Linear wrapped by LoRALinear")
    if "torch.nn.modules.conv.Conv1d" not in kinds.get("conv.qkv", []):
        raise AssertionError("conv.qkv (an nn.Conv1d) was replaced: only nn.Linear layers get LoRA")

    table = fetch(nb.apply(probes.param_table, result))
    expected_trainable = sorted(f"{n}.lora_{ab}" for n in wanted for ab in "AB")
    trainable = sorted(n for n, row in table.items() if row["requires_grad"])
    check_equal(trainable, expected_trainable, "the trainable parameters after apply_lora",
                "freeze every parameter of the model except the new lora_A and lora_B")
    for name in wanted:
        check_equal(table[f"{name}.lora_A"]["shape"], [rank, linears[name].in_features], f"{name}.lora_A's shape",
                    "pass rank on to LoRALinear")
    n_trainable = sum(torch.Size(table[n]["shape"]).numel() for n in trainable)
    n_expected = sum(rank * (linears[n].in_features + linears[n].out_features) for n in wanted)
    check_equal(n_trainable, n_expected, "the number of trainable parameters",
                "each replaced layer adds rank * (in_features + out_features) parameters")
    for name, value in before.items():
        owner, _, leaf = name.rpartition(".")
        name_now = f"{owner}.base.{leaf}" if owner in wanted else name  # wrapped layers keep theirs in .base
        if name_now not in table:
            raise AssertionError(f"parameter {name_now} is missing after apply_lora")
        check_close(table[name_now]["value"], value, name_now, "apply_lora must not change pretrained weights",
                    atol=0, rtol=0)
    got_s = float(fetch(result.fc1.scaling))
    if abs(got_s - alpha / rank) > 1e-12:
        raise AssertionError(f"fc1.scaling is {got_s:g}, expected alpha / rank = {alpha / rank:g}: "
                             "pass rank and alpha on to LoRALinear")
    _check_what_trains(nb, result, layers, sent[1], wanted, before)


def _layer_input(module: nn.Module, seed: int) -> torch.Tensor:
    if isinstance(module, nn.Embedding):
        return torch.randint(0, module.num_embeddings, (2, 3), generator=torch.Generator().manual_seed(seed))
    if isinstance(module, nn.Conv1d):
        return _randn(2, module.in_channels, 5, seed=seed)
    width = module.in_features if isinstance(module, nn.Linear) else module.normalized_shape[0]
    return _randn(2, 3, width, seed=seed)


def _check_what_trains(nb, result, layers: dict, tensors, wanted: list, before: dict) -> None:
    """Every layer of the original model, reached by its path in the returned model, trained for one SGD
    step by the judge: only the new lora_A and lora_B of the replaced layers may move."""
    named = {name: tensors[i] for i, name in enumerate(before)}  # handles: indexed, not iterated
    for i, (path, original) in enumerate(layers.items()):
        handle = result
        for part in path.split("."):
            handle = getattr(handle, part)
        x = _layer_input(original, seed=90 + i)
        with torch.no_grad():
            y = original(x)
        mine = {n: t for n, t in named.items() if n.rpartition(".")[0] == path}  # this layer's own tensors
        if path in wanted:
            mine.update({f"{path}.lora_A": handle.lora_A, f"{path}.lora_B": handle.lora_B})
        run = fetch(nb.apply(probes.ch01_sgd_steps, handle, mine, x, _randn(*y.shape, seed=120 + i), steps=1,
                             lr=TRAIN["lr"], weight_decay=TRAIN["weight_decay"]))
        what = f"one SGD step on {path} of the model apply_lora returned"
        if "error" in run:
            raise AssertionError(f"{what}: {run['error']}")
        expected = [f"{path}.lora_A", f"{path}.lora_B"] if path in wanted else []
        check_equal(run["updated"][0], expected, f"{what}: the list of tensors that train",
                    "freeze every parameter of the model except the new lora_A and lora_B "
                    "('?' is a tensor the model did not have before)")
        check_close(run["outputs"][0], y, f"{what}: its output",
                    "apply_lora must not change what the model computes (lora_B starts at zero)", **TOL)
    after = fetch(nb.apply(probes.tensor_states, tensors))
    for (name, value), row in zip(before.items(), after):
        check_close(row["value"], value, f"the original {name} after training steps",
                    "freeze every parameter of the model except the new lora_A and lora_B", atol=0, rtol=0)


def _adapter_reference(x, Wd, bd, Wu, bu, g) -> dict:
    """x + up(GELU(down(x))) with plain autograd; gradients under g."""
    x, Wd, bd, Wu, bu = (t.detach().double().requires_grad_(True) for t in (x, Wd, bd, Wu, bu))
    y = x + F.gelu(x @ Wd.T + bd) @ Wu.T + bu
    y.backward(g.double())
    return {"y": y.detach().float(), "dx": x.grad.float(), "down.weight": Wd.grad.float(),
            "down.bias": bd.grad.float(), "up.weight": Wu.grad.float(), "up.bias": bu.grad.float()}


@hidden_test("test_adapter")
def check_adapter(nb):
    dim, bottleneck, lead = 37, 5, (2, 3)
    torch.manual_seed(3)
    adapter = nb.Adapter(dim, bottleneck)
    table = fetch(nb.apply(probes.param_table, adapter))
    for name, shape in (("down.weight", [bottleneck, dim]), ("down.bias", [bottleneck]),
                        ("up.weight", [dim, bottleneck]), ("up.bias", [dim])):
        if name not in table:
            raise AssertionError(f"Adapter has no parameter {name!r} (it has {sorted(table)}): "
                                 "use two nn.Linear layers called down and up")
        check_equal(table[name]["shape"], shape, f"the shape of {name}",
                    "down maps dim -> bottleneck and up maps bottleneck -> dim")
        if not table[name]["requires_grad"]:
            raise AssertionError(f"{name} is frozen: the adapter's own parameters are the ones that train")
    for name in ("up.weight", "up.bias"):
        if table[name]["value"].abs().max() != 0:
            raise AssertionError(f"{name} is not zero at initialisation: zero-initialise up (weight and bias) so "
                                 "that the adapter starts as the identity and the pretrained model is unchanged")
    if table["down.weight"]["value"].std() == 0:
        raise AssertionError("down.weight is constant: keep nn.Linear's random initialisation for down")
    p = {n: row["value"] for n, row in table.items()}

    x = _randn(*lead, dim, seed=11)
    g = _randn(*lead, dim, seed=12)
    out = fetch(nb.apply(probes.forward_backward, adapter, x, g))
    check_close(out["y"], x, "the output at initialisation",
                "a fresh adapter must be the identity: x + up(GELU(down(x))) with up = 0 "
                "(did you keep the residual x?)",
                **TOL)
    check_close(out["dx"], g, "the input gradient at initialisation",
                "at initialisation the gradient flows through the residual unchanged", **TOL)
    ref = _adapter_reference(x, p["down.weight"], p["down.bias"], p["up.weight"], p["up.bias"], g)
    for name in ("up.weight", "up.bias", "down.weight"):
        check_close(out["grads"][name], ref[name], f"the gradient of {name} at initialisation",
                    "is the non-linearity GELU (nn.GELU(), exact) applied between down and up?", **TOL)
    fetch(adapter.zero_grad())

    fetch(adapter.load_state_dict({"up.weight": _randn(dim, bottleneck, seed=13, scale=0.3),
                                   "up.bias": _randn(dim, seed=14, scale=0.3)}, strict=False))
    p = {n: row["value"] for n, row in fetch(nb.apply(probes.param_table, adapter)).items()}
    x = _randn(*lead, dim, seed=15)
    g = _randn(*lead, dim, seed=16)
    out = fetch(nb.apply(probes.forward_backward, adapter, x, g))
    ref = _adapter_reference(x, p["down.weight"], p["down.bias"], p["up.weight"], p["up.bias"], g)
    hint = "expected x + up(GELU(down(x))): a residual around a bottleneck with an exact GELU"
    check_close(out["y"], ref["y"], "the output after training moved up", hint, **TOL)
    check_close(out["dx"], ref["dx"], "the gradient of the input", hint, **TOL)
    for name in ("down.weight", "down.bias", "up.weight", "up.bias"):
        check_close(out["grads"][name], ref[name], f"the gradient of {name}", hint, **TOL)
