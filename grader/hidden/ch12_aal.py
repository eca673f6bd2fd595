"""Hidden tests of chapter 12 (AAL: auxiliary activation learning).

asa_linear, by property:
- values (test_asa_linear): y = (x + ε s) Wᵀ + b, dx = g W, dW = λ ε gᵀ s, db = Σ g against a float64 reference
  computed here, on fixed layers (37 × 53 → 29; x (2, 5, 53)) and one drawn at grading time, inputs with exact
  zeros (s = -1 there, unlike torch.sign), relu False and True, the defaults and other ε, λ (λ ε ≠ 1). Failures
  are matched against known mistakes (no ε s in the forward, torch.sign, λ or ε missing, dx from s, dW from x)
  to name the one that was made.
- memory (test_asa_linear_memory): read from outside the worker (``Meter``): one forward on x of 12·2^20 to
  15·2^20 elements (2-D, in_features 1024 to 2048, drawn; made in the worker for the call and released after
  it), the weight (64 × in_features) held by the grader: kept ≤ ⌈n/8⌉ + the returned row sums + 2 MiB (the
  reference keeps about 0.6 MiB beyond the packed s). A bool s keeps n bytes, x itself 4n: at least 8 MiB over the
  bound across the range, more than ballast can hide (5 MiB). On that same call: the output's
  row sums (weights drawn now), and after backward the sums of dx and dW (through the inputs' 0-d leaves),
  against the judge's float64 values on the same seeded x.
- edge cases: no bias; x not requiring grad with the weight's storage freed between forward and backward (a
  backward that computes dx reads it and raises); a frozen weight; a 1-D x; ValueError for a wrong last
  dimension and ε ≤ 0.

ara_group: values and every gradient against a float64 autograd reference whose fc1 weight gradients come from
the group input (groups of 1 to 4 blocks, 2-D and 3-D x, a drawn case); memory from outside the worker: 3 or 4
blocks (d 768 to 1024, h 64) on 4096 rows made for the call: kept ≤ x_0 + the ReLU outputs + 4 MiB (the reference
keeps about 1.3 MiB beyond them; a stored input per block keeps 24 MiB or more beyond), the output and gradients of
that call checked, with fc1's pre-activations kept far from 0 so that float32 and float64 agree on every ReLU; edge cases: one block (exact backprop), a tuple and an nn.ModuleList, x not
requiring grad, ValueError for an empty group.

learning_indicator: per-row values against float64 (both forms the text allows pass), shapes (...); errors.
"""
from __future__ import annotations

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
    where = _asa_where(tuple(x.shape), w.shape[0], kw, b is not None)
    if got["type"] != "Tensor":
        raise AssertionError(f"{where} returned {got['type']}: it returns y, a tensor")
    if not got["attached"]:
        raise AssertionError(f"{where}: y is not attached to the autograd graph; return your Function's apply")
    return got, where


def _asa_values(nb, x, w, b, g, kw, tol=TOL) -> None:
    eps, lam, relu = kw.get("epsilon", 0.01), kw.get("lam", 100.0), kw.get("relu", False)
    got, where = _asa_call(nb, x, w, b, g, kw)
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


@hidden_test("test_asa_linear")
def check_asa_linear(nb):
    cases = [((37, 53), 29, {}, 1), ((2, 5, 53), 29, {"epsilon": 0.05, "lam": 3.0, "relu": True}, 2),
             ((37, 53), 29, {"epsilon": 0.02, "lam": 7.0}, 3), ((37, 53), 29, {"relu": True}, 4),
             ((6, 4, 11), 7, {"epsilon": 0.1, "lam": 2.5}, 5)]
    for shape, n_out, kw, seed in cases:
        x, w, b, g = _asa_inputs(shape, n_out, seed)
        _asa_values(nb, x, w, b, g, kw)
    rows, n_in, n_out = (draw(*r) for r in ASA_DRAWN)
    kw = {"epsilon": draw(1, 20) / 100, "lam": float(draw(1, 200)), "relu": bool(draw(0, 1))}
    x, w, b, g = _asa_inputs((rows, n_in), n_out, new_seed())
    _asa_values(nb, x, w, b, g, kw, tol=dict(atol=1e-3, rtol=1e-4))


