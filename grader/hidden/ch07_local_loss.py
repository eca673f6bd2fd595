"""Hidden tests of ch07_local_loss: similarity_matrix, predsim_loss, local_training_step, bp_schedule,
dgl_schedule.

Every reference is written here from the formulas (float64 autograd; the schedules by an event
simulation in exact fractions) and compared with values fetched from the student's process.
Nothing measured inside that process decides a point: local_training_step's memory cell reads the
worker's cgroup peak during two steps, one of few blocks and one of many (every size drawn at
grading time), each against the peak of the course's own local backward of one block
(probes.ch07_block_step) on the same batch, with the losses and parameters of that step checked
against the reference. A wrong value is diagnosed against the
plausible mistakes (no centring, no normalisation, std over space skipped, beta on the wrong
term, missing detach, the loss on the dropped-out output, a block waiting for the previous
block's backward, ...) so that the message names the property that failed.
"""
from __future__ import annotations

import copy
from fractions import Fraction

import torch
import torch.nn.functional as F
from torch import nn

from coursekit.checks import check_close, same_close
from grader import probes
from grader.api import fetch, hidden_test
from grader.resources import GROWTH, Meter, MiB, draw, fresh_tensor, mib, new_seed, seeded

TOL = dict(atol=1e-9, rtol=1e-7)  # float64 throughout: the mistakes we look for are >= 1e-3
STEP_TOL = dict(atol=1e-7, rtol=1e-6)
# Added to every seed the similarity and predsim checks draw from (0 at grading): the tests grade every variant the
# text allows over several offsets.
SEED_OFFSET = 0


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed + SEED_OFFSET)


def _raises_value_error(nb, fn_name: str, *args) -> bool:
    names = fetch(nb.apply(probes.raised, nb[fn_name], *args))
    return names is not None and "ValueError" in names


def _close(got, refs: list[torch.Tensor]) -> bool:
    """``got`` within TOL of the band the allowed variants span (see _allowed_tol)."""
    return same_close(got.double(), refs[0], **_allowed_tol(refs))


def _allowed_tol(refs: list[torch.Tensor]) -> dict:
    """TOL widened by how far the references of the variants the text allows lie apart (biased or unbiased std:
    the scale cancels but for the 1e-8 beside the norm): any of them passes, a mistake (>= 1e-3) does not."""
    spread = max((float((r - refs[0]).abs().max()) for r in refs[1:]), default=0.0)
    return dict(atol=TOL["atol"] + 2 * spread, rtol=TOL["rtol"])


# --- similarity_matrix ------------------------------------------------------------------------------
def _rows(h: torch.Tensor, std_over_space: bool = True, biased: bool = False) -> torch.Tensor:
    if std_over_space and _uses_std(h):
        flat = h.reshape(h.shape[0], h.shape[1], -1)
        mean = flat.mean(dim=2, keepdim=True)
        var = ((flat - mean) ** 2).sum(dim=2) / (flat.shape[2] - (0 if biased else 1))
        return var.sqrt()
    return h.reshape(h.shape[0], -1)


def _uses_std(h: torch.Tensor) -> bool:
    return h.dim() == 4 and h.shape[1] > 3 and h.shape[2] * h.shape[3] > 1


def _similarity(h: torch.Tensor, centre: bool = True, normalise: bool = True, eps: float = 1e-8,
                detach_norm: bool = False, **rows) -> torch.Tensor:
    """S(h) from the formula: rows, centred, divided by eps + norm, Gram, clamped. ``rows``: std_over_space, biased
    (the variants of the rows); eps = 0 and detach_norm are mistakes the diagnosis looks for."""
    z = _rows(h, **rows)
    if centre:
        z = z - z.sum(dim=1, keepdim=True) / z.shape[1]
    if normalise:
        norm = (z * z).sum(dim=1, keepdim=True).sqrt()
        z = z / (eps + (norm.detach() if detach_norm else norm))
    return torch.clamp(z @ z.transpose(0, 1), -1.0, 1.0)


ALLOWED_STD = ({"biased": False}, {"biased": True})  # "biased or unbiased gives the same S"

_SIM_MISTAKES = {
    "the rows are not centred: subtract each row's mean over its features before normalising":
        dict(centre=False),
    "the rows are not normalised: divide each centred row by 1e-8 + its L2 norm":
        dict(normalise=False),
    "neither centred nor normalised: centre each row, then divide it by 1e-8 + its norm":
        dict(centre=False, normalise=False),
}
EPS_HINT = ("S matches the formula without the 1e-8: divide each centred row by 1e-8 + its L2 norm (torch.corrcoef, "
            "F.normalize and F.cosine_similarity leave the 1e-8 out or use max(norm, eps) instead), which is what "
            "keeps a constant row at zeros")
DETACHED_NORM_HINT = ("the gradient is that of S with the norm detached: the division by 1e-8 + the norm must stay "
                      "in the graph (no .detach(), .item() or numpy inside S)")


def _sim_hint(h: torch.Tensor, got: torch.Tensor, default: str) -> str:
    for hint, kw in _SIM_MISTAKES.items():
        if got.shape == (h.shape[0], h.shape[0]) and same_close(got, _similarity(h, **kw), atol=1e-6):
            return hint
    if got.shape == (h.shape[0], h.shape[0]) and any(_close(got, [_similarity(h, eps=0.0, **kw)]) for kw in ALLOWED_STD):
        return EPS_HINT
    if h.dim() == 3 and any(_close(got, [_similarity(h.unsqueeze(2), **kw)]) for kw in ALLOWED_STD):
        return ("a 3-D h was reduced to stds over its last dimension: only a 4-D map (B, C, H, W) with C > 3 and "
                "H * W > 1 is; every 3-D h is flattened to (B, -1)")
    return default


def _sim_grad(h: torch.Tensor, grad_out: torch.Tensor, **kw) -> torch.Tensor:
    x = h.clone().requires_grad_(True)
    _similarity(x, **kw).backward(grad_out)
    return x.grad


def _sim_grad_hint(h: torch.Tensor, grad_out: torch.Tensor, got: torch.Tensor, default: str) -> str:
    """The diagnosis of a gradient that differs while the values pass: named only when observed."""
    for hint, kw in ((EPS_HINT, dict(eps=0.0)), (DETACHED_NORM_HINT, dict(detach_norm=True))):
        if _close(got, [_sim_grad(h, grad_out, **kw, **std) for std in ALLOWED_STD]):
            return hint
    return default


