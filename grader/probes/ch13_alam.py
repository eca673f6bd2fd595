"""Probes of chapter 13 (ALAM): they call the student's saved-tensor hooks and report what came back."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from grader.sandbox.trusted import in_process


_CH13_PLAIN = (int, float, str, bool, type(None), torch.dtype, torch.device)


def _ch13_tensors(obj, found: dict, refused: list | None = None) -> None:
    """The tensors inside ``obj`` (tuples, lists, dicts), one per storage, keyed by the storage (its address and its
    real size in bytes, whatever part of it the tensor views). Anything else than tuples, lists, dicts, plain
    tensors and plain Python values (int, float, str, bool, None, torch.dtype, torch.Size) is named in
    ``refused``: a packed value holds nothing the byte count cannot see."""
    if type(obj) is torch.Tensor:
        storage = obj.untyped_storage()
        found.setdefault((storage.data_ptr(), storage.nbytes()), obj)
        if refused is not None and (vars(obj) or (obj.is_leaf and obj.grad is not None)):
            refused.append("a tensor carrying attributes or a .grad")
    elif isinstance(obj, (tuple, list)) and type(obj) in (tuple, list, torch.Size):
        for item in obj:
            _ch13_tensors(item, found, refused)
    elif type(obj) is dict:
        for key, item in obj.items():
            _ch13_tensors(key, found, refused)
            _ch13_tensors(item, found, refused)
    elif type(obj) in _CH13_PLAIN:
        pass
    elif refused is not None:
        refused.append(f"a {type(obj).__name__}")
    elif isinstance(obj, torch.Tensor):
        found.setdefault((obj.untyped_storage().data_ptr(), obj.untyped_storage().nbytes()), obj)
    elif isinstance(obj, dict):
        for item in obj.values():
            _ch13_tensors(item, found, refused)


def _ch13_make(value: torch.Tensor, kind: str, keep: list):
    """The tensor handed to pack: an activation that requires grad, a parameter, a view of one, or as is."""
    if kind == "act":
        return value.detach().clone().requires_grad_(True).mul(1)  # a non-leaf that requires grad
    if kind == "param":
        keep.append(nn.Parameter(value.detach().clone()))
        return keep[-1]
    if kind == "param_t":
        keep.append(nn.Parameter(value.detach().clone()))
        return keep[-1].t()
    return value


def ch13_pack_run(pack: Callable, unpack: Callable, values: list, kinds: list) -> list:
    """Make a tensor of each kind ("act", "param", "param_t", "plain") from ``values`` (the same object for
    repeated indices of one value: ``kinds`` may be longer than ``values``, index i uses values[i % len]),
    call ``pack`` on them in order and ``unpack`` on each result. Per call: "same" (pack returned the very
    object), "tensors" (copies of the tensors inside what it returned, one per storage), "bytes" (the real
    sizes of their storages, each storage once), "refused" (the first thing in it that is neither a tuple, list
    or dict, a plain tensor nor a plain Python value, or None), "restored" (a copy
    of what unpack gave back) and "error" (the exception's text, if pack or unpack raised)."""
    keep: list = []
    made = [_ch13_make(v, k, keep) for v, k in zip(values, kinds[:len(values)])]
    report = []
    for i in range(len(kinds)):
        t = made[i % len(made)]
        entry = {"same": False, "tensors": [], "bytes": 0, "refused": None, "restored": None, "error": None}
        try:
            packed = pack(t)
            entry["same"] = packed is t
            found: dict = {}
            refused: list = []
            if packed is not t:
                _ch13_tensors(packed, found, refused)
            entry["refused"] = refused[0] if refused else None
            entry["bytes"] = sum(key[1] for key in found)
            entry["tensors"] = [v.detach().clone() for v in found.values()]
            restored = unpack(packed)
            entry["restored"] = restored.detach().clone() if isinstance(restored, torch.Tensor) else None
        except Exception as e:  # noqa: BLE001 - reported, the judge decides
            entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        report.append(entry)
    return report


def ch13_mean_of_packs(pack: Callable, unpack: Callable, value: torch.Tensor, count: int):
    """The mean of ``unpack(pack(t))`` over ``count`` packs of one activation t (that requires grad)."""
    t = value.detach().clone().requires_grad_(True).mul(1)
    total = torch.zeros(t.shape, dtype=torch.float64)
    for _ in range(int(count)):
        out = unpack(pack(t))
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(t.shape):
            return None
        total += out.detach().double()
    return total / int(count)


def ch13_hooked_grads(model: nn.Module, x: torch.Tensor, pack: Callable, unpack: Callable) -> list:
    """Gradients of mean(model(x) ** 2) with the forward run under ``saved_tensors_hooks(pack, unpack)``."""
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = model(x).pow(2).mean()
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return [g.detach().clone() for g in grads]


@in_process(explains=("bytes",))
def ch13_packed_bytes(packed) -> dict:
    """Bytes of the storages of the tensors inside ``packed`` (a claim measured in the process)."""
    found: dict = {}
    _ch13_tensors(packed, found)
    return {"bytes": sum(key[1] for key in found)}


def ch13_unpack_at(unpack: Callable, packed, picks: torch.Tensor):
    """``unpack(packed)`` flattened, at the positions ``picks``."""
    out = unpack(packed)
    if not isinstance(out, torch.Tensor):
        return None
    return out.detach().reshape(-1)[picks].clone()


def ch13_same_seed(make: Callable, bits: list, seed: int, value: torch.Tensor, rounds: int = 2) -> dict:
    """Two pairs ``make(bits, seed=seed)`` packing copies of one activation in turns (pair 1, pair 2, pair 1,
    ...): "first" and "second" (what each pair's unpack gave back, per round) and "global_rng_changed"
    (whether making the pairs and packing changed torch's global generator)."""
    state = torch.get_rng_state()
    one, two = make(bits, seed=seed), make(bits, seed=seed)
    t = value.detach().clone().requires_grad_(True).mul(1)
    first, second = [], []
    for _ in range(int(rounds)):
        for (pack, unpack), into in ((one, first), (two, second)):
            out = unpack(pack(t))
            into.append(out.detach().clone() if isinstance(out, torch.Tensor) else None)
    return {"first": first, "second": second, "global_rng_changed": not torch.equal(state, torch.get_rng_state())}


def ch13_triton_part(fn: Callable, x: torch.Tensor, noise: torch.Tensor, part: int) -> dict:
    """``ch10_triton_run`` on ``fn(x, noise)``, reporting the stores that wrote element ``part`` of the tuple
    it returns (0 codes, 1 mins, 2 scales): "result" is the whole tuple (copies), "bounds" as ch10's, its
    "result_stored" and "unwritten" about that element."""
    from grader.probes.ch10_flash_attention import ch10_triton_run

    whole: list = []

    def one_part(*args):
        got = fn(*args)
        whole.append(got)
        if isinstance(got, (tuple, list)) and len(got) > part and type(got[part]) is torch.Tensor:
            return got[part]
        return None

    run = ch10_triton_run(one_part, x, noise)
    got = whole[0] if whole else None
    if isinstance(got, (tuple, list)):
        got = tuple(v.detach().clone() if isinstance(v, torch.Tensor) else v for v in got)
    run["result"] = got
    return run
