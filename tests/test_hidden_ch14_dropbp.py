"""The hidden tests of chapter 14 accept correct implementations and reject plausible wrong ones.

The correct implementation is the second answer of ``tests/second_submissions_ch14_dropbp.py``, written from the
released notebook's text alone in a different style from solutions/ch14_dropbp.py (a torch.enable_grad/no_grad
context chosen up front, decisions as tensor operations, sensitivities through torch.autograd.grad-free loops over
named parameters, the allocation on integer steps in a heap-free scan). The wrong ones below break one stated
property each (the contract table names the cell that grades it); the last tests run the same checks through the
sandbox, as the autograder does, where the memory cell reads the worker from outside.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: F401 - the answers' namespace
from torch import nn

from grader.api import LocalNamespace, checks_for
from grader.sandbox import judge

from contract_tables import Clause, contract_tests
from sandbox_checks import LIMITS, program, sandbox_tests
from second_submissions_ch14_dropbp import SECOND
from wrong_submissions_ch14_dropbp import MEMORY_WRONG, WRONG

CHAPTER = "ch14_dropbp"
CHECKS = checks_for(CHAPTER)
GRADE_IDS = {
    "DropBP": ["test_DropBP", "test_DropBP_memory", "test_DropBP_errors"],
    "choose_dropped": ["test_choose_dropped", "test_choose_dropped_errors"],
    "sensitivity": ["test_sensitivity", "test_sensitivity_edge_cases"],
    "allocate_drop_rates": ["test_allocate_drop_rates", "test_allocate_drop_rates_errors"],
}
SETUP = {"math": math, "torch": torch, "nn": nn, "F": F}


def _defined(source: str, name: str, scope: dict):
    exec(compile(source, f"<{name}>", "exec"), scope)
    return scope[name]


_SCOPE: dict = dict(SETUP)
CORRECT = {ex: _defined(SECOND[(CHAPTER, ex)], ex, _SCOPE) for ex in GRADE_IDS}


def namespace(**overrides) -> LocalNamespace:
    ns = {**SETUP, **CORRECT, **overrides}
    if "DropBP" in overrides:  # sensitivity looks for the namespace's own DropBP class
        ns["sensitivity"] = _defined(SECOND[(CHAPTER, "sensitivity")], "sensitivity", {**SETUP, **ns})
    return LocalNamespace(ns)


def test_every_graded_cell_has_a_check():
    assert set(CHECKS) == {cell for cells in GRADE_IDS.values() for cell in cells}


def test_second_correct_implementation_passes():
    ns = namespace()
    for cells in GRADE_IDS.values():
        for cell in cells:
            CHECKS[cell](ns)


# --- wrong answers, one property broken at a time ---------------------------------------------------------------------
def make_dropbp(drop_residual=False, rescale=False, skip_under_no_grad=False, zero_hook=False, eval_drops=False,
                decide_after=False, detach_form=False, draw_when_forced=False, check=True, no_dropped_attr=False,
                range_only=False, large_drops=False, literal_shapes=False, no_draw_at_ends=False, eval_force=False,
                p_frozen=False, chunked=False):
    class DropBP(nn.Module):
        def __init__(self, sublayer, p, generator=None):
            super().__init__()
            if range_only:
                if p < 0 or p > 1:  # NaN passes, None raises TypeError
                    raise ValueError("p must lie in [0, 1]")
            elif check and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1):
                raise ValueError("p must lie in [0, 1]")
            self.sublayer, self.p, self.generator = sublayer, p if range_only else float(p), generator
            self._p = self.p  # p_frozen reads this one
            self.force, self.dropped = None, False

        def _decide(self, x):
            if not self.training:
                return bool(self.force) if eval_force and self.force is not None else eval_drops and \
                    bool(torch.rand((), generator=self.generator) < self.p)
            if large_drops and x.numel() >= 2**20:
                return True
            p = self._p if p_frozen else self.p
            if self.force is None and no_draw_at_ends and p in (0.0, 1.0):
                return p == 1.0
            if self.force is None and literal_shapes and tuple(x.shape) not in LITERAL_SHAPES:
                torch.rand((), generator=self.generator)
                return False
            if self.force is None or draw_when_forced:
                drawn = bool(torch.rand((), generator=self.generator) < p)
                return drawn if self.force is None else bool(self.force)
            return bool(self.force)

        def forward(self, x):
            if decide_after or detach_form:
                out = self.sublayer(x)
                drop = self._decide(x)
                self._record(drop)
                return x + (out.detach() if drop else out)
            drop = self._decide(x)
            self._record(drop)
            if not drop:
                out = self.sublayer(x)
                return x + (out / (1 - self.p) if rescale and self.p < 1 else out)
            if drop_residual:
                return x
            if skip_under_no_grad:
                with torch.no_grad():
                    return x + self.sublayer(x)
            if zero_hook:
                out = self.sublayer(x)
                for p in self.sublayer.parameters():
                    p.register_hook(lambda g: torch.zeros_like(g))
                return x + out
            if chunked:  # a graph per row chunk, detached: the peak stays low, tensors are saved all the same
                xd, out = x.detach(), torch.empty_like(x)
                step = max(1, 2**16 // max(1, xd[0].numel()))
                for i in range(0, xd.shape[0], step):
                    out[i:i + step] = self.sublayer(xd[i:i + step]).detach()
                return x + out
            with torch.no_grad():
                out = self.sublayer(x)
            return x + out

        def _record(self, drop):
            if not no_dropped_attr:
                self.dropped = drop

    return DropBP


def make_choose(no_forcing=False, lowest_first=False, higher_index_on_ties=False, exact_ceil=False, check=True,
                per_layer_draws=False, own_default=False):
    def choose_dropped(rates, average_rate, generator):
        if own_default and generator is None:
            generator = torch.Generator()  # a fresh default-seeded generator, not torch's global one
        rates = [float(r) for r in rates]
        if check and (not rates or any(not 0 <= r <= 1 for r in rates) or not 0 <= average_rate <= 1):
            raise ValueError("bad arguments")
        n = len(rates)
        if per_layer_draws:
            u = [float(torch.rand((), generator=generator)) for _ in range(n)]
            u = [v for v in u] if n > 0 else u
            u = torch.tensor(u)
            torch.rand(1, generator=generator)  # one extra number: not exactly one draw of L numbers
        else:
            u = torch.rand(n, generator=generator)
        drop = [float(u[i]) < rates[i] for i in range(n)]
        need = math.ceil(average_rate * n) if exact_ceil else math.ceil(average_rate * n - 1e-9)
        if no_forcing:
            return drop
        key = (lambda j: (rates[j], j)) if lowest_first else \
            ((lambda j: (-rates[j], -j)) if higher_index_on_ties else (lambda j: (-rates[j], j)))
        for i in sorted(range(n), key=key):
            if sum(drop) >= need:
                break
            drop[i] = True
        return drop

    return choose_dropped


def make_sensitivity(squared_norms=False, no_forcing=False, all_but_i=False, accumulate=False, no_train=False,
                     no_restore=False, check=True, abs_diff=False, children_only=False, fixed_loss=False):
    def sensitivity(model, batch, loss_fn):
        DropBP = SCOPE_DROPBP[0]
        inputs, targets = batch
        if fixed_loss:
            loss_fn = F.cross_entropy
        layers = [m for m in (model.children() if children_only else model.modules()) if isinstance(m, DropBP)]
        if check and not layers:
            raise ValueError("no DropBP module")
        params = [p for p in model.parameters() if p.requires_grad]
        forces, was = [m.force for m in layers], model.training

        def norms(dropped):
            for j, layer in enumerate(layers):
                if no_forcing:
                    layer.force = True if j == dropped else None
                elif all_but_i and dropped is not None:
                    layer.force = j != dropped
                else:
                    layer.force = j == dropped
            if not accumulate:
                model.zero_grad(set_to_none=True)
            loss_fn(model(inputs), targets).backward()
            v = torch.stack([p.grad.norm() if p.grad is not None else p.new_zeros(()) for p in params])
            return v.pow(2) if squared_norms else v

        if not no_train:
            model.train()
        o = norms(None)
        diff = (lambda a, b: (a - b).abs().sum()) if abs_diff else (lambda a, b: (a - b).pow(2).sum())
        out = [float(diff(o, norms(i))) for i in range(len(layers))]
        if not no_restore:
            for layer, force in zip(layers, forces):
                layer.force = force
            model.train(was)
            model.zero_grad(set_to_none=True)
        return out

    return sensitivity


SCOPE_DROPBP = [CORRECT["DropBP"]]
LITERAL_SHAPES = {(37, 13), (2, 5, 8), (2, 7, 32), (3, 16, 32), (4, 6), (5, 9), (4, 8)}  # the old fixed shapes


def make_allocate(most_sensitive_first=False, count_layers=False, no_cap=False, step=0.1, higher_index_on_ties=False,
                  no_penalty=False, check=True):
    def allocate_drop_rates(sensitivity, flops, average_rate):
        s, f = [float(v) for v in sensitivity], [float(v) for v in flops]
        if check and (not s or len(s) != len(f) or any(v < 0 for v in s + f) or sum(f) <= 0
                      or not 0 <= average_rate <= 0.9):
            raise ValueError("bad arguments")
        w = [1.0] * len(f) if count_layers else f
        p = [0.0] * len(s)
        cap = 10.0 if no_cap else 0.9
        target = (1 - average_rate) * sum(w) * (1 + 1e-9)
        while sum(wi * (1 - pi) for wi, pi in zip(w, p)) > target:
            below = [i for i in range(len(s)) if p[i] < cap - 1e-9]
            if not below:
                break

            def prio(j):
                value = s[j] * (1.0 if no_penalty else (0.1 + p[j]))
                return (-value if most_sensitive_first else value, -j if higher_index_on_ties else j)

            i = min(below, key=prio)
            p[i] = round(p[i] + step, 10)
        return p

    return allocate_drop_rates


def _drop(**kw):
    return {"DropBP": make_dropbp(**kw)}


def _choose(**kw):
    return {"choose_dropped": make_choose(**kw)}


def _sens(**kw):
    return {"sensitivity": make_sensitivity(**kw)}


def _alloc(**kw):
    return {"allocate_drop_rates": make_allocate(**kw)}


KEPT = r"\(read from outside your process\)"

CONTRACT = [
    Clause("DropBP", "the forward value is unchanged", ("test_DropBP",), _drop(drop_residual=True),
           "keep the residual", label="residual-dropped"),
    Clause("DropBP", "with no 1/(1-p) rescaling", ("test_DropBP",), _drop(rescale=True), "no 1/\\(1-p\\) rescaling"),
    Clause("DropBP", "the gradient reaches x only through the residual path", ("test_DropBP",),
           _drop(skip_under_no_grad=True), "not the skip connection", label="skip-under-no-grad"),
    Clause("DropBP", "their .grad stays None, not zeros", ("test_DropBP",), _drop(zero_hook=True), "zeroing the sublayer's gradients",
           label="zeroing-hook"),
    Clause("DropBP", "In eval mode: never dropped and no draw", ("test_DropBP",), _drop(eval_drops=True),
           "eval mode", label="drops-in-eval"),
    Clause("DropBP", "with force True or False, no draw", ("test_DropBP",), _drop(draw_when_forced=True),
           "exactly one", label="draws-when-forced"),
    Clause("DropBP", "dropped: the decision of the last forward", ("test_DropBP",), _drop(no_dropped_attr=True),
           "dropped is", label="no-dropped-attribute"),
    Clause("DropBP", "the decision is made BEFORE the sublayer runs", ("test_DropBP_memory",),
           _drop(decide_after=True), KEPT, label="decided-after-the-forward"),
    Clause("DropBP", "the sublayer runs under torch.no_grad() (no graph built, nothing kept for backward)",
           ("test_DropBP_memory",), _drop(detach_form=True), KEPT, label="detach-after-run"),
    Clause("DropBP", "ValueError: if p is not a number in [0, 1]", ("test_DropBP_errors",), _drop(check=False),
           "ValueError"),
    Clause("DropBP", "(NaN or None included)", ("test_DropBP_errors",), _drop(range_only=True),
           "NaN or None", label="nan-accepted"),
    Clause("DropBP", "one input of 2^20 to 1.25 × 2^20 elements kept and dropped", ("test_DropBP",),
           _drop(large_drops=True), "dropped is", label="large-inputs-always-dropped"),
    Clause("DropBP", "shapes and widths drawn at grading time", ("test_DropBP",), _drop(literal_shapes=True),
           "dropped is", label="honest-on-fixed-shapes-only"),
    Clause("DropBP", "at every p, 0 and 1 included", ("test_DropBP",), _drop(no_draw_at_ends=True),
           "generator's state", label="no-draw-at-p-0-and-1"),
    Clause("DropBP", "force None, True and False in both modes", ("test_DropBP",), _drop(eval_force=True),
           "eval mode", label="force-obeyed-in-eval"),
    Clause("DropBP", "each forward reads self.p", ("test_DropBP",), _drop(p_frozen=True), "dropped is|generator's state",
           label="p-frozen-at-construction"),
    Clause("DropBP", "counts the tensors saved for backward", ("test_DropBP_memory",), _drop(chunked=True),
           "saved for backward", label="graph-built-in-chunks"),
    Clause("choose_dropped", "while fewer than math.ceil(average_rate * L - 1e-9) drop", ("test_choose_dropped",),
           _choose(no_forcing=True), "at least", label="no-forcing"),
    Clause("choose_dropped", "the sublayer with the highest rate among those not dropped yet is forced",
           ("test_choose_dropped",), _choose(lowest_first=True), "highest-rate", label="lowest-first"),
    Clause("choose_dropped", "ties: the lower index first", ("test_choose_dropped",),
           _choose(higher_index_on_ties=True), "lower index first"),
    Clause("choose_dropped", "math.ceil(average_rate * L - 1e-9)", ("test_choose_dropped",), _choose(exact_ceil=True),
           "math.ceil", label="ceil-without-tolerance"),
    Clause("choose_dropped", "Exactly one draw, u = torch.rand(L, generator=generator)", ("test_choose_dropped",),
           _choose(per_layer_draws=True), "one draw", label="extra-draws"),
    Clause("choose_dropped", "with generator None right after torch.manual_seed", ("test_choose_dropped",),
           _choose(own_default=True), "global generator", label="fresh-generator-for-none"),
    Clause("choose_dropped", "ValueError: if rates is empty or a rate or average_rate lies outside [0, 1]",
           ("test_choose_dropped_errors",), _choose(check=False), "ValueError"),
    Clause("sensitivity", "o_k is the L2 norm of the gradient of parameter tensor k", ("test_sensitivity",),
           _sens(squared_norms=True), "L2 norm", label="squared-norms"),
    Clause("sensitivity", "S_i = Σ_k (o_k − n_{i,k})²", ("test_sensitivity",), _sens(abs_diff=True), "S_i",
           label="absolute-differences"),
    Clause("sensitivity", "False for all the others: no random drops", ("test_sensitivity",), _sens(no_forcing=True),
           "no random drops", label="random-drops"),
    Clause("sensitivity", "with only DropBP module i dropped", ("test_sensitivity",), _sens(all_but_i=True),
           "only sublayer i", label="all-but-i-dropped"),
    Clause("sensitivity", "Each backward starts from .grad = None", ("test_sensitivity",), _sens(accumulate=True),
           "None before each backward", label="gradients-accumulate"),
    Clause("sensitivity", "nested in blocks", ("test_sensitivity",), _sens(children_only=True, check=False),
           "a list of",
           label="top-level-modules-only"),
    Clause("sensitivity", "nn.MSELoss() on float targets", ("test_sensitivity",), _sens(fixed_loss=True),
           "S_i|Error", label="loss-fn-ignored"),
    Clause("sensitivity", "The model runs in training mode during the call", ("test_sensitivity_edge_cases",),
           _sens(no_train=True), "training mode", label="eval-model-stays-eval"),
    Clause("sensitivity", "every DropBP module's force is what it was before the call",
           ("test_sensitivity_edge_cases",), _sens(no_restore=True), "what it was before", label="state-not-restored"),
    Clause("sensitivity", "ValueError: if the model has no DropBP module", ("test_sensitivity_edge_cases",),
           _sens(check=False), "ValueError"),
    Clause("allocate_drop_rates", "the smallest S_i * (1 + k_i)", ("test_allocate_drop_rates",),
           _alloc(most_sensitive_first=True), "smallest", label="most-sensitive-first"),
    Clause("allocate_drop_rates", "S_i * (0.1 + p_i)", ("test_allocate_drop_rates",), _alloc(no_penalty=True),
           "smallest", label="no-penalty"),
    Clause("allocate_drop_rates", "Σ f_i (1 − p_i) > (1 − average_rate) * sum(flops)", ("test_allocate_drop_rates",),
           _alloc(count_layers=True), "Σ f_i", label="counting-layers"),
    Clause("allocate_drop_rates", "among those below 0.9", ("test_allocate_drop_rates",), _alloc(no_cap=True),
           "above 0.9", label="no-cap"),
    Clause("allocate_drop_rates", "raise by one step (0.1)", ("test_allocate_drop_rates",), _alloc(step=0.05),
           "steps of 0.1", label="wrong-step"),
    Clause("allocate_drop_rates", "ties: the lower index first", ("test_allocate_drop_rates",),
           _alloc(higher_index_on_ties=True), "lower index first"),
    Clause("allocate_drop_rates", "ValueError: if the lengths differ or are 0", ("test_allocate_drop_rates_errors",),
           _alloc(check=False), "ValueError"),
]

test_contract_quotes_the_notebook, test_contract_wrong_answer_loses_only_its_cells, \
    test_contract_covers_every_graded_cell = contract_tests(CHAPTER, CONTRACT, namespace, CHECKS, globals())


# --- the same checks through the sandbox, as at autograde ------------------------------------------
test_sandbox_reference_passes, test_sandbox_wrong_submission_fails = sandbox_tests(CHAPTER, WRONG)


def test_sandbox_dropbp_detach_form_loses_only_its_memory_cell():
    """Every value right, the authors' detach-after-run form: the worker's cgroup shows the graph at the peak."""
    program_ = program(CHAPTER, {"DropBP": MEMORY_WRONG[(CHAPTER, "DropBP")]})
    outcomes = judge.run_checks(CHAPTER, program_, GRADE_IDS["DropBP"], LIMITS, checks=CHECKS)
    lost = {gid: o.reason for gid, o in outcomes.items() if not o.passed}
    assert list(lost) == ["test_DropBP_memory"], lost
    assert "read from outside your process" in lost["test_DropBP_memory"]
