"""``make bench``: time one training step of the course's models (slow; never part of tests).

For each model and batch size: activation bytes and FLOPs (exact, from ``measure``) beside
the median wall time of forward + backward over a few repeats, on the CPU and, when CUDA
is present, on the GPU with its peak allocated bytes. Use it to see that FLOPs and bytes
predict time only roughly on a CPU. Then every chapter kernel's own benchmark
(``python -m kernels.chNN_name``: Triton against PyTorch on a GPU; each says "skipped" without CUDA).
``make bench`` runs ``python -m grader bench``, which passes the kernels the chapters declare.
"""
from __future__ import annotations

import importlib
import pkgutil
import statistics
import time

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from coursekit.measure import measure
from coursekit.models import SmallCNN, SmallDSCNN, mlp
from coursekit.transformer import GPTConfig, TinyGPT, lm_loss


def _cases(device: str):
    g = torch.Generator().manual_seed(0)
    for batch in (16, 64, 256):
        model = mlp([64, 512, 512, 512, 10]).to(device)
        x, y = torch.randn(batch, 64, generator=g).to(device), torch.randn(batch, 10, generator=g).to(device)
        yield "MLP 64-512x3-10", batch, model, (lambda m=model, x=x, y=y: F.mse_loss(m(x), y))
        for cls in (SmallCNN, SmallDSCNN):
            model = cls().to(device)
            img = torch.randn(batch, 1, 8, 8, generator=g).to(device)
            labels = torch.randint(0, 10, (batch,), generator=g).to(device)
            yield cls.__name__, batch, model, (lambda m=model, x=img, t=labels: F.cross_entropy(m(x), t))
        model = TinyGPT(GPTConfig()).to(device)
        idx = torch.randint(0, 16, (batch, 32), generator=g).to(device)
        yield "TinyGPT", batch, model, (lambda m=model, i=idx: lm_loss(m(i[:, :-1]), i[:, 1:]))


def _time(step, device: str, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])  # the first run warms up


def main(kernel_modules: list[str] | None = None) -> None:
    """Time the models, then run each kernel module's ``main()`` (default: every chapter kernel
    found in the ``kernels`` package; ``python -m grader bench`` passes the chapters' declared ones)."""
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if len(devices) == 1:
        print("CUDA not available: GPU rows skipped.")
    header = f"{'device':<6} {'model':<18} {'batch':>5} {'activations':>12} {'GFLOP':>8} {'ms/step':>9} {'peak MiB':>9}"
    rows = []
    cases = [(d, *c) for d in devices for c in _cases(d)]
    for device, name, batch, model, step in tqdm(cases, desc="bench"):
        m = measure(step, model)
        ms = 1000 * _time(step, device)
        peak = "" if m.peak_cuda_bytes is None else f"{m.peak_cuda_bytes / 2**20:.1f}"
        rows.append(f"{device:<6} {name:<18} {batch:>5} {m.activation_bytes / 2**20:>9.2f} MiB "
                    f"{m.total_flops / 1e9:>8.3f} {ms:>9.2f} {peak:>9}")
    print(header)
    print("\n".join(rows))
    for name in kernel_benchmarks() if kernel_modules is None else kernel_modules:
        print(f"\n== {name} ==")
        importlib.import_module(name).main()


def kernel_benchmarks() -> list[str]:
    """The chapter kernel modules (``kernels/chNN_*.py``) that define a ``main()`` benchmark."""
    import kernels

    names = sorted(m.name for m in pkgutil.iter_modules(kernels.__path__) if m.name.startswith("ch"))
    return [f"kernels.{n}" for n in names if hasattr(importlib.import_module(f"kernels.{n}"), "main")]


if __name__ == "__main__":
    main()
