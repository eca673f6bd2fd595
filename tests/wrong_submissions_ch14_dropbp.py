"""Plausible wrong answers for chapter 14, one per exercise: each must lose points when autograded."""

WRONG = {
    ("ch14_dropbp", "DropBP"): '''
class DropBP(nn.Module):
    """Wrong: stochastic depth, a dropped sublayer's output is left out of the forward (and rescaled when kept)."""

    def __init__(self, sublayer, p, generator=None):
        super().__init__()
        if not 0 <= p <= 1:
            raise ValueError("p must lie in [0, 1]")
        self.sublayer, self.p, self.generator = sublayer, float(p), generator
        self.force, self.dropped = None, False

    def forward(self, x):
        drop = self.training and (bool(torch.rand((), generator=self.generator) < self.p) if self.force is None
                                  else bool(self.force))
        self.dropped = drop
        if drop:
            return x
        return x + self.sublayer(x) / (1 - self.p if self.training and self.p < 1 else 1.0)
''',
    ("ch14_dropbp", "choose_dropped"): '''
def choose_dropped(rates, average_rate, generator):
    """Wrong: no forcing step, a step may drop fewer than ceil(average_rate * L)."""
    rates = [float(r) for r in rates]
    if not rates or any(not 0 <= r <= 1 for r in rates) or not 0 <= average_rate <= 1:
        raise ValueError("bad arguments")
    u = torch.rand(len(rates), generator=generator)
    return [float(u[i]) < rates[i] for i in range(len(rates))]
''',
    ("ch14_dropbp", "sensitivity"): '''
def sensitivity(model, batch, loss_fn):
    """Wrong: squared gradient norms instead of norms."""
    inputs, targets = batch
    layers = [m for m in model.modules() if isinstance(m, DropBP)]
    if not layers:
        raise ValueError("no DropBP module")
    params = [p for p in model.parameters() if p.requires_grad]
    forces, was = [m.force for m in layers], model.training
    model.train()

    def norms(dropped):
        for j, layer in enumerate(layers):
            layer.force = j == dropped
        model.zero_grad(set_to_none=True)
        loss_fn(model(inputs), targets).backward()
        return torch.stack([p.grad.pow(2).sum() if p.grad is not None else p.new_zeros(()) for p in params])

    o = norms(None)
    out = [float((o - norms(i)).pow(2).sum()) for i in range(len(layers))]
    for layer, force in zip(layers, forces):
        layer.force = force
    model.train(was)
    model.zero_grad(set_to_none=True)
    return out
''',
    ("ch14_dropbp", "allocate_drop_rates"): '''
def allocate_drop_rates(sensitivity, flops, average_rate):
    """Wrong: the most sensitive sublayer's rate rises first."""
    s, f = [float(v) for v in sensitivity], [float(v) for v in flops]
    if not s or len(s) != len(f) or any(v < 0 for v in s + f) or sum(f) <= 0 or not 0 <= average_rate <= 0.9:
        raise ValueError("bad arguments")
    k = [0] * len(s)
    while sum(fi * (10 - ki) for fi, ki in zip(f, k)) / 10 > (1 - average_rate) * sum(f) * (1 + 1e-9):
        below = [i for i in range(len(s)) if k[i] < 9]
        if not below:
            break
        i = max(below, key=lambda j: (s[j] * (0.1 + k[j] / 10), -j))
        k[i] += 1
    return [ki / 10 for ki in k]
''',
}

# Right values, the authors' detach-after-run form: only the memory cell, read from the worker's cgroup, fails it.
MEMORY_WRONG = {
    ("ch14_dropbp", "DropBP"): '''
class DropBP(nn.Module):
    """Wrong: runs the sublayer with autograd, then detaches its output when dropped (the graph is built)."""

    def __init__(self, sublayer, p, generator=None):
        if not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ValueError(f"p={p} is outside [0, 1]")
        super().__init__()
        self.sublayer = sublayer
        self.p = p
        self.generator = generator
        self.force = None
        self.dropped = False

    def forward(self, x):
        if not self.training:
            drop = False
        elif self.force is None:
            drop = bool(torch.rand((), generator=self.generator) < self.p)
        else:
            drop = bool(self.force)
        self.dropped = drop
        out = self.sublayer(x)
        return x + (out.detach() if drop else out)
''',
}