def _check_similarity_call(nb, h: torch.Tensor, what: str, hint: str, grads: bool = True, **rows) -> None:
    grad_out = torch.randn(h.shape[0], h.shape[0], generator=_gen(h.numel()), dtype=h.dtype)
    res = fetch(nb.apply(probes.ch07_run, nb.similarity_matrix, [h], grad_out=grad_out))
    if res["type"] != "Tensor":
        raise AssertionError(f"{what}: similarity_matrix returned a {res['type']}, expected a (B, B) tensor")
    if res["shape"] != [h.shape[0], h.shape[0]]:
        raise AssertionError(f"{what}: similarity_matrix returned shape {tuple(res['shape'])}, expected "
                             f"({h.shape[0]}, {h.shape[0]}): one similarity per pair of examples")
    variants = ALLOWED_STD if rows.get("std_over_space", True) and _uses_std(h) else ALLOWED_STD[:1]
    refs = [_similarity(h, **rows, **v) for v in variants]
    got = res["value"]
    if not _close(got, refs):
        check_close(got.double(), refs[0], f"{what}: the similarity matrix", _sim_hint(h, got.double(), hint),
                    **_allowed_tol(refs))
    if not grads:
        return
    if not res["attached"] or res["grads"][0] is None:
        raise AssertionError(f"{what}: no gradient reaches h: S must stay differentiable (no .detach(), "
                             "no .item(), no numpy)")
    ref_grads = [_sim_grad(h, grad_out, **rows, **v) for v in variants]
    if not _close(res["grads"][0], ref_grads):
        check_close(res["grads"][0].double(), ref_grads[0],
                    f"{what}: the gradient of the similarity matrix with respect to h",
                    _sim_grad_hint(h, grad_out, res["grads"][0].double(),
                                   "the values pass but the gradient does not: compute S exactly as the formula says "
                                   "(centre, divide by 1e-8 + the norm, Gram, clamp)"),
                    **_allowed_tol(ref_grads))


@hidden_test("test_similarity_matrix_values")
def check_similarity_matrix_values(nb):
    g = _gen(70)
    flat_hint = ("a 2-D or 3-D h is flattened to (B, -1); each row is centred, divided by 1e-8 + its norm, and "
                 "S = Z Z^T clamped to [-1, 1]")
    cases = [
        ("h of shape (37, 53)", torch.randn(37, 53, generator=g, dtype=torch.float64)),
        ("h of shape (37, 53) with rows shifted and scaled",
         torch.randn(37, 53, generator=g, dtype=torch.float64) * torch.rand(37, 1, generator=g, dtype=torch.float64) * 9
         + torch.randn(37, 1, generator=g, dtype=torch.float64) * 5),
        ("a 3-D h of shape (5, 2, 7)", torch.randn(5, 2, 7, generator=g, dtype=torch.float64)),
        # 3-D with more than 3 "channels": still flattened (only a 4-D map is reduced to stds)
        ("a 3-D h of shape (6, 9, 4)", torch.randn(6, 9, 4, generator=g, dtype=torch.float64) * 2 + 1),
        ("one-hot labels, 37 examples of 7 classes", F.one_hot(torch.arange(37) % 7, 7).double()),
    ]
    for what, h in cases:
        _check_similarity_call(nb, h, what, flat_hint)


@hidden_test("test_similarity_matrix_conv")
def check_similarity_matrix_conv(nb):
    g = _gen(71)
    std_hint = ("a (B, C, H, W) map with C > 3 and H * W > 1 is first reduced to each channel's standard deviation "
                "over its H * W positions, a (B, C) matrix")
    cases = [
        ("a conv map of shape (6, 5, 4, 3)", torch.randn(6, 5, 4, 3, generator=g, dtype=torch.float64), std_hint),
        ("a conv map of shape (37, 7, 5, 3)", torch.randn(37, 7, 5, 3, generator=g, dtype=torch.float64) * 3 + 1,
         std_hint),
        ("a conv map of shape (3, 6, 1, 5) (H = 1 but H * W = 5)", torch.randn(3, 6, 1, 5, generator=g,
                                                                              dtype=torch.float64),
         std_hint + "; the condition is on H * W, not on H alone"),
        ("a conv map with C = 3 channels, shape (4, 3, 5, 5)", torch.randn(4, 3, 5, 5, generator=g, dtype=torch.float64),
         "with C <= 3 channels the map is flattened to (B, C * H * W), not reduced to stds"),
        ("a conv map with H * W = 1, shape (4, 8, 1, 1)", torch.randn(4, 8, 1, 1, generator=g, dtype=torch.float64),
         "with H * W = 1 there is no std over space: the map is flattened to (B, C)"),
    ]
    for what, h, hint in cases:
        got = fetch(nb.apply(probes.ch07_run, nb.similarity_matrix, [h]))
        if got.get("type") == "Tensor" and got["shape"] == [h.shape[0]] * 2 and h.shape[2] * h.shape[3] > 1 \
                and h.shape[1] > 3:
            value = got["value"].double()
            if same_close(value, _similarity(h, std_over_space=False), atol=1e-6):
                raise AssertionError(f"{what}: the map was flattened. {std_hint}")
        _check_similarity_call(nb, h, what, hint)


@hidden_test("test_similarity_matrix_edge_cases")
def check_similarity_matrix_edge_cases(nb):
    g = _gen(72)
    one = torch.randn(1, 9, generator=g, dtype=torch.float64)
    _check_similarity_call(nb, one, "a batch of one example, shape (1, 9)", "a single example: S is (1, 1)",
                           grads=False)
    const = torch.randn(6, 11, generator=g, dtype=torch.float64)
    const[2] = 4.0
    res = fetch(nb.apply(probes.ch07_run, nb.similarity_matrix, [const]))
    if res["type"] != "Tensor" or not torch.isfinite(res["value"]).all():
        raise AssertionError("a batch with a constant row gave non-finite values: a constant row centres to zeros; "
                             "divide by 1e-8 + its norm (not by the norm alone) so that it stays finite")
    _check_similarity_call(nb, const, "a batch with a constant row", "a constant row becomes zeros: its similarities "
                           "are 0", grads=False)
    wide = torch.randn(37, 53, generator=g) * 1e3  # float32, large values: rounding can leave |S| > 1
    res = fetch(nb.apply(probes.ch07_run, nb.similarity_matrix, [wide]))
    if res["type"] != "Tensor" or res["dtype"] != "torch.float32":
        raise AssertionError(f"a float32 h gave {res.get('dtype', res['type'])}: keep h's dtype")
    if res["value"].abs().max() > 1:
        raise AssertionError(f"similarities must lie in [-1, 1] (clamp the Gram matrix), got "
                             f"{res['value'].abs().max().item():.9f}")
    for shape in ((5,), ()):
        if not _raises_value_error(nb, "similarity_matrix", torch.randn(shape, generator=g)):
            raise AssertionError(f"similarity_matrix on a tensor of shape {shape} should raise ValueError: it needs a "
                                 "batch of rows, (B, ...) with at least 2 dimensions")


