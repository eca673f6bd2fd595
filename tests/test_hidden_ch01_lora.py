"""The hidden tests of chapter 1 accept correct implementations and reject plausible wrong ones, each in
the cell of the property it gets wrong while the exercise's other cells still pass (partial credit).

The implementations here are written independently of solutions/ch01_lora.py, so that a bug
shared by the solution and its hidden tests cannot hide.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from contract_tables import Clause, contract_tests
from grader.api import LocalNamespace, checks_for

CHECKS = checks_for("ch01_lora")


# --- a correct implementation ---------------------------------------------------------------
class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scaling = alpha / rank

    def forward(self, x):
        return self.base(x) + self.scaling * (x @ self.lora_A.T) @ self.lora_B.T

    def merge(self) -> nn.Linear:
        merged = nn.Linear(self.base.in_features, self.base.out_features)
        with torch.no_grad():
            merged.weight.copy_(self.base.weight + self.scaling * self.lora_B @ self.lora_A)
            merged.bias.copy_(self.base.bias)
        return merged


MATCH = {
    "correct": lambda name, targets: any(name == t or name.endswith("." + t) for t in targets),
    "last_part": lambda name, targets: name.rsplit(".", 1)[-1] in targets,  # a dotted target never matches
    "letters": lambda name, targets: any(name.endswith(t) for t in targets),  # "myfc1" matches "fc1"
    "dotted_only": lambda name, targets: any(name.endswith("." + t) for t in targets),  # a top-level "fc1" does not
    "str_endswith": lambda name, targets: name.endswith(targets),  # TypeError for a list
}


def make_apply_lora(lora_cls=LoRALinear, only_targets=True, freeze=True, match="correct", linear_only=True,
                    freeze_after=False):
    def apply_lora(model, rank, alpha, targets):
        if freeze:
            for p in model.parameters():
                p.requires_grad_(False)
        for name, module in list(model.named_modules()):
            hit = bool(name) and MATCH[match](name, targets)
            if (isinstance(module, nn.Linear) or not linear_only) and (hit or (not only_targets and name)):
                model.set_submodule(name, lora_cls(module, rank, alpha))
        if freeze_after:
            model.requires_grad_(False)
        return model
    return apply_lora


class Adapter(nn.Module):
    def __init__(self, dim: int, bottleneck: int):
        super().__init__()
        self.down = nn.Linear(dim, bottleneck)
        self.up = nn.Linear(bottleneck, dim)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x):
        return x + self.up(F.gelu(self.down(x)))


def namespace(**overrides) -> LocalNamespace:
    ns = {"LoRALinear": LoRALinear, "apply_lora": make_apply_lora(), "Adapter": Adapter}
    ns.update(overrides)
    return LocalNamespace(ns)


# --- plausible wrong implementations (method-notes pitfalls and friends) ----------------------
class ScaledByAlpha(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        self.scaling = alpha


class ScaleOnlyInForward(LoRALinear):
    """Stores the right scaling but forward ignores it."""

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A.T) @ self.lora_B.T


class RandomB(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        nn.init.normal_(self.lora_B, std=0.02)


class BothZero(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        nn.init.zeros_(self.lora_A)


class MergeWithoutScaling(LoRALinear):
    def merge(self):
        merged = nn.Linear(self.base.in_features, self.base.out_features)
        with torch.no_grad():
            merged.weight.copy_(self.base.weight + self.lora_B @ self.lora_A)
            merged.bias.copy_(self.base.bias)
        return merged


class MergeInPlace(LoRALinear):
    def merge(self):
        with torch.no_grad():
            self.base.weight += self.scaling * self.lora_B @ self.lora_A
        return self.base


class BaseNotFrozen(LoRALinear):
    def __init__(self, base, rank, alpha):
        super().__init__(base, rank, alpha)
        for p in base.parameters():
            p.requires_grad_(True)


class BaseDetachedButTrainable(BaseNotFrozen):
    """Blocks the gradient with no_grad but leaves requires_grad=True (optimizers would still see it)."""

    def forward(self, x):
        with torch.no_grad():
            y0 = self.base(x)
        return y0 + self.scaling * (x @ self.lora_A.T) @ self.lora_B.T


class BaseListedAsFrozen(BaseNotFrozen):
    """Lies about the base: its own named_parameters lists detached views, so requires_grad reads False."""

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        for name, p in super().named_parameters(prefix, recurse, remove_duplicate):
            yield name, (p.detach() if ".base." in f".{name}" else p)


class NoRankCheck(LoRALinear):
    def __init__(self, base, rank, alpha):
        if rank == 0:
            rank = 1
        super().__init__(base, rank, alpha)


class FloatRankAccepted(LoRALinear):
    def __init__(self, base, rank, alpha):
        if rank < 1:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")
        nn.Module.__init__(self)
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        r = int(rank)
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r))
        self.scaling = alpha / rank


class FreshBase(LoRALinear):
    """Creates its own Linear instead of wrapping the pretrained one."""

    def __init__(self, base, rank, alpha):
        super().__init__(nn.Linear(base.in_features, base.out_features), rank, alpha)


class AdapterUpRandom(Adapter):
    def __init__(self, dim, bottleneck):
        nn.Module.__init__(self)
        self.down = nn.Linear(dim, bottleneck)
        self.up = nn.Linear(bottleneck, dim)


class AdapterNoResidual(Adapter):
    def forward(self, x):
        return self.up(F.gelu(self.down(x)))


class AdapterReLU(Adapter):
    def forward(self, x):
        return x + self.up(F.relu(self.down(x)))


class AdapterUpBiasOnlyZero(Adapter):
    def __init__(self, dim, bottleneck):
        super().__init__(dim, bottleneck)
        nn.init.normal_(self.up.weight, std=0.02)


class AdapterDownZero(Adapter):
    """Zero-initialises down (and up's bias) instead of up: the identity at start too, but against the
    contract, and up.weight gets no gradient in the first step."""

    def __init__(self, dim, bottleneck):
        nn.Module.__init__(self)
        self.down = nn.Linear(dim, bottleneck)
        self.up = nn.Linear(bottleneck, dim)
        nn.init.zeros_(self.down.weight)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.bias)


class AdapterBothZero(Adapter):
    """Zero-initialises down.weight as well: every input gets the same bottleneck features, so down.weight
    only starts to learn once up has moved (and not at all if up stays at zero)."""

    def __init__(self, dim, bottleneck):
        super().__init__(dim, bottleneck)
        nn.init.zeros_(self.down.weight)


class FusedForward(LoRALinear):
    """Also correct: forms W0 + s·BA in forward (slower, different rounding)."""

    def forward(self, x):
        return F.linear(x, self.base.weight + self.scaling * self.lora_B @ self.lora_A, self.base.bias)


class AdapterWithModules(Adapter):
    """Also correct: the non-linearity as a submodule, the residual written last."""

    def __init__(self, dim, bottleneck):
        super().__init__(dim, bottleneck)
        self.act = nn.GELU()

    def forward(self, x):
        return self.up(self.act(self.down(x))) + x


def apply_lora_recursive(model, rank, alpha, targets, prefix=""):
    """Also correct: walks named_children recursively and freezes as it goes."""
    for p in model.parameters(recurse=False):
        p.requires_grad_(False)
    for name, child in list(model.named_children()):
        full = f"{prefix}{name}"
        if isinstance(child, nn.Linear) and any(full == t or full.endswith("." + t) for t in targets):
            model.register_module(name, LoRALinear(child, rank, alpha))
        else:
            apply_lora_recursive(child, rank, alpha, targets, prefix=f"{full}.")
    return model


# --- more plausible wrong implementations ---------------------------------------------------------
class InputDetachedInUpdate(LoRALinear):
    """Right output, but the input gradient misses the low-rank path."""

    def forward(self, x):
        return self.base(x) + self.scaling * (x.detach() @ self.lora_A.T) @ self.lora_B.T


class ADetached(LoRALinear):
    """Right output, but lora_A never gets a gradient."""

    def forward(self, x):
        return self.base(x) + self.scaling * (x @ self.lora_A.detach().T) @ self.lora_B.T


class MergeReturnsWeight(LoRALinear):
    def merge(self):
        return (self.base.weight + self.scaling * self.lora_B @ self.lora_A).detach()


class MergeWithoutUpdate(LoRALinear):
    """Copies the base layer and forgets the low-rank update."""

    def merge(self):
        merged = nn.Linear(self.base.in_features, self.base.out_features)
        merged.load_state_dict(self.base.state_dict())
        return merged


class MergeForgetsBias(LoRALinear):
    """Copies the merged weight and leaves the new layer's bias at its random initialisation."""

    def merge(self):
        merged = nn.Linear(self.base.in_features, self.base.out_features)
        with torch.no_grad():
            merged.weight.copy_(self.base.weight + self.scaling * self.lora_B @ self.lora_A)
        return merged


class MessageWithoutRank(LoRALinear):
    def __init__(self, base, rank, alpha):
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError("invalid rank")
        super().__init__(base, rank, alpha)


class ComparesBeforeTypeCheck(LoRALinear):
    """A string rank reaches the comparison and raises TypeError."""

    def __init__(self, base, rank, alpha):
        if rank < 1 or rank != int(rank):
            raise ValueError(f"rank must be a positive integer, got {rank!r}")
        super().__init__(base, rank, alpha)


class RefusesRankOne(LoRALinear):
    def __init__(self, base, rank, alpha):
        if isinstance(rank, int) and rank == 1:
            raise ValueError(f"rank must be a positive integer above 1, got {rank!r}")
        super().__init__(base, rank, alpha)


class AdapterTanhGELU(Adapter):
    def forward(self, x):
        return x + self.up(F.gelu(self.down(x), approximate="tanh"))


class AdapterFrozenDown(Adapter):
    def __init__(self, dim, bottleneck):
        super().__init__(dim, bottleneck)
        self.down.requires_grad_(False)


def apply_lora_shadowed_listing(model, rank, alpha, targets):
    """Freezes nothing and lists every parameter but lora_A/lora_B as a detached view."""
    model = make_apply_lora(freeze=False)(model, rank, alpha, targets)
    honest = model.named_parameters

    def listing(*args, **kwargs):
        for name, p in honest(*args, **kwargs):
            yield name, (p if name.endswith(("lora_A", "lora_B")) else p.detach())

    model.named_parameters = listing
    return model


# --- tests -------------------------------------------------------------------------------------------
LORA_IDS = ("test_lora_linear", "test_lora_linear_frozen", "test_lora_linear_merge", "test_lora_linear_errors")
APPLY_IDS = ("test_apply_lora", "test_apply_lora_frozen", "test_apply_lora_edge_cases")
ADAPTER_IDS = ("test_adapter", "test_adapter_init")
IDS = {"LoRALinear": LORA_IDS, "apply_lora": APPLY_IDS, "Adapter": ADAPTER_IDS}
VALUES, FROZEN, MERGE, ERRORS = LORA_IDS
REPLACED, FREEZES, EDGES = APPLY_IDS
ADAPTER, INIT = ADAPTER_IDS


def _expect(exercise: str, wrong, fails: dict) -> None:
    """``wrong`` fails each cell of ``fails`` with a message matching its pattern and passes the exercise's others."""
    ns = namespace(**{exercise: wrong})
    for grade_id in IDS[exercise]:
        if grade_id not in fails:
            CHECKS[grade_id](ns)  # partial credit: the properties it gets right still score
            continue
        with pytest.raises(AssertionError, match=fails[grade_id]):
            CHECKS[grade_id](ns)


def test_every_grade_id_has_a_check():
    assert sorted(CHECKS) == sorted(LORA_IDS + APPLY_IDS + ADAPTER_IDS)


@pytest.mark.parametrize("grade_id", LORA_IDS + APPLY_IDS + ADAPTER_IDS)
def test_correct_implementation_passes(grade_id):
    CHECKS[grade_id](namespace())


@pytest.mark.parametrize("grade_id", LORA_IDS + APPLY_IDS + ADAPTER_IDS)
def test_other_correct_implementations_pass(grade_id):
    ns = namespace(LoRALinear=FusedForward, Adapter=AdapterWithModules, apply_lora=apply_lora_recursive)
    CHECKS[grade_id](ns)


@pytest.mark.parametrize("wrong, fails", [
    (ScaledByAlpha, {VALUES: "alpha / rank"}),
    (ScaleOnlyInForward, {VALUES: "alpha / rank"}),
    (RandomB, {VALUES: "lora_B is not zero"}),
    (BothZero, {VALUES: "lora_A is constant"}),
    (FreshBase, {VALUES: "wrap the layer you are given", FROZEN: "the tensors that train are .*base.weight"}),
    (InputDetachedInUpdate, {VALUES: "the gradient of the input .*the output is right but the input gradient"}),
    (ADetached, {VALUES: "lora_A at initialisation is None: no gradient reached it"}),
    (BaseNotFrozen, {FROZEN: "base.weight has requires_grad=True"}),
    (BaseDetachedButTrainable, {VALUES: "the input gradient .*not by cutting the graph", FROZEN: "requires_grad=True"}),
    (BaseListedAsFrozen, {FROZEN: "the tensors that train are .*base.weight"}),
    (MergeWithoutScaling, {MERGE: "forget the scaling"}),
    (MergeInPlace, {MERGE: "leave the frozen base weight unchanged"}),
    (MergeReturnsWeight, {MERGE: "returned a torch.Tensor, expected an nn.Linear"}),
    (MergeForgetsBias, {MERGE: "keeps the base layer's bias"}),
    (MergeWithoutUpdate, {MERGE: "the merged weight is W0 alone"}),
    (NoRankCheck, {ERRORS: "rank=0.*returned a layer"}),
    (FloatRankAccepted, {ERRORS: "rank=2.5.*returned a layer"}),
    (MessageWithoutRank, {ERRORS: "does not name the refused rank"}),
    (ComparesBeforeTypeCheck, {ERRORS: "raised TypeError.*Check the type first"}),
    (RefusesRankOne, {ERRORS: "rank=1.*every positive integer is a valid rank"}),
], ids=lambda v: v.__name__ if isinstance(v, type) else "")
def test_lora_linear_rejects(wrong, fails):
    _expect("LoRALinear", wrong, fails)


@pytest.mark.parametrize("wrong, fails", [
    (make_apply_lora(only_targets=False), {REPLACED: "the layers replaced", EDGES: "the head is not a target"}),
    (make_apply_lora(freeze=False), {FREEZES: "trainable parameters"}),
    (make_apply_lora(freeze_after=True), {FREEZES: "trainable parameters"}),
    (apply_lora_shadowed_listing, {FREEZES: "tensors that train"}),
    (make_apply_lora(lora_cls=lambda m, r, a: LoRALinear(m, r + 1, a)), {REPLACED: "pass rank on"}),
    (make_apply_lora(lora_cls=lambda m, r, a: LoRALinear(m, r, 1.0)), {REPLACED: "pass rank and alpha on"}),
    (make_apply_lora(match="last_part"), {EDGES: "a target may hold dots"}),
    (make_apply_lora(match="letters"), {EDGES: "only ends with the letters"}),
    (make_apply_lora(match="dotted_only"), {EDGES: "named exactly 'fc1'"}),
    (make_apply_lora(match="str_endswith"), {EDGES: "str.endswith takes a str or a tuple"}),
    (make_apply_lora(linear_only=False), {EDGES: "Only nn.Linear layers are replaced"}),
], ids=["all_linears", "no_freeze", "freezes_lora_too", "shadowed_listing", "rank_plus_one", "alpha_one",
        "last_part", "letters", "dotted_only", "str_endswith", "any_module_type"])
def test_apply_lora_rejects(wrong, fails):
    _expect("apply_lora", wrong, fails)


@pytest.mark.parametrize("wrong, fails", [
    (AdapterUpRandom, {INIT: "zero-initialise up"}),
    (AdapterUpBiasOnlyZero, {INIT: "zero-initialise up"}),
    (AdapterNoResidual, {ADAPTER: "residual", INIT: "residual"}),
    (AdapterReLU, {ADAPTER: "GELU"}),
    (AdapterTanhGELU, {ADAPTER: r"GELU \(nn.GELU\(\), exact\)"}),
    (AdapterFrozenDown, {ADAPTER: "down.weight is frozen"}),
    (AdapterDownZero, {INIT: "zero-initialise up"}),
    (AdapterBothZero, {INIT: "down.weight is constant"}),
], ids=lambda v: v.__name__ if isinstance(v, type) else "")
def test_adapter_rejects(wrong, fails):
    _expect("Adapter", wrong, fails)


# --- the contract, clause by clause (tests/contract_tables.py) -------------------------------------------
def apply_lora_returns_none(model, rank, alpha, targets):
    """Modifies the model in place and forgets to return it."""
    make_apply_lora()(model, rank, alpha, targets)


def apply_lora_on_a_copy(model, rank, alpha, targets):
    """Returns an adapted deep copy: the model it was given stays as it was."""
    import copy

    return make_apply_lora()(copy.deepcopy(model), rank, alpha, targets)


def _lora(cls):
    return {"LoRALinear": cls}


def _apply(fn):
    return {"apply_lora": fn}


def _adapter(cls):
    return {"Adapter": cls}


_TARGETS_RULE = 'equals a target or ends with "." + target'
_ONLY_LORA = "the only parameters with requires_grad=True are the lora_A and lora_B of the new layers"
CONTRACT = [
    Clause("LoRALinear", "the update is multiplied by self.scaling = alpha / rank", (VALUES,), _lora(ScaledByAlpha),
           "alpha / rank"),
    Clause("LoRALinear", "y = base(x) + (alpha / rank) * (x @ lora_A.T) @ lora_B.T", (VALUES,),
           _lora(ScaleOnlyInForward), "alpha / rank"),
    Clause("LoRALinear", "lora_B: nn.Parameter of shape (out_features, rank), initialised to zeros", (VALUES,),
           _lora(RandomB), "lora_B is not zero"),
    Clause("LoRALinear", "initialised like nn.Linear's weight", (VALUES,), _lora(BothZero), "lora_A is constant"),
    Clause("LoRALinear", "Keep it as self.base", (VALUES,), _lora(FreshBase), "wrap the layer you are given"),
    Clause("LoRALinear", "the gradients of x, lora_A and lora_B", (VALUES,), _lora(InputDetachedInUpdate),
           "input gradient", label="input-gradient"),
    Clause("LoRALinear", "the gradients of x, lora_A and lora_B", (VALUES,), _lora(ADetached),
           "no gradient reached it", label="lora-A-gradient"),
    Clause("LoRALinear", "freeze it: requires_grad=False on its weight and bias", (FROZEN,), _lora(BaseNotFrozen),
           "requires_grad=True"),
    Clause("LoRALinear", "freeze it: requires_grad=False on its weight and bias", (FROZEN,),
           _lora(BaseListedAsFrozen), "the tensors that train", label="base-listed-as-frozen"),
    Clause("LoRALinear", "a new nn.Linear with weight W0 + scaling * lora_B @ lora_A", (MERGE,),
           _lora(MergeWithoutScaling), "forget the scaling"),
    Clause("LoRALinear", "a new nn.Linear with weight W0 + scaling * lora_B @ lora_A", (MERGE,),
           _lora(MergeWithoutUpdate), "W0 alone", label="merge-forgets-update"),
    Clause("LoRALinear", "merge(): a new nn.Linear", (MERGE,), _lora(MergeReturnsWeight), "expected an nn.Linear"),
    Clause("LoRALinear", "and the base bias", (MERGE,), _lora(MergeForgetsBias), "bias"),
    Clause("LoRALinear", "self.base is left unchanged", (MERGE,), _lora(MergeInPlace), "unchanged"),
    Clause("LoRALinear", 'Anything else (0, -1, 2.5, "4") raises', (ERRORS,), _lora(NoRankCheck),
           "rank=0.*returned a layer"),
    Clause("LoRALinear", 'Anything else (0, -1, 2.5, "4") raises', (ERRORS,), _lora(FloatRankAccepted),
           "rank=2.5.*returned a layer", label="float-rank"),
    Clause("LoRALinear", 'Anything else (0, -1, 2.5, "4") raises', (ERRORS,), _lora(ComparesBeforeTypeCheck),
           "raised TypeError", label="string-rank"),
    Clause("LoRALinear", 'ValueError("rank must be a positive integer, got ...")', (ERRORS,),
           _lora(MessageWithoutRank), "does not name the refused rank"),
    Clause("LoRALinear", "rank: r, a positive int", (ERRORS,), _lora(RefusesRankOne), "every positive integer"),
    Clause("apply_lora", _TARGETS_RULE, (REPLACED,), _apply(make_apply_lora(only_targets=False)),
           "the layers replaced"),
    Clause("apply_lora", "rank, alpha: passed to every new LoRALinear(layer, rank, alpha)", (REPLACED,),
           _apply(make_apply_lora(lora_cls=lambda m, r, a: LoRALinear(m, r + 1, a))), "pass rank on"),
    Clause("apply_lora", "rank, alpha: passed to every new LoRALinear(layer, rank, alpha)", (REPLACED,),
           _apply(make_apply_lora(lora_cls=lambda m, r, a: LoRALinear(m, r, 1.0))), "pass rank and alpha on",
           label="alpha-passed-on"),
    Clause("apply_lora", _ONLY_LORA, (FREEZES,), _apply(make_apply_lora(freeze=False)), "trainable parameters"),
    Clause("apply_lora", _ONLY_LORA, (FREEZES,), _apply(make_apply_lora(freeze_after=True)), "trainable parameters",
           label="lora-not-frozen"),
    Clause("apply_lora", _ONLY_LORA, (FREEZES,), _apply(apply_lora_shadowed_listing), "tensors that train",
           label="shadowed-listing"),
    Clause("apply_lora", '"blocks.0.attn.qkv" matches "qkv" and "attn.qkv"', (EDGES,),
           _apply(make_apply_lora(match="last_part")), "a target may hold dots"),
    Clause("apply_lora", _TARGETS_RULE, (EDGES,), _apply(make_apply_lora(match="letters")),
           "only ends with the letters", label="look-alike-names"),
    Clause("apply_lora", _TARGETS_RULE, (EDGES,), _apply(make_apply_lora(match="dotted_only")),
           "named exactly 'fc1'", label="exact-top-level-name"),
    Clause("apply_lora", "targets: iterable of name suffixes", (EDGES,), _apply(make_apply_lora(match="str_endswith")),
           "str.endswith"),
    Clause("apply_lora", "Modules of other types are never replaced, whatever their name", (EDGES,),
           _apply(make_apply_lora(linear_only=False)), "Only nn.Linear layers are replaced"),
    Clause("apply_lora", "model: any nn.Module; modified in place", (REPLACED,), _apply(apply_lora_returns_none),
           "return", label="returns-model"),
    Clause("apply_lora", "model: any nn.Module; modified in place", (REPLACED,), _apply(apply_lora_on_a_copy),
           "in place", label="in-place"),
    Clause("Adapter", "with weight **and** bias set to zero", (INIT,), _adapter(AdapterUpRandom), "zero-initialise up"),
    Clause("Adapter", "with weight **and** bias set to zero", (INIT,), _adapter(AdapterUpBiasOnlyZero),
           "zero-initialise up", label="up-weight-zero"),
    Clause("Adapter", "down: nn.Linear(dim, bottleneck) with its default (random) initialisation", (INIT,),
           _adapter(AdapterDownZero), "zero-initialise up"),
    Clause("Adapter", "down: nn.Linear(dim, bottleneck) with its default (random) initialisation", (INIT,),
           _adapter(AdapterBothZero), "down.weight is constant", label="down-random"),
    Clause("Adapter", "x + up(GELU(down(x)))", (ADAPTER,), _adapter(AdapterNoResidual), "residual"),
    Clause("Adapter", "Write the adapter with nn.GELU()'s exact GELU", (ADAPTER,), _adapter(AdapterReLU), "GELU"),
    Clause("Adapter", "Write the adapter with nn.GELU()'s exact GELU", (ADAPTER,), _adapter(AdapterTanhGELU),
           "exact", label="tanh-gelu"),
    Clause("Adapter", "all four trainable", (ADAPTER,), _adapter(AdapterFrozenDown), "frozen"),
]

test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
    test_contract_covers_every_graded_cell = contract_tests("ch01_lora", CONTRACT, namespace, CHECKS, globals())
