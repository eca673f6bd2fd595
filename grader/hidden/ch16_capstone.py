"""Hidden tests of chapter 16 (capstone), one graded cell per property.

``memory_of`` / ``flops_of`` (``test_memory_of``, ``test_flops_of``): the student's function runs on every
configuration of the grid in one probe call (``probes.ch16_each``, Config objects made in the worker); each value
is compared with the shipped table's measurement (the course's own build, ``coursekit.capstone.measured``): within
8% for memory, 2% for FLOPs. A second call passes a profile whose numbers the judge scaled part by part with
factors drawn at grading time; the values must then be within the same tolerance of the judge's own composition
(written here): a lookup of the table, or a composition that ignores the compression overhead, Adam's state being
for trainable parameters only, the worst drawn DropBP set or the recompute, fails one of the two.

``plan`` (``test_plan``, ``test_plan_edge_cases``): budgets drawn at grading time from the stated ranges, each at
least 2% from every row's measured bytes. The student's plan is read back as fields (``probes.ch16_fields``), looked
up in the grid, built and measured by the judge itself (``measured``, the course's own build, in the judge's
process): over budget fails, an accuracy below the target fails, and rho = FLOPs / least FLOPs of a qualifying row
must be at most 1.1. A table whose accuracies and bytes the judge shuffled among rows is planned as well (judged
on that table's own values). The infeasible budget must give None.

``build`` (``test_build``): three configurations drawn at grading time (one with checkpointing, drops and
compression; one with bf16; one with NF4), all at micro-batch 16 (two micro-batches:
the accumulation and the once-per-step draw show), and a drawn seed: two steps on drawn batches, the losses within relative
1e-4 of the course's step and every trainable parameter after them (at most 0.1% of the elements off by more than
1e-4). Memory is not graded on build (too small a difference at this size to read from outside with margin).
"""
from __future__ import annotations

import math
import random

import torch

from coursekit import capstone as cap
from coursekit.checks import check_close  # noqa: F401 - the chapter's tolerance helpers
from coursekit.data import target_task
from grader import probes
from grader.api import fetch, hidden_test
from grader.resources import new_seed
from grader.source_policy import SourcePolicy, Shortcut

SOURCE_POLICY = SourcePolicy(shortcuts=(
    Shortcut(paths=("coursekit.capstone.training_step", "coursekit.capstone.measured",
                    "coursekit.capstone.make_profile", "coursekit.capstone.fine_tune_accuracy",
                    "coursekit.capstone.main", "coursekit.capstone.state_bytes"),
             instead="compose the step and the predictions yourself from the provided pieces; the course's own "
                     "step and measurement are what the judge grades against"),
))

MEM_TOL, FLOP_TOL = 0.08, 0.02
RANGES = {"tight": (1.1e6, 1.9e6), "medium": (2.1e6, 4e6), "loose": (10e6, 30e6)}
INFEASIBLE = 0.8e6
MARGIN = 0.02
FIELDS = tuple(cap.Config.__dataclass_fields__)
_RNG = random.SystemRandom()

MEM_HINT = ("compose as section 3 says: state = stored_bytes + 3 * trainable_bytes; each part m * per_seq + fixed; "
            "compressed parts ceil(n * bits / 8) + 8 * ceil(n / 64) + other; without checkpointing every part minus "
            "the k smallest sublayers; with it embed + 4 block inputs + max(head, attn3 + mlp3)")
FLOP_HINT = ("compose as section 4 says: global_batch * (total - the k smallest sublayer backwards + recompute when "
             "checkpointing)")


def _table() -> list[dict]:
    return cap.load_table()


def _profile() -> dict:
    return cap.load_profile()


def _kind(c) -> str:
    return f"{c.method}{'+nf4' if c.nf4 else ''}{'+bf16' if c.bf16 else ''}"


