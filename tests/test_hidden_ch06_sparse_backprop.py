"""Hidden tests of chapter 6 (meProp): independent correct implementations pass, plausible wrong ones fail.

In-kernel through LocalNamespace; the reference and one wrong submission per exercise also through
the sandbox (``grader.sandbox.judge.run_checks``), as the autograder does.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from grader.api import LocalNamespace, checks_for
from grader.sandbox import judge
from contract_tables import Clause, contract_tests
from sandbox_checks import LIMITS, program, sandbox_tests
from wrong_submissions_ch06_sparse_backprop import COMPUTE_WRONG, WRONG

CHAPTER = "ch06_sparse_backprop"
CHECKS = checks_for(CHAPTER)
LINEAR_IDS = ("test_meprop_linear_values", "test_meprop_linear_unified", "test_meprop_linear_compute",
              "test_meprop_linear_edge_cases")
APPLY_IDS = ("test_apply_meprop", "test_apply_meprop_output_layer")


# --- meprop_linear: a family, correct with the defaults ------------------------------------------------
def make_meprop(signed=False, over_batch=False, index="abs_sum", sparse_db=False, sparse_dx=True, sparse_dw=True,
                scatter=False, dense_dw=False, always_dx=False, dense_edges=True, check_dim=True, only_at=None,
                only_unified=False, always_dw=False, save_copy=False, swap_data=False, private_copies=False):
    """``only_at``: the (B, n_in, n_out) at which the ``only_unified`` variant sparsifies; a dense backward on
    every other shape (the shapes an exercise text once published)."""
    def meprop_linear(x, weight, bias, k, unified=False):
        if check_dim and x.dim() != 2:
            raise ValueError("x must be 2-D")

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w, b):
                ctx.save_for_backward(x.clone() if save_copy else x, w)
                if private_copies:  # backward reads these, not what freeing the inputs' storage would break
                    ctx.copies = (x.detach().clone() if not w.requires_grad else None, w.detach().clone())
                y = F.linear(x, w, b)
                if swap_data:  # the caller's tensors get fresh storage: freeing it frees nothing backward reads
                    x.data, w.data = x.detach().clone(), w.detach().clone()
                return y

            @staticmethod
            def backward(ctx, g):
                x, w = ctx.saved_tensors
                if private_copies:
                    x = x if ctx.copies[0] is None else ctx.copies[0]
                    w = ctx.copies[1]
                need_x = ctx.needs_input_grad[0] or always_dx or private_copies
                need_w_always = private_copies
                need_w = ctx.needs_input_grad[1] or always_dw or need_w_always
                dense = dense_edges and (k <= 0 or k >= g.shape[1])
                if only_at is not None and unified == only_unified:
                    dense = dense or (g.shape[0], x.shape[1], g.shape[1]) not in only_at
                dx = dw = db = None
                if dense or not unified:
                    if dense:
                        gs = g
                    else:
                        dim = 0 if over_batch else 1
                        top = (g if signed else g.abs()).topk(k, dim=dim).indices
                        gs = torch.zeros_like(g).scatter(dim, top, g.gather(dim, top))
                    if need_x:
                        dx = (gs if sparse_dx else g) @ w
                    if need_w:
                        dw = (gs if sparse_dw else g).t() @ x
                    g_bias = gs
                else:
                    score = {"abs_sum": g.abs().sum(0), "signed_sum": g.sum(0), "max": g.abs().amax(0)}[index]
                    idx = score.topk(k).indices
                    g_k = g[:, idx]
                    g_zero = torch.zeros_like(g).index_copy(1, idx, g_k)
                    if need_x:
                        dx = g_zero @ w if scatter else g_k @ w[idx]
                    if not need_w:
                        pass
                    elif scatter or dense_dw:
                        dw = g_zero.t() @ x
                    else:
                        dw = torch.zeros_like(w).index_copy(0, idx, g_k.t() @ x)
                    g_bias = g_zero
                if ctx.needs_input_grad[2]:
                    db = (g_bias if sparse_db else g).sum(0)
                return dx, dw, db

        return Fn.apply(x, weight, bias)

    return meprop_linear


def meprop_linear_other(x, weight, bias, k, unified=False):
    """Also correct, written differently: per example through a gradient hook on the bias-free product
    (autograd's own matmul backward does the rest), unified through a Function that ranks with argsort
    and accumulates the kept rows with index_add_."""
    if x.ndim != 2:
        raise ValueError(f"expected (batch, features), got {tuple(x.shape)}")
    n_out = weight.shape[0]
    if not 0 < k < n_out or not unified:
        z = x.matmul(weight.T)
        if 0 < k < n_out and z.requires_grad:
            def sparsify(grad):
                keep = grad.abs().argsort(dim=1, descending=True)[:, :k]
                return torch.where(torch.zeros_like(grad, dtype=torch.bool).scatter_(1, keep, True), grad, 0.0)

            z.register_hook(sparsify)
        return z if bias is None else z + bias

    class Unified(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp, w, b):
            ctx.save_for_backward(inp, w)
            out = inp.matmul(w.T)
            return out if b is None else out + b

        @staticmethod
        def backward(ctx, grad):
            inp, w = ctx.saved_tensors
            sel = grad.abs().sum(dim=0).argsort(descending=True)[:k]
            kept = grad[:, sel]
            d_inp = kept.matmul(w[sel]) if ctx.needs_input_grad[0] else None
            d_w = None
            if ctx.needs_input_grad[1]:
                d_w = grad.new_zeros(w.shape)
                d_w.index_add_(0, sel, kept.T.matmul(inp))
            d_b = grad.sum(dim=0) if ctx.needs_input_grad[2] else None
            return d_inp, d_w, d_b

    return Unified.apply(x, weight, bias)


def make_masked(dense_dx=True, dense_dw=True):
    """Right values, poison-proof: the products run over all n_out columns with the kept ones selected by masks
    (torch.where), which also scrub the NaN rows of W and the 0 · inf of dW. Only CPU time tells them apart."""
    def meprop_linear(x, weight, bias, k, unified=False):
        if x.dim() != 2:
            raise ValueError("x must be 2-D")

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w, b):
                ctx.save_for_backward(x, w)
                return F.linear(x, w, b)

            @staticmethod
            def backward(ctx, g):
                x, w = ctx.saved_tensors
                n_out = g.shape[1]
                if 0 < k < n_out:
                    if unified:
                        rows = torch.zeros(n_out, dtype=torch.bool)
                        rows[g.abs().sum(0).topk(k).indices] = True
                        keep = rows.expand_as(g)
                    else:
                        keep = torch.zeros_like(g, dtype=torch.bool).scatter_(1, g.abs().topk(k, dim=1).indices, True)
                        rows = keep.any(0)
                else:
                    keep = torch.ones_like(g, dtype=torch.bool)
                    rows = keep.any(0)
                gs = torch.where(keep, g, torch.zeros_like(g))
                idx = rows.nonzero().flatten()
                dx = dw = db = None
                if ctx.needs_input_grad[0]:
                    dx = (gs @ torch.where(rows[:, None], w, torch.zeros_like(w)) if dense_dx or not unified
                          else g.index_select(1, idx) @ w.index_select(0, idx))
                if ctx.needs_input_grad[1]:
                    dw = (torch.where(rows[:, None], gs.t() @ x, torch.zeros_like(w)) if dense_dw or not unified
                          else torch.zeros_like(w).index_copy(0, idx, g.index_select(1, idx).t() @ x))
                if ctx.needs_input_grad[2]:
                    db = g.sum(0)
                return dx, dw, db

        return Fn.apply(x, weight, bias)

    return meprop_linear


# --- apply_meprop ------------------------------------------------------------------------------------
BACKWARD = {"meprop_linear": meprop_linear_other}  # what MePropLinear calls (a test swaps in a blank stub)


class MePropLinear(nn.Module):
    """The setup cell's wrapper, calling ``BACKWARD["meprop_linear"]``."""

    def __init__(self, linear, k, unified=False):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.k, self.unified = k, unified

    def forward(self, x):
        return BACKWARD["meprop_linear"](x, self.weight, self.bias, self.k, unified=self.unified)


def make_apply(include_output=False, top_level=False, copies=False, returns=True, drop_unified=False,
               skip_no_bias=False, exact_type=False, patch_output=False, tamper=None):
    """``patch_output``: the output layer stays the same nn.Linear object in its place, but its forward is
    rerouted through meprop_linear (sparse backward where the authors keep it dense)."""
    def apply_meprop(model, k, unified=False):
        if top_level:
            found = [(model, n, m) for n, m in model.named_children() if isinstance(m, nn.Linear)]
        else:
            found = []
            for name, m in model.named_modules():
                if (type(m) is nn.Linear if exact_type else isinstance(m, nn.Linear)) and name:
                    parent, _, child = name.rpartition(".")
                    found.append((model.get_submodule(parent), child, m))
        if not found and not isinstance(model, nn.Linear):
            raise ValueError("no Linear")
        for parent, name, layer in (found if include_output else found[:-1]):
            if skip_no_bias and layer.bias is None:
                continue
            if copies:
                clone = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
                clone.load_state_dict(layer.state_dict())
                layer = clone
            parent.register_module(name, MePropLinear(layer, k, False if drop_unified else unified))
        if tamper == "zero_weights":
            with torch.no_grad():
                for _, _, layer in found[:-1]:
                    layer.weight.zero_()
        elif tamper == "freeze_bias":
            for _, _, layer in found[:-1]:
                if layer.bias is not None:
                    layer.bias.requires_grad_(False)
        elif tamper == "eval":
            model.eval()
        elif tamper == "dropout":
            for m in model.modules():
                if isinstance(m, nn.Dropout):
                    m.p = 0.9
        if patch_output and found:
            output = found[-1][2]
            output.forward = MePropLinear(output, k, unified).forward
        return model if returns else None

    return apply_meprop


def apply_meprop_other(model, k, unified=False):
    """Also correct, written differently: a recursive walk over named_children, add_module to replace."""
    if isinstance(model, nn.Linear):
        return model
    found = []

    def walk(parent):
        for key, child in parent.named_children():
            if isinstance(child, nn.Linear):
                found.append((parent, key, child))
            walk(child)

    walk(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no nn.Linear")
    *hidden, _output = found
    for parent, key, child in hidden:
        parent.add_module(key, MePropLinear(child, k, unified=unified))
    return model


def namespace(**overrides) -> LocalNamespace:
    ns = {"meprop_linear": make_meprop(), "apply_meprop": make_apply(), "MePropLinear": MePropLinear}
    ns.update(overrides)
    return LocalNamespace(ns)


# --- tests -------------------------------------------------------------------------------------------
def test_every_grade_id_has_a_check():
    assert sorted(CHECKS) == sorted(LINEAR_IDS + APPLY_IDS)


def test_correct_implementation_passes():
    ns = namespace()
    for grade_id in LINEAR_IDS + APPLY_IDS:
        CHECKS[grade_id](ns)


def test_other_correct_implementations_pass():
    ns = namespace(meprop_linear=meprop_linear_other, apply_meprop=apply_meprop_other)
    for grade_id in LINEAR_IDS + APPLY_IDS:
        CHECKS[grade_id](ns)


@pytest.mark.parametrize("wrong, grade_id, message", [
    (make_meprop(signed=True), "test_meprop_linear_values", "largest magnitude"),
    (make_meprop(over_batch=True), "test_meprop_linear_values", "per row"),
    (make_meprop(sparse_db=True), "test_meprop_linear_values", "full g"),
    (make_meprop(sparse_dx=False), "test_meprop_linear_values", "both products"),
    (make_meprop(sparse_dw=False), "test_meprop_linear_values", "both products"),
    (make_meprop(index="signed_sum"), "test_meprop_linear_unified", "column sums of |g|"),
    (make_meprop(index="max"), "test_meprop_linear_unified", "column sums of |g|"),
    (make_meprop(sparse_db=True), "test_meprop_linear_unified", "full g"),
    (make_meprop(signed=True), "test_meprop_linear_unified", None),  # unified unaffected: passes below
    (make_meprop(scatter=True), "test_meprop_linear_compute", "dense product with zeroed columns"),
    (make_meprop(dense_dw=True), "test_meprop_linear_compute", "rows of dW outside I are not exactly 0"),
    (make_meprop(always_dx=True), "test_meprop_linear_edge_cases", "needs_input_grad"),
    (make_meprop(dense_edges=False), "test_meprop_linear_edge_cases", "k ≤ 0 or k ≥ n_out|out of range"),
    (make_meprop(check_dim=False), "test_meprop_linear_edge_cases", "ValueError"),
])
def test_meprop_linear_rejects(wrong, grade_id, message):
    if message is None:
        CHECKS[grade_id](namespace(meprop_linear=wrong))
        return
    with pytest.raises((AssertionError, RuntimeError), match=message):  # RuntimeError: the submission's own crash
        CHECKS[grade_id](namespace(meprop_linear=wrong))


def test_dense_scatter_has_the_right_values_and_fails_only_on_compute():
    """The unified variant written as a dense product with zeroed columns: right values, no saving."""
    ns = namespace(meprop_linear=make_meprop(scatter=True))
    for grade_id in ("test_meprop_linear_values", "test_meprop_linear_unified", "test_meprop_linear_edge_cases"):
        CHECKS[grade_id](ns)
    with pytest.raises(AssertionError, match="NaN"):
        CHECKS["test_meprop_linear_compute"](ns)


KNOWN_SHAPES = ((37, 29, 53), (6, 40, 9))  # the (B, n_in, n_out) the exercise text once published


def test_per_example_only_at_known_shapes_fails_only_the_values_cell():
    """Per-example top-k only at the shapes the text once published, the dense backward elsewhere: the layers
    drawn at grading time fail it in the values cell, and only there (unified, compute and edge cases are right)."""
    ns = namespace(meprop_linear=make_meprop(only_at=KNOWN_SHAPES))
    for grade_id in ("test_meprop_linear_unified", "test_meprop_linear_compute", "test_meprop_linear_edge_cases"):
        CHECKS[grade_id](ns)
    with pytest.raises(AssertionError, match="dense backward's"):
        CHECKS["test_meprop_linear_values"](ns)


def test_per_example_only_on_small_layers_fails_the_values_cell():
    """Per example right on layers of up to 64 units, dense on wider ones: the drawn wide layer fails it."""
    small = tuple((B, n_in, n_out) for B in range(2, 65) for n_in in range(2, 65) for n_out in range(2, 65))
    wrong = make_meprop(only_at=frozenset(small))
    with pytest.raises(AssertionError, match="dense backward's"):
        CHECKS["test_meprop_linear_values"](namespace(meprop_linear=wrong))


def test_unified_only_at_known_shapes_fails_the_unified_cell():
    """The same trick on the unified variant: the drawn wide layer of the unified cell finds more than k rows of dW."""
    ns = namespace(meprop_linear=make_meprop(only_at=KNOWN_SHAPES, only_unified=True))
    CHECKS["test_meprop_linear_values"](ns)
    with pytest.raises(AssertionError, match="at most k="):
        CHECKS["test_meprop_linear_unified"](ns)


@pytest.mark.parametrize("wrong", [make_masked(), make_masked(dense_dx=False), make_masked(dense_dw=False)],
                         ids=["both", "dW", "dx"])
def test_masked_dense_products_have_the_right_values_and_fail_only_on_compute(wrong):
    """Dense products whose masks scrub the poison: every value right, the compute cell's CPU time fails them."""
    ns = namespace(meprop_linear=wrong)
    for grade_id in ("test_meprop_linear_values", "test_meprop_linear_unified", "test_meprop_linear_edge_cases"):
        CHECKS[grade_id](ns)
    with pytest.raises(AssertionError, match="CPU time"):
        CHECKS["test_meprop_linear_compute"](ns)


@pytest.mark.parametrize("wrong, message", [
    (make_apply(include_output=True), "output layer"),
    (make_apply(top_level=True), "Walk every module"),
    (make_apply(copies=True), "original Parameters"),
    (make_apply(returns=False), "returns it"),
    (make_apply(drop_unified=True), "unified=True"),
    (make_apply(skip_no_bias=True), "expected a MePropLinear"),
    (make_apply(exact_type=True), "expected a MePropLinear"),
])
def test_apply_meprop_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECKS["test_apply_meprop"](namespace(apply_meprop=wrong))


def test_sparse_output_layer_fails_the_output_layer_check():
    with pytest.raises(AssertionError, match="dense"):
        CHECKS["test_apply_meprop_output_layer"](namespace(apply_meprop=make_apply(include_output=True)))


def test_apply_meprop_is_graded_without_meprop_linear(monkeypatch):
    """A correct apply_meprop keeps full marks when meprop_linear is still the blank stub."""
    def blank(x, weight, bias, k, unified=False):
        raise NotImplementedError

    monkeypatch.setitem(BACKWARD, "meprop_linear", blank)
    ns = namespace(meprop_linear=blank)
    for grade_id in APPLY_IDS:
        CHECKS[grade_id](ns)
    with pytest.raises(NotImplementedError):  # the stub really is what the replaced layers call
        ns.apply_meprop(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)), 1)(torch.randn(2, 3))


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(
    CHAPTER, WRONG, {"meprop_linear": "test_meprop_linear_compute", "apply_meprop": "test_apply_meprop"})


