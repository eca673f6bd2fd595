"""Hidden tests of chapter 6 (meProp).

meprop_linear, by property, one graded cell each:
- values: per-example top-k on awkward fixed shapes (37 × 29 → 53, 6 × 40 → 9; k = 1 … n_out − 1) and
  on layers drawn at grading time (sizes, k and seeds: a small layer, B, n_in, n_out each from 2 to
  64, k from 1 to n_out − 1; a wide one, B from 32 to 256, n_in from 32 to 512, n_out from 128 to
  512, once with k from 1 to 32 and once from 33 to n_out − 1), against a float64 reference computed
  here. The drawn layers stop code that sparsifies only on shapes it knows and runs the dense
  backward elsewhere. The output gradient has large negative entries (a signed top-k keeps other
  entries) and, with 6 rows, a top-k over the batch axis is still possible but wrong; failures are
  matched against those mistakes (and a sparsified db, one of dx/dW left dense) to name the one that
  was made.
- unified: an output gradient built so that the column sums of |g| are well separated and differ
  in order from the signed sums and from the column maxima; rows of dW outside I must be exactly 0.
  The fixed shapes, and a wide layer drawn from the same ranges (k from 1 to n_out − 1).
- compute: first behavioural, from values. Rows of W outside I are NaN and one entry of x is inf:
  products of the compacted g[:, I] keep dx finite and dW's other rows exactly 0, while a dense
  product with zeroed columns gives 0 · NaN = NaN in dx and 0 · inf = NaN in dW. Masks
  (torch.where) can scrub that poison, so the point rests on CPU time, read from the worker's
  cgroup (``Meter.cpu_by``): on a wide layer drawn at grading time (B, n_in, n_out from 1792 to 2304,
  k from 4 to 32) the unified backward may use at most 1/3 of what the course's own dense products
  (probes.ch06_dense_backward, measured the same way on the same inputs, first, on one thread whatever
  the student's code set) take; the compacted products need k / n_out of those FLOPs. A call over the
  limit gets one more try against a second baseline (the least of each counts). dx rows, dW rows (I and
  a sample outside it) and db of those very calls are compared with the judge's float64 reference on
  the same seeded inputs. The backward FLOPs counted in the student's process appear in messages only.
  Measured (2-core machine, loaded, and beside a CPU burner alike): the dense products take 0.27 to
  0.60 s, the course's backward 0.05 to 0.07 s (1/9 to 1/6 of them), masked dense products 1.2 to 1.3
  times the dense time.
- edge cases: k ≤ 0 and k ≥ n_out are dense; with an x that needs no grad, W's storage is freed between
  forward and backward (a backward that computes dx reads W and raises); no bias; ValueError for a
  non-2-D x.

apply_meprop, without running the student's meprop_linear: which modules were replaced (every Linear
but the last, at its place, by a MePropLinear holding the same Parameters with the given k and
unified), nothing else changed, a ValueError without Linear; and the output layer alone, run forward
and backward in the student's process, gives a dense Linear's values and gradients.
"""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

from coursekit.checks import check_close, same_close, same_values
from coursekit.models import mlp
from coursekit.transformer import GPTConfig, TinyGPT
from grader import probes
from grader.api import fetch, hidden_test
from grader.resources import Meter, MiB, draw, fresh_tensor, mib, new_seed, seeded
from grader.source_policy import Shortcut, SourcePolicy

# The course's gather-GEMM (kernels.ch06_sparse_backprop) computes the unified backward's two products.
SOURCE_POLICY = SourcePolicy(shortcuts=(
    Shortcut(paths=("kernels.ch06_sparse_backprop",),
             instead="write the backward with torch operations (topk, index_select, index_copy, matrix products); "
                     "the course's gather-GEMM is its own answer"),
))

TOL = dict(atol=1e-4, rtol=1e-4)  # float32 products of length ≤ 53 against float64
CHAPTER_SHAPES = [(37, 29, 53), (6, 40, 9)]  # (B, n_in, n_out)

MAGNITUDE_HINT = ("keep the k entries of largest magnitude |g_ij| in each row: a large negative gradient "
                  "counts as much as a large positive one (topk of g.abs(), then take the signed values)")
ROW_HINT = ("per example means per row of g (B, n_out): top-k over the output units of each example "
            "(dim=1), not over the batch (dim=0)")
DENSE_HINT = ("per-example meProp applies to every layer: whatever B, n_in, n_out and 0 < k < n_out, keep the k "
              "entries of largest |g_ij| in each row of g and zero the rest before both products")
BOTH_HINT = "both products use the sparsified gradient: dx = g̃ W and dW = g̃ᵀ x"
BIAS_HINT = "the bias gradient db = Σ_i g_i comes from the full g, not from the sparsified one"
FORWARD_HINT = "the forward pass is a plain Linear: y = x Wᵀ + b (F.linear(x, weight, bias))"
ONE_SET_HINT = ("unified=True keeps one index set I for the whole batch: the same k columns of g for every "
                "example, so exactly k rows of dW are non-zero")
INDEX_HINT = ("I holds the k largest column sums of |g| over the batch, Σ_i |g_ij| (not the signed sums Σ_i "
              "g_ij, nor the largest single entry max_i |g_ij|)")
ZERO_ROWS_HINT = "rows of dW outside I receive no gradient at all: exactly 0"
DENSE_K_HINT = "k ≤ 0 or k ≥ n_out means the dense backward: dx = g W, dW = gᵀ x, db = Σ g (torch.topk refuses k > n_out)"
NO_DX_HINT = ("when x does not require grad (ctx.needs_input_grad[0] is False), return None for dx and do "
              "not compute it: the first layer of a network never needs it. The test frees W's storage "
              "after the forward pass; only dx reads W")
