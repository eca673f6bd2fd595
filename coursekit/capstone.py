"""Chapter 16's reference machinery: one fine-tune of the 4-block TinyGPT, configured by every knob of the course.

A :class:`Config` picks the micro-batch (chapter 3), checkpointing of every block (chapter 2), the method (full
fine-tuning, LoRA or PaCA at rank :data:`RANK`; chapters 1 and 15), NF4 base weights (chapter 8), 2-bit group
compression of saved activations (chapter 13), DropBP (chapter 14) and bfloat16 autocast (chapter 9). This module

- builds the configured model (:func:`configured_model`) and runs its forward (:func:`run_blocks`), with the
  compression hooks (:func:`compression_hooks`) and the drop decisions of a step (:func:`draw_dropped`);
- holds the course's own training step (:func:`training_step`), the trusted measurement of a configuration
  (:func:`measured`: model state + peak resident saved bytes of one micro-batch, FLOPs of one optimizer step) and
  the per-part profile (:func:`make_profile`);
- writes ``data/capstone/profile.json`` and ``data/capstone/table.json`` (``python -m coursekit.capstone``, one
  thread, fixed seeds; ``make capstone-data``).

Rules that make every number deterministic:

- DropBP drops exactly ``round(drop_rate * 8)`` of the 8 residual sublayers each step, drawn by a seeded
  generator. Memory and FLOPs are those of the *worst* drawn set (the one that saves least): the table measures
  every set of the form "the first a attention and the first m MLP sublayers" (a + m = k; the blocks are alike, so
  these include the worst) and keeps the largest peak and the largest FLOPs.
- Compression rounds to nearest (no stochastic rounding) in groups of :data:`GROUP` consecutive elements, so that a
  sample's codes do not depend on the micro-batch it sits in.
- Each micro-batch's loss is its summed cross-entropy divided by the scored tokens of the whole global batch:
  accumulating gives the gradient of the global batch's mean, whatever the micro-batch.
"""
from __future__ import annotations

import contextlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from coursekit.checkpoints import load_pretrained
from coursekit.data import target_task
from coursekit.measure import flop_counter, saved_tensors
from coursekit.transformer import accuracy
from kernels.ch15_paca import nf4_decode_columns_torch, nf4_encode

CHECKPOINT = "tinygpt4_fibonacci"
RANK = 8  # LoRA and PaCA rank
LORA_SCALE = 2.0  # alpha / rank with alpha = 16
TARGETS = ("qkv", "proj", "fc1", "fc2")  # the linears LoRA and PaCA adapt, in every block
GLOBAL_BATCH = 32  # sequences per optimizer step
STEPS = 50  # optimizer steps of every fine-tune in the table
LR = {"full": 1e-3, "lora": 1e-2, "paca": 1e-2}  # Adam's learning rate per method
GROUP = 64  # elements per compression group (one float32 min and one float32 scale each)
SUBLAYERS = 8  # 4 blocks, an attention and an MLP sublayer each
TARGET_ACCURACY = 0.5  # the quality gate: next-token accuracy on the held-out Pell set after STEPS steps
TRAIN_SEED, EVAL_SEED, DATA_SEED = 0, 1, 2
DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "capstone"


@dataclass(frozen=True)
class Config:
    """The knobs of one fine-tune (hashable: usable as a dict key)."""

    micro_batch: int = 32  # sequences per forward/backward; GLOBAL_BATCH // micro_batch are accumulated
    checkpoint: bool = False  # every block recomputed in backward (its input kept)
    method: str = "full"  # "full", "lora" or "paca" (rank RANK on qkv, proj, fc1, fc2)
    nf4: bool = False  # frozen base weights stored in NF4 (lora and paca only)
    act_bits: int = 32  # 32: saved activations kept as they are; 2: group-quantized to 2 bits
    drop_rate: float = 0.0  # DropBP: round(drop_rate * 8) sublayers skip their backward each step
    bf16: bool = False  # bfloat16 autocast around the forward

    @property
    def drops(self) -> int:
        return round(self.drop_rate * SUBLAYERS)


