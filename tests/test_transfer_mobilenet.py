"""coursekit.transfer's MobileNetV2-style network: shapes, the checkpoint, and chapter 5's TinyTL on it.

TinyTL comes from chapter 5's reference solution (its setup and exercise cells, run here), so these
tests also hold the chapter's promise that ``apply_tinytl`` works unchanged on ``TransferMobileNet``.
"""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursekit import measure, model_state_bytes
from coursekit.checks import check_close
from coursekit.transfer import (MOBILENET_CHECKPOINT, MOBILENET_SIZE, InvertedResidual, LeanConv2d, TransferMobileNet,
                                digits_tasks, evaluate, load_pretrained_mobilenet, pretrain_mobilenet)
from grader.notebooks import layout, read_source
from kernels.ch05_tinytl import ReLU1bit

KIB = 1024


@pytest.fixture(scope="module")
def ch05():
    """The reference LiteResidual and apply_tinytl of chapter 5, with its setup cell."""
    nb = read_source("ch05_tinytl")
    namespace: dict = {}
    for source in layout(nb, "ch05_tinytl").setup:
        exec(source, namespace)
    for cell in nb.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
            exec(cell.source, namespace)
    return namespace


def test_shapes_widths_and_residuals():
    model, again = TransferMobileNet(), TransferMobileNet()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert model(torch.randn(3, 1, 16, 16)).shape == (3, 5) and model(torch.randn(2, 1, 37, 29)).shape == (2, 5)
    assert model.stem.conv.stride == (2, 2) and len(model.blocks) == 5
    shapes, x = [], torch.randn(2, 8, 8, 8)
    for block in model.blocks:
        c = block.conv
        assert isinstance(block, InvertedResidual) and c.expansion == 6
        assert c.expand.out_channels == c.depthwise.groups == 6 * c.in_channels == c.project.in_channels
        assert c.depthwise.stride == c.stride and c.project.out_channels == c.out_channels
        assert block.residual == (c.stride == (1, 1) and c.in_channels == c.out_channels)
        x = block(x)
        shapes.append(tuple(x.shape[1:]))
    assert shapes == [(8, 8, 8), (16, 4, 4), (16, 4, 4), (24, 2, 2), (24, 2, 2)]
    with pytest.raises(ValueError, match="same length"):
        TransferMobileNet(widths=(8, 16), strides=(1,))


def test_docstring_states_the_size_the_course_runs():
    """The class's docstring names the image size it is pretrained and fine-tuned on, and no other."""
    doc = TransferMobileNet.__doc__
    assert f"{MOBILENET_SIZE}×{MOBILENET_SIZE}" in doc and "MOBILENET_SIZE" in doc
    sizes = {int(a) for a, b in re.findall(r"(\d+)×(\d+) greyscale", doc) if a == b}
    assert sizes == {MOBILENET_SIZE}, f"the docstring states {sizes} pixels a side, the course runs {MOBILENET_SIZE}"


def test_one_act_module_serves_both_activations():
    block = InvertedResidual(4, 4)
    calls = []
    block.act.register_forward_hook(lambda *_: calls.append(1))
    block(torch.randn(1, 4, 5, 5))
    assert len(calls) == 2


def test_lean_depthwise_conv_matches_and_keeps_nothing_when_frozen():
    torch.manual_seed(0)
    lean = LeanConv2d(6, 6, 3, stride=2, padding=1, groups=6, bias=False).double()
    ref = nn.Conv2d(6, 6, 3, stride=2, padding=1, groups=6, bias=False).double()
    ref.load_state_dict(lean.state_dict())
    for m in (lean, ref):
        m.weight.requires_grad_(False)
    x = torch.randn(2, 6, 7, 9, dtype=torch.float64)
    g = torch.randn(ref(x).shape, dtype=torch.float64)
    grads = []
    for m in (lean, ref):
        xi = x.clone().requires_grad_(True)
        m(xi).backward(g)
        grads.append(xi.grad)
    check_close(grads[0], grads[1], "dx of a frozen depthwise conv")
    xi = x.clone().requires_grad_(True)
    assert measure(lambda: lean(xi), lean, grad=g).activation_bytes == 0
    assert measure(lambda: ref(xi), ref, grad=g).activation_bytes == x.numel() * 8


def test_checkpoint_loads_solves_the_source_and_not_the_target():
    assert MOBILENET_CHECKPOINT.stat().st_size < 1024 * 1024
    source, target = digits_tasks(size=MOBILENET_SIZE)
    assert source.train.x.shape[1:] == (1, MOBILENET_SIZE, MOBILENET_SIZE)
    model = load_pretrained_mobilenet()
    assert all(p.requires_grad for p in model.parameters())
    state = torch.load(MOBILENET_CHECKPOINT, weights_only=True)
    model.load_state_dict(state)
    assert evaluate(model, source.test) >= 0.97
    assert evaluate(model, target.test) < 0.5