NO_DW_HINT = ("when the weight does not require grad (a frozen layer: ctx.needs_input_grad[1] is False), return None "
              "for dW and do not compute it. The test frees x's storage after the forward pass; only dW reads x")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _inputs(B: int, n_in: int, n_out: int, seed: int, bias: bool = True):
    g = _gen(seed)
    x, w = torch.randn(B, n_in, generator=g), torch.randn(n_out, n_in, generator=g) / n_in ** 0.5
    b = torch.randn(n_out, generator=g) if bias else None
    return x, w, b


def _per_example_grad(B: int, n_out: int, seed: int) -> torch.Tensor:
    """Normal entries, the negative ones below −0.8 tripled: the largest magnitudes are mostly negative."""
    g = torch.randn(B, n_out, generator=_gen(seed))
    return torch.where(g < -0.8, 3 * g, g)


def _unified_grad(B: int, n_out: int, seed: int) -> torch.Tensor:
    """Column j has Σ_i |g_ij| = s_j, the s_j distinct and 0.25 apart; each column's mass sits on a few
    entries (cubed uniforms) with random signs, so the order of the column sums differs from the order of
    the signed sums and of the column maxima."""
    gen = _gen(seed)
    sums = 1.0 + 0.25 * torch.randperm(n_out, generator=gen).double()  # (n_out,)
    mass = torch.rand(B, n_out, generator=gen, dtype=torch.float64) ** 3 + 1e-3
    signs = torch.where(torch.rand(B, n_out, generator=gen) < 0.5, -1.0, 1.0).double()
    return (signs * mass / mass.sum(0) * sums).float()


def _top_rows(g: torch.Tensor, k: int) -> torch.Tensor:
    return torch.zeros_like(g).scatter(1, g.abs().topk(k, dim=1).indices, g.gather(1, g.abs().topk(k, dim=1).indices))


INPUTS_HINT = ("leave x, weight and bias as they are: the same tensors holding the same values (no in-place "
               "change, no .data replaced); save what backward needs with ctx.save_for_backward")


def _run(nb, x, w, b, g, k, unified, **kw) -> dict:
    got = fetch(nb.apply(probes.ch06_linear_run, nb.meprop_linear, x, w, b, g, k, unified, **kw))
    if got.get("changed"):
        raise AssertionError(f"{_where(*x.shape, w.shape[0], k, unified, bias=b is not None)}: after the forward "
                             f"pass, {' and '.join(got['changed'])} no longer held the caller's values in the caller's "
                             f"storage. {INPUTS_HINT}")
    return got


def _where(B, n_in, n_out, k, unified, bias=True) -> str:
    kind = "unified" if unified else "per-example"
    return (f"meprop_linear on x ({B}, {n_in}), W ({n_out}, {n_in}){'' if bias else ', no bias'}, k={k}, {kind}")


def _check_call(got: dict, x, w, b, where: str) -> None:
    if got["type"] != "Tensor":
        raise AssertionError(f"{where} returned {got['type']}: it returns y, a tensor")
    ref = F.linear(x.double(), w.double(), None if b is None else b.double()).float()
    check_close(got["y"], ref, f"the output of {where}", FORWARD_HINT, atol=1e-5, rtol=1e-5)
    if not got["attached"]:
        raise AssertionError(f"{where}: y is not attached to the autograd graph (no grad_fn); return the output "
                             "of your Function's apply")
    if got.get("error"):
        err = got["error"]
        raise AssertionError(f"{where}: backward raised {err['types'][0]}: {err['message']}")


def _matches(got, candidate, tol: dict = TOL) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == candidate.shape
            and same_close(got.double(), candidate.double(), **tol))


def _grad_check(got, ref, name: str, where: str, hint: str, mistakes: dict, tol: dict = TOL) -> None:
    """check_close, with the hint of the first known mistake whose result ``got`` equals."""
    if got is None:
        raise AssertionError(f"{where}: no gradient reached {name}. Return it from backward")
    if not _matches(got, ref, tol):
        for mistake_hint, candidate in mistakes.items():
            if candidate is not None and _matches(got, candidate, tol):
                hint = mistake_hint
                break
    check_close(got, ref.float(), f"{name} for {where}", hint, **tol)


def _linear_grads(gt: torch.Tensor, x, w) -> tuple[torch.Tensor, torch.Tensor]:
    gt, x, w = gt.double(), x.double(), w.double()
    return gt @ w, gt.t() @ x


# --- meprop_linear: per-example values ---------------------------------------------------------------
# Besides the fixed awkward cases, layers drawn at grading time (the ranges the exercise states): a small one, and a
# wide one of the chapter's sizes (its MLP: batch 50, 64 -> 256 -> 256) with a small k and a large one. Code that
# sparsifies only on the shapes it has seen runs a dense backward on these.
VALUE_SMALL = ((2, 64), (2, 64), (2, 64))  # B, n_in, n_out of the small drawn layer; k from 1 to n_out - 1
VALUE_WIDE = ((32, 256), (32, 512), (128, 512))  # B, n_in, n_out of the wide drawn layer
VALUE_WIDE_K = ((1, 32), (33, None))  # its two k: from 1 to 32, and from 33 to n_out - 1
DRAWN_TOL = dict(atol=1e-3, rtol=1e-4)  # float32 sums of up to 256 products (dW): measured error <= 4e-5


