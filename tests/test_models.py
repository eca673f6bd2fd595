"""Shapes, parameter counts and seeded determinism of coursekit.models."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursekit.measure import measure
from coursekit.memory import count_parameters
from coursekit.models import SmallCNN, SmallDSCNN, mlp

WIDTHS, STRIDES = (16, 32, 64, 128), (1, 1, 2, 2)


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_mlp_structure_and_shapes():
    model = mlp([37, 53, 11, 5])
    assert [type(m).__name__ for m in model] == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
    assert model(torch.randn(7, 37)).shape == (7, 5)
    assert count_parameters(model) == 37 * 53 + 53 + 53 * 11 + 11 + 11 * 5 + 5
    assert all(m.bias is None for m in mlp([4, 3, 2], bias=False) if isinstance(m, nn.Linear))
    assert len(mlp([4, 2])) == 1


def test_mlp_bad_sizes():
    with pytest.raises(ValueError, match="at least 2"):
        mlp([4])
    with pytest.raises(ValueError, match="positive integers"):
        mlp([4, 0, 2])


@pytest.mark.parametrize("cls", [SmallCNN, SmallDSCNN])
def test_cnn_shapes_and_layout(cls):
    model = cls()
    assert model(torch.randn(5, 1, 8, 8)).shape == (5, 10)
    assert isinstance(model.blocks, nn.ModuleList) and len(model.blocks) == len(WIDTHS)
    assert isinstance(model.classifier, nn.Linear) and model.classifier.in_features == WIDTHS[-1]
    x = torch.randn(2, 1, 8, 8)
    for block, c, s in zip(model.blocks, WIDTHS, STRIDES):
        h = x.shape[-1]
        x = block(x)
        assert x.shape == (2, c, h // s, h // s)
    small = cls(widths=(8, 12), strides=(1, 2), num_classes=3)
    assert small(torch.randn(2, 1, 8, 8)).shape == (2, 3)


def test_cnn_bad_config():
    with pytest.raises(ValueError, match="same length"):
        SmallCNN(widths=(8, 16), strides=(1,))
    with pytest.raises(ValueError, match="positive integers"):
        SmallDSCNN(widths=(8, -1), strides=(1, 1))


def test_parameter_counts_by_hand():
    bn = sum(2 * c for c in WIDTHS)  # BatchNorm weight and bias
    head = WIDTHS[-1] * 10 + 10
    pairs = list(zip((1,) + WIDTHS[:-1], WIDTHS))
    full = sum(9 * ci * co for ci, co in pairs) + bn + head
    separable = 9 * 1 * WIDTHS[0] + sum(9 * ci + ci * co for ci, co in pairs[1:]) + bn + head
    assert count_parameters(SmallCNN()) == full == 98_682
    assert count_parameters(SmallDSCNN()) == separable == 13_674
    assert full / separable > 7


def _activation_bytes(model: nn.Module, batch: int) -> int:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 1, 8, 8, generator=g)
    target = torch.randn(batch, 10, generator=g)
    return measure(lambda: F.mse_loss(model(x), target), model).activation_bytes


def test_cnn_activation_bytes_by_hand():
    batch = 3
    sizes, h = [], 8
    for c, s in zip(WIDTHS, STRIDES):
        h //= s
        sizes.append((c, h))
    # per block: conv output (BN input) + ReLU output (next conv input) + BN's saved mean and
    # inverse std (c each); then pooled features (classifier input), prediction and target
    values = batch * 64  # the image, first conv's input
    values += sum(2 * batch * c * h * h + 2 * c for c, h in sizes)
    values += batch * WIDTHS[-1] + 2 * batch * 10
    assert _activation_bytes(SmallCNN(), batch) == 4 * values
    # separable blocks also keep the depthwise output (c_in channels at the block's output size)
    extra = sum(batch * ci * h * h for ci, (_, h) in zip(WIDTHS[:-1], sizes[1:]))
    assert _activation_bytes(SmallDSCNN(), batch) == 4 * (values + extra)


def test_separable_saves_parameters_not_activations():
    full, sep = SmallCNN(), SmallDSCNN()
    assert count_parameters(full) > 7 * count_parameters(sep)
    a_full, a_sep = _activation_bytes(full, 16), _activation_bytes(sep, 16)
    assert 0.75 < a_full / a_sep < 1.25


@pytest.mark.parametrize("make", [lambda s: mlp([7, 9, 2], seed=s), lambda s: SmallCNN(seed=s),
                                  lambda s: SmallDSCNN(seed=s)])
def test_seeded_constructors_are_deterministic(make):
    assert _same_weights(make(0), make(0))
    assert not _same_weights(make(0), make(1))


def test_constructors_leave_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    SmallCNN(seed=5), SmallDSCNN(seed=5), mlp([3, 4], seed=5)
    assert torch.equal(torch.rand(3), expected)
