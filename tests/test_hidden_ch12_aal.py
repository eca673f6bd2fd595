"""The hidden tests of chapter 12 accept correct implementations and reject plausible wrong ones.

The correct implementation is the second answer of ``tests/second_submissions_ch12_aal.py``, written from the
released notebook's text alone in a different style from solutions/ch12_aal.py (einsum on flattened rows, ARA as a
zero-valued term routing fc1's weight gradient through x_0 with plain autograd and a strict ResidualMLPBlock check,
the indicator in its Σ a(2x̃ − a) form), so that a bug shared by the solution and its hidden tests cannot hide. The wrong ones below break one stated
property each (the contract table names the cell that grades it); the last tests run the same checks through the
sandbox, as the autograder does, where the memory cells read the worker from outside.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from grader.api import LocalNamespace, checks_for
from grader.sandbox import judge
from kernels.ch05_tinytl import pack_mask_torch, unpack_mask_torch

from contract_tables import Clause, contract_tests
from sandbox_checks import LIMITS, program, sandbox_tests
from second_submissions_ch12_aal import SECOND
from wrong_submissions_ch12_aal import MEMORY_WRONG, WRONG

CHAPTER = "ch12_aal"
CHECKS = checks_for(CHAPTER)
GRADE_IDS = {
    "asa_linear": ["test_asa_linear", "test_asa_linear_memory", "test_asa_linear_edge_cases"],
    "ara_group": ["test_ara_group", "test_ara_group_memory", "test_ara_group_edge_cases"],
    "learning_indicator": ["test_learning_indicator", "test_learning_indicator_errors"],
}


class ResidualMLPBlock(torch.nn.Module):
    """The setup cell's block: x + fc2(relu(fc1(x)))."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.fc1 = torch.nn.Linear(d, h)
        self.fc2 = torch.nn.Linear(h, d)

    def forward(self, x):
        return x + self.fc2(F.relu(self.fc1(x)))


SETUP = {"pack_mask_torch": pack_mask_torch, "unpack_mask_torch": unpack_mask_torch,
         "ResidualMLPBlock": ResidualMLPBlock}


def _defined(source: str, name: str):
    scope: dict = dict(SETUP)
    exec(compile(source, f"<{name}>", "exec"), scope)
    return scope[name]


CORRECT = {ex: _defined(SECOND[(CHAPTER, ex)], ex) for ex in GRADE_IDS}


def namespace(**overrides) -> LocalNamespace:
    return LocalNamespace({**SETUP, **CORRECT, **overrides})


def test_every_graded_cell_has_a_check():
    assert set(CHECKS) == {cell for cells in GRADE_IDS.values() for cell in cells}


@pytest.mark.parametrize("exercise", sorted(GRADE_IDS))
def test_second_correct_implementation_passes(exercise):
    ns = namespace()
    for cell in GRADE_IDS[exercise]:  # the memory cells too: in-kernel they read this process's own growth
        CHECKS[cell](ns)