# --- predsim_loss ----------------------------------------------------------------------------------
def _predsim(h, y, sim_head, pred_head, classes, beta, wrong: str | None = None, biased: bool = False):
    """The loss from the formula; ``wrong`` builds a known mistake for the diagnosis, ``biased`` the std variant."""
    logits = pred_head((h.detach() if wrong == "pred h detached" else h).reshape(h.shape[0], -1))
    pred = -(logits.log_softmax(dim=1)[torch.arange(len(y)), y]).mean()
    width = int(y.max()) + 1 if wrong == "width" else classes
    onehot = torch.zeros(len(y), width, dtype=torch.float32 if wrong == "onehot32" else h.dtype)
    onehot[torch.arange(len(y)), y] = 1
    sim_in = h if wrong == "sim on h" else sim_head(h.detach() if wrong == "sim h detached" else h)
    eps = 0.0 if wrong == "no eps" else 1e-8
    diff = _similarity(sim_in, eps=eps, biased=biased) - _similarity(onehot, eps=eps).to(h.dtype)
    sim = (diff * diff).sum() / diff.numel()
    if wrong == "swapped":
        return beta * pred + (1 - beta) * sim
    if wrong == "sum mse":
        sim = (diff * diff).sum()
    return (1 - beta) * pred + beta * sim


_PREDSIM_MISTAKES = {
    "swapped": "beta weighs the wrong term: the loss is (1 - beta) * L_pred + beta * L_sim (beta = 0.99 puts the "
               "weight on the similarity loss)",
    "sim on h": "the similarity loss must compare S(sim_head(h)), not S(h), with S(one-hot y)",
    "sum mse": "L_sim is the mean squared error over the B x B entries (F.mse_loss), not their sum",
    "no eps": "the loss is that of S without the 1e-8: compute L_sim with similarity_matrix (1e-8 + the norm), not "
              "torch.corrcoef, F.normalize or F.cosine_similarity",
    "width": "the one-hot labels have num_classes columns (F.one_hot(y, num_classes)), also when the batch lacks the "
             "last classes: without num_classes F.one_hot makes max(y) + 1 columns, which changes S(onehot)",
}
# Mistakes whose values pass (or nearly) and whose gradients do not: each hint is given only when the gradients match
# that mistake's.
_PREDSIM_GRAD_MISTAKES = {
    "sim h detached": "the gradient is that of a loss whose similarity term does not reach h (h detached before "
                      "sim_head): keep every step differentiable, no detach inside the loss",
    "pred h detached": "the gradient is that of a loss whose prediction term does not reach h (h detached before "
                       "pred_head): keep every step differentiable, no detach inside the loss",
    "no eps": "the gradients are those of S without the 1e-8: compute L_sim with similarity_matrix (1e-8 + the norm), "
              "not torch.corrcoef, F.normalize or F.cosine_similarity",
}
ONEHOT32_HINT = ("the gradients differ by about as much as rounding S(onehot) to float32 does: make the one-hot labels "
                 "in h's dtype (F.one_hot(y, num_classes).to(h.dtype))")


def _heads(kind: str, d: int, classes: int, seed: int, conv_channels: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + SEED_OFFSET)
        if kind == "linear":
            sim_head, pred_head = nn.Linear(d, d, bias=False), nn.Linear(d, classes)
        else:
            sim_head = nn.Conv2d(conv_channels, conv_channels, 3, padding=1, bias=False)
            pred_head = nn.Linear(d, classes)
    return sim_head.double(), pred_head.double()


def _predsim_ref(h, y, sim_head, pred_head, classes, beta, **kw) -> dict:
    """Value, gradient with respect to h and the heads' parameter gradients of the formula (or of a variant)."""
    sh, ph = copy.deepcopy(sim_head), copy.deepcopy(pred_head)
    x = h.clone().requires_grad_(True)
    loss = _predsim(x, y, sh, ph, classes, beta, **kw)
    loss.backward()
    return {"value": loss.detach(), "h": x.grad,
            "params": [{n: p.grad for n, p in m.named_parameters()} for m in (sh, ph)]}


def _grad_pairs(res: dict, refs: list[dict]):
    """(label, got, [the variants' references]) for h and every parameter either side has a gradient for."""
    yield "h", res["grads"][0], [r["h"] for r in refs]
    for i, label in enumerate(("sim_head", "pred_head")):
        for name in refs[0]["params"][i]:
            want = [r["params"][i][name] for r in refs]
            got = res["param_grads"][i][name]
            if got is None and all(w is None or not w.abs().max() > 0 for w in want):
                continue  # no gradient where the formula's is zero (beta = 0 or 1 may skip a term): the same thing
            yield f"{label}.{name}", got, [torch.zeros_like(got) if w is None else w for w in want]


def _grads_close(res: dict, refs: list[dict]) -> bool:
    return all(got is not None and _close(got, want) for _, got, want in _grad_pairs(res, refs))


def _grads_nearer(res: dict, right: dict, wrong: dict) -> bool:
    """The mistake is observed: every gradient lies much nearer the mistake's than the right one (the two float32
    one-hots of different code differ by rounding, so an exact match is not asked for)."""
    differs = False
    for _, got, (r, w) in _grad_pairs(res, [right, wrong]):
        gap = float((w - r).abs().max())
        if got is None or float((got.double() - w).abs().max()) > 0.25 * gap + TOL["atol"]:
            return False
        differs = differs or gap > 10 * TOL["atol"]
    return differs


def _grads_within(res: dict, right: dict, wrong: dict) -> bool:
    """Every gradient is off by at most a few times what the mistake changes (float32 rounding goes either way, so
    two float32 one-hots of different code need not agree with each other)."""
    return all(got is not None and float((got.double() - r).abs().max()) <= 4 * float((w - r).abs().max()) + TOL["atol"]
               for _, got, (r, w) in _grad_pairs(res, [right, wrong]))


