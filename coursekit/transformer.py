"""A tiny GPT-style transformer that trains in seconds on a 2-core CPU.

Same anatomy as GPT-2 / nanoGPT, shrunk: token + position embeddings, pre-LayerNorm blocks
(causal self-attention, then an MLP, each added to the residual stream), a final LayerNorm
and a linear language-model head. Every projection is a plain ``nn.Linear`` with a stable
name, so parameter-efficient methods can target them by name suffix::

    blocks.0.attn.qkv   blocks.0.attn.proj   blocks.0.mlp.fc1   blocks.0.mlp.fc2   ...   lm_head

Attention is written with plain tensor ops (no fused kernel) so that every intermediate is
visible to ``coursekit.measure``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPTConfig:
    vocab_size: int = 16  # tokens 0..vocab_size-1
    context: int = 32  # longest sequence the position embedding covers
    d_model: int = 64  # width of the residual stream
    n_heads: int = 4  # d_model must be divisible by n_heads (head size 16)
    n_layers: int = 2  # transformer blocks
    mlp_ratio: int = 4  # MLP hidden width = mlp_ratio * d_model, as in GPT-2

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position t only sees positions <= t."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)  # queries, keys, values in one matmul
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)  # mixes the heads back together
        mask = torch.tril(torch.ones(cfg.context, cfg.context, dtype=torch.bool))
        # Not persistent: it is derived from the config, so checkpoints do not carry it.
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T, C)
        B, T, C = x.shape
        H = self.n_heads
        q, k, v = self.qkv(x).split(C, dim=-1)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))  # (B, H, T, C/H)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)  # (B, H, T, T)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))  # no peeking at the future
        att = att.softmax(dim=-1)
        y = att @ v  # (B, H, T, C/H)
        y = y.transpose(1, 2).reshape(B, T, C)  # heads side by side again
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.fc2 = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T, C)
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-LN block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T, C)
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Decoder-only transformer returning next-token logits.

    Args:
        cfg: sizes (see :class:`GPTConfig`).

    ``forward(idx)`` takes token ids ``idx`` of shape (B, T) with T <= cfg.context and
    returns logits of shape (B, T, vocab_size): position t predicts token t + 1.
    """

    def __init__(self, cfg: GPTConfig | None = None):
        super().__init__()
        self.cfg = cfg = cfg or GPTConfig()
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        # GPT-2's initialisation: small normal weights, zero biases.
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) int64 -> (B, T, V)
        B, T = idx.shape
        if T > self.cfg.context:
            raise ValueError(f"sequence length {T} exceeds the context of {self.cfg.context} tokens")
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, V)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the positions whose target is not -100.

    Args:
        logits: (B, T, V); targets: (B, T) int64, -100 where there is nothing to predict.
    """
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512) -> float:
    """Fraction of next-token predictions that are right, over positions with y != -100.

    Args:
        x: (N, T) token ids; y: (N, T) targets with -100 where not scored.
    """
    was_training = model.training
    model.eval()
    right = total = 0
    for i in range(0, len(x), batch_size):
        pred = model(x[i:i + batch_size]).argmax(-1)  # (b, T)
        t = y[i:i + batch_size]
        scored = t != -100
        right += int((pred == t)[scored].sum())
        total += int(scored.sum())
    model.train(was_training)
    return right / max(total, 1)
