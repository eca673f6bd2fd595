"""PaCA's kernels of chapter 15 against their references: the NF4 encoder, the decode whose epilogue
writes the trainable columns over the weight, and dP by chapter 6's gather-GEMM.

On CPU the kernels run in Triton's interpreter (switched on by importing ``kernels``), on small shapes
that are not multiples of the launch block nor of the quantization block. GPU checks skip without CUDA.
"""

import math

import pytest
import torch

from kernels import ch08_quantization as k08
from kernels import ch15_paca as k15

CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("out_f, in_f, rank, block_size, BLOCK", [
    (1, 1, 1, 64, 128),  # one value: half a byte, one absmax, r = in
    (7, 9, 3, 4, 16),  # n = 63 odd: the last byte's low nibble is unused; blocks straddle rows
    (37, 53, 1, 64, 256),  # r = 1, awkward sizes, several programs, a partial last block
    (5, 13, 13, 10, 32),  # r = in: every element comes from cols
    (17, 33, 8, 7, 64),  # n = 561 odd, block size 7: quantization blocks start on odd elements
])
def test_kernels_match_references_in_interpreter(out_f, in_f, rank, block_size, BLOCK):
    err = k15.max_error(out_f, in_f, rank, block_size, tokens=3, seed=out_f + in_f, BLOCK=BLOCK)
    assert err["decode"] == 0.0  # the same float32 products and copies: bit for bit
    assert err["grad_p"] < 1e-5  # float32 against float64, sums of 3 products


def test_decode_overrides_exactly_the_columns_idx():
    w = torch.randn(6, 11, generator=torch.Generator().manual_seed(0))
    packed, absmax = k15.nf4_encode(w, block_size=5)
    idx = torch.tensor([9, 0, 4], dtype=torch.int32)  # unordered, int32 accepted
    cols = torch.arange(18, dtype=torch.float32).view(6, 3) + 100
    plain = k08.nf4_decode_torch(packed, absmax, k15.nf4_levels(), (6, 11), 5)
    for decode in (k15.nf4_decode_columns_torch, k15.nf4_decode_columns_triton):
        got = decode(packed, absmax, (6, 11), idx, cols, block_size=5)
        assert got.dtype == torch.float32 and got.shape == (6, 11)
        assert torch.equal(got[:, idx.long()], cols)
        others = [j for j in range(11) if j not in idx.tolist()]
        assert torch.equal(got[:, others], plain[:, others])
        # no column: chapter 8's decode unchanged
        empty = decode(packed, absmax, (6, 11), idx[:0].long(), cols[:, :0], block_size=5)
        assert torch.equal(empty, plain)


def test_reference_lets_autograd_reach_cols():
    packed, absmax = k15.nf4_encode(torch.randn(4, 6), block_size=8)
    cols = torch.randn(4, 2, requires_grad=True)
    k15.nf4_decode_columns_torch(packed, absmax, (4, 6), torch.tensor([5, 1]), cols, block_size=8).sum().backward()
    assert torch.equal(cols.grad, torch.ones(4, 2))


def _nearest_float64(x: torch.Tensor, block_size: int):
    """Straightforward reference: per block absmax, then the nearest level by brute force in float64."""
    flat = x.double().flatten()
    levels = k15.nf4_levels().double()
    codes, absmax = [], []
    for start in range(0, flat.numel(), block_size):
        block = flat[start:start + block_size]
        peak = block.abs().max()
        absmax.append(peak.item())
        scaled = block / (peak if peak > 0 else 1.0)
        codes += (scaled[:, None] - levels[None, :]).abs().argmin(dim=1).tolist()
    return codes, absmax


@pytest.mark.parametrize("shape, block_size", [((4, 64), 64), ((37, 53), 7), ((101,), 16), ((1,), 64),
                                               ((3, 5, 7), 10)])
