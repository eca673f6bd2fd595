"""Chapter 13's AQ kernels (pack and unpack) against their PyTorch reference and an independent re-derivation.

On CPU the kernels run in Triton's interpreter (switched on by importing ``kernels``). Sizes are not multiples
of the run length, of the group size nor of the unpack block (37 x 53, 1000, 5, 513, 3 x 5 x 7 elements;
runs of 3, 4 and 5; groups of 12, 20, 32 and 128 means; blocks of 128), so every masked tail is exercised.
GPU checks skip without CUDA.
"""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from kernels.ch13_alam import (
    aq_pack_torch, aq_pack_triton, aq_unpack_torch, aq_unpack_triton, benchmark, compare_with_reference,
    random_inputs)

CUDA = torch.cuda.is_available()
ALL_EQUAL = {"codes": True, "mins": True, "scales": True, "unpack": True}


@pytest.mark.parametrize("shape, average, group_size", [
    ((37, 53), 4, 128),  # 1961 elements: a remainder of 1, 491 means in 4 groups, the last partial
    ((1000,), 4, 128),  # 250 means: one full group and one of 122
    ((5,), 4, 128),  # two means, the second over one element
    ((513,), 4, 128),  # 129 means: a last group of one mean (constant)
    ((3, 5, 7), 3, 32),  # runs of 3 (tile padded to 4 columns), remainder 0
    ((1001,), 5, 20),  # runs of 5 (padded to 8), groups of 20 (not a power of two)
    ((2, 6), 4, 12),
])
def test_triton_matches_reference_bit_for_bit(shape, average, group_size):
    assert compare_with_reference(shape, average, group_size, seed=sum(shape), BLOCK=128) == ALL_EQUAL


def _independent_pack(values, noise, average, group_size):
    """The layout re-derived with NumPy float32 scalars and Python loops, one element at a time."""
    f32 = np.float32
    n = len(values)
    means = []
    for start in range(0, n, average):
        run = values[start:start + average]
        total = f32(run[0])
        for v in run[1:]:
            total = f32(total + f32(v))  # left to right
        means.append(f32(total / f32(len(run))))
    codes_per_position, mins, scales = [], [], []
    for start in range(0, len(means), group_size):
        group = means[start:start + group_size]
        lo, hi = min(group), max(group)
        scale = f32(f32(3) / f32(f32(hi - lo) + f32(2e-6)))
        mins.append(lo)
        scales.append(scale)
        for i, mean in enumerate(group):
            q = math.floor(f32(f32(f32(mean - lo) * scale) + f32(noise[start + i])))
            codes_per_position.append(min(max(q, 0), 3))
        codes_per_position += [0] * (group_size - len(group))  # the padding of a partial group
    packed = []
    for j in range(0, len(codes_per_position), 4):
        byte = 0
        for i in range(4):
            byte |= codes_per_position[j + i] << (2 * i)  # position 4j + i in bits [2i, 2i + 2)
        packed.append(byte)
    return packed, [float(v) for v in mins], [float(v) for v in scales], means


