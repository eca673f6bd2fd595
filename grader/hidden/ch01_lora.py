"""Hidden tests of chapter 1 (LoRA and adapters), by property, one graded cell each.

LoRALinear
- values (``test_lora_linear``): parameter names and shapes, lora_B zero and lora_A not constant at
  initialisation, ``scaling``, the output and the gradients of x, lora_A and lora_B against a float64
  reference, at initialisation and with a non-zero lora_B; three judge-driven SGD steps on lora_A and
  lora_B alone match the reference step for step.
- frozen: the base's weight and bias do not require grad and get no gradient; three SGD steps with
  weight decay, driven by the judge on every tensor that would train, update lora_A and lora_B only,
  leave the given tensors bit for bit, and give the outputs of the same layer trained on lora_A and
  lora_B alone (the student's own forward is the reference: a wrong forward costs nothing here).
- merge: a new nn.Linear holding W0 + scaling · B A (with the layer's own ``scaling`` and base) and the
  base bias, computing that function; the base bit for bit unchanged.
- errors: ranks 1 and 4 accepted; 0, -2, 2.5 and "4" raise ValueError naming the refused rank.

apply_lora
- replaced (``test_apply_lora``): on a transformer-like tree with targets ("qkv", "fc1"), exactly the
  targeted Linears are LoRALinear (each keeping the original as ``.base``), with the given rank and
  alpha; every pretrained value and every layer's output unchanged.
- frozen: the only parameters that require grad are lora_A and lora_B of the layers it replaced, and
  one judge-driven SGD step per original layer moves nothing else.
- edge cases: targets as a list with a dotted target ("attn.qkv", "fc1"): a top-level Linear named
  exactly "fc1", a Conv1d named "attn.qkv" left alone, names that merely end with the target's
  letters ("myfc1", "self_attn.qkv") left alone.

Adapter
- values (``test_adapter``): names, shapes, all four trainable; the gradients at initialisation; with a
  non-zero ``up``, the output and every gradient against a float64 reference with the exact GELU.
- init: ``up`` all zero, ``down``'s weight not constant; a fresh adapter is the identity (output x,
  input gradient g).

Every reference below is the naive math written out with plain autograd, computed here from
values fetched from the student's objects (A is random, so it is read back, never assumed).
Non-zero LoRA B and adapter ``up`` weights are set with ``load_state_dict(..., strict=False)``,
an ordinary method call on the student's module.

What trains is decided by behaviour, never by what the module reports about itself: the judge sends
the pretrained layer together with its own weight and bias tensors, drives SGD steps with weight
decay on every tensor that would train (``probes.ch01_sgd_steps``: the leaves of the output's
autograd graph, plus the sent tensors and the contract's ``lora_A``/``lora_B`` when they require
grad or received a gradient), and compares the untouched base tensors and each step's output with
a run that trains lora_A and lora_B alone. A ``named_parameters`` that hides a trainable base, or a
gradient zeroed by a hook, changes nothing there.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from coursekit.checks import check_close, check_equal, same_close
from grader import probes
from grader.api import fetch, hidden_test
from grader.sandbox.rpc import StudentError
from grader.source_policy import Shortcut, SourcePolicy

SOURCE_POLICY = SourcePolicy(shortcuts=(
    Shortcut(paths=("coursekit.capstone",),
             instead="write it yourself; coursekit.capstone (chapter 16's reference fine-tune) holds "
                     "the course's own LoRA linears"),
))

SCALE_HINT = "is the low-rank update scaled by alpha / rank (not alpha)?"
GRAD_HINT = ("the output is right but this gradient is not: compute the update with differentiable torch "
             "operations on lora_A and lora_B themselves (no .detach(), .data or torch.no_grad())")
DX_HINT = ("the output is right but the input gradient is not: dx = g (W0 + (alpha / rank) B A) flows through "
           "base(x) and through the low-rank update, so keep both differentiable in x (no .detach(), .data or "
           "torch.no_grad(); the base is frozen by requires_grad=False on its parameters, not by cutting the graph)")
FROZEN_HINT = ("the pretrained layer must stay frozen: set requires_grad=False on base.weight and base.bias, "
               "so that only lora_A and lora_B train")
NAMES_HINT = "keep the given layer as self.base and register lora_A, lora_B as nn.Parameter"
# Loose enough for float32 reassociation (e.g. x (W0 + sBA)^T vs x W0^T + s (x A^T) B^T), far
# tighter than any of the mistakes we look for (a factor alpha or rank, a missing term).
TOL = dict(atol=1e-5, rtol=1e-4)
LORA_CASES = ((4, 8.0, (2, 3), 1), (3, 1.5, (5,), 2))  # rank, alpha, leading dimensions of x, seed


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


def _lora_table(nb, layer, rank: int) -> dict:
    """The layer's parameter table, with the four contract names present."""
    table = fetch(nb.apply(probes.param_table, layer))
    for name in ("lora_A", "lora_B", "base.weight", "base.bias"):
        if name not in table:
            raise AssertionError(f"LoRALinear has no parameter {name!r} (it has {sorted(table)}): {NAMES_HINT}")
    return table


