"""The chapter's reference LoRALinear computes what Hugging Face PEFT's LoRA layer computes.

The reference is taken from solutions/ch01_lora.py by executing its setup cells and its
``LoRALinear`` exercise cell, so this checks the solution itself. PEFT is a test-only
dependency: the test skips when it is not installed.
"""
from __future__ import annotations

import jupytext
import pytest
import torch
from torch import nn

from conftest import ROOT

peft = pytest.importorskip("peft")


@pytest.fixture(scope="module")
def LoRALinear():
    nb = jupytext.read(ROOT / "solutions" / "ch01_lora.py")
    namespace: dict = {}
    for cell in nb.cells:
        if cell.cell_type == "code" and "setup" in cell.metadata.get("tags", []):
            exec(cell.source, namespace)
    (source,) = [c.source for c in nb.cells if c.metadata.get("exercise") == "LoRALinear"]
    exec(source, namespace)
    return namespace["LoRALinear"]


class _OneLayer(nn.Module):
    def __init__(self, base: nn.Linear):
        super().__init__()
        self.fc = base

    def forward(self, x):
        return self.fc(x)


def _pair(LoRALinear, rank, alpha, seed=0):
    torch.manual_seed(seed)
    base = nn.Linear(37, 53)
    ours = LoRALinear(nn.Linear(37, 53), rank, alpha)
    ours.base.load_state_dict(base.state_dict())
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=["fc"], lora_dropout=0.0)
    theirs = peft.get_peft_model(_OneLayer(base), config)
    layer = theirs.base_model.model.fc
    with torch.no_grad():
        B = torch.randn(53, rank, generator=torch.Generator().manual_seed(seed + 1)) * 0.3
        ours.lora_B.copy_(B)
        layer.lora_B["default"].weight.copy_(B)
        layer.lora_A["default"].weight.copy_(ours.lora_A)
    return ours, theirs, layer


@pytest.mark.parametrize("rank, alpha", [(4, 8.0), (3, 1.5), (1, 16.0)])
def test_forward_and_gradients_match_peft(LoRALinear, rank, alpha):
    ours, theirs, layer = _pair(LoRALinear, rank, alpha)
    assert layer.scaling["default"] == pytest.approx(ours.scaling)
    x = torch.randn(2, 3, 37, generator=torch.Generator().manual_seed(5))
    g = torch.randn(2, 3, 53, generator=torch.Generator().manual_seed(6))
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y1, y2 = ours(x1), theirs(x2)
    torch.testing.assert_close(y1, y2)
    y1.backward(g)
    y2.backward(g)
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(ours.lora_A.grad, layer.lora_A["default"].weight.grad)
    torch.testing.assert_close(ours.lora_B.grad, layer.lora_B["default"].weight.grad)
    assert ours.base.weight.grad is None and layer.base_layer.weight.grad is None


def test_same_trainable_parameters_as_peft(LoRALinear):
    ours, theirs, _ = _pair(LoRALinear, 4, 8.0)
    count = lambda m: sum(p.numel() for p in m.parameters() if p.requires_grad)  # noqa: E731
    assert count(ours) == count(theirs) == 4 * (37 + 53)


def test_merge_matches_peft_merge_and_unload(LoRALinear):
    ours, theirs, _ = _pair(LoRALinear, 4, 8.0)
    merged_ours = ours.merge()
    merged_theirs = theirs.merge_and_unload().fc
    assert type(merged_theirs) is nn.Linear
    torch.testing.assert_close(merged_ours.weight, merged_theirs.weight)
    torch.testing.assert_close(merged_ours.bias, merged_theirs.bias)


def test_same_initialisation_scheme_as_peft(LoRALinear):
    """PEFT's default: A Kaiming-uniform like nn.Linear (bound 1/sqrt(in)), B = 0."""
    ours = LoRALinear(nn.Linear(400, 30), 64, 64.0)
    theirs = peft.get_peft_model(_OneLayer(nn.Linear(400, 30)), peft.LoraConfig(
        r=64, lora_alpha=64, target_modules=["fc"], lora_dropout=0.0)).base_model.model.fc
    bound = 1 / 400**0.5
    for A in (ours.lora_A, theirs.lora_A["default"].weight):
        assert A.abs().max() <= bound and A.abs().max() > 0.9 * bound
    assert torch.all(ours.lora_B == 0) and torch.all(theirs.lora_B["default"].weight == 0)