def _check_predsim_case(nb, what, h, y, sim_head, pred_head, classes, beta, default_hint, use_default=False):
    heads = nb.put((sim_head, pred_head))  # one message: the handles below name these two modules
    args = (heads[0], heads[1], classes) if use_default else (heads[0], heads[1], classes, beta)
    res = fetch(nb.apply(probes.ch07_run, nb.predsim_loss, [h, y], *args, modules=(heads[0], heads[1])))
    if res["type"] != "Tensor" or res["shape"] != []:
        raise AssertionError(f"{what}: predsim_loss returned {res['type']} of shape {res.get('shape')}, expected a "
                             "0-dim tensor")
    # The variants the text allows: the std over space biased or unbiased (a conv sim head's output).
    refs = [_predsim_ref(h, y, sim_head, pred_head, classes, beta, biased=b) for b in (False, True)]
    got = res["value"].double()
    values = [r["value"] for r in refs]
    if not _close(got, values):
        hint = default_hint
        for wrong, text in _PREDSIM_MISTAKES.items():
            if same_close(got, _predsim(h, y, sim_head, pred_head, classes, beta, wrong).detach(), **TOL):
                hint = text
                break
        check_close(got, values[0], f"{what}: the loss", hint, **_allowed_tol(values))
    if not res["attached"]:
        raise AssertionError(f"{what}: the loss is detached: it must back-propagate into h and both heads")
    if res["grads"][0] is None:
        raise AssertionError(f"{what}: no gradient reaches h")
    if _grads_close(res, refs):
        return
    grad_hint = ("the value passes but a gradient does not: compute both terms exactly as the formula says, every "
                 "step differentiable")
    for wrong, text in _PREDSIM_GRAD_MISTAKES.items():
        if _grads_nearer(res, refs[0], _predsim_ref(h, y, sim_head, pred_head, classes, beta, wrong=wrong)):
            grad_hint = text
            break
    else:
        if _grads_within(res, refs[0], _predsim_ref(h, y, sim_head, pred_head, classes, beta, wrong="onehot32")):
            grad_hint = ONEHOT32_HINT
    for label, got_g, want in _grad_pairs(res, refs):
        if got_g is None:
            raise AssertionError(f"{what}: {label} got no gradient: call the head inside the loss")
        if not _close(got_g, want):
            check_close(got_g.double(), want[0], f"{what}: the gradient {'with respect to' if label == 'h' else 'of'} "
                        f"{label}", grad_hint, **_allowed_tol(want))


@hidden_test("test_predsim_loss_values")
def check_predsim_loss_values(nb):
    g = _gen(73)
    B, D, C = 37, 53, 7
    for beta, seed in ((0.99, 1), (0.5, 2), (0.3, 3)):
        h = torch.randn(B, D, generator=g, dtype=torch.float64)
        y = torch.randint(0, C, (B,), generator=g)
        sim_head, pred_head = _heads("linear", D, C, seed)
        _check_predsim_case(nb, f"h (37, 53), 7 classes, beta={beta}", h, y, sim_head, pred_head, C, beta,
                            "loss = (1 - beta) * F.cross_entropy(pred_head(h.flatten(1)), y) + beta * "
                            "F.mse_loss(S(sim_head(h)), S(one_hot(y)))")
    # A batch whose similarities already match its labels' (h is the scaled one-hot plus a little noise, the sim head
    # the identity): L_sim is tiny, so its gradient shows S(onehot) to the last digits (a float32 one-hot, a missing
    # 1e-8 are thousands of tolerances off here).
    B, C = 12, 5
    y = torch.randperm(B, generator=g) % C
    h = (F.one_hot(y, C).double() + 1e-6 * torch.randn(B, C, generator=g, dtype=torch.float64)) * 1e-3
    sim_head, pred_head = _heads("linear", C, C, 4)
    with torch.no_grad():
        sim_head.weight.copy_(torch.eye(C, dtype=torch.float64))
    _check_predsim_case(nb, "a batch of 12 whose similarities already match its 5 classes' (sim_head the identity), "
                        "beta=0.99", h, y, sim_head, pred_head, C, 0.99,
                        "L_sim = F.mse_loss(similarity_matrix(sim_head(h)), similarity_matrix(onehot)), onehot in h's "
                        "dtype")


@hidden_test("test_predsim_loss_conv")
def check_predsim_loss_conv(nb):
    g = _gen(74)
    h = torch.randn(6, 5, 4, 3, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 3, 3, 1, 6, 0])
    sim_head, pred_head = _heads("conv", 60, 7, 5, conv_channels=5)
    _check_predsim_case(nb, "conv h (6, 5, 4, 3), Conv2d sim head, default beta", h, y, sim_head, pred_head, 7, 0.99,
                        "for conv maps: sim_head gets h as it is (a (B, C, H, W) map, reduced to stds inside S), "
                        "pred_head gets h.flatten(1); beta defaults to 0.99", use_default=True)


@hidden_test("test_predsim_loss_edge_cases")
def check_predsim_loss_edge_cases(nb):
    g = _gen(75)
    B, D, C = 37, 53, 7
    h = torch.randn(B, D, generator=g, dtype=torch.float64)
    y = torch.randint(0, C, (B,), generator=g)
    for beta, hint in ((0.0, "beta = 0 is the cross-entropy of pred_head alone"),
                       (1.0, "beta = 1 is the similarity loss alone")):
        sim_head, pred_head = _heads("linear", D, C, 6)
        _check_predsim_case(nb, f"beta={beta}", h, y, sim_head, pred_head, C, beta, hint)
    # A batch without the last class: the one-hot still has num_classes columns.
    y_short = torch.randint(0, C - 2, (B,), generator=g)
    sim_head, pred_head = _heads("linear", D, C, 8)
    _check_predsim_case(nb, f"a batch of {B} whose labels lack the last 2 of {C} classes, beta=0.5", h, y_short,
                        sim_head, pred_head, C, 0.5, "onehot = F.one_hot(y, num_classes): num_classes columns "
                        "whatever labels the batch holds")
    sim_head, pred_head = _heads("linear", D, C, 7)
    for beta in (-0.01, 1.01, 2.0):
        if not _raises_value_error(nb, "predsim_loss", h, y, sim_head, pred_head, C, beta):
            raise AssertionError(f"predsim_loss(..., beta={beta}) should raise ValueError: beta lies in [0, 1]")
    for bad_y, what in ((y[:-1], f"{B - 1} labels for {B} examples"), (y.reshape(B, 1), "labels of shape (37, 1)")):
        if not _raises_value_error(nb, "predsim_loss", h, bad_y, sim_head, pred_head, C, 0.99):
            raise AssertionError(f"predsim_loss with {what} should raise ValueError: y is (B,), one label per example")


# --- local_training_step ----------------------------------------------------------------------------
def _network(widths: list[int], classes: int, seed: int, p: float = 0.0, scales=None):
    """ch07 probe blocks (Linear-BN-ReLU-dropout) and linear CE heads, float64."""
    scales = scales or [1.0] * (len(widths) - 1)
    blocks = [probes.ch07_Block(a, b, p=p, seed=seed + i).double() for i, (a, b) in enumerate(zip(widths, widths[1:]))]
    heads = [probes.ch07_Head(b, classes, scale=s, seed=seed + 50 + i).double()
             for i, (b, s) in enumerate(zip(widths[1:], scales))]
    return blocks, heads


def _optimizers(blocks, heads, spec):
    kind, lrs = spec
    make = {"adam": lambda ps, lr: torch.optim.Adam(ps, lr=lr),
            "sgd": lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9)}[kind]
    return [make([*b.parameters(), *h.parameters()], lr) for b, h, lr in zip(blocks, heads, lrs)]


