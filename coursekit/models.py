"""Tiny models sized for a 2-core CPU, with fixed-seed constructors.

Every constructor takes ``seed`` and initialises its weights from it without touching the
global random state, so two calls with the same arguments return identical models.

* :func:`mlp`: a stack of ``nn.Linear`` / ``nn.ReLU`` for regression steps.
* :class:`SmallCNN`: conv blocks (Conv → BatchNorm → ReLU) for the 8×8 scikit-learn digits.
* :class:`SmallDSCNN`: the same network with depthwise-separable convolutions after the stem:
  several times fewer parameters, about as many activations (the TinyTL observation).

Both CNNs keep their blocks in ``self.blocks`` (an ``nn.ModuleList``) and end in
``self.classifier`` (an ``nn.Linear``), so later chapters can wrap or freeze block by block.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Sequence

import torch
from torch import nn


@contextmanager
def _seeded(seed: int):
    """Initialise from ``seed`` inside a forked CPU random state: reproducible, and the
    caller's global random stream is left exactly where it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _check_widths(name: str, values: Sequence[int], min_len: int) -> list[int]:
    values = list(values)
    if len(values) < min_len:
        raise ValueError(f"{name} needs at least {min_len} entries, got {values}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be positive integers, got {values}")
    return values


def mlp(sizes: Sequence[int], bias: bool = True, seed: int = 0) -> nn.Sequential:
    """Linear/ReLU stack: ``mlp([in, h1, ..., out])``, no ReLU after the last Linear.

    Args:
        sizes: feature sizes, at least two: input, hidden..., output.
        bias: give every Linear a bias.
        seed: initialisation seed.

    Returns:
        ``nn.Sequential`` mapping (B, sizes[0]) → (B, sizes[-1]).
    """
    sizes = _check_widths("sizes", sizes, 2)
    layers: list[nn.Module] = []
    with _seeded(seed):
        for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            if i:
                layers.append(nn.ReLU())
            layers.append(nn.Linear(n_in, n_out, bias=bias))
    return nn.Sequential(*layers)


def conv_bn_relu(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
    """3×3 convolution → BatchNorm → ReLU: (B, c_in, H, W) → (B, c_out, H/stride, W/stride)."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),  # BN supplies the bias
        nn.BatchNorm2d(c_out),
        nn.ReLU(),
    )


def ds_conv_bn_relu(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
    """Depthwise-separable block, same shapes as :func:`conv_bn_relu`.

    Depthwise 3×3 (one filter per channel: 9·c_in weights) → pointwise 1×1 (c_in·c_out
    weights) → BatchNorm → ReLU, instead of 9·c_in·c_out weights for a full 3×3 conv. As in
    Xception's separable convolution there is no norm or ReLU between the two convolutions;
    the depthwise output is still one more tensor that autograd must keep for backward.
    """
    return nn.Sequential(
        nn.Conv2d(c_in, c_in, 3, stride=stride, padding=1, groups=c_in, bias=False),
        nn.Conv2d(c_in, c_out, 1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(),
    )


class SmallCNN(nn.Module):
    """Conv blocks for 8×8 greyscale digits: (B, 1, 8, 8) → logits (B, num_classes).

    Args:
        widths: output channels of each block.
        strides: stride of each block (2 halves the resolution).
        num_classes: outputs of the final ``classifier``.
        seed: initialisation seed.

    With the defaults the early blocks hold most activations (8×8 maps) and the late
    blocks most parameters (many channels at 2×2): memory and parameters live in
    different places.
    """

    separable = False

    def __init__(self, widths: Sequence[int] = (16, 32, 64, 128), strides: Sequence[int] = (1, 1, 2, 2),
                 num_classes: int = 10, seed: int = 0):
        super().__init__()
        widths = _check_widths("widths", widths, 1)
        strides = _check_widths("strides", strides, 1)
        if len(widths) != len(strides):
            raise ValueError(f"widths and strides must have the same length, got {len(widths)} and {len(strides)}")
        blocks = []
        c_in = 1
        with _seeded(seed):
            for i, (c_out, s) in enumerate(zip(widths, strides)):
                blocks.append(self.make_block(i, c_in, c_out, s))
                c_in = c_out
            self.blocks = nn.ModuleList(blocks)
            self.classifier = nn.Linear(c_in, num_classes)

    def make_block(self, index: int, c_in: int, c_out: int, stride: int) -> nn.Module:
        """Block ``index``: (B, c_in, H, W) → (B, c_out, H/stride, W/stride). Subclasses override it."""
        # The stem (1 input channel) is a full conv in both variants: a depthwise conv over a
        # single channel would be a 3×3 filter and nothing else.
        make = ds_conv_bn_relu if (self.separable and index > 0) else conv_bn_relu
        return make(c_in, c_out, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 1, 8, 8) → (B, num_classes)
        for block in self.blocks:
            x = block(x)
        return self.classifier(x.mean(dim=(2, 3)))  # global average pool: (B, C, h, w) → (B, C)


class SmallDSCNN(SmallCNN):
    """:class:`SmallCNN` with depthwise-separable blocks after the stem (same shapes)."""

    separable = True