def test_make_checkpoints_rebuilds_it(monkeypatch, tmp_path):
    from coursekit import pretrain, transfer

    model, _ = pretrain_mobilenet(epochs=1, progress=False)  # the real recipe, shortened
    saved = torch.load(MOBILENET_CHECKPOINT, weights_only=True)
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in saved.items()}
    # `make checkpoints` runs `python -m coursekit.pretrain` with no names: every checkpoint, this one included.
    built = []
    monkeypatch.setattr(transfer, "MOBILENET_CHECKPOINT", tmp_path / "mb.pt")
    monkeypatch.setattr(transfer, "pretrain_mobilenet", lambda: (built.append(1) or model, 0.99))
    monkeypatch.setattr(transfer, "pretrain_cnn", lambda: (nn.Linear(1, 1), 0.99))
    monkeypatch.setattr(transfer, "CHECKPOINT", tmp_path / "cnn.pt")
    monkeypatch.setattr(pretrain, "pretrain", lambda name: (nn.Linear(1, 1), 1.0))
    monkeypatch.setattr(pretrain, "checkpoint_path", lambda name: tmp_path / f"{name}.pt")
    pretrain.main([])
    assert built and torch.load(tmp_path / "mb.pt", weights_only=True).keys() == saved.keys()


def _tinytl(ch05, downsample=2):
    model = ch05["apply_tinytl"](load_pretrained_mobilenet())
    model.stem.act = ReLU1bit()  # the stem is not one of model.blocks (chapter 5, section 5)
    for m in model.modules():
        if isinstance(m, ch05["LiteResidual"]):
            m.downsample = downsample
    return model


def _training_memory(model, x, y):
    act = measure(lambda: F.cross_entropy(model.train()(x), y), model).activation_bytes
    return act, act + sum(model_state_bytes(model, "adam").values())


def test_apply_tinytl_covers_the_mobilenet(ch05):
    base, x = load_pretrained_mobilenet().eval(), digits_tasks(size=MOBILENET_SIZE)[1].test.x[:8]
    tiny = _tinytl(ch05)
    with torch.no_grad():
        ref = base(x)
        check_close(tiny.eval()(x), ref, "TinyTL output at init, eval mode", atol=1e-5)
        check_close(tiny.train()(x), ref, "TinyTL output at init, train mode", atol=1e-5)
    lites = [b.side for b in tiny.blocks]
    assert all(isinstance(m, ch05["LiteResidual"]) for m in lites) and len(lites) == 5
    trainable = {n for n, p in tiny.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in tiny.named_parameters()
                         if n.endswith(".bias") or n.startswith("classifier.") or ".side." in n}
    assert all(type(b.main.act) is ReLU1bit for b in tiny.blocks)


def test_tinytl_saves_activations_and_training_memory_on_the_mobilenet(ch05):
    _, target = digits_tasks(size=MOBILENET_SIZE)
    x, y = target.train.x[:32].clone(), target.train.y[:32].clone()
    full_act, full_mem = _training_memory(load_pretrained_mobilenet(), x, y)
    tiny = _tinytl(ch05)
    tiny_act, tiny_mem = _training_memory(tiny, x, y)
    assert full_act > 10 * tiny_act  # the chapter's "several-fold": measured 13.3×
    assert full_mem > 4 * tiny_mem  # weights, gradients and Adam included: measured 6.5×
    # What TinyTL keeps, bounded from both sides: one packed bit per ReLU output (stem and two per block)
    # and the lite residuals' four tensors at the pooled resolution (pooled input, norm input, ReLU
    # output, final-norm input); above that only per-channel statistics and scales (about 1,100 floats), the
    # classifier's input and the loss.
    relu, lite = [], []
    hooks = [m.register_forward_hook(lambda _m, _i, out: relu.append(out.numel())) for m in tiny.modules()
             if isinstance(m, ReLU1bit)]
    hooks += [b.side.register_forward_hook(lambda m, inp, _o: lite.append(
        len(x) * (m.conv.in_channels + 3 * m.conv.out_channels) * -(-inp[0].shape[2] // 2) * -(-inp[0].shape[3] // 2)
        * 4)) for b in tiny.blocks]
    with torch.no_grad():
        tiny.train()(x)
    for h in hooks:
        h.remove()
    assert len(relu) == 1 + 2 * len(tiny.blocks) and len(lite) == len(tiny.blocks)
    kept = sum(-(-n // 8) for n in relu) + sum(lite)
    assert kept <= tiny_act <= kept + len(x) * 24 * 4 + 16 * KIB, (tiny_act, kept)


def test_plain_cnn_does_not_show_the_saving(ch05):
    from coursekit.transfer import load_pretrained_cnn

    _, target = digits_tasks()
    x, y = target.train.x[:32].clone(), target.train.y[:32].clone()
    full_act, full_mem = _training_memory(load_pretrained_cnn(), x, y)
    tiny_act, tiny_mem = _training_memory(ch05["apply_tinytl"](load_pretrained_cnn()), x, y)
    assert 1.2 < full_act / tiny_act < 2.5  # activations barely drop on 8×8 plain conv blocks
    assert tiny_mem > full_mem  # and the lite residuals' weights and Adam state outweigh the saving
