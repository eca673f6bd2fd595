"""The hidden tests of chapter 1 accept a correct implementation and reject plausible wrong ones.

The implementations here are written independently of solutions/ch01_lora.py, so that a bug
shared by the solution and its hidden tests cannot hide.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

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


def make_apply_lora(lora_cls=LoRALinear, only_targets=True, freeze=True):
    def apply_lora(model, rank, alpha, targets):
        if freeze:
            for p in model.parameters():
                p.requires_grad_(False)
        for name, module in list(model.named_modules()):
            hit = any(name == t or name.endswith("." + t) for t in targets)
            if isinstance(module, nn.Linear) and (hit or not only_targets):
                model.set_submodule(name, lora_cls(module, rank, alpha))
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


def test_correct_implementation_passes():
    ns = namespace()
    for grade_id in ("test_lora_linear", "test_apply_lora", "test_adapter"):
        CHECKS[grade_id](ns)


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


def test_other_correct_implementations_pass():
    ns = namespace(LoRALinear=FusedForward, Adapter=AdapterWithModules, apply_lora=apply_lora_recursive)
    for grade_id in ("test_lora_linear", "test_apply_lora", "test_adapter"):
        CHECKS[grade_id](ns)


def test_every_grade_id_has_a_check():
    assert sorted(CHECKS) == ["test_adapter", "test_apply_lora", "test_lora_linear"]


@pytest.mark.parametrize("wrong, message", [
    (ScaledByAlpha, "alpha / rank"),
    (ScaleOnlyInForward, "alpha / rank"),
    (RandomB, "lora_B is not zero"),
    (BothZero, "lora_A is constant"),
    (MergeWithoutScaling, "forget the scaling"),
    (MergeInPlace, "base"),
    (BaseNotFrozen, "frozen"),
    (BaseDetachedButTrainable, "requires_grad=True"),
    (BaseListedAsFrozen, "the tensors that train are .*base.weight"),
    (NoRankCheck, "ValueError"),
    (FloatRankAccepted, "ValueError"),
    (FreshBase, "wrap the layer you are given"),
])
def test_lora_linear_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_lora_linear"](namespace(LoRALinear=wrong))


@pytest.mark.parametrize("apply_lora, message", [
    (make_apply_lora(only_targets=False), "the layers replaced"),
    (make_apply_lora(freeze=False), "trainable parameters"),
    (make_apply_lora(lora_cls=lambda m, r, a: LoRALinear(m, r + 1, a)), "pass rank on"),
    (make_apply_lora(lora_cls=lambda m, r, a: LoRALinear(m, r, 1.0)), "pass rank and alpha on"),
])
def test_apply_lora_rejects(apply_lora, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_apply_lora"](namespace(apply_lora=apply_lora))


def test_apply_lora_rejects_a_shadowed_parameter_listing():
    """Freezes nothing and lists every parameter but lora_A/lora_B as a detached view."""

    def apply_lora(model, rank, alpha, targets):
        model = make_apply_lora(freeze=False)(model, rank, alpha, targets)
        honest = model.named_parameters

        def listing(*args, **kwargs):
            for name, p in honest(*args, **kwargs):
                yield name, (p if name.endswith(("lora_A", "lora_B")) else p.detach())

        model.named_parameters = listing
        return model

    with pytest.raises(AssertionError, match="tensors that train"):
        CHECKS["test_apply_lora"](namespace(apply_lora=apply_lora))


def test_apply_lora_rejects_name_only_matching():
    """Replacing every module whose name matches, whatever its type, wraps a Conv1d too."""

    def apply_lora(model, rank, alpha, targets):
        for p in model.parameters():
            p.requires_grad_(False)
        for name, module in list(model.named_modules()):
            if name and name.endswith(tuple(targets)) and hasattr(module, "weight"):
                wrapped = LoRALinear(nn.Linear(1, 1), rank, alpha)
                wrapped.base = module
                model.set_submodule(name, wrapped)
        return model

    with pytest.raises(AssertionError, match="the layers replaced"):
        CHECKS["test_apply_lora"](namespace(apply_lora=apply_lora))


@pytest.mark.parametrize("wrong, message", [
    (AdapterUpRandom, "zero-initialise up"),
    (AdapterUpBiasOnlyZero, "zero-initialise up"),
    (AdapterNoResidual, "residual"),
    (AdapterReLU, "GELU"),
    (AdapterDownZero, "zero-initialise up"),
    (AdapterBothZero, "down.weight is constant"),
])
def test_adapter_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_adapter"](namespace(Adapter=wrong))
