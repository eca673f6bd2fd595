"""Second correct answers for ch16_capstone, written from the released notebook alone: the predictions as sums over
part names with integer arithmetic (ceil division by negation), the plan by sorting every qualifying row on a key
tuple, the step with an ExitStack holding the hooks and autocast."""

SECOND = {
    ("ch16_capstone", "memory_of"): '''
def memory_of(config, profile):
    """State + the peak of one micro-batch's saved bytes."""
    name = config.method + ("+nf4" if config.nf4 else "") + ("+bf16" if config.bf16 else "")
    kind = profile["kinds"][name]
    m = config.micro_batch
    zero = {"per_seq": {"f32": 0, "bf16": 0, "other": 0}, "fixed": {"f32": 0, "bf16": 0, "other": 0}}

    def size(f32, bf16, other):
        if config.act_bits == 32:
            return 4 * f32 + 2 * bf16 + other
        n = f32 + bf16
        return -(-n * config.act_bits // 8) + 8 * -(-n // profile["group"]) + other

    def saved(part):
        e = kind["saved"].get(part, zero)
        return size(*[m * e["per_seq"][t] + e["fixed"][t] for t in ("f32", "bf16", "other")])

    L = profile["sublayers"] // 2
    state = kind["stored_bytes"] + 3 * kind["trainable_bytes"]
    if config.checkpoint:
        block_inputs = L * size(m * profile["block_input_f32_per_seq"], 0, 0)
        last = saved("attn%d" % (L - 1)) + saved("mlp%d" % (L - 1))
        return state + saved("embed") + block_inputs + max(saved("head"), last)
    sub = sorted(saved(s + str(i)) for i in range(L) for s in ("attn", "mlp"))
    k = round(config.drop_rate * profile["sublayers"])
    return state + saved("embed") + saved("head") + sum(sub[k:])
''',
    ("ch16_capstone", "flops_of"): '''
def flops_of(config, profile):
    """GLOBAL_BATCH sequences of forward + backward (+ recompute), the worst drawn set."""
    name = config.method + ("+nf4" if config.nf4 else "") + ("+bf16" if config.bf16 else "")
    per = profile["kinds"][name]["flops_per_seq"]
    saving = sorted(v["backward"] for key, v in per.items() if key.startswith(("attn", "mlp")))
    k = round(config.drop_rate * profile["sublayers"])
    one = per["total"] - sum(saving[:k])
    if config.checkpoint:
        one += per["recompute"]
    return profile["global_batch"] * one
''',
    ("ch16_capstone", "plan"): '''
def plan(budget_bytes, profile, quality_table):
    """Sort every qualifying row by (flops, bytes, position) and take the first."""
    ok = sorted((row["flops"], row["bytes"], pos) for pos, row in enumerate(quality_table)
                if row["bytes"] <= budget_bytes and row["accuracy"] >= TARGET_ACCURACY)
    if not ok:
        return None
    row = quality_table[ok[0][2]]
    return Config(micro_batch=row["micro_batch"], checkpoint=row["checkpoint"], method=row["method"], nf4=row["nf4"],
                  act_bits=row["act_bits"], drop_rate=row["drop_rate"], bf16=row["bf16"])
''',
    ("ch16_capstone", "build"): '''
def build(config, seed=0):
    """One Adam step per global batch, micro-batches accumulated."""
    import contextlib

    model = configured_model(config, seed)
    opt = torch.optim.Adam(trainable(model), lr=LR[config.method])
    gen = torch.Generator().manual_seed(seed)
    pair = compression_hooks(config.act_bits) if config.act_bits < 32 else None

    def step(batch):
        x, y = batch
        dropped = draw_dropped(config, gen)
        n_scored = (y != -100).sum()
        losses = []
        for start in range(0, x.shape[0], config.micro_batch):
            xs, ys = x[start:start + config.micro_batch], y[start:start + config.micro_batch]
            with contextlib.ExitStack() as stack:
                if pair is not None:
                    stack.enter_context(pair)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(config.bf16)):
                    out = run_blocks(model, xs, dropped, config.checkpoint)
                loss = F.cross_entropy(out.float().flatten(0, 1), ys.flatten(), ignore_index=-100,
                                       reduction="sum") / n_scored
                loss.backward()
            losses.append(loss.detach())
        opt.step()
        for p in trainable(model):
            p.grad = None
        return torch.stack(losses).sum()

    step.model = model
    return step
''',
}