# --- wrong answers, one property broken at a time ---------------------------------------------------------------------
def make_asa(no_eps=False, torch_sign=False, ignore_relu=False, no_lam=False, no_eps_dw=False, dx_from_s=False,
             db_first_dim=False, save="packed", always_dx=False, check=True, dw_from_x=False, plain_for_parameter=False,
             plain_between=None, sketch_when_large=False, keep_x_with_bias=False):
    """``save``: what the forward keeps for backward ("packed", "bool", "x"). The switches that look at their input
    (``plain_for_parameter``: plain backprop for an nn.Parameter weight; ``plain_between``: plain backprop for x of
    that many elements; ``sketch_when_large``: on 2^20 elements or more, one number instead of s, exact only for
    identical rows of g; ``keep_x_with_bias``: x kept when there is a bias) are the wrong answers that once scored
    full marks."""
    def asa_linear(x, weight, bias, epsilon=0.01, lam=100.0, relu=False):
        if check and (x.shape[-1] != weight.shape[1] or not epsilon > 0):
            raise ValueError("bad arguments")
        if (plain_for_parameter and isinstance(weight, torch.nn.Parameter)) or \
                (plain_between and plain_between[0] < x.numel() < plain_between[1]):
            return F.linear(x, weight, bias)
        use_relu = relu and not ignore_relu
        sketch = sketch_when_large and x.numel() >= 2**20
        keep_kind = "x" if keep_x_with_bias and bias is not None else save

        def sign(t):
            if torch_sign:
                return torch.sign(t)
            return torch.where(t > 0, 1.0, 0.0 if use_relu else -1.0).to(t.dtype)

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w, b):
                s = sign(x)
                if sketch:
                    keep = s.sum().reshape(1)
                else:
                    keep = {"packed": pack_mask_torch(x > 0), "bool": x > 0, "x": x}[keep_kind]
                ctx.save_for_backward(keep, w, x if dw_from_x else None)
                ctx.shape = x.shape
                return F.linear(x if no_eps else x + epsilon * s, w, b)

            @staticmethod
            def backward(ctx, g):
                keep, w, x_kept = ctx.saved_tensors
                n_in = ctx.shape[-1]
                rows = g.reshape(-1, g.shape[-1])
                n_rows = rows.shape[0]

                def s_all():  # s of every row, rebuilt from what the forward kept
                    if keep_kind == "packed":
                        positive = unpack_mask_torch(keep, n_rows * n_in)
                    else:
                        positive = keep.reshape(-1) > 0
                    return torch.where(positive.view(n_rows, n_in), 1.0, 0.0 if use_relu else -1.0)

                dx = dw = db = None
                if ctx.needs_input_grad[0] or always_dx:
                    dx = (g @ w)
                    if dx_from_s:
                        dx = dx * s_all().reshape(dx.shape)
                if ctx.needs_input_grad[1]:
                    scale = (1.0 if no_lam else lam) * (1.0 if no_eps_dw else epsilon)
                    if sketch:
                        dw = scale * torch.outer(rows.sum(0) / n_rows, (keep / n_in).expand(n_in))
                    else:
                        aux = x_kept.reshape(-1, n_in) if dw_from_x else s_all()
                        dw = scale * (rows.t() @ aux)
                if ctx.needs_input_grad[2]:
                    db = rows.mean(0) if db_first_dim else rows.sum(0)
                return dx, dw, db

        return Fn.apply(x, weight, bias)

    return asa_linear


def make_ara(own_input=False, forward_from_x0=False, lam=1.0, copy_x0=False, cut_dx=False, check=True,
             plain_for_block_class=False, plain_between=None, sketch_when_large=False, copy_if_3d=False,
             strict=False):
    """The switches that look at their input (``plain_for_block_class``: plain backprop for the setup cell's class;
    ``plain_between``: for x of that many elements; ``sketch_when_large``: only x_0's column sums on 2^20 elements or
    more, exact only for identical rows; ``copy_if_3d``: a copy of x_0 per block for a 3-D x) are wrong answers that
    once scored full marks; ``strict`` (a TypeError for anything but a ResidualMLPBlock) is correct (the second answer
    checks so too)."""
    def ara_group(blocks, x):
        blocks = list(blocks)
        if check and not blocks:
            raise ValueError("empty group")
        if strict and not all(isinstance(b, ResidualMLPBlock) for b in blocks):
            raise TypeError("blocks must be ResidualMLPBlocks")
        if (plain_for_block_class and type(blocks[0]).__name__ == "ResidualMLPBlock") or \
                (plain_between and plain_between[0] < x.numel() < plain_between[1]):
            for block in blocks:
                x = block(x)
            return x
        sketch = sketch_when_large and x.numel() >= 2**20
        n_rows = x.numel() // x.shape[-1]

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, h, x0, w, b):
                ctx.save_for_backward(h if own_input else x0, w)
                return F.linear(x0 if forward_from_x0 else h, w, b)

            @staticmethod
            def backward(ctx, g):
                aux, w = ctx.saved_tensors
                rows = g.reshape(-1, g.shape[-1])
                dh = None if cut_dx else g @ w
                if sketch:
                    return dh, None, torch.outer(rows.sum(0) / n_rows, aux.reshape(-1)), rows.sum(0)
                return dh, None, lam * rows.t() @ aux.reshape(-1, aux.shape[-1]), rows.sum(0)

        x0 = x.detach()
        if sketch:
            x0 = x0.reshape(-1, x0.shape[-1]).sum(0)
        copy = copy_x0 or (copy_if_3d and x.dim() == 3)
        h = x
        for block in blocks:
            z = Fn.apply(h, x0.clone() if copy else x0, block.fc1.weight, block.fc1.bias)
            h = h + block.fc2(F.relu(z))
        return h

    return ara_group


