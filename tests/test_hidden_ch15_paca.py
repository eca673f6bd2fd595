"""The hidden tests of chapter 15 accept correct implementations and reject plausible wrong ones.

The correct implementation is the second answer of ``tests/second_submissions_ch15_paca.py``, written from the
released notebook's text alone in a different style from solutions/ch15_paca.py (index_copy_ for the columns, the
weight kept through save_for_backward, einsum gradients, names matched part by part), so that a bug shared by the
solution and its hidden tests cannot hide. The wrong ones below break one stated property each (the contract table
names the cell that grades it); the last tests run the same checks through the sandbox, as the autograder does, where
the memory cells read the worker from outside.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from grader.api import LocalNamespace, checks_for
from grader.sandbox import judge
from kernels.ch15_paca import nf4_decode_columns_torch, nf4_encode

from contract_tables import Clause, contract_tests
from sandbox_checks import LIMITS, program, sandbox_tests
from second_submissions_ch15_paca import SECOND
from wrong_submissions_ch15_paca import MEMORY_WRONG, WRONG

CHAPTER = "ch15_paca"
CHECKS = checks_for(CHAPTER)
GRADE_IDS = {
    "PaCALinear": ["test_paca_linear", "test_paca_linear_frozen", "test_paca_linear_memory", "test_paca_linear_merge",
                   "test_paca_linear_errors"],
    "apply_paca": ["test_apply_paca", "test_apply_paca_frozen", "test_apply_paca_edge_cases"],
    "QPaCALinear": ["test_qpaca_linear", "test_qpaca_linear_memory"],
}
SETUP = {"nf4_encode": nf4_encode, "nf4_decode_columns_torch": nf4_decode_columns_torch}


def _defined(source: str, name: str, scope: dict):
    exec(compile(source, f"<{name}>", "exec"), scope)
    return scope[name]


def _correct() -> dict:
    scope = dict(SETUP)
    for ex in GRADE_IDS:
        _defined(SECOND[(CHAPTER, ex)], ex, scope)
    return scope


CORRECT = _correct()


def namespace(**overrides) -> LocalNamespace:
    scope = dict(CORRECT)
    scope.update(overrides)
    if "PaCALinear" in overrides and "apply_paca" not in overrides:  # apply_paca reads PaCALinear from its globals
        _defined(SECOND[(CHAPTER, "apply_paca")], "apply_paca", scope)
    return LocalNamespace(scope)


def test_every_graded_cell_has_a_check():
    assert set(CHECKS) == {cell for cells in GRADE_IDS.values() for cell in cells}


def test_second_correct_implementation_passes():
    ns = namespace()
    for cells in GRADE_IDS.values():  # the memory cells too: in-kernel they read this process's own growth
        for cell in cells:
            CHECKS[cell](ns)


# --- wrong answers, one property broken at a time ---------------------------------------------------------------------
def make_paca(no_s_in_dp=False, p_without_div=False, stale=False, rows=False, idx_kind="randperm", buffer=True,
              redraw=False, keep_x=False, trainable_w=False, only_3d=False, merge_stale=False, merge_shared=False,
              check=True, keep_x_if_none=False, two_matmuls=False, base_copy=False, persistent=True, p_double=False,
              merge_bias_shared=False, keep_x_small=False, keep_x_unless_64=False, dx_row_wrong_when_large=False):
    """A PaCALinear with one switch turned; ``idx_kind``: "randperm" (right), "randint" (with replacement),
    "global" (ignores the generator), "arange_if_none" (the first r columns when no generator is given);
    ``check``: True (right), False (no check), "loose" (3.0 and True accepted as ranks)."""

    class PaCALinear(nn.Module):
        def __init__(self, base, rank, alpha, generator=None):
            super().__init__()
            if check == "loose" and (rank != int(rank) or not 1 <= rank <= base.in_features):
                raise ValueError(f"bad rank {rank!r}")
            if check is True and (isinstance(rank, bool) or not isinstance(rank, int)
                                  or not 1 <= rank <= base.in_features):
                raise ValueError(f"bad rank {rank!r}")
            rank = int(rank)
            self.keep_x = keep_x or (keep_x_if_none and generator is None)
            if base_copy:
                base = copy.deepcopy(base)
            self.base = base
            if not trainable_w:
                base.requires_grad_(False)
            self.scaling = alpha / rank
            n = base.out_features if rows else base.in_features
            if idx_kind == "randint":
                idx = torch.randint(0, n, (rank,), generator=generator)
            elif idx_kind == "global":
                idx = torch.randperm(n)[:rank]
            elif idx_kind == "arange_if_none" and generator is None:
                idx = torch.arange(rank)
            else:
                idx = torch.randperm(n, generator=generator)[:rank]
            if buffer:
                self.register_buffer("idx", idx, persistent=persistent)
            else:
                self.idx = idx
            w = base.weight.detach()
            init = w[idx, :].t() if rows else w[:, idx]
            self.P = nn.Parameter(init.clone() if p_without_div else init / self.scaling)
            if p_double:
                self.P = nn.Parameter(self.P.detach().double())
            self.written = False

        def _write(self):
            with torch.no_grad():
                if rows:
                    self.base.weight[self.idx, :] = self.scaling * self.P.t()
                else:
                    self.base.weight[:, self.idx] = self.scaling * self.P

        def forward(self, x):
            if redraw:
                self.idx = torch.randperm(self.base.in_features)[:self.idx.numel()]
            idx, s = self.idx, self.scaling
            if two_matmuls:  # W never written: the base product plus a correction on the selected columns
                w0 = self.base.weight
                return F.linear(x, w0, self.base.bias) + F.linear(x[..., idx], s * self.P - w0[:, idx])
            if not (stale and self.written):
                self._write()
                self.written = True
            if self.keep_x or (keep_x_small and x.numel() < 2**16):
                w = self.base.weight.detach().index_copy(1, idx, s * self.P)
                return F.linear(x, w, self.base.bias)

            # keep_x_unless_64: x on ctx (out of a saved-tensor hook's sight) unless the layer has 64 outputs
            on_ctx = keep_x_unless_64 and self.base.out_features != 64

            class Fn(torch.autograd.Function):
                @staticmethod
                def forward(ctx, x, p, w, b):
                    kept = x[:, :, idx] if only_3d else x.index_select(-1, idx)
                    if on_ctx:
                        ctx.x = x
                    else:
                        ctx.save_for_backward(kept)
                    ctx.w = w
                    return F.linear(x, w, b)

                @staticmethod
                def backward(ctx, g):
                    (xc,) = (ctx.x.index_select(-1, idx),) if on_ctx else ctx.saved_tensors
                    dp = g.reshape(-1, g.shape[-1]).t() @ xc.reshape(-1, xc.shape[-1])
                    dx = g @ ctx.w
                    flat = dx.view(-1, dx.shape[-1])
                    if dx_row_wrong_when_large and flat.shape[0] > 1000:  # one wrong row, the sum of dx unchanged
                        flat[-1, 0] += 5.0
                        flat[-1, 1] -= 5.0
                    return dx, dp * (1.0 if no_s_in_dp else s), None, None

            if rows:
                class RowFn(torch.autograd.Function):  # a row's gradient reads all of x
                    @staticmethod
                    def forward(ctx, x, p, w, b):
                        ctx.save_for_backward(x)
                        ctx.w = w
                        return F.linear(x, w, b)

                    @staticmethod
                    def backward(ctx, g):
                        (xx,) = ctx.saved_tensors
                        g2 = g.reshape(-1, g.shape[-1])
                        dp = (g2[:, idx].t() @ xx.reshape(-1, xx.shape[-1])).t() * s
                        return g @ ctx.w, dp, None, None

                return RowFn.apply(x, self.P, self.base.weight, self.base.bias)
            return Fn.apply(x, self.P, self.base.weight, self.base.bias)

        def merge(self):
            if merge_shared:
                merged = nn.Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None)
                self._write()
                merged.weight = self.base.weight
                merged.bias = self.base.bias
                return merged
            merged = nn.Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None)
            with torch.no_grad():
                w = self.base.weight.detach().clone()
                if not merge_stale:
                    w[:, self.idx] = self.scaling * self.P
                merged.weight.copy_(w)
                if self.base.bias is not None:
                    merged.bias.copy_(self.base.bias)
            if merge_bias_shared and self.base.bias is not None:
                merged.bias = self.base.bias
            return merged

    return PaCALinear


def make_apply(freeze=True, letters=False, check=True, copy_model=False, exact_only=False, copy_layers=False):
    def apply_paca(model, rank, alpha, targets):
        targets = tuple(targets)
        if copy_model:
            model = copy.deepcopy(model)

        def hit(name):
            if letters:
                return any(name.endswith(t) for t in targets)
            if exact_only:
                return any(name.split(".")[-1] == t for t in targets)
            return any(name == t or name.endswith("." + t) for t in targets)

        hits = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and hit(n)]
        if check and not hits:
            raise ValueError("no target matched")
        if freeze:
            model.requires_grad_(False)
        for name in hits:
            layer = model.get_submodule(name)
            model.set_submodule(name, CORRECT["PaCALinear"](copy.deepcopy(layer) if copy_layers else layer, rank,
                                                            alpha))
        return model

    return apply_paca


def make_qpaca(float_weight=False, p_from_nf4=False, keep_float=False, save_weight=False, check=True,
               float_attribute=False, bias_shared=False, p_double=False, save_x=False):
    class QPaCALinear(nn.Module):
        def __init__(self, base, rank, alpha, block_size=64):
            super().__init__()
            if check == "loose" and (rank != int(rank) or not 1 <= rank <= base.in_features):
                raise ValueError(f"bad rank {rank!r}")
            if check is True and (isinstance(rank, bool) or not isinstance(rank, int)
                                  or not 1 <= rank <= base.in_features):
                raise ValueError(f"bad rank {rank!r}")
            rank = int(rank)
            self.save_x = save_x
            self.shape, self.block = (base.out_features, base.in_features), block_size
            self.scaling = alpha / rank
            self.register_buffer("idx", torch.randperm(base.in_features)[:rank])
            packed, absmax = nf4_encode(base.weight.detach(), block_size)
            self.register_buffer("weight_packed", packed)
            self.register_buffer("weight_absmax", absmax)
            source = base.weight.detach()
            if p_from_nf4:
                source = nf4_decode_columns_torch(packed, absmax, self.shape, self.idx[:0], source[:, :0], block_size)
            self.P = nn.Parameter(source[:, self.idx] / self.scaling)
            if float_weight or keep_float:
                self.register_buffer("weight_float", base.weight.detach().clone())
            self.bias = None if base.bias is None else nn.Parameter(base.bias.detach().clone(), requires_grad=False)
            if bias_shared and base.bias is not None:
                self.bias = base.bias.requires_grad_(False)
            if p_double:
                self.P = nn.Parameter(self.P.detach().double())
            if float_attribute:  # a plain attribute, neither a parameter nor a buffer
                self.cache = [base.weight.detach().clone()]

        def forward(self, x):
            if float_weight:
                w = self.weight_float.index_copy(1, self.idx, self.scaling * self.P)
                return F.linear(x, w, self.bias)
            w = nf4_decode_columns_torch(self.weight_packed, self.weight_absmax, self.shape, self.idx,
                                         self.scaling * self.P, self.block)
            if save_weight:
                return F.linear(x, w, self.bias)  # autograd keeps w (and x) for backward
            return _qpaca_fn(self, x)

    return QPaCALinear


def _qpaca_fn(layer, x):
    idx, s = layer.idx, layer.scaling

    def weight(p):
        return nf4_decode_columns_torch(layer.weight_packed, layer.weight_absmax, layer.shape, idx, s * p, layer.block)

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, p):
            ctx.save_for_backward(x if layer.save_x else x.index_select(-1, idx), p)
            return F.linear(x, weight(p), layer.bias)

        @staticmethod
        def backward(ctx, g):
            xc, p = ctx.saved_tensors
            if layer.save_x:
                xc = xc.index_select(-1, idx)
            dp = s * g.reshape(-1, g.shape[-1]).t() @ xc.reshape(-1, xc.shape[-1])
            return g @ weight(p), dp

    return Fn.apply(x, layer.P)


def _paca(**kw):
    return {"PaCALinear": make_paca(**kw)}


def _apply(**kw):
    return {"apply_paca": make_apply(**kw)}


def _q(**kw):
    return {"QPaCALinear": make_qpaca(**kw)}


SINGLE_CELL = [  # (label, the cell that fails, wrong answer, message): clauses whose cell comes after the memory one
    ("merge-bias-shared", "test_paca_linear_merge", _paca(merge_bias_shared=True), "merged bias"),
    ("rank-3.0-or-True", "test_paca_linear_errors", _paca(check="loose"), "ValueError"),
    ("w-trainable", "test_paca_linear_frozen", _paca(trainable_w=True), "require grad"),
    ("merge-stale", "test_paca_linear_merge", _paca(merge_stale=True), "merged weight"),
    ("merge-shared", "test_paca_linear_merge", _paca(merge_shared=True), "share no storage"),
    ("no-rank-check", "test_paca_linear_errors", _paca(check=False), "ValueError"),
]


KEPT = r"kept .* \(read from outside your process\)"

CONTRACT = [
    Clause("PaCALinear", "dP = scaling * gᵀ x[..., idx] summed over every row", ("test_paca_linear",),
           _paca(no_s_in_dp=True), "lacks the factor scaling", label="dp-without-s"),
    Clause("PaCALinear", "``base.weight[:, idx] / scaling`` at initialisation", ("test_paca_linear",),
           _paca(p_without_div=True), "not divided by scaling", label="p-without-div"),
    Clause("PaCALinear", "Every forward uses the current P", ("test_paca_linear",), _paca(stale=True),
           "still used the old P", label="stale-w"),
    Clause("PaCALinear", "r distinct input columns, never redrawn", ("test_paca_linear",), _paca(rows=True),
           "input COLUMNS|input columns", label="output-rows"),
    Clause("PaCALinear", "r distinct input columns, never redrawn", ("test_paca_linear",), _paca(idx_kind="randint"),
           "without replacement|not the draw", label="with-replacement"),
    Clause("PaCALinear", "``torch.randperm(in_features, generator=generator)[:rank]``", ("test_paca_linear",),
           _paca(idx_kind="global"), "not the draw of the generator", label="generator-ignored"),
    Clause("PaCALinear", "int64 buffer (registered with ``register_buffer``", ("test_paca_linear",),
           _paca(buffer=False), "no buffer idx", label="idx-not-a-buffer"),
    Clause("PaCALinear", "drawn once in ``__init__``", ("test_paca_linear",), _paca(redraw=True), "output",
           label="idx-redrawn"),
    Clause("PaCALinear", "any number of leading dimensions (1-D included)", ("test_paca_linear",),
           _paca(only_3d=True), r"on x \(7, 37\)", label="only-3d"),
    Clause("PaCALinear", "saves for backward only ``x[..., idx]``", ("test_paca_linear_memory",), _paca(keep_x=True),
           KEPT, label="keeps-x"),
    Clause("PaCALinear", "never a fixed choice", ("test_paca_linear",), _paca(idx_kind="arange_if_none"),
           "not a random draw", label="first-columns-without-generator"),
    Clause("PaCALinear", "(b) no generator (torch's global one, as in ``apply_paca``)", ("test_paca_linear_memory",),
           _paca(keep_x_if_none=True), KEPT, label="keeps-x-without-generator"),
    Clause("PaCALinear", "in_features 1000 to 2100 and out_features 40 to 100 (any integers)",
           ("test_paca_linear_memory",), _paca(keep_x_unless_64=True), KEPT, label="keeps-x-unless-graded-shape"),
    Clause("PaCALinear", "dx (every row, through random projections, and its sum)", ("test_paca_linear_memory",),
           _paca(dx_row_wrong_when_large=True), "rows are wrong", label="one-wrong-dx-row-when-large"),
    Clause("PaCALinear", "must not pack x itself (or a tensor equal to x) for backward", ("test_paca_linear_memory",),
           _paca(keep_x_small=True), "saved x itself", label="keeps-x-when-small"),
    Clause("PaCALinear", "``base.weight`` holding ``scaling * P`` in its columns idx", ("test_paca_linear",),
           _paca(two_matmuls=True), "after the last forward", label="weight-never-written"),
    Clause("PaCALinear", "``self.base is base``", ("test_paca_linear",), _paca(base_copy=True), "very object",
           label="base-copied"),
    Clause("PaCALinear", "persistent: ``state_dict()`` carries it", ("test_paca_linear",), _paca(persistent=False),
           "state_dict", label="idx-not-persistent"),
    Clause("PaCALinear", "P (its dtype too)", ("test_paca_linear",), _paca(p_double=True), "float32",
           label="p-float64"),
    Clause("PaCALinear", "the merged bias unchanged after the base bias changes", ("test_paca_linear_merge",),
           message="merged bias", shown_by="test_single_cell_wrong_answers", label="merge-bias-shared"),
    Clause("PaCALinear", "a bool or a float is not an int rank", ("test_paca_linear_errors",),
           message="ValueError", shown_by="test_single_cell_wrong_answers", label="rank-3.0-or-True"),
    Clause("PaCALinear", "P is the only tensor that requires grad", ("test_paca_linear_frozen",),
           message="require grad", shown_by="test_single_cell_wrong_answers", label="w-trainable"),
    Clause("PaCALinear", "(the current P, even if no forward ran since P changed)", ("test_paca_linear_merge",),
           message="merged weight", shown_by="test_single_cell_wrong_answers", label="merge-stale"),
    Clause("PaCALinear", "sharing no storage with the layer", ("test_paca_linear_merge",),
           message="share no storage", shown_by="test_single_cell_wrong_answers", label="merge-shared"),
    Clause("PaCALinear", "anything else (0, -2, in_features + 1, 2.5, 3.0, and True", ("test_paca_linear_errors",),
           message="ValueError", shown_by="test_single_cell_wrong_answers", label="no-rank-check"),
    Clause("apply_paca", "in the model given, which is the one returned", ("test_apply_paca",),
           _apply(copy_model=True), "in place", label="copy"),
    Clause("apply_paca", "``.base``, the very object, not a copy", ("test_apply_paca",), _apply(copy_layers=True),
           "very object", label="base-copied"),
    Clause("apply_paca", "the only parameters with ``requires_grad=True`` are the ``P`` of the new layers",
           ("test_apply_paca_frozen",), _apply(freeze=False), "trainable parameters", label="rest-trainable"),
    Clause("apply_paca", "Linears whose names only end with the same letters", ("test_apply_paca_edge_cases",),
           _apply(letters=True), "replaced", label="letters"),
    Clause("apply_paca", "with a dotted target", ("test_apply_paca_edge_cases",), _apply(exact_only=True),
           "replaced", label="dotted-target"),
    Clause("apply_paca", "ValueError: if no ``nn.Linear`` matches any target", ("test_apply_paca_edge_cases",),
           _apply(check=False), "ValueError", label="no-match"),
    Clause("QPaCALinear", "from the ORIGINAL float weight", ("test_qpaca_linear",), _q(p_from_nf4=True),
           "ORIGINAL float weight", label="p-from-nf4"),
    Clause("QPaCALinear", "``F.linear(x, nf4_decode_columns_torch(weight_packed", ("test_qpaca_linear",),
           _q(float_weight=True), "not the NF4 weight", label="float-weight"),
    Clause("QPaCALinear", "rank: r, a Python int from 1 to in_features; anything else raises ValueError",
           ("test_qpaca_linear",), _q(check=False), "ValueError", label="no-rank-check"),
    Clause("QPaCALinear", "a copy, so that changing the base bias afterwards changes nothing here",
           ("test_qpaca_linear",), _q(bias_shared=True), "output", label="bias-shared"),
    Clause("QPaCALinear", "P (float32) against the", ("test_qpaca_linear",), _q(p_double=True), "dtype of P",
           label="p-float64"),
    Clause("QPaCALinear", "its buffers and its attributes (directly or in a", ("test_qpaca_linear_memory",),
           _q(float_attribute=True), "keep no float copy", label="float-copy-attribute"),
    Clause("QPaCALinear", "ranks 0, -2, in_features + 1, 2.5, 3.0 and True", ("test_qpaca_linear",),
           _q(check="loose"), "ValueError", label="rank-3.0-or-True"),
    Clause("QPaCALinear", "may keep until backward no more than its x[..., idx], its output and 2 MiB",
           ("test_qpaca_linear_memory",), _q(save_x=True), "save only x", label="saves-x"),
    Clause("QPaCALinear", "Do not keep it, nor any float copy of its weight", ("test_qpaca_linear_memory",),
           _q(keep_float=True), "keep no float copy", label="float-copy"),
    Clause("QPaCALinear", "(never saved for backward)", ("test_qpaca_linear_memory",), _q(save_weight=True),
           "not the dequantized weight", label="saves-weight"),
]

test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
    test_contract_covers_every_graded_cell = contract_tests(CHAPTER, CONTRACT, namespace, CHECKS, globals())


@pytest.mark.parametrize("label, cell, wrong, message", SINGLE_CELL, ids=[row[0] for row in SINGLE_CELL])
def test_single_cell_wrong_answers(label, cell, wrong, message):
    """A wrong answer whose broken property a cell other than the measured one grades: that cell fails for its
    reason and every other cell of the exercise but the memory cell passes (the memory cell, in-process a few seconds
    per answer, is shown unaffected by the same answers through the whole-exercise clauses)."""
    ns = namespace(**wrong)
    for other in GRADE_IDS["PaCALinear"]:
        if other == "test_paca_linear_memory":
            continue
        if other == cell:
            with pytest.raises(AssertionError, match=message):
                CHECKS[other](ns)
        else:
            CHECKS[other](ns)


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(
    CHAPTER, WRONG, grade_ids={"PaCALinear": "test_paca_linear", "apply_paca": "test_apply_paca_frozen",
                               "QPaCALinear": "test_qpaca_linear"})


def test_sandbox_memory_wrong_answers_lose_only_their_memory_cells():
    """Every value right, x (PaCA) or a float weight (QPaCA) kept: the worker's cgroup shows it, so only the memory
    cells fail."""
    for exercise, memory_cell in (("PaCALinear", "test_paca_linear_memory"), ("QPaCALinear", "test_qpaca_linear_memory")):
        program_ = program(CHAPTER, {exercise: MEMORY_WRONG[(CHAPTER, exercise)]})
        cells = [GRADE_IDS[exercise][0], memory_cell]  # the values pass, the memory reading fails
        outcomes = judge.run_checks(CHAPTER, program_, cells, LIMITS, checks=CHECKS)
        lost = {gid: o.reason for gid, o in outcomes.items() if not o.passed}
        assert list(lost) == [memory_cell], lost
        assert "read from outside your process" in lost[memory_cell]
