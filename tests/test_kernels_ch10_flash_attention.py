"""Chapter 10 Triton kernels against the PyTorch reference: in the interpreter on CPU, compiled on a GPU.

Shapes are not multiples of the block size (N = 100 and 70 with blocks of 32 and 16), so the masked
tails and the causal diagonal inside a block are exercised.
"""
import pytest
import torch

from kernels.ch10_flash_attention import (
    attention_reference, compare_with_reference, flash_attention, fused_attention_fwd)

TOL32 = 2e-5  # float32 tiles with IEEE dot products: only summation order differs from float64


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [16, 32])
def test_forward_and_backward_match_reference(causal, d):
    errors = compare_with_reference(B=1, H=2, N=100, d=d, causal=causal, block_m=32, block_n=32, seed=d)
    assert max(errors.values()) < TOL32, errors


@pytest.mark.parametrize("block_m, block_n", [(32, 16), (16, 32)])
def test_unequal_blocks_causal(block_m, block_n):
    """Rows fully masked inside a visited tile (block_m > block_n) and a diagonal crossing tiles."""
    errors = compare_with_reference(B=1, H=1, N=70, d=16, causal=True, block_m=block_m, block_n=block_n, seed=3)
    assert max(errors.values()) < TOL32, errors


def test_bfloat16_is_upcast_in_the_interpreter():
    errors = compare_with_reference(B=1, H=1, N=40, d=16, causal=True, dtype=torch.bfloat16, seed=4)
    assert max(errors.values()) < 5e-2, errors


def test_large_scores_stay_finite():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 1, 50, 16, generator=g) for _ in range(3))
    q = q * 60  # scores in the hundreds: exp overflows without the running max
    o, lse = fused_attention_fwd(q, k, v, causal=True)
    o_ref, lse_ref = attention_reference(q.double(), k.double(), v.double(), causal=True)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(o.double(), o_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lse.double(), lse_ref, atol=1e-3, rtol=1e-5)


def test_bad_head_dim_is_refused():
    x = torch.zeros(1, 1, 8, 24)
    with pytest.raises(ValueError, match="power of two"):
        fused_attention_fwd(x, x, x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_float32_matches_reference(causal):
    errors = compare_with_reference(B=2, H=3, N=1000, d=64, causal=causal, block_m=64, block_n=64, device="cuda")
    assert max(errors.values()) < 1e-4, errors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_half_precision_matches_reference(dtype):
    errors = compare_with_reference(B=2, H=3, N=1000, d=64, causal=True, block_m=64, block_n=64, dtype=dtype,
                                    device="cuda")
    assert max(errors.values()) < 5e-2, errors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_matches_torch_sdpa():
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, 777, 64, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(flash_attention(q, k, v, True, 64, 64), ref, atol=2e-3, rtol=2e-3)