def _train(nb, layer, named: dict, x, g, graph_leaves: bool = True) -> dict:
    run = fetch(nb.apply(probes.ch01_sgd_steps, layer, named, x, g, graph_leaves=graph_leaves, **TRAIN))
    if "error" in run:
        raise AssertionError(f"LoRALinear(x): {run['error']}")
    return run


def _check_ab_training(nb, rank: int, alpha: float, lead: tuple, seed: int) -> None:
    """A fresh LoRALinear whose lora_A and lora_B alone are trained by the judge matches the reference."""
    base = _linear(37, 53, seed)
    W0, b0 = base.weight.detach().clone(), base.bias.detach().clone()
    layer = nb.LoRALinear(base, rank, alpha)
    A, B = fetch(layer.lora_A), fetch(layer.lora_B)
    x = _randn(*lead, 37, seed=70 + seed)
    g = _randn(*lead, 53, seed=80 + seed)
    run = _train(nb, layer, {"lora_A": layer.lora_A, "lora_B": layer.lora_B}, x, g, graph_leaves=False)
    what = f"LoRALinear(base, {rank}, {alpha:g}) with lora_A and lora_B trained by {TRAIN['steps']} SGD steps"
    *outputs, A_ref, B_ref = _sgd_reference(x, W0, b0, A, B, alpha / rank, g)
    for step, (got, ref) in enumerate(zip(run["outputs"], outputs), start=1):
        check_close(got, ref, f"{what}: the output at step {step}",
                    "lora_A and lora_B must be the registered parameters that forward uses: "
                    "base(x) + (alpha / rank) * (x @ A.T) @ B.T", **TOL)
    check_close(fetch(layer.lora_A), A_ref, f"{what}: lora_A after the steps",
                "lora_A must be the registered parameter used in forward", **TOL)
    check_close(fetch(layer.lora_B), B_ref, f"{what}: lora_B after the steps",
                "lora_B must be the registered parameter used in forward", **TOL)


def _check_grad(got, ref, name: str, hint: str) -> None:
    if got is None:
        raise AssertionError(f"{name} is None: no gradient reached it. It must take part in forward through "
                             "differentiable torch operations (no .detach(), .data or torch.no_grad())")
    check_close(got, ref, name, hint, **TOL)


@hidden_test("test_lora_linear")
def check_lora_linear(nb):
    """Names, shapes, initialisation, scaling, output and gradients, training of A and B."""
    for rank, alpha, lead, seed in LORA_CASES:
        s = alpha / rank
        base = _linear(37, 53, seed)
        W0, b0 = base.weight.detach().clone(), base.bias.detach().clone()
        layer = nb.LoRALinear(base, rank, alpha)

        # --- parameters: names, shapes, initialisation, scaling --------------------------------
        table = _lora_table(nb, layer, rank)
        for name, shape in (("lora_A", [rank, 37]), ("lora_B", [53, rank]), ("base.weight", [53, 37]),
                            ("base.bias", [53])):
            check_equal(table[name]["shape"], shape, f"the shape of {name}",
                        "lora_A is (rank, in_features) and lora_B is (out_features, rank)")
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
        _check_grad(out["grads"]["lora_B"], ref["dB"], "the gradient of lora_B at initialisation", SCALE_HINT)
        _check_grad(out["grads"]["lora_A"], ref["dA"], "the gradient of lora_A at initialisation",
                    "with lora_B = 0 the gradient of lora_A is zero in the first step")
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
        # The output matched: a gradient that does not is no scaling mistake.
        _check_grad(out["dx"], ref["dx"], "the gradient of the input", DX_HINT)
        _check_grad(out["grads"]["lora_A"], ref["dA"], "the gradient of lora_A", GRAD_HINT)
        _check_grad(out["grads"]["lora_B"], ref["dB"], "the gradient of lora_B", GRAD_HINT)

        _check_ab_training(nb, rank, alpha, lead, seed)