# --- asa_linear: what the forward keeps -----------------------------------------------------------------
MEM_LOW, MEM_HIGH = 12 * 2**20, 15 * 2**20  # elements of the measured x: 48 to 60 MiB of fp32
MEM_COLS = (1024, 2048, 64)  # in_features, drawn (multiples of 64)
MEM_OUT = 64
MEM_SLACK = 2 * MiB  # allocator slack; a bool s keeps 12 to 15 MiB


def _asa_measured_reference(rows, cols, seed, w_seed, weights, eps, lam, relu):
    """float64: the output's weighted row sums, Σ dx and Σ dW for g = weights on every row, on the seeded x."""
    w = seeded((MEM_OUT, cols), seed=w_seed).double()
    x = seeded((rows, cols), seed=seed)
    out = torch.empty(rows, dtype=torch.float64)
    s_col = torch.zeros(cols, dtype=torch.float64)
    wv = weights.double()
    for a in range(0, rows, 1024):
        block = x[a:a + 1024].double()
        s = torch.where(block > 0, 1.0, 0.0 if relu else -1.0).double()
        out[a:a + 1024] = (block + eps * s) @ w.t() @ wv
        s_col += s.sum(0)
    sum_dx = rows * (wv @ w).sum()
    sum_dw = lam * eps * wv.sum() * s_col.sum()
    return out, sum_dx, sum_dw