def _drawn_per_example_cases() -> list[tuple[int, int, int, int]]:
    """(B, n_in, n_out, k) of the per-example layers drawn now."""
    small = [draw(*r) for r in VALUE_SMALL]
    wide = [draw(*r) for r in VALUE_WIDE]
    return [(*small, draw(1, small[2] - 1)),
            *((*wide, draw(lo, wide[2] - 1 if hi is None else hi)) for lo, hi in VALUE_WIDE_K)]


def _distinct_at_k(g: torch.Tensor, k: int) -> bool:
    """Whether every row's k-th and (k+1)-th largest |g_ij| differ (the kept set is then unambiguous)."""
    top = g.abs().topk(k + 1, dim=1).values
    return bool((top[:, k - 1] > top[:, k]).all())


def _check_per_example(nb, x, w, b, g, k, tol: dict = TOL) -> None:
    B, n_in = x.shape
    n_out = w.shape[0]
    where = _where(B, n_in, n_out, k, False)
    got = _run(nb, x, w, b, g, k, False)
    _check_call(got, x, w, b, where)
    dx, dw = _linear_grads(_top_rows(g, k), x, w)
    signed = torch.zeros_like(g).scatter(1, g.topk(k, dim=1).indices, g.gather(1, g.topk(k, dim=1).indices))
    dx_s, dw_s = _linear_grads(signed, x, w)
    dx_c = dw_c = None
    if k <= B:  # top-k over the batch axis: per column
        cols = torch.zeros_like(g).scatter(0, g.abs().topk(k, dim=0).indices,
                                           g.gather(0, g.abs().topk(k, dim=0).indices))
        dx_c, dw_c = _linear_grads(cols, x, w)
    dx_d, dw_d = _linear_grads(g, x, w)
    if not _matches(got["dx"], dx, tol) and _matches(got["dx"], dx_d, tol) and _matches(got["dW"], dw_d, tol):
        raise AssertionError(f"{where}: dx and dW are the dense backward's (g W and gᵀ x, nothing dropped). "
                             f"{DENSE_HINT}")
    _grad_check(got["dx"], dx, "dx", where, MAGNITUDE_HINT,
                {MAGNITUDE_HINT: dx_s, ROW_HINT: dx_c, BOTH_HINT: dx_d}, tol)
    _grad_check(got["dW"], dw, "dW", where, MAGNITUDE_HINT,
                {MAGNITUDE_HINT: dw_s, ROW_HINT: dw_c, BOTH_HINT: dw_d}, tol)
    _grad_check(got["db"], g.double().sum(0), "db", where, BIAS_HINT, {}, tol)


@hidden_test("test_meprop_linear_values")
def check_values(nb):
    cases = [(37, 29, 53, 8, 1), (37, 29, 53, 1, 2), (37, 29, 53, 52, 3), (37, 29, 53, 20, 4), (6, 40, 9, 4, 5),
             (6, 40, 9, 1, 6)]
    for B, n_in, n_out, k, seed in cases:
        x, w, b = _inputs(B, n_in, n_out, seed)
        _check_per_example(nb, x, w, b, _per_example_grad(B, n_out, seed + 100), k)
    for B, n_in, n_out, k in _drawn_per_example_cases():
        x, w, b = _inputs(B, n_in, n_out, new_seed())
        g = _per_example_grad(B, n_out, new_seed())
        while not _distinct_at_k(g, k):  # a tie at the k-th magnitude (rare): other values
            g = _per_example_grad(B, n_out, new_seed())
        _check_per_example(nb, x, w, b, g, k, DRAWN_TOL)


# --- meprop_linear: unified ------------------------------------------------------------------------
def _unified_index(g: torch.Tensor, k: int) -> torch.Tensor:
    return g.double().abs().sum(0).topk(k).indices


def _check_unified_grads(got: dict, x, w, b, g, k, where: str) -> torch.Tensor:
    index = _unified_index(g, k)
    dW = got["dW"]
    if dW is None:
        raise AssertionError(f"{where}: no gradient reached dW. Return it from backward")
    if not isinstance(dW, torch.Tensor) or dW.shape != w.shape:
        raise AssertionError(f"{where}: dW has shape {getattr(dW, 'shape', None)}, expected {tuple(w.shape)}: dW is "
                             "the full (n_out, n_in) gradient, zero outside rows I")
    nonzero = (dW != 0).any(dim=1).nonzero().flatten()
    if nonzero.numel() > k:
        raise AssertionError(f"{where}: {nonzero.numel()} rows of dW are non-zero, at most k={k} may be. "
                             f"{ONE_SET_HINT}")
    wanted = set(index.tolist())
    if not set(nonzero.tolist()) <= wanted:
        raise AssertionError(f"{where}: dW has non-zero rows {sorted(set(nonzero.tolist()) - wanted)} outside the "
                             f"index set I = {sorted(wanted)}. {INDEX_HINT}")
    g64 = g.double()
    rows = torch.zeros_like(w, dtype=torch.float64).index_copy(0, index, g64[:, index].t() @ x.double())
    _grad_check(dW, rows, "dW", where, ZERO_ROWS_HINT, {})
    _grad_check(got["dx"], g64[:, index] @ w.double()[index], "dx", where, INDEX_HINT,
                {BOTH_HINT: g64 @ w.double()})
    if b is not None:
        _grad_check(got["db"], g64.sum(0), "db", where, BIAS_HINT, {})
    return index


