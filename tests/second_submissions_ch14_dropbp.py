"""Second correct answers for ch14_dropbp, written from the released notebook alone: DropBP choosing a grad mode
context up front (torch.set_grad_enabled), choose_dropped with tensor operations and a stable argsort, sensitivity
over named parameters with the norms kept in float64, and the allocation on integer steps with a scan per step."""

SECOND = {
    ("ch14_dropbp", "DropBP"): '''
class DropBP(nn.Module):
    """x + sublayer(x); a dropped sublayer runs without autograd."""

    def __init__(self, sublayer, p, generator=None):
        super().__init__()
        if type(p) not in (int, float) or not 0 <= p <= 1:  # NaN fails both comparisons
            raise ValueError(f"p must be a number in [0, 1], not {p!r}")
        self.sublayer = sublayer
        self.p = p
        self.generator = generator
        self.force = None
        self.dropped = False

    def forward(self, x):
        drop = False
        if self.training:
            if self.force is not None:
                drop = self.force is True or bool(self.force)
            else:
                drop = torch.rand((), generator=self.generator).item() < self.p
        self.dropped = bool(drop)
        with torch.set_grad_enabled(torch.is_grad_enabled() and not drop):
            branch = self.sublayer(x)
        return branch + x
''',
    ("ch14_dropbp", "choose_dropped"): '''
def choose_dropped(rates, average_rate, generator):
    """The authors' handler: draw, then force the highest rates."""
    r = torch.as_tensor(rates, dtype=torch.float64).flatten()
    if r.numel() == 0:
        raise ValueError("no sublayers")
    if bool(((r < 0) | (r > 1)).any()):
        raise ValueError("rates must lie in [0, 1]")
    if not (0.0 <= float(average_rate) <= 1.0):
        raise ValueError("average_rate must lie in [0, 1]")
    count = r.numel()
    u = torch.rand(count, generator=generator).double()
    mask = u < r
    minimum = math.ceil(average_rate * count - 1e-9)
    order = torch.argsort(-r, stable=True)  # highest rate first, lower index first among equals
    for idx in order.tolist():
        if int(mask.sum()) >= minimum:
            break
        mask[idx] = True
    return [bool(v) for v in mask.tolist()]
''',
    ("ch14_dropbp", "sensitivity"): '''
def sensitivity(model, batch, loss_fn):
    """Per DropBP sublayer, the squared change of the per-parameter gradient norms when only it is dropped."""
    drop_modules = [mod for mod in model.modules() if isinstance(mod, DropBP)]
    if len(drop_modules) == 0:
        raise ValueError("model contains no DropBP")
    x, y = batch
    trainable = [param for _, param in model.named_parameters() if param.requires_grad]
    before = {id(mod): mod.force for mod in drop_modules}
    mode = model.training

    def norms_with(only):
        for idx, mod in enumerate(drop_modules):
            mod.force = idx == only
        for param in model.parameters():
            param.grad = None
        loss_fn(model(x), y).backward()
        return [0.0 if param.grad is None else float(param.grad.double().norm()) for param in trainable]

    try:
        model.train(True)
        base = norms_with(-1)
        result = []
        for i in range(len(drop_modules)):
            other = norms_with(i)
            result.append(sum((a - b) ** 2 for a, b in zip(base, other)))
        return result
    finally:
        for mod in drop_modules:
            mod.force = before[id(mod)]
        model.train(mode)
        for param in model.parameters():
            param.grad = None
''',
    ("ch14_dropbp", "allocate_drop_rates"): '''
def allocate_drop_rates(sensitivity, flops, average_rate):
    """Greedy: the cheapest step (S (0.1 + p)) first, until the FLOPs-weighted kept fraction meets the target."""
    sens = [float(v) for v in (sensitivity.tolist() if hasattr(sensitivity, "tolist") else sensitivity)]
    fl = [float(v) for v in (flops.tolist() if hasattr(flops, "tolist") else flops)]
    if len(sens) == 0 or len(sens) != len(fl):
        raise ValueError("sensitivity and flops must have the same, positive length")
    if min(sens) < 0 or min(fl) < 0:
        raise ValueError("negative sensitivity or FLOPs")
    total = sum(fl)
    if total <= 0:
        raise ValueError("FLOPs sum to 0")
    if average_rate < 0 or average_rate > 0.9:
        raise ValueError("average_rate must lie in [0, 0.9]")
    steps = [0 for _ in sens]
    bound = (1 - average_rate) * total + 1e-9 * total
    while sum(f * (1 - k / 10) for f, k in zip(fl, steps)) > bound:
        best = None
        for i, (s, k) in enumerate(zip(sens, steps)):
            if k >= 9:
                continue
            cost = s * (0.1 + k / 10)
            if best is None or cost < best[0]:
                best = (cost, i)
        if best is None:
            break
        steps[best[1]] += 1
    return [k / 10 for k in steps]
''',
}
