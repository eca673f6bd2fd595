"""`make bench` runs every declared chapter kernel's benchmark, and each one skips cleanly without CUDA."""
import subprocess
import sys

import pytest
import torch

from coursekit.bench import kernel_benchmarks
from grader.chapters import kernel_modules


def test_every_chapter_kernel_has_a_benchmark():
    """The kernels the chapters declare are exactly the kernel modules with a benchmark."""
    assert kernel_benchmarks() == kernel_modules()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message printed without CUDA")
@pytest.mark.parametrize("module", kernel_benchmarks())
def test_kernel_benchmark_skips_without_cuda(module):
    proc = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "CUDA not available: skipped" in proc.stdout
