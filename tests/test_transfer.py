"""coursekit.transfer: the digits tasks, the lean layers and the pretrained TransferCNN."""
import copy

import pytest
import torch
from torch import nn

from coursekit import measure
from coursekit.checks import check_close
from coursekit.transfer import (CHECKPOINT, LeanBatchNorm2d, LeanConv2d, TransferCNN, digits_tasks, evaluate,
                                fine_tune, load_pretrained_cnn, FineTuneConfig)


def test_tasks_are_deterministic_and_disjoint_in_classes():
    source, target = digits_tasks()
    again, target2 = digits_tasks()
    assert torch.equal(source.train.x, again.train.x) and torch.equal(target.test.y, target2.test.y)
    assert source.train.x.shape[1:] == (1, 8, 8) and len(target.train) == 300
    assert set(source.train.y.tolist()) == set(range(5)) == set(target.train.y.tolist())
    # target images are negatives: the paper (most pixels) is bright
    assert target.train.x.mean() > 0.5 > source.train.x.mean()
    with pytest.raises(ValueError, match="target_train"):
        digits_tasks(target_train=5)


@pytest.mark.parametrize("stride", [1, 2])
def test_lean_conv_matches_conv_and_saves_no_input_when_frozen(stride):
    torch.manual_seed(0)
    lean = LeanConv2d(3, 5, 3, stride=stride, padding=1)
    ref = nn.Conv2d(3, 5, 3, stride=stride, padding=1)
    ref.load_state_dict(lean.state_dict())
    for m in (lean, ref):
        m.weight.requires_grad_(False)
    x = torch.randn(2, 3, 7, 9, dtype=torch.float64)
    lean, ref = lean.double(), ref.double()
    g = torch.randn(ref(x).shape, dtype=torch.float64)
    outs = []
    for m in (lean, ref):
        xi = x.clone().requires_grad_(True)
        y = m(xi)
        y.backward(g)
        outs.append((y.detach(), xi.grad, m.bias.grad))
    for a, b, name in zip(outs[0], outs[1], ("y", "dx", "dbias")):
        check_close(a, b, name)
    xi = x.clone().requires_grad_(True)
    assert measure(lambda: lean(xi), lean, grad=g).activation_bytes == 0
    assert measure(lambda: ref(xi), ref, grad=g).activation_bytes == x.numel() * 8  # nn.Conv2d keeps x
    lean.weight.requires_grad_(True)  # trainable weight: it needs x, like nn.Conv2d
    assert measure(lambda: lean(xi), lean, grad=g).activation_bytes == x.numel() * 8


def test_lean_batchnorm_in_eval_is_the_same_affine_map_and_keeps_no_input():
    torch.manual_seed(0)
    bn = LeanBatchNorm2d(4)
    bn.running_mean.normal_()
    bn.running_var.uniform_(0.5, 2.0)
    with torch.no_grad():
        bn.weight.normal_()
        bn.bias.normal_()
    ref = nn.BatchNorm2d(4)
    ref.load_state_dict(bn.state_dict())
    bn.eval(), ref.eval()
    bn.weight.requires_grad_(False), ref.weight.requires_grad_(False)
    x = torch.randn(3, 4, 5, 5, requires_grad=True)
    check_close(bn(x), ref(x), "eval-mode output", atol=1e-6)
    g = torch.randn(3, 4, 5, 5)
    m = measure(lambda: bn(x), bn, grad=g)
    assert m.activation_bytes == 4 * 4  # the per-channel scale s only
    bn.zero_grad(set_to_none=True)
    bn(x).backward(g)
    check_close(bn.bias.grad, g.sum(dim=(0, 2, 3)), "dβ")


def test_train_mode_keeps_frozen_batchnorm_on_running_statistics():
    model = TransferCNN()
    model.blocks[0].bn.weight.requires_grad_(False)
    model.train()
    assert not model.blocks[0].bn.training and model.blocks[1].bn.training and model.training


def test_pretrained_cnn_solves_the_source_and_not_the_target():
    assert CHECKPOINT.stat().st_size < 1024 * 1024
    source, target = digits_tasks()
    model = load_pretrained_cnn()
    assert all(p.requires_grad for p in model.parameters())
    state = torch.load(CHECKPOINT, weights_only=True)
    model.classifier.load_state_dict({k[len("classifier."):]: v for k, v in state.items() if k.startswith("classifier.")})
    assert evaluate(model, source.test) >= 0.98
    assert evaluate(model, target.test) < 0.5


def test_fine_tune_trains_only_what_requires_grad_and_refuses_nothing():
    _, target = digits_tasks()
    model = load_pretrained_cnn()
    for n, p in model.named_parameters():
        p.requires_grad_(n.startswith("classifier"))
    before = copy.deepcopy(model.state_dict())
    losses = fine_tune(model, target.train, FineTuneConfig(epochs=2))
    assert len(losses) == 2 and losses[1] < losses[0]
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"classifier.weight", "classifier.bias"}  # BN statistics too are untouched
    model.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameter"):
        fine_tune(model, target.train)
