"""Hidden tests of chapter 12 (AAL: auxiliary activation learning).

Every graded call is made the way the notebook uses the functions: asa_linear gets its weight and bias as
nn.Parameters in some calls and plain tensors in others; ara_group gets the worker's own setup-cell
ResidualMLPBlocks (made through nb.ResidualMLPBlock(d, h), their parameters set by probes.ch12_set_block). Sizes span the notebook's own,
a log-uniform draw from 10^4 to 10^6 elements, and the memory cells'.

asa_linear, by property:
- values (test_asa_linear): y = (x + ε s) Wᵀ + b, dx = g W, dW = λ ε gᵀ s, db = Σ g against a float64 reference
  computed here, on fixed layers (37 × 53 → 29; x (2, 5, 53); the notebook's 50 × 256 → 256 and → 10) and two
  drawn at grading time (a small one; one of 10^4 to 10^6 elements), inputs with exact zeros (s = -1 there, unlike
  torch.sign), relu False and True, the defaults and other ε, λ (λ ε ≠ 1). Failures are matched against known
  mistakes (no ε s in the forward, torch.sign, λ or ε missing, dx from s, dW from x) to name the one that was made.
- memory (test_asa_linear_memory): two measured calls read from outside the worker (each its own ``Meter``):
  (a) nn.Parameter W and bias, x 3-D of 12·2^20 to 15·2^20 elements requiring grad; (b) plain W, no bias, x 2-D
  of 8·2^20 to 12·2^20 elements not requiring grad; in_features 1024 to 2048, the weight (64 × in_features) held by
  the grader, x made in the worker for the call. Kept ≤ ⌈n/8⌉ + y + 2 MiB. On that same call: all of y, then an
  output gradient with random rows drawn and sent only after the forward; the whole dW (and db), dx at drawn rows
  and Σ dx against float64.
- edge cases: no bias; x not requiring grad with the weight's storage freed between forward and backward (a
  backward that computes dx reads it and raises); a frozen weight; a 1-D x; ValueError for a wrong last
  dimension and ε ≤ 0.

ara_group: values and every gradient against a float64 autograd reference whose fc1 weight gradients come from
the group input (groups of 1 to 4 blocks, 2-D and 3-D x, the notebook's 50 × 128 with h = 64, a small drawn case
and one of 10^4 to 10^6 elements); the output gradient is zero on the rows where an fc1 pre-activation lies within
1e-3 of 0 (float32 and float64 agree on every ReLU elsewhere), random on the others, so rows keep their own masks.
Memory from outside the worker, two calls ((a) 3-D x, (b) 2-D x): 3 or 4 blocks (d 768 to 1024, h 64) on 4096 rows
made for the call: kept ≤ x_0 + the ReLU outputs + 4 MiB (a stored input per block keeps 12 MiB or more beyond);
the output gradient is a tensor the grader holds, written after the forward; dx at drawn rows, Σ dx and every
block's fc1 weight and bias gradients of that call checked. Edge cases: one block (exact backprop), a tuple and an
nn.ModuleList, x not requiring grad, ValueError for an empty group.

learning_indicator: per-row values against float64 (both forms the text allows pass), shapes (...), d up to 512
(the notebook's 128 and 256); errors.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from coursekit.checks import check_close, same_close
from grader import probes
from grader.api import fetch, hidden_test
from grader.resources import Meter, MiB, draw, mib, new_seed, seeded
from grader.source_policy import SourcePolicy

SOURCE_POLICY = SourcePolicy()

TOL = dict(atol=1e-4, rtol=1e-4)  # float32 sums of up to 96 products against float64

FORWARD_HINT = ("the forward pass computes on x + ε s: y = F.linear(x + epsilon * s, weight, bias), not on x "
                "itself")
SIGN_HINT = ("s is +1 where x > 0 and -1 elsewhere, x == 0 included (torch.sign maps 0 to 0); with relu=True, "
             "s is 1 where x > 0 and 0 elsewhere")
RELU_HINT = "relu=True means s in {1, 0} (1 where x > 0), relu=False s in {+1, -1}"
DW_HINT = "dW = lam * epsilon * gᵀ s, with both factors (λ ε is 1 only with the defaults)"
DW_X_HINT = "dW comes from s alone: lam * epsilon * gᵀ s, never from x or x + ε s"
DX_HINT = "dx = g W exactly, of x's shape: s plays no part in the input gradient"
DB_HINT = "db = Σ g over every row (all leading dimensions)"
NO_DX_HINT = ("when x does not require grad (ctx.needs_input_grad[0] is False), return None for dx and do not "
              "compute it. The test frees the weight's storage after the forward pass; only dx reads it")
KEEP_HINT = ("save only pack_mask_torch(x > 0) (ceil(n / 8) bytes) and the weight with ctx.save_for_backward: "
             "x itself costs 32 bits per element, a bool or float s 8 or 32")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _asa_inputs(shape, n_out: int, seed: int, bias: bool = True, zeros: float = 0.15):
    """x with about ``zeros`` of its entries exactly 0, W scaled by 1/sqrt(n_in), b, and g."""
    gen = _gen(seed)
    n_in = shape[-1]
    x = torch.randn(shape, generator=gen)
    x = torch.where(torch.rand(shape, generator=gen) < zeros, torch.zeros(()), x)
    w = torch.randn(n_out, n_in, generator=gen) / n_in ** 0.5
    b = torch.randn(n_out, generator=gen) if bias else None
    g = torch.randn(*shape[:-1], n_out, generator=gen)
    return x, w, b, g


def _sign(x: torch.Tensor, relu: bool, kind: str = "right") -> torch.Tensor:
    if kind == "torch.sign":
        return torch.sign(x)
    return torch.where(x > 0, 1.0, 0.0 if relu else -1.0).to(x.dtype)


def _asa_ref(x, w, b, g, eps, lam, relu, sign="right", forward_eps=True):
    """float64 (y, dx, dW, db) of ASA; ``sign``/``forward_eps`` give the known mistakes."""
    x, w, g = x.double(), w.double(), g.double()
    s = _sign(x, relu, sign)
    y = F.linear(x + eps * s if forward_eps else x, w, None if b is None else b.double())
    rows, s2 = g.reshape(-1, g.shape[-1]), s.reshape(-1, s.shape[-1])
    return {"y": y, "dx": g @ w, "dW": lam * eps * rows.t() @ s2, "db": rows.sum(0), "s": s2, "rows": rows}


def _matches(got, candidate, tol=TOL) -> bool:
    return isinstance(got, torch.Tensor) and same_close(got.double(), candidate.double(), **tol)


def _check(got, ref, name, where, hint, mistakes: dict, tol=TOL):
    if got is None:
        raise AssertionError(f"{where}: no gradient reached {name}. Return it from backward")
    if not _matches(got, ref, tol):
        for mistake_hint, candidate in mistakes.items():
            if candidate is not None and _matches(got, candidate, tol):
                hint = mistake_hint
                break
    check_close(got, ref.float(), f"{name} for {where}", hint, **tol)


def _asa_where(shape, n_out, kw, bias=True) -> str:
    args = ", ".join(f"{k}={v}" for k, v in kw.items())
    return f"asa_linear on x {tuple(shape)}, W ({n_out}, {shape[-1]}){'' if bias else ', no bias'}" + \
        (f", {args}" if args else "")


def _asa_call(nb, x, w, b, g, kw, **run):
    got = fetch(nb.apply(probes.ch12_asa_run, nb.asa_linear, x, w, b, g, kw, **run))
    where = _asa_where(tuple(x.shape), w.shape[0], kw, b is not None) + \
        (", W and b as nn.Parameters" if run.get("parameter") else "")
    if got["type"] != "Tensor":
        raise AssertionError(f"{where} returned {got['type']}: it returns y, a tensor")
    if not got["attached"]:
        raise AssertionError(f"{where}: y is not attached to the autograd graph; return your Function's apply")
    return got, where


def _asa_values(nb, x, w, b, g, kw, tol=TOL, parameter=False) -> None:
    eps, lam, relu = kw.get("epsilon", 0.01), kw.get("lam", 100.0), kw.get("relu", False)
    got, where = _asa_call(nb, x, w, b, g, kw, parameter=parameter)
    ref = _asa_ref(x, w, b, g, eps, lam, relu)
    no_eps = _asa_ref(x, w, b, g, eps, lam, relu, forward_eps=False)
    tsign = _asa_ref(x, w, b, g, eps, lam, relu, sign="torch.sign")
    other = _asa_ref(x, w, b, g, eps, lam, not relu)
    _check(got["y"], ref["y"], "the output y", where, FORWARD_HINT,
           {FORWARD_HINT: no_eps["y"], SIGN_HINT: tsign["y"], RELU_HINT: other["y"]}, tol)
    if got.get("error"):
        raise AssertionError(f"{where}: backward raised {got['error']['types'][0]}: {got['error']['message']}")
    rows = ref["rows"]
    x2 = x.double().reshape(-1, x.shape[-1])
    _check(got["dx"], ref["dx"], "dx", where, DX_HINT, {DX_HINT: ref["dx"] * ref["s"].reshape(ref["dx"].shape)}, tol)
    _check(got["dW"], ref["dW"], "dW", where, DW_HINT,
           {DW_HINT: ref["dW"] / lam, f"{DW_HINT} ": ref["dW"] / eps, SIGN_HINT: tsign["dW"], RELU_HINT: other["dW"],
            DW_X_HINT: rows.t() @ x2, f"{DW_X_HINT} ": rows.t() @ (x2 + eps * ref["s"])}, tol)
    if b is not None:
        _check(got["db"], ref["db"], "db", where, DB_HINT, {}, tol)


ASA_DRAWN = ((2, 64), (2, 96), (2, 64))  # rows, in_features, out_features of the drawn layer
ASA_LARGE = (10**4, 10**6)  # elements of x of the layer drawn log-uniformly between the small cases and the memory cell


def _log_uniform(low: int, high: int) -> int:
    """An integer drawn log-uniformly in [low, high] at grading time."""
    return int(round(math.exp(math.log(low) + (math.log(high) - math.log(low)) * draw(0, 10**6) / 10**6)))


@hidden_test("test_asa_linear")
def check_asa_linear(nb):
    # (shape of x, out_features, keyword arguments, seed, weight and bias as nn.Parameters)
    cases = [((37, 53), 29, {}, 1, True), ((2, 5, 53), 29, {"epsilon": 0.05, "lam": 3.0, "relu": True}, 2, False),
             ((37, 53), 29, {"epsilon": 0.02, "lam": 7.0}, 3, False), ((37, 53), 29, {"relu": True}, 4, True),
             ((6, 4, 11), 7, {"epsilon": 0.1, "lam": 2.5}, 5, True),
             ((50, 256), 256, {}, 6, True), ((50, 256), 10, {"relu": True}, 7, True)]  # the notebook's layers
    for shape, n_out, kw, seed, parameter in cases:
        x, w, b, g = _asa_inputs(shape, n_out, seed)
        _asa_values(nb, x, w, b, g, kw, parameter=parameter)
    rows, n_in, n_out = (draw(*r) for r in ASA_DRAWN)
    kw = {"epsilon": draw(1, 20) / 100, "lam": float(draw(1, 200)), "relu": bool(draw(0, 1))}
    x, w, b, g = _asa_inputs((rows, n_in), n_out, new_seed())
    _asa_values(nb, x, w, b, g, kw, tol=dict(atol=1e-3, rtol=1e-4), parameter=bool(draw(0, 1)))
    # Between the small layers and the memory cell: x of 10^4 to 10^6 elements, drawn log-uniformly.
    n_in = draw(32, 512)
    rows = max(1, _log_uniform(*ASA_LARGE) // n_in)
    shape = (rows, n_in) if draw(0, 1) else (2, -(-rows // 2), n_in)
    kw = {"epsilon": draw(1, 20) / 100, "lam": float(draw(1, 200)), "relu": bool(draw(0, 1))}
    x, w, b, g = _asa_inputs(shape, draw(8, 128), new_seed(), bias=bool(draw(0, 1)))
    _asa_values(nb, x, w, b, g, kw, tol=dict(atol=5e-3, rtol=1e-4), parameter=bool(draw(0, 1)))


# --- asa_linear: what the forward keeps, what backward allocates ------------------------------------------------------
MEM_CASES = {  # elements of x, in_features (multiples of 64), x 3-D, weight and bias as nn.Parameters, bias, x's grad
    "a": dict(numel=(12 * 2**20, 15 * 2**20), cols=(1024, 2048, 64), three_d=True, parameter=True, bias=True,
              x_grad=True),
    "b": dict(numel=(8 * 2**20, 12 * 2**20), cols=(1024, 2048, 64), three_d=False, parameter=False, bias=False,
              x_grad=False),
}
MEM_OUT = 64
MEM_SLACK = 2 * MiB  # allocator slack; a bool s keeps 7 MiB or more beyond the bound
MEM_DX_ROWS = 32  # rows of dx fetched (besides its sum)


def _asa_full_reference(x, w, b, g, eps, lam, relu):
    """float64 y, dW and db of ASA on a large x, in blocks of rows."""
    cols = x.shape[-1]
    x2, g2 = x.reshape(-1, cols), g.reshape(-1, g.shape[-1]).double()
    w64 = w.double()
    y = torch.empty(x2.shape[0], w.shape[0], dtype=torch.float64)
    dw = torch.zeros(w.shape, dtype=torch.float64)
    for a in range(0, x2.shape[0], 2048):
        block = x2[a:a + 2048].double()
        s = torch.where(block > 0, 1.0, 0.0 if relu else -1.0).double()
        y[a:a + 2048] = (block + eps * s) @ w64.t()
        dw += g2[a:a + 2048].t() @ s
    if b is not None:
        y += b.double()
    return y.reshape(*x.shape[:-1], w.shape[0]), lam * eps * dw, g2.sum(0)


def _asa_memory_case(nb, case: str) -> None:
    spec = MEM_CASES[case]
    meter = Meter(nb)  # first: everything the student's code holds is read from outside
    cols = draw(*spec["cols"])
    rows = draw(-(-spec["numel"][0] // cols), spec["numel"][1] // cols)
    if spec["three_d"]:
        lead = draw(2, 8)
        rows -= rows % lead
        shape = (lead, rows // lead, cols)
    else:
        shape = (rows, cols)
    n = rows * cols
    seed, w_seed, b_seed, g_seed = new_seed(), new_seed(), new_seed(), new_seed()
    relu = bool(draw(0, 1))
    eps, lam = (0.01, 100.0) if draw(0, 1) else (draw(1, 10) / 100, float(draw(2, 50)))
    w = seeded((MEM_OUT, cols), seed=w_seed) / cols ** 0.5
    b = seeded((MEM_OUT,), seed=b_seed) if spec["bias"] else None
    if spec["parameter"]:
        weight = meter.put(torch.nn.Parameter(w.clone()))
        bias = None if b is None else meter.put(torch.nn.Parameter(b.clone()))
    else:
        weight, bias = meter.put(w.clone().requires_grad_()), None if b is None else meter.put(b.clone().requires_grad_())
    # A first call on a small input of the same kind: lazily loaded code and caches, on the measured path.
    small = nb.asa_linear(nb.put(torch.randn(2, 5, 8) if spec["three_d"] else torch.randn(5, 8)),
                          nb.put(torch.nn.Parameter(torch.randn(3, 8)) if spec["parameter"]
                                 else torch.randn(3, 8).requires_grad_()),
                          nb.put(torch.randn(3)) if spec["bias"] else None, eps, lam, relu)
    small.sum().backward()
    del small
    picked = torch.randperm(rows)[:MEM_DX_ROWS].sort().values

    dx_rows = meter.put(torch.zeros(len(picked), cols))  # filled by a hook on x as backward passes

    def call(x):
        y = nb.asa_linear(x, weight, bias, eps, lam, relu)
        if spec["x_grad"]:
            nb.apply(probes.ch12_grad_rows, x, picked, dx_rows)
        return y

    held, y = meter.held_by(call, inputs=lambda: [meter.tensor(shape, seed=seed,
                                                                          requires_grad=spec["x_grad"])])
    args = f"{'an nn.Parameter' if spec['parameter'] else 'a plain tensor'} W ({MEM_OUT}, {cols}), " + \
        ("an nn.Parameter bias" if spec["bias"] else "no bias")
    where = (f"asa_linear(x, W, b, epsilon={eps}, lam={lam}, relu={relu}) on x {shape} made for the call "
             f"({'requiring' if spec['x_grad'] else 'not requiring'} grad), {args}, held by the grader, sizes drawn "
             "at grading time")
    y_bytes = 4 * rows * MEM_OUT
    bound = -(-n // 8) + y_bytes + MEM_SLACK
    if held.kept > bound:
        del y
        raise AssertionError(
            f"{where}: between forward and backward, with x released, your process kept {mib(held.kept)} (read from "
            f"outside your process); the packed s is {mib(-(-n // 8))}, the output y {mib(y_bytes)} and x itself "
            f"{mib(4 * n)}: at most {mib(bound)} may stay. {KEEP_HINT}")
    x = seeded(shape, seed=seed)
    g = seeded((*shape[:-1], MEM_OUT), seed=g_seed)  # drawn now, sent only after the forward ran
    ref_y, ref_dw, ref_db = _asa_full_reference(x, w, b, g, eps, lam, relu)
    got = fetch(y)
    check_close(None if got is None else got.double(), ref_y, f"the output y of {where}", FORWARD_HINT,
                atol=1e-3, rtol=1e-4)
    grad = meter.tensor((*shape[:-1], MEM_OUT), requires_grad=False, seed=g_seed)
    y.backward(grad.tensor)
    check_close(fetch(weight.grad), ref_dw.float(), f"dW of {where}, for an output gradient drawn at grading time "
                "and sent after the forward", DW_HINT + "; " + SIGN_HINT, atol=1e-2, rtol=1e-4)
    if bias is not None:
        check_close(fetch(bias.grad), ref_db.float(), f"db of {where}", DB_HINT, atol=1e-2, rtol=1e-4)
    if spec["x_grad"]:
        g2 = g.reshape(-1, MEM_OUT).double()
        check_close(fetch(dx_rows), (g2[picked] @ w.double()).float(),
                    f"dx at rows {picked.tolist()[:6]}... of {where}", DX_HINT, atol=1e-3, rtol=1e-4)
        check_close(fetch(held.leaves[0].grad), (g2.sum(0) @ w.double()).sum().float(), f"the sum of dx for {where}",
                    DX_HINT, atol=1e-1, rtol=1e-3)


@hidden_test("test_asa_linear_memory")
def check_asa_linear_memory(nb):
    _asa_memory_case(nb, "a")
    _asa_memory_case(nb, "b")


@hidden_test("test_asa_linear_edge_cases")
def check_asa_linear_edge_cases(nb):
    # No bias.
    for shape, kw, seed in (((9, 13), {}, 20), ((3, 4, 13), {"relu": True, "epsilon": 0.03, "lam": 5.0}, 21)):
        x, w, _, g = _asa_inputs(shape, 7, seed, bias=False)
        _asa_values(nb, x, w, None, g, kw)
    # A 1-D x: one example.
    x, w, b, g = _asa_inputs((13,), 7, 22)
    _asa_values(nb, x, w, b, g, {"epsilon": 0.05, "lam": 4.0})
    # x without grad: the weight's storage is freed after the forward pass; dW and db must still be right.
    for shape, kw, seed in (((9, 13), {}, 23), ((2, 3, 13), {"relu": True, "epsilon": 0.02, "lam": 9.0}, 24)):
        x, w, b, g = _asa_inputs(shape, 7, seed)
        got, where = _asa_call(nb, x, w, b, g, kw, x_requires_grad=False, free_weight=True, parameter=seed == 24)
        where += ", x not requiring grad"
        if got.get("error"):
            raise AssertionError(f"{where}: backward read the weight ({got['error']['types'][0]}: "
                                 f"{got['error']['message'][:120]}). {NO_DX_HINT}")
        ref = _asa_ref(x, w, b, g, kw.get("epsilon", 0.01), kw.get("lam", 100.0), kw.get("relu", False))
        _check(got["dW"], ref["dW"], "dW", where, DW_HINT, {})
        _check(got["db"], ref["db"], "db", where, DB_HINT, {})
    # A frozen weight: dx and db.
    x, w, b, g = _asa_inputs((9, 13), 7, 25)
    got, where = _asa_call(nb, x, w, b, g, {}, w_requires_grad=False, parameter=True)
    where += ", W not requiring grad"
    if got.get("error"):
        raise AssertionError(f"{where}: backward raised {got['error']['types'][0]}: {got['error']['message']}")
    ref = _asa_ref(x, w, b, g, 0.01, 100.0, False)
    _check(got["dx"], ref["dx"], "dx", where, DX_HINT, {})
    _check(got["db"], ref["db"], "db", where, DB_HINT, {})
    # Errors.
    w = torch.randn(7, 13, generator=_gen(26))
    for args, why in (((torch.randn(4, 12, generator=_gen(27)), w, None), "x has 12 features, W expects 13"),
                      ((torch.randn(4, 13, generator=_gen(28)), w, None, 0.0), "epsilon = 0"),
                      ((torch.randn(4, 13, generator=_gen(29)), w, None, -0.01), "epsilon < 0")):
        names = fetch(nb.apply(probes.raised, nb.asa_linear, *args))
        if names is None or "ValueError" not in names:
            got_what = "returned" if names is None else f"raised {names[0]}"
            raise AssertionError(f"asa_linear with {why} {got_what}: it raises ValueError")


# --- ara_group --------------------------------------------------------------------------------------------
ARA_HINT = ("each block's fc1 takes its weight gradient from the group's input x_0: g_iᵀ x_0, not from its own "
            "input x_i (that is plain backprop)")
ARA_FORWARD_HINT = ("every value is computed from the real stream: block i maps x_i to x_i + fc2(relu(fc1(x_i))); "
                    "x_0 only replaces x_i in fc1's weight gradient")
ARA_DX_HINT = ("the gradient with respect to x is exactly backprop's: through fc1 it is g_i fc1.weight, and fc2, "
               "the ReLU and the residual additions are ordinary autograd")
ARA_LAMBDA_HINT = "ARA has no λ: fc1.weight's gradient is g_iᵀ x_0 as it is"
ARA_KEEP_HINT = ("keep one tensor for all the fc1 weight gradients of the group: x_0 itself (save the same tensor "
                 "in every block's Function, no copy), not each block's own input x_i")


def _block_params(n: int, d: int, h: int, seed: int) -> list:
    """fc1/fc2 weights and biases of n blocks whose branches are large enough that x_i differs from x_0 clearly."""
    gen = _gen(seed)
    return [{"fc1.weight": torch.randn(h, d, generator=gen) / d ** 0.5,
             "fc1.bias": torch.randn(h, generator=gen) * 0.5,
             "fc2.weight": torch.randn(d, h, generator=gen) / h ** 0.5,
             "fc2.bias": torch.randn(d, generator=gen) * 0.5} for _ in range(n)]


def _blocks(nb, params: list, container: str = "list"):
    """The notebook's own ResidualMLPBlocks (its setup cell's class), made in the worker, ``params`` set in them: a
    list of handles, or (``container="modulelist"``) an nn.ModuleList of them."""
    blocks = []
    for p in params:
        h, d = p["fc1.weight"].shape
        block = nb.ResidualMLPBlock(d, h)
        nb.apply(probes.ch12_set_block, block, p)
        blocks.append(block)
    return nb.put(torch.nn.ModuleList)(blocks) if container == "modulelist" else blocks


ARA_BAND = 1e-3  # fc1 pre-activations closer to 0 than this (float64) may flip a ReLU between float32 and float64


def _ara_forward(params: list, x: torch.Tensor) -> dict:
    """float64 forward of the group on rows (leading dimensions flattened): every block's input h_i and
    pre-activation z_i, the output, and "stable": True for the rows whose fc1 pre-activations all stay ARA_BAND away
    from 0 (float32 takes the same ReLU decisions there). The output gradient is zero on the other rows, so that
    every row's mask may differ and no weight gradient rests on a decision rounding could flip."""
    h = x.double().reshape(-1, x.shape[-1])
    stable = torch.ones(h.shape[0], dtype=torch.bool)
    hs, zs = [], []
    for p in params:
        z = torch.addmm(p["fc1.bias"].double(), h, p["fc1.weight"].double().t())
        stable &= (z.abs() > ARA_BAND).all(-1)
        hs.append(h)
        zs.append(z)
        h = h + torch.addmm(p["fc2.bias"].double(), F.relu(z), p["fc2.weight"].double().t())
    return {"hs": hs, "zs": zs, "y": h.reshape(x.shape), "stable": stable}