def _compose_memory(c, profile) -> float:
    """The judge's composition (section 3), written apart from the notebook's."""
    kind = profile["kinds"][_kind(c)]
    m, bits, group = c.micro_batch, c.act_bits, profile["group"]

    def size(f32, bf16, other):
        if bits >= 32:
            return 4 * f32 + 2 * bf16 + other
        return math.ceil((f32 + bf16) * bits / 8) + 8 * math.ceil((f32 + bf16) / group) + other

    def part(name):
        p = kind["saved"].get(name)
        return 0 if p is None else size(*[m * p["per_seq"][t] + p["fixed"][t] for t in ("f32", "bf16", "other")])

    n_blocks = profile["sublayers"] // 2
    subs = [part(f"{s}{i}") for i in range(n_blocks) for s in ("attn", "mlp")]
    if c.checkpoint:
        acts = part("embed") + n_blocks * size(m * profile["block_input_f32_per_seq"], 0, 0) \
            + max(part("head"), part(f"attn{n_blocks - 1}") + part(f"mlp{n_blocks - 1}"))
    else:
        k = round(c.drop_rate * profile["sublayers"])
        acts = part("embed") + part("head") + sum(sorted(subs)[k:])
    return kind["stored_bytes"] + 3 * kind["trainable_bytes"] + acts


def _compose_flops(c, profile) -> float:
    f = profile["kinds"][_kind(c)]["flops_per_seq"]
    n_blocks = profile["sublayers"] // 2
    bwd = sorted(f[f"{s}{i}"]["backward"] for i in range(n_blocks) for s in ("attn", "mlp"))
    k = round(c.drop_rate * profile["sublayers"])
    return profile["global_batch"] * (f["total"] - sum(bwd[:k]) + (f["recompute"] if c.checkpoint else 0))


def _scaled(profile: dict) -> dict:
    """A copy with every number scaled by a factor drawn now (per kind and part), rounded to integers."""
    out = {**profile, "kinds": {}}
    out["block_input_f32_per_seq"] = int(profile["block_input_f32_per_seq"] * _RNG.uniform(0.5, 2.0)) // 64 * 64
    for name, kind in profile["kinds"].items():
        new = {"stored_bytes": int(kind["stored_bytes"] * _RNG.uniform(0.5, 2.0)),
               "trainable_bytes": int(kind["trainable_bytes"] * _RNG.uniform(0.5, 2.0)), "saved": {},
               "flops_per_seq": {}}
        for part, entry in kind["saved"].items():
            f = _RNG.uniform(0.3, 3.0)
            new["saved"][part] = {side: {t: int(v * f) // 64 * 64 if t != "other" else int(v * f)
                                         for t, v in entry[side].items()} for side in ("per_seq", "fixed")}
        for key, value in kind["flops_per_seq"].items():
            f = _RNG.uniform(0.3, 3.0)
            new["flops_per_seq"][key] = ({"backward": int(value["backward"] * f)} if isinstance(value, dict)
                                         else int(value * f))
        out["kinds"][name] = new
    return out


def _values(nb, name: str, profile: dict, configs: list) -> list:
    fn = getattr(nb, name)
    return fetch(nb.apply(probes.ch16_each, fn, nb.Config, profile, [dict(zip(FIELDS, _key(c))) for c in configs]))


def _key(c) -> tuple:
    return tuple(getattr(c, f) for f in FIELDS)