@hidden_test("test_lora_linear_frozen")
def check_lora_linear_frozen(nb):
    """Only lora_A and lora_B train, whatever the module reports about itself."""
    for rank, alpha, lead, seed in LORA_CASES:
        base = _linear(37, 53, seed)
        W0, b0 = base.weight.detach().clone(), base.bias.detach().clone()
        sent = nb.put((base, [base.weight, base.bias]))  # one message: the tensors are the layer's own
        layer = nb.LoRALinear(sent[0], rank, alpha)
        what = f"LoRALinear(base, {rank}, {alpha:g})"

        table = _lora_table(nb, layer, rank)
        for name in ("base.weight", "base.bias"):
            if table[name]["requires_grad"]:
                raise AssertionError(f"{what}: {name} has requires_grad=True: {FROZEN_HINT}")
        trainable = sorted(n for n, row in table.items() if row["requires_grad"])
        check_equal(trainable, ["lora_A", "lora_B"], f"the trainable parameters of {what}", FROZEN_HINT)
        x = _randn(*lead, 37, seed=10 + seed)
        out = fetch(nb.apply(probes.forward_backward, layer, x, _randn(*lead, 53, seed=20 + seed)))
        for name in ("base.weight", "base.bias"):
            if out["grads"].get(name) is not None:
                raise AssertionError(f"{what}: {name} received a gradient: {FROZEN_HINT}")

        # Trained by the judge on every tensor that would train, against the same layer trained on A and B only.
        trained = nb.LoRALinear(_linear(37, 53, seed), rank, alpha)
        fetch(trained.load_state_dict({"lora_A": fetch(layer.lora_A), "lora_B": fetch(layer.lora_B)}, strict=False))
        fetch(layer.zero_grad())
        named = {"base.weight": sent[1][0], "base.bias": sent[1][1], "lora_A": layer.lora_A, "lora_B": layer.lora_B}
        x = _randn(*lead, 37, seed=70 + seed)
        g = _randn(*lead, 53, seed=80 + seed)
        run = _train(nb, layer, named, x, g)
        frozen = _train(nb, trained, {"lora_A": trained.lora_A, "lora_B": trained.lora_B}, x, g, graph_leaves=False)
        what += f" trained by {TRAIN['steps']} SGD steps with weight decay"
        for step, names in enumerate(run["updated"], start=1):
            wrong = [n for n in names if n not in ("lora_A", "lora_B")]
            if wrong:
                raise AssertionError(f"{what}: at step {step} the tensors that train are {names}: "
                                     f"{', '.join(wrong)} should not ('?' is a tensor that is neither the given "
                                     f"layer's nor lora_A/lora_B). {FROZEN_HINT}")
        after = fetch(nb.apply(probes.tensor_states, sent[1]))
        for (name, value), row in zip((("base.weight", W0), ("base.bias", b0)), after):
            check_close(row["value"], value, f"{what}: the given layer's {name}", FROZEN_HINT, atol=0, rtol=0)
        for step, (got, ref) in enumerate(zip(run["outputs"], frozen["outputs"]), start=1):
            check_close(got, ref, f"{what}: the output at step {step}, against the same layer with only lora_A and "
                        f"lora_B trained", f"only lora_A and lora_B may train; {FROZEN_HINT}", **TOL)