def _ara_ref(params, x, g, own_input=False, forward=None):
    """float64 output, dx and every parameter gradient, written out by hand (backprop's chain rule on rows); fc1's
    weight gradient from x_0 (``own_input``: from x_i)."""
    forward = forward or _ara_forward(params, x)
    hs, zs = forward["hs"], forward["zs"]
    gh = g.double().reshape(-1, g.shape[-1])
    grads = {}
    for i in reversed(range(len(params))):
        p, z = params[i], zs[i]
        r = F.relu(z)
        grads[f"{i}.fc2.weight"], grads[f"{i}.fc2.bias"] = gh.t() @ r, gh.sum(0)
        gz = (gh @ p["fc2.weight"].double()) * (z > 0)
        grads[f"{i}.fc1.weight"] = gz.t() @ (hs[i] if own_input else hs[0])
        grads[f"{i}.fc1.bias"] = gz.sum(0)
        gh = gh + gz @ p["fc1.weight"].double()
    grads = {f"{i}.{n}": grads[f"{i}.{n}"] for i in range(len(params)) for n in params[i]}
    return {"y": forward["y"], "dx": gh.reshape(x.shape), "grads": grads}


def _ara_where(n, shape, d, h, extra=""):
    return f"ara_group on {n} block{'s' if n > 1 else ''} (d={d}, h={h}), x {tuple(shape)}{extra}"