def _check_predictions(nb, name: str, compose, measured_key: str, tol: float, hint: str) -> None:
    table, profile = _table(), _profile()
    configs = [cap.config_of(r) for r in table]
    got = _values(nb, name, profile, configs)
    bad = []
    for c, r, v in zip(configs, table, got):
        if not isinstance(v, float):
            raise AssertionError(f"{name}({c}) did not return a number: {v}. {hint}")
        if not math.isfinite(v) or abs(v / r[measured_key] - 1) > tol:
            bad.append((abs(v / r[measured_key] - 1) if math.isfinite(v) else math.inf, c, v, r[measured_key]))
    if bad:
        worst = max(bad, key=lambda t: t[0])
        raise AssertionError(
            f"{name} is more than {tol:.0%} from the measurement on {len(bad)} of {len(configs)} configurations; "
            f"worst {worst[1]}: predicted {worst[2]:,.0f}, measured {worst[3]:,}. {hint}")
    scaled = _scaled(profile)
    sample = _RNG.sample(configs, 60)
    got = _values(nb, name, scaled, sample)
    for c, v in zip(sample, got):
        want = compose(c, scaled)
        if not isinstance(v, float) or not math.isfinite(v) or abs(v / want - 1) > tol:
            raise AssertionError(
                f"on a profile with other numbers, {name}({c}) gave {v}, the composition gives {want:,.0f}: compose "
                f"from the profile you are given, not from the table. {hint}")


@hidden_test("test_memory_of")
def check_memory_of(nb):
    _check_predictions(nb, "memory_of", _compose_memory, "bytes", MEM_TOL, MEM_HINT)


@hidden_test("test_flops_of")
def check_flops_of(nb):
    _check_predictions(nb, "flops_of", _compose_flops, "flops", FLOP_TOL, FLOP_HINT)


# --- plan --------------------------------------------------------------------------------------------------------------
def _draw_budget(low: float, high: float, table: list[dict]) -> float:
    edges = sorted(r["bytes"] for r in table)
    for _ in range(1000):
        b = _RNG.uniform(low, high)
        if all(abs(b / e - 1) >= MARGIN for e in edges):
            return b
    raise RuntimeError(f"no budget in [{low:,.0f}, {high:,.0f}] is {MARGIN:.0%} from every row")


def _best(table: list[dict], budget: float):
    ok = [r for r in table if r["bytes"] <= budget and r["accuracy"] >= cap.TARGET_ACCURACY]
    return min(r["flops"] for r in ok) if ok else None


def _read_plan(nb, budget: float, table: list[dict]):
    got = fetch(nb.apply(probes.ch16_fields, nb.plan(budget, _profile(), table)))
    if got is None:
        return None
    if "fields" not in got:
        raise AssertionError(f"plan({budget:,.0f} bytes) returned a {got.get('type')}, not a Config or None")
    try:
        return cap.Config(**got["fields"])
    except TypeError as e:
        raise AssertionError(f"plan({budget:,.0f} bytes) returned fields {got['fields']}: {e}") from None


def _judge_plan(nb, label: str, budget: float, table: list[dict], measure: bool) -> None:
    best = _best(table, budget)
    config = _read_plan(nb, budget, table)
    where = f"the {label} budget ({budget:,.0f} bytes)"
    if best is None:
        if config is not None:
            raise AssertionError(f"at {where} no configuration fits and meets the target: plan must return None, "
                                 f"got {config}")
        return
    if config is None:
        raise AssertionError(f"at {where} some configuration fits and meets the target, but plan returned None")
    rows = {cap.config_of(r): r for r in table}
    if config not in rows:
        raise AssertionError(f"at {where} plan returned {config}, which is not a row of the table")
    row = rows[config]
    judged = cap.measured(config) if measure else row  # the judge builds and measures the plan itself
    bytes_, flops = judged["bytes"], judged["flops"]
    if bytes_ > budget:
        raise AssertionError(f"at {where} the plan {config} needs {bytes_:,} bytes, measured by the judge: over "
                             "budget (plan on the table's measured bytes, not on a prediction or a rule of thumb)")
    if row["accuracy"] < cap.TARGET_ACCURACY:
        raise AssertionError(f"at {where} the plan {config} reaches accuracy {row['accuracy']:.3f}, below the target "
                             f"{cap.TARGET_ACCURACY}: the quality gate filters rows before any FLOPs comparison")
    rho = flops / best
    if rho > 1.1:
        raise AssertionError(f"at {where} the plan {config} costs {flops:,} FLOPs, rho = {rho:.2f} times the least "
                             "FLOPs of a qualifying row (at most 1.1): search every row, not a greedy path")