@hidden_test("test_lora_linear_merge")
def check_lora_linear_merge(nb):
    """merge(): a new nn.Linear with W0 + scaling · B A and the base bias; the base unchanged."""
    for rank, alpha, lead, seed in LORA_CASES:
        layer = nb.LoRALinear(_linear(37, 53, seed), rank, alpha)
        fetch(layer.load_state_dict({"lora_B": _randn(53, rank, seed=30 + seed, scale=0.5)}, strict=False))
        W0, b0 = fetch(layer.base.weight), fetch(layer.base.bias)  # the layer's own base, whatever it holds
        A, B = fetch(layer.lora_A), fetch(layer.lora_B)
        try:
            s = float(fetch(layer.scaling))
        except (AttributeError, TypeError, ValueError, StudentError):  # graded in test_lora_linear
            s = alpha / rank
        merged = layer.merge()
        kinds = fetch(nb.apply(probes.type_names, merged))
        if any("LoRALinear" in k for k in kinds):
            raise AssertionError("merge() returned a LoRALinear: it should return a plain nn.Linear")
        if "torch.nn.modules.linear.Linear" not in kinds:
            raise AssertionError(f"merge() returned a {kinds[0]}, expected an nn.Linear (a single layer, no extra "
                                 "latency at inference)")
        check_close(fetch(layer.base.weight), W0, "base.weight after merge()",
                    "merge() must build a new layer and leave the frozen base weight unchanged", atol=0, rtol=0)
        check_close(fetch(layer.base.bias), b0, "base.bias after merge()",
                    "merge() must build a new layer and leave the frozen base bias unchanged", atol=0, rtol=0)
        W_expected = (W0.double() + s * B.double() @ A.double()).float()
        got_w = fetch(merged.weight)
        hint = "merged weight = W0 + scaling * lora_B @ lora_A (an (out_features, in_features) matrix)"
        if same_close(got_w, (W0.double() + B.double() @ A.double()).float(), **TOL):
            hint = "merged weight = W0 + scaling * B @ A, scaling = alpha / rank: did merge() forget the scaling?"
        elif same_close(got_w, W0, **TOL):
            hint = "the merged weight is W0 alone: add the low-rank update, W0 + scaling * B @ A"
        check_close(got_w, W_expected, f"the merged weight (scaling = {s:g})", hint, **TOL)
        merged_bias = fetch(merged.bias)
        if merged_bias is None:
            raise AssertionError("the merged layer has no bias: it keeps the base layer's bias")
        check_close(merged_bias, b0, "the merged bias", "the merged layer keeps the base layer's bias", **TOL)
        x = _randn(*lead, 37, seed=60 + seed)
        check_close(fetch(merged(x)), F.linear(x.double(), W_expected.double(), b0.double()).float(),
                    "merged(x)", "the merged layer computes x W^T + b with its merged weight and bias", **TOL)


@hidden_test("test_lora_linear_errors")
def check_lora_linear_errors(nb):
    """Positive integer ranks are accepted; anything else raises a ValueError naming it."""
    for rank in (1, 4):
        error = fetch(nb.apply(probes.raised_message, nb.LoRALinear, _linear(37, 53, 0), rank, 1.0))
        if error is not None and "ValueError" in error["types"]:
            raise AssertionError(f"LoRALinear(base, rank={rank}, alpha=1.0) raised ValueError ({error['message']}): "
                                 "every positive integer is a valid rank")
    for bad in (0, -2, 2.5, "4"):
        call = f"LoRALinear(base, rank={bad!r}, alpha=1.0)"
        error = fetch(nb.apply(probes.raised_message, nb.LoRALinear, _linear(37, 53, 0), bad, 1.0))
        if error is None:
            raise AssertionError(f"{call} returned a layer: the rank must be a positive integer, anything else "
                                 "raises ValueError")
        if "ValueError" not in error["types"]:
            hint = (" Check the type first (isinstance(rank, int)): comparing a string with a number raises "
                    "TypeError." if "TypeError" in error["types"] else "")
            raise AssertionError(f"{call} raised {error['types'][0]} ({error['message']}), expected ValueError: "
                                 f"the rank must be a positive integer.{hint}")
        if str(bad) not in error["message"]:
            raise AssertionError(f"{call} raised ValueError({error['message']!r}), which does not name the refused "
                                 "rank: say which value was refused "
                                 f"(\"rank must be a positive integer, got {bad!r}\")")