def make_li(mean=False, norm_a=False, check=True, mean_norm_a_if_wide=False):
    def learning_indicator(x_tilde, a):
        if check and (x_tilde.shape != a.shape or x_tilde.dim() == 0):
            raise ValueError("shapes differ")
        if mean_norm_a_if_wide and x_tilde.shape[-1] > 64:
            return (1 - a.pow(2).sum(-1) / x_tilde.pow(2).sum(-1)).mean()
        if norm_a:
            return 1 - a.pow(2).sum(-1) / (x_tilde.pow(2).sum(-1) + 1e-6)
        if mean:
            return (1 - (x_tilde - a).pow(2).sum(-1) / (x_tilde.pow(2).sum(-1) + 1e-6)).mean()
        return 1 - (x_tilde - a).pow(2).sum(-1) / (x_tilde.pow(2).sum(-1) + 1e-6)

    return learning_indicator


def _asa(**kw):
    return {"asa_linear": make_asa(**kw)}


def _ara(**kw):
    return {"ara_group": make_ara(**kw)}


def _li(**kw):
    return {"learning_indicator": make_li(**kw)}


KEPT = r"kept .* \(read from outside your process\)"

CONTRACT = [
    Clause("asa_linear", "= F.linear(x + epsilon * s, weight, bias)", ("test_asa_linear",), _asa(no_eps=True),
           "computes on x \\+ ε s"),
    Clause("asa_linear", "x == 0 gives -1, unlike torch.sign", ("test_asa_linear",), _asa(torch_sign=True),
           "torch.sign maps 0 to 0"),
    Clause("asa_linear", "True: s = 1 where x > 0 and 0 elsewhere", ("test_asa_linear",), _asa(ignore_relu=True),
           "relu=True means"),
    Clause("asa_linear", "dW = lam * epsilon * gᵀ s", ("test_asa_linear",), _asa(no_lam=True),
           "dW = lam \\* epsilon", label="lam-missing"),
    Clause("asa_linear", "dW = lam * epsilon * gᵀ s", ("test_asa_linear",), _asa(no_eps_dw=True),
           "dW = lam \\* epsilon", label="epsilon-missing"),
    Clause("asa_linear", "dW = lam * epsilon * gᵀ s", ("test_asa_linear",), _asa(dw_from_x=True),
           "never from x", label="dw-from-x"),
    Clause("asa_linear", "dx = g W exactly (x's shape; s plays no part in it)", ("test_asa_linear",),
           _asa(dx_from_s=True), "s plays no part"),
    Clause("asa_linear", "db = Σ g over every row", ("test_asa_linear",), _asa(db_first_dim=True), "db"),
    Clause("asa_linear", "only s, packed at 1 bit per element", ("test_asa_linear_memory",), _asa(save="x"), KEPT,
           label="keeps-x"),
    Clause("asa_linear", "no bool or float copy of s", ("test_asa_linear_memory",), _asa(save="bool"), KEPT,
           label="keeps-bool"),
    Clause("asa_linear", "with x not requiring grad", ("test_asa_linear_edge_cases",), _asa(always_dx=True),
           "backward read the weight"),
    Clause("asa_linear", "ValueError: if x.shape[-1] differs from weight.shape[1], or epsilon <= 0",
           ("test_asa_linear_edge_cases",), _asa(check=False), "ValueError"),
    Clause("asa_linear", "the weight and bias as nn.Parameters (as in an nn.Module)",
           ("test_asa_linear",), _asa(plain_for_parameter=True), "computes on x",
           label="plain-for-parameter"),
    Clause("asa_linear", "one whose x has 10^4 to 10^6 elements, drawn log-uniformly", ("test_asa_linear",),
           _asa(plain_between=(6144, 2**20)), "computes on x", label="plain-in-the-size-gap"),
    Clause("asa_linear", "The output gradient is drawn and sent only after the forward; y, the whole dW",
           ("test_asa_linear_memory",), _asa(sketch_when_large=True), "dW of", label="one-number-sketch"),
    Clause("asa_linear", "(a) an nn.Parameter weight and bias", ("test_asa_linear_memory",),
           _asa(keep_x_with_bias=True), KEPT, label="keeps-x-with-bias"),
    Clause("ara_group", "groups of 1 to 4 of the setup cell's ResidualMLPBlocks",
           ("test_ara_group",), _ara(plain_for_block_class=True), "not from its own", label="plain-for-the-block-class"),
    Clause("ara_group", "one group whose x has 10^4 to 10^6 elements", ("test_ara_group",),
           _ara(plain_between=(2048, 2**20)), "not from its own", label="plain-in-the-size-gap"),
    Clause("ara_group", "every block's fc1 weight and bias gradients", ("test_ara_group_memory",),
           _ara(sketch_when_large=True), "gradient of block", label="column-sum-sketch"),
    Clause("ara_group", "(a) 3-D", ("test_ara_group_memory",), _ara(copy_if_3d=True), KEPT, label="copies-when-3d"),
    Clause("ara_group", "fc1.weight's gradient is g_iᵀ x_0", ("test_ara_group",), _ara(own_input=True),
           "not from its own"),
    Clause("ara_group", "every value computed from the real x_i", ("test_ara_group",), _ara(forward_from_x0=True),
           "computed from the real stream"),
    Clause("ara_group", "no λ: ARA takes the residual stream as it is", ("test_ara_group",), _ara(lam=100.0),
           "ARA has no λ"),
    Clause("ara_group", "the gradient flowing back through fc1 to x_i is exact", ("test_ara_group",),
           _ara(cut_dx=True), "exactly backprop's"),
    Clause("ara_group", "x_0 itself (no copy and no block's own x_i)", ("test_ara_group_memory",),
           _ara(copy_x0=True), KEPT),
    Clause("ara_group", "ValueError: if blocks is empty", ("test_ara_group_edge_cases",), _ara(check=False),
           "ValueError"),
    Clause("learning_indicator", "never averaged over the batch", ("test_learning_indicator",), _li(mean=True),
           "one value per row"),
    Clause("learning_indicator", "1 - Σ_j (x_tilde - a)_j² / (Σ_j x_tilde_j² + 1e-6)", ("test_learning_indicator",),
           _li(norm_a=True), "subtract a"),
    Clause("learning_indicator", "the notebook's 128 and 256", ("test_learning_indicator",),
           _li(mean_norm_a_if_wide=True), "one value per row", label="batch-mean-when-wide"),
    Clause("learning_indicator", "ValueError: if the shapes differ", ("test_learning_indicator_errors",),
           _li(check=False), "ValueError"),
]

test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
    test_contract_covers_every_graded_cell = contract_tests(CHAPTER, CONTRACT, namespace, CHECKS, globals())


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(CHAPTER, WRONG)


def test_sandbox_asa_keeping_x_loses_only_its_memory_cell():
    """Every value right, x itself kept for backward: the worker's cgroup shows it, so only the memory cell fails."""
    program_ = program(CHAPTER, {"asa_linear": MEMORY_WRONG[(CHAPTER, "asa_linear")]})
    outcomes = judge.run_checks(CHAPTER, program_, GRADE_IDS["asa_linear"], LIMITS, checks=CHECKS)
    lost = {gid: o.reason for gid, o in outcomes.items() if not o.passed}
    assert list(lost) == ["test_asa_linear_memory"], lost
    assert "read from outside your process" in lost["test_asa_linear_memory"]
