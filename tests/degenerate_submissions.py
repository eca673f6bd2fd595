"""Degenerate answers that once collected points on cells other than their exercise's first.

Each does nothing useful (computes nothing, always raises, gives no gradient, returns its input) yet
passed a memory, errors, edge-case, init, trains or returns cell before those cells waited on the
exercise's first one (``grader.api.gates``). Each must score 0 on every cell of its exercise, except
``FIRST_CELL_EARNED``: plain autograd gives a checkpoint's values (only its memory cell refuses it).
"""

DEGENERATE = {
    ("ch00_memory", "predict_training_memory", "c00_state_only_noerr"): r"""
def predict_training_memory(model, batch_size, optimizer):
    p = sum(q.numel() for q in model.parameters()) * 4
    k = {"sgd": 0, "momentum": 1, "adam": 2}.get(optimizer, 0)
    return {"params": p, "grads": p, "optimizer_state": k * p, "activations": 0}
""",
    ("ch00_memory", "predict_training_memory", "c00_zeros_err"): r"""
def predict_training_memory(model, batch_size, optimizer):
    if optimizer not in ("sgd", "momentum", "adam"):
        raise ValueError(f"unknown optimizer {optimizer!r}; allowed: sgd, momentum, adam")
    return {"params": 0, "grads": 0, "optimizer_state": 0, "activations": 0}
""",
    ("ch01_lora", "Adapter", "c01_adapter_identity"): r"""
class Adapter(nn.Module):
    def __init__(self, dim, bottleneck):
        super().__init__()
        self.down = nn.Linear(dim, bottleneck)
        self.up = nn.Linear(bottleneck, dim)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)
    def forward(self, x):
        return x
""",
    ("ch01_lora", "LoRALinear", "c01_lora_baseonly"): r"""
class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()

        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")

        self.base = base
        base.weight.requires_grad_(False)
        base.bias.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scaling = alpha / rank
    def forward(self, x):
        return self.base(x)
    def merge(self):
        m = nn.Linear(self.base.in_features, self.base.out_features)
        with torch.no_grad():
            m.weight.copy_(self.base.weight + self.scaling * self.lora_B @ self.lora_A)
            m.bias.copy_(self.base.bias)
        return m
""",
    ("ch01_lora", "LoRALinear", "c01_lora_errors_only"): r"""
class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()

        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")

    def forward(self, x):
        return x
    def merge(self):
        return None
""",
    ("ch02_checkpointing", "checkpoint_blocks", "c02_blocks_onechunk"): r"""
def checkpoint_blocks(layers, x, block_size):
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"bad block_size {block_size}")
    return checkpoint(nn.Sequential(*layers), x)
""",
    ("ch02_checkpointing", "checkpoint", "c02_ckpt_norng_noparams"): r"""
class _Ck(torch.autograd.Function):
    @staticmethod
    def forward(ctx, function, *args):
        ctx.function = function
        ctx.save_for_backward(*[a for a in args if isinstance(a, torch.Tensor)])
        ctx.args = args
        with torch.no_grad():
            return function(*args)
    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        ins = [t.detach().requires_grad_(t.requires_grad) for t in saved]
        with torch.enable_grad():
            out = ctx.function(*ins)
        need = [t for t in ins if t.requires_grad]
        gs = torch.autograd.grad(out, need, grad, allow_unused=True) if need else []
        it = iter(gs)
        return (None, *[next(it) if t.requires_grad else None for t in ins])

def checkpoint(function, *args):
    return _Ck.apply(function, *args)
""",
    ("ch02_checkpointing", "checkpoint", "c02_ckpt_plain"): r"""
def checkpoint(function, *args):
    return function(*args)
""",
    ("ch02_checkpointing", "plan_checkpoints", "c02_plan_degenerate"): r"""
def plan_checkpoints(act_bytes, fwd_flops, budget_bytes):
    if len(act_bytes) != len(fwd_flops):
        raise ValueError("lengths differ")
    if len(act_bytes) == 1:
        if act_bytes[0] <= budget_bytes:
            return [0]
        raise ValueError("does not fit")
    raise ValueError("no plan fits")
""",
    ("ch02_checkpointing", "checkpoint_uniform", "c02_uniform_plain"): r"""
def checkpoint_uniform(layers, x, segments):
    n = len(layers)
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= n:
        raise ValueError(f"bad segments {segments}")
    for l in layers:
        x = l(x)
    return x
""",
    ("ch03_accumulation", "accumulate_gradients", "c03_acc_nograd_loop"): r"""
def accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size):
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size}")
    B = inputs.shape[0]
    total = torch.zeros(())
    with torch.no_grad():
        for i in range(0, B, micro_batch_size):
            out = model(inputs[i:i + micro_batch_size])
            total = total + loss_fn(out, targets[i:i + micro_batch_size]) * out.shape[0] / B
    return total
""",
    ("ch03_accumulation", "train_accumulated", "c03_train_nostep"): r"""
def train_accumulated(model, optimizer, loss_fn, loader, micro_batch_size, steps):
    losses = []
    it = iter(loader)
    got_any = False
    while len(losses) < steps:
        try:
            xb, yb = next(it)
        except StopIteration:
            if not got_any:
                raise ValueError("empty loader")
            it = iter(loader)
            continue
        got_any = True
        losses.append(float(accumulate_gradients(model, loss_fn, xb, yb, micro_batch_size)))
    if steps > 0 and not got_any:
        raise ValueError("empty loader")
    if steps == 0:
        for _ in loader:
            break
        else:
            raise ValueError("empty loader")
    return losses
""",
    ("ch04_partial_training", "pack_bits", "c04_pack_raise"): r"""
def pack_bits(mask):
    raise ValueError("not a bool tensor")
""",
    ("ch04_partial_training", "relu_1bit", "c04_relu_zero_grad"): r"""
class _R(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(pack_bits(x > 0))
        return torch.relu(x)
    @staticmethod
    def backward(ctx, g):
        return torch.zeros_like(g)

def relu_1bit(x):
    return _R.apply(x)
""",
    ("ch04_partial_training", "relu_1bit", "c04_relu_identity_grad"): r"""
class _R(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(pack_bits(x > 0))
        return torch.relu(x)
    @staticmethod
    def backward(ctx, g):
        return g

def relu_1bit(x):
    return _R.apply(x)
""",
    ("ch04_partial_training", "set_trainable", "c04_settr_raise"): r"""
def set_trainable(model, mode):
    raise ValueError(f"unknown mode {mode!r}; valid: full, last, bn+last, bias+last")
""",
    ("ch05_tinytl", "LiteResidual", "c05_lite_zeros"): r"""
class LiteResidual(nn.Module):
    def __init__(self, in_channels, out_channels, stride=1, downsample=2, groups=2, kernel_size=5):

        super().__init__()
        for v in (in_channels, out_channels, stride, downsample, kernel_size, groups):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"bad argument {v}")
        if kernel_size % 2 == 0 or in_channels % groups or out_channels % groups:
            raise ValueError("bad kernel_size or groups")

        self.stride, self.downsample, self.out_channels = stride, downsample, out_channels
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, groups=groups, bias=False)
        self.norm = nn.BatchNorm2d(out_channels)
        self.pointwise = nn.Conv2d(out_channels, out_channels, 1, bias=False)
        self.final_norm = nn.BatchNorm2d(out_channels)
        nn.init.zeros_(self.final_norm.weight)
    def forward(self, x):
        B, C, H, W = x.shape
        h, w = -(-H // self.stride), -(-W // self.stride)
        return torch.zeros(B, self.out_channels, h, w) + 0 * self.final_norm.weight.view(1, -1, 1, 1)
""",
    ("ch05_tinytl", "apply_tinytl", "c05_tinytl_identity"): r"""
def apply_tinytl(model):
    return model
""",
    ("ch08_quantization", "QLoRALinear", "c08_qlora_errors_only"): r"""
class QLoRALinear(nn.Module):
    def __init__(self, base, rank, alpha, block_size=64):
        super().__init__()

        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")

    def forward(self, x):
        return x
""",
    ("ch09_mixed_precision", "GradScaler", "c09_gs_interface_only"): r"""
class GradScaler:
    def __init__(self, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        if not init_scale > 0:
            raise ValueError("init_scale")
        if not growth_factor > 1:
            raise ValueError("growth_factor")
        if not 0 < backoff_factor < 1:
            raise ValueError("backoff_factor")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError("growth_interval")
        self.S = float(init_scale)
        self.st = {}
    def scale(self, loss):
        return loss * 1.0
    def unscale_(self, optimizer):
        s = self.st.get(id(optimizer))
        if s is not None:
            raise RuntimeError("unscale_ twice or after step")
        self.st[id(optimizer)] = "unscaled"
    def step(self, optimizer, *args, **kwargs):
        s = self.st.get(id(optimizer))
        if s == "stepped":
            raise RuntimeError("step twice")
        self.st[id(optimizer)] = "stepped"
        return optimizer.step(*args, **kwargs)
    def update(self):
        if not self.st:
            raise RuntimeError("no step")
        self.st = {}
    def get_scale(self):
        return float(self.S)
""",
    ("ch09_mixed_precision", "mixed_precision_step", "c09_mps_noback"): r"""
def mixed_precision_step(model, optimizer, scaler, inputs, targets, loss_fn, dtype):
    with torch.autocast(device_type=inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    return float(loss)
""",
    ("ch02_checkpointing", "checkpoint", "d02_ckpt_rerun_nograds"): r"""
class _Ck(torch.autograd.Function):
    @staticmethod
    def forward(ctx, function, *args):
        ctx.function = function
        ctx.save_for_backward(*[a for a in args if isinstance(a, torch.Tensor)])
        with torch.no_grad():
            return function(*args)
    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        with torch.no_grad():
            ctx.function(*saved)
        return (None,) + tuple(None for _ in saved)

def checkpoint(function, *args):
    for a in args:
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return _Ck.apply(function, *args)
    return _Ck.apply(function, *args).requires_grad_() if False else _Ck.apply(function, *args)
""",
    ("ch06_sparse_backprop", "apply_meprop", "d06_apply_identity"): r"""
def apply_meprop(model, k, unified=False):
    if not any(isinstance(m, nn.Linear) for m in model.modules()):
        raise ValueError("no nn.Linear")
    return model
""",
    ("ch07_local_loss", "bp_schedule", "d07_bp_raise"): r"""
def bp_schedule(fwd, bwd, n_batches):
    raise ValueError("bad")
""",
    ("ch07_local_loss", "dgl_schedule", "d07_dgl_raise"): r"""
def dgl_schedule(fwd, bwd, n_batches):
    raise ValueError("bad")
""",
}

FIRST_CELL_EARNED = {"c02_ckpt_plain"}