@hidden_test("test_meprop_linear_unified")
def check_unified(nb):
    wide = [draw(*r) for r in VALUE_WIDE]  # one wide layer drawn now, as for the per-example values
    for B, n_in, n_out, k, seed in [(37, 29, 53, 8, 11), (37, 29, 53, 1, 12), (37, 29, 53, 20, 13),
                                    (37, 29, 53, 52, 14), (6, 40, 9, 3, 15),
                                    (*wide, draw(1, wide[2] - 1), new_seed())]:
        x, w, b = _inputs(B, n_in, n_out, seed)
        g = _unified_grad(B, n_out, seed + 100)
        where = _where(B, n_in, n_out, k, True)
        got = _run(nb, x, w, b, g, k, True)
        _check_call(got, x, w, b, where)
        _check_unified_grads(got, x, w, b, g, k, where)


# --- meprop_linear: compacted products ---------------------------------------------------------------
CPU_SIZES = (1792, 2304, 128)  # B, n_in and n_out of the timed case, each drawn from this range (multiples of 128)
CPU_K = (4, 32)  # its k: n_out / k >= 56, so the compacted products cost at most 1/56 of the dense ones
CPU_SHARE = 3  # the unified backward may use at most 1/CPU_SHARE of the dense backward's CPU time
CPU_HINT = ("compute dx = g[:, I] @ W[I, :] and dW[I, :] = g[:, I]ᵀ x from the compacted (B, k) matrix g[:, I] and "
            "the k gathered rows of W (index_select), and write the k rows of dW into a zero matrix (index_copy): a "
            "product of all n_out columns costs n_out / k times more, zeroed or masked (torch.where) columns included")


def _cpu_case():
    """The timed case, drawn now: sizes, k, seeds, and the index set I the output gradient favours."""
    B, n_in, n_out = (draw(*CPU_SIZES) for _ in range(3))
    k = draw(*CPU_K)
    seeds = {name: new_seed() for name in ("x", "w", "b", "g")}
    pick = torch.Generator().manual_seed(new_seed())
    index = torch.randperm(n_out, generator=pick)[:k]
    # Columns of I scaled by 3 to 4 (distinct): their sums of |g| stand far above every other column's.
    scale = torch.ones(n_out)
    scale[index] = 3.0 + torch.arange(k, dtype=torch.float32) / k
    outside = torch.ones(n_out, dtype=torch.bool)
    outside[index] = False
    rows = {"x": torch.randperm(B, generator=pick)[:16],
            "w": torch.cat([index, outside.nonzero().flatten()[torch.randperm(n_out - k, generator=pick)[:32]]])}
    return B, n_in, n_out, k, seeds, scale, index, rows


def _check_cpu(nb, meter: Meter) -> None:
    """The unified backward's CPU time, read from outside the student's process, against the course's own dense
    backward on the same inputs; its values checked on the same call."""
    B, n_in, n_out, k, seeds, scale, index, rows = _cpu_case()
    x = meter.tensor((B, n_in), requires_grad=False, seed=seeds["x"]).tensor
    w = meter.tensor((n_out, n_in), requires_grad=False, seed=seeds["w"]).tensor
    b = meter.tensor((n_out,), requires_grad=False, seed=seeds["b"]).tensor
    g = meter.tensor((B, n_out), requires_grad=False, seed=seeds["g"]).tensor.mul(meter.put(scale))
    x_rows, w_rows = meter.put(rows["x"]), meter.put(rows["w"])
    # The judge's reference, float64 on the same seeded values.
    g64 = (seeded((B, n_out), seed=seeds["g"]) * scale).double()
    w64, x64 = seeded((n_out, n_in), seed=seeds["w"]).double(), seeded((B, n_in), seed=seeds["x"]).double()
    ref_dx = g64[rows["x"]][:, index] @ w64[index]
    ref_dw = torch.zeros(len(rows["w"]), n_in, dtype=torch.float64)
    ref_dw[:k] = g64[:, index].t() @ x64
    ref_db = g64.sum(0)
    del g64, w64, x64
    where = (f"meprop_linear(x, W, b, k={k}, unified=True) on x ({B}, {n_in}), W ({n_out}, {n_in}), all requiring grad")

    def student() -> float:
        """One forward (a dense product, not timed) and one timed backward, its values checked."""
        leaves = [t.detach().requires_grad_() for t in (x, w, b)]
        y = nb.meprop_linear(*leaves, k, unified=True)
        cpu, got = meter.cpu_by(lambda: nb.apply(probes.ch06_backward_rows, y, g, *leaves, x_rows, w_rows))
        if got["type"] != "Tensor" or not got["attached"]:
            raise AssertionError(f"{where}: returned {got['type']}{'' if got['attached'] else ' without grad_fn'}")
        if got["error"]:
            raise AssertionError(f"{where}: backward raised {got['error']['types'][0]}: {got['error']['message']}")
        for name in ("dx", "dW", "db"):
            if got[name] is None:
                raise AssertionError(f"{where}: no gradient reached {name}. Return it from backward")
        check_close(got["dx"], ref_dx.float(), f"dx (rows {rows['x'][:4].tolist()}, ...) for {where}", INDEX_HINT,
                    **TOL)
        check_close(got["dW"][:k], ref_dw[:k].float(), f"dW[I] for {where}", INDEX_HINT, atol=1e-3, rtol=1e-4)
        if not same_values(got["dW"][k:], ref_dw[k:].float()):
            raise AssertionError(f"{where}: rows of dW outside I are not all exactly 0. {ZERO_ROWS_HINT}")
        check_close(got["db"], ref_db.float(), f"db for {where}", BIAS_HINT, atol=1e-3, rtol=1e-4)
        return cpu

    # The baseline first, on inputs no code of the student's has seen: the course's dense products. A backward over
    # the limit gets a second try against a second baseline: the least of each counts.
    dense = [meter.cpu_by(lambda: nb.apply(probes.ch06_dense_backward, x, w, g))[0]]
    times = [student()]
    if times[0] * CPU_SHARE > dense[0]:
        dense.append(meter.cpu_by(lambda: nb.apply(probes.ch06_dense_backward, x, w, g))[0])
        times.append(student())
    dense = min(dense)
    if min(times) * CPU_SHARE > dense:
        share = 2 * (2 * B * k * n_in) / (2 * (2 * B * n_out * n_in))
        raise AssertionError(
            f"{where}: your backward used {min(times):.3f} s of CPU time (the better of two calls, read from outside "
            f"your process), while the dense backward's two products (g W and gᵀ x) on the same inputs take "
            f"{dense:.3f} s; the two compacted products cost {share:.1%} of those FLOPs, and the unified backward "
            f"may use at most 1/{CPU_SHARE} of the dense time. Such a backward multiplies all {n_out} columns of g, "
            f"zeroed or masked ones included. {CPU_HINT}")


