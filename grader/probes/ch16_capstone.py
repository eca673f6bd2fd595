"""Probes of chapter 16 (capstone): a configuration's fields read back, the student's memory_of / flops_of applied to
many configurations in one call, and the trainable parameters of a built step's model."""
from __future__ import annotations

import dataclasses

import torch

from grader.probes.shared import _true_named_parameters


def _ch16_error(e: BaseException) -> dict:
    return {"error": [c.__name__ for c in type(e).__mro__], "message": str(e)[:300]}


def ch16_fields(obj) -> dict | None:
    """None for None; otherwise {"fields": {name: value}} of a dataclass instance (plain values only), or
    {"type": its type's name} when ``obj`` is no dataclass instance."""
    if obj is None:
        return None
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return {"type": type(obj).__name__}
    out = {}
    for f in dataclasses.fields(obj):
        value = object.__getattribute__(obj, f.name)
        out[f.name] = value if isinstance(value, (bool, int, float, str)) else repr(value)
    return {"fields": out}


def ch16_each(fn, make, profile: dict, configs: list) -> list:
    """``fn(make(**fields), profile)`` for each dict of ``configs``: a float, or the error's class names."""
    out = []
    for fields in configs:
        try:
            value = fn(make(**fields), profile)
            out.append(float(value) if isinstance(value, (int, float)) and not isinstance(value, bool)
                       else {"type": type(value).__name__})
        except Exception as e:  # noqa: BLE001 - reported to the judge, which decides
            out.append(_ch16_error(e))
    return out


def ch16_trainable(step) -> dict:
    """{name: a copy of the parameter} for every parameter of ``step.model`` that requires grad."""
    model = step.model
    return {name: p.detach().clone() for name, p in _true_named_parameters(model) if p.requires_grad}
