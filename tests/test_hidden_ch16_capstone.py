"""The hidden tests of chapter 16 accept correct implementations and reject plausible wrong ones.

The correct implementation is the second answer of ``tests/second_submissions_ch16_capstone.py``, written from the
released notebook's text alone (integer ceil divisions, a sort over every qualifying row, an ExitStack for the
hooks). The wrong ones below break one stated property each (the contract table names the cell that grades it):
the compression overhead, Adam's state for frozen weights, what grows with the micro-batch, the worst drawn set,
the recompute, a lookup of the table; a greedy planner, one that ranks by its own predictions without the overheads, one
that ignores the quality gate, one that never says None; a step that averages per micro-batch,
draws the drops per micro-batch, skips the compression or the autocast, or keeps the gradients between steps. The
last tests run the checks through the sandbox, as the autograder does.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

import coursekit.capstone as cap
from grader.api import LocalNamespace, checks_for

from contract_tables import Clause, contract_tests
from sandbox_checks import sandbox_tests
from second_submissions_ch16_capstone import SECOND
from wrong_submissions_ch16_capstone import WRONG

CHAPTER = "ch16_capstone"
CHECKS = checks_for(CHAPTER)
GRADE_IDS = {
    "memory_of": ["test_memory_of"],
    "flops_of": ["test_flops_of"],
    "plan": ["test_plan", "test_plan_edge_cases"],
    "build": ["test_build"],
}
SETUP = {"math": math, "torch": torch, "F": F, "GLOBAL_BATCH": cap.GLOBAL_BATCH, "LR": cap.LR, "RANK": cap.RANK,
         "SUBLAYERS": cap.SUBLAYERS, "contextlib": contextlib, "config_of": cap.config_of, "TARGET_ACCURACY": cap.TARGET_ACCURACY, "Config": cap.Config,
         "compression_hooks": cap.compression_hooks, "configured_model": cap.configured_model,
         "draw_dropped": cap.draw_dropped, "grid": cap.grid, "load_profile": cap.load_profile,
         "load_table": cap.load_table, "run_blocks": cap.run_blocks, "trainable": cap.trainable,
         "GRID": cap.grid(), "PROFILE": cap.load_profile(), "TABLE": cap.load_table()}


def _defined(source: str, name: str, scope: dict):
    exec(compile(source, f"<{name}>", "exec"), scope)
    return scope[name]


_SCOPE: dict = dict(SETUP)
CORRECT = {ex: _defined(SECOND[(CHAPTER, ex)], ex, _SCOPE) for ex in GRADE_IDS}


def namespace(**overrides) -> LocalNamespace:
    return LocalNamespace({**SETUP, **CORRECT, **overrides})


def test_every_graded_cell_has_a_check():
    assert set(CHECKS) == {cell for cells in GRADE_IDS.values() for cell in cells}


def test_second_correct_implementation_passes():
    ns = namespace()
    for cells in GRADE_IDS.values():
        for cell in cells:
            CHECKS[cell](ns)


# --- wrong answers, one property broken at a time ---------------------------------------------------------------------
def _kind(c, profile):
    return profile["kinds"][c.method + ("+nf4" if c.nf4 else "") + ("+bf16" if c.bf16 else "")]


def make_memory(overhead=True, adam_frozen=False, fixed_grows=False, drops=True, recompute=True):
    def memory_of(config, profile):
        kind, m, bits = _kind(config, profile), config.micro_batch, config.act_bits

        def size(f32, bf16, other):
            if bits == 32:
                return 4 * f32 + 2 * bf16 + other
            n = f32 + bf16
            return n * bits / 8 + (n / profile["group"] * 8 if overhead else 0) + other

        def part(name):
            e = kind["saved"].get(name)
            if e is None:
                return 0
            return size(*[(m * (e["per_seq"][t] + e["fixed"][t]) if fixed_grows else m * e["per_seq"][t] + e["fixed"][t])
                          for t in ("f32", "bf16", "other")])

        subs = sorted(part(s + str(i)) for i in range(4) for s in ("attn", "mlp"))
        state = (4 if adam_frozen else 1) * kind["stored_bytes"] + (0 if adam_frozen else 3) * kind["trainable_bytes"]
        if config.checkpoint:
            last = part("attn3") + part("mlp3") if recompute else 0
            return state + part("embed") + 4 * size(m * profile["block_input_f32_per_seq"], 0, 0) + \
                max(part("head"), last)
        k = round(config.drop_rate * 8) if drops else 0
        return state + part("embed") + part("head") + sum(subs[k:])
    return memory_of


def make_flops(recompute=True, drops=True, largest=False, per_micro_batch=False):
    def flops_of(config, profile):
        f = _kind(config, profile)["flops_per_seq"]
        bwd = sorted((f[s + str(i)]["backward"] for i in range(4) for s in ("attn", "mlp")), reverse=largest)
        k = round(config.drop_rate * 8) if drops else 0
        n = config.micro_batch if per_micro_batch else profile["global_batch"]
        return n * (f["total"] - sum(bwd[:k]) + (f["recompute"] if config.checkpoint and recompute else 0))
    return flops_of


def lookup(key):
    rows = {cap.config_of(r): r for r in cap.load_table()}

    def fn(config, profile):
        return rows[config][key]
    return fn


def make_plan(gate=True, none=True, predicted=False, own_flops=False):
    mem, flo = make_memory(), make_flops(recompute=not own_flops)
    mem_no_overhead = make_memory(overhead=False)

    def plan(budget_bytes, profile, quality_table):
        best = None
        for i, row in enumerate(quality_table):
            c = cap.config_of(row)
            size = (mem_no_overhead(c, profile) if own_flops else mem(c, profile)) if (predicted or own_flops) \
                else row["bytes"]
            cost = flo(c, profile) if own_flops else row["flops"]
            if size > budget_bytes or (gate and row["accuracy"] < cap.TARGET_ACCURACY):
                continue
            if best is None or (cost, row["bytes"], i) < best[0]:
                best = ((cost, row["bytes"], i), c)
        if best is None:
            if none:
                return None
            return cap.config_of(min(quality_table, key=lambda r: r["bytes"]))
        return best[1]
    return plan


def make_build(per_micro_mean=False, draw_each=False, no_hooks=False, no_autocast=False, keep_grads=False):
    def build(config, seed=0):
        model = cap.configured_model(config, seed)
        opt = torch.optim.Adam(cap.trainable(model), lr=cap.LR[config.method])
        gen = torch.Generator().manual_seed(seed)
        hooks = cap.compression_hooks(config.act_bits) if config.act_bits < 32 and not no_hooks else None

        def step(batch):
            x, y = batch
            dropped = cap.draw_dropped(config, gen)
            parts = list(zip(x.split(config.micro_batch), y.split(config.micro_batch)))
            scored = (y != -100).sum()
            total = torch.zeros(())
            for xs, ys in parts:
                if draw_each:
                    dropped = cap.draw_dropped(config, gen)
                with hooks if hooks else contextlib.nullcontext():
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16 and not no_autocast):
                        logits = cap.run_blocks(model, xs, dropped, config.checkpoint)
                    if per_micro_mean:
                        loss = F.cross_entropy(logits.float().flatten(0, 1), ys.flatten(),
                                               ignore_index=-100) / len(parts)
                    else:
                        loss = F.cross_entropy(logits.float().flatten(0, 1), ys.flatten(), ignore_index=-100,
                                               reduction="sum") / scored
                    loss.backward()
                total = total + loss.detach()
            opt.step()
            if not keep_grads:
                opt.zero_grad(set_to_none=True)
            return total

        step.model = model
        return step
    return build


def _m(**kw):
    return {"memory_of": make_memory(**kw)}


def _f(**kw):
    return {"flops_of": make_flops(**kw)}


def _p(**kw):
    return {"plan": make_plan(**kw)}


def _b(**kw):
    return {"build": make_build(**kw)}


MEM, FLOP = "more than 8% from the measurement", "more than 2% from the measurement"
SCALED = "on a profile with other numbers"

CONTRACT = [
    Clause("memory_of", "ceil(n * bits / 8) + 8 * ceil(n / 64) + other", ("test_memory_of",), _m(overhead=False),
           MEM, label="compression-overhead-ignored"),
    Clause("memory_of", "none for frozen ones", ("test_memory_of",), _m(adam_frozen=True), MEM,
           label="adam-state-for-frozen-weights"),
    Clause("memory_of", "f32 = m · per_seq + fixed", ("test_memory_of",), _m(fixed_grows=True), MEM,
           label="linear-in-micro-batch"),
    Clause("memory_of", "minus the k = round(drop_rate * 8) *smallest* sublayer parts", ("test_memory_of",),
           _m(drops=False), MEM, label="drops-ignored"),
    Clause("memory_of", "and attn3 + mlp3 (what the last block's recompute saves)", ("test_memory_of",),
           _m(recompute=False), MEM, label="recompute-ignored"),
    Clause("memory_of", "on a profile with every number scaled", ("test_memory_of",),
           {"memory_of": lookup("bytes")}, SCALED, label="table-lookup"),
    Clause("flops_of", "plus `recompute` when checkpointing", ("test_flops_of",), _f(recompute=False), FLOP,
           label="recompute-ignored"),
    Clause("flops_of", "minus the backward of the k sublayers whose `backward` is smallest", ("test_flops_of",),
           _f(largest=True), FLOP, label="best-drawn-set"),
    Clause("flops_of", "FLOPs per optimizer step: `global_batch` sequences", ("test_flops_of",),
           _f(per_micro_batch=True), FLOP, label="one-micro-batch"),
    Clause("flops_of", "with every number scaled by factors drawn at grading time", ("test_flops_of",),
           {"flops_of": lookup("flops")}, SCALED, label="table-lookup"),
    Clause("plan", "Exhaustive search", ("test_plan",),
           {"plan": _defined(WRONG[(CHAPTER, "plan")], "plan", dict(SETUP))}, "rho", label="greedy"),
    Clause("plan", "whose `accuracy` ≥ `TARGET_ACCURACY`", ("test_plan",), _p(gate=False), "quality gate",
           label="quality-gate-ignored"),
    Clause("plan", "None when no row qualifies", ("test_plan_edge_cases",), _p(none=False), "must return None",
           label="never-none"),
    Clause("plan", "the least `flops`", ("test_plan",), _p(own_flops=True), "rho|over budget",
           label="own-prediction-without-overheads"),
    Clause("build", "divided by the number of scored targets of the whole (x, y)", ("test_build",),
           _b(per_micro_mean=True), "loss of step|elements differ", label="mean-per-micro-batch"),
    Clause("build", "one draw per step, before the micro-batches", ("test_build",), _b(draw_each=True), "loss of step|elements differ",
           label="drops-drawn-per-micro-batch"),
    Clause("build", "forward and backward run inside ``with hooks:``", ("test_build",), _b(no_hooks=True), "loss of step|elements differ",
           label="no-compression"),
    Clause("build", 'inside ``torch.autocast("cpu", dtype=torch.bfloat16)`` when ``config.bf16``', ("test_build",),
           _b(no_autocast=True), "loss of step|elements differ", label="no-autocast"),
    Clause("build", "the gradients set to None", ("test_build",), _b(keep_grads=True), "loss of step|elements differ",
           label="gradients-kept"),
]

test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
    test_contract_covers_every_graded_cell = contract_tests(CHAPTER, CONTRACT, namespace, CHECKS, globals())


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(CHAPTER, WRONG)