def _toy_model() -> nn.ModuleDict:
    """A transformer-like tree of standard modules (so it can be copied into any process)."""
    torch.manual_seed(7)

    def block():
        return nn.ModuleDict({
            "ln": nn.LayerNorm(12),
            "attn": nn.ModuleDict({"qkv": nn.Linear(12, 36), "proj": nn.Linear(12, 12)}),
            "mlp": nn.ModuleDict({"fc1": nn.Linear(12, 48), "act": nn.GELU(), "fc2": nn.Linear(48, 12)}),
        })

    return nn.ModuleDict({"embed": nn.Embedding(10, 12), "blocks": nn.ModuleList([block(), block()]),
                          "head": nn.Linear(12, 10)})


RANK, ALPHA, TARGETS = 3, 6.0, ("qkv", "fc1")


def _lora_apply(nb, model: nn.Module, targets, what: str):
    """Send the model with its own tensors, run apply_lora; (result, the sent model and tensors, module table)."""
    sent = nb.put((model, list(model.parameters())))  # one message: the tensors are the model's own
    try:
        result = nb.apply_lora(sent[0], RANK, ALPHA, targets)
        if result is None or fetch(nb.apply(probes.type_names, result))[0] == "builtins.NoneType":
            raise AssertionError(f"apply_lora(model, {RANK}, {ALPHA:g}, {targets!r}) on {what} returned None: "
                                 "return the model you modified in place")
        kinds = fetch(nb.apply(probes.module_table, result))
    except (StudentError, TypeError, AttributeError) as e:  # the student's own error, remote or local
        raised = f"{e.type_name}: {e.message}" if isinstance(e, StudentError) else f"{type(e).__name__}: {e}"
        hint = ""
        if "endswith" in raised:
            hint = (f" targets may be any iterable of names (here a {type(targets).__name__}), and str.endswith "
                    "takes a str or a tuple: test each target")
        elif "Conv1d" in raised:
            hint = " Only nn.Linear layers are replaced, whatever their name: test isinstance(module, nn.Linear)"
        raise AssertionError(f"apply_lora(model, {RANK}, {ALPHA:g}, {targets!r}) on {what} raised {raised}.{hint}") \
            from None
    return result, sent, kinds


def _replaced(kinds: dict) -> list[str]:
    return sorted(n for n, k in kinds.items() if any(c.endswith("LoRALinear") for c in k))


def _layers(model: nn.Module) -> dict[str, nn.Module]:
    """The modules that hold parameters of their own, by qualified name."""
    return {n: m for n, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))}


def _reach(result, path: str):
    handle = result
    for part in path.split("."):
        handle = getattr(handle, part)
    return handle


def _scaling(handle) -> float | None:
    try:
        return float(fetch(handle.scaling))
    except (AttributeError, TypeError, ValueError, StudentError):
        return None


