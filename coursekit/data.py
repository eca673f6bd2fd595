"""Small synthetic token tasks, generated from a seed (nothing is downloaded).

Each sequence follows a two-token recurrence modulo the vocabulary size V::

    s_0, s_1 random;   s_t = rule(s_{t-1}, s_{t-2}) mod V,   except that with probability
    ``noise`` s_t is a random token instead.

The noise makes every sequence different and forces the model to read the two previous
tokens (a clean sequence would be fixed by its first two). Only tokens produced by the rule
are scored: their target is the token; every other target is -100 (ignored by the loss).

* The *source* task (pretraining) is Fibonacci: ``s_t = s_{t-1} + s_{t-2}``.
* The *target* task (fine-tuning) is Pell: ``s_t = 2 s_{t-1} + s_{t-2}``. The input
  distribution and what to look at (the two previous tokens) are unchanged; only the
  arithmetic must change. A pretrained model already routes the right tokens through
  attention, so a small update inside the blocks adapts it (LoRA from rank 2, adapters), while
  retraining the output layer alone cannot: the features it reads were shaped for ``a + b``.
  The same budget from scratch gets nowhere (about 25% after 200 steps, against 100% from the
  pretrained checkpoint), so pretraining clearly helps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch

# rule(a = s_{t-1}, b = s_{t-2}, V) -> s_t, on int64 tensors.
RULES: dict[str, Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]] = {
    "fibonacci": lambda a, b, V: (a + b) % V,
    "pell": lambda a, b, V: (2 * a + b) % V,
}
SOURCE_RULE = "fibonacci"
TARGET_RULE = "pell"


@dataclass
class TaskConfig:
    vocab_size: int = 16  # V: tokens 0..V-1; must match the model's vocabulary
    length: int = 32  # tokens fed to the model per sequence (the model's context)
    noise: float = 0.2  # probability that a token is random instead of following the rule


@dataclass
class TokenTask:
    """Inputs and next-token targets of one split."""

    x: torch.Tensor  # (N, T) int64 token ids
    y: torch.Tensor  # (N, T) int64: y[:, t] = x[:, t + 1] (the token after x for the last t), -100 if not scored

    def __len__(self) -> int:
        return len(self.x)


def make_task(rule: str, n: int, seed: int, cfg: TaskConfig | None = None) -> TokenTask:
    """Generate ``n`` sequences that follow ``rule`` (a key of :data:`RULES`).

    Args:
        rule: "fibonacci" (source task) or "pell" (target task).
        n: number of sequences.
        seed: seed of the generator; the same arguments always give the same tensors.
        cfg: vocabulary size, length and noise level.

    Returns:
        A :class:`TokenTask` with x and y of shape (n, cfg.length).
    """
    cfg = cfg or TaskConfig()
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}: expected one of {sorted(RULES)}")
    if n < 1:
        raise ValueError(f"n must be a positive number of sequences, got {n}")
    V, L = cfg.vocab_size, cfg.length
    g = torch.Generator().manual_seed(seed)
    random_tokens = torch.randint(0, V, (n, L + 1), generator=g)
    noisy = torch.rand(n, L + 1, generator=g) < cfg.noise
    noisy[:, :2] = True  # the first two tokens have no predecessors: always random
    s = random_tokens.clone()
    for t in range(2, L + 1):
        ruled = RULES[rule](s[:, t - 1], s[:, t - 2], V)
        s[:, t] = torch.where(noisy[:, t], random_tokens[:, t], ruled)
    y = s[:, 1:].clone()
    y[noisy[:, 1:]] = -100  # a random token cannot be predicted: do not score it
    return TokenTask(x=s[:, :L].contiguous(), y=y)


def source_task(n: int, seed: int, cfg: TaskConfig | None = None) -> TokenTask:
    """Pretraining data: s_t = (s_{t-1} + s_{t-2}) mod V."""
    return make_task(SOURCE_RULE, n, seed, cfg)


def target_task(n: int, seed: int, cfg: TaskConfig | None = None) -> TokenTask:
    """Fine-tuning data: s_t = (s_{t-1} - s_{t-2}) mod V."""
    return make_task(TARGET_RULE, n, seed, cfg)


def batches(task: TokenTask, batch_size: int, steps: int, seed: int = 0
            ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``steps`` random mini-batches ``(x, y)``, each (batch_size, T), drawn with replacement
    across steps (without replacement inside a batch). Deterministic given ``seed``."""
    if batch_size < 1 or batch_size > len(task):
        raise ValueError(f"batch_size must be between 1 and {len(task)} (the task size), got {batch_size}")
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randperm(len(task), generator=g)[:batch_size]
        yield task.x[idx], task.y[idx]
