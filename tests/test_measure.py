"""Pin coursekit.measure and coursekit.memory against numbers computed by hand.

The MLP below is Linear(6, 10) → ReLU → Linear(10, 3) on a batch of B = 4, fp32, MSE loss:

    saved for backward                     bytes
    x (first Linear's input)       4·6·4 =   96
    ReLU output (= Linear 2 input) 4·10·4 = 160   one storage, saved twice
    W2ᵀ (for dX of Linear 2)       10·3·4 = 120   a parameter: state, not activation
    prediction (MSE input)         4·3·4 =   48
    target                         4·3·4 =   48
    W1 is not saved: x needs no gradient, so Linear 1 computes no dX.

    forward FLOPs   addmm 2·B·in·out: 2·4·6·10 + 2·4·10·3                 = 720
    backward FLOPs  Linear 2: dX = g W2 (240) + dW = gᵀh (240); Linear 1: dW (480) = 960
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursekit.measure import measure, saved_tensors
from coursekit.memory import count_parameters, model_state_bytes, optimizer_state_copies
from coursekit.models import mlp
from coursekit.steps import measure_training_step, regression_step

B, IN, HID, OUT = 4, 6, 10, 3


@pytest.fixture
def model():
    return mlp([IN, HID, OUT], seed=0)


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, IN, generator=g), torch.randn(B, OUT, generator=g)


def test_mlp_bytes_and_flops_by_hand(model, data):
    x, target = data
    m = measure(lambda: F.mse_loss(model(x), target), model)
    assert m.activation_bytes == 4 * (B * IN + B * HID + B * OUT + B * OUT) == 352
    assert m.saved_bytes == 352 + 4 * HID * OUT == 472
    assert m.forward_flops == 2 * B * IN * HID + 2 * B * HID * OUT == 720
    assert m.backward_flops == 2 * (2 * B * HID * OUT) + 2 * B * IN * HID == 960
    assert m.total_flops == 1680
    assert m.peak_cuda_bytes is None or m.peak_cuda_bytes > 0


def test_saved_list_has_unique_storages_and_marks_parameters(model, data):
    x, target = data
    m = measure(lambda: F.mse_loss(model(x), target), model)
    shapes = [(s.shape, s.nbytes, s.is_state) for s in m.saved]
    # the ReLU output appears once although ReluBackward and AddmmBackward both keep it
    assert shapes == [((B, IN), 96, False), ((B, HID), 160, False), ((HID, OUT), 120, True),
                      ((B, OUT), 48, False), ((B, OUT), 48, False)]
    assert all(s.dtype == torch.float32 for s in m.saved)


def test_input_that_needs_grad_makes_first_weight_saved(model, data):
    x, target = data
    x = x.clone().requires_grad_(True)
    m = measure(lambda: F.mse_loss(model(x), target), model)
    assert m.activation_bytes == 352  # W1 is a parameter: saved, but not an activation
    assert m.saved_bytes == 472 + 4 * IN * HID
    assert m.backward_flops == 960 + 2 * B * IN * HID  # plus dX of Linear 1


def test_parameters_are_state_even_without_passing_the_module(model, data):
    # measure's docstring: "Any nn.Parameter is recognised as state anyway."
    x, target = data
    m = measure(lambda: F.mse_loss(model(x), target))
    assert m.activation_bytes == 352


def test_plain_tensor_passed_as_state_is_excluded():
    w = torch.randn(5, 3, requires_grad=True)  # a leaf tensor, not an nn.Parameter
    x = torch.randn(2, 5, requires_grad=True)
    assert measure(lambda: (x @ w).sum()).activation_bytes == 4 * (2 * 5 + 5 * 3)
    assert measure(lambda: (x @ w).sum(), w).activation_bytes == 4 * 2 * 5


def test_non_scalar_output_with_grad(model, data):
    x, _ = data
    m = measure(lambda: model(x), model, grad=torch.ones(B, OUT))
    assert m.activation_bytes == 4 * (B * IN + B * HID) == 256  # no loss: nothing saves the output
    assert m.forward_flops == 720 and m.backward_flops == 960


def test_same_tensor_saved_twice_counts_once():
    a = torch.randn(5, requires_grad=True)
    m = measure(lambda: (a * a).sum())
    assert m.activation_bytes == 20 and len(m.saved) == 1


def test_view_counts_its_whole_storage():
    big = torch.randn(4, 8)
    w = nn.Parameter(torch.randn(3, 5))
    m = measure(lambda: (big[:, :3] @ w).sum(), w)
    assert [s.shape for s in m.saved] == [(4, 3)]
    assert m.activation_bytes == 4 * 8 * 4  # the slice keeps all of `big` alive


def test_saved_tensors_context_manager(model, data):
    x, target = data
    with saved_tensors(model) as rec:
        F.mse_loss(model(x), target)
    assert rec.activation_bytes == 352 and rec.saved_bytes == 472


def test_labels_break_the_saved_bytes_down_by_layer(model, data):
    x, target = data
    layer = ["loss"]
    hooks = [m.register_forward_pre_hook(lambda m, _, name=name: layer.__setitem__(0, name))
             for name, m in model.named_children()]
    hooks.append(model.register_forward_hook(lambda *_: layer.__setitem__(0, "loss")))
    with saved_tensors(model, label=lambda: layer[0]) as rec:
        F.mse_loss(model(x), target)
    for h in hooks:
        h.remove()
    by_layer = {}
    for t in rec.tensors:
        if not t.is_state:
            by_layer[t.label] = by_layer.get(t.label, 0) + t.nbytes
    # the first Linear keeps x for ∂W; the ReLU's output (B × HID) is first saved by the ReLU, then
    # reused by the second Linear (counted once, under the ReLU); the loss keeps the rest
    assert by_layer == {"0": B * IN * 4, "1": B * HID * 4, "loss": 352 - B * IN * 4 - B * HID * 4}
    assert sum(by_layer.values()) == rec.activation_bytes
    with saved_tensors(model) as plain:
        F.mse_loss(model(x), target)
    assert {t.label for t in plain.tensors} == {None}


def test_bad_step_errors(model, data):
    x, _ = data
    with pytest.raises(TypeError, match="callable"):
        measure(model(x), model)
    with pytest.raises(ValueError, match="grad="):
        measure(lambda: model(x), model)
    with pytest.raises(ValueError, match="no_grad"):
        with torch.no_grad():
            measure(lambda: model(x).sum(), model)
    with pytest.raises(ValueError, match="autograd graph"):
        measure(lambda: 3.0)


def test_regression_step_and_measure_training_step(model):
    step = regression_step(model, B, seed=0)
    loss = step()
    assert loss.shape == () and loss.requires_grad
    assert torch.equal(step(), loss)  # same data on every call
    m = measure_training_step(model, B)
    assert m.activation_bytes == 352 and m.saved_bytes == 472
    assert m.forward_flops == 720 and m.backward_flops == 960
    assert measure_training_step(model, 1).activation_bytes == 352 // B


def test_regression_step_bad_input(model):
    with pytest.raises(ValueError, match="no nn.Linear"):
        regression_step(nn.Sequential(nn.ReLU()), 4)
    with pytest.raises(ValueError, match="positive integer"):
        regression_step(model, 0)
    with pytest.raises(ValueError, match="positive integer"):
        measure_training_step(model, 2.5)


def test_model_state_bytes_with_frozen_parameters(model):
    n_params = IN * HID + HID + HID * OUT + OUT  # 103
    assert count_parameters(model) == n_params
    for p in model[0].parameters():
        p.requires_grad_(False)
    trainable = HID * OUT + OUT  # 33
    assert count_parameters(model, trainable_only=True) == trainable
    assert model_state_bytes(model, "sgd") == {"params": 4 * n_params, "grads": 4 * trainable, "optimizer_state": 0}
    assert model_state_bytes(model, "momentum")["optimizer_state"] == 4 * trainable
    assert model_state_bytes(model, "adam") == {"params": 412, "grads": 132, "optimizer_state": 264}
    assert model_state_bytes(model)["optimizer_state"] == 264  # Adam is the default


def test_model_state_bytes_respects_dtype():
    model = mlp([6, 10, 3]).to(torch.float64)
    assert model_state_bytes(model, "adam") == {"params": 824, "grads": 824, "optimizer_state": 1648}


def test_unknown_optimizer():
    assert optimizer_state_copies("adam") == 2
    with pytest.raises(ValueError, match=r"'rmsprop'.*'sgd', 'momentum', 'adam'"):
        model_state_bytes(mlp([2, 2]), "rmsprop")
    with pytest.raises(ValueError, match="unknown optimizer"):
        optimizer_state_copies(None)


def test_flops_of_a_backward_that_calls_autograd_grad():
    """A checkpoint-style Function recomputes its module inside backward with autograd.grad:
    measure must count it (forward once more) instead of failing in module-tracking hooks."""
    import torch
    from torch import nn

    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))

    class Recompute(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            with torch.no_grad():
                return net(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            x = x.detach().requires_grad_(True)
            with torch.enable_grad():
                y = net(x)
            params = list(net.parameters())
            grads = torch.autograd.grad(y, [x, *params], g)
            for p, gp in zip(params, grads[1:]):
                p.grad = gp
            return grads[0]

    x = torch.randn(4, 8, requires_grad=True)
    m = measure(lambda: Recompute.apply(x).sum(), net)
    linear = 2 * 4 * 8 * 8
    assert m.forward_flops == 2 * linear
    assert m.backward_flops == 2 * linear + 2 * (2 * linear)  # recompute + dW and dx of both layers
    assert m.activation_bytes == 4 * 4 * 8  # only x


# --- resident and peak bytes: graphs freed before the step ends ------------------------------------
def test_resident_and_peak_follow_graphs_freed_mid_step(model):
    """A local-loss style step: the first graph (batch 8) is back-propagated inside the step."""
    g = torch.Generator().manual_seed(1)
    x8, t8 = torch.randn(8, IN, generator=g), torch.randn(8, OUT, generator=g)
    x4, t4 = torch.randn(B, IN, generator=g), torch.randn(B, OUT, generator=g)

    def step():
        F.mse_loss(model(x8), t8).backward()  # frees its 704 bytes before the step returns
        return F.mse_loss(model(x4), t4)

    m = measure(step, model)
    assert m.activation_bytes == 2 * 352 + 352 == 1056  # packed ever: both graphs
    assert m.resident_activation_bytes == 352  # only the returned loss's graph is left
    assert m.peak_activation_bytes == 704  # the batch-8 graph, alone


def test_a_storage_freed_and_its_address_reused_counts_again(model, data):
    x, target = data

    def step():
        F.mse_loss(model(x), target).backward()
        return F.mse_loss(model(x), target)  # new ReLU output and prediction, maybe at freed addresses

    m = measure(step, model)
    # x and the target live throughout: once; ReLU output (160) and prediction (48) twice
    assert m.activation_bytes == 96 + 48 + 2 * (160 + 48) == 560
    assert m.resident_activation_bytes == m.peak_activation_bytes == 352


def test_detached_subgraph_is_freed_at_once(model, data):
    x, target = data

    def step():
        model(x).detach()  # nothing reaches this graph afterwards: x (96) and the ReLU output (160) go
        return F.mse_loss(model(x), target)

    m = measure(step, model)
    assert m.activation_bytes == 96 + 160 + 160 + 48 + 48 == 512
    assert m.resident_activation_bytes == m.peak_activation_bytes == 352


def test_plain_backprop_resident_equals_peak_equals_packed(model, data):
    x, target = data
    m = measure(lambda: F.mse_loss(model(x), target), model)
    assert m.activation_bytes == m.resident_activation_bytes == m.peak_activation_bytes == 352


def test_resident_bytes_return_to_zero(model, data):
    x, target = data
    with saved_tensors(model) as rec:
        loss = F.mse_loss(model(x), target)
    assert rec.resident_activation_bytes == 352
    loss.backward()
    assert rec.resident_activation_bytes == 0 and rec.peak_activation_bytes == 352
    with saved_tensors(model) as rec:
        loss = F.mse_loss(model(x), target)
    del loss  # dropped without backward: the graph goes, and with it the saved tensors
    assert rec.resident_activation_bytes == 0


def test_gradients_are_bit_identical_under_measure(model, data):
    x, target = data
    ref = mlp([IN, HID, OUT], seed=0)
    F.mse_loss(ref(x), target).backward()
    measure(lambda: F.mse_loss(model(x), target), model)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad)


# --- the caller's own saved-tensor hooks --------------------------------------------------------
def _grads_with_hooks(pack, unpack, x, target):
    net = mlp([IN, HID, OUT], seed=0)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = F.mse_loss(net(x), target)
    loss.backward()
    return [p.grad for p in net.parameters()]


def test_half_precision_pack_counts_what_pack_returned(model, data):
    x, target = data
    calls = []

    def pack(t):
        calls.append(tuple(t.shape))
        return t.half()

    def unpack(h):
        return h.float()

    m = measure(lambda: F.mse_loss(model(x), target), model, pack=pack, unpack=unpack)
    # every save is a new half copy: the ReLU output, saved by ReLU and by Linear 2, twice
    assert m.activation_bytes == 2 * (B * IN + 2 * B * HID + B * OUT + B * OUT) == 256
    assert m.saved_bytes == 256 + 2 * HID * OUT  # W2ᵀ's half copy is still model state
    assert m.peak_activation_bytes == m.resident_activation_bytes == 256
    assert len(calls) == 6  # the pack hook really ran (inner hooks would have hidden it)
    for got, want in zip([p.grad for p in model.parameters()], _grads_with_hooks(pack, unpack, x, target)):
        assert torch.equal(got, want)  # the same computation as the hooks alone, bit for bit


def test_pack_returning_structures_with_bits_and_duplicates():
    """pack returns dicts/tuples; a sign mask packed 8 per byte; the same storage twice counts once."""
    x = torch.randn(4, 16, requires_grad=True)  # a leaf input: relu saves its (4, 16) output

    def pack(t):
        if t.dtype == torch.float32 and t.shape == (4, 16):
            bits = torch.tensor(np.packbits((t > 0).numpy(), axis=-1))  # (4, 2) uint8
            return {"bits": bits, "meta": ("relu", t.shape), "again": bits}
        return (t, t)  # identity, the same storage twice

    def unpack(p):
        if isinstance(p, dict):
            return torch.tensor(np.unpackbits(p["bits"].numpy(), axis=-1)).float()  # 0/1: enough for ReLU'
        return p[0]

    m = measure(lambda: torch.relu(x).sum(), pack=pack, unpack=unpack)
    assert m.activation_bytes == m.peak_activation_bytes == 4 * 2  # 8 bytes of bits instead of 256
    assert torch.equal(x.grad, (x > 0).float())


def test_pack_without_unpack_is_refused(model, data):
    x, target = data
    with pytest.raises(ValueError, match="together"):
        measure(lambda: F.mse_loss(model(x), target), model, pack=lambda t: t)