@hidden_test("test_apply_lora")
def check_apply_lora(nb):
    """Which layers are replaced, with which rank and alpha; pretrained values and outputs unchanged."""
    model = _toy_model()
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    wanted = sorted(n for n in linears if n == "fc1" or n.endswith((".qkv", ".fc1")))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    layers = _layers(model)
    result, sent, kinds = _lora_apply(nb, model, TARGETS, "a transformer-like model")

    check_equal(_replaced(kinds), wanted, "the layers replaced by LoRALinear",
                f"replace exactly the nn.Linear layers whose qualified name ends with one of {TARGETS} "
                "(not the head, not other Linears)")
    given = fetch(nb.apply(probes.module_table, sent[0]))
    check_equal(_replaced(given), _replaced(kinds), "the layers replaced in the model apply_lora was given",
                "modify the model in place (set_submodule on it) and return that same model, not a copy")
    for name in wanted:
        if "torch.nn.modules.linear.Linear" not in kinds.get(f"{name}.base", []):
            raise AssertionError(f"{name}.base should be the original nn.Linear wrapped by LoRALinear")

    table = fetch(nb.apply(probes.param_table, result))
    for name in wanted:
        n_in, n_out = linears[name].in_features, linears[name].out_features
        for ab, shape in (("A", [RANK, n_in]), ("B", [n_out, RANK])):
            if f"{name}.lora_{ab}" not in table:
                raise AssertionError(f"{name} has no parameter lora_{ab} after apply_lora: replace it by "
                                     f"LoRALinear(layer, rank, alpha)")
            check_equal(table[f"{name}.lora_{ab}"]["shape"], shape, f"{name}.lora_{ab}'s shape",
                        "pass rank on to LoRALinear")
    n_new = sum(torch.Size(table[f"{n}.lora_{ab}"]["shape"]).numel() for n in wanted for ab in "AB")
    n_expected = sum(RANK * (linears[n].in_features + linears[n].out_features) for n in wanted)
    check_equal(n_new, n_expected, "the number of new LoRA parameters",
                "each replaced layer adds rank * (in_features + out_features) parameters")
    want_s = ALPHA / RANK
    for name in wanted:
        got_s = _scaling(_reach(result, name))
        if got_s is not None and abs(got_s - want_s) <= 1e-12:
            continue
        own = _scaling(nb.LoRALinear(_linear(12, 7, 0), RANK, ALPHA))  # what the student's own class gives
        if got_s is not None and own is not None and abs(got_s - own) <= 1e-12:
            continue  # LoRALinear's own scaling: graded in test_lora_linear, not here
        raise AssertionError(f"{name}.scaling is {got_s}, expected alpha / rank = {want_s:g}: "
                             "pass rank and alpha on to LoRALinear")
    for name, value in before.items():
        owner, _, leaf = name.rpartition(".")
        name_now = f"{owner}.base.{leaf}" if owner in wanted else name  # wrapped layers keep theirs in .base
        if name_now not in table:
            raise AssertionError(f"parameter {name_now} is missing after apply_lora")
        check_close(table[name_now]["value"], value, name_now, "apply_lora must not change pretrained weights",
                    atol=0, rtol=0)
    for i, (path, original) in enumerate(layers.items()):
        x = _layer_input(original, seed=90 + i)
        with torch.no_grad():
            y = original(x)
        check_close(fetch(_reach(result, path)(x)), y, f"the output of {path} in the model apply_lora returned",
                    "apply_lora must not change what the model computes (lora_B starts at zero)", **TOL)


@hidden_test("test_apply_lora_frozen")
def check_apply_lora_frozen(nb):
    """Only the lora_A and lora_B of the replaced layers train; every original tensor stays as it was."""
    model = _toy_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    layers = _layers(model)
    result, sent, kinds = _lora_apply(nb, model, TARGETS, "a transformer-like model")
    tensors = sent[1]
    replaced = _replaced(kinds)  # the student's choice: which layers is graded in test_apply_lora
    if not replaced:
        raise AssertionError(f"apply_lora(model, {RANK}, {ALPHA:g}, {TARGETS}) replaced no layer by a LoRALinear: "
                             "nothing would train")
    table = fetch(nb.apply(probes.param_table, result))
    expected = sorted(f"{n}.lora_{ab}" for n in replaced for ab in "AB")
    trainable = sorted(n for n, row in table.items() if row["requires_grad"])
    check_equal(trainable, expected, "the trainable parameters after apply_lora",
                "freeze every parameter of the model except the new lora_A and lora_B")
    _check_what_trains(nb, result, layers, tensors, replaced, before)


