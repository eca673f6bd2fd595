"""Plausible wrong answers for ch11_data_parallel, one per exercise: each must lose points when autograded.

``WRONG`` sums the gradients (ddp_step), cuts floor(numel / N) shards (shard_bounds), leaves out the all-gather
(ShardedAdam), shards the gradients at stage 1 (zero_memory) and counts an all-reduce as one pass (comm_volume).
``FULL_STATE_WRONG`` and ``FLAT_GRAD_WRONG`` are ShardedAdam answers whose values are right and whose memory is not."""

# The ShardedAdam answers share one skeleton: {doc} the docstring, {moments} the size and slice of each rank's
# moments, {buffers} the flat gradients' tensors, {writeback} what each rank's parameters are set from.
_SHARDED = '''
import torch


class ShardedAdam:
    """Wrong: {doc}"""

    def __init__(self, params, world, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, shard_grads=False):
        if lr < 0 or eps < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError("bad hyperparameters")
        self.params = []
        for ps in params:
            seen, unique = set(), []
            for p in ps:
                if id(p) not in seen:
                    seen.add(id(p))
                    unique.append(p)
            self.params.append(unique)
        if len(self.params) != len(world.ranks):
            raise ValueError("one parameter list per rank played")
        if len({{tuple(tuple(p.shape) for p in ps) for ps in self.params}}) != 1:
            raise ValueError("the ranks' shapes differ")
        self.world, self.lr, self.betas, self.eps, self.shard_grads = world, lr, betas, eps, shard_grads
        self.numel = sum(p.numel() for p in self.params[0])
        self.length = -(-self.numel // world.size)
        self.padded = self.length * world.size
        dtype = self.params[0][0].dtype
        self.state = {{}}
        for r in world.ranks:
            size, a, b = {moments}
            self.state[r] = {{"step": 0, "exp_avg": torch.zeros(size, dtype=dtype)[a:b],
                             "exp_avg_sq": torch.zeros(size, dtype=dtype)[a:b]}}
        self.buffers = None

    def _flat(self, tensors):
        flat = torch.zeros(self.padded, dtype=self.params[0][0].dtype)
        flat[:self.numel] = torch.cat([t.reshape(-1) for t in tensors])
        return flat

    @torch.no_grad()
    def step(self):
        flats = {buffers}
        for ps, flat in zip(self.params, flats):
            flat[:self.numel] = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                                           for p in ps])
            if self.shard_grads:
                for p in ps:
                    p.grad = None
        shards = self.world.reduce_scatter(flats, op="mean")
        b1, b2 = self.betas
        updated = []
        for rank, ps, g in zip(self.world.ranks, self.params, shards):
            s = self.state[rank]
            s["step"] += 1
            t = s["step"]
            shard = self._flat(list(ps))[rank * self.length:(rank + 1) * self.length].clone()
            s["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
            s["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
            shard -= self.lr * (s["exp_avg"] / (1 - b1 ** t)) / ((s["exp_avg_sq"] / (1 - b2 ** t)).sqrt() + self.eps)
            updated.append(shard)
        for ps, full in zip(self.params, {writeback}):
            offset = 0
            for p in ps:
                p.copy_(full[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def zero_grad(self):
        for ps in self.params:
            for p in ps:
                p.grad = None
'''
_FRESH = "[torch.zeros(self.padded, dtype=ps[0].dtype) for ps in self.params]"
_SHARD_MOMENTS = "self.length, 0, self.length"
_GATHERED = "self.world.all_gather(updated)"
# No all-gather: each rank puts its own updated shard into its flat parameters and writes back only that.
_OWN_SHARD_ONLY = ("[torch.cat([self._flat(list(ps))[:rank * self.length], shard, "
                   "self._flat(list(ps))[(rank + 1) * self.length:]]) "
                   "for rank, ps, shard in zip(self.world.ranks, self.params, updated)]")

