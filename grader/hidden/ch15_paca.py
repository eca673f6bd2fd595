"""Hidden tests of chapter 15 (PaCA: partial connection adaptation).

PaCALinear, by property (references in float64, computed here from the formulas: W with its columns idx set to
s·P, y = x Wᵀ + b, dx = g W, dP = s gᵀ x[..., idx], P ← P − lr dP):
- values (test_paca_linear): idx replayed from the seeded generator the grader passes (randperm(in)[:r]), a buffer;
  P = W[:, idx] / s; the output at initialisation equal to the base layer's; two steps (forward, backward, an SGD
  step on P driven by ``probes.ch15_steps``): every output, dx and dP, the second forward with the new P (a stale W
  shows there); x 1-D to 4-D, a bias-free layer with every column, one layer drawn at grading time.
- frozen: the parameters requiring grad are exactly P; two SGD steps with weight decay on every parameter that
  requires grad or gets a gradient, and on the grader's own base tensors: the weight moves only in its columns idx,
  the bias not at all; no gradient reaches either.
- memory: two measured calls read from outside the worker (each its own ``Meter``): Linear(in, 64) held by the
  grader, in 1024 to 2048, rank 8 to 32, (a) x 3-D of 5·2^20 to 8·2^20 elements requiring grad, (b) x 2-D of
  4·2^20 to 6·2^20 elements not requiring grad, made in the worker for the call. Kept ≤ 4·n·r/in (the selected
  columns) + y + 2 MiB (x itself is 16 MiB or more). On that call: y, then an output gradient drawn and sent after
  the forward: dP, dx at drawn rows and Σ dx (a).
- merge: after a step on P, merge() before any forward: a plain nn.Linear, weight W with columns s·P, bias, output;
  the merged weight unchanged after the layer trains on.
- errors: ranks 1 and in accepted; 0, −2, in + 1, 2.5 raise ValueError.

apply_paca: on a transformer-like tree, which Linears are replaced (the original at ``.base``), P's shapes and count,
the scaling, the model's output unchanged; only the P of replaced layers trainable, one SGD step with weight decay
on everything that requires grad: originals unchanged but the columns idx; look-alike names, a Conv1d named like a
target, ValueError when nothing matches.

QPaCALinear: W built on the NF4 grid plus small offsets (so that the grader knows NF4's rounding exactly: every value
rounds to its grid level, while the original differs from it): buffers, idx, P from the original weight, the only
trainable parameter; output at initialisation, dx, dP, a step and a second forward against float64. Memory from
outside the worker: a bias-free layer of in, out in 1536 to 2048 on the NF4 grid, the base released: kept after
construction ≤ NF4 bytes + P + idx + 0.5 MiB (a float copy is 9 MiB or more); one forward on (3, in) keeps until
backward ≤ its x[..., idx] + y + 0.5 MiB (a saved dequantized weight is 9 MiB or more); that pass's output, dP and
Σ dx against the reference.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from coursekit.checks import check_close, check_equal, same_close, same_values
from grader import probes
from grader.api import fetch, hidden_test
from grader.resources import Meter, MiB, draw, mib, new_seed, seeded
from grader.sandbox.rpc import StudentError
from grader.source_policy import Shortcut, SourcePolicy

SOURCE_POLICY = SourcePolicy(shortcuts=(
    Shortcut(paths=("coursekit.capstone",),
             instead="write it yourself; coursekit.capstone (chapter 16's reference fine-tune) holds "
                     "the course's own PaCA linears"),
))

TOL = dict(atol=1e-4, rtol=1e-4)
LR = 0.05  # the SGD steps the grader drives on P

IDX_HINT = ("idx = torch.randperm(in_features, generator=generator)[:rank], drawn once in __init__ with the generator "
            "you are given: r distinct input columns")
BUFFER_HINT = "register idx with self.register_buffer(\"idx\", ...): it is part of the model's state"
P_HINT = ("P starts at base.weight[:, idx] / scaling (a copy of the selected input COLUMNS divided by s = alpha / "
          "rank), so that scaling * P writes the same values back and the layer starts equal to the base")
ROWS_HINT = ("P stands for input columns, W[:, idx], of shape (out_features, rank); a row W[j, :] is an output, and "
             "its gradient would read all of x")
FORWARD_HINT = ("forward writes scaling * P into the columns idx of base.weight (under no_grad), then computes "
                "x @ W.T + b with the whole weight")
STALE_HINT = ("the second forward still used the old P: write scaling * P into W[:, idx] at the start of EVERY "
              "forward, so that the weight follows the optimizer's steps")
DP_HINT = "dP = scaling * gᵀ x[..., idx], every leading dimension of x and g flattened into rows (mind the factor s)"
DX_HINT = "dx = g W, with the weight whose columns idx hold scaling * P, of x's shape"
KEEP_HINT = ("save only x[..., idx] (a copy: rank / in_features of x) in your Function's forward: x itself must not "
             "stay alive until backward, neither saved by your Function nor by another operation autograd records "
             "(a product with a weight built from P, an index_copy on a tensor that requires grad)")
BASE_HINT = "keep the layer you are given as self.base, the very object (no copy)"
WRITE_HINT = ("every forward first writes scaling * P into the columns idx of base.weight (under no_grad): after a "
              "forward the base weight holds the current P in those columns, and the product uses that weight")
GLOBAL_IN, GLOBAL_RANK = (40, 96), (4, 12)  # the layers drawn from torch's global generator
FROZEN_HINT = ("freeze the base layer: base.weight.requires_grad_(False) and the same for its bias; P is the only "
               "parameter that trains, and your backward returns no gradient for the weight or the bias")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _base(n_in: int, n_out: int, seed: int, bias: bool = True) -> nn.Linear:
    gen = _gen(seed)
    layer = nn.Linear(n_in, n_out, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n_out, n_in, generator=gen) / n_in ** 0.5)
        if bias:
            layer.bias.copy_(torch.randn(n_out, generator=gen))
    return layer


def _paca_ref(W0, b, idx, s, xs, gs, lr=LR, p0=None):
    """float64 outputs, dx, dP of the steps, P ← P − lr dP after each; ``p0`` replaces the initial P."""
    W0 = W0.double()
    P = W0[:, idx] / s if p0 is None else p0.double()
    out = {"y": [], "dx": [], "dP": [], "P": [P.clone()]}
    for x, g in zip(xs, gs):
        W = W0.clone()
        W[:, idx] = s * P
        x64, g64 = x.double(), g.double()
        y = F.linear(x64, W, None if b is None else b.double())
        rows, xr = g64.reshape(-1, g64.shape[-1]), x64.reshape(-1, x64.shape[-1])
        dP = s * rows.t() @ xr[:, idx]
        out["y"].append(y)
        out["dx"].append(g64 @ W)
        out["dP"].append(dP)
        P = P - lr * dP
        out["P"].append(P.clone())
    return out


def _close(got, ref, tol=TOL) -> bool:
    return isinstance(got, torch.Tensor) and same_close(got.double(), ref.double(), **tol)


def _build(nb, base: nn.Linear, rank, alpha, seed: int):
    """The student's layer on the grader's base (sent with its own tensors), idx drawn from a seeded generator."""
    sent = nb.put((base, [base.weight] + ([base.bias] if base.bias is not None else [])))
    gen = nb.put(torch.Generator)()
    gen.manual_seed(int(seed))
    return nb.PaCALinear(sent[0], rank, alpha, gen), sent


def _describe(nb, layer, where: str) -> dict:
    got = fetch(nb.apply(probes.ch15_describe, layer))
    if "P" not in got["params"]:
        raise AssertionError(f"{where} has no parameter P: keep the trainable columns as self.P = nn.Parameter(...)")
    return got


def _check_init(got: dict, W0, idx_ref, s, where: str) -> None:
    r = len(idx_ref)
    if got["scaling"] is None or abs(got["scaling"] - s) > 1e-12:
        raise AssertionError(f"{where}: scaling is {got['scaling']}, expected alpha / rank = {s:g}")
    if "idx" not in got["buffers"]:
        raise AssertionError(f"{where}: no buffer idx. {BUFFER_HINT}")
    idx = got["buffers"]["idx"]["value"]
    if got["buffers"]["idx"]["dtype"] != "torch.int64" or idx.shape != (r,):
        raise AssertionError(f"{where}: idx is {got['buffers']['idx']['dtype']} of shape {tuple(idx.shape)}, expected "
                             f"int64 of shape ({r},). {IDX_HINT}")
    if not same_values(idx, idx_ref):
        why = "it repeats a column: draw without replacement" if len(set(idx.tolist())) < r else \
            "it is not the draw of the generator you were given"
        raise AssertionError(f"{where}: idx is {idx.tolist()[:8]}, expected {idx_ref.tolist()[:8]} ({why}). {IDX_HINT}")
    P0 = got["params"]["P"]["value"]
    if tuple(P0.shape) != (W0.shape[0], r):
        hint = ROWS_HINT if tuple(P0.shape) == (r, W0.shape[1]) else P_HINT
        raise AssertionError(f"{where}: P has shape {tuple(P0.shape)}, expected (out_features, rank) = "
                             f"{(W0.shape[0], r)}. {hint}")
    if P0.dtype != torch.float32:
        raise AssertionError(f"{where}: P is {P0.dtype}, expected torch.float32 (the base weight's dtype)")
    ref = W0.double()[:, idx_ref] / s
    hint = P_HINT
    if _close(P0, W0.double()[:, idx_ref]) and abs(s - 1) > 1e-9:
        hint = "P was not divided by scaling. " + P_HINT
    check_close(P0.double(), ref, f"P at initialisation for {where}", hint, **TOL)


def _check_steps(got: dict, ref: dict, W0, b, idx, s, xs, where: str, tol=TOL) -> None:
    if got["error"]:
        raise AssertionError(f"{where}: {got['error']}")
    stale = _paca_ref(W0, b, idx, s, xs, [torch.zeros_like(r) for r in ref["y"]], lr=0.0)
    for k in range(len(ref["y"])):
        step = "at initialisation" if k == 0 else f"after {k} SGD step{'s' * (k > 1)} on P"
        hint = FORWARD_HINT
        if k and _close(got["outputs"][k], stale["y"][k], tol):
            hint = STALE_HINT
        check_close(got["outputs"][k].double(), ref["y"][k], f"the output {step} for {where}", hint, **tol)
        dP = got["dP"][k]
        if dP is None:
            raise AssertionError(f"{where}: no gradient reached P {step}. Return dP from your backward")
        hint = DP_HINT
        if _close(dP, ref["dP"][k] / s, tol) and abs(s - 1) > 1e-9:
            hint = "dP lacks the factor scaling. " + DP_HINT
        check_close(dP.double(), ref["dP"][k], f"dP {step} for {where}", hint, **tol)
        dx = got["dx"][k]
        if dx is None:
            raise AssertionError(f"{where}: no gradient reached x {step}. Return dx = g W from your backward")
        check_close(dx.double(), ref["dx"][k], f"dx {step} for {where}", DX_HINT, **tol)
    idx_after = got.get("idx_after")
    if idx_after is None or not same_values(idx_after, idx):
        raise AssertionError(f"{where}: idx changed during the steps. Draw it once, in __init__. {IDX_HINT}")


def _inputs(lead: tuple, n_in: int, n_out: int, seed: int, steps: int = 2):
    gen = _gen(seed)
    xs = [torch.randn(*lead, n_in, generator=gen) for _ in range(steps)]
    gs = [torch.randn(*lead, n_out, generator=gen) for _ in range(steps)]
    return xs, gs


# (lead dims of x, in, out, rank, alpha, bias, seed)
PACA_CASES = [((2, 5), 53, 29, 4, 8.0, True, 1), ((7,), 37, 53, 3, 1.5, True, 2), ((), 37, 53, 3, 1.5, True, 3),
              ((2, 3, 2), 37, 53, 3, 1.5, True, 4), ((6,), 20, 11, 20, 5.0, False, 5)]
PACA_DRAWN = ((2, 96), (2, 64))  # in_features, out_features of the layer drawn at grading time


def _drawn_case():
    n_in, n_out = draw(*PACA_DRAWN[0]), draw(*PACA_DRAWN[1])
    lead = tuple(draw(1, 5) for _ in range(draw(1, 3)))
    return lead, n_in, n_out, draw(1, n_in), draw(1, 40) / 4, bool(draw(0, 1)), new_seed()


def _paca_case(nb, case, weight_decay: float = 0.0):
    lead, n_in, n_out, rank, alpha, bias, seed = case
    base = _base(n_in, n_out, seed, bias)
    W0 = base.weight.detach().clone()
    b0 = None if base.bias is None else base.bias.detach().clone()
    layer, sent = _build(nb, base, rank, alpha, seed + 1000)
    where = f"PaCALinear(Linear({n_in}, {n_out}{'' if bias else ', bias=False'}), {rank}, {alpha:g}) on x {(*lead, n_in)}"
    idx = torch.randperm(n_in, generator=_gen(seed + 1000))[:rank]
    xs, gs = _inputs(lead, n_in, n_out, seed + 2000)
    return layer, sent, where, W0, b0, idx, xs, gs


@hidden_test("test_paca_linear")
def check_paca_linear(nb):
    for case in [*PACA_CASES, _drawn_case()]:
        layer, _sent, where, W0, b0, idx, xs, gs = _paca_case(nb, case)
        rank, alpha = case[3], case[4]
        s = alpha / rank
        _check_init(_describe(nb, layer, where), W0, idx, s, where)
        if not fetch(nb.apply(probes.ch15_base_is, layer, _sent[0])):
            raise AssertionError(f"{where}: self.base is not the nn.Linear you were given. {BASE_HINT}")
        keys = fetch(nb.apply(probes.ch15_state_keys, layer))
        if "idx" not in keys:
            raise AssertionError(f"{where}: state_dict() has no idx (its keys: {keys}). {BUFFER_HINT}")
        got = fetch(nb.apply(probes.ch15_steps, layer, xs, gs, LR, 0.0, True, {"weight": _sent[1][0]}))
        ref = _paca_ref(W0, b0, idx, s, xs, gs)
        _check_steps(got, ref, W0, b0, idx, s, xs, where)
        written = W0.double().clone()
        written[:, idx] = s * ref["P"][len(xs) - 1]
        check_close(got["given"]["weight"].double(), written, f"base.weight of {where} after the last forward (read by "
                    "the grader from its own tensor)", WRITE_HINT, **TOL)
    _check_global_idx(nb)


def _check_global_idx(nb) -> None:
    """idx drawn from torch's global generator when no generator is given: distinct, in range, not the first r
    columns, the same after the same ``manual_seed`` and not after another."""
    n_in, n_out, rank = draw(*GLOBAL_IN), draw(2, 16), draw(*GLOBAL_RANK)
    seed = new_seed() % 10**6
    got = fetch(nb.apply(probes.ch15_global_idx, nb.PaCALinear, n_in, n_out, rank, [seed, seed, seed + 1]))
    where = f"PaCALinear(Linear({n_in}, {n_out}), {rank}, 2.0) with no generator (torch's global generator seeded)"
    for idx in got:
        if idx is None or tuple(idx.shape) != (rank,) or len(set(idx.tolist())) != rank or int(idx.min()) < 0 \
                or int(idx.max()) >= n_in:
            raise AssertionError(f"{where}: idx is {None if idx is None else idx.tolist()}, expected {rank} distinct "
                                 f"columns of 0..{n_in - 1}. {IDX_HINT}")
        if idx.tolist() == list(range(rank)):
            raise AssertionError(f"{where}: idx is the first {rank} columns, not a random draw. {IDX_HINT}")
    if not same_values(got[0], got[1]) or same_values(got[0], got[2]):
        raise AssertionError(f"{where}: idx after manual_seed({seed}) twice and manual_seed({seed + 1}): "
                             f"{[t.tolist()[:6] for t in got]}; draw it with torch.randperm from torch's global "
                             f"generator when generator is None. {IDX_HINT}")


@hidden_test("test_paca_linear_frozen")
def check_paca_linear_frozen(nb):
    for case in (PACA_CASES[0], PACA_CASES[4]):
        layer, sent, where, W0, b0, idx, xs, gs = _paca_case(nb, case)
        got = _describe(nb, layer, where)
        trainable = sorted(n for n, row in got["params"].items() if row["requires_grad"])
        check_equal(trainable, ["P"], f"the parameters of {where} that require grad", FROZEN_HINT)
        tensors = {"weight": sent[1][0]} | ({"bias": sent[1][1]} if b0 is not None else {})
        run = fetch(nb.apply(probes.ch15_steps, layer, xs, gs, LR, 0.1, True, tensors))
        if run["error"]:
            raise AssertionError(f"{where}: {run['error']}")
        for name, grad in run["given_grads"].items():
            if grad is not None:
                raise AssertionError(f"{where}: a gradient reached the base {name}. {FROZEN_HINT}")
        W = run["given"]["weight"]
        others = torch.ones(W0.shape[1], dtype=torch.bool)
        others[idx] = False
        check_close(W[:, others], W0[:, others], f"the base weight's columns other than idx of {where}, after two SGD "
                    "steps with weight decay on everything that requires grad", FROZEN_HINT, atol=0, rtol=0)
        if b0 is not None:
            check_close(run["given"]["bias"], b0, f"the base bias of {where}, after two SGD steps with weight decay",
                        FROZEN_HINT, atol=0, rtol=0)


# --- memory ------------------------------------------------------------------------------------------------------------
MEM_CASES = {  # elements of x, x 3-D, x's grad, idx drawn from a generator the grader passes (or the global one)
    "a": dict(numel=(4 * 2**20, 7 * 2**20), three_d=True, x_grad=True, generator=True),
    "b": dict(numel=(2 * 2**20, 4 * 2**20), three_d=False, x_grad=False, generator=False),
}
MEM_IN, MEM_OUT = (1000, 2100), (40, 100)  # in_features and out_features, any integers
MEM_RANK = (8, 32)
MEM_SLACK = 2 * MiB  # x itself is 8 MiB or more, at least 6 MiB beyond the bound (ballast hides at most 5 MiB)
MEM_PROJ = 2  # random directions v: every row of dx @ v against g @ (W v)


def _directions(n: int):
    """MEM_PROJ random float64 directions of length n, drawn at grading time."""
    return torch.randn(n, MEM_PROJ, generator=_gen(new_seed()), dtype=torch.float64)


def _all_rows(lhs, rhs, what: str, hint: str, where: str) -> None:
    """Every row of a result projected on random directions (``lhs``, rows × MEM_PROJ) against the reference's."""
    if lhs is None or tuple(lhs.shape) != tuple(rhs.shape):
        raise AssertionError(f"{what} of {where} is missing or of the wrong shape. {hint}")
    bad = ((lhs.double() - rhs).abs() > 1e-2 + 1e-4 * rhs.abs()).any(dim=1).nonzero().flatten()
    if len(bad):
        raise AssertionError(f"{what} of {where}: {len(bad)} of its {lhs.shape[0]} rows are wrong (rows "
                             f"{bad.tolist()[:6]}), every row checked through random projections. {hint}")