def grid() -> tuple[Config, ...]:
    """Every configuration of the chapter, in a fixed order. Pruned: NF4 only with lora/paca (full fine-tuning
    trains the base weights); bf16 only without NF4 and without compression (those already store weights or
    activations in fewer bits)."""
    out = []
    for method, nf4 in (("full", False), ("lora", False), ("lora", True), ("paca", False), ("paca", True)):
        for bits in (32, 2):
            for bf16 in (False, True):
                if bf16 and (nf4 or bits != 32):
                    continue
                for drop in (0.0, 0.25, 0.5):
                    for ckpt in (False, True):
                        for mb in (32, 16, 8, 4):
                            out.append(Config(mb, ckpt, method, nf4, bits, drop, bf16))
    return tuple(out)


def quality_key(c: Config) -> tuple:
    """The knobs that change what is learned (micro-batch and checkpointing change only memory and FLOPs)."""
    return (c.method, c.nf4, c.act_bits, c.drop_rate, c.bf16)


# --- adapted linears ----------------------------------------------------------------------------------------------
class _DecodedLinear(torch.autograd.Function):
    """y = x W^T + b with W decoded from NF4 (columns ``idx`` replaced by ``cols``): saves the codes (buffers),
    ``x`` only if ``keep_x`` (a LoRA base needs no weight gradient) and decodes W again in backward."""

    @staticmethod
    def forward(ctx, x, cols, packed, absmax, bias, idx, shape):
        w = nf4_decode_columns_torch(packed, absmax, shape, idx, cols.detach())
        ctx.save_for_backward(packed, absmax, idx, cols)
        ctx.shape = shape
        return F.linear(x, w, bias)

    @staticmethod
    def backward(ctx, g):
        packed, absmax, idx, cols = ctx.saved_tensors
        w = nf4_decode_columns_torch(packed, absmax, ctx.shape, idx, cols.detach())
        dx = (g.float() @ w).to(g.dtype) if ctx.needs_input_grad[0] else None
        return dx, None, None, None, None, None, None


class _ColumnLinear(torch.autograd.Function):
    """PaCA's partial connections: y = x W'^T + b, W' = W with columns idx replaced by P; saves x[..., idx] only."""

    @staticmethod
    def forward(ctx, x, P, weight, packed, absmax, bias, idx, shape):
        if packed is None:
            w = weight.detach().index_copy(1, idx, P.detach())
        else:
            w = nf4_decode_columns_torch(packed, absmax, shape, idx, P.detach())
        y = F.linear(x, w, bias)
        x_cols = x.index_select(-1, idx)
        if torch.is_autocast_enabled("cpu"):
            x_cols = x_cols.to(torch.bfloat16)
        ctx.save_for_backward(x_cols, P, weight, packed, absmax, idx)
        ctx.shape = shape
        return y

    @staticmethod
    def backward(ctx, g):
        x_cols, P, weight, packed, absmax, idx = ctx.saved_tensors
        gf = g.float().reshape(-1, g.shape[-1])
        dP = gf.t() @ x_cols.float().reshape(-1, x_cols.shape[-1])
        dx = None
        if ctx.needs_input_grad[0]:
            if packed is None:
                w = weight.detach().index_copy(1, idx, P.detach())
            else:
                w = nf4_decode_columns_torch(packed, absmax, ctx.shape, idx, P.detach())
            dx = (gf @ w).reshape(*g.shape[:-1], w.shape[1]).to(g.dtype)
        return dx, dP, None, None, None, None, None, None


_ENCODED: dict = {}