def test_sandbox_masked_dense_products_lose_only_the_compute_cell():
    """Dense products whose torch.where masks scrub the poison: every value right, so only the CPU time read from the
    worker's cgroup, against the course's dense products on the same drawn inputs, fails them."""
    compute = "test_meprop_linear_compute"
    source = COMPUTE_WRONG[(CHAPTER, "meprop_linear")]
    outcomes = judge.run_checks(CHAPTER, program(CHAPTER, {"meprop_linear": source}), list(LINEAR_IDS), LIMITS,
                                checks=CHECKS)
    assert not outcomes[compute].passed and "CPU time" in outcomes[compute].reason, outcomes[compute].reason
    assert all(outcomes[gid].passed for gid in LINEAR_IDS if gid != compute), \
        {gid: outcomes[gid].reason for gid in LINEAR_IDS}


# --- the contract, clause by clause (tests/contract_tables.py) -------------------------------------------
def _linear(**kw):
    return {"meprop_linear": make_meprop(**kw)}


def _apply(**kw):
    return {"apply_meprop": make_apply(**kw)}


CONTRACT = [
    Clause("meprop_linear", "the k entries of largest |g_ij| (magnitude, not signed value)",
           ("test_meprop_linear_values",), _linear(signed=True), "largest magnitude"),
    Clause("meprop_linear", "per example, keep in each row g_i", ("test_meprop_linear_values",),
           _linear(over_batch=True), "per row"),
    Clause("meprop_linear", "dx = g̃ W, dW = g̃ᵀ x (both from the sparsified g̃)", ("test_meprop_linear_values",),
           _linear(sparse_dx=False), "both products", label="dx-from-g-tilde"),
    Clause("meprop_linear", "dx = g̃ W, dW = g̃ᵀ x (both from the sparsified g̃)", ("test_meprop_linear_values",),
           _linear(sparse_dw=False), "both products", label="dw-from-g-tilde"),
    Clause("meprop_linear", "db = Σ_i g_i from the full g (never sparsified)", ("test_meprop_linear_values",),
           _linear(sparse_db=True), "full g"),
    Clause("meprop_linear", "the k largest entries of Σ_i |g_i| (the column sums of |g|)",
           ("test_meprop_linear_unified",), _linear(index="signed_sum"), "column sums of |g|", label="signed-sums"),
    Clause("meprop_linear", "the k largest entries of Σ_i |g_i| (the column sums of |g|)",
           ("test_meprop_linear_unified",), _linear(index="max"), "column sums of |g|", label="column-max"),
    Clause("meprop_linear", "computed as products of the compacted (B, k) matrix g[:, I]",
           ("test_meprop_linear_compute",), _linear(scatter=True), "NaN"),
    Clause("meprop_linear", "every other row of dW exactly 0", ("test_meprop_linear_compute",),
           _linear(dense_dw=True), "not exactly 0"),
    Clause("meprop_linear", "may use at most a third of the CPU time that the dense backward",
           ("test_meprop_linear_compute",), shown_by="test_sandbox_masked_dense_products_lose_only_the_compute_cell"),
    Clause("meprop_linear", "keeps for backward at most what a dense Linear keeps: x and W themselves",
           ("test_meprop_linear_compute",), _linear(save_copy=True), "held .* more than before"),
    Clause("meprop_linear", "no copy, no other dtype), whichever of them requires grad",
           ("test_meprop_linear_compute",), _linear(private_copies=True), "held .* more than before",
           label="private-copies"),
    Clause("meprop_linear", "dW is None and not computed when the weight does not require grad",
           ("test_meprop_linear_edge_cases",), _linear(always_dw=True), "backward read x"),
    Clause("meprop_linear", "it is None (checked by freeing W's storage between forward and backward)",
           ("test_meprop_linear_edge_cases",), _linear(always_dx=True), "needs_input_grad"),
    Clause("meprop_linear", "``k <= 0`` or ``k >= n_out``: the dense backward", ("test_meprop_linear_edge_cases",),
           _linear(dense_edges=False), "out of range|k ≤ 0"),
    Clause("meprop_linear", "ValueError: if x is not 2-D", ("test_meprop_linear_edge_cases",),
           _linear(check_dim=False), "ValueError"),
    Clause("apply_meprop", "the last one is the output layer and is left exactly as it is",
           ("test_apply_meprop",), _apply(include_output=True), "output layer"),
    Clause("apply_meprop", "the output layer's own forward and backward must be those of a dense Linear",
           ("test_apply_meprop_output_layer",), _apply(patch_output=True), "dense"),
    Clause("apply_meprop", "every ``nn.Linear`` (subclasses included)", ("test_apply_meprop",),
           _apply(exact_type=True), "expected a MePropLinear"),
    Clause("apply_meprop", "any module tree built from containers", ("test_apply_meprop",),
           _apply(top_level=True), "Walk every module"),
    Clause("apply_meprop", "with or without bias", ("test_apply_meprop",), _apply(skip_no_bias=True),
           "expected a MePropLinear"),
    Clause("apply_meprop", "the Parameter objects themselves stay the same", ("test_apply_meprop",),
           _apply(copies=True), "original Parameters"),
    Clause("apply_meprop", "k, unified: passed unchanged to every MePropLinear", ("test_apply_meprop",),
           _apply(drop_unified=True), "unified=True"),
    Clause("apply_meprop", "``model`` itself, modified in place", ("test_apply_meprop",), _apply(returns=False),
           "returns it"),
    Clause("apply_meprop", "Nothing else changes", ("test_apply_meprop",), _apply(tamper="zero_weights"),
           "values of .* changed", label="weights-zeroed"),
    Clause("apply_meprop", "Nothing else changes", ("test_apply_meprop",), _apply(tamper="freeze_bias"),
           "requires_grad", label="biases-frozen"),
    Clause("apply_meprop", "Nothing else changes", ("test_apply_meprop",), _apply(tamper="eval"), "training mode",
           label="eval-mode"),
    Clause("apply_meprop", "Nothing else changes", ("test_apply_meprop",), _apply(tamper="dropout"), "settings",
           label="dropout-changed"),
    Clause("meprop_linear", "x, weight and bias are left as they are", ("test_meprop_linear_values",),
           _linear(swap_data=True), "no longer held the caller's values"),
]

test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
    test_contract_covers_every_graded_cell = contract_tests(CHAPTER, CONTRACT, namespace, CHECKS, globals())
