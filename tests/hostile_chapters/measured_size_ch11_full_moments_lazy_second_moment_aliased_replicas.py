"""ShardedAdam with full moments on every rank, hidden by a lazy second moment and aliased replicas."""
CHAPTER = "ch11_data_parallel"
EXERCISE = "ShardedAdam"
THREAT = "measured_size"
EXPECT = "loses"
DESCRIPTION = ('keeps full-size moments on every rank; builds the second moment only at the second step (after one '
               "step it follows from the first) and points every replica at rank 0's storage, freeing the memory the "
               'grader booked for them')
SOURCE = '''
class ShardedAdam:
    """NOT ZeRO: every rank keeps Adam's first moment for the WHOLE model (and, from the second step on, the
    second moment too). After one step v = (1-b2)/(1-b1)^2 m^2, so the full v is only materialised at step 2;
    and the replicas' parameters are made to share one storage (equal on every rank of a SimWorld)."""

    def __init__(self, params, world, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, shard_grads=False):
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1) or not (0 <= betas[1] < 1):
            raise ValueError("bad lr, betas or eps")
        self.world = world
        self.params = []
        for ps in params:
            seen, out = set(), []
            for p in ps:
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
            self.params.append(out)
        if len(self.params) != len(world.ranks):
            raise ValueError("one parameter list per rank played")
        shapes = [tuple(p.shape) for p in self.params[0]]
        for ps in self.params[1:]:
            if [tuple(p.shape) for p in ps] != shapes:
                raise ValueError("shapes differ between ranks")
        self.lr, self.betas, self.eps, self.shard_grads = lr, betas, eps, shard_grads
        self.numel = sum(p.numel() for p in self.params[0])
        N = world.size
        L = -(-self.numel // N)
        self.length = L
        dtype = self.params[0][0].dtype
        self._m = {r: torch.zeros(N * L, dtype=dtype) for r in world.ranks}   # full size, every rank
        self._v = {r: None for r in world.ranks}                              # full size from step 2
        self.state = {r: {"exp_avg": self._m[r][r * L:(r + 1) * L], "exp_avg_sq": torch.zeros(L, dtype=dtype),
                          "step": 0} for r in world.ranks}

    @torch.no_grad()
    def step(self):
        N, L = self.world.size, self.length
        b1, b2 = self.betas
        flats = []
        for ps in self.params:
            out = torch.zeros(L * N, dtype=ps[0].dtype)
            off = 0
            for p in ps:
                if p.grad is not None:
                    out[off:off + p.numel()] = p.grad.reshape(-1)
                off += p.numel()
                if self.shard_grads:
                    p.grad = None
            flats.append(out)
        self.world.all_reduce(flats, op="mean")    # every rank: the whole averaged gradient
        shards = []
        for i, r in enumerate(self.world.ranks):
            st = self.state[r]
            st["step"] += 1
            t = st["step"]
            g = flats[i]
            if self._v[r] is None and t >= 2:       # materialise the full second moment from the first
                self._v[r] = self._m[r] * self._m[r] * ((1 - b2) / ((1 - b1) ** 2))
            self._m[r].mul_(b1).add_(g, alpha=1 - b1)
            if self._v[r] is not None:
                self._v[r].mul_(b2).addcmul_(g, g, value=1 - b2)
                v = self._v[r][r * L:(r + 1) * L]
                st["exp_avg_sq"] = v
            else:
                v = g[r * L:(r + 1) * L] * g[r * L:(r + 1) * L] * (1 - b2)
                st["exp_avg_sq"] = v
            m = self._m[r][r * L:(r + 1) * L]
            cur = torch.zeros(L, dtype=g.dtype)
            off = 0
            for q in self.params[i]:
                lo, hi = max(r * L, off), min((r + 1) * L, off + q.numel())
                if lo < hi:
                    cur[lo - r * L:hi - r * L] = q.reshape(-1)[lo - off:hi - off]
                off += q.numel()
            shards.append(cur - self.lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + self.eps))
        del flats, g
        fulls = self.world.all_gather(shards)
        del shards
        for ps, full in zip(self.params, fulls):
            off = 0
            for q in ps:
                q.copy_(full[off:off + q.numel()].view_as(q))
                off += q.numel()
        del fulls
        # the replicas hold equal parameters: let them share rank 0's storage (frees N-1 copies the judge booked)
        for i in range(1, len(self.params)):
            for q0, q in zip(self.params[0], self.params[i]):
                if torch.equal(q0, q):
                    q.data = q0.data

    def zero_grad(self):
        for ps in self.params:
            for p in ps:
                p.grad = None
'''