def _encoded(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """nf4_encode(w), remembered by value: every configured model encodes the same pretrained weights."""
    key = (tuple(w.shape), hash(w.numpy().tobytes()))
    if key not in _ENCODED:
        _ENCODED[key] = nf4_encode(w)
    packed, absmax = _ENCODED[key]
    return packed.clone(), absmax.clone()


class _Adapted(nn.Module):
    """A frozen base linear (float or NF4) with LoRA or PaCA on top."""

    def __init__(self, base: nn.Linear, method: str, nf4: bool, gen: torch.Generator):
        super().__init__()
        out_f, in_f = base.weight.shape
        self.method, self.shape = method, (out_f, in_f)
        self.bias = nn.Parameter(base.bias.detach().clone(), requires_grad=False)
        if nf4:
            packed, absmax = _encoded(base.weight.detach())
            self.register_buffer("packed", packed)
            self.register_buffer("absmax", absmax)
            self.weight = None
        else:
            self.weight = nn.Parameter(base.weight.detach().clone(), requires_grad=False)
            self.packed = self.absmax = None
        if method == "paca":
            self.register_buffer("idx", torch.randperm(in_f, generator=gen)[:RANK].sort().values)
            source = base.weight.detach()
            self.P = nn.Parameter(source[:, self.idx].clone())
        else:
            self.register_buffer("idx", torch.zeros(0, dtype=torch.int64))
            bound = 1 / math.sqrt(in_f)
            self.A = nn.Parameter((torch.rand(RANK, in_f, generator=gen) * 2 - 1) * bound)
            self.B = nn.Parameter(torch.zeros(out_f, RANK))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        if self.method == "paca":
            return _ColumnLinear.apply(x, self.P, self.weight, self.packed, self.absmax, self.bias, self.idx,
                                       self.shape)
        if self.weight is None:
            base = _DecodedLinear.apply(x, torch.zeros(self.shape[0], 0), self.packed, self.absmax, self.bias,
                                        self.idx, self.shape)
        else:
            base = F.linear(x, self.weight, self.bias)
        return base + LORA_SCALE * F.linear(F.linear(x, self.A), self.B)


def configured_model(config: Config, seed: int = 0) -> nn.Module:
    """The pretrained 4-block TinyGPT set up for ``config.method`` / ``config.nf4``: every parameter trains for
    "full"; for "lora" and "paca" only the adapters (A, B or P) of qkv, proj, fc1 and fc2 train, their base weights
    stay frozen (NF4 codes in buffers when ``config.nf4``). Adapters are initialised from ``seed``."""
    if config.method not in LR:
        raise ValueError(f"method must be one of {sorted(LR)}, got {config.method!r}")
    model = load_pretrained(CHECKPOINT)
    if config.method == "full":
        if config.nf4:
            raise ValueError("nf4 needs a frozen base: method 'lora' or 'paca'")
        return model
    model.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and name.split(".")[-1] in TARGETS:
            model.set_submodule(name, _Adapted(module, config.method, config.nf4, gen))
    return model


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


# --- compression, drops, the blocks ---------------------------------------------------------------------------------
def _quantize(t: torch.Tensor, bits: int):
    flat = t.detach().reshape(-1).float()
    n = flat.numel()
    groups = -(-n // GROUP)
    padded = F.pad(flat, (0, groups * GROUP - n)).view(groups, GROUP)
    lo, hi = padded.min(1).values, padded.max(1).values
    scale = (2**bits - 1) / (hi - lo + 1e-6)
    codes = ((padded - lo[:, None]) * scale[:, None]).round().clamp(0, 2**bits - 1).to(torch.uint8)
    per = 8 // bits
    codes = codes.view(-1, per)
    packed = codes[:, 0].clone()
    for i in range(1, per):
        packed |= codes[:, i] << (i * bits)
    return packed, lo, scale, t.shape, t.dtype, n


def _dequantize(packed, lo, scale, shape, dtype, n, bits):
    per = 8 // bits
    codes = torch.stack([(packed >> (i * bits)) & (2**bits - 1) for i in range(per)], 1).view(lo.numel(), GROUP)
    values = codes.float() / scale[:, None] + lo[:, None]
    return values.reshape(-1)[:n].view(shape).to(dtype)


class compression_hooks:
    """The (pack, unpack) pair that stores every saved floating-point tensor that is not a parameter in ``bits``
    bits (groups of GROUP elements, a float32 min and scale each, round to nearest); other tensors and parameters
    are kept as they are. A tensor saved twice (same storage, offset, shape and strides) is packed once.

    Use as a context manager, ``with hooks:`` (the pair is installed as saved-tensor hooks, and the packed copies
    are forgotten on exit: enter it around one micro-batch's forward and backward), or pass ``pack=``/``unpack=``
    to ``coursekit.measure``."""

    def __init__(self, bits: int):
        if bits not in (2, 4, 8):
            raise ValueError(f"bits must be 2, 4 or 8, got {bits!r}")
        self.bits = bits
        self._cache: dict = {}

    def __iter__(self):
        return iter((self.pack, self.unpack))

    def pack(self, t: torch.Tensor):
        if not t.is_floating_point() or isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter) \
                or t.numel() == 0:
            return t
        # A storage saved again under another shape (softmax's output, then its (B*H, T, T) view for a bmm) is
        # packed once: keyed by where its elements start, how many and in what order.
        layout = () if t.is_contiguous() else (tuple(t.shape), t.stride())
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel(), t.dtype, layout)
        hit = self._cache.get(key)
        if hit is None:  # the tensor itself is kept with its codes: its address cannot be reused meanwhile
            hit = self._cache[key] = (t.detach(), _quantize(t, self.bits))
        return ("q", hit[1], tuple(t.shape))

    def unpack(self, packed):
        if isinstance(packed, tuple) and packed and packed[0] == "q":
            return _dequantize(*packed[1], self.bits).reshape(packed[2])
        return packed

    def clear(self) -> None:
        self._cache.clear()

    def __enter__(self) -> "compression_hooks":
        self._active = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        self._active.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._active.__exit__(*exc)
        self.clear()


