"""The NF4 dequantize kernel of chapter 8 against its PyTorch reference.

On CPU the kernel runs in Triton's interpreter (switched on by importing ``kernels``); sizes are
not multiples of the launch block nor of the quantization block. GPU checks skip without CUDA.
"""

import pytest
import torch

from kernels import ch08_quantization as k08

CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("shape, block_size, BLOCK", [
    ((1,), 64, 128),  # one value: half a byte, one absmax
    ((7,), 4, 128),  # odd: the last byte's low nibble is unused
    ((1000,), 64, 256),  # 1000 = 3 * 256 + 232 and 15 * 64 + 40
    ((37, 53), 64, 1024),  # awkward 2-D shape, several programs
    ((3, 5, 7), 10, 32),  # quantization blocks that straddle bytes (odd block start)
])
def test_kernel_matches_reference_in_interpreter(shape, block_size, BLOCK):
    assert k08.max_error(shape, block_size, BLOCK, seed=sum(shape)) == 0.0


def test_kernel_uses_high_nibble_first():
    packed = torch.tensor([0x0F], dtype=torch.uint8)  # codes 0 then 15
    codebook = torch.arange(16, dtype=torch.float32)
    out = k08.nf4_decode_triton(packed, torch.tensor([2.0]), codebook, (2,), block_size=64)
    assert out.tolist() == [0.0, 30.0]


@pytest.mark.parametrize("n_packed, n_absmax, n_codes, message", [
    (3, 2, 16, "packed bytes"), (4, 1, 16, "absmax values"), (4, 2, 15, "16 entries")])
def test_launcher_rejects_inconsistent_sizes(n_packed, n_absmax, n_codes, message):
    with pytest.raises(ValueError, match=message):
        k08.nf4_decode_triton(torch.zeros(n_packed, dtype=torch.uint8), torch.ones(n_absmax), torch.zeros(n_codes),
                           (7,), block_size=4)




@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("shape, block_size", [((4097, 1031), 64), ((12345,), 32)])
def test_kernel_matches_reference_on_gpu(shape, block_size):
    assert k08.max_error(shape, block_size, device="cuda") == 0.0


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_gpu_bandwidth_benchmark_runs():
    gbs = k08.benchmark(1 << 22)
    assert set(gbs) == {"triton", "pytorch"} and all(v > 0 for v in gbs.values())