WRONG = {
    ("ch11_data_parallel", "ddp_step"): '''
def ddp_step(replicas, optimizers, batches, loss_fn, world):
    """Wrong: the gradients are summed over the ranks (op="sum"), which multiplies the learning rate by N."""
    if not len(replicas) == len(optimizers) == len(batches) == len(world.ranks):
        raise ValueError("one replica, optimizer and batch per rank played")
    losses = []
    for model, opt, batch in zip(replicas, optimizers, batches):
        opt.zero_grad()
        loss = loss_fn(model, batch)
        loss.backward()
        losses.append(loss.item())
    for params in zip(*(list(m.parameters()) for m in replicas)):
        if params[0].requires_grad:
            world.all_reduce([p.grad for p in params], op="sum")
    for opt in optimizers:
        opt.step()
    return losses
''',
    ("ch11_data_parallel", "shard_bounds"): '''
def shard_bounds(numel, world_size):
    """Wrong: shards of floor(numel / N), so the last elements belong to no rank."""
    for v in (numel, world_size):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError("positive ints only")
    length = numel // world_size
    return [(r * length, (r + 1) * length) for r in range(world_size)]
''',
    ("ch11_data_parallel", "ShardedAdam"): _SHARDED.format(
        doc="no all-gather; each rank writes back only its own updated shard, so the replicas diverge.",
        moments=_SHARD_MOMENTS, buffers=_FRESH, writeback=_OWN_SHARD_ONLY),
    ("ch11_data_parallel", "zero_memory"): '''
def zero_memory(num_params, world_size, stage, bytes_param, bytes_grad, bytes_optim):
    """Wrong: stage 1 shards the gradients (G) instead of the optimizer state (K)."""
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ValueError("stage 0 to 3")
    for v in (num_params, world_size):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError("positive ints only")
    if min(bytes_param, bytes_grad, bytes_optim) < 0:
        raise ValueError("negative bytes")
    shard = -(-num_params // world_size)
    if stage == 0:
        return (bytes_param + bytes_grad + bytes_optim) * num_params
    if stage == 1:
        return (bytes_param + bytes_optim) * num_params + bytes_grad * shard
    if stage == 2:
        return bytes_param * num_params + (bytes_grad + bytes_optim) * shard
    return (bytes_param + bytes_grad + bytes_optim) * shard
''',
    ("ch11_data_parallel", "comm_volume"): '''
def comm_volume(stage, num_params, world_size):
    """Wrong: the all-reduce counted as one pass, (N-1)/N Psi, like a reduce-scatter alone."""
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ValueError("stage 0 to 3")
    for v in (num_params, world_size):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError("positive ints only")
    share = (world_size - 1) / world_size * num_params
    return {0: share, 1: 2 * share, 2: 2 * share, 3: 3 * share}[stage]
''',
}

# Wrong answers that lose only ShardedAdam's memory cell (test_sharded_adam_memory, read from outside the student's
# process): every value and the reported state right, more kept per rank than its shard's moments. Graded through
# the sandbox by tests/test_hidden_ch11_data_parallel.py.
# Moments of the whole flat vector on every rank, of which only its shard is used (and shown in state[r]).
FULL_STATE_WRONG = {("ch11_data_parallel", "ShardedAdam"): _SHARDED.format(
    doc="every rank allocates Adam's moments for the whole flat vector and uses only its shard's slice of them "
        "(state[r] shows that slice): the values of ZeRO-1, the moments' memory of plain Adam on every rank.",
    moments="self.padded, r * self.length, (r + 1) * self.length", buffers=_FRESH, writeback=_GATHERED)}

# The padded flat gradient of every rank kept between steps, as a buffer the next step reuses.
FLAT_GRAD_WRONG = {("ch11_data_parallel", "ShardedAdam"): _SHARDED.format(
    doc="each rank keeps its padded flat gradient between steps, a buffer the next step reuses: the values of "
        "ZeRO-1, a whole model's gradients kept per rank.",
    moments=_SHARD_MOMENTS, buffers=f"self.buffers = self.buffers or {_FRESH}", writeback=_GATHERED)}