def draw_dropped(config: Config, generator: torch.Generator) -> frozenset[int]:
    """The sublayers (0..7: 2i the attention, 2i + 1 the MLP of block i) that skip backward this step:
    ``round(config.drop_rate * 8)`` of them, ``torch.randperm(8, generator=generator)[:k]`` (one draw per step,
    also when k is 0)."""
    order = torch.randperm(SUBLAYERS, generator=generator)
    return frozenset(int(i) for i in order[:config.drops])


def _sublayer(block: nn.Module, j: int, x: torch.Tensor, dropped: bool) -> torch.Tensor:
    f = (lambda t: block.attn(block.ln1(t))) if j == 0 else (lambda t: block.mlp(block.ln2(t)))
    if dropped:
        with torch.no_grad():
            out = f(x)
        return x + out
    return x + f(x)


def _block(block: nn.Module, i: int, x: torch.Tensor, dropped: frozenset) -> torch.Tensor:
    x = _sublayer(block, 0, x, 2 * i in dropped)
    return _sublayer(block, 1, x, 2 * i + 1 in dropped)


class _Recompute(torch.autograd.Function):
    """Runs ``run(x)`` without a graph, keeps x (through the active saved-tensor hooks) and runs it again in
    backward (in the forward's autocast state) to backpropagate."""

    @staticmethod
    def forward(ctx, run, x, anchor):
        ctx.run, ctx.autocast = run, torch.is_autocast_enabled("cpu")
        ctx.save_for_backward(x)
        with torch.no_grad():
            return run(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        x = x.detach().clone().requires_grad_(ctx.needs_input_grad[1])
        with torch.enable_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=ctx.autocast):
            y = ctx.run(x)
        if y.requires_grad:  # not when both of its sublayers are dropped and x needs no gradient
            torch.autograd.backward(y, g)
        return None, (x.grad if ctx.needs_input_grad[1] else None), None


_ANCHOR = torch.zeros(0, requires_grad=True)  # makes a recomputed block's output require grad in lora/paca