# (qualified name, why it is or is not replaced) for the edge-case model, targets ["attn.qkv", "fc1"].
EDGE_TARGETS = ["attn.qkv", "fc1"]
EDGE_WHY = {
    "fc1": "a top-level Linear named exactly 'fc1' equals a target: it is replaced",
    "blocks.0.attn.qkv": ("a target may hold dots: 'attn.qkv' matches every Linear whose name ends with "
                          "'.attn.qkv'; compare the end of the whole qualified name, not its last part"),
    "attn.qkv": "attn.qkv is an nn.Conv1d: only nn.Linear layers are replaced, whatever their name",
    "blocks.0.mlp.myfc1": ("'blocks.0.mlp.myfc1' only ends with the letters 'fc1': a name matches when it equals "
                           "the target or ends with '.' + target"),
    "blocks.0.self_attn.qkv": ("'blocks.0.self_attn.qkv' only ends with the letters 'attn.qkv': a name matches "
                               "when it equals the target or ends with '.' + target"),
    "blocks.0.mlp.qkv": "'blocks.0.mlp.qkv' does not end with '.attn.qkv'; 'qkv' alone is not a target here",
    "head": "the head is not a target",
}


def _edge_model() -> nn.ModuleDict:
    torch.manual_seed(11)
    block = nn.ModuleDict({"attn": nn.ModuleDict({"qkv": nn.Linear(8, 24)}),
                           "self_attn": nn.ModuleDict({"qkv": nn.Linear(8, 24)}),
                           "mlp": nn.ModuleDict({"qkv": nn.Linear(8, 8), "myfc1": nn.Linear(8, 8)})})
    return nn.ModuleDict({"fc1": nn.Linear(8, 5), "attn": nn.ModuleDict({"qkv": nn.Conv1d(8, 8, 1)}),
                          "blocks": nn.ModuleList([block]), "head": nn.Linear(8, 3)})


@hidden_test("test_apply_lora_edge_cases")
def check_apply_lora_edge_cases(nb):
    """Targets as a list, a dotted target, an exact top-level name, a Conv1d named like a target, look-alike names."""
    model = _edge_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _result, _sent, kinds = _lora_apply(nb, model, EDGE_TARGETS, "a model with look-alike names")
    got, wanted = _replaced(kinds), ["blocks.0.attn.qkv", "fc1"]
    if got != wanted:
        wrong = sorted(set(got) ^ set(wanted))
        raise AssertionError(f"apply_lora(model, {RANK}, {ALPHA:g}, {EDGE_TARGETS}) replaced {got}, expected "
                             f"{wanted}: " + "; ".join(EDGE_WHY[n] if n in EDGE_WHY else f"{n} is not a target"
                                                       for n in wrong))
    if "torch.nn.modules.conv.Conv1d" not in kinds.get("attn.qkv", []):
        raise AssertionError(f"attn.qkv is now a {kinds.get('attn.qkv', ['nothing'])[0]}: {EDGE_WHY['attn.qkv']}")
    for name in wanted:
        if "torch.nn.modules.linear.Linear" not in kinds.get(f"{name}.base", []):
            raise AssertionError(f"{name}.base should be the original nn.Linear wrapped by LoRALinear")


def _layer_input(module: nn.Module, seed: int) -> torch.Tensor:
    if isinstance(module, nn.Embedding):
        return torch.randint(0, module.num_embeddings, (2, 3), generator=torch.Generator().manual_seed(seed))
    if isinstance(module, nn.Conv1d):
        return _randn(2, module.in_channels, 5, seed=seed)
    width = module.in_features if isinstance(module, nn.Linear) else module.normalized_shape[0]
    return _randn(2, 3, width, seed=seed)


def _check_what_trains(nb, result, layers: dict, tensors, replaced: list, before: dict) -> None:
    """Every layer of the original model, reached by its path in the returned model, trained for one SGD
    step by the judge: only the new lora_A and lora_B of the replaced layers may move."""
    named = {name: tensors[i] for i, name in enumerate(before)}  # handles: indexed, not iterated
    for i, (path, original) in enumerate(layers.items()):
        handle = _reach(result, path)
        x = _layer_input(original, seed=90 + i)
        with torch.no_grad():
            y = original(x)
        mine = {n: t for n, t in named.items() if n.rpartition(".")[0] == path}  # this layer's own tensors
        if path in replaced:
            mine.update({f"{path}.lora_A": handle.lora_A, f"{path}.lora_B": handle.lora_B})
        run = fetch(nb.apply(probes.ch01_sgd_steps, handle, mine, x, _randn(*y.shape, seed=120 + i), steps=1,
                             lr=TRAIN["lr"], weight_decay=TRAIN["weight_decay"]))
        what = f"one SGD step on {path} of the model apply_lora returned"
        if "error" in run:
            raise AssertionError(f"{what}: {run['error']}")
        expected = [f"{path}.lora_A", f"{path}.lora_B"] if path in replaced else []
        check_equal(run["updated"][0], expected, f"{what}: the list of tensors that train",
                    "freeze every parameter of the model except the new lora_A and lora_B "
                    "('?' is a tensor the model did not have before)")
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


