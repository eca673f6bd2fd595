"""Probes of chapter 10 (FlashAttention): op traces, an autograd run that records what is saved, and
Triton kernels run with every memory access of the interpreter checked."""
from __future__ import annotations

from typing import Callable

import torch

from coursekit.measure import saved_tensors
from grader.sandbox.trusted import in_process


@in_process(restricts=("ops", "max_elements", "max_shape"))
def ch10_trace(fn: Callable, *args, **kwargs) -> dict:
    """Call ``fn(*args, **kwargs)`` under a dispatch mode; report what it returned ("result"), the
    names of the aten operators it ran ("ops", sorted) and the largest tensor any operator produced,
    measured by the elements of its storage (views of a smaller tensor count as that tensor):
    "max_elements" and "max_shape"."""
    return _ch10_trace(fn, args, kwargs)


def _ch10_trace(fn: Callable, args: tuple, kwargs: dict, ignore: frozenset = frozenset(),
                on_op: Callable | None = None) -> dict:
    """ch10_trace; tensors on a storage whose address is in ``ignore`` (the probe's own) are not counted;
    ``on_op(name, args, out)`` is called after each operator."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    seen = {"ops": set(), "max_elements": 0, "max_shape": []}

    class _Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            seen["ops"].add(str(func.overloadpacket.__name__))
            if on_op is not None:
                on_op(str(func.overloadpacket.__name__), args, out)
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in ignore:
                    elements = t.untyped_storage().nbytes() // max(t.element_size(), 1)
                    if elements > seen["max_elements"]:
                        seen["max_elements"], seen["max_shape"] = elements, list(t.shape)
            return out

    with _Record():
        result = fn(*args, **kwargs)
    detach = (lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t)
    result = tuple(detach(r) for r in result) if isinstance(result, (tuple, list)) else detach(result)
    return {"result": result, "ops": sorted(seen["ops"]), "max_elements": seen["max_elements"],
            "max_shape": seen["max_shape"]}


@in_process(explains=("activation_bytes", "saved"))
def ch10_autograd_run(fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
                      *extra, backward: bool = True) -> dict:
    """Run ``o = fn(q, k, v, *extra)`` (e.g. ``FlashAttention.apply``) on leaf copies of q, k, v
    recording what autograd saves, then back-propagate ``grad_out`` (unless ``backward`` is False:
    "grads" is then None). Reports the output, the three input gradients, whether the output is
    attached, the activation bytes saved during the forward call and the shape, dtype and bytes of
    each saved storage."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    with saved_tensors() as rec:
        o = fn(q, k, v, *extra)
    if not isinstance(o, torch.Tensor) or o.grad_fn is None:
        return {"attached": False, "o": o.detach().clone() if isinstance(o, torch.Tensor) else None}
    if backward:
        o.backward(grad_out)
    return {"attached": True, "o": o.detach().clone(),
            "grads": [None if t.grad is None else t.grad.clone() for t in (q, k, v)] if backward else None,
            "activation_bytes": rec.activation_bytes,
            "saved": [{"shape": list(s.shape), "dtype": str(s.dtype), "nbytes": s.nbytes}
                      for s in rec.tensors if not s.is_state]}


def ch10_rows(rows: list, *values) -> list:
    """Rows ``rows`` (along the sequence dimension, 2) of each of ``values``: a tensor, or a tuple or list of
    them, as returned by the student's code. Each tensor gives {"shape", "dtype", "rows"} (the rows
    copied), anything else {"type"}: only an exact torch.Tensor is indexed, so nothing the student's code
    defines runs here. The judge compares the rows with its own reference on rows it drew."""
    def one(t):
        if type(t) is not torch.Tensor:
            return {"type": type(t).__name__}
        index = torch.tensor([int(r) for r in rows], dtype=torch.long)
        picked = t.detach().index_select(2, index).clone() if t.dim() >= 3 else None
        return {"shape": list(t.shape), "dtype": str(t.dtype), "rows": picked}

    out = []
    for value in values:
        if type(value) in (tuple, list):
            out.append([one(t) for t in value])
        else:
            out.append(one(value))
    return out