def run_blocks(model: nn.Module, idx: torch.Tensor, dropped: frozenset = frozenset(),
               checkpoint: bool = False) -> torch.Tensor:
    """TinyGPT's forward, (B, T) token ids -> (B, T, V) logits, with the sublayers in ``dropped`` run under
    no_grad (DropBP) and, if ``checkpoint``, every block recomputed in backward from its kept input."""
    B, T = idx.shape
    x = model.tok_emb(idx) + model.pos_emb(torch.arange(T))
    for i, block in enumerate(model.blocks):
        kept = [m for j, m in enumerate((block.attn, block.mlp)) if 2 * i + j not in dropped]
        learns = x.requires_grad or any(p.requires_grad for m in kept for p in m.parameters())
        if checkpoint and learns:  # the anchor gives the output a graph where plain autograd would build one
            x = _Recompute.apply(lambda t, b=block, i=i: _block(b, i, t, dropped), x, _ANCHOR)
        else:
            x = _block(block, i, x, dropped)
    return model.lm_head(model.ln_f(x))


def _micro_loss(model, config, xs, ys, scored, dropped):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
        logits = run_blocks(model, xs, dropped, config.checkpoint)
    return F.cross_entropy(logits.float().flatten(0, 1), ys.flatten(), ignore_index=-100, reduction="sum") / scored