# --- meprop_linear: what the forward keeps ------------------------------------------------------------
SAVED_ROWS = (4096, 6144)  # B of the measured forward, drawn: x is 16 to 24 MiB
SAVED_IN, SAVED_OUT = 1024, 512  # W is 2 MiB: a copy of it shows too
SAVED_SLACK = MiB  # what the measured call may keep beyond x, W and the row sums it returns
SAVED_MODES = (("x and W requiring grad", True, True), ("W frozen", True, False), ("x not requiring grad", False, True))
SAVED_HINT = ("the forward pass is a dense Linear's: it keeps for backward x and W themselves (ctx.save_for_backward"
              "(x, weight)), never a copy, another dtype or a transposed contiguous x, whichever of them requires "
              "grad; meProp saves compute in backward, not memory")


def _saved_call(x, w, weights, k, unified, fn):
    """The measured call: the layer's output (no bias) with its rows summed with per-column weights."""
    return fn(x, w, None, k, unified=unified).mul(weights).sum(1)


def _check_saved(nb, meter: Meter) -> None:
    """What the process holds between forward and backward, read from outside it, on a layer drawn now, in each
    mode of requires_grad: at most what a dense Linear keeps (x and W, held by the judge meanwhile); the output of
    that very call, and x and W after it, checked against the judge's own."""
    B, k, unified = draw(*SAVED_ROWS), draw(1, SAVED_OUT - 1), bool(draw(0, 1))
    seeds = [new_seed() for _ in range(3)]
    weights = seeded((SAVED_OUT,), seed=seeds[2])
    # First call: lazily loaded code and caches, on the measured call's own path.
    first = _saved_call(fresh_tensor(nb, (5, 7)), fresh_tensor(nb, (4, 7)), nb.put(torch.ones(4)), 2, unified,
                        nb.meprop_linear)
    first.sum().backward()
    del first
    x64, w64 = seeded((B, SAVED_IN), seed=seeds[0]).double(), seeded((SAVED_OUT, SAVED_IN), seed=seeds[1]).double()
    ref = (x64 @ w64.t()) @ weights.double()
    x_rows, w_rows = x64.sum(1), w64.sum(1)
    del x64, w64
    x_bytes, w_bytes = 4 * B * SAVED_IN, 4 * SAVED_OUT * SAVED_IN
    for mode, x_grad, w_grad in SAVED_MODES:
        # x and W stay held by the judge through the call, as a network's activations and weights are held by
        # others: what the forward keeps beyond them (a copy, another dtype) is what the reading sees.
        x = meter.tensor((B, SAVED_IN), seed=seeds[0], requires_grad=x_grad).tensor
        w = meter.tensor((SAVED_OUT, SAVED_IN), seed=seeds[1], requires_grad=w_grad).tensor
        held, rows = meter.held_by(lambda wts: _saved_call(x, w, wts, k, unified, nb.meprop_linear),
                                   inputs=lambda: [meter.put(weights)])
        where = (f"meprop_linear(x, W, None, k={k}, unified={unified}) on x ({B}, {SAVED_IN}) and W ({SAVED_OUT}, "
                 f"{SAVED_IN}), {mode}, sizes drawn at grading time")
        if held.kept > 4 * B + SAVED_SLACK:
            del rows
            raise AssertionError(
                f"{where}: between forward and backward, with x and W held by the grader and the output released, "
                f"your process held {mib(held.kept)} more than before (read from outside your process), while x is "
                f"{mib(x_bytes)} and W {mib(w_bytes)}. {SAVED_HINT}")
        got = fetch(rows)
        check_close(None if got is None else got.double(), ref, f"the output of {where}, each row summed with "
                    "weights drawn at grading time", FORWARD_HINT, atol=1e-3, rtol=1e-4)
        for name, t, want in (("x", x, x_rows), ("W", w, w_rows)):
            after = fetch(t.detach().double().sum(1))
            if after is None or not same_close(after, want, atol=1e-6, rtol=1e-9):
                raise AssertionError(f"{where}: after the call, {name} no longer held the caller's values. "
                                     f"{INPUTS_HINT}")
        del x, w, rows


class _FlopsNote:
    """The FLOPs a backward ran (counted inside the student's process) beside the compacted products', formatted
    only when a failure's message shows it."""

    def __init__(self, counted, compact: int):
        self.counted, self.compact = counted, compact

    def __format__(self, spec: str) -> str:
        return f"(your backward ran {self.counted:,} FLOPs; the two compacted products cost {self.compact:,})"


