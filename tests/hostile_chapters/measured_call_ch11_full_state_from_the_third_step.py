"""Sharded for two steps, then all-reduces full gradients and keeps full Adam moments on every rank."""
CHAPTER = "ch11_data_parallel"
EXERCISE = "ShardedAdam"
THREAT = "measured_call"
EXPECT = "loses"
DESCRIPTION = ('sharded for two steps, then all-reduces full gradients and keeps full Adam moments on every rank: '
               'right values, N times the state from the third step on')
SOURCE = '''
class ShardedAdam:
    def __init__(self, params, world, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, shard_grads=False):
        b1, b2 = betas
        if lr < 0 or eps < 0 or not (0 <= b1 < 1) or not (0 <= b2 < 1):
            raise ValueError(f"invalid lr {lr}, betas {betas} or eps {eps}")
        groups = []
        for ps in params:
            uniq = []
            for p in ps:
                if not any(p is q for q in uniq):
                    uniq.append(p)
            groups.append(uniq)
        if len(groups) != len(world.ranks):
            raise ValueError(f"{len(groups)} parameter lists for the {len(world.ranks)} ranks played")
        shapes = [tuple(p.shape) for p in groups[0]]
        for g in groups[1:]:
            if [tuple(p.shape) for p in g] != shapes:
                raise ValueError("the ranks' parameters differ in shape")
        self.params, self.world = groups, world
        self.lr, self.betas, self.eps, self.shard_grads = lr, (b1, b2), eps, shard_grads
        self.numel = sum(p.numel() for p in groups[0])
        self.bounds = shard_bounds(self.numel, world.size)
        self.length = self.bounds[0][1] - self.bounds[0][0]
        dtype = groups[0][0].dtype
        self.state = {r: {"exp_avg": torch.zeros(self.length, dtype=dtype),
                          "exp_avg_sq": torch.zeros(self.length, dtype=dtype), "step": 0} for r in world.ranks}

    def _flat_grad(self, ps):
        flat = torch.zeros(self.length * self.world.size, dtype=ps[0].dtype)
        offset = 0
        for p in ps:
            k = p.numel()
            if p.grad is not None:
                flat[offset:offset + k].copy_(p.grad.reshape(-1))
            if self.shard_grads:
                p.grad = None
            offset += k
        return flat

    def _param_shard(self, ps, start, stop):
        out = torch.zeros(stop - start, dtype=ps[0].dtype)
        offset = 0
        for p in ps:
            k = p.numel()
            lo, hi = max(start, offset), min(stop, offset + k)
            if lo < hi:
                out[lo - start:hi - start].copy_(p.detach().reshape(-1)[lo - offset:hi - offset])
            offset += k
        return out

    @torch.no_grad()
    def _full_step(self):
        # Plain data-parallel Adam: full gradient all-reduced, full moments on every rank played.
        b1, b2 = self.betas
        n, L = self.world.size, self.length
        if not hasattr(self, "full_m"):
            self.full_m, self.full_v = {}, {}
            gm = self.world.all_gather([self.state[r]["exp_avg"] for r in self.world.ranks])
            gv = self.world.all_gather([self.state[r]["exp_avg_sq"] for r in self.world.ranks])
            for r, m, v in zip(self.world.ranks, gm, gv):
                self.full_m[r], self.full_v[r] = m, v
                start, stop = self.bounds[r]
                self.state[r]["exp_avg"] = m[start:stop]
                self.state[r]["exp_avg_sq"] = v[start:stop]
        flats = [self._flat_grad(ps) for ps in self.params]
        self.world.all_reduce(flats, op="mean")
        for ps, r, g in zip(self.params, self.world.ranks, flats):
            st = self.state[r]
            st["step"] += 1
            t = st["step"]
            m, v = self.full_m[r], self.full_v[r]
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            vec = self._param_shard(ps, 0, n * L)
            vec.addcdiv_(m, (v / (1 - b2 ** t)).sqrt().add_(self.eps), value=-self.lr / (1 - b1 ** t))
            offset = 0
            for p in ps:
                p.copy_(vec[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    @torch.no_grad()
    def step(self):
        if self.state[self.world.ranks[0]]["step"] >= 2:
            return self._full_step()
        b1, b2 = self.betas
        flats = [self._flat_grad(ps) for ps in self.params]
        shards = self.world.reduce_scatter(flats, op="mean")
        del flats
        new = []
        for ps, r, g in zip(self.params, self.world.ranks, shards):
            st = self.state[r]
            st["step"] += 1
            t = st["step"]
            st["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
            st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
            start, stop = self.bounds[r]
            shard = self._param_shard(ps, start, stop)
            denom = (st["exp_avg_sq"] / (1 - b2 ** t)).sqrt().add_(self.eps)
            shard.addcdiv_(st["exp_avg"], denom, value=-self.lr / (1 - b1 ** t))
            new.append(shard)
        del shards
        gathered = self.world.all_gather(new)
        del new
        for ps, full in zip(self.params, gathered):
            offset = 0
            for p in ps:
                p.copy_(full[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def zero_grad(self):
        for ps in self.params:
            for p in ps:
                p.grad = None
'''