def training_step(config: Config, seed: int = 0):
    """The course's own step for ``config``: ``step((x, y)) -> loss`` (the global batch's mean cross-entropy, a
    detached float32 scalar) after forward + backward over the micro-batches and one Adam step; ``step.model``."""
    if GLOBAL_BATCH % config.micro_batch:
        raise ValueError(f"micro_batch must divide {GLOBAL_BATCH}, got {config.micro_batch}")
    model = configured_model(config, seed)
    opt = torch.optim.Adam(trainable(model), lr=LR[config.method])
    gen = torch.Generator().manual_seed(seed)
    hooks = compression_hooks(config.act_bits) if config.act_bits < 32 else None

    def step(batch):
        x, y = batch
        dropped = draw_dropped(config, gen)
        n_targets = y.ne(-100).sum()  # the whole global batch's scored targets
        losses = []
        for start in range(0, x.shape[0], config.micro_batch):
            stop = start + config.micro_batch
            with hooks if hooks is not None else contextlib.nullcontext():
                loss = _micro_loss(model, config, x[start:stop], y[start:stop], n_targets, dropped)
                loss.backward()
            losses.append(loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
        return sum(losses, torch.zeros(()))

    step.model = model
    return step


# --- measurement -----------------------------------------------------------------------------------------------------
def state_bytes(model: nn.Module) -> int:
    """Parameters and buffers (each storage once) + a gradient and Adam's two moments per trainable parameter."""
    seen = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    train = sum(p.numel() * p.element_size() for p in trainable(model))
    return sum(seen.values()) + 3 * train


def measurement_batch(micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    task = target_task(GLOBAL_BATCH, DATA_SEED)
    return task.x[:micro_batch], task.y[:micro_batch]


def _worst_sets(k: int) -> list[frozenset]:
    """Sets of the form: the first a attention and the first k - a MLP sublayers."""
    return [frozenset([2 * i for i in range(a)] + [2 * i + 1 for i in range(k - a)]) for a in range(k + 1)]


def _measure_once(model, config, xs, ys, dropped, label=None):
    hooks = compression_hooks(config.act_bits) if config.act_bits < 32 else None
    kw = {} if hooks is None else {"pack": hooks.pack, "unpack": hooks.unpack}
    scored = (ys != -100).sum() * (GLOBAL_BATCH // config.micro_batch)
    with saved_tensors(model, label=label, **kw) as rec:
        with flop_counter() as counter:
            loss = _micro_loss(model, config, xs, ys, scored, dropped)
            loss.backward()
    model.zero_grad(set_to_none=True)
    return rec.peak_activation_bytes, counter.get_total_flops()


_MODELS: dict = {}


def measured(config: Config) -> dict:
    """The trusted measurement: ``bytes`` = model state + the worst drawn set's peak resident saved bytes of one
    micro-batch; ``flops`` = FLOPs of one optimizer step (GLOBAL_BATCH // micro_batch forward + backward +
    recompute), the worst drawn set's."""
    key = (config.method, config.nf4)
    if key not in _MODELS:  # the measured step changes no weight: one model per method serves every knob
        _MODELS[key] = configured_model(config)
    model = _MODELS[key]
    xs, ys = measurement_batch(config.micro_batch)
    peak = flops = 0
    for dropped in _worst_sets(config.drops):
        p, f = _measure_once(model, config, xs, ys, dropped)
        peak, flops = max(peak, p), max(flops, f)
    return {"bytes": state_bytes(model) + peak, "flops": flops * (GLOBAL_BATCH // config.micro_batch)}


# --- the profile -------------------------------------------------------------------------------------------------------
def _parts(model: nn.Module, config: Config, m: int) -> tuple[dict, dict]:
    """Saved storages per part (embed, attn0, mlp0, ..., head) of one plain micro-batch of m sequences, and the
    forward / backward FLOPs per part."""
    current = ["embed"]
    hooks = []
    for i, block in enumerate(model.blocks):
        hooks.append(block.ln1.register_forward_pre_hook(lambda *_, i=i: current.__setitem__(0, f"attn{i}")))
        hooks.append(block.ln2.register_forward_pre_hook(lambda *_, i=i: current.__setitem__(0, f"mlp{i}")))
    hooks.append(model.ln_f.register_forward_pre_hook(lambda *_: current.__setitem__(0, "head")))
    xs, ys = measurement_batch(m)
    scored = (ys != -100).sum()
    with saved_tensors(model, label=lambda: current[0]) as rec:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
            logits = run_blocks(model, xs)
        current[0] = "head"
        loss = F.cross_entropy(logits.float().flatten(0, 1), ys.flatten(), ignore_index=-100,
                               reduction="sum") / scored
    for h in hooks:
        h.remove()
    saved: dict = {}
    for t in rec.tensors:
        if t.is_state:
            continue
        kind = "f32" if t.dtype == torch.float32 else "bf16" if t.dtype == torch.bfloat16 else "other"
        entry = saved.setdefault(t.label, {"f32": 0, "bf16": 0, "other": 0})
        entry[kind] += t.nbytes if kind == "other" else t.nbytes // (4 if kind == "f32" else 2)
    del loss, logits
    # FLOPs per part: forward of each sublayer, and backward with and without it dropped.
    flops = {}
    with flop_counter() as c:
        _micro_loss(model, config, xs, ys, scored, frozenset()).backward()
    full_total = c.get_total_flops()
    model.zero_grad(set_to_none=True)
    for j in range(SUBLAYERS):
        with flop_counter() as c:
            _micro_loss(model, config, xs, ys, scored, frozenset([j])).backward()
        model.zero_grad(set_to_none=True)
        flops[f"{'attn' if j % 2 == 0 else 'mlp'}{j // 2}"] = {"backward": full_total - c.get_total_flops()}
    ckpt_config = Config(m, True, config.method, config.nf4, 32, 0.0, config.bf16)
    with flop_counter() as c:
        _micro_loss(model, ckpt_config, xs, ys, scored, frozenset()).backward()
    model.zero_grad(set_to_none=True)
    flops["recompute"] = c.get_total_flops() - full_total
    flops["total"] = full_total
    return saved, flops


def make_profile() -> dict:
    """Per kind (method, nf4, bf16): model state, and per part (embed, attn0, mlp0, ..., head) the saved float32 and
    bfloat16 elements and other bytes per sequence plus what does not grow with the micro-batch, from plain
    micro-batches of 4 and 8 sequences; FLOPs per sequence (whole step, each sublayer's backward, the recompute)."""
    profile = {"global_batch": GLOBAL_BATCH, "group": GROUP, "sublayers": SUBLAYERS,
               "block_input_f32_per_seq": None, "kinds": {}}
    for method, nf4, bf16 in (("full", False, False), ("full", False, True), ("lora", False, False),
                              ("lora", False, True), ("lora", True, False), ("paca", False, False),
                              ("paca", False, True), ("paca", True, False)):
        config = Config(4, False, method, nf4, 32, 0.0, bf16)
        torch.manual_seed(0)
        model = configured_model(config)
        s4, f4 = _parts(model, config, 4)
        s8, _ = _parts(model, config, 8)
        parts = {}
        for part in s8:
            a, b = s4.get(part, {"f32": 0, "bf16": 0, "other": 0}), s8[part]
            per = {k: (b[k] - a[k]) // 4 for k in a}
            fixed = {k: a[k] - 4 * per[k] for k in a}
            parts[part] = {"per_seq": per, "fixed": fixed}
        flops = {k: {kk: vv // 4 for kk, vv in v.items()} if isinstance(v, dict) else v // 4 for k, v in f4.items()}
        params = sum(p.numel() * p.element_size() for p in trainable(model))
        stored = state_bytes(model) - 3 * params
        name = f"{method}{'+nf4' if nf4 else ''}{'+bf16' if bf16 else ''}"
        profile["kinds"][name] = {"stored_bytes": stored, "trainable_bytes": params, "saved": parts,
                                  "flops_per_seq": flops}
    profile["block_input_f32_per_seq"] = 32 * 64  # T x d_model
    return profile


def kind_of(config: Config) -> str:
    return f"{config.method}{'+nf4' if config.nf4 else ''}{'+bf16' if config.bf16 else ''}"


# --- quality -------------------------------------------------------------------------------------------------------------
def fine_tune_accuracy(config: Config, steps: int = STEPS) -> float:
    """Held-out next-token accuracy on Pell after ``steps`` steps of :func:`training_step` (micro-batch 32, no
    checkpointing: neither changes what is learned)."""
    torch.manual_seed(0)
    step = training_step(Config(GLOBAL_BATCH, False, config.method, config.nf4, config.act_bits, config.drop_rate,
                                config.bf16), seed=TRAIN_SEED)
    task = target_task(2048, TRAIN_SEED)
    g = torch.Generator().manual_seed(TRAIN_SEED)
    for _ in range(steps):
        idx = torch.randperm(len(task), generator=g)[:GLOBAL_BATCH]
        step((task.x[idx], task.y[idx]))
    held = target_task(512, EVAL_SEED)
    return accuracy(step.model, held.x, held.y)


def load_profile() -> dict:
    return json.loads((DATA_DIR / "profile.json").read_text())


def load_table() -> list[dict]:
    """The shipped table: one row per grid configuration (its fields, measured ``bytes`` and ``flops``,
    ``accuracy``), in the order of :func:`grid`."""
    return json.loads((DATA_DIR / "table.json").read_text())["rows"]


def config_of(row: dict) -> Config:
    return Config(**{k: row[k] for k in Config.__dataclass_fields__})


def _one_thread(_=None) -> None:
    torch.set_num_threads(1)


def main(jobs: int = 1) -> None:
    """Write the profile and the table: one fine-tune per combination of the quality knobs, one measurement per
    configuration, each in one thread (``jobs`` worker processes share them; every result depends only on its
    configuration, not on the process that computed it)."""
    from multiprocessing import get_context

    from tqdm import tqdm

    _one_thread()
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    (DATA_DIR / "profile.json").write_text(json.dumps(make_profile(), indent=1, sort_keys=True) + "\n")
    keys = list(dict.fromkeys(quality_key(c) for c in grid()))
    firsts = [next(c for c in grid() if quality_key(c) == k) for k in keys]
    with get_context("fork").Pool(jobs, initializer=_one_thread) as pool:
        accuracies = list(tqdm(pool.imap(fine_tune_accuracy, firsts), total=len(firsts), desc="fine-tunes"))
        measurements = list(tqdm(pool.imap(measured, grid()), total=len(grid()), desc="measurements"))
    quality = dict(zip(keys, accuracies))
    rows = [{**asdict(c), **m, "accuracy": round(quality[quality_key(c)], 6)} for c, m in zip(grid(), measurements)]
    table = {"target_accuracy": TARGET_ACCURACY, "steps": STEPS, "global_batch": GLOBAL_BATCH, "rows": rows}
    (DATA_DIR / "table.json").write_text(json.dumps(table, indent=0) + "\n")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="write data/capstone/profile.json and table.json")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (each one thread)")
    main(parser.parse_args().jobs)
