"""Second correct answers for ch07_local_loss, written from the released notebook alone: einsum Gram matrices, validation up front, schedules filled one batch column at a time from a start-time table."""

SECOND = {
    ("ch07_local_loss", "similarity_matrix"): '''
import torch


def similarity_matrix(h: torch.Tensor) -> torch.Tensor:
    """The predsim similarity matrix S(h) of a batch: (B, B), clamped to [-1, 1]."""
    if h.dim() < 2:
        raise ValueError(f"h needs a batch dimension and at least one feature dimension, got shape {tuple(h.shape)}")
    n = h.shape[0]
    if h.dim() == 4 and h.shape[1] > 3 and h.shape[2] * h.shape[3] > 1:
        # per-channel spread over space: (B, C, H*W) -> (B, C)
        rows = torch.std(h.reshape(n, h.shape[1], -1), dim=-1)
    else:
        rows = h.reshape(n, -1)
    centred = rows - rows.mean(dim=-1, keepdim=True)
    length = torch.linalg.vector_norm(centred, ord=2, dim=-1, keepdim=True)
    unit = centred / (length + 1e-8)
    gram = torch.einsum("id,jd->ij", unit, unit)
    return torch.clamp(gram, min=-1.0, max=1.0)
''',
    ("ch07_local_loss", "predsim_loss"): '''
import torch
import torch.nn.functional as F
from torch import nn


def predsim_loss(h: torch.Tensor, y: torch.Tensor, sim_head: nn.Module, pred_head: nn.Module,
                 num_classes: int, beta: float = 0.99) -> torch.Tensor:
    """(1 - beta) * cross-entropy of pred_head + beta * MSE of the similarity matrices."""
    if isinstance(beta, (bool, str)):
        raise ValueError(f"beta must be a number in [0, 1], got {beta!r}")
    try:
        weight = float(beta)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"beta must be a number in [0, 1], got {beta!r}") from None
    if not (0.0 <= weight <= 1.0):
        raise ValueError(f"beta must lie in [0, 1], got {beta!r}")
    if not isinstance(y, torch.Tensor) or y.dim() != 1 or y.shape[0] != h.shape[0]:
        shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"y must be a 1-D tensor of {h.shape[0]} labels, got {shape}")

    logits = pred_head(torch.flatten(h, start_dim=1))
    pred_term = F.cross_entropy(logits, y)

    target = similarity_matrix(F.one_hot(y, num_classes).to(h.dtype))
    sim_term = F.mse_loss(similarity_matrix(sim_head(h)), target)

    return (1.0 - weight) * pred_term + weight * sim_term
''',
    ("ch07_local_loss", "local_training_step"): '''
import torch
from torch import nn


def local_training_step(blocks: list[nn.Module], heads: list[nn.Module], optimizers: list[torch.optim.Optimizer],
                        x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """Train each block on its own local loss, handing a detached output to the next block."""
    sizes = {len(blocks), len(heads), len(optimizers)}
    if len(sizes) != 1:
        raise ValueError(f"need one head and one optimizer per block, got {len(blocks)} blocks, "
                         f"{len(heads)} heads, {len(optimizers)} optimizers")
    if len(blocks) == 0:
        raise ValueError("the network needs at least one block")

    recorded = []
    carry = x.detach()
    for block, head, opt in zip(blocks, heads, optimizers):
        # forget whatever an earlier call left behind
        opt.zero_grad(set_to_none=True)
        block.zero_grad(set_to_none=True)
        head.zero_grad(set_to_none=True)
        h, out = block(carry)
        local = head(h, y)
        recorded.append(float(local.item()))
        local.backward()
        opt.step()
        carry = out.detach()  # no gradient crosses into this block from the next one
        del h, out, local
    return recorded
''',
    ("ch07_local_loss", "bp_schedule"): '''
def bp_schedule(fwd: list, bwd: list, n_batches: int) -> tuple[list[list], list[list]]:
    """Forward and backward start times of end-to-end backprop, one worker per block."""
    fwd, bwd = list(fwd), list(bwd)
    if len(fwd) != len(bwd):
        raise ValueError(f"fwd has {len(fwd)} durations, bwd {len(bwd)}")
    if not fwd:
        raise ValueError("need at least one block (K = 0)")
    for d in fwd + bwd:
        if not d > 0:
            raise ValueError(f"durations must be > 0, got {d!r}")
    if isinstance(n_batches, bool) or not isinstance(n_batches, int) or n_batches < 1:
        raise ValueError(f"n_batches must be a positive int, got {n_batches!r}")

    K = len(fwd)
    fstart = [[None] * n_batches for _ in range(K)]
    bstart = [[None] * n_batches for _ in range(K)]
    for t in range(n_batches):
        # forwards go up the stack
        for k in range(K):
            waits = []
            if k > 0:
                waits.append(fstart[k - 1][t] + fwd[k - 1])
            if t > 0:
                waits.append(bstart[k][t - 1] + bwd[k])
            fstart[k][t] = max(waits) if waits else 0
        # backwards come down it
        bstart[K - 1][t] = fstart[K - 1][t] + fwd[K - 1]
        for k in range(K - 2, -1, -1):
            bstart[k][t] = bstart[k + 1][t] + bwd[k + 1]
    return fstart, bstart
''',
    ("ch07_local_loss", "dgl_schedule"): '''
def dgl_schedule(fwd: list, bwd: list, n_batches: int) -> tuple[list[list], list[list]]:
    """Forward and backward start times of decoupled greedy learning, one worker per block."""
    fwd, bwd = list(fwd), list(bwd)
    if len(fwd) != len(bwd):
        raise ValueError(f"fwd has {len(fwd)} durations, bwd {len(bwd)}")
    if not fwd:
        raise ValueError("need at least one block (K = 0)")
    for d in fwd + bwd:
        if not d > 0:
            raise ValueError(f"durations must be > 0, got {d!r}")
    if isinstance(n_batches, bool) or not isinstance(n_batches, int) or n_batches < 1:
        raise ValueError(f"n_batches must be a positive int, got {n_batches!r}")

    K = len(fwd)
    fstart = [[None] * n_batches for _ in range(K)]
    bstart = [[None] * n_batches for _ in range(K)]
    for t in range(n_batches):
        for k in range(K):
            waits = []
            if t > 0:  # this worker's own previous batch: forward, then local backward
                waits.append(fstart[k][t - 1] + fwd[k] + bwd[k])
            if k > 0:  # the input: only the forward of the block below
                waits.append(fstart[k - 1][t] + fwd[k - 1])
            fstart[k][t] = max(waits) if waits else 0
            bstart[k][t] = fstart[k][t] + fwd[k]
    return fstart, bstart
''',
}