@hidden_test("test_meprop_linear_compute", requires=("test_meprop_linear_unified",))
def check_compute(nb):
    meter = Meter(nb)  # first: CPU times below are read from outside the student's process
    B, n_in, n_out = 37, 29, 53
    for k, seed in ((8, 21), (20, 22)):
        x, w, b = _inputs(B, n_in, n_out, seed)
        g = _unified_grad(B, n_out, seed + 100)
        index = _unified_index(g, k)
        outside = torch.ones(n_out, dtype=torch.bool)
        outside[index] = False
        w_poisoned = w.clone()
        w_poisoned[outside] = float("nan")  # rows a compacted backward never reads
        x_poisoned = x.clone()
        x_poisoned[3, 5] = float("inf")  # reaches dW only through g[3, j] · x[3, 5]
        where = (f"meprop_linear(x, W, b, k={k}, unified=True) on x ({B}, {n_in}) with x[3, 5] = inf and W ({n_out}, "
                 f"{n_in}) whose rows outside I are NaN")
        got = _run(nb, x_poisoned, w_poisoned, b, g, k, True)
        if got["type"] != "Tensor" or not got["attached"]:
            raise AssertionError(f"{where}: returned {got['type']}{'' if got['attached'] else ' without grad_fn'}")
        if got.get("error"):
            raise AssertionError(f"{where}: backward raised {got['error']['types'][0]}: {got['error']['message']}")
        compact = 2 * (2 * B * k * n_in)
        # FLOPs counted inside the process: named in a failure's message, never a reason for it.
        flops = _FlopsNote(got.get("backward_flops"), compact)
        dx, dW = got["dx"], got["dW"]
        if not isinstance(dx, torch.Tensor) or not isinstance(dW, torch.Tensor):
            raise AssertionError(f"{where}: dx or dW is missing")
        if torch.isnan(dx).any():
            raise AssertionError(
                f"{where}: dx contains NaN, so your backward multiplied rows of W outside I (0 · NaN = NaN): it "
                f"computed a dense product with zeroed columns of g {flops}. Compute dx = g[:, I] @ W[I, :] from "
                "the compacted (B, k) matrix g[:, I] and the k gathered rows of W")
        if torch.isnan(dW[outside]).any() or (dW[outside] != 0).any():
            raise AssertionError(
                f"{where}: rows of dW outside I are not exactly 0 (NaN: 0 · inf), so your backward computed all "
                f"n_out rows of gᵀ x with zeroed columns of g {flops}. Compute the k rows g[:, I]ᵀ x and write them "
                "into rows I of a zero matrix (index_copy)")
        g64 = g.double()
        ref_dx = g64[:, index] @ w.double()[index]
        check_close(dx, ref_dx.float(), f"dx for {where}", INDEX_HINT, **TOL)
        ref_rows = g64[:, index].t() @ x_poisoned.double()  # column 5: ±inf
        got_rows = dW[index].double()
        finite = torch.ones(n_in, dtype=torch.bool)
        finite[5] = False
        check_close(got_rows[:, finite].float(), ref_rows[:, finite].float(), f"dW[I] for {where}", INDEX_HINT, **TOL)
        if not same_values(got_rows[:, 5], ref_rows[:, 5]):
            raise AssertionError(f"{where}: column 5 of dW[I] should be ±inf (g[3, I] · inf), got "
                                 f"{got_rows[:, 5].tolist()}")
        check_close(got["db"], g64.sum(0).float(), f"db for {where}", BIAS_HINT, **TOL)
    _check_saved(nb, meter)
    _check_cpu(nb, meter)  # after the small cases above: they warmed up the student's code


# --- meprop_linear: edge cases -----------------------------------------------------------------------
def _kept(g: torch.Tensor, k: int, unified: bool) -> torch.Tensor:
    """The output gradient meProp back-propagates: g itself when k <= 0 or k >= n_out, else its kept entries."""
    if not 0 < k < g.shape[1]:
        return g
    if unified:
        index = _unified_index(g, k)
        return torch.zeros_like(g).index_copy(1, index, g[:, index])
    return _top_rows(g, k)


def _freed_run(nb, B, n_in, n_out, k, unified, seed, frozen_weight: bool):
    """One call whose input that needs no gradient (x, or a frozen weight) has the other operand's storage freed
    between forward and backward (W, or x: what only the unneeded gradient reads); fails if backward read it."""
    x, w, b = _inputs(B, n_in, n_out, seed)
    g = _unified_grad(B, n_out, seed + 100) if unified else _per_example_grad(B, n_out, seed + 100)
    if frozen_weight:
        where, freed, hint = _where(B, n_in, n_out, k, unified) + ", W not requiring grad", "x", NO_DW_HINT
        got = _run(nb, x, w, b, g, k, unified, w_requires_grad=False, free_input=True)
    else:
        where, freed, hint = _where(B, n_in, n_out, k, unified) + ", x not requiring grad", "W", NO_DX_HINT
        got = _run(nb, x, w, b, g, k, unified, x_requires_grad=False, free_weight=True)
    if got["type"] != "Tensor" or not got["attached"]:
        raise AssertionError(f"{where}: returned {got['type']}{'' if got['attached'] else ' without grad_fn'}")
    if got.get("error"):
        raise AssertionError(f"{where}: backward read {freed} ({got['error']['types'][0]}: "
                             f"{got['error']['message'][:120]}). {hint}")
    return got, x, w, g, where


