"""Regenerate the pretrained checkpoints: ``python -m coursekit.pretrain`` (or ``make checkpoints``).

Deterministic: fixed seeds for the data, the initialisation and the batch order (results can
still differ in the last bits across CPUs and thread counts). About a minute and a half for the
2-block TinyGPT on a 2-core CPU; the 4-block one took 16 minutes on one thread of a busy 2-core
machine.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from coursekit.checkpoints import PRETRAINED, checkpoint_path
from coursekit.data import batches, make_task
from coursekit.transformer import TinyGPT, accuracy, lm_loss


@dataclass
class PretrainConfig:
    # The source task is solved (100%) after ~1000 steps; in our trials the checkpoints trained on
    # well past that (under weight decay) were the ones that adapted easily to the target task.
    steps: int = 5000
    batch_size: int = 64  # sequences per step
    lr: float = 3e-3  # peak of the one-cycle schedule
    weight_decay: float = 0.01
    n_train: int = 20_000  # training sequences (sampled with replacement across steps)
    n_eval: int = 2_000  # held-out sequences for the reported accuracy
    seed: int = 0  # initialisation and batch order; data use seed + 1 and seed + 2


def pretrain(name: str, cfg: PretrainConfig | None = None) -> tuple[TinyGPT, float]:
    """Train checkpoint ``name`` of :data:`~coursekit.checkpoints.PRETRAINED` from scratch.

    Returns:
        The trained model and its next-token accuracy on held-out source sequences.
    """
    cfg = cfg or PretrainConfig()
    spec = PRETRAINED[name]
    train = make_task(spec.rule, cfg.n_train, cfg.seed + 1, spec.task)
    held_out = make_task(spec.rule, cfg.n_eval, cfg.seed + 2, spec.task)
    torch.manual_seed(cfg.seed)
    model = TinyGPT(spec.model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.steps, pct_start=0.1)
    bar = tqdm(batches(train, cfg.batch_size, cfg.steps, seed=cfg.seed), total=cfg.steps, desc=name)
    for step, (x, y) in enumerate(bar):
        loss = lm_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}")
    return model, accuracy(model, held_out.x, held_out.y)


CNN = "transfer_cnn_digits"  # the TransferCNN of ch04/ch05 (coursekit.transfer), about 10 s
CNN_MIN_ACCURACY = 0.98
MOBILENET = "transfer_mobilenet_digits"  # the TransferMobileNet of ch05 (coursekit.transfer), about 30 s
MOBILENET_MIN_ACCURACY = 0.97


def _save(name: str, model: torch.nn.Module, acc: float, min_accuracy: float, path: Path) -> None:
    """Write ``model``'s weights to ``path`` unless its source accuracy fell short."""
    if acc < min_accuracy:
        raise RuntimeError(f"{name}: source accuracy {acc:.4f} is below the expected {min_accuracy}; "
                           "not overwriting the checkpoint")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB, {n_params:,} parameters, "
          f"source-task accuracy {acc:.4f})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    choices = sorted(PRETRAINED) + [CNN, MOBILENET]
    parser.add_argument("names", nargs="*", default=choices,
                        help=f"checkpoints to regenerate (default: all of {choices})")
    args = parser.parse_args(argv)
    for name in args.names:
        if name == CNN:
            from coursekit.transfer import CHECKPOINT, pretrain_cnn

            model, acc = pretrain_cnn()
            _save(name, model, acc, CNN_MIN_ACCURACY, CHECKPOINT)
        elif name == MOBILENET:
            from coursekit.transfer import MOBILENET_CHECKPOINT, pretrain_mobilenet

            model, acc = pretrain_mobilenet()
            _save(name, model, acc, MOBILENET_MIN_ACCURACY, MOBILENET_CHECKPOINT)
        else:
            model, acc = pretrain(name)
            _save(name, model, acc, PRETRAINED[name].min_accuracy, checkpoint_path(name))


if __name__ == "__main__":
    main()
