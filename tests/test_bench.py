"""`make bench` finds every chapter kernel's benchmark, and each one skips cleanly without CUDA."""
import subprocess
import sys

import pytest
import torch

from coursekit.bench import kernel_benchmarks


def test_every_chapter_kernel_has_a_benchmark():
    assert kernel_benchmarks() == ["kernels.ch05_tinytl", "kernels.ch06_sparse_backprop", "kernels.ch08_quantization",
                                   "kernels.ch10_flash_attention"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message printed without CUDA")
@pytest.mark.parametrize("module", kernel_benchmarks())
def test_kernel_benchmark_skips_without_cuda(module):
    proc = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "CUDA not available: skipped" in proc.stdout