ADAPTER_DIM, ADAPTER_BOTTLENECK, ADAPTER_LEAD = 37, 5, (2, 3)


def _adapter_table(nb, adapter) -> dict:
    """The adapter's parameter table, with the contract's names and shapes."""
    dim, bottleneck = ADAPTER_DIM, ADAPTER_BOTTLENECK
    table = fetch(nb.apply(probes.param_table, adapter))
    for name, shape in (("down.weight", [bottleneck, dim]), ("down.bias", [bottleneck]),
                        ("up.weight", [dim, bottleneck]), ("up.bias", [dim])):
        if name not in table:
            raise AssertionError(f"Adapter has no parameter {name!r} (it has {sorted(table)}): "
                                 "use two nn.Linear layers called down and up")
        check_equal(table[name]["shape"], shape, f"the shape of {name}",
                    "down maps dim -> bottleneck and up maps bottleneck -> dim")
    return table


@hidden_test("test_adapter")
def check_adapter(nb):
    """Names, shapes, what trains; gradients at initialisation; output and gradients once up has moved."""
    dim, lead = ADAPTER_DIM, ADAPTER_LEAD
    torch.manual_seed(3)
    adapter = nb.Adapter(dim, ADAPTER_BOTTLENECK)
    table = _adapter_table(nb, adapter)
    for name in ("down.weight", "down.bias", "up.weight", "up.bias"):
        if not table[name]["requires_grad"]:
            raise AssertionError(f"{name} is frozen: the adapter's own parameters are the ones that train")
    p = {n: row["value"] for n, row in table.items()}

    x = _randn(*lead, dim, seed=11)
    g = _randn(*lead, dim, seed=12)
    out = fetch(nb.apply(probes.forward_backward, adapter, x, g))
    ref = _adapter_reference(x, p["down.weight"], p["down.bias"], p["up.weight"], p["up.bias"], g)
    for name in ("up.weight", "up.bias", "down.weight"):
        check_close(out["grads"][name], ref[name], f"the gradient of {name} at initialisation",
                    "is the non-linearity GELU (nn.GELU(), exact) applied between down and up?", **TOL)
    fetch(adapter.zero_grad())

    fetch(adapter.load_state_dict({"up.weight": _randn(dim, ADAPTER_BOTTLENECK, seed=13, scale=0.3),
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


@hidden_test("test_adapter_init")
def check_adapter_init(nb):
    """up zero, down random: a fresh adapter is the identity."""
    dim, lead = ADAPTER_DIM, ADAPTER_LEAD
    torch.manual_seed(3)
    adapter = nb.Adapter(dim, ADAPTER_BOTTLENECK)
    table = _adapter_table(nb, adapter)
    for name in ("up.weight", "up.bias"):
        if table[name]["value"].abs().max() != 0:
            raise AssertionError(f"{name} is not zero at initialisation: zero-initialise up (weight and bias) so "
                                 "that the adapter starts as the identity and the pretrained model is unchanged")
    if table["down.weight"]["value"].std() == 0:
        raise AssertionError("down.weight is constant: keep nn.Linear's random initialisation for down")
    x = _randn(*lead, dim, seed=11)
    g = _randn(*lead, dim, seed=12)
    out = fetch(nb.apply(probes.forward_backward, adapter, x, g))
    check_close(out["y"], x, "the output at initialisation",
                "a fresh adapter must be the identity: x + up(GELU(down(x))) with up = 0 "
                "(did you keep the residual x?)",
                **TOL)
    check_close(out["dx"], g, "the input gradient at initialisation",
                "at initialisation the gradient flows through the residual unchanged", **TOL)