def _reference(blocks, heads, spec, batches, mode: str = "local"):
    """Parameters and losses after training copies; mode "local" (the method), "deep" (no detach:
    one backward of the summed losses) or "after_dropout" (the loss on the dropped-out output)."""
    blocks, heads = copy.deepcopy(blocks), copy.deepcopy(heads)
    opts = _optimizers(blocks, heads, spec)
    all_losses = []
    for x, y in batches:
        inp, losses, total = x, [], 0
        for j, (block, head) in enumerate(zip(blocks, heads)):
            h, out = block(inp if mode == "deep" else inp.detach())
            loss = head(out if mode == "after_dropout" else h, y)
            losses.append(float(loss.detach()))
            if mode == "deep":
                total = total + loss
            else:
                params = [*block.parameters(), *head.parameters()]
                grads = torch.autograd.grad(loss, params)
                for p_, g_ in zip(params, grads):
                    p_.grad = g_
                opts[j].step()
            inp = out
        if mode == "deep":
            for o in opts:
                o.zero_grad()
            total.backward()
            for o in opts:
                o.step()
        all_losses.append(losses)
    return blocks, heads, all_losses


def _run_student(nb, blocks, heads, spec, batches, x_requires_grad: bool = False):
    """Send the network and its optimizers in one message, run the steps, fetch everything."""
    blocks, heads = copy.deepcopy(blocks), copy.deepcopy(heads)  # a copy: local runs share objects
    state = nb.put((blocks, heads, _optimizers(blocks, heads, spec)))
    outs = []
    x_handles = []
    for x, y in batches:
        xh = nb.put(x.clone().requires_grad_(x_requires_grad))
        x_handles.append(xh)
        outs.append(fetch(nb.apply(probes.ch07_describe, nb.local_training_step(state[0], state[1], state[2], xh, y))))
    tables = {f"block {j}": fetch(nb.apply(probes.param_table, state[0][j])) for j in range(len(blocks))}
    tables.update({f"head {j}": fetch(nb.apply(probes.param_table, state[1][j])) for j in range(len(heads))})
    x_grads = [fetch(xh.grad) for xh in x_handles]
    return outs, tables, x_grads


def _matches(tables, ref_blocks, ref_heads, tol=STEP_TOL) -> bool:
    for label, modules in (("block", ref_blocks), ("head", ref_heads)):
        for j, m in enumerate(modules):
            for name, p in m.named_parameters():
                got = tables[f"{label} {j}"][name]["value"]
                if not same_close(got.double(), p.detach(), **tol):
                    return False
    return True


def _compare_params(what, tables, ref_blocks, ref_heads, hint):
    for label, modules in (("block", ref_blocks), ("head", ref_heads)):
        for j, m in enumerate(modules):
            for name, p in m.named_parameters():
                check_close(tables[f"{label} {j}"][name]["value"].double(), p.detach(),
                            f"{what}: {label} {j}'s {name}", hint, **STEP_TOL)


def _batches(n: int, B: int, d: int, classes: int, seed: int):
    g = _gen(seed)
    return [(torch.randn(B, d, generator=g, dtype=torch.float64), torch.randint(0, classes, (B,), generator=g))
            for _ in range(n)]


DETACH_HINT = ("block {j}'s update includes the losses of the blocks above it: that is deep supervision. Feed each "
               "block the detached output of the previous one (out.detach()), so that block j learns from its own loss "
               "only")


@hidden_test("test_local_training_step_values")
def check_local_training_step_values(nb):
    cases = [  # (widths, optimizer spec, steps, seed)
        ([13, 17, 11, 9], ("adam", [0.01, 0.02, 0.05]), 2, 1),
        ([13, 19, 7], ("sgd", [0.1, 0.3]), 2, 2),
        ([13, 29, 23, 17, 11], ("adam", [0.003, 0.01, 0.02, 0.04]), 1, 3),
    ]
    for widths, spec, steps, seed in cases:
        blocks, heads = _network(widths, 5, seed)
        batches = _batches(steps, 37, widths[0], 5, 100 + seed)
        what = (f"{len(blocks)} blocks {widths}, {spec[0]} with learning rates {spec[1]}, {steps} step(s) on "
                "batches of 37")
        outs, tables, _ = _run_student(nb, blocks, heads, spec, batches)
        ref_blocks, ref_heads, _ = _reference(blocks, heads, spec, batches)
        if _matches(tables, ref_blocks, ref_heads):
            continue
        deep_blocks, deep_heads, _ = _reference(blocks, heads, spec, batches, mode="deep")
        if _matches(tables, deep_blocks, deep_heads):
            raise AssertionError(f"{what}: " + DETACH_HINT.format(j=0))
        first = _reference(blocks, heads, spec, batches[:1])
        one_step = _run_student(nb, blocks, heads, spec, batches[:1])[1]
        if steps > 1 and _matches(one_step, *first[:2]):
            hint = ("the first step is right but the second is not: gradients left by the previous call must not add "
                    "in (zero each block's gradients before its backward)")
        else:
            hint = ("block j and heads[j] must be updated by optimizers[j] alone, from block j's local loss, once per "
                    "step (each optimizer here has its own learning rate)")
        _compare_params(what, tables, ref_blocks, ref_heads, hint)


@hidden_test("test_local_training_step_detach")
def check_local_training_step_detach(nb):
    widths, spec = [13, 17, 11, 7], ("sgd", [0.05, 0.05, 0.05])
    blocks, heads = _network(widths, 5, 11, scales=[1.0, 50.0, 50.0])  # loud losses above block 0
    batches = _batches(1, 37, widths[0], 5, 111)
    what = "3 blocks, the losses of blocks 1 and 2 scaled by 50"
    _, tables, x_grads = _run_student(nb, blocks, heads, spec, batches, x_requires_grad=True)
    if x_grads[0] is not None:
        raise AssertionError(f"{what}: x.grad is set after the step: x is data; give blocks[0] x.detach() (and every "
                             "later block the detached output of the one before)")
    ref_blocks, ref_heads, _ = _reference(blocks, heads, spec, batches)
    for j in range(len(blocks)):
        for name, p in ref_blocks[j].named_parameters():
            got = tables[f"block {j}"][name]["value"].double()
            if not same_close(got, p.detach(), **STEP_TOL):
                check_close(got, p.detach(), f"{what}: block {j}'s {name} after one step", DETACH_HINT.format(j=j),
                            **STEP_TOL)


