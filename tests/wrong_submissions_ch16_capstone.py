"""Plausible wrong answers for chapter 16, one per exercise: each must lose points when autograded."""

WRONG = {
    ("ch16_capstone", "memory_of"): '''
def memory_of(config, profile):
    """Wrong: the compression overhead (a float32 min and scale per group) is ignored."""
    kind = profile["kinds"][config.method + ("+nf4" if config.nf4 else "") + ("+bf16" if config.bf16 else "")]
    m = config.micro_batch

    def size(f32, bf16, other):
        if config.act_bits == 32:
            return 4 * f32 + 2 * bf16 + other
        return (f32 + bf16) * config.act_bits / 8 + other

    def part(name):
        e = kind["saved"].get(name)
        return 0 if e is None else size(*[m * e["per_seq"][t] + e["fixed"][t] for t in ("f32", "bf16", "other")])

    subs = sorted(part(s + str(i)) for i in range(4) for s in ("attn", "mlp"))
    state = kind["stored_bytes"] + 3 * kind["trainable_bytes"]
    if config.checkpoint:
        return state + part("embed") + 4 * size(m * profile["block_input_f32_per_seq"], 0, 0) + \\
            max(part("head"), part("attn3") + part("mlp3"))
    return state + part("embed") + part("head") + sum(subs[round(config.drop_rate * 8):])
''',
    ("ch16_capstone", "flops_of"): '''
def flops_of(config, profile):
    """Wrong: checkpointing's recompute is left out."""
    f = profile["kinds"][config.method + ("+nf4" if config.nf4 else "") + ("+bf16" if config.bf16 else "")]["flops_per_seq"]
    bwd = sorted(f[s + str(i)]["backward"] for i in range(4) for s in ("attn", "mlp"))
    return profile["global_batch"] * (f["total"] - sum(bwd[:round(config.drop_rate * 8)]))
''',
    ("ch16_capstone", "plan"): '''
def plan(budget_bytes, profile, quality_table):
    """Wrong: greedy. Start from the cheapest qualifying row and switch savers on, checkpointing first, until it fits."""
    import dataclasses

    rows = {config_of(r): r for r in quality_table}
    ok = [c for c, r in rows.items() if r["accuracy"] >= TARGET_ACCURACY]
    if not ok:
        return None
    c = min(ok, key=lambda c: rows[c]["flops"])
    moves = [dict(checkpoint=True), dict(micro_batch=16), dict(micro_batch=8), dict(micro_batch=4),
             dict(act_bits=2), dict(nf4=True)]
    for move in [{}] + moves:
        nxt = dataclasses.replace(c, **move)
        if nxt in rows and rows[nxt]["accuracy"] >= TARGET_ACCURACY:
            c = nxt
        if rows[c]["bytes"] <= budget_bytes:
            return c
    return None
''',
    ("ch16_capstone", "build"): '''
def build(config, seed=0):
    """Wrong: each micro-batch's loss is its own mean, divided by the number of micro-batches."""
    model = configured_model(config, seed)
    opt = torch.optim.Adam(trainable(model), lr=LR[config.method])
    gen = torch.Generator().manual_seed(seed)
    hooks = compression_hooks(config.act_bits) if config.act_bits < 32 else None

    def step(batch):
        x, y = batch
        dropped = draw_dropped(config, gen)
        parts = list(zip(x.split(config.micro_batch), y.split(config.micro_batch)))
        total = torch.zeros(())
        for xs, ys in parts:
            with hooks if hooks else contextlib.nullcontext():
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
                    logits = run_blocks(model, xs, dropped, config.checkpoint)
                loss = F.cross_entropy(logits.float().flatten(0, 1), ys.flatten(), ignore_index=-100) / len(parts)
                loss.backward()
            total = total + loss.detach()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    step.model = model
    return step
''',
}