def test_nf4_encode_matches_float64_nearest_level(shape, block_size):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape))) * 0.02
    if len(shape) == 2:
        x.view(-1)[:block_size] = 0.0  # an all-zero block
    packed, absmax = k15.nf4_encode(x, block_size)
    n = x.numel()
    assert packed.dtype == torch.uint8 and packed.shape == ((n + 1) // 2,)
    assert absmax.dtype == torch.float32 and absmax.shape == (-(-n // block_size),)
    codes, peaks = _nearest_float64(x, block_size)
    assert absmax.tolist() == torch.tensor(peaks, dtype=torch.float32).tolist()
    unpacked = torch.stack([packed >> 4, packed & 15], dim=1).flatten()
    assert unpacked[:n].tolist() == codes  # high nibble first
    assert n % 2 == 0 or unpacked[n] == 0  # the unused low nibble of an odd count
    if len(shape) == 2:
        assert set(unpacked[:block_size].tolist()) == {7}  # the level 0.0
    back = k08.nf4_decode_torch(packed, absmax, k15.nf4_levels(), shape, block_size)
    assert (back - x).abs().max() <= absmax.max() * 0.17  # half the widest gap between levels


def test_nf4_levels():
    levels = k15.nf4_levels()
    assert levels.shape == (16,) and (levels[1:] > levels[:-1]).all()
    assert levels[0] == -1 and levels[7] == 0 and levels[15] == 1
    assert abs(levels[8].item() - 0.07958029955625534) < 1e-7  # QLoRA's published table
    # The shipped constants are QLoRA's recipe: normal quantiles up to 1 - (1/32 + 1/30) / 2, scaled to [-1, 1].
    top = 1 - (1 / 32 + 1 / 30) / 2
    quantile = lambda p: math.sqrt(2) * torch.erfinv(2 * p - 1)  # noqa: E731
    pos = quantile(torch.linspace(0.5, top, 9, dtype=torch.float64))[1:]
    neg = quantile(torch.linspace(0.5, top, 8, dtype=torch.float64))[1:]
    want = torch.cat([-neg.flip(0) / neg.max(), torch.zeros(1, dtype=torch.float64), pos / pos.max()])
    assert torch.allclose(levels.double(), want, rtol=0, atol=1e-7)


def test_grad_p_flattened_tokens_and_empty_batch():
    gen = torch.Generator().manual_seed(3)
    g, x = torch.randn(2, 3, 5, generator=gen), torch.randn(2, 3, 9, generator=gen)
    idx = torch.tensor([8, 2, 5])
    want = 0.5 * torch.einsum("bto,bti->oi", g, x[..., idx])
    for grad_p in (k15.paca_grad_p, k15.paca_grad_p_torch):
        torch.testing.assert_close(grad_p(g.reshape(6, 5), x.reshape(6, 9), idx, 0.5), want)
        assert torch.equal(grad_p(g[:0, 0], x[:0, 0], idx, 0.5), torch.zeros(5, 3))


W4 = k15.nf4_encode(torch.randn(3, 4), block_size=4)


@pytest.mark.parametrize("change, message", [
    (dict(shape=(3, 4, 1)), "shape must be"),
    (dict(shape=(4, 4)), "packed"),
    (dict(absmax=torch.ones(2)), "absmax"),
    (dict(idx=torch.tensor([1, 1])), "distinct"),
    (dict(idx=torch.tensor([4])), "outside"),
    (dict(idx=torch.tensor([1.0])), "int64"),
    (dict(cols=torch.zeros(3, 2)), "cols must be"),
    (dict(block_size=0), "block_size"),
])
def test_decode_rejects_bad_input(change, message):
    args = dict(packed=W4[0], absmax=W4[1], shape=(3, 4), idx=torch.tensor([2]), cols=torch.zeros(3, 1),
                block_size=4) | change
    for decode in (k15.nf4_decode_columns_torch, k15.nf4_decode_columns_triton):
        with pytest.raises(ValueError, match=message):
            decode(**args)


@pytest.mark.parametrize("change, message", [
    (dict(g=torch.zeros(4, 3)), "same M"),
    (dict(x=torch.zeros(5, 6, 1)), "same M"),
    (dict(x=torch.zeros(5, 6, dtype=torch.float64)), "dtype"),
    (dict(idx=torch.tensor([6])), "outside"),
    (dict(idx=torch.tensor([[1]])), "1-D"),
    (dict(scale=torch.tensor(2.0)), "scale"),
])
def test_grad_p_rejects_bad_input(change, message):
    args = dict(g=torch.zeros(5, 3), x=torch.zeros(5, 6), idx=torch.tensor([1, 4]), scale=2.0) | change
    for grad_p in (k15.paca_grad_p, k15.paca_grad_p_torch):
        with pytest.raises(ValueError, match=message):
            grad_p(**args)


@pytest.mark.parametrize("w, block_size, message", [
    (torch.ones(4, dtype=torch.int32), 64, "floating-point"),
    (torch.ones(4), 0, "block_size"),
    (torch.tensor([1.0, float("nan")]), 64, "finite"),
])
def test_encode_rejects_bad_input(w, block_size, message):
    with pytest.raises(ValueError, match=message):
        k15.nf4_encode(w, block_size)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("out_f, in_f, rank", [(4097, 1031, 64), (1000, 999, 999)])
def test_kernels_match_references_on_gpu(out_f, in_f, rank):
    err = k15.max_error(out_f, in_f, rank, tokens=300, device="cuda")
    assert err["decode"] == 0.0 and err["grad_p"] < 1e-3


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_benchmark_runs():
    res = k15.benchmark(1024, 1536, 16, tokens=512)
    assert set(res) == {"decode triton", "decode+copy", "decode pytorch", "grad_p triton", "grad_p pytorch"}
    assert all(v > 0 for v in res.values())
