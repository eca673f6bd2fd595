"""Chapter 5 bit-packing kernels against the PyTorch reference: in the interpreter on CPU, compiled on a GPU.

Sizes are not multiples of 8 nor of the block (1, 7, 1000, 4099 elements with blocks of 16 and 128 bytes),
so the masked tails of both kernels are exercised.
"""
import pytest
import torch

from coursekit import saved_tensors
from kernels.ch05_tinytl import (
    compare_with_reference, pack_mask_triton, pack_mask_torch, random_mask, relu_packed, unpack_mask_triton,
    unpack_mask_torch)

SIZES = [1, 7, 8, 9, 1000, 4099]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("block", [16, 128])
def test_triton_matches_reference(n, block):
    assert compare_with_reference(n, seed=n, block=block) == {"pack": True, "unpack": True, "bytes": True}


def test_reference_bit_order_by_hand():
    mask = torch.tensor([1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 1], dtype=torch.bool)  # 11 elements -> 2 bytes
    expected = torch.tensor([0b10000001, 0b110], dtype=torch.uint8)  # element 8k+j is bit j of byte k
    assert torch.equal(pack_mask_torch(mask), expected)
    assert torch.equal(pack_mask_triton(mask), expected)
    assert torch.equal(unpack_mask_torch(expected, 11), mask)
    assert torch.equal(unpack_mask_triton(expected, 11), mask)


def test_any_shape_packs_flat():
    mask = random_mask(3 * 5 * 7, seed=1).view(3, 5, 7)
    packed = pack_mask_triton(mask)
    assert packed.shape == (14,) and packed.dtype == torch.uint8
    out = unpack_mask_triton(packed, mask.numel())
    assert out.shape == (105,) and out.dtype == torch.bool and torch.equal(out, mask.reshape(-1))


def test_tail_bits_are_zero():
    packed = pack_mask_triton(torch.ones(1003, dtype=torch.bool))
    assert packed[-1].item() == 0b111  # 1003 = 125 * 8 + 3: only the three low bits are set


def test_empty_and_bad_inputs():
    assert pack_mask_triton(torch.zeros(0, dtype=torch.bool)).numel() == 0
    assert unpack_mask_triton(torch.zeros(0, dtype=torch.uint8), 0).numel() == 0
    with pytest.raises(ValueError, match="bool"):
        pack_mask_triton(torch.ones(4))
    with pytest.raises(ValueError, match="bytes"):
        unpack_mask_triton(torch.zeros(3, dtype=torch.uint8), 30)


@pytest.mark.parametrize("shape", [(1,), (7,), (4, 250), (3, 7, 13, 15)])
def test_relu_1bit_values_gradients_and_saved_bytes(shape):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g)
    x.view(-1)[::5] = 0.0  # ties at zero: torch.relu's gradient there is 0
    dy = torch.randn(*shape, generator=g)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    with saved_tensors() as rec:
        y = relu_packed(a)
    y.backward(dy)
    torch.relu(b).backward(dy)
    torch.testing.assert_close(y, torch.relu(x), rtol=0, atol=0)
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
    n = x.numel()
    assert rec.activation_bytes == -(-n // 8)
    assert [s.dtype for s in rec.tensors] == [torch.uint8]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n", [1, 4099, (1 << 22) + 5])
def test_gpu_matches_reference(n):
    assert compare_with_reference(n, seed=3, device="cuda") == {"pack": True, "unpack": True, "bytes": True}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_relu_1bit_uses_packed_mask():
    x = torch.randn(33, 129, device="cuda", requires_grad=True)
    with saved_tensors() as rec:
        y = relu_packed(x)
    y.backward(torch.ones_like(y))
    assert rec.activation_bytes == -(-x.numel() // 8)
    torch.testing.assert_close(x.grad, (x > 0).float(), rtol=0, atol=0)