def ch10_backward(o, weight: torch.Tensor) -> dict:
    """Back-propagate the loss sum(o * weight) through ``o`` (the output of the student's
    FlashAttention.apply): the gradients land in the inputs the judge made (their .grad, retained).
    Reports whether ``o`` is a torch.Tensor attached to a graph; the student's backward's own errors
    propagate."""
    if type(o) is not torch.Tensor or o.grad_fn is None:
        return {"attached": False}
    torch.autograd.backward(torch.sum(torch.mul(o, weight)))
    return {"attached": True}


# Triton's interpreter as this module first saw it: in the sandbox that is the fork server, before any
# student code ran (its preload imports triton with TRITON_INTERPRET=1). ch10_triton_run wraps the
# interpreter's memory accesses and relies on the rest of it; the integrity check of the sandbox does not
# watch triton, so the probe compares against this snapshot itself, before, during and after the call.
_CH10_INTERPRETER: dict = {}


def _ch10_interpreter_state() -> dict | None:
    """Triton's interpreter module, its C module of memory accesses, and every function, class and
    descriptor bound in them, in the classes the interpreter defines and on its builder instance."""
    import sys

    interp = sys.modules.get("triton.runtime.interpreter")
    if interp is None:
        return None
    namespace = vars(interp)
    owners = [("triton.runtime.interpreter", interp)]
    owners += [(f"triton.runtime.interpreter.{name}", value) for name, value in list(namespace.items())
               if isinstance(value, type) and getattr(value, "__module__", None) == interp.__name__]
    for name in ("interpreter_builder", "_interpreter"):
        if namespace.get(name) is not None:
            owners.append((f"triton.runtime.interpreter.{name}", namespace[name]))
    objects = {}
    for label, owner in owners:
        try:
            items = list(vars(owner).items())
        except TypeError:
            continue
        for attr, value in items:
            if callable(value) or hasattr(type(value), "__get__"):
                objects[(label, attr)] = value
    return {"interp": interp, "c": namespace.get("_interpreter"), "objects": objects}


def _ch10_changed(snap: dict) -> str | None:
    """The first watched name of Triton's interpreter that differs from ``snap`` (None if none)."""
    now = _ch10_interpreter_state()
    if now is None or now["interp"] is not snap["interp"]:
        return "sys.modules['triton.runtime.interpreter']"
    if now["c"] is not snap["c"]:
        return "triton.runtime.interpreter._interpreter"
    old, new = snap["objects"], now["objects"]
    for key, value in old.items():
        if new.get(key, _CH10_INTERPRETER) is not value:  # the dict itself: a sentinel no entry can be
            return f"{key[0]}.{key[1]}"
    for key in new.keys() - old.keys():
        return f"{key[0]}.{key[1]}"
    return None


_CH10_INTERPRETER.update(_ch10_interpreter_state() or {})