@hidden_test("test_asa_linear_memory")
def check_asa_linear_memory(nb):
    meter = Meter(nb)  # first: everything the student's code holds is read from outside
    cols = draw(*MEM_COLS)
    rows = draw(-(-MEM_LOW // cols), MEM_HIGH // cols)
    seed, w_seed = new_seed(), new_seed()
    relu = bool(draw(0, 1))
    eps, lam = (0.01, 100.0) if draw(0, 1) else (draw(1, 10) / 100, float(draw(2, 50)))
    weights = seeded((MEM_OUT,), seed=new_seed()).abs() + 0.5
    # A first call on a small input: lazily loaded code and caches, on the measured path.
    small = nb.asa_linear(nb.put(torch.randn(5, 8)), nb.put(torch.randn(3, 8).requires_grad_()), None, eps, lam, relu)
    small.sum().backward()
    del small
    w_made = meter.tensor((MEM_OUT, cols), seed=w_seed)
    held, out = meter.held_by(
        lambda x, wts: nb.asa_linear(x, w_made.tensor, None, eps, lam, relu).mul(wts).sum(-1),
        inputs=lambda: [meter.tensor((rows, cols), seed=seed), meter.put(weights)])
    n = rows * cols
    where = (f"asa_linear(x, W, None, epsilon={eps}, lam={lam}, relu={relu}) on x ({rows}, {cols}) made for the "
             f"call, W ({MEM_OUT}, {cols}) held by the grader, sizes drawn at grading time")
    bound = -(-n // 8) + 4 * rows + MEM_SLACK
    if held.kept > bound:
        del out
        raise AssertionError(
            f"{where}: between forward and backward, with x released, your process kept {mib(held.kept)} (read from "
            f"outside your process); the packed s is {mib(-(-n // 8))} and x itself {mib(4 * n)}: at most "
            f"{mib(bound)} may stay. {KEEP_HINT}")
    ref_out, sum_dx, sum_dw = _asa_measured_reference(rows, cols, seed, w_seed, weights, eps, lam, relu)
    got = fetch(out)
    check_close(None if got is None else got.double(), ref_out, f"the output of {where}, each row summed with "
                "weights drawn at grading time", FORWARD_HINT, atol=1e-3, rtol=1e-4)
    out.sum().backward()
    got_dx, got_dw = fetch(held.leaves[0].grad), fetch(w_made.leaf.grad)
    check_close(got_dx, sum_dx.float(), f"the sum of dx for {where}", DX_HINT, atol=1e-2, rtol=1e-3)
    check_close(got_dw, sum_dw.float(), f"the sum of dW for {where}", DW_HINT + "; " + SIGN_HINT,
                atol=1e-2, rtol=1e-3)


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
        got, where = _asa_call(nb, x, w, b, g, kw, x_requires_grad=False, free_weight=True)
        where += ", x not requiring grad"
        if got.get("error"):
            raise AssertionError(f"{where}: backward read the weight ({got['error']['types'][0]}: "
                                 f"{got['error']['message'][:120]}). {NO_DX_HINT}")
        ref = _asa_ref(x, w, b, g, kw.get("epsilon", 0.01), kw.get("lam", 100.0), kw.get("relu", False))
        _check(got["dW"], ref["dW"], "dW", where, DW_HINT, {})
        _check(got["db"], ref["db"], "db", where, DB_HINT, {})
    # A frozen weight: dx and db.
    x, w, b, g = _asa_inputs((9, 13), 7, 25)
    got, where = _asa_call(nb, x, w, b, g, {}, w_requires_grad=False)
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


def _blocks(n: int, d: int, h: int, seed: int, margin: bool = False) -> list:
    """n grader blocks whose branches are large enough that x_i differs from x_0 clearly. ``margin``: fc1's
    pre-activations stay far from 0 (a bias of ±4, ten standard deviations of the rest), so that float32 and the
    judge's float64 agree on every ReLU over thousands of rows (a flipped unit would move a weight gradient by far
    more than rounding does)."""
    gen = _gen(seed)
    blocks = []
    for _ in range(n):
        block = probes.ch12_Block(d, h)
        with torch.no_grad():
            if margin:
                block.fc1.weight.copy_(torch.randn(h, d, generator=gen) / (4 * d ** 0.5))
                block.fc1.bias.copy_(torch.where(torch.rand(h, generator=gen) < 0.5, -4.0, 4.0))
                block.fc2.weight.copy_(torch.randn(d, h, generator=gen) / (8 * h ** 0.5))
            else:
                block.fc1.weight.copy_(torch.randn(h, d, generator=gen) / d ** 0.5)
                block.fc1.bias.copy_(torch.randn(h, generator=gen) * 0.5)
                block.fc2.weight.copy_(torch.randn(d, h, generator=gen) / h ** 0.5)
            block.fc2.bias.copy_(torch.randn(d, generator=gen) * 0.5)
        blocks.append(block)
    return blocks


def _ara_ref(blocks, x, g, own_input=False):
    """float64 output, dx and every parameter gradient; fc1's weight gradient from x_0 (``own_input``: from x_i)."""
    params = [{n: p.detach().double().clone().requires_grad_() for n, p in b.named_parameters()} for b in blocks]
    x = x.detach().double().clone().requires_grad_()
    x0 = x.detach()
    h = x
    for p in params:
        w1 = p["fc1.weight"]
        aux = h.detach() if own_input else x0
        # value: h W1ᵀ + b1; W1's gradient through aux only, h's gradient through the detached W1 only
        z = h @ w1.detach().t() + (aux @ w1.t() - (aux @ w1.t()).detach()) + p["fc1.bias"]
        h = h + F.relu(z) @ p["fc2.weight"].t() + p["fc2.bias"]
    h.backward(g.double())
    grads = {f"{i}.{n}": t.grad for i, p in enumerate(params) for n, t in p.items()}
    return {"y": h.detach(), "dx": x.grad, "grads": grads}


def _ara_where(n, shape, d, h, extra=""):
    return f"ara_group on {n} block{'s' if n > 1 else ''} (d={d}, h={h}), x {tuple(shape)}{extra}"


def _ara_values(nb, n, shape, h, seed, container="list", x_requires_grad=True, tol=TOL):
    d = shape[-1]
    blocks = _blocks(n, d, h, seed)
    gen = _gen(seed + 1000)
    x, g = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    where = _ara_where(n, shape, d, h, f", blocks as {'an nn.ModuleList' if container == 'modulelist' else 'a ' + container}"
                       + ("" if x_requires_grad else ", x not requiring grad"))
    got = fetch(nb.apply(probes.ch12_ara_run, nb.ara_group, blocks, x, g, x_requires_grad, container))
    if got["type"] != "Tensor":
        raise AssertionError(f"{where} returned {got['type']}: it returns the stream after the last block")
    if not got["attached"]:
        raise AssertionError(f"{where}: the output is not attached to the autograd graph")
    ref = _ara_ref(blocks, x, g)
    check_close(got["y"], ref["y"].float(), f"the output of {where}", ARA_FORWARD_HINT, **tol)
    if got.get("error"):
        raise AssertionError(f"{where}: backward raised {got['error']['types'][0]}: {got['error']['message']}")
    if x_requires_grad:
        _check(got["dx"], ref["dx"], "the gradient with respect to x", where, ARA_DX_HINT, {}, tol)
    own = _ara_ref(blocks, x, g, own_input=True)
    for name, want in ref["grads"].items():
        mistakes = ({ARA_HINT: own["grads"][name], ARA_LAMBDA_HINT: 100 * want} if name.endswith("fc1.weight")
                    else {})
        _check(got["grads"].get(name), want, f"the gradient of block {name}", where,
               ARA_HINT if name.endswith("fc1.weight") else "fc1.bias's gradient is Σ g_i; fc2's are backprop's",
               mistakes, tol)


@hidden_test("test_ara_group")
def check_ara_group(nb):
    for n, shape, h, seed in ((2, (7, 11), 5, 1), (3, (9, 13), 17, 2), (4, (2, 5, 8), 6, 3), (4, (33, 24), 48, 4)):
        _ara_values(nb, n, shape, h, seed)
    n, rows, d, h = draw(2, 4), draw(2, 40), draw(5, 48), draw(5, 48)
    _ara_values(nb, n, (rows, d), h, new_seed(), tol=dict(atol=1e-3, rtol=1e-4))


ARA_MEM_ROWS, ARA_MEM_D, ARA_MEM_H = 4096, (768, 1024, 64), 64
ARA_MEM_SLACK = 4 * MiB  # allocator slack; a stored input per block keeps 2 to 3 more inputs of 12 to 16 MiB


@hidden_test("test_ara_group_memory")
def check_ara_group_memory(nb):
    meter = Meter(nb)
    n, d = draw(3, 4), draw(*ARA_MEM_D)
    rows, h = ARA_MEM_ROWS, ARA_MEM_H
    block_seed, x_seed = new_seed(), new_seed()
    weights = seeded((d,), seed=new_seed()).abs() + 0.5
    blocks = _blocks(n, d, h, block_seed, margin=True)
    # A first call on a small input: lazily loaded code and caches, on the measured path.
    small = nb.ara_group(nb.put(torch.nn.ModuleList(_blocks(2, 8, 4, 5))), nb.put(torch.randn(3, 8).requires_grad_()))
    small.sum().backward()
    del small
    group = meter.put(torch.nn.ModuleList(blocks))
    held, out = meter.held_by(lambda x, wts: nb.ara_group(group, x).mul(wts).sum(-1),
                              inputs=lambda: [meter.tensor((rows, d), seed=x_seed), meter.put(weights)])
    x_bytes = 4 * rows * d
    bound = x_bytes + n * 4 * rows * h + 4 * rows + ARA_MEM_SLACK
    where = (f"ara_group on {n} blocks (d={d}, h={h}), x ({rows}, {d}) made for the call, the blocks held by the "
             "grader, sizes drawn at grading time")
    if held.kept > bound:
        del out
        raise AssertionError(
            f"{where}: between forward and backward, with x released, your process kept {mib(held.kept)} (read from "
            f"outside your process); x_0 is {mib(x_bytes)} and the {n} ReLU outputs {mib(n * 4 * rows * h)}: at most "
            f"{mib(bound)} may stay. {ARA_KEEP_HINT}")
    x = seeded((rows, d), seed=x_seed)
    g = weights.expand(rows, d)
    ref = _ara_ref(blocks, x, g)
    got = fetch(out)
    check_close(None if got is None else got.double(), ref["y"] @ weights.double(),
                f"the output of {where}, each row summed with weights drawn at grading time", ARA_FORWARD_HINT,
                atol=1e-2, rtol=1e-4)
    out.sum().backward()
    check_close(fetch(held.leaves[0].grad), ref["dx"].sum().float(), f"the sum of dx for {where}", ARA_DX_HINT,
                atol=1e-1, rtol=1e-3)
    grads = fetch(nb.apply(probes.ch12_grads, group))
    for i in range(n):
        name = f"{i}.fc1.weight"
        check_close(grads.get(name), ref["grads"][name].float(), f"the gradient of block {name} for {where}",
                    ARA_HINT, atol=1e-2, rtol=1e-3)


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
             ((9, 1), torch.float64, 4), ((draw(1, 20), draw(1, 64)), torch.float32, new_seed())]
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