@pytest.mark.parametrize("pack", [aq_pack_torch, aq_pack_triton], ids=["torch", "triton"])
def test_pack_matches_an_independent_derivation(pack):
    x, noise = random_inputs((59,), average=4, seed=5)  # 15 means (the last of 3 elements), groups of 8
    codes, mins, scales = pack(x, noise, 4, 8)
    want_codes, want_mins, want_scales, means = _independent_pack(x.tolist(), noise.tolist(), 4, 8)
    assert codes.dtype == torch.uint8 and codes.shape == (4,)
    assert mins.dtype == scales.dtype == torch.float32 and mins.shape == scales.shape == (2,)
    assert codes.tolist() == want_codes and mins.tolist() == want_mins and scales.tolist() == want_scales
    out = aq_unpack_triton(codes, mins, scales, (59,), 4, 8, BLOCK=16)
    for p in range(59):  # element p: q / scale + min of mean p // 4
        mean = p // 4
        q = (want_codes[mean // 4] >> (2 * (mean % 4))) & 3
        g = mean // 8
        assert out[p].item() == float(np.float32(np.float32(q) / np.float32(want_scales[g])) + np.float32(want_mins[g]))


def test_packed_layout_by_hand():
    x = torch.tensor([0.0] * 4 + [1.0] * 4 + [2.0] * 4 + [3.0] * 4 + [3.0, 3.0])  # means 0, 1, 2, 3 and 3
    noise = torch.full((5,), 0.5)
    for pack in (aq_pack_torch, aq_pack_triton):
        codes, mins, scales = pack(x, noise, 4, 4)
        assert codes.tolist() == [0 | 1 << 2 | 2 << 4 | 3 << 6, 0]  # least significant bits first; padding 0
        assert mins.tolist() == [0.0, 3.0]
        for unpack in (aq_unpack_torch, aq_unpack_triton):
            out = unpack(codes, mins, scales, (18,), 4, 4)
            torch.testing.assert_close(out, x, rtol=0, atol=1e-5)


def test_means_are_summed_left_to_right():
    x = torch.tensor([1e8, 1.0, -1e8, 1.0])  # ((1e8 + 1) - 1e8) + 1 = 1 in float32; other orders give 0 or 2
    for pack in (aq_pack_torch, aq_pack_triton):
        assert pack(x, torch.zeros(1), 4, 128)[1].item() == 0.25


def test_constant_group_and_fewer_elements_than_average():
    x, noise = torch.full((6, 7), -1.5), torch.rand(11)
    for pack in (aq_pack_torch, aq_pack_triton):
        codes, mins, scales = pack(x, noise)
        assert torch.isfinite(scales).all() and codes.eq(0).all() and mins.tolist() == [-1.5]
        assert torch.equal(aq_unpack_triton(codes, mins, scales, x.shape), x)
    x = torch.tensor([[1.0, 2.0, 6.0]])  # 3 < average: one mean over 3 elements
    got, want = aq_pack_triton(x, torch.tensor([0.3])), aq_pack_torch(x, torch.tensor([0.3]))
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and got[1].tolist() == [3.0] and got[0].shape == (32,)
    assert aq_unpack_triton(*got, (1, 3)).tolist() == [[3.0, 3.0, 3.0]]


def test_other_dtypes_and_noise_shapes():
    x = torch.randn(9, 11, dtype=torch.float64)
    noise = torch.rand(5, 5)  # 25 means: any shape with M elements
    got = aq_pack_triton(x, noise)
    want = aq_pack_torch(x.float(), noise.reshape(-1))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    out = aq_unpack_triton(*got, torch.Size([9, 11]))
    assert out.dtype == torch.float32 and out.shape == (9, 11)


@pytest.mark.parametrize("call, message", [
    (lambda: aq_pack_triton(torch.randn(10), torch.rand(2)), "3 values"),
    (lambda: aq_pack_triton(torch.randn(10), torch.rand(10), average=0), "average"),
    (lambda: aq_pack_triton(torch.randn(10), torch.rand(3), group_size=6), "multiple of 4"),
    (lambda: aq_pack_triton(torch.zeros(0), torch.rand(0)), "empty"),
    (lambda: aq_pack_torch(torch.arange(8), torch.rand(2)), "floating-point"),
    (lambda: aq_unpack_triton(torch.zeros(31, dtype=torch.uint8), torch.zeros(1), torch.ones(1), (10,)), "32 bytes"),
    (lambda: aq_unpack_torch(torch.zeros(32, dtype=torch.uint8), torch.zeros(2), torch.ones(2), (10,)), "1 mins"),
])
def test_bad_inputs_raise_value_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape, average, group_size", [((4097, 1031), 4, 128), ((12345,), 3, 32), ((7,), 4, 128)])
@pytest.mark.parametrize("dyadic", [True, False])
def test_gpu_matches_reference_bit_for_bit(shape, average, group_size, dyadic):
    assert compare_with_reference(shape, average, group_size, seed=7, device="cuda", dyadic=dyadic) == ALL_EQUAL


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_bandwidth_benchmark_runs():
    gbs = benchmark(1 << 22)
    assert set(gbs) == {"pack triton", "pack pytorch", "unpack triton", "unpack pytorch"}
    assert all(v > 0 for v in gbs.values())


@pytest.mark.skipif(CUDA, reason="the interpreter runs only without CUDA")
def test_triton_imported_before_the_interpreter_is_a_clear_error():
    code = ("import triton, torch\nfrom kernels.ch13_alam import aq_pack_triton\n"
            "aq_pack_triton(torch.ones(8), torch.zeros(2))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0 and "import kernels (or coursekit) before triton" in proc.stderr
