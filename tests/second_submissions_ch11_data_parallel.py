"""Second correct answers for ch11_data_parallel, written from the released notebook alone: gradients averaged one
parameter at a time through the world, shard bounds from a running offset, a sharded Adam that walks the
parameters overlapping each shard (no full flat copy of the parameters), and formulas built from per-stage tables
with exact fractions."""

SECOND = {
    ("ch11_data_parallel", "ddp_step"): '''
import torch
from torch import nn


def ddp_step(replicas: list[nn.Module], optimizers: list[torch.optim.Optimizer], batches: list,
             loss_fn, world) -> list[float]:
    """One data-parallel step: local backward on every rank played, gradients averaged through the world."""
    played = len(world.ranks)
    counts = {"replicas": len(replicas), "optimizers": len(optimizers), "batches": len(batches)}
    odd = {name: n for name, n in counts.items() if n != played}
    if odd:
        raise ValueError(f"the world plays {played} ranks, but got {odd}")

    losses = []
    for model, opt, batch in zip(replicas, optimizers, batches):
        opt.zero_grad(set_to_none=True)
        for p in model.parameters():
            p.grad = None
        loss = loss_fn(model, batch)
        loss.backward()
        losses.append(float(loss.detach()))

    # the same parameter on every rank played: one all-reduce each
    per_param = zip(*[list(m.parameters()) for m in replicas])
    for same_param in per_param:
        if not same_param[0].requires_grad:
            continue
        grads = []
        for p in same_param:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        world.all_reduce(grads, op="mean")

    for opt in optimizers:
        opt.step()
    return losses
''',
    ("ch11_data_parallel", "shard_bounds"): '''
def shard_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """Equal shards of ceil(numel / world_size) over the padded flat vector."""
    for name, value in (("numel", numel), ("world_size", world_size)):
        if type(value) is bool or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    length, rest = divmod(numel, world_size)
    if rest:
        length += 1
    bounds, start = [], 0
    for _ in range(world_size):
        bounds.append((int(start), int(start + length)))
        start += length
    return bounds
''',
    ("ch11_data_parallel", "ShardedAdam"): '''
import math

import torch


class ShardedAdam:
    """Adam whose moments are split over the ranks of a world (ZeRO-1, and ZeRO-2 with shard_grads)."""

    def __init__(self, params, world, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, shard_grads=False):
        if not lr >= 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        beta1, beta2 = betas
        for b in (beta1, beta2):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"betas must lie in [0, 1), got {betas}")
        per_rank = [list(group) for group in params]
        if len(per_rank) != len(world.ranks):
            raise ValueError(f"{len(per_rank)} parameter lists for {len(world.ranks)} ranks played")
        # a tensor listed twice is one parameter
        unique = []
        for group in per_rank:
            seen, kept = set(), []
            for p in group:
                if id(p) not in seen:
                    seen.add(id(p))
                    kept.append(p)
            unique.append(kept)
        shapes = [tuple(tuple(p.shape) for p in group) for group in unique]
        if any(s != shapes[0] for s in shapes):
            raise ValueError("every rank needs parameters of the same shapes, in the same order")
        if not unique[0]:
            raise ValueError("no parameters to optimise")

        self.world = world
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.shard_grads = shard_grads
        self.params = unique
        self.sizes = [p.numel() for p in unique[0]]
        self.numel = sum(self.sizes)
        n = world.size
        self.length = -(-self.numel // n)
        dtype = unique[0][0].dtype
        self.state = {r: {"exp_avg": torch.zeros(self.length, dtype=dtype),
                          "exp_avg_sq": torch.zeros(self.length, dtype=dtype),
                          "step": 0}
                      for r in world.ranks}

    def _pieces(self, start, stop):
        """(parameter index, from, to, position in the shard) for every parameter overlapping [start, stop)."""
        out, offset = [], 0
        for k, size in enumerate(self.sizes):
            lo, hi = max(start, offset), min(stop, offset + size)
            if lo < hi:
                out.append((k, lo - offset, hi - offset, lo - start))
            offset += size
        return out

    @torch.no_grad()
    def step(self):
        n, L = self.world.size, self.length
        flats = []
        for group in self.params:
            flat = torch.zeros(n * L, dtype=self.state[self.world.ranks[0]]["exp_avg"].dtype)
            offset = 0
            for p in group:
                if p.grad is not None:
                    flat[offset:offset + p.numel()] = p.grad.reshape(-1)
                offset += p.numel()
            if self.shard_grads:
                for p in group:
                    p.grad = None
            flats.append(flat)
        grads = self.world.reduce_scatter(flats, op="mean")
        del flats

        updated = []
        for i, rank in enumerate(self.world.ranks):
            s = self.state[rank]
            s["step"] += 1
            t = s["step"]
            g = grads[i]
            shard = torch.zeros(L, dtype=s["exp_avg"].dtype)
            start = rank * L
            pieces = self._pieces(start, start + L)
            for k, a, b, at in pieces:
                shard[at:at + b - a] = self.params[i][k].detach().reshape(-1)[a:b]
            s["exp_avg"].mul_(self.beta1).add_(g, alpha=1 - self.beta1)
            s["exp_avg_sq"].mul_(self.beta2).addcmul_(g, g, value=1 - self.beta2)
            m_hat = s["exp_avg"] / (1 - self.beta1 ** t)
            v_hat = s["exp_avg_sq"] / (1 - self.beta2 ** t)
            shard -= self.lr * m_hat / (v_hat.sqrt() + self.eps)
            updated.append(shard)
            grads[i] = None
        del grads

        whole = self.world.all_gather(updated)
        del updated
        for i, group in enumerate(self.params):
            offset = 0
            for p in group:
                p.copy_(whole[i][offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            whole[i] = None

    def zero_grad(self):
        for group in self.params:
            for p in group:
                p.grad = None
''',
    ("ch11_data_parallel", "zero_memory"): '''
def zero_memory(num_params: int, world_size: int, stage: int, bytes_param: int, bytes_grad: int,
                bytes_optim: int) -> int:
    """Model-state bytes per rank: the three per-parameter costs, each either full or on a ceil(Psi/N) shard."""
    def positive_int(name, v):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")

    positive_int("num_params", num_params)
    positive_int("world_size", world_size)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
    costs = (bytes_param, bytes_grad, bytes_optim)
    for c in costs:
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise ValueError(f"byte counts must be non-negative ints, got {c!r}")
    shard = -(-num_params // world_size)
    # which of (parameters, gradients, optimizer state) are sharded at each stage
    sharded = {0: (False, False, False), 1: (False, False, True), 2: (False, True, True), 3: (True, True, True)}
    return sum(c * (shard if cut else num_params) for c, cut in zip(costs, sharded[stage]))
''',
    ("ch11_data_parallel", "comm_volume"): '''
from fractions import Fraction


def comm_volume(stage: int, num_params: int, world_size: int) -> Fraction:
    """Elements sent per rank per step on a ring, as an exact fraction."""
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage!r}")
    for name, v in (("num_params", num_params), ("world_size", world_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    # passes of (N-1)/N Psi: an all-reduce is two, ZeRO-3 adds a second all-gather
    passes = {0: 2, 1: 2, 2: 2, 3: 3}[stage]
    return passes * Fraction(world_size - 1, world_size) * num_params
''',
}