def _shuffled(table: list[dict]) -> list[dict]:
    acc = [r["accuracy"] for r in table]
    size = [r["bytes"] for r in table]
    _RNG.shuffle(acc)
    _RNG.shuffle(size)
    return [{**r, "accuracy": a, "bytes": b} for r, a, b in zip(table, acc, size)]


@hidden_test("test_plan")
def check_plan(nb):
    table = _table()
    for label in ("medium", "loose"):
        _judge_plan(nb, label, _draw_budget(*RANGES[label], table), table, measure=True)
    other = _shuffled(table)
    _judge_plan(nb, "medium (shuffled table)", _draw_budget(*RANGES["medium"], other), other, measure=False)


@hidden_test("test_plan_edge_cases")
def check_plan_edge_cases(nb):
    table = _table()
    _judge_plan(nb, "tight", _draw_budget(*RANGES["tight"], table), table, measure=True)
    _judge_plan(nb, "infeasible", _RNG.uniform(0.2 * INFEASIBLE, INFEASIBLE), table, measure=False)


# --- build ---------------------------------------------------------------------------------------------------------------
def _build_configs() -> list:
    grid = cap.grid()
    grid = [c for c in grid if c.micro_batch == 16 and c.method != "full"]  # two micro-batches per step
    heavy = [c for c in grid if c.checkpoint and c.drops and c.act_bits < 32]
    half = [c for c in grid if c.bf16]
    nf4 = [c for c in grid if c.nf4 and c.act_bits == 32]
    return [_RNG.choice(heavy), _RNG.choice(half), _RNG.choice(nf4)]


@hidden_test("test_build")
def check_build(nb):
    seed = new_seed() % 10_000
    for config in _build_configs():
        task = target_task(2 * cap.GLOBAL_BATCH, seed + 1)
        batches = [(task.x[i:i + cap.GLOBAL_BATCH], task.y[i:i + cap.GLOBAL_BATCH]) for i in (0, cap.GLOBAL_BATCH)]
        torch.manual_seed(seed)
        ref = cap.training_step(config, seed)
        want = [float(ref(b)) for b in batches]
        step = nb.build(nb.Config(**dict(zip(FIELDS, _key(config)))), seed)
        got = []
        for b in batches:
            loss = fetch(step(b))
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                raise AssertionError(f"build({config}) step returned {type(loss).__name__}, not a scalar tensor")
            got.append(float(loss))
        for i, (g, w) in enumerate(zip(got, want)):
            if not math.isfinite(g) or abs(g - w) > 1e-4 * abs(w):
                raise AssertionError(
                    f"build({config}, seed={seed}): loss of step {i + 1} is {g:.6f}, the course's step gives {w:.6f}: "
                    "divide each micro-batch's summed loss by the scored targets of the whole batch, draw the "
                    "dropped sublayers once per step, and run forward and backward inside the compression hooks "
                    "and autocast the configuration asks for")
        params = fetch(nb.apply(probes.ch16_trainable, step))
        ref_params = {n: p.detach() for n, p in ref.model.named_parameters() if p.requires_grad}
        if sorted(params) != sorted(ref_params):
            raise AssertionError(f"build({config}): the trainable parameters of step.model are {sorted(params)[:4]}…, "
                                 f"expected those of configured_model (e.g. {sorted(ref_params)[:4]})")
        off = total = 0
        for n, p in ref_params.items():
            q = params[n]
            if not isinstance(q, torch.Tensor) or q.shape != p.shape:
                raise AssertionError(f"build({config}): parameter {n} has another shape")
            off += int(((q.double() - p.double()).abs() > 1e-4).sum())
            total += p.numel()
        if off > 1e-3 * total:
            raise AssertionError(f"build({config}, seed={seed}): after 2 steps {off:,} of {total:,} trainable "
                                 "elements differ from the course's step by more than 1e-4: one Adam step per "
                                 "global batch, on trainable(model) with LR[config.method], gradients set to None")