@in_process(restricts=("ops", "max_elements", "max_shape", "bounds"))
def ch10_triton_run(fn: Callable, *args, spaced: bool = False, trace: bool = True) -> dict:
    """``ch10_trace(fn, *args)`` with every memory access of Triton's interpreter checked.

    Each load, store and atomic a kernel makes through the interpreter is checked lane by lane: every
    lane its mask leaves on must address an element of the tensor argument of that launch it belongs to
    (the one its lowest lane addresses: a block starts inside its tensor). Lanes outside are recorded
    and switched off (a load gives ``other``, 0 when none, a store writes nothing), so the call stays
    safe and its result does not depend on whatever lies past a tensor. With ``spaced``, the tensors of
    ``args`` are first copied into one buffer with a gap before and after each, so that no access past
    the end of one lands inside the next. With ``trace`` False the operators are not traced ("ops" is
    None, "max_elements" 0, "result" what ``fn`` returned itself, for ``ch10_rows``): the memory accesses
    alone are checked, for a call whose memory is read from outside. The interpreter's own handling of
    the arguments (views of their storage before a launch, copied back after it) is kept out of the trace.

    Adds to ch10_trace's report "bounds": "launches" (kernel launches), "accesses", "outside" (lanes
    outside, over all accesses), "violations" (the first few: op, kernel argument, lanes outside of lanes
    on, elements past the end or before the start, launch), "tampered" (the first name of Triton's
    interpreter found replaced, or None; when it is found before the call, ``fn`` is not called and
    "result" is None), "foreign_loads" (the kernel arguments a load read that are neither a tensor of
    ``args`` nor a copy of one made during the call by an operator the trace saw: clone, _to_copy),
    "stored" (the kernel arguments a store or atomic wrote), "result_stored" (None unless the result is a
    torch.Tensor; then whether its memory lies in a kernel argument that a store or atomic wrote),
    "result_argument" (that argument's name), "unwritten" (how many of the result's elements no store or
    atomic wrote) and "first_unwritten" (the index of the first, or None). These come from the
    interpreter's checked stores, so they hold whether or not the call is traced.
    """
    import sys

    import numpy as np

    if not _CH10_INTERPRETER:
        _CH10_INTERPRETER.update(_ch10_interpreter_state() or {})
    snap = dict(_CH10_INTERPRETER)
    report = {"launches": 0, "accesses": 0, "outside": 0, "violations": [], "tampered": None,
              "foreign_loads": [], "stored": [], "result_stored": None, "result_argument": None, "unwritten": 0,
              "first_unwritten": None}
    if not snap:  # no interpreter: a kernel can only run compiled, on a GPU
        traced = ch10_trace(fn, *args) if trace else {"result": fn(*args), "ops": None, "max_elements": 0,
                                                      "max_shape": []}
        traced["bounds"] = report
        return traced
    report["tampered"] = _ch10_changed(snap)
    if report["tampered"] is not None:  # nothing runs: the accesses could not be checked, nor kept in bounds
        return {"result": None, "ops": [], "max_elements": 0, "max_shape": [], "bounds": report}
    interp, c_mod, objects = snap["interp"], snap["c"], snap["objects"]
    executor, builder_class = objects[("triton.runtime.interpreter", "GridExecutor")], \
        objects[("triton.runtime.interpreter", "InterpreterBuilder")]
    init_args = objects[("triton.runtime.interpreter.GridExecutor", "_init_args_hst")]
    restore_args = objects[("triton.runtime.interpreter.GridExecutor", "_restore_args_dev")]
    original = {name: objects[("triton.runtime.interpreter._interpreter", name)]
                for name in ("load", "store", "atomic_rmw", "atomic_cas")}
    methods = {name: objects[("triton.runtime.interpreter.InterpreterBuilder", name)]
               for name in ("create_load", "create_store", "create_masked_load", "create_masked_store",
                            "create_atomic_rmw", "create_atomic_cas")}
    builder = vars(interp)["interpreter_builder"]
    spans: list = []  # (kernel argument, first byte, end byte) of every tensor passed to the launch running
    sources: list = []  # (first byte, end byte) of q, k, v and of the copies made of them during the call
    written: dict = {}  # (first byte, end byte) of a kernel argument -> which of its bytes a store wrote
    names: dict = {}  # (first byte, end byte) of a kernel argument -> its name
    stored: set = set()
    foreign: set = set()

    def extent(value) -> tuple[int, int]:
        """The bytes from a tensor's first element to its last."""
        last = sum((size - 1) * stride for size, stride in zip(value.shape, value.stride()))
        size = 0 if value.numel() == 0 else (last + 1) * value.element_size()
        return value.data_ptr(), value.data_ptr() + size

    def collect(name, value):
        if isinstance(value, tuple):
            for i, item in enumerate(value):
                collect(f"{name}[{i}]", item)
            return
        value = value if isinstance(value, torch.Tensor) else getattr(value, "base", None)
        if isinstance(value, torch.Tensor):
            spans.append((name, *extent(value)))

    def init_args_hst(self, args_dev, kwargs):
        """The interpreter's own host copies of the arguments (views of the same storage on a CPU), kept out
        of the operator trace like restore_args_dev."""
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        spans.clear()
        for name, value in zip(self.arg_names, args_hst):
            collect(name, value)
        for name, value in kwargs_hst.items():
            collect(name, value)
        report["launches"] += 1
        return args_hst, kwargs_hst

    def restore_args_dev(self, *rest):
        """The interpreter copies each argument's storage back onto itself after a launch (byte views of
        the whole storage): its own bookkeeping, kept out of the operator trace."""
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            return restore_args(self, *rest)

    def copies(name, op_args, out):
        """Copies of q, k or v made during the call (contiguous(), clone(), to()) count as them."""
        if name in ("clone", "_to_copy") and op_args and isinstance(op_args[0], torch.Tensor) \
                and isinstance(out, torch.Tensor) and out.numel():
            start, end = extent(op_args[0])
            if any(s <= start and end <= e for s, e in sources):
                sources.append(extent(out))

    wrappers: dict = {}

    def intact() -> bool:
        cls, c = vars(builder_class), vars(c_mod)
        return (all(cls.get(n) is m for n, m in methods.items()) and all(c.get(n) is wrappers[n] for n in wrappers)
                and not any(n in vars(builder) for n in methods)
                and vars(executor).get("_init_args_hst") is init_args_hst
                and vars(executor).get("_restore_args_dev") is restore_args_dev
                and vars(interp).get("_interpreter") is c_mod and sys.modules.get(interp.__name__) is interp)

    def check(op, ptrs, mask, itemsize):
        """The mask with the lanes outside every tensor argument switched off (``mask`` itself if none);
        records which argument a load read and which bytes a store wrote."""
        report["accesses"] += 1
        if report["tampered"] is None and not intact():
            report["tampered"] = _ch10_changed(snap) or "the interpreter's memory accesses (during the call)"
        p = np.asarray(ptrs)
        on = np.ones(p.shape, dtype=bool) if mask is None else np.broadcast_to(np.asarray(mask, dtype=bool), p.shape)
        addresses = p[on].astype(np.uint64)
        if addresses.size == 0:
            return mask
        low, high = int(addresses.min()), int(addresses.max()) + itemsize
        # The tensor the access belongs to: the one its lowest lane addresses (a block starts inside its
        # tensor and runs past the end), else the one its highest lane addresses.
        best = next((span for span in spans if span[1] <= low < span[2]), None) or next(
            (span for span in spans if span[1] < high <= span[2]), None)
        keep, lanes_on = mask, on
        if best is None or not (best[1] <= low and high <= best[2]):
            inside = np.zeros(p.shape, dtype=bool) if best is None else (p >= best[1]) & (p + itemsize <= best[2])
            outside = on & ~inside
            report["outside"] += int(outside.sum())
            if len(report["violations"]) < 8:
                report["violations"].append({
                    "op": op, "argument": None if best is None else best[0], "lanes": int(outside.sum()),
                    "of": int(on.sum()), "itemsize": itemsize,
                    "past_end": 0 if best is None else max(0, high - best[2]) // itemsize,
                    "before_start": 0 if best is None else max(0, best[1] - low) // itemsize,
                    "launch": report["launches"]})
            keep = lanes_on = np.ascontiguousarray(on & inside)
        if best is None:
            return keep
        if op == "load":
            if not any(s <= best[1] and best[2] <= e for s, e in sources):
                foreign.add(best[0])
        else:  # a store or an atomic: the bytes of its lanes left on
            stored.add(best[0])
            lanes = p[lanes_on].astype(np.int64) - best[1]
            marks = written.setdefault(best[1:], np.zeros(best[2] - best[1], dtype=bool))
            names[best[1:]] = best[0]
            marks[(lanes[:, None] + np.arange(itemsize)[None, :]).reshape(-1)] = True
        return keep

    def load(ptrs, mask, other, dtype):
        return original["load"](ptrs, check("load", ptrs, mask, np.dtype(dtype).itemsize), other, dtype)

    def store(ptrs, values, mask):
        return original["store"](ptrs, values, check("store", ptrs, mask, np.asarray(values).itemsize))

    def atomic_rmw(op, ptrs, values, mask, sem):
        return original["atomic_rmw"](op, ptrs, values, check("atomic", ptrs, mask, np.asarray(values).itemsize),
                                      sem)

    def atomic_cas(ptrs, expected, values, sem):
        before = report["outside"]
        check("atomic", ptrs, None, np.asarray(values).itemsize)
        if report["outside"] != before:  # no mask to switch lanes off with: do not touch the memory
            raise RuntimeError("tl.atomic_cas outside the tensors passed to the kernel")
        return original["atomic_cas"](ptrs, expected, values, sem)

    wrappers.update(load=load, store=store, atomic_rmw=atomic_rmw, atomic_cas=atomic_cas)
    ignore = frozenset()
    if spaced:  # [gap | t0 | gap | t1 | ... | gap], each gap far longer than a block of rows
        gap, tensors = 8192, [a for a in args if isinstance(a, torch.Tensor) and a.dtype == torch.float32]
        buffer = torch.zeros(gap + sum(t.numel() + gap for t in tensors))
        placed, at = {}, gap
        for t in tensors:
            placed[id(t)] = buffer[at:at + t.numel()].view(t.shape).copy_(t)
            at += t.numel() + gap
        args = tuple(placed.get(id(a), a) for a in args)
        ignore = frozenset({buffer.untyped_storage().data_ptr()})  # the inputs' views: not the student's tensors
    sources.extend(extent(a) for a in args if type(a) is torch.Tensor)
    returned: list = []

    def call(*call_args):
        returned.append(fn(*call_args))  # the very tensor returned, before the trace copies it
        return returned[-1]

    try:
        for name, wrapper in wrappers.items():
            setattr(c_mod, name, wrapper)
        executor._init_args_hst, executor._restore_args_dev = init_args_hst, restore_args_dev
        if trace:
            traced = _ch10_trace(call, args, {}, ignore, on_op=copies)
        else:  # the result itself: the judge fetches what it compares (ch10_rows)
            traced = {"result": call(*args), "ops": None, "max_elements": 0, "max_shape": []}
    finally:
        executor._init_args_hst, executor._restore_args_dev = init_args, restore_args
        for name, function in original.items():
            setattr(c_mod, name, function)
    if report["tampered"] is None:
        report["tampered"] = _ch10_changed(snap)
    report["foreign_loads"], report["stored"] = sorted(foreign), sorted(stored)
    result = returned[0] if returned else None
    if type(result) is torch.Tensor and result.numel():  # which of its elements a store wrote
        start, end = extent(result)
        cover = next(((s, e) for (s, e) in written if s <= start and end <= e), None)
        report["result_stored"] = cover is not None
        report["result_argument"] = names.get(cover)
        offsets = np.zeros((), dtype=np.int64)
        for size, stride in zip(result.shape, result.stride()):
            offsets = offsets[..., None] + np.arange(size, dtype=np.int64) * stride * result.element_size()
        if cover is None:
            report["unwritten"], report["first_unwritten"] = result.numel(), [0] * result.dim()
        else:
            marks = written[cover]
            base = start - cover[0]
            missed = ~np.logical_and.reduce(
                [marks[base + offsets + b] for b in range(result.element_size())])
            report["unwritten"] = int(missed.sum())
            if report["unwritten"]:
                report["first_unwritten"] = [int(i) for i in np.argwhere(missed)[0]]
    traced["bounds"] = report
    return traced


def ch10_prime() -> None:
    """Prime a worker of this chapter before any student code runs (``grader.sandbox.judge.primes_of``): the
    course's own FlashAttention kernel on a few tiles through Triton's interpreter with its accesses checked
    (``ch10_triton_run``), and the operator trace, so that their first run's copies of shared pages and
    caches are not read as the student's memory. (A kernel defined here would make the interpreter write
    into this module's namespace, which the integrity check watches.)"""
    from kernels.ch10_flash_attention import fused_attention_fwd

    q, k, v = (torch.randn(1, 1, 40, 16) for _ in range(3))
    ch10_triton_run(lambda *a: fused_attention_fwd(*a, causal=True)[0], q, k, v)
    ch10_trace(lambda t: t.softmax(-1) @ t.T, torch.randn(8, 8))