def _ara_values(nb, n, shape, h, seed, container="list", x_requires_grad=True, tol=TOL):
    d = shape[-1]
    params = _block_params(n, d, h, seed)
    gen = _gen(seed + 1000)
    x, g = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    forward = _ara_forward(params, x)
    g = g * forward["stable"].reshape(*shape[:-1], 1)
    where = _ara_where(n, shape, d, h, f", the setup cell's ResidualMLPBlocks as "
                       f"{'an nn.ModuleList' if container == 'modulelist' else 'a ' + container}"
                       + ("" if x_requires_grad else ", x not requiring grad"))
    got = fetch(nb.apply(probes.ch12_ara_run, nb.ara_group, _blocks(nb, params), x, g, x_requires_grad, container))
    if got["type"] != "Tensor":
        raise AssertionError(f"{where} returned {got['type']}: it returns the stream after the last block")
    if not got["attached"]:
        raise AssertionError(f"{where}: the output is not attached to the autograd graph")
    ref = _ara_ref(params, x, g, forward=forward)
    check_close(got["y"], ref["y"].float(), f"the output of {where}", ARA_FORWARD_HINT, **tol)
    if got.get("error"):
        raise AssertionError(f"{where}: backward raised {got['error']['types'][0]}: {got['error']['message']}")
    if x_requires_grad:
        _check(got["dx"], ref["dx"], "the gradient with respect to x", where, ARA_DX_HINT, {}, tol)
    own = _ara_ref(params, x, g, own_input=True, forward=forward)
    for name, want in ref["grads"].items():
        mistakes = ({ARA_HINT: own["grads"][name], ARA_LAMBDA_HINT: 100 * want} if name.endswith("fc1.weight")
                    else {})
        _check(got["grads"].get(name), want, f"the gradient of block {name}", where,
               ARA_HINT if name.endswith("fc1.weight") else "fc1.bias's gradient is Σ g_i; fc2's are backprop's",
               mistakes, tol)