def _paca_memory_case(nb, case: str) -> None:
    spec = MEM_CASES[case]
    meter = Meter(nb)  # first: everything the student's code holds is read from outside
    cols, n_out = draw(*MEM_IN), draw(*MEM_OUT)
    rows = draw(-(-spec["numel"][0] // cols), spec["numel"][1] // cols)
    if spec["three_d"]:
        lead = draw(2, 8)
        rows -= rows % lead
        shape = (lead, rows // lead, cols)
    else:
        shape = (rows, cols)
    n = rows * cols
    rank, alpha = draw(*MEM_RANK), float(draw(4, 64))
    s = alpha / rank
    seed, w_seed, g_seed, i_seed = new_seed(), new_seed(), new_seed(), new_seed() % 10**6
    W0 = seeded((n_out, cols), seed=w_seed) / cols ** 0.5
    b0 = seeded((n_out,), seed=w_seed + 1)
    linear = nn.Linear(cols, n_out)
    with torch.no_grad():
        linear.weight.copy_(W0)
        linear.bias.copy_(b0)
    base = meter.put(linear)
    if spec["generator"]:
        gen = nb.put(torch.Generator)()
        gen.manual_seed(i_seed)
        layer = nb.PaCALinear(base, rank, alpha, gen)
        idx = torch.randperm(cols, generator=_gen(i_seed))[:rank]
    else:  # torch's global generator, as apply_paca builds its layers
        layer = nb.PaCALinear(base, rank, alpha)
        idx = fetch(nb.apply(probes.ch15_describe, layer))["buffers"].get("idx", {}).get("value")
        if idx is None or tuple(idx.shape) != (rank,) or len(set(idx.tolist())) != rank:
            raise AssertionError(f"PaCALinear(Linear({cols}, {n_out}), {rank}, {alpha:g}) with no generator: idx is "
                                 f"{None if idx is None else idx.tolist()[:8]}. {IDX_HINT}")
    # A first call on a small input of the same kind: lazily loaded code and caches, on the measured path.
    small = nb.PaCALinear(nb.put(nn.Linear(16, 4)), 2, 4.0)
    small_y = small(nb.put(torch.randn(2, 3, 16) if spec["three_d"] else torch.randn(5, 16)))
    small_y.sum().backward()
    del small_y, small

    v = _directions(cols)
    proj = meter.put(torch.zeros(n // cols, MEM_PROJ, dtype=torch.float64))
    v_sent = meter.put(v)

    def call(x):
        y = layer(x)
        if spec["x_grad"]:
            nb.apply(probes.ch15_grad_proj, x, v_sent, proj)
        return y

    held, y = meter.held_by(call, inputs=lambda: [meter.tensor(shape, seed=seed, requires_grad=spec["x_grad"])])
    where = (f"PaCALinear(Linear({cols}, {n_out}), {rank}, {alpha:g}"
             f"{', generator' if spec['generator'] else ', no generator'}) held by the grader, on x {shape} made for "
             f"the call ({'requiring' if spec['x_grad'] else 'not requiring'} grad), sizes drawn at grading time")
    y_bytes = 4 * rows * n_out
    cols_bytes = 4 * (n // cols) * rank
    bound = cols_bytes + y_bytes + MEM_SLACK
    if held.kept > bound:
        del y
        raise AssertionError(
            f"{where}: between forward and backward, with x released, your process kept {mib(held.kept)} (read from "
            f"outside your process); x[..., idx] is {mib(cols_bytes)}, the output y {mib(y_bytes)} and x itself "
            f"{mib(4 * n)}: at most {mib(bound)} may stay. {KEEP_HINT}")
    x = seeded(shape, seed=seed)
    g = seeded((*shape[:-1], n_out), seed=g_seed)  # drawn now, sent only after the forward ran
    W = W0.double().clone()
    W[:, idx] = s * (W0.double()[:, idx] / s)
    x2 = x.reshape(-1, cols)
    ref_y = torch.empty(x2.shape[0], n_out, dtype=torch.float64)
    for a in range(0, x2.shape[0], 4096):
        ref_y[a:a + 4096] = x2[a:a + 4096].double() @ W.t() + b0.double()
    got = fetch(y)
    check_close(None if got is None else got.double().reshape(-1, n_out), ref_y, f"the output y of {where}",
                FORWARD_HINT, atol=1e-3, rtol=1e-4)
    grad = meter.tensor((*shape[:-1], n_out), requires_grad=False, seed=g_seed)
    y.backward(grad.tensor)
    g2 = g.reshape(-1, n_out).double()
    ref_dp = s * g2.t() @ x2[:, idx].double()
    got_dp = fetch(nb.apply(probes.ch15_param_grad, layer, "P"))
    check_close(None if got_dp is None else got_dp.double(), ref_dp, f"dP of {where}, for an output gradient drawn at "
                "grading time and sent after the forward", DP_HINT, atol=1e-2, rtol=1e-4)
    if spec["x_grad"]:
        _all_rows(fetch(proj), g2 @ (W @ v), "dx", DX_HINT, where)
        check_close(fetch(held.leaves[0].grad).double(), (g2.sum(0) @ W).sum(), f"the sum of dx for {where}",
                    DX_HINT, atol=1e-1, rtol=1e-3)


def _check_saves_x(nb) -> None:
    """On the small value cases (rank below in_features), what the forward packs for backward must not be x."""
    for case in PACA_CASES[:4]:
        layer, _sent, where, *_rest, xs, _gs = _paca_case(nb, case)
        if fetch(nb.apply(probes.ch15_saves_x, layer, xs[:1]))["saved_x"] is True:
            raise AssertionError(f"{where}: the forward saved x itself for backward (seen by a saved-tensor hook in "
                                 f"your process). {KEEP_HINT}")


@hidden_test("test_paca_linear_memory")
def check_paca_linear_memory(nb):
    _paca_memory_case(nb, "a")
    _paca_memory_case(nb, "b")
    _check_saves_x(nb)


@hidden_test("test_paca_linear_merge")
def check_paca_linear_merge(nb):
    for case in (PACA_CASES[0], PACA_CASES[4]):
        layer, _sent, where, W0, b0, idx, xs, gs = _paca_case(nb, case)
        rank, alpha = case[3], case[4]
        s = alpha / rank
        run = fetch(nb.apply(probes.ch15_steps, layer, xs[:1], gs[:1], LR))
        if run["error"]:
            raise AssertionError(f"{where}: {run['error']}")
        P1 = _paca_ref(W0, b0, idx, s, xs[:1], gs[:1])["P"][1]
        want = W0.double().clone()
        want[:, idx] = s * P1
        merged = layer.merge()
        kinds = fetch(nb.apply(probes.type_names, merged))
        if kinds[0] != "torch.nn.modules.linear.Linear":
            raise AssertionError(f"merge() of {where} returned a {kinds[0]}: return a plain nn.Linear")
        check_close(fetch(merged.weight).double(), want, f"the merged weight of {where}, after an SGD step on P and "
                    "no forward since", "merge() writes scaling * P (the current P) into the columns idx of a copy of "
                    "the base weight", **TOL)
        bias = fetch(merged.bias)
        if b0 is None:
            if bias is not None:
                raise AssertionError(f"merge() of {where}: the base has no bias, the merged layer has one")
        else:
            check_close(None if bias is None else bias.double(), b0.double(), f"the merged bias of {where}",
                        "the merged layer keeps the base bias", **TOL)
        x = xs[1]
        check_close(fetch(merged(x)).double(), F.linear(x.double(), want, None if b0 is None else b0.double()),
                    f"the merged layer's output for {where}", "the merged layer computes x @ W.T + b", **TOL)
        before = fetch(merged.weight)
        fetch(nb.apply(probes.ch15_steps, layer, xs, gs, LR))  # the layer trains on
        check_close(fetch(merged.weight), before, f"the merged weight of {where} after the layer trained on",
                    "merge() returns copies that share no storage with the layer", atol=0, rtol=0)
        if b0 is not None:
            nb.apply(probes.ch15_bump, _sent[1][1])  # the grader's own base bias, changed after the merge
            check_close(fetch(merged.bias).double(), b0.double(), f"the merged bias of {where} after the base bias "
                        "changed", "merge() returns copies that share no storage with the layer: copy the bias too",
                        atol=0, rtol=0)


BAD_RANKS = (0, -2, 10, 2.5, 3.0, True)  # for Linear(9, 4): a rank is a Python int (not a bool, not a float)


@hidden_test("test_paca_linear_errors")
def check_paca_linear_errors(nb):
    for rank in (1, 9):
        names = fetch(nb.apply(probes.raised, nb.PaCALinear, nb.put(nn.Linear(9, 4)), rank, 2.0))
        if names is not None:
            raise AssertionError(f"PaCALinear(Linear(9, 4), {rank}, 2.0) raised {names[0]}: ranks from 1 to "
                                 "in_features are valid")
    for rank in BAD_RANKS:
        names = fetch(nb.apply(probes.raised, nb.PaCALinear, nb.put(nn.Linear(9, 4)), rank, 2.0))
        if names is None or "ValueError" not in names:
            got = "returned" if names is None else f"raised {names[0]}"
            raise AssertionError(f"PaCALinear(Linear(9, 4), {rank!r}, 2.0) {got}: raise ValueError for a rank that is "
                                 "not an int from 1 to in_features")


# --- apply_paca ----------------------------------------------------------------------------------------------------
RANK, ALPHA, TARGETS = 3, 6.0, ("qkv", "fc1")


def _toy_model() -> nn.Module:
    torch.manual_seed(7)
    return probes.ch15_ToyModel()


def _edge_model() -> nn.ModuleDict:
    torch.manual_seed(11)
    block = nn.ModuleDict({"attn": nn.ModuleDict({"qkv": nn.Linear(8, 24)}),
                           "self_attn": nn.ModuleDict({"qkv": nn.Linear(8, 24)}),
                           "mlp": nn.ModuleDict({"qkv": nn.Linear(8, 8), "myfc1": nn.Linear(8, 8)})})
    return nn.ModuleDict({"fc1": nn.Linear(8, 5), "attn": nn.ModuleDict({"qkv": nn.Conv1d(8, 8, 1)}),
                          "blocks": nn.ModuleList([block]), "head": nn.Linear(8, 3)})


def _apply(nb, model: nn.Module, targets, what: str, handle=None):
    sent = nb.put((model, list(model.parameters()))) if handle is None else \
        (handle, nb.apply(probes.ch15_parameters, handle))
    try:
        result = nb.apply_paca(sent[0], RANK, ALPHA, targets)
        if result is None or fetch(nb.apply(probes.type_names, result))[0] == "builtins.NoneType":
            raise AssertionError(f"apply_paca(model, {RANK}, {ALPHA:g}, {targets!r}) on {what} returned None: return "
                                 "the model you modified in place")
        kinds = fetch(nb.apply(probes.module_table, result))
    except (StudentError, TypeError, AttributeError, ValueError) as e:
        raised = f"{e.type_name}: {e.message}" if isinstance(e, StudentError) else f"{type(e).__name__}: {e}"
        raise AssertionError(f"apply_paca(model, {RANK}, {ALPHA:g}, {targets!r}) on {what} raised {raised}") from None
    return result, sent, kinds


def _replaced(kinds: dict) -> list[str]:
    return sorted(n for n, k in kinds.items() if any(c.endswith("PaCALinear") for c in k))


def _reach(result, path: str):
    handle = result
    for part in path.split("."):
        handle = getattr(handle, part)
    return handle


@hidden_test("test_apply_paca")
def check_apply_paca(nb):
    model = _toy_model()
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    wanted = sorted(n for n in linears if n.endswith((".qkv", ".fc1")))
    tokens = torch.randint(0, 10, (2, 5), generator=_gen(3))
    with torch.no_grad():
        y_before = model(tokens)
    model_handle = nb.put(model)
    originals = [_reach(model_handle, name) for name in wanted]  # handles on the worker's original Linears
    result, sent, kinds = _apply(nb, model, TARGETS, "a transformer-like model", model_handle)
    check_equal(_replaced(kinds), wanted, "the layers replaced by PaCALinear",
                f"replace exactly the nn.Linear layers whose qualified name ends with one of {TARGETS}")
    given = fetch(nb.apply(probes.module_table, sent[0]))
    check_equal(_replaced(given), _replaced(kinds), "the layers replaced in the model apply_paca was given",
                "modify the model in place (set_submodule on it) and return that same model, not a copy")
    for k, name in enumerate(wanted):
        if "torch.nn.modules.linear.Linear" not in kinds.get(f"{name}.base", []):
            raise AssertionError(f"{name}.base should be the original nn.Linear wrapped by PaCALinear")
        if not fetch(nb.apply(probes.ch15_base_is, _reach(result, name), originals[k])):
            raise AssertionError(f"{name}.base is not the model's original nn.Linear object (a copy?): apply_paca "
                                 "keeps the original as .base, the very object")
    table = fetch(nb.apply(probes.param_table, result))
    for name in wanted:
        if f"{name}.P" not in table:
            raise AssertionError(f"{name} has no parameter P after apply_paca: replace it by PaCALinear(layer, rank, "
                                 "alpha)")
        check_equal(table[f"{name}.P"]["shape"], [linears[name].out_features, RANK], f"{name}.P's shape",
                    "pass rank on to PaCALinear")
        got_s = fetch(_reach(result, name).scaling)
        if abs(float(got_s) - ALPHA / RANK) > 1e-12:
            raise AssertionError(f"{name}.scaling is {got_s}, expected alpha / rank = {ALPHA / RANK:g}: pass rank and "
                                 "alpha on to PaCALinear")
    n_new = sum(torch.Size(table[f"{n}.P"]["shape"]).numel() for n in wanted)
    check_equal(n_new, sum(RANK * linears[n].out_features for n in wanted), "the number of new parameters",
                "each replaced layer adds rank * out_features parameters")
    got = fetch(result(tokens))
    check_close(got, y_before, "the model's output after apply_paca",
                "apply_paca must not change what the model computes (P starts at W[:, idx] / scaling)", **TOL)


@hidden_test("test_apply_paca_frozen")
def check_apply_paca_frozen(nb):
    model = _toy_model()
    names = [n for n, _ in model.named_parameters()]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    tokens = torch.randint(0, 10, (2, 5), generator=_gen(4))
    result, sent, kinds = _apply(nb, model, TARGETS, "a transformer-like model")
    replaced = _replaced(kinds)
    if not replaced:
        raise AssertionError("apply_paca replaced no layer by a PaCALinear: nothing would train")
    table = fetch(nb.apply(probes.param_table, result))
    trainable = sorted(n for n, row in table.items() if row["requires_grad"])
    check_equal(trainable, sorted(f"{n}.P" for n in replaced), "the trainable parameters after apply_paca",
                "freeze every parameter of the model except the new P")
    tensors = {n: sent[1][i] for i, n in enumerate(names)}
    after = fetch(nb.apply(probes.ch15_toy_step, result, tokens, tensors, LR, 0.1))
    if after.get("error"):
        raise AssertionError(f"a training step of the model apply_paca returned raised {after['error']}")
    for name, value in before.items():
        now = after["given"][name]
        owner = name.rpartition(".")[0]
        if owner in replaced and name.endswith(".weight"):
            idx = fetch(_reach(result, owner).idx)
            keep = torch.ones(value.shape[1], dtype=torch.bool)
            keep[idx] = False
            now, value = now[:, keep], value[:, keep]
        check_close(now, value, f"{name} after one SGD step with weight decay on everything that requires grad",
                    "freeze every original parameter; only the P of the replaced layers train (and write into their "
                    "weight's columns idx)", atol=0, rtol=0)


EDGE_TARGETS = ["attn.qkv", "fc1"]


@hidden_test("test_apply_paca_edge_cases")
def check_apply_paca_edge_cases(nb):
    _result, _sent, kinds = _apply(nb, _edge_model(), EDGE_TARGETS, "a model with look-alike names")
    got, wanted = _replaced(kinds), ["blocks.0.attn.qkv", "fc1"]
    if got != wanted:
        raise AssertionError(f"apply_paca(model, {RANK}, {ALPHA:g}, {EDGE_TARGETS}) replaced {got}, expected {wanted}: "
                             "a Linear is replaced when its qualified name equals a target or ends with '.' + target "
                             "(a target may hold dots); nothing but nn.Linear is replaced")
    for targets in (("proj",), ["myfc"]):
        sent = nb.put(_edge_model())
        names = fetch(nb.apply(probes.raised, nb.apply_paca, sent, RANK, ALPHA, targets))
        if names is None or "ValueError" not in names:
            what = "returned" if names is None else f"raised {names[0]}"
            raise AssertionError(f"apply_paca(model, {RANK}, {ALPHA:g}, {targets!r}) matches no Linear and {what}: "
                                 "raise ValueError when nothing would train")


# --- QPaCALinear ---------------------------------------------------------------------------------------------------
NF4 = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0], dtype=torch.float64)
Q_OFFSET = 0.01  # relative offset off the grid: far below half the smallest gap between levels (0.04)
Q_HINT = ("the forward computes with nf4_decode_columns_torch(weight_packed, weight_absmax, (out, in), idx, scaling * P, "
          "block_size): the NF4 weight with its columns idx replaced by scaling * P")
Q_P_HINT = ("P = base.weight[:, idx] / scaling from the ORIGINAL float weight, taken before quantizing (the columns "
            "idx start exact, not rounded to NF4)")


def _grid_weight(n_out: int, n_in: int, block: int, seed: int, offset: float = Q_OFFSET):
    """(original, dequantized): a weight whose every value lies within ``offset`` × its block's absmax of an NF4 level
    (the first of each block exactly ±1 × the block's scale), so NF4 rounds each to that level."""
    g = _gen(seed)
    n = n_out * n_in
    n_blocks = -(-n // block)
    codes = torch.randint(1, 15, (n_blocks, block), generator=g)
    codes[:, 0] = torch.randint(0, 2, (n_blocks,), generator=g) * 15
    scale = torch.rand(n_blocks, 1, generator=g, dtype=torch.float64) * 0.1 + 0.01
    grid = NF4[codes] * scale
    noise = (torch.rand(n_blocks, block, generator=g, dtype=torch.float64) * 2 - 1) * offset * scale
    noise[:, 0] = 0
    original = (grid + noise).reshape(-1)[:n].float()
    dequant = grid.reshape(-1)[:n].float()
    # The float32 value must still round to its level, and the first value of each block stay the block's largest.
    return original.reshape(n_out, n_in), dequant.reshape(n_out, n_in)


QPACA_CASES = [((2, 3), 37, 53, 4, 8.0, 64, True, 31), ((5,), 37, 53, 3, 1.5, 32, False, 32)]
QPACA_SIDES = (1536, 2048)
QPACA_GROWTH = MiB // 2
QPACA_X = (2 * 2**20, 3 * 2**20)  # elements of the measured input (rows × in_features), drawn at grading time
QPACA_SLACK = 2 * MiB  # x is 8 MiB or more, the dequantized weight 9 MiB or more


def _q_layer(nb, n_in, n_out, rank, alpha, block, bias, seed):
    original, dequant = _grid_weight(n_out, n_in, block, seed)
    base = nn.Linear(n_in, n_out, bias=bias)
    with torch.no_grad():
        base.weight.copy_(original)
        if bias:
            base.bias.copy_(torch.randn(n_out, generator=_gen(seed + 1)))
    b0 = None if not bias else base.bias.detach().clone()
    sent = nb.put((base, base.bias))
    layer = nb.QPaCALinear(sent[0], rank, alpha, block)
    if bias:  # the base bias changes after the construction: the layer's is a copy
        nb.apply(probes.ch15_bump, sent[1])
    return layer, original, dequant, b0


def _q_check(nb, layer, original, dequant, b0, rank, alpha, block, xs, gs, where):
    n_out, n_in = original.shape
    s = alpha / rank
    got = fetch(nb.apply(probes.ch15_describe, layer))
    trainable = sorted(n for n, row in got["params"].items() if row["requires_grad"])
    check_equal(trainable, ["P"], f"the parameters of {where} that require grad",
                "P is the only tensor that trains; the bias is a frozen copy, the codes are buffers")
    bufs = got["buffers"]
    for name, dtype, size in (("weight_packed", "torch.uint8", (n_out * n_in + 1) // 2),
                              ("weight_absmax", "torch.float32", -(-n_out * n_in // block)), ("idx", "torch.int64", rank)):
        if name not in bufs or bufs[name]["dtype"] != dtype or torch.Size(bufs[name]["shape"]).numel() != size:
            raise AssertionError(f"{where}: the buffer {name} should be {dtype} with {size} elements, got "
                                 f"{bufs.get(name, {}).get('dtype')} of shape {bufs.get(name, {}).get('shape')}")
    idx = bufs["idx"]["value"]
    if len(set(idx.tolist())) != rank or int(idx.min()) < 0 or int(idx.max()) >= n_in:
        raise AssertionError(f"{where}: idx {idx.tolist()} should hold {rank} distinct columns of 0..{n_in - 1}")
    if got["scaling"] is None or abs(got["scaling"] - s) > 1e-12:
        raise AssertionError(f"{where}: scaling is {got['scaling']}, expected alpha / rank = {s:g}")
    P0 = got["params"]["P"]["value"]
    check_equal(list(P0.shape), [n_out, rank], f"the shape of P of {where}", "P is (out_features, rank)")
    check_equal(str(P0.dtype), "torch.float32", f"the dtype of P of {where}", "P is float32, like the base weight")

    hint = Q_P_HINT if _close(P0, dequant.double()[:, idx] / s) else P_HINT
    check_close(P0.double(), original.double()[:, idx] / s, f"P at initialisation for {where}", hint, atol=1e-6,
                rtol=1e-5)
    run = fetch(nb.apply(probes.ch15_steps, layer, xs, gs, LR))
    W_mixed = dequant.double().clone()
    W_mixed[:, idx] = original.double()[:, idx]
    ref = _paca_ref(W_mixed, b0, idx, s, xs, gs)
    if run["error"]:
        raise AssertionError(f"{where}: {run['error']}")
    plain = F.linear(xs[0].double(), original.double(), None if b0 is None else b0.double())
    if _close(run["outputs"][0], plain) and not _close(run["outputs"][0], ref["y"][0]):
        raise AssertionError(f"{where}: the output at initialisation is the float weight's, not the NF4 weight's. "
                             f"{Q_HINT}")
    _check_steps(run, ref, W_mixed, b0, idx, s, xs, where)


@hidden_test("test_qpaca_linear")
def check_qpaca_linear(nb):
    drawn = ((draw(1, 4),), draw(2, 80), draw(2, 48), 0, draw(1, 40) / 4, 32 * draw(1, 2), bool(draw(0, 1)),
             new_seed() % 10**6)
    drawn = (drawn[0], drawn[1], drawn[2], draw(1, drawn[1]), *drawn[4:])
    for lead, n_in, n_out, rank, alpha, block, bias, seed in [*QPACA_CASES, drawn]:
        layer, original, dequant, b0 = _q_layer(nb, n_in, n_out, rank, alpha, block, bias, seed)
        xs, gs = _inputs(lead, n_in, n_out, seed + 7)
        where = (f"QPaCALinear(Linear({n_in}, {n_out}{'' if bias else ', bias=False'}), {rank}, {alpha:g}, "
                 f"block_size={block}) on x {(*lead, n_in)}")
        _q_check(nb, layer, original, dequant, b0, rank, alpha, block, xs, gs, where)
    for rank in BAD_RANKS:
        names = fetch(nb.apply(probes.raised, nb.QPaCALinear, nb.put(nn.Linear(9, 4)), rank, 2.0))
        if names is None or "ValueError" not in names:
            got = "returned" if names is None else f"raised {names[0]}"
            raise AssertionError(f"QPaCALinear(Linear(9, 4), {rank}, 2.0) {got}: raise ValueError for a rank that is "
                                 "not an int from 1 to in_features")


@hidden_test("test_qpaca_linear_memory")
def check_qpaca_linear_memory(nb):
    meter = Meter(nb)
    n_out, n_in = draw(*QPACA_SIDES, multiple_of=64), draw(*QPACA_SIDES, multiple_of=64)
    rank, alpha, block, seed = draw(*MEM_RANK), 16.0, 64, new_seed()
    n = n_out * n_in
    s = alpha / rank
    where = f"QPaCALinear(Linear({n_in}, {n_out}, bias=False), {rank}, {alpha:g}, block_size={block})"
    warm = nb.QPaCALinear(nb.put(nn.Linear(64, 8, bias=False)), 2, 4.0, block)
    warm_y = warm(nb.put(torch.randn(2, 64)))
    warm_y.sum().backward()
    del warm_y, warm
    make = nb.put(probes.ch08_grid_linear)

    def base():
        weight = meter.tensor((n_out, n_in), requires_grad=False).tensor
        return make(weight, NF4.float(), block, seed)

    held, layer = meter.held_by(lambda b: nb.QPaCALinear(b, rank, alpha, block), inputs=lambda: [base()],
                                allowed_growth=QPACA_GROWTH)
    nf4 = (n + 1) // 2 + 4 * -(-n // block)
    own = 4 * n_out * rank + 8 * rank
    budget = nf4 + own + MiB // 2
    if held.kept > budget:
        raise AssertionError(
            f"{where}: with the base layer released, your process still held {mib(held.kept)} more than before (read "
            f"from outside your process); the packed codes and absmax need {mib(nf4)}, P and idx {mib(own)}, the float "
            f"weight is {mib(4 * n)}: keep no float copy of the weight (not base, not a buffer, not a cache)")
    W = probes._ch08_grid_values(NF4, (n_out, n_in), block, seed).double()
    rows = draw(QPACA_X[0] // n_in, QPACA_X[1] // n_in)
    g = seeded((rows, n_out), seed=seed + 1)
    x_bytes = rows * rank * 4 + rows * n_out * 4

    v = _directions(n_in)
    proj = meter.put(torch.zeros(rows, MEM_PROJ, dtype=torch.float64))
    v_sent = meter.put(v)

    def forward(x):
        y = layer(x)
        nb.apply(probes.ch15_grad_proj, x, v_sent, proj)
        return y

    kept, y = meter.held_by(forward, inputs=lambda: [meter.tensor((rows, n_in), seed=seed + 2)],
                            allowed_growth=QPACA_GROWTH + max(held.kept, 0))
    if kept.kept > x_bytes + QPACA_SLACK:
        del y
        raise AssertionError(
            f"{where}: one forward on a ({rows}, {n_in}) input kept {mib(kept.kept)} until backward (read from outside "
            f"your process); x[..., idx] and the output are {mib(x_bytes)}, x itself {mib(4 * rows * n_in)}, the "
            f"dequantized weight {mib(4 * n)}: save only x[..., idx] (not x, not the dequantized weight: rebuild it in "
            "backward from the codes) and cache nothing")
    x = seeded((rows, n_in), seed=seed + 2).double()
    idx = fetch(layer.idx)
    got = fetch(y)
    if got is None or got.shape != (rows, n_out):
        raise AssertionError(f"{where}: the output on the measured pass is not a ({rows}, {n_out}) tensor")
    u = _directions(n_out)
    _all_rows(got.double() @ u, x @ (W.t() @ u), "the output on the measured pass (a weight on the NF4 grid)", Q_HINT,
              where)
    y.backward(nb.put(g))
    check_close(fetch(nb.apply(probes.ch15_param_grad, layer, "P")).double(), s * g.double().t() @ x[:, idx],
                f"dP of {where} on the measured pass", DP_HINT, atol=1e-2, rtol=1e-4)
    _all_rows(fetch(proj), g.double() @ (W @ v), "dx", DX_HINT, where)
    for n_in, n_out, rank, alpha, block, bias, seed in [case[1:] for case in QPACA_CASES]:
        small, *_ = _q_layer(nb, n_in, n_out, rank, alpha, block, bias, seed)
        floats = fetch(nb.apply(probes.ch15_float_tensors, small, n_out * n_in))
        if floats:
            raise AssertionError(f"QPaCALinear(Linear({n_in}, {n_out}), {rank}, {alpha:g}, block_size={block}) holds "
                                 f"{floats}, floating-point tensors of out_features × in_features elements or more: "
                                 "keep no float copy of the weight (not base, not a buffer, not an attribute, not a "
                                 "cache)")
