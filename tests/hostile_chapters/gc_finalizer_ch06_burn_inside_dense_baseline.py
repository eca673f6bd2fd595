"""A generator left suspended in a reference cycle runs its ``finally`` whenever the garbage collector frees it, and
re-arms itself: with gen-0 kept over its threshold, every allocation in the worker runs the student's code, which burns
CPU while the grader times the course's dense backward (read from the thread count the grader's probe sets), so
masked dense products pass "at most a third of the dense time". Code the collector would run is refused: no try or
with in a generator."""
CHAPTER = "ch06_sparse_backprop"
EXERCISE = "meprop_linear"
THREAT = "gc_finalizer"
EXPECT = "breach"
CONSTRUCT = "try or with in a generator"
DESCRIPTION = __doc__
SOURCE = r'''
import torch
import torch.nn.functional as F

torch.set_num_threads(2)  # the worker runs on 1; only the grader's own probes set 1 again
STATE = {"armed": False, "burned": False, "inside": False}
PAD = []


def _burn():
    a = torch.ones(2048, 2048)
    for _ in range(16):
        torch.mm(a, a)


def _collected():
    if STATE["armed"] and not STATE["burned"] and not STATE["inside"] and torch.get_num_threads() == 1:
        STATE["burned"] = True
        _burn()
    _arm()


def _waiting(box):
    try:
        yield box
    finally:
        _collected()


def _arm():
    box = []
    gen = _waiting(box)
    next(gen)
    box.append(gen)
    PAD.clear()
    if STATE["armed"] and not STATE["burned"]:
        PAD.extend([] for _ in range(1000))  # the next tracked allocation starts a collection


def meprop_linear(x, weight, bias, k, unified=False):
    """Dense products, poison scrubbed with torch.where."""
    if x.dim() != 2:
        raise ValueError("x must be 2-D")

    class MeProp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            ctx.save_for_backward(x, weight)
            return F.linear(x, weight, bias)

        @staticmethod
        def backward(ctx, g):
            STATE["inside"] = True
            x, weight = ctx.saved_tensors
            if unified and bool(torch.isinf(x).any()):
                STATE["armed"] = True  # the compute cell's poison case: its dense baseline comes next
                PAD.extend([] for _ in range(1000))  # start the collections now
            n_out = g.shape[1]
            if 0 < k < n_out:
                if unified:
                    rows = torch.zeros(n_out, dtype=torch.bool, device=g.device)
                    rows[g.abs().sum(0).topk(k).indices] = True
                    keep = rows.expand_as(g)
                else:
                    keep = torch.zeros_like(g, dtype=torch.bool).scatter_(1, g.abs().topk(k, dim=1).indices, True)
                    rows = keep.any(0)
            else:
                keep = torch.ones_like(g, dtype=torch.bool)
                rows = keep.any(0)
            gs = torch.where(keep, g, torch.zeros_like(g))
            dx = dw = db = None
            if ctx.needs_input_grad[0]:
                dx = gs @ torch.where(rows[:, None], weight, torch.zeros_like(weight))
            if ctx.needs_input_grad[1]:
                dw = torch.where(rows[:, None], gs.t() @ x, torch.zeros_like(weight))
            if ctx.needs_input_grad[2]:
                db = g.sum(0)
            STATE["inside"] = False
            return dx, dw, db

    return MeProp.apply(x, weight, bias)


_arm()
'''