@hidden_test("test_meprop_linear_edge_cases", requires=("test_meprop_linear_unified",))
def check_edge_cases(nb):
    B, n_in, n_out = 37, 29, 53
    for i, (k, unified) in enumerate([(0, False), (-3, True), (n_out, False), (n_out + 7, True), (0, True),
                                      (n_out, True)]):
        x, w, b = _inputs(B, n_in, n_out, 30 + i)
        g = _per_example_grad(B, n_out, 130 + i)
        where = _where(B, n_in, n_out, k, unified)
        got = _run(nb, x, w, b, g, k, unified)
        _check_call(got, x, w, b, where)
        dx, dw = _linear_grads(g, x, w)
        _grad_check(got["dx"], dx, "dx", where, DENSE_K_HINT, {})
        _grad_check(got["dW"], dw, "dW", where, DENSE_K_HINT, {})
        _grad_check(got["db"], g.double().sum(0), "db", where, DENSE_K_HINT, {})
    # x without grad: W is freed after the forward pass, so a backward that computes dx raises.
    for i, (k, unified) in enumerate([(8, False), (8, True), (0, False), (0, True)]):
        got, x, w, g, where = _freed_run(nb, B, n_in, n_out, k, unified, 40 + i, frozen_weight=False)
        _grad_check(got["dW"], _kept(g, k, unified).double().t() @ x.double(), "dW", where, NO_DX_HINT, {})
        _grad_check(got["db"], g.double().sum(0), "db", where, BIAS_HINT, {})
    # A frozen weight: x is freed after the forward pass, so a backward that computes dW raises.
    for i, (k, unified) in enumerate([(8, False), (8, True), (0, False), (n_out, True)]):
        got, x, w, g, where = _freed_run(nb, B, n_in, n_out, k, unified, 44 + i, frozen_weight=True)
        _grad_check(got["dx"], _kept(g, k, unified).double() @ w.double(), "dx", where,
                    "a frozen weight changes nothing for dx: still the sparsified g times W", {})
        _grad_check(got["db"], g.double().sum(0), "db", where, BIAS_HINT, {})
    # No bias.
    for unified in (False, True):
        x, w, _ = _inputs(6, 40, 9, 50 + unified, bias=False)
        g = _unified_grad(6, 9, 150) if unified else _per_example_grad(6, 9, 150)
        where = _where(6, 40, 9, 3, unified, bias=False)
        got = _run(nb, x, w, None, g, 3, unified)
        _check_call(got, x, w, None, where)
        if unified:
            _check_unified_grads(got, x, w, None, g, 3, where)
        else:
            dx, dw = _linear_grads(_top_rows(g, 3), x, w)
            _grad_check(got["dx"], dx, "dx", where, MAGNITUDE_HINT, {})
            _grad_check(got["dW"], dw, "dW", where, MAGNITUDE_HINT, {})
    # Errors.
    w = torch.randn(9, 5, generator=_gen(60))
    for bad in (torch.randn(2, 6, 5, generator=_gen(61)), torch.randn(5, generator=_gen(62))):
        names = fetch(nb.apply(probes.raised, nb.meprop_linear, bad, w, None, 3))
        if names is None or "ValueError" not in names:
            got = "returned" if names is None else f"raised {names[0]}"
            raise AssertionError(f"meprop_linear on an x of shape {tuple(bad.shape)} {got}: x must be 2-D "
                                 "(batch, features), anything else raises ValueError")