@hidden_test("test_local_training_step_dropout")
def check_local_training_step_dropout(nb):
    widths, spec = [13, 17, 11], ("sgd", [0.1, 0.1])
    blocks, heads = _network(widths, 5, 21, p=0.5)
    batches = _batches(2, 37, widths[0], 5, 121)
    what = "2 blocks with dropout p = 0.5, 2 steps"
    _, tables, _ = _run_student(nb, blocks, heads, spec, batches)
    ref_blocks, ref_heads, _ = _reference(blocks, heads, spec, batches)
    if _matches(tables, ref_blocks, ref_heads):
        return
    post_blocks, post_heads, _ = _reference(blocks, heads, spec, batches, mode="after_dropout")
    if _matches(tables, post_blocks, post_heads):
        raise AssertionError(f"{what}: the local loss was computed on out, the dropped-out output: heads[j] gets h, the "
                             "activation before dropout (out is what the next block gets)")
    _compare_params(what, tables, ref_blocks, ref_heads,
                    "with dropout: heads[j](h, y) on h, the next block on out.detach(); call each block exactly once "
                    "per step (these blocks draw a new dropout mask at every call)")


@hidden_test("test_local_training_step_returns")
def check_local_training_step_returns(nb):
    widths, spec = [13, 17, 11, 9], ("adam", [0.01, 0.02, 0.03])
    blocks, heads = _network(widths, 5, 31)
    batches = _batches(2, 37, widths[0], 5, 131)
    outs, _, _ = _run_student(nb, blocks, heads, spec, batches)
    _, _, ref_losses = _reference(blocks, heads, spec, batches)
    for step, (desc, ref) in enumerate(zip(outs, ref_losses)):
        if desc["type"] != "list":
            raise AssertionError(f"local_training_step returned a {desc['type']}, expected a list of Python floats")
        if len(desc["items"]) != len(ref):
            raise AssertionError(f"local_training_step returned {len(desc['items'])} losses for {len(ref)} blocks: one "
                                 "per block")
        kinds = sorted({item["type"] for item in desc["items"]})
        if kinds != ["float"]:
            raise AssertionError(f"the losses are {kinds}, expected Python floats (loss.item())")
        check_close(torch.tensor([item["value"] for item in desc["items"]], dtype=torch.float64),
                    torch.tensor(ref, dtype=torch.float64), f"step {step + 1}: the returned losses",
                    "return each block's local loss as computed before its optimizer step", **STEP_TOL)
    x, y = batches[0]
    blocks, heads = copy.deepcopy(blocks), copy.deepcopy(heads)
    state = nb.put((blocks, heads, _optimizers(blocks, heads, spec)))
    for args, what in (((state[0], state[1][:2], state[2], x, y), "3 blocks and 2 heads"),
                       ((state[0], state[1], state[2][:1], x, y), "3 blocks and 1 optimizer"),
                       (([], [], [], x, y), "no blocks")):
        names = fetch(nb.apply(probes.raised, nb.local_training_step, *args))
        if names is None or "ValueError" not in names:
            raise AssertionError(f"local_training_step with {what} should raise ValueError")


MEM_CASES = (  # the memory cell grades two cases, each with its sizes drawn at grading time from these ranges:
    ((5, 7), (192, 256, 32), (2048, 3072, 256)),  # few blocks: K = 5 to 7, width 192 to 256, a batch of 2048 to 3072
    ((8, 12), (192, 256, 32), (1024, 3072, 256)),  # many blocks: K = 8 to 12, width 192 to 256, a batch of 1024 to 3072
)
MEM_CLASSES = 10
MEM_SLACK_ACTIVATIONS = 4  # the step may hold this many (B, width) activations beyond one block's local backward
# Measured in sandboxed workers, the two cases in the check's order, alone and beside a CPU burner (the same to 0.3
# MiB), MiB (K, width, B): bound = the baseline's peak + the state + 4 activations.
#   case  sizes            course's step   bound   summed backward (excess)   second correct answer
#   few   (5, 192, 2048)        18.9        27.1       38.2 (+10.8 to +11.3)       18.7
#   few   (7, 256, 3072)        37.7        55.4       99.1 (+43.4)                37.7
#   many  (8, 192, 1024)        11.8        17.0       27.8 (+10.7 to +11.1)       11.8
#   many  (12, 192, 1024)       14.1        19.4       40.0 (+20.8)                13.9
#   many  (12, 256, 3072)       41.7        60.7      159.1 (+98.5)                41.7
# The smallest excess (10.7 MiB, at the small ends) stays above what a call could hide: FOOTPRINT plus the allowed
# growth less what the judge's own warm-up keeps of it (the math library's buffers, block 0's gradients), 6.5 to
# 8.1 MiB there. Fewer blocks (K = 4: +5.6 at (4, 256, 2048)) or a smaller batch (+7.3 at (12, 256, 512), where the
# course's step comes within 1 to 3 MiB of the bound) would not separate them.
MEMORY_HINT = ("run block j's backward and optimizer step before block j + 1's forward, so that block j's graph (its "
               "saved activations) is freed right away: the local step then holds one block's graph at a time. Summing "
               "the local losses and calling backward once at the end gives the same updates, but keeps every block's "
               "graph alive until then: backprop's memory")


