"""Triton kernels of the course, one file per chapter (``kernels/chNN_name.py``).

Each file follows the same order: docstring (what it computes, what it teaches) → plain
PyTorch reference with a comment on bytes moved → ``@triton.jit def _name_kernel`` →
launcher → optional ``autograd.Function`` → tests → benchmark.

Without a GPU the kernels run in Triton's interpreter. It must be switched on *before* a
kernel is defined, which is what importing this package does when CUDA is absent (set
``TRITON_INTERPRET=0`` yourself to opt out).
"""
import os


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return False
    return torch.cuda.is_available()


if "TRITON_INTERPRET" not in os.environ and not _cuda_available():
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRETED: bool = os.environ.get("TRITON_INTERPRET") == "1"
