"""Chapter 6 gather-GEMM against the PyTorch reference: in the interpreter on CPU, compiled on a GPU.

Shapes are not multiples of the blocks (37, 53, 29, 1 against blocks of 16 and 32), index vectors
are random (unsorted, some with repeats), and ``a`` is sometimes a transposed view, as in the sparse
backward ``g[:, I]ᵀ x``.
"""
import pytest
import torch

from kernels.ch06_sparse_backprop import gather_matmul, gather_matmul_reference, max_error, random_case

CASES = [  # (M0, K0, N0, len(rows), len(inner), len(cols))
    (37, 53, 29, None, 8, None),  # dx = g[:, I] W[I, :]
    (53, 37, 29, 8, None, None),  # dW_I = g[:, I]ᵀ x (a = gᵀ)
    (37, 29, 53, None, None, 13),  # weight gradient over selected columns
    (37, 53, 29, 5, 7, 11),  # all three at once
    (37, 53, 29, None, None, None),  # a plain product
    (1, 1, 1, 1, 1, 1),
    (3, 70, 2, None, 65, None),  # K spans three blocks of 32 with a tail
]


@pytest.mark.parametrize("shape", CASES)
@pytest.mark.parametrize("block", [16, 32])
def test_triton_matches_reference(shape, block):
    case = random_case(*shape, seed=sum(s or 0 for s in shape), transpose_a=shape[3] is not None)
    assert max_error(case, block_m=block, block_n=block, block_k=block) < 1e-5


def test_sparse_linear_backward_identities():
    """The two products of the unified sparse backward equal the dense ones on the kept units."""
    g_ = torch.Generator().manual_seed(0)
    x, w, g = torch.randn(37, 29, generator=g_), torch.randn(53, 29, generator=g_), torch.randn(37, 53, generator=g_)
    idx = g.abs().sum(0).topk(8).indices
    g_kept = torch.zeros_like(g).index_copy(1, idx, g[:, idx])
    torch.testing.assert_close(gather_matmul(g, w, inner=idx), g_kept @ w, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gather_matmul(g.t(), x, rows=idx), (g_kept.t() @ x)[idx], atol=1e-5, rtol=1e-5)


def test_repeated_indices_and_int32():
    case = random_case(37, 53, 29, None, None, None, seed=3)
    inner = torch.tensor([5, 5, 0, 52, 17], dtype=torch.int32)
    got = gather_matmul(case["a"], case["b"], inner=inner, block_k=16)
    torch.testing.assert_close(got, gather_matmul_reference(case["a"], case["b"], inner=inner.long()))


def test_bfloat16_within_two_units_of_rounding():
    case = random_case(37, 53, 29, None, 20, None, seed=4, dtype=torch.bfloat16)
    got = gather_matmul(**case)
    assert got.dtype == torch.bfloat16
    exact = gather_matmul_reference(case["a"].double(), case["b"].double(), inner=case["inner"])
    # float32 accumulation, then the result rounded to bf16 (the interpreter's cast may round
    # toward zero: two units of 2**-8 relative)
    assert ((got.double() - exact).abs() <= exact.abs() * 2**-7 + 1e-6).all()


def test_empty_selections():
    case = random_case(7, 9, 5, None, None, None)
    assert gather_matmul(case["a"], case["b"], rows=torch.zeros(0, dtype=torch.long)).shape == (0, 5)
    assert torch.equal(gather_matmul(case["a"], case["b"], inner=torch.zeros(0, dtype=torch.long)), torch.zeros(7, 5))


@pytest.mark.parametrize("bad, message", [
    (dict(b=torch.randn(8, 5)), "inner dimensions"),
    (dict(inner=torch.tensor([0.0])), "integer"),
    (dict(rows=torch.tensor([7])), "outside"),
    (dict(block_m=24), "power of two"),
])
def test_bad_inputs(bad, message):
    args = dict(a=torch.randn(7, 9), b=torch.randn(9, 5))
    args.update(bad)
    with pytest.raises(ValueError, match=message):
        gather_matmul(**args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 0.5)])
def test_gpu_matches_reference(dtype, tol):
    for shape in CASES + [(1000, 4099, 513, None, 100, None)]:
        case = random_case(*shape, seed=1, dtype=dtype, device="cuda", transpose_a=shape[3] is not None)
        assert max_error(case) < tol