def _memory_case(nb, meter, K: int, width: int, B: int, earlier: int = 0, report: dict | None = None) -> None:
    """One memory case: K blocks Linear(width, width)-BatchNorm-ReLU with linear CE heads, SGD with momentum, a
    float64 batch of B. The step's peak (cgroup) against the course's local backward of one block on the same batch;
    the losses and parameters of that very step against the reference. ``earlier``: the bytes of the (B, width)
    activations of the check's earlier cases (the math library's work buffers for their shapes stay).
    ``report`` (measurements only) gets the numbers instead of the verdict on the peak."""
    x_seed, init_seed = new_seed(), new_seed() % 100_000
    y = torch.randint(0, MEM_CLASSES, (B,), generator=_gen(new_seed()))
    spec = ("sgd", [0.05 + 0.01 * j for j in range(K)])
    blocks, heads = _network([width] * (K + 1), MEM_CLASSES, init_seed)
    what = (f"local_training_step on {K} blocks Linear({width}, {width})-BatchNorm-ReLU with linear CE heads, a float64 "
            f"batch of {B}")
    mine = copy.deepcopy((blocks, heads))  # a copy: in-kernel, put hands over the objects themselves
    state_h = meter.put((*mine, _optimizers(*mine, spec)))
    one = meter.put((copy.deepcopy(blocks[0]), copy.deepcopy(heads[0])))
    activation = B * width * 8
    # The course's own local backward of one block (no optimizer step) on a batch of this shape, once before the
    # readings: the math library (MKL) keeps work buffers of about 1.25 (B, width) activations for the shapes it
    # multiplied, charged to whoever multiplies them first (an earlier case's buffers stay too), and block 0's copy
    # keeps its gradients. They may stay, beside the usual growth. Of that growth only what the student's code kept
    # of an earlier case could be theirs to free as ballast, beside what their exercise cells hold (FOOTPRINT).
    # After an earlier case the allocator also keeps about 1 MiB more of its small objects.
    nb.apply(probes.ch07_block_step, one[0], one[1], fresh_tensor(nb, (B, width), torch.float64, False), nb.put(y))
    growth = GROWTH + (activation + earlier) * 5 // 4 + (3 if earlier else 2) * MiB

    def batch():
        return [meter.tensor((B, width), dtype=torch.float64, requires_grad=False, seed=x_seed), meter.put(y)]

    # The baseline, one block's graph: the course's local backward of block 0 on the step's batch.
    base, _ = meter.held_by(lambda x, y_: nb.apply(probes.ch07_block_step, one[0], one[1], x, y_), inputs=batch,
                            allowed_growth=growth)
    if report is not None:  # measurements only: what the process held beyond its floor before the step
        report["grown"] = nb.memory().held - meter.floor - meter.booked
    held, losses = meter.held_by(lambda x, y_: nb.local_training_step(state_h[0], state_h[1], state_h[2], x, y_),
                                 inputs=batch, allowed_growth=growth)
    # Values on the same call: the losses and every parameter against the judge's reference.
    x = seeded((B, width), torch.float64, x_seed)
    ref_blocks, ref_heads, ref_losses = _reference(blocks, heads, spec, [(x, y)])
    desc = fetch(nb.apply(probes.ch07_describe, losses))
    got = [item["value"] for item in desc["items"] or []] if desc["type"] == "list" else []
    if len(got) != K or any(v is None for v in got):
        raise AssertionError(f"{what}: returned {desc['type']} {got}, expected the {K} local losses as Python floats")
    check_close(torch.tensor(got, dtype=torch.float64), torch.tensor(ref_losses[0], dtype=torch.float64),
                f"{what}: the returned losses", "each block's local loss, as computed before its optimizer step",
                **STEP_TOL)
    tables = {f"block {j}": fetch(nb.apply(probes.param_table, state_h[0][j])) for j in range(K)}
    tables.update({f"head {j}": fetch(nb.apply(probes.param_table, state_h[1][j])) for j in range(K)})
    _compare_params(what, tables, ref_blocks, ref_heads,
                    "block j and heads[j] are updated by optimizers[j] alone, from block j's local loss")
    # The step's own state: a gradient and a momentum buffer per parameter (SGD with momentum).
    state = 2 * sum(p.numel() * p.element_size() for m in blocks + heads for p in m.parameters())
    bound = base.peak + state + MEM_SLACK_ACTIVATIONS * activation
    if report is not None:
        report.update(K=K, width=width, B=B, activation=activation, base=base.peak, peak=held.peak, state=state,
                      bound=bound, growth=growth)
        return
    if held.peak > bound:
        raise AssertionError(
            f"{what}: during the step your process's memory rose by {mib(held.peak)} at its peak (read from outside "
            f"your process), while the course's local backward of one block on the same batch peaks at "
            f"{mib(base.peak)}; with the step's gradients and momentum buffers ({mib(state)}) and "
            f"{MEM_SLACK_ACTIVATIONS} more ({B}, {width}) activations ({mib(activation)} each) the step may reach "
            f"{mib(bound)}: your step held the graphs of several blocks at once. {MEMORY_HINT}")


@hidden_test("test_local_training_step_memory", requires=("test_local_training_step_returns",))
def check_local_training_step_memory(nb):
    earlier = 0
    for blocks_range, width_range, batch_range in MEM_CASES:
        K, width, B = draw(*blocks_range), draw(*width_range), draw(*batch_range)
        # A Meter per case, made before the case's first call: the previous case's objects are gone by then (its
        # handles dropped, the worker's garbage collected at the Meter's first reading), and whatever the student's
        # code kept of them counts against this case's growth.
        meter = Meter(nb)
        _memory_case(nb, meter, K, width, B, earlier=earlier)
        earlier += B * width * 8


# --- schedules ---------------------------------------------------------------------------------------
def _simulate(fwd, bwd, T: int, method: str):
    """Start times from an event simulation: each worker takes its next task once its inputs are ready.

    Tasks of worker k, in order: for each batch, forward then backward. A forward needs the previous
    block's forward output (both methods); a backward needs, for backprop, the gradient of the block
    above (its backward done) or, for the last block and for DGL, only its own forward."""
    K = len(fwd)
    start = {}
    free = [Fraction(0)] * K
    for t in range(T):
        for k in range(K):  # forwards go down the stack
            need = start[("f", k - 1, t)] + fwd[k - 1] if k > 0 else Fraction(0)
            start[("f", k, t)] = max(free[k], need)
            free[k] = start[("f", k, t)] + fwd[k]
            if method == "dgl":
                start[("b", k, t)] = free[k]
                free[k] = free[k] + bwd[k]
        if method == "bp":
            for k in reversed(range(K)):  # backwards go up
                need = start[("b", k + 1, t)] + bwd[k + 1] if k < K - 1 else start[("f", k, t)] + fwd[k]
                start[("b", k, t)] = max(free[k], need)
                free[k] = start[("b", k, t)] + bwd[k]
    return ([[start[("f", k, t)] for t in range(T)] for k in range(K)],
            [[start[("b", k, t)] for t in range(T)] for k in range(K)])


_SCHEDULE_CASES = [  # (fwd, bwd, T)
    ([Fraction(3, 7)], [Fraction(5, 11)], 4),
    ([Fraction(1, 3), Fraction(2, 5)], [Fraction(3, 4), Fraction(1, 6)], 3),
    ([Fraction(2, 7), Fraction(9, 5), Fraction(1, 9)], [Fraction(4, 3), Fraction(1, 8), Fraction(7, 10)], 5),
    ([Fraction(1, 2), Fraction(1, 3), Fraction(13, 4), Fraction(1, 5)],
     [Fraction(2, 3), Fraction(5, 7), Fraction(1, 11), Fraction(3, 2)], 4),
    ([Fraction(5, 3), Fraction(1, 7), Fraction(1, 7), Fraction(1, 7)],
     [Fraction(1, 13), Fraction(1, 7), Fraction(4, 7), Fraction(2, 7)], 1),
    ([Fraction(1, 4), Fraction(3, 4), Fraction(1, 4)], [Fraction(1, 4), Fraction(9, 4), Fraction(1, 4)], 2),
]


def _decode_exact(desc, what: str):
    if desc.get("type") != "tuple" or len(desc["items"]) != 2:
        raise AssertionError(f"{what}: returned a {desc.get('type')}"
                             f"{' of ' + str(len(desc['items'])) + ' items' if desc.get('items') is not None else ''}"
                             ", expected a tuple (F, B) of two lists")
    out = []
    for part, name in zip(desc["items"], "FB"):
        if part["type"] != "list" or any(row["type"] != "list" for row in part["items"] or []):
            raise AssertionError(f"{what}: {name} must be a list of K lists (one per block), got a {part['type']}")
        rows = []
        for row in part["items"]:
            values = []
            for item in row["items"]:
                if "value" not in item:
                    raise AssertionError(f"{what}: {name} holds a {item['type']}, expected numbers")
                values.append(item)
            rows.append(values)
        out.append(rows)
    return out


