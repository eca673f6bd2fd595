"""The only format that crosses from a student's process to the judge.

Student processes are untrusted, so nothing they send is unpickled: values are JSON with
tensors as (dtype, shape, raw little-endian bytes). Only plain data survive the trip:
None, bool, int, float, str, tensors, dtypes, and lists/tuples/dicts (str keys) of those.
"""
from __future__ import annotations

import base64
import json
import math

import torch

MAX_DEPTH = 32
MAX_ITEMS = 1_000_000  # values (not tensor elements) in one decoded reply
_DTYPES = {
    str(d): d
    for d in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16,
        torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    )
}


class NotTransferable(TypeError):
    """A value that cannot be fetched from the student's process."""


def _enc(v, depth: int):
    if depth > MAX_DEPTH:
        raise NotTransferable("value nested too deeply to fetch")
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return {"__int__": str(v)} if abs(v) > 2**53 else v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"__float__": repr(v)}
    if isinstance(v, torch.dtype):
        return {"__dtype__": str(v)}
    if isinstance(v, torch.Size):
        return {"__size__": list(v)}
    if isinstance(v, torch.Tensor):
        t = v.detach().to("cpu")
        if str(t.dtype) not in _DTYPES:
            raise NotTransferable(f"tensor dtype {t.dtype} cannot be fetched")
        # reshape(-1): a 0-d tensor cannot be viewed as bytes directly.
        t = t.contiguous().reshape(-1)
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return {"__tensor__": str(t.dtype), "shape": list(v.shape),
                "data": base64.b64encode(raw).decode("ascii")}
    if isinstance(v, (list, tuple)):
        items = [_enc(x, depth + 1) for x in v]
        return items if isinstance(v, list) else {"__tuple__": items}
    if isinstance(v, dict):
        if not all(isinstance(k, str) for k in v):
            raise NotTransferable("only dicts with str keys can be fetched")
        return {"__dict__": {k: _enc(x, depth + 1) for k, x in v.items()}}
    raise NotTransferable(f"a {type(v).__name__} cannot be fetched; fetch its tensors or numbers instead")


def encode(value) -> str:
    return json.dumps(_enc(value, 0), allow_nan=False)


def _dec(v, depth: int, budget: list[int]):
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    budget[0] -= 1
    if budget[0] < 0:  # Python objects cost ~100x their JSON text: bound what a reply can build
        raise ValueError(f"more than {MAX_ITEMS:,} values in one reply")
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, list):
        return [_dec(x, depth + 1, budget) for x in v]
    if not isinstance(v, dict) or len(v) == 0:
        raise ValueError("malformed value")
    if "__tensor__" in v:
        dtype = _DTYPES[v["__tensor__"]]
        shape = [int(s) for s in v["shape"]]
        if len(shape) > MAX_DEPTH or any(s < 0 for s in shape):
            raise ValueError("malformed tensor shape")
        raw = base64.b64decode(v["data"], validate=True)
        numel = math.prod(shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if len(raw) != numel * itemsize:
            raise ValueError("tensor bytes do not match its shape")
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape).clone()
    if "__tuple__" in v:
        return tuple(_dec(x, depth + 1, budget) for x in v["__tuple__"])
    if "__dict__" in v:
        return {str(k): _dec(x, depth + 1, budget) for k, x in v["__dict__"].items()}
    if "__dtype__" in v:
        return _DTYPES[v["__dtype__"]]
    if "__size__" in v:
        return torch.Size(int(s) for s in v["__size__"])
    if "__int__" in v:
        return int(v["__int__"])
    if "__float__" in v:
        return float(v["__float__"])
    raise ValueError("malformed value")


def too_many_values(text: str | bytes, slack: int = 0) -> bool:
    """Whether parsing ``text`` as JSON could build more than ``MAX_ITEMS`` values (checked before
    parsing: ``json.loads`` itself builds one Python object per value)."""
    marks = (",", "[", "{") if isinstance(text, str) else (b",", b"[", b"{")
    return sum(text.count(m) for m in marks) > 2 * MAX_ITEMS + slack


def decode(text: str):
    """Decode a value produced by :func:`encode`. Raises ValueError on anything else."""
    try:
        if too_many_values(text):
            raise ValueError(f"more than {MAX_ITEMS:,} values in one reply")
        return _dec(json.loads(text), 0, [MAX_ITEMS])
    except (KeyError, TypeError, AttributeError, RecursionError) as e:
        raise ValueError(f"malformed value: {e}") from None
