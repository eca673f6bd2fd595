"""Small pretrained checkpoints that ship with the course in ``data/checkpoints/``.

Each checkpoint is a plain ``state_dict`` (tensors only), loaded with ``weights_only=True``
so that opening it cannot run code. Its architecture comes from :data:`PRETRAINED`, not
from the file. ``make checkpoints`` (``python -m coursekit.pretrain``) regenerates them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from coursekit.data import TaskConfig
from coursekit.transformer import GPTConfig, TinyGPT

CHECKPOINT_DIR = Path(__file__).resolve().parents[1] / "data" / "checkpoints"


@dataclass(frozen=True)
class PretrainedSpec:
    model: GPTConfig  # architecture the weights belong to
    task: TaskConfig  # data the model was pretrained on (vocabulary must match the model's)
    rule: str  # the recurrence of coursekit.data it was pretrained on
    min_accuracy: float  # next-token accuracy on the source task that the checkpoint reaches


PRETRAINED: dict[str, PretrainedSpec] = {
    # 2-layer TinyGPT trained on s_t = s_{t-1} + s_{t-2} mod 16 (coursekit.data's source task).
    "tinygpt_fibonacci": PretrainedSpec(
        model=GPTConfig(vocab_size=16, context=32, d_model=64, n_heads=4, n_layers=2),
        task=TaskConfig(vocab_size=16, length=32, noise=0.2),
        rule="fibonacci",
        min_accuracy=0.99,
    ),
    # The same TinyGPT with 4 blocks (8 residual sublayers), on the same source task: drop rates
    # and per-sublayer choices (DropBP, PaCA) are less coarse than over 4 sublayers.
    "tinygpt4_fibonacci": PretrainedSpec(
        model=GPTConfig(vocab_size=16, context=32, d_model=64, n_heads=4, n_layers=4),
        task=TaskConfig(vocab_size=16, length=32, noise=0.2),
        rule="fibonacci",
        min_accuracy=0.99,
    ),
}


def checkpoint_path(name: str) -> Path:
    if name not in PRETRAINED:
        raise ValueError(f"unknown checkpoint {name!r}: expected one of {sorted(PRETRAINED)}")
    return CHECKPOINT_DIR / f"{name}.pt"


def load_pretrained(name: str = "tinygpt_fibonacci") -> TinyGPT:
    """Build the model of checkpoint ``name`` and load its weights from ``data/checkpoints``.

    Returns:
        A :class:`~coursekit.transformer.TinyGPT` in train mode, every parameter trainable.

    Raises:
        FileNotFoundError: the file is missing (regenerate it with ``make checkpoints``).
    """
    path = checkpoint_path(name)
    if not path.exists():
        raise FileNotFoundError(
            f"checkpoint {path} is missing: run `make checkpoints` (python -m coursekit.pretrain) "
            "from the repository root to create it")
    state = torch.load(path, map_location="cpu", weights_only=True)
    model = TinyGPT(PRETRAINED[name].model)
    model.load_state_dict(state)
    return model