ARA_LARGE = (10**4, 10**6)  # elements of x of the group drawn log-uniformly between the small cases and the memory cell


@hidden_test("test_ara_group")
def check_ara_group(nb):
    for n, shape, h, seed in ((2, (7, 11), 5, 1), (3, (9, 13), 17, 2), (4, (2, 5, 8), 6, 3), (4, (33, 24), 48, 4),
                              (4, (50, 128), 64, 5)):  # the last: the notebook's residual MLP
        _ara_values(nb, n, shape, h, seed)
    n, rows, d, h = draw(2, 4), draw(2, 40), draw(5, 48), draw(5, 48)
    _ara_values(nb, n, (rows, d), h, new_seed(), tol=dict(atol=1e-3, rtol=1e-4))
    # Between the small groups and the memory cell: x of 10^4 to 10^6 elements, drawn log-uniformly.
    d = draw(32, 256)
    rows = max(2, _log_uniform(*ARA_LARGE) // d)
    shape = (rows, d) if draw(0, 1) else (2, -(-rows // 2), d)
    _ara_values(nb, draw(2, 4), shape, draw(8, 64), new_seed(), tol=dict(atol=5e-3, rtol=1e-4))


ARA_MEM_ROWS, ARA_MEM_D, ARA_MEM_H = 4096, (768, 1024, 64), 64
ARA_MEM_SLACK = 4 * MiB  # allocator slack; a stored input per block keeps 2 to 3 more inputs of 12 to 16 MiB
ARA_DX_ROWS = 32


def _ara_memory_case(nb, three_d: bool) -> None:
    meter = Meter(nb)
    n, d = draw(3, 4), draw(*ARA_MEM_D)
    rows, h = ARA_MEM_ROWS, ARA_MEM_H
    shape = (2 ** draw(1, 4), 0, d) if three_d else (rows, d)
    if three_d:
        shape = (shape[0], rows // shape[0], d)
    block_seed, x_seed, g_seed = new_seed(), new_seed(), new_seed()
    weights = seeded((d,), seed=new_seed()).abs() + 0.5
    params = _block_params(n, d, h, block_seed)
    # A first call on a small input: lazily loaded code and caches, on the measured path.
    small_x = nb.put((torch.randn(2, 3, 8) if three_d else torch.randn(3, 8)).requires_grad_())
    small = nb.ara_group(_blocks(nb, _block_params(2, 8, 4, 5), "modulelist"), small_x)
    small.sum().backward()
    del small, small_x
    group = _blocks(nb, params, "modulelist")
    meter.booked += sum(t.numel() * 4 for p in params for t in p.values())  # held by the grader, like a put
    # The output gradient: a tensor the grader holds, its values written only after the forward ran.
    grad = meter.tensor(shape, requires_grad=False)
    picked = torch.randperm(rows)[:ARA_DX_ROWS].sort().values

    dx_rows = meter.put(torch.zeros(len(picked), d))  # filled by a hook on x as backward passes

    def call(x, wts):
        y = nb.ara_group(group, x)
        nb.apply(probes.ch12_grad_rows, x, picked, dx_rows)
        return y.mul(wts).sum(-1), y.mul(grad.tensor).sum()

    held, (out, loss) = meter.held_by(call, inputs=lambda: [meter.tensor(shape, seed=x_seed),
                                                                      meter.put(weights)])
    x_bytes = 4 * rows * d
    bound = x_bytes + n * 4 * rows * h + 4 * rows + ARA_MEM_SLACK
    where = (f"ara_group on {n} of the setup cell's ResidualMLPBlocks (d={d}, h={h}) in an nn.ModuleList, x {shape} "
             "made for the call, the blocks held by the grader, sizes drawn at grading time")
    if held.kept > bound:
        del out, loss
        raise AssertionError(
            f"{where}: between forward and backward, with x released, your process kept {mib(held.kept)} (read from "
            f"outside your process); x_0 is {mib(x_bytes)} and the {n} ReLU outputs {mib(n * 4 * rows * h)}: at most "
            f"{mib(bound)} may stay. {ARA_KEEP_HINT}")
    x = seeded(shape, seed=x_seed)
    forward = _ara_forward(params, x)
    stable = forward["stable"]
    g = seeded(shape, seed=g_seed) * stable.reshape(*shape[:-1], 1)
    nb.apply(probes.ch12_fill, grad.tensor, g_seed, stable)  # sent only now, after the forward
    ref = _ara_ref(params, x, g, forward=forward)
    got = fetch(out)
    check_close(None if got is None else got.double(), ref["y"] @ weights.double(),
                f"the output of {where}, each row summed with weights drawn at grading time", ARA_FORWARD_HINT,
                atol=1e-2, rtol=1e-4)
    loss.backward()
    what = f"{where}, for an output gradient drawn at grading time and sent after the forward"
    g_rows = ref["dx"].reshape(-1, d)
    check_close(fetch(dx_rows), g_rows[picked].float(), f"dx at rows {picked.tolist()[:6]}... of {what}",
                ARA_DX_HINT, atol=1e-3, rtol=1e-4)
    check_close(fetch(held.leaves[0].grad), ref["dx"].sum().float(), f"the sum of dx for {what}", ARA_DX_HINT,
                atol=1e-1, rtol=1e-3)
    grads = fetch(nb.apply(probes.ch12_grads, group))
    for i in range(n):
        for name, hint in ((f"{i}.fc1.weight", ARA_HINT), (f"{i}.fc1.bias", "fc1.bias's gradient is Σ g_i")):
            check_close(grads.get(name), ref["grads"][name].float(), f"the gradient of block {name} for {what}",
                        hint, atol=1e-2, rtol=1e-4)


@hidden_test("test_ara_group_memory")
def check_ara_group_memory(nb):
    _ara_memory_case(nb, three_d=True)
    _ara_memory_case(nb, three_d=False)


@hidden_test("test_ara_group_edge_cases")
def check_ara_group_edge_cases(nb):
    _ara_values(nb, 1, (9, 13), 7, 30)  # one block: exact backprop
    _ara_values(nb, 3, (6, 10), 4, 31, container="tuple")
    _ara_values(nb, 2, (2, 3, 10), 5, 32, container="modulelist")
    _ara_values(nb, 3, (8, 12), 6, 33, x_requires_grad=False)
    for empty in ([], torch.nn.ModuleList()):
        names = fetch(nb.apply(probes.raised, nb.ara_group, empty, torch.randn(3, 4)))
        if names is None or "ValueError" not in names:
            got = "returned" if names is None else f"raised {names[0]}"
            raise AssertionError(f"ara_group on an empty group {got}: it raises ValueError")


# --- learning_indicator ---------------------------------------------------------------------------------
LI_HINT = "LI = 1 - Σ (x_tilde - a)² / (Σ x_tilde² + 1e-6), the sums over the last dimension"
LI_ROW_HINT = "one value per row: sum over the last dimension only, never average over the batch"


def _li_ref(x, a):
    x, a = x.double(), a.double()
    return 1 - (x - a).pow(2).sum(-1) / (x.pow(2).sum(-1) + 1e-6)


def _li_case(shape, dtype, seed):
    gen = _gen(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    scale = torch.rand(shape[:-1] + (1,), generator=gen, dtype=torch.float64) * 1.5
    a = x * (1 - scale) + 0.3 * torch.randn(shape, generator=gen, dtype=torch.float64)  # near and far from x
    x = x + 0.5 * torch.sign(x)  # every row's squared norm well above 0.1
    return x.to(dtype), a.to(dtype)


@hidden_test("test_learning_indicator")
def check_learning_indicator(nb):
    cases = [((5, 7), torch.float32, 1), ((2, 3, 4), torch.float64, 2), ((6,), torch.float32, 3),
             ((9, 1), torch.float64, 4), ((50, 128), torch.float32, 5), ((50, 256), torch.float32, 6),
             ((draw(1, 20), draw(1, 64)), torch.float32, new_seed()),
             ((draw(1, 64), draw(65, 512)), torch.float32, new_seed())]  # the notebook's d = 128 and 256, and up to 512
    for shape, dtype, seed in cases:
        x, a = _li_case(shape, dtype, seed)
        got = fetch(nb.learning_indicator(x, a))
        where = f"learning_indicator on {dtype} tensors of shape {shape}"
        ref = _li_ref(x, a)
        if isinstance(got, torch.Tensor) and tuple(got.shape) != tuple(ref.shape):
            raise AssertionError(f"{where} returned shape {tuple(got.shape)}, expected {tuple(ref.shape)}: "
                                 f"{LI_ROW_HINT}")
        wrong = 1 - a.double().pow(2).sum(-1) / x.double().pow(2).sum(-1)
        hint = "that is 1 - ‖a‖²/‖x̃‖²: subtract a from x̃ first. " + LI_HINT \
            if _matches(got, wrong, dict(atol=1e-5, rtol=1e-4)) else LI_HINT
        check_close(None if got is None else (got.double() if isinstance(got, torch.Tensor) else got), ref,
                    where, hint, atol=2e-5, rtol=1e-4)


@hidden_test("test_learning_indicator_errors")
def check_learning_indicator_errors(nb):
    for x, a, why in ((torch.ones(2, 3), torch.ones(3, 2), "shapes (2, 3) and (3, 2)"),
                      (torch.ones(4), torch.ones(4, 1), "shapes (4,) and (4, 1)"),
                      (torch.ones(2, 5), torch.ones(2, 4), "shapes (2, 5) and (2, 4)"),
                      (torch.tensor(1.0), torch.tensor(1.0), "0-d tensors")):
        names = fetch(nb.apply(probes.raised, nb.learning_indicator, x, a))
        if names is None or "ValueError" not in names:
            got = "returned" if names is None else f"raised {names[0]}"
            raise AssertionError(f"learning_indicator on {why} {got}: it raises ValueError")