# --- apply_meprop ------------------------------------------------------------------------------------
def _models() -> list[tuple[str, nn.Module, int, bool | None]]:
    """(description, model, k, unified or None for the default); built fresh on every call."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        nested = nn.Sequential(
            nn.Sequential(nn.Linear(12, 20, bias=False), nn.ReLU(), nn.Dropout(0.1)),
            nn.Sequential(NonDynamicallyQuantizableLinear(20, 16), nn.Tanh()),  # a subclass of nn.Linear
            nn.Linear(16, 6))
        listed = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8, bias=False), nn.Linear(8, 4)])
        keyed = nn.ModuleDict(OrderedDict(enc=nn.Linear(6, 12), act=nn.ReLU(), head=nn.Linear(12, 3)))
        single = nn.Sequential(nn.Linear(5, 3))
        bare = nn.Linear(5, 3)
        gpt = TinyGPT(GPTConfig())
    return [("mlp([20, 32, 24, 10])", mlp([20, 32, 24, 10], seed=1), 5, None),
            ("mlp([20, 32, 24, 10])", mlp([20, 32, 24, 10], seed=1), 7, True),
            ("a nested nn.Sequential (Linear without bias, a Linear subclass, Dropout, Tanh)", nested, 3, True),
            ("an nn.ModuleList of three Linears", listed, 2, False),
            ("an nn.ModuleDict {enc, act, head}", keyed, 4, False),
            ("an nn.Sequential holding one Linear", single, 2, True),
            ("a bare nn.Linear", bare, 2, False),
            ("TinyGPT (Linears as attributes of nested modules)", gpt, 4, True)]


@hidden_test("test_apply_meprop")
def check_apply_meprop(nb):
    for what, model, k, unified in _models():
        before = {name: type(m).__name__ for name, m in model.named_modules()}
        linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
        hidden, output = linears[:-1], linears[-1]
        params = [n for n, _ in model.named_parameters()]
        original = {n: (q.detach().clone(), q.requires_grad) for n, q in model.named_parameters()}
        settings = {name: (m.training, type(m).extra_repr(m)) for name, m in model.named_modules()}
        call = f"apply_meprop(model, {k}{'' if unified is None else f', unified={unified}'}) on {what}"
        got = fetch(nb.apply(probes.ch06_replace_describe, nb.apply_meprop, model, k, unified))
        if got["returned"] != "the same model":
            raise AssertionError(f"{call} returned {got['returned']}: apply_meprop modifies the model in place "
                                 "and returns it")
        found = {m["name"]: m for m in got["modules"]}
        out = found.get(output)
        if out is None or out["original"] != output:
            cls = "nothing" if out is None else out["class"]
            raise AssertionError(f"{call}: the output layer {output!r} (the last Linear) is now {cls}; it stays "
                                 "exactly the same nn.Linear object, with its dense backward")
        for name in hidden:
            m = found.get(name)
            if m is None or m["class"] != "MePropLinear":
                raise AssertionError(
                    f"{call}: the hidden Linear {name!r} is {'gone' if m is None else m['class']}, expected a "
                    "MePropLinear at the same place. Walk every module, nested ones included "
                    "(model.named_modules()), and replace each Linear but the last in its parent "
                    "(model.set_submodule(name, MePropLinear(layer, k, unified)), with the dotted name "
                    "named_modules() gave)")
            bias = f"{name}.bias" if f"{name}.bias" in params else None
            if (m["weight"], m["bias"]) != (f"{name}.weight", bias):
                raise AssertionError(f"{call}: the MePropLinear at {name!r} holds weight {m['weight']} and bias "
                                     f"{m['bias']}, expected the original Parameters {name}.weight and {bias}: build "
                                     "it from the Linear itself, MePropLinear(layer, k, unified), no copies")
            expected = (k, bool(unified))
            if (m["k"], m["unified"]) != expected:
                raise AssertionError(f"{call}: the MePropLinear at {name!r} has k={m['k']!r}, unified="
                                     f"{m['unified']!r}; expected k={k}, unified={bool(unified)} (the default is "
                                     "unified=False)")
        others = {n: c for n, c in before.items() if n not in hidden}
        changed = {n: (c, found[n]["class"] if n in found else "gone") for n, c in others.items()
                   if n not in found or found[n]["class"] != c or found[n]["original"] != n}
        extra = sorted(set(found) - set(before))
        if changed or extra:
            raise AssertionError(f"{call}: modules other than the hidden Linears changed: {changed or extra}. "
                                 "Replace the hidden Linears only, at their place, and nothing else")
        if got["params"] != [[n, n] for n in params]:
            raise AssertionError(f"{call}: the parameters (name after, name before) are {got['params']}; the same "
                                 f"Parameters under the same names, in the same order, were expected: {params}")
        # Nothing else changes: values, requires_grad, training mode and settings of every module.
        for n in params:
            if not same_values(got["values"][n], original[n][0]):
                raise AssertionError(f"{call}: the values of {n} changed; apply_meprop replaces modules and changes "
                                     "nothing else (no parameter is modified)")
            if got["requires_grad"][n] != original[n][1]:
                raise AssertionError(f"{call}: {n}.requires_grad is now {got['requires_grad'][n]}; apply_meprop "
                                     "changes nothing else (which parameters train is not its business)")
        for name, m in found.items():
            was = settings.get(name)
            if was is None:
                continue
            now = (m["training"], m["settings"] if name not in hidden else was[1])
            if now != was:
                raise AssertionError(f"{call}: module {name or 'model'!r} changed its {'training mode' if now[0] != was[0] else 'settings'} "
                                     f"({was[1] if now[0] == was[0] else was[0]!r} before, "
                                     f"{now[1] if now[0] == was[0] else now[0]!r} after); apply_meprop changes nothing "
                                     "but the hidden Linears")
    names = fetch(nb.apply(probes.raised, nb.apply_meprop, nn.Sequential(nn.ReLU(), nn.Tanh()), 3))
    if names is None or "ValueError" not in names:
        got = "returned" if names is None else f"raised {names[0]}"
        raise AssertionError(f"apply_meprop on a model without nn.Linear {got}: it raises ValueError")


@hidden_test("test_apply_meprop_output_layer")
def check_apply_meprop_output_layer(nb):
    cases = [(mlp([20, 32, 24, 10], seed=2), 2, False), (mlp([20, 32, 24, 10], seed=2), 2, True),
             (_models()[2][1], 1, False)]
    for i, (model, k, unified) in enumerate(cases):
        last = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
        gen = _gen(70 + i)
        h = torch.randn(7, last.in_features, generator=gen)
        g = _per_example_grad(7, last.out_features, 80 + i)
        call = f"apply_meprop(model, {k}, unified={unified}) on {'a nested nn.Sequential' if i == 2 else 'an MLP'}"
        got = fetch(nb.apply(probes.ch06_output_layer_run, nb.apply_meprop, model, k, unified, h, g))
        if not got["found"]:
            raise AssertionError(f"{call}: {got['returned']}; the output layer (the last Linear) must stay in the "
                                 "model, unchanged")
        w, b = last.weight.detach().double(), last.bias.detach().double()
        hint = (f"the output layer is now a {got['class']} whose backward is not a dense Linear's: leave the last "
                "Linear as it is (the authors keep the output layer dense)")
        check_close(got["y"], (h.double() @ w.t() + b).float(), f"the output layer's output after {call}", hint, **TOL)
        for name, ref in (("dh", g.double() @ w), ("dW", g.double().t() @ h.double()), ("db", g.double().sum(0))):
            if got[name] is None:
                raise AssertionError(f"{call}: no gradient reached the output layer's {name}. {hint}")
            check_close(got[name], ref.float(), f"the output layer's {name} after {call}", hint, **TOL)