def _check_schedule(nb, fn_name: str, method: str, wrong_hints: dict, default_hint: str):
    for fwd, bwd, T in _SCHEDULE_CASES:
        what = f"{fn_name}(fwd={[str(f) for f in fwd]}, bwd={[str(b) for b in bwd]}, n_batches={T})"
        desc = fetch(nb.apply(probes.ch07_exact, nb[fn_name](fwd, bwd, T)))
        got = _decode_exact(desc, what)
        ref = _simulate(fwd, bwd, T, method)
        K = len(fwd)
        for part, name in zip(range(2), ("forward", "backward")):
            if len(got[part]) != K or any(len(row) != T for row in got[part]):
                raise AssertionError(f"{what}: {name} starts have shape {len(got[part])} x "
                                     f"{[len(r) for r in got[part]]}, expected {K} blocks x {T} batches")
        for part, name in zip(range(2), ("forward", "backward")):
            for k in range(K):
                for t in range(T):
                    item, want = got[part][k][t], ref[part][k][t]
                    if item["value"] == f"{want.numerator}/{want.denominator}":
                        continue
                    if item["type"] == "float":
                        raise AssertionError(f"{what}: {name} start of block {k}, batch {t} is a float, {item['value']}"
                                             f" as a fraction; expected exactly {want}. Use only + and max on the "
                                             "durations (no float(), no division), so that Fractions stay exact")
                    hint = default_hint
                    for wrong, text in wrong_hints.items():
                        alt = wrong(fwd, bwd, T)
                        if alt is not None and _as_strings(alt) == [[[i["value"] for i in row] for row in p_]
                                                                    for p_ in got]:
                            hint = text
                            break
                    raise AssertionError(f"{what}: the {name} start of block {k} on batch {t} is {item['value']}, "
                                         f"expected {want}. {hint}")


def _as_strings(schedule):
    return [[[f"{Fraction(v).numerator}/{Fraction(v).denominator}" for v in row] for row in part] for part in schedule]


def _bp_variant(fwd, bwd, T, variant: str):
    K = len(fwd)
    Fs, Bs = [[Fraction(0)] * T for _ in range(K)], [[Fraction(0)] * T for _ in range(K)]
    for t in range(T):
        for k in range(K):
            c = []
            if k > 0:
                c.append(Fs[k - 1][t] + (fwd[k] if variant == "own_fwd" else fwd[k - 1]))
            if t > 0:
                c.append(Fs[k][t - 1] + fwd[k] if variant == "no_update_wait" else Bs[k][t - 1] + bwd[k])
            Fs[k][t] = max(c) if c else Fraction(0)
        Bs[K - 1][t] = Fs[K - 1][t] + fwd[K - 1]
        for k in range(K - 2, -1, -1):
            Bs[k][t] = Bs[k + 1][t] + (bwd[k] if variant == "own_bwd" else bwd[k + 1])
    return Fs, Bs


def _dgl_variant(fwd, bwd, T, variant: str):
    K = len(fwd)
    Fs = [[Fraction(0)] * T for _ in range(K)]
    for k in range(K):
        for t in range(T):
            c = []
            if t > 0:
                c.append(Fs[k][t - 1] + fwd[k] + (0 if variant == "no_own_bwd" else bwd[k]))
            if k > 0:
                c.append(Fs[k - 1][t] + fwd[k - 1] + (bwd[k - 1] if variant == "waits_for_bwd" else 0))
            Fs[k][t] = max(c) if c else Fraction(0)
    return Fs, [[Fs[k][t] + fwd[k] for t in range(T)] for k in range(K)]


@hidden_test("test_bp_schedule_values")
def check_bp_schedule_values(nb):
    _check_schedule(nb, "bp_schedule", "bp", {
        (lambda f, b, T: _bp_variant(f, b, T, "own_bwd")):
            "off by one: block k's backward starts after block k + 1's backward, which lasts bwd[k + 1], not bwd[k]",
        (lambda f, b, T: _bp_variant(f, b, T, "own_fwd")):
            "off by one: block k's input is ready when block k - 1's forward ends, which lasts fwd[k - 1]",
        (lambda f, b, T: _bp_variant(f, b, T, "no_update_wait")):
            "a block starts its next forward only after its own backward (and update) of the previous batch has "
            "ended",
        (lambda f, b, T: _dgl_variant(f, b, T, "none")):
            "these are DGL's start times: in end-to-end backprop block k's backward waits for block k + 1's",
    }, "follow the docstring's rules one by one: a forward waits for the input from block k - 1 and for the end of "
       "this block's own backward of the previous batch; the last block's backward follows its forward; every other "
       "backward waits for the end of block k + 1's backward")


@hidden_test("test_dgl_schedule_values")
def check_dgl_schedule_values(nb):
    _check_schedule(nb, "dgl_schedule", "dgl", {
        (lambda f, b, T: _dgl_variant(f, b, T, "waits_for_bwd")):
            "block k waited for block k - 1's local backward: with a detached output it only needs block k - 1's "
            "forward to have ended",
        (lambda f, b, T: _dgl_variant(f, b, T, "no_own_bwd")):
            "a block starts its next batch after its own forward *and* local backward of the previous one have "
            "ended",
        (lambda f, b, T: _bp_variant(f, b, T, "none")):
            "these are end-to-end backprop's start times: with local losses no block waits for another's backward",
    }, "follow the docstring's rules one by one: a forward waits for the end of block k - 1's forward and for the end "
       "of this block's own forward and local backward of the previous batch; the local backward follows the "
       "block's own forward")


def _check_schedule_errors(nb, fn_name: str):
    cases = [
        (([1, 2], [3], 2), "fwd and bwd of different lengths"),
        (([], [], 2), "no blocks"),
        (([1, 0], [1, 1], 2), "a forward duration of 0"),
        (([1, 1], [1, Fraction(-1, 3)], 2), "a negative backward duration"),
        (([1], [1], 0), "n_batches=0"),
        (([1], [1], -2), "n_batches=-2"),
        (([1], [1], True), "n_batches=True"),
        (([1], [1], 2.0), "n_batches=2.0"),
    ]
    for args, what in cases:
        if not _raises_value_error(nb, fn_name, *args):
            raise AssertionError(f"{fn_name} with {what} should raise ValueError")


@hidden_test("test_bp_schedule_errors")
def check_bp_schedule_errors(nb):
    _check_schedule_errors(nb, "bp_schedule")


@hidden_test("test_dgl_schedule_errors")
def check_dgl_schedule_errors(nb):
    _check_schedule_errors(nb, "dgl_schedule")
